//! hub's eBPF programs: cgroup connect4/connect6 redirect apiserver-bound connects to the
//! hub, and a sock_ops program records who opened each redirected connection.
//!
//! Every entry point returns "allow" (1) whatever happens inside: interception fails open.
//! On the host this file compiles to an empty binary so `cargo build` of the workspace works
//! on stable; the real object is built for `bpfel-unknown-none` by hub-user's build script.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("hub-ebpf is an eBPF object; it is built for bpfel-unknown-none by hub-user");
}
