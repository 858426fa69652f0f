//! A queue's snapshot encoding: its messages as runs (streamed, one walk),
//! acked ranges and producer windows, and the decoder that refuses any
//! bytes `apply` could not have produced (canonical runs, bounded counts,
//! every id below the next one accounted for). Never allocates from a
//! count it has not checked against the bytes left.

use super::{
    name_ok, Message, Producer, Queue, Queues, DELIVERIES_PER_MESSAGE_MAX, MESSAGE_BYTES_MAX,
    PRODUCERS_MAX, PRODUCE_MESSAGES_MAX, PRODUCE_WINDOW, QUEUES_MAX, QUEUE_MESSAGES_MAX,
    QUEUE_NAME_BYTES_MAX,
};
use crate::state::query::COMMANDS_PER_ENTRY_MAX;
use crate::state::stored::{Stored, COMMAND_SLOT_BITS};
use crate::state::wire::{put_bytes, put_u32, put_u64, Reader};
use imbl::OrdMap;
use std::collections::VecDeque;

impl Queues {
    /// Appends the queues' encoding (for snapshots) to `out`; `strided`:
    /// in snapshot format 8, whose runs may also span the one-message
    /// produces of consecutive commands of an entry.
    pub(crate) fn encode(&self, out: &mut Vec<u8>, strided: bool) {
        put_u32(out, self.queues.len() as u32);
        for (name, q) in &self.queues {
            put_bytes(out, name.as_bytes());
            put_u32(out, q.max_deliveries);
            put_u64(out, q.next_id);
            // Sized once: growing by doubling copied (and faulted in) a
            // large backlog's encoding several times over.
            let (runs, sizes) = (
                q.live.len() + q.fresh.len() + q.dead.len(),
                q.unacked() + q.dead.len(),
            );
            out.reserve(8 + runs * (RUN_BYTES + usize::from(strided)) + sizes * 4);
            let mut unacked = Runs::new(out, strided);
            let mut live = q.live.iter().peekable();
            for f in &q.fresh {
                while let Some((&id, m)) = live.next_if(|(&id, _)| id < f.first) {
                    unacked.push(id, *m, &[m.counted_bytes]);
                }
                let sizes = &f.sizes[f.from as usize..(f.from + f.len) as usize];
                unacked.push(f.first, f.message(0), sizes);
            }
            for (&id, m) in live {
                unacked.push(id, *m, &[m.counted_bytes]);
            }
            unacked.finish();
            let mut dead = Runs::new(out, strided);
            for (&id, m) in &q.dead {
                dead.push(id, *m, &[m.counted_bytes]);
            }
            dead.finish();
            put_u32(out, q.acked.0.len() as u32);
            for (&s, &e) in &q.acked.0 {
                put_u64(out, s);
                put_u64(out, e);
            }
            put_u32(out, q.producers.len() as u32);
            for (&id, p) in &q.producers {
                put_u64(out, id);
                put_u64(out, p.last_index);
                put_u32(out, p.recent.len() as u32);
                for (seq, ids, fingerprint) in &p.recent {
                    put_u64(out, *seq);
                    put_u64(out, ids.start);
                    put_u64(out, ids.end);
                    put_u64(out, *fingerprint);
                }
            }
        }
    }

    /// Decodes queues from `r`, refusing any that `apply` could not have
    /// built (bounds, order, an id both acked and unacked, ...);
    /// `version`: the snapshot format (3: no produce fingerprints; 4: no
    /// message sizes, each counted as `MESSAGE_BYTES_MAX`; 5: both).
    pub(crate) fn decode(r: &mut Reader<'_>, version: u8) -> Option<Queues> {
        let n = r.count(QUEUES_MAX, 4 + 4 + 8 + 4 * 4)?;
        let mut queues = OrdMap::new();
        for _ in 0..n {
            let name = std::str::from_utf8(r.bytes(QUEUE_NAME_BYTES_MAX)?).ok()?;
            let in_order = queues
                .keys()
                .next_back()
                .is_none_or(|prev: &String| prev.as_str() < name);
            if !name_ok(name) || !in_order {
                return None;
            }
            let name = name.to_string();
            let q = decode_queue(r, version)?;
            queues.insert(name, q);
        }
        Some(Queues { queues })
    }
}

/// Bytes of a run's head in a snapshot (first id, length, index, slot,
/// deliveries, visibility), before its messages' sizes; format 8 adds a
/// byte for its kind after the length.
const RUN_BYTES: usize = 8 + 4 + 8 + 4 + 4 + 8;

