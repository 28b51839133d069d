//! The coordinator's storage operations on the pool's etcd (seed 003, done right): objects
//! under kube-apiserver's key layout, **every operation exactly one etcd Txn**, freshness
//! decided inside that Txn by the cloud resourceVersion — never by a get-then-put.
//!
//! etcd can only compare a key's whole value, so each object key has a companion key
//! outside the kube-apiserver prefix, `<meta>/rv<object key>`, holding the object's cloud
//! resourceVersion zero-padded to 20 digits (string order = number order); a deletion
//! leaves `<rv>d` there, a tombstone that keeps an older write from bringing the object
//! back. Per object, the Txn is:
//!
//! ```text
//! if value(rv key) > at_least(rv)  -> get rv key            (equal: no-op; newer: conflict)
//! else (older, or no rv key)       -> put object, put rv    (new or fresher)
//! ```
//!
//! Objects are stored as the cloud sent them: JSON with apiVersion and kind set, or
//! Kubernetes protobuf in its `k8s\0` envelope — what kube-apiserver itself writes for
//! built-in kinds; kinds the hub does not know (CRDs) are JSON under
//! `<prefix>/<group>/<resource>/…`. Which keys this hub's components own is kept locally
//! (`owned`), behind write-ahead intents reconciled at every start.
use std::{collections::HashSet, sync::Mutex, time::Duration};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchClient, WatchOptions, WatchStream,
};

use super::{
    keys::{self, KeyError},
    owned::{Intent, Owned, OwnedError},
};

/// Where the companion resourceVersion keys live (outside kube-apiserver's prefix).
pub const META_PREFIX: &str = "/hub/rv";

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error(transparent)]
    Local(#[from] OwnedError),
    #[error(
        "{what} needs {ops} operations in one etcd Txn, over coordinator.maxTxnOps ({limit}); nothing was written"
    )]
    TooManyOps {
        what: String,
        ops: usize,
        limit: usize,
    },
    #[error(
        "{what} is {bytes} bytes in one etcd Txn, over coordinator.maxRequestBytes ({limit}); nothing was written"
    )]
    TooLarge {
        what: String,
        bytes: usize,
        limit: usize,
    },
    #[error("{0} already exists in the coordinator")]
    Exists(String),
    #[error(
        "conflict on {key}: the coordinator holds resourceVersion {stored}, newer than {offered}"
    )]
    Conflict {
        key: String,
        stored: u64,
        offered: u64,
    },
    #[error("an answer from etcd did not have the expected shape")]
    Shape,
    #[error("coordinator TLS: {0}")]
    Tls(String),
    #[error("injected failure at {0:?}")]
    Injected(Step),
}

/// The points where tests stop an operation, as a crash would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The intent is durable, etcd not yet written.
    AfterIntent,
    /// The first Txn of an operation sent in several committed, the rest not sent.
    AfterFirstChunk,
    /// The Txn committed, ownership not yet updated.
    AfterTxn,
}

/// The request limits of the coordinator's etcd (its --max-txn-ops and
/// --max-request-bytes). Configured values are hints: a set larger than one request
/// allows is sent in several, and a refusal by etcd lowers them (to etcd's defaults, then
/// by halves). One object larger than a request allows is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_txn_ops: usize,
    pub max_request_bytes: usize,
}

/// etcd's own defaults: what an etcd started without flags accepts.
pub const ETCD_DEFAULT_LIMITS: Limits = Limits {
    max_txn_ops: 128,
    max_request_bytes: 1536 * 1024,
};
/// Room left in a request for the Txn's framing beside its operations' keys and values:
/// this much, or an eighth of a small limit.
const REQUEST_OVERHEAD: usize = 4096;

fn overhead(max_request_bytes: usize) -> usize {
    REQUEST_OVERHEAD.min(max_request_bytes / 8)
}

impl Limits {
    /// The limits after etcd refused a request for being over `which` of them.
    fn lowered(self, which: Refusal) -> Limits {
        let lower = |cur: usize, default: usize, floor: usize| {
            if cur > default {
                default
            } else {
                (cur / 2).max(floor)
            }
        };
        match which {
            Refusal::TooManyOps => Limits {
                max_txn_ops: lower(self.max_txn_ops, ETCD_DEFAULT_LIMITS.max_txn_ops, 4),
                ..self
            },
            Refusal::TooLarge => Limits {
                max_request_bytes: lower(
                    self.max_request_bytes,
                    ETCD_DEFAULT_LIMITS.max_request_bytes,
                    2 * REQUEST_OVERHEAD,
                ),
                ..self
            },
        }
    }
}

/// Which of its limits etcd said a request was over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    TooManyOps,
    TooLarge,
}

