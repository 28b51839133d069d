//! What the running hub knows about itself, shared by the data path and the admin port.
use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use serde::{Deserialize, Serialize};

use crate::{
    cache::{Cache, CacheStatus},
    coordinator::pool::{Pool, PoolStatus},
    intercept::trace::Tracer,
    metrics::Metrics,
    route::Route,
    upstream::{Cloud, cloud::ServerStatus},
};

/// How many recent connections `/v1/status` lists.
const RECENT: usize = 2048;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase", tag = "state", content = "detail")]
pub enum InterceptState {
    /// Turned off in the config.
    Disabled,
    /// Starting up.
    Starting,
    /// Programs attached, VIPs listed.
    Attached,
    /// Wanted but not possible here; the reason says why. Explicit listeners still serve.
    Unavailable(String),
}

/// One accepted client connection, as shown in status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConnRecord {
    pub client: SocketAddr,
    pub original_dst: SocketAddr,
    /// 0 when the origin map had no entry (e.g. interception unavailable).
    pub pid: u32,
    pub cgroup_id: u64,
    /// The cloud server it was relayed to, if any.
    pub upstream: Option<String>,
}

impl ConnRecord {
    /// A connection accepted on `vip`'s listener, with what the eBPF programs recorded
    /// of where it was headed and who opened it (if they had it).
    pub fn intercepted(
        client: SocketAddr,
        vip: SocketAddr,
        origin: Option<crate::intercept::ConnOrigin>,
    ) -> ConnRecord {
        ConnRecord {
            client,
            original_dst: origin.map_or(vip, |o| o.original_dst),
            pid: origin.map_or(0, |o| o.pid),
            cgroup_id: origin.map_or(0, |o| o.cgroup_id),
            upstream: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ConnCounts {
    pub accepted: u64,
    pub active: u64,
    pub origin_known: u64,
    pub origin_unknown: u64,
    pub upstream_failed: u64,
    pub bytes_to_cloud: u64,
    pub bytes_from_cloud: u64,
}

/// How intercepted connections are served.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DataPath {
    /// TLS terminated, requests routed (a serving certificate is configured).
    Proxy,
    /// Bytes relayed to a cloud server unchanged (no serving certificate).
    Relay,
}

/// Requests answered per route, and how many of them were errors (status >= 500).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RouteCounts {
    pub requests: u64,
    pub server_errors: u64,
}

/// The JSON of `/v1/status` and `hub status --output json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    pub node_name: String,
    pub version: String,
    /// The answering process (a node may run a DaemonSet copy and a host copy in turn).
    #[serde(default)]
    pub pid: u32,
    pub ready: bool,
    pub ebpf_object: String,
    pub intercept: InterceptState,
    pub data_path: DataPath,
    pub vips: Vec<VipListener>,
    pub cloud: Vec<ServerStatus>,
    pub routes: BTreeMap<String, RouteCounts>,
    pub open_streams: i64,
    pub tasks: usize,
    /// The latest requests the hub could not serve (newest last), with Unix time.
    pub last_errors: Vec<(u64, String)>,
    pub connections: ConnCounts,
    pub recent: Vec<ConnRecord>,
    /// None when the cache is turned off.
    #[serde(default)]
    pub cache: Option<CacheStatus>,
    /// None without a pool coordinator.
    #[serde(default)]
    pub coordinator: Option<PoolStatus>,
    /// Connections to the VIPs that do not go through the hub; None when not
    /// intercepting.
    #[serde(default)]
    pub bypass: Option<BypassStatus>,
    /// What was found on the node at start: layout, kubeconfig, client CA, cgroup2.
    #[serde(default)]
    pub node_layout: Vec<String>,
    /// Set while the serving certificate's CSR waits for approval.
    #[serde(default)]
    pub serving_certificate: Option<String>,
    /// The node-level watch cache; None when no resource is shared.
    #[serde(default)]
    pub node_watch_cache: Option<crate::shared::Status>,
}

/// Connections to VIPs that bypass the hub (opened while it was not running).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BypassStatus {
    /// Ended when interception started, so their clients connected again through the hub.
    pub ended_at_start: u64,
    /// Found now; None when they cannot be counted (the error says why).
    pub now: Option<u64>,
    pub error: Option<String>,
}

