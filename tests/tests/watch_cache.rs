//! The node-level watch cache: three clients of one node read services as a real node's
//! do — the kubelet (node certificate, protobuf, streamed lists, `spec.clusterIP!=None`),
//! kube-proxy (its own token, protobuf, streamed lists, its label selector) and CoreDNS
//! (its own token, JSON, LIST then watch, all services) — and restart five times. Through
//! the hub the cloud sends the services once, not once per client and restart, and every
//! client's view is the one it gets from the cloud directly. Authorization stays the
//! cloud's: a credential the cloud refuses is refused, and one whose permission the cloud
//! withdrew is refused once the memo's time is up.
use std::{collections::BTreeMap, time::Duration};

use hub_tests::{
    apiserver::{
        ADMIN_TOKEN, Options,
        auth::Rule,
        client::{Client, Reply},
        faults::FaultSettings,
        seed,
    },
    hub::LOOPBACK_NODE,
    informer::{Informer, Mode},
    scenario::Setup,
    wait_for,
};
use serde_json::{Value, json};

const KUBELET: &str = "kubelet/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const KUBE_PROXY: &str = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/7b29fb0";
const COREDNS: &str = "coredns/1.12.1 (linux/amd64) kubernetes/v0.0.0";
const PROXY_TOKEN: &str = "kube-proxy-token";
const DNS_TOKEN: &str = "coredns-token";
/// A token the cloud lets read services in ns1 only.
const NS1_TOKEN: &str = "ns1-reader-token";
/// A token the cloud lets read nothing.
const NOBODY_TOKEN: &str = "nobody-token";
const SERVICES: usize = 150;
const RESTARTS: usize = 5;

/// (user agent, protobuf, mode, selector) of each client.
const CLIENTS: [(&str, bool, Mode, &str); 3] = [
    (
        KUBELET,
        true,
        Mode::WatchList,
        "fieldSelector=spec.clusterIP%21%3DNone",
    ),
    (
        KUBE_PROXY,
        true,
        Mode::WatchList,
        "fieldSelector=spec.clusterIP%21%3DNone&labelSelector=%21service.kubernetes.io%2Fservice-proxy-name",
    ),
    (COREDNS, false, Mode::ListThenWatch, ""),
];

/// A cloud whose watches get bookmarks as kube-apiserver 1.36's watch cache sends them:
/// every minute, and as a watch of 3 s or more ends. The hub must not need more.
fn options() -> Options {
    Options {
        bookmark_interval: Duration::from_secs(60),
        bookmark_at_deadline: true,
        ..Options::default()
    }
}

fn cloud_with_services(cache_extra: &str) -> Setup {
    let mut s = Setup::with_options(&["kubelet", "kube-proxy", "coredns"], options());
    s.cache_extra = cache_extra.to_string();
    let store = &s.cloud.state.store;
    seed::base(store);
    for ns in ["ns1", "ns2"] {
        seed::namespace(store, ns);
    }
    seed::node(store, LOOPBACK_NODE);
    for i in 0..SERVICES {
        let ns = if i % 2 == 0 { "ns1" } else { "ns2" };
        seed::service(store, ns, &format!("svc-{i}"), 80);
    }
    let mut auth = s.cloud.state.auth.write().unwrap();
    let services = |user: &str, namespaces: &[&str]| {
        Rule::new(user, &["get", "list", "watch"], &["services"], namespaces)
    };
    auth.add_token(
        PROXY_TOKEN,
        "system:serviceaccount:kube-system:kube-proxy",
        &[],
    );
    auth.allow(services(
        "system:serviceaccount:kube-system:kube-proxy",
        &["*"],
    ));
    auth.add_token(DNS_TOKEN, "system:serviceaccount:kube-system:coredns", &[]);
    auth.allow(services(
        "system:serviceaccount:kube-system:coredns",
        &["*"],
    ));
    auth.add_token(NS1_TOKEN, "ns1-reader", &[]);
    auth.allow(services("ns1-reader", &["ns1"]));
    auth.add_token(NOBODY_TOKEN, "nobody", &[]);
    drop(auth);
    s
}

/// The three clients, towards `addr` (the hub, or the cloud directly).
fn clients(s: &Setup, addr: std::net::SocketAddr) -> [Client; 3] {
    let ca = s.ca.cert_der();
    [
        Client::new(addr, ca.clone(), None, Some(&s.pki.kubelet)),
        Client::new(addr, ca.clone(), Some(PROXY_TOKEN), None),
        Client::new(addr, ca, Some(DNS_TOKEN), None),
    ]
}

