//! A message to send as the concatenation of pieces: bytes written into
//! the message's own buffer (headers, small fields) and shared buffers it
//! only refers to (entries' payloads, held by the log already). The
//! history keeps the message whole until its last fragment is
//! acknowledged; each datagram copies its fragment's bytes out of the
//! pieces, so a payload is copied once per follower (into the datagram the
//! MAC covers) instead of twice (into an encoded message first).
//!
//! On the wire a message is just its bytes: the pieces never show.

use bytes::Bytes;
use std::ops::Range;

/// Shared buffers shorter than this are copied into the message's own
/// buffer: a piece costs a clone of its handle and a lookup per fragment,
/// more than copying a few hundred bytes.
pub const SHARED_PIECE_BYTES_MIN: usize = 512;

/// Where one piece's bytes are.
#[derive(Clone, Debug)]
enum Source {
    /// `own[start..end]` of the message.
    Own { start: usize },
    /// A buffer the message shares.
    Shared(Bytes),
}

/// One piece, ending at `end` in the message.
#[derive(Clone, Debug)]
struct Piece {
    end: usize,
    source: Source,
}

/// A message of pieces; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct OutMessage {
    own: Vec<u8>,
    pieces: Vec<Piece>,
    len: usize,
}

impl OutMessage {
    /// A message of the bytes in `own`, as one piece (not copied).
    pub fn from_vec(own: Vec<u8>) -> Self {
        let len = own.len();
        let pieces = if len == 0 {
            Vec::new()
        } else {
            vec![Piece {
                end: len,
                source: Source::Own { start: 0 },
            }]
        };
        OutMessage { own, pieces, len }
    }

    /// An empty message writing into `buf` (cleared; its capacity kept).
    pub fn with_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        OutMessage {
            own: buf,
            pieces: Vec::new(),
            len: 0,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`, copied into the message's own buffer.
    pub fn put(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let start = self.own.len();
        self.own.extend_from_slice(bytes);
        self.len += bytes.len();
        // Own bytes written one after another make one piece: when the
        // last piece is own bytes, nothing was written to `own` after it.
        if let Some(Piece {
            end,
            source: Source::Own { .. },
        }) = self.pieces.last_mut()
        {
            *end = self.len;
            return;
        }
        self.pieces.push(Piece {
            end: self.len,
            source: Source::Own { start },
        });
    }

    /// Appends one byte.
    pub fn put_u8(&mut self, b: u8) {
        self.put(&[b]);
    }

    /// Appends `bytes`, shared rather than copied when it is at least
    /// [`SHARED_PIECE_BYTES_MIN`] long.
    pub fn put_shared(&mut self, bytes: &Bytes) {
        if bytes.len() < SHARED_PIECE_BYTES_MIN {
            self.put(bytes);
            return;
        }
        self.len += bytes.len();
        self.pieces.push(Piece {
            end: self.len,
            source: Source::Shared(bytes.clone()),
        });
    }

    /// The bytes of piece `i`.
    fn piece(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.pieces[i - 1].end };
        match &self.pieces[i].source {
            Source::Own { start: s } => &self.own[*s..*s + (self.pieces[i].end - start)],
            Source::Shared(b) => b,
        }
    }

    /// The bytes of `range` of the message, in order, as slices of its
    /// pieces. Panics if `range` is not inside the message.
    pub fn slices(&self, range: Range<usize>) -> impl Iterator<Item = &[u8]> + '_ {
        assert!(range.start <= range.end && range.end <= self.len);
        // The first piece that ends after the range's start.
        let first = self.pieces.partition_point(|p| p.end <= range.start);
        let mut at = range.start;
        let end = range.end;
        (first..self.pieces.len()).map_while(move |i| {
            if at >= end {
                return None;
            }
            let piece_start = if i == 0 { 0 } else { self.pieces[i - 1].end };
            let bytes = self.piece(i);
            let lo = at - piece_start;
            let hi = (end - piece_start).min(bytes.len());
            at = piece_start + hi;
            Some(&bytes[lo..hi])
        })
    }

    /// The whole message in one buffer (a copy, for tests).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.slices(0..self.len) {
            v.extend_from_slice(s);
        }
        v
    }

    /// Gives back its own buffer (for reuse), dropping its shared pieces.
    pub fn into_buffer(self) -> Vec<u8> {
        self.own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (OutMessage, Vec<u8>) {
        let big_a = Bytes::from(vec![7u8; 1000]);
        let big_b = Bytes::from((0..3000u32).map(|i| i as u8).collect::<Vec<_>>());
        let small = Bytes::from_static(b"tiny");
        let mut m = OutMessage::with_buffer(Vec::new());
        let mut flat = Vec::new();
        m.put(b"head");
        flat.extend_from_slice(b"head");
        m.put_shared(&big_a);
        flat.extend_from_slice(&big_a);
        m.put_u8(9);
        flat.push(9);
        m.put_shared(&small);
        flat.extend_from_slice(&small);
        m.put_shared(&big_b);
        flat.extend_from_slice(&big_b);
        m.put(b"tail");
        flat.extend_from_slice(b"tail");
        (m, flat)
    }

    /// Every range of the message reads back the bytes a flat encoding
    /// holds there, whichever pieces it crosses.
    #[test]
    fn every_range_reads_as_the_flat_bytes() {
        let (m, flat) = sample();
        assert_eq!(m.len(), flat.len());
        assert_eq!(m.to_vec(), flat);
        for lo in (0..flat.len()).step_by(37) {
            for hi in (lo..=flat.len()).step_by(53) {
                let got: Vec<u8> = m.slices(lo..hi).flatten().copied().collect();
                assert_eq!(got, &flat[lo..hi], "range {lo}..{hi}");
                assert!(m.slices(lo..hi).all(|s| !s.is_empty()));
            }
        }
    }

    /// Large payloads are referred to, not copied; small ones are copied
    /// into the message's own bytes, which stay one piece while they run
    /// on.
    #[test]
    fn large_payloads_are_shared_and_small_ones_copied() {
        let big = Bytes::from(vec![1u8; 4096]);
        let mut m = OutMessage::with_buffer(Vec::new());
        m.put(b"ab");
        m.put_shared(&Bytes::from_static(b"cd"));
        m.put_u8(b'e');
        m.put_shared(&big);
        m.put(b"f");
        assert_eq!(m.pieces.len(), 3, "{:?}", m.pieces);
        let shared = m.slices(5..5 + 4096).next().unwrap();
        assert_eq!(shared.as_ptr(), big.as_ptr(), "the payload was copied");
        assert_eq!(m.into_buffer(), b"abcdef");
    }

    #[test]
    fn a_vec_is_one_piece() {
        let m = OutMessage::from_vec(b"hello".to_vec());
        assert_eq!(m.slices(1..4).collect::<Vec<_>>(), vec![&b"ell"[..]]);
        assert!(OutMessage::from_vec(Vec::new()).is_empty());
    }
}
