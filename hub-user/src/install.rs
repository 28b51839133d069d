//! `hub install`: put a copy of the hub on the host, for boots with no cloud.
//!
//! After a reboot with the cloud unreachable the kubelet cannot learn its pods, so it
//! never starts the DaemonSet's hub. The DaemonSet's init container therefore installs the
//! hub as a systemd unit: the binary and its configuration go into the state directory
//! (a hostPath both copies share) and the unit into the host's systemd directory, enabled
//! for boot and ordered before the kubelet. It runs `hub run --host-instance`, which serves
//! only while no DaemonSet hub claims the node (see `owner`). A systemd unit rather than a
//! static pod: it needs neither the kubelet nor the container runtime nor a cached image
//! to start, and works whatever the kubelet's staticPodPath is.
use std::path::{Path, PathBuf};

use crate::config::Config;

/// The unit's name under the systemd directory.
pub const UNIT: &str = "hub.service";

/// Where an installation goes.
pub struct Target {
    /// The state directory (cache.dir), the same path on the host and in the pod.
    pub state_dir: PathBuf,
    /// The host's systemd unit directory, as this process sees it (an init container
    /// mounts the host's /etc/systemd/system somewhere of its own).
    pub unit_dir: PathBuf,
}

impl Target {
    pub fn binary(&self) -> PathBuf {
        self.state_dir.join("bin/hub")
    }

    pub fn config(&self) -> PathBuf {
        self.state_dir.join("hub.yaml")
    }

    fn unit(&self) -> PathBuf {
        self.unit_dir.join(UNIT)
    }

    fn enabled_link(&self) -> PathBuf {
        self.unit_dir.join("multi-user.target.wants").join(UNIT)
    }
}

/// The unit text: started at boot before the kubelet, restarted whenever it exits.
pub fn unit_text(target: &Target) -> String {
    format!(
        "# Installed by `hub install` (the hub DaemonSet's init container); removed by
# `hub install --uninstall`. Serves the node only while the DaemonSet's hub does not.
[Unit]
Description=hub: the node's apiserver proxy and cache (host copy, for boots with no cloud)
After=network.target
Before=kubelet.service

[Service]
ExecStart={} run --config {} --host-instance
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
",
        target.binary().display(),
        target.config().display()
    )
}

/// Installs this binary, `config` (with `node_name` and `extra_vips` written into it) into
/// the config's state directory (cache.dir) and the unit into `unit_dir`. Safe to run
/// again: every file is replaced whole, and nothing is replaced unless the configuration
/// to install is valid.
pub fn install(
    config: &Path,
    node_name: Option<&str>,
    extra_vips: &[std::net::SocketAddr],
    unit_dir: &Path,
) -> Result<String, String> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("cannot read {}: {e}", config.display()))?;
    let mut yaml: serde_yaml::Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("{} is not YAML: {e}", config.display()))?;
    let root = yaml
        .as_mapping_mut()
        .ok_or_else(|| format!("{} is not a YAML mapping", config.display()))?;
    if let Some(name) = node_name {
        root.insert("nodeName".into(), name.into());
    }
    // The host copy has no pod environment: the Service VIP the pod learns from
    // KUBERNETES_SERVICE_HOST is written down for it.
    if !extra_vips.is_empty() {
        let intercept = root
            .entry("intercept".into())
            .or_insert_with(|| serde_yaml::Mapping::new().into());
        let vips = intercept
            .as_mapping_mut()
            .ok_or("intercept is not a mapping")?
            .entry("vips".into())
            .or_insert_with(|| serde_yaml::Value::Sequence(Vec::new()));
        let list = vips
            .as_sequence_mut()
            .ok_or("intercept.vips is not a list")?;
        for vip in extra_vips {
            let v = serde_yaml::Value::from(vip.to_string());
            if !list.contains(&v) {
                list.push(v);
            }
        }
    }
    let installed = serde_yaml::to_string(&yaml).map_err(|e| e.to_string())?;
    // Checked as `hub run` will read it, before anything is replaced.
    let checked = Config::parse(&installed)
        .and_then(|c| c.validate().map(|()| c))
        .map_err(|e| format!("the configuration to install is not valid: {e}"))?;
    let target = Target {
        state_dir: checked.cache.dir.clone(),
        unit_dir: unit_dir.to_path_buf(),
    };

    let exe =
        std::fs::read("/proc/self/exe").map_err(|e| format!("cannot read this binary: {e}"))?;
    write_file(&target.binary(), &exe, 0o755)?;
    write_file(&target.config(), installed.as_bytes(), 0o600)?;
    write_file(&target.unit(), unit_text(&target).as_bytes(), 0o644)?;
    enable(&target)?;
    Ok(format!(
        "installed {} and {} for node {}; {} enabled for boot (before kubelet.service)",
        target.binary().display(),
        target.config().display(),
        checked.node_name,
        target.unit().display()
    ))
}

