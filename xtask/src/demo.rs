//! `cargo xtask demo`: the whole system, as far as it exists, on this one machine.
//!
//! Today that is transparent interception end to end: a node namespace holding the hub
//! address, a "pod" namespace joined to it by a veth, a cgroup with the hub's programs
//! attached, and a TCP echo standing in for the cloud apiserver (the Kubernetes API
//! stand-in replaces it when issue 4 lands). Every step checks what a user would see and
//! the demo exits non-zero if any check fails. Everything it creates is removed on exit,
//! also on Ctrl-C.
use std::{
    io::BufRead,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use hub_tests::{
    cgroup::Cgroup,
    hub::{HubProc, HubSpec},
    hub_bin,
    netns::Netns,
    probe::{connect, upstream},
    process,
};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

const CLOUD: &str = "169.254.20.1:443";
const HUB_ADDRESS: &str = "169.254.2.1";

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

pub fn run(pause: bool) -> Result<()> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let mut n = Narrator { step: 0, pause };

    n.step("a node, a pod, a cgroup, and a stand-in cloud")?;
    let node = Netns::new("dn");
    let pod = Netns::new("dp");
    let pods = Cgroup::new("demo");
    node.add_local_address("169.254.20.1/32");
    node.veth_to(
        &pod,
        ("dnode0", "169.254.30.1/30"),
        ("dpod0", "169.254.30.2/30"),
    );
    pod.ip(&["route", "add", "169.254.0.0/16", "via", "169.254.30.1"]);
    let _cloud = upstream(&node, &[CLOUD]);
    println!(
        "  node namespace {} (hub address {HUB_ADDRESS}), pod namespace {}",
        node.name(),
        pod.name()
    );
    println!(
        "  cloud apiserver stand-in: TCP echo on {CLOUD}; pods' cgroup {}",
        pods.path().display()
    );

    n.step("without the hub, the pod talks to the cloud directly")?;
    let r = connect(&pod, CLOUD, 1, 1, Some(&pods));
    check(r["direct"] == 1, "pod reached the cloud directly")?;

    n.step("start the hub: eBPF attached to the pods' cgroup, VIP = the cloud address")?;
    println!("  the hub makes its address {HUB_ADDRESS} local itself (hub0, or lo:hub here)");
    let spec = HubSpec {
        cloud: &["http://169.254.20.1:443"],
        vips: &[CLOUD],
        hub_address: HUB_ADDRESS,
        hub_address6: None,
        cgroup: pods.path(),
        admin: "127.0.0.1:10267",
    };
    let mut hub = HubProc::start(&node, &spec, None);
    let mut c = node.command(hub_bin());
    c.args(["status"]);
    show("hub status", &process::output(c, "hub status"));

    n.step("the pod's unchanged connect() now goes through the hub")?;
    let r = connect(&pod, CLOUD, 20, 5, Some(&pods));
    check(
        r["ok"] == 20 && r["via_hub"] == 20,
        "20/20 pod connections relayed by the hub",
    )?;
    let status = hub.status();
    let from_pod = status["recent"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["pid"] == r["pid"]).count())
        .unwrap_or(0);
    check(
        from_pod == 20,
        "the hub knows each connection's pid, cgroup and original destination",
    )?;
    let mut c = Command::new(hub_bin());
    c.args(["bpf", "status", "--pin-path"]).arg(&hub.pin_path);
    show("hub bpf status", &process::output(c, "hub bpf status"));

    n.step("kill -9 the hub: interception fails open")?;
    hub.proc.kill9();
    let killed = Instant::now();
    let mut direct_after = None;
    while killed.elapsed() < Duration::from_secs(2) {
        if connect(&pod, CLOUD, 1, 1, Some(&pods))["direct"] == 1 {
            direct_after = Some(killed.elapsed());
            break;
        }
    }
    check(
        direct_after.is_some_and(|d| d <= Duration::from_secs(1)),
        &format!(
            "pod reaches the cloud directly {} after the hub died",
            direct_after.map_or("never".into(), |d| format!("{} ms", d.as_millis()))
        ),
    )?;
    let mut c = node.command(hub_bin());
    c.args(["uninstall", "--pin-path"]).arg(&hub.pin_path);
    show("hub uninstall", &process::output(c, "hub uninstall"));
    let mut c = node.command("ip");
    c.args(["-o", "addr", "show"]);
    let addrs = process::output(c, "ip addr show");
    check(
        !addrs.contains(HUB_ADDRESS),
        "uninstall removed the hub address",
    )?;

    n.step("clean up")?;
    drop(hub);
    drop(pod);
    drop(node);
    drop(pods);
    let leftover = Command::new("ip").args(["netns", "list"]).output()?;
    let leftover = String::from_utf8_lossy(&leftover.stdout).into_owned();
    check(!leftover.contains("htd"), "no demo namespace left")?;
    println!("\ndemo: every step passed");
    Ok(())
}
