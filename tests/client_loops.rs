//! Client connections served on the node's event loops
//! (`node::client::conns`): one connection reaches groups on every core;
//! idle connections cost no thread; a client that does not read its
//! answers is stopped at a bound instead of growing the daemon; a burst
//! past the in-flight bound is read on as answers go, and stored as sent.

mod common;

use quire::api::wire::{decode_response, encode_request, FRAME_BYTES_MAX, VERSION};
use quire::api::{Request, Response};
use quire::client::Client;
use quire::node::client::server::ClientServer;
use quire::node::{GroupSpec, NodeHandle, NodeSpec};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &[u8] = b"client loops test token";

/// A field of `/proc/PID/status` (`Threads`, `VmRSS` in kB), as a number.
fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The daemon's threads that live as long as it does: without the helper
/// threads of offloaded jobs (a snapshot written, an image chunk read or
/// staged, a scrub read, a free), which come and go with the log's work,
/// whatever the connections (a scrub read made this flaky).
fn lasting_threads(pid: u32) -> Vec<String> {
    const JOBS: [&str; 6] = [
        "quire-free",
        "quire-snap-",
        "quire-image-",
        "quire-stage-",
        "quire-unstage-",
        "quire-scrub-",
    ];
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads");
    let mut names: Vec<String> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !JOBS.iter().any(|j| n.starts_with(j)))
        .collect();
    names.sort();
    names
}

/// Lets this process hold `n` more descriptors (each test connection is one).
fn allow_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit read and write one live rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(lim.rlim_cur.max(n + 512));
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn frame(id: u64, req: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(id, req, FRAME_BYTES_MAX, &mut out).unwrap();
    out
}

/// Reads one whole response frame.
fn read_response(s: &mut TcpStream) -> (u64, Response) {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("a frame length");
    let mut f = len.to_vec();
    f.resize(4 + u32::from_le_bytes(len) as usize, 0);
    s.read_exact(&mut f[4..]).expect("the frame");
    decode_response(&f, FRAME_BYTES_MAX).expect("a response")
}

/// A connection that has completed its Hello with `token`.
fn greeted(addr: SocketAddr, token: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = Request::Hello {
        version: VERSION,
        token: token.to_vec(),
    };
    s.write_all(&frame(1, &hello)).unwrap();
    s
}

/// A one-node cluster leading groups 0 and 1, group g on core g % 2 (two
/// loops, so whichever serves a connection, one group's requests cross to
/// the other loop), and its client server.
fn two_groups_on_two_cores(dir: &std::path::Path) -> (Arc<NodeHandle>, ClientServer) {
    let groups = (0..2)
        .map(|g| GroupSpec {
            group: g,
            dir: dir.join(format!("g{g}")),
        })
        .collect();
    let spec = NodeSpec::loopback(1, vec![1], groups, 0);
    let node = Arc::new(NodeHandle::spawn_on(spec, &[0, 1]).unwrap());
    for g in 0..2 {
        common::wait_for("the group to lead", Duration::from_secs(10), || {
            node.propose(g, b"x".to_vec(), Duration::from_secs(1)).ok()
        });
    }
    let server = ClientServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(&node),
        TOKEN,
        BTreeMap::new(),
    )
    .unwrap();
    (node, server)
}

