//! The per-group metrics of `/metrics`: Raft positions and counters, the
//! log, snapshots, repair and scrub of each group this node runs, and
//! each follower's lag as its leader sees it. Registered in one
//! `Registry` with the node's own metrics (`metrics`); reads a
//! `NodeStatus`, never a loop.

use crate::consensus::Role;
use crate::node::NodeStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of a per-group metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: u32,
}

/// A gauge per group.
type GroupGauge = Family<GroupLabel, Gauge<u64, AtomicU64>>;
/// A per-group log gauge and the counter it shows.
type WalGauge = (GroupGauge, fn(&crate::node::WalView) -> u64);
type SnapshotGauge = (GroupGauge, fn(&crate::node::SnapshotStats) -> u64);
type RepairGauge = (GroupGauge, fn(&crate::node::RepairStats) -> u64);
type ScrubGauge = (GroupGauge, fn(&crate::node::ScrubStats) -> u64);

/// Labels of a per-follower metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LagLabel {
    group: u32,
    peer: u64,
}

/// Registers every per-group metric of `s` in `reg`.
pub(super) fn register(reg: &mut Registry, s: &NodeStatus) {
    let gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<GroupLabel, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, f.clone());
        f
    };
    let term = gauge(reg, "raft_term", "Current Raft term");
    let commit = gauge(reg, "raft_commit_index", "Commit index");
    let applied = gauge(reg, "raft_applied_index", "Applied index");
    let persisted = gauge(
        reg,
        "raft_persisted_index",
        "Index durable on this node's disk",
    );
    let leader = gauge(reg, "raft_is_leader", "1 if this node leads the group");
    let elections = gauge(
        reg,
        "raft_elections_started",
        "Elections started (after pre-vote)",
    );
    let fast = gauge(
        reg,
        "raft_fast_campaigns",
        "Campaigns started by the failure detector",
    );
    let stall_downs = gauge(
        reg,
        "raft_disk_stall_step_downs",
        "Leaderships given up for a stalled disk",
    );
    let preferred_transfers = gauge(
        reg,
        "raft_preferred_leader_transfers",
        "Handovers this node started to the group's preferred leader",
    );
    let preferred_failed = gauge(
        reg,
        "raft_preferred_leader_transfers_failed",
        "Handovers to the preferred leader that timed out",
    );
    let disk_ok = gauge(reg, "disk_healthy", "1 if the group's disk is healthy");
    let wal_gauges: Vec<WalGauge> = vec![
        (
            gauge(reg, "wal_flushes", "Flushes (write + fdatasync) completed"),
            |w| w.flushes,
        ),
        (
            gauge(
                reg,
                "wal_flush_latency_p50_us",
                "Flush latency, median, microseconds",
            ),
            |w| w.flush_p50_us,
        ),
        (
            gauge(
                reg,
                "wal_flush_latency_p99_us",
                "Flush latency, 99th percentile, microseconds",
            ),
            |w| w.flush_p99_us,
        ),
        (
            gauge(
                reg,
                "wal_records_per_flush_p50",
                "Records per flush, median",
            ),
            |w| w.records_per_flush_p50,
        ),
        (
            gauge(
                reg,
                "wal_bytes",
                "Bytes written to the log, padding included",
            ),
            |w| w.bytes,
        ),
        (
            gauge(
                reg,
                "wal_segments_recycled",
                "Trimmed segments kept for reuse",
            ),
            |w| w.segments_recycled,
        ),
        (
            gauge(reg, "wal_segments_zero_filled", "Segments zero-filled"),
            |w| w.segments_zero_filled,
        ),
        (
            gauge(reg, "wal_stalls", "Flushes slower than disk_stall_ms"),
            |w| w.stalls,
        ),
        (
            gauge(reg, "wal_io_errors", "Write or fdatasync errors"),
            |w| w.io_errors,
        ),
        (
            gauge(
                reg,
                "wal_disk_full_refusals",
                "Appends refused for a full disk",
            ),
            |w| w.disk_full_refusals,
        ),
        (
            gauge(
                reg,
                "wal_cold_reads",
                "Batches read back from the segments for answers",
            ),
            |w| w.cold_reads,
        ),
        (
            gauge(
                reg,
                "wal_cold_read_errors",
                "Cold reads that failed; the answer that wanted it got an error",
            ),
            |w| w.cold_read_errors,
        ),
        (
            gauge(
                reg,
                "wal_entries_repaired",
                "Entries below the snapshot stored as copies repaired from a peer",
            ),
            |w| w.entries_repaired,
        ),
    ];
    let snapshot_gauges: [SnapshotGauge; 12] = [
        (
            gauge(
                reg,
                "snapshots_installed",
                "Snapshots installed from a leader, their images adopted as the log",
            ),
            |s| s.installed,
        ),
        (
            gauge(
                reg,
                "snapshot_image_chunks_sent",
                "Leader: chunks of snapshot images read from the segments and sent to followers",
            ),
            |s| s.image_chunks_sent,
        ),
        (
            gauge(
                reg,
                "snapshot_image_chunks_staged",
                "Follower: chunks of snapshot images written durably to the staged segments",
            ),
            |s| s.image_chunks_staged,
        ),
        (
            gauge(
                reg,
                "snapshot_images_resumed",
                "Follower: staged snapshot images taken up again after a restart",
            ),
            |s| s.images_resumed,
        ),
        (
            gauge(
                reg,
                "snapshot_image_held_ratio_permille",
                "Follower: how much of the snapshot image being staged is held, per mille; 0 when none",
            ),
            |s| (s.image_held * 1000).checked_div(s.image_total).unwrap_or(0),
        ),
        (
            gauge(reg, "snapshots_taken", "Snapshots written and adopted"),
            |s| s.taken,
        ),
        (
            gauge(reg, "snapshots_failed", "Snapshots that could not be written"),
            |s| s.failed,
        ),
        (
            gauge(
                reg,
                "snapshot_bytes",
                "Bytes of the last snapshot's state-machine data",
            ),
            |s| s.last_bytes,
        ),
        (
            gauge(
                reg,
                "snapshot_duration_us",
                "Last snapshot, capture to adoption (encoding and fsync off the loop), microseconds",
            ),
            |s| s.last_us,
        ),
        (
            gauge(
                reg,
                "snapshot_capture_us",
                "Time the loop spent capturing the last snapshot's view, microseconds",
            ),
            |s| s.last_capture_us,
        ),
        (
            gauge(
                reg,
                "log_retained_from_index",
                "Lowest log index the state at the snapshot refers to (an old ledger entry or unacked message); segments from it on are kept; 0 for none",
            ),
            |s| s.retained_from,
        ),
        (
            gauge(
                reg,
                "log_unreadable_entries",
                "Log entries the ledgers and queues refer to that this node could not read (a damaged segment); 0 when healthy",
            ),
            |s| s.unreadable_entries,
        ),
    ];
    let repair_gauges: [RepairGauge; 8] = [
        (
            gauge(
                reg,
                "log_repair_missing_entries",
                "Log entries below the snapshot the state refers to that this node cannot serve now (being repaired from peers); 0 when healthy",
            ),
            |r| r.missing,
        ),
        (
            gauge(
                reg,
                "log_repair_lost_entries",
                "Of those, entries no other member holds either (reads of them fail)",
            ),
            |r| r.lost,
        ),
        (
            gauge(
                reg,
                "log_repair_unverifiable_entries",
                "Of those, entries the state holds no check for (restored from an older snapshot): never repaired",
            ),
            |r| r.unverifiable,
        ),
        (
            gauge(
                reg,
                "log_repaired_entries",
                "Entries repaired from a peer and stored since start",
            ),
            |r| r.repaired,
        ),
        (
            gauge(
                reg,
                "log_repair_rejected_copies",
                "Copies from peers refused: not the term and CRC32C the state recorded",
            ),
            |r| r.rejected,
        ),
        (
            gauge(
                reg,
                "log_repair_served_entries",
                "Entries sent to peers repairing theirs, since start",
            ),
            |r| r.served,
        ),
        (
            gauge(reg, "log_repair_requests", "Repair requests sent to peers"),
            |r| r.requests,
        ),
        (
            gauge(
                reg,
                "log_repair_store_refusals",
                "Stores of repaired copies the log refused (disk full, the repaired-bytes cap, or another refusal); requests back off",
            ),
            |r| r.store_refusals,
        ),
    ];
    let scrub_gauges: [ScrubGauge; 5] = [
        (
            gauge(
                reg,
                "log_scrub_bytes_verified",
                "Bytes of the log the background scrub read and checked since start",
            ),
            |s| s.bytes_verified,
        ),
        (
            gauge(
                reg,
                "log_scrub_damaged_batches",
                "Damaged batches the scrub found since start (below the snapshot: repaired from peers)",
            ),
            |s| s.damaged_batches,
        ),
        (
            gauge(reg, "log_scrub_passes", "Whole scrub passes over the log since start"),
            |s| s.passes,
        ),
        (
            gauge(
                reg,
                "log_scrub_last_pass_age_seconds",
                "Seconds since the last whole scrub pass ended (absent before the first)",
            ),
            |s| s.last_pass_age_ms.map_or(0, |ms| ms / 1000),
        ),
        (
            gauge(
                reg,
                "log_scrub_bytes_per_second",
                "The scrub's read rate (storage.scrub_bytes_per_s; 0: off)",
            ),
            |s| s.bytes_per_s,
        ),
    ];
    let repair_downs = gauge(
        reg,
        "raft_repair_step_downs",
        "Leaderships given up for entries to repair (handed over, or stepped down)",
    );
    let step_down_answers = gauge(
        reg,
        "raft_step_down_answers",
        "Client requests answered NotLeader as this node stopped leading",
    );
    let lag = Family::<LagLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "raft_follower_lag_entries",
        "On the leader: entries a follower's durable log is behind",
        lag.clone(),
    );
    for g in &s.groups {
        let l = GroupLabel { group: g.group };
        term.get_or_create(&l).set(g.term);
        commit.get_or_create(&l).set(g.commit);
        applied.get_or_create(&l).set(g.applied);
        persisted.get_or_create(&l).set(g.persisted);
        leader
            .get_or_create(&l)
            .set(u64::from(g.role == Role::Leader));
        elections.get_or_create(&l).set(g.stats.elections_started);
        fast.get_or_create(&l).set(g.stats.fast_campaigns);
        stall_downs
            .get_or_create(&l)
            .set(g.stats.disk_stall_step_downs);
        preferred_transfers
            .get_or_create(&l)
            .set(g.stats.preferred_leader_transfers);
        preferred_failed
            .get_or_create(&l)
            .set(g.stats.preferred_leader_transfers_failed);
        disk_ok
            .get_or_create(&l)
            .set(u64::from(g.disk == "healthy"));
        for (family, value) in &wal_gauges {
            family.get_or_create(&l).set(value(&g.wal));
        }
        for (family, value) in &snapshot_gauges {
            family.get_or_create(&l).set(value(&g.snapshot));
        }
        for (family, value) in &repair_gauges {
            family.get_or_create(&l).set(value(&g.repair));
        }
        for (family, value) in &scrub_gauges {
            family.get_or_create(&l).set(value(&g.scrub));
        }
        repair_downs
            .get_or_create(&l)
            .set(g.stats.repair_step_downs);
        step_down_answers.get_or_create(&l).set(g.step_down_answers);
        for &(peer, n) in &g.follower_lag {
            let label = LagLabel {
                group: g.group,
                peer,
            };
            lag.get_or_create(&label).set(n);
        }
    }
}
