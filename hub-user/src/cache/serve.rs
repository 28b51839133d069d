//! Answers from the cache (the local route of design.md §5): get, list with any selector and
//! limit/continue, watch that stays open with bookmarks until the cloud is back, discovery
//! and /version — each in the encoding the client asked for where the cached form allows
//! it. What the cache cannot answer truthfully is an `Err` naming why; the proxy turns it
//! into a 503 Status. Every answer carries a Warning header saying where it came from.
use std::{
    borrow::Cow,
    collections::HashMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{
    Response, StatusCode,
    body::{Body, Frame},
    header,
};
use tokio::sync::{broadcast, mpsc};

use super::{
    objects::{self, Encoding, Item},
    paging,
    select::Selector,
    store::{self, ObjectKey, Record, Store},
};
use crate::{
    body::{BodyError, ProxyBody},
    convert, kproto,
    kproto::StatusDetails,
    live::{self, endpoints, state::LiveState},
    proxy::{
        forward::{status, status_about},
        request::RequestInfo,
    },
};

/// What an offline answer says about itself (kubectl prints Warning headers).
pub const FROM_LOCAL_CACHE: &str =
    "299 - \"hub: served from the node's local cache; the cloud is unreachable\"";
pub const FROM_COORDINATOR: &str =
    "299 - \"hub: served from the pool coordinator; the cloud is unreachable\"";
/// Pool-scope data a follower reads from the coordinator while the cloud is up: the
/// designed route, so no warning (client-go logs every one).
pub const FROM_POOL_LEADER: &str = "";
/// How often an offline watch checks whether the cloud is back (then it ends, so the
/// client re-lists from the cloud).
pub(crate) const CLOUD_CHECK: Duration = Duration::from_millis(200);
/// Lists this long give their memory back to the OS after they are answered.
const LARGE_LIST: usize = 1000;
/// Bookmarks on an offline watch, when the client allows them.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

/// A request the cache is asked to answer.
pub struct CacheRequest<'a> {
    pub info: &'a RequestInfo,
    pub path: &'a str,
    pub query: &'a str,
    pub accept: &'a str,
    pub credential: &'a str,
}

/// The encodings a client accepts for objects, in its order of preference; None when it
/// accepts only forms the cache does not hold (Tables, for example).
pub(crate) fn accepted(accept: &str) -> Vec<Encoding> {
    let mut out = Vec::new();
    if accept.trim().is_empty() {
        return vec![Encoding::Json];
    }
    for alt in accept.split(',') {
        let mut params = alt.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        if params.any(|p| p.to_ascii_lowercase().starts_with("as=")) {
            continue;
        }
        let enc = match media.as_str() {
            "application/vnd.kubernetes.protobuf" => Encoding::Protobuf,
            "application/json" | "application/*" | "*/*" => Encoding::Json,
            _ => continue,
        };
        if !out.contains(&enc) {
            out.push(enc);
        }
    }
    out
}

pub(crate) fn api_version(info: &RequestInfo) -> String {
    if info.group.is_empty() {
        info.version.clone()
    } else {
        format!("{}/{}", info.group, info.version)
    }
}

fn respond(
    source: &str,
    enc_type: &str,
    body: impl Into<Bytes>,
    warning: Option<String>,
) -> Response<ProxyBody> {
    let mut b = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, enc_type);
    if !source.is_empty() {
        b = b.header("warning", source);
    }
    if let Some(w) = warning {
        b = b.header("warning", format!("299 - \"hub: {w}\""));
    }
    b.body(crate::proxy::forward::full(body))
        .expect("valid response parts")
}

/// Reads one query parameter, percent-decoded.
pub(crate) fn param(query: &str, name: &str) -> String {
    crate::proxy::request::query_param(query, name).unwrap_or_default()
}

/// One object per (namespace, name): the freshest copy any component holds; None when
/// the freshest word on it is a deletion.
struct Latest {
    key: ObjectKey,
    newest_rv: u64,
    deleted: bool,
    /// The freshest live copy in each encoding.
    json: Option<Item>,
    protobuf: Option<Item>,
    /// Served from the node's live state (`crate::live`), not the cloud's copy.
    live: bool,
}

impl Latest {
    fn copies(&self, enc: Encoding) -> (Option<&Item>, Option<&Item>) {
        match enc {
            Encoding::Json => (self.json.as_ref(), self.protobuf.as_ref()),
            Encoding::Protobuf => (self.protobuf.as_ref(), self.json.as_ref()),
        }
    }

    /// Whether `pick(enc)` has an object to give: a copy in `enc`, or one of a kind
    /// hub::convert can turn into `enc`.
    fn can_give(&self, enc: Encoding) -> bool {
        match self.copies(enc) {
            (Some(_), _) => true,
            (None, Some(other)) => other.can_be(enc),
            (None, None) => false,
        }
    }

    /// Serve `item` (made from the node's live state) in place of the cloud's copies, and
    /// lower `floor` to its resourceVersion.
    fn serve_live(&mut self, item: Item, floor: &mut Option<u64>) {
        *floor = Some(floor.map_or(item.rv, |f| f.min(item.rv)));
        (self.json, self.protobuf, self.live) = (Some(item), None, true);
    }

