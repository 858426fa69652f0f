//! The heartbeat a node sends on its serial line every `keepalive_ms`: who
//! it is, its session, and what a peer needs to tell "alive and making
//! progress" from "alive but stuck": per group its Raft position and the
//! time of its last completed fsync, and its own view of every link.
//!
//! This file owns the bytes of the message and nothing else: no state, no
//! timers. Decoding takes untrusted input and never panics; it accepts only
//! what [`Heartbeat::encode`] would have written (the format is canonical),
//! and both go through one [`Heartbeat::validate`].
//!
//! ```text
//! header, 30 bytes (all integers little-endian)
//!    0  magic "qH"    2  version (1)    3  group count (<= 8)
//!    4  peer count (<= 8)               5  flags (0; reserved)
//!    6  sender node id u64 (non-zero)
//!   14  sender's session epoch u64 (non-zero, random per start)
//!   22  sequence number u64 (from 1, +1 per heartbeat of the epoch)
//! group status, 46 bytes each, group ids strictly increasing
//!    0  group u32     4  role u8 (0 follower, 1 pre-candidate,
//!                        2 candidate, 3 leader)
//!    5  flags u8 (bit 0: writes pending; other bits 0)
//!    6  term u64     14  leader u64 (0: none known)
//!   22  commit index u64                30  persisted index u64
//!   38  last fsync completion, ms on the sender's monotonic clock u64
//! peer view, 10 bytes each, node ids strictly increasing, never the sender
//!    0  node u64      8  udp link state u8 (1 init, 2 up, 3 late, 4 dead)
//!    9  serial link state u8 (0: no serial device to that peer, else as udp)
//! ```
//!
//! Entries are fixed-layout but counted, not padded to the maximum: at
//! 115200 baud (11.5 bytes per ms) a 3-node, 2-group heartbeat (142 bytes,
//! 165 on the line) takes 14 ms, where a padded one (8 groups, 8 peers:
//! 478 bytes, up to 502 on the line) would take 44 ms and nearly fill a
//! 50 ms keepalive.
//!
//! The magic differs from the transport's datagram magic ("qT"), so a
//! frame MAC'd with the same cluster key never parses as a datagram, nor a
//! datagram as a heartbeat.

use crate::consensus::{Index, NodeId, Role, Term};

/// First two bytes of every heartbeat.
pub const MAGIC: [u8; 2] = *b"qH";
/// Message format version; a heartbeat of another version is rejected.
pub const VERSION: u8 = 1;
/// Most groups one heartbeat reports (one per disk of the sender).
pub const GROUPS_MAX: usize = 8;
/// Most peer views one heartbeat carries (a cluster of at most 9 nodes).
pub const PEERS_MAX: usize = 8;
/// Bytes of the fixed header.
pub const HEADER_BYTES: usize = 30;
/// Bytes of one group status.
pub const GROUP_BYTES: usize = 46;
/// Bytes of one peer view.
pub const PEER_BYTES: usize = 10;
/// Largest encoded heartbeat: every group and peer slot used.
pub const MESSAGE_BYTES_MAX: usize =
    HEADER_BYTES + GROUPS_MAX * GROUP_BYTES + PEERS_MAX * PEER_BYTES;

const GROUP_FLAG_PENDING: u8 = 1;

/// The state of one channel to one peer, as the failure detector sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Never heard since the detector started, still within `initdead_ms`.
    Init,
    /// Heard within `warntime_ms`.
    Up,
    /// Silent for `warntime_ms` or more but less than `deadtime_ms`.
    Late,
    /// Silent for `deadtime_ms` or more (or never heard within `initdead_ms`).
    Dead,
}

impl LinkState {
    /// True if the channel counts as working: `Up` or `Late`.
    pub fn is_alive(self) -> bool {
        matches!(self, LinkState::Up | LinkState::Late)
    }

    /// The lower-case name used in logs and `quire status`.
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Init => "init",
            LinkState::Up => "up",
            LinkState::Late => "late",
            LinkState::Dead => "dead",
        }
    }

    fn to_wire(self) -> u8 {
        match self {
            LinkState::Init => 1,
            LinkState::Up => 2,
            LinkState::Late => 3,
            LinkState::Dead => 4,
        }
    }

    fn from_wire(b: u8) -> Result<Self, MessageError> {
        Ok(match b {
            1 => LinkState::Init,
            2 => LinkState::Up,
            3 => LinkState::Late,
            4 => LinkState::Dead,
            _ => return Err(MessageError::BadLinkState(b)),
        })
    }
}