/// Reads etcd's refusal of a request over its limits ("etcdserver: too many operations
/// in txn request", "etcdserver: request is too large", or gRPC's own size check).
fn refusal(e: &etcd_client::Error) -> Option<Refusal> {
    let text = e.to_string();
    if text.contains("too many operations in txn request") {
        Some(Refusal::TooManyOps)
    } else if text.contains("request is too large") || text.contains("larger than max") {
        Some(Refusal::TooLarge)
    } else {
        None
    }
}

/// The resource an operation is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub group: String,
    pub resource: String,
}

/// (group, version, resource) of a `group/version/resource` name (`/v1/pods` for core).
pub fn split_gvr(gvr: &str) -> Option<(&str, &str, &str)> {
    let mut p = gvr.splitn(3, '/');
    Some((p.next()?, p.next()?, p.next()?))
}

pub fn resource_of(gvr: &str) -> Option<Resource> {
    let (group, _version, resource) = split_gvr(gvr)?;
    Some(Resource {
        group: group.into(),
        resource: resource.into(),
    })
}

/// One object as the cloud returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// None for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
    /// The cloud's resourceVersion.
    pub rv: u64,
    /// JSON (apiVersion and kind set) or `k8s\0` protobuf.
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stored (it was new or fresher).
    Written,
    /// The coordinator already holds this resourceVersion.
    Unchanged,
    /// The coordinator holds a newer resourceVersion: this one was dropped.
    Stale { stored: u64 },
}

/// A scope of the coordinator read at one etcd revision.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub revision: i64,
    /// (object key, stored value).
    pub objects: Vec<(String, Vec<u8>)>,
    /// (object key, cloud resourceVersion, deleted) for every key known, deletions too.
    pub versions: Vec<(String, u64, bool)>,
}

/// What a ReplaceComponentList did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    pub written: usize,
    pub unchanged: usize,
    pub stale: usize,
    pub deleted: usize,
    /// The etcd revision of the one Txn.
    pub revision: i64,
}

fn pad(rv: u64) -> String {
    format!("{rv:020}")
}

/// A deletion's companion value: the resourceVersion, `d`, and when it was written (unix
/// seconds) so the pool's sweep can drop it once no write that old can still arrive.
/// Comparisons only ever look at the first 21 bytes.
fn tombstone(rv: u64) -> String {
    format!("{rv:020}d{}", crate::cache::store::now())
}

/// When a companion value is a tombstone: the unix time it was written (0 if unknown).
pub fn deleted_at(v: &[u8]) -> Option<u64> {
    (v.get(20) == Some(&b'd'))
        .then(|| std::str::from_utf8(&v[21..]).ok()?.parse().ok())
        .map(|t| t.unwrap_or(0))
}

/// The resourceVersion in a companion key's value (object or tombstone).
fn parse_rv(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v.get(..20)?).ok()?.parse().ok()
}

/// About what putting `value` under `key` (and its companion key) adds to a Txn request.
fn put_bytes(key: &str, value: &[u8]) -> usize {
    value.len() + 2 * key.len() + 64
}

pub fn rv_key(key: &str) -> String {
    format!("{META_PREFIX}{key}")
}

/// Operations of the per-object Txn (`guarded`) that count against etcd's max-txn-ops.
const NESTED_OPS: usize = 2;

/// A value that sorts after every companion value below `rv` and before every one at or
/// above it: `value(rv key) > at_least(rv)` means "the stored state is not older than rv"
/// (values are `pad(x)` or `pad(x)d`, and `pad(rv-1)d < pad(rv-1)z < pad(rv)`). It lets one
/// comparison say it, so each object's bytes appear once in a Txn.
fn at_least(rv: u64) -> String {
    match rv.checked_sub(1) {
        Some(r) => format!("{r:020}z"),
        None => String::new(),
    }
}

/// Skips (reading the stored resourceVersion) when `rv key` already holds `rv` or newer;
/// otherwise — newer, or no such key — applies `writes`.
fn guarded(key: &str, rv: u64, writes: Vec<TxnOp>) -> Txn {
    let rk = rv_key(key);
    Txn::new()
        .when([Compare::value(
            rk.as_str(),
            CompareOp::Greater,
            at_least(rv),
        )])
        .and_then([TxnOp::get(rk.as_str(), None)])
        .or_else(writes)
}

/// Put if new or fresher.
fn upsert_txn(key: &str, rv: u64, value: &[u8]) -> Txn {
    guarded(
        key,
        rv,
        vec![
            TxnOp::put(key, value.to_vec(), None),
            TxnOp::put(rv_key(key), pad(rv), None),
        ],
    )
}

/// Delete, leaving a tombstone, unless the stored state is newer than `rv`.
fn delete_txn(key: &str, rv: u64) -> Txn {
    guarded(
        key,
        rv + 1,
        vec![
            TxnOp::delete(key, None),
            TxnOp::put(rv_key(key), tombstone(rv), None),
        ],
    )
}

