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
//!   generated from the clap definitions below, so they never drift;
//! - `quire daemon --config F`: the daemon itself (what `quired` runs).
//!
//! Exit codes: 0 ok; 1 refused or failed (`status`: a node did not answer
//! or raises an alarm); 2 bad usage (clap) or a bad config file. Errors
//! are printed once, on stderr, as `quire: ...`.

#![warn(clippy::undocumented_unsafe_blocks)]

mod human;
mod input;
mod state;

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
mod up;

use clap::{Parser, Subcommand};
use quire::client::Client;
use quire::node::daemon::quired;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "quire",
    version,
    about = "The quire replication appliance: local cluster, status, client",
    after_help = "Exit codes: 0 ok; 1 refused or failed (for `status`: a node did not answer or raises an alarm); 2 bad usage or a bad config file."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Debug)]
struct Target {
    /// Client addresses of the cluster's nodes, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    addr: Vec<SocketAddr>,
    /// File holding the client token (the cluster's, or a principal's of
    /// node.credentials_file); not needed with a --cert that names a
    /// principal.
    #[arg(long, required_unless_present = "cert")]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// How the CLI speaks TLS to the nodes (each flag also read from its
/// environment variable, so a shell can set them once).
#[derive(clap::Args, Debug, Default)]
struct TlsArgs {
    /// CA certificates (PEM) the nodes' certificates must chain to: speak
    /// TLS to them (`quire up` writes DIR/ca.pem). Without it: plain TCP,
    /// which only a node with client.plain = true serves.
    #[arg(long, env = "QUIRE_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), for nodes that ask for one
    /// (client.tls_client_ca_file); needs --key.
    #[arg(long, env = "QUIRE_CERT", value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "QUIRE_KEY", value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// The name the nodes' certificates must carry (by default the IP
    /// address of --addr).
    #[arg(long, env = "QUIRE_TLS_NAME", value_name = "NAME")]
    tls_name: Option<String>,
}

impl TlsArgs {
    /// The client TLS config these flags name, or `None` for plain TCP.
    fn load(&self) -> Result<Option<std::sync::Arc<quire::tls::ClientTls>>, String> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.tls_name.is_some() {
                return Err("--cert, --key and --tls-name need --ca (the CA the nodes' certificates chain to)".into());
            }
            return Ok(None);
        };
        let files = quire::tls::ClientTlsFiles {
            ca: ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            server_name: self.tls_name.clone(),
        };
        quire::tls::ClientTls::load(&files)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start a local cluster of real daemons with emulated serial cables.
    Up {
        /// Nodes, 1 to 7 (3 or 5 make sense).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
        nodes: u64,
        /// Raft groups (log disks) per node, 1 to 64.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        groups: u32,
        /// Directory for configs, logs and cables (default: ./quire-up).
        #[arg(long, default_value = "quire-up")]
        dir: PathBuf,
        /// Stop after the demonstration instead of running until Ctrl-C.
        #[arg(long)]
        demo_only: bool,
        /// Delete --dir even if an earlier `quire up` did not create it
        /// (without this, only a directory holding quire up's marker file
        /// `.quire-up`, or an empty one, is reused).
        #[arg(long)]
        force: bool,
    },
    /// Every node's groups and links. Exit code 0 if every node answered
    /// and none raises an alarm, 1 otherwise.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print one JSON array: each node's admin `/status` object (with
        /// its `addr`), or `{"addr", "error"}` for a node that did not
        /// answer.
        #[arg(long)]
        json: bool,
    },
    /// Append records (one per argument) to a group's log; given `-`,
    /// one per line of stdin, pipelined as the lines arrive.
    Append {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// The records, or `-` for stdin's lines.
        #[arg(required = true)]
        records: Vec<String>,
        /// Print JSON, one object per record: `{"index", "data"}`.
        #[arg(long)]
        json: bool,
    },
    /// Read committed records of a group's log, linearizably: from the
    /// group's leader, after it confirmed it still leads (every append
    /// confirmed before the read is in it).
    Read {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// First index (the log starts at 1).
        #[arg(long, default_value_t = 1, value_parser = input::log_index)]
        from: u64,
        /// At most this many (1 to 4096: one read's answer).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=4096))]
        max: u32,
        /// Read the first node that answers, leader or not, from what it has
        /// applied: cheaper, but it may miss entries committed but not yet
        /// applied on that node (a record just appended, for instance).
        #[arg(long)]
        stale: bool,
        /// Print JSON, one object per record: `{"index", "term", "data"}`.
        #[arg(long)]
        json: bool,
    },
    /// Follow a group's log from an index, printing records as they commit
    /// (long polls on the group's leader).
    Tail {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// First index (the log starts at 1).
        #[arg(long, default_value_t = 1, value_parser = input::log_index)]
        from: u64,
        /// Follow the first node that answers, leader or not, as it applies
        /// records: no round trip to the leader, but it lags behind it, and
        /// misses for now records committed but not yet applied on that
        /// node (a record just appended); a node cut off from the leader
        /// prints nothing new until it heals. It never skips a record or
        /// prints one twice.
        #[arg(long)]
        stale: bool,
        /// Print JSON, one object per record: `{"index", "term", "data"}`.
        #[arg(long)]
        json: bool,
    },
    /// Check and tune the host (see tuning/README.md).
    Tune {
        #[command(subcommand)]
        what: TuneCmd,
    },
    /// Change a group's membership, one server at a time, through the
    /// admin endpoint of the group's leader (see HARDWARE.md, replacing a
    /// disk).
    Member {
        /// The leader's admin address (node.admin_listen).
        #[arg(long)]
        admin: SocketAddr,
        /// The group.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// remove, learner (add as a non-voting learner) or voter (promote
        /// a learner that has caught up: within 64 entries of the leader's
        /// last index; otherwise refused with how far behind it is).
        #[arg(value_parser = ["remove", "learner", "voter"])]
        change: String,
        /// The node to change.
        #[arg(long)]
        node: u64,
        /// voter: promote a learner however far behind it is (the group
        /// may wait for it in its quorums until it catches up), or add a
        /// non-member directly as a voter.
        #[arg(long)]
        force: bool,
        /// File holding the admin token (node.admin_token_file; `quire up`
        /// writes DIR/admin.token) or the token of a principal with an
        /// "admin" grant, sent as Authorization: Bearer; not needed with a
        /// --cert that names an admin principal.
        #[arg(long, required_unless_present = "cert")]
        admin_token_file: Option<PathBuf>,
        /// With --ca: HTTPS to an endpoint with node.admin_tls = true.
        #[command(flatten)]
        tls: TlsArgs,
        /// Print the applied change as one JSON object: `{"group",
        /// "change", "node", "answer"}` (the leader's answer); a refusal is
        /// an error as without it.
        #[arg(long)]
        json: bool,
    },
    /// Hand a group's leadership to another voter, through the admin
    /// endpoint of the group's leader (before taking a node down, or to
    /// move load): waits until that node leads. The clients waiting on
    /// the old leader are sent to the new one at once.
    Leader {
        /// The current leader's admin address (node.admin_listen).
        #[arg(long)]
        admin: SocketAddr,
        /// The group.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// The voter to hand the leadership to.
        #[arg(long)]
        to: u64,
        /// File holding the admin token, as for `quire member`.
        #[arg(long, required_unless_present = "cert")]
        admin_token_file: Option<PathBuf>,
        /// With --ca: HTTPS to an endpoint with node.admin_tls = true.
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Ledgers: a single writer, dense entry ids, LAC, close, fencing.
    Ledger {
        #[command(subcommand)]
        what: state::LedgerCmd,
    },
    /// Queues: produce, consume with a visibility timeout, replicated acks.
    Queue {
        #[command(subcommand)]
        what: state::QueueCmd,
    },
    /// Print a shell completion script to stdout (generated from this
    /// command line's own definition), e.g. `quire completions bash >
    /// /usr/share/bash-completion/completions/quire`.
    Completions {
        /// The shell: bash, zsh, fish (also elvish, powershell).
        shell: clap_complete::Shell,
    },
    /// Write man pages to DIR: quire.1 and one page per subcommand
    /// (quire-member.1, quire-tune-check.1, ...), generated from this
    /// command line's own definition; e.g. `quire man /usr/share/man/man1`.
    Man {
        /// The directory to write them in (created if missing).
        dir: PathBuf,
    },
    /// Run the daemon (as `quired` does).
    Daemon {
        /// The node's config file.
        #[arg(long)]
        config: PathBuf,
        /// TEST-ONLY FAULT: followers acknowledge before fsync, so a crash
        /// can lose confirmed appends. Refused unless QUIRE_ALLOW_UNSAFE=1.
        #[arg(long, hide = true)]
        unsafe_ack_before_fsync: bool,
    },
}

