//! Heartbeats on a serial line: COBS frames delimited by 0x00, each holding
//! one heartbeat, its CRC32C and a keyed-BLAKE3 MAC with the cluster key;
//! and a streaming decoder that takes bytes as the line delivers them.
//!
//! ```text
//! on the line:  0x00  COBS(payload)  0x00
//! payload:      heartbeat (message.rs, 30..=478 bytes)
//!               crc32c(heartbeat) u32 little-endian
//!               keyed BLAKE3(cluster key, heartbeat || crc), first 16 bytes
//! ```
//!
//! - **Why COBS**: after encoding, 0x00 appears only as the delimiter, so a
//!   receiver that joins mid-frame, or sees garbage, or loses bytes to a
//!   cut cable, resynchronises at the next 0x00 with no escape state and a
//!   fixed worst-case overhead (1 byte per 254). Each frame also *starts*
//!   with 0x00, so a partial frame left by a cut cable is cut off by the
//!   next frame's first byte instead of swallowing it. Hand-written (40
//!   lines, fuzzed) rather than a dependency: we need a decoder that works
//!   on one bounded buffer with no allocation per frame, and it is smaller
//!   than any crate's API surface.
//! - **Why a CRC and a MAC**: the MAC alone would reject line noise too,
//!   but then noise and a wrong key look the same. The CRC is checked first
//!   so the counters tell the operator which one it is: `bad_crc` is a
//!   noisy or mis-set line (baud, parity), `bad_mac` a wrong key or a forger.
//! - **Bounds**: the decoder holds at most [`ENCODED_BYTES_MAX`] bytes of an
//!   unfinished frame; longer runs without a delimiter are counted once as
//!   oversize and skipped to the next 0x00. Decoded results wait in a queue
//!   of [`OUTPUTS_MAX`]; beyond it the oldest is dropped and counted.
//!
//! Untrusted input never panics here and nothing is accepted without a
//! valid CRC and MAC; replays are the caller's to drop ([`super::replay`]).

use std::collections::VecDeque;

use super::message::{Heartbeat, MessageError, HEADER_BYTES, MESSAGE_BYTES_MAX};
use crate::transport::{ClusterKey, MAC_BYTES};

/// Bytes of the CRC32C after the heartbeat.
pub const CRC_BYTES: usize = 4;
/// Smallest payload (heartbeat + CRC + MAC) a frame can carry.
pub const PAYLOAD_BYTES_MIN: usize = HEADER_BYTES + CRC_BYTES + MAC_BYTES;
/// Largest payload a frame can carry.
pub const PAYLOAD_BYTES_MAX: usize = MESSAGE_BYTES_MAX + CRC_BYTES + MAC_BYTES;
/// Largest COBS encoding of a payload (one code byte per 254 data bytes,
/// plus the first).
pub const ENCODED_BYTES_MAX: usize = PAYLOAD_BYTES_MAX + PAYLOAD_BYTES_MAX / 254 + 1;
/// Largest frame on the line, both delimiters included.
pub const FRAME_BYTES_MAX: usize = ENCODED_BYTES_MAX + 2;
/// Decoded results the decoder holds before dropping the oldest.
pub const OUTPUTS_MAX: usize = 64;

/// Why a frame was rejected; each kind has its counter in [`DecoderStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Not a valid COBS encoding (a code byte pointing past the frame).
    BadCobs,
    /// More than [`ENCODED_BYTES_MAX`] bytes without a delimiter.
    Oversize,
    /// A decoded payload shorter or longer than any heartbeat frame.
    WrongLength,
    /// The CRC32C does not match: line noise, or baud/parity mis-set.
    BadCrc,
    /// The MAC does not match: another cluster's key, or a forgery.
    BadMac,
    /// Authentic, but not a heartbeat this build accepts.
    Malformed(MessageError),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for FrameError {}

/// Counters of one decoder; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecoderStats {
    /// Bytes passed to `push`.
    pub bytes_received: u64,
    /// Frames that decoded to a heartbeat.
    pub frames_ok: u64,
    /// Frames rejected: invalid COBS.
    pub bad_cobs: u64,
    /// Runs of bytes without a delimiter longer than any frame.
    pub oversize: u64,
    /// Frames rejected: payload length impossible for a heartbeat.
    pub wrong_length: u64,
    /// Frames rejected: CRC mismatch.
    pub bad_crc: u64,
    /// Frames rejected: MAC mismatch.
    pub bad_mac: u64,
    /// Frames rejected: authentic but not a valid heartbeat.
    pub malformed: u64,
    /// Bytes skipped while resynchronising after an oversize run.
    pub bytes_discarded: u64,
    /// Results dropped because the caller did not drain [`OUTPUTS_MAX`].
    pub outputs_dropped: u64,
}

