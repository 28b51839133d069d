//! A node that stays offline keeps its live state: the kubelet's pod status writes — the
//! two-way strategic merge patches a real kubelet 1.36 sends (recorded in
//! `fixtures/wire/kube-apiserver-1.36/patch-pod-status-strategic`) — are applied to the
//! pods it is served in protobuf and JSON, reach its open watch as MODIFIED events, and
//! fold into one write per pod that the cloud gets on its return. A write naming another
//! pod is refused as kube-apiserver refuses it.
use std::time::Duration;

use hub_tests::{
    apiserver::{ADMIN_TOKEN, client::Client, seed},
    hub::LOOPBACK_NODE,
    recorded,
    scenario::Setup,
    wait_for,
};
use serde_json::{Value, json};

const NODE: &str = LOOPBACK_NODE;
const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf,application/json";
const PODS: usize = 3;

/// The kubelet's recorded status patch, made for one pod: its uid, Ready and phase.
fn status_patch(uid: &str, ready: &str, phase: &str) -> Vec<u8> {
    serde_json::to_vec(&recorded::kubelet_pod_status_patch(uid, ready, phase)).unwrap()
}

fn ready_of(pod: &Value) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("none")
        .to_string()
}

fn patch(kubelet: &Client, name: &str, body: &[u8]) -> (u16, String) {
    let r = kubelet
        .request(
            "PATCH",
            &format!("/api/v1/namespaces/ns1/pods/{name}/status"),
            &[
                ("User-Agent", KUBELET),
                ("Accept", PROTOBUF),
                ("Content-Type", "application/strategic-merge-patch+json"),
            ],
            body,
        )
        .unwrap();
    let ct = r.header("content-type").unwrap_or_default().to_string();
    (r.status, ct)
}

