//! Behaviour of the client protocol core: every message round-trips, every
//! reject path closes with the right error and counter, and no input
//! panics or grows a buffer past its bound.

use std::sync::Arc;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::session::*;
use super::wire::*;

const TOKEN: &[u8] = b"s3cret-token";
const NODE: u64 = 7;

fn server_with(frame_bytes_max: usize) -> ServerSession {
    let mut c = ServerConfig::new(NODE, TOKEN);
    c.frame_bytes_max = frame_bytes_max;
    ServerSession::new(Arc::new(c))
}

fn server() -> ServerSession {
    server_with(FRAME_BYTES_MAX)
}

/// A server that has accepted a Hello with id 1.
fn authed_server() -> ServerSession {
    let mut s = server();
    let (items, err) = feed(&mut s, &req_frame(1, &hello(TOKEN)));
    assert_eq!(err, None);
    assert!(matches!(items[..], [Incoming::Handshake { id: 1, .. }]));
    assert!(s.is_authenticated());
    s
}

fn hello(token: &[u8]) -> Request {
    Request::Hello {
        version: VERSION,
        token: token.to_vec(),
    }
}

fn req_frame(id: u64, req: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(id, req, FRAME_BYTES_MAX, &mut out).unwrap();
    out
}

fn resp_frame(id: u64, resp: &Response) -> Vec<u8> {
    let mut out = Vec::new();
    encode_response(id, resp, FRAME_BYTES_MAX, &mut out).unwrap();
    out
}

