//! Do snapshots pause appends? A local 3-node cluster of real daemon
//! processes (`node::processes`), a queue filled with MESSAGES messages,
//! then appends with one in flight while every node snapshots every
//! INTERVAL ms. A monitor polls each node's /status-equivalent (the
//! client protocol's Status) and notes each snapshot's window (adoption
//! time minus its duration); appends whose flight overlaps a window on any
//! node count as "during", the rest as "outside". Prints p50/p99/max of
//! both and their p99 ratio (the goal: at most 2).
//!
//! cargo build --release --bin quire --example snapshot_bench
//! target/release/examples/snapshot_bench DIR [messages] [seconds] [interval_ms]

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("target/snapshot-bench", |s| s));
    let messages: u64 = args.get(2).map_or(1_000_000, |s| s.parse().expect("count"));
    let seconds: u64 = args.get(3).map_or(20, |s| s.parse().expect("seconds"));
    let interval_ms: u64 = args.get(4).map_or(3000, |s| s.parse().expect("ms"));
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
    for node in c.nodes.values() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .expect("config");
        // Snapshots by time only, and room for the snapshot a restarted
        // follower might need.
        writeln!(
            f,
            "\n[snapshot]\nentries = 1000000000\ninterval_ms = {interval_ms}\n"
        )
        .expect("config");
    }
    c.start_all().expect("started");
    let addrs = c.client_addrs();
    let mut client = Client::new(addrs.clone(), &c.token, 42);
    client.deadline = Duration::from_secs(60);
    client.queue_create(0, "bench", 1000).expect("queue");
    let t = Instant::now();
    let batch: Vec<Vec<u8>> = (0..1000)
        .map(|i| format!("message {i:08}").into_bytes())
        .collect();
    for _ in 0..messages / 1000 {
        client.produce(0, "bench", &batch).expect("produce");
    }
    println!(
        "queue filled: {messages} messages of 16 bytes in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // The monitor: each node's snapshot windows, as (start, end) instants.
    let stop = Arc::new(AtomicBool::new(false));
    let token = c.token.clone();
    let monitor = {
        let stop = Arc::clone(&stop);
        let addrs = addrs.clone();
        std::thread::spawn(move || {
            let mut m = Client::new(addrs.clone(), &token, 43);
            let mut taken = vec![None::<u64>; addrs.len()];
            let mut windows = Vec::new();
            let mut sizes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for (i, seen) in taken.iter_mut().enumerate() {
                    let Ok(json) = m.status(i) else { continue };
                    let now = Instant::now();
                    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
                    let s = &v["groups"][0]["snapshot"];
                    let n = s["taken"].as_u64().unwrap_or(0);
                    if seen.is_some_and(|old| n > old) {
                        let us = s["duration_us"].as_u64().unwrap_or(0);
                        windows.push((now - Duration::from_micros(us), now));
                        sizes.push((
                            s["bytes"].as_u64().unwrap_or(0),
                            us,
                            s["capture_us"].as_u64().unwrap_or(0),
                        ));
                    }
                    *seen = Some(n);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (windows, sizes)
        })
    };

    let record = vec![0xa5u8; 1024];
    let mut samples = Vec::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        client.append(0, &record).expect("confirmed");
        samples.push((t, t.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let (windows, sizes) = monitor.join().expect("monitor");

    let mut during = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut outside = during.clone();
    for &(start, took) in &samples {
        let finish = start + took;
        let overlaps = windows.iter().any(|&(a, b)| start < b && finish > a);
        let h = if overlaps { &mut during } else { &mut outside };
        h.record(took.as_micros() as u64).expect("in range");
    }
    for (bytes, us, capture) in &sizes {
        println!(
            "snapshot: {:.1} MB, {:.0} ms capture to adoption, {capture} us on the loop",
            *bytes as f64 / 1e6,
            *us as f64 / 1e3
        );
    }
    let show = |name: &str, h: &hdrhistogram::Histogram<u64>| {
        println!(
            "{name}: {} appends, p50 {} us, p99 {} us, max {} us",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        );
    };
    show("outside snapshots", &outside);
    show("during snapshots ", &during);
    if !during.is_empty() && !outside.is_empty() {
        println!(
            "p99 during / outside: {:.2}",
            during.value_at_quantile(0.99) as f64 / outside.value_at_quantile(0.99) as f64
        );
    }
    c.stop_all();
}
