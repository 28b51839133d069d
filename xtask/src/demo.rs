//! `cargo xtask demo`: the whole system on this one machine.
//!
//! A cloud namespace holds the Kubernetes API stand-in (the cloud apiserver, at an address
//! the demo assigns) and the pool's coordinator, a 3-member etcd. Two node namespaces, each
//! joined to the cloud by its own veth link, run a hub with interception on the node's
//! cgroup; each node has a pod namespace whose kubectl uses an in-cluster-style kubeconfig
//! (the unchanged apiserver address and the pod's token), and a node-level kubectl with the
//! node's client certificate stands in for kubelet and kube-proxy. Each step checks what a
//! user would see; the demo exits non-zero if any check fails, and removes everything it
//! created on every exit path, Ctrl-C included.
use std::{
    io::BufRead,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use hub_tests::{
    TempDir,
    apiserver::{Credentials, write_kubeconfig},
    bin_dir,
    cgroup::Cgroup,
    etcd::EtcdCluster,
    hub::HubProc,
    hub_bin,
    netns::Netns,
    pool_net::{ETCD_IP, PoolNet},
    process::{self, Proc, in_cgroup},
};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The cloud apiserver's address (`pool_net::CLOUD_IP`, port 443): what kubeconfigs and
/// pods use, unchanged throughout.
const CLOUD: &str = "169.254.20.1:443";
const HUB_ADDRESS: &str = "169.254.2.1";
const NODES: [&str; 2] = ["node-0", "node-1"];
/// The pool leader's lease: a dead leader is replaced within this many seconds.
const LEASE_SECONDS: u64 = 3;

struct Narrator {
    step: usize,
    pause: bool,
}

impl Narrator {
    fn step(&mut self, title: &str) -> Result<()> {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        if self.pause && self.step > 0 {
            eprint!("\n[press Enter for the next step]");
            let _ = std::io::stdin().lock().lines().next();
        }
        self.step += 1;
        println!("\n=== step {}: {title}", self.step);
        Ok(())
    }
}

fn check(ok: bool, what: &str) -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted: cleaning up");
    }
    println!("  [{}] {what}", if ok { " ok " } else { "FAIL" });
    ensure!(ok, "check failed: {what}");
    Ok(())
}

/// `route` answered, and no other did.
fn only(routes: &[String], route: &str) -> bool {
    routes.iter().any(|r| r == route) && routes.iter().all(|r| r == route)
}

fn show(title: &str, text: &str) {
    println!("  $ {title}");
    for line in text.lines() {
        println!("    {line}");
    }
}

/// Retries `f` until it returns Some or `within` passes.
fn until<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= within || INTERRUPTED.load(Ordering::SeqCst) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs kubectl in `ns` (inside `cgroup`, if given); (success, stdout+stderr).
fn kubectl(
    ns: &Netns,
    cgroup: Option<&Cgroup>,
    kubeconfig: &Path,
    args: &[&str],
) -> (bool, String) {
    let mut c = ns.command("kubectl");
    c.args(args)
        .arg("--request-timeout=5s")
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null());
    if let Some(cg) = cgroup {
        in_cgroup(&mut c, &cg.procs_file());
    }
    match c.output() {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        ),
        Err(e) => (false, e.to_string()),
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) of a child this demo started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// One edge node: its namespace (in `PoolNet`), a pod namespace, the cgroup the hub
/// intercepts, the hub, and the two kubeconfigs.
struct Node {
    name: &'static str,
    pod: Netns,
    cgroup: Cgroup,
    hub: Option<HubProc>,
    /// The pod's in-cluster kubeconfig (its token) and the node's (client certificate).
    pod_kc: PathBuf,
    node_kc: PathBuf,
}

struct Demo {
    net: PoolNet,
    nodes: Vec<Node>,
    etcd: EtcdCluster,
    cloud: Proc,
    admin_kc: PathBuf,
    dir: TempDir,
}

impl Demo {
    fn node_ns(&self, i: usize) -> &Netns {
        &self.net.nodes[i]
    }

    /// kubectl in node `i`'s pod namespace, with the pod's token.
    fn pod_kubectl(&self, i: usize, args: &[&str]) -> (bool, String) {
        let n = &self.nodes[i];
        kubectl(&n.pod, Some(&n.cgroup), &n.pod_kc, args)
    }

    /// kubectl on node `i` itself with the node's certificate, as kubelet or kube-proxy.
    fn node_kubectl(&self, i: usize, args: &[&str]) -> (bool, String) {
        let n = &self.nodes[i];
        kubectl(self.node_ns(i), Some(&n.cgroup), &n.node_kc, args)
    }

