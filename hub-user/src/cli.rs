//! The command line: `hub run | status | trace | cache | bpf status | install | approver |
//! uninstall`.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{admin, config::Config, daemon, intercept, node_layout, owner};

#[derive(Parser)]
#[command(
    name = "hub",
    version = crate::VERSION,
    about = "Node agent between a node's clients and the cloud kube-apiserver",
    long_about = "hub runs on every edge node. An eBPF program redirects connections aimed at the \
apiserver (the kubernetes Service, the servers in kubelet/kube-proxy kubeconfigs, configured VIPs) \
to it, with no kubeconfig changes; it forwards them to the cloud and keeps the node working when \
the cloud is unreachable. If hub dies, its eBPF links die with it and traffic goes straight to the \
cloud again."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run(RunArgs),
    /// Ask a running hub (its admin port) for its state.
    Status {
        #[command(flatten)]
        admin: AdminAt,
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Stream every connect to an apiserver address live, as the eBPF connect hook sees it:
    /// time, pid, command, pod (or cgroup), the address asked for, where it was sent and the
    /// verdict (redirected; bypassed: the hub's own connection; error: redirected without
    /// its origin recorded). Asks the running hub's admin port; root on the node only.
    /// Nothing is traced while no one listens.
    Trace(TraceArgs),
    /// Read the local cache: directly while the daemon is stopped, through its admin port
    /// while it runs.
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
    /// eBPF interception: programs, links, the VIP table and its counters.
    Bpf {
        #[command(subcommand)]
        command: BpfCommand,
    },
    /// Put a copy of the hub on the host, so a node that reboots with no cloud still has its
    /// hub: the binary and configuration into the state directory, a systemd unit (started
    /// at boot, before the kubelet) into the host's unit directory. The copy serves only
    /// while no DaemonSet hub does. Run by the DaemonSet's init container.
    Install(InstallArgs),
    /// Run in the cloud: approve nodes' kubelet-serving CSRs whose every name and address
    /// is one that node's hub needs (its Node addresses, the hub addresses, the apiserver's
    /// in-cluster names, the kubernetes Service IPs and VIPs); deny the rest with the reason
    /// on the CSR. Reaches the apiserver in-cluster by default.
    Approver(ApproverArgs),
    /// Convert one Kubernetes object or list between protobuf and JSON, as the
    /// hub does for its clients: e.g. a value of the coordinator's etcd
    /// (`etcdctl get /registry/pods/NS/NAME --print-value-only | hub convert`). Reads FILE or
    /// stdin; protobuf (it starts with `k8s\0`) becomes JSON, JSON becomes protobuf.
    Convert(ConvertArgs),
    /// Detach every program the hub attached, remove every pin it made and the hub address
    /// holder it created (hub0, or lo:hub addresses). Safe to run twice.
    Uninstall {
        /// bpffs directory of the pins (intercept.pinPath).
        #[arg(long, default_value = "/sys/fs/bpf/hub")]
        pin_path: PathBuf,
    },
}

