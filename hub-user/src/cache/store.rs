//! The local store: one redb file under cache.dir, written in transactions so a crash or a
//! power cut leaves either the old or the new state, never a torn one.
//!
//! Tables:
//! * `objects`: `credential \0 group/version/resource \0 namespace \0 name \0 component` →
//!   record (resourceVersion, encoding, metadata for selectors, the original bytes).
//!   Objects of one resource sort together by namespace and name, and the copies different
//!   components hold of one object sit side by side.
//! * `lists`: `credential \0 gvr \0 namespace \0 labelSelector \0 fieldSelector` → the
//!   last complete LIST committed under that selector (its resourceVersion, its kind, when
//!   it was stored), so the cache knows which lists it can answer truthfully. Every
//!   distinct selector keeps its own record (kubelet lists each ConfigMap and Secret its
//!   pods mount by `metadata.name`), at most [`MAX_LISTS_PER_SCOPE`] per namespace and
//!   resource: past that the oldest is forgotten.
//! * `raw`: `path \0 content-type` → discovery and /version answers.
//! * `outbox`: sequence number → a write accepted while the cloud was unreachable, kept
//!   until it is replayed (see `offline`).
//! * `live`: the objects the node wrote while offline, its writes folded in (see
//!   `crate::live`); each rides on one outbox row.
//!
//! Deletions leave a tombstone holding the deleting resourceVersion, so an older event or
//! list that arrives later cannot bring the object back (OpenYurt #2712).
use std::{
    collections::HashMap,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use redb::{
    Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};

use super::{
    objects::{Encoding, Item},
    select::Selector,
};

const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
const LISTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("lists");
const RAW: TableDefinition<&[u8], &[u8]> = TableDefinition::new("raw");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// The queued writes that may be dropped first when their budget is full (events):
/// sequence number → size; the row at [`BUDGET_TOTAL`] holds their total size.
const EXPENDABLE: TableDefinition<u64, u64> = TableDefinition::new("outbox-expendable");
const BUDGET_TOTAL: u64 = u64::MAX;
/// The live entry (its key) an expendable row replays: it goes when the row is dropped.
const EXPENDABLE_ENTRIES: TableDefinition<u64, &[u8]> =
    TableDefinition::new("outbox-expendable-entries");
/// The node's live state (`crate::live`): `gvr \0 namespace \0 name` → an object the node
/// wrote while offline, with the writes folded in; each has one outbox row that replays it.
const LIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("live");

/// The store's file name under cache.dir.
pub const FILE: &str = "cache.redb";
/// Tombstones older than this are dropped when a later list covers them.
const TOMBSTONE_TTL_SECS: u64 = 600;
/// redb's page cache: small, the OS page cache does the rest. (bench proxy, one run with
/// both builds in the same rounds: peak RSS 30.4 MiB with 4 MiB here, 31.9 MiB with 8.)
const PAGE_CACHE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cache directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cache store {path} is in use by a running hub")]
    InUse { path: PathBuf },
    #[error("no cache store at {path}")]
    Missing { path: PathBuf },
    #[error("cache store {path} cannot be opened (corrupt?): {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("cache store: {0}")]
    Db(String),
}

/// Part of what redb says of an I/O error (a full disk) and, its `PreviousIo`, of every
/// transaction after one until the database is opened again.
pub const IO_ERROR_TEXT: &str = "I/O error";

fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Where an object is kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ObjectKey {
    pub credential: String,
    pub gvr: String,
    pub namespace: String,
    pub name: String,
    pub component: String,
}

fn join(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

/// An object's key from its parts, in one allocation (what `ObjectKey::encode` gives).
pub fn object_key(
    credential: &str,
    gvr: &str,
    namespace: &str,
    name: &str,
    component: &str,
) -> Vec<u8> {
    let parts = [credential, gvr, namespace, name, component];
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(0);
        }
        k.extend_from_slice(p.as_bytes());
    }
    k
}

impl ObjectKey {
    pub fn encode(&self) -> Vec<u8> {
        object_key(
            &self.credential,
            &self.gvr,
            &self.namespace,
            &self.name,
            &self.component,
        )
    }

    pub fn decode(b: &[u8]) -> Option<ObjectKey> {
        let s = std::str::from_utf8(b).ok()?;
        let mut p = s.split('\0');
        let k = ObjectKey {
            credential: p.next()?.into(),
            gvr: p.next()?.into(),
            namespace: p.next()?.into(),
            name: p.next()?.into(),
            component: p.next()?.into(),
        };
        p.next().is_none().then_some(k)
    }
}

/// The range of keys of one credential's resource, optionally one namespace and name.
pub fn prefix(credential: &str, gvr: &str, namespace: Option<&str>, name: Option<&str>) -> Vec<u8> {
    let mut parts = vec![credential, gvr];
    parts.extend(namespace);
    parts.extend(name);
    let mut k = join(&parts);
    k.push(0);
    k
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![u8::MAX; prefix.len() + 1]
}

/// One stored object (or its tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub deleted: bool,
    /// Written by a GET answer and by no list or watch since: the pool lets such objects
    /// age out of the coordinator (the node's cache keeps them).
    pub one_off: bool,
    /// A tombstone that may only mean the object left a selection — a filtered list no
    /// longer returned it, or a watch under such a selector said DELETED — while it still
    /// exists (its labels or a mutable field changed). The pool is not told it was
    /// deleted: that would block other hubs' current copies of it.
    pub left_selection: bool,
    /// Unix seconds when it was written.
    pub stored_at: u64,
    pub item: Item,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn pairs(&mut self) -> Option<Vec<(String, String)>> {
        let n = self.u32()?;
        (0..n)
            .map(|_| Some((self.string()?, self.string()?)))
            .collect()
    }
}

/// A record's flags.
#[derive(Clone, Copy)]
struct Flags {
    deleted: bool,
    one_off: bool,
    left_selection: bool,
}

/// A record's bytes, from borrowed parts (`body` is `item.body`, or empty for a tombstone).
fn encode_record(f: Flags, stored_at: u64, i: &Item, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + body.len());
    out.push(RECORD_VERSION);
    out.push(
        u8::from(f.deleted)
            | (u8::from(i.encoding == Encoding::Protobuf) << 1)
            | (u8::from(f.one_off) << 2)
            | (u8::from(f.left_selection) << 3),
    );
    out.extend_from_slice(&i.rv.to_le_bytes());
    out.extend_from_slice(&stored_at.to_le_bytes());
    for s in [&i.name, &i.namespace, &i.api_version, &i.kind] {
        put_str(&mut out, s);
    }
    for pairs in [&i.labels, &i.fields] {
        out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
        for (k, v) in pairs {
            put_str(&mut out, k);
            put_str(&mut out, v);
        }
    }
    out.extend_from_slice(body);
    out
}

const RECORD_VERSION: u8 = 1;

impl Record {
    /// A live object written at `stored_at`.
    pub fn live(item: Item, one_off: bool, stored_at: u64) -> Record {
        Record {
            deleted: false,
            one_off,
            left_selection: false,
            stored_at,
            item,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_record(
            Flags {
                deleted: self.deleted,
                one_off: self.one_off,
                left_selection: self.left_selection,
            },
            self.stored_at,
            &self.item,
            &self.item.body,
        )
    }

    pub fn version(&self) -> Version {
        Version {
            rv: self.item.rv,
            deleted: self.deleted,
            encoding: self.item.encoding,
        }
    }

    /// None when the bytes are not a record this version wrote.
    pub fn decode(b: &[u8]) -> Option<Record> {
        let (version, flags, rest) = Version::read_header(b)?;
        let mut r = Reader(rest);
        let stored_at = r.u64()?;
        let item = Item {
            name: r.string()?,
            namespace: r.string()?,
            api_version: r.string()?,
            kind: r.string()?,
            labels: r.pairs()?,
            fields: r.pairs()?,
            rv: version.rv,
            encoding: version.encoding,
            body: r.0.to_vec(),
        };
        Some(Record {
            deleted: version.deleted,
            one_off: flags & 4 != 0,
            left_selection: flags & 8 != 0,
            stored_at,
            item,
        })
    }
}

/// Which state of an object a record holds: what decides whether an incoming copy is news.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub rv: u64,
    pub deleted: bool,
    pub encoding: Encoding,
}

