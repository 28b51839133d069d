//! Where an accepted connection came from, behind a trait so the proxy can be tested
//! without the kernel (design.md §9.7).
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use hub_ebpf::{Endpoint, FourTuple};
use serde::Serialize;

/// The origin of one client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConnOrigin {
    /// The address the client connected to (the VIP), before redirection.
    pub original_dst: SocketAddr,
    /// Process id of the client, 0 when unknown.
    pub pid: u32,
    /// cgroup v2 id of the client, 0 when unknown.
    pub cgroup_id: u64,
}

/// Looks up the origin of an accepted connection by its endpoints.
pub trait OriginLookup: Send + Sync {
    /// `client` is the accepted socket's peer, `local` its local address.
    fn lookup(&self, client: SocketAddr, local: SocketAddr) -> Option<ConnOrigin>;
}

/// The shared-map form of a socket address (IPv4 as IPv4-mapped IPv6).
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    match addr {
        SocketAddr::V4(a) => Endpoint::v4(u32::from_ne_bytes(a.ip().octets()), a.port()),
        SocketAddr::V6(a) => {
            let o = a.ip().octets();
            let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            Endpoint {
                addr: [word(0), word(4), word(8), word(12)],
                port: a.port(),
                _pad: 0,
            }
        }
    }
}

/// Back from the shared-map form; IPv4-mapped addresses come back as IPv4.
pub fn socket_addr(e: &Endpoint) -> SocketAddr {
    if e.is_v4() {
        let ip = Ipv4Addr::from(e.addr[3].to_ne_bytes());
        SocketAddr::V4(SocketAddrV4::new(ip, e.port))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in e.addr.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(o), e.port, 0, 0))
    }
}

pub fn four_tuple(client: SocketAddr, local: SocketAddr) -> FourTuple {
    FourTuple {
        client: endpoint(client),
        hub: endpoint(local),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_v4_mapped_equals_v4() {
        for s in ["127.0.10.1:443", "[::1]:6443", "[fe80::1]:1"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(socket_addr(&endpoint(a)), a);
        }
        let v4: SocketAddr = "169.254.2.1:10268".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:169.254.2.1]:10268".parse().unwrap();
        assert_eq!(endpoint(v4), endpoint(mapped));
        assert!(endpoint(v4).is_v4());
        // Network byte order: the first address byte is the first byte in memory.
        assert_eq!(endpoint(v4).addr[3].to_ne_bytes(), [169, 254, 2, 1]);
    }
}
