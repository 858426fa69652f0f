//! The run's fingerprint and its recent history.
//!
//! Every processed event is folded into a 64-bit trace hash, so two runs of
//! one seed can be compared by a single number. The last events are kept as
//! small records and formatted only when a run fails.

use crate::consensus::{Body, Entry, Message, Payload};
use std::collections::VecDeque;
use std::fmt;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Folds one word into an FNV-1a style hash.
pub(crate) fn fold(h: u64, x: u64) -> u64 {
    let mut h = h;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

fn payload_hash(p: &Payload) -> u64 {
    match p {
        Payload::Noop => 1,
        Payload::Normal(data) => data
            .iter()
            .fold(fold(FNV_OFFSET, 2), |h, &b| fold(h, b as u64)),
        Payload::Membership(m) => m.members().fold(fold(FNV_OFFSET, 3), fold),
    }
}

/// Chain hash of a log prefix: `chain(prefix hash up to i-1, entry i)`.
/// Equal chain hashes at one index mean equal logs up to it, which turns
/// log matching and state-machine safety into single comparisons.
pub(crate) fn chain(prev: u64, e: &Entry) -> u64 {
    let h = fold(fold(FNV_OFFSET, prev), e.index);
    fold(fold(h, e.term), payload_hash(&e.payload))
}

/// What happened, compactly.
#[derive(Clone, Copy, Debug)]
pub(crate) enum What {
    Tick,
    Deliver {
        from: u64,
        kind: &'static str,
        term: u64,
        detail: u64,
    },
    Drop {
        from: u64,
        to: u64,
        kind: &'static str,
    },
    DiskEio,
    Crash,
    Restart,
    Fault(&'static str),
    Confirm {
        index: u64,
    },
    BecameLeader {
        term: u64,
    },
    /// A leader stopped leading `term` and answered the client requests
    /// it held.
    SteppedDown {
        term: u64,
        answered: u64,
    },
    /// The failure detector saw a link change state.
    Link {
        peer: u64,
        channel: &'static str,
        state: &'static str,
    },
    /// The failure detector classified a peer anew.
    PeerStatus {
        peer: u64,
        status: &'static str,
    },
    /// A peer's disk started or stopped looking stalled.
    PeerDiskStall {
        peer: u64,
        stalled: bool,
    },
    /// A transport datagram reached this node's endpoint.
    Datagram {
        from: u64,
        len: u64,
    },
    /// A transport datagram to `to` was blocked or lost on the way.
    DatagramDrop {
        to: u64,
    },
    /// This node's endpoint dropped a datagram whole, and why.
    DatagramRefused {
        from: u64,
        why: &'static str,
    },
    /// This node's endpoint ran its timers.
    EndpointTimer,
    /// A full window refused a Raft message to `to` (dropped: Raft resends).
    SendRefused {
        to: u64,
        kind: &'static str,
    },
}

/// One event of the run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    pub(crate) time_ms: u64,
    pub(crate) node: u64,
    pub(crate) group: usize,
    pub(crate) what: What,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:>6}ms n{} g{} ", self.time_ms, self.node, self.group)?;
        match self.what {
            What::Tick => write!(f, "tick"),
            What::Deliver {
                from,
                kind,
                term,
                detail,
            } => {
                write!(f, "recv {kind} from n{from} term {term} ({detail})")
            }
            What::Drop { from, to, kind } => write!(f, "drop {kind} n{from}->n{to}"),
            What::DiskEio => write!(f, "EIO: group stopped"),
            What::Crash => write!(f, "crash"),
            What::Restart => write!(f, "restart"),
            What::Fault(name) => write!(f, "fault {name}"),
            What::Confirm { index } => write!(f, "client confirmed index {index}"),
            What::BecameLeader { term } => write!(f, "became leader of term {term}"),
            What::SteppedDown { term, answered } => write!(
                f,
                "stopped leading term {term}, answering the {answered} client requests it held"
            ),
            What::Link {
                peer,
                channel,
                state,
            } => write!(f, "link to n{peer} over {channel}: {state}"),
            What::PeerStatus { peer, status } => write!(f, "peer n{peer} is {status}"),
            What::PeerDiskStall { peer, stalled } => {
                write!(f, "peer n{peer} disk stalled: {stalled}")
            }
            What::Datagram { from, len } => write!(f, "datagram from n{from}, {len} bytes"),
            What::DatagramDrop { to } => write!(f, "datagram to n{to} lost"),
            What::DatagramRefused { from, why } => {
                write!(f, "datagram from n{from} refused: {why}")
            }
            What::EndpointTimer => write!(f, "endpoint timers"),
            What::SendRefused { to, kind } => write!(f, "window full: {kind} to n{to} dropped"),
        }
    }
}

