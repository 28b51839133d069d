//! The one configuration: YAML file (design.md §3), command-line overrides, validation.
//!
//! Parsed and validated once at start, then shared as `Arc<Config>`. Every field has a
//! default except `nodeName`. Errors name the field and the reason on one line.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Deserializer};

use crate::upstream::ServerUrl;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: field `{field}`: {reason}")]
    Parse {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// This node's name as the cloud knows it. Required.
    pub node_name: String,
    /// The node pool; no pool means no coordinator.
    #[serde(default)]
    pub pool_name: Option<String>,
    #[serde(default)]
    pub cloud: CloudConfig,
    #[serde(default)]
    pub intercept: InterceptConfig,
    #[serde(default)]
    pub listen: ListenConfig,
    #[serde(default)]
    pub tls: TlsConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub coordinator: CoordinatorConfig,
    /// What was found on the node at start for what the file left unset (not read from it).
    #[serde(skip)]
    pub node_layout: crate::node_layout::Resolved,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudConfig {
    /// Cloud apiserver URLs (`https://host:port`), balanced and health-checked.
    #[serde(default)]
    pub servers: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// A kubeconfig (e.g. kubelet's) to take the node identity and servers from.
    pub kubeconfig: Option<PathBuf>,
    /// Seconds a healthy server may send nothing (no answer, no watch event) before one
    /// `/readyz` checks it; traffic on its connections tells otherwise. Default 60.
    pub idle_check_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterceptConfig {
    /// Redirect apiserver-bound connects with eBPF. Off: only the explicit listeners serve.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The cgroup v2 directory the programs attach to (every process below it is covered).
    /// Unset: the node's cgroup2 hierarchy, found at start in mountinfo (`/sys/fs/cgroup`
    /// on a unified host, `/sys/fs/cgroup/unified` on a hybrid one).
    #[serde(default)]
    pub cgroup_path: Option<PathBuf>,
    /// The cgroup the node's pods live under. Connections from below it reach the hub
    /// only through a VIP, and never speak as the node. Unset: kubelet's defaults under
    /// the cgroup mount, `kubepods.slice` (systemd driver) and `kubepods` (cgroupfs).
    #[serde(default)]
    pub pods_cgroup_path: Option<PathBuf>,
    /// Where redirected IPv4 connections land; must be reachable from pod namespaces.
    #[serde(default = "default_hub_address")]
    pub hub_address: IpAddr,
    /// Where redirected IPv6 connections land; needed only for IPv6 VIPs.
    #[serde(default)]
    pub hub_address6: Option<IpAddr>,
    /// apiserver addresses (`ip:port`, `[ip6]:port`) whose connects are redirected.
    #[serde(default)]
    pub vips: Vec<String>,
    /// kubeconfigs whose `server:` addresses are added to the VIPs (kubelet, kube-proxy).
    #[serde(default)]
    pub kubeconfigs: Vec<PathBuf>,
    /// SO_MARK on the hub's own upstream sockets, so they are never redirected.
    #[serde(default = "default_bypass_mark", deserialize_with = "int_or_hex")]
    pub bypass_mark: u32,
    /// bpffs directory for the pinned maps.
    #[serde(default = "default_pin_path")]
    pub pin_path: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenConfig {
    /// Plain HTTP proxy for explicitly configured clients.
    #[serde(default = "default_proxy")]
    pub proxy: SocketAddr,
    /// TLS proxy on the hub address.
    #[serde(default = "default_tls_proxy")]
    pub tls_proxy: SocketAddr,
    /// Admin: /healthz, /readyz, /metrics, /v1/status.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    /// The plain listener speaks as the node for whoever connects: on anything but a
    /// loopback address that is everyone who can reach it. Off unless set to say so.
    #[serde(default)]
    pub proxy_gives_node_identity_to_the_network: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    /// Lifetime asked for a serving certificate the hub requests itself (no certFile);
    /// renewed when 80 % of it has passed.
    #[serde(default = "default_serving_certificate_seconds")]
    pub serving_certificate_seconds: u64,
}

fn default_serving_certificate_seconds() -> u64 {
    24 * 3600
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            serving_certificate_seconds: default_serving_certificate_seconds(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CacheConfig {
    /// Local state directory (cache store, key ownership, certificates).
    #[serde(default = "default_cache_dir")]
    pub dir: PathBuf,
    /// Turn the local cache off (the hub then only forwards).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Components (User-Agent's first word, lowercase) whose answers are cached.
    #[serde(default = "default_cache_components")]
    pub components: Vec<String>,
    /// Events the node records offline are dropped (and counted) once their last
    /// sighting is older than this: the cloud's event TTL (kube-apiserver's --event-ttl,
    /// 1 h by default) would have removed them anyway.
    #[serde(default = "default_event_ttl_seconds")]
    pub event_ttl_seconds: u64,
    /// The node-level watch cache: resources the hub lists and watches once for the whole
    /// node, as the node, and answers every client's LIST and watch of from that one set
    /// (`group/version/resource`, as poolScopeResources; empty turns it off). The node
    /// must be allowed to list and watch them across all namespaces: services by
    /// kube-apiserver's Node authorizer, endpoints and EndpointSlices by the ClusterRole the
    /// DaemonSet installs. A resource the cloud refuses the node is left to the cloud. With
    /// a pool, its pool-scope resources come from the coordinator instead.
    #[serde(default = "default_shared_resources")]
    pub shared_resources: Vec<String>,
    /// How long the cloud's answer to a credential's own request lets that credential be
    /// answered from a shared set (for the same verb, resource, namespace and selectors);
    /// a later request of it renews it. kube-apiserver's webhook authorizer caches an
    /// allowed answer this long by default.
    #[serde(default = "default_authorization_seconds")]
    pub authorization_seconds: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// etcd members of the pool coordinator.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Key prefix, as kube-apiserver's --etcd-prefix.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Resources the pool leader syncs for the whole pool.
    #[serde(default = "default_pool_scope")]
    pub pool_scope_resources: Vec<String>,
    /// Resources (`group/version/resource`, as poolScopeResources) this hub keeps in its
    /// own cache only and never pushes to the pool; what it pushed of them before is
    /// released. By default leases (see `default_not_pushed`).
    #[serde(default = "default_not_pushed")]
    pub not_pushed: Vec<String>,
    /// CA of the etcd members (https endpoints).
    pub ca_file: Option<PathBuf>,
    /// This node's client certificate and key for etcd (one identity per node).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The etcd's --max-txn-ops, as a hint: a set needing more is sent in several Txns,
    /// and an etcd that refuses less lowers it (to etcd's default 128, then by halves).
    #[serde(default = "default_max_txn_ops")]
    pub max_txn_ops: usize,
    /// The etcd's --max-request-bytes, as a hint, likewise (etcd's default is 1.5 MiB); one
    /// object larger than a request may be cannot be stored.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// TTL of the pool leader's lease: a leader that dies is replaced after about this long.
    #[serde(default = "default_leader_lease_seconds")]
    pub leader_lease_seconds: u64,
    /// How often the pool leader removes what no live hub holds any more.
    #[serde(default = "default_gc_interval_seconds")]
    pub gc_interval_seconds: u64,
    /// How long a hub may be gone from the pool before the keys only it held are removed
    /// (a reboot or a short outage keeps them).
    #[serde(default = "default_node_grace_seconds")]
    pub node_grace_seconds: u64,
    /// Objects the node's cache got from a single GET (no list or watch keeps them current)
    /// leave the coordinator this long after they last changed; the node's cache keeps them.
    #[serde(default = "default_get_object_ttl_seconds")]
    pub get_object_ttl_seconds: u64,
    /// How long the record of a deletion is kept in the coordinator (it stops an older
    /// write from bringing the object back; no write that old is expected after this).
    #[serde(default = "default_tombstone_ttl_seconds")]
    pub tombstone_ttl_seconds: u64,
}

fn default_shared_resources() -> Vec<String> {
    default_pool_scope()
}
fn default_authorization_seconds() -> u64 {
    300
}
fn yes() -> bool {
    true
}
fn default_hub_address() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(169, 254, 2, 1))
}
fn default_bypass_mark() -> u32 {
    0x2a6
}
fn default_pin_path() -> PathBuf {
    "/sys/fs/bpf/hub".into()
}
fn default_proxy() -> SocketAddr {
    "127.0.0.1:10261".parse().unwrap()
}
fn default_tls_proxy() -> SocketAddr {
    "169.254.2.1:10268".parse().unwrap()
}
/// listen.admin's default (OpenYurt's port).
pub const DEFAULT_ADMIN: &str = "127.0.0.1:10267";

fn default_admin() -> SocketAddr {
    DEFAULT_ADMIN.parse().unwrap()
}
fn default_cache_dir() -> PathBuf {
    "/var/lib/hub".into()
}
fn default_event_ttl_seconds() -> u64 {
    3600
}
fn default_cache_components() -> Vec<String> {
    crate::cache::DEFAULT_COMPONENTS.map(String::from).to_vec()
}
/// What deploy/base/coordinator-etcd.yaml sets: with it a node's pod list fits one Txn (etcd's
/// own defaults, 128 and 1.5 MiB, take it in several).
fn default_max_txn_ops() -> usize {
    20_000
}
fn default_max_request_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_leader_lease_seconds() -> u64 {
    10
}
fn default_gc_interval_seconds() -> u64 {
    60
}
fn default_node_grace_seconds() -> u64 {
    600
}
fn default_get_object_ttl_seconds() -> u64 {
    3600
}
fn default_tombstone_ttl_seconds() -> u64 {
    3600
}
fn default_prefix() -> String {
    "/registry".into()
}
/// Leases stay on the node. Each renewal a node writes (every 10 s) would be one more
/// coordinator write — measured, about 1 etcd revision and 1.3 KB of WAL per member per
/// renewal: ~100 writes/s for a 1,000-node pool, several times all its other steady
/// writes — while no client on a node reads another node's lease (the node's own is
/// served from its own cache), and pods' leader-election leases cannot elect across
/// nodes from the pool: offline, each node's writes are queued for the cloud, not
/// arbitrated. docs/pool-scale.md.
fn default_not_pushed() -> Vec<String> {
    vec!["coordination.k8s.io/v1/leases".to_string()]
}

fn default_pool_scope() -> Vec<String> {
    [
        "/v1/services",
        "/v1/endpoints",
        "discovery.k8s.io/v1/endpointslices",
    ]
    .map(String::from)
    .to_vec()
}

impl InterceptConfig {
    /// The cgroup the programs attach to: `cgroupPath`, as configured or as found at start
    /// (`crate::node_layout::resolve`); `/sys/fs/cgroup` if neither.
    pub fn cgroup(&self) -> &Path {
        self.cgroup_path
            .as_deref()
            .unwrap_or(Path::new("/sys/fs/cgroup"))
    }
}

impl Default for InterceptConfig {
    fn default() -> Self {
        InterceptConfig {
            enabled: true,
            cgroup_path: None,
            pods_cgroup_path: None,
            hub_address: default_hub_address(),
            hub_address6: None,
            vips: vec![],
            kubeconfigs: vec![],
            bypass_mark: default_bypass_mark(),
            pin_path: default_pin_path(),
        }
    }
}
impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            proxy: default_proxy(),
            tls_proxy: default_tls_proxy(),
            admin: default_admin(),
            proxy_gives_node_identity_to_the_network: false,
        }
    }
}
impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: default_cache_dir(),
            enabled: true,
            components: default_cache_components(),
            event_ttl_seconds: default_event_ttl_seconds(),
            shared_resources: default_shared_resources(),
            authorization_seconds: default_authorization_seconds(),
        }
    }
}
impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            endpoints: vec![],
            prefix: default_prefix(),
            pool_scope_resources: default_pool_scope(),
            not_pushed: default_not_pushed(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            max_txn_ops: default_max_txn_ops(),
            max_request_bytes: default_max_request_bytes(),
            leader_lease_seconds: default_leader_lease_seconds(),
            gc_interval_seconds: default_gc_interval_seconds(),
            node_grace_seconds: default_node_grace_seconds(),
            get_object_ttl_seconds: default_get_object_ttl_seconds(),
            tombstone_ttl_seconds: default_tombstone_ttl_seconds(),
        }
    }
}

