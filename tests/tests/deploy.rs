//! Issue 9 (deploy/): the manifests are accepted by an apiserver (a server-side dry run
//! against the stand-in) and the ConfigMap's hub config passes `hub run --check`.
use std::{path::PathBuf, process::Command};

use serde::Deserialize;

use hub_tests::{
    TempDir,
    apiserver::{Options, StandIn},
    hub_bin,
};

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

#[test]
fn configmap_config_passes_hub_validation() {
    let config = documents("hub.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "hub-config")
        .expect("the hub-config ConfigMap");
    let hub_yaml = config["data"]["hub.yaml"].as_str().expect("data.hub.yaml");
    let dir = TempDir::new("dep");
    let path = dir.path().join("hub.yaml");
    std::fs::write(&path, hub_yaml).unwrap();
    let out = Command::new(hub_bin())
        .args(["run", "--check", "--node-name", "edge-1", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("config ok"));
}

fn documents(file: &str) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(deploy(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .collect()
}

/// The pool leader lists and watches the pool-scope resources with its node's identity:
/// the RBAC must grant exactly that to the nodes' group, for every pool-scope resource of
/// the ConfigMap (the default system:node role does not cover endpointslices).
#[test]
fn nodes_may_list_and_watch_every_pool_scope_resource() {
    let docs = documents("hub.yaml");
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} in deploy/hub.yaml"))
    };
    let binding = find("ClusterRoleBinding", "hub:pool-leader");
    assert_eq!(binding["subjects"][0]["kind"], "Group");
    assert_eq!(binding["subjects"][0]["name"], "system:nodes");
    let role = find("ClusterRole", binding["roleRef"]["name"].as_str().unwrap());
    let hub_yaml: serde_yaml::Value = serde_yaml::from_str(
        find("ConfigMap", "hub-config")["data"]["hub.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let scope = hub_yaml["coordinator"]["poolScopeResources"]
        .as_sequence()
        .expect("poolScopeResources");
    assert!(!scope.is_empty());
    for gvr in scope {
        // "group/version/resource", the core group empty.
        let gvr = gvr.as_str().unwrap();
        let (group, resource) = (
            gvr.split('/').next().unwrap(),
            gvr.rsplit('/').next().unwrap(),
        );
        let allowed = role["rules"].as_sequence().unwrap().iter().any(|rule| {
            let has = |field: &str, want: &str| {
                rule[field]
                    .as_sequence()
                    .is_some_and(|v| v.iter().any(|x| x == want))
            };
            has("apiGroups", group)
                && has("resources", resource)
                && has("verbs", "list")
                && has("verbs", "watch")
        });
        assert!(allowed, "nodes cannot list/watch {gvr}: {role:?}");
    }
    let account = find("ServiceAccount", "hub");
    assert_eq!(account["automountServiceAccountToken"], false);
}

/// The DaemonSet's init container installs the host copy where the host will find it: the
/// state directory mounted at the ConfigMap's cache.dir (the path the unit names, the same
/// on the host), and the host's systemd directory at the --unit-dir it is given. Its
/// arguments are ones `hub install` accepts: run for real against a temporary directory.
#[test]
fn the_init_container_installs_the_host_copy_where_the_host_finds_it() {
    let docs = documents("hub.yaml");
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    let init = &spec["initContainers"][0];
    let args: Vec<&str> = init["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "install");
    let arg = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    let mounted_from_host = |path: &str| -> Option<String> {
        let mount = init["volumeMounts"]
            .as_sequence()?
            .iter()
            .find(|m| m["mountPath"] == path)?;
        let volume = spec["volumes"]
            .as_sequence()?
            .iter()
            .find(|v| v["name"] == mount["name"])?;
        Some(volume["hostPath"]["path"].as_str()?.to_string())
    };
    assert_eq!(
        mounted_from_host(arg("--unit-dir")).as_deref(),
        Some("/etc/systemd/system")
    );
    let hub_yaml: serde_yaml::Value = serde_yaml::from_str(
        docs.iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "hub-config")
            .unwrap()["data"]["hub.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let state = hub_yaml["cache"]["dir"].as_str().unwrap();
    assert_eq!(mounted_from_host(state).as_deref(), Some(state));

    // The same arguments, with the ConfigMap's config and a temporary state and unit dir.
    let dir = TempDir::new("init");
    let mut config = hub_yaml.clone();
    config["cache"]["dir"] = dir.path().join("state").display().to_string().into();
    let config_path = dir.path().join("hub.yaml");
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let units = dir.path().join("units");
    let mut c = Command::new(hub_bin());
    for (i, a) in args.iter().enumerate() {
        match args.get(i.wrapping_sub(1)).copied() {
            Some("--config") => c.arg(&config_path),
            Some("--unit-dir") => c.arg(&units),
            Some("--node-name") => c.arg("edge-1"),
            _ => c.arg(a),
        };
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(units.join("multi-user.target.wants/hub.service").exists());
    assert!(dir.path().join("state/bin/hub").exists());
}

#[test]
fn manifests_pass_a_server_side_dry_run() {
    let s = StandIn::start("127.0.0.1:0".parse().unwrap(), Options::default()).unwrap();
    let dir = TempDir::new("dep");
    let kc = dir.path().join("kubeconfig");
    s.write_kubeconfig(&kc, None).unwrap();
    let out = Command::new("kubectl")
        .args(["apply", "--dry-run=server", "-f"])
        .arg(deploy("hub.yaml"))
        .arg("-f")
        .arg(deploy("coordinator-etcd.yaml"))
        .arg("-f")
        .arg(deploy("approver.yaml"))
        .env("KUBECONFIG", &kc)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for what in [
        "daemonset.apps/hub",
        "statefulset.apps/hub-coordinator",
        "clusterrole.rbac.authorization.k8s.io/hub:pool-leader",
        "clusterrolebinding.rbac.authorization.k8s.io/hub:pool-leader",
        "configmap/hub-config",
        "deployment.apps/hub-approver",
        "clusterrole.rbac.authorization.k8s.io/hub:approver",
    ] {
        assert!(stdout.contains(what), "{what} missing from:\n{stdout}");
    }
    assert!(stdout.contains("(server dry run)"));
    // A dry run stores nothing.
    let after = Command::new("kubectl")
        .args(["get", "daemonsets", "-A", "-o", "name"])
        .env("KUBECONFIG", &kc)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), "");
}
