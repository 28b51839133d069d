//! How kube-apiserver 1.36 cuts an answer's body into pieces on the wire, so a proxy in
//! front of the stand-in reads what it reads in front of the real one
//! (`fixtures/wire/kube-apiserver-1.36/list-framing*.json`):
//!
//! - over HTTP/2, protobuf and gzipped answers in 4 KiB DATA frames (its streaming list
//!   encoder and gzip write through the response writer's 4 KiB buffer), JSON in 16 KiB
//!   ones (hyper's own frame size);
//! - over HTTP/1.1, a list chunked as Go's response writer cuts its encoder's writes: a
//!   2 KiB buffer, which a write larger than what is left fills and sends as a chunk, the
//!   rest of that write going out as a chunk of its own — two chunks per item, 2048 bytes
//!   and the rest. Gzipped answers in 2048-byte chunks.
use std::ops::Range;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, header};

use super::{
    http::{Body, Pieces},
    protobuf,
};

/// The HTTP/2 frame of a protobuf or gzipped answer.
const SMALL_FRAMES: usize = 4096;
/// Go's HTTP/1.1 response writer's buffer before it chunks.
const CHUNK_BUFFER: usize = 2048;

pub async fn as_kube_apiserver(resp: Response<Body>, http11: bool) -> Response<Body> {
    let gzipped = resp.headers().contains_key(header::CONTENT_ENCODING);
    let protobuf = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|c| c == protobuf::CONTENT_TYPE);
    let whole = hyper::body::Body::size_hint(resp.body()).exact();
    let small = |limit: usize| whole.is_none_or(|n| n <= limit as u64);
    if http11 {
        if !resp.status().is_success() || small(CHUNK_BUFFER) {
            return resp;
        }
    } else if !(gzipped || protobuf) || small(SMALL_FRAMES) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let pieces = match (http11, gzipped) {
        (false, _) => fixed(&bytes, SMALL_FRAMES),
        (true, true) => fixed(&bytes, CHUNK_BUFFER),
        (true, false) => match list_writes(&bytes, protobuf) {
            Some(writes) => through_buffer(&bytes, &writes),
            // Not a list: an object, sent as it is.
            None => return Response::from_parts(parts, super::full(bytes)),
        },
    };
    let mut parts = parts;
    if http11 {
        // Chunked, as kube-apiserver sends a list: no length known ahead.
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Pieces::chunked(pieces).boxed());
    }
    Response::from_parts(parts, Pieces::new(pieces).boxed())
}

fn fixed(bytes: &Bytes, size: usize) -> Vec<Bytes> {
    (0..bytes.len())
        .step_by(size)
        .map(|at| bytes.slice(at..(at + size).min(bytes.len())))
        .collect()
}

/// The list encoder's writes: what comes before the first item, each item, what lies
/// between two items (a `,`, or an item's protobuf tag and length), what follows the last.
fn list_writes(bytes: &[u8], protobuf: bool) -> Option<Vec<Range<usize>>> {
    let items = if protobuf {
        protobuf_items(bytes)?
    } else {
        json_items(bytes)?
    };
    let mut writes = Vec::with_capacity(items.len() * 2 + 1);
    let mut at = 0;
    for item in items {
        if item.start > at {
            writes.push(at..item.start);
        }
        at = item.end;
        writes.push(item);
    }
    writes.push(at..bytes.len());
    Some(writes)
}

/// The spans of a JSON list's items.
fn json_items(bytes: &[u8]) -> Option<Vec<Range<usize>>> {
    #[derive(serde::Deserialize)]
    struct List<'a> {
        kind: String,
        #[serde(borrow)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    let list: List = serde_json::from_slice(bytes).ok()?;
    if !list.kind.ends_with("List") {
        return None;
    }
    let base = bytes.as_ptr() as usize;
    Some(
        list.items
            .iter()
            .map(|raw| {
                let start = raw.get().as_ptr() as usize - base;
                start..start + raw.get().len()
            })
            .collect(),
    )
}

