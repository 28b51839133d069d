//! The cache writer: one thread that receives teed answers in arrival order, parses them
//! and applies them to the store in batches (one transaction per batch: group commit), so
//! the data path does not wait for the disk and no write is dropped under back-to-back lists
//! (YurtHub dropped ~90% with "key under accessing"). Only a watch stream that outruns the
//! writer by more than [`room::BUDGET`] waits for it (see `room`).
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;

use crate::kproto;

use super::{
    fingerprint::{self, Fingerprint},
    objects::{self, Encoding, EventType, Item},
    repeats::{self, Repeats},
    room::{self, Room},
    select::Selector,
    store::{self, Applied, ObjectKey, Snapshot, Store, Write},
};

/// Ops applied in one transaction at most.
const BATCH_OPS: usize = 512;
/// Batches with this many objects owe the OS their memory back.
const TRIM_AFTER: usize = 1000;
/// So does a queue that held this many bytes (a burst of watch events).
const TRIM_AFTER_QUEUED: usize = 1 << 20;
/// Memory owed is given back once the writer was idle this long. Given back after every
/// large batch, the pages came straight back as page faults on the next list (against
/// kube-apiserver 1.32, CPU per 7 MB JSON list: 15.9 ms that way, 11.2 ms this way).
const TRIM_WHEN_IDLE: Duration = Duration::from_secs(1);
/// A chunked list whose next page does not come within this time is abandoned.
const STAGED_TTL: Duration = Duration::from_secs(300);
/// Chunked lists in progress at once, at most.
const STAGED_MAX: usize = 64;
/// How long the idle writer lets answers gather once the first (a GET answer or watch
/// event) arrives. Senders wake it only while it waits for the first (a send to a busy
/// or sleeping receiver costs no system call); a wake per answer cost both threads a
/// futex call and a context switch (measured on 2 vCPUs: the hub's CPU per proxied GET
/// fell from 208 to 183 µs). A list is taken at once: held back, its parse ran into the
/// next lists (1k JSON pods: 1.16× direct instead of 1.07×, same run).
const GATHER: Duration = Duration::from_millis(10);

/// How often writes the store refused (a full disk) are tried again while nothing new
/// comes.
const RETRY_REFUSED_EVERY: Duration = Duration::from_secs(1);
/// Writes the store refused are kept, in order, up to about this many bytes; past it the
/// oldest are dropped (memory stays bounded whatever the disk does).
const BACKLOG_MAX_BYTES: usize = 64 << 20;

/// Writes the store refused, oldest first: they go before anything newer, so a full disk
/// that empties again loses nothing a client was shown.
#[derive(Default)]
struct Backlog {
    writes: Vec<Write>,
    bytes: usize,
}

impl Backlog {
    /// The refused writes, then `newer`; the backlog is left empty.
    fn take_then(&mut self, newer: Vec<Write>) -> Vec<Write> {
        self.bytes = 0;
        let mut all = std::mem::take(&mut self.writes);
        all.extend(newer);
        all
    }

    /// Keeps `refused` to try again, within the bound; returns how many were dropped.
    fn keep(&mut self, refused: Vec<Write>) -> usize {
        self.bytes = refused.iter().map(write_bytes).sum();
        self.writes = refused;
        let mut dropped = 0;
        while self.bytes > BACKLOG_MAX_BYTES && !self.writes.is_empty() {
            self.bytes -= write_bytes(&self.writes.remove(0));
            dropped += 1;
        }
        dropped
    }
}

/// About what a write holds in memory.
fn write_bytes(w: &Write) -> usize {
    match w {
        Write::Upsert { item, .. } | Write::Delete { item, .. } => 128 + item.body.len(),
        Write::ReplaceList { items, .. } => items.iter().map(|i| 128 + i.body.len()).sum(),
        Write::Raw { body, .. } => 128 + body.len(),
        Write::ListSeen { .. } => 128,
    }
}

/// Where a teed answer belongs.
#[derive(Debug, Clone)]
pub struct Target {
    pub credential: String,
    pub component: String,
    /// `group/version/resource` (`/v1/pods` for the core group).
    pub gvr: String,
    pub resource: String,
    pub encoding: Encoding,
    pub kind: TargetKind,
}

#[derive(Debug, Clone)]
pub enum TargetKind {
    Object,
    List {
        namespace: String,
        label_selector: String,
        field_selector: String,
        /// The `continue` token the client sent (a later page of a chunked list).
        continue_from: Option<String>,
    },
    Watch {
        /// Its selector can stop matching an object that still exists (labels, mutable
        /// fields): the cloud then sends DELETED for it, which is no proof of a deletion.
        selection_may_change: bool,
        /// The list this watch keeps current: its namespace and (label, field) selectors.
        namespace: String,
        selector: (String, String),
        /// Its bookmarks move that list's resourceVersion when the list stands at this
        /// version or later (every event since is then applied): the client's own
        /// resourceVersion for a plain watch, the end of the initial events for a
        /// streamed list; None while nothing links the stream to the list.
        keeps_list_from: Option<u64>,
    },
    /// Discovery or /version, stored under its path and content type.
    Raw {
        path: String,
        content_type: String,
    },
}

