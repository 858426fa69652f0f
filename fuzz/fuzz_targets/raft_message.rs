//! The consensus message decoder on untrusted bytes: never a panic, never
//! an allocation beyond a small multiple of the input (libFuzzer's
//! -rss_limit_mb catches that), and whatever decodes re-encodes to the
//! same bytes. The same bytes as a chunk of a streamed snapshot image (a
//! header, or a run of entries): never a panic, and what decodes encodes
//! back to bytes that decode to the same. As a delivered
//! Raft envelope (`decode_raft_delivery`, whose appends share the buffer):
//! the same outcome as decoding by copy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::consensus::image::{decode_entries, encode_entries, ImageHeader};
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
    if let Some(h) = data.get(8..16).map(|b| u64::from_le_bytes(b.try_into().unwrap())) {
        if let Some(header) = ImageHeader::decode(data, h) {
            assert_eq!(&header.encode()[..], &data[..36]);
        }
    }
    let first = data.get(8..16).map_or(1, |b| u64::from_le_bytes(b.try_into().unwrap()));
    if let Some(entries) = decode_entries(data, first, u64::MAX) {
        let mut again = Vec::new();
        encode_entries(&entries, &mut again);
        // Membership id sets may repeat or misorder ids: compared decoded.
        assert_eq!(decode_entries(&again, first, u64::MAX), Some(entries));
    }
});
