//! The consensus message decoder on untrusted bytes: never a panic, never
//! an allocation beyond a small multiple of the input (libFuzzer's
//! -rss_limit_mb catches that), and whatever decodes re-encodes to the
//! same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::transport::raft_codec::{decode_message, encode_message_to_vec};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_message(data) {
        assert_eq!(encode_message_to_vec(&m), data, "not canonical: {m:?}");
    }
});
