//! Kubernetes protobuf request bodies, for the kinds a node writes that way (kubelet's
//! typed clients send protobuf): leases, events, nodes, pods, certificate signing
//! requests, configmaps. The body (`k8s\0` + runtime.Unknown) is decoded with the real
//! k8s-pb types into the JSON form the store keeps — the same field subset `protobuf`
//! encodes, so an object written in protobuf reads back the same in either encoding.
use base64::Engine;
use k8s_pb::{
    api::{certificates::v1 as certificates, coordination::v1 as coordination, core::v1 as core},
    apimachinery::pkg::{
        apis::meta::v1::{MicroTime, ObjectMeta, Time},
        runtime::Unknown,
    },
};
use prost::Message;
use serde_json::{Map, Value, json};

/// Kinds whose protobuf request bodies are understood.
pub fn supported(kind: &str) -> bool {
    matches!(
        kind,
        "Lease" | "Event" | "Node" | "Pod" | "CertificateSigningRequest" | "ConfigMap"
    )
}

/// Inserts `v` under `k` unless it is absent (`None`, empty string list or map).
fn put(m: &mut Map<String, Value>, k: &str, v: impl Into<Option<Value>>) {
    match v.into() {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(Value::Object(o)) if o.is_empty() => {}
        Some(v) => {
            m.insert(k.into(), v);
        }
    }
}

fn text(s: &Option<String>) -> Option<Value> {
    s.as_ref().map(|s| json!(s))
}

fn time(t: &Option<Time>) -> Option<Value> {
    let secs = t.as_ref()?.seconds?;
    Some(json!(super::time::rfc3339(secs.max(0) as u64)))
}

fn micro_time(t: &Option<MicroTime>) -> Option<Value> {
    let t = t.as_ref()?;
    let secs = t.seconds?.max(0) as u64;
    let micros = t.nanos.unwrap_or(0).max(0) / 1000;
    let base = super::time::rfc3339(secs);
    Some(json!(format!(
        "{}.{micros:06}Z",
        base.trim_end_matches('Z')
    )))
}

fn strings(v: &[String]) -> Value {
    json!(v)
}

fn meta(m: &Option<ObjectMeta>) -> Value {
    let Some(m) = m else { return json!({}) };
    let mut o = Map::new();
    put(&mut o, "name", text(&m.name));
    put(&mut o, "generateName", text(&m.generate_name));
    put(&mut o, "namespace", text(&m.namespace));
    put(&mut o, "uid", text(&m.uid));
    put(&mut o, "resourceVersion", text(&m.resource_version));
    put(&mut o, "labels", json!(m.labels));
    put(&mut o, "annotations", json!(m.annotations));
    put(&mut o, "finalizers", strings(&m.finalizers));
    Value::Object(o)
}

fn lease(l: coordination::Lease) -> Value {
    let mut spec = Map::new();
    if let Some(s) = &l.spec {
        put(&mut spec, "holderIdentity", text(&s.holder_identity));
        put(
            &mut spec,
            "leaseDurationSeconds",
            s.lease_duration_seconds.map(|v| json!(v)),
        );
        put(&mut spec, "acquireTime", micro_time(&s.acquire_time));
        put(&mut spec, "renewTime", micro_time(&s.renew_time));
        put(
            &mut spec,
            "leaseTransitions",
            s.lease_transitions.map(|v| json!(v)),
        );
    }
    json!({"metadata": meta(&l.metadata), "spec": spec})
}

fn object_ref(r: &Option<core::ObjectReference>) -> Option<Value> {
    let r = r.as_ref()?;
    let mut o = Map::new();
    put(&mut o, "kind", text(&r.kind));
    put(&mut o, "namespace", text(&r.namespace));
    put(&mut o, "name", text(&r.name));
    put(&mut o, "uid", text(&r.uid));
    put(&mut o, "apiVersion", text(&r.api_version));
    put(&mut o, "fieldPath", text(&r.field_path));
    Some(Value::Object(o))
}

