//! Kubernetes protobuf answers for the core kinds (pods, nodes, services, endpoints,
//! endpointslices, configmaps, secrets, serviceaccounts, events, namespaces, leases,
//! certificatesigningrequests): objects in the `k8s\0` +
//! runtime.Unknown envelope, lists, and length-prefixed watch frames, encoded with the real
//! k8s-pb types.
//!
//! The stand-in keeps objects as JSON, so encoding maps a declared set of fields: for pods
//! what real workloads carry (owners, volumes incl. projected service-account tokens,
//! probes, resources, env from fields/secrets/configmaps, security contexts, tolerations,
//! init containers, container states; `seed::realistic_pod` round-trips unchanged), for
//! the other kinds their common fields. Fields outside it (affinity, topology spread,
//! ephemeral containers, CSI volumes…) are not in the protobuf form; the JSON form has
//! everything. Other kinds are
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
        apis::meta::v1::{
            ListMeta, MicroTime, ObjectMeta, OwnerReference, Status, StatusCause, StatusDetails,
            Time, WatchEvent,
        },
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
        owner_references: list_of(&m["ownerReferences"], |o| OwnerReference {
            api_version: s(&o["apiVersion"]),
            kind: s(&o["kind"]),
            name: s(&o["name"]),
            uid: s(&o["uid"]),
            controller: o["controller"].as_bool(),
            block_owner_deletion: o["blockOwnerDeletion"].as_bool(),
        }),
        deletion_timestamp: time(&m["deletionTimestamp"]),
        deletion_grace_period_seconds: m["deletionGracePeriodSeconds"].as_i64(),
        ..Default::default()
    }
}

fn quantities(v: &Value) -> BTreeMap<String, Quantity> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, q)| (k.clone(), Quantity { string: s(q) }))
                .collect()
        })
        .unwrap_or_default()
}

fn local_ref(v: &Value) -> Option<core::LocalObjectReference> {
    v.is_object().then(|| core::LocalObjectReference {
        name: s(&v["name"]),
    })
}

fn key_to_path(v: &Value) -> core::KeyToPath {
    core::KeyToPath {
        key: s(&v["key"]),
        path: s(&v["path"]),
        mode: int(&v["mode"]),
    }
}

fn field_selector(v: &Value) -> Option<core::ObjectFieldSelector> {
    v.is_object().then(|| core::ObjectFieldSelector {
        api_version: s(&v["apiVersion"]),
        field_path: s(&v["fieldPath"]),
    })
}

fn env_var(v: &Value) -> core::EnvVar {
    let from = &v["valueFrom"];
    core::EnvVar {
        name: s(&v["name"]),
        value: s(&v["value"]),
        value_from: from.is_object().then(|| core::EnvVarSource {
            field_ref: field_selector(&from["fieldRef"]),
            config_map_key_ref: from["configMapKeyRef"].is_object().then(|| {
                core::ConfigMapKeySelector {
                    local_object_reference: local_ref(&from["configMapKeyRef"]),
                    key: s(&from["configMapKeyRef"]["key"]),
                    optional: from["configMapKeyRef"]["optional"].as_bool(),
                }
            }),
            secret_key_ref: from["secretKeyRef"]
                .is_object()
                .then(|| core::SecretKeySelector {
                    local_object_reference: local_ref(&from["secretKeyRef"]),
                    key: s(&from["secretKeyRef"]["key"]),
                    optional: from["secretKeyRef"]["optional"].as_bool(),
                }),
            ..Default::default()
        }),
    }
}

