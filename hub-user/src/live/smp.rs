//! Strategic merge patch, applied as kube-apiserver applies it and made as client-go makes
//! a two-way one (`CreateTwoWayMergePatch`): lists merged by their patch merge key (a
//! pod's `conditions` by `type`, `podIPs` by `ip`), lists of scalars merged as sets, and the
//! directives `$patch` (`replace`, `delete`), `$setElementOrder/<list>`,
//! `$deleteFromPrimitiveList/<list>` and `$retainKeys`. Which lists merge, and by which
//! key, comes from the schema generated from Kubernetes' Go types (their `patchStrategy`
//! and `patchMergeKey` tags). Without a schema (a custom resource) every list is replaced,
//! which is what kube-apiserver does for a JSON merge patch.
use serde_json::{Map, Value};

use super::PatchError;
use crate::convert::{self, schema};

/// Where in the schema a value sits: its message, or None (no schema: a map's values, a
/// custom resource).
pub type At = Option<u16>;

/// What the schema says of one field.
#[derive(Default)]
struct FieldPatch {
    merge: bool,
    replace: bool,
    merge_key: Option<&'static str>,
    /// The message of its value (or of its list's elements).
    child: At,
}

fn field(at: At, name: &str) -> FieldPatch {
    let Some((owner, f)) = at.and_then(|m| convert::json_field(m, name)) else {
        return FieldPatch::default();
    };
    FieldPatch {
        merge: f.flags & schema::PATCH_MERGE != 0,
        replace: f.flags & schema::PATCH_REPLACE != 0,
        merge_key: convert::merge_key(owner, f.tag),
        child: match (f.ty, f.card) {
            (schema::Type::Message(m), schema::Card::One | schema::Card::Repeated) => Some(m),
            _ => None,
        },
    }
}

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_FROM: &str = "$deleteFromPrimitiveList/";

fn bad(msg: impl Into<String>) -> PatchError {
    PatchError(msg.into())
}

/// Applies the strategic merge patch `patch` to the object `target`, whose schema message
/// is `at`.
pub fn apply(target: &mut Value, patch: &Value, at: At) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(bad("a strategic merge patch must be a JSON object"));
    };
    let original = match std::mem::take(target) {
        Value::Object(o) => o,
        _ => Map::new(),
    };
    *target = Value::Object(merge_map(original, p.clone(), at)?);
    Ok(())
}

/// `v` without directives: what a typed object keeps of a patch value.
pub fn strip(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k, strip(v)))
                .collect(),
        ),
        Value::Array(l) => Value::Array(
            l.into_iter()
                .filter(|e| e.get("$patch").is_none())
                .map(strip)
                .collect(),
        ),
        v => v,
    }
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    at: At,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.remove("$patch") {
        return match directive.as_str() {
            Some("replace") => match strip(Value::Object(patch)) {
                Value::Object(m) => Ok(m),
                _ => unreachable!("strip keeps an object an object"),
            },
            Some("delete") => Ok(Map::new()),
            _ => Err(bad(format!(
                "unknown $patch directive {directive} in a map"
            ))),
        };
    }
    if let Some(keys) = patch.remove("$retainKeys") {
        let keys: Vec<&str> = keys
            .as_array()
            .ok_or_else(|| bad("$retainKeys must be a list of field names"))?
            .iter()
            .map(|k| {
                k.as_str()
                    .ok_or_else(|| bad("$retainKeys must be a list of field names"))
            })
            .collect::<Result<_, _>>()?;
        for (k, v) in &patch {
            if !v.is_null() && !k.starts_with('$') && !keys.contains(&k.as_str()) {
                return Err(bad(format!("{k} is patched but not in $retainKeys")));
            }
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }
    // Lists with an order to keep go first, merged together with their patch list.
    let ordered: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ORDER))
        .cloned()
        .collect();
    for key in ordered {
        let name = &key[SET_ORDER.len()..];
        let order = match patch.remove(&key) {
            Some(Value::Array(o)) => o,
            _ => return Err(bad(format!("{key} must be a list"))),
        };
        let f = field(at, name);
        let server = match original.remove(name) {
            None | Some(Value::Null) => None,
            Some(Value::Array(l)) => Some(l),
            Some(_) => return Err(bad(format!("{key}: {name} is not a list"))),
        };
        let merged = match (server.clone(), patch.remove(name)) {
            (None, None | Some(Value::Null)) => continue,
            (Some(s), None) => s,
            (s, Some(Value::Array(p))) if f.merge => merge_slice(s.unwrap_or_default(), p, &f)?,
            (_, Some(Value::Array(p))) => match strip(Value::Array(p)) {
                Value::Array(l) => l,
                _ => unreachable!("strip keeps a list a list"),
            },
            (_, Some(_)) => return Err(bad(format!("{key}: the patch's {name} is not a list"))),
        };
        let both = in_order(
            merged,
            &order,
            server.as_deref().unwrap_or_default(),
            f.merge_key,
        );
        original.insert(name.to_string(), Value::Array(both));
    }
    for (k, v) in patch {
        if let Some(name) = k.strip_prefix(DELETE_FROM) {
            let gone = v
                .as_array()
                .ok_or_else(|| bad(format!("{k} must be a list")))?;
            if let Some(Value::Array(list)) = original.get_mut(name) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            // No other directive changes what a typed object keeps.
            continue;
        }
        if v.is_null() {
            original.remove(&k);
            continue;
        }
        let f = field(at, &k);
        let new = match (original.remove(&k), v) {
            (Some(Value::Object(o)), Value::Object(p)) if !f.replace => {
                Value::Object(merge_map(o, p, f.child)?)
            }
            (None | Some(Value::Null), Value::Object(p)) if !f.replace => {
                Value::Object(merge_map(Map::new(), p, f.child)?)
            }
            (Some(Value::Array(o)), Value::Array(p)) if f.merge => {
                let merged = merge_slice(o.clone(), p.clone(), &f)?;
                Value::Array(in_order(merged, &p, &o, f.merge_key))
            }
            (None | Some(Value::Null), Value::Array(p)) if f.merge => {
                let merged = merge_slice(Vec::new(), p.clone(), &f)?;
                Value::Array(in_order(merged, &p, &[], f.merge_key))
            }
            (_, v) => strip(v),
        };
        original.insert(k, new);
    }
    Ok(original)
}

