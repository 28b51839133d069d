//! The local cache (design.md §6, issue 6): what the cloud returned to this node's
//! components, kept in a transactional store so the node keeps working while the cloud is
//! unreachable, across hub restarts and reboots.
//!
//! * Writes are teed from live cloud answers (`tee`) and applied by one writer thread
//!   (`writer`) into redb (`store`): GET upserts, a complete LIST replaces the component's
//!   set atomically, WATCH events apply in order, fresher resourceVersions win.
//! * Every object is kept per credential (a bearer token's hash, or the node identity) and
//!   component (User-Agent): offline, a credential is served only what the cloud already
//!   returned to that same credential.
//! * Offline answers (`serve`) evaluate any selector on the cached metadata.
pub mod fingerprint;
pub mod inspect;
pub mod objects;
pub mod offline;
pub mod paging;
mod repeats;
mod room;
mod scan;
pub mod select;
pub mod serve;
pub mod store;
mod tee;
pub mod tokens;
pub mod writer;

use std::{path::Path, sync::Arc};

use http_body_util::BodyExt;
use hyper::{Response, StatusCode, header};
use serde::{Deserialize, Serialize};

use self::{
    objects::Encoding,
    serve::{CacheRequest, Server},
    store::{Store, StoreError},
    writer::{Stats, Target, TargetKind, Writer},
};
use crate::{body::ProxyBody, gzip::ContentEncoding, proxy::request::RequestInfo};

/// The components whose answers are cached unless cache.components says otherwise
/// (YurtHub's defaults, plus the hub itself).
pub const DEFAULT_COMPONENTS: [&str; 5] = ["kubelet", "kube-proxy", "flanneld", "coredns", "hub"];

/// Who a request speaks as towards the cloud, as a cache scope: the node identity, a
/// bearer token (by its SHA-256, never the token itself), or nobody.
pub fn credential(authorization: Option<&[u8]>, as_node: bool) -> String {
    match authorization {
        _ if as_node => "node".into(),
        Some(auth) => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let digest = ring::digest::digest(&ring::digest::SHA256, auth);
            let mut key = String::with_capacity(6 + 32);
            key.push_str("token-");
            for b in &digest.as_ref()[..16] {
                key.push(HEX[usize::from(b >> 4)] as char);
                key.push(HEX[usize::from(b & 15)] as char);
            }
            key
        }
        None => "anonymous".into(),
    }
}

/// The component a User-Agent names (`kubelet/v1.32 (linux/amd64)` → `kubelet`), limited
/// to characters that are safe in keys and metrics.
pub fn component_name(user_agent: &str) -> String {
    let first: String = user_agent
        .split(['/', ' '])
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect::<String>()
        .to_ascii_lowercase();
    if first.is_empty() {
        "unknown".into()
    } else {
        first
    }
}

/// The component a request's cache entries belong to: its User-Agent name, and its cgroup
/// where interception knows it (`kubectl@cgroup-4242`), so two pods running the same client
/// keep separate sets and one's list never replaces the other's.
pub fn component_key(user_agent: &str, cgroup_id: u64) -> String {
    let name = component_name(user_agent);
    if cgroup_id == 0 {
        name
    } else {
        format!("{name}@cgroup-{cgroup_id}")
    }
}

/// What `hub status` shows about the cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CacheStatus {
    pub path: String,
    pub components: Vec<String>,
    /// Stored objects, tombstones included.
    pub entries: u64,
    /// Size of the store file.
    pub file_bytes: u64,
    pub written: u64,
    pub stale: u64,
    /// Of the stale: objects recognised by a metadata scan alone (not parsed).
    pub scanned_only: u64,
    pub deleted: u64,
    pub rejected: u64,
    pub too_large: u64,
    pub write_errors: u64,
    pub pending: i64,
    /// About how many bytes the pending writes hold.
    #[serde(default)]
    pub pending_bytes: u64,
    /// Times a watch stream waited for the writer to catch up (past its queue's bound).
    #[serde(default)]
    pub writer_waits: u64,
    pub offline_accepted: u64,
    /// Writes accepted offline and not yet replayed to the cloud.
    pub queued: u64,
    pub replayed: u64,
    pub replay_dropped: u64,
    /// Queued writes a newer one of the same object superseded (never sent).
    #[serde(default)]
    pub superseded: u64,
    /// Offline events dropped once older than the event TTL.
    #[serde(default)]
    pub expired: u64,
    pub last_error: Option<String>,
}

