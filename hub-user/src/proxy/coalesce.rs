//! Merges response frames that are already available into one, so a watch that delivers
//! thousands of small events does not cost one TLS record and one write per event. Only
//! frames that are ready now are merged: nothing waits, so latency is unchanged.
use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame};

use crate::body::{BodyError, ProxyBody};

/// Upper bound of one merged frame.
const MAX_MERGED: usize = 64 * 1024;

pub struct Coalesce {
    inner: ProxyBody,
    /// A non-data frame (trailers) or an error seen while merging, returned next.
    pending: Option<Result<Frame<Bytes>, BodyError>>,
    done: bool,
}

impl Coalesce {
    pub fn new(inner: ProxyBody) -> Self {
        Coalesce {
            inner,
            pending: None,
            done: false,
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
        if self.done {
            return Poll::Ready(None);
        }
        let first = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            other => return other,
        };
        let first = match first.into_data() {
            Ok(data) => data,
            // Trailers are passed on unchanged.
            Err(frame) => return Poll::Ready(Some(Ok(frame))),
        };
        let mut merged: Option<BytesMut> = None;
        loop {
            let len = merged.as_ref().map_or(first.len(), |m| m.len());
            if len >= MAX_MERGED {
                break;
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(more) => merged
                        .get_or_insert_with(|| BytesMut::from(&first[..]))
                        .extend_from_slice(&more),
                    Err(trailers) => {
                        self.pending = Some(Ok(trailers));
                        break;
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    self.pending = Some(Err(e));
                    break;
                }
                Poll::Ready(None) => {
                    self.done = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        Poll::Ready(Some(Ok(Frame::data(
            merged.map_or(first, BytesMut::freeze),
        ))))
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && (self.done || self.inner.is_end_stream())
    }
}
