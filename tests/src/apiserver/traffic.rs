//! What the edge link carries, per user: requests (also by Kubernetes verb), watches opened
//! and still open, and response body bytes sent. Benchmarks read it (`GET /_standin/traffic`) to compare how
//! much of the cloud a pool uses with and without its leader.
use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use serde::Serialize;

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    verbs: Mutex<BTreeMap<&'static str, u64>>,
    watches: AtomicU64,
    watch_lists: AtomicU64,
    open_watches: AtomicU64,
    bytes: AtomicU64,
    /// Response body bytes by "verb resource" (`watch pods`, `update leases`).
    bytes_by: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UserTraffic {
    pub requests: u64,
    /// get, list, watch, create, update, patch, delete, discovery, health, other.
    pub verbs: BTreeMap<&'static str, u64>,
    pub watches: u64,
    /// Watches that begin with the whole state (`sendInitialEvents=true`): lists by another name.
    pub watch_lists: u64,
    pub open_watches: u64,
    pub bytes: u64,
    /// Response body bytes by "verb resource", where they went.
    pub bytes_by: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct Traffic(Mutex<BTreeMap<String, Arc<Counters>>>);

/// Counts one response of a user as its body is sent.
pub struct Counter {
    counters: Arc<Counters>,
    /// This response's "verb resource" total.
    bytes_of_kind: Arc<AtomicU64>,
    watch: bool,
}

impl Drop for Counter {
    fn drop(&mut self) {
        if self.watch {
            self.counters.open_watches.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Traffic {
    /// `watch_list`: a watch with `sendInitialEvents=true`.
    pub fn open(
        &self,
        user: &str,
        method: &str,
        path: &str,
        watch: bool,
        watch_list: bool,
    ) -> Counter {
        let counters = self
            .0
            .lock()
            .unwrap()
            .entry(user.to_string())
            .or_default()
            .clone();
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let verb = verb(method, path, watch);
        *counters.verbs.lock().unwrap().entry(verb).or_default() += 1;
        let bytes_of_kind = counters
            .bytes_by
            .lock()
            .unwrap()
            .entry(format!("{verb} {}", resource(path)))
            .or_default()
            .clone();
        if watch {
            counters.watches.fetch_add(1, Ordering::Relaxed);
            counters.open_watches.fetch_add(1, Ordering::Relaxed);
        }
        if watch && watch_list {
            counters.watch_lists.fetch_add(1, Ordering::Relaxed);
        }
        Counter {
            counters,
            bytes_of_kind,
            watch,
        }
    }

    pub fn report(&self) -> BTreeMap<String, UserTraffic> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(u, c)| {
                let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let t = UserTraffic {
                    requests: l(&c.requests),
                    verbs: c.verbs.lock().unwrap().clone(),
                    watches: l(&c.watches),
                    watch_lists: l(&c.watch_lists),
                    open_watches: l(&c.open_watches),
                    bytes: l(&c.bytes),
                    bytes_by: (c.bytes_by.lock().unwrap().iter())
                        .map(|(k, n)| (k.clone(), l(n)))
                        .collect(),
                };
                (u.clone(), t)
            })
            .collect()
    }

    /// Zeroes the totals (open watches stay counted).
    pub fn reset(&self) {
        for c in self.0.lock().unwrap().values() {
            c.requests.store(0, Ordering::Relaxed);
            c.verbs.lock().unwrap().clear();
            c.watches.store(0, Ordering::Relaxed);
            c.watch_lists.store(0, Ordering::Relaxed);
            c.bytes.store(0, Ordering::Relaxed);
            c.bytes_by.lock().unwrap().clear();
        }
    }
}

/// The resource a request is about (`pods`, `pods/status`), or its path when it is none.
fn resource(path: &str) -> String {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => return path.to_string(),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        _ => rest,
    };
    match rest {
        [] => "discovery".into(),
        [resource] | [resource, _] => resource.to_string(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
    }
}

/// The Kubernetes verb of a request: a GET of a collection is a list, of one object a get.
fn verb(method: &str, path: &str, watch: bool) -> &'static str {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        ["healthz" | "readyz" | "livez", ..] => return "health",
        _ => {
            return if method == "GET" {
                "discovery"
            } else {
                "other"
            };
        }
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        _ => rest,
    };
    match (method, rest.len()) {
        (_, 0) => "discovery",
        ("GET", _) if watch => "watch",
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "other",
    }
}

/// A response body that adds what it sends to its user's bytes.
pub struct Counted<B> {
    inner: B,
    counter: Counter,
}

impl<B> Counted<B> {
    pub fn new(inner: B, counter: Counter) -> Self {
        Counted { inner, counter }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &polled
            && let Some(d) = f.data_ref()
        {
            let n = d.len() as u64;
            self.counter.counters.bytes.fetch_add(n, Ordering::Relaxed);
            self.counter.bytes_of_kind.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
