//! `cargo xtask soak --minutes N`: two hubs of one pool under node traffic, while the
//! cloud is killed, frozen, slowed, made to err and flapped; etcd members (the leader's
//! too) and then the whole coordinator are taken away; a hub is killed with -9; its cache
//! disk is filled. The invariants (checks.rs, ledger.rs) are hard failures; the report
//! gives requests per route, client failures by cause, detection and recovery times and
//! peak RSS, printed and written to target/soak-report.json.
mod checks;
mod ledger;
mod load;

mod world;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde_json::json;

use checks::{Footprint, cloud_healthy, coordinator_healthy, wait_status};
use ledger::Ledger;
use world::World;

/// How long the coordinator may take to mirror the cloud again after it (or a hub) was
/// gone: etcd elects, the hubs reconnect and push what changed meanwhile.
const COORDINATOR_BACK: Duration = Duration::from_secs(20);

/// Measured times, by what was measured (e.g. "detect cloud-killed").
#[derive(Default)]
struct Times(BTreeMap<String, Vec<f64>>);

impl Times {
    fn add(&mut self, what: &str, d: Duration) {
        self.0
            .entry(what.to_string())
            .or_default()
            .push(d.as_secs_f64() * 1000.0);
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Sleeps `d`, or fails as soon as the soak is interrupted (Ctrl-C, SIGTERM): every
/// process and mount it made is then removed as it unwinds.
fn pause(d: Duration) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
    Ok(())
}

pub fn run(args: &[String]) -> Result<()> {
    let minutes: f64 = args
        .windows(2)
        .find(|w| w[0] == "--minutes")
        .map(|w| w[1].parse())
        .transpose()?
        .unwrap_or(3.0);
    let report = args.windows(2).find(|w| w[0] == "--report").map_or_else(
        || crate::root().join("target/soak-report.json"),
        |w| w[1].clone().into(),
    );
    if minutes <= 0.0 || minutes > 24.0 * 60.0 {
        bail!("--minutes must be between 0 and 1440");
    }
    // SAFETY: plain geteuid(2).
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soak mounts a tmpfs for a hub's cache: run it as root");
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let soak = Soak::start(minutes, report)?;
    soak.run()
}

struct Soak {
    world: World,
    ledger: Arc<Ledger>,
    times: Times,
    baselines: Vec<Footprint>,
    /// Scraped per hub process: pid → (route → requests), and its peak RSS.
    routes: Arc<Mutex<HashMap<u32, BTreeMap<String, f64>>>>,
    peak_rss: Arc<Mutex<HashMap<u32, u64>>>,
    /// The hubs' current process ids, for the scraper.
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    minutes: f64,
    /// Where the JSON report goes; the hubs' logs go beside it (`<stem>-logs/`).
    report: std::path::PathBuf,
    started: Instant,
    flaps: u64,
}

impl Soak {
    fn start(minutes: f64, report: std::path::PathBuf) -> Result<Soak> {
        eprintln!("soak: starting the cloud, a 3-member etcd and two hubs");
        let world = World::start()?;
        let pids = world.hubs.iter().map(world::Hub::pid).collect();
        Ok(Soak {
            pids: Arc::new(Mutex::new(pids)),
            world,
            ledger: Arc::new(Ledger::default()),
            times: Times::default(),
            baselines: Vec::new(),
            routes: Arc::default(),
            peak_rss: Arc::default(),
            minutes,
            report,
            started: Instant::now(),
            flaps: 0,
        })
    }