pub enum Op {
    Whole {
        target: Target,
        body: Vec<Bytes>,
        /// The body is as the cloud sent it, gzipped (Content-Encoding: gzip).
        gzip: bool,
    },
    Event {
        target: Arc<Target>,
        frame: Bytes,
    },
    /// The initial events of a streamed list (`watch?sendInitialEvents=true`) up to the
    /// bookmark that ends them (`end`): the whole set, replacing the held one as a LIST
    /// would.
    StreamedList {
        target: Target,
        frames: Vec<Bytes>,
        end: objects::Bookmark,
    },
    /// Answers once everything sent before it is applied (tests and `hub cache` use it).
    Flush(mpsc::Sender<()>),
}

impl Op {
    /// About what it holds in memory while queued.
    fn bytes(&self) -> usize {
        const OVERHEAD: usize = 256;
        OVERHEAD
            + match self {
                Op::Whole { body, .. } => body.iter().map(Bytes::len).sum(),
                Op::Event { frame, .. } => frame.len(),
                Op::StreamedList { frames, .. } => frames.iter().map(Bytes::len).sum(),
                Op::Flush(_) => 0,
            }
    }

    /// A single object or event, worth waiting a moment for company; a list is worth a
    /// wake-up of its own (and is on the writer sooner).
    fn is_small(&self) -> bool {
        match self {
            Op::Event { .. } => true,
            Op::Whole { target, .. } => matches!(target.kind, TargetKind::Object),
            Op::StreamedList { .. } | Op::Flush(_) => false,
        }
    }
}

/// Counters shown in status and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub written: AtomicU64,
    pub stale: AtomicU64,
    /// Of the stale: objects recognised as held by a metadata scan alone, never parsed.
    pub scanned_only: AtomicU64,
    pub deleted: AtomicU64,
    /// Answers or events that could not be parsed or named an invalid object.
    pub rejected: AtomicU64,
    /// Answers too large to cache.
    pub too_large: AtomicU64,
    /// Batches the store refused (full disk, I/O error); the store is unchanged by them.
    pub write_errors: AtomicU64,
    pub pending: AtomicI64,
    /// Writes accepted while the cloud was unreachable, replayed, and given up on.
    pub offline_accepted: AtomicU64,
    pub replayed: AtomicU64,
    pub replay_dropped: AtomicU64,
    /// Queued writes a newer write of the same object made pointless: never sent.
    pub superseded: AtomicU64,
    /// Events written offline whose last sighting grew older than the cloud's event TTL
    /// before they could be sent: dropped, as the cloud would have let them expire.
    pub expired: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// When the last "writes queued" line was logged.
    pub queued_logged: Mutex<Option<Instant>>,
}

impl Stats {
    pub(super) fn error(&self, e: String) {
        tracing::warn!("cache: {e}");
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

/// The sending side, cheap to clone into every teed body.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Op>,
    stats: Arc<Stats>,
    repeats: Arc<Repeats>,
    room: Arc<Room>,
}

impl Writer {
    /// Hands a whole answer over, unless it is a GET answer the store is known to hold
    /// already (then it is only counted, as the writer would have).
    pub fn send_whole(&self, target: Target, body: Vec<Bytes>, gzip: bool) {
        if let Some(key) = repeats::key(&target, gzip, &body)
            && self.repeats.held(key)
        {
            self.stats.stale.fetch_add(1, Ordering::Relaxed);
            self.stats.scanned_only.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.send(Op::Whole { target, body, gzip });
    }

    pub fn send(&self, op: Op) {
        let bytes = op.bytes();
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        self.room.add(bytes);
        if self.tx.send(op).is_err() {
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
            self.room.done(bytes);
        }
    }

    /// Ready while the writer is less than [`room::BUDGET`] behind; a teed watch stream
    /// polls this before it reads more from the cloud.
    pub fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.room.poll(cx)
    }

    /// Times a watch stream waited for the writer to catch up.
    pub fn waits(&self) -> u64 {
        self.room.waits.load(Ordering::Relaxed)
    }

    /// About how many bytes wait in its queue.
    pub fn queued_bytes(&self) -> usize {
        self.room.queued()
    }

