//! The Kubernetes API stand-in: a stateful, TLS-serving cloud for tests, the demo and
//! benchmarks. Its worth is what it shares with kube-apiserver: resourceVersion semantics,
//! list/watch (410 Gone, bookmarks, initial events, chunking), selectors, Status errors,
//! discovery, authentication (tokens, client certificates) and authorisation, plus fault
//! knobs. Known gaps: no protobuf yet, no SPDY, no server-side apply, no admission, and
//! namespace deletion is immediate.
// Handlers return ready-made error responses through `Result`; boxing them buys nothing.
#![allow(clippy::result_large_err)]
pub mod auth;
pub mod client;
pub mod discovery;
pub mod faults;
pub mod framing;
pub mod http;
pub mod node_authz;
pub mod patch;
pub mod proto;
pub mod protobuf;
pub mod protobuf_in;
pub mod resources;
pub mod seed;
pub mod select;
pub mod signer;
pub mod spdy;
pub mod store;
pub mod stream;
pub mod table;
pub mod time;
pub mod tls;
pub mod tokens;
pub mod traffic;
pub mod watch;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::{net::TcpListener, sync::watch as gen_watch};

use self::{
    auth::{Auth, User},
    faults::{FaultSettings, Faults},
    http::{Body, full, json_response, status_error},
    store::Store,
    tls::{Identity, TestCa},
};

#[derive(Debug, Clone)]
pub struct Options {
    /// Events kept for watches before compaction (kube-apiserver keeps ~5 minutes).
    pub history_limit: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Also a bookmark as a watch of 3 s or more ends, at the newest resourceVersion that
    /// watch has seen, as
    /// kube-apiserver 1.36's watch cache sends one (recorded in
    /// tests/fixtures/watch-cache-1.36; it sends the periodic one only every minute).
    pub bookmark_at_deadline: bool,
    /// The longest a watch stays open (timeoutSeconds is capped to it).
    pub max_watch: Duration,
    /// Extra SANs for the serving certificate (the listen IP is always included).
    pub sans: Vec<String>,
    /// Approve CertificateSigningRequests as they arrive (like an approver controller).
    pub auto_approve_csrs: bool,
    /// Lifetime of certificates the stand-in signs for approved CSRs.
    pub csr_cert_lifetime: Duration,
    /// Offer only HTTP/1.1 in ALPN, like an apiserver behind an HTTP/1.1 proxy or with
    /// HTTP/2 serving turned off (as some were after CVE-2023-44487).
    pub http1_only: bool,
    /// The kube-apiserver version answered like, where versions differ on the wire.
    pub version: Version,
}

/// The kube-apiserver versions whose recorded differences the stand-in reproduces
/// (tests/fixtures/wire/kube-apiserver-*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// 1.32: the initial-events-end bookmark also carries
    /// `kubernetes.io/initial-events-list-blueprint` and `creationTimestamp: null`.
    V1_32,
    /// 1.36: the bookmark carries the initial-events-end annotation alone.
    #[default]
    V1_36,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            history_limit: 100_000,
            bookmark_interval: Duration::from_secs(1),
            bookmark_at_deadline: false,
            max_watch: Duration::from_secs(1800),
            sans: vec![],
            auto_approve_csrs: false,
            csr_cert_lifetime: Duration::from_secs(365 * 86400),
            http1_only: false,
            version: Version::default(),
        }
    }
}

/// One authenticated request, as kube-apiserver's audit log would list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub user: String,
    pub method: String,
    pub path: String,
    /// The Authorization header was a bearer token (not a client certificate).
    pub bearer: bool,
    /// It came over HTTP/2 (else HTTP/1.1).
    pub http2: bool,
}

pub struct State {
    pub store: Store,
    /// The CA that signs approved CSRs (and every certificate of this cloud).
    pub ca: Arc<TestCa>,
    pub audit: Mutex<std::collections::VecDeque<AuditEntry>>,
    /// Requests, watches and response bytes per user (what the edge link carries).
    pub traffic: traffic::Traffic,
    pub auth: RwLock<Auth>,
    pub faults: Faults,
    pub options: Options,
    pub url: String,
}

