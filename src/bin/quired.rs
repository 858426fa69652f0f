//! `quired`: the quire node daemon. See `quire::node::daemon::quired`.
//!
//! Exit codes: 0 after a clean stop (SIGTERM or SIGINT; a SIGHUP is
//! logged and the daemon goes on), 1 if it failed
//! while running, 2 for bad usage or a bad config file. SIGPIPE stays
//! ignored (Rust's default): a daemon must see EPIPE on a socket, not die.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "quired", version, about = "The quire node daemon")]
struct Args {
    /// The node's config file (TOML; every key: docs/operating/config.md).
    #[arg(long)]
    config: PathBuf,
    /// TEST-ONLY FAULT: followers acknowledge before fsync, so a crash can
    /// lose confirmed appends. Refused unless QUIRE_ALLOW_UNSAFE=1.
    #[arg(long, hide = true)]
    unsafe_ack_before_fsync: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = quire::node::daemon::quired::DaemonOptions {
        unsafe_ack_before_fsync: args.unsafe_ack_before_fsync,
    };
    quire::node::daemon::quired::run_with(&args.config, opts)
}
