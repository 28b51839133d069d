//! Services follow their pods while the cloud is unreachable: after an offline restart
//! the kubelet writes its pods' new IPs and readiness (two-way strategic merge patches, as
//! the real kubelet writes them: `fixtures/wire/kube-apiserver-1.36/patch-pod-status-strategic`),
//! and the EndpointSlices and Endpoints the hub serves to a kube-proxy-shaped client
//! (protobuf, streamed list, the label selector a real kube-proxy 1.36 sends) and a CoreDNS-shaped one (JSON, list then
//! watch) name the pods as they are now — on their open watches too — while a slice some
//! other controller manages is served as the cloud wrote it. When the cloud is back, both
//! converge on the cloud's objects and keep nothing the hub made.
use std::time::Duration;

use hub_tests::{
    apiserver::{ADMIN_TOKEN, auth::Rule, client::Client, seed},
    cni::{Bridge, PodNet},
    containerd::{Containerd, RunSpec},
    hub::LOOPBACK_NODE,
    informer::{Informer, Mode},
    privileged, recorded,
    scenario::Setup,
    wait_for,
};
use serde_json::Value;

const NODE: &str = LOOPBACK_NODE;
const NS: &str = "shop";
const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const KUBE_PROXY: &str = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const COREDNS: &str = "coredns/v1.12.1 (linux/amd64)";
const PROXY_TOKEN: &str = "kube-proxy-token";
const DNS_TOKEN: &str = "coredns-token";
/// The label selector a real kube-proxy 1.36 sent on EndpointSlices
/// (`fixtures/controllers-1.36/kube-proxy-1.36-requests.txt`).
fn proxy_selector() -> String {
    let recorded = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/controllers-1.36/kube-proxy-1.36-requests.txt"
    ))
    .unwrap();
    let slices = recorded
        .lines()
        .find(|l| l.starts_with("/apis/discovery.k8s.io/v1/endpointslices?"))
        .expect("kube-proxy's slice request");
    slices
        .split(['?', '&'])
        .find(|p| p.starts_with("labelSelector="))
        .expect("its label selector")
        .to_string()
}
const SLICE: &str = "shop/web-7xk2p";
const MIRRORED: &str = "shop/web-mirrored";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf,application/json";

/// Pod `web-<i>`'s address before the restart and after it (documentation addresses:
/// these are data in objects, never dialled).
fn old_ip(i: usize) -> String {
    format!("192.0.2.{}", 10 + i)
}
fn new_ip(i: usize) -> String {
    format!("198.51.100.{}", 20 + i)
}

fn pod_uid(i: usize) -> String {
    format!("seed-pods-{NS}-web-{i}")
}

fn seed_cloud(s: &Setup) {
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, NS);
    seed::node(store, NODE);
    for i in 0..3 {
        seed::web_pod(store, NS, &format!("web-{i}"), NODE, &old_ip(i));
    }
    seed::web_service(store, NS);
    let uids: Vec<String> = (0..3).map(pod_uid).collect();
    let ips: Vec<String> = (0..3).map(old_ip).collect();
    let names = ["web-0", "web-1", "web-2"];
    let pods: Vec<recorded::Target> = (0..3)
        .map(|i| (names[i], uids[i].as_str(), ips[i].as_str()))
        .collect();
    // As the cloud's endpointslice and endpoint controllers write them.
    let slice = recorded::controller_endpointslice(NS, "web-7xk2p", "web", NODE, &pods);
    seed::put(store, "endpointslices", "discovery.k8s.io", NS, slice);
    seed::put(
        store,
        "endpoints",
        "",
        NS,
        recorded::controller_endpoints(NS, "web", NODE, &pods),
    );
    // Managed by another controller (mirrored from user-made Endpoints): never adjusted.
    let mut mirrored =
        recorded::controller_endpointslice(NS, "web-mirrored", "web-legacy", NODE, &pods[..1]);
    mirrored["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] =
        "endpointslicemirroring-controller.k8s.io".into();
    seed::put(store, "endpointslices", "discovery.k8s.io", NS, mirrored);
    let mut auth = s.cloud.state.auth.write().unwrap();
    for (token, user) in [
        (PROXY_TOKEN, "system:serviceaccount:kube-system:kube-proxy"),
        (DNS_TOKEN, "system:serviceaccount:kube-system:coredns"),
    ] {
        auth.add_token(token, user, &["system:serviceaccounts"]);
        auth.allow(Rule::new(
            user,
            &["get", "list", "watch"],
            &["services", "endpoints", "endpointslices"],
            &["*"],
        ));
    }
}

