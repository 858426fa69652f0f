//! `quired`: the quire node daemon.
//!
//! `quired --config node.toml` loads and checks the config (exit code 2 and
//! one message naming the key if anything is wrong), starts one pinned
//! event loop per configured core, each owning its groups' logs and UDP
//! sockets (the first also the serial ports and the failure detector),
//! and the admin endpoint (`/metrics`, `/status`). On SIGTERM or SIGINT it
//! stops taking work, lets in-flight flushes finish and exits 0; a restart
//! recovers every group from its log.

use clap::Parser;
use quire::node::admin::AdminServer;
use quire::node::config_file;
use quire::node::NodeHandle;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(name = "quired", about = "The quire node daemon")]
struct Args {
    /// The node's config file (TOML; see the README's "Node config file").
    #[arg(long)]
    config: PathBuf,
}

/// Blocks SIGTERM and SIGINT in this thread and every thread it starts
/// later, so that `wait_for_signal` receives them synchronously.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; the calls only read and write it and
    // this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for SIGTERM or SIGINT; returns its name.
fn wait_for_signal(set: &libc::sigset_t) -> &'static str {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is an initialised signal set; `sig` is written by sigwait.
    while unsafe { libc::sigwait(set, &mut sig) } != 0 {}
    if sig == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match config_file::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quired: {e}");
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    for w in &cfg.warnings {
        eprintln!("quired: warning: {w}");
    }
    let id = cfg.node.id;
    let signals = block_stop_signals();
    let groups = cfg.node.groups.len();
    let node = match NodeHandle::spawn_on(cfg.node, &cfg.cores) {
        Ok(n) => Arc::new(n),
        Err(e) => {
            eprintln!("quired: node {id}: {e}");
            return ExitCode::from(1);
        }
    };
    let admin = match AdminServer::start(cfg.admin_listen, Arc::clone(&node)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("quired: node {id}: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!(
        "quired: node {id} up: {groups} groups on cores {:?}; admin on http://{}/status",
        cfg.cores,
        admin.addr()
    );
    let sig = wait_for_signal(&signals);
    eprintln!("quired: node {id}: {sig}: stopping; in-flight flushes finish first");
    drop(admin);
    match Arc::try_unwrap(node) {
        Ok(n) => n.stop(),
        Err(n) => drop(n), // the last reference stops it when it goes
    }
    eprintln!("quired: node {id} stopped cleanly");
    ExitCode::SUCCESS
}
