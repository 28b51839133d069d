//! Issue 6: the local cache. The hub forwards to the API stand-in while it is up and tees
//! what the cloud returns into its store; with the stand-in stopped, real clients (kubectl,
//! the Python client, a kubelet-style protobuf client) are answered from the cache —
//! across hub restarts and kill -9, per credential, with any selector.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use hub_tests::{
    apiserver::{ADMIN_TOKEN, StandIn, client::Client, resources, seed, store::Key},
    hub::LOOPBACK_NODE,
    informer::{Informer, Mode},
    kubectl, kubectl_ok, privileged,
    scenario::{OTHER_TOKEN, Setup},
    wait_for,
};
use serde_json::Value;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

fn names(list_json: &str) -> BTreeSet<String> {
    let v: Value = serde_json::from_str(list_json).expect("list JSON");
    hub_tests::list_keys(&v).into_iter().collect()
}

fn seed_namespaces(cloud: &StandIn) {
    let store = &cloud.state.store;
    seed::base(store);
    seed::cluster(store, 2, 3);
    for ns in ["ns1", "ns10"] {
        seed::namespace(store, ns);
    }
    for (i, app) in ["web", "web", "db", "db"].iter().enumerate() {
        seed::pod(store, "ns1", &format!("a-{i}"), "node-0", app);
    }
    for i in 0..3 {
        seed::pod(store, "ns10", &format!("b-{i}"), "node-1", "web");
    }
    seed::secret(store, "ns1", "s1", serde_json::json!({"k": "c2VjcmV0"}));
}

fn python(kubeconfig: &Path, script: &str) -> Value {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(kubeconfig)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("python output JSON")
}

#[test]
fn real_clients_are_served_from_the_cache_while_the_cloud_is_down() {
    let s = Setup::new(&["kubectl", "openapi-generator", "kubelet"]);
    seed_namespaces(&s.cloud);
    let hub = s.start_hub();
    let kc = s.kubeconfig("admin.kubeconfig", ADMIN_TOKEN);
    let other = s.kubeconfig("other.kubeconfig", OTHER_TOKEN);

    // Online: lists, a secret read by one credential, discovery, a Python list.
    let all_online = names(&kubectl_ok(&kc, &["get", "pods", "-A", "-o", "json"]));
    assert_eq!(all_online.len(), 13, "{all_online:?}");
    let ns1_online = names(&kubectl_ok(
        &kc,
        &["get", "pods", "-n", "ns1", "-o", "json"],
    ));
    let ns10_online = names(&kubectl_ok(
        &kc,
        &["get", "pods", "-n", "ns10", "-o", "json"],
    ));
    assert_eq!((ns1_online.len(), ns10_online.len()), (4, 3));
    kubectl_ok(&kc, &["get", "secret", "s1", "-n", "ns1", "-o", "json"]);
    kubectl_ok(&kc, &["api-resources"]);
    let py_list = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
v1 = client.CoreV1Api()
print(json.dumps({"default": len(v1.list_namespaced_pod("default").items)}))
"#;
    assert_eq!(python(&kc, py_list)["default"], 6);
    s.wait_cached("kubectl", "kubectl's lists and the secret", |e| {
        e.iter().any(|e| e["key"] == "/v1/secrets/ns1/s1")
            && e.iter().filter(|e| e["kind"] == "Pod").count() >= 13
    });

    s.cloud_down(&hub);

    // The same lists, from the cache.
    assert_eq!(
        names(&kubectl_ok(&kc, &["get", "pods", "-A", "-o", "json"])),
        all_online
    );
    assert_eq!(
        names(&kubectl_ok(
            &kc,
            &["get", "pods", "-n", "ns1", "-o", "json"]
        )),
        ns1_online,
        "ns1 is answered without ns10's pods"
    );
    assert_eq!(
        names(&kubectl_ok(
            &kc,
            &["get", "pods", "-n", "ns10", "-o", "json"]
        )),
        ns10_online
    );
    // A selector never used online (OpenYurt #1963).
    assert_eq!(
        names(&kubectl_ok(
            &kc,
            &["get", "pods", "-n", "ns1", "-l", "app=web", "-o", "json"]
        )),
        ["ns1/a-0", "ns1/a-1"].map(String::from).into()
    );
    // kubectl's default (Table) output and discovery work offline too.
    let table = kubectl_ok(&kc, &["get", "pods", "-n", "ns10"]);
    assert!(table.contains("b-2"), "{table}");
    let resources = kubectl_ok(&kc, &["api-resources"]);
    assert!(
        resources.contains("pods") && resources.contains("configmaps"),
        "{resources}"
    );

    // The Python client (its own component) with other selectors, answered from what the
    // same credential cached.
    let py_offline = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
v1 = client.CoreV1Api()
out = {}
out["node1"] = sorted(p.metadata.name for p in v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1").items)
out["not_web"] = sorted(p.metadata.name for p in v1.list_namespaced_pod("ns1", label_selector="app notin (web)").items)
page = v1.list_pod_for_all_namespaces(limit=5)
seen = [p.metadata.name for p in page.items]
while page.metadata._continue:
    page = v1.list_pod_for_all_namespaces(limit=5, _continue=page.metadata._continue)
    seen += [p.metadata.name for p in page.items]
out["paged"] = len(seen)
out["paged_unique"] = len(set(seen))
print(json.dumps(out))
"#;
    let r = python(&kc, py_offline);
    assert_eq!(
        r["node1"],
        serde_json::json!(["b-0", "b-1", "b-2", "pod-1-0", "pod-1-1", "pod-1-2"]),
        "{r}"
    );
    assert_eq!(r["not_web"], serde_json::json!(["a-2", "a-3"]), "{r}");
    assert_eq!(
        (r["paged"].as_u64(), r["paged_unique"].as_u64()),
        (Some(13), Some(13))
    );

    // A credential is served only what the cloud returned to it.
    kubectl_ok(&kc, &["get", "secret", "s1", "-n", "ns1", "-o", "json"]);
    let (ok, _, err) = kubectl(&other, &["get", "secret", "s1", "-n", "ns1", "-o", "json"]);
    assert!(
        !ok,
        "a token that never read the secret must not get it offline"
    );
    assert!(err.contains("not in the local cache"), "{err}");
    let (ok, _, err) = kubectl(&other, &["get", "pods", "-A", "-o", "json"]);
    assert!(!ok && err.contains("no list of /v1/pods"), "{err}");

    // A write is refused with a clear error, never a fake success.
    let (ok, _, err) = kubectl(&kc, &["create", "configmap", "offline-cm", "-n", "default"]);
    assert!(!ok, "an offline create must not succeed");
    assert!(err.contains("offline"), "{err}");

    // An offline watch stays open with bookmarks, and ends once the cloud is back.
    let c = Client::new(s.hub_addr(), s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let mut w = c.stream(
        "/api/v1/namespaces/ns1/pods?watch=true&allowWatchBookmarks=true&resourceVersion=1",
    );
    assert_eq!(w.status, 200);
    let bookmark = wait_for("an offline bookmark", Duration::from_secs(15), || {
        w.next_event(Duration::from_secs(1))
            .filter(|e| e["type"] == "BOOKMARK")
    });
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());
    s.cloud.start_listening().unwrap();
    let started = Instant::now();
    while w.next_event(Duration::from_secs(10)).is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "watch not ended"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // Back online: the cloud answers again, and the refused write never happened.
    wait_for("the cloud to be healthy", Duration::from_secs(5), || {
        (hub.status()["cloud"][0]["healthy"] == true).then_some(())
    });
    let (ok, _, _) = kubectl(&kc, &["get", "configmap", "offline-cm", "-n", "default"]);
    assert!(
        !ok,
        "the refused offline create must not exist in the cloud"
    );
}

/// Reads a protobuf PodList answer into its pod names (with k8s-pb, independently of the
/// hub's own reader).
fn protobuf_pod_names(body: &[u8]) -> BTreeSet<String> {
    use k8s_pb::{api::core::v1::PodList, apimachinery::pkg::runtime::Unknown};
    use prost::Message;
    let u = Unknown::decode(body.strip_prefix(b"k8s\0").expect("protobuf magic")).unwrap();
    assert_eq!(u.type_meta.unwrap().kind.as_deref(), Some("PodList"));
    PodList::decode(u.raw.unwrap().as_slice())
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.unwrap().name.unwrap())
        .collect()
}

