//! `cargo xtask bench pool`: three release hubs in front of a release stand-in (3 nodes ×
//! 3000 pods) and one real etcd as the pool's coordinator. Each hub's kubelet-style client
//! lists its node's pods; measured: how long until the coordinator holds all 9000, and —
//! after the etcd is wiped and started empty — how long the hubs' re-push takes (target
//! ≤ 3 s). Then five kube-proxy-style clients, one behind each of five hubs, list and
//! watch the pool-scope resources, without a pool and with one: the cloud's own count of
//! open watches and of bytes sent for one endpointslice change.
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hub_tests::etcd::EtcdCluster;
use hyper::Request;

use hub_tests::hub::HubProc;

use crate::bench::{COMPONENT, Http, Output, Report, Stack, rss_kib};

const NODES: usize = 3;
const PODS: usize = 3000;

fn wait_pods(etcd: &EtcdCluster, n: usize, since: Instant) -> Result<Duration> {
    wait_pod_count(etcd, |have| have >= n, since, &format!("reach {n} pods"))
}

/// Waits until the coordinator's pod count satisfies `done`; the time since `since`.
fn wait_pod_count(
    etcd: &EtcdCluster,
    done: impl Fn(usize) -> bool,
    since: Instant,
    what: &str,
) -> Result<Duration> {
    while since.elapsed() < Duration::from_secs(120) {
        if done(etcd.keys("/registry/pods/").len()) {
            return Ok(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the coordinator did not {what} within 120 s")
}

/// The coordinator's pod count (a range's count comes whole with --limit=1: cheap to poll).
fn pod_count(etcd: &EtcdCluster) -> usize {
    etcd.etcdctl(
        &etcd.endpoints(),
        &[
            "get",
            "/registry/pods/",
            "--prefix",
            "--keys-only",
            "--limit=1",
            "-w",
            "json",
        ],
    )
    .ok()
    .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
    .and_then(|v| v["count"].as_u64())
    .unwrap_or(0) as usize
}

/// How many of the coordinator's pods are held in protobuf (kube-apiserver's storage
/// encoding), of how many. etcdctl prints values in base64: protobuf's `k8s\0` is `azhz`.
fn pods_as_protobuf(etcd: &EtcdCluster) -> Result<(usize, usize)> {
    let out = etcd
        .etcdctl(
            &etcd.endpoints(),
            &["get", "/registry/pods/", "--prefix", "-w", "json"],
        )
        .map_err(|e| anyhow::anyhow!("etcdctl get: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let values: Vec<&str> = v["kvs"]
        .as_array()
        .map(|kvs| kvs.iter().filter_map(|kv| kv["value"].as_str()).collect())
        .unwrap_or_default();
    let protobuf = values.iter().filter(|b| b.starts_with("azhz")).count();
    Ok((protobuf, values.len()))
}

/// The etcd's current revision (every write Txn adds one) and database size in bytes.
fn etcd_state(etcd: &EtcdCluster) -> Result<(u64, u64)> {
    let out = etcd
        .etcdctl(&etcd.endpoints(), &["endpoint", "status", "-w", "json"])
        .map_err(|e| anyhow::anyhow!("etcdctl endpoint status: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let s = &v[0]["Status"];
    Ok((
        s["header"]["revision"].as_u64().unwrap_or(0),
        s["dbSize"].as_u64().unwrap_or(0),
    ))
}

/// What the members say of themselves: WAL bytes written (summed), and each member's RSS.
fn members_state(etcd: &EtcdCluster) -> (u64, Vec<u64>) {
    let wal = etcd
        .members
        .iter()
        .filter_map(|m| member_metric(&m.client_url, "etcd_disk_wal_write_bytes_total"))
        .sum::<f64>() as u64;
    let rss = etcd.pids().into_iter().filter_map(rss_kib).collect();
    (wal, rss)
}

/// One counter from a member's /metrics (plain HTTP on its client URL).
fn member_metric(url: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    tcp.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// `cargo xtask bench pool-scale`: a pool of SCALE_HUBS release hubs (each its own node
/// with SCALE_PODS pods) on a 3-member etcd, each member its own process and data dir.
/// Measured: time until every node's pods are in the coordinator, and the etcd writes,
/// WAL bytes and database size that took; writes while nothing changes (should be none);
/// the re-push after the coordinator is wiped, with its leader killed during it (nothing
/// acknowledged may be lost, the pool must converge); one hub killed: time until the
/// leader's sweep has removed what only it held; each member's RSS.
pub fn scale(output: Output) -> Result<()> {
    const SCALE_HUBS: usize = 50;
    const SCALE_PODS: usize = 500;
    const GRACE_S: u64 = 4;
    let NodePool {
        mut etcd,
        stack: _stack,
        mut hubs,
        kubelets,
        hubs_ready,
    } = node_pool(
        "bps",
        3,
        SCALE_HUBS,
        SCALE_PODS,
        &format!(
            "poolName: scale\ncoordinator:\n  gcIntervalSeconds: 1\n  nodeGraceSeconds: {GRACE_S}\n  leaderLeaseSeconds: 3\n"
        ),
    )?;
    let start_s = hubs_ready.as_secs_f64();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let total = SCALE_HUBS * SCALE_PODS;
    let (rev0, _) = etcd_state(&etcd)?;
    let (wal0, _) = members_state(&etcd);
    let listed = Instant::now();
    rt.block_on(kubelet_lists(&hubs, &kubelets))?;
    let first = wait_pods(&etcd, total, listed)?;
    let (as_protobuf, _) = pods_as_protobuf(&etcd)?;
    // Let the pushes that follow the last one settle, then count writes over a quiet spell.
    std::thread::sleep(Duration::from_secs(3));
    let (rev1, db1) = etcd_state(&etcd)?;
    let (wal1, _) = members_state(&etcd);
    const QUIET: Duration = Duration::from_secs(20);
    std::thread::sleep(QUIET);
    let (rev2, _) = etcd_state(&etcd)?;
    let (wal2, rss_members) = members_state(&etcd);
    let leaders = |hubs: &[(HubProc, String)]| {
        hubs.iter()
            .filter(|(h, _)| h.status()["coordinator"]["role"] == "leader")
            .count()
    };
    let leaders_quiet = leaders(&hubs);
    let rss: Vec<u64> = hubs
        .iter()
        .filter_map(|(h, _)| rss_kib(h.proc.pid()))
        .collect();
    let rss_mean = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64 / 1024.0;

    // The coordinator rebuilt empty; as soon as the re-push has begun, its leader dies
    // (and comes back 5 s later): the pool must still end with every pod.
    etcd.wipe_all();
    let wiped = Instant::now();
    let victim = etcd
        .leader()
        .ok_or_else(|| anyhow::anyhow!("no etcd leader"))?;
    let mut before_kill = 0;
    while before_kill == 0 {
        anyhow::ensure!(
            wiped.elapsed() < Duration::from_secs(60),
            "no re-push began within 60 s"
        );
        before_kill = pod_count(&etcd);
    }
    etcd.kill_member(victim);
    std::thread::sleep(Duration::from_secs(5));
    etcd.start_member(victim);
    etcd.wait_healthy(victim);
    let again = wait_pods(&etcd, total, wiped)?;
    let (rev3, db3) = etcd_state(&etcd)?;

    // Wait for a leader again (its sweep is what removes a dead hub's keys).
    let since = Instant::now();
    while leaders(&hubs) != 1 {
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(30),
            "no leader after the wipe"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Kill a follower with -9: no goodbye, only its membership lease runs out.
    let victim = hubs
        .iter()
        .position(|(h, _)| h.status()["coordinator"]["role"] == "follower")
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let (mut dead, _) = hubs.remove(victim);
    dead.proc.kill9();
    let killed = Instant::now();
    let swept = wait_pod_count(
        &etcd,
        |have| have == total - SCALE_PODS,
        killed,
        "sweep the killed hub's pods",
    )?;
    let leader_gc = hubs
        .iter()
        .find(|(h, _)| h.status()["coordinator"]["role"] == "leader")
        .map(|(h, _)| h.status()["coordinator"]["gc"].clone())
        .unwrap_or_default();

    let mut report = Report::new("pool-scale", output);
    report.line(&format!(
        "bench pool-scale: {SCALE_HUBS} release hubs (one node each) × {SCALE_PODS} pods, a 3-member etcd, on this 2-core machine"
    ));
    let mib = |b: u64| b as f64 / 1048576.0;
    report.section(&format!(
        "{SCALE_HUBS} hubs × {SCALE_PODS} pods, a 3-member etcd"
    ));
    report.single("hubs started and ready", "s", start_s);
    report.single(
        &format!("lists answered -> all {total} pods in the coordinator"),
        "s",
        first.as_secs_f64(),
    );
    report.single(
        "etcd writes for that first push",
        "revisions",
        (rev1 - rev0) as f64,
    );
    report.single(
        "etcd WAL written for it, all members",
        "MiB",
        mib(wal1 - wal0),
    );
    report.single(
        "pods held in protobuf (kube-apiserver's storage encoding)",
        "pods",
        as_protobuf as f64,
    );
    report.single("etcd database after it", "MiB", mib(db1));
    report.single(
        &format!(
            "etcd writes over {} s with nothing changing",
            QUIET.as_secs()
        ),
        "revisions",
        (rev2 - rev1) as f64,
    );
    report.single(
        &format!("etcd WAL over those {} s, all members", QUIET.as_secs()),
        "MiB",
        mib(wal2 - wal1),
    );
    report.single("leaders in the pool", "hubs", leaders_quiet as f64);
    report.single("hub RSS, mean", "MiB", rss_mean);
    for (i, kib) in rss_members.iter().enumerate() {
        report.single(&format!("etcd member {i} RSS"), "MiB", mib(kib * 1024));
    }
    report.single(
        "coordinator wiped -> all pods re-pushed (etcd leader killed on the way)",
        "s",
        again.as_secs_f64(),
    );
    report.single(
        "pods in the coordinator when its etcd leader was killed",
        "pods",
        before_kill as f64,
    );
    report.single(
        "pods in the coordinator after the re-push",
        "pods",
        total as f64,
    );
    report.single("etcd writes for the re-push", "revisions", rev3 as f64);
    report.single("etcd database after it", "MiB", mib(db3));
    report.single(
        &format!("hub killed -> its pods swept (grace {GRACE_S} s)"),
        "s",
        swept.as_secs_f64(),
    );
    report.line(&format!("  leader's sweep counters: {leader_gc}"));
    report.finish()
}

/// Each node's kubelet-style client lists its own node's pods (protobuf, as kubelet asks)
/// through its node's hub, so every hub caches and pushes its node's pods.
async fn kubelet_lists(hubs: &[(HubProc, String)], kubelets: &[Http]) -> Result<()> {
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
        let resp = kubelets[i].request(req).await?;
        anyhow::ensure!(resp.status().is_success(), "list: {}", resp.status());
        resp.into_body().collect().await?;
    }
    Ok(())
}

/// `--hub-pki NODE` for each name: the stand-in writes each hub its own node identity.
fn identities(names: &[String]) -> Vec<&str> {
    names
        .iter()
        .flat_map(|n| ["--hub-pki", n.as_str()])
        .collect()
}

/// A pool on one machine: `members` etcd members, a stand-in with `nodes` nodes (`node-<i>`) of
/// `pods` pods each, and per node a release hub speaking for it — its own membership,
/// sets and identity at the cloud, as in a real pool — and that node's kubelet-style
/// client. `pool_yaml` is the hub's pool configuration; the etcd endpoint is added.
pub(crate) struct NodePool {
    pub etcd: EtcdCluster,
    /// Kept for its processes and files; dropped last.
    pub stack: Stack,
    pub hubs: Vec<(HubProc, String)>,
    pub kubelets: Vec<Http>,
    pub hubs_ready: Duration,
}

pub(crate) fn node_pool(
    tag: &str,
    members: usize,
    nodes: usize,
    pods: usize,
    pool_yaml: &str,
) -> Result<NodePool> {
    let etcd = EtcdCluster::start(members);
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let (node_count, pod_count) = (nodes.to_string(), pods.to_string());
    let mut args = vec!["--nodes", &node_count, "--pods-per-node", &pod_count];
    args.extend(identities(&names));
    let stack = Stack::start(tag, &args)?;
    let endpoints: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let pool = format!("{pool_yaml}  endpoints: [{}]\n", endpoints.join(", "));
    let started = Instant::now();
    let hubs: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, node)| stack.start_hub(&format!("{tag}-{i}"), node, &pool))
        .collect();
    let hubs_ready = started.elapsed();
    let kubelets = names
        .iter()
        .map(|n| stack.client(Some(n)))
        .collect::<Result<Vec<_>>>()?;
    Ok(NodePool {
        etcd,
        stack,
        hubs,
        kubelets,
        hubs_ready,
    })
}

/// How long the cloud's steady traffic is counted for, per hub.
const STEADY: Duration = Duration::from_secs(60);

pub fn pool(output: Output) -> Result<()> {
    let NodePool {
        mut etcd,
        stack,
        hubs,
        kubelets,
        ..
    } = node_pool("bpl", 1, NODES, PODS, "poolName: bench\ncoordinator:\n")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let admin = stack.client(None)?;
    rt.block_on(reset_traffic(&admin, &stack.direct))?;
    let listed = Instant::now();
    rt.block_on(kubelet_lists(&hubs, &kubelets))?;
    let first = wait_pods(&etcd, NODES * PODS, listed).inspect_err(|_| {
        for (hub, _) in &hubs {
            eprintln!("hub status: {}", hub.status()["coordinator"]);
            eprintln!("hub cache: {}", hub.status()["cache"]);
        }
        eprintln!("pods in etcd: {}", etcd.keys("/registry/pods/").len());
    })?;
    let (pb_first, _) = pods_as_protobuf(&etcd)?;
    // What the cloud saw of each hub: its kubelet's list and the push that followed; then a
    // minute of nothing changing.
    let first_push = rt.block_on(traffic_by_user(&admin, &stack.direct))?;
    rt.block_on(reset_traffic(&admin, &stack.direct))?;
    std::thread::sleep(STEADY);
    let steady = rt.block_on(traffic_by_user(&admin, &stack.direct))?;
    etcd.wipe_member(0);
    let wiped = Instant::now();
    let again = wait_pods(&etcd, NODES * PODS, wiped)?;
    let (pb_again, _) = pods_as_protobuf(&etcd)?;
    let mut report = Report::new("pool", output);
    report.line(&format!(
        "bench pool: {NODES} release hubs × {PODS} pods (protobuf, as kubelet asks), one etcd member"
    ));
    report.section(&format!("{NODES} hubs × {PODS} pods, one etcd member"));
    report.single(
        "lists answered -> all pods in the coordinator",
        "ms",
        first.as_secs_f64() * 1e3,
    );
    report.single(
        "coordinator wiped -> all pods re-pushed (target 3000)",
        "ms",
        again.as_secs_f64() * 1e3,
    );
    report.single("pods held in protobuf, first push", "pods", pb_first as f64);
    report.single("pods held in protobuf, re-push", "pods", pb_again as f64);
    for (hub, _) in &hubs {
        let c = hub.status()["coordinator"].clone();
        report.line(&format!(
            "  hub: {} full pushes, last push {} ms, role {}",
            c["full_pushes"], c["last_push_ms"], c["role"]
        ));
    }
    report.section(&format!(
        "the cloud's bill per hub (its node identity): kubelet list + first push, then {} s of nothing changing",
        STEADY.as_secs()
    ));
    let users: Vec<String> = (0..NODES)
        .map(|i| format!("system:node:node-{i}"))
        .collect();
    for (when, traffic) in [("first push", &first_push), ("steady minute", &steady)] {
        for user in &users {
            let t = traffic.get(user).cloned().unwrap_or_default();
            report.line(&format!(
                "  {user}, {when}: {} bytes; {}",
                t.bytes,
                t.verbs_text()
            ));
        }
        let sum = |f: &dyn Fn(&UserTraffic) -> u64| {
            users
                .iter()
                .filter_map(|u| traffic.get(u))
                .map(f)
                .sum::<u64>() as f64
                / NODES as f64
        };
        report.single(
            &format!("cloud GETs of single objects per hub, {when}"),
            "requests",
            sum(&|t| t.verb("get")),
        );
        report.single(
            &format!("cloud lists per hub, {when}"),
            "requests",
            sum(&|t| t.verb("list")),
        );
        report.single(
            &format!("cloud requests per hub, {when} (all verbs)"),
            "requests",
            sum(&|t| t.requests),
        );
        report.single(
            &format!("bytes the cloud sent per hub, {when}"),
            "KiB",
            sum(&|t| t.bytes) / 1024.0,
        );
    }
    report.section("conversion on the node, one object (the 1.36 recorded pod)");
    let (to_json_us, to_protobuf_us) = conversion_cost()?;
    report.single("protobuf -> JSON", "us", to_json_us);
    report.single("JSON -> protobuf", "us", to_protobuf_us);
    drop(hubs);
    drop(etcd);

    const WATCHERS: usize = 5;
    let [without, with] = leader_path(WATCHERS)?;
    report.section(&format!(
        "{WATCHERS} nodes' kube-proxies list+watch services, endpoints, endpointslices (50 services)"
    ));
    let pair = |a: u64, b: u64| {
        vec![
            ("no pool".into(), a as f64),
            ("with the leader".into(), b as f64),
        ]
    };
    report.row(
        "watches open at the cloud (3 pool-scope resources)",
        "watches",
        pair(without.0, with.0),
        false,
    );
    report.row(
        "bytes the cloud sent for one endpointslice change",
        "bytes",
        pair(without.1, with.1),
        false,
    );
    report.line(
        "  with the leader: its sync watches (one per resource) plus its own node's kube-proxy; followers' kube-proxies never reach the cloud",
    );
    report.finish()
}

/// One user's traffic at the cloud, as the stand-in counts it.
#[derive(Clone, Default)]
pub(crate) struct UserTraffic {
    pub requests: u64,
    pub bytes: u64,
    /// Watches that began with the whole state (`sendInitialEvents=true`).
    pub watch_lists: u64,
    pub verbs: std::collections::BTreeMap<String, u64>,
    /// Response body bytes by "verb resource".
    pub bytes_by: std::collections::BTreeMap<String, u64>,
}

impl UserTraffic {
    /// Adds another user's counts to these.
    pub(crate) fn add(&mut self, other: &UserTraffic) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.watch_lists += other.watch_lists;
        for (verb, n) in &other.verbs {
            *self.verbs.entry(verb.clone()).or_default() += n;
        }
        for (what, n) in &other.bytes_by {
            *self.bytes_by.entry(what.clone()).or_default() += n;
        }
    }

    /// What was counted after `before` (an earlier reading of the same user).
    pub(crate) fn since(&self, before: &UserTraffic) -> UserTraffic {
        let minus = |now: &std::collections::BTreeMap<String, u64>,
                     then: &std::collections::BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, n)| (k.clone(), n - then.get(k).copied().unwrap_or(0)))
                .collect()
        };
        UserTraffic {
            requests: self.requests - before.requests,
            bytes: self.bytes - before.bytes,
            watch_lists: self.watch_lists - before.watch_lists,
            verbs: minus(&self.verbs, &before.verbs),
            bytes_by: minus(&self.bytes_by, &before.bytes_by),
        }
    }

    pub(crate) fn verb(&self, v: &str) -> u64 {
        self.verbs.get(v).copied().unwrap_or(0)
    }

    pub(crate) fn verbs_text(&self) -> String {
        let parts: Vec<String> = self.verbs.iter().map(|(v, n)| format!("{v} {n}")).collect();
        if parts.is_empty() {
            "no requests".into()
        } else {
            parts.join(", ")
        }
    }
}

async fn standin_traffic(
    admin: &crate::bench::Http,
    direct: &str,
    method: &str,
) -> Result<serde_json::Value> {
    let req = Request::builder()
        .method(method)
        .uri(format!("{direct}/_standin/traffic"))
        .header(
            "Authorization",
            format!("Bearer {}", hub_tests::apiserver::ADMIN_TOKEN),
        )
        .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())?;
    let body = admin
        .request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

pub(crate) async fn reset_traffic(admin: &crate::bench::Http, direct: &str) -> Result<()> {
    standin_traffic(admin, direct, "DELETE").await.map(drop)
}

/// The cloud's count of requests (by verb) and response bytes, per user.
pub(crate) async fn traffic_by_user(
    admin: &crate::bench::Http,
    direct: &str,
) -> Result<std::collections::BTreeMap<String, UserTraffic>> {
    let v = standin_traffic(admin, direct, "GET").await?;
    Ok(v.as_object()
        .into_iter()
        .flatten()
        .map(|(user, t)| {
            let counts = |v: &serde_json::Value| {
                v.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                    .collect()
            };
            let traffic = UserTraffic {
                requests: t["requests"].as_u64().unwrap_or(0),
                bytes: t["bytes"].as_u64().unwrap_or(0),
                watch_lists: t["watch_lists"].as_u64().unwrap_or(0),
                verbs: counts(&t["verbs"]),
                bytes_by: counts(&t["bytes_by"]),
            };
            (user.clone(), traffic)
        })
        .collect())
}

/// CPU per object of the release hub's conversion, both directions (`hub convert --repeat`),
/// on the pod kube-apiserver 1.36 answered in both encodings: µs per conversion.
fn conversion_cost() -> Result<(f64, f64)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/wire/kube-apiserver-1.36");
    let per_conversion = |file: &str| -> Result<f64> {
        let out = std::process::Command::new(hub_tests::hub_bin())
            .args(["convert", "--repeat", "20000"])
            .arg(dir.join(file).join("response.body"))
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "hub convert {file}: {err}");
        err.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("hub convert {file}: no timing in {err:?}"))
    };
    Ok((
        per_conversion("dual-pod-protobuf")?,
        per_conversion("dual-pod-json")?,
    ))
}

