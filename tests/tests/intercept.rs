//! Issue 3 acceptance: transparent interception, for real, in namespaces and cgroups the
//! tests create. Every address is loopback or one the test assigned in its own namespace.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use hub_tests::{
    cgroup::Cgroup,
    hub::{HubProc, HubSpec},
    netns::Netns,
    privileged,
    probe::{HoldingClient, connect, upstream},
    process, wait_for,
};
use serde_json::Value;

const UPSTREAM: &str = "127.0.0.1:18443";
/// A loopback VIP nothing listens on: reaching the upstream through it proves redirection.
const VIP: &str = "127.0.10.1:443";

fn spec<'a>(cg: &'a Cgroup, vips: &'a [&'a str]) -> HubSpec<'a> {
    HubSpec {
        cloud: &["http://127.0.0.1:18443"],
        vips,
        hub_address: "127.0.0.1",
        hub_address6: None,
        cgroup: cg.path(),
        admin: "127.0.0.1:10267",
    }
}

fn recent_for_pid(status: &Value, pid: u64) -> Vec<Value> {
    status["recent"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["pid"].as_u64() == Some(pid))
        .cloned()
        .collect()
}

/// a + b: inside the cgroup a VIP connect lands in the hub and is relayed intact;
/// outside it the same connect is left alone.
#[test]
fn redirects_inside_the_cgroup_only() {
    if !privileged::check("redirects_inside_the_cgroup_only") {
        return;
    }
    let ns = Netns::new("a");
    let cg = Cgroup::new("a");
    let _up = upstream(&ns, &[UPSTREAM]);
    let hub = HubProc::start(&ns, &spec(&cg, &[VIP]), None);

    let inside = connect(&ns, VIP, 1, 1, Some(&cg));
    assert_eq!(inside["ok"], 1, "{inside}\nhub log:\n{}", hub.log());
    assert_eq!(inside["via_hub"], 1, "{inside}");

    let status = hub.status();
    let rec = recent_for_pid(&status, inside["pid"].as_u64().unwrap());
    assert_eq!(rec.len(), 1, "{status}");
    assert_eq!(rec[0]["original_dst"], VIP);
    assert_eq!(rec[0]["cgroup_id"].as_u64(), Some(cg.id()));
    assert_eq!(rec[0]["upstream"], UPSTREAM);

    // Outside the cgroup nobody rewrites the connect, and nothing listens on the VIP.
    let outside = connect(&ns, VIP, 1, 1, None);
    assert_eq!(outside["ok"], 0, "{outside}");
    assert_eq!(outside["failed"], 1);
    assert!(
        outside["errors"][0].as_str().unwrap().contains("refused"),
        "{outside}"
    );

    // SIGTERM: a clean exit that detaches the programs and removes the pins.
    let mut hub = hub;
    assert_eq!(
        hub.proc.terminate(Duration::from_secs(10)),
        Some(0),
        "{}",
        hub.log()
    );
    assert!(!hub.pin_path.exists(), "pins left after SIGTERM");
    let mut c = Command::new("bpftool");
    c.args(["cgroup", "show"]).arg(cg.path());
    let attached = process::output(c, "bpftool cgroup show");
    assert!(
        !attached.contains("hub_"),
        "still attached after SIGTERM:\n{attached}"
    );
}

/// c: an IPv6 VIP, and an IPv4-mapped connect to an IPv4 VIP, are redirected and the hub
/// records the right original destination for each.
#[test]
fn redirects_ipv6_and_v4_mapped() {
    if !privileged::check("redirects_ipv6_and_v4_mapped") {
        return;
    }
    let ns = Netns::new("c");
    let cg = Cgroup::new("c");
    let _up = upstream(&ns, &[UPSTREAM]);
    let vip6 = "[::1]:1443";
    let vips = [VIP, vip6];
    let mut s = spec(&cg, &vips);
    s.hub_address6 = Some("::1");
    let hub = HubProc::start(&ns, &s, None);

    let v6 = connect(&ns, vip6, 1, 1, Some(&cg));
    assert_eq!(
        (v6["ok"].as_u64(), v6["via_hub"].as_u64()),
        (Some(1), Some(1)),
        "{v6}"
    );
    let mapped = connect(&ns, "[::ffff:127.0.10.1]:443", 1, 1, Some(&cg));
    assert_eq!(
        (mapped["ok"].as_u64(), mapped["via_hub"].as_u64()),
        (Some(1), Some(1)),
        "{mapped}\n{}",
        hub.log()
    );

    let status = hub.status();
    let r6 = recent_for_pid(&status, v6["pid"].as_u64().unwrap());
    assert_eq!(r6[0]["original_dst"], vip6, "{status}");
    let rm = recent_for_pid(&status, mapped["pid"].as_u64().unwrap());
    assert_eq!(rm[0]["original_dst"], VIP, "{status}");
    assert_eq!(rm[0]["cgroup_id"].as_u64(), Some(cg.id()));
}

