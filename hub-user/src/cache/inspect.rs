//! `hub cache ls` and `hub cache get`: what the store holds, read directly while the daemon
//! is stopped, or through the admin port while it runs (redb keeps the file locked).
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{
    objects::Encoding,
    store::{ObjectKey, Record, Store, StoreError},
};

/// One cached object as `hub cache ls` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// `group/version/resource/namespace/name` (`/v1/pods/default/web-0`; cluster-scoped:
    /// `/v1/nodes/edge-1`) — what `hub cache get` takes.
    pub key: String,
    pub component: String,
    pub credential: String,
    pub kind: String,
    pub resource_version: u64,
    pub encoding: String,
    pub bytes: usize,
    pub deleted: bool,
}

/// An object and its bytes, as `hub cache get` prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Object {
    pub entry: Entry,
    /// The object itself for JSON; base64 of the protobuf message otherwise.
    pub object: serde_json::Value,
}

pub fn display_key(k: &ObjectKey) -> String {
    if k.namespace.is_empty() {
        format!("{}/{}", k.gvr, k.name)
    } else {
        format!("{}/{}/{}", k.gvr, k.namespace, k.name)
    }
}

/// Splits a display key into (gvr, namespace, name).
fn parse_key(key: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [g, v, r, ns, name] => Some((format!("{g}/{v}/{r}"), ns.to_string(), name.to_string())),
        [g, v, r, name] => Some((format!("{g}/{v}/{r}"), String::new(), name.to_string())),
        _ => None,
    }
}

fn entry(k: &ObjectKey, r: &Record) -> Entry {
    Entry {
        key: display_key(k),
        component: k.component.clone(),
        credential: k.credential.clone(),
        kind: r.item.kind.clone(),
        resource_version: r.item.rv,
        encoding: match r.item.encoding {
            Encoding::Json => "json",
            Encoding::Protobuf => "protobuf",
        }
        .into(),
        bytes: r.item.body.len(),
        deleted: r.deleted,
    }
}

/// Live objects, optionally of one component and one resource (`pods` or `/v1/pods`).
pub fn list(
    store: &Store,
    component: Option<&str>,
    resource: Option<&str>,
) -> Result<Vec<Entry>, StoreError> {
    let resource_matches =
        |gvr: &str| resource.is_none_or(|r| gvr == r || gvr.rsplit('/').next() == Some(r));
    Ok(store
        .scan(&[])?
        .iter()
        .filter(|(_, r)| !r.deleted)
        .filter(|(k, _)| component.is_none_or(|c| k.component == c) && resource_matches(&k.gvr))
        .map(|(k, r)| entry(k, r))
        .collect())
}

/// The freshest live copy of `key` (of `component`, if given).
pub fn get(store: &Store, key: &str, component: Option<&str>) -> Result<Option<Object>, String> {
    let (gvr, ns, name) =
        parse_key(key).ok_or_else(|| format!("bad key {key:?}: expected group/version/resource/[namespace/]name, e.g. /v1/pods/default/web-0"))?;
    let mut best: Option<(ObjectKey, Record)> = None;
    for (k, r) in store.scan(&[]).map_err(|e| e.to_string())? {
        if k.gvr != gvr || k.namespace != ns || k.name != name || r.deleted {
            continue;
        }
        if component.is_some_and(|c| k.component != c) {
            continue;
        }
        if best.as_ref().is_none_or(|(_, b)| b.item.rv < r.item.rv) {
            best = Some((k, r));
        }
    }
    Ok(best.map(|(k, r)| Object {
        entry: entry(&k, &r),
        object: match r.item.encoding {
            Encoding::Json => serde_json::from_slice(&r.item.body).unwrap_or_default(),
            Encoding::Protobuf => serde_json::Value::String(
                base64::engine::general_purpose::STANDARD.encode(&r.item.body),
            ),
        },
    }))
}

/// Hides a Secret's values (`data`, `stringData`; the whole body when it is protobuf),
/// keeping its keys and sizes: `hub cache get` shows them only with `--show-secrets`.
pub fn redact(o: &mut Object) {
    if !o.entry.key.starts_with("/v1/secrets/") {
        return;
    }
    match &mut o.object {
        serde_json::Value::Object(m) => {
            for field in ["data", "stringData"] {
                if let Some(serde_json::Value::Object(values)) = m.get_mut(field) {
                    for v in values.values_mut() {
                        let len = v.as_str().map_or(0, str::len);
                        *v = format!("<redacted, {len} bytes>").into();
                    }
                }
            }
        }
        other => *other = "<redacted protobuf Secret; --show-secrets prints it>".into(),
    }
}

/// The text table of `hub cache ls`.
pub fn render(entries: &[Entry]) -> String {
    let mut out = format!(
        "{:<14} {:<22} {:<48} {:>10} {:<9} {:>8}\n",
        "COMPONENT", "CREDENTIAL", "KEY", "RV", "ENCODING", "BYTES"
    );
    for e in entries {
        out += &format!(
            "{:<14} {:<22} {:<48} {:>10} {:<9} {:>8}\n",
            e.component, e.credential, e.key, e.resource_version, e.encoding, e.bytes
        );
    }
    out += &format!("{} objects\n", entries.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = ObjectKey {
            credential: "node".into(),
            gvr: "/v1/pods".into(),
            namespace: "default".into(),
            name: "web-0".into(),
            component: "kubelet".into(),
        };
        assert_eq!(display_key(&k), "/v1/pods/default/web-0");
        assert_eq!(
            parse_key("/v1/pods/default/web-0"),
            Some(("/v1/pods".into(), "default".into(), "web-0".into()))
        );
        assert_eq!(
            parse_key("apps/v1/deployments/kube-system/coredns"),
            Some((
                "apps/v1/deployments".into(),
                "kube-system".into(),
                "coredns".into()
            ))
        );
        assert_eq!(
            parse_key("/v1/nodes/edge-1"),
            Some(("/v1/nodes".into(), String::new(), "edge-1".into()))
        );
        assert_eq!(parse_key("pods"), None);
    }
}
