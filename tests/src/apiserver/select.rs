//! Label and field selectors, parsed and matched as kube-apiserver does for the fields the
//! stand-in supports.
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set(values: &str) -> Result<Vec<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("expected (values) in {values:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else {
                Req::Exists(part.to_string())
            };
            let key = match &req {
                Req::Exists(k) | Req::NotExists(k) | Req::Eq(k, _) | Req::NotEq(k, _) => k,
                Req::In(k, _) | Req::NotIn(k, _) => k,
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
            Req::Eq(k, v) => get(k) == Some(v),
            Req::NotEq(k, v) => get(k) != Some(v),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields each kind supports beyond metadata.name / metadata.namespace.
fn supported(kind: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match kind {
        "Pod" => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        "Event" => {
            field.starts_with("involvedObject.")
                || matches!(field, "reason" | "reportingComponent" | "source" | "type")
        }
        "Secret" => field == "type",
        "Service" => matches!(field, "spec.clusterIP" | "spec.type"),
        "Node" => field == "spec.unschedulable",
        "Namespace" => field == "status.phase",
        "CertificateSigningRequest" => field == "spec.signerName",
        "ResourceSlice" => matches!(field, "spec.nodeName" | "spec.driver" | "spec.pool.name"),
        _ => false,
    }
}

impl FieldSelector {
    pub fn parse(s: &str, kind: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if !supported(kind, field) {
                return Err(format!("field label not supported: {field}"));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// The value `field` must equal, when the selector requires one.
    pub fn equals(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, eq, _)| *eq && f == field)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, want)| {
            let mut v = obj;
            for part in field.split('.') {
                v = &v[part];
            }
            let have = match v {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_operators() {
        let pod = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web,db)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier in (front)",
        ];
        let no = [
            "app=db",
            "app in (db)",
            "tier notin (front)",
            "missing",
            "!app",
            "app=web,tier=back",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn field_selector_fields() {
        let pod = json!({"metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("spec.nodeName=edge-1", "Pod")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            FieldSelector::parse("status.phase!=Pending,metadata.name=p", "Pod")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=edge-2", "Pod")
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.nodeName=x", "ConfigMap").is_err());
    }
}
