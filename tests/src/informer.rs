//! A client-go-shaped informer (its reflector), as kubelet and kube-proxy run one per
//! resource and selector: it gets the complete set by LIST then watch (client-go before
//! 1.35, `WatchListClient=false`) or by a streamed list (`watch?sendInitialEvents=true`,
//! the default since 1.35), keeps it current from the watch, and after an end or a
//! failure asks again exactly as the recorded kubelets do
//! (tests/fixtures/wire/kubelet-*/README.md):
//!
//! * a watch that merely ended is resumed by a plain watch from the last resourceVersion;
//! * a request that failed is followed by a new complete set: a LIST from the last
//!   resourceVersion, or a streamed list `resourceVersion=<last>&resourceVersionMatch=NotOlderThan`;
//! * a streamed list that fails falls back to a LIST for that attempt.
//!
//! Objects are read with full decoders (serde_json, k8s-pb), never the hub's own readers.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_pb::api::discovery::v1::EndpointSlice;
use k8s_pb::apimachinery::pkg::{
    apis::meta::v1::{ListMeta, ObjectMeta, WatchEvent},
    runtime::Unknown,
};
use prost::Message;
use serde_json::Value;

use crate::apiserver::client::{Chunk, Client, Reply, Stream};

/// How the informer gets its complete set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `list ?limit=500&resourceVersion=0`, then `watch ?resourceVersion=<list's>`.
    ListThenWatch,
    /// `watch ?sendInitialEvents=true&resourceVersionMatch=NotOlderThan`: ADDED events up
    /// to the bookmark annotated `k8s.io/initial-events-end`, then the watch goes on.
    WatchList,
}

/// How the last complete set was got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    /// "list" or "watch-list".
    pub how: &'static str,
    pub rv: String,
    /// A streamed list ended with the annotated bookmark (always false for a LIST).
    pub end_annotated: bool,
    /// The answer's Warning headers.
    pub warnings: Vec<String>,
}

/// One watch event, as a full decoder reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    kind: String,
    /// `namespace/name`; empty for bookmarks and errors.
    key: String,
    rv: String,
    initial_events_end: bool,
    /// The object's own bytes: its JSON, or its protobuf message (no envelope).
    raw: Vec<u8>,
}

/// Any Kubernetes object, as far as its metadata (field 1 of every kind).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyObject {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
}

/// Any Kubernetes list: its ListMeta and its items' bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyList {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub items: Vec<Vec<u8>>,
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf,application/json";
/// How long a streamed list may take to reach its end bookmark.
const SYNC_LIMIT: Duration = Duration::from_secs(30);

/// An endpoint of a slice: (pod, addresses, ready, serving).
pub type SliceEndpoint = (String, Vec<String>, bool, bool);

pub struct Informer<'c> {
    client: &'c Client,
    user_agent: String,
    protobuf: bool,
    /// The collection's path (`/api/v1/pods`, `/api/v1/namespaces/ns1/configmaps`).
    path: String,
    /// The selector part of the query as the client sends it (`fieldSelector=spec.nodeName%3Dn`),
    /// or empty.
    selector: String,
    mode: Mode,
    /// The informer's store: `namespace/name` → resourceVersion.
    pub objects: BTreeMap<String, u64>,
    /// Each stored object's bytes (JSON, or its protobuf message without the envelope).
    pub bodies: BTreeMap<String, Vec<u8>>,
    /// The last resourceVersion seen (a list's, an event's or a bookmark's).
    pub rv: Option<String>,
    watch: Option<Stream<'c>>,
    /// Bytes of the open watch not yet read as events.
    pending: Vec<u8>,
    /// Every request made, as `METHOD path -> status`.
    pub calls: Vec<String>,
}

