//! The daemon's config file: one TOML file per node, parsed into a
//! [`DaemonConfig`] (a [`NodeSpec`] plus what only the daemon needs) and
//! checked whole before anything starts, so that a bad file stops `quired`
//! with one message that names the key and says what is wrong, and exit
//! code 2.
//!
//! This module reads the config file, the cluster key file and the token
//! file, resolves peer host names, and asks the kernel which cores this
//! process may run on. It binds nothing and opens no log: those errors
//! belong to the runtime. The key table is in the README ("Node config
//! file"); `tuning/quired-ts60.toml` is a commented example.
//!
//! Every section maps onto a private `Raw*` struct with
//! `deny_unknown_fields` and every tunable optional, so that an absent key
//! takes the default of the config it feeds (`RaftConfig::new`,
//! `WalConfig::default`, ...) instead of a second copy of it here.

use super::config::{GroupSpec, NodeSpec, PeerSpec};
use crate::consensus::{NodeId, RaftConfig};
use crate::heartbeat::message::{MAX_GROUPS, MAX_PEERS};
use crate::heartbeat::DetectorConfig;
use crate::io::BackendChoice;
use crate::net::UdpConfig;
use crate::serial::SerialConfig;
use crate::storage::format::BLOCK_BYTES;
use crate::storage::WalConfig;
use crate::transport::{ClusterKey, GroupId, TransportConfig};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
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
    /// The admin endpoint: `/metrics` and `/status` (HTTP).
    pub admin_listen: SocketAddr,
    /// The file holding the clients' auth token (checked readable and not
    /// empty; the server reads it).
    pub token_file: PathBuf,
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
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(Bad {
            key: String::new(),
            message: format!("cannot read it: {e}"),
        })
    })?;
    // Relative paths in the file are relative to the file, not to the
    // daemon's working directory (`/` under systemd).
    let dir = path.parent().unwrap_or(Path::new("."));
    let raw = parse(&text).map_err(fail)?;
    build(raw, dir, available_cores).map_err(fail)
}

