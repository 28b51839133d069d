//! Seed data: the namespaces every cluster has, and realistic nodes, pods, services with
//! endpointslices, configmaps and a secret for tests, the demo and benchmarks.
use serde_json::{Value, json};

use super::{
    resources,
    store::{Key, Store},
    time,
};

fn put(store: &Store, resource: &str, group: &str, ns: &str, mut obj: Value) {
    let id = resources::find(group, "v1", resource).expect("known resource");
    let r = resources::get(id);
    obj["apiVersion"] = json!(r.api_version());
    obj["kind"] = json!(r.kind);
    let name = obj["metadata"]["name"].as_str().expect("name").to_string();
    if !ns.is_empty() {
        obj["metadata"]["namespace"] = json!(ns);
    }
    obj["metadata"]["uid"] = json!(format!("seed-{resource}-{ns}-{name}"));
    obj["metadata"]["creationTimestamp"] = json!(time::now_rfc3339());
    let _ = store.create(
        Key {
            resource: id,
            namespace: ns.to_string(),
            name,
        },
        obj,
    );
}

/// default, kube-system, kube-public, kube-node-lease.
pub fn base(store: &Store) {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        put(
            store,
            "namespaces",
            "",
            "",
            json!({"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        );
    }
}

pub fn namespace(store: &Store, name: &str) {
    put(
        store,
        "namespaces",
        "",
        "",
        json!({"metadata": {"name": name}, "status": {"phase": "Active"}}),
    );
}

pub fn node(store: &Store, name: &str) {
    put(
        store,
        "nodes",
        "",
        "",
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "nodeInfo": {"kubeletVersion": "v1.32.0"}}
        }),
    );
}

pub fn pod(store: &Store, ns: &str, name: &str, node: &str, app: &str) {
    put(
        store,
        "pods",
        "",
        ns,
        json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.local/app:1", "resources": {}}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                "startTime": time::now_rfc3339(),
                "containerStatuses": [{
                    "name": "main", "image": "registry.local/app:1", "imageID": "registry.local/app@sha256:0", "ready": true,
                    "started": true, "restartCount": 0, "state": {"running": {"startedAt": time::now_rfc3339()}}
                }]
            }
        }),
    );
}

/// A service, its Endpoints and one EndpointSlice.
pub fn service(store: &Store, ns: &str, name: &str, port: u16) {
    put(
        store,
        "services",
        "",
        ns,
        json!({
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"type": "ClusterIP", "selector": {"app": name}, "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}
        }),
    );
    put(
        store,
        "endpoints",
        "",
        ns,
        json!({"metadata": {"name": name}, "subsets": []}),
    );
    put(
        store,
        "endpointslices",
        "discovery.k8s.io",
        ns,
        json!({
            "metadata": {"name": format!("{name}-abc12"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "endpoints": [], "ports": [{"name": "http", "port": port, "protocol": "TCP"}]
        }),
    );
}

/// An EndpointSlice of `default` as a client would create it (no endpoints yet).
pub fn endpointslice_object(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "endpoints": [], "ports": [{"name": "http", "port": port, "protocol": "TCP"}]
    })
}

pub fn configmap(store: &Store, ns: &str, name: &str, data: Value) {
    put(
        store,
        "configmaps",
        "",
        ns,
        json!({"metadata": {"name": name}, "data": data}),
    );
}

pub fn secret(store: &Store, ns: &str, name: &str, data_b64: Value) {
    put(
        store,
        "secrets",
        "",
        ns,
        json!({"metadata": {"name": name}, "type": "Opaque", "data": data_b64}),
    );
}

/// `nodes` nodes named node-0.., each running `pods_per_node` pods in `default`.
pub fn cluster(store: &Store, nodes: usize, pods_per_node: usize) {
    for n in 0..nodes {
        let node_name = format!("node-{n}");
        node(store, &node_name);
        for p in 0..pods_per_node {
            pod(
                store,
                "default",
                &format!("pod-{n}-{p}"),
                &node_name,
                &format!("app-{}", p % 10),
            );
        }
    }
}
