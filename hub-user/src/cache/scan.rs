//! Lists sliced into items without parsing them, straight from the pieces the answer
//! arrived in: a JSON list by a scan that tracks only strings and nesting, a protobuf list
//! by its field tags. An item that lies inside one piece is a reference to it (no copy);
//! only items across a piece boundary are copied. The writer then names each item by a
//! metadata scan and parses in full only the items the store does not already hold: a
//! relist of unchanged objects costs a scan, not a parse and a write.
use bytes::{Bytes, BytesMut};
use serde::Deserialize;

use crate::kproto;

/// A list's items, each still in its encoding (a JSON object without apiVersion/kind as
/// kube-apiserver writes list items; a protobuf message without envelope).
#[derive(Debug)]
pub struct ScannedList {
    /// The list's own kind (`PodList`).
    pub kind: String,
    pub api_version: String,
    pub rv: String,
    pub continue_token: String,
    pub items: Vec<ScannedItem>,
}

/// An answer as the pieces it arrived in, addressed by offset.
struct Pieces<'a> {
    parts: &'a [Bytes],
    /// Where each piece starts in the answer (found by binary search, so reading a large
    /// list in thousands of pieces stays linear).
    starts: Vec<usize>,
    len: usize,
}

impl<'a> Pieces<'a> {
    fn new(parts: &'a [Bytes]) -> Pieces<'a> {
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0;
        for p in parts {
            starts.push(len);
            len += p.len();
        }
        Pieces { parts, starts, len }
    }

    /// The index of the piece holding offset `pos`.
    fn piece_at(&self, pos: usize) -> usize {
        self.starts.partition_point(|s| *s <= pos).saturating_sub(1)
    }

    fn byte(&self, pos: usize) -> Option<u8> {
        let i = self.piece_at(pos);
        self.parts.get(i)?.get(pos - self.starts[i]).copied()
    }

    /// Bytes `start..end`, a slice of one piece when they lie in it.
    fn range(&self, start: usize, end: usize) -> Bytes {
        let mut out: Option<BytesMut> = None;
        for i in self.piece_at(start)..self.parts.len() {
            let (part, lo) = (&self.parts[i], self.starts[i]);
            if lo >= end {
                break;
            }
            let (from, to) = (start.max(lo) - lo, end.min(lo + part.len()) - lo);
            if from >= to {
                continue;
            }
            if out.is_none() && lo <= start && end <= lo + part.len() {
                return part.slice(from..to);
            }
            out.get_or_insert_with(|| BytesMut::with_capacity(end - start))
                .extend_from_slice(&part[from..to]);
        }
        out.map(BytesMut::freeze).unwrap_or_default()
    }
}

#[derive(Deserialize)]
struct JsonHead {
    #[serde(default)]
    kind: String,
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    metadata: JsonHeadMeta,
}

#[derive(Deserialize, Default)]
struct JsonHeadMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: String,
}

/// What the string being scanned is, for the few the scan reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Str {
    Other,
    /// A key of the list's own object (`items`, `metadata`, …).
    TopKey,
    /// A key of an item (`metadata`, `spec`, …).
    ItemKey,
    /// A key of an item's metadata.
    MetaKey,
    /// The value of an item's metadata name, namespace or resourceVersion.
    MetaValue,
}

/// Which metadata field a value belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MetaField {
    Name,
    Namespace,
    ResourceVersion,
    Other,
}

/// An item's identity as the scan read it.
#[derive(Default)]
struct ScannedIdentity {
    name: Option<String>,
    namespace: String,
    rv: Option<String>,
    /// An escape in a value read: left to the full metadata scan.
    escaped: bool,
}

/// Where the scan is in a JSON list. Depth counts open brackets: 1 inside the list's
/// object, 2 inside `items`, 3 inside an item, 4 inside its metadata.
#[derive(Default)]
struct JsonSplit {
    depth: usize,
    /// Inside a string, and what it is.
    string: Option<Str>,
    escaped: bool,
    closed: bool,
    /// The last structural byte at this depth was `{` or `,`: a string here is a key.
    key_slot: bool,
    /// The bytes of the string being read, for the strings the scan keeps.
    capture: Vec<u8>,
    capture_escaped: bool,
    /// At depth 1: the next non-blank byte starts a member (`"key": value`).
    expecting_member: bool,
    member_start: usize,
    top_key: Vec<u8>,
    /// The top-level members other than `items`, as ranges.
    members: Vec<(usize, usize)>,
    in_items: bool,
    expecting_item: bool,
    item_start: usize,
    item_key: Vec<u8>,
    in_meta: bool,
    meta_field: Option<MetaField>,
    identity: ScannedIdentity,
    items: Vec<(usize, usize, ScannedIdentity)>,
}

