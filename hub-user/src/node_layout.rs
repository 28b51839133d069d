//! Where the node keeps what the hub needs, by distribution: the kubelet's kubeconfig (its
//! cloud servers, CA and client certificate), the CA its clients' certificates chain to,
//! kube-proxy's kubeconfig where the distribution writes one, and the cgroup2 hierarchy.
//! What the configuration leaves unset is found here once, at start.
use std::path::{Path, PathBuf};

use crate::{config::Config, intercept::cgroup2, upstream::identity};

/// Where one distribution puts the kubelet's credentials (paths on the host).
pub struct Layout {
    pub name: &'static str,
    pub kubelet_kubeconfig: &'static str,
    /// kube-proxy's own kubeconfig, when the distribution runs it outside a pod.
    pub kube_proxy_kubeconfig: Option<&'static str>,
    /// The CA the kubelet's client certificate chains to (`tls.clientCaFile`).
    pub client_ca: &'static str,
}

/// In the order they are looked for. k3s and RKE2 share an agent layout under their own
/// data directory; their kubelets reach the cloud through the agent's local load balancer
/// (the kubeconfig's `server:`), which the hub then uses too. MicroShift embeds the
/// certificates in the kubeconfig.
pub const LAYOUTS: [Layout; 4] = [
    Layout {
        name: "kubeadm",
        kubelet_kubeconfig: "/etc/kubernetes/kubelet.conf",
        kube_proxy_kubeconfig: None,
        client_ca: "/etc/kubernetes/pki/ca.crt",
    },
    Layout {
        name: "k3s",
        kubelet_kubeconfig: "/var/lib/rancher/k3s/agent/kubelet.kubeconfig",
        kube_proxy_kubeconfig: Some("/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig"),
        client_ca: "/var/lib/rancher/k3s/agent/client-ca.crt",
    },
    Layout {
        name: "rke2",
        kubelet_kubeconfig: "/var/lib/rancher/rke2/agent/kubelet.kubeconfig",
        kube_proxy_kubeconfig: Some("/var/lib/rancher/rke2/agent/kubeproxy.kubeconfig"),
        client_ca: "/var/lib/rancher/rke2/agent/client-ca.crt",
    },
    Layout {
        name: "microshift",
        kubelet_kubeconfig: "/var/lib/microshift/resources/kubelet/kubeconfig",
        kube_proxy_kubeconfig: None,
        client_ca: "/var/lib/microshift/certs/ca-bundle/client-ca.crt",
    },
];

/// `path`, absolute as on the host, under `root` (`/`, or a fake node's root); a relative
/// path is left as it is.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix("/") {
        Ok(inside) if root != Path::new("/") => root.join(inside),
        _ => path.to_path_buf(),
    }
}

