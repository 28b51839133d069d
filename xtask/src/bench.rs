//! `cargo xtask bench <what>`: ratios against a direct connection to the same upstream,
//! measured in one run on release builds. Never pass/fail on absolute times.
use anyhow::{Result, bail};
use hub_tests::{
    cgroup::Cgroup,
    hub::{HubProc, HubSpec},
    netns::Netns,
    probe::upstream,
    probe_bin, process,
};
use serde_json::Value;

/// `edge`: how `bench edge` runs (minutes, cuts, the cluster's size).
pub fn run(
    what: &str,
    rounds: usize,
    edge: crate::bench_edge::Shape,
    output: Output,
) -> Result<()> {
    match what {
        "edge" => crate::bench_edge::edge(edge, output),
        "intercept" => intercept(rounds, output),
        "proxy" => crate::bench_proxy::proxy(rounds, output),
        "cache" => crate::bench_cache::cache(rounds, output),
        "pool" => crate::bench_pool::pool(output),
        "pool-scale" => crate::bench_pool::scale(output),
        "coordinator" => crate::bench_coordinator::coordinator(rounds, output),
        "offline" => crate::bench_offline::offline(output),
        "watch-cache" => crate::bench_watch_cache::watch_cache(output),
        other => {
            bail!(
                "unknown benchmark `{other}` (available: intercept, proxy, cache, coordinator, pool, pool-scale, edge, offline, watch-cache)"
            )
        }
    }
}

/// connect() and connect()+first byte through the eBPF redirect and the hub's relay, vs
/// direct to the same upstream from the same cgroup (so both pay the connect4 hook).
/// Connect and first-byte latency through the eBPF redirect and the hub's relay, as ratios
/// against a direct connection in the same interleaved rounds: untraced (the connect hook's
/// cost with no one listening), with a `hub trace` listening, and, with
/// `HUB_BENCH_OTHER=path/to/hub`, another build in the same run.
fn intercept(rounds: usize, output: Output) -> Result<()> {
    let ns = Netns::new("bi");
    let cg = Cgroup::new("bench");
    let _up = upstream(&ns, &["127.0.0.1:18443"]);
    let mut report = Report::new("intercept", output);
    report.line(&format!(
        "bench intercept: {rounds} interleaved rounds per case, loopback, release build"
    ));
    // The other build first: the case that runs first meets a machine still settling
    // after the release build, and that should not be the one the others are read against.
    let mut cases = Vec::new();
    if let Some(other) = std::env::var_os("HUB_BENCH_OTHER") {
        cases.push(("HUB_BENCH_OTHER", Some(other)));
    }
    cases.push(("untraced", None));
    cases.push(("traced (a hub trace listening)", None));
    for (case, bin) in cases {
        let traced = case.starts_with("traced");
        let hub = start_intercepting_hub(&ns, &cg, bin.as_deref());
        // `hub trace` in the hub's namespace, its lines thrown away: the full cost of a
        // listener (ring buffer, fan-out, JSON) without a terminal in the way.
        let _trace = traced.then(|| {
            let mut c = hub.cli(&["trace", "--admin", "127.0.0.1:10267", "--output", "json"]);
            c.stdout(std::process::Stdio::null());
            process::Proc::spawn(c, "hub trace")
        });
        if traced {
            hub_tests::wait_for("tracing on", std::time::Duration::from_secs(10), || {
                (hub.bpf_status()["tracing"] == true).then_some(())
            });
        }
        let mut cmd = ns.command(probe_bin());
        cmd.args([
            "bench",
            "--via",
            "127.0.10.1:443",
            "--direct",
            "127.0.0.1:18443",
        ])
        .args(["--rounds", &rounds.to_string()])
        .arg("--cgroup")
        .arg(cg.path());
        let r: Value = serde_json::from_str(&process::output(cmd, "hub-probe bench"))?;
        report.section(case);
        for phase in ["connect", "first_byte"] {
            for q in ["p50", "p90", "p99", "mean"] {
                let value = |side: &str| r[side][phase][q].as_f64().unwrap_or(f64::NAN);
                report.row(
                    &format!("{} {q}", phase.replace('_', " ")),
                    "µs",
                    vec![
                        ("direct".into(), value("direct")),
                        ("hub".into(), value("via_hub")),
                    ],
                    true,
                );
            }
        }
        if let Some(kib) = rss_kib(hub.proc.pid()) {
            report.single("hub RSS after the run", "MiB", kib as f64 / 1024.0);
        }
    }
    report.finish()
}