/// Bytes that are not a list of the encoding the scan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

const MALFORMED: Malformed = Malformed;

impl JsonSplit {
    fn end_member(&mut self, end: usize) {
        if self.top_key != b"items" {
            self.members.push((self.member_start, end));
        }
        self.top_key.clear();
    }

    fn end_item(&mut self, end: usize) {
        let id = std::mem::take(&mut self.identity);
        self.items.push((self.item_start, end, id));
    }

    fn open_string(&mut self) {
        let kind = match self.depth {
            1 if self.key_slot => Str::TopKey,
            3 if self.in_items && self.key_slot => Str::ItemKey,
            4 if self.in_meta && self.key_slot => Str::MetaKey,
            4 if self.in_meta && self.meta_field.is_some_and(|f| f != MetaField::Other) => {
                Str::MetaValue
            }
            _ => Str::Other,
        };
        self.string = Some(kind);
        self.capture.clear();
        self.capture_escaped = false;
    }

    fn close_string(&mut self) {
        let text = || String::from_utf8(self.capture.clone()).ok();
        match self.string.take() {
            Some(Str::TopKey) => self.top_key = std::mem::take(&mut self.capture),
            Some(Str::ItemKey) => self.item_key = std::mem::take(&mut self.capture),
            Some(Str::MetaKey) => {
                self.meta_field = Some(match self.capture.as_slice() {
                    b"name" => MetaField::Name,
                    b"namespace" => MetaField::Namespace,
                    b"resourceVersion" => MetaField::ResourceVersion,
                    _ => MetaField::Other,
                });
            }
            Some(Str::MetaValue) => {
                let id = &mut self.identity;
                id.escaped |= self.capture_escaped;
                match self.meta_field {
                    Some(MetaField::Name) => id.name = text(),
                    Some(MetaField::Namespace) => id.namespace = text().unwrap_or_default(),
                    Some(MetaField::ResourceVersion) => id.rv = text(),
                    _ => {}
                }
            }
            Some(Str::Other) | None => {}
        }
        self.key_slot = false;
    }

    /// One byte outside a string, at `pos`.
    fn structural(&mut self, pos: usize, c: u8) -> Result<(), Malformed> {
        if c.is_ascii_whitespace() {
            return Ok(());
        }
        if self.closed {
            return Err(MALFORMED);
        }
        if self.expecting_member && c != b'}' {
            self.expecting_member = false;
            self.member_start = pos;
        }
        if self.expecting_item && c != b']' {
            self.expecting_item = false;
            self.item_start = pos;
        }
        match c {
            b'"' => self.open_string(),
            b'{' | b'[' => {
                match self.depth {
                    0 if c != b'{' => return Err(MALFORMED),
                    0 => self.expecting_member = true,
                    1 if c == b'[' && self.top_key == b"items" => {
                        self.in_items = true;
                        self.expecting_item = true;
                    }
                    2 if self.in_items => self.item_key.clear(),
                    3 if self.in_items && c == b'{' && self.item_key == b"metadata" => {
                        self.in_meta = true;
                        self.meta_field = None;
                    }
                    _ => {}
                }
                self.depth += 1;
                self.key_slot = c == b'{';
            }
            b'}' | b']' => {
                self.depth = self.depth.checked_sub(1).ok_or(MALFORMED)?;
                self.key_slot = false;
                if self.in_meta && self.depth == 3 {
                    self.in_meta = false;
                } else if self.in_items && self.depth == 1 {
                    if !self.expecting_item {
                        self.end_item(pos);
                    }
                    self.in_items = false;
                    self.expecting_item = false;
                } else if self.depth == 0 {
                    if !self.expecting_member {
                        self.end_member(pos);
                    }
                    self.expecting_member = false;
                    self.closed = true;
                }
            }
            b',' => {
                self.key_slot = true;
                match self.depth {
                    1 => {
                        self.end_member(pos);
                        self.expecting_member = true;
                    }
                    2 if self.in_items => {
                        self.end_item(pos);
                        self.expecting_item = true;
                    }
                    3 if self.in_items => self.item_key.clear(),
                    4 if self.in_meta => self.meta_field = None,
                    _ => {}
                }
            }
            b':' => self.key_slot = false,
            _ if self.depth == 0 => return Err(MALFORMED),
            _ => {}
        }
        Ok(())
    }