/// One group's position on the sender: enough for a peer to see a leader
/// of a higher term, a quorum it cannot see over IP, or a stalled disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group (the disk it lives on).
    pub group: u32,
    /// The sender's role in the group.
    pub role: Role,
    /// The sender's current term in the group.
    pub term: Term,
    /// The leader the sender follows or is; 0 if it knows none.
    pub leader: NodeId,
    /// The sender's commit index.
    pub commit: Index,
    /// Highest index durable on the sender's disk.
    pub persisted: Index,
    /// When the sender's last fsync of this group completed, in ms on the
    /// sender's own monotonic clock (only its progress means anything to a
    /// receiver, never its value against the receiver's clock).
    pub last_fsync_ms: u64,
    /// True if the sender has writes waiting for an fsync.
    pub writes_pending: bool,
}

impl Default for GroupStatus {
    fn default() -> Self {
        GroupStatus {
            group: 0,
            role: Role::Follower,
            term: 0,
            leader: 0,
            commit: 0,
            persisted: 0,
            last_fsync_ms: 0,
            writes_pending: false,
        }
    }
}

/// The sender's view of its links to one other node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// The other node.
    pub node: NodeId,
    /// The sender's UDP channel to it.
    pub udp: LinkState,
    /// The sender's serial channel to it; `None` without a serial device.
    pub serial: Option<LinkState>,
}

impl Default for PeerView {
    fn default() -> Self {
        PeerView {
            node: 0,
            udp: LinkState::Init,
            serial: None,
        }
    }
}

/// Why a heartbeat was rejected (or could not be built).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageError {
    /// The length does not match the counts in the header.
    WrongLength {
        /// Bytes the header's counts call for (or the header's own size).
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// The first two bytes are not [`MAGIC`].
    BadMagic,
    /// A version this build does not speak.
    BadVersion(u8),
    /// More groups than [`GROUPS_MAX`].
    TooManyGroups(u8),
    /// More peer views than [`PEERS_MAX`].
    TooManyPeers(u8),
    /// A reserved flag bit is set.
    ReservedBits,
    /// Node id 0 (of the sender or of a peer view).
    ZeroNode,
    /// Session epoch 0.
    ZeroEpoch,
    /// Sequence number 0.
    ZeroSeq,
    /// A role byte out of range.
    BadRole(u8),
    /// A link state byte out of range.
    BadLinkState(u8),
    /// Group ids not strictly increasing.
    GroupsOutOfOrder,
    /// Peer node ids not strictly increasing, or a view of the sender itself.
    PeersOutOfOrder,
    /// `push_group` / `push_peer` beyond the maximum.
    Full,
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for MessageError {}

/// One heartbeat: fixed-size in memory (no allocation), counted on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The sender.
    pub node: NodeId,
    /// The sender's session epoch: random per start, never 0, so that a
    /// receiver can tell a restart from a replay.
    pub epoch: u64,
    /// Sequence number within the epoch, from 1.
    pub seq: u64,
    group_count: u8,
    groups: [GroupStatus; GROUPS_MAX],
    peer_count: u8,
    peers: [PeerView; PEERS_MAX],
}

impl Heartbeat {
    /// A heartbeat with no groups and no peer views yet.
    pub fn new(node: NodeId, epoch: u64, seq: u64) -> Self {
        Heartbeat {
            node,
            epoch,
            seq,
            group_count: 0,
            groups: [GroupStatus::default(); GROUPS_MAX],
            peer_count: 0,
            peers: [PeerView::default(); PEERS_MAX],
        }
    }

    /// The group statuses, in increasing group order.
    pub fn groups(&self) -> &[GroupStatus] {
        &self.groups[..self.group_count as usize]
    }

    /// The peer views, in increasing node order.
    pub fn peers(&self) -> &[PeerView] {
        &self.peers[..self.peer_count as usize]
    }