/// The operations of a set, each with the request bytes it adds: each object's guarded
/// upsert (`put` holds their keys), then each guarded deletion, then one plain put (a
/// record or marker), if any — last, so it is written only once everything else is.
fn set_ops(
    objects: &[Object],
    put: &[(String, u64)],
    delete: &[(String, u64)],
    extra: Option<(&str, &str)>,
) -> Vec<(TxnOp, usize)> {
    let mut ops: Vec<(TxnOp, usize)> = objects
        .iter()
        .zip(put)
        .map(|(o, (k, _))| {
            (
                TxnOp::txn(upsert_txn(k, o.rv, &o.value)),
                put_bytes(k, &o.value),
            )
        })
        .collect();
    ops.extend(
        delete
            .iter()
            .map(|(k, rv)| (TxnOp::txn(delete_txn(k, *rv)), delete_bytes(k))),
    );
    if let Some((key, value)) = extra {
        ops.push((TxnOp::put(key, value, None), key.len() + value.len()));
    }
    ops
}

/// The request bytes of one guarded deletion.
fn delete_bytes(key: &str) -> usize {
    2 * key.len() + 64
}

/// Reads the outcome of a `guarded` Txn's answer.
fn outcome(resp: &TxnResponse, offered: u64) -> Result<Outcome, StorageError> {
    if !resp.succeeded() {
        return Ok(Outcome::Written);
    }
    let stored = match resp.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().and_then(|kv| parse_rv(kv.value())),
        _ => None,
    }
    .ok_or(StorageError::Shape)?;
    Ok(if stored == offered {
        Outcome::Unchanged
    } else {
        Outcome::Stale { stored }
    })
}

/// The member did not answer (down, refused, timed out): another may.
fn unreachable(e: &etcd_client::Error) -> bool {
    // gRPC codes: 1 cancelled, 4 deadline exceeded, 14 unavailable.
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(i32::from(s.code()), 1 | 4 | 14),
        _ => false,
    }
}

pub struct Storage {
    kv: KvClient,
    watch: WatchClient,
    prefix: String,
    owned: Owned,
    /// What etcd accepts in one request: the configured hints, lowered when etcd refuses.
    limits: Mutex<Limits>,
    fail_at: Mutex<Option<Step>>,
    /// A Txn failed without an answer: its intent waits to be reconciled.
    unreconciled: std::sync::atomic::AtomicBool,
}

/// Connects to the pool's etcd (several endpoints are balanced by the client; it reconnects
/// by itself). Requests are not queued in memory while etcd is unreachable: each fails
/// after `timeout`, so callers keep their own (durable) backlog.
pub async fn connect(
    endpoints: &[String],
    tls: Option<etcd_client::TlsOptions>,
    timeout: Duration,
) -> Result<Client, StorageError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3));
    if let Some(t) = tls {
        opts = opts.with_tls(t);
    }
    Ok(Client::connect(endpoints, Some(opts)).await?)
}

/// Client TLS for https endpoints: the members' CA and, when given, this node's own client
/// certificate (one identity per node, never a shared admin certificate).
pub fn tls_options(
    ca_file: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<etcd_client::TlsOptions, StorageError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| StorageError::Tls(format!("{}: {e}", p.display())))
    };
    let mut tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(ca_file)?));
    if let Some((cert, key)) = identity {
        tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(tls)
}

impl Storage {
    /// Storage over `client`, with this hub's ownership store; intents left by a crash are
    /// reconciled before it returns.
    pub async fn open(
        client: &Client,
        prefix: &str,
        owned: Owned,
        limits: Limits,
    ) -> Result<Storage, StorageError> {
        let kv = client
            .kv_client()
            .max_decoding_message_size(limits.max_request_bytes.max(4 << 20) * 2)
            .max_encoding_message_size(limits.max_request_bytes.max(4 << 20) * 2);
        let s = Storage {
            kv,
            watch: client.watch_client(),
            prefix: prefix.to_string(),
            owned,
            limits: Mutex::new(limits),
            fail_at: Mutex::new(None),
            unreconciled: std::sync::atomic::AtomicBool::new(false),
        };
        s.reconcile().await?;
        Ok(s)
    }

    /// Makes the next mutating operation stop at `step`, as a crash there would (tests).
    pub fn fail_next_at(&self, step: Option<Step>) {
        *self.fail_at.lock().unwrap_or_else(|p| p.into_inner()) = step;
    }

    fn failpoint(&self, step: Step) -> Result<(), StorageError> {
        let mut f = self.fail_at.lock().unwrap_or_else(|p| p.into_inner());
        if *f == Some(step) {
            *f = None;
            return Err(StorageError::Injected(step));
        }
        Ok(())
    }

