//! `cargo xtask bench edge [--minutes N] [--cut-every S] [--services N]`: what one node's clients cost the
//! edge link, counted on the wire, straight to the cloud and through the hub, side by side in
//! the same run while the link is cut every S seconds (default 600) for 30 s.
//!
//! Two nodes of one cloud: node-0's clients talk to the cloud directly, node-1's through its
//! hub. Each side reaches the cloud through a relay of its own (`crate::relay`) that counts
//! the bytes on its sockets both ways — TLS records, HTTP/2 frames and headers, health
//! probes — and that both sides' cuts go through: every packet dropped for 30 s, then every
//! connection that was open reset, as an edge link whose NAT forgot them.
//!
//! Each node runs the clients a real node runs, as client-go's reflector drives them:
//! - the kubelet 1.36 (node certificate, protobuf, watch-lists): its pods, its Node,
//!   services `spec.clusterIP!=None`; its lease renewed every 10 s;
//! - kube-proxy (its own token, protobuf, watch-lists): services and EndpointSlices with its
//!   label selector, its Node;
//! - CoreDNS (its own token, JSON, LIST then watch): services, EndpointSlices, namespaces;
//! - a CNI agent, flanneld (its own token, JSON, LIST then watch): all nodes;
//! - an operator's agent (its own token, JSON, LIST then watch): ConfigMaps of `default`.
//!
//! The hub caches its default components and the operator's agent.
//!
//! Each informer is driven as client-go's reflector drives it (`crate::reflector`).
//!
//! Meanwhile the cloud (its admin, whose traffic is no node's) changes a pod of each node
//! every 10 s, an EndpointSlice every 30 s, a ConfigMap and a Node every minute, and
//! replaces a service every 2 minutes. At the end, with the changes stopped, every client's
//! view must equal the cloud's (protobuf byte for byte, JSON decode-equal), or the bench
//! fails.
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use hyper::StatusCode;

use crate::{
    bench::{Http, Output, Report, Stack},
    reflector::{Client, Encoding, Informer, PROTOBUF},
    relay::{Carried, Relay},
};
/// How long the link stays cut each time.
const CUT_SECONDS: u64 = 30;
/// The views may take this long to settle once the cloud stops changing.
const SETTLE: Duration = Duration::from_secs(120);
const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";

/// One node's side of the run.
struct Side {
    name: &'static str,
    node: &'static str,
    /// The suffix of its clients' tokens (kube-proxy-a, …).
    tokens: &'static str,
}

const SIDES: [Side; 2] = [
    Side {
        name: "direct",
        node: "node-0",
        tokens: "a",
    },
    Side {
        name: "through the hub",
        node: "node-1",
        tokens: "b",
    },
];
const AGENTS: [&str; 4] = ["kube-proxy", "coredns", "flanneld", "operator-agent"];

/// The services (each with one EndpointSlice) the cloud holds unless told otherwise.
pub const SERVICES: u64 = 50;

/// How a run goes: for how long, how often the link is cut, how large the cluster is.
#[derive(Clone, Copy)]
pub struct Shape {
    pub minutes: u64,
    /// Seconds between the link's cuts.
    pub cut_every: u64,
    /// The cloud's services, each with an EndpointSlice (the shared sets' size).
    pub services: u64,
}