impl DecoderStats {
    /// Every rejected frame or oversize run, of any kind.
    pub fn errors(&self) -> u64 {
        self.bad_cobs
            + self.oversize
            + self.wrong_length
            + self.bad_crc
            + self.bad_mac
            + self.malformed
    }
}

/// Appends one complete frame for `hb` (both delimiters included) to `out`.
pub fn encode_frame(
    key: &ClusterKey,
    hb: &Heartbeat,
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    let mut body = Vec::with_capacity(MESSAGE_BYTES_MAX);
    hb.encode(&mut body)?;
    encode_raw_frame(key, &body, out);
    Ok(())
}

/// Appends a frame around arbitrary body bytes, with a valid CRC and MAC:
/// for tests and fuzzing of what lies behind the checks. A node sends
/// only [`encode_frame`].
pub fn encode_raw_frame(key: &ClusterKey, body: &[u8], out: &mut Vec<u8>) {
    let mut payload = Vec::with_capacity(body.len() + CRC_BYTES + MAC_BYTES);
    payload.extend_from_slice(body);
    let crc = crc32c::crc32c(body);
    payload.extend_from_slice(&crc.to_le_bytes());
    let tag = key.tag(&payload);
    payload.extend_from_slice(&tag);
    out.push(0);
    cobs_encode(&payload, out);
    out.push(0);
}

/// Decodes one frame's payload (without delimiters) to a heartbeat.
pub fn decode_frame(key: &ClusterKey, encoded: &[u8]) -> Result<Heartbeat, FrameError> {
    let mut payload = Vec::with_capacity(PAYLOAD_BYTES_MAX);
    decode_into(key, encoded, &mut payload)
}

fn decode_into(
    key: &ClusterKey,
    encoded: &[u8],
    payload: &mut Vec<u8>,
) -> Result<Heartbeat, FrameError> {
    payload.clear();
    if encoded.len() > ENCODED_BYTES_MAX {
        return Err(FrameError::Oversize);
    }
    cobs_decode(encoded, payload).map_err(|()| FrameError::BadCobs)?;
    if !(PAYLOAD_BYTES_MIN..=PAYLOAD_BYTES_MAX).contains(&payload.len()) {
        return Err(FrameError::WrongLength);
    }
    let (signed, tag) = payload.split_at(payload.len() - MAC_BYTES);
    let (body, crc) = signed.split_at(signed.len() - CRC_BYTES);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(FrameError::BadCrc);
    }
    let mut t = [0u8; MAC_BYTES];
    t.copy_from_slice(tag);
    if !key.verify(signed, &t) {
        return Err(FrameError::BadMac);
    }
    Heartbeat::decode(body).map_err(FrameError::Malformed)
}

/// COBS encoding of `input` appended to `out` (no delimiter).
fn cobs_encode(input: &[u8], out: &mut Vec<u8>) {
    let mut code_at = out.len();
    out.push(0);
    let mut code: u8 = 1;
    for &b in input {
        if b != 0 {
            out.push(b);
            code += 1;
        }
        if b == 0 || code == 0xFF {
            out[code_at] = code;
            code_at = out.len();
            out.push(0);
            code = 1;
        }
    }
    out[code_at] = code;
}

/// COBS decoding of `input` (no delimiter) appended to `out`.
fn cobs_decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
    let mut i = 0;
    while i < input.len() {
        let code = input[i] as usize;
        i += 1;
        // A zero code byte cannot occur inside a frame: the delimiter
        // would have ended it. A run pointing past the end is a cut frame.
        if code == 0 || i + code - 1 > input.len() {
            return Err(());
        }
        let run = &input[i..i + code - 1];
        if run.contains(&0) {
            return Err(());
        }
        out.extend_from_slice(run);
        i += code - 1;
        if code != 0xFF && i < input.len() {
            out.push(0);
        }
    }
    Ok(())
}

