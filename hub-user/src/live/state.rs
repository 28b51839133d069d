//! The node's live state as the cache's store holds it: a write of the node folded into its
//! object's entry (and queued) in one transaction, the entries read back for serving, and
//! the news of a change for open watches.
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::broadcast;

use super::{
    Changed, Entry, Refusal, ReplayAs, Write,
    endpoints::{self, Pods},
    patch::PatchType,
    replay_as,
};
use crate::{
    cache::{
        objects::{self, Encoding, Item},
        store::{Budget, Enqueued, Store, StoreError},
    },
    convert,
    proxy::request::RequestInfo,
};

/// Why a write was not taken.
pub enum NotTaken {
    /// Not one the node keeps live (an event created without a name): queued as it is.
    NotKept,
    Refused(Refusal),
    /// Nothing to apply it to, or the store failed: a 503 naming why.
    Unavailable(String),
}

pub struct LiveState {
    store: Arc<Store>,
    changes: broadcast::Sender<Changed>,
    /// The pods other nodes of the pool wrote offline, as they shared them last.
    others: Mutex<Arc<Pods>>,
    /// This node's pods as its entries say, and the store's commit count they were read at
    /// (read again once it moved: every slice served reads them).
    own: Mutex<Option<(u64, Arc<Pods>)>>,
}

/// One write of the node, as it arrived.
pub struct NodeWrite<'a> {
    pub info: &'a RequestInfo,
    /// The request's path (no query).
    pub path: &'a str,
    pub content_type: &'a str,
    pub component: &'a str,
    pub body: &'a [u8],
}

/// The node's freshest cached copy of an object (any component), as JSON, with its
/// resourceVersion and encoding.
fn cloud_copy(
    store: &Store,
    info: &RequestInfo,
) -> Result<Option<(Value, u64, Encoding)>, StoreError> {
    Ok(store.freshest("node", info)?.and_then(|item: Item| {
        let json = item.in_encoding(Encoding::Json)?;
        let v = serde_json::from_slice(&json.body).ok()?;
        Some((v, item.rv, item.encoding))
    }))
}

fn parse_write<'a>(w: &NodeWrite, body: &'a Value) -> Result<Write<'a>, Refusal> {
    if w.info.verb == "patch" {
        let kind = PatchType::of_content_type(w.content_type).ok_or_else(|| {
            Refusal::BadRequest(format!("unsupported patch type {:?}", w.content_type))
        })?;
        return Ok(Write::Patch(kind, body));
    }
    Ok(Write::Whole(body.clone()))
}

/// A request body as JSON: JSON as it is, a protobuf object converted.
fn body_json(content_type: &str, body: &[u8]) -> Result<Value, Refusal> {
    let bad = |e: String| Refusal::BadRequest(format!("request body: {e}"));
    match Encoding::of_content_type(content_type) {
        Some(Encoding::Protobuf) => {
            let json =
                convert::to_json(body, convert::server_style()).map_err(|e| bad(e.to_string()))?;
            serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))
        }
        _ => serde_json::from_slice(body).map_err(|e| bad(e.to_string())),
    }
}

