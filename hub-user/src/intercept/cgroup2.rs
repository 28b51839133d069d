//! Where the node's cgroup2 hierarchy is mounted, read from mountinfo: `/sys/fs/cgroup` on
//! a unified host, `/sys/fs/cgroup/unified` (or wherever cgroup2 sits) on a hybrid one,
//! whose `/sys/fs/cgroup` is a tmpfs of cgroup v1 controllers the programs cannot attach
//! to. In a container with a private cgroup namespace, the host's hierarchy mounted into
//! it (its root shown as `/..`, above the namespace) is preferred to the container's own.
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mounted directory of the filesystem, relative to the reader's namespace root.
    pub root: String,
    pub mount_point: PathBuf,
    pub fstype: String,
}

/// Every mount of `mountinfo`'s text, in mount order.
pub fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // id, parent, dev, root, mount point, options, [optional...], -, fstype, ...
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split_whitespace().skip(3);
            let root = unescape(fields.next()?);
            let mount_point = PathBuf::from(unescape(fields.next()?));
            let fstype = after.split_whitespace().next()?.to_string();
            Some(Mount {
                root,
                mount_point,
                fstype,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal.and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok()) {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup2 mount points visible now (a later mount on the same directory hides an
/// earlier one).
pub fn cgroup2_mount_points(mountinfo: &str) -> Vec<PathBuf> {
    visible(&mounts(mountinfo))
        .into_iter()
        .filter(|m| m.fstype == "cgroup2")
        .map(|m| m.mount_point.clone())
        .collect()
}

fn visible(all: &[Mount]) -> Vec<&Mount> {
    all.iter()
        .enumerate()
        .filter(|(i, m)| !all[i + 1..].iter().any(|l| l.mount_point == m.mount_point))
        .map(|(_, m)| m)
        .collect()
}

/// How high in the hierarchy a mount's root is: `/` is the namespace's top (0), each
/// leading `..` one above it, each named directory one below.
fn height(root: &str) -> i32 {
    root.split('/')
        .filter(|c| !c.is_empty())
        .map(|c| if c == ".." { 1 } else { -1 })
        .sum()
}

/// The hierarchy found and why it was chosen, for `hub run --check` and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub why: String,
}

/// The cgroup2 hierarchy to attach to, from mountinfo's text.
pub fn find(mountinfo: &str) -> Result<Found, String> {
    let all = mounts(mountinfo);
    let shown = visible(&all);
    let best = shown
        .iter()
        .filter(|m| m.fstype == "cgroup2")
        .max_by_key(|m| {
            // Highest root first; then the usual places; then the shortest path.
            let usual = match m.mount_point.to_str() {
                Some("/sys/fs/cgroup") => 2,
                Some("/sys/fs/cgroup/unified") => 1,
                _ => 0,
            };
            let depth = m.mount_point.components().count() as i32;
            (height(&m.root), usual, -depth)
        });
    let Some(best) = best else {
        let v1 = shown.iter().any(|m| m.fstype == "cgroup");
        return Err(if v1 {
            "no cgroup2 mount: this node has cgroup v1 only, and the programs attach to \
             cgroup2; mount it (mount -t cgroup2 none /sys/fs/cgroup/unified) or set \
             intercept.enabled: false"
                .into()
        } else {
            "no cgroup2 mount found in mountinfo; set intercept.cgroupPath, or \
             intercept.enabled: false"
                .into()
        });
    };
    let at = |p: &str| shown.iter().find(|m| m.mount_point == Path::new(p));
    let mut why = format!("the cgroup2 mount at {}", best.mount_point.display());
    if let Some(sys) = at("/sys/fs/cgroup").filter(|m| m.fstype != "cgroup2") {
        why.push_str(&format!(
            "; /sys/fs/cgroup is {} (cgroup v1 controllers): a hybrid host",
            sys.fstype
        ));
    } else if best.mount_point == Path::new("/sys/fs/cgroup") {
        why.push_str(": a unified (cgroup v2) host");
    }
    if height(&best.root) > 0 {
        why.push_str(&format!(
            "; its root {} lies above this process's cgroup namespace: the host's hierarchy",
            best.root
        ));
    } else if height(&best.root) < 0 {
        why.push_str(&format!(
            "; it shows only {} of the hierarchy: processes outside it are not redirected",
            best.root
        ));
    }
    Ok(Found {
        path: best.mount_point.clone(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
";

    #[test]
    fn a_hybrid_host_attaches_to_its_unified_mount_never_the_v1_tmpfs() {
        let f = find(HYBRID).unwrap();
        assert_eq!(f.path, Path::new("/sys/fs/cgroup/unified"));
        assert!(f.why.contains("hybrid"), "{}", f.why);
    }

    #[test]
    fn a_unified_host_attaches_to_sys_fs_cgroup() {
        let f = find("25 20 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n").unwrap();
        assert_eq!(f.path, Path::new("/sys/fs/cgroup"));
        assert!(f.why.contains("unified"), "{}", f.why);
    }

    #[test]
    fn in_a_private_cgroup_namespace_the_host_s_hierarchy_wins() {
        // The runtime's own cgroup2 mount for the container (its namespace's root), then
        // the host's /sys/fs/cgroup mounted over it by the DaemonSet's hostPath.
        let text = "\
600 500 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup ro
601 500 0:30 /../../.. /host/sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        let f = find(text).unwrap();
        assert_eq!(f.path, Path::new("/host/sys/fs/cgroup"));
        assert!(f.why.contains("above"), "{}", f.why);
        // Mounted over the runtime's own at the same place: the later one is what is seen.
        let over = "\
600 500 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup ro
601 600 0:30 /../../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert!(find(over).unwrap().why.contains("above"));
    }

    #[test]
    fn cgroup_v1_only_is_a_clear_error() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
33 31 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
";
        assert!(find(text).unwrap_err().contains("cgroup v1 only"));
        assert!(find("").is_err());
    }

    #[test]
    fn mount_points_are_unescaped_and_hidden_mounts_ignored() {
        let text = "\
1 0 0:1 / /a\\040b rw - cgroup2 cgroup2 rw
2 0 0:2 / /a\\040b rw - tmpfs tmpfs rw
3 0 0:3 / /c rw - cgroup2 cgroup2 rw
";
        assert_eq!(cgroup2_mount_points(text), vec![PathBuf::from("/c")]);
        assert_eq!(mounts(text)[0].mount_point, Path::new("/a b"));
    }
}
