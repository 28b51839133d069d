//! Applying a kubelet's offline PATCH to the cached JSON object, so what the cache serves
//! reflects the write until the cloud answers: JSON merge patch (RFC 7386) and the subset
//! of strategic merge patch that status updates use (lists of objects merged by their
//! `type` or `name` key, `$` directives ignored). The cloud applies the real patch when it
//! is replayed; this is only the node's view meanwhile.
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    /// RFC 6902 JSON patch: not applied locally (the cached view stays as it was).
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

/// The key a strategic merge matches list elements by, if every element has it.
fn merge_key(items: &[Value]) -> Option<&'static str> {
    ["type", "name"]
        .into_iter()
        .find(|k| !items.is_empty() && items.iter().all(|i| i[*k].is_string()))
}

pub fn apply(target: &mut Value, patch: &Value, kind: PatchType) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if kind == PatchType::Strategic && k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Array(new) if kind == PatchType::Strategic => {
                let key = merge_key(new);
                match (t.get_mut(k), key) {
                    (Some(Value::Array(old)), Some(key)) if merge_key(old) == Some(key) => {
                        for n in new {
                            match old.iter_mut().find(|o| o[key] == n[key]) {
                                Some(o) => apply(o, n, kind),
                                None => old.push(n.clone()),
                            }
                        }
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
            _ => apply(t.entry(k.clone()).or_insert(Value::Null), v, kind),
        }
    }
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
        );
        assert_eq!(t, json!({"b": {"c": 5, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_merges_conditions_by_type() {
        let mut pod = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}});
        apply(
            &mut pod,
            &json!({"status": {"$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "False"}], "phase": "Failed"}}),
            PatchType::Strategic,
        );
        assert_eq!(
            pod,
            json!({"status": {"phase": "Failed", "conditions": [
                {"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}})
        );
    }
}
