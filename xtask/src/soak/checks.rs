//! The invariants checked while faults come and go (each a hard failure), and the
//! measurements the report gives: how fast a hub saw a fault and its end.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{ledger::Ledger, world::World};

/// How long the coordinator may take to hold the cloud's state again once both are up.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(10);
/// How long a hub's tasks, descriptors and memory may take to come back to baseline.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// A hub process's footprint.
#[derive(Clone, Copy, Debug, Default)]
pub struct Footprint {
    pub fds: u64,
    pub threads: u64,
    pub tasks: u64,
    pub rss_kib: u64,
}

impl Footprint {
    pub fn of(world: &World, hub: usize) -> Option<Footprint> {
        let h = &world.hubs[hub];
        let pid = h.pid()?;
        // status_kib reads the number of any /proc/<pid>/status field.
        let field = |name: &str| crate::bench::status_kib(pid, name).unwrap_or(0);
        Some(Footprint {
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64,
            threads: field("Threads:"),
            tasks: h.status()?["tasks"].as_u64()?,
            rss_kib: field("VmRSS:"),
        })
    }

    /// Within what the soak's own traffic explains of the baseline: its clients hold a
    /// handful of connections (and their tasks) at any moment; memory may grow by caches
    /// warming, not without bound.
    fn back_to(&self, base: &Footprint) -> bool {
        self.fds <= base.fds + 24
            && self.threads <= base.threads + 8
            && self.tasks <= base.tasks + 48
            && self.rss_kib <= base.rss_kib + 32 * 1024
    }
}

/// Peak RSS (VmHWM) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    crate::bench::status_kib(pid, "VmHWM:")
}

