//! `cargo xtask bench proxy`: the hub's TLS proxy in front of the API stand-in vs the
//! stand-in directly, interleaved in one run over HTTP/2 with keep-alive (as client-go):
//! GET one pod (p50/p99, CPU per GET), LIST of 1k unchanged pods (a relist; JSON and
//! protobuf) and of 1k changed pods, with each proxy's CPU per request from /proc, a
//! 10k-event watch, and the hub's RSS idle, after the run and at its peak (VmHWM). Every
//! round runs twice: at the stand-in's own speed, and with its server cost on (the CPU a
//! real kube-apiserver spends per answer), where a proxy's share is seen in proportion. nginx, when installed (scripts/setup.sh
//! does), is measured in the same rounds as a reference: the issue's anchors give its
//! cost against a real kube-apiserver, so its ratio here tells how much harsher the
//! stand-in's fast answers make every ratio. `HUB_BENCH_OTHER=path/to/hub` adds a second
//! hub build to the same rounds (run-to-run noise here is larger than most changes).
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hub_tests::apiserver::{ADMIN_TOKEN, faults::FaultSettings};
use hyper::Request;

use crate::bench::{
    COMPONENT, Http, Output, Report, Stack, cpu_ns, cpu_ns_by_thread, rss_kib, status_kib,
};

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

async fn get(client: &Http, url: &str) -> Result<Bytes> {
    get_as(client, url, "application/json").await
}

async fn get_as(client: &Http, url: &str, accept: &str) -> Result<Bytes> {
    get_by(client, url, accept, COMPONENT).await
}

/// A GET as `component` (its User-Agent): the hub caches only its configured components.
async fn get_by(client: &Http, url: &str, accept: &str, component: &str) -> Result<Bytes> {
    let req = Request::get(url)
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("Accept", accept)
        .header("User-Agent", format!("{component}/1.0"))
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

/// One process answering the benchmark's requests: the stand-in itself (direct), the hub,
/// nginx, or a second hub build.
struct Base {
    label: String,
    url: String,
    pid: u32,
}

/// What the rounds share.
struct Bench<'a> {
    client: &'a Http,
    bases: Vec<Base>,
    /// The stand-in's address, for its control endpoints.
    direct: String,
    hub_pid: u32,
    /// The hub's CPU by thread name when the last `cpu_now` was taken.
    hub_threads: std::collections::BTreeMap<String, u64>,
    report: Report,
}

const POD: &str = "/api/v1/namespaces/default/pods/pod-3-42";
const LIST: &str = "/api/v1/namespaces/default/pods";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

pub fn proxy(rounds: usize, output: Output) -> Result<()> {
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
    let hub = &stack.hub;
    let mut bases = vec![
        Base {
            label: "direct".into(),
            url: stack.direct.clone(),
            pid: stack.standin.pid(),
        },
        Base {
            label: "hub".into(),
            url: stack.via.clone(),
            pid: hub.proc.pid(),
        },
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
        bases.push(Base {
            label: "HUB_BENCH_OTHER".into(),
            url: url.clone(),
            pid: proc.proc.pid(),
        });
    }
    let nginx = Nginx::start(&stack)?;
    match &nginx {
        Some(n) => bases.push(Base {
            label: "nginx".into(),
            url: n.url.clone(),
            pid: n.proc.pid(),
        }),
        None => eprintln!(
            "bench proxy: nginx not installed, no reference rows (scripts/setup.sh installs nginx-light)"
        ),
    }
    let idle_rss = rss_kib(hub.proc.pid()).unwrap_or(0);
    let mut bench = Bench {
        client: &stack.client,
        bases,
        direct: stack.direct.clone(),
        hub_pid: hub.proc.pid(),
        hub_threads: Default::default(),
        report: Report::new("proxy", output),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        for base in &bench.bases {
            for _ in 0..50 {
                get(bench.client, &format!("{}{POD}", base.url)).await?;
            }
        }
        bench.report.line(&format!(
            "bench proxy: release stand-in over TLS (HTTP/2, keep-alive), release hub with caching on, {rounds} GET rounds"
        ));
        for cost in [false, true] {
            bench.set_cost(cost).await?;
            bench.rounds(rounds, cost).await?;
        }
        bench.set_cost(false).await
    })?;
    let kib = |field| status_kib(hub.proc.pid(), field).unwrap_or(0) as f64 / 1024.0;
    let r = &mut bench.report;
    r.section("memory");
    r.single("hub RSS idle", "MiB", idle_rss as f64 / 1024.0);
    r.single("hub RSS after the run", "MiB", kib("VmRSS:"));
    r.single("hub peak RSS (VmHWM)", "MiB", kib("VmHWM:"));
    if let Some((other, _)) = &other {
        let kib = status_kib(other.proc.pid(), "VmHWM:").unwrap_or(0);
        r.single("HUB_BENCH_OTHER peak RSS", "MiB", kib as f64 / 1024.0);
    }
    bench.report.finish()
}

