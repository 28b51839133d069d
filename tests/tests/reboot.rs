//! A node that reboots while the cloud is unreachable keeps its hub: the copy `hub install`
//! put on the host starts with no cloud, attaches and serves the node's cached pods; when
//! the cloud returns the DaemonSet's hub takes the node over, the host copy stands by, and
//! takes it back when the DaemonSet's hub stops. In a namespace and a cgroup the test made;
//! the cloud's address is the VIP, as a kubelet's kubeconfig would have it.
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use hub_tests::{
    TempDir, bin_dir,
    cgroup::Cgroup,
    hub_bin,
    netns::Netns,
    privileged,
    process::{self, Proc},
    wait_for,
};
use serde_json::Value;

const CLOUD: &str = "127.0.0.1:16443";
const ADMIN: &str = "127.0.0.1:10267";
/// The stand-in's first node (its pods are pod-0-0 and pod-0-1).
const NODE: &str = "node-0";

struct Node {
    ns: Netns,
    cg: Cgroup,
    /// The stand-in's PKI (kubelet.crt, hub-node.crt, ...).
    pki: PathBuf,
    /// The ConfigMap's hub.yaml.
    config: PathBuf,
    /// The shared state directory (/var/lib/hub) and the host's systemd directory.
    state: PathBuf,
    units: PathBuf,
    pin: PathBuf,
    dir: TempDir,
}

impl Node {
    fn new() -> Node {
        let ns = Netns::new("boot");
        let cg = Cgroup::new("boot");
        let dir = TempDir::new("boot");
        let pki = dir.path().join("pki");
        let state = dir.path().join("state");
        let units = dir.path().join("systemd");
        let pin = PathBuf::from("/sys/fs/bpf").join(hub_tests::unique("pin"));
        let config = dir.path().join("hub.yaml");
        let p = pki.display();
        std::fs::write(
            &config,
            format!(
                "nodeName: placeholder\ncloud:\n  servers: [\"https://{CLOUD}\"]\n  caFile: {p}/ca.crt\n  certFile: {p}/hub-node.crt\n  keyFile: {p}/hub-node.key\nintercept:\n  cgroupPath: {}\n  hubAddress: 127.0.0.1\n  vips: [\"{CLOUD}\"]\n  pinPath: {}\ntls:\n  certFile: {p}/hub-serving.crt\n  keyFile: {p}/hub-serving.key\n  clientCaFile: {p}/ca.crt\nlisten:\n  tlsProxy: 127.0.0.1:10268\n  admin: {ADMIN}\ncache:\n  dir: {}\n  components: [kubelet]\n",
                cg.path().display(),
                pin.display(),
                state.display()
            ),
        )
        .unwrap();
        Node {
            ns,
            cg,
            pki,
            config,
            state,
            units,
            pin,
            dir,
        }
    }

    fn cloud(&self) -> Proc {
        let mut cmd = self.ns.command(bin_dir().join("hub-apiserver"));
        cmd.args(["--listen", CLOUD, "--nodes", "1", "--pods-per-node", "2"])
            .args(["--hub-pki", NODE, "--dir"])
            .arg(&self.pki);
        Proc::spawn_until_line(cmd, "hub-apiserver", "ready", Duration::from_secs(30))
    }

    /// `hub ARGS` in the node's namespace.
    fn hub_cli(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = self.ns.command(bin);
        c.args(args);
        c
    }

    /// The DaemonSet's init container: `hub install`.
    fn install(&self) -> String {
        let mut c = self.hub_cli(&hub_bin(), &["install", "--node-name", NODE, "--config"]);
        // This machine's PID 1 is not systemd; the node the test stands for is.
        c.arg(&self.config).arg("--unit-dir").arg(&self.units);
        c.args(["--init-system", "systemd"]);
        process::output(c, "hub install")
    }

