//! Kubernetes protobuf request bodies, for every core kind with a protobuf form here
//! (kubelet's and controllers' typed clients send protobuf): leases, events, nodes, pods,
//! certificate signing requests, configmaps, secrets, services, endpoints,
//! endpointslices, namespaces, service accounts. The body (`k8s\0` + runtime.Unknown) is decoded with the real
//! k8s-pb types into the JSON form the store keeps — the same field subset `protobuf`
//! encodes, so an object written in protobuf reads back the same in either encoding.
use base64::Engine;
use k8s_pb::{
    api::{
        certificates::v1 as certificates, coordination::v1 as coordination, core::v1 as core,
        discovery::v1 as discovery,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, Time},
        runtime::Unknown,
        util::intstr::IntOrString,
    },
};
use prost::Message;
use serde_json::{Map, Value, json};

/// Kinds whose protobuf request bodies are understood.
pub fn supported(kind: &str) -> bool {
    super::protobuf::supported(kind)
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
    let owners: Vec<Value> = m
        .owner_references
        .iter()
        .map(|r| {
            let mut o = Map::new();
            put(&mut o, "apiVersion", text(&r.api_version));
            put(&mut o, "kind", text(&r.kind));
            put(&mut o, "name", text(&r.name));
            put(&mut o, "uid", text(&r.uid));
            put(&mut o, "controller", flag(r.controller));
            put(&mut o, "blockOwnerDeletion", flag(r.block_owner_deletion));
            Value::Object(o)
        })
        .collect();
    put(&mut o, "ownerReferences", json!(owners));
    put(&mut o, "creationTimestamp", time(&m.creation_timestamp));
    put(&mut o, "deletionTimestamp", time(&m.deletion_timestamp));
    put(
        &mut o,
        "deletionGracePeriodSeconds",
        num(m.deletion_grace_period_seconds),
    );
    Value::Object(o)
}

/// A node or pod condition: type, status, reason, message, then its times.
fn condition(words: [&Option<String>; 4], times: [(&str, &Option<Time>); 2]) -> Value {
    let mut o = Map::new();
    for (k, v) in ["type", "status", "reason", "message"]
        .into_iter()
        .zip(words)
    {
        put(&mut o, k, text(v));
    }
    for (k, t) in times {
        put(&mut o, k, time(t));
    }
    Value::Object(o)
}

fn num<T: Into<Value>>(v: Option<T>) -> Option<Value> {
    v.map(Into::into)
}

fn flag(v: Option<bool>) -> Option<Value> {
    v.map(|b| json!(b))
}

fn quantities(q: &std::collections::BTreeMap<String, Quantity>) -> Value {
    let m: Map<String, Value> = q
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), json!(v.string.clone()?))))
        .collect();
    Value::Object(m)
}

fn int_or_string(v: &Option<IntOrString>) -> Option<Value> {
    let v = v.as_ref()?;
    Some(match v.r#type {
        Some(1) => json!(v.str_val.clone().unwrap_or_default()),
        _ => json!(v.int_val.unwrap_or_default()),
    })
}

fn named(r: &Option<core::LocalObjectReference>, o: &mut Map<String, Value>) {
    if let Some(r) = r {
        put(o, "name", text(&r.name));
    }
}

fn key_to_paths(items: &[core::KeyToPath]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|k| {
            let mut o = Map::new();
            put(&mut o, "key", text(&k.key));
            put(&mut o, "path", text(&k.path));
            put(&mut o, "mode", num(k.mode));
            Value::Object(o)
        })
        .collect();
    json!(items)
}

fn field_selector(f: &Option<core::ObjectFieldSelector>) -> Option<Value> {
    let f = f.as_ref()?;
    let mut o = Map::new();
    put(&mut o, "apiVersion", text(&f.api_version));
    put(&mut o, "fieldPath", text(&f.field_path));
    Some(Value::Object(o))
}

