//! The byte helpers shared by command and snapshot encodings: little-endian
//! integers and length-prefixed byte strings. Decoding reads untrusted
//! bytes, so every read is bounds-checked and every count is checked
//! against what the remaining bytes could hold before anything is
//! allocated; nothing here panics on any input.

/// Appends a `u8`.
pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

/// Appends a `u32`, little-endian.
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a `u64`, little-endian.
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a `u32` length and the bytes.
pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// A cursor over untrusted bytes; every getter returns `None` past the end.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// True once every byte has been read.
    pub(crate) fn is_done(&self) -> bool {
        self.remaining() == 0
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    /// The next `u8`.
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    /// The next `u32`.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// The next `u64`.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A `u32` count of items, each at least `item_bytes_min` long, refused
    /// above `max` or above what the remaining bytes could hold (so a
    /// forged count cannot make the caller allocate).
    pub(crate) fn count(&mut self, max: usize, item_bytes_min: usize) -> Option<usize> {
        let n = self.u32()? as usize;
        let fits = self.remaining() / item_bytes_min.max(1);
        (n <= max && n <= fits).then_some(n)
    }

    /// A `u32` length and that many bytes, refused above `max`.
    pub(crate) fn bytes(&mut self, max: usize) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return None;
        }
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_end_and_forged_counts_are_refused() {
        let mut out = Vec::new();
        put_u64(&mut out, 7);
        put_bytes(&mut out, b"abc");
        let mut r = Reader::new(&out);
        assert_eq!(r.u64(), Some(7));
        assert_eq!(r.bytes(3), Some(&b"abc"[..]));
        assert!(r.is_done());
        assert_eq!(r.u8(), None);
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0x0f, 1, 2]);
        assert_eq!(r.count(usize::MAX, 1), None, "count beyond the bytes left");
        let mut r = Reader::new(&[3, 0, 0, 0, 1, 2]);
        assert_eq!(r.bytes(10), None, "length beyond the end");
    }
}