    /// One piece, starting at offset `base` of the answer.
    fn feed(&mut self, part: &[u8], base: usize) -> Result<(), Malformed> {
        let mut i = 0;
        while i < part.len() {
            let Some(kind) = self.string else {
                let c = part[i];
                if self.depth > 4 || (self.depth == 4 && !self.in_meta) {
                    // Inside an item past what the scan reads: only strings and nesting
                    // matter (most of the bytes; this keeps them cheap).
                    match c {
                        b'"' => self.string = Some(Str::Other),
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' => {
                            self.depth -= 1;
                            self.key_slot = false;
                        }
                        _ => {}
                    }
                } else {
                    self.structural(base + i, c)?;
                }
                i += 1;
                continue;
            };
            let keep = kind != Str::Other;
            if std::mem::take(&mut self.escaped) {
                if keep {
                    self.capture.push(part[i]);
                }
                i += 1;
                continue;
            }
            // Only a quote or a backslash matters inside a string.
            let rest = &part[i..];
            let Some(n) = quote_or_backslash(rest) else {
                if keep {
                    self.capture.extend_from_slice(rest);
                }
                return Ok(());
            };
            if keep {
                self.capture.extend_from_slice(&rest[..n]);
            }
            i += n;
            if part[i] == b'\\' {
                self.escaped = true;
                self.capture_escaped = true;
                if keep {
                    self.capture.push(b'\\');
                }
            } else {
                self.close_string();
            }
            i += 1;
        }
        Ok(())
    }
}