/// The cores this process may be pinned to: its affinity mask (the host's
/// cores, less any `taskset` or systemd `CPUAffinity=` limit).
pub fn host_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bytes; sched_getaffinity fills at most
    // the size it is given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect();
            if !cores.is_empty() {
                return cores;
            }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    node: RawNode,
    #[serde(default)]
    peers: Vec<RawPeer>,
    disks: Vec<RawDisk>,
    #[serde(default)]
    udp: RawUdp,
    #[serde(default)]
    timers: RawTimers,
    #[serde(default)]
    storage: RawStorage,
    #[serde(default)]
    transport: RawTransport,
    #[serde(default)]
    serial: RawSerial,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: NodeId,
    cluster_key_file: PathBuf,
    auth_token_file: PathBuf,
    cores: Option<Vec<usize>>,
    client_listen: Option<String>,
    admin_listen: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    id: NodeId,
    udp: String,
    serial: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDisk {
    path: PathBuf,
    group: GroupId,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUdp {
    bind: Option<String>,
    base_port: Option<u16>,
    recv_buffer_bytes: Option<usize>,
    send_buffer_bytes: Option<usize>,
    send_batch_datagrams_max: Option<usize>,
    recv_batch_max: Option<usize>,
    recv_datagrams_per_run_max: Option<usize>,
    gso: Option<bool>,
    gso_segments_max: Option<usize>,
    gro: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimers {
    keepalive_ms: Option<u64>,
    warntime_ms: Option<u64>,
    deadtime_ms: Option<u64>,
    initdead_ms: Option<u64>,
    disk_stall_ms: Option<u64>,
    election_timeout_ms: Option<u64>,
    heartbeat_interval_ms: Option<u64>,
    fast_campaign_jitter_ms: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    segment_bytes: Option<u64>,
    flush_bytes_max: Option<usize>,
    flushes_in_flight_max: Option<u32>,
    backend: Option<String>,
    direct_io: Option<bool>,
    read_cache_bytes: Option<usize>,
    space_retry_ms: Option<u64>,
    segments_ahead: Option<u32>,
    segments_recycled_max: Option<u32>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransport {
    mtu_bytes: Option<usize>,
    window_bytes: Option<usize>,
    window_frames_max: Option<usize>,
    history_bytes_max: Option<usize>,
    message_bytes_max: Option<usize>,
    holdback_bytes_max: Option<usize>,
    holdback_frames_max: Option<usize>,
    events_bytes_max: Option<usize>,
    nack_delay_min_us: Option<u64>,
    nack_delay_max_us: Option<u64>,
    nack_interval_ms: Option<u64>,
    nack_ranges_max: Option<usize>,
    rexmit_batch_max: Option<usize>,
    rexmit_min_interval_ms: Option<u64>,
    ack_delay_us: Option<u64>,
    ack_every_bytes: Option<usize>,
    probe_interval_ms: Option<u64>,
    peers_max: Option<usize>,
    channels_max: Option<usize>,
    retired_epochs_max: Option<usize>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSerial {
    baud: Option<u32>,
}

/// Copies each present key of a raw section over the default.
macro_rules! set_present {
    ($cfg:expr, $raw:expr; $($field:ident),* $(,)?) => {
        $(if let Some(v) = $raw.$field {
            $cfg.$field = v;
        })*
    };
}

/// TOML text to the raw sections; type errors, missing and unknown keys
/// are named by their key path.
fn parse(text: &str) -> Result<RawFile, Bad> {
    let de = toml::Deserializer::parse(text).map_err(|e| {
        bad(
            "",
            format!("not valid TOML{}: {}", at_line(text, &e), e.message()),
        )
    })?;
    serde_path_to_error::deserialize::<_, RawFile>(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        serde_error(text, &path, &inner)
    })
}

/// " (line N)" for an error with a span.
fn at_line(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() || path == "." {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rewrites serde's messages for missing and unknown fields in the file's
/// terms (keys, not fields), with the key path in front.
fn serde_error(text: &str, path: &str, e: &toml::de::Error) -> Bad {
    let msg = e.message();
    let line = at_line(text, e);
    // serde's wording: "missing field `id`".
    if let Some(name) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        // The span is the table's: no use for the top level.
        let line = if path == "." { "" } else { line.as_str() };
        return bad(
            join_key(path, name),
            format!("missing; this key is required{line}"),
        );
    }
    // serde's wording: "unknown field `x`, expected one of `a`, `b`" (or
    // "expected `a`", or "there are no fields").
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, expected)) = rest.split_once('`') {
            let expected = expected
                .trim_start_matches(", ")
                .replace("expected one of ", "")
                .replace("expected ", "")
                .replace("` or `", ", ")
                .replace('`', "");
            // The path already ends with the unknown key.
            let key = if path == name || path.ends_with(&format!(".{name}")) {
                path.to_string()
            } else {
                join_key(path, name)
            };
            return bad(
                key,
                format!("unknown key{line}; the keys here are: {expected}"),
            );
        }
    }
    let key = if path == "." { "" } else { path };
    bad(key, format!("{}{line}", plain_types(msg)))
}

/// serde names Rust types ("expected u16"); the operator wants the range.
fn plain_types(msg: &str) -> String {
    msg.replace("expected u16", "expected an integer in 0..=65535")
        .replace("expected u32", "expected an integer in 0..=4294967295")
        .replace("expected u64", "expected an integer >= 0")
        .replace("expected usize", "expected an integer >= 0")
}

/// "0-1,4,6-7".
fn core_ranges(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

fn resolve(dir: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// `host:port` (an IP literal, or a name resolved now, first address wins).
fn host_port(key: &str, s: &str) -> Result<SocketAddr, Bad> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let not = || bad(key, format!("{s:?} is not a host:port"));
    let (host, port) = s.rsplit_once(':').ok_or_else(not)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(not());
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| bad(key, format!("{s:?}: {host} has no address"))),
        Err(e) => Err(bad(key, format!("{s:?}: cannot resolve {host}: {e}"))),
    }
}

/// A listen address: an IP literal and a port (no name lookups for what
/// this host binds).
fn listen_addr(key: &str, s: Option<&str>, default: &str) -> Result<SocketAddr, Bad> {
    let s = s.unwrap_or(default);
    let a: SocketAddr = s
        .parse()
        .map_err(|_| bad(key, format!("{s:?} is not an ip:port")))?;
    if a.port() == 0 {
        return Err(bad(key, "port 0: clients need a fixed port"));
    }
    Ok(a)
}

