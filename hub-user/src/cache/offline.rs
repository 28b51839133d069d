//! Writes while the cloud is unreachable (issue 6 §4). A node must keep renewing its lease,
//! reporting node and pod status and recording events through an outage; those writes —
//! from the node identity only, so no caller's token is ever stored — are accepted: kept
//! durably in the store's outbox, answered with the resulting object and a Warning that
//! says they are queued, and replayed to the cloud in order once it is back. The writes of
//! an object the node keeps live (pod and node status, its lease: `crate::live`) fold into
//! one entry per object that its clients read back and that replays as one write; the
//! rest (events) queue one by one. A conflict is resolved by re-reading the object and
//! retrying once; what cannot be replayed is logged and counted. Every other write gets a
//! 503 naming the offline state (never a fake success).
use std::{sync::Arc, time::Duration};

use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Method, Request, Response, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use super::{
    Cache,
    objects::{self, Encoding, Item},
    serve,
    store::{self, ObjectKey},
};
use crate::{
    body::ProxyBody,
    kproto::{self, StatusCause, StatusDetails},
    live::{
        self, Entry, Refusal,
        patch::PatchType,
        state::{NodeWrite, NotTaken},
    },
    proxy::{
        forward::{full, status, status_about},
        request::RequestInfo,
    },
    upstream::{Cloud, cloud::AsWho},
};

/// Writes kept at most while offline; more are refused with a 503.
pub const MAX_QUEUED: u64 = 10_000;
const WARNING: &str = "299 - \"hub: the cloud is unreachable; this write is queued on the node and will be replayed to the cloud when it is back\"";
const WARNING_BEHIND: &str = "299 - \"hub: earlier writes of this node are being replayed to the cloud; this write is queued behind them\"";
/// How often the replayer looks for work.
const REPLAY_EVERY: Duration = Duration::from_millis(300);
/// Upper bound of a replayed answer read back (to refresh the cache).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// The writes a node makes to keep being a node: lease renewals, node and pod status,
/// events — and two it needs answered though they cannot be queued: its registration (a
/// node create, answered offline as the cloud would answer it for a node it knows) and
/// its pods' service-account tokens (see `tokens`).
pub fn replayable(info: &RequestInfo) -> bool {
    let write = matches!(info.verb, "create" | "update" | "patch");
    let named = !info.name.is_empty();
    write
        && match (
            info.group.as_str(),
            info.resource.as_str(),
            info.subresource.as_str(),
        ) {
            ("coordination.k8s.io", "leases", "") => named && info.verb != "create",
            ("", "nodes" | "pods", "status") => named && info.verb != "create",
            ("", "nodes", "") => !named && info.verb == "create",
            ("", "serviceaccounts", "token") => named && info.verb == "create",
            ("", "events", "") | ("events.k8s.io", "events", "") => named || info.verb == "create",
            _ => false,
        }
}

/// A write that a newer one of the same object makes pointless: a lease renewal, the
/// node's status (kubelet patches it against the node it last read; while that copy is
/// unchanged, the newest patch carries everything the earlier ones did). Only the newest
/// queued one is sent, and none once the client writes again itself after the cloud's
/// return (its patch is then against the cloud's own state).
pub fn supersedable(info: &RequestInfo) -> bool {
    let named = !info.name.is_empty();
    match (
        info.group.as_str(),
        info.resource.as_str(),
        info.subresource.as_str(),
    ) {
        ("coordination.k8s.io", "leases", "") => named && info.verb == "update",
        ("", "nodes", "status") => named && matches!(info.verb, "update" | "patch"),
        _ => false,
    }
}

/// How long after the cloud's return a queued supersedable write waits for the client's
/// own next write (kubelet renews its lease every 10 s) before it is replayed.
const SUPERSEDE_GRACE: Duration = Duration::from_secs(12);

/// The replayable writes that go to the outbox offline (a token request or a node's
/// registration is answered from the cache instead, never queued).
pub fn queued_when_offline(info: &RequestInfo) -> bool {
    replayable(info)
        && !super::tokens::is_token_request(info)
        && !(info.resource == "nodes" && info.verb == "create")
}

