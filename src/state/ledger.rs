//! Ledgers with BookKeeper's semantics, as replicated state: one writer per
//! ledger (whoever holds its writer token), entries with dense ids from 0,
//! a last-add-confirmed (LAC) that bounds what readers see, close, and
//! open-with-recovery, which fences a writer that may still be alive.
//! No I/O and no clock here: creation time comes in with the command.
//!
//! The LAC: an entry applied here is committed (durable on a majority), so
//! adding entry `n` confirms every entry before it, as BookKeeper's writer
//! piggybacks its LAC on the next add; `SetLac` advances it without a new
//! write (explicit LAC); close and recovery move it to the sealed entry.
//! It never decreases. An entry's bytes stay in the log, in the command
//! that added it: the state keeps its log index and length ([`Stored`]).

use super::machine::Error;
use super::query::COMMANDS_PER_ENTRY_MAX;
use super::stored::Stored;
use super::wire::{put_u32, put_u64, put_u8, Reader};
use imbl::{OrdMap, Vector};

/// Ledgers a group holds at once.
pub const LEDGERS_MAX: usize = 65_536;
/// Bytes of one entry.
pub const ENTRY_BYTES_MAX: usize = 1 << 20;
/// Entries of one ledger.
pub const LEDGER_ENTRIES_MAX: u64 = 1 << 20;
/// Bytes of one ledger's entries together.
pub const LEDGER_BYTES_MAX: u64 = 1 << 30;
/// Entries one `read` returns at most.
pub const READ_ENTRIES_MAX: usize = 1024;
/// Bytes of entry data one `read` returns at most, so that its answer
/// always fits a client frame; the reader pages on from the last entry it
/// got.
pub const READ_BYTES_MAX: u64 = 8 << 20;
// Any entry fits a read alone, so a read past the LAC's first unread entry
// always makes progress.
const _: () = assert!(ENTRY_BYTES_MAX as u64 <= READ_BYTES_MAX);

/// A ledger's state as `list` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerState {
    /// Its writer may add entries.
    Open,
    /// Sealed by close or recovery: no more entries.
    Closed,
}

/// A ledger's metadata, as `list` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerInfo {
    /// The ledger's id.
    pub id: u64,
    /// Open or closed.
    pub state: LedgerState,
    /// True if recovery closed it (its writer was fenced).
    pub fenced: bool,
    /// Entries added.
    pub length: u64,
    /// Bytes of its entries together.
    pub bytes: u64,
    /// Last-add-confirmed: the last entry readers see, if any.
    pub lac: Option<u64>,
    /// The leader's clock when it was created, in ms.
    pub created_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Ledger {
    writer_token: u64,
    closed: bool,
    fenced: bool,
    created_ms: u64,
    /// Where the command that created it is in the log.
    created: Stored,
    /// Entries readers may see: the LAC plus one.
    confirmed: u64,
    bytes: u64,
    entries: Vector<StoredEntry>,
}

/// One entry: where the `AddEntry` that carries its bytes is in the log
/// (which also answers a retried add with the entry id it got the first
/// time), and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StoredEntry {
    at: Stored,
    len: u32,
}

/// A ledger entry as a read returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The entry's id.
    pub id: u64,
    /// Its bytes (empty until filled in from the log, `stored::fill`).
    pub data: Vec<u8>,
    /// Where its bytes are in the log (not sent to clients).
    pub stored: Stored,
}

impl Ledger {
    fn info(&self, id: u64) -> LedgerInfo {
        LedgerInfo {
            id,
            state: if self.closed {
                LedgerState::Closed
            } else {
                LedgerState::Open
            },
            fenced: self.fenced,
            length: self.entries.len() as u64,
            bytes: self.bytes,
            lac: self.confirmed.checked_sub(1),
            created_ms: self.created_ms,
        }
    }

    /// The last entry's id, if any (what close and recovery seal).
    fn last(&self) -> Option<u64> {
        (self.entries.len() as u64).checked_sub(1)
    }

