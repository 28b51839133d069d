//! kube-apiserver's paging of a list: items in the order of their etcd keys, and its
//! continue token — base64url (no padding) of `{"v":"meta.k8s.io/v1","rv":N,"start":K}`,
//! where `K` is the key after the page's last item, relative to the list's prefix. The
//! hub writes and reads the same tokens, so a list paged by the hub continues at the
//! cloud, and one the cloud paged continues at the hub. 1.36 writes `K` with its leading
//! `/`, 1.32 without; both read either (a missing `/` is added), and so does the hub.
use base64::Engine;

const VERSION: &str = "meta.k8s.io/v1";

/// A decoded continue token: the resourceVersion the list is read at (None: the newest,
/// as in the token kube-apiserver 1.32 hands out with a 410 for an expired one), and the
/// key the next page starts at (itself included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continue {
    pub rv: Option<u64>,
    pub start: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    v: String,
    rv: i64,
    start: String,
}

/// An object's key relative to its list's prefix: `/<name>` in a list of one namespace or
/// of a cluster-scoped resource, `/<namespace>/<name>` in a list across namespaces.
/// Compared as bytes, these keys are kube-apiserver's order of the list.
pub fn relative_key(list_namespace: &str, namespace: &str, name: &str) -> String {
    if list_namespace.is_empty() && !namespace.is_empty() {
        format!("/{namespace}/{name}")
    } else {
        format!("/{name}")
    }
}

/// The token of a page whose last item has `last_key` (a [`relative_key`]), read at `rv`.
pub fn encode(rv: u64, last_key: &str) -> String {
    let token = Token {
        v: VERSION.into(),
        rv: rv as i64,
        start: format!("{last_key}\0"),
    };
    let json = serde_json::to_vec(&token).expect("a token serializes");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A token as kube-apiserver accepts it, or None: not base64url JSON, another version, a
/// resourceVersion of 0, no start, or a start that is not a clean path (`..`, `//`, `/.`).
pub fn decode(token: &str) -> Option<Continue> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let t: Token = serde_json::from_slice(&raw).ok()?;
    if t.v != VERSION || t.rv == 0 || t.start.is_empty() {
        return None;
    }
    let start = if t.start.starts_with('/') {
        t.start
    } else {
        format!("/{}", t.start)
    };
    let clean = start.len() == 1
        || (!start.ends_with('/')
            && start[1..]
                .split('/')
                .all(|part| !matches!(part, "" | "." | "..")));
    clean.then_some(Continue {
        rv: u64::try_from(t.rv).ok(),
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_the_cloud_wrote_reads_as_it_means() {
        // kube-apiserver 1.36's token for page 2 of `pods?limit=2` in namespace `wire`
        // (fixtures/wire/kube-apiserver-1.36/list-pods-json-continue).
        let c = decode("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjYyOSwic3RhcnQiOiIvdy0xXHUwMDAwIn0")
            .unwrap();
        assert_eq!(
            c,
            Continue {
                rv: Some(2629),
                start: "/w-1\0".into()
            }
        );
        // The hub's own token for the same page is the cloud's, byte for byte.
        assert_eq!(
            encode(2629, "/w-1"),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjYyOSwic3RhcnQiOiIvdy0xXHUwMDAwIn0"
        );
    }

    #[test]
    fn tokens_kube_apiserver_refuses_are_refused() {
        let raw = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        for bad in [
            "garbage!".to_string(),
            raw("{}"),
            raw(r#"{"v":"meta.k8s.io/v2","rv":5,"start":"/a"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"/a"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":5,"start":""}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"/a/../b"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"//a"}"#),
            raw(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"/a/"}"#),
        ] {
            assert_eq!(decode(&bad), None, "{bad}");
        }
        let ok = raw(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"ns1/a\u0000"}"#);
        assert_eq!(decode(&ok).unwrap().start, "/ns1/a\0");
        // 1.32's token with its 410 for an expired one: the newest state, from `w-1`
        // (fixtures/wire/kube-apiserver-1.32/list-continue-expired-json).
        assert_eq!(
            decode("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0Ijoidy0xXHUwMDAwIn0"),
            Some(Continue {
                rv: None,
                start: "/w-1\0".into()
            })
        );
    }

    #[test]
    fn keys_order_a_list_as_etcd_does() {
        // `a-b/x` sorts before `a/x` in etcd ('-' < '/'), unlike (namespace, name).
        let mut keys = vec![
            relative_key("", "a", "x"),
            relative_key("", "a-b", "x"),
            relative_key("", "", "node-1"),
        ];
        keys.sort();
        assert_eq!(keys, vec!["/a-b/x", "/a/x", "/node-1"]);
        assert_eq!(relative_key("a", "a", "x"), "/x");
    }
}