/// Accepts `678`, `0x2a6` (YAML int) or `"0x2a6"` (string).
fn int_or_hex<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u32),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(v) => Ok(v),
        Raw::Str(s) => {
            let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.map_err(|_| serde::de::Error::custom(format!("`{s}` is not a 32-bit integer")))
        }
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { field, reason, .. } => ConfigError::Parse {
                path: path.to_owned(),
                field,
                reason,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Parses YAML text (no validation).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let reason = e.into_inner().to_string().replace('\n', " ");
            ConfigError::Parse {
                path: PathBuf::new(),
                field: if field == "." {
                    "(top level)".into()
                } else {
                    field
                },
                reason,
            }
        })
    }

    /// Checks everything that parsing alone cannot; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_dns_subdomain(&self.node_name) {
            return Err(invalid(
                "nodeName",
                format!(
                    "`{}` is not a valid node name (lowercase DNS subdomain, 1-253 chars)",
                    self.node_name
                ),
            ));
        }
        if let Some(pool) = &self.pool_name
            && !is_dns_subdomain(pool)
        {
            return Err(invalid("poolName", format!("`{pool}` is not a valid name")));
        }
        let c = &self.coordinator;
        for (field, v) in [
            ("coordinator.leaderLeaseSeconds", c.leader_lease_seconds),
            ("coordinator.gcIntervalSeconds", c.gc_interval_seconds),
            ("coordinator.nodeGraceSeconds", c.node_grace_seconds),
            ("coordinator.getObjectTtlSeconds", c.get_object_ttl_seconds),
            ("coordinator.tombstoneTtlSeconds", c.tombstone_ttl_seconds),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1 second"));
            }
        }
        if self.cache.authorization_seconds == 0 {
            return Err(invalid(
                "cache.authorizationSeconds",
                "must be at least 1 second",
            ));
        }
        for (i, gvr) in self.cache.shared_resources.iter().enumerate() {
            if crate::coordinator::leader::api_path(gvr).is_none() {
                return Err(invalid(
                    format!("cache.sharedResources[{i}]"),
                    format!(
                        "`{gvr}` is not group/version/resource (`/v1/services`, `discovery.k8s.io/v1/endpointslices`)"
                    ),
                ));
            }
        }
        // Neither cloud.servers nor cloud.kubeconfig: the kubelet's kubeconfig is looked
        // for at start (`node_layout::resolve`), which says what it tried if none is there.
        for (i, s) in self.cloud.servers.iter().enumerate() {
            ServerUrl::parse(s).map_err(|reason| invalid(format!("cloud.servers[{i}]"), reason))?;
        }
        if self.cloud.cert_file.is_some() != self.cloud.key_file.is_some() {
            return Err(invalid(
                "cloud.certFile",
                "certFile and keyFile must be given together",
            ));
        }
        if !self.listen.proxy.ip().is_loopback()
            && !self.listen.proxy_gives_node_identity_to_the_network
        {
            return Err(invalid(
                "listen.proxy",
                format!(
                    "{} is not a loopback address: the plain listener speaks as the node to whoever connects; set listen.proxyGivesNodeIdentityToTheNetwork: true if that is meant",
                    self.listen.proxy
                ),
            ));
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(invalid(
                "tls.certFile",
                "certFile and keyFile must be given together",
            ));
        }
        for (i, v) in self.intercept.vips.iter().enumerate() {
            let vip: SocketAddr = v.parse().map_err(|_| {
                invalid(
                    format!("intercept.vips[{i}]"),
                    format!("`{v}` is not ip:port or [ip6]:port"),
                )
            })?;
            if vip.is_ipv6() && self.intercept.hub_address6.is_none() {
                return Err(invalid(
                    format!("intercept.vips[{i}]"),
                    "an IPv6 VIP needs intercept.hubAddress6",
                ));
            }
        }
        if !self.intercept.hub_address.is_ipv4() {
            return Err(invalid(
                "intercept.hubAddress",
                "must be an IPv4 address (use hubAddress6 for IPv6)",
            ));
        }
        if let Some(a6) = self.intercept.hub_address6
            && !a6.is_ipv6()
        {
            return Err(invalid("intercept.hubAddress6", "must be an IPv6 address"));
        }
        if self.intercept.enabled && self.intercept.bypass_mark == 0 {
            return Err(invalid(
                "intercept.bypassMark",
                "must be non-zero, or the hub's own connections would loop",
            ));
        }
        if self
            .intercept
            .cgroup_path
            .as_ref()
            .is_some_and(|p| !p.is_absolute())
        {
            return Err(invalid("intercept.cgroupPath", "must be an absolute path"));
        }
        if self
            .intercept
            .pods_cgroup_path
            .as_ref()
            .is_some_and(|p| !p.is_absolute())
        {
            return Err(invalid(
                "intercept.podsCgroupPath",
                "must be an absolute path",
            ));
        }
        if !self.cache.dir.is_absolute() {
            return Err(invalid("cache.dir", "must be an absolute path"));
        }
        for (field, list) in [
            (
                "coordinator.poolScopeResources",
                &self.coordinator.pool_scope_resources,
            ),
            ("coordinator.notPushed", &self.coordinator.not_pushed),
        ] {
            for (i, gvr) in list.iter().enumerate() {
                let parts: Vec<&str> = gvr.split('/').collect();
                if parts.len() != 3 || parts[1].is_empty() || parts[2].is_empty() {
                    return Err(invalid(
                        format!("{field}[{i}]"),
                        format!(
                            "`{gvr}` is not group/version/resource (the core group empty: `/v1/events`)"
                        ),
                    ));
                }
            }
        }
        if !self.coordinator.prefix.starts_with('/') {
            return Err(invalid("coordinator.prefix", "must start with `/`"));
        }
        for (i, e) in self.coordinator.endpoints.iter().enumerate() {
            ServerUrl::parse(e)
                .map_err(|reason| invalid(format!("coordinator.endpoints[{i}]"), reason))?;
        }
        if !self.coordinator.endpoints.is_empty() && self.pool_name.is_none() {
            return Err(invalid(
                "poolName",
                "coordinator.endpoints is set but poolName is not",
            ));
        }
        Ok(())
    }
}