fn kubelet_get(c: &Client, path: &str) -> hub_tests::apiserver::client::Reply {
    c.request(
        "GET",
        path,
        &[
            ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
            ("Accept", PROTOBUF),
        ],
        &[],
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

#[test]
fn an_offline_restart_answers_kubelet_from_the_cache() {
    let s = Setup::new(&["kubelet"]);
    seed_namespaces(&s.cloud);
    let pods = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0";
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let online = kubelet_get(&kubelet, pods);
    assert_eq!(online.status, 200);
    let online_names = protobuf_pod_names(&online.body);
    assert_eq!(online_names.len(), 7, "{online_names:?}");
    assert_eq!(kubelet_get(&kubelet, "/api/v1/nodes/node-0").status, 200);
    assert_eq!(kubelet_get(&kubelet, "/version").status, 200);
    s.wait_cached("kubelet", "kubelet's pods and node", |e| {
        e.iter().filter(|e| e["kind"] == "Pod").count() == 7
            && e.iter()
                .any(|e| e["key"] == "/v1/nodes/node-0" && e["encoding"] == "protobuf")
    });

    // Power cut while the cloud is down: the hub comes back and answers at once.
    s.cloud.stop_listening();
    drop(hub);
    let started = Instant::now();
    let _hub = s.start_hub();
    let offline = kubelet_get(&kubelet, pods);
    eprintln!(
        "offline restart: first cached answer {:?} after start",
        started.elapsed()
    );
    assert_eq!(
        offline.status,
        200,
        "{}",
        String::from_utf8_lossy(&offline.body)
    );
    assert!(
        offline
            .header("warning")
            .is_some_and(|w| w.contains("local cache"))
    );
    assert_eq!(protobuf_pod_names(&offline.body), online_names);
    let node = kubelet_get(&kubelet, "/api/v1/nodes/node-0");
    assert_eq!(node.status, 200);
    assert!(node.body.starts_with(b"k8s\0"), "protobuf as asked");
    let version = kubelet_get(&kubelet, "/version");
    assert_eq!(version.status, 200);
    assert!(version.json()["gitVersion"].is_string());
    // A pod of another node was never returned to kubelet: not found would be a guess.
    let other = kubelet_get(&kubelet, "/api/v1/namespaces/ns10/pods/b-0");
    assert_eq!(
        other.status,
        503,
        "{}",
        String::from_utf8_lossy(&other.body)
    );
}

/// Replaces every pod in namespace `gen` by `count` pods named `<prefix>-N`.
fn flip_generation(cloud: &StandIn, prefix: &str, count: usize) {
    let store = &cloud.state.store;
    let pods = resources::find("", "v1", "pods").unwrap();
    let page = store
        .list(pods, Some("gen"), None, None, 0, |_| true)
        .unwrap();
    for item in page.items {
        let name = item["metadata"]["name"].as_str().unwrap().to_string();
        store
            .delete(
                Key {
                    resource: pods,
                    namespace: "gen".into(),
                    name,
                },
                None,
            )
            .unwrap();
    }
    for i in 0..count {
        seed::pod(store, "gen", &format!("{prefix}-{i}"), "node-0", "gen");
    }
    store.compact();
}

#[test]
fn kill_9_during_a_10k_list_write_leaves_each_set_whole() {
    const N: usize = 10_000;
    let s = Setup::new(&["kubelet"]);
    seed::namespace(&s.cloud.state.store, "gen");
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let mut random = move |below: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % below
    };
    // How long listing and storing the whole set takes on this machine now (a loaded
    // machine takes several times longer): the kills are spread over 1.5 times that, so
    // some land before the set is stored and some after, whatever the load.
    let list = |addr, ca, kubelet_id: &hub_tests::apiserver::tls::Identity| {
        let c = Client::new(addr, ca, None, Some(kubelet_id));
        let _ = c.request(
            "GET",
            "/api/v1/namespaces/gen/pods?fieldSelector=spec.nodeName%3Dnode-0",
            &[("User-Agent", "kubelet/v1.32.0"), ("Accept", PROTOBUF)],
            &[],
        );
    };
    flip_generation(&s.cloud, "calibration", N);
    let hub = s.start_hub();
    let started = std::time::Instant::now();
    list(s.hub_addr(), s.ca.cert_der(), &s.pki.kubelet);
    wait_for(
        "the calibration set stored",
        Duration::from_secs(120),
        || (s.cache_ls("kubelet").len() >= N).then_some(()),
    );
    let stored_ms = started.elapsed().as_millis() as u64;
    drop(hub);
    eprintln!("listing and storing {N} pods took {stored_ms} ms");
    let mut outcomes = Vec::new();
    for round in 0..20 {
        let prefix = format!("g{round}");
        flip_generation(&s.cloud, &prefix, N);
        let mut hub = s.start_hub();
        let addr = s.hub_addr();
        let (ca, kubelet_id) = (s.ca.cert_der(), s.pki.kubelet.clone());
        let lister = std::thread::spawn(move || list(addr, ca, &kubelet_id));
        std::thread::sleep(Duration::from_millis(random(stored_ms * 3 / 2 + 1)));
        hub.proc.kill9();
        let _ = lister.join();
        drop(hub);
        // The store opens (read directly: no hub runs), and the set is one generation.
        let entries = s.cache_ls("kubelet");
        let gens: BTreeSet<&str> = entries
            .iter()
            .filter_map(|e| e["key"].as_str()?.strip_prefix("/v1/pods/gen/"))
            .map(|name| name.split('-').next().unwrap())
            .collect();
        assert!(gens.len() <= 1, "round {round}: mixed generations {gens:?}");
        if let Some(g) = gens.first() {
            assert_eq!(
                entries.len(),
                N,
                "round {round}: generation {g} is not whole"
            );
        }
        outcomes.push(gens.first().map(|g| *g == prefix).unwrap_or(false));
    }
    eprintln!("kill -9 rounds where the new list had been stored: {outcomes:?}");
    assert!(
        outcomes.iter().any(|new| *new),
        "no round stored its list before the kill: the test proved nothing"
    );
    if outcomes.iter().all(|new| *new) {
        eprintln!("NOTE: every round stored its list before the kill; no kill hit a write");
    }
}

#[test]
fn a_corrupt_store_is_set_aside_and_a_full_disk_loses_nothing_stored() {
    if !privileged::check("a_corrupt_store_is_set_aside_and_a_full_disk_loses_nothing_stored") {
        return;
    }
    let s = Setup::new(&["kubelet"]);
    seed_namespaces(&s.cloud);
    std::fs::create_dir_all(&s.state).unwrap();
    std::fs::write(
        s.state.join("cache.redb"),
        b"this is not a redb file at all",
    )
    .unwrap();
    let hub = s.start_hub();
    let note = hub.status()["cache"]["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(note.contains("moved to"), "{note}");
    let kubelet = s.kubelet();
    assert_eq!(kubelet_get(&kubelet, "/api/v1/nodes/node-0").status, 200);
    s.wait_cached("kubelet", "the node", |e| e.len() == 1);
    drop(hub);

    // A full disk: the store lives on a 2 MiB tmpfs; a 10k-pod list cannot be stored.
    let small = s.dir.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.clone());
    let full = Setup {
        state: small.join("state"),
        ..Setup::new(&["kubelet"])
    };
    seed_namespaces(&full.cloud);
    seed::cluster(&full.cloud.state.store, 1, 10_000);
    let hub = full.start_hub();
    let kubelet = full.kubelet();
    assert_eq!(kubelet_get(&kubelet, "/api/v1/nodes/node-0").status, 200);
    full.wait_cached("kubelet", "the node on the small disk", |e| e.len() == 1);
    let big = kubelet_get(
        &kubelet,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
    );
    assert_eq!(
        big.status, 200,
        "the client is served even when the cache cannot store"
    );
    assert_eq!(protobuf_pod_names(&big.body).len(), 10_004);
    let errors = wait_for("a cache write error", Duration::from_secs(20), || {
        let c = hub.status()["cache"].clone();
        (c["write_errors"].as_u64() > Some(0)).then_some(c)
    });
    eprintln!("full disk: {errors}");
    assert_eq!(kubelet_get(&kubelet, "/api/v1/nodes/node-0").status, 200);
    // The disk gets room again (the tmpfs grows): the list the store refused was kept and
    // is stored now, with no client asking again.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(grown.success());
    let pods = |entries: &[Value]| {
        entries
            .iter()
            .filter(|e| {
                e["key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("/v1/pods/"))
            })
            .count()
    };
    full.wait_cached("kubelet", "the refused list, once there is room", |e| {
        pods(e) == 10_004
    });
    drop(hub);
    // What was stored stays readable; the store was not damaged.
    let after = full.cache_ls("kubelet");
    assert!(
        after.iter().any(|e| e["key"] == "/v1/nodes/node-0"),
        "{after:?}"
    );
    assert_eq!(pods(&after), 10_004);
}

#[test]
fn offline_node_writes_are_queued_and_replayed_in_order() {
    let s = Setup::new(&["kubelet"]);
    seed_namespaces(&s.cloud);
    let cloud_admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let lease_path = format!("{leases}/node-0");
    let created = cloud_admin.send_json(
        "POST",
        leases,
        &serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-0", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "node-0", "leaseDurationSeconds": 40,
                     "renewTime": "2026-01-01T00:00:00.000000Z"}}),
    );
    assert_eq!(created.status, 201);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let send = |method: &str, path: &str, content_type: &str, body: &[u8]| {
        kubelet
            .request(
                method,
                path,
                &[
                    ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
                    ("Accept", "application/json"),
                    ("Content-Type", content_type),
                ],
                body,
            )
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };
    let pod_path = "/api/v1/namespaces/default/pods/pod-0-0";
    assert_eq!(send("GET", pod_path, "", b"").status, 200);
    let mut lease = send("GET", &lease_path, "", b"").json();
    s.wait_cached("kubelet", "the pod and the lease", |e| e.len() == 2);

    s.cloud_down(&hub);
    let status_path = format!("{pod_path}/status");
    for message in ["offline-1", "offline-2"] {
        let patch = format!(r#"{{"status":{{"phase":"Failed","message":"{message}"}}}}"#);
        let r = send(
            "PATCH",
            &status_path,
            "application/merge-patch+json",
            patch.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        // Said once a minute to a client, not on every write.
        let warned = r.header("warning").is_some_and(|w| w.contains("queued"));
        assert_eq!(warned, message == "offline-1", "{message}: {:?}", r.headers);
        assert_eq!(r.json()["status"]["message"], message);
    }
    // What the cache serves follows the queued writes.
    let cached = send("GET", pod_path, "", b"").json();
    assert_eq!(
        (&cached["status"]["phase"], &cached["status"]["message"]),
        (&Value::from("Failed"), &Value::from("offline-2"))
    );
    let event = serde_json::json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "offline-ev", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "pod-0-0", "namespace": "default"},
        "reason": "Offline", "message": "written offline", "type": "Normal"});
    let r = send(
        "POST",
        "/api/v1/namespaces/default/events",
        "application/json",
        &serde_json::to_vec(&event).unwrap(),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // kubelet renews its lease in protobuf, as its typed client does.
    lease["spec"]["renewTime"] = "2026-06-01T00:00:00.000000Z".into();
    let r = send(
        "PUT",
        &lease_path,
        "application/vnd.kubernetes.protobuf",
        &hub_tests::apiserver::protobuf::object("coordination.k8s.io/v1", "Lease", &lease),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Meanwhile the lease changes in the cloud: the replayed renewal will conflict.
    let lease_id = resources::find("coordination.k8s.io", "v1", "leases").unwrap();
    s.cloud
        .state
        .store
        .update(
            Key {
                resource: lease_id,
                namespace: "kube-node-lease".into(),
                name: "node-0".into(),
            },
            None,
            |cur| {
                let mut v = cur.clone();
                v["metadata"]["labels"] = serde_json::json!({"touched": "elsewhere"});
                v
            },
        )
        .unwrap();
    // Writes a node does not need to stay alive are refused, not faked.
    let r = send(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"nope"}}"#,
    );
    assert_eq!(r.status, 503);
    assert!(String::from_utf8_lossy(&r.body).contains("offline"));
    // The pod's two status writes fold into one queued write.
    assert_eq!(hub.status()["cache"]["queued"], 3);

    // The cloud comes back not yet authorizing nodes (403), as a freshly started
    // kube-apiserver does until it has loaded RBAC: the replay waits it out.
    let rules = {
        let mut auth = s.cloud.state.auth.write().unwrap();
        auth.node_authorizer_ready = false;
        auth.revoke("system:nodes")
    };
    let seen = s.cloud.audit().len();
    s.cloud.start_listening().unwrap();
    wait_for("a replay attempt", Duration::from_secs(15), || {
        s.cloud.audit()[seen..]
            .iter()
            .any(|a| a.user.starts_with("system:node:") && a.method != "GET")
            .then_some(())
    });
    let cache = hub.status()["cache"].clone();
    assert_eq!(
        (cache["replayed"].as_u64(), cache["queued"].as_u64()),
        (Some(0), Some(3)),
        "refused replays stay queued: {cache}"
    );
    // The cloud answers again, but the queue has not drained: a new status must wait
    // behind the queued ones, or it would land first and be overwritten by an older one.
    assert_eq!(hub.status()["cloud"][0]["healthy"], true);
    let r = send(
        "PATCH",
        &status_path,
        "application/merge-patch+json",
        br#"{"status":{"phase":"Failed","message":"offline-3"}}"#,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.header("warning")
            .is_some_and(|w| w.contains("queued behind")),
        "{:?}",
        r.headers
    );
    // A write the queue cannot hold (a patch of a pod the node never cached) is the
    // cloud's to answer meanwhile — here its refusal, not the hub's "offline" 503.
    let r = send(
        "PATCH",
        "/api/v1/namespaces/default/pods/never-cached/status",
        "application/merge-patch+json",
        br#"{"status":{"message":"x"}}"#,
    );
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    {
        let mut auth = s.cloud.state.auth.write().unwrap();
        auth.node_authorizer_ready = true;
        for r in rules {
            auth.allow(r);
        }
    }
    let cache = wait_for("the queue to drain", Duration::from_secs(30), || {
        let c = hub.status()["cache"].clone();
        (c["queued"] == 0).then_some(c)
    });
    // One write per object (the pod's, its lease's, the event), or one more for the pod
    // when its third status came in while its replay was on the wire.
    assert!(
        matches!(cache["replayed"].as_u64(), Some(3 | 4)) && cache["replay_dropped"] == 0,
        "{cache}"
    );
    // Visible in the cloud, in order (the latest patch wins); the renewal's conflict was
    // resolved by re-reading the lease and writing it over the newer version.
    let pod = cloud_admin.get(pod_path).json();
    assert_eq!(
        (&pod["status"]["phase"], &pod["status"]["message"]),
        (&Value::from("Failed"), &Value::from("offline-3"))
    );
    let ev = cloud_admin.get("/api/v1/namespaces/default/events/offline-ev");
    assert_eq!(ev.status, 200);
    assert_eq!(ev.json()["reason"], "Offline");
    let lease = cloud_admin.get(&lease_path).json();
    assert_eq!(lease["spec"]["renewTime"], "2026-06-01T00:00:00.000000Z");
    let audit = s.cloud.audit();
    let patches: Vec<_> = audit
        .iter()
        .filter(|a| a.path == status_path && a.method == "PATCH")
        .collect();
    // The pod's writes arrived folded (once or more while nodes got 403); the final
    // state above proves the newest won.
    assert!(!patches.is_empty(), "{patches:?}");
    assert!(
        audit
            .iter()
            .all(|a| !a.path.ends_with("/configmaps") || a.method != "POST")
    );
}

