//! Test helper process: an upstream echo server and a client that can put itself into a
//! cgroup first. Runs inside the test's network namespaces (`ip netns exec`).
//!
//!   hub-probe serve --listen ADDR [--listen ADDR ...]
//!       Prints "ready" once bound. Per connection: reads one line, answers
//!       "echo:<line> peer=<peer address>" and closes.
//!   hub-probe connect --to ADDR [--count N] [--concurrency C] [--cgroup DIR] [--no-wait]
//!       Joins DIR first (if given), makes N connections, prints one JSON summary line:
//!       {"pid", "ok", "failed", "direct", "via_hub", "errors"} where "direct" means the
//!       socket ended up connected to ADDR itself and "via_hub" that a connect hook sent
//!       it elsewhere (the kernel reports the rewritten peer) and the echo still came back.
//!       With --no-wait each connection is only attempted (connect() called, the hooks
//!       run) and closed: "ok" counts those the kernel completed within 50 ms.
//!   hub-probe hold --to ADDR [--cgroup DIR]
//!       Joins DIR first (if given), connects and prints {"held", "direct"}; then, at each
//!       line on stdin, sends a line on the held connection as a keep-alive client would —
//!       connecting again once if the connection was ended meanwhile — and prints
//!       {"reconnected", "direct", "echo"}.
//!   hub-probe bench --via ADDR --direct ADDR [--rounds N] [--cgroup DIR]
//!       Interleaved timing of connect() and connect()+first reply byte to both targets;
//!       prints one JSON line with percentiles in microseconds.
use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("connect") => connect(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("hold") => hold(&args[1..]),
        _ => Err("usage: hub-probe serve|connect ...".to_string()),
    };
    if let Err(e) = result {
        eprintln!("hub-probe: {e}");
        std::process::exit(2);
    }
}

fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

fn value<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> Result<T, String> {
    match values(args, flag).last() {
        Some(v) => v.parse().map_err(|_| format!("bad {flag} {v}")),
        None => Ok(default),
    }
}

fn serve(args: &[String]) -> Result<(), String> {
    let addrs = values(args, "--listen");
    if addrs.is_empty() {
        return Err("serve needs --listen".into());
    }
    let mut handles = Vec::new();
    for a in addrs {
        let listener = TcpListener::bind(a).map_err(|e| format!("bind {a}: {e}"))?;
        handles.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || echo(conn));
            }
        }));
    }
    println!("ready");
    std::io::stdout().flush().ok();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn echo(conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let peer = conn.peer_addr().map(|p| p.to_string()).unwrap_or_default();
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_ok() {
        let reply = format!("echo:{} peer={peer}\n", line.trim_end());
        let _ = (&conn).write_all(reply.as_bytes());
    }
}

/// IPv4-mapped IPv6 addresses compare equal to their IPv4 form.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

enum Outcome {
    Direct,
    ViaHub,
}

fn one(to: SocketAddr, i: usize) -> Result<Outcome, String> {
    let conn =
        TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    // Not "did the upstream see my own address": the hub's relay socket may draw the same
    // loopback port as this one (connect() shares ports across destinations), so that
    // comparison misreads a relayed connection as direct now and then.
    let peer = canonical(conn.peer_addr().map_err(|e| e.to_string())?);
    let payload = format!("hello-{i}");
    (&conn)
        .write_all(format!("{payload}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if !line.starts_with(&format!("echo:{payload} peer=")) {
        return Err(format!("unexpected reply {line:?}"));
    }
    Ok(if peer == canonical(to) {
        Outcome::Direct
    } else {
        Outcome::ViaHub
    })
}

/// connect() called and the socket closed: the hooks ran, whether or not anyone answers.
fn attempt(to: SocketAddr) -> Result<Outcome, String> {
    let conn =
        TcpStream::connect_timeout(&to, Duration::from_millis(50)).map_err(|e| e.to_string())?;
    let peer = canonical(conn.peer_addr().map_err(|e| e.to_string())?);
    Ok(if peer == canonical(to) {
        Outcome::Direct
    } else {
        Outcome::ViaHub
    })
}

/// A line sent on `conn` and the echo read back.
fn exchange(conn: &TcpStream, line: &str) -> Result<String, String> {
    (&*conn)
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    let n = BufReader::new(conn)
        .read_line(&mut reply)
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("the connection was closed".into());
    }
    Ok(reply.trim_end().to_string())
}