/// A frame with any header and payload, valid or not.
fn raw_frame(version: u8, opcode: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = ((HEADER_BYTES + payload.len()) as u32)
        .to_le_bytes()
        .to_vec();
    out.push(version);
    out.push(opcode);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Pushes all of `bytes`, polling in between as the contract asks; returns
/// what was polled and the error, if one came.
fn feed(s: &mut ServerSession, mut bytes: &[u8]) -> (Vec<Incoming>, Option<ProtocolError>) {
    let mut got = Vec::new();
    loop {
        let n = s.push(bytes);
        bytes = &bytes[n..];
        let before = got.len();
        loop {
            match s.poll() {
                Ok(Some(i)) => got.push(i),
                Ok(None) => break,
                Err(e) => return (got, Some(e)),
            }
        }
        // Stuck only when the in-flight bound holds everything back.
        if bytes.is_empty() || (n == 0 && got.len() == before) {
            return (got, None);
        }
    }
}

/// The close frame of a failed session, decoded: (id, code).
fn close_of(s: &mut ServerSession) -> (u64, ErrorCode, String) {
    let frame = s.close_frame().expect("a failed session has a close frame");
    match decode_response(&frame, FRAME_BYTES_MAX).unwrap() {
        (id, Response::Error { code, message, .. }) => (id, code, message),
        other => panic!("close frame is not an error: {other:?}"),
    }
}

fn all_requests() -> Vec<Request> {
    vec![
        hello(TOKEN),
        hello(b""),
        Request::Append {
            group: 3,
            client_id: u64::MAX,
            seq: 42,
            data: b"hello world".to_vec().into(),
        },
        Request::Append {
            group: 0,
            client_id: 0,
            seq: 0,
            data: Vec::new().into(),
        },
        Request::AppendBatch {
            group: u32::MAX,
            client_id: 9,
            first_seq: 100,
            items: vec![b"a".to_vec().into(), Bytes::new(), vec![0xFF; 300].into()],
        },
        Request::AppendBatch {
            group: 1,
            client_id: 9,
            first_seq: 1,
            items: Vec::new(),
        },
        Request::Read {
            group: 2,
            from: 17,
            max_entries: 1000,
            max_bytes: 1 << 20,
            stale: false,
        },
        Request::Read {
            group: 0,
            from: 1,
            max_entries: 1,
            max_bytes: 0,
            stale: true,
        },
        Request::Tail {
            group: 2,
            from: u64::MAX,
            wait_ms: 5000,
            stale: false,
        },
        Request::Tail {
            group: 1,
            from: 1,
            wait_ms: 0,
            stale: true,
        },
        Request::Leaders,
        Request::Status,
        Request::Command {
            group: 1,
            client_id: 7,
            seq: 8,
            command: vec![1, 2, 3],
        },
        Request::Query {
            group: 0,
            wait_ms: 100,
            query: Vec::new(),
        },
    ]
}

fn all_responses() -> Vec<Response> {
    let mut v = vec![
        Response::HelloOk { node: 3 },
        Response::Appended { index: 12345 },
        Response::AppendedBatch {
            first_index: 99,
            count: 3,
        },
        Response::Entries {
            entries: Vec::new(),
        },
        Response::Entries {
            entries: vec![
                Entry {
                    index: 1,
                    term: 1,
                    data: bytes::Bytes::from_static(b"x"),
                },
                Entry {
                    index: 2,
                    term: 3,
                    data: bytes::Bytes::new(),
                },
            ],
        },
        Response::LeaderMap {
            groups: vec![
                LeaderInfo {
                    group: 0,
                    leader: 1,
                    addr: "127.0.0.1:7001".into(),
                },
                LeaderInfo {
                    group: 1,
                    leader: 0,
                    addr: String::new(),
                },
            ],
        },
        Response::StatusJson {
            json: r#"{"node":1,"groups":[]}"#.into(),
        },
        Response::Outcome {
            outcome: vec![2, 0, 0, 0, 0, 0, 0, 0, 0],
        },
        Response::Answer { answer: Vec::new() },
    ];
    for code in ErrorCode::ALL {
        v.push(Response::Error {
            code,
            message: format!("{code} — with non-ASCII"),
            leader: None,
        });
    }
    v.push(Response::Error {
        code: ErrorCode::NotLeader,
        message: "ask node 2".into(),
        leader: Some((2, "10.0.0.2:7000".into())),
    });
    v
}

#[test]
fn every_request_round_trips_and_is_canonical() {
    for (i, req) in all_requests().into_iter().enumerate() {
        let id = i as u64 + 1;
        let frame = req_frame(id, &req);
        assert_eq!(frame.len(), FRAME_BYTES_MIN + req.payload_bytes());
        let (got_id, got) = decode_request(&frame, FRAME_BYTES_MAX).unwrap();
        assert_eq!((got_id, &got), (id, &req));
        assert_eq!(
            req_frame(got_id, &got),
            frame,
            "re-encoding changed {req:?}"
        );
        // Every proper prefix is truncated, never a panic or a success.
        for cut in 0..frame.len() {
            assert!(decode_request(&frame[..cut], FRAME_BYTES_MAX).is_err());
        }
    }
}

/// The stale flag of Read and Tail is one byte, 0 or 1: any other value
/// is refused (its absence is the older form, below).
#[test]
fn a_stale_flag_other_than_0_or_1_does_not_decode() {
    for req in [
        Request::Read {
            group: 0,
            from: 1,
            max_entries: 1,
            max_bytes: 1,
            stale: true,
        },
        Request::Tail {
            group: 0,
            from: 1,
            wait_ms: 1,
            stale: true,
        },
    ] {
        let mut frame = req_frame(1, &req);
        let last = frame.len() - 1;
        assert_eq!(frame[last], 1, "the flag is the last byte");
        for bad in [2u8, 0x80, 0xFF] {
            frame[last] = bad;
            assert_eq!(
                decode_request(&frame, FRAME_BYTES_MAX),
                Err(DecodeError::Invalid("stale is neither 0 nor 1")),
                "{req:?} with flag {bad}"
            );
        }
    }
}

/// True if `frame` is what this build writes for `req` with `id`, or the
/// one older form the decoder also accepts: a Read or Tail without the
/// stale byte, which this build writes with a 0 there.
fn is_canonical(frame: &[u8], id: u64, req: &Request) -> bool {
    let now = req_frame(id, req);
    let older_form = matches!(
        req,
        Request::Read { stale: false, .. } | Request::Tail { stale: false, .. }
    ) && now.len() == frame.len() + 1
        && now[LEN_BYTES..now.len() - 1] == frame[LEN_BYTES..]
        && now.last() == Some(&0);
    now == frame || older_form
}

/// A client from before the stale byte (protocol version 1 all along)
/// sends Read and Tail without it: they decode as not stale (linearizable,
/// what the README promised it), a server session hands them on, and they
/// re-encode in the current form. With the byte, both values decode as
/// before; a field cut short is still Truncated.
#[test]
fn a_read_or_tail_without_the_stale_byte_decodes_as_not_stale() {
    let mut read = Vec::new();
    read.extend_from_slice(&3u32.to_le_bytes()); // group
    read.extend_from_slice(&17u64.to_le_bytes()); // from
    read.extend_from_slice(&100u32.to_le_bytes()); // max_entries
    read.extend_from_slice(&4096u32.to_le_bytes()); // max_bytes
    let mut tail = Vec::new();
    tail.extend_from_slice(&3u32.to_le_bytes()); // group
    tail.extend_from_slice(&17u64.to_le_bytes()); // from
    tail.extend_from_slice(&1500u32.to_le_bytes()); // wait_ms
    let as_read = |stale| Request::Read {
        group: 3,
        from: 17,
        max_entries: 100,
        max_bytes: 4096,
        stale,
    };
    let as_tail = |stale| Request::Tail {
        group: 3,
        from: 17,
        wait_ms: 1500,
        stale,
    };
    for (opcode, older, want) in [
        (OP_READ, &read, as_read as fn(bool) -> Request),
        (OP_TAIL, &tail, as_tail),
    ] {
        // The older form: not stale.
        let frame = raw_frame(VERSION, opcode, 5, older);
        let (id, req) = decode_request(&frame, FRAME_BYTES_MAX).unwrap();
        assert_eq!((id, &req), (5, &want(false)));
        let mut current = older.clone();
        current.push(0);
        assert_eq!(req_frame(5, &req), raw_frame(VERSION, opcode, 5, &current));
        assert!(is_canonical(&frame, id, &req));
        // Through a server session, as the daemon gets it.
        let mut s = authed_server();
        let (items, err) = feed(&mut s, &frame);
        assert_eq!(err, None);
        assert_eq!(
            items,
            vec![Incoming::Request {
                id: 5,
                req: want(false)
            }]
        );
        // The current form, both values.
        for stale in [false, true] {
            let mut with_byte = older.clone();
            with_byte.push(u8::from(stale));
            let frame = raw_frame(VERSION, opcode, 6, &with_byte);
            assert_eq!(
                decode_request(&frame, FRAME_BYTES_MAX),
                Ok((6, want(stale)))
            );
        }
        // One byte short of the older form: a field is cut.
        let cut = raw_frame(VERSION, opcode, 7, &older[..older.len() - 1]);
        assert_eq!(
            decode_request(&cut, FRAME_BYTES_MAX),
            Err(DecodeError::Truncated)
        );
    }
}

#[test]
fn every_response_round_trips_and_is_canonical() {
    for (i, resp) in all_responses().into_iter().enumerate() {
        let id = i as u64 + 1;
        let frame = resp_frame(id, &resp);
        assert_eq!(frame.len(), FRAME_BYTES_MIN + resp.payload_bytes());
        let (got_id, got) = decode_response(&frame, FRAME_BYTES_MAX).unwrap();
        assert_eq!((got_id, &got), (id, &resp));
        assert_eq!(
            resp_frame(got_id, &got),
            frame,
            "re-encoding changed {resp:?}"
        );
        for cut in 0..frame.len() {
            assert!(decode_response(&frame[..cut], FRAME_BYTES_MAX).is_err());
        }
    }
}

#[test]
fn error_codes_are_stable_and_displayed() {
    let wire: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.to_u16()).collect();
    assert_eq!(wire, (1..=14).collect::<Vec<u16>>());
    for c in ErrorCode::ALL {
        assert_eq!(ErrorCode::from_u16(c.to_u16()), Some(c));
        assert!(!c.to_string().is_empty());
    }
    assert_eq!(ErrorCode::from_u16(0), None);
    assert_eq!(ErrorCode::from_u16(15), None);
    assert_eq!(ErrorCode::NotLeader.to_string(), "not leader");
}