#[test]
fn no_cache_write_is_dropped_under_back_to_back_lists() {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    for i in 0..40 {
        let ns = format!("bb{i}");
        seed::namespace(store, &ns);
        for p in 0..5 {
            seed::pod(store, &ns, &format!("p{p}"), "node-0", "bb");
        }
    }
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    // 200 lists as fast as one client can send them (YurtHub dropped ~90% of these writes
    // with "key under accessing").
    for _round in 0..5 {
        for i in 0..40 {
            let r = kubelet_get(
                &kubelet,
                &format!("/api/v1/namespaces/bb{i}/pods?fieldSelector=spec.nodeName%3Dnode-0"),
            );
            assert_eq!(r.status, 200);
        }
    }
    s.wait_cached("kubelet", "all 40 namespaces' pods", |e| e.len() == 200);
    let c = wait_for("every list applied", Duration::from_secs(20), || {
        let c = hub.status()["cache"].clone();
        let applied = c["written"].as_u64()? + c["stale"].as_u64()?;
        (applied == 1000).then_some(c)
    });
    assert_eq!(
        (c["rejected"].as_u64(), c["write_errors"].as_u64()),
        (Some(0), Some(0)),
        "{c}"
    );
}

/// A protobuf Status answer, decoded with k8s-pb (not the hub's reader).
fn protobuf_status(body: &[u8]) -> k8s_pb::apimachinery::pkg::apis::meta::v1::Status {
    use k8s_pb::apimachinery::pkg::{apis::meta::v1::Status, runtime::Unknown};
    use prost::Message;
    let u = Unknown::decode(body.strip_prefix(b"k8s\0").expect("protobuf")).unwrap();
    Status::decode(u.raw.unwrap().as_slice()).unwrap()
}