impl Bench<'_> {
    /// Turns the stand-in's server cost (a real apiserver's CPU per answer) on or off.
    async fn set_cost(&self, on: bool) -> Result<()> {
        let body = if on {
            serde_json::to_vec(&FaultSettings::REALISTIC_COST)?
        } else {
            b"{}".to_vec()
        };
        let req = Request::put(format!("{}/_standin/faults", self.direct))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
            .body(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed())?;
        let resp = self.client.request(req).await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "setting the stand-in's cost: {}",
            resp.status()
        );
        Ok(())
    }

    /// Gives every pod in `default` a new resourceVersion (the next list is all changed).
    async fn touch_pods(&self) -> Result<()> {
        let req = Request::post(format!(
            "{}/_standin/touch?resource=pods&namespace=default",
            self.direct
        ))
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
        let resp = self.client.request(req).await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "touching pods: {}",
            resp.status()
        );
        resp.into_body().collect().await?;
        Ok(())
    }

    fn urls(&self) -> Vec<String> {
        self.bases.iter().map(|b| b.url.clone()).collect()
    }

    /// Each process's CPU so far, the hub's once its cache writer is done with what it
    /// was given (its work on an answer runs after the answer went out).
    fn cpu_now(&mut self) -> Vec<u64> {
        self.settle_hub();
        self.hub_threads = cpu_ns_by_thread(self.hub_pid);
        self.bases.iter().map(|b| cpu_ns(b.pid)).collect()
    }

    /// Waits (≤ 10 s) until the hub has used no CPU for 200 ms.
    fn settle_hub(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = cpu_ns(self.hub_pid);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            let now = cpu_ns(self.hub_pid);
            if now - last < 1_000_000 {
                return;
            }
            last = now;
        }
    }

    /// One row per proxy: its percentile against direct's.
    fn latency_rows(&mut self, metric: &str, samples: &mut [Vec<f64>], q: f64, unit: &str) {
        let values = self
            .bases
            .iter()
            .zip(samples.iter_mut())
            .map(|(b, s)| (b.label.clone(), percentile(s, q)))
            .collect();
        self.report.row(metric, unit, values, true);
    }

    /// CPU per request of each proxy (not the stand-in: it served every base).
    fn cpu_row(&mut self, metric: &str, before: &[u64], requests: usize) {
        let threads_before = std::mem::take(&mut self.hub_threads);
        let after = self.cpu_now();
        // Where the hub's share went, for whoever wants to make it smaller.
        let split: Vec<String> = self
            .hub_threads
            .iter()
            .map(|(name, ns)| {
                let used = ns.saturating_sub(threads_before.get(name).copied().unwrap_or(0));
                format!("{name} {:.0}", used as f64 / requests as f64 / 1e3)
            })
            .collect();
        self.report
            .line(&format!("  the hub's by thread (µs): {}", split.join(", ")));
        let values = self
            .bases
            .iter()
            .zip(before.iter().zip(&after))
            .skip(1)
            .map(|(b, (x, y))| (b.label.clone(), (y - x) as f64 / requests as f64 / 1e3))
            .collect();
        self.report.row(metric, "µs", values, false);
    }

    async fn rounds(&mut self, rounds: usize, cost: bool) -> Result<()> {
        self.report.section(if cost {
            "with the stand-in's server cost (1 ms per GET, ~20 ms per 1k-pod JSON list)"
        } else {
            "without server cost (the stand-in's own speed)"
        });
        let client = self.client;
        let urls = self.urls();
        let before = self.cpu_now();
        let mut t = interleaved(&urls, rounds, |base| async move {
            let t = Instant::now();
            get(client, &format!("{base}{POD}")).await?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        })
        .await?;
        self.latency_rows("GET pod p50", &mut t, 0.5, "µs");
        self.latency_rows("GET pod p99", &mut t, 0.99, "µs");
        self.cpu_row("CPU per GET", &before, rounds);

        // The same 1k pods listed again and again: kubelet's and an informer's relist.
        const LISTS: usize = 40;
        for (name, accept) in [("JSON", "application/json"), ("protobuf", PROTOBUF)] {
            let bytes = get_as(client, &format!("{}{LIST}", urls[0]), accept)
                .await?
                .len();
            let before = self.cpu_now();
            let mut t = interleaved(&urls, LISTS, |base| async move {
                let t = Instant::now();
                get_as(client, &format!("{base}{LIST}"), accept).await?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })
            .await?;
            let metric = format!("LIST 1k unchanged pods {name} ({} KiB)", bytes / 1024);
            self.latency_rows(&format!("{metric} p50"), &mut t, 0.5, "ms");
            self.cpu_row(&format!("CPU per {metric}"), &before, LISTS);
        }

        // The same list for a component the hub does not cache: the proxy's share alone.
        let before = self.cpu_now();
        let mut t = interleaved(&urls, LISTS, |base| async move {
            let t = Instant::now();
            get_by(
                client,
                &format!("{base}{LIST}"),
                "application/json",
                "uncached",
            )
            .await?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .await?;
        self.latency_rows("LIST 1k pods JSON, not cached p50", &mut t, 0.5, "ms");
        self.cpu_row("CPU per LIST 1k pods JSON, not cached", &before, LISTS);

        // Every pod changed before each list: the cache parses and writes all of them.
        const CHANGED: usize = 12;
        let before = self.cpu_now();
        let this = &*self;
        let mut t = interleaved(&urls, CHANGED, |base| async move {
            this.touch_pods().await?;
            let t = Instant::now();
            get(client, &format!("{base}{LIST}")).await?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .await?;
        self.latency_rows("LIST 1k changed pods JSON p50", &mut t, 0.5, "ms");
        self.cpu_row("CPU per LIST 1k changed pods JSON", &before, CHANGED);

        // A 10k-event watch: the initial ADDED events of 10k configmaps. Fifteen rounds: the
        // median of three moved by ±15 % between runs of the same builds.
        let path = "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0";
        let mut t = interleaved(&urls, 15, |base| async move {
            Ok(10_000.0
                / watch(client, &format!("{base}{path}"), 10_000)
                    .await?
                    .as_secs_f64())
        })
        .await?;
        self.latency_rows(
            "watch 10k events (events/s, higher is better)",
            &mut t,
            0.5,
            "events/s",
        );
        Ok(())
    }
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
