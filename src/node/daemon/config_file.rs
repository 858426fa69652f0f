//! The daemon's config file: one TOML file per node, parsed into a
//! [`DaemonConfig`] (a [`NodeSpec`] plus what only the daemon needs) and
//! checked whole before anything starts, so that a bad file stops `quired`
//! with one message that names the key and says what is wrong, and exit
//! code 2.
//!
//! This module reads the config file, the cluster key file and the token
//! files, resolves peer host names, and asks the kernel which cores this
//! process may run on. It binds nothing and opens no log: those errors
//! belong to the runtime. The key table is `docs/operating/config.md`
//! (`tests/docs.rs` fails if a key is missing there);
//! `tuning/quired-ts60.toml` is a commented example.
//!
//! `raw` holds the sections as serde sees them (unknown keys denied, every
//! tunable optional so that an absent key takes the default of the config
//! it feeds instead of a second copy of it here) and rewords serde's
//! errors; `placement` (peers, disks, cores, ports), `secrets` (key,
//! tokens, credentials, TLS) and `tunables` hold the checks of each
//! section; `build` below runs
//! them in file order and assembles the result.

/// Copies each present key of a raw section over the default.
macro_rules! set_present {
    ($cfg:expr, $raw:expr; $($field:ident),* $(,)?) => {
        $(if let Some(v) = $raw.$field {
            $cfg.$field = v;
        })*
    };
}

mod placement;
mod raw;
mod secrets;
mod tunables;

use crate::consensus::NodeId;
use crate::node::spec::NodeSpec;
use crate::transport::GroupId;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The exit code of `quired` for a config file it refuses.
pub const EXIT_CODE_BAD_CONFIG: i32 = 2;

/// Bytes a cluster key file must hold at least (after trailing whitespace).
pub const CLUSTER_KEY_BYTES_MIN: usize = 16;

/// Default `node.client_listen`: every address, port 7100.
pub const CLIENT_LISTEN_DEFAULT: &str = "0.0.0.0:7100";

/// Default `node.admin_listen`: loopback only, port 7200 (metrics and
/// status are not for the open network unless the operator says so).
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:7200";

/// Default `serial.baud`.
pub const SERIAL_BAUD_DEFAULT: u32 = 115_200;

/// Everything `quired` runs with, from one config file.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The node: id, voters (this node and its peers), key, peers, groups
    /// (one per disk) and every tunable.
    pub node: NodeSpec,
    /// The cores the event-loop threads are pinned to, one thread each;
    /// group `g` runs on `cores[g % cores.len()]`.
    pub cores: Vec<usize>,
    /// Where clients connect (TCP).
    pub client_listen: SocketAddr,
    /// The admin endpoint: `/metrics`, `/status` and `/membership` (HTTP,
    /// or HTTPS with `admin_tls`).
    pub admin_listen: SocketAddr,
    /// The files the admin endpoint serves HTTPS with (`node.admin_tls`:
    /// the client listener's, client certificates optional); `None`:
    /// plain HTTP.
    pub admin_tls: Option<crate::tls::ServerTlsFiles>,
    /// The client server's connection bounds (`[client]`).
    pub client: crate::node::client::admission::ClientLimits,
    /// The files clients are served TLS with (`client.tls_*`, checked
    /// loadable); `None` where the config says `client.plain = true`.
    pub client_tls: Option<crate::tls::ServerTlsFiles>,
    /// Who clients are and what each may do: the cluster token's
    /// principal (every permission) and those of `node.credentials_file`.
    pub credentials: crate::node::client::credentials::Credentials,
    /// The file holding the clients' auth token (checked readable and not
    /// empty; the server reads it).
    pub token_file: PathBuf,
    /// The file holding the admin token that membership changes through
    /// the admin endpoint need (checked readable, long enough and not the
    /// client token; the endpoint reads it again for each request, so
    /// replacing it rotates the token). `None`: such changes are refused.
    pub admin_token_file: Option<PathBuf>,
    /// Legal but suspicious settings, one line each, for the daemon to log.
    pub warnings: Vec<String>,
}

impl DaemonConfig {
    /// The core that runs group `group`: `cores[group % cores.len()]`.
    pub fn core_of(&self, group: GroupId) -> usize {
        self.cores[group as usize % self.cores.len()]
    }
}

/// A config file `quired` refuses: which file, which key, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The config file.
    pub file: PathBuf,
    /// The key at fault as a path (`peers[1].udp`); empty when the fault
    /// is the file itself (unreadable, not TOML).
    pub key: String,
    /// What is wrong, for the operator.
    pub message: String,
}

impl ConfigError {
    /// The process exit code for this error: always 2.
    pub fn exit_code(&self) -> i32 {
        EXIT_CODE_BAD_CONFIG
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}: {}: {}", self.file.display(), self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Reads and checks the config file at `path` against the cores this
/// process may run on ([`host_cores`]).
pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
    load_with_cores(path, &host_cores())
}

/// [`load`] with the cores that exist given by the caller (tests, or a
/// file checked on another host than the one it is for).
pub fn load_with_cores(
    path: &Path,
    available_cores: &[usize],
) -> Result<DaemonConfig, ConfigError> {
    let fail = |b: Bad| ConfigError {
        file: path.to_path_buf(),
        key: b.key,
        message: b.message,
    };
    let cannot = |e: std::io::Error| {
        fail(Bad {
            key: String::new(),
            message: format!("cannot read it: {e}"),
        })
    };
    let bytes = crate::io::private::read_capped(path, crate::io::private::CONFIG_FILE_BYTES_MAX)
        .map_err(cannot)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        cannot(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })?;
    // Relative paths in the file are relative to the file, not to the
    // daemon's working directory (`/` under systemd).
    let dir = path.parent().unwrap_or(Path::new("."));
    let raw = raw::parse(&text).map_err(fail)?;
    build(raw, dir, available_cores).map_err(fail)
}