#[test]
fn a_pipelined_session_serves_every_request_and_counts() {
    let mut client = ClientSession::new(ClientConfig::new(TOKEN));
    let mut server = server();
    let mut wire = client.hello().unwrap().1;
    let mut ids = Vec::new();
    for req in all_requests()
        .into_iter()
        .filter(|r| !matches!(r, Request::Hello { .. }))
    {
        let (id, frame) = client.request(&req).unwrap();
        wire.extend_from_slice(&frame);
        ids.push((id, req));
    }
    // One byte at a time: framing must not depend on read boundaries.
    let mut got = Vec::new();
    for b in wire.chunks(1) {
        let (items, err) = feed(&mut server, b);
        assert_eq!(err, None);
        got.extend(items);
    }
    let Incoming::Handshake { id: 1, reply } = &got[0] else {
        panic!("first item is not the handshake: {:?}", got[0]);
    };
    let mut back = reply.clone();
    assert_eq!(got.len(), ids.len() + 1);
    // Answer in reverse order: ids, not order, match answers to requests.
    for item in got[1..].iter().rev() {
        let Incoming::Request { id, req } = item else {
            panic!("not a request: {item:?}");
        };
        let want = &ids.iter().find(|(i, _)| i == id).unwrap().1;
        assert_eq!(req, want);
        let resp = match req {
            Request::Append { seq, .. } => Response::Appended { index: *seq },
            Request::AppendBatch { items, .. } => Response::AppendedBatch {
                first_index: 1,
                count: items.len() as u32,
            },
            Request::Read { .. } | Request::Tail { .. } => Response::Entries {
                entries: Vec::new(),
            },
            Request::Leaders => Response::LeaderMap { groups: Vec::new() },
            Request::Status => Response::StatusJson { json: "{}".into() },
            Request::Command { .. } => Response::Outcome { outcome: vec![5] },
            Request::Query { .. } => Response::Answer { answer: vec![] },
            Request::Hello { .. } => unreachable!(),
        };
        back.extend_from_slice(&server.respond(*id, &resp));
    }
    assert_eq!(server.in_flight(), 0);
    assert_eq!(client.in_flight(), ids.len() + 1);

    let mut answered = Vec::new();
    let mut rest = &back[..];
    while !rest.is_empty() {
        let n = client.push(rest);
        rest = &rest[n..];
        while let Some(r) = client.poll().unwrap() {
            let Received::Response { id, .. } = r else {
                panic!("unexpected {r:?}");
            };
            answered.push(id);
        }
    }
    assert_eq!(client.node(), Some(NODE));
    assert_eq!(client.in_flight(), 0);
    assert_eq!(answered.len(), ids.len() + 1);

    let s = server.stats();
    assert_eq!(s.frames_received, ids.len() as u64 + 1);
    assert_eq!(s.bytes_received, wire.len() as u64);
    assert_eq!(s.frames_sent, ids.len() as u64 + 1);
    assert_eq!(s.bytes_sent, back.len() as u64);
    assert_eq!(s.protocol_errors(), 0);
    let c = client.stats();
    assert_eq!(
        (c.frames_sent, c.bytes_sent),
        (s.frames_received, s.bytes_received)
    );
    assert_eq!(
        (c.frames_received, c.bytes_received),
        (s.frames_sent, s.bytes_sent)
    );
}