/// The elements of a merging list after the patch's: deletions (`$patch: delete`) done,
/// elements matched by merge key merged, new ones appended; or the patch's own list with
/// `$patch: replace`. Scalars merge as a set.
fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    f: &FieldPatch,
) -> Result<Vec<Value>, PatchError> {
    let of_maps = original
        .iter()
        .chain(&patch)
        .next()
        .is_some_and(Value::is_object);
    if !of_maps {
        let mut merged = original;
        for p in patch {
            if !merged.contains(&p) {
                merged.push(p);
            }
        }
        return Ok(merged);
    }
    let key = f
        .merge_key
        .ok_or_else(|| bad("cannot merge a list of objects without a merge key"))?;
    let mut original = original;
    let mut plain = Vec::new();
    let mut replace = false;
    for p in patch {
        let Value::Object(m) = p else {
            return Err(bad("a merging list mixes objects and scalars"));
        };
        match m.get("$patch").map(|d| d.as_str()) {
            None => plain.push(m),
            Some(Some("delete")) => {
                let value = m.get(key).ok_or_else(|| {
                    bad(format!(
                        "a $patch: delete element without its merge key {key}"
                    ))
                })?;
                original.retain(|o| o.get(key) != Some(value));
            }
            Some(Some("replace")) => replace = true,
            _ => {
                return Err(bad(format!(
                    "unknown $patch directive in a list element: {:?}",
                    m.get("$patch")
                )));
            }
        }
    }
    if replace {
        return Ok(plain.into_iter().map(|m| strip(Value::Object(m))).collect());
    }
    for p in plain {
        let value = p
            .get(key)
            .cloned()
            .ok_or_else(|| bad(format!("a list element without its merge key {key}")))?;
        match original.iter_mut().find(|o| o.get(key) == Some(&value)) {
            Some(o) => {
                let current = match std::mem::take(o) {
                    Value::Object(c) => c,
                    _ => Map::new(),
                };
                *o = Value::Object(merge_map(current, p, f.child)?);
            }
            None => original.push(Value::Object(merge_map(Map::new(), p, f.child)?)),
        }
    }
    Ok(original)
}