/// RFC 1123 subdomain, as Kubernetes requires of node names.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "nodeName: edge-1\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\n";

    fn check(text: &str) -> Result<Config, ConfigError> {
        let c = Config::parse(text)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = check(MINIMAL).unwrap();
        assert_eq!(c.listen.proxy, "127.0.0.1:10261".parse().unwrap());
        assert_eq!(c.listen.tls_proxy, "169.254.2.1:10268".parse().unwrap());
        assert_eq!(c.listen.admin, "127.0.0.1:10267".parse().unwrap());
        assert_eq!(c.intercept.bypass_mark, 0x2a6);
        assert_eq!(c.cache.dir, PathBuf::from("/var/lib/hub"));
        assert_eq!(c.coordinator.prefix, "/registry");
        assert_eq!(c.coordinator.pool_scope_resources.len(), 3);
        assert_eq!(
            c.coordinator.not_pushed,
            ["coordination.k8s.io/v1/leases"],
            "leases stay on the node"
        );
        assert!(c.intercept.enabled);
    }

    #[test]
    fn design_example_parses() {
        let text = r#"
nodeName: edge-1
poolName: pool-a
cloud:
  servers: ["https://10.0.0.10:6443"]
  caFile: /etc/kubernetes/pki/ca.crt
intercept:
  enabled: true
  cgroupPath: /sys/fs/cgroup
  hubAddress: 169.254.2.1
  vips: ["10.96.0.1:443"]
  bypassMark: 0x2a6
listen:
  proxy: 127.0.0.1:10261
  tlsProxy: 169.254.2.1:10268
  admin: 127.0.0.1:10267
cache:
  dir: /var/lib/hub
coordinator:
  endpoints: ["http://127.0.0.1:2379"]
  prefix: /registry
  poolScopeResources: ["/v1/services", "/v1/endpoints", "discovery.k8s.io/v1/endpointslices"]
"#;
        let c = check(text).unwrap();
        assert_eq!(c.intercept.bypass_mark, 0x2a6);
        assert_eq!(c.pool_name.as_deref(), Some("pool-a"));
    }

    #[test]
    fn a_plain_listener_off_loopback_must_be_meant() {
        let at = |addr: &str, meant: bool| {
            check(&format!(
                "{MINIMAL}listen:\n  proxy: {addr}\n  proxyGivesNodeIdentityToTheNetwork: {meant}\n"
            ))
        };
        let e = at("0.0.0.0:10261", false).unwrap_err().to_string();
        assert!(
            e.contains("listen.proxy") && e.contains("proxyGivesNodeIdentityToTheNetwork"),
            "{e}"
        );
        assert!(at("0.0.0.0:10261", true).is_ok());
        assert!(at("127.0.0.2:10261", false).is_ok());
    }

    #[test]
    fn unknown_key_names_its_path() {
        let e = check("nodeName: a\ncloud:\n  servrs: []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`cloud.servrs`"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            (
                "nodeName: Edge_1\ncloud: {servers: [\"https://a:1\"]}",
                "nodeName",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"ftp://a\"]}",
                "cloud.servers[0]",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\nintercept: {vips: [\"nope\"]}",
                "intercept.vips[0]",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\nlisten: {admin: \"x\"}",
                "listen.admin",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\nintercept: {bypassMark: \"zz\"}",
                "intercept.bypassMark",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\nintercept: {vips: [\"[::1]:443\"]}",
                "intercept.vips[0]",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\ncoordinator: {notPushed: [\"/v1/events\", \"leases\"]}",
                "coordinator.notPushed[1]",
            ),
            (
                "nodeName: a\ncloud: {servers: [\"https://a:1\"]}\ncoordinator: {poolScopeResources: [\"v1/services\"]}",
                "coordinator.poolScopeResources[0]",
            ),
        ];
        for (text, field) in cases {
            let e = check(text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{text:?} -> {e}");
        }
    }
}
