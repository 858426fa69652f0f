//! Malformed client frames against the daemon's real client server
//! (`node::client::server` on a running node): each bad connection gets one
//! Error frame and is closed, and the node keeps serving a well-behaved
//! client throughout. Hand-written cases and seeded random bytes.

mod common;

use quire::api::wire::{decode_response, encode_request, FRAME_BYTES_MAX, VERSION};
use quire::api::{ErrorCode, Request, Response};
use quire::client::Client;
use quire::node::client::server::ClientServer;
use quire::node::NodeHandle;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &[u8] = b"client server test token";

/// Sends `bytes` on a fresh connection, then reads until the server
/// closes; returns the error code of the server's Error frame, if any.
fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Option<ErrorCode> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    // The last frame the server wrote (frames: u32 length, then that
    // many bytes), decoded: the Error that closed the connection.
    let mut code = None;
    let mut at = 0;
    while at + 4 <= got.len() {
        let len = u32::from_le_bytes(got[at..at + 4].try_into().unwrap()) as usize;
        let Some(frame) = got.get(at..at + 4 + len) else {
            break;
        };
        if let Ok((_, Response::Error { code: c, .. })) = decode_response(frame, FRAME_BYTES_MAX) {
            code = Some(c);
        }
        at += 4 + len;
    }
    code
}

fn hello() -> Vec<u8> {
    let mut out = Vec::new();
    let req = Request::Hello {
        version: VERSION,
        token: TOKEN.to_vec(),
    };
    encode_request(1, &req, FRAME_BYTES_MAX, &mut out).unwrap();
    out
}

/// A client server on a free loopback port in front of `node`.
fn serve(node: &Arc<NodeHandle>) -> ClientServer {
    ClientServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(node),
        TOKEN,
        BTreeMap::new(),
    )
    .unwrap()
}

#[test]
fn malformed_frames_close_their_connection_and_the_node_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::single_node(dir.path());
    let server = serve(&node);
    let mut good = Client::new(vec![server.addr()], TOKEN, 1);
    let first = good.append(0, b"before").expect("served");

    // An oversized length: refused before anything is buffered.
    let mut big = hello();
    big.extend_from_slice(&(1u32 << 30).to_le_bytes());
    big.extend_from_slice(&[VERSION, 0x02, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(send_raw(server.addr(), &big), Some(ErrorCode::TooLarge));
    // An unknown opcode after a good Hello.
    let mut unknown = hello();
    unknown.extend_from_slice(&10u32.to_le_bytes());
    unknown.extend_from_slice(&[VERSION, 0x6e, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        send_raw(server.addr(), &unknown),
        Some(ErrorCode::BadRequest)
    );
    // A request before the Hello.
    let mut early = Vec::new();
    encode_request(1, &Request::Status, FRAME_BYTES_MAX, &mut early).unwrap();
    assert_eq!(
        send_raw(server.addr(), &early),
        Some(ErrorCode::Unauthorized)
    );
    // A wrong token.
    let mut wrong = Vec::new();
    let req = Request::Hello {
        version: VERSION,
        token: b"not the token".to_vec(),
    };
    encode_request(1, &req, FRAME_BYTES_MAX, &mut wrong).unwrap();
    assert_eq!(
        send_raw(server.addr(), &wrong),
        Some(ErrorCode::Unauthorized)
    );
    // A frame cut short: the server waits for the rest, sees EOF, closes.
    let mut cut = hello();
    cut.extend_from_slice(&30u32.to_le_bytes());
    cut.extend_from_slice(&[VERSION, 0x02, 2]);
    let _ = send_raw(server.addr(), &cut);
    // Seeded random bytes, with and without a good Hello in front.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for i in 0..40 {
        let mut bytes = if i % 2 == 0 { hello() } else { Vec::new() };
        let n = rng.gen_range(1..300);
        bytes.extend((0..n).map(|_| rng.gen::<u8>()));
        let _ = send_raw(server.addr(), &bytes);
    }
    // The node and the good connection were never disturbed.
    let after = good.append(0, b"after").expect("still served");
    assert!(after > first);
    // A long poll: answered once an entry at `after + 1` commits, whether
    // the append lands before or while it waits.
    let addr = server.addr();
    let writer = std::thread::spawn(move || {
        let mut c = Client::new(vec![addr], TOKEN, 2);
        c.append(0, b"tailed").expect("served")
    });
    let tailed = good.tail(0, after + 1, 1_500).unwrap();
    let index = writer.join().unwrap();
    let tailed = if tailed.is_empty() {
        good.tail(0, after + 1, 1_500).unwrap()
    } else {
        tailed
    };
    assert_eq!(
        tailed.first().map(|e| (e.index, &e.data[..])),
        Some((index, &b"tailed"[..]))
    );
    let entries = good.read(0, first, 2).unwrap();
    let data: Vec<&[u8]> = entries.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, vec![&b"before"[..], &b"after"[..]]);
    drop(server);
}

/// A sequence number older than the window the group remembers per client
/// is refused for good: the node says `SeqForgotten`, the wire says a
/// permanent code, and the client library returns at once instead of
/// retrying it until its deadline as if the cluster were unavailable.
#[test]
fn a_forgotten_sequence_number_is_refused_at_once_not_retried() {
    use quire::client::ClientError;
    use quire::node::ProposeError;
    use quire::state::dedup::WINDOW;
    let dir = tempfile::tempdir().unwrap();
    let node = common::single_node(dir.path());
    let server = serve(&node);
    // Seqs 1..=WINDOW + 1 of client 77: the group now remembers 2..
    let mut first = Client::new(vec![server.addr()], TOKEN, 77);
    let records = vec![b"r".to_vec(); WINDOW + 1];
    let indexes = first.append_all(0, &records, 8, 256).expect("appended");
    // The node's own answer for seq 1.
    let r = node.append(0, 77, 1, b"again".to_vec(), Duration::from_secs(10));
    assert_eq!(
        r,
        Err(ProposeError::SeqForgotten {
            client_id: 77,
            seq: 1
        })
    );
    // A second client under the same id starts at seq 1 again.
    let mut reused = Client::new(vec![server.addr()], TOKEN, 77);
    reused.deadline = Duration::from_secs(5);
    let started = std::time::Instant::now();
    let r = reused.append(0, b"again");
    let took = started.elapsed();
    match &r {
        Err(ClientError::Refused(ErrorCode::Conflict, why)) => {
            assert!(why.contains("older than the 4096"), "{why}")
        }
        other => panic!("a permanent refusal, got {other:?}"),
    }
    assert!(
        took < Duration::from_secs(2),
        "refused at once, not retried: {took:?}"
    );
    // Neither attempt applied: a read from the last appended record on
    // sees it, then the next append, and nothing between.
    first.append(0, b"after").unwrap();
    let last = *indexes.last().unwrap();
    let entries = first.read(0, last, 10).unwrap();
    let data: Vec<&[u8]> = entries.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, vec![&b"r"[..], &b"after"[..]]);
}
