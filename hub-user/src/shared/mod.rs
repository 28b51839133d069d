//! The node-level watch cache: for each resource in `cache.sharedResources`, the hub holds
//! one cloud list+watch for the whole node (as the node, across all namespaces) and
//! answers every client's LIST and watch of it from that one set — any label or field
//! selector, either encoding — with kube-apiserver's resourceVersion semantics. The cloud
//! then pays for a node once instead of once per client.
//!
//! Authorization stays the cloud's (`authz`): a client is answered from the set only while
//! the cloud has lately answered that client's own credential for the same verb and scope;
//! otherwise its request first goes to the cloud as a check: a one-item list, its streamed
//! list narrowed to no object, or its watch closed once the cloud's answer has begun. The
//! first two also keep reads consistent: a LIST or streamed list without a
//! resourceVersion is checked every time, and answered only once the set has passed the
//! resourceVersion the check stood at (`sync::probe` shows the cloud's progress).
//!
//! A GET at any resourceVersion (`resourceVersion=0`, as kube-apiserver answers from its
//! watch cache) of an object a current set holds is answered from the set, once the cloud
//! has lately answered the same credential's GET of that object; other GETs are the
//! cloud's (a GET at the newest state costs the cloud no more than a check would).
//!
//! A list in pages is paged as kube-apiserver pages it, with its continue tokens: the next
//! page is read from the set as it stood at the token's resourceVersion (its recent
//! changes undone), so pages continue across the hub and the cloud either way.
//!
//! What the set cannot answer truthfully goes to the cloud as before: an exact
//! resourceVersion, a next page older than the changes the set keeps, a set not current
//! (the cloud's watch broke, or the cloud refuses the node this resource). Offline, the set
//! is not used: the node's cache answers each credential what the cloud gave it.
pub mod authz;
pub mod set;
mod sync;
pub mod watch;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Request, Response, StatusCode, header};

use self::{
    authz::{Memo, Scope},
    set::{Set, Snapshot, State},
    watch::Start,
};
use crate::{
    body::ProxyBody,
    cache::{
        objects::{self, Encoding},
        paging,
        serve::{accepted, answer_from, param, selector},
    },
    coordinator::leader::api_path,
    proxy::{
        Asked, Refusal,
        forward::forward_parts,
        request::{RequestInfo, percent_encode},
    },
    upstream::Cloud,
};

/// How long a read waits for the set to reach the resourceVersion it must reflect (a
/// progress probe shows it within about 3 s) before the cloud is asked instead.
const FRESH_WAIT: Duration = Duration::from_secs(6);
/// The largest answer to a one-item list read for its resourceVersion.
const MAX_CHECK_ANSWER: usize = 1024 * 1024;
/// How long a check's streamed list may take to reach its end bookmark.
const CHECK_LIMIT: Duration = Duration::from_secs(5);
/// A field selector term no object matches: names never hold a `/`.
const NO_OBJECT: &str = "metadata.name=hub/no-object";

/// What the node-level watch cache has done, for `hub status` and the metrics.
#[derive(Debug, Default)]
pub struct Counts {
    pub lists: AtomicU64,
    pub gets: AtomicU64,
    pub watches: AtomicU64,
    /// One-item lists and opened watches sent to learn a credential's authorization or
    /// the cloud's resourceVersion.
    pub checks: AtomicU64,
    /// Reads left to the cloud: the set could not answer them truthfully.
    pub passed: AtomicU64,
    /// Why the latest of them was.
    pub last_passed: Mutex<String>,
}

/// What `hub status` shows of the node-level watch cache.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Status {
    pub sets: Vec<set::Summary>,
    pub lists_served: u64,
    #[serde(default)]
    pub gets_served: u64,
    pub watches_served: u64,
    pub checks: u64,
    pub passed_to_cloud: u64,
    /// Why the latest read passed to the cloud was (empty before any).
    #[serde(default)]
    pub last_passed: String,
    pub credentials_allowed: usize,
}

pub struct Shared {
    cloud: Arc<Cloud>,
    /// Resources shared (`/v1/services`, `discovery.k8s.io/v1/endpointslices`).
    resources: Vec<String>,
    memo: Memo,
    sets: Mutex<HashMap<String, Arc<Set>>>,
    stop: tokio::sync::watch::Receiver<bool>,
    pub counts: Counts,
}

