//! A relayed watch (or followed log) ends the way a direct connection to a dying cloud
//! would end it: every complete event already received reaches the client, then the
//! stream ends cleanly — HTTP/2 END_STREAM, or HTTP/1.1's terminating chunk — instead of
//! a reset that client-go logs as a broken watch stream. It ends so when the cloud's
//! connection fails, and when the cloud is judged down and has gone silent. Only whole
//! events are passed on, so an end never splits one.
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame};

use crate::body::{BodyError, ProxyBody};

/// How a stream's events are delimited, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// JSON watch events, one per line.
    Lines,
    /// Protobuf watch frames: a 4-byte big-endian length, then the event.
    LengthPrefixed,
    /// No events to keep whole (a log, a compressed stream): passed on as it comes.
    Bytes,
}

impl Framing {
    pub fn of(content_type: &str, compressed: bool) -> Framing {
        let ct = content_type.trim_start().to_ascii_lowercase();
        if compressed {
            Framing::Bytes
        } else if ct.starts_with("application/vnd.kubernetes.protobuf") {
            Framing::LengthPrefixed
        } else if ct.starts_with("application/json") {
            Framing::Lines
        } else {
            Framing::Bytes
        }
    }

    /// How many bytes at the front of `buf` are whole events.
    fn whole(self, buf: &[u8]) -> usize {
        match self {
            Framing::Bytes => buf.len(),
            Framing::Lines => buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1),
            Framing::LengthPrefixed => {
                let mut at = 0;
                while let Some(len) = buf.get(at..at + 4) {
                    let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    match at.checked_add(4 + n) {
                        Some(end) if end <= buf.len() => at = end,
                        _ => break,
                    }
                }
                at
            }
        }
    }
}

/// Behind a mutex only because response bodies must be Sync; it is never contended.
type Gone = std::sync::Mutex<Pin<Box<dyn Future<Output = ()> + Send>>>;

pub struct CleanEnd {
    inner: ProxyBody,
    framing: Framing,
    /// The start of an event whose rest has not arrived yet.
    carry: BytesMut,
    /// Resolves once the cloud is judged down and silent.
    gone: Option<Gone>,
    ended: bool,
}

impl CleanEnd {
    pub fn new(
        inner: ProxyBody,
        framing: Framing,
        gone: impl Future<Output = ()> + Send + 'static,
    ) -> CleanEnd {
        CleanEnd {
            inner,
            framing,
            carry: BytesMut::new(),
            gone: Some(std::sync::Mutex::new(Box::pin(gone))),
            ended: false,
        }
    }

    /// The whole events of `data` (after what was carried), keeping the rest.
    fn events(&mut self, data: Bytes) -> Bytes {
        if self.carry.is_empty() {
            let n = self.framing.whole(&data);
            if n < data.len() {
                self.carry.extend_from_slice(&data[n..]);
            }
            return data.slice(..n);
        }
        self.carry.extend_from_slice(&data);
        let n = self.framing.whole(&self.carry);
        self.carry.split_to(n).freeze()
    }

    fn end(&mut self, why: &str) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.ended = true;
        if !self.carry.is_empty() {
            tracing::debug!(
                bytes = self.carry.len(),
                "relayed stream ended ({why}); an incomplete event was not passed on"
            );
            self.carry.clear();
        } else {
            tracing::debug!("relayed stream ended: {why}");
        }
        Poll::Ready(None)
    }
}

impl Body for CleanEnd {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(gone) = self.gone.as_mut()
            && gone
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .poll(cx)
                .is_ready()
        {
            self.gone = None;
            return self.end("the cloud was judged down and went silent");
        }
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let whole = self.events(data);
                        if whole.has_remaining() {
                            return Poll::Ready(Some(Ok(Frame::data(whole))));
                        }
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Poll::Ready(Some(Err(e))) => return self.end(&format!("the cloud's side: {e}")),
                Poll::Ready(None) => {
                    // A clean end from the cloud: whatever it sent last goes on as sent.
                    self.ended = true;
                    let rest = std::mem::take(&mut self.carry);
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest.freeze()))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn run(framing: Framing, pieces: Vec<Result<&'static [u8], &'static str>>) -> Vec<u8> {
        let frames = pieces
            .into_iter()
            .map(|p| p.map(Bytes::from_static).map_err(BodyError::new))
            .collect();
        let body = CleanEnd::new(
            crate::body::TestFrames(frames).boxed(),
            framing,
            std::future::pending(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(body.collect())
            .expect("ends cleanly, never with an error")
            .to_bytes()
            .to_vec()
    }

    /// A cloud connection that fails mid-event: the events before it, whole, then a
    /// clean end; the half event is not passed on.
    #[test]
    fn a_failed_stream_ends_cleanly_after_its_last_whole_event() {
        let got = run(
            Framing::Lines,
            vec![Ok(b"{\"a\":1}\n{\"b\""), Ok(b":2}\n{\"c\""), Err("reset")],
        );
        assert_eq!(got, b"{\"a\":1}\n{\"b\":2}\n");
        let frame = |n: u8| [0, 0, 0, 2, n, n];
        let mut two = frame(1).to_vec();
        two.extend(frame(2));
        two.extend([0, 0, 0, 9, 3]);
        let leaked: &'static [u8] = Box::leak(two.into_boxed_slice());
        let got = run(Framing::LengthPrefixed, vec![Ok(leaked), Err("reset")]);
        assert_eq!(got, [frame(1), frame(2)].concat());
    }

    /// A stream that ends on its own passes on everything, byte for byte.
    #[test]
    fn a_clean_end_passes_everything_on() {
        let got = run(Framing::Lines, vec![Ok(b"{\"a\":1}\n{\"b\""), Ok(b":2}")]);
        assert_eq!(got, b"{\"a\":1}\n{\"b\":2}");
    }

    #[test]
    fn framing_follows_the_content_type() {
        assert_eq!(Framing::of("application/json", false), Framing::Lines);
        assert_eq!(
            Framing::of("application/vnd.kubernetes.protobuf;stream=watch", false),
            Framing::LengthPrefixed
        );
        assert_eq!(Framing::of("application/json", true), Framing::Bytes);
        assert_eq!(Framing::of("text/plain", false), Framing::Bytes);
    }
}