    /// kubectl in the cloud's namespace as its administrator (what the cloud itself has).
    fn cloud_kubectl(&self, args: &[&str]) -> (bool, String) {
        kubectl(&self.net.cloud, None, &self.admin_kc, args)
    }

    fn hub(&self, i: usize) -> &HubProc {
        self.nodes[i].hub.as_ref().expect("hub running")
    }

    /// What `f` got, and the routes (cloud, coordinator, local-cache) whose requests grew
    /// on hub `i` meanwhile: where its answers came from. (The answers' own Warning says
    /// so only once a minute per client.)
    fn via<T>(&self, i: usize, f: impl FnOnce() -> T) -> (T, Vec<String>) {
        let counts = || -> std::collections::BTreeMap<String, u64> {
            let status = self.hub(i).try_status().unwrap_or_default();
            status["routes"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v["requests"].as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = counts();
        let got = f();
        let after = counts();
        let grew = after
            .into_iter()
            .filter(|(k, n)| before.get(k).is_none_or(|b| n > b))
            .map(|(k, _)| k)
            .collect();
        (got, grew)
    }

    fn role(&self, i: usize) -> String {
        self.nodes[i]
            .hub
            .as_ref()
            .and_then(|h| h.try_status())
            .and_then(|s| s["coordinator"]["role"].as_str().map(String::from))
            .unwrap_or_default()
    }

    fn show_status(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            if n.hub.is_some() {
                let mut c = self.node_ns(i).command(hub_bin());
                let text = match c.arg("status").output() {
                    Ok(o) => {
                        String::from_utf8_lossy(&o.stdout).into_owned()
                            + &String::from_utf8_lossy(&o.stderr)
                    }
                    Err(e) => format!("hub status: {e}"),
                };
                show(&format!("hub status   # on {}", n.name), &text);
            }
        }
    }

    /// Keys under `prefix` in the coordinator (etcdctl from the cloud's namespace).
    fn etcd_keys(&self, prefix: &str) -> usize {
        let _inside = self.net.cloud.enter();
        self.etcd.keys(prefix).len()
    }

    fn start_hub(&mut self, i: usize) {
        let name = self.nodes[i].name;
        let d = self.dir.path().display();
        let endpoints: Vec<String> = self
            .etcd
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        let cgroup = self.nodes[i].cgroup.path().display().to_string();
        let hub = HubProc::start_yaml(
            Some(self.node_ns(i)),
            "127.0.0.1:10267",
            None,
            |pin, cache| {
                format!(
                    "nodeName: {name}\npoolName: demo-pool\ncloud:\n  servers: [\"https://{CLOUD}\"]\n  caFile: {d}/ca.crt\n  certFile: {d}/{name}/hub-node.crt\n  keyFile: {d}/{name}/hub-node.key\nintercept:\n  cgroupPath: {cgroup}\n  hubAddress: {HUB_ADDRESS}\n  vips: [\"{CLOUD}\"]\n  pinPath: {}\ntls:\n  certFile: {d}/{name}/hub-serving.crt\n  keyFile: {d}/{name}/hub-serving.key\n  clientCaFile: {d}/ca.crt\ncoordinator:\n  endpoints: [{}]\n  leaderLeaseSeconds: {LEASE_SECONDS}\ncache:\n  dir: {}\n  components: [kubelet, kube-proxy, flanneld, coredns, hub, kubectl]\n",
                    pin.display(),
                    endpoints.join(", "),
                    cache.display()
                )
            },
        );
        self.nodes[i].hub = Some(hub);
    }
}

/// The pool: namespaces, links, the cloud with a realistic pool, the coordinator.
fn build() -> Result<Demo> {
    let net = PoolNet::new(NODES.len());
    let dir = TempDir::new("demo");
    let mut nodes = Vec::new();
    for (i, name) in NODES.into_iter().enumerate() {
        let node = &net.nodes[i];
        let pod = Netns::new("dp");
        let (node_side, pod_side) = (
            format!("169.254.30.{}", 4 * i + 1),
            format!("169.254.30.{}", 4 * i + 2),
        );
        node.veth_to(
            &pod,
            ("pods", &format!("{node_side}/30")),
            ("eth0", &format!("{pod_side}/30")),
        );
        pod.ip(&["route", "add", "169.254.0.0/16", "via", &node_side]);
        // Pods reach the cloud through their node (before the hub, and when it is gone).
        let mut fwd = node.command("sh");
        fwd.args(["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
        process::output(fwd, "enable forwarding on the node");
        net.cloud.ip(&[
            "route",
            "add",
            &format!("169.254.30.{}/30", 4 * i),
            "via",
            &PoolNet::node_ip(i),
        ]);
        nodes.push(Node {
            name,
            pod,
            cgroup: Cgroup::new("demo"),
            hub: None,
            pod_kc: dir.path().join(format!("{name}-pod.kubeconfig")),
            node_kc: dir.path().join(format!("{name}-node.kubeconfig")),
        });
    }
    let mut cmd = net.cloud.command(bin_dir().join("hub-apiserver"));
    cmd.args([
        "--listen",
        CLOUD,
        "--nodes",
        "2",
        "--pods-per-node",
        "3",
        "--services",
        "2",
        "--configmaps",
        "2",
        "--secrets",
        "1",
        "--hub-pki",
        NODES[0],
        "--hub-pki",
        NODES[1],
        "--dir",
    ])
    .arg(dir.path());
    let cloud = Proc::spawn_until_line(cmd, "cloud", "ready", Duration::from_secs(10));
    let etcd = {
        let _inside = net.cloud.enter();
        EtcdCluster::start_on(3, ETCD_IP)
    };
    let ca = std::fs::read_to_string(dir.path().join("ca.crt"))?;
    let server = format!("https://{CLOUD}");
    for n in &nodes {
        write_kubeconfig(&n.pod_kc, &server, &ca, Credentials::Token("pod-token"))?;
        let pki = dir.path().join(n.name);
        let cert_pem = std::fs::read_to_string(pki.join("kubelet.crt"))?;
        let key_pem = std::fs::read_to_string(pki.join("kubelet.key"))?;
        write_kubeconfig(
            &n.node_kc,
            &server,
            &ca,
            Credentials::ClientCert {
                cert_pem: &cert_pem,
                key_pem: &key_pem,
            },
        )?;
    }
    Ok(Demo {
        admin_kc: dir.path().join("admin.kubeconfig"),
        net,
        nodes,
        etcd,
        cloud,
        dir,
    })
}

pub fn run(pause: bool) -> Result<()> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let mut n = Narrator { step: 0, pause };

    n.step("a pool on one machine: the cloud and a 3-member etcd coordinator, two edge nodes")?;
    let mut demo = build()?;
    println!(
        "  cloud namespace {}: the Kubernetes API stand-in on {CLOUD} (2 nodes' pods, services, endpointslices, configmaps, a secret) and etcd on {ETCD_IP}",
        demo.net.cloud.name()
    );
    for (i, node) in demo.nodes.iter().enumerate() {
        println!(
            "  {}: node namespace {} (link {} <-> cloud), pod namespace {}; kubeconfigs point at https://{CLOUD}",
            node.name,
            demo.node_ns(i).name(),
            PoolNet::node_ip(i),
            node.pod.name()
        );
    }

    n.step("without hubs, the pod's kubectl talks to the cloud directly")?;
    let (ok, out) = demo.pod_kubectl(0, &["get", "pods", "-o", "wide"]);
    show("kubectl get pods -o wide   # in node-0's pod", &out);
    check(
        ok && out.contains("pod-1-2"),
        "kubectl lists the pods straight from the cloud",
    )?;

    n.step("start a hub on each node: eBPF on the node's cgroup, TLS proxy, pool demo-pool")?;
    for i in 0..NODES.len() {
        demo.start_hub(i);
    }
    let leader = until(Duration::from_secs(20), || {
        let roles: Vec<String> = (0..NODES.len()).map(|i| demo.role(i)).collect();
        (roles.iter().filter(|r| *r == "leader").count() == 1
            && roles.iter().filter(|r| *r == "follower").count() == 1)
            .then(|| roles.iter().position(|r| r == "leader").unwrap())
    });
    check(
        leader.is_some(),
        "the pool elects one leader among the hubs",
    )?;
    let leader = leader.unwrap_or_default();
    let follower = 1 - leader;
    println!("  leader: {}, follower: {}", NODES[leader], NODES[follower]);
    demo.show_status();

    n.step("normal operation: everything through the cloud, copied to the caches")?;
    let (ok, out) = demo.pod_kubectl(0, &["get", "pods,svc"]);
    show("kubectl get pods,svc   # in node-0's pod, unchanged", &out);
    check(
        ok && out.contains("service/svc-1"),
        "the pod's kubectl works through the hub",
    )?;
    let (_, can) = demo.pod_kubectl(0, &["auth", "can-i", "list", "secrets"]);
    check(
        can.trim_start().starts_with("no"),
        "the cloud still judges the pod's own token (can-i list secrets: no)",
    )?;
    // What the pod reads is cached for it (its own token), what the node's agents read is
    // cached for the node and pushed to the coordinator.
    let (ok, _) = demo.pod_kubectl(0, &["get", "pods,svc", "-o", "name"]);
    check(
        ok,
        "the pod's lists are kept in node-0's local cache, for its token only",
    )?;
    for (i, name) in NODES.into_iter().enumerate() {
        let mine = format!("spec.nodeName={name}");
        let (ok1, _) = demo.node_kubectl(
            i,
            &["get", "pods", "-A", "--field-selector", &mine, "-o", "name"],
        );
        let (ok2, _) = demo.node_kubectl(i, &["get", "node", name, "-o", "name"]);
        check(
            ok1 && ok2,
            &format!("{name}'s agent (node certificate) lists its pods and reads its node"),
        )?;
    }
    let pushed = until(Duration::from_secs(15), || {
        (demo.etcd_keys("/registry/pods/") == 6).then_some(())
    });
    check(
        pushed.is_some(),
        "both nodes' pods are in the coordinator (pushed by their hubs)",
    )?;
    let synced = until(Duration::from_secs(15), || {
        (demo.etcd_keys("/hub/synced/") == 3).then_some(())
    });
    check(
        synced.is_some(),
        "the leader synced services, endpoints and endpointslices for the pool",
    )?;
    let before = demo.hub(follower).status()["routes"]["coordinator"]["requests"]
        .as_u64()
        .unwrap_or(0);
    let (ok, out) = demo.node_kubectl(follower, &["get", "endpointslices", "-A", "-o", "name"]);
    show(
        &format!(
            "kubectl get endpointslices -A -o name   # {}'s kube-proxy",
            NODES[follower]
        ),
        &out,
    );
    let after = demo.hub(follower).status()["routes"]["coordinator"]["requests"]
        .as_u64()
        .unwrap_or(0);
    check(
        ok && out.contains("svc-0") && after > before,
        "the follower's kube-proxy reads them from the coordinator, not over the cloud link",
    )?;
    demo.show_status();

    n.step("what the hub intercepts, live: hub trace on node-0")?;
    let mut c = demo.node_ns(0).command(hub_bin());
    c.args(["trace", "--count", "3"]);
    let (mut tracing, lines) = Proc::spawn_collecting(c, "hub trace");
    let listening = until(Duration::from_secs(10), || {
        (demo.hub(0).bpf_status()["tracing"] == true).then_some(())
    });
    check(
        listening.is_some(),
        "the connect hook traces once someone listens",
    )?;
    let (ok, _) = demo.pod_kubectl(0, &["get", "pods", "-o", "name"]);
    let (ok2, _) = demo.node_kubectl(0, &["get", "node", NODES[0], "-o", "name"]);
    let traced = until(Duration::from_secs(10), || {
        let lines = lines.lock().unwrap();
        (lines.len() >= 2).then(|| lines.join("\n"))
    })
    .unwrap_or_default();
    tracing.terminate(Duration::from_secs(5));
    show(
        "hub trace   # on node-0, while the pod's and the node's kubectl run",
        &traced,
    );
    check(
        ok && ok2
            && traced
                .lines()
                .filter(|l| l.contains("kubectl") && l.contains(&format!("{CLOUD} -> ")))
                .count()
                >= 2
            && traced.lines().all(|l| l.ends_with(" redirected")),
        "each kubectl connect to the apiserver shows: pid, command, cgroup, VIP -> hub listener, redirected",
    )?;

    n.step("the cloud goes dark (the cloud apiserver is frozen)")?;
    signal(demo.cloud.pid(), libc::SIGSTOP);
    let frozen = Instant::now();
    let columns = "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName";
    // The first answer with node-1's pods too comes from the coordinator (which then
    // leaves a copy in node-0's cache).
    let (pool_view, routes) = demo.via(0, || {
        until(Duration::from_secs(10), || {
            let (ok, out) = demo.node_kubectl(0, &["get", "pods", "-A", "-o", columns]);
            (ok && out.contains("pod-0-0") && out.contains("pod-1-0")).then_some(out)
        })
    });
    show(
        "kubectl get pods -A   # node-0's agent",
        pool_view.as_deref().unwrap_or("(no answer)"),
    );
    check(
        pool_view.is_some() && routes.iter().any(|r| r == "coordinator"),
        &format!(
            "node-0 sees the whole pool's pods, node-1's too, from the coordinator ({} ms after the freeze; routes {routes:?})",
            frozen.elapsed().as_millis()
        ),
    )?;
    let ((ok, out), routes) = demo.via(0, || {
        demo.pod_kubectl(0, &["get", "pods,svc", "-o", "name"])
    });
    show("kubectl get pods,svc -o name   # node-0's pod", &out);
    check(
        ok && only(&routes, "local-cache"),
        &format!("the pod's kubectl is answered from node-0's local cache (routes {routes:?})"),
    )?;
    let patch = r#"{"status":{"nodeInfo":{"kubeletVersion":"v1.32.0-offline"}}}"#;
    let (ok, out) = demo.node_kubectl(
        0,
        &[
            "patch",
            "node",
            "node-0",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ],
    );
    show(
        "kubectl patch node node-0 --subresource=status ...   # node-0's kubelet",
        &out,
    );
    check(
        ok && out.contains("queued"),
        "the kubelet's node status update is queued on the node",
    )?;
    let (ok, out) = demo.pod_kubectl(0, &["create", "configmap", "offline-demo"]);
    show(
        "kubectl create configmap offline-demo   # node-0's pod",
        &out,
    );
    check(
        !ok && out.contains("offline"),
        "a write only the cloud can judge is refused clearly, never faked",
    )?;
    demo.show_status();

    n.step("the coordinator goes dark too (its three etcd members are frozen)")?;
    for pid in demo.etcd.pids() {
        signal(pid, libc::SIGSTOP);
    }
    let unhealthy = until(Duration::from_secs(10), || {
        (demo.hub(0).status()["coordinator"]["healthy"] == false).then_some(())
    });
    check(
        unhealthy.is_some(),
        "node-0's hub marks the coordinator unhealthy",
    )?;
    let mine = "spec.nodeName=node-0";
    let ((ok, out), routes) = demo.via(0, || {
        demo.node_kubectl(
            0,
            &["get", "pods", "-A", "--field-selector", mine, "-o", columns],
        )
    });
    show(
        "kubectl get pods -A --field-selector spec.nodeName=node-0   # node-0's kubelet",
        &out,
    );
    check(
        ok && out.contains("pod-0-1") && only(&routes, "local-cache"),
        &format!(
            "node-0's kubelet still gets its own pods, from the node's local cache (routes {routes:?})"
        ),
    )?;
    let ((ok, out), routes) = demo.via(0, || {
        demo.node_kubectl(0, &["get", "pods", "-A", "-o", columns])
    });
    show("kubectl get pods -A   # node-0's agent", &out);
    check(
        ok && out.contains("pod-1-0") && only(&routes, "local-cache"),
        &format!(
            "the pool view node-0 got from the coordinator was kept in its cache: still answered (routes {routes:?})"
        ),
    )?;
    let (ok, out) = demo.node_kubectl(0, &["get", "configmaps", "-A", "-o", "name"]);
    show("kubectl get configmaps -A -o name   # node-0's agent", &out);
    check(
        !ok && out.contains("no list"),
        "what the node never read is refused with a clear reason, never an empty answer",
    )?;
    demo.show_status();

    n.step("the cloud and the coordinator come back")?;
    for pid in demo.etcd.pids() {
        signal(pid, libc::SIGCONT);
    }
    signal(demo.cloud.pid(), libc::SIGCONT);
    let back = Instant::now();
    let served = until(Duration::from_secs(15), || {
        let ((ok, _), routes) = demo.via(0, || demo.pod_kubectl(0, &["get", "pods", "-o", "name"]));
        (ok && only(&routes, "cloud")).then_some(())
    });
    check(
        served.is_some(),
        &format!(
            "the pod's kubectl is answered by the cloud again ({} ms)",
            back.elapsed().as_millis()
        ),
    )?;
    let replayed = until(Duration::from_secs(15), || {
        let (_, v) = demo.cloud_kubectl(&[
            "get",
            "node",
            "node-0",
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion}",
        ]);
        (v.trim() == "v1.32.0-offline").then_some(())
    });
    check(
        replayed.is_some(),
        "the status update made offline reached the cloud (replayed)",
    )?;
    demo.show_status();

    n.step("the coordinator is wiped and rebuilt empty (all members, data gone)")?;
    let wiped = Instant::now();
    {
        let _inside = demo.net.cloud.enter();
        demo.etcd.wipe_all();
    }
    let refilled = until(Duration::from_secs(30), || {
        (demo.etcd_keys("/registry/pods/") == 6 && demo.etcd_keys("/registry/endpointslices/") >= 2)
            .then_some(())
    });
    check(
        refilled.is_some(),
        &format!(
            "the hubs push their nodes' data again and the leader re-syncs: the pool is back in {} ms",
            wiped.elapsed().as_millis()
        ),
    )?;
    demo.show_status();

    n.step("the leader's hub dies (kill -9)")?;
    let leader = (0..NODES.len())
        .find(|i| demo.role(*i) == "leader")
        .unwrap_or(leader);
    let follower = 1 - leader;
    let watch_log = demo.dir.path().join("watch.log");
    let mut w = demo.node_ns(follower).command("kubectl");
    w.args(["get", "endpointslices", "-A", "-w", "-o", "name"])
        .env("KUBECONFIG", &demo.nodes[follower].node_kc)
        .stdout(std::fs::File::create(&watch_log)?)
        .stderr(Stdio::null());
    in_cgroup(&mut w, &demo.nodes[follower].cgroup.procs_file());
    let watcher = Proc::spawn(w, "watcher");
    let listed = until(Duration::from_secs(10), || {
        std::fs::read_to_string(&watch_log)
            .ok()
            .filter(|l| l.contains("svc-1"))
            .map(|_| ())
    });
    check(
        listed.is_some(),
        &format!("{}'s kube-proxy watches endpointslices", NODES[follower]),
    )?;
    if let Some(h) = demo.nodes[leader].hub.as_mut() {
        h.proc.kill9();
    }
    let killed = Instant::now();
    let slice = demo.dir.path().join("slice.yaml");
    std::fs::write(
        &slice,
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: after-failover\n  namespace: default\naddressType: IPv4\nendpoints: []\n",
    )?;
    let (ok, _) = demo.cloud_kubectl(&["apply", "-f", &slice.display().to_string()]);
    check(ok, "meanwhile an endpointslice is added in the cloud")?;
    let took_over = until(Duration::from_secs(LEASE_SECONDS + 5), || {
        (demo.role(follower) == "leader").then_some(())
    });
    check(
        took_over.is_some(),
        &format!(
            "{} leads the pool {} ms after the leader died (lease {LEASE_SECONDS} s)",
            NODES[follower],
            killed.elapsed().as_millis()
        ),
    )?;
    let seen = until(Duration::from_secs(15), || {
        std::fs::read_to_string(&watch_log)
            .ok()
            .filter(|l| l.contains("after-failover"))
            .map(|_| ())
    });
    show(
        "kubectl get endpointslices -A -w -o name",
        &std::fs::read_to_string(&watch_log).unwrap_or_default(),
    );
    check(
        seen.is_some(),
        "the open watch carried on and shows the new endpointslice",
    )?;
    drop(watcher);
    let (ok, _) = demo.pod_kubectl(leader, &["get", "pods", "-o", "name"]);
    check(
        ok,
        &format!(
            "{}'s pod reaches the cloud directly: interception failed open",
            NODES[leader]
        ),
    )?;
    if let Some(h) = &demo.nodes[leader].hub {
        let mut c = demo.node_ns(leader).command(hub_bin());
        c.args(["uninstall", "--pin-path"]).arg(&h.pin_path);
        show("hub uninstall", &process::output(c, "hub uninstall"));
    }
    demo.nodes[leader].hub = None;
    demo.show_status();

    n.step("clean up")?;
    let names: Vec<String> = std::iter::once(demo.net.cloud.name().to_string())
        .chain(demo.net.nodes.iter().map(|n| n.name().to_string()))
        .chain(demo.nodes.iter().map(|n| n.pod.name().to_string()))
        .collect();
    let pins: Vec<PathBuf> = demo
        .nodes
        .iter()
        .filter_map(|n| n.hub.as_ref().map(|h| h.pin_path.clone()))
        .collect();
    drop(demo);
    let left = Command::new("ip").args(["netns", "list"]).output()?;
    let left = String::from_utf8_lossy(&left.stdout).into_owned();
    check(
        !names.iter().any(|n| left.contains(n.as_str())),
        "no demo namespace left",
    )?;
    check(
        pins.iter().all(|p| !p.exists()),
        "no pinned eBPF object left",
    )?;
    println!("\ndemo: every step passed");
    Ok(())
}
