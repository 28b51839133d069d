//! The connection a cloud server's requests share: one HTTP/2 connection per server and
//! identity (as client-go keeps one), driven with the h2 crate directly. hyper's pooled
//! client did the same through a pool checkout, a channel hop to its connection task and a
//! task spawned per request — ~9 % of the hub's CPU per proxied GET (callgrind). Servers
//! that do not offer HTTP/2 (plain http://, or ALPN without h2) are left to hyper's pooled
//! HTTP/1.1 client by the caller.
use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use h2::client::SendRequest;
use http_body_util::BodyExt;
use hyper::{
    Request, Response,
    body::{Body, Frame},
    http::uri::PathAndQuery,
};

use super::{
    connect::{Conn, MarkedConnector},
    server::Server,
};
use crate::body::{BodyError, ProxyBody};

/// Flow-control windows and limits as hyper's client sets them: a 1k-pod LIST streams
/// without waiting for window updates.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
const MAX_HEADER_LIST: u32 = 16 << 10;
const MAX_SEND_BUFFER: usize = 1 << 20;
/// How long the connection may be quiet (no byte from the server) before it is asked for
/// an HTTP/2 PING, and how long the answer may take. A link that died without a FIN or
/// RST leaves the connection open and silent: without this, watches would wait on it until
/// TCP gave up (many minutes). A connection carrying answers or watch events is never
/// pinged; the server's HTTP/2 layer answers PINGs however busy its handlers are.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Nothing was sent: the server could not be reached.
    #[error("connect: {0}")]
    Connect(String),
    /// The server does not speak HTTP/2: the request, unsent, for another way there.
    #[error("the server does not offer HTTP/2")]
    NotHttp2(Box<Request<Bytes>>),
    /// The connection ended as the request was sent, or the server refused the stream:
    /// it did nothing with the request, which the caller may send again.
    #[error("the request was refused before it was processed: {0}")]
    Refused(String),
    /// Sent (or possibly sent) and failed.
    #[error("{0}")]
    Failed(String),
}

/// Why no connection is ready for a request.
enum Unready {
    NotHttp2,
    Error(ChannelError),
}

impl From<ChannelError> for Unready {
    fn from(e: ChannelError) -> Self {
        Unready::Error(e)
    }
}

/// Asks the connection for a PING now; answered with its round trip when the PONG came.
type PingAsk = tokio::sync::oneshot::Sender<Duration>;

#[derive(Clone)]
struct Slot {
    sender: SendRequest<Bytes>,
    generation: u64,
    pinger: tokio::sync::mpsc::UnboundedSender<PingAsk>,
    /// When a byte last arrived on this connection ([`now_ms`](super::health::now_ms)).
    heard: Arc<AtomicU64>,
}

pub struct Channel {
    connector: MarkedConnector,
    /// The live connection: None before the first request and after one ended.
    slot: tokio::sync::Mutex<Option<Slot>>,
    /// Numbers connections, so a request that saw one end drops that one only.
    generations: AtomicU64,
    http1_only: AtomicBool,
}

impl Channel {
    pub fn new(connector: MarkedConnector) -> Channel {
        Channel {
            connector,
            slot: tokio::sync::Mutex::new(None),
            generations: AtomicU64::new(0),
            http1_only: AtomicBool::new(false),
        }
    }

    /// The server answered ALPN without h2 (or is plain http://).
    pub fn http1_only(&self) -> bool {
        self.http1_only.load(Ordering::Relaxed)
    }

    /// A PING on the live connection: its round trip, or None when there is no live
    /// connection or no PONG within `within` (a connection being made counts as none).
    pub async fn ping(&self, within: Duration) -> Option<Duration> {
        let pinger = self.slot.try_lock().ok()?.as_ref()?.pinger.clone();
        let (ask, answer) = tokio::sync::oneshot::channel();
        pinger.send(ask).ok()?;
        tokio::time::timeout(within, answer).await.ok()?.ok()
    }

    /// Whether a byte arrived on the live connection within `window` (false when there
    /// is none, or it is being made).
    pub fn heard_within(&self, window: Duration) -> bool {
        let Ok(slot) = self.slot.try_lock() else {
            return false;
        };
        let at = slot.as_ref().map_or(0, |s| s.heard.load(Ordering::Relaxed));
        at > 0 && super::health::now_ms().saturating_sub(at) <= window.as_millis() as u64
    }

    /// Whether a connection is up (not being made, not ended).
    pub fn connected(&self) -> bool {
        self.slot.try_lock().is_ok_and(|slot| slot.is_some())
    }

