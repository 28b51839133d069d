//! Finding the apiserver addresses to intercept beyond `intercept.vips`: the `server:` of
//! the kubeconfigs the hub is given, and the `kubernetes` Service ClusterIP when the hub
//! runs in a pod (KUBERNETES_SERVICE_HOST/PORT, which kubelet sets for every pod).
use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::Path,
};

use crate::upstream::ServerUrl;

/// The addresses a kubeconfig's clusters point at (hostnames resolved now).
pub fn kubeconfig_servers(path: &Path) -> Result<Vec<SocketAddr>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let clusters = doc
        .get("clusters")
        .and_then(|c| c.as_sequence())
        .cloned()
        .unwrap_or_default();
    for cluster in clusters {
        let Some(server) = cluster
            .get("cluster")
            .and_then(|c| c.get("server"))
            .and_then(|s| s.as_str())
        else {
            continue;
        };
        let url = ServerUrl::parse(server).map_err(|e| format!("{}: {e}", path.display()))?;
        let addrs = url
            .authority()
            .to_socket_addrs()
            .map_err(|e| format!("{}: cannot resolve {server}: {e}", path.display()))?;
        out.extend(addrs);
    }
    Ok(out)
}

/// The in-cluster `kubernetes` Service address, if the environment names it.
pub fn service_from_env() -> Option<SocketAddr> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?;
    let ip = host.parse().ok()?;
    Some(SocketAddr::new(ip, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_servers_from_kubeconfig() {
        let dir = crate::files::fresh_test_dir("kc");
        let kc = dir.join("kubelet.conf");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://127.0.0.9:6443\n- name: b\n  cluster:\n    server: https://[::1]:7443\n",
        )
        .unwrap();
        let got = kubeconfig_servers(&kc).unwrap();
        assert_eq!(
            got,
            vec![
                "127.0.0.9:6443".parse().unwrap(),
                "[::1]:7443".parse().unwrap()
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
