//! A list answer's items, fingerprinted without reading them: the items are hashed as the
//! bytes they arrived in, the list's own metadata (its resourceVersion moves with every
//! change anywhere in the cluster) left out. A relist whose fingerprint equals the last
//! one stored for the same list, with nothing else written to that resource since, holds
//! exactly what the store holds: the writer then only moves the list's resourceVersion.
use bytes::Bytes;
use xxhash_rust::xxh3::Xxh3;

use super::objects::Encoding;
use crate::kproto;

/// The items' hash and the list's resourceVersion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub items: u64,
    pub rv: u64,
}

/// The fingerprint of a whole, single-page list answer arriving in `parts`; None when it
/// is not one this can take apart from its first piece (a page of a chunked list, an
/// unexpected layout): the caller then reads the list in full.
pub fn of_list(enc: Encoding, parts: &[Bytes]) -> Option<Fingerprint> {
    let first = parts.first()?;
    let (meta, rv) = match enc {
        Encoding::Json => json_list_meta(first)?,
        Encoding::Protobuf => protobuf_list_meta(first)?,
    };
    // XXH3 with its fixed default secret: the same bytes give the same hash however they
    // were cut into pieces, in this process and the next; at memory speed, where SipHash
    // took ~5 % of the hub's CPU on a relist of 1000 pods.
    let mut h = Xxh3::new();
    h.update(&first[..meta.start]);
    h.update(&first[meta.end..]);
    for p in &parts[1..] {
        h.update(p);
    }
    Some(Fingerprint {
        items: h.digest(),
        rv,
    })
}

