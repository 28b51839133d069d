//! Kubernetes protobuf answers for the kinds kubelet and kube-proxy read most, Pods (and
//! ConfigMaps): objects in the `k8s\0` + runtime.Unknown envelope, lists, and
//! length-prefixed watch frames, encoded with the real k8s-pb types.
//!
//! The stand-in keeps objects as JSON, so encoding maps a declared subset of fields; fields
//! outside it are not in the protobuf form (the JSON form has everything). Other kinds are
//! answered in JSON when the client accepts it, as every client that sends protobuf does.
use std::collections::BTreeMap;

use k8s_pb::{
    api::core::v1 as core,
    apimachinery::pkg::{
        apis::meta::v1::{ListMeta, ObjectMeta, Status, Time, WatchEvent},
        runtime::{RawExtension, TypeMeta, Unknown},
    },
};
use prost::Message;
use serde_json::Value;

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Kinds with a protobuf form here.
pub fn supported(kind: &str) -> bool {
    matches!(kind, "Pod" | "ConfigMap")
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

/// The object's protobuf bytes (without envelope).
fn raw(kind: &str, o: &Value) -> Vec<u8> {
    match kind {
        "Pod" => pod(o).encode_to_vec(),
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
pub fn object(kind: &str, o: &Value) -> Vec<u8> {
    envelope("v1", kind, raw(kind, o))
}

/// A list of `items` with the list's metadata.
pub fn list(
    kind: &str,
    items: &[&Value],
    rv: &str,
    continue_token: Option<&str>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let meta = ListMeta {
        resource_version: Some(rv.into()),
        r#continue: continue_token.map(String::from),
        remaining_item_count: remaining,
        ..Default::default()
    };
    let body = match kind {
        "Pod" => core::PodList {
            metadata: Some(meta),
            items: items.iter().map(|o| pod(o)).collect(),
        }
        .encode_to_vec(),
        _ => core::ConfigMapList {
            metadata: Some(meta),
            items: items.iter().map(|o| configmap(o)).collect(),
        }
        .encode_to_vec(),
    };
    envelope("v1", &format!("{kind}List"), body)
}

/// One length-prefixed watch frame: a WatchEvent whose object is the enveloped object.
pub fn watch_frame(event_type: &str, kind: &str, o: &Value) -> Vec<u8> {
    let event = WatchEvent {
        r#type: Some(event_type.into()),
        object: Some(RawExtension {
            raw: Some(object(kind, o)),
        }),
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
    let event = WatchEvent {
        r#type: Some("ERROR".into()),
        object: Some(RawExtension {
            raw: Some(envelope("v1", "Status", status.encode_to_vec())),
        }),
    };
    let body = envelope("meta.k8s.io/v1", "WatchEvent", event.encode_to_vec());
    [(body.len() as u32).to_be_bytes().to_vec(), body].concat()
}
