//! `quire-sim`: runs the deterministic simulator for one seed or many.
//!
//! Exit status: 0 if every run kept every invariant, 1 if one failed (the
//! report names the seed and the command that replays it), 2 on bad usage.

use clap::Parser;
use quire::sim::{self, bug_by_name, replay_command, FaultCounts, SimOptions, BUGS, INVARIANTS};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "quire-sim",
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
    /// commit-on-leader-only, forget-vote, ack-before-fsync, vote-while-repairing.
    #[arg(long)]
    bug: Option<String>,
    /// Print one line per seed.
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let bug = match args.bug.as_deref().map(|b| (b, bug_by_name(b))) {
        None => None,
        Some((_, Some(b))) => Some(b),
        Some((name, None)) => {
            let known: Vec<&str> = BUGS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "quire-sim: unknown bug '{name}'; known: {}",
                known.join(", ")
            );
            return ExitCode::from(2);
        }
    };
    let opts = SimOptions {
        nodes: args.nodes as usize,
        groups: args.groups as usize,
        fault_phase_ms: args.fault_phase_ms,
        bug,
        ..SimOptions::default()
    };
    let first = args.seed.unwrap_or(0);
    let count = args.seeds.unwrap_or(1);
    let single = args.seeds.is_none();
    let started = Instant::now();

    let mut totals = Totals::default();
    for seed in first..first.saturating_add(count) {
        match sim::run(seed, &opts) {
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
    dropped: u64,
    checks: u64,
    recovery_ms: Vec<u64>,
    faults: FaultCounts,
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
        self.dropped += r.messages_dropped;
        self.checks += r.invariant_checks;
        self.recovery_ms.push(r.recovery_ms);
        self.faults.add(&r.faults);
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
            "runs:        {} passed ({} nodes x {} groups{})",
            self.runs,
            opts.nodes,
            opts.groups,
            opts.bug.map_or(String::new(), |b| format!(
                ", planted bug {}",
                sim::bug_name(b)
            ))
        );
        println!(
            "simulated:   {:.1} s in {:.1} s of real time, {} events",
            self.sim_ms as f64 / 1000.0,
            started.elapsed().as_secs_f64(),
            self.events
        );
        println!(
            "elections:   {} started, {} leaders elected, {} snapshots sent",
            self.elections, self.leaders, self.snapshots
        );
        println!(
            "commits:     {} entries committed, {} appends confirmed, {} failed, {} unknown (leader lost)",
            self.commits, self.confirmed, self.failed, self.unknown
        );
        println!(
            "faults:      {} total: {} crashes ({} crash loops, {} cluster power losses), {} restarts, {} isolations, {} one-way cuts, {} clogged paths, {} heals, {} loss changes, {} duplication changes, {} EIO, {} corruptions, {} misdirected writes, {} leader transfers; {} messages dropped",
            f.total(), f.crashes, f.crash_loops, f.power_losses, f.restarts, f.isolations, f.one_way_cuts, f.clogs, f.heals, f.loss_changes, f.duplication_changes, f.eio, f.corruptions, f.misdirected_writes, f.transfers, self.dropped
        );
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
    }
}
