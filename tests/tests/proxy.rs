//! Issue 5: the L7 proxy in front of the API stand-in (interception off, so these run in
//! the test's own namespace on loopback ports): identities, HTTP/1.1 and HTTP/2, streaming
//! watches, task hygiene, failover between cloud servers, bad input, and the routes.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hub_tests::{
    TempDir,
    apiserver::{
        ADMIN_TOKEN, Options, StandIn,
        auth::Rule,
        client::Client,
        seed,
        tls::{HubPki, TestCa},
    },
    hub::{HubProc, LoopbackHub as HubConfig},
    ports::free_port,
    process,
    scenario::Setup as Scenario,
    wait_for,
};
use serde_json::{Value, json};

/// The node name of the hubs these tests start (`LOOPBACK_NODE`).
const NODE: &str = "node-0";
/// A collection every node may read (kube-apiserver's Node authorizer lets a node read
/// only its own Node): the requests whose identity these tests follow.
const ANY_NODE_READS: &str = "/apis/storage.k8s.io/v1/csidrivers";

struct Setup {
    clouds: Vec<StandIn>,
    hub: HubProc,
    pki: HubPki,
    tls_addr: SocketAddr,
    plain_addr: SocketAddr,
    ca: Arc<TestCa>,
    _dir: TempDir,
}

fn setup(n_clouds: usize) -> Setup {
    setup_with(n_clouds, Options::default, StandIn::url)
}

/// `url_of` is the address the hub is given for each cloud server.
fn setup_with(
    n_clouds: usize,
    options: impl Fn() -> Options,
    url_of: impl Fn(&StandIn) -> String,
) -> Setup {
    let ca = Arc::new(TestCa::new("cloud-ca"));
    let clouds: Vec<StandIn> = (0..n_clouds)
        .map(|_| {
            let s = StandIn::start_with_ca("127.0.0.1:0".parse().unwrap(), options(), ca.clone())
                .unwrap();
            s.state.auth.write().unwrap().add_test_identities();
            seed::cluster(&s.state.store, 2, 3);
            s
        })
        .collect();
    let dir = TempDir::new("px");
    let pki = ca.write_hub_pki(dir.path(), NODE, &[]).unwrap();
    let (tls_port, plain_port, admin_port) = (free_port(), free_port(), free_port());
    let config = HubConfig {
        servers: clouds.iter().map(url_of).collect(),
        ca: Some(&pki.ca),
        node: Some(&pki.node),
        serving: Some((&pki.serving.0, &pki.serving.1)),
        client_ca: Some(&pki.ca),
        plain: plain_port,
        tls: Some(tls_port),
        admin: format!("127.0.0.1:{admin_port}"),
        ..Default::default()
    };
    let hub = HubProc::start_yaml(None, &config.admin, None, |_, cache| config.yaml(cache));
    Setup {
        clouds,
        hub,
        pki,
        tls_addr: format!("127.0.0.1:{tls_port}").parse().unwrap(),
        plain_addr: format!("127.0.0.1:{plain_port}").parse().unwrap(),
        ca,
        _dir: dir,
    }
}

impl Setup {
    fn client(&self, token: Option<&str>, kubelet: bool) -> Client {
        Client::new(
            self.tls_addr,
            self.ca.cert_der(),
            token,
            kubelet.then_some(&self.pki.kubelet),
        )
    }
}

/// The cloud's latest audit entry for exactly `path`.
fn last_audit(cloud: &StandIn, path: &str) -> hub_tests::apiserver::AuditEntry {
    cloud
        .audit()
        .into_iter()
        .rev()
        .find(|a| a.path == path)
        .expect("audited request")
}

/// tls.clientCaFile is re-read when it changes: after a CA rotation (the file now holds
/// the old and the new CA), a kubelet certificate from the new CA is the node.
#[test]
fn a_rotated_client_ca_is_picked_up_without_a_restart() {
    let s = setup(1);
    let rotated = TestCa::new("rotated-cloud-ca");
    let kubelet = rotated.client("system:node:node-0", Some("system:nodes"));
    let new_kubelet = || Client::new(s.tls_addr, s.ca.cert_der(), None, Some(&kubelet));
    assert!(
        new_kubelet()
            .request("GET", ANY_NODE_READS, &[], &[])
            .is_err(),
        "not trusted before the rotation"
    );
    let bundle = format!("{}{}", s.ca.cert_pem(), rotated.cert_pem());
    std::fs::write(&s.pki.ca, bundle).unwrap();
    wait_for(
        "the hub to trust the rotated CA",
        Duration::from_secs(30),
        || {
            new_kubelet()
                .request("GET", ANY_NODE_READS, &[], &[])
                .ok()
                .filter(|r| r.status == 200)
        },
    );
    let seen = last_audit(&s.clouds[0], ANY_NODE_READS);
    assert_eq!(seen.user, "system:node:node-0");
    assert_eq!(
        s.client(None, true).get(ANY_NODE_READS).status,
        200,
        "the old CA still"
    );
}

