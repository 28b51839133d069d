//! `cargo xtask demo`: the whole system, as far as it exists, on this one machine.
//!
//! A node namespace holds the cloud (the Kubernetes API stand-in, at an address the demo
//! assigns) and the hub; a "pod" namespace joined by a veth runs kubectl with an
//! in-cluster-style kubeconfig pointing at the unchanged apiserver address. Each step
//! checks what a user would see; the demo exits non-zero if any check fails, and removes
//! everything it created on every exit path, Ctrl-C included.
use std::{
    io::BufRead,
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
    hub::HubProc,
    hub_bin,
    netns::Netns,
    process::{self, Proc, in_cgroup},
};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The cloud apiserver's address: what kubeconfigs and pods use, unchanged throughout.
const CLOUD: &str = "169.254.20.1:443";
const HUB_ADDRESS: &str = "169.254.2.1";
const NODE: &str = "edge-1";

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
    println!("  [{}] {what}", if ok { " ok " } else { "FAIL" });
    ensure!(ok, "check failed: {what}");
    Ok(())
}

fn show(title: &str, text: &str) {
    println!("  $ {title}");
    for line in text.lines() {
        println!("    {line}");
    }
}

/// Runs kubectl in the pod namespace and cgroup; (success, stdout+stderr).
fn pod_kubectl(
    pod: &Netns,
    pods: &Cgroup,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> (bool, String) {
    let mut c = pod.command("kubectl");
    c.args(args)
        .arg("--request-timeout=5s")
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null());
    in_cgroup(&mut c, &pods.procs_file());
    match c.output() {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        ),
        Err(e) => (false, e.to_string()),
    }
}

fn hub_status(node: &Netns) -> String {
    let mut c = node.command(hub_bin());
    c.args(["status"]);
    process::output(c, "hub status")
}

fn signal(p: &Proc, sig: libc::c_int) {
    // SAFETY: kill(2) of a child this demo started.
    unsafe { libc::kill(p.pid() as i32, sig) };
}

