//! Slow is not down: the cloud stays the route while it answers, however slowly, and
//! is found gone quickly when it is silent (frozen, killed). A request the cloud would
//! have answered never gets the hub's 503.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use hub_tests::{
    TempDir,
    apiserver::{client::Client, faults::FaultSettings, seed},
    bin_dir,
    hub::{HubProc, LOOPBACK_NODE, LoopbackHub},
    ports::free_port,
    process::Proc,
    scenario::Setup,
    wait_for,
};
use serde_json::Value;

const KUBELET: (&str, &str) = ("User-Agent", "kubelet/v1.32.13 (linux/amd64)");

/// An object that was never cached: the cloud answers 404, the cache could only say 503.
const NEVER_CACHED: &str = "/apis/storage.k8s.io/v1/csidrivers/never-cached";
/// A pod the stand-in seeds (`--pods-per-node`) and the cache keeps once read.
const CACHED: &str = "/api/v1/namespaces/default/pods/pod-0-3";

fn transitions(hub: &HubProc) -> u64 {
    hub.status()["cloud"][0]["transitions"].as_u64().unwrap()
}

fn text(r: &hub_tests::apiserver::client::Reply) -> String {
    String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned()
}

#[test]
fn a_slow_or_erring_cloud_is_never_abandoned() {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::cluster(store, 1, 10_000);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let get = |c: &Client, path: &str| {
        c.request("GET", path, &[KUBELET, ("Accept", "application/json")], &[])
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };
    assert_eq!(get(&kubelet, NEVER_CACHED).status, 404);
    wait_for("the first probe", Duration::from_secs(10), || {
        (hub.status()["cloud"][0]["healthy"] == true).then_some(())
    });

    // 1.5 s on every answer, the probes' too: each answer still comes from the cloud.
    s.cloud.set_faults(FaultSettings {
        latency_ms: 1500,
        ..Default::default()
    });
    for _ in 0..4 {
        let r = get(&kubelet, NEVER_CACHED);
        assert_eq!(
            r.status,
            404,
            "the cloud's answer, not the cache's: {}",
            text(&r)
        );
    }
    assert_eq!(
        transitions(&hub),
        0,
        "1.5 s answers are not an outage: {}",
        hub.status()["cloud"]
    );
    // A list of 10k pods that takes 5 s (and then a CPU-bound second or so to encode, during
    // which this debug-built cloud may not even answer PINGs): delivered whole.
    s.cloud.set_faults(FaultSettings {
        latency_ms: 5000,
        ..Default::default()
    });
    let started = Instant::now();
    let list = get(
        &kubelet,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
    );
    assert_eq!(list.status, 200, "{}", text(&list));
    assert_eq!(list.json()["items"].as_array().unwrap().len(), 10_000);
    eprintln!("a 10k-pod list answered after {:?}", started.elapsed());
    // 5 % of answers are 5xx: the cloud's own answers pass on, the cloud stays the route.
    s.cloud.set_faults(FaultSettings {
        error_permille: 50,
        ..Default::default()
    });
    let mut injected = 0;
    for _ in 0..200 {
        let r = get(&kubelet, NEVER_CACHED);
        match r.status {
            404 => {}
            503 if text(&r).contains("injected fault") => injected += 1,
            other => panic!("{other}: {}", text(&r)),
        }
    }
    assert!(injected > 0, "the fault knob answered no 5xx");
    assert!(
        hub.status()["cloud"][0]["healthy"] == true,
        "a few 5xx are not an outage"
    );
}

fn signal(p: &Proc, sig: i32) {
    // SAFETY: kill(2) on the pid of a child this test started.
    assert_eq!(unsafe { libc::kill(p.pid() as i32, sig) }, 0);
}

/// How long until the hub reports the cloud as `healthy`.
fn until_healthy_is(hub: &HubProc, healthy: bool) -> Duration {
    let started = Instant::now();
    wait_for(
        "the cloud's health to change",
        Duration::from_secs(20),
        || (hub.status()["cloud"][0]["healthy"] == healthy).then_some(()),
    );
    started.elapsed()
}