fn probe(v: &Value) -> Option<core::Probe> {
    let action = |a: &Value| {
        let (exec, http, tcp) = (&a["exec"], &a["httpGet"], &a["tcpSocket"]);
        core::ProbeHandler {
            exec: exec.is_object().then(|| core::ExecAction {
                command: strings(&exec["command"]),
            }),
            http_get: http.is_object().then(|| core::HttpGetAction {
                path: s(&http["path"]),
                port: int_or_string(&http["port"]),
                host: s(&http["host"]),
                scheme: s(&http["scheme"]),
                ..Default::default()
            }),
            tcp_socket: tcp.is_object().then(|| core::TcpSocketAction {
                port: int_or_string(&tcp["port"]),
                host: s(&tcp["host"]),
            }),
            ..Default::default()
        }
    };
    v.is_object().then(|| core::Probe {
        handler: Some(action(v)),
        initial_delay_seconds: int(&v["initialDelaySeconds"]),
        timeout_seconds: int(&v["timeoutSeconds"]),
        period_seconds: int(&v["periodSeconds"]),
        success_threshold: int(&v["successThreshold"]),
        failure_threshold: int(&v["failureThreshold"]),
        ..Default::default()
    })
}

fn volume(v: &Value) -> core::Volume {
    let (cm, secret, empty, host, pvc, projected, downward) = (
        &v["configMap"],
        &v["secret"],
        &v["emptyDir"],
        &v["hostPath"],
        &v["persistentVolumeClaim"],
        &v["projected"],
        &v["downwardAPI"],
    );
    let downward_files = |d: &Value| {
        list_of(&d["items"], |f| core::DownwardAPIVolumeFile {
            path: s(&f["path"]),
            field_ref: field_selector(&f["fieldRef"]),
            mode: int(&f["mode"]),
            ..Default::default()
        })
    };
    let source = core::VolumeSource {
        config_map: cm.is_object().then(|| core::ConfigMapVolumeSource {
            local_object_reference: local_ref(cm),
            items: list_of(&cm["items"], key_to_path),
            default_mode: int(&cm["defaultMode"]),
            optional: cm["optional"].as_bool(),
        }),
        secret: secret.is_object().then(|| core::SecretVolumeSource {
            secret_name: s(&secret["secretName"]),
            items: list_of(&secret["items"], key_to_path),
            default_mode: int(&secret["defaultMode"]),
            optional: secret["optional"].as_bool(),
        }),
        empty_dir: empty.is_object().then(|| core::EmptyDirVolumeSource {
            medium: s(&empty["medium"]),
            size_limit: empty["sizeLimit"].as_str().map(|q| Quantity {
                string: Some(q.into()),
            }),
        }),
        host_path: host.is_object().then(|| core::HostPathVolumeSource {
            path: s(&host["path"]),
            r#type: s(&host["type"]),
        }),
        persistent_volume_claim: pvc
            .is_object()
            .then(|| core::PersistentVolumeClaimVolumeSource {
                claim_name: s(&pvc["claimName"]),
                read_only: pvc["readOnly"].as_bool(),
            }),
        downward_api: downward.is_object().then(|| core::DownwardAPIVolumeSource {
            items: downward_files(downward),
            default_mode: int(&downward["defaultMode"]),
        }),
        projected: projected.is_object().then(|| core::ProjectedVolumeSource {
            sources: list_of(&projected["sources"], |p| {
                let (token, cm, secret, down) = (
                    &p["serviceAccountToken"],
                    &p["configMap"],
                    &p["secret"],
                    &p["downwardAPI"],
                );
                core::VolumeProjection {
                    service_account_token: token.is_object().then(|| {
                        core::ServiceAccountTokenProjection {
                            audience: s(&token["audience"]),
                            expiration_seconds: token["expirationSeconds"].as_i64(),
                            path: s(&token["path"]),
                        }
                    }),
                    config_map: cm.is_object().then(|| core::ConfigMapProjection {
                        local_object_reference: local_ref(cm),
                        items: list_of(&cm["items"], key_to_path),
                        optional: cm["optional"].as_bool(),
                    }),
                    secret: secret.is_object().then(|| core::SecretProjection {
                        local_object_reference: local_ref(secret),
                        items: list_of(&secret["items"], key_to_path),
                        optional: secret["optional"].as_bool(),
                    }),
                    downward_api: down.is_object().then(|| core::DownwardAPIProjection {
                        items: downward_files(down),
                    }),
                    ..Default::default()
                }
            }),
            default_mode: int(&projected["defaultMode"]),
        }),
        ..Default::default()
    };
    core::Volume {
        name: s(&v["name"]),
        volume_source: Some(source),
    }
}

