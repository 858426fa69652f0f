//! What a node reports about itself (`quire status`, the admin
//! endpoint's `/status`, tests): the views of its groups, their logs and
//! snapshots, its links, peers, transport and own stalls, and that
//! status as JSON (`/status`, and the client protocol's `Status`). Plain
//! data, a leaf of `node`: the loops (`loops::event_loop`) and replicas
//! fill it in, the handle merges the loops' parts; it imports nothing from
//! the other files but the client server's counters view and the quotas'
//! view, and never asks a loop anything.

use crate::consensus::{Index, NodeId, Role, Term};
use crate::transport::GroupId;

/// One group as this node sees it.
#[derive(Clone, Debug)]
pub struct GroupView {
    /// The group.
    pub group: GroupId,
    /// This node's role in it.
    pub role: Role,
    /// Current term.
    pub term: Term,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// The voter the group prefers as leader (leaders spread over nodes).
    pub preferred_leader: Option<NodeId>,
    /// Commit index.
    pub commit: Index,
    /// Applied index.
    pub applied: Index,
    /// Durable index.
    pub persisted: Index,
    /// Hash of the applied data (equal on every node at equal `applied`).
    pub applied_hash: u64,
    /// The voters of the membership in force here.
    pub voters: Vec<NodeId>,
    /// The learners (non-voting members catching up).
    pub learners: Vec<NodeId>,
    /// healthy, degraded, full or failed (with why).
    pub disk: String,
    /// The log's I/O backend: io_uring or portable.
    pub backend: &'static str,
    /// On the leader: each follower's replication lag in entries (the
    /// leader's last index minus the follower's durable match index).
    pub follower_lag: Vec<(NodeId, u64)>,
    /// The log's counters.
    pub wal: WalView,
    /// What its snapshots cost.
    pub snapshot: SnapshotStats,
    /// Entries below the snapshot to repair, repaired and served.
    pub repair: RepairStats,
    /// The background scrub.
    pub scrub: ScrubStats,
    /// Ledger reads waiting on this leader for an entry to be confirmed
    /// (long polls).
    pub waiting_reads: usize,
    /// Client requests this node answered `NotLeader` as it stopped
    /// leading (they retry on the new leader).
    pub step_down_answers: u64,
    /// The Raft counters.
    pub stats: crate::consensus::RaftStats,
}

/// Repair counts of one group on this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairStats {
    /// Referenced entries this log cannot serve now.
    pub missing: u64,
    /// Of those, entries no other member holds either.
    pub lost: u64,
    /// Of those, entries the state holds no check for.
    pub unverifiable: u64,
    /// Entries repaired from a peer and stored, since start.
    pub repaired: u64,
    /// Copies from peers refused: not what the state recorded.
    pub rejected: u64,
    /// Entries sent to peers that asked, since start.
    pub served: u64,
    /// Requests sent.
    pub requests: u64,
    /// Stores of repaired copies the log refused (disk full, the cap on
    /// repaired bytes, or another refusal), since start; requests back
    /// off meanwhile.
    pub store_refusals: u64,
}

/// The background scrub of one group's log on this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubStats {
    /// Its read rate, bytes/s (0: off).
    pub bytes_per_s: u64,
    /// Bytes read and checked since start.
    pub bytes_verified: u64,
    /// Batches that checked out since start.
    pub batches_verified: u64,
    /// Damaged batches found since start.
    pub damaged_batches: u64,
    /// Whole passes over the log since start.
    pub passes: u64,
    /// When the last whole pass ended (loop ms), if one did.
    pub last_pass_end_ms: Option<u64>,
    /// How long ago that was, ms (as of the scrub's last turn).
    pub last_pass_age_ms: Option<u64>,
    /// How long the last whole pass took, ms.
    pub last_pass_ms: u64,
}