/// Gunzips a body the way a client does (flate2, not the hub's reader).
fn gunzip(body: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut out)
        .expect("a whole gzip stream");
    out
}

/// The pods of a protobuf watch body, decoded as client-go does: a 4-byte length and a
/// raw k8s-pb `WatchEvent` per frame, a `k8s\0`-enveloped `Pod` inside. Returns the
/// (type, name) of every event and the names the ADDED ones carry.
fn protobuf_watch_pods(body: &[u8]) -> (Vec<(String, String)>, BTreeSet<String>) {
    use k8s_pb::{
        api::core::v1::Pod,
        apimachinery::pkg::{apis::meta::v1::WatchEvent, runtime::Unknown},
    };
    use prost::Message;
    let (mut events, mut added, mut rest) = (Vec::new(), BTreeSet::new(), body);
    while !rest.is_empty() {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let frame = &rest[4..4 + len];
        rest = &rest[4 + len..];
        let ev = WatchEvent::decode(frame).expect("a raw WatchEvent per frame");
        let raw = ev.object.unwrap().raw.unwrap();
        let u = Unknown::decode(raw.strip_prefix(b"k8s\0").expect("an enveloped object")).unwrap();
        assert_eq!(u.type_meta.unwrap().kind.as_deref(), Some("Pod"));
        let pod = Pod::decode(u.raw.unwrap().as_slice()).expect("a Pod");
        let name = pod.metadata.unwrap().name.unwrap_or_default();
        let ty = ev.r#type.unwrap();
        if ty == "ADDED" {
            added.insert(name.clone());
        }
        events.push((ty, name));
    }
    (events, added)
}

/// A kubelet-shaped client (protobuf, `Accept-Encoding: gzip`) lists 1000 pods, which the
/// cloud sends gzipped, and watches them while pods arrive, change and go. With the cloud
/// down, the cache serves the whole list (gzipped again, as the cloud would) and a
/// protobuf watch client-go can decode — including the pods only the watch brought. A
/// client accepting only protobuf for a set cached as JSON gets it converted, never an
/// empty list.
#[test]
fn gzip_lists_and_protobuf_watches_reach_the_cache_and_come_back_offline() {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::node(store, "node-0");
    for i in 0..1000 {
        seed::pod(store, "ns1", &format!("p-{i:04}"), "node-0", "web");
    }
    seed::pod_mounting(
        store,
        "ns1",
        "mounts",
        "node-0",
        "other",
        &["only-json"],
        &[],
    );
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let pods = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0";
    let kubelet_headers = [
        ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
        (
            "Accept",
            "application/vnd.kubernetes.protobuf,application/json",
        ),
        ("Accept-Encoding", "gzip"),
    ];
    let get = |path: &str, headers: &[(&str, &str)]| {
        kubelet
            .request("GET", path, headers, &[])
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };
    let online = get(pods, &kubelet_headers);
    assert_eq!(online.status, 200);
    assert_eq!(
        online.header("content-encoding"),
        Some("gzip"),
        "the cloud gzips a list this large"
    );
    let listed = gunzip(&online.body);
    assert_eq!(protobuf_pod_names(&listed).len(), 1001);
    let rv = {
        use k8s_pb::{api::core::v1::PodList, apimachinery::pkg::runtime::Unknown};
        use prost::Message;
        let u = Unknown::decode(&listed[4..]).unwrap();
        PodList::decode(u.raw.unwrap().as_slice())
            .unwrap()
            .metadata
            .unwrap()
            .resource_version
            .unwrap()
    };

    // Changes after the list, which only the watch carries.
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    for i in 0..3 {
        seed::pod(store, "ns1", &format!("late-{i}"), "node-0", "web");
    }
    let gone = admin.request("DELETE", "/api/v1/namespaces/ns1/pods/p-0007", &[], &[]);
    assert_eq!(gone.unwrap().status, 200);
    let watch = get(
        &format!(
            "{pods}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"
        ),
        &kubelet_headers,
    );
    assert_eq!(watch.status, 200);
    let (events, _) = protobuf_watch_pods(&watch.body);
    assert_eq!(
        events.iter().filter(|(t, _)| t == "ADDED").count(),
        3,
        "{events:?}"
    );
    assert!(events.contains(&("DELETED".into(), "p-0007".into())));
    // A set kubelet read only as JSON (a ConfigMap a pod of the node mounts).
    seed::configmap(store, "ns1", "only-json", serde_json::json!({"k": "v"}));
    let json_only = get(
        "/api/v1/namespaces/ns1/configmaps?fieldSelector=metadata.name%3Donly-json",
        &[
            ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
            ("Accept", "application/json"),
        ],
    );
    assert_eq!(json_only.status, 200);
    s.wait_cached("kubelet", "the listed and watched pods", |e| {
        let names: BTreeSet<&str> = e
            .iter()
            .filter(|e| e["kind"] == "Pod")
            .filter_map(|e| e["key"].as_str())
            .collect();
        names.len() == 1003
            && names.contains("/v1/pods/ns1/late-2")
            && !names.contains("/v1/pods/ns1/p-0007")
            && e.iter().any(|e| e["kind"] == "ConfigMap")
    });

    s.cloud.stop_listening();
    wait_for(
        "the hub to see the cloud down",
        Duration::from_secs(20),
        || (hub.status()["cloud"][0]["healthy"] == false).then_some(()),
    );
    let mut expected: BTreeSet<String> = (0..1000)
        .filter(|i| *i != 7)
        .map(|i| format!("p-{i:04}"))
        .collect();
    expected.extend((0..3).map(|i| format!("late-{i}")));
    expected.insert("mounts".into());

    let offline = get(pods, &kubelet_headers);
    assert_eq!(
        offline.status,
        200,
        "{}",
        String::from_utf8_lossy(&offline.body)
    );
    assert_eq!(offline.header("content-encoding"), Some("gzip"));
    assert_eq!(protobuf_pod_names(&gunzip(&offline.body)), expected);
    // Without Accept-Encoding, the same answer uncompressed.
    let plain = get(pods, &kubelet_headers[..2]);
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(protobuf_pod_names(&plain.body), expected);

    let watch = get(
        &format!("{pods}&watch=true&allowWatchBookmarks=true&timeoutSeconds=1"),
        &kubelet_headers,
    );
    assert_eq!(watch.status, 200);
    assert_eq!(
        watch.header("content-type"),
        Some("application/vnd.kubernetes.protobuf;stream=watch")
    );
    let (events, added) = protobuf_watch_pods(&watch.body);
    assert_eq!(added, expected, "{} events", events.len());

    // Accepting only protobuf for what is cached only as JSON: converted on the node, as
    // kube-apiserver would answer it (read here by k8s-pb's own types).
    let pb_only = [
        ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
        ("Accept", "application/vnd.kubernetes.protobuf"),
    ];
    use k8s_pb::api::core::v1::{ConfigMap, ConfigMapList};
    use k8s_pb::apimachinery::pkg::{apis::meta::v1::WatchEvent, runtime::Unknown};
    use prost::Message;
    let unwrap = |body: &[u8]| {
        let u = Unknown::decode(body.strip_prefix(b"k8s\0").expect("an enveloped object"))
            .expect("a runtime.Unknown");
        let tm = u.type_meta.unwrap_or_default();
        (
            tm.api_version.unwrap_or_default(),
            tm.kind.unwrap_or_default(),
            u.raw.unwrap_or_default(),
        )
    };
    let check = |path: &str, cm: ConfigMap| {
        let meta = cm.metadata.unwrap_or_default();
        assert_eq!(meta.name.as_deref(), Some("only-json"), "{path}");
        assert_eq!(cm.data.get("k").map(String::as_str), Some("v"), "{path}");
    };
    let ok = |path: &str| {
        let r = get(path, &pb_only);
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r
    };
    let path = "/api/v1/namespaces/ns1/configmaps?fieldSelector=metadata.name%3Donly-json";
    let r = ok(path);
    let (_, kind, raw) = unwrap(&r.body);
    assert_eq!(kind, "ConfigMapList");
    let list = ConfigMapList::decode(raw.as_slice()).expect("a ConfigMapList");
    assert_eq!(list.items.len(), 1);
    check(path, list.items.into_iter().next().unwrap());
    let path = "/api/v1/namespaces/ns1/configmaps/only-json";
    let r = ok(path);
    let (api_version, kind, raw) = unwrap(&r.body);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "ConfigMap"));
    check(
        path,
        ConfigMap::decode(raw.as_slice()).expect("a ConfigMap"),
    );
    let path = "/api/v1/namespaces/ns1/configmaps?fieldSelector=metadata.name%3Donly-json&watch=true&timeoutSeconds=1";
    let r = ok(path);
    let len = u32::from_be_bytes(r.body[..4].try_into().unwrap()) as usize;
    let event = WatchEvent::decode(&r.body[4..4 + len]).expect("a raw WatchEvent");
    assert_eq!(event.r#type.as_deref(), Some("ADDED"));
    let (_, _, raw) = unwrap(&event.object.unwrap().raw.unwrap());
    check(
        path,
        ConfigMap::decode(raw.as_slice()).expect("a ConfigMap"),
    );
}

