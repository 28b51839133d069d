//! deploy/: the kustomize base and every overlay render (`kubectl kustomize`), every
//! rendered document is accepted by an apiserver (a server-side dry run against the
//! stand-in), and each one's hub configuration passes `hub run --check`.
use std::{ffi::OsStr, path::Path, process::Command};

use hub_tests::{
    TempDir,
    apiserver::{Options, StandIn},
    hub::{Checked, check_config},
    hub_bin,
    manifests::{find, hub_config, kustomizations, render},
    node_root::{Cgroups, NodeRoot},
};

/// The node layout a kustomization is for: its overlay's name, else kubeadm's (the base's).
fn layout_of(dir: &Path) -> &'static str {
    let name = dir.file_name().unwrap().to_str().unwrap();
    ["k3s", "rke2", "microshift"]
        .into_iter()
        .find(|l| *l == name)
        .unwrap_or("kubeadm")
}

/// `hub run --check` of `config` against the node laid out under `root`, with `args`.
fn check(config: &str, root: &Path, args: &[&str]) -> Checked {
    let mut all: Vec<&OsStr> = vec!["--node-name".as_ref(), "edge-1".as_ref()];
    all.extend(["--node-root".as_ref(), root.as_os_str()]);
    all.extend(args.iter().map(|a| OsStr::new(*a)));
    check_config(config, &all)
}

/// Whether the DaemonSet's hub container sees `path` of the host at the same path.
fn mounted_in_the_hub(docs: &[serde_yaml::Value], path: &Path) -> bool {
    let spec = &find(docs, "DaemonSet", "hub")["spec"]["template"]["spec"];
    let hub = spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "hub")
        .unwrap();
    hub["volumeMounts"].as_sequence().unwrap().iter().any(|m| {
        let at = m["mountPath"].as_str().unwrap();
        path.starts_with(at)
            && spec["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|v| v["name"] == m["name"] && v["hostPath"]["path"].as_str() == Some(at))
    })
}

/// Every kustomization's configuration passes `hub run --check` on a node laid out as its
/// distribution lays it out (k3s with hybrid cgroups, RKE2 inside a private cgroup
/// namespace): the hub finds the kubelet's kubeconfig, follows it to the certificates,
/// finds the client CA and the cgroup2 hierarchy; and the DaemonSet mounts every file it
/// reads at the path it reads it.
#[test]
fn every_kustomization_finds_its_node_layout_and_mounts_what_it_reads() {
    let cgroups = |layout: &str| match layout {
        "k3s" => Cgroups::Hybrid,
        "rke2" => Cgroups::PrivateNamespace,
        _ => Cgroups::Unified,
    };
    for dir in kustomizations() {
        let docs = render(&dir);
        let layout = layout_of(&dir);
        let root = NodeRoot::new(layout, "edge-1", cgroups(layout));
        let checked = check(&hub_config(&docs), root.path(), &[]);
        let said = &checked.stdout;
        assert!(checked.ok, "{}: {said}{}", dir.display(), checked.stderr);
        assert!(
            said.contains(&format!(
                "node layout: {layout} (found the kubelet kubeconfig"
            )),
            "{}: {said}",
            dir.display()
        );
        let cgroup = cgroups(layout).expected();
        assert!(
            said.contains(&format!("cgroup2 hierarchy: {cgroup} (")),
            "{}: {said}",
            dir.display()
        );
        assert!(said.contains("\nconfig ok: "), "{}: {said}", dir.display());
        for file in &root.files {
            assert!(
                mounted_in_the_hub(&docs, file),
                "{}: the hub container does not see {}",
                dir.display(),
                file.display()
            );
        }
    }
    // The base alone does not mount k3s's files: the component is what does.
    let k3s = NodeRoot::new("k3s", "edge-1", Cgroups::Unified);
    let base = base();
    assert!(k3s.files.iter().any(|f| !mounted_in_the_hub(&base, f)));
}

