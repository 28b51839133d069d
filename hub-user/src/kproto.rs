//! Kubernetes protobuf without a full decode (design.md §6): every object is `k8s\0` +
//! runtime.Unknown (typeMeta 1, raw 2, contentEncoding 3, contentType 4); every object keeps
//! ObjectMeta in field 1 (name 1, namespace 3, resourceVersion 6, labels 11); every List
//! keeps ListMeta in field 1 (resourceVersion 2, continue 3) and its items in field 2; a
//! watch stream is 4-byte big-endian length-prefixed frames, each a *raw* WatchEvent
//! (type 1, object 2 = RawExtension { raw 1 }) with no `k8s\0` envelope of its own — only
//! the object inside the RawExtension is enveloped (as kube-apiserver 1.32 sends it, see
//! tests/fixtures/wire). Reading only these fields lets the hub slice lists into items and
//! index them without knowing their schemas.

/// The `k8s\0` magic that prefixes every Kubernetes protobuf payload.
pub const MAGIC: &[u8] = b"k8s\0";

/// One field's value as it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

pub fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The header of a length-delimited field at the start of `buf`: (field number, length of
/// its value, length of the header). None for any other wire type.
pub fn length_delimited(mut buf: &[u8]) -> Option<(u64, usize, usize)> {
    let total = buf.len();
    let key = varint(&mut buf)?;
    if key & 7 != 2 {
        return None;
    }
    let len = usize::try_from(varint(&mut buf)?).ok()?;
    Some((key >> 3, len, total - buf.len()))
}

/// The fields of one message, in wire order; None if the bytes are not a valid message.
pub fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Value<'_>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut buf)?),
            1 => {
                let (v, rest) = buf.split_first_chunk::<8>()?;
                buf = rest;
                Value::Fixed64(u64::from_le_bytes(*v))
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let (v, rest) = (buf.get(..len)?, buf.get(len..)?);
                buf = rest;
                Value::Bytes(v)
            }
            5 => {
                let (v, rest) = buf.split_first_chunk::<4>()?;
                buf = rest;
                Value::Fixed32(u32::from_le_bytes(*v))
            }
            _ => return None,
        };
        out.push((key >> 3, value));
    }
    Some(out)
}

fn bytes_of<'a>(fs: &[(u64, Value<'a>)], n: u64) -> Option<&'a [u8]> {
    fs.iter().rev().find_map(|(k, v)| match v {
        Value::Bytes(b) if *k == n => Some(*b),
        _ => None,
    })
}

pub fn text(fs: &[(u64, Value<'_>)], n: u64) -> String {
    bytes_of(fs, n)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// A decoded runtime.Unknown envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown<'a> {
    pub api_version: String,
    pub kind: String,
    pub raw: &'a [u8],
}

/// Opens the `k8s\0` + runtime.Unknown envelope of an object, list or Status.
pub fn unwrap(body: &[u8]) -> Option<Unknown<'_>> {
    let f = fields(body.strip_prefix(MAGIC)?)?;
    let type_meta = fields(bytes_of(&f, 1).unwrap_or_default())?;
    Some(Unknown {
        api_version: text(&type_meta, 1),
        kind: text(&type_meta, 2),
        raw: bytes_of(&f, 2).unwrap_or_default(),
    })
}

/// The ObjectMeta fields the hub indexes by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub resource_version: String,
    pub labels: Vec<(String, String)>,
}

/// Walks one message's fields in wire order without collecting them; stops (returning
/// false) at bytes that are not a valid message.
fn each_field<'a>(mut buf: &'a [u8], mut f: impl FnMut(u64, Value<'a>)) -> bool {
    while !buf.is_empty() {
        let Some(key) = varint(&mut buf) else {
            return false;
        };
        let value = match key & 7 {
            0 => match varint(&mut buf) {
                Some(v) => Value::Varint(v),
                None => return false,
            },
            2 => {
                let Some(len) = varint(&mut buf).and_then(|l| usize::try_from(l).ok()) else {
                    return false;
                };
                let (Some(v), Some(rest)) = (buf.get(..len), buf.get(len..)) else {
                    return false;
                };
                buf = rest;
                Value::Bytes(v)
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                let Some(rest) = buf.get(n..) else {
                    return false;
                };
                buf = rest;
                Value::Fixed64(0)
            }
            _ => return false,
        };
        f(key >> 3, value);
    }
    true
}

