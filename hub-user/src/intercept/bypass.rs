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
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_ESTABLISHED: u32 = 1;
/// Netlink attributes of an `inet_diag_msg` (linux/inet_diag.h).
const INET_DIAG_MARK: u16 = 15;
const INET_DIAG_CGROUP_ID: u16 = 21;

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}
const _: () = assert!(size_of::<SockId>() == 48);

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Request {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}
const _: () = assert!(size_of::<Request>() == 56);

/// `struct nlmsghdr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Header {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}
const _: () = assert!(size_of::<Header>() == 16);

/// One socket found: its family, identity, peer, mark and cgroup.
#[derive(Debug, Clone)]
struct Found {
    family: u8,
    id: SockId,
    peer: SocketAddr,
    mark: u32,
    cgroup_id: u64,
}

fn netlink() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is a plain #[repr(C)] struct of integers without padding holes read as
    // uninitialised (every field is written).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

fn read<T: Copy + Default>(b: &[u8]) -> Option<T> {
    let src = b.get(..size_of::<T>())?;
    let mut v = T::default();
    // SAFETY: `src` holds size_of::<T>() bytes and T is plain data valid for any bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), (&mut v as *mut T).cast::<u8>(), src.len());
    }
    Some(v)
}

fn send(fd: &OwnedFd, kind: u16, flags: u16, req: &Request) -> io::Result<()> {
    let header = Header {
        len: (size_of::<Header>() + size_of::<Request>()) as u32,
        kind,
        flags,
        seq: 1,
        pid: 0,
    };
    let mut msg = as_bytes(&header).to_vec();
    msg.extend_from_slice(as_bytes(req));
    // SAFETY: sending a buffer we own on a socket we own.
    let n = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads answers until DONE (or one ACK/error); calls `each` on every message body.
fn receive(fd: &OwnedFd, mut each: impl FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: receiving into a buffer we own.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while let Some(h) = read::<Header>(rest) {
            let len = (h.len as usize).max(size_of::<Header>());
            let body = rest
                .get(size_of::<Header>()..len.min(rest.len()))
                .unwrap_or_default();
            match h.kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    // An ACK is an error message with code 0.
                    let code = read::<i32>(body).unwrap_or(0);
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
                _ => each(body),
            }
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        }
    }
}

fn peer_of(family: u8, id: &SockId) -> SocketAddr {
    let port = u16::from_be_bytes(id.dport);
    let ip = if i32::from(family) == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(id.dst[0], id.dst[1], id.dst[2], id.dst[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(id.dst))
    };
    SocketAddr::new(ip, port)
}

/// Every established TCP socket of the hub's network namespace, both families.
fn established() -> io::Result<Vec<Found>> {
    let fd = netlink()?;
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let req = Request {
            family,
            protocol: libc::IPPROTO_TCP as u8,
            states: 1 << TCP_ESTABLISHED,
            ..Default::default()
        };
        send(
            &fd,
            SOCK_DIAG_BY_FAMILY,
            (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
            &req,
        )?;
        receive(&fd, |body| {
            // struct inet_diag_msg: family, state, timer, retrans, id, then 5 u32s.
            let Some(id) = body.get(4..).and_then(read::<SockId>) else {
                return;
            };
            let (mut mark, mut cgroup_id) = (0, 0);
            let mut attrs = body.get(72..).unwrap_or_default();
            while attrs.len() >= 4 {
                let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
                let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
                let value = attrs.get(4..len.max(4)).unwrap_or_default();
                match kind {
                    INET_DIAG_MARK => mark = read::<u32>(value).unwrap_or(0),
                    INET_DIAG_CGROUP_ID => cgroup_id = read::<u64>(value).unwrap_or(0),
                    _ => {}
                }
                attrs = attrs
                    .get(len.max(4).next_multiple_of(4)..)
                    .unwrap_or_default();
            }
            out.push(Found {
                family,
                peer: peer_of(family, &id),
                id,
                mark,
                cgroup_id,
            });
        })?;
    }
    Ok(out)
}

/// The ids of the cgroup at `root` and of every cgroup below it (cgroup v2: a cgroup's
/// id is its directory's inode number).
fn cgroup_ids(root: &Path) -> HashSet<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut ids = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&dir) else {
            continue;
        };
        ids.insert(meta.ino());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    ids
}

/// Established connections, in the calling thread's network namespace, from a cgroup in
/// `under` to one of `vips` that are not the hub's own (marked `bypass_mark`): they reach
/// the apiserver without the hub.
fn find(vips: &[SocketAddr], under: &HashSet<u64>, bypass_mark: u32) -> io::Result<Vec<Found>> {
    let normal = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(a, |v4| SocketAddr::new(IpAddr::V4(v4), a.port())),
        IpAddr::V4(_) => a,
    };
    let vips: HashSet<SocketAddr> = vips.iter().copied().map(normal).collect();
    Ok(established()?
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
fn end_here(found: &[Found]) -> io::Result<usize> {
    let fd = netlink()?;
    let mut ended = 0;
    for f in found {
        let req = Request {
            family: f.family,
            protocol: libc::IPPROTO_TCP as u8,
            states: u32::MAX,
            id: f.id,
            ..Default::default()
        };
        send(
            &fd,
            SOCK_DESTROY,
            (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
            &req,
        )?;
        match receive(&fd, |_| {}) {
            Ok(()) => ended += 1,
            // Closed meanwhile: nothing to end.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ended)
}

/// A network namespace's identity: the device and inode of its `ns/net` file.
fn namespace_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// One `/proc/<pid>/ns/net` for each network namespace that a process in a cgroup at or
/// under `root` lives in, other than the calling thread's own: a pod's sockets are only
/// visible from inside its namespace.
fn other_namespaces(root: &Path) -> Vec<std::path::PathBuf> {
    let own = namespace_id(Path::new("/proc/thread-self/ns/net"));
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter(|l| !l.is_empty()) {
            let path = std::path::PathBuf::from(format!("/proc/{pid}/ns/net"));
            // A process that exited meanwhile has nothing left to end.
            let Some(id) = namespace_id(&path) else {
                continue;
            };
            if Some(id) != own && seen.insert(id) {
                out.push(path);
            }
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Runs `work` in the hub's network namespace and then, on a short-lived thread that
/// joins it (setns affects only that thread), in each other namespace the intercepted
/// processes use; returns the sum.
fn in_each_namespace(
    cgroup: &Path,
    work: impl Fn() -> io::Result<usize> + Sync,
) -> io::Result<usize> {
    let mut total = work()?;
    for path in other_namespaces(cgroup) {
        total += std::thread::scope(|scope| {
            scope
                .spawn(|| -> io::Result<usize> {
                    let Ok(file) = std::fs::File::open(&path) else {
                        return Ok(0); // gone meanwhile
                    };
                    // SAFETY: setns(2) on a namespace file we hold open; it changes only
                    // this thread, which ends when the work is done.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    work()
                })
                .join()
                .map_err(|_| io::Error::other("a namespace's search panicked"))?
        })?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_read_from_socket_ids() {
        let mut id = SockId {
            dport: 443u16.to_be_bytes(),
            ..Default::default()
        };
        id.dst[..4].copy_from_slice(&[127, 0, 10, 1]);
        assert_eq!(
            peer_of(libc::AF_INET as u8, &id),
            "127.0.10.1:443".parse().unwrap()
        );
        let v6: Ipv6Addr = "fd00::1".parse().unwrap();
        id.dst = v6.octets();
        assert_eq!(
            peer_of(libc::AF_INET6 as u8, &id),
            "[fd00::1]:443".parse().unwrap()
        );
    }
}
