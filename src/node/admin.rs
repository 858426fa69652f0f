//! The admin endpoint: HTTP `/metrics` in the Prometheus text format and
//! `/status` as JSON, readable by anyone who can reach it, and `POST
//! /membership`, which only an admin opens (`admin_auth`), served
//! by a few threads of its own off the data path (`admin_http`, which
//! bounds what a peer can make them hold). It asks the node's loops for
//! their status through the handle (channels), so it never touches their
//! state. With `node.admin_tls` it serves all of it over HTTPS only,
//! with the client listener's certificate.

use super::admin_auth::{Gate, RefusalCounts};
use super::admin_http::{Handler, HttpRefusals, HttpRequest, HttpResponse, HttpServer};
use super::log::log_info;
use super::{ListenError, NodeHandle, NodeStatus};
use crate::consensus::Role;
use crate::node::credentials::Credentials;
use crate::node::quota::QuotaView;
use crate::tls::ServerTls;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Labels of a per-group metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: u32,
}

/// A gauge per group.
type GroupGauge = Family<GroupLabel, Gauge<u64, AtomicU64>>;
/// A per-group log gauge and the counter it shows.
type WalGauge = (GroupGauge, fn(&super::WalView) -> u64);
type SnapshotGauge = (GroupGauge, fn(&super::SnapshotStats) -> u64);
type RepairGauge = (GroupGauge, fn(&super::RepairStats) -> u64);
type ScrubGauge = (GroupGauge, fn(&super::ScrubStats) -> u64);

/// Labels of a per-follower metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LagLabel {
    group: u32,
    peer: u64,
}

/// Labels of a per-peer transport metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerOnly {
    peer: u64,
}

/// Labels of a per-link metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabel {
    peer: u64,
    channel: String,
}

/// Labels of the admin endpoint's refusals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// A per-principal quota metric: its name, help and value.
type QuotaMetric = (&'static str, &'static str, fn(&QuotaView) -> u64);

/// Labels of a per-principal metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
}

/// Labels of a per-peer metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: u64,
    status: String,
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PreCandidate => "pre-candidate",
    }
}

/// The Prometheus text exposition of `s` (the admin endpoint's own
/// refusal counters at zero).
pub fn metrics_text(s: &NodeStatus) -> String {
    metrics_text_with(
        s,
        &RefusalCounts::default(),
        &HttpRefusals::default().counts(),
    )
}

