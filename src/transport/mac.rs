//! The cluster key and the datagram MAC: keyed BLAKE3 over header and
//! frames, truncated to 16 bytes, compared in constant time.
//!
//! [`ClusterKey::tags`] computes the same MACs for many datagrams at once.
//! One BLAKE3 input of a datagram's size (1–2 KiB) is one or two chunks,
//! which the SIMD code cannot spread over its lanes (that needs many
//! chunks), so hashed one by one it runs at a fifth of BLAKE3's speed. The
//! batch instead hashes the same chunk of up to 16 datagrams side by side
//! with BLAKE3's own many-input compression (`hash_many`, one lane per
//! datagram), and finishes each datagram's last block and root node on
//! its own. The result is bit for bit `blake3::keyed_hash` (the tests
//! compare the two for every length), so the wire does not change.
//!
//! This file owns the only use of the key. It must never log or format the
//! key, and never compare tags with `==` (a timing leak lets an attacker
//! forge a tag byte by byte).

/// Bytes of the MAC that ends every datagram.
pub const MAC_BYTES: usize = 16;

/// Context string for [`ClusterKey::derive`]; changing it changes every key.
const DERIVE_CONTEXT: &str = "quire 2025 transport cluster key v1";

/// The secret shared by every node of a cluster; authenticates datagrams.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// A key from 32 secret bytes (for example read from a key file).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterKey(bytes)
    }

    /// A key derived from secret material of any length (a passphrase or a
    /// longer key file) with BLAKE3's key derivation mode.
    pub fn derive(secret: &[u8]) -> Self {
        ClusterKey(blake3::derive_key(DERIVE_CONTEXT, secret))
    }

    /// The MAC of `data`.
    pub(crate) fn tag(&self, data: &[u8]) -> [u8; MAC_BYTES] {
        let full = blake3::keyed_hash(&self.0, data);
        let mut tag = [0u8; MAC_BYTES];
        tag.copy_from_slice(&full.as_bytes()[..MAC_BYTES]);
        tag
    }

    /// True if `tag` is the MAC of `data`, compared in constant time.
    pub(crate) fn verify(&self, data: &[u8], tag: &[u8; MAC_BYTES]) -> bool {
        Self::tags_equal(&self.tag(data), tag)
    }

    /// Compares two tags in constant time.
    pub(crate) fn tags_equal(a: &[u8; MAC_BYTES], b: &[u8; MAC_BYTES]) -> bool {
        constant_time_eq::constant_time_eq_16(a, b)
    }
}

/// BLAKE3's domain flags (the BLAKE3 specification, section 2.1).
const CHUNK_START: u8 = 1 << 0;
const CHUNK_END: u8 = 1 << 1;
const PARENT: u8 = 1 << 2;
const ROOT: u8 = 1 << 3;
const KEYED_HASH: u8 = 1 << 4;
/// Bytes of a BLAKE3 block and of a chunk.
const BLOCK: usize = blake3::BLOCK_LEN;
const CHUNK: usize = blake3::CHUNK_LEN;
/// Inputs up to this long (two chunks: a datagram at any MTU up to 2 KiB)
/// take the batched path; longer ones already use the SIMD lanes for
/// their own chunks and are hashed one by one.
const BATCH_INPUT_MAX: usize = 2 * CHUNK;
/// Inputs hashed side by side: the widest SIMD degree (AVX-512).
const LANES: usize = 16;

/// `platform.hash_many` of the first `blocks` whole blocks of every input
/// (each at least that long), `flags` on every block, `flags_start` on the
/// first and `flags_end` on the last: the chaining values after those
/// blocks (for a root node, its hash), 32 bytes each, into `out`.
#[allow(clippy::too_many_arguments)]
fn hash_prefixes(
    platform: &blake3::platform::Platform,
    inputs: &[&[u8]],
    blocks: usize,
    key: &[u32; 8],
    counter: u64,
    flags: u8,
    flags_start: u8,
    flags_end: u8,
    out: &mut [u8],
) {
    macro_rules! arms {
        ($($k:literal)*) => {
            match blocks {
                $($k => {
                    let mut refs: [&[u8; $k * BLOCK]; LANES] = [&[0; $k * BLOCK]; LANES];
                    for (r, input) in refs.iter_mut().zip(inputs) {
                        *r = input[..$k * BLOCK].try_into().expect("length checked");
                    }
                    platform.hash_many(
                        &refs[..inputs.len()],
                        key,
                        counter,
                        blake3::IncrementCounter::No,
                        flags,
                        flags_start,
                        flags_end,
                        out,
                    );
                })*
                _ => unreachable!("1 to 16 blocks"),
            }
        };
    }
    assert!(inputs.len() <= LANES && out.len() == 32 * inputs.len());
    arms!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
}

