//! Watches answered from the pool coordinator (design.md §7): the scope is read at one
//! etcd revision, then an etcd watch from the next revision carries every later change,
//! so nothing falls between the two. Events carry the cloud's resourceVersions (the
//! objects are stored as the cloud sent them), so a client that later re-lists or watches
//! from the cloud continues consistently. A selector is applied to the old and the new
//! state of each change: an object leaving the selection is a DELETED event, one entering
//! it an ADDED event, as kube-apiserver does.
//!
//! EndpointSlices and Endpoints follow the pods as the node knows them now
//! (`live::endpoints`, with what the pool's other hubs share): such a watch holds the
//! cloud's objects of its scope, serves them adjusted, and sends MODIFIED when a pod's
//! change changes what it serves, with resourceVersions and bookmarks kept below the
//! cloud's as `crate::live` says.
use std::{collections::HashMap, sync::Arc, time::Instant};

use bytes::Bytes;
use etcd_client::EventType as EtcdEvent;
use hyper::Response;
use tokio::sync::{broadcast, mpsc};

use super::{
    live_pods,
    storage::{Resource, Storage},
};
use crate::{
    body::ProxyBody,
    cache::{
        objects::{self, Encoding, INITIAL_EVENTS_END, Item},
        select::Selector,
        serve::{
            BOOKMARK_EVERY, CLOUD_CHECK, Shown, accepted, api_version, bad_request, event,
            held_whole, meta_only, param, selector, watch_response, watch_timeout,
        },
        store::ObjectKey,
    },
    kproto,
    live::{Changed, endpoints::Kind, state::LiveState},
    proxy::request::RequestInfo,
};
use etcd_client::WatchStream;

/// Decodes a stored value (JSON, or protobuf in its `k8s\0` envelope).
pub fn parse_stored(resource: &str, value: &[u8]) -> Option<Item> {
    let enc = if value.starts_with(kproto::MAGIC) {
        Encoding::Protobuf
    } else {
        Encoding::Json
    };
    objects::parse_object(resource, enc, value).ok()
}

/// (namespace, name) of an object key below `scope` (the key prefix of the request).
fn name_of(scope: &str, namespace: &str, key: &str) -> ObjectKey {
    let rest = key.strip_prefix(scope).unwrap_or(key);
    let (ns, name) = match (namespace.is_empty(), rest.split_once('/')) {
        (true, Some((ns, name))) => (ns, name),
        _ => (namespace, rest),
    };
    ObjectKey {
        credential: String::new(),
        gvr: String::new(),
        namespace: ns.into(),
        name: name.into(),
        component: String::new(),
    }
}

/// The object as it was deleted: its last state with the deletion's resourceVersion.
fn with_rv(mut item: Item, rv: u64) -> Item {
    let body = objects::with_resource_version(item.encoding, &item.body, &rv.to_string());
    if let Some(b) = body {
        item.body = b;
        item.rv = rv;
    }
    item
}

/// Serves a watch of `info`'s scope from the coordinator. It ends when the client goes,
/// its timeoutSeconds are up, the etcd watch ends, or `keep_open` turns false (the hub
/// routes this resource elsewhere now: the client re-lists there). With `follows`, the
/// objects (EndpointSlices or Endpoints) follow the node's live pod state.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    storage: Arc<Storage>,
    resource: Resource,
    info: &RequestInfo,
    query: &str,
    accept: &str,
    source: &'static str,
    keep_open: Arc<dyn Fn() -> bool + Send + Sync>,
    follows: Option<(Kind, Arc<LiveState>)>,
) -> Result<Response<ProxyBody>, String> {
    let prefs = accepted(accept);
    if prefs.is_empty() {
        return Err(format!("the client accepts only {accept:?}"));
    }
    let sel = match selector(info, query)? {
        Ok(s) => s,
        Err(msg) => return Ok(bad_request(&msg)),
    };
    let ns = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
    let scope = storage.scope(&resource, ns).map_err(|e| e.to_string())?;
    let snap = storage
        .snapshot(&resource, ns)
        .await
        .map_err(|e| e.to_string())?;
    // Start the etcd watch before answering, so a failure is still a clean fall-through.
    let stream = storage
        .watch(&resource, ns, snap.revision)
        .await
        .map_err(|e| e.to_string())?;
    // Subscribed before the objects are adjusted, so no pod change falls between.
    let changes = follows.as_ref().map(|(_, live)| live.subscribe());
    let mut items: Vec<Item> = snap
        .objects
        .iter()
        .filter_map(|(_, v)| parse_stored(&info.resource, v))
        .collect();
    let mut following = None;
    if let Some((kind, live)) = follows {
        let held: HashMap<(String, String), Item> = items
            .iter()
            .filter(|i| sel.matches_item(i))
            .map(|i| ((i.namespace.clone(), i.name.clone()), i.clone()))
            .collect();
        let floor = live_pods::follow(&live, &storage, kind, ns, &mut items).await;
        let mut shown = Shown::default();
        for i in items.iter().filter(|i| sel.matches_item(i)) {
            shown.change(i, true);
        }
        following = Some(Following {
            kind,
            live,
            held,
            shown,
            floor,
        });
    }
    // One encoding must carry every selected object, or the watch would miss some.
    let selected: Vec<&Item> = items.iter().filter(|i| sel.matches_item(i)).collect();
    let enc = held_whole(&prefs, |e| selected.iter().filter(|i| !i.can_be(e)).count())?;
    let feed = Feed {
        enc,
        api_version: api_version(info),
        kind: items.first().map_or_else(
            || objects::kind_for(&info.resource).to_string(),
            |i| i.kind.clone(),
        ),
        sel,
        newest: snap
            .versions
            .iter()
            .map(|(_, rv, _)| *rv)
            .max()
            .unwrap_or(0),
        bookmarks: param(query, "allowWatchBookmarks") == "true",
        timeout: watch_timeout(query),
        resource: info.resource.clone(),
        storage,
        keep_open,
        following,
    };
    let first = feed.initial_events(&items, &snap.versions, query, |key| {
        name_of(&scope, &info.namespace, key)
    });
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(feed.run(first, stream, changes, tx));
    Ok(watch_response(source, enc, rx))
}

