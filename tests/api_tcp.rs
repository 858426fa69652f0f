//! The client protocol core over real TCP on 127.0.0.1: a tiny server that
//! only moves bytes between sockets and a `ServerSession` (as the daemon
//! will), malformed frames on several connections, and one well-behaved
//! connection that keeps being served throughout.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use quire::api::session::{ClientConfig, ClientSession, Incoming, Received, ServerConfig};
use quire::api::wire::{decode_response, encode_request, FRAME_BYTES_MAX, OP_APPEND, VERSION};
use quire::api::{ErrorCode, Request, Response, ServerSession, SessionStats};

const TOKEN: &[u8] = b"tcp-test-token";
const NODE: u64 = 2;
/// A guard against a hung test, not a delay: reads normally return at once.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection: sockets to session and back, nothing else.
/// Appends get consecutive indexes; a fatal error gets its close frame,
/// then a half-close, then the rest of the peer's bytes are read and
/// thrown away so the kernel sends FIN, not RST (which could destroy the
/// error frame before the client reads it). A daemon must also bound that
/// drain (bytes and time): a hostile peer could keep sending forever.
fn serve(mut stream: TcpStream, config: Arc<ServerConfig>) -> SessionStats {
    let mut s = ServerSession::new(config);
    let mut buf = [0u8; 4096];
    let mut next_index = 1;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return *s.stats(),
            Ok(n) => n,
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let taken = s.push(rest);
            rest = &rest[taken..];
            loop {
                match s.poll() {
                    Ok(Some(Incoming::Handshake { reply, .. })) => {
                        stream.write_all(&reply).unwrap();
                    }
                    Ok(Some(Incoming::Request { id, req })) => {
                        let resp = match req {
                            Request::Append { .. } => {
                                next_index += 1;
                                Response::Appended {
                                    index: next_index - 1,
                                }
                            }
                            Request::Status => Response::StatusJson {
                                json: r#"{"ok":true}"#.into(),
                            },
                            _ => Response::Error {
                                code: ErrorCode::Unavailable,
                                message: "not in this test".into(),
                                leader: None,
                            },
                        };
                        stream.write_all(&s.respond(id, &resp)).unwrap();
                    }
                    Ok(None) => break,
                    Err(_) => {
                        let frame = s.close_frame().expect("failed sessions have one");
                        let _ = stream.write_all(&frame);
                        let _ = stream.shutdown(Shutdown::Write);
                        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                        return *s.stats();
                    }
                }
            }
        }
    }
}

/// Accepts `n` connections, each served on its own thread; returns their
/// counters once all have ended.
fn start_server(n: usize) -> (u16, thread::JoinHandle<Vec<SessionStats>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = Arc::new(ServerConfig::new(NODE, TOKEN));
    let h = thread::spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..n {
            let (stream, _) = listener.accept().unwrap();
            let config = config.clone();
            conns.push(thread::spawn(move || serve(stream, config)));
        }
        conns.into_iter().map(|c| c.join().unwrap()).collect()
    });
    (port, h)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A well-behaved client connection.
struct Good {
    stream: TcpStream,
    session: ClientSession,
}

impl Good {
    fn open(port: u16) -> Good {
        let mut g = Good {
            stream: connect(port),
            session: ClientSession::new(ClientConfig::new(TOKEN)),
        };
        let (id, frame) = g.session.hello().unwrap();
        g.stream.write_all(&frame).unwrap();
        assert_eq!(g.wait(id), Response::HelloOk { node: NODE });
        g
    }

    fn call(&mut self, req: &Request) -> Response {
        let (id, frame) = self.session.request(req).unwrap();
        self.stream.write_all(&frame).unwrap();
        self.wait(id)
    }