pub fn edge(shape: Shape, output: Output) -> Result<()> {
    let Shape {
        minutes,
        cut_every,
        services,
    } = shape;
    let services_arg = services.to_string();
    let tokens: Vec<String> = SIDES
        .iter()
        .flat_map(|s| AGENTS.iter().map(move |a| format!("{a}-{}", s.tokens)))
        .collect();
    let mut args = vec![
        "--nodes",
        "2",
        "--pods-per-node",
        "30",
        "--services",
        &services_arg,
        "--configmaps",
        "20",
        "--hub-pki",
        "node-0",
        "--hub-pki",
        "node-1",
        "--bookmark-ms",
        "60000",
        "--bookmark-at-deadline",
    ];
    for t in &tokens {
        args.extend(["--reader-token", t.as_str()]);
    }
    let stack = Stack::start("bed", &args)?;
    let cloud = std::net::SocketAddr::from(([127, 0, 0, 1], stack.cloud_port));
    let relays = [
        Relay::start(hub_tests::ports::free_port(), cloud)?,
        Relay::start(hub_tests::ports::free_port(), cloud)?,
    ];
    // The hub's default components, and the operator's agent as its operator adds it.
    let components = [
        "kubelet",
        "kube-proxy",
        "flanneld",
        "coredns",
        "hub",
        "operator-agent",
    ];
    let (hub, via) =
        stack.start_node_hub("edge", SIDES[1].node, relays[1].addr.port(), &components);
    let bases = [format!("https://{}", relays[0].addr), via];
    let admin = stack.client(None)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let span = Duration::from_secs(minutes * 60);
    eprintln!(
        "bench edge: both sides for {minutes} min, the link cut every {cut_every} s for {CUT_SECONDS} s"
    );

    let outcome = rt.block_on(async {
        crate::bench_pool::reset_traffic(&admin, &stack.direct).await?;
        let before = relays.each_ref().map(Relay::carried);
        let stop = Arc::new(AtomicBool::new(false));
        let mut informers = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        let leases = [Arc::new(Leases::default()), Arc::new(Leases::default())];
        for (i, (side, base)) in SIDES.iter().zip(&bases).enumerate() {
            for informer in informers_of(&stack, side, base)? {
                let informer = Arc::new(informer);
                informers.push(informer.clone());
                let stop = stop.clone();
                tasks.spawn(async move { informer.run(&stop).await });
            }
            let kubelet = Client::new(stack.client(Some(side.node))?, base, None, "kubelet");
            let (stop, node, side_leases) = (stop.clone(), side.node, leases[i].clone());
            tasks.spawn(async move { renew_lease(kubelet, node, &stop, side_leases).await });
        }
        let cuts = cut_the_link(&relays, span, Duration::from_secs(cut_every));
        let churned = churn(&admin, &stack.direct, span, services);
        let warm = warmed_up(&admin, &stack.direct, &relays, &informers, span);
        let (cuts, churned, warm) = tokio::join!(cuts, churned, warm);
        let churned = churned?;
        eprintln!("bench edge: {cuts} cuts, the cloud made {churned} changes; settling");
        let views = settle(&admin, &stack.direct, &informers).await;
        let carried = relays.each_ref().map(Relay::carried);
        let traffic = crate::bench_pool::traffic_by_user(&admin, &stack.direct).await?;
        stop.store(true, Ordering::Relaxed);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        anyhow::Ok(Outcome {
            cuts,
            churned,
            views,
            carried: [0, 1].map(|i| carried[i].since(before[i])),
            warm: warm?.map(|w| Warm {
                carried: [0, 1].map(|i| carried[i].since(w.carried[i])),
                traffic: (traffic.iter())
                    .map(|(user, t)| {
                        let then = w.traffic.get(user).cloned().unwrap_or_default();
                        (user.clone(), t.since(&then))
                    })
                    .collect(),
                ..w
            }),
            traffic,
            informers,
            leases,
        })
    })?;
    let shared = hub.status()["node_watch_cache"].clone();
    drop(hub);
    report(&outcome, &shared, &shape, output)?;
    let unequal: Vec<&String> = outcome
        .views
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect();
    anyhow::ensure!(
        unequal.is_empty(),
        "bench edge: these views differ from the cloud's after {} s: {unequal:?}",
        SETTLE.as_secs()
    );
    Ok(())
}

