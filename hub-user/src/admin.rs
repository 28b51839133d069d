//! The admin port: `/healthz`, `/readyz`, `/v1/status` (JSON), `/v1/trace` (a stream, for
//! root on the node), and the client side used by `hub status`.
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

use crate::{
    cache::inspect,
    proxy::peer::{Peer, PodCgroups},
    state::{HubState, StatusReport},
};

/// An admin answer: whole, or a stream (`/v1/trace`).
type AdminBody = BoxBody<Bytes, Infallible>;

fn respond(code: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<AdminBody> {
    Response::builder()
        .status(code)
        .header("content-type", content_type)
        .body(Full::new(body.into()).boxed())
        .expect("static response parts are valid")
}

fn route(state: &HubState, req: &Request<Incoming>) -> Response<AdminBody> {
    match req.uri().path() {
        "/healthz" | "/livez" => respond(StatusCode::OK, "text/plain", "ok"),
        "/readyz" if state.is_ready() => respond(StatusCode::OK, "text/plain", "ok"),
        "/readyz" => {
            let why = state
                .serving_certificate()
                .map_or_else(|| "not ready".to_string(), |w| format!("not ready: {w}"));
            respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why)
        }
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics_text(),
        ),
        "/v1/status" => match serde_json::to_vec(&state.report()) {
            Ok(json) => respond(StatusCode::OK, "application/json", json),
            Err(e) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                e.to_string(),
            ),
        },
        // Cached objects (Secrets among them) are not on the TCP port: any local process
        // can reach that. `hub cache` asks the root-only inspection socket instead.
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found"),
    }
}

/// The inspection socket of a hub whose cache lives in `dir`: `hub cache` asks it while
/// the daemon runs (it holds the store's lock). Owner-only, in the owner-only cache dir.
pub fn inspect_socket(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("inspect.sock")
}

fn inspect_route(state: &HubState, req: &Request<Incoming>) -> Response<AdminBody> {
    match req.uri().path() {
        "/v1/cache/ls" | "/v1/cache/get" => cache_route(state, req),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found"),
    }
}

/// Serves cache inspection on the Unix socket at `path` (mode 0600) until `shutdown`.
pub async fn serve_inspect(
    path: std::path::PathBuf,
    state: Arc<HubState>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // A socket left by a hub that died: nothing listens on it any more.
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|stop| *stop) => {
                let _ = std::fs::remove_file(&path);
                return Ok(());
            }
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        spawn_http(stream, state.clone(), inspect_route);
    }
}

/// `hub cache ls|get` while the daemon runs (it holds the store's lock).
fn cache_route(state: &HubState, req: &Request<Incoming>) -> Response<AdminBody> {
    let Some(cache) = state.cache() else {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "the cache is turned off",
        );
    };
    let q = req.uri().query().unwrap_or("");
    let param = |n: &str| crate::proxy::request::query_param(q, n).filter(|v| !v.is_empty());
    let component = param("component");
    let json = if req.uri().path() == "/v1/cache/ls" {
        inspect::list(
            cache.store(),
            component.as_deref(),
            param("resource").as_deref(),
        )
        .map_err(|e| e.to_string())
        .and_then(|l| serde_json::to_vec(&l).map_err(|e| e.to_string()))
    } else {
        let key = param("key").unwrap_or_default();
        match inspect::get(cache.store(), &key, component.as_deref()) {
            Ok(Some(o)) => serde_json::to_vec(&o).map_err(|e| e.to_string()),
            Ok(None) => {
                return respond(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    format!("{key} is not cached"),
                );
            }
            Err(e) => Err(e),
        }
    };
    match json {
        Ok(j) => respond(StatusCode::OK, "application/json", j),
        Err(e) => respond(StatusCode::BAD_REQUEST, "text/plain", e),
    }
}

