//! Health of one upstream server, from active probes and from real traffic, with
//! hysteresis: a couple of consecutive failures make it unhealthy (about a second with the
//! probe interval), a couple of consecutive successes make it healthy again. A server that
//! answers is never marked unhealthy for being slow (OpenYurt #1462): only transport
//! failures, timeouts and repeated 5xx count.
use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicU32, Ordering},
};

/// Hard failures (connect refused/reset, timeout) in a row before unhealthy.
pub const FAILS_TO_UNHEALTHY: u32 = 2;
/// 5xx answers in a row before unhealthy (the server answers, so be slower to judge).
pub const SOFT_FAILS_TO_UNHEALTHY: u32 = 5;
/// Successes in a row before healthy again.
pub const OKS_TO_HEALTHY: u32 = 2;

#[derive(Debug)]
pub struct Health {
    healthy: AtomicBool,
    /// Any probe or request has reported on this server since the hub started.
    known: AtomicBool,
    fails: AtomicU32,
    soft_fails: AtomicU32,
    oks: AtomicU32,
    transitions: AtomicU32,
    last_error: Mutex<String>,
    /// Wakes requests waiting on this server when it turns unhealthy.
    went_down: tokio::sync::Notify,
}

impl Default for Health {
    fn default() -> Self {
        // Optimistic at start: the first real request or probe decides.
        Health {
            healthy: AtomicBool::new(true),
            known: AtomicBool::new(false),
            fails: AtomicU32::new(0),
            soft_fails: AtomicU32::new(0),
            oks: AtomicU32::new(0),
            transitions: AtomicU32::new(0),
            last_error: Mutex::new(String::new()),
            went_down: tokio::sync::Notify::new(),
        }
    }
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// False until the first probe or request has reported (just after start).
    pub fn is_known(&self) -> bool {
        self.known.load(Ordering::SeqCst)
    }

    pub fn transitions(&self) -> u32 {
        self.transitions.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> String {
        self.last_error.lock().unwrap().clone()
    }

    fn set(&self, healthy: bool) {
        if self.healthy.swap(healthy, Ordering::SeqCst) != healthy {
            self.transitions.fetch_add(1, Ordering::Relaxed);
            if !healthy {
                self.went_down.notify_waiters();
            }
        }
    }

    /// Returns once the server is unhealthy. Event-driven rather than polled: a timer per
    /// request would wake the runtime's driver on every forwarded request.
    pub async fn unhealthy(&self) {
        loop {
            let notified = self.went_down.notified();
            if !self.is_healthy() {
                return;
            }
            notified.await;
        }
    }

    pub fn success(&self) {
        self.known.store(true, Ordering::SeqCst);
        self.fails.store(0, Ordering::SeqCst);
        self.soft_fails.store(0, Ordering::SeqCst);
        let oks = self.oks.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.is_healthy() && oks >= OKS_TO_HEALTHY {
            self.set(true);
        }
    }

    /// A transport failure or timeout.
    pub fn failure(&self, why: &str) {
        self.known.store(true, Ordering::SeqCst);
        self.oks.store(0, Ordering::SeqCst);
        *self.last_error.lock().unwrap() = why.to_string();
        if self.fails.fetch_add(1, Ordering::SeqCst) + 1 >= FAILS_TO_UNHEALTHY {
            self.set(false);
        }
    }

    /// A 5xx answer: the server is up but not serving.
    pub fn soft_failure(&self, why: &str) {
        self.known.store(true, Ordering::SeqCst);
        self.oks.store(0, Ordering::SeqCst);
        *self.last_error.lock().unwrap() = why.to_string();
        if self.soft_fails.fetch_add(1, Ordering::SeqCst) + 1 >= SOFT_FAILS_TO_UNHEALTHY {
            self.set(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis_both_ways() {
        let h = Health::default();
        h.failure("refused");
        assert!(h.is_healthy(), "one failure is not enough");
        h.success();
        h.failure("refused");
        assert!(h.is_healthy(), "a success in between resets the count");
        h.failure("refused");
        assert!(!h.is_healthy());
        h.success();
        assert!(!h.is_healthy(), "one success is not enough");
        h.success();
        assert!(h.is_healthy());
        for _ in 0..SOFT_FAILS_TO_UNHEALTHY - 1 {
            h.soft_failure("503");
        }
        assert!(h.is_healthy(), "a few 5xx do not flip it");
        h.soft_failure("503");
        assert!(!h.is_healthy());
        assert_eq!(h.transitions(), 3);
    }

    #[test]
    fn waiters_learn_of_the_fall_without_polling() {
        use std::{future::Future, pin::pin, task::Context};
        let h = Health::default();
        let mut waiting = pin!(h.unhealthy());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        h.failure("refused");
        assert!(waiting.as_mut().poll(&mut cx).is_pending(), "still healthy");
        h.failure("refused");
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        assert!(pin!(h.unhealthy()).poll(&mut cx).is_ready(), "already down");
    }
}