/// What one client holds after it synced: namespace/name -> (rv, decoded object).
type View = BTreeMap<String, (u64, Value)>;

fn decoded(protobuf: bool, raw: &[u8]) -> Value {
    if protobuf {
        // The object's metadata and the bytes: equal bytes are equal objects.
        json!({"protobuf": raw})
    } else {
        serde_json::from_slice(raw).expect("a JSON object")
    }
}

/// Each client starts (a fresh informer: a consistent list) RESTARTS times and keeps
/// watching a little; a service is created in between, which every view must show.
fn run(s: &Setup, admin: &Client, clients: &[Client; 3], round: &str) -> Vec<View> {
    let mut views = vec![View::new(); 3];
    for restart in 0..RESTARTS {
        if restart == 2 {
            let svc = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("added-{round}"), "namespace": "ns1"},
                "spec": {"ports": [{"port": 81}]}});
            let r = admin.send_json("POST", "/api/v1/namespaces/ns1/services", &svc);
            assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        }
        for (n, ((ua, protobuf, mode, selector), client)) in CLIENTS.iter().zip(clients).enumerate()
        {
            // The cloud's resourceVersion moves with every write of any resource (a node's
            // lease renewals, say): a consistent read must wait for the set to pass it.
            let tick = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("tick-{round}-{restart}-{n}"), "namespace": "ns2"}});
            let r = admin.send_json("POST", "/api/v1/namespaces/ns2/configmaps", &tick);
            assert_eq!(r.status, 201);
            let mut informer =
                Informer::new(client, ua, *protobuf, "/api/v1/services", selector, *mode);
            informer.sync().unwrap_or_else(|e| {
                panic!("{ua} ({round}) could not sync: {e}\n{:?}", informer.calls)
            });
            informer.pump(Duration::from_millis(200)).expect("watch");
            views[n] = informer
                .objects
                .iter()
                .map(|(k, rv)| (k.clone(), (*rv, decoded(*protobuf, &informer.bodies[k]))))
                .collect();
        }
    }
    let _ = s;
    views
}

/// Bytes and list+watch requests the cloud served the node's clients and the hub (the
/// test's own writes as the admin left out).
fn cloud_cost(s: &Setup) -> (u64, u64) {
    let mut report = s.cloud.state.traffic.report();
    report.remove("admin");
    let bytes = report.values().map(|t| t.bytes).sum();
    let reads = report
        .values()
        .map(|t| {
            t.verbs.get("list").copied().unwrap_or(0) + t.verbs.get("watch").copied().unwrap_or(0)
        })
        .sum();
    (bytes, reads)
}

