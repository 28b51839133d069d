//! Issue 7 (deliverable 5): the etcd fixture runs real members — one, or three that keep
//! serving with one killed and take it back after a restart.
use hub_tests::etcd::EtcdCluster;

#[test]
fn single_member_serves_put_and_get() {
    let c = EtcdCluster::start(1);
    let ep = c.endpoints();
    c.etcdctl(&ep, &["put", "/registry/pods/default/p1", "{}"])
        .unwrap();
    assert_eq!(
        c.etcdctl(
            &ep,
            &["get", "--print-value-only", "/registry/pods/default/p1"]
        )
        .unwrap()
        .trim(),
        "{}"
    );
}

#[test]
fn three_members_survive_one_killed_and_recover_it() {
    let mut c = EtcdCluster::start(3);
    let all = c.endpoints();
    c.etcdctl(&all, &["put", "k1", "v1"]).unwrap();
    c.kill_member(0);
    let rest = all[1..].to_vec();
    // The survivors may need a leader election first; then writes are acknowledged again
    // and none is lost.
    hub_tests::wait_for(
        "a write acknowledged with one member down",
        std::time::Duration::from_secs(20),
        || c.etcdctl(&rest, &["put", "k2", "v2"]).ok(),
    );
    assert_eq!(
        c.etcdctl(&rest, &["get", "--print-value-only", "k1"])
            .unwrap()
            .trim(),
        "v1"
    );
    c.start_member(0);
    c.wait_healthy(0);
    let first = vec![all[0].clone()];
    let got = hub_tests::wait_for(
        "the restarted member to catch up",
        std::time::Duration::from_secs(10),
        || {
            let v = c
                .etcdctl(
                    &first,
                    &["get", "--print-value-only", "--consistency=s", "k2"],
                )
                .ok()?;
            (v.trim() == "v2").then_some(v)
        },
    );
    assert_eq!(got.trim(), "v2");
}
