//! An HTTP/2 client for tests, as client-go speaks to an apiserver: one TLS connection
//! (ALPN h2, a client certificate or a bearer token) carrying every request, streams read
//! frame by frame so a clean END_STREAM can be told from a reset.
use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, body::Incoming, client::conn::http2::SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};

use crate::apiserver::tls::Identity;

/// How a streamed answer ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// END_STREAM: the server finished the body.
    Clean,
    /// RST_STREAM or a broken connection: the body failed.
    Reset(String),
    /// Still open after the wait.
    Open,
}

pub struct H2Client {
    rt: tokio::runtime::Runtime,
    sender: SendRequest<Empty<Bytes>>,
    authority: String,
}

/// An answer being read: status, headers, the body so far, and how it ended.
pub struct H2Stream<'c> {
    client: &'c H2Client,
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
    /// The size of each DATA frame as it arrived.
    pub frames: Vec<usize>,
    pub end: End,
    incoming: Incoming,
}

impl H2Stream<'_> {
    /// Reads on until the body ends, `wait` passes without a frame, or `enough` says so
    /// (given the body so far); returns how it stands.
    pub fn read(&mut self, wait: Duration, mut enough: impl FnMut(&[u8]) -> bool) -> &End {
        if self.end != End::Open {
            return &self.end;
        }
        let (incoming, got, frames) = (&mut self.incoming, &mut self.body, &mut self.frames);
        self.end = self.client.rt.block_on(async {
            loop {
                match tokio::time::timeout(wait, incoming.frame()).await {
                    Err(_) => return End::Open,
                    Ok(None) => return End::Clean,
                    Ok(Some(Err(e))) => return End::Reset(e.to_string()),
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            frames.push(data.len());
                            got.extend_from_slice(&data);
                            if enough(got) {
                                return End::Open;
                            }
                        }
                    }
                }
            }
        });
        &self.end
    }
}

impl H2Client {
    pub fn connect(
        addr: std::net::SocketAddr,
        ca_der: rustls::pki_types::CertificateDer<'static>,
        identity: Option<&Identity>,
    ) -> std::io::Result<H2Client> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut roots = RootCertStore::empty();
        roots.add(ca_der).map_err(std::io::Error::other)?;
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(std::io::Error::other)?
                .with_root_certificates(roots);
        let mut config = match identity {
            Some(id) => builder
                .with_client_auth_cert(vec![id.cert_der.clone()], id.key())
                .map_err(std::io::Error::other)?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let sender = rt.block_on(async {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(ServerName::from(addr.ip()), tcp)
                .await?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(std::io::Error::other("the server did not agree to HTTP/2"));
            }
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Ok::<_, std::io::Error>(sender)
        })?;
        Ok(H2Client {
            rt,
            sender,
            authority: addr.to_string(),
        })
    }

    /// Sends a GET on the connection; the answer's body is then read with `H2Stream::read`.
    pub fn open(&self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<H2Stream<'_>> {
        let mut req = Request::get(format!("https://{}{path}", self.authority));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Empty::new()).map_err(std::io::Error::other)?;
        let mut sender = self.sender.clone();
        let resp = self.rt.block_on(async {
            sender.ready().await.map_err(std::io::Error::other)?;
            tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
                .await
                .map_err(|_| std::io::Error::other("no answer within 30 s"))?
                .map_err(std::io::Error::other)
        })?;
        let (parts, incoming) = resp.into_parts();
        Ok(H2Stream {
            client: self,
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: Vec::new(),
            frames: Vec::new(),
            end: End::Open,
            incoming,
        })
    }

    /// A GET read to its end (at most 30 s).
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<H2Stream<'_>> {
        let mut s = self.open(path, headers)?;
        s.read(Duration::from_secs(30), |_| false);
        Ok(s)
    }
}
