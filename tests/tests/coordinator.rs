//! Issue 7: coordinator storage against real etcd members (Debian's etcd-server). Every
//! effect is read back with etcdctl, independently of the hub's own client.
use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use base64::Engine;
use hub::coordinator::{
    owned::Owned,
    storage::{self, Limits, Object, Outcome, Resource, Step, Storage, StorageError, rv_key},
};
use hub_tests::{
    TempDir,
    apiserver::tls::TestCa,
    etcd::{EtcdCluster, MAX_REQUEST_BYTES, MAX_TXN_OPS},
};
use serde_json::{Value, json};

const LIMITS: Limits = Limits {
    max_txn_ops: MAX_TXN_OPS,
    max_request_bytes: MAX_REQUEST_BYTES,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn pods() -> Resource {
    Resource {
        group: String::new(),
        resource: "pods".into(),
    }
}

fn pod(ns: &str, name: &str, rv: u64) -> Object {
    Object {
        namespace: Some(ns.into()),
        name: name.into(),
        rv,
        value: serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv.to_string()}}))
        .unwrap(),
    }
}

async fn open(etcd: &EtcdCluster, state: &Path, limits: Limits) -> Storage {
    let client = storage::connect(&etcd.endpoints(), None, Duration::from_secs(5))
        .await
        .unwrap();
    Storage::open(&client, "/registry", Owned::open(state).unwrap(), limits)
        .await
        .unwrap()
}

/// What etcd holds under `prefix`, read with etcdctl: (revision, key -> value).
fn etcd_dump(etcd: &EtcdCluster, prefix: &str) -> (i64, BTreeMap<String, String>) {
    let out = etcd
        .etcdctl(
            &etcd.endpoints(),
            &["get", prefix, "--prefix", "-w", "json"],
        )
        .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let b64 = |s: &Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(s.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let kvs = v["kvs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|kv| (b64(&kv["key"]), b64(&kv["value"])))
                .collect()
        })
        .unwrap_or_default();
    (v["header"]["revision"].as_i64().unwrap(), kvs)
}

fn revision(etcd: &EtcdCluster) -> i64 {
    etcd_dump(etcd, "/nothing-here").0
}