/// d: with the hub itself inside the cgroup and the VIP equal to the cloud address, the
/// hub's own upstream connect carries the bypass mark and is not redirected (no loop).
#[test]
fn hub_own_connections_are_not_redirected() {
    if !privileged::check("hub_own_connections_are_not_redirected") {
        return;
    }
    let ns = Netns::new("d");
    let cg = Cgroup::new("d");
    let _up = upstream(&ns, &[UPSTREAM]);
    let hub = HubProc::start(&ns, &spec(&cg, &[UPSTREAM]), Some(&cg.procs_file()));

    let r = connect(&ns, UPSTREAM, 3, 1, Some(&cg));
    assert_eq!(r["ok"], 3, "{r}\n{}", hub.log());
    // A miss says why: the programs' own counts and the hub's view of its connections.
    assert_eq!(
        r["via_hub"],
        3,
        "{r}\nbpf: {}\nstatus: {}",
        hub.bpf_status(),
        hub.status()["connections"]
    );
    let bpf = hub.bpf_status();
    let row = &bpf["vips"][0];
    assert_eq!(row["vip"], UPSTREAM);
    assert!(row["redirected"].as_u64().unwrap() >= 3, "{bpf}");
    assert!(row["bypassed"].as_u64().unwrap() >= 3, "{bpf}");
}

