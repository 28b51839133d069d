//! Connections to an apiserver VIP that do not go through the hub: those a client opened
//! while the hub was not running (interception fails open) and keeps — client-go holds
//! one HTTP/2 connection for as long as it lives, so without help a kubelet that
//! connected while the hub was down would bypass it until its next reconnect, and the
//! next outage would find the node unprotected.
//!
//! They are found and ended with the kernel's socket diagnostics (sock_diag netlink,
//! `SOCK_DESTROY`, as `ss -K` does; Linux with CONFIG_INET_DIAG_DESTROY): an established
//! TCP socket whose peer is a VIP, not carrying the hub's own mark, from a cgroup under
//! the one the programs are attached to. Its owner sees the connection aborted and
//! connects again — through the hub now. The hub's network namespace is searched, and
//! each other namespace a process of those cgroups lives in (pods with their own network).
use std::{
    collections::HashSet,
    io,
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use super::{
    cgroup_tree::cgroup_tree,
    sock_diag::{self, Socket},
};

/// The ids of the cgroup at `root` and of every cgroup below it.
fn cgroup_ids(root: &Path) -> HashSet<u64> {
    cgroup_tree(root).into_iter().map(|(_, id)| id).collect()
}

/// Established connections, in the calling thread's network namespace, from a cgroup in
/// `under` to one of `vips` that are not the hub's own (marked `bypass_mark`): they reach
/// the apiserver without the hub.
fn find(vips: &[SocketAddr], under: &HashSet<u64>, bypass_mark: u32) -> io::Result<Vec<Socket>> {
    let normal = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(a, |v4| SocketAddr::new(IpAddr::V4(v4), a.port())),
        IpAddr::V4(_) => a,
    };
    let vips: HashSet<SocketAddr> = vips.iter().copied().map(normal).collect();
    Ok(sock_diag::established()?
        .into_iter()
        .filter(|f| vips.contains(&normal(f.peer)))
        .filter(|f| f.mark != bypass_mark)
        .filter(|f| under.contains(&f.cgroup_id))
        .collect())
}

/// How many connections bypass the hub now (for `hub status`).
pub fn count(vips: &[SocketAddr], cgroup: &Path, bypass_mark: u32) -> io::Result<usize> {
    let under = cgroup_ids(cgroup);
    in_each_namespace(cgroup, || Ok(find(vips, &under, bypass_mark)?.len()))
}

/// Ends every connection that bypasses the hub; returns how many were ended.
pub fn end(vips: &[SocketAddr], cgroup: &Path, bypass_mark: u32) -> io::Result<usize> {
    let under = cgroup_ids(cgroup);
    in_each_namespace(cgroup, || end_here(&find(vips, &under, bypass_mark)?))
}

/// Ends the `found` sockets of the calling thread's network namespace.
fn end_here(found: &[Socket]) -> io::Result<usize> {
    let mut ended = 0;
    for socket in found {
        // False: closed meanwhile, nothing to end.
        ended += usize::from(sock_diag::destroy(socket)?);
    }
    Ok(ended)
}

/// A network namespace's identity: the device and inode of its `ns/net` file.
fn namespace_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Why another process's network namespace could not be entered, said so that an
/// operator can act: reading it takes ptrace access to that process.
fn cannot_enter(path: &Path, e: &io::Error) -> io::Error {
    let hint = if matches!(e.kind(), io::ErrorKind::PermissionDenied) {
        " (entering another process's namespace needs CAP_SYS_PTRACE, and the host's PID namespace to see it)"
    } else {
        ""
    };
    io::Error::new(e.kind(), format!("{}: {e}{hint}", path.display()))
}

/// One `/proc/<pid>/ns/net` for each network namespace that a process in a cgroup at or
/// under `root` lives in, other than the calling thread's own: a pod's sockets are only
/// visible from inside its namespace. Also the first namespace that could not be
/// looked at for another reason than its process having exited.
fn other_namespaces(root: &Path) -> (Vec<PathBuf>, Option<io::Error>) {
    let own = namespace_id(Path::new("/proc/thread-self/ns/net")).ok();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut refused = None;
    for (dir, _) in cgroup_tree(root) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter(|l| !l.is_empty()) {
            // The kernel lists a process outside the reader's PID namespace as 0.
            if pid == "0" {
                refused.get_or_insert_with(|| {
                    io::Error::other(format!(
                        "{}: processes outside the hub's PID namespace, so their network namespaces cannot be searched (run the hub in the host's: hostPID)",
                        dir.display()
                    ))
                });
                continue;
            }
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            let id = match namespace_id(&path) {
                Ok(id) => id,
                // A process that exited meanwhile has nothing left to end.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    refused.get_or_insert_with(|| cannot_enter(&path, &e));
                    continue;
                }
            };
            if Some(id) != own && seen.insert(id) {
                out.push(path);
            }
        }
    }
    (out, refused)
}

/// Runs `work` in the hub's network namespace and then, on a short-lived thread that
/// joins it (setns affects only that thread), in each other namespace the intercepted
/// processes use; returns the sum. A namespace that could not be entered is an error
/// (after the others are done): its connections would bypass the hub unseen.
fn in_each_namespace(
    cgroup: &Path,
    work: impl Fn() -> io::Result<usize> + Sync,
) -> io::Result<usize> {
    let mut total = work()?;
    let (others, refused) = other_namespaces(cgroup);
    for path in others {
        total += std::thread::scope(|scope| {
            scope
                .spawn(|| -> io::Result<usize> {
                    let file = match std::fs::File::open(&path) {
                        Ok(f) => f,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0), // gone
                        Err(e) => return Err(cannot_enter(&path, &e)),
                    };
                    // SAFETY: setns(2) on a namespace file we hold open; it changes only
                    // this thread, which ends when the work is done.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(cannot_enter(&path, &io::Error::last_os_error()));
                    }
                    work()
                })
                .join()
                .map_err(|_| io::Error::other("a namespace's search panicked"))?
        })?;
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(total),
    }
}