/// Events are the node's least valuable writes: past this many queued (or these bytes),
/// the oldest queued events are dropped to make room. kubelet sent ~22 event writes a
/// second with 1000 pods starting; this keeps the last ~45 s of such a burst.
pub const EVENT_BUDGET: store::Budget = store::Budget {
    count: 1000,
    bytes: 4 * 1024 * 1024,
};
/// How long a queued write rides out refusals that may pass (401, 403, 429, 5xx, no
/// answer) once the cloud is back, before it is dropped.
pub const REPLAY_PATIENCE: Duration = Duration::from_secs(120);
/// The longest wait between two replay attempts of a refused write.
const REPLAY_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// At most one "writes queued" line per this long.
const QUEUED_LOG_EVERY: Duration = Duration::from_secs(30);

fn is_event(info: &RequestInfo) -> bool {
    info.resource == "events" && matches!(info.group.as_str(), "" | "events.k8s.io")
}

/// One queued write, as stored in the outbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Queued {
    method: String,
    path_and_query: String,
    content_type: String,
    component: String,
    body: String,
    /// The live entry this row replays (`crate::live`): its net write is made when it is
    /// sent, and the fields above only name the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    live: Option<String>,
    /// The encoding the answer is asked in, when not the one written in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    accept: Option<String>,
}

impl Queued {
    fn request_info(&self) -> RequestInfo {
        let (path, query) = self
            .path_and_query
            .split_once('?')
            .unwrap_or((&self.path_and_query, ""));
        let method = self.method.parse::<Method>().unwrap_or(Method::GET);
        RequestInfo::parse(&method, path, query)
    }
}

/// Why a write cannot be accepted offline.
enum Refused {
    BadRequest(String),
    /// The message and what it is about, as kube-apiserver's 422 says them.
    Invalid(String, StatusDetails),
    Unavailable(String),
}

impl Refused {
    fn response(self) -> Response<ProxyBody> {
        match self {
            Refused::BadRequest(m) => status(StatusCode::BAD_REQUEST, "BadRequest", &m),
            Refused::Invalid(m, about) => {
                status_about(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &m, Some(about))
            }
            Refused::Unavailable(m) => unavailable(&m),
        }
    }
}

/// What the write produces: (answer code, the object to answer and cache, whether the
/// object is new state to store).
fn result_of(
    cache: &Cache,
    info: &RequestInfo,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Item, bool), Refused> {
    let bad = Refused::BadRequest;
    if info.verb == "patch" {
        let kind = PatchType::of_content_type(content_type)
            .ok_or_else(|| bad(format!("unsupported patch type {content_type:?}")))?;
        let current = match cache
            .store
            .freshest("node", info)
            .map_err(|e| Refused::Unavailable(e.to_string()))?
        {
            Some(c) => c,
            None => {
                return Err(Refused::Unavailable(format!(
                    "{} {}/{} is not in the local cache, so a patch cannot be answered offline",
                    info.resource, info.namespace, info.name
                )));
            }
        };
        let current = current
            .in_encoding(Encoding::Json)
            .ok_or_else(|| bad(format!("{} cannot be read as JSON", info.resource)))?;
        let mut obj: Value = serde_json::from_slice(&current.body)
            .map_err(|e| bad(format!("cached object: {e}")))?;
        let p: Value = serde_json::from_slice(body).map_err(|e| bad(format!("patch body: {e}")))?;
        live::patch::apply(&mut obj, &p, kind, None)
            .map_err(|e| bad(format!("the patch does not apply: {e}")))?;
        let item = objects::from_json(&info.resource, obj, "", "")
            .map_err(|e| bad(format!("patched object: {e}")))?;
        return Ok((StatusCode::OK, item, true));
    }
    let enc = Encoding::of_content_type(content_type)
        .ok_or_else(|| bad(format!("unsupported content type {content_type:?}")))?;
    let item = objects::parse_object(&info.resource, enc, body)
        .map_err(|e| bad(format!("request body: {e}")))?;
    if !info.name.is_empty() && item.name != info.name {
        return Err(bad(format!(
            "the name in the body ({:?}) does not match the URL ({:?})",
            item.name, info.name
        )));
    }
    let code = if info.verb == "create" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, item, true))
}

