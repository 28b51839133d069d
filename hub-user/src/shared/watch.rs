//! One client's watch served from a shared set, as kube-apiserver's watch cache serves it:
//! the initial events (all of the scope, closed by the bookmark annotated
//! `k8s.io/initial-events-end` for a streamed list) or the changes after the
//! resourceVersion it resumes from, then every later change; 410 Gone below what the set
//! keeps. A selector is applied to each change's old and new state: an object leaving the
//! selection is DELETED, one entering it ADDED. Bookmarks carry the newest resourceVersion
//! this watch has been told of, so a client resuming from one misses nothing.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use hyper::Response;
use tokio::sync::{broadcast, mpsc};

use super::set::{Change, Msg, Set};
use crate::{
    body::ProxyBody,
    cache::{
        objects::{self, Encoding, INITIAL_EVENTS_END, Item},
        select::Selector,
        serve::{
            BOOKMARK_EVERY, accepted, api_version, bad_request, event, held_whole, meta_only,
            param, selector, watch_response, watch_timeout,
        },
    },
    kproto,
    proxy::request::RequestInfo,
};

/// How often an open watch checks that it may stay open, and whether a bookmark is due.
const TICK: Duration = Duration::from_secs(1);

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// All of the scope as ADDED events first (resourceVersion 0 or unset, or a streamed
    /// list).
    Initial,
    /// The changes after this resourceVersion.
    After(u64),
}

/// Which objects a watch is about: its namespace and selector.
struct Selection {
    namespace: String,
    sel: Selector,
}

impl Selection {
    fn takes(&self, item: &Item) -> bool {
        (self.namespace.is_empty() || item.namespace == self.namespace)
            && self.sel.matches_item(item)
    }

    /// The event a change is to this watch, and the object it carries.
    fn event_for<'c>(&self, c: &'c Change) -> Option<(&'static str, &'c Item)> {
        let was = c.before.as_deref().is_some_and(|b| self.takes(b));
        let is = self.takes(&c.now);
        if c.deleted {
            return (was || is).then_some(("DELETED", &*c.now));
        }
        match (was, is) {
            (false, true) => Some(("ADDED", &c.now)),
            (true, true) => Some(("MODIFIED", &c.now)),
            (true, false) => Some(("DELETED", &c.now)),
            (false, false) => None,
        }
    }
}

/// Serves a watch of `info`'s scope from `set`. It ends when the client goes, its
/// timeoutSeconds are up, the set is listed again, or `keep_open` turns false.
pub fn serve(
    set: &Arc<Set>,
    info: &RequestInfo,
    query: &str,
    accept: &str,
    start: Start,
    keep_open: Arc<dyn Fn() -> bool + Send + Sync>,
) -> Result<Response<ProxyBody>, String> {
    let prefs = accepted(accept);
    if prefs.is_empty() {
        return Err(format!("the client accepts only {accept:?}"));
    }
    let sel = match selector(info, query)? {
        Ok(s) => s,
        Err(msg) => return Ok(bad_request(&msg)),
    };
    let scope = Selection {
        namespace: info.namespace.clone(),
        sel,
    };
    let av = api_version(info);
    let kind = objects::kind_for(&info.resource).to_string();
    let bookmarks = param(query, "allowWatchBookmarks") == "true";
    let (first, newest, rx, enc) = match start {
        Start::Initial => {
            let (snap, rx) = set.snapshot();
            let added: Vec<Arc<Item>> = snap.items.into_iter().filter(|i| scope.takes(i)).collect();
            let enc = held_whole(&prefs, |e| added.iter().filter(|i| !i.can_be(e)).count())?;
            let mut then = Vec::new();
            // As kube-apiserver: the end is marked only for a client that takes bookmarks.
            if param(query, "sendInitialEvents") == "true" && bookmarks {
                let end = meta_only(
                    enc,
                    &av,
                    &kind,
                    None,
                    snap.rv,
                    &[(INITIAL_EVENTS_END, "true")],
                );
                then.push(event(enc, "BOOKMARK", &end));
            }
            (First { added, then }, snap.rv, rx, enc)
        }
        Start::After(from) => match set.since(from) {
            Err(old) => {
                let enc = prefs[0];
                let message = format!("too old resource version: {} ({})", old.asked, old.oldest);
                return Ok(expired(enc, &message));
            }
            Ok((changes, rv, rx)) => {
                let events: Vec<(&str, &Item)> =
                    changes.iter().filter_map(|c| scope.event_for(c)).collect();
                let enc = held_whole(&prefs, |e| {
                    events.iter().filter(|(_, i)| !i.can_be(e)).count()
                })?;
                let mut then = Vec::with_capacity(events.len());
                for (ty, item) in events {
                    let item = item
                        .in_encoding(enc)
                        .ok_or("an object cannot be converted")?;
                    then.push(event(enc, ty, &item));
                }
                let added = Vec::new();
                (First { added, then }, rv, rx, enc)
            }
        },
    };
    let feed = Feed {
        enc,
        api_version: av,
        kind,
        scope,
        newest,
        bookmarks,
        timeout: watch_timeout(query),
        keep_open,
    };
    let (tx, out) = mpsc::channel::<Bytes>(64);
    tokio::spawn(feed.run(first, rx, tx));
    Ok(watch_response("", enc, out))
}