/// Turns a stream of bytes from the line, in chunks of any size, into
/// heartbeats and counted errors. Call [`FrameDecoder::push`] with every
/// chunk read, then drain [`FrameDecoder::next_frame`].
#[derive(Debug)]
pub struct FrameDecoder {
    key: ClusterKey,
    /// Encoded bytes of the frame in progress, at most `ENCODED_BYTES_MAX`.
    buf: Vec<u8>,
    /// Scratch for the decoded payload, reused.
    payload: Vec<u8>,
    /// Skipping to the next delimiter after an oversize run.
    discarding: bool,
    outputs: VecDeque<Result<Heartbeat, FrameError>>,
    stats: DecoderStats,
}

impl FrameDecoder {
    /// A decoder that accepts frames MAC'd with `key`.
    pub fn new(key: ClusterKey) -> Self {
        FrameDecoder {
            key,
            buf: Vec::with_capacity(ENCODED_BYTES_MAX),
            payload: Vec::with_capacity(PAYLOAD_BYTES_MAX),
            discarding: false,
            outputs: VecDeque::with_capacity(OUTPUTS_MAX),
            stats: DecoderStats::default(),
        }
    }

    /// Feeds bytes read from the line; results wait in `next_frame`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.stats.bytes_received += bytes.len() as u64;
        for &b in bytes {
            if b == 0 {
                if self.discarding {
                    self.discarding = false;
                } else if !self.buf.is_empty() {
                    let r = decode_into(&self.key, &self.buf, &mut self.payload);
                    self.buf.clear();
                    self.output(r);
                }
            } else if self.discarding {
                self.stats.bytes_discarded += 1;
            } else if self.buf.len() == ENCODED_BYTES_MAX {
                self.stats.bytes_discarded += self.buf.len() as u64 + 1;
                self.buf.clear();
                self.discarding = true;
                self.output(Err(FrameError::Oversize));
            } else {
                self.buf.push(b);
            }
        }
        assert!(self.buf.len() <= ENCODED_BYTES_MAX && self.outputs.len() <= OUTPUTS_MAX);
    }

    /// The next decoded heartbeat or rejected frame, oldest first.
    #[must_use]
    pub fn next_frame(&mut self) -> Option<Result<Heartbeat, FrameError>> {
        self.outputs.pop_front()
    }

    /// Forgets a frame in progress: call when the line was reopened, so
    /// bytes from before and after do not join into one bad frame.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.discarding = false;
    }

    /// The counters.
    pub fn stats(&self) -> &DecoderStats {
        &self.stats
    }

    fn output(&mut self, r: Result<Heartbeat, FrameError>) {
        let s = &mut self.stats;
        match r {
            Ok(_) => s.frames_ok += 1,
            Err(FrameError::BadCobs) => s.bad_cobs += 1,
            Err(FrameError::Oversize) => s.oversize += 1,
            Err(FrameError::WrongLength) => s.wrong_length += 1,
            Err(FrameError::BadCrc) => s.bad_crc += 1,
            Err(FrameError::BadMac) => s.bad_mac += 1,
            Err(FrameError::Malformed(_)) => s.malformed += 1,
        }
        if self.outputs.len() == OUTPUTS_MAX {
            self.outputs.pop_front();
            self.stats.outputs_dropped += 1;
        }
        self.outputs.push_back(r);
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::tests::sample;
    use super::super::message::GROUPS_MAX;
    use super::super::message::PEERS_MAX;
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn key() -> ClusterKey {
        ClusterKey::derive(b"serial test key")
    }

    fn frame(hb: &Heartbeat) -> Vec<u8> {
        let mut v = Vec::new();
        encode_frame(&key(), hb, &mut v).unwrap();
        v
    }

    fn drain(d: &mut FrameDecoder) -> Vec<Result<Heartbeat, FrameError>> {
        std::iter::from_fn(|| d.next_frame()).collect()
    }

    /// Re-frames an arbitrary payload with valid delimiters and COBS.
    fn reframe(payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        cobs_encode(payload, &mut v);
        v.push(0);
        v
    }

    /// The payload inside a frame of ours.
    fn payload_of(frame: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        cobs_decode(&frame[1..frame.len() - 1], &mut p).unwrap();
        p
    }

    #[test]
    fn cobs_round_trips_edge_lengths() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for len in (0..600).chain([253, 254, 255, 508, 509]) {
            for zeros in [0.0, 0.1, 1.0] {
                let input: Vec<u8> = (0..len)
                    .map(|_| {
                        if rng.gen_bool(zeros) {
                            0
                        } else {
                            rng.gen_range(1..=255)
                        }
                    })
                    .collect();
                let mut enc = Vec::new();
                cobs_encode(&input, &mut enc);
                assert!(!enc.contains(&0));
                assert!(enc.len() <= input.len() + input.len() / 254 + 1, "{len}");
                let mut dec = Vec::new();
                cobs_decode(&enc, &mut dec).unwrap();
                assert_eq!(dec, input);
            }
        }
    }

    #[test]
    fn frames_round_trip_in_any_chunking() {
        let hbs: Vec<Heartbeat> = (0..20)
            .map(|i| sample(i % (GROUPS_MAX + 1), i % (PEERS_MAX + 1)))
            .collect();
        let stream: Vec<u8> = hbs.iter().flat_map(frame).collect();
        assert!(hbs.iter().all(|h| frame(h).len() <= FRAME_BYTES_MAX));
        // The line sizes the docs quote (airtime at 115200 baud: 10 bits a byte).
        assert_eq!(frame(&sample(2, 2)).len(), 165);
        assert_eq!(FRAME_BYTES_MAX, 502);
        assert!(frame(&sample(GROUPS_MAX, PEERS_MAX)).len() <= FRAME_BYTES_MAX);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..50 {
            let mut d = FrameDecoder::new(key());
            let mut rest = &stream[..];
            while !rest.is_empty() {
                let n = rng.gen_range(1..=rest.len().min(300));
                d.push(&rest[..n]);
                rest = &rest[n..];
            }
            let got: Vec<Heartbeat> = drain(&mut d).into_iter().map(Result::unwrap).collect();
            assert_eq!(got, hbs);
            assert_eq!(d.stats().errors(), 0);
            assert_eq!(d.stats().frames_ok, 20);
        }
    }

    #[test]
    fn rejects_bad_cobs() {
        let mut d = FrameDecoder::new(key());
        // A code byte of 10 with only 3 bytes after it: a cut run.
        d.push(&[0, 10, 1, 2, 3, 0]);
        assert_eq!(drain(&mut d), vec![Err(FrameError::BadCobs)]);
        assert_eq!(d.stats().bad_cobs, 1);
    }

    #[test]
    fn rejects_wrong_length() {
        let mut d = FrameDecoder::new(key());
        d.push(&reframe(&[1; PAYLOAD_BYTES_MIN - 1]));
        // Zeros: COBS adds only one byte, so this fits the buffer but not a heartbeat.
        d.push(&reframe(&[0; PAYLOAD_BYTES_MAX + 1]));
        assert_eq!(drain(&mut d), vec![Err(FrameError::WrongLength); 2]);
        assert_eq!(d.stats().wrong_length, 2);
    }

    #[test]
    fn rejects_bad_crc_for_every_flipped_bit_of_the_body() {
        let good = payload_of(&frame(&sample(1, 1)));
        let body_len = good.len() - CRC_BYTES - MAC_BYTES;
        let mut d = FrameDecoder::new(key());
        for bit in 0..(body_len + CRC_BYTES) * 8 {
            let mut p = good.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            d.push(&reframe(&p));
            assert_eq!(d.next_frame(), Some(Err(FrameError::BadCrc)), "bit {bit}");
        }
        // A flipped MAC bit passes the CRC and fails the MAC.
        let mut p = good.clone();
        *p.last_mut().unwrap() ^= 1;
        d.push(&reframe(&p));
        assert_eq!(d.next_frame(), Some(Err(FrameError::BadMac)));
    }

    #[test]
    fn rejects_another_key() {
        let mut d = FrameDecoder::new(ClusterKey::derive(b"another cluster"));
        d.push(&frame(&sample(2, 2)));
        assert_eq!(drain(&mut d), vec![Err(FrameError::BadMac)]);
        assert_eq!(d.stats().bad_mac, 1);
        assert_eq!(d.stats().frames_ok, 0);
    }

    #[test]
    fn rejects_authentic_but_malformed() {
        // Valid CRC and MAC around a body with a bad version byte.
        let mut body = Vec::new();
        sample(1, 1).encode(&mut body).unwrap();
        body[2] = 9;
        let mut f = Vec::new();
        encode_raw_frame(&key(), &body, &mut f);
        let mut d = FrameDecoder::new(key());
        d.push(&f);
        assert_eq!(
            drain(&mut d),
            vec![Err(FrameError::Malformed(MessageError::BadVersion(9)))]
        );
        assert_eq!(d.stats().malformed, 1);
    }

    #[test]
    fn oversize_run_is_counted_once_and_resyncs() {
        let mut d = FrameDecoder::new(key());
        d.push(&vec![0x55; ENCODED_BYTES_MAX * 3]);
        assert_eq!(drain(&mut d), vec![Err(FrameError::Oversize)]);
        let hb = sample(2, 2);
        // The frame's leading delimiter ends the run; the frame decodes.
        d.push(&frame(&hb));
        assert_eq!(drain(&mut d), vec![Ok(hb)]);
        assert_eq!(d.stats().oversize, 1);
        assert!(d.stats().bytes_discarded >= (ENCODED_BYTES_MAX * 2) as u64);
    }

    #[test]
    fn resyncs_after_a_cut_frame() {
        let hb = sample(3, 2);
        let f = frame(&hb);
        let mut d = FrameDecoder::new(key());
        // Half a frame (cable cut), then whole frames: the cut one is one
        // counted error, every later one decodes.
        d.push(&f[..f.len() / 2]);
        d.push(&f);
        d.push(&f);
        let got = drain(&mut d);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].is_err());
        assert_eq!(&got[1..], &[Ok(hb), Ok(hb)]);
        // A frame joined mid-way (receiver started late): dropped, counted.
        let mut d = FrameDecoder::new(key());
        d.push(&f[f.len() / 2..]);
        d.push(&f);
        let got = drain(&mut d);
        assert_eq!(got.len(), 2);
        assert!(got[0].is_err() && got[1] == Ok(hb));
        assert_eq!(d.stats().errors(), 1);
    }

    #[test]
    fn queue_is_bounded_oldest_dropped() {
        let mut d = FrameDecoder::new(key());
        for seq in 1..=(OUTPUTS_MAX as u64 + 10) {
            let mut hb = sample(0, 0);
            hb.seq = seq;
            d.push(&frame(&hb));
        }
        let got = drain(&mut d);
        assert_eq!(got.len(), OUTPUTS_MAX);
        assert_eq!(got[0].unwrap().seq, 11);
        assert_eq!(d.stats().outputs_dropped, 10);
    }

    #[test]
    fn garbage_never_panics_and_never_decodes() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let good = frame(&sample(2, 2));
        let other = {
            let mut v = Vec::new();
            encode_frame(&ClusterKey::derive(b"wrong"), &sample(2, 2), &mut v).unwrap();
            v
        };
        let mut d = FrameDecoder::new(key());
        for round in 0..2000 {
            let mut chunk = vec![0u8; rng.gen_range(0..2 * FRAME_BYTES_MAX)];
            match round % 5 {
                // Uniform noise, zeros included.
                0 => rng.fill_bytes(&mut chunk),
                // Noise without delimiters: exercises the oversize path.
                1 => chunk.iter_mut().for_each(|b| *b = rng.gen_range(1..=255)),
                // Truncated frames of ours.
                2 => chunk = good[..rng.gen_range(0..good.len() - 1)].to_vec(),
                // Whole frames under the wrong key.
                3 => chunk = other.clone(),
                // Our frame with a few random bytes changed.
                _ => {
                    chunk = good.clone();
                    for _ in 0..rng.gen_range(1..4) {
                        let i = rng.gen_range(1..chunk.len() - 1);
                        chunk[i] = rng.gen_range(1..=255u8).wrapping_add(chunk[i]).max(1);
                    }
                    if chunk == good {
                        continue;
                    }
                }
            }
            d.push(&chunk);
            // A trailing delimiter so no garbage joins the next round's.
            d.push(&[0]);
            while let Some(r) = d.next_frame() {
                assert!(r.is_err(), "round {round} accepted garbage: {r:?}");
            }
        }
        assert_eq!(d.stats().frames_ok, 0);
        assert!(d.stats().bad_mac >= 400 && d.stats().errors() > 1000);
        // And the decoder still works afterwards.
        d.push(&good);
        assert!(matches!(d.next_frame(), Some(Ok(_))));
    }
}