    /// The DaemonSet's hub container.
    fn pod_hub(&self, log: &str) -> Proc {
        let mut c = self.hub_cli(&hub_bin(), &["run", "--node-name", NODE, "--config"]);
        c.arg(&self.config)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap());
        Proc::spawn(c, "the DaemonSet's hub")
    }

    /// What systemd would start at boot: the enabled unit's ExecStart, as written.
    fn boot(&self, log: &str) -> Proc {
        let link = self.units.join("multi-user.target.wants/hub.service");
        let unit = std::fs::read_to_string(&link).expect("hub.service enabled for boot");
        assert!(unit.contains("Before=kubelet.service"), "{unit}");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let mut words = exec.split_whitespace();
        let mut c = self.ns.command(words.next().unwrap());
        c.args(words)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap());
        Proc::spawn(c, "the host's hub (systemd)")
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    fn status(&self) -> Option<Value> {
        let mut c = self.hub_cli(
            &hub_bin(),
            &["status", "--output", "json", "--admin", ADMIN],
        );
        c.stderr(std::process::Stdio::null());
        let out = c.output().ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())?
    }

    /// Waits until the hub answering the admin port is `pid`, ready, with its cloud
    /// `healthy` as given.
    fn wait_serving(&self, pid: u32, cloud_healthy: bool, logs: &str) {
        wait_for(
            &format!("pid {pid} serving (cloud healthy: {cloud_healthy})\n{logs}"),
            Duration::from_secs(60),
            || {
                let s = self.status()?;
                (s["pid"] == pid && s["ready"] == true && s["cloud"][0]["healthy"] == cloud_healthy)
                    .then_some(())
            },
        );
    }

    /// A kubelet-style request through the VIP (a new connection each time, from the
    /// node's cgroup): the names of the node's pods, or why not.
    fn kubelet_lists_pods(&self) -> Result<Vec<String>, String> {
        hub_tests::probe::kubelet_lists_pods(&self.ns, &self.cg, &self.pki, CLOUD, NODE)
    }

    fn attached_links(&self) -> usize {
        let mut c = Command::new(hub_bin());
        c.args(["bpf", "status", "--output", "json", "--pin-path"])
            .arg(&self.pin);
        let status: Value = serde_json::from_str(&process::output(c, "hub bpf status")).unwrap();
        status["links"].as_array().map_or(0, Vec::len)
    }
}

impl Drop for Node {
    /// Runs after the test's processes are gone: whatever a killed hub left pinned.
    fn drop(&mut self) {
        if self.pin.exists() {
            let mut c = self.ns.command(hub_bin());
            c.args(["uninstall", "--pin-path"]).arg(&self.pin);
            let _ = c.output();
        }
    }
}

fn signal(p: &Proc, sig: libc::c_int) {
    // SAFETY: a signal to a child this test started.
    unsafe { libc::kill(p.pid() as i32, sig) };
}