/// Reads a secret file: it must exist and hold something.
fn read_secret(key: &str, path: &Path, warnings: &mut Vec<String>) -> Result<Vec<u8>, Bad> {
    let bytes = std::fs::read(path)
        .map_err(|e| bad(key, format!("{}: cannot read it: {e}", path.display())))?;
    let len = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    if len == 0 {
        return Err(bad(key, format!("{} is empty", path.display())));
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            warnings.push(format!(
                "{key}: {} is readable by other users (chmod 600 it)",
                path.display()
            ));
        }
    }
    Ok(bytes[..len].to_vec())
}

/// One use of a port, for the "same port twice" check.
struct PortUse {
    ip: IpAddr,
    port: u16,
    /// On this host (a socket or listener of ours), not a peer's.
    local: bool,
    /// The key to name if this is the second use.
    key: String,
    /// What uses it, for the message.
    role: String,
}

/// Two uses collide when they may be the same port of the same host: any
/// two of ours (UDP or TCP, whatever the address: one number, one role
/// keeps firewall rules and IRQ steering honest), ours and a peer's on the
/// same address or loopback, or two peers' on the same address.
fn collide(a: &PortUse, b: &PortUse) -> bool {
    if a.port != b.port {
        return false;
    }
    let local_ip = |ip: &IpAddr| ip.is_loopback() || ip.is_unspecified();
    match (a.local, b.local) {
        (true, true) => true,
        (false, false) => a.ip == b.ip,
        _ => a.ip == b.ip || (local_ip(&a.ip) && local_ip(&b.ip)),
    }
}

