#!/usr/bin/env bash
# Installs everything a fresh Debian 12 machine needs to build, test and demo hub.
# Idempotent: a second run only checks and finishes in seconds.
# Sources: Debian's package archive, the Rust distribution (rust-src component), crates.io.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (apt-get, bpffs, cgroups)" >&2
    exit 1
  fi
}
need_root

# --- Debian packages -------------------------------------------------------
# etcd-server: the pool coordinator in tests/demo; bpftool: map dumps in tests;
# iproute2: netns/veth fixtures; python3-kubernetes: a real client in tests;
# openssl: test CA inspection; curl: admin checks in scripts; protobuf-compiler and
# libprotobuf-dev: protoc and the well-known .proto files, which the etcd-client crate
# needs to build its gRPC stubs; nginx-light: the reference proxy `cargo xtask bench proxy`
# measures beside the hub (started by the benchmark on loopback, never as a service);
# containerd and runc: the container test runs the hub's image with them (a private
# containerd each time, with its own socket and directories; never the system's);
# containernetworking-plugins and busybox-static: pods on the CNI bridge (a bridge in a
# namespace of the test's own) whose IPs change across an offline restart.
DEB_PACKAGES=(etcd-server etcd-client bpftool iproute2 python3-kubernetes openssl curl ca-certificates protobuf-compiler libprotobuf-dev nginx-light containerd runc containernetworking-plugins busybox-static)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages present"
fi

# --- Rust toolchains ---------------------------------------------------------
# Stable builds everything but the eBPF object; nightly + rust-src + bpf-linker build it.
command -v rustup >/dev/null || { echo "setup: rustup not found; install Rust first" >&2; exit 1; }
if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
else
  log "nightly rust-src present"
fi

# bpf-linker 0.10.4 uses rustc's own LLVM; 0.11+ needs a system LLVM 22.
BPF_LINKER_VERSION=0.10.4
if command -v bpf-linker >/dev/null && bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
  log "bpf-linker $BPF_LINKER_VERSION present"
else
  log "installing bpf-linker $BPF_LINKER_VERSION (2-3 minutes)"
  cargo install --locked bpf-linker --version "$BPF_LINKER_VERSION" -j2
fi

# --- Kernel facilities the privileged tests use ------------------------------
if ! mountpoint -q /sys/fs/bpf; then
  log "mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
if ! grep -q cgroup2 /proc/mounts; then
  echo "setup: no cgroup v2 mount found; interception tests cannot run" >&2
  exit 1
fi
log "done"