#[derive(Subcommand)]
enum BpfCommand {
    /// Show what is pinned, attached and counted (the same maps `bpftool map dump pinned` reads).
    Status {
        /// bpffs directory of the pins (intercept.pinPath).
        #[arg(long, default_value = "/sys/fs/bpf/hub")]
        pin_path: PathBuf,
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Args)]
struct InstallArgs {
    /// The configuration to install (its nodeName and the in-cluster Service VIP are
    /// written into the copy). Not needed with --uninstall.
    #[arg(long, short, required_unless_present = "uninstall")]
    config: Option<PathBuf>,
    /// The node's name (e.g. from the downward API).
    #[arg(long)]
    node_name: Option<String>,
    /// The host's systemd unit directory, as this process sees it.
    #[arg(long, default_value = "/etc/systemd/system")]
    unit_dir: PathBuf,
    /// The state directory (cache.dir) for --uninstall; an install uses the config's.
    #[arg(long, default_value = "/var/lib/hub")]
    dir: PathBuf,
    /// Remove the unit, the binary and the installed configuration (the cache stays).
    #[arg(long)]
    uninstall: bool,
    /// The host's init system: `auto` installs the unit only where systemd booted the host
    /// (as sd_booted(3): `<host-run>/systemd/system` is a directory), `systemd` always,
    /// `none` never (the node then relies on the DaemonSet alone).
    #[arg(long, value_enum, default_value = "auto")]
    init_system: InitSystem,
    /// The host's /run, as this process sees it (for --init-system auto).
    #[arg(long, default_value = "/run")]
    host_run: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum InitSystem {
    Auto,
    Systemd,
    None,
}

/// Where a running hub's admin port is.
#[derive(Args)]
struct AdminAt {
    /// Admin address of the hub (default: listen.admin of --config, else 127.0.0.1:10267).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// The hub's configuration file: its listen.admin is the address to ask.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

impl AdminAt {
    fn address(&self) -> Result<SocketAddr, String> {
        if let Some(a) = self.admin {
            return Ok(a);
        }
        match &self.config {
            Some(path) => Config::load(path)
                .map(|c| c.listen.admin)
                .map_err(|e| format!("{}: {e}", path.display())),
            None => Ok(crate::config::DEFAULT_ADMIN
                .parse()
                .expect("the default admin address")),
        }
    }
}

#[derive(Args)]
struct TraceArgs {
    #[command(flatten)]
    admin: AdminAt,
    /// `json`: one JSON object per line, as the hub sends them.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Only connects by this process id; repeatable.
    #[arg(long)]
    pid: Vec<u32>,
    /// Only connects from this cgroup: an id, or a directory (which includes every cgroup
    /// below it, e.g. /sys/fs/cgroup/kubepods.slice for all pods); repeatable.
    #[arg(long)]
    cgroup: Vec<crate::trace_follow::CgroupFilter>,
    /// Only connects to this apiserver address (ip:port); repeatable.
    #[arg(long)]
    vip: Vec<SocketAddr>,
    /// Also show the eBPF programs' own log messages.
    #[arg(long)]
    logs: bool,
    /// Exit after this many lines (default: follow until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Args)]
struct CacheWhere {
    /// The hub's state directory (cache.dir). A running hub is asked through the
    /// owner-only socket there (inspect.sock); a stopped one's store is read directly.
    #[arg(long, default_value = "/var/lib/hub")]
    dir: PathBuf,
    /// Only objects cached for this component (kubelet, kube-proxy, ...).
    #[arg(long)]
    component: Option<String>,
}

#[derive(Args)]
struct ApproverArgs {
    /// The apiserver (default: the in-cluster address from KUBERNETES_SERVICE_HOST/PORT).
    #[arg(long)]
    server: Option<String>,
    /// CA of the apiserver's certificate.
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )]
    ca_file: PathBuf,
    /// Bearer token of the approver's service account.
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    token_file: PathBuf,
    /// The hubs' address (intercept.hubAddress); repeat for hubAddress6.
    #[arg(long = "hub-address", default_value = "169.254.2.1")]
    hub_addresses: Vec<std::net::IpAddr>,
    /// A VIP beyond the kubernetes Service's cluster IPs; repeatable.
    #[arg(long = "vip")]
    vips: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain, for kubernetes.default.svc.<domain>.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Seconds between looks at pending CSRs.
    #[arg(long, default_value_t = 5)]
    interval: u64,
    /// One pass, then exit (prints how many were approved and denied).
    #[arg(long)]
    once: bool,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// List cached objects: component, credential, key, resourceVersion, encoding, size.
    Ls {
        #[command(flatten)]
        at: CacheWhere,
        /// Only this resource (`pods`, or `group/version/resource` such as `/v1/pods`).
        #[arg(long)]
        resource: Option<String>,
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Print one cached object; KEY is as `hub cache ls` shows it, e.g. /v1/pods/default/web-0.
    Get {
        key: String,
        #[command(flatten)]
        at: CacheWhere,
        /// Print a Secret's data as cached (by default its values are redacted).
        #[arg(long)]
        show_secrets: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Args)]
struct RunArgs {
    /// YAML configuration file (see README for every key and its default).
    #[arg(long, short)]
    config: PathBuf,
    /// Override nodeName.
    #[arg(long)]
    node_name: Option<String>,
    /// Override cloud.servers (repeat for several).
    #[arg(long = "cloud-server")]
    cloud_servers: Vec<String>,
    /// Override cloud.kubeconfig: the kubelet's kubeconfig where the node keeps it
    /// elsewhere than its distribution's layout (the kubelet's own --kubeconfig).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Override intercept.cgroupPath.
    #[arg(long)]
    cgroup_path: Option<PathBuf>,
    /// Override intercept.pinPath.
    #[arg(long)]
    pin_path: Option<PathBuf>,
    /// Turn interception off (intercept.enabled: false).
    #[arg(long)]
    no_intercept: bool,
    /// This is the copy `hub install` put on the host (systemd starts it at boot, before the
    /// kubelet): serve only while no DaemonSet hub claims the node, hand over when one
    /// starts, stand by until it stops.
    #[arg(long)]
    host_instance: bool,
    /// Only check: parse and validate the configuration, find what it leaves unset on the
    /// node (kubelet kubeconfig and client CA by distribution layout, the cgroup2
    /// hierarchy), check that the files it names hold what the hub reads, print what was
    /// found and `config ok`, and exit (2 on a problem).
    #[arg(long)]
    check: bool,
    /// With --check: the node's root directory, for checking a node laid out elsewhere
    /// (its files and its proc/self/mountinfo are read under it).
    #[arg(long, default_value = "/", requires = "check")]
    node_root: PathBuf,
    /// Override listen.admin.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Log filter (tracing EnvFilter syntax), also from RUST_LOG.
    #[arg(long, default_value = "info")]
    log: String,
}

/// Exit code for configuration errors, as the contract says.
const EXIT_CONFIG: u8 = 2;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::Status { admin, output } => with_runtime(async move {
            let report = admin::fetch_status(admin.address()?)
                .await
                .map_err(|e| e.to_string())?;
            Ok(match output {
                Output::Json => serde_json::to_string_pretty(&report).unwrap(),
                Output::Text => admin::render(&report),
            })
        }),
        Command::Trace(args) => trace(args),
        Command::Cache { command } => with_runtime(cache_command(command)),
        Command::Bpf {
            command: BpfCommand::Status { pin_path, output },
        } => print_result(
            intercept::read_status(&pin_path)
                .map_err(|e| e.to_string())
                .map(|s| match output {
                    Output::Json => serde_json::to_string_pretty(&s).unwrap(),
                    Output::Text => intercept::status::render(&s),
                }),
        ),
        Command::Install(args) => print_result(install(args)),
        Command::Approver(args) => {
            init_tracing("info");
            with_runtime(approver(args))
        }
        Command::Convert(args) => convert(args),
        Command::Uninstall { pin_path } => print_result(
            intercept::uninstall(&pin_path)
                .map(|u| {
                    format!(
                        "detached {} link(s), removed {} pin(s) from {}, removed {} hub address holder(s)",
                        u.links_detached,
                        u.pins_removed,
                        pin_path.display(),
                        u.netdevs_removed
                    )
                })
                .map_err(|e| format!("uninstall: {e}")),
        ),
    }
}