    /// The freshest copy in `enc`: as held, or converted from the other encoding when that
    /// copy is newer or the only one (what the kubelet cached in protobuf, for kubectl).
    fn pick(&self, enc: Encoding) -> Option<Cow<'_, Item>> {
        match self.copies(enc) {
            (Some(own), Some(other)) if other.rv > own.rv && other.can_be(enc) => {
                Some(other.in_encoding(enc).unwrap_or(Cow::Borrowed(own)))
            }
            (Some(own), _) => Some(Cow::Borrowed(own)),
            (None, Some(other)) => other.in_encoding(enc),
            (None, None) => None,
        }
    }
}

fn latest(records: Vec<(ObjectKey, Record)>) -> Vec<Latest> {
    let mut out: Vec<Latest> = Vec::new();
    for (key, rec) in records {
        let same = out
            .last()
            .is_some_and(|l| l.key.namespace == key.namespace && l.key.name == key.name);
        if !same {
            out.push(Latest {
                key: key.clone(),
                newest_rv: 0,
                deleted: false,
                json: None,
                protobuf: None,
                live: false,
            });
        }
        let l = out.last_mut().expect("pushed above");
        if rec.item.rv >= l.newest_rv {
            l.newest_rv = rec.item.rv;
            l.deleted = rec.deleted;
        }
        if rec.deleted {
            continue;
        }
        let slot = match rec.item.encoding {
            Encoding::Json => &mut l.json,
            Encoding::Protobuf => &mut l.protobuf,
        };
        if slot.as_ref().is_none_or(|i| i.rv <= rec.item.rv) {
            *slot = Some(rec.item);
        }
    }
    out
}

/// The node's live state in place of the cloud's copies it was made from (`crate::live`):
/// an entry no older than the freshest copy held is what the object is served as, and
/// EndpointSlices and Endpoints follow the pods as the node knows them now. Returns the
/// lowest resourceVersion served from that state, which a list or watch reports no
/// further than (see `crate::live`).
fn with_live_state(
    live: &LiveState,
    credential: &str,
    gvr: &str,
    scope: (Option<&str>, Option<&str>),
    objects: &mut [Latest],
) -> Result<Option<u64>, String> {
    let mut floor: Option<u64> = None;
    let store = live.store();
    if let Some(kind) = endpoints::Kind::of(gvr) {
        let pods = live.pods(scope.0).map_err(|e| e.to_string())?;
        let mut follow = endpoints::Follow::new(kind, &pods, |ns, service| {
            publish_not_ready(store, credential, ns, service)
        });
        for l in objects.iter_mut().filter(|l| !l.deleted) {
            let Some(held) = l.json.as_ref().or(l.protobuf.as_ref()) else {
                continue;
            };
            if let Some(item) = follow.adjusted(held, || l.pick(Encoding::Json)) {
                l.serve_live(item, &mut floor);
            }
        }
        return Ok(floor);
    }
    let entries = live::state::held(store, gvr, scope.0, scope.1).map_err(|e| e.to_string())?;
    for e in entries {
        let Ok(i) = objects.binary_search_by(|l| {
            (l.key.namespace.as_str(), l.key.name.as_str()).cmp(&(&e.namespace, &e.name))
        }) else {
            continue;
        };
        let l = &mut objects[i];
        if l.deleted || l.newest_rv > e.base_rv {
            continue;
        }
        let Some(item) = e.served() else { continue };
        l.serve_live(item, &mut floor);
    }
    Ok(floor)
}

/// The `publishNotReadyAddresses` of a service `credential` holds, if it holds it.
fn publish_not_ready(
    store: &Store,
    credential: &str,
    namespace: &str,
    service: &str,
) -> Option<bool> {
    let p = store::prefix(credential, "/v1/services", Some(namespace), Some(service));
    let held = latest(store.scan(&p).ok()?);
    let json = held
        .first()
        .filter(|l| !l.deleted)
        .and_then(|l| l.pick(Encoding::Json))?;
    serde_json::from_slice::<serde_json::Value>(&json.body)
        .ok()
        .map(|svc| svc["spec"]["publishNotReadyAddresses"] == true)
}

/// The copies `credential` holds of one object, as they are served now (the node's live
/// state in their place), and the lowest resourceVersion served from that state.
fn one_object(
    live: &LiveState,
    credential: &str,
    gvr: &str,
    namespace: &str,
    name: &str,
) -> Result<(Vec<Latest>, Option<u64>), String> {
    let p = store::prefix(credential, gvr, Some(namespace), Some(name));
    let mut objects = latest(live.store().scan(&p).map_err(|e| e.to_string())?);
    let floor = with_live_state(
        live,
        credential,
        gvr,
        (Some(namespace), Some(name)),
        &mut objects,
    )?;
    Ok((objects, floor))
}

/// The kind of the objects in a scope: an object's own, else the kind the cloud named
/// the list by (`hint`, e.g. `CSIDriver`), else the resource's well-known kind.
fn kind_of(objects: &[Latest], resource: &str, hint: &str) -> Result<String, String> {
    let kind = objects
        .iter()
        .find_map(|l| {
            l.json
                .as_ref()
                .or(l.protobuf.as_ref())
                .map(|i| i.kind.clone())
        })
        .filter(|k| !k.is_empty())
        .or_else(|| Some(hint.to_string()).filter(|k| !k.is_empty()))
        .unwrap_or_else(|| objects::kind_for(resource).to_string());
    if kind.is_empty() {
        // An answer of kind "List" is one client-go cannot decode.
        return Err(format!("the kind of {resource} is not known to the cache"));
    }
    Ok(kind)
}