#[derive(Subcommand, Debug)]
enum TuneCmd {
    /// Print a checklist (OK / WARN / FAIL) with the command that fixes
    /// each item; exit code 1 if anything fails.
    Check {
        /// The node's config file, for its buffers, disks, cores and
        /// serial devices.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Read /proc and /sys under this directory (tests).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// Apply the settings that are safe to change at run time: with
    /// --dry-run, print them; with --yes, change them (one is needed).
    #[command(group(clap::ArgGroup::new("mode").required(true).args(["dry_run", "yes"])))]
    Apply {
        /// The node's config file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Only print what would change.
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Change them.
        #[arg(long)]
        yes: bool,
        /// Write under this directory (tests).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// Probe a disk: fdatasync latency and throughput per write size, a
    /// recommended storage.flush_bytes_max and the commit latency to expect.
    Disk {
        /// A directory on the disk to probe (a 64 MiB file is written there).
        dir: PathBuf,
        /// Seconds per write size.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
    },
}

/// Why a `quire tune` command did not run: a bad `--config` or argument
/// (exit code 2) or a failure (1).
enum TuneError {
    Usage(String),
    Failed(String),
}

fn load_config(
    path: &Option<PathBuf>,
) -> Result<Option<quire::node::daemon::config_file::DaemonConfig>, TuneError> {
    match path {
        None => Ok(None),
        Some(p) => quire::node::daemon::config_file::load(p)
            .map(Some)
            .map_err(|e| TuneError::Usage(e.to_string())),
    }
}

fn tune(what: TuneCmd) -> Result<bool, TuneError> {
    use quire::tune::{self, Host, Status};
    match what {
        TuneCmd::Check { config, json, root } => {
            let cfg = load_config(&config)?;
            let checks = Host::new(root).check(cfg.as_ref());
            if json {
                println!("{}", tune::to_json(&checks));
            } else {
                print!("{}", tune::render(&checks));
            }
            Ok(checks.iter().all(|c| c.status != Status::Fail))
        }
        TuneCmd::Apply {
            config,
            dry_run,
            yes,
            root,
        } => {
            let cfg = load_config(&config)?;
            let checks = Host::new(&root).check(cfg.as_ref());
            let lines = tune::apply(&root, &checks, dry_run || !yes);
            if lines.is_empty() {
                println!("nothing to change at run time");
            }
            for l in &lines {
                println!("{l}");
            }
            Ok(!lines.iter().any(|l| l.starts_with("could not")))
        }
        TuneCmd::Disk { dir, seconds } => {
            if !dir.is_dir() {
                let what = if dir.exists() {
                    "not a directory"
                } else {
                    "no such directory; it is not created (that would probe the filesystem of its parent)"
                };
                return Err(TuneError::Usage(format!(
                    "tune disk {}: {what}: name an existing directory on the disk to probe",
                    dir.display()
                )));
            }
            let p = tune::disk::probe(&dir, Duration::from_secs_f64(seconds.max(0.05)))
                .map_err(|e| TuneError::Failed(format!("probing {}: {e}", dir.display())))?;
            print!("{}", tune::disk::render(&p));
            Ok(true)
        }
    }
}

fn client(t: &Target) -> Result<Client, String> {
    let token = match &t.token_file {
        Some(f) => quire::io::private::read_capped(f, quire::io::private::SECRET_FILE_BYTES_MAX)
            .map_err(|e| format!("{}: {e}", f.display()))?,
        None => Vec::new(),
    };
    let id = quire::client::random_client_id().map_err(|e| format!("a client id: {e}"))?;
    let c = Client::new(t.addr.clone(), token.trim_ascii_end(), id);
    Ok(match t.tls.load()? {
        Some(tls) => c.with_tls(tls),
        None => c,
    })
}

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
        Cmd::Tune { what } => match tune(what) {
            Ok(true) => return ExitCode::SUCCESS,
            Ok(false) => return ExitCode::from(1),
            Err(TuneError::Usage(e)) => {
                eprintln!("quire: {e}");
                return ExitCode::from(2);
            }
            Err(TuneError::Failed(e)) => Err(e),
        },
        Cmd::Up {
            nodes,
            groups,
            dir,
            demo_only,
            force,
        } => up::up(nodes, groups, dir, demo_only, force),
        Cmd::Status { target, json } => status(&target, json).and_then(|(unreachable, alarms)| {
            if unreachable + alarms == 0 {
                Ok(())
            } else {
                Err(format!(
                    "status: {unreachable} of {} nodes unreachable, {alarms} alarms raised",
                    target.addr.len()
                ))
            }
        }),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "quire", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man { dir } => man_pages(&dir).map(|pages| {
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
        } => member(
            admin,
            &MemberChange {
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
        } => admin_post(
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
        } => client(&target).and_then(|mut c| {
            let mut records = input::Records::from_args(records);
            // Up to 1024 records in flight on the leader's connection, 64
            // to a batch request (`Client::append_all`).
            while let Some(batch) = records.next_batch(1024, 1 << 20)? {
                let indexes = c
                    .append_all(group, &batch, 16, 64)
                    .map_err(|e| e.to_string())?;
                for (index, r) in indexes.iter().zip(&batch) {
                    let data = String::from_utf8_lossy(r);
                    if json {
                        println!("{}", serde_json::json!({"index": index, "data": data}));
                    } else {
                        println!("appended at index {index}: {data}");
                    }
                }
            }
            Ok(())
        }),
        Cmd::Read {
            target,
            group,
            from,
            max,
            stale,
            json,
        } => client(&target).and_then(|mut c| {
            let entries = if stale {
                c.read_stale(group, from, max)
            } else {
                c.read(group, from, max)
            };
            for e in entries.map_err(|e| e.to_string())? {
                print_entry(&e, json);
            }
            Ok(())
        }),
        Cmd::Tail {
            target,
            group,
            from,
            stale,
            json,
        } => client(&target).and_then(|mut c| {
            let mut next = from;
            loop {
                // A long poll on the leader (or, stale, on the first node
                // that answers): it answers as soon as an entry at or after
                // `next` is applied there (or after 1.5 s, empty; the client
                // waits 2 s for an answer).
                let entries = if stale {
                    c.tail_stale(group, next, 1_500)
                } else {
                    c.tail(group, next, 1_500)
                };
                let entries = entries.map_err(|e| e.to_string())?;
                for e in entries {
                    print_entry(&e, json);
                    next = e.index + 1;
                }
            }
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quire: {e}");
            ExitCode::from(1)
        }
    }
}

/// `quire man DIR`: writes `quire.1` and, for every subcommand that is
/// not hidden, `quire-SUB.1` (nested: `quire-tune-check.1`) into `dir`,
/// created if missing; returns the files written. Generated from the
/// clap definition, so the pages say what `--help` says.
fn man_pages(dir: &Path) -> Result<Vec<PathBuf>, String> {
    fn write(cmd: clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        let name = cmd.get_name().to_string();
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .render(&mut page)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::write(&path, page).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(path);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            // clap names are `&'static str` (without its `string`
            // feature); a few page names leaked once per run.
            let full: &'static str =
                Box::leak(format!("{name}-{}", sub.get_name()).into_boxed_str());
            let sub = sub.clone().name(full);
            write(sub, dir, out)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    write(<Cli as clap::CommandFactory>::command(), dir, &mut out)?;
    Ok(out)
}

/// One record of a group's log as `quire read` and `quire tail` print it:
/// `INDEX<TAB>TERM<TAB>DATA`, or with `json` one JSON object.
fn print_entry(e: &quire::client::Entry, json: bool) {
    let data = String::from_utf8_lossy(&e.data);
    if json {
        let v = serde_json::json!({"index": e.index, "term": e.term, "data": data});
        println!("{v}");
    } else {
        println!("{}\t{}\t{}", e.index, e.term, data);
    }
}

/// What `quire member` asks for.
struct MemberChange<'a> {
    group: u32,
    change: &'a str,
    node: u64,
    force: bool,
}

/// A byte stream both ways: TCP, or TLS over it.
trait Duplex: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> Duplex for T {}

/// `quire member`: the leader's answer once the change applied, or why
/// not.
fn member(
    admin: SocketAddr,
    m: &MemberChange,
    token_file: Option<&std::path::Path>,
    tls: &TlsArgs,
) -> Result<String, String> {
    let force = if m.force { "&force=1" } else { "" };
    let (group, change, node) = (m.group, m.change, m.node);
    let path = format!("/membership?group={group}&change={change}&node={node}{force}");
    admin_post(admin, &path, token_file, tls)
}

/// One POST of `path` (with its query) to the admin endpoint (over HTTPS
/// with `tls`), with the admin token in `token_file` or as the principal
/// of `tls`'s certificate: the body of a 200 answer, or the status and
/// why.
fn admin_post(
    admin: SocketAddr,
    path: &str,
    token_file: Option<&std::path::Path>,
    tls: &TlsArgs,
) -> Result<String, String> {
    use std::io::{Read, Write};
    let auth = match token_file {
        None => String::new(),
        Some(f) => {
            let token =
                quire::io::private::read_capped(f, quire::io::private::SECRET_FILE_BYTES_MAX)
                    .map_err(|e| format!("{}: {e}", f.display()))?;
            let token = String::from_utf8(token.trim_ascii_end().to_vec())
                .map_err(|_| format!("{}: the admin token is not text", f.display()))?;
            format!("Authorization: Bearer {token}\r\n")
        }
    };
    let client_tls = tls.load()?;
    let tcp = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5))
        .map_err(|e| format!("{admin}: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|()| tcp.set_write_timeout(Some(Duration::from_secs(30))))
        .map_err(|e| e.to_string())?;
    let mut s: Box<dyn Duplex> = match &client_tls {
        None => Box::new(tcp),
        Some(t) => {
            let conn = t.connect(admin).map_err(|e| format!("{admin}: TLS: {e}"))?;
            Box::new(rustls::StreamOwned::new(conn, tcp))
        }
    };
    let io_failed = |e: std::io::Error| {
        let rustls_error = e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>());
        if matches!(rustls_error, Some(rustls::Error::InvalidMessage(_))) {
            // What a plain HTTP endpoint answers a ClientHello with.
            return format!("{admin}: TLS: the endpoint does not speak it (node.admin_tls is off there?): leave out --ca");
        }
        let why = quire::tls::tls_failure(&e).unwrap_or_else(|| e.to_string());
        format!("{admin}: {why}")
    };
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: quire\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .and_then(|()| s.flush())
    .map_err(io_failed)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io_failed)?;
    let text = String::from_utf8_lossy(&raw);
    let code = text.split_whitespace().nth(1).unwrap_or("?");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    if code == "200" {
        Ok(body.to_string())
    } else {
        Err(format!("{admin}: {code}: {body}"))
    }
}

/// Prints every node's status as a table (groups, then links), or with
/// `json` as one JSON array: each node's `/status` object with its `addr`
/// added, or `{"addr", "error"}` for a node that did not answer. Returns
/// the nodes that did not answer and the alarms raised; `quire status`
/// exits 1 if either is not zero.
fn status(t: &Target, json: bool) -> Result<(usize, usize), String> {
    let mut c = client(t)?;
    let (mut unreachable, mut alarms) = (0, 0);
    let mut all = Vec::new();
    for (i, addr) in t.addr.iter().enumerate() {
        let v = match c.status(i) {
            Ok(j) => serde_json::from_str::<serde_json::Value>(&j).map_err(|e| e.to_string())?,
            Err(e) => {
                unreachable += 1;
                let why = match e {
                    quire::client::ClientError::Unavailable(why) => why,
                    other => other.to_string(),
                };
                // The client names the address already; say it once.
                let why = why
                    .strip_prefix(&format!("{addr}: "))
                    .unwrap_or(&why)
                    .to_string();
                if json {
                    all.push(serde_json::json!({"addr": addr.to_string(), "error": why}));
                } else {
                    say!("node at {addr}: unreachable ({why})");
                }
                continue;
            }
        };
        alarms += v["alarms"].as_array().map_or(0, Vec::len);
        if json {
            let mut v = v;
            v["addr"] = addr.to_string().into();
            all.push(v);
            continue;
        }
        print_node_status(addr, &v);
    }
    if json {
        println!("{}", serde_json::Value::Array(all));
    }
    Ok((unreachable, alarms))
}

/// A snapshot image a follower is staging, as a line of `quire status`
/// (a follower catching up on gigabytes takes a while: this says how far).
fn image_progress(g: &serde_json::Value) -> Option<String> {
    let s = &g["snapshot"];
    let image = s["image"].as_object()?;
    let n = |k: &str| {
        image
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let resumed = match s["images_resumed"].as_u64() {
        Some(r) if r > 0 => format!(", resumed at {}", s["image_resumed_at"]),
        _ => String::new(),
    };
    Some(format!(
        "catching up: snapshot image at {} staged {:.1}% ({} of {} positions{resumed})",
        n("index"),
        n("held") as f64 * 100.0 / n("total").max(1) as f64,
        n("held"),
        n("total")
    ))
}

/// One group's scrub and repair, as a line of `quire status`.
fn log_health(g: &serde_json::Value) -> String {
    let s = &g["scrub"];
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
    let checked = mib(s["bytes_verified"].as_u64().unwrap_or(0));
    let scrub = if s["bytes_per_s"].as_u64() == Some(0) {
        "scrub off".to_string()
    } else {
        match s["last_pass_age_ms"].as_u64() {
            Some(age) => format!(
                "scrub's last full pass ended {:.1} s ago, took {:.1} s (passes {}, {checked} checked)",
                age as f64 / 1000.0,
                s["last_pass_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
                s["passes"].as_u64().unwrap_or(0)
            ),
            None => format!("scrub: no full pass yet ({checked} checked)"),
        }
    };
    let r = &g["repair"];
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    format!(
        "{scrub}, {} damaged batches found; {} entries repaired from peers, {} missing",
        n(s, "damaged_batches"),
        n(r, "repaired"),
        n(r, "missing")
    )
}

/// One node's `/status` as text: its alarms, groups and links, each link
/// with its peer's classification by the detector (up, ip-partitioned,
/// serial-down, down, unknown).
fn print_node_status(addr: &SocketAddr, v: &serde_json::Value) {
    say!("node {} at {addr}: up {} ms", v["node"], v["uptime_ms"]);
    for alarm in v["alarms"].as_array().into_iter().flatten() {
        say!("  ALARM: {}", alarm.as_str().unwrap_or("?"));
    }
    say!("  group  role           term  leader  prefers  commit  applied  persisted  disk");
    for g in v["groups"].as_array().into_iter().flatten() {
        let n = |k: &str| g[k].as_u64().map_or("-".into(), |x| x.to_string());
        say!(
            "  {:<5}  {:<13}  {:>4}  {:>6}  {:>7}  {:>6}  {:>7}  {:>9}  {}",
            n("group"),
            g["role"].as_str().unwrap_or("?"),
            n("term"),
            n("leader"),
            n("preferred_leader"),
            n("commit"),
            n("applied"),
            n("persisted"),
            g["disk"].as_str().unwrap_or("?")
        );
    }
    for n in v["net"].as_array().into_iter().flatten() {
        say!(
            "  loop {} datagrams: {} ({})",
            n["loop"],
            n["backend"].as_str().unwrap_or("?"),
            n["detail"].as_str().unwrap_or("")
        );
    }
    for g in v["groups"].as_array().into_iter().flatten() {
        say!("  group {} log: {}", g["group"], log_health(g));
        if let Some(line) = image_progress(g) {
            say!("  group {} {line}", g["group"]);
        }
    }
    let peer_status = |peer: &serde_json::Value| {
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["peer"] == *peer)
            .and_then(|p| p["status"].as_str())
            .unwrap_or("-")
            .to_string()
    };
    say!("  peer  channel  state  last heard    rtt       peer status");
    for l in v["links"].as_array().into_iter().flatten() {
        say!(
            "  {:<4}  {:<7}  {:<5}  {:<12}  {:<8}  {}",
            l["peer"].as_u64().map_or("?".into(), |p| p.to_string()),
            l["channel"].as_str().unwrap_or("?"),
            l["state"].as_str().unwrap_or("?"),
            l["last_heard_ago_ms"]
                .as_u64()
                .map_or("never".into(), |t| format!("{t} ms ago")),
            l["rtt_us"]
                .as_u64()
                .map_or("-".into(), |r| format!("{r} us")),
            peer_status(&l["peer"])
        );
    }
    let quotas = v["quotas"].as_array().into_iter().flatten();
    for (i, q) in quotas.enumerate() {
        if i == 0 {
            say!("  principal         quota bytes/s  quota req/s  charged bytes  requests  holds  held");
        }
        let n = |k: &str| q[k].as_u64().map_or("-".into(), |x| x.to_string());
        say!(
            "  {:<16}  {:>13}  {:>11}  {:>13}  {:>8}  {:>5}  {} ms",
            q["principal"].as_str().unwrap_or("?"),
            n("bytes_per_s"),
            n("requests_per_s"),
            n("charged_bytes"),
            n("charged_requests"),
            n("holds"),
            n("held_ms")
        );
    }
}
