//! A loopback TCP relay in front of the cloud that the soak can take down and bring back:
//! down is a killed apiserver as its clients see it (connections refused, open ones
//! closed), up is the same address listening again.
use std::{
    net::SocketAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    net::{TcpListener, TcpStream},
    runtime::Runtime,
    sync::watch,
    task::JoinHandle,
};

pub struct Relay {
    pub addr: SocketAddr,
    target: SocketAddr,
    rt: Runtime,
    /// The accept loop while up; every connection ends when `closing` changes.
    accept: Mutex<Option<JoinHandle<()>>>,
    closing: watch::Sender<u64>,
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
            closing: watch::channel(0).0,
        };
        relay.up()?;
        Ok(relay)
    }

    /// Listens again (no-op when listening).
    pub fn up(&self) -> Result<()> {
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
        let (target, closing) = (self.target, self.closing.subscribe());
        *accept = Some(self.rt.spawn(accept_loop(listener, target, closing)));
        Ok(())
    }

    /// Stops listening and closes every relayed connection.
    pub fn down(&self) {
        if let Some(h) = self.accept.lock().unwrap().take() {
            h.abort();
        }
        self.closing.send_modify(|g| *g += 1);
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, closing: watch::Receiver<u64>) {
    while let Ok((client, _)) = listener.accept().await {
        let mut closing = closing.clone();
        closing.mark_unchanged();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let (mut client, mut server) = (client, server);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = closing.changed() => {}
            }
        });
    }
}