fn words(cv: &[u8]) -> [u32; 8] {
    let mut w = [0u32; 8];
    for (w, b) in w.iter_mut().zip(cv.chunks_exact(4)) {
        *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    w
}

fn le_bytes(w: &[u32; 8]) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (b, w) in b.chunks_exact_mut(4).zip(w) {
        b.copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// Where an input of the batched path (at most two chunks) has its last
/// chunk: (offset, chunk counter, whole blocks before that chunk's last
/// block). A chunk always has a last block, empty only for empty input.
fn last_chunk(len: usize) -> (usize, u64, usize) {
    let (off, counter) = if len > CHUNK { (CHUNK, 1) } else { (0, 0) };
    let blocks = (len - off).div_ceil(BLOCK).max(1) - 1;
    (off, counter, blocks)
}

impl ClusterKey {
    /// The MACs of every input, as [`ClusterKey::tag`] would compute them
    /// one by one, into `out` (cleared first), hashing up to 16 inputs of
    /// at most 2 KiB side by side.
    pub(crate) fn tags(&self, inputs: &[&[u8]], out: &mut Vec<[u8; MAC_BYTES]>) {
        out.clear();
        let platform = blake3::platform::Platform::detect();
        let key = blake3::platform::words_from_le_bytes_32(&self.0);
        for lane in inputs.chunks(LANES) {
            let base = out.len();
            out.resize(base + lane.len(), [0; MAC_BYTES]);
            self.tags_of_lane(&platform, &key, lane, &mut out[base..]);
        }
    }

    /// [`ClusterKey::tags`] of at most [`LANES`] inputs.
    fn tags_of_lane(
        &self,
        platform: &blake3::platform::Platform,
        key: &[u32; 8],
        inputs: &[&[u8]],
        out: &mut [[u8; MAC_BYTES]],
    ) {
        // Per input: the chaining value of its first chunk, if it has two,
        // and the chaining value before its last block.
        let mut first_cv = [[0u8; 32]; LANES];
        let mut cv = [*key; LANES];
        // Scratch of one hash_many call: which inputs, their bytes, CVs.
        let mut pick = [0usize; LANES];
        let mut sel: [&[u8]; LANES] = [&[]; LANES];
        let mut cvs = [0u8; 32 * LANES];
        let batched = |input: &[u8]| input.len() <= BATCH_INPUT_MAX;
        // The first chunks of the two-chunk inputs, whole.
        let mut m = 0;
        for (i, input) in inputs.iter().enumerate() {
            if batched(input) && input.len() > CHUNK {
                (pick[m], sel[m]) = (i, input);
                m += 1;
            }
        }
        if m > 0 {
            let out = &mut cvs[..32 * m];
            hash_prefixes(
                platform,
                &sel[..m],
                CHUNK / BLOCK,
                key,
                0,
                KEYED_HASH,
                CHUNK_START,
                CHUNK_END,
                out,
            );
            for k in 0..m {
                first_cv[pick[k]].copy_from_slice(&cvs[32 * k..32 * k + 32]);
            }
        }
        // The last chunk of each: its whole blocks but the last, one call
        // per (chunk counter, number of blocks).
        let mut shape = [None; LANES];
        for (sh, input) in shape.iter_mut().zip(inputs) {
            if batched(input) {
                *sh = Some(last_chunk(input.len()));
            }
        }
        let mut done = [false; LANES];
        for i in 0..inputs.len() {
            let Some((_, counter, blocks)) = shape[i] else {
                continue;
            };
            if done[i] || blocks == 0 {
                continue;
            }
            let mut m = 0;
            for j in i..inputs.len() {
                if let Some((off, c, b)) = shape[j] {
                    if !done[j] && c == counter && b == blocks {
                        done[j] = true;
                        (pick[m], sel[m]) = (j, &inputs[j][off..]);
                        m += 1;
                    }
                }
            }
            let out = &mut cvs[..32 * m];
            hash_prefixes(
                platform,
                &sel[..m],
                blocks,
                key,
                counter,
                KEYED_HASH,
                CHUNK_START,
                0,
                out,
            );
            for k in 0..m {
                cv[pick[k]] = words(&cvs[32 * k..32 * k + 32]);
            }
        }
        // Each input's last block; the root node of two-chunk inputs is
        // one more block (both chunks' chaining values), hashed side by
        // side after.
        let mut parents = [[0u8; BLOCK]; LANES];
        let mut m = 0;
        for (i, input) in inputs.iter().enumerate() {
            let Some((off, counter, blocks)) = shape[i] else {
                out[i] = self.tag(input);
                continue;
            };
            let rest = &input[off + blocks * BLOCK..];
            let mut block = [0u8; BLOCK];
            block[..rest.len()].copy_from_slice(rest);
            let mut flags = KEYED_HASH | CHUNK_END;
            if blocks == 0 {
                flags |= CHUNK_START;
            }
            if counter == 0 {
                flags |= ROOT;
            }
            let mut state = cv[i];
            platform.compress_in_place(&mut state, &block, rest.len() as u8, counter, flags);
            if counter == 1 {
                parents[m][..32].copy_from_slice(&first_cv[i]);
                parents[m][32..].copy_from_slice(&le_bytes(&state));
                pick[m] = i;
                m += 1;
            } else {
                out[i].copy_from_slice(&le_bytes(&state)[..MAC_BYTES]);
            }
        }
        if m > 0 {
            for k in 0..m {
                sel[k] = &parents[k];
            }
            let root = KEYED_HASH | PARENT | ROOT;
            hash_prefixes(
                platform,
                &sel[..m],
                1,
                key,
                0,
                root,
                0,
                0,
                &mut cvs[..32 * m],
            );
            for k in 0..m {
                out[pick[k]].copy_from_slice(&cvs[32 * k..32 * k + MAC_BYTES]);
            }
        }
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, not even in a panic message.
        f.write_str("ClusterKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_depends_on_key_and_data() {
        let a = ClusterKey::derive(b"secret a");
        let b = ClusterKey::derive(b"secret b");
        let t = a.tag(b"hello");
        assert!(a.verify(b"hello", &t));
        assert!(!b.verify(b"hello", &t));
        assert!(!a.verify(b"hellp", &t));
        let mut forged = t;
        forged[15] ^= 1;
        assert!(!a.verify(b"hello", &forged));
    }

    #[test]
    fn batched_tags_are_keyed_blake3_at_every_length() {
        let key = ClusterKey::derive(b"batch");
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // Every length up to three chunks, in batches of mixed lengths and
        // sizes (1 to 40 inputs: a partial lane, a full one, more).
        let lens: Vec<usize> = (0..=3 * CHUNK).chain([4095, 4096, 4097, 5000]).collect();
        let mut out = Vec::new();
        let mut at = 0;
        let mut size = 1;
        while at < lens.len() {
            let batch: Vec<&[u8]> = lens[at..(at + size).min(lens.len())]
                .iter()
                .enumerate()
                .map(|(k, &l)| &data[k % 7..k % 7 + l.min(data.len() - 7)])
                .collect();
            key.tags(&batch, &mut out);
            assert_eq!(out.len(), batch.len());
            for (input, tag) in batch.iter().zip(&out) {
                assert_eq!(*tag, key.tag(input), "length {}", input.len());
            }
            at += size;
            size = size % 40 + 1;
        }
        key.tags(&[], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn batched_tags_of_equal_datagrams_match_one_by_one() {
        let key = ClusterKey::derive(b"batch lanes");
        let data = vec![0x5au8; 45 * 1436];
        let batch: Vec<&[u8]> = data.chunks(1436).collect();
        let mut out = Vec::new();
        key.tags(&batch, &mut out);
        for (input, tag) in batch.iter().zip(&out) {
            assert_eq!(*tag, key.tag(input));
        }
        assert_ne!(out[0], ClusterKey::derive(b"other").tag(batch[0]));
    }

    #[test]
    fn debug_hides_the_key() {
        let k = ClusterKey::from_bytes([0xab; 32]);
        assert_eq!(format!("{k:?}"), "ClusterKey(..)");
    }
}