    fn run(mut self) -> Result<()> {
        self.ledger.set_phase("steady");
        let (clients, truth) = load::start(&self.world, &self.ledger)?;
        let scraper = self.scrape();
        // Warm up: both hubs caching, a leader writing the pool's services.
        for i in 0..self.world.hubs.len() {
            if wait_status(&self.world, i, Duration::from_secs(30), coordinator_healthy).is_none() {
                bail!("hub {i}'s coordinator did not become healthy");
            }
        }
        pause(Duration::from_secs(5))?;
        checks::converged(&self.world, &self.ledger, Duration::from_secs(30));
        self.baselines = (0..self.world.hubs.len())
            .map(|i| Footprint::of(&self.world, i).unwrap_or_default())
            .collect();
        eprintln!("soak: baseline {:?}", self.baselines);

        let until = self.started + Duration::from_secs_f64(self.minutes * 60.0);
        let mut cycle = 0;
        while cycle == 0 || Instant::now() < until {
            cycle += 1;
            self.cycle(cycle)?;
        }

        eprintln!("soak: stopping the load; waiting for queued writes to reach the cloud");
        self.ledger.set_phase("drain");
        self.ledger
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for c in clients {
            let _ = c.join();
        }
        self.wait_acked_landed();
        self.ledger
            .stop_truth
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for t in truth {
            let _ = t.join();
        }
        let _ = scraper.join();
        self.ledger.set_phase("final");
        let (acked, duplicates) = checks::writes_kept(&self.ledger);
        let (served, strange) = self.ledger.served_not_in_cloud();
        for s in strange.iter().take(20) {
            self.ledger
                .violation(format!("served an object state the cloud never held: {s}"));
        }
        self.report(cycle, acked, duplicates, served)
    }

    /// One round of every fault, each followed by the recovery checks.
    fn cycle(&mut self, n: u32) -> Result<()> {
        let hold = |s: u64| Duration::from_secs(s);
        let long = self.minutes >= 10.0;
        self.cloud_killed(n, hold(10))?;
        self.cloud_frozen(n, hold(6))?;
        self.cloud_slowed(n, hold(10))?;
        self.cloud_erring(n, hold(8))?;
        let flaps = (self.minutes * 10.0 / 3.0).clamp(10.0, 40.0) as u32;
        self.cloud_flapping(n, flaps)?;
        self.etcd_member(n, false, hold(8))?;
        self.etcd_member(n, true, hold(8))?;
        self.hub_killed(n)?;
        self.disk_full(n, hold(12))?;
        self.coordinator_down(n, hold(if long { 120 } else { 20 }))?;
        Ok(())
    }

    fn phase(&self, name: &str, n: u32) {
        let at = self.started.elapsed().as_secs();
        eprintln!("soak: {at:>5} s  {name} (cycle {n})");
        self.ledger.set_phase(&format!("{name}#{n}"));
    }

    /// Waits (up to `limit`) for each hub to see `pred`, recording how long it took.
    fn each_hub_sees(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool + Copy,
    ) {
        for i in 0..self.world.hubs.len() {
            match wait_status(&self.world, i, limit, pred) {
                Some(d) => self.times.add(what, d),
                None => self
                    .ledger
                    .violation(format!("hub {i}: no {what} within {limit:?}")),
            }
        }
    }

    /// After a fault: both hubs back on the cloud and the coordinator, the coordinator
    /// holding the cloud's state within `converge` of the fault's end, every footprint
    /// back to its baseline.
    fn recovered(&mut self, fault: &str, converge: Duration) -> Result<()> {
        let back = Instant::now();
        self.each_hub_sees(&format!("recover {fault}"), Duration::from_secs(30), |s| {
            cloud_healthy(s, true) && coordinator_healthy(s)
        });
        let limit = converge
            .saturating_sub(back.elapsed())
            .max(Duration::from_millis(200));
        if checks::converged(&self.world, &self.ledger, limit).is_some() {
            self.times
                .add(&format!("converge after {fault}"), back.elapsed());
        }
        checks::settled(&self.world, &self.ledger, &self.baselines);
        self.ledger.set_phase("steady");
        pause(Duration::from_secs(2))
    }

    fn cloud_killed(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.phase("offline-killed", n);
        self.world.relay.down();
        self.each_hub_sees("detect cloud-killed", Duration::from_secs(10), |s| {
            cloud_healthy(s, false)
        });
        pause(hold)?;
        // Node autonomy: each node's kubelet got its pods listed while the cloud was gone.
        for i in 0..self.world.hubs.len() {
            if self.ledger.offline_lists(i) == 0 {
                self.ledger.violation(format!(
                    "hub {i} answered no list of its node's pods while the cloud was down"
                ));
            }
        }
        self.world.relay.up()?;
        self.recovered("cloud-killed", checks::CONVERGE_WITHIN)?;
        Ok(())
    }