#[test]
fn oversized_length_is_rejected_before_allocation() {
    let bound = 64 * 1024;
    let mut s = server_with(bound);
    // Announce 1 GiB, then keep sending: the buffer must stay small and
    // the session must fail as soon as the prefix is in.
    let mut bytes = (1u32 << 30).to_le_bytes().to_vec();
    bytes.extend_from_slice(&[VERSION, OP_APPEND]);
    assert_eq!(s.push(&bytes), bytes.len());
    assert!(
        s.buffer_capacity() <= bound,
        "capacity {}",
        s.buffer_capacity()
    );
    let flood = vec![0xAB; 4 * bound];
    assert_eq!(
        s.push(&flood),
        flood.len(),
        "a failed session swallows input"
    );
    assert!(
        s.buffer_capacity() <= bound,
        "capacity {}",
        s.buffer_capacity()
    );
    assert_eq!(s.buffered_bytes(), 0);
    let err = s.poll().unwrap_err();
    assert_eq!(
        err,
        ProtocolError::Decode(DecodeError::Oversize {
            frame_bytes: (1 << 30) + 4,
            frame_bytes_max: bound,
        })
    );
    assert_eq!(s.poll().unwrap_err(), err, "the error is sticky");
    let (id, code, _) = close_of(&mut s);
    assert_eq!((id, code), (0, ErrorCode::TooLarge));
    assert_eq!(s.stats().errors_oversize, 1);
    assert_eq!(s.stats().bytes_discarded, flood.len() as u64);

    // One byte over the bound is over; exactly the bound is fine.
    let mut s = server_with(bound);
    let over = ((bound - LEN_BYTES + 1) as u32).to_le_bytes();
    assert!(matches!(
        feed(&mut s, &over).1,
        Some(ProtocolError::Decode(DecodeError::Oversize { .. }))
    ));
    let mut s = server_with(bound);
    feed(&mut s, &req_frame(1, &hello(TOKEN)));
    let data = vec![1u8; bound - FRAME_BYTES_MIN - 24];
    let req = Request::Append {
        group: 0,
        client_id: 1,
        seq: 1,
        data: data.into(),
    };
    let mut frame = Vec::new();
    encode_request(2, &req, bound, &mut frame).unwrap();
    assert_eq!(frame.len(), bound);
    // Drip it in: the buffer grows with what arrives, never past the bound.
    let mut got = Vec::new();
    for chunk in frame.chunks(1000) {
        let (items, err) = feed(&mut s, chunk);
        assert_eq!(err, None);
        assert!(s.buffer_capacity() <= bound);
        got.extend(items);
    }
    assert_eq!(got, vec![Incoming::Request { id: 2, req }]);
}

#[test]
fn a_buffer_full_of_small_frames_stops_at_the_bound() {
    let bound = SESSION_FRAME_BYTES_MIN;
    let mut s = server_with(bound);
    let mut wire = req_frame(1, &hello(TOKEN));
    for id in 2..500 {
        wire.extend_from_slice(&req_frame(id, &Request::Status));
    }
    // push takes only what fits; the rest is the caller's to push again.
    let n = s.push(&wire);
    assert_eq!(n, bound);
    assert_eq!(s.push(&wire[n..]), 0, "full until polled");
    let (items, err) = feed(&mut s, &wire[n..]);
    assert_eq!(err, None);
    let mut count = items.len();
    while let Ok(Some(_)) = s.poll() {
        count += 1;
    }
    assert_eq!(count, 499);
    assert!(s.buffer_capacity() <= bound);
}

#[test]
fn requests_beyond_the_in_flight_bound_wait_for_answers() {
    let mut c = ServerConfig::new(NODE, TOKEN);
    c.requests_in_flight_max = 2;
    let mut s = ServerSession::new(Arc::new(c));
    let mut wire = req_frame(1, &hello(TOKEN));
    for id in 2..=5 {
        wire.extend_from_slice(&req_frame(id, &Request::Status));
    }
    assert_eq!(s.push(&wire), wire.len());
    let mut ids = Vec::new();
    while let Some(i) = s.poll().unwrap() {
        ids.push(i);
    }
    assert_eq!(ids.len(), 3, "handshake and two requests");
    s.respond(2, &Response::StatusJson { json: "{}".into() });
    assert!(matches!(
        s.poll(),
        Ok(Some(Incoming::Request { id: 4, .. }))
    ));
    assert_eq!(s.poll(), Ok(None));
}

