//! Issue 4: the API stand-in behaves like kube-apiserver for what the hub relies on,
//! judged by a raw HTTPS client, kubectl and the Python kubernetes client.
use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hub_tests::{
    TempDir,
    apiserver::{
        ADMIN_TOKEN, Options, StandIn, auth::Rule, client::Client, faults::FaultSettings, seed,
    },
    kubectl, kubectl_ok, wait_for,
};
use serde_json::{Value, json};

fn standin(options: Options) -> StandIn {
    StandIn::start("127.0.0.1:0".parse::<SocketAddr>().unwrap(), options).expect("stand-in")
}

fn admin(s: &StandIn) -> Client {
    Client::new(s.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None)
}

fn kubectl_stdin(kc: &std::path::Path, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kubectl_works_over_tls() {
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 2, 3);
    let dir = TempDir::new("kc");
    let kc = dir.path().join("kubeconfig");
    s.write_kubeconfig(&kc, None).unwrap();

    let pods = kubectl_ok(&kc, &["get", "pods", "-A", "-o", "wide"]);
    assert_eq!(pods.lines().count(), 7, "{pods}");
    assert!(
        pods.contains("pod-1-2") && pods.contains("node-1"),
        "{pods}"
    );
    let json: Value = serde_json::from_str(&kubectl_ok(
        &kc,
        &["get", "pods", "-l", "app=app-1", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(json["items"].as_array().unwrap().len(), 2);

    let res = kubectl_ok(&kc, &["api-resources"]);
    for r in [
        "pods",
        "leases",
        "endpointslices",
        "certificatesigningrequests",
        "widgets",
    ] {
        assert!(res.contains(r), "api-resources lacks {r}:\n{res}");
    }
    // kubectl read all of that from aggregated discovery, as against kube-apiserver 1.30+.
    let agg = admin(&s)
        .request(
            "GET",
            "/apis",
            &[(
                "Accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
            )],
            &[],
        )
        .unwrap();
    assert_eq!(
        agg.header("content-type"),
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    );
    let groups = agg.json();
    let leases = groups["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["metadata"]["name"] == "coordination.k8s.io")
        .expect("the coordination group");
    assert_eq!(leases["versions"][0]["resources"][0]["resource"], "leases");
    assert_eq!(leases["versions"][0]["resources"][0]["scope"], "Namespaced");
    let versions = kubectl_ok(&kc, &["api-versions"]);
    assert!(versions.contains("coordination.k8s.io/v1") && versions.lines().any(|l| l == "v1"));
    assert_eq!(
        kubectl_ok(&kc, &["auth", "can-i", "list", "pods"]).trim(),
        "yes"
    );

    // apply twice (create, then a strategic-merge update), patch three ways, delete.
    let cm = |v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: \"{v}\"\n")
    };
    assert!(kubectl_stdin(&kc, &["apply", "-f", "-"], &cm("1")).contains("created"));
    assert!(kubectl_stdin(&kc, &["apply", "-f", "-"], &cm("2")).contains("configured"));
    kubectl_ok(
        &kc,
        &["patch", "configmap", "demo", "-p", r#"{"data":{"b":"2"}}"#],
    );
    kubectl_ok(
        &kc,
        &[
            "patch",
            "configmap",
            "demo",
            "--type=merge",
            "-p",
            r#"{"data":{"c":"3"}}"#,
        ],
    );
    kubectl_ok(
        &kc,
        &[
            "patch",
            "configmap",
            "demo",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/data/b"}]"#,
        ],
    );
    let data = kubectl_ok(&kc, &["get", "configmap", "demo", "-o", "jsonpath={.data}"]);
    assert_eq!(
        serde_json::from_str::<Value>(&data).unwrap(),
        json!({"a": "2", "c": "3"})
    );
    kubectl_ok(&kc, &["delete", "configmap", "demo"]);
    let (ok, _, err) = kubectl(&kc, &["get", "configmap", "demo"]);
    assert!(!ok && err.contains("NotFound"), "{err}");

    // logs, and exec with stdin over the websocket protocol and over SPDY/3.1.
    let logs = kubectl_ok(&kc, &["logs", "pod-0-0"]);
    assert_eq!(logs.lines().next(), Some("pod-0-0/main line 1"));
    assert_eq!(
        kubectl_stdin(&kc, &["exec", "-i", "pod-0-0", "--", "cat"], "hello exec\n"),
        "hello exec\n"
    );
    let spdy = Command::new("kubectl")
        .args(["exec", "pod-0-0", "--", "echo", "over", "spdy"])
        .env("KUBECONFIG", &kc)
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .output()
        .unwrap();
    assert!(
        spdy.status.success(),
        "{}",
        String::from_utf8_lossy(&spdy.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&spdy.stdout), "echo over spdy\n");
    let mut spdy_in = Command::new("kubectl")
        .args(["exec", "-i", "pod-0-0", "--", "cat"])
        .env("KUBECONFIG", &kc)
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = spdy_in.stdin.take().unwrap();
        stdin.write_all(b"hello spdy\n").unwrap();
    }
    let out = spdy_in.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello spdy\n");
}

#[test]
fn kubectl_watch_sees_changes() {
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 1, 2);
    let dir = TempDir::new("kw");
    let kc = dir.path().join("kubeconfig");
    s.write_kubeconfig(&kc, None).unwrap();
    let out_path = dir.path().join("watch.out");
    let mut watcher = Command::new("kubectl")
        .args(["get", "pods", "-w", "--output-watch-events"])
        .env("KUBECONFIG", &kc)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&out_path).unwrap_or_default();
    wait_for(
        "initial pods in kubectl -w",
        Duration::from_secs(10),
        || (read().lines().filter(|l| l.starts_with("ADDED")).count() == 2).then_some(()),
    );
    kubectl_ok(&kc, &["label", "pod", "pod-0-0", "watched=yes"]);
    kubectl_ok(&kc, &["delete", "pod", "pod-0-1"]);
    let seen = wait_for(
        "MODIFIED and DELETED in kubectl -w",
        Duration::from_secs(10),
        || {
            let t = read();
            let has = |prefix: &str| t.lines().any(|l| l.starts_with(prefix));
            (has("MODIFIED   pod-0-0") && has("DELETED    pod-0-1")).then_some(t)
        },
    );
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        seen.lines().next().unwrap().starts_with("EVENT"),
        "server-side table: {seen}"
    );
}

