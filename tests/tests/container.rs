//! The hub's image, run by a real container runtime as deploy/'s DaemonSet runs it.
//!
//! A private containerd (Debian's, with runc) imports the archive `cargo xtask image`
//! built and runs the DaemonSet's init container and hub container with what the rendered
//! base gives them: arguments, environment (the downward API's node name, and the
//! KUBERNETES_SERVICE_* a kubelet adds), every volume mount with its read-only flag and
//! propagation, the capabilities, the memory limit, and the host's network and PID
//! namespaces. The "host" is the test's: its own network namespace (where the stand-in
//! cloud listens and the hub address is assigned), its own cgroup for the node's clients,
//! and a directory standing for the host's file system, where each hostPath volume lives
//! at its own path (bpffs and the cgroup v2 mount are the real ones; the cgroup v2 mount
//! stands at /sys/fs/cgroup, as on a host with cgroup v2 only). The host copy the init
//! container installs runs in that directory (chroot, in a private mount namespace).
use std::{path::PathBuf, process::Command, time::Duration};

use hub_tests::{
    TempDir, bin_dir,
    cgroup::{Cgroup, cgroup2_root},
    containerd::{Containerd, RunSpec},
    hub_bin,
    manifests::{deploy_dir, find, hub_config, render},
    netns::Netns,
    privileged,
    probe::{HoldingClient, upstream},
    process::{self, Proc},
    wait_for,
};
use serde_json::Value;
use serde_yaml::Value as Yaml;

/// The cloud: the kubelet kubeconfig's server and the kubernetes Service's address.
const CLOUD: &str = "127.0.0.1:16443";
const ADMIN: &str = "127.0.0.1:10267";
/// The stand-in's first node (its pods are pod-0-0 and pod-0-1).
const NODE: &str = "node-0";
/// Capabilities runc gives a container unless told otherwise (containerd's defaults):
/// what `drop: [ALL]` removes. ctr takes no "ALL", so each is named.
const RUNTIME_DEFAULT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// The test's node: namespace, clients' cgroup, host file system, stand-in cloud.
struct Node {
    ns: Netns,
    pods: Cgroup,
    /// The host's file system: /etc/kubernetes, /var/lib/hub, /etc/systemd/system, ...
    host: TempDir,
    /// The ConfigMap's files, as the kubelet would project them.
    config_dir: TempDir,
    pin: PathBuf,
    /// The stand-in's PKI.
    pki: PathBuf,
    logs: TempDir,
    /// The image's Entrypoint (the same in both versions).
    entrypoint: Vec<String>,
    /// Where the kubelet's files are: `kubeadm` or `k3s`.
    layout: &'static str,
    /// The host's /sys/fs/cgroup is the machine's own (on a hybrid host a tmpfs of v1
    /// controllers with cgroup2 below it), not the cgroup2 mount standing in for it.
    real_cgroup_layout: bool,
}

impl Node {
    fn new(config_map: &str) -> Node {
        Node::laid_out(config_map, "kubeadm", false)
    }

    fn laid_out(config_map: &str, layout: &'static str, real_cgroup_layout: bool) -> Node {
        let ns = Netns::new("ctr");
        let pods = Cgroup::new("ctr");
        let host = TempDir::new("ctrhost");
        let config_dir = TempDir::new("ctrcm");
        let logs = TempDir::new("ctrlog");
        let pki = logs.path().join("pki");
        let pin = PathBuf::from("/sys/fs/bpf").join(hub_tests::unique("pin"));
        // The hub address of the ConfigMap is assigned in this namespace by the test (this
        // kernel has no dummy interface for the hub to make).
        let config: Yaml = serde_yaml::from_str(config_map).unwrap();
        let hub_address = config["intercept"]["hubAddress"].as_str().unwrap();
        ns.add_local_address(&format!("{hub_address}/32"));
        let node = Node {
            ns,
            pods,
            host,
            config_dir,
            pin,
            pki,
            logs,
            entrypoint: Containerd::entrypoint(&image_archive("HUB_IMAGE")),
            layout,
            real_cgroup_layout,
        };
        node.write_config(config);
        node
    }

