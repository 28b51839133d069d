//! Content-Encoding as kube-apiserver uses it: an answer over 128 KiB is gzipped for a
//! client that sends `Accept-Encoding: gzip` (client-go, and so kubelet, always does);
//! watches never are. The hub passes the cloud's bytes to its client as they came, decodes
//! its own copy for the cache piece by piece with a bound on the decoded size, and encodes
//! its own offline answers by the same rule as the cloud.
use std::{
    io::Write,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{
    Response,
    body::{Body, Frame},
    header::{self, HeaderValue},
};

use crate::body::{BodyError, ProxyBody};

/// kube-apiserver's `defaultGzipThresholdBytes`: smaller answers go uncompressed.
pub const THRESHOLD: usize = 128 * 1024;
/// kube-apiserver's level: the fastest, since it is paid on every large answer.
const LEVEL: u32 = 1;
/// Input is decoded this much at a time, so one step can overshoot the decoded-size bound
/// by at most ~1000 times this (deflate's largest ratio), not by a whole chunk's worth.
const STEP: usize = 4096;

/// How a body is encoded, from its Content-Encoding header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    Identity,
    Gzip,
}

impl ContentEncoding {
    /// None for an encoding the hub cannot read (its answer is passed on, not cached).
    pub fn of(value: Option<&HeaderValue>) -> Option<ContentEncoding> {
        let Some(v) = value else {
            return Some(ContentEncoding::Identity);
        };
        match v.to_str().ok()?.trim() {
            e if e.eq_ignore_ascii_case("gzip") || e.eq_ignore_ascii_case("x-gzip") => {
                Some(ContentEncoding::Gzip)
            }
            e if e.is_empty() || e.eq_ignore_ascii_case("identity") => {
                Some(ContentEncoding::Identity)
            }
            _ => None,
        }
    }
}

/// Whether an Accept-Encoding header admits gzip (a `q=0` refuses it).
pub fn accepts_gzip(accept_encoding: Option<&HeaderValue>) -> bool {
    let Some(v) = accept_encoding.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    v.split(',').any(|alt| {
        let mut p = alt.split(';').map(str::trim);
        let coding = p.next().unwrap_or_default();
        let refused = p.any(|q| {
            q.strip_prefix("q=")
                .and_then(|n| n.parse::<f32>().ok())
                .is_some_and(|n| n == 0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GzipError {
    #[error("malformed gzip body: {0}")]
    Malformed(String),
    #[error("gzip body decodes to more than {0} bytes")]
    TooLarge(usize),
}

/// Decodes a gzip stream fed piece by piece, refusing to hold more than `limit` decoded
/// bytes that were not taken yet (for a whole body: its decoded size).
pub struct Decoder {
    inner: flate2::write::GzDecoder<Vec<u8>>,
    limit: usize,
}

impl Decoder {
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            inner: flate2::write::GzDecoder::new(Vec::new()),
            limit,
        }
    }

    pub fn feed(&mut self, compressed: &[u8]) -> Result<(), GzipError> {
        for step in compressed.chunks(STEP) {
            self.inner
                .write_all(step)
                .map_err(|e| GzipError::Malformed(e.to_string()))?;
            self.check()?;
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), GzipError> {
        if self.inner.get_ref().len() > self.limit {
            return Err(GzipError::TooLarge(self.limit));
        }
        Ok(())
    }

    /// The bytes decoded since the last take.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.inner.get_mut())
    }

    /// Ends the stream: the rest of the decoded bytes, or an error if it was cut short.
    pub fn finish(mut self) -> Result<Vec<u8>, GzipError> {
        self.inner
            .try_finish()
            .map_err(|e| GzipError::Malformed(e.to_string()))?;
        self.check()?;
        self.inner
            .finish()
            .map_err(|e| GzipError::Malformed(e.to_string()))
    }
}

/// A whole gzip body, arrived in pieces, decoded.
pub fn decode(parts: &[Bytes], limit: usize) -> Result<Vec<u8>, GzipError> {
    let mut d = Decoder::new(limit);
    for p in parts {
        d.feed(p)?;
    }
    d.finish()
}

/// A body gzipped at kube-apiserver's level.
pub fn encode(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::new(LEVEL),
    );
    // Writing into a Vec cannot fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

/// The hub's own answer (from the cache or the coordinator) as kube-apiserver would send
/// it to this client: gzipped when the client accepts gzip and the whole body is over
/// the threshold; watches and bodies of unknown length stay as they are.
pub async fn for_client(resp: Response<ProxyBody>, accepts: bool) -> Response<ProxyBody> {
    let streaming = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("stream=watch"))
        || resp.headers().contains_key(header::CONTENT_ENCODING);
    let large = resp
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n > THRESHOLD as u64);
    if !accepts || streaming || !large {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // A body of exact size is already in memory: collecting it does not wait.
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(parts, crate::proxy::forward::full(Bytes::new()));
    };
    let plain = collected.to_bytes();
    // Compressing a large list takes milliseconds: not on the runtime's only thread.
    let gz = tokio::task::spawn_blocking(move || encode(&plain))
        .await
        .unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts
        .headers
        .insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    Response::from_parts(parts, crate::proxy::forward::full(gz))
}

/// Most a [`decoded`] body holds from one piece of its gzip stream.
const MAX_DECODED_PIECE: usize = 64 * 1024 * 1024;

/// `body` with its `enc` undone as it streams.
pub fn decoded(body: ProxyBody, enc: ContentEncoding) -> ProxyBody {
    match enc {
        ContentEncoding::Identity => body,
        ContentEncoding::Gzip => Decoded {
            inner: body,
            decoder: Some(Decoder::new(MAX_DECODED_PIECE)),
        }
        .boxed(),
    }
}

/// A body that decodes the gzip stream it carries as it arrives.
struct Decoded {
    inner: ProxyBody,
    decoder: Option<Decoder>,
}

impl Body for Decoded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            let Some(decoder) = this.decoder.as_mut() else {
                return Poll::Ready(None);
            };
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if let Err(e) = decoder.feed(&data) {
                        this.decoder = None;
                        return Poll::Ready(Some(Err(BodyError::from(e))));
                    }
                    let out = decoder.take();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
                Some(Err(e)) => {
                    this.decoder = None;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    let rest = this.decoder.take().map(Decoder::finish);
                    return Poll::Ready(match rest {
                        Some(Ok(rest)) if !rest.is_empty() => Some(Ok(Frame::data(rest.into()))),
                        Some(Err(e)) => Some(Err(BodyError::from(e))),
                        _ => None,
                    });
                }
            }
        }
    }
}

