//! The node traffic the soak keeps up through every fault: kubelet-style (its pods listed
//! and watched, its lease renewed, its node status patched), kube-proxy-style (services and
//! endpointslices listed and watched), kubectl-style (a pod's token listing configmaps) —
//! and, straight to the cloud, the cluster changing underneath (pods, services and
//! configmaps created, changed and deleted) and the truth the invariants need.
use std::{
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use hub_tests::apiserver::{
    client::{Client, Reply},
    time::now_micro,
};
use serde_json::{Value, json};

use super::{ledger::Ledger, world::World};

const KUBELET: &str = "kubelet/v1.32.13 (linux/amd64) kubernetes/4b1e2c3";
const KUBE_PROXY: &str = "kube-proxy/v1.32.13 (linux/amd64) kubernetes/4b1e2c3";
const KUBECTL: &str = "kubectl/v1.32.13 (linux/amd64) kubernetes/4b1e2c3";
/// A watch silent this long (no event, no bookmark) is given up and the list redone.
const WATCH_SILENCE: Duration = Duration::from_secs(10);

pub fn lease_path(node: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
}

type Threads = Vec<JoinHandle<()>>;

fn spawn(threads: &mut Threads, name: String, f: impl FnOnce() + Send + 'static) {
    threads.push(
        std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("spawn a soak thread"),
    );
}

/// Starts every client thread (they run until `ledger.stop`) and the readers of the
/// cloud's own state (until `ledger.stop_truth`).
pub fn start(world: &World, ledger: &Arc<Ledger>) -> anyhow::Result<(Threads, Threads)> {
    let mut clients = Vec::new();
    for (i, hub) in world.hubs.iter().enumerate() {
        let node = hub.node.clone();
        let pods = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}");
        for (who, ua, path) in [
            ("kubelet", KUBELET, pods.as_str()),
            ("kube-proxy", KUBE_PROXY, "/api/v1/services"),
            (
                "kube-proxy",
                KUBE_PROXY,
                "/apis/discovery.k8s.io/v1/endpointslices",
            ),
        ] {
            let (c, l, path) = (world.kubelet(hub)?, ledger.clone(), path.to_string());
            let me = format!("{who}@{node}");
            spawn(&mut clients, format!("soak {me}"), move || {
                informer(&l, i, &me, &c, ua, &path)
            });
        }
        let (c, l, n) = (world.kubelet(hub)?, ledger.clone(), node.clone());
        spawn(&mut clients, format!("soak lease@{node}"), move || {
            lease_writer(&l, &c, &n)
        });
        let (c, l, n) = (world.kubelet(hub)?, ledger.clone(), node.clone());
        spawn(&mut clients, format!("soak status@{node}"), move || {
            node_status(&l, &c, &n)
        });
        let (c, l) = (world.pod_client(hub), ledger.clone());
        let me = format!("kubectl@{node}");
        spawn(&mut clients, format!("soak {me}"), move || {
            kubectl(&l, i, &me, &c)
        });
    }
    let (c, l) = (world.admin(), ledger.clone());
    spawn(&mut clients, "soak mutator".into(), move || mutator(&l, &c));
    let mut readers = Vec::new();
    for path in [
        "/api/v1/pods",
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/api/v1/configmaps",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
    ] {
        let (c, l) = (world.admin(), ledger.clone());
        spawn(&mut readers, format!("soak truth {path}"), move || {
            truth(&l, &c, path)
        });
    }
    Ok((clients, readers))
}

/// Sleeps `d` in short steps, returning early when the soak stops.
fn pause(ledger: &Ledger, d: Duration) {
    let until = Instant::now() + d;
    while !ledger.stopping() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }
}

/// How an answer is counted: its code, and for an error whether the hub or the cloud
/// gave it (the hub's own Status messages start with "hub:").
fn outcome_of(r: &std::io::Result<Reply>) -> String {
    match r {
        Ok(r) if r.status < 300 => r.status.to_string(),
        Ok(r) => {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let by = if v["message"].as_str().is_some_and(|m| m.starts_with("hub:")) {
                "hub"
            } else {
                "cloud"
            };
            format!(
                "{} {} from {by}",
                r.status,
                v["reason"].as_str().unwrap_or("-")
            )
        }
        Err(e) => format!("no answer ({:?})", e.kind()),
    }
}

fn get(c: &Client, path: &str, ua: &str) -> std::io::Result<Reply> {
    c.request(
        "GET",
        path,
        &[("User-Agent", ua), ("Accept", "application/json")],
        &[],
    )
}

