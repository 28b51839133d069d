//! Issue 8 (first part): hubs push their node's cache into a real etcd coordinator, a hub
//! serves the whole pool's data from it while the cloud is down, and a wiped coordinator is
//! refilled by the hubs' re-push.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use hub_tests::{
    TempDir,
    apiserver::{ADMIN_TOKEN, Options, StandIn, auth::Rule, client::Client, seed, tls::TestCa},
    etcd::EtcdCluster,
    hub::{HubProc, LOOPBACK_NODE, LoopbackHub},
    kubectl, output_with_stdin, wait_for,
};
use serde_json::Value;

struct Node {
    hub: HubProc,
    tls: u16,
    plain: u16,
    state: TempDir,
}

/// A hub named `node` (its PKI must be issued for that name), with `more` appended to its
/// coordinator section.
fn start_named_hub(
    cloud: &StandIn,
    pki: &hub_tests::apiserver::tls::HubPki,
    etcd: &EtcdCluster,
    node: &str,
    more: &str,
) -> Node {
    let state = TempDir::new("pool");
    let config = LoopbackHub::pool_member(cloud.url(), pki, &etcd.endpoints(), more);
    let (tls, plain) = (config.tls.expect("a TLS port"), config.plain);
    let dir = state.path().to_path_buf();
    let hub = HubProc::start_yaml(None, &config.admin.clone(), None, |_, _| {
        config.yaml(&dir).replace(
            &format!("nodeName: {LOOPBACK_NODE}\n"),
            &format!("nodeName: {node}\n"),
        )
    });
    Node {
        hub,
        tls,
        plain,
        state,
    }
}

/// The cloud: a stand-in on loopback (base data seeded) with the test identities, and
/// its CA.
fn cloud() -> (Arc<TestCa>, StandIn) {
    let cloud = StandIn::start("127.0.0.1:0".parse().unwrap(), Options::default()).unwrap();
    cloud.state.auth.write().unwrap().add_test_identities();
    (cloud.ca.clone(), cloud)
}

#[test]
fn a_hub_serves_the_whole_pool_offline_and_a_wiped_coordinator_is_refilled() {
    let mut etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    seed::cluster(&cloud.state.store, 2, 3);
    let dir = TempDir::new("pool");
    let names = ["node-0", "node-1"];
    let pkis: Vec<_> = names
        .iter()
        .map(|n| ca.write_hub_pki(&dir.path().join(n), n, &[]).unwrap())
        .collect();
    let nodes: Vec<Node> = names
        .iter()
        .zip(&pkis)
        .map(|(n, pki)| start_named_hub(&cloud, pki, &etcd, n, ""))
        .collect();
    let plain_server = format!("--server=http://127.0.0.1:{}", nodes[1].plain);
    let empty_kubeconfig = dir.path().join("empty");
    std::fs::write(&empty_kubeconfig, "").unwrap();

    // Each node's kubelet lists its own pods through its own hub; node 0's in protobuf, as
    // a real kubelet does — kubectl, which reads only JSON, must still see its pods.
    let kubelet_list = |n: &Node, i: usize| {
        let accept = if i == 0 {
            "application/vnd.kubernetes.protobuf, application/json"
        } else {
            "application/json"
        };
        let kubelet = Client::new(
            format!("127.0.0.1:{}", n.tls).parse().unwrap(),
            ca.cert_der(),
            None,
            Some(&pkis[i].kubelet),
        );
        let r = kubelet
            .request(
                "GET",
                &format!("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{i}"),
                &[("User-Agent", "kubelet/v1.32.0"), ("Accept", accept)],
                &[],
            )
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type")
                .is_some_and(|c| c.contains("protobuf")),
            i == 0
        );
    };
    for (i, n) in nodes.iter().enumerate() {
        kubelet_list(n, i);
    }
    // Discovery through node 1's hub while online, as kubectl does on first use (not a
    // pod list: the pods the pool shows later must come from the kubelets' pushes).
    let (ok, _, err) = kubectl(
        &empty_kubeconfig,
        &[&plain_server, "get", "csidrivers", "-o", "name"],
    );
    assert!(ok, "{err}");
    let all_six = wait_for(
        "both nodes' pods in the coordinator",
        Duration::from_secs(20),
        || {
            let keys = etcd.keys("/registry/pods/");
            (keys.len() == 6).then_some(keys)
        },
    );
    assert!(
        all_six.contains(&"/registry/pods/default/pod-0-0".to_string()),
        "{all_six:?}"
    );
    // Both nodes' pods are in the pool in kube-apiserver's storage encoding: node 0's
    // protobuf as it came, node 1's JSON converted on the node. The push asked the cloud
    // for no pod.
    for (key, value) in etcd_dump(&etcd, &["/registry/pods/", "--prefix"]) {
        assert!(value.starts_with(b"k8s\0"), "{key} is not protobuf");
    }
    let c = nodes[1].hub.status()["coordinator"].clone();
    assert!(c["converted_for_storage"].as_u64() >= Some(3), "{c}");
    assert_eq!(c["stored_as_json"], 0, "{c}");
    let pod_gets: Vec<String> = cloud
        .audit()
        .into_iter()
        .filter(|e| {
            e.method == "GET"
                && e.path.starts_with("/api/v1/namespaces/")
                && e.path.contains("/pods/")
        })
        .map(|e| format!("{} {}", e.user, e.path))
        .collect();
    assert!(
        pod_gets.is_empty(),
        "the cloud was asked for pods: {pod_gets:?}"
    );
    assert!(
        nodes[1]
            .hub
            .admin_get("/metrics")
            .contains("hub_coordinator_converted_for_storage_total"),
    );

    // A pod deleted in the cloud leaves node 0's cache at its next list, then the pool.
    let pods = hub_tests::apiserver::resources::find("", "v1", "pods").unwrap();
    cloud
        .state
        .store
        .delete(
            hub_tests::apiserver::store::Key {
                resource: pods,
                namespace: "default".into(),
                name: "pod-0-2".into(),
            },
            None,
        )
        .unwrap();
    kubelet_list(&nodes[0], 0);
    wait_for(
        "the deleted pod gone from the coordinator",
        Duration::from_secs(20),
        || {
            let keys = etcd.keys("/registry/pods/");
            (keys.len() == 5 && !keys.contains(&"/registry/pods/default/pod-0-2".to_string()))
                .then_some(())
        },
    );

    // One leader for the pool while the cloud and the coordinator are healthy.
    wait_for("exactly one pool leader", Duration::from_secs(20), || {
        let roles: Vec<Value> = nodes
            .iter()
            .map(|n| n.hub.status()["coordinator"]["role"].clone())
            .collect();
        (roles.iter().filter(|r| *r == "leader").count() == 1
            && roles.iter().filter(|r| *r == "follower").count() == 1)
            .then_some(())
    });

    // The cloud goes away: node 1's hub answers with node 0's pods from the coordinator.
    cloud_down(&cloud, &nodes);
    let (ok, out, err) = kubectl(
        &empty_kubeconfig,
        &[&plain_server, "get", "pods", "-A", "-o", "json"],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("pool coordinator"),
        "served from the coordinator: {err}"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["pod-0-0", "pod-0-1", "pod-1-0", "pod-1-1", "pod-1-2"]
    );
    let status = nodes[1].hub.status();
    assert!(
        status["routes"]["coordinator"]["requests"].as_u64() > Some(0),
        "{status}"
    );
    // A pod's own token is not served pool data: the cloud never judged it for it.
    let pod = Client::new(
        format!("127.0.0.1:{}", nodes[1].tls).parse().unwrap(),
        ca.cert_der(),
        Some(ADMIN_TOKEN),
        None,
    );
    let r = pod.get("/api/v1/pods");
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("node identity only"));

    // The coordinator is wiped and rebuilt: both hubs push everything again.
    let epoch = nodes[0].hub.status()["coordinator"]["epoch"].clone();
    etcd.wipe_member(0);
    let refilled = wait_for("the hubs to re-push", Duration::from_secs(20), || {
        let keys = etcd.keys("/registry/pods/");
        (keys.len() == 5).then_some(keys)
    });
    let expected: Vec<String> = all_six
        .into_iter()
        .filter(|k| !k.ends_with("/pod-0-2"))
        .collect();
    assert_eq!(refilled, expected);
    for n in &nodes {
        // Healthy again once its connection to the restarted member settles (a request or
        // two may still fail on the old channel right after the new epoch is read).
        let c = wait_for(
            "the hub to report the new epoch, healthy",
            Duration::from_secs(10),
            || {
                let c = n.hub.status()["coordinator"].clone();
                (c["epoch"] != epoch && c["healthy"] == true).then_some(c)
            },
        );
        assert!(c["full_pushes"].as_u64() >= Some(2), "{c}");
    }
}

