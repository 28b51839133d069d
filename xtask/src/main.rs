//! Project tasks: `cargo xtask build-ebpf | test | lint | demo | bench`.
mod bench;
mod bench_cache;
mod bench_coordinator;
mod bench_doc;
mod bench_edge;
mod bench_offline;
mod bench_pool;
mod bench_proxy;
mod bench_watch_cache;
mod demo;
mod image;
mod reflector;
mod relay;
mod relay_cmd;
mod soak;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  build-ebpf   build the eBPF object from source and refresh hub-ebpf/prebuilt/hub-ebpf.bpf.o
  test         lint, then every test: unit, integration and privileged (fails if any
               privileged test was skipped), the fuzz round, the demo and a 3-minute
               soak; --no-lint skips the lint step
  lint         cargo fmt --check and cargo clippy -D warnings on the whole workspace
  image        the hub's container image, built here with no container engine: the
               static release binary alone on no base image, reproducible; an OCI
               layout (OUT/oci) and an archive for docker load and ctr images import
               (OUT/hub.tar); --tag NAME:TAG (default registry.local/hub:VERSION),
               --out OUT (default target/image)
  relay        the bench's cuttable, counting link as a process, for checks by hand:
               --pair NAME:PORT:TARGET_PORT (repeatable; loopback both sides) --report PATH
               [--cut-every S (0: never; default 600)] [--cut-seconds S (default 30)]
               [--first-cut S (default: cut-every)] [--cuts N (default: no limit)]
               [--minutes N (default 60)]; every pair goes silent at once (packets
               held, then open connections reset); one JSON line per pair to PATH every
               5 s and at each change of the link
  demo         the system end to end on this machine, in throwaway namespaces (root);
               --step pauses between steps
  bench WHAT   release-build benchmarks as ratios against direct, same run
               (WHAT: intercept, proxy, cache, coordinator, pool, pool-scale, edge, offline,
               watch-cache);
               --rounds N; --minutes N (edge: how long it runs, default 60);
               --cut-every S (edge: seconds between the link's 30 s cuts, default 600);
               --services N (edge: the cloud's services, each with its EndpointSlice,
               default 50; another count is reported as edge-N-services);
               --output json: the figures as one JSON document on stdout
  bench-doc    rebuild the tables of docs/benchmarks.md from the runs kept in docs/bench/
               (JSON from bench --output json); --check fails if the document differs
  soak         two hubs of one pool under node traffic while the cloud, etcd members, the
               whole coordinator, a hub and a cache disk fail on a schedule; invariants are
               hard failures; --minutes N (default 3), --report PATH (default
               target/soak-report.json; the hubs' logs beside it)
  kube-schema  regenerate hub-user/src/convert/schema_table.rs (the protobuf <-> JSON schema)
               from Kubernetes' Go API types (Debian's k8s.io/api and apimachinery
               packages, fetched by apt into a temporary directory); needs python3
  kube-oracle  regenerate tests/fixtures/kube-oracle: random objects of every kind, in
               protobuf and JSON, written by Kubernetes' own Go code (built with Debian's
               Go and k8s.io packages, fetched the same way); --seed S, --count N;
               --check-hub HUB: instead, check that Go reads HUB's JSON -> protobuf
               of every sample as the same object
  kube-storage check that kube-apiserver's own storage code (k8s.io/apiserver's storage
               factory, etcd3 store and watch cache, built with Debian's packages) reads
               every object a hub pushes to the pool as the cloud's object; --reader PATH
               reuses a storage-reader built before, --keep PATH keeps the one built
  fuzz         mutate recorded inputs through every parser that takes outside bytes
               (hub-fuzz); --seconds N in all (default 60), --seed S; fails on a finding";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `--help` anywhere prints the usage: `bench edge --help` must not start an hour's run.
    let help = args.iter().any(|a| a == "-h" || a == "--help");
    let result = match args.first().map(String::as_str) {
        _ if help => {
            println!("{USAGE}");
            Ok(())
        }
        Some("build-ebpf") => build_ebpf().map(drop),
        Some("test") => test(args.iter().any(|a| a == "--no-lint")),
        Some("lint") => lint(),
        Some("bench") => bench_cmd(&args[1..]),
        Some("image") => image::run(&args[1..]),
        Some("relay") => relay_cmd::run(&args[1..]),
        Some("kube-schema") => kube_script("generate.py", &[]),
        Some("kube-oracle") => kube_script("oracle.py", &args[1..]),
        Some("kube-storage") => {
            build_bins().and_then(|()| kube_script("storage_reader.py", &args[1..]))
        }
        Some("bench-doc") => bench_doc::bench_doc(&root(), args.iter().any(|a| a == "--check")),
        Some("soak") => build_bins().and_then(|()| soak::run(&args[1..])),
        Some("fuzz") => build_bins().and_then(|()| fuzz(&args[1..])),
        Some("demo") => build_bins().and_then(|()| demo::run(args.iter().any(|a| a == "--step"))),
        Some("help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn run(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Builds hub-user (whose build script compiles the eBPF object from source) and copies
/// the object to hub-ebpf/prebuilt/. Returns the freshly built object's path.
fn build_ebpf() -> Result<PathBuf> {
    let out = cargo()
        .args(["build", "-p", "hub-user", "--message-format=json"])
        .env_remove("HUB_EBPF_PREBUILT")
        .stderr(Stdio::inherit())
        .output()
        .context("cargo build")?;
    if !out.status.success() {
        bail!("cargo build -p hub-user failed");
    }
    let out_dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "build-script-executed")
        .filter(|m| {
            m["package_id"]
                .as_str()
                .is_some_and(|p| p.contains("hub-user"))
        })
        .find_map(|m| m["out_dir"].as_str().map(PathBuf::from))
        .context("no build-script output for hub-user")?;
    let built = out_dir.join("hub-ebpf");
    let prebuilt = root().join("hub-ebpf/prebuilt/hub-ebpf.bpf.o");
    std::fs::create_dir_all(prebuilt.parent().unwrap())?;
    let same = std::fs::read(&prebuilt).ok() == Some(std::fs::read(&built)?);
    if !same {
        std::fs::copy(&built, &prebuilt).context("copying the object")?;
    }
    eprintln!(
        "xtask: eBPF object {} -> {} ({})",
        built.display(),
        prebuilt.display(),
        if same { "unchanged" } else { "updated" }
    );
    Ok(built)
}

/// The number after `flag` in `args`, or `default` when the flag is absent.
fn number<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let Some(w) = args.windows(2).find(|w| w[0] == flag) else {
        return Ok(default);
    };
    w[1].parse()
        .with_context(|| format!("{flag} takes a number, not {}", w[1]))
}

