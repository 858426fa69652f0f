//! Scripted failover scenarios on the simulated cluster with serial
//! cables: one fault against the leader of group 0, then what the
//! cluster did about it, in simulated milliseconds. The checkers run as in
//! every simulation; the report says how fast and whether leadership moved.

use super::serial::detector_config;
use super::trace::What;
use super::world::World;
use super::{Failure, RunReport, SimOptions};
use crate::consensus::{NodeId, Role};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The fault a scenario applies to the leader of group 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The leader's host dies: every channel falls silent.
    KillLeader,
    /// UDP between the leader and one follower is cut both ways; serial
    /// still works.
    CutLeaderUdp,
    /// The serial cable between the leader and one follower is cut.
    CutSerial,
    /// The leader's disk for group 0 stops completing writes.
    StallLeaderDisk,
}

impl Scenario {
    /// All of them, in the order of the issue.
    pub const ALL: [Scenario; 4] = [
        Scenario::KillLeader,
        Scenario::CutLeaderUdp,
        Scenario::CutSerial,
        Scenario::StallLeaderDisk,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::KillLeader => "kill-leader",
            Scenario::CutLeaderUdp => "cut-leader-udp",
            Scenario::CutSerial => "cut-serial",
            Scenario::StallLeaderDisk => "stall-leader-disk",
        }
    }
}

/// What a scenario run saw, times in ms after the fault.
#[derive(Clone, Debug)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// The leader of group 0 when the fault hit.
    pub leader: NodeId,
    /// The follower on the other end of a cut (cut scenarios).
    pub follower: Option<NodeId>,
    /// The first leader of group 0 elected after the fault, and when.
    pub new_leader: Option<(NodeId, u64)>,
    /// When `follower` classified the leader as `ip-partitioned`.
    pub ip_partitioned_after_ms: Option<u64>,
    /// When either end of the cut cable classified the other `serial-down`.
    pub serial_down_after_ms: Option<u64>,
    /// When the other nodes declared the dead leader `down` (first of them).
    pub down_after_ms: Option<u64>,
    /// When the leader stepped down for its stalled disk.
    pub stepped_down_after_ms: Option<u64>,
    /// Leader changes, detector transitions and faults after the fault,
    /// one line each.
    pub timeline: Vec<String>,
    /// The run's counters.
    pub run: RunReport,
}

/// Simulated ms the cluster runs before the fault (past `initdead_ms`).
pub const SETTLE_MS: u64 = 3_000;
/// Simulated ms the scenario watches after the fault.
pub const WATCH_MS: u64 = 5_000;

/// Runs one scenario. A broken invariant or a panic is a failure of the
/// seed, replayable like any simulation.
pub fn run_scenario(
    scenario: Scenario,
    seed: u64,
    opts: &SimOptions,
) -> Result<ScenarioReport, Box<Failure>> {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut w = World::scripted(seed, opts);
        w.observed = Some(Vec::new());
        let result = script(&mut w, scenario, seed);
        (result, w.report(), w.recent())
    }));
    match outcome {
        Ok((Ok(r), _, _)) => Ok(r),
        Ok((Err(v), report, recent)) => Err(Box::new(Failure {
            invariant: v.invariant.to_string(),
            detail: v.detail,
            recent_events: recent,
            report,
        })),
        Err(panic) => Err(Box::new(Failure {
            invariant: "panic".into(),
            detail: panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
            recent_events: Vec::new(),
            report: RunReport {
                seed,
                ..RunReport::default()
            },
        })),
    }
}

fn leader_of_group0(w: &World) -> Option<usize> {
    (0..w.nodes.len())
        .find(|&n| w.nodes[n].alive && w.nodes[n].raft(0).is_some_and(|r| r.role() == Role::Leader))
}