const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

#[test]
fn the_leader_syncs_pool_scope_resources_for_the_pool_and_followers_watch_them_across_a_failover() {
    const TTL: u64 = 3;
    let etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    for i in 0..5 {
        seed::service(&cloud.state.store, "default", &format!("svc-{i}"), 8000 + i);
    }
    let dir = TempDir::new("pool");
    let names = ["edge-0", "edge-1", "edge-2"];
    let pkis: Vec<_> = names
        .iter()
        .map(|n| ca.write_hub_pki(&dir.path().join(n), n, &[]).unwrap())
        .collect();
    let more = format!("  leaderLeaseSeconds: {TTL}\n");
    let mut nodes: Vec<Option<Node>> = names
        .iter()
        .zip(&pkis)
        .map(|(n, pki)| Some(start_named_hub(&cloud, pki, &etcd, n, &more)))
        .collect();
    let role = |n: &Node| {
        n.hub.status()["coordinator"]["role"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let leader = wait_for("one pool leader", Duration::from_secs(20), || {
        let roles: Vec<String> = nodes.iter().map(|n| role(n.as_ref().unwrap())).collect();
        (roles.iter().filter(|r| *r == "leader").count() == 1
            && roles.iter().filter(|r| *r == "follower").count() == 2)
            .then(|| roles.iter().position(|r| r == "leader").unwrap())
    });
    wait_for(
        "the leader to sync endpointslices",
        Duration::from_secs(20),
        || {
            etcd.etcdctl(
                &etcd.endpoints(),
                &["get", "/hub/synced/discovery.k8s.io/v1/endpointslices"],
            )
            .ok()
            .filter(|o| !o.trim().is_empty())
        },
    );
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let metrics = nodes[leader].as_ref().unwrap().hub.admin_get("/metrics");
    assert!(
        metrics.contains("hub_coordinator_leader 1")
            && metrics.contains("hub_coordinator_healthy 1"),
        "{metrics}"
    );
    let metrics = nodes[followers[0]]
        .as_ref()
        .unwrap()
        .hub
        .admin_get("/metrics");
    assert!(metrics.contains("hub_coordinator_leader 0"), "{metrics}");
    let client = |i: usize| {
        Client::new(
            format!("127.0.0.1:{}", nodes[i].as_ref().unwrap().tls)
                .parse()
                .unwrap(),
            ca.cert_der(),
            None,
            Some(&pkis[i].kubelet),
        )
    };
    let clients: Vec<Client> = (0..3).map(client).collect();
    // Followers list endpointslices from the coordinator: the five the cloud has.
    let mut list_rv = String::new();
    for &f in &followers {
        let r = clients[f].get(SLICES);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        let mut got: Vec<&str> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                "svc-0-abc12",
                "svc-1-abc12",
                "svc-2-abc12",
                "svc-3-abc12",
                "svc-4-abc12"
            ]
        );
        list_rv = v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let st = nodes[f].as_ref().unwrap().hub.status();
        assert!(
            st["routes"]["coordinator"]["requests"].as_u64() > Some(0),
            "{st}"
        );
    }
    // Both followers watch from the list's resourceVersion.
    let mut watches: Vec<_> = followers
        .iter()
        .map(|&f| clients[f].watch_from(SLICES, &list_rv))
        .collect();
    let admin = Client::new(cloud.addr, ca.cert_der(), Some(ADMIN_TOKEN), None);
    let ns_slices = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";
    assert_eq!(
        admin
            .send_json(
                "POST",
                ns_slices,
                &seed::endpointslice_object("new-0", 9000)
            )
            .status,
        201
    );
    let patched = admin
        .request(
            "PATCH",
            &format!("{ns_slices}/svc-1-abc12"),
            &[("Content-Type", "application/merge-patch+json")],
            br#"{"metadata":{"labels":{"changed":"yes"}}}"#,
        )
        .unwrap();
    assert_eq!(patched.status, 200);
    assert_eq!(
        admin
            .request("DELETE", &format!("{ns_slices}/svc-2-abc12"), &[], &[])
            .unwrap()
            .status,
        200
    );
    for w in &mut watches {
        assert_eq!(
            w.next_change(Duration::from_secs(15)),
            ("ADDED".into(), "new-0".into())
        );
        assert_eq!(
            w.next_change(Duration::from_secs(15)),
            ("MODIFIED".into(), "svc-1-abc12".into())
        );
        assert_eq!(
            w.next_change(Duration::from_secs(15)),
            ("DELETED".into(), "svc-2-abc12".into())
        );
    }

    // Kill the leader's hub: another takes over within the lease TTL, and changes made
    // meanwhile reach the followers' open watches.
    let killed = Instant::now();
    nodes[leader].as_mut().unwrap().hub.proc.kill9();
    for i in 1..=3 {
        assert_eq!(
            admin
                .send_json(
                    "POST",
                    ns_slices,
                    &seed::endpointslice_object(&format!("gap-{i}"), 9000 + i)
                )
                .status,
            201
        );
    }
    nodes[leader] = None;
    let new_leader = wait_for("a new leader", Duration::from_secs(TTL + 5), || {
        followers
            .iter()
            .copied()
            .find(|f| role(nodes[*f].as_ref().unwrap()) == "leader")
    });
    let took = killed.elapsed();
    eprintln!("new leader edge-{new_leader} after {took:?} (lease TTL {TTL} s)");
    assert!(took <= Duration::from_secs(TTL + 1), "took {took:?}");
    for w in &mut watches {
        for i in 1..=3 {
            assert_eq!(
                w.next_change(Duration::from_secs(15)),
                ("ADDED".into(), format!("gap-{i}"))
            );
        }
    }
    assert_eq!(
        admin
            .send_json(
                "POST",
                ns_slices,
                &seed::endpointslice_object("after", 9100)
            )
            .status,
        201
    );
    for w in &mut watches {
        assert_eq!(
            w.next_change(Duration::from_secs(15)),
            ("ADDED".into(), "after".into())
        );
    }

    // The cloud saw one watch of endpointslices at a time for the whole pool: from the
    // leader, then from its successor; the hub that stayed a follower never asked.
    let stayed = followers
        .iter()
        .copied()
        .find(|f| *f != new_leader)
        .unwrap();
    let audit = cloud.audit();
    let watchers: std::collections::BTreeSet<String> = audit
        .iter()
        .filter(|a| a.path.starts_with(SLICES) && a.path.contains("watch=1"))
        .map(|a| a.user.clone())
        .collect();
    let expected: std::collections::BTreeSet<String> = [leader, new_leader]
        .iter()
        .map(|i| format!("system:node:{}", names[*i]))
        .collect();
    assert_eq!(watchers, expected);
    assert!(
        !audit
            .iter()
            .any(|a| a.path.starts_with(SLICES)
                && a.user == format!("system:node:{}", names[stayed])),
        "the follower's clients were served from the coordinator"
    );
    // The leader's copy in the coordinator matches the cloud (deleted slice gone).
    let keys = etcd
        .etcdctl(
            &etcd.endpoints(),
            &[
                "get",
                "/registry/endpointslices/",
                "--prefix",
                "--keys-only",
            ],
        )
        .unwrap();
    assert!(
        !keys.contains("svc-2-abc12") && keys.contains("gap-3") && keys.contains("after"),
        "{keys}"
    );
}

