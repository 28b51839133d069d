//! What a Kubernetes API request is about, read from its method, path and query (the
//! hub's counterpart of kube-apiserver's RequestInfo).
use hyper::Method;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// False for non-resource paths (/api, /apis, /version, /healthz, /openapi/...).
    pub is_resource: bool,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// get, list, watch, create, update, patch, delete, deletecollection, connect.
    pub verb: &'static str,
}

pub(super) fn flag(query: &str, name: &str) -> bool {
    query.split('&').any(|kv| {
        kv.split_once('=').is_some_and(|(k, v)| {
            k == name && matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
        })
    })
}

/// The identity a request asks to act as (kube-apiserver's `Impersonate-User`,
/// `Impersonate-Group`, `Impersonate-Uid`, `Impersonate-Extra-*` headers), as one string of
/// its headers in a stable order; None when it impersonates no one.
pub fn impersonation(headers: &hyper::HeaderMap) -> Option<String> {
    let mut acting_as: Vec<String> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("impersonate-"))
        .map(|(name, value)| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
        .collect();
    if acting_as.is_empty() {
        return None;
    }
    acting_as.sort();
    Some(acting_as.join("\n"))
}

/// `s` percent-encoded for a query parameter's value (every byte but the unreserved).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One query parameter, percent-decoded (`+` is a space, as Go's url.ParseQuery reads it).
pub fn query_param(query: &str, name: &str) -> Option<String> {
    let raw = query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)?
        .1;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match raw.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16)) {
                    Some(Ok(b)) => {
                        out.push(b);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

impl RequestInfo {
    pub fn parse(method: &Method, path: &str, query: &str) -> RequestInfo {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => {
                return RequestInfo {
                    verb: if *method == Method::GET {
                        "get"
                    } else {
                        "unknown"
                    },
                    ..Default::default()
                };
            }
        };
        // namespaces/<ns>/<resource>/... unless it is the namespace object's own subresource.
        let (namespace, rest) = match rest {
            ["namespaces", ns, res, tail @ ..] if !matches!(*res, "status" | "finalize") => {
                (ns.to_string(), [&[*res][..], tail].concat())
            }
            other => (String::new(), other.to_vec()),
        };
        if rest.is_empty() {
            return RequestInfo {
                group: group.into(),
                version: version.into(),
                verb: "get",
                ..Default::default()
            };
        }
        let resource = rest[0].to_string();
        let name = rest.get(1).map(|s| s.to_string()).unwrap_or_default();
        let subresource = rest.get(2).map(|s| s.to_string()).unwrap_or_default();
        let verb = match *method {
            Method::GET | Method::HEAD if name.is_empty() && flag(query, "watch") => "watch",
            Method::GET | Method::HEAD
                if matches!(
                    subresource.as_str(),
                    "exec" | "attach" | "portforward" | "proxy"
                ) =>
            {
                "connect"
            }
            Method::GET | Method::HEAD if name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST if matches!(subresource.as_str(), "exec" | "attach" | "portforward") => {
                "connect"
            }
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ => "unknown",
        };
        RequestInfo {
            is_resource: true,
            group: group.into(),
            version: version.into(),
            resource,
            subresource,
            namespace,
            name,
            verb,
        }
    }

    /// `group/version/resource` as coordinator.poolScopeResources writes it (`/v1/services`
    /// for the core group).
    pub fn gvr(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.resource)
    }

    /// Whether `gvr` (as [`RequestInfo::gvr`] writes it) names this request's resource;
    /// checked per request, so without building the string.
    pub fn gvr_is(&self, gvr: &str) -> bool {
        let mut parts = gvr.splitn(3, '/');
        parts.next() == Some(self.group.as_str())
            && parts.next() == Some(self.version.as_str())
            && parts.next() == Some(self.resource.as_str())
    }

    /// A read the caches could answer (a get/list/watch of an object or discovery).
    pub fn is_read(&self) -> bool {
        matches!(self.verb, "get" | "list" | "watch")
            && (self.subresource.is_empty() || self.subresource == "status")
    }
}

