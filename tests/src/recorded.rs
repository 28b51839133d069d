//! Objects as real Kubernetes components write them, from the fixtures, made for a test's
//! own objects: the kubelet's pod status patch (`fixtures/wire/kube-apiserver-1.36/
//! patch-pod-status-strategic`) and what the endpoint controllers write
//! (`fixtures/controllers-1.36`).
use std::path::Path;

use serde_json::{Value, json};

/// A JSON file under `tests/fixtures/`.
pub fn fixture(path: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(path);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The two-way strategic merge patch a real kubelet 1.36 sent for a pod's status, made for
/// the pod `uid`: its Ready condition and phase.
pub fn kubelet_pod_status_patch(uid: &str, ready: &str, phase: &str) -> Value {
    let mut p = fixture("wire/kube-apiserver-1.36/patch-pod-status-strategic/request.body");
    assert!(p["status"]["$setElementOrder/conditions"].is_array(), "{p}");
    p["metadata"]["uid"] = uid.into();
    p["status"]["conditions"][0]["status"] = ready.into();
    p["status"]["phase"] = phase.into();
    p
}

/// The same patch after an offline restart: the pod runs again on `new_ip`, and the kubelet
/// says the IP change as its two-way patch does (the new one in order, the old one deleted).
pub fn kubelet_pod_restarted_patch(
    uid: &str,
    ready: &str,
    phase: &str,
    old_ip: &str,
    new_ip: &str,
) -> Vec<u8> {
    let mut p = kubelet_pod_status_patch(uid, ready, phase);
    p["status"]["$setElementOrder/podIPs"] = json!([{"ip": new_ip}]);
    p["status"]["podIP"] = new_ip.into();
    p["status"]["podIPs"] = json!([{"ip": new_ip}, {"$patch": "delete", "ip": old_ip}]);
    serde_json::to_vec(&p).unwrap()
}

/// A pod a controller names: (name, uid, IP).
pub type Target<'a> = (&'a str, &'a str, &'a str);

/// The metadata a controller writes that a test keeps: labels, annotations, generateName.
fn controller_meta(recorded: &Value, name: &str) -> Value {
    let mut meta = json!({"name": name});
    for k in ["labels", "annotations", "generateName"] {
        if let Some(v) = recorded["metadata"].get(k) {
            meta[k] = v.clone();
        }
    }
    meta
}

/// An EndpointSlice as the endpointslice controller 1.36 writes it (all endpoints ready on
/// `node`), named `name`, for the service `service` and these pods (namespace `ns`).
pub fn controller_endpointslice(
    ns: &str,
    name: &str,
    service: &str,
    node: &str,
    pods: &[Target],
) -> Value {
    let mut s = fixture("controllers-1.36/endpointslice.json");
    let template = s["endpoints"][0].clone();
    s["metadata"] = controller_meta(&s, name);
    s["metadata"]["labels"]["kubernetes.io/service-name"] = service.into();
    s["endpoints"] = pods
        .iter()
        .map(|(pod, uid, ip)| {
            let mut e = template.clone();
            e["addresses"] = json!([ip]);
            e["nodeName"] = node.into();
            e["targetRef"] = json!({"kind": "Pod", "namespace": ns, "name": pod, "uid": uid});
            e
        })
        .collect();
    s
}

/// The Endpoints the endpoint controller 1.36 writes for `service` (all pods ready on `node`).
pub fn controller_endpoints(ns: &str, service: &str, node: &str, pods: &[Target]) -> Value {
    let mut e = fixture("controllers-1.36/endpoints.json");
    let template = e["subsets"][0]["addresses"][0].clone();
    e["metadata"] = controller_meta(&e, service);
    e["subsets"][0]["addresses"] = pods
        .iter()
        .map(|(pod, uid, ip)| {
            let mut a = template.clone();
            a["ip"] = (*ip).into();
            a["nodeName"] = node.into();
            a["targetRef"] = json!({"kind": "Pod", "namespace": ns, "name": pod, "uid": uid});
            a
        })
        .collect();
    e
}
