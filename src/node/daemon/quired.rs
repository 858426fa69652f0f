//! The daemon (`quired`, or `quire daemon`): loads and checks the config
//! (exit code 2 and one message naming the key if anything is wrong),
//! refuses to start if any of its ports is taken (exit code 2, naming the
//! port and its holder: a second daemon on the same config, or another
//! process on a replication port, see `daemon::port_check`), starts one pinned event loop per configured core, the client server and
//! the admin endpoint; on SIGTERM or SIGINT stops taking work, lets
//! in-flight flushes finish and exits 0. A SIGHUP reloads the client TLS
//! certificate, key and client CA (new connections get them, open ones
//! keep theirs; a file that does not load leaves the old ones in use);
//! nothing else is re-read. A restart recovers every group from its log.

use crate::node::admin::endpoint::AdminServer;
use crate::node::client::server::ClientServer;
use crate::node::daemon::config_file::{self, DaemonConfig};
use crate::node::daemon::port_check::{self, Claim, Proto};
use crate::node::log::{log_info, log_warn};
use crate::node::NodeHandle;
use crate::tls::ServerTls;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{SigSet, Signal};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread
/// started from it later, so that `wait_for_signal` receives them
/// synchronously. SIGHUP's default action would end the process with no
/// word in its log (an operator's `kill -HUP`, `systemctl reload`).
pub fn block_stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    // Fails only for an invalid `how`.
    let _ = set.thread_block();
    set
}

/// Waits for SIGTERM, SIGINT or SIGHUP; returns its name.
pub fn wait_for_signal(set: &SigSet) -> &'static str {
    loop {
        match set.wait() {
            Ok(Signal::SIGINT) => return "SIGINT",
            Ok(Signal::SIGHUP) => return "SIGHUP",
            Ok(_) => return "SIGTERM",
            Err(_) => continue,
        }
    }
}

/// Waits for SIGTERM or SIGINT and says which; a SIGHUP meanwhile reloads
/// the certificates and keys of the client listener (`client`) and of the
/// admin endpoint (`node::admin`, with `node.admin_tls`) from their files.
fn wait_for_stop(
    id: u64,
    set: &SigSet,
    client: Option<&ServerTls>,
    admin: Option<&ServerTls>,
) -> &'static str {
    loop {
        match wait_for_signal(set) {
            "SIGHUP" => {
                if client.is_none() && admin.is_none() {
                    log_info!(
                        "quired: node {id}: SIGHUP: nothing to reload (clients are served plain TCP; the config is read once, at start: restart the node to apply a change); still running"
                    );
                }
                for (what, tls) in [("client TLS", client), ("admin HTTPS", admin)] {
                    match tls.map(ServerTls::reload) {
                        None => {}
                        Some(Ok(got)) => log_info!(
                            "quired: node {id}: SIGHUP: {what} reloaded: new connections get {got}; open ones keep theirs"
                        ),
                        Some(Err(e)) => log_warn!(
                            "quired: node {id}: SIGHUP: {what} not reloaded, the certificate in use stays: {e}"
                        ),
                    }
                }
            }
            sig => return sig,
        }
    }
}

/// The environment variable that must be `1` for the daemon to accept an
/// unsafe, test-only option.
pub const ALLOW_UNSAFE_ENV: &str = "QUIRE_ALLOW_UNSAFE";

/// Command-line options of the daemon beyond its config file.
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonOptions {
    /// TEST-ONLY FAULT (`--unsafe-ack-before-fsync`): followers acknowledge
    /// appended entries before they are durable (the consensus core's
    /// `PlantedBug::AckBeforeFsync`), so a crash can lose a confirmed
    /// append. It exists so the fault-injection suite (tests/faults.rs) can
    /// show that its lost-append check fires; refused unless
    /// `QUIRE_ALLOW_UNSAFE=1` is set.
    pub unsafe_ack_before_fsync: bool,
}

/// The exit code of `quired` when a port it needs is taken; the same as a
/// bad config (2): restarting does not help until the operator acts, and
/// systemd's `RestartPreventExitStatus=2` keeps it from looping.
pub const EXIT_CODE_PORT_IN_USE: u8 = 2;