/// `hub trace` shows each connect a test makes, with the pid, command, cgroup, VIP, hub
/// listener and verdict the kernel saw: the client's connects as redirected, the hub's own
/// upstream connects (the VIP is the cloud address here) as bypassed. The programs write
/// to the trace buffer only while someone listens, and none of them prints to the
/// kernel's trace pipe.
#[test]
fn trace_lines_match_the_connections_made() {
    if !privileged::check("trace_lines_match_the_connections_made") {
        return;
    }
    let ns = Netns::new("t");
    let cg = Cgroup::new("t");
    let _up = upstream(&ns, &[UPSTREAM]);
    let hub = HubProc::start(&ns, &spec(&cg, &[UPSTREAM]), Some(&cg.procs_file()));
    let hub_pid = hub.proc.pid() as u64;
    assert_eq!(
        hub.bpf_status()["tracing"],
        false,
        "traced with no listener"
    );

    let (mut tracing, lines) = process::Proc::spawn_collecting(
        hub.cli(&["trace", "--admin", "127.0.0.1:10267", "--output", "json"]),
        "hub trace",
    );
    wait_for(
        "the trace to switch tracing on",
        Duration::from_secs(10),
        || (hub.bpf_status()["tracing"] == true).then_some(()),
    );

    let r = connect(&ns, UPSTREAM, 3, 1, Some(&cg));
    assert_eq!(
        (r["ok"].as_u64(), r["via_hub"].as_u64()),
        (Some(3), Some(3)),
        "{r}"
    );
    let client_pid = r["pid"].as_u64().unwrap();
    let parsed = || -> Vec<Value> {
        lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    let by = |pid: u64| -> Vec<Value> {
        parsed()
            .into_iter()
            .filter(|l| l["pid"].as_u64() == Some(pid))
            .collect()
    };
    wait_for(
        "the client's and the hub's connects in the trace",
        Duration::from_secs(10),
        || (by(client_pid).len() >= 3 && by(hub_pid).len() >= 3).then_some(()),
    );

    let listener = hub.status()["vips"][0]["listener"]
        .as_str()
        .expect("the VIP's listener")
        .to_string();
    let client = by(client_pid);
    assert_eq!(client.len(), 3, "one line per connect: {client:?}");
    for l in &client {
        assert_eq!(l["kind"], "connect", "{l}");
        assert_eq!(l["verdict"], "redirected", "{l}");
        assert_eq!(l["originalDst"], UPSTREAM, "{l}");
        assert_eq!(l["redirectedTo"], listener.as_str(), "{l}");
        assert_eq!(l["comm"], "hub-probe", "{l}");
        assert_eq!(l["cgroupId"].as_u64(), Some(cg.id()), "{l}");
        assert_eq!(l["cgroup"], cg.path().display().to_string(), "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    // The hub relays each client connection over a connection of its own, which the
    // programs must leave alone; its cloud probes are bypassed too.
    for l in by(hub_pid) {
        assert_eq!(l["verdict"], "bypassed", "{l}");
        assert_eq!(l["originalDst"], UPSTREAM, "{l}");
        assert_eq!(l["redirectedTo"], Value::Null, "{l}");
        assert_eq!(l["comm"], "hub", "{l}");
    }
    // Only the client and the hub are in the cgroup: nothing else is traced.
    for l in parsed() {
        let pid = l["pid"].as_u64();
        assert!(pid == Some(client_pid) || pid == Some(hub_pid), "{l}");
    }

    // Filters and the text form: only this pid, one line.
    let text = std::thread::scope(|s| {
        let one = s.spawn(|| {
            let mut c = hub.cli(&["trace", "--admin", "127.0.0.1:10267", "--vip", UPSTREAM]);
            c.args(["--count", "1", "--cgroup"]).arg(cg.path());
            process::output(c, "hub trace --count 1")
        });
        let mut next = None;
        wait_for("a text trace's connect", Duration::from_secs(20), || {
            if one.is_finished() {
                return Some(());
            }
            next = Some(connect(&ns, UPSTREAM, 1, 1, Some(&cg)));
            std::thread::sleep(Duration::from_millis(100));
            None
        });
        one.join().unwrap()
    });
    let text_line = text.lines().next().unwrap_or_default();
    assert!(
        text_line.contains(&format!("{UPSTREAM} -> ")) && text_line.contains("hub-probe"),
        "{text}"
    );
    assert!(text_line.ends_with(" redirected"), "{text}");

    tracing.kill9();
    wait_for(
        "tracing to switch off once no one listens",
        Duration::from_secs(10),
        || (hub.bpf_status()["tracing"] == false).then_some(()),
    );
    let bpf = hub.bpf_status();
    assert_eq!(bpf["vips"][0]["trace_lost"], 0, "{bpf}");

    // Nothing in the programs writes to the kernel's trace pipe (bpf_trace_printk), which
    // `bpftool prog tracelog` would show.
    for prog in bpf["programs"].as_array().unwrap() {
        let id = prog["id"].as_u64().unwrap().to_string();
        let mut c = Command::new("bpftool");
        c.args(["prog", "dump", "xlated", "id", &id]);
        let code = process::output(c, "bpftool prog dump xlated");
        assert!(!code.contains("trace_printk"), "{}: {code}", prog["name"]);
        if prog["name"] == "hub_connect4" {
            assert!(
                code.contains("ringbuf_output"),
                "the connect hook traces: {code}"
            );
        }
    }
}

/// The programs' own log (aya-log) reaches `hub trace --logs`: with the daemon stopped, a
/// burst of connects fills the trace ring, the connect hook says so in its log, and the
/// daemon passes that on once it runs again.
#[test]
fn trace_logs_carry_the_programs_own_messages() {
    if !privileged::check("trace_logs_carry_the_programs_own_messages") {
        return;
    }
    let ns = Netns::new("tl");
    let cg = Cgroup::new("tl");
    let _up = upstream(&ns, &[UPSTREAM]);
    let hub = HubProc::start(&ns, &spec(&cg, &[UPSTREAM]), None);
    let (mut tracing, lines) = process::Proc::spawn_collecting(
        hub.cli(&[
            "trace",
            "--admin",
            "127.0.0.1:10267",
            "--output",
            "json",
            "--logs",
        ]),
        "hub trace --logs",
    );
    wait_for(
        "the trace to switch tracing on",
        Duration::from_secs(10),
        || (hub.bpf_status()["tracing"] == true).then_some(()),
    );
    let hub_signal = |sig| {
        // SAFETY: kill(2) on the hub this test started.
        assert_eq!(unsafe { libc::kill(hub.proc.pid() as i32, sig) }, 0);
    };
    // Nobody reads the ring now. More connects than it holds (256 KiB of 80-byte events
    // and their headers); each is only attempted: the stopped hub answers none.
    hub_signal(libc::SIGSTOP);
    let mut burst = ns.command(hub_tests::probe_bin());
    burst
        .args(["connect", "--to", UPSTREAM, "--count", "4000"])
        .args(["--concurrency", "32", "--no-wait", "--cgroup"])
        .arg(cg.path());
    let burst: Value =
        serde_json::from_str(&process::output(burst, "hub-probe connect --no-wait")).unwrap();
    hub_signal(libc::SIGCONT);
    assert_eq!(burst["direct"], 0, "every connect was redirected: {burst}");

    let message = wait_for(
        "the programs' message about the full ring",
        Duration::from_secs(30),
        || {
            lines
                .lock()
                .unwrap()
                .iter()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["kind"] == "log")
        },
    );
    assert_eq!(message["level"], "warn", "{message}");
    let text = message["message"].as_str().unwrap();
    assert!(
        text.contains("trace ring buffer is full") && text.contains("not traced"),
        "{message}"
    );
    let lost = hub.bpf_status()["vips"][0]["trace_lost"].as_u64().unwrap();
    assert!(lost > 0, "the loss is counted too");
    tracing.kill9();
}

/// e: kill -9 of the hub: within 1 s new connections reach the upstream directly, and
/// nothing of the hub stays attached to the cgroup.
#[test]
fn kill_9_fails_open_within_a_second() {
    if !privileged::check("kill_9_fails_open_within_a_second") {
        return;
    }
    let ns = Netns::new("e");
    let cg = Cgroup::new("e");
    let _up = upstream(&ns, &[UPSTREAM]);
    let mut hub = HubProc::start(&ns, &spec(&cg, &[UPSTREAM]), None);
    let before = connect(&ns, UPSTREAM, 1, 1, Some(&cg));
    assert_eq!(before["via_hub"], 1, "{before}");

    hub.proc.kill9();
    let killed = Instant::now();
    wait_for(
        "a direct connection after kill -9",
        Duration::from_secs(1),
        || {
            let r = connect(&ns, UPSTREAM, 1, 1, Some(&cg));
            (r["direct"] == 1).then_some(())
        },
    );
    let elapsed = killed.elapsed();
    assert!(elapsed <= Duration::from_secs(1), "took {elapsed:?}");

    let attached = process::output(
        {
            let mut c = Command::new("bpftool");
            c.args(["cgroup", "show"]).arg(cg.path());
            c
        },
        "bpftool cgroup show",
    );
    assert!(
        !attached.contains("hub_"),
        "programs still attached after kill -9:\n{attached}"
    );
    // The pins outlive a crash (maps only, harmless); uninstall removes them, twice is fine.
    for _ in 0..2 {
        // In the test's namespace: uninstall also removes that namespace's hub address.
        let mut c = ns.command(hub_tests::hub_bin());
        c.args(["uninstall", "--pin-path"]).arg(&hub.pin_path);
        process::output(c, "hub uninstall");
    }
    assert!(!hub.pin_path.exists());
}

/// A client that opened its keep-alive connection while the hub was not running reaches
/// the apiserver directly (interception fails open). When the hub starts it ends that
/// connection, and the client's next request goes through the hub.
/// The API stand-in at `addr` in `ns` (one node, two pods), with the PKI of a hub for node
/// `test-node` written to `dir`.
fn cloud_in(ns: &Netns, addr: &str, dir: &std::path::Path) -> hub_tests::process::Proc {
    let mut cmd = ns.command(hub_tests::bin_dir().join("hub-apiserver"));
    cmd.args(["--listen", addr, "--nodes", "1", "--pods-per-node", "2"])
        .args(["--hub-pki", "test-node", "--dir"])
        .arg(dir);
    hub_tests::process::Proc::spawn_until_line(
        cmd,
        "hub-apiserver",
        "ready",
        Duration::from_secs(10),
    )
}

#[test]
fn a_connection_opened_while_the_hub_was_down_is_intercepted_once_it_starts() {
    if !privileged::check(
        "a_connection_opened_while_the_hub_was_down_is_intercepted_once_it_starts",
    ) {
        return;
    }
    let ns = Netns::new("k");
    let cg = Cgroup::new("k");
    let _up = upstream(&ns, &[UPSTREAM]);
    let mut client = HoldingClient::start(&ns, UPSTREAM, &cg);
    let held = client.line();
    assert_eq!(held["direct"], true, "no hub yet: {held}");

    let hub = HubProc::start(&ns, &spec(&cg, &[UPSTREAM]), None);
    let status = hub.status();
    assert_eq!(
        status["bypass"]["ended_at_start"], 1,
        "{}",
        status["bypass"]
    );
    assert_eq!(status["bypass"]["now"], 0, "{}", status["bypass"]);
    let after = client.exchange();
    assert_eq!(after["reconnected"], true, "{after}");
    assert_eq!(
        after["direct"], false,
        "the next request goes through the hub: {after}"
    );
    assert!(
        after["echo"]
            .as_str()
            .is_some_and(|e| e.starts_with("echo:keepalive-0")),
        "{after}"
    );
}

/// The same for a client in a pod with its own network namespace: its socket is only
/// visible from inside that namespace, and the hub ends it there.
#[test]
fn a_pods_connection_opened_while_the_hub_was_down_is_intercepted_once_it_starts() {
    if !privileged::check(
        "a_pods_connection_opened_while_the_hub_was_down_is_intercepted_once_it_starts",
    ) {
        return;
    }
    let node = Netns::new("kn");
    let pod = Netns::new("kp");
    let cg = Cgroup::new("kp");
    // The VIP is an address this test assigned in the node namespace.
    node.add_local_address("169.254.21.1/32");
    node.veth_to(
        &pod,
        ("vkn0", "169.254.31.1/30"),
        ("vkp0", "169.254.31.2/30"),
    );
    pod.ip(&["route", "add", "169.254.0.0/16", "via", "169.254.31.1"]);
    let vip = "169.254.21.1:443";
    let _up = upstream(&node, &[vip]);
    let mut client = HoldingClient::start(&pod, vip, &cg);
    let held = client.line();
    assert_eq!(held["direct"], true, "no hub yet: {held}");

    let vips = [vip];
    let mut s = spec(&cg, &vips);
    let cloud = format!("http://{vip}");
    let clouds = [cloud.as_str()];
    s.cloud = &clouds;
    s.hub_address = "169.254.2.1";
    let hub = HubProc::start(&node, &s, None);
    let status = hub.status();
    assert_eq!(
        status["bypass"]["ended_at_start"],
        1,
        "{}\n{}",
        status["bypass"],
        hub.log()
    );
    assert_eq!(status["bypass"]["now"], 0, "{}", status["bypass"]);
    let after = client.exchange();
    assert_eq!(after["reconnected"], true, "{after}");
    assert_eq!(
        after["direct"], false,
        "the next request goes through the hub: {after}"
    );
}

/// Who may speak as the node: on the plain listener only root outside the pods' cgroups
/// (uid 1000 gets a 403); a process in the pods' cgroup is refused on every port of the
/// hub's own (plain, TLS, admin) and served as itself, with its token, through the VIP.
#[test]
fn only_root_outside_the_pods_cgroups_speaks_as_the_node() {
    if !privileged::check("only_root_outside_the_pods_cgroups_speaks_as_the_node") {
        return;
    }
    let ns = Netns::new("nr");
    let pods = Cgroup::new("nr");
    let dir = hub_tests::TempDir::new("nr");
    let cloud = "127.0.0.1:16443";
    let _standin = cloud_in(&ns, cloud, dir.path());
    let d = dir.path().display();
    let p = pods.path().display();
    let hub = HubProc::start_yaml(Some(&ns), "127.0.0.1:10267", None, |pin, cache| {
        format!(
            "nodeName: test-node\ncloud:\n  servers: [\"https://{cloud}\"]\n  caFile: {d}/ca.crt\n  certFile: {d}/hub-node.crt\n  keyFile: {d}/hub-node.key\nintercept:\n  cgroupPath: {p}\n  podsCgroupPath: {p}\n  hubAddress: 127.0.0.1\n  vips: [\"{cloud}\"]\n  pinPath: {}\ntls:\n  certFile: {d}/hub-serving.crt\n  keyFile: {d}/hub-serving.key\n  clientCaFile: {d}/ca.crt\nlisten:\n  proxy: 127.0.0.1:10261\n  tlsProxy: 127.0.0.1:10268\ncache:\n  dir: {}\n",
            pin.display(),
            cache.display()
        )
    });
    // One curl: (HTTP code, body). `as_user` runs it as that uid, `in_pods` in the pods'
    // cgroup.
    let curl = |url: &str, as_user: Option<u32>, in_pods: bool, token: Option<&str>| {
        let mut c = match as_user {
            Some(uid) => {
                let mut c = ns.command("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".into(),
                    "curl".into(),
                ]);
                c
            }
            None => ns.command("curl"),
        };
        c.args(["-s", "-m", "10", "-w", "\n%{http_code}", "--cacert"])
            .arg(dir.path().join("ca.crt"));
        if let Some(t) = token {
            c.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        c.arg(url);
        if in_pods {
            hub_tests::process::in_cgroup(&mut c, &pods.procs_file());
        }
        let out = process::output(c, "curl");
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
        (code.to_string(), body.to_string())
    };
    let plain = "http://127.0.0.1:10261/apis/storage.k8s.io/v1/csidrivers";
    // Root outside the pods' cgroups: the node (the cloud lets a node list CSIDrivers).
    let (code, body) = curl(plain, None, false, None);
    assert_eq!(code, "200", "{body}\n{}", hub.log());
    // Another user on the node: refused by the hub, naming the rule.
    let (code, body) = curl(plain, Some(1000), false, None);
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains("only for root on the node") && body.contains("uid 1000"),
        "{body}"
    );
    // A process in the pods' cgroup, on each of the hub's own ports: refused.
    let (code, body) = curl(plain, None, true, None);
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains("only through the apiserver address"),
        "{body}"
    );
    let tls = "https://127.0.0.1:10268/api/v1/namespaces/default/pods";
    let (code, body) = curl(tls, None, true, Some("pod-token"));
    assert_eq!(code, "403", "{body}");
    let (code, body) = curl("http://127.0.0.1:10267/healthz", None, true, None);
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        curl("http://127.0.0.1:10267/healthz", None, false, None).0,
        "200"
    );
    // The same process through the VIP: served as itself, with its own token.
    let vip = format!("https://{cloud}/api/v1/namespaces/default/pods");
    let (code, body) = curl(&vip, None, true, Some("pod-token"));
    assert_eq!(code, "200", "{body}");
    let (code, _) = curl(
        &format!("https://{cloud}/api/v1/nodes"),
        None,
        true,
        Some("pod-token"),
    );
    assert_eq!(code, "403", "the pod's token, not the node's identity");
}

