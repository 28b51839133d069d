use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB},
    btf_maps::{Array, HashMap, LruHashMap, PerCpuHashMap, RingBuf},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_current_cgroup_id, bpf_get_socket_cookie, bpf_ktime_get_ns},
    },
    macros::{btf_map, cgroup_sock_addr, sock_ops},
    programs::{SockAddrContext, SockOpsContext},
};
use aya_log_ebpf::warn;
use hub_ebpf::{
    Endpoint, FourTuple, MAX_ORIGINS, MAX_VIPS, Origin, Settings, TRACE_RING_BYTES, TraceEvent,
    VERDICT_BYPASSED, VERDICT_ERROR, VERDICT_REDIRECTED, VipStats, VipTarget,
};

const ALLOW: i32 = 1;
const SOCK_STREAM: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const TCP_CLOSE: u32 = 7;

#[btf_map]
static HUB_SETTINGS: Array<Settings, 1> = Array::new();

/// VIP -> hub listener. Filled by user space, one entry per listener it has opened.
#[btf_map]
static HUB_VIPS: HashMap<Endpoint, VipTarget, { MAX_VIPS as usize }> = HashMap::new();

/// VIP -> counters, per CPU (no atomics needed; user space sums the CPUs). User space
/// creates the entry with the VIP; programs only increment.
#[btf_map]
static HUB_VIP_STATS: PerCpuHashMap<Endpoint, VipStats, { MAX_VIPS as usize }> =
    PerCpuHashMap::new();

/// Socket cookie -> origin, between connect() and the moment the source port is known.
/// LRU so a connect that fails before TCP_CONNECT_CB cannot leak an entry forever.
#[btf_map]
static HUB_PENDING: LruHashMap<u64, Origin, { MAX_ORIGINS as usize }> = LruHashMap::new();

/// Client/hub 4-tuple -> origin, read by the hub on accept, deleted when the socket closes.
#[btf_map]
static HUB_ORIGINS: LruHashMap<FourTuple, Origin, { MAX_ORIGINS as usize }> = LruHashMap::new();

/// Connects to a VIP, for `hub trace`; written only while `Settings::trace` is set.
#[btf_map]
static HUB_TRACE: RingBuf<TraceEvent, { TRACE_RING_BYTES as usize }> = RingBuf::new();

#[derive(Clone, Copy)]
enum Counter {
    Redirected,
    Bypassed,
    Errors,
    TraceLost,
}

/// Adds one to a VIP's counter on this CPU; returns the new count (0 without an entry).
#[inline(always)]
fn count(vip: &Endpoint, counter: Counter) -> u64 {
    let Some(stats) = HUB_VIP_STATS.get_ptr_mut(vip) else {
        return 0;
    };
    // SAFETY: the pointer comes from a successful lookup of this CPU's slot. Migration is
    // disabled while a program runs; a rare same-CPU preemption may lose an increment, which
    // is acceptable for diagnostic counters.
    unsafe {
        let field = match counter {
            Counter::Redirected => addr_of_mut!((*stats).redirected),
            Counter::Bypassed => addr_of_mut!((*stats).bypassed),
            Counter::Errors => addr_of_mut!((*stats).errors),
            Counter::TraceLost => addr_of_mut!((*stats).trace_lost),
        };
        *field += 1;
        *field
    }
}

/// Reads a 16-byte address one 4-byte word at a time (the verifier rejects wider ctx loads).
#[inline(always)]
unsafe fn read_words(words: *const [u32; 4]) -> [u32; 4] {
    let p = words.cast::<u32>();
    // SAFETY: the caller passes a pointer to a ctx field of four u32 words.
    unsafe {
        [
            read_volatile(p),
            read_volatile(p.add(1)),
            read_volatile(p.add(2)),
            read_volatile(p.add(3)),
        ]
    }
}

#[inline(always)]
unsafe fn write_words(words: *mut [u32; 4], value: [u32; 4]) {
    let p = words.cast::<u32>();
    // SAFETY: as read_words; sock_addr allows 4-byte writes to user_ip6[i].
    unsafe {
        write_volatile(p, value[0]);
        write_volatile(p.add(1), value[1]);
        write_volatile(p.add(2), value[2]);
        write_volatile(p.add(3), value[3]);
    }
}

/// The decision shared by connect4 and connect6: is this connect to a VIP, is it the hub's
/// own socket, and if redirected, remember who asked. Returns the new destination.
#[inline(always)]
fn redirect_target(ctx: &SockAddrContext, dst: &Endpoint) -> Option<Endpoint> {
    let sa = ctx.sock_addr;
    let settings = HUB_SETTINGS.get(0)?;
    if settings.enabled == 0 {
        return None;
    }
    // SAFETY: ctx fields of a live sock_addr context.
    if unsafe { (*sa).type_ } != SOCK_STREAM {
        return None;
    }
    // SAFETY: plain map lookup; the value is copied out immediately.
    let target = unsafe { *HUB_VIPS.get(dst)? };

    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: helper allowed in cgroup/connect programs.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let pid = (pid_tgid >> 32) as u32;

    // SAFETY: ctx->sk is always a valid socket for connect hooks.
    let sk = unsafe { (*sa).__bindgen_anon_1.sk };
    if !sk.is_null() && settings.bypass_mark != 0 && unsafe { (*sk).mark } == settings.bypass_mark {
        count(dst, Counter::Bypassed);
        if settings.trace != 0 {
            trace(
                ctx,
                dst,
                &Endpoint::default(),
                pid,
                cgroup_id,
                VERDICT_BYPASSED,
            );
        }
        return None;
    }

    // SAFETY: helper allowed in cgroup/connect programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let origin = Origin {
        original_dst: *dst,
        pid,
        cgroup_id,
    };
    let verdict = if HUB_PENDING.insert(cookie, origin, 0).is_err() {
        // Still redirect: the hub can serve the connection, it just will not know the origin.
        warn!(ctx, "hub: pending-origin map update failed");
        count(dst, Counter::Errors);
        VERDICT_ERROR
    } else {
        VERDICT_REDIRECTED
    };
    count(dst, Counter::Redirected);
    if settings.trace != 0 {
        trace(ctx, dst, &target.target, pid, cgroup_id, verdict);
    }
    Some(target.target)
}

