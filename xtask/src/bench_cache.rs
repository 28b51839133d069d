//! `cargo xtask bench cache`: the local cache against a release stand-in with 10k pods, in
//! one run, asking as kubelet does (protobuf): the cost of serving a 10k-pod LIST from the cache vs the cloud, the write rate
//! while a 10k list streams, RSS after caching 1k and 10k pods, disk size vs payload, how
//! fast a frozen and a dead cloud are replaced by the cache (and how many requests fail
//! meanwhile), how fast traffic returns, and time from an offline start to the first
//! cached answer.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hub_tests::{apiserver::ADMIN_TOKEN, hub::HubProc};
use hyper::Request;
use serde_json::Value;

use crate::bench::{COMPONENT, Http, Output, Report, Stack, rss_kib};

/// As kubelet asks: protobuf, JSON acceptable.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

struct Answer {
    status: u16,
    cached: bool,
    bytes: usize,
}

async fn get(client: &Http, url: &str, accept: &str) -> Result<Answer> {
    let req = Request::get(url)
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("Accept", accept)
        .header("User-Agent", format!("{COMPONENT}/1.0"))
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .context("timed out")??;
    let status = resp.status().as_u16();
    let cached = resp
        .headers()
        .get_all("warning")
        .iter()
        .any(|w| w.to_str().is_ok_and(|w| w.contains("local cache")));
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        cached,
        bytes: body.len(),
    })
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this benchmark started.
    unsafe { libc::kill(pid as i32, sig) };
}

fn cache_status(hub: &HubProc) -> Value {
    hub.status()["cache"].clone()
}

/// Objects the cache has applied so far (written, or found already up to date).
fn applied(hub: &HubProc) -> u64 {
    let c = cache_status(hub);
    c["written"].as_u64().unwrap_or(0) + c["stale"].as_u64().unwrap_or(0)
}

/// Waits until the hub's cache has applied `n` more objects than `before`.
fn wait_written(hub: &HubProc, before: u64, n: u64) -> Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if applied(hub) >= before + n {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    bail!("the cache did not write {n} objects within 60 s")
}

/// Lists in a loop while `event` happens to the cloud; returns the time from the event to
/// the first answer that `wanted` accepts, and how many requests failed in between.
async fn across(
    client: &Http,
    url: &str,
    event: impl FnOnce(),
    wanted: impl Fn(&Answer) -> bool,
) -> Result<(Duration, usize)> {
    for _ in 0..3 {
        get(client, url, PROTOBUF).await?;
    }
    event();
    let at = Instant::now();
    let mut failed = 0;
    while at.elapsed() < Duration::from_secs(30) {
        match get(client, url, PROTOBUF).await {
            Ok(a) if wanted(&a) => return Ok((at.elapsed(), failed)),
            Ok(a) if a.status == 200 => {}
            _ => failed += 1,
        }
    }
    bail!("no wanted answer within 30 s")
}

