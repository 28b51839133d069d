//! The kinds the stand-in serves, with the discovery facts kube-apiserver publishes.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(pub usize);

#[derive(Debug)]
pub struct Resource {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lowercase, as in URLs.
    pub name: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Subresources besides the main resource (`status`, `log`, `exec`, ...).
    pub subresources: &'static [&'static str],
    /// Whether `.status` is only writable through the status subresource.
    pub has_status: bool,
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.name.to_string()
        } else {
            format!("{}.{}", self.name, self.group)
        }
    }
}

#[allow(clippy::too_many_arguments)] // one row of the table below
const fn r(
    group: &'static str,
    version: &'static str,
    name: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    subresources: &'static [&'static str],
) -> Resource {
    let mut has_status = false;
    let mut i = 0;
    while i < subresources.len() {
        let s = subresources[i].as_bytes();
        if s.len() == 6 && s[0] == b's' && s[5] == b's' {
            has_status = true;
        }
        i += 1;
    }
    Resource {
        group,
        version,
        name,
        singular,
        kind,
        namespaced,
        short_names,
        subresources,
        has_status,
    }
}

/// Every served resource. The CRD-like `widgets` kind exercises unstructured paths.
#[rustfmt::skip]
pub static RESOURCES: &[Resource] = &[
    r("", "v1", "namespaces", "namespace", "Namespace", false, &["ns"], &["status"]),
    r("", "v1", "nodes", "node", "Node", false, &["no"], &["status"]),
    r("", "v1", "pods", "pod", "Pod", true, &["po"], &["status", "log", "exec", "attach", "binding"]),
    r("", "v1", "services", "service", "Service", true, &["svc"], &["status"]),
    r("", "v1", "endpoints", "endpoints", "Endpoints", true, &["ep"], &[]),
    r("", "v1", "configmaps", "configmap", "ConfigMap", true, &["cm"], &[]),
    r("", "v1", "secrets", "secret", "Secret", true, &[], &[]),
    r("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, &["sa"], &["token"]),
    r("", "v1", "events", "event", "Event", true, &["ev"], &[]),
    r("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, &[], &[]),
    r("discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice", true, &[], &[]),
    r("certificates.k8s.io", "v1", "certificatesigningrequests", "certificatesigningrequest", "CertificateSigningRequest", false, &["csr"], &["status", "approval"]),
    r("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true, &["ds"], &["status"]),
    r("apps", "v1", "statefulsets", "statefulset", "StatefulSet", true, &["sts"], &["status"]),
    r("apps", "v1", "deployments", "deployment", "Deployment", true, &["deploy"], &["status"]),
    r("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", false, &[], &[]),
    r("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", false, &[], &[]),
    r("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, &[], &[]),
    r("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", true, &[], &[]),
    r("node.k8s.io", "v1", "runtimeclasses", "runtimeclass", "RuntimeClass", false, &[], &[]),
    r("storage.k8s.io", "v1", "csidrivers", "csidriver", "CSIDriver", false, &[], &[]),
    r("storage.k8s.io", "v1", "csinodes", "csinode", "CSINode", false, &[], &[]),
    r("resource.k8s.io", "v1", "resourceslices", "resourceslice", "ResourceSlice", false, &[], &[]),
    r("example.hub.dev", "v1", "widgets", "widget", "Widget", true, &["wd"], &[]),
];

/// Groups in discovery order (the core group is served at /api, not /apis).
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out.push(("authentication.k8s.io", "v1"));
    out.push(("authorization.k8s.io", "v1"));
    out
}

pub fn find(group: &str, version: &str, name: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.name == name)
        .map(ResourceId)
}

pub fn get(id: ResourceId) -> &'static Resource {
    &RESOURCES[id.0]
}