/// A node registration while the cloud is unreachable: the cloud answers `409
/// AlreadyExists` for a node it has, and kubelet then goes on; for a node the hub never
/// saw there is no truthful answer.
fn register_node(cache: &Cache, content_type: &str, body: &[u8]) -> Response<ProxyBody> {
    let Some(enc) = Encoding::of_content_type(content_type) else {
        return Refused::BadRequest(format!("unsupported content type {content_type:?}"))
            .response();
    };
    let node = match objects::parse_object("nodes", enc, body) {
        Ok(n) => n,
        Err(e) => return Refused::BadRequest(format!("request body: {e}")).response(),
    };
    let p = store::prefix("node", "/v1/nodes", Some(""), Some(&node.name));
    match cache.store.scan(&p) {
        Ok(held) if held.iter().any(|(_, r)| !r.deleted) => status_about(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("nodes {:?} already exists", node.name),
            Some(StatusDetails {
                name: node.name.clone(),
                group: String::new(),
                kind: "nodes".into(),
                causes: Vec::new(),
            }),
        ),
        Ok(_) => unavailable(&format!(
            "node {:?} is not in the local cache, so its registration cannot be answered offline",
            node.name
        )),
        Err(e) => unavailable(&e.to_string()),
    }
}

fn unavailable(why: &str) -> Response<ProxyBody> {
    status(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        &format!("hub: the node is offline from the cloud: {why}"),
    )
}

impl Cache {
    /// Accepts a replayable write while the cloud is unreachable (or while earlier ones
    /// are replayed, `behind_replay`): queued durably, applied to what the node is served,
    /// answered with the object (in an encoding `accept` takes) and a Warning.
    #[allow(clippy::too_many_arguments)]
    pub async fn accept_offline(
        self: &Arc<Self>,
        behind_replay: bool,
        info: &RequestInfo,
        method: &Method,
        path_and_query: &str,
        content_type: &str,
        accept: &str,
        component: &str,
        body: Bytes,
    ) -> Response<ProxyBody> {
        let (me, info) = (self.clone(), info.clone());
        let queued = Queued {
            method: method.to_string(),
            path_and_query: path_and_query.to_string(),
            content_type: content_type.to_string(),
            component: component.to_string(),
            body: base64::engine::general_purpose::STANDARD.encode(&body),
            live: None,
            accept: None,
        };
        let (content_type, component) = (content_type.to_string(), component.to_string());
        let accept = accept.to_string();
        let answer = tokio::task::spawn_blocking(move || {
            if info.resource == "nodes" && info.verb == "create" {
                return register_node(&me, &content_type, &body);
            }
            if super::tokens::is_token_request(&info) {
                return me.token_offline(&info, &content_type, &body);
            }
            let kept = match live::replay_as(&info) {
                Some(_) => me.take_live(&info, &queued, &body),
                None => Ok(None),
            };
            let taken = match kept {
                Ok(Some(taken)) => Ok(taken),
                Ok(None) => me.queue_one(&info, &queued, &content_type, &component, &body),
                Err(refused) => Err(refused),
            };
            let (code, item) = match taken {
                Ok((code, item, done)) => {
                    me.note_queued(done, behind_replay);
                    (code, item)
                }
                Err(refused) => return refused.response(),
            };
            let item = serve::accepted(&accept)
                .into_iter()
                .find_map(|e| item.in_encoding(e).map(|i| i.into_owned()))
                .unwrap_or(item);
            Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, item.encoding.content_type())
                .header(
                    "warning",
                    if behind_replay {
                        WARNING_BEHIND
                    } else {
                        WARNING
                    },
                )
                .body(full(item.encoded()))
                .expect("valid response parts")
        })
        .await;
        answer.unwrap_or_else(|e| unavailable(&format!("queueing failed: {e}")))
    }

    /// A write of an object the node keeps live: folded into its entry, which the node's
    /// clients are served from now on and which one outbox row replays. None: not kept
    /// live after all (queue it as it is).
    fn take_live(
        &self,
        info: &RequestInfo,
        q: &Queued,
        body: &[u8],
    ) -> Result<Option<(StatusCode, Item, store::Enqueued)>, Refused> {
        let path = q.path_and_query.split('?').next().unwrap_or_default();
        // The row names the entry it replays (by the entry's key).
        let row = |key: &[u8]| {
            let row = Queued {
                method: q.method.clone(),
                path_and_query: path.to_string(),
                content_type: String::new(),
                component: q.component.clone(),
                body: String::new(),
                live: Some(String::from_utf8_lossy(key).into_owned()),
                accept: None,
            };
            serde_json::to_vec(&row).unwrap_or_default()
        };
        let write = NodeWrite {
            info,
            path,
            content_type: &q.content_type,
            component: &q.component,
            body,
        };
        let budget = is_event(info).then_some(EVENT_BUDGET);
        let taken = self.live.take(&write, row, MAX_QUEUED, budget);
        if let Err(NotTaken::NotKept) = taken {
            return Ok(None);
        }
        let (entry, done) = taken.map_err(|e| match e {
            NotTaken::Refused(Refusal::BadRequest(m)) => Refused::BadRequest(m),
            NotTaken::Refused(Refusal::Immutable { kind, field, value }) => {
                // As kube-apiserver's validation words it (it lists the cause twice
                // for a pod's status; once is what it means).
                let why = format!("Invalid value: {value:?}: field is immutable");
                Refused::Invalid(
                    format!("{kind} {:?} is invalid: {field}: {why}", info.name),
                    StatusDetails {
                        name: info.name.clone(),
                        group: info.group.clone(),
                        kind,
                        causes: vec![StatusCause {
                            reason: "FieldValueInvalid".into(),
                            message: why,
                            field: field.into(),
                        }],
                    },
                )
            }
            NotTaken::Unavailable(m) => Refused::Unavailable(m),
            NotTaken::NotKept => Refused::Unavailable("this write cannot be kept".into()),
        })?;
        let item = entry.served().ok_or_else(|| {
            Refused::BadRequest("the written object is not a Kubernetes object".into())
        })?;
        let code = if info.verb == "create" {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(Some((code, item, done)))
    }

    /// Any other write: one outbox row of its own, and the object it answers kept as the
    /// node's copy where it is new state.
    fn queue_one(
        &self,
        info: &RequestInfo,
        queued: &Queued,
        content_type: &str,
        component: &str,
        body: &[u8],
    ) -> Result<(StatusCode, Item, store::Enqueued), Refused> {
        let (code, item, store_it) = result_of(self, info, content_type, body)?;
        let update = store_it.then(|| {
            (
                ObjectKey {
                    credential: "node".into(),
                    gvr: info.gvr(),
                    namespace: item.namespace.clone(),
                    name: item.name.clone(),
                    component: component.to_string(),
                },
                item.clone(),
            )
        });
        let raw = serde_json::to_vec(queued).unwrap_or_default();
        let budget = is_event(info).then_some(EVENT_BUDGET);
        let done = self
            .store
            .enqueue(&raw, update, MAX_QUEUED, budget)
            .map_err(|e| Refused::Unavailable(format!("this write cannot be queued: {e}")))?;
        Ok((code, item, done))
    }
}

