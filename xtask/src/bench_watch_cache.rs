//! `cargo xtask bench watch-cache`: what the node-level watch cache costs the node and saves
//! the cloud, on release builds against a release stand-in holding 10,000 services (each
//! with its Endpoints and EndpointSlice). Four clients of one node — two in protobuf, two
//! in JSON, as a kubelet, kube-proxy, CoreDNS and a CNI agent read them — take a streamed
//! list of services and of EndpointSlices through the hub and keep watching, then all
//! four restart once. Two hubs in turn: with the shared sets (the default) and with
//! `cache.sharedResources: []` (each client's reads sent to the cloud, as before). For each:
//! the hub's RSS with the four watching (and its peak), the bytes the cloud sent, the
//! time until all four held both sets.
use std::time::Instant;

use anyhow::{Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;

use crate::{
    bench::{Http, Output, Report, Stack, rss_kib, status_kib},
    bench_pool::{reset_traffic, traffic_by_user},
};

const SERVICES: usize = 10_000;
const CLIENTS: [(&str, bool); 4] = [
    ("kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0", true),
    ("kube-proxy/v1.36.3 (linux/amd64) kubernetes/7b29fb0", true),
    ("coredns/1.12.1 (linux/amd64) kubernetes/v0.0.0", false),
    ("cni-agent/1.0 (linux/amd64)", false),
];
const SCOPES: [&str; 2] = [
    "/api/v1/services",
    "/apis/discovery.k8s.io/v1/endpointslices",
];
const STREAMED_LIST: &str = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=600";
const END: &[u8] = b"k8s.io/initial-events-end";

pub fn watch_cache(output: Output) -> Result<()> {
    let mut report = Report::new("watch-cache", output);
    report.line(&format!(
        "bench watch-cache: release hub and stand-in, {SERVICES} services with their EndpointSlices, four clients of one node (2 protobuf, 2 JSON), streamed lists then one restart each"
    ));
    let stack = Stack::start(
        "watch-cache",
        &[
            "--services",
            &SERVICES.to_string(),
            "--bookmark-ms",
            "60000",
            "--bookmark-at-deadline",
        ],
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows: Vec<(String, Measured)> = Vec::new();
    for (case, cache_extra) in [
        ("per client", "  sharedResources: []\n"),
        ("shared sets", ""),
    ] {
        let (hub, via) = stack.start_hub_with_cache(case.replace(' ', "-").as_str(), cache_extra);
        let measured = rt.block_on(run_clients(&stack, &via, hub.proc.pid()))?;
        rows.push((case.to_string(), measured));
    }
    report.section("four clients, streamed lists of services and EndpointSlices, one restart");
    let row = |report: &mut Report, metric: &str, unit: &str, f: &dyn Fn(&Measured) -> f64| {
        let values = rows.iter().map(|(c, m)| (c.clone(), f(m))).collect();
        report.row(metric, unit, values, true);
    };
    row(&mut report, "hub RSS, four watching", "MiB", &|m| {
        m.rss_kib as f64 / 1024.0
    });
    row(&mut report, "hub peak RSS", "MiB", &|m| {
        m.peak_kib as f64 / 1024.0
    });
    row(&mut report, "bytes the cloud sent", "MiB", &|m| {
        m.cloud_bytes as f64 / 1048576.0
    });
    row(&mut report, "requests to the cloud", "count", &|m| {
        m.cloud_requests as f64
    });
    row(&mut report, "first sync of all four", "s", &|m| {
        m.first_sync_s
    });
    row(&mut report, "restart sync of all four", "s", &|m| {
        m.restart_sync_s
    });
    report.finish()
}

struct Measured {
    rss_kib: u64,
    peak_kib: u64,
    cloud_bytes: u64,
    cloud_requests: u64,
    first_sync_s: f64,
    restart_sync_s: f64,
}

async fn run_clients(stack: &Stack, via: &str, hub_pid: u32) -> Result<Measured> {
    let node = stack.client(Some(crate::bench::BENCH_NODE))?;
    let admin = stack.client(None)?;
    reset_traffic(&admin, &stack.direct).await?;
    let started = Instant::now();
    let mut watches = sync_all(&node, via).await?;
    let first_sync_s = started.elapsed().as_secs_f64();
    let rss_kib = rss_kib(hub_pid).unwrap_or(0);
    // Every client restarts: its watches end, it lists again.
    watches.clear();
    let started = Instant::now();
    let watches = sync_all(&node, via).await?;
    let restart_sync_s = started.elapsed().as_secs_f64();
    let peak_kib = status_kib(hub_pid, "VmHWM").unwrap_or(0);
    drop(watches);
    let traffic = traffic_by_user(&admin, &stack.direct).await?;
    let (cloud_bytes, cloud_requests) = traffic
        .iter()
        .filter(|(user, _)| user.as_str() != "admin")
        .fold((0, 0), |(b, r), (_, t)| (b + t.bytes, r + t.requests));
    Ok(Measured {
        rss_kib,
        peak_kib,
        cloud_bytes,
        cloud_requests,
        first_sync_s,
        restart_sync_s,
    })
}

/// Every client's streamed list of every scope, read up to its end; the watches stay open
/// (returned) as an informer's would.
async fn sync_all(node: &Http, via: &str) -> Result<Vec<hyper::body::Incoming>> {
    let mut tasks = Vec::new();
    for (ua, protobuf) in CLIENTS {
        for scope in SCOPES {
            let (node, url) = (node.clone(), format!("{via}{scope}?{STREAMED_LIST}"));
            tasks.push(tokio::spawn(streamed_list(node, url, ua, protobuf)));
        }
    }
    let mut open = Vec::new();
    for t in tasks {
        open.push(t.await??);
    }
    Ok(open)
}

async fn streamed_list(
    node: Http,
    url: String,
    ua: &'static str,
    protobuf: bool,
) -> Result<hyper::body::Incoming> {
    let accept = if protobuf {
        "application/vnd.kubernetes.protobuf;stream=watch,application/json"
    } else {
        "application/json"
    };
    let req = Request::builder()
        .uri(&url)
        .header("User-Agent", ua)
        .header("Accept", accept)
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
    let resp = node.request(req).await?;
    if !resp.status().is_success() {
        bail!("{url}: {}", resp.status());
    }
    let mut body = resp.into_body();
    // The end bookmark's annotation, found across frame boundaries.
    let mut tail: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        tail.extend_from_slice(&data);
        if tail.windows(END.len()).any(|w| w == END) {
            return Ok(body);
        }
        let keep = tail.len().saturating_sub(END.len());
        tail.drain(..keep);
    }
    bail!("{url}: the streamed list ended before its end bookmark")
}
