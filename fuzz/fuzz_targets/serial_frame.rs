//! The serial frame decoder on untrusted bytes, twice: as a stream cut
//! into chunks at fuzzer-chosen points (almost everything stops at COBS,
//! the CRC or the MAC), and as a heartbeat body sealed behind a valid CRC
//! and MAC, so the message parser sees arbitrary bodies. Never a panic;
//! a sealed body that decodes must re-encode to the same frame (the format
//! is canonical: nothing is accepted that we would not have written).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::heartbeat::frame::{decode_frame, encode_frame, encode_raw_frame, FrameDecoder};
use quire::transport::ClusterKey;

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([7; 32]);

    // The stream: the first byte picks the chunk size.
    let mut d = FrameDecoder::new(key.clone());
    let (chunk, rest) = match data.split_first() {
        Some((&c, rest)) => (c as usize % 64 + 1, rest),
        None => (1, data),
    };
    for c in rest.chunks(chunk) {
        d.push(c);
        while let Some(r) = d.next_frame() {
            // A fuzzer does not forge MACs; anything accepted must at
            // least be a valid heartbeat.
            if let Ok(hb) = r {
                hb.validate().expect("accepted an invalid heartbeat");
            }
        }
    }

    // The same bytes as a body behind a valid CRC and MAC.
    let mut sealed = Vec::new();
    encode_raw_frame(&key, data, &mut sealed);
    let Ok(hb) = decode_frame(&key, &sealed[1..sealed.len() - 1]) else {
        return;
    };
    let mut again = Vec::new();
    encode_frame(&key, &hb, &mut again).expect("a decoded heartbeat re-encodes");
    assert_eq!(again, sealed, "decode then encode changed the bytes");
});