impl From<GzipError> for BodyError {
    fn from(e: crate::gzip::GzipError) -> Self {
        BodyError::new(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_headers() {
        let h = |s: &'static str| accepts_gzip(Some(&HeaderValue::from_static(s)));
        assert!(h("gzip"));
        assert!(h("deflate, GZIP;q=0.5"));
        assert!(h("*"));
        assert!(!h("gzip;q=0"));
        assert!(!h("identity"));
        assert!(!h("br"));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn content_encodings() {
        let of = |s: &'static str| ContentEncoding::of(Some(&HeaderValue::from_static(s)));
        assert_eq!(ContentEncoding::of(None), Some(ContentEncoding::Identity));
        assert_eq!(of("gzip"), Some(ContentEncoding::Gzip));
        assert_eq!(of("identity"), Some(ContentEncoding::Identity));
        assert_eq!(of("br"), None);
    }

    #[test]
    fn round_trips_in_pieces_and_bounds_the_decoded_size() {
        let plain: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let gz = Bytes::from(encode(&plain));
        let parts: Vec<Bytes> = gz.chunks(1000).map(Bytes::copy_from_slice).collect();
        assert_eq!(decode(&parts, plain.len()).unwrap(), plain);
        assert_eq!(
            decode(&parts, plain.len() - 1),
            Err(GzipError::TooLarge(plain.len() - 1))
        );
        // Cut short, or not gzip at all: an error, never a partial body.
        assert!(matches!(
            decode(&[gz.slice(..gz.len() - 10)], usize::MAX),
            Err(GzipError::Malformed(_))
        ));
        assert!(decode(&[Bytes::from_static(b"{\"kind\":\"PodList\"}")], usize::MAX).is_err());
    }

    #[test]
    fn a_decompression_bomb_stops_near_its_bound() {
        let zeros = vec![0u8; 64 * 1024 * 1024];
        let gz = encode(&zeros);
        let mut d = Decoder::new(1024 * 1024);
        assert_eq!(d.feed(&gz), Err(GzipError::TooLarge(1024 * 1024)));
        // It stopped within one step's worth of output past the bound.
        assert!(d.inner.get_ref().len() < 1024 * 1024 + 1032 * STEP);
    }
}