/// What the cloud reports of its edge traffic: (open watches, response bytes), all users.
async fn cloud_traffic(admin: &crate::bench::Http, direct: &str) -> Result<(u64, u64)> {
    let v = standin_traffic(admin, direct, "GET").await?;
    let users = v.as_object().cloned().unwrap_or_default();
    let sum = |f: &str| users.values().map(|u| u[f].as_u64().unwrap_or(0)).sum();
    Ok((sum("open_watches"), sum("bytes")))
}

/// One call as the stand-in's admin: a PATCH is a merge patch, anything else JSON.
pub(crate) async fn admin_call(
    admin: &crate::bench::Http,
    method: &str,
    url: String,
    body: &str,
) -> Result<()> {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header(
            "Authorization",
            format!("Bearer {}", hub_tests::apiserver::ADMIN_TOKEN),
        )
        .header("Content-Type", content_type)
        .body(
            http_body_util::Full::new(Bytes::from(body.to_string()))
                .map_err(|n| match n {})
                .boxed(),
        )?;
    let resp = admin.request(req).await?;
    anyhow::ensure!(resp.status().is_success(), "{method}: {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

const POOL_SCOPE: [&str; 3] = [
    "/api/v1/services",
    "/api/v1/endpoints",
    "/apis/discovery.k8s.io/v1/endpointslices",
];

/// Pool-scope traffic at the cloud for `nodes` kube-proxies, each behind its node's hub:
/// without a pool (every hub watches the cloud), then with one (the leader syncs for all,
/// followers read the coordinator). Returns (open cloud watches, cloud bytes for one
/// endpointslice change) per mode.
fn leader_path(nodes: usize) -> Result<[(u64, u64); 2]> {
    let names: Vec<String> = (0..nodes).map(|i| format!("watcher-{i}")).collect();
    let mut args = vec!["--services", "50", "--bookmark-ms", "3600000"];
    args.extend(identities(&names));
    let stack = Stack::start("bpw", &args)?;
    let etcd = EtcdCluster::start(1);
    let admin = stack.client(None)?;
    let kube_proxies = names
        .iter()
        .map(|n| stack.client(Some(n)))
        .collect::<Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut out = [(0, 0); 2];
    for (mode, with_pool) in [false, true].into_iter().enumerate() {
        let extra = if with_pool {
            format!(
                "poolName: bench-watch\ncoordinator:\n  endpoints: [\"{}\"]\n",
                etcd.endpoints()[0]
            )
        } else {
            String::new()
        };
        let hubs: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, node)| stack.start_hub(&format!("watch-{mode}-{i}"), node, &extra))
            .collect();
        if with_pool {
            let since = Instant::now();
            loop {
                let synced = etcd
                    .etcdctl(
                        &etcd.endpoints(),
                        &["get", "/hub/synced/", "--prefix", "--keys-only"],
                    )
                    .map(|o| o.lines().filter(|l| !l.is_empty()).count())
                    .unwrap_or(0);
                let roles: Vec<String> = hubs
                    .iter()
                    .map(|(h, _)| {
                        h.status()["coordinator"]["role"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect();
                if synced == POOL_SCOPE.len()
                    && roles.iter().filter(|r| *r == "leader").count() == 1
                    && roles.iter().filter(|r| *r == "follower").count() == nodes - 1
                {
                    break;
                }
                anyhow::ensure!(
                    since.elapsed() < Duration::from_secs(30),
                    "no synced leader"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let marker = format!("churn-{mode}");
        let (open, bytes) = rt.block_on(async {
            let (seen_tx, mut seen_rx) = tokio::sync::mpsc::channel::<usize>(64);
            let mut readers = Vec::new();
            for (i, (_, via)) in hubs.iter().enumerate() {
                for path in POOL_SCOPE {
                    let get = |q: String| {
                        Request::get(format!("{via}{path}{q}"))
                            .header("User-Agent", "kube-proxy/v1.32.0")
                            .header("Accept", "application/json")
                            .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())
                    };
                    let client = &kube_proxies[i];
                    let list = client.request(get(String::new())?).await?;
                    anyhow::ensure!(list.status().is_success(), "list {path}: {}", list.status());
                    let body = list.into_body().collect().await?.to_bytes();
                    let v: serde_json::Value = serde_json::from_slice(&body)?;
                    let rv = v["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or("0")
                        .to_string();
                    let watch = client
                        .request(get(format!("?watch=1&resourceVersion={rv}"))?)
                        .await?;
                    anyhow::ensure!(
                        watch.status().is_success(),
                        "watch {path}: {}",
                        watch.status()
                    );
                    let (tx, marker) = (seen_tx.clone(), marker.clone());
                    let is_slices = path.ends_with("endpointslices");
                    readers.push(tokio::spawn(async move {
                        let mut body = watch.into_body();
                        while let Some(Ok(f)) = body.frame().await {
                            if let Ok(d) = f.into_data()
                                && is_slices
                                && String::from_utf8_lossy(&d).contains(&marker)
                            {
                                let _ = tx.send(i).await;
                            }
                        }
                    }));
                }
            }
            // Every watch is open (its headers came back); let the cloud side settle.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (open, _) = cloud_traffic(&admin, &stack.direct).await?;
            admin_call(
                &admin,
                "DELETE",
                format!("{}/_standin/traffic", stack.direct),
                "",
            )
            .await?;
            admin_call(
                &admin,
                "PATCH",
                format!(
                    "{}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/svc-0-abc12",
                    stack.direct
                ),
                &format!(r#"{{"metadata":{{"labels":{{"churn":"{marker}"}}}}}}"#),
            )
            .await?;
            let mut seen = std::collections::HashSet::new();
            while seen.len() < nodes {
                let i = tokio::time::timeout(Duration::from_secs(10), seen_rx.recv())
                    .await
                    .map_err(|_| anyhow::anyhow!("not every kube-proxy saw the change"))?
                    .ok_or_else(|| anyhow::anyhow!("watches ended"))?;
                seen.insert(i);
            }
            let (_, bytes) = cloud_traffic(&admin, &stack.direct).await?;
            for r in readers {
                r.abort();
            }
            anyhow::Ok((open, bytes))
        })?;
        out[mode] = (open, bytes);
        drop(hubs);
    }
    Ok(out)
}