impl State {
    /// kube-apiserver's `Node,RBAC` chain: the Node authorizer for node identities, then
    /// the RBAC rules. A refusal carries the Node authorizer's reason, when it gave one.
    pub fn authorize(&self, user: &User, a: &node_authz::Attributes) -> Result<(), Option<String>> {
        let ready = self.auth.read().unwrap().node_authorizer_ready;
        let node = node_authz::node_of(user).filter(|_| ready);
        let reason = match node.map(|node| node_authz::decide(&self.store, node, a)) {
            Some(node_authz::Decision::Allow) => return Ok(()),
            Some(node_authz::Decision::NoOpinion(reason)) => reason,
            None => None,
        };
        let resource = match a.subresource {
            Some(sub) => format!("{}/{sub}", a.resource),
            None => a.resource.to_string(),
        };
        let rbac = self.auth.read().unwrap();
        if rbac.authorize(user, a.verb, &resource, a.namespace) {
            Ok(())
        } else {
            Err(reason)
        }
    }
}

/// The admin token every stand-in accepts (user `admin`, group `system:masters`).
pub const ADMIN_TOKEN: &str = "hub-standin-admin-token";

/// A running stand-in. Dropping it stops its runtime and every connection.
pub struct StandIn {
    pub state: Arc<State>,
    pub ca: Arc<TestCa>,
    pub serving: Identity,
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
    generation: gen_watch::Sender<u64>,
    tls: Arc<rustls::ServerConfig>,
}

impl StandIn {
    /// Starts listening on `addr` (port 0 picks one) with its own runtime threads and CA.
    pub fn start(addr: SocketAddr, options: Options) -> std::io::Result<StandIn> {
        Self::start_with_ca(addr, options, Arc::new(TestCa::new("hub-standin-ca")))
    }

    /// Like [`StandIn::start`], with a CA shared with other stand-ins (several servers of
    /// one cloud).
    pub fn start_with_ca(
        addr: SocketAddr,
        options: Options,
        ca: Arc<TestCa>,
    ) -> std::io::Result<StandIn> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("standin")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let mut sans: Vec<String> = vec![
            addr.ip().to_string(),
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
        ];
        sans.extend(options.sans.iter().cloned());
        let san_refs: Vec<&str> = sans.iter().map(String::as_str).collect();
        let serving = ca.server(&san_refs);
        let mut tls = ca.server_config(&serving);
        if options.http1_only {
            Arc::make_mut(&mut tls).alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        let mut auth = Auth::new();
        auth.add_token(ADMIN_TOKEN, "admin", &["system:masters"]);
        let state = Arc::new(State {
            store: Store::new(options.history_limit),
            ca: ca.clone(),
            audit: Mutex::new(std::collections::VecDeque::new()),
            traffic: traffic::Traffic::default(),
            auth: RwLock::new(auth),
            faults: Faults::default(),
            options,
            url: format!("https://{addr}"),
        });
        seed::base(&state.store);
        let (generation, _) = gen_watch::channel(0);
        let standin = StandIn {
            state,
            ca,
            serving,
            addr,
            runtime: Some(runtime),
            accept: Mutex::new(None),
            generation,
            tls,
        };
        standin.spawn_accept(listener);
        Ok(standin)
    }

    pub fn url(&self) -> String {
        self.state.url.clone()
    }

