//! What the soak runs: the cloud (a stand-in process behind a relay the soak can take
//! down), the pool's coordinator (three etcd members), two hubs of one pool (node-0's
//! cache on a small tmpfs the soak can fill) — and the handles to hurt each of them.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use hub_tests::{
    TempDir,
    apiserver::{ADMIN_TOKEN, client::Client, tls::Identity},
    bin_dir,
    etcd::EtcdCluster,
    hub_bin,
    ports::free_port,
    process::Proc,
};
use serde_json::Value;

use crate::relay::Relay;

pub const NODES: [&str; 2] = ["node-0", "node-1"];
/// Pods the cloud starts with, per node.
const PODS_PER_NODE: usize = 30;

pub struct World {
    pub cloud: Proc,
    pub cloud_addr: SocketAddr,
    pub relay: Relay,
    pub etcd: EtcdCluster,
    pub hubs: Vec<Hub>,
    /// node-0's cache directory: a tmpfs mount of its own, so it can be filled.
    pub disk: Tmpfs,
    pub ca: rustls::pki_types::CertificateDer<'static>,
    pub dir: TempDir,
}

impl World {
    pub fn start() -> Result<World> {
        let dir = TempDir::new("soak");
        let cloud_port = free_port();
        let mut cmd = Command::new(bin_dir().join("hub-apiserver"));
        cmd.args(["--listen", &format!("127.0.0.1:{cloud_port}")])
            .args([
                "--nodes",
                "2",
                "--pods-per-node",
                &PODS_PER_NODE.to_string(),
            ])
            .args(["--services", "4", "--configmaps", "4"])
            .args(["--hub-pki", NODES[0], "--hub-pki", NODES[1]])
            .arg("--dir")
            .arg(dir.path());
        let cloud = Proc::spawn_until_line(cmd, "hub-apiserver", "ready", Duration::from_secs(60));
        let cloud_addr = SocketAddr::from(([127, 0, 0, 1], cloud_port));
        let relay = Relay::start(free_port(), cloud_addr)?;
        let etcd = EtcdCluster::start(3);
        let disk = Tmpfs::mount(&dir.path().join("node-0-cache"), 64)?;
        let ca = {
            use rustls::pki_types::pem::PemObject;
            rustls::pki_types::CertificateDer::from_pem_file(dir.path().join("ca.crt"))
                .context("the stand-in's CA")?
        };
        let mut world = World {
            cloud,
            cloud_addr,
            relay,
            etcd,
            hubs: Vec::new(),
            disk,
            ca,
            dir,
        };
        for node in NODES {
            let cache = match node {
                "node-0" => world.disk.path.clone(),
                _ => world.dir.path().join(format!("{node}-cache")),
            };
            let hub = Hub::new(&world, node, &cache)?;
            world.hubs.push(hub);
        }
        for hub in &mut world.hubs {
            hub.start()?;
        }
        seed_leases(&world.admin())?;
        Ok(world)
    }

    /// A client of the cloud itself (not through the relay), as the cluster's admin.
    pub fn admin(&self) -> Client {
        Client::new(self.cloud_addr, self.ca.clone(), Some(ADMIN_TOKEN), None)
    }

    /// A kubelet-style client of `hub` (the node's client certificate).
    pub fn kubelet(&self, hub: &Hub) -> Result<Client> {
        let pki = self.dir.path().join(&hub.node);
        let id = Identity::read(&pki.join("kubelet.crt"), &pki.join("kubelet.key"))?;
        Ok(Client::new(hub.tls, self.ca.clone(), None, Some(&id)))
    }

    /// A client of `hub` with a pod's service-account token (what kubectl in a pod sends).
    pub fn pod_client(&self, hub: &Hub) -> Client {
        Client::new(hub.tls, self.ca.clone(), Some("pod-token"), None)
    }

    /// SIGSTOP or SIGCONT the cloud's process.
    pub fn freeze_cloud(&self, frozen: bool) {
        signal(
            self.cloud.pid(),
            if frozen { libc::SIGSTOP } else { libc::SIGCONT },
        );
    }

