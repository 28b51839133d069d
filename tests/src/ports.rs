//! Free loopback ports for processes that must be told their port up front.
use std::net::TcpListener;

/// A port that was free a moment ago (bind to :0, read it, release it). Tests that start
/// several listeners ask for each separately.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
