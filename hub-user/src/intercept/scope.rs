//! What the programs' cgroup reaches: where the node's pods are below it, and whether it
//! redirects more than the node's components. Attached at the root of a cgroup2 hierarchy,
//! the programs redirect every process on the host — a local apiserver's own loopback
//! clients and an administrator's tools included, whose certificates the hub refuses —
//! which `hub run --check` and the daemon say plainly.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use super::cgroup_tree::cgroup_tree;
use crate::config::Config;

/// kubelet's pod cgroup, by its cgroup driver: `kubepods.slice` (systemd) or `kubepods`
/// (cgroupfs), possibly with a prefix from kubelet's `--cgroup-root`
/// (`kubelet-kubepods.slice`).
fn is_pods_root(name: &str) -> bool {
    name == "kubepods" || name == "kubepods.slice" || name.ends_with("-kubepods.slice")
}

/// Where the node's pods' cgroups may be: `configured`, or kubelet's pod cgroup found
/// beside or below `cgroup_path`, or in any cgroup above it up to the hierarchy's root
/// (so a `cgroupPath` narrowed to a sub-cgroup still finds the pods).
pub fn pod_roots(configured: Option<&Path>, cgroup_path: &Path) -> Vec<PathBuf> {
    match configured {
        Some(root) => vec![root.to_path_buf()],
        None => found_up_to(cgroup_path, cgroup2_mount_of(cgroup_path).as_deref()),
    }
}

/// kubelet's pod cgroups in `cgroup_path` and each directory above it up to `top`.
fn found_up_to(cgroup_path: &Path, top: Option<&Path>) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut dir = Some(cgroup_path);
    while let Some(d) = dir {
        for name in ["kubepods.slice", "kubepods"] {
            roots.push(d.join(name));
        }
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_pods_root(&name) && !roots.contains(&e.path()) {
                roots.push(e.path());
            }
        }
        if top.is_none_or(|t| d == t) {
            break;
        }
        dir = d.parent();
    }
    roots
}

/// The mount point of the cgroup2 hierarchy `path` is in, if any.
fn cgroup2_mount_of(path: &Path) -> Option<PathBuf> {
    cgroup2_mounts()
        .into_iter()
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.components().count())
}

/// Every cgroup2 mount point (from /proc/self/mountinfo).
fn cgroup2_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    super::cgroup2::cgroup2_mount_points(&text)
}

/// A cgroup of the node's own components (kubelet, the container runtime, the pods, the
/// hub itself), by its path.
fn is_node_component(relative: &Path) -> bool {
    relative.components().any(|c| {
        let c = c.as_os_str().to_string_lossy().to_ascii_lowercase();
        [
            "kubepods",
            "kubelet",
            "containerd",
            "crio",
            "docker",
            "kube-proxy",
            "hub",
        ]
        .iter()
        .any(|k| c.contains(k))
    })
}

/// Kernel threads sit in the root cgroup too, but never connect to an apiserver: they
/// have no command line.
fn is_kernel_thread(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
}

/// What is wrong with where interception is attached, as one line each (empty: nothing).
pub fn warnings(config: &Config) -> Vec<String> {
    let path = config.intercept.cgroup();
    if !config.intercept.enabled || !cgroup2_mounts().iter().any(|m| m == path) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut others = Vec::new();
    for (dir, _) in cgroup_tree(path) {
        let relative = dir.strip_prefix(path).unwrap_or(&dir);
        if is_node_component(relative) {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        others.extend(
            procs
                .lines()
                .filter_map(|p| p.trim().parse::<u32>().ok())
                .filter(|pid| *pid != std::process::id() && !is_kernel_thread(*pid)),
        );
    }
    if !others.is_empty() {
        let mut names: Vec<String> = others
            .iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
            .map(|c| c.trim().to_string())
            .collect();
        names.sort();
        names.dedup();
        names.truncate(5);
        out.push(format!(
            "intercept.cgroupPath {} is the root of a cgroup2 hierarchy: every process on the \
             host is redirected, {} of them outside the node's components (for example {}); \
             attach to the cgroup holding kubelet and the pods instead",
            path.display(),
            others.len(),
            names.join(", ")
        ));
    }
    let loopback: Vec<&String> = config
        .intercept
        .vips
        .iter()
        .filter(|v| v.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback()))
        .collect();
    if !loopback.is_empty() {
        out.push(format!(
            "intercept.vips has loopback address(es) {} while intercept.cgroupPath is the \
             cgroup2 root: an apiserver on this host is reached through the hub by its own \
             loopback clients (its controllers, kubectl as admin), whose certificates the hub \
             does not accept",
            loopback
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_found_above_a_narrowed_cgroup_path() {
        let dir = crate::files::fresh_test_dir("scope");
        let narrowed = dir.join("system.slice/kubelet.service");
        std::fs::create_dir_all(&narrowed).unwrap();
        std::fs::create_dir_all(dir.join("kubelet-kubepods.slice")).unwrap();
        let roots = found_up_to(&narrowed, Some(&dir));
        assert!(roots.contains(&narrowed.join("kubepods.slice")));
        assert!(roots.contains(&dir.join("kubepods.slice")));
        assert!(roots.contains(&dir.join("kubelet-kubepods.slice")));
        // Outside any cgroup2 hierarchy: the path itself only.
        let alone = found_up_to(&narrowed, None);
        assert!(!alone.contains(&dir.join("kubelet-kubepods.slice")));
        assert_eq!(pod_roots(Some(&dir), &narrowed), vec![dir.clone()]);
        assert!(is_pods_root("kubelet-kubepods.slice") && is_pods_root("kubepods"));
        assert!(!is_pods_root("kubepods-burstable.slice"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn node_components_are_told_by_their_cgroup() {
        assert!(is_node_component(Path::new("kubepods.slice/pod-x")));
        assert!(is_node_component(Path::new("system.slice/kubelet.service")));
        assert!(is_node_component(Path::new(
            "system.slice/containerd.service"
        )));
        assert!(!is_node_component(Path::new("system.slice/sshd.service")));
        assert!(!is_node_component(Path::new("user.slice/user-0.slice")));
    }
}
