//! Configuration of the UDP driver and the map from node id to address.
//! Plain data.

use crate::consensus::NodeId;
use crate::transport::GroupId;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The largest UDP payload over IPv4 (65535 - 20 - 8): the bound on one
/// datagram, and on the sum of the segments of one GSO send.
pub const UDP_PAYLOAD_BYTES_MAX: usize = 65_507;

/// Segments the kernel accepts in one GSO send (`UDP_MAX_SEGMENTS`: 64
/// since Linux 4.18; newer kernels allow 128, older ones refuse more).
pub const GSO_SEGMENTS_KERNEL_MAX: usize = 64;

/// Tunables of one [`UdpDriver`](super::UdpDriver). See the table in
/// `docs/internals/transport.md`, "The UDP driver".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address the group sockets bind to (`127.0.0.1` in tests).
    pub bind_ip: IpAddr,
    /// Group `g` binds `base_port + g`. 0 lets the kernel choose a free
    /// port for each group (tests); the peers then need each port
    /// explicitly ([`PeerMap::set_group`]).
    pub base_port: u16,
    /// The groups whose sockets this driver owns, one socket each.
    pub groups: Vec<GroupId>,
    /// SO_RCVBUF asked for each socket, bytes. It should hold what all
    /// peers may have in flight to one group: peers × `window_bytes` ×
    /// about 1.6 (the kernel charges an skb's whole allocation, about
    /// 2.3 KiB for a 1452-byte datagram). Capped by `net.core.rmem_max`.
    pub recv_buffer_bytes: usize,
    /// SO_SNDBUF asked for each socket, bytes. Capped by
    /// `net.core.wmem_max`.
    pub send_buffer_bytes: usize,
    /// Datagrams queued from the endpoint before they are handed to the
    /// kernel in one `sendmmsg` (GSO runs count each segment).
    pub send_batch_datagrams_max: usize,
    /// A long flush reads what has arrived (NACKs, acks), without waiting,
    /// after the first batch that brings it to this many datagrams sent
    /// since it last did; 0: never. Lower answers NACKs sooner, higher
    /// costs fewer syscalls.
    pub flush_recv_every_datagrams: usize,
    /// Messages per `recvmmsg`; each has a 64 KiB buffer (a GRO message
    /// can be that large), so this is also the receive memory / 64 KiB.
    pub recv_batch_max: usize,
    /// Datagrams received per socket in one `run_once` before timers and
    /// sends get a turn.
    pub recv_datagrams_per_run_max: usize,
    /// Try UDP generic segmentation offload (`UDP_SEGMENT`): a run of
    /// same-size datagrams to one peer goes to the kernel as one message.
    pub gso: bool,
    /// Most segments in one GSO send (at most 64).
    pub gso_segments_max: usize,
    /// Try UDP generic receive offload (`UDP_GRO`): the kernel may hand
    /// up several datagrams of one flow as one message.
    pub gro: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            bind_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            base_port: 7400,
            groups: vec![0],
            // Two peers with a full 4 MiB window each, times the skb
            // overhead: 4 MiB × 2 × 1.6, rounded to a power of two.
            recv_buffer_bytes: 16 << 20,
            send_buffer_bytes: 4 << 20,
            send_batch_datagrams_max: 256,
            // 1024 (4 batches): NACKs answered within ~2 ms of sending
            // without offloads; every batch cost 5% of lossless goodput
            // with GSO on loopback, and reading less often gained nothing
            // at 1% loss (bench/README.md).
            flush_recv_every_datagrams: 1024,
            recv_batch_max: 32,
            recv_datagrams_per_run_max: 4096,
            gso: true,
            gso_segments_max: GSO_SEGMENTS_KERNEL_MAX,
            gro: true,
        }
    }
}