impl Cache {
    /// Counts a write queued offline; says so at INFO at most every 30 s, and every time
    /// older events had to be dropped for it.
    fn note_queued(&self, done: store::Enqueued, behind_replay: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let accepted = self.stats.offline_accepted.fetch_add(1, Relaxed) + 1;
        if done.dropped > 0 {
            self.stats.replay_dropped.fetch_add(done.dropped, Relaxed);
            tracing::warn!(
                dropped = done.dropped,
                queued = done.queued,
                "offline: the event budget ({} events, {} bytes) is full; dropped the oldest queued events",
                EVENT_BUDGET.count,
                EVENT_BUDGET.bytes
            );
        }
        let mut last = self
            .stats
            .queued_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= QUEUED_LOG_EVERY) {
            *last = Some(std::time::Instant::now());
            if behind_replay {
                tracing::info!(
                    queued = done.queued,
                    accepted_so_far = accepted,
                    "the cloud is back; node writes wait behind the replay of earlier ones"
                );
            } else {
                tracing::info!(
                    queued = done.queued,
                    accepted_so_far = accepted,
                    "offline: the cloud is unreachable; node writes are queued for replay"
                );
            }
        }
    }
}

impl Cache {
    /// Drops the queued writes `method path` makes pointless (same method, same object);
    /// they are counted, never sent. Returns how many.
    pub fn supersede_queued(&self, method: &str, path_and_query: &str) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let path = path_and_query.split('?').next().unwrap_or_default();
        let same = |_: u64, raw: &[u8]| {
            let q = serde_json::from_slice::<Queued>(raw).ok()?;
            (q.method == method && q.path_and_query.split('?').next() == Some(path))
                .then(|| q.live.map(String::into_bytes))
        };
        match self.store.remove_queued_where(same) {
            Ok((rows, entries)) => {
                // A live entry's row stood for every write folded into it.
                let folded: u64 = entries
                    .iter()
                    .filter_map(|b| Entry::decode(b))
                    .map(|e| e.writes.saturating_sub(1))
                    .sum();
                let n = rows + folded;
                self.stats.superseded.fetch_add(n, Relaxed);
                if n > 0 {
                    tracing::debug!(
                        superseded = n,
                        "{method} {path}: older queued writes dropped"
                    );
                }
                n
            }
            Err(e) => {
                self.stats.error(format!("outbox: {e}"));
                0
            }
        }
    }

    /// The cloud's answer to a replayed write is the object's state now: it replaces what
    /// the offline answer put in the cache (as the answer to the live write would have).
    fn keep_replay_answer(&self, q: &Queued, content_type: &str, answer: Bytes) {
        let info = q.request_info();
        let Some(encoding) = Encoding::of_content_type(content_type) else {
            return;
        };
        if answer.is_empty() || !super::keeps_written(&info) {
            return;
        }
        let target = super::writer::Target {
            credential: "node".into(),
            component: q.component.clone(),
            gvr: info.gvr(),
            resource: info.resource.clone(),
            encoding,
            kind: super::writer::TargetKind::Object,
        };
        self.writer.send_whole(target, vec![answer], false);
    }
}