fn bench_cmd(args: &[String]) -> Result<()> {
    let what = args.first().map(String::as_str).unwrap_or("intercept");
    let rounds = number(args, "--rounds", 2000)?;
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "hub-user",
        "-p",
        "hub-tests",
        "--bins",
    ]);
    let output = match args
        .windows(2)
        .find(|w| w[0] == "--output")
        .map(|w| w[1].as_str())
    {
        None | Some("text") => bench::Output::Text,
        Some("json") => bench::Output::Json,
        Some(other) => anyhow::bail!("--output takes text or json, not {other}"),
    };
    run(build, "release build of hub and hub-probe")?;
    let release = root().join("target/release");
    // SAFETY: single-threaded at this point; the fixtures read these to find the binaries.
    unsafe {
        std::env::set_var("HUB_BIN", release.join("hub"));
        std::env::set_var("HUB_PROBE_BIN", release.join("hub-probe"));
    }
    let edge = bench_edge::Shape {
        minutes: number(args, "--minutes", 60)?,
        cut_every: number(args, "--cut-every", 600)?,
        services: number(args, "--services", bench_edge::SERVICES)?,
    };
    bench::run(what, rounds, edge, output)
}

/// The binaries tests and the demo start: hub and hub-probe.
fn build_bins() -> Result<()> {
    let mut build = cargo();
    build.args(["build", "-p", "hub-user", "-p", "hub-tests", "--bins"]);
    run(build, "build hub and hub-probe")
}