    /// The audit entries so far (oldest first).
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.state.audit.lock().unwrap().iter().cloned().collect()
    }

    fn spawn_accept(&self, listener: TcpListener) {
        let state = self.state.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        let generation = self.generation.subscribe();
        let handle = self
            .runtime
            .as_ref()
            .expect("runtime")
            .spawn(accept_loop(listener, state, acceptor, generation));
        *self.accept.lock().unwrap() = Some(handle);
    }

    /// Stops listening and drops every open connection, like a crashed apiserver.
    pub fn stop_listening(&self) {
        if let Some(h) = self.accept.lock().unwrap().take() {
            h.abort();
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// Listens again on the same address.
    pub fn start_listening(&self) -> std::io::Result<()> {
        let rt = self.runtime.as_ref().expect("runtime");
        let addr = self.addr;
        let listener = rt.block_on(async move {
            // The old socket may linger for a moment after the abort; retry briefly.
            let mut last = None;
            for _ in 0..100 {
                match TcpListener::bind(addr).await {
                    Ok(l) => return Ok(l),
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(last.expect("an error"))
        })?;
        self.spawn_accept(listener);
        Ok(())
    }

    pub fn set_faults(&self, f: FaultSettings) {
        self.state.faults.set(f);
    }

    /// Writes a kubeconfig for a bearer token (or for the admin token if None).
    pub fn write_kubeconfig(&self, path: &Path, token: Option<&str>) -> std::io::Result<()> {
        write_kubeconfig(
            path,
            &self.url(),
            &self.ca.cert_pem(),
            Credentials::Token(token.unwrap_or(ADMIN_TOKEN)),
        )
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop_listening();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

pub enum Credentials<'a> {
    Token(&'a str),
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
}

/// A kubeconfig pointing at `url`, trusting `ca_pem`.
pub fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca_pem: &str,
    creds: Credentials<'_>,
) -> std::io::Result<()> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match creds {
        Credentials::Token(t) => format!("    token: {t}\n"),
        Credentials::ClientCert { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\ncurrent-context: standin\nusers:\n- name: standin\n  user:\n{user}",
        b64(ca_pem)
    );
    std::fs::write(path, text)
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    acceptor: tokio_rustls::TlsAcceptor,
    generation: gen_watch::Receiver<u64>,
) {
    let born = *generation.borrow();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if state.faults.refusing() {
            drop(tcp);
            continue;
        }
        let (state, acceptor, mut generation) =
            (state.clone(), acceptor.clone(), generation.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| tls::subject_cn_and_orgs(c))
                .map(|(name, groups)| User { name, groups });
            let service = hyper::service::service_fn(move |req| {
                let (state, cert_user) = (state.clone(), cert_user.clone());
                async move { Ok::<_, std::convert::Infallible>(route(state, cert_user, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::select! {
                _ = conn => {}
                _ = generation.wait_for(|g| *g != born) => {}
            }
        });
    }
}

fn public_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
}

/// The user a request acts as: kube-apiserver's impersonation (`Impersonate-User`, with
/// `Impersonate-Group`s), allowed to whom RBAC gives the `impersonate` verb on `users`
/// (and `groups`); otherwise the authenticated user.
fn impersonated(
    state: &State,
    user: User,
    headers: &hyper::HeaderMap,
) -> Result<User, Response<Body>> {
    let Some(name) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(user);
    };
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let auth = state.auth.read().unwrap();
    let may = auth.authorize(&user, "impersonate", "users", "")
        && (groups.is_empty() || auth.authorize(&user, "impersonate", "groups", ""));
    if !may {
        let message = format!(
            "users \"{name}\" is forbidden: User \"{}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
            user.name
        );
        return Err(status_error(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &message,
            None,
        ));
    }
    Ok(User {
        name: name.to_string(),
        groups,
    })
}

async fn route(
    state: Arc<State>,
    cert_user: Option<User>,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    // kube-apiserver's authenticator chain tries the client certificate before tokens: a
    // request carrying both is the certificate's user.
    let bearer = bearer.filter(|_| cert_user.is_none());
    let user = match (cert_user, &bearer) {
        (Some(u), _) => Some(u),
        (None, Some(token)) => state.auth.read().unwrap().user_for_token(token),
        (None, None) => None,
    };
    if path.starts_with("/_standin/") {
        return control(&state, user.as_ref(), req).await;
    }
    let latency = state.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if state.faults.should_fail() {
        return status_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "injected fault: the server is currently unable to handle the request",
            None,
        );
    }
    let Some(user) = user else {
        if public_path(&path) {
            return misc(&path, state.options.version).unwrap_or_else(not_found);
        }
        return status_error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    };
    let user = match impersonated(&state, user, req.headers()) {
        Ok(u) => u,
        Err(refused) => return refused,
    };
    {
        let mut audit = state.audit.lock().unwrap();
        if audit.len() == 10_000 {
            audit.pop_front();
        }
        audit.push_back(AuditEntry {
            user: user.name.clone(),
            method: req.method().to_string(),
            path: req
                .uri()
                .path_and_query()
                .map_or(path.clone(), |p| p.to_string()),
            bearer: bearer.is_some(),
            http2: req.version() == hyper::Version::HTTP_2,
        });
    }
    let has = |params: &[&str]| {
        req.uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| params.contains(&p)))
    };
    let watching = has(&["watch=1", "watch=true"]);
    let counter = state.traffic.open(
        &user.name,
        req.method().as_str(),
        &path,
        watching,
        has(&["sendInitialEvents=true"]),
    );
    let http11 = req.version() == hyper::Version::HTTP_11;
    let accepts_gzip = req
        .headers()
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|c| c.trim().eq_ignore_ascii_case("gzip"));
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let cost = (!watching).then(|| state.faults.server_cost());
    let resp = authenticated(state, user, path, req).await;
    let resp = in_protobuf_if_asked(resp, accept.as_deref()).await;
    let resp = if accepts_gzip && !watching {
        gzip_large(resp).await
    } else {
        resp
    };
    let resp = framing::as_kube_apiserver(resp, http11).await;
    if let Some((per_answer, per_kib)) = cost {
        let bytes = hyper::body::Body::size_hint(resp.body()).lower();
        let cost = faults::cost(per_answer, per_kib, bytes);
        if !cost.is_zero() {
            let _ = tokio::task::spawn_blocking(move || faults::spend_cpu(cost)).await;
        }
    }
    let (parts, body) = resp.into_parts();
    Response::from_parts(
        parts,
        http_body_util::BodyExt::boxed(traffic::Counted::new(body, counter)),
    )
}

