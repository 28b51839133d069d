//! Kubernetes protobuf <-> JSON for the built-in kinds a node reads, as kube-apiserver
//! converts them (design.md §6): so a JSON client (kubectl) can read what a protobuf client
//! (the kubelet) cached, and the other way round, without asking the cloud.
//!
//! The schema is a generated table (schema_table.rs, `cargo xtask kube-schema`) walked over
//! kproto's field reader: no typed decode, no per-kind code. Kinds without a schema (custom
//! resources) are not converted. Fields a newer Kubernetes added are left out and counted.

pub mod schema;
#[rustfmt::skip]
mod schema_table;
mod to_json;
mod to_protobuf;

use schema::Message;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("{0} has no schema in this hub; it is kept in the encoding it came in")]
    NoSchema(String),
    #[error("not a Kubernetes protobuf object")]
    NotProtobuf,
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("malformed object: {0}")]
    Malformed(String),
}

/// What differs between kube-apiserver versions' JSON for the same object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// 1.34 and later leave a zero `metadata.creationTimestamp` out; older ones write `null`.
    pub omit_zero_structs: bool,
}

impl Style {
    /// The JSON of the kube-apiserver whose minor version is `minor` (1.`minor`).
    pub fn for_minor(minor: u32) -> Style {
        Style {
            omit_zero_structs: minor >= 34,
        }
    }
}

impl Default for Style {
    /// The current kube-apiserver's.
    fn default() -> Self {
        Style::for_minor(u32::MAX)
    }
}

/// The cloud's minor version, from its last `/version` answer (0: not seen yet).
static SERVER_MINOR: AtomicU32 = AtomicU32::new(0);

/// Notes the cloud's version from a `/version` answer (`{"major":"1","minor":"32+",…}`), so
/// conversions write that version's JSON.
pub fn note_server_version(body: &[u8]) {
    let minor = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let m = v.get("minor")?.as_str()?;
            m.trim_end_matches('+').parse::<u32>().ok()
        });
    if let Some(m) = minor {
        SERVER_MINOR.store(m, Ordering::Relaxed);
    }
}

/// The JSON style of the cloud this hub last saw, the current one before it saw any.
pub fn server_style() -> Style {
    match SERVER_MINOR.load(Ordering::Relaxed) {
        0 => Style::default(),
        m => Style::for_minor(m),
    }
}

/// A protobuf object's message bytes (no envelope) as JSON.
pub fn message_to_json(
    api_version: &str,
    kind: &str,
    raw: &[u8],
    style: Style,
) -> Result<Vec<u8>, ConvertError> {
    let mut out = String::with_capacity(raw.len() * 2);
    object_json(api_version, kind, raw, &mut out, style)?;
    Ok(out.into_bytes())
}

/// Every kind with a schema.
pub fn kinds() -> &'static [schema::Kind] {
    schema_table::KINDS
}

/// A message of the schema, by its index (`Type::Message`, `Kind::message`).
pub fn message(index: u16) -> &'static Message {
    &schema_table::MESSAGES[usize::from(index)]
}

fn kind_message(api_version: &str, kind: &str) -> Result<&'static Message, ConvertError> {
    schema_table::KINDS
        .iter()
        .find(|k| k.api_version == api_version && k.kind == kind)
        .map(|k| message(k.message))
        .ok_or_else(|| ConvertError::NoSchema(format!("{api_version} {kind}")))
}

/// The schema's message of a kind, by index (what the patch walkers start from).
pub fn kind_index(api_version: &str, kind: &str) -> Option<u16> {
    schema_table::KINDS
        .iter()
        .find(|k| k.api_version == api_version && k.kind == kind)
        .map(|k| k.message)
}

/// A field of message `index` by its JSON name, looking into structs Go inlines: the
/// message that declares it (for `merge_key`) and the field.
pub fn json_field(index: u16, name: &str) -> Option<(u16, &'static schema::Field)> {
    let msg = message(index);
    if let Some(f) = msg.fields.iter().find(|f| f.json == name) {
        return Some((index, f));
    }
    msg.fields
        .iter()
        .filter(|f| f.flags & schema::INLINE != 0)
        .find_map(|f| match f.ty {
            schema::Type::Message(inner) => json_field(inner, name),
            _ => None,
        })
}

/// The key a strategic merge patch matches the elements of list `tag` of message `index`
/// by, if it merges them by one.
pub fn merge_key(index: u16, tag: u32) -> Option<&'static str> {
    schema_table::MERGE_KEYS
        .binary_search_by(|(m, t, _)| (*m, *t).cmp(&(index, tag)))
        .ok()
        .map(|i| schema_table::MERGE_KEYS[i].2)
}