impl<'c> Informer<'c> {
    pub fn new(
        client: &'c Client,
        user_agent: &str,
        protobuf: bool,
        path: &str,
        selector: &str,
        mode: Mode,
    ) -> Informer<'c> {
        Informer {
            client,
            user_agent: user_agent.to_string(),
            protobuf,
            path: path.to_string(),
            selector: selector.to_string(),
            mode,
            objects: BTreeMap::new(),
            bodies: BTreeMap::new(),
            rv: None,
            watch: None,
            pending: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// The object names the store holds (`namespace/name`).
    pub fn names(&self) -> Vec<String> {
        self.objects.keys().cloned().collect()
    }

    /// Pumps the open watch (up to 30 s) until the EndpointSlice `key` holds `endpoints`,
    /// as [`Informer::slice_endpoints`] gives them; `what` names the wait.
    pub fn wait_slice(&mut self, what: &str, key: &str, endpoints: &[SliceEndpoint]) {
        crate::wait_for(what, Duration::from_secs(30), || {
            self.pump(Duration::from_millis(200)).unwrap();
            (self.slice_endpoints(key) == endpoints).then_some(())
        });
    }

    /// The endpoints of the EndpointSlice `key` (`namespace/name`) as this informer holds it,
    /// as (pod, addresses, ready, serving); empty if it holds no such slice.
    pub fn slice_endpoints(&self, key: &str) -> Vec<SliceEndpoint> {
        let Some(raw) = self.bodies.get(key) else {
            return Vec::new();
        };
        if raw.first() == Some(&b'{') {
            let v: Value = serde_json::from_slice(raw).unwrap();
            return v["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let addresses = e["addresses"].as_array().into_iter().flatten();
                    (
                        e["targetRef"]["name"].as_str().unwrap_or_default().into(),
                        addresses
                            .filter_map(|a| a.as_str().map(String::from))
                            .collect(),
                        e["conditions"]["ready"] == true,
                        e["conditions"]["serving"] == true,
                    )
                })
                .collect();
        }
        let slice = EndpointSlice::decode(raw.as_slice()).unwrap();
        slice
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.unwrap_or_default();
                let pod = e.target_ref.clone().unwrap_or_default().name;
                (
                    pod.unwrap_or_default(),
                    e.addresses.clone(),
                    c.ready == Some(true),
                    c.serving == Some(true),
                )
            })
            .collect()
    }

    fn headers(&self) -> Vec<(&str, &str)> {
        let accept = if self.protobuf {
            PROTOBUF
        } else {
            "application/json"
        };
        vec![("User-Agent", self.user_agent.as_str()), ("Accept", accept)]
    }

    fn query(&self, rest: &str) -> String {
        if self.selector.is_empty() {
            format!("{}?{rest}", self.path)
        } else {
            format!("{}?{}&{rest}", self.path, self.selector)
        }
    }

    /// Gets the complete set, as the reflector does at start and after a failure; the
    /// watch then runs on (from the streamed list's own stream, or opened after a LIST).
    pub fn sync(&mut self) -> Result<Synced, String> {
        self.watch = None;
        self.pending.clear();
        if self.mode == Mode::WatchList {
            match self.watch_list() {
                Ok(s) => return Ok(s),
                // client-go falls back to a LIST for this attempt.
                Err(e) => self.calls.push(format!("(watch-list failed: {e})")),
            }
        }
        let synced = self.list()?;
        self.open_watch()?;
        Ok(synced)
    }

    fn list(&mut self) -> Result<Synced, String> {
        let from = self.rv.clone().unwrap_or_else(|| "0".into());
        let path = self.query(&format!("limit=500&resourceVersion={from}"));
        let reply = self.request(&path)?;
        let (rv, items) = decode_list_items(&reply)?;
        self.objects = items.iter().map(|(k, rv, _)| (k.clone(), *rv)).collect();
        self.bodies = items.into_iter().map(|(k, _, raw)| (k, raw)).collect();
        self.rv = Some(rv.clone());
        Ok(Synced {
            how: "list",
            rv,
            end_annotated: false,
            warnings: warnings(&reply.headers),
        })
    }

    fn request(&mut self, path: &str) -> Result<Reply, String> {
        let headers = self.headers();
        let reply = self.client.request("GET", path, &headers, &[]);
        let status = reply.as_ref().map_or(0, |r| r.status);
        self.calls.push(format!("GET {path} -> {status}"));
        let reply = reply.map_err(|e| format!("GET {path}: {e}"))?;
        if reply.status != 200 {
            return Err(format!(
                "GET {path}: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            ));
        }
        Ok(reply)
    }

    fn open(&mut self, path: String) -> Result<(), String> {
        let headers = self.headers();
        let stream = self.client.try_stream(&path, &headers);
        let status = stream.as_ref().map_or(0, |s| s.status);
        self.calls.push(format!("GET {path} -> {status}"));
        let stream = stream.map_err(|e| format!("GET {path}: {e}"))?;
        if stream.status != 200 {
            return Err(format!("GET {path}: {}", stream.status));
        }
        self.watch = Some(stream);
        self.pending.clear();
        Ok(())
    }

    /// A plain watch from the last resourceVersion.
    fn open_watch(&mut self) -> Result<(), String> {
        let rv = self.rv.clone().unwrap_or_else(|| "0".into());
        let path = self.query(&format!(
            "allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=300&watch=true"
        ));
        self.open(path)
    }

    fn watch_list(&mut self) -> Result<Synced, String> {
        let from = self
            .rv
            .as_ref()
            .map(|rv| format!("resourceVersion={rv}&"))
            .unwrap_or_default();
        let path = self.query(&format!(
            "allowWatchBookmarks=true&{from}resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=300&watch=true"
        ));
        self.open(path)?;
        let warnings = warnings(&self.watch.as_ref().expect("opened").headers);
        let mut set = BTreeMap::new();
        let mut bodies = BTreeMap::new();
        let deadline = Instant::now() + SYNC_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.watch = None;
                return Err("no initial-events-end bookmark in time".into());
            }
            let events = match self.read(left.min(Duration::from_secs(1))) {
                Ok(e) => e,
                Err(e) => {
                    self.watch = None;
                    return Err(format!("the streamed list ended before its end: {e}"));
                }
            };
            for (i, e) in events.iter().enumerate() {
                match e.kind.as_str() {
                    "ADDED" | "MODIFIED" => {
                        set.insert(e.key.clone(), rv_number(&e.rv));
                        bodies.insert(e.key.clone(), e.raw.clone());
                    }
                    "DELETED" => {
                        set.remove(&e.key);
                        bodies.remove(&e.key);
                    }
                    "BOOKMARK" if e.initial_events_end => {
                        self.objects = std::mem::take(&mut set);
                        self.bodies = std::mem::take(&mut bodies);
                        self.rv = Some(e.rv.clone());
                        // Events after the end in the same read are watch events.
                        let after: Vec<Event> = events[i + 1..].to_vec();
                        self.apply(&after)?;
                        return Ok(Synced {
                            how: "watch-list",
                            rv: e.rv.clone(),
                            end_annotated: true,
                            warnings,
                        });
                    }
                    "BOOKMARK" => {}
                    _ => {
                        self.watch = None;
                        return Err(format!("{} event in a streamed list", e.kind));
                    }
                }
            }
        }
    }

    /// Reads what the open watch sends for `wait`, applying it. A watch that ends is
    /// resumed from the last resourceVersion; Err when that resume (or the watch) failed,
    /// after which the reflector would `sync` again.
    pub fn pump(&mut self, wait: Duration) -> Result<(), String> {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.watch.is_none() {
                self.open_watch()?;
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.read(left.min(Duration::from_millis(500))) {
                Ok(events) => self.apply(&events)?,
                // Ended or cut: the reflector resumes with a plain watch.
                Err(_) => self.watch = None,
            }
        }
        Ok(())
    }

    fn apply(&mut self, events: &[Event]) -> Result<(), String> {
        for e in events {
            match e.kind.as_str() {
                "ADDED" | "MODIFIED" => {
                    self.objects.insert(e.key.clone(), rv_number(&e.rv));
                    self.bodies.insert(e.key.clone(), e.raw.clone());
                }
                "DELETED" => {
                    self.objects.remove(&e.key);
                    self.bodies.remove(&e.key);
                }
                "BOOKMARK" => {}
                other => {
                    self.watch = None;
                    return Err(format!("{other} event: the set must be listed again"));
                }
            }
            if !e.rv.is_empty() {
                self.rv = Some(e.rv.clone());
            }
        }
        Ok(())
    }

    /// The complete events the open watch delivers within `wait`; Err once it has ended
    /// (cleanly or not) with nothing more to give.
    fn read(&mut self, wait: Duration) -> Result<Vec<Event>, String> {
        let stream = self.watch.as_mut().ok_or("no watch open")?;
        match stream.next_chunk(wait) {
            Chunk::Data(bytes) => self.pending.extend_from_slice(&bytes),
            Chunk::Quiet => {}
            Chunk::Ended => return Err("ended".into()),
            Chunk::Cut => return Err("cut".into()),
        }
        let mut out = Vec::new();
        loop {
            let frame = if self.protobuf_stream() {
                let Some(len) = self.pending.get(..4) else {
                    break;
                };
                let n = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                if self.pending.len() < 4 + n {
                    break;
                }
                let frame: Vec<u8> = self.pending.drain(..4 + n).skip(4).collect();
                decode_protobuf_event(&frame)?
            } else {
                let Some(end) = self.pending.iter().position(|b| *b == b'\n') else {
                    break;
                };
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                decode_json_event(&line)?
            };
            out.push(frame);
        }
        Ok(out)
    }

    fn protobuf_stream(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| {
            w.headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("content-type")
                    && v.starts_with("application/vnd.kubernetes.protobuf")
            })
        })
    }
}

