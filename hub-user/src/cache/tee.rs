//! A response body that passes every frame to the client unchanged and hands a copy to the
//! cache writer: whole GET/LIST answers once they have arrived completely (an answer cut
//! short is never cached), watch events one by one as they stream. The copy is a reference
//! count on the same buffers; parsing happens on the writer thread, not here. A gzipped
//! answer reaches the client as the cloud sent it; the writer decodes its copy (a whole
//! answer), or the tee decodes a gzipped watch stream piece by piece to split its events.
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame};

use super::{
    objects::{self, Encoding, EventType},
    writer::{Op, Target, TargetKind, Writer},
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
        /// Shared by every event handed over (a clone per event cost as much as its copy).
        target: Arc<Target>,
        broken: bool,
        /// Decodes a gzipped stream before it is split (boxed: watches are rarely gzipped).
        gunzip: Option<Box<gzip::Decoder>>,
        /// A streamed list's initial events, kept until the bookmark that ends them; None
        /// for a plain watch, and once they ended or were given up.
        initial: Option<Initial>,
    },
}

/// The initial events of a streamed list so far.
#[derive(Default)]
struct Initial {
    frames: Vec<Bytes>,
    bytes: usize,
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

    /// A watch; `streamed_list`: it was asked with `sendInitialEvents=true`, so its events
    /// up to the initial-events-end bookmark are a whole list.
    pub fn events(
        inner: ProxyBody,
        target: Target,
        gzip: bool,
        streamed_list: bool,
        writer: Writer,
    ) -> Tee {
        Tee {
            inner,
            sink: Sink::Events {
                carry: BytesMut::new(),
                target: Arc::new(target),
                broken: false,
                gunzip: gzip.then(|| Box::new(gzip::Decoder::new(MAX_EVENT))),
                initial: streamed_list.then(Initial::default),
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
                initial,
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
                        pass_on(&self.writer, target, initial, frame);
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

/// Hands one watch event to the writer. A streamed list's initial events are kept until
/// the bookmark that ends them and then handed over together, as the list they are; a
/// stream that ends or fails (an ERROR event) before it changes nothing held. Too large a
/// set is given up: its events are then stored one by one, as a plain watch's are.
fn pass_on(writer: &Writer, target: &mut Arc<Target>, initial: &mut Option<Initial>, frame: Bytes) {
    let Some(set) = initial else {
        writer.send(Op::Event {
            target: target.clone(),
            frame,
        });
        return;
    };
    match objects::event_type(target.encoding, &frame) {
        EventType::Bookmark => {
            let Some(end) =
                objects::bookmark(target.encoding, &frame).filter(|b| b.initial_events_end)
            else {
                return;
            };
            let frames = std::mem::take(&mut set.frames);
            *initial = None;
            if let TargetKind::Watch {
                keeps_list_from, ..
            } = &mut Arc::make_mut(target).kind
            {
                *keeps_list_from = Some(end.rv);
            }
            writer.send(Op::StreamedList {
                target: Target::clone(target),
                frames,
                end,
            });
        }
        EventType::Other => *initial = None,
        _ => {
            set.bytes += frame.len();
            if set.bytes > MAX_CACHED_BODY {
                writer.too_large();
                *initial = None;
                return;
            }
            set.frames.push(frame);
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
        // A watch reads no further while the writer is too far behind (see `room`).
        if matches!(self.sink, Sink::Events { broken: false, .. })
            && !self.finished
            && self.writer.poll_room(cx).is_pending()
        {
            return Poll::Pending;
        }
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

#[cfg(test)]
mod tests {
    use std::{sync::atomic::Ordering, time::Duration};

    use http_body_util::BodyExt;

    use super::*;
    use crate::cache::{
        room::tests::Woken,
        store::{self, Store},
        writer::tests::{
            detached_writer, done_with, list, pod, pods_target, writer_on_temp_store,
            writer_on_temp_store_within,
        },
    };

    fn added(name: &str, rv: u64) -> Result<Bytes, BodyError> {
        let object = String::from_utf8(pod(name, rv).to_vec()).unwrap();
        Ok(format!("{{\"type\":\"ADDED\",\"object\":{object}}}\n").into())
    }

    fn bookmark(rv: u64, end: bool) -> Result<Bytes, BodyError> {
        let annotations = if end {
            r#","annotations":{"k8s.io/initial-events-end":"true"}"#
        } else {
            ""
        };
        Ok(format!(
            r#"{{"type":"BOOKMARK","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"{annotations}}},"spec":{{"containers":null}},"status":{{}}}}}}"#
        )
        .into_bytes()
        .into_iter()
        .chain(*b"\n")
        .collect::<Vec<u8>>()
        .into())
    }

    /// The kubelet's streamed list of its pods in `d`.
    fn streamed(frames: Vec<Result<Bytes, BodyError>>, writer: &Writer) {
        let target = pods_target(TargetKind::Watch {
            selection_may_change: false,
            namespace: "d".into(),
            selector: Default::default(),
            keeps_list_from: None,
        });
        let body = crate::body::TestFrames(frames.into()).boxed();
        let tee = Tee::events(body, target, false, true, writer.clone());
        let collected = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(tee.collect());
        drop(collected);
    }

    fn pods_watch() -> Target {
        pods_target(TargetKind::Watch {
            selection_may_change: false,
            namespace: "d".into(),
            selector: Default::default(),
            keeps_list_from: None,
        })
    }

    /// Past the writer's budget a watch reads nothing more from the cloud (the client
    /// gets nothing more either) until the writer is done with what it holds; then it
    /// goes on where it stopped.
    #[test]
    fn a_watch_waits_while_the_writer_is_behind_and_goes_on_when_it_catches_up() {
        let (dir, writer, queued) = detached_writer(1);
        let frames = vec![added("a", 1), added("b", 2), added("c", 3)];
        let expected: Vec<Bytes> = frames.iter().map(|f| f.as_ref().unwrap().clone()).collect();
        let body = crate::body::TestFrames(frames.into()).boxed();
        let mut tee = Tee::events(body, pods_watch(), false, false, writer.clone());
        let woken = Arc::new(Woken::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut next = |tee: &mut Tee| match Pin::new(tee).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => Some(frame.into_data().unwrap()),
            Poll::Ready(other) => panic!("unexpected {:?}", other.map(|r| r.is_ok())),
            Poll::Pending => None,
        };

        assert_eq!(next(&mut tee), Some(expected[0].clone()), "an empty queue");
        assert_eq!(
            next(&mut tee),
            None,
            "a's event is over the budget of 1 byte"
        );
        assert_eq!(next(&mut tee), None, "still behind");
        let a = queued.try_recv().unwrap();
        assert!(queued.try_recv().is_err(), "b was not read from the cloud");
        assert_eq!(woken.count(), 0);

        done_with(&writer, &a);
        assert_eq!(woken.count(), 1, "the writer's progress wakes the stream");
        assert_eq!(next(&mut tee), Some(expected[1].clone()));
        assert_eq!(next(&mut tee), None);
        done_with(&writer, &queued.try_recv().unwrap());
        assert_eq!(next(&mut tee), Some(expected[2].clone()));
        assert_eq!(writer.waits(), 3);
        drop((tee, writer, queued));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A burst of events far past the writer's budget reaches the client whole, in
    /// order, and every event reaches the store.
    #[test]
    fn a_burst_past_the_writer_s_budget_loses_nothing() {
        let (dir, store, _stats, writer) = writer_on_temp_store_within("burst", 4096);
        let frames: Vec<_> = (0..500).map(|i| added(&format!("p{i}"), 10 + i)).collect();
        let expected: Vec<Bytes> = frames.iter().map(|f| f.as_ref().unwrap().clone()).collect();
        let body = crate::body::TestFrames(frames.into()).boxed();
        let tee = Tee::events(body, pods_watch(), false, false, writer.clone());
        let delivered = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(tee.collect())
            .unwrap()
            .to_bytes();
        assert_eq!(delivered, expected.concat());
        writer.flush_within(Duration::from_secs(60));
        let mut stored = live(&store);
        stored.sort_by_key(|(_, rv)| *rv);
        let want: Vec<(String, u64)> = (0..500).map(|i| (format!("p{i}"), 10 + i)).collect();
        assert_eq!(stored, want);
        assert_eq!(writer.queued_bytes(), 0);
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn live(store: &Store) -> Vec<(String, u64)> {
        store
            .scan(&store::prefix("node", "/v1/pods", None, None))
            .unwrap()
            .into_iter()
            .filter(|(_, r)| !r.deleted)
            .map(|(k, r)| (k.name, r.item.rv))
            .collect()
    }

    /// A streamed list replaces the held set at its end bookmark, as a LIST does: what it
    /// did not send is pruned; the events after it apply as a watch's; every bookmark
    /// moves the set's resourceVersion. One cut before its end changes nothing.
    #[test]
    fn a_streamed_list_replaces_the_set_at_its_end_bookmark_and_not_before() {
        let (dir, store, stats, writer) = writer_on_temp_store("streamed");
        let flush = || writer.flush_within(Duration::from_secs(30));
        let list_rv = || store.list_metas("node", "/v1/pods", "d").unwrap()[0].rv;
        writer.send(list(100, &[("a", 5), ("b", 5), ("c", 5)]));
        flush();
        assert_eq!(
            live(&store),
            [("a".into(), 5), ("b".into(), 5), ("c".into(), 5)]
        );

        // Cut after two of its initial events: nothing held changes.
        streamed(
            vec![added("a", 6), added("b", 5), Err(BodyError::new("reset"))],
            &writer,
        );
        flush();
        assert_eq!(
            live(&store),
            [("a".into(), 5), ("b".into(), 5), ("c".into(), 5)]
        );
        assert_eq!(list_rv(), 100);

        // Whole: c is gone, a changed, d is new; then a watch event and a bookmark.
        streamed(
            vec![
                added("a", 6),
                added("b", 5),
                added("d", 7),
                bookmark(200, true),
                added("e", 210),
                bookmark(220, false),
            ],
            &writer,
        );
        flush();
        assert_eq!(
            live(&store),
            [
                ("a".into(), 6),
                ("b".into(), 5),
                ("d".into(), 7),
                ("e".into(), 210)
            ]
        );
        assert_eq!(stats.deleted.load(Ordering::Relaxed), 1, "c pruned");
        assert_eq!(list_rv(), 220, "the later bookmark moved the set");
        let meta = &store.list_metas("node", "/v1/pods", "d").unwrap()[0];
        assert_eq!(meta.kind, "PodList");
        drop(writer);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