/// Waits until every hub's footprint is back to its baseline; a violation if not.
pub fn settled(world: &World, ledger: &Ledger, baselines: &[Footprint]) {
    for (i, base) in baselines.iter().enumerate() {
        let deadline = Instant::now() + SETTLE_WITHIN;
        let mut last = None;
        while Instant::now() < deadline {
            last = Footprint::of(world, i);
            if last.is_some_and(|f| f.back_to(base)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if !last.is_some_and(|f| f.back_to(base)) {
            ledger.violation(format!(
                "hub {i} did not come back to its baseline within {SETTLE_WITHIN:?}: {last:?}, baseline {base:?}"
            ));
        }
    }
}

/// Polls until `pred` holds for hub `hub`'s status: the time it took, or None.
pub fn wait_status(
    world: &World,
    hub: usize,
    limit: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if world.hubs[hub].status().is_some_and(|s| pred(&s)) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Watches every hub's status for `span`: the first hub (and when) for which `pred` did
/// not hold, or None.
pub fn holds_for(
    world: &World,
    span: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Option<(usize, Duration)> {
    let started = Instant::now();
    while started.elapsed() < span {
        for i in 0..world.hubs.len() {
            if world.hubs[i].status().is_some_and(|s| !pred(&s)) {
                return Some((i, started.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

pub fn cloud_healthy(s: &Value, healthy: bool) -> bool {
    s["cloud"]
        .as_array()
        .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["healthy"] == healthy))
}

pub fn coordinator_healthy(s: &Value) -> bool {
    s["coordinator"]["healthy"] == true
}

pub fn cloud_transitions(world: &World, hub: usize) -> u64 {
    world.hubs[hub]
        .status()
        .and_then(|s| s["cloud"][0]["transitions"].as_u64())
        .unwrap_or(0)
}

/// The pool-scope and node objects the coordinator must mirror: the cloud's pods and
/// services, as key → resourceVersion in kube-apiserver's key layout.
fn cloud_state(world: &World) -> Option<BTreeMap<String, String>> {
    let admin = world.admin();
    let mut state = BTreeMap::new();
    for (path, prefix) in [
        ("/api/v1/pods", "/registry/pods"),
        ("/api/v1/services", "/registry/services/specs"),
    ] {
        let r = admin.request("GET", path, &[], &[]).ok()?;
        let list: Value = serde_json::from_slice(&r.body).ok()?;
        for item in list["items"].as_array()? {
            // The pool mirrors its own nodes' pods only.
            let node = item["spec"]["nodeName"].as_str().unwrap_or_default();
            if prefix == "/registry/pods" && !super::world::NODES.contains(&node) {
                continue;
            }
            let m = &item["metadata"];
            state.insert(
                format!(
                    "{prefix}/{}/{}",
                    m["namespace"].as_str()?,
                    m["name"].as_str()?
                ),
                m["resourceVersion"].as_str()?.to_string(),
            );
        }
    }
    Some(state)
}

/// The coordinator's objects under the same prefixes, with the resourceVersion the hubs
/// recorded beside each (`/hub/rv<key>`).
fn coordinator_state(world: &World) -> Option<BTreeMap<String, String>> {
    let mut state = BTreeMap::new();
    for prefix in ["/registry/pods/", "/registry/services/specs/"] {
        let keys = world
            .etcd
            .etcdctl(
                &world.etcd.endpoints(),
                &["get", prefix, "--prefix", "--keys-only"],
            )
            .ok()?;
        let rvs = world
            .etcd
            .etcdctl(
                &world.etcd.endpoints(),
                &["get", &format!("/hub/rv{prefix}"), "--prefix"],
            )
            .ok()?;
        let rv_of: BTreeMap<&str, &str> = {
            let lines: Vec<&str> = rvs.lines().collect();
            lines
                .chunks(2)
                .filter(|kv| kv.len() == 2)
                .map(|kv| (kv[0].trim_start_matches("/hub/rv"), kv[1]))
                .collect()
        };
        for key in keys.lines().filter(|l| !l.is_empty()) {
            let rv = rv_of
                .get(key)
                .map(|v| v.trim_start_matches('0'))
                .unwrap_or("?");
            state.insert(key.to_string(), rv.to_string());
        }
    }
    Some(state)
}

/// Waits until the coordinator holds exactly the cloud's pods and services, at the
/// cloud's versions; how long that took, or a violation naming the difference.
pub fn converged(world: &World, ledger: &Ledger, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut diff = String::new();
    while started.elapsed() < limit {
        if let (Some(cloud), Some(coord)) = (cloud_state(world), coordinator_state(world)) {
            if cloud == coord {
                return Some(started.elapsed());
            }
            diff = difference(&cloud, &coord);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ledger.violation(format!(
        "the coordinator did not converge to the cloud within {limit:?}: {diff}"
    ));
    None
}

fn difference(cloud: &BTreeMap<String, String>, coord: &BTreeMap<String, String>) -> String {
    let mut out = Vec::new();
    for (k, rv) in cloud {
        match coord.get(k) {
            None => out.push(format!("missing {k}")),
            Some(c) if c != rv => out.push(format!("{k} at rv {c}, cloud {rv}")),
            _ => {}
        }
    }
    for k in coord.keys().filter(|k| !cloud.contains_key(*k)) {
        out.push(format!("not in the cloud: {k}"));
    }
    let n = out.len();
    out.truncate(6);
    format!("{n} differences: {}", out.join("; "))
}

/// The lease renewals: every one the hub acknowledged landed in the cloud, in order — or
/// was superseded by a later acknowledged one that landed (the hub drops queued renewals
/// a newer one makes pointless; the newest always lands).
pub fn writes_kept(ledger: &Ledger) -> (usize, usize) {
    let acked = ledger.acked.lock().unwrap().clone();
    let landed = ledger.landed.lock().unwrap().clone();
    let (mut total, mut duplicates) = (0, 0);
    for (node, acked) in &acked {
        let seen = landed.get(node).cloned().unwrap_or_default();
        total += acked.len();
        let newest_landed = seen.iter().max().copied();
        let lost: Vec<u64> = acked
            .iter()
            .filter(|s| !seen.contains(s) && newest_landed.is_none_or(|n| n < **s))
            .copied()
            .collect();
        if !lost.is_empty() {
            ledger.violation(format!(
                "{node}: {} acknowledged lease writes never reached the cloud, nor any later one: {:?}",
                lost.len(),
                &lost[..lost.len().min(10)]
            ));
        }
        for w in seen.windows(2) {
            if w[1] < w[0] {
                ledger.violation(format!(
                    "{node}: the cloud stored lease write {} after {} (out of order)",
                    w[1], w[0]
                ));
            }
            if w[1] == w[0] {
                duplicates += 1;
            }
        }
    }
    (total, duplicates)
}
