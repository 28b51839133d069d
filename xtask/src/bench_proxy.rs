//! `cargo xtask bench proxy`: the hub's TLS proxy in front of the API stand-in vs the
//! stand-in directly, interleaved in one run over HTTP/2 with keep-alive (as client-go):
//! GET one pod (p50/p99), LIST 1k pods (JSON and protobuf), a 10k-event watch,
//! and the hub's RSS idle and after the load.
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hub_tests::apiserver::ADMIN_TOKEN;
use hyper::Request;

use crate::bench::{COMPONENT, Http, Stack, rss_kib};

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

async fn get(client: &Http, url: &str) -> Result<Bytes> {
    get_as(client, url, "application/json").await
}

async fn get_as(client: &Http, url: &str, accept: &str) -> Result<Bytes> {
    let req = Request::get(url)
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("Accept", accept)
        .header("User-Agent", format!("{COMPONENT}/1.0"))
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
    let resp = client.request(req).await?;
    anyhow::ensure!(resp.status().is_success(), "{url}: {}", resp.status());
    Ok(resp.into_body().collect().await?.to_bytes())
}

/// Reads a watch until `events` events arrived; returns the time it took.
async fn watch(client: &Http, url: &str, events: usize) -> Result<Duration> {
    let started = Instant::now();
    let req = Request::get(url)
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("User-Agent", format!("{COMPONENT}/1.0"))
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
    let mut body = client.request(req).await?.into_body();
    let mut seen = 0;
    while seen < events {
        let frame = tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .context("watch stalled")?
            .context("watch ended early")??;
        if let Some(data) = frame.data_ref() {
            seen += data.iter().filter(|b| **b == b'\n').count();
        }
    }
    Ok(started.elapsed())
}

fn row(name: &str, direct: f64, hub: f64, unit: &str) {
    println!(
        "{name:<28} {direct:>12.3} {hub:>12.3} {:>8.3}x  {unit}",
        hub / direct
    );
}

pub fn proxy(rounds: usize) -> Result<()> {
    // The stand-in runs as its own release-built process, like a real apiserver would.
    let stack = Stack::start(
        "bp",
        &[
            "--nodes",
            "10",
            "--pods-per-node",
            "100",
            "--configmaps",
            "10000",
        ],
    )?;
    let (client, direct, via, hub) = (&stack.client, &stack.direct, &stack.via, &stack.hub);
    let idle_rss = rss_kib(hub.proc.pid()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pod = "/api/v1/namespaces/default/pods/pod-3-42";
    let list = "/api/v1/namespaces/default/pods";

    rt.block_on(async {
        for base in [&direct, &via] {
            for _ in 0..50 {
                get(client, &format!("{base}{pod}")).await?;
            }
        }
        // GET one pod, interleaved.
        let (mut d, mut h) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            let order = if i % 2 == 0 { [&direct, &via] } else { [&via, &direct] };
            for base in order {
                let t = Instant::now();
                get(client, &format!("{base}{pod}")).await?;
                let us = t.elapsed().as_secs_f64() * 1e6;
                if base == &direct { d.push(us) } else { h.push(us) }
            }
        }
        println!("bench proxy: release stand-in over TLS (HTTP/2, keep-alive), release hub with caching on, {rounds} GET rounds");
        println!("{:<28} {:>12} {:>12} {:>9}", "metric", "direct", "via hub", "ratio");
        row("GET pod p50", percentile(&mut d, 0.5), percentile(&mut h, 0.5), "µs");
        row("GET pod p99", percentile(&mut d, 0.99), percentile(&mut h, 0.99), "µs");

        // LIST 1k pods, interleaved.
        let (mut d, mut h, mut bytes) = (Vec::new(), Vec::new(), 0);
        for i in 0..40 {
            let order = if i % 2 == 0 { [&direct, &via] } else { [&via, &direct] };
            for base in order {
                let t = Instant::now();
                let body = get(client, &format!("{base}{list}")).await?;
                bytes = body.len();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if base == &direct { d.push(ms) } else { h.push(ms) }
            }
        }
        row("LIST 1k pods JSON p50", percentile(&mut d, 0.5), percentile(&mut h, 0.5), &format!("ms ({} KiB)", bytes / 1024));
        let (mut d, mut h, mut bytes) = (Vec::new(), Vec::new(), 0);
        for i in 0..40 {
            let order = if i % 2 == 0 { [&direct, &via] } else { [&via, &direct] };
            for base in order {
                let t = Instant::now();
                let body = get_as(client, &format!("{base}{list}"), "application/vnd.kubernetes.protobuf").await?;
                bytes = body.len();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if base == &direct { d.push(ms) } else { h.push(ms) }
            }
        }
        row("LIST 1k pods protobuf p50", percentile(&mut d, 0.5), percentile(&mut h, 0.5), &format!("ms ({} KiB)", bytes / 1024));

        // A 10k-event watch: the initial ADDED events of 10k configmaps.
        let path = "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0".to_string();
        let mut d = Vec::new();
        let mut h = Vec::new();
        for _ in 0..3 {
            d.push(10_000.0 / watch(client, &format!("{direct}{path}"), 10_000).await?.as_secs_f64());
            h.push(10_000.0 / watch(client, &format!("{via}{path}"), 10_000).await?.as_secs_f64());
        }
        row("watch 10k events", percentile(&mut d, 0.5), percentile(&mut h, 0.5), "events/s (higher is better)");
        anyhow::Ok(())
    })?;
    let loaded_rss = rss_kib(hub.proc.pid()).unwrap_or(0);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", hub.proc.pid())).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or("VmHWM: ?")
        .to_string();
    println!(
        "hub RSS: idle {:.1} MiB, after load {:.1} MiB ({hwm})",
        idle_rss as f64 / 1024.0,
        loaded_rss as f64 / 1024.0
    );
    Ok(())
}
