//! `cargo xtask bench edge [--minutes N]`: what one node's clients cost the edge link over
//! N minutes (default 60), straight to the cloud and through the hub, in the same run — the
//! baseline for making that link cheaper.
//!
//! The node's clients, as shaped as the real ones: a kubelet (its pods by `spec.nodeName`
//! and its Node, list then watch, protobuf; its lease renewed every 10 s), a kube-proxy
//! (services and endpointslices, list then watch, protobuf) and a kubectl on the node (a
//! JSON list of the node's pods every minute), all with the node's credentials as on a
//! real node. Every watch ends after 5 minutes (`timeoutSeconds`) and is resumed from the
//! last resourceVersion it saw, as client-go's reflector does. Meanwhile the cloud changes
//! one of the node's pods every 10 s and an endpointslice every 30 s. The cloud counts, for
//! the node's identity, the requests by verb and the response bytes it sent.
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;

use crate::bench::{Http, Output, Report, Stack};

const NODE: &str = "node-0";
const WATCH_SECONDS: u64 = 300;
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

pub fn edge(minutes: u64, output: Output) -> Result<()> {
    let stack = Stack::start(
        "bed",
        &[
            "--nodes",
            "1",
            "--pods-per-node",
            "30",
            "--services",
            "20",
            "--hub-pki",
            NODE,
        ],
    )?;
    let admin = stack.client(None)?;
    let node = stack.client(Some(NODE))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let span = Duration::from_secs(minutes * 60);
    let mut runs = Vec::new();
    for name in ["direct", "through the hub"] {
        // The node's hub runs only for its side: its health probes are the node's too.
        let hub = (name != "direct").then(|| stack.start_hub("edge", NODE, ""));
        let base = hub
            .as_ref()
            .map_or_else(|| stack.direct.clone(), |(_, via)| via.clone());
        eprintln!("bench edge: {name}, {minutes} min");
        let traffic = rt.block_on(async {
            crate::bench_pool::reset_traffic(&admin, &stack.direct).await?;
            let clients = Clients {
                http: node.clone(),
                base,
            };
            let churn = churn(&admin, &stack.direct, span);
            let (_, _, _, _, _, _, churned) = tokio::try_join!(
                clients.list_and_watch(
                    "kubelet",
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
                    span
                ),
                clients.list_and_watch(
                    "kubelet",
                    "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-0",
                    span
                ),
                clients.renew_lease(span),
                clients.list_and_watch("kube-proxy", "/api/v1/services", span),
                clients.list_and_watch(
                    "kube-proxy",
                    "/apis/discovery.k8s.io/v1/endpointslices",
                    span
                ),
                clients.kubectl(span),
                churn,
            )?;
            eprintln!("bench edge: {name}: the cloud made {churned} changes");
            let by_user = crate::bench_pool::traffic_by_user(&admin, &stack.direct).await?;
            anyhow::Ok(
                by_user
                    .get(&format!("system:node:{NODE}"))
                    .cloned()
                    .unwrap_or_default(),
            )
        })?;
        runs.push((name, traffic));
        drop(hub);
    }

    let mut report = Report::new("edge", output);
    report.line(&format!(
        "bench edge: one node's kubelet-, kube-proxy- and kubectl-shaped clients for {minutes} min, watches resumed every {WATCH_SECONDS} s, the cloud changing a pod every 10 s and an endpointslice every 30 s; release builds"
    ));
    report.section("what the cloud sent and was asked, for the node's identity");
    let row = |f: &dyn Fn(&crate::bench_pool::UserTraffic) -> f64| {
        runs.iter()
            .map(|(name, t)| (name.to_string(), f(t)))
            .collect::<Vec<_>>()
    };
    report.row(
        "bytes the cloud sent",
        "KiB",
        row(&|t| t.bytes as f64 / 1024.0),
        true,
    );
    report.row(
        "requests, all verbs",
        "requests",
        row(&|t| t.requests as f64),
        true,
    );
    for verb in ["list", "watch", "get", "update", "create", "health"] {
        report.row(
            &format!("requests: {verb}"),
            "requests",
            row(&|t| t.verb(verb) as f64),
            false,
        );
    }
    for (name, t) in &runs {
        report.line(&format!("  {name}: {}", t.verbs_text()));
    }
    report.finish()
}

/// The node's clients, against `base` (the cloud or the hub).
struct Clients {
    http: Http,
    base: String,
}

