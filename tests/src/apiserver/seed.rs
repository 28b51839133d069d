//! Seed data: the namespaces every cluster has, and realistic nodes, pods, services with
//! endpointslices, configmaps and a secret for tests, the demo and benchmarks.
use serde_json::{Value, json};

use super::{
    resources,
    store::{Key, Store},
    time,
};

/// Stores `obj` as a `resource` of `group` in `ns`, with kind, apiVersion, uid and
/// creationTimestamp filled in.
pub fn put(store: &Store, resource: &str, group: &str, ns: &str, mut obj: Value) {
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

/// A running pod bound to `node`, with the service-account volume every pod gets (which
/// is what lets its node read `kube-root-ca.crt`).
pub fn pod(store: &Store, ns: &str, name: &str, node: &str, app: &str) {
    pod_mounting(store, ns, name, node, app, &[], &[]);
}

/// A running pod that also mounts these ConfigMaps and Secrets as volumes.
pub fn pod_mounting(
    store: &Store,
    ns: &str,
    name: &str,
    node: &str,
    app: &str,
    configmaps: &[&str],
    secrets: &[&str],
) {
    let mut volumes = vec![json!({"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    ]}})];
    volumes.extend(
        configmaps
            .iter()
            .map(|cm| json!({"name": format!("cm-{cm}"), "configMap": {"name": cm}})),
    );
    volumes.extend(
        secrets
            .iter()
            .map(|s| json!({"name": format!("secret-{s}"), "secret": {"secretName": s}})),
    );
    put(
        store,
        "pods",
        "",
        ns,
        json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "serviceAccountName": "default", "volumes": volumes,
                     "containers": [{"name": "main", "image": "registry.local/app:1", "resources": {}}]},
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

/// A Running, Ready pod labelled `app: web` on `node` at `ip`, as a service's backend.
pub fn web_pod(store: &Store, ns: &str, name: &str, node: &str, ip: &str) {
    put(
        store,
        "pods",
        "",
        ns,
        json!({"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.local/web:1"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
}

/// The ClusterIP service `web` selecting the `web_pod`s (port 80 to 8080).
pub fn web_service(store: &Store, ns: &str) {
    put(
        store,
        "services",
        "",
        ns,
        json!({"metadata": {"name": "web"},
            "spec": {"type": "ClusterIP", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
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

/// A pod as kube-apiserver returns one for a Deployment's replica: owner, projected
/// service-account volume, probes, resources, env from fields and secrets, tolerations.
pub fn realistic_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-7d4b9c-x2k4p", "generateName": "web-7d4b9c-", "namespace": "shop",
            "uid": "0b7e", "resourceVersion": "4711", "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T09:59:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c",
                "uid": "9a1c", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "conf", "configMap": {"name": "web-conf", "defaultMode": 420,
                    "items": [{"key": "nginx.conf", "path": "nginx.conf"}]}},
                {"name": "tls", "secret": {"secretName": "web-tls", "defaultMode": 256, "optional": true}},
                {"name": "logs", "hostPath": {"path": "/var/log/web", "type": "DirectoryOrCreate"}},
                {"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "initContainers": [{"name": "migrate", "image": "registry.local/web:2", "command": ["/migrate"],
                "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"}],
            "containers": [{"name": "web", "image": "registry.local/web:2", "args": ["--port=8080"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "edge"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
                    {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                    {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "web-conf", "key": "level", "optional": true}}}],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx", "readOnly": true},
                    {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                    "initialDelaySeconds": 5, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
                "startupProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "failureThreshold": 30},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 101, "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "web", "serviceAccount": "web", "nodeName": "edge-1",
            "securityContext": {"fsGroup": 101}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:09Z"}],
            "hostIP": "169.254.40.2", "hostIPs": [{"ip": "169.254.40.2"}],
            "podIP": "169.254.50.7", "podIPs": [{"ip": "169.254.50.7"}], "startTime": "2026-11-30T10:00:01Z",
            "initContainerStatuses": [{"name": "migrate", "image": "registry.local/web:2", "imageID": "registry.local/web@sha256:1",
                "containerID": "containerd://aa", "ready": true, "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-11-30T10:00:02Z",
                    "finishedAt": "2026-11-30T10:00:04Z", "containerID": "containerd://aa"}}}],
            "containerStatuses": [{"name": "web", "image": "registry.local/web:2", "imageID": "registry.local/web@sha256:1",
                "containerID": "containerd://bb", "ready": true, "restartCount": 1, "started": true,
                "state": {"running": {"startedAt": "2026-11-30T10:00:05Z"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                    "startedAt": "2026-11-30T10:00:04Z", "finishedAt": "2026-11-30T10:00:05Z"}}}],
            "qosClass": "Burstable"}})
}