#[test]
fn bad_length_closes() {
    let mut s = server();
    let (_, err) = feed(&mut s, &5u32.to_le_bytes());
    assert_eq!(
        err,
        Some(ProtocolError::Decode(DecodeError::BadLength { len: 5 }))
    );
    let (id, code, msg) = close_of(&mut s);
    assert_eq!((id, code), (0, ErrorCode::BadRequest));
    assert!(msg.contains("shorter than a header"), "{msg}");
    assert_eq!(s.stats().errors_bad_length, 1);
}

#[test]
fn unknown_opcode_closes_with_the_frames_id() {
    for op in [0x00, 0x0A, 0x42, OP_HELLO_OK, OP_ERROR] {
        let mut s = authed_server();
        let (_, err) = feed(&mut s, &raw_frame(VERSION, op, 77, &[]));
        assert_eq!(
            err,
            Some(ProtocolError::Decode(DecodeError::UnknownOpcode(op)))
        );
        let (id, code, _) = close_of(&mut s);
        assert_eq!((id, code), (77, ErrorCode::BadRequest));
        assert_eq!(s.stats().errors_unknown_opcode, 1);
    }
}

#[test]
fn truncated_payload_closes() {
    let mut s = authed_server();
    // An Append whose data length says 100 but carries 3 bytes.
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u32.to_le_bytes());
    payload.extend_from_slice(&1u64.to_le_bytes());
    payload.extend_from_slice(&1u64.to_le_bytes());
    payload.extend_from_slice(&100u32.to_le_bytes());
    payload.extend_from_slice(b"abc");
    let (_, err) = feed(&mut s, &raw_frame(VERSION, OP_APPEND, 9, &payload));
    assert_eq!(err, Some(ProtocolError::Decode(DecodeError::Truncated)));
    assert_eq!(close_of(&mut s).0, 9);
    assert_eq!(s.stats().errors_truncated, 1);

    // A batch claiming u32::MAX items in a tiny frame: rejected by count,
    // before a Vec of that many slots is made.
    let mut s = authed_server();
    let mut payload = vec![0; 4 + 8 + 8];
    payload.extend_from_slice(&(ITEMS_MAX as u32).to_le_bytes());
    let (_, err) = feed(&mut s, &raw_frame(VERSION, OP_APPEND_BATCH, 9, &payload));
    assert_eq!(err, Some(ProtocolError::Decode(DecodeError::Truncated)));
    let mut s = authed_server();
    let mut payload = vec![0; 4 + 8 + 8];
    payload.extend_from_slice(&u32::MAX.to_le_bytes());
    let (_, err) = feed(&mut s, &raw_frame(VERSION, OP_APPEND_BATCH, 9, &payload));
    assert_eq!(
        err,
        Some(ProtocolError::Decode(DecodeError::Invalid(
            "list longer than ITEMS_MAX"
        )))
    );
    assert_eq!(s.stats().errors_malformed, 1);
}

#[test]
fn trailing_bytes_close() {
    let mut s = authed_server();
    let (_, err) = feed(&mut s, &raw_frame(VERSION, OP_STATUS, 3, &[0]));
    assert_eq!(
        err,
        Some(ProtocolError::Decode(DecodeError::TrailingBytes {
            bytes: 1
        }))
    );
    assert_eq!(close_of(&mut s).1, ErrorCode::BadRequest);
    assert_eq!(s.stats().errors_trailing_bytes, 1);
}

#[test]
fn wrong_frame_version_closes() {
    let mut s = server();
    let (_, err) = feed(&mut s, &raw_frame(2, OP_STATUS, 4, &[]));
    assert_eq!(
        err,
        Some(ProtocolError::Decode(DecodeError::UnsupportedVersion(2)))
    );
    assert_eq!(close_of(&mut s).1, ErrorCode::UnsupportedVersion);
    assert_eq!(s.stats().errors_unsupported_version, 1);
}

#[test]
fn wrong_hello_version_closes() {
    let mut s = server();
    let req = Request::Hello {
        version: 9,
        token: TOKEN.to_vec(),
    };
    let (_, err) = feed(&mut s, &req_frame(1, &req));
    assert_eq!(err, Some(ProtocolError::HelloVersion(9)));
    assert_eq!(
        close_of(&mut s),
        (1, ErrorCode::UnsupportedVersion, err.unwrap().to_string())
    );
    assert!(!s.is_authenticated());
}

#[test]
fn bad_token_closes_and_counts_an_auth_failure() {
    for token in [
        &b"s3cret-tokem"[..],
        b"",
        b"s3cret-token-and-more",
        b"s3cret-toke",
    ] {
        let mut s = server();
        let mut wire = req_frame(1, &hello(token));
        wire.extend_from_slice(&req_frame(2, &Request::Status));
        let (items, err) = feed(&mut s, &wire);
        assert!(items.is_empty(), "nothing is served after a bad token");
        assert_eq!(err, Some(ProtocolError::BadToken));
        assert_eq!(close_of(&mut s).1, ErrorCode::Unauthorized);
        assert_eq!(s.stats().auth_failures, 1);
        assert!(!s.is_authenticated());
    }
}

