//! Health of one upstream server, judged from the traffic already on its connections
//! (answers, watch events and bookmarks, PING acknowledgements, a connection's end), with
//! an active `/readyz` probe only when nothing else tells: while it is unhealthy or not
//! yet known, when a connection to it ended, and after a quiet minute. Hysteresis: a
//! couple of consecutive failures make it unhealthy, a couple of successes healthy again;
//! the very first verdict after start decides at once (nothing was known before it).
//!
//! Slow is not down (OpenYurt #1462): a probe that gets no answer in time counts as a
//! failure only when the server is *silent* — no byte arrived from it in that time (an
//! answer, a watch event) and its HTTP/2 layer did not answer a PING, which a busy
//! kube-apiserver still does at once. A frozen or dead server is silent; a loaded one is
//! not. Transport failures and repeated 5xx count too.
use std::{
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Hard failures (connect refused/reset, timeout) in a row before unhealthy.
pub const FAILS_TO_UNHEALTHY: u32 = 2;
/// 5xx answers in a row before unhealthy (the server answers, so be slower to judge).
pub const SOFT_FAILS_TO_UNHEALTHY: u32 = 5;
/// Successes in a row before healthy again.
pub const OKS_TO_HEALTHY: u32 = 2;
/// Bounds of the time a probe waits for a sign of life: a few times the PING round trip
/// measured on this server's connection, but never less than this (a loaded node's
/// scheduler delays the answer too)…
const PROBE_WAIT_MIN: Duration = Duration::from_millis(300);
/// …nor more than this, so a frozen server is found within a second (two probes).
const PROBE_WAIT_MAX: Duration = Duration::from_millis(600);

/// Milliseconds since the first call: a clock cheap enough to stamp every read with.
pub fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

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
    /// When a byte last arrived from the server ([`now_ms`]), on any connection to it.
    heard: Arc<AtomicU64>,
    /// Smoothed PING round trip on its connection, in microseconds (0: none yet).
    rtt_us: AtomicU64,
    /// When it last answered a request or probe ([`now_ms`]).
    answered: AtomicU64,
    /// Asks the prober to check this server now (a connection to it ended).
    recheck: Arc<Recheck>,
}

/// A request for the prober to check a server at once rather than at its next due time:
/// set from a connection's task, read by the prober.
#[derive(Debug)]
pub struct Recheck {
    asked: AtomicBool,
    prober: Arc<tokio::sync::Notify>,
}

impl Recheck {
    pub fn ask(&self) {
        self.asked.store(true, Ordering::SeqCst);
        self.prober.notify_one();
    }

    fn take(&self) -> bool {
        self.asked.swap(false, Ordering::SeqCst)
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new(Arc::default())
    }
}

