//! `quire-sim`: runs the deterministic simulator for one seed or many.
//!
//! Exit status: 0 if every run kept every invariant, 1 if one failed (the
//! report names the seed and the command that replays it), 2 on bad usage.

use clap::Parser;
use quire::sim::{
    self, bug_by_name, glue_bug_by_name, replay_command, workload_bug_by_name, FaultCounts, Net,
    SimOptions, Workload, BUGS, GLUE_BUGS, INVARIANTS, WORKLOAD_BUGS, WORKLOAD_INVARIANTS,
};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "quire-sim",
    version,
    about = "Deterministic simulation of a quire cluster"
)]
struct Args {
    /// Run this one seed (or, with --seeds, the first seed of the sweep).
    #[arg(long)]
    seed: Option<u64>,
    /// Run this many consecutive seeds.
    #[arg(long)]
    seeds: Option<u64>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    nodes: u64,
    /// Raft groups (disks) per node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    groups: u64,
    /// Length of the safety phase with faults, in simulated ms.
    #[arg(long, default_value_t = SimOptions::default().fault_phase_ms)]
    fault_phase_ms: u64,
    /// Plant a bug to see the checkers catch it (fault injection):
    /// commit-on-leader-only, forget-vote, ack-before-fsync, vote-while-repairing;
    /// with --workload ledger: ledger-no-fence, stale-lac, snapshot-without-machine; with --workload
    /// queue: ack-not-replicated, produce-no-dedup, dedup-ignores-producer,
    /// snapshot-without-entries, repair-unverified, ack-batch-cut-short (and with --workload
    /// ledger, ledger-adds-reordered); in the production glue: release-before-durable,
    /// truncate-on-corruption, adopt-unsynced-snapshot, retry-applied-twice,
    /// retry-wrong-index (the last two with --workload log), step-down-answers-ok.
    #[arg(long)]
    bug: Option<String>,
    /// How Raft messages and heartbeats cross the simulated network:
    /// endpoint (encoded, through the production transport endpoint of
    /// each node, as datagrams) or direct (handed over as messages; a
    /// fifth faster).
    #[arg(long, default_value = "endpoint")]
    net: String,
    /// What the clients do: log (raw appends), ledger or queue (through
    /// the replicated state machine, with history checkers).
    #[arg(long, default_value = "log")]
    workload: String,
    /// Print one line per seed.
    #[arg(long)]
    verbose: bool,
    /// Seeds run at once, on threads of their own (default: one per CPU).
    /// Reports stay in seed order, and the first failing seed is the one
    /// reported, as with one thread.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    jobs: Option<u64>,
    /// Run the scripted failover scenarios with serial cables instead
    /// (kill the leader, cut its UDP to a follower, cut a serial cable,
    /// stall its disk) and print how fast the cluster reacted.
    #[arg(long)]
    failover: bool,
}

