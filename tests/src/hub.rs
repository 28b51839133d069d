//! A `hub run` process in a test namespace, with its config, log and status helpers.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    TempDir, hub_bin,
    netns::Netns,
    process::{self, Proc, in_cgroup},
};

pub struct HubProc {
    pub proc: Proc,
    pub admin: String,
    /// The namespace it runs in (None: the test's own).
    ns: Option<crate::netns::NsHandle>,
    pub pin_path: PathBuf,
    log: PathBuf,
    /// Config, log and cache; removed with the hub.
    _dir: TempDir,
}

/// What a test varies in the hub's config; the rest is written by `config_yaml`.
pub struct HubSpec<'a> {
    pub cloud: &'a [&'a str],
    pub vips: &'a [&'a str],
    pub hub_address: &'a str,
    pub hub_address6: Option<&'a str>,
    pub cgroup: &'a Path,
    pub admin: &'a str,
}

fn in_ns(ns: Option<&Netns>, program: PathBuf) -> Command {
    match ns {
        Some(ns) => ns.command(program),
        None => Command::new(program),
    }
}

impl HubSpec<'_> {
    pub fn config_yaml(&self, pin_path: &Path, cache_dir: &Path) -> String {
        let list = |v: &[&str]| {
            v.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut yaml = format!(
            "nodeName: test-node\ncloud:\n  servers: [{}]\nintercept:\n  cgroupPath: {}\n  hubAddress: {}\n  vips: [{}]\n  pinPath: {}\n",
            list(self.cloud),
            self.cgroup.display(),
            self.hub_address,
            list(self.vips),
            pin_path.display()
        );
        if let Some(a6) = self.hub_address6 {
            yaml += &format!("  hubAddress6: \"{a6}\"\n");
        }
        yaml += &format!(
            "listen:\n  admin: {}\ncache:\n  dir: {}\n",
            self.admin,
            cache_dir.display()
        );
        yaml
    }
}

/// The node name of a `LoopbackHub`.
pub const LOOPBACK_NODE: &str = "node-0";

/// A hub on loopback ports with interception off (proxy and cache scenarios); the cloud
/// is given by URL, CA and node identity, `extra` is appended to the YAML.
#[derive(Default)]
pub struct LoopbackHub<'a> {
    pub servers: Vec<String>,
    pub ca: Option<&'a Path>,
    pub node: Option<&'a (PathBuf, PathBuf)>,
    pub serving: Option<(&'a Path, &'a Path)>,
    pub client_ca: Option<&'a Path>,
    pub plain: u16,
    pub tls: Option<u16>,
    pub admin: String,
    /// YAML appended as is: more keys of the `cache:` section, which comes last.
    pub extra: String,
}

impl<'a> LoopbackHub<'a> {
    /// A hub of pool `pool-a` on fresh loopback ports: the cloud at `cloud_url`, its
    /// certificates from `pki`, the coordinator at `etcd`, and `more` appended to the
    /// coordinator section.
    pub fn pool_member(
        cloud_url: String,
        pki: &'a crate::apiserver::tls::HubPki,
        etcd: &[String],
        more: &str,
    ) -> LoopbackHub<'a> {
        let endpoints: Vec<String> = etcd.iter().map(|e| format!("\"{e}\"")).collect();
        LoopbackHub {
            servers: vec![cloud_url],
            ca: Some(&pki.ca),
            node: Some(&pki.node),
            serving: Some((&pki.serving.0, &pki.serving.1)),
            client_ca: Some(&pki.ca),
            plain: crate::ports::free_port(),
            tls: Some(crate::ports::free_port()),
            admin: format!("127.0.0.1:{}", crate::ports::free_port()),
            extra: format!(
                "poolName: pool-a\ncoordinator:\n  endpoints: [{}]\n{more}",
                endpoints.join(", ")
            ),
        }
    }

    pub fn yaml(&self, cache: &Path) -> String {
        let list: Vec<String> = self.servers.iter().map(|s| format!("\"{s}\"")).collect();
        let mut y = format!(
            "nodeName: {LOOPBACK_NODE}\ncloud:\n  servers: [{}]\n",
            list.join(", ")
        );
        if let Some(ca) = self.ca {
            y += &format!("  caFile: {}\n", ca.display());
        }
        if let Some((crt, key)) = self.node {
            y += &format!(
                "  certFile: {}\n  keyFile: {}\n",
                crt.display(),
                key.display()
            );
        }
        y += &format!(
            "intercept:\n  enabled: false\nlisten:\n  proxy: 127.0.0.1:{}\n  admin: {}\n",
            self.plain, self.admin
        );
        if let Some(tls) = self.tls {
            y += &format!("  tlsProxy: 127.0.0.1:{tls}\n");
        }
        if self.serving.is_some() || self.client_ca.is_some() {
            y += "tls:\n";
        }
        if let Some((crt, key)) = self.serving {
            y += &format!(
                "  certFile: {}\n  keyFile: {}\n",
                crt.display(),
                key.display()
            );
        }
        if let Some(ca) = self.client_ca {
            y += &format!("  clientCaFile: {}\n", ca.display());
        }
        y += &format!("cache:\n  dir: {}\n", cache.display());
        y + &self.extra
    }
}

