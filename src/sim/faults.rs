//! The fault schedule: at random intervals during the safety phase, one
//! fault from the seed's stream; at the end, everything heals.

use super::checker::Violation;
use super::trace::What;
use super::world::{Event, World};
use crate::consensus::Role;
use rand::Rng;

/// Faults injected during a run, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Node crashes (all groups' unsynced writes partly lost or torn).
    pub crashes: u64,
    /// Node restarts.
    pub restarts: u64,
    /// Power losses of the whole cluster.
    pub power_losses: u64,
    /// Crash loops (a node restarted over and over for a while).
    pub crash_loops: u64,
    /// Nodes isolated both ways.
    pub isolations: u64,
    /// One-way link cuts.
    pub one_way_cuts: u64,
    /// Paths clogged (every message held for a while).
    pub clogs: u64,
    /// Times the network was healed.
    pub heals: u64,
    /// Changes of the loss rate.
    pub loss_changes: u64,
    /// Changes of the duplication rate.
    pub duplication_changes: u64,
    /// fsync EIO injections (the group stops on that node).
    pub eio: u64,
    /// Bit rot left in a log by a crash, found at recovery.
    pub corruptions: u64,
    /// Writes reported durable that landed elsewhere.
    pub misdirected_writes: u64,
    /// Batches below the snapshot, holding entries the state refers to,
    /// left rotten or zeroed by a crash (repaired from a peer).
    pub damaged_below_snapshot: u64,
    /// Segment files below the snapshot lost whole in a crash.
    pub lost_segments: u64,
    /// Copies sent to a peer repairing its log that were wrong, though
    /// they passed the sender's own checks (a bad block read back as a
    /// good one, memory corruption): the receiver must refuse them.
    pub wrong_repair_copies: u64,
    /// Leadership transfers requested.
    pub transfers: u64,
    /// Serial cables cut.
    pub serial_cuts: u64,
    /// Serial cables made noisy (bytes damaged on the line).
    pub serial_noise: u64,
    /// Disks stalled (nothing completes for seconds).
    pub disk_stalls: u64,
    /// Disks filled up for a while (`ENOSPC`; production glue only).
    pub disks_full: u64,
}

impl FaultCounts {
    /// All faults.
    pub fn total(&self) -> u64 {
        self.crashes
            + self.restarts
            + self.crash_loops
            + self.power_losses
            + self.isolations
            + self.one_way_cuts
            + self.clogs
            + self.heals
            + self.loss_changes
            + self.duplication_changes
            + self.eio
            + self.corruptions
            + self.misdirected_writes
            + self.damaged_below_snapshot
            + self.lost_segments
            + self.wrong_repair_copies
            + self.disks_full
            + self.transfers
            + self.serial_cuts
            + self.serial_noise
            + self.disk_stalls
    }

    /// Adds another run's counts.
    pub fn add(&mut self, o: &FaultCounts) {
        self.crashes += o.crashes;
        self.restarts += o.restarts;
        self.crash_loops += o.crash_loops;
        self.power_losses += o.power_losses;
        self.isolations += o.isolations;
        self.one_way_cuts += o.one_way_cuts;
        self.clogs += o.clogs;
        self.heals += o.heals;
        self.loss_changes += o.loss_changes;
        self.duplication_changes += o.duplication_changes;
        self.eio += o.eio;
        self.corruptions += o.corruptions;
        self.misdirected_writes += o.misdirected_writes;
        self.damaged_below_snapshot += o.damaged_below_snapshot;
        self.lost_segments += o.lost_segments;
        self.wrong_repair_copies += o.wrong_repair_copies;
        self.disks_full += o.disks_full;
        self.transfers += o.transfers;
        self.serial_cuts += o.serial_cuts;
        self.serial_noise += o.serial_noise;
        self.disk_stalls += o.disk_stalls;
    }
}