    fn cloud_frozen(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.phase("frozen", n);
        self.world.freeze_cloud(true);
        self.each_hub_sees("detect cloud-frozen", Duration::from_secs(10), |s| {
            cloud_healthy(s, false)
        });
        pause(hold)?;
        self.world.freeze_cloud(false);
        self.recovered("cloud-frozen", checks::CONVERGE_WITHIN)?;
        Ok(())
    }

    /// Slow is not down: 1.5 s on every answer never marks the cloud unhealthy, and no
    /// client gets the hub's own error for a request the cloud answers.
    fn cloud_slowed(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.answering_cloud("slowed", n, hold, 1500, 0)
    }

    /// 5 % of answers are 5xx: still not an outage.
    fn cloud_erring(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.answering_cloud("erring", n, hold, 0, 50)
    }

    fn answering_cloud(
        &mut self,
        name: &str,
        n: u32,
        hold: Duration,
        latency_ms: u64,
        errors: u32,
    ) -> Result<()> {
        let before: Vec<u64> = (0..self.world.hubs.len())
            .map(|i| checks::cloud_transitions(&self.world, i))
            .collect();
        let hub_errors = |l: &Ledger| -> u64 {
            l.outcomes()
                .iter()
                .filter(|((_, phase, o), _)| phase == name && o.contains("from hub"))
                .map(|(_, c)| c)
                .sum()
        };
        let errors_before = hub_errors(&self.ledger);
        self.phase(name, n);
        self.world.cloud_faults(latency_ms, errors)?;
        pause(hold)?;
        self.world.cloud_faults(0, 0)?;
        for (i, b) in before.iter().enumerate() {
            let after = checks::cloud_transitions(&self.world, i);
            if after != *b {
                self.ledger.violation(format!(
                    "hub {i} marked an answering cloud unhealthy ({} transitions)",
                    after - b
                ));
            }
        }
        let errs = hub_errors(&self.ledger) - errors_before;
        if errs > 0 {
            self.ledger.violation(format!(
                "{errs} requests got the hub's own error while the cloud answered"
            ));
        }
        self.recovered(name, checks::CONVERGE_WITHIN)?;
        Ok(())
    }

    fn cloud_flapping(&mut self, n: u32, flaps: u32) -> Result<()> {
        self.phase("flapping", n);
        for _ in 0..flaps {
            self.world.relay.down();
            pause(Duration::from_millis(500))?;
            self.world.relay.up()?;
            pause(Duration::from_millis(1000))?;
            self.flaps += 1;
        }
        self.recovered("cloud-flapping", checks::CONVERGE_WITHIN)?;
        Ok(())
    }

    /// One etcd member killed (the leader's, or another) and started again.
    fn etcd_member(&mut self, n: u32, leader: bool, hold: Duration) -> Result<()> {
        let Some(l) = self.world.etcd.leader() else {
            self.ledger.violation("no etcd leader to find".into());
            return Ok(());
        };
        let victim = if leader { l } else { (l + 1) % 3 };
        self.phase(
            if leader {
                "etcd-leader-killed"
            } else {
                "etcd-member-killed"
            },
            n,
        );
        self.world.etcd.kill_member(victim);
        // Two of three members keep quorum: losing one that is not the leader is no
        // outage of the coordinator (the leader's costs an election).
        let killed = Instant::now();
        match checks::holds_for(&self.world, hold, coordinator_healthy) {
            Some((hub, after)) if !leader => self.ledger.violation(format!(
                "hub {hub} lost the coordinator {} ms after one member of three died",
                after.as_millis()
            )),
            _ => {}
        }
        pause(hold.saturating_sub(killed.elapsed()))?;
        self.world.etcd.start_member(victim);
        self.world.etcd.wait_healthy(victim);
        self.recovered(
            if leader { "etcd-leader" } else { "etcd-member" },
            COORDINATOR_BACK,
        )?;
        Ok(())
    }

