//! Support for hub's integration tests: privileged-test gating, network namespaces,
//! cgroups, child processes that are always cleaned up, and a running hub.
pub mod apiserver;
pub mod cgroup;
pub mod cloud;
pub mod cni;
pub mod containerd;
pub mod etcd;
pub mod fuzz;
pub mod h2;
pub mod hub;
pub mod informer;
pub mod kubelet_trace;
pub mod manifests;
pub mod netns;
pub mod node_root;
pub mod pool_net;
pub mod ports;
pub mod privileged;
pub mod probe;
pub mod process;
pub mod recorded;
pub mod scenario;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// A name unique to this test process and call, short enough for interface names.
pub fn unique(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ht{}{}{n}", tag, std::process::id() % 100_000)
}

/// The directory holding the built binaries (`hub`, `hub-probe`) of this profile.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // Tests run from target/<profile>/deps/, xtask from target/<profile>/.
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("target dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The `hub` binary under test. Built by `cargo xtask test` (or `cargo build -p hub-user`).
pub fn hub_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HUB_BIN") {
        return p.into();
    }
    let p = bin_dir().join("hub");
    assert!(
        p.exists(),
        "{} missing: run `cargo build -p hub-user` first (cargo xtask test does)",
        p.display()
    );
    p
}

/// The `hub-probe` helper (HUB_PROBE_BIN overrides, e.g. for release-build benchmarks).
pub fn probe_bin() -> PathBuf {
    std::env::var_os("HUB_PROBE_BIN").map_or_else(|| bin_dir().join("hub-probe"), PathBuf::from)
}

/// Runs kubectl with `KUBECONFIG=kubeconfig` and no stdin: (success, stdout, stderr).
pub fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `cmd` with `input` on its stdin and returns its output (stdout and stderr
/// captured). The input is written from a thread, so an output larger than a pipe holds
/// never stalls the write.
pub fn output_with_stdin(cmd: &mut std::process::Command, input: &[u8]) -> std::process::Output {
    use std::{io::Write, process::Stdio};
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("the command's output");
    writer
        .join()
        .expect("the stdin writer")
        .expect("writing stdin");
    out
}

/// kubectl that must succeed; its stdout.
pub fn kubectl_ok(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let (ok, out, err) = kubectl(kubeconfig, args);
    assert!(ok, "kubectl {}: {err}", args.join(" "));
    out
}

/// Polls `check` until it returns Some or the deadline passes (then panics naming `what`).
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `namespace/name` of every item of a list answer's JSON, in its order.
pub fn list_keys(list: &serde_json::Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}
