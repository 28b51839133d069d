//! Objects as the cloud returned them, sliced out of GET, LIST and WATCH bodies in JSON or
//! Kubernetes protobuf, with the metadata the cache indexes: name, namespace,
//! resourceVersion, labels and the fields that field selectors use. Protobuf is read
//! without its schema (see `kproto`); each item keeps its original bytes.
use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::scan;
use crate::{convert, kproto};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    /// The encoding of a response from its Content-Type (None: not cacheable).
    pub fn of_content_type(ct: &str) -> Option<Encoding> {
        let ct = ct.trim_start().as_bytes();
        let starts = |prefix: &str| {
            ct.get(..prefix.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(prefix.as_bytes()))
        };
        if starts("application/vnd.kubernetes.protobuf") {
            Some(Encoding::Protobuf)
        } else if starts("application/json") {
            Some(Encoding::Json)
        } else {
            None
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Protobuf => "application/vnd.kubernetes.protobuf",
        }
    }
}

/// One cached object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub namespace: String,
    pub rv: u64,
    pub labels: Vec<(String, String)>,
    /// Field-selector values, e.g. ("spec.nodeName", "edge-1").
    pub fields: Vec<(String, String)>,
    pub api_version: String,
    pub kind: String,
    pub encoding: Encoding,
    /// JSON: the object with apiVersion and kind set. Protobuf: the object's message bytes
    /// (the runtime.Unknown's raw, without the `k8s\0` envelope).
    pub body: Vec<u8>,
}

/// An object's body — JSON, or a protobuf message without its `k8s\0` envelope — with
/// `metadata.resourceVersion` set to `rv`.
pub fn with_resource_version(enc: Encoding, body: &[u8], rv: &str) -> Option<Vec<u8>> {
    match enc {
        Encoding::Json => {
            let mut v: Value = serde_json::from_slice(body).ok()?;
            v["metadata"]["resourceVersion"] = rv.into();
            serde_json::to_vec(&v).ok()
        }
        Encoding::Protobuf => kproto::with_resource_version(body, rv),
    }
}

impl Item {
    /// This object in the other encoding (hub::convert), or why it cannot be.
    pub fn converted(&self, to: Encoding) -> Result<Item, convert::ConvertError> {
        let body = match (self.encoding, to) {
            (Encoding::Json, Encoding::Json) | (Encoding::Protobuf, Encoding::Protobuf) => {
                self.body.clone()
            }
            (Encoding::Protobuf, Encoding::Json) => convert::message_to_json(
                &self.api_version,
                &self.kind,
                &self.body,
                convert::server_style(),
            )?,
            (Encoding::Json, Encoding::Protobuf) => {
                let enveloped = convert::to_protobuf(&self.body)?;
                kproto::unwrap(&enveloped)
                    .ok_or(convert::ConvertError::NotProtobuf)?
                    .raw
                    .to_vec()
            }
        };
        Ok(Item {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            rv: self.rv,
            labels: self.labels.clone(),
            fields: self.fields.clone(),
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            encoding: to,
            body,
        })
    }