/// The spans of a protobuf list's items: `k8s\0`, then runtime.Unknown whose field 2 holds
/// the list, whose field 2 repeats once per item.
fn protobuf_items(bytes: &[u8]) -> Option<Vec<Range<usize>>> {
    let body = bytes.strip_prefix(b"k8s\0")?;
    let offset = 4;
    let raw = fields(body)?
        .into_iter()
        .find(|(tag, _)| *tag == 2)
        .map(|(_, span)| span)?;
    let list = &body[raw.clone()];
    let items: Vec<_> = fields(list)?
        .into_iter()
        .filter(|(tag, _)| *tag == 2)
        .map(|(_, span)| offset + raw.start + span.start..offset + raw.start + span.end)
        .collect();
    (!items.is_empty()).then_some(items)
}

/// The length-delimited fields of a message: (field number, span of the value).
fn fields(msg: &[u8]) -> Option<Vec<(u64, Range<usize>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < msg.len() {
        let key = varint(msg, &mut at)?;
        match key & 7 {
            0 => {
                varint(msg, &mut at)?;
            }
            1 => at += 8,
            2 => {
                let len = usize::try_from(varint(msg, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|e| *e <= msg.len())?;
                out.push((key >> 3, at..end));
                at = end;
            }
            5 => at += 4,
            _ => return None,
        }
    }
    (at == msg.len()).then_some(out)
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The chunks Go's response writer (a `bufio.Writer` of 2 KiB) sends for `writes` of
/// `bytes`: a write that fits what is left of the buffer is kept; a larger one first fills
/// the buffer, which goes out, and what is left of it goes out alone when it is larger
/// than the buffer, or is kept. What the buffer holds at the end goes out last.
fn through_buffer(bytes: &Bytes, writes: &[Range<usize>]) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    // Writes follow each other through the body, so the buffer is one span of it.
    let mut buffered: Option<Range<usize>> = None;
    for w in writes {
        let held = buffered.as_ref().map_or(0, |b| b.len());
        if held + w.len() <= CHUNK_BUFFER {
            buffered = Some(buffered.map_or(w.clone(), |b| b.start..w.end));
            continue;
        }
        let mut rest = w.clone();
        if let Some(b) = buffered.take().filter(|b| !b.is_empty()) {
            let fill = w.start + (CHUNK_BUFFER - b.len());
            chunks.push(bytes.slice(b.start..fill));
            rest = fill..w.end;
        }
        if rest.len() > CHUNK_BUFFER {
            chunks.push(bytes.slice(rest));
        } else {
            buffered = Some(rest);
        }
    }
    if let Some(b) = buffered.filter(|b| !b.is_empty()) {
        chunks.push(bytes.slice(b));
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_list_goes_out_in_two_chunks_an_item_as_recorded() {
        // Three items of 7424 bytes behind an 80-byte head, as in the 1.36 recording:
        // the first item's 2048 bytes share the head's chunk, every later one carries a
        // `,`; the rest of each item is a chunk of its own, and `]}` ends it.
        let item = format!("{{\"a\":\"{}\"}}", "x".repeat(7424 - 8));
        let body = format!(
            "{{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"1\"}},\"items\":[{item},{item},{item}]}}"
        );
        let bytes = Bytes::from(body);
        let writes = list_writes(&bytes, false).unwrap();
        let sizes: Vec<usize> = through_buffer(&bytes, &writes)
            .iter()
            .map(Bytes::len)
            .collect();
        let head = bytes.len() - 3 * 7424 - 2 - 2;
        assert_eq!(
            sizes,
            vec![
                2048,
                7424 - (2048 - head),
                2048,
                7424 - 2047,
                2048,
                7424 - 2047,
                2
            ]
        );
        assert_eq!(sizes.iter().sum::<usize>(), bytes.len());
    }
}