#[test]
fn the_kubelet_reads_back_its_offline_status_writes_and_the_cloud_gets_one_write_per_pod() {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::node(store, NODE);
    for i in 0..PODS {
        seed::pod(store, "ns1", &format!("p-{i}"), NODE, "web");
    }
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let uids: Vec<String> = (0..PODS)
        .map(|i| {
            let p = admin
                .get(&format!("/api/v1/namespaces/ns1/pods/p-{i}"))
                .json();
            p["metadata"]["uid"].as_str().unwrap().to_string()
        })
        .collect();
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let pods = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    // The kubelet lists its pods in protobuf: that is what the cache holds.
    s.kubelet_lists_its_pods(&kubelet, KUBELET);
    hub.wait_stored();

    s.cloud_down(&hub);
    let json_headers = [("User-Agent", KUBELET), ("Accept", "application/json")];
    let list = kubelet.request("GET", &pods, &json_headers, &[]).unwrap();
    assert_eq!(list.status, 200, "{}", String::from_utf8_lossy(&list.body));
    let rv = list.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = kubelet
        .try_stream(
            &format!("{pods}&watch=1&resourceVersion={rv}&allowWatchBookmarks=true"),
            &json_headers,
        )
        .unwrap();
    assert_eq!(watch.status, 200);

    // Every pod (Running and Ready in the cloud) goes unready, Ready again, then fails:
    // three writes each, answered in the protobuf the kubelet asks for.
    for (ready, phase) in [
        ("False", "Running"),
        ("True", "Running"),
        ("False", "Failed"),
    ] {
        for (i, uid) in uids.iter().enumerate() {
            let (code, ct) = patch(
                &kubelet,
                &format!("p-{i}"),
                &status_patch(uid, ready, phase),
            );
            assert_eq!(code, 200, "p-{i} Ready={ready}");
            assert!(ct.contains("protobuf"), "{ct}");
        }
    }
    // The open watch saw every write as it happened.
    let mut seen = vec![Vec::new(); PODS];
    wait_for(
        "the watch to see all nine writes",
        Duration::from_secs(20),
        || {
            while let Some(e) = watch.next_event(Duration::from_millis(200)) {
                if e["type"] == "MODIFIED" {
                    let name = e["object"]["metadata"]["name"].as_str().unwrap_or_default();
                    let i: usize = name.trim_start_matches("p-").parse().unwrap();
                    seen[i].push(ready_of(&e["object"]));
                }
            }
            seen.iter().all(|s| s.len() == 3).then_some(())
        },
    );
    for s in &seen {
        assert_eq!(s, &["False", "True", "False"], "{seen:?}");
    }
    // A GET and a fresh list read the written status back, in JSON and protobuf alike.
    let got = kubelet
        .request("GET", "/api/v1/namespaces/ns1/pods/p-1", &json_headers, &[])
        .unwrap()
        .json();
    assert_eq!(
        (ready_of(&got), got["status"]["phase"].as_str()),
        ("False".into(), Some("Failed"))
    );
    let served_rv: u64 = got["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let listed_again = kubelet
        .request("GET", &pods, &json_headers, &[])
        .unwrap()
        .json();
    let list_rv: u64 = listed_again["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        list_rv <= served_rv,
        "a list holding written state reports no further than it"
    );
    for p in listed_again["items"].as_array().unwrap() {
        assert_eq!(ready_of(p), "False", "{p}");
    }
    let proto = kubelet
        .request(
            "GET",
            "/api/v1/namespaces/ns1/pods/p-1",
            &[("User-Agent", KUBELET), ("Accept", PROTOBUF)],
            &[],
        )
        .unwrap();
    assert!(proto.header("content-type").unwrap().contains("protobuf"));
    assert!(
        proto.body.windows(6).any(|w| w == b"Failed"),
        "the protobuf copy carries the written phase"
    );
    // One queued write per pod, whatever was written.
    assert_eq!(
        hub.status()["cache"]["queued"],
        PODS,
        "{}",
        hub.status()["cache"]
    );
    // A patch naming another pod (its uid) is refused and not queued, as a real
    // kube-apiserver 1.36 refuses it (recorded: `patch-pod-status-wrong-uid`, a 422 for
    // its pod "w-1").
    let wrong_uid = status_patch("not-the-uid", "True", "Running");
    let (code, ct) = patch(&kubelet, "p-0", &wrong_uid);
    assert_eq!(
        (code, ct.as_str()),
        (422, "application/vnd.kubernetes.protobuf")
    );
    let refused = kubelet
        .request(
            "PATCH",
            "/api/v1/namespaces/ns1/pods/p-0/status",
            &[
                ("User-Agent", KUBELET),
                ("Accept", "application/json"),
                ("Content-Type", "application/strategic-merge-patch+json"),
            ],
            &wrong_uid,
        )
        .unwrap()
        .json();
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/wire/kube-apiserver-1.36/patch-pod-status-wrong-uid/response.body"
        ))
        .unwrap(),
    )
    .unwrap();
    for field in ["kind", "apiVersion", "status", "reason", "code"] {
        assert_eq!(refused[field], recorded[field], "{field}: {refused}");
    }
    assert_eq!(
        refused["message"].as_str().unwrap(),
        recorded["message"].as_str().unwrap().replace("w-1", "p-0")
    );
    assert_eq!(refused["details"]["name"], "p-0");
    assert_eq!(refused["details"]["kind"], recorded["details"]["kind"]);
    // kube-apiserver lists the one cause twice for a pod's status; the hub once.
    assert_eq!(
        refused["details"]["causes"],
        json!([recorded["details"]["causes"][0]])
    );
    assert_eq!(hub.status()["cache"]["queued"], PODS);

    let before = s.cloud.audit().len();
    s.cloud.start_listening().unwrap();
    wait_for("the replay to finish", Duration::from_secs(60), || {
        (hub.status()["cache"]["queued"] == 0).then_some(())
    });
    let replayed: Vec<_> = s.cloud.audit()[before..]
        .iter()
        .filter(|e| e.method == "PATCH" && e.path.ends_with("/status"))
        .cloned()
        .collect();
    assert_eq!(replayed.len(), PODS, "one write per pod: {replayed:?}");
    for i in 0..PODS {
        let p = admin
            .get(&format!("/api/v1/namespaces/ns1/pods/p-{i}"))
            .json();
        assert_eq!(
            (ready_of(&p), p["status"]["phase"].clone()),
            ("False".into(), json!("Failed")),
            "{p}"
        );
    }
    assert_eq!(
        hub.status()["cache"]["superseded"],
        PODS * 2,
        "two writes of each folded away"
    );
}

