//! Files written whole: a reader (or a running copy of the hub) sees the old file or the
//! new one, never a mix, and after a power loss one of the two.
use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

/// Writes `bytes` to `path` through a temporary file beside it, created with `mode` (so a
/// private file is never readable by others, even for a moment), synced, then renamed
/// over `path`. The directory is created if needed.
pub fn write_whole(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let staged = path.with_extension("writing");
    let _ = std::fs::remove_file(&staged);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(mode)
        .open(&staged)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&staged, path)
}

/// A fresh, empty directory under the system's temporary directory, for a test.
#[cfg(test)]
pub fn fresh_test_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a test directory");
    dir
}