pub fn cache(rounds: usize, output: Output) -> Result<()> {
    let rounds = rounds.clamp(5, 50);
    let mut stack = Stack::start("bc", &["--nodes", "10", "--pods-per-node", "1000"])?;
    let (client, direct, via) = (
        stack.client.clone(),
        stack.direct.clone(),
        stack.via.clone(),
    );
    let (client, direct, via) = (&client, &direct, &via);
    let standin = stack.standin.pid();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let all = "/api/v1/namespaces/default/pods";
    let one_k = "/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dnode-3";
    let pod = "/api/v1/namespaces/default/pods/pod-3-7";
    let mib = |kib: u64| kib as f64 / 1024.0;

    let mut report = Report::new("cache", output);
    report.line(&format!(
        "bench cache: release stand-in with 10k pods over TLS (HTTP/2), release hub, {rounds} rounds"
    ));
    let idle = rss_kib(stack.hub.proc.pid()).unwrap_or(0);

    // Writes: 1k pods, then a 10k-pod protobuf list (as kubelet asks).
    let written0 = applied(&stack.hub);
    let a = rt.block_on(get(client, &format!("{via}{one_k}"), PROTOBUF))?;
    wait_written(&stack.hub, written0, 1000)?;
    let rss_1k = rss_kib(stack.hub.proc.pid()).unwrap_or(0);
    let pb_1k_bytes = a.bytes;
    let written1 = applied(&stack.hub);
    let started = Instant::now();
    let a = rt.block_on(get(client, &format!("{via}{all}"), PROTOBUF))?;
    let listed = started.elapsed();
    let stored = listed + wait_written(&stack.hub, written1, 10_000)?;
    let pb_10k_bytes = a.bytes;
    let rss_10k = rss_kib(stack.hub.proc.pid()).unwrap_or(0);
    let file_bytes = cache_status(&stack.hub)["file_bytes"].as_u64().unwrap_or(0);

    // LIST 10k protobuf online: direct and through the hub (teeing), interleaved.
    let (mut d, mut h) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for i in 0..rounds {
            let order = if i % 2 == 0 {
                [&direct, &via]
            } else {
                [&via, &direct]
            };
            for base in order {
                let t = Instant::now();
                let a = get(client, &format!("{base}{all}"), PROTOBUF).await?;
                anyhow::ensure!(a.status == 200 && !a.cached);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if base == &direct {
                    d.push(ms)
                } else {
                    h.push(ms)
                }
            }
        }
        anyhow::Ok(())
    })?;
    let (direct_10k, online_10k) = (p50(&mut d), p50(&mut h));

    // The cloud freezes (SIGSTOP) during 1k-pod lists: first cached answer, failures.
    let (to_cache_frozen, failed_frozen) = rt.block_on(across(
        client,
        &format!("{via}{one_k}"),
        || signal(standin, libc::SIGSTOP),
        |a| a.status == 200 && a.cached,
    ))?;
    // LIST 10k protobuf from the cache.
    let mut c = Vec::new();
    rt.block_on(async {
        for _ in 0..rounds {
            let t = Instant::now();
            let a = get(client, &format!("{via}{all}"), PROTOBUF).await?;
            anyhow::ensure!(
                a.status == 200 && a.cached,
                "not from the cache: {}",
                a.status
            );
            c.push(t.elapsed().as_secs_f64() * 1e3);
        }
        anyhow::Ok(())
    })?;
    let cached_10k = p50(&mut c);
    let rss_served = rss_kib(stack.hub.proc.pid()).unwrap_or(0);

    // Offline restart: the hub starts while the cloud is frozen; first cached answer.
    stack.hub.proc.terminate(Duration::from_secs(5));
    let t = Instant::now();
    stack.hub = HubProc::start_yaml(None, &stack.admin, None, |_, _| stack.yaml.clone());
    let first = rt.block_on(async {
        loop {
            // The first try may hit the pooled connection to the hub that was stopped.
            let r = get(client, &format!("{via}{pod}"), PROTOBUF).await;
            if let Ok(a) = r
                && a.status == 200
            {
                return anyhow::Ok(t.elapsed());
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "no cached answer");
        }
    })?;

    // The cloud comes back (SIGCONT): traffic returns to it.
    let (back, failed_back) = rt.block_on(across(
        client,
        &format!("{via}{one_k}"),
        || signal(standin, libc::SIGCONT),
        |a| a.status == 200 && !a.cached,
    ))?;
    // The cloud dies (SIGKILL) during 1k-pod lists.
    let (to_cache_dead, failed_dead) = rt.block_on(across(
        client,
        &format!("{via}{one_k}"),
        || signal(standin, libc::SIGKILL),
        |a| a.status == 200 && a.cached,
    ))?;

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    report.section("LIST 10k pods protobuf, p50");
    report.row(
        "LIST 10k pods protobuf p50",
        "ms",
        vec![
            ("direct".into(), direct_10k),
            ("hub (cloud up, teeing)".into(), online_10k),
            ("hub from its cache (cloud frozen)".into(), cached_10k),
        ],
        true,
    );
    report.section("cache writes and memory");
    report.single("10k-pod list answered", "ms", ms(listed));
    report.single("10k-pod list all stored", "ms", ms(stored));
    report.single(
        "cache write rate",
        "objects/s",
        10_000.0 / stored.as_secs_f64(),
    );
    report.single("hub RSS idle", "MiB", mib(idle));
    report.single("hub RSS after caching 1k pods", "MiB", mib(rss_1k));
    report.single("hub RSS after caching 10k pods", "MiB", mib(rss_10k));
    report.single(
        "hub RSS after serving 10k from its cache",
        "MiB",
        mib(rss_served),
    );
    report.single(
        "store file (10k + 1k pods)",
        "MiB",
        file_bytes as f64 / 1048576.0,
    );
    report.single(
        "their payload (protobuf)",
        "MiB",
        (pb_1k_bytes + pb_10k_bytes) as f64 / 1048576.0,
    );
    report.section("outages, 1k-pod lists in a loop");
    report.single(
        "cloud frozen -> first cached answer",
        "ms",
        ms(to_cache_frozen),
    );
    report.single(
        "requests failed while it froze",
        "requests",
        failed_frozen as f64,
    );
    report.single(
        "cloud killed -> first cached answer",
        "ms",
        ms(to_cache_dead),
    );
    report.single(
        "requests failed while it died",
        "requests",
        failed_dead as f64,
    );
    report.single("cloud back -> traffic returns to it", "ms", ms(back));
    report.single(
        "requests failed while it came back",
        "requests",
        failed_back as f64,
    );
    report.single(
        "offline start (10k cached) -> first cached answer",
        "ms",
        ms(first),
    );
    report.finish()
}