#[test]
fn short_freezes_are_ridden_out_and_a_frozen_or_killed_cloud_is_found_quickly() {
    // The cloud in a process of its own, so it can be stopped and killed.
    let dir = TempDir::new("health");
    let d = dir.path();
    let port = free_port();
    let mut cmd = Command::new(bin_dir().join("hub-apiserver"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--dir"])
        .arg(d)
        .args([
            "--nodes",
            "1",
            "--pods-per-node",
            "10",
            "--hub-pki",
            LOOPBACK_NODE,
        ]);
    let cloud = Proc::spawn_until_line(cmd, "hub-apiserver", "ready", Duration::from_secs(60));
    let (ca, node) = (
        d.join("ca.crt"),
        (d.join("hub-node.crt"), d.join("hub-node.key")),
    );
    let (serving_crt, serving_key) = (d.join("hub-serving.crt"), d.join("hub-serving.key"));
    let admin = format!("127.0.0.1:{}", free_port());
    let config = LoopbackHub {
        servers: vec![format!("https://127.0.0.1:{port}")],
        ca: Some(&ca),
        node: Some(&node),
        serving: Some((&serving_crt, &serving_key)),
        client_ca: Some(&ca),
        plain: free_port(),
        tls: None,
        admin: admin.clone(),
        extra: String::new(),
    };
    let hub = HubProc::start_yaml(None, &admin, None, |_, _| config.yaml(&d.join("state")));
    // The plain listener speaks as the node (as the kubelet): the cloud's answer is a 404.
    let get = |path: &str| -> (u16, String, Duration) {
        let asked = Instant::now();
        let out = Command::new("curl")
            .args(["-s", "-m", "20", "-A", KUBELET.1, "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{}{path}", config.plain))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.parse().unwrap_or(0), body.to_string(), asked.elapsed())
    };
    assert_eq!(get(NEVER_CACHED).0, 404);
    // One the cache keeps, to be asked while the cloud is frozen.
    let (code, body, _) = get(CACHED);
    assert_eq!(code, 200, "{body}");
    until_healthy_is(&hub, true);

    // CPU starved in bursts: stopped 300 ms, running 300 ms, ten times.
    let bursts = std::thread::scope(|scope| {
        let freezer = scope.spawn(|| {
            for _ in 0..10 {
                signal(&cloud, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(300));
                signal(&cloud, libc::SIGCONT);
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let mut answers = 0;
        while !freezer.is_finished() {
            let (code, body, _) = get(NEVER_CACHED);
            assert_eq!(code, 404, "a request the cloud would answer: {body}");
            answers += 1;
        }
        answers
    });
    assert!(bursts > 0);
    let status: Value = hub.status();
    assert_eq!(
        status["cloud"][0]["transitions"], 0,
        "300 ms freezes are not an outage: {}",
        status["cloud"]
    );

    // Frozen for good while the hub is idle: nothing tells yet. The first request finds
    // the cloud silent and gets the cached answer — the cloud's, byte for byte.
    signal(&cloud, libc::SIGSTOP);
    let (code, frozen_body, frozen) = get(CACHED);
    assert_eq!(
        code, 200,
        "a cached object while the cloud is frozen: {frozen_body}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&frozen_body).unwrap(),
        serde_json::from_str::<Value>(&body).unwrap(),
    );
    assert_eq!(
        hub.status()["cloud"][0]["healthy"],
        false,
        "marked down by the request"
    );
    signal(&cloud, libc::SIGCONT);
    let resumed = until_healthy_is(&hub, true);
    // Killed: its connection is reset, the hub checks at once and is refused.
    signal(&cloud, libc::SIGKILL);
    let killed = until_healthy_is(&hub, false);
    eprintln!(
        "{bursts} requests through the bursts; a request to the frozen cloud answered from the cache after {frozen:?}, back after {resumed:?}, killed found after {killed:?} (as seen by polling hub status)"
    );
    // The target is a second; the bounds leave room for a loaded machine and for the
    // polling itself, and still catch waiting for the old 400 ms probes or a connect
    // timeout (3 s).
    assert!(frozen < Duration::from_millis(1600), "frozen: {frozen:?}");
    assert!(killed < Duration::from_millis(1600), "killed: {killed:?}");
}

/// An idle hub costs the cloud at most one request a minute: its HTTP/2 connection, PINGed
/// when quiet for 15 s, tells that the server is there; a `/readyz` goes only after a
/// minute with nothing at all from the server (`cloud.idleCheckSeconds`).
#[test]
fn an_idle_hub_asks_the_cloud_at_most_once_a_minute() {
    let s = Setup::new(&["kubelet"]);
    seed::base(&s.cloud.state.store);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let r = kubelet
        .request("GET", NEVER_CACHED, &[KUBELET], &[])
        .unwrap();
    assert_eq!(r.status, 404);
    until_healthy_is(&hub, true);
    let requests = || -> u64 {
        let report = s.cloud.state.traffic.report();
        report.values().map(|u| u.requests).sum()
    };
    let readyz = || -> u64 {
        let report = s.cloud.state.traffic.report();
        report
            .values()
            .map(|u| u.verbs.get("health").copied().unwrap_or(0))
            .sum()
    };
    let (before, readyz_before) = (requests(), readyz());
    let window = Duration::from_secs(70);
    let started = Instant::now();
    // Waits out the window (nothing to wait for: the point is that nothing happens),
    // watching that the hub still says the cloud is healthy.
    while started.elapsed() < window {
        assert_eq!(hub.status()["cloud"][0]["healthy"], true);
        std::thread::sleep(Duration::from_secs(1));
    }
    let (sent, probes) = (requests() - before, readyz() - readyz_before);
    eprintln!(
        "idle for {window:?}: {sent} requests to the cloud, {probes} of them /readyz; {:?}",
        s.cloud.state.traffic.report()
    );
    assert!(
        sent <= 1,
        "at most one request a minute ({sent} in {window:?})"
    );
}