    /// A path on the "host".
    fn on_host(&self, path: &str) -> PathBuf {
        match path {
            "/sys/fs/bpf" => PathBuf::from(path),
            "/sys/fs/cgroup" if self.real_cgroup_layout => PathBuf::from(path),
            "/sys/fs/cgroup" => cgroup2_root().expect("cgroup v2"),
            _ => self.host.path().join(path.trim_start_matches('/')),
        }
    }

    /// The ConfigMap's hub.yaml, changed only where this machine differs from a node:
    /// the node's clients live in the test's cgroup, the maps are pinned where no other
    /// test pins, and there is no pool (no coordinator runs here).
    fn write_config(&self, mut config: Yaml) {
        config["intercept"]["cgroupPath"] = self.clients_cgroup().into();
        config["intercept"]["pinPath"] = self.pin.display().to_string().into();
        let root = config.as_mapping_mut().unwrap();
        root.remove("poolName");
        root.remove("coordinator");
        std::fs::write(
            self.config_dir.path().join("hub.yaml"),
            serde_yaml::to_string(&config).unwrap(),
        )
        .unwrap();
    }

    /// The node's clients' cgroup as the hub container sees it: under the host's cgroup2
    /// hierarchy, which is below /sys/fs/cgroup on a hybrid host.
    fn clients_cgroup(&self) -> String {
        let name = self.pods.path().file_name().unwrap().to_str().unwrap();
        let root = cgroup2_root().expect("cgroup v2");
        match root.strip_prefix("/sys/fs/cgroup") {
            Ok(below) if self.real_cgroup_layout && !below.as_os_str().is_empty() => {
                format!("/sys/fs/cgroup/{}/{name}", below.display())
            }
            _ => format!("/sys/fs/cgroup/{name}"),
        }
    }