pub struct Cache {
    store: Arc<Store>,
    /// What the node wrote while offline, served in place of the cloud's copies.
    live: Arc<crate::live::state::LiveState>,
    writer: Writer,
    stats: Arc<Stats>,
    components: Vec<String>,
    server: Server,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({})", self.store.path.display())
    }
}

/// How long a cache read waits for the answers already teed to be stored (the writer
/// commits in milliseconds; this bounds a stuck disk).
const FLUSH_BEFORE_SERVING: std::time::Duration = std::time::Duration::from_secs(5);

/// Discovery documents and /version, cached for every client: they hold no secrets and
/// clients break without them after an offline restart (OpenYurt #880).
fn is_discovery(path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    matches!(
        segs.as_slice(),
        ["version"] | ["api"] | ["api", _] | ["apis"] | ["apis", _] | ["apis", _, _]
    )
}

/// A write whose answer is the object's latest state, kept like a GET answer when the node
/// identity made it: what the node wrote (its Node, Lease, CSINode, pods' status, ...) it
/// can read back offline, though it never read it from the cloud. Events are left out
/// (nothing on the node reads them back, and they would pile up), and so are token
/// requests (their answer is no object of the path; `tokens` keeps them) and reviews
/// (TokenReview, SubjectAccessReview, SelfSubjectReview…: answers kube-apiserver never
/// stores, nameless; kubelet sends them as the node to authorize calls to its own API).
pub fn keeps_written(info: &RequestInfo) -> bool {
    matches!(info.verb, "create" | "update" | "patch")
        && info.is_resource
        && matches!(info.subresource.as_str(), "" | "status")
        && !(info.resource == "events" && matches!(info.group.as_str(), "" | "events.k8s.io"))
        && !matches!(
            info.group.as_str(),
            "authentication.k8s.io" | "authorization.k8s.io"
        )
}

/// A watch that lists by streaming (`sendInitialEvents=true`, client-go's WatchListClient):
/// its events up to the initial-events-end bookmark are the whole set.
pub fn streamed_list(query: &str) -> bool {
    serve::param(query, "sendInitialEvents") == "true"
}

