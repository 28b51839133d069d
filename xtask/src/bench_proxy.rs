//! `cargo xtask bench proxy`: the hub's TLS proxy in front of the API stand-in vs the
//! stand-in directly, interleaved in one run over HTTP/2 with keep-alive (as client-go):
//! GET one pod (p50/p99), LIST 1k pods (JSON and protobuf), a 10k-event watch,
//! and the hub's RSS idle and after the load. nginx, when installed (scripts/setup.sh
//! does), is measured in the same rounds as a reference: the issue's anchors give its
//! cost against a real kube-apiserver, so its ratio here tells how much harsher the
//! stand-in's fast answers make every ratio. `HUB_BENCH_OTHER=path/to/hub` adds a second
//! hub build to the same rounds (run-to-run noise here is larger than most changes).
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hub_tests::apiserver::ADMIN_TOKEN;
use hyper::Request;

use crate::bench::{COMPONENT, Http, Stack, cpu_ns, rss_kib};

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

fn row(name: &str, direct: f64, via: f64, unit: &str) {
    println!(
        "{name:<36} {direct:>11.3} {via:>11.3} {:>8.3}x  {unit}",
        via / direct
    );
}

/// Runs `measure` on every base once per round, in a shuffled order (fixed seed), so each
/// base follows every other equally often. A rotating order let one base follow the hub
/// in most rounds and absorb the work the hub defers (its cache writer parsing the list
/// it just served), which flattered the hub.
async fn interleaved<F, Fut>(
    bases: &[String],
    rounds: usize,
    mut measure: F,
) -> Result<Vec<Vec<f64>>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<f64>>,
{
    let mut samples = vec![Vec::with_capacity(rounds); bases.len()];
    let mut order: Vec<usize> = (0..bases.len()).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..rounds {
        shuffle(&mut order, &mut seed);
        for &b in &order {
            samples[b].push(measure(bases[b].clone()).await?);
        }
    }
    Ok(samples)
}