/// f: a client in a separate "pod" namespace, joined to the node by a veth, reaches the
/// hub on the hub address 169.254.2.1, not 127.0.0.1. The test does not assign that
/// address: the hub makes it local itself (hub0, or `lo:hub` where the kernel has no dummy
/// driver), and `hub uninstall` removes it again.
#[test]
fn pod_namespace_reaches_hub_address() {
    if !privileged::check("pod_namespace_reaches_hub_address") {
        return;
    }
    let node = Netns::new("fn");
    let pod = Netns::new("fp");
    let cg = Cgroup::new("f");
    // The VIP is an address this test assigned in the node namespace.
    node.add_local_address("169.254.20.1/32");
    node.veth_to(&pod, ("vn0", "169.254.30.1/30"), ("vp0", "169.254.30.2/30"));
    pod.ip(&["route", "add", "169.254.0.0/16", "via", "169.254.30.1"]);
    let _up = upstream(&node, &["169.254.20.1:443"]);
    let mut s = spec(&cg, &["169.254.20.1:443"]);
    s.cloud = &["http://169.254.20.1:443"];
    s.hub_address = "169.254.2.1";
    let hub = HubProc::start(&node, &s, None);

    let r = connect(&pod, "169.254.20.1:443", 2, 1, Some(&cg));
    assert_eq!(r["ok"], 2, "{r}\n{}", hub.log());
    assert_eq!(r["via_hub"], 2, "{r}");
    let status = hub.status();
    let rec = recent_for_pid(&status, r["pid"].as_u64().unwrap());
    assert_eq!(rec.len(), 2);
    assert!(
        rec.iter()
            .all(|c| c["client"].as_str().unwrap().starts_with("169.254.30.2:"))
    );
    assert_eq!(
        status["vips"][0]["listener"]
            .as_str()
            .unwrap()
            .split(':')
            .next(),
        Some("169.254.2.1")
    );
}