    /// The stand-in cloud in the node's namespace, signing the hub's serving-certificate
    /// CSR on arrival; the node's kubelet files (kubeconfig, client certificate, cluster
    /// CA) are put where kubeadm and a kubelet put them, or where a k3s agent does.
    fn cloud(&self) -> Proc {
        let mut cmd = self.ns.command(bin_dir().join("hub-apiserver"));
        cmd.args(["--listen", CLOUD, "--nodes", "1", "--pods-per-node", "2"])
            .args(["--hub-pki", NODE, "--approve-csrs", "--dir"])
            .arg(&self.pki);
        let cloud = Proc::spawn_until_line(cmd, "hub-apiserver", "ready", Duration::from_secs(30));
        let copy = |from: &str, to: &str| {
            let to = self.on_host(to);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(self.pki.join(from), to).unwrap();
        };
        if self.layout == "k3s" {
            // As a k3s agent writes them: certificates beside the kubeconfig that names
            // them, the agent's load balancer as the server (here the cloud itself).
            let agent = "/var/lib/rancher/k3s/agent";
            for (from, to) in [
                ("ca.crt", "server-ca.crt"),
                ("ca.crt", "client-ca.crt"),
                ("hub-node.crt", "client-kubelet.crt"),
                ("hub-node.key", "client-kubelet.key"),
            ] {
                copy(from, &format!("{agent}/{to}"));
            }
            std::fs::write(
                self.on_host(&format!("{agent}/kubelet.kubeconfig")),
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://{CLOUD}\n    certificate-authority: {agent}/server-ca.crt\nusers:\n- name: user\n  user:\n    client-certificate: {agent}/client-kubelet.crt\n    client-key: {agent}/client-kubelet.key\ncontexts:\n- name: local\n  context: {{cluster: local, user: user}}\ncurrent-context: local\n"
                ),
            )
            .unwrap();
        } else {
            self.kubeadm_files(&copy);
        }
        // A host systemd booted (sd_booted(3)), for the init container to install on.
        std::fs::create_dir_all(self.on_host("/run/systemd/system")).unwrap();
        for dir in ["/etc/systemd/system", "/sys", "/proc", "/dev"] {
            std::fs::create_dir_all(self.host.path().join(&dir[1..])).unwrap();
        }
        cloud
    }

    /// kubeadm's and a kubelet's: the cluster CA, the rotated client certificate and its
    /// -current link, and kubelet.conf naming them.
    fn kubeadm_files(&self, copy: &dyn Fn(&str, &str)) {
        copy("ca.crt", "/etc/kubernetes/pki/ca.crt");
        // As a kubelet rotates its client certificate: certificate and key in one dated
        // file, and kubelet-client-current.pem an absolute link to it.
        let dated = "/var/lib/kubelet/pki/kubelet-client-2026-01-01-00-00-00.pem";
        let mut pem = std::fs::read(self.pki.join("hub-node.crt")).unwrap();
        pem.extend(std::fs::read(self.pki.join("hub-node.key")).unwrap());
        std::fs::create_dir_all(self.on_host("/var/lib/kubelet/pki")).unwrap();
        std::fs::write(self.on_host(dated), pem).unwrap();
        std::os::unix::fs::symlink(
            dated,
            self.on_host("/var/lib/kubelet/pki/kubelet-client-current.pem"),
        )
        .unwrap();
        std::fs::write(
            self.on_host("/etc/kubernetes/kubelet.conf"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n    server: https://{CLOUD}\n    certificate-authority: /etc/kubernetes/pki/ca.crt\nusers:\n- name: default\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\ncontexts:\n- name: default\n  context: {{cluster: default, user: default}}\ncurrent-context: default\n"
            ),
        )
        .unwrap();
    }

    /// How a runtime runs `container` of the DaemonSet's pod `spec`.
    fn run_spec(&self, spec: &Yaml, container: &Yaml, image: &str, id: &str) -> RunSpec {
        let field = |path: &str| match path {
            "spec.nodeName" => NODE.to_string(),
            "metadata.name" => format!("hub-{id}"),
            "metadata.namespace" => "kube-system".to_string(),
            "metadata.uid" => format!("uid-{id}"),
            other => panic!("no downward API value for {other} in this test"),
        };
        let mut env: Vec<(String, String)> = seq(&container["env"])
            .iter()
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_string();
                let value = match e["value"].as_str() {
                    Some(v) => v.to_string(),
                    None => field(e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap()),
                };
                (name, value)
            })
            .collect();
        // What a kubelet adds to every container.
        let (host, port) = CLOUD.split_once(':').unwrap();
        env.push(("KUBERNETES_SERVICE_HOST".into(), host.into()));
        env.push(("KUBERNETES_SERVICE_PORT".into(), port.into()));
        let expand = |arg: &str| {
            env.iter().fold(arg.to_string(), |a, (k, v)| {
                a.replace(&format!("$({k})"), v)
            })
        };
        // `command` replaces the image's Entrypoint; `args` follow it.
        let command: Vec<String> = match container["command"].as_sequence() {
            Some(c) => c.iter().map(|a| expand(a.as_str().unwrap())).collect(),
            None => self.entrypoint.clone(),
        };
        let args = command
            .into_iter()
            .chain(
                seq(&container["args"])
                    .iter()
                    .map(|a| expand(a.as_str().unwrap())),
            )
            .collect();
        let mounts = seq(&container["volumeMounts"])
            .iter()
            .map(|m| {
                let volume = seq(&spec["volumes"])
                    .into_iter()
                    .find(|v| v["name"] == m["name"])
                    .unwrap_or_else(|| panic!("no volume for mount {m:?}"));
                let source = if volume["configMap"].is_mapping() {
                    self.config_dir.path().to_path_buf()
                } else {
                    let path = volume["hostPath"]["path"]
                        .as_str()
                        .unwrap_or_else(|| panic!("volume {volume:?}: not hostPath"));
                    let source = self.on_host(path);
                    match volume["hostPath"]["type"].as_str() {
                        Some("DirectoryOrCreate") => std::fs::create_dir_all(&source).unwrap(),
                        // As the kubelet does: the pod does not start without it.
                        Some("Directory") => assert!(
                            source.is_dir(),
                            "hostPath {path} (as {}) is not a directory",
                            source.display()
                        ),
                        _ => {}
                    }
                    source
                };
                (
                    source,
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"].as_bool().unwrap_or(false),
                    m["mountPropagation"] == "HostToContainer",
                )
            })
            .collect();
        let mut join = Vec::new();
        if spec["hostNetwork"] == true {
            join.push((
                "network".to_string(),
                PathBuf::from(format!("/run/netns/{}", self.ns.name())),
            ));
        }
        if spec["hostPID"] == true {
            join.push(("pid".to_string(), PathBuf::from("/proc/self/ns/pid")));
        }
        let security = &container["securityContext"];
        assert_ne!(
            security["privileged"], true,
            "the hub's containers are not privileged"
        );
        let caps = &security["capabilities"];
        let drop_all = seq(&caps["drop"]).iter().any(|c| *c == "ALL");
        // The container's profile, else the pod's; none is the kubelet's default (unconfined).
        let seccomp = [security, &spec["securityContext"]]
            .iter()
            .find_map(|c| c["seccompProfile"]["type"].as_str());
        assert!(
            matches!(seccomp, None | Some("RuntimeDefault")),
            "seccompProfile {seccomp:?}: not one this test runs"
        );
        let memory_limit = container["resources"]["limits"]["memory"]
            .as_str()
            .map(quantity);
        RunSpec {
            id: id.into(),
            image: image.into(),
            rootfs: false,
            args,
            env,
            mounts,
            join,
            cap_add: seq(&caps["add"])
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect(),
            drop_caps: if drop_all {
                RUNTIME_DEFAULT_CAPS.iter().map(|c| c.to_string()).collect()
            } else {
                Vec::new()
            },
            memory_limit,
            seccomp_default: seccomp == Some("RuntimeDefault"),
            cgroup: format!("/{}", hub_tests::unique(id)),
            log: Some(self.logs.path().join(format!("{id}.log"))),
        }
    }

    /// The HTTP status a kubelet's httpGet probe of `container` (`readinessProbe`,
    /// `livenessProbe`) would get, sent from the node's network (hostNetwork).
    fn probe(&self, container: &Yaml, which: &str) -> String {
        let get = &container[which]["httpGet"];
        let url = format!(
            "http://{}:{}{}",
            get["host"].as_str().unwrap_or("127.0.0.1"),
            get["port"].as_u64().expect("a numeric probe port"),
            get["path"].as_str().unwrap_or("/")
        );
        let mut c = self.ns.command("curl");
        c.args([
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            "10",
            "-w",
            "%{http_code}",
            &url,
        ]);
        String::from_utf8_lossy(&c.output().expect("curl").stdout).into_owned()
    }

    fn status(&self) -> Option<Value> {
        let mut c = self.ns.command(hub_bin());
        c.args(["status", "--output", "json", "--admin", ADMIN])
            .stderr(std::process::Stdio::null());
        let out = c.output().ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())?
    }

    /// Waits until the hub answering the admin port is `pid`, ready, its cloud healthy.
    fn wait_serving(&self, pid: u32, logs: &dyn Fn() -> String) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let s = self.status();
            if s.as_ref().is_some_and(|s| {
                s["pid"] == pid && s["ready"] == true && s["cloud"][0]["healthy"] == true
            }) {
                return;
            }
            assert!(
                std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "pid {pid} exited before serving\n{}",
                logs()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} not serving after 90 s; status: {s:?}\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A kubelet-style request to the cloud's address from the node's cgroup, on a new
    /// connection: the names of the node's pods, or why not.
    fn kubelet_lists_pods(&self) -> Result<Vec<String>, String> {
        hub_tests::probe::kubelet_lists_pods(&self.ns, &self.pods, &self.pki, CLOUD, NODE)
    }

    /// The node's pods are listed through the hub now serving: its count of requests
    /// sent to the cloud grows with them.
    fn lists_pods_through_the_hub(&self, which: &str) {
        let sent = || {
            self.status()
                .and_then(|s| s["routes"]["cloud"]["requests"].as_u64())
                .unwrap_or(0)
        };
        let before = sent();
        for _ in 0..3 {
            assert_eq!(
                self.kubelet_lists_pods(),
                Ok(vec!["pod-0-0".to_string(), "pod-0-1".to_string()]),
                "through {which}"
            );
        }
        assert!(
            sent() >= before + 3,
            "{which} relayed the requests: {} -> {}",
            before,
            sent()
        );
    }

    fn attached_links(&self) -> usize {
        if !self.pin.exists() {
            return 0;
        }
        let mut c = Command::new(hub_bin());
        c.args(["bpf", "status", "--output", "json", "--pin-path"])
            .arg(&self.pin);
        let status: Value = serde_json::from_str(&process::output(c, "hub bpf status")).unwrap();
        status["links"].as_array().map_or(0, Vec::len)
    }

    /// What systemd would start at boot from the unit the init container enabled, run on
    /// the "host": chrooted into its file system, with the real /sys (bpffs in it), the
    /// cgroup v2 mount over /sys/fs/cgroup, /proc and /dev, in a mount namespace of its own.
    fn boot_host_copy(&self, log: &str) -> Proc {
        let link = self
            .on_host("/etc/systemd/system")
            .join("multi-user.target.wants/hub.service");
        let unit = std::fs::read_to_string(&link).expect("hub.service enabled for boot");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let root = self.host.path().display();
        let script = format!(
            "set -e; mount --rbind /sys {root}/sys; mount --bind {cg} {root}/sys/fs/cgroup; mount -t proc proc {root}/proc; mount --rbind /dev {root}/dev; exec chroot {root} {exec}",
            cg = cgroup2_root().unwrap().display()
        );
        let mut c = self.ns.command("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(self.logs.path().join(log)).unwrap());
        Proc::spawn(c, "the host copy (systemd)")
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(name)).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.pin.exists() {
            let mut c = self.ns.command(hub_bin());
            c.args(["uninstall", "--pin-path"]).arg(&self.pin);
            let _ = c.output();
        }
    }
}