fn hold(args: &[String]) -> Result<(), String> {
    let to: SocketAddr = value(args, "--to", "0.0.0.0:0".parse().unwrap())?;
    join_cgroup(args)?;
    let direct = |c: &TcpStream| c.peer_addr().is_ok_and(|p| canonical(p) == canonical(to));
    let mut conn =
        TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    println!(
        "{}",
        serde_json::json!({"held": true, "direct": direct(&conn)})
    );
    std::io::stdout().flush().ok();
    for (i, _) in std::io::stdin().lines().enumerate() {
        let line = format!("keepalive-{i}");
        let (echo, reconnected) = match exchange(&conn, &line) {
            Ok(echo) => (echo, false),
            Err(_) => {
                conn = TcpStream::connect_timeout(&to, Duration::from_secs(3))
                    .map_err(|e| e.to_string())?;
                conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
                (exchange(&conn, &line)?, true)
            }
        };
        println!(
            "{}",
            serde_json::json!({"reconnected": reconnected, "direct": direct(&conn), "echo": echo})
        );
        std::io::stdout().flush().ok();
    }
    Ok(())
}

fn join_cgroup(args: &[String]) -> Result<(), String> {
    if let Some(dir) = values(args, "--cgroup").last() {
        std::fs::write(
            format!("{dir}/cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("joining cgroup {dir}: {e}"))?;
    }
    Ok(())
}

/// One timed exchange: (connect() duration, connect()+first reply byte duration), in µs.
fn timed(to: SocketAddr) -> Result<(f64, f64), String> {
    use std::io::Read;
    let t0 = std::time::Instant::now();
    let mut conn = TcpStream::connect(to).map_err(|e| format!("{to}: {e}"))?;
    let t1 = t0.elapsed();
    conn.set_nodelay(true).ok();
    conn.write_all(b"x\n").map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    conn.read_exact(&mut byte).map_err(|e| e.to_string())?;
    let t2 = t0.elapsed();
    Ok((t1.as_secs_f64() * 1e6, t2.as_secs_f64() * 1e6))
}

fn percentiles(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    serde_json::json!({
        "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
        "mean": v.iter().sum::<f64>() / v.len() as f64,
    })
}

fn bench(args: &[String]) -> Result<(), String> {
    let via: SocketAddr = value(args, "--via", "0.0.0.0:0".parse().unwrap())?;
    let direct: SocketAddr = value(args, "--direct", "0.0.0.0:0".parse().unwrap())?;
    let rounds: usize = value(args, "--rounds", 2000)?.clamp(10, 100_000);
    join_cgroup(args)?;
    // Warm up both paths (page cache, hub's first-connection work) before measuring.
    for _ in 0..50 {
        timed(via)?;
        timed(direct)?;
    }
    let (mut vc, mut vf, mut dc, mut df) = (vec![], vec![], vec![], vec![]);
    for i in 0..rounds {
        // Alternate which goes first so neither always runs on a warmer cache.
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for through_hub in order {
            let (c, f) = timed(if through_hub { via } else { direct })?;
            if through_hub {
                vc.push(c);
                vf.push(f);
            } else {
                dc.push(c);
                df.push(f);
            }
        }
    }
    let out = serde_json::json!({
        "rounds": rounds,
        "via_hub": {"connect": percentiles(vc), "first_byte": percentiles(vf)},
        "direct": {"connect": percentiles(dc), "first_byte": percentiles(df)},
    });
    println!("{out}");
    Ok(())
}

fn connect(args: &[String]) -> Result<(), String> {
    let to: SocketAddr = value(args, "--to", "0.0.0.0:0".parse().unwrap())?;
    let count: usize = value(args, "--count", 1)?;
    let concurrency: usize = value(args, "--concurrency", 1)?.clamp(1, 256);
    let no_wait = args.iter().any(|a| a == "--no-wait");
    if let Some(dir) = values(args, "--cgroup").last() {
        std::fs::write(
            format!("{dir}/cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("joining cgroup {dir}: {e}"))?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let counts = Arc::new([
        AtomicUsize::new(0), // ok
        AtomicUsize::new(0), // failed
        AtomicUsize::new(0), // direct
        AtomicUsize::new(0), // via hub
    ]);
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..concurrency.min(count.max(1)))
        .map(|_| {
            let (next, counts, errors) = (next.clone(), counts.clone(), errors.clone());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let outcome = if no_wait { attempt(to) } else { one(to, i) };
                    match outcome {
                        Ok(o) => {
                            counts[0].fetch_add(1, Ordering::Relaxed);
                            let idx = if matches!(o, Outcome::Direct) { 2 } else { 3 };
                            counts[idx].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            counts[1].fetch_add(1, Ordering::Relaxed);
                            let mut errs = errors.lock().unwrap();
                            if errs.len() < 5 {
                                errs.push(e);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let c = |i: usize| counts[i].load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "pid": std::process::id(),
        "ok": c(0),
        "failed": c(1),
        "direct": c(2),
        "via_hub": c(3),
        "errors": *errors.lock().unwrap(),
    });
    println!("{summary}");
    Ok(())
}
