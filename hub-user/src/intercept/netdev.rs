//! Making the hub address local: when it is not already assigned, the hub creates a dummy
//! interface `hub0` holding it, over rtnetlink. Kernels without the dummy driver (no
//! CONFIG_DUMMY) get the IPv4 address on `lo` instead, labelled `lo:hub` so `hub uninstall`
//! can find and remove exactly what the hub added. The address outlives the hub on purpose
//! (a restart keeps the same listeners reachable); `hub uninstall` removes it.
use std::{
    io,
    net::{IpAddr, SocketAddr, TcpListener},
};

pub const HUB_IFNAME: &str = "hub0";
pub const LO_LABEL: &str = "lo:hub";

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_DUMP: u16 = 0x300;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_LABEL: u16 = 3;

/// Where the hub address lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Already assigned by someone else; the hub touches nothing.
    Existing,
    /// On the hub's own `hub0` dummy interface.
    Hub0,
    /// On `lo` with the `lo:hub` label (no dummy driver in this kernel).
    Loopback,
}

/// True when a socket can bind to `ip` (it is assigned locally).
pub fn is_local(ip: IpAddr) -> bool {
    TcpListener::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Makes `ip` local, creating `hub0` (or falling back to `lo`) if needed.
pub fn ensure_local(ip: IpAddr) -> io::Result<Holder> {
    if is_local(ip) {
        return Ok(Holder::Existing);
    }
    let nl = Netlink::open()?;
    let holder = match nl.create_dummy(HUB_IFNAME) {
        Ok(()) => Holder::Hub0,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            if ip.is_ipv6() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{ip} is not local and this kernel has no dummy driver for {HUB_IFNAME}; assign it yourself"
                    ),
                ));
            }
            Holder::Loopback
        }
        Err(e) => return Err(e),
    };
    let (ifname, label) = match holder {
        Holder::Hub0 => (HUB_IFNAME, Some(HUB_IFNAME)),
        _ => ("lo", Some(LO_LABEL)),
    };
    let index = if_index(ifname)?;
    nl.add_address(index, ip, label)?;
    if holder == Holder::Hub0 {
        nl.set_up(index)?;
    }
    Ok(holder)
}

