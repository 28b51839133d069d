//! A small HTTPS client for tests: one request per connection over HTTP/1.1, with a
//! bearer token or client certificate, and a line reader for watch streams.
use std::{sync::Arc, time::Duration};

use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::tls::Identity;

pub struct Client {
    pub addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
    pub token: Option<String>,
    rt: tokio::runtime::Runtime,
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A watch (or any streamed answer) being read line by line.
pub struct Stream<'a> {
    client: &'a Client,
    reader: BufReader<tokio_rustls::client::TlsStream<TcpStream>>,
    /// Body bytes received but not yet returned as lines.
    pending: Vec<u8>,
    /// A chunk-size line read in part when a wait for it ran out.
    size_line: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

/// The next piece of a streamed (chunked) answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    /// One HTTP chunk's bytes.
    Data(Vec<u8>),
    /// The terminating chunk: the server ended the body cleanly.
    Ended,
    /// The connection ended (or broke) without the terminating chunk.
    Cut,
    /// Nothing arrived within the wait.
    Quiet,
}

impl Stream<'_> {
    /// The next line of the body, or None at its end or after `timeout`. HTTP chunks and
    /// lines are independent: one chunk may carry several lines, or part of one.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        let reader = &mut self.reader;
        let pending = &mut self.pending;
        self.client.rt.block_on(async {
            loop {
                if let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=pos).collect();
                    let text = String::from_utf8_lossy(&line).trim_end().to_string();
                    if text.is_empty() {
                        continue;
                    }
                    return Some(text);
                }
                let mut size = String::new();
                tokio::time::timeout(timeout, reader.read_line(&mut size))
                    .await
                    .ok()?
                    .ok()?;
                let n = usize::from_str_radix(size.trim(), 16).ok()?;
                if n == 0 {
                    // End of the body: a last line without a newline still counts.
                    let rest = String::from_utf8_lossy(&std::mem::take(pending))
                        .trim()
                        .to_string();
                    return (!rest.is_empty()).then_some(rest);
                }
                let mut chunk = vec![0u8; n + 2];
                tokio::time::timeout(timeout, reader.read_exact(&mut chunk))
                    .await
                    .ok()?
                    .ok()?;
                chunk.truncate(n);
                pending.extend_from_slice(&chunk);
            }
        })
    }

    /// The next HTTP chunk of the body, as the server sent it.
    pub fn next_chunk(&mut self, wait: Duration) -> Chunk {
        let reader = &mut self.reader;
        let size_line = &mut self.size_line;
        self.client.rt.block_on(async {
            // The size line is kept across waits that run out, so none of it is lost.
            match tokio::time::timeout(wait, reader.read_line(size_line)).await {
                Err(_) => return Chunk::Quiet,
                Ok(Err(_) | Ok(0)) => return Chunk::Cut,
                Ok(Ok(_)) => {}
            }
            let size = std::mem::take(size_line);
            let Ok(n) = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
            else {
                return Chunk::Cut;
            };
            if n == 0 {
                return Chunk::Ended;
            }
            // Once a chunk has begun, the rest of it is on its way.
            let mut chunk = vec![0u8; n + 2];
            match tokio::time::timeout(Duration::from_secs(30), reader.read_exact(&mut chunk)).await
            {
                Ok(Ok(_)) => {
                    chunk.truncate(n);
                    Chunk::Data(chunk)
                }
                _ => Chunk::Cut,
            }
        })
    }

    /// The next line parsed as a watch event.
    pub fn next_event(&mut self, timeout: Duration) -> Option<serde_json::Value> {
        self.next_line(timeout)
            .map(|l| serde_json::from_str(&l).expect("watch event JSON"))
    }

    /// (type, object name) of the next watch event that is not a bookmark; panics when
    /// none comes within `timeout`.
    pub fn next_change(&mut self, timeout: Duration) -> (String, String) {
        loop {
            let e = self
                .next_event(timeout)
                .unwrap_or_else(|| panic!("no watch event within {timeout:?}"));
            let ty = e["type"].as_str().unwrap_or_default().to_string();
            if ty != "BOOKMARK" {
                let name = e["object"]["metadata"]["name"].as_str().unwrap_or_default();
                return (ty, name.to_string());
            }
        }
    }
}

