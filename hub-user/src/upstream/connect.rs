//! Connecting to the cloud: TCP with SO_MARK set before connect(), then TLS (ALPN h2 and
//! http/1.1), as a connector for hyper's pooled client.
use std::{
    future::Future,
    net::SocketAddr,
    os::fd::AsRawFd,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper::Uri;
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::TokioIo,
};
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::{
    io::BufReader,
    net::{TcpSocket, TcpStream},
};
use tokio_rustls::client::TlsStream;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

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

/// What TLS reads from a cloud connection: the socket behind a 64 KiB buffer. rustls asks
/// for at most 4 KiB a read, so a large answer (kube-apiserver writes a list as 4 KiB TLS
/// records) cost the hub one `recvfrom` per record; the buffer takes all that has arrived
/// in one call (against kube-apiserver 1.36: 1,757 calls per 7.4 MB list before).
pub type CloudStream = TlsStream<BufReader<TcpStream>>;

/// How much one read from a cloud socket takes at most.
const READ_BUFFER: usize = 64 * 1024;

/// A connection to a cloud server: plain TCP (http://) or TLS (https://).
pub enum Conn {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<CloudStream>>),
}

impl Conn {
    fn h2(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(t) => t.inner().get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }

    /// The TLS stream to speak HTTP/2 on, if ALPN settled on it.
    pub fn into_http2(self) -> Option<CloudStream> {
        if !self.h2() {
            return None;
        }
        match self {
            Conn::Tls(t) => Some((*t).into_inner()),
            Conn::Plain(_) => None,
        }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        let c = Connected::new();
        if self.h2() { c.negotiated_h2() } else { c }
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// hyper connector: marked TCP, then TLS with `tls` for https URIs.
#[derive(Clone)]
pub struct MarkedConnector {
    pub tls: Arc<ClientConfig>,
    pub mark: u32,
}

impl MarkedConnector {
    /// Opens one connection to `uri`'s authority.
    pub async fn open(&self, uri: &Uri) -> std::io::Result<Conn> {
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_matches(|c| c == '[' || c == ']')
            .to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tcp = connect_marked(&authority, self.mark).await?;
        if !https {
            return Ok(Conn::Plain(TokioIo::new(tcp)));
        }
        let name = ServerName::try_from(host.clone()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("bad server name {host}"),
            )
        })?;
        let tls = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, BufReader::with_capacity(READ_BUFFER, tcp)),
        )
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
        })??;
        Ok(Conn::Tls(Box::new(TokioIo::new(tls))))
    }
}

impl tower_service::Service<Uri> for MarkedConnector {
    type Response = Conn;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { me.open(&uri).await })
    }
}