#[test]
fn each_operation_is_one_txn_with_the_effect_etcd_shows() {
    let etcd = EtcdCluster::start(1);
    let dir = TempDir::new("co");
    let rt = runtime();
    let s = rt.block_on(open(&etcd, dir.path(), LIMITS));
    let step = |before: i64, what: &str, by: i64| {
        let now = revision(&etcd);
        assert_eq!(
            now - before,
            by,
            "{what}: revision moved by {}",
            now - before
        );
        now
    };
    let mut rev = revision(&etcd);

    // Create: the object under kube-apiserver's key, its resourceVersion beside it.
    assert_eq!(
        rt.block_on(s.create("kubelet", &pods(), &pod("ns1", "a", 10)))
            .unwrap(),
        Outcome::Written
    );
    rev = step(rev, "create", 1);
    let (_, kv) = etcd_dump(&etcd, "/registry/pods/ns1/a");
    let stored: Value = serde_json::from_str(&kv["/registry/pods/ns1/a"]).unwrap();
    assert_eq!(
        (stored["kind"].as_str(), stored["apiVersion"].as_str()),
        (Some("Pod"), Some("v1"))
    );
    assert_eq!(
        etcd_dump(&etcd, &rv_key("/registry/pods/ns1/a"))
            .1
            .values()
            .next()
            .unwrap(),
        "00000000000000000010"
    );
    assert!(matches!(
        rt.block_on(s.create("kubelet", &pods(), &pod("ns1", "a", 11))),
        Err(StorageError::Exists(_))
    ));
    rev = step(rev, "create of an existing object", 0);

    // Update: fresher wins, equal is a no-op, older is a conflict.
    assert_eq!(
        rt.block_on(s.update("kubelet", &pods(), &pod("ns1", "a", 12)))
            .unwrap(),
        Outcome::Written
    );
    rev = step(rev, "fresher update", 1);
    assert_eq!(
        rt.block_on(s.update("kubelet", &pods(), &pod("ns1", "a", 12)))
            .unwrap(),
        Outcome::Unchanged
    );
    rev = step(rev, "equal update", 0);
    assert!(matches!(
        rt.block_on(s.update("kubelet", &pods(), &pod("ns1", "a", 11))),
        Err(StorageError::Conflict {
            stored: 12,
            offered: 11,
            ..
        })
    ));
    rev = step(rev, "older update", 0);
    let (rv, value) = rt
        .block_on(s.get(&pods(), Some("ns1"), "a"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            rv,
            serde_json::from_slice::<Value>(&value).unwrap()["metadata"]["resourceVersion"]
                .as_str()
        ),
        (12, Some("12"))
    );

    // Services and nodes use kube-apiserver's historical prefixes.
    let services = Resource {
        group: String::new(),
        resource: "services".into(),
    };
    let nodes = Resource {
        group: String::new(),
        resource: "nodes".into(),
    };
    rt.block_on(s.update("kube-proxy", &services, &pod("default", "web", 3)))
        .unwrap();
    rt.block_on(s.update(
        "kubelet",
        &nodes,
        &Object {
            namespace: None,
            ..pod("", "edge-1", 4)
        },
    ))
    .unwrap();
    rev = step(rev, "two updates", 2);
    let keys: Vec<String> = etcd_dump(&etcd, "/registry/").1.into_keys().collect();
    assert!(
        keys.contains(&"/registry/services/specs/default/web".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"/registry/minions/edge-1".to_string()),
        "{keys:?}"
    );

    // ReplaceComponentList: one Txn; ns1's list does not touch ns10 (prefix trap).
    let list = [
        pod("ns1", "a", 12),
        pod("ns1", "b", 13),
        pod("ns1", "c", 14),
    ];
    rt.block_on(s.update("kubelet", &pods(), &pod("ns10", "z", 5)))
        .unwrap();
    rev = step(rev, "update in ns10", 1);
    let r = rt
        .block_on(s.replace_component_list("kubelet", &pods(), Some("ns1"), 20, &list))
        .unwrap();
    assert_eq!((r.written, r.unchanged, r.deleted), (2, 1, 0));
    rev = step(rev, "replace (3 objects)", 1);
    let r = rt
        .block_on(s.replace_component_list("kubelet", &pods(), Some("ns1"), 30, &list[1..]))
        .unwrap();
    assert_eq!((r.written, r.unchanged, r.deleted), (0, 2, 1));
    rev = step(rev, "replace (one vanished)", 1);
    let in_etcd: Vec<String> = etcd_dump(&etcd, "/registry/pods/").1.into_keys().collect();
    assert_eq!(
        in_etcd,
        [
            "/registry/pods/ns1/b",
            "/registry/pods/ns1/c",
            "/registry/pods/ns10/z"
        ]
    );
    let owned = s.list_keys_of_component("kubelet").unwrap();
    assert!(
        owned.contains(&"/registry/pods/ns10/z".to_string())
            && !owned.contains(&"/registry/pods/ns1/a".to_string()),
        "{owned:?}"
    );
    // The deleted object stays deleted for an older write, comes back for a newer one.
    assert!(matches!(
        rt.block_on(s.update("kubelet", &pods(), &pod("ns1", "a", 25))),
        Err(StorageError::Conflict { .. })
    ));
    assert_eq!(
        rt.block_on(s.update("kubelet", &pods(), &pod("ns1", "a", 31)))
            .unwrap(),
        Outcome::Written
    );
    rev = step(rev, "stale then fresh re-create", 1);

    // Delete: as of a resourceVersion; a newer stored state stays.
    assert!(matches!(
        rt.block_on(s.delete("kubelet", &pods(), Some("ns1"), "a", 30))
            .unwrap(),
        Outcome::Stale { stored: 31 }
    ));
    assert_eq!(
        rt.block_on(s.delete("kubelet", &pods(), Some("ns1"), "a", 32))
            .unwrap(),
        Outcome::Written
    );
    rev = step(rev, "delete", 1);
    assert!(
        rt.block_on(s.get(&pods(), Some("ns1"), "a"))
            .unwrap()
            .is_none()
    );
    assert_eq!(rt.block_on(s.list(&pods(), Some("ns1"))).unwrap().len(), 2);
    assert_eq!(rt.block_on(s.list(&pods(), None)).unwrap().len(), 3);

    // DeleteComponentResources: everything kube-proxy owns, one Txn.
    assert_eq!(
        rt.block_on(s.delete_component_resources("kube-proxy"))
            .unwrap(),
        1
    );
    step(rev, "delete component resources", 1);
    assert!(etcd_dump(&etcd, "/registry/services/").1.is_empty());
    assert!(s.list_keys_of_component("kube-proxy").unwrap().is_empty());
}

