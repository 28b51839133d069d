//! The relay data path, used while the hub has no serving certificate: an intercepted
//! connection is relayed byte for byte to a cloud server over a socket carrying the bypass
//! mark (TLS stays end to end between client and cloud).
use std::{net::SocketAddr, sync::Arc};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
};
use tracing::Instrument;

use crate::{
    intercept::OriginLookup,
    state::{ConnRecord, HubState},
    upstream::{Cloud, connect_marked},
};

/// Accepts on one VIP's listener until `shutdown` turns true.
pub async fn serve_vip(
    listener: TcpListener,
    vip: SocketAddr,
    cloud: Arc<Cloud>,
    origins: Arc<dyn OriginLookup>,
    state: Arc<HubState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut next_id: u64 = 0;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (client, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(%vip, "accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        next_id += 1;
        let local = client.local_addr().unwrap_or(vip);
        let origin = origins.lookup(peer, local);
        let record = ConnRecord::intercepted(peer, vip, origin);
        let span = tracing::info_span!(
            "conn",
            id = next_id,
            orig_dst = %record.original_dst,
            pid = record.pid,
            cgroup = record.cgroup_id,
            route = "relay"
        );
        let (cloud, state) = (cloud.clone(), state.clone());
        tokio::spawn(relay(client, record, cloud, state).instrument(span));
    }
}

async fn relay(
    mut client: TcpStream,
    mut record: ConnRecord,
    cloud: Arc<Cloud>,
    state: Arc<HubState>,
) {
    let _ = client.set_nodelay(true);
    let mut connected = None;
    for server in cloud.order() {
        match connect_marked(&server.url.authority(), cloud.mark()).await {
            Ok(s) => {
                server.health.success();
                connected = Some((s, server));
                break;
            }
            Err(e) => server.health.failure(&format!("connect: {e}")),
        }
    }
    let Some((mut upstream, server)) = connected else {
        state.upstream_failed();
        tracing::warn!("no cloud server reachable for a relayed connection");
        let _guard = state.connection_opened(&record);
        return;
    };
    let server = server.url.clone();
    record.upstream = Some(server.authority());
    let _guard = state.connection_opened(&record);
    tracing::debug!(upstream = %server.authority(), "relaying");
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((to, from)) => state.relayed(to, from),
        Err(e) => tracing::debug!("relay ended: {e}"),
    }
}