/// Object names and the kind of a list answer, read by full decoders (prost messages with
/// k8s-pb's ListMeta/ObjectMeta for protobuf, serde_json for JSON), whichever the answer is.
fn list_answer(reply: &hub_tests::apiserver::client::Reply) -> (String, BTreeSet<String>) {
    use hub_tests::informer::{AnyList, AnyObject};
    use k8s_pb::apimachinery::pkg::runtime::Unknown;
    use prost::Message;
    let body = match reply.header("content-encoding") {
        Some("gzip") => gunzip(&reply.body),
        _ => reply.body.clone(),
    };
    if reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"))
    {
        let u = Unknown::decode(body.strip_prefix(b"k8s\0").expect("envelope")).unwrap();
        let list = AnyList::decode(u.raw.unwrap().as_slice()).unwrap();
        let names = list
            .items
            .into_iter()
            .map(|raw| {
                let i = AnyObject::decode(raw.as_slice()).unwrap();
                i.metadata.unwrap().name.unwrap()
            })
            .collect();
        (u.type_meta.unwrap().kind.unwrap(), names)
    } else {
        let v: Value = serde_json::from_slice(&body).unwrap();
        let names = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        (v["kind"].as_str().unwrap().to_string(), names)
    }
}

/// The informers a real kubelet opens (tests/fixtures/wire/kubelet-*), as (collection
/// path, selector part of the query, whether kubelet sends `timeout` beside
/// `timeoutSeconds`), for node `node`.
fn kubelet_informers(node: &str) -> Vec<(&'static str, String, bool)> {
    vec![
        (
            "/api/v1/nodes",
            format!("fieldSelector=metadata.name%3D{node}"),
            true,
        ),
        (
            "/api/v1/services",
            "fieldSelector=spec.clusterIP%21%3DNone".into(),
            true,
        ),
        ("/apis/node.k8s.io/v1/runtimeclasses", String::new(), true),
        ("/apis/storage.k8s.io/v1/csidrivers", String::new(), true),
        (
            "/api/v1/pods",
            format!("fieldSelector=spec.nodeName%3D{node}"),
            false,
        ),
        (
            "/api/v1/namespaces/ns1/configmaps",
            "fieldSelector=metadata.name%3Dkube-root-ca.crt".into(),
            true,
        ),
        (
            "/api/v1/namespaces/ns1/configmaps",
            "fieldSelector=metadata.name%3Dcm-a".into(),
            true,
        ),
        (
            "/api/v1/namespaces/ns1/secrets",
            "fieldSelector=metadata.name%3Ds-a".into(),
            true,
        ),
    ]
}

/// An informer's request: `path?selector&rest` (parameters in client-go's order).
fn informer_query(path: &str, selector: &str, rest: &str) -> String {
    // client-go sorts the query: allowWatchBookmarks < fieldSelector < limit < ...
    let mut params: Vec<&str> = rest.split('&').filter(|p| !p.is_empty()).collect();
    if !selector.is_empty() {
        params.push(selector);
    }
    params.sort();
    format!("{path}?{}", params.join("&"))
}

