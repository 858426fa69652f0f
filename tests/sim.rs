//! The simulator as a test: seeds per topology must keep every invariant,
//! a seed must replay bit for bit, and every planted bug must be caught.
//!
//! The number of seeds per topology defaults to 200 and can be raised with
//! QUIRE_SIM_SEEDS for a longer soak.

use quire::api::ErrorCode;
use quire::sim::{
    self, kill_leader_bound_ms, run_scenario, Net, Scenario, SimOptions, StateOp, StateRequest,
    StateResult, Workload, WorkloadBug, BUGS, GLUE_BUGS,
};
use quire::state::{Command, Outcome};

fn seeds() -> u64 {
    std::env::var("QUIRE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// A sweep of the default options (the production glue, storage on
/// simulated devices, the transport endpoint) on `nodes` nodes.
fn sweep(nodes: usize) {
    sweep_with(SimOptions {
        nodes,
        ..SimOptions::default()
    });
}

fn sweep_with(opts: SimOptions) {
    let mut confirmed = 0;
    let mut faults = 0;
    let mut serial_faults = 0;
    let mut transitions = 0;
    let (mut datagrams, mut refused, mut nacks, mut rexmits) = (0, 0, 0, 0);
    let mut glue = sim::GlueCounts::default();
    for seed in 0..seeds() {
        match sim::run(seed, &opts) {
            Ok(r) => {
                glue.add(&r.glue);
                datagrams += r.datagrams;
                refused += r.datagrams_refused;
                nacks += r.nacks_sent;
                rexmits += r.retransmits;
                confirmed += r.confirmed;
                faults += r.faults.total();
                serial_faults +=
                    r.faults.serial_cuts + r.faults.serial_noise + r.faults.disk_stalls;
                transitions += r.detector_transitions;
            }
            Err(f) => panic!(
                "seed {seed} broke {}: {}\nlast events:\n  {}\nreplay with: {}",
                f.invariant,
                f.detail,
                f.recent_events.join("\n  "),
                sim::replay_command(seed, &opts)
            ),
        }
    }
    // A sweep that confirms nothing or injects nothing tests nothing.
    assert!(
        confirmed > seeds() * 50,
        "only {confirmed} appends confirmed"
    );
    assert!(faults > seeds() * 5, "only {faults} faults injected");
    assert!(
        serial_faults > seeds() / 2,
        "only {serial_faults} cable and disk-stall faults"
    );
    assert!(
        transitions > seeds() * 10,
        "the failure detectors saw only {transitions} transitions"
    );
    // Every path of the production glue the faults aim at was taken:
    // recovery after crashes (torn tails, mid-log damage for repair),
    // group commits, a full disk refusing appends, snapshots installed
    // from a leader and adopted from the replica's own.
    let seeds = seeds();
    let floors = [
        ("log recoveries", glue.recoveries, seeds * 20),
        ("torn tails discarded", glue.torn_tails, seeds / 100),
        ("damaged batches found", glue.corruptions_found, seeds * 3),
        ("group commits", glue.flushes, seeds * 300),
        (
            "appends refused for a full disk",
            glue.disk_full_refusals,
            seeds / 20,
        ),
        ("snapshots installed", glue.snapshots_installed, seeds / 10),
        ("snapshots adopted", glue.snapshots_adopted, seeds * 3),
        ("batches scrubbed", glue.scrub_batches_verified, seeds * 20),
        (
            "step-downs that answered waiting requests",
            glue.step_downs_with_waiters,
            seeds / 10,
        ),
    ];
    for (what, seen, floor) in floors {
        assert!(
            seen >= floor,
            "only {seen} {what} in {seeds} seeds (floor {floor})"
        );
    }
    assert_eq!(
        glue.scrub_damaged_batches, 0,
        "the scrub found damage no fault left after recovery"
    );
    // The transport under the seed (the default net) must have worked:
    // seeds lose datagrams (NACKs, retransmissions) and restart nodes
    // (datagrams of an earlier session refused).
    if opts.net == Net::Endpoint {
        assert!(datagrams > seeds * 1_000, "only {datagrams} datagrams");
        assert!(nacks > seeds * 20, "only {nacks} NACKs");
        assert!(rexmits > seeds * 20, "only {rexmits} retransmissions");
        assert!(refused > seeds, "only {refused} datagrams refused");
    }
}

/// The serial heartbeat issue's four scenarios, scripted on the simulated
/// cluster with serial cables, on 3 and 5 nodes: a dead leader is replaced
/// within the deadtime plus one election round; a UDP cut between the
/// leader and a follower, or a cut serial cable, is classified within the
/// deadtime and moves no leadership; a stalled leader disk moves it.
#[test]
fn failover_scenarios_with_serial_cables() {
    let runs = (seeds() / 10).max(5);
    for nodes in [3, 5] {
        let opts = SimOptions {
            nodes,
            ..SimOptions::default()
        };
        for scenario in Scenario::ALL {
            for seed in 0..runs {
                let r = run_scenario(scenario, seed, &opts).unwrap_or_else(|f| {
                    panic!(
                        "{} seed {seed} broke {}: {}",
                        scenario.name(),
                        f.invariant,
                        f.detail
                    )
                });
                if let Err(why) = r.verdict(kill_leader_bound_ms(seed, &opts)) {
                    panic!(
                        "{} seed {seed} on {nodes} nodes: {why}\nafter the fault:\n  {}\nreplay with: cargo run --release --bin quire-sim -- --failover --seed {seed} --nodes {nodes}",
                        scenario.name(),
                        r.timeline.join("\n  ")
                    );
                }
            }
        }
    }
}

#[test]
fn three_nodes_keep_every_invariant() {
    sweep(3);
}

#[test]
fn five_nodes_keep_every_invariant() {
    sweep(5);
}

/// The old direct mode (Raft messages handed over, no endpoint) is kept
/// for long hunts: it keeps every invariant too, on a quarter of the seeds.
#[test]
fn direct_net_keeps_every_invariant() {
    let seeds = (seeds() / 4).max(5);
    let opts = SimOptions {
        net: Net::Direct,
        ..SimOptions::default()
    };
    for seed in 0..seeds {
        let r = sim::run(seed, &opts).unwrap_or_else(|f| {
            panic!(
                "seed {seed} broke {}: {}\nreplay with: {}",
                f.invariant,
                f.detail,
                sim::replay_command(seed, &opts)
            )
        });
        assert_eq!(r.datagrams, 0, "seed {seed}: Net::Direct has no endpoint");
    }
}

#[test]
fn same_seed_same_trace_over_the_endpoint() {
    {
        let opts = SimOptions {
            net: Net::Endpoint,
            ..SimOptions::default()
        };
        let a = sim::run(42, &opts).expect("seed 42 passes");
        let b = sim::run(42, &opts).expect("seed 42 passes");
        assert_eq!(a.trace_hash, b.trace_hash);
        assert_eq!(a.events, b.events);
        assert_eq!(a.datagrams, b.datagrams);
        assert!(a.datagrams > 0, "the endpoint carried nothing");
        let direct = sim::run(
            42,
            &SimOptions {
                net: Net::Direct,
                ..opts
            },
        )
        .expect("seed 42 passes");
        assert_ne!(a.trace_hash, direct.trace_hash, "the nets run differently");
        assert_eq!(direct.datagrams, 0, "Net::Direct has no endpoint");
        assert_eq!(opts.net, Net::default(), "the endpoint is the default");
        assert!(!sim::replay_command(42, &opts).contains("--net"));
        let direct_opts = SimOptions {
            net: Net::Direct,
            ..opts
        };
        assert!(sim::replay_command(42, &direct_opts).ends_with(" --net direct"));
    }
}

/// Each planted glue bug is caught within 200 seeds on both topologies,
/// by the invariant named here.
#[test]
fn planted_bugs_in_the_production_glue_are_caught() {
    let expected = [
        ("release-before-durable", "persisted-before-sent"),
        ("truncate-on-corruption", "acknowledged-survives-recovery"),
        ("adopt-unsynced-snapshot", "log-reopens"),
        ("retry-applied-twice", "append-applied-once"),
        ("retry-wrong-index", "confirmed-append-at-its-index"),
        // Caught at the confirm: before any node applied the index, or
        // once another record is applied there.
        (
            "step-down-answers-ok",
            "state-machine-safety|confirmed-append-at-its-index",
        ),
    ];
    assert_eq!(expected.len(), GLUE_BUGS.len(), "every glue bug is tested");
    let caught = |opts: &SimOptions| {
        (0..200)
            .find_map(|seed| sim::run(seed, opts).err().map(|f| (seed, f)))
            .map(|(seed, f)| (seed, f.invariant, f.detail))
    };
    for (name, invariant) in expected {
        for nodes in [3, 5] {
            let opts = SimOptions {
                nodes,
                glue_bug: sim::glue_bug_by_name(name),
                ..SimOptions::default()
            };
            let (seed, got, detail) = caught(&opts)
                .unwrap_or_else(|| panic!("{name} survived 200 seeds on {nodes} nodes"));
            assert!(
                invariant.split('|').any(|i| i == got),
                "{name} on {nodes} nodes, seed {seed}: caught by {got}, not {invariant}: {detail}"
            );
        }
    }
}

/// The log clients retry a call with the same (client id, seq) across
/// failovers, so the replicas' dedup table is reached, and the answers it
/// routes are checked at their index: floors over a sweep, not timings.
#[test]
fn log_client_retries_reach_the_dedup_table() {
    let opts = SimOptions::default();
    let (mut retries, mut deduplicated, mut checked, mut unchecked) = (0, 0, 0, 0);
    for seed in 0..50 {
        let r = sim::run(seed, &opts).unwrap_or_else(|f| panic!("seed {seed}: {f:?}"));
        retries += r.client_retries;
        deduplicated += r.retries_deduplicated;
        checked += r.confirms_checked;
        unchecked += r.confirms_unchecked;
        assert_eq!(
            r.confirms_checked + r.confirms_unchecked,
            r.confirmed,
            "seed {seed}: every confirm meets the index check"
        );
    }
    assert!(retries > 0, "no client retried");
    assert!(deduplicated > 0, "no retry reached the dedup table");
    // Compaction may take an index before its answer is read back, but
    // rarely: the check must see nearly every confirm.
    assert!(
        unchecked * 100 <= checked,
        "{unchecked} confirms unchecked, {checked} checked"
    );
}

#[test]
fn same_seed_same_trace() {
    let opts = SimOptions::default();
    let a = sim::run(42, &opts).expect("seed 42 passes");
    let b = sim::run(42, &opts).expect("seed 42 passes");
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.events, b.events);
    let c = sim::run(43, &opts).expect("seed 43 passes");
    assert_ne!(a.trace_hash, c.trace_hash, "different seeds should differ");
}

/// Each planted bug must make a sweep fail within 200 seeds, on both
/// topologies; the invariant that caught it is printed for the record.
#[test]
fn every_planted_bug_is_caught() {
    for (name, bug) in BUGS {
        for nodes in [3, 5] {
            let opts = SimOptions {
                nodes,
                bug: Some(bug),
                ..SimOptions::default()
            };
            let caught = (0..200).find_map(|seed| sim::run(seed, &opts).err().map(|f| (seed, f)));
            let (seed, f) = caught.unwrap_or_else(|| {
                panic!("planted bug {name} survived 200 seeds on {nodes} nodes")
            });
            assert_ne!(
                f.invariant, "panic",
                "bug {name} should break an invariant, not panic: {}",
                f.detail
            );
            println!(
                "{name} on {nodes} nodes: caught at seed {seed} by {}: {}",
                f.invariant, f.detail
            );
        }
    }
}

/// The end-to-end checkers catch the bugs too, not only the
/// persisted-before-sent rule: with that rule switched off, each bug is
/// still caught by the invariant it really breaks. (forget-vote needs a
/// rare double vote to show end to end: about 1% of seeds, see
/// docs/testing/simulator.md.)
#[test]
fn end_to_end_checkers_catch_the_bugs_without_the_send_rule() {
    let expected = [
        ("commit-on-leader-only", "confirmed-durable-on-majority"),
        ("ack-before-fsync", "confirmed-durable-on-majority"),
        ("vote-while-repairing", "leader-completeness"),
    ];
    for (name, invariant) in expected {
        let bug = sim::bug_by_name(name).expect("known bug");
        let opts = SimOptions {
            bug: Some(bug),
            check_send_rule: false,
            ..SimOptions::default()
        };
        let caught = (0..200).find_map(|seed| sim::run(seed, &opts).err());
        let f = caught.unwrap_or_else(|| panic!("{name} survived 200 seeds without the send rule"));
        assert_eq!(f.invariant, invariant, "{name}: {}", f.detail);
    }
}

/// The recorded history is consistent with the report: every confirmed
/// operation names a distinct index per group, and outcomes add up.
#[test]
fn history_records_every_outcome() {
    let opts = SimOptions::default();
    let (report, history) = sim::run_with_history(7, &opts).expect("seed 7 passes");
    let count =
        |f: fn(&sim::Outcome) -> bool| history.iter().filter(|o| f(&o.outcome)).count() as u64;
    assert_eq!(
        count(|o| matches!(o, sim::Outcome::Ok(_))),
        report.confirmed
    );
    assert_eq!(count(|o| *o == sim::Outcome::Failed), report.failed);
    assert_eq!(count(|o| *o == sim::Outcome::Unknown), report.unknown);
    assert!(report.confirmed > 0);
    let mut seen = std::collections::HashSet::new();
    for op in &history {
        assert!(op.completed_ms >= op.invoked_ms);
        if let sim::Outcome::Ok(index) = op.outcome {
            assert!(
                seen.insert((op.group, index)),
                "two confirmed appends at group {} index {index}",
                op.group
            );
        }
    }
}

/// Seeds per state-machine workload in the test sweep (a few dozen: the
/// whole suite runs on 2 cores; `quire-sim --seeds 1000` is the soak).
fn workload_seeds() -> u64 {
    (seeds() / 8).max(12)
}

fn state_opts(workload: Workload, bug: Option<WorkloadBug>) -> SimOptions {
    SimOptions {
        workload,
        workload_bug: bug,
        ..SimOptions::default()
    }
}

/// Counts of what a state history exercised, by a label per kind.
fn census(history: &[StateOp]) -> std::collections::BTreeMap<&'static str, u64> {
    let mut c = std::collections::BTreeMap::new();
    for op in history {
        let label = match (&op.request, &op.result) {
            (_, StateResult::Unknown) => "unknown",
            (StateRequest::Command(Command::AddEntry { .. }), StateResult::Applied(Ok(_))) => "add",
            (
                StateRequest::Command(Command::AddEntry { .. }),
                StateResult::Applied(Err(ErrorCode::Fenced)),
            ) => "add-fenced",
            (StateRequest::Command(Command::OpenRecover { .. }), StateResult::Applied(Ok(_))) => {
                "recover"
            }
            (StateRequest::Command(Command::CloseLedger { .. }), StateResult::Applied(Ok(_))) => {
                "close"
            }
            (StateRequest::Command(Command::SetLac { .. }), StateResult::Applied(Ok(_))) => {
                "set-lac"
            }
            (StateRequest::ReadLac { .. }, StateResult::Lac(Ok(Some(_)))) => "read-lac",
            (StateRequest::ReadEntries { .. }, StateResult::Entries(Ok(e))) if !e.is_empty() => {
                "read-entries"
            }
            (
                StateRequest::Command(Command::Produce { .. }),
                StateResult::Applied(Ok(Outcome::Produced { retry: true, .. })),
            ) => "produce-retry-deduplicated",
            (StateRequest::Command(Command::Produce { .. }), StateResult::Applied(Ok(_))) => {
                "produce"
            }
            (
                StateRequest::Command(Command::Consume { .. }),
                StateResult::Applied(Ok(Outcome::Consumed(d))),
            ) if d.iter().any(|m| m.deliveries > 1) => "consume-redelivery",
            (StateRequest::Command(Command::Ack { .. }), StateResult::Applied(Ok(_))) => "ack",
            _ => "other",
        };
        *c.entry(label).or_insert(0) += 1;
    }
    c
}

