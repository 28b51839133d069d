//! kube-apiserver's Node authorizer, with the name checks of its NodeRestriction admission
//! plugin, for users `system:node:<n>` in group `system:nodes` (as in 1.32, where
//! AuthorizeNodeWithSelectors is on).
//!
//! A node may read only its own Node, and every service and endpoints object; write only
//! its own Node, lease and CSINode; read pods bound to it (list and watch only with
//! `fieldSelector=spec.nodeName=<n>`) and update their status; read a Secret, ConfigMap
//! or PersistentVolumeClaim, and ask for a ServiceAccount's token, only when a pod bound
//! to it references that object; send events and CSRs; manage its own ResourceSlices
//! (by `spec.nodeName`). Anything else gets no opinion
//! here, and the RBAC rules decide (as the `Node,RBAC` authorizer chain does).
use serde_json::Value;

use super::{auth::User, resources, select::FieldSelector, store::Store};

/// What the authorizer sees of a request.
pub struct Attributes<'a> {
    pub verb: &'a str,
    /// Plural resource name (`pods`, `leases`, ...).
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    /// "" for cluster-scoped requests.
    pub namespace: &'a str,
    /// The object's name: from the path, or for list and watch from
    /// `fieldSelector=metadata.name=<name>`, as kube-apiserver's request info sets it.
    pub name: Option<&'a str>,
    pub fields: &'a FieldSelector,
}

/// The node a request speaks for, when it is a node's.
pub fn node_of(user: &User) -> Option<&str> {
    if !user.groups.iter().any(|g| g == "system:nodes") {
        return None;
    }
    user.name.strip_prefix("system:node:")
}

/// The Node authorizer's answer: allow, or no opinion (RBAC decides) with the reason it
/// gives kube-apiserver's Forbidden message, when it has one.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    NoOpinion(Option<String>),
}

pub fn decide(store: &Store, node: &str, a: &Attributes) -> Decision {
    let read = matches!(a.verb, "get" | "list" | "watch");
    let own = a.name.is_none_or(|n| n == node);
    let unrelated = || {
        Some(format!(
            "no relationship found between node '{node}' and this object"
        ))
    };
    let graph = |allowed: bool| {
        if allowed {
            Decision::Allow
        } else {
            Decision::NoOpinion(unrelated())
        }
    };
    let rule = |allowed: bool| {
        if allowed {
            Decision::Allow
        } else {
            Decision::NoOpinion(None)
        }
    };
    match (a.resource, a.subresource) {
        ("secrets" | "configmaps" | "persistentvolumeclaims", None) if read => graph(
            a.name
                .is_some_and(|name| referenced(store, node, a.namespace, a.resource, name)),
        ),
        ("serviceaccounts", Some("token")) if a.verb == "create" => graph(
            a.name
                .is_some_and(|name| referenced(store, node, a.namespace, "serviceaccounts", name)),
        ),
        ("pods", None) => match a.verb {
            "get" | "delete" => graph(
                a.name
                    .is_some_and(|name| bound_pod(store, node, a.namespace, name)),
            ),
            "list" | "watch" if a.fields.equals("spec.nodeName") == Some(node) => Decision::Allow,
            "list" | "watch" => Decision::NoOpinion(Some(
                "can only list/watch pods with spec.nodeName field selector".into(),
            )),
            // Mirror pods of the node's static pods.
            "create" => Decision::Allow,
            _ => Decision::NoOpinion(None),
        },
        ("pods", Some("status")) if matches!(a.verb, "update" | "patch") => graph(
            a.name
                .is_some_and(|name| bound_pod(store, node, a.namespace, name)),
        ),
        // AuthorizeNodeWithSelectors (on since 1.32): a node reads its own Node only, by
        // its name in the path or `fieldSelector=metadata.name=<n>`.
        ("nodes", None) if read => match a.name {
            Some(name) if name == node => Decision::Allow,
            Some(name) => Decision::NoOpinion(Some(format!(
                "node '{node}' cannot read '{name}', only its own Node object"
            ))),
            None => Decision::NoOpinion(Some(format!(
                "node '{node}' cannot read all nodes, only its own Node object"
            ))),
        },
        ("nodes", None) => rule(a.verb == "create" || (a.name.is_some() && own)),
        ("nodes", Some("status")) => rule(matches!(a.verb, "get" | "update" | "patch") && own),
        ("leases", None) => {
            rule(a.namespace == "kube-node-lease" && a.verb != "deletecollection" && own)
        }
        ("csinodes", None) => rule(!matches!(a.verb, "list" | "watch" | "deletecollection") && own),
        ("events", None) => rule(matches!(a.verb, "create" | "update" | "patch")),
        ("certificatesigningrequests", None) => {
            rule(matches!(a.verb, "create" | "get" | "list" | "watch"))
        }
        ("services" | "endpoints" | "csidrivers" | "runtimeclasses", None) => rule(read),
        // Its own ResourceSlices (kubelet 1.36 wipes them at every start).
        ("resourceslices", None) => rule(match a.verb {
            "list" | "watch" | "deletecollection" => a.fields.equals("spec.nodeName") == Some(node),
            _ => true,
        }),
        ("tokenreviews" | "subjectaccessreviews", None) => rule(a.verb == "create"),
        _ => Decision::NoOpinion(None),
    }
}