/// A kubelet-shaped client makes the calls a real kubelet of each recorded version makes
/// (its informers' complete sets and watches with their selectors, protobuf and gzip;
/// its node registration, lease, CSINode, status and event writes) with the cloud up,
/// with it down, and after an offline hub restart. 1.32's informers LIST then watch;
/// 1.36's list by streaming only, and the 1.36 node is a fresh one that registers itself.
/// Offline, every set is the one the cloud gave for that exact request (kept fresh by
/// its watch), of its proper kind — never empty, never a 400 for a selector
/// kube-apiserver accepts — and every write gets what kubelet needs to carry on. The
/// calls it makes are checked against the recorded kubelet's call shapes: none it does
/// not make, and every one it does.
fn a_kubelet_rides_out_an_outage_and_an_offline_restart(version: &str) {
    let streaming = version != "1.32";
    let s = Setup::new(&["kubelet"]);
    let node = LOOPBACK_NODE;
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::namespace(store, "kube-node-lease");
    seed::node(store, "other-node");
    for i in 0..20 {
        seed::pod(store, "ns1", &format!("p-{i}"), node, "web");
    }
    // What lets the node read cm-a and s-a (the Node authorizer); cm-b is mounted only
    // by a pod elsewhere.
    seed::pod_mounting(store, "ns1", "uses", node, "web", &["cm-a"], &["s-a"]);
    seed::pod_mounting(
        store,
        "ns1",
        "elsewhere",
        "other-node",
        "web",
        &["cm-b"],
        &[],
    );
    seed::service(store, "ns1", "svc-a", 80);
    for cm in ["kube-root-ca.crt", "cm-a", "cm-b"] {
        seed::configmap(store, "ns1", cm, serde_json::json!({"k": "v"}));
    }
    seed::secret(store, "ns1", "s-a", serde_json::json!({"k": "dg=="}));
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let create =
        |path: &str, v: &Value| assert_eq!(admin.send_json("POST", path, v).status, 201, "{path}");
    let headless = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "headless", "namespace": "ns1"},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]}});
    create("/api/v1/namespaces/ns1/services", &headless);
    let rc = serde_json::json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "runc"}, "handler": "runc"});
    create("/apis/node.k8s.io/v1/runtimeclasses", &rc);
    let node_object = serde_json::json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node}});
    let csinode = serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": node}, "spec": {"drivers": []}});
    let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40}});
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    if !streaming {
        // The 1.32 kubelet was recorded on a node the cloud already knew.
        seed::node(store, node);
        create("/apis/storage.k8s.io/v1/csinodes", &csinode);
        create(leases, &lease);
    }

    let mut hub = s.start_hub();
    let kubelet = s.kubelet();
    let user_agent = if streaming {
        "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0"
    } else {
        "kubelet/v1.32.13 (linux/amd64) kubernetes/d4b43f3"
    };
    let headers = [
        ("User-Agent", user_agent),
        (
            "Accept",
            "application/vnd.kubernetes.protobuf,application/json",
        ),
        ("Accept-Encoding", "gzip"),
    ];
    // Every call made, to check against the recorded kubelet's call shapes at the end.
    let made = std::cell::RefCell::new(Vec::<(String, String)>::new());
    let call = |method: &str, path: &str, extra: &[(&str, &str)], body: &[u8]| {
        made.borrow_mut()
            .push((method.to_string(), path.to_string()));
        let h: Vec<(&str, &str)> = headers.iter().chain(extra).copied().collect();
        kubelet
            .request(method, path, &h, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };
    let json = [("Content-Type", "application/json")];
    let protobuf = [("Content-Type", "application/vnd.kubernetes.protobuf")];
    let timeout = |with: bool| if with { "timeout=7m33s&" } else { "" };
    // The informers' complete sets: a LIST (1.32), or a streamed list (1.36) whose
    // `from` is the version it resumes from (None: its first).
    let complete_set = |informer: &(&str, String, bool), from: Option<u64>| {
        let (path, selector, with_timeout) = informer;
        let (query, streamed) = if streaming {
            let from = from
                .map(|rv| format!("resourceVersion={rv}&"))
                .unwrap_or_default();
            let t = timeout(*with_timeout);
            (
                format!(
                    "allowWatchBookmarks=true&{from}resourceVersionMatch=NotOlderThan&sendInitialEvents=true&{t}timeoutSeconds=1&watch=true"
                ),
                true,
            )
        } else {
            ("limit=500&resourceVersion=0".to_string(), false)
        };
        let path = informer_query(path, selector, &query);
        let r = call("GET", &path, &[], &[]);
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        if streamed {
            let (names, end) =
                hub_tests::informer::initial_set(&r).unwrap_or_else(|e| panic!("{path}: {e}"));
            let end = end.unwrap_or_else(|| panic!("{path}: no initial-events-end bookmark"));
            (String::new(), names, end.parse::<u64>().unwrap())
        } else {
            let (kind, names) = list_answer(&r);
            let rv = hub_tests::informer::decode_list(&r)
                .unwrap()
                .0
                .parse()
                .unwrap();
            (kind, names, rv)
        }
    };
    // The informers' plain watches, from a resourceVersion, as kubelet opens them.
    let informer_watch = |informer: &(&str, String, bool), rv: u64| {
        let (path, selector, with_timeout) = informer;
        let t = timeout(*with_timeout);
        informer_query(
            path,
            selector,
            &format!(
                "allowWatchBookmarks=true&resourceVersion={rv}&{t}timeoutSeconds=1&watch=true"
            ),
        )
    };
    let informers = kubelet_informers(node);
    let node_path = format!("/api/v1/nodes/{node}");
    let lease_path = format!("{leases}/{node}");
    let csinode_path = format!("/apis/storage.k8s.io/v1/csinodes/{node}");

    // 1. Cloud up. A fresh 1.36 node registers itself, its lease and its CSINode first.
    if streaming {
        for path in [
            format!("{csinode_path}?resourceVersion=0"),
            csinode_path.clone(),
        ] {
            assert_eq!(call("GET", &path, &[], &[]).status, 404, "{path}");
        }
        for path in [node_path.clone(), format!("{node_path}?timeout=10s")] {
            assert_eq!(call("GET", &path, &[], &[]).status, 404, "{path}");
        }
        let body = serde_json::to_vec(&node_object).unwrap();
        assert_eq!(call("POST", "/api/v1/nodes", &json, &body).status, 201);
        let r = call("GET", &format!("{lease_path}?timeout=10s"), &[], &[]);
        assert_eq!(r.status, 404);
        let body = serde_json::to_vec(&lease).unwrap();
        let r = call("POST", &format!("{leases}?timeout=10s"), &json, &body);
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let body = serde_json::to_vec(&csinode).unwrap();
        let r = call("POST", "/apis/storage.k8s.io/v1/csinodes", &json, &body);
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        // DRA: its node's ResourceSlices are wiped at every start.
        let wipe =
            format!("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node}");
        assert_eq!(call("DELETE", &wipe, &[], &[]).status, 200);
    }
    // Every informer gets its set, then watches from its version.
    let mut online = Vec::new();
    let mut versions = Vec::new();
    for informer in &informers {
        let (kind, names, rv) = complete_set(informer, None);
        online.push((kind, names));
        versions.push(rv);
    }
    // A pod bound after the list reaches the node only through the pod watch: the
    // watch that follows the LIST, or the streamed list's own stream going on.
    let rv = store.current_rv();
    if streaming {
        let mut pods = Informer::new(
            &kubelet,
            user_agent,
            true,
            informers[4].0,
            &informers[4].1,
            Mode::WatchList,
        );
        pods.sync().unwrap();
        seed::pod(store, "ns1", "late", node, "web");
        wait_for(
            "the late pod on the pods' stream",
            Duration::from_secs(20),
            || {
                pods.pump(Duration::from_millis(200)).unwrap();
                pods.objects.contains_key("ns1/late").then_some(())
            },
        );
        let calls = pods.calls.iter().filter_map(|c| {
            let path = c.strip_prefix("GET ")?.split(" -> ").next()?;
            Some(("GET".to_string(), path.to_string()))
        });
        made.borrow_mut().extend(calls);
    } else {
        seed::pod(store, "ns1", "late", node, "web");
        for informer in &informers {
            let r = call("GET", &informer_watch(informer, rv), &[], &[]);
            assert_eq!(r.status, 200, "{informer:?}");
        }
    }
    online[4].1.insert("late".into());
    // kubelet reads its CSINode, and each of its pods once it starts them. A fresh node
    // (1.36 here) never reads the CSINode it created while the cloud is up: offline it is
    // answered from what the create returned.
    let node_reads = |when: &str| {
        let csinode_reads = if streaming && when == "cloud up" {
            vec![]
        } else {
            vec![
                format!("{csinode_path}?resourceVersion=0"),
                csinode_path.clone(),
            ]
        };
        for path in csinode_reads {
            let r = call("GET", &path, &[], &[]);
            assert_eq!(
                r.status,
                200,
                "{when}: {path}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
        for pod in &online[4].1 {
            let r = call(
                "GET",
                &format!("/api/v1/namespaces/ns1/pods/{pod}"),
                &[],
                &[],
            );
            assert_eq!(r.status, 200, "{when}: {pod}");
            assert_eq!(protobuf_object_name(&r.body), *pod, "{when}");
        }
    };
    node_reads("cloud up");
    let node_pb = call("GET", &node_path, &[], &[]);
    assert_eq!(node_pb.status, 200);
    let lease_pb = call("GET", &format!("{lease_path}?timeout=10s"), &[], &[]);
    assert_eq!(lease_pb.status, 200);
    let register = |body: &[u8]| call("POST", "/api/v1/nodes", &protobuf, body);
    if !streaming {
        assert_eq!(
            register(&node_pb.body).status,
            409,
            "the cloud knows the node"
        );
    }
    // The projected service-account token of a pod, asked in protobuf as kubelet does.
    let token_request = |pod: &str| -> Vec<u8> {
        use k8s_pb::{
            api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
            apimachinery::pkg::runtime::{TypeMeta, Unknown},
        };
        use prost::Message;
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: vec!["https://kubernetes.default.svc".into()],
                expiration_seconds: Some(3607),
                bound_object_ref: Some(BoundObjectReference {
                    kind: Some("Pod".into()),
                    api_version: Some("v1".into()),
                    name: Some(pod.into()),
                    u_id: Some(format!("uid-{pod}")),
                }),
            }),
            ..Default::default()
        };
        let u = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("authentication.k8s.io/v1".into()),
                kind: Some("TokenRequest".into()),
            }),
            raw: Some(req.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [b"k8s\0".to_vec(), u.encode_to_vec()].concat()
    };
    let token_path = "/api/v1/namespaces/ns1/serviceaccounts/default/token";
    let ask_token = |pod: &str| call("POST", token_path, &protobuf, &token_request(pod));
    let token_of = |r: &hub_tests::apiserver::client::Reply| -> String {
        use k8s_pb::{api::authentication::v1::TokenRequest, apimachinery::pkg::runtime::Unknown};
        use prost::Message;
        let u = Unknown::decode(r.body.strip_prefix(b"k8s\0").expect("protobuf")).unwrap();
        TokenRequest::decode(u.raw.unwrap().as_slice())
            .unwrap()
            .status
            .unwrap()
            .token
            .unwrap()
    };
    let issued = ask_token("p-1");
    assert_eq!(
        issued.status,
        201,
        "{}",
        String::from_utf8_lossy(&issued.body)
    );
    let issued = token_of(&issued);
    s.wait_cached("kubelet", "every informer's objects", |e| {
        let has = |k: &str| e.iter().any(|e| e["key"] == k);
        has("/v1/pods/ns1/late")
            && has("node.k8s.io/v1/runtimeclasses/runc")
            && has("/v1/secrets/ns1/s-a")
            && has(&format!(
                "coordination.k8s.io/v1/leases/kube-node-lease/{node}"
            ))
    });

    // 2. Cloud down, 3. a hub restart with it still down: the same answers.
    s.cloud.stop_listening();
    for round in ["cloud down", "offline restart"] {
        if round == "offline restart" {
            drop(hub);
            hub = s.start_hub();
        }
        wait_for(
            "the hub to see the cloud down",
            Duration::from_secs(20),
            || (hub.status()["cloud"][0]["healthy"] == false).then_some(()),
        );
        // Every informer's complete set again, as a restarted kubelet asks for it.
        for (informer, want) in informers.iter().zip(&online) {
            let (kind, names, _) = complete_set(informer, None);
            let got = if streaming {
                (want.0.clone(), names)
            } else {
                (kind, names)
            };
            assert_eq!(&got, want, "{round}: {informer:?}");
        }
        if streaming {
            // The node informer's resume after its stream ended (a plain watch from its
            // version), and after its request failed (a streamed list from it).
            let r = call("GET", &informer_watch(&informers[0], versions[0]), &[], &[]);
            assert_eq!(r.status, 200, "{round}: node resume");
            let (_, names, _) = complete_set(&informers[0], Some(versions[0]));
            assert_eq!(
                names, online[0].1,
                "{round}: node streamed list from its version"
            );
        } else {
            let pods = call("GET", &informer_watch(&informers[4], 0), &[], &[]);
            let (_, added) = protobuf_watch_pods(&pods.body);
            assert_eq!(added, online[4].1, "{round}: the offline pod watch");
            // Every informer's watch is served (from the version its list had).
            for informer in &informers {
                let r = call("GET", &informer_watch(informer, rv), &[], &[]);
                assert_eq!(
                    r.status,
                    200,
                    "{round}: {informer:?}: {}",
                    String::from_utf8_lossy(&r.body)
                );
            }
        }
        node_reads(round);
        let pod_status = call(
            "PATCH",
            "/api/v1/namespaces/ns1/pods/p-1/status",
            &[("Content-Type", "application/strategic-merge-patch+json")],
            br#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
        );
        assert_eq!(pod_status.status, 200, "{round}: pod status");
        // The pod's token: the one the cloud issued for that binding, never a new one;
        // none for a binding the cloud never saw.
        let again = ask_token("p-1");
        assert_eq!(
            again.status,
            201,
            "{round}: {}",
            String::from_utf8_lossy(&again.body)
        );
        assert_eq!(token_of(&again), issued, "{round}");
        let unseen = ask_token("p-2");
        assert_eq!(
            unseen.status,
            503,
            "{round}: {}",
            String::from_utf8_lossy(&unseen.body)
        );
        // Writes: registration answered as the cloud would, the rest queued.
        let reg = register(&node_pb.body);
        assert_eq!(
            reg.status,
            409,
            "{round}: {}",
            String::from_utf8_lossy(&reg.body)
        );
        // In protobuf, as kube-apiserver answers a protobuf-first client.
        let status = protobuf_status(&reg.body);
        assert_eq!(
            (status.reason.as_deref(), status.code),
            (Some("AlreadyExists"), Some(409))
        );
        let renew = call(
            "PUT",
            &format!("{lease_path}?timeout=10s"),
            &protobuf,
            &lease_pb.body,
        );
        assert_eq!(renew.status, 200, "{round}: lease renewal");
        let status_patch = call(
            "PATCH",
            &format!("{node_path}/status?timeout=10s"),
            &[("Content-Type", "application/strategic-merge-patch+json")],
            br#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}}"#,
        );
        assert_eq!(status_patch.status, 200, "{round}: node status");
        let event = serde_json::json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("p-1.{}", round.len()), "namespace": "ns1"},
            "involvedObject": {"kind": "Pod", "name": "p-1", "namespace": "ns1"},
            "reason": "Started", "message": "started", "count": 1, "type": "Normal"});
        let created = call(
            "POST",
            "/api/v1/namespaces/ns1/events",
            &json,
            &serde_json::to_vec(&event).unwrap(),
        );
        assert_eq!(created.status, 201, "{round}: event create");
        // kubelet bumps the count of an event it recorded before the hub saw it.
        let bumped = call(
            "PATCH",
            "/api/v1/namespaces/ns1/events/p-0.never-seen",
            &[("Content-Type", "application/strategic-merge-patch+json")],
            br#"{"count":2}"#,
        );
        assert_eq!(
            bumped.status,
            200,
            "{round}: event patch: {}",
            String::from_utf8_lossy(&bumped.body)
        );
    }

    // 4. Cloud back: the queued node writes reach it.
    s.cloud.start_listening().unwrap();
    wait_for(
        "the queued writes to be replayed",
        Duration::from_secs(60),
        || {
            let c = &hub.status()["cache"];
            // At least the lease's renewals as one write and the two events created (the
            // patches of an event the cloud never had are dropped); a status write that
            // asks for what the cloud already holds sends nothing.
            (c["queued"] == 0 && c["replayed"].as_u64() >= Some(3)).then_some(())
        },
    );
    let events = admin.get("/api/v1/namespaces/ns1/events").json();
    let names: BTreeSet<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["metadata"]["name"].as_str())
        .collect();
    assert!(
        names.contains("p-1.10") && names.contains("p-1.15"),
        "{names:?}"
    );

    // The client made exactly the recorded kubelet's kinds of call, and every one of them.
    let shapes = hub_tests::kubelet_trace::recorded(version);
    let made = made.into_inner();
    let unrecorded: Vec<String> = made
        .iter()
        .filter(|(m, p)| hub_tests::kubelet_trace::shape_of(&shapes, m, p).is_none())
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "calls kubelet {version} does not make: {unrecorded:#?}"
    );
    let used: BTreeSet<_> = made
        .iter()
        .filter_map(|(m, p)| hub_tests::kubelet_trace::shape_of(&shapes, m, p))
        .collect();
    let missing: Vec<String> = shapes
        .iter()
        .filter(|s| !used.contains(s))
        .map(|s| s.to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "recorded calls of kubelet {version} never made: {missing:#?}"
    );
}

