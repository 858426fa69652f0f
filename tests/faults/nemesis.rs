//! The faults, each injected on the real cluster, held for a while (the
//! workload keeps running), healed, and followed by a wait until the
//! cluster is healthy and serves again (bounded by `SERVE_BOUND`). While a
//! fault holds, the nodes' `/status` is polled for the classification the
//! failure detector should reach, and the time to reach it is recorded:
//!
//! | fault | expected classification |
//! | --- | --- |
//! | SIGKILL, SIGSTOP | the others see the node `down` |
//! | UDP cut a<->b, serial alive | a and b see each other `ip-partitioned` |
//! | UDP cut a->b only | b sees a `ip-partitioned` |
//! | serial cable a-b unplugged | a and b see each other `serial-down` |
//!
//! Faults that need root (nftables, loop mounts) return the reason they
//! were skipped instead of running.

use super::cluster::Cluster;
use super::history::{self, History};
use super::stats::Measurements;
use quire::consensus::NodeId;
use quire::net::nft::{NftCut, NftError, NftLoss};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a classification may take before it counts as not seen:
/// generous (deadtime is 250 ms, initdead 2 s; the machine is shared).
const CLASSIFY_LIMIT: Duration = Duration::from_secs(10);

/// Polls `expect` — (observer, peer, status) — from `started` until each
/// is seen or `CLASSIFY_LIMIT` passes; records each time under
/// "`fault`: `status`", and what was seen instead for the ones not seen.
pub fn watch(
    c: &Cluster,
    m: &mut Measurements,
    fault: &str,
    started: Instant,
    expect: &[(NodeId, NodeId, &str)],
) {
    let mut left: Vec<(NodeId, NodeId, &str)> = expect.to_vec();
    let mut last: Vec<Option<String>> = vec![None; left.len()];
    while !left.is_empty() && started.elapsed() < CLASSIFY_LIMIT {
        let mut i = 0;
        while i < left.len() {
            let (o, p, want) = left[i];
            let seen = c.peer_status(o, p);
            if seen.as_deref() == Some(want) {
                m.time(&format!("classify {fault}: {want}"), started.elapsed());
                left.remove(i);
                last.remove(i);
            } else {
                last[i] = seen;
                i += 1;
            }
        }
    }
    for ((o, p, want), seen) in left.into_iter().zip(last) {
        m.unseen.push(format!(
            "{fault}: node {o} never saw node {p} {want} (last: {seen:?})"
        ));
    }
}

/// The nodes other than `id` that answer.
fn others(c: &Cluster, id: NodeId) -> Vec<NodeId> {
    c.live().into_iter().filter(|&n| n != id).collect()
}

/// The current leader, waiting for one.
pub fn leader(c: &Cluster) -> NodeId {
    super::common::wait_for("a leader", super::cluster::SERVE_BOUND, || c.leader()).0
}

/// A follower of `leader`.
pub fn follower(c: &Cluster, leader: NodeId) -> NodeId {
    others(c, leader)[0]
}

/// SIGKILL node `target`, hold, restart it, wait until healthy. Records
/// the others classifying it down, and (if it led) a new leader.
pub fn kill(c: &mut Cluster, m: &mut Measurements, target: NodeId, hold: Duration) {
    let was_leader = c.leader() == Some(target);
    let watchers = others(c, target);
    let started = Instant::now();
    c.kill(target);
    let expect: Vec<_> = watchers.iter().map(|&o| (o, target, "down")).collect();
    let what = if was_leader {
        "SIGKILL leader"
    } else {
        "SIGKILL follower"
    };
    if was_leader {
        let new = super::common::wait_for("a new leader", super::cluster::SERVE_BOUND, || {
            c.leader().filter(|&l| l != target)
        });
        m.time("SIGKILL leader: new leader elected", new.1);
    }
    watch(c, m, what, started, &expect);
    std::thread::sleep(hold.saturating_sub(started.elapsed())); // hold the fault
    c.restart(target);
    m.time(
        &format!("{what}: restart to serving and all links up"),
        c.wait_healthy(what),
    );
}

/// SIGSTOP node `target`, hold, SIGCONT, wait until healthy.
pub fn pause(c: &mut Cluster, m: &mut Measurements, target: NodeId, hold: Duration) {
    let was_leader = c.leader() == Some(target);
    let what = if was_leader {
        "SIGSTOP leader"
    } else {
        "SIGSTOP follower"
    };
    let watchers = others(c, target);
    let started = Instant::now();
    c.pause(target);
    let expect: Vec<_> = watchers.iter().map(|&o| (o, target, "down")).collect();
    watch(c, m, what, started, &expect);
    std::thread::sleep(hold.saturating_sub(started.elapsed())); // hold the fault
    c.resume(target);
    m.time(&format!("{what}: SIGCONT to healthy"), c.wait_healthy(what));
}

