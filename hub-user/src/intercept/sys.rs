//! The few raw kernel calls aya does not wrap: filesystem magic checks and detaching a
//! bpf_link by id (for `hub uninstall` when a hub is still running).
use std::{ffi::CString, io, os::unix::ffi::OsStrExt, path::Path};

pub const BPF_FS_MAGIC: i64 = 0xcafe4a11;
pub const CGROUP2_SUPER_MAGIC: i64 = 0x63677270;

/// The filesystem magic of `path` (statfs f_type).
pub fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statfs writes into a zeroed struct we own.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.f_type as i64)
    }
}

const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;

/// Detaches the bpf_link with this id, whoever holds it. The link object lives on until
/// its holder closes it, but the program no longer runs for the cgroup.
pub fn detach_link(id: u32) -> io::Result<()> {
    // bpf_attr is a union; link_id / link_detach.link_fd are its first u32.
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&id.to_ne_bytes());
    // SAFETY: bpf(2) with an attr buffer larger than the kernel reads for these commands.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_GET_FD_BY_ID,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    // SAFETY: as above.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_DETACH,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: fd was returned by the kernel above and is closed once.
    unsafe { libc::close(fd as i32) };
    if rc < 0 { Err(err) } else { Ok(()) }
}