fn container_state(v: &Value) -> Option<core::ContainerState> {
    let (running, waiting, terminated) = (&v["running"], &v["waiting"], &v["terminated"]);
    v.is_object().then(|| core::ContainerState {
        running: running.is_object().then(|| core::ContainerStateRunning {
            started_at: time(&running["startedAt"]),
        }),
        waiting: waiting.is_object().then(|| core::ContainerStateWaiting {
            reason: s(&waiting["reason"]),
            message: s(&waiting["message"]),
        }),
        terminated: terminated
            .is_object()
            .then(|| core::ContainerStateTerminated {
                exit_code: int(&terminated["exitCode"]),
                signal: int(&terminated["signal"]),
                reason: s(&terminated["reason"]),
                message: s(&terminated["message"]),
                started_at: time(&terminated["startedAt"]),
                finished_at: time(&terminated["finishedAt"]),
                container_id: s(&terminated["containerID"]),
            }),
    })
}

fn container_status(v: &Value) -> core::ContainerStatus {
    core::ContainerStatus {
        name: s(&v["name"]),
        image: s(&v["image"]),
        image_id: s(&v["imageID"]),
        container_id: s(&v["containerID"]),
        ready: v["ready"].as_bool(),
        started: v["started"].as_bool(),
        restart_count: int(&v["restartCount"]),
        state: container_state(&v["state"]),
        last_state: container_state(&v["lastState"]),
        ..Default::default()
    }
}