/// The objects that exist (no tombstone is the freshest word on them) and that `sel`
/// selects.
fn live_and_selected<'a>(objects: &'a [Latest], sel: &Selector) -> Vec<&'a Latest> {
    objects
        .iter()
        .filter(|l| !l.deleted)
        .filter(|l| {
            l.json
                .as_ref()
                .or(l.protobuf.as_ref())
                .is_some_and(|i| sel.matches_item(i))
        })
        .collect()
}

/// The first encoding the client accepts in which every one of `objects` is held. When
/// there is none, the answer would leave objects out: the cache says so instead of
/// passing off a partial (or empty) answer as whole.
fn whole_in_one_encoding(objects: &[&Latest], prefs: &[Encoding]) -> Result<Encoding, String> {
    held_whole(prefs, |e| objects.iter().filter(|l| !l.can_give(e)).count()).map_err(|e| {
        // Name the kind that could not be converted (a custom resource, or a group this hub
        // has no schema for).
        let no_schema = objects.iter().find_map(|l| {
            let held = l.json.as_ref().or(l.protobuf.as_ref())?;
            (!convert::has_schema(&held.api_version, &held.kind))
                .then(|| format!("{} {}", held.api_version, held.kind))
        });
        match no_schema {
            Some(kind) => format!("{e}; {kind} has no schema in this hub to convert it"),
            None => e,
        }
    })
}

/// The first of `prefs` for which `missing` counts no object, or why there is none.
pub(crate) fn held_whole(
    prefs: &[Encoding],
    missing: impl Fn(Encoding) -> usize,
) -> Result<Encoding, String> {
    if let Some(e) = prefs.iter().copied().find(|e| missing(*e) == 0) {
        return Ok(e);
    }
    let names: Vec<String> = prefs
        .iter()
        .map(|e| {
            format!(
                "{} are held only in another encoding than {}",
                missing(*e),
                e.content_type()
            )
        })
        .collect();
    Err(format!(
        "the answer would leave objects out: {} (the client accepts only {})",
        names.join("; "),
        prefs
            .iter()
            .map(|e| e.content_type())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// A complete list the cache holds whose answer covers `asked` in `namespace`: one of
/// that namespace or of all namespaces, unfiltered or under a selector `asked` is within.
fn covering_list(
    store: &Store,
    credential: &str,
    gvr: &str,
    namespace: &str,
    asked: &Selector,
) -> Result<Option<store::ListMeta>, String> {
    let scopes: &[&str] = if namespace.is_empty() {
        &[""]
    } else {
        &[namespace, ""]
    };
    for ns in scopes {
        let metas = store
            .list_metas(credential, gvr, ns)
            .map_err(|e| e.to_string())?;
        let covering = metas.into_iter().find(|m| {
            m.unfiltered
                || Selector::parse(&m.selector.0, &m.selector.1)
                    .is_ok_and(|cached| asked.within(&cached))
        });
        if covering.is_some() {
            return Ok(covering);
        }
    }
    Ok(None)
}

pub struct Server {
    pub store: Arc<Store>,
    pub live: Arc<live::state::LiveState>,
}

impl Server {
    /// Answers `req` from the cache, or says why it cannot.
    pub async fn serve(
        &self,
        req: CacheRequest<'_>,
        cloud_back: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Response<ProxyBody>, String> {
        let info = req.info;
        if !info.is_resource {
            return self.discovery(req.path, req.accept);
        }
        // GET of a status subresource is the whole object, as kube-apiserver answers it
        // (kubectl patch --subresource=status reads it first).
        let status_get = info.subresource == "status" && info.verb == "get";
        if !info.subresource.is_empty() && !status_get {
            return Err(format!(
                "the {} subresource is not cached",
                info.subresource
            ));
        }
        for n in [&info.namespace, &info.name] {
            if !objects::valid_name(n) {
                return Ok(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("invalid name or namespace {n:?}"),
                ));
            }
        }
        let prefs = accepted(req.accept);
        if prefs.is_empty() {
            return Err(format!(
                "the client accepts only {:?}; the cache holds JSON and protobuf objects",
                req.accept
            ));
        }
        let live = self.live.clone();
        let (info, query, credential) = (
            info.clone(),
            req.query.to_string(),
            req.credential.to_string(),
        );
        match info.verb {
            "get" => run_blocking(move || get(&live, &info, &credential, &prefs)).await,
            "list" => run_blocking(move || list(&live, &info, &query, &credential, &prefs)).await,
            "watch" => {
                let changes = self.live.subscribe();
                watch(live, changes, info, query, credential, prefs, cloud_back).await
            }
            v => Err(format!("{v} cannot be answered offline")),
        }
    }

    fn discovery(&self, path: &str, accept: &str) -> Result<Response<ProxyBody>, String> {
        let stored = self.store.raw(path).map_err(|e| e.to_string())?;
        if stored.is_empty() {
            return Err(format!("{path} was never fetched from the cloud"));
        }
        // The client's alternatives in order; a stored answer matches on media type and
        // on the `as`/`g`/`v` parameters that select aggregated discovery or Tables.
        let norm = |ct: &str| -> (String, Vec<String>) {
            let mut p = ct.split(';').map(|s| s.trim().to_ascii_lowercase());
            let media = p.next().unwrap_or_default();
            let mut params: Vec<String> = p
                .filter(|x| x.starts_with("as=") || x.starts_with("g=") || x.starts_with("v="))
                .collect();
            params.sort();
            (media, params)
        };
        let alts: Vec<&str> = if accept.trim().is_empty() {
            vec!["*/*"]
        } else {
            accept.split(',').collect()
        };
        for alt in alts {
            let (media, params) = norm(alt);
            let hit = stored.iter().find(|(ct, _)| {
                let (m, p) = norm(ct);
                (media == "*/*" || media == "application/*" && m.starts_with("application/"))
                    && p.is_empty()
                    || (m == media && p == params)
            });
            if let Some((ct, body)) = hit {
                return Ok(respond(FROM_LOCAL_CACHE, ct, body.clone(), None));
            }
        }
        Err(format!("{path} is cached only as {}", stored[0].0))
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("cache read failed: {e}"))?
}

fn get(
    live: &LiveState,
    info: &RequestInfo,
    credential: &str,
    prefs: &[Encoding],
) -> Result<Response<ProxyBody>, String> {
    let gvr = info.gvr();
    let (objects, _) = one_object(live, credential, &gvr, &info.namespace, &info.name)?;
    let not_found = || {
        status_about(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{} {:?} not found", info.resource, info.name),
            Some(StatusDetails {
                name: info.name.clone(),
                group: info.group.clone(),
                kind: info.resource.clone(),
                causes: Vec::new(),
            }),
        )
    };
    let Some(l) = objects.first() else {
        // Absent from a complete list that would hold it: truthfully not found (as of that
        // list).
        let by_name = Selector::parse("", &format!("metadata.name={}", info.name))
            .map_err(|e| e.to_string())?;
        return match covering_list(live.store(), credential, &gvr, &info.namespace, &by_name)? {
            Some(_) => Ok(not_found()),
            _ => Err(format!(
                "{} {}/{} is not in the local cache for this client",
                info.resource, info.namespace, info.name
            )),
        };
    };
    if l.deleted {
        return Ok(not_found());
    }
    let Some(item) = prefs.iter().find_map(|e| l.pick(*e)) else {
        return Err(format!(
            "{} {}/{} is cached only in an encoding the client does not accept",
            info.resource, info.namespace, info.name
        ));
    };
    Ok(respond(
        FROM_LOCAL_CACHE,
        item.encoding.content_type(),
        item.encoded(),
        None,
    ))
}

/// The selector of a list or watch, checked against what the cache indexes.
pub(crate) fn selector(
    info: &RequestInfo,
    query: &str,
) -> Result<Result<Selector, String>, String> {
    let sel = match Selector::parse(
        &param(query, "labelSelector"),
        &param(query, "fieldSelector"),
    ) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.to_string())),
    };
    if let Some(f) = sel
        .field_names()
        .find(|f| !objects::supports_field(&info.resource, f))
    {
        return Ok(Err(format!("field label not supported: {f}")));
    }
    Ok(Ok(sel))
}