struct Outcome {
    cuts: u64,
    churned: u64,
    /// Each informer's name and whether its view equalled the cloud's in the end.
    views: Vec<(String, bool)>,
    carried: [Carried; 2],
    traffic: BTreeMap<String, crate::bench_pool::UserTraffic>,
    /// The same counts from the moment every client had its first view on.
    warm: Option<Warm>,
    informers: Vec<Arc<Informer>>,
    leases: [Arc<Leases>; 2],
}

/// What the link carried from a moment on (or, as read then, up to it).
struct Warm {
    /// Seconds into the run.
    at: f64,
    carried: [Carried; 2],
    traffic: BTreeMap<String, crate::bench_pool::UserTraffic>,
}

/// Waits until every informer has had its first view (within `span`) and reads what the
/// link has carried by then; None if some informer never had one.
async fn warmed_up(
    admin: &Http,
    direct: &str,
    relays: &[Relay; 2],
    informers: &[Arc<Informer>],
    span: Duration,
) -> Result<Option<Warm>> {
    let started = Instant::now();
    while !informers
        .iter()
        .all(|i| i.stats.synced.load(Ordering::Relaxed))
    {
        if started.elapsed() > span {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let carried = relays.each_ref().map(Relay::carried);
    let traffic = crate::bench_pool::traffic_by_user(admin, direct).await?;
    let at = started.elapsed().as_secs_f64();
    eprintln!("bench edge: every client has its first view ({at:.1} s)");
    Ok(Some(Warm {
        at,
        carried,
        traffic,
    }))
}

/// The cloud's counts for one side: its node's identity and its agents' tokens.
fn side_traffic(
    traffic: &BTreeMap<String, crate::bench_pool::UserTraffic>,
    side: &Side,
) -> crate::bench_pool::UserTraffic {
    let mut sum = crate::bench_pool::UserTraffic::default();
    for (user, t) in traffic {
        let ours = *user == format!("system:node:{}", side.node)
            || AGENTS
                .iter()
                .any(|a| *user == format!("system:serviceaccount:kube-system:{a}-{}", side.tokens));
        if ours {
            sum.add(t);
        }
    }
    sum
}

/// `shared`: the hub's node-level watch cache, from its status.
fn report(o: &Outcome, shared: &serde_json::Value, shape: &Shape, output: Output) -> Result<()> {
    let Shape {
        minutes,
        cut_every,
        services,
    } = *shape;
    // Another cluster is another table: its figures are not runs of the same bench.
    let name = match services {
        SERVICES => "edge".to_string(),
        n => format!("edge-{n}-services"),
    };
    let mut report = Report::new(name, output);
    report.line(&format!(
        "bench edge: one node's kubelet 1.36, kube-proxy, CoreDNS, CNI agent and operator's agent for {minutes} min, the link cut {} times ({CUT_SECONDS} s, every {cut_every} s), {services} services with their EndpointSlices, the cloud changing {} times; both sides in the same run; release builds",
        o.cuts, o.churned
    ));
    let traffic = SIDES.each_ref().map(|s| side_traffic(&o.traffic, s));
    let row = |f: &dyn Fn(usize) -> f64| {
        SIDES
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.to_string(), f(i)))
            .collect::<Vec<_>>()
    };
    report.section("on the wire to the cloud (both directions, TLS included)");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    report.row(
        "bytes on the wire",
        "MiB",
        row(&|i| mib(o.carried[i].to_cloud + o.carried[i].from_cloud)),
        true,
    );
    report.row(
        "bytes from the cloud",
        "MiB",
        row(&|i| mib(o.carried[i].from_cloud)),
        true,
    );
    report.row(
        "bytes to the cloud",
        "MiB",
        row(&|i| mib(o.carried[i].to_cloud)),
        true,
    );
    report.row(
        "TCP connections",
        "connections",
        row(&|i| o.carried[i].connections as f64),
        true,
    );
    report.section("what the cloud was asked");
    report.row(
        "requests, all verbs",
        "requests",
        row(&|i| traffic[i].requests as f64),
        true,
    );
    report.row(
        "list requests",
        "requests",
        row(&|i| traffic[i].verb("list") as f64),
        true,
    );
    report.row(
        "relists (lists and watch-lists)",
        "requests",
        row(&|i| (traffic[i].verb("list") + traffic[i].watch_lists) as f64),
        true,
    );
    for verb in ["watch", "get", "update", "create", "health"] {
        report.row(
            &format!("requests: {verb}"),
            "requests",
            row(&|i| traffic[i].verb(verb) as f64),
            false,
        );
    }
    // The recurring cost: what came after each side's first lists, which a node pays once
    // per start.
    if let Some(w) = &o.warm {
        let after = SIDES.each_ref().map(|s| side_traffic(&w.traffic, s));
        report.section(&format!(
            "from every client's first view on ({:.1} s into the run)",
            w.at
        ));
        let wire = &w.carried;
        report.row(
            "bytes on the wire",
            "MiB",
            row(&|i| mib(wire[i].to_cloud + wire[i].from_cloud)),
            true,
        );
        report.row(
            "bytes from the cloud",
            "MiB",
            row(&|i| mib(wire[i].from_cloud)),
            true,
        );
        report.row(
            "requests, all verbs",
            "requests",
            row(&|i| after[i].requests as f64),
            true,
        );
        report.row(
            "list requests",
            "requests",
            row(&|i| after[i].verb("list") as f64),
            true,
        );
        report.row(
            "relists (lists and watch-lists)",
            "requests",
            row(&|i| (after[i].verb("list") + after[i].watch_lists) as f64),
            true,
        );
    }
    // Where the cloud's answers went, largest first (the rest is framing, TLS and headers).
    report.section("response bodies from the cloud, by what");
    let mut totals: BTreeMap<&String, u64> = BTreeMap::new();
    for (what, n) in traffic.iter().flat_map(|t| &t.bytes_by) {
        *totals.entry(what).or_default() += n;
    }
    let mut kinds: Vec<(&String, u64)> = totals.into_iter().collect();
    kinds.sort_by_key(|(_, total)| std::cmp::Reverse(*total));
    for (what, _) in kinds.iter().take(10) {
        report.row(
            what,
            "KiB",
            row(&|i| traffic[i].bytes_by.get(*what).copied().unwrap_or(0) as f64 / 1024.0),
            true,
        );
    }
    report.section("what the clients saw");
    let of_side = |i: usize, f: &dyn Fn(&Informer) -> u64| {
        o.informers
            .iter()
            .filter(|inf| inf.side == SIDES[i].name)
            .map(|inf| f(inf))
            .sum::<u64>() as f64
    };
    report.row(
        "relists the clients made",
        "relists",
        row(&|i| of_side(i, &|inf| inf.stats.relists.load(Ordering::Relaxed))),
        false,
    );
    report.row(
        "requests that failed the clients",
        "requests",
        row(&|i| of_side(i, &|inf| inf.stats.failures.load(Ordering::Relaxed))),
        false,
    );
    report.row(
        "lease renewals that failed",
        "renewals",
        row(&|i| o.leases[i].failed.load(Ordering::Relaxed) as f64),
        false,
    );
    for (i, s) in SIDES.iter().enumerate() {
        let renewed = o.leases[i].renewed.load(Ordering::Relaxed);
        report.line(&format!(
            "  {}: {}; {renewed} lease renewals",
            s.name,
            traffic[i].verbs_text()
        ));
    }
    let n = |k: &str| shared[k].as_u64().unwrap_or(0);
    report.line(&format!(
        "  the hub's watch cache: {} lists and {} watches served from its sets; {} checks sent as the client (one-item lists, watches of no object), {} reads passed to the cloud{}",
        n("lists_served"),
        n("watches_served"),
        n("checks"),
        n("passed_to_cloud"),
        match shared["last_passed"].as_str() {
            Some(why) if !why.is_empty() => format!(" (the latest: {why})"),
            _ => String::new(),
        }
    ));
    let equal = o.views.iter().filter(|(_, ok)| *ok).count();
    report.line(&format!(
        "  views equal to the cloud's at the end: {equal} of {}",
        o.views.len()
    ));
    report.finish()
}