#[test]
fn three_clients_of_a_node_cost_the_cloud_one_list_and_see_what_they_see_directly() {
    let s = cloud_with_services("");
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);

    // Directly, as the node's clients do without a hub.
    s.cloud.state.traffic.reset();
    let direct_views = run(&s, &admin, &clients(&s, s.cloud.addr), "direct");
    let (direct_bytes, direct_reads) = cloud_cost(&s);

    let hub = s.start_hub();
    s.cloud.state.traffic.reset();
    let hub_views = run(&s, &admin, &clients(&s, s.hub_addr()), "hub");
    let (hub_bytes, hub_reads) = cloud_cost(&s);

    // The same sets, object for object (the hub round added one more service).
    for (n, (direct, through)) in direct_views.iter().zip(&hub_views).enumerate() {
        let ua = CLIENTS[n].0;
        let mut direct = direct.clone();
        let mut through = through.clone();
        assert!(
            through.remove("ns1/added-hub").is_some(),
            "{ua} through the hub does not see the service created meanwhile"
        );
        assert!(
            direct.remove("ns1/added-direct").is_some(),
            "{ua} directly does not see the service created meanwhile"
        );
        through.remove("ns1/added-direct");
        assert_eq!(direct.len(), through.len(), "{ua}: how many services");
        for (key, (_, object)) in &direct {
            let (_, theirs) = through
                .get(key)
                .unwrap_or_else(|| panic!("{ua}: {key} missing through the hub"));
            assert_eq!(object, theirs, "{ua}: {key} differs through the hub");
        }
    }
    let status = hub.status();
    let w = &status["node_watch_cache"];
    let served = w["lists_served"].as_u64().unwrap() + w["watches_served"].as_u64().unwrap();
    eprintln!(
        "cloud bytes: direct {direct_bytes}, through the hub {hub_bytes} ({:.3}x); list+watch requests: direct {direct_reads}, hub {hub_reads}; node-level watch cache: {w}",
        hub_bytes as f64 / direct_bytes as f64
    );
    // The same counts are in the metrics.
    let metrics = hub.admin_get("/metrics");
    let metric = |name: &str| -> Option<u64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    assert_eq!(
        metric("hub_watch_cache_watches_served_total"),
        w["watches_served"].as_u64(),
        "{metrics}"
    );
    assert_eq!(metric("hub_watch_cache_sets_current"), Some(1));
    assert_eq!(w["sets"][0]["gvr"], "/v1/services", "{w}");
    assert_eq!(
        w["sets"][0]["lists"], 1,
        "the node listed services once: {w}"
    );
    // Every restart of every client after the first ones was answered from the set.
    assert!(served >= (3 * RESTARTS - 3) as u64, "{w}");
    assert!(
        hub_bytes * 10 <= direct_bytes * 3,
        "the cloud sent {hub_bytes} bytes through the hub against {direct_bytes} directly"
    );
    // The one-item checks are lists too, but each is one object, not the set.
    assert!(
        hub_reads <= direct_reads * 3,
        "{hub_reads} reads against {direct_reads}"
    );

    // What the set answered was kept for each credential: offline, each client still gets
    // its own services from the node's cache.
    s.cloud_down(&hub);
    let [kubelet, _, dns] = clients(&s, s.hub_addr());
    let mut offline = Informer::new(
        &dns,
        COREDNS,
        false,
        "/api/v1/services",
        "",
        Mode::ListThenWatch,
    );
    offline.sync().expect("CoreDNS lists offline");
    assert_eq!(
        offline.objects.len(),
        SERVICES + 2,
        "{:?}",
        offline.objects.keys().take(3).collect::<Vec<_>>()
    );
    let mut offline = Informer::new(
        &kubelet,
        KUBELET,
        true,
        "/api/v1/services",
        CLIENTS[0].3,
        Mode::WatchList,
    );
    offline.sync().expect("the kubelet lists offline");
    assert!(
        offline.objects.len() >= SERVICES,
        "{}",
        offline.objects.len()
    );
}

/// Waits until the node's set of services is current. The set starts on a request the
/// hub routes to the cloud: one that came before the hub's first verdict on the cloud
/// went to the cache first, so the kubelet asks again until the set is there.
fn set_current(hub: &hub_tests::hub::HubProc, kubelet: &Client) {
    wait_for(
        "the node's set to be current",
        Duration::from_secs(20),
        || {
            if hub.status()["node_watch_cache"]["sets"][0]["state"] == "current" {
                return Some(());
            }
            get(kubelet, "/api/v1/services?resourceVersion=0");
            None
        },
    );
}