pub(crate) fn bad_request(msg: &str) -> Response<ProxyBody> {
    status(StatusCode::BAD_REQUEST, "BadRequest", msg)
}

/// The objects of a list or watch scope, the resourceVersion they stand at, and the
/// kind the cloud named the list by (empty if not known).
fn scope_objects(
    live: &LiveState,
    info: &RequestInfo,
    credential: &str,
    asked: &Selector,
) -> Result<(Vec<Latest>, u64, String), String> {
    let gvr = info.gvr();
    let ns = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
    let store = live.store();
    let Some(meta) = covering_list(store, credential, &gvr, &info.namespace, asked)? else {
        // One object asked for by name: the copy a GET would be answered from (or its
        // tombstone) answers the list too.
        if let Some(name) = asked.single_name() {
            let (objects, floor) = one_object(live, credential, &gvr, &info.namespace, name)?;
            if !objects.is_empty() {
                let rv = objects.iter().map(|l| l.newest_rv).max().unwrap_or(0);
                return Ok((objects, floor.map_or(rv, |f| f.min(rv)), String::new()));
            }
        }
        let held: Vec<String> = store
            .list_metas(credential, &gvr, &info.namespace)
            .map_err(|e| e.to_string())?
            .into_iter()
            .take(3)
            .map(|m| {
                format!(
                    "labelSelector {:?} fieldSelector {:?}",
                    m.selector.0, m.selector.1
                )
            })
            .collect();
        let scope = if info.namespace.is_empty() {
            "(all namespaces)".to_string()
        } else {
            format!("in {}", info.namespace)
        };
        return Err(if held.is_empty() {
            format!(
                "no list of {gvr} {scope} was cached for this client before the cloud became unreachable"
            )
        } else {
            format!(
                "the lists of {gvr} {scope} cached for this client ({}) do not cover this request's selector",
                held.join(", ")
            )
        });
    };
    let records = store
        .scan(&store::prefix(credential, &gvr, ns, None))
        .map_err(|e| e.to_string())?;
    let mut objects = latest(records);
    let rv = objects.iter().map(|l| l.newest_rv).fold(meta.rv, u64::max);
    let floor = with_live_state(live, credential, &gvr, (ns, None), &mut objects)?;
    let rv = floor.map_or(rv, |f| f.min(rv));
    let kind = meta
        .kind
        .strip_suffix("List")
        .unwrap_or_default()
        .to_string();
    Ok((objects, rv, kind))
}