/// Cuts both relays together every `every`, for `CUT_SECONDS`; returns how many cuts.
async fn cut_the_link(relays: &[Relay; 2], span: Duration, every: Duration) -> u64 {
    let started = Instant::now();
    let mut cuts = 0;
    loop {
        let next = every * (cuts as u32 + 1);
        if next + Duration::from_secs(CUT_SECONDS) >= span {
            tokio::time::sleep(span.saturating_sub(started.elapsed())).await;
            return cuts;
        }
        tokio::time::sleep(next.saturating_sub(started.elapsed())).await;
        eprintln!(
            "bench edge: the link is cut ({} s)",
            started.elapsed().as_secs()
        );
        relays.iter().for_each(Relay::silence);
        tokio::time::sleep(Duration::from_secs(CUT_SECONDS)).await;
        for r in relays {
            if let Err(e) = r.up() {
                eprintln!("bench edge: the link did not come back: {e:#}");
            }
        }
        cuts += 1;
    }
}

/// Waits until every informer's view equals the cloud's, up to `SETTLE`; returns each
/// informer's verdict.
async fn settle(admin: &Http, direct: &str, informers: &[Arc<Informer>]) -> Vec<(String, bool)> {
    let deadline = Instant::now() + SETTLE;
    let mut verdicts = Vec::new();
    for informer in informers {
        let name = format!(
            "{} {} {}",
            informer.side, informer.client.agent, informer.path
        );
        let equal = loop {
            let truth = informer.cloud_view(admin, direct).await;
            let same = truth
                .as_ref()
                .is_ok_and(|t| *t == informer.view.lock().unwrap().objects);
            if same || Instant::now() > deadline {
                if let Err(e) = &truth {
                    eprintln!("bench edge: {name}: the cloud's view: {e:#}");
                }
                break same;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        verdicts.push((name, equal));
    }
    verdicts
}

fn informers_of(stack: &Stack, side: &Side, base: &str) -> Result<Vec<Informer>> {
    let node = side.node;
    let kubelet = Client::new(stack.client(Some(node))?, base, None, "kubelet");
    let agent = |name: &'static str| -> Result<Client> {
        let token = format!("{name}-{}", side.tokens);
        Ok(Client::new(stack.client(None)?, base, Some(token), name))
    };
    let (proxy, dns, cni, operator) = (
        agent("kube-proxy")?,
        agent("coredns")?,
        agent("flanneld")?,
        agent("operator-agent")?,
    );
    let own_node = format!("/api/v1/nodes?fieldSelector=metadata.name%3D{node}");
    let watch_lists = [
        (
            &kubelet,
            format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
        ),
        (&kubelet, own_node.clone()),
        (
            &kubelet,
            "/api/v1/services?fieldSelector=spec.clusterIP%21%3DNone".into(),
        ),
        (&proxy, format!("/api/v1/services?{PROXY_SELECTOR}")),
        (
            &proxy,
            format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}"),
        ),
        (&proxy, own_node),
    ];
    let lists = [
        (&dns, "/api/v1/services"),
        (&dns, "/apis/discovery.k8s.io/v1/endpointslices"),
        (&dns, "/api/v1/namespaces"),
        (&cni, "/api/v1/nodes"),
        (&operator, "/api/v1/namespaces/default/configmaps"),
    ];
    let mut out = Vec::new();
    for (seed, (client, path)) in watch_lists.into_iter().enumerate() {
        out.push(Informer::new(
            side.name,
            client,
            path,
            Encoding::Protobuf,
            true,
            seed,
        ));
    }
    for (seed, (client, path)) in lists.into_iter().enumerate() {
        out.push(Informer::new(
            side.name,
            client,
            path.to_string(),
            Encoding::Json,
            false,
            100 + seed,
        ));
    }
    Ok(out)
}