/// The kubelet's recorded status patch for pod `i` after the restart.
fn status_patch(i: usize, ready: &str, phase: &str) -> Vec<u8> {
    recorded::kubelet_pod_restarted_patch(&pod_uid(i), ready, phase, &old_ip(i), &new_ip(i))
}

/// Waits until `informer` (kube-proxy's or CoreDNS's, against the cloud again) holds what
/// `done` wants, resuming or relisting as a reflector does.
fn until_converged(
    name: &str,
    what: &str,
    informer: &mut Informer,
    done: impl Fn(&Informer) -> bool,
) {
    wait_for(&format!("{name} {what}"), Duration::from_secs(60), || {
        if informer.pump(Duration::from_millis(300)).is_err() {
            informer.sync().ok()?;
        }
        done(informer).then_some(())
    });
}

fn slice_rv(informer: &Informer, key: &str) -> u64 {
    informer.objects.get(key).copied().unwrap_or(0)
}

#[test]
fn offline_slices_and_endpoints_follow_the_pods_the_kubelet_writes_then_hand_back_to_the_cloud() {
    let s = Setup::new(&["kubelet", "kube-proxy", "coredns"]);
    seed_cloud(&s);
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let proxy_client = Client::new(s.hub_addr(), s.ca.cert_der(), Some(PROXY_TOKEN), None);
    let dns_client = Client::new(s.hub_addr(), s.ca.cert_der(), Some(DNS_TOKEN), None);
    let slices = "/apis/discovery.k8s.io/v1/endpointslices";
    let selector = proxy_selector();
    let mut proxy = Informer::new(
        &proxy_client,
        KUBE_PROXY,
        true,
        slices,
        &selector,
        Mode::WatchList,
    );
    let mut dns = Informer::new(&dns_client, COREDNS, false, slices, "", Mode::ListThenWatch);
    proxy.sync().unwrap();
    dns.sync().unwrap();
    let cloud_slice_rv = slice_rv(&proxy, SLICE);
    assert_eq!(proxy.names(), [SLICE, MIRRORED]);
    // The kubelet's pods, in protobuf as it lists them; CoreDNS's Endpoints in JSON.
    s.kubelet_lists_its_pods(&kubelet, KUBELET);
    let dns_json = [("User-Agent", COREDNS), ("Accept", "application/json")];
    let endpoints_path = format!("/api/v1/namespaces/{NS}/endpoints");
    assert_eq!(
        dns_client
            .request("GET", &endpoints_path, &dns_json, &[])
            .unwrap()
            .status,
        200
    );
    hub.wait_stored();

    s.cloud_down(&hub);
    // The informers' cloud watches end; they go on against the hub.
    proxy.pump(Duration::from_secs(2)).unwrap();
    dns.pump(Duration::from_secs(2)).unwrap();
    let old = |i: usize| vec![old_ip(i)];
    assert_eq!(
        proxy.slice_endpoints(SLICE),
        [
            ("web-0".into(), old(0), true, true),
            ("web-1".into(), old(1), true, true),
            ("web-2".into(), old(2), true, true)
        ],
        "nothing written yet: the slice as the cloud wrote it"
    );

    // The node restarted offline: its pods run again on new addresses. web-0 is Ready,
    // web-1 not yet, web-2 failed.
    for (i, ready, phase) in [
        (0, "True", "Running"),
        (1, "False", "Running"),
        (2, "False", "Failed"),
    ] {
        let r = kubelet
            .request(
                "PATCH",
                &format!("/api/v1/namespaces/{NS}/pods/web-{i}/status"),
                &[
                    ("User-Agent", KUBELET),
                    ("Accept", PROTOBUF),
                    ("Content-Type", "application/strategic-merge-patch+json"),
                ],
                &status_patch(i, ready, phase),
            )
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "web-{i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let now = vec![
        ("web-0".to_string(), vec![new_ip(0)], true, true),
        ("web-1".to_string(), vec![new_ip(1)], false, false),
    ];
    // Both open watches get the slice as the pods are now.
    for (name, informer) in [("kube-proxy", &mut proxy), ("coredns", &mut dns)] {
        let what = format!("{name}'s watch to get the slice naming the new addresses");
        informer.wait_slice(&what, SLICE, &now);
        assert!(
            slice_rv(informer, SLICE) < cloud_slice_rv,
            "served below the cloud's version"
        );
        assert_eq!(
            informer.slice_endpoints(MIRRORED),
            [("web-0".into(), old(0), true, true)],
            "another controller's slice is left as it is"
        );
    }
    // A fresh list in either encoding, and the Endpoints, say the same.
    let mut relisted = Informer::new(
        &proxy_client,
        KUBE_PROXY,
        true,
        slices,
        &selector,
        Mode::ListThenWatch,
    );
    relisted.sync().unwrap();
    assert_eq!(relisted.slice_endpoints(SLICE), now);
    let ep = dns_client
        .request("GET", &format!("{endpoints_path}/web"), &dns_json, &[])
        .unwrap()
        .json();
    let ips = |list: &str| -> Vec<String> {
        ep["subsets"][0][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a["ip"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        (ips("addresses"), ips("notReadyAddresses")),
        (vec![new_ip(0)], vec![new_ip(1)]),
        "{ep}"
    );
    // Nothing adjusted was stored: the cache keeps the cloud's objects.
    let cached: Vec<Value> = s.cache_ls("kube-proxy");
    let held = cached
        .iter()
        .find(|o| o["key"].as_str().is_some_and(|k| k.ends_with("/web-7xk2p")))
        .expect("the slice is cached");
    assert_eq!(held["resource_version"], cloud_slice_rv, "{held}");

    // The cloud is back, its controller not yet caught up: the clients converge on the
    // cloud's slice (old addresses) and keep nothing the hub made ...
    s.cloud.start_listening().unwrap();
    let cloud_endpoints = vec![
        ("web-0".to_string(), old(0), true, true),
        ("web-1".to_string(), old(1), true, true),
        ("web-2".to_string(), old(2), true, true),
    ];
    for (name, informer) in [("kube-proxy", &mut proxy), ("coredns", &mut dns)] {
        until_converged(name, "to hold the cloud's slice again", informer, |i| {
            slice_rv(i, SLICE) == cloud_slice_rv && i.slice_endpoints(SLICE) == cloud_endpoints
        });
    }
    // ... and then the cloud's own update reaches them as it would without the hub.
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/web-7xk2p");
    let mut cloud = admin.get(&path).json();
    let uid = pod_uid(0);
    let ip = new_ip(0);
    cloud["endpoints"] = recorded::controller_endpointslice(
        NS,
        "web-7xk2p",
        "web",
        NODE,
        &[("web-0", &uid, &ip)],
    )["endpoints"]
        .clone();
    let put = admin.send_json("PUT", &path, &cloud);
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    let updated_rv: u64 = put.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for (name, informer) in [("kube-proxy", &mut proxy), ("coredns", &mut dns)] {
        until_converged(name, "to get the cloud's update", informer, |i| {
            slice_rv(i, SLICE) == updated_rv
        });
        assert_eq!(
            informer.slice_endpoints(SLICE),
            [("web-0".into(), vec![new_ip(0)], true, true)]
        );
    }
}

/// A GET of `ip:8080` from the node's network: the page the pod serves, or why not.
fn page_at(bridge: &Bridge, ip: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let _in_node = bridge.node.enter();
    let addr: std::net::SocketAddr = format!("{ip}:8080").parse().unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// Starts pod `name` (busybox httpd serving its own name on 8080) in `net`, from `rootfs`.
fn start_pod(ctd: &mut Containerd, rootfs: &std::path::Path, name: &str, net: &PodNet, round: u32) {
    let www = rootfs.parent().unwrap().join(format!("www-{name}"));
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), name).unwrap();
    ctd.start_detached(&RunSpec {
        id: format!("{name}-{round}"),
        image: rootfs.to_str().unwrap().to_string(),
        rootfs: true,
        args: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
            .map(String::from)
            .to_vec(),
        mounts: vec![(www, "/www".into(), true, false)],
        join: vec![("network".into(), net.path())],
        cgroup: format!("/{}", hub_tests::unique(name)),
        ..Default::default()
    });
}

/// Pods run by containerd and runc on the CNI bridge: after an offline reboot they run
/// again on the new IPs host-local gives them, the kubelet writes those (its recorded
/// patches), and the EndpointSlice the hub serves a kube-proxy-shaped client names them —
/// the service's pods answer at the addresses it was served, not at the old ones.
#[test]
fn pods_on_the_cni_bridge_answer_at_the_addresses_the_hub_serves_after_an_offline_reboot() {
    if !privileged::check_pods(
        "pods_on_the_cni_bridge_answer_at_the_addresses_the_hub_serves_after_an_offline_reboot",
    ) {
        return;
    }
    const NAMES: [&str; 2] = ["web-0", "web-1"];
    // Link-local: assigned inside the test's own namespaces only.
    let bridge = Bridge::new("169.254.70.0/24");
    let mut ctd = Containerd::start();
    let dir = hub_tests::TempDir::new("pods");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    let mut nets: Vec<PodNet> = NAMES
        .iter()
        .map(|n| bridge.add(&format!("{n}-0")))
        .collect();
    for (name, net) in NAMES.iter().zip(&nets) {
        start_pod(&mut ctd, &rootfs, name, net, 0);
    }
    for (name, net) in NAMES.iter().zip(&nets) {
        wait_for(&format!("{name} to serve"), Duration::from_secs(30), || {
            page_at(&bridge, &net.ip).ok().filter(|p| p == name)
        });
    }

    let s = Setup::new(&["kubelet", "kube-proxy"]);
    let store = &s.cloud.state.store;
    seed::base(store);
    seed::namespace(store, NS);
    seed::node(store, NODE);
    for (name, net) in NAMES.iter().zip(&nets) {
        seed::web_pod(store, NS, name, NODE, &net.ip);
    }
    let uids: Vec<String> = NAMES
        .iter()
        .map(|n| format!("seed-pods-{NS}-{n}"))
        .collect();
    let targets: Vec<recorded::Target> = (0..2)
        .map(|i| (NAMES[i], uids[i].as_str(), nets[i].ip.as_str()))
        .collect();
    seed::put(
        store,
        "endpointslices",
        "discovery.k8s.io",
        NS,
        recorded::controller_endpointslice(NS, "web-7xk2p", "web", NODE, &targets),
    );
    {
        let mut auth = s.cloud.state.auth.write().unwrap();
        let user = "system:serviceaccount:kube-system:kube-proxy";
        auth.add_token(PROXY_TOKEN, user, &["system:serviceaccounts"]);
        auth.allow(Rule::new(
            user,
            &["get", "list", "watch"],
            &["endpointslices"],
            &["*"],
        ));
    }
    let hub = s.start_hub();
    let kubelet = s.kubelet();
    let proxy_client = Client::new(s.hub_addr(), s.ca.cert_der(), Some(PROXY_TOKEN), None);
    let mut proxy = Informer::new(
        &proxy_client,
        KUBE_PROXY,
        true,
        "/apis/discovery.k8s.io/v1/endpointslices",
        &proxy_selector(),
        Mode::WatchList,
    );
    proxy.sync().unwrap();
    s.kubelet_lists_its_pods(&kubelet, KUBELET);
    hub.wait_stored();
    let served = |proxy: &Informer| -> Vec<String> {
        proxy
            .slice_endpoints(SLICE)
            .into_iter()
            .filter(|(_, _, ready, _)| *ready)
            .flat_map(|(_, addresses, _, _)| addresses)
            .collect()
    };
    let before: Vec<String> = nets.iter().map(|n| n.ip.clone()).collect();
    assert_eq!(served(&proxy), before);

    // The node reboots while the cloud is unreachable: every pod's network is made again.
    s.cloud_down(&hub);
    for (i, name) in NAMES.iter().enumerate() {
        ctd.remove(&format!("{name}-0"));
        let old = std::mem::replace(&mut nets[i], bridge.add(&format!("{name}-1")));
        bridge.del(&format!("{name}-0"), old);
        start_pod(&mut ctd, &rootfs, name, &nets[i], 1);
    }
    let after: Vec<String> = nets.iter().map(|n| n.ip.clone()).collect();
    for (old, new) in before.iter().zip(&after) {
        assert_ne!(old, new, "host-local gave a new address");
        assert!(
            page_at(&bridge, old).is_err(),
            "nothing answers at {old} any more"
        );
    }
    // The kubelet writes where its pods run now.
    for (i, name) in NAMES.iter().enumerate() {
        let r = kubelet
            .request(
                "PATCH",
                &format!("/api/v1/namespaces/{NS}/pods/{name}/status"),
                &[
                    ("User-Agent", KUBELET),
                    ("Accept", PROTOBUF),
                    ("Content-Type", "application/strategic-merge-patch+json"),
                ],
                &recorded::kubelet_pod_restarted_patch(
                    &uids[i], "True", "Running", &before[i], &after[i],
                ),
            )
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    wait_for(
        "kube-proxy's watch to name the pods' new addresses",
        Duration::from_secs(20),
        || {
            if proxy.pump(Duration::from_millis(300)).is_err() {
                proxy.sync().ok()?;
            }
            (served(&proxy) == after).then_some(())
        },
    );
    // Every address the hub served answers with its pod.
    for (name, ip) in NAMES.iter().zip(served(&proxy)) {
        let page = wait_for(&format!("{name} at {ip}"), Duration::from_secs(30), || {
            page_at(&bridge, &ip).ok()
        });
        assert_eq!(&page, name);
    }
}