    /// This object in `enc`: itself, or converted (None, with a warning, when it cannot be).
    pub fn in_encoding(&self, enc: Encoding) -> Option<Cow<'_, Item>> {
        if self.encoding == enc {
            return Some(Cow::Borrowed(self));
        }
        match self.converted(enc) {
            Ok(item) => Some(Cow::Owned(item)),
            Err(e) => {
                tracing::warn!(
                    "{}/{}: not converted to {}: {e}",
                    self.namespace,
                    self.name,
                    enc.content_type()
                );
                None
            }
        }
    }

    /// Whether `in_encoding(enc)` can give this object: held so, or of a kind with a schema.
    pub fn can_be(&self, enc: Encoding) -> bool {
        self.encoding == enc || convert::has_schema(&self.api_version, &self.kind)
    }

    /// This object as kube-apiserver keeps it in etcd: protobuf for the kinds with a schema,
    /// JSON for the rest (custom resources). A JSON object that does not convert is kept as
    /// it is (and said so: the Err carries why, beside the object).
    pub fn for_storage(self) -> (Item, Option<convert::ConvertError>) {
        if self.encoding == Encoding::Protobuf
            || !convert::has_schema(&self.api_version, &self.kind)
        {
            return (self, None);
        }
        match self.converted(Encoding::Protobuf) {
            Ok(item) => (item, None),
            Err(e) => (self, Some(e)),
        }
    }

    /// The object as a client (or etcd) receives it: the JSON body, or the protobuf
    /// message in its `k8s\0` envelope.
    pub fn encoded(&self) -> Vec<u8> {
        match self.encoding {
            Encoding::Json => self.body.clone(),
            Encoding::Protobuf => kproto::envelope(&self.api_version, &self.kind, &self.body),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("malformed {0} body")]
    Malformed(&'static str),
    #[error("object name {0:?} cannot be cached (empty, '.', '..', '/', NUL or too long)")]
    BadName(String),
    #[error("resourceVersion {0:?} is not a number")]
    BadResourceVersion(String),
    #[error("a Table or Status is not an object to cache")]
    NotAnObject,
}

/// Field selectors the cache can answer, per resource, beyond metadata.name/namespace:
/// (resource, selector name, JSON path, protobuf field path).
const FIELDS: &[(&str, &str, &str, &[u64])] = &[
    ("pods", "spec.nodeName", "spec.nodeName", &[2, 10]),
    ("pods", "spec.restartPolicy", "spec.restartPolicy", &[2, 3]),
    ("pods", "spec.schedulerName", "spec.schedulerName", &[2, 19]),
    (
        "pods",
        "spec.serviceAccountName",
        "spec.serviceAccountName",
        &[2, 8],
    ),
    ("pods", "status.phase", "status.phase", &[3, 1]),
    ("pods", "status.podIP", "status.podIP", &[3, 6]),
    (
        "pods",
        "status.nominatedNodeName",
        "status.nominatedNodeName",
        &[3, 11],
    ),
    (
        "events",
        "involvedObject.kind",
        "involvedObject.kind",
        &[2, 1],
    ),
    (
        "events",
        "involvedObject.namespace",
        "involvedObject.namespace",
        &[2, 2],
    ),
    (
        "events",
        "involvedObject.name",
        "involvedObject.name",
        &[2, 3],
    ),
    (
        "events",
        "involvedObject.uid",
        "involvedObject.uid",
        &[2, 4],
    ),
    (
        "events",
        "involvedObject.apiVersion",
        "involvedObject.apiVersion",
        &[2, 5],
    ),
    (
        "events",
        "involvedObject.resourceVersion",
        "involvedObject.resourceVersion",
        &[2, 6],
    ),
    (
        "events",
        "involvedObject.fieldPath",
        "involvedObject.fieldPath",
        &[2, 7],
    ),
    ("events", "reason", "reason", &[3]),
    ("events", "type", "type", &[9]),
    ("events", "source", "source.component", &[5, 1]),
    ("secrets", "type", "type", &[3]),
    ("services", "spec.clusterIP", "spec.clusterIP", &[2, 3]),
    ("services", "spec.type", "spec.type", &[2, 4]),
    ("namespaces", "status.phase", "status.phase", &[3, 1]),
    ("nodes", "spec.unschedulable", "spec.unschedulable", &[2, 4]),
];

/// Whether a field selector on `field` can be answered for `resource` from the cache.
/// The kind of a well-known resource, for answers that have no object to take it from
/// (an empty list, a bookmark on an empty watch); "" for others.
pub fn kind_for(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "nodes" => "Node",
        "services" => "Service",
        "endpoints" => "Endpoints",
        "endpointslices" => "EndpointSlice",
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        "namespaces" => "Namespace",
        "leases" => "Lease",
        "events" => "Event",
        "serviceaccounts" => "ServiceAccount",
        "persistentvolumeclaims" => "PersistentVolumeClaim",
        "persistentvolumes" => "PersistentVolume",
        "csinodes" => "CSINode",
        "csidrivers" => "CSIDriver",
        "csistoragecapacities" => "CSIStorageCapacity",
        "storageclasses" => "StorageClass",
        "volumeattachments" => "VolumeAttachment",
        "runtimeclasses" => "RuntimeClass",
        "priorityclasses" => "PriorityClass",
        "limitranges" => "LimitRange",
        "resourcequotas" => "ResourceQuota",
        "replicationcontrollers" => "ReplicationController",
        "podtemplates" => "PodTemplate",
        "deployments" => "Deployment",
        "replicasets" => "ReplicaSet",
        "daemonsets" => "DaemonSet",
        "statefulsets" => "StatefulSet",
        "jobs" => "Job",
        "cronjobs" => "CronJob",
        "ingresses" => "Ingress",
        "ingressclasses" => "IngressClass",
        "networkpolicies" => "NetworkPolicy",
        "poddisruptionbudgets" => "PodDisruptionBudget",
        "certificatesigningrequests" => "CertificateSigningRequest",
        "customresourcedefinitions" => "CustomResourceDefinition",
        "mutatingwebhookconfigurations" => "MutatingWebhookConfiguration",
        "validatingwebhookconfigurations" => "ValidatingWebhookConfiguration",
        "clusterroles" => "ClusterRole",
        "clusterrolebindings" => "ClusterRoleBinding",
        "roles" => "Role",
        "rolebindings" => "RoleBinding",
        _ => "",
    }
}

