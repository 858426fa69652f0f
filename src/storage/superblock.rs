//! The superblock and snapshot files. Pure encoding and decoding.
//!
//! The superblock holds the hard state (term, vote, commit) and the log's
//! start (the snapshot it begins after). It is written as two alternating
//! 4 KiB copies, each with a sequence number and a CRC32C: a torn write
//! damages only the copy being written, and the other still holds the
//! previous state, so the superblock is always either old or new.
//!
//! A snapshot file holds a state-machine snapshot with its metadata and a
//! CRC32C; it is written to a temporary name, synced, then renamed.

use super::format::BLOCK_BYTES;
use crate::consensus::{HardState, Index, Membership, Snapshot, Term};

const SUPER_MAGIC: u32 = u32::from_le_bytes(*b"QSB1");
const SNAP_MAGIC: u32 = u32::from_le_bytes(*b"QSN1");
const SUPER_USED_BYTES: usize = 96;

/// One copy of the superblock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    /// Incremented at every write; the valid copy with the highest wins.
    pub seq: u64,
    /// Term, vote and commit.
    pub hard_state: HardState,
    /// The log starts after this snapshot (0 if none).
    pub snapshot_index: Index,
    /// Term of the entry at `snapshot_index`.
    pub snapshot_term: Term,
    /// Batches that may be in flight at once; recovery needs it to tell a
    /// torn tail from corruption.
    pub flushes_in_flight_max: u32,
    /// The sequence number of the first batch the log's current life
    /// writes (0: not recorded, a superblock from before it was). Batches
    /// below it were read back whole when this life opened, so damage in
    /// them is corruption, never a torn tail, whatever the window says
    /// (the window may have been smaller when they were written).
    pub life_start_seq: u64,
    /// The first segment a snapshot install is writing the entries kept
    /// with the snapshot into (0: none); they may fill more, each later.
    /// Until the superblock names the installed snapshot, those segments
    /// are not part of the log: they would read as a rewrite from the
    /// kept entries, cutting off the log a crash should leave in force,
    /// so recovery removes them.
    pub install_segment: u64,
    /// Recovery once found acknowledged entries damaged and the log then
    /// held entries up to here (0: no repair owed). Kept until the log is
    /// durable up to it: a snapshot install in between drops the damaged
    /// segments, and a later recovery would otherwise see a clean, short
    /// log and let the node vote without the entries it acknowledged.
    pub repair_until: Index,
}