/// What the hub needs to find bypassing connections again.
#[derive(Debug, Clone)]
pub struct BypassWatch {
    pub vips: Vec<SocketAddr>,
    pub cgroup: std::path::PathBuf,
    pub mark: u32,
    pub ended_at_start: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipListener {
    pub vip: SocketAddr,
    pub listener: SocketAddr,
}

pub struct HubState {
    node_name: String,
    pub metrics: Metrics,
    cloud: OnceLock<Arc<Cloud>>,
    pool: OnceLock<Arc<Pool>>,
    shared: OnceLock<Arc<crate::shared::Shared>>,
    data_path: Mutex<DataPath>,
    routes: Mutex<BTreeMap<String, RouteCounts>>,
    last_errors: Mutex<VecDeque<(u64, String)>>,
    ready: AtomicBool,
    intercept: Mutex<InterceptState>,
    vips: Mutex<Vec<VipListener>>,
    accepted: AtomicU64,
    active: AtomicU64,
    origin_known: AtomicU64,
    origin_unknown: AtomicU64,
    upstream_failed: AtomicU64,
    bytes_to_cloud: AtomicU64,
    bytes_from_cloud: AtomicU64,
    recent: Mutex<VecDeque<ConnRecord>>,
    bypass: OnceLock<BypassWatch>,
    tracer: OnceLock<Arc<Tracer>>,
    node_layout: Mutex<Vec<String>>,
    /// Why the serving certificate is not there yet (its CSR waits for approval).
    serving_certificate: Mutex<Option<String>>,
}

/// Decrements the active count when a connection ends, however it ends.
pub struct ActiveGuard<'a>(&'a HubState);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HubState {
    pub fn new(node_name: &str) -> Self {
        HubState {
            node_name: node_name.to_string(),
            metrics: Metrics::new(),
            cloud: OnceLock::new(),
            pool: OnceLock::new(),
            shared: OnceLock::new(),
            data_path: Mutex::new(DataPath::Relay),
            routes: Mutex::new(BTreeMap::new()),
            last_errors: Mutex::new(VecDeque::new()),
            ready: AtomicBool::new(false),
            intercept: Mutex::new(InterceptState::Starting),
            vips: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            active: AtomicU64::new(0),
            origin_known: AtomicU64::new(0),
            origin_unknown: AtomicU64::new(0),
            upstream_failed: AtomicU64::new(0),
            bytes_to_cloud: AtomicU64::new(0),
            bytes_from_cloud: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            bypass: OnceLock::new(),
            tracer: OnceLock::new(),
            node_layout: Mutex::new(Vec::new()),
            serving_certificate: Mutex::new(None),
        }
    }