/// A group log's counters (from `storage::WalMetrics`).
#[derive(Clone, Copy, Debug, Default)]
pub struct WalView {
    /// Flushes (write + fdatasync) completed.
    pub flushes: u64,
    /// Flush latency, µs: median and 99th percentile.
    pub flush_p50_us: u64,
    /// 99th percentile.
    pub flush_p99_us: u64,
    /// Records per flush, median.
    pub records_per_flush_p50: u64,
    /// Bytes written, padding included.
    pub bytes: u64,
    /// Trimmed segments kept for reuse.
    pub segments_recycled: u64,
    /// Segments zero-filled.
    pub segments_zero_filled: u64,
    /// Flushes slower than `disk_stall_ms`.
    pub stalls: u64,
    /// Write or sync errors.
    pub io_errors: u64,
    /// Appends refused for a full disk.
    pub disk_full_refusals: u64,
    /// Batches read back from the segments for answers (cold reads).
    pub cold_reads: u64,
    /// Cold reads that failed (the answer that wanted it got an error).
    pub cold_read_errors: u64,
    /// Entries below the snapshot stored as repaired copies since open.
    pub entries_repaired: u64,
}

/// One link (peer × channel) as this node's detector sees it.
#[derive(Clone, Debug)]
pub struct LinkView {
    /// The peer.
    pub peer: NodeId,
    /// `udp` or `serial`.
    pub channel: &'static str,
    /// init, up, late or dead.
    pub state: &'static str,
    /// Ms since the peer was last heard on it, if ever.
    pub last_heard_ago_ms: Option<u64>,
}

/// A peer's classification.
#[derive(Clone, Debug)]
pub struct PeerView {
    /// The peer.
    pub peer: NodeId,
    /// unknown, up, ip-partitioned, serial-down or down.
    pub status: &'static str,
    /// Its disk looks stalled (a group with writes pending, no fsync).
    pub disk_stalled: bool,
}

/// A node's state, for `quire status` and tests.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    /// The node.
    pub id: NodeId,
    /// Ms since the loop started.
    pub uptime_ms: u64,
    /// Its groups.
    pub groups: Vec<GroupView>,
    /// Every link.
    pub links: Vec<LinkView>,
    /// Every peer.
    pub peers: Vec<PeerView>,
    /// The alarm line: some link is dead.
    pub alarm: bool,
    /// Every detector transition so far, one line each, oldest first
    /// (bounded; the newest are kept).
    pub transitions: Vec<String>,
    /// Raft messages the transport refused for a full window (Raft resends).
    pub sends_refused: u64,
    /// Datagrams dropped for a bad MAC (forged, or another cluster's key).
    pub mac_failures: u64,
    /// Datagrams dropped as malformed.
    pub malformed_dropped: u64,
    /// The replication transport per peer.
    pub transport: Vec<TransportView>,
    /// The client server's connection counters (zero without one).
    pub clients: crate::node::client::stats::ClientView,
    /// Each principal with a write quota, and what it has done.
    pub quotas: Vec<crate::node::client::quota::QuotaView>,
    /// The node's own stalls (its loops paused or starved), which are not
    /// counted against its peers or timers.
    pub stalls: StallView,
    /// Each loop's datagram path (AF_XDP or sockets, and why).
    pub net: Vec<NetView>,
}

/// One loop's datagram path.
#[derive(Clone, Debug, Default)]
pub struct NetView {
    /// The loop (0 is the first).
    pub core_loop: usize,
    /// True if its datagrams go through AF_XDP.
    pub xdp: bool,
    /// How it runs (interface, queue, mode), or why not on AF_XDP.
    pub detail: String,
    /// The AF_XDP counters (zero on sockets).
    pub counters: crate::net::xdp::XdpStats,
}

/// A node's own stalls, summed over its loops.
#[derive(Clone, Copy, Debug, Default)]
pub struct StallView {
    /// Loop turns that came back later than asked by more than
    /// `stall_grace_ms`.
    pub count: u64,
    /// Ms not counted, summed over the loops.
    pub stalled_ms: u64,
    /// The longest single stall of any loop, in ms.
    pub longest_ms: u64,
}

impl StallView {
    /// Adds another loop's stalls to these.
    pub(crate) fn merge(&mut self, other: StallView) {
        self.count += other.count;
        self.stalled_ms += other.stalled_ms;
        self.longest_ms = self.longest_ms.max(other.longest_ms);
    }
}

