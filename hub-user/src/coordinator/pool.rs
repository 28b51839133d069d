//! The hub's part in its node pool (design.md §7): push what this node's cache holds into
//! the pool's coordinator (every second, the sets that changed; everything after a start),
//! notice a coordinator that was rebuilt (its epoch key gone, or another etcd cluster id)
//! and push everything again, probe its health, and answer get/list/watch for the whole
//! pool from it while the cloud is unreachable.
//!
//! Only what the cloud returned to the node identity is pushed (kubelet, kube-proxy, … —
//! never a pod's bearer-token reads, never Secrets), and pool data is served only to the
//! node identity, so nothing reaches a client the cloud did not authorise for it.
//! The hub also takes part in the pool's leader election (`election`); the leader syncs
//! the pool-scope resources from the cloud (`leader`) and sweeps what no live hub holds
//! (`gc`, fed by each hub's membership key and set records), and followers read the
//! pool-scope resources from the coordinator while the cloud is up (`watch` for watches).
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use hyper::Response;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    election::{Election, Lease},
    endpoints as members,
    gc::{self, GcStatus},
    leader, live_pods,
    owned::Owned,
    storage::{self, Limits, Object, Resource, Storage, resource_of},
    watch as coordinator_watch,
};
use crate::{
    body::ProxyBody,
    cache::{
        Cache,
        objects::{Encoding, Item},
        serve::{FROM_COORDINATOR, FROM_POOL_LEADER, answer_from},
        store::{self, ObjectKey, Record},
    },
    config::Config,
    live::{endpoints, state::LiveState},
    proxy::request::RequestInfo,
    upstream::Cloud,
};

/// The key whose value identifies one life of the coordinator: created by the first hub
/// that finds it missing; gone after a wipe or rebuild.
pub const EPOCH_KEY: &str = "/hub/epoch";
/// How often the cache is compared with what was pushed.
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// The coordinator's health probe: a read of the epoch key this often, failing after
/// PROBE_TIMEOUT; PROBE_FAILURES in a row (or a request that got no answer) make it
/// unhealthy, and the sync loop's next successful round makes it healthy again.
const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);
const PROBE_FAILURES: u32 = 2;
/// Resources that never leave the node.
const NEVER_PUSHED: [&str; 1] = ["/v1/secrets"];

/// What `hub status` shows about the coordinator.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolStatus {
    pub pool: String,
    pub endpoints: Vec<String>,
    /// Reads (the pool's data served from it) work: what routing goes by.
    pub healthy: bool,
    /// The last round of pushes succeeded. A push refused or cut off does not stop
    /// reads: etcd may refuse a large write and still answer every read.
    #[serde(default)]
    pub pushes_healthy: bool,
    #[serde(default)]
    pub last_push_error: Option<String>,
    /// Members that did not answer the last check (left out of the client's balance
    /// while others answer).
    #[serde(default)]
    pub members_down: Vec<String>,
    pub epoch: String,
    pub cluster_id: u64,
    /// Full pushes of this node's data (the first, and one per coordinator rebuild).
    pub full_pushes: u64,
    /// Lists replaced in the coordinator, and objects written by them.
    pub lists_pushed: u64,
    pub objects_written: u64,
    /// Pushed objects the coordinator already held newer (from another hub): dropped.
    #[serde(default)]
    pub stale_dropped: u64,
    pub last_push_ms: u64,
    /// Objects held in JSON converted to protobuf for the coordinator (kube-apiserver's
    /// storage encoding), and objects pushed in JSON: kinds with no schema (custom
    /// resources) or JSON that would not convert. Nothing is asked of the cloud for a push.
    #[serde(default)]
    pub converted_for_storage: u64,
    #[serde(default)]
    pub stored_as_json: u64,
    /// As leader: complete lists of pool-scope resources written, watch events applied,
    /// events older than what the coordinator held (dropped).
    #[serde(default)]
    pub leader_lists: u64,
    #[serde(default)]
    pub leader_events: u64,
    #[serde(default)]
    pub leader_stale: u64,
    /// As leader: the sweeps of what no live hub holds.
    #[serde(default)]
    pub gc: GcStatus,
    /// "leader" or "follower" in the pool's election; "" before it runs.
    pub role: String,
    /// The hub that leads the pool, as last seen.
    pub leader: String,
    pub last_error: Option<String>,
}