    /// Checks that `token` is the writer's and that it may still write.
    fn writable(&self, token: u64) -> Result<(), Error> {
        if token != self.writer_token {
            Err(Error::NotWriter)
        } else if self.fenced {
            Err(Error::Fenced)
        } else if self.closed {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Seals it at its last entry: nothing more is added, all is readable.
    fn seal(&mut self) -> Option<u64> {
        self.closed = true;
        self.confirmed = self.entries.len() as u64;
        self.last()
    }
}

/// Every ledger of a group, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledgers {
    ledgers: OrdMap<u64, Ledger>,
    /// The next id `create` gives; ids are never reused.
    next_id: u64,
}

impl Ledgers {
    /// Creates a ledger whose writer holds `writer_token`; returns its id.
    pub(crate) fn create(
        &mut self,
        writer_token: u64,
        now_ms: u64,
        at: impl Into<Stored>,
    ) -> Result<u64, Error> {
        if self.ledgers.len() >= LEDGERS_MAX {
            return Err(Error::Limit("ledgers"));
        }
        let id = self.next_id;
        self.next_id = id.checked_add(1).ok_or(Error::Limit("ledger ids"))?;
        let ledger = Ledger {
            writer_token,
            closed: false,
            fenced: false,
            created_ms: now_ms,
            created: at.into(),
            confirmed: 0,
            bytes: 0,
            entries: Vector::new(),
        };
        self.ledgers.insert(id, ledger);
        Ok(id)
    }

    /// Adds an entry by the writer; returns its id (dense from 0).
    pub(crate) fn add(
        &mut self,
        id: u64,
        token: u64,
        len: usize,
        at: impl Into<Stored>,
    ) -> Result<u64, Error> {
        let l = self.ledgers.get_mut(&id).ok_or(Error::NoSuchLedger)?;
        l.writable(token)?;
        if len > ENTRY_BYTES_MAX {
            return Err(Error::Limit("entry bytes"));
        }
        if l.entries.len() as u64 >= LEDGER_ENTRIES_MAX {
            return Err(Error::Limit("ledger entries"));
        }
        if l.bytes + len as u64 > LEDGER_BYTES_MAX {
            return Err(Error::Limit("ledger bytes"));
        }
        let entry = l.entries.len() as u64;
        // Entries before this one are committed: they are confirmed.
        l.confirmed = l.confirmed.max(entry);
        l.entries.push_back(StoredEntry {
            at: at.into(),
            len: len as u32,
        });
        l.bytes += len as u64;
        Ok(entry)
    }

    /// Advances the LAC to `lac` (never back); returns the LAC after it.
    pub(crate) fn set_lac(&mut self, id: u64, token: u64, lac: u64) -> Result<u64, Error> {
        let l = self.ledgers.get_mut(&id).ok_or(Error::NoSuchLedger)?;
        l.writable(token)?;
        if lac >= l.entries.len() as u64 {
            return Err(Error::LacBeyondEnd);
        }
        l.confirmed = l.confirmed.max(lac + 1);
        Ok(l.confirmed - 1)
    }

    /// Closes the ledger by its writer; returns the sealed last entry id.
    /// A retried close is answered with the same id.
    pub(crate) fn close(&mut self, id: u64, token: u64) -> Result<Option<u64>, Error> {
        let l = self.ledgers.get_mut(&id).ok_or(Error::NoSuchLedger)?;
        match l.writable(token) {
            Ok(()) => Ok(l.seal()),
            Err(Error::Closed) => Ok(l.last()),
            Err(e) => Err(e),
        }
    }

    /// Opens with recovery: fences the writer if the ledger is open, and
    /// returns the sealed last entry id.
    pub(crate) fn recover(&mut self, id: u64) -> Result<Option<u64>, Error> {
        let l = self.ledgers.get_mut(&id).ok_or(Error::NoSuchLedger)?;
        if !l.closed {
            l.fenced = true;
        }
        Ok(l.seal())
    }