/// What happened to one replayed write.
enum Replay {
    /// Accepted: the cloud's answer (its Content-Type and body).
    Done(String, Bytes),
    /// Not accepted by the cloud for a reason retrying will not change.
    Dropped(String),
    /// The cloud is not answering (yet): keep it and the writes after it.
    Later,
    /// The cloud refused it for a reason that may pass: try again, for a while.
    Refused(String),
}

/// One answer from the cloud: status, Content-Type and body.
type Answer = (StatusCode, String, Bytes);

async fn send(cloud: &Cloud, q: &Queued, body: Bytes, method: &Method) -> Option<Answer> {
    let ua = format!("{}/offline-replay (hub)", q.component);
    // The answer in the encoding the client wrote in: the copy it replaces is in it too.
    let accept = match q.accept.as_deref().map_or(
        Encoding::of_content_type(&q.content_type),
        Encoding::of_content_type,
    ) {
        Some(Encoding::Protobuf) => "application/vnd.kubernetes.protobuf, application/json",
        _ => "application/json",
    };
    let (resp, _) = cloud
        .send(AsWho::Node, |server| {
            Request::builder()
                .method(method.clone())
                .uri(server.uri(q.path_and_query.parse().ok()?))
                .header(header::CONTENT_TYPE, &q.content_type)
                .header(header::ACCEPT, accept)
                .header(header::USER_AGENT, &ua)
                .body(body.clone())
                .ok()
        })
        .await
        .ok()?;
    let code = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = resp.headers().contains_key(header::CONTENT_ENCODING);
    let answer = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .ok()?
        .to_bytes();
    // A compressed answer is not read (only large ones are compressed).
    let answer = if gzip { Bytes::new() } else { answer };
    Some((code, content_type, answer))
}

/// The body with `metadata.resourceVersion` set to `rv` (JSON or enveloped protobuf).
fn with_rv(content_type: &str, body: &[u8], rv: &str) -> Option<Vec<u8>> {
    match Encoding::of_content_type(content_type)? {
        Encoding::Json => objects::with_resource_version(Encoding::Json, body, rv),
        Encoding::Protobuf => {
            let u = kproto::unwrap(body)?;
            let raw = objects::with_resource_version(Encoding::Protobuf, u.raw, rv)?;
            Some(kproto::envelope(&u.api_version, &u.kind, &raw))
        }
    }
}

/// A Status answer's message, in JSON or protobuf (Status.message is field 3).
fn message(answer: &[u8]) -> String {
    if let Some(u) = kproto::unwrap(answer) {
        return kproto::fields(u.raw)
            .map(|f| kproto::text(&f, 3))
            .unwrap_or_default();
    }
    serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v["message"].as_str().map(String::from))
        .unwrap_or_default()
}