pub struct Pool {
    config: Arc<Config>,
    storage: OnceLock<(Client, Arc<Storage>)>,
    election: OnceLock<Arc<Election>>,
    healthy: AtomicBool,
    pushes_healthy: AtomicBool,
    status: Mutex<PoolStatus>,
    /// Pool-scope resources a leader has synced (gvr -> when that was last checked).
    synced: Mutex<HashMap<String, (bool, Instant)>>,
    /// Lives of the coordinator seen (first start, then one per rebuild).
    lives: AtomicU64,
    /// The node's live state: what the pool's EndpointSlices and Endpoints are served
    /// following (this node's pods and those the other hubs share).
    live: OnceLock<Arc<LiveState>>,
}

/// What a pushed set was: it is pushed again when the objects or a version changed, and
/// its key record is rewritten only when the names changed (records are what the
/// leader's sweep must see unchanged, and are large).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    objects: usize,
    rv_sum: u64,
    names: u64,
}

impl Fingerprint {
    fn of(items: &[Item]) -> Fingerprint {
        let names = fnv(items.iter().flat_map(|i| {
            let ns = i.namespace.bytes().chain([b'/']);
            ns.chain(i.name.bytes()).chain([0])
        }));
        Fingerprint {
            objects: items.len(),
            rv_sum: items.iter().map(|i| i.rv).sum(),
            names,
        }
    }
}

/// One component's objects of one resource, as the node's cache holds them.
#[derive(Default)]
struct Set {
    live: Vec<Item>,
    /// Tombstones: objects the node saw deleted (with the deletion's resourceVersion).
    deleted: Vec<Item>,
}

/// The node's cached records grouped by (component, gvr) as the pool sees them: secrets
/// stay on the node; GET-only objects written before `aged_before` have aged out; a
/// tombstone only says "deleted" when the cloud deleted the object — one that may only
/// mean the object left a selection is neither held nor deleted, so its key is only
/// released.
fn sets_of(records: Vec<(ObjectKey, Record)>, aged_before: u64) -> HashMap<(String, String), Set> {
    let mut sets: HashMap<(String, String), Set> = HashMap::new();
    for (key, rec) in records {
        if NEVER_PUSHED.contains(&key.gvr.as_str()) || rec.one_off && rec.stored_at < aged_before {
            continue;
        }
        let set = sets.entry((key.component, key.gvr)).or_default();
        match (rec.deleted, rec.left_selection) {
            (false, _) => set.live.push(rec.item),
            (true, false) => set.deleted.push(rec.item),
            (true, true) => {}
        }
    }
    sets
}

/// Up to this long, spread by node name, before a hub re-pushes into a rebuilt coordinator.
const REPUSH_SPREAD: Duration = Duration::from_millis(1000);

/// FNV-1a: a stable hash (same on every hub and every run), for spreading and fingerprints.
fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn repush_spread(node: &str) -> Duration {
    Duration::from_millis(fnv(node.bytes()) % REPUSH_SPREAD.as_millis() as u64)
}

impl Pool {
    pub fn new(config: Arc<Config>) -> Pool {
        let status = PoolStatus {
            pool: config.pool_name.clone().unwrap_or_default(),
            endpoints: config.coordinator.endpoints.clone(),
            ..Default::default()
        };
        Pool {
            config,
            storage: OnceLock::new(),
            election: OnceLock::new(),
            healthy: AtomicBool::new(false),
            pushes_healthy: AtomicBool::new(false),
            status: Mutex::new(status),
            synced: Mutex::new(HashMap::new()),
            lives: AtomicU64::new(0),
            live: OnceLock::new(),
        }
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    pub fn status(&self) -> PoolStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.healthy = self.healthy();
        s.pushes_healthy = self.pushes_healthy.load(Ordering::SeqCst);
        if let Some(e) = self.election.get() {
            s.role = if e.is_leader() { "leader" } else { "follower" }.into();
            s.leader = e.holder();
        }
        s
    }

    /// Changes whenever the coordinator is found rebuilt or replaced.
    pub fn life(&self) -> u64 {
        self.lives.load(Ordering::SeqCst)
    }

    pub fn storage(&self) -> Option<Arc<Storage>> {
        self.storage.get().map(|(_, s)| s.clone())
    }

