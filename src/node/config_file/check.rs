//! The checks of each section once its types are right: what a key
//! holds, how keys fit together, and what the host has. Each returns the
//! first fault, naming its key.

use super::raw::{
    RawClient, RawDisk, RawNet, RawNode, RawPeer, RawSerial, RawSnapshot, RawStorage, RawTimers,
    RawTransport, RawUdp,
};
use super::{
    bad, Bad, ADMIN_LISTEN_DEFAULT, CLIENT_LISTEN_DEFAULT, CLUSTER_KEY_BYTES_MIN,
    SERIAL_BAUD_DEFAULT,
};
use crate::consensus::{NodeId, RaftConfig};
use crate::heartbeat::message::{GROUPS_MAX, PEERS_MAX};
use crate::heartbeat::DetectorConfig;
use crate::io::BackendChoice;
use crate::net::UdpConfig;
use crate::node::client_admission::ClientLimits;
use crate::node::config::{GroupSpec, PeerSpec};
use crate::node::credentials::ADMIN_TOKEN_BYTES_MIN;
use crate::node::credentials::{Credentials, Principal, RawCredentials, GRANTS_PER_PRINCIPAL_MAX};
use crate::serial::SerialConfig;
use crate::storage::format::BLOCK_BYTES;
use crate::storage::WalConfig;
use crate::tls::{ServerTlsFiles, TlsFileRole, TlsVersion};
use crate::transport::{ClusterKey, GroupId, TransportConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

/// Copies each present key of a raw section over the default.
macro_rules! set_present {
    ($cfg:expr, $raw:expr; $($field:ident),* $(,)?) => {
        $(if let Some(v) = $raw.$field {
            $cfg.$field = v;
        })*
    };
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

/// `[[peers]]`: ids non-zero, distinct and not this node's; reachable
/// addresses; one cable per serial device.
pub(super) fn peers(id: NodeId, raw: &[RawPeer], dir: &Path) -> Result<Vec<PeerSpec>, Bad> {
    let mut peers: Vec<PeerSpec> = Vec::new();
    let mut peer_index: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut serial_index: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, p) in raw.iter().enumerate() {
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

    if peers.len() > PEERS_MAX {
        return Err(bad(
            "peers",
            format!(
                "{} peers; a heartbeat carries the view of at most {PEERS_MAX} (quire runs 3 or 5 nodes)",
                peers.len()
            ),
        ));
    }
    Ok(peers)
}

/// `[[disks]]`: at least one; each group and each path once.
pub(super) fn disks(raw: &[RawDisk], dir: &Path) -> Result<Vec<GroupSpec>, Bad> {
    if raw.is_empty() {
        return Err(bad(
            "disks",
            "no disks: a node needs at least one [[disks]] (one group per disk)",
        ));
    }
    let mut groups: Vec<GroupSpec> = Vec::new();
    let mut group_index: BTreeMap<GroupId, usize> = BTreeMap::new();
    let mut path_index: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, d) in raw.iter().enumerate() {
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
    Ok(groups)
}

/// `node.cores`: listed once each, all available here. Returns the cores
/// and the most groups one core runs.
pub(super) fn cores(
    raw: Option<Vec<usize>>,
    available_cores: &[usize],
    groups: usize,
    warnings: &mut Vec<String>,
) -> Result<(Vec<usize>, usize), Bad> {
    let cores = raw.unwrap_or_else(|| vec![0]);
    if cores.is_empty() {
        return Err(bad("node.cores", "empty: give at least one core"));
    }
    let mut seen = BTreeSet::new();
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
    // and the message holds at most GROUPS_MAX of them (the rest would go
    // unreported: no disk-stall flag for them over serial).
    let groups_per_core_max = groups.div_ceil(cores.len());
    if groups_per_core_max > GROUPS_MAX {
        warnings.push(format!(
            "node.cores: {} groups on {} cores puts {groups_per_core_max} on one core; a heartbeat reports at most {GROUPS_MAX}: add cores",
            groups,
            cores.len()
        ));
    }
    if cores.len() > groups {
        warnings.push(format!(
            "node.cores: {} cores for {} groups: {} threads will have no group",
            cores.len(),
            groups,
            cores.len() - groups
        ));
    }
    Ok((cores, groups_per_core_max))
}

/// `node.client_listen` and `node.admin_listen`.
pub(super) fn listen(raw: &RawNode) -> Result<(SocketAddr, SocketAddr), Bad> {
    let client_listen = listen_addr(
        "node.client_listen",
        raw.client_listen.as_deref(),
        CLIENT_LISTEN_DEFAULT,
    )?;
    let admin_listen = listen_addr(
        "node.admin_listen",
        raw.admin_listen.as_deref(),
        ADMIN_LISTEN_DEFAULT,
    )?;
    Ok((client_listen, admin_listen))
}

/// `[udp]`: a fixed base port, and the driver's own checks.
pub(super) fn udp(raw: RawUdp, groups: &[GroupSpec]) -> Result<UdpConfig, Bad> {
    let mut udp = UdpConfig {
        groups: groups.iter().map(|g| g.group).collect(),
        ..UdpConfig::default()
    };
    if let Some(b) = &raw.bind {
        udp.bind_ip = b
            .parse()
            .map_err(|_| bad("udp.bind", format!("{b:?} is not an IP address")))?;
    }
    set_present!(udp, raw; base_port, recv_buffer_bytes, send_buffer_bytes,
        send_batch_datagrams_max, recv_batch_max, recv_datagrams_per_run_max, gso,
        gso_segments_max, gro);
    if udp.base_port == 0 {
        return Err(bad(
            "udp.base_port",
            "0 lets the kernel pick ports, which peers cannot know; give a fixed port",
        ));
    }
    udp.validate().map_err(|e| in_section("udp", e))?;
    Ok(udp)
}

/// `[net]`: the datagram path and the AF_XDP settings.
pub(super) fn net(raw: RawNet) -> Result<crate::net::xdp::XdpConfig, Bad> {
    let mut net = crate::net::xdp::XdpConfig::default();
    if let Some(b) = &raw.backend {
        net.backend = b.parse().map_err(|e: String| bad("net.backend", e))?;
    }
    if let Some(f) = raw.xdp_umem_frames {
        net.umem_frames = f;
    }
    if let Some(z) = raw.xdp_zero_copy {
        net.zero_copy = z;
    }
    net.validate().map_err(|e| bad("net.xdp_umem_frames", e))?;
    Ok(net)
}

/// The same port twice, in any role (see [`collide`]).
pub(super) fn ports(
    udp: &UdpConfig,
    groups: &[GroupSpec],
    listen: [(&str, SocketAddr); 2],
    peers: &[PeerSpec],
) -> Result<(), Bad> {
    let mut uses: Vec<PortUse> = Vec::new();
    for g in groups {
        // validate() checked base_port + g fits.
        uses.push(PortUse {
            ip: udp.bind_ip,
            port: (udp.base_port as u32 + g.group) as u16,
            local: true,
            key: "udp.base_port".into(),
            role: format!("udp.base_port + group {}", g.group),
        });
    }
    for (key, a) in listen {
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
        for g in groups {
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
    Ok(())
}

/// `[timers]`: the detector's (its own check) and Raft's.
pub(super) fn timers(
    raw: RawTimers,
    id: NodeId,
    voters: Vec<NodeId>,
    warnings: &mut Vec<String>,
) -> Result<(DetectorConfig, RaftConfig), Bad> {
    let t = raw;
    let mut detector = DetectorConfig::default();
    set_present!(detector, t; keepalive_ms, warntime_ms, deadtime_ms, initdead_ms,
        disk_stall_ms);
    detector.validate().map_err(|e| in_section("timers", e.0))?;
    let mut raft = RaftConfig::new(id, voters);
    set_present!(raft, t; election_timeout_ms, heartbeat_interval_ms, fast_campaign_jitter_ms,
        preferred_leader_hold_ms);
    // Raft's own check, under the key of the field at fault: of this
    // section's keys only the timers can be wrong (id is node.id, checked
    // first; the limits are not in the file).
    raft.validate().map_err(|e| match e.field() {
        f @ ("election_timeout_ms"
        | "heartbeat_interval_ms"
        | "fast_campaign_jitter_ms"
        | "preferred_leader_hold_ms") => bad(format!("timers.{f}"), e.reason()),
        _ => bad("timers", e.to_string()),
    })?;
    if detector.deadtime_ms < 5 * detector.keepalive_ms {
        warnings.push(format!(
            "timers.deadtime_ms: {} is under five keepalives ({} ms): a few lost heartbeats look like death",
            detector.deadtime_ms,
            5 * detector.keepalive_ms
        ));
    }
    Ok((detector, raft))
}

/// `[client]`: the client server's connection bounds.
pub(super) fn client(raw: &RawClient) -> Result<ClientLimits, Bad> {
    let mut limits = ClientLimits::default();
    set_present!(limits, raw; hello_timeout_ms, connections_max, unauthenticated_max,
        connections_per_source_max);
    limits.validate().map_err(|e| in_section("client", e))?;
    Ok(limits)
}

/// `[client]`'s TLS keys: the files a node serves TLS with, or `None`
/// if the config says `plain = true` (plain TCP is never a default). The
/// files are loaded here, so a bad certificate or a key that does not
/// match it stops the daemon before it binds anything.
pub(super) fn client_tls(raw: &RawClient, dir: &Path) -> Result<Option<ServerTlsFiles>, Bad> {
    let tls_keys = [
        ("tls_cert_file", raw.tls_cert_file.is_some()),
        ("tls_key_file", raw.tls_key_file.is_some()),
        ("tls_client_ca_file", raw.tls_client_ca_file.is_some()),
        ("tls_client_crl_file", raw.tls_client_crl_file.is_some()),
        ("tls_min_version", raw.tls_min_version.is_some()),
    ];
    if raw.plain == Some(true) {
        if let Some((key, _)) = tls_keys.iter().find(|k| k.1) {
            return Err(bad(
                "client.plain",
                format!("is true, but client.{key} is set too: keep one (clients are served either plain or over TLS)"),
            ));
        }
        return Ok(None);
    }
    let missing = |key: &str| {
        bad(
            format!("client.{key}"),
            "missing: clients are served over TLS (certificate and key files), unless the config says client.plain = true",
        )
    };
    let cert = raw
        .tls_cert_file
        .as_ref()
        .ok_or_else(|| missing("tls_cert_file"))?;
    let key = raw
        .tls_key_file
        .as_ref()
        .ok_or_else(|| missing("tls_key_file"))?;
    let min_version = match raw.tls_min_version.as_deref() {
        None => TlsVersion::default(),
        Some(v) => TlsVersion::parse(v).ok_or_else(|| {
            bad(
                "client.tls_min_version",
                format!("{v:?}: must be \"1.2\" or \"1.3\""),
            )
        })?,
    };
    if raw.tls_client_crl_file.is_some() && raw.tls_client_ca_file.is_none() {
        return Err(bad(
            "client.tls_client_crl_file",
            "revokes client certificates, which only client.tls_client_ca_file asks for: set it too",
        ));
    }
    let files = ServerTlsFiles {
        cert: resolve(dir, cert),
        key: resolve(dir, key),
        client_ca: raw.tls_client_ca_file.as_ref().map(|p| resolve(dir, p)),
        client_crl: raw.tls_client_crl_file.as_ref().map(|p| resolve(dir, p)),
        min_version,
        client_cert_optional: false,
    };
    files.load().map_err(|(role, why)| {
        let key = match role {
            TlsFileRole::Cert => "client.tls_cert_file",
            TlsFileRole::Key => "client.tls_key_file",
            TlsFileRole::ClientCa => "client.tls_client_ca_file",
            TlsFileRole::ClientCrl => "client.tls_client_crl_file",
        };
        bad(key, why)
    })?;
    Ok(Some(files))
}

/// `node.admin_tls`: the files the admin endpoint serves HTTPS with (the
/// client listener's, client certificates optional), or `None` for plain
/// HTTP (the default).
pub(super) fn admin_tls(
    raw: &RawNode,
    client_tls: Option<&ServerTlsFiles>,
) -> Result<Option<ServerTlsFiles>, Bad> {
    match (raw.admin_tls.unwrap_or(false), client_tls) {
        (false, _) => Ok(None),
        (true, Some(files)) => Ok(Some(files.for_admin())),
        (true, None) => Err(bad(
            "node.admin_tls",
            "serves the admin endpoint with the client listener's certificate, and this config serves clients plain (client.plain = true): set client.tls_cert_file and client.tls_key_file instead of client.plain, or drop node.admin_tls",
        )),
    }
}

/// `[snapshot]`: when to take one (`entries` or `bytes` of log growth,
/// and at least every `interval_ms`), and the chunks images stream in;
/// returns the interval.
pub(super) fn snapshot(raw: RawSnapshot, raft: &mut RaftConfig) -> Result<u64, Bad> {
    if let Some(n) = raw.entries {
        if n == 0 {
            return Err(bad("snapshot.entries", "must be at least 1"));
        }
        raft.snapshot_entries = n;
    }
    if let Some(n) = raw.bytes {
        if n == 0 {
            return Err(bad("snapshot.bytes", "must be at least 1"));
        }
        raft.snapshot_bytes = n;
    }
    if let Some(n) = raw.chunk_bytes {
        let Some(n) = usize::try_from(n).ok().filter(|&n| n >= 4096) else {
            return Err(bad("snapshot.chunk_bytes", "must be at least 4096"));
        };
        raft.snapshot_chunk_bytes = n;
    }
    match raw.interval_ms {
        Some(0) => Err(bad("snapshot.interval_ms", "must be at least 1")),
        Some(ms) => Ok(ms),
        None => Ok(crate::node::config::SNAPSHOT_INTERVAL_MS),
    }
}

/// `[storage]`: the WAL's rules, caught before any disk is touched.
pub(super) fn storage(raw: RawStorage, disk_stall_ms: u64) -> Result<WalConfig, Bad> {
    let s = raw;
    let mut wal = WalConfig {
        disk_stall_ms,
        ..WalConfig::default()
    };
    if let Some(b) = &s.backend {
        wal.backend = b
            .parse::<BackendChoice>()
            .map_err(|e| bad("storage.backend", e))?;
    }
    set_present!(wal, s; segment_bytes, flush_bytes_max, flushes_in_flight_max, direct_io,
        read_cache_bytes, scrub_bytes_per_s, space_retry_ms, segments_ahead, segments_recycled_max);
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
    Ok(wal)
}

/// Warns when this node's log could not store every entry one transport
/// message can carry. A group's leader limits entries to what its own log
/// stores, so a cluster whose nodes share `segment_bytes` is safe either
/// way; a node with smaller segments than its leader would have its log
/// stopped by an entry it cannot store.
pub(super) fn entries_fit(
    wal: &WalConfig,
    transport: &TransportConfig,
    warnings: &mut Vec<String>,
) {
    let stored = crate::storage::wal::entry_bytes_max(wal);
    if stored < transport.message_bytes_max {
        warnings.push(format!(
            "storage.segment_bytes: {} holds entries up to {stored} bytes (half a segment), less than transport.message_bytes_max ({}): give every node of the cluster the same segment_bytes, or at least {}",
            wal.segment_bytes,
            transport.message_bytes_max,
            2 * transport.message_bytes_max as u64
        ));
    }
}

/// `[transport]`: the endpoint's own check, and room for every peer.
pub(super) fn transport(raw: RawTransport, peers: usize) -> Result<TransportConfig, Bad> {
    let tr = raw;
    let mut transport = TransportConfig::default();
    set_present!(transport, tr; mtu_bytes, window_bytes, window_frames_max, history_bytes_max,
        message_bytes_max, holdback_bytes_max, holdback_frames_max, events_bytes_max,
        nack_delay_min_us, nack_delay_max_us, nack_interval_ms, nack_ranges_max,
        rexmit_batch_max, rexmit_min_interval_ms, ack_delay_us, ack_every_bytes,
        probe_interval_ms, peers_max, channels_max, retired_epochs_max, epoch_silence_ms);
    transport
        .validate()
        .map_err(|e| in_section("transport", e.0))?;
    if peers > transport.peers_max {
        return Err(bad(
            "transport.peers_max",
            format!("{} is fewer than the {} peers", transport.peers_max, peers),
        ));
    }
    Ok(transport)
}

/// `[serial]`: a standard baud, and a heartbeat that fits the keepalive.
pub(super) fn serial(
    raw: RawSerial,
    peers: &[PeerSpec],
    groups_per_core_max: usize,
    keepalive_ms: u64,
    warnings: &mut Vec<String>,
) -> Result<u32, Bad> {
    let serial_baud = raw.baud.unwrap_or(SERIAL_BAUD_DEFAULT);
    SerialConfig {
        baud: serial_baud,
        ..SerialConfig::new("")
    }
    .validate()
    .map_err(|e| in_section("serial", e))?;
    if peers.iter().any(|p| p.serial_device.is_some()) {
        // A heartbeat on the line: 30 header + 46 a group + 10 a peer,
        // plus about 23 of MAC, envelope and framing (142 -> 165 bytes).
        let line_bytes = 30 + 46 * groups_per_core_max.min(GROUPS_MAX) + 10 * peers.len() + 23;
        let airtime_ms = SerialConfig {
            baud: serial_baud,
            ..SerialConfig::new("")
        }
        .airtime_us(line_bytes)
            / 1000;
        if airtime_ms * 2 > keepalive_ms {
            warnings.push(format!(
                "serial.baud: a heartbeat ({line_bytes} bytes) takes {airtime_ms} ms on the line at {serial_baud} baud, over half of keepalive_ms ({}): raise the baud or the keepalive",
                keepalive_ms
            ));
        }
    }
    Ok(serial_baud)
}

/// `node.cluster_key_file`: enough secret to derive the key from.
pub(super) fn cluster_key(
    raw: &RawNode,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<ClusterKey, Bad> {
    let key_file = resolve(dir, &raw.cluster_key_file);
    let secret = read_secret("node.cluster_key_file", &key_file, warnings)?;
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
    Ok(ClusterKey::derive(&secret))
}

/// `node.admin_token_file`, if given: long enough to resist guessing,
/// and not the client token (a client must not be able to change the
/// membership). Returns the resolved path.
pub(super) fn admin_token(
    raw: &RawNode,
    dir: &Path,
    client_token: &[u8],
    warnings: &mut Vec<String>,
) -> Result<Option<PathBuf>, Bad> {
    const KEY: &str = "node.admin_token_file";
    let Some(file) = &raw.admin_token_file else {
        return Ok(None);
    };
    let file = resolve(dir, file);
    let token = read_secret(KEY, &file, warnings)?;
    if token.len() < ADMIN_TOKEN_BYTES_MIN {
        return Err(bad(
            KEY,
            format!(
                "{} holds {} bytes; at least {ADMIN_TOKEN_BYTES_MIN} are needed (head -c 32 /dev/urandom | base64 > FILE)",
                file.display(),
                token.len()
            ),
        ));
    }
    if token == client_token {
        return Err(bad(
            KEY,
            format!(
                "{} holds the client token (node.auth_token_file); the admin token must be a secret of its own",
                file.display()
            ),
        ));
    }
    Ok(Some(file))
}

/// Bytes a principal's name may have at most (it is a metric label).
const PRINCIPAL_NAME_BYTES_MAX: usize = 64;

/// `node.credentials_file`: the principals besides the cluster token's
/// (which has every permission). Their tokens are read here, checked
/// unique; a certificate principal needs mTLS on (`mtls`).
pub(super) fn credentials(
    raw: &RawNode,
    dir: &Path,
    client_token: &[u8],
    mtls: bool,
    warnings: &mut Vec<String>,
) -> Result<Credentials, Bad> {
    const KEY: &str = "node.credentials_file";
    let mut creds = Credentials::cluster_only(client_token);
    let Some(file) = &raw.credentials_file else {
        return Ok(creds);
    };
    let file = resolve(dir, file);
    let text = crate::io::private::read_capped(&file, crate::io::private::CONFIG_FILE_BYTES_MAX)
        .map_err(|e| bad(KEY, format!("{}: cannot read it: {e}", file.display())))?;
    let text = String::from_utf8(text)
        .map_err(|_| bad(KEY, format!("{}: not UTF-8 text", file.display())))?;
    let de = toml::Deserializer::parse(&text).map_err(|e| {
        bad(
            KEY,
            format!("{}: not TOML: {}", file.display(), e.message()),
        )
    })?;
    let parsed: RawCredentials = serde_path_to_error::deserialize(de).map_err(|e| {
        bad(
            KEY,
            format!("{}: {}: {}", file.display(), e.path(), e.inner().message()),
        )
    })?;
    let cred_dir = file.parent().unwrap_or(dir);
    for (i, p) in parsed.principals.into_iter().enumerate() {
        let at = |what: String| bad(KEY, format!("{}: principals[{i}]: {what}", file.display()));
        let name_ok = !p.name.is_empty()
            && p.name.len() <= PRINCIPAL_NAME_BYTES_MAX
            && p.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(at(format!(
                "name {:?}: 1 to {PRINCIPAL_NAME_BYTES_MAX} of A-Z a-z 0-9 . _ -",
                p.name
            )));
        }
        if p.token_file.is_none() && p.cert_common_name.is_none() {
            return Err(at(format!(
                "{:?} has neither token_file nor cert_common_name: nothing could be it",
                p.name
            )));
        }
        if p.cert_common_name.is_some() && !mtls {
            return Err(at(format!(
                "{:?} is known by a client certificate, which only client.tls_client_ca_file asks for",
                p.name
            )));
        }
        if p.grants.len() > GRANTS_PER_PRINCIPAL_MAX {
            return Err(at(format!("more than {GRANTS_PER_PRINCIPAL_MAX} grants")));
        }
        if let Some(g) = p.grants.iter().position(|g| g.allow.is_empty()) {
            return Err(at(format!("grants[{g}] allows nothing")));
        }
        let queue_admin = p.grants.iter().position(|g| {
            g.queues.is_some()
                && g.allow
                    .contains(&crate::node::credentials::Permission::Admin)
        });
        if let Some(g) = queue_admin {
            return Err(at(format!(
                "grants[{g}] allows \"admin\" on queues: admin is membership of whole groups; give it in a grant without `queues`"
            )));
        }
        let token = match &p.token_file {
            Some(t) => Some(read_secret(KEY, &resolve(cred_dir, t), warnings)?),
            None => None,
        };
        for (key, rate) in [
            ("quota_bytes_per_s", p.quota_bytes_per_s),
            ("quota_requests_per_s", p.quota_requests_per_s),
        ] {
            if rate == Some(0) {
                return Err(at(format!(
                    "{key} = 0 would stop every write; leave it out for no quota, or take \"append\" from its grants"
                )));
            }
        }
        let principal = Principal {
            name: p.name,
            all: false,
            grants: p.grants,
            quota: crate::node::quota::Quota {
                bytes_per_s: p.quota_bytes_per_s,
                requests_per_s: p.quota_requests_per_s,
            },
        };
        creds
            .add(principal, token.as_deref(), p.cert_common_name.as_deref())
            .map_err(at)?;
    }
    Ok(creds)
}

/// "0-1,4,6-7".
pub(super) fn core_ranges(cores: &[usize]) -> String {
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

/// `p`, relative to the config file's directory unless absolute.
pub(super) fn resolve(dir: &Path, p: &Path) -> PathBuf {
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
pub(super) fn listen_addr(key: &str, s: Option<&str>, default: &str) -> Result<SocketAddr, Bad> {
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
pub(super) fn read_secret(
    key: &str,
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<u8>, Bad> {
    let bytes = crate::io::private::read_capped(path, crate::io::private::SECRET_FILE_BYTES_MAX)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_messages_name_their_key() {
        let b = in_section(
            "timers",
            "deadtime_ms 150 must exceed warntime_ms 150".into(),
        );
        assert_eq!(
            (b.key.as_str(), b.message.as_str()),
            ("timers.deadtime_ms", "150 must exceed warntime_ms 150")
        );
        let b = in_section(
            "udp",
            "recv_buffer_bytes and send_buffer_bytes must be positive".into(),
        );
        assert_eq!(b.key, "udp");
        let b = in_section(
            "transport",
            "the hold-back buffer (..) must hold a whole window".into(),
        );
        assert_eq!(b.key, "transport");
        let b = in_section("serial", "baud 115000 is not a standard rate".into());
        assert_eq!(b.key, "serial.baud");
    }

    #[test]
    fn core_ranges_compress() {
        assert_eq!(core_ranges(&[0, 1]), "0-1");
        assert_eq!(core_ranges(&[7, 0, 1, 2, 4]), "0-2,4,7");
        assert_eq!(core_ranges(&[]), "");
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