fn warnings(headers: &[(String, String)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("warning"))
        .map(|(_, v)| v.clone())
        .collect()
}

fn rv_number(rv: &str) -> u64 {
    rv.parse().unwrap_or(0)
}

fn key_of(meta: Option<&ObjectMeta>) -> (String, String) {
    let m = meta.cloned().unwrap_or_default();
    let key = match (m.namespace.unwrap_or_default(), m.name.unwrap_or_default()) {
        (_, name) if name.is_empty() => String::new(),
        (ns, name) => format!("{ns}/{name}"),
    };
    (key, m.resource_version.unwrap_or_default())
}

fn json_key(meta: &Value) -> (String, String) {
    let name = meta["name"].as_str().unwrap_or_default();
    let key = if name.is_empty() {
        String::new()
    } else {
        format!("{}/{name}", meta["namespace"].as_str().unwrap_or_default())
    };
    (
        key,
        meta["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn decode_json_event(line: &[u8]) -> Result<Event, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| {
        format!(
            "watch event not JSON ({e}): {}",
            String::from_utf8_lossy(line)
        )
    })?;
    let meta = &v["object"]["metadata"];
    let (key, rv) = json_key(meta);
    Ok(Event {
        kind: v["type"].as_str().unwrap_or_default().to_string(),
        key,
        rv,
        initial_events_end: meta["annotations"]["k8s.io/initial-events-end"] == "true",
        raw: serde_json::to_vec(&v["object"]).unwrap_or_default(),
    })
}

