//! GET answers the store is known to hold, recognised on the proxy's thread: a client
//! that GETs the same unchanged object again (kubelet its node, a controller its
//! configuration) has its answer matched by a hash of its bytes, and nothing is handed to
//! the writer — no thread woken, no snapshot, no scan.
//!
//! The writer vouches for an answer when it finds the store holding its object at that
//! resourceVersion, together with the number of batches that had written the object's
//! resource by then. Any later write to that resource (an update, a delete, a list that
//! pruned it) moves that number and voids the vouch, so a repeat is only ever skipped
//! while the store provably still holds what it says.
use std::{
    collections::HashMap,
    hash::Hasher,
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use super::{
    store::{self, Store},
    writer::{Target, TargetKind},
};

/// Answers vouched for at most; past it the list starts again (a node GETs a handful of
/// objects over and over, not thousands).
const MAX_KNOWN: usize = 4096;

struct Vouch {
    /// `store::scope_key` of the object's resource.
    scope: String,
    /// `Store::generation` of that resource when the store was found holding the object.
    generation: u64,
}

pub struct Repeats {
    store: Arc<Store>,
    known: Mutex<HashMap<u64, Vouch>>,
}

impl Repeats {
    pub fn new(store: Arc<Store>) -> Repeats {
        Repeats {
            store,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the answer with this key is held by the store as it stands.
    pub fn held(&self, key: u64) -> bool {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known
            .get(&key)
            .is_some_and(|v| self.store.generation(&v.scope) == v.generation)
    }

    /// The writer has just found the store holding the answer with this key (asked
    /// before any write of its batch, so the resource's count read now is the one that
    /// goes with what it found).
    pub fn vouch(&self, key: u64, target: &Target) {
        let scope = store::scope_key(&target.credential, &target.gvr);
        let generation = self.store.generation(&scope);
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_KNOWN {
            known.clear();
        }
        known.insert(key, Vouch { scope, generation });
    }
}

/// The key of a GET answer of one object: who asked (credential and component), what
/// (resource, encoding) and the answer's exact bytes as the cloud sent them. None for
/// anything that is not one object.
pub fn key(target: &Target, gzip: bool, parts: &[Bytes]) -> Option<u64> {
    if !matches!(target.kind, TargetKind::Object) {
        return None;
    }
    let mut h = std::hash::DefaultHasher::new();
    for field in [&target.credential, &target.component, &target.gvr] {
        h.write(field.as_bytes());
        h.write_u8(0);
    }
    h.write_u8(target.encoding as u8);
    h.write_u8(u8::from(gzip));
    for p in parts {
        h.write(p);
    }
    Some(h.finish())
}