#[test]
fn a_request_before_hello_closes() {
    let mut s = server();
    let req = Request::Append {
        group: 0,
        client_id: 1,
        seq: 1,
        data: b"x".to_vec().into(),
    };
    let (items, err) = feed(&mut s, &req_frame(5, &req));
    assert!(items.is_empty());
    assert_eq!(
        err,
        Some(ProtocolError::HelloRequired { opcode: OP_APPEND })
    );
    assert_eq!(close_of(&mut s).0, 5);
    assert_eq!(close_of(&mut s).1, ErrorCode::Unauthorized);
    assert_eq!(s.stats().errors_hello_required, 1);
}

#[test]
fn a_second_hello_closes() {
    let mut s = authed_server();
    let (_, err) = feed(&mut s, &req_frame(2, &hello(TOKEN)));
    assert_eq!(err, Some(ProtocolError::HelloTwice));
    assert_eq!(s.stats().errors_hello_twice, 1);
}

#[test]
fn a_response_too_large_becomes_a_too_large_error() {
    let mut s = server_with(SESSION_FRAME_BYTES_MIN);
    feed(&mut s, &req_frame(1, &hello(TOKEN)));
    feed(&mut s, &req_frame(2, &Request::Status));
    let big = Response::StatusJson {
        json: "x".repeat(SESSION_FRAME_BYTES_MIN),
    };
    let frame = s.respond(2, &big);
    assert!(frame.len() <= SESSION_FRAME_BYTES_MIN);
    match decode_response(&frame, FRAME_BYTES_MAX).unwrap() {
        (2, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::TooLarge),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.stats().responses_too_large, 1);
}

#[test]
fn malformed_response_fields_are_typed_errors() {
    let mut bad_code = 99u16.to_le_bytes().to_vec();
    bad_code.extend_from_slice(&0u32.to_le_bytes());
    bad_code.push(0);
    assert_eq!(
        Response::decode_payload(OP_ERROR, &bad_code),
        Err(DecodeError::Invalid("unknown error code"))
    );
    let mut bad_tag = 1u16.to_le_bytes().to_vec();
    bad_tag.extend_from_slice(&0u32.to_le_bytes());
    bad_tag.push(2);
    assert_eq!(
        Response::decode_payload(OP_ERROR, &bad_tag),
        Err(DecodeError::Invalid("leader tag is neither 0 nor 1"))
    );
    let mut bad_utf8 = 2u32.to_le_bytes().to_vec();
    bad_utf8.extend_from_slice(&[0xC3, 0x28]);
    assert_eq!(
        Response::decode_payload(OP_STATUS_JSON, &bad_utf8),
        Err(DecodeError::BadUtf8)
    );
    assert_eq!(
        Response::decode_payload(OP_HELLO, &[]),
        Err(DecodeError::UnknownOpcode(OP_HELLO))
    );
    let mut long_token = vec![VERSION];
    long_token.extend_from_slice(&((TOKEN_BYTES_MAX + 1) as u32).to_le_bytes());
    long_token.resize(long_token.len() + TOKEN_BYTES_MAX + 1, 0);
    assert_eq!(
        Request::decode_payload(OP_HELLO, &long_token),
        Err(DecodeError::Invalid("token longer than TOKEN_BYTES_MAX"))
    );
}

#[test]
fn encoders_refuse_what_decoders_would_reject() {
    let mut out = Vec::new();
    let big = Request::Append {
        group: 0,
        client_id: 0,
        seq: 0,
        data: vec![0; 2000].into(),
    };
    assert!(matches!(
        encode_request(1, &big, 1024, &mut out),
        Err(EncodeError::TooLarge { .. })
    ));
    let many = Request::AppendBatch {
        group: 0,
        client_id: 0,
        first_seq: 0,
        items: vec![Bytes::new(); ITEMS_MAX + 1],
    };
    assert_eq!(
        encode_request(1, &many, FRAME_BYTES_MAX, &mut out),
        Err(EncodeError::TooManyItems {
            count: ITEMS_MAX + 1
        })
    );
    assert_eq!(
        encode_request(
            1,
            &hello(&[0; TOKEN_BYTES_MAX + 1]),
            FRAME_BYTES_MAX,
            &mut out
        ),
        Err(EncodeError::TokenTooLong {
            bytes: TOKEN_BYTES_MAX + 1
        })
    );
    assert!(out.is_empty(), "a refused frame leaves the buffer alone");
}

