//! `hub trace`'s client side: follows a running hub's `/v1/trace`, keeps the lines the
//! filters ask for and prints them as text or JSON lines.
use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::intercept::trace::TraceLine;

/// Which connects to show; empty lists mean all.
#[derive(Debug, Default)]
pub struct Filter {
    pub pids: Vec<u32>,
    /// A cgroup id, or a cgroup directory (its connects and those of every cgroup below).
    pub cgroups: Vec<CgroupFilter>,
    pub vips: Vec<SocketAddr>,
}

#[derive(Debug, Clone)]
pub enum CgroupFilter {
    Id(u64),
    Dir(PathBuf),
}

impl std::str::FromStr for CgroupFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(id) = s.parse() {
            return Ok(CgroupFilter::Id(id));
        }
        let path = Path::new(s);
        if !path.is_absolute() {
            return Err(format!(
                "{s}: give a cgroup id or an absolute cgroup directory (/sys/fs/cgroup/...)"
            ));
        }
        Ok(CgroupFilter::Dir(path.to_path_buf()))
    }
}

impl Filter {
    /// Whether a line passes. Log and loss lines always do: they are not about a connect.
    pub fn keeps(&self, line: &TraceLine) -> bool {
        let TraceLine::Connect {
            pid,
            cgroup_id,
            cgroup,
            original_dst,
            ..
        } = line
        else {
            return true;
        };
        let pid_ok = self.pids.is_empty() || self.pids.contains(pid);
        let cgroup_ok = self.cgroups.is_empty()
            || self.cgroups.iter().any(|f| match f {
                CgroupFilter::Id(id) => id == cgroup_id,
                CgroupFilter::Dir(dir) => cgroup
                    .as_deref()
                    .is_some_and(|c| Path::new(c).starts_with(dir)),
            });
        let vip_ok = self.vips.is_empty()
            || self
                .vips
                .iter()
                .any(|v| original_dst.parse::<SocketAddr>().is_ok_and(|d| d == *v));
        pid_ok && cgroup_ok && vip_ok
    }
}

/// One line as `hub trace` prints it by default.
pub fn render(line: &TraceLine) -> String {
    match line {
        TraceLine::Connect {
            time,
            pid,
            comm,
            cgroup_id,
            cgroup,
            pod,
            original_dst,
            redirected_to,
            verdict,
        } => {
            let from = match (pod, cgroup) {
                (Some(uid), _) => format!("pod {uid}"),
                (None, Some(dir)) => format!("cgroup {dir}"),
                (None, None) => format!("cgroup #{cgroup_id}"),
            };
            let to = redirected_to.as_deref().unwrap_or("(unchanged)");
            format!("{time} {pid:>7} {comm:<15} {from} {original_dst} -> {to} {verdict}")
        }
        TraceLine::Log {
            time,
            level,
            message,
        } => format!("{time} ebpf {level}: {message}"),
        TraceLine::Lost { count } => format!("... {count} lines lost: this trace fell behind"),
    }
}

/// Follows the hub at `admin` and writes each kept line to `out`; stops after `count`
/// lines when given, or when the hub ends the stream. Returns how many lines were written.
pub async fn follow(
    admin: SocketAddr,
    logs: bool,
    filter: &Filter,
    json: bool,
    count: Option<u64>,
    out: &mut dyn Write,
) -> Result<u64, String> {
    let unreachable = |e: &dyn std::fmt::Display| {
        format!("cannot reach the hub admin port {admin}: {e} (is `hub run` running?)")
    };
    let stream = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(admin))
        .await
        .map_err(|_| unreachable(&"timed out"))?
        .map_err(|e| unreachable(&e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(conn);
    let request = hyper::Request::get(format!("/v1/trace?logs={}", u8::from(logs)))
        .header("host", admin.to_string())
        .body(Empty::<Bytes>::new())
        .expect("static request parts are valid");
    let mut answer = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(&e))?;
    if !answer.status().is_success() {
        let status = answer.status();
        let body = answer.into_body().collect().await.map(|b| b.to_bytes());
        let why = body.map(|b| String::from_utf8_lossy(&b).trim().to_string());
        return Err(format!("{status}: {}", why.unwrap_or_default()));
    }
    let mut pending = Vec::new();
    let mut written = 0;
    while count.is_none_or(|n| written < n) {
        let Some(frame) = answer.body_mut().frame().await else {
            break;
        };
        let frame = frame.map_err(|e| format!("the trace stream broke: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=end).collect();
            let line: TraceLine = serde_json::from_slice(&raw)
                .map_err(|e| format!("a trace line the hub sent is not understood: {e}"))?;
            if !filter.keeps(&line) {
                continue;
            }
            let text = if json {
                String::from_utf8_lossy(raw.trim_ascii_end()).into_owned()
            } else {
                render(&line)
            };
            writeln!(out, "{text}")
                .and_then(|()| out.flush())
                .map_err(|e| format!("writing the trace: {e}"))?;
            written += 1;
            if count.is_some_and(|n| written >= n) {
                break;
            }
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(pid: u32, cgroup: &str, dst: &str) -> TraceLine {
        TraceLine::Connect {
            time: "2026-12-03T12:00:00.000001Z".into(),
            pid,
            comm: "curl".into(),
            cgroup_id: 42,
            cgroup: Some(cgroup.into()),
            pod: None,
            original_dst: dst.into(),
            redirected_to: Some("127.0.0.1:40000".into()),
            verdict: "redirected".into(),
        }
    }

    #[test]
    fn filters_by_pid_cgroup_and_vip() {
        let line = connect(7, "/sys/fs/cgroup/kubepods/pod1/c1", "10.96.0.1:443");
        assert!(Filter::default().keeps(&line));
        let by_pid = Filter {
            pids: vec![8],
            ..Filter::default()
        };
        assert!(!by_pid.keeps(&line));
        let by_dir = Filter {
            cgroups: vec!["/sys/fs/cgroup/kubepods".parse().unwrap()],
            ..Filter::default()
        };
        assert!(by_dir.keeps(&line));
        let other_dir = Filter {
            cgroups: vec!["/sys/fs/cgroup/kube".parse().unwrap()],
            ..Filter::default()
        };
        assert!(
            !other_dir.keeps(&line),
            "a prefix of a name is not a parent"
        );
        let by_id = Filter {
            cgroups: vec!["42".parse().unwrap()],
            ..Filter::default()
        };
        assert!(by_id.keeps(&line));
        let by_vip = Filter {
            vips: vec!["10.96.0.2:443".parse().unwrap()],
            ..Filter::default()
        };
        assert!(!by_vip.keeps(&line));
        assert!("kubepods".parse::<CgroupFilter>().is_err());
        let log = TraceLine::Lost { count: 3 };
        assert!(by_pid.keeps(&log));
    }

    #[test]
    fn text_lines_name_pod_or_cgroup() {
        let line = connect(7, "/sys/fs/cgroup/x", "10.96.0.1:443");
        assert_eq!(
            render(&line),
            "2026-12-03T12:00:00.000001Z       7 curl            cgroup /sys/fs/cgroup/x 10.96.0.1:443 -> 127.0.0.1:40000 redirected"
        );
    }
}
