//! `hub run`: start everything in order, hold readiness until it is up, drain on SIGTERM.
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{net::TcpListener, sync::watch};

use crate::{
    admin,
    cache::Cache,
    certs,
    config::Config,
    coordinator::{self, pool::Pool},
    intercept::{self, Interceptor, OriginLookup},
    proxy::{Listener, Proxy, serving},
    relay,
    shared::Shared,
    state::{DataPath, HubState, InterceptState},
    upstream::{
        Cloud,
        identity::{self, ClientIdentity},
    },
};

/// How often certificate files are checked for rotation.
const CERT_RELOAD: Duration = Duration::from_secs(5);

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

/// The node-level watch cache (`crate::shared`), when resources are configured for it.
fn node_watch_cache(
    config: &Config,
    cloud: &Arc<Cloud>,
    stop: &watch::Receiver<bool>,
) -> Option<Arc<Shared>> {
    let resources = &config.cache.shared_resources;
    if resources.is_empty() {
        return None;
    }
    let authorization = Duration::from_secs(config.cache.authorization_seconds);
    let shared = Shared::new(
        cloud.clone(),
        resources.clone(),
        authorization,
        stop.clone(),
    );
    tracing::info!(
        ?resources,
        "node-level watch cache: each shared resource is listed and watched once for the node"
    );
    Some(Arc::new(shared))
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

/// The cloud's servers, CA and the node identity, from the config and/or a kubeconfig.
fn cloud_from_config(config: &Config) -> Result<Cloud, DaemonError> {
    let err = |e: identity::IdentityError| DaemonError::Config(e.to_string());
    let kube = config
        .cloud
        .kubeconfig
        .as_deref()
        .map(identity::read_kubeconfig)
        .transpose()
        .map_err(err)?
        .unwrap_or_default();
    let mut servers = config.cloud.servers.clone();
    if servers.is_empty() {
        servers.extend(kube.server.clone());
    }
    let ca_pem = match &config.cloud.ca_file {
        Some(f) => Some(identity::read(f).map_err(err)?),
        None => kube.ca_pem.clone(),
    };
    let roots = match &ca_pem {
        Some(pem) => identity::roots(pem, "cloud CA").map_err(err)?,
        None if servers.iter().any(|s| s.starts_with("https://")) => {
            return Err(DaemonError::Config(
                "cloud.caFile (or a kubeconfig with certificate-authority) is required for https cloud servers".into(),
            ));
        }
        None => rustls::RootCertStore::empty(),
    };
    let node = node_identity(config, &kube)?;
    let cloud = Cloud::new(&servers, roots, node.as_ref(), config.intercept.bypass_mark)
        .map_err(DaemonError::Config)?;
    Ok(match config.cloud.idle_check_seconds {
        Some(secs) => cloud.with_idle_check(Duration::from_secs(secs.max(1))),
        None => cloud,
    })
}

/// The node's client identity: cloud.certFile/keyFile, else the kubeconfig's client cert.
fn node_identity(
    config: &Config,
    kube: &identity::KubeconfigParts,
) -> Result<Option<ClientIdentity>, DaemonError> {
    let err = |e: identity::IdentityError| DaemonError::Config(e.to_string());
    Ok(match (&config.cloud.cert_file, &config.cloud.key_file) {
        (Some(c), Some(k)) => Some(
            identity::identity_from_pem(
                &identity::read(c).map_err(err)?,
                &identity::read(k).map_err(err)?,
                "cloud.certFile",
            )
            .map_err(err)?,
        ),
        _ => match (&kube.cert_pem, &kube.key_pem) {
            (Some(c), Some(k)) => Some(
                identity::identity_from_pem(c, k, "kubeconfig client certificate").map_err(err)?,
            ),
            _ => None,
        },
    })
}

/// Re-reads the node identity every `every` and swaps it in when it changed (kubelet and
/// cert-manager rotate these files in place); a broken pair keeps the current one.
async fn watch_node_identity(
    config: Arc<Config>,
    cloud: Arc<Cloud>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut current = None;
    loop {
        let kube = match config
            .cloud
            .kubeconfig
            .as_deref()
            .map(identity::read_kubeconfig)
            .transpose()
        {
            Ok(k) => k.unwrap_or_default(),
            Err(e) => {
                tracing::warn!("kubeconfig: {e}");
                identity::KubeconfigParts::default()
            }
        };
        match node_identity(&config, &kube) {
            Ok(Some(id)) => {
                let leaf = id.chain.first().cloned();
                if current.is_some() && current != leaf {
                    match cloud.set_node_identity(&id) {
                        Ok(()) => tracing::info!("node client certificate reloaded"),
                        Err(e) => tracing::warn!("keeping the current node certificate: {e}"),
                    }
                }
                current = leaf;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("keeping the current node certificate: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Names and addresses clients use to reach the apiserver, for the serving certificate.
fn serving_sans(config: &Config, vips: &[SocketAddr]) -> Vec<String> {
    let mut sans: Vec<String> = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    ]
    .map(String::from)
    .to_vec();
    sans.push(config.intercept.hub_address.to_string());
    sans.extend(config.intercept.hub_address6.map(|a| a.to_string()));
    sans.push(config.listen.tls_proxy.ip().to_string());
    sans.extend(vips.iter().map(|v| v.ip().to_string()));
    sans.sort();
    sans.dedup();
    sans
}

/// The TLS acceptor for the hub's listeners: tls.certFile/keyFile, or a certificate the
/// hub requests from the cloud (CSR) and renews itself; None when neither is possible.
async fn serving_tls(
    config: &Config,
    cloud: &Arc<Cloud>,
    vips: &[SocketAddr],
    state: &Arc<HubState>,
    stop: &watch::Receiver<bool>,
) -> Result<Option<tokio_rustls::TlsAcceptor>, DaemonError> {
    let (cert, key) = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ if cloud.has_node_identity() => {
            let managed = certs::Managed::under(
                &config.cache.dir,
                Duration::from_secs(config.tls.serving_certificate_seconds),
            );
            let sans = serving_sans(config, vips);
            state.set_intercept(InterceptState::Starting);
            certs::ensure(cloud, &config.node_name, &sans, &managed, state).await;
            let (c, k) = (managed.cert.clone(), managed.key.clone());
            tokio::spawn(certs::renew_forever(
                cloud.clone(),
                config.node_name.clone(),
                sans,
                managed,
                state.clone(),
                stop.clone(),
            ));
            (c, k)
        }
        _ => return Ok(None),
    };
    let reloading = Arc::new(
        serving::ReloadingCert::new(&cert, &key).map_err(|e| DaemonError::Config(e.to_string()))?,
    );
    let client_ca = match config.tls.client_ca_file.as_deref() {
        Some(ca) => Some(Arc::new(
            serving::ReloadingClientCa::new(ca).map_err(|e| DaemonError::Config(e.to_string()))?,
        )),
        None => None,
    };
    let server_config = serving::server_config(reloading.clone(), client_ca.clone())
        .map_err(|e| DaemonError::Config(e.to_string()))?;
    tokio::spawn(serving::watch_files(
        reloading,
        client_ca,
        CERT_RELOAD,
        stop.clone(),
    ));
    Ok(Some(tokio_rustls::TlsAcceptor::from(server_config)))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, DaemonError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Listen { addr, source })
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// SIGTERM or SIGINT.
    Signal,
    /// `handover` resolved: another copy of the hub takes the node (see `owner`).
    HandedOver,
}

/// Serves until a signal, or until `handover` resolves.
pub async fn run(
    config: Arc<Config>,
    handover: impl Future<Output = ()>,
) -> Result<Stopped, DaemonError> {
    let state = Arc::new(HubState::new(&config.node_name));
    for line in &config.node_layout.found {
        tracing::info!("{line}");
    }
    state.set_node_layout(config.node_layout.found.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cloud = Arc::new(cloud_from_config(&config)?);
    state.set_cloud(cloud.clone());
    // What the log says the node does while the cloud is gone: only what is configured.
    let offline = match (config.cache.enabled, config.pool_name.is_some()) {
        (true, true) => "reads are served by the pool and the local cache, node writes are queued",
        (true, false) => "reads are served from the local cache, node writes are queued",
        (false, _) => "requests fail until it is back (no cache configured)",
    };
    tokio::spawn(cloud.clone().probe_forever(stop_rx.clone(), offline));
    tokio::spawn(watch_node_identity(
        config.clone(),
        cloud.clone(),
        CERT_RELOAD,
        stop_rx.clone(),
    ));

    let admin_listener = bind(config.listen.admin).await?;
    let pods = crate::proxy::peer::PodCgroups::new(
        config.intercept.pods_cgroup_path.as_deref(),
        config.intercept.cgroup(),
    );
    tracing::info!(found = ?pods.present(), "the pods' cgroups");
    for w in crate::intercept::scope::warnings(&config) {
        tracing::warn!("{w}");
    }
    tokio::spawn(admin::serve(
        admin_listener,
        state.clone(),
        pods.clone(),
        stop_rx.clone(),
    ));

    // The cache opens before any listener, so the first request can already be answered
    // from it (an offline start answers from a warm cache at once).
    let cache = if config.cache.enabled {
        match Cache::open(&config.cache.dir, config.cache.components.clone()) {
            Ok((c, _note)) => {
                let c = Arc::new(c);
                state.set_cache(c.clone());
                // `hub cache` asks here while the daemon holds the store.
                let (socket, state, stop) = (
                    admin::inspect_socket(&config.cache.dir),
                    state.clone(),
                    stop_rx.clone(),
                );
                tokio::spawn(async move {
                    if let Err(e) = admin::serve_inspect(socket.clone(), state, stop).await {
                        tracing::warn!(socket = %socket.display(), "no cache inspection socket: {e}");
                    }
                });
                tokio::spawn(crate::cache::offline::replay_forever(
                    c.clone(),
                    cloud.clone(),
                    std::time::Duration::from_secs(config.cache.event_ttl_seconds),
                    stop_rx.clone(),
                ));
                Some(c)
            }
            Err(e) => {
                tracing::error!("local cache unavailable, forwarding only: {e}");
                state.error(format!("local cache unavailable: {e}"));
                None
            }
        }
    } else {
        None
    };

    // The pool coordinator: pushes this node's cache, serves the pool's data offline.
    let pool = match (&cache, &config.pool_name) {
        (Some(c), Some(_)) if !config.coordinator.endpoints.is_empty() => {
            let pool = Arc::new(Pool::new(config.clone()));
            state.set_pool(pool.clone());
            tokio::spawn(pool.clone().run(c.clone(), cloud.clone(), stop_rx.clone()));
            // While this hub leads the pool, it syncs the pool-scope resources for all.
            tokio::spawn(coordinator::leader::run(
                pool.clone(),
                cloud.clone(),
                config.coordinator.pool_scope_resources.clone(),
                stop_rx.clone(),
            ));
            Some(pool)
        }
        _ => None,
    };

    let vips = all_vips(&config)?;
    let tls = serving_tls(&config, &cloud, &vips, &state, &stop_rx).await?;
    state.set_data_path(if tls.is_some() {
        DataPath::Proxy
    } else {
        DataPath::Relay
    });
    let shared = node_watch_cache(&config, &cloud, &stop_rx);
    if let Some(s) = &shared {
        state.set_shared(s.clone());
    }
    let make_proxy = |origins: Option<Arc<dyn OriginLookup>>| {
        Arc::new(Proxy {
            node_name: config.node_name.clone(),
            cloud: cloud.clone(),
            state: state.clone(),
            pool_scope: config.coordinator.pool_scope_resources.clone(),
            origins,
            pods: pods.clone(),
            cache: cache.clone(),
            pool: pool.clone(),
            shared: shared.clone(),
        })
    };
    let plain = make_proxy(None);
    tokio::spawn(plain.clone().serve(
        bind(config.listen.proxy).await?,
        None,
        Listener::Plain,
        stop_rx.clone(),
    ));
    let mut interceptor = None;
    if !config.intercept.enabled {
        state.set_intercept(InterceptState::Disabled);
    } else {
        match Interceptor::load(
            config.intercept.cgroup(),
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
            match &tls {
                Some(acceptor) => {
                    let p = make_proxy(Some(origins.clone()));
                    tokio::spawn(p.serve(
                        listener,
                        Some(acceptor.clone()),
                        Listener::Vip(*vip),
                        stop_rx.clone(),
                    ));
                }
                None => {
                    tokio::spawn(relay::serve_vip(
                        listener,
                        *vip,
                        cloud.clone(),
                        origins.clone(),
                        state.clone(),
                        stop_rx.clone(),
                    ));
                }
            }
        }
        icpt.set_enabled(true)?;
        state.set_tracer(icpt.tracer().clone());
        state.set_intercept(InterceptState::Attached);
        // Clients that connected while the hub was not running still hold connections
        // straight to the apiserver: end them, so they connect again through the hub.
        let (cgroup, mark) = (config.intercept.cgroup(), config.intercept.bypass_mark);
        let ended = match intercept::bypass::end(&vips, cgroup, mark) {
            Ok(0) => 0,
            Ok(n) => {
                tracing::info!(
                    connections = n,
                    "ended connections to the apiserver that bypassed the hub; their clients reconnect through it"
                );
                n as u64
            }
            Err(e) => {
                tracing::warn!("cannot end connections that bypass the hub: {e}");
                0
            }
        };
        state.watch_bypass(crate::state::BypassWatch {
            vips: vips.clone(),
            cgroup: cgroup.to_path_buf(),
            mark,
            ended_at_start: ended,
        });
    }

    if let Some(acceptor) = &tls {
        match TcpListener::bind(config.listen.tls_proxy).await {
            Ok(l) => {
                tokio::spawn(plain.clone().serve(
                    l,
                    Some(acceptor.clone()),
                    Listener::Tls,
                    stop_rx.clone(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                tracing::warn!(addr = %config.listen.tls_proxy, "listen.tlsProxy address is not local; not listening there");
            }
            Err(source) => {
                return Err(DaemonError::Listen {
                    addr: config.listen.tls_proxy,
                    source,
                });
            }
        }
    }
    state.set_ready(true);
    tracing::info!(node = %config.node_name, vips = vips.len(), "hub ready");

    let stopped = tokio::select! {
        () = wait_for_signal() => Stopped::Signal,
        () = handover => Stopped::HandedOver,
    };
    match stopped {
        Stopped::Signal => tracing::info!("shutting down"),
        Stopped::HandedOver => tracing::info!("handing the node over to the DaemonSet's hub"),
    }
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
    if let Some(c) = &cache {
        c.close();
    }
    Ok(stopped)
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
