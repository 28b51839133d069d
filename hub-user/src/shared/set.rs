//! One resource's shared set: every object the node's one cloud list+watch holds, the
//! resourceVersion it stands at, and the recent changes, so a watch resumed from a
//! resourceVersion the set still covers is answered from here (kube-apiserver's watch
//! cache keeps such a window too, and answers 410 Gone below it).
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{Notify, broadcast, watch};

use crate::cache::objects::{EventType, Item};

/// Changes kept for resumed watches. Below the oldest, a resumed watch gets 410 Gone and
/// its client lists again.
const HISTORY: usize = 4096;
/// Messages a slow watcher may lag behind before it is ended (it resumes from its last
/// resourceVersion, which the history still covers).
const LAG: usize = 1024;

/// One change of the set, as the cloud's watch reported it.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    /// The object before the change (None when it was added).
    pub before: Option<Arc<Item>>,
    /// The object after the change; for a deletion, its last state as the cloud sent it.
    pub now: Arc<Item>,
    pub deleted: bool,
}

/// What watchers of the set are told.
#[derive(Debug, Clone)]
pub enum Msg {
    Change(Arc<Change>),
    /// The cloud's watch has passed this resourceVersion (a bookmark).
    Progress(u64),
    /// The set was listed again (the cloud's watch could not resume): every watch of it
    /// ends, and its client resumes or lists again.
    Relisted,
}

/// Whether the set can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not listed yet.
    Filling,
    /// Listed, and its cloud watch is open.
    Current,
    /// Listed, and its cloud watch broke (why); it is being opened again from the set's
    /// resourceVersion, which the cloud's reconnecting clients resume from too.
    Resuming(String),
    /// Not listed, or the cloud refused the list; why.
    Broken(String),
}

/// The objects of the set at one resourceVersion.
pub struct Snapshot {
    pub items: Vec<Arc<Item>>,
    pub rv: u64,
}

struct Inner {
    objects: BTreeMap<(String, String), Arc<Item>>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Every change after this resourceVersion is in `history`.
    floor: u64,
    state: State,
    lists: u64,
    events: u64,
}

pub struct Set {
    pub gvr: String,
    /// The plural resource (`services`), for parsing its objects.
    pub resource: String,
    inner: Mutex<Inner>,
    msgs: broadcast::Sender<Msg>,
    progress: watch::Sender<u64>,
    /// A read waits for the set to pass a resourceVersion: the sync asks the cloud to
    /// show its progress (`sync::probe`).
    pub wanted: Notify,
}

/// A resumed watch asked for changes older than the set keeps.
#[derive(Debug, PartialEq, Eq)]
pub struct TooOld {
    pub asked: u64,
    pub oldest: u64,
}

/// What `hub status` says of a set.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub gvr: String,
    pub state: String,
    pub objects: usize,
    pub resource_version: u64,
    pub lists: u64,
    pub events: u64,
}