#[test]
fn client_matches_ids_and_kinds() {
    let mut c = ClientSession::new(ClientConfig::new(TOKEN));
    let (hid, _) = c.hello().unwrap();
    let (aid, _) = c
        .request(&Request::Append {
            group: 0,
            client_id: 1,
            seq: 1,
            data: Vec::new().into(),
        })
        .unwrap();
    assert_eq!((hid, aid), (1, 2));
    assert_eq!(c.in_flight_ids(), vec![1, 2]);

    // An answer of the wrong kind is a protocol error.
    let mut c2 = ClientSession::new(ClientConfig::new(TOKEN));
    c2.hello().unwrap();
    c2.push(&resp_frame(1, &Response::Appended { index: 1 }));
    assert_eq!(c2.poll(), Err(ProtocolError::UnexpectedResponse { id: 1 }));
    assert_eq!(c2.stats().errors_unexpected_response, 1);
    assert_eq!(c2.request(&Request::Status), Err(RequestError::Closed));

    // An answer to no request is a protocol error.
    let mut c3 = ClientSession::new(ClientConfig::new(TOKEN));
    c3.push(&resp_frame(5, &Response::HelloOk { node: 1 }));
    assert_eq!(c3.poll(), Err(ProtocolError::UnexpectedResponse { id: 5 }));

    // An error with id 0 is about the connection.
    c.push(&resp_frame(
        0,
        &Response::Error {
            code: ErrorCode::Unauthorized,
            message: "no".into(),
            leader: None,
        },
    ));
    assert_eq!(
        c.poll(),
        Ok(Some(Received::ConnectionError {
            code: ErrorCode::Unauthorized,
            message: "no".into()
        }))
    );
    assert!(c.is_closed());
    assert_eq!(c.in_flight_ids(), vec![1, 2], "outcomes unknown");
}

#[test]
fn client_bounds_requests_in_flight() {
    let mut cfg = ClientConfig::new(TOKEN);
    cfg.in_flight_max = 2;
    let mut c = ClientSession::new(cfg);
    c.hello().unwrap();
    c.request(&Request::Status).unwrap();
    assert_eq!(c.request(&Request::Status), Err(RequestError::InFlightFull));
    c.push(&resp_frame(2, &Response::StatusJson { json: "{}".into() }));
    assert!(matches!(
        c.poll(),
        Ok(Some(Received::Response { id: 2, .. }))
    ));
    assert_eq!(c.request(&Request::Status).unwrap().0, 3);
}

/// Valid frames of every kind, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = all_requests().iter().map(|r| req_frame(1, r)).collect();
    v.extend(all_responses().iter().map(|r| resp_frame(1, r)));
    v
}

#[test]
fn random_and_mutated_bytes_never_panic_or_overgrow() {
    let seed = 0x5EED_0A11;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seeds = seeds();
    let bound = 8 * 1024;
    for round in 0..3000 {
        // Half pure noise, half valid frames with a few bytes changed.
        let mut bytes = if round % 2 == 0 {
            let n = rng.gen_range(0..600);
            (0..n).map(|_| rng.gen()).collect::<Vec<u8>>()
        } else {
            let mut b = seeds[rng.gen_range(0..seeds.len())].clone();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            if rng.gen_bool(0.2) {
                b.truncate(rng.gen_range(0..b.len()));
            }
            b
        };
        let _ = decode_request(&bytes, bound);
        let _ = decode_response(&bytes, bound);
        if let Ok((id, resp)) = decode_response(&bytes, FRAME_BYTES_MAX) {
            assert_eq!(resp_frame(id, &resp), bytes, "seed {seed} round {round}");
        }
        if let Ok((id, req)) = decode_request(&bytes, FRAME_BYTES_MAX) {
            assert!(is_canonical(&bytes, id, &req), "seed {seed} round {round}");
        }

        // Through a session, behind a valid Hello half of the time, cut
        // at random points.
        let mut s = server_with(bound);
        if rng.gen_bool(0.5) {
            let mut wire = req_frame(1, &hello(TOKEN));
            wire.append(&mut bytes);
            bytes = wire;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let cut = rng.gen_range(1..=rest.len());
            let (items, err) = feed(&mut s, &rest[..cut]);
            drop(items);
            assert!(s.buffer_capacity() <= bound);
            rest = &rest[cut..];
            if err.is_some() {
                let frame = s.close_frame().unwrap();
                assert!(decode_response(&frame, FRAME_BYTES_MAX).is_ok());
                break;
            }
        }
    }
}

#[test]
fn before_hello_the_server_holds_no_more_than_a_hello() {
    let big = Request::Append {
        group: 0,
        client_id: 1,
        seq: 1,
        data: vec![7; 1 << 20].into(),
    };
    // A large request before Hello: refused from its header.
    let mut s = server();
    let frame = req_frame(3, &big);
    let n = s.push(&frame);
    assert!(n <= HELLO_FRAME_BYTES_MAX);
    assert!(s.buffer_capacity() <= HELLO_FRAME_BYTES_MAX);
    assert_eq!(
        s.poll(),
        Err(ProtocolError::HelloRequired { opcode: OP_APPEND })
    );
    assert_eq!(close_of(&mut s).0, 3);

    // A "Hello" larger than any Hello: refused from its header too.
    let mut s = server();
    let mut fake = raw_frame(VERSION, OP_HELLO, 4, &[]);
    fake[..4].copy_from_slice(&(1u32 << 20).to_le_bytes());
    let (_, err) = feed(&mut s, &fake);
    assert_eq!(
        err,
        Some(ProtocolError::Decode(DecodeError::Oversize {
            frame_bytes: (1 << 20) + 4,
            frame_bytes_max: HELLO_FRAME_BYTES_MAX,
        }))
    );
    assert_eq!(close_of(&mut s).1, ErrorCode::TooLarge);

    // The largest token fits; after the Hello the full bound applies, even
    // to a large request pipelined right behind it.
    let mut s = ServerSession::new(Arc::new(ServerConfig::new(NODE, &[0; TOKEN_BYTES_MAX])));
    let mut wire = req_frame(1, &hello(&[0; TOKEN_BYTES_MAX]));
    assert_eq!(wire.len(), HELLO_FRAME_BYTES_MAX);
    wire.extend_from_slice(&req_frame(2, &big));
    let (items, err) = feed(&mut s, &wire);
    assert_eq!(err, None);
    assert!(matches!(items[0], Incoming::Handshake { id: 1, .. }));
    assert_eq!(items[1], Incoming::Request { id: 2, req: big });
}

