//! `hub run`: start everything in order, hold readiness until it is up, drain on SIGTERM.
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{net::TcpListener, sync::watch};

use crate::{
    admin,
    config::Config,
    intercept::{self, Interceptor, OriginLookup},
    relay,
    state::{HubState, InterceptState},
    upstream::Cloud,
};

/// How long in-flight connections get to finish after SIGTERM.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("interception: {0}")]
    Intercept(#[from] intercept::InterceptError),
}

/// Every address whose connects are redirected: config, kubeconfigs, in-cluster Service.
fn all_vips(config: &Config) -> Result<Vec<SocketAddr>, DaemonError> {
    let mut vips: Vec<SocketAddr> = Vec::new();
    for v in &config.intercept.vips {
        vips.push(
            v.parse()
                .map_err(|_| DaemonError::Config(format!("bad VIP {v}")))?,
        );
    }
    for kc in &config.intercept.kubeconfigs {
        vips.extend(intercept::discover::kubeconfig_servers(kc).map_err(DaemonError::Config)?);
    }
    vips.extend(intercept::discover::service_from_env());
    vips.sort();
    vips.dedup();
    Ok(vips)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, DaemonError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Listen { addr, source })
}

pub async fn run(config: Arc<Config>) -> Result<(), DaemonError> {
    let state = Arc::new(HubState::new(&config.node_name));
    let (stop_tx, stop_rx) = watch::channel(false);
    let cloud = Arc::new(
        Cloud::new(&config.cloud.servers, config.intercept.bypass_mark)
            .map_err(DaemonError::Config)?,
    );

    let admin_listener = bind(config.listen.admin).await?;
    tokio::spawn(admin::serve(admin_listener, state.clone(), stop_rx.clone()));

    let vips = all_vips(&config)?;
    let mut interceptor = None;
    if !config.intercept.enabled {
        state.set_intercept(InterceptState::Disabled);
    } else {
        match Interceptor::load(
            &config.intercept.cgroup_path,
            &config.intercept.pin_path,
            config.intercept.bypass_mark,
        ) {
            Ok(i) => interceptor = Some(Arc::new(i)),
            Err(e) => {
                tracing::error!("interception unavailable, serving only explicit listeners: {e}");
                state.set_intercept(InterceptState::Unavailable(e.to_string()));
            }
        }
    }

    if let Some(icpt) = &interceptor {
        let mut hub_ips = vec![config.intercept.hub_address];
        hub_ips.extend(config.intercept.hub_address6);
        for ip in hub_ips {
            match intercept::netdev::ensure_local(ip) {
                Ok(intercept::netdev::Holder::Existing) => {}
                Ok(holder) => tracing::info!(%ip, ?holder, "hub address assigned"),
                Err(e) => {
                    return Err(DaemonError::Config(format!(
                        "hub address {ip} is not local and cannot be assigned: {e}"
                    )));
                }
            }
        }
        let origins: Arc<dyn OriginLookup> = icpt.clone();
        for (index, vip) in vips.iter().enumerate() {
            let hub_ip: IpAddr = if vip.is_ipv4() {
                config.intercept.hub_address
            } else {
                config.intercept.hub_address6.ok_or_else(|| {
                    DaemonError::Config(format!("IPv6 VIP {vip} needs intercept.hubAddress6"))
                })?
            };
            // Listener first, map entry second: a redirected connect always finds a socket.
            let listener = bind(SocketAddr::new(hub_ip, 0)).await?;
            let local = listener
                .local_addr()
                .map_err(|source| DaemonError::Listen {
                    addr: SocketAddr::new(hub_ip, 0),
                    source,
                })?;
            icpt.add_vip(*vip, local, index as u32)?;
            state.add_vip(*vip, local);
            tracing::info!(%vip, listener = %local, "intercepting");
            tokio::spawn(relay::serve_vip(
                listener,
                *vip,
                cloud.clone(),
                origins.clone(),
                state.clone(),
                stop_rx.clone(),
            ));
        }
        icpt.set_enabled(true)?;
        state.set_intercept(InterceptState::Attached);
    }

    state.set_ready(true);
    tracing::info!(node = %config.node_name, vips = vips.len(), "hub ready");

    wait_for_signal().await;
    tracing::info!("shutting down");
    state.set_ready(false);
    // Stop redirecting before the listeners close, so no new connect lands on a dead port.
    if let Some(icpt) = &interceptor {
        for vip in &vips {
            icpt.remove_vip(*vip);
        }
        let _ = icpt.set_enabled(false);
    }
    let _ = stop_tx.send(true);
    let deadline = Instant::now() + DRAIN;
    while state.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(interceptor);
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}