/// The resourceVersion a read must reflect.
enum Fresh {
    /// Any: the set as it is (resourceVersion 0).
    Any,
    /// At least this one (resourceVersionMatch=NotOlderThan, or a resumed watch).
    NotOlderThan(u64),
    /// The cloud's current one (no resourceVersion: a consistent read).
    Current,
    /// Exactly this one: the next page of a list read there (its continue token).
    Page(u64),
}

impl Shared {
    pub fn new(
        cloud: Arc<Cloud>,
        resources: Vec<String>,
        authorization: Duration,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Shared {
        Shared {
            cloud,
            resources,
            memo: Memo::new(authorization),
            sets: Mutex::new(HashMap::new()),
            stop,
            counts: Counts::default(),
        }
    }

    /// A collection LIST or watch, or a GET of one object, of a shared resource.
    pub fn covers(&self, info: &RequestInfo) -> bool {
        let read = match info.verb {
            "list" | "watch" => info.name.is_empty(),
            "get" => !info.name.is_empty(),
            _ => false,
        };
        read && info.is_resource
            && info.subresource.is_empty()
            && self.resources.iter().any(|g| info.gvr_is(g))
    }

    /// The set of `info`'s resource; the first ask starts its sync.
    fn set(&self, info: &RequestInfo) -> Option<Arc<Set>> {
        let gvr = info.gvr();
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sets.get(&gvr) {
            return Some(s.clone());
        }
        let path = api_path(&gvr)?;
        let set = Arc::new(Set::new(&gvr, &info.resource));
        sets.insert(gvr, set.clone());
        let (cloud, stop) = (self.cloud.clone(), self.stop.clone());
        tokio::spawn(sync::probe_when_wanted(
            set.clone(),
            cloud.clone(),
            path.clone(),
            stop.clone(),
        ));
        tokio::spawn(sync::run(set.clone(), cloud, path, stop));
        Some(set)
    }

    fn scope(&self, asked: &Asked<'_>, verb: &'static str) -> Scope {
        Scope {
            credential: (asked.credential)(),
            verb,
            gvr: asked.info.gvr(),
            namespace: asked.info.namespace.clone(),
            name: asked.info.name.clone(),
            label_selector: param(asked.query, "labelSelector"),
            field_selector: param(asked.query, "fieldSelector"),
        }
    }

    /// Learns from the cloud's answer to a request it was sent: 2xx allows the scope for a
    /// while, 401/403 forgets it.
    pub fn learn(&self, asked: &Asked<'_>, status: StatusCode) {
        if !self.covers(asked.info) {
            return;
        }
        let scope = self.scope(asked, asked.info.verb);
        if status.is_success() {
            self.memo.allowed(scope);
        } else if matches!(status.as_u16(), 401 | 403) {
            self.memo.refused(&scope);
        }
    }

    /// Answers a LIST or watch from the shared set, or says why the cloud must.
    pub async fn serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal> {
        let answer = self.try_serve(asked).await;
        let counter = match (&answer, asked.info.verb) {
            (Ok(_), "watch") => &self.counts.watches,
            (Ok(_), "get") => &self.counts.gets,
            (Ok(_), _) => &self.counts.lists,
            (Err(Refusal::Unable(why)), _) => {
                *self
                    .counts
                    .last_passed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = why.clone();
                &self.counts.passed
            }
            (Err(Refusal::Final(_)), _) => return answer,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answer
    }

    async fn try_serve(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, Refusal> {
        let (info, query) = (asked.info, asked.query);
        if info.verb == "get" {
            return self.get(asked).map_err(Refusal::from);
        }
        if param(query, "resourceVersionMatch") == "Exact" {
            return Err("an exact resourceVersion is the cloud's".to_string().into());
        }
        // Tables (kubectl get) and other forms the set does not hold: the cloud's, before
        // any check is sent.
        if accepted(asked.accept).is_empty() {
            return Err(format!("the client accepts only {:?}", asked.accept).into());
        }
        // A selector the hub cannot evaluate: the cloud says what is wrong with it.
        if !matches!(selector(info, query), Ok(Ok(_))) {
            return Err("a selector the hub does not evaluate".to_string().into());
        }
        let Some(set) = self.set(info) else {
            return Err(format!("{} has no API path", info.gvr()).into());
        };
        match set.state() {
            State::Current => {}
            // After a cut, the set's watch and its clients' come back together: a client
            // waits for the set rather than going to the cloud (while the cloud answers).
            State::Filling | State::Resuming(_)
                if self.cloud.healthy() && set.current_within(FRESH_WAIT).await => {}
            State::Filling => {
                return Err(format!(
                    "the node-level set was not listed within {} s",
                    FRESH_WAIT.as_secs()
                )
                .into());
            }
            State::Resuming(why) | State::Broken(why) => {
                return Err(format!("the node-level set: {why}").into());
            }
        }
        let watch = info.verb == "watch";
        let rv = param(query, "resourceVersion");
        let fresh = match (param(query, "continue").as_str(), rv.as_str()) {
            ("", "") => Fresh::Current,
            ("", "0") => Fresh::Any,
            ("", n) => Fresh::NotOlderThan(
                n.parse()
                    .map_err(|_| Refusal::Unable(format!("resourceVersion {n:?}")))?,
            ),
            // The cloud says what is wrong with a token it would not take.
            (token, "") if !watch => match paging::decode(token).map(|page| page.rv) {
                Some(Some(rv)) => Fresh::Page(rv),
                Some(None) => {
                    return Err("a next page at the cloud's newest state".to_string().into());
                }
                None => return Err("a continue token kube-apiserver refuses".to_string().into()),
            },
            _ => {
                return Err("a continue with a resourceVersion, or on a watch"
                    .to_string()
                    .into());
            }
        };
        let start = match (&fresh, param(query, "sendInitialEvents") == "true") {
            (Fresh::NotOlderThan(n), false) => Start::After(*n),
            _ => Start::Initial,
        };
        let reach = self.authorized(asked, &set, watch, &fresh).await?;
        if reach > set.rv() && !set.reaches(reach, FRESH_WAIT).await {
            return Err(format!(
                "the node-level set stands at {} and did not reach resourceVersion {reach} within {} s",
                set.rv(),
                FRESH_WAIT.as_secs()
            )
            .into());
        }
        if watch {
            let (cloud, kept) = (self.cloud.clone(), set.clone());
            let keep_open = move || cloud.healthy() && kept.state() == State::Current;
            return Ok(watch::serve(
                &set,
                info,
                query,
                asked.accept,
                start,
                Arc::new(keep_open),
            )?);
        }
        let snapshot = match fresh {
            Fresh::Page(rv) => set.snapshot_at(rv).map_err(|too_old| {
                format!(
                    "the next page is read at resourceVersion {rv}; the node-level set keeps changes from {} on",
                    too_old.oldest
                )
            })?,
            _ => set.snapshot().0,
        };
        Ok(list(snapshot, asked)?)
    }

    /// A GET at any resourceVersion from a current set, for a credential the cloud lately
    /// answered the same GET. It never starts a set, nor sends a check: the GET itself
    /// goes to the cloud instead, and its answer renews the memo (`learn`). An object the
    /// set does not hold is the cloud's to answer (it may be newer than the set).
    fn get(&self, asked: &Asked<'_>) -> Result<Response<ProxyBody>, String> {
        let info = asked.info;
        if param(asked.query, "resourceVersion") != "0" {
            return Err("a GET at the newest state is the cloud's".into());
        }
        let set = self
            .sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&info.gvr())
            .cloned()
            .filter(|s| s.state() == State::Current)
            .ok_or_else(|| format!("no current node-level set of {}", info.gvr()))?;
        if !self.memo.allows(&self.scope(asked, "get")) {
            return Err("the cloud has not lately answered this credential's GET of it".into());
        }
        object(&set, info, asked.query, asked.accept)
    }

    /// Whether the cloud lets this credential read this scope (the memo, or the client's own
    /// request sent as a check), and the resourceVersion the answer must reflect.
    async fn authorized(
        &self,
        asked: &Asked<'_>,
        set: &Set,
        watch: bool,
        fresh: &Fresh,
    ) -> Result<u64, Refusal> {
        let floor = match fresh {
            Fresh::NotOlderThan(n) | Fresh::Page(n) => *n,
            _ => 0,
        };
        let scope = self.scope(asked, if watch { "watch" } else { "list" });
        let checked = match (watch, fresh) {
            // The client's own streamed list, narrowed to no object: its authorization to
            // watch, and the cloud's resourceVersion now.
            (true, Fresh::Current) => Some(self.check_watch_list(asked).await),
            (true, _) if !self.memo.allows(&scope) => {
                Some(self.check_watch(asked, set.rv()).await.map(|()| 0))
            }
            // The client's own list of one item: its authorization to list, and the
            // cloud's resourceVersion now.
            (false, Fresh::Current) => Some(self.check_list(asked).await),
            (false, _) if !self.memo.allows(&scope) => {
                Some(self.check_list(asked).await.map(|_| 0))
            }
            _ => None,
        };
        match checked {
            None => Ok(floor),
            Some(Ok(rv)) => {
                self.memo.allowed(scope);
                Ok(floor.max(rv))
            }
            Some(Err(refusal)) => {
                if matches!(refusal, Refusal::Final(_)) {
                    self.memo.refused(&scope);
                }
                Err(refusal)
            }
        }
    }

    /// Sends the client's request (its credential, its selectors) to the cloud as `query`
    /// on the same path; the cloud's answer.
    async fn ask_cloud(
        &self,
        asked: &Asked<'_>,
        query: &str,
        accept: Option<&'static str>,
    ) -> Result<Response<ProxyBody>, Refusal> {
        self.counts.checks.fetch_add(1, Ordering::Relaxed);
        let headers = {
            let held = asked.request.lock().unwrap_or_else(|p| p.into_inner());
            let Some(req) = held.as_ref() else {
                return Err("the request was already sent".to_string().into());
            };
            req.headers().clone()
        };
        let mut check = Request::builder()
            .method("GET")
            .uri(format!("{}?{query}", asked.path))
            .body(())
            .map_err(|e| Refusal::Unable(e.to_string()))?;
        *check.headers_mut() = headers;
        check.headers_mut().remove(header::ACCEPT_ENCODING);
        if let Some(a) = accept {
            check
                .headers_mut()
                .insert(header::ACCEPT, header::HeaderValue::from_static(a));
        }
        let (parts, ()) = check.into_parts();
        let answer = forward_parts(&self.cloud, &parts, Bytes::new(), asked.who)
            .await
            .map_err(|e| Refusal::Unable(e.to_string()))?;
        let resp = answer.response;
        match resp.status().as_u16() {
            200 => Ok(resp),
            401 | 403 => Err(Refusal::Final(resp)),
            code => Err(format!("the cloud answered {code} to the check").into()),
        }
    }

    /// The client's own list of one item: whether the cloud lets it list this scope, and
    /// the resourceVersion the cloud stands at.
    async fn check_list(&self, asked: &Asked<'_>) -> Result<u64, Refusal> {
        let query = selectors_of(asked.query, "limit=1");
        let resp = self
            .ask_cloud(asked, &query, Some("application/json"))
            .await?;
        let body = http_body_util::Limited::new(resp.into_body(), MAX_CHECK_ANSWER)
            .collect()
            .await
            .map_err(|e| Refusal::Unable(format!("reading the check's answer: {e}")))?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|_| Refusal::Unable("the check's answer is not JSON".into()))?;
        v["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .ok_or_else(|| Refusal::Unable("the check's answer has no resourceVersion".into()))
    }

    /// The client's own streamed list narrowed to no object (its field selector and a
    /// name no object can have): whether the cloud lets it watch this scope, and the
    /// resourceVersion of the initial-events-end bookmark, which kube-apiserver sends at
    /// its current one.
    async fn check_watch_list(&self, asked: &Asked<'_>) -> Result<u64, Refusal> {
        let mut fields = param(asked.query, "fieldSelector");
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str(NO_OBJECT);
        let mut query = format!(
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=10&fieldSelector={}",
            percent_encode(&fields)
        );
        let labels = param(asked.query, "labelSelector");
        if !labels.is_empty() {
            query.push_str(&format!("&labelSelector={}", percent_encode(&labels)));
        }
        let resp = self
            .ask_cloud(asked, &query, Some("application/json"))
            .await?;
        let end = async {
            let mut body = resp.into_body();
            let mut buf = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() else {
                    continue;
                };
                buf.extend_from_slice(&data);
                if buf.len() > MAX_CHECK_ANSWER {
                    return Err("an answer over the size limit".to_string());
                }
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    if let Some(rv) = end_of_nothing(&line)? {
                        return Ok(rv);
                    }
                }
            }
            Err("the streamed list ended before its end bookmark".to_string())
        };
        match tokio::time::timeout(CHECK_LIMIT, end).await {
            Ok(Ok(rv)) => Ok(rv),
            Ok(Err(why)) => Err(format!("the check: {why}").into()),
            Err(_) => Err(format!(
                "the check's streamed list did not end within {} s",
                CHECK_LIMIT.as_secs()
            )
            .into()),
        }
    }

