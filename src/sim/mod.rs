//! The deterministic simulator: a driver of its own for the sans-IO cores.
//!
//! It runs the production cores (`consensus::Raft`, the heartbeat's codec,
//! replay guard, detector and failover policy, `state::StateMachine`)
//! through the production glue: each group's replica on each simulated
//! node is `node::Replica`, the one `quired` runs, over the real
//! `storage::Wal` on a simulated block device (`device::SimDir`: lost and
//! torn unsynced writes, bit rot, misdirected writes, EIO, a full disk,
//! stalls, latency), with its snapshot and image jobs run when the seed
//! says (`glue`). An oracle built from what the device really synced
//! (never from the WAL) holds it to every invariant (`disk`: the shadow).
//!
//! Raft messages cross the simulated network in one of two ways
//! ([`Net`]): encoded with `transport::raft_codec` and carried by one
//! production `transport::Endpoint` per node as datagrams, heartbeats too
//! (`Net::Endpoint`, the default, `endpoint_net`), or handed over directly
//! (`Net::Direct`, a fifth faster). Clients call the replica in process instead of
//! through the client protocol's sessions: issue 18 puts those under the
//! seed next.
//!
//! One seed derives every parameter (timeouts, latencies, loss rates) and
//! every fault (crashes, partitions, loss, duplication, EIO, leadership
//! transfers), and a virtual clock jumps from event to event, so a run is a
//! pure function of its seed: the same seed gives the same trace hash.
//!
//! A run has two phases, as in TigerBeetle's VOPR: a safety phase with
//! faults, in which the checkers of `checker` run at every step, then a
//! liveness phase in which every fault heals and each group must confirm a
//! new append within a bound.
//!
//! The ledger and queue workloads ([`Workload`]) drive the replicated
//! [`crate::state::StateMachine`] instead of raw appends, and add history
//! checkers run at the end: fencing, LAC monotonicity and linearizability
//! for ledgers (`ledger_check`, `linearizability`), no redelivery after
//! an ack, no loss and no duplicate for queues (`queue_check`).
//!
//! Nothing here touches the real clock, files or sockets.

mod append_check;
mod checker;
mod client;
pub mod device;
mod disk;
mod endpoint_net;
mod faults;
mod glue;
pub(crate) mod host;
pub mod ledger_check;
pub mod linearizability;
mod net;
mod pipe;
pub mod queue_check;
mod scenario;
mod serial;
mod trace;
mod workload;
mod world;

pub use crate::node::replica::tap::GlueBug;
pub use checker::{Violation, INVARIANTS, WORKLOAD_INVARIANTS};
pub use client::{Operation, Outcome};
pub use faults::FaultCounts;
pub use glue::{GlueCounts, GLUE_BUGS};
pub use scenario::{
    kill_leader_bound_ms, run_scenario, Scenario, ScenarioReport, SETTLE_MS, WATCH_MS,
};
pub use workload::{StateOp, StateRequest, StateResult, Workload, WorkloadBug};

use crate::consensus::PlantedBug;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Nodes in the cluster (3 or 5 in practice; 1 to 7 accepted).
    pub nodes: usize,
    /// Raft groups, each with a replica on every node (one disk each).
    pub groups: usize,
    /// Length of the safety phase, with faults, in simulated ms.
    pub fault_phase_ms: u64,
    /// After healing, every group must confirm an append within this.
    pub liveness_bound_ms: u64,
    /// A planted bug, to show that the checkers catch it.
    pub bug: Option<PlantedBug>,
    /// What the clients do.
    pub workload: Workload,
    /// A planted bug in the nodes' use of the state machine (needs its
    /// workload), to show that the history checkers catch it.
    pub workload_bug: Option<WorkloadBug>,
    /// Events to keep for the failure report.
    pub recent_events: usize,
    /// Check the persisted-before-sent rule at every send. Switched off
    /// only to show that the end-to-end checkers catch the same bugs.
    pub check_send_rule: bool,
    /// A planted bug in the production glue, to show that the checkers
    /// catch it.
    pub glue_bug: Option<GlueBug>,
    /// How Raft messages cross the simulated network.
    pub net: Net,
}

/// How Raft messages cross the simulated network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Net {
    /// Handed over as `Message`s, each through the network's rules; kept
    /// because it sweeps about a fifth faster (no fragments, NACKs or
    /// retransmissions to simulate) for long hunts in the consensus core.
    Direct,
    /// Encoded with `transport::raft_codec` and sent through one
    /// `transport::Endpoint` per node (the daemon's transport), heartbeats
    /// too; its datagrams go through the network's rules.
    #[default]
    Endpoint,
}