#[test]
fn a_kubelet_1_32_rides_out_an_outage_and_an_offline_restart() {
    a_kubelet_rides_out_an_outage_and_an_offline_restart("1.32");
}

#[test]
fn a_kubelet_1_36_rides_out_an_outage_and_an_offline_restart() {
    a_kubelet_rides_out_an_outage_and_an_offline_restart("1.36");
}

/// The name of a protobuf object answer, read by k8s-pb.
fn protobuf_object_name(body: &[u8]) -> String {
    use k8s_pb::apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::Unknown};
    use prost::Message;
    #[derive(Clone, PartialEq, prost::Message)]
    struct AnyObject {
        #[prost(message, optional, tag = "1")]
        metadata: Option<ObjectMeta>,
    }
    let u = Unknown::decode(body.strip_prefix(b"k8s\0").expect("protobuf")).unwrap();
    let o = AnyObject::decode(u.raw.unwrap().as_slice()).unwrap();
    o.metadata.unwrap().name.unwrap()
}

/// Cached objects are inspected through an owner-only socket, not the admin TCP port any
/// local process reaches; a Secret's values are shown only when asked for.
#[test]
fn cached_objects_are_for_root_only_and_secrets_are_redacted() {
    if !privileged::check("cached_objects_are_for_root_only_and_secrets_are_redacted") {
        return;
    }
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, "ns1");
    seed::secret(store, "ns1", "s1", serde_json::json!({"k": "c2VjcmV0"}));
    seed::pod_mounting(store, "ns1", "user", "node-0", "x", &[], &["s1"]);
    let hub = s.start_hub();
    let r = s.kubelet().request(
        "GET",
        "/api/v1/namespaces/ns1/secrets/s1",
        &[
            ("User-Agent", "kubelet/v1.32.13"),
            ("Accept", "application/json"),
        ],
        &[],
    );
    assert_eq!(r.unwrap().status, 200);
    s.wait_cached("kubelet", "the secret", |e| {
        e.iter().any(|e| e["key"] == "/v1/secrets/ns1/s1")
    });

    // The admin port answers health and status, never cached objects.
    assert!(hub.admin_get("/healthz").starts_with("HTTP/1.1 200"));
    for path in ["/v1/cache/ls", "/v1/cache/get?key=/v1/secrets/ns1/s1"] {
        let answer = hub.admin_get(path);
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        assert!(!answer.contains("c2VjcmV0"));
    }

    let get = |extra: &[&str], uid: Option<u32>| {
        let mut c = Command::new(hub_tests::hub_bin());
        c.args(["cache", "get", "/v1/secrets/ns1/s1", "--dir"])
            .arg(&s.state)
            .args(extra);
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, uid);
        }
        c.output().unwrap()
    };
    let redacted = get(&[], None);
    let text = String::from_utf8_lossy(&redacted.stdout);
    assert!(
        redacted.status.success(),
        "{}",
        String::from_utf8_lossy(&redacted.stderr)
    );
    assert!(
        text.contains("<redacted, 8 bytes>") && !text.contains("c2VjcmV0"),
        "{text}"
    );
    let shown = get(&["--show-secrets"], None);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("c2VjcmV0"));
    // Anyone but root: neither the socket nor the store file.
    let other = get(&["--show-secrets"], Some(1000));
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "uid 1000 read the cache");
    assert!(!String::from_utf8_lossy(&other.stdout).contains("c2VjcmV0"));
    assert!(err.contains("ermission denied"), "{err}");
}