/// Stops a `steady_client` however the scope ends (a failed wait must not leave it running).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Requests through the VIP, one after another, until stopped: (requests, failures with
/// why). A request is retried once at once when its connection fails, as kubelet's client
/// does; a failure is a request that did not get the node's pods either time.
fn steady_client(node: &Node, stop: &AtomicBool, want: &[String]) -> (usize, usize, Vec<String>) {
    let (mut requests, mut retried, mut failures) = (0, 0, Vec::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while !stop.load(Ordering::Relaxed) && requests < 5000 && std::time::Instant::now() < deadline {
        requests += 1;
        let first = node.kubelet_lists_pods();
        let answer = match first {
            Ok(names) => Ok(names),
            Err(_) => {
                retried += 1;
                node.kubelet_lists_pods()
            }
        };
        match answer {
            Ok(names) if names == want => {}
            Ok(names) => failures.push(format!("wrong pods: {names:?}")),
            Err(e) => failures.push(e),
        }
    }
    (requests, retried, failures)
}

#[test]
fn a_node_rebooted_offline_gets_its_hub_from_the_host_and_the_daemonset_takes_over() {
    if !privileged::check(
        "a_node_rebooted_offline_gets_its_hub_from_the_host_and_the_daemonset_takes_over",
    ) {
        return;
    }
    let node = Node::new();
    let cloud = node.cloud();
    let want = vec!["pod-0-0".to_string(), "pod-0-1".to_string()];

    // Before the reboot: the DaemonSet's init container installs the host copy, its hub
    // serves, and the kubelet's pods are cached.
    let said = node.install();
    assert!(said.contains("enabled for boot"), "{said}");
    let mut pod = node.pod_hub("pod-1.log");
    node.wait_serving(pod.pid(), true, &node.log("pod-1.log"));
    assert_eq!(node.kubelet_lists_pods(), Ok(want.clone()));
    // The node ran a while: what the hub read is in its store (a write still on its way
    // to the disk at the power cut is lost, as on any node).
    wait_for("the pods in the cache", Duration::from_secs(20), || {
        let entries = node.status()?["cache"]["entries"].as_u64()?;
        (entries >= want.len() as u64).then_some(())
    });

    // Power off: the hub dies with the node, and the cloud link is down through the boot.
    pod.kill9();
    signal(&cloud, libc::SIGSTOP);

    // Boot: only what the host starts. The host copy comes up from its install with no
    // cloud, attaches, and answers the kubelet from the cache.
    let host = node.boot("host.log");
    node.wait_serving(host.pid(), false, &node.log("host.log"));
    assert_eq!(node.attached_links(), 3, "{}", node.log("host.log"));
    assert_eq!(
        node.kubelet_lists_pods(),
        Ok(want.clone()),
        "{}",
        node.log("host.log")
    );
    let routes = node.status().unwrap()["routes"].clone();
    assert!(
        routes["local-cache"]["requests"].as_u64() >= Some(1),
        "{routes}"
    );

    // The cloud returns; the kubelet starts the DaemonSet's hub, which takes the node over
    // while a kubelet-style client keeps asking.
    signal(&cloud, libc::SIGCONT);
    node.wait_serving(host.pid(), true, &node.log("host.log"));
    let stop = AtomicBool::new(false);
    let (pod, (requests, retried, failures)) = std::thread::scope(|s| {
        let client = s.spawn(|| steady_client(&node, &stop, &want));
        let _stop = StopOnDrop(&stop);
        let pod = node.pod_hub("pod-2.log");
        node.wait_serving(pod.pid(), true, &node.log("pod-2.log"));
        // A few more requests through the new owner, then stop.
        three_more_requests(&node, "the DaemonSet's hub");
        stop.store(true, Ordering::Relaxed);
        (pod, client.join().unwrap())
    });
    eprintln!(
        "handover to the pod: {requests} requests, {retried} retried once, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{failures:?}\nhost:\n{}\npod:\n{}",
        node.log("host.log"),
        node.log("pod-2.log")
    );
    assert!(requests >= 3, "{requests}");
    assert_eq!(node.attached_links(), 3, "one set of programs, the pod's");
    let mut host = host;
    assert!(
        host.is_running(),
        "the host copy stands by:\n{}",
        node.log("host.log")
    );
    assert!(
        node.log("host.log").contains("standing by"),
        "{}",
        node.log("host.log")
    );

    // An upgrade through the DaemonSet: the init container installs the new binary, the
    // standing-by host copy exits for systemd to start the new one.
    node.install();
    wait_for(
        "the host copy to leave for its new binary",
        Duration::from_secs(20),
        || (!host.is_running()).then_some(()),
    );
    let host = node.boot("host-2.log");

    // Back the other way: the DaemonSet's hub stops, the host copy takes the node again.
    let mut pod = pod;
    let stop = AtomicBool::new(false);
    let (requests, retried, failures) = std::thread::scope(|s| {
        let client = s.spawn(|| steady_client(&node, &stop, &want));
        assert_eq!(
            pod.terminate(Duration::from_secs(20)),
            Some(0),
            "{}",
            node.log("pod-2.log")
        );
        node.wait_serving(host.pid(), true, &node.log("host-2.log"));
        three_more_requests(&node, "the host copy");
        stop.store(true, Ordering::Relaxed);
        client.join().unwrap()
    });
    eprintln!(
        "handover to the host: {requests} requests, {retried} retried once, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{failures:?}\nhost:\n{}",
        node.log("host-2.log")
    );
    assert_eq!(node.attached_links(), 3);

    // Removal: the unit and the copy go, the cache stays.
    let mut c = node.hub_cli(&hub_bin(), &["install", "--uninstall", "--unit-dir"]);
    c.arg(&node.units).arg("--dir").arg(&node.state);
    let said = process::output(c, "hub install --uninstall");
    assert!(said.contains("hub.service"), "{said}");
    assert!(!node.units.join("hub.service").exists());
    assert!(!node.state.join("bin/hub").exists());
    assert!(node.state.join("cache.redb").exists(), "the cache stays");
    drop(host);
}

/// Requests the answering hub sent to the cloud.
fn routes_to_cloud(node: &Node) -> u64 {
    node.status()
        .and_then(|s| s["routes"]["cloud"]["requests"].as_u64())
        .unwrap_or(0)
}

/// Waits until the hub now serving the node has sent three more requests to the cloud.
fn three_more_requests(node: &Node, through: &str) {
    let served_before = routes_to_cloud(node);
    wait_for(
        &format!("requests through {through}"),
        Duration::from_secs(30),
        || (routes_to_cloud(node) >= served_before + 3).then_some(()),
    );
}