fn state_sweep(workload: Workload, must_see: &[&str]) {
    let opts = state_opts(workload, None);
    let mut total = std::collections::BTreeMap::new();
    let mut snapshots = 0;
    let mut faults = sim::FaultCounts::default();
    let mut glue = sim::GlueCounts::default();
    for seed in 0..workload_seeds() {
        let (result, history) = sim::run_with_state_history(seed, &opts);
        match result {
            Ok(r) => {
                snapshots += r.snapshots_sent;
                faults.add(&r.faults);
                glue.add(&r.glue);
            }
            Err(f) => panic!(
                "seed {seed} broke {}: {}\nreplay with: {}",
                f.invariant,
                f.detail,
                sim::replay_command(seed, &opts)
            ),
        }
        for (k, v) in census(&history) {
            *total.entry(k).or_insert(0u64) += v;
        }
    }
    println!(
        "{} workload: {total:?}, {snapshots} snapshots sent",
        workload.name()
    );
    // Followers restored from a leader's snapshot must resume its machine.
    assert!(
        snapshots >= workload_seeds() / 2,
        "only {snapshots} snapshots sent"
    );
    // Damage below the snapshot, lost segments and wrong copies from
    // peers happened, and the replicas repaired what they referred to,
    // refusing the wrong copies.
    let below = [
        (
            "batches damaged below the snapshot",
            faults.damaged_below_snapshot,
        ),
        ("entries repaired", glue.entries_repaired),
        ("segments lost below the snapshot", faults.lost_segments),
        ("wrong repair copies", faults.wrong_repair_copies),
        ("wrong repair copies refused", glue.repair_copies_rejected),
    ];
    // The ledger workload keeps fewer entries below the snapshot, so its
    // first seeds repair little (4 entries in the first 25 today, 315 in
    // 100): it is held to damage and repair happening at all; the queue
    // workload to every path.
    let floor = match workload {
        Workload::Queue => workload_seeds() / 12,
        _ => 1,
    };
    let below = match workload {
        Workload::Queue => &below[..],
        _ => &below[..2],
    };
    for &(what, seen) in below {
        assert!(
            seen >= floor,
            "{} workload: only {seen} {what} in {} seeds",
            workload.name(),
            workload_seeds()
        );
    }
    // A sweep that never fences, retries or redelivers tests none of it.
    for kind in must_see {
        assert!(
            total.get(kind).copied().unwrap_or(0) >= workload_seeds(),
            "{} workload: too few {kind} over {} seeds: {total:?}",
            workload.name(),
            workload_seeds()
        );
    }
}