/// Serves the admin endpoints until `shutdown` turns true; a pod calling from its cgroup
/// is refused (it has no business with the node agent's status), and only root on the
/// node may trace (the trace names every process that reaches for the apiserver).
pub async fn serve(
    listener: TcpListener,
    state: Arc<HubState>,
    pods: PodCgroups,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (state, pods) = (state.clone(), pods.clone());
        tokio::spawn(async move {
            let caller = match stream.local_addr() {
                Ok(local) => tokio::task::spawn_blocking(move || Peer::of(local, peer, &pods))
                    .await
                    .unwrap_or(Peer::Pod),
                Err(_) => Peer::Pod,
            };
            let route = match caller {
                Peer::Pod => refused,
                p if p.is_node_root() => route_or_trace,
                _ => route,
            };
            spawn_http(stream, state, route);
        });
    }
}

fn refused(_: &HubState, _: &Request<Incoming>) -> Response<AdminBody> {
    respond(
        StatusCode::FORBIDDEN,
        "text/plain",
        "hub: the admin port does not answer pods\n",
    )
}

/// Root on the node: everything, and `/v1/trace`.
fn route_or_trace(state: &HubState, req: &Request<Incoming>) -> Response<AdminBody> {
    if req.uri().path() != "/v1/trace" {
        return route(state, req);
    }
    let Some(tracer) = state.tracer() else {
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "hub: interception is not attached, so there is nothing to trace\n",
        );
    };
    let logs = crate::proxy::request::query_param(req.uri().query().unwrap_or(""), "logs")
        .is_some_and(|v| v == "1" || v == "true");
    Response::builder()
        .header("content-type", "application/jsonl")
        .body(trace_stream(tracer, logs))
        .expect("static response parts are valid")
}

/// Trace lines as JSON, one per line, until the caller hangs up.
fn trace_stream(tracer: &Arc<crate::intercept::trace::Tracer>, logs: bool) -> AdminBody {
    use crate::intercept::trace::TraceLine;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let mut lines = tracer.subscribe();
    tokio::spawn(async move {
        loop {
            let line = tokio::select! {
                line = lines.next() => line,
                () = tx.closed() => return,
            };
            let Some(line) = line else { return };
            if !logs && matches!(*line, TraceLine::Log { .. }) {
                continue;
            }
            let mut json = serde_json::to_vec(&*line).expect("trace lines serialise");
            json.push(b'\n');
            if tx.send(Bytes::from(json)).await.is_err() {
                return;
            }
        }
    });
    LineStream(rx).boxed()
}

/// A body fed line by line from a channel; it ends when the sender goes.
struct LineStream(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for LineStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|l| Ok(hyper::body::Frame::data(l))))
    }
}

/// Serves one HTTP/1.1 connection with `route` in a task of its own.
fn spawn_http<S>(
    stream: S,
    state: Arc<HubState>,
    route: fn(&HubState, &Request<Incoming>) -> Response<AdminBody>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |req| {
            let resp = route(&state, &req);
            async move { Ok::<_, Infallible>(resp) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(TokioIo::new(stream), service);
        let _ = conn.await;
    });
}

#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    #[error("cannot reach the hub {what} {at}: {source} (is `hub run` running?)")]
    Connect {
        what: &'static str,
        at: String,
        source: std::io::Error,
    },
    #[error("bad answer from {at}: {reason}")]
    Answer { at: String, reason: String },
}

/// Fetches `/v1/status` from a running hub.
pub async fn fetch_status(addr: SocketAddr) -> Result<StatusReport, AdminClientError> {
    let body = fetch(addr, "/v1/status").await?;
    serde_json::from_slice(&body).map_err(|e| AdminClientError::Answer {
        at: addr.to_string(),
        reason: e.to_string(),
    })
}

/// GETs `path_and_query` from a running hub's admin port; the body of a 200 answer.
pub async fn fetch(addr: SocketAddr, path_and_query: &str) -> Result<Vec<u8>, AdminClientError> {
    let at = addr.to_string();
    let stream = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)).await;
    let stream = connected("admin port", &at, stream)?;
    get_over(stream, &at, path_and_query).await
}

/// GETs `path_and_query` from a running hub's inspection socket.
pub async fn fetch_inspect(
    socket: &std::path::Path,
    path_and_query: &str,
) -> Result<Vec<u8>, AdminClientError> {
    let at = socket.display().to_string();
    let stream = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::UnixStream::connect(socket),
    )
    .await;
    let stream = connected("inspection socket", &at, stream)?;
    get_over(stream, "localhost", path_and_query).await
}