/// Where the next `"` or `\` is. Most strings in an object are short keys and values:
/// eight bytes at a time (a word compare) finds their end sooner than a vector search is
/// set up; long strings go to memchr.
fn quote_or_backslash(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    // A byte of `w` is zero where the two words agree; the lowest flagged byte is exact.
    let zero_byte = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let mut i = 0;
    while let Some(chunk) = s.get(i..i + 8).filter(|_| i < 64) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let hits = zero_byte(w ^ QUOTES) | zero_byte(w ^ BACKSLASHES);
        if hits != 0 {
            return Some(i + (hits.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    memchr::memchr2(b'"', b'\\', &s[i..]).map(|n| n + i)
}

/// One item of a JSON list: its bytes and, when the scan could read them plainly, the
/// metadata name, namespace and resourceVersion.
#[derive(Debug)]
pub struct ScannedItem {
    pub raw: Bytes,
    /// (namespace, name, resourceVersion).
    pub identity: Option<(String, String, String)>,
}

/// A JSON list's items and head, from the pieces it arrived in.
pub fn json_list(parts: &[Bytes]) -> Result<ScannedList, Malformed> {
    let pieces = Pieces::new(parts);
    let mut split = JsonSplit::default();
    let mut base = 0;
    for part in parts {
        split.feed(part, base)?;
        base += part.len();
    }
    if !split.closed || split.string.is_some() {
        return Err(MALFORMED);
    }
    // The head is the list without its items: small, parsed the ordinary way.
    let mut head = vec![b'{'];
    for (i, (s, e)) in split.members.iter().enumerate() {
        if i > 0 {
            head.push(b',');
        }
        head.extend_from_slice(&pieces.range(*s, *e));
    }
    head.push(b'}');
    let head: JsonHead = serde_json::from_slice(&head).map_err(|_| MALFORMED)?;
    Ok(ScannedList {
        kind: head.kind,
        api_version: head.api_version,
        rv: head.metadata.resource_version,
        continue_token: head.metadata.continue_token,
        items: split
            .items
            .into_iter()
            .map(|(s, e, id)| ScannedItem {
                raw: pieces.range(s, e),
                identity: match id {
                    ScannedIdentity {
                        name: Some(name),
                        namespace,
                        rv: Some(rv),
                        escaped: false,
                    } => Some((namespace, name, rv)),
                    _ => None,
                },
            })
            .collect(),
    })
}

/// Reads protobuf across the pieces of an answer.
struct Cursor<'a> {
    pieces: Pieces<'a>,
    pos: usize,
    len: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = self.pieces.byte(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.len)?;
        let out = self.pieces.range(self.pos, end);
        self.pos = end;
        Some(out)
    }

    /// The next field of a message ending at `end`: its number and, for a
    /// length-delimited one, where its bytes start and how long they are (other wire
    /// types are skipped and give None).
    fn field(&mut self, end: usize) -> Option<(u64, Option<usize>)> {
        let key = self.varint()?;
        let len = match key & 7 {
            0 => {
                self.varint()?;
                None
            }
            1 => {
                self.take(8)?;
                None
            }
            2 => Some(usize::try_from(self.varint()?).ok()?),
            5 => {
                self.take(4)?;
                None
            }
            _ => return None,
        };
        // A length near usize::MAX from a bad body must not overflow the sum.
        if self
            .pos
            .checked_add(len.unwrap_or(0))
            .is_none_or(|e| e > end)
        {
            return None;
        }
        Some((key >> 3, len))
    }
}

/// A protobuf list (`k8s\0` + Unknown whose raw is the List) sliced into its items.
pub fn protobuf_list(parts: &[Bytes]) -> Result<ScannedList, Malformed> {
    let pieces = Pieces::new(parts);
    let len = pieces.len;
    let mut c = Cursor {
        pieces,
        pos: 0,
        len,
    };
    if c.take(kproto::MAGIC.len()).as_deref() != Some(kproto::MAGIC) {
        return Err(MALFORMED);
    }
    let mut out = ScannedList {
        kind: String::new(),
        api_version: String::new(),
        rv: String::new(),
        continue_token: String::new(),
        items: Vec::new(),
    };
    while c.pos < len {
        let (field, n) = c.field(len).ok_or(MALFORMED)?;
        let Some(n) = n else { continue };
        match field {
            1 => {
                let type_meta = c.take(n).ok_or(MALFORMED)?;
                let f = kproto::fields(&type_meta).ok_or(MALFORMED)?;
                out.api_version = kproto::text(&f, 1);
                out.kind = kproto::text(&f, 2);
            }
            // The List message: ListMeta in 1, items in 2.
            2 => {
                let end = c.pos + n;
                while c.pos < end {
                    let (field, n) = c.field(end).ok_or(MALFORMED)?;
                    let Some(n) = n else { continue };
                    let bytes = c.take(n).ok_or(MALFORMED)?;
                    match field {
                        1 => {
                            let meta = kproto::fields(&bytes).ok_or(MALFORMED)?;
                            out.rv = kproto::text(&meta, 2);
                            out.continue_token = kproto::text(&meta, 3);
                        }
                        2 => out.items.push(ScannedItem {
                            raw: bytes,
                            identity: None,
                        }),
                        _ => {}
                    }
                }
            }
            _ => {
                c.take(n).ok_or(MALFORMED)?;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length-delimited field claiming nearly usize::MAX bytes (a fuzzer's find, in
    /// a Status envelope) is refused, not summed past the end of the address space.
    #[test]
    fn a_huge_field_length_is_malformed_not_an_overflow() {
        let mut body = b"k8s\0\x0a\x0c\x0a\x02v1\x12\x06Status\x12".to_vec();
        body.extend_from_slice(&[0xff; 9]);
        body.extend_from_slice(b"\x49\x0a\x06\x0a\x00\x12\x00");
        for size in [1, 7, body.len()] {
            assert!(
                protobuf_list(&pieces(&body, size)).is_err(),
                "pieces of {size}"
            );
        }
    }

    /// `text` cut into pieces of `size` bytes, as an answer arrives in frames.
    fn pieces(text: &[u8], size: usize) -> Vec<Bytes> {
        text.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    #[test]
    fn json_lists_split_into_items_whatever_the_piece_boundaries() {
        let list = br#" {"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c1"},
            "items":[{"metadata":{"name":"a","annotations":{"x":"]},\"[{"}}}, {"metadata":{"name":"b"},"spec":{"l":[1,2,{"k":"v"}]}} ]} "#;
        let whole = json_list(&[Bytes::from_static(list)]).unwrap();
        assert_eq!(
            (
                whole.kind.as_str(),
                whole.api_version.as_str(),
                whole.rv.as_str()
            ),
            ("PodList", "v1", "42")
        );
        assert_eq!(whole.continue_token, "c1");
        let items: Vec<serde_json::Value> = whole
            .items
            .iter()
            .map(|i| serde_json::from_slice(&i.raw).unwrap())
            .collect();
        assert_eq!(items[0]["metadata"]["annotations"]["x"], "]},\"[{");
        assert_eq!(items[1]["spec"]["l"][2]["k"], "v");
        let raws = |l: &ScannedList| l.items.iter().map(|i| i.raw.clone()).collect::<Vec<_>>();
        let ids = |l: &ScannedList| {
            l.items
                .iter()
                .map(|i| i.identity.clone())
                .collect::<Vec<_>>()
        };
        for size in 1..list.len() {
            let cut = json_list(&pieces(list, size)).unwrap();
            assert_eq!(raws(&cut), raws(&whole), "pieces of {size}");
            assert_eq!(ids(&cut), ids(&whole), "pieces of {size}");
            assert_eq!(cut.rv, "42");
        }
    }

    #[test]
    fn quotes_and_backslashes_are_found_wherever_they_are() {
        for len in 0..100 {
            for at in 0..len {
                for c in [b'"', b'\\'] {
                    let mut s = vec![b'a'; len];
                    s[at] = c;
                    if at + 1 < len {
                        s[at + 1] = b'"';
                    }
                    assert_eq!(quote_or_backslash(&s), Some(at), "{len} {at}");
                }
            }
            assert_eq!(quote_or_backslash(&vec![0xffu8; len]), None);
        }
    }

    #[test]
    fn json_items_are_named_by_the_scan_as_a_full_parse_names_them() {
        let list = br#"{"kind":"PodList","items":[
            {"kind":"Pod","metadata":{"labels":{"name":"x","resourceVersion":"1"},"name":"a","namespace":"d","resourceVersion":"5"},"spec":{"name":"s","metadata":{"name":"t"}}},
            {"spec":{"x":1},"metadata":{"resourceVersion":"6","name":"b"}},
            {"metadata":{"name":"c\u002d1","resourceVersion":"7"}},
            {"metadata":{"namespace":"d","resourceVersion":"8"}},
            {"status":{"metadata":{"name":"e","resourceVersion":"9"}}}],"metadata":{"resourceVersion":"10"}}"#;
        let id = |ns: &str, name: &str, rv: &str| {
            Some((ns.to_string(), name.to_string(), rv.to_string()))
        };
        let expected = [id("d", "a", "5"), id("", "b", "6"), None, None, None];
        for size in [1, 2, 7, list.len()] {
            let l = json_list(&pieces(list, size)).unwrap();
            let ids: Vec<_> = l.items.iter().map(|i| i.identity.clone()).collect();
            assert_eq!(ids, expected, "pieces of {size}");
        }
    }

    #[test]
    fn json_items_may_come_first_or_be_empty_or_null() {
        for (list, n) in [
            (&br#"{"items":[{"metadata":{"name":"a"}}],"kind":"PodList","metadata":{"resourceVersion":"7"}}"#[..], 1),
            (br#"{"kind":"PodList","items":[],"metadata":{"resourceVersion":"7"}}"#, 0),
            (br#"{"kind":"PodList","items":null,"metadata":{"resourceVersion":"7"}}"#, 0),
        ] {
            let l = json_list(&pieces(list, 5)).unwrap();
            assert_eq!((l.items.len(), l.rv.as_str(), l.kind.as_str()), (n, "7", "PodList"));
        }
    }

    #[test]
    fn malformed_json_lists_are_refused() {
        for bad in [
            &b""[..],
            b"[]",
            b"{\"kind\":\"PodList\",\"items\":[{}]",
            b"{\"kind\":\"PodList\"} x",
            b"{\"kind\":\"PodList\",\"items\":[{\"a\":\"}]}",
            b"{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":}}",
            b"}{",
        ] {
            assert!(
                json_list(&pieces(bad, 3)).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn protobuf_lists_split_into_items_whatever_the_piece_boundaries() {
        let mut meta = Vec::new();
        kproto::put_bytes(&mut meta, 2, b"99");
        kproto::put_bytes(&mut meta, 3, b"next");
        let mut list = Vec::new();
        kproto::put_bytes(&mut list, 1, &meta);
        let items: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                let mut object_meta = Vec::new();
                kproto::put_bytes(
                    &mut object_meta,
                    1,
                    format!("pod-{i}").repeat(i + 1).as_bytes(),
                );
                let mut object = Vec::new();
                kproto::put_bytes(&mut object, 1, &object_meta);
                object
            })
            .collect();
        for item in &items {
            kproto::put_bytes(&mut list, 2, item);
        }
        let body = kproto::envelope("v1", "PodList", &list);
        for size in 1..body.len() {
            let l = protobuf_list(&pieces(&body, size)).unwrap();
            assert_eq!((l.kind.as_str(), l.api_version.as_str()), ("PodList", "v1"));
            assert_eq!((l.rv.as_str(), l.continue_token.as_str()), ("99", "next"));
            let raws: Vec<Bytes> = l.items.iter().map(|i| i.raw.clone()).collect();
            assert_eq!(raws, items, "pieces of {size}");
        }
        assert!(protobuf_list(&pieces(&body[..body.len() - 3], 7)).is_err());
        assert!(protobuf_list(&pieces(&body[4..], 7)).is_err());
    }
}
