//! What a node runs: its id, peers, groups and every tunable, as values
//! (the daemon's TOML file is parsed into this).

use crate::consensus::{NodeId, RaftConfig, RaftConfigError};
use crate::heartbeat::{DetectorConfig, DetectorConfigError};
use crate::net::UdpConfig;
use crate::serial::SerialConfig;
use crate::storage::WalConfig;
use crate::transport::{ClusterKey, ConfigError as TransportConfigError, GroupId, TransportConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Another node of the cluster.
#[derive(Clone, Debug)]
pub struct PeerSpec {
    /// Its id.
    pub id: NodeId,
    /// Where its group sockets listen: group `g` at this port + `g`.
    pub udp_base: SocketAddr,
    /// The serial device of the null-modem cable to it, if there is one.
    pub serial_device: Option<PathBuf>,
}

/// One group (one disk) on this node.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    /// The group id.
    pub group: GroupId,
    /// The directory of its log on its disk.
    pub dir: PathBuf,
}

/// Everything one node runs with.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// This node's id (non-zero).
    pub id: NodeId,
    /// The voters of every group (all nodes of the cluster).
    pub voters: Vec<NodeId>,
    /// The cluster key: MACs on datagrams and serial frames.
    pub key: ClusterKey,
    /// The other nodes.
    pub peers: Vec<PeerSpec>,
    /// This node's groups.
    pub groups: Vec<GroupSpec>,
    /// Raft timers and limits (`id`, `initial_voters` and
    /// `preferred_leader_rank` are set from above and below).
    pub raft: RaftConfig,
    /// Leaders spread over nodes: group `g` prefers the voter at rank
    /// `g % voters` (node `g % N + 1` when the ids are 1..=N) and a leader
    /// hands back to it once it is healthy again
    /// (`raft.preferred_leader_hold_ms`).
    pub preferred_leaders: bool,
    /// Log storage.
    pub wal: WalConfig,
    /// The replication transport.
    pub transport: TransportConfig,
    /// Sockets: `bind_ip` and `base_port` (group `g` at `base_port + g`;
    /// `groups` is set from above).
    pub udp: UdpConfig,
    /// The failure detector's timers.
    pub detector: DetectorConfig,
    /// Serial line speed.
    pub serial_baud: u32,
    /// Take a snapshot at least this often (ms) while entries are applied;
    /// `raft.snapshot_entries` takes one after that much log growth.
    pub snapshot_interval_ms: u64,
    /// A loop turn that comes back later than it asked by more than this
    /// is a stall of this node, not counted against its peers or timers.
    pub stall_grace_ms: u64,
    /// The datagram path: AF_XDP or sockets (`[net]`).
    pub net: crate::net::xdp::XdpConfig,
}

/// Default `stall_grace_ms`: well above a healthy turn's lateness (a few
/// ms of scheduling), well below the 250 ms deadtime.
pub const STALL_GRACE_MS: u64 = 50;

/// Default `snapshot_interval_ms`: ten minutes.
pub const SNAPSHOT_INTERVAL_MS: u64 = 600_000;

impl NodeSpec {
    /// A node on 127.0.0.1 with default tunables, small log segments
    /// (4 MiB) and no peers yet: for local clusters and tests. `base_port`
    /// 0 lets the kernel choose each group's port.
    pub fn loopback(
        id: NodeId,
        voters: Vec<NodeId>,
        groups: Vec<GroupSpec>,
        base_port: u16,
    ) -> NodeSpec {
        NodeSpec {
            id,
            raft: RaftConfig::new(id, voters.clone()),
            preferred_leaders: true,
            voters,
            key: ClusterKey::derive(b"quire local cluster"),
            peers: Vec::new(),
            groups,
            wal: WalConfig {
                segment_bytes: 4 << 20,
                flush_bytes_max: 256 << 10,
                ..WalConfig::default()
            },
            transport: TransportConfig::default(),
            udp: UdpConfig {
                bind_ip: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                base_port,
                recv_buffer_bytes: 1 << 20,
                ..UdpConfig::default()
            },
            detector: DetectorConfig::default(),
            serial_baud: 115_200,
            snapshot_interval_ms: SNAPSHOT_INTERVAL_MS,
            stall_grace_ms: STALL_GRACE_MS,
            // Loopback has no XDP path: sockets, without trying.
            net: crate::net::xdp::XdpConfig {
                backend: crate::net::xdp::Backend::Sockets,
                ..Default::default()
            },
        }
    }

    /// The Raft config `group` runs with on this node: `raft`, with this
    /// node's id and voters, the group's preferred leader, and snapshots
    /// that carry the log entries at or below them which the ledgers and
    /// queues refer to.
    pub fn raft_config(&self, group: GroupId) -> RaftConfig {
        RaftConfig {
            id: self.id,
            initial_voters: self.voters.clone(),
            preferred_leader_rank: self.preferred_leaders.then_some(u64::from(group)),
            snapshot_with_entries: true,
            ..self.raft.clone()
        }
    }

