//! A node's root file system laid out as a distribution lays it out, in a temporary
//! directory: the kubelet's kubeconfig, client certificate and CAs where kubeadm, k3s,
//! RKE2 and MicroShift put them, and a proc/self/mountinfo of a unified, hybrid or
//! containerised cgroup layout. For `hub run --check --node-root`.
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::{TempDir, apiserver::tls::TestCa};

/// How the node's cgroups are mounted.
#[derive(Debug, Clone, Copy)]
pub enum Cgroups {
    /// cgroup2 only, at /sys/fs/cgroup.
    Unified,
    /// cgroup v1 controllers on a tmpfs at /sys/fs/cgroup, cgroup2 at /sys/fs/cgroup/unified.
    Hybrid,
    /// In a container with a private cgroup namespace: the runtime's own cgroup2 mount,
    /// and the host's hierarchy mounted over it by the DaemonSet's hostPath.
    PrivateNamespace,
}

impl Cgroups {
    fn mountinfo(self) -> &'static str {
        match self {
            Cgroups::Unified => {
                "22 1 0:21 / /sys rw - sysfs sysfs rw\n25 22 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
            }
            Cgroups::Hybrid => {
                "22 1 0:21 / /sys rw - sysfs sysfs rw\n31 22 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n32 31 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n33 31 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
            }
            Cgroups::PrivateNamespace => {
                "600 590 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup ro\n601 600 0:26 /../../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
            }
        }
    }

    /// The directory the hub should attach to.
    pub fn expected(self) -> &'static str {
        match self {
            Cgroups::Unified | Cgroups::PrivateNamespace => "/sys/fs/cgroup",
            Cgroups::Hybrid => "/sys/fs/cgroup/unified",
        }
    }
}

/// A node's root: the files a distribution writes for its kubelet.
pub struct NodeRoot {
    dir: TempDir,
    /// Host paths of every file the layout wrote.
    pub files: Vec<PathBuf>,
}

pub const SERVER: &str = "https://127.0.0.1:6444";

impl NodeRoot {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&mut self, path: &str, bytes: &[u8]) {
        let at = self.dir.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, bytes).unwrap();
        self.files.push(path.into());
    }

    /// A node laid out as `layout` (kubeadm, k3s, rke2, microshift) lays it out, with
    /// certificates of `ca` for `node`.
    pub fn new(layout: &str, node: &str, cgroups: Cgroups) -> NodeRoot {
        let ca = TestCa::new("node-root-ca");
        let pki_dir = TempDir::new("node-root-pki");
        let pki = ca.write_hub_pki(pki_dir.path(), node, &[]).unwrap();
        let ca_pem = std::fs::read(&pki.ca).unwrap();
        let cert = std::fs::read(&pki.node.0).unwrap();
        let key = std::fs::read(&pki.node.1).unwrap();
        let mut root = NodeRoot {
            dir: TempDir::new("node-root"),
            files: Vec::new(),
        };
        // Read by the hub, not a file of the layout: not among `files`.
        let proc_self = root.dir.path().join("proc/self");
        std::fs::create_dir_all(&proc_self).unwrap();
        std::fs::write(proc_self.join("mountinfo"), cgroups.mountinfo()).unwrap();
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let kubeconfig = |cluster: &str, user: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {SERVER}\n{cluster}users:\n- name: node\n  user:\n{user}contexts:\n- name: local\n  context: {{cluster: local, user: node}}\ncurrent-context: local\n"
            )
        };
        match layout {
            "kubeadm" => {
                // kubelet.conf embeds the CA and names the rotating client certificate:
                // one dated file holding both, and an absolute -current.pem link to it.
                let dated = "/var/lib/kubelet/pki/kubelet-client-2026-12-06-10-00-00.pem";
                root.write(dated, &[cert.as_slice(), key.as_slice()].concat());
                let link = root
                    .dir
                    .path()
                    .join("var/lib/kubelet/pki/kubelet-client-current.pem");
                std::os::unix::fs::symlink(dated, &link).unwrap();
                root.files
                    .push("/var/lib/kubelet/pki/kubelet-client-current.pem".into());
                let current = "/var/lib/kubelet/pki/kubelet-client-current.pem";
                root.write(
                    "/etc/kubernetes/kubelet.conf",
                    kubeconfig(
                        &format!("    certificate-authority-data: {}\n", b64(&ca_pem)),
                        &format!("    client-certificate: {current}\n    client-key: {current}\n"),
                    )
                    .as_bytes(),
                );
                root.write("/etc/kubernetes/pki/ca.crt", &ca_pem);
            }
            "k3s" | "rke2" => {
                let agent = format!("/var/lib/rancher/{layout}/agent");
                root.write(&format!("{agent}/client-kubelet.crt"), &cert);
                root.write(&format!("{agent}/client-kubelet.key"), &key);
                root.write(&format!("{agent}/server-ca.crt"), &ca_pem);
                root.write(&format!("{agent}/client-ca.crt"), &ca_pem);
                let files = |user: &str| {
                    kubeconfig(
                        &format!("    certificate-authority: {agent}/server-ca.crt\n"),
                        &format!(
                            "    client-certificate: {agent}/client-{user}.crt\n    client-key: {agent}/client-{user}.key\n"
                        ),
                    )
                };
                root.write(
                    &format!("{agent}/kubelet.kubeconfig"),
                    files("kubelet").as_bytes(),
                );
                root.write(&format!("{agent}/client-kube-proxy.crt"), &cert);
                root.write(&format!("{agent}/client-kube-proxy.key"), &key);
                root.write(
                    &format!("{agent}/kubeproxy.kubeconfig"),
                    files("kube-proxy").as_bytes(),
                );
            }
            "microshift" => {
                root.write(
                    "/var/lib/microshift/resources/kubelet/kubeconfig",
                    kubeconfig(
                        &format!("    certificate-authority-data: {}\n", b64(&ca_pem)),
                        &format!(
                            "    client-certificate-data: {}\n    client-key-data: {}\n",
                            b64(&cert),
                            b64(&key)
                        ),
                    )
                    .as_bytes(),
                );
                root.write("/var/lib/microshift/certs/ca-bundle/client-ca.crt", &ca_pem);
            }
            other => panic!("no layout {other}"),
        }
        root
    }
}