/// The ledger workload keeps every invariant and every history checker,
/// and exercises what they judge: recoveries that fence a live writer,
/// reads of entries and LACs, outcomes lost to faults.
#[test]
fn ledger_workload_keeps_every_invariant() {
    state_sweep(
        Workload::Ledger,
        &[
            "add",
            "add-fenced",
            "recover",
            "close",
            "set-lac",
            "read-lac",
            "read-entries",
            "unknown",
        ],
    );
}

/// The queue workload likewise: produces retried through the idempotent
/// path, messages that time out and come back, acks through the log.
#[test]
fn queue_workload_keeps_every_invariant() {
    state_sweep(
        Workload::Queue,
        &[
            "produce",
            "produce-retry-deduplicated",
            "consume-redelivery",
            "ack",
            "unknown",
        ],
    );
}

/// Seeds that long sweeps found breaking an invariant replay clean. Each
/// was a real bug; the unit test named beside it pins the mechanism, the
/// seed the whole run that exposed it.
#[test]
fn seeds_that_found_bugs_replay_clean() {
    let found = [
        // A repair owed after damage was not durable: an install dropped
        // the damaged segments, the next recovery saw a clean short log
        // and the node voted (leader-completeness). Unit test:
        // a_repair_owed_outlives_an_install_that_drops_the_damage.
        (Workload::Queue, 3, 602),
        // Not a product bug: the checker held a leader of term 1, elected
        // by a vote that came late, to entries term 2 had committed
        // (leader-completeness covers only later terms). The fix is in
        // `Checker::leader_complete`.
        (Workload::Ledger, 3, 449),
    ];
    for (workload, nodes, seed) in found {
        let opts = SimOptions {
            nodes,
            ..state_opts(workload, None)
        };
        if let Err(f) = sim::run(seed, &opts) {
            panic!(
                "seed {seed} broke {}: {}\nreplay with: {}",
                f.invariant,
                f.detail,
                sim::replay_command(seed, &opts)
            );
        }
    }
}