    /// Appends a group status; groups must come in increasing order.
    pub fn push_group(&mut self, g: GroupStatus) -> Result<(), MessageError> {
        let n = self.group_count as usize;
        if n == GROUPS_MAX {
            return Err(MessageError::Full);
        }
        if n > 0 && self.groups[n - 1].group >= g.group {
            return Err(MessageError::GroupsOutOfOrder);
        }
        self.groups[n] = g;
        self.group_count += 1;
        Ok(())
    }

    /// Appends a peer view; peers must come in increasing node order.
    pub fn push_peer(&mut self, p: PeerView) -> Result<(), MessageError> {
        let n = self.peer_count as usize;
        if n == PEERS_MAX {
            return Err(MessageError::Full);
        }
        if p.node == 0 {
            return Err(MessageError::ZeroNode);
        }
        if p.node == self.node || (n > 0 && self.peers[n - 1].node >= p.node) {
            return Err(MessageError::PeersOutOfOrder);
        }
        self.peers[n] = p;
        self.peer_count += 1;
        Ok(())
    }

    /// Bytes [`Heartbeat::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.groups().len() * GROUP_BYTES + self.peers().len() * PEER_BYTES
    }

    /// Checks every rule the decoder enforces (ids non-zero, order).
    pub fn validate(&self) -> Result<(), MessageError> {
        if self.node == 0 {
            return Err(MessageError::ZeroNode);
        }
        if self.epoch == 0 {
            return Err(MessageError::ZeroEpoch);
        }
        if self.seq == 0 {
            return Err(MessageError::ZeroSeq);
        }
        if self.groups().windows(2).any(|w| w[0].group >= w[1].group) {
            return Err(MessageError::GroupsOutOfOrder);
        }
        let peers = self.peers();
        if peers.iter().any(|p| p.node == 0) {
            return Err(MessageError::ZeroNode);
        }
        if peers.windows(2).any(|w| w[0].node >= w[1].node)
            || peers.iter().any(|p| p.node == self.node)
        {
            return Err(MessageError::PeersOutOfOrder);
        }
        Ok(())
    }

    /// Appends the encoding to `out`; refuses a heartbeat that
    /// [`Heartbeat::decode`] would reject.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), MessageError> {
        self.validate()?;
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.group_count);
        out.push(self.peer_count);
        out.push(0);
        out.extend_from_slice(&self.node.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        for g in self.groups() {
            out.extend_from_slice(&g.group.to_le_bytes());
            out.push(role_to_wire(g.role));
            out.push(if g.writes_pending {
                GROUP_FLAG_PENDING
            } else {
                0
            });
            for v in [g.term, g.leader, g.commit, g.persisted, g.last_fsync_ms] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for p in self.peers() {
            out.extend_from_slice(&p.node.to_le_bytes());
            out.push(p.udp.to_wire());
            out.push(p.serial.map_or(0, LinkState::to_wire));
        }
        assert_eq!(out.len() - start, self.encoded_len());
        Ok(())
    }

    /// Decodes one heartbeat from exactly `bytes`; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Heartbeat, MessageError> {
        if bytes.len() < HEADER_BYTES {
            return Err(MessageError::WrongLength {
                expected: HEADER_BYTES,
                got: bytes.len(),
            });
        }
        if bytes[0..2] != MAGIC {
            return Err(MessageError::BadMagic);
        }
        if bytes[2] != VERSION {
            return Err(MessageError::BadVersion(bytes[2]));
        }
        let (group_count, peer_count) = (bytes[3], bytes[4]);
        if group_count as usize > GROUPS_MAX {
            return Err(MessageError::TooManyGroups(group_count));
        }
        if peer_count as usize > PEERS_MAX {
            return Err(MessageError::TooManyPeers(peer_count));
        }
        if bytes[5] != 0 {
            return Err(MessageError::ReservedBits);
        }
        let expected =
            HEADER_BYTES + group_count as usize * GROUP_BYTES + peer_count as usize * PEER_BYTES;
        if bytes.len() != expected {
            return Err(MessageError::WrongLength {
                expected,
                got: bytes.len(),
            });
        }
        let mut hb = Heartbeat::new(
            le_u64(&bytes[6..]),
            le_u64(&bytes[14..]),
            le_u64(&bytes[22..]),
        );
        let mut at = HEADER_BYTES;
        for slot in hb.groups.iter_mut().take(group_count as usize) {
            let b = &bytes[at..at + GROUP_BYTES];
            if b[5] & !GROUP_FLAG_PENDING != 0 {
                return Err(MessageError::ReservedBits);
            }
            *slot = GroupStatus {
                group: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                role: role_from_wire(b[4])?,
                writes_pending: b[5] & GROUP_FLAG_PENDING != 0,
                term: le_u64(&b[6..]),
                leader: le_u64(&b[14..]),
                commit: le_u64(&b[22..]),
                persisted: le_u64(&b[30..]),
                last_fsync_ms: le_u64(&b[38..]),
            };
            at += GROUP_BYTES;
        }
        for slot in hb.peers.iter_mut().take(peer_count as usize) {
            let b = &bytes[at..at + PEER_BYTES];
            *slot = PeerView {
                node: le_u64(b),
                udp: LinkState::from_wire(b[8])?,
                serial: match b[9] {
                    0 => None,
                    s => Some(LinkState::from_wire(s)?),
                },
            };
            at += PEER_BYTES;
        }
        hb.group_count = group_count;
        hb.peer_count = peer_count;
        hb.validate()?;
        Ok(hb)
    }
}