impl Version {
    /// From an encoded record's fixed header, without decoding its strings and body.
    fn read(b: &[u8]) -> Option<Version> {
        Some(Version::read_header(b)?.0)
    }

    /// The version and when the record was stored, from the fixed header.
    fn stored(b: &[u8]) -> Option<(Version, u64)> {
        let (version, _, rest) = Version::read_header(b)?;
        Some((version, Reader(rest).u64()?))
    }

    /// The version, the flags byte and the bytes after them.
    fn read_header(b: &[u8]) -> Option<(Version, u8, &[u8])> {
        let mut r = Reader(b);
        if r.take(1)? != [RECORD_VERSION] {
            return None;
        }
        let flags = r.take(1)?[0];
        let version = Version {
            rv: r.u64()?,
            deleted: flags & 1 != 0,
            encoding: if flags & 2 != 0 {
                Encoding::Protobuf
            } else {
                Encoding::Json
            },
        };
        Some((version, flags, r.0))
    }
}

/// Selectors whose lists are remembered per credential, resource and namespace (kubelet
/// keeps one per ConfigMap or Secret its pods mount); the oldest record goes first. A
/// record is ~100 bytes; recording a new selector counts the scope's records (measured
/// in a debug build: 1034 new selectors into one scope in ~1 s).
pub const MAX_LISTS_PER_SCOPE: usize = 1024;

/// How many queued writes of a kind that may be dropped (events) are kept, and how many
/// bytes they may take; past either, the oldest of them are dropped.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub count: u64,
    pub bytes: u64,
}

/// A write queued: the queue's length after it, and how many expendable writes were
/// dropped to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub queued: u64,
    pub dropped: u64,
}

/// What the cache knows about the last complete list under one selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListMeta {
    pub rv: u64,
    /// The list had no selector: everything absent from it was absent in the cloud.
    pub unfiltered: bool,
    /// The selector it had (label, field): it covers only what that selects.
    pub selector: (String, String),
    /// The list's kind as the cloud named it (`CSIDriverList`); empty if not known.
    pub kind: String,
    /// When it was stored (seconds since the epoch).
    pub stored_at: u64,
}