fn connected<S>(
    what: &'static str,
    at: &str,
    attempt: Result<std::io::Result<S>, tokio::time::error::Elapsed>,
) -> Result<S, AdminClientError> {
    let connect_err = |source| AdminClientError::Connect {
        what,
        at: at.to_string(),
        source,
    };
    attempt
        .map_err(|_| connect_err(std::io::ErrorKind::TimedOut.into()))?
        .map_err(connect_err)
}

/// One HTTP/1.1 GET over `stream`; the body of a 200 answer.
async fn get_over<S>(
    mut stream: S,
    host: &str,
    path_and_query: &str,
) -> Result<Vec<u8>, AdminClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let answer_err = |reason: String| AdminClientError::Answer {
        at: host.to_string(),
        reason,
    };
    let request =
        format!("GET {path_and_query} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| answer_err(e.to_string()))?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| answer_err("timed out".into()))?
        .map_err(|e| answer_err(e.to_string()))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| answer_err("no HTTP header end".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = raw[split + 4..].to_vec();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(answer_err(format!(
            "{}: {}",
            head.lines().next().unwrap_or_default(),
            String::from_utf8_lossy(&body).trim()
        )));
    }
    Ok(body)
}

/// Human-readable form for `hub status`.
pub fn render(s: &StatusReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let intercept = match &s.intercept {
        crate::state::InterceptState::Unavailable(why) => format!("unavailable: {why}"),
        other => format!("{other:?}").to_lowercase(),
    };
    let _ = writeln!(
        out,
        "node:         {} (hub {}, pid {})",
        s.node_name, s.version, s.pid
    );
    let _ = writeln!(out, "ready:        {}", if s.ready { "yes" } else { "no" });
    if let Some(pending) = &s.serving_certificate {
        let _ = writeln!(out, "serving cert: {pending}");
    }
    for line in &s.node_layout {
        let _ = writeln!(out, "found:        {line}");
    }
    let _ = writeln!(
        out,
        "interception: {intercept} (eBPF object {})",
        s.ebpf_object
    );
    if let Some(b) = &s.bypass {
        let now = match (b.now, &b.error) {
            (Some(n), _) => n.to_string(),
            (None, Some(e)) => format!("unknown ({e})"),
            (None, None) => "unknown".into(),
        };
        let _ = writeln!(
            out,
            "bypassing:    {now} connections to VIPs not through the hub ({} ended at start)",
            b.ended_at_start
        );
    }
    let _ = writeln!(out, "data path:    {:?}", s.data_path);
    for v in &s.vips {
        let _ = writeln!(out, "  vip {} -> {}", v.vip, v.listener);
    }
    let healthy = s.cloud.iter().filter(|c| c.healthy).count();
    let _ = writeln!(
        out,
        "cloud:        {healthy}/{} servers healthy",
        s.cloud.len()
    );
    for c in &s.cloud {
        let why = if c.healthy || c.last_error.is_empty() {
            String::new()
        } else {
            format!(" ({})", c.last_error)
        };
        let state = if c.healthy { "healthy" } else { "UNHEALTHY" };
        let _ = writeln!(out, "  {} {state}{why}", c.server);
    }
    match &s.cache {
        Some(c) => {
            let _ = writeln!(
                out,
                "cache:        {} entries ({} bytes on disk), {} written, {} stale skipped ({} by a metadata scan alone), {} deleted, {} rejected, {} write errors, {} pending ({} bytes; streams waited for the writer {} times)",
                c.entries,
                c.file_bytes,
                c.written,
                c.stale,
                c.scanned_only,
                c.deleted,
                c.rejected,
                c.write_errors,
                c.pending,
                c.pending_bytes,
                c.writer_waits
            );
            if c.offline_accepted + c.queued > 0 {
                let _ = writeln!(
                    out,
                    "  offline writes: {} accepted, {} queued, {} replayed, {} superseded by newer ones, {} not replayable, {} events expired",
                    c.offline_accepted,
                    c.queued,
                    c.replayed,
                    c.superseded,
                    c.replay_dropped,
                    c.expired
                );
            }
            if let Some(e) = &c.last_error {
                let _ = writeln!(out, "  last cache error: {e}");
            }
        }
        None => {
            let _ = writeln!(out, "cache:        off");
        }
    }
    if let Some(w) = &s.node_watch_cache {
        let _ = writeln!(
            out,
            "watch cache:  {} lists, {} GETs and {} watches answered from the node's shared sets, {} checks sent to the cloud, {} reads left to the cloud, {} credential scopes allowed",
            w.lists_served,
            w.gets_served,
            w.watches_served,
            w.checks,
            w.passed_to_cloud,
            w.credentials_allowed
        );
        if !w.last_passed.is_empty() {
            let _ = writeln!(
                out,
                "  the latest read left to the cloud: {}",
                w.last_passed
            );
        }
        for set in &w.sets {
            let _ = writeln!(
                out,
                "  {}: {}, {} objects at resourceVersion {}, listed {} times, {} events applied",
                set.gvr, set.state, set.objects, set.resource_version, set.lists, set.events
            );
        }
    }
    match &s.coordinator {
        Some(c) => {
            let _ = writeln!(
                out,
                "coordinator:  pool {} reads {}, pushes {} ({}), epoch {}, {} full pushes, {} sets / {} objects pushed, {} older than the pool's dropped, {} converted to protobuf, {} stored as JSON{}{}",
                c.pool,
                if c.healthy { "healthy" } else { "UNHEALTHY" },
                if c.pushes_healthy {
                    "healthy"
                } else {
                    "FAILING"
                },
                c.endpoints.join(","),
                c.epoch,
                c.full_pushes,
                c.lists_pushed,
                c.objects_written,
                c.stale_dropped,
                c.converted_for_storage,
                c.stored_as_json,
                c.last_error
                    .as_ref()
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default(),
                c.last_push_error
                    .as_ref()
                    .filter(|_| !c.pushes_healthy)
                    .map(|e| format!(" (last push error: {e})"))
                    .unwrap_or_default()
            );
            if !c.members_down.is_empty() {
                let _ = writeln!(
                    out,
                    "              members not answering: {}",
                    c.members_down.join(", ")
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "coordinator:  none (no poolName / coordinator.endpoints)"
            );
        }
    }
    let role = match &s.coordinator {
        Some(c) if !c.role.is_empty() => format!(
            "{} (pool leader: {})",
            c.role,
            if c.leader.is_empty() {
                "none"
            } else {
                &c.leader
            }
        ),
        Some(_) => "not yet elected".to_string(),
        None => "none (no pool)".to_string(),
    };
    let _ = writeln!(out, "role:         {role}");
    if let Some(c) = s.coordinator.as_ref().filter(|c| c.role == "leader") {
        let _ = writeln!(
            out,
            "  as leader:  {} pool-scope lists, {} events synced ({} stale); {} sweeps removed {} objects and {} departed hubs' records",
            c.leader_lists,
            c.leader_events,
            c.leader_stale,
            c.gc.sweeps,
            c.gc.removed,
            c.gc.nodes_removed
        );
    }
    for (route, c) in &s.routes {
        let _ = writeln!(
            out,
            "route {route:<12} {} requests, {} 5xx",
            c.requests, c.server_errors
        );
    }
    let _ = writeln!(
        out,
        "streams:      {} open, {} tasks",
        s.open_streams, s.tasks
    );
    if !s.last_errors.is_empty() {
        let _ = writeln!(out, "last errors:");
        let now = crate::certs::now_unix();
        for (at, what) in s.last_errors.iter().rev().take(5) {
            let _ = writeln!(out, "  {}s ago  {what}", now.saturating_sub(*at));
        }
    }
    let c = &s.connections;
    let _ = writeln!(
        out,
        "connections:  {} accepted, {} active, origin known {} / unknown {}, upstream failures {}",
        c.accepted, c.active, c.origin_known, c.origin_unknown, c.upstream_failed
    );
    // Only the relay data path counts raw bytes (the proxy counts requests by route).
    if c.bytes_to_cloud + c.bytes_from_cloud > 0 {
        let _ = writeln!(
            out,
            "relayed:      {} bytes to cloud, {} from cloud",
            c.bytes_to_cloud, c.bytes_from_cloud
        );
    }
    out
}