/// The kubelet lists `path` (200), the node's set becomes current; the list's
/// resourceVersion.
fn listed_from_a_current_set(
    hub: &hub_tests::hub::HubProc,
    kubelet: &Client,
    path: &str,
) -> String {
    let list = get(kubelet, path);
    assert_eq!(list.status, 200);
    set_current(hub, kubelet);
    let list: Value = serde_json::from_slice(&list.body).unwrap();
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits until the node's set of services has applied `events` changes in all.
fn set_events_reach(hub: &hub_tests::hub::HubProc, events: u64) {
    wait_for(
        "the set to see the changes",
        Duration::from_secs(20),
        || {
            let sets = &hub.status()["node_watch_cache"]["sets"];
            (sets[0]["events"].as_u64() >= Some(events)).then_some(())
        },
    );
}

fn get(client: &Client, path: &str) -> Reply {
    client
        .request("GET", path, &[("Accept", "application/json")], &[])
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn names(reply: &Reply) -> Vec<String> {
    let v: Value = serde_json::from_slice(&reply.body).expect("a JSON list");
    hub_tests::list_keys(&v)
}

#[test]
fn a_credential_is_answered_from_the_set_only_as_far_as_the_cloud_allows_it() {
    let s = cloud_with_services("  authorizationSeconds: 2\n");
    let hub = s.start_hub();
    let [kubelet, ..] = clients(&s, s.hub_addr());
    let ca = s.ca.cert_der();
    let nobody = Client::new(s.hub_addr(), ca.clone(), Some(NOBODY_TOKEN), None);
    let ns1 = Client::new(s.hub_addr(), ca.clone(), Some(NS1_TOKEN), None);
    // The set is filled (the node's own list goes first).
    let r = get(&kubelet, "/api/v1/services?resourceVersion=0");
    assert_eq!(r.status, 200);
    set_current(&hub, &kubelet);

    // Refused by the cloud: refused, in every form, and never a byte of the set.
    for path in [
        "/api/v1/services",
        "/api/v1/services?resourceVersion=0",
        "/api/v1/services?watch=1&resourceVersion=0",
        "/api/v1/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    ] {
        let r = get(&nobody, path);
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, 403, "{path}: {}", &body[..body.len().min(300)]);
        let v: Value = serde_json::from_slice(&r.body).expect("a Status");
        assert_eq!(v["kind"], "Status");
        assert!(!String::from_utf8_lossy(&r.body).contains("svc-"), "{path}");
    }
    // Allowed one namespace: that namespace from the set, and no other.
    let r = get(&ns1, "/api/v1/namespaces/ns1/services?resourceVersion=0");
    assert_eq!(r.status, 200);
    let listed = names(&r);
    assert_eq!(listed.len(), SERVICES / 2);
    assert!(listed.iter().all(|n| n.starts_with("ns1/")), "{listed:?}");
    assert_eq!(get(&ns1, "/api/v1/services?resourceVersion=0").status, 403);
    assert_eq!(
        get(&ns1, "/api/v1/namespaces/ns2/services?resourceVersion=0").status,
        403
    );
    let answered = hub.status()["node_watch_cache"]["lists_served"]
        .as_u64()
        .unwrap();
    assert!(answered >= 1, "the namespace's list came from the set");

    // The cloud withdraws the permission: once the memo's time is up, refused.
    s.cloud.state.auth.write().unwrap().revoke("ns1-reader");
    let refused = wait_for(
        "the withdrawn permission to be seen",
        Duration::from_secs(20),
        || {
            let r = get(&ns1, "/api/v1/namespaces/ns1/services?resourceVersion=0");
            (r.status != 200).then_some(r)
        },
    );
    assert_eq!(
        refused.status,
        403,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    // A consistent read asks the cloud every time: refused at once.
    assert_eq!(get(&ns1, "/api/v1/namespaces/ns1/services").status, 403);
}

#[test]
fn a_watch_resumes_from_the_set_and_below_its_window_gets_410() {
    let s = cloud_with_services("");
    let hub = s.start_hub();
    let [kubelet, ..] = clients(&s, s.hub_addr());
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let rv = listed_from_a_current_set(&hub, &kubelet, "/api/v1/namespaces/ns1/services");
    // Changes after that resourceVersion, while the client is away.
    let svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "later", "namespace": "ns1"}, "spec": {"ports": [{"port": 82}]}});
    assert_eq!(
        admin
            .send_json("POST", "/api/v1/namespaces/ns1/services", &svc)
            .status,
        201
    );
    let r = admin
        .request("DELETE", "/api/v1/namespaces/ns1/services/svc-0", &[], &[])
        .unwrap();
    assert_eq!(r.status, 200);
    set_events_reach(&hub, 2);
    let before = hub.status()["node_watch_cache"]["watches_served"]
        .as_u64()
        .unwrap();
    let mut w = kubelet.watch_from("/api/v1/namespaces/ns1/services", &rv);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = w.next_event(Duration::from_secs(10)).expect("an event");
        if e["type"] != "BOOKMARK" {
            seen.push((
                e["type"].as_str().unwrap().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ));
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED".to_string(), "later".to_string()),
            ("DELETED".to_string(), "svc-0".to_string())
        ]
    );
    let after = hub.status()["node_watch_cache"]["watches_served"]
        .as_u64()
        .unwrap();
    assert_eq!(after, before + 1, "the resumed watch came from the set");

    // Below what the set keeps: 410 Expired, as kube-apiserver's watch cache answers.
    let mut old = kubelet.watch_from("/api/v1/namespaces/ns1/services", "1");
    let e = old
        .next_event(Duration::from_secs(10))
        .expect("an ERROR event");
    assert_eq!(e["type"], "ERROR", "{e}");
    assert_eq!(e["object"]["code"], 410, "{e}");
    assert_eq!(e["object"]["reason"], "Expired", "{e}");
}

