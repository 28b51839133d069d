//! The Kubernetes API stand-in as a process, for the demo, benchmarks and manual use.
//!
//!   hub-apiserver --listen 127.0.0.1:6443 --dir DIR [--nodes N] [--pods-per-node M]
//!                 [--services K] [--configmaps C] [--secrets S] [--history EVENTS] [--bookmark-ms MS]
//!                 [--san NAME]... [--hub-pki NODE]... [--approve-csrs] [--bookmark-at-deadline]
//!                 [--reader-token NAME]...
//!
//! Writes DIR/ca.crt and DIR/admin.kubeconfig (admin token), seeds the store, prints
//! "ready" and serves until SIGTERM or SIGINT. With --hub-pki NODE it also writes what a
//! hub in front of it needs (hub-serving.crt/key, hub-node.crt/key for system:node:NODE,
//! kubelet.crt/key for a kubelet-style client) — in DIR for the first node, in DIR/NODE
//! for every node given — and accepts two test identities:
//! token `pod-token` (user system:serviceaccount:default:app, may get/list/watch pods, logs,
//! configmaps, services, endpoints and endpointslices in default, write configmaps
//! and exec into pods there) and node identities what the Node authorizer gives them.
//! With --approve-csrs it approves and signs CertificateSigningRequests as they arrive.
//! With --bookmark-at-deadline a watch of 3 s or more gets a bookmark as it ends, as from
//! kube-apiserver 1.36's watch cache (with --bookmark-ms 60000, its bookmarks' timing).
//! With --reader-token NAME, token NAME is the service account kube-system:NAME, which may
//! get, list and watch everything (a kube-proxy, a CoreDNS, a CNI agent).
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use hub_tests::apiserver::{Options, StandIn, seed};

fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == flag)
        .map(|w| w[1].as_str())
}

fn num(args: &[String], flag: &str, default: usize) -> usize {
    arg(args, flag).map_or(default, |v| {
        v.parse().unwrap_or_else(|_| {
            eprintln!("hub-apiserver: {flag} needs a number, got {v}");
            std::process::exit(2)
        })
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: hub-apiserver --listen ADDR --dir DIR [--nodes N] [--pods-per-node M] [--services K] [--configmaps C] [--secrets S] [--history EVENTS] [--bookmark-ms MS] [--san NAME]... [--hub-pki NODE]... [--approve-csrs] [--bookmark-at-deadline] [--reader-token NAME]..."
        );
        return;
    }
    let listen: SocketAddr = arg(&args, "--listen")
        .unwrap_or("127.0.0.1:6443")
        .parse()
        .unwrap_or_else(|_| {
            eprintln!("hub-apiserver: --listen needs ip:port");
            std::process::exit(2)
        });
    let Some(dir) = arg(&args, "--dir").map(PathBuf::from) else {
        eprintln!("hub-apiserver: --dir is required");
        std::process::exit(2)
    };
    let options = Options {
        history_limit: num(&args, "--history", 100_000),
        bookmark_interval: Duration::from_millis(num(&args, "--bookmark-ms", 1000) as u64),
        sans: args
            .windows(2)
            .filter(|w| w[0] == "--san")
            .map(|w| w[1].clone())
            .collect(),
        auto_approve_csrs: args.iter().any(|a| a == "--approve-csrs"),
        bookmark_at_deadline: args.iter().any(|a| a == "--bookmark-at-deadline"),
        ..Options::default()
    };
    // Block the stop signals before any thread starts, so only sigwait below sees them.
    let set = libc_sigset();
    let standin = StandIn::start(listen, options).unwrap_or_else(|e| {
        eprintln!("hub-apiserver: cannot listen on {listen}: {e}");
        std::process::exit(1)
    });
    let store = &standin.state.store;
    let listen_ip = listen.ip().to_string();
    seed::cluster(
        store,
        num(&args, "--nodes", 0),
        num(&args, "--pods-per-node", 0),
    );
    for i in 0..num(&args, "--configmaps", 0) {
        seed::configmap(
            store,
            "default",
            &format!("cm-{i}"),
            serde_json::json!({"i": i.to_string()}),
        );
    }
    for i in 0..num(&args, "--services", 0) {
        seed::service(store, "default", &format!("svc-{i}"), 80);
    }
    for i in 0..num(&args, "--secrets", 0) {
        // "s3cr3t", base64 as the API carries it.
        seed::secret(
            store,
            "default",
            &format!("secret-{i}"),
            serde_json::json!({"password": "czNjcjN0"}),
        );
    }
    std::fs::create_dir_all(&dir).expect("create --dir");
    std::fs::write(dir.join("ca.crt"), standin.ca.cert_pem()).expect("write ca.crt");
    standin
        .write_kubeconfig(&dir.join("admin.kubeconfig"), None)
        .expect("write kubeconfig");
    // The hub answers for the same names and addresses as this server.
    let sans: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--san")
        .map(|w| w[1].as_str())
        .chain([listen_ip.as_str()])
        .collect();
    let nodes: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--hub-pki")
        .map(|w| w[1].as_str())
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        let own = dir.join(node);
        let dirs = if i == 0 {
            vec![dir.clone(), own]
        } else {
            vec![own]
        };
        for d in dirs {
            let pki = standin
                .ca
                .write_hub_pki(&d, node, &sans)
                .expect("write hub PKI");
            pki.kubelet
                .write(&d, "kubelet")
                .expect("write kubelet cert");
        }
    }
    if !nodes.is_empty() {
        standin.state.auth.write().unwrap().add_test_identities();
    }
    for w in args.windows(2).filter(|w| w[0] == "--reader-token") {
        let user = format!("system:serviceaccount:kube-system:{}", w[1]);
        let mut auth = standin.state.auth.write().unwrap();
        auth.add_token(&w[1], &user, &["system:serviceaccounts"]);
        auth.allow(hub_tests::apiserver::auth::Rule::new(
            &user,
            &["get", "list", "watch"],
            &["*"],
            &["*"],
        ));
    }
    println!("ready");
    // Serve until told to stop.
    let mut sig = 0;
    // SAFETY: sigwait on a set of signals blocked in this (only) thread group.
    unsafe { libc::sigwait(&set, &mut sig) };
    drop(standin);
}

fn libc_sigset() -> libc::sigset_t {
    // SAFETY: building and applying a signal mask with libc's own functions.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
