//! A response body that passes every frame to the client unchanged and hands a copy to the
//! cache writer: whole GET/LIST answers once they have arrived completely (an answer cut
//! short is never cached), watch events one by one as they stream. The copy is a reference
//! count on the same buffers; parsing happens on the writer thread, not here. A gzipped
//! answer reaches the client as the cloud sent it; the writer decodes its copy (a whole
//! answer), or the tee decodes a gzipped watch stream piece by piece to split its events.
use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame};

use super::{
    objects::Encoding,
    writer::{Op, Target, Writer},
};
use crate::{
    body::{BodyError, ProxyBody},
    gzip,
};

/// Answers larger than this are passed on but not cached.
pub const MAX_CACHED_BODY: usize = 64 * 1024 * 1024;
/// A single watch event larger than this is not cached (kube-apiserver caps objects at
/// 1.5 MiB in etcd; this leaves room for JSON overhead).
const MAX_EVENT: usize = 16 * 1024 * 1024;

enum Sink {
    /// A GET or LIST: kept until the end, then handed over whole.
    Whole {
        parts: Vec<Bytes>,
        len: usize,
        target: Option<Target>,
        gzip: bool,
    },
    /// A watch: events are split off as they complete.
    Events {
        carry: BytesMut,
        target: Target,
        broken: bool,
        /// Decodes a gzipped stream before it is split (boxed: watches are rarely gzipped).
        gunzip: Option<Box<gzip::Decoder>>,
    },
}

pub struct Tee {
    inner: ProxyBody,
    sink: Sink,
    writer: Writer,
    finished: bool,
}

impl Tee {
    pub fn whole(inner: ProxyBody, target: Target, gzip: bool, writer: Writer) -> Tee {
        Tee {
            inner,
            sink: Sink::Whole {
                parts: Vec::new(),
                len: 0,
                target: Some(target),
                gzip,
            },
            writer,
            finished: false,
        }
    }

    pub fn events(inner: ProxyBody, target: Target, gzip: bool, writer: Writer) -> Tee {
        Tee {
            inner,
            sink: Sink::Events {
                carry: BytesMut::new(),
                target,
                broken: false,
                gunzip: gzip.then(|| Box::new(gzip::Decoder::new(MAX_EVENT))),
            },
            writer,
            finished: false,
        }
    }

    fn data(&mut self, chunk: &Bytes) {
        match &mut self.sink {
            Sink::Whole {
                parts, len, target, ..
            } => {
                if target.is_none() {
                    return;
                }
                *len += chunk.len();
                if *len > MAX_CACHED_BODY {
                    parts.clear();
                    *target = None;
                    self.writer.too_large();
                    return;
                }
                parts.push(chunk.clone());
            }
            Sink::Events {
                carry,
                target,
                broken,
                gunzip,
            } => {
                if *broken {
                    return;
                }
                match gunzip {
                    None => carry.extend_from_slice(chunk),
                    Some(d) => match d.feed(chunk) {
                        Ok(()) => carry.extend_from_slice(&d.take()),
                        Err(e) => {
                            // Not a stream we can read; stop copying, keep forwarding.
                            tracing::debug!("cache: {} watch: {e}", target.gvr);
                            *broken = true;
                            carry.clear();
                            return;
                        }
                    },
                }
                loop {
                    let frame = match target.encoding {
                        Encoding::Json => match carry.iter().position(|b| *b == b'\n') {
                            Some(i) => {
                                let line = carry.split_to(i + 1).freeze();
                                line.slice(..i)
                            }
                            None => break,
                        },
                        Encoding::Protobuf => {
                            if carry.len() < 4 {
                                break;
                            }
                            let n = u32::from_be_bytes([carry[0], carry[1], carry[2], carry[3]])
                                as usize;
                            if carry.len() < 4 + n {
                                break;
                            }
                            carry.advance(4);
                            carry.split_to(n).freeze()
                        }
                    };
                    if !frame.is_empty() {
                        self.writer.send(Op::Event {
                            target: target.clone(),
                            frame,
                        });
                    }
                }
                if carry.len() > MAX_EVENT {
                    // Not a watch stream we understand; stop copying, keep forwarding.
                    *broken = true;
                    carry.clear();
                    self.writer.too_large();
                }
            }
        }
    }

    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if let Sink::Whole {
            parts,
            target,
            gzip,
            ..
        } = &mut self.sink
            && let Some(target) = target.take()
        {
            self.writer.send_whole(target, std::mem::take(parts), *gzip);
        }
    }
}

impl Body for Tee {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(chunk) = frame.data_ref() {
                    let chunk = chunk.clone();
                    self.data(&chunk);
                }
                if self.inner.is_end_stream() {
                    self.finish();
                }
            }
            Poll::Ready(None) => self.finish(),
            // An upstream error mid-body: the answer is incomplete, cache nothing.
            Poll::Ready(Some(Err(_))) => {
                self.finished = true;
                if let Sink::Whole { target, .. } = &mut self.sink {
                    *target = None;
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