    /// The key prefix of a resource's objects (in one namespace, or all).
    pub fn scope(&self, r: &Resource, namespace: Option<&str>) -> Result<String, KeyError> {
        keys::range_prefix(&self.prefix, &r.group, &r.resource, namespace)
    }

    fn key(&self, r: &Resource, namespace: Option<&str>, name: &str) -> Result<String, KeyError> {
        keys::object_key(&self.prefix, &r.group, &r.resource, namespace, name)
    }

    /// The limits as learned so far.
    pub fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lowers the limits after etcd refused a request over one of them.
    fn learn(&self, which: Refusal) -> Limits {
        let mut l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let lowered = l.lowered(which);
        if lowered != *l {
            tracing::info!(
                max_txn_ops = lowered.max_txn_ops,
                max_request_bytes = lowered.max_request_bytes,
                "coordinator: etcd refused a request over its limits ({which:?}); sending smaller ones"
            );
            *l = lowered;
        }
        lowered
    }

    /// For an operation on one object, which cannot be split.
    fn check_limits(&self, what: &str, ops: usize, bytes: usize) -> Result<(), StorageError> {
        let limits = self.limits();
        if ops > limits.max_txn_ops {
            return Err(StorageError::TooManyOps {
                what: what.into(),
                ops,
                limit: limits.max_txn_ops,
            });
        }
        if bytes > limits.max_request_bytes {
            return Err(StorageError::TooLarge {
                what: what.into(),
                bytes,
                limit: limits.max_request_bytes,
            });
        }
        Ok(())
    }

