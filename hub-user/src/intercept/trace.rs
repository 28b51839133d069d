//! `hub trace`: every connect to a VIP as the connect hook saw it, streamed live.
//!
//! The programs write to the trace ring buffer only while someone listens
//! (`Settings::trace`), so an untraced node pays one branch per VIP connect. The daemon is
//! the buffer's only reader and fans each event out to every listener, with the cgroup's
//! path and the pod it belongs to, and with the programs' own log messages for those who
//! asked for them.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use hub_ebpf::{TraceEvent, VERDICT_BYPASSED, VERDICT_ERROR, VERDICT_REDIRECTED};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::{cgroup_tree::cgroup_tree, origin::socket_addr};

/// One line of `hub trace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum TraceLine {
    /// A connect to a VIP.
    #[serde(rename_all = "camelCase")]
    Connect {
        /// RFC 3339, microseconds, UTC.
        time: String,
        pid: u32,
        comm: String,
        cgroup_id: u64,
        /// The cgroup's directory, when it still exists.
        cgroup: Option<String>,
        /// The pod's UID, when the cgroup is a pod's (kubelet's naming).
        pod: Option<String>,
        original_dst: String,
        /// Where the connect was sent; none when it was left alone.
        redirected_to: Option<String>,
        /// `redirected`, `bypassed` (the hub's own socket) or `error` (redirected without
        /// its origin recorded).
        verdict: String,
    },
    /// A message of the eBPF programs (aya-log), for `hub trace --logs`.
    Log {
        time: String,
        level: String,
        message: String,
    },
    /// This listener fell behind and missed `count` lines.
    Lost { count: u64 },
}

/// Sets or clears `Settings::trace` in the programs' settings map.
pub type TraceSwitch = Box<dyn Fn(bool) + Send + Sync>;

/// The fan-out of trace lines to listeners.
pub struct Tracer {
    lines: broadcast::Sender<Arc<TraceLine>>,
    listeners: Mutex<usize>,
    switch: TraceSwitch,
    cgroups: Mutex<CgroupNames>,
}

/// Lines a listener may lag behind before it is told how many it lost.
const BACKLOG: usize = 4096;

impl Tracer {
    /// `cgroup_root` is the directory the programs are attached to: every traced connect
    /// comes from it or a cgroup below it.
    pub fn new(cgroup_root: &Path, switch: TraceSwitch) -> Tracer {
        Tracer {
            lines: broadcast::channel(BACKLOG).0,
            listeners: Mutex::new(0),
            switch,
            cgroups: Mutex::new(CgroupNames::new(cgroup_root)),
        }
    }

    /// Starts listening; the programs trace while at least one subscription is alive.
    pub fn subscribe(self: &Arc<Self>) -> Subscription {
        let lines = self.lines.subscribe();
        let mut n = self.listeners.lock().unwrap();
        *n += 1;
        if *n == 1 {
            (self.switch)(true);
        }
        Subscription {
            lines,
            tracer: self.clone(),
        }
    }

    fn unsubscribe(&self) {
        let mut n = self.listeners.lock().unwrap();
        *n -= 1;
        if *n == 0 {
            (self.switch)(false);
        }
    }

    fn has_listeners(&self) -> bool {
        *self.listeners.lock().unwrap() > 0
    }

    /// Decodes one ring buffer record and passes it on.
    fn publish_event(&self, record: &[u8], clock: &WallClock) {
        if record.len() < std::mem::size_of::<TraceEvent>() {
            return;
        }
        // SAFETY: TraceEvent is plain old data of exactly this many bytes; the ring buffer
        // gives no alignment guarantee beyond 8, hence the unaligned read.
        let e: TraceEvent = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
        let cgroup = self.cgroups.lock().unwrap().path_of(e.cgroup_id);
        let line = TraceLine::Connect {
            time: clock.rfc3339(e.time_ns),
            pid: e.pid,
            comm: comm(&e.comm),
            cgroup_id: e.cgroup_id,
            pod: cgroup.as_deref().and_then(pod_uid),
            cgroup: cgroup.map(|p| p.display().to_string()),
            original_dst: socket_addr(&e.original_dst).to_string(),
            redirected_to: (e.verdict != VERDICT_BYPASSED)
                .then(|| socket_addr(&e.redirected_to).to_string()),
            verdict: match e.verdict {
                VERDICT_REDIRECTED => "redirected",
                VERDICT_BYPASSED => "bypassed",
                VERDICT_ERROR => "error",
                _ => "unknown",
            }
            .to_string(),
        };
        let _ = self.lines.send(Arc::new(line));
    }