/// Reads `path` of the node whose root is `root`, following symbolic links as the node
/// would: an absolute target (a kubelet's `kubelet-client-current.pem`) is under `root` too.
pub fn read_under(root: &Path, path: &Path) -> std::io::Result<Vec<u8>> {
    let mut at = path.to_path_buf();
    for _ in 0..8 {
        let here = under(root, &at);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&here)?;
                at = at.parent().unwrap_or(Path::new("/")).join(target);
            }
            _ => return std::fs::read(here),
        }
    }
    Err(std::io::Error::other(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// What was found, for the log, `hub status` and `hub run --check`.
#[derive(Debug, Default, Clone)]
pub struct Resolved {
    /// One line per thing found, with where and why; the first names the layout
    /// (`kubeadm`, `k3s`, `rke2`, `microshift`, or `configured`).
    pub found: Vec<String>,
}

/// Fills in what `config` leaves unset from the node as laid out under `root`: the cloud
/// kubeconfig, the client CA, the kubeconfigs whose servers are intercepted, the cgroup2
/// hierarchy. An error says what was looked for.
pub fn resolve(config: &mut Config, root: &Path) -> Result<Resolved, String> {
    let mut out = Resolved::default();
    let layout = match (&config.cloud.kubeconfig, config.cloud.servers.is_empty()) {
        (Some(k), _) => {
            let known = LAYOUTS
                .iter()
                .find(|l| Path::new(l.kubelet_kubeconfig) == k);
            out.found.push(format!(
                "node layout: {} (cloud.kubeconfig {} configured)",
                known.map_or("configured", |l| l.name),
                k.display()
            ));
            known
        }
        (None, false) => {
            out.found
                .push("node layout: not looked for (cloud.servers configured)".into());
            None
        }
        (None, true) => {
            let Some(l) = LAYOUTS
                .iter()
                .find(|l| under(root, Path::new(l.kubelet_kubeconfig)).is_file())
            else {
                let tried: Vec<&str> = LAYOUTS.iter().map(|l| l.kubelet_kubeconfig).collect();
                return Err(format!(
                    "no kubelet kubeconfig found (looked for {}); set cloud.kubeconfig, or \
                     cloud.servers with cloud.certFile/keyFile",
                    tried.join(", ")
                ));
            };
            out.found.push(format!(
                "node layout: {} (found the kubelet kubeconfig {})",
                l.name, l.kubelet_kubeconfig
            ));
            config.cloud.kubeconfig = Some(l.kubelet_kubeconfig.into());
            Some(l)
        }
    };
    if let Some(l) = layout {
        if config.tls.client_ca_file.is_none() && under(root, Path::new(l.client_ca)).is_file() {
            config.tls.client_ca_file = Some(l.client_ca.into());
            out.found
                .push(format!("client CA ({}): {}", l.name, l.client_ca));
        }
        if config.intercept.enabled && config.intercept.kubeconfigs.is_empty() {
            config
                .intercept
                .kubeconfigs
                .push(l.kubelet_kubeconfig.into());
            if let Some(kp) = l
                .kube_proxy_kubeconfig
                .filter(|kp| under(root, Path::new(kp)).is_file())
            {
                config.intercept.kubeconfigs.push(kp.into());
            }
            let names: Vec<String> = config
                .intercept
                .kubeconfigs
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            out.found
                .push(format!("intercepted: the servers of {}", names.join(", ")));
        }
    }
    if config.intercept.enabled && config.intercept.cgroup_path.is_none() {
        let mountinfo = under(root, Path::new("/proc/self/mountinfo"));
        let text = std::fs::read_to_string(&mountinfo)
            .map_err(|e| format!("reading {}: {e}", mountinfo.display()))?;
        let found = cgroup2::find(&text)?;
        out.found.push(format!(
            "cgroup2 hierarchy: {} ({})",
            found.path.display(),
            found.why
        ));
        config.intercept.cgroup_path = Some(found.path);
    }
    Ok(out)
}

/// What `hub run --check` verifies beyond the configuration's own rules: that the files it
/// names under `root` exist and hold what the hub will read from them. One line per problem.
pub fn check_files(config: &Config, root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let read = |p: &Path| read_under(root, p).map_err(|e| format!("{}: {e}", p.display()));
    if let Some(k) = &config.cloud.kubeconfig {
        match identity::read_kubeconfig_under(root, k) {
            Err(e) => problems.push(format!("cloud.kubeconfig: {e}")),
            Ok(parts) => {
                if parts.server.is_none() && config.cloud.servers.is_empty() {
                    problems.push(format!("{}: no cluster server", k.display()));
                }
                if parts.ca_pem.is_none() && config.cloud.ca_file.is_none() {
                    problems.push(format!("{}: no certificate-authority", k.display()));
                }
                match (&parts.cert_pem, &parts.key_pem) {
                    (Some(c), Some(key)) => {
                        if let Err(e) = identity::identity_from_pem(c, key, "client certificate") {
                            problems.push(format!("{}: {e}", k.display()));
                        }
                    }
                    _ if config.cloud.cert_file.is_some() => {}
                    _ => problems.push(format!(
                        "{}: no client certificate and key (the node identity)",
                        k.display()
                    )),
                }
            }
        }
    }
    for (field, path) in [
        ("cloud.caFile", &config.cloud.ca_file),
        ("cloud.certFile", &config.cloud.cert_file),
        ("cloud.keyFile", &config.cloud.key_file),
        ("tls.clientCaFile", &config.tls.client_ca_file),
    ] {
        if let Some(p) = path
            && let Err(e) = read(p)
        {
            problems.push(format!("{field}: {e}"));
        }
    }
    for k in &config.intercept.kubeconfigs {
        if let Err(e) = read(k) {
            problems.push(format!("intercept.kubeconfigs: {e}"));
        }
    }
    problems
}
