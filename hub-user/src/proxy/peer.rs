//! Who is on the other end of a connection to one of the hub's own ports. Only root
//! outside the pods' cgroups may speak as the node on the plain listener, and a pod
//! reaches the hub only through the apiserver VIP (its connection then carries the
//! origin the eBPF programs recorded). The other end of a local connection is found with
//! the kernel's socket diagnostics: its owner's uid and the cgroup it was opened from.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use crate::intercept::{cgroup_tree::cgroup_tree, sock_diag};

/// Where the pods' cgroups are: the configured root, or kubelet's pod cgroup found at,
/// below or above the programs' cgroup (`intercept::scope::pod_roots`).
#[derive(Debug, Clone)]
pub struct PodCgroups {
    roots: Vec<PathBuf>,
}

impl PodCgroups {
    pub fn new(configured: Option<&Path>, cgroup_path: &Path) -> PodCgroups {
        PodCgroups {
            roots: crate::intercept::scope::pod_roots(configured, cgroup_path),
        }
    }

    /// The pod cgroups that exist now (for the start-up log).
    pub fn present(&self) -> Vec<&Path> {
        self.roots
            .iter()
            .filter(|r| r.is_dir())
            .map(PathBuf::as_path)
            .collect()
    }

    /// Whether the cgroup with this id (cgroup v2: its directory's inode) is a pod's:
    /// a root above or one below it. Walked on each call, as pods come and go.
    pub fn contains(&self, cgroup_id: u64) -> bool {
        self.roots
            .iter()
            .any(|root| cgroup_tree(root).iter().any(|(_, id)| *id == cgroup_id))
    }
}

/// The other end of an accepted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A process of the node's own, outside the pods' cgroups.
    Host { uid: u32 },
    /// A process in a pod's cgroup (hostNetwork pods share the node's network, not its
    /// cgroups).
    Pod,
    /// Not a socket of the hub's network namespace: another machine, or a pod with its
    /// own network.
    Elsewhere,
}

impl Peer {
    /// Looks up the socket at `peer` connected to the hub's `local` address.
    pub fn of(local: SocketAddr, peer: SocketAddr, pods: &PodCgroups) -> Peer {
        match sock_diag::lookup(peer, local) {
            Ok(Some(s)) if pods.contains(s.cgroup_id) => Peer::Pod,
            Ok(Some(s)) => Peer::Host { uid: s.uid },
            Ok(None) => Peer::Elsewhere,
            Err(e) => {
                tracing::warn!(%peer, "cannot tell who is calling (sock_diag: {e}); treating it as not local");
                Peer::Elsewhere
            }
        }
    }

    /// Root on the node itself: the only caller the plain listener speaks for as the node.
    pub fn is_node_root(self) -> bool {
        self == Peer::Host { uid: 0 }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Host { uid } => write!(f, "uid {uid} on the node"),
            Peer::Pod => f.write_str("a process in a pod's cgroup"),
            Peer::Elsewhere => f.write_str("a client outside the node's network namespace"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_is_a_pods_when_it_is_under_a_pods_root() {
        use std::os::unix::fs::MetadataExt;
        let dir = crate::files::fresh_test_dir("peer");
        let pod = dir.join("kubepods.slice/pod-a/container");
        std::fs::create_dir_all(&pod).unwrap();
        std::fs::create_dir_all(dir.join("system.slice")).unwrap();
        let id = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let pods = PodCgroups::new(None, &dir);
        assert!(pods.contains(id(&pod)));
        assert!(pods.contains(id(&dir.join("kubepods.slice"))));
        assert!(!pods.contains(id(&dir.join("system.slice"))));
        assert!(!pods.contains(id(&dir)));
        let configured = PodCgroups::new(Some(&dir.join("system.slice")), &dir);
        assert!(!configured.contains(id(&pod)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