    /// Passes on one message of the programs' log.
    pub fn publish_log(&self, level: log::Level, message: String) {
        if !self.has_listeners() {
            return;
        }
        let line = TraceLine::Log {
            time: WallClock::now().rfc3339(WallClock::monotonic_ns()),
            level: level.as_str().to_ascii_lowercase(),
            message,
        };
        let _ = self.lines.send(Arc::new(line));
    }
}

/// One listener's lines; dropping it stops tracing when it was the last.
pub struct Subscription {
    lines: broadcast::Receiver<Arc<TraceLine>>,
    tracer: Arc<Tracer>,
}

impl Subscription {
    /// The next line; `Lost` when this listener fell behind.
    pub async fn next(&mut self) -> Option<Arc<TraceLine>> {
        match self.lines.recv().await {
            Ok(line) => Some(line),
            Err(broadcast::error::RecvError::Lagged(count)) => {
                Some(Arc::new(TraceLine::Lost { count }))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.tracer.unsubscribe();
    }
}

/// Reads the trace ring buffer until the task is aborted (the interception is dropped).
pub fn spawn_reader(
    ring: RingBuf<MapData>,
    tracer: Arc<Tracer>,
) -> Option<tokio::task::JoinHandle<()>> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    Some(handle.spawn(async move {
        // SAFETY: the fd belongs to `ring`, which the AsyncFd owns for as long as it is
        // registered.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
        };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!("hub trace unavailable: cannot poll the trace ring buffer: {e}");
                return;
            }
        };
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                return;
            };
            let clock = WallClock::now();
            let ring = guard.get_inner_mut();
            while let Some(record) = ring.next() {
                tracer.publish_event(&record, &clock);
            }
            guard.clear_ready();
        }
    }))
}

/// The command name as the kernel keeps it (up to 15 bytes, NUL-padded).
fn comm(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// The pod UID in a cgroup path as kubelet names it: `kubepods-besteffort-pod<uid>.slice`
/// (systemd driver, `_` for `-`) or `pod<uid>` (cgroupfs driver).
pub fn pod_uid(path: &Path) -> Option<String> {
    path.components().rev().find_map(|c| {
        let name = c.as_os_str().to_str()?;
        let name = name.strip_suffix(".slice").unwrap_or(name);
        let at = name.rfind("pod")?;
        if at > 0 && !name[..at].ends_with('-') {
            return None;
        }
        let uid = name[at + 3..].replace('_', "-");
        let looks_like_uid = uid.len() == 36
            && uid.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-')
            && uid.matches('-').count() == 4;
        looks_like_uid.then_some(uid)
    })
}

/// cgroup id -> directory, re-read when an unknown id shows up (pods come and go).
struct CgroupNames {
    root: PathBuf,
    known: HashMap<u64, PathBuf>,
    walked: Option<Instant>,
}

/// An unknown id re-reads the tree at most this often (a cgroup gone since the connect
/// would otherwise cost a walk per line).
const REWALK_AFTER: Duration = Duration::from_millis(100);

impl CgroupNames {
    fn new(root: &Path) -> CgroupNames {
        CgroupNames {
            root: root.to_path_buf(),
            known: HashMap::new(),
            walked: None,
        }
    }

    fn path_of(&mut self, id: u64) -> Option<PathBuf> {
        if let Some(p) = self.known.get(&id) {
            return Some(p.clone());
        }
        if self.walked.is_some_and(|at| at.elapsed() < REWALK_AFTER) {
            return None;
        }
        self.known = cgroup_tree(&self.root)
            .into_iter()
            .map(|(path, id)| (id, path))
            .collect();
        self.walked = Some(Instant::now());
        self.known.get(&id).cloned()
    }
}

/// Turns the programs' CLOCK_MONOTONIC stamps into wall-clock time.
pub struct WallClock {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, in nanoseconds.
    offset_ns: i128,
}

impl WallClock {
    pub fn now() -> WallClock {
        let real = clock_ns(libc::CLOCK_REALTIME);
        WallClock {
            offset_ns: real - Self::monotonic_ns() as i128,
        }
    }

    pub fn monotonic_ns() -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC) as u64
    }

    pub fn rfc3339(&self, monotonic_ns: u64) -> String {
        let unix_ns = monotonic_ns as i128 + self.offset_ns;
        let micros = unix_ns.div_euclid(1000);
        let secs = micros.div_euclid(1_000_000) as i64;
        format!(
            "{}.{:06}Z",
            crate::x509::unix_to_rfc3339(secs).trim_end_matches('Z'),
            micros.rem_euclid(1_000_000)
        )
    }
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Forwards the programs' aya-log messages to the daemon's log and to `hub trace --logs`.
pub struct LogTee(pub Arc<Tracer>);