fn decode_protobuf_event(frame: &[u8]) -> Result<Event, String> {
    let e = WatchEvent::decode(frame).map_err(|e| format!("watch frame: {e}"))?;
    let raw = e.object.and_then(|o| o.raw).unwrap_or_default();
    let u = Unknown::decode(raw.strip_prefix(b"k8s\0").ok_or("no k8s envelope")?)
        .map_err(|e| format!("envelope: {e}"))?;
    let raw = u.raw.unwrap_or_default();
    let object = AnyObject::decode(raw.as_slice()).map_err(|e| format!("object: {e}"))?;
    let (key, rv) = key_of(object.metadata.as_ref());
    let initial_events_end = object
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.get("k8s.io/initial-events-end"))
        .is_some_and(|v| v == "true");
    Ok(Event {
        kind: e.r#type.unwrap_or_default(),
        key,
        rv,
        initial_events_end,
        raw,
    })
}

/// A list answer's resourceVersion and `namespace/name` → resourceVersion of its items.
pub fn decode_list(reply: &Reply) -> Result<(String, Vec<(String, u64)>), String> {
    let (rv, items) = decode_list_items(reply)?;
    Ok((rv, items.into_iter().map(|(k, rv, _)| (k, rv)).collect()))
}

/// A list item: `namespace/name`, resourceVersion and the object's own bytes (JSON, or its
/// protobuf message).
type ListItem = (String, u64, Vec<u8>);

