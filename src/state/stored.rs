//! Where a ledger entry's or a message's bytes live: in the log, not in
//! the state. The state machine keeps a [`Stored`] (the log index of the
//! command entry that carried the bytes, and the slot within it), so its
//! snapshots hold metadata only; whoever answers a client reads the entry
//! back from the log and takes the bytes out of it ([`fill`]).

use super::query::command_records;
use super::Command;

/// Low bits of a [`Stored`] slot that number the part of a command (a
/// produce's message); the high bits number the command in its entry (0
/// in a single-command entry, so slots written before command batches
/// read the same).
pub const COMMAND_SLOT_BITS: u32 = 16;
const _: () = assert!(super::queue::PRODUCE_MESSAGES_MAX <= 1 << COMMAND_SLOT_BITS);

/// The place of one ledger entry's or message's bytes in the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stored {
    /// Log index of the command entry (an `AddEntry` or a `Produce`, alone
    /// or in a command batch entry).
    pub index: u64,
    /// The command's position in its entry (high bits, see
    /// [`COMMAND_SLOT_BITS`]) and the part's in the command (low bits: 0
    /// for a ledger entry, the message's position for a produce).
    pub slot: u32,
}

impl From<u64> for Stored {
    /// The one command of the single-command entry at `index`.
    fn from(index: u64) -> Stored {
        Stored { index, slot: 0 }
    }
}

impl Stored {
    /// Part `part` of command `command` of the entry at `index`.
    pub fn at(index: u64, command: usize, part: u32) -> Stored {
        debug_assert!(part < 1 << COMMAND_SLOT_BITS);
        Stored {
            index,
            slot: (command as u32) << COMMAND_SLOT_BITS | part,
        }
    }

    /// The command's position in its entry.
    pub fn command(self) -> usize {
        (self.slot >> COMMAND_SLOT_BITS) as usize
    }

    /// The part's position in its command.
    pub fn part(self) -> u32 {
        self.slot & ((1 << COMMAND_SLOT_BITS) - 1)
    }
}

/// What the log has for an entry, as [`fill`] asks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The entry's payload.
    Payload(bytes::Bytes),
    /// It is being read from disk: fill again once it is.
    Reading,
    /// Not held, or it could not be read.
    Missing,
}

/// Why [`fill`] did not fill everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfilled {
    /// The entry at this index is missing or does not hold what the state
    /// says it does: the log and the state disagree.
    Missing(u64),
    /// Entries are being read from disk (the reads are started): fill
    /// again once they are done.
    Reading,
}

/// An entry's payload and where each of its commands is in it.
type Placed = (bytes::Bytes, Vec<(usize, usize)>);

/// Where each command of a command entry is in `payload`: (offset,
/// length), in slot order (empty for any other payload).
fn command_places(payload: &[u8]) -> Vec<(usize, usize)> {
    let base = payload.as_ptr() as usize;
    command_records(payload)
        .into_iter()
        .flatten()
        .map(|(_, _, bytes)| (bytes.as_ptr() as usize - base, bytes.len()))
        .collect()
}