    /// Deletes the ledger; its id is not given again.
    pub(crate) fn delete(&mut self, id: u64) -> Result<(), Error> {
        self.ledgers
            .remove(&id)
            .map(|_| ())
            .ok_or(Error::NoSuchLedger)
    }

    /// The ledger's last-add-confirmed, `None` before any is confirmed.
    pub fn lac(&self, id: u64) -> Result<Option<u64>, Error> {
        let l = self.ledgers.get(&id).ok_or(Error::NoSuchLedger)?;
        Ok(l.confirmed.checked_sub(1))
    }

    /// Entries `from..=to` (their bytes to be filled in from the log),
    /// cut at the LAC, at `READ_ENTRIES_MAX` entries and at
    /// `READ_BYTES_MAX` bytes (which any one entry fits); empty if `from`
    /// is past the LAC.
    pub fn read(&self, id: u64, from: u64, to: u64) -> Result<Vec<LedgerEntry>, Error> {
        let l = self.ledgers.get(&id).ok_or(Error::NoSuchLedger)?;
        let end = to.saturating_add(1).min(l.confirmed);
        let end = end.min(from.saturating_add(READ_ENTRIES_MAX as u64));
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for e in from..end.max(from) {
            let stored = &l.entries[e as usize];
            bytes += stored.len as u64;
            if bytes > READ_BYTES_MAX {
                break;
            }
            out.push(LedgerEntry {
                id: e,
                data: Vec::new(),
                stored: stored.at,
            });
        }
        Ok(out)
    }

    /// The lowest log index whose bytes a ledger still needs, if any.
    pub fn oldest_stored(&self) -> Option<u64> {
        self.ledgers
            .values()
            .filter_map(|l| l.entries.front().map(|e| e.at.index))
            .min()
    }

    /// Every log index whose bytes a ledger still needs (unordered).
    pub(crate) fn each_stored(&self, f: &mut dyn FnMut(u64)) {
        for l in self.ledgers.values() {
            l.entries.iter().for_each(|e| f(e.at.index));
        }
    }

    /// The id of the entry added by the command at `at` in the log, if
    /// that command added one to ledger `id` (answers a retried add).
    pub fn entry_added_at(&self, id: u64, at: Stored) -> Option<u64> {
        let l = self.ledgers.get(&id)?;
        let found = l.entries.binary_search_by_key(&at, |e| e.at).ok()?;
        Some(found as u64)
    }

    /// Why an add of `len` bytes by `token` to ledger `id` is refused now,
    /// if it is. Every refusal of an add lasts (a ledger never comes
    /// back, nor unfences, nor reopens, nor shrinks), so for a retried add
    /// whose first application added nothing, this is a refusal it met.
    pub fn add_refusal(&self, id: u64, token: u64, len: usize) -> Option<Error> {
        let Some(l) = self.ledgers.get(&id) else {
            return Some(Error::NoSuchLedger);
        };
        if let Err(e) = l.writable(token) {
            return Some(e);
        }
        if len > ENTRY_BYTES_MAX {
            return Some(Error::Limit("entry bytes"));
        }
        if l.entries.len() as u64 >= LEDGER_ENTRIES_MAX {
            return Some(Error::Limit("ledger entries"));
        }
        (l.bytes + len as u64 > LEDGER_BYTES_MAX).then_some(Error::Limit("ledger bytes"))
    }

    /// The id of the ledger created by the command at `at` in the log.
    pub fn created_at(&self, at: Stored) -> Option<u64> {
        self.ledgers
            .iter()
            .find(|(_, l)| l.created == at)
            .map(|(id, _)| *id)
    }

    /// One ledger's metadata.
    pub fn info(&self, id: u64) -> Result<LedgerInfo, Error> {
        let l = self.ledgers.get(&id).ok_or(Error::NoSuchLedger)?;
        Ok(l.info(id))
    }