/// Every port `cfg` makes the daemon bind: each group's UDP socket, then
/// the client and admin listeners (a port 0 is the kernel's choice and
/// never taken).
pub fn port_claims(cfg: &DaemonConfig) -> Vec<Claim> {
    let udp = &cfg.node.udp;
    let mut claims: Vec<Claim> = cfg
        .node
        .groups
        .iter()
        .filter(|_| udp.base_port != 0)
        .map(|g| Claim {
            proto: Proto::Udp,
            addr: std::net::SocketAddr::new(udp.bind_ip, udp.base_port + g.group as u16),
            what: format!(
                "group {}: udp.base_port {} + {}",
                g.group, udp.base_port, g.group
            ),
        })
        .collect();
    for (key, addr) in [
        ("node.client_listen", cfg.client_listen),
        ("node.admin_listen", cfg.admin_listen),
    ] {
        if addr.port() != 0 {
            claims.push(Claim {
                proto: Proto::Tcp,
                addr,
                what: key.into(),
            });
        }
    }
    claims
}

/// The exit for a start that failed with `e`: 2 and `e` if the config is
/// at fault (`config`); 2 and the port's holder if one of `claims` is
/// taken now (another process won a race with our own check); else 1
/// and `e`.
/// Descriptors a node needs besides its client connections: logs,
/// sockets, serial ports, the admin endpoint.
const OPEN_FILES_RESERVE: u64 = 1024;

/// Raises the soft limit on open descriptors towards the hard one, so
/// that `client.connections_max` connections (each a descriptor, no
/// longer a thread) can be held; warns if even the hard limit is short.
fn raise_open_files_limit(id: u64, limits: &crate::node::client::admission::ClientLimits) {
    let want = (limits.connections_max + limits.unauthenticated_max) as u64 + OPEN_FILES_RESERVE;
    let Ok((mut soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < want && setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard).is_ok() {
        soft = want.min(hard);
    }
    if soft < want {
        log_warn!(
            "quired: node {id}: the open-files limit is {} (hard {}), short of the {want} that client.connections_max {} needs; connections beyond it are refused by the kernel (raise LimitNOFILE / ulimit -n)",
            soft,
            hard,
            limits.connections_max
        );
    }
}

/// Freed heap the allocator keeps for reuse rather than returning it to
/// the kernel, per arena, in bytes.
const HEAP_TRIM_THRESHOLD_BYTES: i32 = 64 << 20;
/// Extra heap the allocator takes each time it grows an arena, in bytes.
const HEAP_TOP_PAD_BYTES: i32 = 16 << 20;
/// Allocations at least this large get their own mapping, in bytes.
const HEAP_MMAP_THRESHOLD_BYTES: i32 = 32 << 20;

/// Tells glibc's allocator to keep freed heap instead of trimming it:
/// the loops allocate and free message and batch buffers at a steady
/// rate, and by default each arena shrinks and grows again, paying a page
/// fault per page and an `mprotect` per growth (5% of all samples at
/// 130k appends/s; 10% less daemon CPU per append without it,
/// bench/README.md). Bounded: at most the trim threshold is kept free per
/// arena, a few arenas per process.
fn keep_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called before the
    // daemon's threads start.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TOP_PAD, HEAP_TOP_PAD_BYTES);
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD_BYTES);
    }
}