/// [`metrics_text`] with the admin endpoint's refusals so far.
fn metrics_text_with(
    s: &NodeStatus,
    refusals: &RefusalCounts,
    http_refusals: &[(&'static str, u64)],
) -> String {
    let mut reg = Registry::with_prefix("quire");
    let gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<GroupLabel, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, f.clone());
        f
    };
    let term = gauge(&mut reg, "raft_term", "Current Raft term");
    let commit = gauge(&mut reg, "raft_commit_index", "Commit index");
    let applied = gauge(&mut reg, "raft_applied_index", "Applied index");
    let persisted = gauge(
        &mut reg,
        "raft_persisted_index",
        "Index durable on this node's disk",
    );
    let leader = gauge(&mut reg, "raft_is_leader", "1 if this node leads the group");
    let elections = gauge(
        &mut reg,
        "raft_elections_started",
        "Elections started (after pre-vote)",
    );
    let fast = gauge(
        &mut reg,
        "raft_fast_campaigns",
        "Campaigns started by the failure detector",
    );
    let stall_downs = gauge(
        &mut reg,
        "raft_disk_stall_step_downs",
        "Leaderships given up for a stalled disk",
    );
    let preferred_transfers = gauge(
        &mut reg,
        "raft_preferred_leader_transfers",
        "Handovers this node started to the group's preferred leader",
    );
    let preferred_failed = gauge(
        &mut reg,
        "raft_preferred_leader_transfers_failed",
        "Handovers to the preferred leader that timed out",
    );
    let disk_ok = gauge(&mut reg, "disk_healthy", "1 if the group's disk is healthy");
    let wal_gauges: Vec<WalGauge> = vec![
        (
            gauge(
                &mut reg,
                "wal_flushes",
                "Flushes (write + fdatasync) completed",
            ),
            |w| w.flushes,
        ),
        (
            gauge(
                &mut reg,
                "wal_flush_latency_p50_us",
                "Flush latency, median, microseconds",
            ),
            |w| w.flush_p50_us,
        ),
        (
            gauge(
                &mut reg,
                "wal_flush_latency_p99_us",
                "Flush latency, 99th percentile, microseconds",
            ),
            |w| w.flush_p99_us,
        ),
        (
            gauge(
                &mut reg,
                "wal_records_per_flush_p50",
                "Records per flush, median",
            ),
            |w| w.records_per_flush_p50,
        ),
        (
            gauge(
                &mut reg,
                "wal_bytes",
                "Bytes written to the log, padding included",
            ),
            |w| w.bytes,
        ),
        (
            gauge(
                &mut reg,
                "wal_segments_recycled",
                "Trimmed segments kept for reuse",
            ),
            |w| w.segments_recycled,
        ),
        (
            gauge(&mut reg, "wal_segments_zero_filled", "Segments zero-filled"),
            |w| w.segments_zero_filled,
        ),
        (
            gauge(&mut reg, "wal_stalls", "Flushes slower than disk_stall_ms"),
            |w| w.stalls,
        ),
        (
            gauge(&mut reg, "wal_io_errors", "Write or fdatasync errors"),
            |w| w.io_errors,
        ),
        (
            gauge(
                &mut reg,
                "wal_disk_full_refusals",
                "Appends refused for a full disk",
            ),
            |w| w.disk_full_refusals,
        ),
        (
            gauge(
                &mut reg,
                "wal_cold_reads",
                "Batches read back from the segments for answers",
            ),
            |w| w.cold_reads,
        ),
        (
            gauge(
                &mut reg,
                "wal_cold_read_errors",
                "Cold reads that failed; the answer that wanted it got an error",
            ),
            |w| w.cold_read_errors,
        ),
        (
            gauge(
                &mut reg,
                "wal_entries_repaired",
                "Entries below the snapshot stored as copies repaired from a peer",
            ),
            |w| w.entries_repaired,
        ),
    ];
    let snapshot_gauges: [SnapshotGauge; 12] = [
        (
            gauge(
                &mut reg,
                "snapshots_installed",
                "Snapshots installed from a leader, their images adopted as the log",
            ),
            |s| s.installed,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_image_chunks_sent",
                "Leader: chunks of snapshot images read from the segments and sent to followers",
            ),
            |s| s.image_chunks_sent,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_image_chunks_staged",
                "Follower: chunks of snapshot images written durably to the staged segments",
            ),
            |s| s.image_chunks_staged,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_images_resumed",
                "Follower: staged snapshot images taken up again after a restart",
            ),
            |s| s.images_resumed,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_image_held_ratio_permille",
                "Follower: how much of the snapshot image being staged is held, per mille; 0 when none",
            ),
            |s| (s.image_held * 1000).checked_div(s.image_total).unwrap_or(0),
        ),
        (
            gauge(&mut reg, "snapshots_taken", "Snapshots written and adopted"),
            |s| s.taken,
        ),
        (
            gauge(&mut reg, "snapshots_failed", "Snapshots that could not be written"),
            |s| s.failed,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_bytes",
                "Bytes of the last snapshot's state-machine data",
            ),
            |s| s.last_bytes,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_duration_us",
                "Last snapshot, capture to adoption (encoding and fsync off the loop), microseconds",
            ),
            |s| s.last_us,
        ),
        (
            gauge(
                &mut reg,
                "snapshot_capture_us",
                "Time the loop spent capturing the last snapshot's view, microseconds",
            ),
            |s| s.last_capture_us,
        ),
        (
            gauge(
                &mut reg,
                "log_retained_from_index",
                "Lowest log index the state at the snapshot refers to (an old ledger entry or unacked message); segments from it on are kept; 0 for none",
            ),
            |s| s.retained_from,
        ),
        (
            gauge(
                &mut reg,
                "log_unreadable_entries",
                "Log entries the ledgers and queues refer to that this node could not read (a damaged segment); 0 when healthy",
            ),
            |s| s.unreadable_entries,
        ),
    ];
    let repair_gauges: [RepairGauge; 8] = [
        (
            gauge(
                &mut reg,
                "log_repair_missing_entries",
                "Log entries below the snapshot the state refers to that this node cannot serve now (being repaired from peers); 0 when healthy",
            ),
            |r| r.missing,
        ),
        (
            gauge(
                &mut reg,
                "log_repair_lost_entries",
                "Of those, entries no other member holds either (reads of them fail)",
            ),
            |r| r.lost,
        ),
        (
            gauge(
                &mut reg,
                "log_repair_unverifiable_entries",
                "Of those, entries the state holds no check for (restored from an older snapshot): never repaired",
            ),
            |r| r.unverifiable,
        ),
        (
            gauge(
                &mut reg,
                "log_repaired_entries",
                "Entries repaired from a peer and stored since start",
            ),
            |r| r.repaired,
        ),
        (
            gauge(
                &mut reg,
                "log_repair_rejected_copies",
                "Copies from peers refused: not the term and CRC32C the state recorded",
            ),
            |r| r.rejected,
        ),
        (
            gauge(
                &mut reg,
                "log_repair_served_entries",
                "Entries sent to peers repairing theirs, since start",
            ),
            |r| r.served,
        ),
        (
            gauge(&mut reg, "log_repair_requests", "Repair requests sent to peers"),
            |r| r.requests,
        ),
        (
            gauge(
                &mut reg,
                "log_repair_store_refusals",
                "Stores of repaired copies the log refused (disk full, the repaired-bytes cap, or another refusal); requests back off",
            ),
            |r| r.store_refusals,
        ),
    ];
    let scrub_gauges: [ScrubGauge; 5] = [
        (
            gauge(
                &mut reg,
                "log_scrub_bytes_verified",
                "Bytes of the log the background scrub read and checked since start",
            ),
            |s| s.bytes_verified,
        ),
        (
            gauge(
                &mut reg,
                "log_scrub_damaged_batches",
                "Damaged batches the scrub found since start (below the snapshot: repaired from peers)",
            ),
            |s| s.damaged_batches,
        ),
        (
            gauge(&mut reg, "log_scrub_passes", "Whole scrub passes over the log since start"),
            |s| s.passes,
        ),
        (
            gauge(
                &mut reg,
                "log_scrub_last_pass_age_seconds",
                "Seconds since the last whole scrub pass ended (absent before the first)",
            ),
            |s| s.last_pass_age_ms.map_or(0, |ms| ms / 1000),
        ),
        (
            gauge(
                &mut reg,
                "log_scrub_bytes_per_second",
                "The scrub's read rate (storage.scrub_bytes_per_s; 0: off)",
            ),
            |s| s.bytes_per_s,
        ),
    ];
    let repair_downs = gauge(
        &mut reg,
        "raft_repair_step_downs",
        "Leaderships given up for entries to repair (handed over, or stepped down)",
    );
    let step_down_answers = gauge(
        &mut reg,
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
    let link_up = Family::<LinkLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "link_up",
        "1 if the link to the peer is up or late",
        link_up.clone(),
    );
    for l in &s.links {
        let label = LinkLabel {
            peer: l.peer,
            channel: l.channel.to_string(),
        };
        link_up
            .get_or_create(&label)
            .set(u64::from(l.state == "up" || l.state == "late"));
    }
    let peer_status = Family::<PeerLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "peer_status",
        "1 for the peer's current classification",
        peer_status.clone(),
    );
    for p in &s.peers {
        let label = PeerLabel {
            peer: p.peer,
            status: p.status.to_string(),
        };
        peer_status.get_or_create(&label).set(1);
    }
    let alarm = Gauge::<u64, AtomicU64>::default();
    reg.register("link_alarm", "1 while any link is dead", alarm.clone());
    alarm.set(u64::from(s.alarm));
    for (name, help, value) in [
        (
            "loop_stalls",
            "Loop turns late by more than stall_grace_ms (this node paused or starved)",
            s.stalls.count,
        ),
        (
            "loop_stalled_ms",
            "Ms of this node's own stalls, not counted against peers or timers",
            s.stalls.stalled_ms,
        ),
        (
            "loop_stall_longest_ms",
            "The longest single stall of any loop, ms",
            s.stalls.longest_ms,
        ),
        (
            "net_xdp_loops",
            "Loops whose datagrams go through AF_XDP (the rest use sockets: /status net says why)",
            s.net.iter().filter(|n| n.xdp).count() as u64,
        ),
        (
            "xdp_rx_datagrams",
            "Datagrams received through the AF_XDP rx rings",
            s.net.iter().map(|n| n.counters.rx_datagrams).sum(),
        ),
        (
            "xdp_rx_rejected",
            "Frames on the AF_XDP rx rings refused (not a UDP datagram to this node, bad IP header)",
            s.net.iter().map(|n| n.counters.rx_rejected).sum(),
        ),
        (
            "xdp_tx_datagrams",
            "Datagrams sent through the AF_XDP tx rings",
            s.net.iter().map(|n| n.counters.tx_datagrams).sum(),
        ),
        (
            "xdp_tx_via_kernel",
            "Datagrams of the AF_XDP path sent through the kernel socket (peer MAC not yet known)",
            s.net.iter().map(|n| n.counters.tx_via_kernel).sum(),
        ),
        (
            "xdp_rx_kernel_dropped",
            "Frames the kernel dropped before the AF_XDP rx ring (ring full or no free frame: the loop fell behind)",
            s.net.iter().map(|n| n.counters.rx_kernel_dropped).sum(),
        ),
        (
            "xdp_tx_ring_full",
            "Sends that found the AF_XDP tx ring or its frames all in use",
            s.net.iter().map(|n| n.counters.tx_ring_full).sum(),
        ),
    ] {
        let g = Gauge::<u64, AtomicU64>::default();
        reg.register(name, help, g.clone());
        g.set(value);
    }
    let peer_gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PeerOnly, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rtt = peer_gauge(
        &mut reg,
        "transport_rtt_us",
        "Smoothed UDP round-trip time to the peer, microseconds",
    );
    let sent = peer_gauge(
        &mut reg,
        "transport_datagrams_sent",
        "Datagrams sent to the peer",
    );
    let received = peer_gauge(
        &mut reg,
        "transport_datagrams_received",
        "Authenticated datagrams received from the peer",
    );
    let nacks = peer_gauge(
        &mut reg,
        "transport_nack_rounds",
        "NACK rounds sent to the peer (gaps in its traffic)",
    );
    let rexmits = peer_gauge(
        &mut reg,
        "transport_retransmits",
        "DATA frames retransmitted to the peer (it asked for them)",
    );
    for t in &s.transport {
        let l = PeerOnly { peer: t.peer };
        rexmits.get_or_create(&l).set(t.retransmits);
        rtt.get_or_create(&l).set(t.rtt_us);
        sent.get_or_create(&l).set(t.datagrams_sent);
        received.get_or_create(&l).set(t.datagrams_received);
        nacks.get_or_create(&l).set(t.nack_rounds);
    }
    let mac = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_mac_failures",
        "Datagrams dropped for a bad MAC",
        mac.clone(),
    );
    mac.set(s.mac_failures);
    let malformed = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_malformed_dropped",
        "Datagrams dropped as malformed",
        malformed.clone(),
    );
    malformed.set(s.malformed_dropped);
    let refused = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_sends_refused",
        "Raft messages refused by a full transport window",
        refused.clone(),
    );
    refused.set(s.sends_refused);
    let c = &s.clients;
    let client_gauges: [(&str, &str, u64); 8] = [
        ("client_connections_accepted", "Client TCP connections accepted", c.connections_accepted),
        ("client_connections_refused", "Client connections closed at once: source address full of authenticated connections, or every authenticated slot taken at Hello", c.connections_refused),
        ("client_connections_evicted", "Unauthenticated client connections closed to make room for a newer one", c.connections_evicted),
        ("client_hello_timeouts", "Client connections closed for no Hello within client.hello_timeout_ms", c.hello_timeouts),
        ("client_auth_failures", "Client Hellos with a wrong token", c.auth_failures),
        ("client_tls_failures", "Client connections closed for a failed TLS handshake or a corrupt TLS record", c.tls_failures),
        ("client_connections_authenticated", "Client connections authenticated now", c.authenticated),
        ("client_connections_unauthenticated", "Client connections waiting for their Hello now", c.unauthenticated),
    ];
    for (name, help, value) in client_gauges {
        let g = Gauge::<u64, AtomicU64>::default();
        reg.register(name, help, g.clone());
        g.set(value);
    }
    let denials = Family::<PrincipalLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "client_denials",
        "Client requests refused as Forbidden, by principal (its credentials' grants do not cover them)",
        denials.clone(),
    );
    for (principal, n) in &c.denials {
        let label = PrincipalLabel {
            principal: principal.clone(),
        };
        denials.get_or_create(&label).set(*n);
    }
    let quota_metrics: [QuotaMetric; 6] = [
        (
            "client_quota_bytes_per_second",
            "A principal's quota of write bytes per second (node.credentials_file)",
            |q| q.quota.bytes_per_s.unwrap_or(0),
        ),
        (
            "client_quota_requests_per_second",
            "A principal's quota of write requests per second (node.credentials_file)",
            |q| q.quota.requests_per_s.unwrap_or(0),
        ),
        (
            "client_quota_charged_bytes",
            "Bytes of writes charged to a principal's quota",
            |q| q.bytes,
        ),
        (
            "client_quota_charged_requests",
            "Write requests charged to a principal's quota",
            |q| q.requests,
        ),
        (
            "client_quota_holds",
            "Times a connection of a principal was held (not read) for its quota",
            |q| q.holds,
        ),
        (
            "client_quota_held_ms",
            "Milliseconds connections of a principal were held for its quota, summed",
            |q| q.held_ms,
        ),
    ];
    for (name, help, value) in quota_metrics {
        let family = Family::<PrincipalLabel, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, family.clone());
        for q in &s.quotas {
            let label = PrincipalLabel {
                principal: q.principal.clone(),
            };
            family.get_or_create(&label).set(value(q));
        }
    }
    let admin_refusals = Family::<ReasonLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "admin_refusals",
        "Mutating admin requests refused, by reason (missing_token, malformed_token, wrong_token, browser, not_configured, token_file_unusable)",
        admin_refusals.clone(),
    );
    for (reason, n) in refusals.iter() {
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        admin_refusals.get_or_create(&label).set(n);
    }
    let admin_http_refusals = Family::<ReasonLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "admin_http_refusals",
        "Admin requests refused before reading them whole, by reason (busy, head_too_large, body_too_large, malformed, timed_out, handler_panicked)",
        admin_http_refusals.clone(),
    );
    for &(reason, n) in http_refusals {
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        admin_http_refusals.get_or_create(&label).set(n);
    }
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

