//! A cgroup v2 directory and every cgroup below it, with their ids (a cgroup's id is its
//! directory's inode number, as the kernel reports it for sockets and processes).
use std::path::{Path, PathBuf};

/// (directory, id) of `root` and each cgroup below it; none if `root` does not exist.
/// Read afresh on each call: cgroups come and go with pods.
pub fn cgroup_tree(root: &Path) -> Vec<(PathBuf, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&dir) else {
            continue;
        };
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
        out.push((dir, meta.ino()));
    }
    out
}