#[test]
fn every_flipped_bit_is_rejected_or_canonical() {
    for frame in seeds() {
        for bit in 0..frame.len() * 8 {
            let mut b = frame.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            if let Ok((id, req)) = decode_request(&b, FRAME_BYTES_MAX) {
                assert!(is_canonical(&b, id, &req), "{b:?}");
            }
            if let Ok((id, resp)) = decode_response(&b, FRAME_BYTES_MAX) {
                assert_eq!(resp_frame(id, &resp), b);
            }
            let mut s = authed_server();
            if feed(&mut s, &b).1.is_some() {
                let close = s.close_frame().unwrap();
                assert!(decode_response(&close, FRAME_BYTES_MAX).is_ok());
            }
        }
    }
}

#[test]
fn client_rejects_an_oversized_answer_from_its_prefix() {
    let mut cfg = ClientConfig::new(TOKEN);
    cfg.frame_bytes_max = SESSION_FRAME_BYTES_MIN;
    let mut c = ClientSession::new(cfg);
    c.hello().unwrap();
    assert_eq!(c.push(&u32::MAX.to_le_bytes()), 4);
    assert!(matches!(
        c.poll(),
        Err(ProtocolError::Decode(DecodeError::Oversize { .. }))
    ));
    assert!(c.is_closed());
    assert_eq!(c.stats().errors_oversize, 1);
    assert_eq!(c.buffered_bytes(), 0);
}

#[test]
fn respond_into_appends_the_same_frame_respond_makes() {
    let mut a = authed_server();
    let mut b = authed_server();
    let mut out = b"already queued".to_vec();
    for (id, resp) in all_responses().iter().enumerate() {
        let frame = a.respond(id as u64, resp);
        let start = out.len();
        b.respond_into(id as u64, resp, &mut out);
        assert_eq!(&out[start..], &frame[..], "{resp:?}");
    }
    // A too-large answer leaves only its TooLarge error behind it.
    let mut small = server_with(SESSION_FRAME_BYTES_MIN);
    let big = Response::StatusJson {
        json: "x".repeat(2 * SESSION_FRAME_BYTES_MIN),
    };
    let mut out = b"q".to_vec();
    small.respond_into(9, &big, &mut out);
    let (id, resp) = decode_response(&out[1..], FRAME_BYTES_MAX).expect("one frame");
    assert_eq!(id, 9);
    assert!(
        matches!(
            resp,
            Response::Error {
                code: ErrorCode::TooLarge,
                ..
            }
        ),
        "{resp:?}"
    );
    assert_eq!(a.stats().bytes_sent, b.stats().bytes_sent);
}

#[test]
fn a_received_append_shares_its_frame_instead_of_copying_it() {
    let batch = Request::AppendBatch {
        group: 0,
        client_id: 1,
        first_seq: 1,
        items: vec![vec![5; 1000].into(), Bytes::new(), vec![6; 10].into()],
    };
    let append = Request::Append {
        group: 0,
        client_id: 1,
        seq: 1,
        data: vec![7; 1000].into(),
    };
    for req in [append, batch] {
        let mut out = Vec::new();
        encode_request(1, &req, FRAME_BYTES_MAX, &mut out).unwrap();
        let frame = Bytes::from(out);
        let (header, payload) = FrameHeader::split(&frame, FRAME_BYTES_MAX).unwrap();
        let decoded = Request::decode_shared(header.opcode, &frame.slice_ref(payload)).unwrap();
        assert_eq!(decoded, req);
        let records = match &decoded {
            Request::Append { data, .. } => vec![data.clone()],
            Request::AppendBatch { items, .. } => items.clone(),
            other => panic!("decoded as {other:?}"),
        };
        let inside = frame.as_ptr_range();
        for r in records.iter().filter(|r| !r.is_empty()) {
            assert!(
                inside.contains(&r.as_ptr()) && r.as_ptr_range().end <= inside.end,
                "a record was copied out of its frame"
            );
        }
        // The copying decoder gives the same request.
        assert_eq!(
            Request::decode_payload(header.opcode, payload).unwrap(),
            req
        );
    }
}
