//! The stand-in's state: a multi-version store with one cluster-wide resourceVersion
//! counter (like etcd's revision), an event history for watches, and compaction.
//!
//! Every write bumps the counter and appends one event. Old versions are kept as long as
//! the event history still reaches them, so a paginated list continues at the
//! resourceVersion of its first page (a consistent snapshot, as with etcd), and a watch or
//! continue token older than the history gets 410 Gone.
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
};

use serde_json::Value;
use tokio::sync::broadcast;

use super::resources::ResourceId;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub resource: ResourceId,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: Key,
    /// The object after the change (for deletions: its last state, with the deletion's rv).
    pub object: Arc<Value>,
    /// The object before the change, so filtered watches can see it leave their selection.
    pub previous: Option<Arc<Value>>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    NotFound,
    AlreadyExists,
    Conflict,
    /// The requested resourceVersion is older than the retained history.
    Gone {
        requested: u64,
        oldest: u64,
    },
}

struct Version {
    rv: u64,
    object: Option<Arc<Value>>,
}

struct Inner {
    rv: u64,
    /// Events with rv <= compacted are no longer available.
    compacted: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    events: VecDeque<Arc<Event>>,
    history_limit: usize,
}

pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
}

/// One page of a list.
pub struct Page {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    /// Set when more items follow: the relative key of this page's last item.
    pub last: Option<String>,
    pub remaining: usize,
}

/// An object's etcd key relative to its list's: `/<name>` in one namespace or for a
/// cluster-scoped resource, `/<namespace>/<name>` across namespaces. Compared as bytes,
/// these order a list as etcd's keys do (`a-b/x` before `a/x`).
pub fn relative_key(list_namespace: Option<&str>, key: &Key) -> String {
    match list_namespace {
        None if !key.namespace.is_empty() => format!("/{}/{}", key.namespace, key.name),
        _ => format!("/{}", key.name),
    }
}

fn set_rv(object: &mut Value, rv: u64) {
    object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
}

impl Store {
    /// `history_limit`: how many events are kept before the oldest are compacted away.
    pub fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(65536);
        Store {
            inner: Mutex::new(Inner {
                rv: 1000,
                compacted: 1000,
                keys: BTreeMap::new(),
                events: VecDeque::new(),
                history_limit: history_limit.max(1),
            }),
            tx,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    pub fn current_rv(&self) -> u64 {
        self.inner.lock().unwrap().rv
    }

    /// Drops every event and old version up to the current resourceVersion.
    pub fn compact(&self) {
        let mut inner = self.inner.lock().unwrap();
        while let Some(e) = inner.events.pop_front() {
            inner.compacted = e.rv;
            inner.prune(&e.key, e.rv);
        }
        inner.compacted = inner.rv;
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Value>> {
        let inner = self.inner.lock().unwrap();
        inner.latest(key)
    }

    pub fn create(&self, key: Key, mut object: Value) -> Result<Arc<Value>, StoreError> {
        let mut inner = self.inner.lock().unwrap();
        if inner.latest(&key).is_some() {
            return Err(StoreError::AlreadyExists);
        }
        let rv = inner.rv + 1;
        set_rv(&mut object, rv);
        let object = Arc::new(object);
        Ok(inner.commit(
            &self.tx,
            key,
            Some(object.clone()),
            EventType::Added,
            None,
            rv,
            object,
        ))
    }

    /// Replaces an object. `expected_rv` (from the client's metadata) must match if given.
    /// `merge` computes the stored object from the current one (status-subresource rules).
    pub fn update(
        &self,
        key: Key,
        expected_rv: Option<u64>,
        merge: impl FnOnce(&Value) -> Value,
    ) -> Result<Arc<Value>, StoreError> {
        let mut inner = self.inner.lock().unwrap();
        let current = inner.checked(&key, expected_rv)?;
        let mut object = merge(&current);
        let rv = inner.rv + 1;
        set_rv(&mut object, rv);
        let object = Arc::new(object);
        Ok(inner.commit(
            &self.tx,
            key,
            Some(object.clone()),
            EventType::Modified,
            Some(current),
            rv,
            object,
        ))
    }

    pub fn delete(&self, key: Key, expected_rv: Option<u64>) -> Result<Arc<Value>, StoreError> {
        let mut inner = self.inner.lock().unwrap();
        let current = inner.checked(&key, expected_rv)?;
        let rv = inner.rv + 1;
        let mut last = (*current).clone();
        set_rv(&mut last, rv);
        let last = Arc::new(last);
        Ok(inner.commit(
            &self.tx,
            key,
            None,
            EventType::Deleted,
            Some(current),
            rv,
            last,
        ))
    }

    /// Items of `resource` (in `namespace`, or all), as of `at_rv` (None = now), from the
    /// relative key `start` on (see [`relative_key`]), at most `limit` (0 = all), in the
    /// order of their etcd keys as kube-apiserver lists them.
    pub fn list(
        &self,
        resource: ResourceId,
        namespace: Option<&str>,
        at_rv: Option<u64>,
        start: Option<&str>,
        limit: usize,
        mut keep: impl FnMut(&Value) -> bool,
    ) -> Result<Page, StoreError> {
        let inner = self.inner.lock().unwrap();
        let rv = at_rv.unwrap_or(inner.rv);
        if rv < inner.compacted && at_rv.is_some() {
            return Err(StoreError::Gone {
                requested: rv,
                oldest: inner.compacted,
            });
        }
        let lo = Key {
            resource,
            namespace: namespace.unwrap_or("").to_string(),
            name: String::new(),
        };
        let mut in_scope: Vec<(String, &Vec<Version>)> = inner
            .keys
            .range(lo..)
            .take_while(|(key, _)| {
                key.resource == resource && namespace.is_none_or(|ns| key.namespace == ns)
            })
            .map(|(key, versions)| (relative_key(namespace, key), versions))
            .filter(|(rel, _)| start.is_none_or(|s| rel.as_str() >= s))
            .collect();
        in_scope.sort_by(|a, b| a.0.cmp(&b.0));
        let mut items = Vec::new();
        let mut last = None;
        let mut remaining = 0;
        for (rel, versions) in in_scope {
            let Some(obj) = versions
                .iter()
                .rev()
                .find(|v| v.rv <= rv)
                .and_then(|v| v.object.clone())
            else {
                continue;
            };
            if !keep(&obj) {
                continue;
            }
            if limit > 0 && items.len() == limit {
                remaining += 1;
                continue;
            }
            last = Some(rel);
            items.push(obj);
        }
        if remaining == 0 {
            last = None;
        }
        Ok(Page {
            items,
            rv,
            last,
            remaining,
        })
    }

    /// Events after `rv` still in the history, or Gone if `rv` is older than it reaches.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, StoreError> {
        let inner = self.inner.lock().unwrap();
        if rv < inner.compacted {
            return Err(StoreError::Gone {
                requested: rv,
                oldest: inner.compacted,
            });
        }
        Ok(inner.events.iter().filter(|e| e.rv > rv).cloned().collect())
    }
}

pub fn rv_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl Inner {
    fn latest(&self, key: &Key) -> Option<Arc<Value>> {
        self.keys.get(key)?.last()?.object.clone()
    }

    /// The current object, if it exists and matches the caller's precondition.
    fn checked(&self, key: &Key, expected_rv: Option<u64>) -> Result<Arc<Value>, StoreError> {
        let current = self.latest(key).ok_or(StoreError::NotFound)?;
        if expected_rv.is_some_and(|e| e != rv_of(&current)) {
            return Err(StoreError::Conflict);
        }
        Ok(current)
    }

    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        tx: &broadcast::Sender<Arc<Event>>,
        key: Key,
        stored: Option<Arc<Value>>,
        kind: EventType,
        previous: Option<Arc<Value>>,
        rv: u64,
        object: Arc<Value>,
    ) -> Arc<Value> {
        self.rv = rv;
        self.keys
            .entry(key.clone())
            .or_default()
            .push(Version { rv, object: stored });
        let event = Arc::new(Event {
            rv,
            kind,
            key,
            object: object.clone(),
            previous,
        });
        self.events.push_back(event.clone());
        self.compact_to_limit();
        let _ = tx.send(event);
        object
    }