/// At the end of a cut the cloud's connections come back, and the set's own watch and its
/// clients' watches open again at the same moment. A client that resumes while the set's
/// watch is still being opened waits for it and is answered from the set, not the cloud.
#[test]
fn a_watch_resumed_while_the_set_s_own_watch_reopens_comes_from_the_set() {
    let s = cloud_with_services("");
    let hub = s.start_hub();
    let [kubelet, ..] = clients(&s, s.hub_addr());
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let path = "/api/v1/namespaces/ns1/services";
    let rv = listed_from_a_current_set(&hub, &kubelet, path);
    // The kubelet's watch once, so the cloud has answered its credential's watch.
    drop(kubelet.watch_from(path, &rv));
    let set_state = || {
        hub.status()["node_watch_cache"]["sets"][0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    wait_for("the set to be current", Duration::from_secs(20), || {
        (set_state() == "current").then_some(())
    });

    // The cloud drops every connection, and from now on answers 4 s late (its PINGs at
    // once): the set's own watch is opened again 4 s after the hub asks.
    s.cloud.set_faults(FaultSettings {
        latency_ms: 4000,
        ..FaultSettings::default()
    });
    s.cloud.stop_listening();
    s.cloud.start_listening().unwrap();
    wait_for(
        "the set's watch to break while the cloud answers",
        Duration::from_secs(20),
        || {
            let healthy = hub.status()["cloud"][0]["healthy"] == true;
            (healthy && set_state().starts_with("resuming")).then_some(())
        },
    );
    let served = || {
        hub.status()["node_watch_cache"]["watches_served"]
            .as_u64()
            .unwrap()
    };
    let (served_before, audited_before) = (served(), s.cloud.audit().len());
    let mut w = kubelet.watch_from(path, &rv);
    let svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "after-the-cut", "namespace": "ns1"}, "spec": {"ports": [{"port": 83}]}});
    assert_eq!(admin.send_json("POST", path, &svc).status, 201);
    let added = loop {
        let e = w.next_event(Duration::from_secs(30)).expect("an event");
        if e["type"] != "BOOKMARK" {
            break e;
        }
    };
    assert_eq!(added["type"], "ADDED", "{added}");
    assert_eq!(added["object"]["metadata"]["name"], "after-the-cut");
    assert_eq!(
        served(),
        served_before + 1,
        "the resumed watch came from the set"
    );
    let to_the_cloud: Vec<String> = s.cloud.audit()[audited_before..]
        .iter()
        .filter(|e| e.path.starts_with(path) && e.path.contains("watch"))
        .map(|e| e.path.clone())
        .collect();
    assert!(to_the_cloud.is_empty(), "{to_the_cloud:?}");
}

/// A page's items as (namespace/name, resourceVersion), and its continue token and
/// remaining count.
fn page(reply: &Reply) -> (Vec<(String, String)>, String, Value) {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let v: Value = serde_json::from_slice(&reply.body).expect("a JSON list");
    let items = hub_tests::list_keys(&v)
        .into_iter()
        .zip(v["items"].as_array().unwrap())
        .map(|(k, i)| (k, i["metadata"]["resourceVersion"].as_str().unwrap().into()))
        .collect();
    let token = v["metadata"]["continue"].as_str().unwrap_or("").to_string();
    (items, token, v["metadata"]["remainingItemCount"].clone())
}