fn container(c: &Value) -> core::Container {
    let (resources, security) = (&c["resources"], &c["securityContext"]);
    core::Container {
        name: s(&c["name"]),
        image: s(&c["image"]),
        command: strings(&c["command"]),
        args: strings(&c["args"]),
        working_dir: s(&c["workingDir"]),
        image_pull_policy: s(&c["imagePullPolicy"]),
        env: list_of(&c["env"], env_var),
        resources: resources.is_object().then(|| core::ResourceRequirements {
            limits: quantities(&resources["limits"]),
            requests: quantities(&resources["requests"]),
            ..Default::default()
        }),
        volume_mounts: list_of(&c["volumeMounts"], |m| core::VolumeMount {
            name: s(&m["name"]),
            read_only: m["readOnly"].as_bool(),
            mount_path: s(&m["mountPath"]),
            sub_path: s(&m["subPath"]),
            ..Default::default()
        }),
        liveness_probe: probe(&c["livenessProbe"]),
        readiness_probe: probe(&c["readinessProbe"]),
        startup_probe: probe(&c["startupProbe"]),
        termination_message_path: s(&c["terminationMessagePath"]),
        termination_message_policy: s(&c["terminationMessagePolicy"]),
        security_context: security.is_object().then(|| core::SecurityContext {
            privileged: security["privileged"].as_bool(),
            run_as_user: security["runAsUser"].as_i64(),
            run_as_group: security["runAsGroup"].as_i64(),
            run_as_non_root: security["runAsNonRoot"].as_bool(),
            read_only_root_filesystem: security["readOnlyRootFilesystem"].as_bool(),
            allow_privilege_escalation: security["allowPrivilegeEscalation"].as_bool(),
            ..Default::default()
        }),
        stdin: c["stdin"].as_bool(),
        tty: c["tty"].as_bool(),
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
            volumes: list_of(&spec["volumes"], volume),
            init_containers: list_of(&spec["initContainers"], container),
            containers: list_of(&spec["containers"], container),
            node_name: s(&spec["nodeName"]),
            restart_policy: s(&spec["restartPolicy"]),
            termination_grace_period_seconds: spec["terminationGracePeriodSeconds"].as_i64(),
            dns_policy: s(&spec["dnsPolicy"]),
            service_account_name: s(&spec["serviceAccountName"]),
            service_account: s(&spec["serviceAccount"]),
            automount_service_account_token: spec["automountServiceAccountToken"].as_bool(),
            scheduler_name: s(&spec["schedulerName"]),
            host_network: spec["hostNetwork"].as_bool(),
            host_pid: spec["hostPID"].as_bool(),
            host_ipc: spec["hostIPC"].as_bool(),
            node_selector: map(&spec["nodeSelector"]),
            security_context: spec["securityContext"].is_object().then(|| {
                let sc = &spec["securityContext"];
                core::PodSecurityContext {
                    run_as_user: sc["runAsUser"].as_i64(),
                    run_as_group: sc["runAsGroup"].as_i64(),
                    run_as_non_root: sc["runAsNonRoot"].as_bool(),
                    fs_group: sc["fsGroup"].as_i64(),
                    ..Default::default()
                }
            }),
            tolerations: list_of(&spec["tolerations"], |t| core::Toleration {
                key: s(&t["key"]),
                operator: s(&t["operator"]),
                value: s(&t["value"]),
                effect: s(&t["effect"]),
                toleration_seconds: t["tolerationSeconds"].as_i64(),
            }),
            priority_class_name: s(&spec["priorityClassName"]),
            priority: int(&spec["priority"]),
            enable_service_links: spec["enableServiceLinks"].as_bool(),
            preemption_policy: s(&spec["preemptionPolicy"]),
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
                            last_probe_time: time(&v["lastProbeTime"]),
                            last_transition_time: time(&v["lastTransitionTime"]),
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            container_statuses: list_of(&status["containerStatuses"], container_status),
            init_container_statuses: list_of(&status["initContainerStatuses"], container_status),
            host_ips: list_of(&status["hostIPs"], |p| core::HostIp { ip: s(&p["ip"]) }),
            pod_ips: list_of(&status["podIPs"], |p| core::PodIp { ip: s(&p["ip"]) }),
            qos_class: s(&status["qosClass"]),
            message: s(&status["message"]),
            reason: s(&status["reason"]),
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
        "TokenRequest" => super::tokens::encode(o),
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

/// An empty list of `kind`s as kube-apiserver 1.32 names it in a streamed list's
/// `initial-events-list-blueprint`: its ListMeta's three strings written though empty
/// (gogo-protobuf writes every non-pointer string), no items.
pub fn blueprint(api_version: &str, kind: &str) -> Vec<u8> {
    let meta = ListMeta {
        self_link: Some(String::new()),
        resource_version: Some(String::new()),
        r#continue: Some(String::new()),
        remaining_item_count: None,
    };
    let body = core::PodList {
        metadata: Some(meta),
        items: vec![],
    }
    .encode_to_vec();
    envelope(api_version, &format!("{kind}List"), body)
}

/// One length-prefixed watch frame: a WatchEvent whose object is the enveloped object.
pub fn watch_frame(event_type: &str, api_version: &str, kind: &str, o: &Value) -> Vec<u8> {
    event_frame(event_type, object(api_version, kind, o))
}

/// A raw WatchEvent around an enveloped object, length-prefixed. As kube-apiserver writes
/// it, the frame has no `k8s\0` envelope; only the object inside does.
fn event_frame(event_type: &str, object: Vec<u8>) -> Vec<u8> {
    let event = WatchEvent {
        r#type: Some(event_type.into()),
        object: Some(RawExtension { raw: Some(object) }),
    };
    let body = event.encode_to_vec();
    [(body.len() as u32).to_be_bytes().to_vec(), body].concat()
}

/// A Status error in its JSON form, as kube-apiserver sends it to a protobuf client.
pub fn status(v: &Value) -> Vec<u8> {
    let d = &v["details"];
    let details = d.is_object().then(|| StatusDetails {
        name: s(&d["name"]),
        group: s(&d["group"]),
        kind: s(&d["kind"]),
        uid: s(&d["uid"]),
        causes: list_of(&d["causes"], |c| StatusCause {
            reason: s(&c["reason"]),
            message: s(&c["message"]),
            field: s(&c["field"]),
        }),
        retry_after_seconds: int(&d["retryAfterSeconds"]),
    });
    let status = Status {
        metadata: Some(ListMeta::default()),
        status: s(&v["status"]),
        message: s(&v["message"]),
        reason: s(&v["reason"]),
        details,
        code: int(&v["code"]),
    };
    envelope("v1", "Status", status.encode_to_vec())
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