/// Cuts UDP on each pair of `pairs` (a to b only if `one_way`), holds,
/// heals, waits until healthy. Err: why it could not (not root, no nft:
/// `Unavailable`; nft refused: `Failed`).
pub fn partition(
    c: &mut Cluster,
    m: &mut Measurements,
    what: &str,
    pairs: &[(NodeId, NodeId)],
    one_way: bool,
    hold: Duration,
) -> Result<(), NftError> {
    let started = Instant::now();
    let mut cuts = Vec::new();
    for &(a, b) in pairs {
        let (pa, pb) = (c.udp_port(a), c.udp_port(b));
        cuts.push(if one_way {
            NftCut::one_way(pa, pb)?
        } else {
            NftCut::install(pa, pb)?
        });
    }
    let mut expect = Vec::new();
    for &(a, b) in pairs {
        expect.push((b, a, "ip-partitioned"));
        if !one_way {
            expect.push((a, b, "ip-partitioned"));
        }
    }
    watch(c, m, what, started, &expect);
    std::thread::sleep(hold.saturating_sub(started.elapsed())); // hold the fault
    if one_way {
        // What each side makes of the other at the end of the hold.
        for &(a, b) in pairs {
            let links = |o: NodeId, p: NodeId| {
                c.status(o).map(|s| {
                    let ls: Vec<String> = s["links"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|l| l["peer"].as_u64() == Some(p))
                        .map(|l| format!("{} {}", l["channel"], l["state"]))
                        .collect();
                    ls.join(", ")
                })
            };
            out!(
                "{what}: at the end, node {a} sees node {b} {:?} ({:?}), node {b} sees node {a} {:?} ({:?})",
                c.peer_status(a, b),
                links(a, b),
                c.peer_status(b, a),
                links(b, a)
            );
        }
    }
    drop(cuts);
    m.time(&format!("{what}: heal to healthy"), c.wait_healthy(what));
    Ok(())
}

/// Drops `percent`% of UDP to every node's port for `hold`, then as long
/// again without loss; records the workload's throughput in both windows.
pub fn loss(
    c: &mut Cluster,
    m: &mut Measurements,
    h: &History,
    percent: u32,
    hold: Duration,
) -> Result<(), NftError> {
    let ports: Vec<u16> = c.ids().iter().map(|&id| c.udp_port(id)).collect();
    std::thread::sleep(hold); // a baseline window without loss
    let before = h.t0.elapsed();
    let rule = NftLoss::install(&ports, percent)?;
    let from = h.t0.elapsed();
    std::thread::sleep(hold); // hold the fault
    let dropped = rule.dropped().unwrap_or(0);
    drop(rule);
    let healed = h.t0.elapsed();
    std::thread::sleep(hold); // the same window without loss
    let after = h.t0.elapsed();
    m.rate(
        &format!("throughput before {percent}% UDP loss"),
        h.throughput(before.saturating_sub(hold), before),
    );
    m.rate(
        &format!("throughput during {percent}% UDP loss"),
        h.throughput(from, healed),
    );
    m.rate(
        &format!("throughput after {percent}% UDP loss"),
        h.throughput(healed, after),
    );
    out!("{percent}% UDP loss: {dropped} datagrams dropped");
    m.time(
        &format!("{percent}% UDP loss: heal to healthy"),
        c.wait_healthy("loss"),
    );
    Ok(())
}

/// Unplugs the serial cable between `a` and `b`, holds, replugs; records
/// both ends classifying each other serial-down, then up again.
pub fn unplug(c: &mut Cluster, m: &mut Measurements, a: NodeId, b: NodeId, hold: Duration) {
    let what = "serial cable unplugged";
    let started = Instant::now();
    c.procs.cable(a, b).expect("a cable").unplug();
    watch(
        c,
        m,
        what,
        started,
        &[(a, b, "serial-down"), (b, a, "serial-down")],
    );
    std::thread::sleep(hold.saturating_sub(started.elapsed())); // hold the fault
    let replugged = Instant::now();
    c.procs.cable(a, b).expect("a cable").replug();
    watch(
        c,
        m,
        "serial cable replugged",
        replugged,
        &[(a, b, "up"), (b, a, "up")],
    );
    m.time("serial cable: replug to healthy", c.wait_healthy(what));
}

/// Fills the filesystem of node `target`'s log (`fs`, a small loop
/// mount) with a ballast file, pushes large appends until the node
/// reports its disk full, holds, deletes the ballast and waits until the
/// node reports it healthy and the cluster serves (appends resume).
pub fn disk_full(
    c: &mut Cluster,
    m: &mut Measurements,
    h: &History,
    target: NodeId,
    fs: &Path,
    hold: Duration,
) {
    let role = c.group0(target).map(|g| g.0).unwrap_or_default();
    let what = format!("disk full on the {role}");
    let ballast = fs.join("ballast");
    let started = Instant::now();
    super::common::fill_up(&ballast);
    let id = super::cluster::fresh_client_id();
    let mut filler = c.client(id, Duration::from_secs(2));
    let mut seq = 0;
    let full = super::common::wait_for(
        "the node to report its disk full",
        super::cluster::SERVE_BOUND,
        || {
            if c.group0(target).is_some_and(|g| g.3 == "full") {
                return Some(());
            }
            seq += 1;
            // Large appends fill the node's last free segment quickly.
            h.append(&mut filler, id, seq, history::value(id, seq, 60 << 10));
            None
        },
    );
    m.time(&format!("{what}: large appends to reported full"), full.1);
    out!("{what}: {:?} from the ballast to full", started.elapsed());
    std::thread::sleep(hold); // hold the fault
    std::fs::remove_file(&ballast).expect("remove the ballast");
    let freed = Instant::now();
    super::common::wait_for(
        "the node to report its disk healthy",
        super::cluster::SERVE_BOUND,
        || {
            c.group0(target)
                .is_some_and(|g| g.3 == "healthy")
                .then_some(())
        },
    );
    m.time(
        &format!("{what}: space back to disk healthy"),
        freed.elapsed(),
    );
    m.time(
        &format!("{what}: space back to healthy"),
        c.wait_healthy(&what),
    );
}