    /// Sends a Txn, again on another member if the one tried was unreachable. Resending is
    /// safe: every Txn here is idempotent (an equal resourceVersion is a no-op, a deletion
    /// leaves the same tombstone), so one that did commit before the error changes nothing.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StorageError> {
        let mut last = None;
        for wait_ms in [0, 50, 250, 1000] {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            match self.kv.clone().txn(txn.clone()).await {
                Ok(r) => return Ok(r),
                Err(e) if unreachable(&e) => last = Some(e),
                Err(e) => {
                    if let Some(which) = refusal(&e) {
                        self.learn(which);
                    }
                    return Err(e.into());
                }
            }
        }
        Err(last.map_or(StorageError::Shape, StorageError::Etcd))
    }

    /// Runs one Txn for an operation whose ownership change is described by `intent`.
    /// When etcd gives no answer the Txn may or may not have committed: the intent stays,
    /// and is reconciled before the next operation (or at the next start).
    async fn run(&self, intent: &Intent, txn: Txn) -> Result<(u64, TxnResponse), StorageError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.unreconciled.load(SeqCst) {
            self.reconcile().await?;
            self.unreconciled.store(false, SeqCst);
        }
        let id = self.owned.begin(intent)?;
        self.failpoint(Step::AfterIntent)?;
        let resp = self
            .txn(txn)
            .await
            .inspect_err(|_| self.unreconciled.store(true, SeqCst))?;
        self.failpoint(Step::AfterTxn)?;
        Ok((id, resp))
    }

    /// Like `run`, for an operation on a set: its operations go in as few Txns as etcd's
    /// limits allow (`send_chunked`). Each is freshness-guarded and idempotent, so any
    /// prefix of them is a state the cloud had; the set's record or marker comes last. An
    /// interruption leaves the intent, reconciled before the next operation or at start.
    async fn run_chunked(
        &self,
        intent: &Intent,
        ops: Vec<(TxnOp, usize)>,
    ) -> Result<(u64, Vec<TxnOpResponse>, i64), StorageError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.unreconciled.load(SeqCst) {
            self.reconcile().await?;
            self.unreconciled.store(false, SeqCst);
        }
        let id = self.owned.begin(intent)?;
        self.failpoint(Step::AfterIntent)?;
        let (answers, revision) = self
            .send_chunked(ops)
            .await
            .inspect_err(|_| self.unreconciled.store(true, SeqCst))?;
        self.failpoint(Step::AfterTxn)?;
        Ok((id, answers, revision))
    }

    /// Sends `ops` (each with the bytes it adds to a request) in order, in as few Txns as
    /// the limits allow: at most max_txn_ops - NESTED_OPS operations each (a nested Txn
    /// gets what its parent leaves) and max_request_bytes less some framing. A Txn etcd
    /// refuses for its size applied nothing: it is sent again, smaller. Returns every
    /// operation's answer, in order, and the last Txn's revision.
    async fn send_chunked(
        &self,
        ops: Vec<(TxnOp, usize)>,
    ) -> Result<(Vec<TxnOpResponse>, i64), StorageError> {
        let mut answers = Vec::with_capacity(ops.len());
        let (mut next, mut revision, mut sent) = (0, 0, 0);
        while next < ops.len() {
            let limits = self.limits();
            let max_ops = limits.max_txn_ops.saturating_sub(NESTED_OPS).max(1);
            let max_bytes = limits.max_request_bytes - overhead(limits.max_request_bytes);
            let (mut end, mut bytes) = (next, 0);
            while end < ops.len()
                && end - next < max_ops
                && (end == next || bytes + ops[end].1 <= max_bytes)
            {
                bytes += ops[end].1;
                end += 1;
            }
            let chunk: Vec<TxnOp> = ops[next..end].iter().map(|(op, _)| op.clone()).collect();
            match self.txn(Txn::new().and_then(chunk)).await {
                Ok(resp) => {
                    revision = resp.header().map_or(revision, |h| h.revision());
                    answers.extend(resp.op_responses());
                    next = end;
                    sent += 1;
                    if sent == 1 && next < ops.len() {
                        self.failpoint(Step::AfterFirstChunk)?;
                    }
                }
                // txn() lowered the limits: try again with a smaller Txn, if it can be.
                Err(StorageError::Etcd(e))
                    if refusal(&e).is_some() && end - next > 1 && self.limits() != limits => {}
                Err(e) => return Err(e),
            }
        }
        Ok((answers, revision))
    }

    /// Operations whose outcome is not yet reflected in the ownership store.
    pub fn unfinished(&self) -> Result<usize, StorageError> {
        Ok(self.owned.pending()?.len())
    }

    /// Stores a new object; an existing one is an error (a deleted one may come back with a
    /// newer resourceVersion).
    pub async fn create(
        &self,
        component: &str,
        r: &Resource,
        obj: &Object,
    ) -> Result<Outcome, StorageError> {
        let key = self.key(r, obj.namespace.as_deref(), &obj.name)?;
        self.check_limits("create", 2, put_bytes(&key, &obj.value))?;
        // The object must not exist; a deleted one may come back if this is fresher.
        let txn = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::get(rv_key(&key), None)])
            .or_else([TxnOp::txn(upsert_txn(&key, obj.rv, &obj.value))]);
        let intent = Intent {
            component: component.into(),
            put: vec![(key.clone(), obj.rv)],
            delete: vec![],
        };
        let (id, resp) = self.run(&intent, txn).await?;
        let result = if resp.succeeded() {
            Outcome::Unchanged
        } else {
            match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Txn(inner)) => outcome(&inner, obj.rv)?,
                _ => return Err(StorageError::Shape),
            }
        };
        let owned = match result {
            Outcome::Written => intent.put.clone(),
            _ => vec![],
        };
        self.owned.finish(id, component, &owned, &[])?;
        match result {
            Outcome::Written => Ok(Outcome::Written),
            _ => Err(StorageError::Exists(key)),
        }
    }

    /// Stores an object if it is new or fresher than what the coordinator holds.
    pub async fn update(
        &self,
        component: &str,
        r: &Resource,
        obj: &Object,
    ) -> Result<Outcome, StorageError> {
        let key = self.key(r, obj.namespace.as_deref(), &obj.name)?;
        self.check_limits("update", 2, put_bytes(&key, &obj.value))?;
        let intent = Intent {
            component: component.into(),
            put: vec![(key.clone(), obj.rv)],
            delete: vec![],
        };
        let (id, resp) = self
            .run(&intent, upsert_txn(&key, obj.rv, &obj.value))
            .await?;
        let result = outcome(&resp, obj.rv)?;
        // The component holds this object either way; a conflict is reported to the caller.
        self.owned.finish(id, component, &intent.put, &[])?;
        match result {
            Outcome::Stale { stored } => Err(StorageError::Conflict {
                key,
                stored,
                offered: obj.rv,
            }),
            o => Ok(o),
        }
    }

    /// Deletes an object as of the cloud resourceVersion `rv` (a newer stored state stays).
    pub async fn delete(
        &self,
        component: &str,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        rv: u64,
    ) -> Result<Outcome, StorageError> {
        let key = self.key(r, namespace, name)?;
        let intent = Intent {
            component: component.into(),
            put: vec![],
            delete: vec![(key.clone(), rv)],
        };
        let (id, resp) = self.run(&intent, delete_txn(&key, rv)).await?;
        let result = outcome(&resp, rv)?;
        self.owned.finish(id, component, &[], &[key])?;
        Ok(result)
    }

    /// One object and its stored resourceVersion.
    pub async fn get(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let key = self.key(r, namespace, name)?;
        let resp = self
            .txn(Txn::new().and_then([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(rv_key(&key), None),
            ]))
            .await?;
        let gets: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let value = gets
            .first()
            .and_then(|g| g.kvs().first())
            .map(|kv| kv.value().to_vec());
        let rv = gets
            .get(1)
            .and_then(|g| g.kvs().first())
            .and_then(|kv| parse_rv(kv.value()))
            .unwrap_or(0);
        Ok(value.map(|v| (rv, v)))
    }

    /// Every object of a resource (in one namespace, or all), as (key, value).
    pub async fn list(
        &self,
        r: &Resource,
        namespace: Option<&str>,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self.snapshot(r, namespace).await?.objects)
    }

    /// Everything a scope holds at one etcd revision: the objects, and the newest cloud
    /// resourceVersion of every key the coordinator knows, deletions included.
    pub async fn snapshot(
        &self,
        r: &Resource,
        namespace: Option<&str>,
    ) -> Result<Snapshot, StorageError> {
        let prefix = keys::range_prefix(&self.prefix, &r.group, &r.resource, namespace)?;
        let prefixed = || Some(GetOptions::new().with_prefix());
        let resp = self
            .txn(Txn::new().and_then([
                TxnOp::get(prefix.as_str(), prefixed()),
                TxnOp::get(rv_key(&prefix), prefixed()),
            ]))
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(objects), Some(versions)) = (gets.next(), gets.next()) else {
            return Err(StorageError::Shape);
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(Snapshot {
            revision,
            objects: objects
                .kvs()
                .iter()
                .map(|kv| (text(kv.key()), kv.value().to_vec()))
                .collect(),
            versions: versions
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let key = text(kv.key()).strip_prefix(META_PREFIX)?.to_string();
                    let rv = parse_rv(kv.value())?;
                    Some((key, rv, deleted_at(kv.value()).is_some()))
                })
                .collect(),
        })
    }

    /// A stream of every change to a scope's objects after `revision` (with the previous
    /// value of each, so deletions carry the object).
    pub async fn watch(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        revision: i64,
    ) -> Result<WatchStream, StorageError> {
        let prefix = keys::range_prefix(&self.prefix, &r.group, &r.resource, namespace)?;
        let opts = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(revision + 1);
        Ok(self.watch.clone().watch(prefix, Some(opts)).await?)
    }

    /// The cloud resourceVersion the coordinator holds for an object key (a deletion's
    /// tombstone included), or 0.
    pub async fn version_of(&self, key: &str) -> Result<u64, StorageError> {
        let resp = self
            .txn(Txn::new().and_then([TxnOp::get(rv_key(key), None)]))
            .await?;
        Ok(match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .and_then(|kv| parse_rv(kv.value()))
                .unwrap_or(0),
            _ => 0,
        })
    }

    /// A small bookkeeping value outside the object prefixes (markers of the pool).
    pub async fn put_meta(&self, key: &str, value: &str) -> Result<(), StorageError> {
        self.txn(Txn::new().and_then([TxnOp::put(key, value, None)]))
            .await?;
        Ok(())
    }

    pub async fn get_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        let resp = self
            .txn(Txn::new().and_then([TxnOp::get(key, None)]))
            .await?;
        Ok(match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        })
    }

    /// The keys a component owns (from the local ownership store).
    pub fn list_keys_of_component(&self, component: &str) -> Result<Vec<String>, StorageError> {
        Ok(self
            .owned
            .keys(component, "")?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Makes the coordinator hold exactly `objects` for this component's list of `r` (in
    /// `namespace`, or all): new and fresher objects are written, owned keys in that scope
    /// that the list no longer has are deleted as of `list_rv` (in as few Txns as etcd allows).
    pub async fn replace_component_list(
        &self,
        component: &str,
        r: &Resource,
        namespace: Option<&str>,
        list_rv: u64,
        objects: &[Object],
    ) -> Result<Replaced, StorageError> {
        self.replace(component, r, namespace, list_rv, objects, None)
            .await
    }

    /// Makes the coordinator hold exactly `objects` for the whole resource, whoever wrote
    /// the keys it no longer has: the complete, unfiltered list of the cloud at `list_rv`
    /// is the truth for every key not written since (those are kept by their newer
    /// resourceVersion). `marker` (key, value) is written in the same Txn.
    pub async fn replace_resource(
        &self,
        component: &str,
        r: &Resource,
        list_rv: u64,
        objects: &[Object],
        marker: (&str, &str),
    ) -> Result<Replaced, StorageError> {
        self.replace(component, r, None, list_rv, objects, Some(marker))
            .await
    }

    /// Pushes what one of this node's components holds of a resource (design.md §7):
    /// new and fresher `objects` are written; `deleted` — objects the node saw deleted in
    /// the cloud, with the deletion's resourceVersion — are deleted as of then; keys the
    /// component held before and holds no more for another reason are only released (the
    /// pool leader's sweep removes them once no live hub holds them). `record`, when given,
    /// is the key of this set's record, rewritten to list the keys the set holds (what the
    /// sweep reads) — the caller omits it when the names did not change. In as few Txns as
    /// etcd's limits allow, the record last.
    pub async fn push_set(
        &self,
        component: &str,
        r: &Resource,
        objects: &[Object],
        deleted: &[Object],
        record: Option<&str>,
    ) -> Result<Replaced, StorageError> {
        let mut put = Vec::with_capacity(objects.len());
        for o in objects {
            put.push((self.key(r, o.namespace.as_deref(), &o.name)?, o.rv));
        }
        let mut delete = Vec::with_capacity(deleted.len());
        for o in deleted {
            delete.push((self.key(r, o.namespace.as_deref(), &o.name)?, o.rv));
        }
        let listing = record.map(|key| {
            let keys: String = put.iter().map(|(k, _)| format!("{k}\n")).collect();
            (key, keys)
        });
        let scope = keys::range_prefix(&self.prefix, &r.group, &r.resource, None)?;
        let holding: HashSet<&str> = put.iter().map(|(k, _)| k.as_str()).collect();
        let released: Vec<String> = self
            .owned
            .keys(component, &scope)?
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !holding.contains(k.as_str()))
            .collect();
        let ops = set_ops(
            objects,
            &put,
            &delete,
            listing.as_ref().map(|(k, v)| (*k, v.as_str())),
        );
        let intent = Intent {
            component: component.into(),
            put,
            delete,
        };
        let (id, answers, revision) = self.run_chunked(&intent, ops).await?;
        let done = self.tally(&intent, answers, revision)?;
        self.owned.finish(id, component, &intent.put, &released)?;
        Ok(done)
    }

    /// Counts the outcomes of a Txn made of `intent`'s guarded puts, then its deletions.
    fn tally(
        &self,
        intent: &Intent,
        answers: Vec<TxnOpResponse>,
        revision: i64,
    ) -> Result<Replaced, StorageError> {
        let mut done = Replaced {
            revision,
            ..Default::default()
        };
        let per_object = intent.put.len() + intent.delete.len();
        for (i, r) in answers.into_iter().take(per_object).enumerate() {
            let TxnOpResponse::Txn(t) = r else {
                return Err(StorageError::Shape);
            };
            let deleting = i >= intent.put.len();
            let offered = if deleting {
                intent.delete[i - intent.put.len()].1
            } else {
                intent.put[i].1
            };
            match (outcome(&t, offered)?, deleting) {
                (Outcome::Written, true) => done.deleted += 1,
                (Outcome::Written, false) => done.written += 1,
                (Outcome::Unchanged, _) => done.unchanged += 1,
                (Outcome::Stale { .. }, _) => done.stale += 1,
            }
        }
        Ok(done)
    }

    async fn replace(
        &self,
        component: &str,
        r: &Resource,
        namespace: Option<&str>,
        list_rv: u64,
        objects: &[Object],
        whole_resource: Option<(&str, &str)>,
    ) -> Result<Replaced, StorageError> {
        let scope = keys::range_prefix(&self.prefix, &r.group, &r.resource, namespace)?;
        let mut put = Vec::with_capacity(objects.len());
        for o in objects {
            if namespace.is_some() && o.namespace.as_deref() != namespace {
                return Err(KeyError::Invalid {
                    what: "namespace",
                    value: o.namespace.clone().unwrap_or_default(),
                    reason: "outside the namespace of the list",
                }
                .into());
            }
            put.push((self.key(r, o.namespace.as_deref(), &o.name)?, o.rv));
        }
        let listed: HashSet<&str> = put.iter().map(|(k, _)| k.as_str()).collect();
        let mut candidates: Vec<String> = self
            .owned
            .keys(component, &scope)?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if whole_resource.is_some() {
            candidates.extend(self.keys_in(&scope).await?);
            candidates.sort();
            candidates.dedup();
        }
        let gone: Vec<(String, u64)> = candidates
            .into_iter()
            .filter(|k| !listed.contains(k.as_str()))
            .map(|k| (k, list_rv))
            .collect();
        let ops = set_ops(objects, &put, &gone, whole_resource);
        let intent = Intent {
            component: component.into(),
            put,
            delete: gone,
        };
        let (id, answers, revision) = self.run_chunked(&intent, ops).await?;
        let done = self.tally(&intent, answers, revision)?;
        let released: Vec<String> = intent.delete.iter().map(|(k, _)| k.clone()).collect();
        self.owned.finish(id, component, &intent.put, &released)?;
        Ok(done)
    }

    /// Sends one Txn of the pool's own bookkeeping (the sweep), retried like every other.
    pub(super) async fn send(&self, txn: Txn) -> Result<TxnResponse, StorageError> {
        self.txn(txn).await
    }

    /// The key prefix of every object (kube-apiserver's --etcd-prefix).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The etcd's --max-txn-ops, as learned so far.
    pub fn max_txn_ops(&self) -> usize {
        self.limits().max_txn_ops
    }

    /// Every object key in a range (keys only).
    async fn keys_in(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let resp = self
            .txn(Txn::new().and_then([TxnOp::get(prefix, Some(opts))]))
            .await?;
        let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
            return Err(StorageError::Shape);
        };
        Ok(got
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect())
    }

    /// Deletes every object a component owns.
    pub async fn delete_component_resources(&self, component: &str) -> Result<usize, StorageError> {
        let owned = self.owned.keys(component, "")?;
        let ops: Vec<(TxnOp, usize)> = owned
            .iter()
            .flat_map(|(k, _)| {
                [
                    (TxnOp::delete(k.as_str(), None), k.len() + 16),
                    (TxnOp::delete(rv_key(k), None), k.len() + 32),
                ]
            })
            .collect();
        let intent = Intent {
            component: component.into(),
            put: vec![],
            delete: owned.clone(),
        };
        let (id, _, _) = self.run_chunked(&intent, ops).await?;
        let released: Vec<String> = owned.into_iter().map(|(k, _)| k).collect();
        self.owned.finish(id, component, &[], &released)?;
        Ok(released.len())
    }

    /// Finishes what a crash interrupted, for each intent left behind. Its puts that
    /// reached etcd are owned by the component. Its deletions are (re)applied —
    /// freshness-guarded — only when every put reached etcd at its version (or a newer
    /// one): a set interrupted part way stays the old set whole (some objects fresher),
    /// never half of each; the next push of the set redoes it. Nothing stays orphaned.
    async fn reconcile(&self) -> Result<(), StorageError> {
        for (id, intent) in self.owned.pending()? {
            let reads: Vec<(TxnOp, usize)> = intent
                .put
                .iter()
                .flat_map(|(k, _)| {
                    [
                        (TxnOp::get(k.as_str(), None), k.len() + 16),
                        (TxnOp::get(rv_key(k), None), k.len() + 32),
                    ]
                })
                .collect();
            let (answers, _) = self.send_chunked(reads).await?;
            let value = |r: &TxnOpResponse| match r {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            };
            let mut present = Vec::new();
            let mut complete = true;
            for (pair, put) in answers.chunks(2).zip(&intent.put) {
                if value(&pair[0]).is_some() {
                    present.push(put.clone());
                }
                let stored = pair.get(1).and_then(value).and_then(|v| parse_rv(&v));
                complete &= stored.is_some_and(|rv| rv >= put.1);
            }
            let released: Vec<String> = if complete {
                let deletes: Vec<(TxnOp, usize)> = intent
                    .delete
                    .iter()
                    .map(|(k, rv)| (TxnOp::txn(delete_txn(k, *rv)), delete_bytes(k)))
                    .collect();
                self.send_chunked(deletes).await?;
                intent.delete.iter().map(|(k, _)| k.clone()).collect()
            } else {
                vec![]
            };
            tracing::info!(
                component = intent.component,
                puts_found = present.len(),
                puts = intent.put.len(),
                deletes_applied = released.len(),
                "coordinator: reconciled an operation interrupted by a crash"
            );
            self.owned
                .finish(id, &intent.component, &present, &released)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_versions_order_as_numbers_and_tombstones_parse() {
        assert!(pad(9) < pad(10));
        assert!(pad(99_999) < pad(100_000));
        assert!(tombstone(7) < pad(8), "a deletion at 7 lets 8 in");
        assert!(tombstone(7) > pad(7), "but not 7 again");
        assert_eq!(parse_rv(tombstone(42).as_bytes()), Some(42));
        assert!(deleted_at(tombstone(42).as_bytes()).is_some_and(|t| t > 1_700_000_000));
        assert_eq!(
            deleted_at(b"00000000000000000042d"),
            Some(0),
            "older tombstones"
        );
        assert_eq!(deleted_at(pad(42).as_bytes()), None);
        assert_eq!(parse_rv(pad(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(rv_key("/registry/pods/a/b"), "/hub/rv/registry/pods/a/b");
        // "stored > at_least(rv)" is "stored is rv or newer", tombstones included.
        for (stored, rv, not_older) in [
            (pad(5), 5, true),
            (pad(6), 5, true),
            (pad(4), 5, false),
            (tombstone(4), 5, false),
            (tombstone(5), 5, true),
            (pad(10), 9, true),
            (pad(9), 10, false),
        ] {
            assert_eq!(stored > at_least(rv), not_older, "{stored} vs {rv}");
        }
    }
}