#[test]
fn what_no_live_hub_holds_leaves_the_coordinator_and_what_one_holds_stays() {
    const GRACE: u64 = 3;
    let etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    let names = ["edge-0", "edge-1", "edge-2"];
    // What each node's pods mount (and so what the Node authorizer lets it read).
    let mounts: [&[&str]; 3] = [&["shared", "one-off-0"], &["only-2"], &["shared", "only-2"]];
    for (n, configmaps) in names.iter().zip(mounts) {
        seed::node(&cloud.state.store, n);
        for p in 0..2 {
            seed::pod_mounting(
                &cloud.state.store,
                "default",
                &format!("{n}-pod-{p}"),
                n,
                "web",
                configmaps,
                &[],
            );
        }
    }
    for cm in ["shared", "one-off-0", "only-2"] {
        seed::configmap(
            &cloud.state.store,
            "default",
            cm,
            serde_json::json!({"k": cm}),
        );
    }
    let dir = TempDir::new("pool");
    let pkis: Vec<_> = names
        .iter()
        .map(|n| ca.write_hub_pki(&dir.path().join(n), n, &[]).unwrap())
        .collect();
    let more = format!(
        "  leaderLeaseSeconds: 2\n  gcIntervalSeconds: 1\n  nodeGraceSeconds: {GRACE}\n  getObjectTtlSeconds: 3\n  tombstoneTtlSeconds: 2\n"
    );
    let mut nodes: Vec<Node> = names
        .iter()
        .zip(&pkis)
        .map(|(n, pki)| start_named_hub(&cloud, pki, &etcd, n, &more))
        .collect();
    let tls_ports: Vec<u16> = nodes.iter().map(|n| n.tls).collect();
    let kubelet = |i: usize, path: &str| {
        let c = Client::new(
            format!("127.0.0.1:{}", tls_ports[i]).parse().unwrap(),
            ca.cert_der(),
            None,
            Some(&pkis[i].kubelet),
        );
        let r = c
            .request(
                "GET",
                path,
                &[
                    ("User-Agent", "kubelet/v1.32.0"),
                    ("Accept", "application/json"),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    };
    let cms = "/api/v1/namespaces/default/configmaps";
    for (i, n) in names.iter().enumerate() {
        kubelet(
            i,
            &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{n}"),
        );
    }
    // edge-0 keeps every configmap current with a list, but got one-off-0 by GET first;
    // edge-2 got `shared` and `only-2` by single GETs.
    kubelet(0, &format!("{cms}/one-off-0"));
    kubelet(0, &format!("{cms}?fieldSelector=metadata.name%3Dshared"));
    kubelet(2, &format!("{cms}/shared"));
    kubelet(2, &format!("{cms}/only-2"));
    let pods = || etcd.keys("/registry/pods/");
    let configmaps = || etcd.keys("/registry/configmaps/");
    wait_for(
        "every hub's objects in the coordinator",
        Duration::from_secs(20),
        || (pods().len() == 6 && configmaps().len() == 3).then_some(()),
    );
    wait_for("a leader", Duration::from_secs(20), || {
        nodes
            .iter()
            .any(|n| n.hub.status()["coordinator"]["role"] == "leader")
            .then_some(())
    });

    // A GET-only object ages out of the pool; the node's own cache keeps it.
    wait_for(
        "one-off-0 aged out of the coordinator",
        Duration::from_secs(20),
        || (!configmaps().iter().any(|k| k.ends_with("/one-off-0"))).then_some(()),
    );
    let mut ls = nodes[0]
        .hub
        .cli(&["cache", "ls", "--resource", "configmaps", "--dir"]);
    ls.arg(nodes[0].state.path());
    assert!(hub_tests::process::output(ls, "hub cache ls").contains("one-off-0"));
    // Keys edge-0 holds by its list are not aged, whoever else got them by GET.
    assert!(configmaps().iter().any(|k| k.ends_with("/shared")));

    // edge-2's hub goes away for good (restarts would come back within the grace).
    let pid = nodes[2].hub.proc.pid();
    nodes[2].hub.proc.kill9();
    eprintln!("killed edge-2's hub (pid {pid})");
    wait_for(
        "edge-2's membership to expire",
        Duration::from_secs(10),
        || {
            etcd.keys("/hub/members/pool-a/edge-2")
                .is_empty()
                .then_some(())
        },
    );
    // Within the grace its keys stay (the sweep starts counting only now).
    assert_eq!(pods().len(), 6, "kept within the grace");
    let gone = Instant::now();
    wait_for(
        "edge-2's keys removed after the grace",
        Duration::from_secs(GRACE + 15),
        || {
            let p = pods();
            (p.len() == 4 && !p.iter().any(|k| k.contains("edge-2"))).then_some(())
        },
    );
    eprintln!(
        "edge-2's pods removed {:?} after its membership expired (grace {GRACE} s)",
        gone.elapsed()
    );
    let left = configmaps();
    assert!(!left.iter().any(|k| k.ends_with("/only-2")), "{left:?}");
    assert!(
        left.iter().any(|k| k.ends_with("/shared")),
        "held by edge-0's list: {left:?}"
    );
    assert!(etcd.keys("/hub/sets/pool-a/edge-2/").is_empty());
    // The removed objects' resourceVersion companions went too: a hub caching them again
    // brings them back.
    assert!(
        etcd.keys("/hub/rv/registry/configmaps/default/only-2")
            .is_empty()
    );
    kubelet(1, &format!("{cms}/only-2"));
    wait_for(
        "only-2 pushed again by edge-1",
        Duration::from_secs(10),
        || {
            configmaps()
                .iter()
                .any(|k| k.ends_with("/only-2"))
                .then_some(())
        },
    );
    // The leader's status counts what its sweeps removed (edge-2's two pods and only-2,
    // at least, whichever hub led when one-off-0 aged out).
    let gc = wait_for("the leader's sweep counts", Duration::from_secs(10), || {
        nodes.iter().take(2).find_map(|n| {
            let c = n.hub.status()["coordinator"].clone();
            (c["role"] == "leader").then(|| c["gc"].clone())
        })
    });
    assert!(
        gc["removed"].as_u64() >= Some(3) && gc["nodes_removed"] == 1,
        "{gc}"
    );

    // A pod that only changes is pushed again, but the set's key record is not rewritten:
    // records change only when names do (what keeps the leader's sweeps from conflicting).
    let mod_revision = |key: &str| -> i64 {
        let out = etcd
            .etcdctl(&etcd.endpoints(), &["get", key, "-w", "json"])
            .unwrap_or_default();
        serde_json::from_str::<Value>(&out).unwrap_or_default()["kvs"][0]["mod_revision"]
            .as_i64()
            .unwrap_or(0)
    };
    let record = "/hub/sets/pool-a/edge-0/kubelet/v1/pods";
    let pod_key = "/registry/pods/default/edge-0-pod-0";
    let (record_before, pod_before) = (mod_revision(record), mod_revision(pod_key));
    assert!(record_before > 0 && pod_before > 0);
    let pods_id = hub_tests::apiserver::resources::find("", "v1", "pods").unwrap();
    let pod_0 = hub_tests::apiserver::store::Key {
        resource: pods_id,
        namespace: "default".into(),
        name: "edge-0-pod-0".into(),
    };
    cloud
        .state
        .store
        .update(pod_0, None, |cur| {
            let mut v = cur.clone();
            v["status"]["message"] = "changed".into();
            v
        })
        .unwrap();
    kubelet(0, "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-0");
    wait_for("the changed pod pushed", Duration::from_secs(10), || {
        (mod_revision(pod_key) > pod_before).then_some(())
    });
    assert_eq!(
        mod_revision(record),
        record_before,
        "the record was not rewritten"
    );

    // A pod deleted in the cloud leaves the coordinator at edge-0's next list, with a
    // tombstone that the sweep drops once it is older than the TTL (2 s here).
    cloud
        .state
        .store
        .delete(
            hub_tests::apiserver::store::Key {
                resource: pods_id,
                namespace: "default".into(),
                name: "edge-0-pod-1".into(),
            },
            None,
        )
        .unwrap();
    kubelet(0, "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-0");
    let companion = "/hub/rv/registry/pods/default/edge-0-pod-1";
    wait_for(
        "the deleted pod's tombstone",
        Duration::from_secs(10),
        || {
            let tomb = etcd
                .etcdctl(&etcd.endpoints(), &["get", companion, "--print-value-only"])
                .unwrap_or_default();
            (etcd.keys("/registry/pods/default/edge-0-pod-1").is_empty()
                && tomb.trim().get(20..21) == Some("d"))
            .then_some(())
        },
    );
    wait_for(
        "the tombstone swept after its TTL",
        Duration::from_secs(20),
        || etcd.keys(companion).is_empty().then_some(()),
    );
}

#[test]
fn one_dead_member_of_three_is_no_outage_of_the_coordinator() {
    let mut etcd = EtcdCluster::start(3);
    let (ca, cloud) = cloud();
    seed::cluster(&cloud.state.store, 1, 3);
    let dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(&cloud, &pki, &etcd, "node-0", "");
    let kubelet = kubelet_of(&node, &ca, &pki);
    let list = || {
        let r = kubelet
            .request(
                "GET",
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
                &[
                    ("User-Agent", "kubelet/v1.32.0"),
                    ("Accept", "application/json"),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(r.status, 200);
    };
    list();
    wait_for(
        "the node's pods in the coordinator",
        Duration::from_secs(30),
        || (etcd.keys("/registry/pods/").len() == 3).then_some(()),
    );
    let coordinator = || node.hub.status()["coordinator"].clone();
    wait_for("reads and pushes healthy", Duration::from_secs(30), || {
        let c = coordinator();
        (c["healthy"] == true && c["pushes_healthy"] == true).then_some(())
    });

    // A member that does not lead dies: the other two keep quorum, so the pool's reads
    // never stop, and pushes go on.
    let leader = wait_for("an etcd leader", Duration::from_secs(20), || etcd.leader());
    etcd.kill_member((leader + 1) % 3);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        let c = coordinator();
        assert_eq!(
            c["healthy"],
            true,
            "reads lost {:?} after one member of three died: {c}",
            watched.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The dead member is named, left out of the client's balance: from then on no push
    // fails for it.
    let dead = etcd.endpoints()[(leader + 1) % 3].clone();
    wait_for(
        "the dead member named in status",
        Duration::from_secs(10),
        || (coordinator()["members_down"] == serde_json::json!([dead])).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    let errors_before = coordinator()["last_push_error"].clone();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        let c = coordinator();
        assert!(
            c["pushes_healthy"] == true && c["last_push_error"] == errors_before,
            "a push failed with the dead member out of the balance: {c}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    seed::pod(
        &cloud.state.store,
        "default",
        "after-the-death",
        "node-0",
        "late",
    );
    list();
    wait_for(
        "the new pod pushed with a member down",
        Duration::from_secs(30),
        || {
            etcd.keys("/registry/pods/default/after-the-death")
                .len()
                .eq(&1)
                .then_some(())
        },
    );
    etcd.start_member((leader + 1) % 3);
    wait_for("the member back in status", Duration::from_secs(20), || {
        (coordinator()["members_down"] == serde_json::json!([])).then_some(())
    });
}

/// An etcd an operator already had, started with its defaults (1.5 MiB a request): a
/// configmap larger than that cannot be pushed, and says so, while everything else is
/// pushed and the pool's reads go on — served from the coordinator once the cloud is gone.
#[test]
fn pushes_that_fail_never_stop_the_pools_reads() {
    let etcd = EtcdCluster::start_default_limits(1);
    let (ca, cloud) = cloud();
    let store = &cloud.state.store;
    seed::node(store, "node-0");
    seed::service(store, "default", "web", 80);
    seed::configmap(
        store,
        "default",
        "huge",
        serde_json::json!({"blob": "x".repeat(2 << 20)}),
    );
    seed::pod_mounting(
        store,
        "default",
        "reader",
        "node-0",
        "reader",
        &["huge"],
        &[],
    );
    let dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(&cloud, &pki, &etcd, "node-0", "");
    let client = |ua: &str| {
        let c = kubelet_of(&node, &ca, &pki);
        let ua = ua.to_string();
        move |path: &str| {
            c.request(
                "GET",
                path,
                &[("User-Agent", &ua), ("Accept", "application/json")],
                &[],
            )
            .unwrap()
        }
    };
    let kubelet = client("kubelet/v1.32.0");
    let proxy = client("kube-proxy/v1.32.0");
    assert_eq!(
        kubelet("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0").status,
        200
    );
    assert_eq!(
        kubelet("/api/v1/namespaces/default/configmaps/huge").status,
        200
    );
    assert_eq!(proxy("/api/v1/services").status, 200);
    let coordinator = || node.hub.status()["coordinator"].clone();
    let c = wait_for(
        "the push of the huge configmap to fail",
        Duration::from_secs(30),
        || {
            let c = coordinator();
            (c["pushes_healthy"] == false
            // etcd's "request is too large", or gRPC's "larger than max" before it.
            && c["last_push_error"].as_str().is_some_and(|e| e.contains("large")))
            .then_some(c)
        },
    );
    assert_eq!(
        c["healthy"], true,
        "reads stay healthy while pushes fail: {c}"
    );
    wait_for(
        "the pod and the pool's services pushed",
        Duration::from_secs(30),
        || {
            (etcd.keys("/registry/pods/default/reader").len() == 1
                && etcd.keys("/registry/services/specs/default/web").len() == 1)
                .then_some(())
        },
    );
    assert!(etcd.keys("/registry/configmaps/").is_empty());

    cloud_down(&cloud, [&node]);
    let r = proxy("/api/v1/services");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("warning"),
        Some(hub::cache::serve::FROM_COORDINATOR),
        "served by the coordinator"
    );
    let names: Vec<String> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"web".to_string()), "{names:?}");
    assert_eq!(coordinator()["healthy"], true);
}

/// Every key a hub writes under the prefix is one kube-apiserver's storage would read:
/// the key shape of its layout for the resource, and a value in its storage encoding — for
/// these built-in kinds the `k8s\0` protobuf envelope with the resource's apiVersion and
/// kind, whether the node read it in protobuf or JSON — naming the object the key names.
/// The hub's own keys all stay outside the prefix.
#[test]
fn every_key_under_the_prefix_is_one_kube_apiserver_would_read() {
    use k8s_pb::apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::Unknown};
    use prost::Message;

    let etcd = EtcdCluster::start(1);
    let pushed = a_node_s_reads_pushed(&etcd);
    // kube-apiserver 1.32's layout under --etcd-prefix=/registry: storage path, whether
    // namespaced, the apiVersion and kind stored there, and whether in protobuf (built-in
    // kinds, whatever encoding the node's clients read them in: the ConfigMap was read as
    // JSON) or JSON (custom resources, under their group).
    let layout: &[(&str, bool, &str, &str, bool)] = &[
        ("pods", true, "v1", "Pod", true),
        ("minions", false, "v1", "Node", true),
        ("configmaps", true, "v1", "ConfigMap", true),
        ("services/specs", true, "v1", "Service", true),
        ("services/endpoints", true, "v1", "Endpoints", true),
        (
            "endpointslices",
            true,
            "discovery.k8s.io/v1",
            "EndpointSlice",
            true,
        ),
        ("csinodes", false, "storage.k8s.io/v1", "CSINode", true),
        ("csidrivers", false, "storage.k8s.io/v1", "CSIDriver", true),
        (
            "runtimeclasses",
            false,
            "node.k8s.io/v1",
            "RuntimeClass",
            true,
        ),
        (
            "example.hub.dev/widgets",
            true,
            "example.hub.dev/v1",
            "Widget",
            false,
        ),
    ];
    let mut read = 0;
    for (key, value) in &pushed.kvs {
        let Some(rest) = key.strip_prefix("/registry/") else {
            assert!(
                key.starts_with("/hub/"),
                "a key of neither kube-apiserver nor the hub: {key}"
            );
            continue;
        };
        let &(storage, namespaced, api_version, kind, protobuf) = layout
            .iter()
            .find(|(p, ..)| rest.starts_with(&format!("{p}/")))
            .unwrap_or_else(|| panic!("{key}: not a path of kube-apiserver's layout"));
        let names: Vec<&str> = rest[storage.len() + 1..].split('/').collect();
        let (ns, name) = match (namespaced, names.as_slice()) {
            (true, [ns, name]) => (*ns, *name),
            (false, [name]) => ("", *name),
            _ => panic!("{key}: not the key shape of a {kind}"),
        };
        let meta: ObjectMeta = match (protobuf, value.strip_prefix(b"k8s\0")) {
            (true, Some(enveloped)) => {
                let u = Unknown::decode(enveloped).unwrap_or_else(|e| panic!("{key}: {e}"));
                let t = u.type_meta.unwrap_or_default();
                assert_eq!(
                    (t.api_version.as_deref(), t.kind.as_deref()),
                    (Some(api_version), Some(kind)),
                    "{key}"
                );
                // Every kind keeps its ObjectMeta in field 1.
                #[derive(Clone, PartialEq, prost::Message)]
                struct Meta {
                    #[prost(message, optional, tag = "1")]
                    metadata: Option<ObjectMeta>,
                }
                Meta::decode(u.raw.unwrap_or_default().as_slice())
                    .unwrap_or_else(|e| panic!("{key}: {e}"))
                    .metadata
                    .unwrap_or_default()
            }
            (false, None) => {
                let v: Value = serde_json::from_slice(value)
                    .unwrap_or_else(|e| panic!("{key}: not JSON: {e}"));
                assert_eq!(
                    (v["apiVersion"].as_str(), v["kind"].as_str()),
                    (Some(api_version), Some(kind)),
                    "{key}"
                );
                ObjectMeta {
                    name: v["metadata"]["name"].as_str().map(String::from),
                    namespace: v["metadata"]["namespace"].as_str().map(String::from),
                    ..Default::default()
                }
            }
            _ => panic!(
                "{key}: not kube-apiserver's storage encoding ({}): {}",
                if protobuf { "protobuf" } else { "JSON" },
                String::from_utf8_lossy(&value[..value.len().min(80)])
            ),
        };
        assert_eq!(meta.name.as_deref(), Some(name), "{key}");
        assert_eq!(meta.namespace.as_deref().unwrap_or(""), ns, "{key}");
        read += 1;
    }
    assert!(read >= PUSHED_KEYS.len(), "{read} objects read");
}

/// A node's reads, pushed to the pool: the cloud (a node, a service with its endpoints and
/// slice, a ConfigMap, two pods, the node's CSINode, a CSIDriver, a RuntimeClass, a custom
/// resource), and node-0's hub in a pool on `etcd` after its kubelet, kube-proxy and
/// flanneld read them, each in the encoding it reads in, and every key of [`PUSHED_KEYS`]
/// is in etcd.
struct PushedReads {
    cloud: StandIn,
    ca: Arc<TestCa>,
    _node: Node,
    _pki_dir: TempDir,
    /// etcd's keys and values once every key of `PUSHED_KEYS` is there.
    kvs: Vec<(String, Vec<u8>)>,
}

const PUSHED_KEYS: [&str; 11] = [
    "/registry/pods/default/app",
    "/registry/pods/default/plain",
    "/registry/minions/node-0",
    "/registry/configmaps/default/conf",
    "/registry/services/specs/default/web",
    "/registry/services/endpoints/default/web",
    "/registry/endpointslices/default/web-abc12",
    "/registry/csinodes/node-0",
    "/registry/csidrivers/csi.example.com",
    "/registry/runtimeclasses/runc",
    "/registry/example.hub.dev/widgets/default/gear",
];

/// What the kubelet, kube-proxy and flanneld of node-0 read: user agent, Accept, path, and
/// the resource as the storage reader names it (apiVersion/resource/Kind/scope).
const NODE_READS: [(&str, &str, &str, &str); 10] = [
    (
        "kubelet/v1.32.0",
        PROTOBUF_FIRST,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
        "v1/pods/Pod/namespaced",
    ),
    (
        "kubelet/v1.32.0",
        PROTOBUF_FIRST,
        "/api/v1/nodes/node-0",
        "v1/nodes/Node/cluster",
    ),
    (
        "kubelet/v1.32.0",
        "application/json",
        "/api/v1/namespaces/default/configmaps/conf",
        "v1/configmaps/ConfigMap/namespaced",
    ),
    (
        "kubelet/v1.32.0",
        PROTOBUF_FIRST,
        "/apis/storage.k8s.io/v1/csinodes/node-0",
        "storage.k8s.io/v1/csinodes/CSINode/cluster",
    ),
    (
        "kubelet/v1.32.0",
        PROTOBUF_FIRST,
        "/apis/storage.k8s.io/v1/csidrivers",
        "storage.k8s.io/v1/csidrivers/CSIDriver/cluster",
    ),
    (
        "kubelet/v1.32.0",
        PROTOBUF_FIRST,
        "/apis/node.k8s.io/v1/runtimeclasses",
        "node.k8s.io/v1/runtimeclasses/RuntimeClass/cluster",
    ),
    (
        "kube-proxy/v1.32.0",
        PROTOBUF_FIRST,
        "/api/v1/services",
        "v1/services/Service/namespaced",
    ),
    (
        "kube-proxy/v1.32.0",
        PROTOBUF_FIRST,
        "/api/v1/endpoints",
        "v1/endpoints/Endpoints/namespaced",
    ),
    (
        "kube-proxy/v1.32.0",
        PROTOBUF_FIRST,
        "/apis/discovery.k8s.io/v1/endpointslices",
        "discovery.k8s.io/v1/endpointslices/EndpointSlice/namespaced",
    ),
    // A custom resource, whose only encoding is JSON, read by one of the components the
    // hub caches for by default.
    (
        "flanneld/v0.26.1",
        PROTOBUF_FIRST,
        "/apis/example.hub.dev/v1/widgets",
        "example.hub.dev/v1/widgets/Widget/namespaced",
    ),
];

const PROTOBUF_FIRST: &str = "application/vnd.kubernetes.protobuf, application/json";

fn a_node_s_reads_pushed(etcd: &EtcdCluster) -> PushedReads {
    let (ca, cloud) = cloud();
    let store = &cloud.state.store;
    seed::node(store, "node-0");
    seed::service(store, "default", "web", 80);
    seed::configmap(store, "default", "conf", serde_json::json!({"k": "v"}));
    seed::pod_mounting(store, "default", "app", "node-0", "app", &["conf"], &[]);
    seed::pod(store, "default", "plain", "node-0", "plain");
    seed::put(
        store,
        "csinodes",
        "storage.k8s.io",
        "",
        serde_json::json!({"metadata": {"name": "node-0"}, "spec": {"drivers": [
            {"name": "csi.example.com", "nodeID": "node-0", "topologyKeys": ["topology.example.com/zone"]},
        ]}}),
    );
    seed::put(
        store,
        "csidrivers",
        "storage.k8s.io",
        "",
        serde_json::json!({"metadata": {"name": "csi.example.com"},
            "spec": {"attachRequired": false, "podInfoOnMount": true}}),
    );
    seed::put(
        store,
        "runtimeclasses",
        "node.k8s.io",
        "",
        serde_json::json!({"metadata": {"name": "runc"}, "handler": "runc"}),
    );
    seed::put(
        store,
        "widgets",
        "example.hub.dev",
        "default",
        serde_json::json!({"metadata": {"name": "gear"}, "spec": {"teeth": 12, "labels": []}}),
    );
    cloud.state.auth.write().unwrap().allow(Rule::new(
        "system:nodes",
        &["list"],
        &["widgets"],
        &["*"],
    ));
    let pki_dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&pki_dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(&cloud, &pki, etcd, "node-0", "");
    let c = kubelet_of(&node, &ca, &pki);
    for (ua, accept, path, _) in NODE_READS {
        let r = c
            .request("GET", path, &[("User-Agent", ua), ("Accept", accept)], &[])
            .unwrap();
        assert_eq!(r.status, 200, "{path}");
    }
    let kvs = wait_for("every object pushed", Duration::from_secs(30), || {
        let kvs = etcd_dump(etcd, &["", "--from-key"]);
        PUSHED_KEYS
            .iter()
            .all(|k| kvs.iter().any(|(key, _)| key == k))
            .then_some(kvs)
    });
    PushedReads {
        cloud,
        ca,
        _node: node,
        _pki_dir: pki_dir,
        kvs,
    }
}

/// kube-apiserver's own storage code reads what the pool holds: the storage reader that
/// `cargo xtask kube-storage` builds from k8s.io/apiserver (its storage factory with
/// kube-apiserver's key prefixes and protobuf storage encoding, the etcd3 store, the watch
/// cache, the generic registry store its REST handlers call) lists every pushed resource
/// from etcd and from its watch cache and gets each object by name. Each read gives exactly
/// the objects the node's clients read from the cloud, field for field (resourceVersion
/// aside: kube-apiserver takes it from etcd's revision).
#[test]
#[ignore = "needs kube-apiserver's storage code: `cargo xtask kube-storage` builds it and runs this test"]
fn kube_apiserver_s_storage_code_reads_every_object_the_pool_holds() {
    let reader = std::env::var("HUB_STORAGE_READER")
        .expect("HUB_STORAGE_READER: the storage reader `cargo xtask kube-storage` builds");
    let etcd = EtcdCluster::start(1);
    let pushed = a_node_s_reads_pushed(&etcd);
    let out = std::process::Command::new(&reader)
        .arg("--etcd")
        .arg(&etcd.endpoints()[0])
        .args(NODE_READS.map(|(.., resource)| resource))
        .output()
        .unwrap_or_else(|e| panic!("{reader}: {e}"));
    assert!(
        out.status.success(),
        "kube-apiserver's storage failed to read the pool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let admin = Client::new(
        pushed.cloud.addr,
        pushed.ca.cert_der(),
        Some(ADMIN_TOKEN),
        None,
    );
    for (_, _, path, resource) in NODE_READS {
        let name = resource.split('/').rev().nth(2).unwrap();
        let reply = admin.get(path);
        assert_eq!(reply.status, 200, "{path}");
        let cloud = reply.json();
        let cloud_objects = match cloud["items"].as_array() {
            Some(items) => items.clone(),
            None => vec![cloud],
        };
        let expected = comparable(as_kube_apiserver_writes(&reader, resource, cloud_objects));
        assert!(!expected.is_empty(), "{path}: the cloud has none");
        for read in ["list", "cache", "get"] {
            let got = comparable(
                lines
                    .iter()
                    .filter(|l| l["resource"] == name && l["read"] == read)
                    .map(|l| l["object"].clone())
                    .collect(),
            );
            assert_eq!(
                got, expected,
                "{name}: kube-apiserver's storage ({read}) against the cloud"
            );
        }
    }
}

/// `objects` of `resource` (as the storage reader names it) as kube-apiserver writes them
/// once decoded: the stand-in leaves out some fields Go writes for their zero value (a
/// zero time as null, an empty struct as {}), the same object either way.
fn as_kube_apiserver_writes(reader: &str, resource: &str, objects: Vec<Value>) -> Vec<Value> {
    let parts: Vec<&str> = resource.rsplitn(4, '/').collect();
    let (api_version, kind) = (parts[3], parts[1]);
    let mut input = Vec::new();
    for mut o in objects {
        o["apiVersion"] = api_version.into();
        o["kind"] = kind.into();
        serde_json::to_writer(&mut input, &o).unwrap();
        input.push(b'\n');
    }
    let out = output_with_stdin(std::process::Command::new(reader).arg("normalize"), &input);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Objects as compared across servers: sorted by namespace and name, without what differs
/// by server (the resourceVersion) or by read (a list's items carry no apiVersion and kind),
/// and an empty list the same as none, as Kubernetes' semantic equality has it (protobuf
/// cannot tell them apart, so an `[]` stored is read back as `null`).
fn comparable(mut objects: Vec<Value>) -> Vec<Value> {
    fn empty_list_as_none(v: &mut Value) {
        match v {
            Value::Array(a) if a.is_empty() => *v = Value::Null,
            Value::Array(a) => a.iter_mut().for_each(empty_list_as_none),
            Value::Object(o) => o.values_mut().for_each(empty_list_as_none),
            _ => {}
        }
    }
    for o in &mut objects {
        empty_list_as_none(o);
        let o = o.as_object_mut().expect("an object");
        o.remove("apiVersion");
        o.remove("kind");
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
    }
    let key = |o: &Value| {
        let m = &o["metadata"];
        (m["namespace"].to_string(), m["name"].to_string())
    };
    objects.sort_by_key(key);
    objects
}

/// `coordinator.notPushed` keeps a resource to the node: its clients read it through the
/// hub as ever, but it never reaches the pool, while the rest is pushed.
#[test]
fn a_resource_configured_not_pushed_never_reaches_the_pool() {
    let etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    let store = &cloud.state.store;
    seed::node(store, "node-0");
    seed::configmap(store, "default", "conf", serde_json::json!({"k": "v"}));
    // The node may read the ConfigMap because its pod mounts it.
    seed::pod_mounting(store, "default", "app", "node-0", "app", &["conf"], &[]);
    let dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(
        &cloud,
        &pki,
        &etcd,
        "node-0",
        "  notPushed: [\"/v1/configmaps\"]\n",
    );
    let c = kubelet_of(&node, &ca, &pki);
    // The ConfigMap is read (and cached) first: the single cache writer has stored it
    // before the pods, so the pass that pushes the pods has seen it too.
    for path in [
        "/api/v1/namespaces/default/configmaps/conf",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
        "/api/v1/nodes/node-0",
    ] {
        let r = c
            .request(
                "GET",
                path,
                &[
                    ("User-Agent", "kubelet/v1.32.0"),
                    ("Accept", "application/json"),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(r.status, 200, "{path}");
    }
    // The Node is read last, so a pass may push the pods before the Node is cached:
    // wait for both.
    wait_for(
        "the pods and the Node pushed to the pool",
        Duration::from_secs(60),
        || {
            (!etcd.keys("/registry/pods/").is_empty()
                && !etcd.keys("/registry/minions/").is_empty())
            .then_some(())
        },
    );
    assert_eq!(etcd.keys("/registry/pods/"), ["/registry/pods/default/app"]);
    assert_eq!(
        etcd.keys("/registry/minions/"),
        ["/registry/minions/node-0"]
    );
    assert_eq!(
        etcd.keys("/registry/configmaps/"),
        Vec::<String>::new(),
        "a resource not pushed is in the pool"
    );
}

/// By default the node's lease, which its kubelet renews every 10 s, stays on the node:
/// the hub keeps the written lease as the node's copy, but never pushes it.
#[test]
fn a_node_s_lease_stays_on_the_node_by_default() {
    let etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    seed::node(&cloud.state.store, "node-0");
    let dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(&cloud, &pki, &etcd, "node-0", "");
    let c = kubelet_of(&node, &ca, &pki);
    let headers = [
        ("User-Agent", "kubelet/v1.32.0"),
        ("Accept", "application/json"),
        ("Content-Type", "application/json"),
    ];
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "node-0", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "node-0", "leaseDurationSeconds": 40},
    });
    // Written first, so the push that carries the node (read next) has seen it.
    let r = c
        .request(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &headers,
            &serde_json::to_vec(&lease).unwrap(),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = c
        .request("GET", "/api/v1/nodes/node-0", &headers[..2], &[])
        .unwrap();
    assert_eq!(r.status, 200);
    wait_for(
        "the node pushed to the pool",
        Duration::from_secs(60),
        || (!etcd.keys("/registry/minions/").is_empty()).then_some(()),
    );
    assert_eq!(
        etcd.keys("/registry/leases/"),
        Vec::<String>::new(),
        "the node's lease is in the pool"
    );
}

/// Every key and value etcdctl gets with `args` (`[prefix, "--prefix"]` or `["", "--from-key"]`).
fn etcd_dump(etcd: &EtcdCluster, args: &[&str]) -> Vec<(String, Vec<u8>)> {
    use base64::Engine;
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-w", "json"]);
    let out = etcd.etcdctl(&etcd.endpoints(), &all).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let b64 = |s: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap_or_default())
            .unwrap()
    };
    v["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            (
                String::from_utf8(b64(&kv["key"])).unwrap(),
                b64(&kv["value"]),
            )
        })
        .collect()
}

