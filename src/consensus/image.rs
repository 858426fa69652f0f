//! Streamed snapshot images (with `snapshot_with_entries`): what
//! InstallSnapshot carries for a snapshot whose state refers to log
//! entries at or below it, addressed by *position* so that either side
//! can resume at any chunk without holding the image:
//!
//! - positions `0..meta_end` are bytes: the [`ImageHeader`] (36 bytes),
//!   then the snapshot's data;
//! - positions `meta_end..total` are entries, one position each: entry
//!   `first + (position - meta_end)`, the last one the snapshot's own.
//!
//! A chunk holds either header and data bytes, or whole entries
//! ([`encode_entries`]), never both. The leader reads a chunk's entries
//! from its segments when it is due; the follower writes them into a
//! staged segment set; neither holds more than a chunk of entries.

use super::{Entry, Index, Membership, NodeId, Payload};

/// First bytes of an image.
const IMAGE_MAGIC: [u8; 4] = *b"QTI2";
/// Bytes of an [`ImageHeader`].
pub const IMAGE_HEADER_BYTES: u64 = 36;

/// The first bytes of an image: the snapshot it is of, the length of its
/// data, and the entries that follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// The snapshot's index.
    pub index: Index,
    /// Bytes of the snapshot's data.
    pub data_len: u64,
    /// The first entry (meaningless when `count` is 0).
    pub first: Index,
    /// Entries, `first..=index`.
    pub count: u64,
}

impl ImageHeader {
    /// The header of an image of the snapshot at `index` with `data_len`
    /// bytes of data and the entries from `first` (`None`: no entries).
    pub fn new(index: Index, data_len: u64, first: Option<Index>) -> ImageHeader {
        let first = first.filter(|&f| f >= 1 && f <= index);
        ImageHeader {
            index,
            data_len,
            first: first.unwrap_or(0),
            count: first.map_or(0, |f| index - f + 1),
        }
    }