async fn replay(cloud: &Cloud, q: &Queued) -> Replay {
    let Ok(body) = base64::engine::general_purpose::STANDARD.decode(&q.body) else {
        return Replay::Dropped("unreadable queued body".into());
    };
    let Ok(method) = q.method.parse::<Method>() else {
        return Replay::Dropped(format!("bad method {}", q.method));
    };
    let Some((code, content_type, answer)) = send(cloud, q, body.clone().into(), &method).await
    else {
        return Replay::Later;
    };
    if code.is_success() {
        return Replay::Done(content_type, answer);
    }
    if code == StatusCode::CONFLICT && method == Method::PUT {
        // Someone else wrote the object meanwhile: take its current resourceVersion and
        // write ours over it once.
        let path = q.path_and_query.split('?').next().unwrap_or_default();
        let get = Queued {
            method: "GET".into(),
            path_and_query: path.to_string(),
            content_type: "application/json".into(),
            component: q.component.clone(),
            body: String::new(),
            live: None,
            accept: None,
        };
        let Some((StatusCode::OK, _, current)) =
            send(cloud, &get, Bytes::new(), &Method::GET).await
        else {
            return Replay::Later;
        };
        let rv = serde_json::from_slice::<Value>(&current)
            .ok()
            .and_then(|v| v["metadata"]["resourceVersion"].as_str().map(String::from));
        let Some(retry) = rv.and_then(|rv| with_rv(&q.content_type, &body, &rv)) else {
            return Replay::Dropped("conflict, and the current object could not be read".into());
        };
        return match send(cloud, q, retry.into(), &method).await {
            Some((c, ct, a)) if c.is_success() => Replay::Done(ct, a),
            Some((c, _, a)) => Replay::Dropped(format!(
                "conflict retried, cloud answered {c}: {}",
                message(&a)
            )),
            None => Replay::Later,
        };
    }
    if transient(code) {
        return Replay::Refused(format!("cloud answered {code}: {}", message(&answer)));
    }
    Replay::Dropped(format!("cloud answered {code}: {}", message(&answer)))
}

/// The request that replays live entry `e` (its row `row`): its net write, answered in
/// the encoding the node's copy is held in; None when its writes cancel out.
fn net_request(row: &Queued, e: &Entry) -> Option<Queued> {
    let (method, content_type, body) = e.net_write()?;
    Some(Queued {
        method: method.to_string(),
        path_and_query: e.path.clone(),
        content_type: content_type.to_string(),
        component: row.component.clone(),
        body: base64::engine::general_purpose::STANDARD.encode(body),
        live: None,
        accept: Some(e.encoding.content_type().to_string()),
    })
}

/// After a live entry's row was replayed (`sent`: the entry as it was sent, None when it
/// was dropped): the row and the entry go, unless writes came in meanwhile — then the
/// entry stays, now based on what was sent, and its row replays the rest.
async fn settle(cache: &Arc<Cache>, seq: u64, key: Option<&[u8]>, sent: Option<&Entry>) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(key) = key.map(<[u8]>::to_vec) else {
        return;
    };
    if let Some(s) = sent {
        cache
            .stats
            .superseded
            .fetch_add(s.writes.saturating_sub(1), Relaxed);
    }
    let sent = sent.cloned();
    let store = cache.store.clone();
    let done = tokio::task::spawn_blocking(move || {
        store.settle_live(seq, &key, |held| {
            let now = held.as_deref().and_then(Entry::decode)?;
            let sent = sent?;
            if now.writes == sent.writes {
                return None;
            }
            Some(now.after_sent(sent).encode())
        })
    })
    .await;
    if let Ok(Err(e)) = done {
        cache.stats.error(format!("outbox: {e}"));
    }
}

/// Refusals that pass: a freshly started apiserver answers 403 until its authorizer has
/// loaded RBAC, 401 until its authenticators are up, 429 and 5xx under load.
fn transient(code: StatusCode) -> bool {
    matches!(
        code,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    ) || code.is_server_error()
}

/// The write at the head of the queue that the cloud refused for a reason that may pass.
struct Retrying {
    seq: u64,
    /// Time spent waiting on it so far; past `REPLAY_PATIENCE` it is dropped.
    waited: Duration,
    backoff: Duration,
}