impl Set {
    pub fn new(gvr: &str, resource: &str) -> Set {
        Set {
            gvr: gvr.to_string(),
            resource: resource.to_string(),
            inner: Mutex::new(Inner {
                objects: BTreeMap::new(),
                rv: 0,
                history: VecDeque::new(),
                floor: 0,
                state: State::Filling,
                lists: 0,
                events: 0,
            }),
            msgs: broadcast::channel(LAG).0,
            progress: watch::channel(0).0,
            wanted: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> State {
        self.lock().state.clone()
    }

    pub fn set_state(&self, state: State) {
        self.lock().state = state;
        // Readers waiting for the set to be current look again.
        self.progress.send_modify(|_| ());
    }

    pub fn rv(&self) -> u64 {
        self.lock().rv
    }

    /// A complete list: the set becomes exactly `items` at `rv`. Watches of the old set end.
    pub fn replace(&self, items: Vec<Item>, rv: u64) {
        let mut inner = self.lock();
        inner.objects = items
            .into_iter()
            .map(|i| ((i.namespace.clone(), i.name.clone()), Arc::new(i)))
            .collect();
        inner.rv = rv;
        inner.history.clear();
        inner.floor = rv;
        inner.state = State::Current;
        inner.lists += 1;
        let _ = self.msgs.send(Msg::Relisted);
        self.progress.send_replace(rv);
    }

    /// One watch event of the cloud's: ADDED, MODIFIED or DELETED with its object. Two
    /// streams may carry the same event (the watch and a progress probe, each complete
    /// and in order): one the set has passed is already applied.
    pub fn apply(&self, ty: EventType, item: Item) {
        let mut inner = self.lock();
        if item.rv <= inner.rv {
            return;
        }
        let id = (item.namespace.clone(), item.name.clone());
        let rv = item.rv;
        let now = Arc::new(item);
        let deleted = ty == EventType::Deleted;
        let before = if deleted {
            inner.objects.remove(&id)
        } else {
            inner.objects.insert(id, now.clone())
        };
        let change = Arc::new(Change {
            rv,
            before,
            now,
            deleted,
        });
        inner.history.push_back(change.clone());
        if inner.history.len() > HISTORY
            && let Some(old) = inner.history.pop_front()
        {
            inner.floor = old.rv;
        }
        inner.rv = inner.rv.max(rv);
        inner.events += 1;
        let _ = self.msgs.send(Msg::Change(change));
        self.progress.send_replace(inner.rv);
    }

    /// A bookmark: the cloud's watch has passed `rv`.
    pub fn advance(&self, rv: u64) {
        let mut inner = self.lock();
        if rv > inner.rv {
            inner.rv = rv;
            let _ = self.msgs.send(Msg::Progress(rv));
            self.progress.send_replace(rv);
        }
    }

    /// One object of the set now, and the set's resourceVersion.
    pub fn get(&self, namespace: &str, name: &str) -> (Option<Arc<Item>>, u64) {
        let inner = self.lock();
        let id = (namespace.to_string(), name.to_string());
        (inner.objects.get(&id).cloned(), inner.rv)
    }

    /// The set now, and a subscription to every change after it.
    pub fn snapshot(&self) -> (Snapshot, broadcast::Receiver<Msg>) {
        let inner = self.lock();
        let rx = self.msgs.subscribe();
        let items = inner.objects.values().cloned().collect();
        (
            Snapshot {
                items,
                rv: inner.rv,
            },
            rx,
        )
    }

    /// The set as it stood at `rv` (the changes after it undone), for the next page of a
    /// list read at `rv`; TooOld when the set no longer keeps all of those changes.
    pub fn snapshot_at(&self, rv: u64) -> Result<Snapshot, TooOld> {
        let inner = self.lock();
        if rv < inner.floor {
            return Err(TooOld {
                asked: rv,
                oldest: inner.floor,
            });
        }
        let mut objects = inner.objects.clone();
        for change in inner.history.iter().rev().take_while(|c| c.rv > rv) {
            let id = (change.now.namespace.clone(), change.now.name.clone());
            match &change.before {
                Some(before) => objects.insert(id, before.clone()),
                None => objects.remove(&id),
            };
        }
        Ok(Snapshot {
            items: objects.into_values().collect(),
            rv: rv.min(inner.rv),
        })
    }

    /// The changes after `from`, the resourceVersion they reach, and a subscription to the
    /// later ones; TooOld when the set no longer keeps all of them.
    #[allow(clippy::type_complexity)]
    pub fn since(
        &self,
        from: u64,
    ) -> Result<(Vec<Arc<Change>>, u64, broadcast::Receiver<Msg>), TooOld> {
        let inner = self.lock();
        if from < inner.floor {
            return Err(TooOld {
                asked: from,
                oldest: inner.floor,
            });
        }
        let rx = self.msgs.subscribe();
        let changes = inner
            .history
            .iter()
            .filter(|c| c.rv > from)
            .cloned()
            .collect();
        Ok((changes, inner.rv, rx))
    }

    /// Waits until the set is listed and its watch open (true), or `limit` is up (false):
    /// a client that comes while the set is first listed, or while its watch is opened
    /// again, is answered from it rather than sent to the cloud for the same list.
    pub async fn current_within(&self, limit: Duration) -> bool {
        let mut progress = self.progress.subscribe();
        let current = async {
            loop {
                if self.state() == State::Current {
                    return;
                }
                if progress.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(limit, current).await.is_ok()
    }

    /// Waits until the set has passed `rv` (true), or `limit` is up (false).
    pub async fn reaches(&self, rv: u64, limit: Duration) -> bool {
        let mut progress = self.progress.subscribe();
        if *progress.borrow() < rv {
            self.wanted.notify_one();
        }
        tokio::time::timeout(limit, progress.wait_for(|at| *at >= rv))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub fn summary(&self) -> Summary {
        let inner = self.lock();
        Summary {
            gvr: self.gvr.clone(),
            state: match &inner.state {
                State::Filling => "filling".into(),
                State::Current => "current".into(),
                State::Resuming(why) => format!("resuming its watch: {why}"),
                State::Broken(why) => format!("not current: {why}"),
            },
            objects: inner.objects.len(),
            resource_version: inner.rv,
            lists: inner.lists,
            events: inner.events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::objects::Encoding;

    fn item(name: &str, rv: u64) -> Item {
        Item {
            name: name.into(),
            namespace: "ns1".into(),
            rv,
            labels: vec![],
            fields: vec![],
            api_version: "v1".into(),
            kind: "Service".into(),
            encoding: Encoding::Json,
            body: format!("{{\"rv\":{rv}}}").into_bytes(),
        }
    }

    #[test]
    fn a_resumed_watch_gets_the_changes_after_its_version_or_410_below_the_window() {
        let set = Set::new("/v1/services", "services");
        set.replace(vec![item("a", 5), item("b", 6)], 10);
        set.apply(EventType::Modified, item("a", 11));
        set.apply(EventType::Deleted, item("b", 12));
        // The same event again (from a second stream) changes nothing.
        set.apply(EventType::Deleted, item("b", 12));
        set.advance(20);
        let (changes, rv, _) = set.since(11).unwrap();
        assert_eq!(rv, 20);
        assert_eq!(changes.len(), 1);
        assert!(changes[0].deleted);
        assert_eq!(changes[0].before.as_ref().unwrap().rv, 6);
        assert_eq!(
            set.since(9).unwrap_err(),
            TooOld {
                asked: 9,
                oldest: 10
            }
        );
        let (snap, _) = set.snapshot();
        let names: Vec<_> = snap.items.iter().map(|i| (i.name.as_str(), i.rv)).collect();
        assert_eq!(names, vec![("a", 11)]);
        // The window slides: the oldest change leaves and raises the floor.
        for n in 0..HISTORY as u64 {
            set.apply(EventType::Modified, item("a", 100 + n));
        }
        assert_eq!(set.since(11).unwrap_err().oldest, 12);
        assert!(set.since(100).is_ok());
    }

    #[test]
    fn the_set_as_it_stood_at_a_version_it_still_covers() {
        let set = Set::new("/v1/services", "services");
        set.replace(vec![item("a", 5), item("b", 6)], 10);
        set.apply(EventType::Modified, item("a", 11));
        set.apply(EventType::Deleted, item("b", 12));
        set.apply(EventType::Added, item("c", 13));
        let at = |rv| {
            let snap = set.snapshot_at(rv).unwrap();
            let seen: Vec<_> = snap.items.iter().map(|i| (i.name.clone(), i.rv)).collect();
            (seen, snap.rv)
        };
        let named = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(n, rv)| (n.to_string(), *rv)).collect()
        };
        assert_eq!(at(10), (named(&[("a", 5), ("b", 6)]), 10));
        assert_eq!(at(11), (named(&[("a", 11), ("b", 6)]), 11));
        assert_eq!(at(12), (named(&[("a", 11)]), 12));
        assert_eq!(at(13), (named(&[("a", 11), ("c", 13)]), 13));
        assert_eq!(set.snapshot_at(9).err().map(|e| e.oldest), Some(10));
    }
}