/// One of the Kubernetes schema scripts in xtask/kube-schema (they fetch their own sources).
fn kube_script(script: &str, args: &[String]) -> Result<()> {
    let path = format!("xtask/kube-schema/{script}");
    let mut python = Command::new("python3");
    python.arg(root().join(&path)).args(args);
    run(python, &path)
}

fn lint() -> Result<()> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run(fmt, "cargo fmt --check")?;
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy, "cargo clippy -D warnings")?;
    bench_doc::bench_doc(&root(), true)
}

fn test(no_lint: bool) -> Result<()> {
    if !no_lint {
        lint()?;
    }
    build_bins()?;
    let version = Command::new(root().join("target/debug/hub"))
        .arg("--version")
        .output()
        .context("hub --version")?;
    eprintln!(
        "xtask: testing {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    report_prebuilt_freshness();

    // The image the container test runs, and a next version of it for its upgrade.
    let tag = image::default_tag();
    let image = image::build(&tag, &root().join("target/image"))?;
    let next = image::build(&format!("{tag}-next"), &root().join("target/image-next"))?;

    let log = root().join("target/privileged-tests.log");
    let _ = std::fs::remove_file(&log);
    let mut tests = cargo();
    tests
        .args(["test", "--workspace", "--no-fail-fast"])
        .env("HUB_REQUIRE_PRIVILEGED", "1")
        .env("HUB_PRIVILEGED_LOG", &log)
        .env("HUB_IMAGE", &image)
        .env("HUB_IMAGE_NEXT", &next);
    run(tests, "cargo test --workspace (privileged tests required)")?;

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let ran = text.lines().filter(|l| l.starts_with("ran ")).count();
    let skipped: Vec<&str> = text.lines().filter(|l| l.starts_with("skipped ")).collect();
    if !skipped.is_empty() {
        bail!("privileged tests were skipped:\n  {}", skipped.join("\n  "));
    }
    if ran == 0 {
        bail!("no privileged test ran");
    }
    eprintln!("xtask: {ran} privileged tests ran, none skipped");
    eprintln!("xtask: kube-apiserver's storage code reads what a hub pushed to the pool");
    kube_script("storage_reader.py", &[])?;
    fuzz(&["--seconds".into(), "60".into()])?;
    eprintln!("xtask: running the demo (its every step is checked)");
    demo::run(false)?;
    eprintln!("xtask: a 3-minute soak (every invariant is checked)");
    soak::run(&["--minutes".into(), "3".into()])
}

/// The fuzz round: `hub-fuzz` with these arguments; its findings fail the task.
fn fuzz(args: &[String]) -> Result<()> {
    let mut fuzz = Command::new(root().join("target/debug/hub-fuzz"));
    fuzz.args(args).current_dir(root());
    run(fuzz, "hub-fuzz (every parser of outside bytes)")
}

/// Says whether the committed eBPF object matches the one this build compiled.
fn report_prebuilt_freshness() {
    let prebuilt = root().join("hub-ebpf/prebuilt/hub-ebpf.bpf.o");
    let built = std::fs::read_dir(root().join("target/debug/build"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hub-user-"))
        .map(|e| e.path().join("out/hub-ebpf"))
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    match (built, std::fs::read(&prebuilt).ok()) {
        (Some(b), Some(committed)) if std::fs::read(&b).ok() == Some(committed.clone()) => {
            eprintln!("xtask: committed eBPF object matches the fresh build")
        }
        (Some(_), Some(_)) => eprintln!(
            "xtask: NOTE committed eBPF object differs from the fresh build; tests use the fresh one (run cargo xtask build-ebpf to refresh)"
        ),
        (Some(_), None) => {
            eprintln!("xtask: NOTE no committed eBPF object; run cargo xtask build-ebpf")
        }
        (None, _) => eprintln!("xtask: tests use the committed eBPF object (HUB_EBPF_PREBUILT=1)"),
    }
}

/// A shell command's trimmed output, empty if it fails (for a report's machine facts).
fn shell(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
