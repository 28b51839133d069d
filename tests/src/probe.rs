//! Driving the `hub-probe` helper: an echo upstream, and clients that report whether their
//! connection went through the hub.
use std::time::Duration;

use serde_json::Value;

use crate::{
    cgroup::Cgroup,
    netns::Netns,
    probe_bin,
    process::{self, Proc},
};

/// An echo server in `ns` listening on every address in `listen`; ready when returned.
pub fn upstream(ns: &Netns, listen: &[&str]) -> Proc {
    let mut cmd = ns.command(probe_bin());
    cmd.arg("serve");
    for l in listen {
        cmd.args(["--listen", l]);
    }
    Proc::spawn_until_line(cmd, "upstream", "ready", Duration::from_secs(5))
}

/// Runs `hub-probe connect` in `ns` (inside `cg` if given) and returns its JSON summary:
/// `pid`, `ok`, `failed`, `direct`, `via_hub`, `errors`.
pub fn connect(
    ns: &Netns,
    to: &str,
    count: usize,
    concurrency: usize,
    cg: Option<&Cgroup>,
) -> Value {
    let mut cmd = ns.command(probe_bin());
    cmd.args(["connect", "--to", to])
        .args(["--count", &count.to_string()])
        .args(["--concurrency", &concurrency.to_string()]);
    if let Some(cg) = cg {
        cmd.arg("--cgroup").arg(cg.path());
    }
    serde_json::from_str(&process::output(cmd, "hub-probe connect")).expect("probe json")
}
