//! The clap definitions of every `quire` subcommand but `ledger` and
//! `queue` (state.rs): their doc comments are the help text, the man
//! pages and the completions (docs.rs), so editing one edits those.
//! (clap also reads the doc comment of a struct or enum here, as the about
//! of the command it fills in; what shows is the variant's doc comment or
//! the explicit `about`, applied after it.)

use super::{input, state};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The whole command line, as parsed.
#[derive(Parser, Debug)]
#[command(
    name = "quire",
    version,
    about = "The quire replication appliance: local cluster, status, client",
    after_help = "Exit codes: 0 ok; 1 refused or failed (for `status`: a node did not answer or raises an alarm); 2 bad usage or a bad config file."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Which cluster a client command goes to, and how it authenticates.
#[derive(clap::Args, Debug)]
pub(crate) struct Target {
    /// Client addresses of the cluster's nodes, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) addr: Vec<SocketAddr>,
    /// File holding the client token (the cluster's, or a principal's of
    /// node.credentials_file); not needed with a --cert that names a
    /// principal.
    #[arg(long, required_unless_present = "cert")]
    pub(crate) token_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// How the CLI speaks TLS to the nodes (each flag also read from its
/// environment variable, so a shell can set them once).
#[derive(clap::Args, Debug, Default)]
pub(crate) struct TlsArgs {
    /// CA certificates (PEM) the nodes' certificates must chain to: speak
    /// TLS to them (`quire up` writes DIR/ca.pem). Without it: plain TCP,
    /// which only a node with client.plain = true serves.
    #[arg(long, env = "QUIRE_CA", value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// This client's certificate (PEM), for nodes that ask for one
    /// (client.tls_client_ca_file); needs --key.
    #[arg(long, env = "QUIRE_CERT", value_name = "FILE", requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "QUIRE_KEY", value_name = "FILE", requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// The name the nodes' certificates must carry (by default the IP
    /// address of --addr).
    #[arg(long, env = "QUIRE_TLS_NAME", value_name = "NAME")]
    pub(crate) tls_name: Option<String>,
}

/// The subcommands of `quire`.
#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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

/// The subcommands of `quire tune`.
#[derive(Subcommand, Debug)]
pub(crate) enum TuneCmd {
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