/// Each planted workload bug is caught, within `PLANTED_SEEDS_MAX`
/// seeds, by the checker it was planted for (the first invariant the run
/// breaks). Most are caught at seed 0; `repair-unverified` needs a run
/// whose faults put a wrong copy into a repair answer the receiver
/// checks, about one run in twenty (at the daemon's transport defaults
/// of 2026-12-07 the first such seeds are 24, 25, 27, then 72): 20
/// seeds found it only while the schedule happened to put one early.
#[test]
fn every_planted_workload_bug_is_caught_by_its_checker() {
    const PLANTED_SEEDS_MAX: u64 = 60;
    let expected = [
        ("ledger-no-fence", "fenced-writer-not-confirmed"),
        ("stale-lac", "ledger-linearizable"),
        ("snapshot-without-machine", "state-machines-equal"),
        ("ack-not-replicated", "acked-not-redelivered"),
        ("produce-no-dedup", "produce-not-duplicated"),
        ("dedup-ignores-producer", "confirmed-produce-delivered"),
        ("snapshot-without-entries", "stored-bytes-readable"),
        // A wrong copy taken in repair: its bytes differ from the other
        // replicas' (or, served to a reader, do not even parse).
        (
            "repair-unverified",
            "stored-bytes-agree|stored-bytes-readable",
        ),
        // A writer's burst of adds gathered in one command batch entry
        // and applied last first: the ids go against the order sent.
        ("ledger-adds-reordered", "ledger-adds-in-order"),
        // A consumer's acks in two parts, in one command batch entry: the
        // second is answered but not applied.
        ("ack-batch-cut-short", "acked-not-redelivered"),
    ];
    assert_eq!(expected.len(), sim::WORKLOAD_BUGS.len(), "every bug listed");
    for (name, invariants) in expected {
        let bug = sim::workload_bug_by_name(name).expect("known bug");
        let opts = state_opts(bug.workload(), Some(bug));
        let caught =
            (0..PLANTED_SEEDS_MAX).find_map(|seed| sim::run(seed, &opts).err().map(|f| (seed, f)));
        let (seed, f) = caught
            .unwrap_or_else(|| panic!("planted bug {name} survived {PLANTED_SEEDS_MAX} seeds"));
        assert!(
            invariants.split('|').any(|i| i == f.invariant),
            "{name} at seed {seed} broke {}, not {invariants}: {}",
            f.invariant,
            f.detail
        );
        println!(
            "{name}: caught at seed {seed} by {}: {}",
            f.invariant, f.detail
        );
    }
}