/// A watch answered with one ERROR event: 410 Expired, as kube-apiserver answers a watch
/// from a resourceVersion its watch cache no longer covers.
fn expired(enc: Encoding, message: &str) -> Response<ProxyBody> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(expired_event(enc, message));
    watch_response("", enc, rx)
}

/// The ERROR event of a 410 Expired, byte for byte as kube-apiserver writes it.
fn expired_event(enc: Encoding, message: &str) -> Bytes {
    match enc {
        Encoding::Json => format!(
            "{{\"type\":\"ERROR\",\"object\":{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{{}},\"status\":\"Failure\",\"message\":{},\"reason\":\"Expired\",\"code\":410}}}}\n",
            serde_json::Value::from(message)
        )
        .into(),
        Encoding::Protobuf => {
            kproto::watch_frame("ERROR", &kproto::status("Expired", message, 410, None)).into()
        }
    }
}

/// What a watch sends before the set's changes: the objects of a starting watch as ADDED
/// events, made one by one as the client takes them (a large set is never held twice,
/// converted, for a client), then ready-made events.
struct First {
    added: Vec<Arc<Item>>,
    then: Vec<Bytes>,
}

/// One client's watch: what it asked for and how far it has been told.
struct Feed {
    enc: Encoding,
    api_version: String,
    kind: String,
    scope: Selection,
    /// The newest resourceVersion this watch has been told of (in order), for bookmarks.
    newest: u64,
    bookmarks: bool,
    timeout: Option<Duration>,
    keep_open: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Feed {
    async fn run(
        mut self,
        first: First,
        mut rx: broadcast::Receiver<Msg>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let started = Instant::now();
        let mut last_bookmark = Instant::now();
        for item in first.added {
            // Checked convertible before the answer began; one that still fails ends the
            // watch rather than leave the client a set without it.
            let Some(item) = item.in_encoding(self.enc) else {
                return;
            };
            if tx.send(event(self.enc, "ADDED", &item)).await.is_err() {
                return;
            }
        }
        for b in first.then {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Ok(Msg::Change(c)) => {
                        self.newest = self.newest.max(c.rv);
                        let Some((ty, item)) = self.scope.event_for(&c) else { continue };
                        // One that cannot be sent in this stream's encoding: end the watch
                        // rather than let the client miss the change.
                        let Some(item) = item.in_encoding(self.enc) else { return };
                        if tx.send(event(self.enc, ty, &item)).await.is_err() {
                            return;
                        }
                    }
                    Ok(Msg::Progress(rv)) => self.newest = self.newest.max(rv),
                    // Listed again, or this watch fell behind: it ends, and its client
                    // resumes from the last resourceVersion it saw.
                    Ok(Msg::Relisted) | Err(_) => return,
                },
                _ = tick.tick() => {
                    if !(self.keep_open)() || self.timeout.is_some_and(|t| started.elapsed() >= t) {
                        return;
                    }
                    if self.bookmarks && last_bookmark.elapsed() >= BOOKMARK_EVERY {
                        last_bookmark = Instant::now();
                        let mark = meta_only(self.enc, &self.api_version, &self.kind, None, self.newest, &[]);
                        if tx.send(event(self.enc, "BOOKMARK", &mark)).await.is_err() {
                            return;
                        }
                    }
                }
                _ = tx.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 410 a watch below the set's window gets is the one kube-apiserver 1.32 and 1.36
    /// sent (tests/fixtures/wire/*/watch-too-old-*), byte for byte.
    #[test]
    fn a_watch_below_the_window_gets_the_recorded_410() {
        let wire = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/wire");
        for (version, oldest) in [("1.32", 27685), ("1.36", 1605)] {
            let message = format!("too old resource version: 2 ({oldest})");
            for (name, enc) in [("json", Encoding::Json), ("protobuf", Encoding::Protobuf)] {
                let path =
                    format!("{wire}/kube-apiserver-{version}/watch-too-old-{name}/response.body");
                let recorded = std::fs::read(&path).unwrap();
                assert_eq!(
                    expired_event(enc, &message).as_ref(),
                    recorded.as_slice(),
                    "{path}"
                );
            }
        }
    }
}