#[test]
fn one_connection_reaches_groups_on_both_cores_and_answers_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, server) = two_groups_on_two_cores(dir.path());
    let mut client = Client::new(vec![server.addr()], TOKEN, 7);
    let records: Vec<Vec<u8>> = (0..200).map(|i| format!("r{i}").into_bytes()).collect();
    for g in 0..2u32 {
        let one = client
            .append(g, format!("first of {g}").as_bytes())
            .unwrap();
        let indexes = client.append_all(g, &records, 32, 8).unwrap();
        // In order, one index each, after the lone append.
        assert!(indexes.windows(2).all(|w| w[0] < w[1]), "{indexes:?}");
        assert!(indexes[0] > one);
        let read = client.read(g, one, 1000).unwrap();
        let data: Vec<&[u8]> = read.iter().map(|e| &e.data[..]).collect();
        assert_eq!(data[0], format!("first of {g}").as_bytes());
        assert_eq!(
            &data[1..],
            records.iter().map(|r| r.as_slice()).collect::<Vec<_>>()
        );
    }
    // A tail on group 1 waits on its loop and is answered when an append
    // from another connection lands.
    let next = client.read(1, 1, 10_000).unwrap().last().unwrap().index + 1;
    let addr = server.addr();
    let tail = std::thread::spawn(move || {
        let mut waiter = Client::new(vec![addr], TOKEN, 8);
        waiter.tail(1, next, 10_000)
    });
    // Appends until the tail is answered (whether it was waiting yet or
    // not, it reads from `next`, which the first of these takes).
    let mut other = Client::new(vec![server.addr()], TOKEN, 9);
    // Addresses are ordered, not dense: the first lands at or after it.
    let first = other.append(1, b"for the tail").unwrap();
    assert!(first >= next, "{first} before {next}");
    while !tail.is_finished() {
        other.append(1, b"more").unwrap();
    }
    let got = tail.join().unwrap().unwrap();
    assert_eq!(got[0].index, first);
    assert_eq!(got[0].data[..], b"for the tail"[..]);
    // Leaders and Status gather both loops.
    let leaders = client.leaders(0).unwrap();
    assert_eq!(leaders.len(), 2, "{leaders:?}");
    let status: serde_json::Value = serde_json::from_str(&client.status(0).unwrap()).unwrap();
    assert_eq!(status["groups"].as_array().map(Vec::len), Some(2));
}

#[test]
fn two_thousand_idle_connections_cost_no_thread_and_a_client_still_appends() {
    const IDLE: usize = 2000;
    allow_open_files(IDLE as u64);
    let dir = tempfile::tempdir().unwrap();
    let c = common::three_daemons_tuned(dir.path(), |config| {
        let mut t = std::fs::read_to_string(config).unwrap();
        // Into the config's last section, [client].
        t.push_str("connections_per_source_max = 4096\n");
        std::fs::write(config, t).unwrap();
    });
    common::agreed_leader(&c, Duration::from_secs(20));
    let node = &c.nodes[&1];
    let pid = node.child.as_ref().expect("node 1 runs").id();
    let threads_before = lasting_threads(pid);
    let mut idle = Vec::with_capacity(IDLE);
    // In rounds smaller than `unauthenticated_max` (64): a round's Hellos
    // are all answered before the next round connects.
    while idle.len() < IDLE {
        let round: Vec<TcpStream> = (0..50).map(|_| greeted(node.client, &c.token)).collect();
        for mut s in round {
            match read_response(&mut s) {
                (1, Response::HelloOk { node: 1 }) => idle.push(s),
                other => panic!("Hello {} answered {other:?}", idle.len()),
            }
        }
    }
    let threads_after = lasting_threads(pid);
    assert_eq!(
        threads_after, threads_before,
        "{IDLE} idle connections changed quired's thread count"
    );
    // They are all held, authenticated.
    let (_, metrics) =
        common::http(node.admin, "GET", "/metrics", "", Duration::from_secs(10)).unwrap();
    let held: u64 = metrics
        .lines()
        .find(|l| l.contains("client_connections_authenticated") && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .expect("the authenticated-connections metric");
    assert!(held >= IDLE as u64, "{held} authenticated");
    // A client still appends, and an idle connection still answers.
    let mut client = Client::new(c.client_addrs(), &c.token, 77);
    client.append(0, b"among the idle").expect("confirmed");
    let s = &mut idle[IDLE / 2];
    s.write_all(&frame(2, &Request::Leaders)).unwrap();
    assert!(matches!(read_response(s), (2, Response::LeaderMap { .. })));
}

#[test]
fn a_client_that_reads_no_answers_is_held_at_a_bound_not_buffered() {
    // What the daemon may hold for one connection: its unwritten answers
    // (1 MiB) plus 8 reads in flight (1 MiB each here), with room for the
    // allocator; a daemon that buffered every answer would hold the
    // answers to every read sent (tens of GiB by the end).
    const RSS_GROWTH_BOUND_KB: u64 = 64 << 10;
    const ENTRY_BYTES: usize = 16 << 10;
    let dir = tempfile::tempdir().unwrap();
    let c = common::three_daemons(dir.path());
    let leader = common::agreed_leader(&c, Duration::from_secs(20));
    let node = &c.nodes[&leader];
    let pid = node.child.as_ref().expect("the leader runs").id();
    let mut client = Client::new(c.client_addrs(), &c.token, 5);
    let records = vec![vec![7u8; ENTRY_BYTES]; 64];
    let first = client.append_all(0, &records, 8, 8).expect("prefill")[0];
    let rss_before = proc_status(pid, "VmRSS");

    let mut raw = greeted(node.client, &c.token);
    assert!(matches!(
        read_response(&mut raw),
        (1, Response::HelloOk { .. })
    ));
    raw.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    // Sixteen reads of 1 MiB answers and one small append per chunk.
    let mut chunk = Vec::new();
    let mut id = 2;
    let mut blocked = false;
    for round in 0..40_000u64 {
        chunk.clear();
        for _ in 0..16 {
            let read = Request::Read {
                group: 0,
                from: first,
                max_entries: 64,
                max_bytes: 1 << 20,
                stale: false,
            };
            chunk.extend(frame(id, &read));
            id += 1;
        }
        let append = Request::Append {
            group: 0,
            client_id: 6,
            seq: round + 1,
            data: b"unread".to_vec().into(),
        };
        chunk.extend(frame(id, &append));
        id += 1;
        match raw.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                blocked = true;
                break;
            }
            Err(e) => panic!("the daemon dropped the connection: {e}"),
        }
    }
    assert!(
        blocked,
        "the daemon read every request of a client that reads no answers"
    );
    let rss_after = proc_status(pid, "VmRSS");
    assert!(
        rss_after < rss_before + RSS_GROWTH_BOUND_KB,
        "resident memory grew from {rss_before} kB to {rss_after} kB"
    );
    // The connection still works once its client reads: the first
    // answers are there, in order.
    assert!(matches!(
        read_response(&mut raw),
        (2, Response::Entries { .. })
    ));
    // And the node serves everyone else.
    drop(raw);
    client.append(0, b"after the stuck one").expect("confirmed");
}