/// A hub intercepting 127.0.10.1:443 for `cg`, relaying to the upstream; `bin` another
/// build of the hub than the one under test.
fn start_intercepting_hub(ns: &Netns, cg: &Cgroup, bin: Option<&std::ffi::OsStr>) -> HubProc {
    let own = std::env::var_os("HUB_BIN");
    if let Some(bin) = bin {
        // SAFETY: single-threaded here; the fixture reads HUB_BIN when it starts a hub.
        unsafe { std::env::set_var("HUB_BIN", bin) };
    }
    let hub = HubProc::start(
        ns,
        &HubSpec {
            cloud: &["http://127.0.0.1:18443"],
            vips: &["127.0.10.1:443"],
            hub_address: "127.0.0.1",
            hub_address6: None,
            cgroup: cg.path(),
            admin: "127.0.0.1:10267",
        },
        None,
    );
    match own {
        // SAFETY: as above.
        Some(own) => unsafe { std::env::set_var("HUB_BIN", own) },
        None => unsafe { std::env::remove_var("HUB_BIN") },
    }
    hub
}

/// The client component the benchmarks speak as; hubs cache it, so answers through the hub
/// are also written to its cache (caching on, as in production).
pub const COMPONENT: &str = "bench-client";
/// The node of the stack's own hub.
pub const BENCH_NODE: &str = "bench-node";

pub type Http = hyper_util::client::legacy::Client<
    hub::upstream::connect::MarkedConnector,
    hub::body::ProxyBody,
>;

/// A release stand-in process and a release hub in front of it (TLS listener, caching the
/// benchmark's component), and an HTTP/2 client trusting both.
pub struct Stack {
    pub standin: hub_tests::process::Proc,
    pub hub: HubProc,
    pub client: Http,
    /// `https://127.0.0.1:<port>` of the stand-in and of the hub.
    pub direct: String,
    pub via: String,
    /// The hub's config, to start it again (same cache).
    pub yaml: String,
    pub admin: String,
    pub cloud_port: u16,
    /// The stand-in's PKI and the hubs' caches; removed last.
    _dir: hub_tests::TempDir,
}

impl Stack {
    /// `standin_args`: seed flags for hub-apiserver (`--nodes`, `--pods-per-node`, …).
    pub fn start(tag: &str, standin_args: &[&str]) -> Result<Stack> {
        use std::time::Duration;

        use hub_tests::{TempDir, ports::free_port, process::Proc};
        let dir = TempDir::new(tag);
        let cloud_port = free_port();
        let mut cmd =
            std::process::Command::new(hub_tests::bin_dir().join("../release/hub-apiserver"));
        // bench-node first: its PKI goes to the directory's top, others' to DIR/NODE.
        cmd.args(["--listen", &format!("127.0.0.1:{cloud_port}")])
            .args(["--hub-pki", BENCH_NODE])
            .args(standin_args)
            .arg("--dir")
            .arg(dir.path());
        let standin =
            Proc::spawn_until_line(cmd, "hub-apiserver", "ready", Duration::from_secs(60));
        let (yaml, admin, via) = hub_config(dir.path(), BENCH_NODE, cloud_port, "cache", "", "");
        let hub = HubProc::start_yaml(None, &admin, None, |_, _| yaml.clone());
        let client = http_client(dir.path(), None)?;
        Ok(Stack {
            standin,
            hub,
            client,
            direct: format!("https://127.0.0.1:{cloud_port}"),
            via,
            yaml,
            admin,
            cloud_port,
            _dir: dir,
        })
    }

