//! Cloud apiserver endpoints: URL parsing, choosing a server, connecting with the bypass
//! mark so the hub's own sockets are never redirected back to itself.
//!
//! Health here is passive and simple (a server that refused or timed out is skipped for a
//! short while); active probes and hysteresis belong to the L7 proxy (issue 5).
use std::{
    net::SocketAddr,
    os::fd::AsRawFd,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::net::{TcpSocket, TcpStream};

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no cloud server reachable (tried {tried}): {last}")]
    Unreachable { tried: usize, last: String },
}

/// `scheme://host:port[/path]` of a cloud apiserver or etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl ServerUrl {
    pub fn parse(s: &str) -> Result<ServerUrl, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("`{s}` is not a URL (scheme://host:port)"))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => return Err(format!("`{s}`: scheme must be http or https")),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("`{s}`: unclosed `[`"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("`{s}`: bad port"))?,
                None if after.is_empty() => default_port,
                None => return Err(format!("`{s}`: junk after host")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("`{s}`: bad port"))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(format!("`{s}`: empty host"));
        }
        Ok(ServerUrl {
            scheme: scheme.to_string(),
            host,
            port,
        })
    }

    /// `host:port` with IPv6 hosts bracketed, for resolution.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// How long a server that failed to connect is skipped.
const PENALTY: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

struct Server {
    url: ServerUrl,
    failed_at: Mutex<Option<Instant>>,
}

/// The cloud's servers, tried round-robin, skipping recently failed ones.
pub struct Cloud {
    servers: Vec<Server>,
    next: AtomicUsize,
    mark: u32,
}

impl Cloud {
    /// `mark` is the SO_MARK set on every upstream socket (0 = none).
    pub fn new(urls: &[String], mark: u32) -> Result<Cloud, String> {
        let servers = urls
            .iter()
            .map(|u| {
                Ok(Server {
                    url: ServerUrl::parse(u)?,
                    failed_at: Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Cloud {
            servers,
            next: AtomicUsize::new(0),
            mark,
        })
    }

    /// Connects to the next healthy server; falls back to penalised ones if all failed.
    pub async fn connect(&self) -> Result<(TcpStream, &ServerUrl), UpstreamError> {
        let n = self.servers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut order: Vec<&Server> = (0..n).map(|i| &self.servers[(start + i) % n]).collect();
        // Healthy first, then those whose penalty is oldest.
        order.sort_by_key(|s| match *s.failed_at.lock().unwrap() {
            Some(t) if now.duration_since(t) < PENALTY => (1, Some(t)),
            _ => (0, None),
        });
        let mut last = String::from("no servers configured");
        for server in &order {
            match connect_marked(&server.url.authority(), self.mark).await {
                Ok(stream) => {
                    *server.failed_at.lock().unwrap() = None;
                    return Ok((stream, &server.url));
                }
                Err(e) => {
                    *server.failed_at.lock().unwrap() = Some(Instant::now());
                    last = format!("{}: {e}", server.url.authority());
                }
            }
        }
        Err(UpstreamError::Unreachable {
            tried: order.len(),
            last,
        })
    }
}

/// Resolves `authority` and connects with SO_MARK set before connect(), so the eBPF
/// connect hooks see the mark and leave the socket alone.
pub async fn connect_marked(authority: &str, mark: u32) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in tokio::net::lookup_host(authority).await? {
        match tokio::time::timeout(CONNECT_TIMEOUT, connect_addr(addr, mark)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        }
    }
    Err(last)
}

async fn connect_addr(addr: SocketAddr, mark: u32) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if mark != 0 {
        set_mark(socket.as_raw_fd(), mark)?;
    }
    socket.set_nodelay(true)?;
    socket.connect(addr).await
}

fn set_mark(fd: i32, mark: u32) -> std::io::Result<()> {
    // SAFETY: setsockopt with a valid fd and a pointer to a u32 of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_urls() {
        let u = ServerUrl::parse("https://10.0.0.10:6443").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("10.0.0.10", 6443));
        let u = ServerUrl::parse("https://[::1]:6443/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 6443, "[::1]:6443".into())
        );
        assert_eq!(ServerUrl::parse("http://etcd").unwrap().port, 80);
        assert!(ServerUrl::parse("ftp://x:1").is_err());
        assert!(ServerUrl::parse("https://:1").is_err());
        assert!(ServerUrl::parse("https://a:99999").is_err());
        assert!(ServerUrl::parse("a:1").is_err());
    }
}