fn downward_files(files: &[core::DownwardAPIVolumeFile]) -> Value {
    let items: Vec<Value> = files
        .iter()
        .map(|f| {
            let mut o = Map::new();
            put(&mut o, "path", text(&f.path));
            put(&mut o, "fieldRef", field_selector(&f.field_ref));
            put(&mut o, "mode", num(f.mode));
            Value::Object(o)
        })
        .collect();
    json!(items)
}

fn local_source(
    r: &Option<core::LocalObjectReference>,
    items: &[core::KeyToPath],
    optional: Option<bool>,
) -> Map<String, Value> {
    let mut m = Map::new();
    named(r, &mut m);
    put(&mut m, "items", key_to_paths(items));
    put(&mut m, "optional", flag(optional));
    m
}

fn volume(v: &core::Volume) -> Value {
    let mut o = Map::new();
    put(&mut o, "name", text(&v.name));
    let Some(src) = &v.volume_source else {
        return Value::Object(o);
    };
    if let Some(c) = &src.config_map {
        let mut m = local_source(&c.local_object_reference, &c.items, c.optional);
        put(&mut m, "defaultMode", num(c.default_mode));
        o.insert("configMap".into(), Value::Object(m));
    }
    if let Some(c) = &src.secret {
        let mut m = Map::new();
        put(&mut m, "secretName", text(&c.secret_name));
        put(&mut m, "items", key_to_paths(&c.items));
        put(&mut m, "defaultMode", num(c.default_mode));
        put(&mut m, "optional", flag(c.optional));
        o.insert("secret".into(), Value::Object(m));
    }
    if let Some(e) = &src.empty_dir {
        let mut m = Map::new();
        put(&mut m, "medium", text(&e.medium));
        let limit = e.size_limit.as_ref().and_then(|q| q.string.clone());
        put(&mut m, "sizeLimit", limit.map(|q| json!(q)));
        o.insert("emptyDir".into(), Value::Object(m));
    }
    if let Some(h) = &src.host_path {
        let mut m = Map::new();
        put(&mut m, "path", text(&h.path));
        put(&mut m, "type", text(&h.r#type));
        o.insert("hostPath".into(), Value::Object(m));
    }
    if let Some(c) = &src.persistent_volume_claim {
        let mut m = Map::new();
        put(&mut m, "claimName", text(&c.claim_name));
        put(&mut m, "readOnly", flag(c.read_only));
        o.insert("persistentVolumeClaim".into(), Value::Object(m));
    }
    if let Some(d) = &src.downward_api {
        let mut m = Map::new();
        put(&mut m, "items", downward_files(&d.items));
        put(&mut m, "defaultMode", num(d.default_mode));
        o.insert("downwardAPI".into(), Value::Object(m));
    }
    if let Some(p) = &src.projected {
        let sources: Vec<Value> = p
            .sources
            .iter()
            .map(|s| {
                let mut m = Map::new();
                if let Some(t) = &s.service_account_token {
                    let mut t2 = Map::new();
                    put(&mut t2, "audience", text(&t.audience));
                    put(&mut t2, "expirationSeconds", num(t.expiration_seconds));
                    put(&mut t2, "path", text(&t.path));
                    m.insert("serviceAccountToken".into(), Value::Object(t2));
                }
                if let Some(c) = &s.config_map {
                    let c2 = local_source(&c.local_object_reference, &c.items, c.optional);
                    m.insert("configMap".into(), Value::Object(c2));
                }
                if let Some(c) = &s.secret {
                    let c2 = local_source(&c.local_object_reference, &c.items, c.optional);
                    m.insert("secret".into(), Value::Object(c2));
                }
                if let Some(d) = &s.downward_api {
                    m.insert(
                        "downwardAPI".into(),
                        json!({"items": downward_files(&d.items)}),
                    );
                }
                Value::Object(m)
            })
            .collect();
        let mut m = Map::new();
        put(&mut m, "sources", json!(sources));
        put(&mut m, "defaultMode", num(p.default_mode));
        o.insert("projected".into(), Value::Object(m));
    }
    Value::Object(o)
}

fn probe(p: &Option<core::Probe>) -> Option<Value> {
    let p = p.as_ref()?;
    let mut o = Map::new();
    if let Some(h) = &p.handler {
        if let Some(e) = &h.exec {
            o.insert("exec".into(), json!({"command": e.command}));
        }
        if let Some(g) = &h.http_get {
            let mut m = Map::new();
            put(&mut m, "path", text(&g.path));
            put(&mut m, "port", int_or_string(&g.port));
            put(&mut m, "host", text(&g.host));
            put(&mut m, "scheme", text(&g.scheme));
            o.insert("httpGet".into(), Value::Object(m));
        }
        if let Some(t) = &h.tcp_socket {
            let mut m = Map::new();
            put(&mut m, "port", int_or_string(&t.port));
            put(&mut m, "host", text(&t.host));
            o.insert("tcpSocket".into(), Value::Object(m));
        }
    }
    put(&mut o, "initialDelaySeconds", num(p.initial_delay_seconds));
    put(&mut o, "timeoutSeconds", num(p.timeout_seconds));
    put(&mut o, "periodSeconds", num(p.period_seconds));
    put(&mut o, "successThreshold", num(p.success_threshold));
    put(&mut o, "failureThreshold", num(p.failure_threshold));
    Some(Value::Object(o))
}

fn container_state(s: &Option<core::ContainerState>) -> Option<Value> {
    let s = s.as_ref()?;
    let mut o = Map::new();
    if let Some(r) = &s.running {
        o.insert("running".into(), json!({"startedAt": time(&r.started_at)}));
    }
    if let Some(w) = &s.waiting {
        let mut m = Map::new();
        put(&mut m, "reason", text(&w.reason));
        put(&mut m, "message", text(&w.message));
        o.insert("waiting".into(), Value::Object(m));
    }
    if let Some(t) = &s.terminated {
        let mut m = Map::new();
        put(&mut m, "exitCode", num(t.exit_code));
        put(&mut m, "signal", num(t.signal));
        put(&mut m, "reason", text(&t.reason));
        put(&mut m, "message", text(&t.message));
        put(&mut m, "startedAt", time(&t.started_at));
        put(&mut m, "finishedAt", time(&t.finished_at));
        put(&mut m, "containerID", text(&t.container_id));
        o.insert("terminated".into(), Value::Object(m));
    }
    Some(Value::Object(o))
}

fn container_status(c: &core::ContainerStatus) -> Value {
    let mut o = Map::new();
    put(&mut o, "name", text(&c.name));
    put(&mut o, "image", text(&c.image));
    put(&mut o, "imageID", text(&c.image_id));
    put(&mut o, "containerID", text(&c.container_id));
    put(&mut o, "ready", flag(c.ready));
    put(&mut o, "started", flag(c.started));
    put(&mut o, "restartCount", num(c.restart_count));
    if let Some(s) = container_state(&c.state) {
        o.insert("state".into(), s);
    }
    if let Some(s) = container_state(&c.last_state) {
        o.insert("lastState".into(), s);
    }
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
        put(&mut status, "capacity", quantities(&s.capacity));
        put(&mut status, "allocatable", quantities(&s.allocatable));
        let conditions: Vec<Value> = s
            .conditions
            .iter()
            .map(|c| {
                condition(
                    [&c.r#type, &c.status, &c.reason, &c.message],
                    [
                        ("lastHeartbeatTime", &c.last_heartbeat_time),
                        ("lastTransitionTime", &c.last_transition_time),
                    ],
                )
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
            if let Some(f) = &e.value_from {
                let mut m = Map::new();
                put(&mut m, "fieldRef", field_selector(&f.field_ref));
                for (name, k) in [
                    (
                        "configMapKeyRef",
                        f.config_map_key_ref
                            .as_ref()
                            .map(|k| (&k.local_object_reference, &k.key, k.optional)),
                    ),
                    (
                        "secretKeyRef",
                        f.secret_key_ref
                            .as_ref()
                            .map(|k| (&k.local_object_reference, &k.key, k.optional)),
                    ),
                ] {
                    if let Some((r, key, optional)) = k {
                        let mut sel = Map::new();
                        named(r, &mut sel);
                        put(&mut sel, "key", text(key));
                        put(&mut sel, "optional", flag(optional));
                        m.insert(name.into(), Value::Object(sel));
                    }
                }
                o.insert("valueFrom".into(), Value::Object(m));
            }
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
    if let Some(r) = &c.resources {
        let mut m = Map::new();
        put(&mut m, "limits", quantities(&r.limits));
        put(&mut m, "requests", quantities(&r.requests));
        o.insert("resources".into(), Value::Object(m));
    }
    let mounts: Vec<Value> = c
        .volume_mounts
        .iter()
        .map(|m| {
            let mut o = Map::new();
            put(&mut o, "name", text(&m.name));
            put(&mut o, "readOnly", flag(m.read_only));
            put(&mut o, "mountPath", text(&m.mount_path));
            put(&mut o, "subPath", text(&m.sub_path));
            Value::Object(o)
        })
        .collect();
    put(&mut o, "volumeMounts", json!(mounts));
    put(&mut o, "livenessProbe", probe(&c.liveness_probe));
    put(&mut o, "readinessProbe", probe(&c.readiness_probe));
    put(&mut o, "startupProbe", probe(&c.startup_probe));
    put(
        &mut o,
        "terminationMessagePath",
        text(&c.termination_message_path),
    );
    put(
        &mut o,
        "terminationMessagePolicy",
        text(&c.termination_message_policy),
    );
    if let Some(sc) = &c.security_context {
        let mut m = Map::new();
        put(&mut m, "privileged", flag(sc.privileged));
        put(&mut m, "runAsUser", num(sc.run_as_user));
        put(&mut m, "runAsGroup", num(sc.run_as_group));
        put(&mut m, "runAsNonRoot", flag(sc.run_as_non_root));
        put(
            &mut m,
            "readOnlyRootFilesystem",
            flag(sc.read_only_root_filesystem),
        );
        put(
            &mut m,
            "allowPrivilegeEscalation",
            flag(sc.allow_privilege_escalation),
        );
        o.insert("securityContext".into(), Value::Object(m));
    }
    put(&mut o, "stdin", flag(c.stdin));
    put(&mut o, "tty", flag(c.tty));
    Value::Object(o)
}

fn pod(p: core::Pod) -> Value {
    let mut spec = Map::new();
    if let Some(s) = &p.spec {
        let volumes: Vec<Value> = s.volumes.iter().map(volume).collect();
        put(&mut spec, "volumes", json!(volumes));
        let init: Vec<Value> = s.init_containers.iter().map(container).collect();
        put(&mut spec, "initContainers", json!(init));
        let containers: Vec<Value> = s.containers.iter().map(container).collect();
        put(&mut spec, "containers", json!(containers));
        put(&mut spec, "nodeName", text(&s.node_name));
        put(&mut spec, "restartPolicy", text(&s.restart_policy));
        put(
            &mut spec,
            "terminationGracePeriodSeconds",
            num(s.termination_grace_period_seconds),
        );
        put(&mut spec, "dnsPolicy", text(&s.dns_policy));
        put(
            &mut spec,
            "serviceAccountName",
            text(&s.service_account_name),
        );
        put(&mut spec, "serviceAccount", text(&s.service_account));
        put(
            &mut spec,
            "automountServiceAccountToken",
            flag(s.automount_service_account_token),
        );
        put(&mut spec, "schedulerName", text(&s.scheduler_name));
        put(&mut spec, "hostNetwork", flag(s.host_network));
        put(&mut spec, "hostPID", flag(s.host_pid));
        put(&mut spec, "hostIPC", flag(s.host_ipc));
        put(&mut spec, "nodeSelector", json!(s.node_selector));
        if let Some(sc) = &s.security_context {
            let mut m = Map::new();
            put(&mut m, "runAsUser", num(sc.run_as_user));
            put(&mut m, "runAsGroup", num(sc.run_as_group));
            put(&mut m, "runAsNonRoot", flag(sc.run_as_non_root));
            put(&mut m, "fsGroup", num(sc.fs_group));
            spec.insert("securityContext".into(), Value::Object(m));
        }
        let tolerations: Vec<Value> = s
            .tolerations
            .iter()
            .map(|t| {
                let mut o = Map::new();
                put(&mut o, "key", text(&t.key));
                put(&mut o, "operator", text(&t.operator));
                put(&mut o, "value", text(&t.value));
                put(&mut o, "effect", text(&t.effect));
                put(&mut o, "tolerationSeconds", num(t.toleration_seconds));
                Value::Object(o)
            })
            .collect();
        put(&mut spec, "tolerations", json!(tolerations));
        put(&mut spec, "priorityClassName", text(&s.priority_class_name));
        put(&mut spec, "priority", num(s.priority));
        put(
            &mut spec,
            "enableServiceLinks",
            flag(s.enable_service_links),
        );
        put(&mut spec, "preemptionPolicy", text(&s.preemption_policy));
    }
    let mut status = Map::new();
    if let Some(s) = &p.status {
        put(&mut status, "phase", text(&s.phase));
        put(&mut status, "message", text(&s.message));
        put(&mut status, "reason", text(&s.reason));
        put(&mut status, "hostIP", text(&s.host_ip));
        put(&mut status, "podIP", text(&s.pod_ip));
        let ips = |ips: Vec<&Option<String>>| {
            json!(
                ips.into_iter()
                    .map(|ip| json!({"ip": ip}))
                    .collect::<Vec<_>>()
            )
        };
        put(
            &mut status,
            "hostIPs",
            ips(s.host_ips.iter().map(|i| &i.ip).collect()),
        );
        put(
            &mut status,
            "podIPs",
            ips(s.pod_ips.iter().map(|i| &i.ip).collect()),
        );
        put(&mut status, "startTime", time(&s.start_time));
        let conditions: Vec<Value> = s
            .conditions
            .iter()
            .map(|c| {
                condition(
                    [&c.r#type, &c.status, &c.reason, &c.message],
                    [
                        ("lastProbeTime", &c.last_probe_time),
                        ("lastTransitionTime", &c.last_transition_time),
                    ],
                )
            })
            .collect();
        put(&mut status, "conditions", json!(conditions));
        let statuses: Vec<Value> = s.container_statuses.iter().map(container_status).collect();
        put(&mut status, "containerStatuses", json!(statuses));
        let init: Vec<Value> = s
            .init_container_statuses
            .iter()
            .map(container_status)
            .collect();
        put(&mut status, "initContainerStatuses", json!(init));
        put(&mut status, "qosClass", text(&s.qos_class));
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

fn ports<'a>(
    ports: impl Iterator<
        Item = (
            &'a Option<String>,
            &'a Option<String>,
            Option<i32>,
            &'a Option<String>,
        ),
    >,
) -> Value {
    let ports: Vec<Value> = ports
        .map(|(name, protocol, port, app)| {
            let mut o = Map::new();
            put(&mut o, "name", text(name));
            put(&mut o, "protocol", text(protocol));
            put(&mut o, "port", num(port));
            put(&mut o, "appProtocol", text(app));
            Value::Object(o)
        })
        .collect();
    json!(ports)
}

fn service(v: core::Service) -> Value {
    let mut spec = Map::new();
    if let Some(s) = &v.spec {
        let ports: Vec<Value> = s
            .ports
            .iter()
            .map(|p| {
                let mut o = Map::new();
                put(&mut o, "name", text(&p.name));
                put(&mut o, "protocol", text(&p.protocol));
                put(&mut o, "appProtocol", text(&p.app_protocol));
                put(&mut o, "port", num(p.port));
                put(&mut o, "targetPort", int_or_string(&p.target_port));
                put(&mut o, "nodePort", num(p.node_port));
                Value::Object(o)
            })
            .collect();
        put(&mut spec, "ports", json!(ports));
        put(&mut spec, "selector", json!(s.selector));
        put(&mut spec, "clusterIP", text(&s.cluster_ip));
        put(&mut spec, "clusterIPs", strings(&s.cluster_ips));
        put(&mut spec, "type", text(&s.r#type));
        put(&mut spec, "sessionAffinity", text(&s.session_affinity));
        put(&mut spec, "ipFamilies", strings(&s.ip_families));
    }
    json!({"metadata": meta(&v.metadata), "spec": spec})
}

fn endpoints(v: core::Endpoints) -> Value {
    let address = |a: &core::EndpointAddress| {
        let mut o = Map::new();
        put(&mut o, "ip", text(&a.ip));
        put(&mut o, "hostname", text(&a.hostname));
        put(&mut o, "nodeName", text(&a.node_name));
        put(&mut o, "targetRef", object_ref(&a.target_ref));
        Value::Object(o)
    };
    let subsets: Vec<Value> = v
        .subsets
        .iter()
        .map(|sub| {
            let mut o = Map::new();
            let ready: Vec<Value> = sub.addresses.iter().map(address).collect();
            put(&mut o, "addresses", json!(ready));
            let not_ready: Vec<Value> = sub.not_ready_addresses.iter().map(address).collect();
            put(&mut o, "notReadyAddresses", json!(not_ready));
            let p = sub
                .ports
                .iter()
                .map(|p| (&p.name, &p.protocol, p.port, &p.app_protocol));
            put(&mut o, "ports", ports(p));
            Value::Object(o)
        })
        .collect();
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&v.metadata));
    put(&mut o, "subsets", json!(subsets));
    Value::Object(o)
}

fn endpoint_slice(v: discovery::EndpointSlice) -> Value {
    let endpoints: Vec<Value> = v
        .endpoints
        .iter()
        .map(|e| {
            let mut o = Map::new();
            o.insert("addresses".into(), strings(&e.addresses));
            if let Some(c) = &e.conditions {
                let mut m = Map::new();
                put(&mut m, "ready", flag(c.ready));
                put(&mut m, "serving", flag(c.serving));
                put(&mut m, "terminating", flag(c.terminating));
                o.insert("conditions".into(), Value::Object(m));
            }
            put(&mut o, "hostname", text(&e.hostname));
            put(&mut o, "targetRef", object_ref(&e.target_ref));
            put(&mut o, "nodeName", text(&e.node_name));
            put(&mut o, "zone", text(&e.zone));
            Value::Object(o)
        })
        .collect();
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&v.metadata));
    put(&mut o, "addressType", text(&v.address_type));
    // An EndpointSlice always carries its endpoints list, empty or not.
    o.insert("endpoints".into(), json!(endpoints));
    let p = v
        .ports
        .iter()
        .map(|p| (&p.name, &p.protocol, p.port, &p.app_protocol));
    put(&mut o, "ports", ports(p));
    Value::Object(o)
}

fn secret(v: core::Secret) -> Value {
    let data: Map<String, Value> = v
        .data
        .iter()
        .map(|(k, b)| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(b);
            (k.clone(), json!(b64))
        })
        .collect();
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&v.metadata));
    put(&mut o, "data", Value::Object(data));
    put(&mut o, "type", text(&v.r#type));
    put(&mut o, "immutable", flag(v.immutable));
    Value::Object(o)
}

fn namespace(v: core::Namespace) -> Value {
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&v.metadata));
    if let Some(s) = &v.spec {
        put(&mut o, "spec", json!({"finalizers": s.finalizers}));
    }
    if let Some(phase) = v.status.as_ref().and_then(|s| s.phase.clone()) {
        o.insert("status".into(), json!({"phase": phase}));
    }
    Value::Object(o)
}

fn service_account(v: core::ServiceAccount) -> Value {
    let mut o = Map::new();
    o.insert("metadata".into(), meta(&v.metadata));
    let secrets: Vec<Value> = v
        .secrets
        .iter()
        .filter_map(|r| object_ref(&Some(r.clone())))
        .collect();
    put(&mut o, "secrets", json!(secrets));
    let pulls: Vec<Value> = v
        .image_pull_secrets
        .iter()
        .map(|r| json!({"name": r.name}))
        .collect();
    put(&mut o, "imagePullSecrets", json!(pulls));
    put(
        &mut o,
        "automountServiceAccountToken",
        flag(v.automount_service_account_token),
    );
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
        "Secret" => secret(core::Secret::decode(raw.as_slice()).map_err(bad)?),
        "Service" => service(core::Service::decode(raw.as_slice()).map_err(bad)?),
        "Endpoints" => endpoints(core::Endpoints::decode(raw.as_slice()).map_err(bad)?),
        "EndpointSlice" => {
            endpoint_slice(discovery::EndpointSlice::decode(raw.as_slice()).map_err(bad)?)
        }
        "Namespace" => namespace(core::Namespace::decode(raw.as_slice()).map_err(bad)?),
        "ServiceAccount" => {
            service_account(core::ServiceAccount::decode(raw.as_slice()).map_err(bad)?)
        }
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
    fn a_realistic_pod_round_trips_through_protobuf_unchanged() {
        let pod = super::super::seed::realistic_pod();
        let body = super::super::protobuf::object("v1", "Pod", &pod);
        let back = decode("v1", "Pod", &body).unwrap();
        assert_eq!(
            back, pod,
            "every field of the pod survives JSON -> protobuf -> JSON"
        );
    }

    #[test]
    fn every_core_kind_round_trips_through_protobuf() {
        let objects = [
            (
                "v1",
                "Service",
                json!({"metadata": {"name": "web", "namespace": "shop"},
                "spec": {"type": "ClusterIP", "clusterIP": "169.254.60.10", "clusterIPs": ["169.254.60.10"],
                    "selector": {"app": "web"}, "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
                              {"name": "metrics", "protocol": "TCP", "port": 9090, "targetPort": 9090}]}}),
            ),
            (
                "v1",
                "Endpoints",
                json!({"metadata": {"name": "web", "namespace": "shop"},
                "subsets": [{"addresses": [{"ip": "169.254.50.7", "nodeName": "edge-1",
                    "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "u1"}}],
                    "notReadyAddresses": [{"ip": "169.254.50.8"}],
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}),
            ),
            (
                "discovery.k8s.io/v1",
                "EndpointSlice",
                json!({"metadata": {"name": "web-abc12", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["169.254.50.7"], "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": "edge-1", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1"}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
            ),
            (
                "v1",
                "Secret",
                json!({"metadata": {"name": "db", "namespace": "shop"}, "type": "Opaque",
                "data": {"password": "czNjcjN0"}}),
            ),
            (
                "v1",
                "Namespace",
                json!({"metadata": {"name": "shop"}, "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"}}),
            ),
            (
                "v1",
                "ServiceAccount",
                json!({"metadata": {"name": "web", "namespace": "shop"},
                "imagePullSecrets": [{"name": "registry"}], "automountServiceAccountToken": false}),
            ),
            (
                "v1",
                "ConfigMap",
                json!({"metadata": {"name": "web-conf", "namespace": "shop"}, "data": {"level": "info"}}),
            ),
        ];
        for (av, kind, mut v) in objects {
            v["apiVersion"] = json!(av);
            v["kind"] = json!(kind);
            let body = super::super::protobuf::object(av, kind, &v);
            assert_eq!(decode(av, kind, &body).unwrap(), v, "{kind}");
        }
    }

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