#[derive(Args)]
struct ConvertArgs {
    /// The object to convert (default: stdin).
    file: Option<PathBuf>,
    /// Write the JSON of this kube-apiserver minor version (1.34 and later leave a zero
    /// creationTimestamp out); default: the current one.
    #[arg(long)]
    server_minor: Option<u32>,
    /// Convert this many times and print the mean time per conversion on stderr (what a
    /// conversion costs on this node).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
}

fn convert(args: ConvertArgs) -> ExitCode {
    use std::io::{Read, Write};
    let mut input = Vec::new();
    let read = match &args.file {
        Some(path) => std::fs::read(path).map(|b| input = b),
        None => std::io::stdin().read_to_end(&mut input).map(drop),
    };
    if let Err(e) = read {
        eprintln!("hub: reading the input: {e}");
        return ExitCode::FAILURE;
    }
    let style = args.server_minor.map_or_else(
        crate::convert::Style::default,
        crate::convert::Style::for_minor,
    );
    let once = || {
        if input.starts_with(crate::kproto::MAGIC) {
            crate::convert::to_json(&input, style)
        } else {
            crate::convert::to_protobuf(&input)
        }
    };
    let started = std::time::Instant::now();
    let mut out = once();
    for _ in 1..args.repeat {
        out = once();
    }
    if args.repeat > 1 {
        eprintln!(
            "{:.2} us per conversion ({} conversions)",
            started.elapsed().as_secs_f64() * 1e6 / f64::from(args.repeat),
            args.repeat
        );
    }
    match out {
        Ok(bytes) => {
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(&bytes)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hub: {e}");
            ExitCode::FAILURE
        }
    }
}

