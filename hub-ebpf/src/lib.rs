//! Map key/value layouts shared by the eBPF programs and user space.
//!
//! Every layout lives here and only here. All types are `#[repr(C)]` with explicit
//! padding and a size assertion, so the kernel, the programs and `hub` agree byte for byte.
//! Addresses are always 16 bytes: IPv4 is stored in its IPv4-mapped IPv6 form
//! (`::ffff:a.b.c.d`), the same form `connect6` sees for mapped connects, so one key type
//! serves both families. Address words are in network byte order (as the kernel hands them
//! over); ports are in host byte order so `bpftool` prints them readably.
#![no_std]

/// Pinned/ELF map names (also the file names under `/sys/fs/bpf/hub/`).
pub const MAP_VIPS: &str = "HUB_VIPS";
pub const MAP_VIP_STATS: &str = "HUB_VIP_STATS";
pub const MAP_SETTINGS: &str = "HUB_SETTINGS";
pub const MAP_PENDING: &str = "HUB_PENDING";
pub const MAP_ORIGINS: &str = "HUB_ORIGINS";
/// Ring buffer of [`TraceEvent`]s, written only while someone traces (`Settings::trace`).
pub const MAP_TRACE: &str = "HUB_TRACE";

/// Program names as they appear in the object and in `bpftool prog`.
pub const PROG_CONNECT4: &str = "hub_connect4";
pub const PROG_CONNECT6: &str = "hub_connect6";
pub const PROG_SOCK_OPS: &str = "hub_sock_ops";

/// Capacity of the VIP table.
pub const MAX_VIPS: u32 = 256;
/// Capacity of the per-connection origin tables (connections in flight at once).
pub const MAX_ORIGINS: u32 = 65536;
/// Size of the trace ring buffer in bytes (a power of two, a multiple of the page size):
/// room for ~2900 events between two reads.
pub const TRACE_RING_BYTES: u32 = 256 * 1024;

/// An IP endpoint: 16-byte address (IPv4 mapped) + port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    /// Address as four network-byte-order words.
    pub addr: [u32; 4],
    /// Port in host byte order.
    pub port: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<Endpoint>() == 20);

impl Endpoint {
    /// The IPv4-mapped prefix word 2 (`::ffff:0:0/96`), in network byte order.
    pub const V4_MAPPED_WORD: u32 = u32::from_be(0x0000_ffff);

    /// Builds the mapped form of an IPv4 address given in network byte order.
    pub const fn v4(ip_be: u32, port: u16) -> Self {
        Endpoint {
            addr: [0, 0, Self::V4_MAPPED_WORD, ip_be],
            port,
            _pad: 0,
        }
    }

    pub const fn is_v4(&self) -> bool {
        self.addr[0] == 0 && self.addr[1] == 0 && self.addr[2] == Self::V4_MAPPED_WORD
    }
}

/// Key of the VIP table: the apiserver address a client connects to.
pub type VipKey = Endpoint;

/// Value of the VIP table: where a connect() to that VIP is sent instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VipTarget {
    /// The hub listener for this VIP (same family as the VIP, mapped for IPv4).
    pub target: Endpoint,
    /// Index of the VIP in the hub's configuration, for logs and status.
    pub index: u32,
}
const _: () = assert!(core::mem::size_of::<VipTarget>() == 24);

/// Per-VIP counters, one copy per CPU (user space sums them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VipStats {
    /// connect() calls rewritten to the hub.
    pub redirected: u64,
    /// connect() calls to the VIP left alone because the socket carries the bypass mark.
    pub bypassed: u64,
    /// Internal errors (a map update failed); the connect was allowed through unchanged
    /// or redirected without origin information.
    pub errors: u64,
    /// Trace events lost because the ring buffer was full (the reader fell behind).
    pub trace_lost: u64,
}
const _: () = assert!(core::mem::size_of::<VipStats>() == 32);

/// Global settings written by user space at start (single-entry array, key 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Settings {
    /// SO_MARK carried by the hub's own upstream sockets; such sockets are never redirected.
    pub bypass_mark: u32,
    /// Non-zero once user space has filled the maps; programs do nothing before that.
    pub enabled: u32,
    /// Non-zero while a `hub trace` listens: connects to a VIP are then also written to
    /// the trace ring buffer. Zero costs one branch.
    pub trace: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Settings>() == 16);

/// Who opened a redirected connection and where it was going.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Origin {
    /// The destination the client asked for (the VIP).
    pub original_dst: Endpoint,
    /// Thread group id (the process id) of the connecting task.
    pub pid: u32,
    /// cgroup v2 id of the connecting task.
    pub cgroup_id: u64,
}
const _: () = assert!(core::mem::size_of::<Origin>() == 32);

/// A TCP connection as the hub sees it on accept: client (peer) and hub (local) endpoints.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FourTuple {
    pub client: Endpoint,
    pub hub: Endpoint,
}
const _: () = assert!(core::mem::size_of::<FourTuple>() == 40);

/// What the connect hook did with a connect to a VIP ([`TraceEvent::verdict`]).
pub const VERDICT_REDIRECTED: u32 = 1;
/// Left alone: the socket carries the bypass mark (the hub's own upstream connection).
pub const VERDICT_BYPASSED: u32 = 2;
/// Redirected, but the origin could not be recorded (a map was full).
pub const VERDICT_ERROR: u32 = 3;

/// One connect to a VIP, as `hub trace` shows it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceEvent {
    /// CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns).
    pub time_ns: u64,
    /// cgroup v2 id of the connecting task.
    pub cgroup_id: u64,
    /// Thread group id (the process id) of the connecting task.
    pub pid: u32,
    /// One of the `VERDICT_*` values.
    pub verdict: u32,
    /// The destination the client asked for (the VIP).
    pub original_dst: Endpoint,
    /// Where the connect was sent (the hub listener); zero when bypassed.
    pub redirected_to: Endpoint,
    /// The task's command name, NUL-padded.
    pub comm: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<TraceEvent>() == 80);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all types are repr(C), Copy, with explicit padding and no invalid bit patterns.
    unsafe impl aya::Pod for super::Endpoint {}
    unsafe impl aya::Pod for super::VipTarget {}
    unsafe impl aya::Pod for super::VipStats {}
    unsafe impl aya::Pod for super::Settings {}
    unsafe impl aya::Pod for super::Origin {}
    unsafe impl aya::Pod for super::FourTuple {}
    unsafe impl aya::Pod for super::TraceEvent {}
}
