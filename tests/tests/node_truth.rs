//! What a real node behind the hub sees through an outage, made truthful and quiet: what
//! the node wrote it can read back offline (its CSINode, never read from the cloud); a
//! relayed watch ends cleanly when the cloud dies (the terminating chunk on HTTP/1.1,
//! END_STREAM on HTTP/2, never a reset); the hub's own Warning reaches a client once a
//! minute, not once per answer; and a queued lease renewal or node status never races
//! the kubelet's own write after the cloud's return.
use std::time::Duration;

use hub_tests::{
    apiserver::{
        ADMIN_TOKEN,
        client::{Chunk, Client},
        seed,
    },
    h2::{End, H2Client},
    hub::{HubProc, LOOPBACK_NODE},
    scenario::Setup,
    wait_for,
};
use serde_json::{Value, json};

const NODE: &str = LOOPBACK_NODE;
const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";

fn node_setup() -> Setup {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::namespace(store, "kube-node-lease");
    seed::node(store, NODE);
    for i in 0..3 {
        seed::pod(store, "ns1", &format!("p-{i}"), NODE, "web");
    }
    s
}

fn kubelet_call(c: &Client, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let bytes = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let mut headers = vec![("User-Agent", KUBELET), ("Accept", "application/json")];
    if body.is_some() {
        let ct = if method == "PATCH" {
            "application/strategic-merge-patch+json"
        } else {
            "application/json"
        };
        headers.push(("Content-Type", ct));
    }
    let r = c.request(method, path, &headers, &bytes).unwrap();
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

fn cloud_back(s: &Setup, hub: &HubProc) {
    s.cloud.start_listening().unwrap();
    wait_for(
        "the hub to see the cloud back",
        Duration::from_secs(20),
        || (hub.status()["cloud"][0]["healthy"] == true).then_some(()),
    );
}

/// The kubelet reads its CSINode (404), creates it (201) and never reads it again while
/// the cloud is up; offline its GET is answered from what the create returned. So is a
/// pod's status the kubelet patched.
#[test]
fn what_the_node_wrote_it_reads_back_offline() {
    let s = node_setup();
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let csinode = format!("/apis/storage.k8s.io/v1/csinodes/{NODE}");
    assert_eq!(kubelet_call(&kubelet, "GET", &csinode, None).0, 404);
    let object = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": NODE}, "spec": {"drivers": []}});
    let (code, created) = kubelet_call(
        &kubelet,
        "POST",
        "/apis/storage.k8s.io/v1/csinodes",
        Some(&object),
    );
    assert_eq!(code, 201, "{created}");
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Written"}]}});
    let (code, patched) = kubelet_call(
        &kubelet,
        "PATCH",
        "/api/v1/namespaces/ns1/pods/p-1/status",
        Some(&status),
    );
    assert_eq!(code, 200, "{patched}");
    hub.wait_stored();

    s.cloud_down(&hub);
    for path in [format!("{csinode}?resourceVersion=0"), csinode.clone()] {
        let (code, got) = kubelet_call(&kubelet, "GET", &path, None);
        assert_eq!(code, 200, "offline {path}: {got}");
        assert_eq!(got["metadata"]["name"], NODE);
        assert_eq!(
            got["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
    }
    let (code, pod) = kubelet_call(&kubelet, "GET", "/api/v1/namespaces/ns1/pods/p-1", None);
    assert_eq!(code, 200, "{pod}");
    assert_eq!(pod["status"]["conditions"][0]["reason"], "Written");
    assert_eq!(
        pod["metadata"]["resourceVersion"],
        patched["metadata"]["resourceVersion"]
    );
}

/// A watch relayed over HTTP/1.1: the cloud dies with the watch open; the client gets
/// every event as a whole line, then the terminating chunk (a direct connection to a
/// dying apiserver ends so; a cut connection is what client-go reports as an error).
#[test]
fn a_relayed_http1_watch_ends_with_its_terminating_chunk_when_the_cloud_dies() {
    let s = node_setup();
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let path = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&watch=true&resourceVersion=0&allowWatchBookmarks=true"
    );
    let mut w = kubelet
        .try_stream(
            &path,
            &[("User-Agent", KUBELET), ("Accept", "application/json")],
        )
        .unwrap();
    assert_eq!(w.status, 200);
    let mut body = Vec::new();
    let lines = |b: &[u8]| b.iter().filter(|c| **c == b'\n').count();
    while lines(&body) < 3 {
        match w.next_chunk(Duration::from_secs(10)) {
            Chunk::Data(d) => body.extend(d),
            other => panic!("before the cloud died: {other:?}"),
        }
    }
    s.cloud.stop_listening();
    let end = loop {
        match w.next_chunk(Duration::from_secs(30)) {
            Chunk::Data(d) => body.extend(d),
            other => break other,
        }
    };
    assert_eq!(
        end,
        Chunk::Ended,
        "the watch ends with its terminating chunk"
    );
    assert!(body.ends_with(b"\n"), "no event is cut short");
    for line in body.split(|c| *c == b'\n').filter(|l| !l.is_empty()) {
        serde_json::from_slice::<Value>(line).expect("every event whole");
    }
    drop(hub);
}

/// The same over HTTP/2, protobuf as kubelet watches: END_STREAM, never RST_STREAM.
#[test]
fn a_relayed_http2_watch_ends_with_end_stream_when_the_cloud_dies() {
    let s = node_setup();
    let hub = s.start_hub();
    let client = H2Client::connect(s.hub_addr(), s.ca.cert_der(), Some(&s.pki.kubelet)).unwrap();
    let path = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&watch=true&resourceVersion=0&allowWatchBookmarks=true"
    );
    let headers = [
        ("user-agent", KUBELET),
        (
            "accept",
            "application/vnd.kubernetes.protobuf,application/json",
        ),
    ];
    let mut w = client.open(&path, &headers).unwrap();
    assert_eq!(w.status, 200);
    let frames = |b: &[u8]| hub::kproto::watch_frames(b).0.len();
    w.read(Duration::from_secs(10), |b| frames(b) >= 3);
    assert_eq!(w.end, End::Open, "the watch is open");
    s.cloud.stop_listening();
    let end = w.read(Duration::from_secs(30), |_| false);
    assert_eq!(*end, End::Clean, "END_STREAM, not a reset");
    let (whole, used) = hub::kproto::watch_frames(&w.body);
    assert_eq!(used, w.body.len(), "no event is cut short");
    assert!(whole.len() >= 3);
    drop(hub);
}

/// Offline, 20 GETs on one connection carry the hub's "served from the cache" Warning
/// once; the other 19 are counted in hub_proxy_warnings_suppressed_total.
#[test]
fn offline_answers_warn_each_client_once_a_minute() {
    let s = node_setup();
    let hub = s.start_hub();
    let client = H2Client::connect(s.hub_addr(), s.ca.cert_der(), Some(&s.pki.kubelet)).unwrap();
    let headers = [("user-agent", KUBELET), ("accept", "application/json")];
    let pod = "/api/v1/namespaces/ns1/pods/p-0";
    assert_eq!(client.get(pod, &headers).unwrap().status, 200);
    hub.wait_stored();
    s.cloud_down(&hub);
    let mut warnings = 0;
    for i in 0..20 {
        let r = client.get(pod, &headers).unwrap();
        assert_eq!(
            r.status,
            200,
            "GET {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["metadata"]["name"], "p-0");
        warnings += r.headers.get_all("warning").iter().count();
    }
    assert_eq!(
        warnings, 1,
        "the first answer says where it came from, once"
    );
    let metrics = hub.admin_get("/metrics");
    assert!(
        metrics.contains("hub_proxy_warnings_suppressed_total{kind=\"local-cache\"} 19"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("warnings"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Lease renewals queued offline are superseded by the kubelet's own renewal after the
/// cloud's return: none is replayed, and the kubelet's renewals (made with the
/// resourceVersion its offline answers gave) succeed. Node status patches queued offline
/// with no newer one after the return: only the newest is replayed.
#[test]
fn queued_renewals_and_node_status_never_race_the_kubelet() {
    let s = node_setup();
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let lease_path = format!("{leases}/{NODE}");
    let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": NODE, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                 "renewTime": "2026-12-04T10:00:00.000000Z"}});
    let (code, created) = kubelet_call(
        &kubelet,
        "POST",
        &format!("{leases}?timeout=10s"),
        Some(&lease),
    );
    assert_eq!(code, 201, "{created}");
    lease = created;
    // kubelet reads its node (in protobuf) before it patches its status: offline its
    // patches are answered from that copy as it is, so each one is against the same node
    // and the newest carries everything.
    let read = kubelet
        .request(
            "GET",
            &format!("/api/v1/nodes/{NODE}"),
            &[
                ("User-Agent", KUBELET),
                (
                    "Accept",
                    "application/vnd.kubernetes.protobuf,application/json",
                ),
            ],
            &[],
        )
        .unwrap();
    assert_eq!(read.status, 200);
    hub.wait_stored();
    let puts = |s: &Setup| {
        s.cloud
            .audit()
            .iter()
            .filter(|e| e.method == "PUT" && e.path.starts_with(&lease_path))
            .count()
    };
    let patches = |s: &Setup| {
        s.cloud
            .audit()
            .iter()
            .filter(|e| {
                e.method == "PATCH" && e.path.starts_with(&format!("/api/v1/nodes/{NODE}/status"))
            })
            .count()
    };
    let renew = |lease: &mut Value, minute: u32| {
        lease["spec"]["renewTime"] = json!(format!("2026-12-04T10:{minute:02}:00.000000Z"));
        let (code, answer) = kubelet_call(
            &kubelet,
            "PUT",
            &format!("{lease_path}?timeout=10s"),
            Some(lease),
        );
        assert_eq!(code, 200, "renewal at minute {minute}: {answer}");
        *lease = answer;
    };

    s.cloud_down(&hub);
    for minute in 1..=3 {
        renew(&mut lease, minute);
    }
    let condition = |reason: &str| json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": reason}]}});
    for reason in ["Offline1", "Offline2", "Offline3"] {
        let (code, _) = kubelet_call(
            &kubelet,
            "PATCH",
            &format!("/api/v1/nodes/{NODE}/status?timeout=10s"),
            Some(&condition(reason)),
        );
        assert_eq!(code, 200, "node status {reason}");
    }
    let before = (puts(&s), patches(&s));

    cloud_back(&s, &hub);
    // The kubelet's own renewals right after the return: straight to the cloud, no 409.
    renew(&mut lease, 4);
    renew(&mut lease, 5);
    wait_for(
        "the queue to drain (the node status after its grace)",
        Duration::from_secs(60),
        || (hub.status()["cache"]["queued"] == 0).then_some(()),
    );
    assert_eq!(
        puts(&s) - before.0,
        2,
        "only the kubelet's own renewals reached the cloud"
    );
    assert_eq!(
        patches(&s) - before.1,
        1,
        "only the newest node status was replayed"
    );
    let c = &hub.status()["cache"];
    assert_eq!(
        c["superseded"],
        3 + 2,
        "3 renewals and 2 node statuses superseded: {c}"
    );
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let node = admin.get(&format!("/api/v1/nodes/{NODE}")).json();
    let reasons: Vec<&str> = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"Offline3"), "{reasons:?}");
    let in_cloud = admin.get(&lease_path).json();
    assert_eq!(in_cloud["spec"]["renewTime"], "2026-12-04T10:05:00.000000Z");
    // The replayed status's answer replaced the offline copy: offline again, the node
    // reads its node as the cloud now holds it.
    hub.wait_stored();
    s.cloud_down(&hub);
    let (code, cached) = kubelet_call(&kubelet, "GET", &format!("/api/v1/nodes/{NODE}"), None);
    assert_eq!(code, 200, "{cached}");
    assert_eq!(
        cached["metadata"]["resourceVersion"], node["metadata"]["resourceVersion"],
        "the cloud's answer to the replay, not the offline copy"
    );
    // The log says what is true: no pool here, plain text in a file.
    let log = hub.log();
    assert!(
        log.contains("reads are served from the local cache, node writes are queued"),
        "{log}"
    );
    assert!(
        !log.contains("pool"),
        "no pool wording without a pool:\n{log}"
    );
    assert!(!log.contains('\x1b'), "no ANSI codes in a log file");
}

/// `hub status` finds the admin port in the hub's configuration (a non-default one here).
#[test]
fn status_takes_the_admin_address_from_the_config() {
    let s = node_setup();
    let hub = s.start_hub();
    assert_ne!(s.admin, "127.0.0.1:10267");
    let out = std::process::Command::new(hub_tests::hub_bin())
        .args(["status", "--output", "json", "--config"])
        .arg(hub.config_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["ready"], true);
    assert_eq!(status["pid"], hub.proc.pid());
}

/// kube-apiserver 1.33+ sends a protobuf list in 4 KiB DATA frames (recorded from 1.36:
/// `fixtures/wire/kube-apiserver-1.36/list-framing.json`), and the stand-in does too. The
/// hub passes such a list on whole, byte for byte as the cloud sent it, in frames joined
/// as they arrive, and caches it: offline, the same list comes from the cache.
#[test]
fn a_list_in_small_frames_passes_whole_and_is_cached() {
    let s = node_setup();
    for i in 3..400 {
        seed::pod(&s.cloud.state.store, "ns1", &format!("p-{i}"), NODE, "web");
    }
    let recorded: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/wire/kube-apiserver-1.36/list-framing.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let small = recorded["answers"]["protobuf"]["frame_bytes"]
        .as_u64()
        .unwrap() as usize;
    let hub = s.start_hub();
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let headers = [
        ("user-agent", KUBELET),
        ("accept", "application/vnd.kubernetes.protobuf"),
    ];
    let cloud = H2Client::connect(s.cloud.addr, s.ca.cert_der(), Some(&s.pki.kubelet)).unwrap();
    let direct = cloud.get(&path, &headers).unwrap();
    assert_eq!(direct.status, 200);
    let (last, whole) = direct.frames.split_last().unwrap();
    assert!(
        whole.iter().all(|f| *f == small) && *last <= small && whole.len() > 10,
        "the stand-in frames a protobuf list as 1.36 does: {:?}",
        direct.frames
    );
    let client = H2Client::connect(s.hub_addr(), s.ca.cert_der(), Some(&s.pki.kubelet)).unwrap();
    let through = client.get(&path, &headers).unwrap();
    assert_eq!(through.status, 200);
    assert_eq!(through.end, End::Clean);
    let items = |body: &[u8]| {
        let raw = hub::kproto::unwrap(body)?.raw;
        Some(hub::kproto::split_list(raw)?.items.len())
    };
    assert_eq!(items(&through.body), Some(400));
    // The cloud's bytes: only the list's resourceVersion may differ between two answers.
    assert_eq!(through.body.len(), direct.body.len());
    eprintln!(
        "{} frames from the cloud, {} from the hub",
        direct.frames.len(),
        through.frames.len()
    );
    hub.wait_stored();
    s.cloud_down(&hub);
    let offline = client.get(&path, &headers).unwrap();
    assert_eq!(offline.status, 200);
    assert_eq!(items(&offline.body), Some(400), "the list, from the cache");
}