/// The pod spec's container named `hub`.
fn hub_container(spec: &Yaml) -> Yaml {
    seq(&spec["containers"])
        .into_iter()
        .find(|c| c["name"] == "hub")
        .expect("the hub container")
}

fn seq(v: &Yaml) -> Vec<Yaml> {
    v.as_sequence().cloned().unwrap_or_default()
}

/// A Kubernetes memory quantity ("128Mi") in bytes.
fn quantity(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap();
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("quantity unit {other}"),
    }
}

/// A field of /proc/PID/status.
fn status_field(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The effective capabilities of a process, by name.
fn effective_caps(pid: u32) -> Vec<String> {
    let bits = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap();
    // capability(7) numbers of the ones a DaemonSet may name here.
    let known = [
        (0, "CHOWN"),
        (1, "DAC_OVERRIDE"),
        (2, "DAC_READ_SEARCH"),
        (3, "FOWNER"),
        (4, "FSETID"),
        (5, "KILL"),
        (6, "SETGID"),
        (7, "SETUID"),
        (8, "SETPCAP"),
        (10, "NET_BIND_SERVICE"),
        (12, "NET_ADMIN"),
        (13, "NET_RAW"),
        (18, "SYS_CHROOT"),
        (19, "SYS_PTRACE"),
        (21, "SYS_ADMIN"),
        (27, "MKNOD"),
        (29, "AUDIT_WRITE"),
        (31, "SETFCAP"),
        (38, "PERFMON"),
        (39, "BPF"),
    ];
    let mut names: Vec<String> = (0..64)
        .filter(|b| bits & (1 << b) != 0)
        .map(|b| {
            known
                .iter()
                .find(|(n, _)| *n == b)
                .map_or(format!("cap{b}"), |(_, name)| name.to_string())
        })
        .collect();
    names.sort();
    names
}

fn image_archive(var: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(var).expect("checked by check_containers"))
}