    /// The socket config of this node's loop for `groups`: `udp`, with
    /// one socket per group.
    pub fn udp_config(&self, groups: &[GroupSpec]) -> UdpConfig {
        UdpConfig {
            groups: groups.iter().map(|g| g.group).collect(),
            ..self.udp.clone()
        }
    }

    /// The config of the serial port on `device`: at `serial_baud`.
    pub fn serial_config(&self, device: &Path) -> SerialConfig {
        SerialConfig {
            baud: self.serial_baud,
            ..SerialConfig::new(device)
        }
    }

    /// Checks what the cores would otherwise refuse later, naming the field.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.id == 0 {
            return Err(SpecError::IdReserved);
        }
        if !self.voters.contains(&self.id) {
            return Err(SpecError::NotAVoter(self.id));
        }
        for p in &self.peers {
            if p.id == self.id || !self.voters.contains(&p.id) {
                return Err(SpecError::PeerNotAVoter(p.id));
            }
        }
        if self.groups.is_empty() {
            return Err(SpecError::NoGroups);
        }
        self.detector.validate().map_err(SpecError::Detector)?;
        self.transport.validate().map_err(SpecError::Transport)?;
        self.raft_config(0).validate().map_err(SpecError::Raft)?;
        self.udp_config(&self.groups)
            .validate()
            .map_err(SpecError::Udp)?;
        for dev in self.peers.iter().filter_map(|p| p.serial_device.as_deref()) {
            self.serial_config(dev)
                .validate()
                .map_err(SpecError::Serial)?;
        }
        Ok(())
    }
}

/// A [`NodeSpec`] a node cannot run with: a bad config, found before any
/// log is opened or socket bound. The message names the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecError {
    /// `id` is 0, which no node has.
    IdReserved,
    /// `voters` does not hold this node.
    NotAVoter(NodeId),
    /// A peer that is this node, or not one of `voters`.
    PeerNotAVoter(NodeId),
    /// `groups` is empty.
    NoGroups,
    /// The failure detector's timers (`detector`).
    Detector(DetectorConfigError),
    /// The replication transport's bounds (`transport`).
    Transport(TransportConfigError),
    /// Raft's timers and limits (`raft`).
    Raft(RaftConfigError),
    /// The sockets' bounds (`udp`); the message names the field.
    Udp(String),
    /// The serial line (`serial_baud`); the message names the field.
    Serial(String),
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::IdReserved => write!(f, "id: node id 0 is reserved"),
            SpecError::NotAVoter(id) => write!(f, "voters: this node ({id}) is not among them"),
            SpecError::PeerNotAVoter(p) => write!(f, "peers: node {p} is not another voter"),
            SpecError::NoGroups => write!(f, "groups: a node needs at least one"),
            SpecError::Detector(e) => write!(f, "detector: {e}"),
            SpecError::Transport(e) => write!(f, "transport: {e}"),
            SpecError::Raft(e) => write!(f, "raft.{e}"),
            SpecError::Udp(why) => write!(f, "udp: {why}"),
            SpecError::Serial(why) => write!(f, "serial: {why}"),
        }
    }
}

impl std::error::Error for SpecError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every config a loop would refuse once started is refused up front,
    /// as a `SpecError` naming its section.
    #[test]
    fn validate_refuses_what_the_loop_would() {
        let groups = vec![GroupSpec {
            group: 0,
            dir: PathBuf::from("unused"),
        }];
        let ok = NodeSpec::loopback(1, vec![1, 2], groups, 0);
        assert_eq!(ok.validate(), Ok(()));
        let mut s = ok.clone();
        s.raft.heartbeat_interval_ms = 0;
        assert_eq!(
            s.validate(),
            Err(SpecError::Raft(RaftConfigError::Zero(
                "heartbeat_interval_ms"
            )))
        );
        let mut s = ok.clone();
        s.transport.mtu_bytes = 100;
        assert!(matches!(s.validate(), Err(SpecError::Transport(_))));
        let mut s = ok.clone();
        s.udp.recv_batch_max = 0;
        assert!(matches!(s.validate(), Err(SpecError::Udp(_))));
        let mut s = ok.clone();
        s.serial_baud = 7;
        s.peers.push(PeerSpec {
            id: 2,
            udp_base: "127.0.0.1:1".parse().unwrap(),
            serial_device: Some(PathBuf::from("/dev/null")),
        });
        let e = s.validate().unwrap_err();
        assert!(matches!(e, SpecError::Serial(_)), "{e:?}");
        assert!(e.to_string().starts_with("serial: baud 7"), "{e}");
    }
}
