//! The blocking shell over the retry policy, against a scripted node on a
//! loopback socket: what the client sends on each try, across a dropped
//! connection. No sleeps: a dropped connection is retried at once.

use super::Client;
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
