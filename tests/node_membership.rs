//! Replacing a lost disk safely: a replica whose log is gone must not come
//! back as a voter that forgot its vote and its acknowledged entries. The
//! procedure (HARDWARE.md): remove it from the group, start it on the empty
//! log, add it back as a learner, wait for it to catch up, promote it.
//! Three in-process nodes; the group serves throughout, and the replaced
//! replica ends with the same applied state as the leader.

mod common;

use quire::consensus::MembershipChange;
use quire::node::LocalCluster;
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(10);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, SLOW, f).0
}

#[test]
fn a_replica_with_a_new_empty_disk_rejoins_as_learner_then_voter() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut c = LocalCluster::start(&logs, &[0], &[], dir.path(), |_| {}).expect("cluster starts");
    wait_for("every link up", || c.all_links_up().then_some(()));
    let (leader, _) = wait_for("a leader", || c.agreed_leader());
    for i in 0..20 {
        c.nodes[&leader]
            .propose(0, format!("before {i}").into_bytes(), SLOW)
            .expect("confirmed");
    }
    let victim = *c.nodes.keys().find(|&&n| n != leader).unwrap();

    // The disk dies: the node goes down and its log is gone.
    c.stop_node(victim);
    let log = c.spec(victim).unwrap().groups[0].dir.clone();
    std::fs::remove_dir_all(&log).unwrap();
    // 1. Out of the group while its disk is replaced.
    c.nodes[&leader]
        .change_membership(0, MembershipChange::Remove(victim), SLOW)
        .expect("removed");
    // 2. Back on an empty log: it must not vote, and cannot disrupt.
    c.restart_node(victim).unwrap();
    // 3. As a learner: it catches up without counting in any quorum.
    let at = c.nodes[&leader]
        .change_membership(0, MembershipChange::AddLearner(victim), SLOW)
        .expect("learner added");
    let learner = wait_for("the learner to catch up", || {
        let s = c.nodes[&victim].status()?;
        let g = &s.groups[0];
        (g.applied >= at && g.learners.contains(&victim)).then(|| g.clone())
    });
    assert!(!learner.voters.contains(&victim));
    // 4. Promoted once caught up.
    c.nodes[&leader]
        .change_membership(0, MembershipChange::AddVoter(victim), SLOW)
        .expect("promoted");
    for i in 0..5 {
        c.nodes[&leader]
            .propose(0, format!("after {i}").into_bytes(), SLOW)
            .expect("confirmed");
    }
    let lead = c.nodes[&leader].status().unwrap().groups[0].clone();
    let back = wait_for("the replica to apply everything", || {
        let g = c.nodes[&victim].status()?.groups[0].clone();
        (g.applied == lead.applied).then_some(g)
    });
    assert!(back.voters.contains(&victim), "{:?}", back.voters);
    assert_eq!(
        back.applied_hash, lead.applied_hash,
        "same state as the leader"
    );
    assert_eq!(back.leader, Some(leader), "no election happened");
    assert_eq!(
        back.stats.elections_started, 0,
        "it never campaigned for real"
    );
}