#[test]
fn python_client_lists_watches_and_handles_410() {
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 2, 5);
    let dir = TempDir::new("py");
    let kc = dir.path().join("kubeconfig");
    s.write_kubeconfig(&kc, None).unwrap();
    let script = r#"
import json, sys, threading
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
config.load_kube_config(sys.argv[1])
v1 = client.CoreV1Api()
out = {}
out["by_label"] = len(v1.list_namespaced_pod("default", label_selector="app in (app-1,app-2)").items)
out["by_field"] = len(v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1").items)
lst = v1.list_namespaced_pod("default")
rv = lst.metadata.resource_version
def mutate():
    v1.patch_namespaced_pod("pod-0-0", "default", {"metadata": {"labels": {"py": "1"}}})
threading.Timer(0.3, mutate).start()
w = watch.Watch()
for ev in w.stream(v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10):
    out["event"] = [ev["type"], ev["object"].metadata.name, ev["object"].metadata.labels.get("py")]
    w.stop()
    break
# Compact (through the control endpoint the tests use), then watch from the old rv.
import urllib3
api = client.ApiClient()
api.call_api("/_standin/compact", "POST", auth_settings=["BearerToken"], response_type="object")
try:
    for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
        out["unexpected"] = ev["type"]
        break
except ApiException as e:
    out["gone"] = e.status
print(json.dumps(out))
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&kc)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["by_label"], 4, "{r}");
    assert_eq!(r["by_field"], 5, "{r}");
    assert_eq!(r["event"], json!(["MODIFIED", "pod-0-0", "1"]), "{r}");
    assert_eq!(r["gone"], 410, "{r}");
}

#[test]
fn chunked_list_of_5000_pods_returns_each_once() {
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 10, 500);
    let c = admin(&s);
    let mut seen = std::collections::HashSet::new();
    let mut token = String::new();
    let mut pages = 0;
    let mut first_rv = String::new();
    loop {
        let path = format!("/api/v1/pods?limit=500&continue={token}");
        let page = c.get(&path).json();
        pages += 1;
        if first_rv.is_empty() {
            first_rv = page["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string();
            // A write between pages must not show up: the list is a snapshot.
            seed::pod(&s.state.store, "default", "zz-late", "node-0", "late");
        }
        assert_eq!(page["metadata"]["resourceVersion"], first_rv.as_str());
        for item in page["items"].as_array().unwrap() {
            assert!(
                seen.insert(item["metadata"]["name"].as_str().unwrap().to_string()),
                "duplicate"
            );
            assert!(item.get("kind").is_none(), "list items carry no kind");
        }
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (5000, 10));
    assert!(!seen.contains("zz-late"));
}

/// A continue token from before a compaction (recorded `list-continue-expired-json`):
/// kube-apiserver 1.32 answers 410 Expired with a fresh token; 1.36 answers the next page
/// (from its watch cache's snapshot) at the token's resourceVersion.
#[test]
fn an_expired_continue_token_is_410_in_1_32_and_the_next_page_in_1_36() {
    use hub_tests::apiserver::Version;
    for version in [Version::V1_32, Version::V1_36] {
        let s = standin(Options {
            version,
            ..Options::default()
        });
        seed::cluster(&s.state.store, 1, 5);
        let c = admin(&s);
        let page = c.get("/api/v1/pods?limit=2").json();
        let token = page["metadata"]["continue"].as_str().unwrap().to_string();
        let rv = page["metadata"]["resourceVersion"].clone();
        seed::pod(&s.state.store, "default", "after-token", "node-0", "x");
        c.request("POST", "/_standin/compact", &[], &[]).unwrap();
        let next = c.get(&format!("/api/v1/pods?limit=2&continue={token}"));
        if version == Version::V1_32 {
            assert_eq!(next.status, 410);
            let status = next.json();
            assert_eq!(status["reason"], "Expired");
            assert!(
                status["metadata"]["continue"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            );
        } else {
            assert_eq!(next.status, 200, "{}", String::from_utf8_lossy(&next.body));
            let list = next.json();
            assert_eq!(list["metadata"]["resourceVersion"], rv);
            let names: Vec<&str> = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["pod-0-2", "pod-0-3"]);
            assert!(list["metadata"]["continue"].as_str().is_some());
        }
    }
}

/// LIST by resourceVersion as kube-apiserver 1.32 answers it (recorded in
/// tests/fixtures/wire: `list-pods-protobuf-nodename` is rv=0 with limit=500 and came back
/// whole): rv=0 from the watch cache ignoring limit; NotOlderThan the newest state, in
/// pages; Exact the state at that version, or 410 once compacted; a future version 504.
#[test]
fn lists_honour_resource_version_and_its_match() {
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 1, 5);
    let c = admin(&s);
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let pods = "/api/v1/namespaces/default/pods";
    let before = c.get(pods).json();
    let then = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    seed::pod(&s.state.store, "default", "pod-later", "node-0", "x");

    let cached = c.get(&format!("{pods}?limit=2&resourceVersion=0")).json();
    assert_eq!(names(&cached).len(), 6, "rv=0 ignores limit");
    assert!(cached["metadata"]["continue"].is_null());
    let newer = c
        .get(&format!(
            "{pods}?limit=2&resourceVersion={then}&resourceVersionMatch=NotOlderThan"
        ))
        .json();
    assert_eq!(names(&newer).len(), 2, "NotOlderThan with a limit pages");
    assert!(newer["metadata"]["continue"].is_string());
    let exact = c
        .get(&format!(
            "{pods}?resourceVersion={then}&resourceVersionMatch=Exact"
        ))
        .json();
    assert_eq!(exact["metadata"]["resourceVersion"], then.as_str());
    assert_eq!(
        names(&exact),
        names(&before),
        "Exact: the state at that version"
    );

    let future = s.state.store.current_rv() + 100;
    let too_new = c.get(&format!(
        "{pods}?resourceVersion={future}&resourceVersionMatch=Exact"
    ));
    assert_eq!(
        (too_new.status, too_new.json()["reason"].clone()),
        (504, json!("Timeout"))
    );
    for bad in [
        "resourceVersionMatch=Exact",
        "resourceVersion=0&resourceVersionMatch=Exact",
        "resourceVersion=1&resourceVersionMatch=Sometimes",
    ] {
        let r = c.get(&format!("{pods}?{bad}"));
        assert_eq!(
            (r.status, r.json()["reason"].clone()),
            (422, json!("Invalid")),
            "{bad}"
        );
    }
    c.request("POST", "/_standin/compact", &[], &[]).unwrap();
    let gone = c.get(&format!(
        "{pods}?resourceVersion={then}&resourceVersionMatch=Exact"
    ));
    assert_eq!(
        (gone.status, gone.json()["reason"].clone()),
        (410, json!("Expired"))
    );
}