    /// The pool's whole coordinator gone for a while, then back with its data.
    fn coordinator_down(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.phase("coordinator-down", n);
        for i in 0..3 {
            self.world.etcd.kill_member(i);
        }
        self.each_hub_sees("detect coordinator-down", Duration::from_secs(30), |s| {
            !coordinator_healthy(s)
        });
        pause(hold)?;
        for i in 0..3 {
            self.world.etcd.start_member(i);
        }
        for i in 0..3 {
            self.world.etcd.wait_healthy(i);
        }
        self.recovered("coordinator-down", COORDINATOR_BACK)?;
        Ok(())
    }

    /// A hub killed with -9 and started again on the same cache.
    fn hub_killed(&mut self, n: u32) -> Result<()> {
        let victim = (n as usize + 1) % self.world.hubs.len();
        self.phase("hub-killed", n);
        self.scrape_once();
        self.world.hubs[victim].kill9();
        pause(Duration::from_secs(1))?;
        let started = Instant::now();
        self.world.hubs[victim].start()?;
        self.times.add("hub restart to ready", started.elapsed());
        self.pids.lock().unwrap()[victim] = self.world.hubs[victim].pid();
        self.recovered("hub-killed", COORDINATOR_BACK)?;
        // A new process: its baseline is its own, once its clients are back.
        pause(Duration::from_secs(3))?;
        if let Some(f) = Footprint::of(&self.world, victim) {
            self.baselines[victim] = f;
        }
        Ok(())
    }

    /// node-0's cache disk full: it keeps serving from the cloud, and what it stored
    /// before stays (checked by the next offline phase).
    fn disk_full(&mut self, n: u32, hold: Duration) -> Result<()> {
        self.phase("disk-full", n);
        let filled = self.world.disk.fill()?;
        eprintln!(
            "soak:          filled node-0's cache disk with {} MiB",
            filled >> 20
        );
        pause(hold)?;
        self.world.disk.free();
        if !self.world.hubs[0]
            .proc
            .as_mut()
            .is_some_and(|p| p.is_running())
        {
            self.ledger
                .violation("node-0's hub exited when its disk filled".into());
            self.world.hubs[0].start()?;
            self.pids.lock().unwrap()[0] = self.world.hubs[0].pid();
        }
        self.recovered("disk-full", checks::CONVERGE_WITHIN)?;
        Ok(())
    }

