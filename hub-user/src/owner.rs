//! One hub per node at a time.
//!
//! A node can run two copies of the hub: the DaemonSet's pod, and the copy `hub install`
//! put on the host, which systemd starts at boot before the kubelet so a node that reboots
//! with no cloud still has its hub. Only one may hold the interception and the cache.
//! Two locks in the state directory (flock: released by the kernel when a holder dies,
//! and shared between the host and the pod through the same hostPath):
//!
//! * `owner.lock` — held by the hub that serves.
//! * `claim.lock` — held by a DaemonSet hub for its whole life: "the pod wants the node".
//!
//! The DaemonSet hub takes the claim, then waits for the owner lock. The host copy serves
//! only while no one claims: when a claim appears it shuts down cleanly (detaching, so
//! connects go straight to the cloud for the moment between), lets go of the owner lock,
//! and stands by until the claim is gone again — the pod stopped — to take the node back.
use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    time::Duration,
};

/// Which copy this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instance {
    /// The DaemonSet's pod (or any hub run by hand): takes the node when it starts.
    Pod,
    /// The copy installed on the host: serves only while no pod claims the node.
    Host,
}

/// How often the host copy looks at the claim.
pub const CLAIM_POLL: Duration = Duration::from_millis(250);

/// The node, held: dropping it (or exiting) lets go.
pub struct Ownership {
    _owner: File,
    _claim: Option<File>,
}

fn lock_file(dir: &Path, name: &str) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(name))
}

/// flock(2); `Ok(false)` when `wait` is false and someone else holds it.
fn flock(file: &File, how: libc::c_int, wait: bool) -> std::io::Result<bool> {
    let flags = if wait { how } else { how | libc::LOCK_NB };
    loop {
        // SAFETY: flock on a descriptor this File owns.
        if unsafe { libc::flock(file.as_raw_fd(), flags) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot use the lock {path}: {source}")]
pub struct OwnerError {
    path: PathBuf,
    source: std::io::Error,
}

fn err(dir: &Path, name: &str) -> impl FnOnce(std::io::Error) -> OwnerError {
    let path = dir.join(name);
    move |source| OwnerError { path, source }
}

/// Waits (blocking) until this copy may serve the node whose state lives in `dir`.
/// `waiting` is told once, with what it waits for, if it has to wait. None: the host copy's
/// binary was replaced (an upgrade) while it stood by; it should exit so systemd starts the
/// new one.
pub fn acquire(
    dir: &Path,
    instance: Instance,
    waiting: impl Fn(&str),
) -> Result<Option<Ownership>, OwnerError> {
    let owner = lock_file(dir, "owner.lock").map_err(err(dir, "owner.lock"))?;
    match instance {
        Instance::Pod => {
            let claim = lock_file(dir, "claim.lock").map_err(err(dir, "claim.lock"))?;
            if !flock(&claim, libc::LOCK_EX, false).map_err(err(dir, "claim.lock"))? {
                waiting("another DaemonSet hub to stop");
                flock(&claim, libc::LOCK_EX, true).map_err(err(dir, "claim.lock"))?;
            }
            if !flock(&owner, libc::LOCK_EX, false).map_err(err(dir, "owner.lock"))? {
                waiting("the host's hub to hand the node over");
                flock(&owner, libc::LOCK_EX, true).map_err(err(dir, "owner.lock"))?;
            }
            Ok(Some(Ownership {
                _owner: owner,
                _claim: Some(claim),
            }))
        }
        Instance::Host => {
            let claim = lock_file(dir, "claim.lock").map_err(err(dir, "claim.lock"))?;
            let mut told = false;
            loop {
                if !claim_held(&claim).map_err(err(dir, "claim.lock"))?
                    && flock(&owner, libc::LOCK_EX, false).map_err(err(dir, "owner.lock"))?
                {
                    return Ok(Some(Ownership {
                        _owner: owner,
                        _claim: None,
                    }));
                }
                if own_binary_replaced() {
                    return Ok(None);
                }
                if !told {
                    waiting("the DaemonSet's hub to stop (standing by)");
                    told = true;
                }
                std::thread::sleep(CLAIM_POLL);
            }
        }
    }
}

/// Whether the file this process runs from was replaced or removed since it started
/// (`hub install` renames a new binary over the old one).
fn own_binary_replaced() -> bool {
    std::fs::read_link("/proc/self/exe").is_ok_and(|p| p.to_string_lossy().ends_with(" (deleted)"))
}

/// Whether someone holds `claim` (the open claim.lock) exclusively: a shared lock is
/// granted only while no one does, and is let go again at once.
fn claim_held(claim: &File) -> std::io::Result<bool> {
    if flock(claim, libc::LOCK_SH, false)? {
        flock(claim, libc::LOCK_UN, true)?;
        return Ok(false);
    }
    Ok(true)
}

/// Resolves once a DaemonSet hub claims the node (for the host copy, to hand over). The
/// lock file is opened once and polled.
pub async fn until_claimed(dir: PathBuf) {
    let claim = match lock_file(&dir, "claim.lock") {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("{}: cannot watch for a DaemonSet hub: {e}", dir.display());
            return std::future::pending().await;
        }
    };
    loop {
        match claim_held(&claim) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::warn!("{}/claim.lock: {e}", dir.display()),
        }
        tokio::time::sleep(CLAIM_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a DaemonSet hub holds (or is taking) the claim on the node.
    fn claimed(dir: &Path) -> bool {
        claim_held(&lock_file(dir, "claim.lock").unwrap()).unwrap()
    }

    #[test]
    fn a_pod_claims_and_the_host_stands_by_until_it_is_gone() {
        let dir = crate::files::fresh_test_dir("owner-claim");
        let host = acquire(&dir, Instance::Host, |_| panic!("nothing to wait for"))
            .unwrap()
            .unwrap();
        assert!(!claimed(&dir));

        // The pod claims at once and waits for the host to let go.
        let d = dir.clone();
        let pod = std::thread::spawn(move || acquire(&d, Instance::Pod, |_| {}).unwrap().unwrap());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !claimed(&dir) {
            assert!(
                std::time::Instant::now() < deadline,
                "the pod never claimed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(host);
        let pod = pod.join().unwrap();

        // The host waits while the pod holds the node, and takes it back when it goes.
        let d = dir.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let host = std::thread::spawn(move || {
            acquire(&d, Instance::Host, |what| {
                tx.send(what.to_string()).unwrap()
            })
            .unwrap()
            .unwrap()
        });
        let told = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(told.contains("standing by"), "{told}");
        assert!(!host.is_finished());
        drop(pod);
        let _host = host.join().unwrap();
        assert!(!claimed(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
