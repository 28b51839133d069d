//! Current Kubernetes lists by streaming: client-go 1.35+ informers (kubelet 1.36 has no
//! LIST at all) get their complete set from `watch?sendInitialEvents=true`, whose ADDED
//! events up to the bookmark annotated `k8s.io/initial-events-end` are the set. Through
//! the hub, client-go-shaped informers in both modes — LIST then watch, and streamed
//! list — over the node's pods (by `spec.nodeName`), services, EndpointSlices and one
//! ConfigMap by name, in protobuf and JSON, ride out an outage and an offline restart of
//! the hub with exactly the set the cloud gave, and a deletion made in the cloud while the
//! hub was stopped is gone from the offline answers once a fresh set was taken.
use std::time::Duration;

use hub_tests::{
    apiserver::{ADMIN_TOKEN, client::Client, seed},
    hub::{HubProc, LOOPBACK_NODE},
    informer::{Informer, Mode},
    scenario::{OTHER_TOKEN, Setup},
    wait_for,
};
use serde_json::json;

const NODE: &str = LOOPBACK_NODE;
const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const KUBE_PROXY: &str = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/7b29fb0";

/// One informer's scope: (name, user agent, protobuf, path, selector).
type Scope = (&'static str, &'static str, bool, &'static str, String);

/// The informers a node runs that this test follows: kubelet's pods, services and one
/// mounted ConfigMap (protobuf, the node's certificate) and kube-proxy's EndpointSlices
/// (JSON here, its own token).
fn scopes() -> Vec<Scope> {
    vec![
        (
            "pods",
            KUBELET,
            true,
            "/api/v1/pods",
            format!("fieldSelector=spec.nodeName%3D{NODE}"),
        ),
        (
            "services",
            KUBELET,
            true,
            "/api/v1/services",
            "fieldSelector=spec.clusterIP%21%3DNone".into(),
        ),
        (
            "configmap",
            KUBELET,
            true,
            "/api/v1/namespaces/ns1/configmaps",
            "fieldSelector=metadata.name%3Dcm-a".into(),
        ),
        (
            "endpointslices",
            KUBE_PROXY,
            false,
            "/apis/discovery.k8s.io/v1/endpointslices",
            "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name".into(),
        ),
    ]
}

struct Node {
    s: Setup,
    /// The node's certificate (kubelet) and kube-proxy's token.
    kubelet: Client,
    proxy: Client,
    admin: Client,
}

impl Node {
    fn new() -> Node {
        let s = Setup::new(&["kubelet", "kube-proxy"]);
        let store = &s.cloud.state.store;
        seed::base(store);
        seed::namespace(store, "ns1");
        seed::node(store, NODE);
        seed::node(store, "other-node");
        // p-0 mounts cm-a (the Node authorizer lets the node read it).
        seed::pod_mounting(store, "ns1", "p-0", NODE, "web", &["cm-a"], &[]);
        for i in 1..5 {
            seed::pod(store, "ns1", &format!("p-{i}"), NODE, "web");
        }
        seed::pod(store, "ns1", "elsewhere", "other-node", "web");
        for (name, port) in [("svc-a", 80), ("svc-b", 81)] {
            seed::service(store, "ns1", name, port);
        }
        for cm in ["cm-a", "cm-b"] {
            seed::configmap(store, "ns1", cm, json!({"k": "v"}));
        }
        let kubelet = s.kubelet();
        let proxy = Client::new(s.hub_addr(), s.ca.cert_der(), Some(OTHER_TOKEN), None);
        let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
        let headless = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "headless", "namespace": "ns1"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}});
        let r = admin.send_json("POST", "/api/v1/namespaces/ns1/services", &headless);
        assert_eq!(r.status, 201);
        let mut slice = seed::endpointslice_object("headless-x", 80);
        slice["metadata"]["namespace"] = json!("ns1");
        slice["metadata"]["labels"]["service.kubernetes.io/headless"] = json!("");
        let r = admin.send_json(
            "POST",
            "/apis/discovery.k8s.io/v1/namespaces/ns1/endpointslices",
            &slice,
        );
        assert_eq!(r.status, 201);
        Node {
            s,
            kubelet,
            proxy,
            admin,
        }
    }

    fn informers(&self, mode: Mode) -> Vec<Informer<'_>> {
        scopes()
            .into_iter()
            .map(|(_, ua, protobuf, path, selector)| {
                let client = if ua == KUBE_PROXY {
                    &self.proxy
                } else {
                    &self.kubelet
                };
                Informer::new(client, ua, protobuf, path, &selector, mode)
            })
            .collect()
    }

    /// What the cloud holds in each informer's scope, as `namespace/name`.
    fn truth(&self) -> Vec<Vec<String>> {
        let names = |path: &str| -> Vec<String> {
            let v = self.admin.get(path).json();
            let mut n: Vec<String> = v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    format!(
                        "{}/{}",
                        i["metadata"]["namespace"].as_str().unwrap_or_default(),
                        i["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect();
            n.sort();
            n
        };
        scopes()
            .iter()
            .map(|(_, _, _, path, selector)| names(&format!("{path}?{selector}")))
            .collect()
    }

    fn hub_sees_cloud(&self, hub: &HubProc, healthy: bool) {
        wait_for(
            "the hub to judge the cloud",
            Duration::from_secs(20),
            || (hub.status()["cloud"][0]["healthy"] == healthy).then_some(()),
        );
    }
}

/// Fresh informers of `mode` take their complete sets (offline: from the hub's cache) and
/// must find exactly `want`; a streamed list must end with the annotated bookmark.
fn fresh_sets_are(node: &Node, mode: Mode, want: &[Vec<String>], when: &str) {
    let how = match mode {
        Mode::ListThenWatch => "list",
        Mode::WatchList => "watch-list",
    };
    for ((name, ..), (mut inf, want)) in scopes()
        .iter()
        .zip(node.informers(mode).into_iter().zip(want))
    {
        let synced = inf
            .sync()
            .unwrap_or_else(|e| panic!("{when}: {name} ({how}): {e}\ncalls: {:#?}", inf.calls));
        assert_eq!(synced.how, how, "{when}: {name}: {:#?}", inf.calls);
        assert_eq!(
            synced.end_annotated,
            mode == Mode::WatchList,
            "{when}: {name}"
        );
        assert_eq!(&inf.names(), want, "{when}: {name} ({how})");
    }
}

/// Waits until the hub's cache holds the sets the informers were just given.
fn wait_stored(node: &Node, hub: &HubProc) {
    wait_for(
        "the cache writer to store what was answered",
        Duration::from_secs(30),
        || (hub.status()["cache"]["pending"] == 0).then_some(()),
    );
    let _ = node;
}

fn informers_ride_out_an_outage_a_restart_and_a_deletion_while_stopped(mode: Mode) {
    let node = Node::new();
    let mut hub = node.s.start_hub();
    let online = node.truth();
    assert_eq!(online[0].len(), 5, "the node's pods: {:?}", online[0]);
    assert_eq!(
        online[1],
        ["ns1/svc-a", "ns1/svc-b"],
        "not the headless one"
    );
    assert_eq!(online[2], ["ns1/cm-a"]);
    assert_eq!(
        online[3],
        ["ns1/svc-a-abc12", "ns1/svc-b-abc12"],
        "not the headless one"
    );

    // 1. Cloud up: every informer syncs and keeps its set current from the watch.
    let mut running = node.informers(mode);
    for inf in &mut running {
        inf.sync().unwrap();
    }
    seed::pod(&node.s.cloud.state.store, "ns1", "late", NODE, "web");
    let mut want = node.truth();
    wait_for(
        "the pod informer's watch to bring the new pod",
        Duration::from_secs(20),
        || {
            running[0].pump(Duration::from_millis(200)).unwrap();
            (running[0].names() == want[0]).then_some(())
        },
    );
    for (inf, want) in running.iter().zip(&want) {
        assert_eq!(&inf.names(), want);
    }
    wait_stored(&node, &hub);

    // 2. The cloud goes away: running informers keep their sets through their re-watches,
    //    and fresh ones get exactly the held sets from the cache, in their own shape.
    node.s.cloud.stop_listening();
    node.hub_sees_cloud(&hub, false);
    for inf in &mut running {
        inf.pump(Duration::from_secs(1)).unwrap_or_else(|e| {
            panic!("offline re-watch: {e}\n{:#?}", inf.calls);
        });
    }
    for (inf, want) in running.iter().zip(&want) {
        assert_eq!(&inf.names(), want, "kept through the outage");
    }
    drop(running);
    fresh_sets_are(&node, mode, &want, "outage");
    // Both shapes from either: a set learned by streaming answers a LIST, and the reverse.
    let other = match mode {
        Mode::ListThenWatch => Mode::WatchList,
        Mode::WatchList => Mode::ListThenWatch,
    };
    fresh_sets_are(&node, other, &want, "outage, the other shape");
    // A LIST of the pods with each resourceVersion semantics: the held set.
    let pods = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let list = |query: &str| {
        let headers = [
            ("User-Agent", KUBELET),
            ("Accept", "application/vnd.kubernetes.protobuf"),
        ];
        let r = node
            .kubelet
            .request("GET", &format!("{pods}{query}"), &headers, &[])
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{query}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r
    };
    let rv = hub_tests::informer::decode_list(&list("")).unwrap().0;
    for query in [
        String::new(),
        "&resourceVersion=0".into(),
        format!("&resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
    ] {
        let r = list(&query);
        let (_, items) = hub_tests::informer::decode_list(&r).unwrap();
        let names: Vec<String> = items.into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, want[0], "LIST{query}");
    }

    // 3. The hub restarts with the cloud still away: the same sets.
    drop(hub);
    hub = node.s.start_hub();
    node.hub_sees_cloud(&hub, false);
    fresh_sets_are(&node, mode, &want, "offline restart");

    // 4. Deletions in the cloud while the hub is stopped; once it is back a fresh set is
    //    taken through it, and offline the deleted objects are gone.
    node.s.cloud.start_listening().unwrap();
    drop(hub);
    for path in [
        "/api/v1/namespaces/ns1/pods/p-1",
        "/api/v1/namespaces/ns1/services/svc-b",
        "/api/v1/namespaces/ns1/configmaps/cm-a",
        "/apis/discovery.k8s.io/v1/namespaces/ns1/endpointslices/svc-b-abc12",
    ] {
        let r = node.admin.request("DELETE", path, &[], &[]).unwrap();
        assert_eq!(r.status, 200, "DELETE {path}");
    }
    want = node.truth();
    assert!(!want[0].contains(&"ns1/p-1".to_string()));
    assert!(want[2].is_empty());
    hub = node.s.start_hub();
    node.hub_sees_cloud(&hub, true);
    fresh_sets_are(&node, mode, &want, "cloud back, deletions made meanwhile");
    wait_stored(&node, &hub);
    node.s.cloud.stop_listening();
    node.hub_sees_cloud(&hub, false);
    fresh_sets_are(&node, mode, &want, "offline after the deletions");
    fresh_sets_are(
        &node,
        other,
        &want,
        "offline after the deletions, the other shape",
    );
    // The deleted ConfigMap, asked by name: truthfully not found.
    let r = node
        .kubelet
        .request(
            "GET",
            "/api/v1/namespaces/ns1/configmaps/cm-a",
            &[("User-Agent", KUBELET)],
            &[],
        )
        .unwrap();
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn list_then_watch_informers_ride_out_an_outage_a_restart_and_a_deletion_while_stopped() {
    informers_ride_out_an_outage_a_restart_and_a_deletion_while_stopped(Mode::ListThenWatch);
}

#[test]
fn watch_list_informers_ride_out_an_outage_a_restart_and_a_deletion_while_stopped() {
    informers_ride_out_an_outage_a_restart_and_a_deletion_while_stopped(Mode::WatchList);
}