/// A client pages a consistent list of all services (kubectl's `limit=50`) while the
/// cloud changes them: every page comes from the set, read as the set stood at the first
/// page's resourceVersion, in kube-apiserver's order; a token the hub wrote continues at
/// the cloud and one the cloud wrote continues at the hub, page for page the same.
#[test]
fn a_list_in_pages_is_paged_from_the_set_and_continues_across_the_hub_and_the_cloud() {
    let s = cloud_with_services("");
    // etcd's order is not (namespace, name): `a-b/x` comes before `a/x`.
    for ns in ["a", "a-b"] {
        seed::namespace(&s.cloud.state.store, ns);
        seed::service(&s.cloud.state.store, ns, "x", 80);
    }
    let hub = s.start_hub();
    let [kubelet, _, dns] = clients(&s, s.hub_addr());
    let [_, _, dns_direct] = clients(&s, s.cloud.addr);
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    set_current(&hub, &kubelet);
    let count = |what: &str| hub.status()["node_watch_cache"][what].as_u64().unwrap();
    let (served, passed, events) = (
        count("lists_served"),
        count("passed_to_cloud"),
        hub.status()["node_watch_cache"]["sets"][0]["events"]
            .as_u64()
            .unwrap(),
    );

    let (first, token, remaining) = page(&get(&dns, "/api/v1/services?limit=50"));
    assert_eq!(first.len(), 50);
    assert_eq!((first[0].0.as_str(), first[1].0.as_str()), ("a-b/x", "a/x"));
    assert_eq!(remaining, json!(SERVICES + 2 - 50));
    let rv = {
        let t = hub::cache::paging::decode(&token).expect("kube-apiserver's token");
        assert_eq!(t.start, format!("/{}\0", first[49].0));
        t.rv.expect("the token names a resourceVersion")
    };

    // The cloud changes between the pages: a service after the first page is deleted and
    // one is created. The pages still show the list as it was.
    let svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc-zzz", "namespace": "ns2"}, "spec": {"ports": [{"port": 82}]}});
    assert_eq!(
        admin
            .send_json("POST", "/api/v1/namespaces/ns2/services", &svc)
            .status,
        201
    );
    let r = admin
        .request("DELETE", "/api/v1/namespaces/ns2/services/svc-99", &[], &[])
        .unwrap();
    assert_eq!(r.status, 200);
    set_events_reach(&hub, events + 2);

    // The hub's token, at the hub and at the cloud: the same page.
    let next = format!("/api/v1/services?limit=50&continue={token}");
    let (second, hub_token, hub_remaining) = page(&get(&dns, &next));
    let (second_direct, cloud_token, cloud_remaining) = page(&get(&dns_direct, &next));
    assert_eq!(second, second_direct);
    assert_eq!(
        (&hub_token, &hub_remaining),
        (&cloud_token, &cloud_remaining)
    );
    // The cloud's token, at the hub and at the cloud: the same last page.
    let last = format!("/api/v1/services?limit=100&continue={cloud_token}");
    let (third, end, _) = page(&get(&dns, &last));
    let (third_direct, end_direct, _) = page(&get(&dns_direct, &last));
    assert_eq!(third, third_direct);
    assert_eq!((end.as_str(), end_direct.as_str()), ("", ""));

    // Together: the list exactly as it stood at the first page's resourceVersion.
    let at = page(&get(
        &dns_direct,
        &format!("/api/v1/services?resourceVersion={rv}&resourceVersionMatch=Exact"),
    ))
    .0;
    let paged: Vec<_> = [first, second, third].concat();
    assert_eq!(paged.len(), SERVICES + 2);
    assert_eq!(paged, at);
    assert!(paged.iter().any(|(k, _)| k == "ns2/svc-99"));
    assert!(!paged.iter().any(|(k, _)| k == "ns2/svc-zzz"));
    assert_eq!(
        (count("lists_served"), count("passed_to_cloud")),
        (served + 3, passed),
        "every page from the set"
    );
}