impl Health {
    /// A server's health whose recheck requests wake `prober` (shared by a cloud's servers).
    pub fn new(prober: Arc<tokio::sync::Notify>) -> Self {
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
            heard: Arc::new(AtomicU64::new(0)),
            rtt_us: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            recheck: Arc::new(Recheck {
                asked: AtomicBool::new(false),
                prober,
            }),
        }
    }

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

    /// The stamp a connection to this server sets on every read.
    pub fn heard_handle(&self) -> Arc<AtomicU64> {
        self.heard.clone()
    }

    /// Whether a byte arrived from the server within the last `window`.
    pub fn heard_within(&self, window: Duration) -> bool {
        let at = self.heard.load(Ordering::Relaxed);
        at > 0 && now_ms().saturating_sub(at) <= window.as_millis() as u64
    }

    /// A PING answered after `rtt`.
    pub fn pinged(&self, rtt: Duration) {
        let sample = rtt.as_micros() as u64;
        let old = self.rtt_us.load(Ordering::Relaxed);
        let smooth = if old == 0 {
            sample
        } else {
            (old * 7 + sample) / 8
        };
        self.rtt_us.store(smooth.max(1), Ordering::Relaxed);
    }

    /// How long a probe waits for the server's answer or a sign of life: four smoothed
    /// PING round trips, within bounds.
    pub fn probe_wait(&self) -> Duration {
        let rtt = Duration::from_micros(self.rtt_us.load(Ordering::Relaxed));
        (rtt * 4).clamp(PROBE_WAIT_MIN, PROBE_WAIT_MAX)
    }

    /// What a connection's task calls to have this server checked now.
    pub fn recheck_handle(&self) -> Arc<Recheck> {
        self.recheck.clone()
    }

    /// Whether the prober should check this server now: it is down or not yet known, a
    /// connection to it ended, or nothing (no answer, no byte) came from it for `idle`.
    pub fn probe_due(&self, idle: Duration) -> bool {
        let asked = self.recheck.take();
        let answered = self.answered.load(Ordering::Relaxed);
        let quiet = answered == 0 || now_ms().saturating_sub(answered) > idle.as_millis() as u64;
        asked || !self.is_healthy() || !self.is_known() || (quiet && !self.heard_within(idle))
    }

    pub fn success(&self) {
        self.answered.store(now_ms(), Ordering::Relaxed);
        self.known.store(true, Ordering::SeqCst);
        self.fails.store(0, Ordering::SeqCst);
        self.soft_fails.store(0, Ordering::SeqCst);
        let oks = self.oks.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.is_healthy() && oks >= OKS_TO_HEALTHY {
            self.set(true);
        }
    }

    /// A transport failure or timeout. The first verdict after start needs no second
    /// opinion: the optimistic start was no evidence, and a hub booting while its link is
    /// silent must answer from its cache at once rather than after connect timeouts.
    pub fn failure(&self, why: &str) {
        let first = !self.known.swap(true, Ordering::SeqCst);
        self.oks.store(0, Ordering::SeqCst);
        *self.last_error.lock().unwrap() = why.to_string();
        if self.fails.fetch_add(1, Ordering::SeqCst) + 1 >= FAILS_TO_UNHEALTHY || first {
            self.set(false);
        }
    }

    /// A connection refused or reset before anything was sent: nothing there serves, so
    /// no second opinion is needed (a killed server is seen at once).
    pub fn unreachable(&self, why: &str) {
        self.known.store(true, Ordering::SeqCst);
        self.oks.store(0, Ordering::SeqCst);
        *self.last_error.lock().unwrap() = why.to_string();
        self.fails.store(FAILS_TO_UNHEALTHY, Ordering::SeqCst);
        self.set(false);
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
        h.success();
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
    fn the_probe_wait_follows_the_round_trip_within_bounds() {
        let h = Health::default();
        assert_eq!(h.probe_wait(), PROBE_WAIT_MIN, "nothing measured yet");
        for _ in 0..50 {
            h.pinged(Duration::from_millis(120));
        }
        let w = h.probe_wait();
        assert!(
            w > Duration::from_millis(450) && w <= PROBE_WAIT_MAX,
            "{w:?}"
        );
        for _ in 0..50 {
            h.pinged(Duration::from_secs(2));
        }
        assert_eq!(h.probe_wait(), PROBE_WAIT_MAX);
        assert!(!h.heard_within(Duration::from_secs(1)), "never heard");
        h.heard_handle().store(now_ms(), Ordering::Relaxed);
        assert!(h.heard_within(Duration::from_millis(100)));
    }

    #[test]
    fn waiters_learn_of_the_fall_without_polling() {
        use std::{future::Future, pin::pin, task::Context};
        let h = Health::default();
        h.success();
        let mut waiting = pin!(h.unhealthy());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        h.failure("refused");
        assert!(waiting.as_mut().poll(&mut cx).is_pending(), "still healthy");
        h.failure("refused");
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        assert!(pin!(h.unhealthy()).poll(&mut cx).is_ready(), "already down");
    }

    #[test]
    fn the_first_verdict_decides_at_once() {
        let h = Health::default();
        assert!(h.is_healthy() && !h.is_known(), "optimistic, unknown");
        h.failure("connect: timed out");
        assert!(!h.is_healthy(), "a silent link at start is not waited out");
        let h = Health::default();
        h.success();
        h.failure("timed out");
        assert!(h.is_healthy(), "once known, one failure is not enough");
    }

    #[test]
    fn a_probe_is_due_only_when_nothing_else_tells() {
        let idle = Duration::from_secs(60);
        let h = Health::default();
        assert!(h.probe_due(idle), "not known yet");
        h.success();
        assert!(!h.probe_due(idle), "just answered");
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            h.probe_due(Duration::from_millis(50)),
            "quiet for longer than `idle`"
        );
        h.heard_handle().store(now_ms(), Ordering::Relaxed);
        assert!(
            !h.probe_due(Duration::from_millis(50)),
            "a watch event arrived"
        );
        h.recheck_handle().ask();
        assert!(h.probe_due(idle), "a connection ended");
        assert!(!h.probe_due(idle), "asked once, checked once");
        h.unreachable("refused");
        assert!(h.probe_due(idle), "down: probed until it is back");
    }
}
