//! The L7 proxy: terminates TLS (or plain HTTP on the explicit listener), works out who is
//! calling, routes each request by the decision table, forwards to the cloud with the
//! right identity and streams the answer back, or answers from the pool coordinator or the
//! local cache; what none can answer truthfully gets a clear 503 Status.
mod backends;
pub mod clean_end;
mod coalesce;
pub mod forward;
pub mod peer;
pub mod request;
pub mod serving;
pub mod warnings;

pub use backends::{Asked, Refusal};

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch};
use tracing::Instrument;

use self::{
    backends::{Backend, CacheBackend, CloudBackend, CoordinatorBackend},
    forward::{ForwardError, status},
    request::{RequestInfo, component},
};
use crate::{
    body::{BodyError, ProxyBody},
    cache::{self, Cache, offline},
    coordinator::pool::Pool,
    intercept::{ConnOrigin, OriginLookup},
    metrics::{LatencyLabels, RequestLabels},
    route::{self, Route},
    shared::Shared,
    state::{ConnRecord, HubState},
    upstream::{Cloud, cloud::AsWho},
};

/// How long a client gets to finish the TLS handshake and send its request headers
/// (slowloris clients are cut off after this).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted (kube-apiserver's is larger, but no API client needs it).
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Which listener a connection arrived on.
#[derive(Debug, Clone, Copy)]
pub enum Listener {
    /// listen.proxy: plain HTTP for explicitly configured local clients.
    Plain,
    /// listen.tlsProxy.
    Tls,
    /// An intercepted VIP's listener.
    Vip(SocketAddr),
}

/// What is known about one client connection.
#[derive(Debug)]
struct Conn {
    id: u64,
    listener: Listener,
    /// (CN, O...) of a client certificate verified against tls.clientCaFile.
    cert: Option<(String, Vec<String>)>,
    /// The client's cgroup, when interception recorded where the connection came from.
    cgroup_id: u64,
    /// Who is calling, for a connection that did not come through a VIP redirect.
    peer: Option<peer::Peer>,
    /// (component, cache component key) of the last User-Agent seen.
    component: Memo<Option<HeaderValue>, (&'static str, String)>,
    /// The cache credential of the last Authorization header seen.
    credential: Memo<Option<HeaderValue>, String>,
}

/// The last value worked out from a header on one connection. A client sends the same
/// User-Agent and token on every request, so a SHA-256 and some string work are done once
/// per connection instead of once per request.
#[derive(Debug, Default)]
struct Memo<K, V>(std::sync::Mutex<Option<(K, V)>>);

impl<K: PartialEq + Clone, V: Clone> Memo<K, V> {
    fn get(&self, key: &K, work_out: impl FnOnce() -> V) -> V {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, v)) = &*last
            && k == key
        {
            return v.clone();
        }
        let v = work_out();
        *last = Some((key.clone(), v.clone()));
        v
    }
}

pub struct Proxy {
    pub node_name: String,
    pub cloud: Arc<Cloud>,
    pub state: Arc<HubState>,
    pub pool_scope: Vec<String>,
    pub origins: Option<Arc<dyn OriginLookup>>,
    /// Where the pods' cgroups are, to tell a pod calling the hub's own ports.
    pub pods: peer::PodCgroups,
    pub cache: Option<Arc<Cache>>,
    pub pool: Option<Arc<Pool>>,
    /// The node-level watch cache, when shared resources are configured.
    pub shared: Option<Arc<Shared>>,
}

