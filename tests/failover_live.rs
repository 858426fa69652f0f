//! The serial heartbeat issue's four failover scenarios on real threads:
//! three nodes (`quire::node`, one event-loop thread each) with real logs
//! in temp dirs, UDP on 127.0.0.1 and PTY null-modem cables between every
//! pair. Each scenario faults the leader of group 0 and watches what the
//! nodes report (`NodeStatus`: roles, terms, and the detector's
//! transitions, which are also logged):
//!
//! - kill the leader (its thread stops: every channel falls silent): the
//!   others declare it `down` and elect a new leader;
//! - cut the serial cable between the leader and a follower: both raise
//!   `serial-down`, leadership stays;
//! - cut UDP between the leader and a follower (nftables, root): the
//!   follower classifies the leader `ip-partitioned`, leadership stays and
//!   appends still commit;
//! - stall the leader's disk (`fsfreeze` on a loop-mounted ext4, root): the
//!   leader steps down and another node leads.
//!
//! Timings are printed, and asserted only against generous bounds: this
//! machine is shared; the simulator (`quire-sim --failover`) measures them.
//! Waits poll the nodes' status with a deadline; nothing sleeps to
//! synchronise. Scenarios run one at a time (a process-wide lock).

mod common;

use common::LoopFs;
use quire::consensus::{NodeId, Role};
use quire::net::nft::NftCut;
use quire::node::{LocalCluster, NodeStatus};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Generous bound for anything the protocol does within a deadtime or an
/// election: the machine is shared and may stall threads for a while.
const SLOW: Duration = Duration::from_secs(10);

struct Cluster {
    inner: LocalCluster,
    _cables: tempfile::TempDir,
}

impl std::ops::Deref for Cluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

impl Cluster {
    /// Three nodes; node `n`'s log lives in `log_dirs[n-1]`.
    fn start(log_dirs: &[PathBuf]) -> Cluster {
        let cables = tempfile::tempdir().unwrap();
        let inner = LocalCluster::start(log_dirs, &[0], &[], cables.path(), |_| {})
            .expect("cluster starts");
        Cluster {
            inner,
            _cables: cables,
        }
    }

    fn status(&self, id: NodeId) -> NodeStatus {
        self.nodes[&id].status().expect("node answers")
    }

    /// Waits until every link is up and a leader is agreed on and has
    /// confirmed an append.
    fn settle(&self) -> (NodeId, u64) {
        wait_for("every link up", || self.all_links_up());
        let ((leader, term), _) = wait_for_value("an agreed leader", || self.agreed_leader());
        self.nodes[&leader]
            .propose(0, b"settled".to_vec(), SLOW)
            .expect("the leader confirms an append");
        (leader, term)
    }
}

/// Polls `cond` until it holds or `SLOW` passes; returns how long it took.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    wait_for_value(what, || cond().then_some(())).1
}

fn wait_for_value<T>(what: &str, f: impl FnMut() -> Option<T>) -> (T, Duration) {
    common::wait_for(what, SLOW, f)
}

fn temp_dirs(n: usize) -> (Vec<tempfile::TempDir>, Vec<PathBuf>) {
    let dirs: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
    let paths = dirs.iter().map(|d| d.path().join("log")).collect();
    (dirs, paths)
}

fn other_than(c: &Cluster, leader: NodeId) -> NodeId {
    *c.nodes.keys().find(|&&n| n != leader).unwrap()
}

#[test]
fn kill_the_leader_and_another_takes_over() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_keep, dirs) = temp_dirs(3);
    let mut c = Cluster::start(&dirs);
    let (leader, term) = c.settle();
    let killed = Instant::now();
    c.stop_node(leader);
    let (new, took) = wait_for_value("a new leader", || {
        c.statuses().iter().find_map(|s| {
            let g = &s.groups[0];
            (g.role == Role::Leader && g.term > term).then_some(s.id)
        })
    });
    println!("kill-leader: node {leader} stopped; node {new} leads after {took:?}");
    let took_down = wait_for("the survivors to classify the old leader down", || {
        c.statuses()
            .iter()
            .all(|s| s.peer(leader).map(|p| p.status) == Some("down"))
    });
    println!(
        "kill-leader: both survivors classify node {leader} down after {:?}",
        killed.elapsed().min(took + took_down)
    );
    for s in c.statuses() {
        assert!(
            s.transitions
                .iter()
                .any(|t| t.contains(&format!("node {leader}: ")) && t.ends_with("-> down")),
            "node {} logged the transition: {:?}",
            s.id,
            s.transitions
        );
    }
    c.nodes[&new]
        .propose(0, b"after failover".to_vec(), SLOW)
        .expect("the new leader confirms appends");
    assert!(killed.elapsed() < SLOW);
}

