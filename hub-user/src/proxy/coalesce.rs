//! Merges response frames into fewer, larger ones, so an answer that arrives in thousands
//! of small pieces — a watch's events, or a list kube-apiserver 1.33+ streams over
//! HTTP/1.1 in 2 KiB chunks — does not cost one TLS record and one write per piece.
//! Nothing waits on a timer: when no piece is ready, the source gets one turn of the
//! scheduler to produce the next (hyper's HTTP/1.1 client decodes a chunk only once the
//! previous one was taken), and what is held goes out as soon as a turn brings nothing.
use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame};

use crate::body::{BodyError, ProxyBody};

/// Upper bound of one merged frame.
const MAX_MERGED: usize = 64 * 1024;

/// Data taken from the source and not yet handed on: the pieces, joined once as they go
/// out (an exact allocation; the cache may keep the frame for the whole answer).
#[derive(Default)]
struct Held {
    pieces: Vec<Bytes>,
    len: usize,
}

impl Held {
    fn add(&mut self, more: Bytes) {
        self.len += more.len();
        self.pieces.push(more);
    }

    fn take(&mut self) -> Option<Bytes> {
        let len = std::mem::take(&mut self.len);
        let mut pieces = std::mem::take(&mut self.pieces);
        if pieces.len() <= 1 {
            return pieces.pop();
        }
        let mut joined = BytesMut::with_capacity(len);
        for p in pieces {
            joined.extend_from_slice(&p);
        }
        Some(joined.freeze())
    }
}

pub struct Coalesce {
    inner: ProxyBody,
    held: Held,
    /// The source had its turn since the last piece came: what is held goes out.
    yielded: bool,
    /// A non-data frame (trailers) or an error seen while merging, returned next.
    pending: Option<Result<Frame<Bytes>, BodyError>>,
    done: bool,
}

impl Coalesce {
    pub fn new(inner: ProxyBody) -> Self {
        Coalesce {
            inner,
            held: Held::default(),
            yielded: false,
            pending: None,
            done: false,
        }
    }

    fn hand_on(&mut self) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.yielded = false;
        match self.held.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Ready(self.pending.take()),
        }
    }
}

impl Body for Coalesce {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(p) = self.pending.take() {
            return Poll::Ready(Some(p));
        }
        loop {
            if self.done {
                return self.hand_on();
            }
            if self.held.len >= MAX_MERGED {
                return self.hand_on();
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(more) => {
                        self.held.add(more);
                        self.yielded = false;
                    }
                    // Trailers are passed on unchanged, after what is held.
                    Err(trailers) => {
                        self.pending = Some(Ok(trailers));
                        return self.hand_on();
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    self.pending = Some(Err(e));
                    return self.hand_on();
                }
                Poll::Ready(None) => self.done = true,
                Poll::Pending if self.held.pieces.is_empty() => return Poll::Pending,
                Poll::Pending if self.yielded => return self.hand_on(),
                // One turn for the source: it is woken already if it can go on.
                Poll::Pending => {
                    self.yielded = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none()
            && self.held.pieces.is_empty()
            && (self.done || self.inner.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, time::Duration};

    use http_body_util::BodyExt;

    use super::*;

    /// A source that, like hyper's HTTP/1.1 client, has each next piece only after a turn
    /// of the scheduler: every other poll is Pending (with a wake, as its connection task
    /// would give once it decoded the piece).
    struct OneTurnApart {
        pieces: VecDeque<Result<Frame<Bytes>, BodyError>>,
        ready: bool,
    }

    impl Body for OneTurnApart {
        type Data = Bytes;
        type Error = BodyError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            if !std::mem::replace(&mut self.ready, false) {
                self.ready = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(self.pieces.pop_front())
        }
    }

    fn chunks(n: usize, size: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; size]))
            .collect()
    }

    async fn frames(body: Coalesce) -> Vec<Result<Frame<Bytes>, BodyError>> {
        let mut body = std::pin::pin!(body);
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            out.push(f);
        }
        out
    }

    fn data(frames: &[Result<Frame<Bytes>, BodyError>]) -> Vec<usize> {
        frames
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref().map(Bytes::len))
            .collect()
    }

    #[tokio::test]
    async fn pieces_one_turn_apart_go_out_as_64_kib_frames_in_order() {
        let pieces = chunks(100, 2048);
        let whole: Vec<u8> = pieces.concat();
        let source = OneTurnApart {
            pieces: pieces.into_iter().map(|b| Ok(Frame::data(b))).collect(),
            ready: false,
        };
        let out = frames(Coalesce::new(source.boxed())).await;
        // 200 KiB: three full frames and the rest.
        assert_eq!(data(&out), vec![65536, 65536, 65536, 8192]);
        let joined: Vec<u8> = out
            .into_iter()
            .flat_map(|f| f.unwrap().into_data().unwrap().to_vec())
            .collect();
        assert_eq!(joined, whole);
    }

    #[tokio::test]
    async fn a_piece_goes_out_at_once_when_no_next_one_comes() {
        // A watch: one event, then nothing for as long as the stream stays open.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(4);
        let source = Channel(rx);
        let mut body = std::pin::pin!(Coalesce::new(source.boxed()));
        tx.send(Ok(Frame::data(Bytes::from_static(b"event-1"))))
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .expect("the held piece went out without waiting for another")
            .unwrap()
            .unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"event-1"));
        drop(tx);
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn what_is_held_goes_out_before_trailers_and_before_an_error() {
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        for f in [
            Frame::data(Bytes::from_static(b"ab")),
            Frame::data(Bytes::from_static(b"cd")),
            Frame::trailers(trailers),
        ] {
            tx.send(Ok(f)).await.unwrap();
        }
        drop(tx);
        let source = Channel(rx);
        let out = frames(Coalesce::new(source.boxed())).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ref().unwrap().data_ref().unwrap(), "abcd");
        assert!(out[1].as_ref().unwrap().is_trailers());

        let source = crate::body::TestFrames(
            vec![Ok(Bytes::from_static(b"ab")), Err(BodyError::new("reset"))].into(),
        );
        let out = frames(Coalesce::new(source.boxed())).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ref().unwrap().data_ref().unwrap(), "ab");
        assert!(out[1].is_err());
    }

    /// Frames as a connection task hands them on.
    struct Channel(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BodyError>>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = BodyError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            self.0.poll_recv(cx)
        }
    }
}
