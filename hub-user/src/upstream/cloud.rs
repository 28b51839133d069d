//! The cloud apiservers: several servers balanced round-robin over the healthy ones, each
//! judged by the traffic on its connections, with a `/readyz` probe only when that traffic
//! says nothing (see `health`).
//! Two identities: one presents no client certificate (requests carrying the pod's own
//! bearer token), one presents the node identity (kubelet-style requests); each has one
//! HTTP/2 connection per server (`channel`), or hyper's pooled HTTP/1.1 client for servers
//! without HTTP/2.
use std::{
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    Request, Response,
    http::uri::{Authority, PathAndQuery, Scheme},
};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::Serialize;

use crate::body::{BodyError, ProxyBody, source_chain};

pub use super::server::Server;
use super::{
    ServerUrl,
    channel::{Channel, ChannelError},
    connect::{Conn, MarkedConnector},
    health::Health,
    identity::{ClientIdentity, client_config},
};

/// How often the prober looks at each server, and probes the ones due (`Health::probe_due`):
/// a server that is down is probed this often, so its return is seen within a second.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(400);
/// After how long without an answer or a byte from a healthy server it gets a `/readyz`.
pub const DEFAULT_IDLE_CHECK: Duration = Duration::from_secs(60);
/// How long a request already waiting on a server marked unhealthy gives its connection
/// to answer a PING before it goes to the next route.
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(1);
/// How long the cloud gets to send response headers (watches send them at once).
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no cloud server reachable (tried {tried}): {last}")]
    Unreachable { tried: usize, last: String },
    #[error("cloud server {server} did not answer within {secs} s")]
    Timeout { server: String, secs: u64 },
    #[error("cloud server {server}: {reason}")]
    Failed { server: String, reason: String },
}

/// Which identity the hub uses towards the cloud for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsWho {
    /// No client certificate: the request's own Authorization header speaks for it.
    Caller,
    /// The node's client certificate.
    Node,
}

type Pool = Client<MarkedConnector, ProxyBody>;

/// The most an HTTP/1.1 connection to the cloud buffers of an answer it reads.
const READ_BUFFER_MAX: usize = 128 * 1024;

/// Marks a request whose answer may be large (a whole list): it goes over HTTP/1.1.
/// kube-apiserver writes a large answer over HTTP/1.1 in full buffers, over HTTP/2 in
/// many small frames: a 1000-pod list cost kube-apiserver 1.36 about 40 % less CPU over
/// HTTP/1.1, and the hub fewer wakeups to read it.
#[derive(Clone, Copy, Debug)]
pub struct Bulk;

/// How the hub reaches the cloud as one identity.
struct Transport {
    /// One HTTP/2 connection per server, by `Server::index`.
    channels: Vec<Channel>,
    /// For servers without HTTP/2, and for answers that may be large (`Bulk`).
    http1: Pool,
    /// Fresh HTTP/1.1 connections, for upgrades.
    upgrades: MarkedConnector,
}

struct Transports {
    caller: Transport,
    node: Option<Transport>,
}

impl Transports {
    fn of(&self, who: AsWho) -> &Transport {
        match who {
            AsWho::Node => self.node.as_ref().unwrap_or(&self.caller),
            AsWho::Caller => &self.caller,
        }
    }
}

pub struct Cloud {
    pub servers: Vec<Arc<Server>>,
    next: AtomicUsize,
    /// Replaced whole when the node identity rotates; requests hold the one they started on.
    transports: RwLock<Arc<Transports>>,
    roots: rustls::RootCertStore,
    mark: u32,
    /// Woken when a server asks to be checked now (a connection to it ended).
    prober: Arc<tokio::sync::Notify>,
    idle_check: Duration,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ServerStatus {
    pub server: String,
    pub healthy: bool,
    pub transitions: u32,
    pub last_error: String,
}

fn pool(connector: MarkedConnector) -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        // hyper lets a connection's read buffer grow to ~400 KiB while a large list
        // streams in (its pieces share that buffer); bounded at 128 KiB, the hub's peak
        // RSS through `bench proxy` fell from ~38 to ~31 MiB at no measured cost per list.
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build(connector)
}

