//! `cargo xtask relay`: the bench's cuttable, counting link (`crate::relay`) as a process of
//! its own, for checks that run real Kubernetes components by hand. Every pair it carries
//! goes silent at the same moments; what each has carried is appended to a report as one
//! JSON line per pair every few seconds and at each change of the link.
use std::{
    io::Write,
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::relay::Relay;

/// The value after `flag`, every time it is given.
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

pub fn run(args: &[String]) -> Result<()> {
    let number = |flag, default| crate::number(args, flag, default);
    let cut_every = number("--cut-every", 600)?;
    let cut_seconds = number("--cut-seconds", 30)?;
    let first_cut = number("--first-cut", cut_every)?;
    let minutes = number("--minutes", 60)?;
    let cuts = number("--cuts", u64::MAX)?;
    let report_path = values(args, "--report")
        .pop()
        .context("--report PATH is required")?;
    let mut pairs = Vec::new();
    for pair in values(args, "--pair") {
        let [name, port, target] = pair.split(':').collect::<Vec<_>>()[..] else {
            bail!("--pair takes NAME:PORT:TARGET_PORT, not {pair}");
        };
        let port: u16 = port.parse().with_context(|| format!("port in {pair}"))?;
        let target: u16 = target
            .parse()
            .with_context(|| format!("target in {pair}"))?;
        let relay = Relay::start(port, SocketAddr::from(([127, 0, 0, 1], target)))?;
        pairs.push((name.to_string(), relay));
    }
    if pairs.is_empty() {
        bail!("no --pair given");
    }
    let mut report = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(report_path)
        .with_context(|| format!("opening {report_path}"))?;
    let started = Instant::now();
    let end = started + Duration::from_secs(minutes * 60);
    let mut silent = false;
    let mut next_cut =
        (cut_every > 0 && cuts > 0).then(|| started + Duration::from_secs(first_cut));
    let mut cut = 0;
    let mut silent_until = started;
    let mut next_line = started;
    loop {
        let now = Instant::now();
        let changed = match next_cut {
            Some(at) if !silent && now >= at => {
                pairs.iter().for_each(|(_, r)| r.silence());
                silent = true;
                silent_until = now + Duration::from_secs(cut_seconds);
                cut += 1;
                next_cut = (cut < cuts).then(|| at + Duration::from_secs(cut_every));
                true
            }
            _ if silent && now >= silent_until => {
                for (_, r) in &pairs {
                    r.up()?;
                }
                silent = false;
                true
            }
            _ => false,
        };
        if changed || now >= next_line || now >= end {
            for (name, r) in &pairs {
                let c = r.carried();
                writeln!(
                    report,
                    "{{\"t\":{:.1},\"pair\":\"{name}\",\"silent\":{silent},\"to_cloud\":{},\"from_cloud\":{},\"connections\":{},\"abandoned\":{}}}",
                    now.duration_since(started).as_secs_f64(),
                    c.to_cloud,
                    c.from_cloud,
                    c.connections,
                    c.abandoned
                )?;
            }
            report.flush()?;
            next_line = now + Duration::from_secs(5);
        }
        if now >= end {
            return Ok(());
        }
        // A clock for a long-running tool: the schedule's resolution, not a synchronisation.
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_run_reports_one_line_per_pair_and_refuses_a_malformed_pair() {
        let dir = std::env::temp_dir().join(format!("relay-cmd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = dir.join("report.jsonl");
        let (a, b) = (
            hub_tests::ports::free_port().to_string(),
            hub_tests::ports::free_port().to_string(),
        );
        let pair = |name: &str, port: &str| format!("{name}:{port}:1");
        run(&args(&[
            "--pair",
            &pair("direct", &a),
            "--pair",
            &pair("hub", &b),
            "--report",
            report.to_str().unwrap(),
            "--minutes",
            "0",
        ]))
        .unwrap();
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&report)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let pairs: Vec<_> = lines.iter().map(|l| l["pair"].as_str().unwrap()).collect();
        assert_eq!(pairs, ["direct", "hub"]);
        assert!(
            lines
                .iter()
                .all(|l| l["to_cloud"] == 0 && l["silent"] == false)
        );
        let err = run(&args(&["--pair", "direct:1", "--report", "x"])).unwrap_err();
        assert!(err.to_string().contains("NAME:PORT:TARGET_PORT"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
