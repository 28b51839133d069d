//! Reading the small review objects kubectl sends in protobuf (SelfSubjectAccessReview),
//! with the hub's own envelope and field reader. Resources written in protobuf are read
//! by `protobuf_in`, answers encoded by `protobuf`.
use hub::kproto::{self, Value as Wire};
use serde_json::{Value, json};

fn message<'a>(fs: &[(u64, Wire<'a>)], n: u64) -> Option<&'a [u8]> {
    fs.iter().find_map(|(k, v)| match v {
        Wire::Bytes(b) if *k == n => Some(*b),
        _ => None,
    })
}

/// A SelfSubjectAccessReview (authorization.k8s.io/v1) protobuf body in its JSON form.
pub fn self_subject_access_review(body: &[u8]) -> Option<Value> {
    let review = kproto::fields(kproto::unwrap(body)?.raw)?;
    let spec = kproto::fields(message(&review, 2)?)?;
    let mut out = json!({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "metadata": {}, "spec": {}});
    if let Some(attrs) = message(&spec, 1) {
        let names = [
            "namespace",
            "verb",
            "group",
            "version",
            "resource",
            "subresource",
            "name",
        ];
        let mut a = serde_json::Map::new();
        for (n, v) in kproto::fields(attrs)? {
            if let (Some(name), Wire::Bytes(b)) = (names.get((n as usize).wrapping_sub(1)), v) {
                a.insert((*name).into(), json!(String::from_utf8_lossy(b)));
            }
        }
        out["spec"]["resourceAttributes"] = Value::Object(a);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(field: u8, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![(field << 3) | 2, bytes.len() as u8];
        v.extend_from_slice(bytes);
        v
    }

    #[test]
    fn decodes_an_access_review() {
        let attrs = [ld(1, b"default"), ld(2, b"list"), ld(5, b"pods")].concat();
        let review = ld(2, &ld(1, &attrs));
        let type_meta = [
            ld(1, b"authorization.k8s.io/v1"),
            ld(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [kproto::MAGIC.to_vec(), ld(1, &type_meta), ld(2, &review)].concat();
        let json = self_subject_access_review(&body).unwrap();
        assert_eq!(json["spec"]["resourceAttributes"]["verb"], "list");
        assert_eq!(json["spec"]["resourceAttributes"]["resource"], "pods");
        assert_eq!(json["spec"]["resourceAttributes"]["namespace"], "default");
    }
}
