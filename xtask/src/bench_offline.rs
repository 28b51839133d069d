//! `cargo xtask bench offline`: a node's day without its cloud, on release builds against a
//! release stand-in (frozen with SIGSTOP: a silent link), in one run:
//! * **Outbox**: writes accepted, outbox rows and store size over a simulated 24-hour
//!   outage of a 30- and a 110-pod node, with the write pattern of the recorded kubelet 1.36
//!   (`../shared/wire/kubelet-1.36`, run `first`: 109 pod status patches and 90 events as
//!   30 pods start, a lease renewal every 10 s; its node status report every 5 min), the
//!   outage starting with the node's reboot; then the replay when the cloud is back: time
//!   until the outbox is empty, writes the cloud got, events dropped as expired.
//! * **Services**: in a pool of two nodes of 500 pods each and ten controller-managed
//!   EndpointSlices of 100 endpoints naming all 1000 pods, offline: time from a pod status
//!   write to an open slice watch naming the pod's new IP, on the pod's node and on the
//!   other node; and the hub's CPU per LIST of the 1000 endpoints once every pod wrote its
//!   new IP (adjusted) against the same LIST before any wrote (unadjusted).
//!
//! The 24 hours are simulated: writes carry the times they would have had and are sent
//! as fast as the hub takes them.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hub_tests::{apiserver::time::rfc3339, hub::HubProc, recorded};
use hyper::Request;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::bench::{Http, Output, Report, Stack, cpu_ns};

/// The recorded kubelet 1.36 starting 30 pods: 109 status patches (4 a pod, rounded up)
/// and 90 events (3 a pod).
const STATUS_PATCHES_PER_POD: usize = 4;
const EVENTS_PER_POD: usize = 3;
/// Its lease renewal and its node status report when nothing changes.
const LEASE_EVERY_S: u64 = 10;
const NODE_STATUS_EVERY_S: u64 = 300;
const OUTAGE_HOURS: u64 = 24;
const SMP: &str = "application/strategic-merge-patch+json";
/// The component the stack's hubs cache (crate::bench::COMPONENT).
const UA: &str = "bench-client/1.0";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

pub fn offline(output: Output) -> Result<()> {
    let mut report = Report::new("offline", output);
    report.line("bench offline: release hub and stand-in, the cloud frozen (SIGSTOP)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    for pods in [30, 110] {
        rt.block_on(outbox(pods, &mut report))?;
    }
    rt.block_on(services(&mut report))?;
    report.finish()
}

