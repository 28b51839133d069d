//! `cargo xtask bench pool`: three release hubs in front of a release stand-in (3 nodes ×
//! 3000 pods) and one real etcd as the pool's coordinator. Each hub's kubelet-style client
//! lists its node's pods; measured: how long until the coordinator holds all 9000, and —
//! after the etcd is wiped and started empty — how long the hubs' re-push takes (target
//! ≤ 3 s).
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hub_tests::etcd::EtcdCluster;
use hyper::Request;

use crate::bench::{COMPONENT, Stack};

const NODES: usize = 3;
const PODS: usize = 3000;

fn pods_in_etcd(etcd: &EtcdCluster) -> usize {
    etcd.etcdctl(
        &etcd.endpoints(),
        &["get", "/registry/pods/", "--prefix", "--keys-only"],
    )
    .map(|o| {
        o.lines()
            .filter(|l| l.starts_with("/registry/pods/"))
            .count()
    })
    .unwrap_or(0)
}

fn wait_pods(etcd: &EtcdCluster, n: usize, since: Instant) -> Result<Duration> {
    while since.elapsed() < Duration::from_secs(60) {
        if pods_in_etcd(etcd) >= n {
            return Ok(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the coordinator did not reach {n} pods within 60 s")
}

pub fn pool() -> Result<()> {
    let mut etcd = EtcdCluster::start(1);
    let stack = Stack::start(
        "bpl",
        &[
            "--nodes",
            &NODES.to_string(),
            "--pods-per-node",
            &PODS.to_string(),
        ],
    )?;
    let pool = format!(
        "poolName: bench\ncoordinator:\n  endpoints: [\"{}\"]\n",
        etcd.endpoints()[0]
    );
    let hubs: Vec<_> = (0..NODES)
        .map(|i| stack.start_hub(&format!("pool-cache-{i}"), &pool))
        .collect();
    let client = stack.client(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = Instant::now();
    rt.block_on(async {
        for (i, (_, via)) in hubs.iter().enumerate() {
            let req = Request::get(format!(
                "{via}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{i}"
            ))
            .header("User-Agent", format!("{COMPONENT}/1.0"))
            .header(
                "Accept",
                "application/vnd.kubernetes.protobuf, application/json",
            )
            .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
            let resp = client.request(req).await?;
            anyhow::ensure!(resp.status().is_success(), "list: {}", resp.status());
            resp.into_body().collect().await?;
        }
        anyhow::Ok(())
    })?;
    let first = wait_pods(&etcd, NODES * PODS, listed).inspect_err(|_| {
        for (hub, _) in &hubs {
            eprintln!("hub status: {}", hub.status()["coordinator"]);
            eprintln!("hub cache: {}", hub.status()["cache"]);
        }
        eprintln!("pods in etcd: {}", pods_in_etcd(&etcd));
    })?;
    etcd.wipe_member(0);
    let wiped = Instant::now();
    let again = wait_pods(&etcd, NODES * PODS, wiped)?;
    println!(
        "bench pool: {NODES} release hubs × {PODS} pods (protobuf, as kubelet asks), one etcd member"
    );
    println!("{:<56} {:>10}", "metric", "value");
    println!(
        "{:<56} {:>7.0} ms",
        "lists answered -> all pods in the coordinator",
        first.as_secs_f64() * 1e3
    );
    println!(
        "{:<56} {:>7.0} ms",
        "coordinator wiped -> all pods re-pushed (target 3000)",
        again.as_secs_f64() * 1e3
    );
    for (hub, _) in &hubs {
        let c = hub.status()["coordinator"].clone();
        println!(
            "  hub: {} full pushes, last push {} ms, role {}",
            c["full_pushes"], c["last_push_ms"], c["role"]
        );
    }
    Ok(())
}