    pub fn too_large(&self) {
        self.stats.too_large.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits (at most `limit`) until everything sent so far is in the store.
    pub fn flush_within(&self, limit: Duration) {
        let (tx, rx) = mpsc::channel();
        self.send(Op::Flush(tx));
        let _ = rx.recv_timeout(limit);
    }
}

struct Staged {
    target: Target,
    kind: String,
    rv: u64,
    items: Vec<Item>,
    /// Items the store held already: (namespace, name).
    held: Vec<(String, String)>,
    since: Instant,
}

/// Starts the writer thread for `store`.
pub fn start(store: Arc<Store>, stats: Arc<Stats>) -> Writer {
    spawn(store, stats, room::BUDGET)
}

/// [`start`] with `budget` as the bound on what may wait in its queue.
fn spawn(store: Arc<Store>, stats: Arc<Stats>, budget: usize) -> Writer {
    let (tx, rx) = mpsc::channel::<Op>();
    let thread_stats = stats.clone();
    let repeats = Arc::new(Repeats::new(store.clone()));
    let thread_repeats = repeats.clone();
    let room = Arc::new(Room::new(budget));
    let thread_room = room.clone();
    std::thread::Builder::new()
        .name("hub-cache-writer".into())
        .spawn(move || {
            // Closed however the thread ends (a panic included), so no stream waits on it.
            struct CloseOnExit(Arc<Room>);
            impl Drop for CloseOnExit {
                fn drop(&mut self) {
                    self.0.close();
                }
            }
            let room = CloseOnExit(thread_room);
            run(store, rx, thread_stats, &thread_repeats, &room.0)
        })
        .expect("spawn cache writer thread");
    Writer {
        tx,
        stats,
        repeats,
        room,
    }
}

fn run(
    store: Arc<Store>,
    rx: mpsc::Receiver<Op>,
    stats: Arc<Stats>,
    repeats: &Repeats,
    room: &Room,
) {
    let mut staged: HashMap<String, Staged> = HashMap::new();
    let mut backlog = Backlog::default();
    let mut seen = SeenLists::default();
    // Large batches or a long queue since memory was last given back.
    let mut trim_owed = false;
    loop {
        // With writes the store refused waiting, wake now and then to try them again;
        // with memory owed, give it back once idle.
        let retry = (!backlog.writes.is_empty()).then_some(RETRY_REFUSED_EVERY);
        let wait = retry
            .into_iter()
            .chain(trim_owed.then_some(TRIM_WHEN_IDLE))
            .min();
        let first = match wait {
            None => rx.recv().map(Some).map_err(|_| ()),
            Some(wait) => match rx.recv_timeout(wait) {
                Ok(op) => Ok(Some(op)),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if std::mem::take(&mut trim_owed) {
                        give_memory_back();
                    }
                    if backlog.writes.is_empty() {
                        continue;
                    }
                    Ok(None)
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
            },
        };
        let Ok(first) = first else { break };
        if first.as_ref().is_some_and(Op::is_small) {
            std::thread::sleep(GATHER);
        }
        let mut ops: Vec<Op> = first.into_iter().collect();
        while !ops.is_empty() && ops.len() < BATCH_OPS {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        // Counted as pending until the batch is in the store (or refused), so "nothing
        // pending" means everything sent so far can be read back.
        let taken = ops.len() as i64;
        let taken_bytes: usize = ops.iter().map(Op::bytes).sum();
        trim_owed |= room.queued() >= TRIM_AFTER_QUEUED;
        let mut writes = Vec::new();
        let mut flushes = Vec::new();
        // Taken at the first GET answer; the batch's writes come after all its questions.
        let mut snapshot = None;
        seen.note(&backlog.writes);
        for op in ops {
            let repeat = match &op {
                Op::Whole { target, body, gzip } => repeats::key(target, *gzip, body),
                _ => None,
            };
            let op = match decoded(op) {
                Ok(op) => op,
                Err(e) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    stats.error(e);
                    continue;
                }
            };
            match op {
                Op::Flush(done) => flushes.push(done),
                op if already_held(&mut Held::new(&store, &mut snapshot), &op) => {
                    stats.stale.fetch_add(1, Ordering::Relaxed);
                    stats.scanned_only.fetch_add(1, Ordering::Relaxed);
                    if let (Some(key), Op::Whole { target, .. }) = (repeat, &op) {
                        repeats.vouch(key, target);
                    }
                }
                op => match prepare(
                    op,
                    &mut staged,
                    &mut Held::new(&store, &mut snapshot),
                    &mut seen,
                    &stats,
                ) {
                    Ok(w) => {
                        seen.note(&w);
                        writes.extend(w);
                    }
                    // A Table (kubectl's default output) or a Status: nothing to keep.
                    Err(Rejected::NotAnObject) => {}
                    Err(Rejected::Bad(e)) => {
                        stats.rejected.fetch_add(1, Ordering::Relaxed);
                        stats.error(e);
                    }
                },
            }
        }
        drop(snapshot);
        // What the store refused before goes first, in its order.
        let writes = backlog.take_then(writes);
        if writes.is_empty() {
            seen.settle(&store, &[], None);
        } else {
            let large = writes.len() >= TRIM_AFTER
                || writes.iter().any(
                    |w| matches!(w, Write::ReplaceList { items, .. } if items.len() >= TRIM_AFTER),
                );
            let result = store.apply(&writes);
            seen.settle(&store, &writes, result.as_ref().ok());
            // Parsed lists are freed now; their memory goes back instead of staying as RSS.
            trim_owed |= large;
            match result {
                Ok(a) => {
                    stats.written.fetch_add(a.written, Ordering::Relaxed);
                    stats.stale.fetch_add(a.stale, Ordering::Relaxed);
                    stats.deleted.fetch_add(a.deleted, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.write_errors.fetch_add(1, Ordering::Relaxed);
                    let dropped = backlog.keep(writes);
                    stats.error(format!(
                        "write not stored, cache unchanged: {e}; {} writes kept to try again{}",
                        backlog.writes.len(),
                        if dropped > 0 {
                            format!(
                                ", the {dropped} oldest dropped (over {BACKLOG_MAX_BYTES} bytes)"
                            )
                        } else {
                            String::new()
                        }
                    ));
                }
            }
        }
        stats.pending.fetch_sub(taken, Ordering::Relaxed);
        room.done(taken_bytes);
        for f in flushes {
            let _ = f.send(());
        }
    }
}

fn give_memory_back() {
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A gzipped answer with its body decoded (a larger one than the cache keeps is refused).
fn decoded(op: Op) -> Result<Op, String> {
    match op {
        Op::Whole {
            target,
            body,
            gzip: true,
        } => {
            let plain = crate::gzip::decode(&body, super::tee::MAX_CACHED_BODY)
                .map_err(|e| format!("{} {}: {e}", target.component, target.gvr))?;
            Ok(Op::Whole {
                target,
                body: vec![plain.into()],
                gzip: false,
            })
        }
        op => Ok(op),
    }
}

fn concat(parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => parts.concat().into(),
    }
}

/// Asks whether the store already holds an object at a resourceVersion, with one read
/// snapshot for the whole batch: its writes come after all its questions. (callgrind,
/// 1500 repeated GETs: a snapshot and a whole-record decode per answer cost the writer
/// 42M instructions, a shared snapshot and the record's header 25M, most of it the
/// metadata scan.)
struct Held<'a> {
    store: &'a Store,
    snapshot: &'a mut Option<Snapshot>,
}

impl<'a> Held<'a> {
    fn new(store: &'a Store, snapshot: &'a mut Option<Snapshot>) -> Held<'a> {
        Held { store, snapshot }
    }