/// Removes what [`ensure_local`] may have created: `hub0`, and `lo:hub` addresses.
/// Returns how many objects were removed; missing ones are fine.
pub fn remove_all() -> io::Result<usize> {
    let nl = Netlink::open()?;
    let mut removed = 0;
    if let Ok(index) = if_index(HUB_IFNAME) {
        nl.delete_link(index)?;
        removed += 1;
    }
    if let Ok(lo) = if_index("lo") {
        for ip in nl.labelled_v4_addresses(lo, LO_LABEL)? {
            nl.delete_address(lo, IpAddr::V4(ip))?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn if_index(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).expect("no NUL in interface names");
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// A route netlink socket, one request at a time.
struct Netlink {
    fd: std::os::fd::OwnedFd,
    seq: std::cell::Cell<u32>,
}

/// Appends one rtattr (header + payload, padded to 4 bytes).
fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn ifinfomsg(index: u32, flags: u32, change: u32) -> Vec<u8> {
    let mut m = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
    m.extend_from_slice(&(index as i32).to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&change.to_ne_bytes());
    m
}

fn ifaddrmsg(ip: IpAddr, index: u32) -> Vec<u8> {
    let (family, prefix) = match ip {
        IpAddr::V4(_) => (libc::AF_INET as u8, 32),
        IpAddr::V6(_) => (libc::AF_INET6 as u8, 128),
    };
    let mut m = vec![family, prefix, 0, libc::RT_SCOPE_HOST];
    m.extend_from_slice(&index.to_ne_bytes());
    m
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

impl Netlink {
    fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is wrapped immediately.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, owned descriptor.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Netlink {
            fd,
            seq: std::cell::Cell::new(1),
        })
    }

    fn send(&self, kind: u16, flags: u16, body: &[u8]) -> io::Result<u32> {
        use std::os::fd::AsRawFd;
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let mut msg = Vec::with_capacity(16 + body.len());
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: send(2) of a buffer we own to the kernel (netlink socket, no address).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(seq)
    }

    /// Reads replies to `seq`, handing each non-error message to `each`, until the ack
    /// (or NLMSG_DONE for dumps). A kernel error comes back as io::Error with its errno.
    fn replies(&self, seq: u32, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: recv(2) into a buffer we own.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                let msg_seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                if len < 16 || len > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "short netlink message",
                    ));
                }
                let payload = &rest[16..len];
                if msg_seq == seq {
                    match kind {
                        NLMSG_ERROR => {
                            let errno = i32::from_ne_bytes(payload[0..4].try_into().unwrap());
                            return if errno == 0 {
                                Ok(())
                            } else {
                                Err(io::Error::from_raw_os_error(-errno))
                            };
                        }
                        NLMSG_DONE => return Ok(()),
                        _ => each(kind, payload),
                    }
                }
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            }
        }
    }

    fn request(&self, kind: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let seq = self.send(kind, flags | NLM_F_ACK, body)?;
        self.replies(seq, |_, _| {})
    }

    fn create_dummy(&self, name: &str) -> io::Result<()> {
        let mut body = ifinfomsg(0, 0, 0);
        attr(&mut body, IFLA_IFNAME, &cstr(name));
        let mut kind = Vec::new();
        attr(&mut kind, IFLA_INFO_KIND, &cstr("dummy"));
        attr(&mut body, IFLA_LINKINFO, &kind);
        match self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &body) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    fn set_up(&self, index: u32) -> io::Result<()> {
        let up = libc::IFF_UP as u32;
        self.request(RTM_NEWLINK, 0, &ifinfomsg(index, up, up))
    }

    fn delete_link(&self, index: u32) -> io::Result<()> {
        self.request(RTM_DELLINK, 0, &ifinfomsg(index, 0, 0))
    }

    fn add_address(&self, index: u32, ip: IpAddr, label: Option<&str>) -> io::Result<()> {
        let mut body = ifaddrmsg(ip, index);
        attr(&mut body, IFA_LOCAL, &ip_bytes(ip));
        attr(&mut body, IFA_ADDRESS, &ip_bytes(ip));
        if let (Some(label), IpAddr::V4(_)) = (label, ip) {
            attr(&mut body, IFA_LABEL, &cstr(label));
        }
        match self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &body) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    fn delete_address(&self, index: u32, ip: IpAddr) -> io::Result<()> {
        let mut body = ifaddrmsg(ip, index);
        attr(&mut body, IFA_LOCAL, &ip_bytes(ip));
        attr(&mut body, IFA_ADDRESS, &ip_bytes(ip));
        self.request(RTM_DELADDR, 0, &body)
    }

    /// IPv4 addresses on interface `index` carrying `label`.
    fn labelled_v4_addresses(
        &self,
        index: u32,
        label: &str,
    ) -> io::Result<Vec<std::net::Ipv4Addr>> {
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
        body.extend_from_slice(&0u32.to_ne_bytes());
        let seq = self.send(RTM_GETADDR, NLM_F_DUMP, &body)?;
        let mut found = Vec::new();
        self.replies(seq, |kind, payload| {
            if kind != RTM_NEWADDR || payload.len() < 8 {
                return;
            }
            let ifindex = u32::from_ne_bytes(payload[4..8].try_into().unwrap());
            if ifindex != index {
                return;
            }
            let (mut local, mut this_label) = (None, None);
            let mut attrs = &payload[8..];
            while attrs.len() >= 4 {
                let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
                let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
                if len < 4 || len > attrs.len() {
                    break;
                }
                let data = &attrs[4..len];
                match kind {
                    IFA_LOCAL if data.len() == 4 => {
                        local = Some(std::net::Ipv4Addr::new(data[0], data[1], data[2], data[3]))
                    }
                    IFA_LABEL => {
                        this_label = Some(
                            String::from_utf8_lossy(data)
                                .trim_end_matches('\0')
                                .to_string(),
                        )
                    }
                    _ => {}
                }
                attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
            }
            if let (Some(ip), Some(l)) = (local, this_label)
                && l == label
            {
                found.push(ip);
            }
        })?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_to_four_bytes() {
        let mut buf = Vec::new();
        attr(&mut buf, IFLA_IFNAME, &cstr("hub0"));
        // 4 header + 5 payload = 9, padded to 12; the length field says 9.
        assert_eq!(buf.len(), 12);
        assert_eq!(u16::from_ne_bytes([buf[0], buf[1]]), 9);
    }
}