fn install(args: InstallArgs) -> Result<String, String> {
    use crate::install::{Target, install, uninstall};
    let Some(config) = args.config.filter(|_| !args.uninstall) else {
        return uninstall(&Target {
            state_dir: args.dir,
            unit_dir: args.unit_dir,
        });
    };
    let vips: Vec<SocketAddr> = intercept::discover::service_from_env()
        .into_iter()
        .collect();
    let why_not = match args.init_system {
        InitSystem::Systemd => None,
        InitSystem::None => Some("--init-system none".to_string()),
        InitSystem::Auto => crate::install::not_booted_by_systemd(&args.host_run),
    };
    match why_not {
        None => install(&config, args.node_name.as_deref(), &vips, &args.unit_dir),
        Some(why) => Ok(crate::install::not_installed(&why)),
    }
}

fn trace(args: TraceArgs) -> ExitCode {
    use crate::trace_follow::{Filter, follow};
    let filter = Filter {
        pids: args.pid,
        cgroups: args.cgroup,
        vips: args.vip,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let json = matches!(args.output, Output::Json);
    let admin = match args.admin.address() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hub: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut out = std::io::stdout().lock();
    let followed = rt.block_on(follow(
        admin, args.logs, &filter, json, args.count, &mut out,
    ));
    match followed {
        Ok(n) if args.count.is_none_or(|want| n >= want) => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("hub: the hub ended the trace (did it stop?)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("hub: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn approver(args: ApproverArgs) -> Result<String, String> {
    use crate::approver::{Connection, Policy, run};
    let server = match args.server {
        Some(s) => s,
        None => {
            let env =
                |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set: give --server"));
            let host = env("KUBERNETES_SERVICE_HOST")?;
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            format!("https://{host}:{}", env("KUBERNETES_SERVICE_PORT")?)
        }
    };
    let connection = Connection {
        server,
        ca_file: args.ca_file,
        token_file: args.token_file,
    };
    let policy = Policy {
        hub_addresses: args.hub_addresses,
        names: Policy::in_cluster_names(&args.cluster_domain),
        vips: args.vips,
    };
    let every = std::time::Duration::from_secs(args.interval.max(1));
    let pass = run(connection, policy, every, args.once).await?;
    Ok(format!(
        "approved {}, denied {}",
        pass.approved, pass.denied
    ))
}

/// `hub cache ls|get`: the store file if it can be opened, else the running hub.
async fn cache_command(command: CacheCommand) -> Result<String, String> {
    use crate::cache::{
        inspect,
        store::{Store, StoreError},
    };
    let at = match &command {
        CacheCommand::Ls { at, .. } | CacheCommand::Get { at, .. } => at,
    };
    // The file directly when no daemon holds it; otherwise (or when there is no store at
    // --dir) the running hub's inspection socket.
    let (local, why_not_local) = match Store::open_read_only(&at.dir) {
        Ok(s) => (Some(s), String::new()),
        Err(e @ (StoreError::InUse { .. } | StoreError::Missing { .. })) => (None, e.to_string()),
        Err(e) => return Err(e.to_string()),
    };
    let from_admin = |e: admin::AdminClientError| format!("{why_not_local}; and {e}");
    let socket = admin::inspect_socket(&at.dir);
    let enc = |s: &str| {
        s.replace('%', "%25")
            .replace('&', "%26")
            .replace('+', "%2B")
    };
    let component = at.component.as_deref();
    match command {
        CacheCommand::Ls {
            ref resource,
            output,
            ..
        } => {
            let entries = match &local {
                Some(store) => inspect::list(store, component, resource.as_deref())
                    .map_err(|e| e.to_string())?,
                None => {
                    let q = format!(
                        "/v1/cache/ls?component={}&resource={}",
                        enc(component.unwrap_or("")),
                        enc(resource.as_deref().unwrap_or(""))
                    );
                    let body = admin::fetch_inspect(&socket, &q)
                        .await
                        .map_err(from_admin)?;
                    serde_json::from_slice(&body).map_err(|e| e.to_string())?
                }
            };
            Ok(match output {
                Output::Json => serde_json::to_string_pretty(&entries).unwrap_or_default(),
                Output::Text => inspect::render(&entries),
            })
        }
        CacheCommand::Get {
            ref key,
            show_secrets,
            ..
        } => {
            let mut object: inspect::Object = match &local {
                Some(store) => inspect::get(store, key, component)?
                    .ok_or_else(|| format!("{key} is not cached"))?,
                None => {
                    let q = format!(
                        "/v1/cache/get?key={}&component={}",
                        enc(key),
                        enc(component.unwrap_or(""))
                    );
                    let body = admin::fetch_inspect(&socket, &q)
                        .await
                        .map_err(from_admin)?;
                    serde_json::from_slice(&body).map_err(|e| e.to_string())?
                }
            };
            if !show_secrets {
                inspect::redact(&mut object);
            }
            Ok(serde_json::to_string_pretty(&object).unwrap_or_default())
        }
    }
}

fn print_result(r: Result<String, String>) -> ExitCode {
    match r {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hub: {e}");
            ExitCode::FAILURE
        }
    }
}

fn with_runtime(f: impl Future<Output = Result<String, String>>) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    print_result(rt.block_on(f))
}

fn run(args: RunArgs) -> ExitCode {
    // glibc gives every thread that allocates its own arena and keeps their memory:
    // cache reads on blocking threads then grew RSS by tens of MiB. Two arenas suffice
    // for a one-worker runtime plus the cache writer.
    // SAFETY: mallopt only tunes the allocator; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let mut config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hub: invalid config: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Some(n) = args.node_name {
        config.node_name = n;
    }
    if !args.cloud_servers.is_empty() {
        config.cloud.servers = args.cloud_servers;
    }
    if let Some(p) = args.kubeconfig {
        config.cloud.kubeconfig = Some(p);
    }
    if let Some(p) = args.cgroup_path {
        config.intercept.cgroup_path = Some(p);
    }
    if let Some(p) = args.pin_path {
        config.intercept.pin_path = p;
    }
    if args.no_intercept {
        config.intercept.enabled = false;
    }
    if let Some(a) = args.admin {
        config.listen.admin = a;
    }
    match node_layout::resolve(&mut config, &args.node_root) {
        Ok(found) => config.node_layout = found,
        Err(e) => {
            eprintln!("hub: {}: {e}", args.config.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    if let Err(e) = config.validate() {
        eprintln!("hub: invalid config {}: {e}", args.config.display());
        return ExitCode::from(EXIT_CONFIG);
    }
    if args.check {
        for line in &config.node_layout.found {
            println!("{line}");
        }
        let problems = node_layout::check_files(&config, &args.node_root);
        for p in &problems {
            eprintln!("hub: {p}");
        }
        if !problems.is_empty() {
            return ExitCode::from(EXIT_CONFIG);
        }
        if args.node_root == Path::new("/") {
            for w in intercept::scope::warnings(&config) {
                eprintln!("hub: warning: {w}");
            }
        }
        println!("config ok: {}", args.config.display());
        return ExitCode::SUCCESS;
    }
    init_tracing(&args.log);
    // One thread serves everything (the cache writer and blocking reads have their own).
    // Measured on 2 cores: cross-thread wake-ups (futex, scheduler hops between a client
    // connection and its pooled upstream) cost more than a second worker gains — GET
    // through the hub 1.33x direct with one worker vs 1.60x with two — and a current-thread
    // runtime, with no worker handoff at all, cost 7 % less CPU per GET than one worker
    // (one run, both builds in the same rounds).
    let config = Arc::new(config);
    let instance = if args.host_instance {
        owner::Instance::Host
    } else {
        owner::Instance::Pod
    };
    loop {
        let waiting = |what: &str| tracing::info!("waiting for {what}");
        let ownership = match owner::acquire(&config.cache.dir, instance, waiting) {
            Ok(Some(o)) => o,
            Ok(None) => {
                tracing::info!(
                    "the installed hub binary was replaced: exiting for the new one to start"
                );
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("hub: {e}");
                return ExitCode::FAILURE;
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = config.cache.dir.clone();
        let handover = async move {
            match instance {
                owner::Instance::Host => owner::until_claimed(dir).await,
                owner::Instance::Pod => std::future::pending().await,
            }
        };
        let result = rt.block_on(daemon::run(config.clone(), handover));
        // Every task (and what it holds of the cache) goes before the node is let go.
        drop(rt);
        drop(ownership);
        match result {
            Ok(daemon::Stopped::Signal) => return ExitCode::SUCCESS,
            Ok(daemon::Stopped::HandedOver) => continue,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("hub: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}

fn init_tracing(default: &str) {
    use tracing_subscriber::{EnvFilter, util::SubscriberInitExt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colour only for a person at a terminal; a log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .finish()
        .try_init();
}