impl UdpConfig {
    /// Checks the bounds; [`UdpDriver::bind`](super::UdpDriver::bind)
    /// refuses to start otherwise.
    pub fn validate(&self) -> Result<(), String> {
        if self.groups.is_empty() {
            return Err("groups is empty: the driver needs at least one socket".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for &g in &self.groups {
            if !seen.insert(g) {
                return Err(format!("group {g} is listed twice"));
            }
            if self.base_port != 0 && self.base_port as u64 + g as u64 > u16::MAX as u64 {
                return Err(format!(
                    "group {g}: base_port {} + {g} is beyond port 65535",
                    self.base_port
                ));
            }
        }
        if self.recv_buffer_bytes == 0 || self.send_buffer_bytes == 0 {
            return Err("recv_buffer_bytes and send_buffer_bytes must be positive".into());
        }
        if !(1..=1024).contains(&self.send_batch_datagrams_max) {
            return Err("send_batch_datagrams_max must be in 1..=1024".into());
        }
        if !(1..=1024).contains(&self.recv_batch_max) {
            return Err("recv_batch_max must be in 1..=1024".into());
        }
        if self.recv_datagrams_per_run_max == 0 {
            return Err("recv_datagrams_per_run_max must be positive".into());
        }
        if !(1..=GSO_SEGMENTS_KERNEL_MAX).contains(&self.gso_segments_max) {
            return Err(format!(
                "gso_segments_max must be in 1..={GSO_SEGMENTS_KERNEL_MAX}"
            ));
        }
        Ok(())
    }
}

/// Where each peer's group sockets are: by default group `g` of a node
/// is at its base address with port `base + g` (every node uses the same
/// layout); an explicit address per (node, group) overrides that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerMap {
    nodes: BTreeMap<NodeId, SocketAddr>,
    groups: BTreeMap<(NodeId, GroupId), SocketAddr>,
}

impl PeerMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Node `node` listens for group `g` on `base` with port `base + g`.
    pub fn set_node(&mut self, node: NodeId, base: SocketAddr) {
        self.nodes.insert(node, base);
    }

    /// Node `node` listens for `group` on `addr`, whatever its base says.
    pub fn set_group(&mut self, node: NodeId, group: GroupId, addr: SocketAddr) {
        self.groups.insert((node, group), addr);
    }

    /// Forgets a node and its explicit group addresses.
    pub fn remove_node(&mut self, node: NodeId) {
        self.nodes.remove(&node);
        self.groups.retain(|&(n, _), _| n != node);
    }

    /// The address of `group` on `node`, if known.
    pub fn addr(&self, node: NodeId, group: GroupId) -> Option<SocketAddr> {
        if let Some(a) = self.groups.get(&(node, group)) {
            return Some(*a);
        }
        let base = self.nodes.get(&node)?;
        let port = u16::try_from(base.port() as u64 + group as u64).ok()?;
        Some(SocketAddr::new(base.ip(), port))
    }

    /// Some address of `node`, for datagrams that any of its sockets may
    /// take (epoch announcements): its group `prefer` if known, else its
    /// lowest known group.
    pub fn any_addr(&self, node: NodeId, prefer: GroupId) -> Option<SocketAddr> {
        self.addr(node, prefer).or_else(|| {
            self.groups
                .range((node, 0)..=(node, GroupId::MAX))
                .next()
                .map(|(_, a)| *a)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_map_layout_and_overrides() {
        let mut m = PeerMap::new();
        m.set_node(2, "127.0.0.1:7400".parse().unwrap());
        assert_eq!(m.addr(2, 3), Some("127.0.0.1:7403".parse().unwrap()));
        m.set_group(2, 3, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(m.addr(2, 3), Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(m.addr(3, 0), None);
        m.set_node(4, "127.0.0.1:65535".parse().unwrap());
        assert_eq!(m.addr(4, 1), None, "port overflow is no address");
        m.set_group(5, 7, "127.0.0.1:9007".parse().unwrap());
        assert_eq!(m.any_addr(5, 0), Some("127.0.0.1:9007".parse().unwrap()));
        m.remove_node(2);
        assert_eq!(m.addr(2, 3), None);
    }

    #[test]
    fn config_bounds() {
        UdpConfig::default().validate().unwrap();
        let bad = [
            UdpConfig {
                groups: vec![],
                ..Default::default()
            },
            UdpConfig {
                groups: vec![1, 1],
                ..Default::default()
            },
            UdpConfig {
                base_port: 65_535,
                groups: vec![0, 1],
                ..Default::default()
            },
            UdpConfig {
                gso_segments_max: 65,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
