//! The blocking shell and the producer over the retry policy, against a
//! scripted node on a loopback socket: what the client sends on each try,
//! across a dropped connection or a refused batch. No sleeps: a dropped
//! connection is retried at once, a refusal after the policy's backoff.

use super::{Client, Producer, ProducerConfig, Ticket};
use crate::api::{Incoming, Request, Response, ServerConfig, ServerSession};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

const TOKEN: &[u8] = b"test-token";

/// A node that answers the requests it gets, over however many
/// connections, with `script` in order: `None` drops the connection
/// instead of answering. Returns every request it got once the script is
/// played out.
fn scripted_node(script: Vec<Option<Response>>) -> (SocketAddr, JoinHandle<Vec<Request>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = Arc::new(ServerConfig::new(1, TOKEN));
    let node = std::thread::spawn(move || {
        let mut script = script.into_iter();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        'accept: for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut session = ServerSession::new(Arc::clone(&cfg));
            loop {
                let n = stream.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed before the script ended");
                assert_eq!(session.push(&buf[..n]), n);
                while let Some(incoming) = session.poll().unwrap() {
                    match incoming {
                        Incoming::Handshake { reply, .. } => stream.write_all(&reply).unwrap(),
                        Incoming::Request { id, req } => {
                            seen.push(req);
                            match script.next() {
                                None => return seen,
                                Some(None) => continue 'accept, // drops `stream`
                                Some(Some(resp)) => {
                                    stream.write_all(&session.respond(id, &resp)).unwrap();
                                    if script.len() == 0 {
                                        return seen;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        seen
    });
    (addr, node)
}

/// (client id, seq) of an append.
fn identity(req: &Request) -> (u64, u64) {
    match req {
        Request::Append { client_id, seq, .. } => (*client_id, *seq),
        other => panic!("not an append: {other:?}"),
    }
}

#[test]
fn an_append_retried_after_a_lost_connection_keeps_its_client_id_and_seq() {
    let (addr, node) = scripted_node(vec![
        None, // the first try's connection breaks before the answer
        Some(Response::Appended { index: 11 }),
        Some(Response::Appended { index: 12 }),
    ]);
    let mut client = Client::new(vec![addr], TOKEN, 77);
    assert_eq!(client.append(0, b"a"), Ok(11));
    assert_eq!(client.append(0, b"b"), Ok(12));
    let seen = node.join().unwrap();
    let ids: Vec<(u64, u64)> = seen.iter().map(identity).collect();
    // The retry is the same request; the next append takes the next seq.
    assert_eq!(ids, [(77, 1), (77, 1), (77, 2)]);
    assert_eq!(seen[0], seen[1]);
}

/// (client id, first seq, records) of an append or a batch.
fn records_of(req: &Request) -> (u64, u64, usize) {
    match req {
        Request::Append { client_id, seq, .. } => (*client_id, *seq, 1),
        Request::AppendBatch {
            client_id,
            first_seq,
            items,
            ..
        } => (*client_id, *first_seq, items.len()),
        other => panic!("not an append: {other:?}"),
    }
}

#[test]
fn a_producer_retries_after_a_lost_connection_with_the_same_client_id_and_seq() {
    let (addr, node) = scripted_node(vec![
        None, // the first try's connection breaks before the answer
        Some(Response::Appended { index: 11 }),
        Some(Response::Appended { index: 12 }),
    ]);
    let config = ProducerConfig {
        in_flight_max: 1,
        batch_records_max: 1,
        ..ProducerConfig::default()
    };
    let mut p = Producer::new(vec![addr], TOKEN, 77, config);
    let a = p.send(0, b"a").unwrap();
    let b = p.send(0, b"b").unwrap();
    let got: Vec<_> = p
        .flush()
        .into_iter()
        .map(|c| (c.ticket, c.result))
        .collect();
    assert_eq!(got, [(a, Ok(11)), (b, Ok(12))]);
    let seen = node.join().unwrap();
    let ids: Vec<(u64, u64)> = seen.iter().map(identity).collect();
    assert_eq!(ids, [(77, 1), (77, 1), (77, 2)]);
}

/// A flush of `p` answers `tickets` in order, each at its index of
/// `indexes`.
fn assert_flushed_at(p: &mut Producer, tickets: &[Ticket], indexes: impl IntoIterator<Item = u64>) {
    let got: Vec<_> = p
        .flush()
        .into_iter()
        .map(|c| (c.ticket, c.result))
        .collect();
    let want: Vec<_> = tickets
        .iter()
        .zip(indexes)
        .map(|(t, i)| (*t, Ok(i)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_failed_batch_is_retried_record_by_record_with_its_seqs() {
    let busy = Response::Error {
        code: crate::api::ErrorCode::Unavailable,
        message: "busy".into(),
        leader: None,
    };
    let (addr, node) = scripted_node(vec![
        Some(busy),
        Some(Response::Appended { index: 21 }),
        Some(Response::Appended { index: 22 }),
        Some(Response::Appended { index: 23 }),
    ]);
    let config = ProducerConfig {
        in_flight_max: 1,
        ..ProducerConfig::default()
    };
    let mut p = Producer::new(vec![addr], TOKEN, 5, config);
    let tickets: Vec<_> = (0..3u8).map(|i| p.send(0, &[i]).unwrap()).collect();
    assert_flushed_at(&mut p, &tickets, [21, 22, 23]);
    assert_eq!(p.stats().batches_split, 1);
    let seen: Vec<_> = node.join().unwrap().iter().map(records_of).collect();
    // One batch of three, then each record alone with its own seq.
    assert_eq!(seen, [(5, 1, 3), (5, 1, 1), (5, 2, 1), (5, 3, 1)]);
}

#[test]
fn batches_answered_not_leader_are_sent_again_whole_and_in_order() {
    // A leader that steps down answers every batch it holds NotLeader;
    // the window goes again as it was, in order, no batch split.
    let stepped_down = || Response::Error {
        code: crate::api::ErrorCode::NotLeader,
        message: "not the leader any more".into(),
        leader: None,
    };
    let (addr, node) = scripted_node(vec![
        Some(stepped_down()),
        Some(stepped_down()),
        Some(Response::AppendedBatch {
            first_index: 41,
            count: 3,
        }),
        Some(Response::AppendedBatch {
            first_index: 44,
            count: 3,
        }),
    ]);
    let config = ProducerConfig {
        in_flight_max: 2,
        batch_records_max: 3,
        ..ProducerConfig::default()
    };
    let mut p = Producer::new(vec![addr], TOKEN, 5, config);
    let tickets: Vec<_> = (0..6u8).map(|i| p.send(0, &[i]).unwrap()).collect();
    assert_flushed_at(&mut p, &tickets, 41..47);
    assert_eq!(p.stats().batches_split, 0);
    assert_eq!(p.stats().batches_redirected, 2);
    let seen: Vec<_> = node.join().unwrap().iter().map(records_of).collect();
    assert_eq!(seen, [(5, 1, 3), (5, 4, 3), (5, 1, 3), (5, 4, 3)]);
}
