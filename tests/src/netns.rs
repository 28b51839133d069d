//! Network namespaces made by a test (never connected to the machine's uplink), removed on
//! drop, plus the few `ip` commands the scenarios need.
//!
//! Processes enter a namespace with setns(2) between fork and exec, not with
//! `ip netns exec`: that one also remounts /sys, hiding /sys/fs/bpf and the cgroup mounts.
use std::{
    fs::File,
    os::{fd::AsRawFd, unix::process::CommandExt},
    process::{Command, Stdio},
    sync::Arc,
};

pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Netns {
    name: String,
    handle: Arc<File>,
}

impl Netns {
    /// A new namespace with its loopback up.
    pub fn new(tag: &str) -> Self {
        let name = crate::unique(tag);
        ip(&["netns", "add", &name]);
        let handle = File::open(format!("/run/netns/{name}"))
            .unwrap_or_else(|e| panic!("open /run/netns/{name}: {e}"));
        let ns = Netns {
            name,
            handle: Arc::new(handle),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> ...`
    pub fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full);
    }

    /// A handle that can start processes in this namespace (while it exists).
    pub fn handle(&self) -> NsHandle {
        NsHandle(self.handle.clone())
    }

    /// A command that runs `program` inside this namespace (same mounts as the test).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.handle().command(program)
    }

    /// Makes `cidr` (e.g. the hub address or a VIP) local to this namespace. It goes on
    /// `lo`: this machine's kernel has no dummy driver (CONFIG_DUMMY unset).
    pub fn add_local_address(&self, cidr: &str) {
        self.ip(&["addr", "add", cidr, "dev", "lo"]);
    }

    /// Connects this namespace to `other` with a veth pair: `(here_if, here_cidr)` in this
    /// namespace, `(there_if, there_cidr)` in the other.
    pub fn veth_to(&self, other: &Netns, here: (&str, &str), there: (&str, &str)) {
        ip(&[
            "link",
            "add",
            here.0,
            "netns",
            &self.name,
            "type",
            "veth",
            "peer",
            "name",
            there.0,
            "netns",
            &other.name,
        ]);
        self.ip(&["addr", "add", here.1, "dev", here.0]);
        self.ip(&["link", "set", here.0, "up"]);
        other.ip(&["addr", "add", there.1, "dev", there.0]);
        other.ip(&["link", "set", there.0, "up"]);
    }
}

/// The calling thread inside a namespace until dropped (setns(2) is per thread): sockets
/// it binds or connects, and processes it spawns, live there. Used to put in-process
/// servers (the API stand-in) and their clients inside a test's own namespace.
pub struct Entered {
    previous: File,
}

impl Netns {
    pub fn enter(&self) -> Entered {
        let previous = File::open("/proc/thread-self/ns/net").expect("this thread's netns");
        // SAFETY: setns(2) on this thread with an open namespace fd.
        let rc = unsafe { libc::setns(self.handle.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "setns into {}: {}",
            self.name,
            std::io::Error::last_os_error()
        );
        Entered { previous }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        // SAFETY: setns(2) back into the namespace this thread came from.
        unsafe { libc::setns(self.previous.as_raw_fd(), libc::CLONE_NEWNET) };
    }
}

/// An open namespace file, for starting processes inside it.
#[derive(Clone)]
pub struct NsHandle(Arc<File>);

impl NsHandle {
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        let handle = self.0.clone();
        // SAFETY: setns(2) only, between fork and exec; the fd stays open via the Arc.
        unsafe {
            c.pre_exec(move || {
                if libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