/// An object's name, namespace and resourceVersion from its raw bytes, read without
/// collecting its fields or labels (the cheap question: is this object already held?).
pub fn object_identity(raw: &[u8]) -> Option<(&str, &str, &str)> {
    let mut meta = None;
    if !each_field(raw, |n, v| {
        if let (1, Value::Bytes(b)) = (n, v) {
            meta = Some(b);
        }
    }) {
        return None;
    }
    let (mut name, mut namespace, mut rv) = ("", "", "");
    let mut valid = true;
    let walked = each_field(meta.unwrap_or_default(), |n, v| {
        if let Value::Bytes(b) = v {
            let slot = match n {
                1 => &mut name,
                3 => &mut namespace,
                6 => &mut rv,
                _ => return,
            };
            match std::str::from_utf8(b) {
                Ok(t) => *slot = t,
                Err(_) => valid = false,
            }
        }
    });
    (walked && valid).then_some((name, namespace, rv))
}

/// An object's ObjectMeta fields (from its raw bytes: the Unknown's `raw`, or a list item).
fn meta_fields(raw: &[u8]) -> Option<Vec<(u64, Value<'_>)>> {
    let object = fields(raw)?;
    fields(bytes_of(&object, 1).unwrap_or_default())
}

/// The entries of a map<string, string> field of ObjectMeta (labels 11, annotations 12):
/// each a message of key 1 and value 2.
fn string_map(meta: &[(u64, Value<'_>)], field: u64) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (n, v) in meta {
        if let (n, Value::Bytes(entry)) = (*n, v)
            && n == field
        {
            let e = fields(entry)?;
            out.push((text(&e, 1), text(&e, 2)));
        }
    }
    Some(out)
}

/// Reads ObjectMeta from an object's raw bytes (the Unknown's `raw`, or a list item).
pub fn object_meta(raw: &[u8]) -> Option<Meta> {
    let meta = meta_fields(raw)?;
    Some(Meta {
        name: text(&meta, 1),
        namespace: text(&meta, 3),
        resource_version: text(&meta, 6),
        labels: string_map(&meta, 11)?,
    })
}

/// An object's ObjectMeta.resourceVersion and annotations, from its raw bytes: what a
/// bookmark says.
pub fn object_version_and_annotations(raw: &[u8]) -> Option<(String, Vec<(String, String)>)> {
    let meta = meta_fields(raw)?;
    Some((text(&meta, 6), string_map(&meta, 12)?))
}

/// A list sliced into its items, each still in its original encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<'a> {
    pub resource_version: String,
    pub continue_token: String,
    pub items: Vec<&'a [u8]>,
}

pub fn split_list(raw: &[u8]) -> Option<List<'_>> {
    let list = fields(raw)?;
    let meta = fields(bytes_of(&list, 1).unwrap_or_default())?;
    let items = list
        .iter()
        .filter_map(|(n, v)| match v {
            Value::Bytes(b) if *n == 2 => Some(*b),
            _ => None,
        })
        .collect();
    Some(List {
        resource_version: text(&meta, 2),
        continue_token: text(&meta, 3),
        items,
    })
}

/// One watch event: its type and the object's raw bytes (an Unknown envelope itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent<'a> {
    pub kind: String,
    pub object: &'a [u8],
}

