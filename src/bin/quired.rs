//! `quired`: the quire node daemon. See `quire::node::daemon`.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "quired", about = "The quire node daemon")]
struct Args {
    /// The node's config file (TOML; see the README's "Node config file").
    #[arg(long)]
    config: PathBuf,
}

fn main() -> ExitCode {
    quire::node::daemon::run(&Args::parse().config)
}