impl LiveState {
    pub fn new(store: Arc<Store>) -> LiveState {
        LiveState {
            store,
            changes: broadcast::channel(1024).0,
            others: Mutex::new(Arc::default()),
            own: Mutex::new(None),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The pods this node wrote offline.
    pub fn own_pods(&self) -> Result<Arc<Pods>, StoreError> {
        let commits = self.store.commits();
        if let Some((at, pods)) = &*self.own.lock().unwrap_or_else(|p| p.into_inner())
            && *at == commits
        {
            return Ok(pods.clone());
        }
        let pods = Arc::new(Pods::from_entries(&held(
            &self.store,
            endpoints::PODS,
            None,
            None,
        )?));
        *self.own.lock().unwrap_or_else(|p| p.into_inner()) = Some((commits, pods.clone()));
        Ok(pods)
    }

    /// The pods of `namespace` (None: all) as the node knows them now: its own writes, and
    /// what other nodes of its pool shared of theirs.
    pub fn pods(&self, namespace: Option<&str>) -> Result<Pods, StoreError> {
        let own = self.own_pods()?.within(namespace);
        let others = self
            .others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(own.and_others(&others, namespace))
    }

    /// Takes what the other nodes of the pool share now; open watches hear of every pod
    /// whose shared state changed (their slices may follow it).
    pub fn share_others(&self, now: Pods) {
        let before = std::mem::replace(
            &mut *self.others.lock().unwrap_or_else(|p| p.into_inner()),
            Arc::new(now.clone()),
        );
        for (namespace, name) in now.differing(&before) {
            let _ = self.changes.send(Changed {
                gvr: endpoints::PODS.to_string(),
                namespace: namespace.clone(),
                name: name.clone(),
            });
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    /// Takes one write of the node: folded into its object's entry (made from the node's
    /// freshest cached copy on the first write, carried onto a newer one if the cloud's
    /// moved on; an event from what its recorder wrote) and queued for replay with the
    /// outbox row `row` makes from the entry's key if the object had none, in one
    /// transaction; a new entry's row counts against `budget` when given (the oldest such
    /// rows make room). Returns the entry as it now is and what queueing did.
    pub fn take(
        &self,
        w: &NodeWrite,
        row: impl FnOnce(&[u8]) -> Vec<u8>,
        max: u64,
        budget: Option<Budget>,
    ) -> Result<(Entry, Enqueued), NotTaken> {
        let info = w.info;
        let replay = replay_as(info).ok_or_else(|| {
            NotTaken::Unavailable(format!("{} {} is not kept live", info.verb, info.resource))
        })?;
        let body = body_json(w.content_type, w.body).map_err(NotTaken::Refused)?;
        let write = parse_write(w, &body).map_err(NotTaken::Refused)?;
        let unavailable = |e: StoreError| NotTaken::Unavailable(e.to_string());
        let (name, copy) = if replay == ReplayAs::Create {
            (created_name(info, &body)?, None)
        } else {
            let copy = cloud_copy(&self.store, info).map_err(unavailable)?;
            // An event recorded before the hub saw it is patched as its recorder says.
            let copy = copy.or_else(|| {
                super::is_events(&info.gvr()).then(|| (super::bare_event(info), 0, Encoding::Json))
            });
            (info.name.clone(), copy)
        };
        let key = super::key(&info.gvr(), &info.namespace, &name);
        let mut taken = None;
        let folded = self
            .store
            .fold_live(&key, &row(&key), max, budget, |held| {
                let mut entry = match (held.as_deref().and_then(Entry::decode), copy) {
                    (Some(mut e), Some((cloud, rv, _))) if rv > e.base_rv => {
                        e.rebase(cloud, rv);
                        e
                    }
                    (Some(e), _) => e,
                    (None, _) if replay == ReplayAs::Create => Entry {
                        gvr: info.gvr(),
                        namespace: info.namespace.clone(),
                        name: name.clone(),
                        path: w.path.to_string(),
                        component: w.component.to_string(),
                        replay,
                        base: Value::Null,
                        base_rv: 0,
                        state: Value::Null,
                        writes: 0,
                        encoding: Encoding::of_content_type(w.content_type)
                            .unwrap_or(Encoding::Json),
                    },
                    (None, Some((cloud, rv, encoding))) => Entry {
                        gvr: info.gvr(),
                        namespace: info.namespace.clone(),
                        name: info.name.clone(),
                        path: w.path.to_string(),
                        component: w.component.to_string(),
                        replay,
                        state: cloud.clone(),
                        base: cloud,
                        base_rv: rv,
                        writes: 0,
                        encoding,
                    },
                    (None, None) => {
                        return Err(NotTaken::Unavailable(format!(
                            "{} {}/{} is not in the local cache, so this write cannot be applied offline",
                            info.resource, info.namespace, info.name
                        )));
                    }
                };
                entry.fold(&write).map_err(NotTaken::Refused)?;
                // Created in the request's namespace, as kube-apiserver sets it.
                if entry.replay == ReplayAs::Create
                    && let Some(meta) =
                        entry.state.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    meta.insert("namespace".into(), info.namespace.clone().into());
                }
                let bytes = entry.encode();
                taken = Some(entry);
                Ok(bytes)
            })
            .map_err(unavailable)?;
        let queued = folded?;
        let entry = taken.expect("a folded write leaves its entry");
        let _ = self.changes.send(Changed {
            gvr: entry.gvr.clone(),
            namespace: entry.namespace.clone(),
            name: entry.name.clone(),
        });
        Ok((entry, queued))
    }
}

/// The name an object created offline is kept under: its own, which must be a valid name
/// in the request's namespace. Without one (generateName) it is not kept live.
fn created_name(info: &RequestInfo, body: &Value) -> Result<String, NotTaken> {
    let meta = &body["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        return Err(NotTaken::NotKept);
    }
    let bad = |m: String| Err(NotTaken::Refused(Refusal::BadRequest(m)));
    if !objects::valid_name(name) {
        return bad(format!("invalid name {name:?}"));
    }
    if let Some(ns) = meta["namespace"].as_str()
        && ns != info.namespace
    {
        return bad(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        );
    }
    Ok(name.to_string())
}

/// The entries of `gvr` in `namespace` (None: every namespace), or the one of `name`.
pub fn held(
    store: &Store,
    gvr: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<Vec<Entry>, StoreError> {
    let raw = match (namespace, name) {
        (Some(ns), Some(n)) => store.live(&super::key(gvr, ns, n))?.into_iter().collect(),
        _ => store.live_under(&super::scope_prefix(gvr, namespace))?,
    };
    Ok(raw.iter().filter_map(|b| Entry::decode(b)).collect())
}
