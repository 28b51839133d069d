//! kube-apiserver's etcd key layout, so a kube-apiserver pointed at the coordinator's etcd
//! could read what the hubs write:
//! `<prefix>/<resource>/<namespace>/<name>`, cluster-scoped objects without the namespace,
//! kube-apiserver's historical prefixes for a few core resources (`services/specs`,
//! `services/endpoints`, `minions`, `controllers`, `ingress`), and `<prefix>/<group>/<resource>/…`
//! for kinds outside the built-in groups (CRDs).

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("{what} {value:?} cannot be part of a key: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
}

/// Groups whose resources kube-apiserver stores under the bare resource name.
fn builtin_group(group: &str) -> bool {
    group.is_empty()
        || group.ends_with(".k8s.io")
        || matches!(
            group,
            "apps" | "batch" | "autoscaling" | "policy" | "extensions"
        )
}

/// The storage path segment(s) for a resource of `group`.
pub fn storage_resource(group: &str, resource: &str) -> String {
    match (group, resource) {
        ("", "services") => "services/specs".into(),
        ("", "endpoints") => "services/endpoints".into(),
        ("", "nodes") => "minions".into(),
        ("", "replicationcontrollers") => "controllers".into(),
        ("networking.k8s.io" | "extensions", "ingresses") => "ingress".into(),
        (g, r) if builtin_group(g) => r.into(),
        (g, r) => format!("{g}/{r}"),
    }
}

/// Names and namespaces become path segments: nothing that could climb out of one.
fn segment(what: &'static str, value: &str) -> Result<(), KeyError> {
    let bad = |reason| {
        Err(KeyError::Invalid {
            what,
            value: value.into(),
            reason,
        })
    };
    if value.is_empty() {
        return bad("empty");
    }
    if value == "." || value == ".." {
        return bad("a relative path segment");
    }
    if value.contains('/') || value.contains('\0') {
        return bad("contains '/' or NUL");
    }
    if value.len() > 253 {
        return bad("longer than 253 bytes");
    }
    Ok(())
}

/// The key of one object. `namespace` is None for cluster-scoped resources.
pub fn object_key(
    prefix: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<String, KeyError> {
    segment("resource", resource)?;
    segment("name", name)?;
    let base = format!(
        "{}/{}",
        prefix.trim_end_matches('/'),
        storage_resource(group, resource)
    );
    match namespace {
        Some(ns) => {
            segment("namespace", ns)?;
            Ok(format!("{base}/{ns}/{name}"))
        }
        None => Ok(format!("{base}/{name}")),
    }
}

/// The prefix covering every object of a resource (in one namespace, if given), ending
/// in `/` so `pods/ns1/` never matches `pods/ns10/`.
pub fn range_prefix(
    prefix: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Result<String, KeyError> {
    segment("resource", resource)?;
    let base = format!(
        "{}/{}/",
        prefix.trim_end_matches('/'),
        storage_resource(group, resource)
    );
    match namespace {
        Some(ns) => {
            segment("namespace", ns)?;
            Ok(format!("{base}{ns}/"))
        }
        None => Ok(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_apiserver_layout() {
        let k = |g, r, ns, n| object_key("/registry", g, r, ns, n).unwrap();
        assert_eq!(
            k("", "pods", Some("default"), "p1"),
            "/registry/pods/default/p1"
        );
        assert_eq!(
            k("", "services", Some("default"), "web"),
            "/registry/services/specs/default/web"
        );
        assert_eq!(
            k("", "endpoints", Some("default"), "web"),
            "/registry/services/endpoints/default/web"
        );
        assert_eq!(k("", "nodes", None, "edge-1"), "/registry/minions/edge-1");
        assert_eq!(
            k("", "namespaces", None, "kube-system"),
            "/registry/namespaces/kube-system"
        );
        assert_eq!(
            k("discovery.k8s.io", "endpointslices", Some("a"), "s"),
            "/registry/endpointslices/a/s"
        );
        assert_eq!(
            k(
                "coordination.k8s.io",
                "leases",
                Some("kube-node-lease"),
                "n"
            ),
            "/registry/leases/kube-node-lease/n"
        );
        assert_eq!(
            k("apps", "daemonsets", Some("kube-system"), "hub"),
            "/registry/daemonsets/kube-system/hub"
        );
        assert_eq!(
            k("example.hub.dev", "widgets", Some("default"), "w"),
            "/registry/example.hub.dev/widgets/default/w"
        );
        assert_eq!(
            object_key("/custom/", "", "pods", Some("a"), "b").unwrap(),
            "/custom/pods/a/b"
        );
    }

    #[test]
    fn ranges_do_not_overlap_between_namespaces() {
        let ns1 = range_prefix("/registry", "", "pods", Some("ns1")).unwrap();
        assert_eq!(ns1, "/registry/pods/ns1/");
        assert!(!"/registry/pods/ns10/p".starts_with(&ns1));
        assert_eq!(
            range_prefix("/registry", "", "services", None).unwrap(),
            "/registry/services/specs/"
        );
    }

    #[test]
    fn path_tricks_are_rejected() {
        for bad in ["", ".", "..", "a/b", "x\0y", &"n".repeat(254)] {
            assert!(
                object_key("/registry", "", "pods", Some("default"), bad).is_err(),
                "name {bad:?}"
            );
            assert!(
                object_key("/registry", "", "pods", Some(bad), "p").is_err(),
                "namespace {bad:?}"
            );
        }
    }
}