    /// Sets the stand-in's fault knobs (`PUT /_standin/faults`).
    pub fn cloud_faults(&self, latency_ms: u64, error_permille: u32) -> Result<()> {
        let body = serde_json::json!({"latencyMs": latency_ms, "errorPermille": error_permille});
        let r = self.admin().send_json("PUT", "/_standin/faults", &body);
        if r.status != 200 {
            bail!("setting the cloud's faults: {}", r.status);
        }
        Ok(())
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: a plain kill(2) of a process this soak started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Every node renews a lease in kube-node-lease; the cloud starts with one for each.
fn seed_leases(admin: &Client) -> Result<()> {
    for node in NODES {
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease", "annotations": {"soak/seq": "0"}},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40}
        });
        let r = admin.send_json(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &lease,
        );
        if r.status != 201 {
            bail!(
                "creating {node}'s lease: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
    }
    Ok(())
}

/// One hub of the pool: its config, its process (None while killed), its addresses.
pub struct Hub {
    pub node: String,
    pub tls: SocketAddr,
    pub admin: String,
    config: PathBuf,
    log: PathBuf,
    pub proc: Option<Proc>,
}

impl Hub {
    fn new(world: &World, node: &str, cache: &Path) -> Result<Hub> {
        let pki = world.dir.path().join(node);
        let p = |f: &str| pki.join(f).display().to_string();
        let (tls_port, admin_port, plain_port) = (free_port(), free_port(), free_port());
        let endpoints: Vec<String> = world
            .etcd
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        let admin = format!("127.0.0.1:{admin_port}");
        let yaml = format!(
            "nodeName: {node}\npoolName: soak\ncloud:\n  servers: [\"https://{}\"]\n  caFile: {}\n  certFile: {}\n  keyFile: {}\nintercept:\n  enabled: false\nlisten:\n  proxy: 127.0.0.1:{plain_port}\n  tlsProxy: 127.0.0.1:{tls_port}\n  admin: {admin}\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\ncache:\n  dir: {}\ncoordinator:\n  endpoints: [{}]\n  gcIntervalSeconds: 1\n  nodeGraceSeconds: 30\n  leaderLeaseSeconds: 3\n",
            world.relay.addr,
            p("ca.crt"),
            p("hub-node.crt"),
            p("hub-node.key"),
            p("hub-serving.crt"),
            p("hub-serving.key"),
            p("ca.crt"),
            cache.display(),
            endpoints.join(", ")
        );
        let config = world.dir.path().join(format!("{node}.yaml"));
        std::fs::write(&config, yaml)?;
        Ok(Hub {
            node: node.to_string(),
            tls: SocketAddr::from(([127, 0, 0, 1], tls_port)),
            admin,
            config,
            log: world.dir.path().join(format!("{node}.log")),
            proc: None,
        })
    }

    /// Starts the hub (its log appended to) and waits until it says it is ready.
    pub fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(hub_bin());
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stderr(log);
        self.proc = Some(Proc::spawn(cmd, &format!("hub of {}", self.node)));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.status().is_some_and(|s| s["ready"] == true) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "the hub of {} was not ready within 30 s; log: {}",
            self.node,
            self.log.display()
        )
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// `/v1/status` from the admin port (None while it does not answer).
    pub fn status(&self) -> Option<Value> {
        serde_json::from_slice(&admin_get(&self.admin, "/v1/status")?).ok()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// A GET on an admin port, as text.
pub fn admin_text(addr: &str, path: &str) -> Option<String> {
    admin_get(addr, path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A GET on an admin port: the body of a 200 answer, within 2 s.
fn admin_get(addr: &str, path: &str) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    let addr: SocketAddr = addr.parse().ok()?;
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    let body = &raw[split + 4..];
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some(hub_tests::apiserver::client::dechunk(body));
    }
    Some(body.to_vec())
}

/// A small tmpfs mounted for the soak, unmounted when dropped.
pub struct Tmpfs {
    pub path: PathBuf,
    filler: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, mib: u64) -> Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .status()?;
        if !status.success() {
            bail!(
                "mount tmpfs on {} failed (the soak runs as root)",
                path.display()
            );
        }
        Ok(Tmpfs {
            filler: path.join("filler"),
            path: path.to_path_buf(),
        })
    }

    /// Fills the disk to its last byte.
    pub fn fill(&self) -> Result<u64> {
        use std::io::Write;
        let mut f = std::fs::File::create(&self.filler)?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        // Bounded: the tmpfs is a few tens of MiB.
        for _ in 0..100_000 {
            match f.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n as u64,
            }
        }
        let _ = f.flush();
        Ok(written)
    }

    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