    /// A failure of the leader's sync: shown in status, but the coordinator may be fine.
    pub fn note_leader_error(&self, e: String) {
        self.note_error(format!("pool leader: {e}"));
    }

    /// A failure that says nothing about the coordinator's health: shown in status only.
    fn note_error(&self, e: String) {
        tracing::warn!("{e}");
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error = Some(e);
    }

    fn count_status(&self, f: impl FnOnce(&mut PoolStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn pool_name(&self) -> String {
        self.config.pool_name.clone().unwrap_or_default()
    }

    pub fn pool_scope(&self) -> Vec<String> {
        self.config.coordinator.pool_scope_resources.clone()
    }

    /// Keeps this hub's lease-bound membership key; a hub whose key is gone for longer
    /// than the grace has the keys only it held removed by the leader's sweep.
    async fn keep_membership(
        &self,
        client: &Client,
        lease: &mut Option<Lease>,
    ) -> Result<(), String> {
        if let Some(l) = lease.as_mut()
            && l.renew().await
        {
            return Ok(());
        }
        let ttl = Duration::from_secs(self.config.coordinator.leader_lease_seconds.max(2));
        let l = Lease::grant(client, ttl).await.map_err(|e| e.to_string())?;
        let key = gc::member_key(&self.pool_name(), &self.config.node_name);
        client
            .kv_client()
            .put(
                key,
                store::now().to_string(),
                Some(etcd_client::PutOptions::new().with_lease(l.id)),
            )
            .await
            .map_err(|e| e.to_string())?;
        *lease = Some(l);
        Ok(())
    }

    /// Whether a leader has synced this pool-scope resource into the coordinator (asked of
    /// etcd at most once a second per resource).
    async fn leader_synced(&self, storage: &Storage, gvr: &str) -> bool {
        const RECHECK: Duration = Duration::from_secs(1);
        if let Some((known, at)) = self
            .synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(gvr)
            .copied()
            && (known || at.elapsed() < RECHECK)
        {
            return known;
        }
        let known = matches!(
            storage.get_meta(&leader::synced_key(gvr)).await,
            Ok(Some(_))
        );
        self.synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(gvr.to_string(), (known, Instant::now()));
        known
    }

    /// A passive signal: a request to the coordinator got no answer in time.
    pub fn note_unanswered(&self, what: &str) {
        self.set_error(format!("{what}: no answer in time"));
    }

    /// Probes the coordinator until `stop`; only ever marks it unhealthy (fast), the sync
    /// loop marks it healthy once it has read the coordinator's epoch again.
    async fn probe_forever(self: Arc<Self>, client: Client, mut stop: watch::Receiver<bool>) {
        let mut failures = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let mut kv = client.kv_client();
            // A read that failed at once is tried again at once: the client may have sent
            // it to a member that just died, before `endpoints` takes that one out.
            let mut answered = false;
            for _ in 0..2 {
                match tokio::time::timeout(PROBE_TIMEOUT, kv.get(EPOCH_KEY, None)).await {
                    Ok(Ok(_)) => answered = true,
                    Ok(Err(_)) => continue,
                    Err(_) => {}
                }
                break;
            }
            failures = if answered { 0 } else { failures + 1 };
            if failures >= PROBE_FAILURES && self.healthy() {
                self.set_error(format!("health probe failed {failures} times in a row"));
            }
        }
    }

    fn set_error(&self, e: String) {
        if self.healthy.swap(false, Ordering::SeqCst) {
            tracing::info!("coordinator unreachable: {e}");
        } else {
            tracing::warn!("coordinator: {e}");
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error = Some(e);
    }

    /// Client TLS for the members, when the coordinator is reached over https.
    fn tls(&self) -> Result<Option<etcd_client::TlsOptions>, String> {
        let c = &self.config.coordinator;
        match &c.ca_file {
            Some(ca) => storage::tls_options(ca, c.cert_file.as_deref().zip(c.key_file.as_deref()))
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    /// A round of pushes (or the membership record) failed: pushes are retried next
    /// round from the node's cache; reads are judged by the probe alone.
    fn set_push_error(&self, e: String) {
        if self.pushes_healthy.swap(false, Ordering::SeqCst) {
            tracing::info!("coordinator: pushes failing (reads unaffected): {e}");
        } else {
            tracing::debug!("coordinator: push failed again: {e}");
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_push_error = Some(e);
    }

    fn pushes_ok(&self) {
        if !self.pushes_healthy.swap(true, Ordering::SeqCst) {
            tracing::info!("coordinator: pushes succeed");
        }
    }

    async fn connect(&self) -> Result<(), String> {
        let c = &self.config.coordinator;
        let client = storage::connect(&c.endpoints, self.tls()?, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        let owned = Owned::open(&self.config.cache.dir).map_err(|e| e.to_string())?;
        let limits = Limits {
            max_txn_ops: c.max_txn_ops,
            max_request_bytes: c.max_request_bytes,
        };
        let storage = Storage::open(&client, &c.prefix, owned, limits)
            .await
            .map_err(|e| e.to_string())?;
        let _ = self.storage.set((client, Arc::new(storage)));
        Ok(())
    }

    /// Reads the coordinator's epoch, creating it if missing (one Txn); with the etcd
    /// cluster id, this names the coordinator's current life. Every hub asks every
    /// second, so the usual case is a plain read: a Txn, even one that writes nothing,
    /// is a raft proposal every member logs (50 idle hubs cost ~95 KB/s of WAL that way).
    async fn epoch(&self, client: &Client) -> Result<(String, u64), String> {
        let got = client
            .kv_client()
            .get(EPOCH_KEY, None)
            .await
            .map_err(|e| e.to_string())?;
        let cluster = got.header().map_or(0, |h| h.cluster_id());
        if let Some(kv) = got.kvs().first() {
            return Ok((String::from_utf8_lossy(kv.value()).into_owned(), cluster));
        }
        let fresh = format!("{}-{}", self.config.node_name, store::now());
        let txn = Txn::new()
            .when([Compare::version(EPOCH_KEY, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(EPOCH_KEY, fresh.clone(), None)])
            .or_else([TxnOp::get(EPOCH_KEY, None)]);
        let resp = client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| e.to_string())?;
        let cluster = resp.header().map_or(0, |h| h.cluster_id());
        if resp.succeeded() {
            return Ok((fresh, cluster));
        }
        match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), cluster))
                .ok_or_else(|| "epoch key vanished".to_string()),
            _ => Err("unexpected answer reading the epoch".into()),
        }
    }

    /// Pushes every (component, resource) set of the node's cache that changed since it was
    /// last pushed; everything again when the coordinator's life changed.
    async fn sync_once(
        &self,
        cache: &Cache,
        pushed: &mut HashMap<(String, String), Fingerprint>,
        life: &mut Option<(String, u64)>,
        seen_generation: &mut Option<(u64, Instant)>,
    ) -> Result<(), String> {
        let Some((client, storage)) = self.storage.get() else {
            return Err("not connected".into());
        };
        let now_life = self.epoch(client).await?;
        if life.as_ref() != Some(&now_life) {
            if life.is_some() {
                // Every hub of the pool notices a rebuild within the same second: spread
                // their full pushes so they do not all land on the new etcd at once.
                let spread = repush_spread(&self.config.node_name);
                tracing::info!(
                    epoch = now_life.0,
                    delay_ms = spread.as_millis() as u64,
                    "coordinator rebuilt or replaced: pushing everything again"
                );
                tokio::time::sleep(spread).await;
            }
            pushed.clear();
            // What was known of the previous life is void: the leader lists again, and
            // followers wait for its new markers.
            self.lives.fetch_add(1, Ordering::SeqCst);
            self.synced
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            s.full_pushes += 1;
            s.epoch = now_life.0.clone();
            s.cluster_id = now_life.1;
            *life = Some(now_life);
        }
        if !self.healthy.swap(true, Ordering::SeqCst) {
            tracing::info!("coordinator reachable again");
        }
        // Nothing changed in the cache since everything was pushed: nothing to read —
        // except now and then, for objects that aged out.
        let generation = cache.generation();
        let rescan = Duration::from_secs(self.config.coordinator.get_object_ttl_seconds.min(60));
        if let Some((seen, at)) = *seen_generation
            && seen == generation
            && at.elapsed() < rescan
            && !pushed.is_empty()
        {
            return Ok(());
        }
        let cache_store = cache.store().clone();
        let records = tokio::task::spawn_blocking(move || cache_store.scan(b"node\0"))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        // Objects only a GET brought, unchanged for longer than the TTL, leave the pool
        // (the node's own cache keeps them).
        let ttl = self.config.coordinator.get_object_ttl_seconds;
        let mut sets = sets_of(records, store::now().saturating_sub(ttl));
        // Sets that emptied are pushed as empty sets, so their keys are released too.
        for k in pushed.keys() {
            sets.entry(k.clone()).or_default();
        }
        let not_pushed = &self.config.coordinator.not_pushed;
        let started = Instant::now();
        let mut pushed_now = false;
        let (pool, node) = (self.pool_name(), self.config.node_name.clone());
        for ((component, gvr), mut set) in sets {
            if not_pushed.contains(&gvr) {
                // Kept to this node by configuration: nothing of it goes to the pool, and
                // what was pushed of it before is released.
                set = Set::default();
            } else if self.config.coordinator.pool_scope_resources.contains(&gvr)
                && self.leader_synced(storage, &gvr).await
            {
                // The leader's sync owns this resource in the coordinator (in JSON): this
                // hub adds nothing, releases what it pushed before, and fetches nothing.
                set = Set::default();
            }
            let print = Fingerprint::of(&set.live);
            let id = (component.clone(), gvr.clone());
            let before = pushed.get(&id).copied();
            if before == Some(print) {
                continue;
            }
            let Some(resource) = resource_of(&gvr) else {
                continue;
            };
            // In kube-apiserver's storage encoding, converted here: every client of the pool
            // gets its own encoding from it, and the cloud is asked for nothing.
            let live = self.for_storage(set.live);
            let as_objects = |items: &[Item]| -> Vec<Object> {
                items
                    .iter()
                    .map(|i| Object {
                        namespace: (!i.namespace.is_empty()).then(|| i.namespace.clone()),
                        name: i.name.clone(),
                        rv: i.rv,
                        // JSON as is, protobuf in its `k8s\0` envelope (as kube-apiserver
                        // stores it).
                        value: i.encoded(),
                    })
                    .collect()
            };
            let record = gc::set_key(&pool, &node, &component, &gvr);
            let names_changed = before.is_none_or(|b| b.names != print.names);
            let r = storage
                .push_set(
                    &component,
                    &resource,
                    &as_objects(&live),
                    &as_objects(&set.deleted),
                    names_changed.then_some(record.as_str()),
                )
                .await
                .map_err(|e| format!("pushing {component} {gvr}: {e}"))?;
            pushed.insert(id, print);
            pushed_now = true;
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            s.lists_pushed += 1;
            s.objects_written += r.written as u64;
            s.stale_dropped += r.stale as u64;
        }
        if pushed_now {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            s.last_push_ms = started.elapsed().as_millis() as u64;
            s.last_error = None;
        }
        *seen_generation = Some((generation, Instant::now()));
        Ok(())
    }

    /// `items` in kube-apiserver's storage encoding (protobuf where a schema converts
    /// them), counted in the status.
    fn for_storage(&self, items: Vec<Item>) -> Vec<Item> {
        let (mut converted, mut json) = (0, 0);
        let out = items
            .into_iter()
            .map(|i| {
                let was = i.encoding;
                let (stored, not_converted) = i.for_storage();
                if let Some(e) = not_converted {
                    tracing::warn!("{}/{}: pushed as JSON: {e}", stored.namespace, stored.name);
                }
                if stored.encoding == Encoding::Json {
                    json += 1;
                } else if was == Encoding::Json {
                    converted += 1;
                }
                stored
            })
            .collect();
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.converted_for_storage += converted;
        s.stored_as_json += json;
        out
    }

    /// Whether this hub leads the pool (it competes while the cloud and the coordinator
    /// are both healthy).
    pub fn is_leader(&self) -> bool {
        self.election.get().is_some_and(|e| e.is_leader())
    }

    /// Connects (retrying with backoff), joins the pool's leader election, and keeps the
    /// coordinator in step with the node's cache until `stop`.
    pub async fn run(
        self: Arc<Self>,
        cache: Arc<Cache>,
        cloud: Arc<Cloud>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut backoff = Duration::from_millis(200);
        // Hubs of a pool start together after a power cut: spread their first push.
        let jitter = Duration::from_millis(u64::from(store::now() as u32 % 500));
        tokio::time::sleep(jitter).await;
        while self.storage.get().is_none() {
            if let Err(e) = self.connect().await {
                self.set_error(format!("cannot connect: {e}"));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
        if let Some((client, _)) = self.storage.get() {
            let election = Arc::new(Election::new(
                client.clone(),
                self.config.pool_name.as_deref().unwrap_or_default(),
                &self.config.node_name,
                Duration::from_secs(self.config.coordinator.leader_lease_seconds),
            ));
            let _ = self.election.set(election.clone());
            let me = self.clone();
            let eligible = Arc::new(move || cloud.healthy() && me.healthy());
            tokio::spawn(election.run(eligible, stop.clone()));
            tokio::spawn(self.clone().probe_forever(client.clone(), stop.clone()));
            let c = &self.config.coordinator;
            // Connecting already succeeded with these TLS options.
            let tls = self.tls().ok().flatten();
            let me = self.clone();
            let report = move |down: Vec<String>| {
                me.status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .members_down = down;
            };
            tokio::spawn(members::tend(
                client.clone(),
                c.endpoints.clone(),
                tls,
                report,
                stop.clone(),
            ));
            let schedule = gc::Schedule {
                interval: Duration::from_secs(c.gc_interval_seconds),
                grace: Duration::from_secs(c.node_grace_seconds),
                tombstone_ttl: Duration::from_secs(c.tombstone_ttl_seconds),
            };
            tokio::spawn(gc::run(self.clone(), schedule, stop.clone()));
        }
        let _ = self.live.set(cache.live().clone());
        let mut pushed = HashMap::new();
        let (mut life, mut generation, mut member) = (None, None, None);
        let mut sharing = live_pods::Sharing::default();
        loop {
            let client = self
                .storage
                .get()
                .map(|(c, s)| (c.clone(), s.max_txn_ops()));
            let result = match &client {
                Some((c, _)) => self.keep_membership(c, &mut member).await,
                None => Ok(()),
            };
            let pushed_all = self
                .sync_once(&cache, &mut pushed, &mut life, &mut generation)
                .await;
            // The node's live pod state goes to the pool even when a push failed.
            let shared = match (&client, &member) {
                (Some((c, max_ops)), Some(lease)) => {
                    let (pool, node) = (self.pool_name(), &self.config.node_name);
                    sharing
                        .round(c, &pool, node, lease.id, *max_ops, cache.live())
                        .await
                }
                _ => Ok(()),
            };
            match result.and(pushed_all).and(shared) {
                Ok(()) => self.pushes_ok(),
                Err(e) => self.set_push_error(e),
            }
            tokio::select! {
                _ = tokio::time::sleep(SYNC_EVERY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Answers a get, list or watch for the whole pool from the coordinator. With
    /// `leader_data_only` (the cloud is up and this hub follows), only resources a leader
    /// has synced are answered; the rest fall through to the cloud.
    pub async fn serve(
        &self,
        info: &RequestInfo,
        query: &str,
        accept: &str,
        leader_data_only: bool,
        keep_open: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Response<ProxyBody>, String> {
        if !self.healthy() {
            return Err("unreachable".into());
        }
        let Some(storage) = self.storage() else {
            return Err("not connected".into());
        };
        if !info.is_resource
            || !info.subresource.is_empty()
            || !matches!(info.verb, "get" | "list" | "watch")
        {
            return Err(format!(
                "{} is not answered from the coordinator",
                info.verb
            ));
        }
        let gvr = info.gvr();
        if leader_data_only && !self.leader_synced(&storage, &gvr).await {
            return Err(format!("no leader has synced {gvr} yet"));
        }
        let source = if leader_data_only {
            FROM_POOL_LEADER
        } else {
            FROM_COORDINATOR
        };
        let resource = Resource {
            group: info.group.clone(),
            resource: info.resource.clone(),
        };
        // EndpointSlices and Endpoints follow the pods as this node knows them now.
        let follows = endpoints::Kind::of(&gvr).zip(self.live.get().cloned());
        if info.verb == "watch" {
            return coordinator_watch::serve(
                storage, resource, info, query, accept, source, keep_open, follows,
            )
            .await;
        }
        let (values, rv) = read_stored(&storage, &resource, info)
            .await
            .map_err(|e| e.to_string())?;
        if values.is_empty() && !leader_data_only {
            return Err(format!("the pool holds no {}", info.resource));
        }
        let mut items: Vec<Item> = values
            .iter()
            .filter_map(|v| coordinator_watch::parse_stored(&info.resource, v))
            .collect();
        let mut rv = rv;
        if let Some((kind, live)) = follows {
            let ns = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
            if let Some(floor) = live_pods::follow(&live, &storage, kind, ns, &mut items).await {
                rv = rv.min(floor);
            }
        }
        if info.verb == "get" && items.is_empty() {
            return Ok(crate::proxy::forward::status(
                hyper::StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{} {:?} not found", info.resource, info.name),
            ));
        }
        answer_from(source, items, rv, info, query, accept)
    }
}

/// The stored values a get or list asks for, and the resourceVersion they stand at: a
/// list at the newest version the coordinator knows in its scope, deletions included, as
/// a cloud list would.
async fn read_stored(
    storage: &Storage,
    resource: &Resource,
    info: &RequestInfo,
) -> Result<(Vec<Vec<u8>>, u64), storage::StorageError> {
    let ns = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
    if info.verb == "get" {
        return Ok(match storage.get(resource, ns, &info.name).await? {
            Some((rv, v)) => (vec![v], rv),
            None => (vec![], 0),
        });
    }
    let snap = storage.snapshot(resource, ns).await?;
    let rv = snap
        .versions
        .iter()
        .map(|(_, rv, _)| *rv)
        .max()
        .unwrap_or(0);
    Ok((snap.objects.into_iter().map(|(_, v)| v).collect(), rv))
}

impl gc::Sweeps for Pool {
    fn storage(&self) -> Option<Arc<Storage>> {
        Pool::storage(self)
    }
    fn is_leader(&self) -> bool {
        Pool::is_leader(self)
    }
    fn pool_name(&self) -> String {
        Pool::pool_name(self)
    }
    fn pool_scope(&self) -> Vec<String> {
        Pool::pool_scope(self)
    }
    fn count_gc(&self, count: &mut dyn FnMut(&mut GcStatus)) {
        self.count_status(|s| count(&mut s.gc));
    }
    fn note_leader_error(&self, e: String) {
        Pool::note_leader_error(self, e);
    }
}

impl leader::Leads for Pool {
    fn storage(&self) -> Option<Arc<Storage>> {
        Pool::storage(self)
    }
    fn is_leader(&self) -> bool {
        Pool::is_leader(self)
    }
    fn life(&self) -> u64 {
        Pool::life(self)
    }
    fn note_leader_error(&self, e: String) {
        Pool::note_leader_error(self, e);
    }
    fn count(&self, what: leader::Counted) {
        self.count_status(|s| match what {
            leader::Counted::List => s.leader_lists += 1,
            leader::Counted::Event => s.leader_events += 1,
            leader::Counted::Stale => s.leader_stale += 1,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(gvr: &str, name: &str, deleted: bool, left_selection: bool) -> (ObjectKey, Record) {
        let item = Item {
            name: name.into(),
            namespace: "default".into(),
            rv: 7,
            labels: vec![],
            fields: vec![],
            api_version: "v1".into(),
            kind: "Pod".into(),
            encoding: Encoding::Json,
            body: b"{}".to_vec(),
        };
        let key = ObjectKey {
            credential: "node".into(),
            gvr: gvr.into(),
            namespace: "default".into(),
            name: name.into(),
            component: "kubelet".into(),
        };
        let mut rec = Record::live(item, false, 100);
        rec.deleted = deleted;
        rec.left_selection = left_selection;
        (key, rec)
    }

    #[test]
    fn only_cloud_deletions_are_pushed_as_deletions() {
        let mut aged = record("/v1/pods", "got-once", false, false);
        aged.1.one_off = true;
        let sets = sets_of(
            vec![
                record("/v1/pods", "live", false, false),
                record("/v1/pods", "deleted", true, false),
                record("/v1/pods", "relabelled", true, true),
                record("/v1/secrets", "token", false, false),
                aged,
            ],
            200,
        );
        assert_eq!(sets.len(), 1, "secrets never leave the node");
        let pods = &sets[&("kubelet".to_string(), "/v1/pods".to_string())];
        let names = |items: &[Item]| items.iter().map(|i| i.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&pods.live), ["live"]);
        assert_eq!(names(&pods.deleted), ["deleted"]);
    }
}