impl Superblock {
    /// The 4 KiB image of this copy.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_BYTES);
        b.extend_from_slice(&SUPER_MAGIC.to_le_bytes());
        b.extend_from_slice(&self.flushes_in_flight_max.to_le_bytes());
        for v in [
            self.seq,
            self.hard_state.term,
            self.hard_state.vote.unwrap_or(0),
            self.hard_state.commit,
            self.snapshot_index,
            self.snapshot_term,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        // Added later, after the first checksum, with one of its own: a
        // copy written before holds zeros here, which fail it.
        b.extend_from_slice(&self.life_start_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        // Likewise, later still.
        b.extend_from_slice(&self.install_segment.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.extend_from_slice(&self.repair_until.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(b.len(), SUPER_USED_BYTES);
        b.resize(BLOCK_BYTES, 0);
        b
    }

    /// Decodes one copy; `None` if it is damaged or was never written.
    pub fn decode(b: &[u8]) -> Option<Superblock> {
        // A copy from before the later fields ends at its first checksum.
        if b.len() < 60 {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(0) != SUPER_MAGIC || crc32c::crc32c(&b[..56]) != u32_at(56) {
            return None;
        }
        let vote = u64_at(24);
        let recorded = |end: usize| b.len() >= end + 4 && crc32c::crc32c(&b[..end]) == u32_at(end);
        let life_recorded = recorded(68);
        let install_recorded = life_recorded && recorded(80);
        let repair_recorded = install_recorded && recorded(92);
        Some(Superblock {
            repair_until: if repair_recorded { u64_at(84) } else { 0 },
            life_start_seq: if life_recorded { u64_at(60) } else { 0 },
            install_segment: if install_recorded { u64_at(72) } else { 0 },
            flushes_in_flight_max: u32_at(4),
            seq: u64_at(8),
            hard_state: HardState {
                term: u64_at(16),
                vote: (vote != 0).then_some(vote),
                commit: u64_at(32),
            },
            snapshot_index: u64_at(40),
            snapshot_term: u64_at(48),
        })
    }

    /// The newer valid copy of the two, if any.
    pub fn pick(slot0: &[u8], slot1: &[u8]) -> Option<Superblock> {
        match (Self::decode(slot0), Self::decode(slot1)) {
            (Some(a), Some(b)) => Some(if a.seq >= b.seq { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// Byte offset of the slot this copy is written to.
    pub fn slot_offset(&self) -> u64 {
        (self.seq % 2) * BLOCK_BYTES as u64
    }
}

/// Encodes a snapshot file.
pub fn encode_snapshot(s: &Snapshot) -> Vec<u8> {
    let mut b = snapshot_header(s);
    b.extend_from_slice(&s.data);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The bytes of a snapshot file before its data: `encode_snapshot` is
/// this header, the data, then the CRC32C of both (little-endian u32), so
/// a writer can stream the data without copying it.
pub fn snapshot_header(s: &Snapshot) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&SNAP_MAGIC.to_le_bytes());
    b.extend_from_slice(&s.index.to_le_bytes());
    b.extend_from_slice(&s.term.to_le_bytes());
    b.extend_from_slice(&(s.membership.voters.len() as u32).to_le_bytes());
    b.extend_from_slice(&(s.membership.learners.len() as u32).to_le_bytes());
    for id in s
        .membership
        .voters
        .iter()
        .chain(s.membership.learners.iter())
    {
        b.extend_from_slice(&id.to_le_bytes());
    }
    b.extend_from_slice(&(s.data.len() as u64).to_le_bytes());
    b
}

/// Decodes a snapshot file; `None` if damaged.
pub fn decode_snapshot(b: &[u8]) -> Option<Snapshot> {
    let body_len = b.len().checked_sub(4)?;
    let (body, crc) = b.split_at(body_len);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = body.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u32v = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
    let u64v = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    if u32v(take(4)?) != SNAP_MAGIC {
        return None;
    }
    let index = u64v(take(8)?);
    let term = u64v(take(8)?);
    let voters = u32v(take(4)?) as usize;
    let learners = u32v(take(4)?) as usize;
    if voters.checked_add(learners)? > 1024 {
        return None;
    }
    let mut membership = Membership::default();
    for i in 0..voters + learners {
        let id = u64v(take(8)?);
        if i < voters {
            membership.voters.insert(id);
        } else {
            membership.learners.insert(id);
        }
    }
    let len = usize::try_from(u64v(take(8)?)).ok()?;
    let data = take(len)?.to_vec();
    if at != body.len() {
        return None;
    }
    Some(Snapshot {
        index,
        term,
        membership,
        data,
    })
}

/// Bytes a snapshot file must hold (header, data, checksum), from the
/// first `SNAPSHOT_HEADER_BYTES_MAX` bytes of it (or all, if fewer);
/// `None` if that much does not parse.
/// Nothing is checked but the lengths: `decode_snapshot` checks the rest.
pub fn snapshot_total_bytes(b: &[u8]) -> Option<u64> {
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let (voters, learners) = (u32_at(20)? as usize, u32_at(24)? as usize);
    if voters.checked_add(learners)? > 1024 {
        return None;
    }
    let len_at = 28 + 8 * (voters + learners);
    let len = u64::from_le_bytes(b.get(len_at..len_at + 8)?.try_into().ok()?);
    (len_at as u64 + 8).checked_add(len)?.checked_add(4)
}

/// The index a snapshot file's header names, if it has one.
pub fn snapshot_header_index(b: &[u8]) -> Option<u64> {
    (b.get(..4)? == SNAP_MAGIC.to_le_bytes()).then_some(())?;
    Some(u64::from_le_bytes(b.get(4..12)?.try_into().ok()?))
}

/// The longest snapshot header (1024 members, the most accepted).
pub const SNAPSHOT_HEADER_BYTES_MAX: usize = 28 + 8 * 1024 + 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_superblock_keeps_the_previous_state() {
        let old = Superblock {
            seq: 4,
            hard_state: HardState {
                term: 3,
                vote: Some(2),
                commit: 10,
            },
            flushes_in_flight_max: 1,
            ..Superblock::default()
        };
        let new = Superblock {
            seq: 5,
            hard_state: HardState {
                term: 4,
                vote: None,
                commit: 12,
            },
            ..old
        };
        let mut slots = [vec![0u8; BLOCK_BYTES], vec![0u8; BLOCK_BYTES]];
        slots[old.slot_offset() as usize / BLOCK_BYTES] = old.encode();
        let mut torn = new.encode();
        torn[20] ^= 0xff; // the write of the new copy was torn
        slots[new.slot_offset() as usize / BLOCK_BYTES] = torn;
        assert_eq!(Superblock::pick(&slots[0], &slots[1]), Some(old));
        slots[new.slot_offset() as usize / BLOCK_BYTES] = new.encode();
        assert_eq!(Superblock::pick(&slots[0], &slots[1]), Some(new));
        assert_eq!(Superblock::pick(&[0u8; 100], &[0u8; 100]), None);
    }

    #[test]
    fn life_start_survives_a_roundtrip_and_reads_as_zero_from_an_older_copy() {
        let sb = Superblock {
            seq: 9,
            life_start_seq: 1234,
            ..Superblock::default()
        };
        assert_eq!(Superblock::decode(&sb.encode()), Some(sb));
        // A copy written before the field: zeros after the first checksum.
        let mut older = sb.encode();
        older[60..72].fill(0);
        let decoded = Superblock::decode(&older).expect("still valid");
        assert_eq!(decoded.life_start_seq, 0);
        assert_eq!(decoded.seq, 9);
    }

    #[test]
    fn install_segment_survives_a_roundtrip_and_reads_as_zero_from_an_older_copy() {
        let sb = Superblock {
            seq: 3,
            life_start_seq: 77,
            install_segment: 12,
            ..Superblock::default()
        };
        assert_eq!(Superblock::decode(&sb.encode()), Some(sb));
        let mut older = sb.encode();
        older[72..84].fill(0);
        let decoded = Superblock::decode(&older).expect("still valid");
        assert_eq!((decoded.install_segment, decoded.life_start_seq), (0, 77));
    }

    #[test]
    fn repair_until_survives_a_roundtrip_and_reads_as_zero_from_an_older_copy() {
        let sb = Superblock {
            seq: 4,
            install_segment: 3,
            repair_until: 70,
            ..Superblock::default()
        };
        assert_eq!(Superblock::decode(&sb.encode()), Some(sb));
        let mut older = sb.encode();
        older[84..96].fill(0);
        let decoded = Superblock::decode(&older).expect("still valid");
        assert_eq!((decoded.repair_until, decoded.install_segment), (0, 3));
    }

    #[test]
    fn snapshot_roundtrip_and_damage() {
        let s = Snapshot {
            index: 40,
            term: 7,
            membership: Membership::with_voters([1, 2, 3]),
            data: b"state".to_vec(),
        };
        let b = encode_snapshot(&s);
        assert_eq!(decode_snapshot(&b), Some(s));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert_eq!(decode_snapshot(&bad), None, "flip at {i} went unnoticed");
        }
        assert_eq!(decode_snapshot(&b[..b.len() - 1]), None);
        assert_eq!(decode_snapshot(&[]), None);
    }
}
