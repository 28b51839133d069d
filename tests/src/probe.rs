//! Driving the `hub-probe` helper: an echo upstream, and clients that report whether their
//! connection went through the hub.
use std::time::Duration;

use serde_json::Value;

use crate::{
    cgroup::Cgroup,
    netns::Netns,
    probe_bin,
    process::{self, Proc},
};

/// An echo server in `ns` listening on every address in `listen`; ready when returned.
pub fn upstream(ns: &Netns, listen: &[&str]) -> Proc {
    let mut cmd = ns.command(probe_bin());
    cmd.arg("serve");
    for l in listen {
        cmd.args(["--listen", l]);
    }
    Proc::spawn_until_line(cmd, "upstream", "ready", Duration::from_secs(5))
}

/// Runs `hub-probe connect` in `ns` (inside `cg` if given) and returns its JSON summary:
/// `pid`, `ok`, `failed`, `direct`, `via_hub`, `errors`.
pub fn connect(
    ns: &Netns,
    to: &str,
    count: usize,
    concurrency: usize,
    cg: Option<&Cgroup>,
) -> Value {
    let mut cmd = ns.command(probe_bin());
    cmd.args(["connect", "--to", to])
        .args(["--count", &count.to_string()])
        .args(["--concurrency", &concurrency.to_string()]);
    if let Some(cg) = cg {
        cmd.arg("--cgroup").arg(cg.path());
    }
    serde_json::from_str(&process::output(cmd, "hub-probe connect")).expect("probe json")
}

/// `hub-probe hold` in `ns` and `cgroup`: a client holding one keep-alive connection to
/// `to`, ended on every exit path. It prints {"held", "direct"} at once, then a line per
/// `exchange()`.
pub struct HoldingClient {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl HoldingClient {
    pub fn start(ns: &Netns, to: &str, cgroup: &Cgroup) -> HoldingClient {
        let mut cmd = ns.command(probe_bin());
        cmd.args(["hold", "--to", to, "--cgroup"])
            .arg(cgroup.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("hub-probe hold");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        HoldingClient { child, out }
    }

    /// Its next line of output.
    pub fn line(&mut self) -> Value {
        use std::io::BufRead;
        let mut line = String::new();
        self.out.read_line(&mut line).expect("hub-probe output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Asks for the next request on the held connection and returns what it saw.
    pub fn exchange(&mut self) -> Value {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "next").unwrap();
        stdin.flush().unwrap();
        self.line()
    }
}

impl Drop for HoldingClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubelet-style request (its node certificate from `pki`, a kubelet User-Agent) from
/// `cgroup` in `ns`, on a new connection to `cloud`: the sorted names of `node`'s pods,
/// or why not.
pub fn kubelet_lists_pods(
    ns: &Netns,
    cgroup: &Cgroup,
    pki: &std::path::Path,
    cloud: &str,
    node: &str,
) -> Result<Vec<String>, String> {
    let mut c = ns.command("curl");
    c.args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(["-A", "kubelet/v1.32.0 (linux/amd64) kubernetes/test"])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("kubelet.crt"))
        .arg("--key")
        .arg(pki.join("kubelet.key"))
        .arg(format!(
            "https://{cloud}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"
        ));
    process::in_cgroup(&mut c, &cgroup.procs_file());
    let out = c.output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    if code != "200" {
        return Err(format!(
            "HTTP {code:?}: {body} {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let list: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    let mut names: Vec<String> = list["items"]
        .as_array()
        .ok_or_else(|| format!("not a list: {body}"))?
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or_default().into())
        .collect();
    names.sort();
    Ok(names)
}
