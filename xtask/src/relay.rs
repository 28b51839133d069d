//! A loopback TCP relay in front of the cloud that a run can cut and restore, counting the
//! bytes it carries each way (TLS records, HTTP/2 frames and headers: what the link
//! carries above TCP).
//!
//! Two ways to cut it:
//! - `down`: a killed apiserver as its clients see it — connections refused, open ones
//!   closed;
//! - `silence`: an edge link that drops every packet — nothing moves, new connections hang
//!   unanswered; on `up`, every connection that was open when the link went silent is reset
//!   (the far side and any NAT on the way forgot it), new ones whose client still waits go
//!   through, and those whose client gave up never reached the cloud.
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    runtime::Runtime,
    sync::watch,
    task::JoinHandle,
};

/// The link as the relay's connections see it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Link {
    silent: bool,
    /// Bumped at the end of every silence: connections born before it are reset.
    silences: u64,
    /// Bumped by `down`: connections born before it are closed.
    downs: u64,
}

pub struct Relay {
    pub addr: SocketAddr,
    target: SocketAddr,
    rt: Runtime,
    /// The accept loop while listening.
    accept: Mutex<Option<JoinHandle<()>>>,
    link: watch::Sender<Link>,
    counts: Arc<Counts>,
}

/// Bytes relayed so far, each way, the connections made, and those given up on while the
/// link was silent (they never reached the cloud).
#[derive(Default)]
struct Counts {
    to_cloud: AtomicU64,
    from_cloud: AtomicU64,
    connections: AtomicU64,
    abandoned: AtomicU64,
}

/// A snapshot of `Counts`.
#[derive(Clone, Copy, Default, Debug)]
pub struct Carried {
    pub to_cloud: u64,
    pub from_cloud: u64,
    pub connections: u64,
    pub abandoned: u64,
}

impl Carried {
    /// What was carried after `before`.
    pub fn since(self, before: Carried) -> Carried {
        Carried {
            to_cloud: self.to_cloud - before.to_cloud,
            from_cloud: self.from_cloud - before.from_cloud,
            connections: self.connections - before.connections,
            abandoned: self.abandoned - before.abandoned,
        }
    }
}

