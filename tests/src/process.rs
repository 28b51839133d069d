//! Child processes that never outlive the test: SIGTERM then SIGKILL on drop.
use std::{
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

pub struct Proc {
    child: Option<Child>,
    what: String,
}

/// Makes `cmd` move itself into the cgroup (via its cgroup.procs) before it execs.
pub fn in_cgroup(cmd: &mut Command, procs_file: &Path) {
    let path = std::ffi::CString::new(procs_file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: only async-signal-safe calls (open/write/close) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let rc = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            libc::close(fd);
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Proc {
    pub fn spawn(mut cmd: Command, what: &str) -> Self {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Proc {
            child: Some(child),
            what: what.to_string(),
        }
    }

    /// Spawns with stdout piped and waits (bounded) for a line equal to `ready`.
    pub fn spawn_until_line(mut cmd: Command, what: &str, ready: &str, timeout: Duration) -> Self {
        cmd.stdout(Stdio::piped());
        let mut p = Proc::spawn(cmd, what);
        let stdout = p.child.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let ready = ready.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == ready {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("{what} did not print {:?} within {timeout:?}", "ready"));
        p
    }

    /// Spawns with stdout piped; every line it prints lands in the returned list as it
    /// comes.
    pub fn spawn_collecting(mut cmd: Command, what: &str) -> (Self, Arc<Mutex<Vec<String>>>) {
        cmd.stdout(Stdio::piped());
        let mut p = Proc::spawn(cmd, what);
        let stdout = p.child.as_mut().unwrap().stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        (p, lines)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// SIGKILL now and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait up to `grace` for a clean exit; returns its exit code.
    pub fn terminate(&mut self, grace: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                eprintln!(
                    "{} did not exit on SIGTERM within {grace:?}; killing",
                    self.what
                );
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(3));
    }
}

/// Runs a command to completion (bounded) and returns its stdout; panics on failure.
pub fn output(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