/// Splits complete length-prefixed watch frames off the front of `buf`; returns them and
/// how many bytes they used (the rest is an incomplete frame to keep for later).
pub fn watch_frames(buf: &[u8]) -> (Vec<&[u8]>, usize) {
    let (mut frames, mut used) = (Vec::new(), 0);
    while let Some(len) = buf
        .get(used..used + 4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
    {
        let Some(frame) = buf.get(used + 4..used + 4 + len) else {
            break;
        };
        frames.push(frame);
        used += 4 + len;
    }
    (frames, used)
}

/// Reads a watch frame: a raw WatchEvent message (no envelope; its object has one).
pub fn watch_event(frame: &[u8]) -> Option<WatchEvent<'_>> {
    let event = fields(frame)?;
    let object = fields(bytes_of(&event, 2).unwrap_or_default())?;
    Some(WatchEvent {
        kind: text(&event, 1),
        object: bytes_of(&object, 1).unwrap_or_default(),
    })
}

/// Appends a varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length-delimited field (strings, bytes, embedded messages).
pub fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, field << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends a varint field.
pub fn put_uint(out: &mut Vec<u8>, field: u64, v: u64) {
    put_varint(out, field << 3);
    put_varint(out, v);
}

/// `k8s\0` + runtime.Unknown { typeMeta { apiVersion, kind }, raw, contentEncoding "",
/// contentType "" }: how kube-apiserver frames every protobuf object and list, byte for
/// byte (it writes the two empty strings too).
pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = Vec::with_capacity(raw.len() + type_meta.len() + 16);
    out.extend_from_slice(MAGIC);
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    out
}

/// A failure Status in its envelope: Status { metadata 1 (empty ListMeta), status 2
/// "Failure", message 3, reason 4, code 6 }.
pub fn status(reason: &str, message: &str, code: u64, about: Option<&StatusDetails>) -> Vec<u8> {
    // ListMeta with its three strings present and empty, as Go's encoder writes them.
    let mut meta = Vec::new();
    for field in 1..=3 {
        put_bytes(&mut meta, field, b"");
    }
    let mut raw = Vec::new();
    put_bytes(&mut raw, 1, &meta);
    put_bytes(&mut raw, 2, b"Failure");
    put_bytes(&mut raw, 3, message.as_bytes());
    put_bytes(&mut raw, 4, reason.as_bytes());
    if let Some(d) = about {
        // StatusDetails { name 1, group 2, kind 3, causes 4, retryAfterSeconds 5, uid 6 }, every
        // scalar written even when empty, as Go's encoder does.
        let mut details = Vec::new();
        put_bytes(&mut details, 1, d.name.as_bytes());
        put_bytes(&mut details, 2, d.group.as_bytes());
        put_bytes(&mut details, 3, d.kind.as_bytes());
        for c in &d.causes {
            // StatusCause { reason 1, message 2, field 3 }.
            let mut cause = Vec::new();
            put_bytes(&mut cause, 1, c.reason.as_bytes());
            put_bytes(&mut cause, 2, c.message.as_bytes());
            put_bytes(&mut cause, 3, c.field.as_bytes());
            put_bytes(&mut details, 4, &cause);
        }
        put_uint(&mut details, 5, 0);
        put_bytes(&mut details, 6, b"");
        put_bytes(&mut raw, 5, &details);
    }
    put_uint(&mut raw, 6, code);
    envelope("v1", "Status", &raw)
}

/// The object a Status error is about, as kube-apiserver names it: its name, API group
/// and resource (`kind` holds the plural resource, as in kube-apiserver's answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusDetails {
    pub name: String,
    pub group: String,
    pub kind: String,
    /// What was invalid, field by field (a 422's).
    pub causes: Vec<StatusCause>,
}

/// One reason a request was invalid: `FieldValueInvalid` of `metadata.uid`, say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl StatusDetails {
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"name": self.name, "kind": self.kind});
        if !self.group.is_empty() {
            v["group"] = self.group.clone().into();
        }
        if !self.causes.is_empty() {
            v["causes"] = self
                .causes
                .iter()
                .map(|c| serde_json::json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
        }
        v
    }
}