pub fn supports_field(resource: &str, field: &str) -> bool {
    matches!(field, "metadata.name" | "metadata.namespace")
        || FIELDS
            .iter()
            .any(|(r, f, _, _)| *r == resource && *f == field)
}

/// A name or namespace that can never be a path trick or break a store key.
pub fn valid_name(n: &str) -> bool {
    n.len() <= 253 && n != "." && n != ".." && !n.contains(['/', '\0'])
}

fn parse_rv(rv: &str) -> Result<u64, ParseError> {
    if rv.is_empty() {
        return Ok(0);
    }
    rv.parse()
        .map_err(|_| ParseError::BadResourceVersion(rv.to_string()))
}

fn checked(item: Item) -> Result<Item, ParseError> {
    if item.name.is_empty() || !valid_name(&item.name) {
        return Err(ParseError::BadName(item.name));
    }
    if !valid_name(&item.namespace) {
        return Err(ParseError::BadName(item.namespace));
    }
    Ok(item)
}

fn json_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// An object from its JSON form; list items lack apiVersion/kind, so defaults are given.
pub fn from_json(
    resource: &str,
    mut obj: Value,
    default_api_version: &str,
    default_kind: &str,
) -> Result<Item, ParseError> {
    let map = obj.as_object_mut().ok_or(ParseError::Malformed("JSON"))?;
    for (key, default) in [("apiVersion", default_api_version), ("kind", default_kind)] {
        if map
            .get(key)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
            && !default.is_empty()
        {
            map.insert(key.into(), Value::String(default.into()));
        }
    }
    let kind = json_str(&obj["kind"]);
    if kind == "Table" || kind == "Status" {
        return Err(ParseError::NotAnObject);
    }
    let meta = &obj["metadata"];
    let labels = meta["labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), json_str(v))).collect())
        .unwrap_or_default();
    let mut fields = Vec::new();
    for (r, name, path, _) in FIELDS {
        if *r == resource {
            let v = path.split('.').fold(&obj, |v, seg| &v[seg]);
            fields.push((name.to_string(), json_str(v)));
        }
    }
    let item = Item {
        name: json_str(&meta["name"]),
        namespace: json_str(&meta["namespace"]),
        rv: parse_rv(meta["resourceVersion"].as_str().unwrap_or_default())?,
        labels,
        fields,
        api_version: json_str(&obj["apiVersion"]),
        kind,
        encoding: Encoding::Json,
        body: serde_json::to_vec(&obj).map_err(|_| ParseError::Malformed("JSON"))?,
    };
    checked(item)
}

/// The value at a protobuf field path, as a selector compares it.
fn pb_field(raw: &[u8], path: &[u64]) -> String {
    let mut msg = raw;
    for (i, tag) in path.iter().enumerate() {
        let Some(fields) = kproto::fields(msg) else {
            return String::new();
        };
        let Some((_, v)) = fields.iter().rev().find(|(n, _)| n == tag) else {
            return String::new();
        };
        match v {
            kproto::Value::Bytes(b) if i + 1 < path.len() => msg = b,
            kproto::Value::Bytes(b) => return String::from_utf8_lossy(b).into_owned(),
            kproto::Value::Varint(n) => return (*n != 0).to_string(),
            _ => return String::new(),
        }
    }
    String::new()
}

/// An object from its protobuf message bytes (a list item, or an Unknown's raw).
pub fn from_protobuf(
    resource: &str,
    api_version: &str,
    kind: &str,
    raw: &[u8],
) -> Result<Item, ParseError> {
    let meta = kproto::object_meta(raw).ok_or(ParseError::Malformed("protobuf"))?;
    let fields = FIELDS
        .iter()
        .filter(|(r, ..)| *r == resource)
        .map(|(_, name, _, path)| (name.to_string(), pb_field(raw, path)))
        .collect();
    checked(Item {
        rv: parse_rv(&meta.resource_version)?,
        name: meta.name,
        namespace: meta.namespace,
        labels: meta.labels,
        fields,
        api_version: api_version.into(),
        kind: kind.into(),
        encoding: Encoding::Protobuf,
        body: raw.to_vec(),
    })
}

/// Which object a JSON answer is, and at which resourceVersion.
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    pub namespace: String,
    pub name: String,
    pub rv: u64,
}