#[test]
fn watch_semantics_rv_gone_bookmarks_initial_events_selectors() {
    let s = standin(Options {
        history_limit: 50,
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    });
    seed::cluster(&s.state.store, 1, 3);
    let c = admin(&s);
    let rv: u64 = c.get("/api/v1/namespaces/default/pods").json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // From a resourceVersion: only later events, with a label selector turning a label
    // change into ADDED (entering) and DELETED (leaving).
    let mut w = c.stream(&format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}&labelSelector=sel%3Dyes&allowWatchBookmarks=true"));
    assert_eq!(w.status, 200);
    let patch = |name: &str, v: &str| {
        let r = c
            .request(
                "PATCH",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                &[("Content-Type", "application/merge-patch+json")],
                format!(r#"{{"metadata":{{"labels":{{"sel":"{v}"}}}}}}"#).as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 200);
    };
    patch("pod-0-0", "yes");
    patch("pod-0-0", "no");
    let mut types = Vec::new();
    while types.len() < 2 {
        let ev = w.next_event(Duration::from_secs(5)).expect("event");
        if ev["type"] != "BOOKMARK" {
            assert_eq!(ev["object"]["metadata"]["name"], "pod-0-0");
            types.push(ev["type"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(types, ["ADDED", "DELETED"]);
    let bookmark = std::iter::from_fn(|| w.next_event(Duration::from_secs(2)))
        .find(|e| e["type"] == "BOOKMARK")
        .expect("bookmark");
    assert!(
        bookmark["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv
    );

    // sendInitialEvents: ADDED for each pod, then the initial-events-end bookmark.
    let mut w = c.stream("/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true");
    let mut added = 0;
    loop {
        let ev = w.next_event(Duration::from_secs(5)).expect("event");
        if ev["type"] == "ADDED" {
            added += 1;
        } else {
            assert_eq!(ev["type"], "BOOKMARK");
            assert_eq!(
                ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
                "true"
            );
            break;
        }
    }
    assert_eq!(added, 3);

    // Past the history window: an ERROR event carrying a 410 Status.
    for i in 0..60 {
        seed::configmap(&s.state.store, "default", &format!("cm-{i}"), json!({}));
    }
    let mut w = c.stream(&format!(
        "/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}"
    ));
    let ev = w.next_event(Duration::from_secs(5)).expect("error event");
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert!(
        ev["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );

    // timeoutSeconds closes the stream.
    let mut w =
        c.stream("/api/v1/namespaces/default/pods?watch=true&resourceVersion=0&timeoutSeconds=1");
    let started = Instant::now();
    while w.next_line(Duration::from_secs(5)).is_some() {}
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn writes_conflicts_status_subresource_and_errors() {
    let s = standin(Options::default());
    let c = admin(&s);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let created = c.send_json("POST", "/api/v1/namespaces/default/pods", &pod);
    assert_eq!(created.status, 201);
    let created = created.json();
    assert_eq!(created["status"]["phase"], "Pending");
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        c.send_json("POST", "/api/v1/namespaces/default/pods", &pod)
            .json()["reason"],
        "AlreadyExists"
    );

    // Update with the current rv works; with the old one again is a 409 Conflict.
    let mut upd = created.clone();
    upd["metadata"]["labels"] = json!({"v": "2"});
    upd["status"]["phase"] = json!("Running");
    let updated = c.send_json("PUT", "/api/v1/namespaces/default/pods/p1", &upd);
    assert_eq!(updated.status, 200);
    assert_eq!(
        updated.json()["status"]["phase"],
        "Pending",
        "main resource PUT keeps status"
    );
    let stale = c.send_json("PUT", "/api/v1/namespaces/default/pods/p1", &upd);
    assert_eq!(
        (stale.status, stale.json()["reason"].as_str()),
        (409, Some("Conflict"))
    );
    let new_rv: u64 = updated.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(new_rv > rv.parse::<u64>().unwrap());

    let mut st = updated.json();
    st["status"]["phase"] = json!("Running");
    st["metadata"]["labels"] = json!({"ignored": "yes"});
    let status = c
        .send_json("PUT", "/api/v1/namespaces/default/pods/p1/status", &st)
        .json();
    assert_eq!(status["status"]["phase"], "Running");
    assert_eq!(
        status["metadata"]["labels"],
        json!({"v": "2"}),
        "status PUT keeps metadata"
    );

    // Errors are Status objects with the codes kube-apiserver uses.
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16);
    let cases: Vec<Case> = vec![
        (
            "GET",
            "/api/v1/namespaces/default/pods/nope",
            vec![],
            vec![],
            404,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/gizmos",
            vec![],
            vec![],
            404,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            vec![("Content-Type", "application/json")],
            b"{not json".to_vec(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            vec![("Content-Type", "text/plain")],
            b"x".to_vec(),
            415,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            vec![("Accept", "application/xml")],
            vec![],
            406,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            vec![("Content-Type", "application/json")],
            vec![b' '; 3 * 1024 * 1024 + 10],
            413,
        ),
        (
            "POST",
            "/api/v1/namespaces/nowhere/configmaps",
            vec![("Content-Type", "application/json")],
            br#"{"metadata":{"name":"x"}}"#.to_vec(),
            404,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            vec![("Content-Type", "application/json")],
            br#"{"metadata":{"name":"../etc"}}"#.to_vec(),
            422,
        ),
        (
            "GET",
            "/api/v1/pods?labelSelector=a%20b%20c",
            vec![],
            vec![],
            400,
        ),
        (
            "GET",
            "/api/v1/configmaps?fieldSelector=spec.nodeName%3Dx",
            vec![],
            vec![],
            400,
        ),
    ];
    for (method, path, headers, body, code) in cases {
        let r = c.request(method, path, &headers, &body).unwrap();
        assert_eq!(
            r.status,
            code,
            "{method} {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["kind"], "Status", "{method} {path}");
        assert_eq!(r.json()["code"], code);
    }
}

#[test]
fn authentication_and_authorisation() {
    let s = standin(Options::default());
    {
        let mut auth = s.state.auth.write().unwrap();
        auth.add_token("reader-token", "reader", &[]);
        auth.allow(Rule::new(
            "reader",
            &["get", "list", "watch"],
            &["configmaps"],
            &["default"],
        ));
    }
    seed::node(&s.state.store, "edge-1");
    let anon = Client::new(s.addr, s.ca.cert_der(), None, None);
    assert_eq!(anon.get("/healthz").status, 200);
    assert_eq!(anon.get("/version").json()["major"], "1");
    assert_eq!(anon.get("/api/v1/pods").status, 401);
    let bad = Client::new(s.addr, s.ca.cert_der(), Some("nope"), None);
    assert_eq!(bad.get("/api/v1/pods").status, 401);
    let reader = Client::new(s.addr, s.ca.cert_der(), Some("reader-token"), None);
    assert_eq!(
        reader.get("/api/v1/namespaces/default/configmaps").status,
        200
    );
    let denied = reader.get("/api/v1/namespaces/default/secrets");
    assert_eq!(denied.status, 403);
    assert!(
        denied.json()["message"]
            .as_str()
            .unwrap()
            .contains("User \"reader\" cannot list resource \"secrets\"")
    );
    assert_eq!(
        reader
            .get("/api/v1/namespaces/kube-system/configmaps")
            .status,
        403
    );

    let node = s.ca.client("system:node:edge-1", Some("system:nodes"));
    let kubelet = Client::new(s.addr, s.ca.cert_der(), None, Some(&node));
    assert_eq!(
        kubelet
            .get("/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1")
            .status,
        200
    );
    let stranger_ca = hub_tests::apiserver::tls::TestCa::new("other");
    let stranger = stranger_ca.client("system:node:evil", Some("system:nodes"));
    let rejected = Client::new(s.addr, s.ca.cert_der(), None, Some(&stranger)).request(
        "GET",
        "/api/v1/nodes",
        &[],
        &[],
    );
    assert!(
        rejected.is_err() || rejected.unwrap().status == 401,
        "a certificate from another CA is not accepted"
    );
}

/// `system:node:<n>` gets what kube-apiserver's Node authorizer (and NodeRestriction)
/// gives a kubelet, plus the pool-scope reads deploy/base/hub.yaml grants — not "anything".
#[test]
fn a_node_reads_only_its_own_pods_and_what_they_reference() {
    let s = standin(Options::default());
    s.state.auth.write().unwrap().add_test_identities();
    let store = &s.state.store;
    seed::namespace(store, "ns1");
    seed::node(store, "edge-1");
    seed::node(store, "edge-2");
    seed::pod_mounting(
        store,
        "ns1",
        "mine",
        "edge-1",
        "a",
        &["cm-mine"],
        &["s-mine"],
    );
    seed::pod_mounting(
        store,
        "ns1",
        "theirs",
        "edge-2",
        "a",
        &["cm-theirs"],
        &["s-theirs"],
    );
    for name in ["cm-mine", "cm-theirs", "kube-root-ca.crt"] {
        seed::configmap(store, "ns1", name, json!({"k": "v"}));
    }
    for name in ["s-mine", "s-theirs"] {
        seed::secret(store, "ns1", name, json!({"k": "dg=="}));
    }
    seed::service(store, "ns1", "svc", 80);
    let node = s.ca.client("system:node:edge-1", Some("system:nodes"));
    let kubelet = Client::new(s.addr, s.ca.cert_der(), None, Some(&node));
    let status = |method: &str, path: &str, body: &[u8]| {
        kubelet
            .request(method, path, &[("Content-Type", "application/json")], body)
            .unwrap()
            .status
    };
    let get = |path: &str| status("GET", path, b"");
    let allowed = [
        "/api/v1/nodes/edge-1",
        "/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1",
        "/api/v1/namespaces/ns1/pods/mine",
        "/api/v1/namespaces/ns1/configmaps/cm-mine",
        "/api/v1/namespaces/ns1/configmaps/kube-root-ca.crt",
        "/api/v1/namespaces/ns1/configmaps?fieldSelector=metadata.name%3Dcm-mine",
        "/api/v1/namespaces/ns1/secrets/s-mine",
        "/api/v1/namespaces/ns1/secrets?fieldSelector=metadata.name%3Ds-mine&watch=true&timeoutSeconds=1",
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ];
    for path in allowed {
        assert_eq!(get(path), 200, "{path}");
    }
    let refused = [
        "/api/v1/pods",
        "/api/v1/namespaces/ns1/pods",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-2",
        "/api/v1/namespaces/ns1/pods/theirs",
        "/api/v1/namespaces/ns1/configmaps",
        "/api/v1/namespaces/ns1/configmaps/cm-theirs",
        "/api/v1/namespaces/ns1/configmaps?fieldSelector=metadata.name%3Dcm-theirs",
        "/api/v1/namespaces/ns1/secrets/s-theirs",
        "/api/v1/namespaces/ns1/secrets",
        "/api/v1/namespaces",
        "/api/v1/nodes",
        "/api/v1/nodes/edge-2",
        "/api/v1/nodes?fieldSelector=metadata.name%3Dedge-2",
    ];
    for path in refused {
        assert_eq!(get(path), 403, "{path}");
    }
    // As kube-apiserver 1.32+ (AuthorizeNodeWithSelectors) refuses it.
    assert_eq!(
        kubelet.get("/api/v1/nodes").json()["message"],
        "nodes is forbidden: User \"system:node:edge-1\" cannot list resource \"nodes\" \
         in API group \"\" at the cluster scope: node 'edge-1' cannot read all nodes, only its own Node object"
    );
    let denial = kubelet
        .get("/api/v1/namespaces/ns1/secrets/s-theirs")
        .json();
    assert_eq!(
        denial["message"],
        "secrets \"s-theirs\" is forbidden: User \"system:node:edge-1\" cannot get resource \"secrets\" \
         in API group \"\" in the namespace \"ns1\": no relationship found between node 'edge-1' and this object"
    );
    assert_eq!(
        denial["details"],
        json!({"name": "s-theirs", "kind": "secrets"})
    );
    // Writes: its own Node and lease, its pods' status; not another node's.
    let patch = br#"{"metadata":{"labels":{"x":"y"}}}"#;
    let merge = |path: &str| {
        kubelet
            .request(
                "PATCH",
                path,
                &[("Content-Type", "application/merge-patch+json")],
                patch,
            )
            .unwrap()
            .status
    };
    assert_eq!(merge("/api/v1/nodes/edge-1"), 200);
    assert_eq!(merge("/api/v1/nodes/edge-2"), 403);
    assert_eq!(merge("/api/v1/namespaces/ns1/pods/mine/status"), 200);
    assert_eq!(merge("/api/v1/namespaces/ns1/pods/theirs/status"), 403);
    assert_eq!(merge("/api/v1/namespaces/ns1/configmaps/cm-mine"), 403);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "edge-1"}, "spec": {"holderIdentity": "edge-1"}});
    seed::namespace(store, "kube-node-lease");
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    assert_eq!(
        status("POST", leases, &serde_json::to_vec(&lease).unwrap()),
        201
    );
    assert_eq!(merge(&format!("{leases}/edge-1")), 200);
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "mine", "namespace": "ns1"}, "reason": "Started"});
    assert_eq!(
        status(
            "POST",
            "/api/v1/namespaces/ns1/events",
            &serde_json::to_vec(&event).unwrap()
        ),
        201
    );
    // A ServiceAccount token only for an account a pod of the node runs as.
    let token = br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":["api"]}}"#;
    assert_eq!(
        status(
            "POST",
            "/api/v1/namespaces/ns1/serviceaccounts/default/token",
            token
        ),
        201
    );
    assert_eq!(
        status(
            "POST",
            "/api/v1/namespaces/ns1/serviceaccounts/admin/token",
            token
        ),
        403
    );
    // The graph follows the cluster: once its pod is bound here, the node may read it.
    seed::pod_mounting(store, "ns1", "moved", "edge-1", "a", &["cm-theirs"], &[]);
    assert_eq!(get("/api/v1/namespaces/ns1/configmaps/cm-theirs"), 200);
}

/// `kubectl auth whoami` works, and a request carrying both a client certificate and a
/// bearer token is the certificate's user, as kube-apiserver's authenticator chain (x509
/// before tokens) decides — recorded in tests/fixtures/wire (selfsubjectreview-*).
#[test]
fn self_subject_review_and_the_certificate_before_the_token() {
    let s = standin(Options::default());
    let review = br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;
    let whoami = |c: &Client| {
        let r = c
            .request(
                "POST",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                &[("Content-Type", "application/json")],
                review,
            )
            .unwrap();
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["kind"], "SelfSubjectReview");
        (
            v["status"]["userInfo"]["username"]
                .as_str()
                .unwrap()
                .to_string(),
            v["status"]["userInfo"]["groups"].clone(),
        )
    };
    assert_eq!(whoami(&admin(&s)).0, "admin");
    let node = s.ca.client("system:node:edge-1", Some("system:nodes"));
    let both = Client::new(s.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), Some(&node));
    let (user, groups) = whoami(&both);
    assert_eq!(user, "system:node:edge-1", "x509 is tried before the token");
    assert_eq!(groups, json!(["system:nodes", "system:authenticated"]));
    // The recorded answer for the node has the same shape.
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/wire/kube-apiserver-1.32/selfsubjectreview-node/response.body"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(recorded["status"]["userInfo"]["groups"], groups);
    // kubectl finds it through discovery.
    let rl = admin(&s).get("/apis/authentication.k8s.io/v1").json();
    assert_eq!(rl["resources"][0]["name"], "selfsubjectreviews");
}

#[test]
fn faults_and_stop_start_listening() {
    let s = standin(Options::default());
    let c = admin(&s);
    s.set_faults(FaultSettings {
        error_permille: 1000,
        ..Default::default()
    });
    assert_eq!(c.get("/api/v1/pods").status, 503);
    let f = c.send_json(
        "PUT",
        "/_standin/faults",
        &json!({"errorPermille": 0, "latencyMs": 50}),
    );
    assert_eq!(f.json()["latencyMs"], 50);
    let t = Instant::now();
    assert_eq!(c.get("/api/v1/pods").status, 200);
    assert!(t.elapsed() >= Duration::from_millis(50));
    // The server cost: 40 ms of the server's CPU per answer.
    let cpu_before = process_cpu();
    c.send_json("PUT", "/_standin/faults", &json!({"costUs": 40_000}));
    assert_eq!(c.get("/api/v1/pods").status, 200);
    let spent = process_cpu() - cpu_before;
    assert!(spent >= Duration::from_millis(40), "{spent:?} of CPU");
    s.set_faults(FaultSettings::default());
    // Touch: every pod gets a new resourceVersion.
    seed::cluster(&s.state.store, 1, 3);
    let rvs = |c: &Client| -> Vec<String> {
        c.get("/api/v1/pods").json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let before = rvs(&c);
    let touched = c
        .request("POST", "/_standin/touch?resource=pods", &[], &[])
        .unwrap();
    assert_eq!(
        touched.json()["touched"],
        3,
        "{}",
        String::from_utf8_lossy(&touched.body)
    );
    let after = rvs(&c);
    assert_eq!(after.len(), 3);
    assert!(
        before.iter().zip(&after).all(|(b, a)| b != a),
        "{before:?} {after:?}"
    );

    s.stop_listening();
    assert!(
        c.request("GET", "/api/v1/pods", &[], &[]).is_err(),
        "refused while stopped"
    );
    s.start_listening().unwrap();
    assert_eq!(c.get("/api/v1/pods").status, 200);
}

#[test]
fn starts_fast_with_10k_pods_and_serves_them() {
    let started = Instant::now();
    let s = standin(Options::default());
    seed::cluster(&s.state.store, 100, 100);
    let startup = started.elapsed();
    let c = admin(&s);
    let t = Instant::now();
    let list = c.get("/api/v1/pods");
    let served = t.elapsed();
    assert_eq!(list.json()["items"].as_array().unwrap().len(), 10_000);
    // Timing is reported, not asserted (benchmarks own speed goals).
    eprintln!(
        "stand-in: start + seed 10k pods {startup:?}, 10k-pod JSON list {served:?} ({} bytes)",
        list.body.len()
    );
}

/// (b) A protobuf list and watch of pods decode with a real decoder of the Kubernetes types
/// (k8s-pb) into the same objects as the JSON form; kinds without a protobuf form here fall
/// back to JSON when the client also accepts it, and get 406 when it does not.
#[test]
fn protobuf_pods_decode_with_k8s_pb_like_the_json_form() {
    use k8s_pb::{
        api::core::v1::{Pod, PodList},
        apimachinery::pkg::apis::meta::v1::{Status, WatchEvent},
    };
    use prost::Message;

    let s = standin(Options::default());
    seed::cluster(&s.state.store, 2, 3);
    let c = admin(&s);
    let pb = [(
        "Accept",
        "application/vnd.kubernetes.protobuf,application/json",
    )];
    let json = c.get("/api/v1/namespaces/default/pods").json();
    let r = c
        .request("GET", "/api/v1/namespaces/default/pods", &pb, &[])
        .unwrap();
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.kubernetes.protobuf")
    );
    let env = hub::kproto::unwrap(&r.body).expect("k8s envelope");
    assert_eq!(
        (env.api_version.as_str(), env.kind.as_str()),
        ("v1", "PodList")
    );
    let list = PodList::decode(env.raw).expect("a PodList");
    let items = json["items"].as_array().unwrap();
    assert_eq!(list.items.len(), items.len());
    for (p, j) in list.items.iter().zip(items) {
        let m = p.metadata.as_ref().unwrap();
        assert_eq!(m.name.as_deref(), j["metadata"]["name"].as_str());
        assert_eq!(
            m.resource_version.as_deref(),
            j["metadata"]["resourceVersion"].as_str()
        );
        assert_eq!(
            m.labels.get("app").map(String::as_str),
            j["metadata"]["labels"]["app"].as_str()
        );
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), j["spec"]["nodeName"].as_str());
        assert_eq!(
            spec.containers[0].image.as_deref(),
            j["spec"]["containers"][0]["image"].as_str()
        );
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), j["status"]["phase"].as_str());
        assert_eq!(
            status.container_statuses[0].ready,
            j["status"]["containerStatuses"][0]["ready"].as_bool()
        );
    }
    assert_eq!(
        list.metadata.unwrap().resource_version.as_deref(),
        json["metadata"]["resourceVersion"].as_str()
    );

    // A single object.
    let one = c
        .request("GET", "/api/v1/namespaces/default/pods/pod-1-2", &pb, &[])
        .unwrap();
    let pod = Pod::decode(hub::kproto::unwrap(&one.body).unwrap().raw).unwrap();
    assert_eq!(pod.metadata.unwrap().name.as_deref(), Some("pod-1-2"));

    // A watch replayed from history: length-prefixed frames, the same events as JSON.
    let rv = json["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let patch = |name: &str| {
        c.request(
            "PATCH",
            &format!("/api/v1/namespaces/default/pods/{name}"),
            &[("Content-Type", "application/merge-patch+json")],
            br#"{"metadata":{"labels":{"w":"1"}}}"#,
        )
        .unwrap();
    };
    patch("pod-0-0");
    c.request(
        "DELETE",
        "/api/v1/namespaces/default/pods/pod-0-1",
        &[],
        &[],
    )
    .unwrap();
    let path =
        format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1");
    let w = c.request("GET", &path, &pb, &[]).unwrap();
    assert_eq!(
        w.header("content-type"),
        Some("application/vnd.kubernetes.protobuf;stream=watch")
    );
    let (frames, used) = hub::kproto::watch_frames(&w.body);
    assert_eq!(used, w.body.len(), "the body is whole frames");
    let events: Vec<(String, String)> = frames
        .iter()
        .map(|f| {
            // A raw WatchEvent per frame, as kube-apiserver writes it: no envelope.
            let ev = WatchEvent::decode(*f).unwrap();
            let obj = Pod::decode(
                hub::kproto::unwrap(&ev.object.unwrap().raw.unwrap())
                    .unwrap()
                    .raw,
            )
            .unwrap();
            (ev.r#type.unwrap(), obj.metadata.unwrap().name.unwrap())
        })
        .collect();
    let json_watch = c.get(&path);
    let json_events: Vec<(String, String)> = String::from_utf8_lossy(&json_watch.body)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["type"].as_str().unwrap().to_string(),
                v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        events,
        vec![
            ("MODIFIED".into(), "pod-0-0".into()),
            ("DELETED".into(), "pod-0-1".into())
        ]
    );
    assert_eq!(events, json_events);

    // 410 Gone as a protobuf ERROR frame.
    c.request("POST", "/_standin/compact", &[], &[]).unwrap();
    seed::configmap(&s.state.store, "default", "bump", json!({}));
    c.request("POST", "/_standin/compact", &[], &[]).unwrap();
    let gone = c
        .request(
            "GET",
            &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}"),
            &pb,
            &[],
        )
        .unwrap();
    let (frames, _) = hub::kproto::watch_frames(&gone.body);
    let ev = WatchEvent::decode(frames[0]).unwrap();
    assert_eq!(ev.r#type.as_deref(), Some("ERROR"));
    let status = Status::decode(
        hub::kproto::unwrap(&ev.object.unwrap().raw.unwrap())
            .unwrap()
            .raw,
    )
    .unwrap();
    assert_eq!(status.code, Some(410));

    // The other core kinds kubelet and kube-proxy read, decoded with k8s-pb.
    seed::service(&s.state.store, "default", "web", 80);
    let node_list = c.request("GET", "/api/v1/nodes", &pb, &[]).unwrap();
    let nodes =
        k8s_pb::api::core::v1::NodeList::decode(hub::kproto::unwrap(&node_list.body).unwrap().raw)
            .unwrap();
    assert_eq!(nodes.items.len(), 2);
    let ready = &nodes.items[0].status.as_ref().unwrap().conditions[0];
    assert_eq!(
        (ready.r#type.as_deref(), ready.status.as_deref()),
        (Some("Ready"), Some("True"))
    );
    let svc = c
        .request("GET", "/api/v1/namespaces/default/services/web", &pb, &[])
        .unwrap();
    let svc = k8s_pb::api::core::v1::Service::decode(hub::kproto::unwrap(&svc.body).unwrap().raw)
        .unwrap();
    assert_eq!(svc.spec.unwrap().ports[0].port, Some(80));
    let slices = c
        .request(
            "GET",
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            &pb,
            &[],
        )
        .unwrap();
    let env = hub::kproto::unwrap(&slices.body).unwrap();
    assert_eq!(
        (env.api_version.as_str(), env.kind.as_str()),
        ("discovery.k8s.io/v1", "EndpointSliceList")
    );
    let slices = k8s_pb::api::discovery::v1::EndpointSliceList::decode(env.raw).unwrap();
    assert_eq!(slices.items[0].address_type.as_deref(), Some("IPv4"));

    let created = c.send_json(
        "POST",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        &json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "csr-1"},
                "spec": {"request": "cmVxdWVzdA==", "signerName": "kubernetes.io/kubelet-serving", "usages": ["server auth"]}}),
    );
    assert_eq!(created.status, 201);
    let csr = c
        .request(
            "GET",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1",
            &pb,
            &[],
        )
        .unwrap();
    assert_eq!(
        csr.header("content-type"),
        Some("application/vnd.kubernetes.protobuf"),
        "{} {}",
        csr.status,
        String::from_utf8_lossy(&csr.body)
    );
    let csr = k8s_pb::api::certificates::v1::CertificateSigningRequest::decode(
        hub::kproto::unwrap(&csr.body).unwrap().raw,
    )
    .unwrap();
    let spec = csr.spec.unwrap();
    assert_eq!(
        (spec.signer_name.as_deref(), spec.request.as_deref()),
        (Some("kubernetes.io/kubelet-serving"), Some(&b"request"[..]))
    );

    // A kind without a protobuf form (the CRD, as with kube-apiserver): JSON when
    // acceptable, 406 when not.
    let widgets = c
        .request(
            "GET",
            "/apis/example.hub.dev/v1/namespaces/default/widgets",
            &pb,
            &[],
        )
        .unwrap();
    assert_eq!(widgets.header("content-type"), Some("application/json"));
    let only_pb = c
        .request(
            "GET",
            "/apis/example.hub.dev/v1/namespaces/default/widgets",
            &[("Accept", "application/vnd.kubernetes.protobuf")],
            &[],
        )
        .unwrap();
    assert_eq!(only_pb.status, 406);

    // A pod with what real workloads carry (volumes, probes, resources, env from fields and
    // secrets, tolerations, container histories): the real protobuf types read it back.
    let mut rich = seed::realistic_pod();
    rich["metadata"]["namespace"] = "default".into();
    assert_eq!(
        c.send_json("POST", "/api/v1/namespaces/default/pods", &rich)
            .status,
        201
    );
    let one = c
        .request(
            "GET",
            "/api/v1/namespaces/default/pods/web-7d4b9c-x2k4p",
            &pb,
            &[],
        )
        .unwrap();
    let pod = Pod::decode(hub::kproto::unwrap(&one.body).unwrap().raw).unwrap();
    let spec = pod.spec.unwrap();
    let token = spec.volumes[5].volume_source.as_ref().unwrap();
    let projected = token.projected.as_ref().unwrap();
    assert_eq!(
        projected.sources[0]
            .service_account_token
            .as_ref()
            .unwrap()
            .expiration_seconds,
        Some(3607)
    );
    let web = &spec.containers[0];
    let limits = &web.resources.as_ref().unwrap().limits;
    assert_eq!(limits["cpu"].string.as_deref(), Some("500m"));
    let live = web
        .liveness_probe
        .as_ref()
        .unwrap()
        .handler
        .as_ref()
        .unwrap();
    assert_eq!(
        live.http_get.as_ref().unwrap().path.as_deref(),
        Some("/healthz")
    );
    let from = web.env[2].value_from.as_ref().unwrap();
    assert_eq!(
        from.secret_key_ref.as_ref().unwrap().key.as_deref(),
        Some("password")
    );
    assert_eq!(spec.tolerations[0].toleration_seconds, Some(300));
    let status = pod.status.unwrap();
    let last = status.container_statuses[0].last_state.as_ref().unwrap();
    assert_eq!(last.terminated.as_ref().unwrap().exit_code, Some(137));
    assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
}

