//! The client protocol on untrusted bytes: as a TCP stream into a
//! `ServerSession` (cut at fuzzer-chosen points, behind a valid Hello or
//! not) and into a `ClientSession`, and as one frame into the response and
//! request decoders. Never a panic, never a receive buffer above its
//! bound, and a failed session always has a decodable close frame;
//! anything a decoder accepts re-encodes to the same bytes (but for the
//! one older form it accepts: a Read or Tail without its stale byte,
//! re-encoded with a 0 there).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use quire::api::session::{ClientConfig, ClientSession, Incoming, ServerConfig, ServerSession};
use quire::api::wire::{
    decode_request, decode_response, encode_request, encode_response, Request, Response, VERSION,
};

const TOKEN: &[u8] = b"fuzz-token";
/// Small, so the fuzzer reaches the bound quickly.
const FRAME_BYTES_MAX: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    // The first byte: chunk size (low 6 bits) and whether to say Hello first.
    let (mode, rest) = match data.split_first() {
        Some((&m, rest)) => (m, rest),
        None => (0, data),
    };
    let chunk = (mode & 0x3F) as usize + 1;

    let mut config = ServerConfig::new(1, TOKEN);
    config.frame_bytes_max = FRAME_BYTES_MAX;
    let mut server = ServerSession::new(Arc::new(config));
    let mut stream = Vec::new();
    if mode & 0x40 != 0 {
        let hello = Request::Hello {
            version: VERSION,
            token: TOKEN.to_vec(),
        };
        encode_request(1, &hello, FRAME_BYTES_MAX, &mut stream).unwrap();
    }
    stream.extend_from_slice(rest);
    'conn: for mut c in stream.chunks(chunk) {
        while !c.is_empty() {
            let n = server.push(c);
            c = &c[n..];
            assert!(server.buffer_capacity() <= FRAME_BYTES_MAX);
            loop {
                match server.poll() {
                    Ok(Some(Incoming::Handshake { .. })) => {}
                    Ok(Some(Incoming::Request { id, req })) => {
                        let resp = Response::StatusJson {
                            json: format!("{req:?}"),
                        };
                        let frame = server.respond(id, &resp);
                        decode_response(&frame, FRAME_BYTES_MAX).expect("we decode what we send");
                    }
                    Ok(None) => break,
                    Err(_) => {
                        let frame = server.close_frame().expect("a failed session has one");
                        decode_response(&frame, FRAME_BYTES_MAX).expect("close frame decodes");
                        break 'conn;
                    }
                }
            }
            // Every request is answered at once, so nothing is held back
            // and a drained session always has room.
            assert!(n > 0, "push took nothing from a drained session");
        }
    }

    // The same bytes as a server's answers to a client with requests in flight.
    let mut cfg = ClientConfig::new(TOKEN);
    cfg.frame_bytes_max = FRAME_BYTES_MAX;
    let mut client = ClientSession::new(cfg);
    let _ = client.hello();
    let _ = client.request(&Request::Status);
    let mut c = rest;
    while !c.is_empty() && !client.is_closed() {
        let n = client.push(c);
        c = &c[n..];
        while let Ok(Some(_)) = client.poll() {}
        if n == 0 {
            break;
        }
    }

    // One frame into each decoder; what decodes must be canonical.
    if let Ok((id, resp)) = decode_response(rest, FRAME_BYTES_MAX) {
        let mut again = Vec::new();
        encode_response(id, &resp, FRAME_BYTES_MAX, &mut again).unwrap();
        assert_eq!(again, rest, "decode then encode changed the bytes");
    }
    if let Ok((id, req)) = decode_request(rest, FRAME_BYTES_MAX) {
        let mut again = Vec::new();
        encode_request(id, &req, FRAME_BYTES_MAX, &mut again).unwrap();
        let older_form = matches!(
            req,
            Request::Read { stale: false, .. } | Request::Tail { stale: false, .. }
        ) && again.len() == rest.len() + 1
            && again[4..again.len() - 1] == rest[4..]
            && again.last() == Some(&0);
        assert!(
            again == rest || older_form,
            "decode then encode changed the bytes"
        );
    }
});