impl Clients {
    async fn send(
        &self,
        method: &str,
        path: &str,
        user_agent: &str,
        accept: &str,
        body: Option<String>,
    ) -> Result<(hyper::StatusCode, Bytes)> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("User-Agent", format!("{user_agent}/v1.32.0"))
            .header("Accept", accept);
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let body = Full::new(Bytes::from(body.unwrap_or_default()))
            .map_err(|n| match n {})
            .boxed();
        let resp = self.http.request(req.body(body)?).await?;
        let status = resp.status();
        Ok((status, resp.into_body().collect().await?.to_bytes()))
    }

    /// A reflector: list, then watch from the list's resourceVersion; a watch that ends is
    /// resumed from the last resourceVersion seen, a refused one (410) lists again.
    async fn list_and_watch(&self, user_agent: &str, path: &str, span: Duration) -> Result<()> {
        let started = Instant::now();
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut rv = String::new();
        while started.elapsed() < span {
            if rv.is_empty() {
                let (status, body) = self.send("GET", path, user_agent, PROTOBUF, None).await?;
                anyhow::ensure!(status.is_success(), "list {path}: {status}");
                let u = hub::kproto::unwrap(&body)
                    .ok_or_else(|| anyhow::anyhow!("list {path}: not protobuf"))?;
                rv = hub::kproto::split_list(u.raw)
                    .ok_or_else(|| anyhow::anyhow!("list {path}: not a list"))?
                    .resource_version;
            }
            let left = span.saturating_sub(started.elapsed()).as_secs().max(1);
            let watch = format!(
                "{path}{sep}watch=true&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={}",
                left.min(WATCH_SECONDS)
            );
            let (status, body) = self.send("GET", &watch, user_agent, PROTOBUF, None).await?;
            anyhow::ensure!(status.is_success(), "watch {path}: {status}");
            let (frames, _) = hub::kproto::watch_frames(&body);
            for frame in frames {
                let Some(event) = hub::kproto::watch_event(frame) else {
                    continue;
                };
                if event.kind == "ERROR" {
                    rv.clear();
                    break;
                }
                let meta =
                    hub::kproto::unwrap(event.object).and_then(|u| hub::kproto::object_meta(u.raw));
                if let Some(m) = meta {
                    rv = m.resource_version;
                }
            }
        }
        Ok(())
    }

    /// The kubelet's node lease, renewed every 10 s.
    async fn renew_lease(&self, span: Duration) -> Result<()> {
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}");
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < span {
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": NODE, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                         "renewTime": format!("2026-12-05T00:{:02}:{:02}.000000Z", n / 6 % 60, n % 6 * 10)},
            });
            let (status, _) = self
                .send("PUT", &path, "kubelet", PROTOBUF, Some(lease.to_string()))
                .await?;
            if status == hyper::StatusCode::NOT_FOUND {
                let create = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
                self.send("POST", create, "kubelet", PROTOBUF, Some(lease.to_string()))
                    .await?;
            }
            n += 1;
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Ok(())
    }

    /// kubectl on the node: its pods, in JSON, once a minute.
    async fn kubectl(&self, span: Duration) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < span {
            let (status, _) = self
                .send(
                    "GET",
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
                    "kubectl",
                    "application/json",
                    None,
                )
                .await?;
            anyhow::ensure!(status.is_success(), "kubectl's list: {status}");
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok(())
    }
}

/// The cloud's side of the run: a pod of the node changed every 10 s, an endpointslice every
/// 30 s (by the admin, whose traffic is not the node's). Returns how many changes it made.
async fn churn(admin: &Http, direct: &str, span: Duration) -> Result<u64> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < span {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let pod = format!("{direct}/api/v1/namespaces/default/pods/pod-0-{}", n % 30);
        crate::bench_pool::admin_call(
            admin,
            "PATCH",
            pod,
            &format!(r#"{{"metadata":{{"annotations":{{"churn":"{n}"}}}}}}"#),
        )
        .await?;
        n += 1;
        if n.is_multiple_of(3) {
            crate::bench_pool::admin_call(
                admin,
                "PATCH",
                format!("{direct}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/svc-{}-abc12", n % 20),
                &format!(r#"{{"metadata":{{"labels":{{"churn":"{n}"}}}}}}"#),
            )
            .await?;
            n += 1;
        }
    }
    Ok(n)
}
