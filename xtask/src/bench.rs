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

pub fn run(what: &str, rounds: usize) -> Result<()> {
    match what {
        "intercept" => intercept(rounds),
        "proxy" => crate::bench_proxy::proxy(rounds),
        "cache" => crate::bench_cache::cache(rounds),
        "coordinator" => crate::bench_coordinator::coordinator(rounds),
        other => {
            bail!("unknown benchmark `{other}` (available: intercept, proxy, cache, coordinator)")
        }
    }
}

/// connect() and connect()+first byte through the eBPF redirect and the hub's relay, vs
/// direct to the same upstream from the same cgroup (so both pay the connect4 hook).
fn intercept(rounds: usize) -> Result<()> {
    let ns = Netns::new("bi");
    let cg = Cgroup::new("bench");
    let _up = upstream(&ns, &["127.0.0.1:18443"]);
    let hub = HubProc::start(
        &ns,
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
    let rss_kib = rss_kib(hub.proc.pid());
    println!("bench intercept: {rounds} interleaved rounds, loopback, release build");
    println!(
        "{:<24} {:>10} {:>10} {:>8} {:>10}",
        "metric (µs)", "direct", "via hub", "ratio", "extra µs"
    );
    for phase in ["connect", "first_byte"] {
        for q in ["p50", "p90", "p99", "mean"] {
            let d = r["direct"][phase][q].as_f64().unwrap_or(f64::NAN);
            let v = r["via_hub"][phase][q].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:<24} {:>10.1} {:>10.1} {:>7.2}x {:>10.1}",
                format!("{phase} {q}"),
                d,
                v,
                v / d,
                v - d
            );
        }
    }
    if let Some(kib) = rss_kib {
        println!("hub RSS after the run: {:.1} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
