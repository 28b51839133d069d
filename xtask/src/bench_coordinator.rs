//! `cargo xtask bench coordinator`: the coordinator storage against a real single-member
//! etcd (Debian's etcd-server, on loopback, data on this machine's disk): create and update
//! Txn/s, sequential and 16 in flight, and ReplaceComponentList of 1k and 10k pods.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::bench::{Output, Report};
use hub::coordinator::{
    owned::Owned,
    storage::{self, Limits, Object, Resource, Storage},
};
use hub_tests::{
    TempDir,
    etcd::{EtcdCluster, MAX_REQUEST_BYTES, MAX_TXN_OPS},
};

/// A pod of realistic size (~1 KiB of JSON, like the stand-in's seeded pods).
fn pod(ns: &str, name: &str, rv: u64) -> Object {
    let v = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv.to_string(),
            "uid": format!("uid-{ns}-{name}"), "labels": {"app": "bench", "tier": "edge"},
            "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"nodeName": "edge-1", "restartPolicy": "Always", "containers": [{"name": "main",
            "image": "registry.local/app:1", "resources": {}, "ports": [{"containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "startTime": "2026-12-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "main", "image": "registry.local/app:1",
                "imageID": "registry.local/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]}});
    Object {
        namespace: Some(ns.into()),
        name: name.into(),
        rv,
        value: serde_json::to_vec(&v).expect("json"),
    }
}

fn pods() -> Resource {
    Resource {
        group: String::new(),
        resource: "pods".into(),
    }
}

pub fn coordinator(rounds: usize, output: Output) -> Result<()> {
    let n = rounds.clamp(100, 5000) as u64;
    let etcd = EtcdCluster::start(1);
    let dir = TempDir::new("bco");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let limits = Limits {
        max_txn_ops: MAX_TXN_OPS,
        max_request_bytes: MAX_REQUEST_BYTES,
    };
    let s = Arc::new(rt.block_on(async {
        let client = storage::connect(&etcd.endpoints(), None, Duration::from_secs(30)).await?;
        anyhow::Ok(Storage::open(&client, "/registry", Owned::open(dir.path())?, limits).await?)
    })?);
    let mut report = Report::new("coordinator", output);
    report.line(&format!(
        "bench coordinator: one etcd member ({} B pods), {n} operations per row",
        pod("ns", "name", 1).value.len()
    ));
    report.section("one etcd member on this machine's disk");
    let report = std::sync::Mutex::new(report);
    let rate = |what: &str, started: Instant, ops: u64| {
        let per_second = ops as f64 / started.elapsed().as_secs_f64();
        report.lock().unwrap().single(what, "Txn/s", per_second);
    };
    rt.block_on(async {
        let t = Instant::now();
        for i in 0..n {
            s.create("bench", &pods(), &pod("seq", &format!("p{i}"), 1))
                .await?;
        }
        rate("create, sequential", t, n);
        let t = Instant::now();
        for i in 0..n {
            s.update("bench", &pods(), &pod("seq", &format!("p{i}"), 2))
                .await?;
        }
        rate("update (fresher), sequential", t, n);
        let t = Instant::now();
        for i in 0..n {
            s.update("bench", &pods(), &pod("seq", &format!("p{i}"), 2))
                .await?;
        }
        rate("update (equal: a no-op Txn), sequential", t, n);
        for (what, rv) in [("create, 16 in flight", 1), ("update, 16 in flight", 2)] {
            let t = Instant::now();
            let mut tasks = Vec::new();
            for w in 0..16u64 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    for i in (w..n).step_by(16) {
                        let o = pod("par", &format!("p{i}"), rv);
                        if rv == 1 {
                            s.create("bench", &pods(), &o).await?;
                        } else {
                            s.update("bench", &pods(), &o).await?;
                        }
                    }
                    anyhow::Ok(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            rate(what, t, n);
        }
        for count in [1_000u64, 10_000] {
            let ns = format!("list{count}");
            let objects: Vec<Object> = (0..count).map(|i| pod(&ns, &format!("p{i}"), 1)).collect();
            let t = Instant::now();
            let r = s
                .replace_component_list("bench", &pods(), Some(&ns), 1, &objects)
                .await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let what = format!("ReplaceComponentList {count} pods, new ({} written)", r.written);
            report.lock().unwrap().single(&what, "ms", ms);
            let mut objects = objects;
            for o in objects.iter_mut().step_by(10) {
                *o = pod(&ns, &o.name, 2);
            }
            objects.truncate(objects.len() - objects.len() / 100);
            let t = Instant::now();
            let r = s
                .replace_component_list("bench", &pods(), Some(&ns), 3, &objects)
                .await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let what = format!(
                "ReplaceComponentList {count} pods, 10% changed ({} written, {} unchanged, {} deleted)",
                r.written, r.unchanged, r.deleted
            );
            report.lock().unwrap().single(&what, "ms", ms);
        }
        anyhow::Ok(())
    })?;
    report.into_inner().unwrap().finish()
}
