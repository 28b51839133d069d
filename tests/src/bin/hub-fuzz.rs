//! Runs the fuzz targets (`hub_tests::fuzz`) for a time budget and reports executions and
//! findings per target.
//!
//!   hub-fuzz [--seconds N] [--seed S] [--target NAME] [--findings DIR]
//!
//! N seconds in all, split evenly between the targets. A finding (a panic, or a single
//! allocation over the limit) is written to DIR (default target/fuzz-findings) and the
//! exit code is 1. The last line of output is a JSON report.
use std::{
    alloc::{GlobalAlloc, Layout, System},
    panic::AssertUnwindSafe,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use hub_tests::fuzz::{ALLOCATION_LIMIT, Rng, mutate, targets};

/// The system allocator, remembering the largest single allocation asked for since the
/// last reset; one past the hard cap is refused (the process then aborts, as any Rust
/// program out of memory does), so a runaway length cannot take the machine down.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Findings written out per target.
const KEPT_FINDINGS: u64 = 10;
const HARD_CAP: usize = 1 << 30;

// SAFETY: forwards to the system allocator; only the bookkeeping is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as allocated above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        if new_size > HARD_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: as allocated above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: hub-fuzz [--seconds N] [--seed S] [--target NAME] [--findings DIR]");
        return;
    }
    let seconds: u64 = value(&args, "--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = value(&args, "--seed")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let only = value(&args, "--target");
    let findings_dir = value(&args, "--findings").unwrap_or_else(|| "target/fuzz-findings".into());
    let chosen: Vec<_> = targets()
        .into_iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == t.name))
        .collect();
    if chosen.is_empty() {
        eprintln!("hub-fuzz: no target named {only:?}");
        std::process::exit(2);
    }
    // Panics are findings, reported once each below; the default hook's output would drown them.
    std::panic::set_hook(Box::new(|_| {}));
    let budget = Duration::from_secs(seconds) / chosen.len() as u32;
    let mut rng = Rng::new(seed);
    let mut report = Vec::new();
    let mut found_any = false;
    for t in chosen {
        let seeds = (t.seeds)();
        let (started, mut runs, mut findings) = (Instant::now(), 0u64, 0u64);
        while started.elapsed() < budget {
            let a = &seeds[rng.below(seeds.len())];
            let b = &seeds[rng.below(seeds.len())];
            let input = if runs < seeds.len() as u64 {
                a.clone()
            } else {
                mutate(&mut rng, a, b)
            };
            LARGEST.store(0, Ordering::Relaxed);
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| (t.run)(&input)));
            runs += 1;
            let largest = LARGEST.load(Ordering::Relaxed);
            let why = match outcome {
                Err(p) => Some(format!(
                    "panic: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
                Ok(()) if largest > ALLOCATION_LIMIT => {
                    Some(format!("a single allocation of {largest} bytes"))
                }
                Ok(()) => None,
            };
            if let Some(why) = why {
                findings += 1;
                found_any = true;
                // The first few of each target are kept and shown; the rest only counted.
                if findings <= KEPT_FINDINGS {
                    let _ = std::fs::create_dir_all(&findings_dir);
                    let file = format!("{findings_dir}/{}-{runs}", t.name);
                    let _ = std::fs::write(&file, &input);
                    eprintln!("hub-fuzz: {}: {why} (input in {file})", t.name);
                }
            }
        }
        eprintln!(
            "hub-fuzz: {}: {runs} executions, {findings} findings",
            t.name
        );
        report
            .push(serde_json::json!({"target": t.name, "executions": runs, "findings": findings}));
    }
    println!(
        "{}",
        serde_json::json!({"seed": seed, "seconds": seconds, "targets": report})
    );
    if found_any {
        std::process::exit(1);
    }
}