    /// Another hub in front of the same stand-in, for `node` (given to the stand-in as
    /// `--hub-pki NODE`), with its own cache directory `name` and `extra` top-level YAML
    /// (a pool, say); returns it and its `https://` address.
    pub fn start_hub(&self, name: &str, node: &str, extra: &str) -> (HubProc, String) {
        let dir = self._dir.path();
        let (yaml, admin, via) = hub_config(dir, node, self.cloud_port, name, "", extra);
        (HubProc::start_yaml(None, &admin, None, |_, _| yaml), via)
    }

    /// A hub of `node` as a node runs it: the cloud at `cloud_port` on loopback (a relay in
    /// front of the stand-in), caching `components`.
    pub fn start_node_hub(
        &self,
        name: &str,
        node: &str,
        cloud_port: u16,
        components: &[&str],
    ) -> (HubProc, String) {
        let dir = self._dir.path();
        let (yaml, admin, via) = hub_config(dir, node, cloud_port, name, "", "");
        let yaml = yaml.replace(
            &format!("components: [{COMPONENT}]"),
            &format!("components: [{}]", components.join(", ")),
        );
        (HubProc::start_yaml(None, &admin, None, |_, _| yaml), via)
    }

    /// Another hub of the stack's node with its own cache directory `name` and more
    /// `cache:` lines (two-space indented).
    pub fn start_hub_with_cache(&self, name: &str, cache_extra: &str) -> (HubProc, String) {
        let dir = self._dir.path();
        let (yaml, admin, via) =
            hub_config(dir, BENCH_NODE, self.cloud_port, name, cache_extra, "");
        (HubProc::start_yaml(None, &admin, None, |_, _| yaml), via)
    }

    /// The hub's serving certificate and key (the stand-in's CA signed them).
    pub fn serving_pair(&self) -> (std::path::PathBuf, std::path::PathBuf) {
        let pki = pki_dir(self._dir.path(), BENCH_NODE);
        (pki.join("hub-serving.crt"), pki.join("hub-serving.key"))
    }

    /// An HTTP/2 client trusting the stand-in's CA; with `kubelet_of`, presenting that
    /// node's kubelet-style certificate (its hub then speaks as the node).
    pub fn client(&self, kubelet_of: Option<&str>) -> Result<Http> {
        http_client(self._dir.path(), kubelet_of)
    }
}

/// A hub config for `node` on fresh loopback ports: (YAML, admin address, `https://`
/// address). Its certificates are the ones the stand-in wrote for the node.
fn hub_config(
    dir: &std::path::Path,
    node: &str,
    cloud_port: u16,
    cache: &str,
    cache_extra: &str,
    extra: &str,
) -> (String, String, String) {
    use hub_tests::ports::free_port;
    let pki = pki_dir(dir, node);
    let p = |f: &str| pki.join(f);
    let (tls_port, admin_port, plain_port) = (free_port(), free_port(), free_port());
    let admin = format!("127.0.0.1:{admin_port}");
    let yaml = format!(
        "nodeName: {node}\ncloud:\n  servers: [\"https://127.0.0.1:{cloud_port}\"]\n  caFile: {}\n  certFile: {}\n  keyFile: {}\nintercept:\n  enabled: false\nlisten:\n  proxy: 127.0.0.1:{plain_port}\n  tlsProxy: 127.0.0.1:{tls_port}\n  admin: {admin}\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\ncache:\n  dir: {}\n  components: [{COMPONENT}]\n{cache_extra}{extra}",
        p("ca.crt").display(),
        p("hub-node.crt").display(),
        p("hub-node.key").display(),
        p("hub-serving.crt").display(),
        p("hub-serving.key").display(),
        p("ca.crt").display(),
        dir.join(cache).display()
    );
    (yaml, admin, format!("https://127.0.0.1:{tls_port}"))
}

/// Where the stand-in wrote `node`'s certificates.
fn pki_dir(dir: &std::path::Path, node: &str) -> std::path::PathBuf {
    if node == BENCH_NODE {
        dir.to_path_buf()
    } else {
        dir.join(node)
    }
}