/// Fisher-Yates with xorshift64: deterministic, and no dependency for a benchmark's dice.
fn shuffle(v: &mut [usize], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        v.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
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
    let (client, hub) = (&stack.client, &stack.hub);
    // (label, base URL, the serving process); the first is the stand-in itself.
    let mut bases = vec![
        (
            "direct".to_string(),
            stack.direct.clone(),
            stack.standin.pid(),
        ),
        ("hub".to_string(), stack.via.clone(), hub.proc.pid()),
    ];
    let other = std::env::var_os("HUB_BENCH_OTHER").map(|bin| {
        let own = std::env::var_os("HUB_BIN");
        // SAFETY: single-threaded here; the fixture reads HUB_BIN when it starts a hub.
        unsafe { std::env::set_var("HUB_BIN", &bin) };
        let started = stack.start_hub("other", "bench-node", "");
        match own {
            Some(own) => unsafe { std::env::set_var("HUB_BIN", own) },
            None => unsafe { std::env::remove_var("HUB_BIN") },
        }
        started
    });
    if let Some((proc, url)) = &other {
        bases.push(("HUB_BENCH_OTHER".into(), url.clone(), proc.proc.pid()));
    }
    let nginx = Nginx::start(&stack)?;
    match &nginx {
        Some(n) => bases.push(("nginx".into(), n.url.clone(), n.proc.pid())),
        None => println!(
            "bench proxy: nginx not installed, no reference rows (scripts/setup.sh installs nginx-light)"
        ),
    }
    let labels: Vec<String> = bases.iter().map(|(l, _, _)| l.clone()).collect();
    let urls: Vec<String> = bases.iter().map(|(_, u, _)| u.clone()).collect();
    let pids: Vec<u32> = bases.iter().map(|(_, _, p)| *p).collect();
    let idle_rss = rss_kib(hub.proc.pid()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pod = "/api/v1/namespaces/default/pods/pod-3-42";
    let list = "/api/v1/namespaces/default/pods";
    // Prints one row per proxy: its p50 (or p99) against direct's.
    let rows = |name: &str, samples: &mut [Vec<f64>], q: f64, unit: &str| {
        let direct = percentile(&mut samples[0], q);
        for (label, s) in labels.iter().zip(samples.iter_mut()).skip(1) {
            let name = if label == "hub" {
                name.to_string()
            } else {
                format!("{name} ({label})")
            };
            row(&name, direct, percentile(s, q), unit);
        }
    };

    rt.block_on(async {
        for base in &urls {
            for _ in 0..50 {
                get(client, &format!("{base}{pod}")).await?;
            }
        }
        println!("bench proxy: release stand-in over TLS (HTTP/2, keep-alive), release hub with caching on, {rounds} GET rounds");
        println!("{:<36} {:>11} {:>11} {:>9}", "metric", "direct", "via", "ratio");
        let cpu_before: Vec<u64> = pids.iter().map(|p| cpu_ns(*p)).collect();
        let mut t = interleaved(&urls, rounds, |base| async move {
            let t = Instant::now();
            get(client, &format!("{base}{pod}")).await?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        })
        .await?;
        // Less noisy than latency on a shared machine: what each GET cost the process that
        // served it (for direct, the stand-in's own work; via a proxy, the proxy's alone).
        // The stand-in served every base's GETs.
        let served = |i: usize| if i == 0 { rounds * urls.len() } else { rounds } as f64;
        let mut cpu: Vec<Vec<f64>> = pids
            .iter()
            .zip(&cpu_before)
            .enumerate()
            .map(|(i, (p, before))| vec![(cpu_ns(*p) - before) as f64 / served(i) / 1e3])
            .collect();
        rows("GET pod p50", &mut t, 0.5, "µs");
        rows("GET pod p99", &mut t, 0.99, "µs");
        rows("CPU per GET", &mut cpu, 0.5, "µs of the stand-in (direct) vs the proxy's own");

        for (name, accept) in [("JSON", "application/json"), ("protobuf", "application/vnd.kubernetes.protobuf")] {
            let bytes = get_as(client, &format!("{}{list}", urls[0]), accept).await?.len();
            let mut t = interleaved(&urls, 40, |base| async move {
                let t = Instant::now();
                get_as(client, &format!("{base}{list}"), accept).await?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })
            .await?;
            rows(&format!("LIST 1k pods {name} p50"), &mut t, 0.5, &format!("ms ({} KiB)", bytes / 1024));
        }

        // A 10k-event watch: the initial ADDED events of 10k configmaps. Fifteen rounds: the
        // median of three moved by ±15 % between runs of the same builds.
        let path = "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0";
        let mut t = interleaved(&urls, 15, |base| async move {
            Ok(10_000.0 / watch(client, &format!("{base}{path}"), 10_000).await?.as_secs_f64())
        })
        .await?;
        rows("watch 10k events", &mut t, 0.5, "events/s (higher is better)");
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
    if let Some((other, _)) = &other {
        let kib = rss_kib(other.proc.pid()).unwrap_or(0);
        println!(
            "HUB_BENCH_OTHER RSS after load: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// nginx as a plain TLS reverse proxy in front of the stand-in: HTTP/2 towards clients,
/// HTTP/1.1 keep-alive towards the upstream (all nginx 1.22 can), no buffering (watches
/// must stream), one worker like the hub's runtime.
struct Nginx {
    url: String,
    proc: hub_tests::process::Proc,
    _dir: hub_tests::TempDir,
}

impl Nginx {
    /// None when nginx is not installed.
    fn start(stack: &crate::bench::Stack) -> Result<Option<Nginx>> {
        use hub_tests::{TempDir, ports::free_port, process::Proc};
        let Some(bin) = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            return Ok(None);
        };
        let dir = TempDir::new("nginx");
        let d = dir.path().display();
        let port = free_port();
        let (cert, key) = stack.serving_pair();
        let upstream = stack.direct.trim_start_matches("https://");
        let (cert, key) = (cert.display(), key.display());
        let conf = format!(
            r#"worker_processes 1;
pid {d}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  upstream cloud {{ server {upstream}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{
      proxy_pass https://cloud;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"#
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf)?;
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("-c").arg(&path).args(["-g", "daemon off;"]);
        let proc = Proc::spawn(cmd, "nginx");
        hub_tests::wait_for(
            "nginx listening",
            std::time::Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).ok(),
        );
        Ok(Some(Nginx {
            url: format!("https://127.0.0.1:{port}"),
            proc,
            _dir: dir,
        }))
    }
}