#[test]
fn protobuf_request_bodies_of_node_kinds_are_read_like_json() {
    use k8s_pb::{
        api::coordination::v1::{Lease, LeaseSpec},
        apimachinery::pkg::{
            apis::meta::v1::{MicroTime, ObjectMeta},
            runtime::{TypeMeta, Unknown},
        },
    };
    use prost::Message;
    let s = standin(Options::default());
    let a = admin(&s);
    // A lease built with the real protobuf types, as kubelet's typed client sends it.
    let body = |rv: Option<&str>, renew: i64| {
        let lease = Lease {
            metadata: Some(ObjectMeta {
                name: Some("node-0".into()),
                namespace: Some("default".into()),
                resource_version: rv.map(String::from),
                ..Default::default()
            }),
            spec: Some(LeaseSpec {
                holder_identity: Some("node-0".into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime {
                    seconds: Some(renew),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
        };
        let u = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
            }),
            raw: Some(lease.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [b"k8s\0".to_vec(), u.encode_to_vec()].concat()
    };
    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let pb = [("Content-Type", "application/vnd.kubernetes.protobuf")];
    let r = a
        .request("POST", leases, &pb, &body(None, 1_780_000_000))
        .unwrap();
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let got = a.get(&format!("{leases}/node-0")).json();
    assert_eq!(got["spec"]["holderIdentity"], "node-0");
    assert_eq!(got["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(got["spec"]["renewTime"], "2026-05-28T20:26:40.000000Z");
    let rv = got["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // An update in protobuf: with the current resourceVersion it applies, with a stale
    // one it conflicts, exactly as in JSON.
    let path = format!("{leases}/node-0");
    let r = a
        .request("PUT", &path, &pb, &body(Some(&rv), 1_780_000_010))
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = a
        .request("PUT", &path, &pb, &body(Some(&rv), 1_780_000_020))
        .unwrap();
    assert_eq!(r.status, 409);
    // Garbage, the wrong kind, and kinds nodes do not write in protobuf.
    let r = a.request("PUT", &path, &pb, b"k8s\0not protobuf").unwrap();
    assert_eq!(r.status, 400);
    let r = a
        .request(
            "POST",
            "/api/v1/namespaces/default/events",
            &pb,
            &body(None, 1),
        )
        .unwrap();
    assert_eq!(r.status, 400, "a Lease body for events");
    // Kinds without a protobuf form (CRDs, here the widgets) refuse it, as
    // kube-apiserver does for custom resources.
    let r = a
        .request(
            "POST",
            "/apis/example.hub.dev/v1/namespaces/default/widgets",
            &pb,
            &body(None, 1),
        )
        .unwrap();
    assert_eq!(r.status, 415);
}

/// This process's CPU time (user + system).
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Chunk sizes of an HTTP/1.1 answer read raw by curl, and its head.
fn http11_chunks(s: &StandIn, path: &str, headers: &[&str]) -> (String, Vec<usize>) {
    let dir = hub_tests::TempDir::new("chunks");
    let ca = dir.0.join("ca.crt");
    std::fs::write(&ca, s.ca.cert_pem()).unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--http1.1", "--raw", "-i", "--cacert"])
        .arg(&ca)
        .args(["-H", &format!("Authorization: Bearer {ADMIN_TOKEN}")]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .arg(format!("https://127.0.0.1:{}{path}", s.addr.port()))
        .output()
        .expect("curl");
    let raw = out.stdout;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let (mut at, mut sizes) = (split + 4, Vec::new());
    if head.contains("transfer-encoding: chunked") {
        loop {
            let nl = at + raw[at..].windows(2).position(|w| w == b"\r\n").unwrap();
            let n = usize::from_str_radix(std::str::from_utf8(&raw[at..nl]).unwrap(), 16).unwrap();
            if n == 0 {
                break;
            }
            sizes.push(n);
            at = nl + 2 + n + 2;
        }
    }
    (head, sizes)
}

/// Over HTTP/1.1 the stand-in sends a list chunked as kube-apiserver 1.36 did
/// (fixtures/wire/kube-apiserver-1.36/list-framing-http11.json): two chunks per item,
/// 2048 bytes then the rest, in JSON and protobuf alike; gzipped, 2048-byte chunks. A
/// proxy in front of it then reads as many pieces as in front of the real one.
#[test]
fn over_http11_a_list_is_chunked_as_kube_apiserver_1_36_chunked_it() {
    let recorded =
        hub_tests::recorded::fixture("wire/kube-apiserver-1.36/list-framing-http11.json");
    for enc in ["json", "protobuf"] {
        let a = &recorded["answers"][enc];
        assert_eq!(
            (
                a["chunks"].as_u64(),
                a["most_common_chunk_sizes"][0]["bytes"].as_u64()
            ),
            (Some(2001), Some(2048))
        );
        assert_eq!(a["most_common_chunk_sizes"][0]["chunks"], 1000);
    }
    let s = standin(Options::default());
    const PODS: usize = 40;
    for i in 0..PODS {
        // Over 4 KiB in protobuf too, as the recorded pods were (a smaller item's rest
        // stays in Go's buffer and shares the next chunk).
        let mut pod = seed::realistic_pod();
        pod["metadata"]["name"] = json!(format!("web-{i:02}"));
        pod["metadata"]["annotations"]["example.com/config"] = json!("y".repeat(4000));
        seed::put(&s.state.store, "pods", "", "shop", pod);
    }
    let path = "/api/v1/namespaces/shop/pods";
    for accept in ["application/json", "application/vnd.kubernetes.protobuf"] {
        let (head, sizes) = http11_chunks(&s, path, &[&format!("Accept: {accept}")]);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert_eq!(sizes.len(), 2 * PODS + 1, "{accept}: {sizes:?}");
        assert!(
            sizes.iter().step_by(2).take(PODS).all(|n| *n == 2048),
            "{accept}: {sizes:?}"
        );
        // The same bytes as the answer sent whole.
        let whole = admin(&s)
            .request("GET", path, &[("Accept", accept)], &[])
            .unwrap();
        assert_eq!(sizes.iter().sum::<usize>(), whole.body.len(), "{accept}");
    }
    // Gzipped (over 128 KiB): 2048-byte chunks.
    for i in PODS..200 {
        let mut pod = seed::realistic_pod();
        pod["metadata"]["name"] = json!(format!("web-{i:03}"));
        seed::put(&s.state.store, "pods", "", "shop", pod);
    }
    let (head, sizes) = http11_chunks(
        &s,
        path,
        &["Accept: application/json", "Accept-Encoding: gzip"],
    );
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let (last, full) = sizes.split_last().unwrap();
    assert!(
        full.iter().all(|n| *n == 2048) && *last <= 2048,
        "{sizes:?}"
    );
}
