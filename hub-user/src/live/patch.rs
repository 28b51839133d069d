//! The three PATCH bodies kube-apiserver takes, applied to the node's JSON copy of an
//! object: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch
//! (`smp`).
use serde_json::Value;

use super::{PatchError, smp};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
}

impl PatchType {
    pub fn of_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next()?.trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/json-patch+json" => Some(PatchType::Json),
            _ => None,
        }
    }
}

/// Applies `patch` of type `kind` to `target` (an object of schema message `at`).
pub fn apply(
    target: &mut Value,
    patch: &Value,
    kind: PatchType,
    at: smp::At,
) -> Result<(), PatchError> {
    match kind {
        PatchType::Strategic => smp::apply(target, patch, at),
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(PatchError(
                    "a merge patch of an object must be a JSON object".into(),
                ));
            }
            merge_patch(target, patch);
            Ok(())
        }
        PatchType::Json => json_patch(target, patch),
    }
}

/// RFC 7386: objects merge, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn bad(msg: impl Into<String>) -> PatchError {
    PatchError(msg.into())
}

/// The reference tokens of an RFC 6901 pointer.
fn tokens(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| bad(format!("JSON pointer {pointer:?} does not start with /")))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn index(list: &[Value], token: &str, appending: bool) -> Result<usize, PatchError> {
    if appending && token == "-" {
        return Ok(list.len());
    }
    let i: usize = token
        .parse()
        .map_err(|_| bad(format!("{token:?} is not a list index")))?;
    let limit = if appending {
        list.len()
    } else {
        list.len().saturating_sub(1)
    };
    if i > limit || (!appending && list.is_empty()) {
        return Err(bad(format!("list index {i} is out of range")));
    }
    Ok(i)
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Result<&'a Value, PatchError> {
    path.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t).ok_or_else(|| bad(format!("no member {t:?}"))),
        Value::Array(l) => Ok(&l[index(l, t, false)?]),
        _ => Err(bad(format!("{t:?} is below a scalar"))),
    })
}

fn parent<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, PatchError> {
    path.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get_mut(t).ok_or_else(|| bad(format!("no member {t:?}"))),
        Value::Array(l) => {
            let i = index(l, t, false)?;
            Ok(&mut l[i])
        }
        _ => Err(bad(format!("{t:?} is below a scalar"))),
    })
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, up)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent(doc, up)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(l) => {
            let i = index(l, last, true)?;
            l.insert(i, value);
        }
        _ => return Err(bad(format!("cannot add {last:?} below a scalar"))),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let (last, up) = path
        .split_last()
        .ok_or_else(|| bad("cannot remove the whole document"))?;
    match parent(doc, up)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| bad(format!("no member {last:?} to remove"))),
        Value::Array(l) => {
            let i = index(l, last, false)?;
            Ok(l.remove(i))
        }
        _ => Err(bad(format!("cannot remove {last:?} below a scalar"))),
    }
}

/// RFC 6902: a list of operations applied in order; any failing one fails the whole patch.
fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| bad("a JSON patch must be a list of operations"))?;
    let mut doc = target.clone();
    for op in ops {
        let text = |k: &str| {
            op.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("operation {op} has no {k:?}")))
        };
        let path = tokens(text("path")?)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| bad(format!("operation {op} has no value")))
        };
        match text("op")? {
            "add" => add(&mut doc, &path, value()?)?,
            "remove" => {
                remove(&mut doc, &path)?;
            }
            "replace" => {
                remove(&mut doc, &path)?;
                add(&mut doc, &path, value()?)?;
            }
            "move" => {
                let from = tokens(text("from")?)?;
                let v = remove(&mut doc, &from)?;
                add(&mut doc, &path, v)?;
            }
            "copy" => {
                let v = get(&doc, &tokens(text("from")?)?)?.clone();
                add(&mut doc, &path, v)?;
            }
            "test" => {
                if *get(&doc, &path)? != value()? {
                    return Err(bad(format!("test failed at {:?}", text("path")?)));
                }
            }
            other => return Err(bad(format!("unknown JSON patch operation {other:?}"))),
        }
    }
    *target = doc;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]});
        apply(
            &mut t,
            &json!({"a": null, "b": {"c": 5}, "l": [3]}),
            PatchType::Merge,
            None,
        )
        .unwrap();
        assert_eq!(t, json!({"b": {"c": 5, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_rfc6902() {
        let mut t = json!({"metadata": {"labels": {"a/b": "1"}}, "status": {"conditions": [{"type": "A"}]}});
        let p = json!([
            {"op": "add", "path": "/status/conditions/-", "value": {"type": "B"}},
            {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
            {"op": "copy", "from": "/metadata/labels", "path": "/metadata/annotations"},
            {"op": "move", "from": "/status/conditions/0", "path": "/status/conditions/1"},
            {"op": "test", "path": "/status/conditions/0/type", "value": "B"},
            {"op": "remove", "path": "/metadata/annotations"}]);
        apply(&mut t, &p, PatchType::Json, None).unwrap();
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"a/b": "2"}}, "status": {"conditions": [{"type": "B"}, {"type": "A"}]}})
        );
        // A failing operation leaves the object as it was.
        let before = t.clone();
        let failing = json!([{"op": "remove", "path": "/metadata/labels"}, {"op": "test", "path": "/x", "value": 1}]);
        assert!(apply(&mut t, &failing, PatchType::Json, None).is_err());
        assert_eq!(t, before);
        for p in [
            json!({"op": "add"}),
            json!([{"op": "frob", "path": "/a"}]),
            json!([{"op": "remove", "path": "/status/conditions/7"}]),
        ] {
            assert!(apply(&mut t, &p, PatchType::Json, None).is_err(), "{p}");
        }
    }
}