fn role_to_wire(r: Role) -> u8 {
    match r {
        Role::Follower => 0,
        Role::PreCandidate => 1,
        Role::Candidate => 2,
        Role::Leader => 3,
    }
}

fn role_from_wire(b: u8) -> Result<Role, MessageError> {
    Ok(match b {
        0 => Role::Follower,
        1 => Role::PreCandidate,
        2 => Role::Candidate,
        3 => Role::Leader,
        _ => return Err(MessageError::BadRole(b)),
    })
}

/// Reads 8 little-endian bytes; callers have checked the length.
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A heartbeat using every field, `groups` groups and `peers` peers.
    pub(crate) fn sample(groups: usize, peers: usize) -> Heartbeat {
        let mut hb = Heartbeat::new(1, 0xfeed_beef, 42);
        for g in 0..groups {
            hb.push_group(GroupStatus {
                group: g as u32 * 3,
                role: [
                    Role::Follower,
                    Role::PreCandidate,
                    Role::Candidate,
                    Role::Leader,
                ][g % 4],
                term: 7 + g as u64,
                leader: 2,
                commit: 1000 + g as u64,
                persisted: 1001 + g as u64,
                last_fsync_ms: u64::MAX - g as u64,
                writes_pending: g % 2 == 1,
            })
            .unwrap();
        }
        let states = [
            LinkState::Init,
            LinkState::Up,
            LinkState::Late,
            LinkState::Dead,
        ];
        for p in 0..peers {
            hb.push_peer(PeerView {
                node: 2 + p as u64,
                udp: states[p % 4],
                serial: if p % 5 == 4 {
                    None
                } else {
                    Some(states[(p + 1) % 4])
                },
            })
            .unwrap();
        }
        hb
    }

    fn encoded(hb: &Heartbeat) -> Vec<u8> {
        let mut v = Vec::new();
        hb.encode(&mut v).unwrap();
        v
    }

    #[test]
    fn round_trips_every_shape() {
        for groups in 0..=GROUPS_MAX {
            for peers in 0..=PEERS_MAX {
                let hb = sample(groups, peers);
                let bytes = encoded(&hb);
                assert_eq!(bytes.len(), hb.encoded_len());
                assert_eq!(Heartbeat::decode(&bytes), Ok(hb));
            }
        }
        assert_eq!(
            encoded(&sample(GROUPS_MAX, PEERS_MAX)).len(),
            MESSAGE_BYTES_MAX
        );
        assert_eq!(
            encoded(&sample(2, 2)).len(),
            142,
            "the size the module doc quotes"
        );
    }

    #[test]
    fn rejects_wrong_lengths() {
        let bytes = encoded(&sample(2, 2));
        for n in 0..bytes.len() {
            assert!(
                matches!(
                    Heartbeat::decode(&bytes[..n]),
                    Err(MessageError::WrongLength { .. })
                ),
                "{n}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            Heartbeat::decode(&long),
            Err(MessageError::WrongLength { .. })
        ));
    }

    #[test]
    fn rejects_each_bad_header_field() {
        let good = encoded(&sample(2, 2));
        let with = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            Heartbeat::decode(&b)
        };
        assert_eq!(with(0, b'q' ^ 1), Err(MessageError::BadMagic));
        assert_eq!(with(1, b'T'), Err(MessageError::BadMagic));
        assert_eq!(with(2, 2), Err(MessageError::BadVersion(2)));
        assert_eq!(with(3, 9), Err(MessageError::TooManyGroups(9)));
        assert_eq!(with(4, 9), Err(MessageError::TooManyPeers(9)));
        assert_eq!(with(5, 1), Err(MessageError::ReservedBits));
        let zero = |range: std::ops::Range<usize>| {
            let mut b = good.clone();
            b[range].fill(0);
            Heartbeat::decode(&b)
        };
        assert_eq!(zero(6..14), Err(MessageError::ZeroNode));
        assert_eq!(zero(14..22), Err(MessageError::ZeroEpoch));
        assert_eq!(zero(22..30), Err(MessageError::ZeroSeq));
    }

    #[test]
    fn rejects_each_bad_entry_field() {
        let good = encoded(&sample(2, 2));
        let g0 = HEADER_BYTES;
        let g1 = HEADER_BYTES + GROUP_BYTES;
        let p0 = HEADER_BYTES + 2 * GROUP_BYTES;
        let p1 = p0 + PEER_BYTES;
        let with = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            Heartbeat::decode(&b)
        };
        assert_eq!(with(g0 + 4, &[4]), Err(MessageError::BadRole(4)));
        assert_eq!(with(g0 + 5, &[2]), Err(MessageError::ReservedBits));
        // Group 0 and group 3: make the second equal, then smaller.
        assert_eq!(with(g1, &[0, 0, 0, 0]), Err(MessageError::GroupsOutOfOrder));
        assert_eq!(with(p0 + 8, &[0]), Err(MessageError::BadLinkState(0)));
        assert_eq!(with(p0 + 8, &[5]), Err(MessageError::BadLinkState(5)));
        assert_eq!(with(p0 + 9, &[5]), Err(MessageError::BadLinkState(5)));
        assert_eq!(with(p0, &[0; 8]), Err(MessageError::ZeroNode));
        assert_eq!(
            with(p1, &2u64.to_le_bytes()),
            Err(MessageError::PeersOutOfOrder)
        );
        assert_eq!(
            with(p0, &1u64.to_le_bytes()),
            Err(MessageError::PeersOutOfOrder),
            "a view of the sender"
        );
        // The serial state 0 means "no device": valid.
        assert!(with(p0 + 9, &[0]).is_ok());
    }

    #[test]
    fn builder_keeps_the_rules() {
        let mut hb = Heartbeat::new(5, 1, 1);
        hb.push_group(GroupStatus {
            group: 2,
            ..GroupStatus::default()
        })
        .unwrap();
        assert_eq!(
            hb.push_group(GroupStatus {
                group: 2,
                ..GroupStatus::default()
            }),
            Err(MessageError::GroupsOutOfOrder)
        );
        assert_eq!(
            hb.push_peer(PeerView {
                node: 5,
                ..PeerView::default()
            }),
            Err(MessageError::PeersOutOfOrder)
        );
        assert_eq!(
            hb.push_peer(PeerView::default()),
            Err(MessageError::ZeroNode)
        );
        let full = sample(GROUPS_MAX, PEERS_MAX);
        let mut f = full;
        assert_eq!(
            f.push_group(GroupStatus {
                group: 1000,
                ..GroupStatus::default()
            }),
            Err(MessageError::Full)
        );
        assert_eq!(
            f.push_peer(PeerView {
                node: 1000,
                ..PeerView::default()
            }),
            Err(MessageError::Full)
        );
        let mut out = Vec::new();
        assert_eq!(
            Heartbeat::new(1, 0, 1).encode(&mut out),
            Err(MessageError::ZeroEpoch)
        );
        assert!(out.is_empty(), "nothing written for an invalid heartbeat");
    }
}
