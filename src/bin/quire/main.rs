//! `quire`: the operator's and client's command line.
//!
//! - `quire up [--nodes 3] [--groups 1] [--dir D] [--demo-only] [--force]`: a local
//!   cluster of real daemon processes on 127.0.0.1 with PTY null-modem
//!   cables between them; appends a few records, reads them back from every
//!   node, prints the status, and runs until Ctrl-C, SIGTERM or a hangup
//!   of its terminal (SIGHUP), then stops every node cleanly;
//! - `quire status --addr A,B,C --token-file F [--json]`: every node's groups and
//!   link table;
//! - `quire append|read|tail --addr .. --token-file F --group G ...
//!   [--json]`: the raw group log (`read` and `tail` also `--stale`);
//! - `quire ledger create|append|close|open|read|tail|delete|list` and
//!   `quire queue create|produce|consume|ack|list|dead|delete`: ledgers
//!   and queues (state.rs), with `--json`;
//! - `quire member --admin A (--admin-token-file F | --cert C --key K)
//!   [--ca CA] --group G remove|learner|voter --node N [--force] [--json]`:
//!   one membership change on the group's leader, as an admin (`voter`
//!   promotes only a learner that has caught up, unless `--force`), over
//!   HTTPS with `--ca`;
//! - `quire completions bash|zsh|fish`: a completion script on stdout;
//!   `quire man DIR`: man pages (`quire.1`, `quire-SUB.1`), both
//!   generated from the clap definitions (cli.rs), so they never drift;
//! - `quire daemon --config F`: the daemon itself (what `quired` runs).
//!
//! Exit codes: 0 ok; 1 refused or failed (`status`: a node did not answer
//! or raises an alarm); 2 bad usage (clap) or a bad config file. Errors
//! are printed once, on stderr, as `quire: ...`.
//!
//! Files, one concern each (this one parses and dispatches):
//! - `cli.rs`: the clap definitions, whose doc comments are the help text;
//! - `connect.rs`: TLS from the flags, and the client a `Target` builds;
//! - `status.rs`: `quire status`, its tables and its JSON;
//! - `group_log.rs`: `quire append`, `read` and `tail` of a group's log;
//! - `state.rs`: `quire ledger ...` and `quire queue ...`;
//! - `admin.rs`: `quire member` and `quire leader`, admin endpoint POSTs;
//! - `tune.rs`: `quire tune check|apply|disk`;
//! - `docs.rs`: `quire man` and `quire completions`, from cli.rs;
//! - `up.rs`: `quire up`, the local cluster and its demonstration;
//! - `input.rs`: records from the arguments or stdin, argument checks;
//! - `human.rs`: how values print for people.

#![warn(clippy::undocumented_unsafe_blocks)]

mod admin;
mod cli;
mod connect;
mod docs;
mod group_log;
mod human;
mod input;
mod state;
mod tune;

/// `println!` for `quire up`, whose stdout may close (`quire up | head`)
/// while its cluster runs: what follows is dropped, and the cluster runs
/// on until Ctrl-C and stops cleanly (a panic would SIGKILL it).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

// After `say!`: macros are in scope in the text that follows them.
mod status;
mod up;

use clap::Parser;
use cli::{Cli, Cmd};
use quire::node::daemon::quired;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A closed stdout (`quire status | head -1`, `quire tail | head`) ends
    // the command quietly, as it ends `cat` (`--help` too: before parsing).
    quire::sigpipe::on_closed_pipe(true);
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Daemon { .. } | Cmd::Up { .. }) {
        // Except where it would leave others behind: the daemon must see
        // EPIPE rather than die, and `quire up` must stop its cluster
        // (its output after a closed pipe is dropped: `say!`).
        quire::sigpipe::on_closed_pipe(false);
    }
    let r = match cli.cmd {
        Cmd::Daemon {
            config,
            unsafe_ack_before_fsync,
        } => {
            let opts = quired::DaemonOptions {
                unsafe_ack_before_fsync,
            };
            return quired::run_with(&config, opts);
        }
        Cmd::Tune { what } => match tune::tune(what) {
            Ok(true) => return ExitCode::SUCCESS,
            Ok(false) => return ExitCode::from(1),
            Err(tune::TuneError::Usage(e)) => {
                eprintln!("quire: {e}");
                return ExitCode::from(2);
            }
            Err(tune::TuneError::Failed(e)) => Err(e),
        },
        Cmd::Up {
            nodes,
            groups,
            dir,
            demo_only,
            force,
        } => up::up(nodes, groups, dir, demo_only, force),
        Cmd::Status { target, json } => {
            status::status(&target, json).and_then(|(unreachable, alarms)| {
                if unreachable + alarms == 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "status: {unreachable} of {} nodes unreachable, {alarms} alarms raised",
                        target.addr.len()
                    ))
                }
            })
        }
        Cmd::Completions { shell } => {
            docs::completions(shell);
            Ok(())
        }
        Cmd::Man { dir } => docs::man_pages(&dir).map(|pages| {
            for p in pages {
                println!("{}", p.display());
            }
        }),
        Cmd::Ledger { what } => state::ledger(what),
        Cmd::Queue { what } => state::queue(what),
        Cmd::Member {
            admin,
            group,
            change,
            node,
            force,
            admin_token_file,
            tls,
            json,
        } => admin::member(
            admin,
            &admin::MemberChange {
                group,
                change: &change,
                node,
                force,
            },
            admin_token_file.as_deref(),
            &tls,
        )
        .map(|answer| {
            if json {
                let v = serde_json::json!({
                    "group": group,
                    "change": change,
                    "node": node,
                    "answer": answer,
                });
                println!("{v}");
            } else {
                println!("{answer}");
            }
        }),
        Cmd::Leader {
            admin,
            group,
            to,
            admin_token_file,
            tls,
        } => admin::admin_post(
            admin,
            &format!("/leader?group={group}&node={to}"),
            admin_token_file.as_deref(),
            &tls,
        )
        .map(|answer| println!("{answer}")),
        Cmd::Append {
            target,
            group,
            records,
            json,
        } => group_log::append(&target, group, records, json),
        Cmd::Read {
            target,
            group,
            from,
            max,
            stale,
            json,
        } => group_log::read(&target, group, from, max, stale, json),
        Cmd::Tail {
            target,
            group,
            from,
            stale,
            json,
        } => group_log::tail(&target, group, from, stale, json),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quire: {e}");
            ExitCode::from(1)
        }
    }
}