fn list(
    live: &LiveState,
    info: &RequestInfo,
    query: &str,
    credential: &str,
    prefs: &[Encoding],
) -> Result<Response<ProxyBody>, String> {
    let sel = match selector(info, query)? {
        Ok(s) => s,
        Err(msg) => return Ok(bad_request(&msg)),
    };
    let (objects, rv, kind) = scope_objects(live, info, credential, &sel)?;
    render_list(FROM_LOCAL_CACHE, objects, rv, &kind, info, query, prefs)
}

/// Answers a get or list from objects read elsewhere (the pool coordinator): `items` are
/// every object of the request's scope, `rv` the resourceVersion they stand at.
pub fn answer_from(
    source: &str,
    mut items: Vec<Item>,
    rv: u64,
    info: &RequestInfo,
    query: &str,
    accept: &str,
) -> Result<Response<ProxyBody>, String> {
    let prefs = accepted(accept);
    if prefs.is_empty() {
        return Err(format!("the client accepts only {accept:?}"));
    }
    items.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let records = items
        .into_iter()
        .map(|item| {
            let key = ObjectKey {
                credential: String::new(),
                gvr: info.gvr(),
                namespace: item.namespace.clone(),
                name: item.name.clone(),
                component: String::new(),
            };
            let rec = Record::live(item, false, 0);
            (key, rec)
        })
        .collect();
    let objects = latest(records);
    match info.verb {
        "list" => render_list(source, objects, rv, "", info, query, &prefs),
        "get" => {
            let found = objects
                .iter()
                .find(|l| l.key.name == info.name && l.key.namespace == info.namespace)
                .ok_or_else(|| format!("{} {} is not there", info.resource, info.name))?;
            let item = prefs
                .iter()
                .find_map(|e| found.pick(*e))
                .ok_or("held only in an encoding the client does not accept")?;
            Ok(respond(
                source,
                item.encoding.content_type(),
                item.encoded(),
                None,
            ))
        }
        v => Err(format!("{v} is not answered from here")),
    }
}

