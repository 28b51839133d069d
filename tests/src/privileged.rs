//! Privileged tests run for real wherever they can. Where they cannot, they say so loudly;
//! with HUB_REQUIRE_PRIVILEGED=1 (set by `cargo xtask test` and CI) a skip is a failure.
//! Each run or skip is also appended to HUB_PRIVILEGED_LOG so xtask can count them.
use std::io::Write;

use crate::cgroup::cgroup2_root;

fn record(line: &str) {
    if let Some(path) = std::env::var_os("HUB_PRIVILEGED_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        // One write per line: tests run in parallel threads and append to the same file.
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if cgroup2_root().is_none() {
        return Some("no cgroup v2 mount".into());
    }
    if !std::path::Path::new("/sys/fs/bpf").exists() {
        return Some("no /sys/fs/bpf".into());
    }
    for tool in ["ip", "bpftool"] {
        let found = std::process::Command::new(tool).arg("-V").output().is_ok();
        if !found {
            return Some(format!("`{tool}` not installed (scripts/setup.sh)"));
        }
    }
    None
}

/// Call first in every privileged test: `if !privileged::check("name") { return; }`.
pub fn check(test: &str) -> bool {
    decide(test, missing())
}

/// As `check`, for a test that also runs containers: it needs Debian's containerd, runc
/// and ctr (scripts/setup.sh installs them) and the image archives `cargo xtask test`
/// builds (HUB_IMAGE, HUB_IMAGE_NEXT).
pub fn check_containers(test: &str) -> bool {
    let why = missing().or_else(runtime_missing).or_else(|| {
        ["HUB_IMAGE", "HUB_IMAGE_NEXT"].iter().find_map(|var| {
            let set = std::env::var_os(var).is_some_and(|p| std::path::Path::new(&p).exists());
            (!set).then(|| {
                format!("{var} does not name an image archive (cargo xtask test builds them)")
            })
        })
    });
    decide(test, why)
}

/// What containerd, runc and ctr a container test needs and this machine lacks.
fn runtime_missing() -> Option<String> {
    ["containerd", "runc", "ctr"].iter().find_map(|tool| {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok();
        (!found).then(|| format!("`{tool}` not installed (scripts/setup.sh)"))
    })
}

/// The CNI plugins Debian's containernetworking-plugins installs.
pub const CNI_PLUGINS: &str = "/usr/lib/cni";

/// As `check`, for a test that runs pods on the CNI bridge: containerd, runc and ctr, the
/// bridge and host-local plugins, and a static busybox (scripts/setup.sh installs them all).
pub fn check_pods(test: &str) -> bool {
    let why = missing().or_else(runtime_missing).or_else(|| {
        let needed = [
            format!("{CNI_PLUGINS}/bridge"),
            format!("{CNI_PLUGINS}/host-local"),
            "/bin/busybox".to_string(),
        ];
        needed
            .into_iter()
            .find(|p| !std::path::Path::new(p).exists())
            .map(|p| format!("{p} not installed (scripts/setup.sh)"))
    });
    decide(test, why)
}

fn decide(test: &str, missing: Option<String>) -> bool {
    match missing {
        None => {
            record(&format!("ran {test}"));
            true
        }
        Some(why) => {
            record(&format!("skipped {test}: {why}"));
            if std::env::var("HUB_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
                panic!("privileged test {test} cannot run here: {why}");
            }
            eprintln!("\n!!! PRIVILEGED TEST SKIPPED: {test}: {why} !!!\n");
            false
        }
    }
}