    /// Every acknowledged lease write must reach the cloud once it is back for good.
    fn wait_acked_landed(&self) {
        let deadline = Instant::now() + Duration::from_secs(150);
        while Instant::now() < deadline {
            let acked = self.ledger.acked.lock().unwrap().clone();
            let landed = self.ledger.landed.lock().unwrap().clone();
            let done = acked.iter().all(|(node, a)| {
                a.last()
                    .is_none_or(|last| landed.get(node).is_some_and(|l| l.contains(last)))
            });
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every second: each hub's requests by route and its peak RSS, by process.
    fn scrape(&self) -> std::thread::JoinHandle<()> {
        let (ledger, routes, peaks) = (
            self.ledger.clone(),
            self.routes.clone(),
            self.peak_rss.clone(),
        );
        let admins: Vec<String> = self.world.hubs.iter().map(|h| h.admin.clone()).collect();
        let pids = self.pids.clone();
        std::thread::spawn(move || {
            while !ledger.stopping() {
                let now = pids.lock().unwrap().clone();
                for (admin, pid) in admins.iter().zip(now) {
                    scrape_hub(admin, pid, &routes, &peaks);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    }

    fn scrape_once(&self) {
        for h in &self.world.hubs {
            scrape_hub(&h.admin, h.pid(), &self.routes, &self.peak_rss);
        }
    }

    fn report(&self, cycles: u32, acked: usize, duplicates: usize, served: usize) -> Result<()> {
        let mut routes: BTreeMap<String, f64> = BTreeMap::new();
        for per in self.routes.lock().unwrap().values() {
            for (r, n) in per {
                *routes.entry(r.clone()).or_default() += n;
            }
        }
        let peak = self
            .peak_rss
            .lock()
            .unwrap()
            .values()
            .copied()
            .max()
            .unwrap_or(0);
        let outcomes = self.ledger.outcomes();
        let failures: BTreeMap<String, u64> = outcomes
            .iter()
            .filter(|((_, _, o), _)| !o.split(' ').any(|w| w.starts_with('2') && w.len() == 3))
            .map(|((c, p, o), n)| (format!("{c} in {p}: {o}"), *n))
            .collect();
        let times: BTreeMap<String, serde_json::Value> = self
            .times
            .0
            .iter()
            .map(|(k, v)| {
                let mut s = v.clone();
                s.sort_by(f64::total_cmp);
                (k.clone(), json!({"n": s.len(), "p50_ms": percentile(&s, 0.5), "p99_ms": percentile(&s, 0.99), "max_ms": s.last()}))
            })
            .collect();
        let violations = self.ledger.violations();
        let elapsed = self.started.elapsed().as_secs_f64();
        println!(
            "soak: {:.1} min, {cycles} cycles of every fault, {} cloud flaps",
            elapsed / 60.0,
            self.flaps
        );
        println!("requests served by the hubs, per route:");
        for (r, n) in &routes {
            println!("  {r:<14} {n:>8.0}");
        }
        println!("client failures by cause (phase: what the client got):");
        for (what, n) in &failures {
            println!("  {n:>6}  {what}");
        }
        println!("times (ms):                           n      p50      p99      max");
        for (k, v) in &times {
            println!(
                "  {k:<32} {:>4} {:>8.0} {:>8.0} {:>8.0}",
                v["n"],
                v["p50_ms"].as_f64().unwrap_or(f64::NAN),
                v["p99_ms"].as_f64().unwrap_or(f64::NAN),
                v["max_ms"].as_f64().unwrap_or(f64::NAN)
            );
        }
        println!(
            "lease writes acknowledged: {acked}, stored twice in order by replays: {duplicates}"
        );
        println!("object states served: {served}, all checked against the cloud's");
        println!("peak RSS of a hub: {:.1} MiB", peak as f64 / 1024.0);
        let report = json!({
            "minutes": elapsed / 60.0, "cycles": cycles, "flaps": self.flaps,
            "routes": routes, "failures": failures, "times": times,
            "acked_lease_writes": acked, "replayed_duplicates": duplicates,
            "served_states": served, "peak_rss_kib": peak, "violations": violations,
        });
        let logs = self.report.with_extension("").with_file_name(format!(
            "{}-logs",
            self.report
                .file_stem()
                .map_or("soak".into(), |s| s.to_string_lossy())
        ));
        std::fs::create_dir_all(&logs)?;
        for h in &self.world.hubs {
            std::fs::copy(h.log_path(), logs.join(format!("{}.log", h.node)))?;
        }
        println!("hub logs: {}", logs.display());
        std::fs::write(&self.report, serde_json::to_vec_pretty(&report)?)?;
        println!("report: {}", self.report.display());
        if !violations.is_empty() {
            println!("INVARIANTS BROKEN ({}):", violations.len());
            for v in violations.iter().take(50) {
                println!("  {v}");
            }
            bail!("the soak found {} invariant violations", violations.len());
        }
        println!("every invariant held");
        Ok(())
    }
}

/// Scrapes one hub: requests by route (kept per process, so a killed one's counts stay)
/// and its peak RSS.
fn scrape_hub(
    admin: &str,
    pid: Option<u32>,
    routes: &Mutex<HashMap<u32, BTreeMap<String, f64>>>,
    peaks: &Mutex<HashMap<u32, u64>>,
) {
    let Some(pid) = pid else { return };
    if let Some(hwm) = checks::peak_rss_kib(pid) {
        peaks.lock().unwrap().insert(pid, hwm);
    }
    let Some(text) = world::admin_text(admin, "/metrics") else {
        return;
    };
    let mut per = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("hub_proxy_requests_total{"))
    {
        let Some(route) = line
            .split("route=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *per.entry(route.to_string()).or_default() += n;
    }
    routes.lock().unwrap().insert(pid, per);
}