/// `{"kind":"PodList","apiVersion":"v1","metadata":{...},"items":[` as kube-apiserver
/// writes it: the span of the metadata object and the list's resourceVersion.
fn json_list_meta(first: &[u8]) -> Option<(std::ops::Range<usize>, u64)> {
    const KEY: &[u8] = b"\"metadata\":";
    let head = &first[..first.len().min(4096)];
    let at = memchr::memmem::find(head, KEY)?;
    // The list's own metadata comes before any item: no array opened before it.
    if !head.starts_with(b"{") || head[..at].contains(&b'[') {
        return None;
    }
    let start = at + KEY.len();
    if head.get(start) != Some(&b'{') {
        return None;
    }
    // ListMeta holds only strings and a number: its object closes at the first `}`.
    let end = start + memchr::memchr(b'}', &head[start..])? + 1;
    if !head[end..].starts_with(b",\"items\":[") {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct ListMeta {
        #[serde(rename = "resourceVersion", default)]
        rv: String,
        #[serde(rename = "continue", default)]
        continue_token: String,
    }
    let meta: ListMeta = serde_json::from_slice(&head[start..end]).ok()?;
    if !meta.continue_token.is_empty() {
        return None;
    }
    Some((start..end, meta.rv.parse().ok()?))
}

/// `k8s\0` + Unknown{typeMeta (1), raw (2): List{metadata (1), items (2)...}}: the span
/// from raw's header (its length moves with the metadata's) to the end of ListMeta.
fn protobuf_list_meta(first: &[u8]) -> Option<(std::ops::Range<usize>, u64)> {
    let body = first.strip_prefix(kproto::MAGIC)?;
    let mut at = kproto::MAGIC.len();
    let mut rest = body;
    // typeMeta, then the raw object. Lengths come from the cloud's bytes: summed checked.
    let (field, len, header) = kproto::length_delimited(rest)?;
    if field != 1 {
        return None;
    }
    let type_meta_end = header.checked_add(len)?;
    at += type_meta_end;
    rest = rest.get(type_meta_end..)?;
    let (field, _, header) = kproto::length_delimited(rest)?;
    if field != 2 {
        return None;
    }
    let start = at;
    rest = rest.get(header..)?;
    let (field, len, meta_header) = kproto::length_delimited(rest)?;
    if field != 1 {
        return None;
    }
    let meta_end = meta_header.checked_add(len)?;
    let meta = rest.get(meta_header..meta_end)?;
    let end = start + header + meta_end;
    let fields = kproto::fields(meta)?;
    if !kproto::text(&fields, 3).is_empty() {
        return None; // a page of a chunked list
    }
    Some((start..end, kproto::text(&fields, 2).parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(body: &[u8], size: usize) -> Vec<Bytes> {
        body.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    fn json(rv: u64, items: &str) -> Vec<u8> {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{items}]}}"#
        )
        .into_bytes()
    }

    #[test]
    fn json_items_fingerprint_ignores_the_list_rv_and_the_cuts() {
        let items = r#"{"metadata":{"name":"a","resourceVersion":"5"}}"#;
        let a = of_list(Encoding::Json, &pieces(&json(100, items), 4096)).unwrap();
        assert_eq!(a.rv, 100);
        // Cut anywhere after the list's metadata: the same fingerprint.
        let body = json(123456, items);
        for size in [120, 121, 4096] {
            let b = of_list(Encoding::Json, &pieces(&body, size)).unwrap();
            assert_eq!((b.items, b.rv), (a.items, 123456), "pieces of {size}");
        }
        let changed = r#"{"metadata":{"name":"a","resourceVersion":"6"}}"#;
        let c = of_list(Encoding::Json, &pieces(&json(100, changed), 4096)).unwrap();
        assert_ne!(c.items, a.items);
    }

    /// Lists as a real kube-apiserver 1.36 answered them, cut as it frames them (4 KiB for
    /// protobuf, 16 KiB for JSON) and at odd places: one fingerprint, the list's own rv.
    #[test]
    fn recorded_lists_fingerprint_the_same_however_they_are_framed() {
        let recorded = |name: &str| {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/wire");
            std::fs::read(format!("{dir}/kube-apiserver-1.36/{name}/response.body")).unwrap()
        };
        for (enc, name) in [
            (Encoding::Protobuf, "list-pods-protobuf-nodename"),
            (Encoding::Json, "list-pods-json-rv0"),
        ] {
            let body = recorded(name);
            let whole = of_list(enc, &[Bytes::from(body.clone())]).unwrap();
            assert!(whole.rv > 0, "{name}");
            for size in [4096, 16384, 4093, 977] {
                let cut = of_list(enc, &pieces(&body, size));
                assert_eq!(cut, Some(whole), "{name} in pieces of {size}");
            }
        }
    }

    #[test]
    fn pages_and_unexpected_layouts_are_not_fingerprinted() {
        let page = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1","continue":"abc"},"items":[]}"#;
        assert_eq!(of_list(Encoding::Json, &pieces(page, 4096)), None);
        let last_page = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1","continue":""},"items":[]}"#;
        assert!(of_list(Encoding::Json, &pieces(last_page, 4096)).is_some());
        let items_first =
            br#"{"items":[{"metadata":{"name":"a"}}],"metadata":{"resourceVersion":"1"}}"#;
        assert_eq!(of_list(Encoding::Json, &pieces(items_first, 4096)), None);
        assert_eq!(of_list(Encoding::Json, &pieces(b"[]", 4096)), None);
        assert_eq!(
            of_list(Encoding::Protobuf, &pieces(b"k8s\0\x0a\x00", 4096)),
            None
        );
    }

    #[test]
    fn protobuf_items_fingerprint_ignores_the_list_rv() {
        let list = |rv: &str, cont: &str, item: &[u8]| {
            let mut meta = Vec::new();
            kproto::put_bytes(&mut meta, 2, rv.as_bytes());
            if !cont.is_empty() {
                kproto::put_bytes(&mut meta, 3, cont.as_bytes());
            }
            let mut raw = Vec::new();
            kproto::put_bytes(&mut raw, 1, &meta);
            kproto::put_bytes(&mut raw, 2, item);
            kproto::envelope("v1", "PodList", &raw)
        };
        let a = of_list(Encoding::Protobuf, &pieces(&list("9", "", b"pod-a"), 4096)).unwrap();
        let b = of_list(
            Encoding::Protobuf,
            &pieces(&list("1234567", "", b"pod-a"), 40),
        )
        .unwrap();
        assert_eq!((a.items, a.rv, b.rv), (b.items, 9, 1234567));
        let c = of_list(Encoding::Protobuf, &pieces(&list("9", "", b"pod-b"), 4096)).unwrap();
        assert_ne!(c.items, a.items);
        assert_eq!(
            of_list(
                Encoding::Protobuf,
                &pieces(&list("9", "tok", b"pod-a"), 4096)
            ),
            None
        );
    }
}
