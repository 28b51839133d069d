//! A node pool on one machine: a "cloud" namespace holding the API stand-in and the
//! coordinator's etcd on addresses of its own, and one namespace per node, each joined to
//! the cloud namespace by its own veth pair — every hub reaches the cloud and the
//! coordinator over its own link, as edge nodes do, and a node can be cut off.
//! Every address is one the test assigns inside namespaces it created (169.254.0.0/16).
use crate::netns::Netns;

/// The cloud apiserver's address (on the cloud namespace's loopback).
pub const CLOUD_IP: &str = "169.254.20.1";
/// The coordinator's etcd members listen here (one address, a port each).
pub const ETCD_IP: &str = "169.254.20.11";

pub struct PoolNet {
    pub cloud: Netns,
    pub nodes: Vec<Netns>,
}

impl PoolNet {
    pub fn new(nodes: usize) -> PoolNet {
        let cloud = Netns::new("pc");
        cloud.add_local_address(&format!("{CLOUD_IP}/32"));
        cloud.add_local_address(&format!("{ETCD_IP}/32"));
        let nodes = (0..nodes)
            .map(|i| {
                let node = Netns::new("pn");
                let (cloud_side, node_side) = Self::link_ips(i);
                node.veth_to(
                    &cloud,
                    ("uplink", &format!("{node_side}/30")),
                    (&format!("node{i}"), &format!("{cloud_side}/30")),
                );
                node.ip(&["route", "add", "169.254.20.0/24", "via", &cloud_side]);
                node
            })
            .collect();
        PoolNet { cloud, nodes }
    }

    /// (cloud side, node side) of node `i`'s link.
    fn link_ips(i: usize) -> (String, String) {
        assert!(i < 60, "at most 60 nodes");
        (
            format!("169.254.40.{}", 4 * i + 1),
            format!("169.254.40.{}", 4 * i + 2),
        )
    }

    /// Node `i`'s address on its link (reachable from the cloud namespace).
    pub fn node_ip(i: usize) -> String {
        Self::link_ips(i).1
    }

    /// Cuts node `i` off from the cloud and the coordinator (its route to them goes), or
    /// reconnects it. The link itself stays, so the test still reaches the node's hub.
    pub fn set_reachable(&self, i: usize, reachable: bool) {
        let (cloud_side, _) = Self::link_ips(i);
        let verb = if reachable { "replace" } else { "del" };
        self.nodes[i].ip(&["route", verb, "169.254.20.0/24", "via", &cloud_side]);
    }
}
