//! Where a ledger entry's or a message's bytes live: in the log, not in
//! the state. The state machine keeps a [`Stored`] (the log index of the
//! command entry that carried the bytes, and the slot within it), so its
//! snapshots hold metadata only; whoever answers a client reads the entry
//! back from the log and takes the bytes out of it ([`fill`]).

use super::query::decode_command;
use super::Command;

/// The place of one ledger entry's or message's bytes in the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stored {
    /// Log index of the command entry (an `AddEntry` or a `Produce`).
    pub index: u64,
    /// Position in that command: 0 for a ledger entry, the message's
    /// position in its batch for a produce.
    pub slot: u32,
}

/// Fills in the bytes of each `(stored, data)` pair from the log.
/// `payload_at(index)` returns the payload of the log entry at `index`
/// (`None` if it is not held); consecutive pairs from one entry decode it
/// once. `Err(index)` names the first entry that is missing or does not
/// hold what the state says it does: the log and the state disagree.
pub fn fill<'a>(
    items: impl IntoIterator<Item = (Stored, &'a mut Vec<u8>)>,
    payload_at: &mut dyn FnMut(u64) -> Option<Vec<u8>>,
) -> Result<(), u64> {
    let mut decoded: Option<(u64, Option<Command>)> = None;
    for (at, data) in items {
        if decoded.as_ref().is_none_or(|(i, _)| *i != at.index) {
            let cmd = payload_at(at.index).and_then(|p| decode_command(&p));
            decoded = Some((at.index, cmd));
        }
        let bytes = match decoded.as_ref().and_then(|(_, c)| c.as_ref()) {
            Some(Command::AddEntry { data, .. }) if at.slot == 0 => data,
            Some(Command::Produce { messages, .. }) => {
                messages.get(at.slot as usize).ok_or(at.index)?
            }
            _ => return Err(at.index),
        };
        data.clone_from(bytes);
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
            log.get(i as usize - 1).cloned()
        };
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let at = [(1, 1), (1, 0), (2, 0)].map(|(index, slot)| Stored { index, slot });
        fill(at.into_iter().zip(out.iter_mut()), &mut payload_at).unwrap();
        assert_eq!(out, [b"m1".to_vec(), b"m0".to_vec(), b"e".to_vec()]);
        assert_eq!(reads.get(), 2, "one read per entry, not per message");
        for (index, slot) in [(1, 2), (2, 1), (3, 0)] {
            let mut d = Vec::new();
            let r = fill([(Stored { index, slot }, &mut d)], &mut payload_at);
            assert_eq!(r, Err(index), "({index}, {slot})");
        }
    }
}