impl Relay {
    /// Listens on a fresh loopback port and forwards to `target`.
    pub fn start(port: u16, target: SocketAddr) -> Result<Relay> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let relay = Relay {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            target,
            rt,
            accept: Mutex::new(None),
            link: watch::channel(Link {
                silent: false,
                silences: 0,
                downs: 0,
            })
            .0,
            counts: Arc::default(),
        };
        relay.up()?;
        Ok(relay)
    }

    /// Listens again after `down`, or ends a silence (no-op when up).
    pub fn up(&self) -> Result<()> {
        self.link.send_if_modified(|l| {
            let was = l.silent;
            if was {
                l.silent = false;
                l.silences += 1;
            }
            was
        });
        let mut accept = self.accept.lock().unwrap();
        if accept.is_some() {
            return Ok(());
        }
        let addr = self.addr;
        let listener = self.rt.block_on(async move {
            // The old socket may linger a moment after the abort.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpListener::bind(addr).await {
                    Ok(l) => return Ok(l),
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        let listener = listener.with_context(|| format!("relay: listen on {addr}"))?;
        let (target, link, counts) = (self.target, self.link.subscribe(), self.counts.clone());
        *accept = Some(self.rt.spawn(accept_loop(listener, target, link, counts)));
        Ok(())
    }

    /// Stops listening and closes every relayed connection.
    pub fn down(&self) {
        if let Some(h) = self.accept.lock().unwrap().take() {
            h.abort();
        }
        self.link.send_modify(|l| l.downs += 1);
    }

    /// Drops every packet until `up`: see the module's comment.
    pub fn silence(&self) {
        self.link.send_modify(|l| l.silent = true);
    }

    /// What the relay has carried since it started.
    pub fn carried(&self) -> Carried {
        let c = &self.counts;
        Carried {
            to_cloud: c.to_cloud.load(Ordering::Relaxed),
            from_cloud: c.from_cloud.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
            abandoned: c.abandoned.load(Ordering::Relaxed),
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    link: watch::Receiver<Link>,
    counts: Arc<Counts>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let (link, counts) = (link.clone(), counts.clone());
        tokio::spawn(async move {
            let Some((client, held)) = wait_out_silence(client, link.clone()).await else {
                counts.abandoned.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Ok(mut server) = TcpStream::connect(target).await else {
                return;
            };
            counts.connections.fetch_add(1, Ordering::Relaxed);
            counts
                .to_cloud
                .fetch_add(held.len() as u64, Ordering::Relaxed);
            if server.write_all(&held).await.is_err() {
                return;
            }
            let born = *link.borrow();
            relay_connection(client, server, born, link, &counts).await;
        });
    }
}

/// A connection made while the link is silent gets through only if its client still waits
/// when the link is back, with what it sent meanwhile; one whose client gave up never
/// reached the cloud (its packets were dropped).
async fn wait_out_silence(
    mut client: TcpStream,
    mut link: watch::Receiver<Link>,
) -> Option<(TcpStream, Vec<u8>)> {
    let mut held = Vec::new();
    loop {
        if !link.borrow_and_update().silent {
            return Some((client, held));
        }
        tokio::select! {
            read = client.read_buf(&mut held) => {
                if matches!(read, Ok(0) | Err(_)) {
                    return None;
                }
            }
            changed = link.changed() => changed.ok()?,
        }
    }
}

/// Carries one connection both ways until both sides have ended it; closes it at a `down`,
/// resets it at the end of a silence.
async fn relay_connection(
    mut client: TcpStream,
    mut server: TcpStream,
    born: Link,
    link: watch::Receiver<Link>,
    counts: &Counts,
) {
    let mut ended = link.clone();
    let reset = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let both_ways = async {
            tokio::join!(
                pump(&mut cr, &mut sw, link.clone(), born, &counts.to_cloud),
                pump(&mut sr, &mut cw, link.clone(), born, &counts.from_cloud),
            )
        };
        tokio::select! {
            _ = both_ways => false,
            now = ended.wait_for(|l| l.downs > born.downs || l.silences > born.silences) => {
                now.is_ok_and(|l| l.silences > born.silences)
            }
        }
    };
    if reset {
        // What a peer that forgot the connection answers: RST, not FIN.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// One direction: read, hold while the link is silent, count, write. Ends at EOF (passing
/// the half-close on) or on an error; what it held when its connection is cut is never sent.
async fn pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    mut link: watch::Receiver<Link>,
    born: Link,
    count: &AtomicU64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let alive = link
            .wait_for(|l| !l.silent)
            .await
            .is_ok_and(|l| l.silences == born.silences && l.downs == born.downs);
        if !alive {
            return;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;

    /// An echo server on a fresh loopback port, in `rt`.
    fn echo(rt: &Runtime) -> SocketAddr {
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn echoed(s: &mut TcpStream, what: &[u8]) -> Vec<u8> {
        s.write_all(what).await.unwrap();
        let mut back = vec![0; what.len()];
        tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut back))
            .await
            .expect("an echo within 30 s")
            .unwrap();
        back
    }

    #[test]
    fn a_silence_holds_everything_counts_nothing_and_resets_the_connections_it_cut() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let relay = Relay::start(hub_tests::ports::free_port(), echo(&rt)).unwrap();
        let addr = relay.addr;
        let mut open = rt.block_on(TcpStream::connect(addr)).unwrap();
        assert_eq!(rt.block_on(echoed(&mut open, b"hello")), b"hello");
        let c = relay.carried();
        assert_eq!((c.to_cloud, c.from_cloud, c.connections), (5, 5, 1));

        relay.silence();
        let mut waits = rt.block_on(async {
            open.write_all(b"lost").await.unwrap();
            let mut waits = TcpStream::connect(addr).await.unwrap();
            waits.write_all(b"held").await.unwrap();
            let mut gives_up = TcpStream::connect(addr).await.unwrap();
            gives_up.write_all(b"never").await.unwrap();
            drop(gives_up);
            // Nothing comes back while silent.
            let mut one = [0u8; 1];
            let quiet = tokio::time::timeout(Duration::from_millis(300), open.read(&mut one));
            assert!(quiet.await.is_err(), "an answer through a silent link");
            waits
        });
        // The relay sees the third client give up before the link is back.
        let deadline = Instant::now() + Duration::from_secs(30);
        while relay.carried().abandoned < 1 {
            assert!(
                Instant::now() < deadline,
                "the abandoned connection never noticed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        relay.up().unwrap();

        rt.block_on(async {
            let mut rest = Vec::new();
            let cut = tokio::time::timeout(Duration::from_secs(30), open.read_to_end(&mut rest))
                .await
                .expect("the cut connection ends within 30 s");
            assert_eq!(cut.unwrap_err().kind(), ErrorKind::ConnectionReset);
            let mut back = [0u8; 4];
            tokio::time::timeout(Duration::from_secs(30), waits.read_exact(&mut back))
                .await
                .expect("the waiting connection goes through")
                .unwrap();
            assert_eq!(&back, b"held");
        });
        let c = relay.carried();
        // "lost" and "never" were never carried; "held" both ways, on a second connection.
        assert_eq!((c.to_cloud, c.from_cloud), (9, 9));
        assert_eq!((c.connections, c.abandoned), (2, 1));
    }
}
