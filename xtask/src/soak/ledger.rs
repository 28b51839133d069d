//! What the soak's clients saw, and what the cloud itself holds: the record the
//! invariants are checked against. Every violation is kept with the phase it happened in.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use serde_json::Value;

/// (uid, resourceVersion): one state of one object.
pub type Version = (String, String);

#[derive(Default)]
pub struct Ledger {
    /// Stops the node traffic and the cluster's changes.
    pub stop: AtomicBool,
    /// Stops the readers of the cloud's own state (after the queued writes landed).
    pub stop_truth: AtomicBool,
    phase: Mutex<String>,
    /// (client, phase kind, outcome) → count.
    outcomes: Mutex<BTreeMap<(String, String, String), u64>>,
    /// Every object state a hub served, with who got it first.
    served: Mutex<HashMap<Version, String>>,
    /// Every object state the cloud held (its own lists and watches, read directly).
    cloud: Mutex<HashSet<Version>>,
    /// Per (hub, client): uids whose deletion the hub delivered to that client.
    deleted: Mutex<HashMap<(usize, String), HashSet<String>>>,
    /// Per node: lease writes the hub acknowledged (2xx), by sequence number.
    pub acked: Mutex<BTreeMap<String, Vec<u64>>>,
    /// Per node: the lease sequence numbers the cloud stored, in the order it stored them.
    pub landed: Mutex<BTreeMap<String, Vec<u64>>>,
    /// Per hub: lists of its node's pods answered while the phase is marked offline.
    offline_lists: Mutex<HashMap<usize, u64>>,
    violations: Mutex<Vec<String>>,
}

impl Ledger {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn truth_stopping(&self) -> bool {
        self.stop_truth.load(Ordering::Relaxed)
    }

    pub fn set_phase(&self, phase: &str) {
        *self.phase.lock().unwrap() = phase.to_string();
        self.offline_lists.lock().unwrap().clear();
    }

    pub fn phase(&self) -> String {
        self.phase.lock().unwrap().clone()
    }

    pub fn violation(&self, what: String) {
        eprintln!("soak: VIOLATION [{}] {what}", self.phase());
        let phase = self.phase();
        self.violations
            .lock()
            .unwrap()
            .push(format!("[{phase}] {what}"));
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    /// Counts one answer (or failure) a client got, by the phase's kind (its name up to `#`).
    pub fn outcome(&self, client: &str, outcome: String) {
        let phase = self.phase();
        let kind = phase.split('#').next().unwrap_or_default().to_string();
        *self
            .outcomes
            .lock()
            .unwrap()
            .entry((client.to_string(), kind, outcome))
            .or_default() += 1;
    }

    pub fn outcomes(&self) -> BTreeMap<(String, String, String), u64> {
        self.outcomes.lock().unwrap().clone()
    }

    /// Hub `hub` served these objects to `client`: each state is remembered for the
    /// cloud check, and one whose deletion this client already got from this hub is a
    /// resurrection.
    pub fn served(&self, hub: usize, client: &str, objects: &[&Value]) {
        let deleted = self.deleted.lock().unwrap();
        let gone = deleted.get(&(hub, client.to_string()));
        let mut served = self.served.lock().unwrap();
        let mut back = Vec::new();
        for o in objects {
            let Some(v) = version(o) else { continue };
            if gone.is_some_and(|g| g.contains(&v.0)) {
                back.push(describe(o));
            }
            served
                .entry(v)
                .or_insert_with(|| format!("{client} via hub {hub}: {}", describe(o)));
        }
        drop((deleted, served));
        for b in back {
            self.violation(format!(
                "resurrection: hub {hub} served {b} to {client} after delivering its deletion"
            ));
        }
    }

    pub fn deletion_delivered(&self, hub: usize, client: &str, object: &Value) {
        if let Some((uid, _)) = version(object) {
            self.deleted
                .lock()
                .unwrap()
                .entry((hub, client.to_string()))
                .or_default()
                .insert(uid);
        }
    }

    /// The cloud held this object state.
    pub fn in_cloud(&self, object: &Value) {
        if let Some(v) = version(object) {
            self.cloud.lock().unwrap().insert(v);
        }
    }

    /// Served states the cloud never held.
    pub fn served_not_in_cloud(&self) -> (usize, Vec<String>) {
        let cloud = self.cloud.lock().unwrap();
        let served = self.served.lock().unwrap();
        let strange = served
            .iter()
            .filter(|(v, _)| !cloud.contains(*v))
            .map(|(v, who)| format!("{who} (uid {}, rv {})", v.0, v.1))
            .collect();
        (served.len(), strange)
    }

    pub fn offline_list(&self, hub: usize) {
        *self.offline_lists.lock().unwrap().entry(hub).or_default() += 1;
    }

    pub fn offline_lists(&self, hub: usize) -> u64 {
        self.offline_lists
            .lock()
            .unwrap()
            .get(&hub)
            .copied()
            .unwrap_or(0)
    }
}

fn version(o: &Value) -> Option<Version> {
    let m = &o["metadata"];
    Some((
        m["uid"].as_str()?.to_string(),
        m["resourceVersion"].as_str()?.to_string(),
    ))
}

fn describe(o: &Value) -> String {
    let m = &o["metadata"];
    format!(
        "{} {}/{} rv {}",
        o["kind"].as_str().unwrap_or("object"),
        m["namespace"].as_str().unwrap_or_default(),
        m["name"].as_str().unwrap_or_default(),
        m["resourceVersion"].as_str().unwrap_or_default()
    )
}