/// Whether objects of this kind (or its list) can be converted.
pub fn has_schema(api_version: &str, kind: &str) -> bool {
    kind_message(api_version, kind).is_ok()
}

/// An enveloped protobuf object or list (`k8s\0` + runtime.Unknown) as kube-apiserver's JSON.
pub fn to_json(enveloped: &[u8], style: Style) -> Result<Vec<u8>, ConvertError> {
    let unknown = crate::kproto::unwrap(enveloped).ok_or(ConvertError::NotProtobuf)?;
    let mut out = String::with_capacity(enveloped.len() * 2);
    object_json(
        &unknown.api_version,
        &unknown.kind,
        unknown.raw,
        &mut out,
        style,
    )?;
    Ok(out.into_bytes())
}

fn object_json(
    api_version: &str,
    kind: &str,
    raw: &[u8],
    out: &mut String,
    style: Style,
) -> Result<(), ConvertError> {
    let msg = kind_message(api_version, kind)?;
    CONVERSIONS.fetch_add(1, Ordering::Relaxed);
    let mut obj = to_json::Object::open(out);
    to_json::write_str(obj.key("kind"), kind);
    to_json::write_str(obj.key("apiVersion"), api_version);
    to_json::members(msg, raw, &mut obj, style)?;
    obj.close();
    Ok(())
}

/// One protobuf watch event (a raw WatchEvent, the frame without its length) as the JSON
/// line kube-apiserver writes for it, newline included.
pub fn watch_event_to_json(event: &[u8], style: Style) -> Result<Vec<u8>, ConvertError> {
    let e = crate::kproto::watch_event(event).ok_or(ConvertError::NotProtobuf)?;
    let object = crate::kproto::unwrap(e.object).ok_or(ConvertError::NotProtobuf)?;
    let mut out = String::with_capacity(event.len() * 2);
    let mut obj = to_json::Object::open(&mut out);
    to_json::write_str(obj.key("type"), &e.kind);
    object_json(
        &object.api_version,
        &object.kind,
        object.raw,
        obj.key("object"),
        style,
    )?;
    obj.close();
    out.push('\n');
    Ok(out.into_bytes())
}

/// A JSON object or list (with its kind and apiVersion) as an enveloped protobuf one.
pub fn to_protobuf(json: &[u8]) -> Result<Vec<u8>, ConvertError> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| ConvertError::NotJson(e.to_string()))?;
    object_protobuf(&v)
}

fn object_protobuf(v: &serde_json::Value) -> Result<Vec<u8>, ConvertError> {
    let obj = v
        .as_object()
        .ok_or_else(|| ConvertError::NotJson("not an object".into()))?;
    let text = |k: &str| obj.get(k).and_then(|v| v.as_str()).unwrap_or_default();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let msg = kind_message(api_version, kind)?;
    CONVERSIONS.fetch_add(1, Ordering::Relaxed);
    let raw = to_protobuf::encode_members(msg, obj)?;
    Ok(crate::kproto::envelope(api_version, kind, &raw))
}

/// One JSON watch event line as a length-prefixed protobuf watch frame.
pub fn watch_event_to_protobuf(json: &[u8]) -> Result<Vec<u8>, ConvertError> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| ConvertError::NotJson(e.to_string()))?;
    let event_type = v.get("type").and_then(|t| t.as_str()).unwrap_or_default();
    let object = v
        .get("object")
        .ok_or_else(|| ConvertError::NotJson("a watch event without an object".into()))?;
    Ok(crate::kproto::watch_frame(
        event_type,
        &object_protobuf(object)?,
    ))
}

static CONVERSIONS: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_FIELDS: AtomicU64 = AtomicU64::new(0);

/// Objects, lists and watch events converted so far, either way.
pub fn conversions_total() -> u64 {
    CONVERSIONS.load(Ordering::Relaxed)
}
static UNKNOWN_SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Fields left out of a conversion because this hub's schema does not know them.
pub fn unknown_fields_total() -> u64 {
    UNKNOWN_FIELDS.load(Ordering::Relaxed)
}

fn note_unknown(what: String) {
    UNKNOWN_FIELDS.fetch_add(1, Ordering::Relaxed);
    let mut seen = UNKNOWN_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(what.clone()) {
        tracing::warn!(
            "converting between encodings: {what} is unknown to this hub's schema (Kubernetes 1.36) and is left out"
        );
    }
}

fn unknown_field(msg: &Message, tag: u64) {
    note_unknown(format!("{} field {tag}", msg.name));
}

fn unknown_json_field(msg: &Message, name: &str) {
    note_unknown(format!("{}.{name}", msg.name));
}