/// Whether `next`, the message of the id after `last`'s, goes on with the
/// run `last` ends: as the next part of one produce (`Some(false)`), or,
/// with `strided` (format 8), as part 0 of the next command of the same
/// entry when `last` is a part 0 too (`Some(true)`: one-message produces
/// gathered in one entry, the first part of a larger one after them). `kind`: the run's, once it has two messages (one
/// message can go on either way). Encoder and decoder both ask this, so a
/// state has exactly one encoding.
fn goes_on(last: &Message, kind: Option<bool>, next: &Message, strided: bool) -> Option<bool> {
    let (a, b) = (last.stored, next.stored);
    if a.index != b.index
        || (last.deliveries, last.visible_at_ms) != (next.deliveries, next.visible_at_ms)
    {
        return None;
    }
    let parts = a.slot.checked_add(1) == Some(b.slot);
    let commands = strided && a.part() == 0 && b.part() == 0 && a.command() + 1 == b.command();
    match kind {
        None | Some(false) if parts => Some(false),
        None | Some(true) if commands => Some(true),
        _ => None,
    }
}

/// The run being written.
struct OpenRun {
    /// Its first id and its length.
    first: u64,
    len: u32,
    /// Its last message.
    last: Message,
    /// Whether it spans commands, once it has two messages.
    kind: Option<bool>,
    /// Where its length and (format 8) its kind go.
    len_at: usize,
}

/// Writes messages, ascending by id, as a snapshot's runs: consecutive
/// ids alike in deliveries and visibility from consecutive slots of one
/// produce (or, format 8, from the one-message produces of consecutive
/// commands of one entry), each followed by its messages' counted sizes
/// (4 bytes a message). Streams them in one walk, patching lengths when
/// known: the walk was a tenth of a node's CPU under a produce-only load
/// when it gathered runs first.
struct Runs<'a> {
    out: &'a mut Vec<u8>,
    strided: bool,
    /// Where the run count goes, and the count so far.
    count_at: usize,
    count: u32,
    open: Option<OpenRun>,
}