    /// Where `hub trace` listens, once the eBPF programs are attached.
    pub fn set_tracer(&self, tracer: Arc<Tracer>) {
        let _ = self.tracer.set(tracer);
    }

    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.tracer.get()
    }

    pub fn set_cloud(&self, cloud: Arc<Cloud>) {
        let _ = self.cloud.set(cloud);
    }

    pub fn set_pool(&self, pool: Arc<Pool>) {
        let _ = self.metrics.pool.0.set(pool.clone());
        let _ = self.pool.set(pool);
    }

    pub fn set_shared(&self, shared: Arc<crate::shared::Shared>) {
        let _ = self.metrics.shared.0.set(shared.clone());
        let _ = self.shared.set(shared);
    }

    pub fn set_cache(&self, cache: Arc<Cache>) {
        let _ = self.metrics.cache.0.set(cache);
    }

    pub fn cache(&self) -> Option<&Arc<Cache>> {
        self.metrics.cache.0.get()
    }

    pub fn set_data_path(&self, p: DataPath) {
        *self.data_path.lock().unwrap() = p;
    }

    pub fn count_route(&self, route: Route, code: u16) {
        let mut routes = self.routes.lock().unwrap();
        let c = routes.entry(route.as_str().to_string()).or_default();
        c.requests += 1;
        if code >= 500 {
            c.server_errors += 1;
        }
    }

    /// Remembers a request the hub could not serve (the last 10 are kept).
    pub fn error(&self, what: String) {
        let mut errors = self.last_errors.lock().unwrap();
        if errors.len() == 10 {
            errors.pop_front();
        }
        errors.push_back((crate::certs::now_unix(), what));
    }

    /// Prometheus text, with the upstream health gauges brought up to date first.
    pub fn metrics_text(&self) -> String {
        if let Some(cloud) = self.cloud.get() {
            for s in cloud.status() {
                self.metrics
                    .upstream_healthy
                    .get_or_create(&crate::metrics::ServerLabels { server: s.server })
                    .set(i64::from(s.healthy));
            }
        }
        self.metrics.encode()
    }

    /// What was found on the node at start (`node_layout::Resolved::found`).
    pub fn set_node_layout(&self, found: Vec<String>) {
        *self.node_layout.lock().unwrap() = found;
    }

    /// Says why the hub has no serving certificate yet; None once it has one.
    pub fn set_serving_certificate(&self, pending: Option<String>) {
        *self.serving_certificate.lock().unwrap() = pending;
    }

    pub fn serving_certificate(&self) -> Option<String> {
        self.serving_certificate.lock().unwrap().clone()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn set_intercept(&self, s: InterceptState) {
        *self.intercept.lock().unwrap() = s;
    }

    pub fn add_vip(&self, vip: SocketAddr, listener: SocketAddr) {
        self.vips
            .lock()
            .unwrap()
            .push(VipListener { vip, listener });
    }

    /// Counts a new connection; the guard counts its end.
    pub fn connection_opened(&self, record: &ConnRecord) -> ActiveGuard<'_> {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
        if record.pid != 0 || record.cgroup_id != 0 {
            self.origin_known.fetch_add(1, Ordering::Relaxed);
        } else {
            self.origin_unknown.fetch_add(1, Ordering::Relaxed);
        }
        let mut recent = self.recent.lock().unwrap();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(record.clone());
        ActiveGuard(self)
    }

    pub fn upstream_failed(&self) {
        self.upstream_failed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn relayed(&self, to_cloud: u64, from_cloud: u64) {
        self.bytes_to_cloud.fetch_add(to_cloud, Ordering::Relaxed);
        self.bytes_from_cloud
            .fetch_add(from_cloud, Ordering::Relaxed);
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Lets status count the connections that bypass the hub.
    pub fn watch_bypass(&self, w: BypassWatch) {
        let _ = self.bypass.set(w);
    }

    fn bypass_status(&self) -> Option<BypassStatus> {
        let w = self.bypass.get()?;
        let (now, error) = match crate::intercept::bypass::count(&w.vips, &w.cgroup, w.mark) {
            Ok(n) => (Some(n as u64), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Some(BypassStatus {
            ended_at_start: w.ended_at_start,
            now,
            error,
        })
    }

    pub fn report(&self) -> StatusReport {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatusReport {
            node_name: self.node_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            ready: self.is_ready(),
            ebpf_object: crate::EBPF_OBJECT_SOURCE.to_string(),
            intercept: self.intercept.lock().unwrap().clone(),
            data_path: *self.data_path.lock().unwrap(),
            vips: self.vips.lock().unwrap().clone(),
            cloud: self.cloud.get().map(|c| c.status()).unwrap_or_default(),
            routes: self.routes.lock().unwrap().clone(),
            open_streams: self.metrics.open_streams.get(),
            tasks: tokio::runtime::Handle::try_current()
                .map_or(0, |h| h.metrics().num_alive_tasks()),
            last_errors: self.last_errors.lock().unwrap().iter().cloned().collect(),
            connections: ConnCounts {
                accepted: load(&self.accepted),
                active: load(&self.active),
                origin_known: load(&self.origin_known),
                origin_unknown: load(&self.origin_unknown),
                upstream_failed: load(&self.upstream_failed),
                bytes_to_cloud: load(&self.bytes_to_cloud),
                bytes_from_cloud: load(&self.bytes_from_cloud),
            },
            recent: self.recent.lock().unwrap().iter().cloned().collect(),
            cache: self.cache().map(|c| c.status()),
            coordinator: self.pool.get().map(|p| p.status()),
            bypass: self.bypass_status(),
            node_layout: self.node_layout.lock().unwrap().clone(),
            serving_certificate: self.serving_certificate(),
            node_watch_cache: self.shared.get().map(|s| s.status()),
        }
    }
}