fn start_failed(id: u64, claims: &[Claim], config: bool, e: &dyn std::fmt::Display) -> ExitCode {
    if config {
        // The config file's checks should have caught it: a gap there,
        // but still the operator's to fix, so not worth a restart.
        eprintln!("quired: node {id}: {e}");
        return ExitCode::from(config_file::EXIT_CODE_BAD_CONFIG as u8);
    }
    match port_check::find_taken(claims) {
        Some(taken) => {
            eprintln!("quired: node {id}: {taken}");
            ExitCode::from(EXIT_CODE_PORT_IN_USE)
        }
        None => {
            eprintln!("quired: node {id}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the daemon with the config at `config` until a stop signal.
pub fn run(config: &Path) -> ExitCode {
    run_with(config, DaemonOptions::default())
}

/// [`run`] with command-line options; an unsafe option without
/// `QUIRE_ALLOW_UNSAFE=1` in the environment exits with code 2.
pub fn run_with(config: &Path, opts: DaemonOptions) -> ExitCode {
    let allowed = std::env::var(ALLOW_UNSAFE_ENV).is_ok_and(|v| v == "1");
    if opts.unsafe_ack_before_fsync && !allowed {
        eprintln!(
            "quired: --unsafe-ack-before-fsync is a test-only fault that can lose confirmed \
             appends; it is refused unless {ALLOW_UNSAFE_ENV}=1"
        );
        return ExitCode::from(config_file::EXIT_CODE_BAD_CONFIG as u8);
    }
    let mut cfg = match config_file::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quired: {e}");
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    if opts.unsafe_ack_before_fsync {
        log_warn!("quired: --unsafe-ack-before-fsync: a crash can lose confirmed appends");
        cfg.node.raft.planted_bug = Some(crate::consensus::PlantedBug::AckBeforeFsync);
    }
    for w in &cfg.warnings {
        log_warn!("quired: {w}");
    }
    let id = cfg.node.id;
    // The tokens were read with the config (`cfg.credentials`).
    let tls = match cfg.client_tls.clone().map(ServerTls::load).transpose() {
        Ok(t) => t.map(Arc::new),
        Err(e) => {
            // Checked with the config a moment ago: a file changed since.
            eprintln!("quired: node {id}: client TLS: {e}");
            return ExitCode::from(config_file::EXIT_CODE_BAD_CONFIG as u8);
        }
    };
    let admin_tls = match cfg.admin_tls.clone().map(ServerTls::load).transpose() {
        Ok(t) => t.map(Arc::new),
        Err(e) => {
            eprintln!("quired: node {id}: admin HTTPS: {e}");
            return ExitCode::from(config_file::EXIT_CODE_BAD_CONFIG as u8);
        }
    };
    // Before any log is opened: a second daemon on this config must not
    // touch the disks of the first.
    let claims = port_claims(&cfg);
    if let Some(taken) = port_check::find_taken(&claims) {
        eprintln!("quired: node {id}: {taken}");
        return ExitCode::from(EXIT_CODE_PORT_IN_USE);
    }
    let (udp_claims, tcp_claims): (Vec<Claim>, Vec<Claim>) =
        claims.into_iter().partition(|c| c.proto == Proto::Udp);
    let listener = |key: &str| -> Vec<Claim> {
        tcp_claims
            .iter()
            .filter(|c| c.what == key)
            .cloned()
            .collect()
    };
    raise_open_files_limit(id, &cfg.client);
    keep_freed_heap();
    let signals = block_stop_signals();
    let groups = cfg.node.groups.len();
    let node = match NodeHandle::spawn_on(cfg.node, &cfg.cores) {
        Ok(n) => Arc::new(n),
        Err(e) => return start_failed(id, &udp_claims, e.is_config(), &e),
    };
    let admin = match AdminServer::start(
        cfg.admin_listen,
        Arc::clone(&node),
        cfg.admin_token_file.clone(),
        cfg.credentials.clone(),
        admin_tls.clone(),
    ) {
        Ok(a) => a,
        Err(e) => return start_failed(id, &listener("node.admin_listen"), e.is_config(), &e),
    };
    let clients = match ClientServer::start_with(
        cfg.client_listen,
        Arc::clone(&node),
        cfg.credentials.clone(),
        BTreeMap::new(),
        cfg.client,
        tls.clone(),
    ) {
        Ok(c) => c,
        Err(e) => return start_failed(id, &listener("node.client_listen"), e.is_config(), &e),
    };
    let scheme = if admin_tls.is_some() { "https" } else { "http" };
    log_info!(
        "quired: node {id} up: {groups} groups on cores {:?}; clients on {}; admin on {scheme}://{}/status",
        cfg.cores,
        clients.addr(),
        admin.addr()
    );
    match &tls {
        Some(t) => log_info!("quired: node {id}: clients: {}", t.describe()),
        None => log_warn!(
            "quired: node {id}: clients are served plain TCP (client.plain = true): tokens and records cross the network in clear"
        ),
    }
    if let Some(t) = &admin_tls {
        log_info!("quired: node {id}: admin: HTTPS only: {}", t.describe());
    }
    let admins = cfg
        .credentials
        .admins()
        .map(|name| format!("{name:?}"))
        .collect::<Vec<_>>();
    match (&cfg.admin_token_file, admins.is_empty()) {
        (None, true) => log_warn!(
            "quired: node {id}: membership changes on the admin endpoint are off (no node.admin_token_file, no principal with an \"admin\" grant)"
        ),
        (file, _) => {
            let mut who = Vec::new();
            if let Some(f) = file {
                who.push(format!("the token in {} (re-read on each request)", f.display()));
            }
            if !admins.is_empty() {
                who.push(format!("admin principals {}", admins.join(", ")));
            }
            log_info!(
                "quired: node {id}: membership changes on the admin endpoint need {}",
                who.join(" or ")
            );
        }
    }
    let sig = wait_for_stop(id, &signals, tls.as_deref(), admin_tls.as_deref());
    log_info!("quired: node {id}: {sig}: stopping; in-flight flushes finish first");
    drop(clients);
    drop(admin);
    match Arc::try_unwrap(node) {
        Ok(n) => n.stop(),
        Err(n) => drop(n), // a client thread still holds it; it stops with the last
    }
    log_info!("quired: node {id} stopped cleanly");
    ExitCode::SUCCESS
}
