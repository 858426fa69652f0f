//! The pipelined producer (`quire::client::Producer`) from one thread:
//! sends N records of 1 KiB to group 0 with up to 256 requests in flight
//! on the leader's connection, batches of up to 16 KiB lingering 200 µs,
//! takes each outcome back by its ticket in the order sent, and prints
//! confirmed appends per second and what the producer did.
//!
//! Against a local 3-node cluster of real daemons it starts (as `quire up`
//! lays them out, under DIR, stopped at the end):
//!
//! cargo build --release --bin quire --example producer
//! target/release/examples/producer local DIR [records]
//!
//! Against a running cluster (`quire up` prints its addresses; the token
//! is the cluster directory's `client.token`):
//!
//! target/release/examples/producer 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 DIR/client.token [records]

use quire::client::{Producer, ProducerConfig, SendError};
use quire::node::local::processes::LocalProcesses;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: producer local DIR [records] | producer ADDR,... TOKEN_FILE [records]";
    let (first, second) = match (args.get(1), args.get(2)) {
        (Some(a), Some(b)) => (a.clone(), b.clone()),
        _ => panic!("{usage}"),
    };
    let n: u64 = args.get(3).map_or(100_000, |s| s.parse().expect("a count"));
    let mut local = None;
    let (addrs, token): (Vec<SocketAddr>, Vec<u8>) = if first == "local" {
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
        let dir = std::path::PathBuf::from(&second);
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = LocalProcesses::prepare(&dir, 3, 1, &exe).expect("prepared");
        c.start_all().expect("started");
        let a = (c.client_addrs(), c.token.clone());
        local = Some(c);
        a
    } else {
        let addrs = first
            .split(',')
            .map(|a| {
                a.to_socket_addrs()
                    .expect("an address")
                    .next()
                    .expect("resolves")
            })
            .collect();
        let token = std::fs::read(&second).expect("the token file");
        (addrs, token.trim_ascii_end().to_vec())
    };

    let config = ProducerConfig {
        in_flight_max: 256,
        batch_bytes_max: 16 << 10,
        linger_us: 200,
        deadline_ms: 30_000,
        ..ProducerConfig::default()
    };
    let id = quire::client::random_client_id().expect("a client id");
    let mut p = Producer::new(addrs, &token, id, config);
    // The first record finds the leader (and waits for an election).
    let t = p.send(0, b"warm-up").expect("taken");
    p.wait(t).expect("a leader");

    let record = vec![0xa5u8; 1024];
    let (mut ok, mut failed, mut last_index) = (0u64, 0u64, 0u64);
    let mut take = |c: quire::client::Completion| match c.result {
        Ok(index) => {
            // In the order sent, and, with no failover, in the log's order.
            assert!(index > last_index, "out of order");
            last_index = index;
            ok += 1;
        }
        Err(e) => {
            eprintln!("ticket {}: {e}", c.ticket.number());
            failed += 1;
        }
    };
    let started = Instant::now();
    for _ in 0..n {
        loop {
            match p.send(0, &record) {
                Ok(_) => break,
                // pending_max outcomes wait: take some, then send again.
                Err(SendError::Full) => {
                    while let Some(c) = p.poll(Duration::from_millis(100)) {
                        take(c);
                        if p.pending() < p.config().pending_max / 2 {
                            break;
                        }
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    for c in p.flush() {
        take(c);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} records of 1 KiB: {ok} confirmed, {failed} failed in {secs:.2} s: {:.0} appends/s; {:?}",
        ok as f64 / secs,
        p.stats()
    );
    if let Some(mut c) = local {
        c.stop_all();
    }
}