/// Short name and one number summarising a message, for the trace.
pub(crate) fn describe(msg: &Message) -> (&'static str, u64) {
    match &msg.body {
        Body::PreVote { last_index, .. } => ("PreVote", *last_index),
        Body::PreVoteResponse { granted } => ("PreVoteResp", *granted as u64),
        Body::Vote { last_index, .. } => ("Vote", *last_index),
        Body::VoteResponse { granted } => ("VoteResp", *granted as u64),
        Body::Append {
            prev_index,
            entries,
            ..
        } => ("Append", prev_index + entries.len() as u64),
        Body::AppendResponse(r) => match r {
            crate::consensus::AppendResult::Accepted { match_index } => ("AppendOk", *match_index),
            crate::consensus::AppendResult::Rejected { rejected_index, .. } => {
                ("AppendReject", *rejected_index)
            }
        },
        Body::Heartbeat { commit, .. } => ("Heartbeat", *commit),
        Body::HeartbeatResponse { read_round } => ("HeartbeatResp", *read_round),
        Body::InstallSnapshot { snapshot, .. } => ("Snapshot", snapshot.index),
        Body::SnapshotAck { index, .. } => ("SnapshotAck", *index),
        Body::TimeoutNow => ("TimeoutNow", 0),
        Body::RepairRequest { indexes } => ("RepairRequest", indexes.len() as u64),
        Body::RepairEntries { entries, .. } => ("RepairEntries", entries.len() as u64),
    }
}

/// The running hash and the ring of recent records.
pub(crate) struct Trace {
    hash: u64,
    recent: VecDeque<Record>,
    keep: usize,
    /// Events recorded.
    pub(crate) events: u64,
}

impl Trace {
    pub(crate) fn new(keep: usize) -> Self {
        Trace {
            hash: FNV_OFFSET,
            recent: VecDeque::with_capacity(keep),
            keep,
            events: 0,
        }
    }

    pub(crate) fn record(&mut self, r: Record) {
        self.events += 1;
        let mut h = fold(fold(fold(self.hash, r.time_ms), r.node), r.group as u64);
        h = match r.what {
            What::Tick => fold(h, 1),
            What::Deliver {
                from,
                kind,
                term,
                detail,
            } => fold(
                fold(fold(fold(h, 2), from), kind.len() as u64),
                term ^ detail.rotate_left(17),
            ),
            What::Drop { from, to, .. } => fold(fold(fold(h, 3), from), to),
            What::DiskEio => fold(h, 5),
            What::Crash => fold(h, 6),
            What::Restart => fold(h, 7),
            What::Fault(name) => fold(fold(h, 8), name.len() as u64),
            What::Confirm { index } => fold(fold(h, 10), index),
            What::BecameLeader { term } => fold(fold(h, 11), term),
            What::SteppedDown { term, answered } => fold(fold(fold(h, 20), term), answered),
            What::Link {
                peer,
                channel,
                state,
            } => fold(
                fold(fold(h, 12), peer),
                (channel.len() as u64) << 8 | state.len() as u64,
            ),
            What::PeerStatus { peer, status } => fold(fold(fold(h, 13), peer), status.len() as u64),
            What::PeerDiskStall { peer, stalled } => fold(fold(fold(h, 14), peer), stalled as u64),
            What::Datagram { from, len } => fold(fold(fold(h, 15), from), len),
            What::DatagramDrop { to } => fold(fold(h, 16), to),
            What::DatagramRefused { from, why } => fold(fold(fold(h, 17), from), why.len() as u64),
            What::EndpointTimer => fold(h, 18),
            What::SendRefused { to, kind } => fold(fold(fold(h, 19), to), kind.len() as u64),
        };
        self.hash = h;
        if self.keep > 0 {
            if self.recent.len() == self.keep {
                self.recent.pop_front();
            }
            self.recent.push_back(r);
        }
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    pub(crate) fn recent(&self) -> Vec<String> {
        self.recent.iter().map(|r| r.to_string()).collect()
    }
}
