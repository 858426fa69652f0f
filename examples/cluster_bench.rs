//! The whole path: a local 3-node cluster of real daemon processes
//! (`node::processes`, loopback UDP, PTY serial cables, logs under DIR),
//! driven by the client library:
//! 1. latency with 1 append in flight (1 KiB records): p50, p99;
//! 2. throughput with 256 appends in flight on one connection (1 KiB
//!    records, one record per request): confirmed appends per second.
//!
//! cargo build --release --bin quire --example cluster_bench
//! target/release/examples/cluster_bench DIR [latency_appends] [throughput_appends]

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("target/cluster-bench", |s| s));
    let lat_n: usize = args.get(2).map_or(2000, |s| s.parse().expect("count"));
    let thr_n: usize = args.get(3).map_or(50_000, |s| s.parse().expect("count"));
    let exe = std::env::current_exe()
        .expect("own path")
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("quire"))
        .expect("target/<profile>/quire");
    assert!(
        exe.exists(),
        "build it first: cargo build --release --bin quire"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let mut c = LocalProcesses::prepare(&dir, 3, 1, &exe).expect("prepared");
    c.start_all().expect("started");
    let mut client = Client::new(c.client_addrs(), &c.token, 42);
    client.deadline = Duration::from_secs(30);
    client.append(0, b"warm-up").expect("a leader");
    let record = vec![0xa5u8; 1024];

    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..lat_n {
        let t = Instant::now();
        client.append(0, &record).expect("confirmed");
        h.record(t.elapsed().as_micros() as u64).expect("in range");
    }
    println!(
        "1 in flight, 1 KiB: {lat_n} appends, latency p50 {} us, p99 {} us, max {} us",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    );

    let records = vec![record; thr_n];
    let t = Instant::now();
    let indexes = client.append_all(0, &records, 256, 1).expect("confirmed");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(indexes.len(), thr_n);
    println!(
        "256 in flight, 1 KiB: {thr_n} appends confirmed in {secs:.2} s: {:.0} appends/s, {:.1} MB/s",
        thr_n as f64 / secs,
        thr_n as f64 * 1024.0 / secs / 1e6
    );
    let stopped = c.stop_all();
    assert!(
        stopped.iter().all(|(_, code)| *code == Some(0)),
        "{stopped:?}"
    );
}
