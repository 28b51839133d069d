//! Knobs tests turn to make the cloud misbehave: latency, a share of 5xx answers, refused
//! connections, frozen watches — and a server cost, the CPU a real kube-apiserver spends per
//! answer, so that a proxy's own cost is measured against a realistic upstream. Set
//! through the library handle or `PUT /_standin/faults`.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

#[derive(Debug, Default)]
pub struct Faults {
    latency_ms: AtomicU64,
    error_permille: AtomicU32,
    refuse: AtomicBool,
    freeze_watches: AtomicBool,
    cost_us: AtomicU64,
    cost_us_per_kib: AtomicU64,
    counter: AtomicU64,
}

/// The knobs as JSON (what the control endpoint reads and returns).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultSettings {
    /// Added to every request before it is served.
    pub latency_ms: u64,
    /// Share of requests (per mille) answered 503 with a Status body.
    pub error_permille: u32,
    /// Accept connections and close them at once.
    pub refuse: bool,
    /// Open watches stop delivering events (the connection stays up).
    pub freeze_watches: bool,
    /// CPU spent on every answer (not watches) before it is sent, in µs.
    pub cost_us: u64,
    /// And per KiB of the answer: a real apiserver's serialisation grows with the size.
    pub cost_us_per_kib: u64,
}

impl FaultSettings {
    /// kube-apiserver 1.32's profile on a small machine: a GET of one pod costs about
    /// 1 ms of server time and a 1k-pod JSON list (~1 MiB here) about 20 ms.
    pub const REALISTIC_COST: FaultSettings = FaultSettings {
        latency_ms: 0,
        error_permille: 0,
        refuse: false,
        freeze_watches: false,
        cost_us: 1000,
        cost_us_per_kib: 18,
    };
}

impl Faults {
    pub fn set(&self, s: FaultSettings) {
        self.latency_ms.store(s.latency_ms, Ordering::SeqCst);
        self.error_permille
            .store(s.error_permille.min(1000), Ordering::SeqCst);
        self.refuse.store(s.refuse, Ordering::SeqCst);
        self.freeze_watches
            .store(s.freeze_watches, Ordering::SeqCst);
        self.cost_us.store(s.cost_us, Ordering::SeqCst);
        self.cost_us_per_kib
            .store(s.cost_us_per_kib, Ordering::SeqCst);
    }

    pub fn get(&self) -> FaultSettings {
        FaultSettings {
            latency_ms: self.latency_ms.load(Ordering::SeqCst),
            error_permille: self.error_permille.load(Ordering::SeqCst),
            refuse: self.refuse.load(Ordering::SeqCst),
            freeze_watches: self.freeze_watches.load(Ordering::SeqCst),
            cost_us: self.cost_us.load(Ordering::SeqCst),
            cost_us_per_kib: self.cost_us_per_kib.load(Ordering::SeqCst),
        }
    }

    /// The server cost as set now: (µs per answer, µs per KiB).
    pub fn server_cost(&self) -> (u64, u64) {
        (
            self.cost_us.load(Ordering::Relaxed),
            self.cost_us_per_kib.load(Ordering::Relaxed),
        )
    }

    pub fn latency(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.latency_ms.load(Ordering::Relaxed))
    }

    /// Deterministic spread: every request advances a counter; `permille` of each 1000
    /// consecutive requests fail.
    pub fn should_fail(&self) -> bool {
        let p = self.error_permille.load(Ordering::Relaxed) as u64;
        if p == 0 {
            return false;
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        (n * 7919 % 1000) < p
    }

    pub fn refusing(&self) -> bool {
        self.refuse.load(Ordering::Relaxed)
    }

    pub fn watches_frozen(&self) -> bool {
        self.freeze_watches.load(Ordering::Relaxed)
    }
}

/// The CPU an answer of `bytes` costs the server, zero when the knob is off.
pub fn cost(per_answer_us: u64, per_kib_us: u64, bytes: u64) -> std::time::Duration {
    std::time::Duration::from_micros(per_answer_us + per_kib_us * bytes / 1024)
}

/// Keeps this thread's CPU busy for `cpu` of CPU time (not wall time: on a busy machine the
/// server still spends what a real one would).
pub fn spend_cpu(cpu: std::time::Duration) {
    fn thread_cpu() -> std::time::Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
    let until = thread_cpu() + cpu;
    let mut x = 0u64;
    while thread_cpu() < until {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
}