impl Proxy {
    /// Accepts on `listener` until `stop`; with `tls` set, connections are TLS.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
        kind: Listener,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut next_id = 0u64;
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Ok((tcp, peer)) = accepted else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            next_id += 1;
            let _ = tcp.set_nodelay(true);
            let (origin, record) = self.origin(kind, &tcp, peer);
            let span = tracing::debug_span!("conn", id = next_id, %peer, orig_dst = ?origin.map(|o| o.original_dst));
            let accepted = Accepted {
                tcp,
                peer,
                id: next_id,
                kind,
                origin,
            };
            let connection = self.clone().connection(accepted, record, tls.clone());
            tokio::spawn(connection.instrument(span));
        }
    }

    /// Where an intercepted connection was headed and who opened it (from the eBPF
    /// programs' records), and the record `hub status` lists while it is open.
    fn origin(
        &self,
        kind: Listener,
        tcp: &tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> (Option<ConnOrigin>, Option<ConnRecord>) {
        let Listener::Vip(vip) = kind else {
            return (None, None);
        };
        self.state.metrics.intercepted.inc();
        let local = tcp.local_addr().unwrap_or(peer);
        let origin = self.origins.as_ref().and_then(|o| o.lookup(peer, local));
        (origin, Some(ConnRecord::intercepted(peer, vip, origin)))
    }

    /// One accepted connection: who is at the other end, the TLS handshake, then HTTP.
    async fn connection(
        self: Arc<Self>,
        accepted: Accepted,
        record: Option<ConnRecord>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) {
        let Accepted {
            tcp,
            peer,
            id,
            kind,
            origin,
        } = accepted;
        // Intercepted connections are listed (with their origin) while open.
        let state = self.state.clone();
        let _open = record.as_ref().map(|r| state.connection_opened(r));
        // A connection the eBPF programs redirected carries its origin; any other is
        // looked up (off the runtime: it walks the pods' cgroups).
        let peer_of = match (origin, tcp.local_addr()) {
            (None, Ok(local)) => {
                let pods = self.pods.clone();
                tokio::task::spawn_blocking(move || peer::Peer::of(local, peer, &pods))
                    .await
                    .ok()
            }
            (None, Err(_)) => Some(peer::Peer::Elsewhere),
            (Some(_), _) => None,
        };
        let conn = Conn {
            id,
            listener: kind,
            cert: None,
            cgroup_id: origin.map_or(0, |o| o.cgroup_id),
            peer: peer_of,
            component: Memo::default(),
            credential: Memo::default(),
        };
        let Some(acceptor) = tls else {
            return self.serve_http(TokioIo::new(tcp), conn).await;
        };
        let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
        else {
            tracing::debug!("TLS handshake failed or timed out");
            return;
        };
        let cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| crate::x509::subject_cn_and_orgs(c));
        self.serve_http(TokioIo::new(stream), Conn { cert, ..conn })
            .await;
    }

    async fn serve_http<I>(self: Arc<Self>, io: I, conn: Conn)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let conn = Arc::new(conn);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (me, conn) = (self.clone(), conn.clone());
            let protobuf_first = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .and_then(|a| a.split(',').next())
                .is_some_and(|first| {
                    first
                        .trim()
                        .starts_with("application/vnd.kubernetes.protobuf")
                });
            async move {
                let resp = me.handle(req, &conn).await;
                Ok::<_, std::convert::Infallible>(forward::in_clients_encoding(
                    resp,
                    protobuf_first,
                ))
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HANDSHAKE_TIMEOUT)
            .max_buf_size(MAX_HEADER_BYTES);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(MAX_HEADER_BYTES as u32);
        let _ = builder.serve_connection_with_upgrades(io, service).await;
    }

    /// Who the hub speaks as towards the cloud, or the refusal to send: 401 for a client
    /// certificate that is not this node's, 403 for a plain-listener caller that may not
    /// speak as the node. As kube-apiserver does, a client certificate counts before a
    /// bearer token; only `CN=system:node:<nodeName>, O=system:nodes` is the node.
    fn identity(
        &self,
        req: &Request<Incoming>,
        conn: &Conn,
    ) -> Result<AsWho, Box<Response<ProxyBody>>> {
        let unauthorized = |why: String| {
            Box::new(status(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                &format!("hub: {why}"),
            ))
        };
        if let Some((cn, orgs)) = &conn.cert {
            let node = format!("system:node:{}", self.node_name);
            return if *cn != node {
                Err(unauthorized(format!(
                    "client certificate {cn:?} is not this node's identity ({node})"
                )))
            } else if !orgs.iter().any(|o| o == "system:nodes") {
                Err(unauthorized(format!(
                    "client certificate {cn:?} lacks O=system:nodes: it is not a node credential"
                )))
            } else {
                Ok(AsWho::Node)
            };
        }
        if req.headers().contains_key(header::AUTHORIZATION) {
            return Ok(AsWho::Caller);
        }
        // The plain listener speaks as the node, as YurtHub's 10261 does, but only for
        // root on the node outside the pods' cgroups; anyone else without credentials on
        // the other listeners stays anonymous.
        match (conn.listener, conn.peer) {
            (Listener::Plain, Some(p)) if p.is_node_root() => Ok(AsWho::Node),
            (Listener::Plain, p) => Err(Box::new(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "hub: the plain listener speaks as the node only for root on the node, outside the pods' cgroups; this is {}",
                    p.map_or("a redirected pod connection".to_string(), |p| p.to_string())
                ),
            ))),
            _ => Ok(AsWho::Caller),
        }
    }

    /// A pod reaches the hub only through an apiserver VIP; on any of the hub's own ports
    /// it is refused.
    fn refuse_pods(&self, conn: &Conn) -> Option<Response<ProxyBody>> {
        (conn.peer == Some(peer::Peer::Pod)).then(|| {
            status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "hub: a pod reaches the hub only through the apiserver address (a VIP), not on the hub's own ports",
            )
        })
    }

    /// Routes and answers one request. The branches' futures are boxed: hyper moves this
    /// future into a task of its own per request, and unboxed it was 5.6 KiB to copy.
    async fn handle(self: &Arc<Self>, req: Request<Incoming>, conn: &Conn) -> Response<ProxyBody> {
        let started = Instant::now();
        let info = RequestInfo::parse(
            req.method(),
            req.uri().path(),
            req.uri().query().unwrap_or(""),
        );
        let user_agent = req.headers().get(header::USER_AGENT);
        let (component, component_name) = conn.component.get(&user_agent.cloned(), || {
            let ua = user_agent.and_then(|v| v.to_str().ok()).unwrap_or("");
            (component(ua), cache::component_key(ua, conn.cgroup_id))
        });
        let who = match self
            .refuse_pods(conn)
            .map_or_else(|| self.identity(&req, conn), |r| Err(Box::new(r)))
        {
            Ok(w) => w,
            Err(resp) => {
                self.record(Route::Cloud, &info, component, resp.status(), started);
                return *resp;
            }
        };
        tracing::debug!(
            conn = conn.id,
            verb = info.verb,
            path = req.uri().path(),
            ?who,
            "request"
        );
        if let Some(cache) = &self.cache
            && who == AsWho::Node
            && offline::replayable(&info)
        {
            let queued =
                self.write_or_queue(cache, req, &info, component, &component_name, started);
            let mut resp = Box::pin(queued).await;
            let node = || cache::credential(None, true);
            let warnings = &self.state.metrics.warnings;
            warnings.limit(resp.headers_mut(), node, &component_name);
            return resp;
        }
        // Kept for the cache: the request itself goes to the cloud. The credential (a
        // SHA-256 of the token) is worked out only if the cache needs it. A request that
        // impersonates is authorized by the cloud as another user: its credential names
        // whom it acts as too, so what it is served is never served to the token alone.
        let authorization = req.headers().get(header::AUTHORIZATION).cloned();
        let impersonating = request::impersonation(req.headers());
        let credential = std::sync::LazyLock::new(|| {
            if who == AsWho::Node {
                return cache::credential(None, true);
            }
            if let Some(acting_as) = &impersonating {
                let token = authorization.as_ref().map_or(&[][..], |v| v.as_bytes());
                let keyed = [token, b"\0", acting_as.as_bytes()].concat();
                return cache::credential(Some(&keyed), false);
            }
            conn.credential.get(&authorization, || {
                cache::credential(authorization.as_ref().map(|v| v.as_bytes()), false)
            })
        });
        let query = req.uri().query().unwrap_or("").to_string();
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let delivery = Delivery {
            streaming: info.verb == "watch"
                || info.verb == "connect"
                || query.contains("follow=true"),
            // The hub's own answers are gzipped by the cloud's rule (the cloud's pass as sent).
            accepts_gzip: crate::gzip::accepts_gzip(req.headers().get(header::ACCEPT_ENCODING)),
            component_name: &component_name,
        };
        let path = req.uri().path().to_string();
        let asked = Asked {
            info: &info,
            path: &path,
            query: &query,
            accept: &accept,
            who,
            credential: &|| credential.to_string(),
            inputs: self.route_inputs(&info),
            request: std::sync::Mutex::new(Some(req)),
        };
        let (route, mut resp) = self.answer(&asked, &delivery).await;
        self.record(route, &info, component, resp.status(), started);
        let warnings = &self.state.metrics.warnings;
        warnings.limit(
            resp.headers_mut(),
            || credential.to_string(),
            &component_name,
        );
        resp
    }

    /// Tries the planned routes in order; the first answer goes out, or a 503 naming why
    /// each route could not answer. Returns the route that answered (or the last tried).
    async fn answer(
        &self,
        asked: &Asked<'_>,
        delivery: &Delivery<'_>,
    ) -> (Route, Response<ProxyBody>) {
        let mut why = Vec::new();
        let plan = route::plan(asked.inputs);
        for &route in &plan {
            let cloud = &self.cloud;
            if route == Route::Cloud
                && let Some(shared) = self.shared_for(asked)
            {
                match shared.serve(asked).await {
                    Ok(resp) => {
                        let route = Route::NodeWatchCache;
                        return (route, self.deliver(route, resp, asked, delivery).await);
                    }
                    Err(Refusal::Final(resp)) => return (Route::Cloud, resp),
                    Err(Refusal::Unable(why)) => {
                        tracing::debug!(path = asked.path, "node-level watch cache: {why}");
                    }
                }
            }
            let answer = match route {
                Route::Cloud => {
                    let answer = CloudBackend(cloud).serve(asked).await;
                    if let (Some(shared), Ok(resp)) = (&self.shared, &answer) {
                        shared.learn(asked, resp.status());
                    }
                    answer
                }
                Route::LocalCache => {
                    let cache = self.cache.as_deref();
                    CacheBackend { cache, cloud }.serve(asked).await
                }
                Route::Coordinator => {
                    let pool = self.pool.as_ref();
                    CoordinatorBackend { pool, cloud }.serve(asked).await
                }
                // Never planned: it answers in the cloud's stead, above.
                Route::NodeWatchCache => Err("not a planned route".to_string().into()),
            };
            match answer {
                Ok(resp) => return (route, self.deliver(route, resp, asked, delivery).await),
                Err(Refusal::Final(resp)) => return (route, resp),
                Err(Refusal::Unable(reason)) => why.push(format!("{}: {reason}", route.as_str())),
            }
        }
        let last = plan.last().copied().unwrap_or(Route::Cloud);
        (last, self.unavailable(asked.info, asked.inputs, why))
    }

    /// The node-level watch cache, if it may answer this request: a shared resource's
    /// collection read while the cloud is up, and not one the pool's leader shares
    /// through the coordinator.
    fn shared_for(&self, asked: &Asked<'_>) -> Option<&Arc<Shared>> {
        let i = asked.inputs;
        let pool_shares_it = self.pool.is_some() && i.pool_scope;
        self.shared.as_ref().filter(|s| {
            i.cloud_healthy && !i.cloud_unknown && !pool_shares_it && s.covers(asked.info)
        })
    }

    /// What the router needs to know about the hub's state for this request.
    fn route_inputs(&self, info: &RequestInfo) -> route::Inputs {
        route::Inputs {
            cloud_healthy: self.cloud.healthy(),
            cloud_unknown: !self.cloud.health_known(),
            coordinator_healthy: self.pool.as_ref().is_some_and(|p| p.healthy()),
            // Without a pool, this hub reads everything from the cloud itself.
            leader: self.pool.as_ref().is_none_or(|p| p.is_leader()),
            pool_scope: info.is_resource && self.pool_scope.iter().any(|g| info.gvr_is(g)),
            cloud_only: !info.is_read(),
        }
    }

    /// An answer on its way to the client: what the cloud and the coordinator gave is
    /// copied into the cache; the hub's own answers are gzipped by the cloud's rule; a
    /// stream is counted while it is open.
    async fn deliver(
        &self,
        route: Route,
        resp: Response<ProxyBody>,
        asked: &Asked<'_>,
        how: &Delivery<'_>,
    ) -> Response<ProxyBody> {
        let resp = match (&self.cache, route) {
            (Some(c), Route::Cloud | Route::Coordinator | Route::NodeWatchCache) => c.tee(
                resp,
                asked.info,
                asked.path,
                asked.query,
                asked.credential,
                how.component_name,
            ),
            _ => resp,
        };
        if how.streaming {
            self.counted(resp)
        } else if route == Route::Cloud {
            resp
        } else {
            crate::gzip::for_client(resp, how.accepts_gzip).await
        }
    }

    /// No route could answer: a 503 naming why each could not.
    fn unavailable(
        &self,
        info: &RequestInfo,
        inputs: route::Inputs,
        mut why: Vec<String>,
    ) -> Response<ProxyBody> {
        if !self.cloud.healthy() && why.iter().all(|w| !w.starts_with("cloud")) {
            why.insert(
                0,
                "cloud: unreachable (no server passes its health probe)".into(),
            );
        }
        // Only the cloud can answer writes, exec, logs: say plainly that the node is
        // offline rather than pretend (YurtHub answered offline creates with a fake 201).
        let offline = if inputs.cloud_only {
            " (the node is offline from the cloud: only the cloud can answer this; retry when it is back)"
        } else {
            ""
        };
        let why = why.join("; ");
        self.state
            .error(format!("{} {}: {why}", info.verb, uri_path(info)));
        status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            &format!(
                "hub: cannot serve {} {}{offline}: {why}",
                info.verb,
                uri_path(info)
            ),
        )
    }

    async fn write_or_queue(
        &self,
        cache: &Arc<Cache>,
        req: Request<Incoming>,
        info: &RequestInfo,
        component: &'static str,
        component_name: &str,
        started: Instant,
    ) -> Response<ProxyBody> {
        let (parts, body) = req.into_parts();
        let body = match forward::buffered_body(body).await {
            Ok(b) => b,
            Err(e) => {
                let resp = match e {
                    ForwardError::TooLarge => too_large(),
                    e => status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
                };
                self.record(Route::Cloud, info, component, resp.status(), started);
                return resp;
            }
        };
        // Queued writes go first: a write the queue takes waits behind them even once the
        // cloud is back (token requests and registrations are never queued) — but a new
        // lease renewal or node status goes straight to the cloud, and once the cloud
        // took it the queued ones of its object are pointless: dropped, so the client's
        // own write never races a replay of an older one.
        let mut behind_replay = cache.replay_pending() && offline::queued_when_offline(info);
        let supersedes = behind_replay && offline::supersedable(info) && self.cloud.healthy();
        if supersedes {
            behind_replay = false;
        }
        if self.cloud.healthy() && !behind_replay {
            match forward::forward_parts(&self.cloud, &parts, body.clone(), AsWho::Node).await {
                Ok(f) if cache::tokens::is_token_request(info) => {
                    self.record(Route::Cloud, info, component, f.response.status(), started);
                    return keep_token(cache, info, &parts, &body, f.response).await;
                }
                Ok(f) => {
                    if supersedes && f.response.status().is_success() {
                        let c = cache.clone();
                        let method = parts.method.to_string();
                        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                        let path_and_query = path_and_query.to_string();
                        let _ = tokio::task::spawn_blocking(move || {
                            c.supersede_queued(&method, &path_and_query)
                        })
                        .await;
                    }
                    self.record(Route::Cloud, info, component, f.response.status(), started);
                    let (path, query) = (parts.uri.path(), parts.uri.query().unwrap_or(""));
                    let node = || cache::credential(None, true);
                    return cache.tee(f.response, info, path, query, node, component_name);
                }
                Err(e) => tracing::info!(
                    verb = info.verb,
                    path = parts.uri.path(),
                    "cloud unreachable, queueing the write on the node: {e}"
                ),
            }
        }
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let accept = parts
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let waits_in_line = behind_replay && self.cloud.healthy();
        let resp = cache
            .accept_offline(
                waits_in_line,
                info,
                &parts.method,
                path_and_query,
                content_type,
                accept,
                component_name,
                body.clone(),
            )
            .await;
        // One the queue cannot hold (say, a patch of an object the node never cached) is
        // the cloud's to answer while it is up, out of line rather than refused.
        if waits_in_line
            && resp.status() == StatusCode::SERVICE_UNAVAILABLE
            && let Ok(f) = forward::forward_parts(&self.cloud, &parts, body, AsWho::Node).await
        {
            self.record(Route::Cloud, info, component, f.response.status(), started);
            let query = parts.uri.query().unwrap_or("");
            let node = || cache::credential(None, true);
            return cache.tee(
                f.response,
                info,
                parts.uri.path(),
                query,
                node,
                component_name,
            );
        }
        self.record(Route::LocalCache, info, component, resp.status(), started);
        resp
    }

    fn record(
        &self,
        route: Route,
        info: &RequestInfo,
        component: &'static str,
        code: StatusCode,
        started: Instant,
    ) {
        let m = &self.state.metrics;
        m.requests
            .get_or_create(&RequestLabels {
                route: route.as_str(),
                verb: info.verb,
                code: code.as_u16(),
                component,
            })
            .inc();
        m.latency
            .get_or_create(&LatencyLabels {
                route: route.as_str(),
                verb: info.verb,
            })
            .observe(started.elapsed().as_secs_f64());
        self.state.count_route(route, code.as_u16());
    }

    /// Counts the response as an open stream until its body ends or the client goes away.
    fn counted(&self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let gauge = self.state.metrics.open_streams.clone();
        gauge.inc();
        resp.map(|inner| {
            http_body_util::BodyExt::boxed(Counted {
                inner,
                gauge: Some(gauge),
            })
        })
    }
}