fn http_client(dir: &std::path::Path, kubelet_of: Option<&str>) -> Result<Http> {
    use hub::upstream::identity;
    let roots = identity::roots(&std::fs::read(dir.join("ca.crt"))?, "stand-in CA")?;
    let node = match kubelet_of {
        Some(node) => {
            let pki = pki_dir(dir, node);
            Some(identity::identity_from_pem(
                &std::fs::read(pki.join("kubelet.crt"))?,
                &std::fs::read(pki.join("kubelet.key"))?,
                "kubelet certificate",
            )?)
        }
        None => None,
    };
    let tls = identity::client_config(&roots, node.as_ref(), &[b"h2"])?;
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hub::upstream::connect::MarkedConnector { tls, mark: 0 }),
    )
}

/// CPU time a process and its descendants (nginx's workers) have used, in ns, summed over
/// their threads from schedstat (ns precision, unlike the 10 ms ticks of /proc/PID/stat).
pub fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    for task in tasks.flatten() {
        let p = task.path();
        total += task_cpu_ns(&p);
        let children = std::fs::read_to_string(p.join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            total += cpu_ns(child);
        }
    }
    total
}

/// CPU time of each of a process's threads, in ns, summed by thread name (comm).
pub fn cpu_ns_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let p = task.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        *out.entry(name.trim().to_string()).or_default() += task_cpu_ns(&p);
    }
    out
}

/// One thread's CPU time so far, from `/proc/PID/task/TID/schedstat`.
fn task_cpu_ns(task: &std::path::Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The number in a field of /proc/<pid>/status (VmRSS and VmHWM in kB, Threads, …).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// How a benchmark prints its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A table on stdout.
    Text,
    /// The table on stderr and one JSON document on stdout (docs/benchmarks.md is built
    /// from these).
    Json,
}

/// A benchmark's figures: rows of values per process, grouped in sections, printed as
/// they come and, with `--output json`, as one document at the end.
pub struct Report {
    bench: String,
    output: Output,
    section: String,
    rows: Vec<Value>,
}

impl Report {
    pub fn new(bench: impl Into<String>, output: Output) -> Report {
        Report {
            bench: bench.into(),
            output,
            section: String::new(),
            rows: Vec::new(),
        }
    }

    /// A line for the reader (stdout, or stderr when stdout carries JSON).
    pub fn line(&self, text: &str) {
        match self.output {
            Output::Text => println!("{text}"),
            Output::Json => eprintln!("{text}"),
        }
    }

    pub fn section(&mut self, name: &str) {
        self.section = name.to_string();
        self.line(&format!("\n== {name}"));
    }

    /// One measurement per process; `vs_first` adds each one's ratio to the first value
    /// (direct), otherwise the hub's ratio to nginx's is shown when both are present.
    pub fn row(&mut self, metric: &str, unit: &str, values: Vec<(String, f64)>, vs_first: bool) {
        let base = if vs_first {
            values.first().map(|(_, v)| *v)
        } else {
            values.iter().find(|(l, _)| l == "nginx").map(|(_, v)| *v)
        };
        let mut text = format!("{metric:<48}");
        for (label, v) in &values {
            text.push_str(&format!(" {label}={v:.3}"));
            if let Some(b) = base.filter(|b| *b > 0.0 && (label == "hub" || vs_first))
                && !(vs_first && values.first().is_some_and(|(l, _)| l == label))
            {
                text.push_str(&format!(" ({:.2}x)", v / b));
            }
        }
        self.line(&format!("{text}  {unit}"));
        self.rows.push(serde_json::json!({
            "section": self.section,
            "metric": metric,
            "unit": unit,
            "values": values.iter().map(|(l, v)| (l.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        }));
    }

    pub fn single(&mut self, metric: &str, unit: &str, value: f64) {
        self.row(metric, unit, vec![("hub".into(), value)], false);
    }

    /// Prints the JSON document when asked for.
    pub fn finish(self) -> Result<()> {
        if self.output == Output::Json {
            let doc = serde_json::json!({
                "bench": self.bench,
                "date": crate::shell("date -u +%Y-%m-%dT%H:%MZ"),
                "machine": {
                    "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
                    "cpu": crate::shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
                    "kernel": crate::shell("uname -r"),
                },
                "command": format!("cargo xtask bench {}", std::env::args().skip(2).collect::<Vec<_>>().join(" ")),
                "commit": crate::shell("git rev-parse --short HEAD"),
                "rows": self.rows,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Ok(())
    }
}