pub fn run(pause: bool) -> Result<()> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let mut n = Narrator { step: 0, pause };

    n.step("a node, a pod, the pods' cgroup, and the cloud apiserver")?;
    let node = Netns::new("dn");
    let pod = Netns::new("dp");
    let pods = Cgroup::new("demo");
    let dir = TempDir::new("demo");
    node.add_local_address("169.254.20.1/32");
    node.veth_to(
        &pod,
        ("dnode0", "169.254.30.1/30"),
        ("dpod0", "169.254.30.2/30"),
    );
    pod.ip(&["route", "add", "169.254.0.0/16", "via", "169.254.30.1"]);
    let mut cmd = node.command(bin_dir().join("hub-apiserver"));
    cmd.args([
        "--listen",
        CLOUD,
        "--nodes",
        "2",
        "--pods-per-node",
        "3",
        "--services",
        "2",
        "--hub-pki",
        NODE,
        "--dir",
    ])
    .arg(dir.path());
    let cloud = Proc::spawn_until_line(cmd, "cloud", "ready", Duration::from_secs(10));
    let ca = std::fs::read_to_string(dir.path().join("ca.crt"))?;
    let kc = dir.path().join("pod.kubeconfig");
    write_kubeconfig(
        &kc,
        &format!("https://{CLOUD}"),
        &ca,
        Credentials::Token("pod-token"),
    )?;
    println!(
        "  cloud: the Kubernetes API stand-in on {CLOUD} in node namespace {}",
        node.name()
    );
    println!(
        "  pod namespace {} (veth), kubeconfig: server https://{CLOUD}, the pod's token",
        pod.name()
    );

    n.step("without the hub, the pod's kubectl talks to the cloud directly")?;
    let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods", "-o", "wide"]);
    show("kubectl get pods -o wide", &out);
    check(
        ok && out.contains("pod-1-2"),
        "kubectl lists the pods straight from the cloud",
    )?;

    n.step("start the hub: eBPF on the pods' cgroup, TLS proxy, the cloud address as VIP")?;
    let d = dir.path().display();
    let mut hub = HubProc::start_yaml(Some(&node), "127.0.0.1:10267", None, |pin, cache| {
        format!(
            "nodeName: {NODE}\ncloud:\n  servers: [\"https://{CLOUD}\"]\n  caFile: {d}/ca.crt\n  certFile: {d}/hub-node.crt\n  keyFile: {d}/hub-node.key\nintercept:\n  cgroupPath: {}\n  hubAddress: {HUB_ADDRESS}\n  vips: [\"{CLOUD}\"]\n  pinPath: {}\ntls:\n  certFile: {d}/hub-serving.crt\n  keyFile: {d}/hub-serving.key\n  clientCaFile: {d}/ca.crt\ncache:\n  dir: {}\n  components: [kubelet, kube-proxy, flanneld, coredns, hub, kubectl]\n",
            pods.path().display(),
            pin.display(),
            cache.display()
        )
    });
    println!(
        "  the hub makes {HUB_ADDRESS} local itself (hub0, or lo:hub where there is no dummy driver)"
    );
    show("hub status", &hub_status(&node));

    n.step("the same kubectl, unchanged, now goes through the hub")?;
    let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods,svc"]);
    show("kubectl get pods,svc", &out);
    check(
        ok && out.contains("service/svc-1"),
        "kubectl works through the hub",
    )?;
    // kubectl's table output is a rendering; a plain list is what the cache keeps. The
    // demo caches kubectl (besides kubelet, kube-proxy, ...) so the next step can show it.
    let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods,svc", "-o", "name"]);
    check(
        ok && out.contains("pod/pod-1-0"),
        "kubectl's lists pass through the hub, which keeps a copy in its local cache",
    )?;
    let (_, can) = pod_kubectl(&pod, &pods, &kc, &["auth", "can-i", "list", "secrets"]);
    check(
        can.trim_start().starts_with("no"),
        "the cloud still judges the pod's own token (can-i list secrets: no)",
    )?;
    let status = hub.status();
    let via_hub = status["routes"]["cloud"]["requests"].as_u64().unwrap_or(0);
    check(
        via_hub > 0,
        &format!("hub status counts {via_hub} requests routed to the cloud"),
    )?;
    let mut c = Command::new(hub_bin());
    c.args(["bpf", "status", "--pin-path"]).arg(&hub.pin_path);
    show("hub bpf status", &process::output(c, "hub bpf status"));

    n.step("the cloud link goes dark (the cloud process is frozen)")?;
    signal(&cloud, libc::SIGSTOP);
    let frozen = Instant::now();
    let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods,svc"]);
    show("kubectl get pods,svc", &out);
    check(
        ok && out.contains("pod-1-0") && out.contains("svc-1"),
        &format!(
            "the same kubectl is answered from the node's local cache, {} ms after the freeze",
            frozen.elapsed().as_millis()
        ),
    )?;
    let status = hub.status();
    let cached = status["routes"]["local-cache"]["requests"]
        .as_u64()
        .unwrap_or(0);
    check(
        cached > 0,
        &format!("hub status counts {cached} requests answered from the local cache"),
    )?;
    let (ok, out) = pod_kubectl(
        &pod,
        &pods,
        &kc,
        &["create", "configmap", "offline-demo", "-n", "default"],
    );
    show("kubectl create configmap offline-demo", &out);
    check(
        !ok && out.contains("offline"),
        "a write the cloud must judge is refused with a clear error, never faked",
    )?;
    println!("  (the pool coordinator comes with the next issues)");
    show("hub status", &hub_status(&node));

    n.step("the cloud comes back")?;
    signal(&cloud, libc::SIGCONT);
    let back = Instant::now();
    let mut served = false;
    while back.elapsed() < Duration::from_secs(5) && !served {
        let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods"]);
        // kubectl prints the cache's Warning header while the hub answers offline.
        served = ok && !out.contains("local cache");
    }
    check(
        served,
        &format!(
            "traffic returns to the cloud within {} ms",
            back.elapsed().as_millis()
        ),
    )?;

    n.step("kill -9 the hub: interception fails open")?;
    hub.proc.kill9();
    let killed = Instant::now();
    let (ok, out) = pod_kubectl(&pod, &pods, &kc, &["get", "pods", "pod-1-0"]);
    show("kubectl get pods pod-1-0", &out);
    check(
        ok,
        &format!(
            "kubectl reaches the cloud directly {} ms after the hub died",
            killed.elapsed().as_millis()
        ),
    )?;
    let mut c = node.command(hub_bin());
    c.args(["uninstall", "--pin-path"]).arg(&hub.pin_path);
    show("hub uninstall", &process::output(c, "hub uninstall"));

    n.step("clean up")?;
    drop(hub);
    drop(cloud);
    drop(pod);
    drop(node);
    drop(pods);
    let leftover = Command::new("ip").args(["netns", "list"]).output()?;
    let leftover = String::from_utf8_lossy(&leftover.stdout).into_owned();
    check(!leftover.contains("htd"), "no demo namespace left")?;
    println!("\ndemo: every step passed");
    Ok(())
}
