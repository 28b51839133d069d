//! Loopback ports for processes that must be told their port up front.
//!
//! Handed out from 20000–32767, below the kernel's ephemeral range (32768+), so a port
//! given to one test cannot be taken meanwhile by another test's outgoing connection or
//! `bind(:0)`; each call gets a new port, checked free when handed out.
use std::{
    net::TcpListener,
    sync::atomic::{AtomicU16, Ordering},
};

static NEXT: AtomicU16 = AtomicU16::new(0);

pub fn free_port() -> u16 {
    // Different test processes start at different offsets.
    let base = 20_000 + (std::process::id() % 400) as u16 * 30;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 12_000, "out of test ports");
        let port = 20_000 + (base - 20_000 + n) % 12_767;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
