//! Issue 8's acceptance on real links: three hubs, each in its own node network namespace,
//! reach the cloud (the API stand-in) and a 3-member etcd coordinator over their own veth
//! link. The leader syncs the pool-scope resources for the pool (the cloud sees watches
//! from the leader's node only), followers' clients are served from the coordinator and
//! keep their watch across a leader's death, a coordinator wiped whole is refilled by the
//! hubs, and a node cut off serves its kubelet from its own cache.
use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use hub_tests::{
    TempDir,
    apiserver::{ADMIN_TOKEN, Options, StandIn, auth::Rule, client::Client, seed, tls::TestCa},
    etcd::EtcdCluster,
    hub::{HubProc, LOOPBACK_NODE, LoopbackHub},
    informer::{Informer, Mode},
    pool_net::{CLOUD_IP, ETCD_IP, PoolNet},
    privileged, recorded, wait_for,
};
use serde_json::Value;

const TTL: u64 = 3;
const NODES: [&str; 3] = ["edge-0", "edge-1", "edge-2"];
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf,application/json";
const POOL_SCOPE: [&str; 3] = [
    "/api/v1/services",
    "/api/v1/endpoints",
    "/apis/discovery.k8s.io/v1/endpointslices",
];

struct Node {
    hub: HubProc,
    client: Client,
    tls: u16,
}

fn start_node(
    net: &PoolNet,
    i: usize,
    cloud: &StandIn,
    ca: &Arc<TestCa>,
    etcd: &EtcdCluster,
    pki_dir: &std::path::Path,
) -> Node {
    let name = NODES[i];
    let ip = PoolNet::node_ip(i);
    let pki = ca.write_hub_pki(&pki_dir.join(name), name, &[&ip]).unwrap();
    let config = LoopbackHub::pool_member(
        cloud.url(),
        &pki,
        &etcd.endpoints(),
        &format!("  leaderLeaseSeconds: {TTL}\n  gcIntervalSeconds: 2\n"),
    );
    let tls = config.tls.expect("a TLS port");
    let hub = HubProc::start_yaml(
        Some(&net.nodes[i]),
        &config.admin.clone(),
        None,
        |_, cache| {
            config
                .yaml(cache)
                .replace(
                    &format!("nodeName: {LOOPBACK_NODE}\n"),
                    &format!("nodeName: {name}\n"),
                )
                .replace("  tlsProxy: 127.0.0.1:", &format!("  tlsProxy: {ip}:"))
        },
    );
    // The node's kubelet and kube-proxy, reaching the hub over the node's link.
    let client = Client::new(
        format!("{ip}:{tls}").parse().unwrap(),
        ca.cert_der(),
        None,
        Some(&pki.kubelet),
    );
    Node { hub, client, tls }
}

