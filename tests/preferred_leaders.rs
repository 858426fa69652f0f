//! Leaders spread over nodes, on real daemons (`quired`, 3 nodes, 3
//! groups, UDP on 127.0.0.1 and PTY cables): group `g` is led by node
//! `g + 1` once the cluster is up, and after the leader of group 0 is
//! SIGKILLed and comes back, leadership goes back to it by a handover
//! (counted in the new leader's `quire_raft_preferred_leader_transfers`).
//! Waits poll `/status` with a generous deadline; nothing is timed: the
//! hold and the handover are shown step by step in
//! `tests/scenarios/preferred_leader.txt`.

mod common;

use common::{admin_status, http, wait_for};
use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use std::path::PathBuf;
use std::time::Duration;

/// Liveness bound (elections, restarts, the 2 s hold) on a shared 2-core
/// machine, not a performance goal.
const BOUND: Duration = Duration::from_secs(30);
const ASK: Duration = Duration::from_millis(500);
const GROUPS: u32 = 3;

/// Per group, the leader every node in `nodes` names, once they agree and
/// the leader itself says it leads; `None` while they do not.
fn agreed_leaders(c: &LocalProcesses, nodes: &[u64]) -> Option<Vec<u64>> {
    let mut agreed: Vec<Option<u64>> = vec![None; GROUPS as usize];
    for id in nodes {
        let s = admin_status(c.nodes[id].admin, ASK)?;
        for (g, slot) in agreed.iter_mut().enumerate() {
            let group = &s["groups"][g];
            let leader = group["leader"].as_u64()?;
            if slot.is_some_and(|l| l != leader) {
                return None;
            }
            if leader == *id && group["role"].as_str() != Some("leader") {
                return None;
            }
            *slot = Some(leader);
        }
    }
    agreed.into_iter().collect()
}

/// A group's counter from node `id`'s `/metrics`.
fn metric(c: &LocalProcesses, id: u64, name: &str, group: u32) -> u64 {
    let (_, text) = http(c.nodes[&id].admin, "GET", "/metrics", "", BOUND).expect("/metrics");
    let series = format!("quire_{name}{{group=\"{group}\"}}");
    text.lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

#[test]
fn each_group_is_led_by_its_preferred_node_and_gets_it_back_after_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut c = LocalProcesses::prepare(dir.path(), 3, GROUPS, &exe).expect("cluster prepared");
    c.start_all().expect("daemons start");
    let all = [1, 2, 3];

    // Spread from the start: the preferred node campaigns first.
    let (leaders, took) = wait_for("every group led by its preferred node", BOUND, || {
        agreed_leaders(&c, &all).filter(|l| *l == [1, 2, 3])
    });
    println!("leaders {leaders:?} after {took:?}");
    let s = admin_status(c.nodes[&1].admin, BOUND).unwrap();
    let preferred: Vec<u64> = (0..GROUPS as usize)
        .map(|g| s["groups"][g]["preferred_leader"].as_u64().unwrap())
        .collect();
    assert_eq!(
        preferred,
        [1, 2, 3],
        "/status names each group's preferred node"
    );

    let mut client = Client::new(c.client_addrs(), &c.token, 7);
    client.deadline = BOUND;
    for g in 0..GROUPS {
        client.append(g, b"spread").expect("every group confirms");
    }

    // Node 1, leader of group 0, dies: another node leads group 0.
    c.signal(1, libc::SIGKILL);
    c.wait(1);
    let (during, _) = wait_for("group 0 led by node 2 or 3", BOUND, || {
        agreed_leaders(&c, &[2, 3]).filter(|l| l[0] != 1)
    });
    client
        .append(0, b"while node 1 is down")
        .expect("group 0 confirms without node 1");
    let stand_in = during[0];

    // It comes back: after the hold, the stand-in hands group 0 back.
    c.start(1).expect("node 1 restarts");
    let (after, took) = wait_for("group 0 led by node 1 again", BOUND, || {
        agreed_leaders(&c, &all).filter(|l| *l == [1, 2, 3])
    });
    println!("leaders {after:?} {took:?} after node 1's restart (stand-in: node {stand_in})");
    assert!(
        metric(&c, stand_in, "raft_preferred_leader_transfers", 0) >= 1,
        "node {stand_in} handed group 0 back by a transfer"
    );
    assert_eq!(
        metric(&c, 1, "raft_preferred_leader_transfers", 0),
        0,
        "the preferred leader never hands its group away"
    );
    client
        .append(0, b"after the handover")
        .expect("group 0 confirms on node 1");
    let mut reader = Client::new(c.client_addrs(), &c.token, 8);
    reader.deadline = BOUND;
    let read = reader.read(0, 0, 100).expect("group 0 reads");
    let data: Vec<&[u8]> = read.iter().map(|r| &r.data[..]).collect();
    for want in [
        &b"spread"[..],
        b"while node 1 is down",
        b"after the handover",
    ] {
        assert_eq!(
            data.iter().filter(|d| **d == want).count(),
            1,
            "{:?} once in group 0",
            String::from_utf8_lossy(want)
        );
    }
    c.stop_all();
}