impl log::Log for LogTee {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        log::logger().log(record);
        self.0
            .publish_log(record.level(), record.args().to_string());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_from_both_cgroup_drivers() {
        let uid = "0f4c1b4e-7d0e-4c5a-9d55-2b1a8a3e9f10";
        let systemd = format!(
            "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-abc.scope",
            uid.replace('-', "_")
        );
        assert_eq!(pod_uid(Path::new(&systemd)).as_deref(), Some(uid));
        let cgroupfs = format!("/sys/fs/cgroup/kubepods/burstable/pod{uid}/0123abcd");
        assert_eq!(pod_uid(Path::new(&cgroupfs)).as_deref(), Some(uid));
        let guaranteed = format!(
            "/sys/fs/cgroup/kubepods.slice/kubepods-pod{}.slice",
            uid.replace('-', "_")
        );
        assert_eq!(pod_uid(Path::new(&guaranteed)).as_deref(), Some(uid));
        for not_a_pod in [
            "/sys/fs/cgroup/system.slice/kubelet.service",
            "/sys/fs/cgroup/kubepods.slice",
            "/sys/fs/cgroup/ipod12345",
            "/sys/fs/cgroup/pod-not-a-uid",
        ] {
            assert_eq!(pod_uid(Path::new(not_a_pod)), None, "{not_a_pod}");
        }
    }

    #[test]
    fn comm_stops_at_the_first_nul() {
        let mut raw = [0u8; 16];
        raw[..4].copy_from_slice(b"curl");
        assert_eq!(comm(&raw), "curl");
        assert_eq!(comm(b"0123456789abcdef"), "0123456789abcdef");
    }

    #[test]
    fn monotonic_stamps_become_wall_clock_time() {
        let clock = WallClock {
            offset_ns: 1_796_300_000_000_000_000,
        };
        // 1_796_300_000 s = 2026-12-03T...; plus 1.5 s of monotonic time.
        let t = clock.rfc3339(1_500_000_123);
        assert_eq!(
            t,
            format!(
                "{}.500000Z",
                crate::x509::unix_to_rfc3339(1_796_300_001).trim_end_matches('Z')
            )
        );
        assert_eq!(crate::x509::unix_to_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            crate::x509::unix_to_rfc3339(1_796_300_001),
            "2026-12-03T12:13:21Z"
        );
    }

    /// The programs' aya-log records reach `hub trace --logs` listeners as log lines.
    #[tokio::test]
    async fn program_logs_reach_listeners() {
        use log::Log;
        let tracer = Arc::new(Tracer::new(Path::new("/nonexistent"), Box::new(|_| {})));
        let mut lines = tracer.subscribe();
        let tee = LogTee(tracer.clone());
        tee.log(
            &log::Record::builder()
                .level(log::Level::Warn)
                .args(format_args!("hub: pending-origin map update failed"))
                .build(),
        );
        let line = lines.next().await.unwrap();
        let TraceLine::Log {
            level,
            message,
            time,
        } = &*line
        else {
            panic!("{line:?}");
        };
        assert_eq!(
            (level.as_str(), message.as_str()),
            ("warn", "hub: pending-origin map update failed")
        );
        assert!(time.ends_with('Z'), "{time}");
    }

    #[test]
    fn listeners_switch_tracing_on_and_off() {
        let switched = Arc::new(Mutex::new(Vec::new()));
        let log = switched.clone();
        let tracer = Arc::new(Tracer::new(
            Path::new("/nonexistent"),
            Box::new(move |on| log.lock().unwrap().push(on)),
        ));
        let a = tracer.subscribe();
        let b = tracer.subscribe();
        drop(a);
        assert_eq!(*switched.lock().unwrap(), vec![true]);
        drop(b);
        assert_eq!(*switched.lock().unwrap(), vec![true, false]);
    }
}
