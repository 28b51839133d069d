//! deploy/'s kustomize base and overlays, rendered by `kubectl kustomize` (built into the
//! kubectl on the machine) into the documents an operator would apply.
use std::{path::PathBuf, process::Command};

use serde::Deserialize;
use serde_yaml::Value;

/// `deploy/<rel>` in this checkout.
pub fn deploy_dir(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(rel)
}

/// Every kustomization under deploy/: the base, then each overlay (sorted).
pub fn kustomizations() -> Vec<PathBuf> {
    let mut out = vec![deploy_dir("base")];
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(deploy_dir("overlays"))
        .expect("deploy/overlays")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    overlays.sort();
    out.extend(overlays);
    out
}

/// The documents `kubectl kustomize DIR` renders.
pub fn render(dir: &std::path::Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| Value::deserialize(d).expect("a YAML document"))
        .collect()
}

/// The document of `kind` whose name is `name` (or, for a generated ConfigMap, starts
/// with `name-` followed by kustomize's hash).
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"].as_str().is_some_and(|n| {
                    n == name
                        || (kind == "ConfigMap"
                            && n.strip_prefix(name)
                                .and_then(|rest| rest.strip_prefix('-'))
                                .is_some_and(|hash| !hash.contains('-')))
                })
        })
        .unwrap_or_else(|| panic!("no {kind} {name} among the rendered documents"))
}

/// The hub's configuration file, as the rendered hub-config ConfigMap carries it.
pub fn hub_config(docs: &[Value]) -> String {
    find(docs, "ConfigMap", "hub-config")["data"]["hub.yaml"]
        .as_str()
        .expect("hub-config has data.hub.yaml")
        .to_string()
}