/// A list answer's resourceVersion and its items.
fn decode_list_items(reply: &Reply) -> Result<(String, Vec<ListItem>), String> {
    let protobuf = reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
    let body = match reply.header("content-encoding") {
        Some("gzip") => {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(reply.body.as_slice())
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip: {e}"))?;
            out
        }
        _ => reply.body.clone(),
    };
    if protobuf {
        let u = Unknown::decode(body.strip_prefix(b"k8s\0").ok_or("no k8s envelope")?)
            .map_err(|e| format!("envelope: {e}"))?;
        let list = AnyList::decode(u.raw.unwrap_or_default().as_slice())
            .map_err(|e| format!("list: {e}"))?;
        let rv = list
            .metadata
            .and_then(|m| m.resource_version)
            .unwrap_or_default();
        let items = list
            .items
            .into_iter()
            .map(|raw| {
                let item = AnyObject::decode(raw.as_slice()).map_err(|e| format!("item: {e}"))?;
                let (k, rv) = key_of(item.metadata.as_ref());
                Ok((k, rv_number(&rv), raw))
            })
            .collect::<Result<_, String>>()?;
        Ok((rv, items))
    } else {
        let v: Value = serde_json::from_slice(&body).map_err(|e| format!("list JSON: {e}"))?;
        let items = v["items"]
            .as_array()
            .ok_or("no items")?
            .iter()
            .map(|i| {
                let (k, rv) = json_key(&i["metadata"]);
                (k, rv_number(&rv), serde_json::to_vec(i).unwrap_or_default())
            })
            .collect();
        Ok((
            v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            items,
        ))
    }
}

/// What a whole streamed-list answer (read to its end) held: the names its ADDED events
/// brought before the end bookmark, and that bookmark's resourceVersion (None when the
/// stream had no end).
pub fn initial_set(
    reply: &Reply,
) -> Result<(std::collections::BTreeSet<String>, Option<String>), String> {
    let protobuf = reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
    let mut events = Vec::new();
    let mut rest = reply.body.as_slice();
    while !rest.is_empty() {
        if protobuf {
            let n = u32::from_be_bytes(rest.get(..4).ok_or("a cut frame")?.try_into().unwrap())
                as usize;
            let frame = rest.get(4..4 + n).ok_or("a cut frame")?;
            events.push(decode_protobuf_event(frame)?);
            rest = &rest[4 + n..];
        } else {
            let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
            if end > 0 {
                events.push(decode_json_event(&rest[..end])?);
            }
            rest = rest.get(end + 1..).unwrap_or_default();
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for e in events {
        match e.kind.as_str() {
            "ADDED" => {
                names.insert(e.key.rsplit('/').next().unwrap_or_default().to_string());
            }
            "BOOKMARK" if e.initial_events_end => return Ok((names, Some(e.rv))),
            "BOOKMARK" => {}
            other => return Err(format!("{other} before the end of the initial events")),
        }
    }
    Ok((names, None))
}