fn build(raw: RawFile, dir: &Path, available_cores: &[usize]) -> Result<DaemonConfig, Bad> {
    let mut warnings = Vec::new();
    let id = raw.node.id;
    if id == 0 {
        return Err(bad("node.id", "node id 0 is reserved"));
    }

    // Peers.
    let mut peers: Vec<PeerSpec> = Vec::new();
    let mut peer_index: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut serial_index: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, p) in raw.peers.iter().enumerate() {
        let k = |f: &str| format!("peers[{i}].{f}");
        if p.id == 0 {
            return Err(bad(k("id"), "node id 0 is reserved"));
        }
        if p.id == id {
            return Err(bad(
                k("id"),
                format!("{} is this node's id (node.id)", p.id),
            ));
        }
        if let Some(j) = peer_index.insert(p.id, i) {
            return Err(bad(
                k("id"),
                format!("node {} appears twice (peers[{j}] and peers[{i}])", p.id),
            ));
        }
        let udp = host_port(&k("udp"), &p.udp)?;
        if udp.ip().is_unspecified() || udp.ip().is_multicast() {
            return Err(bad(
                k("udp"),
                format!("{} is not an address a peer can be reached at", udp.ip()),
            ));
        }
        if udp.port() == 0 {
            return Err(bad(k("udp"), "port 0: give the peer's udp.base_port"));
        }
        let serial_device = match &p.serial {
            None => None,
            Some(dev) if dev.as_os_str().is_empty() => {
                return Err(bad(k("serial"), "empty device path"));
            }
            Some(dev) => {
                let dev = resolve(dir, dev);
                if let Some(j) = serial_index.insert(dev.clone(), i) {
                    return Err(bad(
                        k("serial"),
                        format!(
                            "{} is also peers[{j}].serial: one cable runs to one peer",
                            dev.display()
                        ),
                    ));
                }
                Some(dev)
            }
        };
        peers.push(PeerSpec {
            id: p.id,
            udp_base: udp,
            serial_device,
        });
    }

    if peers.len() > MAX_PEERS {
        return Err(bad(
            "peers",
            format!(
                "{} peers; a heartbeat carries the view of at most {MAX_PEERS} (quire runs 3 or 5 nodes)",
                peers.len()
            ),
        ));
    }

    // Disks: one group each.
    if raw.disks.is_empty() {
        return Err(bad(
            "disks",
            "no disks: a node needs at least one [[disks]] (one group per disk)",
        ));
    }
    let mut groups: Vec<GroupSpec> = Vec::new();
    let mut group_index: BTreeMap<GroupId, usize> = BTreeMap::new();
    let mut path_index: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, d) in raw.disks.iter().enumerate() {
        if d.path.as_os_str().is_empty() {
            return Err(bad(format!("disks[{i}].path"), "empty path"));
        }
        if let Some(j) = group_index.insert(d.group, i) {
            return Err(bad(
                format!("disks[{i}].group"),
                format!(
                    "group {} appears twice (disks[{j}] and disks[{i}]): a group has one disk",
                    d.group
                ),
            ));
        }
        let path = resolve(dir, &d.path);
        if let Some(j) = path_index.insert(path.clone(), i) {
            return Err(bad(
                format!("disks[{i}].path"),
                format!(
                    "{} is also disks[{j}].path: a disk holds one group",
                    path.display()
                ),
            ));
        }
        groups.push(GroupSpec {
            group: d.group,
            dir: path,
        });
    }

    // Cores.
    let cores = raw.node.cores.unwrap_or_else(|| vec![0]);
    if cores.is_empty() {
        return Err(bad("node.cores", "empty: give at least one core"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for &c in &cores {
        if !seen.insert(c) {
            return Err(bad("node.cores", format!("core {c} appears twice")));
        }
        if !available_cores.contains(&c) {
            return Err(bad(
                "node.cores",
                format!(
                    "core {c} is not available on this host ({})",
                    core_ranges(available_cores)
                ),
            ));
        }
    }
    // Each core's loop sends one heartbeat carrying its groups' status,
    // and the message holds at most MAX_GROUPS of them (the rest would go
    // unreported: no disk-stall flag for them over serial).
    let groups_per_core_max = groups.len().div_ceil(cores.len());
    if groups_per_core_max > MAX_GROUPS {
        warnings.push(format!(
            "node.cores: {} groups on {} cores puts {groups_per_core_max} on one core; a heartbeat reports at most {MAX_GROUPS}: add cores",
            groups.len(),
            cores.len()
        ));
    }
    if cores.len() > groups.len() {
        warnings.push(format!(
            "node.cores: {} cores for {} groups: {} threads will have no group",
            cores.len(),
            groups.len(),
            cores.len() - groups.len()
        ));
    }

    // Listen addresses.
    let client_listen = listen_addr(
        "node.client_listen",
        raw.node.client_listen.as_deref(),
        CLIENT_LISTEN_DEFAULT,
    )?;
    let admin_listen = listen_addr(
        "node.admin_listen",
        raw.node.admin_listen.as_deref(),
        ADMIN_LISTEN_DEFAULT,
    )?;

    // UDP.
    let mut udp = UdpConfig {
        groups: groups.iter().map(|g| g.group).collect(),
        ..UdpConfig::default()
    };
    if let Some(b) = &raw.udp.bind {
        udp.bind_ip = b
            .parse()
            .map_err(|_| bad("udp.bind", format!("{b:?} is not an IP address")))?;
    }
    let r = raw.udp;
    set_present!(udp, r; base_port, recv_buffer_bytes, send_buffer_bytes,
        send_batch_datagrams_max, recv_batch_max, recv_datagrams_per_run_max, gso,
        gso_segments_max, gro);
    if udp.base_port == 0 {
        return Err(bad(
            "udp.base_port",
            "0 lets the kernel pick ports, which peers cannot know; give a fixed port",
        ));
    }
    udp.validate().map_err(|e| bad("udp", e))?;

    // The same port twice, in any role.
    let mut uses: Vec<PortUse> = Vec::new();
    for g in &groups {
        // validate() checked base_port + g fits.
        uses.push(PortUse {
            ip: udp.bind_ip,
            port: (udp.base_port as u32 + g.group) as u16,
            local: true,
            key: "udp.base_port".into(),
            role: format!("udp.base_port + group {}", g.group),
        });
    }
    for (key, a) in [
        ("node.client_listen", client_listen),
        ("node.admin_listen", admin_listen),
    ] {
        uses.push(PortUse {
            ip: a.ip(),
            port: a.port(),
            local: true,
            key: key.into(),
            role: key.into(),
        });
    }
    for (i, p) in peers.iter().enumerate() {
        // Every node runs the same groups, each at its base port + group.
        for g in &groups {
            let port = p.udp_base.port() as u64 + g.group as u64;
            let port = u16::try_from(port).map_err(|_| {
                bad(
                    format!("peers[{i}].udp"),
                    format!(
                        "port {} + group {} is beyond port 65535",
                        p.udp_base.port(),
                        g.group
                    ),
                )
            })?;
            uses.push(PortUse {
                ip: p.udp_base.ip(),
                port,
                local: false,
                key: format!("peers[{i}].udp"),
                role: format!("peers[{i}].udp + group {}", g.group),
            });
        }
    }
    for j in 0..uses.len() {
        if let Some(a) = uses[..j].iter().find(|a| collide(a, &uses[j])) {
            let b = &uses[j];
            return Err(bad(
                b.key.clone(),
                format!("port {} is used twice ({} and {})", b.port, a.role, b.role),
            ));
        }
    }

    // Timers: the detector's and Raft's.
    let t = raw.timers;
    let mut detector = DetectorConfig::default();
    set_present!(detector, t; keepalive_ms, warntime_ms, deadtime_ms, initdead_ms,
        disk_stall_ms);
    detector.validate().map_err(|e| bad("timers", e.0))?;
    let mut voters: Vec<NodeId> = peers.iter().map(|p| p.id).chain([id]).collect();
    voters.sort_unstable();
    let mut raft = RaftConfig::new(id, voters.clone());
    set_present!(raft, t; election_timeout_ms, heartbeat_interval_ms, fast_campaign_jitter_ms);
    // RaftConfig's own check asserts (a programming error there); here the
    // same rules are an operator's mistake and get a message.
    if raft.heartbeat_interval_ms == 0 {
        return Err(bad("timers.heartbeat_interval_ms", "must be at least 1"));
    }
    if raft.election_timeout_ms <= raft.heartbeat_interval_ms {
        return Err(bad(
            "timers.election_timeout_ms",
            format!(
                "{} must exceed heartbeat_interval_ms ({}): followers would campaign between heartbeats",
                raft.election_timeout_ms, raft.heartbeat_interval_ms
            ),
        ));
    }
    if detector.deadtime_ms < 5 * detector.keepalive_ms {
        warnings.push(format!(
            "timers.deadtime_ms: {} is under five keepalives ({} ms): a few lost heartbeats look like death",
            detector.deadtime_ms,
            5 * detector.keepalive_ms
        ));
    }

    // Storage.
    let s = raw.storage;
    let mut wal = WalConfig {
        disk_stall_ms: detector.disk_stall_ms,
        ..WalConfig::default()
    };
    if let Some(b) = &s.backend {
        wal.backend = b
            .parse::<BackendChoice>()
            .map_err(|e| bad("storage.backend", e))?;
    }
    set_present!(wal, s; segment_bytes, flush_bytes_max, flushes_in_flight_max, direct_io,
        read_cache_bytes, space_retry_ms, segments_ahead, segments_recycled_max);
    if wal.flush_bytes_max == 0 {
        return Err(bad("storage.flush_bytes_max", "must be at least 1"));
    }
    // The rule `Wal::open` enforces, caught before any disk is touched.
    if wal.segment_bytes % BLOCK_BYTES as u64 != 0
        || wal.segment_bytes < 2 * wal.flush_bytes_max as u64
    {
        return Err(bad(
            "storage.segment_bytes",
            format!(
                "{} must be a multiple of {BLOCK_BYTES} and at least twice flush_bytes_max ({})",
                wal.segment_bytes, wal.flush_bytes_max
            ),
        ));
    }
    if wal.flushes_in_flight_max == 0 {
        return Err(bad("storage.flushes_in_flight_max", "must be at least 1"));
    }
    if wal.space_retry_ms == 0 {
        return Err(bad("storage.space_retry_ms", "must be at least 1"));
    }

    // Transport.
    let tr = raw.transport;
    let mut transport = TransportConfig::default();
    set_present!(transport, tr; mtu_bytes, window_bytes, window_frames_max, history_bytes_max,
        message_bytes_max, holdback_bytes_max, holdback_frames_max, events_bytes_max,
        nack_delay_min_us, nack_delay_max_us, nack_interval_ms, nack_ranges_max,
        rexmit_batch_max, rexmit_min_interval_ms, ack_delay_us, ack_every_bytes,
        probe_interval_ms, peers_max, channels_max, retired_epochs_max);
    transport.validate().map_err(|e| bad("transport", e.0))?;
    if peers.len() > transport.peers_max {
        return Err(bad(
            "transport.peers_max",
            format!(
                "{} is fewer than the {} peers",
                transport.peers_max,
                peers.len()
            ),
        ));
    }

    // Serial.
    let serial_baud = raw.serial.baud.unwrap_or(SERIAL_BAUD_DEFAULT);
    SerialConfig {
        baud: serial_baud,
        ..SerialConfig::new("")
    }
    .validate()
    .map_err(|e| bad("serial", e))?;
    if peers.iter().any(|p| p.serial_device.is_some()) {
        // A heartbeat on the line: 30 header + 46 a group + 10 a peer,
        // plus about 23 of MAC, envelope and framing (142 -> 165 bytes).
        let line_bytes = 30 + 46 * groups_per_core_max.min(MAX_GROUPS) + 10 * peers.len() + 23;
        let airtime_ms = SerialConfig {
            baud: serial_baud,
            ..SerialConfig::new("")
        }
        .airtime_us(line_bytes)
            / 1000;
        if airtime_ms * 2 > detector.keepalive_ms {
            warnings.push(format!(
                "serial.baud: a heartbeat ({line_bytes} bytes) takes {airtime_ms} ms on the line at {serial_baud} baud, over half of keepalive_ms ({}): raise the baud or the keepalive",
                detector.keepalive_ms
            ));
        }
    }

    // Secrets last: the rest of the file is worth checking without them.
    let key_file = resolve(dir, &raw.node.cluster_key_file);
    let secret = read_secret("node.cluster_key_file", &key_file, &mut warnings)?;
    if secret.len() < CLUSTER_KEY_BYTES_MIN {
        return Err(bad(
            "node.cluster_key_file",
            format!(
                "{} holds {} bytes; at least {CLUSTER_KEY_BYTES_MIN} are needed (head -c 32 /dev/urandom | base64 > FILE)",
                key_file.display(),
                secret.len()
            ),
        ));
    }
    let token_file = resolve(dir, &raw.node.auth_token_file);
    read_secret("node.auth_token_file", &token_file, &mut warnings)?;

    let node = NodeSpec {
        id,
        voters,
        key: ClusterKey::derive(&secret),
        peers,
        groups,
        raft,
        wal,
        transport,
        udp,
        detector,
        serial_baud,
    };
    // Everything above covers what this checks; a message from here is a
    // gap in this module, still better than a refusal at spawn.
    node.validate().map_err(|e| bad("node", e))?;
    Ok(DaemonConfig {
        node,
        cores,
        client_listen,
        admin_listen,
        token_file,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_ranges_compress() {
        assert_eq!(core_ranges(&[0, 1]), "0-1");
        assert_eq!(core_ranges(&[7, 0, 1, 2, 4]), "0-2,4,7");
        assert_eq!(core_ranges(&[]), "");
    }

    #[test]
    fn host_cores_are_not_empty() {
        assert!(!host_cores().is_empty());
    }

    #[test]
    fn ports_collide_only_where_they_may_share_a_host() {
        let u = |ip: &str, port, local| PortUse {
            ip: ip.parse().unwrap(),
            port,
            local,
            key: String::new(),
            role: String::new(),
        };
        assert!(collide(
            &u("0.0.0.0", 7400, true),
            &u("127.0.0.1", 7400, true)
        ));
        assert!(collide(
            &u("0.0.0.0", 7400, true),
            &u("127.0.0.1", 7400, false)
        ));
        assert!(!collide(
            &u("0.0.0.0", 7400, true),
            &u("10.0.0.2", 7400, false)
        ));
        assert!(collide(
            &u("10.0.0.2", 7400, false),
            &u("10.0.0.2", 7400, false)
        ));
        assert!(!collide(
            &u("10.0.0.2", 7400, false),
            &u("10.0.0.3", 7400, false)
        ));
        assert!(!collide(
            &u("10.0.0.2", 7400, false),
            &u("10.0.0.2", 7401, false)
        ));
    }
}