#[test]
fn the_image_runs_as_the_daemonset_s_pod_in_a_real_container_runtime() {
    if !privileged::check_containers(
        "the_image_runs_as_the_daemonset_s_pod_in_a_real_container_runtime",
    ) {
        return;
    }
    let docs = render(&deploy_dir("base"));
    let ds = find(&docs, "DaemonSet", "hub");
    let spec = &ds["spec"]["template"]["spec"];
    let init = &spec["initContainers"][0];
    let hub = hub_container(spec);
    let node = Node::new(&hub_config(&docs));
    let cloud = node.cloud();
    let mut ctd = Containerd::start();

    // The image as built, under the name the manifests give it.
    let image = hub["image"].as_str().unwrap().to_string();
    let names = ctd.import(&image_archive("HUB_IMAGE"));
    assert!(
        names.contains(&image),
        "the archive holds {names:?}, the DaemonSet runs {image}"
    );

    // `hub --version` and `hub run --check` in the container as the pod runs it.
    let mut version = node.run_spec(spec, &hub, &image, "version");
    version.args.truncate(node.entrypoint.len());
    version.args.push("--version".into());
    let (ok, said) = ctd.run_to_end(&version);
    assert!(ok && said.starts_with("hub "), "{said}");
    let mut check = node.run_spec(spec, &hub, &image, "check");
    // After the subcommand: `hub run --check ...`.
    check
        .args
        .insert(node.entrypoint.len() + 1, "--check".into());
    let (ok, said) = ctd.run_to_end(&check);
    assert!(ok && said.contains("config ok"), "hub run --check: {said}");

    // The init container installs the host copy on the host.
    let (ok, said) = ctd.run_to_end(&node.run_spec(spec, init, &image, "install"));
    assert!(ok, "init container: {said}");
    assert!(
        node.on_host("/var/lib/hub/bin/hub").exists()
            && node
                .on_host("/etc/systemd/system/multi-user.target.wants/hub.service")
                .exists(),
        "the init container installed nothing on the host: {said}"
    );

    // The hub container: started, it attaches and serves the node's clients.
    let run = node.run_spec(spec, &hub, &image, "hub-1");
    let pid = ctd.start_detached(&run);
    node.wait_serving(pid, &|| node.log("hub-1.log"));
    for which in ["readinessProbe", "livenessProbe"] {
        assert_eq!(node.probe(&hub, which), "200", "the kubelet's {which}");
    }
    let mut want_caps: Vec<String> = run.cap_add.clone();
    want_caps.sort();
    assert_eq!(
        effective_caps(pid),
        want_caps,
        "the container's capabilities"
    );
    assert!(run.seccomp_default, "the DaemonSet asks for RuntimeDefault");
    assert_eq!(
        status_field(pid, "Seccomp"),
        "2",
        "the runtime's syscall filter is in force"
    );
    assert_eq!(
        node.attached_links(),
        3,
        "links pinned in the host's bpffs at {}, where the host copy and `hub uninstall` find them",
        node.pin.display()
    );
    node.lists_pods_through_the_hub("the container's hub");

    // Killed: the kernel drops its programs, and clients reach the cloud directly.
    ctd.kill("hub-1", "SIGKILL");
    assert_eq!(
        node.attached_links(),
        0,
        "links left after the container died"
    );
    assert!(node.status().is_none(), "nothing serves the admin port");
    assert_eq!(
        node.kubelet_lists_pods(),
        Ok(vec!["pod-0-0".to_string(), "pod-0-1".to_string()]),
        "fail-open: straight to the cloud"
    );
    ctd.remove("hub-1");

    // Meanwhile a pod with its own network connects to the apiserver address (here served
    // inside the pod's namespace), past no hub. The hub that starts next must end that
    // connection, for the pod to reconnect through it: it finds the pod's namespace by
    // the pid its cgroup lists, so it must see the host's pids (hostPID).
    let pod_ns = Netns::new("ctrpod");
    let _pod_server = upstream(&pod_ns, &[CLOUD]);
    let mut pod = HoldingClient::start(&pod_ns, CLOUD, &node.pods);
    assert_eq!(
        pod.line()["direct"],
        true,
        "no hub serves: the pod connects directly"
    );

    // The pod back, and the host copy booted beside it: it stands by.
    let pid = ctd.start_detached(&node.run_spec(spec, &hub, &image, "hub-2"));
    node.wait_serving(pid, &|| node.log("hub-2.log"));
    let bypass = &node.status().unwrap()["bypass"];
    assert_eq!(
        bypass["ended_at_start"],
        1,
        "the pod's connection past the hub, ended at start: {bypass}\n{}",
        node.log("hub-2.log")
    );
    let mut ss = pod_ns.command("ss");
    ss.args(["-Htn", "state", "established", "dst", CLOUD]);
    assert_eq!(
        process::output(ss, "ss").trim(),
        "",
        "the pod's connection to the apiserver address is gone"
    );
    drop(pod);
    let mut host = node.boot_host_copy("host-1.log");
    wait_for(
        &format!("the host copy to stand by\n{}", node.log("host-1.log")),
        Duration::from_secs(60),
        || node.log("host-1.log").contains("standing by").then_some(()),
    );
    assert!(host.is_running());
    assert_eq!(node.status().unwrap()["pid"], pid, "the pod still serves");

    // The container goes: the host copy takes the node back.
    ctd.kill("hub-2", "SIGTERM");
    ctd.remove("hub-2");
    node.wait_serving(host.pid(), &|| node.log("host-1.log"));
    assert_eq!(node.attached_links(), 3, "{}", node.log("host-1.log"));
    node.lists_pods_through_the_hub("the host copy");

    // A new image version: its init container installs its binary for the host copy,
    // its hub container takes the node over, and the host copy, its binary replaced,
    // leaves for systemd to start the new one, which stands by.
    let names = ctd.import(&image_archive("HUB_IMAGE_NEXT"));
    let next = names
        .iter()
        .find(|n| **n != image)
        .expect("a second image")
        .clone();
    let (ok, said) = ctd.run_to_end(&node.run_spec(spec, init, &next, "install-next"));
    assert!(ok, "init container of {next}: {said}");
    let pid = ctd.start_detached(&node.run_spec(spec, &hub, &next, "hub-3"));
    node.wait_serving(pid, &|| node.log("hub-3.log"));
    assert_eq!(node.attached_links(), 3);
    node.lists_pods_through_the_hub("the new version's hub");
    wait_for(
        &format!(
            "the host copy to leave for its new binary\n{}",
            node.log("host-1.log")
        ),
        Duration::from_secs(30),
        || (!host.is_running()).then_some(()),
    );
    let host = node.boot_host_copy("host-2.log");
    wait_for(
        &format!("the new host copy to stand by\n{}", node.log("host-2.log")),
        Duration::from_secs(60),
        || node.log("host-2.log").contains("standing by").then_some(()),
    );

    // Removal: nothing of the containers is left behind.
    ctd.remove("hub-3");
    drop(host);
    let leftover: Vec<PathBuf> = ctd
        .cgroups_made()
        .iter()
        .flat_map(|c| Containerd::cgroup_dirs(c))
        .collect();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
    drop(ctd);
    drop(cloud);
}