#[test]
fn a_burst_past_the_in_flight_bound_is_read_in_order_and_stored_as_sent() {
    // Three times the requests a connection may have in flight, sent in
    // one go: the loop stops reading at the bound, serves, reads on; every
    // record reaches the log with the bytes sent (records are taken
    // straight from the connection's read buffer, so a buffer reused too
    // early would show here as wrong data). Both groups: one on the
    // connection's loop, one on the other core's.
    const APPENDS: u64 = 3 * quire::api::session::REQUESTS_IN_FLIGHT_MAX as u64;
    let dir = tempfile::tempdir().unwrap();
    let (_node, server) = two_groups_on_two_cores(dir.path());
    let record = |seq: u64| format!("record {seq} ").repeat(1 + (seq % 7) as usize * 20);
    let mut raw = greeted(server.addr(), TOKEN);
    assert!(matches!(
        read_response(&mut raw),
        (1, Response::HelloOk { .. })
    ));
    let mut burst = Vec::new();
    for seq in 1..=APPENDS {
        let append = Request::Append {
            group: (seq % 2) as u32,
            client_id: 11,
            seq,
            data: record(seq).into_bytes().into(),
        };
        burst.extend(frame(seq + 1, &append));
    }
    let mut writer = raw.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&burst));
    // Each request answered once (across groups in any order: each
    // group's loop answers when its own records are confirmed).
    let mut index_of = BTreeMap::new();
    for _ in 0..APPENDS {
        match read_response(&mut raw) {
            (id, Response::Appended { index }) if (2..APPENDS + 2).contains(&id) => {
                assert!(index_of.insert(id - 1, index).is_none(), "{id} twice");
            }
            other => panic!("{other:?}"),
        }
    }
    sender.join().unwrap().expect("the burst was sent");
    let mut client = Client::new(vec![server.addr()], TOKEN, 12);
    for g in 0..2u64 {
        let mine: Vec<u64> = (1..=APPENDS).filter(|s| s % 2 == g).collect();
        let from = index_of[&mine[0]];
        let mut got = Vec::new();
        while got.len() < mine.len() {
            let next = got
                .last()
                .map_or(from, |e: &quire::client::Entry| e.index + 1);
            got.extend(client.read(g as u32, next, 4096).unwrap());
        }
        for (seq, entry) in mine.iter().zip(&got) {
            assert_eq!(entry.index, index_of[seq], "seq {seq} of group {g}");
            assert_eq!(entry.data[..], *record(*seq).as_bytes(), "seq {seq}");
        }
    }
}