/// Events the kubelet records offline fold as its event recorder writes them: the create
/// of an event and every later patch of its count, lastTimestamp and message (the
/// recorder's `{"count","lastTimestamp","message"}` two-way patch) become one create, a
/// repeating event recorded before the outage one patch; an event whose last sighting
/// grew older than the cloud's event TTL is dropped and counted, never sent.
#[test]
fn offline_events_fold_into_one_write_each_and_expired_ones_are_dropped() {
    use hub_tests::apiserver::time::rfc3339;
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::node(store, NODE);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let events = "/api/v1/namespaces/ns1/events";
    // One the kubelet recorded while the cloud was up: it repeats offline.
    let before = json!({"metadata": {"name": "p-0.before", "namespace": "ns1"},
        "involvedObject": {"kind": "Pod", "name": "p-0", "namespace": "ns1"},
        "reason": "BackOff", "message": "back-off restarting", "type": "Warning",
        "source": {"component": "kubelet", "host": NODE}, "count": 4});
    assert_eq!(admin.send_json("POST", events, &before).status, 201);
    s.cloud_down(&hub);

    let send = |method: &str, path: &str, ct: &str, body: &Value| {
        let r = kubelet
            .request(
                method,
                path,
                &[("User-Agent", KUBELET), ("Content-Type", ct)],
                &serde_json::to_vec(body).unwrap(),
            )
            .unwrap();
        (r.status, r.json())
    };
    let now = hub_tests::apiserver::time::now_unix();
    let event = |name: &str, reason: &str, seen: u64| {
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "ns1"},
            "involvedObject": {"kind": "Pod", "name": "p-1", "namespace": "ns1"},
            "reason": reason, "message": format!("{reason} p-1"), "type": "Normal",
            "source": {"component": "kubelet", "host": NODE},
            "firstTimestamp": rfc3339(seen), "lastTimestamp": rfc3339(seen), "count": 1})
    };
    let (code, made) = send(
        "POST",
        events,
        "application/json",
        &event("p-1.pulled", "Pulled", now - 60),
    );
    assert_eq!(code, 201, "{made}");
    assert_eq!(made["metadata"]["name"], "p-1.pulled");
    // The recorder patches what repeats.
    for count in 2..=5u64 {
        let p = json!({"count": count, "lastTimestamp": rfc3339(now - 60 + count),
            "message": format!("Pulled p-1 ({count})")});
        let (code, got) = send(
            "PATCH",
            &format!("{events}/p-1.pulled"),
            "application/strategic-merge-patch+json",
            &p,
        );
        assert_eq!((code, &got["count"]), (200, &json!(count)), "{got}");
        let p = json!({"count": 4 + count, "lastTimestamp": rfc3339(now - 30 + count)});
        let (code, got) = send(
            "PATCH",
            &format!("{events}/p-0.before"),
            "application/strategic-merge-patch+json",
            &p,
        );
        assert_eq!(code, 200, "{got}");
    }
    // Last seen two hours ago: the cloud would have let it expire.
    let (code, _) = send(
        "POST",
        events,
        "application/json",
        &event("p-1.stale", "Created", now - 7200),
    );
    assert_eq!(code, 201);
    // A real apiserver's Event in protobuf (`fixtures/wire/kube-apiserver-1.36/dual-event-protobuf`),
    // as a protobuf client creates it: taken, and as its last sighting is days old, expired.
    let recorded = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/wire/kube-apiserver-1.36/dual-event-protobuf/response.body"
    ))
    .unwrap();
    let r = kubelet
        .request(
            "POST",
            "/api/v1/namespaces/dual/events",
            &[
                ("User-Agent", KUBELET),
                ("Accept", PROTOBUF),
                ("Content-Type", "application/vnd.kubernetes.protobuf"),
            ],
            &recorded,
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("content-type").unwrap().contains("protobuf"));
    // The expiry check also runs offline (every 30 s): the two expired events may be
    // dropped already, but no event is more than one write.
    let cache = hub.status()["cache"].clone();
    let held = cache["queued"].as_u64().unwrap() + cache["expired"].as_u64().unwrap();
    assert_eq!(held, 4, "one write per event: {cache}");

    let seen = s.cloud.audit().len();
    s.cloud.start_listening().unwrap();
    let cache = wait_for("the queue to drain", Duration::from_secs(30), || {
        let c = hub.status()["cache"].clone();
        (c["queued"] == 0).then_some(c)
    });
    assert_eq!(
        (cache["expired"].as_u64(), cache["replay_dropped"].as_u64()),
        (Some(2), Some(0)),
        "{cache}"
    );
    let pulled = admin.get(&format!("{events}/p-1.pulled")).json();
    assert_eq!(
        (
            &pulled["count"],
            &pulled["message"],
            &pulled["lastTimestamp"]
        ),
        (
            &json!(5),
            &json!("Pulled p-1 (5)"),
            &json!(rfc3339(now - 55))
        ),
        "{pulled}"
    );
    let before = admin.get(&format!("{events}/p-0.before")).json();
    assert_eq!(
        (&before["count"], &before["lastTimestamp"]),
        (&json!(9), &json!(rfc3339(now - 25))),
        "{before}"
    );
    assert_eq!(admin.get(&format!("{events}/p-1.stale")).status, 404);
    assert_eq!(
        admin.get("/api/v1/namespaces/dual/events/rich.1").status,
        404
    );
    let writes: Vec<String> = s.cloud.audit()[seen..]
        .iter()
        .filter(|a| a.path.contains("/events") && a.method != "GET")
        .map(|a| format!("{} {}", a.method, a.path))
        .collect();
    assert_eq!(
        writes,
        [
            format!("POST {events}"),
            format!("PATCH {events}/p-0.before")
        ],
        "one write per event, in the order they were first written"
    );
}