    /// Every ledger's metadata, by id.
    pub fn list(&self) -> Vec<LedgerInfo> {
        self.ledgers.iter().map(|(&id, l)| l.info(id)).collect()
    }

    /// Appends the ledgers' encoding (for snapshots) to `out`.
    /// `slots`: with each command's slot (snapshot version 7 on).
    pub(crate) fn encode(&self, out: &mut Vec<u8>, slots: bool) {
        put_u64(out, self.next_id);
        put_u32(out, self.ledgers.len() as u32);
        for (&id, l) in &self.ledgers {
            put_u64(out, id);
            put_u64(out, l.writer_token);
            put_u8(out, u8::from(l.closed) | u8::from(l.fenced) << 1);
            put_u64(out, l.created_ms);
            put_u64(out, l.created.index);
            if slots {
                put_u32(out, l.created.slot);
            }
            put_u64(out, l.confirmed);
            put_u32(out, l.entries.len() as u32);
            for e in &l.entries {
                put_u64(out, e.at.index);
                if slots {
                    put_u32(out, e.at.slot);
                }
                put_u32(out, e.len);
            }
        }
    }

    /// Decodes ledgers from `r`, refusing any that `apply` could not have
    /// built (bounds, order, a LAC past the end, a fence on an open one).
    /// `slots`: the encoding places commands by slot as well as by index
    /// (snapshot version 7 on; before, every command had an entry of its
    /// own, slot 0).
    pub(crate) fn decode(r: &mut Reader<'_>, slots: bool) -> Option<Ledgers> {
        let slot_bytes = if slots { 4 } else { 0 };
        // A ledger entry is a whole command: no part but 0.
        let place = |r: &mut Reader<'_>| -> Option<Stored> {
            let index = r.u64()?;
            let slot = if slots { r.u32()? } else { 0 };
            let at = Stored { index, slot };
            let valid = at.part() == 0 && at.command() < COMMANDS_PER_ENTRY_MAX;
            valid.then_some(at)
        };
        let next_id = r.u64()?;
        let n = r.count(LEDGERS_MAX, 8 + 8 + 1 + 8 + 8 + slot_bytes + 8 + 4)?;
        let mut ledgers = OrdMap::new();
        for _ in 0..n {
            let id = r.u64()?;
            let in_order = ledgers.get_max().is_none_or(|(prev, _)| *prev < id);
            if id >= next_id || !in_order {
                return None;
            }
            let writer_token = r.u64()?;
            let flags = r.u8()?;
            let (closed, fenced) = (flags & 1 != 0, flags & 2 != 0);
            if flags > 3 || (fenced && !closed) {
                return None;
            }
            let created_ms = r.u64()?;
            let created = place(r)?;
            let confirmed = r.u64()?;
            let k = r.count(LEDGER_ENTRIES_MAX as usize, 8 + slot_bytes + 4)?;
            let mut entries = Vector::new();
            let mut bytes = 0u64;
            for _ in 0..k {
                let at = place(r)?;
                // Added in log order, after the ledger's creation.
                let after = entries.back().map_or(created, |e: &StoredEntry| e.at);
                if at <= after {
                    return None;
                }
                let len = r.u32()?;
                if len as usize > ENTRY_BYTES_MAX {
                    return None;
                }
                bytes += u64::from(len);
                entries.push_back(StoredEntry { at, len });
            }
            let full = k as u64;
            if confirmed > full || (closed && confirmed != full) || bytes > LEDGER_BYTES_MAX {
                return None;
            }
            let l = Ledger {
                writer_token,
                closed,
                fenced,
                created_ms,
                created,
                confirmed,
                bytes,
                entries,
            };
            ledgers.insert(id, l);
        }
        Some(Ledgers { ledgers, next_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh, increasing log index for each command.
    fn ix() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    fn one_ledger() -> (Ledgers, u64) {
        let mut ls = Ledgers::default();
        let id = ls.create(42, 1_000, ix()).unwrap();
        (ls, id)
    }

    #[test]
    fn ids_are_dense_and_only_the_writer_adds() {
        let mut ls = Ledgers::default();
        assert_eq!(ls.create(1, 0, ix()), Ok(0));
        assert_eq!(ls.create(2, 0, ix()), Ok(1));
        ls.delete(0).unwrap();
        assert_eq!(ls.create(3, 0, ix()), Ok(2), "a deleted id is not reused");
        for e in 0..5 {
            assert_eq!(ls.add(1, 2, 1, ix()), Ok(e));
        }
        assert_eq!(ls.add(1, 3, 1, ix()), Err(Error::NotWriter));
        assert_eq!(ls.add(0, 1, 1, ix()), Err(Error::NoSuchLedger));
        assert_eq!(
            ls.add(1, 2, ENTRY_BYTES_MAX + 1, ix()),
            Err(Error::Limit("entry bytes"))
        );
        assert_eq!(ls.list()[0].length, 5, "a refused add takes no id");
    }

    #[test]
    fn reads_stop_at_the_lac_which_never_goes_back() {
        let (mut ls, id) = one_ledger();
        let ids = |es: Vec<LedgerEntry>| es.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ls.lac(id), Ok(None));
        let first = ix();
        ls.add(id, 42, 1, first).unwrap();
        assert_eq!(
            ls.read(id, 0, 10).unwrap(),
            vec![],
            "entry 0 not confirmed yet"
        );
        ls.add(id, 42, 1, ix()).unwrap();
        ls.add(id, 42, 1, ix()).unwrap();
        assert_eq!(ls.lac(id), Ok(Some(1)), "adding 2 confirms 0 and 1");
        let read = ls.read(id, 0, 10).unwrap();
        assert_eq!(ids(read.clone()), vec![0, 1]);
        let at = Stored {
            index: first,
            slot: 0,
        };
        assert_eq!(
            (read[0].stored, read[0].data.len()),
            (at, 0),
            "bytes from the log"
        );
        assert_eq!(ls.oldest_stored(), Some(first));
        assert_eq!(ls.set_lac(id, 42, 2), Ok(2), "explicit LAC, no new write");
        assert_eq!(ids(ls.read(id, 1, 10).unwrap()), vec![1, 2]);
        assert_eq!(ls.set_lac(id, 42, 0), Ok(2), "the LAC never decreases");
        assert_eq!(ls.set_lac(id, 42, 3), Err(Error::LacBeyondEnd));
        assert_eq!(ls.set_lac(id, 7, 2), Err(Error::NotWriter));
        assert_eq!(ls.read(id, 3, 1).unwrap(), vec![]);
        assert_eq!(ls.read(id, u64::MAX, u64::MAX).unwrap(), vec![]);
    }

    #[test]
    fn a_read_stops_at_its_byte_bound_and_pages_through_everything() {
        let (mut ls, id) = one_ledger();
        for _ in 0..20 {
            ls.add(id, 42, ENTRY_BYTES_MAX, ix()).unwrap();
        }
        ls.set_lac(id, 42, 19).unwrap();
        let per_read = (READ_BYTES_MAX / ENTRY_BYTES_MAX as u64) as usize;
        let mut from = 0;
        let mut got = Vec::new();
        loop {
            let page = ls.read(id, from, u64::MAX).unwrap();
            let Some(last) = page.last() else { break };
            assert!(page.len() <= per_read, "{} entries of 1 MiB", page.len());
            from = last.id + 1;
            got.extend(page.iter().map(|e| e.id));
        }
        assert_eq!(got, (0..20).collect::<Vec<_>>(), "paged through, each once");
        assert_eq!(ls.read(id, 0, u64::MAX).unwrap().len(), per_read);
    }

    #[test]
    fn recovery_fences_the_writer_and_seals_the_last_entry() {
        let (mut ls, id) = one_ledger();
        for _ in 0..3 {
            ls.add(id, 42, 1, ix()).unwrap();
        }
        assert_eq!(ls.recover(id), Ok(Some(2)));
        assert_eq!(ls.add(id, 42, 4, ix()), Err(Error::Fenced));
        assert_eq!(ls.set_lac(id, 42, 2), Err(Error::Fenced));
        assert_eq!(ls.close(id, 42), Err(Error::Fenced));
        assert_eq!(
            ls.recover(id),
            Ok(Some(2)),
            "a second recovery seals the same id"
        );
        assert_eq!(ls.read(id, 0, 9).unwrap().len(), 3, "every entry readable");
        let info = &ls.list()[0];
        assert_eq!(
            (info.state, info.fenced, info.lac),
            (LedgerState::Closed, true, Some(2))
        );
        assert_eq!(info.created_ms, 1_000);
    }

    #[test]
    fn close_seals_and_later_adds_fail_closed() {
        let (mut ls, id) = one_ledger();
        assert_eq!(ls.close(id, 42), Ok(None), "an empty ledger seals no entry");
        assert_eq!(ls.add(id, 42, 1, ix()), Err(Error::Closed));
        let id2 = ls.create(9, 0, ix()).unwrap();
        ls.add(id2, 9, 1, ix()).unwrap();
        ls.add(id2, 9, 2, ix()).unwrap();
        assert_eq!(ls.close(id2, 9), Ok(Some(1)));
        assert_eq!(ls.close(id2, 9), Ok(Some(1)), "a retried close");
        assert_eq!(ls.recover(id2), Ok(Some(1)));
        assert!(!ls.list()[1].fenced, "closed by its writer, not fenced");
        assert_eq!(ls.list()[1].bytes, 3);
    }

    #[test]
    fn ledgers_survive_a_snapshot_and_garbage_is_refused() {
        let (mut ls, id) = one_ledger();
        ls.add(id, 42, 3, ix()).unwrap();
        ls.add(id, 42, 0, ix()).unwrap();
        let id2 = ls.create(5, 7, ix()).unwrap();
        ls.recover(id2).unwrap();
        let mut bytes = Vec::new();
        ls.encode(&mut bytes, true);
        let mut r = Reader::new(&bytes);
        assert_eq!(Ledgers::decode(&mut r, true), Some(ls.clone()));
        assert!(r.is_done());
        // Without slots (the format before command batch entries), every
        // command at slot 0 of its entry.
        let mut old = Vec::new();
        ls.encode(&mut old, false);
        assert_eq!(
            Ledgers::decode(&mut Reader::new(&old), false),
            Some(ls.clone())
        );
        // Two adds in one entry, in slot order; the same slot twice, or a
        // slot with a part (a ledger entry is a whole command), is refused.
        let mut batched = ls.clone();
        let at = ix();
        batched.add(id, 42, 1, Stored::at(at, 0, 0)).unwrap();
        batched.add(id, 42, 1, Stored::at(at, 3, 0)).unwrap();
        let mut b = Vec::new();
        batched.encode(&mut b, true);
        assert_eq!(Ledgers::decode(&mut Reader::new(&b), true), Some(batched));
        for bad in [Stored::at(at, 3, 0), Stored::at(at + 1, 0, 1)] {
            let mut l = ls.clone();
            l.add(id, 42, 1, Stored::at(at, 3, 0)).unwrap();
            l.ledgers
                .get_mut(&id)
                .unwrap()
                .entries
                .push_back(StoredEntry { at: bad, len: 1 });
            let mut b = Vec::new();
            l.encode(&mut b, true);
            assert_eq!(Ledgers::decode(&mut Reader::new(&b), true), None, "{bad:?}");
        }
        for cut in 0..bytes.len() {
            assert!(
                Ledgers::decode(&mut Reader::new(&bytes[..cut]), true).is_none(),
                "cut {cut}"
            );
        }
    }
}
