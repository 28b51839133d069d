//! Transparent interception: load the eBPF object, fill its maps, attach it to the
//! configured cgroup with process-owned links, and answer "where did this connection come
//! from" for accepted sockets.
//!
//! Links are never pinned: if the hub dies, the kernel drops them and clients go straight
//! to the cloud again (fail open). Maps are pinned under `intercept.pinPath` so `bpftool`
//! and `hub bpf status` can read them; stale pins are removed at start and on shutdown.
pub mod bypass;
pub mod cgroup2;
pub mod cgroup_tree;
pub mod discover;
pub mod netdev;
pub mod origin;
pub mod scope;
pub mod sock_diag;
pub mod status;
mod sys;
pub mod trace;

use std::{
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuHashMap, PerCpuValues, RingBuf},
    programs::{CgroupAttachMode, CgroupSockAddr, SockOps},
};
use hub_ebpf::{
    Endpoint, FourTuple, MAP_ORIGINS, MAP_PENDING, MAP_SETTINGS, MAP_TRACE, MAP_VIP_STATS,
    MAP_VIPS, Origin, PROG_CONNECT4, PROG_CONNECT6, PROG_SOCK_OPS, Settings, VipStats, VipTarget,
};
pub use origin::{ConnOrigin, OriginLookup};
pub use status::{BpfStatus, read_status, uninstall};

use crate::EBPF_OBJECT;