async fn call(
    client: &Http,
    method: &str,
    url: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(u16, Bytes)> {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("User-Agent", UA)
        .header("Accept", "application/json")
        .header("Content-Type", content_type)
        .body(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .with_context(|| format!("{method} {url}: no answer in 30 s"))??;
    let status = resp.status().as_u16();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

async fn get_json(client: &Http, url: &str) -> Result<Value> {
    let (status, body) = call(client, "GET", url, "application/json", vec![]).await?;
    if status != 200 {
        bail!("GET {url}: {status} {}", String::from_utf8_lossy(&body));
    }
    Ok(serde_json::from_slice(&body)?)
}

/// Sends a write the hub must take (2xx).
async fn write(client: &Http, method: &str, url: &str, ct: &str, body: &Value) -> Result<()> {
    let (status, answer) = call(client, method, url, ct, serde_json::to_vec(body)?).await?;
    if !(200..300).contains(&status) {
        bail!(
            "{method} {url}: {status} {}",
            String::from_utf8_lossy(&answer)
        );
    }
    Ok(())
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on the stand-in this benchmark started.
    unsafe { libc::kill(pid as i32, sig) };
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > within {
            bail!("{what}: not within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn cache_of(hub: &HubProc) -> Value {
    hub.status()["cache"].clone()
}

/// Freezes the stand-in and waits until `hubs` see the cloud down.
async fn freeze(stack: &Stack, hubs: &[&HubProc]) -> Result<()> {
    signal(stack.standin.pid(), libc::SIGSTOP);
    for hub in hubs {
        wait_until(
            "the hub to see the cloud down",
            Duration::from_secs(30),
            || hub.status()["cloud"][0]["healthy"] == false,
        )
        .await?;
    }
    Ok(())
}

/// The node's pods as its hub serves them: (name, uid, IP).
async fn pods_of(client: &Http, via: &str, node: &str) -> Result<Vec<(String, String, String)>> {
    let list = get_json(
        client,
        &format!("{via}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
    )
    .await?;
    Ok(list["items"]
        .as_array()
        .context("a pod list")?
        .iter()
        .map(|p| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&p["metadata"]["name"]),
                text(&p["metadata"]["uid"]),
                text(&p["status"]["podIP"]),
            )
        })
        .collect())
}

fn event(pod: &str, reason: &str, n: usize, at: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{pod}.{at:x}{n}"), "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
        "reason": reason, "message": format!("{reason} {pod}"), "type": "Normal",
        "source": {"component": "kubelet", "host": "node-0"},
        "firstTimestamp": rfc3339(at), "lastTimestamp": rfc3339(at), "count": 1})
}

/// Pod `i`'s address after restart `round`: unique, from the benchmarking range
/// 198.18.0.0/15 (data in objects, never dialled).
fn new_ip(round: usize, i: usize) -> String {
    let n = round * 1000 + i;
    format!("198.{}.{}.{}", 18 + n / 65536, n / 256 % 256, n % 256)
}

/// A `pods`-pod node through a simulated day offline, then the replay.
async fn outbox(pods: usize, report: &mut Report) -> Result<()> {
    let count = pods.to_string();
    let stack = Stack::start(
        "boff",
        &[
            "--nodes",
            "1",
            "--pods-per-node",
            &count,
            "--hub-pki",
            "node-0",
        ],
    )?;
    let (hub, via) = stack.start_hub(&format!("offline-{pods}"), "node-0", "");
    let kubelet = stack.client(Some("node-0"))?;
    // As the kubelet reads them before the outage: its pods, node and lease.
    let held = pods_of(&kubelet, &via, "node-0").await?;
    if held.len() != pods {
        bail!("the node holds {} pods, not {pods}", held.len());
    }
    get_json(&kubelet, &format!("{via}/api/v1/nodes/node-0")).await?;
    let lease_url = format!("{via}{LEASES}/node-0");
    let mut lease = match get_json(&kubelet, &lease_url).await {
        Ok(l) => l,
        Err(_) => {
            let fresh = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "node-0", "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": "node-0", "leaseDurationSeconds": 40}});
            write(
                &kubelet,
                "POST",
                &format!("{via}{LEASES}"),
                "application/json",
                &fresh,
            )
            .await?;
            get_json(&kubelet, &lease_url).await?
        }
    };
    wait_until("the cache to store", Duration::from_secs(30), || {
        cache_of(&hub)["pending"] == 0
    })
    .await?;
    freeze(&stack, &[&hub]).await?;

    let start = hub_tests::apiserver::time::now_unix() - OUTAGE_HOURS * 3600;
    let mut accepted = 0u64;
    let mut after_first_hour = None;
    let started = Instant::now();
    // The reboot: every pod comes back on a new IP, through the kubelet's status patches,
    // and records its events.
    for (i, (name, uid, old)) in held.iter().enumerate() {
        let url = format!("{via}/api/v1/namespaces/default/pods/{name}/status");
        let steps = [
            ("False", "Pending"),
            ("False", "Running"),
            ("True", "Running"),
        ];
        for s in 0..STATUS_PATCHES_PER_POD {
            let (ready, phase) = steps[s.min(steps.len() - 1)];
            let patch: Value = if s == 0 {
                serde_json::from_slice(&recorded::kubelet_pod_restarted_patch(
                    uid,
                    ready,
                    phase,
                    old,
                    &new_ip(0, i),
                ))?
            } else {
                recorded::kubelet_pod_status_patch(uid, ready, phase)
            };
            write(&kubelet, "PATCH", &url, SMP, &patch).await?;
            accepted += 1;
        }
        for (n, reason) in ["Pulled", "Created", "Started"]
            .iter()
            .take(EVENTS_PER_POD)
            .enumerate()
        {
            let events = format!("{via}/api/v1/namespaces/default/events");
            let ev = event(name, reason, n, start + i as u64 / 10);
            write(&kubelet, "POST", &events, "application/json", &ev).await?;
            accepted += 1;
        }
    }
    for second in (0..OUTAGE_HOURS * 3600).step_by(LEASE_EVERY_S as usize) {
        let now = start + second;
        lease["spec"]["renewTime"] =
            format!("{}.000000Z", rfc3339(now).trim_end_matches('Z')).into();
        write(&kubelet, "PUT", &lease_url, "application/json", &lease).await?;
        accepted += 1;
        if second % NODE_STATUS_EVERY_S == 0 {
            let heartbeat = json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "lastHeartbeatTime": rfc3339(now)}]}});
            write(
                &kubelet,
                "PATCH",
                &format!("{via}/api/v1/nodes/node-0/status"),
                SMP,
                &heartbeat,
            )
            .await?;
            accepted += 1;
        }
        if second + LEASE_EVERY_S == 3600 {
            let c = cache_of(&hub);
            after_first_hour = Some((
                accepted,
                c["queued"].as_u64().unwrap_or(0),
                c["file_bytes"].as_u64().unwrap_or(0),
            ));
        }
    }
    let simulated = started.elapsed();
    let c = cache_of(&hub);
    let (queued, file_bytes) = (
        c["queued"].as_u64().unwrap_or(0),
        c["file_bytes"].as_u64().unwrap_or(0),
    );

    signal(stack.standin.pid(), libc::SIGCONT);
    let back = Instant::now();
    wait_until("the outbox to empty", Duration::from_secs(600), || {
        cache_of(&hub)["queued"] == 0
    })
    .await?;
    let replay = back.elapsed();
    let c = cache_of(&hub);

    report.section(&format!("{pods}-pod node, {OUTAGE_HOURS} h offline"));
    if let Some((writes, rows, bytes)) = after_first_hour {
        report.single("writes accepted, first hour", "writes", writes as f64);
        report.single("outbox rows after 1 h", "rows", rows as f64);
        report.single("store size after 1 h", "MiB", bytes as f64 / 1048576.0);
    }
    report.single("writes accepted in 24 h", "writes", accepted as f64);
    report.single("outbox rows after 24 h", "rows", queued as f64);
    report.single(
        "store size after 24 h",
        "MiB",
        file_bytes as f64 / 1048576.0,
    );
    report.single("time to take 24 h of writes", "s", simulated.as_secs_f64());
    report.single(
        "replay until the outbox is empty",
        "s",
        replay.as_secs_f64(),
    );
    report.single(
        "writes the cloud got",
        "writes",
        c["replayed"].as_f64().unwrap_or(0.0),
    );
    report.single(
        "events dropped as expired",
        "events",
        c["expired"].as_f64().unwrap_or(0.0),
    );
    report.single(
        "writes dropped",
        "writes",
        c["replay_dropped"].as_f64().unwrap_or(0.0),
    );
    Ok(())
}