impl NodeStatus {
    /// What an operator must look at now, one line each: a dead link, a
    /// group without a leader, a disk that failed or is full. Empty when
    /// all is well; `quire status` prints each as an ALARM line.
    pub fn alarms(&self) -> Vec<String> {
        let mut alarms = Vec::new();
        if self.alarm {
            alarms.push("a link is down".to_string());
        }
        for g in &self.groups {
            if g.leader.is_none() {
                alarms.push(format!("group {} has no leader", g.group));
            }
            if g.disk.starts_with("failed") || g.disk == "full" {
                alarms.push(format!("group {} disk {}", g.group, g.disk));
            }
            let r = &g.repair;
            if r.lost > 0 || r.unverifiable > 0 {
                alarms.push(format!(
                    "group {}: {} log entries the state refers to are lost ({} held by no member, {} unverifiable)",
                    g.group,
                    r.lost + r.unverifiable,
                    r.lost,
                    r.unverifiable
                ));
            } else if r.missing > 0 {
                alarms.push(format!(
                    "group {}: repairing {} log entries from peers (not leading until done)",
                    g.group, r.missing
                ));
            }
        }
        alarms
    }
}

/// The replication transport to one peer, summed over the node's cores.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportView {
    /// The peer.
    pub peer: NodeId,
    /// Datagrams sent to it.
    pub datagrams_sent: u64,
    /// Authenticated datagrams received from it.
    pub datagrams_received: u64,
    /// NACK rounds sent to it (gaps it left).
    pub nack_rounds: u64,
    /// DATA frames retransmitted to it (it asked for them), over every
    /// group's channel.
    pub retransmits: u64,
    /// Smoothed round-trip time, µs (0 before the first sample).
    pub rtt_us: u64,
}

impl NodeStatus {
    /// The view of `group`, if this node has it.
    pub fn group(&self, group: GroupId) -> Option<&GroupView> {
        self.groups.iter().find(|g| g.group == group)
    }

    /// The classification of `peer`.
    pub fn peer(&self, peer: NodeId) -> Option<&PeerView> {
        self.peers.iter().find(|p| p.peer == peer)
    }
}

/// What the snapshots of a group cost, for status and metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotStats {
    /// Snapshots taken (written and adopted) since start.
    pub taken: u64,
    /// Index of the last one.
    pub last_index: Index,
    /// Bytes of the last one's state-machine data.
    pub last_bytes: u64,
    /// Time from capture to adoption of the last one, in µs (encoding
    /// and writing run off the loop; only the capture runs on it).
    pub last_us: u64,
    /// Time the loop spent capturing the last one's view, in µs.
    pub last_capture_us: u64,
    /// Snapshots that failed to be written (the log is kept whole).
    pub failed: u64,
    /// The lowest log index the state at the snapshot refers to (a ledger
    /// entry's or an unacked message's bytes); 0 for none. The log keeps
    /// every segment from there on.
    pub retained_from: Index,
    /// Log entries the state refers to that this node could not read
    /// (found missing at start, or a failed read since); 0 when healthy.
    pub unreadable_entries: u64,
    /// Leader: chunks of snapshot images read and sent to followers.
    pub image_chunks_sent: u64,
    /// Follower: chunks of snapshot images staged durably.
    pub image_chunks_staged: u64,
    /// Follower: staged images taken up again after a restart.
    pub images_resumed: u64,
    /// Follower: where the last staged image taken up again stood, in
    /// image positions.
    pub image_resumed_at: u64,
    /// Snapshots installed from a leader (their images adopted).
    pub installed: u64,
    /// Follower: the snapshot whose image is being staged (0: none).
    pub image_index: Index,
    /// Its positions held durably, and its length.
    pub image_held: u64,
    /// See `image_held`.
    pub image_total: u64,
}

/// The name `/status` and `/metrics` give a role.
fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PreCandidate => "pre-candidate",
    }
}