impl Client {
    pub fn new(
        addr: std::net::SocketAddr,
        ca_der: rustls::pki_types::CertificateDer<'static>,
        token: Option<&str>,
        identity: Option<&Identity>,
    ) -> Self {
        let mut roots = RootCertStore::empty();
        roots.add(ca_der).expect("CA");
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots);
        let config = match identity {
            Some(id) => builder
                .with_client_auth_cert(vec![id.cert_der.clone()], id.key())
                .expect("client cert"),
            None => builder.with_no_client_auth(),
        };
        Client {
            addr,
            config: Arc::new(config),
            token: token.map(String::from),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
        }
    }

    async fn open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<BufReader<tokio_rustls::client::TlsStream<TcpStream>>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let name = ServerName::from(self.addr.ip());
        let mut tls = connector.connect(name, tcp).await?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if let Some(t) = &self.token {
            req += &format!("Authorization: Bearer {t}\r\n");
        }
        for (k, v) in headers {
            req += &format!("{k}: {v}\r\n");
        }
        req += "\r\n";
        tls.write_all(req.as_bytes()).await?;
        tls.write_all(body).await?;
        tls.flush().await?;
        Ok(BufReader::new(tls))
    }

    async fn head(
        reader: &mut BufReader<tokio_rustls::client::TlsStream<TcpStream>>,
    ) -> std::io::Result<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        Ok((status, headers))
    }

    /// The leaf certificate the server presents on a fresh connection.
    pub fn peer_certificate(&self) -> std::io::Result<rustls::pki_types::CertificateDer<'static>> {
        self.rt.block_on(async {
            let tcp = TcpStream::connect(self.addr).await?;
            let tls = tokio_rustls::TlsConnector::from(self.config.clone())
                .connect(ServerName::from(self.addr.ip()), tcp)
                .await?;
            tls.get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first().cloned())
                .ok_or_else(|| std::io::Error::other("no peer certificate"))
        })
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Reply> {
        self.rt.block_on(async {
            let mut reader = tokio::time::timeout(
                Duration::from_secs(10),
                self.open(method, path, headers, body),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            let (status, headers) = Self::head(&mut reader).await?;
            let mut raw = Vec::new();
            tokio::time::timeout(Duration::from_secs(30), reader.read_to_end(&mut raw))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "body timed out")
                })??;
            let chunked = headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
            let body = if chunked { dechunk(&raw) } else { raw };
            Ok(Reply {
                status,
                headers,
                body,
            })
        })
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], &[])
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn send_json(&self, method: &str, path: &str, body: &serde_json::Value) -> Reply {
        let b = serde_json::to_vec(body).expect("json");
        self.request(method, path, &[("Content-Type", "application/json")], &b)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Opens a watch of `path` from resourceVersion `rv`, with bookmarks; asserts a 200.
    pub fn watch_from(&self, path: &str, rv: &str) -> Stream<'_> {
        let w = self.stream(&format!(
            "{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
        ));
        assert_eq!(w.status, 200, "watch {path}");
        w
    }

    /// Starts a streamed GET (a watch) and returns once the headers arrived.
    pub fn stream(&self, path: &str) -> Stream<'_> {
        self.try_stream(path, &[])
            .unwrap_or_else(|e| panic!("stream {path}: {e}"))
    }

    /// `stream` with request headers, and errors returned (within 10 s per step).
    pub fn try_stream(&self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Stream<'_>> {
        let reader = self.rt.block_on(async {
            let limit = Duration::from_secs(10);
            let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
            let mut reader = tokio::time::timeout(limit, self.open("GET", path, headers, &[]))
                .await
                .map_err(|_| timed_out())??;
            let (status, headers) = tokio::time::timeout(limit, Self::head(&mut reader))
                .await
                .map_err(|_| timed_out())??;
            Ok::<_, std::io::Error>((reader, status, headers))
        })?;
        let (reader, status, headers) = (reader.0, reader.1, reader.2);
        Ok(Stream {
            client: self,
            reader,
            pending: Vec::new(),
            size_line: String::new(),
            status,
            headers,
        })
    }
}

/// The body of an HTTP/1.1 chunked answer.
pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(pos) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&raw[..pos]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = pos + 2;
        out.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
    out
}