/// What `hub run --check` says when the node is not as the configuration needs.
#[test]
fn check_names_what_the_node_lacks() {
    let config = hub_config(&base());
    let empty = TempDir::new("empty-root");
    std::fs::create_dir_all(empty.path().join("proc/self")).unwrap();
    let Checked {
        ok, stderr: err, ..
    } = check(&config, empty.path(), &[]);
    assert!(!ok);
    assert!(
        err.contains("no kubelet kubeconfig found")
            && err.contains("/var/lib/rancher/k3s/agent/kubelet.kubeconfig"),
        "{err}"
    );
    // The kubeconfig names a key that is not there.
    let root = NodeRoot::new("k3s", "edge-1", Cgroups::Hybrid);
    std::fs::remove_file(
        root.path()
            .join("var/lib/rancher/k3s/agent/client-kubelet.key"),
    )
    .unwrap();
    let Checked {
        ok, stderr: err, ..
    } = check(&config, root.path(), &[]);
    assert!(!ok);
    assert!(err.contains("client-kubelet.key"), "{err}");
    // cgroup v1 only: interception cannot attach, and the check says how to fix it.
    let root = NodeRoot::new("kubeadm", "edge-1", Cgroups::Unified);
    std::fs::write(
        root.path().join("proc/self/mountinfo"),
        "31 22 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n33 31 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
    )
    .unwrap();
    let Checked {
        ok, stderr: err, ..
    } = check(&config, root.path(), &[]);
    assert!(!ok && err.contains("cgroup v1 only"), "{err}");
    // A kubelet kubeconfig kept elsewhere, given explicitly: read, certificates resolved
    // against its own directory.
    let root = NodeRoot::new("k3s", "edge-1", Cgroups::Unified);
    let agent = root.path().join("var/lib/rancher/k3s/agent");
    let elsewhere = root.path().join("opt/kubelet");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let text = std::fs::read_to_string(agent.join("kubelet.kubeconfig"))
        .unwrap()
        .replace(
            "/var/lib/rancher/k3s/agent/client-kubelet",
            "client-kubelet",
        );
    std::fs::write(elsewhere.join("kubeconfig"), text).unwrap();
    for f in ["client-kubelet.crt", "client-kubelet.key"] {
        std::fs::rename(agent.join(f), elsewhere.join(f)).unwrap();
    }
    std::fs::remove_file(agent.join("kubelet.kubeconfig")).unwrap();
    let checked = check(
        &config,
        root.path(),
        &["--kubeconfig", "/opt/kubelet/kubeconfig"],
    );
    let said = &checked.stdout;
    assert!(checked.ok, "{said}{}", checked.stderr);
    assert!(
        said.contains(
            "node layout: configured (cloud.kubeconfig /opt/kubelet/kubeconfig configured)"
        ),
        "{said}"
    );
}

fn base() -> Vec<serde_yaml::Value> {
    render(&hub_tests::manifests::deploy_dir("base"))
}

/// The pool leader lists and watches the pool-scope resources with its node's identity, and
/// the node-level watch cache its shared resources: the RBAC must grant exactly that to the
/// nodes' group, for every such resource of the ConfigMap (the default system:node role
/// does not cover endpointslices).
#[test]
fn nodes_may_list_and_watch_every_pool_scope_and_shared_resource() {
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
    let listed = |v: &serde_yaml::Value, what: &str| {
        let list = v.as_sequence().unwrap_or_else(|| panic!("{what}")).clone();
        assert!(!list.is_empty(), "{what} is empty");
        list
    };
    let mut scope = listed(
        &hub_yaml["coordinator"]["poolScopeResources"],
        "poolScopeResources",
    );
    scope.extend(listed(
        &hub_yaml["cache"]["sharedResources"],
        "sharedResources",
    ));
    for gvr in &scope {
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

    // Where systemd would say it booted the host: the host's /run/systemd, mounted at the
    // --host-run the init container is given.
    assert_eq!(
        mounted_from_host(&format!("{}/systemd", arg("--host-run"))).as_deref(),
        Some("/run/systemd")
    );

    // The same arguments, with the ConfigMap's config and a temporary state, unit and run
    // directory: first on a node systemd did not boot, then on one it did.
    let dir = TempDir::new("init");
    let mut config = hub_yaml.clone();
    config["cache"]["dir"] = dir.path().join("state").display().to_string().into();
    let config_path = dir.path().join("hub.yaml");
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let (units, run) = (dir.path().join("units"), dir.path().join("run"));
    let install = || {
        let mut c = Command::new(hub_bin());
        for (i, a) in args.iter().enumerate() {
            match args.get(i.wrapping_sub(1)).copied() {
                Some("--config") => c.arg(&config_path),
                Some("--unit-dir") => c.arg(&units),
                Some("--host-run") => c.arg(&run),
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
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = install();
    assert!(
        said.starts_with("host copy not installed: systemd did not boot this node")
            && said.contains("relies on the DaemonSet alone"),
        "{said}"
    );
    assert!(!units.join(UNIT_LINK).exists() && !dir.path().join("state/bin/hub").exists());
    std::fs::create_dir_all(run.join("systemd/system")).unwrap();
    let said = install();
    assert!(said.contains("enabled for boot"), "{said}");
    assert!(units.join(UNIT_LINK).exists());
    assert!(dir.path().join("state/bin/hub").exists());
}

/// The link `systemctl enable` makes for the host copy's unit.
const UNIT_LINK: &str = "multi-user.target.wants/hub.service";

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