/// The merged list in kube-apiserver's order: the elements `order` names in its order,
/// interleaved with the others in the order the server held them.
fn in_order(
    merged: Vec<Value>,
    order: &[Value],
    server: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let id = |v: &Value| -> Value {
        match key {
            Some(k) if v.is_object() => v.get(k).cloned().unwrap_or(Value::Null),
            _ => v.clone(),
        }
    };
    let position = |list: &[Value], v: &Value| {
        let wanted = id(v);
        list.iter().position(|x| id(x) == wanted)
    };
    let (mut patched, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| position(order, v).is_some());
    patched.sort_by_key(|v| position(order, v));
    server_only.sort_by_key(|v| position(server, v).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patched.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patched.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (position(server, l), position(server, r)),
                (Some(a), Some(b)) if a < b
            ),
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

/// The two-way strategic merge patch that turns `original` into `modified` (both objects
/// of the schema message `at`), as client-go writes it: changed fields, `null` for removed
/// ones, list elements by merge key with `$patch: delete` for removed ones and
/// `$setElementOrder`, `$deleteFromPrimitiveList` for scalars removed from a merging list.
pub fn two_way(original: &Value, modified: &Value, at: At) -> Value {
    match (original, modified) {
        (Value::Object(o), Value::Object(m)) => Value::Object(diff_maps(o, m, at)),
        (_, m) => m.clone(),
    }
}

fn diff_maps(o: &Map<String, Value>, m: &Map<String, Value>, at: At) -> Map<String, Value> {
    let mut patch = Map::new();
    for k in o.keys() {
        if !m.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    for (k, mv) in m {
        let Some(ov) = o.get(k) else {
            patch.insert(k.clone(), mv.clone());
            continue;
        };
        if ov == mv {
            continue;
        }
        let f = field(at, k);
        match (ov, mv) {
            (Value::Object(oo), Value::Object(mm)) if !f.replace => {
                let d = diff_maps(oo, mm, f.child);
                if !d.is_empty() {
                    patch.insert(k.clone(), Value::Object(d));
                }
            }
            (Value::Array(ol), Value::Array(ml)) if f.merge && !ol.is_empty() => {
                diff_lists(k, ol, ml, &f, &mut patch)
            }
            _ => {
                patch.insert(k.clone(), mv.clone());
            }
        }
    }
    patch
}

fn diff_lists(
    name: &str,
    ol: &[Value],
    ml: &[Value],
    f: &FieldPatch,
    patch: &mut Map<String, Value>,
) {
    let of_maps = ol.iter().chain(ml).next().is_some_and(Value::is_object);
    match (of_maps, f.merge_key) {
        (true, Some(key)) => {
            let find =
                |list: &[Value], v: &Value| list.iter().find(|x| x.get(key) == v.get(key)).cloned();
            let mut changes = Vec::new();
            for me in ml {
                match find(ol, me) {
                    Some(Value::Object(oe)) => {
                        if let Value::Object(mm) = me {
                            let mut d = diff_maps(&oe, mm, f.child);
                            if !d.is_empty() {
                                d.insert(key.to_string(), me[key].clone());
                                changes.push(Value::Object(d));
                            }
                        }
                    }
                    _ => changes.push(me.clone()),
                }
            }
            for oe in ol {
                if find(ml, oe).is_none() {
                    let mut d = Map::new();
                    d.insert("$patch".into(), "delete".into());
                    d.insert(key.to_string(), oe[key].clone());
                    changes.push(Value::Object(d));
                }
            }
            let same_order =
                ol.len() == ml.len() && ol.iter().zip(ml).all(|(a, b)| a.get(key) == b.get(key));
            if !changes.is_empty() || !same_order {
                let order = ml
                    .iter()
                    .map(|e| {
                        let mut m = Map::new();
                        m.insert(key.to_string(), e[key].clone());
                        Value::Object(m)
                    })
                    .collect();
                patch.insert(format!("{SET_ORDER}{name}"), Value::Array(order));
            }
            if !changes.is_empty() {
                patch.insert(name.to_string(), Value::Array(changes));
            }
        }
        (true, None) => {
            patch.insert(name.to_string(), Value::Array(ml.to_vec()));
        }
        (false, _) => {
            let added: Vec<Value> = ml.iter().filter(|v| !ol.contains(v)).cloned().collect();
            let mut removed: Vec<Value> = Vec::new();
            for v in ol {
                if !ml.contains(v) && !removed.contains(v) {
                    removed.push(v.clone());
                }
            }
            if !added.is_empty() {
                patch.insert(name.to_string(), Value::Array(added));
            }
            if !removed.is_empty() {
                patch.insert(format!("{DELETE_FROM}{name}"), Value::Array(removed));
            }
            patch.insert(format!("{SET_ORDER}{name}"), Value::Array(ml.to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> At {
        convert::kind_index("v1", "Pod")
    }

    /// The kubelet's status patch as recorded from a real kubelet 1.36
    /// (`../shared/wire`): conditions merged by type with their order set, a podIP list by
    /// `ip`, containerStatuses replaced whole.
    #[test]
    fn a_kubelet_status_patch_merges_as_kube_apiserver_merges_it() {
        let mut target = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "uid": "u1"},
            "status": {"phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Extra", "status": "True"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                "podIPs": [{"ip": "10.1.0.5"}],
                "containerStatuses": [{"name": "a", "ready": false}, {"name": "b", "ready": false}]}});
        let patch = json!({"metadata": {"uid": "u1"}, "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
            "conditions": [{"type": "Ready", "status": "True", "reason": null}],
            "$setElementOrder/podIPs": [{"ip": "10.1.0.9"}],
            "podIPs": [{"ip": "10.1.0.9"}, {"$patch": "delete", "ip": "10.1.0.5"}],
            "containerStatuses": [{"name": "a", "ready": true}],
            "phase": "Running"}});
        apply(&mut target, &patch, pod()).unwrap();
        assert_eq!(
            target["status"],
            json!({"phase": "Running",
                // A condition only the server held keeps its place before the ones the
                // patch orders, as kube-apiserver interleaves them.
                "conditions": [
                    {"type": "Extra", "status": "True"},
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}],
                "podIPs": [{"ip": "10.1.0.9"}],
                "containerStatuses": [{"name": "a", "ready": true}]})
        );
    }

    #[test]
    fn directives_replace_delete_retain_and_primitive_deletions() {
        let mut target = json!({"metadata": {"finalizers": ["a", "b", "c"], "labels": {"x": "1", "y": "2"}},
            "spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}});
        let patch = json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": ["b"], "finalizers": ["d"],
                "labels": {"$patch": "replace", "z": "3"}},
            "spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]}});
        apply(&mut target, &patch, pod()).unwrap();
        // An added scalar the server never held goes first, as kube-apiserver orders it.
        assert_eq!(target["metadata"]["finalizers"], json!(["d", "a", "c"]));
        assert_eq!(target["metadata"]["labels"], json!({"z": "3"}));
        assert_eq!(
            target["spec"]["volumes"],
            json!([{"name": "v", "emptyDir": {}}])
        );
        let mut list = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        apply(
            &mut list,
            &json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "C"}]}}),
            pod(),
        )
        .unwrap();
        assert_eq!(list["status"]["conditions"], json!([{"type": "C"}]));
    }

    #[test]
    fn malformed_patches_are_refused() {
        let mut t = json!({"status": {"conditions": [{"type": "A"}]}});
        for p in [
            json!({"status": {"conditions": [{"status": "True"}]}}),
            json!({"status": {"conditions": [{"$patch": "delete"}]}}),
            json!({"status": {"$patch": "explode"}}),
            json!({"status": {"$setElementOrder/conditions": {"type": "A"}}}),
            json!(["not", "an", "object"]),
        ] {
            assert!(apply(&mut t.clone(), &p, pod()).is_err(), "{p}");
        }
        // Applying nothing changes nothing.
        apply(&mut t, &json!({}), pod()).unwrap();
        assert_eq!(t, json!({"status": {"conditions": [{"type": "A"}]}}));
    }

    /// The two-way patch applied to the original gives the modified object, for the shapes
    /// a node's status takes: changed, added, removed and reordered list elements.
    #[test]
    fn a_two_way_patch_applied_gives_the_modified_object() {
        let original = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "finalizers": ["a", "b"]},
            "status": {"phase": "Pending", "message": "old", "hostIP": "10.0.0.1",
                "conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "True"}, {"type": "Gone", "status": "True"}],
                "podIPs": [{"ip": "10.1.0.5"}],
                "containerStatuses": [{"name": "c", "ready": false}]}});
        let modified = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "finalizers": ["b", "c"]},
            "status": {"phase": "Running", "hostIP": "10.0.0.1",
                "conditions": [{"type": "B", "status": "True"}, {"type": "A", "status": "True"}, {"type": "New", "status": "True"}],
                "podIPs": [{"ip": "10.1.0.9"}],
                "containerStatuses": [{"name": "c", "ready": true}]}});
        let patch = two_way(&original, &modified, pod());
        assert_eq!(patch["status"]["message"], Value::Null);
        assert!(patch["status"].get("hostIP").is_none(), "{patch}");
        assert_eq!(
            patch["status"]["$setElementOrder/conditions"],
            json!([{"type": "B"}, {"type": "A"}, {"type": "New"}])
        );
        let mut applied = original.clone();
        apply(&mut applied, &patch, pod()).unwrap();
        assert_eq!(applied, modified, "patch {patch}");
        assert_eq!(two_way(&modified, &modified, pod()), json!({}));
    }
}
