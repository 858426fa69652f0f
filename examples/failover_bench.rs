//! Leader failover on real threads: a local 3-node cluster (`LocalCluster`:
//! loopback UDP, PTY serial cables, logs in temp dirs) per trial; stop the
//! leader's node (every channel falls silent) and time, from the stop, the
//! first append confirmed by a new leader. Prints p50, p99 and max over the
//! trials, with the default timers (deadtime 250 ms, election timeout
//! 150 ms).
//!
//! cargo run --release --example failover_bench -- [trials]

use quire::consensus::Role;
use quire::node::LocalCluster;
use std::time::{Duration, Instant};

fn main() {
    let trials: usize = std::env::args()
        .nth(1)
        .map_or(20, |s| s.parse().expect("trials"));
    let mut failover = Vec::new();
    let mut detection = Vec::new();
    for trial in 0..trials {
        let dir = tempfile::tempdir().expect("temp dir");
        let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
        let mut c =
            LocalCluster::start(&logs, &[0], &[], dir.path(), |_| {}).expect("cluster starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        let (leader, term) = loop {
            if c.all_links_up() {
                if let Some(l) = c.agreed_leader() {
                    if c.nodes[&l.0]
                        .propose(0, b"warm".to_vec(), Duration::from_secs(5))
                        .is_ok()
                    {
                        break l;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "trial {trial}: the cluster never settled"
            );
            std::thread::yield_now();
        };
        let stopped = Instant::now();
        c.stop_node(leader);
        let mut down_at = None;
        let took = loop {
            let all = c.statuses();
            if down_at.is_none()
                && all
                    .iter()
                    .any(|s| s.peer(leader).is_some_and(|p| p.status == "down"))
            {
                down_at = Some(stopped.elapsed());
            }
            let new = all
                .iter()
                .find(|s| s.groups[0].role == Role::Leader && s.groups[0].term > term)
                .map(|s| s.id);
            if let Some(n) = new {
                let r = c.nodes[&n].propose(0, b"after".to_vec(), Duration::from_millis(500));
                if r.is_ok() {
                    break stopped.elapsed();
                }
            }
            assert!(
                stopped.elapsed() < Duration::from_secs(20),
                "trial {trial}: no new leader confirmed an append"
            );
        };
        println!(
            "trial {trial}: node {leader} stopped; first append confirmed by a new leader after {} ms (leader declared down after {} ms)",
            took.as_millis(),
            down_at.map_or("-".into(), |d| d.as_millis().to_string())
        );
        failover.push(took.as_millis() as u64);
        if let Some(d) = down_at {
            detection.push(d.as_millis() as u64);
        }
    }
    let spread = |v: &mut Vec<u64>| {
        v.sort_unstable();
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        format!(
            "p50 {} ms, p99 {} ms, max {} ms",
            at(0.5),
            at(0.99),
            at(1.0)
        )
    };
    println!("failover over {trials} trials: {}", spread(&mut failover));
    if !detection.is_empty() {
        println!("declared down: {}", spread(&mut detection));
    }
}