impl<'a> Runs<'a> {
    fn new(out: &'a mut Vec<u8>, strided: bool) -> Runs<'a> {
        let count_at = out.len();
        put_u32(out, 0);
        Runs {
            out,
            strided,
            count_at,
            count: 0,
            open: None,
        }
    }

    /// Adds `sizes.len()` messages from `id` on, the first `m`, the
    /// others alike in the next slots.
    fn push(&mut self, id: u64, m: Message, sizes: &[u32]) {
        for (k, &counted_bytes) in (0..).zip(sizes) {
            let m = Message {
                stored: Stored {
                    index: m.stored.index,
                    slot: m.stored.slot + k,
                },
                counted_bytes,
                ..m
            };
            self.push_one(id + u64::from(k), m);
        }
    }

    fn push_one(&mut self, id: u64, m: Message) {
        if let Some(run) = &mut self.open {
            let next_id = run.first + u64::from(run.len) == id;
            if let Some(kind) = goes_on(&run.last, run.kind, &m, self.strided).filter(|_| next_id) {
                run.len += 1;
                run.last = m;
                if run.kind.is_none() && self.strided {
                    self.out[run.len_at + 4] = u8::from(kind);
                }
                run.kind = Some(kind);
                put_u32(self.out, m.counted_bytes);
                return;
            }
            self.close();
        }
        put_u64(self.out, id);
        let len_at = self.out.len();
        put_u32(self.out, 0);
        if self.strided {
            self.out.push(0);
        }
        put_u64(self.out, m.stored.index);
        put_u32(self.out, m.stored.slot);
        put_u32(self.out, m.deliveries);
        put_u64(self.out, m.visible_at_ms);
        put_u32(self.out, m.counted_bytes);
        self.open = Some(OpenRun {
            first: id,
            len: 1,
            last: m,
            kind: None,
            len_at,
        });
        self.count += 1;
    }

    /// Writes the open run's length.
    fn close(&mut self) {
        if let Some(run) = self.open.take() {
            self.patch(run.len_at, run.len);
        }
    }

    fn patch(&mut self, at: usize, value: u32) {
        self.out[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn finish(mut self) {
        self.close();
        let (count_at, count) = (self.count_at, self.count);
        self.patch(count_at, count);
    }
}

/// Decodes runs of messages with ascending ids below `next_id`, each
/// from a slot a produce can have; `sized`: each run is followed by its
/// messages' counted bytes (format 5). `batched`: a slot may place its
/// produce in a command batch entry (format 7). `strided`: a run has a
/// kind, and may span the one-message produces of consecutive commands
/// (format 8).
fn decode_messages(
    r: &mut Reader<'_>,
    q: &Queue,
    sized: bool,
    batched: bool,
    strided: bool,
) -> Option<OrdMap<u64, Message>> {
    let n = r.count(QUEUE_MESSAGES_MAX, RUN_BYTES + usize::from(strided))?;
    let mut ms: OrdMap<u64, Message> = OrdMap::new();
    // The previous run's last id and message and, once it has two, its
    // kind.
    let mut prev: Option<(u64, Message, Option<bool>)> = None;
    for _ in 0..n {
        let first = r.u64()?;
        let count = r.u32()?;
        let commands = match if strided { r.u8()? } else { 0 } {
            0 => false,
            1 => true,
            _ => return None,
        };
        let index = r.u64()?;
        let slot = r.u32()?;
        let deliveries = r.u32()?;
        let visible_at_ms = r.u64()?;
        let in_order = ms.get_max().is_none_or(|(prev, _)| *prev < first);
        let place = Stored { index, slot };
        let head = Message {
            stored: place,
            deliveries,
            visible_at_ms,
            counted_bytes: 0,
        };
        // Canonical: a run that would have gone on with the previous one
        // is refused, and so is a run of one message that says it spans
        // commands (equal states encode to equal bytes).
        let goes_on = prev.is_some_and(|(id, last, kind)| {
            id + 1 == first && goes_on(&last, kind, &head, strided).is_some()
        });
        let end = first.checked_add(u64::from(count))?;
        // Before snapshot version 7 every produce had an entry of its own.
        let placed = place.command() < COMMANDS_PER_ENTRY_MAX && (batched || place.command() == 0);
        let slots_fit = if commands {
            count >= 2
                && place.part() == 0
                && place.command() + count as usize <= COMMANDS_PER_ENTRY_MAX
        } else {
            u64::from(place.part()) + u64::from(count) <= PRODUCE_MESSAGES_MAX as u64
        };
        if !in_order
            || goes_on
            || count == 0
            || end > q.next_id
            || index == 0
            || !slots_fit
            || !placed
            || deliveries > q.max_deliveries
            || ms.len() + count as usize > QUEUE_MESSAGES_MAX
        {
            return None;
        }
        let step = if commands { 1 << COMMAND_SLOT_BITS } else { 1 };
        for k in 0..count {
            let counted_bytes = if sized {
                r.u32()?
            } else {
                MESSAGE_BYTES_MAX as u32
            };
            if counted_bytes as usize > MESSAGE_BYTES_MAX {
                return None;
            }
            let m = Message {
                stored: Stored {
                    index,
                    slot: slot + k * step,
                },
                counted_bytes,
                ..head
            };
            ms.insert(first + u64::from(k), m);
            prev = Some((first + u64::from(k), m, (count >= 2).then_some(commands)));
        }
    }
    Some(ms)
}

fn decode_queue(r: &mut Reader<'_>, version: u8) -> Option<Queue> {
    let fingerprinted = version >= 4;
    let max_deliveries = r.u32()?;
    if !(1..=DELIVERIES_PER_MESSAGE_MAX).contains(&max_deliveries) {
        return None;
    }
    let mut q = Queue::new(max_deliveries);
    q.next_id = r.u64()?;
    let (sized, batched, strided) = (version >= 5, version >= 7, version >= 8);
    q.live = decode_messages(r, &q, sized, batched, strided)?;
    q.dead = decode_messages(r, &q, sized, batched, strided)?;
    if q.live.len() + q.dead.len() > QUEUE_MESSAGES_MAX {
        return None;
    }
    let k = r.count(QUEUE_MESSAGES_MAX + 1, 16)?;
    let mut prev_end = None;
    let mut acked = 0u64;
    for _ in 0..k {
        let (s, e) = (r.u64()?, r.u64()?);
        // Canonical: ascending, neither overlapping nor touching.
        if s >= e || e > q.next_id || prev_end.is_some_and(|p| s <= p) {
            return None;
        }
        prev_end = Some(e);
        acked += e - s;
        q.acked.0.insert(s, e);
    }
    // Every id given is unacked, dead or acked, as `apply` leaves them (an
    // id in none of them would be one an ack cannot find).
    if (q.live.len() + q.dead.len()) as u64 + acked != q.next_id {
        return None;
    }
    for (&id, m) in &q.live {
        if q.dead.contains_key(&id) || q.acked.contains(id) {
            return None;
        }
        q.order.insert((m.visible_at_ms, id));
    }
    if q.dead.keys().any(|&id| q.acked.contains(id)) {
        return None;
    }
    let k = r.count(PRODUCERS_MAX, 8 + 8 + 4)?;
    for _ in 0..k {
        let id = r.u64()?;
        let last_index = r.u64()?;
        let in_order = q.producers.get_max().is_none_or(|(prev, _)| *prev < id);
        let j = r.count(PRODUCE_WINDOW, if fingerprinted { 32 } else { 24 })?;
        if !in_order {
            return None;
        }
        let mut p = Producer {
            recent: VecDeque::with_capacity(j),
            last_index,
        };
        for _ in 0..j {
            let (seq, s, e) = (r.u64()?, r.u64()?, r.u64()?);
            let fingerprint = if fingerprinted { r.u64()? } else { 0 };
            if s > e || e > q.next_id {
                return None;
            }
            p.recent.push_back((seq, s..e, fingerprint));
        }
        q.producers.insert(id, p);
    }
    Some(q)
}
