//! A private containerd (Debian's, with runc) for one test: its own config, root, state
//! and socket under a temporary directory, never the machine's. `ctr` talks to it by that
//! socket in a namespace of its own. On drop every task and container it ran is removed,
//! the daemon stopped, and its directory (snapshots included) deleted.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{
    TempDir,
    process::{self, Proc},
    wait_for,
};

pub struct Containerd {
    daemon: Option<Proc>,
    socket: PathBuf,
    /// ctr's namespace: what this test created, and nothing else, lives in it.
    namespace: String,
    containers: Vec<String>,
    /// Every cgroup path a container was given.
    cgroups: Vec<String>,
    dir: TempDir,
}

/// What `ctr run` is given besides the image: the pod spec's container, as a runtime sees it.
#[derive(Default, Clone)]
pub struct RunSpec {
    pub id: String,
    /// An image name, or with `rootfs` a directory that is the container's root.
    pub image: String,
    pub rootfs: bool,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (source on the host, destination in the container, read-only, host-to-container
    /// propagation)
    pub mounts: Vec<(PathBuf, String, bool, bool)>,
    /// Join these namespaces (`network`, `pid`, ...) by file, as hostNetwork/hostPID do.
    pub join: Vec<(String, PathBuf)>,
    pub cap_add: Vec<String>,
    pub drop_caps: Vec<String>,
    pub memory_limit: Option<u64>,
    /// The runtime's default seccomp profile (a pod's `seccompProfile: RuntimeDefault`).
    pub seccomp_default: bool,
    /// The cgroup (a path under each hierarchy) the container's process goes into.
    pub cgroup: String,
    /// Where a detached container's output goes (as a kubelet keeps container logs).
    pub log: Option<PathBuf>,
}

impl Containerd {
    /// Starts the daemon and waits until `ctr` gets an answer from it.
    pub fn start() -> Containerd {
        let dir = TempDir::new("ctd");
        let d = dir.path();
        let socket = d.join("containerd.sock");
        // CRI is not needed by ctr and wants privileges this machine may not give.
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\n[grpc]\n  address = \"{sock}\"\n\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\n[debug]\n  address = \"\"\n\n[metrics]\n  address = \"\"\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = socket.display(),
            opt = d.join("opt").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let mut c = Command::new("containerd");
        c.arg("--config")
            .arg(d.join("config.toml"))
            .stdout(std::fs::File::create(d.join("containerd.log")).unwrap())
            .stderr(std::fs::File::create(d.join("containerd.err")).unwrap());
        let daemon = Proc::spawn(c, "containerd");
        let namespace = crate::unique("ns");
        let ctd = Containerd {
            daemon: Some(daemon),
            socket,
            namespace,
            containers: Vec::new(),
            cgroups: Vec::new(),
            dir,
        };
        wait_for(
            &format!("containerd to answer\n{}", ctd.log()),
            Duration::from_secs(60),
            || {
                ctd.ctr_command(&["version"])
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
            },
        );
        ctd
    }

    /// The cgroup paths given to the containers run so far.
    pub fn cgroups_made(&self) -> &[String] {
        &self.cgroups
    }

    /// The daemon's own log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.err")).unwrap_or_default()
    }

