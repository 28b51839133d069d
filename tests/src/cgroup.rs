//! A cgroup v2 directory created for one test and removed with everything in it.
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The cgroup v2 mount point (`/sys/fs/cgroup/unified` on hybrid hosts, else `/sys/fs/cgroup`).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
}

pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn new(tag: &str) -> Self {
        let root = cgroup2_root().expect("cgroup v2 mount");
        let path = root.join(crate::unique(tag));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup id the kernel reports (bpf_get_current_cgroup_id): the directory's inode.
    pub fn id(&self) -> u64 {
        std::fs::metadata(&self.path).expect("cgroup dir").ino()
    }

    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Only this test's processes can be in a cgroup this test created.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                // SAFETY: plain kill(2) of a pid inside our own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!(
                "warning: could not remove cgroup {}: {e}",
                self.path.display()
            );
        }
    }
}