    /// Sends `req` to `server` and returns its answer once the headers arrive; the body
    /// streams as the server sends it, with flow control released as it is read.
    pub async fn request(
        &self,
        server: &Server,
        req: Request<Bytes>,
    ) -> Result<Response<ProxyBody>, ChannelError> {
        let mut slot = match self.ready(server).await {
            Ok(slot) => slot,
            Err(Unready::NotHttp2) => return Err(ChannelError::NotHttp2(Box::new(req))),
            Err(Unready::Error(e)) => return Err(e),
        };
        let (parts, body) = req.into_parts();
        let end_of_stream = body.is_empty();
        let (answer, mut stream) = match slot
            .sender
            .send_request(Request::from_parts(parts, ()), end_of_stream)
        {
            Ok(sent) => sent,
            Err(e) => {
                // The connection ended (closed, or GOAWAY) after it said it was ready.
                self.forget(slot.generation).await;
                return Err(ChannelError::Refused(e.to_string()));
            }
        };
        if !end_of_stream {
            // Buffered by h2 beyond the flow-control window (bodies are at most 3 MiB).
            stream
                .send_data(body, true)
                .map_err(|e| ChannelError::Failed(e.to_string()))?;
        }
        let resp = answer.await.map_err(|e| {
            // REFUSED_STREAM promises the server did nothing with it (RFC 9113 §8.7).
            if e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                ChannelError::Refused(e.to_string())
            } else {
                ChannelError::Failed(e.to_string())
            }
        })?;
        Ok(resp.map(|recv| {
            ReceivedBody {
                recv,
                data_done: false,
                done: false,
                failed: None,
            }
            .boxed()
        }))
    }

    /// A sender ready for one more stream (it waits while the server's stream limit is
    /// reached), connecting when there is no live connection.
    async fn ready(&self, server: &Server) -> Result<Slot, Unready> {
        let current = self.slot.lock().await.clone();
        if let Some(slot) = current {
            match slot.sender.ready().await {
                Ok(sender) => return Ok(Slot { sender, ..slot }),
                Err(_) => self.forget(slot.generation).await,
            }
        }
        let mut guard = self.slot.lock().await;
        // Requests that found no connection wait here for one to be made, not one each.
        if guard.is_none() {
            let (sender, pinger, heard) = self.connect(server).await?;
            *guard = Some(Slot {
                sender,
                generation: self.generations.fetch_add(1, Ordering::Relaxed),
                pinger,
                heard,
            });
        }
        let slot = guard.clone().expect("just filled");
        drop(guard);
        let generation = slot.generation;
        match slot.sender.clone().ready().await {
            Ok(sender) => Ok(Slot { sender, ..slot }),
            Err(e) => {
                self.forget(generation).await;
                Err(ChannelError::Refused(e.to_string()).into())
            }
        }
    }

    /// Drops the connection of `generation` if it is still the current one.
    async fn forget(&self, generation: u64) {
        let mut slot = self.slot.lock().await;
        if slot.as_ref().is_some_and(|s| s.generation == generation) {
            *slot = None;
        }
    }

    async fn connect(
        &self,
        server: &Server,
    ) -> Result<
        (
            SendRequest<Bytes>,
            tokio::sync::mpsc::UnboundedSender<PingAsk>,
            Arc<AtomicU64>,
        ),
        Unready,
    > {
        // Without TLS there is no ALPN, and HTTP/2 is never offered: no need to connect.
        let conn = match server.url.scheme.as_str() {
            "https" => Some(
                self.connector
                    .open(&server.uri(PathAndQuery::from_static("/")))
                    .await
                    .map_err(|e| ChannelError::Connect(e.to_string()))?,
            ),
            _ => None,
        };
        let Some(tls) = conn.and_then(Conn::into_http2) else {
            self.http1_only.store(true, Ordering::Relaxed);
            return Err(Unready::NotHttp2);
        };
        let heard = Arc::new(AtomicU64::new(super::health::now_ms()));
        let (sender, mut connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .enable_push(false)
            .handshake::<_, Bytes>(Heard {
                inner: tls,
                server: server.health.heard_handle(),
                connection: heard.clone(),
            })
            .await
            .map_err(|e| ChannelError::Connect(format!("HTTP/2 handshake: {e}")))?;
        let authority = server.url.authority();
        let (quiet, recheck) = (heard.clone(), server.health.recheck_handle());
        let mut ping = connection.ping_pong().expect("the first call");
        let (pinger, mut asks) = tokio::sync::mpsc::unbounded_channel::<PingAsk>();
        tokio::spawn(async move {
            // A PING when the connection was quiet for KEEPALIVE_IDLE, and whenever a
            // waiting request asks for one; a PING unanswered for KEEPALIVE_TIMEOUT ends it.
            let keepalive = async {
                loop {
                    let asked = tokio::select! {
                        () = quiet_for(&quiet, KEEPALIVE_IDLE) => None,
                        ask = asks.recv() => ask,
                    };
                    let sent = Instant::now();
                    let pong = ping.ping(h2::Ping::opaque());
                    if !matches!(
                        tokio::time::timeout(KEEPALIVE_TIMEOUT, pong).await,
                        Ok(Ok(_))
                    ) {
                        return;
                    }
                    if let Some(ask) = asked {
                        let _ = ask.send(sent.elapsed());
                    }
                }
            };
            tokio::select! {
                ended = &mut connection => if let Err(e) = ended {
                    tracing::debug!(server = %authority, "cloud connection ended: {e}");
                },
                // Dropping the connection fails its streams, so the requests and watches
                // on it end now and are retried elsewhere; new requests get a new one.
                () = keepalive => tracing::info!(
                    server = %authority,
                    "cloud connection answered no PING within {} s: dropped",
                    KEEPALIVE_TIMEOUT.as_secs()
                ),
            }
            // However it ended, the server is checked now rather than at the next request:
            // a killed server refuses the new connection and is marked down at once.
            recheck.ask();
        });
        Ok((sender, pinger, heard))
    }
}

