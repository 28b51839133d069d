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
    State, Version,
    http::{Body, Format, Target, bad_request, flag, selectors, status_error},
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
    if let Err(refused) = validate_options(&q) {
        return refused;
    }
    // Present or not: absent keeps the legacy meaning of resourceVersion.
    let send_initial = q
        .contains_key("sendInitialEvents")
        .then(|| flag(&q, "sendInitialEvents"));
    let initial_events = send_initial == Some(true);
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
    let legacy_start = rv_param.is_empty() || rv_param == "0";
    if initial_events && !legacy_start {
        // NotOlderThan N: the current state, once the cache has reached N.
        let current = state.store.current_rv();
        match rv_param.parse::<u64>() {
            Ok(n) if n > current => return too_large(n, current),
            Ok(_) => {}
            Err(_) => return bad_request(&format!("invalid resource version: {rv_param}")),
        }
    }
    if send_initial == Some(false) && legacy_start {
        // From now on, without the current state.
        last_sent = state.store.current_rv();
    } else if initial_events || (send_initial.is_none() && legacy_start) {
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
        // kube-apiserver marks the end only for a client that takes bookmarks.
        if initial_events && bookmarks {
            let mark = initial_events_end(r, page.rv, state.options.version, format);
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
    let at_deadline = state.options.bookmark_at_deadline && timeout >= Duration::from_secs(3);
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
                _ = tokio::time::sleep_until(deadline) => {
                    if bookmarks && at_deadline {
                        // As kube-apiserver's watch cache: the bookmark follows every event
                        // dispatched before it on this stream, so it never claims one this
                        // watch was not sent. Events already written go out first.
                        while let Ok(e) = live.try_recv() {
                            progress = progress.max(e.rv);
                            if e.rv <= last_sent || !in_scope(&e) {
                                continue;
                            }
                            last_sent = e.rv;
                            if let Some((kind, obj)) = visible(&e, &matches) {
                                let _ = tx.send(encode(kind, obj)).await;
                            }
                        }
                        let rv = progress.max(last_sent).to_string();
                        let mark = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": {"resourceVersion": rv}});
                        let _ = tx.send(encode("BOOKMARK", &mark)).await;
                    }
                    return;
                }
                _ = tx.closed() => return,
            }
        }
    });
    watch_response(http_body_util::BodyExt::boxed(ChannelBody(rx)), format)
}

/// The refusals kube-apiserver gives a watch's list options (apimachinery's
/// `validateWatchOptions`, WatchList on): 422 Invalid, every problem named as a cause.
fn validate_options(q: &HashMap<String, String>) -> Result<(), Response<Body>> {
    const FIELD: &str = "resourceVersionMatch";
    let matching = q.get(FIELD).map(String::as_str).unwrap_or("");
    let send_initial = q.contains_key("sendInitialEvents");
    // (reason, message) of each cause.
    let mut causes: Vec<(&str, String)> = Vec::new();
    let forbidden = |detail: &str| ("FieldValueForbidden", format!("Forbidden: {detail}"));
    if send_initial && matching != "NotOlderThan" {
        causes.push(forbidden(
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !matching.is_empty() {
        if !send_initial {
            causes.push(forbidden(
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if matching != "NotOlderThan" {
            causes.push((
                "FieldValueNotSupported",
                format!("Unsupported value: \"{matching}\": supported values: \"NotOlderThan\""),
            ));
        }
        if q.contains_key("continue") {
            causes.push(forbidden(
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let errors: Vec<String> = causes
        .iter()
        .map(|(_, m)| format!("{FIELD}: {m}"))
        .collect();
    let listed = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    Err(status_error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("ListOptions.meta.k8s.io \"\" is invalid: {listed}"),
        Some(json!({"group": "meta.k8s.io", "kind": "ListOptions",
            "causes": causes.iter().map(|(reason, message)|
                json!({"reason": reason, "message": message, "field": FIELD})).collect::<Vec<_>>()})),
    ))
}

/// A watch from a resourceVersion the cache has not reached (after the 3 s kube-apiserver
/// waits for it).
fn too_large(asked: u64, current: u64) -> Response<Body> {
    status_error(
        StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        &format!("Too large resource version: {asked}, current: {current}"),
        Some(
            json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
        ),
    )
}

/// The BOOKMARK that ends a streamed list's initial events, as `version` writes it: an
/// empty object of the watched kind with the list's resourceVersion and the annotation
/// (1.32 also names the list's blueprint and writes `creationTimestamp: null`).
fn initial_events_end(r: &resources::Resource, rv: u64, version: Version, format: Format) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string(),
        "annotations": {"k8s.io/initial-events-end": "true"}});
    if version == Version::V1_32 {
        use base64::Engine;
        let list_kind = format!("{}List", r.kind);
        let blueprint = if format == Format::Protobuf {
            super::protobuf::blueprint(&r.api_version(), r.kind)
        } else {
            // In kube-apiserver's field order.
            format!(
                "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{}\",\"metadata\":{{}},\"items\":null}}\n",
                r.api_version()
            )
            .into_bytes()
        };
        meta["creationTimestamp"] = Value::Null;
        meta["annotations"]["kubernetes.io/initial-events-list-blueprint"] =
            base64::engine::general_purpose::STANDARD
                .encode(blueprint)
                .into();
    }
    let mut mark = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": meta});
    if r.kind == "Pod" {
        // The empty Pod kube-apiserver serialises: its spec's one required list as null.
        mark["spec"] = json!({"containers": null});
        mark["status"] = json!({});
    }
    mark
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
