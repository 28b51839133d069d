//! The command-line contract: --version, --help, config validation with exit code 2.
use std::process::Command;

use hub_tests::{TempDir, hub::check_config, hub_bin};

fn run_with_config(yaml: &str) -> (Option<i32>, String) {
    let dir = TempDir::new("cli");
    let path = dir.path().join("hub.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(hub_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_ebpf_object() {
    let out = Command::new(hub_bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("hub 0."), "{v}");
    assert!(v.contains("eBPF object"), "{v}");
}

#[test]
fn help_lists_the_commands() {
    let out = Command::new(hub_bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "status", "trace", "install", "bpf", "uninstall"] {
        assert!(help.contains(cmd), "--help lacks {cmd}:\n{help}");
    }
}

#[test]
fn bad_config_fields_exit_2_with_one_line_naming_them() {
    let cases = [
        (
            "nodeName: a\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\n  bogus: 1\n",
            "bogus",
        ),
        (
            "nodeName: a\ncloud:\n  servers: [\"gopher://x\"]\n",
            "cloud.servers[0]",
        ),
        (
            "nodeName: a\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\nlisten:\n  admin: nowhere\n",
            "listen.admin",
        ),
        (
            "cloud:\n  servers: [\"https://127.0.0.1:6443\"]\n",
            "nodeName",
        ),
        (
            "nodeName: a\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\nintercept:\n  bypassMark: 0\n",
            "intercept.bypassMark",
        ),
    ];
    for (yaml, field) in cases {
        let (code, stderr) = run_with_config(yaml);
        assert_eq!(code, Some(2), "{yaml:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(field),
            "{yaml:?} should name {field}: {stderr}"
        );
    }
}

#[test]
fn missing_config_file_is_a_config_error() {
    let out = Command::new(hub_bin())
        .args(["run", "--config", "/nonexistent/hub.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/hub.yaml"));
}

#[test]
fn status_without_a_daemon_says_so() {
    let out = Command::new(hub_bin())
        .args(["status", "--admin", "127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the hub admin port"), "{err}");
}

/// The cgroup2 hierarchy's root on this machine (its mount point).
fn cgroup2_root() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            (after.split_whitespace().next()? == "cgroup2")
                .then(|| before.split_whitespace().nth(4).map(String::from))?
        })
        .expect("a cgroup2 mount")
}

/// With no cgroupPath, `hub run --check` finds this machine's cgroup2 hierarchy in its
/// mountinfo (here a hybrid host: cgroup2 at /sys/fs/cgroup/unified beside v1's tmpfs)
/// and says where and why.
#[test]
fn check_finds_this_host_s_cgroup2_hierarchy() {
    let checked = check_config(
        "nodeName: n1\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\nintercept:\n  vips: [\"127.0.0.1:6443\"]\n",
        &[],
    );
    let said = &checked.stdout;
    assert!(checked.ok, "{said}{}", checked.stderr);
    let root = cgroup2_root();
    assert!(
        said.contains(&format!("cgroup2 hierarchy: {} (", root)),
        "{said}"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let sys_is_tmpfs = mountinfo
        .lines()
        .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains(" - tmpfs "));
    assert_eq!(said.contains("a hybrid host"), sys_is_tmpfs, "{said}");
}

/// `hub run --check` still says `config ok`, and warns when the programs would attach at
/// the cgroup2 root (every process on the host redirected, a loopback apiserver's own
/// clients too); attached to a cgroup below it, it does not.
#[test]
fn check_warns_when_interception_would_reach_the_whole_host() {
    let root = cgroup2_root();
    let config = |cgroup: &str| {
        let checked = check_config(
            &format!(
                "nodeName: n1\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\nintercept:\n  cgroupPath: {cgroup}\n  vips: [\"127.0.0.1:6443\"]\n"
            ),
            &[],
        );
        assert!(checked.ok);
        assert!(checked.stdout.contains("\nconfig ok"));
        checked.stderr
    };
    let warned = config(&root);
    assert!(
        warned.contains(
            "is the root of a cgroup2 hierarchy: every process on the host is redirected"
        ),
        "{warned}"
    );
    assert!(
        warned.contains("loopback address(es) 127.0.0.1:6443"),
        "{warned}"
    );
    let below = std::path::Path::new(&root).join("hub-check-nonexistent");
    assert_eq!(
        config(&below.display().to_string()),
        "",
        "no warning below the root"
    );
}

/// `hub convert`: a recorded protobuf pod (from stdin, as etcdctl pipes a value) becomes the
/// JSON kube-apiserver wrote for it; that JSON (from a file) becomes protobuf that converts
/// back to it; what is neither is refused in one line.
#[test]
fn convert_turns_a_recorded_pod_into_the_apiserver_s_json_and_back() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wire/kube-apiserver-1.36");
    let pb = std::fs::read(dir.join("dual-pod-protobuf/response.body")).unwrap();
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("dual-pod-json/response.body")).unwrap())
            .unwrap();
    let out = hub_tests::output_with_stdin(
        Command::new(hub_bin()).args(["convert", "--server-minor", "36"]),
        &pb,
    );
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json, recorded);

    let tmp = TempDir::new("convert");
    let file = tmp.path().join("pod.json");
    std::fs::write(&file, serde_json::to_vec(&recorded).unwrap()).unwrap();
    let out = Command::new(hub_bin())
        .arg("convert")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout.starts_with(b"k8s\0"), "protobuf out");
    let back = tmp.path().join("pod.pb");
    std::fs::write(&back, &out.stdout).unwrap();
    let out = Command::new(hub_bin())
        .args(["convert", "--server-minor", "36"])
        .arg(&back)
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        recorded
    );

    std::fs::write(
        &file,
        b"{\"apiVersion\":\"example.com/v1\",\"kind\":\"Widget\"}",
    )
    .unwrap();
    let out = Command::new(hub_bin())
        .arg("convert")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("example.com/v1 Widget has no schema"), "{err}");
}