/// A list message: ListMeta { resourceVersion 2, continue 3, remainingItemCount 4 } in
/// field 1, then the items (message bytes) in field 2.
pub fn list_message<'a>(
    resource_version: &str,
    continue_token: &str,
    remaining: Option<u64>,
    items: impl Iterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut meta = Vec::new();
    put_bytes(&mut meta, 2, resource_version.as_bytes());
    if !continue_token.is_empty() {
        put_bytes(&mut meta, 3, continue_token.as_bytes());
    }
    if let Some(n) = remaining {
        put_uint(&mut meta, 4, n);
    }
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &meta);
    for item in items {
        put_bytes(&mut out, 2, item);
    }
    out
}

/// An object message holding only ObjectMeta { name 1, namespace 3, resourceVersion 6,
/// annotations 12 } — for bookmarks and deletions known only by their key.
pub fn meta_only_object(
    name: &str,
    namespace: &str,
    resource_version: &str,
    annotations: &[(&str, &str)],
) -> Vec<u8> {
    let mut meta = Vec::new();
    if !name.is_empty() {
        put_bytes(&mut meta, 1, name.as_bytes());
    }
    if !namespace.is_empty() {
        put_bytes(&mut meta, 3, namespace.as_bytes());
    }
    put_bytes(&mut meta, 6, resource_version.as_bytes());
    for (k, v) in annotations {
        let mut entry = Vec::new();
        put_bytes(&mut entry, 1, k.as_bytes());
        put_bytes(&mut entry, 2, v.as_bytes());
        put_bytes(&mut meta, 12, &entry);
    }
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &meta);
    out
}

