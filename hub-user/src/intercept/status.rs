//! `hub bpf status` and `hub uninstall`: read what a hub pinned, and remove it.
//!
//! Works from the pins alone, so it needs no running daemon. Programs and links are found
//! through the kernel's lists and matched to this pin dir by the map ids they use, so two
//! hubs (or two tests) with different pin dirs never see or touch each other's objects.
use std::{collections::HashSet, path::Path};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuHashMap};
use hub_ebpf::{
    Endpoint, FourTuple, MAP_ORIGINS, MAP_PENDING, MAP_SETTINGS, MAP_VIP_STATS, MAP_VIPS, Origin,
    Settings, VipStats, VipTarget,
};
use serde::{Deserialize, Serialize};

use super::{PINNED_MAPS, origin::socket_addr, remove_pins, sys};

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct BpfStatus {
    pub pin_dir: String,
    /// False when nothing is pinned there (no hub running, or uninstalled).
    pub pinned: bool,
    pub enabled: bool,
    /// A `hub trace` is listening: connects to VIPs are written to the trace ring buffer.
    #[serde(default)]
    pub tracing: bool,
    pub bypass_mark: u32,
    pub vips: Vec<VipRow>,
    /// Redirected connections currently open (origin entries).
    pub origins_in_flight: usize,
    /// Redirected connects whose source port is not bound yet.
    pub pending: usize,
    pub programs: Vec<ProgramRow>,
    pub links: Vec<LinkRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VipRow {
    pub vip: String,
    pub target: String,
    pub redirected: u64,
    pub bypassed: u64,
    pub errors: u64,
    /// Trace events lost because `hub trace` fell behind.
    #[serde(default)]
    pub trace_lost: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProgramRow {
    pub id: u32,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkRow {
    pub id: u32,
    pub program_id: u32,
    pub program: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct StatusError {
    what: String,
    reason: String,
}

fn open(pin_dir: &Path, name: &str) -> Result<Map, StatusError> {
    MapData::from_pin(pin_dir.join(name))
        .and_then(Map::from_map_data)
        .map_err(|e| StatusError {
            what: format!("{}/{name}", pin_dir.display()),
            reason: e.to_string(),
        })
}

fn bad(name: &str) -> impl FnOnce(aya::maps::MapError) -> StatusError + '_ {
    move |e| StatusError {
        what: name.to_string(),
        reason: e.to_string(),
    }
}

/// Reads the pinned maps under `pin_dir` and the programs and links that use them.
pub fn read_status(pin_dir: &Path) -> Result<BpfStatus, StatusError> {
    let mut status = BpfStatus {
        pin_dir: pin_dir.display().to_string(),
        ..Default::default()
    };
    if !pin_dir.join(MAP_VIPS).exists() {
        return Ok(status);
    }
    status.pinned = true;

    let settings: Array<_, Settings> =
        Array::try_from(open(pin_dir, MAP_SETTINGS)?).map_err(bad(MAP_SETTINGS))?;
    let s = settings.get(&0, 0).map_err(bad(MAP_SETTINGS))?;
    status.enabled = s.enabled != 0;
    status.tracing = s.trace != 0;
    status.bypass_mark = s.bypass_mark;

    let vips: HashMap<_, Endpoint, VipTarget> =
        HashMap::try_from(open(pin_dir, MAP_VIPS)?).map_err(bad(MAP_VIPS))?;
    let stats: PerCpuHashMap<_, Endpoint, VipStats> =
        PerCpuHashMap::try_from(open(pin_dir, MAP_VIP_STATS)?).map_err(bad(MAP_VIP_STATS))?;
    for entry in vips.iter() {
        let (key, target) = entry.map_err(bad(MAP_VIPS))?;
        let mut row = VipRow {
            vip: socket_addr(&key).to_string(),
            target: socket_addr(&target.target).to_string(),
            redirected: 0,
            bypassed: 0,
            errors: 0,
            trace_lost: 0,
        };
        if let Ok(per_cpu) = stats.get(&key, 0) {
            for c in per_cpu.iter() {
                row.redirected += c.redirected;
                row.bypassed += c.bypassed;
                row.errors += c.errors;
                row.trace_lost += c.trace_lost;
            }
        }
        status.vips.push(row);
    }
    status.vips.sort_by(|a, b| a.vip.cmp(&b.vip));

    let origins: HashMap<_, FourTuple, Origin> =
        HashMap::try_from(open(pin_dir, MAP_ORIGINS)?).map_err(bad(MAP_ORIGINS))?;
    status.origins_in_flight = origins.keys().count();
    let pending: HashMap<_, u64, Origin> =
        HashMap::try_from(open(pin_dir, MAP_PENDING)?).map_err(bad(MAP_PENDING))?;
    status.pending = pending.keys().count();

    let (programs, links) = programs_and_links(pin_dir);
    status.programs = programs;
    status.links = links;
    Ok(status)
}

/// Ids of the maps pinned in `pin_dir`.
fn pinned_map_ids(pin_dir: &Path) -> HashSet<u32> {
    PINNED_MAPS
        .iter()
        .filter_map(|name| MapData::from_pin(pin_dir.join(name)).ok())
        .filter_map(|m| m.info().ok().map(|i| i.id()))
        .collect()
}

/// Programs using this pin dir's maps, and the links attaching them.
fn programs_and_links(pin_dir: &Path) -> (Vec<ProgramRow>, Vec<LinkRow>) {
    let ours = pinned_map_ids(pin_dir);
    let mut programs = Vec::new();
    for info in aya::programs::loaded_programs().flatten() {
        let uses_ours = info
            .map_ids()
            .ok()
            .flatten()
            .is_some_and(|ids| ids.iter().any(|id| ours.contains(id)));
        if uses_ours {
            programs.push(ProgramRow {
                id: info.id(),
                name: info.name_as_str().unwrap_or("?").to_string(),
            });
        }
    }
    let mut links = Vec::new();
    for link in aya::programs::loaded_links().flatten() {
        if let Some(p) = programs.iter().find(|p| p.id == link.program_id()) {
            links.push(LinkRow {
                id: link.id(),
                program_id: p.id,
                program: p.name.clone(),
            });
        }
    }
    programs.sort_by_key(|p| p.id);
    links.sort_by_key(|l| l.id);
    (programs, links)
}

/// What `hub uninstall` did.
#[derive(Debug, Default, Serialize)]
pub struct Uninstalled {
    pub links_detached: usize,
    pub pins_removed: usize,
    /// `hub0` and `lo:hub` addresses removed.
    pub netdevs_removed: usize,
}

/// Detaches every link of this pin dir's programs (also those a running hub holds) and
/// removes the pins. Safe to run twice: the second run finds nothing and succeeds.
pub fn uninstall(pin_dir: &Path) -> Result<Uninstalled, std::io::Error> {
    let mut done = Uninstalled::default();
    let (_, links) = programs_and_links(pin_dir);
    for link in links {
        match sys::detach_link(link.id) {
            Ok(()) => done.links_detached += 1,
            // Gone in the meantime (its hub exited): nothing to do.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    done.pins_removed = PINNED_MAPS
        .iter()
        .filter(|name| pin_dir.join(name).exists())
        .count();
    remove_pins(pin_dir);
    done.netdevs_removed = super::netdev::remove_all()?;
    Ok(done)
}

/// Human-readable form for `hub bpf status`.
pub fn render(status: &BpfStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if !status.pinned {
        let _ = writeln!(
            out,
            "interception: not installed (no pins in {})",
            status.pin_dir
        );
        return out;
    }
    let _ = writeln!(
        out,
        "interception: {}{} (pins {}, bypass mark {:#x})",
        if status.enabled {
            "enabled"
        } else {
            "disabled"
        },
        if status.tracing { ", traced" } else { "" },
        status.pin_dir,
        status.bypass_mark
    );
    let _ = writeln!(out, "programs:");
    for p in &status.programs {
        let _ = writeln!(out, "  {:>6}  {}", p.id, p.name);
    }
    let _ = writeln!(out, "links:");
    if status.links.is_empty() {
        let _ = writeln!(out, "  (none attached)");
    }
    for l in &status.links {
        let _ = writeln!(out, "  {:>6}  prog {} ({})", l.id, l.program_id, l.program);
    }
    let _ = writeln!(
        out,
        "{:<40} {:<40} {:>10} {:>9} {:>7} {:>10}",
        "VIP", "HUB LISTENER", "REDIRECTED", "BYPASSED", "ERRORS", "TRACE LOST"
    );
    for v in &status.vips {
        let _ = writeln!(
            out,
            "{:<40} {:<40} {:>10} {:>9} {:>7} {:>10}",
            v.vip, v.target, v.redirected, v.bypassed, v.errors, v.trace_lost
        );
    }
    let _ = writeln!(
        out,
        "connections in flight: {} (pending source port: {})",
        status.origins_in_flight, status.pending
    );
    out
}