    /// `IMAGE_MAGIC | index | data_len | first | count`, little-endian.
    pub fn encode(&self) -> [u8; IMAGE_HEADER_BYTES as usize] {
        let mut b = [0u8; IMAGE_HEADER_BYTES as usize];
        b[..4].copy_from_slice(&IMAGE_MAGIC);
        for (i, v) in [self.index, self.data_len, self.first, self.count]
            .iter()
            .enumerate()
        {
            b[4 + 8 * i..12 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The header at the start of `bytes`, if it is one of an image of the
    /// snapshot at `index` (it came over the network: checked whole).
    pub fn decode(bytes: &[u8], index: Index) -> Option<ImageHeader> {
        let b = bytes.get(..IMAGE_HEADER_BYTES as usize)?;
        if b[..4] != IMAGE_MAGIC {
            return None;
        }
        let v = |i: usize| u64::from_le_bytes(b[4 + 8 * i..12 + 8 * i].try_into().expect("8"));
        let h = ImageHeader {
            index: v(0),
            data_len: v(1),
            first: v(2),
            count: v(3),
        };
        let entries_fit =
            h.count == 0 || (h.first >= 1 && h.first <= index && h.count == index - h.first + 1);
        let sized = h
            .data_len
            .checked_add(IMAGE_HEADER_BYTES + h.count)
            .is_some();
        (h.index == index && entries_fit && sized).then_some(h)
    }

    /// Where the entries start.
    pub fn meta_end(&self) -> u64 {
        IMAGE_HEADER_BYTES + self.data_len
    }

    /// The image's length in positions.
    pub fn total(&self) -> u64 {
        self.meta_end() + self.count
    }

    /// The entry at `position`, if it is one.
    pub fn entry_at(&self, position: u64) -> Option<Index> {
        (position >= self.meta_end() && position < self.total())
            .then(|| self.first + (position - self.meta_end()))
    }
}

/// Encodes entries into a chunk: each `term u64 | index u64 | kind u8 |
/// payload`, little-endian; a payload is `len u32 | bytes` (normal),
/// nothing (noop) or two id sets `count u32 | ids u64...` (membership).
pub fn encode_entries(entries: &[Entry], out: &mut Vec<u8>) {
    let ids = |out: &mut Vec<u8>, set: &std::collections::BTreeSet<NodeId>| {
        out.extend_from_slice(&(set.len() as u32).to_le_bytes());
        set.iter()
            .for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
    };
    for e in entries {
        out.extend_from_slice(&e.term.to_le_bytes());
        out.extend_from_slice(&e.index.to_le_bytes());
        match &e.payload {
            Payload::Noop => out.push(0),
            Payload::Normal(b) => {
                out.push(1);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
            Payload::Membership(m) => {
                out.push(2);
                ids(out, &m.voters);
                ids(out, &m.learners);
            }
        }
    }
}

/// Bytes `encode_entries` takes for `e`.
pub fn encoded_entry_bytes(e: &Entry) -> usize {
    17 + match &e.payload {
        Payload::Noop => 0,
        Payload::Normal(b) => 4 + b.len(),
        Payload::Membership(m) => 8 + 8 * (m.voters.len() + m.learners.len()),
    }
}

/// Decodes a chunk of entries: `None` unless it is whole, not empty, and
/// its entries are consecutive from `first` and end at or below `last`.
pub fn decode_entries(bytes: &[u8], first: Index, last: Index) -> Option<Vec<Entry>> {
    let mut r = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = (r.get(..n)?, r.get(n..)?);
        r = rest;
        Some(head)
    };
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let mut entries: Vec<Entry> = Vec::new();
    let mut expected = first;
    while let Some(head) = take(17) {
        let term = u64_at(&head[..8]);
        let at = u64_at(&head[8..16]);
        let payload = match head[16] {
            0 => Payload::Noop,
            1 => {
                let len = u32_at(take(4)?) as usize;
                Payload::Normal(take(len)?.to_vec().into())
            }
            2 => {
                let mut sets = [Default::default(), Default::default()];
                for set in &mut sets {
                    let n = u32_at(take(4)?);
                    for _ in 0..n {
                        std::collections::BTreeSet::insert(set, u64_at(take(8)?));
                    }
                }
                let [voters, learners] = sets;
                Payload::Membership(Membership { voters, learners })
            }
            _ => return None,
        };
        if at != expected || at > last {
            return None;
        }
        // No index follows u64::MAX (found by the fuzzer).
        expected = expected.checked_add(1)?;
        entries.push(Entry {
            term,
            index: at,
            payload,
        });
    }
    (r.is_empty() && !entries.is_empty()).then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Entry> {
        vec![
            Entry {
                term: 2,
                index: 7,
                payload: Payload::Normal(b"bytes".to_vec().into()),
            },
            Entry {
                term: 2,
                index: 8,
                payload: Payload::Noop,
            },
            Entry {
                term: 3,
                index: 9,
                payload: Payload::Membership(Membership::with_voters([1, 2, 3])),
            },
        ]
    }

    #[test]
    fn entries_round_trip_and_every_cut_gap_or_overrun_is_refused() {
        let entries = entries();
        let mut chunk = Vec::new();
        encode_entries(&entries, &mut chunk);
        let sizes: usize = entries.iter().map(encoded_entry_bytes).sum();
        assert_eq!(chunk.len(), sizes);
        assert_eq!(decode_entries(&chunk, 7, 9), Some(entries.clone()));
        assert_eq!(decode_entries(&chunk, 7, 8), None, "an entry past the last");
        assert_eq!(decode_entries(&chunk, 6, 9), None, "not from the first");
        // A cut between entries is a shorter chunk; any other is refused.
        let ends = [26, 43];
        for cut in 0..chunk.len() {
            let want = ends
                .iter()
                .position(|&e| e == cut)
                .map(|n| entries[..=n].to_vec());
            assert_eq!(decode_entries(&chunk[..cut], 7, 9), want, "cut {cut}");
        }
        let mut longer = chunk.clone();
        longer.push(0);
        assert_eq!(decode_entries(&longer, 7, 9), None, "a trailing byte");
        let mut gap = Vec::new();
        encode_entries(&[entries[0].clone(), entries[2].clone()], &mut gap);
        assert_eq!(decode_entries(&gap, 7, 9), None, "entries not consecutive");
        let last = |index| Entry {
            term: 1,
            index,
            payload: Payload::Noop,
        };
        let mut wraps = Vec::new();
        encode_entries(&[last(u64::MAX), last(0)], &mut wraps);
        assert_eq!(decode_entries(&wraps, u64::MAX, u64::MAX), None);
    }

    #[test]
    fn a_header_round_trips_and_places_every_position() {
        let h = ImageHeader::new(9, 4, Some(7));
        assert_eq!((h.first, h.count), (7, 3));
        assert_eq!(ImageHeader::decode(&h.encode(), 9), Some(h));
        assert_eq!(
            ImageHeader::decode(&h.encode(), 10),
            None,
            "another snapshot"
        );
        assert_eq!(ImageHeader::decode(&h.encode()[..35], 9), None);
        assert_eq!(h.meta_end(), 40);
        assert_eq!(h.total(), 43);
        assert_eq!(h.entry_at(39), None);
        assert_eq!(h.entry_at(40), Some(7));
        assert_eq!(h.entry_at(42), Some(9));
        assert_eq!(h.entry_at(43), None);
        let none = ImageHeader::new(9, 4, None);
        assert_eq!((none.count, none.total()), (0, 40));
        assert_eq!(ImageHeader::decode(&none.encode(), 9), Some(none));
        // Entries that do not end at the snapshot, or a length that
        // overflows, are refused.
        let mut bad = h;
        bad.count = 2;
        assert_eq!(ImageHeader::decode(&bad.encode(), 9), None);
        bad = h;
        bad.data_len = u64::MAX;
        assert_eq!(ImageHeader::decode(&bad.encode(), 9), None);
    }
}