/// Passes the cloud's answer to a TokenRequest on, and keeps it for when the cloud is
/// unreachable (`cache::tokens`).
async fn keep_token(
    cache: &Arc<Cache>,
    info: &RequestInfo,
    parts: &hyper::http::request::Parts,
    request: &bytes::Bytes,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let plain = resp.status() == StatusCode::CREATED
        && !resp.headers().contains_key(header::CONTENT_ENCODING);
    if !plain {
        return resp;
    }
    let (rparts, body) = resp.into_parts();
    let limited = http_body_util::Limited::new(body, cache::tokens::MAX_ANSWER);
    let answer = match http_body_util::BodyExt::collect(limited).await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return status(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                &format!("hub: reading the cloud's TokenRequest answer: {e}"),
            );
        }
    };
    let type_of = |h: &hyper::HeaderMap| {
        h.get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (cache, info, request) = (cache.clone(), info.clone(), request.clone());
    let (request_type, answer_type) = (type_of(&parts.headers), type_of(&rparts.headers));
    let kept = answer.clone();
    // Kept off the answer's path: the client need not wait for the store's fsync.
    tokio::task::spawn_blocking(move || {
        cache.remember_token(&info, &request_type, &request, &answer_type, &kept)
    });
    Response::from_parts(rparts, forward::full(answer))
}