/// A relist of objects the cache already holds writes nothing, in either encoding; a
/// changed object always lands and a vanished one is pruned. Counted with the cache's
/// store counters (`hub status`: written / stale / deleted) and checked in `hub cache ls`.
#[test]
fn relists_of_unchanged_objects_write_nothing_and_changes_always_land() {
    let s = Setup::new(&["kubelet"]);
    let store = &s.cloud.state.store;
    let pods = resources::find("", "v1", "pods").unwrap();
    seed::namespace(store, "rl");
    for p in 0..50 {
        seed::pod(store, "rl", &format!("p{p}"), "node-0", "rl");
    }
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    // written, stale, deleted; and of the stale, those never parsed.
    let counts = || {
        let c = hub.status()["cache"].clone();
        ["written", "stale", "deleted", "scanned_only"].map(|k| c[k].as_u64().unwrap())
    };
    // Waits until the writer has dealt with `n` more objects than `before`.
    let settled = |before: [u64; 4], n: u64| {
        wait_for(
            "the cache writer to apply the lists",
            Duration::from_secs(20),
            || {
                let now = counts();
                (now[..3].iter().sum::<u64>() == before[..3].iter().sum::<u64>() + n).then_some(now)
            },
        )
    };
    let path = "/api/v1/namespaces/rl/pods?fieldSelector=spec.nodeName%3Dnode-0";
    let cached_rv = |name: &str, encoding: &str| {
        s.cache_ls("kubelet")
            .into_iter()
            .find(|e| e["key"] == format!("/v1/pods/rl/{name}") && e["encoding"] == encoding)
            .map(|e| e["resource_version"].as_u64().unwrap())
    };
    for (accept, encoding, changed) in [
        ("application/json", "json", "p7"),
        (PROTOBUF, "protobuf", "p9"),
    ] {
        let list = |times: usize| {
            for _ in 0..times {
                let r = kubelet
                    .request(
                        "GET",
                        path,
                        &[
                            ("User-Agent", "kubelet/v1.32.0 (linux/amd64)"),
                            ("Accept", accept),
                        ],
                        &[],
                    )
                    .unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            }
        };
        // First list in this encoding: every object is written (new, or now in protobuf).
        let before = counts();
        list(1);
        let first = settled(before, 50);
        assert_eq!(first[0] - before[0], 50, "{encoding}: first list {first:?}");
        // Three relists of the same objects: nothing written.
        list(3);
        let relisted = settled(first, 150);
        assert_eq!(
            relisted[0], first[0],
            "{encoding}: relists rewrote objects {relisted:?}"
        );
        assert_eq!(relisted[1] - first[1], 150, "{encoding}");
        assert_eq!(
            relisted[3] - first[3],
            150,
            "{encoding}: relisted objects were parsed"
        );
        // One object changes in the cloud: exactly it is written, at its new version.
        let new_rv = store
            .update(
                Key {
                    resource: pods,
                    namespace: "rl".into(),
                    name: changed.into(),
                },
                None,
                |cur| {
                    let mut next = cur.clone();
                    next["metadata"]["labels"]["changed"] = "yes".into();
                    next
                },
            )
            .unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap();
        list(1);
        let after = settled(relisted, 50);
        assert_eq!(
            [
                after[0] - relisted[0],
                after[1] - relisted[1],
                after[3] - relisted[3]
            ],
            [1, 49, 49],
            "{encoding}"
        );
        assert_eq!(cached_rv(changed, encoding), Some(new_rv), "{encoding}");
    }
    // An object gone from the cloud is pruned by the next (unchanged otherwise) relist.
    store
        .delete(
            Key {
                resource: pods,
                namespace: "rl".into(),
                name: "p3".into(),
            },
            None,
        )
        .unwrap();
    let before = counts();
    let r = kubelet_get(&kubelet, path);
    assert_eq!(r.status, 200);
    let after = settled(before, 50);
    assert_eq!(
        [
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2],
            after[3] - before[3]
        ],
        [0, 49, 1, 49]
    );
    assert_eq!(
        cached_rv("p3", "protobuf"),
        None,
        "hub cache ls lists live objects only"
    );
    assert!(cached_rv("p4", "protobuf").is_some());
}

/// The items of a JSON list or the object of a JSON get, by namespace/name.
fn json_objects(body: &[u8]) -> std::collections::BTreeMap<String, Value> {
    let v: Value = serde_json::from_slice(body).expect("a JSON answer");
    let items = match v["items"].as_array() {
        Some(items) => items.clone(),
        None => vec![v],
    };
    items
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, o)
        })
        .collect()
}

/// What the kubelet cached in protobuf, kubectl (JSON only, with the kubelet's own
/// credentials, as an operator on the node uses them) lists and gets while the cloud is
/// down: the cloud's own JSON of those objects, converted on the node.
#[test]
fn kubectl_reads_offline_what_the_kubelet_cached_in_protobuf() {
    let s = Setup::new(&["kubelet", "kubectl"]);
    seed_namespaces(&s.cloud);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let pods = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0";
    assert_eq!(kubelet_get(&kubelet, pods).status, 200);
    assert_eq!(kubelet_get(&kubelet, "/api/v1/nodes/node-0").status, 200);
    s.wait_cached("kubelet", "kubelet's pods and node", |e| {
        e.iter()
            .filter(|e| e["kind"] == "Pod" && e["encoding"] == "protobuf")
            .count()
            == 7
            && e.iter()
                .any(|e| e["key"] == "/v1/nodes/node-0" && e["encoding"] == "protobuf")
    });
    // Ground truth: the cloud's own JSON of the same objects.
    let cloud_addr = s
        .cloud
        .url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let cloud = Client::new(cloud_addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let json = [("Accept", "application/json")];
    let cloud_pods = json_objects(&cloud.request("GET", pods, &json, &[]).unwrap().body);
    let cloud_node = json_objects(&cloud.get("/api/v1/nodes/node-0").body);
    assert_eq!(cloud_pods.len(), 7);

    let kc = s.dir.path().join("kubelet-creds.kubeconfig");
    hub_tests::apiserver::write_kubeconfig(
        &kc,
        &format!("https://{}", s.hub_addr()),
        &s.ca.cert_pem(),
        hub_tests::apiserver::Credentials::ClientCert {
            cert_pem: &s.pki.kubelet.cert_pem,
            key_pem: &s.pki.kubelet.key_pem,
        },
    )
    .unwrap();
    // Online, kubectl reads discovery only (no pod or node of its own is cached).
    kubectl_ok(&kc, &["api-resources"]);
    s.cloud_down(&hub);
    let node_pods = |output: &[&str]| {
        let get = [
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=node-0",
        ];
        kubectl_ok(&kc, &[&get[..], output].concat())
    };
    let listed = json_objects(node_pods(&["-o", "json"]).as_bytes());
    assert_eq!(
        listed.keys().collect::<Vec<_>>(),
        cloud_pods.keys().collect::<Vec<_>>()
    );
    for (key, pod) in &listed {
        // kubectl lists as a List of items with their kind and apiVersion filled in.
        let mut pod = pod.clone();
        let mut want = cloud_pods[key].clone();
        for o in [&mut pod, &mut want] {
            o.as_object_mut().unwrap().remove("kind");
            o.as_object_mut().unwrap().remove("apiVersion");
        }
        assert_eq!(
            pod, want,
            "{key}: converted on the node differs from the cloud's JSON"
        );
    }
    // kubectl's default table output too (it falls back from Table to the objects).
    let table = node_pods(&[]);
    for key in cloud_pods.keys() {
        let name = key.rsplit('/').next().unwrap();
        assert!(table.contains(name), "{name} missing from:\n{table}");
    }
    let (ok, node, err) = kubectl(&kc, &["get", "node", "node-0", "-o", "json"]);
    assert!(ok, "{err}");
    assert_eq!(json_objects(node.as_bytes()), cloud_node);
    // Raw, as any JSON client: a 200 in JSON, from the cache.
    let raw = Client::new(s.hub_addr(), s.ca.cert_der(), None, Some(&s.pki.kubelet))
        .request("GET", "/api/v1/nodes/node-0", &json, &[])
        .unwrap();
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    assert!(
        raw.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
    );
    assert_eq!(json_objects(&raw.body), cloud_node);
    // Counted: every pod and node answered was converted on the node, nothing left out.
    let metrics = hub.admin_get("/metrics");
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics"))
    };
    assert!(counter("hub_convert_objects_total ") >= 8, "{metrics}");
    assert_eq!(counter("hub_convert_fields_left_out_total "), 0);
}