impl HubProc {
    /// Starts a hub in `ns` (optionally inside `cgroup_procs`' cgroup) and waits until its
    /// admin port reports ready.
    pub fn start(ns: &Netns, spec: &HubSpec<'_>, cgroup_procs: Option<&Path>) -> HubProc {
        Self::start_yaml(Some(ns), spec.admin, cgroup_procs, |pin, cache| {
            spec.config_yaml(pin, cache)
        })
    }

    /// Starts a hub with a config written by `yaml(pin_path, cache_dir)`, in `ns` or in
    /// the test's own namespace.
    pub fn start_yaml(
        ns: Option<&Netns>,
        admin: &str,
        cgroup_procs: Option<&Path>,
        yaml: impl FnOnce(&Path, &Path) -> String,
    ) -> HubProc {
        let mut hub = Self::spawn_yaml(ns, admin, cgroup_procs, &[], yaml);
        hub.wait_ready();
        hub
    }

    /// Starts a hub as `start_yaml` does, with `env` added, and returns without waiting
    /// for it to be ready.
    pub fn spawn_yaml(
        ns: Option<&Netns>,
        admin: &str,
        cgroup_procs: Option<&Path>,
        env: &[(&str, &str)],
        yaml: impl FnOnce(&Path, &Path) -> String,
    ) -> HubProc {
        let dir = TempDir::new("hub");
        let pin_path = PathBuf::from("/sys/fs/bpf").join(crate::unique("pin"));
        let config = dir.path().join("hub.yaml");
        std::fs::write(&config, yaml(&pin_path, &dir.path().join("cache"))).unwrap();
        let log = dir.path().join("hub.log");
        let mut cmd = in_ns(ns, hub_bin());
        cmd.args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(procs) = cgroup_procs {
            in_cgroup(&mut cmd, procs);
        }
        HubProc {
            proc: Proc::spawn(cmd, "hub"),
            admin: admin.to_string(),
            ns: ns.map(|n| n.handle()),
            pin_path,
            log,
            _dir: dir,
        }
    }

    /// Waits (10 s at most) until the admin port reports ready.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                self.proc.is_running(),
                "hub exited early; log:\n{}",
                self.log()
            );
            let ready = self.try_status();
            if ready.is_some_and(|s| s["ready"] == Value::Bool(true)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "hub not ready after 10 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A plain GET on the admin port (e.g. `/metrics`); the raw HTTP answer.
    pub fn admin_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(&self.admin).expect("admin port");
        tcp.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .expect("admin request");
        let mut s = String::new();
        tcp.read_to_string(&mut s).expect("admin answer");
        s
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `hub ARGS…` in the hub's namespace (so it reaches the admin port).
    pub fn cli(&self, args: &[&str]) -> Command {
        let mut c = match &self.ns {
            Some(h) => h.command(hub_bin()),
            None => Command::new(hub_bin()),
        };
        c.args(args);
        c
    }

    /// The configuration file it was started with.
    pub fn config_path(&self) -> PathBuf {
        self._dir.path().join("hub.yaml")
    }

    /// The cache directory of a hub started with the suggested one (`HubProc::start`).
    pub fn cache_dir(&self) -> PathBuf {
        self._dir.path().join("cache")
    }

    fn status_cmd(&self) -> Command {
        self.cli(&["status", "--output", "json", "--admin", &self.admin])
    }

    pub fn try_status(&self) -> Option<Value> {
        let out = self.status_cmd().output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// `hub status --output json` through the real CLI.
    pub fn status(&self) -> Value {
        let text = process::output(self.status_cmd(), "hub status");
        serde_json::from_str(&text).expect("status json")
    }

    /// Waits until every answer the hub read from the cloud is in its cache.
    pub fn wait_stored(&self) {
        crate::wait_for(
            "the cache to store what was read",
            Duration::from_secs(20),
            || (self.status()["cache"]["pending"] == 0).then_some(()),
        );
    }

    /// `hub bpf status --output json` for this hub's pins.
    pub fn bpf_status(&self) -> Value {
        let mut c = Command::new(hub_bin());
        c.args(["bpf", "status", "--output", "json", "--pin-path"])
            .arg(&self.pin_path);
        serde_json::from_str(&process::output(c, "hub bpf status")).expect("bpf status json")
    }

    /// Removes what a hub that died without cleaning up (kill -9) left: its pins.
    fn uninstall_leftovers(&self) {
        if !self.pin_path.exists() {
            return;
        }
        let mut c = match &self.ns {
            Some(h) => h.command(hub_bin()),
            None => Command::new(hub_bin()),
        };
        c.args(["uninstall", "--pin-path"]).arg(&self.pin_path);
        let _ = c.output();
    }
}

impl Drop for HubProc {
    fn drop(&mut self) {
        self.proc.terminate(Duration::from_secs(5));
        self.uninstall_leftovers();
    }
}

/// What `hub run --check` said of a configuration.
pub struct Checked {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `hub run --check --config FILE ARGS…` of the configuration `yaml` (written to a
/// temporary `hub.yaml`).
pub fn check_config(yaml: &str, args: &[&std::ffi::OsStr]) -> Checked {
    let dir = TempDir::new("check");
    let path = dir.path().join("hub.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(hub_bin())
        .args(["run", "--check", "--config"])
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    Checked {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