#[derive(Deserialize, Default)]
struct PeekMeta<'a> {
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    namespace: Cow<'a, str>,
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Cow<'a, str>,
}

/// The identity of a JSON object without building it: a scan that keeps only metadata's
/// name, namespace and resourceVersion, so that an answer the cache already holds costs a
/// fraction of a full parse. None if it is not a JSON object with those.
///
/// The scan stops at metadata (the apiserver writes it before spec and status), so the
/// rest of the body is not checked: a caller that stores the object parses it in full.
pub fn identify_json(body: &[u8]) -> Option<Identity> {
    let mut found = None;
    // Stopping early leaves the object unfinished, which serde_json reports as an error;
    // what was found before it is what counts.
    let _ = serde::de::DeserializeSeed::deserialize(
        MetadataOnly(&mut found),
        &mut serde_json::Deserializer::from_slice(body),
    );
    identity_of(found?)
}

fn identity_of(m: PeekMeta) -> Option<Identity> {
    Some(Identity {
        rv: parse_rv(&m.resource_version).ok().filter(|rv| *rv > 0)?,
        namespace: m.namespace.into_owned(),
        name: Some(m.name).filter(|n| !n.is_empty())?.into_owned(),
    })
}

/// The identity of a protobuf object (its message bytes, no envelope) from its
/// ObjectMeta alone.
pub fn identify_protobuf(raw: &[u8]) -> Option<Identity> {
    let (name, namespace, rv) = kproto::object_identity(raw)?;
    Some(Identity {
        rv: parse_rv(rv).ok().filter(|rv| *rv > 0)?,
        namespace: namespace.to_string(),
        name: Some(name).filter(|n| !n.is_empty())?.to_string(),
    })
}

/// The identity of the object an ADDED or MODIFIED watch event carries, by the same
/// scans; None for other events (a deletion is always applied in full) and when the event
/// does not name its type before its object (kube-apiserver does).
pub fn identify_event(enc: Encoding, frame: &[u8]) -> Option<Identity> {
    match enc {
        Encoding::Json => {
            let mut found = None;
            let _ = serde::de::DeserializeSeed::deserialize(
                ChangeEvent(&mut found),
                &mut serde_json::Deserializer::from_slice(frame),
            );
            identity_of(found?)
        }
        Encoding::Protobuf => {
            let e = kproto::watch_event(frame)?;
            if !matches!(e.kind.as_str(), "ADDED" | "MODIFIED") {
                return None;
            }
            identify_protobuf(kproto::unwrap(e.object)?.raw)
        }
    }
}

/// Reads a JSON watch event's `type`, then, for ADDED and MODIFIED, its object's metadata.
struct ChangeEvent<'s, 'a>(&'s mut Option<PeekMeta<'a>>);