#[test]
fn limits_fail_cleanly_and_bad_names_and_unknown_kinds() {
    let etcd = EtcdCluster::start(1);
    let dir = TempDir::new("co");
    let rt = runtime();
    let small = Limits {
        max_txn_ops: 5,
        max_request_bytes: 4096,
    };
    let s = rt.block_on(open(&etcd, dir.path(), small));
    let before = revision(&etcd);
    // A set larger than one Txn may hold goes in several: 5 operations less the 2 a
    // nested Txn needs leave 3 objects a Txn, so 6 objects take two.
    let many: Vec<Object> = (0..6).map(|i| pod("d", &format!("p{i}"), 1)).collect();
    let done = rt
        .block_on(s.replace_component_list("kubelet", &pods(), Some("d"), 1, &many))
        .unwrap();
    assert_eq!(done.written, 6);
    assert_eq!(revision(&etcd), before + 2, "two Txns");
    assert_eq!(s.list_keys_of_component("kubelet").unwrap().len(), 6);
    rt.block_on(s.delete_component_resources("kubelet"))
        .unwrap();
    let before = revision(&etcd);
    // One object larger than a request may be cannot be split: refused before sending.
    let big = Object {
        value: vec![b' '; 5000],
        ..pod("d", "big", 1)
    };
    assert!(matches!(
        rt.block_on(s.update("kubelet", &pods(), &big)),
        Err(StorageError::TooLarge { .. })
    ));
    for bad in ["a/b", "..", ".", "nul\0byte", ""] {
        let e = rt
            .block_on(s.update("kubelet", &pods(), &pod("d", bad, 1)))
            .unwrap_err();
        assert!(matches!(e, StorageError::Key(_)), "{bad:?}: {e}");
        let e = rt
            .block_on(s.update("kubelet", &pods(), &pod(bad, "n", 1)))
            .unwrap_err();
        assert!(matches!(e, StorageError::Key(_)), "namespace {bad:?}: {e}");
    }
    assert_eq!(revision(&etcd), before, "nothing was written");
    assert!(s.list_keys_of_component("kubelet").unwrap().is_empty());

    // A kind the hub does not know (a CRD) round-trips as unstructured JSON.
    let widgets = Resource {
        group: "example.hub.dev".into(),
        resource: "widgets".into(),
    };
    let w = json!({"apiVersion": "example.hub.dev/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "d", "resourceVersion": "7"},
        "spec": {"size": 3, "tags": ["a", "b"], "nested": {"deep": true}}});
    let obj = Object {
        namespace: Some("d".into()),
        name: "w1".into(),
        rv: 7,
        value: serde_json::to_vec(&w).unwrap(),
    };
    rt.block_on(s.update("operator", &widgets, &obj)).unwrap();
    let (_, kv) = etcd_dump(&etcd, "/registry/example.hub.dev/widgets/d/w1");
    assert_eq!(
        serde_json::from_str::<Value>(&kv["/registry/example.hub.dev/widgets/d/w1"]).unwrap(),
        w
    );
    let (rv, back) = rt
        .block_on(s.get(&widgets, Some("d"), "w1"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (rv, serde_json::from_slice::<Value>(&back).unwrap()),
        (7, w)
    );
}

#[test]
fn two_writers_racing_leave_the_freshest_object() {
    let etcd = EtcdCluster::start(1);
    let (d1, d2) = (TempDir::new("co"), TempDir::new("co"));
    let rt = runtime();
    let a = Arc::new(rt.block_on(open(&etcd, d1.path(), LIMITS)));
    let b = Arc::new(rt.block_on(open(&etcd, d2.path(), LIMITS)));
    const KEYS: u64 = 8;
    const OPS: u64 = 1500;
    // Deterministic pseudo-random resourceVersions per writer; both race on the same keys.
    let writer = |s: Arc<Storage>, seed: u64| async move {
        let mut x = seed;
        let mut offered = BTreeMap::<u64, u64>::new();
        for _ in 0..OPS {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = (x >> 40) % KEYS;
            let rv = 1 + (x >> 20) % 100_000;
            let _ = s
                .update("kubelet", &pods(), &pod("race", &format!("k{key}"), rv))
                .await;
            let e = offered.entry(key).or_default();
            *e = (*e).max(rv);
        }
        offered
    };
    let (oa, ob) = rt.block_on(async {
        let (x, y) = tokio::join!(
            tokio::spawn(writer(a.clone(), 1)),
            tokio::spawn(writer(b.clone(), 2))
        );
        (x.unwrap(), y.unwrap())
    });
    let (_, kv) = etcd_dump(&etcd, "/registry/pods/race/");
    assert_eq!(kv.len() as u64, KEYS);
    for k in 0..KEYS {
        let freshest = oa
            .get(&k)
            .copied()
            .unwrap_or(0)
            .max(ob.get(&k).copied().unwrap_or(0));
        let stored: Value =
            serde_json::from_str(&kv[&format!("/registry/pods/race/k{k}")]).unwrap();
        assert_eq!(
            stored["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
            freshest,
            "key k{k}"
        );
    }
    eprintln!(
        "{} racing updates on {KEYS} keys: etcd holds the freshest of each",
        2 * OPS
    );
}

/// Keys under /registry/ that no component of this hub owns (orphans).
fn orphans(etcd: &EtcdCluster, s: &Storage, components: &[&str]) -> Vec<String> {
    let owned: Vec<String> = components
        .iter()
        .flat_map(|c| s.list_keys_of_component(c).unwrap())
        .collect();
    etcd_dump(etcd, "/registry/")
        .1
        .into_keys()
        .filter(|k| !owned.contains(k))
        .collect()
}

#[test]
fn a_crash_at_any_step_is_reconciled_at_the_next_start() {
    let etcd = EtcdCluster::start(1);
    let dir = TempDir::new("co");
    let rt = runtime();
    let mut round = 0;
    for step in [Step::AfterIntent, Step::AfterTxn] {
        for op in ["create", "update", "delete", "replace"] {
            round += 1;
            let ns = format!("crash{round}");
            let s = rt.block_on(open(&etcd, dir.path(), LIMITS));
            // Before: a, b owned in this namespace.
            rt.block_on(s.replace_component_list(
                "kubelet",
                &pods(),
                Some(&ns),
                10,
                &[pod(&ns, "a", 5), pod(&ns, "b", 6)],
            ))
            .unwrap();
            s.fail_next_at(Some(step));
            let r = match op {
                "create" => rt
                    .block_on(s.create("kubelet", &pods(), &pod(&ns, "c", 7)))
                    .map(|_| ()),
                "update" => rt
                    .block_on(s.update("kubelet", &pods(), &pod(&ns, "a", 8)))
                    .map(|_| ()),
                "delete" => rt
                    .block_on(s.delete("kubelet", &pods(), Some(&ns), "b", 11))
                    .map(|_| ()),
                _ => rt
                    .block_on(s.replace_component_list(
                        "kubelet",
                        &pods(),
                        Some(&ns),
                        20,
                        &[pod(&ns, "a", 5), pod(&ns, "c", 12)],
                    ))
                    .map(|_| ()),
            };
            assert!(
                matches!(r, Err(StorageError::Injected(_))),
                "{op} at {step:?}: {r:?}"
            );
            drop(s); // the crash
            let s = rt.block_on(open(&etcd, dir.path(), LIMITS)); // the restart reconciles
            let what = format!("{op} interrupted at {step:?}");
            assert!(
                orphans(&etcd, &s, &["kubelet"]).is_empty(),
                "{what}: orphans {:?}",
                orphans(&etcd, &s, &["kubelet"])
            );
            let present: Vec<String> = etcd_dump(&etcd, &format!("/registry/pods/{ns}/"))
                .1
                .into_keys()
                .collect();
            let key = |n: &str| format!("/registry/pods/{ns}/{n}");
            if op == "delete" {
                assert!(
                    !present.contains(&key("b")),
                    "{what}: the delete of b was lost: {present:?}"
                );
            }
            if op == "replace" {
                // The old set {a, b} whole, or the new {a, c}: never half of each.
                let (old, new) = (vec![key("a"), key("b")], vec![key("a"), key("c")]);
                assert!(
                    present == old || present == new,
                    "{what}: neither set whole: {present:?}"
                );
            }
            let owned = s.list_keys_of_component("kubelet").unwrap();
            for k in &present {
                assert!(owned.contains(k), "{what}: {k} in etcd but not owned");
            }
            for k in owned.iter().filter(|k| k.contains(&format!("/{ns}/"))) {
                assert!(
                    present.contains(k),
                    "{what}: owns {k}, which etcd does not hold"
                );
            }
        }
    }
}

#[test]
fn a_three_member_cluster_loses_no_acknowledged_write_when_a_member_dies() {
    let mut etcd = EtcdCluster::start(3);
    let dir = TempDir::new("co");
    let rt = runtime();
    let s = rt.block_on(open(&etcd, dir.path(), LIMITS));
    let mut acked = Vec::new();
    let mut failed = 0;
    for i in 0..300u64 {
        if i == 100 {
            etcd.kill_member(0);
        }
        match rt.block_on(s.update("kubelet", &pods(), &pod("ha", &format!("p{i}"), i + 1))) {
            Ok(_) => acked.push(i),
            Err(e) => {
                failed += 1;
                eprintln!("update {i} failed during failover: {e}");
            }
        }
    }
    assert!(
        acked.len() >= 290,
        "operations continue: {} of 300 acknowledged",
        acked.len()
    );
    let survivors = etcd.endpoints()[1..].to_vec();
    let out = etcd
        .etcdctl(
            &survivors,
            &["get", "/registry/pods/ha/", "--prefix", "--keys-only"],
        )
        .unwrap();
    for i in &acked {
        assert!(
            out.lines().any(|l| l == format!("/registry/pods/ha/p{i}")),
            "acknowledged write p{i} lost"
        );
    }
    eprintln!(
        "3 members, one killed at op 100: {} acknowledged, {failed} failed, none lost",
        acked.len()
    );
}

#[test]
fn tls_with_a_per_node_certificate_and_nothing_else() {
    let ca = TestCa::new("coordinator-ca");
    let etcd = EtcdCluster::start_tls(&ca);
    let dir = TempDir::new("co");
    let node = ca
        .client("edge-1", None)
        .write(dir.path(), "edge-1")
        .unwrap();
    let foreign = TestCa::new("other-ca")
        .client("edge-1", None)
        .write(dir.path(), "foreign")
        .unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let rt = runtime();
    let try_with = |identity: Option<&(std::path::PathBuf, std::path::PathBuf)>| {
        rt.block_on(async {
            let tls =
                storage::tls_options(&ca_file, identity.map(|(c, k)| (c.as_path(), k.as_path())))?;
            let client =
                storage::connect(&etcd.endpoints(), Some(tls), Duration::from_secs(3)).await?;
            let state = dir.path().join(format!("state-{}", identity.is_some()));
            let s = Storage::open(&client, "/registry", Owned::open(&state)?, LIMITS).await?;
            s.update("kubelet", &pods(), &pod("tls", "p", 1)).await
        })
    };
    assert_eq!(try_with(Some(&node)).unwrap(), Outcome::Written);
    assert!(
        try_with(None).is_err(),
        "no client certificate must be refused"
    );
    assert!(
        try_with(Some(&foreign)).is_err(),
        "a certificate from another CA must be refused"
    );
    let (_, kv) = etcd_dump(&etcd, "/registry/pods/tls/");
    assert_eq!(kv.len(), 1);
}

#[test]
fn an_unreachable_etcd_fails_fast_and_is_reconnected() {
    let mut etcd = EtcdCluster::start(1);
    let dir = TempDir::new("co");
    let rt = runtime();
    let s = rt.block_on(open(&etcd, dir.path(), LIMITS));
    rt.block_on(s.update("kubelet", &pods(), &pod("re", "a", 1)))
        .unwrap();
    etcd.kill_member(0);
    // Nothing is queued in memory: each operation fails within its timeout.
    for i in 0..5 {
        let t = std::time::Instant::now();
        assert!(
            rt.block_on(s.update("kubelet", &pods(), &pod("re", &format!("down{i}"), 1)))
                .is_err()
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "failed after {:?}",
            t.elapsed()
        );
    }
    etcd.start_member(0);
    etcd.wait_healthy(0);
    let back = hub_tests::wait_for("the client to reconnect", Duration::from_secs(20), || {
        rt.block_on(s.update("kubelet", &pods(), &pod("re", "b", 2)))
            .ok()
    });
    assert_eq!(back, Outcome::Written);
    assert_eq!(
        s.unfinished().unwrap(),
        0,
        "the failed operations' intents were reconciled"
    );
    assert!(orphans(&etcd, &s, &["kubelet"]).is_empty());
    let (_, kv) = etcd_dump(&etcd, "/registry/pods/re/");
    assert_eq!(
        kv.keys().cloned().collect::<Vec<_>>(),
        ["/registry/pods/re/a", "/registry/pods/re/b"]
    );
}

#[test]
fn one_leader_per_pool_and_a_new_one_within_the_lease_ttl() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use hub::coordinator::election::Election;
    use hub_tests::wait_for;
    let etcd = EtcdCluster::start(1);
    let rt = runtime();
    let ttl = Duration::from_secs(3);
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut hubs = Vec::new();
    for i in 0..3 {
        let client = rt
            .block_on(storage::connect(
                &etcd.endpoints(),
                None,
                Duration::from_secs(5),
            ))
            .unwrap();
        let e = Arc::new(Election::new(client, "pool-a", &format!("edge-{i}"), ttl));
        let eligible = Arc::new(AtomicBool::new(true));
        let flag = eligible.clone();
        let task = rt.spawn(
            e.clone()
                .run(Arc::new(move || flag.load(Ordering::SeqCst)), stop.clone()),
        );
        hubs.push((e, eligible, task));
    }
    let leaders = |hubs: &[(Arc<Election>, Arc<AtomicBool>, tokio::task::JoinHandle<()>)]| {
        hubs.iter()
            .enumerate()
            .filter(|(_, h)| h.0.is_leader())
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let first = wait_for("a leader", Duration::from_secs(10), || {
        let l = leaders(&hubs);
        (l.len() == 1).then(|| l[0])
    });
    for (e, _, _) in &hubs {
        wait_for(
            "every hub to see the leader",
            Duration::from_secs(5),
            || (e.holder() == format!("edge-{first}")).then_some(()),
        );
    }

    // A hub that stops being eligible (its cloud or coordinator unhealthy) steps down at
    // once, and another takes over.
    hubs[first].1.store(false, Ordering::SeqCst);
    let t = std::time::Instant::now();
    let second = wait_for(
        "a new leader after stepping down",
        Duration::from_secs(10),
        || {
            let l = leaders(&hubs);
            (l.len() == 1 && l[0] != first).then(|| l[0])
        },
    );
    eprintln!("leader stepped down: new leader after {:?}", t.elapsed());

    // The leader dies without resigning (its task ends, keep-alives stop): the lease runs
    // out and another hub leads within the TTL (plus one claim period).
    hubs[second].2.abort();
    let t = std::time::Instant::now();
    let third = wait_for(
        "a new leader after the leader died",
        Duration::from_secs(15),
        || {
            let l: Vec<usize> = leaders(&hubs)
                .into_iter()
                .filter(|i| *i != second)
                .collect();
            (l.len() == 1).then(|| l[0])
        },
    );
    let took = t.elapsed();
    eprintln!("leader died: new leader edge-{third} after {took:?} (TTL {ttl:?})");
    assert!(
        took <= ttl + ttl / 3 + Duration::from_secs(1),
        "took {took:?}"
    );
    assert_ne!(third, second);
}

/// An etcd started with its defaults (128 operations, 1.5 MiB a request) takes a 2000-pod
/// set in chunks the hub learns from etcd's own refusals; a replace interrupted after its
/// first chunk leaves the old set whole and nothing orphaned, and finishes when redone.
#[test]
fn a_default_limits_etcd_takes_big_sets_in_chunks_and_an_interrupted_replace_is_safe() {
    let etcd = EtcdCluster::start_default_limits(1);
    let dir = TempDir::new("co");
    let rt = runtime();
    // The hub's configured hints are deploy/base/coordinator-etcd.yaml's, far above etcd's.
    let s = rt.block_on(open(&etcd, dir.path(), LIMITS));
    let set = |range: std::ops::Range<usize>, rv: u64| -> Vec<Object> {
        range
            .map(|i| {
                let mut p = pod("big", &format!("p{i:04}"), rv);
                // ~1 KiB each, as a real pod: 2000 of them are over 1.5 MiB.
                p.value.extend(std::iter::repeat_n(b' ', 1024));
                p
            })
            .collect()
    };
    let old = set(0..2000, 1);
    let before = revision(&etcd);
    let done = rt
        .block_on(s.replace_component_list("kubelet", &pods(), Some("big"), 1, &old))
        .unwrap();
    assert_eq!(done.written, 2000);
    let learned = s.limits();
    assert_eq!(learned.max_txn_ops, 128, "learned from etcd's refusal");
    let txns = revision(&etcd) - before;
    assert!(txns >= 16, "2000 objects at 126 a Txn: {txns} Txns");
    let keys = |etcd: &EtcdCluster| -> Vec<String> {
        etcd_dump(etcd, "/registry/pods/big/")
            .1
            .into_keys()
            .collect()
    };
    assert_eq!(keys(&etcd).len(), 2000);

    // The new set: half the old names at a newer version, half new names. Interrupted
    // after its first Txn, as a crash would.
    let new = set(1000..3000, 2);
    s.fail_next_at(Some(Step::AfterFirstChunk));
    let r = rt.block_on(s.replace_component_list("kubelet", &pods(), Some("big"), 2, &new));
    assert!(matches!(r, Err(StorageError::Injected(_))), "{r:?}");
    drop(s); // the crash
    let s = rt.block_on(open(&etcd, dir.path(), LIMITS)); // the restart reconciles
    let held = keys(&etcd);
    for o in &old {
        let k = format!("/registry/pods/big/{}", o.name);
        assert!(held.contains(&k), "the old set lost {k}");
    }
    assert!(
        orphans(&etcd, &s, &["kubelet"]).is_empty(),
        "orphans: {:?}",
        orphans(&etcd, &s, &["kubelet"])
    );
    assert_eq!(s.unfinished().unwrap(), 0);

    // Redone, the replace leaves exactly the new set.
    rt.block_on(s.replace_component_list("kubelet", &pods(), Some("big"), 2, &new))
        .unwrap();
    let want: Vec<String> = new
        .iter()
        .map(|o| format!("/registry/pods/big/{}", o.name))
        .collect();
    assert_eq!(keys(&etcd), want);
    assert!(orphans(&etcd, &s, &["kubelet"]).is_empty());

    // 200 objects of 20 KiB: 126 of them are over 1.5 MiB, so the size is learned too.
    let wide: Vec<Object> = (0..200)
        .map(|i| {
            let mut p = pod("wide", &format!("w{i:03}"), 3);
            p.value.extend(std::iter::repeat_n(b' ', 20 * 1024));
            p
        })
        .collect();
    let done = rt
        .block_on(s.replace_component_list("kubelet", &pods(), Some("wide"), 3, &wide))
        .unwrap();
    assert_eq!(done.written, 200);
    assert_eq!(
        s.limits().max_request_bytes,
        storage::ETCD_DEFAULT_LIMITS.max_request_bytes
    );
    assert_eq!(etcd_dump(&etcd, "/registry/pods/wide/").1.len(), 200);
}

/// The ownership store on a disk that fills up: its writes fail (nothing in etcd is
/// touched), and once there is room again it works without a restart — redb refuses
/// every transaction after an I/O error until the database is opened again.
#[test]
fn the_ownership_store_recovers_from_a_full_disk() {
    use std::process::Command;
    if !hub_tests::privileged::check("the_ownership_store_recovers_from_a_full_disk") {
        return;
    }
    use hub::coordinator::owned::Intent;
    let dir = TempDir::new("owned");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(dir.path().to_path_buf());
    let owned = Owned::open(&dir.path().join("state")).unwrap();
    let intent = |n: usize| Intent {
        component: "kubelet".into(),
        put: (0..n)
            .map(|i| {
                (
                    format!("/registry/pods/full/p{i:05}-{}", "x".repeat(200)),
                    1,
                )
            })
            .collect(),
        delete: vec![],
    };
    let id = owned.begin(&intent(10)).unwrap();
    owned.finish(id, "kubelet", &intent(10).put, &[]).unwrap();
    // Fill the disk; an intent of 1000 keys (~250 KiB) no longer fits.
    let filler = dir.path().join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    for _ in 0..64 {
        if std::io::Write::write_all(&mut f, &chunk).is_err() {
            break;
        }
    }
    drop(f);
    let mut failed = false;
    for _ in 0..5 {
        failed |= owned.begin(&intent(1000)).is_err();
    }
    assert!(failed, "a full disk refuses the intent");
    std::fs::remove_file(&filler).unwrap();
    let id = owned
        .begin(&intent(1000))
        .expect("with room again, the store works without a restart");
    owned.finish(id, "kubelet", &intent(1000).put, &[]).unwrap();
    assert_eq!(owned.keys("kubelet", "").unwrap().len(), 1000);
}