#[test]
fn identities_are_forwarded_as_the_issue_says() {
    let s = setup(1);
    let cloud = &s.clouds[0];

    // A pod's bearer token is what the cloud sees, and the cloud's answers (200, 403) come back.
    let pod = s.client(Some("pod-token"), false);
    assert_eq!(pod.get("/api/v1/namespaces/default/pods").status, 200);
    let denied = pod.get("/api/v1/namespaces/default/secrets");
    assert_eq!(
        denied.status,
        403,
        "{}",
        String::from_utf8_lossy(&denied.body)
    );
    let audit = cloud.audit();
    let seen = audit
        .iter()
        .rev()
        .find(|a| a.path.starts_with("/api/v1/namespaces/default/pods"))
        .unwrap();
    assert_eq!(
        (seen.user.as_str(), seen.bearer),
        ("system:serviceaccount:default:app", true)
    );

    // A kubelet-style client certificate is forwarded as the node identity.
    let kubelet = s.client(None, true);
    assert_eq!(kubelet.get(ANY_NODE_READS).status, 200);
    let seen = last_audit(cloud, ANY_NODE_READS);
    assert_eq!(
        (seen.user.as_str(), seen.bearer),
        ("system:node:node-0", false)
    );

    // Another identity signed by the same CA is refused by the hub itself.
    let other =
        s.ca.client("system:node:someone-else", Some("system:nodes"));
    let r = Client::new(s.tls_addr, s.ca.cert_der(), None, Some(&other)).get(ANY_NODE_READS);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["kind"], "Status");
    // The right CN without O=system:nodes is no node credential.
    let no_group = s.ca.client("system:node:node-0", None);
    let r = Client::new(s.tls_addr, s.ca.cert_der(), None, Some(&no_group)).get(ANY_NODE_READS);
    assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("O=system:nodes")),
        "{}",
        r.json()
    );
    // ... and a certificate from an unknown CA does not get past TLS.
    let foreign = TestCa::new("foreign").client("system:node:node-0", None);
    assert!(
        Client::new(s.tls_addr, s.ca.cert_der(), None, Some(&foreign))
            .request("GET", ANY_NODE_READS, &[], &[])
            .is_err()
    );

    // The plain explicit listener speaks as the node for clients without credentials.
    let mut tcp = TcpStream::connect(s.plain_addr).unwrap();
    tcp.write_all(
        b"GET /apis/storage.k8s.io/v1/csidrivers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = last_audit(cloud, ANY_NODE_READS);
    assert!(!seen.bearer && seen.user == "system:node:node-0");
}

#[test]
fn kubectl_over_http2_and_a_client_over_http11() {
    let s = setup(1);
    let dir = TempDir::new("kc");
    let kc = dir.path().join("kubeconfig");
    hub_tests::apiserver::write_kubeconfig(
        &kc,
        &format!("https://{}", s.tls_addr),
        &s.ca.cert_pem(),
        hub_tests::apiserver::Credentials::Token(ADMIN_TOKEN),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &kc)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run(&["get", "pods", "-o", "name"]).lines().count(), 6);
    assert!(run(&["api-resources"]).contains("endpointslices"));
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: through-hub\ndata:\n  k: v\n";
    let mut apply = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .env("KUBECONFIG", &kc)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(cm.as_bytes())
        .unwrap();
    assert!(apply.wait().unwrap().success());
    assert_eq!(
        run(&["logs", "pod-0-0"]).lines().next(),
        Some("pod-0-0/main line 1")
    );
    // exec with stdin: an upgrade spliced through the hub both ways, over websocket (what
    // kubectl speaks first) and over SPDY/3.1 (what older clients and client-go speak).
    for websockets in ["true", "false"] {
        let mut exec = Command::new("kubectl")
            .args(["exec", "-i", "pod-0-0", "--", "cat"])
            .env("KUBECONFIG", &kc)
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", websockets)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        exec.stdin
            .take()
            .unwrap()
            .write_all(b"through the hub\n")
            .unwrap();
        let out = exec.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "through the hub\n",
            "websockets={websockets}"
        );
    }
    // kubectl spoke HTTP/2 to the hub (it prefers h2 when offered).
    let http2 = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version}",
            "--http2",
            "--cacert",
        ])
        .arg(&s.pki.ca)
        .args([
            "-H",
            &format!("Authorization: Bearer {ADMIN_TOKEN}"),
            &format!("https://{}/api/v1/pods", s.tls_addr),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&http2.stdout), "2");
    let c = s.client(Some(ADMIN_TOKEN), false);
    assert_eq!(
        c.get("/api/v1/namespaces/default/configmaps/through-hub")
            .json()["data"]["k"],
        "v"
    );
}

#[test]
fn a_10k_event_watch_arrives_complete_and_in_order() {
    let s = setup(1);
    let c = s.client(Some(ADMIN_TOKEN), false);
    let rv = s.clouds[0].state.store.current_rv();
    let mut w = c.stream(&format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
    ));
    assert_eq!(w.status, 200);
    let store = &s.clouds[0].state.store;
    for i in 0..10_000 {
        seed::configmap(
            store,
            "default",
            &format!("cm-{i}"),
            json!({"i": i.to_string()}),
        );
    }
    let mut last = rv;
    for i in 0..10_000 {
        let ev = w
            .next_event(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("event {i} missing"));
        assert_eq!(ev["type"], "ADDED");
        let this: u64 = ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(this > last, "out of order at {i}");
        assert_eq!(ev["object"]["metadata"]["name"], format!("cm-{i}"));
        last = this;
    }
}