    fn compact_to_limit(&mut self) {
        while self.events.len() > self.history_limit {
            let e = self.events.pop_front().expect("non-empty");
            self.compacted = e.rv;
            self.prune(&e.key, e.rv);
        }
    }

    /// Drops versions of `key` that no reader at rv >= `upto` can see.
    fn prune(&mut self, key: &Key, upto: u64) {
        let Some(versions) = self.keys.get_mut(key) else {
            return;
        };
        if let Some(newest_old) = versions.iter().rposition(|v| v.rv <= upto) {
            versions.drain(..newest_old);
            if versions.len() == 1 && versions[0].object.is_none() {
                versions.clear();
            }
        }
        if versions.is_empty() {
            self.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> Key {
        Key {
            resource: ResourceId(2),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}})
    }

    #[test]
    fn conflicts_and_versions() {
        let s = Store::new(100);
        let a = s.create(key("a"), obj("a")).unwrap();
        let rv = rv_of(&a);
        assert_eq!(s.create(key("a"), obj("a")), Err(StoreError::AlreadyExists));
        assert_eq!(
            s.update(key("a"), Some(rv - 1), |c| c.clone()).unwrap_err(),
            StoreError::Conflict
        );
        let b = s.update(key("a"), Some(rv), |c| c.clone()).unwrap();
        assert_eq!(rv_of(&b), rv + 1);
        // A list at the old rv still sees the old version.
        let page = s
            .list(ResourceId(2), None, Some(rv), None, 0, |_| true)
            .unwrap();
        assert_eq!(rv_of(&page.items[0]), rv);
    }

    #[test]
    fn history_limit_makes_old_rvs_gone() {
        let s = Store::new(3);
        let first = rv_of(&s.create(key("a"), obj("a")).unwrap());
        for n in ["b", "c", "d", "e"] {
            s.create(key(n), obj(n)).unwrap();
        }
        assert!(matches!(
            s.events_since(first),
            Err(StoreError::Gone { .. })
        ));
        assert_eq!(s.events_since(s.current_rv() - 2).unwrap().len(), 2);
        s.delete(key("a"), None).unwrap();
        s.compact();
        assert_eq!(
            s.list(ResourceId(2), None, None, None, 0, |_| true)
                .unwrap()
                .items
                .len(),
            4
        );
    }

    #[test]
    fn pages_continue_after_the_last_key() {
        let s = Store::new(100);
        for i in 0..5 {
            let n = format!("p{i}");
            s.create(key(&n), obj(&n)).unwrap();
        }
        let p1 = s
            .list(ResourceId(2), Some("default"), None, None, 2, |_| true)
            .unwrap();
        assert_eq!((p1.items.len(), p1.remaining), (2, 3));
        let p2 = s
            .list(
                ResourceId(2),
                Some("default"),
                Some(p1.rv),
                Some(&format!("{}\0", p1.last.unwrap())),
                10,
                |_| true,
            )
            .unwrap();
        assert_eq!(
            (p2.items.len(), p2.remaining, p2.last.is_none()),
            (3, 0, true)
        );
    }
}
