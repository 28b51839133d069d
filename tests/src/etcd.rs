//! Real etcd members (Debian's etcd-server) for coordinator tests: loopback ports, temp
//! data dirs, a single member or a 3-member cluster; members can be killed and restarted.
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

pub struct Member {
    pub name: String,
    pub client_url: String,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    proc: Option<Proc>,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    token: String,
    initial_cluster: String,
    _dir: TempDir,
}

/// GET /health on a member's client URL: true when it reports healthy.
fn healthy(port: u16) -> bool {
    let Ok(mut tcp) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
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
        let dir = TempDir::new("etcd");
        let token = unique("etcd");
        let mut members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                client_url: String::new(),
                data: dir.path().join(format!("m{i}")),
                proc: None,
            })
            .collect();
        for m in &mut members {
            m.client_url = format!("http://127.0.0.1:{}", m.client_port);
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            token,
            initial_cluster,
            _dir: dir,
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
                "--listen-peer-urls=http://127.0.0.1:{}",
                m.peer_port
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                m.peer_port
            ))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--initial-cluster-state={state}"))
            // The limits deploy/coordinator-etcd.yaml sets (coordinator.maxTxnOps/maxRequestBytes).
            .arg(format!("--max-txn-ops={MAX_TXN_OPS}"))
            .arg(format!("--max-request-bytes={MAX_REQUEST_BYTES}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let p = Proc::spawn(cmd, &format!("etcd {}", m.name));
        self.members[i].proc = Some(p);
    }

    pub fn wait_healthy(&self, i: usize) {
        let port = self.members[i].client_port;
        wait_for(
            &format!("etcd member {i} healthy"),
            Duration::from_secs(20),
            || healthy(port).then_some(()),
        );
    }

    /// SIGKILLs member `i` (its data dir stays, so it can be restarted).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill9();
        }
    }

    /// Client URLs of all members, for `coordinator.endpoints` or etcdctl.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Runs etcdctl (API v3) against the given endpoints and returns its stdout.
    pub fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg("--command-timeout=5s")
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}