    fn holds(&mut self, target: &Target, id: &objects::Identity) -> bool {
        let key = store::object_key(
            &target.credential,
            &target.gvr,
            &id.namespace,
            &id.name,
            &target.component,
        );
        if self.snapshot.is_none() {
            *self.snapshot = self.store.snapshot().ok();
        }
        self.snapshot
            .as_ref()
            .is_some_and(|s| s.holds(&key, id.rv, target.encoding).unwrap_or(false))
    }
}

/// A GET answer or an ADDED/MODIFIED event whose object the store already holds at this
/// resourceVersion (the common repeat): found with a metadata scan and a read of the
/// stored record's header instead of parsing and re-encoding the whole object.
fn already_held(held: &mut Held, op: &Op) -> bool {
    let id = match op {
        Op::Whole { target, body, .. } if matches!(target.kind, TargetKind::Object) => {
            let body = concat(body.clone());
            match target.encoding {
                Encoding::Json => objects::identify_json(&body),
                Encoding::Protobuf => {
                    kproto::unwrap(&body).and_then(|u| objects::identify_protobuf(u.raw))
                }
            }
        }
        Op::Event { target, frame } => objects::identify_event(target.encoding, frame),
        _ => None,
    };
    let target = match op {
        Op::Whole { target, .. } => target,
        Op::Event { target, .. } => &**target,
        Op::StreamedList { .. } | Op::Flush(_) => return false,
    };
    id.is_some_and(|id| held.holds(target, &id))
}

/// Lists this writer stored whole, by fingerprint. A relist with the same fingerprint, when
/// nothing else has written objects of its resource since, holds exactly what the store
/// holds: it becomes a `ListSeen` (the list's resourceVersion moves, nothing is parsed,
/// looked up or rewritten). Kept in memory only: after a restart the first relist of each
/// list is read in full.
#[derive(Default)]
struct SeenLists {
    seen: HashMap<String, Seen>,
    /// Lists of the batch being prepared: remembered only once the batch is applied.
    pending: Vec<Pending>,
    /// `credential \0 gvr` of every write in the batch so far: a list in the same batch as
    /// another write of its resource is read in full.
    touched: std::collections::HashSet<String>,
}

struct Seen {
    items: u64,
    /// The store's count of batches writing this resource, right after this list's.
    generation: u64,
    objects: u64,
}

struct Pending {
    id: String,
    items: u64,
    objects: u64,
    /// `store::scope_key` of the list's resource.
    scope: String,
    generation_before: u64,
}

/// Lists remembered at most (each a few dozen bytes); past it they are forgotten.
const SEEN_MAX: usize = 4096;

fn list_id(t: &Target) -> Option<String> {
    let TargetKind::List {
        namespace,
        label_selector,
        field_selector,
        continue_from: None,
    } = &t.kind
    else {
        return None;
    };
    let enc = t.encoding.content_type();
    Some(format!(
        "{}\0{}\0{}\0{namespace}\0{label_selector}\0{field_selector}\0{enc}",
        t.credential, t.component, t.gvr
    ))
}

impl SeenLists {
    /// How many objects the list holds, when `fp` is the fingerprint this list had when it
    /// was last stored whole and nothing has written its resource since.
    fn unchanged(&self, store: &Store, target: &Target, fp: &Fingerprint) -> Option<u64> {
        let seen = self.seen.get(&list_id(target)?)?;
        let scope = store::scope_key(&target.credential, &target.gvr);
        (seen.items == fp.items
            && !self.touched.contains(&scope)
            && store.generation(&scope) == seen.generation)
            .then_some(seen.objects)
    }

    fn expect(&mut self, store: &Store, target: &Target, fp: &Fingerprint, objects: u64) {
        let Some(id) = list_id(target) else { return };
        let scope = store::scope_key(&target.credential, &target.gvr);
        self.pending.push(Pending {
            id,
            items: fp.items,
            objects,
            generation_before: store.generation(&scope),
            scope,
        });
    }

    fn note(&mut self, writes: &[Write]) {
        self.touched.extend(writes.iter().filter_map(Write::scope));
    }