#[test]
fn a_cloud_without_http2_is_reached_over_http11() {
    let s = setup_with(
        1,
        || Options {
            http1_only: true,
            ..Default::default()
        },
        StandIn::url,
    );
    let cloud = &s.clouds[0];
    let c = s.client(Some(ADMIN_TOKEN), false);
    let pods = c.get("/api/v1/pods");
    assert_eq!(pods.status, 200, "{}", String::from_utf8_lossy(&pods.body));
    assert!(last_audit(cloud, "/api/v1/pods").bearer);
    let kubelet = s.client(None, true);
    assert_eq!(kubelet.get(ANY_NODE_READS).status, 200);
    assert_eq!(
        last_audit(cloud, ANY_NODE_READS).user,
        format!("system:node:{NODE}")
    );
    // A watch streams over the HTTP/1.1 connection too.
    let rv = cloud.state.store.current_rv();
    let mut w = c.stream(&format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
    ));
    assert_eq!(w.status, 200);
    seed::configmap(&cloud.state.store, "default", "over-h1", json!({}));
    let ev = w.next_event(Duration::from_secs(10)).expect("the event");
    assert_eq!(ev["object"]["metadata"]["name"], "over-h1");
}

/// A list that may be large reaches the cloud over HTTP/1.1, where kube-apiserver writes it
/// in full buffers; one object, a one-item list and a watch share the HTTP/2 connection.
/// The client gets the cloud's answer byte for byte either way.
#[test]
fn whole_lists_reach_the_cloud_over_http11_and_the_rest_over_http2() {
    let s = setup(1);
    let cloud = &s.clouds[0];
    for i in 0..30 {
        let data = json!({"i": i.to_string()});
        seed::configmap(&cloud.state.store, "default", &format!("cm-{i}"), data);
    }
    let c = s.client(Some(ADMIN_TOKEN), false);
    let direct = Client::new(cloud.addr, s.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let over = |path: &str, http2: bool| {
        let (through, straight) = (c.get(path), direct.get(path));
        assert_eq!(through.status, 200, "{path}");
        assert_eq!(
            through.body, straight.body,
            "{path}: the cloud's answer as it is"
        );
        // The hub's request, then the direct one.
        let asked: Vec<_> = cloud
            .audit()
            .into_iter()
            .filter(|a| a.path == path)
            .collect();
        let [.., through_hub, _] = asked.as_slice() else {
            panic!("{path}: the cloud saw {asked:?}");
        };
        assert_eq!(through_hub.http2, http2, "{path}: over HTTP/2 is {http2}");
    };
    let cms = "/api/v1/namespaces/default/configmaps";
    over(cms, false);
    over(&format!("{cms}?limit=500"), false);
    over(&format!("{cms}?limit=1"), true);
    over(&format!("{cms}/cm-7"), true);
    let rv = cloud.state.store.current_rv();
    let watch = format!("{cms}?watch=true&resourceVersion={rv}");
    let mut w = c.stream(&watch);
    assert_eq!(w.status, 200);
    assert!(last_audit(cloud, &watch).http2, "a watch over HTTP/2");
    seed::configmap(&cloud.state.store, "default", "late", json!({}));
    let ev = w.next_event(Duration::from_secs(10)).expect("the event");
    assert_eq!(ev["object"]["metadata"]["name"], "late");
}

/// A TCP relay in front of a cloud server that can go silent on the connections it carries,
/// as a dead link does: bytes go in, nothing comes out, no FIN or RST. New connections pass.
struct DeadLink {
    addr: SocketAddr,
    target: Arc<std::sync::Mutex<Option<SocketAddr>>>,
    accepted: Arc<AtomicUsize>,
    /// Connections numbered below this are silent.
    silent_below: Arc<AtomicUsize>,
}

impl DeadLink {
    fn start() -> DeadLink {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let link = DeadLink {
            addr: listener.local_addr().unwrap(),
            target: Default::default(),
            accepted: Default::default(),
            silent_below: Default::default(),
        };
        let (target, accepted, silent_below) = (
            link.target.clone(),
            link.accepted.clone(),
            link.silent_below.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().flatten().take(100) {
                let n = accepted.fetch_add(1, Ordering::SeqCst);
                let Some(to) = *target.lock().unwrap() else {
                    continue;
                };
                let Ok(upstream) = TcpStream::connect(to) else {
                    continue;
                };
                let pairs = [
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, client),
                ];
                for (mut from, mut into) in pairs {
                    let silent_below = silent_below.clone();
                    // Ends when either side closes (the hub or the stand-in stops).
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(len @ 1..) = from.read(&mut buf) {
                            let swallowed = n < silent_below.load(Ordering::SeqCst);
                            if !swallowed && into.write_all(&buf[..len]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        link
    }

    /// The URL to give the hub for `cloud`, relayed through this link.
    fn front(&self, cloud: &StandIn) -> String {
        *self.target.lock().unwrap() = Some(cloud.addr);
        format!("https://{}", self.addr)
    }

    /// Every connection open now goes silent.
    fn cut(&self) {
        let accepted = self.accepted.load(Ordering::SeqCst);
        self.silent_below.store(accepted, Ordering::SeqCst);
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

#[test]
fn a_connection_a_dead_link_left_silent_is_replaced() {
    let link = DeadLink::start();
    let s = setup_with(1, Options::default, |cloud| link.front(cloud));
    let c = s.client(Some(ADMIN_TOKEN), false);
    assert_eq!(c.get("/api/v1/pods").status, 200);
    link.cut();
    let cut_at = link.connections();
    let path = "/api/v1/namespaces/kube-system/pods";
    // Until the hub gives up the silent connection, nothing it sends there arrives (the
    // hub answers from its cache or with a 503 meanwhile).
    wait_for(
        "a request reaching the cloud after the cut",
        Duration::from_secs(20),
        || {
            let _ = c.request("GET", path, &[], &[]);
            s.clouds[0]
                .audit()
                .iter()
                .any(|a| a.path == path)
                .then_some(())
        },
    );
    assert!(link.connections() > cut_at, "a new connection carried it");
    let healthy = || s.hub.status()["cloud"][0]["healthy"].as_bool().unwrap();
    wait_for("the cloud healthy", Duration::from_secs(5), || {
        healthy().then_some(())
    });
}

#[test]
fn disconnected_watches_leave_no_tasks_behind() {
    let s = setup(1);
    let tasks = || s.hub.status()["tasks"].as_u64().unwrap();
    let c = s.client(Some(ADMIN_TOKEN), false);
    // Warm up pools, then take the baseline.
    for _ in 0..3 {
        let mut w = c.stream("/api/v1/namespaces/default/pods?watch=true&resourceVersion=0");
        let _ = w.next_event(Duration::from_secs(5));
    }
    let baseline = wait_for("a quiet hub", Duration::from_secs(10), || {
        let a = tasks();
        std::thread::sleep(Duration::from_millis(200));
        (a == tasks()).then_some(a)
    });
    std::thread::scope(|scope| {
        for _ in 0..10 {
            scope.spawn(|| {
                let c = s.client(Some(ADMIN_TOKEN), false);
                for _ in 0..100 {
                    let mut w =
                        c.stream("/api/v1/namespaces/default/pods?watch=true&resourceVersion=0");
                    assert!(w.next_event(Duration::from_secs(5)).is_some());
                    // Dropping the stream closes the client connection mid-watch.
                }
            });
        }
    });
    let after = wait_for(
        "the task count back at its baseline",
        Duration::from_secs(20),
        || {
            let t = tasks();
            (t <= baseline).then_some(t)
        },
    );
    assert!(
        after <= baseline,
        "{after} tasks after 1000 watches, baseline {baseline}"
    );
    assert_eq!(s.hub.status()["open_streams"], 0);
}

#[test]
fn failover_between_two_cloud_servers_within_a_second() {
    let s = setup(2);
    let c = s.client(Some(ADMIN_TOKEN), false);
    let healthy = |i: usize| s.hub.status()["cloud"][i]["healthy"].as_bool().unwrap();
    wait_for("both servers healthy", Duration::from_secs(5), || {
        (healthy(0) && healthy(1)).then_some(())
    });
    s.clouds[0].stop_listening();
    let killed = Instant::now();
    let (mut failures, mut requests) = (0, 0);
    let mut unhealthy_after = None;
    while killed.elapsed() < Duration::from_secs(2) {
        let r = c.request("GET", "/api/v1/namespaces/default/pods", &[], &[]);
        requests += 1;
        if !matches!(&r, Ok(r) if r.status == 200) {
            failures += 1;
        }
        if unhealthy_after.is_none() && !healthy(0) {
            unhealthy_after = Some(killed.elapsed());
        }
    }
    assert!(
        failures <= 1,
        "{failures} of {requests} requests failed during failover"
    );
    let detected = unhealthy_after.expect("server 0 marked unhealthy");
    assert!(
        detected <= Duration::from_millis(1500),
        "detected after {detected:?}"
    );
    eprintln!(
        "failover: {requests} requests, {failures} failed, server marked unhealthy after {detected:?}"
    );
    s.clouds[0].start_listening().unwrap();
    wait_for("server 0 healthy again", Duration::from_secs(5), || {
        healthy(0).then_some(())
    });
    let text = Command::new(hub_tests::hub_bin())
        .args(["status", "--admin", &s.hub.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("2/2 servers healthy"), "{text}");
}

#[test]
fn with_the_cloud_down_reads_get_a_503_naming_the_route() {
    let s = setup(1);
    let c = s.client(Some(ADMIN_TOKEN), false);
    assert_eq!(c.get("/api/v1/pods").status, 200);
    s.clouds[0].stop_listening();
    let r = wait_for("the cloud marked unhealthy", Duration::from_secs(3), || {
        let r = c.get("/api/v1/pods");
        (r.status == 503
            && r.json()["message"]
                .as_str()
                .unwrap()
                .contains("local-cache"))
        .then_some(r)
    });
    assert_eq!(r.json()["kind"], "Status");
    // Writes and exec go to the cloud only, and say so.
    let w = c.send_json(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &json!({"metadata": {"name": "x"}}),
    );
    assert_eq!(w.status, 503);
    assert!(
        w.json()["message"].as_str().unwrap().contains("cloud"),
        "{}",
        w.json()
    );
    let metrics = s.hub.admin_get("/metrics");
    assert!(
        metrics
            .contains("hub_proxy_requests_total{route=\"local-cache\",verb=\"list\",code=\"503\""),
        "{metrics}"
    );
    assert!(metrics.contains("hub_upstream_healthy{server="));
    let errors = s.hub.status()["last_errors"].as_array().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| e[1].as_str().unwrap().contains("local-cache")),
        "{errors:?}"
    );
    let errors = s.hub.status()["last_errors"].as_array().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| e[1].as_str().unwrap().contains("local-cache")),
        "{errors:?}"
    );
}

#[test]
fn bad_input_gets_clear_errors_and_the_hub_stays_up() {
    let s = setup(1);
    let c = s.client(Some(ADMIN_TOKEN), false);
    // Garbage instead of a TLS handshake, and an HTTP request that never ends (slowloris).
    let mut junk = TcpStream::connect(s.tls_addr).unwrap();
    junk.write_all(b"\x16\x03\x01\xff\xffnot really tls")
        .unwrap();
    let slow: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(s.plain_addr).unwrap())
        .collect();
    for mut t in &slow {
        t.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
    }
    // Oversized headers: refused with 431, not a crash.
    let big = "a".repeat(100 * 1024);
    let mut tcp = TcpStream::connect(s.plain_addr).unwrap();
    tcp.write_all(
        format!("GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    // Malformed request line.
    let mut tcp = TcpStream::connect(s.plain_addr).unwrap();
    tcp.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"));
    // An oversized body is refused before it reaches the cloud.
    let r = c
        .request(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            &[("Content-Type", "application/json")],
            &vec![b' '; 4 * 1024 * 1024],
        )
        .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["kind"], "Status");
    // Through all that, normal service continues.
    assert_eq!(c.get("/api/v1/pods").status, 200);
    drop(slow);
}

#[test]
fn an_upstream_that_sends_garbage_gets_a_clear_error() {
    // A "cloud" that answers every connection with junk.
    let junk = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let junk_addr = junk.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in junk.incoming().flatten().take(200) {
            let _ = conn.write_all(b"this is not HTTP\r\n\r\n");
        }
    });
    let (plain_port, admin_port) = (free_port(), free_port());
    let config = HubConfig {
        servers: vec![format!("http://{junk_addr}")],
        plain: plain_port,
        admin: format!("127.0.0.1:{admin_port}"),
        ..Default::default()
    };
    let hub = HubProc::start_yaml(None, &config.admin, None, |_, cache| config.yaml(cache));
    let mut tcp = TcpStream::connect(("127.0.0.1", plain_port)).unwrap();
    tcp.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let status: Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(status["kind"], "Status");
    assert!(hub.try_status().is_some(), "the hub is still up");
}

#[test]
fn certificates_rotate_without_dropping_connections() {
    let s = setup(1);
    let c = s.client(Some(ADMIN_TOKEN), false);
    let before = c.peer_certificate().unwrap();
    let rv = s.clouds[0].state.store.current_rv();
    let mut w = c.stream(&format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
    ));

    // Rotate the serving certificate in place; new handshakes get it, the watch lives on.
    let fresh = s.ca.server(&["127.0.0.1", "localhost"]);
    std::fs::write(&s.pki.serving.1, &fresh.key_pem).unwrap();
    std::fs::write(&s.pki.serving.0, &fresh.cert_pem).unwrap();
    wait_for(
        "the new serving certificate",
        Duration::from_secs(15),
        || {
            let now = c.peer_certificate().ok()?;
            (now != before).then_some(())
        },
    );
    assert_eq!(c.peer_certificate().unwrap(), fresh.cert_der);
    seed::configmap(
        &s.clouds[0].state.store,
        "default",
        "after-rotation",
        json!({}),
    );
    let ev = w
        .next_event(Duration::from_secs(5))
        .expect("the open watch survived the rotation");
    assert_eq!(ev["object"]["metadata"]["name"], "after-rotation");

    // Rotate the node identity: kubelet-style requests go out with the new certificate.
    let rotated =
        s.ca.client("system:node:rotated-cert", Some("system:nodes"));
    std::fs::write(&s.pki.node.1, &rotated.key_pem).unwrap();
    std::fs::write(&s.pki.node.0, &rotated.cert_pem).unwrap();
    let kubelet = s.client(None, true);
    wait_for(
        "the cloud to see the rotated node certificate",
        Duration::from_secs(15),
        || {
            assert_eq!(kubelet.get(ANY_NODE_READS).status, 200);
            let seen = s.clouds[0]
                .audit()
                .into_iter()
                .rev()
                .find(|a| a.path == ANY_NODE_READS)?;
            (seen.user == "system:node:rotated-cert").then_some(())
        },
    );
}

/// A cloud whose nodes may do anything (CSRs, Events), with the test node and its PKI.
fn csr_cloud() -> Scenario {
    let s = Scenario::new(&[]);
    s.cloud
        .state
        .auth
        .write()
        .unwrap()
        .allow(Rule::new("system:nodes", &["*"], &["*"], &["*"]));
    seed::node(&s.cloud.state.store, NODE);
    s
}

/// Without tls.certFile the hub asks the cloud for its serving certificate (a CSR with the
/// node identity, signer kubernetes.io/kubelet-serving), waits for approval, stores the
/// pair owner-only, serves with it, and after a restart with the cloud down serves at once
/// from the stored pair.
#[test]
fn serving_certificate_by_csr_and_offline_restart() {
    use std::os::unix::fs::PermissionsExt;
    let Scenario {
        ca,
        cloud,
        dir,
        pki,
        ..
    } = csr_cloud();
    let approver_files = approver_identity(&cloud, dir.path());
    let cache = dir.path().join("cache");
    let (tls_port, plain_port, admin_port) = (free_port(), free_port(), free_port());
    let config = HubConfig {
        servers: vec![cloud.url()],
        ca: Some(&pki.ca),
        node: Some(&pki.node),
        client_ca: Some(&pki.ca),
        plain: plain_port,
        tls: Some(tls_port),
        admin: format!("127.0.0.1:{admin_port}"),
        ..Default::default()
    };
    let admin = config.admin.clone();
    let yaml = |_: &Path, _: &Path| config.yaml(&cache);
    // `hub approver`, as it runs in the cloud, approves the hub's CSR: every name in it is
    // one the node's hub needs.
    let mut approver = Command::new(hub_tests::hub_bin());
    approver
        .args(["approver", "--interval", "1", "--server", &cloud.url()])
        .args(approver_files.args());
    let approver = hub_tests::process::Proc::spawn(approver, "hub approver");
    let hub = HubProc::start_yaml(None, &admin, None, yaml);
    drop(approver);
    let csrs = Client::new(cloud.addr, ca.cert_der(), Some(ADMIN_TOKEN), None)
        .get("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        .json();
    let csr = &csrs["items"][0];
    let approved = &csr["status"]["conditions"][0];
    assert_eq!(
        (&approved["type"], &approved["reason"]),
        (&json!("Approved"), &json!("HubApproverApproved")),
        "{csr}"
    );
    let csr_name = csr["metadata"]["name"].as_str().unwrap().to_string();

    let audit = cloud.audit();
    assert!(audit.iter().any(|a| a.method == "POST"
        && a.path.contains("certificatesigningrequests")
        && a.user == "system:node:node-0"));
    let c = Client::new(
        format!("127.0.0.1:{tls_port}").parse().unwrap(),
        ca.cert_der(),
        Some(ADMIN_TOKEN),
        None,
    );
    let served = c.peer_certificate().unwrap();
    let (cn, _) = hub::x509::subject_cn_and_orgs(&served).unwrap();
    assert_eq!(cn, "system:node:node-0");
    // Short-lived, as asked (24 h; the stand-in backdates a minute as signers do).
    let (from, to) = hub::x509::validity(&served).unwrap();
    assert!(to - from <= 24 * 3600 + 60, "lifetime {} s", to - from);
    assert_eq!(
        c.get("/api/v1/pods").status,
        200,
        "CSR {csr_name} certificate serves"
    );
    let key = cache.join("pki/hub-serving.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(cache.join("pki"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    // Restart with the cloud gone: the stored pair serves immediately.
    drop(hub);
    cloud.stop_listening();
    let started = Instant::now();
    let _hub = HubProc::start_yaml(None, &admin, None, yaml);
    eprintln!("offline restart ready after {:?}", started.elapsed());
    assert_eq!(c.peer_certificate().unwrap(), served);
}

/// Without an approver the hub's CSR waits, and the hub says so where an operator looks:
/// `hub status`, its readiness probe's answer, and an Event on its pod. Approved by hand,
/// it becomes ready.
#[test]
fn a_serving_certificate_waiting_for_approval_says_so() {
    let Scenario {
        ca,
        cloud,
        dir,
        pki,
        ..
    } = csr_cloud();
    let cache = dir.path().join("cache");
    let config = HubConfig {
        servers: vec![cloud.url()],
        ca: Some(&pki.ca),
        node: Some(&pki.node),
        client_ca: Some(&pki.ca),
        plain: free_port(),
        tls: Some(free_port()),
        admin: format!("127.0.0.1:{}", free_port()),
        ..Default::default()
    };
    let pod = [
        ("POD_NAME", "hub-x7k2p"),
        ("POD_NAMESPACE", "kube-system"),
        ("POD_UID", "0c1d"),
    ];
    let mut hub = HubProc::spawn_yaml(None, &config.admin, None, &pod, |_, _| config.yaml(&cache));
    let admin = Client::new(cloud.addr, ca.cert_der(), Some(ADMIN_TOKEN), None);
    let csr = wait_for("the CSR", Duration::from_secs(20), || {
        let csrs = admin
            .get("/apis/certificates.k8s.io/v1/certificatesigningrequests")
            .json();
        csrs["items"][0]["metadata"]["name"]
            .as_str()
            .map(String::from)
    });
    let pending = wait_for(
        "hub status to name the CSR",
        Duration::from_secs(20),
        || {
            hub.try_status()?["serving_certificate"]
                .as_str()
                .map(String::from)
        },
    );
    assert!(
        pending.contains(&csr) && pending.contains("waits for approval"),
        "{pending}"
    );
    let readyz = hub.admin_get("/readyz");
    assert!(
        readyz.starts_with("HTTP/1.1 503") && readyz.contains(&csr),
        "{readyz}"
    );
    let text = hub
        .cli(&["status", "--admin", &config.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("serving cert:") && text.contains(&csr),
        "{text}"
    );
    // The Event on the pod, after the hub waited 10 s.
    let event = wait_for("the Event on the pod", Duration::from_secs(30), || {
        let events = admin.get("/api/v1/namespaces/kube-system/events").json();
        events["items"]
            .as_array()?
            .iter()
            .find(|e| e["reason"] == "ServingCertificatePending")
            .cloned()
    });
    assert_eq!(event["type"], "Warning");
    assert_eq!(
        event["involvedObject"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "hub-x7k2p",
            "namespace": "kube-system", "uid": "0c1d"})
    );
    assert!(event["message"].as_str().unwrap().contains(&csr), "{event}");

    // Approved by hand: signed, served, ready, and the note is gone.
    let path = format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr}");
    let mut approved = admin.get(&path).json();
    approved["status"]["conditions"] = json!([{"type": "Approved", "status": "True",
        "reason": "ByHand", "message": "approved by the operator"}]);
    let put = admin
        .request(
            "PUT",
            &format!("{path}/approval"),
            &[("Content-Type", "application/json")],
            approved.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    hub.wait_ready();
    assert_eq!(hub.status()["serving_certificate"], Value::Null);
}

/// The files `hub approver` reaches the stand-in with: its CA and the token of a service
/// account with the RBAC deploy/base/approver.yaml grants.
struct ApproverFiles {
    ca: std::path::PathBuf,
    token: std::path::PathBuf,
}

impl ApproverFiles {
    fn args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--ca-file".into(),
            self.ca.clone().into(),
            "--token-file".into(),
            self.token.clone().into(),
        ]
    }
}

fn approver_identity(cloud: &StandIn, dir: &Path) -> ApproverFiles {
    let user = "system:serviceaccount:kube-system:hub-approver";
    {
        let mut auth = cloud.state.auth.write().unwrap();
        auth.add_token("approver-token", user, &["system:serviceaccounts"]);
        let csrs = "certificatesigningrequests";
        auth.allow(Rule::new(user, &["get", "list", "watch"], &[csrs], &[""]));
        auth.allow(Rule::new(
            user,
            &["update"],
            &["certificatesigningrequests/approval"],
            &[""],
        ));
        auth.allow(Rule::new(user, &["get"], &["nodes"], &[""]));
        auth.allow(Rule::new(user, &["get"], &["services"], &["default"]));
    }
    let files = ApproverFiles {
        ca: dir.join("approver-ca.crt"),
        token: dir.join("approver-token"),
    };
    std::fs::write(&files.ca, cloud.ca.cert_pem()).unwrap();
    std::fs::write(&files.token, "approver-token\n").unwrap();
    files
}

/// `hub approver` denies a node's serving CSR with a name its hub does not need, and one
/// for another node's identity, with the reason on the CSR; nothing is signed for them.
#[test]
fn the_approver_denies_names_a_nodes_hub_does_not_need() {
    let cloud = StandIn::start("127.0.0.1:0".parse().unwrap(), Options::default()).unwrap();
    cloud.state.auth.write().unwrap().add_test_identities();
    let dir = TempDir::new("approver");
    let files = approver_identity(&cloud, dir.path());
    seed::node(&cloud.state.store, "edge-1");
    let node = cloud.ca.client("system:node:edge-1", Some("system:nodes"));
    let kubelet = Client::new(cloud.addr, cloud.ca.cert_der(), None, Some(&node));
    let ask = |cn: &str, sans: &[&str]| -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        use base64::Engine;
        let body = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "t-"},
            "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem),
                     "signerName": "kubernetes.io/kubelet-serving",
                     "usages": ["digital signature", "key encipherment", "server auth"]}});
        let r = kubelet.send_json(
            "POST",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            &body,
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["metadata"]["name"].as_str().unwrap().to_string()
    };
    let hub_names = [
        "kubernetes.default.svc",
        "localhost",
        "127.0.0.1",
        "169.254.2.1",
    ];
    let good = ask("system:node:edge-1", &hub_names);
    let extra = ask(
        "system:node:edge-1",
        &[&hub_names[..], &["apiserver.example.com"]].concat(),
    );
    let other = ask("system:node:edge-2", &hub_names);
    let mut approver = Command::new(hub_tests::hub_bin());
    approver
        .args(["approver", "--once", "--server", &cloud.url()])
        .args(files.args());
    let out = process::output(approver, "hub approver --once");
    assert_eq!(out.trim(), "approved 1, denied 2");
    let admin = Client::new(cloud.addr, cloud.ca.cert_der(), Some(ADMIN_TOKEN), None);
    let csr = |name: &str| {
        admin
            .get(&format!(
                "/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"
            ))
            .json()
    };
    assert!(csr(&good)["status"]["certificate"].is_string());
    for (name, why) in [
        (&extra, "apiserver.example.com"),
        (&other, "system:node:edge-2"),
    ] {
        let c = csr(name);
        let denied = &c["status"]["conditions"][0];
        assert_eq!(denied["type"], "Denied", "{c}");
        assert!(denied["message"].as_str().unwrap().contains(why), "{c}");
        assert!(c["status"]["certificate"].is_null());
    }
}

