//! Knobs tests turn to make the cloud misbehave: latency, a share of 5xx answers, refused
//! connections, frozen watches. Set through the library handle or `PUT /_standin/faults`.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

#[derive(Debug, Default)]
pub struct Faults {
    latency_ms: AtomicU64,
    error_permille: AtomicU32,
    refuse: AtomicBool,
    freeze_watches: AtomicBool,
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
}

impl Faults {
    pub fn set(&self, s: FaultSettings) {
        self.latency_ms.store(s.latency_ms, Ordering::SeqCst);
        self.error_permille
            .store(s.error_permille.min(1000), Ordering::SeqCst);
        self.refuse.store(s.refuse, Ordering::SeqCst);
        self.freeze_watches
            .store(s.freeze_watches, Ordering::SeqCst);
    }

    pub fn get(&self) -> FaultSettings {
        FaultSettings {
            latency_ms: self.latency_ms.load(Ordering::SeqCst),
            error_permille: self.error_permille.load(Ordering::SeqCst),
            refuse: self.refuse.load(Ordering::SeqCst),
            freeze_watches: self.freeze_watches.load(Ordering::SeqCst),
        }
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