fn main() -> ExitCode {
    // `quire-sim --seeds 1000 --verbose | head` ends quietly, as `cat` does,
    // instead of panicking on the closed pipe.
    quire::sigpipe::on_closed_pipe(true);
    let args = Args::parse();
    let Some(workload) = Workload::by_name(&args.workload) else {
        eprintln!(
            "quire-sim: unknown workload '{}'; known: log, ledger, queue",
            args.workload
        );
        return ExitCode::from(2);
    };
    let Some(net) = Net::by_name(&args.net) else {
        eprintln!(
            "quire-sim: unknown net '{}'; known: direct, endpoint",
            args.net
        );
        return ExitCode::from(2);
    };
    let (mut bug, mut workload_bug, mut glue_bug) = (None, None, None);
    if let Some(name) = args.bug.as_deref() {
        if let Some(b) = bug_by_name(name) {
            bug = Some(b);
        } else if let Some(b) = glue_bug_by_name(name) {
            glue_bug = Some(b);
        } else if let Some(b) = workload_bug_by_name(name) {
            if b.workload() != workload {
                eprintln!(
                    "quire-sim: bug '{name}' needs --workload {}",
                    b.workload().name()
                );
                return ExitCode::from(2);
            }
            workload_bug = Some(b);
        } else {
            let known: Vec<&str> = BUGS
                .iter()
                .map(|(n, _)| *n)
                .chain(WORKLOAD_BUGS.iter().map(|(n, _)| *n))
                .chain(GLUE_BUGS.iter().map(|(n, _)| *n))
                .collect();
            eprintln!(
                "quire-sim: unknown bug '{name}'; known: {}",
                known.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let opts = SimOptions {
        nodes: args.nodes as usize,
        groups: args.groups as usize,
        fault_phase_ms: args.fault_phase_ms,
        bug,
        workload,
        workload_bug,
        glue_bug,
        net,
        recent_events: std::env::var("QUIRE_SIM_RECENT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40),
        ..SimOptions::default()
    };
    let first = args.seed.unwrap_or(0);
    let count = args.seeds.unwrap_or(1);
    let single = args.seeds.is_none();
    let started = Instant::now();
    if args.failover {
        return failover(first, count, &opts, args.verbose || single);
    }

    let jobs = args.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |j| j as usize,
    );
    let mut totals = Totals::default();
    for (seed, result) in run_seeds(first, count, jobs, &opts) {
        match result {
            Ok(r) => {
                if single || args.verbose {
                    println!(
                        "seed {seed}: ok  trace {:016x}  {} ms simulated, {} events, {} elections, {} commits, {} confirmed, {} faults",
                        r.trace_hash, r.sim_time_ms, r.events, r.elections, r.commits, r.confirmed, r.faults.total()
                    );
                }
                totals.add(&r);
            }
            Err(f) => {
                println!("seed {seed}: FAILED");
                println!("  invariant: {}", f.invariant);
                println!("  detail:    {}", f.detail);
                println!(
                    "  at:        {} ms simulated, trace {:016x}",
                    f.report.sim_time_ms, f.report.trace_hash
                );
                if !f.recent_events.is_empty() {
                    println!("  last events:");
                    for e in &f.recent_events {
                        println!("    {e}");
                    }
                }
                println!("  replay with: {}", replay_command(seed, &opts));
                totals.print(started, &opts);
                return ExitCode::from(1);
            }
        }
    }
    totals.print(started, &opts);
    ExitCode::SUCCESS
}

/// Runs `count` seeds from `first` on `jobs` threads; the results in seed
/// order, ending at the lowest failing seed (seeds above it that were
/// already running are dropped, so the output is what one thread gives).
fn run_seeds(
    first: u64,
    count: u64,
    jobs: usize,
    opts: &SimOptions,
) -> Vec<(u64, Result<sim::RunReport, Box<sim::Failure>>)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let end = first.saturating_add(count);
    let next = AtomicU64::new(first);
    let lowest_failure = AtomicU64::new(u64::MAX);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end || seed > lowest_failure.load(Ordering::Relaxed) {
                    return;
                }
                let r = sim::run(seed, opts);
                if r.is_err() {
                    lowest_failure.fetch_min(seed, Ordering::Relaxed);
                }
                results.lock().expect("results").push((seed, r));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|(seed, _)| *seed);
    let cut = lowest_failure.into_inner();
    results.retain(|(seed, _)| *seed <= cut);
    results
}

#[derive(Default)]
struct Totals {
    runs: u64,
    sim_ms: u64,
    events: u64,
    elections: u64,
    leaders: u64,
    commits: u64,
    confirmed: u64,
    failed: u64,
    unknown: u64,
    snapshots: u64,
    preferred_handovers: u64,
    dropped: u64,
    detector_transitions: u64,
    serial_frame_errors: u64,
    datagrams: u64,
    datagrams_refused: u64,
    retransmits: u64,
    nacks_sent: u64,
    sends_refused: u64,
    client_retries: u64,
    retries_deduplicated: u64,
    confirms_checked: u64,
    confirms_unchecked: u64,
    checks: u64,
    recovery_ms: Vec<u64>,
    faults: FaultCounts,
    glue: sim::GlueCounts,
}

impl Totals {
    fn add(&mut self, r: &sim::RunReport) {
        self.runs += 1;
        self.sim_ms += r.sim_time_ms;
        self.events += r.events;
        self.elections += r.elections;
        self.leaders += r.leaders;
        self.commits += r.commits;
        self.confirmed += r.confirmed;
        self.failed += r.failed;
        self.unknown += r.unknown;
        self.snapshots += r.snapshots_sent;
        self.preferred_handovers += r.preferred_handovers;
        self.dropped += r.messages_dropped;
        self.detector_transitions += r.detector_transitions;
        self.serial_frame_errors += r.serial_frame_errors;
        self.datagrams += r.datagrams;
        self.datagrams_refused += r.datagrams_refused;
        self.retransmits += r.retransmits;
        self.nacks_sent += r.nacks_sent;
        self.sends_refused += r.sends_refused;
        self.client_retries += r.client_retries;
        self.retries_deduplicated += r.retries_deduplicated;
        self.confirms_checked += r.confirms_checked;
        self.confirms_unchecked += r.confirms_unchecked;
        self.checks += r.invariant_checks;
        self.recovery_ms.push(r.recovery_ms);
        self.faults.add(&r.faults);
        self.glue.add(&r.glue);
    }

    fn print(&mut self, started: Instant, opts: &SimOptions) {
        self.recovery_ms.sort_unstable();
        let pct = |p: f64| -> u64 {
            if self.recovery_ms.is_empty() {
                return 0;
            }
            let i = ((self.recovery_ms.len() - 1) as f64 * p).round() as usize;
            self.recovery_ms[i]
        };
        let f = &self.faults;
        println!(
            "runs:        {} passed ({} nodes x {} groups, {} workload{}{}{}{})",
            self.runs,
            opts.nodes,
            opts.groups,
            opts.workload.name(),
            if opts.net == Net::Endpoint {
                ", through the transport endpoint"
            } else {
                ", messages handed over directly"
            },
            opts.glue_bug.map_or(String::new(), |b| format!(
                ", planted bug {}",
                sim::glue_bug_name(b)
            )),
            opts.bug.map_or(String::new(), |b| format!(
                ", planted bug {}",
                sim::bug_name(b)
            )),
            opts.workload_bug.map_or(String::new(), |b| format!(
                ", planted bug {}",
                sim::workload_bug_name(b)
            ))
        );
        println!(
            "simulated:   {:.1} s in {:.1} s of real time, {} events",
            self.sim_ms as f64 / 1000.0,
            started.elapsed().as_secs_f64(),
            self.events
        );
        println!(
            "elections:   {} started, {} leaders elected, {} handovers to preferred leaders, {} snapshots sent",
            self.elections, self.leaders, self.preferred_handovers, self.snapshots
        );
        println!(
            "commits:     {} entries committed, {} appends confirmed, {} failed, {} unknown (leader lost)",
            self.commits, self.confirmed, self.failed, self.unknown
        );
        println!(
            "faults:      {} total: {} crashes ({} crash loops, {} cluster power losses), {} restarts, {} isolations, {} one-way cuts, {} clogged paths, {} heals, {} loss changes, {} duplication changes, {} EIO, {} corruptions, {} misdirected writes, {} batches damaged and {} segments lost below the snapshot, {} wrong repair copies, {} leader transfers, {} serial cables cut, {} made noisy, {} disk stalls, {} disks full; {} messages dropped",
            f.total(), f.crashes, f.crash_loops, f.power_losses, f.restarts, f.isolations, f.one_way_cuts, f.clogs, f.heals, f.loss_changes, f.duplication_changes, f.eio, f.corruptions, f.misdirected_writes, f.damaged_below_snapshot, f.lost_segments, f.wrong_repair_copies, f.transfers, f.serial_cuts, f.serial_noise, f.disk_stalls, f.disks_full, self.dropped
        );
        if opts.workload == Workload::Log {
            println!(
                "retries:     {} client retries (same client id and seq), {} caught by dedup; {} confirms checked at their index, {} not (not served yet)",
                self.client_retries, self.retries_deduplicated, self.confirms_checked, self.confirms_unchecked
            );
        }
        println!(
            "detectors:   {} link, peer and disk-stall transitions; {} serial frames rejected",
            self.detector_transitions, self.serial_frame_errors
        );
        let c = self.glue;
        println!(
            "glue:        {} log recoveries ({} torn tails discarded, {} damaged batches found for repair), {} group commits, {} appends refused for a full disk, {} snapshots installed ({} image chunks staged, {} staged images resumed after a crash), {} adopted, {} cold reads, {} entries repaired from peers ({} wrong copies refused), {} batches scrubbed ({} found damaged), {} step-downs answered {} waiting requests",
            c.recoveries, c.torn_tails, c.corruptions_found, c.flushes, c.disk_full_refusals, c.snapshots_installed, c.image_chunks_staged, c.images_resumed, c.snapshots_adopted, c.cold_reads, c.entries_repaired, c.repair_copies_rejected, c.scrub_batches_verified, c.scrub_damaged_batches, c.step_downs_with_waiters, c.step_down_answers
        );
        if opts.net == Net::Endpoint {
            println!(
                "transport:   {} datagrams received, {} refused (an earlier session's), {} NACKs sent, {} frames retransmitted, {} messages refused by a full window",
                self.datagrams, self.datagrams_refused, self.nacks_sent, self.retransmits, self.sends_refused
            );
        }
        println!(
            "recovery:    after healing, every group confirmed again within p50 {} ms, max {} ms",
            pct(0.5),
            pct(1.0)
        );
        println!(
            "invariants:  {} checks of {}",
            self.checks,
            INVARIANTS.join(", ")
        );
        if opts.workload != Workload::Log {
            println!("history:     {}", WORKLOAD_INVARIANTS.join(", "));
        }
    }
}

/// Runs every failover scenario on `count` seeds from `first` and prints
/// the reaction times (simulated ms after the fault) as p50 / p99 / max.
fn failover(first: u64, count: u64, opts: &SimOptions, verbose: bool) -> ExitCode {
    use sim::{kill_leader_bound_ms, run_scenario, Scenario};
    let started = Instant::now();
    for scenario in Scenario::ALL {
        let mut times = Vec::new();
        let mut second = Vec::new();
        for seed in first..first.saturating_add(count) {
            let bound = kill_leader_bound_ms(seed, opts);
            let verdict = run_scenario(scenario, seed, opts)
                .map_err(|f| format!("{}: {}", f.invariant, f.detail))
                .and_then(|r| match r.verdict(bound) {
                    Ok(()) => Ok(r),
                    Err(why) => Err(format!(
                        "{why}\n  after the fault:\n    {}",
                        r.timeline.join("\n    ")
                    )),
                });
            let r = match verdict {
                Ok(r) => r,
                Err(why) => {
                    println!("{} seed {seed}: FAILED: {why}", scenario.name());
                    println!(
                        "  replay with: cargo run --release --bin quire-sim -- --failover --seed {seed} --nodes {} --groups {}{}",
                        opts.nodes,
                        opts.groups,
                        if opts.net == Net::default() { String::new() } else { format!(" --net {}", opts.net.name()) }
                    );
                    return ExitCode::from(1);
                }
            };
            let (main, other) = match scenario {
                Scenario::KillLeader => (r.new_leader.map(|l| l.1), r.down_after_ms),
                Scenario::CutLeaderUdp => (r.ip_partitioned_after_ms, None),
                Scenario::CutSerial => (r.serial_down_after_ms, None),
                Scenario::StallLeaderDisk => (r.new_leader.map(|l| l.1), r.stepped_down_after_ms),
            };
            if verbose {
                println!(
                    "{} seed {seed}: leader n{}, new leader {:?}, ip-partitioned {:?}, serial-down {:?}, down {:?}, stepped down {:?} (ms after the fault)",
                    scenario.name(), r.leader, r.new_leader, r.ip_partitioned_after_ms,
                    r.serial_down_after_ms, r.down_after_ms, r.stepped_down_after_ms
                );
            }
            times.extend(main);
            second.extend(other);
        }
        let what = match scenario {
            Scenario::KillLeader => "new leader elected (first node declared the leader down)",
            Scenario::CutLeaderUdp => {
                "follower classified the leader ip-partitioned; no leader change"
            }
            Scenario::CutSerial => "serial-down alarm; no leader change",
            Scenario::StallLeaderDisk => "new leader elected (old leader stepped down)",
        };
        println!(
            "{:<18} {count} seeds ok: {what}: {}{}",
            scenario.name(),
            spread(&mut times),
            if second.is_empty() {
                String::new()
            } else {
                format!(" ({})", spread(&mut second))
            }
        );
    }
    println!(
        "failover scenarios: {} nodes x {} groups, {:.1} s of real time",
        opts.nodes,
        opts.groups,
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// "p50 X ms, p99 Y ms, max Z ms" of simulated times.
fn spread(v: &mut [u64]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_unstable();
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!(
        "p50 {} ms, p99 {} ms, max {} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}
