//! The calls a real kubelet makes, by shape, for each recorded version
//! (tests/fixtures/wire/kubelet-<version>, its `kubelet-<version>-summary.tsv`): verb,
//! path template (`{namespace}`, `{name}`, ... stand for one segment) and the query's
//! parameter names. A kubelet-shaped client checks against these that it makes exactly
//! the recorded calls, and every one of them.
use std::{collections::BTreeSet, path::Path};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    pub verb: String,
    pub path: String,
    /// The query's parameter names, sorted.
    pub params: BTreeSet<String>,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let params: Vec<&str> = self.params.iter().map(String::as_str).collect();
        write!(f, "{} {}?{}", self.verb, self.path, params.join("&"))
    }
}

fn params_of(query: &str) -> BTreeSet<String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split('=').next().unwrap_or(p).to_string())
        .collect()
}

/// Every call shape of the recorded trace of kubelet `version` ("1.32", "1.36").
pub fn recorded(version: &str) -> Vec<Shape> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "fixtures/wire/kubelet-{version}/kubelet-{version}-summary.tsv"
    ));
    let text = std::fs::read_to_string(&file).expect("the recorded kubelet summary");
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            Shape {
                verb: cols[0].to_string(),
                path: cols[1].to_string(),
                params: params_of(cols.get(2).copied().unwrap_or("")),
            }
        })
        .collect()
}

/// The kube-apiserver verb of a request, as the audit log that made the trace names it.
fn verb_of(method: &str, path: &str, params: &BTreeSet<String>) -> &'static str {
    // /api/v1/<resource>/<name> and /apis/<group>/v1/<resource>/<name>, namespaced or not.
    let segments = path.trim_start_matches('/').split('/').count();
    let named = (segments - usize::from(path.starts_with("/apis/"))).is_multiple_of(2);
    match method {
        "GET" if params.contains("watch") => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if named => "delete",
        "DELETE" => "deletecollection",
        _ => "unknown",
    }
}

/// Whether `path` fits `template` (`{x}` matches any one segment).
fn fits(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| t == p || (t.starts_with('{') && t.ends_with('}')))
}

/// The recorded shape a call has, if any.
pub fn shape_of<'a>(shapes: &'a [Shape], method: &str, path_and_query: &str) -> Option<&'a Shape> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let params = params_of(query);
    let verb = verb_of(method, path, &params);
    shapes
        .iter()
        .find(|s| s.verb == verb && s.params == params && fits(&s.path, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_matched_to_their_recorded_shape() {
        let shapes = recorded("1.32");
        assert_eq!(shapes.len(), 26);
        let pods = shape_of(
            &shapes,
            "GET",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&limit=500&resourceVersion=0",
        )
        .unwrap();
        assert_eq!(
            (pods.verb.as_str(), pods.path.as_str()),
            ("list", "/api/v1/pods")
        );
        let patch = shape_of(&shapes, "PATCH", "/api/v1/namespaces/x/events/e.1").unwrap();
        assert_eq!(patch.path, "/api/v1/namespaces/{namespace}/events/{name}");
        let csinode = shape_of(&shapes, "GET", "/apis/storage.k8s.io/v1/csinodes/n").unwrap();
        assert_eq!(csinode.verb, "get");
        // A parameter kubelet never sends, or a call it never makes, has no shape.
        assert!(shape_of(&shapes, "GET", "/api/v1/pods?limit=500").is_none());
        assert!(shape_of(&shapes, "GET", "/api/v1/namespaces/x/secrets").is_none());
        // 1.36 lists only by streaming, and wipes its node's ResourceSlices at start.
        let shapes = recorded("1.36");
        assert!(
            shape_of(
                &shapes,
                "GET",
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&limit=500&resourceVersion=0"
            )
            .is_none()
        );
        let streamed = shape_of(
            &shapes,
            "GET",
            "/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=5&watch=true",
        )
        .unwrap();
        assert_eq!(streamed.verb, "watch");
        let wipe = shape_of(
            &shapes,
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dn",
        )
        .unwrap();
        assert_eq!(wipe.verb, "deletecollection");
    }
}