#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("bpffs is not mounted at {0} (mount -t bpf bpf /sys/fs/bpf)")]
    NoBpffs(PathBuf),
    #[error("{0} is not a cgroup v2 directory")]
    NotCgroup2(PathBuf),
    #[error("cannot use {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "loading the eBPF object failed (needs root or CAP_BPF+CAP_NET_ADMIN, kernel >= 5.7 with BTF): {0}"
    )]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("pinning map {name}: {source}")]
    Pin {
        name: &'static str,
        source: aya::pin::PinError,
    },
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    #[error("VIP {vip}: {reason}")]
    Vip { vip: SocketAddr, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InterceptError + '_ {
    move |source| InterceptError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Names of the maps the hub pins, i.e. everything `hub uninstall` removes from the pin dir.
pub const PINNED_MAPS: [&str; 5] = [
    MAP_VIPS,
    MAP_VIP_STATS,
    MAP_SETTINGS,
    MAP_PENDING,
    MAP_ORIGINS,
];

/// Checks what interception needs, saying plainly what is missing.
pub fn probe(cgroup: &Path, pin_dir: &Path) -> Result<(), InterceptError> {
    let bpffs = pin_dir.parent().unwrap_or(Path::new("/sys/fs/bpf"));
    match sys::fs_magic(bpffs) {
        Ok(m) if m == sys::BPF_FS_MAGIC => {}
        _ => return Err(InterceptError::NoBpffs(bpffs.to_owned())),
    }
    match sys::fs_magic(cgroup) {
        Ok(m) if m == sys::CGROUP2_SUPER_MAGIC => Ok(()),
        Ok(_) => Err(InterceptError::NotCgroup2(cgroup.to_owned())),
        Err(e) => Err(io_err(cgroup)(e)),
    }
}

/// A loaded and attached interception. Dropping it detaches everything and removes pins.
pub struct Interceptor {
    // Field order matters on drop: maps and programs (with their links) go with `ebpf`.
    vips: Mutex<HashMap<MapData, Endpoint, VipTarget>>,
    stats: Mutex<PerCpuHashMap<MapData, Endpoint, VipStats>>,
    settings: Arc<SettingsMap>,
    origins: HashMap<MapData, FourTuple, Origin>,
    tracer: Arc<trace::Tracer>,
    trace_reader: Option<tokio::task::JoinHandle<()>>,
    /// Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    pin_dir: PathBuf,
    cgroup: PathBuf,
}

/// The programs' settings: written whole whenever one switch changes.
struct SettingsMap {
    map: Mutex<(Array<MapData, Settings>, Settings)>,
}

impl SettingsMap {
    fn update(&self, change: impl FnOnce(&mut Settings)) -> Result<(), InterceptError> {
        let mut guard = self.map.lock().unwrap();
        let (map, settings) = &mut *guard;
        change(settings);
        map.set(0, *settings, 0)
            .map_err(|source| InterceptError::Map {
                name: MAP_SETTINGS,
                source,
            })
    }
}

impl Interceptor {
    /// Loads the object, pins its maps and attaches the programs to `cgroup`. The programs
    /// stay inert until [`Interceptor::enable`], so VIPs can be added first.
    pub fn load(cgroup: &Path, pin_dir: &Path, bypass_mark: u32) -> Result<Self, InterceptError> {
        probe(cgroup, pin_dir)?;
        remove_pins(pin_dir);
        std::fs::create_dir_all(pin_dir).map_err(io_err(pin_dir))?;

        let mut ebpf = EbpfLoader::new().load(EBPF_OBJECT)?;
        for name in PINNED_MAPS {
            let map = ebpf.map(name).ok_or(InterceptError::Missing(name))?;
            map.pin(pin_dir.join(name))
                .map_err(|source| InterceptError::Pin { name, source })?;
        }
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(InterceptError::Missing(name))
        };
        let map_err = |name| move |source| InterceptError::Map { name, source };
        let vips = HashMap::try_from(take(&mut ebpf, MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
        let stats = PerCpuHashMap::try_from(take(&mut ebpf, MAP_VIP_STATS)?)
            .map_err(map_err(MAP_VIP_STATS))?;
        let settings =
            Array::try_from(take(&mut ebpf, MAP_SETTINGS)?).map_err(map_err(MAP_SETTINGS))?;
        let origins =
            HashMap::try_from(take(&mut ebpf, MAP_ORIGINS)?).map_err(map_err(MAP_ORIGINS))?;
        let ring = RingBuf::try_from(take(&mut ebpf, MAP_TRACE)?).map_err(map_err(MAP_TRACE))?;
        let settings = Arc::new(SettingsMap {
            map: Mutex::new((
                settings,
                Settings {
                    bypass_mark,
                    ..Settings::default()
                },
            )),
        });
        let switch = settings.clone();
        let tracer = Arc::new(trace::Tracer::new(
            cgroup,
            Box::new(move |on| {
                if let Err(e) = switch.update(|s| s.trace = u32::from(on)) {
                    tracing::warn!(
                        "cannot switch tracing {}: {e}",
                        if on { "on" } else { "off" }
                    );
                }
            }),
        ));
        let trace_reader = trace::spawn_reader(ring, tracer.clone());
        let logs = trace::LogTee(tracer.clone());
        if let Err(e) = aya_log::EbpfLogger::init_with_logger(&mut ebpf, logs).map(spawn_log_bridge)
        {
            tracing::warn!("eBPF log bridge unavailable: {e}");
        }

        let cgroup_file = File::open(cgroup).map_err(io_err(cgroup))?;
        for name in [PROG_CONNECT4, PROG_CONNECT6] {
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(InterceptError::Missing(name))?
                .try_into()
                .map_err(|source| InterceptError::Program { name, source })?;
            prog.load()
                .and_then(|()| {
                    prog.attach(&cgroup_file, CgroupAttachMode::Single)
                        .map(drop)
                })
                .map_err(|source| InterceptError::Program { name, source })?;
        }
        let sock_ops: &mut SockOps = ebpf
            .program_mut(PROG_SOCK_OPS)
            .ok_or(InterceptError::Missing(PROG_SOCK_OPS))?
            .try_into()
            .map_err(|source| InterceptError::Program {
                name: PROG_SOCK_OPS,
                source,
            })?;
        sock_ops
            .load()
            .and_then(|()| {
                sock_ops
                    .attach(&cgroup_file, CgroupAttachMode::Single)
                    .map(drop)
            })
            .map_err(|source| InterceptError::Program {
                name: PROG_SOCK_OPS,
                source,
            })?;

        tracing::info!(cgroup = %cgroup.display(), pins = %pin_dir.display(), "eBPF programs attached");
        Ok(Interceptor {
            vips: Mutex::new(vips),
            stats: Mutex::new(stats),
            settings,
            origins,
            tracer,
            trace_reader,
            _ebpf: ebpf,
            pin_dir: pin_dir.to_owned(),
            cgroup: cgroup.to_owned(),
        })
    }

    /// Redirects connects to `vip` to `target` (a listener the caller has already opened).
    pub fn add_vip(
        &self,
        vip: SocketAddr,
        target: SocketAddr,
        index: u32,
    ) -> Result<(), InterceptError> {
        if vip.is_ipv4() != target.is_ipv4() {
            return Err(InterceptError::Vip {
                vip,
                reason: format!("listener {target} is of the other address family"),
            });
        }
        let key = origin::endpoint(vip);
        // The per-CPU counters need the possible CPUs, which aya reads from sysfs: a hub
        // whose /sys lacks them (a container or chroot without sysfs) is told so by path.
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| InterceptError::Vip {
            vip,
            reason: format!("cannot read {path}: {e}"),
        })?;
        let zero = PerCpuValues::try_from(vec![VipStats::default(); cpus]).map_err(|e| {
            InterceptError::Vip {
                vip,
                reason: e.to_string(),
            }
        })?;
        let map_err = |name| move |source| InterceptError::Map { name, source };
        self.stats
            .lock()
            .unwrap()
            .insert(key, zero, 0)
            .map_err(map_err(MAP_VIP_STATS))?;
        let value = VipTarget {
            target: origin::endpoint(target),
            index,
        };
        self.vips
            .lock()
            .unwrap()
            .insert(key, value, 0)
            .map_err(map_err(MAP_VIPS))
    }

    /// Stops redirecting `vip`; call before closing its listener.
    pub fn remove_vip(&self, vip: SocketAddr) {
        let key = origin::endpoint(vip);
        let _ = self.vips.lock().unwrap().remove(&key);
    }

    /// Turns the programs on (or off) by writing the settings map.
    pub fn set_enabled(&self, enabled: bool) -> Result<(), InterceptError> {
        self.settings.update(|s| s.enabled = u32::from(enabled))
    }

    /// Where `hub trace` listens.
    pub fn tracer(&self) -> &Arc<trace::Tracer> {
        &self.tracer
    }
}

impl OriginLookup for Interceptor {
    fn lookup(&self, client: SocketAddr, local: SocketAddr) -> Option<ConnOrigin> {
        let o = self
            .origins
            .get(&origin::four_tuple(client, local), 0)
            .ok()?;
        Some(ConnOrigin {
            original_dst: origin::socket_addr(&o.original_dst),
            pid: o.pid,
            cgroup_id: o.cgroup_id,
        })
    }
}

impl Drop for Interceptor {
    fn drop(&mut self) {
        let _ = self.set_enabled(false);
        if let Some(reader) = &self.trace_reader {
            reader.abort();
        }
        remove_pins(&self.pin_dir);
        tracing::info!(cgroup = %self.cgroup.display(), "eBPF programs detached, pins removed");
    }
}

/// Removes the hub's pins (and the directory if it is then empty). Missing pins are fine.
pub(crate) fn remove_pins(pin_dir: &Path) {
    for name in PINNED_MAPS {
        let _ = std::fs::remove_file(pin_dir.join(name));
    }
    let _ = std::fs::remove_dir(pin_dir);
}

/// Forwards aya-log records from the programs to `log` (which tracing picks up) and to
/// `hub trace --logs`.
fn spawn_log_bridge(logger: aya_log::EbpfLogger<trace::LogTee>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        // SAFETY: the fd belongs to `logger`, which the AsyncFd owns for as long as it is
        // registered.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        };
        let Ok(mut fd) = registered else {
            return;
        };
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}