fn script(
    w: &mut World,
    scenario: Scenario,
    seed: u64,
) -> Result<ScenarioReport, super::Violation> {
    // Settle until group 0 has a leader (pre-vote elections may take a few
    // rounds at start).
    let mut until = SETTLE_MS;
    w.run_until(until)?;
    while leader_of_group0(w).is_none() && until < 4 * SETTLE_MS {
        until += 100;
        w.run_until(until)?;
    }
    let l = leader_of_group0(w).ok_or(super::Violation {
        invariant: "scenario-setup",
        detail: "group 0 elected no leader while settling".into(),
    })?;
    let f = (l + 1) % w.nodes.len();
    let t0 = w.now;
    let from = w.observed.as_ref().map_or(0, |o| o.len());
    let follower = match scenario {
        Scenario::KillLeader => {
            w.crash_node(l)?;
            None
        }
        Scenario::CutLeaderUdp => {
            w.net.cut_one_way(l, f);
            w.net.cut_one_way(f, l);
            Some(f)
        }
        Scenario::CutSerial => {
            w.cables.set_cut(l, f, true);
            Some(f)
        }
        Scenario::StallLeaderDisk => {
            w.stall_disk(l, 0, t0 + 3 * WATCH_MS);
            None
        }
    };
    w.run_until(t0 + WATCH_MS)?;

    let leader_id = l as NodeId + 1;
    let follower_id = follower.map(|f| f as NodeId + 1);
    let seen = &w.observed.as_ref().expect("observing")[from..];
    let after = |pred: &dyn Fn(&super::trace::Record) -> bool| {
        seen.iter().find(|r| pred(r)).map(|r| r.time_ms - t0)
    };
    let new_leader = seen
        .iter()
        .find(|r| r.group == 0 && matches!(r.what, What::BecameLeader { .. }))
        .map(|r| (r.node, r.time_ms - t0));
    let status_of_leader = |status: &'static str, node: Option<NodeId>| {
        after(&|r| {
            node.is_none_or(|n| r.node == n)
                && matches!(r.what, What::PeerStatus { peer, status: s } if peer == leader_id && s == status)
        })
    };
    let serial_down_after_ms = after(&|r| {
        matches!(r.what, What::PeerStatus { peer, status: "serial-down" }
            if (r.node == leader_id && Some(peer) == follower_id)
                || (Some(r.node) == follower_id && peer == leader_id))
    });
    let stepped_down_after_ms =
        after(&|r| r.node == leader_id && matches!(r.what, What::Fault("own-disk-stalled")));
    Ok(ScenarioReport {
        scenario,
        seed,
        leader: leader_id,
        follower: follower_id,
        new_leader,
        ip_partitioned_after_ms: status_of_leader("ip-partitioned", follower_id),
        serial_down_after_ms,
        down_after_ms: status_of_leader("down", None),
        stepped_down_after_ms,
        timeline: seen.iter().map(|r| r.to_string()).collect(),
        run: w.report(),
    })
}

/// The bound the kill-leader scenario must meet: the deadtime, the fast
/// campaign's rank-staggered delay (at most one jitter per other voter),
/// and one election round (at most an election timeout of the seed's
/// parameters).
pub fn kill_leader_bound_ms(seed: u64, opts: &SimOptions) -> u64 {
    let w = World::scripted(seed, opts);
    let cfg = w.raft_config(0, 0);
    let others = opts.nodes.saturating_sub(1) as u64;
    detector_config().deadtime_ms + cfg.fast_campaign_jitter_ms * others + cfg.election_timeout_ms
}

impl ScenarioReport {
    /// Checks what the issue asks of this scenario; `Err` says what went
    /// wrong. `kill_bound_ms` is [`kill_leader_bound_ms`] for the seed.
    pub fn verdict(&self, kill_bound_ms: u64) -> Result<(), String> {
        let d = detector_config();
        // A link is declared dead a deadtime after the last heartbeat heard
        // on it, which left at most a keepalive (plus a serial frame's
        // transfer time) before the fault.
        let classify_bound = d.deadtime_ms + d.keepalive_ms + 50;
        let no_leader_change = || match self.new_leader {
            None => Ok(()),
            Some((n, t)) => Err(format!("leadership moved to n{n} {t} ms after the fault")),
        };
        match self.scenario {
            Scenario::KillLeader => match self.new_leader {
                Some((n, t)) if n != self.leader && t <= kill_bound_ms => Ok(()),
                Some((n, t)) => Err(format!(
                    "new leader n{n} after {t} ms; the bound is {kill_bound_ms} ms"
                )),
                None => Err("no new leader".into()),
            },
            Scenario::CutLeaderUdp => {
                no_leader_change()?;
                match self.ip_partitioned_after_ms {
                    Some(t) if t <= classify_bound => Ok(()),
                    Some(t) => Err(format!(
                        "ip-partitioned after {t} ms; the bound is {classify_bound} ms"
                    )),
                    None => Err("the follower never classified the leader ip-partitioned".into()),
                }
            }
            Scenario::CutSerial => {
                no_leader_change()?;
                match self.serial_down_after_ms {
                    Some(t) if t <= classify_bound => Ok(()),
                    Some(t) => Err(format!(
                        "serial-down after {t} ms; the bound is {classify_bound} ms"
                    )),
                    None => Err("no serial-down alarm".into()),
                }
            }
            Scenario::StallLeaderDisk => match self.new_leader {
                Some((n, _)) if n != self.leader => Ok(()),
                Some((n, t)) => Err(format!("n{n}, the stalled leader, won again after {t} ms")),
                None => Err("leadership did not move off the stalled disk".into()),
            },
        }
    }
}