/// Why the host's init system cannot start the unit, or None when systemd booted the host
/// (as sd_booted(3) decides: `<host_run>/systemd/system` is a directory).
pub fn not_booted_by_systemd(host_run: &Path) -> Option<String> {
    let booted = host_run.join("systemd/system");
    (!booted.is_dir()).then(|| {
        format!(
            "systemd did not boot this node ({} is not there)",
            booted.display()
        )
    })
}

/// What an install that put nothing on the host says, and what that means for the node.
pub fn not_installed(why: &str) -> String {
    format!(
        "host copy not installed: {why}. This node relies on the DaemonSet alone: after a \
         reboot while the cloud is unreachable the kubelet cannot learn its pods, so \
         neither the hub nor the node's pods start until the cloud is back (see the \
         README's node layouts)"
    )
}

/// Enables the unit the way `systemctl enable` does: a link from the target's wants.
fn enable(target: &Target) -> Result<(), String> {
    let link = target.enabled_link();
    let dir = link.parent().expect("the link has a directory");
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("../{UNIT}"), &link)
        .map_err(|e| format!("cannot enable {}: {e}", link.display()))
}

/// Removes what `install` put there; the cache stays. Safe to run twice.
pub fn uninstall(target: &Target) -> Result<String, String> {
    let mut removed = Vec::new();
    for path in [
        target.enabled_link(),
        target.unit(),
        target.binary(),
        target.config(),
    ] {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
        }
    }
    let _ = std::fs::remove_dir(target.state_dir.join("bin"));
    if removed.is_empty() {
        return Ok("nothing installed".into());
    }
    Ok(format!(
        "removed {}; a host copy still running stops with `systemctl stop {UNIT}` (the cache in {} is kept)",
        removed.join(", "),
        target.state_dir.display()
    ))
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    crate::files::write_whole(path, bytes, mode)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state directory and a systemd directory under a fresh `root`.
    fn target_in(root: &Path) -> Target {
        Target {
            state_dir: root.join("state"),
            unit_dir: root.join("systemd"),
        }
    }

    #[test]
    fn installs_a_runnable_copy_and_removes_it_again() {
        let root = crate::files::fresh_test_dir("install-round");
        let target = target_in(&root);
        let config = root.join("given.yaml");
        std::fs::write(
            &config,
            format!(
                "nodeName: placeholder\ncloud:\n  servers: [\"https://127.0.0.1:6443\"]\nintercept:\n  vips: [\"127.0.10.1:443\"]\ncache:\n  dir: {}\n",
                target.state_dir.display()
            ),
        )
        .unwrap();
        let vip = "127.0.10.2:443".parse().unwrap();
        let said = install(&config, Some("edge-7"), &[vip], &target.unit_dir).unwrap();
        assert!(said.contains("edge-7"), "{said}");

        let installed = Config::load(&target.config()).unwrap();
        assert_eq!(installed.node_name, "edge-7");
        assert_eq!(
            installed.intercept.vips,
            ["127.0.10.1:443", "127.0.10.2:443"]
        );
        assert_eq!(
            std::fs::read(target.binary()).unwrap(),
            std::fs::read("/proc/self/exe").unwrap()
        );
        let unit = std::fs::read_to_string(target.unit()).unwrap();
        assert!(unit.contains(&format!(
            "ExecStart={} run --config {} --host-instance",
            target.binary().display(),
            target.config().display()
        )));
        assert!(unit.contains("Before=kubelet.service"));
        let link = std::fs::read_link(target.enabled_link()).unwrap();
        assert_eq!(link, Path::new("../hub.service"));

        // Again: nothing doubles up.
        install(&config, Some("edge-7"), &[vip], &target.unit_dir).unwrap();
        assert_eq!(
            Config::load(&target.config()).unwrap().intercept.vips.len(),
            2
        );

        let said = uninstall(&target).unwrap();
        assert!(said.contains("hub.service"), "{said}");
        for gone in [
            target.unit(),
            target.binary(),
            target.config(),
            target.enabled_link(),
        ] {
            assert!(
                !gone.exists() && gone.symlink_metadata().is_err(),
                "{}",
                gone.display()
            );
        }
        assert_eq!(uninstall(&target).unwrap(), "nothing installed");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn refuses_a_config_that_would_not_run_and_leaves_the_old_one() {
        let root = crate::files::fresh_test_dir("install-bad");
        let target = target_in(&root);
        std::fs::create_dir_all(&target.state_dir).unwrap();
        std::fs::write(target.config(), "old").unwrap();
        let config = root.join("given.yaml");
        std::fs::write(
            &config,
            format!(
                "nodeName: a\ncloud:\n  servers: []\n  bogus: 1\ncache:\n  dir: {}\n",
                target.state_dir.display()
            ),
        )
        .unwrap();
        let e = install(&config, None, &[], &target.unit_dir).unwrap_err();
        assert!(e.contains("not valid"), "{e}");
        assert_eq!(std::fs::read_to_string(target.config()).unwrap(), "old");
        assert!(!target.unit().exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