fn event(e: core::Event) -> Value {
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&e.metadata));
    put(&mut o, "involvedObject", object_ref(&e.involved_object));
    put(&mut o, "reason", text(&e.reason));
    put(&mut o, "message", text(&e.message));
    if let Some(s) = &e.source {
        let mut src = Map::new();
        put(&mut src, "component", text(&s.component));
        put(&mut src, "host", text(&s.host));
        put(&mut o, "source", Value::Object(src));
    }
    put(&mut o, "firstTimestamp", time(&e.first_timestamp));
    put(&mut o, "lastTimestamp", time(&e.last_timestamp));
    put(&mut o, "count", e.count.map(|c| json!(c)));
    put(&mut o, "type", text(&e.r#type));
    put(&mut o, "eventTime", micro_time(&e.event_time));
    put(&mut o, "action", text(&e.action));
    put(&mut o, "reportingComponent", text(&e.reporting_component));
    put(&mut o, "reportingInstance", text(&e.reporting_instance));
    Value::Object(o)
}

fn node(n: core::Node) -> Value {
    let mut spec = Map::new();
    if let Some(s) = &n.spec {
        put(&mut spec, "podCIDR", text(&s.pod_cidr));
        put(&mut spec, "podCIDRs", strings(&s.pod_cid_rs));
        put(&mut spec, "providerID", text(&s.provider_id));
        put(
            &mut spec,
            "unschedulable",
            s.unschedulable.map(|v| json!(v)),
        );
        let taints: Vec<Value> = s
            .taints
            .iter()
            .map(|t| {
                let mut o = Map::new();
                put(&mut o, "key", text(&t.key));
                put(&mut o, "value", text(&t.value));
                put(&mut o, "effect", text(&t.effect));
                put(&mut o, "timeAdded", time(&t.time_added));
                Value::Object(o)
            })
            .collect();
        put(&mut spec, "taints", json!(taints));
    }
    let mut status = Map::new();
    if let Some(s) = &n.status {
        let quantities = |q: &std::collections::BTreeMap<
            String,
            k8s_pb::apimachinery::pkg::api::resource::Quantity,
        >| {
            let m: Map<String, Value> = q
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), json!(v.string.clone()?))))
                .collect();
            Value::Object(m)
        };
        put(&mut status, "capacity", quantities(&s.capacity));
        put(&mut status, "allocatable", quantities(&s.allocatable));
        let conditions: Vec<Value> = s
            .conditions
            .iter()
            .map(|c| {
                let mut o = Map::new();
                put(&mut o, "type", text(&c.r#type));
                put(&mut o, "status", text(&c.status));
                put(&mut o, "reason", text(&c.reason));
                put(&mut o, "message", text(&c.message));
                put(&mut o, "lastHeartbeatTime", time(&c.last_heartbeat_time));
                put(&mut o, "lastTransitionTime", time(&c.last_transition_time));
                Value::Object(o)
            })
            .collect();
        put(&mut status, "conditions", json!(conditions));
        let addresses: Vec<Value> = s
            .addresses
            .iter()
            .map(|a| json!({"type": a.r#type, "address": a.address}))
            .collect();
        put(&mut status, "addresses", json!(addresses));
        if let Some(i) = &s.node_info {
            let mut info = Map::new();
            put(&mut info, "kubeletVersion", text(&i.kubelet_version));
            put(&mut info, "kernelVersion", text(&i.kernel_version));
            put(&mut info, "osImage", text(&i.os_image));
            put(
                &mut info,
                "containerRuntimeVersion",
                text(&i.container_runtime_version),
            );
            put(&mut info, "operatingSystem", text(&i.operating_system));
            put(&mut info, "architecture", text(&i.architecture));
            put(&mut status, "nodeInfo", Value::Object(info));
        }
    }
    json!({"metadata": meta(&n.metadata), "spec": spec, "status": status})
}

fn container(c: &core::Container) -> Value {
    let mut o = Map::new();
    put(&mut o, "name", text(&c.name));
    put(&mut o, "image", text(&c.image));
    put(&mut o, "command", strings(&c.command));
    put(&mut o, "args", strings(&c.args));
    put(&mut o, "workingDir", text(&c.working_dir));
    put(&mut o, "imagePullPolicy", text(&c.image_pull_policy));
    let env: Vec<Value> = c
        .env
        .iter()
        .map(|e| {
            let mut o = Map::new();
            put(&mut o, "name", text(&e.name));
            put(&mut o, "value", text(&e.value));
            Value::Object(o)
        })
        .collect();
    put(&mut o, "env", json!(env));
    let ports: Vec<Value> = c
        .ports
        .iter()
        .map(|p| {
            let mut o = Map::new();
            put(&mut o, "name", text(&p.name));
            put(&mut o, "containerPort", p.container_port.map(|v| json!(v)));
            put(&mut o, "protocol", text(&p.protocol));
            Value::Object(o)
        })
        .collect();
    put(&mut o, "ports", json!(ports));
    Value::Object(o)
}

fn pod(p: core::Pod) -> Value {
    let mut spec = Map::new();
    if let Some(s) = &p.spec {
        let containers: Vec<Value> = s.containers.iter().map(container).collect();
        put(&mut spec, "containers", json!(containers));
        put(&mut spec, "nodeName", text(&s.node_name));
        put(&mut spec, "restartPolicy", text(&s.restart_policy));
        put(
            &mut spec,
            "serviceAccountName",
            text(&s.service_account_name),
        );
        put(&mut spec, "schedulerName", text(&s.scheduler_name));
        put(&mut spec, "hostNetwork", s.host_network.map(|v| json!(v)));
        put(&mut spec, "nodeSelector", json!(s.node_selector));
    }
    let mut status = Map::new();
    if let Some(s) = &p.status {
        put(&mut status, "phase", text(&s.phase));
        put(&mut status, "hostIP", text(&s.host_ip));
        put(&mut status, "podIP", text(&s.pod_ip));
        put(&mut status, "startTime", time(&s.start_time));
        let conditions: Vec<Value> = s
            .conditions
            .iter()
            .map(|c| {
                let mut o = Map::new();
                put(&mut o, "type", text(&c.r#type));
                put(&mut o, "status", text(&c.status));
                put(&mut o, "reason", text(&c.reason));
                put(&mut o, "message", text(&c.message));
                Value::Object(o)
            })
            .collect();
        put(&mut status, "conditions", json!(conditions));
    }
    json!({"metadata": meta(&p.metadata), "spec": spec, "status": status})
}

fn csr(c: certificates::CertificateSigningRequest) -> Value {
    let b64 = |b: &Option<Vec<u8>>| {
        b.as_ref()
            .map(|b| json!(base64::engine::general_purpose::STANDARD.encode(b)))
    };
    let mut spec = Map::new();
    if let Some(s) = &c.spec {
        put(&mut spec, "request", b64(&s.request));
        put(&mut spec, "signerName", text(&s.signer_name));
        put(
            &mut spec,
            "expirationSeconds",
            s.expiration_seconds.map(|v| json!(v)),
        );
        put(&mut spec, "usages", strings(&s.usages));
    }
    json!({"metadata": meta(&c.metadata), "spec": spec})
}

fn configmap(c: core::ConfigMap) -> Value {
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&c.metadata));
    put(&mut o, "data", json!(c.data));
    put(&mut o, "immutable", c.immutable.map(|v| json!(v)));
    Value::Object(o)
}

/// The JSON form of a protobuf request body for `kind` (with apiVersion and kind set), or
/// why it cannot be read.
pub fn decode(api_version: &str, kind: &str, body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(hub::kproto::MAGIC)
        .ok_or("the body does not start with the protobuf magic")?;
    let unknown = Unknown::decode(envelope).map_err(|e| format!("runtime.Unknown: {e}"))?;
    let sent = unknown
        .type_meta
        .as_ref()
        .and_then(|t| t.kind.clone())
        .unwrap_or_default();
    if sent != kind {
        return Err(format!(
            "the body is a {sent:?}, this resource holds {kind}"
        ));
    }
    let raw = unknown.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| format!("{kind}: {e}");
    let mut v = match kind {
        "Lease" => lease(coordination::Lease::decode(raw.as_slice()).map_err(bad)?),
        "Event" => event(core::Event::decode(raw.as_slice()).map_err(bad)?),
        "Node" => node(core::Node::decode(raw.as_slice()).map_err(bad)?),
        "Pod" => pod(core::Pod::decode(raw.as_slice()).map_err(bad)?),
        "CertificateSigningRequest" => {
            csr(certificates::CertificateSigningRequest::decode(raw.as_slice()).map_err(bad)?)
        }
        "ConfigMap" => configmap(core::ConfigMap::decode(raw.as_slice()).map_err(bad)?),
        other => return Err(format!("protobuf bodies of {other} are not understood")),
    };
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_through_protobuf() {
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-0", "namespace": "kube-node-lease", "labels": {"a": "b"}},
            "spec": {"holderIdentity": "node-0", "leaseDurationSeconds": 40,
                     "renewTime": "2026-06-01T00:00:00.000000Z"}});
        let body = super::super::protobuf::object("coordination.k8s.io/v1", "Lease", &lease);
        let back = decode("coordination.k8s.io/v1", "Lease", &body).unwrap();
        assert_eq!(back, lease);
        assert!(decode("v1", "Pod", &body).unwrap_err().contains("Lease"));
        assert!(decode("v1", "Lease", b"k8s\0garbage").is_err());
        assert!(decode("v1", "Lease", b"{}").is_err());
    }
}