/// A k3s node with hybrid cgroups, the hub's pod in a private cgroup namespace (as a
/// kubelet's runtime gives pods on cgroup v2): the k3s overlay's DaemonSet finds the
/// agent's kubeconfig and certificates it mounts, and the host's cgroup2 hierarchy below
/// /sys/fs/cgroup (a v1 tmpfs) above its own namespace; its hub then serves the node.
#[test]
fn the_k3s_overlay_runs_on_a_k3s_node_with_hybrid_cgroups_in_a_private_cgroup_namespace() {
    if !privileged::check_containers(
        "the_k3s_overlay_runs_on_a_k3s_node_with_hybrid_cgroups_in_a_private_cgroup_namespace",
    ) {
        return;
    }
    let docs = render(&deploy_dir("overlays/k3s"));
    let spec = &find(&docs, "DaemonSet", "hub")["spec"]["template"]["spec"];
    let hub = hub_container(spec);
    let node = Node::laid_out(&hub_config(&docs), "k3s", true);
    let cloud = node.cloud();
    let mut ctd = Containerd::start();
    let image = hub["image"].as_str().unwrap().to_string();
    ctd.import(&image_archive("HUB_IMAGE"));

    // A cgroup namespace rooted at a cgroup of the test's, for the pod to join.
    let ns_root = Cgroup::new("cgns");
    let mut holder = Command::new("sh");
    holder.arg("-c").arg(format!(
        "echo $$ > {}; exec unshare --cgroup sleep 600",
        ns_root.procs_file().display()
    ));
    let holder = Proc::spawn(holder, "the cgroup namespace's holder");
    let ns_file = PathBuf::from(format!("/proc/{}/ns/cgroup", holder.pid()));
    wait_for("the new cgroup namespace", Duration::from_secs(10), || {
        let mine = std::fs::read_link("/proc/self/ns/cgroup").ok()?;
        (std::fs::read_link(&ns_file).ok()? != mine).then_some(())
    });
    let in_private_ns = |mut run: RunSpec| {
        run.join.push(("cgroup".into(), ns_file.clone()));
        run
    };

    // `hub run --check` in the pod, with the cgroup2 hierarchy left to be found.
    let mut detect: Yaml = serde_yaml::from_str(&hub_config(&docs)).unwrap();
    detect.as_mapping_mut().unwrap().remove("coordinator");
    detect.as_mapping_mut().unwrap().remove("poolName");
    std::fs::write(
        node.config_dir.path().join("detect.yaml"),
        serde_yaml::to_string(&detect).unwrap(),
    )
    .unwrap();
    let mut check = in_private_ns(node.run_spec(spec, &hub, &image, "check"));
    for a in &mut check.args {
        if a == "/etc/hub/hub.yaml" {
            *a = "/etc/hub/detect.yaml".into();
        }
    }
    check
        .args
        .insert(node.entrypoint.len() + 1, "--check".into());
    let (ok, said) = ctd.run_to_end(&check);
    eprintln!("hub run --check in the k3s node's pod:\n{said}");
    assert!(ok, "hub run --check: {said}");
    assert!(
        said.contains(
            "node layout: k3s (found the kubelet kubeconfig /var/lib/rancher/k3s/agent/kubelet.kubeconfig)"
        ),
        "{said}"
    );
    let hierarchy = node.clients_cgroup();
    let hierarchy = hierarchy.rsplit_once('/').unwrap().0;
    assert!(
        said.contains(&format!("cgroup2 hierarchy: {hierarchy} (")),
        "{said}"
    );
    assert!(
        said.contains("lies above this process's cgroup namespace"),
        "the pod's own namespace is not the host's: {said}"
    );
    if hierarchy != "/sys/fs/cgroup" {
        assert!(said.contains("a hybrid host"), "{said}");
    }
    assert!(said.contains("config ok"), "{said}");

    // The hub itself, attached to the node's clients' cgroup, serving through the k3s
    // kubeconfig's server address.
    let run = in_private_ns(node.run_spec(spec, &hub, &image, "k3s-hub"));
    let pid = ctd.start_detached(&run);
    node.wait_serving(pid, &|| node.log("k3s-hub.log"));
    let found = node.status().unwrap()["node_layout"].clone();
    assert!(
        found
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().starts_with("node layout: k3s")),
        "{found}"
    );
    node.lists_pods_through_the_hub("the k3s node's hub");
    ctd.remove("k3s-hub");
    drop(holder);
    drop(ctd);
    drop(cloud);
}