/// kube-apiserver answers in the encoding the client asked for first: a Status error, and
/// an object a write returns (a PATCH of node status), too — not only reads.
async fn in_protobuf_if_asked(resp: Response<Body>, accept: Option<&str>) -> Response<Body> {
    use http_body_util::BodyExt;
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|c| c == "application/json");
    let protobuf_first = accept.is_some_and(|a| {
        a.split(',')
            .next()
            .is_some_and(|m| m.trim() == protobuf::CONTENT_TYPE)
    });
    if !json || !protobuf_first {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, full(bytes));
    };
    let kind = v["kind"].as_str().unwrap_or_default();
    let encoded = match kind {
        "Status" => protobuf::status(&v),
        k if protobuf::supported(k) || k == "TokenRequest" => {
            protobuf::object(v["apiVersion"].as_str().unwrap_or("v1"), k, &v)
        }
        _ => return Response::from_parts(parts, full(bytes)),
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(protobuf::CONTENT_TYPE),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, full(encoded))
}

/// kube-apiserver's rule for `Accept-Encoding: gzip`: a whole answer over 128 KiB is sent
/// gzipped (level 1) with `Vary: Accept-Encoding`; smaller answers and watches are not.
async fn gzip_large(resp: Response<Body>) -> Response<Body> {
    use std::io::Write;

    use http_body_util::BodyExt;
    const THRESHOLD: u64 = 128 * 1024;
    if hyper::body::Body::size_hint(resp.body())
        .exact()
        .is_none_or(|n| n <= THRESHOLD)
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let plain = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
    gz.write_all(&plain).expect("writing into a Vec");
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_ENCODING,
        header::HeaderValue::from_static("gzip"),
    );
    parts.headers.insert(
        header::VARY,
        header::HeaderValue::from_static("Accept-Encoding"),
    );
    Response::from_parts(parts, full(gz.finish().expect("gzip into a Vec")))
}

/// Serves a request whose user is known.
async fn authenticated(
    state: Arc<State>,
    user: User,
    path: String,
    req: Request<Incoming>,
) -> Response<Body> {
    if let Some(resp) = misc(&path, state.options.version) {
        return resp;
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match (req.method(), segs.as_slice()) {
        (&Method::GET, ["api" | "apis"]) if discovery::wants_aggregated(&accept) => {
            let mut resp = json_response(StatusCode::OK, &discovery::aggregated(segs == ["api"]));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(discovery::AGGREGATED),
            );
            resp
        }
        (&Method::GET, ["api"]) => {
            json_response(StatusCode::OK, &discovery::api_versions(&state.url))
        }
        (&Method::GET, ["apis"]) => json_response(StatusCode::OK, &discovery::api_groups()),
        (&Method::GET, ["api", v]) => discovery::resource_list("", v)
            .map_or_else(not_found, |l| json_response(StatusCode::OK, &l)),
        (&Method::GET, ["apis", g, v]) => discovery::resource_list(g, v)
            .map_or_else(not_found, |l| json_response(StatusCode::OK, &l)),
        (&Method::GET, ["openapi", "v3"]) => {
            json_response(StatusCode::OK, &discovery::openapi_v3_root())
        }
        (&Method::GET, ["openapi", "v3", gv @ ..]) => discovery::openapi_v3_group(&gv.join("/"))
            .map_or_else(not_found, |d| json_response(StatusCode::OK, &d)),
        (&Method::POST, ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]) => {
            // `kubectl auth whoami`: who the request was authenticated as.
            let mut review = json!({
                "kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": time::now_rfc3339()},
                "status": {"userInfo": {"username": user.name, "groups": user.groups}},
            });
            let groups = &mut review["status"]["userInfo"]["groups"];
            if let Some(g) = groups.as_array_mut() {
                g.push("system:authenticated".into());
            }
            json_response(StatusCode::CREATED, &review)
        }
        (
            &Method::POST,
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ],
        ) => {
            let protobuf = req.headers().get(header::CONTENT_TYPE).is_some_and(|c| {
                c.as_bytes()
                    .starts_with(b"application/vnd.kubernetes.protobuf")
            });
            let body = match http::read_body(req).await {
                Ok(b) => b,
                Err(resp) => return resp,
            };
            let review = if protobuf {
                proto::self_subject_access_review(&body)
            } else {
                serde_json::from_slice(&body).ok()
            };
            match review {
                Some(r) => discovery::access_review(&state, &user, &r),
                None => http::bad_request("the body of the request was in an unknown format"),
            }
        }
        _ => match http::parse_target(&segs) {
            Some(target) => http::resource_request(state, user, req, target).await,
            None => not_found(),
        },
    }
}