    fn ctr_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&self.socket)
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args)
            .stdin(std::process::Stdio::null());
        c
    }

    /// `ctr ARGS`, which must succeed: its stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        process::output(self.ctr_command(args), &format!("ctr {}", args.join(" ")))
    }

    /// `ctr ARGS`: (success, stdout + stderr).
    pub fn try_ctr(&self, args: &[&str]) -> (bool, String) {
        let out = self.ctr_command(args).output().expect("ctr");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// The image's Entrypoint, read from an archive in OCI layout: what a pod's `args`
    /// follow when it gives no `command`, as a kubelet runs them.
    pub fn entrypoint(archive: &Path) -> Vec<String> {
        let member = |name: &str| -> serde_json::Value {
            let mut c = Command::new("tar");
            c.arg("-xOf").arg(archive).arg(name);
            serde_json::from_str(&process::output(c, &format!("tar -xOf {name}"))).unwrap()
        };
        let blob = |digest: &serde_json::Value| {
            format!(
                "blobs/sha256/{}",
                digest.as_str().unwrap().trim_start_matches("sha256:")
            )
        };
        let index = member("index.json");
        let manifest = member(&blob(&index["manifests"][0]["digest"]));
        let config = member(&blob(&manifest["config"]["digest"]));
        config["config"]["Entrypoint"]
            .as_array()
            .map(|e| e.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }

    /// Imports an image archive (OCI layout or `docker save` form); the names it holds.
    pub fn import(&self, archive: &Path) -> Vec<String> {
        let archive = archive.to_str().expect("a UTF-8 path");
        self.ctr(&["images", "import", archive]);
        self.ctr(&["images", "ls", "-q"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `ctr run` of `spec`, to its end (`--rm`) or detached (`-d`): (success, output).
    fn ctr_run(&mut self, spec: &RunSpec, detached: bool) -> (bool, String) {
        self.cgroups.push(spec.cgroup.clone());
        let mut a = vec!["run".to_string()];
        for (src, dst, read_only, slave) in &spec.mounts {
            let mut options = vec!["rbind"];
            options.push(if *read_only { "ro" } else { "rw" });
            if *slave {
                options.push("rslave");
            }
            a.push("--mount".into());
            a.push(format!(
                "type=bind,src={},dst={dst},options={}",
                src.display(),
                options.join(":")
            ));
        }
        for (kind, path) in &spec.join {
            a.push("--with-ns".into());
            a.push(format!("{kind}:{}", path.display()));
        }
        for cap in &spec.drop_caps {
            a.push("--cap-drop".into());
            a.push(format!("CAP_{cap}"));
        }
        for cap in &spec.cap_add {
            a.push("--cap-add".into());
            a.push(format!("CAP_{cap}"));
        }
        for (k, v) in &spec.env {
            a.push("--env".into());
            a.push(format!("{k}={v}"));
        }
        if let Some(limit) = spec.memory_limit {
            a.push("--memory-limit".into());
            a.push(limit.to_string());
        }
        if spec.seccomp_default {
            a.push("--seccomp".into());
        }
        a.push("--cgroup".into());
        a.push(spec.cgroup.clone());
        if let Some(log) = spec.log.as_ref().filter(|_| detached) {
            a.push("--log-uri".into());
            a.push(format!("file://{}", log.display()));
        }
        a.push(if detached { "-d" } else { "--rm" }.into());
        if spec.rootfs {
            a.push("--rootfs".into());
        }
        a.push(spec.image.clone());
        a.push(spec.id.clone());
        a.extend(spec.args.iter().cloned());
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        self.try_ctr(&args)
    }

    /// Runs the container to its end (an init container, a one-off command): (exit
    /// success, its output).
    pub fn run_to_end(&mut self, spec: &RunSpec) -> (bool, String) {
        self.ctr_run(spec, false)
    }

    /// Starts the container in the background (`ctr run -d`); its task's pid on the host.
    pub fn start_detached(&mut self, spec: &RunSpec) -> u32 {
        self.containers.push(spec.id.clone());
        let (ok, said) = self.ctr_run(spec, true);
        assert!(ok, "ctr run -d {}: {said}\n{}", spec.id, self.log());
        self.task_pid(&spec.id)
            .unwrap_or_else(|| panic!("no task for {}: {}", spec.id, self.tasks()))
    }

    /// `ctr tasks ls`.
    pub fn tasks(&self) -> String {
        self.try_ctr(&["tasks", "ls"]).1
    }

    /// The host pid of the container's task, while it has one (running or stopped).
    pub fn task_pid(&self, id: &str) -> Option<u32> {
        self.tasks()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.first() == Some(&id))
            .and_then(|f| f.get(1)?.parse().ok())
    }

    /// The task's status (RUNNING, STOPPED, ...).
    pub fn task_status(&self, id: &str) -> Option<String> {
        self.tasks()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|f| f.first().map(String::as_str) == Some(id))
            .and_then(|f| f.get(2).cloned())
    }

    /// Sends `signal` to the task and waits (bounded) until it has stopped.
    pub fn kill(&self, id: &str, signal: &str) {
        self.ctr(&["tasks", "kill", "--signal", signal, id]);
        wait_for(
            &format!("container {id} to stop after {signal}"),
            Duration::from_secs(60),
            || (self.task_status(id).as_deref() != Some("RUNNING")).then_some(()),
        );
    }

    /// Removes a container and its task, whatever state it is in.
    pub fn remove(&mut self, id: &str) {
        if self.task_status(id).as_deref() == Some("RUNNING") {
            let _ = self.try_ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
            let _ = wait_for_stop(self, id);
        }
        let _ = self.try_ctr(&["tasks", "delete", id]);
        let _ = self.try_ctr(&["containers", "delete", id]);
        self.containers.retain(|c| c != id);
    }

    /// The cgroup directories the runtime made for `cgroup`, in every hierarchy mounted.
    pub fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2"))
            .map(|f| PathBuf::from(f[1]).join(cgroup.trim_start_matches('/')))
            .filter(|p| p.exists())
            .collect()
    }
}

fn wait_for_stop(ctd: &Containerd, id: &str) -> Option<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if ctd.task_status(id).as_deref() != Some("RUNNING") {
            return Some(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for id in self.containers.clone() {
            self.remove(&id);
        }
        for image in self
            .try_ctr(&["images", "ls", "-q"])
            .1
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
        {
            let _ = self.try_ctr(&["images", "rm", &image]);
        }
        if let Some(mut daemon) = self.daemon.take() {
            daemon.terminate(Duration::from_secs(20));
        }
        let _ = self.try_ctr(&["version"]); // nothing answers now
        // Snapshots are overlay mounts only while a container runs; none is left here.
        let root = self.dir.path().display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&root))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}