/// Writes one connect to the trace ring buffer; a full buffer is counted, never waited on,
/// and said in the programs' log at the first loss on a CPU and every 1024th after.
#[inline(always)]
fn trace(
    ctx: &SockAddrContext,
    dst: &Endpoint,
    to: &Endpoint,
    pid: u32,
    cgroup_id: u64,
    verdict: u32,
) {
    let event = TraceEvent {
        // SAFETY: helper without arguments, allowed in every program type.
        time_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id,
        pid,
        verdict,
        original_dst: *dst,
        redirected_to: *to,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    if HUB_TRACE.output(&event, 0).is_err() {
        let lost = count(dst, Counter::TraceLost);
        if lost % 1024 == 1 {
            warn!(
                ctx,
                "hub trace: the trace ring buffer is full (the daemon is not reading it); {} connects on this CPU not traced",
                lost
            );
        }
    }
}

#[cgroup_sock_addr(connect4)]
pub fn hub_connect4(ctx: SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: 4-byte ctx reads.
    let (ip, port) = unsafe { ((*sa).user_ip4, (*sa).user_port) };
    let dst = Endpoint::v4(ip, u16::from_be(port as u16));
    if let Some(target) = redirect_target(&ctx, &dst) {
        if target.is_v4() {
            // SAFETY: 4-byte ctx writes allowed for connect4.
            unsafe {
                (*sa).user_ip4 = target.addr[3];
                (*sa).user_port = u32::from(target.port.to_be());
            }
        }
    }
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn hub_connect6(ctx: SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: word-wise ctx reads. IPv4-mapped destinations come out in the mapped form
    // that the VIP table uses for IPv4 VIPs, so one lookup covers both cases.
    let (addr, port) = unsafe { (read_words(addr_of!((*sa).user_ip6)), (*sa).user_port) };
    let dst = Endpoint {
        addr,
        port: u16::from_be(port as u16),
        _pad: 0,
    };
    if let Some(target) = redirect_target(&ctx, &dst) {
        // SAFETY: word-wise ctx writes allowed for connect6.
        unsafe {
            write_words(addr_of_mut!((*sa).user_ip6), target.addr);
            (*sa).user_port = u32::from(target.port.to_be());
        }
    }
    ALLOW
}

/// The connection's endpoints from the connecting socket's side: local = client.
#[inline(always)]
fn four_tuple(ctx: &SockOpsContext) -> Option<FourTuple> {
    let ops = ctx.ops;
    // SAFETY: 4-byte reads of sock_ops ctx fields. local_port is host order; remote_port is
    // network order in the upper half on little-endian, hence from_be on the whole word.
    unsafe {
        let local_port = (*ops).local_port as u16;
        let remote_port = u32::from_be((*ops).remote_port) as u16;
        match (*ops).family {
            AF_INET => Some(FourTuple {
                client: Endpoint::v4((*ops).local_ip4, local_port),
                hub: Endpoint::v4((*ops).remote_ip4, remote_port),
            }),
            AF_INET6 => Some(FourTuple {
                client: Endpoint {
                    addr: read_words(addr_of!((*ops).local_ip6)),
                    port: local_port,
                    _pad: 0,
                },
                hub: Endpoint {
                    addr: read_words(addr_of!((*ops).remote_ip6)),
                    port: remote_port,
                    _pad: 0,
                },
            }),
            _ => None,
        }
    }
}

#[sock_ops]
pub fn hub_sock_ops(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => on_tcp_connect(&ctx),
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == TCP_CLOSE => on_close(&ctx),
        _ => {}
    }
    1
}

/// The source port is now bound: re-key the pending origin by 4-tuple, and ask for a state
/// callback so the entry is removed when the socket closes.
#[inline(always)]
fn on_tcp_connect(ctx: &SockOpsContext) {
    // SAFETY: helper allowed for sock_ops.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast::<c_void>()) };
    // SAFETY: copied out of the map immediately.
    let Some(origin) = (unsafe { HUB_PENDING.get(cookie) }).copied() else {
        return;
    };
    let _ = HUB_PENDING.remove(cookie);
    let Some(tuple) = four_tuple(ctx) else {
        count(&origin.original_dst, Counter::Errors);
        return;
    };
    if HUB_ORIGINS.insert(tuple, origin, 0).is_err() {
        count(&origin.original_dst, Counter::Errors);
        return;
    }
    if ctx
        .set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
        .is_err()
    {
        count(&origin.original_dst, Counter::Errors);
    }
}

#[inline(always)]
fn on_close(ctx: &SockOpsContext) {
    if let Some(tuple) = four_tuple(ctx) {
        let _ = HUB_ORIGINS.remove(tuple);
    }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