    /// After the batch: remember the lists it stored whole, when the list was the batch's
    /// only write of its resource and no one else wrote it meanwhile; forget the others.
    fn settle(&mut self, store: &Store, writes: &[Write], applied: Option<&Applied>) {
        let lists = writes
            .iter()
            .filter(|w| matches!(w, Write::ReplaceList { .. }))
            .count() as u64;
        let all_whole = applied.is_some_and(|a| a.lists_whole == lists);
        for p in std::mem::take(&mut self.pending) {
            let writes_of_scope = writes
                .iter()
                .filter(|w| w.scope().as_ref() == Some(&p.scope))
                .count();
            let now = store.generation(&p.scope);
            if all_whole && writes_of_scope == 1 && now == p.generation_before + 1 {
                if self.seen.len() >= SEEN_MAX {
                    self.seen.clear();
                }
                self.seen.insert(
                    p.id,
                    Seen {
                        items: p.items,
                        generation: now,
                        objects: p.objects,
                    },
                );
            } else {
                self.seen.remove(&p.id);
            }
        }
        self.touched.clear();
    }
}

fn key(target: &Target, item: &Item) -> ObjectKey {
    ObjectKey {
        credential: target.credential.clone(),
        gvr: target.gvr.clone(),
        namespace: item.namespace.clone(),
        name: item.name.clone(),
        component: target.component.clone(),
    }
}

/// Why a teed answer was not stored.
enum Rejected {
    /// A rendering (Table) or a Status: not an error, there is just nothing to keep.
    NotAnObject,
    Bad(String),
}

impl From<String> for Rejected {
    fn from(s: String) -> Self {
        Rejected::Bad(s)
    }
}

/// Turns one teed answer into store writes (none for a page of an unfinished list).
fn prepare(
    op: Op,
    staged: &mut HashMap<String, Staged>,
    held: &mut Held,
    seen: &mut SeenLists,
    stats: &Stats,
) -> Result<Vec<Write>, Rejected> {
    let err = |t: &Target, e: objects::ParseError| match e {
        objects::ParseError::NotAnObject => Rejected::NotAnObject,
        e => Rejected::Bad(format!("{} {}: {e}", t.component, t.gvr)),
    };
    match op {
        Op::Flush(_) => Ok(vec![]),
        Op::StreamedList {
            target,
            frames,
            end,
        } => streamed_list(target, &frames, &end, held).map(|w| vec![w]),
        Op::Event { target, frame } => {
            let (ty, item) = objects::parse_event(&target.resource, target.encoding, &frame)
                .map_err(|e| err(&target, e))?;
            if ty == EventType::Bookmark {
                return Ok(bookmark_write(&target, &frame).into_iter().collect());
            }
            Ok(match (ty, item) {
                (EventType::Added | EventType::Modified, Some(item)) => vec![Write::Upsert {
                    key: key(&target, &item),
                    item,
                    one_off: false,
                }],
                (EventType::Deleted, Some(item)) => vec![Write::Delete {
                    key: key(&target, &item),
                    item,
                    left_selection: matches!(
                        target.kind,
                        TargetKind::Watch {
                            selection_may_change: true,
                            ..
                        }
                    ),
                }],
                _ => vec![],
            })
        }
        Op::Whole { target, body, .. } => {
            let whole = || concat(body.clone());
            match &target.kind {
                TargetKind::Raw { path, content_type } => {
                    let body = whole().to_vec();
                    if path == "/version" {
                        crate::convert::note_server_version(&body);
                    }
                    Ok(vec![Write::Raw {
                        path: path.clone(),
                        content_type: content_type.clone(),
                        body,
                    }])
                }
                TargetKind::Object => {
                    let item = objects::parse_object(&target.resource, target.encoding, &whole())
                        .map_err(|e| err(&target, e))?;
                    Ok(vec![Write::Upsert {
                        key: key(&target, &item),
                        item,
                        one_off: true,
                    }])
                }
                TargetKind::Watch { .. } => Ok(vec![]),
                TargetKind::List {
                    continue_from,
                    namespace,
                    label_selector,
                    field_selector,
                } => {
                    let fp = continue_from
                        .is_none()
                        .then(|| fingerprint::of_list(target.encoding, &body))
                        .flatten();
                    if let Some(fp) = &fp
                        && let Some(objects) = seen.unchanged(held.store, &target, fp)
                    {
                        stats.stale.fetch_add(objects, Ordering::Relaxed);
                        stats.scanned_only.fetch_add(objects, Ordering::Relaxed);
                        return Ok(vec![Write::ListSeen {
                            credential: target.credential.clone(),
                            gvr: target.gvr.clone(),
                            namespace: namespace.clone(),
                            selector: (label_selector.clone(), field_selector.clone()),
                            rv: fp.rv,
                            if_at_least: 0,
                        }]);
                    }
                    let page = objects::parse_list_pieces(
                        &target.resource,
                        target.encoding,
                        &body,
                        |id| held.holds(&target, id),
                    )
                    .map_err(|e| err(&target, e))?;
                    if page.bad > 0 {
                        return Err(Rejected::Bad(format!(
                            "{} {}: {} list items could not be cached (bad name or body)",
                            target.component, target.gvr, page.bad
                        )));
                    }
                    let mut acc = match continue_from {
                        None => Staged {
                            target: target.clone(),
                            kind: page.kind.clone(),
                            rv: page.rv,
                            items: Vec::new(),
                            held: Vec::new(),
                            since: Instant::now(),
                        },
                        // A later page whose first page we did not see: nothing to complete.
                        Some(token) => staged.remove(token).ok_or_else(|| {
                            Rejected::Bad(format!(
                                "{} {}: a list page arrived without its first page; not cached",
                                target.component, target.gvr
                            ))
                        })?,
                    };
                    acc.items.extend(page.items);
                    stats
                        .scanned_only
                        .fetch_add(page.held.len() as u64, Ordering::Relaxed);
                    acc.held.extend(page.held);
                    if !page.continue_token.is_empty() {
                        staged.retain(|_, s| s.since.elapsed() < STAGED_TTL);
                        if staged.len() < STAGED_MAX {
                            staged.insert(page.continue_token, acc);
                        }
                        return Ok(vec![]);
                    }
                    if let Some(fp) = &fp {
                        let objects = (acc.items.len() + acc.held.len()) as u64;
                        seen.expect(held.store, &target, fp, objects);
                    }
                    Ok(vec![replace_write(acc)?])
                }
            }
        }
    }
}

/// A streamed list's initial events as the list they are: the ADDED objects (a MODIFIED
/// or DELETED among them, which kube-apiserver does not send, is applied to the set in
/// order), at the end bookmark's resourceVersion. Objects already held at their version
/// are only named, as in a LIST. One bad event and the set is not stored: half a set
/// must not replace a whole one.
fn streamed_list(
    target: Target,
    frames: &[Bytes],
    end: &objects::Bookmark,
    held: &mut Held,
) -> Result<Write, Rejected> {
    let TargetKind::Watch {
        namespace,
        selector: (label_selector, field_selector),
        ..
    } = &target.kind
    else {
        return Err(Rejected::Bad("a streamed list without its watch".into()));
    };
    let list_target = Target {
        kind: TargetKind::List {
            namespace: namespace.clone(),
            label_selector: label_selector.clone(),
            field_selector: field_selector.clone(),
            continue_from: None,
        },
        ..target.clone()
    };
    // By (namespace, name): the parsed object, or None when it is held already.
    let mut set: HashMap<(String, String), Option<Item>> = HashMap::with_capacity(frames.len());
    for frame in frames {
        if let Some(id) = objects::identify_event(target.encoding, frame)
            && held.holds(&target, &id)
        {
            set.insert((id.namespace, id.name), None);
            continue;
        }
        let (ty, item) =
            objects::parse_event(&target.resource, target.encoding, frame).map_err(|e| {
                Rejected::Bad(format!(
                    "{} {}: streamed list not cached: {e}",
                    target.component, target.gvr
                ))
            })?;
        let Some(item) = item else { continue };
        let key = (item.namespace.clone(), item.name.clone());
        if ty == EventType::Deleted {
            set.remove(&key);
        } else {
            set.insert(key, Some(item));
        }
    }
    let (mut items, mut named) = (Vec::new(), Vec::new());
    for (key, item) in set {
        match item {
            Some(item) => items.push(item),
            None => named.push(key),
        }
    }
    let kind = if end.kind.is_empty() {
        String::new()
    } else {
        format!("{}List", end.kind)
    };
    Ok(replace_write(Staged {
        target: list_target,
        kind,
        rv: end.rv,
        items,
        held: named,
        since: Instant::now(),
    })?)
}

/// A bookmark of a watch that keeps a list current moves that list's resourceVersion.
fn bookmark_write(target: &Target, frame: &[u8]) -> Option<Write> {
    let TargetKind::Watch {
        namespace,
        selector,
        keeps_list_from: Some(from),
        ..
    } = &target.kind
    else {
        return None;
    };
    let mark = objects::bookmark(target.encoding, frame)?;
    Some(Write::ListSeen {
        credential: target.credential.clone(),
        gvr: target.gvr.clone(),
        namespace: namespace.clone(),
        selector: selector.clone(),
        rv: mark.rv,
        if_at_least: *from,
    })
}

/// The whole list, assembled: one atomic replacement.
fn replace_write(acc: Staged) -> Result<Write, String> {
    let t = acc.target;
    let TargetKind::List {
        namespace,
        label_selector,
        field_selector,
        ..
    } = t.kind
    else {
        return Err("not a list".into());
    };
    let selector = Selector::parse(&label_selector, &field_selector)
        .map_err(|e| format!("{} {}: {e}", t.component, t.gvr))?;
    let prune = selector
        .field_names()
        .all(|f| objects::supports_field(&t.resource, f));
    Ok(Write::ReplaceList {
        credential: t.credential,
        component: t.component,
        gvr: t.gvr,
        namespace,
        selector,
        prune,
        rv: acc.rv,
        items: acc.items,
        held: acc.held,
        list_kind: acc.kind,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn pod(name: &str, rv: u64) -> Bytes {
        format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{rv}"}},"spec":{{"nodeName":"n1"}}}}"#
        )
        .into()
    }

    /// The node's kubelet's JSON pods, as `kind` (a GET, a list, a watch).
    pub(crate) fn pods_target(kind: TargetKind) -> Target {
        Target {
            credential: "node".into(),
            component: "kubelet".into(),
            gvr: "/v1/pods".into(),
            resource: "pods".into(),
            encoding: Encoding::Json,
            kind,
        }
    }

    fn get(body: Bytes) -> Op {
        Op::Whole {
            target: pods_target(TargetKind::Object),
            // Split like a body that arrived in two frames.
            body: vec![body.slice(..10), body.slice(10..)],
            gzip: false,
        }
    }

    pub(crate) fn list(rv: u64, pods: &[(&str, u64)]) -> Op {
        let items: Vec<String> = pods
            .iter()
            .map(|(name, rv)| String::from_utf8(pod(name, *rv).to_vec()).unwrap())
            .collect();
        let body = Bytes::from(format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{}]}}"#,
            items.join(",")
        ));
        Op::Whole {
            target: pods_target(TargetKind::List {
                namespace: "d".into(),
                label_selector: String::new(),
                field_selector: String::new(),
                continue_from: None,
            }),
            body: vec![body.slice(..120), body.slice(120..)],
            gzip: false,
        }
    }

    fn event(ty: &str, name: &str, rv: u64) -> Op {
        let frame = format!(
            r#"{{"type":"{ty}","object":{}}}"#,
            String::from_utf8(pod(name, rv).to_vec()).unwrap()
        );
        Op::Event {
            target: Arc::new(pods_target(TargetKind::Watch {
                selection_may_change: false,
                namespace: "d".into(),
                selector: Default::default(),
                keeps_list_from: None,
            })),
            frame: Bytes::from(frame),
        }
    }

    /// A writer on a store in a fresh temporary directory.
    pub(crate) fn writer_on_temp_store(
        tag: &str,
    ) -> (std::path::PathBuf, Arc<Store>, Arc<Stats>, Writer) {
        writer_on_temp_store_within(tag, room::BUDGET)
    }

    /// [`writer_on_temp_store`], its queue bounded by `budget` bytes.
    pub(crate) fn writer_on_temp_store_within(
        tag: &str,
        budget: usize,
    ) -> (std::path::PathBuf, Arc<Store>, Arc<Stats>, Writer) {
        let dir = crate::files::fresh_test_dir(&format!("writer-{tag}"));
        let store = Arc::new(Store::open(&dir).unwrap());
        let stats = Arc::new(Stats::default());
        let writer = spawn(store.clone(), stats.clone(), budget);
        (dir, store, stats, writer)
    }

    /// A writer with no thread behind it, bounded by `budget` bytes: the test takes what
    /// is sent from the receiver and says when it is done with each ([`done_with`]).
    pub(crate) fn detached_writer(
        budget: usize,
    ) -> (std::path::PathBuf, Writer, mpsc::Receiver<Op>) {
        let (tx, rx) = mpsc::channel();
        let dir = crate::files::fresh_test_dir("writer-detached");
        let store = Arc::new(Store::open(&dir).unwrap());
        let writer = Writer {
            tx,
            stats: Arc::new(Stats::default()),
            repeats: Arc::new(Repeats::new(store)),
            room: Arc::new(Room::new(budget)),
        };
        (dir, writer, rx)
    }

    /// What the writer thread does once `op` is applied.
    pub(crate) fn done_with(writer: &Writer, op: &Op) {
        writer.room.done(op.bytes());
    }

    /// A relist with the items of the last list stored whole only moves the list's
    /// resourceVersion — unless something else wrote the resource since: then it is read
    /// in full, and what it no longer returns is pruned.
    #[test]
    fn relists_of_a_list_already_stored_whole_touch_only_its_resource_version() {
        let (dir, store, stats, writer) = writer_on_temp_store("seen");
        let applied = |op: Op| {
            writer.send(op);
            writer.flush_within(Duration::from_secs(30));
            (
                stats.written.load(Ordering::Relaxed),
                stats.deleted.load(Ordering::Relaxed),
                stats.scanned_only.load(Ordering::Relaxed),
            )
        };
        let list_rv = || store.list_metas("node", "/v1/pods", "d").unwrap()[0].rv;
        let live = || {
            let mut names: Vec<String> = store
                .scan(&super::super::store::prefix("node", "/v1/pods", None, None))
                .unwrap()
                .into_iter()
                .filter(|(_, r)| !r.deleted)
                .map(|(k, _)| k.name)
                .collect();
            names.sort();
            names
        };
        let ab = [("a", 5), ("b", 5)];
        assert_eq!(applied(list(100, &ab)), (2, 0, 0));
        // The same items, a newer list: only the list record moves.
        assert_eq!(applied(list(101, &ab)), (2, 0, 2));
        assert_eq!(list_rv(), 101);
        // A watch adds c; a relist with a and b alone (c was deleted, the watch missed it)
        // is read in full and prunes c, though its items are those of the last list.
        assert_eq!(applied(event("ADDED", "c", 150)), (3, 0, 2));
        assert_eq!(live(), ["a", "b", "c"]);
        let (written, deleted, _) = applied(list(200, &ab));
        assert_eq!((written, deleted), (3, 1), "c pruned");
        assert_eq!(live(), ["a", "b"]);
        assert_eq!(list_rv(), 200);
        // Nothing since: the next relist is recognised again.
        assert_eq!(applied(list(201, &ab)), (3, 1, 6));
        assert_eq!(list_rv(), 201);
        // A changed item is never taken for the same list.
        let (written, _, _) = applied(list(202, &[("a", 6), ("b", 5)]));
        assert_eq!(written, 4);
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A GET answer the writer found the store holding is recognised on the sender's side
    /// from then on (counted at once, never handed over), until anything writes its
    /// resource again: after a list that pruned the object, the same answer goes to the
    /// writer again, which judges it against what the store now holds.
    #[test]
    fn repeats_are_recognised_before_the_writer_until_their_resource_is_written() {
        let (dir, store, stats, writer) = writer_on_temp_store("known");
        let stale = || stats.stale.load(Ordering::Relaxed);
        let send_a = || {
            let body = pod("a", 5);
            let parts = vec![body.slice(..10), body.slice(10..)];
            writer.send_whole(pods_target(TargetKind::Object), parts, false);
        };
        let flush = || writer.flush_within(Duration::from_secs(30));
        send_a();
        flush();
        assert_eq!(stats.written.load(Ordering::Relaxed), 1);
        send_a();
        assert_eq!(stale(), 0, "the writer has not vouched for it yet");
        flush();
        assert_eq!(stale(), 1, "found held by the writer");
        send_a();
        assert_eq!(stale(), 2, "recognised before the writer, with no wait");
        // A list of the namespace without a prunes it.
        writer.send(list(100, &[("b", 5)]));
        flush();
        assert_eq!(stats.deleted.load(Ordering::Relaxed), 1);
        send_a();
        assert_eq!(stale(), 2, "the resource was written since: handed over");
        flush();
        // The writer judges it: the list that left a out is newer than this answer.
        assert_eq!(stale(), 3);
        let live: Vec<(String, u64)> = store
            .scan(&super::super::store::prefix("node", "/v1/pods", None, None))
            .unwrap()
            .into_iter()
            .filter(|(_, r)| !r.deleted)
            .map(|(k, r)| (k.name, r.item.rv))
            .collect();
        assert_eq!(live, [("b".to_string(), 5)]);
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn repeated_answers_are_recognised_without_rewriting() {
        let (dir, store, stats, writer) = writer_on_temp_store("repeat");
        let counts = |s: &Stats| {
            (
                s.written.load(Ordering::Relaxed),
                s.stale.load(Ordering::Relaxed),
            )
        };
        writer.send(get(pod("a", 5)));
        writer.flush_within(Duration::from_secs(30));
        assert_eq!(counts(&stats), (1, 0));
        writer.send(get(pod("a", 5)));
        writer.send(get(pod("a", 4)));
        writer.flush_within(Duration::from_secs(30));
        assert_eq!(counts(&stats), (1, 2), "same and older: nothing written");
        writer.send(get(pod("a", 6)));
        writer.send(get(pod("b", 6)));
        writer.flush_within(Duration::from_secs(30));
        assert_eq!(counts(&stats), (3, 2));
        let held = store
            .scan(&super::super::store::prefix("node", "/v1/pods", None, None))
            .unwrap();
        assert_eq!(
            held.iter().map(|(_, r)| r.item.rv).collect::<Vec<_>>(),
            [6, 6]
        );
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[cfg(test)]
mod cost {
    //! `HUB_LIST=path cargo test --release -p hub-user --lib relist_cost -- --ignored
    //! --nocapture`: where an unchanged relist's time goes, step by step.
    use std::time::Instant;

    use super::*;
    use crate::cache::{objects, scan};

    fn cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    fn timed<T>(what: &str, n: u32, mut f: impl FnMut() -> T) -> T {
        let (t, c) = (Instant::now(), cpu());
        let mut out = f();
        for _ in 1..n {
            out = f();
        }
        eprintln!(
            "{what:<40} {:>8.0} µs wall {:>8.0} µs cpu",
            t.elapsed().as_secs_f64() * 1e6 / n as f64,
            (cpu() - c).as_secs_f64() * 1e6 / n as f64
        );
        out
    }

    #[test]
    #[ignore]
    fn relist_cost() {
        let Some(path) = std::env::var_os("HUB_LIST") else {
            return;
        };
        let body = Bytes::from(std::fs::read(&path).unwrap());
        let enc = if body.starts_with(b"k8s\0") {
            Encoding::Protobuf
        } else {
            Encoding::Json
        };
        let parts: Vec<Bytes> = (0..body.len())
            .step_by(16 * 1024)
            .map(|i| body.slice(i..(i + 16 * 1024).min(body.len())))
            .collect();
        let (dir, store, _, writer) = super::tests::writer_on_temp_store("cost");
        let op = || Op::Whole {
            target: Target {
                credential: "node".into(),
                component: "kubelet".into(),
                gvr: "/v1/pods".into(),
                resource: "pods".into(),
                encoding: enc,
                kind: TargetKind::List {
                    namespace: "default".into(),
                    label_selector: String::new(),
                    field_selector: String::new(),
                    continue_from: None,
                },
            },
            body: parts.clone(),
            gzip: false,
        };
        timed("first list (all written)", 1, || {
            writer.send(op());
            writer.flush_within(Duration::from_secs(60));
        });
        timed("relist through the writer (recognised)", 20, || {
            writer.send(op());
            writer.flush_within(Duration::from_secs(60));
        });
        timed("fingerprint of the items", 20, || {
            fingerprint::of_list(enc, &parts).unwrap()
        });
        let list = timed("scan into items", 20, || match enc {
            Encoding::Json => scan::json_list(&parts).unwrap(),
            Encoding::Protobuf => scan::protobuf_list(&parts).unwrap(),
        });
        let named = timed("name every item the scan did not", 20, || {
            list.items
                .iter()
                .filter(|i| i.identity.is_none())
                .filter_map(|i| match enc {
                    Encoding::Json => objects::identify_json(&i.raw),
                    Encoding::Protobuf => objects::identify_protobuf(&i.raw),
                })
                .count()
        });
        eprintln!("{} items, {named} named after the scan", list.items.len());
        let mut snapshot = None;
        let target = match op() {
            Op::Whole { target, .. } => target,
            _ => unreachable!(),
        };
        let page = timed("scan, name and ask the store", 20, || {
            let mut held = Held::new(&store, &mut snapshot);
            objects::parse_list_pieces("pods", enc, &parts, |id| held.holds(&target, id)).unwrap()
        });
        assert_eq!(page.items.len(), 0);
        let write = || Write::ReplaceList {
            credential: "node".into(),
            component: "kubelet".into(),
            gvr: "/v1/pods".into(),
            namespace: "default".into(),
            selector: Selector::parse("", "").unwrap(),
            prune: true,
            rv: page.rv,
            items: vec![],
            held: page.held.clone(),
            list_kind: page.kind.clone(),
        };
        timed("store: replace with every item held", 20, || {
            store.apply(&[write()]).unwrap()
        });
        timed("parse every item (a changed list)", 5, || {
            objects::parse_list_pieces("pods", enc, &parts, |_| false)
                .unwrap()
                .items
                .len()
        });
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