/// Stale reads also show as a LAC going back, to the LAC checker alone.
#[test]
fn lac_checker_catches_stale_reads() {
    let opts = state_opts(Workload::Ledger, Some(WorkloadBug::StaleLac));
    let caught = (0..20).find_map(|seed| {
        let (_, history) = sim::run_with_state_history(seed, &opts);
        sim::ledger_check::check_lac_monotonic(&history)
            .err()
            .map(|v| (seed, v))
    });
    let (seed, v) = caught.expect("stale reads show a LAC going back within 20 seeds");
    assert_eq!(v.invariant, "lac-monotonic");
    println!("stale-lac: LAC checker caught seed {seed}: {}", v.detail);
}

/// One op of a hand-written ledger history (ledger 7 of group 0).
fn op(client: usize, request: StateRequest, at: (u64, u64), result: StateResult) -> StateOp {
    StateOp {
        client,
        group: 0,
        request,
        invoked_ms: at.0,
        completed_ms: at.1,
        result,
    }
}

/// A writer adds entries 0 and 1 of ledger 7; two readers read the LAC.
/// The first read overlaps the second add and still sees no LAC, the
/// second sees entry 0 confirmed: linearizable (read, add 1, read). A
/// third read after add 1 completed that sees no LAC is not.
fn hand_written_history(late_stale_read: bool) -> Vec<StateOp> {
    let add = |data: &[u8]| {
        StateRequest::Command(Command::AddEntry {
            ledger: 7,
            writer_token: 1,
            data: data.to_vec(),
        })
    };
    let lac = StateRequest::ReadLac { ledger: 7 };
    let mut h = vec![
        op(
            0,
            StateRequest::Command(Command::CreateLedger {
                writer_token: 1,
                now_ms: 0,
            }),
            (0, 10),
            StateResult::Applied(Ok(Outcome::LedgerCreated(7))),
        ),
        op(
            0,
            add(b"e0"),
            (20, 30),
            StateResult::Applied(Ok(Outcome::EntryAdded(0))),
        ),
        op(
            0,
            add(b"e1"),
            (31, 50),
            StateResult::Applied(Ok(Outcome::EntryAdded(1))),
        ),
        op(1, lac.clone(), (35, 60), StateResult::Lac(Ok(None))),
        op(2, lac.clone(), (40, 45), StateResult::Lac(Ok(Some(0)))),
        // An add whose outcome was lost: it may or may not have happened.
        op(0, add(b"e2"), (51, 90), StateResult::Unknown),
    ];
    if late_stale_read {
        h.push(op(2, lac, (61, 62), StateResult::Lac(Ok(None))));
    }
    h
}

#[test]
fn linearizability_checker_accepts_overlap_and_rejects_a_stale_read() {
    use sim::ledger_check::{check_lac_monotonic, check_linearizable};
    let good = hand_written_history(false);
    check_linearizable(&good).expect("read, add, read is a linearization");
    check_lac_monotonic(&good).expect("no LAC goes back across real time");
    let bad = hand_written_history(true);
    let v = check_linearizable(&bad).expect_err("a read after add 1 completed must see entry 0");
    assert_eq!(v.invariant, "ledger-linearizable");
    let v = check_lac_monotonic(&bad).expect_err("the LAC went back from 0 to none");
    assert_eq!(v.invariant, "lac-monotonic");
}