#[test]
fn cut_serial_cable_raises_serial_down_and_keeps_the_leader() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_keep, dirs) = temp_dirs(3);
    let mut c = Cluster::start(&dirs);
    let (leader, term) = c.settle();
    let follower = other_than(&c, leader);
    c.cable(leader, follower).unwrap().unplug();
    let took = wait_for("serial-down on both ends", || {
        c.status(leader).peer(follower).map(|p| p.status) == Some("serial-down")
            && c.status(follower).peer(leader).map(|p| p.status) == Some("serial-down")
    });
    println!("cut-serial: both ends report serial-down after {took:?}");
    assert!(
        c.status(leader).alarm && c.status(follower).alarm,
        "alarm raised"
    );
    // Leadership holds while the cable is out, and appends commit.
    c.nodes[&leader]
        .propose(0, b"while unplugged".to_vec(), SLOW)
        .expect("appends confirm with a cable out");
    assert_eq!(c.agreed_leader(), Some((leader, term)), "no leader change");
    c.cable(leader, follower).unwrap().replug();
    wait_for("the cable back up", || {
        c.status(follower).peer(leader).map(|p| p.status) == Some("up")
    });
    assert_eq!(c.agreed_leader(), Some((leader, term)));
}

#[test]
fn cut_udp_between_leader_and_follower_is_ip_partitioned_not_an_election() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_keep, dirs) = temp_dirs(3);
    let c = Cluster::start(&dirs);
    let (leader, term) = c.settle();
    let follower = other_than(&c, leader);
    // Elections at the cluster's start count too; none may follow the cut.
    let elections_before = c.status(follower).groups[0].stats.elections_started;
    let cut = match NftCut::install(c.ports[&leader], c.ports[&follower]) {
        Ok(cut) => cut,
        Err(quire::net::nft::NftError::Unavailable(why)) => {
            println!("skipping the UDP cut: {why}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let took = wait_for("the follower to see the leader ip-partitioned", || {
        c.status(follower).peer(leader).map(|p| p.status) == Some("ip-partitioned")
    });
    println!(
        "cut-leader-udp: node {follower} classifies node {leader} ip-partitioned after {took:?}"
    );
    // Several election timeouts pass: the follower keeps following (its
    // serial heartbeat vouches for the leader) and appends commit through
    // the other follower.
    for i in 0..5 {
        c.nodes[&leader]
            .propose(0, format!("cut {i}").into_bytes(), SLOW)
            .expect("appends confirm through the other follower");
    }
    let until = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < until {
        let f = c.status(follower);
        assert_eq!(
            f.groups[0].term, term,
            "the follower campaigned: {:?}",
            f.transitions
        );
        // A sampling period, so the probe does not take a core the three
        // in-process nodes need (a starved leader would be replaced).
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        c.status(follower).groups[0].stats.elections_started,
        elections_before
    );
    assert!(cut.dropped().unwrap_or(0) > 0, "the rule dropped traffic");
    assert_eq!(c.agreed_leader(), Some((leader, term)));
    drop(cut);
}

#[test]
fn stalled_leader_disk_moves_leadership() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut fss = Vec::new();
    for _ in 0..3 {
        match LoopFs::new(64) {
            Ok(fs) => fss.push(fs),
            Err(why) => {
                println!("skipping the disk stall: {why}");
                return;
            }
        }
    }
    let dirs: Vec<PathBuf> = fss.iter().map(|f| f.path().join("log")).collect();
    let c = Cluster::start(&dirs);
    let (leader, term) = c.settle();
    let i = (leader - 1) as usize;
    if let Err(why) = fss[i].freeze() {
        println!("skipping the disk stall: {why}");
        return;
    }
    let stalled = Instant::now();
    // A write waits on the frozen disk: the leader cannot confirm it.
    let r = c.nodes[&leader].propose(0, b"into the stall".to_vec(), Duration::from_millis(100));
    assert!(r.is_err(), "nothing is confirmed on a frozen disk: {r:?}");
    let (new, took) = wait_for_value("leadership to move", || {
        c.statuses().iter().find_map(|s| {
            let g = &s.groups[0];
            (s.id != leader && g.role == Role::Leader && g.term > term).then_some(s.id)
        })
    });
    println!("stall-leader-disk: node {new} leads {took:?} after node {leader}'s disk froze");
    let old = c.status(leader);
    assert_ne!(old.groups[0].role, Role::Leader);
    assert!(
        old.transitions
            .iter()
            .any(|t| t.contains("stepped down") && t.contains("disk stalled")),
        "{:?}",
        old.transitions
    );
    c.nodes[&new]
        .propose(0, b"after the stall".to_vec(), SLOW)
        .expect("the new leader confirms appends");
    // Thaw before the nodes stop: a clean stop flushes the log.
    fss[i].thaw();
    assert!(stalled.elapsed() < 3 * SLOW);
    drop(c);
}
