//! How far the cache writer is behind: the bytes queued to it, and the watch streams
//! waiting for it to catch up. A watch can deliver events faster than the writer parses
//! and stores them (a burst of 10k events arrives in a tenth of a second; storing them
//! takes several); without a bound, every queued event and the buffers it shares would
//! stay in memory until written. Past the budget a teed watch stream reads nothing more
//! from the cloud until the writer is back under it, so the hub's memory stays bounded
//! and no event is left out of the cache. Whole answers are never held back: the client
//! has already been given them.
use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker},
};

/// Bytes queued to the writer past which teed watch streams wait. (bench proxy, 3 runs
/// with the build before alongside: peak RSS 41.8-42.6 MiB against 42.5-45.9; its
/// 10k-event watch ran at 0.91-1.22x direct's events/s against 1.34-1.49x.)
pub const BUDGET: usize = 4 << 20;

pub struct Room {
    budget: usize,
    queued: AtomicUsize,
    waiting: Mutex<Vec<Waker>>,
    /// The writer is gone: nothing will drain the queue, so nobody waits.
    closed: AtomicBool,
    /// Times a stream waited for room.
    pub waits: AtomicU64,
}

impl Room {
    pub fn new(budget: usize) -> Room {
        Room {
            budget,
            queued: AtomicUsize::new(0),
            waiting: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            waits: AtomicU64::new(0),
        }
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// `bytes` more were queued.
    pub fn add(&self, bytes: usize) {
        self.queued.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The writer is done with `bytes`: wakes the streams waiting once under the budget.
    pub fn done(&self, bytes: usize) {
        let before = self.queued.fetch_sub(bytes, Ordering::AcqRel);
        if before.saturating_sub(bytes) <= self.budget {
            self.wake_all();
        }
    }

    /// The writer stopped: nobody waits any more.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_all();
    }

    /// Ready while the queue is within the budget (or the writer is gone); otherwise
    /// the task is woken once it is.
    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        // The writer may have drained the queue between the check and the registration.
        if self.has_room() {
            return Poll::Ready(());
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        Poll::Pending
    }

    fn has_room(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.queued.load(Ordering::Acquire) <= self.budget
    }

    fn wake_all(&self) {
        let woken = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        for waker in woken {
            waker.wake();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{sync::Arc, task::Wake};

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    pub(crate) struct Woken(AtomicUsize);
    impl Woken {
        pub(crate) fn count(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }
    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Over the budget a stream waits; the writer's progress below it wakes the stream
    /// once; a closed writer never keeps anyone waiting.
    #[test]
    fn a_stream_waits_over_the_budget_and_is_woken_when_the_writer_is_back_under_it() {
        let room = Room::new(100);
        let count = Arc::new(Woken::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        room.add(100);
        assert!(room.poll(&mut cx).is_ready(), "at the budget there is room");
        room.add(1);
        assert!(room.poll(&mut cx).is_pending());
        assert!(
            room.poll(&mut cx).is_pending(),
            "polled again: registered once"
        );
        assert_eq!(room.waiting.lock().unwrap().len(), 1);
        room.done(1);
        assert_eq!(count.count(), 1, "woken once");
        assert!(room.poll(&mut cx).is_ready());
        assert_eq!(room.waits.load(Ordering::Relaxed), 2);

        room.add(50);
        assert!(room.poll(&mut cx).is_pending());
        room.close();
        assert_eq!(count.count(), 2);
        assert!(room.poll(&mut cx).is_ready(), "a closed writer: no waiting");
    }
}