/// `s` as the JSON of `/status`.
pub fn status_json(s: &NodeStatus) -> serde_json::Value {
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

/// `POST /membership?group=G&change=remove|learner|voter&node=N[&force=1]`:
/// one membership change of group G, proposed on this node (its leader);
/// answers once applied, or why not: 400 for a request that cannot apply
/// (bad arguments, node 0, removing a non-member, adding a member twice,
/// promoting a voter, or without `force` a node that is not a learner),
/// 404 for a group this node does not run, 409 if this node does not lead
/// the group, another change or a leadership transfer is under way, or
/// (without `force`) the learner to promote is more than
/// `LEARNER_CAUGHT_UP_ENTRIES_MAX` entries behind the leader's log, 503
/// if the group cannot serve (stopped log, full disk, no answer in time).
/// Every outcome is logged with who asked (`peer`, as `who`).
fn membership(node: &NodeHandle, query: &str, peer: &str, who: &str) -> (u16, String) {
    let (code, body) = membership_outcome(node, query);
    log_info!(
        "quired: admin: membership change {query:?} from {peer} as {who}: {code} {}",
        body.trim_end()
    );
    (code, body)
}

/// The value of `key` in a URL's `query` (`k=v&k=v`), if there.
fn query_arg(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn membership_outcome(node: &NodeHandle, query: &str) -> (u16, String) {
    use crate::consensus::MembershipChange;
    const USAGE: &str = "want group=G&change=remove|learner|voter&node=N[&force=1]";
    let arg = |k: &str| query_arg(query, k);
    let (Some(group), Some(peer)) = (
        arg("group").and_then(|g| g.parse::<u32>().ok()),
        arg("node").and_then(|n| n.parse::<u64>().ok()),
    ) else {
        return (400, format!("{USAGE}\n"));
    };
    let change = match arg("change").as_deref() {
        Some("remove") => MembershipChange::Remove(peer),
        Some("learner") => MembershipChange::AddLearner(peer),
        Some("voter") => MembershipChange::AddVoter(peer),
        _ => return (400, format!("{USAGE}\n")),
    };
    if peer == 0 {
        return (400, "node 0 is reserved: no node has that id\n".into());
    }
    if !node.groups().any(|g| g == group) {
        let groups: Vec<String> = node.groups().map(|g| g.to_string()).collect();
        return (
            404,
            format!(
                "group {group} is not on this node (its groups: {})\n",
                groups.join(", ")
            ),
        );
    }
    use super::ProposeError as E;
    // `force=1`: promote a learner however far behind, or a non-member.
    let force = matches!(arg("force").as_deref(), Some("1" | "true"));
    match node.change_membership_with(group, change, force, std::time::Duration::from_secs(10)) {
        Ok(index) => (200, format!("{change} applied at index {index}\n")),
        Err(e @ E::Invalid(_)) => (400, format!("{e}\n")),
        Err(e @ (E::NotLeader(_) | E::Busy(_) | E::Lagging(_))) => (409, format!("{e}\n")),
        Err(e) => (503, format!("{e}\n")),
    }
}

/// `POST /leader?group=G&node=N`: hands group G's leadership to voter N
/// (on the group's leader), answered once this node hears from N as
/// leader; logged with who asked.
fn leader_transfer(node: &NodeHandle, query: &str, peer: &str, who: &str) -> (u16, String) {
    let (code, body) = leader_transfer_outcome(node, query);
    log_info!(
        "quired: admin: leadership transfer {query:?} from {peer} as {who}: {code} {}",
        body.trim_end()
    );
    (code, body)
}

fn leader_transfer_outcome(node: &NodeHandle, query: &str) -> (u16, String) {
    const USAGE: &str = "want group=G&node=N (a voter of the group)";
    let arg = |k: &str| query_arg(query, k);
    let (Some(group), Some(to)) = (
        arg("group").and_then(|g| g.parse::<u32>().ok()),
        arg("node").and_then(|n| n.parse::<u64>().ok()),
    ) else {
        return (400, format!("{USAGE}\n"));
    };
    if to == 0 {
        return (400, "node 0 is reserved: no node has that id\n".into());
    }
    if !node.groups().any(|g| g == group) {
        return (404, format!("group {group} is not on this node\n"));
    }
    use super::ProposeError as E;
    match node.transfer_leadership(group, to, std::time::Duration::from_secs(10)) {
        Ok(term) => (
            200,
            format!("node {to} leads group {group} in term {term}\n"),
        ),
        Err(e @ E::Invalid(_)) => (400, format!("{e}\n")),
        Err(e @ (E::NotLeader(_) | E::Busy(_))) => (409, format!("{e}\n")),
        Err(e) => (503, format!("{e}\n")),
    }
}

/// A running admin endpoint; stops when dropped.
pub struct AdminServer {
    http: HttpServer,
}

impl AdminServer {
    /// Serves `/metrics`, `/status`, `/membership` and `/leader` for `node` on
    /// `listen`, over HTTPS only if given `tls`. Requests other than GET
    /// need an admin: the token in `admin_token_file` (read again for
    /// each, so replacing the file rotates it), or a principal of
    /// `credentials` with an `admin` grant, by token or client
    /// certificate; with neither configured they are all refused. What a
    /// peer can make it hold is bounded (`admin_http`).
    pub fn start(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        admin_token_file: Option<PathBuf>,
        credentials: Credentials,
        tls: Option<Arc<ServerTls>>,
    ) -> Result<AdminServer, ListenError> {
        let bind_failed = |error| ListenError::Bind {
            server: "the admin endpoint",
            addr: listen,
            error,
        };
        let listener = std::net::TcpListener::bind(listen).map_err(bind_failed)?;
        let gate = Mutex::new(Gate::new(admin_token_file, credentials));
        let refusals = Arc::new(HttpRefusals::default());
        let counted = Arc::clone(&refusals);
        let handler: Arc<Handler> =
            Arc::new(move |req: &HttpRequest| answer(&node, &gate, &counted, req));
        let http = HttpServer::start(listener, "quire-admin", handler, refusals, tls)
            .map_err(ListenError::Thread)?;
        Ok(AdminServer { http })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }
}

/// What the endpoint answers `req`.
fn answer(
    node: &NodeHandle,
    gate: &Mutex<Gate>,
    http_refusals: &HttpRefusals,
    req: &HttpRequest,
) -> HttpResponse {
    // Held only to judge and to count: never while a change or a status
    // waits on the loops, so one slow request does not hold the others.
    let gate = || gate.lock().unwrap_or_else(|p| p.into_inner());
    let head = &req.head;
    let url = head.url.as_str();
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let peer = req.peer.map_or("an unknown peer".into(), |a| a.to_string());
    // Whatever is not a read passes the gate first, so a route added
    // later is closed unless said otherwise.
    let reading = matches!(head.method.as_str(), "GET" | "HEAD");
    let mut who = String::new();
    if !reading {
        let headers = head.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let what = format!("{} {url}", head.method);
        // A group that does not parse is none: only an admin of every
        // group passes, and the route then answers the usage.
        let group = query_arg(query, "group").and_then(|g| g.parse().ok());
        let cn = req.client_cn.as_deref();
        match gate().check(headers, cn, group, &what, req.peer, Instant::now()) {
            Ok(w) => who = w,
            Err(r) => {
                let mut resp = HttpResponse::text(r.refusal.status(), r.body);
                if r.refusal.status() == 401 {
                    resp.headers
                        .push(("WWW-Authenticate", "Bearer realm=\"quire-admin\"".into()));
                }
                return resp;
            }
        }
    }
    let (code, ctype, body) = match (head.method.as_str(), path) {
        ("POST", "/membership") => {
            let (code, body) = membership(node, query, &peer, &who);
            (code, "text/plain", body)
        }
        ("POST", "/leader") => {
            let (code, body) = leader_transfer(node, query, &peer, &who);
            (code, "text/plain", body)
        }
        ("GET" | "HEAD", "/metrics") => match node.status() {
            Some(st) => {
                let refusals = gate().counts();
                let text = metrics_text_with(&st, &refusals, &http_refusals.counts());
                (200, "text/plain; version=0.0.4", text)
            }
            None => (503, "text/plain", "node stopped\n".into()),
        },
        ("GET" | "HEAD", "/status") => match node.status() {
            Some(st) => (200, "application/json", status_json(&st).to_string()),
            None => (503, "text/plain", "node stopped\n".into()),
        },
        _ => (
            404,
            "text/plain",
            "try GET /metrics, GET /status, POST /membership or POST /leader\n".into(),
        ),
    };
    HttpResponse {
        status: code,
        headers: vec![("Content-Type", ctype.into())],
        body,
    }
}