    /// The client's own watch, closed as soon as the cloud's answer begins: whether the
    /// cloud lets it watch this scope.
    async fn check_watch(&self, asked: &Asked<'_>, from: u64) -> Result<(), Refusal> {
        let query = selectors_of(
            asked.query,
            &format!("watch=1&resourceVersion={from}&timeoutSeconds=1"),
        );
        // Dropping the answer resets the stream: nothing but its head crosses the link.
        self.ask_cloud(asked, &query, None).await.map(drop)
    }

    pub fn status(&self) -> Status {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let mut summaries: Vec<_> = sets.values().map(|s| s.summary()).collect();
        summaries.sort_by(|a, b| a.gvr.cmp(&b.gvr));
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Status {
            sets: summaries,
            lists_served: n(&self.counts.lists),
            gets_served: n(&self.counts.gets),
            watches_served: n(&self.counts.watches),
            checks: n(&self.counts.checks),
            passed_to_cloud: n(&self.counts.passed),
            last_passed: self
                .counts
                .last_passed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            credentials_allowed: self.memo.len(),
        }
    }
}

/// A GET of one object from the set, in the client's encoding, as kube-apiserver answers
/// it from its watch cache; an error when the set does not hold it.
pub fn object(
    set: &Set,
    info: &RequestInfo,
    query: &str,
    accept: &str,
) -> Result<Response<ProxyBody>, String> {
    let (item, rv) = set.get(&info.namespace, &info.name);
    let item = item.ok_or_else(|| format!("the node-level set holds no {}", info.name))?;
    answer_from("", vec![(*item).clone()], rv, info, query, accept)
}

