//! The consensus message decoder on untrusted bytes: never a panic, never
//! an allocation beyond a small multiple of the input (libFuzzer's
//! -rss_limit_mb catches that), and whatever decodes re-encodes to the
//! same bytes. The same bytes as a snapshot image (what a whole
//! InstallSnapshot transfer carries): never a panic, and what decodes
//! encodes back to an image that decodes to the same. As a delivered
//! Raft envelope (`decode_raft_delivery`, whose appends share the buffer):
//! the same outcome as decoding by copy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::consensus::{decode_image, encode_image};
use quire::transport::raft_codec::{
    decode_message, decode_raft_delivery, encode_message_to_vec, ENVELOPE_RAFT,
};

fuzz_target!(|data: &[u8]| {
    let mut delivered = vec![ENVELOPE_RAFT];
    delivered.extend_from_slice(data);
    assert_eq!(decode_raft_delivery(delivered).0, decode_message(data));
    if let Ok(m) = decode_message(data) {
        assert_eq!(encode_message_to_vec(&m), data, "not canonical: {m:?}");
    }
    if let Some((meta, entries)) = decode_image(data, u64::MAX) {
        let again = encode_image(&meta, &entries);
        assert_eq!(decode_image(&again, u64::MAX), Some((meta, entries)));
    }
});