/// How often queued events are checked against the event TTL (and always once before
/// the replay starts).
const EXPIRY_EVERY: Duration = Duration::from_secs(30);

impl Cache {
    /// Drops the queued events whose last sighting is older than `ttl` (entry and row);
    /// returns how many.
    fn drop_expired_events(&self, ttl: Duration) -> Result<u64, store::StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = store::now();
        let mut expired = std::collections::HashSet::new();
        for gvr in ["/v1/events", "events.k8s.io/v1/events"] {
            for e in live::state::held(&self.store, gvr, None, None)? {
                if e.expired_event(now, ttl.as_secs()) {
                    expired.insert(String::from_utf8_lossy(&e.key()).into_owned());
                }
            }
        }
        if expired.is_empty() {
            return Ok(0);
        }
        let (rows, _) = self.store.remove_queued_where(|_, raw| {
            let key = serde_json::from_slice::<Queued>(raw).ok()?.live?;
            expired.contains(&key).then(|| Some(key.into_bytes()))
        })?;
        self.stats.expired.fetch_add(rows, Relaxed);
        tracing::info!(
            expired = rows,
            ttl_s = ttl.as_secs(),
            "offline: queued events older than the event TTL dropped"
        );
        Ok(rows)
    }
}

/// Replays queued writes in order whenever the cloud is healthy, until `stop`; events
/// older than `event_ttl` are dropped rather than sent.
pub async fn replay_forever(
    cache: Arc<Cache>,
    cloud: Arc<Cloud>,
    event_ttl: Duration,
    mut stop: watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut expiry_checked: Option<std::time::Instant> = None;
    let mut retrying: Option<Retrying> = None;
    // Counts since the queue was last empty, for the "replay done" line.
    let (mut replayed, mut dropped) = (0u64, 0u64);
    // Since when the cloud has been healthy, as the replayer last saw it.
    let mut back_since: Option<std::time::Instant> = None;
    loop {
        let pause = retrying.as_ref().map_or(REPLAY_EVERY, |r| r.backoff);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let just_back = cloud.healthy() && back_since.is_none();
        if just_back || expiry_checked.is_none_or(|t| t.elapsed() >= EXPIRY_EVERY) {
            expiry_checked = Some(std::time::Instant::now());
            let c = cache.clone();
            if let Ok(Err(e)) =
                tokio::task::spawn_blocking(move || c.drop_expired_events(event_ttl)).await
            {
                cache.stats.error(format!("outbox: {e}"));
            }
        }
        if !cloud.healthy() {
            back_since = None;
            continue;
        }
        let back = *back_since.get_or_insert_with(std::time::Instant::now);
        // A queued lease renewal or node status waits a moment for the client's own next
        // one, which would find the cloud's object changed under it if this went first.
        let waiting_for_newer =
            |q: &Queued| back.elapsed() < SUPERSEDE_GRACE && supersedable(&q.request_info());
        let store = cache.store.clone();
        let Ok(Ok(batch)) = tokio::task::spawn_blocking(move || store.queued(64)).await else {
            continue;
        };
        if batch.is_empty() && replayed + dropped > 0 {
            tracing::info!(
                replayed,
                dropped,
                "offline: replay done; the queue is empty"
            );
            (replayed, dropped) = (0, 0);
        }
        for (seq, raw) in batch {
            let mut sent: Option<Entry> = None;
            let mut live_key: Option<Vec<u8>> = None;
            let outcome = match serde_json::from_slice::<Queued>(&raw) {
                Ok(q) if waiting_for_newer(&q) => continue,
                Ok(row) => {
                    // A live entry's row is replayed by the entry's net write, made now.
                    let q = match row.live.as_deref() {
                        None => Some(row.clone()),
                        Some(key) => {
                            live_key = Some(key.as_bytes().to_vec());
                            let store = cache.store.clone();
                            let k = key.as_bytes().to_vec();
                            sent = tokio::task::spawn_blocking(move || store.live(&k))
                                .await
                                .ok()
                                .and_then(Result::ok)
                                .flatten()
                                .and_then(|b| Entry::decode(&b));
                            sent.as_ref().and_then(|e| net_request(&row, e))
                        }
                    };
                    let Some(q) = q else {
                        // Its writes cancel out (or it is gone): nothing to send.
                        settle(&cache, seq, live_key.as_deref(), sent.as_ref()).await;
                        continue;
                    };
                    let mut r = replay(&cloud, &q).await;
                    if let Replay::Refused(why) | Replay::Dropped(why) = &r {
                        let tried = retrying.as_mut().filter(|t| t.seq == seq);
                        match (&r, tried) {
                            (Replay::Refused(_), Some(t)) if t.waited >= REPLAY_PATIENCE => {
                                r = Replay::Dropped(format!(
                                    "{why} (still refused after {} s)",
                                    t.waited.as_secs()
                                ));
                            }
                            (Replay::Refused(_), Some(t)) => {
                                t.waited += t.backoff;
                                t.backoff = (t.backoff * 2).min(REPLAY_BACKOFF_MAX);
                            }
                            (Replay::Refused(_), None) => {
                                tracing::info!(
                                    "offline: replay of {} {} refused, retrying for up to {} s: {why}",
                                    q.method,
                                    q.path_and_query,
                                    REPLAY_PATIENCE.as_secs()
                                );
                                retrying = Some(Retrying {
                                    seq,
                                    waited: REPLAY_EVERY,
                                    backoff: REPLAY_EVERY,
                                });
                            }
                            _ => {}
                        }
                    }
                    match &r {
                        Replay::Dropped(why) => cache.stats.error(format!(
                            "offline write {} {} dropped: {why}",
                            q.method, q.path_and_query
                        )),
                        Replay::Done(content_type, answer) => {
                            cache.keep_replay_answer(&q, content_type, answer.clone())
                        }
                        _ => {}
                    }
                    r
                }
                Err(e) => Replay::Dropped(format!("unreadable queued write: {e}")),
            };
            match outcome {
                Replay::Later | Replay::Refused(_) => break,
                Replay::Done(..) => {
                    replayed += 1;
                    cache.stats.replayed.fetch_add(1, Relaxed)
                }
                Replay::Dropped(_) => {
                    dropped += 1;
                    // What the entry held is gone with it: nothing is served from it.
                    sent = None;
                    cache.stats.replay_dropped.fetch_add(1, Relaxed)
                }
            };
            retrying = None;
            if live_key.is_some() {
                settle(&cache, seq, live_key.as_deref(), sent.as_ref()).await;
                continue;
            }
            let store = cache.store.clone();
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.dequeue(seq)).await {
                cache.stats.error(format!("outbox: {e}"));
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::Method;

    use super::*;

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::parse(&method, path, "")
    }

    #[test]
    fn only_a_node_s_own_writes_are_replayable() {
        for (m, p) in [
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            ),
            (Method::PATCH, "/api/v1/nodes/n1/status"),
            (Method::PATCH, "/api/v1/namespaces/d/pods/p/status"),
            (Method::POST, "/api/v1/namespaces/d/events"),
            (Method::PATCH, "/api/v1/namespaces/d/events/e1"),
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/d/events"),
        ] {
            assert!(replayable(&info(m.clone(), p)), "{m} {p}");
        }
        for (m, p) in [
            (Method::POST, "/api/v1/namespaces/d/configmaps"),
            (Method::PATCH, "/api/v1/namespaces/d/pods/p"),
            (Method::DELETE, "/api/v1/namespaces/d/pods/p"),
            (Method::POST, "/api/v1/namespaces/d/pods/p/eviction"),
            (Method::GET, "/api/v1/nodes/n1/status"),
        ] {
            assert!(!replayable(&info(m.clone(), p)), "{m} {p}");
        }
    }

    #[test]
    fn conflicts_retry_with_the_current_resource_version() {
        let b = with_rv(
            "application/json",
            br#"{"metadata":{"name":"l","resourceVersion":"5"}}"#,
            "9",
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "9");
        let obj = kproto::meta_only_object("l", "ns", "5", &[]);
        let env = kproto::envelope("coordination.k8s.io/v1", "Lease", &obj);
        let b = with_rv("application/vnd.kubernetes.protobuf", &env, "12").unwrap();
        let u = kproto::unwrap(&b).unwrap();
        let meta = kproto::object_meta(u.raw).unwrap();
        assert_eq!(
            (meta.name.as_str(), meta.resource_version.as_str()),
            ("l", "12")
        );
        assert_eq!(u.kind, "Lease");
    }
}
