//! Idempotent appends on a running cluster: a retried append (same client
//! id and sequence number) is applied once and answered with the original
//! index, on the leader that took it and on a new leader after failover
//! (the dedup table is replicated state). Snapshots are taken every few
//! entries here, so the table also travels through compaction.

mod common;

use quire::consensus::Role;
use quire::node::LocalCluster;
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(10);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, SLOW, f).0
}

#[test]
fn a_retried_append_is_applied_once_even_across_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut c = LocalCluster::start(&logs, &[0], &[], dir.path(), |spec| {
        spec.raft.snapshot_entries = 8;
    })
    .expect("cluster starts");
    let (leader, term) = wait_for("a leader", || c.agreed_leader());
    let n = &c.nodes[&leader];
    let first = n.append(0, 42, 1, b"one".to_vec(), SLOW).unwrap();
    let again = n.append(0, 42, 1, b"one".to_vec(), SLOW).unwrap();
    assert_eq!(again, first, "a retry is answered with the original index");
    let second = n.append(0, 42, 2, b"two".to_vec(), SLOW).unwrap();
    assert!(second > first);
    // Enough appends for several snapshots on every node.
    for seq in 3..40 {
        n.append(0, 42, seq, format!("{seq}").into_bytes(), SLOW)
            .unwrap();
    }
    let applied_once = n.status().unwrap().groups[0].applied_hash;

    c.stop_node(leader);
    let new = wait_for("a new leader", || {
        c.statuses().iter().find_map(|s| {
            (s.groups[0].role == Role::Leader && s.groups[0].term > term).then_some(s.id)
        })
    });
    let retry = c.nodes[&new]
        .append(0, 42, 2, b"two".to_vec(), SLOW)
        .unwrap();
    assert_eq!(retry, second, "the new leader knows it was applied");
    // Applying the duplicates changed nothing: every survivor's state
    // equals the old leader's after the first 39 appends (the new
    // leader's no-op carries no data).
    let hashes = wait_for("the survivors to apply everything", || {
        let all = c.statuses();
        let applied: Vec<_> = all.iter().map(|s| s.groups[0].applied).collect();
        let retry_entry = quire::state::dedup::address_index(retry);
        (applied.iter().all(|&a| a >= retry_entry) && applied.windows(2).all(|w| w[0] == w[1]))
            .then(|| {
                all.iter()
                    .map(|s| s.groups[0].applied_hash)
                    .collect::<Vec<_>>()
            })
    });
    assert!(
        hashes.iter().all(|&h| h == applied_once),
        "{hashes:?} vs {applied_once}"
    );
}