impl World {
    pub(crate) fn inject_fault(&mut self) -> Result<(), Violation> {
        let n = self.rng.gen_range(0..self.nodes.len());
        match self.rng.gen_range(0..112) {
            // A crash loop: the process dies and is restarted every few ms,
            // so crashes land inside elections and between a vote and the
            // fsync or message that follows it.
            0..=4 => {
                self.faults.crash_loops += 1;
                self.record(n, 0, What::Fault("crash-loop"));
                let until_ms = self.now + self.rng.gen_range(300..=1_500);
                self.crash_loop_step(n, until_ms)?;
            }
            // Crash, restarted soon (a process restart) or later (a host).
            5..=14 => {
                if self.nodes[n].alive {
                    self.faults.crashes += 1;
                    self.crash_node(n)?;
                    let quick = self.rng.gen_bool(0.5);
                    let after = if quick {
                        self.rng.gen_range(1..=self.p.election_timeout_ms)
                    } else {
                        self.rng.gen_range(200..=3_000)
                    };
                    self.schedule_restart(n, self.now + after);
                }
            }
            // Power loss of the whole cluster: every node loses its unsynced
            // writes and all come back together, leaderless at once.
            15..=24 => {
                self.faults.power_losses += 1;
                self.record(n, 0, What::Fault("power-loss"));
                for m in 0..self.nodes.len() {
                    if self.nodes[m].alive {
                        self.faults.crashes += 1;
                        self.crash_node(m)?;
                    }
                    let back = self.now + self.rng.gen_range(1..=50);
                    self.schedule_restart(m, back);
                }
            }
            25..=29 => {
                if !self.nodes[n].alive {
                    self.faults.restarts += 1;
                    self.restart_node(n)?;
                } else {
                    // Restart a group stopped by EIO.
                    for g in 0..self.opts.groups {
                        if self.nodes[n].raft(g).is_none() {
                            self.faults.restarts += 1;
                            self.start_group(n, g)?;
                            self.drive(n, g)?;
                        }
                    }
                }
            }
            30..=41 => {
                self.faults.isolations += 1;
                self.record(n, 0, What::Fault("isolate"));
                self.net.isolate(n);
            }
            42..=46 => {
                let to = self.rng.gen_range(0..self.nodes.len());
                if to != n {
                    self.faults.clogs += 1;
                    self.record(n, 0, What::Fault("clog-path"));
                    let until = self.now + self.rng.gen_range(50..=1_000);
                    self.net.clog(n, to, until);
                }
            }
            47..=51 => {
                let to = self.rng.gen_range(0..self.nodes.len());
                if to != n {
                    self.faults.one_way_cuts += 1;
                    self.record(n, 0, What::Fault("cut-one-way"));
                    self.net.cut_one_way(n, to);
                }
            }
            52..=66 => {
                self.faults.heals += 1;
                self.record(n, 0, What::Fault("heal-network"));
                self.net.heal();
                self.cables.heal();
            }
            67..=74 => {
                self.faults.loss_changes += 1;
                self.record(n, 0, What::Fault("loss"));
                self.net.loss = if self.rng.gen_bool(0.3) {
                    0.0
                } else {
                    self.rng.gen_range(0.0..0.3)
                };
            }
            75..=81 => {
                self.faults.duplication_changes += 1;
                self.record(n, 0, What::Fault("duplication"));
                self.net.duplication = self.rng.gen_range(0.0..0.2);
            }
            82..=86 => {
                let g = self.rng.gen_range(0..self.opts.groups);
                if self.rng.gen_bool(0.5) {
                    // The production log's disk fills up for a while.
                    let until = self.now + self.rng.gen_range(300..=2_000);
                    self.fill_disk(n, g, until);
                } else if self.nodes[n].runs(g) {
                    self.faults.eio += 1;
                    self.record(n, g, What::Fault("eio"));
                    self.fail_next_sync(n, g);
                }
            }
            100..=103 => {
                let to = self.rng.gen_range(0..self.nodes.len());
                if to != n {
                    self.faults.serial_cuts += 1;
                    self.record(n, 0, What::Fault("serial-cut"));
                    self.cables.set_cut(n, to, true);
                }
            }
            104..=106 => {
                let to = self.rng.gen_range(0..self.nodes.len());
                if to != n {
                    self.faults.serial_noise += 1;
                    self.record(n, 0, What::Fault("serial-noise"));
                    let p = self.rng.gen_range(0.0..0.02);
                    self.cables.set_noise(n, to, p);
                }
            }
            107..=111 => {
                let g = self.rng.gen_range(0..self.opts.groups);
                self.faults.disk_stalls += 1;
                self.record(n, g, What::Fault("disk-stall"));
                let until = self.now + self.rng.gen_range(500..=3_000);
                self.stall_disk(n, g, until);
            }
            _ => {
                let g = self.rng.gen_range(0..self.opts.groups);
                let target = self.rng.gen_range(1..=self.nodes.len() as u64);
                let leader = (0..self.nodes.len()).find(|&m| {
                    self.nodes[m]
                        .raft(g)
                        .is_some_and(|r| r.role() == Role::Leader)
                });
                if let Some(l) = leader {
                    self.faults.transfers += 1;
                    self.record(l, g, What::Fault("transfer-leadership"));
                    let raft = self.nodes[l].raft_mut(g).expect("found live");
                    let _ = raft.transfer_leadership(target);
                    self.drive(l, g)?;
                }
            }
        }
        let next = self.now + self.rng.gen_range(50..=self.p.fault_gap_ms_max);
        if next < self.opts.fault_phase_ms {
            self.schedule(next, Event::Fault);
        }
        Ok(())
    }

    /// One turn of a crash loop: crash now if up, come back within a few
    /// ms, and go again shortly after.
    pub(crate) fn crash_loop_step(&mut self, n: usize, until_ms: u64) -> Result<(), Violation> {
        if self.now >= until_ms || self.healed_at.is_some() {
            return Ok(());
        }
        if self.nodes[n].alive {
            self.faults.crashes += 1;
            self.crash_node(n)?;
            let back = self.now + self.rng.gen_range(1..=10);
            self.schedule_restart(n, back);
        }
        let next = self.now + self.rng.gen_range(5..=80);
        self.schedule(next, Event::CrashLoop { node: n, until_ms });
        Ok(())
    }

    /// End of the safety phase: every fault heals, every node and group
    /// restarts, and the liveness clock starts.
    pub(crate) fn heal(&mut self) -> Result<(), Violation> {
        self.record(0, 0, What::Fault("heal-all"));
        self.net.heal();
        self.net.loss = 0.0;
        self.net.duplication = 0.0;
        self.cables.heal();
        for n in 0..self.nodes.len() {
            for g in 0..self.opts.groups {
                if let Some(dev) = self.nodes[n].devices.get(g) {
                    dev.clear_fail_next_sync();
                    dev.set_capacity_bytes(None);
                }
            }
            if !self.nodes[n].alive {
                self.restart_node(n)?;
            } else {
                for g in 0..self.opts.groups {
                    if self.nodes[n].raft(g).is_none() {
                        self.start_group(n, g)?;
                        self.drive(n, g)?;
                    }
                }
            }
        }
        self.healed_at = Some(self.now);
        Ok(())
    }
}
