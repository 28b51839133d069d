//! Watches: JSON event lines streamed as they happen, from a resourceVersion, with
//! selectors (objects entering or leaving a selection become ADDED / DELETED), bookmarks,
//! sendInitialEvents with the initial-events-end bookmark, timeoutSeconds, and 410 Gone as
//! an ERROR event when the requested resourceVersion has been compacted.
use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use hyper::{Response, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{broadcast::error::RecvError, mpsc};

use super::{
    State,
    http::{Body, Format, Target, bad_request, flag, selectors},
    resources,
    store::{Event, EventType, StoreError},
    table,
};

/// A body fed from a channel: each message is one chunk, sent as soon as it is produced.
pub struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
    v.push(b'\n');
    Bytes::from(v)
}

pub async fn watch(
    state: Arc<State>,
    t: Target,
    q: HashMap<String, String>,
    format: Format,
) -> Response<Body> {
    let r = resources::get(t.resource);
    let (labels, fields) = match selectors(r, &q) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let bookmarks = flag(&q, "allowWatchBookmarks");
    let initial_events = flag(&q, "sendInitialEvents");
    if initial_events && q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
        return bad_request(
            "sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan",
        );
    }
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(state.options.max_watch, Duration::from_secs)
        .min(state.options.max_watch);
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();

    // Subscribe before reading history so nothing falls between the two.
    let mut live = state.store.subscribe();
    let matches = |o: &Value| labels.matches(o) && fields.matches(o);
    let in_scope = |e: &Event| {
        e.key.resource == t.resource && t.namespace.as_ref().is_none_or(|ns| *ns == e.key.namespace)
    };

    let encode = move |kind: &str, obj: &Value| -> Bytes {
        if format == Format::Protobuf {
            Bytes::from(super::protobuf::watch_frame(
                kind,
                &r.api_version(),
                r.kind,
                obj,
            ))
        } else if format == Format::Table && kind != "ERROR" && kind != "BOOKMARK" {
            line(
                kind,
                &table::table(
                    r,
                    &[obj],
                    json!({"resourceVersion": obj["metadata"]["resourceVersion"]}),
                ),
            )
        } else {
            line(kind, obj)
        }
    };

    let mut first: Vec<Bytes> = Vec::new();
    let mut last_sent: u64;
    let synthetic = initial_events || rv_param.is_empty() || rv_param == "0";
    if synthetic {
        let page =
            match state
                .store
                .list(t.resource, t.namespace.as_deref(), None, None, 0, &matches)
            {
                Ok(p) => p,
                Err(_) => return bad_request("list failed"),
            };
        for obj in &page.items {
            first.push(encode("ADDED", obj));
        }
        last_sent = page.rv;
        if initial_events {
            let mark = json!({"kind": r.kind, "apiVersion": r.api_version(),
                "metadata": {"resourceVersion": page.rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}});
            first.push(encode("BOOKMARK", &mark));
        }
    } else {
        let Ok(from) = rv_param.parse::<u64>() else {
            return bad_request(&format!("invalid resource version: {rv_param}"));
        };
        match state.store.events_since(from) {
            Ok(events) => {
                for e in events.iter().filter(|e| in_scope(e)) {
                    if let Some((kind, obj)) = visible(e, &matches) {
                        first.push(encode(kind, obj));
                    }
                }
                last_sent = events.last().map_or(from, |e| e.rv).max(from);
            }
            Err(StoreError::Gone { requested, oldest }) => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {requested} ({oldest})"), "reason": "Expired", "code": 410});
                // Streamed like any watch (200, chunked), then closed, as kube-apiserver does.
                let (tx, rx) = mpsc::channel(1);
                let frame = if format == Format::Protobuf {
                    let message = status["message"].as_str().unwrap_or_default();
                    Bytes::from(super::protobuf::error_frame(410, "Expired", message))
                } else {
                    line("ERROR", &status)
                };
                let _ = tx.try_send(frame);
                return watch_response(http_body_util::BodyExt::boxed(ChannelBody(rx)), format);
            }
            Err(_) => return bad_request("watch failed"),
        }
    }

    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let bookmark_every = state.options.bookmark_interval;
    let store_state = state.clone();
    let labels2 = labels.clone();
    let fields2 = fields.clone();
    let t2 = t.clone();
    tokio::spawn(async move {
        let matches = |o: &Value| labels2.matches(o) && fields2.matches(o);
        let in_scope = |e: &Event| {
            e.key.resource == t2.resource
                && t2
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| *ns == e.key.namespace)
        };
        for chunk in first {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut progress = last_sent;
        let mut bookmark_sent = last_sent;
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        loop {
            if store_state.faults.watches_frozen() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = tokio::time::sleep_until(deadline) => return,
                    _ = tx.closed() => return,
                }
            }
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(e) => {
                        progress = progress.max(e.rv);
                        if e.rv <= last_sent || !in_scope(&e) {
                            continue;
                        }
                        last_sent = e.rv;
                        if let Some((kind, obj)) = visible(&e, &matches)
                            && tx.send(encode(kind, obj)).await.is_err()
                        {
                            return;
                        }
                    }
                    // A watcher too slow for the event stream is closed; the client re-watches.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
                _ = ticker.tick(), if bookmarks => {
                    if progress > bookmark_sent {
                        bookmark_sent = progress;
                        let mark = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": {"resourceVersion": progress.to_string()}});
                        if tx.send(encode("BOOKMARK", &mark)).await.is_err() {
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    });
    watch_response(http_body_util::BodyExt::boxed(ChannelBody(rx)), format)
}

fn watch_response(body: Body, format: Format) -> Response<Body> {
    let content_type = if format == Format::Protobuf {
        super::protobuf::WATCH_CONTENT_TYPE
    } else {
        "application/json"
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .expect("response")
}

/// How an event looks through a selector: entering it is ADDED, leaving it DELETED.
fn visible<'a>(
    e: &'a Event,
    matches: &impl Fn(&Value) -> bool,
) -> Option<(&'static str, &'a Value)> {
    let now = matches(&e.object);
    let before = e.previous.as_deref().is_some_and(matches);
    match e.kind {
        EventType::Added if now => Some(("ADDED", &e.object)),
        EventType::Modified if now && before => Some(("MODIFIED", &e.object)),
        EventType::Modified if now => Some(("ADDED", &e.object)),
        EventType::Modified if before => Some(("DELETED", &e.object)),
        EventType::Deleted if before => Some(("DELETED", &e.object)),
        _ => None,
    }
}