    fn wait(&mut self, want: u64) -> Response {
        let mut buf = [0u8; 4096];
        loop {
            let n = self.stream.read(&mut buf).unwrap();
            assert!(n > 0, "the good connection was closed");
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let taken = self.session.push(rest);
                rest = &rest[taken..];
                // One request at a time: the first answer must be it.
                if let Some(r) = self.session.poll().unwrap() {
                    match r {
                        Received::Response { id, resp } if id == want => return resp,
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }
    }
}

/// Sends `bytes` on a fresh connection and returns everything the server
/// sends back until it closes.
fn send_malformed(port: u16, hello_first: bool, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect(port);
    if hello_first {
        let mut hello = Vec::new();
        let req = Request::Hello {
            version: VERSION,
            token: TOKEN.to_vec(),
        };
        encode_request(1, &req, FRAME_BYTES_MAX, &mut hello).unwrap();
        s.write_all(&hello).unwrap();
    }
    s.write_all(bytes).unwrap();
    let mut back = Vec::new();
    // Ends only when the server closes: the proof the connection is closed.
    s.read_to_end(&mut back).unwrap();
    back
}

/// Splits a byte stream into its response frames, decoding each.
fn responses(mut bytes: &[u8]) -> Vec<(u64, Response)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize + 4;
        out.push(decode_response(&bytes[..len], FRAME_BYTES_MAX).unwrap());
        bytes = &bytes[len..];
    }
    out
}

fn raw_frame(opcode: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = ((10 + payload.len()) as u32).to_le_bytes().to_vec();
    f.push(VERSION);
    f.push(opcode);
    f.extend_from_slice(&id.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let (port, server) = start_server(5);
    let mut good = Good::open(port);
    let mut seq = 0;
    let mut append = |g: &mut Good| {
        seq += 1;
        g.call(&Request::Append {
            group: 0,
            client_id: 1,
            seq,
            data: vec![seq as u8; 100].into(),
        })
    };
    assert_eq!(append(&mut good), Response::Appended { index: 1 });

    // (authenticate first?, bytes, expected id and code in the close frame)
    let oversize = (1u32 << 31).to_le_bytes().to_vec();
    let unknown_opcode = raw_frame(0x42, 99, &[]);
    let truncated = raw_frame(OP_APPEND, 7, &[1, 2, 3]);
    let before_hello = raw_frame(0x07, 5, &[]);
    let cases: [(&str, bool, Vec<u8>, u64, ErrorCode); 4] = [
        ("oversized length", true, oversize, 0, ErrorCode::TooLarge),
        (
            "unknown opcode",
            true,
            unknown_opcode,
            99,
            ErrorCode::BadRequest,
        ),
        ("truncated", true, truncated, 7, ErrorCode::BadRequest),
        (
            "request before hello",
            false,
            before_hello,
            5,
            ErrorCode::Unauthorized,
        ),
    ];
    for (i, (name, hello_first, bytes, want_id, want_code)) in cases.into_iter().enumerate() {
        let back = send_malformed(port, hello_first, &bytes);
        let mut frames = responses(&back);
        if hello_first {
            assert_eq!(
                frames.remove(0),
                (1, Response::HelloOk { node: NODE }),
                "{name}"
            );
        }
        match &frames[..] {
            [(id, Response::Error { code, message, .. })] => {
                assert_eq!((*id, *code), (want_id, want_code), "{name}: {message}");
            }
            other => panic!("{name}: expected one error frame, got {other:?}"),
        }
        // The other connection is untouched.
        assert_eq!(
            append(&mut good),
            Response::Appended {
                index: i as u64 + 2
            },
            "{name}"
        );
    }
    assert_eq!(
        good.call(&Request::Status),
        Response::StatusJson {
            json: r#"{"ok":true}"#.into()
        }
    );
    drop(good);

    let stats = server.join().unwrap();
    let mut total = SessionStats::default();
    for s in &stats {
        total.merge(s);
    }
    assert_eq!(total.protocol_errors(), 4);
    assert_eq!(total.errors_oversize, 1);
    assert_eq!(total.errors_unknown_opcode, 1);
    assert_eq!(total.errors_truncated, 1);
    assert_eq!(total.errors_hello_required, 1);
    assert_eq!(stats.iter().filter(|s| s.protocol_errors() == 0).count(), 1);
}

#[test]
fn a_wrong_token_is_refused_with_unauthorized() {
    let (port, server) = start_server(1);
    let mut hello = Vec::new();
    let req = Request::Hello {
        version: VERSION,
        token: b"guess".to_vec(),
    };
    encode_request(1, &req, FRAME_BYTES_MAX, &mut hello).unwrap();
    let back = send_malformed(port, false, &hello);
    match &responses(&back)[..] {
        [(1, Response::Error { code, .. })] => assert_eq!(*code, ErrorCode::Unauthorized),
        other => panic!("{other:?}"),
    }
    let stats = server.join().unwrap();
    assert_eq!(stats[0].auth_failures, 1);
}