impl Net {
    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Net::Direct => "direct",
            Net::Endpoint => "endpoint",
        }
    }

    /// By command-line name.
    pub fn by_name(name: &str) -> Option<Net> {
        [Net::Direct, Net::Endpoint]
            .into_iter()
            .find(|n| n.name() == name)
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            nodes: 3,
            groups: 2,
            fault_phase_ms: 6_000,
            liveness_bound_ms: 8_000,
            bug: None,
            workload: Workload::Log,
            workload_bug: None,
            recent_events: 40,
            check_send_rule: true,
            glue_bug: None,
            net: Net::Endpoint,
        }
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Fingerprint of every event processed; equal for equal seeds.
    pub trace_hash: u64,
    /// Simulated time at the end, in ms.
    pub sim_time_ms: u64,
    /// Events processed.
    pub events: u64,
    /// Elections started (real votes, after pre-vote).
    pub elections: u64,
    /// Leaders elected (distinct group and term).
    pub leaders: u64,
    /// Log entries committed, summed over groups.
    pub commits: u64,
    /// Client appends confirmed.
    pub confirmed: u64,
    /// Client appends that definitely failed (another entry took the index).
    pub failed: u64,
    /// Client appends whose outcome stayed unknown (leader lost).
    pub unknown: u64,
    /// Snapshots sent to lagging followers.
    pub snapshots_sent: u64,
    /// Handovers leaders started to their group's preferred leader.
    pub preferred_handovers: u64,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
    /// What the production glue did (recoveries, flushes, snapshots).
    pub glue: GlueCounts,
    /// Messages dropped by partitions and loss.
    pub messages_dropped: u64,
    /// Link, peer and disk-stall transitions the failure detectors saw.
    pub detector_transitions: u64,
    /// Serial frames rejected (noise, cut lines mid-frame).
    pub serial_frame_errors: u64,
    /// Invariant checks performed.
    pub invariant_checks: u64,
    /// Time from healing until every group confirmed again, in ms.
    pub recovery_ms: u64,
    /// `Net::Endpoint`: datagrams that reached a live node's endpoint.
    pub datagrams: u64,
    /// `Net::Endpoint`: of those, datagrams the endpoint dropped whole
    /// (bad MAC, misaddressed, an earlier session's).
    pub datagrams_refused: u64,
    /// `Net::Endpoint`: frames the endpoints retransmitted on request.
    pub retransmits: u64,
    /// `Net::Endpoint`: NACK frames the endpoints sent.
    pub nacks_sent: u64,
    /// `Net::Endpoint`: Raft messages refused by a full window
    /// (`WouldBlock`) and dropped, as the daemon does: Raft resends.
    pub sends_refused: u64,
    /// Log-client tries sent after a call's first, with the same
    /// (client id, seq).
    pub client_retries: u64,
    /// Retried appends the replicas' dedup table caught, each (group,
    /// index) once.
    pub retries_deduplicated: u64,
    /// Confirms checked against where the read path serves them.
    pub confirms_checked: u64,
    /// Confirms whose (client id, seq) no replica had served yet.
    pub confirms_unchecked: u64,
}

/// A failed run: which invariant broke, where, and how to replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The broken invariant (or "panic").
    pub invariant: String,
    /// What exactly was seen.
    pub detail: String,
    /// The last events before the failure, oldest first.
    pub recent_events: Vec<String>,
    /// The run up to the failure.
    pub report: RunReport,
}

/// Runs one simulation and returns its client history too (invocations
/// and outcomes), for checkers that work on histories.
pub fn run_with_history(
    seed: u64,
    opts: &SimOptions,
) -> Result<(RunReport, Vec<Operation>), Box<Failure>> {
    let mut history = Vec::new();
    let report = run_inner(seed, opts, Some(&mut history))?;
    Ok((report, history))
}

/// Runs one simulation. Any panic inside the cores is reported as a
/// failure of the same seed rather than aborting a multi-seed sweep.
pub fn run(seed: u64, opts: &SimOptions) -> Result<RunReport, Box<Failure>> {
    run_inner(seed, opts, None)
}

/// Runs one simulation of a ledger or queue workload and returns its
/// state-machine history whether or not the run failed (empty after a
/// panic), so a test can hold each history checker to it.
pub fn run_with_state_history(
    seed: u64,
    opts: &SimOptions,
) -> (Result<RunReport, Box<Failure>>, Vec<StateOp>) {
    let mut history = Vec::new();
    let result = run_inner_full(seed, opts, None, Some(&mut history));
    (result, history)
}

fn run_inner(
    seed: u64,
    opts: &SimOptions,
    history_out: Option<&mut Vec<Operation>>,
) -> Result<RunReport, Box<Failure>> {
    run_inner_full(seed, opts, history_out, None)
}