/// One client's watch: what it asked for and how far it has been told.
struct Feed {
    enc: Encoding,
    api_version: String,
    kind: String,
    sel: Selector,
    /// The newest resourceVersion sent, for bookmarks.
    newest: u64,
    bookmarks: bool,
    timeout: Option<std::time::Duration>,
    resource: String,
    storage: Arc<Storage>,
    keep_open: Arc<dyn Fn() -> bool + Send + Sync>,
    following: Option<Following>,
}

/// A watch of EndpointSlices or Endpoints that follow the node's live pod state.
struct Following {
    kind: Kind,
    live: Arc<LiveState>,
    /// The cloud's objects the watch's selection holds, as the coordinator has them.
    held: HashMap<(String, String), Item>,
    /// What was sent of each, so a pod's change is sent only when it changes that.
    shown: Shown,
    /// The lowest resourceVersion served adjusted: bookmarks go no further.
    floor: Option<u64>,
}

impl Feed {
    /// The resourceVersion a bookmark carries: the newest sent, never past what was served
    /// from the node's live state.
    fn bookmark_rv(&self) -> u64 {
        match self.following.as_ref().and_then(|f| f.floor) {
            Some(floor) => floor.min(self.newest),
            None => self.newest,
        }
    }

    /// The events before the etcd watch's: the scope as of the snapshot (all of it from
    /// resourceVersion 0 or with sendInitialEvents, else what changed after `from`).
    fn initial_events(
        &self,
        items: &[Item],
        versions: &[(String, u64, bool)],
        query: &str,
        name: impl Fn(&str) -> ObjectKey,
    ) -> Vec<Bytes> {
        let enc = self.enc;
        let from: u64 = param(query, "resourceVersion").parse().unwrap_or(0);
        let send_initial = param(query, "sendInitialEvents") == "true";
        let initial = from == 0 || send_initial;
        let mut first = Vec::new();
        for item in items {
            // An object served from the node's live state is sent again on every resumed
            // watch: its resourceVersion says nothing of what the client missed.
            let adjusted = self.following.as_ref().is_some_and(|f| {
                f.held
                    .get(&(item.namespace.clone(), item.name.clone()))
                    .is_some_and(|cloud| cloud.rv != item.rv)
            });
            if (initial || item.rv > from || adjusted) && self.sel.matches_item(item) {
                let Some(item) = item.in_encoding(enc) else {
                    continue;
                };
                first.push(event(
                    enc,
                    if initial { "ADDED" } else { "MODIFIED" },
                    &item,
                ));
            }
        }
        if !initial {
            for (key, rv, _) in versions.iter().filter(|(_, rv, d)| *d && *rv > from) {
                let gone = self.meta(Some(&name(key)), *rv, &[]);
                first.push(event(enc, "DELETED", &gone));
            }
        }
        // As kube-apiserver: the end is marked only for a client that takes bookmarks.
        if send_initial && self.bookmarks {
            let end = self.meta(None, self.bookmark_rv(), &[(INITIAL_EVENTS_END, "true")]);
            first.push(event(enc, "BOOKMARK", &end));
        }
        first
    }

    fn meta(&self, name: Option<&ObjectKey>, rv: u64, annotations: &[(&str, &str)]) -> Item {
        meta_only(
            self.enc,
            &self.api_version,
            &self.kind,
            name,
            rv,
            annotations,
        )
    }