/// Resolves once nothing has arrived on the stamp's connections for `idle`.
async fn quiet_for(heard: &AtomicU64, idle: Duration) {
    loop {
        let since = super::health::now_ms().saturating_sub(heard.load(Ordering::Relaxed));
        let left = idle.saturating_sub(Duration::from_millis(since));
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left).await;
    }
}

/// The connection's byte stream, stamping the connection and its server's health with
/// the time of every read: bytes arriving (an answer, a watch event) are proof of life
/// however slow the answers are.
struct Heard<T> {
    inner: T,
    server: Arc<AtomicU64>,
    connection: Arc<AtomicU64>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Heard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = super::health::now_ms();
            self.server.store(now, Ordering::Relaxed);
            self.connection.store(now, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Heard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// At most this much of an answer is handed on as one piece.
const COALESCE_MAX: usize = 64 << 10;

/// An answer's body as h2 receives it: data frames, then trailers if any. Each frame's
/// bytes are handed back to the connection's flow-control window once read, so a slow
/// client slows its own stream, not the others on the connection. Frames already
/// received are handed on together (up to 64 KiB): kube-apiserver 1.33+ streams lists
/// and gzip in 4 KiB frames, and passing each on alone cost the hub a write to its client
/// per frame. Nothing waits for more: only what has arrived is joined.
struct ReceivedBody {
    recv: h2::RecvStream,
    data_done: bool,
    done: bool,
    /// An error met while joining frames, handed on after the data before it.
    failed: Option<h2::Error>,
}

impl ReceivedBody {
    /// `data`, read: its bytes go back to the connection's flow-control window.
    fn released(&mut self, data: Bytes) -> Bytes {
        let _ = self.recv.flow_control().release_capacity(data.len());
        data
    }

    /// The next data frame if one has already arrived.
    fn ready_data(&mut self, cx: &mut Context<'_>) -> Option<Bytes> {
        match self.recv.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => Some(self.released(data)),
            Poll::Ready(Some(Err(e))) => {
                self.failed = Some(e);
                None
            }
            Poll::Ready(None) => {
                self.data_done = true;
                None
            }
            Poll::Pending => None,
        }
    }
}

impl Body for ReceivedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Poll::Ready(Some(Err(e.into())));
        }
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(first)) => {
                    let first = self.released(first);
                    if first.len() >= COALESCE_MAX {
                        return Poll::Ready(Some(Ok(Frame::data(first))));
                    }
                    let Some(second) = self.ready_data(cx) else {
                        return Poll::Ready(Some(Ok(Frame::data(first))));
                    };
                    let mut joined = bytes::BytesMut::with_capacity(COALESCE_MAX);
                    joined.extend_from_slice(&first);
                    joined.extend_from_slice(&second);
                    while joined.len() < COALESCE_MAX {
                        match self.ready_data(cx) {
                            Some(more) => joined.extend_from_slice(&more),
                            None => break,
                        }
                    }
                    return Poll::Ready(Some(Ok(Frame::data(joined.freeze()))));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => self.data_done = true,
            }
        }
        let trailers = ready!(self.recv.poll_trailers(cx));
        self.done = true;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        // An error still to be handed on is not an end: a caller must not take the data
        // before it for a whole answer.
        self.failed.is_none() && (self.done || self.recv.is_end_stream())
    }
}