#[test]
fn a_get_at_any_resource_version_comes_from_the_set_once_the_cloud_answered_that_credential_s_own()
{
    let s = cloud_with_services("");
    let hub = s.start_hub();
    let [kubelet, proxy, dns] = clients(&s, s.hub_addr());
    let [_, _, dns_direct] = clients(&s, s.cloud.addr);
    let admin = Client::new(s.cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    set_current(&hub, &kubelet);
    let object = "/api/v1/namespaces/ns1/services/svc-0";
    let any = format!("{object}?resourceVersion=0");
    // The GETs of the object the cloud was sent, by user.
    let cloud_gets = |user: &str| {
        s.cloud
            .audit()
            .iter()
            .filter(|e| e.method == "GET" && e.user == user && e.path.starts_with(object))
            .count()
    };
    let served = || {
        hub.status()["node_watch_cache"]["gets_served"]
            .as_u64()
            .unwrap()
    };
    let protobuf = [("Accept", "application/vnd.kubernetes.protobuf")];
    let dns_user = "system:serviceaccount:kube-system:coredns";

    // The credential's first GET is the cloud's: it is the cloud's word that it may.
    let first = get(&dns, &any);
    assert_eq!(first.status, 200);
    assert_eq!((cloud_gets(dns_user), served()), (1, 0));

    // The cloud changes the object; once the set has the change, the next GET comes from
    // the set and shows it, in either encoding, as the cloud itself answers it.
    let events = hub.status()["node_watch_cache"]["sets"][0]["events"]
        .as_u64()
        .unwrap();
    let mut svc: Value = serde_json::from_slice(&get(&admin, object).body).unwrap();
    svc["metadata"]["labels"] = json!({"changed": "yes"});
    assert_eq!(admin.send_json("PUT", object, &svc).status, 200);
    set_events_reach(&hub, events + 1);
    let from_set = get(&dns, &any);
    let direct = get(&dns_direct, &any);
    assert_eq!(from_set.status, 200);
    assert_eq!(decoded(false, &from_set.body), decoded(false, &direct.body));
    assert_eq!(
        decoded(false, &from_set.body)["metadata"]["labels"]["changed"],
        "yes"
    );
    let from_set = dns.request("GET", &any, &protobuf, &[]).unwrap();
    let direct = dns_direct.request("GET", &any, &protobuf, &[]).unwrap();
    assert_eq!((from_set.status, &from_set.body), (200, &direct.body));
    assert_eq!(
        cloud_gets(dns_user),
        1 + 2,
        "only the direct GETs reached the cloud"
    );
    assert_eq!(served(), 2);

    // Not for another credential, another object, or the newest state: the cloud's.
    let proxy_user = "system:serviceaccount:kube-system:kube-proxy";
    assert_eq!(get(&proxy, &any).status, 200);
    assert_eq!(cloud_gets(proxy_user), 1);
    assert_eq!(
        get(
            &dns,
            "/api/v1/namespaces/ns1/services/svc-2?resourceVersion=0"
        )
        .status,
        200
    );
    assert_eq!(get(&dns, object).status, 200);
    assert_eq!(cloud_gets(dns_user), 3 + 1, "the GET at the newest state");
    assert_eq!(served(), 2);
    // A credential the cloud refuses gets the cloud's refusal, never the object.
    let nobody = Client::new(s.hub_addr(), s.ca.cert_der(), Some(NOBODY_TOKEN), None);
    for _ in 0..2 {
        let r = get(&nobody, &any);
        assert_eq!(r.status, 403);
        assert!(!String::from_utf8_lossy(&r.body).contains("\"ports\""));
    }
    assert_eq!(served(), 2);
}

/// Every object recorded from kube-apiserver 1.32 and 1.36 in both encodings
/// (tests/fixtures/wire/kube-apiserver-*/dual-*), held by a set as its watch delivers it
/// (protobuf), is answered to a GET at resourceVersion=0 as the apiserver answered the
/// same GET: the protobuf bytes as recorded, the JSON equal to the recorded JSON, the
/// recorded Content-Type.
#[tokio::test]
async fn a_get_from_the_set_answers_every_recorded_object_as_kube_apiserver_did() {
    use http_body_util::BodyExt;
    use hub::{
        cache::objects::{Encoding, parse_object},
        proxy::request::RequestInfo,
        shared::{object, set::Set},
    };
    let wire = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wire");
    let mut answered = 0;
    // One version after the other: the JSON style is the cloud's, noted from its /version.
    for (version, minor) in [("1.32", "32"), ("1.36", "36")] {
        hub::convert::note_server_version(format!("{{\"minor\":\"{minor}\"}}").as_bytes());
        let dir = wire.join(format!("kube-apiserver-{version}"));
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("dual-") && n.ends_with("-protobuf"))
            .collect();
        names.sort();
        assert!(names.len() >= 21, "{version}: {names:?}");
        for pb_name in names {
            let json_name = pb_name.replace("-protobuf", "-json");
            let read = |name: &str, file: &str| std::fs::read(dir.join(name).join(file)).unwrap();
            let request: Value = serde_json::from_slice(&read(&pb_name, "request.json")).unwrap();
            let path = request["path"].as_str().unwrap();
            let info = RequestInfo::parse(&hyper::Method::GET, path, "resourceVersion=0");
            // A recorded list (dual-podlist) is not a GET of one object.
            if info.name.is_empty() {
                continue;
            }
            let set = Set::new(&info.gvr(), &info.resource);
            let item = parse_object(
                &info.resource,
                Encoding::Protobuf,
                &read(&pb_name, "response.body"),
            )
            .unwrap_or_else(|e| panic!("{version} {pb_name}: {e:?}"));
            let rv = item.rv;
            set.replace(vec![item], rv);
            for (name, accept) in [
                (&pb_name, "application/vnd.kubernetes.protobuf"),
                (&json_name, "application/json"),
            ] {
                let recorded: Value = serde_json::from_slice(&read(name, "response.json")).unwrap();
                let resp = object(&set, &info, "resourceVersion=0", accept)
                    .unwrap_or_else(|e| panic!("{version} {name}: {e}"));
                assert_eq!(resp.status().as_u16(), 200, "{version} {name}");
                assert_eq!(
                    resp.headers()["content-type"].to_str().unwrap(),
                    recorded["headers"]["Content-Type"].as_str().unwrap(),
                    "{version} {name}"
                );
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                let expected = read(name, "response.body");
                if accept.ends_with("protobuf") {
                    assert!(body[..] == expected[..], "{version} {name}: bytes differ");
                } else {
                    let got: Value = serde_json::from_slice(&body).unwrap();
                    let want: Value = serde_json::from_slice(&expected).unwrap();
                    assert_eq!(got, want, "{version} {name}");
                }
                answered += 1;
            }
        }
    }
    assert!(answered >= 80, "{answered} answers compared");
}