fn get(c: &Client, path: &str, agent: &str) -> hub_tests::apiserver::client::Reply {
    c.request(
        "GET",
        path,
        &[("User-Agent", agent), ("Accept", "application/json")],
        &[],
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    i["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

fn role(h: &HubProc) -> String {
    h.try_status()
        .and_then(|s| s["coordinator"]["role"].as_str().map(String::from))
        .unwrap_or_default()
}

#[test]
fn three_hubs_in_node_namespaces_share_a_three_member_coordinator() {
    if !privileged::check("three_hubs_in_node_namespaces_share_a_three_member_coordinator") {
        return;
    }
    let net = PoolNet::new(3);
    // This thread works from the cloud's side: the stand-in and etcd live there, and the
    // test's clients reach the hubs over the nodes' links.
    let _cloud_side = net.cloud.enter();
    let mut etcd = EtcdCluster::start_on(3, ETCD_IP);
    let cloud =
        StandIn::start(format!("{CLOUD_IP}:0").parse().unwrap(), Options::default()).unwrap();
    let ca = cloud.ca.clone();
    cloud.state.auth.write().unwrap().add_test_identities();
    for n in NODES {
        seed::node(&cloud.state.store, n);
        for p in 0..3 {
            seed::pod(
                &cloud.state.store,
                "default",
                &format!("{n}-pod-{p}"),
                n,
                "web",
            );
        }
    }
    for s in 0..4 {
        seed::service(&cloud.state.store, "default", &format!("svc-{s}"), 8000 + s);
    }
    let pki = TempDir::new("poolnet");
    let (mut hubs, clients): (Vec<Option<HubProc>>, Vec<Client>) = (0..3)
        .map(|i| {
            let n = start_node(&net, i, &cloud, &ca, &etcd, pki.path());
            (Some(n.hub), n.client)
        })
        .unzip();

    let leader = wait_for("one pool leader", Duration::from_secs(30), || {
        let roles: Vec<String> = hubs.iter().map(|h| role(h.as_ref().unwrap())).collect();
        (roles.iter().filter(|r| *r == "leader").count() == 1
            && roles.iter().filter(|r| *r == "follower").count() == 2)
            .then(|| roles.iter().position(|r| r == "leader").unwrap())
    });
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for (i, c) in clients.iter().enumerate() {
        let r = get(
            c,
            &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", NODES[i]),
            "kubelet/v1.32.0",
        );
        assert_eq!(r.status, 200);
    }
    wait_for(
        "every node's pods in the coordinator",
        Duration::from_secs(30),
        || (etcd.keys("/registry/pods/").len() == 9).then_some(()),
    );
    wait_for(
        "the leader's endpointslices synced",
        Duration::from_secs(30),
        || {
            (!etcd
                .keys("/hub/synced/discovery.k8s.io/v1/endpointslices")
                .is_empty())
            .then_some(())
        },
    );

    // Every node's kube-proxy lists and watches the pool-scope resources through its hub.
    let mut list_rv = String::new();
    for c in &clients {
        for path in POOL_SCOPE {
            let r = get(c, path, "kube-proxy/v1.32.0");
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(names(&r.json()).len(), 4, "{path}");
        }
        list_rv = get(c, SLICES, "kube-proxy/v1.32.0").json()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
    }
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
                &seed::endpointslice_object("churn-0", 80)
            )
            .status,
        201
    );
    for w in &mut watches {
        assert_eq!(
            w.next_change(Duration::from_secs(20)),
            ("ADDED".into(), "churn-0".into())
        );
    }
    // The cloud saw pool-scope watches from the leader's node only; followers' clients
    // never reached it for pool-scope resources.
    let audit = cloud.audit();
    for path in POOL_SCOPE {
        let watchers: BTreeSet<&str> = audit
            .iter()
            .filter(|a| a.path.starts_with(path) && a.path.contains("watch=1"))
            .map(|a| a.user.as_str())
            .collect();
        assert_eq!(
            watchers,
            BTreeSet::from([format!("system:node:{}", NODES[leader]).as_str()]),
            "{path}"
        );
        for &f in &followers {
            let user = format!("system:node:{}", NODES[f]);
            assert!(
                !audit
                    .iter()
                    .any(|a| a.path.starts_with(path) && a.user == user),
                "{path} from {user}"
            );
        }
    }

    // The leader's hub dies: another leads within the lease TTL; the followers' open
    // watches carry on, with what changed meanwhile.
    let killed = Instant::now();
    hubs[leader].as_mut().unwrap().proc.kill9();
    assert_eq!(
        admin
            .send_json(
                "POST",
                ns_slices,
                &seed::endpointslice_object("churn-1", 80)
            )
            .status,
        201
    );
    let new_leader = wait_for("a new leader", Duration::from_secs(TTL + 10), || {
        followers
            .iter()
            .copied()
            .find(|f| role(hubs[*f].as_ref().unwrap()) == "leader")
    });
    let took = killed.elapsed();
    eprintln!(
        "pool: new leader {} after {took:?} (lease TTL {TTL} s)",
        NODES[new_leader]
    );
    assert!(took <= Duration::from_secs(TTL + 1), "took {took:?}");
    for w in &mut watches {
        assert_eq!(
            w.next_change(Duration::from_secs(20)),
            ("ADDED".into(), "churn-1".into())
        );
    }
    hubs[leader] = None;
    drop(watches);

    // The whole coordinator is wiped (all three members, data gone, a new cluster): the
    // two live hubs push everything again and the new leader lists again.
    let wiped = Instant::now();
    etcd.wipe_all();
    let live: Vec<usize> = followers.clone();
    wait_for(
        "the pool's data back in the rebuilt coordinator",
        Duration::from_secs(30),
        || {
            let pods = etcd.keys("/registry/pods/");
            let mine: usize = live
                .iter()
                .map(|i| {
                    pods.iter()
                        .filter(|k| k.contains(&format!("{}-pod-", NODES[*i])))
                        .count()
                })
                .sum();
            let slices = etcd.keys("/registry/endpointslices/");
            (mine == 6 && slices.len() == 6).then_some(())
        },
    );
    eprintln!(
        "pool: rebuilt coordinator refilled {:?} after the wipe",
        wiped.elapsed()
    );
    for &f in &live {
        let st = hubs[f].as_ref().unwrap().status();
        assert!(
            st["coordinator"]["full_pushes"].as_u64() >= Some(2),
            "{}",
            st["coordinator"]
        );
    }

    // A follower is cut off: cloud and coordinator gone, its kubelet is answered from the
    // node's own cache; reconnected, from the cloud again.
    let cut = followers
        .iter()
        .copied()
        .find(|f| *f != new_leader)
        .unwrap();
    net.set_reachable(cut, false);
    let c = &clients[cut];
    let pods_path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", NODES[cut]);
    let offline = wait_for(
        "the cut node to answer from its cache",
        Duration::from_secs(15),
        || {
            let r = get(c, &pods_path, "kubelet/v1.32.0");
            (r.status == 200
                && r.header("warning")
                    .is_some_and(|w| w.contains("local cache")))
            .then_some(r)
        },
    );
    assert_eq!(names(&offline.json()).len(), 3);
    net.set_reachable(cut, true);
    wait_for(
        "the node back on the cloud",
        Duration::from_secs(15),
        || {
            let r = get(c, &pods_path, "kubelet/v1.32.0");
            (r.status == 200 && r.header("warning").is_none()).then_some(())
        },
    );
}

/// A whole site loses its cloud link and restarts: each node's kubelet writes its pods'
/// new addresses, and every node of the pool — not only the pod's own — serves the
/// service's EndpointSlice naming them, to the node's kube-proxy (node identity: from the
/// coordinator; protobuf, streamed list, its real selector) and to CoreDNS (its own
/// token: from the node's cache; JSON), on their open watches. The coordinator keeps the
/// cloud's slice; what the hubs share of their pods is gone once they are back in step.
#[test]
fn a_site_offline_serves_every_node_s_pods_at_their_new_addresses_from_every_node() {
    if !privileged::check(
        "a_site_offline_serves_every_node_s_pods_at_their_new_addresses_from_every_node",
    ) {
        return;
    }
    const NS: &str = "shop";
    const SLICE: &str = "shop/web-7xk2p";
    const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
    const KUBE_PROXY: &str = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
    const COREDNS: &str = "coredns/v1.12.1 (linux/amd64)";
    const DNS_TOKEN: &str = "coredns-token";
    // Documentation addresses: data in objects, never dialled.
    let old_ip = |i: usize| format!("192.0.2.{}", 10 + i);
    let new_ip = |i: usize| format!("198.51.100.{}", 20 + i);
    let uid = |i: usize| format!("seed-pods-{NS}-web-{i}");

    let net = PoolNet::new(2);
    let _cloud_side = net.cloud.enter();
    let etcd = EtcdCluster::start_on(1, ETCD_IP);
    let cloud =
        StandIn::start(format!("{CLOUD_IP}:0").parse().unwrap(), Options::default()).unwrap();
    let ca = cloud.ca.clone();
    {
        let mut auth = cloud.state.auth.write().unwrap();
        auth.add_test_identities();
        let user = "system:serviceaccount:kube-system:coredns";
        auth.add_token(DNS_TOKEN, user, &["system:serviceaccounts"]);
        auth.allow(Rule::new(
            user,
            &["get", "list", "watch"],
            &["services", "endpoints", "endpointslices"],
            &["*"],
        ));
    }
    let store = &cloud.state.store;
    seed::base(store);
    seed::namespace(store, NS);
    for (i, node) in NODES[..2].iter().enumerate() {
        seed::node(store, node);
        seed::web_pod(store, NS, &format!("web-{i}"), node, &old_ip(i));
    }
    seed::web_service(store, NS);
    let (uids, ips): (Vec<String>, Vec<String>) = (0..2).map(|i| (uid(i), old_ip(i))).unzip();
    let targets: Vec<recorded::Target> = (0..2)
        .map(|i| (["web-0", "web-1"][i], uids[i].as_str(), ips[i].as_str()))
        .collect();
    let mut slice = recorded::controller_endpointslice(NS, "web-7xk2p", "web", NODES[0], &targets);
    slice["endpoints"][1]["nodeName"] = NODES[1].into();
    seed::put(store, "endpointslices", "discovery.k8s.io", NS, slice);

    let pki = TempDir::new("poolnet");
    let nodes: Vec<Node> = (0..2)
        .map(|i| start_node(&net, i, &cloud, &ca, &etcd, pki.path()))
        .collect();
    wait_for("one pool leader", Duration::from_secs(30), || {
        let roles: Vec<String> = nodes.iter().map(|n| role(&n.hub)).collect();
        roles.iter().any(|r| r == "leader").then_some(())
    });
    wait_for(
        "the leader's endpointslices synced",
        Duration::from_secs(30),
        || {
            (!etcd
                .keys("/hub/synced/discovery.k8s.io/v1/endpointslices")
                .is_empty())
            .then_some(())
        },
    );
    // Each node's kubelet lists its pods (protobuf, as it does).
    for (i, n) in nodes.iter().enumerate() {
        let r = n
            .client
            .request(
                "GET",
                &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", NODES[i]),
                &[("User-Agent", KUBELET), ("Accept", PROTOBUF)],
                &[],
            )
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        n.hub.wait_stored();
    }
    // edge-1's kube-proxy and CoreDNS list and watch the slices through their hub.
    let hub1 = format!("{}:{}", PoolNet::node_ip(1), nodes[1].tls);
    let dns_client = Client::new(hub1.parse().unwrap(), ca.cert_der(), Some(DNS_TOKEN), None);
    let selector = "labelSelector=%21service.kubernetes.io%2Fheadless";
    let mut proxy = Informer::new(
        &nodes[1].client,
        KUBE_PROXY,
        true,
        SLICES,
        selector,
        Mode::WatchList,
    );
    let mut dns = Informer::new(&dns_client, COREDNS, false, SLICES, "", Mode::ListThenWatch);
    proxy.sync().unwrap();
    dns.sync().unwrap();
    let as_cloud_wrote = vec![
        ("web-0".to_string(), vec![old_ip(0)], true, true),
        ("web-1".to_string(), vec![old_ip(1)], true, true),
    ];
    assert_eq!(proxy.slice_endpoints(SLICE), as_cloud_wrote);
    nodes[1].hub.wait_stored();

    // The site's cloud link is gone; the coordinator stays.
    cloud.stop_listening();
    for n in &nodes {
        wait_for(
            "the hub to see the cloud down",
            Duration::from_secs(10),
            || (n.hub.status()["cloud"][0]["healthy"] == false).then_some(()),
        );
    }
    proxy.pump(Duration::from_secs(2)).unwrap();
    dns.pump(Duration::from_secs(2)).unwrap();
    assert_eq!(proxy.slice_endpoints(SLICE), as_cloud_wrote);

    let restarted = |i: usize| {
        let r = nodes[i]
            .client
            .request(
                "PATCH",
                &format!("/api/v1/namespaces/{NS}/pods/web-{i}/status"),
                &[
                    ("User-Agent", KUBELET),
                    ("Accept", PROTOBUF),
                    ("Content-Type", "application/strategic-merge-patch+json"),
                ],
                &recorded::kubelet_pod_restarted_patch(
                    &uid(i),
                    "True",
                    "Running",
                    &old_ip(i),
                    &new_ip(i),
                ),
            )
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "web-{i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    };
    // edge-0's pod runs again on a new address: edge-1's clients get it on their watches.
    restarted(0);
    let written = Instant::now();
    let one_moved = vec![
        ("web-0".to_string(), vec![new_ip(0)], true, true),
        ("web-1".to_string(), vec![old_ip(1)], true, true),
    ];
    for (name, informer) in [("kube-proxy", &mut proxy), ("coredns", &mut dns)] {
        let what = format!("edge-1's {name} to see web-0's new address");
        informer.wait_slice(&what, SLICE, &one_moved);
        eprintln!(
            "edge-1's {name} saw edge-0's write {} ms after it",
            written.elapsed().as_millis()
        );
    }
    let shared = etcd.keys("/hub/live/");
    assert_eq!(shared, ["/hub/live/pool-a/edge-0/shop/web-0"], "{shared:?}");

    // edge-1's own pod too; and a fresh list on edge-0 (from the coordinator) names both.
    restarted(1);
    let both_moved = vec![
        ("web-0".to_string(), vec![new_ip(0)], true, true),
        ("web-1".to_string(), vec![new_ip(1)], true, true),
    ];
    for (name, informer) in [("kube-proxy", &mut proxy), ("coredns", &mut dns)] {
        let what = format!("edge-1's {name} to see web-1's new address");
        informer.wait_slice(&what, SLICE, &both_moved);
    }
    let mut on_edge0 = Informer::new(
        &nodes[0].client,
        KUBE_PROXY,
        true,
        SLICES,
        selector,
        Mode::ListThenWatch,
    );
    wait_for(
        "edge-0's fresh list to name both new addresses",
        Duration::from_secs(30),
        || {
            on_edge0.sync().ok()?;
            (on_edge0.slice_endpoints(SLICE) == both_moved).then_some(())
        },
    );
    // The coordinator keeps the cloud's slice.
    let stored = etcd
        .etcdctl(
            &etcd.endpoints(),
            &[
                "get",
                "/registry/endpointslices/shop/web-7xk2p",
                "--print-value-only",
            ],
        )
        .unwrap();
    assert!(
        stored.contains(&old_ip(0)) && !stored.contains(&new_ip(0)),
        "{stored}"
    );

    // The cloud is back: the nodes replay their writes and share nothing any more.
    cloud.start_listening().unwrap();
    wait_for(
        "the hubs to stop sharing once back in step",
        Duration::from_secs(60),
        || etcd.keys("/hub/live/").is_empty().then_some(()),
    );
}