/// The client component, from the User-Agent's first word (`kubelet/v1.32 ...`), limited
/// to names worth a metrics label.
pub fn component(user_agent: &str) -> &'static str {
    let first = user_agent
        .split(['/', ' '])
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    const KNOWN: [&str; 9] = [
        "kubelet",
        "kube-proxy",
        "coredns",
        "flanneld",
        "kubectl",
        "hub",
        "calico",
        "cilium-agent",
        "kube-scheduler",
    ];
    KNOWN
        .iter()
        .find(|k| first == **k)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impersonation_is_read_from_every_impersonate_header_in_one_order() {
        let mut h = hyper::HeaderMap::new();
        assert_eq!(impersonation(&h), None);
        h.insert("authorization", "Bearer t".parse().unwrap());
        assert_eq!(impersonation(&h), None);
        h.append("impersonate-group", "b".parse().unwrap());
        h.append("Impersonate-User", "alice".parse().unwrap());
        h.append("impersonate-group", "a".parse().unwrap());
        assert_eq!(
            impersonation(&h).as_deref(),
            Some("impersonate-group: a\nimpersonate-group: b\nimpersonate-user: alice")
        );
    }

    #[test]
    fn percent_encoding_round_trips() {
        let token = "a+b/c= d";
        assert_eq!(percent_encode(token), "a%2Bb%2Fc%3D%20d");
        let q = format!("continue={}", percent_encode(token));
        assert_eq!(query_param(&q, "continue").as_deref(), Some(token));
    }

    #[test]
    fn parses_the_common_shapes() {
        let r = RequestInfo::parse(&Method::GET, "/api/v1/namespaces/default/pods", "limit=500");
        assert_eq!(
            (r.verb, r.resource.as_str(), r.namespace.as_str(), r.gvr()),
            ("list", "pods", "default", "/v1/pods".into())
        );
        let r = RequestInfo::parse(
            &Method::GET,
            "/api/v1/namespaces/default/pods",
            "watch=True&resourceVersion=5",
        );
        assert_eq!(r.verb, "watch");
        let r = RequestInfo::parse(
            &Method::GET,
            "/apis/discovery.k8s.io/v1/endpointslices",
            "watch=1",
        );
        assert_eq!(
            (r.verb, r.gvr()),
            ("watch", "discovery.k8s.io/v1/endpointslices".into())
        );
        assert!(r.gvr_is(&r.gvr()));
        for other in [
            "discovery.k8s.io/v1",
            "discovery.k8s.io/v1/endpointslices/x",
            "discovery.k8s.io/v1beta1/endpointslices",
            "/v1/endpointslices",
            "",
        ] {
            assert!(!r.gvr_is(other), "{other}");
        }
        let r = RequestInfo::parse(
            &Method::POST,
            "/api/v1/namespaces/default/pods/p/exec",
            "command=sh",
        );
        assert_eq!((r.verb, r.subresource.as_str()), ("connect", "exec"));
        let r = RequestInfo::parse(
            &Method::GET,
            "/api/v1/namespaces/default/pods/p/log",
            "follow=true",
        );
        assert_eq!((r.verb, r.is_read()), ("get", false));
        let r = RequestInfo::parse(&Method::PUT, "/api/v1/namespaces/kube-system/status", "");
        assert_eq!(
            (
                r.verb,
                r.resource.as_str(),
                r.name.as_str(),
                r.subresource.as_str()
            ),
            ("update", "namespaces", "kube-system", "status")
        );
        let r = RequestInfo::parse(&Method::GET, "/api/v1/nodes/n1", "");
        assert_eq!(
            (r.verb, r.name.as_str(), r.namespace.as_str()),
            ("get", "n1", "")
        );
        let r = RequestInfo::parse(&Method::GET, "/version", "");
        assert!(!r.is_resource && r.is_read());
    }

    #[test]
    fn query_params_are_decoded() {
        let q = "labelSelector=app%20in%20(a%2Cb)&fieldSelector=spec.nodeName%3Dn1&x&limit=5&bad=%zz&end=%4";
        assert_eq!(query_param(q, "labelSelector").unwrap(), "app in (a,b)");
        assert_eq!(query_param(q, "fieldSelector").unwrap(), "spec.nodeName=n1");
        assert_eq!(query_param(q, "limit").unwrap(), "5");
        assert_eq!(query_param(q, "x").unwrap(), "");
        assert_eq!(query_param(q, "bad").unwrap(), "%zz");
        assert_eq!(query_param(q, "end").unwrap(), "%4");
        assert_eq!(query_param("a=b+c", "a").unwrap(), "b c");
        assert_eq!(query_param(q, "missing"), None);
    }

    #[test]
    fn components() {
        assert_eq!(
            component("kubelet/v1.32.0 (linux/amd64) kubernetes/abc"),
            "kubelet"
        );
        assert_eq!(component("kubectl/v1.32.4 (linux/amd64)"), "kubectl");
        assert_eq!(component("OpenAPI-Generator/22.6.0/python"), "other");
        assert_eq!(component(""), "other");
    }
}