impl<'de, 's> serde::de::DeserializeSeed<'de> for ChangeEvent<'s, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 's> serde::de::Visitor<'de> for ChangeEvent<'s, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a watch event")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut change = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "type" => {
                    let ty = map.next_value::<Cow<'de, str>>()?;
                    change = matches!(ty.as_ref(), "ADDED" | "MODIFIED");
                }
                "object" if change => {
                    return map.next_value_seed(MetadataOnly(self.0));
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }
}

/// Reads a JSON object's keys up to `metadata`, skipping other values unparsed.
struct MetadataOnly<'s, 'a>(&'s mut Option<PeekMeta<'a>>);

impl<'de, 's> serde::de::DeserializeSeed<'de> for MetadataOnly<'s, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 's> serde::de::Visitor<'de> for MetadataOnly<'s, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "metadata" {
                *self.0 = Some(map.next_value()?);
                return Ok(());
            }
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

/// A GET answer.
pub fn parse_object(resource: &str, enc: Encoding, body: &[u8]) -> Result<Item, ParseError> {
    match enc {
        Encoding::Json => {
            let v: Value =
                serde_json::from_slice(body).map_err(|_| ParseError::Malformed("JSON"))?;
            from_json(resource, v, "", "")
        }
        Encoding::Protobuf => {
            let u = kproto::unwrap(body).ok_or(ParseError::Malformed("protobuf"))?;
            from_protobuf(resource, &u.api_version, &u.kind, u.raw)
        }
    }
}

/// A LIST answer sliced into items; `bad` counts items that could not be cached.
#[derive(Debug)]
pub struct ParsedList {
    /// The list's own kind (`PodList`).
    pub kind: String,
    pub rv: u64,
    pub continue_token: String,
    /// Items parsed in full.
    pub items: Vec<Item>,
    /// Items only named (namespace, name): the caller already holds them at their
    /// resourceVersion.
    pub held: Vec<(String, String)>,
    pub bad: usize,
}

fn item_kind(list_kind: &str) -> &str {
    list_kind.strip_suffix("List").unwrap_or_default()
}

/// A whole LIST answer, every item parsed.
pub fn parse_list(resource: &str, enc: Encoding, body: &[u8]) -> Result<ParsedList, ParseError> {
    parse_list_pieces(resource, enc, &[Bytes::copy_from_slice(body)], |_| false)
}