/// The cores this process may be pinned to: its affinity mask (the host's
/// cores, less any `taskset` or systemd `CPUAffinity=` limit).
pub fn host_cores() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    if let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        let cores: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect();
        if !cores.is_empty() {
            return cores;
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// A fault found while checking: the key and what is wrong with it.
struct Bad {
    key: String,
    message: String,
}

fn bad(key: impl Into<String>, message: impl Into<String>) -> Bad {
    Bad {
        key: key.into(),
        message: message.into(),
    }
}

/// A message from an embedded config's own `validate()`, under its
/// section. Those messages start with the field at fault ("deadtime_ms 150
/// must exceed ..."), which is also the key: when they do, the key names
/// it (`timers.deadtime_ms: 150 must exceed ...`); otherwise the section.
fn in_section(section: &str, message: String) -> Bad {
    if let Some((first, rest)) = message.split_once(' ') {
        let keyish = (first.contains('_') || first == "baud")
            && first.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        // "a and b must ..." concerns two keys: keep the sentence whole.
        if keyish && !rest.starts_with("and ") {
            return bad(format!("{section}.{first}"), rest);
        }
    }
    bad(section, message)
}

/// `p`, relative to the config file's directory unless absolute.
fn resolve(dir: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// Checks the sections in the order of the file and assembles the node.
fn build(raw: raw::RawFile, dir: &Path, available_cores: &[usize]) -> Result<DaemonConfig, Bad> {
    let mut warnings = Vec::new();
    let id = raw.node.id;
    if id == 0 {
        return Err(bad("node.id", "node id 0 is reserved"));
    }
    let peers = placement::peers(id, &raw.peers, dir)?;
    let groups = placement::disks(&raw.disks, dir)?;
    let (cores, groups_per_core_max) = placement::cores(
        raw.node.cores.clone(),
        available_cores,
        groups.len(),
        &mut warnings,
    )?;
    let (client_listen, admin_listen) = placement::listen(&raw.node)?;
    let udp = placement::udp(raw.udp, &groups)?;
    let listen = [
        ("node.client_listen", client_listen),
        ("node.admin_listen", admin_listen),
    ];
    placement::ports(&udp, &groups, listen, &peers)?;
    let mut voters: Vec<NodeId> = peers.iter().map(|p| p.id).chain([id]).collect();
    voters.sort_unstable();
    let stall_grace_ms = raw
        .timers
        .stall_grace_ms
        .unwrap_or(crate::node::STALL_GRACE_MS);
    let preferred_leaders = raw.timers.preferred_leaders.unwrap_or(true);
    let (detector, mut raft) = tunables::timers(raw.timers, id, voters.clone(), &mut warnings)?;
    let snapshot_interval_ms = tunables::snapshot(raw.snapshot, &mut raft)?;
    let recycled_given = raw.storage.segments_recycled_max.is_some();
    let mut wal = tunables::storage(raw.storage, detector.disk_stall_ms)?;
    if !recycled_given {
        wal.segments_recycled_max =
            crate::storage::wal::segments_recycled_for(raft.snapshot_bytes, wal.segment_bytes);
    }
    let transport = tunables::transport(raw.transport, peers.len())?;
    // A chunk of whole entries may pass it by one entry: half leaves room.
    if raft.snapshot_chunk_bytes > transport.message_bytes_max / 2 {
        return Err(bad(
            "snapshot.chunk_bytes",
            format!(
                "{} is more than half of transport.message_bytes_max ({})",
                raft.snapshot_chunk_bytes, transport.message_bytes_max
            ),
        ));
    }
    tunables::entries_fit(&wal, &transport, &mut warnings);
    let client = tunables::client(&raw.client)?;
    let net = placement::net(raw.net)?;
    let serial_baud = tunables::serial(
        raw.serial,
        &peers,
        groups_per_core_max,
        detector.keepalive_ms,
        &mut warnings,
    )?;
    // Secrets last: the rest of the file is worth checking without them.
    let key = secrets::cluster_key(&raw.node, dir, &mut warnings)?;
    let token_file = resolve(dir, &raw.node.auth_token_file);
    let client_token = secrets::read_secret("node.auth_token_file", &token_file, &mut warnings)?;
    let admin_token_file = secrets::admin_token(&raw.node, dir, &client_token, &mut warnings)?;
    let client_tls = secrets::client_tls(&raw.client, dir)?;
    let admin_tls = secrets::admin_tls(&raw.node, client_tls.as_ref())?;
    let mtls = client_tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let credentials = secrets::credentials(&raw.node, dir, &client_token, mtls, &mut warnings)?;

    let node = NodeSpec {
        id,
        voters,
        key,
        peers,
        groups,
        raft,
        preferred_leaders,
        wal,
        transport,
        udp,
        detector,
        serial_baud,
        snapshot_interval_ms,
        stall_grace_ms,
        net,
    };
    // Everything above covers what this checks; a message from here is a
    // gap in this module, still better than a refusal at spawn.
    node.validate().map_err(|e| bad("node", e.to_string()))?;
    Ok(DaemonConfig {
        node,
        cores,
        client_listen,
        admin_listen,
        admin_tls,
        client,
        client_tls,
        credentials,
        token_file,
        admin_token_file,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cores_are_not_empty() {
        assert!(!host_cores().is_empty());
    }
}
