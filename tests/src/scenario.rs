//! A node scenario for integration tests: the API stand-in as the cloud and one hub on
//! loopback in front of it, with the node's PKI, a kubelet-style client and the cache
//! directory kept across hub restarts.
use std::{net::SocketAddr, path::PathBuf, process::Command, sync::Arc, time::Duration};

use serde_json::Value;

use crate::{
    TempDir,
    apiserver::{
        Credentials, Options, StandIn,
        client::{Client, Reply},
        tls::{HubPki, TestCa},
        write_kubeconfig,
    },
    hub::{HubProc, LOOPBACK_NODE, LoopbackHub},
    hub_bin,
    ports::free_port,
    wait_for,
};

/// A second credential the cloud allows everything, which never reads the secret online.
pub const OTHER_TOKEN: &str = "other-admin-token";

/// One node's hub on loopback in front of the API stand-in (TLS, the node's kubelet
/// certificate, a cache directory kept across hub restarts).
pub struct Setup {
    pub cloud: StandIn,
    pub pki: HubPki,
    pub ca: Arc<TestCa>,
    pub tls: u16,
    pub admin: String,
    pub components: String,
    /// More lines for the hub config's `cache:` section (two-space indented).
    pub cache_extra: String,
    /// Survives hub restarts: the cache lives here.
    pub state: PathBuf,
    pub dir: TempDir,
}

impl Setup {
    pub fn new(components: &[&str]) -> Setup {
        Self::with_options(components, Options::default())
    }

    /// [`Setup::new`] with a cloud started with `options`.
    pub fn with_options(components: &[&str], options: Options) -> Setup {
        let ca = Arc::new(TestCa::new("cloud-ca"));
        let cloud =
            StandIn::start_with_ca("127.0.0.1:0".parse().unwrap(), options, ca.clone()).unwrap();
        {
            let mut auth = cloud.state.auth.write().unwrap();
            auth.add_test_identities();
            auth.add_token(OTHER_TOKEN, "other-admin", &["system:masters"]);
        }
        let dir = TempDir::new("cache");
        let pki = ca.write_hub_pki(dir.path(), LOOPBACK_NODE, &[]).unwrap();
        let state = dir.path().join("state");
        Setup {
            cloud,
            pki,
            ca,
            tls: free_port(),
            admin: format!("127.0.0.1:{}", free_port()),
            components: components.join(", "),
            cache_extra: String::new(),
            state,
            dir,
        }
    }

    pub fn start_hub(&self) -> HubProc {
        let config = LoopbackHub {
            servers: vec![self.cloud.url()],
            ca: Some(&self.pki.ca),
            node: Some(&self.pki.node),
            serving: Some((&self.pki.serving.0, &self.pki.serving.1)),
            client_ca: Some(&self.pki.ca),
            plain: free_port(),
            tls: Some(self.tls),
            admin: self.admin.clone(),
            extra: format!("  components: [{}]\n{}", self.components, self.cache_extra),
        };
        HubProc::start_yaml(None, &self.admin, None, |_, _| config.yaml(&self.state))
    }

    pub fn hub_addr(&self) -> SocketAddr {
        format!("127.0.0.1:{}", self.tls).parse().unwrap()
    }

    pub fn kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        write_kubeconfig(
            &p,
            &format!("https://127.0.0.1:{}", self.tls),
            &self.ca.cert_pem(),
            Credentials::Token(token),
        )
        .unwrap();
        p
    }

    /// A kubelet-style client: the node's client certificate, kubelet's User-Agent.
    pub fn kubelet(&self) -> Client {
        Client::new(
            self.hub_addr(),
            self.ca.cert_der(),
            None,
            Some(&self.pki.kubelet),
        )
    }

    /// The kubelet (`user_agent`) lists its node's pods in protobuf, as it does: what the
    /// cache then holds for it.
    pub fn kubelet_lists_its_pods(&self, kubelet: &Client, user_agent: &str) -> Reply {
        let pods = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{LOOPBACK_NODE}");
        let accept = "application/vnd.kubernetes.protobuf,application/json";
        let listed = kubelet
            .request(
                "GET",
                &pods,
                &[("User-Agent", user_agent), ("Accept", accept)],
                &[],
            )
            .unwrap();
        assert_eq!(
            listed.status,
            200,
            "{}",
            String::from_utf8_lossy(&listed.body)
        );
        assert!(listed.header("content-type").unwrap().contains("protobuf"));
        listed
    }

    /// `hub cache ls` through the real CLI (its inspection socket while the hub runs, the file when
    /// it does not).
    pub fn cache_ls(&self, component: &str) -> Vec<Value> {
        let out = Command::new(hub_bin())
            .args(["cache", "ls", "--output", "json", "--component", component])
            .arg("--dir")
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "hub cache ls: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn wait_cached(&self, component: &str, what: &str, check: impl Fn(&[Value]) -> bool) {
        wait_for(what, Duration::from_secs(20), || {
            check(&self.cache_ls(component)).then_some(())
        });
    }

    pub fn cloud_down(&self, hub: &HubProc) {
        self.cloud.stop_listening();
        wait_for(
            "the hub to see the cloud down",
            Duration::from_secs(5),
            || (hub.status()["cloud"][0]["healthy"] == false).then_some(()),
        );
    }
}
