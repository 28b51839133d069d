//! Reading Kubernetes protobuf request bodies (`k8s\0` + runtime.Unknown) far enough for
//! the small review objects kubectl sends that way. Full protobuf encoding of resources is
//! not implemented yet (the stand-in answers JSON, which every client accepts).
use serde_json::{Value, json};

/// `k8s\0` magic that prefixes every Kubernetes protobuf payload.
pub const MAGIC: &[u8] = b"k8s\0";

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of one message: (field number, bytes) for length-delimited ones, varints as
/// their decimal text. Enough for string-and-message schemas.
pub fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((field, varint(&mut buf)?.to_string().into_bytes())),
            2 => {
                let len = varint(&mut buf)? as usize;
                let (v, rest) = (buf.get(..len)?, buf.get(len..)?);
                out.push((field, v.to_vec()));
                buf = rest;
            }
            1 => buf = buf.get(8..)?,
            5 => buf = buf.get(4..)?,
            _ => return None,
        }
    }
    Some(out)
}

/// runtime.Unknown { typeMeta 1 { apiVersion 1, kind 2 }, raw 2, ... } -> (apiVersion, kind, raw).
pub fn unwrap_unknown(body: &[u8]) -> Option<(String, String, Vec<u8>)> {
    let inner = body.strip_prefix(MAGIC)?;
    let f = fields(inner)?;
    let type_meta = fields(&f.iter().find(|(n, _)| *n == 1)?.1)?;
    let text = |fs: &[(u64, Vec<u8>)], n| {
        fs.iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let raw = f.iter().find(|(n, _)| *n == 2)?.1.clone();
    Some((text(&type_meta, 1), text(&type_meta, 2), raw))
}

/// SelfSubjectAccessReview (authorization.k8s.io/v1) from protobuf into its JSON form.
pub fn self_subject_access_review(raw: &[u8]) -> Option<Value> {
    let review = fields(raw)?;
    let spec = fields(&review.iter().find(|(n, _)| *n == 2)?.1)?;
    let mut out = json!({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "metadata": {}, "spec": {}});
    if let Some((_, attrs)) = spec.iter().find(|(n, _)| *n == 1) {
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
        for (n, v) in fields(attrs)? {
            if let Some(name) = names.get((n as usize).wrapping_sub(1)) {
                a.insert((*name).into(), json!(String::from_utf8_lossy(&v)));
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
        let spec = ld(1, &attrs);
        let review = ld(2, &spec);
        let type_meta = [
            ld(1, b"authorization.k8s.io/v1"),
            ld(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), ld(1, &type_meta), ld(2, &review)].concat();
        let (api, kind, raw) = unwrap_unknown(&body).unwrap();
        assert_eq!(
            (api.as_str(), kind.as_str()),
            ("authorization.k8s.io/v1", "SelfSubjectAccessReview")
        );
        let json = self_subject_access_review(&raw).unwrap();
        assert_eq!(json["spec"]["resourceAttributes"]["verb"], "list");
        assert_eq!(json["spec"]["resourceAttributes"]["resource"], "pods");
        assert_eq!(json["spec"]["resourceAttributes"]["namespace"], "default");
    }
}