/// Appends one field as it was read.
fn put_field(out: &mut Vec<u8>, field: u64, v: &Value<'_>) {
    match v {
        Value::Varint(x) => put_uint(out, field, *x),
        Value::Fixed64(x) => {
            put_varint(out, field << 3 | 1);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Bytes(b) => put_bytes(out, field, b),
        Value::Fixed32(x) => {
            put_varint(out, field << 3 | 5);
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// The object's message bytes with ObjectMeta.resourceVersion set to `rv`; every other
/// field is kept as it was.
pub fn with_resource_version(object: &[u8], rv: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(object.len() + 16);
    let mut meta_seen = false;
    for (n, v) in fields(object)? {
        match (n, v) {
            (1, Value::Bytes(meta)) if !meta_seen => {
                let mut m = Vec::with_capacity(meta.len() + 16);
                for (mn, mv) in fields(meta)? {
                    if mn != 6 {
                        put_field(&mut m, mn, &mv);
                    }
                }
                put_bytes(&mut m, 6, rv.as_bytes());
                put_bytes(&mut out, 1, &m);
                meta_seen = true;
            }
            (n, v) => put_field(&mut out, n, &v),
        }
    }
    meta_seen.then_some(out)
}

/// One length-prefixed watch frame: a raw WatchEvent { type 1, object 2 = RawExtension
/// { raw 1 } } around an already enveloped object. The frame has no envelope of its own.
pub fn watch_frame(event_type: &str, enveloped_object: &[u8]) -> Vec<u8> {
    let mut raw_ext = Vec::new();
    put_bytes(&mut raw_ext, 1, enveloped_object);
    let mut event = Vec::with_capacity(raw_ext.len() + event_type.len() + 8);
    put_bytes(&mut event, 1, event_type.as_bytes());
    put_bytes(&mut event, 2, &raw_ext);
    let mut out = Vec::with_capacity(event.len() + 4);
    out.extend_from_slice(&(event.len() as u32).to_be_bytes());
    out.extend_from_slice(&event);
    out
}

#[cfg(test)]
mod tests {
    use k8s_pb::{
        api::core::v1::{Pod, PodList, PodSpec},
        apimachinery::pkg::{
            apis::meta::v1::{ListMeta, ObjectMeta, WatchEvent as PbWatchEvent},
            runtime::{RawExtension, TypeMeta, Unknown as PbUnknown},
        },
    };
    use prost::Message;

    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let u = PbUnknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.to_vec(), u.encode_to_vec()].concat()
    }

    fn pod(name: &str, rv: &str) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(rv.into()),
                uid: Some("u-1".into()),
                labels: [
                    ("app".to_string(), "web".to_string()),
                    ("tier".into(), "front".into()),
                ]
                .into(),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                node_name: Some("edge-1".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn reads_meta_from_a_real_encoded_pod() {
        let body = envelope("v1", "Pod", pod("p1", "42").encode_to_vec());
        let u = unwrap(&body).unwrap();
        assert_eq!((u.api_version.as_str(), u.kind.as_str()), ("v1", "Pod"));
        let m = object_meta(u.raw).unwrap();
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.resource_version.as_str()
            ),
            ("p1", "default", "42")
        );
        let mut labels = m.labels.clone();
        labels.sort();
        assert_eq!(
            labels,
            vec![
                ("app".into(), "web".into()),
                ("tier".into(), "front".into())
            ]
        );
        // The item bytes decode back into the very same Pod.
        assert_eq!(Pod::decode(u.raw).unwrap(), pod("p1", "42"));
        assert_eq!(object_identity(u.raw), Some(("p1", "default", "42")));
        assert_eq!(
            object_identity(&u.raw[..u.raw.len() - 1]),
            None,
            "cut short"
        );
        assert_eq!(object_identity(&[0xff]), None);
    }

    #[test]
    fn slices_a_list_into_items_without_decoding_them() {
        let list = PodList {
            metadata: Some(ListMeta {
                resource_version: Some("100".into()),
                r#continue: Some("token".into()),
                ..Default::default()
            }),
            items: (0..3)
                .map(|i| pod(&format!("p{i}"), &format!("{}", 90 + i)))
                .collect(),
        };
        let body = envelope("v1", "PodList", list.encode_to_vec());
        let l = split_list(unwrap(&body).unwrap().raw).unwrap();
        assert_eq!(
            (
                l.resource_version.as_str(),
                l.continue_token.as_str(),
                l.items.len()
            ),
            ("100", "token", 3)
        );
        for (i, item) in l.items.iter().enumerate() {
            assert_eq!(object_meta(item).unwrap().name, format!("p{i}"));
            assert_eq!(
                Pod::decode(*item).unwrap(),
                pod(&format!("p{i}"), &format!("{}", 90 + i))
            );
        }
    }

    #[test]
    fn reads_length_prefixed_watch_frames_across_chunks() {
        let frame = |t: &str, name: &str| {
            let ev = PbWatchEvent {
                r#type: Some(t.into()),
                object: Some(RawExtension {
                    raw: Some(envelope("v1", "Pod", pod(name, "7").encode_to_vec())),
                }),
            };
            let body = ev.encode_to_vec();
            [(body.len() as u32).to_be_bytes().to_vec(), body].concat()
        };
        let stream = [frame("ADDED", "a"), frame("MODIFIED", "b")].concat();
        // Cut in the middle of the second frame: one complete frame, the rest kept.
        let cut = stream.len() - 5;
        let (frames, used) = watch_frames(&stream[..cut]);
        assert_eq!(frames.len(), 1);
        let (rest, _) = watch_frames(&stream[used..]);
        assert_eq!(rest.len(), 1);
        let ev = watch_event(frames[0]).unwrap();
        assert_eq!(ev.kind, "ADDED");
        assert_eq!(
            object_meta(unwrap(ev.object).unwrap().raw).unwrap().name,
            "a"
        );
        assert_eq!(watch_event(rest[0]).unwrap().kind, "MODIFIED");
    }

    #[test]
    fn garbage_is_none_not_a_panic() {
        for bad in [
            &b""[..],
            b"k8s",
            b"k8s\0\xff\xff\xff",
            b"\x0a\xff",
            b"k8s\0\x0a\x05ab",
        ] {
            let _ = unwrap(bad);
            let _ = object_meta(bad);
            let _ = split_list(bad);
            let _ = watch_frames(bad);
            let _ = watch_event(bad);
        }
        assert_eq!(unwrap(b"no magic"), None);
    }
}