/// The kubelet's lease renewals and how many failed.
#[derive(Default)]
struct Leases {
    renewed: AtomicU64,
    failed: AtomicU64,
}

/// The kubelet's node lease, renewed every 10 s (`PUT …?timeout=10s`).
async fn renew_lease(
    kubelet: Client,
    node: &str,
    stop: &AtomicBool,
    leases: Arc<Leases>,
) -> Result<()> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                     "renewTime": format!("2026-12-05T{:02}:{:02}:{:02}.000000Z", n / 360 % 24, n / 6 % 60, n % 6 * 10)},
        });
        let renew = format!("{path}?timeout=10s");
        let put = kubelet.send("PUT", &renew, PROTOBUF, Some(lease.to_string()));
        let ok = match tokio::time::timeout(Duration::from_secs(10), put).await {
            Ok(Ok(resp)) if resp.status() == StatusCode::NOT_FOUND => {
                let create = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
                let r = kubelet.send("POST", create, PROTOBUF, Some(lease.to_string()));
                matches!(tokio::time::timeout(Duration::from_secs(10), r).await, Ok(Ok(r)) if r.status().is_success())
            }
            Ok(Ok(resp)) => resp.status().is_success(),
            _ => false,
        };
        let counter = if ok { &leases.renewed } else { &leases.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        n += 1;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    Ok(())
}