/// A connection as the listener accepted it.
struct Accepted {
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    id: u64,
    kind: Listener,
    origin: Option<ConnOrigin>,
}

/// How an answer goes out, whichever route gave it.
struct Delivery<'a> {
    /// A watch, an exec or a followed log: counted while open, never gzipped here.
    streaming: bool,
    accepts_gzip: bool,
    component_name: &'a str,
}

fn too_large() -> Response<ProxyBody> {
    status(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        &format!(
            "Request entity too large: limit is {}",
            forward::MAX_REQUEST_BODY
        ),
    )
}

fn uri_path(info: &RequestInfo) -> String {
    if !info.is_resource {
        return "(non-resource path)".into();
    }
    let mut p = info.gvr();
    if !info.namespace.is_empty() {
        p = format!("{p} in {}", info.namespace);
    }
    p
}

/// A body that decrements the open-streams gauge when it is dropped.
struct Counted {
    inner: ProxyBody,
    gauge: Option<prometheus_client::metrics::gauge::Gauge>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(g) = self.gauge.take() {
            g.dec();
        }
    }
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_works_out_again_when_the_header_changes() {
        let memo: Memo<Option<HeaderValue>, String> = Memo::default();
        let mut worked = 0;
        let mut get = |h: Option<&'static str>| {
            memo.get(&h.map(HeaderValue::from_static), || {
                worked += 1;
                cache::credential(h.map(str::as_bytes), false)
            })
        };
        let a = get(Some("Bearer a"));
        assert_eq!(get(Some("Bearer a")), a);
        let b = get(Some("Bearer b"));
        assert_ne!(a, b);
        assert_eq!(get(None), "anonymous");
        assert_eq!(get(Some("Bearer a")), a);
        assert_eq!(worked, 4);
    }
}
