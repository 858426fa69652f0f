//! A node's groups on several cores: group `g` runs on its own pinned loop
//! (`cores[g % len]`); the control loop (serial ports, detector, heartbeat)
//! shares what it learns with the others over channels. Three nodes with
//! two groups each on cores 0 and 1: both groups elect and confirm
//! appends, and when the node leading the worker core's group stops, that
//! group fails over too, driven by the detector on the control loop.

mod common;

use quire::consensus::Role;
use quire::node::LocalCluster;
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(10);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, SLOW, f).0
}

#[test]
fn groups_on_two_cores_elect_confirm_and_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    // Elections by Raft's own timer take 1.5 s or more here, so a quick failover
    // can only come from the detector, which runs on the control loop.
    let mut c = LocalCluster::start(&logs, &[0, 1], &[0, 1], dir.path(), |spec| {
        spec.raft.election_timeout_ms = 1_500;
        spec.raft.heartbeat_interval_ms = 50;
    })
    .expect("cluster starts");
    wait_for("every link up", || c.all_links_up().then_some(()));
    for i in 0..2 {
        let (leader, _) = wait_for("a leader", || c.agreed_leader_of(i));
        c.nodes[&leader]
            .propose(i as u32, format!("to group {i}").into_bytes(), SLOW)
            .expect("confirmed");
    }
    // The heartbeat carries both cores' groups: peers see group 1's
    // status, which only the worker loop knows.
    let s = c.nodes[&1].status().unwrap();
    assert_eq!(s.groups.len(), 2);
    assert!(s.peers.iter().all(|p| p.status == "up"), "{:?}", s.peers);

    let (leader, term) = c.agreed_leader_of(1).unwrap();
    c.stop_node(leader);
    let new = wait_for("group 1 to fail over", || {
        c.statuses().iter().find_map(|s| {
            let g = &s.groups[1];
            (g.role == Role::Leader && g.term > term).then_some(s.id)
        })
    });
    c.nodes[&new]
        .propose(1, b"after failover".to_vec(), SLOW)
        .expect("the new leader of group 1 confirms");
    let fast: u64 = c
        .statuses()
        .iter()
        .map(|s| s.groups[1].stats.fast_campaigns)
        .sum();
    assert!(
        fast >= 1,
        "group 1 failed over by the detector's word, forwarded to its core"
    );
    // Group 0 serves as well (its leader may have moved too).
    let (l0, _) = wait_for("group 0's leader", || c.agreed_leader_of(0));
    c.nodes[&l0]
        .propose(0, b"group 0 still".to_vec(), SLOW)
        .expect("group 0 confirms");
}

/// More groups than a heartbeat holds (8): twelve groups on two cores per
/// node. Successive heartbeats take turns over the groups (each built in
/// increasing group order, as the format demands, or the control loop
/// would stop), and every group elects and confirms.
#[test]
fn twelve_groups_take_turns_in_the_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let groups: Vec<u32> = (0..12).collect();
    let c =
        LocalCluster::start(&logs, &groups, &[0, 1], dir.path(), |_| {}).expect("cluster starts");
    wait_for("every link up", || c.all_links_up().then_some(()));
    for i in 0..groups.len() {
        let (leader, _) = wait_for("a leader", || c.agreed_leader_of(i));
        c.nodes[&leader]
            .propose(i as u32, b"x".to_vec(), SLOW)
            .expect("confirmed");
    }
}