fn run_inner_full(
    seed: u64,
    opts: &SimOptions,
    history_out: Option<&mut Vec<Operation>>,
    state_history_out: Option<&mut Vec<StateOp>>,
) -> Result<RunReport, Box<Failure>> {
    assert!((1..=7).contains(&opts.nodes), "1 to 7 nodes");
    assert!(opts.groups >= 1);
    if let Some(bug) = opts.workload_bug {
        assert_eq!(
            bug.workload(),
            opts.workload,
            "bug {} needs the {} workload",
            workload_bug_name(bug),
            bug.workload().name()
        );
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut w = world::World::new(seed, opts);
        // The history checkers judge a run only once it has healed and
        // recovered: the drain and unknown outcomes need a settled cluster.
        let result = w.run().and_then(|()| w.final_checks());
        (
            result,
            w.report(),
            w.recent(),
            std::mem::take(&mut w.history),
            std::mem::take(&mut w.state_history),
        )
    }));
    let outcome = outcome.map(|(result, report, recent, history, state_history)| {
        if let Some(out) = state_history_out {
            *out = state_history;
        }
        (result, report, recent, history)
    });
    match outcome {
        Ok((Ok(()), report, _, history)) => {
            if let Some(out) = history_out {
                *out = history;
            }
            Ok(report)
        }
        Ok((Err(v), report, recent, _)) => Err(Box::new(Failure {
            invariant: v.invariant.to_string(),
            detail: v.detail,
            recent_events: recent,
            report,
        })),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(Box::new(Failure {
                invariant: "panic".into(),
                detail,
                recent_events: Vec::new(),
                report: RunReport {
                    seed,
                    ..RunReport::default()
                },
            }))
        }
    }
}

/// The command that replays one seed exactly.
pub fn replay_command(seed: u64, opts: &SimOptions) -> String {
    let mut cmd = format!(
        "cargo run --release --bin quire-sim -- --seed {seed} --nodes {} --groups {}",
        opts.nodes, opts.groups
    );
    if opts.fault_phase_ms != SimOptions::default().fault_phase_ms {
        cmd += &format!(" --fault-phase-ms {}", opts.fault_phase_ms);
    }
    if let Some(bug) = opts.bug {
        cmd += &format!(" --bug {}", bug_name(bug));
    }
    if opts.workload != Workload::Log {
        cmd += &format!(" --workload {}", opts.workload.name());
    }
    if let Some(bug) = opts.workload_bug {
        cmd += &format!(" --bug {}", workload_bug_name(bug));
    }
    if let Some(bug) = opts.glue_bug {
        cmd += &format!(" --bug {}", glue_bug_name(bug));
    }
    if opts.net != Net::default() {
        cmd += &format!(" --net {}", opts.net.name());
    }
    cmd
}

/// The planted bugs by their command-line names.
pub const BUGS: [(&str, PlantedBug); 4] = [
    ("commit-on-leader-only", PlantedBug::CommitOnLeaderOnly),
    ("forget-vote", PlantedBug::ForgetVote),
    ("ack-before-fsync", PlantedBug::AckBeforeFsync),
    ("vote-while-repairing", PlantedBug::VoteWhileRepairing),
];

/// Command-line name of a planted bug.
pub fn bug_name(bug: PlantedBug) -> &'static str {
    BUGS.iter()
        .find(|(_, b)| *b == bug)
        .map(|(n, _)| *n)
        .expect("every bug is named")
}

/// Planted bug by its command-line name.
pub fn bug_by_name(name: &str) -> Option<PlantedBug> {
    BUGS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// The planted workload bugs by their command-line names (simulator only:
/// they live in how the simulated nodes use the state machine).
pub const WORKLOAD_BUGS: [(&str, WorkloadBug); 10] = [
    ("ledger-no-fence", WorkloadBug::LedgerNoFence),
    ("stale-lac", WorkloadBug::StaleLac),
    (
        "snapshot-without-machine",
        WorkloadBug::SnapshotWithoutMachine,
    ),
    ("ack-not-replicated", WorkloadBug::AckNotReplicated),
    ("produce-no-dedup", WorkloadBug::ProduceNoDedup),
    ("dedup-ignores-producer", WorkloadBug::DedupIgnoresProducer),
    (
        "snapshot-without-entries",
        WorkloadBug::SnapshotWithoutEntries,
    ),
    ("repair-unverified", WorkloadBug::RepairUnverified),
    ("ledger-adds-reordered", WorkloadBug::LedgerAddsReordered),
    ("ack-batch-cut-short", WorkloadBug::AckBatchCutShort),
];

/// Command-line name of a planted glue bug.
pub fn glue_bug_name(bug: GlueBug) -> &'static str {
    GLUE_BUGS
        .iter()
        .find(|(_, b)| *b == bug)
        .map(|(n, _)| *n)
        .expect("every glue bug is named")
}

/// Planted glue bug by its command-line name.
pub fn glue_bug_by_name(name: &str) -> Option<GlueBug> {
    GLUE_BUGS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// Command-line name of a planted workload bug.
pub fn workload_bug_name(bug: WorkloadBug) -> &'static str {
    WORKLOAD_BUGS
        .iter()
        .find(|(_, b)| *b == bug)
        .map(|(n, _)| *n)
        .expect("every workload bug is named")
}

/// Planted workload bug by its command-line name.
pub fn workload_bug_by_name(name: &str) -> Option<WorkloadBug> {
    WORKLOAD_BUGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
}