/// List, then watch from the list's resourceVersion until the watch ends or falls
/// silent, then list again — what an informer does. Every object served is recorded.
fn informer(ledger: &Ledger, hub: usize, me: &str, c: &Client, ua: &str, path: &str) {
    let kubelet = me.starts_with("kubelet");
    while !ledger.stopping() {
        let r = get(c, path, ua);
        ledger.outcome(me, format!("list {}", outcome_of(&r)));
        let list = match r {
            Ok(r) if r.status == 200 => r,
            _ => {
                pause(ledger, Duration::from_millis(300));
                continue;
            }
        };
        let Ok(list) = serde_json::from_slice::<Value>(&list.body) else {
            ledger.violation(format!("{me}: a list answered 200 was not JSON"));
            continue;
        };
        if kubelet && ledger.phase().starts_with("offline") {
            ledger.offline_list(hub);
        }
        let items: Vec<&Value> = list["items"].as_array().into_iter().flatten().collect();
        ledger.served(hub, me, &items);
        let mut rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let sep = if path.contains('?') { '&' } else { '?' };
        let watch = format!("{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion=");
        let Ok(mut stream) = c.try_stream(
            &format!("{watch}{rv}"),
            &[("User-Agent", ua), ("Accept", "application/json")],
        ) else {
            ledger.outcome(me, "watch: no answer".into());
            continue;
        };
        ledger.outcome(me, format!("watch {}", stream.status));
        if stream.status != 200 {
            pause(ledger, Duration::from_millis(300));
            continue;
        }
        while !ledger.stopping() {
            let Some(line) = stream.next_line(WATCH_SILENCE) else {
                break;
            };
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                ledger.violation(format!("{me}: a watch event was not JSON: {line:.200}"));
                break;
            };
            let object = &event["object"];
            match event["type"].as_str() {
                Some("ADDED" | "MODIFIED") => ledger.served(hub, me, &[object]),
                Some("DELETED") => ledger.deletion_delivered(hub, me, object),
                Some("BOOKMARK") => {}
                _ => break,
            }
            if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                rv = v.to_string();
            }
        }
        let _ = rv;
    }
}

/// Renews the node's lease every 300 ms, each renewal numbered; records which numbers
/// the hub acknowledged. A conflict (or no copy yet) reads the lease again first.
fn lease_writer(ledger: &Ledger, c: &Client, node: &str) {
    let path = lease_path(node);
    let mut lease: Option<Value> = None;
    let mut seq = 0u64;
    while !ledger.stopping() {
        pause(ledger, Duration::from_millis(300));
        let Some(mut body) = lease.take() else {
            let r = get(c, &path, KUBELET);
            ledger.outcome("lease", format!("get {}", outcome_of(&r)));
            lease = r
                .ok()
                .filter(|r| r.status == 200)
                .and_then(|r| serde_json::from_slice(&r.body).ok());
            continue;
        };
        seq += 1;
        body["metadata"]["annotations"]["soak/seq"] = json!(seq.to_string());
        body["spec"]["renewTime"] = json!(now_micro());
        let r = c.request(
            "PUT",
            &path,
            &[
                ("User-Agent", KUBELET),
                ("Accept", "application/json"),
                ("Content-Type", "application/json"),
            ],
            &serde_json::to_vec(&body).unwrap_or_default(),
        );
        ledger.outcome("lease", format!("put {}", outcome_of(&r)));
        match r {
            Ok(r) if r.status < 300 => {
                ledger
                    .acked
                    .lock()
                    .unwrap()
                    .entry(node.to_string())
                    .or_default()
                    .push(seq);
                lease = serde_json::from_slice(&r.body).ok();
            }
            // Not acknowledged: it may or may not land; the next renewal starts from a
            // fresh read (a conflict) or from the same copy.
            Ok(r) if r.status == 409 => {}
            _ => lease = Some(body),
        }
    }
}

/// Patches the node's Ready condition every 2 s, as kubelet's status loop does.
fn node_status(ledger: &Ledger, c: &Client, node: &str) {
    let path = format!("/api/v1/nodes/{node}/status");
    while !ledger.stopping() {
        pause(ledger, Duration::from_secs(2));
        let r = get(c, &format!("/api/v1/nodes/{node}"), KUBELET);
        ledger.outcome("node-status", format!("get {}", outcome_of(&r)));
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "KubeletReady", "lastHeartbeatTime": now_micro()}]}});
        let r = c.request(
            "PATCH",
            &path,
            &[
                ("User-Agent", KUBELET),
                ("Accept", "application/json"),
                ("Content-Type", "application/strategic-merge-patch+json"),
            ],
            &serde_json::to_vec(&patch).unwrap_or_default(),
        );
        ledger.outcome("node-status", format!("patch {}", outcome_of(&r)));
    }
}

