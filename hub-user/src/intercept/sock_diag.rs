//! The kernel's socket diagnostics (sock_diag netlink, as `ss` uses them): the
//! established TCP sockets of a network namespace with their owner's uid, cgroup and mark,
//! one socket looked up by its addresses, and ending a socket (`SOCK_DESTROY`, Linux with
//! CONFIG_INET_DIAG_DESTROY).
use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_ESTABLISHED: u32 = 1;
/// `INET_DIAG_NOCOOKIE`: look a socket up by its addresses alone.
const NO_COOKIE: [u32; 2] = [u32::MAX, u32::MAX];
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

/// One TCP socket as the kernel describes it.
#[derive(Debug, Clone)]
pub struct Socket {
    family: u8,
    id: SockId,
    /// The socket's own address and its peer's.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub mark: u32,
    /// The cgroup of the process that created it (cgroup v2 id: its directory's inode).
    pub cgroup_id: u64,
    /// The owner's uid.
    pub uid: u32,
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
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The kernel always answers, but a caller waiting on a connection's first request
    // must never wait forever: give up after a few seconds.
    let timeout = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: setsockopt(2) on our socket with a timeval of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
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
fn receive(fd: &OwnedFd, each: impl FnMut(&[u8])) -> io::Result<()> {
    receive_until(fd, false, each)
}

/// As `receive`; with `one`, the first answer ends it too (a lookup's single answer
/// carries no DONE).
fn receive_until(fd: &OwnedFd, one: bool, mut each: impl FnMut(&[u8])) -> io::Result<()> {
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
                _ if one => {
                    each(body);
                    return Ok(());
                }
                _ => each(body),
            }
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        }
    }
}

fn address(family: u8, ip: &[u8; 16], port: [u8; 2]) -> SocketAddr {
    let ip = if i32::from(family) == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*ip))
    };
    SocketAddr::new(ip, u16::from_be_bytes(port))
}

fn peer_of(family: u8, id: &SockId) -> SocketAddr {
    address(family, &id.dst, id.dport)
}

/// A socket id for the socket bound to `local` and connected to `peer`.
fn id_of(local: SocketAddr, peer: SocketAddr) -> (u8, SockId) {
    let bytes = |a: SocketAddr| -> [u8; 16] {
        let mut out = [0u8; 16];
        match a.ip() {
            IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out = v6.octets(),
        }
        out
    };
    let family = if local.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    let id = SockId {
        sport: local.port().to_be_bytes(),
        dport: peer.port().to_be_bytes(),
        src: bytes(local),
        dst: bytes(peer),
        interface: 0,
        cookie: NO_COOKIE,
    };
    (family, id)
}

/// Reads one `inet_diag_msg` with its attributes.
fn parse(family: u8, body: &[u8]) -> Option<Socket> {
    // struct inet_diag_msg: family, state, timer, retrans, id, expires, rqueue, wqueue,
    // uid, inode; attributes follow at 72.
    let id = body.get(4..).and_then(read::<SockId>)?;
    let uid = body.get(64..).and_then(read::<u32>)?;
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
    Some(Socket {
        family,
        local: address(family, &id.src, id.sport),
        peer: peer_of(family, &id),
        id,
        mark,
        cgroup_id,
        uid,
    })
}

/// Every established TCP socket of the calling thread's network namespace, both families.
pub fn established() -> io::Result<Vec<Socket>> {
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
        receive(&fd, |body| out.extend(parse(family, body)))?;
    }
    Ok(out)
}

/// Sends one request about the socket `id` and reads its single answer (`each` sees it);
/// false when the kernel knows no such socket.
fn about_one(
    kind: u16,
    flags: u16,
    family: u8,
    id: SockId,
    each: impl FnMut(&[u8]),
) -> io::Result<bool> {
    let fd = netlink()?;
    let req = Request {
        family,
        protocol: libc::IPPROTO_TCP as u8,
        states: u32::MAX,
        id,
        ..Default::default()
    };
    send(&fd, kind, flags, &req)?;
    match receive_until(&fd, true, each) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The socket bound to `local` and connected to `peer` in the calling thread's network
/// namespace — the other end of a connection the hub accepted, when it is local — or None.
pub fn lookup(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<Socket>> {
    let (family, id) = id_of(local, peer);
    let mut found = None;
    let flags = libc::NLM_F_REQUEST as u16;
    about_one(SOCK_DIAG_BY_FAMILY, flags, family, id, |body| {
        found = parse(family, body)
    })?;
    Ok(found)
}

/// Ends `socket` (SOCK_DESTROY): its owner sees the connection aborted. False when it
/// was gone already.
pub fn destroy(socket: &Socket) -> io::Result<bool> {
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    about_one(SOCK_DESTROY, flags, socket.family, socket.id, |_| {})
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

    /// The other end of a loopback connection is found with its owner and cgroup.
    #[test]
    fn a_local_peer_is_found_with_its_uid_and_cgroup() {
        use std::os::unix::fs::MetadataExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let local = listener.local_addr().unwrap();
        let found = lookup(peer, local).unwrap().expect("the client's socket");
        assert_eq!(
            (found.local, found.peer),
            (client.local_addr().unwrap(), local)
        );
        // A socket nobody holds is not found.
        let gone = lookup("127.0.0.1:1".parse().unwrap(), local).unwrap();
        assert!(gone.is_none());
        // SAFETY: getuid(2) cannot fail.
        assert_eq!(found.uid, unsafe { libc::getuid() });
        // Our cgroup (v2: the last line of /proc/self/cgroup is "0::<path>").
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        if let Some(path) = cgroups.lines().find_map(|l| l.strip_prefix("0::")) {
            for mount in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] {
                if let Ok(m) = std::fs::metadata(format!("{mount}{path}"))
                    && m.ino() == found.cgroup_id
                {
                    return;
                }
            }
            panic!("cgroup id {} is not {path}'s", found.cgroup_id);
        }
    }
}
