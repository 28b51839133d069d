//! Kubernetes protobuf answers for the core kinds (pods, nodes, services, endpoints,
//! endpointslices, configmaps, secrets, serviceaccounts, events, namespaces, leases,
//! certificatesigningrequests): objects in the `k8s\0` +
//! runtime.Unknown envelope, lists, and length-prefixed watch frames, encoded with the real
//! k8s-pb types.
//!
//! The stand-in keeps objects as JSON, so encoding maps a declared subset of fields; fields
//! outside it are not in the protobuf form (the JSON form has everything). Other kinds are
//! answered in JSON when the client accepts it, as every client that sends protobuf does.
//! Request bodies in protobuf are read by `protobuf_in`.
use std::collections::BTreeMap;

use k8s_pb::{
    api::{
        certificates::v1 as certificates, coordination::v1 as coordination, core::v1 as core,
        discovery::v1 as discovery,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ListMeta, MicroTime, ObjectMeta, Status, Time, WatchEvent},
        runtime::{RawExtension, TypeMeta, Unknown},
        util::intstr::IntOrString,
    },
};
use prost::Message;
use serde_json::Value;

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Kinds with a protobuf form here.
pub fn supported(kind: &str) -> bool {
    matches!(
        kind,
        "Pod"
            | "ConfigMap"
            | "Node"
            | "Service"
            | "Endpoints"
            | "EndpointSlice"
            | "Secret"
            | "Namespace"
            | "Lease"
            | "Event"
            | "ServiceAccount"
            | "CertificateSigningRequest"
    )
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(String::from)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn time(v: &Value) -> Option<Time> {
    let secs = super::time::parse_rfc3339(v.as_str()?)?;
    Some(Time {
        seconds: Some(secs as i64),
        nanos: Some(0),
    })
}

fn int(v: &Value) -> Option<i32> {
    v.as_i64().map(|i| i as i32)
}

fn meta(m: &Value) -> ObjectMeta {
    ObjectMeta {
        name: s(&m["name"]),
        generate_name: s(&m["generateName"]),
        namespace: s(&m["namespace"]),
        uid: s(&m["uid"]),
        resource_version: s(&m["resourceVersion"]),
        generation: m["generation"].as_i64(),
        creation_timestamp: time(&m["creationTimestamp"]),
        labels: map(&m["labels"]),
        annotations: map(&m["annotations"]),
        finalizers: strings(&m["finalizers"]),
        ..Default::default()
    }
}

fn container(c: &Value) -> core::Container {
    core::Container {
        name: s(&c["name"]),
        image: s(&c["image"]),
        command: strings(&c["command"]),
        args: strings(&c["args"]),
        working_dir: s(&c["workingDir"]),
        image_pull_policy: s(&c["imagePullPolicy"]),
        env: c["env"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|v| core::EnvVar {
                        name: s(&v["name"]),
                        value: s(&v["value"]),
                        value_from: None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ports: c["ports"]
            .as_array()
            .map(|p| {
                p.iter()
                    .map(|v| core::ContainerPort {
                        name: s(&v["name"]),
                        container_port: int(&v["containerPort"]),
                        protocol: s(&v["protocol"]),
                        ..Default::default()
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn pod(o: &Value) -> core::Pod {
    let spec = &o["spec"];
    let status = &o["status"];
    core::Pod {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(core::PodSpec {
            containers: spec["containers"]
                .as_array()
                .map(|c| c.iter().map(container).collect())
                .unwrap_or_default(),
            node_name: s(&spec["nodeName"]),
            restart_policy: s(&spec["restartPolicy"]),
            service_account_name: s(&spec["serviceAccountName"]),
            scheduler_name: s(&spec["schedulerName"]),
            host_network: spec["hostNetwork"].as_bool(),
            node_selector: map(&spec["nodeSelector"]),
            ..Default::default()
        }),
        status: Some(core::PodStatus {
            phase: s(&status["phase"]),
            host_ip: s(&status["hostIP"]),
            pod_ip: s(&status["podIP"]),
            start_time: time(&status["startTime"]),
            conditions: status["conditions"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|v| core::PodCondition {
                            r#type: s(&v["type"]),
                            status: s(&v["status"]),
                            reason: s(&v["reason"]),
                            message: s(&v["message"]),
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            container_statuses: status["containerStatuses"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|v| core::ContainerStatus {
                            name: s(&v["name"]),
                            image: s(&v["image"]),
                            image_id: s(&v["imageID"]),
                            ready: v["ready"].as_bool(),
                            started: v["started"].as_bool(),
                            restart_count: int(&v["restartCount"]),
                            state: v["state"]["running"].is_object().then(|| {
                                core::ContainerState {
                                    running: Some(core::ContainerStateRunning {
                                        started_at: time(&v["state"]["running"]["startedAt"]),
                                    }),
                                    ..Default::default()
                                }
                            }),
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        }),
    }
}

fn configmap(o: &Value) -> core::ConfigMap {
    core::ConfigMap {
        metadata: Some(meta(&o["metadata"])),
        immutable: o["immutable"].as_bool(),
        data: map(&o["data"]),
        binary_data: Default::default(),
    }
}

fn list_of<T>(v: &Value, f: impl Fn(&Value) -> T) -> Vec<T> {
    v.as_array()
        .map(|a| a.iter().map(f).collect())
        .unwrap_or_default()
}

fn object_ref(v: &Value) -> Option<core::ObjectReference> {
    v.is_object().then(|| core::ObjectReference {
        kind: s(&v["kind"]),
        namespace: s(&v["namespace"]),
        name: s(&v["name"]),
        uid: s(&v["uid"]),
        ..Default::default()
    })
}

fn micro_time(v: &Value) -> Option<MicroTime> {
    time(v).map(|t| MicroTime {
        seconds: t.seconds,
        nanos: t.nanos,
    })
}

fn node(o: &Value) -> core::Node {
    let (spec, status) = (&o["spec"], &o["status"]);
    let quantities = |v: &Value| {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, q)| (k.clone(), Quantity { string: s(q) }))
                    .collect()
            })
            .unwrap_or_default()
    };
    let info = &status["nodeInfo"];
    core::Node {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(core::NodeSpec {
            pod_cidr: s(&spec["podCIDR"]),
            pod_cid_rs: strings(&spec["podCIDRs"]),
            provider_id: s(&spec["providerID"]),
            unschedulable: spec["unschedulable"].as_bool(),
            taints: list_of(&spec["taints"], |t| core::Taint {
                key: s(&t["key"]),
                value: s(&t["value"]),
                effect: s(&t["effect"]),
                time_added: time(&t["timeAdded"]),
            }),
            ..Default::default()
        }),
        status: Some(core::NodeStatus {
            capacity: quantities(&status["capacity"]),
            allocatable: quantities(&status["allocatable"]),
            conditions: list_of(&status["conditions"], |c| core::NodeCondition {
                r#type: s(&c["type"]),
                status: s(&c["status"]),
                reason: s(&c["reason"]),
                message: s(&c["message"]),
                last_heartbeat_time: time(&c["lastHeartbeatTime"]),
                last_transition_time: time(&c["lastTransitionTime"]),
            }),
            addresses: list_of(&status["addresses"], |a| core::NodeAddress {
                r#type: s(&a["type"]),
                address: s(&a["address"]),
            }),
            node_info: info.is_object().then(|| core::NodeSystemInfo {
                kubelet_version: s(&info["kubeletVersion"]),
                kernel_version: s(&info["kernelVersion"]),
                os_image: s(&info["osImage"]),
                container_runtime_version: s(&info["containerRuntimeVersion"]),
                operating_system: s(&info["operatingSystem"]),
                architecture: s(&info["architecture"]),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn int_or_string(v: &Value) -> Option<IntOrString> {
    match v {
        Value::Number(n) => Some(IntOrString {
            r#type: Some(0),
            int_val: n.as_i64().map(|i| i as i32),
            str_val: None,
        }),
        Value::String(t) => Some(IntOrString {
            r#type: Some(1),
            int_val: None,
            str_val: Some(t.clone()),
        }),
        _ => None,
    }
}

fn service(o: &Value) -> core::Service {
    let spec = &o["spec"];
    core::Service {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(core::ServiceSpec {
            ports: list_of(&spec["ports"], |p| core::ServicePort {
                name: s(&p["name"]),
                protocol: s(&p["protocol"]),
                app_protocol: s(&p["appProtocol"]),
                port: int(&p["port"]),
                target_port: int_or_string(&p["targetPort"]),
                node_port: int(&p["nodePort"]),
            }),
            selector: map(&spec["selector"]),
            cluster_ip: s(&spec["clusterIP"]),
            cluster_ips: strings(&spec["clusterIPs"]),
            r#type: s(&spec["type"]),
            session_affinity: s(&spec["sessionAffinity"]),
            ip_families: strings(&spec["ipFamilies"]),
            ..Default::default()
        }),
        status: None,
    }
}

fn endpoints(o: &Value) -> core::Endpoints {
    let address = |a: &Value| core::EndpointAddress {
        ip: s(&a["ip"]),
        hostname: s(&a["hostname"]),
        node_name: s(&a["nodeName"]),
        target_ref: object_ref(&a["targetRef"]),
    };
    core::Endpoints {
        metadata: Some(meta(&o["metadata"])),
        subsets: list_of(&o["subsets"], |sub| core::EndpointSubset {
            addresses: list_of(&sub["addresses"], address),
            not_ready_addresses: list_of(&sub["notReadyAddresses"], address),
            ports: list_of(&sub["ports"], |p| core::EndpointPort {
                name: s(&p["name"]),
                port: int(&p["port"]),
                protocol: s(&p["protocol"]),
                app_protocol: s(&p["appProtocol"]),
            }),
        }),
    }
}

fn endpoint_slice(o: &Value) -> discovery::EndpointSlice {
    discovery::EndpointSlice {
        metadata: Some(meta(&o["metadata"])),
        address_type: s(&o["addressType"]),
        endpoints: list_of(&o["endpoints"], |e| discovery::Endpoint {
            addresses: strings(&e["addresses"]),
            conditions: e["conditions"]
                .is_object()
                .then(|| discovery::EndpointConditions {
                    ready: e["conditions"]["ready"].as_bool(),
                    serving: e["conditions"]["serving"].as_bool(),
                    terminating: e["conditions"]["terminating"].as_bool(),
                }),
            hostname: s(&e["hostname"]),
            target_ref: object_ref(&e["targetRef"]),
            node_name: s(&e["nodeName"]),
            zone: s(&e["zone"]),
            ..Default::default()
        }),
        ports: list_of(&o["ports"], |p| discovery::EndpointPort {
            name: s(&p["name"]),
            protocol: s(&p["protocol"]),
            port: int(&p["port"]),
            app_protocol: s(&p["appProtocol"]),
        }),
    }
}

fn secret(o: &Value) -> core::Secret {
    use base64::Engine;
    let data = o["data"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.clone(),
                        base64::engine::general_purpose::STANDARD
                            .decode(v.as_str()?)
                            .ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    core::Secret {
        metadata: Some(meta(&o["metadata"])),
        immutable: o["immutable"].as_bool(),
        data,
        string_data: Default::default(),
        r#type: s(&o["type"]),
    }
}

fn namespace(o: &Value) -> core::Namespace {
    core::Namespace {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(core::NamespaceSpec {
            finalizers: strings(&o["spec"]["finalizers"]),
        }),
        status: Some(core::NamespaceStatus {
            phase: s(&o["status"]["phase"]),
            conditions: vec![],
        }),
    }
}

fn lease(o: &Value) -> coordination::Lease {
    let spec = &o["spec"];
    coordination::Lease {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(coordination::LeaseSpec {
            holder_identity: s(&spec["holderIdentity"]),
            lease_duration_seconds: int(&spec["leaseDurationSeconds"]),
            acquire_time: micro_time(&spec["acquireTime"]),
            renew_time: micro_time(&spec["renewTime"]),
            lease_transitions: int(&spec["leaseTransitions"]),
            ..Default::default()
        }),
    }
}

fn event(o: &Value) -> core::Event {
    core::Event {
        metadata: Some(meta(&o["metadata"])),
        involved_object: object_ref(&o["involvedObject"]),
        reason: s(&o["reason"]),
        message: s(&o["message"]),
        source: o["source"].is_object().then(|| core::EventSource {
            component: s(&o["source"]["component"]),
            host: s(&o["source"]["host"]),
        }),
        first_timestamp: time(&o["firstTimestamp"]),
        last_timestamp: time(&o["lastTimestamp"]),
        count: int(&o["count"]),
        r#type: s(&o["type"]),
        event_time: micro_time(&o["eventTime"]),
        action: s(&o["action"]),
        reporting_component: s(&o["reportingComponent"]),
        reporting_instance: s(&o["reportingInstance"]),
        ..Default::default()
    }
}

fn service_account(o: &Value) -> core::ServiceAccount {
    core::ServiceAccount {
        metadata: Some(meta(&o["metadata"])),
        secrets: list_of(&o["secrets"], |r| object_ref(r).unwrap_or_default()),
        image_pull_secrets: list_of(&o["imagePullSecrets"], |r| core::LocalObjectReference {
            name: s(&r["name"]),
        }),
        automount_service_account_token: o["automountServiceAccountToken"].as_bool(),
    }
}

fn csr(o: &Value) -> certificates::CertificateSigningRequest {
    use base64::Engine;
    let bytes = |v: &Value| {
        v.as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
    };
    let (spec, status) = (&o["spec"], &o["status"]);
    certificates::CertificateSigningRequest {
        metadata: Some(meta(&o["metadata"])),
        spec: Some(certificates::CertificateSigningRequestSpec {
            request: bytes(&spec["request"]),
            signer_name: s(&spec["signerName"]),
            expiration_seconds: int(&spec["expirationSeconds"]),
            usages: strings(&spec["usages"]),
            username: s(&spec["username"]),
            uid: s(&spec["uid"]),
            groups: strings(&spec["groups"]),
            ..Default::default()
        }),
        status: Some(certificates::CertificateSigningRequestStatus {
            conditions: list_of(&status["conditions"], |c| {
                certificates::CertificateSigningRequestCondition {
                    r#type: s(&c["type"]),
                    status: s(&c["status"]),
                    reason: s(&c["reason"]),
                    message: s(&c["message"]),
                    last_update_time: time(&c["lastUpdateTime"]),
                    last_transition_time: time(&c["lastTransitionTime"]),
                }
            }),
            certificate: bytes(&status["certificate"]),
        }),
    }
}

/// The object's protobuf bytes (without envelope).
fn raw(kind: &str, o: &Value) -> Vec<u8> {
    match kind {
        "Pod" => pod(o).encode_to_vec(),
        "Node" => node(o).encode_to_vec(),
        "Service" => service(o).encode_to_vec(),
        "Endpoints" => endpoints(o).encode_to_vec(),
        "EndpointSlice" => endpoint_slice(o).encode_to_vec(),
        "Secret" => secret(o).encode_to_vec(),
        "Namespace" => namespace(o).encode_to_vec(),
        "Lease" => lease(o).encode_to_vec(),
        "Event" => event(o).encode_to_vec(),
        "ServiceAccount" => service_account(o).encode_to_vec(),
        "CertificateSigningRequest" => csr(o).encode_to_vec(),
        _ => configmap(o).encode_to_vec(),
    }
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [hub::kproto::MAGIC.to_vec(), u.encode_to_vec()].concat()
}

/// One object, as GET answers it.
pub fn object(api_version: &str, kind: &str, o: &Value) -> Vec<u8> {
    envelope(api_version, kind, raw(kind, o))
}

/// A list of `items` with the list's metadata.
pub fn list(
    api_version: &str,
    kind: &str,
    items: &[&Value],
    rv: &str,
    continue_token: Option<&str>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let meta = Some(ListMeta {
        resource_version: Some(rv.into()),
        r#continue: continue_token.map(String::from),
        remaining_item_count: remaining,
        ..Default::default()
    });
    macro_rules! encode {
        ($($list:ident)::+, $item:ident) => {
            $($list)::+ { metadata: meta, items: items.iter().map(|o| $item(o)).collect() }.encode_to_vec()
        };
    }
    let body = match kind {
        "Pod" => encode!(core::PodList, pod),
        "Node" => encode!(core::NodeList, node),
        "Service" => encode!(core::ServiceList, service),
        "Endpoints" => encode!(core::EndpointsList, endpoints),
        "EndpointSlice" => encode!(discovery::EndpointSliceList, endpoint_slice),
        "Secret" => encode!(core::SecretList, secret),
        "Namespace" => encode!(core::NamespaceList, namespace),
        "Lease" => encode!(coordination::LeaseList, lease),
        "Event" => encode!(core::EventList, event),
        "ServiceAccount" => encode!(core::ServiceAccountList, service_account),
        "CertificateSigningRequest" => encode!(certificates::CertificateSigningRequestList, csr),
        _ => encode!(core::ConfigMapList, configmap),
    };
    envelope(api_version, &format!("{kind}List"), body)
}

/// One length-prefixed watch frame: a WatchEvent whose object is the enveloped object.
pub fn watch_frame(event_type: &str, api_version: &str, kind: &str, o: &Value) -> Vec<u8> {
    event_frame(event_type, object(api_version, kind, o))
}

/// A WatchEvent around an enveloped object, in its envelope, length-prefixed.
fn event_frame(event_type: &str, object: Vec<u8>) -> Vec<u8> {
    let event = WatchEvent {
        r#type: Some(event_type.into()),
        object: Some(RawExtension { raw: Some(object) }),
    };
    let body = envelope("meta.k8s.io/v1", "WatchEvent", event.encode_to_vec());
    [(body.len() as u32).to_be_bytes().to_vec(), body].concat()
}

/// A watch frame carrying a Status (the ERROR event, e.g. 410 Gone).
pub fn error_frame(code: i32, reason: &str, message: &str) -> Vec<u8> {
    let status = Status {
        metadata: Some(ListMeta::default()),
        status: Some("Failure".into()),
        message: Some(message.into()),
        reason: Some(reason.into()),
        details: None,
        code: Some(code),
    };
    event_frame("ERROR", envelope("v1", "Status", status.encode_to_vec()))
}