/// The cloud's side of the run (by the admin, whose traffic is no node's): a pod of each
/// node every 10 s, an EndpointSlice every 30 s, a ConfigMap and a Node every minute, a
/// service replaced every 2 minutes. Returns how many changes it made.
async fn churn(admin: &Http, direct: &str, span: Duration, services: u64) -> Result<u64> {
    let started = Instant::now();
    let mut tick = 0u64;
    let mut changes = 0u64;
    let patch = |url: String, body: String| async move {
        crate::bench_pool::admin_call(admin, "PATCH", url, &body).await
    };
    while started.elapsed() + Duration::from_secs(10) < span {
        tokio::time::sleep(Duration::from_secs(10)).await;
        tick += 1;
        let mark = format!(r#"{{"metadata":{{"annotations":{{"churn":"{tick}"}}}}}}"#);
        for node in ["node-0", "node-1"] {
            let pod = format!(
                "{direct}/api/v1/namespaces/default/pods/pod-{}-{}",
                &node[5..],
                tick % 30
            );
            patch(pod, mark.clone()).await?;
            changes += 1;
        }
        if tick.is_multiple_of(3) {
            let slice = format!(
                "{direct}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/svc-{}-abc12",
                tick % services.clamp(1, 50)
            );
            patch(slice, mark.clone()).await?;
            changes += 1;
        }
        if tick.is_multiple_of(6) {
            let cm = format!(
                "{direct}/api/v1/namespaces/default/configmaps/cm-{}",
                tick % 20
            );
            patch(cm, mark.clone()).await?;
            let node = format!("{direct}/api/v1/nodes/node-{}", tick / 6 % 2);
            patch(node, mark.clone()).await?;
            changes += 2;
        }
        if tick.is_multiple_of(12) {
            replace_service(admin, direct, tick / 12).await?;
            changes += 2;
        }
    }
    Ok(changes)
}

/// Creates service `churn-N` and deletes `churn-(N-1)` (N counts from 1).
async fn replace_service(admin: &Http, direct: &str, n: u64) -> Result<()> {
    let services = format!("{direct}/api/v1/namespaces/default/services");
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("churn-{n}"), "namespace": "default"},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "selector": {"app": "churn"}},
    });
    crate::bench_pool::admin_call(admin, "POST", services.clone(), &service.to_string()).await?;
    if n > 1 {
        let gone = format!("{services}/churn-{}", n - 1);
        crate::bench_pool::admin_call(admin, "DELETE", gone, "").await?;
    }
    Ok(())
}