fn not_found() -> Response<Body> {
    status_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    )
}

fn misc(path: &str, version: Version) -> Option<Response<Body>> {
    let text = |t: &'static str| {
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(full(t))
            .expect("response")
    };
    match path {
        "/healthz" | "/livez" | "/readyz" => Some(text("ok")),
        "/version" => Some(json_response(StatusCode::OK, &discovery::version(version))),
        _ => None,
    }
}

/// `/_standin/faults` (GET, PUT), `/_standin/compact` and `/_standin/touch` (POST) and
/// `/_standin/traffic` (GET; DELETE resets it), for system:masters only.
async fn control(state: &State, user: Option<&User>, req: Request<Incoming>) -> Response<Body> {
    if !user.is_some_and(|u| u.groups.iter().any(|g| g == "system:masters")) {
        return status_error(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "the stand-in control endpoints need system:masters",
            None,
        );
    }
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/_standin/faults") => {
            json_response(StatusCode::OK, &json!(state.faults.get()))
        }
        (Method::PUT, "/_standin/faults") => match http::read_body(req)
            .await
            .map(|b| serde_json::from_slice::<FaultSettings>(&b))
        {
            Ok(Ok(f)) => {
                state.faults.set(f);
                json_response(StatusCode::OK, &json!(state.faults.get()))
            }
            Ok(Err(e)) => http::bad_request(&e.to_string()),
            Err(resp) => resp,
        },
        (Method::GET, "/_standin/traffic") => {
            json_response(StatusCode::OK, &json!(state.traffic.report()))
        }
        (Method::DELETE, "/_standin/traffic") => {
            state.traffic.reset();
            json_response(StatusCode::OK, &json!({}))
        }
        (Method::POST, "/_standin/touch") => touch(state, req.uri().query().unwrap_or("")),
        (Method::POST, "/_standin/compact") => {
            state.store.compact();
            json_response(
                StatusCode::OK,
                &json!({"compactedTo": state.store.current_rv()}),
            )
        }
        _ => not_found(),
    }
}

/// `POST /_standin/touch?resource=pods&namespace=default`: every object of a core resource
/// (in the namespace, or all) gets a new resourceVersion (an annotation changes), so the
/// next list returns every item changed — a benchmark's "changed list".
fn touch(state: &State, query: &str) -> Response<Body> {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
    };
    let Some(resource) = resources::find("", "v1", param("resource")) else {
        return http::bad_request("touch: resource= names no core v1 resource");
    };
    let namespace = Some(param("namespace")).filter(|n| !n.is_empty());
    let Ok(page) = state
        .store
        .list(resource, namespace, None, None, 0, |_| true)
    else {
        return http::bad_request("touch: cannot list");
    };
    let stamp = state.store.current_rv().to_string();
    let mut touched = 0;
    for obj in &page.items {
        let key = store::Key {
            resource,
            namespace: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .into(),
            name: obj["metadata"]["name"].as_str().unwrap_or_default().into(),
        };
        let updated = state.store.update(key, None, |cur| {
            let mut next = cur.clone();
            next["metadata"]["annotations"]["standin/touched"] = json!(stamp);
            next
        });
        touched += usize::from(updated.is_ok());
    }
    json_response(StatusCode::OK, &json!({"touched": touched}))
}