/// A hub in a pool answers its kubelet's 1000-pod protobuf list; the push that follows asks
/// the cloud for none of those pods (counted per user by the cloud), the coordinator holds
/// them in protobuf, and with the cloud gone kubectl (JSON only) on the node lists all 1000
/// from the hub, converted there.
#[test]
fn a_1000_pod_protobuf_list_reaches_the_pool_without_a_cloud_get_and_kubectl_reads_it_offline() {
    const PODS: usize = 1000;
    let etcd = EtcdCluster::start(1);
    let (ca, cloud) = cloud();
    let store = &cloud.state.store;
    seed::namespace(store, "ns1");
    seed::node(store, "node-0");
    for i in 0..PODS {
        seed::pod(store, "ns1", &format!("p-{i:04}"), "node-0", "web");
    }
    let dir = TempDir::new("pool");
    let pki = ca
        .write_hub_pki(&dir.path().join("node-0"), "node-0", &[])
        .unwrap();
    let node = start_named_hub(&cloud, &pki, &etcd, "node-0", "");
    let kubelet = kubelet_of(&node, &ca, &pki);
    let r = kubelet
        .request(
            "GET",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0",
            &[
                ("User-Agent", "kubelet/v1.32.0"),
                (
                    "Accept",
                    "application/vnd.kubernetes.protobuf, application/json",
                ),
            ],
            &[],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.starts_with(b"k8s\0"), "a protobuf list");
    // kubectl's discovery, read online once as an operator's first kubectl does.
    let kubeconfig = dir.path().join("empty");
    std::fs::write(&kubeconfig, "").unwrap();
    let server = format!("--server=http://127.0.0.1:{}", node.plain);
    let (ok, _, err) = kubectl(&kubeconfig, &[&server, "api-resources"]);
    assert!(ok, "{err}");

    let pods = wait_for(
        "all pods in the coordinator",
        Duration::from_secs(60),
        || {
            let kvs = etcd_dump(&etcd, &["/registry/pods/", "--prefix"]);
            (kvs.len() == PODS).then_some(kvs)
        },
    );
    let not_protobuf: Vec<&String> = pods
        .iter()
        .filter(|(_, v)| !v.starts_with(b"k8s\0"))
        .map(|(k, _)| k)
        .collect();
    assert!(
        not_protobuf.is_empty(),
        "{} pods not in protobuf, e.g. {:?}",
        not_protobuf.len(),
        &not_protobuf[..not_protobuf.len().min(3)]
    );
    // The cloud's own count, per user: the node identity made the kubelet's list and no
    // GET of a pod.
    let node_user = "system:node:node-0";
    let by_node: Vec<_> = cloud
        .audit()
        .into_iter()
        .filter(|e| e.user == node_user && e.path.contains("/pods"))
        .map(|e| format!("{} {}", e.method, e.path))
        .collect();
    assert!(
        by_node.iter().all(|p| !p.contains("/pods/")),
        "pods fetched one by one: {:?}",
        by_node
            .iter()
            .filter(|p| p.contains("/pods/"))
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        by_node
            .iter()
            .filter(|p| p.starts_with("GET /api/v1/pods?"))
            .count(),
        1,
        "{by_node:?}"
    );

    cloud_down(&cloud, [&node]);
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[&server, "get", "pods", "-n", "ns1", "-o", "json"],
    );
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), PODS);
    assert!(
        items
            .iter()
            .all(|p| p["spec"]["nodeName"] == "node-0" && p["status"]["phase"] == "Running"),
        "every pod whole, in JSON"
    );
    assert!(
        err.contains("pool coordinator"),
        "served from the coordinator: {err}"
    );
    // And one by name, as `kubectl get pod` asks.
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[&server, "get", "pod", "p-0042", "-n", "ns1", "-o", "json"],
    );
    assert!(ok, "{err}");
    let pod: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (pod["kind"].as_str(), pod["metadata"]["name"].as_str()),
        (Some("Pod"), Some("p-0042"))
    );
}

/// A kubelet-style client of `node`'s hub: the node's client certificate.
fn kubelet_of(node: &Node, ca: &TestCa, pki: &hub_tests::apiserver::tls::HubPki) -> Client {
    Client::new(
        format!("127.0.0.1:{}", node.tls).parse().unwrap(),
        ca.cert_der(),
        None,
        Some(&pki.kubelet),
    )
}

/// Stops the cloud and waits until each of these hubs has seen it down.
fn cloud_down<'a>(cloud: &StandIn, nodes: impl IntoIterator<Item = &'a Node>) {
    cloud.stop_listening();
    for n in nodes {
        wait_for(
            "the hub to see the cloud down",
            Duration::from_secs(5),
            || (n.hub.status()["cloud"][0]["healthy"] == false).then_some(()),
        );
    }
}