/// A LIST answer from the pieces it arrived in. Each item is first named by a metadata
/// scan; those `held` says the caller already has are not parsed further.
pub fn parse_list_pieces(
    resource: &str,
    enc: Encoding,
    parts: &[Bytes],
    mut held: impl FnMut(&Identity) -> bool,
) -> Result<ParsedList, ParseError> {
    let list = match enc {
        Encoding::Json => scan::json_list(parts).map_err(|_| ParseError::Malformed("JSON list"))?,
        Encoding::Protobuf => {
            scan::protobuf_list(parts).map_err(|_| ParseError::Malformed("protobuf list"))?
        }
    };
    if list.kind == "Table" || !list.kind.ends_with("List") {
        return Err(ParseError::NotAnObject);
    }
    let kind = item_kind(&list.kind);
    let mut out = ParsedList {
        rv: parse_rv(&list.rv)?,
        kind: list.kind.clone(),
        continue_token: list.continue_token,
        items: Vec::new(),
        held: Vec::new(),
        bad: 0,
    };
    for scan::ScannedItem { raw, identity } in list.items {
        let id = match (identity, enc) {
            (Some((namespace, name, rv)), _) => parse_rv(&rv)
                .ok()
                .filter(|rv| *rv > 0 && !name.is_empty())
                .map(|rv| Identity {
                    namespace,
                    name,
                    rv,
                }),
            (None, Encoding::Json) => identify_json(&raw),
            (None, Encoding::Protobuf) => identify_protobuf(&raw),
        };
        if let Some(id) = id.filter(|id| held(id)) {
            out.held.push((id.namespace, id.name));
            continue;
        }
        let item = match enc {
            Encoding::Json => serde_json::from_slice(&raw)
                .map_err(|_| ParseError::Malformed("JSON"))
                .and_then(|v| from_json(resource, v, &list.api_version, kind)),
            Encoding::Protobuf => from_protobuf(resource, &list.api_version, kind, &raw),
        };
        match item {
            Ok(i) => out.items.push(i),
            Err(_) => out.bad += 1,
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    /// ERROR (e.g. 410 Gone) or anything unknown: nothing to apply.
    Other,
}

impl EventType {
    fn carries_object(self) -> bool {
        matches!(
            self,
            EventType::Added | EventType::Modified | EventType::Deleted
        )
    }

    fn parse(s: &str) -> EventType {
        match s {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => EventType::Bookmark,
            _ => EventType::Other,
        }
    }
}

/// A JSON watch event, its object left as sent.
#[derive(serde::Deserialize)]
struct JsonEvent<'a> {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(borrow, default)]
    object: Option<&'a serde_json::value::RawValue>,
}

/// One watch event: a JSON line, or a protobuf frame without its length prefix.
pub fn parse_event(
    resource: &str,
    enc: Encoding,
    frame: &[u8],
) -> Result<(EventType, Option<Item>), ParseError> {
    let (ty, item) = match enc {
        Encoding::Json => {
            let e: JsonEvent<'_> =
                serde_json::from_slice(frame).map_err(|_| ParseError::Malformed("JSON event"))?;
            let ty = EventType::parse(&e.kind);
            let item = ty.carries_object().then(|| {
                let raw = e.object.ok_or(ParseError::Malformed("JSON event"))?.get();
                let v: Value =
                    serde_json::from_str(raw).map_err(|_| ParseError::Malformed("JSON event"))?;
                // An event's object names its own kind: the item keeps the bytes the cloud
                // sent (re-serialized, its keys would come out sorted).
                let mut item = from_json(resource, v, "", "")?;
                item.body = raw.as_bytes().to_vec();
                Ok(item)
            });
            (ty, item)
        }
        Encoding::Protobuf => {
            let e = kproto::watch_event(frame).ok_or(ParseError::Malformed("protobuf event"))?;
            let ty = EventType::parse(&e.kind);
            let item = ty
                .carries_object()
                .then(|| parse_object(resource, Encoding::Protobuf, e.object));
            (ty, item)
        }
    };
    Ok((ty, item.transpose()?))
}

/// The annotation kube-apiserver puts on the BOOKMARK that ends a streamed list's initial
/// events (`watch?sendInitialEvents=true`): the ADDED events before it are the whole set.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The type of a watch event, read without its object (kube-apiserver writes the type
/// first; any other order is read too, only slower). `Other` for what is not an event.
pub fn event_type(enc: Encoding, frame: &[u8]) -> EventType {
    match enc {
        Encoding::Json => {
            let mut ty = None;
            let _ = serde::de::DeserializeSeed::deserialize(
                TypeOnly(&mut ty),
                &mut serde_json::Deserializer::from_slice(frame),
            );
            ty.map_or(EventType::Other, |t: String| EventType::parse(&t))
        }
        Encoding::Protobuf => {
            kproto::watch_event(frame).map_or(EventType::Other, |e| EventType::parse(&e.kind))
        }
    }
}

/// Reads a JSON watch event's keys up to `type`.
struct TypeOnly<'s>(&'s mut Option<String>);

impl<'de> serde::de::DeserializeSeed<'de> for TypeOnly<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TypeOnly<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a watch event")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "type" {
                *self.0 = Some(map.next_value::<Cow<'de, str>>()?.into_owned());
                return Ok(());
            }
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

/// What a BOOKMARK event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookmark {
    /// The resourceVersion the stream has reached.
    pub rv: u64,
    /// It ends a streamed list's initial events (annotated [`INITIAL_EVENTS_END`]).
    pub initial_events_end: bool,
    /// The kind of the watched objects (`Pod`), as the bookmark's object names it.
    pub kind: String,
}