impl Cloud {
    pub fn new(
        urls: &[String],
        roots: rustls::RootCertStore,
        node: Option<&ClientIdentity>,
        mark: u32,
    ) -> Result<Cloud, String> {
        let prober = Arc::new(tokio::sync::Notify::new());
        let servers = urls
            .iter()
            .enumerate()
            .map(|(index, u)| {
                let url = ServerUrl::parse(u)?;
                let bad = |e: hyper::http::Error| format!("`{u}`: {e}");
                Ok(Arc::new(Server::new(
                    index,
                    Scheme::try_from(url.scheme.as_str()).map_err(|e| bad(e.into()))?,
                    Authority::try_from(url.authority()).map_err(|e| bad(e.into()))?,
                    url,
                    Health::new(prober.clone()),
                )))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let transports = Self::transports(&roots, node, mark, servers.len())?;
        Ok(Cloud {
            servers,
            next: AtomicUsize::new(0),
            transports: RwLock::new(Arc::new(transports)),
            roots,
            mark,
            prober,
            idle_check: DEFAULT_IDLE_CHECK,
        })
    }

    /// How long a healthy server may say nothing before a `/readyz` checks it.
    pub fn with_idle_check(mut self, idle: Duration) -> Cloud {
        self.idle_check = idle;
        self
    }

    fn transports(
        roots: &rustls::RootCertStore,
        node: Option<&ClientIdentity>,
        mark: u32,
        servers: usize,
    ) -> Result<Transports, String> {
        let transport = |id: Option<&ClientIdentity>| -> Result<Transport, String> {
            let conn = |alpn: &[&[u8]]| {
                client_config(roots, id, alpn)
                    .map(|tls| MarkedConnector { tls, mark })
                    .map_err(|e| e.to_string())
            };
            let (h2, h1) = (conn(&[b"h2", b"http/1.1"])?, conn(&[b"http/1.1"])?);
            Ok(Transport {
                channels: (0..servers).map(|_| Channel::new(h2.clone())).collect(),
                http1: pool(h1.clone()),
                upgrades: h1,
            })
        };
        Ok(Transports {
            caller: transport(None)?,
            node: node.map(|n| transport(Some(n))).transpose()?,
        })
    }

    /// Swaps in a rotated node identity; open connections finish on the old one.
    pub fn set_node_identity(&self, node: &ClientIdentity) -> Result<(), String> {
        let t = Self::transports(&self.roots, Some(node), self.mark, self.servers.len())?;
        *self.transports.write().unwrap() = Arc::new(t);
        Ok(())
    }

    fn current(&self) -> Arc<Transports> {
        self.transports.read().unwrap().clone()
    }

    /// The SO_MARK its sockets carry.
    pub fn mark(&self) -> u32 {
        self.mark
    }

    pub fn has_node_identity(&self) -> bool {
        self.current().node.is_some()
    }

    /// True while at least one server is healthy.
    pub fn healthy(&self) -> bool {
        self.servers.iter().any(|s| s.health.is_healthy())
    }

    /// False until the first probe or request has reported on any server: right after
    /// start, when a frozen or unreachable cloud is not yet known to be so.
    pub fn health_known(&self) -> bool {
        self.servers.iter().any(|s| s.health.is_known())
    }

    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|s| ServerStatus {
                server: s.url.authority(),
                healthy: s.health.is_healthy(),
                transitions: s.health.transitions(),
                last_error: s.health.last_error(),
            })
            .collect()
    }

    /// Servers in the order to try: healthy ones round-robin, then the rest.
    pub fn order(&self) -> Vec<Arc<Server>> {
        let n = self.servers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut v: Vec<Arc<Server>> = (0..n)
            .map(|i| self.servers[(start + i) % n].clone())
            .collect();
        v.sort_by_key(|s| !s.health.is_healthy());
        v
    }

    /// One attempt at `server`: over its HTTP/2 connection, or hyper's HTTP/1.1 pool when
    /// the server does not offer HTTP/2.
    async fn attempt(
        transport: &Transport,
        server: &Server,
        req: Request<Bytes>,
    ) -> Result<Response<ProxyBody>, ChannelError> {
        let channel = &transport.channels[server.index];
        let req = if channel.http1_only() || req.extensions().get::<Bulk>().is_some() {
            req
        } else {
            match channel.request(server, req).await {
                Err(ChannelError::NotHttp2(unsent)) => *unsent,
                answered => return answered,
            }
        };
        let req = req.map(|b| Full::new(b).map_err(|never| match never {}).boxed());
        match transport.http1.request(req).await {
            Ok(resp) => Ok(resp.map(|b| b.map_err(BodyError::from).boxed())),
            Err(e) if e.is_connect() => Err(ChannelError::Connect(source_chain(&e))),
            Err(e) => Err(ChannelError::Failed(source_chain(&e))),
        }
    }