    /// Sends `first`, then every change the etcd watch reports (and, for a watch that
    /// follows the node's pods, every change of what it serves), until the watch ends.
    async fn run(
        mut self,
        first: Vec<Bytes>,
        mut stream: WatchStream,
        mut changes: Option<broadcast::Receiver<Changed>>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let started = Instant::now();
        let mut last_bookmark = Instant::now();
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(CLOUD_CHECK);
        loop {
            let pod_changed = async {
                match changes.as_mut() {
                    Some(c) => c.recv().await,
                    None => std::future::pending().await,
                }
            };
            let msg = tokio::select! {
                m = stream.message() => m,
                changed = pod_changed => {
                    match changed {
                        Ok(c) if c.gvr == crate::live::endpoints::PODS => {
                            if !self.follow_pods_of(&c.namespace, &tx).await {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Changes were missed: end, the client's next watch is sent them.
                        Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Err(broadcast::error::RecvError::Closed) => changes = None,
                    }
                    continue;
                }
                _ = tick.tick() => {
                    if !(self.keep_open)() || self.timeout.is_some_and(|t| started.elapsed() >= t) {
                        return;
                    }
                    if self.bookmarks && last_bookmark.elapsed() >= BOOKMARK_EVERY {
                        last_bookmark = Instant::now();
                        let mark = self.meta(None, self.bookmark_rv(), &[]);
                        let b = event(self.enc, "BOOKMARK", &mark);
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                _ = tx.closed() => return,
            };
            // The etcd watch ended or failed: end the client's watch, it re-watches.
            let Ok(Some(resp)) = msg else { return };
            if resp.canceled() {
                return;
            }
            for ev in resp.events() {
                let Some((ty, item)) = self.change(ev).await else {
                    continue;
                };
                let item = self.as_served(ty, item).await;
                // An object that cannot be sent in this stream's encoding: end the watch
                // rather than let the client miss the change (its next list says why).
                let Some(item) = item.in_encoding(self.enc) else {
                    return;
                };
                self.newest = self.newest.max(item.rv);
                if tx.send(event(self.enc, ty, &item)).await.is_err() {
                    return;
                }
            }
        }
    }

    /// `item` (the cloud's object an event of type `ty` carries) as this watch serves it:
    /// for a watch that follows the node's pods, adjusted and noted as shown.
    async fn as_served(&mut self, ty: &str, item: Item) -> Item {
        let Some(f) = self.following.as_mut() else {
            return item;
        };
        let id = (item.namespace.clone(), item.name.clone());
        if ty == "DELETED" {
            f.held.remove(&id);
            f.shown.change(&item, false);
            return item;
        }
        f.held.insert(id, item.clone());
        let ns = item.namespace.clone();
        let mut one = [item];
        if let Some(rv) =
            live_pods::follow(&f.live, &self.storage, f.kind, Some(&ns), &mut one).await
        {
            f.floor = Some(f.floor.map_or(rv, |x| x.min(rv)));
        }
        let [item] = one;
        f.shown.change(&item, true);
        item
    }

    /// A pod of `namespace` changed: sends MODIFIED for each object of the namespace whose
    /// served form it changed. False when the client is gone or cannot be sent it.
    async fn follow_pods_of(&mut self, namespace: &str, tx: &mpsc::Sender<Bytes>) -> bool {
        let Some(f) = self.following.as_mut() else {
            return true;
        };
        let mut items: Vec<Item> = f
            .held
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, i)| i.clone())
            .collect();
        if let Some(rv) =
            live_pods::follow(&f.live, &self.storage, f.kind, Some(namespace), &mut items).await
        {
            f.floor = Some(f.floor.map_or(rv, |x| x.min(rv)));
        }
        let news: Vec<Item> = items
            .into_iter()
            .filter(|i| f.shown.change(i, true).is_some())
            .collect();
        for item in news {
            let Some(item) = item.in_encoding(self.enc) else {
                return false;
            };
            if tx.send(event(self.enc, "MODIFIED", &item)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// What one etcd change means to this watch's selection: an event type and the object
    /// to send, or nothing.
    async fn change(&self, ev: &etcd_client::Event) -> Option<(&'static str, Item)> {
        let now = ev
            .kv()
            .and_then(|kv| parse_stored(&self.resource, kv.value()));
        let before = ev
            .prev_kv()
            .and_then(|kv| parse_stored(&self.resource, kv.value()));
        let matches = |i: &Option<Item>| i.as_ref().is_some_and(|i| self.sel.matches_item(i));
        match ev.event_type() {
            EtcdEvent::Put => match (matches(&before), matches(&now)) {
                (false, true) => Some(("ADDED", now?)),
                (true, true) => Some(("MODIFIED", now?)),
                (true, false) => Some(("DELETED", now?)),
                (false, false) => None,
            },
            EtcdEvent::Delete => {
                if !matches(&before) {
                    return None;
                }
                let key = ev
                    .kv()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
                let rv = match &key {
                    Some(k) => self.storage.version_of(k).await.unwrap_or(0),
                    None => 0,
                };
                let before = before?;
                Some((
                    "DELETED",
                    if rv > before.rv {
                        with_rv(before, rv)
                    } else {
                        before
                    },
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_keys() {
        let k = name_of("/registry/pods/", "", "/registry/pods/ns1/p-1");
        assert_eq!((k.namespace.as_str(), k.name.as_str()), ("ns1", "p-1"));
        let k = name_of("/registry/pods/ns1/", "ns1", "/registry/pods/ns1/p-1");
        assert_eq!((k.namespace.as_str(), k.name.as_str()), ("ns1", "p-1"));
        let k = name_of("/registry/minions/", "", "/registry/minions/edge-1");
        assert_eq!((k.namespace.as_str(), k.name.as_str()), ("", "edge-1"));
    }
}