/// Reads a BOOKMARK event; None for any other event or a malformed one.
pub fn bookmark(enc: Encoding, frame: &[u8]) -> Option<Bookmark> {
    match enc {
        Encoding::Json => {
            let v: Value = serde_json::from_slice(frame).ok()?;
            (v["type"] == "BOOKMARK").then_some(())?;
            let object = &v["object"];
            let meta = &object["metadata"];
            Some(Bookmark {
                rv: parse_rv(meta["resourceVersion"].as_str()?).ok()?,
                initial_events_end: meta["annotations"][INITIAL_EVENTS_END] == "true",
                kind: object["kind"].as_str().unwrap_or_default().to_string(),
            })
        }
        Encoding::Protobuf => {
            let e = kproto::watch_event(frame)?;
            (e.kind == "BOOKMARK").then_some(())?;
            let u = kproto::unwrap(e.object)?;
            let (rv, annotations) = kproto::object_version_and_annotations(u.raw)?;
            Some(Bookmark {
                rv: parse_rv(&rv).ok()?,
                initial_events_end: annotations
                    .iter()
                    .any(|(k, v)| k == INITIAL_EVENTS_END && v == "true"),
                kind: u.kind,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_list_items_get_kind_fields_and_labels() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c1"},
          "items":[{"metadata":{"name":"a","namespace":"ns1","resourceVersion":"40","labels":{"app":"web"}},
                    "spec":{"nodeName":"n1"},"status":{"phase":"Running"}},
                   {"metadata":{"name":"../x","namespace":"ns1","resourceVersion":"41"}}]}"#;
        let l = parse_list("pods", Encoding::Json, body).unwrap();
        assert_eq!((l.rv, l.continue_token.as_str(), l.bad), (42, "c1", 1));
        let a = &l.items[0];
        assert_eq!(
            (a.kind.as_str(), a.api_version.as_str(), a.rv),
            ("Pod", "v1", 40)
        );
        assert!(a.fields.contains(&("spec.nodeName".into(), "n1".into())));
        assert!(
            a.fields
                .contains(&("status.phase".into(), "Running".into()))
        );
        assert_eq!(a.labels, vec![("app".into(), "web".into())]);
        let v: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["kind"], "Pod");
    }

    #[test]
    fn encodings_from_content_types() {
        for (ct, enc) in [
            ("application/json", Some(Encoding::Json)),
            (" Application/JSON;charset=utf-8", Some(Encoding::Json)),
            (
                "application/vnd.kubernetes.protobuf;stream=watch",
                Some(Encoding::Protobuf),
            ),
            (
                "application/json;as=Table;g=meta.k8s.io;v=v1",
                Some(Encoding::Json),
            ),
            ("application/yaml", None),
            ("application/jso", None),
            ("", None),
        ] {
            assert_eq!(Encoding::of_content_type(ct), enc, "{ct}");
        }
    }

    #[test]
    fn identity_without_a_full_parse_agrees_with_it() {
        let body = br#"{"kind":"Pod","apiVersion":"v1","spec":{"x":[1,{"y":"z"}]},
          "metadata":{"name":"a\u002db","namespace":"ns1","resourceVersion":"40","labels":{"k":"v"}}}"#;
        let id = identify_json(body).unwrap();
        let item = parse_object("pods", Encoding::Json, body).unwrap();
        assert_eq!(
            (id.namespace, id.name, id.rv),
            (item.namespace, item.name, item.rv)
        );
        let cluster = br#"{"kind":"Node","metadata":{"name":"n1","resourceVersion":"7"}}"#;
        assert_eq!(identify_json(cluster).unwrap().namespace, "");
        // The scan ends at metadata: what follows is left to the full parse.
        let cut = br#"{"kind":"Pod","metadata":{"name":"a","resourceVersion":"3"},"spec":{"#;
        assert_eq!(identify_json(cut).unwrap().rv, 3);
        assert!(parse_object("pods", Encoding::Json, cut).is_err());
        for unknown in [
            &br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}"#[..],
            br#"{"kind":"Pod","metadata":{"name":"a","resourceVersion":"x"}}"#,
            br#"{"kind":"Pod","metadata":{"name":"a"}}"#,
            br#"{"kind":"Pod","metadata":{"name":"","resourceVersion":"3"}}"#,
            b"[1,2]",
            b"{not json",
        ] {
            assert_eq!(
                identify_json(unknown),
                None,
                "{}",
                String::from_utf8_lossy(unknown)
            );
        }
    }

    #[test]
    fn events_are_named_without_a_full_parse() {
        let id = |ns: &str, name: &str, rv| {
            Some(Identity {
                namespace: ns.into(),
                name: name.into(),
                rv,
            })
        };
        let modified = br#"{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"a","namespace":"d","resourceVersion":"9"},"spec":{}}}"#;
        assert_eq!(identify_event(Encoding::Json, modified), id("d", "a", 9));
        for other in [
            &br#"{"type":"DELETED","object":{"metadata":{"name":"a","namespace":"d","resourceVersion":"9"}}}"#[..],
            br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#,
            br#"{"object":{"metadata":{"name":"a","namespace":"d","resourceVersion":"9"}},"type":"ADDED"}"#,
            b"{not json",
        ] {
            assert_eq!(identify_event(Encoding::Json, other), None, "{}", String::from_utf8_lossy(other));
        }
        let mut meta = Vec::new();
        kproto::put_bytes(&mut meta, 1, b"p");
        kproto::put_bytes(&mut meta, 3, b"ns");
        kproto::put_bytes(&mut meta, 6, b"12");
        let mut pod = Vec::new();
        kproto::put_bytes(&mut pod, 1, &meta);
        let object = kproto::envelope("v1", "Pod", &pod);
        for (ty, expected) in [("ADDED", id("ns", "p", 12)), ("DELETED", None)] {
            let frame = kproto::watch_frame(ty, &object);
            assert_eq!(
                identify_event(Encoding::Protobuf, &frame[4..]),
                expected,
                "{ty}"
            );
        }
    }

    #[test]
    fn list_items_the_caller_holds_are_named_not_parsed() {
        let list = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"50"},"items":[
            {"metadata":{"name":"a","namespace":"d","resourceVersion":"10"},"spec":{"nodeName":"n1"}},
            {"metadata":{"name":"b","namespace":"d","resourceVersion":"11"},"spec":{"nodeName":"n2"}}]}"#;
        let pieces: Vec<Bytes> = list.chunks(17).map(Bytes::copy_from_slice).collect();
        let page = parse_list_pieces("pods", Encoding::Json, &pieces, |id| id.name == "a").unwrap();
        assert_eq!(page.held, [("d".to_string(), "a".to_string())]);
        assert_eq!(page.items.len(), 1);
        assert_eq!(
            (page.items[0].name.as_str(), page.items[0].kind.as_str()),
            ("b", "Pod")
        );
        assert_eq!(
            page.items[0].fields[0],
            ("spec.nodeName".to_string(), "n2".to_string())
        );
        let all = parse_list("pods", Encoding::Json, list).unwrap();
        assert_eq!((all.items.len(), all.held.len(), all.rv), (2, 0, 50));
    }

    #[test]
    fn tables_and_bad_bodies_are_refused() {
        let table = br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","rows":[]}"#;
        assert_eq!(
            parse_list("pods", Encoding::Json, table).unwrap_err(),
            ParseError::NotAnObject
        );
        assert!(parse_object("pods", Encoding::Json, b"{not json").is_err());
        assert!(parse_object("pods", Encoding::Protobuf, b"k8s\0\xff\xff").is_err());
        let bad_rv =
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"x"}}"#;
        assert!(matches!(
            parse_object("pods", Encoding::Json, bad_rv),
            Err(ParseError::BadResourceVersion(_))
        ));
        let nul = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a\u0000b"}}"#;
        assert!(matches!(
            parse_object("pods", Encoding::Json, nul),
            Err(ParseError::BadName(_))
        ));
    }

    #[test]
    fn json_events() {
        let (ty, item) = parse_event(
            "pods",
            Encoding::Json,
            br#"{"type":"DELETED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"7"}}}"#,
        )
        .unwrap();
        assert_eq!((ty, item.unwrap().rv), (EventType::Deleted, 7));
        let (ty, item) = parse_event(
            "pods",
            Encoding::Json,
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#,
        )
        .unwrap();
        assert_eq!((ty, item), (EventType::Bookmark, None));
    }
}