impl ListMeta {
    /// rv, unfiltered, then `labels \0 fields \0 kind \0 stored_at`. Records written
    /// before the kind and time were kept end after the fields, and read back without them.
    fn encode(&self) -> Vec<u8> {
        let mut v = self.rv.to_le_bytes().to_vec();
        v.push(u8::from(self.unfiltered));
        let (l, f) = &self.selector;
        v.extend_from_slice(format!("{l}\0{f}\0{}\0{}", self.kind, self.stored_at).as_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Option<ListMeta> {
        let text = std::str::from_utf8(b.get(9..)?).ok()?;
        let mut parts = text.split('\0');
        let labels = parts.next().unwrap_or_default().to_string();
        let fields = parts.next().unwrap_or_default().to_string();
        let kind = parts.next().unwrap_or_default().to_string();
        let stored_at = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
        Some(ListMeta {
            rv: u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
            unfiltered: *b.get(8)? == 1,
            selector: (labels, fields),
            kind,
            stored_at,
        })
    }
}

/// The key of one selector's list record.
fn list_key(credential: &str, gvr: &str, namespace: &str, selector: (&str, &str)) -> Vec<u8> {
    join(&[credential, gvr, namespace, selector.0, selector.1])
}

/// The range holding every list record of one namespace (and the single record per
/// namespace that stores before per-selector records kept, whose key is the scope itself).
fn list_scope(credential: &str, gvr: &str, namespace: &str) -> (Vec<u8>, Vec<u8>) {
    let start = join(&[credential, gvr, namespace]);
    let mut below = start.clone();
    below.push(0);
    (start, prefix_end(&below))
}

/// One change, applied inside a batch's transaction.
#[derive(Debug)]
pub enum Write {
    /// A GET answer (`one_off`) or a watch ADDED/MODIFIED: kept unless the store has
    /// something fresher.
    Upsert {
        key: ObjectKey,
        item: Item,
        one_off: bool,
    },
    /// A watch DELETED: a tombstone, unless the store has something fresher.
    /// `left_selection`: the deletion may only mean the object left a watch's selection.
    Delete {
        key: ObjectKey,
        item: Item,
        left_selection: bool,
    },
    /// A complete LIST: the component's objects in that namespace (all, if empty) that the
    /// selector matches are replaced by `items`, atomically.
    ReplaceList {
        credential: String,
        component: String,
        gvr: String,
        namespace: String,
        selector: Selector,
        /// False when the selector uses a field the cache does not index: then nothing
        /// can be known to be gone, and only the returned objects are written.
        prune: bool,
        rv: u64,
        items: Vec<Item>,
        /// Returned by the list and already held at their resourceVersion when the list
        /// was read: (namespace, name). Neither rewritten nor pruned.
        held: Vec<(String, String)>,
        /// The list's kind as the cloud named it (`NodeList`).
        list_kind: String,
    },
    /// The list of this selector is known to stand at `rv` with the objects the store
    /// holds: a relist that returned exactly what the last list stored (nothing else
    /// written to the resource since), or a bookmark of a watch that keeps the list
    /// current. Only the list's resourceVersion moves, and only when the list record
    /// stands at `if_at_least` or later.
    ListSeen {
        credential: String,
        gvr: String,
        namespace: String,
        /// (label, field) selectors as the client sent them.
        selector: (String, String),
        rv: u64,
        if_at_least: u64,
    },
    /// Discovery or /version.
    Raw {
        path: String,
        content_type: String,
        body: Vec<u8>,
    },
}

/// A resource whose objects a write changes, as `credential \0 gvr`.
pub fn scope_key(credential: &str, gvr: &str) -> String {
    format!("{credential}\0{gvr}")
}

impl Write {
    /// The resource this write changes objects of; None for writes that change no object
    /// (a list seen again, discovery).
    pub fn scope(&self) -> Option<String> {
        match self {
            Write::Upsert { key, .. } | Write::Delete { key, .. } => {
                Some(scope_key(&key.credential, &key.gvr))
            }
            Write::ReplaceList {
                credential, gvr, ..
            } => Some(scope_key(credential, gvr)),
            Write::ListSeen { .. } | Write::Raw { .. } => None,
        }
    }
}

/// What a batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub written: u64,
    /// Older than what the store holds (or equal): left alone.
    pub stale: u64,
    pub deleted: u64,
    /// Tombstones past their time removed.
    pub purged: u64,
    /// ReplaceLists the store now holds whole (each object the list returned is stored).
    pub lists_whole: u64,
}

impl Applied {
    /// Objects changed on disk (not list records).
    fn objects_changed(&self) -> u64 {
        self.written + self.deleted + self.purged
    }
}

enum Db {
    ReadWrite(Database),
    ReadOnly(ReadOnlyDatabase),
}

pub struct Store {
    /// None once closed: redb records a clean shutdown only when the database is dropped,
    /// and a store that was not closed cleanly is repaired (rescanned) at the next open.
    db: std::sync::RwLock<Option<Db>>,
    pub path: PathBuf,
    /// The outbox's length, set inside each transaction that changes it (write
    /// transactions run one at a time, so the last value set is the committed length).
    queued: AtomicU64,
    /// Write transactions committed: what was read before it changed is stale after.
    commits: AtomicU64,
    /// Closed after an I/O error and not yet open again.
    reopening: std::sync::atomic::AtomicBool,
    /// Per `credential \0 gvr`: how many batches have written objects of it (in this
    /// process). The writer compares it to tell that nothing but a list touched a resource
    /// since that list (see `fingerprint`).
    generations: std::sync::Mutex<HashMap<String, u64>>,
}

/// Creates `dir` owner-only (0700), or tightens it if it exists.
fn private_dir(dir: &Path) -> Result<(), StoreError> {
    let err = |source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

fn open_error(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse {
            path: path.to_path_buf(),
        },
        e => StoreError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    }
}

impl Store {
    /// Opens (or creates) the store under `dir`, owner-only.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        private_dir(dir)?;
        let path = dir.join(FILE);
        // Create the file 0600 before redb does, so it never exists with wider permissions.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StoreError::Dir {
                path: path.clone(),
                source,
            })?;
        let db = Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(&path)
            .map_err(|e| open_error(&path, e))?;
        let txn = db.begin_write().map_err(db_err)?;
        for t in [OBJECTS, LISTS, RAW] {
            txn.open_table(t).map_err(db_err)?;
        }
        txn.open_table(OUTBOX).map_err(db_err)?;
        txn.open_table(EXPENDABLE).map_err(db_err)?;
        txn.open_table(EXPENDABLE_ENTRIES).map_err(db_err)?;
        txn.open_table(LIVE).map_err(db_err)?;
        txn.commit().map_err(db_err)?;
        let store = Store {
            db: std::sync::RwLock::new(Some(Db::ReadWrite(db))),
            path,
            queued: Default::default(),
            commits: Default::default(),
            reopening: Default::default(),
            generations: Default::default(),
        };
        let queued = store.queue_len()?;
        store.queued.store(queued, Ordering::Relaxed);
        Ok(store)
    }

    /// Opens an existing store for reading (`hub cache` while the daemon is stopped). A
    /// store left by a hub that died (kill -9, power loss) needs redb's crash recovery
    /// first, which only a writer can do: then it is opened for writing once.
    pub fn open_read_only(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join(FILE);
        if !path.exists() {
            return Err(StoreError::Missing { path });
        }
        let db = match Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .open_read_only(&path)
        {
            Ok(db) => Db::ReadOnly(db),
            Err(redb::DatabaseError::RepairAborted) => Db::ReadWrite(
                Database::builder()
                    .set_cache_size(PAGE_CACHE_BYTES)
                    .open(&path)
                    .map_err(|e| open_error(&path, e))?,
            ),
            Err(e) => return Err(open_error(&path, e)),
        };
        Ok(Store {
            db: std::sync::RwLock::new(Some(db)),
            path,
            queued: Default::default(),
            commits: Default::default(),
            reopening: Default::default(),
            generations: Default::default(),
        })
    }

    /// Closes the database cleanly (the next open needs no recovery); later reads and
    /// writes fail with an error.
    pub fn close(&self) {
        let db = self.db.write().unwrap_or_else(|p| p.into_inner()).take();
        drop(db);
    }

    fn read(&self) -> Result<redb::ReadTransaction, StoreError> {
        match self.db.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(Db::ReadWrite(d)) => d.begin_read(),
            Some(Db::ReadOnly(d)) => d.begin_read(),
            None => return Err(StoreError::Db("store closed".into())),
        }
        .map_err(db_err)
    }

    /// Runs `f` in one write transaction and commits what it did when it returns Ok (an
    /// Err leaves the store as it was). The store stays open for writing meanwhile.
    fn in_write<T>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let guard = self.db.read().unwrap_or_else(|p| p.into_inner());
        let Some(Db::ReadWrite(db)) = guard.as_ref() else {
            return Err(StoreError::Db("store closed or opened read-only".into()));
        };
        let txn = db.begin_write().map_err(db_err)?;
        let out = f(&txn)?;
        txn.commit().map_err(db_err)?;
        self.commits.fetch_add(1, Ordering::SeqCst);
        Ok(out)
    }

    /// Changes after every write transaction this store commits: read it before reading
    /// what is to be kept, and what was read is current while it has not changed.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// Every record whose key starts with `prefix` (tombstones included), in key order.
    pub fn scan(&self, prefix: &[u8]) -> Result<Vec<(ObjectKey, Record)>, StoreError> {
        let txn = self.read()?;
        let table = txn.open_table(OBJECTS).map_err(db_err)?;
        let end = prefix_end(prefix);
        let mut out = Vec::new();
        for entry in table.range(prefix..end.as_slice()).map_err(db_err)? {
            let (k, v) = entry.map_err(db_err)?;
            if let (Some(key), Some(rec)) =
                (ObjectKey::decode(k.value()), Record::decode(v.value()))
            {
                out.push((key, rec));
            }
        }
        Ok(out)
    }

    /// The freshest live copy `credential` holds of the object `info` names (any
    /// component's, either encoding).
    pub fn freshest(
        &self,
        credential: &str,
        info: &crate::proxy::request::RequestInfo,
    ) -> Result<Option<Item>, StoreError> {
        let p = prefix(
            credential,
            &info.gvr(),
            Some(&info.namespace),
            Some(&info.name),
        );
        Ok(self
            .scan(&p)?
            .into_iter()
            .filter(|(_, r)| !r.deleted)
            .max_by_key(|(_, r)| r.item.rv)
            .map(|(_, r)| r.item))
    }

    /// The complete lists of `gvr` in `namespace` ("" = all namespaces / cluster-scoped)
    /// the cache holds, one per selector, newest first.
    pub fn list_metas(
        &self,
        credential: &str,
        gvr: &str,
        namespace: &str,
    ) -> Result<Vec<ListMeta>, StoreError> {
        let txn = self.read()?;
        let table = txn.open_table(LISTS).map_err(db_err)?;
        let (start, end) = list_scope(credential, gvr, namespace);
        let mut out = Vec::new();
        for entry in table
            .range(start.as_slice()..end.as_slice())
            .map_err(db_err)?
        {
            let (_, v) = entry.map_err(db_err)?;
            out.extend(ListMeta::decode(v.value()));
        }
        out.sort_by_key(|m| std::cmp::Reverse(m.stored_at));
        Ok(out)
    }

    /// Discovery answers stored for `path`: (content type, body).
    pub fn raw(&self, path: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.read()?;
        let table = txn.open_table(RAW).map_err(db_err)?;
        let start = format!("{path}\0").into_bytes();
        let end = prefix_end(&start);
        let mut out = Vec::new();
        for entry in table
            .range(start.as_slice()..end.as_slice())
            .map_err(db_err)?
        {
            let (k, v) = entry.map_err(db_err)?;
            let ct = String::from_utf8_lossy(&k.value()[start.len()..]).into_owned();
            out.push((ct, v.value().to_vec()));
        }
        Ok(out)
    }

    /// Applies a batch of writes in one transaction, durably (fsync before returning).
    pub fn apply(&self, writes: &[Write]) -> Result<Applied, StoreError> {
        let result = self.apply_once(writes);
        if let Err(e) = &result
            && (e.to_string().contains(IO_ERROR_TEXT) || self.reopening.load(Ordering::Relaxed))
        {
            self.reopen();
        }
        result
    }

    /// After an I/O error (a full disk) redb refuses every transaction until the database
    /// is opened again: do so, so the next write (the writer tries again) can land.
    fn reopen(&self) {
        let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
        let writable = matches!(db.as_ref(), Some(Db::ReadWrite(_)));
        if !writable && !self.reopening.load(Ordering::Relaxed) {
            return; // closed on purpose, or read-only
        }
        self.reopening.store(true, Ordering::Relaxed);
        // The old handle holds the file's lock: drop it first.
        drop(db.take());
        match Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(&self.path)
        {
            Ok(fresh) => {
                tracing::info!(path = %self.path.display(), "cache store reopened after an I/O error");
                *db = Some(Db::ReadWrite(fresh));
                self.reopening.store(false, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(
                path = %self.path.display(),
                "cache store: reopening after an I/O error failed (tried again at the next write): {e}"
            ),
        }
    }

    /// How many batches have written objects of `scope` (a `scope_key`) in this process.
    pub fn generation(&self, scope: &str) -> u64 {
        let generations = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        generations.get(scope).copied().unwrap_or(0)
    }

    /// Counts a batch against every resource it may write objects of (before it is applied,
    /// so a reader never sees an old count with new objects).
    fn count_generations(&self, writes: &[Write]) {
        let mut generations = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        let touched: std::collections::HashSet<String> =
            writes.iter().filter_map(Write::scope).collect();
        for scope in touched {
            *generations.entry(scope).or_default() += 1;
        }
    }

    fn apply_once(&self, writes: &[Write]) -> Result<Applied, StoreError> {
        self.count_generations(writes);
        let mut applied = Applied::default();
        // Most GETs and many events repeat what the store holds: find those with a cheap
        // read so that a batch of nothing new costs no write transaction (and no fsync).
        let writes = self.without_repeats(writes, &mut applied)?;
        if writes.is_empty() {
            return Ok(applied);
        }
        let guard = self.db.read().unwrap_or_else(|p| p.into_inner());
        let Some(Db::ReadWrite(db)) = guard.as_ref() else {
            return Err(StoreError::Db("store closed or opened read-only".into()));
        };
        let mut txn = db.begin_write().map_err(db_err)?;
        let changed_before = applied.objects_changed();
        // A selector's first list record is kept durably, like the objects.
        let mut new_lists = false;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(db_err)?;
            let mut lists = txn.open_table(LISTS).map_err(db_err)?;
            let mut raw = txn.open_table(RAW).map_err(db_err)?;
            let now = now();
            for w in writes {
                match w {
                    &Write::Upsert {
                        ref key,
                        ref item,
                        one_off,
                    } => {
                        let k = key.encode();
                        let old = stored(&objects, &k)?;
                        if old
                            .as_ref()
                            .is_some_and(|o| supersedes(o.version(), item.rv, item.encoding))
                        {
                            applied.stale += 1;
                            continue;
                        }
                        // An object a list or watch keeps current stays so after a GET.
                        let one_off = one_off && old.is_none_or(|o| o.one_off || o.deleted);
                        let flags = Flags {
                            deleted: false,
                            one_off,
                            left_selection: false,
                        };
                        let rec = encode_record(flags, now, item, &item.body);
                        objects
                            .insert(k.as_slice(), rec.as_slice())
                            .map_err(db_err)?;
                        applied.written += 1;
                    }
                    &Write::Delete {
                        ref key,
                        ref item,
                        left_selection,
                    } => {
                        let k = key.encode();
                        // Stale only if the store holds something newer than the deletion.
                        let old = stored(&objects, &k)?;
                        if old.is_some_and(|o| o.item.rv > item.rv) {
                            applied.stale += 1;
                            continue;
                        }
                        let flags = Flags {
                            deleted: true,
                            one_off: false,
                            left_selection,
                        };
                        let rec = encode_record(flags, now, item, &[]);
                        objects
                            .insert(k.as_slice(), rec.as_slice())
                            .map_err(db_err)?;
                        applied.deleted += 1;
                    }
                    Write::ReplaceList {
                        credential,
                        component,
                        gvr,
                        namespace,
                        selector,
                        prune,
                        rv,
                        items,
                        held,
                        list_kind,
                    } => {
                        let complete = replace_list(
                            &mut objects,
                            ListScope {
                                credential,
                                component,
                                gvr,
                                namespace,
                            },
                            prune.then_some(selector),
                            *rv,
                            (items, held),
                            now,
                            &mut applied,
                        )?;
                        if !complete {
                            // An object the list returned is no longer held: the cache does
                            // not have this list whole, so it does not claim it.
                            continue;
                        }
                        let meta = ListMeta {
                            rv: *rv,
                            unfiltered: selector.is_empty(),
                            selector: (
                                selector.source().0.to_string(),
                                selector.source().1.to_string(),
                            ),
                            kind: list_kind.clone(),
                            stored_at: now,
                        };
                        new_lists |= remember_list(&mut lists, credential, gvr, namespace, &meta)?;
                        applied.lists_whole += 1;
                    }
                    Write::ListSeen {
                        credential,
                        gvr,
                        namespace,
                        selector,
                        rv,
                        if_at_least,
                    } => {
                        let key = list_key(credential, gvr, namespace, (&selector.0, &selector.1));
                        let meta = lists
                            .get(key.as_slice())
                            .map_err(db_err)?
                            .and_then(|v| ListMeta::decode(v.value()));
                        if let Some(mut meta) = meta.filter(|m| m.rv < *rv && m.rv >= *if_at_least)
                        {
                            meta.rv = *rv;
                            meta.stored_at = now;
                            lists
                                .insert(key.as_slice(), meta.encode().as_slice())
                                .map_err(db_err)?;
                        }
                    }
                    Write::Raw {
                        path,
                        content_type,
                        body,
                    } => {
                        raw.insert(
                            format!("{path}\0{content_type}").as_bytes(),
                            body.as_slice(),
                        )
                        .map_err(db_err)?;
                        applied.written += 1;
                    }
                }
            }
        }
        if applied.objects_changed() == changed_before && !new_lists {
            // Only list records changed (a relist of held objects moves its list's
            // resourceVersion): no fsync. Lost in a crash, the previous record of the same
            // objects stands, and the next durable commit persists it.
            txn.set_durability(redb::Durability::None).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(applied)
    }

    /// Drops upserts the store already holds (same or newer state), counting them stale.
    fn without_repeats<'w>(
        &self,
        writes: &'w [Write],
        applied: &mut Applied,
    ) -> Result<Vec<&'w Write>, StoreError> {
        if !writes.iter().any(|w| matches!(w, Write::Upsert { .. })) {
            return Ok(writes.iter().collect());
        }
        let txn = self.read()?;
        let objects = txn.open_table(OBJECTS).map_err(db_err)?;
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            if let Write::Upsert { key, item, .. } = w
                && stored_version(&objects, &key.encode())?
                    .is_some_and(|v| supersedes(v, item.rv, item.encoding))
            {
                applied.stale += 1;
                continue;
            }
            out.push(w);
        }
        Ok(out)
    }

    /// A read snapshot of the objects, for many `holds` questions at the cost of one
    /// read transaction.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let txn = self.read()?;
        Ok(Snapshot {
            objects: txn.open_table(OBJECTS).map_err(db_err)?,
        })
    }

    /// Queues a write for the cloud and, in the same transaction, puts the object it
    /// produced into the cache (even over an equal resourceVersion: the write is newer).
    /// Fails when `max` writes are already queued. Returns the queue length.
    pub fn enqueue(
        &self,
        write: &[u8],
        update: Option<(ObjectKey, Item)>,
        max: u64,
        expendable: Option<Budget>,
    ) -> Result<Enqueued, StoreError> {
        self.in_write(|txn| {
            let done = {
                let mut outbox = txn.open_table(OUTBOX).map_err(db_err)?;
                let dropped = match expendable {
                    Some(budget) => make_room(txn, &mut outbox, write.len() as u64, budget)?,
                    None => 0,
                };
                let len = outbox.len().map_err(db_err)?;
                let next = append_row(&mut outbox, write, max)?;
                if expendable.is_some() {
                    count_expendable(txn, next, write.len() as u64, None)?;
                }
                if let Some((key, item)) = update {
                    let rec = Record::live(item, false, now());
                    txn.open_table(OBJECTS)
                        .map_err(db_err)?
                        .insert(key.encode().as_slice(), rec.encode().as_slice())
                        .map_err(db_err)?;
                }
                self.queued.store(len + 1, Ordering::Relaxed);
                Enqueued {
                    queued: len + 1,
                    dropped,
                }
            };
            Ok(done)
        })
    }

    /// The oldest queued writes, in order.
    pub fn queued(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let txn = self.read()?;
        let outbox = txn.open_table(OUTBOX).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in outbox.iter().map_err(db_err)?.take(limit) {
            let (k, v) = entry.map_err(db_err)?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// The outbox's length as last committed (no read transaction).
    pub fn queued_now(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    pub fn queue_len(&self) -> Result<u64, StoreError> {
        let txn = self.read()?;
        let len = txn
            .open_table(OUTBOX)
            .map_err(db_err)?
            .len()
            .map_err(db_err)?;
        Ok(len)
    }

    /// Removes a replayed (or unreplayable) write from the queue.
    pub fn dequeue(&self, seq: u64) -> Result<(), StoreError> {
        self.in_write(|txn| {
            {
                let mut outbox = txn.open_table(OUTBOX).map_err(db_err)?;
                outbox.remove(seq).map_err(db_err)?;
                forget_expendable(txn, seq)?;
                self.queued
                    .store(outbox.len().map_err(db_err)?, Ordering::Relaxed);
            }
            Ok(())
        })
    }

    /// Removes every queued write `pick` chooses (by sequence number and bytes: `Some`,
    /// with the key of the live entry the row replays, if any, which goes too), in one
    /// transaction; returns the rows removed and the live entries they held.
    pub fn remove_queued_where(
        &self,
        pick: impl Fn(u64, &[u8]) -> Option<Option<Vec<u8>>>,
    ) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
        self.in_write(|txn| {
            let mut removed = 0;
            let mut entries = Vec::new();
            {
                let mut outbox = txn.open_table(OUTBOX).map_err(db_err)?;
                let mut picked = Vec::new();
                for entry in outbox.iter().map_err(db_err)? {
                    let (k, v) = entry.map_err(db_err)?;
                    if let Some(live) = pick(k.value(), v.value()) {
                        picked.push((k.value(), live));
                    }
                }
                let mut live = txn.open_table(LIVE).map_err(db_err)?;
                for (seq, live_key) in picked {
                    outbox.remove(seq).map_err(db_err)?;
                    forget_expendable(txn, seq)?;
                    removed += 1;
                    if let Some(k) = live_key
                        && let Some(entry) = live.remove(k.as_slice()).map_err(db_err)?
                    {
                        entries.push(entry.value().to_vec());
                    }
                }
                self.queued
                    .store(outbox.len().map_err(db_err)?, Ordering::Relaxed);
            }
            Ok((removed, entries))
        })
    }

    /// Folds a write into the live entry `key`, in one transaction: `fold` gets the entry
    /// as stored (None: none yet) and gives the new one, or why the write cannot be taken
    /// (then nothing changes). A new entry gets the outbox row `row`, which replays it; a
    /// later write rides on that row. Returns the queue's length.
    pub fn fold_live<E>(
        &self,
        key: &[u8],
        row: &[u8],
        max: u64,
        expendable: Option<Budget>,
        fold: impl FnOnce(Option<Vec<u8>>) -> Result<Vec<u8>, E>,
    ) -> Result<Result<Enqueued, E>, StoreError> {
        self.in_write(|txn| {
            let done = {
                let held = txn
                    .open_table(LIVE)
                    .map_err(db_err)?
                    .get(key)
                    .map_err(db_err)?
                    .map(|v| v.value().to_vec());
                let new_row = held.is_none();
                let entry = match fold(held) {
                    Ok(e) => e,
                    Err(why) => return Ok(Err(why)),
                };
                let mut outbox = txn.open_table(OUTBOX).map_err(db_err)?;
                let mut dropped = 0;
                if new_row {
                    let size = (row.len() + entry.len()) as u64;
                    if let Some(budget) = expendable {
                        dropped = make_room(txn, &mut outbox, size, budget)?;
                    }
                    let seq = append_row(&mut outbox, row, max)?;
                    if expendable.is_some() {
                        count_expendable(txn, seq, size, Some(key))?;
                    }
                }
                txn.open_table(LIVE)
                    .map_err(db_err)?
                    .insert(key, entry.as_slice())
                    .map_err(db_err)?;
                Enqueued {
                    queued: outbox.len().map_err(db_err)?,
                    dropped,
                }
            };
            self.queued.store(done.queued, Ordering::Relaxed);
            Ok(Ok(done))
        })
    }

    /// The live entry `key`, if the node holds one.
    pub fn live(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.read()?;
        let table = match txn.open_table(LIVE) {
            Ok(t) => t,
            // A store a hub without live state wrote, opened read-only.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db_err(e)),
        };
        let value = table.get(key).map_err(db_err)?.map(|v| v.value().to_vec());
        Ok(value)
    }

    /// Every live entry whose key starts with `prefix`.
    pub fn live_under(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let txn = self.read()?;
        let table = match txn.open_table(LIVE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(db_err(e)),
        };
        let end = prefix_end(prefix);
        let mut out = Vec::new();
        for entry in table.range(prefix..end.as_slice()).map_err(db_err)? {
            out.push(entry.map_err(db_err)?.1.value().to_vec());
        }
        Ok(out)
    }

    /// Settles the outbox row `seq` of live entry `key` after its replay, in one
    /// transaction: `settle` gets the entry and says what stays of it — None: nothing, the
    /// row and the entry go; Some: the entry as it now is, and the row stays to replay it.
    pub fn settle_live(
        &self,
        seq: u64,
        key: &[u8],
        settle: impl FnOnce(Option<Vec<u8>>) -> Option<Vec<u8>>,
    ) -> Result<(), StoreError> {
        self.in_write(|txn| {
            {
                let mut live = txn.open_table(LIVE).map_err(db_err)?;
                let held = live.get(key).map_err(db_err)?.map(|v| v.value().to_vec());
                match settle(held) {
                    Some(entry) => {
                        live.insert(key, entry.as_slice()).map_err(db_err)?;
                    }
                    None => {
                        live.remove(key).map_err(db_err)?;
                        let mut outbox = txn.open_table(OUTBOX).map_err(db_err)?;
                        outbox.remove(seq).map_err(db_err)?;
                        forget_expendable(txn, seq)?;
                        self.queued
                            .store(outbox.len().map_err(db_err)?, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        })
    }

    /// Stored entries (objects and tombstones) and the file's size: cheap enough for
    /// every status call.
    pub fn counts(&self) -> Result<(u64, u64), StoreError> {
        let txn = self.read()?;
        let entries = txn
            .open_table(OBJECTS)
            .map_err(db_err)?
            .len()
            .map_err(db_err)?;
        let bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        Ok((entries, bytes))
    }
}

/// Appends `row` to the outbox, unless it already holds `max`; returns its sequence number.
fn append_row(
    outbox: &mut redb::Table<u64, &[u8]>,
    row: &[u8],
    max: u64,
) -> Result<u64, StoreError> {
    if outbox.len().map_err(db_err)? >= max {
        return Err(StoreError::Db(format!(
            "the offline write queue is full ({max} writes)"
        )));
    }
    let next = outbox
        .last()
        .map_err(db_err)?
        .map_or(1, |(k, _)| k.value() + 1);
    outbox.insert(next, row).map_err(db_err)?;
    Ok(next)
}

/// Drops the oldest expendable rows (with the live entries they replay), never others,
/// until one more of `size` bytes fits `budget`; returns how many went.
fn make_room(
    txn: &redb::WriteTransaction,
    outbox: &mut redb::Table<u64, &[u8]>,
    size: u64,
    budget: Budget,
) -> Result<u64, StoreError> {
    if size > budget.bytes {
        return Err(StoreError::Db(format!(
            "this write ({size} bytes) is larger than its queue's budget"
        )));
    }
    let mut cheap = txn.open_table(EXPENDABLE).map_err(db_err)?;
    let mut entries = txn.open_table(EXPENDABLE_ENTRIES).map_err(db_err)?;
    let mut live = txn.open_table(LIVE).map_err(db_err)?;
    let total_row = cheap.get(BUDGET_TOTAL).map_err(db_err)?.map(|v| v.value());
    let mut total = total_row.unwrap_or(0);
    let mut count = cheap.len().map_err(db_err)? - u64::from(total_row.is_some());
    let mut dropped = 0;
    while count > 0 && (count >= budget.count || total + size > budget.bytes) {
        let Some((seq, len)) = cheap
            .first()
            .map_err(db_err)?
            .map(|(k, v)| (k.value(), v.value()))
            .filter(|(k, _)| *k != BUDGET_TOTAL)
        else {
            break;
        };
        cheap.remove(seq).map_err(db_err)?;
        outbox.remove(seq).map_err(db_err)?;
        let key = entries
            .remove(seq)
            .map_err(db_err)?
            .map(|k| k.value().to_vec());
        if let Some(k) = key {
            live.remove(k.as_slice()).map_err(db_err)?;
        }
        (count, total, dropped) = (count - 1, total.saturating_sub(len), dropped + 1);
    }
    cheap.insert(BUDGET_TOTAL, total).map_err(db_err)?;
    Ok(dropped)
}

/// Counts row `seq` (`size` bytes, replaying the live entry `entry` if any) in the
/// expendable writes' budget.
fn count_expendable(
    txn: &redb::WriteTransaction,
    seq: u64,
    size: u64,
    entry: Option<&[u8]>,
) -> Result<(), StoreError> {
    let mut cheap = txn.open_table(EXPENDABLE).map_err(db_err)?;
    let total = cheap
        .get(BUDGET_TOTAL)
        .map_err(db_err)?
        .map_or(0, |v| v.value());
    cheap.insert(BUDGET_TOTAL, total + size).map_err(db_err)?;
    cheap.insert(seq, size).map_err(db_err)?;
    if let Some(k) = entry {
        txn.open_table(EXPENDABLE_ENTRIES)
            .map_err(db_err)?
            .insert(seq, k)
            .map_err(db_err)?;
    }
    Ok(())
}

/// Takes a write that left the queue out of the expendable writes' budget, if it was one.
fn forget_expendable(txn: &redb::WriteTransaction, seq: u64) -> Result<(), StoreError> {
    txn.open_table(EXPENDABLE_ENTRIES)
        .map_err(db_err)?
        .remove(seq)
        .map_err(db_err)?;
    let mut cheap = txn.open_table(EXPENDABLE).map_err(db_err)?;
    let size = cheap.remove(seq).map_err(db_err)?.map(|v| v.value());
    if let Some(size) = size {
        let total = cheap
            .get(BUDGET_TOTAL)
            .map_err(db_err)?
            .map_or(0, |v| v.value());
        cheap
            .insert(BUDGET_TOTAL, total.saturating_sub(size))
            .map_err(db_err)?;
    }
    Ok(())
}

fn tombstone(mut item: Item, now: u64) -> Record {
    item.body.clear();
    Record {
        deleted: true,
        one_off: false,
        left_selection: false,
        stored_at: now,
        item,
    }
}

/// What the store held when the snapshot was taken.
pub struct Snapshot {
    objects: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
}

impl Snapshot {
    /// True if an upsert of `key` at `rv` would change nothing: the store holds that state
    /// or a newer one.
    pub fn holds(&self, key: &[u8], rv: u64, encoding: Encoding) -> Result<bool, StoreError> {
        Ok(stored_version(&self.objects, key)?.is_some_and(|v| supersedes(v, rv, encoding)))
    }
}

/// True when the stored record (object or tombstone) makes `incoming` pointless: it is
/// newer, or it is the same state (same resourceVersion) in the same encoding. The same
/// state in another encoding replaces it: the component's latest way of asking wins.
fn supersedes(stored: Version, incoming_rv: u64, incoming: Encoding) -> bool {
    if incoming_rv == 0 {
        return false;
    }
    stored.rv > incoming_rv
        || (stored.rv == incoming_rv && (stored.deleted || incoming == stored.encoding))
}

/// The version of what `key` holds, read from the record's fixed header alone.
fn stored_version(
    objects: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<Version>, StoreError> {
    Ok(objects
        .get(key)
        .map_err(db_err)?
        .and_then(|v| Version::read(v.value())))
}

/// Records a complete list under its selector; the scope's oldest record goes when the
/// scope already holds [`MAX_LISTS_PER_SCOPE`]. True if the selector had no record.
fn remember_list(
    lists: &mut redb::Table<&[u8], &[u8]>,
    credential: &str,
    gvr: &str,
    namespace: &str,
    meta: &ListMeta,
) -> Result<bool, StoreError> {
    let key = list_key(
        credential,
        gvr,
        namespace,
        (&meta.selector.0, &meta.selector.1),
    );
    let (start, end) = list_scope(credential, gvr, namespace);
    // A record from before per-selector records: this one takes its place.
    lists.remove(start.as_slice()).map_err(db_err)?;
    let new = lists.get(key.as_slice()).map_err(db_err)?.is_none();
    // Counting is cheap; the records are read only when one has to go.
    if new
        && lists
            .range(start.as_slice()..end.as_slice())
            .map_err(db_err)?
            .count()
            >= MAX_LISTS_PER_SCOPE
    {
        let mut held: Vec<(u64, Vec<u8>)> = Vec::new();
        for entry in lists
            .range(start.as_slice()..end.as_slice())
            .map_err(db_err)?
        {
            let (k, v) = entry.map_err(db_err)?;
            let at = ListMeta::decode(v.value()).map_or(0, |m| m.stored_at);
            held.push((at, k.value().to_vec()));
        }
        {
            held.sort();
            for (_, k) in &held[..=held.len() - MAX_LISTS_PER_SCOPE] {
                lists.remove(k.as_slice()).map_err(db_err)?;
            }
        }
    }
    lists
        .insert(key.as_slice(), meta.encode().as_slice())
        .map_err(db_err)?;
    Ok(new)
}

fn stored(objects: &redb::Table<&[u8], &[u8]>, key: &[u8]) -> Result<Option<Record>, StoreError> {
    Ok(objects
        .get(key)
        .map_err(db_err)?
        .and_then(|v| Record::decode(v.value())))
}

/// Whose objects a list replaces, and where.
struct ListScope<'a> {
    credential: &'a str,
    component: &'a str,
    gvr: &'a str,
    namespace: &'a str,
}

impl ListScope<'_> {
    fn key(&self, namespace: &str, name: &str) -> Vec<u8> {
        object_key(self.credential, self.gvr, namespace, name, self.component)
    }
}

/// Writes a complete list's `items` over the component's records in its scope; `held`
/// items stay as they are; what the list did not return and the selector covers becomes a
/// tombstone. Existing records are read by their header only; whole records only for
/// those the list left out. Returns false when a held item was no longer stored (the
/// list is then not whole in the cache).
fn replace_list(
    objects: &mut redb::Table<&[u8], &[u8]>,
    scope: ListScope,
    prune: Option<&Selector>,
    rv: u64,
    (items, held): (&[Item], &[(String, String)]),
    now: u64,
    applied: &mut Applied,
) -> Result<bool, StoreError> {
    let ns = (!scope.namespace.is_empty()).then_some(scope.namespace);
    let start = prefix(scope.credential, scope.gvr, ns, None);
    let end = prefix_end(&start);
    // This component's records in the list's scope, by key: (version, when stored). Read
    // from the keys' last part and the records' headers, nothing decoded.
    let mut own_suffix = vec![0u8];
    own_suffix.extend_from_slice(scope.component.as_bytes());
    let mut existing: HashMap<Vec<u8>, (Version, u64)> = HashMap::new();
    for entry in objects
        .range(start.as_slice()..end.as_slice())
        .map_err(db_err)?
    {
        let (k, v) = entry.map_err(db_err)?;
        if !k.value().ends_with(&own_suffix) {
            continue;
        }
        if let Some(header) = Version::stored(v.value()) {
            existing.insert(k.value().to_vec(), header);
        }
    }
    let mut complete = true;
    for (ns, name) in held {
        complete &= existing.remove(&scope.key(ns, name)).is_some();
        applied.stale += 1;
    }
    for item in items {
        let key = scope.key(&item.namespace, &item.name);
        let old = existing.remove(&key);
        // A watch event newer than this list may already be stored: keep it.
        if old.is_some_and(|(o, _)| supersedes(o, item.rv, item.encoding)) {
            applied.stale += 1;
            continue;
        }
        let flags = Flags {
            deleted: false,
            one_off: false,
            left_selection: false,
        };
        objects
            .insert(
                key.as_slice(),
                encode_record(flags, now, item, &item.body).as_slice(),
            )
            .map_err(db_err)?;
        applied.written += 1;
    }
    // What the list did not return, and the selector covers, is gone as of `rv`.
    for (k, (version, stored_at)) in existing {
        if version.deleted {
            if now.saturating_sub(stored_at) > TOMBSTONE_TTL_SECS && version.rv <= rv {
                objects.remove(k.as_slice()).map_err(db_err)?;
                applied.purged += 1;
            }
            continue;
        }
        let Some(selector) = prune else { continue };
        if version.rv > rv {
            continue;
        }
        let Some(old) = stored(objects, &k)? else {
            continue;
        };
        if !selector.matches_item(&old.item) {
            continue;
        }
        let mut gone = old.item;
        gone.rv = rv;
        let mut rec = tombstone(gone, now);
        rec.left_selection = !selector.membership_is_permanent();
        objects
            .insert(k.as_slice(), rec.encode().as_slice())
            .map_err(db_err)?;
        applied.deleted += 1;
    }
    Ok(complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(ns: &str, name: &str, rv: u64, app: &str) -> Item {
        Item {
            name: name.into(),
            namespace: ns.into(),
            rv,
            labels: vec![("app".into(), app.into())],
            fields: vec![],
            api_version: "v1".into(),
            kind: "Pod".into(),
            encoding: Encoding::Json,
            body: format!("{{\"rv\":{rv}}}").into_bytes(),
        }
    }

    fn key(ns: &str, name: &str, component: &str) -> ObjectKey {
        ObjectKey {
            credential: "node".into(),
            gvr: "/v1/pods".into(),
            namespace: ns.into(),
            name: name.into(),
            component: component.into(),
        }
    }

    fn live(store: &Store) -> Vec<(String, u64)> {
        store
            .scan(&prefix("node", "/v1/pods", None, None))
            .unwrap()
            .into_iter()
            .filter(|(_, r)| !r.deleted)
            .map(|(k, r)| {
                (
                    format!("{}/{}@{}", k.namespace, k.name, k.component),
                    r.item.rv,
                )
            })
            .collect()
    }

    fn replace(ns: &str, selector: &str, rv: u64, items: Vec<Item>) -> Write {
        Write::ReplaceList {
            credential: "node".into(),
            component: "kubelet".into(),
            gvr: "/v1/pods".into(),
            namespace: ns.into(),
            selector: Selector::parse(selector, "").unwrap(),
            prune: true,
            rv,
            items,
            held: vec![],
            list_kind: "PodList".into(),
        }
    }

    fn temp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "hub-store-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn record_round_trip_and_corruption() {
        let r = Record::live(item("d", "a", 9, "web"), true, 5);
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        let mut t = tombstone(item("d", "a", 9, "web"), 6);
        t.left_selection = true;
        assert_eq!(Record::decode(&t.encode()), Some(t.clone()));
        let enc = r.encode();
        assert_eq!(Version::read(&enc), Some(r.version()));
        assert_eq!(Version::read(&t.encode()), Some(t.version()));
        assert_eq!(Record::decode(&enc[..20]), None);
        assert_eq!(Record::decode(b""), None);
    }

    #[test]
    fn objects_only_a_get_brought_are_one_off_until_a_list_covers_them() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let get = |rv| Write::Upsert {
            key: key("d", "a", "kubelet"),
            item: item("d", "a", rv, "web"),
            one_off: true,
        };
        let one_off = |s: &Store| {
            s.scan(&prefix("node", "/v1/pods", None, None)).unwrap()[0]
                .1
                .one_off
        };
        s.apply(&[get(5)]).unwrap();
        assert!(one_off(&s));
        s.apply(&[replace("", "", 6, vec![item("d", "a", 6, "web")])])
            .unwrap();
        assert!(!one_off(&s));
        // A later GET of a listed object does not make it one-off again.
        s.apply(&[get(7)]).unwrap();
        assert!(!one_off(&s));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fresher_wins_and_tombstones_block_stale_events() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let up = |rv| Write::Upsert {
            key: key("d", "a", "kubelet"),
            item: item("d", "a", rv, "web"),
            one_off: false,
        };
        s.apply(&[up(5)]).unwrap();
        let a = s.apply(&[up(4), up(5)]).unwrap();
        assert_eq!((a.written, a.stale), (0, 2));
        s.apply(&[Write::Delete {
            key: key("d", "a", "kubelet"),
            item: item("d", "a", 8, "web"),
            left_selection: true,
        }])
        .unwrap();
        assert!(live(&s).is_empty());
        let stored = s.scan(&prefix("node", "/v1/pods", None, None)).unwrap();
        assert!(stored[0].1.deleted && stored[0].1.left_selection);
        // An event from before the deletion does not resurrect it.
        assert_eq!(s.apply(&[up(7)]).unwrap().stale, 1);
        assert!(live(&s).is_empty());
        s.apply(&[up(9)]).unwrap();
        assert_eq!(live(&s), vec![("d/a@kubelet".into(), 9)]);
        // The same state asked for in another encoding replaces the stored form.
        let mut pb = item("d", "a", 9, "web");
        pb.encoding = Encoding::Protobuf;
        let a = s
            .apply(&[Write::Upsert {
                key: key("d", "a", "kubelet"),
                item: pb,
                one_off: false,
            }])
            .unwrap();
        assert_eq!(a.written, 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn list_replace_respects_namespace_selector_component_and_newer_events() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        s.apply(&[
            replace(
                "",
                "",
                10,
                vec![
                    item("ns1", "a", 3, "web"),
                    item("ns1", "b", 4, "db"),
                    item("ns10", "c", 5, "web"),
                ],
            ),
            Write::Upsert {
                key: key("ns1", "a", "kube-proxy"),
                item: item("ns1", "a", 3, "web"),
                one_off: false,
            },
        ])
        .unwrap();
        // A namespaced list of ns1 does not touch ns10 (prefix trap: ns1 vs ns10).
        s.apply(&[replace("ns1", "", 11, vec![item("ns1", "a", 3, "web")])])
            .unwrap();
        assert_eq!(
            live(&s),
            vec![
                ("ns1/a@kube-proxy".into(), 3),
                ("ns1/a@kubelet".into(), 3),
                ("ns10/c@kubelet".into(), 5)
            ]
        );
        // A newer event, then an older list without the object: the event's state stays.
        s.apply(&[Write::Upsert {
            key: key("ns10", "d", "kubelet"),
            item: item("ns10", "d", 20, "web"),
            one_off: false,
        }])
        .unwrap();
        // A selector-limited list only replaces what the selector covers.
        s.apply(&[replace("", "app=db", 15, vec![])]).unwrap();
        assert_eq!(live(&s).len(), 4);
        s.apply(&[replace("", "app=web", 15, vec![item("ns1", "a", 3, "web")])])
            .unwrap();
        assert_eq!(
            live(&s),
            vec![
                ("ns1/a@kube-proxy".into(), 3),
                ("ns1/a@kubelet".into(), 3),
                ("ns10/d@kubelet".into(), 20)
            ]
        );
        // Each selector keeps its own record (the unfiltered one, from rv 10, too).
        let metas: Vec<(u64, bool, (String, String))> = s
            .list_metas("node", "/v1/pods", "")
            .unwrap()
            .into_iter()
            .map(|m| (m.rv, m.unfiltered, m.selector))
            .collect();
        assert_eq!(metas.len(), 3, "{metas:?}");
        for want in [
            (15, false, ("app=web".to_string(), String::new())),
            (15, false, ("app=db".to_string(), String::new())),
        ] {
            assert!(metas.contains(&want), "{metas:?}");
        }
        assert!(metas.iter().any(|(_, unfiltered, _)| *unfiltered));
        // Gone from an unfiltered list: deleted. Gone from a filtered one: maybe only out
        // of the selection, which the pool must not take for a deletion.
        let tombstones: Vec<(String, bool)> = s
            .scan(&prefix("node", "/v1/pods", None, None))
            .unwrap()
            .into_iter()
            .filter(|(_, r)| r.deleted)
            .map(|(k, r)| (format!("{}/{}", k.namespace, k.name), r.left_selection))
            .collect();
        assert_eq!(
            tombstones,
            vec![("ns1/b".into(), false), ("ns10/c".into(), true)]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn expendable_writes_make_room_by_dropping_their_oldest_only() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let budget = Budget {
            count: 3,
            bytes: 100,
        };
        let queue = |s: &Store| -> Vec<String> {
            s.queued(100)
                .unwrap()
                .into_iter()
                .map(|(_, w)| String::from_utf8(w).unwrap())
                .collect()
        };
        s.enqueue(b"lease-1", None, 100, None).unwrap();
        for i in 0..3 {
            let done = s
                .enqueue(format!("event-{i}").as_bytes(), None, 100, Some(budget))
                .unwrap();
            assert_eq!(done.dropped, 0);
        }
        s.enqueue(b"status-1", None, 100, None).unwrap();
        // A fourth event: the oldest event goes, never the lease or the status.
        let done = s.enqueue(b"event-3", None, 100, Some(budget)).unwrap();
        assert_eq!((done.queued, done.dropped), (5, 1));
        assert_eq!(
            queue(&s),
            ["lease-1", "event-1", "event-2", "status-1", "event-3"]
        );
        // Bytes count too: a large event pushes out as many as it needs.
        let big = [b'x'; 90];
        let done = s.enqueue(&big, None, 100, Some(budget)).unwrap();
        assert_eq!(done.dropped, 2);
        assert_eq!(queue(&s).len(), 4);
        // Replayed events give their share back.
        for (seq, _) in s.queued(100).unwrap() {
            s.dequeue(seq).unwrap();
        }
        for i in 0..3 {
            let d = s
                .enqueue(format!("e{i}").as_bytes(), None, 100, Some(budget))
                .unwrap();
            assert_eq!(d.dropped, 0, "the budget is whole again");
        }
        assert!(
            s.enqueue(&[b'y'; 101], None, 100, Some(budget)).is_err(),
            "larger than the whole budget"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn live_entries_of_expendable_rows_go_with_their_rows() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let budget = Budget {
            count: 2,
            bytes: 1000,
        };
        let fold = |key: &str, state: &str| {
            s.fold_live(key.as_bytes(), key.as_bytes(), 100, Some(budget), |_| {
                Ok::<_, ()>(state.as_bytes().to_vec())
            })
            .unwrap()
            .unwrap()
        };
        assert_eq!(fold("ev-a", "1").dropped, 0);
        // A later write of the same entry rides on its row: nothing to make room for.
        assert_eq!((fold("ev-a", "2").queued, fold("ev-b", "1").queued), (1, 2));
        let done = fold("ev-c", "1");
        assert_eq!((done.queued, done.dropped), (2, 1));
        assert_eq!(
            s.live(b"ev-a").unwrap(),
            None,
            "the oldest went, entry and row"
        );
        assert_eq!(s.live(b"ev-c").unwrap().as_deref(), Some(&b"1"[..]));
        // A settled row gives its share back.
        let (seq, _) = s.queued(1).unwrap().remove(0);
        s.settle_live(seq, b"ev-b", |_| None).unwrap();
        assert_eq!(fold("ev-d", "1").dropped, 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn held_items_are_neither_rewritten_nor_pruned() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let relist = |rv, items, held: &[&str]| {
            let mut w = replace("ns1", "", rv, items);
            if let Write::ReplaceList { held: h, .. } = &mut w {
                h.extend(held.iter().map(|n| ("ns1".to_string(), n.to_string())));
            }
            w
        };
        s.apply(&[replace(
            "ns1",
            "",
            10,
            vec![item("ns1", "a", 5, "x"), item("ns1", "b", 6, "x")],
        )])
        .unwrap();
        // Unchanged: only the list's record is written.
        let a = s.apply(&[relist(15, vec![], &["a", "b"])]).unwrap();
        assert_eq!((a.written, a.stale, a.deleted), (0, 2, 0));
        // a unchanged, b changed, c new.
        let a = s
            .apply(&[relist(
                20,
                vec![item("ns1", "b", 7, "x"), item("ns1", "c", 8, "x")],
                &["a"],
            )])
            .unwrap();
        assert_eq!((a.written, a.stale, a.deleted), (2, 1, 0));
        let expect = |names: &[(&str, u64)]| -> Vec<(String, u64)> {
            names
                .iter()
                .map(|(n, rv)| (format!("ns1/{n}@kubelet"), *rv))
                .collect()
        };
        assert_eq!(live(&s), expect(&[("a", 5), ("b", 7), ("c", 8)]));
        let list_rv = |s: &Store| s.list_metas("node", "/v1/pods", "ns1").unwrap()[0].rv;
        assert_eq!(list_rv(&s), 20);
        // A held item that is no longer stored: the list is not claimed whole, and the
        // objects it named are left as they are.
        let a = s.apply(&[relist(30, vec![], &["a", "b", "gone"])]).unwrap();
        assert_eq!(a.deleted, 1);
        assert_eq!(list_rv(&s), 20);
        assert_eq!(
            live(&s),
            expect(&[("a", 5), ("b", 7)]),
            "c was pruned, a and b kept"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn each_selector_keeps_its_list_record_within_a_bound() {
        let dir = temp();
        let s = Store::open(&dir).unwrap();
        let by_name = |name: &str, rv: u64| Write::ReplaceList {
            credential: "node".into(),
            component: "kubelet".into(),
            gvr: "/v1/configmaps".into(),
            namespace: "ns1".into(),
            selector: Selector::parse("", &format!("metadata.name={name}")).unwrap(),
            prune: true,
            rv,
            items: vec![],
            held: vec![],
            list_kind: "ConfigMapList".into(),
        };
        let started = std::time::Instant::now();
        let n = MAX_LISTS_PER_SCOPE + 10;
        let writes: Vec<Write> = (0..n)
            .map(|i| by_name(&format!("cm-{i}"), i as u64 + 1))
            .collect();
        s.apply(&writes).unwrap();
        let metas = s.list_metas("node", "/v1/configmaps", "ns1").unwrap();
        eprintln!(
            "{n} per-name lists recorded in {:?}; {} kept",
            started.elapsed(),
            metas.len()
        );
        assert_eq!(metas.len(), MAX_LISTS_PER_SCOPE);
        assert!(metas.iter().all(|m| m.kind == "ConfigMapList"));
        // The same selector again replaces its record, it does not add one.
        s.apply(&[by_name("cm-5000", 9999)]).unwrap();
        let metas = s.list_metas("node", "/v1/configmaps", "ns1").unwrap();
        assert_eq!(metas.len(), MAX_LISTS_PER_SCOPE);
        assert!(metas.iter().any(|m| m.rv == 9999));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn files_are_owner_only() {
        let dir = temp().join("state");
        let s = Store::open(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&s.path), 0o600);
        drop(s);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