/// A list answer from the objects of its scope: selectors, limit/continue, encoding.
fn render_list(
    source: &str,
    objects: Vec<Latest>,
    rv: u64,
    kind_hint: &str,
    info: &RequestInfo,
    query: &str,
    prefs: &[Encoding],
) -> Result<Response<ProxyBody>, String> {
    let sel = match selector(info, query)? {
        Ok(s) => s,
        Err(msg) => return Ok(bad_request(&msg)),
    };
    let kind = kind_of(&objects, &info.resource, kind_hint)?;
    let selected = live_and_selected(&objects, &sel);
    let enc = whole_in_one_encoding(&selected, prefs)?;
    // kube-apiserver's order (etcd keys), which its continue tokens and the hub's count on.
    let mut items: Vec<_> = selected
        .into_iter()
        .map(|l| {
            let key = paging::relative_key(&info.namespace, &l.key.namespace, &l.key.name);
            (key, l)
        })
        .collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let cont = param(query, "continue");
    if !cont.is_empty() {
        let Some(from) = paging::decode(&cont) else {
            return Ok(bad_request("continue key is not valid"));
        };
        items.retain(|(key, _)| *key >= from.start);
    }
    // resourceVersion=0 asks for any version, which kube-apiserver answers whole from its
    // watch cache whatever the limit (informers list so, and expect no continue).
    let limit: usize = if param(query, "resourceVersion") == "0" {
        0
    } else {
        param(query, "limit").parse().unwrap_or(0)
    };
    let (mut next, mut remaining) = (String::new(), None);
    if limit > 0 && items.len() > limit {
        // As kube-apiserver: a count only when no selector filtered the items.
        remaining = sel.is_empty().then_some((items.len() - limit) as u64);
        items.truncate(limit);
        next = paging::encode(rv, &items[limit - 1].0);
    }
    let items: Vec<&Latest> = items.into_iter().map(|(_, l)| l).collect();
    let page = Page {
        list_kind: format!("{kind}List"),
        api_version: api_version(info),
        rv,
        next,
        remaining,
    };
    let body = list_body(enc, &page, &items)?;
    let resp = respond(source, enc.content_type(), body, None);
    if objects.len() >= LARGE_LIST {
        // The decoded records of a large list are freed now; hand the memory back rather
        // than keep the peak as RSS.
        drop(objects);
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    Ok(resp)
}

/// What a list answer says of itself beside its items.
struct Page {
    list_kind: String,
    api_version: String,
    rv: u64,
    /// The continue token, empty on the last page.
    next: String,
    remaining: Option<u64>,
}

/// A list answer's bytes in `enc`: the list's own metadata around the kept (or converted)
/// item bytes.
fn list_body(enc: Encoding, page: &Page, items: &[&Latest]) -> Result<Vec<u8>, String> {
    let picked = items
        .iter()
        .map(|l| {
            l.pick(enc).ok_or_else(|| {
                format!(
                    "{}/{} could not be converted to {}",
                    l.key.namespace,
                    l.key.name,
                    enc.content_type()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    match enc {
        Encoding::Json => {
            // ListMeta's members in kube-apiserver's order.
            let mut meta = format!("{{\"resourceVersion\":\"{}\"", page.rv);
            if !page.next.is_empty() {
                meta.push_str(&format!(
                    ",\"continue\":{}",
                    serde_json::Value::from(page.next.as_str())
                ));
            }
            if let Some(n) = page.remaining {
                meta.push_str(&format!(",\"remainingItemCount\":{n}"));
            }
            meta.push('}');
            let mut out = format!(
                "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
                serde_json::Value::from(page.list_kind.as_str()),
                serde_json::Value::from(page.api_version.as_str()),
                meta
            )
            .into_bytes();
            for (i, item) in picked.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&json_list_item(item));
            }
            out.extend_from_slice(b"]}");
            Ok(out)
        }
        Encoding::Protobuf => {
            let bodies = picked.iter().map(|item| item.body.as_slice());
            let raw =
                kproto::list_message(&page.rv.to_string(), &page.next, page.remaining, bodies);
            Ok(kproto::envelope(&page.api_version, &page.list_kind, &raw))
        }
    }
}

/// An object as a JSON list's item: kube-apiserver writes list items without their own
/// `kind` and `apiVersion` (the list names them), while watch events and conversions from
/// protobuf start with both.
fn json_list_item(item: &Item) -> Cow<'_, [u8]> {
    let type_meta = format!(
        "{{\"kind\":{},\"apiVersion\":{},",
        serde_json::Value::from(item.kind.as_str()),
        serde_json::Value::from(item.api_version.as_str())
    );
    match item.body.strip_prefix(type_meta.as_bytes()) {
        Some(rest) => {
            let mut b = Vec::with_capacity(rest.len() + 1);
            b.push(b'{');
            b.extend_from_slice(rest);
            Cow::Owned(b)
        }
        None => Cow::Borrowed(&item.body),
    }
}

/// A response body fed from a channel (offline watches).
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A watch event in the client's encoding.
pub(crate) fn event(enc: Encoding, ty: &str, item: &Item) -> Bytes {
    match enc {
        Encoding::Json => {
            let mut line = format!("{{\"type\":\"{ty}\",\"object\":").into_bytes();
            line.extend_from_slice(&item.body);
            line.extend_from_slice(b"}\n");
            line.into()
        }
        Encoding::Protobuf => kproto::watch_frame(ty, &item.encoded()).into(),
    }
}

/// An object carrying only metadata (bookmarks, deletions known by key).
pub(crate) fn meta_only(
    enc: Encoding,
    av: &str,
    kind: &str,
    key: Option<&ObjectKey>,
    rv: u64,
    annotations: &[(&str, &str)],
) -> Item {
    let (name, ns) = key.map_or(("", ""), |k| (k.name.as_str(), k.namespace.as_str()));
    let body = match enc {
        Encoding::Json => {
            let mut meta = serde_json::json!({"resourceVersion": rv.to_string()});
            if !name.is_empty() {
                meta["name"] = name.into();
            }
            if !ns.is_empty() {
                meta["namespace"] = ns.into();
            }
            if !annotations.is_empty() {
                meta["annotations"] = annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            serde_json::to_vec(
                &serde_json::json!({"kind": kind, "apiVersion": av, "metadata": meta}),
            )
            .unwrap_or_default()
        }
        Encoding::Protobuf => kproto::meta_only_object(name, ns, &rv.to_string(), annotations),
    };
    Item {
        name: name.into(),
        namespace: ns.into(),
        rv,
        labels: vec![],
        fields: vec![],
        api_version: av.into(),
        kind: kind.into(),
        encoding: enc,
        body,
    }
}

async fn watch(
    live: Arc<LiveState>,
    mut changes: broadcast::Receiver<live::Changed>,
    info: RequestInfo,
    query: String,
    credential: String,
    prefs: Vec<Encoding>,
    cloud_back: Arc<dyn Fn() -> bool + Send + Sync>,
) -> Result<Response<ProxyBody>, String> {
    let sel = match selector(&info, &query)? {
        Ok(s) => s,
        Err(msg) => return Ok(bad_request(&msg)),
    };
    let (scan_info, scan_cred, scan_live) = (info.clone(), credential.clone(), live.clone());
    let scan_sel = sel.clone();
    let (objects, rv, kind_hint) =
        run_blocking(move || scope_objects(&scan_live, &scan_info, &scan_cred, &scan_sel)).await?;
    let selected = live_and_selected(&objects, &sel);
    let enc = whole_in_one_encoding(&selected, &prefs)?;
    let av = api_version(&info);
    let kind = kind_of(&objects, &info.resource, &kind_hint)?;
    // What this watch has shown, so a later change is ADDED, MODIFIED or DELETED.
    let mut shown = Shown(
        selected
            .iter()
            .filter_map(|l| {
                let item = l.pick(enc)?;
                Some((
                    (item.namespace.clone(), item.name.clone()),
                    Shown::digest(&item),
                ))
            })
            .collect(),
    );
    // Bookmarks stand at the cache's state, and never past what the node's live state
    // served (see `crate::live`).
    let mut bookmark_rv = rv;
    let bookmark = meta_only(enc, &av, &kind, None, rv, &[]);
    let first = initial_events(&objects, &sel, enc, &query, &bookmark);
    let bookmarks = param(&query, "allowWatchBookmarks") == "true";
    let timeout = watch_timeout(&query);
    let follows_pods = endpoints::Kind::of(&info.gvr()).is_some();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let started = Instant::now();
        let mut last_bookmark = Instant::now();
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CLOUD_CHECK) => {}
                _ = tx.closed() => return,
                changed = changes.recv() => match changed {
                    Ok(c) if info.namespace.is_empty() || c.namespace == info.namespace => {
                        let (live, credential) = (live.clone(), credential.clone());
                        let items = if info.gvr_is(&c.gvr) {
                            run_blocking(move || {
                                live_object(&live, &credential, &c.gvr, &c.namespace, &c.name, enc)
                            })
                            .await
                            .map(|item| item.into_iter().collect())
                        } else if follows_pods && c.gvr == endpoints::PODS {
                            // A pod changed: the slices of its namespace may follow it.
                            let mut narrowed = info.clone();
                            narrowed.namespace = c.namespace.clone();
                            let sel = sel.clone();
                            run_blocking(move || {
                                let (objects, _, _) =
                                    scope_objects(&live, &narrowed, &credential, &sel)?;
                                Ok(objects
                                    .iter()
                                    .filter(|l| !l.deleted)
                                    .filter_map(|l| l.pick(enc).map(Cow::into_owned))
                                    .collect::<Vec<_>>())
                            })
                            .await
                        } else {
                            continue;
                        };
                        let Ok(items) = items else { continue };
                        for item in items {
                            let Some(ty) = shown.change(&item, sel.matches_item(&item)) else {
                                continue;
                            };
                            bookmark_rv = bookmark_rv.min(item.rv);
                            if tx.send(event(enc, ty, &item)).await.is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                    Ok(_) => continue,
                    // Changes were missed: end, and the client's next watch is sent them.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {}
                },
            }
            // The cloud is back, or the client's timeout is up: end cleanly, the client
            // re-lists and re-watches (from the cloud).
            if cloud_back() || timeout.is_some_and(|t| started.elapsed() >= t) {
                return;
            }
            if bookmarks && last_bookmark.elapsed() >= BOOKMARK_EVERY {
                last_bookmark = Instant::now();
                let mark = meta_only(
                    enc,
                    &bookmark.api_version,
                    &bookmark.kind,
                    None,
                    bookmark_rv,
                    &[],
                );
                if tx.send(event(enc, "BOOKMARK", &mark)).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(watch_response(FROM_LOCAL_CACHE, enc, rx))
}

/// The objects an offline watch has shown, with a digest of each as last sent.
#[derive(Default)]
pub(crate) struct Shown(HashMap<(String, String), u64>);

impl Shown {
    pub(crate) fn digest(item: &Item) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        item.body.hash(&mut h);
        h.finish()
    }

    /// The event that tells the watch of `item` as it is served now (`selected`: whether
    /// the watch's selector takes it), if it is news; and notes it as shown.
    pub(crate) fn change(&mut self, item: &Item, selected: bool) -> Option<&'static str> {
        let id = (item.namespace.clone(), item.name.clone());
        let was = self.0.get(&id).copied();
        let digest = Shown::digest(item);
        let ty = match (selected, was) {
            (true, Some(d)) if d == digest => return None,
            (true, Some(_)) => "MODIFIED",
            (true, None) => "ADDED",
            (false, Some(_)) => "DELETED",
            (false, None) => return None,
        };
        if selected {
            self.0.insert(id, digest);
        } else {
            self.0.remove(&id);
        }
        Some(ty)
    }
}

/// One object as `credential` is served it now, in `enc`, if it is served from the node's
/// live state (None: not this credential's, or the cloud's copy).
fn live_object(
    live: &LiveState,
    credential: &str,
    gvr: &str,
    namespace: &str,
    name: &str,
    enc: Encoding,
) -> Result<Option<Item>, String> {
    let (objects, _) = one_object(live, credential, gvr, namespace, name)?;
    Ok(objects
        .first()
        .filter(|l| l.live)
        .and_then(|l| l.pick(enc))
        .map(Cow::into_owned))
}

/// A cache watch's first events: what happened after the client's resourceVersion, as far
/// as the cache knows — live objects as MODIFIED (ADDED for a fresh start), deletions as
/// DELETED — and with sendInitialEvents the bookmark that ends them (`end`, annotated).
fn initial_events(
    objects: &[Latest],
    sel: &Selector,
    enc: Encoding,
    query: &str,
    end: &Item,
) -> Vec<Bytes> {
    let from: u64 = param(query, "resourceVersion").parse().unwrap_or(0);
    let send_initial = param(query, "sendInitialEvents") == "true";
    let initial = from == 0 || send_initial;
    let mut first = Vec::new();
    for l in objects {
        // What the node wrote is sent again on every resumed watch: the client may have
        // missed it between two watches, and its resourceVersion says nothing of that.
        if !initial && l.newest_rv <= from && !l.live {
            continue;
        }
        if l.deleted {
            if !initial {
                let gone = meta_only(
                    enc,
                    &end.api_version,
                    &end.kind,
                    Some(&l.key),
                    l.newest_rv,
                    &[],
                );
                first.push(event(enc, "DELETED", &gone));
            }
            continue;
        }
        let Some(item) = l.pick(enc) else { continue };
        if sel.matches_item(&item) {
            first.push(event(
                enc,
                if initial { "ADDED" } else { "MODIFIED" },
                &item,
            ));
        }
    }
    // As kube-apiserver: the end is marked only for a client that takes bookmarks.
    if send_initial && param(query, "allowWatchBookmarks") == "true" {
        let marked = meta_only(
            enc,
            &end.api_version,
            &end.kind,
            None,
            end.rv,
            &[(objects::INITIAL_EVENTS_END, "true")],
        );
        first.push(event(enc, "BOOKMARK", &marked));
    }
    first
}

/// The answer to a watch whose events, in `enc`, come from `events`.
pub(crate) fn watch_response(
    source: &str,
    enc: Encoding,
    events: mpsc::Receiver<Bytes>,
) -> Response<ProxyBody> {
    let ct = match enc {
        Encoding::Json => "application/json".to_string(),
        Encoding::Protobuf => format!("{};stream=watch", enc.content_type()),
    };
    let mut resp = respond(source, &ct, Bytes::new(), None);
    *resp.body_mut() = ChannelBody(events).boxed();
    resp
}

/// A watch's timeoutSeconds, if it has one.
pub(crate) fn watch_timeout(query: &str) -> Option<Duration> {
    param(query, "timeoutSeconds")
        .parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_still_names_its_kind() {
        let info = RequestInfo::parse(
            &hyper::Method::GET,
            "/apis/discovery.k8s.io/v1/endpointslices",
            "",
        );
        let resp = answer_from(FROM_COORDINATOR, vec![], 7, &info, "", "application/json")
            .expect("an answer");
        let body = body_of(resp);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["kind"], "EndpointSliceList");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
    }

    /// The pool holds pods pushed as JSON by one hub and as protobuf by another: each client
    /// gets all of them in the first encoding it takes, converted where held in the other.
    /// A kind with no schema to convert is refused with the count left out and the kind
    /// named (never a partial list).
    #[test]
    fn a_list_held_in_two_encodings_is_answered_whole_or_refused_naming_why() {
        let item = |name: &str, encoding: Encoding, api_version: &str, kind: &str| Item {
            name: name.into(),
            namespace: "default".into(),
            rv: 5,
            labels: vec![],
            fields: vec![],
            api_version: api_version.into(),
            kind: kind.into(),
            encoding,
            body: match encoding {
                Encoding::Json => serde_json::to_vec(&serde_json::json!({
                    "apiVersion": api_version, "kind": kind,
                    "metadata": {"name": name, "namespace": "default", "resourceVersion": "5"},
                }))
                .unwrap(),
                // ObjectMeta { name, namespace, resourceVersion }
                Encoding::Protobuf => {
                    let mut meta = Vec::new();
                    kproto::put_bytes(&mut meta, 1, name.as_bytes());
                    kproto::put_bytes(&mut meta, 3, b"default");
                    kproto::put_bytes(&mut meta, 6, b"5");
                    let mut raw = Vec::new();
                    kproto::put_bytes(&mut raw, 1, &meta);
                    raw
                }
            },
        };
        let pod = |name: &str, encoding: Encoding| item(name, encoding, "v1", "Pod");
        let info = RequestInfo::parse(&hyper::Method::GET, "/api/v1/pods", "");
        let mixed = vec![
            pod("a", Encoding::Json),
            pod("b", Encoding::Protobuf),
            pod("c", Encoding::Protobuf),
        ];
        for (accept, content_type) in [
            ("application/json", "application/json"),
            (
                "application/vnd.kubernetes.protobuf,application/json",
                "application/vnd.kubernetes.protobuf",
            ),
        ] {
            let resp = answer_from(FROM_COORDINATOR, mixed.clone(), 9, &info, "", accept)
                .unwrap_or_else(|e| panic!("{accept}: {e}"));
            assert_eq!(resp.headers()[header::CONTENT_TYPE], content_type);
            let body = body_of(resp);
            let names: Vec<String> = if content_type == "application/json" {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                v["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
                    .collect()
            } else {
                let list = kproto::split_list(kproto::unwrap(&body).unwrap().raw).unwrap();
                list.items
                    .iter()
                    .map(|i| kproto::object_identity(i).unwrap().0.to_string())
                    .collect()
            };
            assert_eq!(names, ["a", "b", "c"], "{accept}");
        }

        let widgets = RequestInfo::parse(&hyper::Method::GET, "/apis/example.com/v1/widgets", "");
        let widget = |name: &str| item(name, Encoding::Protobuf, "example.com/v1", "Widget");
        let refused = answer_from(
            FROM_COORDINATOR,
            vec![widget("w1"), widget("w2")],
            9,
            &widgets,
            "",
            "application/json",
        )
        .unwrap_err();
        assert!(
            refused.contains("2 are held only in another encoding than application/json")
                && refused.contains("example.com/v1 Widget has no schema"),
            "{refused}"
        );
    }

    fn body_of(resp: Response<ProxyBody>) -> Bytes {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(resp.into_body().collect())
            .unwrap()
            .to_bytes()
    }

    #[test]
    fn accept_negotiation() {
        use Encoding::*;
        assert_eq!(accepted(""), vec![Json]);
        assert_eq!(
            accepted("application/vnd.kubernetes.protobuf, application/json"),
            vec![Protobuf, Json]
        );
        assert_eq!(
            accepted("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
            vec![Json]
        );
        assert!(accepted("application/json;as=Table;v=v1;g=meta.k8s.io").is_empty());
        assert_eq!(accepted("*/*"), vec![Json]);
    }
}