    /// Sends a request built by `build` (called once per attempt with the server to send
    /// it to). A server that cannot be connected to is marked and the next one is tried,
    /// which is safe for any method because nothing was sent.
    /// Ends when a server that was healthy as a request went out is found silent while
    /// the request waits for its answer: nothing came on its connection for a probe wait,
    /// and a PING then got no answer within another (the server is marked down). A server
    /// judged down meanwhile by someone else must fail a PING too. Never ends for a server
    /// already unhealthy (its answer is waited for). Slow is not silent: a loaded server
    /// building a large answer still answers PINGs at once.
    async fn silent_while_waiting(server: &Server, channel: &Channel) {
        if !server.health.is_healthy() {
            return std::future::pending().await;
        }
        loop {
            let wait = server.health.probe_wait();
            let judged_down = tokio::select! {
                () = server.health.unhealthy() => true,
                () = tokio::time::sleep(wait) => false,
            };
            if judged_down {
                let alive = channel.ping(IN_FLIGHT_PATIENCE).await.is_some()
                    || server.health.heard_within(IN_FLIGHT_PATIENCE);
                if !alive {
                    return;
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
                continue;
            }
            if channel.heard_within(wait) {
                continue;
            }
            if !channel.connected() {
                // Still connecting: the prober's connect decides (see `Health::failure`).
                server.health.recheck_handle().ask();
                continue;
            }
            if let Some(rtt) = channel.ping(wait).await {
                server.health.pinged(rtt);
                continue;
            }
            if channel.heard_within(wait * 2) {
                continue;
            }
            server.health.unreachable(&format!(
                "silent: a request got no byte and a PING no answer within {} ms",
                (wait * 2).as_millis()
            ));
            return;
        }
    }

    /// Resolves once `server` has been judged down and nothing has come from it for a
    /// moment: a stream from it should then take the cloud as gone.
    pub async fn gone(server: Arc<Server>) {
        loop {
            server.health.unhealthy().await;
            if !server.health.heard_within(IN_FLIGHT_PATIENCE) {
                return;
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    pub async fn send(
        &self,
        who: AsWho,
        mut build: impl FnMut(&Server) -> Option<Request<Bytes>>,
    ) -> Result<(Response<ProxyBody>, Arc<Server>), UpstreamError> {
        let transports = self.current();
        let transport = transports.of(who);
        let mut last = String::from("no cloud servers configured");
        let order = self.order();
        let (mut at, mut resends) = (0, 0);
        while let Some(server) = order.get(at).cloned() {
            let Some(req) = build(&server) else {
                break;
            };
            at += 1;
            // Waiting for headers ends early if the server is found silent meanwhile: the
            // client then gets the next route instead of a 60 s hang. Marked unhealthy is
            // not enough — a server busy building a large answer can miss two probes — so
            // the connection itself must then fail a PING too.
            let abandoned = Self::silent_while_waiting(&server, &transport.channels[server.index]);
            let answer = tokio::select! {
                r = tokio::time::timeout(HEADER_TIMEOUT, Self::attempt(transport, &server, req)) => r,
                () = abandoned => {
                    last = format!("{}: marked unhealthy while waiting for its answer", server.url.authority());
                    continue;
                }
            };
            match answer {
                Ok(Ok(resp)) => {
                    if matches!(resp.status().as_u16(), 502..=504) {
                        server
                            .health
                            .soft_failure(&format!("answered {}", resp.status()));
                    } else {
                        server.health.success();
                    }
                    return Ok((resp, server));
                }
                // The server did nothing with it (its connection just ended, or it refused
                // the stream): the same server again, on a new connection if need be.
                Ok(Err(ChannelError::Refused(_))) if resends < 2 => {
                    resends += 1;
                    at -= 1;
                }
                Ok(Err(ChannelError::Connect(e))) => {
                    server.health.unreachable(&format!("connect: {e}"));
                    last = format!("{}: {e}", server.url.authority());
                }
                Ok(Err(e)) => {
                    server.health.failure(&e.to_string());
                    return Err(UpstreamError::Failed {
                        server: server.url.authority(),
                        reason: e.to_string(),
                    });
                }
                Err(_) => {
                    server.health.failure("timed out");
                    return Err(UpstreamError::Timeout {
                        server: server.url.authority(),
                        secs: HEADER_TIMEOUT.as_secs(),
                    });
                }
            }
        }
        Err(UpstreamError::Unreachable { tried: at, last })
    }

    /// A fresh HTTP/1.1 connection for an upgrade (exec, attach, port-forward), to the
    /// first healthy server.
    pub async fn open_upgrade(&self, who: AsWho) -> Result<(Conn, Arc<Server>), UpstreamError> {
        let connector = self.current().of(who).upgrades.clone();
        let mut last = String::from("no cloud servers configured");
        for server in self.order() {
            match connector
                .open(&server.uri(PathAndQuery::from_static("/")))
                .await
            {
                Ok(c) => {
                    server.health.success();
                    return Ok((c, server));
                }
                Err(e) => {
                    server.health.unreachable(&format!("connect: {e}"));
                    last = format!("{}: {e}", server.url.authority());
                }
            }
        }
        Err(UpstreamError::Unreachable {
            tried: self.servers.len(),
            last,
        })
    }

    /// Probes the servers that are due (`Health::probe_due`) until `stop` turns true;
    /// `offline` says in the log what the node does while the cloud is unreachable. A
    /// healthy server with traffic on its connections is never probed.
    pub async fn probe_forever(
        self: Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        offline: &'static str,
    ) {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // (reachable, since when), for the operator's log line at each change.
        let mut seen: Option<(bool, std::time::Instant)> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.prober.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if self.health_known() {
                seen = Some(self.log_transition(seen, offline));
            }
            // Over the connections requests use, so a connection that died is noticed.
            let transports = self.current();
            let probes: Vec<_> = self
                .servers
                .iter()
                .filter(|s| s.health.probe_due(self.idle_check))
                .cloned()
                .map(|s| tokio::spawn(Self::probe(transports.clone(), s)))
                .collect();
            // Probes run concurrently; a dead server does not delay the others.
            for p in probes {
                let _ = p.await;
            }
            if self.health_known() {
                seen = Some(self.log_transition(seen, offline));
            }
        }
    }

    /// One `/readyz` to `s`, with a PING beside it: a loaded server answers the PING at
    /// once, a frozen or cut-off one does not.
    async fn probe(transports: Arc<Transports>, s: Arc<Server>) {
        let readyz = |s: &Server| {
            Request::get(s.uri(PathAndQuery::from_static("/readyz")))
                .body(Bytes::new())
                .expect("probe request")
        };
        let transport = transports.of(AsWho::Node);
        let probe = async {
            match Self::attempt(transport, &s, readyz(&s)).await {
                // Not processed: once more, on a new connection if need be.
                Err(ChannelError::Refused(_)) => Self::attempt(transport, &s, readyz(&s)).await,
                answered => answered,
            }
        };
        let wait = s.health.probe_wait();
        let (answer, pong) = tokio::join!(
            tokio::time::timeout(wait, probe),
            transport.channels[s.index].ping(wait)
        );
        if let Some(rtt) = pong {
            s.health.pinged(rtt);
        }
        match answer {
            Ok(Ok(resp)) if resp.status().is_server_error() => s
                .health
                .soft_failure(&format!("/readyz answered {}", resp.status())),
            // Any other answer (even 401/403) means the server is up and serving.
            Ok(Ok(_)) => s.health.success(),
            Ok(Err(ChannelError::Connect(e))) => {
                s.health.unreachable(&format!("/readyz: connect: {e}"))
            }
            Ok(Err(e)) => s.health.failure(&format!("/readyz: {e}")),
            // Slow, not down: it answered the PING, or is sending bytes.
            Err(_) if pong.is_some() || s.health.heard_within(wait) => s.health.success(),
            Err(_) => s.health.failure(&format!(
                "silent: no answer to /readyz or a PING, and no byte, within {} ms",
                wait.as_millis()
            )),
        }
    }
}

impl Cloud {
    /// A JSON request of the hub's own (CSRs, approvals): sent as `who`, with a bearer
    /// `token` when given; the answer's status and body (Null when not JSON).
    pub async fn json_call(
        &self,
        who: AsWho,
        token: Option<&str>,
        user_agent: &str,
        method: hyper::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), String> {
        let bytes = body.map_or_else(Bytes::new, |b| {
            Bytes::from(serde_json::to_vec(b).expect("json"))
        });
        let (resp, _) = self
            .send(who, |server| {
                let mut req = Request::builder()
                    .method(method.clone())
                    .uri(server.uri(path.parse().ok()?))
                    .header("Content-Type", "application/json")
                    .header("Accept", "application/json")
                    .header("User-Agent", user_agent);
                if let Some(t) = token {
                    req = req.header("Authorization", format!("Bearer {t}"));
                }
                req.body(bytes.clone()).ok()
            })
            .await
            .map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((code, serde_json::from_slice(&body).unwrap_or_default()))
    }

    /// Says at INFO when the cloud as a whole becomes unreachable or reachable again (a
    /// server's fall alone is in `hub status`); returns the state now.
    fn log_transition(
        &self,
        seen: Option<(bool, std::time::Instant)>,
        offline: &str,
    ) -> (bool, std::time::Instant) {
        let now = self.healthy();
        match seen {
            Some((was, since)) if was == now => (was, since),
            Some((_, since)) if now => {
                tracing::info!(
                    after_secs = since.elapsed().as_secs(),
                    "cloud reachable again: requests go to the cloud"
                );
                (now, std::time::Instant::now())
            }
            _ if !now => {
                let why: Vec<String> = self
                    .servers
                    .iter()
                    .map(|s| {
                        let u = &s.url;
                        format!("{}:{}: {}", u.host, u.port, s.health.last_error())
                    })
                    .collect();
                tracing::info!("cloud unreachable ({}): {offline}", why.join("; "));
                (now, std::time::Instant::now())
            }
            _ => (now, std::time::Instant::now()),
        }
    }
}
