//! Pod networks as a container runtime makes them: Debian's CNI `bridge` plugin with
//! `host-local` addresses, run inside a node namespace the test created (the bridge and
//! its gateway live there, never on the machine), each pod in a namespace of its own.
//! host-local hands out the next free address, so a pod whose network is torn down and
//! made again (a reboot) comes back on a new IP, as on a real node.
use std::{
    io::Write,
    process::{Command, Stdio},
};

use serde_json::{Value, json};

use crate::{TempDir, netns::Netns, privileged::CNI_PLUGINS};

pub struct Bridge {
    /// The node's network: the bridge and its gateway address.
    pub node: Netns,
    conf: String,
    _dir: TempDir,
}

/// One pod's network: its namespace and the IP the plugin gave it.
pub struct PodNet {
    pub netns: Netns,
    pub ip: String,
}

impl PodNet {
    pub fn path(&self) -> std::path::PathBuf {
        format!("/run/netns/{}", self.netns.name()).into()
    }
}

impl Bridge {
    /// A bridge for pods on `subnet` (an address range the test owns, e.g. link-local).
    pub fn new(subnet: &str) -> Bridge {
        let dir = TempDir::new("cni");
        let node = Netns::new("cnode");
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "hub-test",
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                "dataDir": dir.path().join("ipam")},
        })
        .to_string();
        Bridge {
            node,
            conf,
            _dir: dir,
        }
    }

    /// Runs the bridge plugin for `id` in the node namespace; its JSON answer.
    fn plugin(&self, command: &str, id: &str, pod_ns: &str) -> Value {
        let mut c: Command = self.node.command(format!("{CNI_PLUGINS}/bridge"));
        c.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", format!("/run/netns/{pod_ns}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", CNI_PLUGINS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run the CNI bridge plugin");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.conf.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "CNI {command} {id}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// A pod's network, as the runtime makes it when the pod (re)starts.
    pub fn add(&self, id: &str) -> PodNet {
        let netns = Netns::new("cpod");
        let answer = self.plugin("ADD", id, netns.name());
        let cidr = answer["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("CNI ADD {id}: no address in {answer}"));
        let ip = cidr.split('/').next().unwrap().to_string();
        PodNet { netns, ip }
    }

    /// Tears a pod's network down, as the runtime does when the pod goes.
    pub fn del(&self, id: &str, pod: PodNet) {
        self.plugin("DEL", id, pod.netns.name());
    }
}
