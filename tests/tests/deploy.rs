//! deploy/: the kustomize base and every overlay render (`kubectl kustomize`), every
//! rendered document is accepted by an apiserver (a server-side dry run against the
//! stand-in), and each one's hub configuration passes `hub run --check`.
use std::process::Command;

use hub_tests::{
    TempDir,
    apiserver::{Options, StandIn},
    hub_bin,
    manifests::{find, hub_config, kustomizations, render},
};

#[test]
fn every_kustomization_s_configuration_passes_hub_validation() {
    for dir in kustomizations() {
        let docs = render(&dir);
        let tmp = TempDir::new("dep");
        let path = tmp.path().join("hub.yaml");
        std::fs::write(&path, hub_config(&docs)).unwrap();
        let out = Command::new(hub_bin())
            .args(["run", "--check", "--node-name", "edge-1", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("config ok"),
            "{}",
            dir.display()
        );
    }
}

fn base() -> Vec<serde_yaml::Value> {
    render(&hub_tests::manifests::deploy_dir("base"))
}

/// The pool leader lists and watches the pool-scope resources with its node's identity:
/// the RBAC must grant exactly that to the nodes' group, for every pool-scope resource of
/// the ConfigMap (the default system:node role does not cover endpointslices).
#[test]
fn nodes_may_list_and_watch_every_pool_scope_resource() {
    let docs = base();
    let binding = find(&docs, "ClusterRoleBinding", "hub:pool-leader");
    assert_eq!(binding["subjects"][0]["kind"], "Group");
    assert_eq!(binding["subjects"][0]["name"], "system:nodes");
    let role = find(
        &docs,
        "ClusterRole",
        binding["roleRef"]["name"].as_str().unwrap(),
    );
    let hub_yaml: serde_yaml::Value = serde_yaml::from_str(&hub_config(&docs)).unwrap();
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
    let account = find(&docs, "ServiceAccount", "hub");
    assert_eq!(account["automountServiceAccountToken"], false);
}

/// The DaemonSet's init container installs the host copy where the host will find it: the
/// state directory mounted at the ConfigMap's cache.dir (the path the unit names, the same
/// on the host), and the host's systemd directory at the --unit-dir it is given. Its
/// arguments are ones `hub install` accepts: run for real against a temporary directory.
#[test]
fn the_init_container_installs_the_host_copy_where_the_host_finds_it() {
    let docs = base();
    let ds = find(&docs, "DaemonSet", "hub");
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
    let hub_yaml: serde_yaml::Value = serde_yaml::from_str(&hub_config(&docs)).unwrap();
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

/// Every kustomization, rendered, goes through a server-side dry run: each document is
/// accepted and none is stored.
#[test]
fn every_kustomization_passes_a_server_side_dry_run() {
    let s = StandIn::start("127.0.0.1:0".parse().unwrap(), Options::default()).unwrap();
    let dir = TempDir::new("dep");
    let kc = dir.path().join("kubeconfig");
    s.write_kubeconfig(&kc, None).unwrap();
    for kustomization in kustomizations() {
        let out = Command::new("kubectl")
            .args(["apply", "--dry-run=server", "-k"])
            .arg(&kustomization)
            .env("KUBECONFIG", &kc)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {stdout}{}",
            kustomization.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let docs = render(&kustomization);
        for doc in &docs {
            let kind = doc["kind"].as_str().unwrap().to_lowercase();
            let name = doc["metadata"]["name"].as_str().unwrap();
            assert!(
                stdout.lines().any(|l| l.starts_with(&kind)
                    && l.contains(&format!("/{name} "))
                    && l.ends_with("(server dry run)")),
                "{}: {kind} {name} missing from:\n{stdout}",
                kustomization.display()
            );
        }
        assert!(
            docs.len() >= 11,
            "{}: {} documents",
            kustomization.display(),
            docs.len()
        );
    }
    // A dry run stores nothing.
    let after = Command::new("kubectl")
        .args(["get", "daemonsets,configmaps", "-A", "-o", "name"])
        .env("KUBECONFIG", &kc)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), "");
}