/// Fills in the bytes of each `(stored, data)` pair from the log.
/// `payload_at(index)` looks up the payload of the log entry at `index`;
/// consecutive pairs from one entry decode it once. Every entry is asked
/// for even after one is still [`Lookup::Reading`], so all the reads an
/// answer needs start at once; a missing one ends it.
pub fn fill<'a>(
    items: impl IntoIterator<Item = (Stored, &'a mut Vec<u8>)>,
    payload_at: &mut dyn FnMut(u64) -> Lookup,
) -> Result<(), Unfilled> {
    // The last entry looked up (with where each of its commands is, found
    // once: a batch's commands are not walked again for each message),
    // and the last command decoded from it.
    let mut payload: Option<(u64, Option<Placed>)> = None;
    let mut decoded: Option<((u64, usize), Command)> = None;
    let mut reading = false;
    for (at, data) in items {
        let key = (at.index, at.command());
        if decoded.as_ref().is_none_or(|(k, _)| *k != key) {
            if payload.as_ref().is_none_or(|(i, _)| *i != at.index) {
                let p = match payload_at(at.index) {
                    Lookup::Payload(p) => {
                        let places = command_places(&p);
                        Some((p, places))
                    }
                    Lookup::Reading => None,
                    Lookup::Missing => return Err(Unfilled::Missing(at.index)),
                };
                payload = Some((at.index, p));
            }
            let Some((_, Some((p, places)))) = &payload else {
                reading = true;
                continue;
            };
            let cmd = places
                .get(at.command())
                .and_then(|&(from, len)| Command::decode(&p[from..from + len]))
                .ok_or(Unfilled::Missing(at.index))?;
            decoded = Some((key, cmd));
        }
        let Some((_, cmd)) = &decoded else {
            unreachable!("decoded above")
        };
        let bytes = match cmd {
            Command::AddEntry { data, .. } if at.part() == 0 => data,
            Command::Produce { messages, .. } | Command::ProduceUncounted { messages, .. } => {
                messages
                    .get(at.part() as usize)
                    .ok_or(Unfilled::Missing(at.index))?
            }
            _ => return Err(Unfilled::Missing(at.index)),
        };
        data.clone_from(bytes);
    }
    if reading {
        return Err(Unfilled::Reading);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::query::encode_command_entry;

    #[test]
    fn bytes_come_from_the_entry_and_a_mismatch_is_reported() {
        let produce = Command::Produce {
            queue: "q".into(),
            producer_id: 1,
            seq: 1,
            messages: vec![b"m0".to_vec(), b"m1".to_vec()],
        };
        let add = Command::AddEntry {
            ledger: 0,
            writer_token: 1,
            data: b"e".to_vec(),
        };
        let log = [
            encode_command_entry(0, 0, &produce.encode()),
            encode_command_entry(0, 0, &add.encode()),
        ];
        let reads = std::cell::Cell::new(0);
        let mut payload_at = |i: u64| {
            reads.set(reads.get() + 1);
            match i {
                4 => Lookup::Reading,
                _ => log
                    .get(i as usize - 1)
                    .map_or(Lookup::Missing, |p| Lookup::Payload(p.clone().into())),
            }
        };
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let at = [(1, 1), (1, 0), (2, 0)].map(|(index, slot)| Stored { index, slot });
        fill(at.into_iter().zip(out.iter_mut()), &mut payload_at).unwrap();
        assert_eq!(out, [b"m1".to_vec(), b"m0".to_vec(), b"e".to_vec()]);
        assert_eq!(reads.get(), 2, "one read per entry, not per message");
        for (index, slot) in [(1, 2), (2, 1), (3, 0)] {
            let mut d = Vec::new();
            let r = fill([(Stored { index, slot }, &mut d)], &mut payload_at);
            assert_eq!(r, Err(Unfilled::Missing(index)), "({index}, {slot})");
        }
        // An entry still being read leaves the answer unfilled, but the
        // others are still asked for (their reads start now too).
        reads.set(0);
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let at = [(4, 0), (1, 0), (9, 0)].map(|(index, slot)| Stored { index, slot });
        let r = fill(at.into_iter().zip(out.iter_mut()), &mut payload_at);
        assert_eq!(
            r,
            Err(Unfilled::Missing(9)),
            "a missing entry still ends it"
        );
        let at = [(4, 0), (1, 0), (2, 0)].map(|(index, slot)| Stored { index, slot });
        let r = fill(at.into_iter().zip(out.iter_mut()), &mut payload_at);
        assert_eq!(r, Err(Unfilled::Reading));
        assert_eq!(
            out[1..],
            [b"m0".to_vec(), b"e".to_vec()],
            "the rest is filled"
        );
        assert_eq!(reads.get(), 6, "every entry asked for");
    }
}