/// A scenario that runs against a real kube-apiserver when HUB_TEST_APISERVER is set (the
/// stand-in otherwise): the hub, with no serving files of its own for the cloud side but
/// the cloud's CA, proxies namespace/configmap CRUD, lists and a watch for a bearer token.
#[test]
fn crud_list_watch_through_the_hub_against_any_apiserver() {
    use hub_tests::cloud::TestCloud;
    let cloud = TestCloud::from_env_or_standin();
    let dir = TempDir::new("any");
    // The hub's own serving certificate comes from a local test CA; clients trust it.
    let hub_ca = TestCa::new("hub-ca");
    let (serving_crt, serving_key) = hub_ca
        .server(&["127.0.0.1"])
        .write(dir.path(), "serving")
        .unwrap();
    let cloud_ca = dir.path().join("cloud-ca.crt");
    std::fs::write(&cloud_ca, &cloud.ca_pem).unwrap();
    let (tls_port, plain_port, admin_port) = (free_port(), free_port(), free_port());
    let config = HubConfig {
        servers: vec![cloud.url.clone()],
        ca: Some(&cloud_ca),
        serving: Some((&serving_crt, &serving_key)),
        plain: plain_port,
        tls: Some(tls_port),
        admin: format!("127.0.0.1:{admin_port}"),
        ..Default::default()
    };
    let _hub = HubProc::start_yaml(None, &config.admin, None, |_, cache| config.yaml(cache));
    let c = Client::new(
        format!("127.0.0.1:{tls_port}").parse().unwrap(),
        hub_ca.cert_der(),
        Some(&cloud.token),
        None,
    );
    let ns = hub_tests::unique("hubscn");
    let created = c.send_json(
        "POST",
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    );
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    let list = c.get(&base).json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c.stream(&format!("{base}?watch=true&resourceVersion={rv}"));
    for i in 0..5 {
        let r = c.send_json("POST", &base, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}"), "labels": {"i": i.to_string()}}, "data": {"i": i.to_string()}}));
        assert_eq!(r.status, 201);
    }
    for i in 0..5 {
        let ev = w.next_event(Duration::from_secs(10)).expect("watch event");
        assert_eq!(
            (
                ev["type"].as_str(),
                ev["object"]["metadata"]["name"].as_str()
            ),
            (Some("ADDED"), Some(format!("cm-{i}").as_str()))
        );
    }
    let selected = c
        .get(&format!("{base}?labelSelector=i%20in%20(1,3)"))
        .json();
    assert_eq!(selected["items"].as_array().unwrap().len(), 2);
    let page = c.get(&format!("{base}?limit=2")).json();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert!(
        page["metadata"]["continue"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(
        c.request("DELETE", &format!("/api/v1/namespaces/{ns}"), &[], &[])
            .unwrap()
            .status,
        200
    );
}

/// A CSR-issued serving certificate is renewed before it expires, without the hub being
/// restarted: the stand-in signs 6-second certificates, so renewal is due after ~5 s.
#[test]
fn csr_certificate_is_renewed_before_expiry() {
    let ca = Arc::new(TestCa::new("cloud-ca"));
    let options = Options {
        auto_approve_csrs: true,
        csr_cert_lifetime: Duration::from_secs(6),
        ..Options::default()
    };
    let cloud =
        StandIn::start_with_ca("127.0.0.1:0".parse().unwrap(), options, ca.clone()).unwrap();
    cloud.state.auth.write().unwrap().add_test_identities();
    let dir = TempDir::new("renew");
    let pki = ca.write_hub_pki(dir.path(), NODE, &[]).unwrap();
    let (tls_port, plain_port, admin_port) = (free_port(), free_port(), free_port());
    let config = HubConfig {
        servers: vec![cloud.url()],
        ca: Some(&pki.ca),
        node: Some(&pki.node),
        plain: plain_port,
        tls: Some(tls_port),
        admin: format!("127.0.0.1:{admin_port}"),
        ..Default::default()
    };
    let _hub = HubProc::start_yaml(None, &config.admin, None, |_, cache| config.yaml(cache));
    let c = Client::new(
        format!("127.0.0.1:{tls_port}").parse().unwrap(),
        ca.cert_der(),
        Some(ADMIN_TOKEN),
        None,
    );
    let first = c.peer_certificate().unwrap();
    let (first_issued, first_expiry) = hub::x509::validity(&first).unwrap();
    let renewed = wait_for(
        "a renewed serving certificate",
        Duration::from_secs(20),
        || {
            let now = c.peer_certificate().ok()?;
            (now != first).then_some(now)
        },
    );
    // Judged by the certificates' own dates, not by how fast the listener picked it up:
    // issued before the old one expired, but not before 80 % of its life (4.8 of 6 s).
    let (issued, expiry) = hub::x509::validity(&renewed).unwrap();
    assert!(expiry > first_expiry, "the new certificate lives longer");
    assert!(issued <= first_expiry, "renewed before the old one expired");
    assert!(
        issued >= first_issued + 4,
        "renewed {}s after the first was issued",
        issued - first_issued
    );
    assert_eq!(c.get("/api/v1/pods").status, 200);
}
