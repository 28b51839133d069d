//! The cloud apiservers: several servers balanced round-robin over the healthy ones, each
//! health-checked by an active `/readyz` probe and by passive signals from real traffic.
//! Two pooled clients: one presents no client certificate (requests carrying the pod's own
//! bearer token), one presents the node identity (kubelet-style requests).
use std::{
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use hyper::{Request, Response, Uri, body::Incoming};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::Serialize;

use super::{
    ServerUrl,
    connect::{Conn, MarkedConnector},
    health::Health,
    identity::{ClientIdentity, client_config},
};

pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// How often each server is probed; with two failures needed, an outage is seen in ~1 s.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(400);
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);
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

pub struct Server {
    pub url: ServerUrl,
    pub base: String,
    pub health: Health,
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

struct Transports {
    caller: Pool,
    node: Option<Pool>,
    caller_h1: MarkedConnector,
    node_h1: Option<MarkedConnector>,
}

pub struct Cloud {
    pub servers: Vec<Arc<Server>>,
    next: AtomicUsize,
    transports: RwLock<Transports>,
    roots: rustls::RootCertStore,
    mark: u32,
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
        .build(connector)
}

impl Cloud {
    pub fn new(
        urls: &[String],
        roots: rustls::RootCertStore,
        node: Option<&ClientIdentity>,
        mark: u32,
    ) -> Result<Cloud, String> {
        let servers = urls
            .iter()
            .map(|u| {
                let url = ServerUrl::parse(u)?;
                Ok(Arc::new(Server {
                    base: format!("{}://{}", url.scheme, url.authority()),
                    url,
                    health: Health::default(),
                }))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let transports = Self::transports(&roots, node, mark)?;
        Ok(Cloud {
            servers,
            next: AtomicUsize::new(0),
            transports: RwLock::new(transports),
            roots,
            mark,
        })
    }

    fn transports(
        roots: &rustls::RootCertStore,
        node: Option<&ClientIdentity>,
        mark: u32,
    ) -> Result<Transports, String> {
        let both: &[&[u8]] = &[b"h2", b"http/1.1"];
        let h1: &[&[u8]] = &[b"http/1.1"];
        let conn = |id: Option<&ClientIdentity>, alpn| {
            client_config(roots, id, alpn)
                .map(|tls| MarkedConnector { tls, mark })
                .map_err(|e| e.to_string())
        };
        Ok(Transports {
            caller: pool(conn(None, both)?),
            node: node.map(|n| conn(Some(n), both)).transpose()?.map(pool),
            caller_h1: conn(None, h1)?,
            node_h1: node.map(|n| conn(Some(n), h1)).transpose()?,
        })
    }

    /// Swaps in a rotated node identity; open connections finish on the old one.
    pub fn set_node_identity(&self, node: &ClientIdentity) -> Result<(), String> {
        let t = Self::transports(&self.roots, Some(node), self.mark)?;
        *self.transports.write().unwrap() = t;
        Ok(())
    }

    /// The SO_MARK its sockets carry.
    pub fn mark(&self) -> u32 {
        self.mark
    }

    pub fn has_node_identity(&self) -> bool {
        self.transports.read().unwrap().node.is_some()
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

    fn pool(&self, who: AsWho) -> Pool {
        let t = self.transports.read().unwrap();
        match who {
            AsWho::Node => t.node.clone().unwrap_or_else(|| t.caller.clone()),
            AsWho::Caller => t.caller.clone(),
        }
    }

    /// Sends a request built by `build` (called once per attempt with the server's base
    /// URL). A server that cannot be connected to is marked and the next one is tried,
    /// which is safe for any method because nothing was sent.
    pub async fn send(
        &self,
        who: AsWho,
        mut build: impl FnMut(&str) -> Option<Request<ProxyBody>>,
    ) -> Result<(Response<Incoming>, Arc<Server>), UpstreamError> {
        let pool = self.pool(who);
        let mut last = String::from("no cloud servers configured");
        let mut tried = 0;
        for server in self.order() {
            let Some(req) = build(&server.base) else {
                break;
            };
            tried += 1;
            // Waiting for headers ends early if the server is found dead meanwhile (by the
            // probe or other requests): the client then gets the next route at once instead
            // of a 60 s hang.
            let was_healthy = server.health.is_healthy();
            let abandoned = async {
                if was_healthy {
                    server.health.unhealthy().await
                } else {
                    std::future::pending().await
                }
            };
            let answer = tokio::select! {
                r = tokio::time::timeout(HEADER_TIMEOUT, pool.request(req)) => r,
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
                Ok(Err(e)) if e.is_connect() => {
                    server.health.failure(&format!("connect: {e}"));
                    last = format!("{}: {}", server.url.authority(), source_chain(&e));
                }
                Ok(Err(e)) => {
                    server.health.failure(&e.to_string());
                    return Err(UpstreamError::Failed {
                        server: server.url.authority(),
                        reason: source_chain(&e),
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
        Err(UpstreamError::Unreachable { tried, last })
    }

    /// A fresh HTTP/1.1 connection for an upgrade (exec, attach, port-forward), to the
    /// first healthy server.
    pub async fn open_upgrade(&self, who: AsWho) -> Result<(Conn, Arc<Server>), UpstreamError> {
        let connector = {
            let t = self.transports.read().unwrap();
            match who {
                AsWho::Node => t.node_h1.clone().unwrap_or_else(|| t.caller_h1.clone()),
                AsWho::Caller => t.caller_h1.clone(),
            }
        };
        let mut last = String::from("no cloud servers configured");
        for server in self.order() {
            let uri: Uri = match server.base.parse() {
                Ok(u) => u,
                Err(_) => continue,
            };
            match connector.open(&uri).await {
                Ok(c) => {
                    server.health.success();
                    return Ok((c, server));
                }
                Err(e) => {
                    server.health.failure(&format!("connect: {e}"));
                    last = format!("{}: {e}", server.url.authority());
                }
            }
        }
        Err(UpstreamError::Unreachable {
            tried: self.servers.len(),
            last,
        })
    }

    /// Probes every server until `stop` turns true.
    pub async fn probe_forever(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let pool = self.pool(AsWho::Node);
            let probes: Vec<_> = self
                .servers
                .iter()
                .cloned()
                .map(|s| {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let req = Request::get(format!("{}/readyz", s.base))
                            .body(
                                Empty::<Bytes>::new()
                                    .map_err(|never| match never {})
                                    .boxed(),
                            )
                            .expect("probe request");
                        match tokio::time::timeout(PROBE_TIMEOUT, pool.request(req)).await {
                            Ok(Ok(resp)) if resp.status().is_server_error() => s
                                .health
                                .soft_failure(&format!("/readyz answered {}", resp.status())),
                            // Any other answer (even 401/403) means the server is up and serving.
                            Ok(Ok(_)) => s.health.success(),
                            Ok(Err(e)) => {
                                s.health.failure(&format!("/readyz: {}", source_chain(&e)))
                            }
                            Err(_) => s.health.failure("/readyz timed out"),
                        }
                    })
                })
                .collect();
            // Probes run concurrently; a dead server does not delay the others.
            for p in probes {
                let _ = p.await;
            }
        }
    }
}

/// An error and its causes on one line.
pub fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
