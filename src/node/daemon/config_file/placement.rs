//! The checks of where a node sits: its peers and their cables, its
//! disks (one group each), the cores it may run on, its listen addresses,
//! its UDP ports and the XDP path, and that no two of its ports collide.
//! Each returns the first fault, naming its key. None binds a port,
//! opens a log or writes a file.

use super::raw::{RawDisk, RawNet, RawNode, RawPeer, RawUdp};
use super::{bad, in_section, resolve, Bad, ADMIN_LISTEN_DEFAULT, CLIENT_LISTEN_DEFAULT};
use crate::consensus::NodeId;
use crate::heartbeat::message::{GROUPS_MAX, PEERS_MAX};
use crate::net::UdpConfig;
use crate::node::spec::{GroupSpec, PeerSpec};
use crate::transport::GroupId;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

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
