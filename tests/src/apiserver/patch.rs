//! PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (merge, with lists of
//! named objects merged by key as Kubernetes does for containers, ports, env, conditions,
//! and its directives: `$patch: delete|replace` on maps and list items,
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`, `$setElementOrder/<field>` — none of
//! them ever stored as a field), and JSON patch (RFC 6902).
use serde_json::Value;

pub fn merge_patch(target: &mut Value, patch: &Value) {
    merge(target, patch, false);
}

pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    merge(target, patch, true);
}

/// The key Kubernetes merges a list of objects by, if every element carries it.
fn merge_key(items: &[Value]) -> Option<&'static str> {
    ["name", "type", "containerPort", "ip"]
        .into_iter()
        .find(|k| !items.is_empty() && items.iter().all(|i| i.get(*k).is_some()))
}

/// `v` without strategic-merge directives (keys starting with `$`), at every depth.
fn without_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), without_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_directives).collect()),
        other => other.clone(),
    }
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

fn merge(target: &mut Value, patch: &Value, strategic: bool) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if strategic && directive(patch) == Some("replace") {
        *target = without_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("object");
    let mut retain: Option<Vec<String>> = None;
    for (k, v) in p {
        if strategic && k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
                && let (Some(Value::Array(cur)), Value::Array(gone)) = (t.get_mut(field), v)
            {
                cur.retain(|x| !gone.contains(x));
            }
            if k == "$retainKeys" {
                retain = v.as_array().map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                });
            }
            continue;
        }
        if v.is_null() || (strategic && directive(v) == Some("delete")) {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(cur)), Value::Array(new)) if strategic => {
                if let Some(key) = merge_key(new).filter(|key| merge_key(cur) == Some(key)) {
                    for item in new {
                        let id = &item[key];
                        if directive(item) == Some("delete") {
                            cur.retain(|c| &c[key] != id);
                        } else if let Some(existing) = cur.iter_mut().find(|c| &c[key] == id) {
                            merge(existing, item, true);
                        } else {
                            cur.push(without_directives(item));
                        }
                    }
                } else {
                    *cur = without_directives(v)
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                }
            }
            (Some(existing), Value::Object(_)) => merge(existing, v, strategic),
            _ => {
                let v = if strategic {
                    without_directives(v)
                } else {
                    v.clone()
                };
                t.insert(k.clone(), v);
            }
        }
    }
    if let Some(keep) = retain {
        t.retain(|k, _| keep.contains(k));
    }
}

fn pointer_parts(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn parent_and_last<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), String> {
    let mut parts = pointer_parts(path)?;
    let last = parts.pop().ok_or("cannot operate on the document root")?;
    let mut cur = doc;
    for p in parts {
        cur = match cur {
            Value::Object(m) => m.get_mut(&p),
            Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("path {path:?} does not exist"))?;
    }
    Ok((cur, last))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let (parent, last) = parent_and_last(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse().map_err(|_| format!("bad index {last:?}"))?
            };
            if i > a.len() {
                return Err(format!("index {i} out of bounds"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("path {path:?}: parent is not a container")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = parent_and_last(doc, path)?;
    match parent {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| format!("path {path:?} does not exist")),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("index {i} out of bounds"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("path {path:?} does not exist")),
    }
}

pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let path = op["path"].as_str().ok_or("operation without a path")?;
        match op["op"].as_str() {
            Some("add") => add(doc, path, op["value"].clone())?,
            Some("remove") => drop(remove(doc, path)?),
            Some("replace") => {
                remove(doc, path)?;
                add(doc, path, op["value"].clone())?;
            }
            Some("test") => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!("test operation failed at {path}"));
                }
            }
            Some("move") => {
                let from = op["from"].as_str().ok_or("move without from")?;
                let v = remove(doc, from)?;
                add(doc, path, v)?;
            }
            Some("copy") => {
                let from = op["from"].as_str().ok_or("copy without from")?;
                let v = doc
                    .pointer(from)
                    .cloned()
                    .ok_or("copy from a missing path")?;
                add(doc, path, v)?;
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_and_strategic_differ_on_named_lists() {
        let base = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}, "metadata": {"labels": {"k": "v", "gone": "1"}}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "z"}]}, "metadata": {"labels": {"gone": null, "new": "2"}}});
        let mut m = base.clone();
        merge_patch(&mut m, &patch);
        assert_eq!(m["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(m["metadata"]["labels"], json!({"k": "v", "new": "2"}));
        let mut s = base.clone();
        strategic_merge_patch(&mut s, &patch);
        assert_eq!(
            s["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}])
        );
    }

    /// The directives the recordings and kubelet use, applied — and never stored.
    #[test]
    fn strategic_directives_are_applied_and_never_stored() {
        let mut pod = json!({
            "metadata": {"finalizers": ["a", "b", "c"], "labels": {"x": "1"}},
            "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]},
        });
        // As recorded (patch-pod-status-strategic), plus the other directives.
        let patch = json!({
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["b"], "labels": {"$patch": "replace", "y": "2"}},
            "spec": {"containers": [{"name": "a", "$patch": "delete"}, {"name": "c", "image": "z", "$patch": "merge"}],
                     "strategy": {"$retainKeys": ["type"], "type": "Recreate"}},
            "status": {"$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
                       "conditions": [{"type": "Ready", "status": "False"}], "phase": "Pending"},
        });
        strategic_merge_patch(&mut pod, &patch);
        assert_eq!(pod["metadata"]["finalizers"], json!(["a", "c"]));
        assert_eq!(pod["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "b", "image": "y"}, {"name": "c", "image": "z"}])
        );
        assert_eq!(pod["spec"]["strategy"], json!({"type": "Recreate"}));
        assert_eq!(
            pod["status"]["conditions"][0],
            json!({"type": "Ready", "status": "False"})
        );
        assert_eq!(pod["status"]["phase"], "Pending");
        assert!(
            !pod.to_string().contains('$'),
            "a directive was stored: {pod}"
        );
        let mut gone = json!({"spec": {"affinity": {"nodeAffinity": {}}}});
        strategic_merge_patch(
            &mut gone,
            &json!({"spec": {"affinity": {"$patch": "delete"}}}),
        );
        assert_eq!(gone, json!({"spec": {}}));
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        json_patch(
            &mut d,
            &json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "x"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "remove", "path": "/list/0"},
                {"op": "test", "path": "/list/0", "value": 2}
            ]),
        )
        .unwrap();
        assert_eq!(
            d,
            json!({"metadata": {"labels": {"a": "x", "b": "2"}}, "list": [2, 3]})
        );
        assert!(
            json_patch(
                &mut d,
                &json!([{"op": "test", "path": "/list/0", "value": 9}])
            )
            .is_err()
        );
    }
}
