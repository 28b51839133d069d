//! Label and field selectors as the client sent them (`labelSelector=`, `fieldSelector=`),
//! evaluated against cached objects, so a list with any selector can be answered offline
//! (OpenYurt #1963 refused lists whose selector differed from the cached one).

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// One field requirement: `field=value` or `field!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
    /// The strings it was parsed from (label selector, field selector).
    source: (String, String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("unable to parse requirement: {0:?}")]
    Label(String),
    #[error("invalid field selector: {0:?}")]
    Field(String),
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b`).
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
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn parse_label(req: &str) -> Result<LabelReq, SelectorError> {
    let err = || SelectorError::Label(req.to_string());
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key)
            .then(|| LabelReq::NotExists(key.into()))
            .ok_or_else(err);
    }
    for (op, negate) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = req.split_once(op) {
            let key = key.trim();
            let set = set.trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(err)?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if !valid_key(key) {
                return Err(err());
            }
            return Ok(if negate {
                LabelReq::NotIn(key.into(), values)
            } else {
                LabelReq::In(key.into(), values)
            });
        }
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = req.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) {
                return Err(err());
            }
            let values = vec![value.to_string()];
            return Ok(if negate {
                LabelReq::NotIn(key.into(), values)
            } else {
                LabelReq::In(key.into(), values)
            });
        }
    }
    valid_key(req)
        .then(|| LabelReq::Exists(req.into()))
        .ok_or_else(err)
}

fn parse_field(req: &str) -> Result<FieldReq, SelectorError> {
    for (op, equal) in [("!=", false), ("==", true), ("=", true)] {
        if let Some((field, value)) = req.split_once(op) {
            let field = field.trim();
            if field.is_empty() {
                break;
            }
            return Ok(FieldReq {
                field: field.into(),
                value: value.trim().into(),
                equal,
            });
        }
    }
    Err(SelectorError::Field(req.to_string()))
}

impl Selector {
    /// Parses the (already percent-decoded) label and field selector strings.
    pub fn parse(labels: &str, fields: &str) -> Result<Selector, SelectorError> {
        Ok(Selector {
            labels: split_top(labels)
                .into_iter()
                .map(parse_label)
                .collect::<Result<_, _>>()?,
            fields: split_top(fields)
                .into_iter()
                .map(parse_field)
                .collect::<Result<_, _>>()?,
            source: (labels.to_string(), fields.to_string()),
        })
    }

    /// The (label, field) selector strings it was parsed from.
    pub fn source(&self) -> (&str, &str) {
        (&self.source.0, &self.source.1)
    }

    /// Whether everything this selects is also selected by `wider` (every requirement of
    /// `wider` is one of this selector's): a list cached under `wider` can answer it.
    pub fn within(&self, wider: &Selector) -> bool {
        wider.labels.iter().all(|r| self.labels.contains(r))
            && wider.fields.iter().all(|r| self.fields.contains(r))
    }

    /// True when it selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// True when an object can only stop matching by being deleted: no label requirement
    /// (labels change) and only `field=value` on fields that never change once set —
    /// kubelet's `spec.nodeName=<node>` (a bound pod is never moved), names, namespaces.
    /// An object a list under such a selector no longer returns was deleted.
    pub fn membership_is_permanent(&self) -> bool {
        const IMMUTABLE: [&str; 3] = ["metadata.name", "metadata.namespace", "spec.nodeName"];
        self.labels.is_empty()
            && self
                .fields
                .iter()
                .all(|f| f.equal && !f.value.is_empty() && IMMUTABLE.contains(&f.field.as_str()))
    }

    /// The name it asks for when it is exactly `metadata.name=<name>` (with
    /// `metadata.namespace=` at most besides): kubelet's node and per-ConfigMap informers.
    pub fn single_name(&self) -> Option<&str> {
        if !self.labels.is_empty() || self.fields.iter().any(|f| !f.equal) {
            return None;
        }
        let mut name = None;
        for f in &self.fields {
            match f.field.as_str() {
                "metadata.name" => name = Some(f.value.as_str()),
                "metadata.namespace" => {}
                _ => return None,
            }
        }
        name.filter(|n| !n.is_empty())
    }

    /// The field names it uses (each must be one the cache indexes for the resource).
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|f| f.field.as_str())
    }

    /// Whether a cached object is selected: its labels, its indexed fields, and its
    /// `metadata.name` / `metadata.namespace` (which every kind supports).
    pub fn matches_item(&self, item: &super::objects::Item) -> bool {
        self.matches_named(&item.name, &item.namespace, &item.labels, &item.fields)
    }

    /// Like [`Selector::matches`], for an object named `name` in `namespace`.
    pub fn matches_named(
        &self,
        name: &str,
        namespace: &str,
        labels: &[(String, String)],
        fields: &[(String, String)],
    ) -> bool {
        let meta = [
            ("metadata.name".to_string(), name.to_string()),
            ("metadata.namespace".to_string(), namespace.to_string()),
        ];
        let uses_meta = self.fields.iter().any(|f| f.field.starts_with("metadata."));
        if !uses_meta {
            return self.matches(labels, fields);
        }
        let all: Vec<(String, String)> = meta.into_iter().chain(fields.iter().cloned()).collect();
        self.matches(labels, &all)
    }

    /// Whether an object with these labels and field values is selected. A field the
    /// object does not carry compares as "" (as kube-apiserver does).
    pub fn matches(&self, labels: &[(String, String)], fields: &[(String, String)]) -> bool {
        let label = |k: &str| labels.iter().find(|(lk, _)| lk == k).map(|(_, v)| v);
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
            LabelReq::In(k, vs) => label(k).is_some_and(|v| vs.contains(v)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|v| !vs.contains(v)),
        });
        labels_ok
            && self.fields.iter().all(|f| {
                let have = fields
                    .iter()
                    .find(|(k, _)| *k == f.field)
                    .map_or("", |(_, v)| v.as_str());
                (have == f.value) == f.equal
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_narrower_selector_is_within_a_wider_one() {
        let p = |l: &str, f: &str| Selector::parse(l, f).unwrap();
        let node = p("", "spec.nodeName=edge-0");
        assert!(p("app=web", "spec.nodeName=edge-0").within(&node));
        assert!(node.within(&node));
        assert!(node.within(&Selector::default()));
        assert!(
            !Selector::default().within(&node),
            "all pods are more than one node's"
        );
        assert!(!p("", "spec.nodeName=edge-1").within(&node));
    }

    #[test]
    fn label_operators() {
        let obj = l(&[("app", "web"), ("tier", "front")]);
        let m = |s: &str| Selector::parse(s, "").unwrap().matches(&obj, &[]);
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("app!=db"));
        assert!(m("app in (db, web)"));
        assert!(!m("app notin (db,web)"));
        assert!(m("missing notin (x)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("app=web,tier in (front)"));
        assert!(!m("app=web,tier=back"));
        assert!(m(""));
    }

    #[test]
    fn field_requirements_and_missing_fields() {
        let fields = l(&[("spec.nodeName", "n1"), ("metadata.name", "p")]);
        let m = |s: &str| Selector::parse("", s).unwrap().matches(&[], &fields);
        assert!(m("spec.nodeName=n1"));
        assert!(!m("spec.nodeName!=n1"));
        assert!(m("spec.nodeName=n1,metadata.name==p"));
        assert!(m("status.phase="), "a field the object lacks is empty");
        assert!(!m("status.phase=Running"));
    }

    #[test]
    fn only_deletion_ends_membership_of_immutable_equalities() {
        let permanent = |l: &str, f: &str| Selector::parse(l, f).unwrap().membership_is_permanent();
        assert!(permanent("", ""));
        assert!(permanent("", "spec.nodeName=edge-1"));
        assert!(permanent("", "metadata.namespace=default,metadata.name=a"));
        assert!(!permanent("app=web", ""), "labels change");
        assert!(!permanent("", "status.phase=Running"), "phases change");
        assert!(
            !permanent("", "spec.nodeName="),
            "unscheduled pods get bound"
        );
        assert!(!permanent("", "spec.nodeName!=edge-1"), "so do these");
    }

    #[test]
    fn a_single_name_only_from_name_equality() {
        let n = |l: &str, f: &str| {
            Selector::parse(l, f)
                .unwrap()
                .single_name()
                .map(String::from)
        };
        assert_eq!(n("", "metadata.name=edge-1"), Some("edge-1".into()));
        assert_eq!(
            n("", "metadata.namespace=a,metadata.name==cm"),
            Some("cm".into())
        );
        assert_eq!(n("", "metadata.name!=edge-1"), None);
        assert_eq!(n("app=x", "metadata.name=edge-1"), None);
        assert_eq!(n("", "spec.nodeName=n,metadata.name=p"), None);
        assert_eq!(n("", ""), None);
    }

    #[test]
    fn bad_selectors_are_errors() {
        assert!(Selector::parse("app in web", "").is_err());
        assert!(Selector::parse("a b", "").is_err());
        assert!(Selector::parse("", "novalue").is_err());
    }
}