impl Cache {
    /// Opens the store under `dir`. A store that cannot be opened (corrupt, or from an
    /// incompatible version) is moved aside and a fresh one started, so the hub keeps
    /// serving; the returned note says what happened.
    pub fn open(
        dir: &Path,
        components: Vec<String>,
    ) -> Result<(Cache, Option<String>), StoreError> {
        let (store, note) = match Store::open(dir) {
            Ok(s) => (s, None),
            Err(StoreError::Open { path, reason }) => {
                let aside = path.with_extension(format!("corrupt-{}", store::now()));
                std::fs::rename(&path, &aside).map_err(|source| StoreError::Dir {
                    path: path.clone(),
                    source,
                })?;
                let note = format!(
                    "cache store {} could not be opened ({reason}); moved to {} and started empty",
                    path.display(),
                    aside.display()
                );
                tracing::error!("{note}");
                (Store::open(dir)?, Some(note))
            }
            Err(e) => return Err(e),
        };
        // Conversions write the JSON of the cloud's version, as last seen.
        if let Some((_, version)) = store
            .raw("/version")
            .ok()
            .and_then(|v| v.into_iter().next())
        {
            crate::convert::note_server_version(&version);
        }
        let store = Arc::new(store);
        let stats = Arc::new(Stats::default());
        if let Some(n) = &note {
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(n.clone());
        }
        let writer = writer::start(store.clone(), stats.clone());
        let live = Arc::new(crate::live::state::LiveState::new(store.clone()));
        Ok((
            Cache {
                server: Server {
                    store: store.clone(),
                    live: live.clone(),
                },
                store,
                live,
                writer,
                stats,
                components,
            },
            note,
        ))
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// What the node wrote while offline, as it is served.
    pub fn live(&self) -> &Arc<crate::live::state::LiveState> {
        &self.live
    }

    /// Waits until every teed answer so far is stored.
    pub fn flush(&self) {
        self.writer.flush_within(std::time::Duration::from_secs(30));
    }

    /// Changes whenever the store's objects change (a write or a deletion was applied,
    /// offline writes included): lets a reader skip re-reading an unchanged store.
    pub fn generation(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.stats;
        s.written.load(Relaxed) + s.deleted.load(Relaxed) + s.offline_accepted.load(Relaxed)
    }

    /// Whether node writes accepted offline still wait to be replayed: a new one must
    /// queue behind them, or it would reach the cloud before them and be overwritten by
    /// an older state.
    pub fn replay_pending(&self) -> bool {
        self.store.queued_now() > 0
    }

    /// Stores what is pending and closes the store cleanly (SIGTERM).
    pub fn close(&self) {
        self.writer.flush_within(std::time::Duration::from_secs(30));
        self.store.close();
    }

    /// Whether answers for `component` (a `component_key`) are cached: cache.components
    /// names clients by their User-Agent name.
    pub fn caches_component(&self, component: &str) -> bool {
        let name = component.split('@').next().unwrap_or_default();
        self.components.iter().any(|c| c == name)
    }

    /// Wraps a 200 answer from the cloud so a copy reaches the store — and a 200 or 201
    /// to a write of the node's own (see [`keeps_written`]); other answers pass unchanged.
    pub fn tee(
        &self,
        resp: Response<ProxyBody>,
        info: &RequestInfo,
        path: &str,
        query: &str,
        credential: impl FnOnce() -> String,
        component: &str,
    ) -> Response<ProxyBody> {
        let written = keeps_written(info);
        let streamed = info.verb == "watch" && streamed_list(query);
        let kept =
            resp.status() == StatusCode::OK || (written && resp.status() == StatusCode::CREATED);
        if !kept {
            return resp;
        }
        // What a write answers is kept for the node identity only.
        let credential = std::cell::LazyCell::new(credential);
        if written && *credential != "node" {
            return resp;
        }
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let Some(encoding) = Encoding::of_content_type(&content_type) else {
            return resp;
        };
        // An encoding the hub cannot read is passed on, not cached.
        let gzip = match ContentEncoding::of(resp.headers().get(header::CONTENT_ENCODING)) {
            Some(e) => e == ContentEncoding::Gzip,
            None => return resp,
        };
        let kind = if !info.is_resource {
            if !is_discovery(path) {
                return resp;
            }
            TargetKind::Raw {
                path: path.to_string(),
                content_type: content_type.clone(),
            }
        } else {
            // A Table is a rendering, not the objects: nothing to cache from it.
            let table = content_type.contains("as=Table");
            let whole_object = info.subresource.is_empty() || written;
            if !self.caches_component(component) || !whole_object || table {
                return resp;
            }
            match info.verb {
                "get" => TargetKind::Object,
                _ if written => TargetKind::Object,
                "list" => TargetKind::List {
                    namespace: info.namespace.clone(),
                    label_selector: serve::param(query, "labelSelector"),
                    field_selector: serve::param(query, "fieldSelector"),
                    continue_from: Some(serve::param(query, "continue")).filter(|c| !c.is_empty()),
                },
                "watch" => {
                    let selector = (
                        serve::param(query, "labelSelector"),
                        serve::param(query, "fieldSelector"),
                    );
                    // A plain watch from a resourceVersion continues the list it came from.
                    let from = serve::param(query, "resourceVersion")
                        .parse::<u64>()
                        .ok()
                        .filter(|rv| *rv > 0 && !streamed);
                    TargetKind::Watch {
                        // Unparsable selectors are the cloud's to refuse; assume the worst.
                        selection_may_change: select::Selector::parse(&selector.0, &selector.1)
                            .map_or(true, |s| !s.membership_is_permanent()),
                        namespace: info.namespace.clone(),
                        selector,
                        keeps_list_from: from,
                    }
                }
                _ => return resp,
            }
        };
        let target = Target {
            credential: std::cell::LazyCell::force(&credential).clone(),
            component: component.to_string(),
            gvr: info.gvr(),
            resource: info.resource.clone(),
            encoding,
            kind,
        };
        let writer = self.writer.clone();
        resp.map(move |body| {
            match target.kind {
                TargetKind::Watch { .. } => tee::Tee::events(body, target, gzip, streamed, writer),
                _ => tee::Tee::whole(body, target, gzip, writer),
            }
            .boxed()
        })
    }

    /// Answers a read from the cache, or says why it cannot. Answers and events already
    /// passed to clients are stored first: a client that got a deletion from the cloud
    /// never gets the object back from the cache a moment later.
    pub async fn serve(
        &self,
        req: CacheRequest<'_>,
        cloud_back: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Response<ProxyBody>, String> {
        if self
            .stats
            .pending
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            let writer = self.writer.clone();
            let _ = tokio::task::spawn_blocking(move || writer.flush_within(FLUSH_BEFORE_SERVING))
                .await;
        }
        self.server.serve(req, cloud_back).await
    }

    pub fn status(&self) -> CacheStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let (entries, file_bytes) = self.store.counts().unwrap_or_default();
        let s = &self.stats;
        CacheStatus {
            path: self.store.path.display().to_string(),
            components: self.components.clone(),
            entries,
            file_bytes,
            written: s.written.load(Relaxed),
            stale: s.stale.load(Relaxed),
            scanned_only: s.scanned_only.load(Relaxed),
            deleted: s.deleted.load(Relaxed),
            rejected: s.rejected.load(Relaxed),
            too_large: s.too_large.load(Relaxed),
            write_errors: s.write_errors.load(Relaxed),
            pending: s.pending.load(Relaxed),
            pending_bytes: self.writer.queued_bytes() as u64,
            writer_waits: self.writer.waits(),
            offline_accepted: s.offline_accepted.load(Relaxed),
            queued: self.store.queue_len().unwrap_or_default(),
            replayed: s.replayed.load(Relaxed),
            replay_dropped: s.replay_dropped.load(Relaxed),
            superseded: s.superseded.load(Relaxed),
            expired: s.expired.load(Relaxed),
            last_error: s
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_hold_the_token() {
        let c = credential(Some(b"Bearer secret-token"), false);
        // The first 16 bytes of SHA-256("Bearer secret-token"): keys on disk stay valid.
        assert_eq!(c, "token-86e774bff90b0fe5f8ec00ffd9e579c6");
        assert!(c.starts_with("token-") && !c.contains("secret"));
        assert_ne!(c, credential(Some(b"Bearer other"), false));
        assert_eq!(credential(Some(b"Bearer x"), true), "node");
        assert_eq!(credential(None, false), "anonymous");
    }

    #[test]
    fn component_names_are_safe() {
        assert_eq!(component_name("kubelet/v1.32.0 (linux/amd64)"), "kubelet");
        assert_eq!(component_name("Kube-Proxy/1.0"), "kube-proxy");
        assert_eq!(component_name("../../etc\0/x"), "..");
        assert_eq!(component_name(""), "unknown");
    }

    #[test]
    fn component_keys_carry_the_cgroup_when_known() {
        assert_eq!(component_key("kubectl/v1.32", 0), "kubectl");
        assert_eq!(component_key("kubectl/v1.32", 4242), "kubectl@cgroup-4242");
    }

    #[test]
    fn discovery_paths() {
        for p in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps/v1",
            "/apis/apps",
        ] {
            assert!(is_discovery(p), "{p}");
        }
        for p in ["/healthz", "/openapi/v2", "/metrics", "/logs"] {
            assert!(!is_discovery(p), "{p}");
        }
    }
}