/// The check of a consistent streamed list, as kube-apiserver 1.36 answered it
/// (tests/fixtures/watch-cache-1.36): the stand-in answers it the same way — 200, no
/// object, the initial-events-end bookmark at once at its current resourceVersion.
#[test]
fn the_stand_in_answers_a_streamed_list_of_no_object_as_kube_apiserver_did() {
    let s = cloud_with_services("");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/watch-cache-1.36/streamed-list-of-no-object");
    let request: Value =
        serde_json::from_slice(&std::fs::read(dir.join("request.json")).unwrap()).unwrap();
    let recorded = std::fs::read(dir.join("response.body")).unwrap();
    let recorded: Vec<Value> = recorded
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let proxy = Client::new(s.cloud.addr, s.ca.cert_der(), Some(PROXY_TOKEN), None);
    let path = request["path"].as_str().unwrap();
    let started = std::time::Instant::now();
    let mut w = proxy.stream(path);
    assert_eq!(w.status, 200);
    let mut answered = Vec::new();
    while let Some(e) = w.next_event(Duration::from_secs(10)) {
        answered.push(e);
    }
    // The watch stays open until its timeout (3 s) and then ends, as recorded.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let shape = |events: &[Value]| -> Vec<(String, String, bool)> {
        events
            .iter()
            .map(|e| {
                let o = &e["object"];
                (
                    e["type"].as_str().unwrap().to_string(),
                    o["kind"].as_str().unwrap().to_string(),
                    o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true",
                )
            })
            .collect()
    };
    let first = shape(&answered[..1]);
    assert_eq!(first, shape(&recorded), "{answered:?}");
    let rv = answered[0]["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap();
    assert_eq!(rv, s.cloud.state.store.current_rv().to_string());
}

/// A request that impersonates is authorized by the cloud as the user it acts as: what it
/// is answered never counts for its token alone.
#[test]
fn a_request_that_impersonates_is_never_an_authorization_for_its_token_alone() {
    const IMPERSONATOR: &str = "impersonator-token";
    let s = cloud_with_services("");
    {
        let mut auth = s.cloud.state.auth.write().unwrap();
        auth.add_token(IMPERSONATOR, "impersonator", &[]);
        auth.allow(Rule::new(
            "impersonator",
            &["impersonate"],
            &["users"],
            &["*"],
        ));
    }
    let hub = s.start_hub();
    let [kubelet, ..] = clients(&s, s.hub_addr());
    assert_eq!(
        get(&kubelet, "/api/v1/services?resourceVersion=0").status,
        200
    );
    set_current(&hub, &kubelet);
    let client = Client::new(s.hub_addr(), s.ca.cert_der(), Some(IMPERSONATOR), None);
    let path = "/api/v1/services?resourceVersion=0";
    let as_coredns = [
        ("Accept", "application/json"),
        (
            "Impersonate-User",
            "system:serviceaccount:kube-system:coredns",
        ),
    ];
    let r = client.request("GET", path, &as_coredns, &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(names(&r).len(), SERVICES);
    // The token alone may not list services: the cloud says so, not the memo of the
    // impersonating request.
    let alone = get(&client, path);
    let body = String::from_utf8_lossy(&alone.body);
    assert_eq!(alone.status, 403, "{}", &body[..body.len().min(300)]);
    assert!(!body.contains("svc-"));
}