/// Ten slices of 100 endpoints naming `pods` (name, uid, IP, node), as the endpointslice
/// controller writes them.
fn slices(pods: &[(String, String, String, String)]) -> Vec<Value> {
    pods.chunks(100)
        .enumerate()
        .map(|(k, chunk)| {
            let targets: Vec<recorded::Target> = chunk
                .iter()
                .map(|(n, u, ip, _)| (n.as_str(), u.as_str(), ip.as_str()))
                .collect();
            let mut s = recorded::controller_endpointslice(
                "default",
                &format!("web-{k}-x7k2p"),
                &format!("web-{k}"),
                "node-0",
                &targets,
            );
            for (e, (_, _, _, node)) in chunk.iter().enumerate() {
                s["endpoints"][e]["nodeName"] = node.as_str().into();
            }
            s["apiVersion"] = "discovery.k8s.io/v1".into();
            s["kind"] = "EndpointSlice".into();
            s
        })
        .collect()
}

/// An open watch's events (JSON lines), each with when it arrived.
async fn watch(client: &Http, url: &str) -> Result<mpsc::UnboundedReceiver<(Instant, String)>> {
    let req = Request::get(url)
        .header("User-Agent", UA)
        .header("Accept", "application/json")
        .body(Full::new(Bytes::new()).map_err(|n| match n {}).boxed())?;
    let resp = client.request(req).await?;
    if resp.status() != 200 {
        bail!("watch {url}: {}", resp.status());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut body = resp.into_body();
    tokio::spawn(async move {
        let mut pending = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line).into_owned();
                if tx.send((Instant::now(), text)).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// When the watch first sent an event naming `ip` (within 30 s).
async fn seen(rx: &mut mpsc::UnboundedReceiver<(Instant, String)>, ip: &str) -> Result<Instant> {
    let quoted = format!("\"{ip}\"");
    loop {
        let (at, chunk) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .with_context(|| format!("no slice naming {ip} within 30 s"))?
            .context("the watch ended")?;
        if chunk.contains(&quoted) {
            return Ok(at);
        }
    }
}

/// CPU the hub spends on `rounds` LISTs of every slice, per list.
async fn cpu_per_list(hub: &HubProc, client: &Http, url: &str, rounds: usize) -> Result<f64> {
    let before = cpu_ns(hub.proc.pid());
    for _ in 0..rounds {
        let (status, _) = call(client, "GET", url, "application/json", vec![]).await?;
        if status != 200 {
            bail!("LIST {url}: {status}");
        }
    }
    Ok((cpu_ns(hub.proc.pid()) - before) as f64 / rounds as f64 / 1e6)
}

async fn services(report: &mut Report) -> Result<()> {
    const PODS: usize = 500;
    const ROUNDS: usize = 40;
    const SAMPLES: usize = 15;
    let pool = crate::bench_pool::node_pool(
        "boffp",
        1,
        2,
        PODS,
        "poolName: bench-offline\ncoordinator:\n",
    )?;
    let (stack, etcd) = (&pool.stack, &pool.etcd);
    let admin = stack.client(None)?;
    let direct = &stack.direct;
    let mut all = Vec::new();
    for (i, (_, via)) in pool.hubs.iter().enumerate() {
        let node = format!("node-{i}");
        for (n, u, ip) in pods_of(&pool.kubelets[i], via, &node).await? {
            all.push((n, u, ip, node.clone()));
        }
    }
    for s in slices(&all) {
        let url = format!("{direct}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices");
        let req = Request::post(url)
            .header(
                "Authorization",
                format!("Bearer {}", hub_tests::apiserver::ADMIN_TOKEN),
            )
            .header("Content-Type", "application/json")
            .body(
                Full::new(Bytes::from(serde_json::to_vec(&s)?))
                    .map_err(|n| match n {})
                    .boxed(),
            )?;
        let resp = admin.request(req).await?;
        if resp.status() != 201 {
            bail!("creating a slice: {}", resp.status());
        }
    }
    let synced = Instant::now();
    while etcd.keys("/registry/endpointslices/default/web-").len() < 10 {
        if synced.elapsed() > Duration::from_secs(60) {
            bail!("the leader did not sync the slices into the coordinator");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (hub, _) in &pool.hubs {
        wait_until("the cache to store", Duration::from_secs(30), || {
            cache_of(hub)["pending"] == 0
        })
        .await?;
    }
    let hubs: Vec<&HubProc> = pool.hubs.iter().map(|(h, _)| h).collect();
    freeze(stack, &hubs).await?;

    // Unadjusted: no pod written yet.
    let (hub0, via0) = &pool.hubs[0];
    let list0 = format!("{via0}{SLICES}");
    let kubelet0 = &pool.kubelets[0];
    cpu_per_list(hub0, kubelet0, &list0, 5).await?;
    let plain = cpu_per_list(hub0, kubelet0, &list0, ROUNDS).await?;
    // Every pod of both nodes comes back on a new IP.
    for (i, (name, uid, old, node)) in all.iter().enumerate() {
        let k = usize::from(node == "node-1");
        let (_, via) = &pool.hubs[k];
        let patch: Value = serde_json::from_slice(&recorded::kubelet_pod_restarted_patch(
            uid,
            "True",
            "Running",
            old,
            &new_ip(1, i),
        ))?;
        let url = format!("{via}/api/v1/namespaces/default/pods/{name}/status");
        write(&pool.kubelets[k], "PATCH", &url, SMP, &patch).await?;
    }
    // Until node-0 serves every endpoint at its new IP (its own and node-1's, shared).
    let last = new_ip(1, all.len() - 1);
    let shared_since = Instant::now();
    loop {
        let (_, body) = call(kubelet0, "GET", &list0, "application/json", vec![]).await?;
        if String::from_utf8_lossy(&body).contains(&format!("\"{last}\"")) {
            break;
        }
        if shared_since.elapsed() > Duration::from_secs(60) {
            bail!("node-0 never served node-1's pods at their new IPs");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let adjusted = cpu_per_list(hub0, kubelet0, &list0, ROUNDS).await?;
    report.section("1000-endpoint slices, offline, a pool of two nodes");
    report.row(
        "hub CPU per LIST of the slices",
        "ms",
        vec![("unadjusted".into(), plain), ("adjusted".into(), adjusted)],
        true,
    );

    // Write -> adjusted slice on open watches of both nodes.
    let list = get_json(kubelet0, &list0).await?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_string();
    let mut watches = Vec::new();
    for (k, (_, via)) in pool.hubs.iter().enumerate() {
        let url = format!("{via}{SLICES}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true");
        watches.push(watch(&pool.kubelets[k], &url).await?);
    }
    let (mut own, mut other) = (Vec::new(), Vec::new());
    let mut current: Vec<String> = (0..all.len()).map(|i| new_ip(1, i)).collect();
    for s in 0..SAMPLES {
        let i = s * 7 % PODS; // node-0's pods come first
        let (name, uid, _, _) = &all[i];
        let to = new_ip(2 + s, i);
        let from = std::mem::replace(&mut current[i], to.clone());
        let patch: Value = serde_json::from_slice(&recorded::kubelet_pod_restarted_patch(
            uid, "True", "Running", &from, &to,
        ))?;
        let url = format!("{via0}/api/v1/namespaces/default/pods/{name}/status");
        let written = Instant::now();
        write(kubelet0, "PATCH", &url, SMP, &patch).await?;
        own.push((seen(&mut watches[0], &to).await? - written).as_secs_f64() * 1000.0);
        other.push((seen(&mut watches[1], &to).await? - written).as_secs_f64() * 1000.0);
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    report.section(&format!(
        "pod status write -> open slice watch ({SAMPLES} writes)"
    ));
    report.single("on the pod's node, p50", "ms", p50(&mut own));
    report.single("on the pod's node, max", "ms", max(&own));
    report.single("on the other node of the pool, p50", "ms", p50(&mut other));
    report.single("on the other node of the pool, max", "ms", max(&other));
    signal(stack.standin.pid(), libc::SIGCONT);
    Ok(())
}
