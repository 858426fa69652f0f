//! A live endpoint fed a sequence of datagrams: raw bytes, or arbitrary
//! frames sealed behind a valid header from one of a few peer epochs
//! (so restarts, replays and stale epochs occur), with time moving on and
//! every output drained. Exercises the protocol logic behind the decoder:
//! no panic, no failed internal assertion, whatever authenticated peers say.
//! Datagrams of odd length go through the batched receive path
//! (`handle_datagrams`, MACs computed side by side), in pairs (the second a
//! copy with its last byte flipped, which must fail its MAC), and every
//! other turn's output through `poll_transmits`, each datagram of which
//! must decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::transport::wire::{self, DatagramWriter, Header, DATAGRAM_BYTES_MAX};
use quire::transport::{ClusterKey, DropReason, Endpoint, TransportConfig};

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([9; 32]);
    let cfg = TransportConfig {
        // Small bounds, so that the fuzzer reaches them.
        window_bytes: 64 << 10,
        window_frames_max: 64,
        holdback_bytes_max: 64 << 10,
        holdback_frames_max: 64,
        message_bytes_max: 32 << 10,
        history_bytes_max: 48 << 10,
        events_bytes_max: 128 << 10,
        channels_max: 8,
        peers_max: 3,
        ..TransportConfig::default()
    };
    let mut ep = Endpoint::new(cfg, key.clone(), 2, 1).expect("valid config");
    let mut now_us = 0u64;
    let mut buf = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let (op, len) = (rest[0], rest[1] as usize);
        rest = &rest[2..];
        let chunk = &rest[..len.min(rest.len())];
        rest = &rest[chunk.len()..];
        now_us += (op as u64 >> 4) * 300;
        match op & 3 {
            0 if len & 1 == 1 => {
                let mut flipped = chunk.to_vec();
                if let Some(last) = flipped.last_mut() {
                    *last ^= 1;
                }
                let before = ep.stats().mac_failures;
                let mut second_failed_mac = false;
                ep.handle_datagrams(now_us, &[chunk, &flipped], |i, why| {
                    second_failed_mac |= i == 1
                        && why == DropReason::Decode(wire::DecodeError::BadMac);
                });
                if wire::decode(&key, chunk).is_ok() {
                    assert!(second_failed_mac && ep.stats().mac_failures > before);
                }
            }
            0 => {
                let _ = ep.handle_datagram(now_us, chunk);
            }
            1 | 2 => {
                let header = Header {
                    sender: 1 + (op as u64 >> 6 & 1) * 2,
                    receiver: 2,
                    epoch: 10 + (op as u64 >> 2 & 3),
                    peer_epoch: if op & 2 == 0 { 0 } else { ep.epoch() },
                    sent_us: now_us as u32,
                    echo: None,
                };
                let mut d = Vec::new();
                drop(DatagramWriter::new(&mut d, &header, DATAGRAM_BYTES_MAX));
                d.extend_from_slice(chunk);
                wire::seal(&key, &mut d);
                if len & 1 == 1 {
                    ep.handle_datagrams(now_us, &[&d], |_, _| {});
                } else {
                    let _ = ep.handle_datagram(now_us, &d);
                }
            }
            _ => {
                let peer = 1 + (op as u64 >> 2 & 3);
                let size = chunk.len() * 97;
                let _ = ep.send(peer, (op >> 4) as u32 & 3, &vec![op; size]);
            }
        }
        if ep.poll_timeout().is_some_and(|t| t <= now_us) {
            ep.handle_timeout(now_us);
        }
        if op & 1 == 1 {
            let mut out = Vec::new();
            while ep.poll_transmits(now_us, 8, &mut buf, &mut out) > 0 {
                let mut at = 0;
                for t in &out {
                    assert!(t.size_bytes <= ep.config().datagram_bytes_max());
                    wire::decode(&key, &buf[at..at + t.size_bytes]).expect("sealed");
                    at += t.size_bytes;
                }
            }
        } else {
            while ep.poll_transmit(now_us, &mut buf).is_some() {
                assert!(buf.len() <= ep.config().datagram_bytes_max());
                wire::decode(&key, &buf).expect("sealed");
            }
        }
        while ep.poll_event().is_some() {}
    }
});