/// A LIST from the set: its items in the request's namespace, in pages when the client
/// asks for them (kube-apiserver's continue tokens, read at the snapshot's resourceVersion).
fn list(snapshot: Snapshot, asked: &Asked<'_>) -> Result<Response<ProxyBody>, String> {
    let info = asked.info;
    let items: Vec<_> = snapshot
        .items
        .iter()
        .filter(|i| info.namespace.is_empty() || i.namespace == info.namespace)
        .map(|i| (**i).clone())
        .collect();
    answer_from("", items, snapshot.rv, info, asked.query, asked.accept)
}

/// One event of a streamed list of no object: the end bookmark's resourceVersion, None for
/// another bookmark, an error for anything else (an object: the check was not narrowed).
fn end_of_nothing(line: &[u8]) -> Result<Option<u64>, String> {
    match objects::bookmark(Encoding::Json, line) {
        Some(b) if b.initial_events_end => Ok(Some(b.rv)),
        Some(_) => Ok(None),
        None => Err("an object in a streamed list of none".to_string()),
    }
}

/// `extra` with the query's selectors (the scope the cloud authorizes).
fn selectors_of(query: &str, extra: &str) -> String {
    let mut q = extra.to_string();
    for name in ["labelSelector", "fieldSelector"] {
        let v = param(query, name);
        if !v.is_empty() {
            q.push_str(&format!("&{name}={}", percent_encode(&v)));
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_carry_the_scope_and_nothing_else() {
        let q = "allowWatchBookmarks=true&fieldSelector=spec.clusterIP%21%3DNone&labelSelector=%21service.kubernetes.io%2Fservice-proxy-name&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=538&watch=true";
        assert_eq!(
            selectors_of(q, "limit=1"),
            "limit=1&labelSelector=%21service.kubernetes.io%2Fservice-proxy-name&fieldSelector=spec.clusterIP%21%3DNone"
        );
        assert_eq!(selectors_of("resourceVersion=0", "limit=1"), "limit=1");
    }

    /// kube-apiserver 1.36's answer to kube-proxy's streamed list narrowed to no object.
    #[test]
    fn the_recorded_streamed_list_of_no_object_gives_the_cloud_s_resource_version() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/watch-cache-1.36/streamed-list-of-no-object"
        );
        let body = std::fs::read(format!("{dir}/response.body")).unwrap();
        let request = std::fs::read_to_string(format!("{dir}/request.json")).unwrap();
        assert!(
            request.contains("metadata.name%3Dhub%2Fno-object"),
            "{request}"
        );
        let lines: Vec<&[u8]> = body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), 1);
        assert_eq!(end_of_nothing(lines[0]), Ok(Some(4286)));
        let object = br#"{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"5"}}}"#;
        assert!(end_of_nothing(object).is_err());
    }
}