/// `s` as the JSON of `/status`.
pub(crate) fn status_json(s: &NodeStatus) -> serde_json::Value {
    serde_json::json!({
        "node": s.id,
        "uptime_ms": s.uptime_ms,
        "alarm": s.alarm,
        "alarms": s.alarms(),
        "stalls": {
            "count": s.stalls.count,
            "stalled_ms": s.stalls.stalled_ms,
            "longest_ms": s.stalls.longest_ms,
        },
        "net": s.net.iter().map(|n| serde_json::json!({
            "loop": n.core_loop,
            "backend": if n.xdp { "xdp" } else { "sockets" },
            "detail": n.detail,
            "xdp_rx_datagrams": n.counters.rx_datagrams,
            "xdp_rx_rejected": n.counters.rx_rejected,
            "xdp_tx_datagrams": n.counters.tx_datagrams,
            "xdp_tx_via_kernel": n.counters.tx_via_kernel,
            "xdp_tx_ring_full": n.counters.tx_ring_full,
            "xdp_rx_kernel_dropped": n.counters.rx_kernel_dropped,
        })).collect::<Vec<_>>(),
        "groups": s.groups.iter().map(|g| serde_json::json!({
            "group": g.group,
            "role": role_name(g.role),
            "term": g.term,
            "leader": g.leader,
            "preferred_leader": g.preferred_leader,
            "commit": g.commit,
            "applied": g.applied,
            "persisted": g.persisted,
            "disk": g.disk,
            "voters": g.voters,
            "learners": g.learners,
            "backend": g.backend,
            "waiting_reads": g.waiting_reads,
            "step_down_answers": g.step_down_answers,
            "snapshot": {
                "taken": g.snapshot.taken,
                "index": g.snapshot.last_index,
                "bytes": g.snapshot.last_bytes,
                "duration_us": g.snapshot.last_us,
                "capture_us": g.snapshot.last_capture_us,
                "failed": g.snapshot.failed,
                "retained_from": g.snapshot.retained_from,
                "unreadable_entries": g.snapshot.unreadable_entries,
                "installed": g.snapshot.installed,
                "image_chunks_sent": g.snapshot.image_chunks_sent,
                "image_chunks_staged": g.snapshot.image_chunks_staged,
                "images_resumed": g.snapshot.images_resumed,
                "image_resumed_at": g.snapshot.image_resumed_at,
                "image": if g.snapshot.image_index == 0 {
                    serde_json::Value::Null
                } else {
                    serde_json::json!({
                        "index": g.snapshot.image_index,
                        "held": g.snapshot.image_held,
                        "total": g.snapshot.image_total,
                    })
                },
            },
            "scrub": {
                "bytes_per_s": g.scrub.bytes_per_s,
                "bytes_verified": g.scrub.bytes_verified,
                "batches_verified": g.scrub.batches_verified,
                "damaged_batches": g.scrub.damaged_batches,
                "passes": g.scrub.passes,
                "last_pass_age_ms": g.scrub.last_pass_age_ms,
                "last_pass_ms": g.scrub.last_pass_ms,
            },
            "repair": {
                "missing": g.repair.missing,
                "lost": g.repair.lost,
                "unverifiable": g.repair.unverifiable,
                "repaired": g.repair.repaired,
                "rejected": g.repair.rejected,
                "served": g.repair.served,
                "requests": g.repair.requests,
                "store_refusals": g.repair.store_refusals,
            },
            "follower_lag": g.follower_lag.iter().map(|(p, lag)| serde_json::json!({
                "peer": p,
                "entries": lag,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "links": s.links.iter().map(|l| serde_json::json!({
            "peer": l.peer,
            "channel": l.channel,
            "state": l.state,
            "last_heard_ago_ms": l.last_heard_ago_ms,
            "rtt_us": (l.channel == "udp")
                .then(|| s.transport.iter().find(|t| t.peer == l.peer).map(|t| t.rtt_us))
                .flatten(),
        })).collect::<Vec<_>>(),
        "peers": s.peers.iter().map(|p| serde_json::json!({
            "peer": p.peer,
            "status": p.status,
            "disk_stalled": p.disk_stalled,
        })).collect::<Vec<_>>(),
        "transitions": s.transitions,
        "quotas": s.quotas.iter().map(|q| serde_json::json!({
            "principal": q.principal,
            "bytes_per_s": q.quota.bytes_per_s,
            "requests_per_s": q.quota.requests_per_s,
            "charged_bytes": q.bytes,
            "charged_requests": q.requests,
            "holds": q.holds,
            "held_ms": q.held_ms,
        })).collect::<Vec<_>>(),
    })
}