/// g + h: 1000 connections at concurrency 50 all succeed with the right origins; the
/// origin map is empty afterwards; bpftool shows named fields and hub bpf status agrees.
#[test]
fn thousand_connections_origins_and_map_dump() {
    if !privileged::check("thousand_connections_origins_and_map_dump") {
        return;
    }
    let ns = Netns::new("g");
    let cg = Cgroup::new("g");
    let _up = upstream(&ns, &[UPSTREAM]);
    let hub = HubProc::start(&ns, &spec(&cg, &[VIP]), None);

    let r = connect(&ns, VIP, 1000, 50, Some(&cg));
    assert_eq!(r["ok"], 1000, "{r}\n{}", hub.log());
    assert_eq!(r["via_hub"], 1000, "{r}");
    let status = hub.status();
    let pid = r["pid"].as_u64().unwrap();
    let rec = recent_for_pid(&status, pid);
    assert_eq!(
        rec.len(),
        1000,
        "every connection is attributed to the probe"
    );
    assert!(
        rec.iter()
            .all(|c| c["original_dst"] == VIP && c["cgroup_id"].as_u64() == Some(cg.id()))
    );
    assert_eq!(
        status["connections"]["origin_unknown"], 0,
        "{}",
        status["connections"]
    );

    wait_for("origin map to drain", Duration::from_secs(5), || {
        let b = hub.bpf_status();
        (b["origins_in_flight"] == 0 && b["pending"] == 0).then_some(())
    });

    let dump = process::output(
        {
            let mut c = Command::new("bpftool");
            c.args(["--json", "map", "dump", "pinned"])
                .arg(hub.pin_path.join("HUB_VIPS"));
            c
        },
        "bpftool map dump",
    );
    let dump: Value = serde_json::from_str(&dump).expect("bpftool json");
    let formatted = &dump[0]["formatted"];
    assert!(formatted["key"]["port"] == 443, "named key fields: {dump}");
    assert!(
        formatted["value"]["target"]["port"].is_u64(),
        "named value fields: {dump}"
    );

    let bpf = hub.bpf_status();
    assert_eq!(
        bpf["vips"].as_array().unwrap().len(),
        dump.as_array().unwrap().len()
    );
    assert_eq!(bpf["vips"][0]["vip"], VIP);
    let listener_port = formatted["value"]["target"]["port"].as_u64().unwrap();
    assert!(
        bpf["vips"][0]["target"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{listener_port}"))
    );
    assert!(
        bpf["vips"][0]["redirected"].as_u64().unwrap() >= 1000,
        "{bpf}"
    );
    assert_eq!(bpf["links"].as_array().unwrap().len(), 3, "{bpf}");
}

/// Issue 5 (a, b) through real interception: kubectl in a client cgroup with an
/// in-cluster-style kubeconfig pointing at the unchanged VIP (the cloud address) works
/// through the hub's TLS proxy, the cloud sees the pod's own token, and a kubelet-style
/// client certificate is forwarded as the node identity.
#[test]
fn kubectl_through_the_intercepted_vip_keeps_its_own_identity() {
    if !privileged::check("kubectl_through_the_intercepted_vip_keeps_its_own_identity") {
        return;
    }
    let ns = Netns::new("k");
    let cg = Cgroup::new("k");
    let dir = hub_tests::TempDir::new("kp");
    let cloud = "127.0.0.1:16443";
    let _standin = cloud_in(&ns, cloud, dir.path());
    let d = dir.path().display();
    let hub = HubProc::start_yaml(Some(&ns), "127.0.0.1:10267", None, |pin, cache| {
        format!(
            "nodeName: test-node\ncloud:\n  servers: [\"https://{cloud}\"]\n  caFile: {d}/ca.crt\n  certFile: {d}/hub-node.crt\n  keyFile: {d}/hub-node.key\nintercept:\n  cgroupPath: {}\n  hubAddress: 127.0.0.1\n  vips: [\"{cloud}\"]\n  pinPath: {}\ntls:\n  certFile: {d}/hub-serving.crt\n  keyFile: {d}/hub-serving.key\n  clientCaFile: {d}/ca.crt\nlisten:\n  tlsProxy: 127.0.0.1:10268\ncache:\n  dir: {}\n  components: [kubectl]\n",
            cg.path().display(),
            pin.display(),
            cache.display()
        )
    });
    assert_eq!(hub.status()["data_path"], "proxy");
    // An in-cluster-style kubeconfig: the VIP, the cluster CA, the pod's token.
    let kc = dir.path().join("pod.kubeconfig");
    let ca_pem = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
    hub_tests::apiserver::write_kubeconfig(
        &kc,
        &format!("https://{cloud}"),
        &ca_pem,
        hub_tests::apiserver::Credentials::Token("pod-token"),
    )
    .unwrap();
    let kubectl = |args: &[&str], stdin: Option<&str>| -> (bool, String, u32) {
        let mut c = ns.command("kubectl");
        c.args(args)
            .env("KUBECONFIG", &kc)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        hub_tests::process::in_cgroup(&mut c, &cg.procs_file());
        let mut child = c.spawn().unwrap();
        let pid = child.id();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            use std::io::Write;
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text, pid)
    };
    let (ok, pods, pid) = kubectl(&["get", "pods", "-o", "name"], None);
    assert!(ok, "{pods}\n{}", hub.log());
    assert_eq!(pods.lines().count(), 2, "{pods}");
    // The cloud judged the pod's token, not the hub's node identity.
    assert_eq!(
        kubectl(&["auth", "can-i", "list", "pods"], None).1.trim(),
        "yes"
    );
    assert!(
        kubectl(&["auth", "can-i", "list", "secrets"], None)
            .1
            .starts_with("no")
    );
    let (ok, denied, _) = kubectl(&["get", "secrets"], None);
    assert!(!ok && denied.contains("forbidden"), "{denied}");
    let (ok, logs, _) = kubectl(&["logs", "pod-0-0"], None);
    assert!(ok && logs.starts_with("pod-0-0/main line 1"), "{logs}");
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: via-vip\ndata:\n  k: v\n";
    let (ok, applied, _) = kubectl(&["apply", "-f", "-"], Some(cm));
    assert!(ok && applied.contains("created"), "{applied}");
    let (ok, echoed, _) = kubectl(
        &["exec", "-i", "pod-0-0", "--", "cat"],
        Some("exec via the VIP\n"),
    );
    assert!(ok && echoed.contains("exec via the VIP"), "{echoed}");
    let (ok, w, _) = kubectl(&["get", "pods", "-w", "--request-timeout=2s"], None);
    assert!(w.contains("pod-0-1"), "watch output: {w} (ok={ok})");
    // The connection was intercepted: the hub attributes it to kubectl's pid and cgroup.
    let status = hub.status();
    let rec = recent_for_pid(&status, u64::from(pid));
    assert!(!rec.is_empty(), "{status}");
    assert_eq!(rec[0]["original_dst"], cloud);
    assert_eq!(rec[0]["cgroup_id"].as_u64(), Some(cg.id()));
    // Its cached list is kept under kubectl *in that cgroup* (design.md §6).
    let mut ls = hub.cli(&["cache", "ls", "--output", "json", "--dir"]);
    ls.arg(hub.cache_dir());
    let entries: Value = serde_json::from_str(&process::output(ls, "hub cache ls")).unwrap();
    let component = format!("kubectl@cgroup-{}", cg.id());
    assert!(
        entries
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["component"] == component.as_str() && e["kind"] == "Pod"),
        "{entries}"
    );

    // A kubelet-style client certificate through the VIP: forwarded as the node.
    let mut curl = ns.command("curl");
    curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(dir.path().join("ca.crt"))
        .arg("--cert")
        .arg(dir.path().join("kubelet.crt"))
        .arg("--key")
        .arg(dir.path().join("kubelet.key"))
        // Only the node itself (or an admin) may list the node's pods cluster-wide.
        .arg(format!(
            "https://{cloud}/api/v1/pods?fieldSelector=spec.nodeName%3Dtest-node"
        ));
    hub_tests::process::in_cgroup(&mut curl, &cg.procs_file());
    assert_eq!(process::output(curl, "curl as kubelet"), "200");
}
