//! hub: the node agent between a node's clients and the cloud kube-apiserver.
//! One module per concern; `main.rs` only parses the command line.
pub mod admin;
pub mod approver;
pub mod body;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod config;
pub mod convert;
pub mod coordinator;
pub mod daemon;
pub mod files;
pub mod gzip;
pub mod install;
pub mod intercept;
pub mod kproto;
pub mod live;
pub mod metrics;
pub mod node_layout;
pub mod owner;
pub mod proxy;
pub mod relay;
pub mod route;
pub mod shared;
pub mod state;
pub mod trace_follow;
pub mod upstream;
pub mod x509;

/// The eBPF object this binary carries (see build.rs for where it came from).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("HUB_EBPF_OBJECT"));
/// "built from source" or "prebuilt", decided by build.rs.
pub const EBPF_OBJECT_SOURCE: &str = env!("HUB_EBPF_OBJECT_SOURCE");
/// `hub --version`: the crate version and which eBPF object is embedded.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (eBPF object ",
    env!("HUB_EBPF_OBJECT_SOURCE"),
    ")"
);
