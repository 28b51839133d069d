//! Discovery and the small fixed endpoints: /api, /apis, group versions, /version, and the
//! authorization reviews kubectl uses (`auth can-i`, `auth whoami`).
use hyper::StatusCode;
use serde_json::{Value, json};

use super::{
    State,
    auth::User,
    http::{Body, json_response},
    resources::{self, RESOURCES},
};

/// `/version` as `version` answers it (1.36 adds the emulation and compatibility
/// versions).
pub fn version(version: super::Version) -> Value {
    let mut v = json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0-hub-standin", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0", "compiler": "gc", "platform": "linux/amd64"
    });
    if version == super::Version::V1_36 {
        for (k, value) in [
            ("minor", "36"),
            ("gitVersion", "v1.36.0-hub-standin"),
            ("emulationMajor", "1"),
            ("emulationMinor", "36"),
            ("minCompatibilityMajor", "1"),
            ("minCompatibilityMinor", "35"),
            ("goVersion", "go1.26.0"),
        ] {
            v[k] = value.into();
        }
    }
    v
}

pub fn api_versions(server: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]})
}

pub fn api_groups() -> Value {
    let groups: Vec<Value> = resources::groups()
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// APIResourceList for one group version, or None if unknown.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    if group == "authentication.k8s.io" && version == "v1" {
        list.push(json!({"name": "selfsubjectreviews", "singularName": "selfsubjectreview", "namespaced": false, "kind": "SelfSubjectReview", "verbs": ["create"]}));
    }
    if group == "authorization.k8s.io" && version == "v1" {
        list.push(json!({"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": false, "kind": "SelfSubjectAccessReview", "verbs": ["create"]}));
    }
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.name, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": VERBS, "storageVersionHash": "standin",
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if r.kind == "Pod" || r.kind == "Service" {
            entry["categories"] = json!(["all"]);
        }
        list.push(entry);
        for sub in r.subresources {
            let (kind, verbs) = match *sub {
                "status" | "approval" => (r.kind, vec!["get", "patch", "update"]),
                "log" => (r.kind, vec!["get"]),
                "binding" => ("Binding", vec!["create"]),
                "token" => ("TokenRequest", vec!["create"]),
                _ => ("PodExecOptions", vec!["create", "get"]),
            };
            list.push(json!({"name": format!("{}/{sub}", r.name), "singularName": "", "namespaced": r.namespaced, "kind": kind, "verbs": verbs}));
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut list = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list});
    if group.is_empty() {
        // kube-apiserver's /api/v1 alone has no apiVersion.
        list.as_object_mut().map(|m| m.remove("apiVersion"));
    }
    Some(list)
}

/// The media type of aggregated discovery, as kube-apiserver names it in Content-Type.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an Accept header asks for aggregated discovery (v2) before the legacy form.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|alt| {
        let params: Vec<String> = alt
            .split(';')
            .map(|p| p.trim().to_ascii_lowercase())
            .collect();
        params.iter().any(|p| p == "g=apidiscovery.k8s.io")
            && params.iter().any(|p| p == "v=v2")
            && params.iter().any(|p| p == "as=apigroupdiscoverylist")
    })
}

/// Aggregated discovery (apidiscovery.k8s.io/v2): every resource of the core group (`/api`)
/// or of the named groups (`/apis`) in one answer, built from the same table as the
/// per-group lists.
pub fn aggregated(core: bool) -> Value {
    let groups: Vec<(&str, &str)> = if core {
        vec![("", "v1")]
    } else {
        resources::groups()
    };
    let items: Vec<Value> = groups
        .into_iter()
        .filter_map(|(g, v)| {
            let list = resource_list(g, v)?;
            let all = list["resources"].as_array().cloned().unwrap_or_default();
            let kind_of = |kind: &Value| json!({"group": g, "version": v, "kind": kind});
            let entries: Vec<Value> = all
                .iter()
                .filter(|r| !r["name"].as_str().unwrap_or_default().contains('/'))
                .map(|r| {
                    let name = r["name"].as_str().unwrap_or_default();
                    let subs: Vec<Value> = all
                        .iter()
                        .filter_map(|s| {
                            let sub = s["name"].as_str()?.strip_prefix(&format!("{name}/"))?;
                            Some(json!({"subresource": sub, "responseKind": kind_of(&s["kind"]), "verbs": s["verbs"]}))
                        })
                        .collect();
                    let mut e = json!({
                        "resource": name, "responseKind": kind_of(&r["kind"]),
                        "scope": if r["namespaced"] == true { "Namespaced" } else { "Cluster" },
                        "singularResource": r["singularName"], "verbs": r["verbs"],
                    });
                    for k in ["shortNames", "categories"] {
                        if r[k].is_array() {
                            e[k] = r[k].clone();
                        }
                    }
                    if !subs.is_empty() {
                        e["subresources"] = json!(subs);
                    }
                    e
                })
                .collect();
            // The core group has no name in kube-apiserver's document.
            let mut metadata = json!({"name": g, "creationTimestamp": null});
            if g.is_empty() {
                metadata.as_object_mut().map(|m| m.remove("name"));
            }
            Some(json!({"metadata": metadata, "versions": [{"version": v, "resources": entries, "freshness": "Current"}]}))
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// POST selfsubjectaccessreviews: would this user be allowed?
pub fn access_review(state: &State, user: &User, body: &Value) -> hyper::Response<Body> {
    let a = &body["spec"]["resourceAttributes"];
    let verb = a["verb"].as_str().unwrap_or("");
    let fields = Default::default();
    let attributes = super::node_authz::Attributes {
        verb,
        resource: a["resource"].as_str().unwrap_or(""),
        subresource: a["subresource"].as_str().filter(|s| !s.is_empty()),
        namespace: a["namespace"].as_str().unwrap_or(""),
        name: a["name"].as_str().filter(|s| !s.is_empty()),
        fields: &fields,
    };
    let allowed = state.authorize(user, &attributes).is_ok();
    let mut out = body.clone();
    // As kube-apiserver answers: metadata set, and a denial without a reason when no RBAC
    // rule matched (only an explicit deny carries one).
    if !out["metadata"].is_object() {
        out["metadata"] = json!({"creationTimestamp": null});
    }
    out["status"] = json!({"allowed": allowed});
    json_response(StatusCode::CREATED, &out)
}

/// `/openapi/v3`: the group-version index kubectl reads first.
pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<String> = vec!["api/v1".into()];
    gvs.extend(
        resources::groups()
            .into_iter()
            .map(|(g, v)| format!("apis/{g}/{v}")),
    );
    for gv in gvs {
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=standin")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<gv>`: no schemas, but every resource's PATCH operation with its GVK and
/// the `fieldValidation` parameter, which is what kubectl checks before trusting the
/// server to validate (so it skips client-side schema validation).
pub fn openapi_v3_group(gv: &str) -> Option<Value> {
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.name)
        } else {
            format!("{prefix}/{}/{{name}}", r.name)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
        ]);
        paths.insert(path, json!({
            "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get", "responses": {}},
            "patch": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch", "parameters": params, "responses": {}}
        }));
    }
    if paths.is_empty() {
        return None;
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": {}}}),
    )
}