/// A pod's kubectl listing configmaps twice a second.
fn kubectl(ledger: &Ledger, hub: usize, me: &str, c: &Client) {
    while !ledger.stopping() {
        pause(ledger, Duration::from_millis(500));
        let r = get(c, "/api/v1/namespaces/default/configmaps", KUBECTL);
        ledger.outcome(me, format!("list {}", outcome_of(&r)));
        if let Ok(r) = r
            && r.status == 200
            && let Ok(list) = serde_json::from_slice::<Value>(&r.body)
        {
            let items: Vec<&Value> = list["items"].as_array().into_iter().flatten().collect();
            ledger.served(hub, me, &items);
        }
    }
}

/// The cluster changing: pods come and go on both nodes, services come and go,
/// configmaps change. Straight to the cloud, as the cluster's admin.
fn mutator(ledger: &Ledger, c: &Client) {
    let mut n = 0u64;
    let (mut pods, mut services) = (
        std::collections::VecDeque::new(),
        std::collections::VecDeque::new(),
    );
    while !ledger.stopping() {
        pause(ledger, Duration::from_millis(400));
        n += 1;
        let r = match n % 4 {
            0 => {
                let name = format!("soak-{n}");
                let node = super::world::NODES[(n / 4 % 2) as usize];
                let pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default", "labels": {"app": "soak"}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}});
                pods.push_back(name);
                c.request(
                    "POST",
                    "/api/v1/namespaces/default/pods",
                    &json_headers(),
                    &to_vec(&pod),
                )
            }
            1 if pods.len() > 12 => {
                let name = pods.pop_front().unwrap_or_default();
                c.request(
                    "DELETE",
                    &format!("/api/v1/namespaces/default/pods/{name}"),
                    &[],
                    &[],
                )
            }
            2 => {
                let patch = json!({"data": {"n": n.to_string()}});
                c.request(
                    "PATCH",
                    &format!("/api/v1/namespaces/default/configmaps/cm-{}", n / 4 % 4),
                    &[("Content-Type", "application/merge-patch+json")],
                    &to_vec(&patch),
                )
            }
            3 if n % 8 == 3 => {
                let name = format!("soak-svc-{n}");
                let svc = json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "selector": {"app": "soak"}}});
                services.push_back(name);
                c.request(
                    "POST",
                    "/api/v1/namespaces/default/services",
                    &json_headers(),
                    &to_vec(&svc),
                )
            }
            3 if services.len() > 3 => {
                let name = services.pop_front().unwrap_or_default();
                c.request(
                    "DELETE",
                    &format!("/api/v1/namespaces/default/services/{name}"),
                    &[],
                    &[],
                )
            }
            _ => continue,
        };
        ledger.outcome("mutator", outcome_of(&r));
    }
}

fn json_headers() -> [(&'static str, &'static str); 1] {
    [("Content-Type", "application/json")]
}

fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// Reads the cloud's own state of one resource, all namespaces: a list, then a watch from
/// it, again and again. Every state seen is the truth served objects are checked against;
/// for leases, the order the cloud stored each node's renewals in.
fn truth(ledger: &Ledger, c: &Client, path: &str) {
    let leases = path.contains("/leases");
    let mut rv = String::new();
    while !ledger.truth_stopping() {
        if rv.is_empty() {
            let Ok(r) = get(c, path, "soak-truth") else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            };
            let Ok(list) = serde_json::from_slice::<Value>(&r.body) else {
                continue;
            };
            for item in list["items"].as_array().into_iter().flatten() {
                ledger.in_cloud(item);
                if leases {
                    landed(ledger, item);
                }
            }
            rv = list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        let Ok(mut stream) = c.try_stream(
            &format!("{path}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"),
            &[("User-Agent", "soak-truth")],
        ) else {
            continue;
        };
        if stream.status != 200 {
            rv.clear();
            continue;
        }
        while !ledger.truth_stopping() {
            let Some(line) = stream.next_line(Duration::from_secs(5)) else {
                break;
            };
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            let object = &event["object"];
            match event["type"].as_str() {
                Some("ADDED" | "MODIFIED" | "DELETED") => {
                    ledger.in_cloud(object);
                    if leases && event["type"] != "DELETED" {
                        landed(ledger, object);
                    }
                }
                Some("BOOKMARK") => {}
                // 410 Gone or another error: list again.
                _ => {
                    rv.clear();
                    break;
                }
            }
            if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                rv = v.to_string();
            }
        }
    }
}

/// A lease renewal the cloud stored.
fn landed(ledger: &Ledger, lease: &Value) {
    let node = lease["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(seq) = lease["metadata"]["annotations"]["soak/seq"]
        .as_str()
        .and_then(|s| s.parse().ok())
    {
        let mut landed = ledger.landed.lock().unwrap();
        let seen = landed.entry(node.to_string()).or_default();
        // A list after a watch ended repeats the state last seen: not a second write.
        if seen.last() != Some(&seq) {
            seen.push(seq);
        }
    }
}
