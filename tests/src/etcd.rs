//! Real etcd members (Debian's etcd-server) for coordinator tests: loopback ports (or an
//! address the test assigned in its own namespace), temp data dirs, a single member or a
//! 3-member cluster; members can be killed and restarted, the whole cluster wiped.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use crate::{TempDir, ports::free_port, process::Proc, unique, wait_for};

/// etcd request limits of the coordinator, as the shipped manifest sets them.
pub const MAX_TXN_OPS: usize = 20_000;
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// The files of a TLS member: its CA, its serving pair, and a client pair for etcdctl.
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server: (PathBuf, PathBuf),
    pub client: (PathBuf, PathBuf),
}

pub struct Member {
    pub name: String,
    pub client_url: String,
    host: String,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    proc: Option<Proc>,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    token: String,
    initial_cluster: String,
    /// Client TLS: https client URLs that require a certificate signed by the CA.
    tls: Option<TlsFiles>,
    /// Started as etcd starts without flags (--max-txn-ops 128, --max-request-bytes
    /// 1.5 MiB) instead of with the limits deploy/base/coordinator-etcd.yaml sets.
    default_limits: bool,
    _dir: TempDir,
    _keep: Vec<TempDir>,
}

/// GET /health on a member's client URL: true when it reports healthy.
fn healthy(host: &str, port: u16) -> bool {
    let Ok(addr) = format!("{host}:{port}").parse() else {
        return false;
    };
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    if tcp.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

impl EtcdCluster {
    /// Starts `size` members (1 or 3) and waits until every one reports healthy.
    pub fn start(size: usize) -> EtcdCluster {
        Self::start_with(size, None, "127.0.0.1")
    }

    /// Like `start`, each member with etcd's own default request limits (an etcd an
    /// operator already had, started without the coordinator's flags).
    pub fn start_default_limits(size: usize) -> EtcdCluster {
        let mut c = Self::start_with(size, None, "127.0.0.1");
        c.default_limits = true;
        for i in 0..size {
            c.kill_member(i);
            c.start_member(i);
        }
        for i in 0..size {
            c.wait_healthy(i);
        }
        c
    }

    /// Like `start`, listening on `host` (an address of the calling thread's namespace;
    /// the members run there too).
    pub fn start_on(size: usize, host: &str) -> EtcdCluster {
        Self::start_with(size, None, host)
    }

    /// One member whose clients must present a certificate signed by `ca`.
    pub fn start_tls(ca: &crate::apiserver::tls::TestCa) -> EtcdCluster {
        let dir = TempDir::new("etcdtls");
        let files = TlsFiles {
            ca: dir.path().join("ca.crt"),
            server: ca
                .server(&["127.0.0.1", "localhost"])
                .write(dir.path(), "etcd-server")
                .expect("etcd server cert"),
            client: ca
                .client("etcdctl", None)
                .write(dir.path(), "etcdctl")
                .expect("etcdctl cert"),
        };
        std::fs::write(&files.ca, ca.cert_pem()).expect("ca.crt");
        let mut c = Self::start_with(1, Some(files), "127.0.0.1");
        c._keep.push(dir);
        c
    }

    fn start_with(size: usize, tls: Option<TlsFiles>, host: &str) -> EtcdCluster {
        let dir = TempDir::new("etcd");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let token = unique("etcd");
        let mut members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                client_url: String::new(),
                host: host.to_string(),
                data: dir.path().join(format!("m{i}")),
                proc: None,
            })
            .collect();
        for m in &mut members {
            m.client_url = format!("{scheme}://{}:{}", m.host, m.client_port);
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, m.host, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            token,
            initial_cluster,
            tls,
            default_limits: false,
            _dir: dir,
            _keep: Vec::new(),
        };
        for i in 0..size {
            cluster.start_member(i);
        }
        for i in 0..size {
            cluster.wait_healthy(i);
        }
        cluster
    }

    /// (Re)starts member `i` with its existing data dir.
    pub fn start_member(&mut self, i: usize) {
        let m = &self.members[i];
        let state = if m.data.exists() { "existing" } else { "new" };
        let mut cmd = Command::new("etcd");
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.data.display()))
            .arg(format!("--listen-client-urls={}", m.client_url))
            .arg(format!("--advertise-client-urls={}", m.client_url))
            .arg(format!(
                "--listen-peer-urls=http://{}:{}",
                m.host, m.peer_port
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://{}:{}",
                m.host, m.peer_port
            ))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--initial-cluster-state={state}"));
        if !self.default_limits {
            // The limits deploy/base/coordinator-etcd.yaml sets (coordinator.maxTxnOps/maxRequestBytes).
            cmd.arg(format!("--max-txn-ops={MAX_TXN_OPS}"))
                .arg(format!("--max-request-bytes={MAX_REQUEST_BYTES}"));
        }
        if let Some(t) = &self.tls {
            cmd.arg("--client-cert-auth")
                .arg(format!("--trusted-ca-file={}", t.ca.display()))
                .arg(format!("--cert-file={}", t.server.0.display()))
                .arg(format!("--key-file={}", t.server.1.display()));
        }
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let p = Proc::spawn(cmd, &format!("etcd {}", m.name));
        self.members[i].proc = Some(p);
    }

    pub fn wait_healthy(&self, i: usize) {
        let (host, port) = (self.members[i].host.clone(), self.members[i].client_port);
        let url = self.members[i].client_url.clone();
        wait_for(
            &format!("etcd member {i} healthy"),
            Duration::from_secs(20),
            || match &self.tls {
                None => healthy(&host, port).then_some(()),
                // The member only talks to clients with a certificate: ask it as one.
                Some(_) => self
                    .etcdctl(std::slice::from_ref(&url), &["endpoint", "health"])
                    .ok()
                    .map(|_| ()),
            },
        );
    }

    /// SIGKILLs member `i` (its data dir stays, so it can be restarted).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill9();
        }
    }

    /// Destroys member `i`'s data and starts it afresh: a new, empty etcd (another cluster
    /// id) at the same address — a coordinator wiped and rebuilt.
    pub fn wipe_member(&mut self, i: usize) {
        self.kill_member(i);
        let _ = std::fs::remove_dir_all(&self.members[i].data);
        self.token = unique("etcd");
        self.start_member(i);
        self.wait_healthy(i);
    }

    /// Destroys every member's data and starts a new cluster at the same addresses (another
    /// cluster id, empty): a coordinator rebuilt from nothing.
    pub fn wipe_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
            let _ = std::fs::remove_dir_all(&self.members[i].data);
        }
        self.token = unique("etcd");
        for i in 0..self.members.len() {
            self.start_member(i);
        }
        for i in 0..self.members.len() {
            self.wait_healthy(i);
        }
    }

    /// The process ids of the running members (to freeze them, say).
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.proc.as_ref().map(|p| p.pid()))
            .collect()
    }

    /// The index of the member that leads the cluster now, as the members say.
    pub fn leader(&self) -> Option<usize> {
        let endpoints = self.endpoints();
        endpoints.iter().enumerate().find_map(|(i, ep)| {
            let out = self
                .etcdctl(
                    std::slice::from_ref(ep),
                    &["endpoint", "status", "-w", "json"],
                )
                .ok()?;
            let v: serde_json::Value = serde_json::from_str(&out).ok()?;
            let s = &v[0]["Status"];
            (s["leader"].as_u64().is_some() && s["leader"] == s["header"]["member_id"]).then_some(i)
        })
    }

    /// Client URLs of all members, for `coordinator.endpoints` or etcdctl.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Every key under `prefix` (empty when etcd cannot be asked).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.etcdctl(
            &self.endpoints(),
            &["get", prefix, "--prefix", "--keys-only"],
        )
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
    }

    /// Runs etcdctl (API v3) against the given endpoints and returns its stdout.
    pub fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg("--command-timeout=5s");
        if let Some(t) = &self.tls {
            cmd.arg(format!("--cacert={}", t.ca.display()))
                .arg(format!("--cert={}", t.client.0.display()))
                .arg(format!("--key={}", t.client.1.display()));
        }
        let out = cmd.args(args).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}