/// Whether the pod `namespace/name` is bound to `node`.
fn bound_pod(store: &Store, node: &str, namespace: &str, name: &str) -> bool {
    let Some(pods) = resources::find("", "v1", "pods") else {
        return false;
    };
    let key = super::store::Key {
        resource: pods,
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    store
        .get(&key)
        .is_some_and(|pod| pod["spec"]["nodeName"].as_str() == Some(node))
}

/// Whether some pod bound to `node` in `namespace` references the `resource` called `name`.
fn referenced(store: &Store, node: &str, namespace: &str, resource: &str, name: &str) -> bool {
    let Some(pods) = resources::find("", "v1", "pods") else {
        return false;
    };
    let Ok(page) = store.list(pods, Some(namespace), None, None, 0, |p| {
        p["spec"]["nodeName"].as_str() == Some(node)
    }) else {
        return false;
    };
    page.items
        .iter()
        .any(|pod| references(&pod["spec"], resource).any(|r| r == name))
}

/// The names of `resource` objects a pod spec uses: volumes (also projected), env and
/// envFrom of every container, image pull secrets, its service account.
fn references<'a>(spec: &'a Value, resource: &str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
    let list = |v: &'a Value| v.as_array().into_iter().flatten();
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |c| list(&spec[c]));
    match resource {
        "secrets" | "configmaps" => {
            let (volume, volume_field, env_ref, from_ref) = if resource == "secrets" {
                ("secret", "secretName", "secretKeyRef", "secretRef")
            } else {
                ("configMap", "name", "configMapKeyRef", "configMapRef")
            };
            let volumes = list(&spec["volumes"]).flat_map(move |v| {
                let direct = v[volume][volume_field].as_str();
                let projected = list(&v["projected"]["sources"])
                    .filter_map(move |s| s[volume]["name"].as_str());
                direct.into_iter().chain(projected)
            });
            let env = containers.clone().flat_map(move |c| {
                let values =
                    list(&c["env"]).filter_map(move |e| e["valueFrom"][env_ref]["name"].as_str());
                let from = list(&c["envFrom"]).filter_map(move |e| e[from_ref]["name"].as_str());
                values.chain(from)
            });
            let secrets = resource == "secrets";
            let pulls = list(&spec["imagePullSecrets"])
                .filter(move |_| secrets)
                .filter_map(|s| s["name"].as_str());
            Box::new(volumes.chain(env).chain(pulls))
        }
        "persistentvolumeclaims" => Box::new(
            list(&spec["volumes"]).filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str()),
        ),
        "serviceaccounts" => Box::new(std::iter::once(
            spec["serviceAccountName"].as_str().unwrap_or("default"),
        )),
        _ => Box::new(std::iter::empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_spec_names_what_it_references() {
        let spec = json!({
            "serviceAccountName": "app",
            "volumes": [
                {"name": "a", "secret": {"secretName": "vol-secret"}},
                {"name": "b", "configMap": {"name": "vol-cm"}},
                {"name": "c", "projected": {"sources": [{"secret": {"name": "proj-secret"}}, {"configMap": {"name": "proj-cm"}}]}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}
            ],
            "containers": [{"env": [{"valueFrom": {"secretKeyRef": {"name": "env-secret"}}}],
                            "envFrom": [{"configMapRef": {"name": "from-cm"}}]}],
            "initContainers": [{"envFrom": [{"secretRef": {"name": "init-secret"}}]}],
            "imagePullSecrets": [{"name": "pull"}]
        });
        let names = |r| {
            let mut v: Vec<&str> = references(&spec, r).collect();
            v.sort();
            v
        };
        assert_eq!(
            names("secrets"),
            [
                "env-secret",
                "init-secret",
                "proj-secret",
                "pull",
                "vol-secret"
            ]
        );
        assert_eq!(names("configmaps"), ["from-cm", "proj-cm", "vol-cm"]);
        assert_eq!(names("persistentvolumeclaims"), ["data"]);
        assert_eq!(names("serviceaccounts"), ["app"]);
    }
}
