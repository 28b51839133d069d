//! The command-line contract: --version, --help, config validation with exit code 2.
use std::process::Command;

use hub_tests::{TempDir, hub_bin};

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
