//! Message queues with CMQ's guarantees, as replicated state: a produce is
//! idempotent per (producer id, sequence number) within a bounded window;
//! a consume hides what it hands out until a visibility deadline, after
//! which unacked messages come back; an ack deletes for good (acked ids
//! are kept as ranges, and an acked id is never delivered again); after
//! `max_deliveries` deliveries a message goes to the queue's dead-letter
//! list instead of out again. No I/O and no clock here: time comes in with
//! each consume (the leader's clock, stamped at proposal).
//!
//! Message ids are dense from 0 per queue. Delivery order is by the time a
//! message became visible, then by id: new messages are visible from the
//! time of their produce, so a redelivery does not wait behind a backlog
//! produced after it.
//!
//! A message's bytes stay in the log, in the `Produce` that carried them:
//! the state keeps their place ([`Stored`]), so snapshots hold metadata
//! only, and runs of messages from one produce take a few bytes each.

use super::machine::Error;
use super::query::COMMANDS_PER_ENTRY_MAX;
use super::stored::{Stored, COMMAND_SLOT_BITS};
use super::wire::{put_bytes, put_u32, put_u64, Reader};
use imbl::{OrdMap, OrdSet, Vector};
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

/// Queues a group holds at once.
pub const QUEUES_MAX: usize = 4096;
/// Bytes of a queue's name (UTF-8, not empty).
pub const QUEUE_NAME_BYTES_MAX: usize = 255;
/// Bytes of one message.
pub const MESSAGE_BYTES_MAX: usize = 1 << 20;
/// Messages in one produce.
pub const PRODUCE_MESSAGES_MAX: usize = 1024;
/// Messages one queue holds, unacked and dead-lettered together.
pub const QUEUE_MESSAGES_MAX: usize = 1 << 22;
/// Messages one consume returns at most.
pub const CONSUME_MAX: u32 = 1024;
/// Bytes of messages one consume hands out at most (it always hands out
/// at least one): its answer must fit a client frame (`FRAME_BYTES_MAX`,
/// 16 MiB), or the messages would be hidden, counted as delivered, and
/// never sent, until dead-lettered.
pub const CONSUME_BYTES_MAX: u64 = 8 << 20;
// "At least one" never passes the budget: the largest message fits it.
const _: () = assert!(MESSAGE_BYTES_MAX as u64 <= CONSUME_BYTES_MAX);
/// Ids in one ack.
pub const ACK_IDS_MAX: usize = 4096;
/// Longest visibility timeout, in ms (12 hours).
pub const VISIBILITY_MS_MAX: u64 = 12 * 3600 * 1000;
/// Largest `max_deliveries` a queue may have.
pub const DELIVERIES_PER_MESSAGE_MAX: u32 = 1000;
/// Produce sequence numbers remembered per producer.
pub const PRODUCE_WINDOW: usize = 64;
/// Producers remembered per queue; the least recently active is forgotten.
pub const PRODUCERS_MAX: usize = 1024;

/// A message handed out by a consume (or listed as dead-lettered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The message's id.
    pub id: u64,
    /// Its bytes (empty until filled in from the log, `stored::fill`).
    pub data: Vec<u8>,
    /// Times it has been delivered, this delivery included.
    pub deliveries: u32,
    /// Where its bytes are in the log (not sent to clients).
    pub stored: Stored,
}

/// A queue's metadata, as `list` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// Deliveries after which a message is dead-lettered.
    pub max_deliveries: u32,
    /// Messages ever produced (the next message id).
    pub produced: u64,
    /// Messages neither acked nor dead-lettered (ready or in flight).
    pub unacked: u64,
    /// Messages in the dead-letter list.
    pub dead: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Message {
    stored: Stored,
    deliveries: u32,
    /// When it may be delivered (again), in the leader's ms.
    visible_at_ms: u64,
    /// Its bytes as a consume's budget counts them: its length, or
    /// `MESSAGE_BYTES_MAX` where that was not recorded (a produce or a
    /// snapshot from before sizes were counted).
    counted_bytes: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Producer {
    /// (seq, ids given, fingerprint of the messages) of its last
    /// `PRODUCE_WINDOW` produces, oldest first. A fingerprint of 0 (read
    /// from a snapshot written before fingerprints) matches any retry.
    recent: VecDeque<(u64, Range<u64>, u64)>,
    /// Index of its last produce (for forgetting idle producers).
    last_index: u64,
}

/// Acked ids as disjoint, non-adjacent ranges `start -> end` (exclusive).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Ranges(OrdMap<u64, u64>);

impl Ranges {
    fn contains(&self, id: u64) -> bool {
        self.0
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }

    /// Adds `id`, which must be absent and below `u64::MAX`, merging ranges.
    fn insert(&mut self, id: u64) {
        let (mut start, mut end) = (id, id + 1);
        if let Some((&s, &e)) = self.0.range(..id).next_back() {
            if e == id {
                start = s;
            }
        }
        if let Some(e) = self.0.remove(&(id + 1)) {
            end = e;
        }
        self.0.insert(start, end);
    }
}

/// Messages of one produce never handed out yet, from its `len` still
/// fresh ones on: alike but for their ids, slots and sizes, so kept as one
/// item instead of a tree node each.
#[derive(Clone, Debug)]
struct Fresh {
    /// The id of its first message.
    first: u64,
    /// That message's place (the next ones are in the next slots).
    stored: Stored,
    /// When they became visible (their produce's time).
    visible_at_ms: u64,
    /// Counted bytes of the produce's messages; these are `from..from + len`.
    sizes: Arc<[u32]>,
    from: u32,
    len: u32,
}

impl Fresh {
    /// The id after its last message.
    fn end(&self) -> u64 {
        self.first + u64::from(self.len)
    }

    /// Its `k`-th message, as `live` would hold it.
    fn message(&self, k: u32) -> Message {
        Message {
            stored: Stored {
                index: self.stored.index,
                slot: self.stored.slot + k,
            },
            deliveries: 0,
            visible_at_ms: self.visible_at_ms,
            counted_bytes: self.sizes[(self.from + k) as usize],
        }
    }

    /// Its messages `k..k + len` (within it).
    fn part(&self, k: u32, len: u32) -> Fresh {
        Fresh {
            first: self.first + u64::from(k),
            stored: Stored {
                index: self.stored.index,
                slot: self.stored.slot + k,
            },
            from: self.from + k,
            len,
            ..self.clone()
        }
    }
}

#[derive(Clone, Debug)]
struct Queue {
    max_deliveries: u32,
    next_id: u64,
    /// Messages neither acked nor dead-lettered, but the fresh ones.
    live: OrdMap<u64, Message>,
    /// (visible_at_ms, id) of every message in `live`. Derived, so not in
    /// snapshots.
    order: OrdSet<(u64, u64)>,
    /// Messages never handed out, by produce, ascending both in id and in
    /// visibility: a backlog leaves from its front, so it needs no tree
    /// (two tree inserts a message were a tenth of a produce's CPU). The
    /// delivery order is the lower of `order`'s first and this front, by
    /// (visible_at_ms, id). A produce visible before the last fresh one
    /// (a new leader's clock behind) goes to `live` instead, and a
    /// snapshot restores every message to `live`: where a message is kept
    /// never changes what is delivered or how it encodes.
    fresh: Vector<Fresh>,
    /// Messages in `fresh`.
    fresh_len: usize,
    dead: OrdMap<u64, Message>,
    acked: Ranges,
    producers: OrdMap<u64, Producer>,
}

/// Equal when they hold the same messages in the same states, wherever
/// kept (`live` or `fresh`): equal queues encode to equal bytes.
impl PartialEq for Queue {
    fn eq(&self, other: &Queue) -> bool {
        (
            self.max_deliveries,
            self.next_id,
            self.live.len() + self.fresh_len,
        ) == (
            other.max_deliveries,
            other.next_id,
            other.live.len() + other.fresh_len,
        ) && (&self.dead, &self.acked, &self.producers)
            == (&other.dead, &other.acked, &other.producers)
            && self.messages().eq(other.messages())
    }
}

impl Eq for Queue {}

impl Queue {
    fn new(max_deliveries: u32) -> Queue {
        Queue {
            max_deliveries,
            next_id: 0,
            live: OrdMap::new(),
            order: OrdSet::new(),
            fresh: Vector::new(),
            fresh_len: 0,
            dead: OrdMap::new(),
            acked: Ranges::default(),
            producers: OrdMap::new(),
        }
    }

    /// Messages neither acked nor dead-lettered.
    fn unacked(&self) -> usize {
        self.live.len() + self.fresh_len
    }

    /// Every unacked message, by id.
    fn messages(&self) -> impl Iterator<Item = (u64, Message)> + '_ {
        let mut live = self.live.iter().map(|(&id, &m)| (id, m)).peekable();
        let mut fresh = self
            .fresh
            .iter()
            .flat_map(|f| (0..f.len).map(move |k| (f.first + u64::from(k), f.message(k))))
            .peekable();
        std::iter::from_fn(move || match (live.peek(), fresh.peek()) {
            (Some(l), Some(f)) if l.0 < f.0 => live.next(),
            (Some(_), None) => live.next(),
            _ => fresh.next(),
        })
    }

    /// (visible_at_ms, id) of the next message to deliver, and whether it
    /// is fresh.
    fn next_visible(&self) -> Option<((u64, u64), bool)> {
        let kept = self.order.get_min().copied();
        let fresh = self.fresh.front().map(|f| (f.visible_at_ms, f.first));
        match (kept, fresh) {
            (Some(k), Some(f)) if f < k => Some((f, true)),
            (Some(k), _) => Some((k, false)),
            (None, f) => f.map(|f| (f, true)),
        }
    }

    /// Takes the first fresh message out of `fresh`.
    fn take_fresh_front(&mut self) -> (u64, Message) {
        let f = self.fresh.front_mut().expect("a fresh message was found");
        let (id, m) = (f.first, f.message(0));
        f.first += 1;
        f.stored.slot += 1;
        f.from += 1;
        f.len -= 1;
        if f.len == 0 {
            self.fresh.pop_front();
        }
        self.fresh_len -= 1;
        (id, m)
    }

    /// Takes `id` out of `fresh`, if there: its produce's other messages
    /// stay, split around it.
    fn take_fresh(&mut self, id: u64) -> bool {
        let found = self.fresh.binary_search_by(|f| {
            if f.end() <= id {
                Ordering::Less
            } else if f.first > id {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        });
        let Ok(i) = found else {
            return false;
        };
        let f = self.fresh.remove(i);
        let k = (id - f.first) as u32;
        if k + 1 < f.len {
            self.fresh.insert(i, f.part(k + 1, f.len - k - 1));
        }
        if k > 0 {
            self.fresh.insert(i, f.part(0, k));
        }
        self.fresh_len -= 1;
        true
    }
}

/// Every queue of a group, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Queues {
    queues: OrdMap<String, Queue>,
}

/// Checks a queue name: UTF-8 is checked by the type, the length here.
fn name_ok(name: &str) -> bool {
    !name.is_empty() && name.len() <= QUEUE_NAME_BYTES_MAX
}

impl Queues {
    /// Creates a queue that dead-letters after `max_deliveries` deliveries.
    pub(crate) fn create(&mut self, name: &str, max_deliveries: u32) -> Result<(), Error> {
        if !name_ok(name) || !(1..=DELIVERIES_PER_MESSAGE_MAX).contains(&max_deliveries) {
            return Err(Error::Invalid);
        }
        if self.queues.contains_key(name) {
            return Err(Error::QueueExists);
        }
        if self.queues.len() >= QUEUES_MAX {
            return Err(Error::Limit("queues"));
        }
        self.queues
            .insert(name.to_string(), Queue::new(max_deliveries));
        Ok(())
    }

    /// Deletes a queue and every message in it.
    pub(crate) fn delete(&mut self, name: &str) -> Result<(), Error> {
        self.queues
            .remove(name)
            .map(|_| ())
            .ok_or(Error::NoSuchQueue)
    }

    /// Produces a batch, visible from `now_ms`; returns the ids given. A
    /// retry of (producer, seq) in the window returns the first ids and
    /// adds nothing, if its messages are the first ones (`Conflict` if
    /// not, unless `check_fingerprint` is false: the simulator's planted
    /// bug); one older than the window is refused as `Forgotten`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn produce_checked(
        &mut self,
        name: &str,
        (producer, seq): (u64, u64),
        messages: &[Vec<u8>],
        sizes_counted: bool,
        now_ms: u64,
        at: impl Into<Stored>,
        check_fingerprint: bool,
    ) -> Result<(Range<u64>, bool), Error> {
        let at: Stored = at.into();
        let q = self.queues.get_mut(name).ok_or(Error::NoSuchQueue)?;
        let fingerprint = produce_fingerprint(messages);
        if let Some(p) = q.producers.get(&producer) {
            if let Some((_, ids, seen)) = p.recent.iter().find(|(s, _, _)| *s == seq) {
                // Other messages under the same (producer, seq): two
                // producers share an id, or one reused a seq. Answering
                // with the first one's ids would lose these silently.
                if check_fingerprint && *seen != 0 && *seen != fingerprint {
                    return Err(Error::Conflict);
                }
                return Ok((ids.clone(), true));
            }
            let full = p.recent.len() == PRODUCE_WINDOW;
            if full && p.recent.front().is_some_and(|(s, _, _)| seq < *s) {
                return Err(Error::Forgotten);
            }
        }
        if messages.len() > PRODUCE_MESSAGES_MAX
            || messages.iter().any(|m| m.len() > MESSAGE_BYTES_MAX)
        {
            return Err(Error::Limit("produce"));
        }
        if q.unacked() + q.dead.len() + messages.len() > QUEUE_MESSAGES_MAX {
            return Err(Error::Limit("queue messages"));
        }
        if q.next_id.checked_add(messages.len() as u64).is_none() {
            return Err(Error::Limit("message ids"));
        }
        if !q.producers.contains_key(&producer) && q.producers.len() >= PRODUCERS_MAX {
            // Forget the producer idle the longest (the same one on every
            // replica: they apply the same entries).
            if let Some((&idle, _)) = q.producers.iter().min_by_key(|(_, p)| p.last_index) {
                q.producers.remove(&idle);
            }
        }
        let first = q.next_id;
        let counted = |m: &Vec<u8>| {
            if sizes_counted {
                m.len() as u32
            } else {
                MESSAGE_BYTES_MAX as u32
            }
        };
        let in_order = q.fresh.back().is_none_or(|f| f.visible_at_ms <= now_ms);
        if in_order && !messages.is_empty() {
            q.fresh.push_back(Fresh {
                first,
                stored: at,
                visible_at_ms: now_ms,
                sizes: messages.iter().map(counted).collect(),
                from: 0,
                len: messages.len() as u32,
            });
            q.fresh_len += messages.len();
            q.next_id += messages.len() as u64;
        }
        for (slot, message) in (0..).zip(messages).filter(|_| !in_order) {
            let id = q.next_id;
            q.next_id += 1;
            let m = Message {
                stored: Stored {
                    index: at.index,
                    slot: at.slot + slot,
                },
                deliveries: 0,
                visible_at_ms: now_ms,
                counted_bytes: counted(message),
            };
            q.order.insert((now_ms, id));
            q.live.insert(id, m);
        }
        let ids = first..q.next_id;
        let p = q.producers.entry(producer).or_default();
        if p.recent.len() == PRODUCE_WINDOW {
            p.recent.pop_front();
        }
        p.recent.push_back((seq, ids.clone(), fingerprint));
        p.last_index = at.index;
        Ok((ids, false))
    }

    /// `produce_checked` with the fingerprint checked.
    #[cfg(test)]
    pub(crate) fn produce(
        &mut self,
        name: &str,
        producer: u64,
        seq: u64,
        messages: &[Vec<u8>],
        now_ms: u64,
        index: u64,
    ) -> Result<(Range<u64>, bool), Error> {
        self.produce_checked(name, (producer, seq), messages, true, now_ms, index, true)
    }

    /// Hands out up to `max` messages visible at `now_ms`, hidden again
    /// until `now_ms + visibility_ms`, and no more than
    /// [`CONSUME_BYTES_MAX`] of them (at least one); a message already
    /// delivered `max_deliveries` times goes to the dead-letter list
    /// instead.
    pub(crate) fn consume(
        &mut self,
        name: &str,
        max: u32,
        visibility_ms: u64,
        now_ms: u64,
    ) -> Result<Vec<Delivery>, Error> {
        // At least 1 ms: a message handed out must not be visible again
        // within the same consume.
        if max > CONSUME_MAX || !(1..=VISIBILITY_MS_MAX).contains(&visibility_ms) {
            return Err(Error::Invalid);
        }
        let q = self.queues.get_mut(name).ok_or(Error::NoSuchQueue)?;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        while out.len() < max as usize {
            let Some(((at, id), fresh)) = q.next_visible() else {
                break;
            };
            if at > now_ms {
                break;
            }
            let m = match q.fresh.front() {
                Some(f) if fresh => f.message(0),
                _ => *q.live.get(&id).expect("order holds only live ids"),
            };
            let fits = bytes + u64::from(m.counted_bytes) <= CONSUME_BYTES_MAX;
            if m.deliveries < q.max_deliveries && !fits && !out.is_empty() {
                break; // the next consume takes it
            }
            let mut m = if fresh {
                q.take_fresh_front().1
            } else {
                q.order.remove(&(at, id));
                q.live.remove(&id).expect("just read")
            };
            if m.deliveries >= q.max_deliveries {
                q.dead.insert(id, m);
                continue;
            }
            bytes += u64::from(m.counted_bytes);
            m.deliveries += 1;
            m.visible_at_ms = now_ms.saturating_add(visibility_ms);
            q.order.insert((m.visible_at_ms, id));
            out.push(Delivery {
                id,
                data: Vec::new(),
                deliveries: m.deliveries,
                stored: m.stored,
            });
            q.live.insert(id, m);
        }
        Ok(out)
    }

    /// Acks `ids`: they are deleted and never delivered again; returns how
    /// many were newly acked (ids already acked or never given are skipped).
    pub(crate) fn ack(&mut self, name: &str, ids: &[u64]) -> Result<u64, Error> {
        if ids.len() > ACK_IDS_MAX {
            return Err(Error::Limit("ack ids"));
        }
        let q = self.queues.get_mut(name).ok_or(Error::NoSuchQueue)?;
        let mut acked = 0;
        for &id in ids {
            if id >= q.next_id || q.acked.contains(id) {
                continue;
            }
            if let Some(m) = q.live.remove(&id) {
                q.order.remove(&(m.visible_at_ms, id));
            } else if q.dead.remove(&id).is_none() {
                // Below next_id and neither acked, live nor dead: fresh
                // (every id is one of the four: `decode_queue` refuses a
                // state where one is not).
                let found = q.take_fresh(id);
                debug_assert!(found, "queue message {id} lost track of");
            }
            q.acked.insert(id);
            acked += 1;
        }
        Ok(acked)
    }

    /// The ids the produce `(producer, seq)` got, while the producer's
    /// window still holds it (answers a retry the dedup table caught).
    pub fn produced(&self, name: &str, producer: u64, seq: u64) -> Option<Range<u64>> {
        let p = self.queues.get(name)?.producers.get(&producer)?;
        let (_, ids, _) = p.recent.iter().find(|(s, _, _)| *s == seq)?;
        Some(ids.clone())
    }

    /// True if `id` of the queue has been acked.
    pub fn is_acked(&self, name: &str, id: u64) -> Result<bool, Error> {
        let q = self.queues.get(name).ok_or(Error::NoSuchQueue)?;
        Ok(q.acked.contains(id))
    }

    /// The queue's acked ids as ranges, in order.
    pub fn acked_ranges(&self, name: &str) -> Result<Vec<Range<u64>>, Error> {
        let q = self.queues.get(name).ok_or(Error::NoSuchQueue)?;
        Ok(q.acked.0.iter().map(|(&s, &e)| s..e).collect())
    }

    /// The queue's dead-letter list, by id, from its start: at most
    /// `items_max` messages and, past the first, no more than
    /// [`CONSUME_BYTES_MAX`] of them (so that the answer fits a frame).
    pub fn dead_letters(&self, name: &str, items_max: usize) -> Result<Vec<Delivery>, Error> {
        let q = self.queues.get(name).ok_or(Error::NoSuchQueue)?;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for (&id, m) in q.dead.iter().take(items_max) {
            bytes += u64::from(m.counted_bytes);
            if bytes > CONSUME_BYTES_MAX && !out.is_empty() {
                break;
            }
            out.push(Delivery {
                id,
                data: Vec::new(),
                deliveries: m.deliveries,
                stored: m.stored,
            });
        }
        Ok(out)
    }

    /// Every queue's metadata, by name.
    pub fn list(&self) -> Vec<QueueInfo> {
        let info = |(name, q): (&String, &Queue)| QueueInfo {
            name: name.clone(),
            max_deliveries: q.max_deliveries,
            produced: q.next_id,
            unacked: q.unacked() as u64,
            dead: q.dead.len() as u64,
        };
        self.queues.iter().map(info).collect()
    }

    /// The lowest log index whose bytes a queue still needs, if any.
    /// Ids are given in log order, so a queue's lowest id has its lowest
    /// index.
    pub fn oldest_stored(&self) -> Option<u64> {
        let first = |ms: &OrdMap<u64, Message>| ms.get_min().map(|(_, m)| m.stored.index);
        let fresh = |q: &Queue| q.fresh.front().map(|f| f.stored.index);
        self.queues
            .values()
            .flat_map(|q| [first(&q.live), fresh(q), first(&q.dead)])
            .flatten()
            .min()
    }

    /// Every log index whose bytes a queue still needs (unordered, with
    /// repeats).
    pub(crate) fn each_stored(&self, f: &mut dyn FnMut(u64)) {
        for q in self.queues.values() {
            let mut last = None;
            let fresh = q.fresh.iter().map(|f| f.message(0));
            for m in q
                .live
                .values()
                .copied()
                .chain(fresh)
                .chain(q.dead.values().copied())
            {
                if last != Some(m.stored.index) {
                    last = Some(m.stored.index);
                    f(m.stored.index);
                }
            }
        }
    }

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

/// A produce's fingerprint: the count, each message's length and a
/// CRC32C over them all; never 0 (0 stands for "not recorded").
fn produce_fingerprint(messages: &[Vec<u8>]) -> u64 {
    let mut crc = crc32c::crc32c(&(messages.len() as u64).to_le_bytes());
    for m in messages {
        crc = crc32c::crc32c_append(crc, &(m.len() as u64).to_le_bytes());
        crc = crc32c::crc32c_append(crc, m);
    }
    let bytes: u64 = messages.iter().map(|m| m.len() as u64).sum();
    ((bytes + 1) << 32) | u64::from(crc)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn one_queue(max_deliveries: u32) -> Queues {
        let mut qs = Queues::default();
        qs.create("q", max_deliveries).unwrap();
        qs
    }

    fn ids(ds: &[Delivery]) -> Vec<u64> {
        ds.iter().map(|d| d.id).collect()
    }

    fn msgs(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8]).collect()
    }

    #[test]
    fn a_retried_produce_returns_the_first_ids_and_adds_nothing() {
        let mut qs = one_queue(5);
        assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 1), Ok((0..3, false)));
        assert_eq!(qs.produce("q", 8, 1, &msgs(2), 0, 2), Ok((3..5, false)));
        assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 3), Ok((0..3, true)));
        assert_eq!(qs.list()[0].produced, 5);
        qs.ack("q", &[0, 1, 2]).unwrap();
        assert_eq!(
            qs.produce("q", 7, 1, &msgs(3), 0, 4),
            Ok((0..3, true)),
            "after the ack"
        );
        assert_eq!(qs.list()[0].unacked, 2);
    }

    #[test]
    fn a_reused_producer_and_seq_with_other_messages_is_a_conflict() {
        let mut qs = one_queue(5);
        assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 1), Ok((0..3, false)));
        let other = vec![b"someone else's".to_vec()];
        assert_eq!(qs.produce("q", 7, 1, &other, 0, 2), Err(Error::Conflict));
        let reordered: Vec<Vec<u8>> = msgs(3).into_iter().rev().collect();
        assert_eq!(
            qs.produce("q", 7, 1, &reordered, 0, 3),
            Err(Error::Conflict)
        );
        assert_eq!(qs.list()[0].produced, 3, "nothing added");
        assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 4), Ok((0..3, true)));
    }

    #[test]
    fn produce_seqs_older_than_the_window_are_refused() {
        let mut qs = one_queue(5);
        for s in 0..PRODUCE_WINDOW as u64 + 3 {
            qs.produce("q", 1, s + 10, &msgs(1), 0, s).unwrap();
        }
        assert_eq!(
            qs.produce("q", 1, 10, &msgs(1), 0, 999),
            Err(Error::Forgotten)
        );
        let (ids, retry) = qs.produce("q", 1, 13, &msgs(1), 0, 999).unwrap();
        assert_eq!((ids, retry), (3..4, true), "the oldest still in the window");
    }

    #[test]
    fn unacked_messages_come_back_after_the_visibility_timeout() {
        let mut qs = one_queue(5);
        qs.produce("q", 1, 1, &msgs(4), 100, 1).unwrap();
        let got = qs.consume("q", 3, 1_000, 100).unwrap();
        assert_eq!(ids(&got), vec![0, 1, 2]);
        assert_eq!(got[0].deliveries, 1);
        assert_eq!(ids(&qs.consume("q", 10, 1_000, 500).unwrap()), vec![3]);
        assert_eq!(
            ids(&qs.consume("q", 10, 1_000, 1_099).unwrap()),
            Vec::<u64>::new(),
            "still hidden"
        );
        qs.ack("q", &[1]).unwrap();
        let again = qs.consume("q", 10, 1_000, 1_100).unwrap();
        assert_eq!(
            ids(&again),
            vec![0, 2],
            "unacked ones return, the acked one not"
        );
        assert_eq!(again[0].deliveries, 2);
        assert_eq!(ids(&qs.consume("q", 10, 1_000, 1_500).unwrap()), vec![3]);
    }

    #[test]
    fn acked_ids_are_kept_as_ranges_and_never_delivered_again() {
        let mut qs = one_queue(5);
        qs.produce("q", 1, 1, &msgs(10), 0, 1).unwrap();
        assert_eq!(qs.ack("q", &[0, 1, 2, 5, 4, 3, 8, 2, 99]), Ok(7));
        assert_eq!(qs.acked_ranges("q").unwrap(), vec![0..6, 8..9]);
        assert_eq!(qs.ack("q", &[7]), Ok(1));
        assert_eq!(qs.acked_ranges("q").unwrap(), vec![0..6, 7..9]);
        assert!(qs.is_acked("q", 7).unwrap() && !qs.is_acked("q", 6).unwrap());
        let mut t = 0;
        for _ in 0..4 {
            let got = qs.consume("q", 100, 10, t).unwrap();
            assert_eq!(ids(&got), vec![6, 9]);
            t += 10;
        }
    }

    #[test]
    fn a_message_is_dead_lettered_after_max_deliveries() {
        let mut qs = one_queue(2);
        qs.produce("q", 1, 1, &msgs(2), 0, 1).unwrap();
        assert_eq!(ids(&qs.consume("q", 10, 10, 0).unwrap()), vec![0, 1]);
        qs.ack("q", &[1]).unwrap();
        let second = qs.consume("q", 10, 10, 10).unwrap();
        assert_eq!((ids(&second), second[0].deliveries), (vec![0], 2));
        assert_eq!(
            qs.consume("q", 10, 10, 20).unwrap(),
            vec![],
            "dead, not delivered"
        );
        let dead = qs.dead_letters("q", usize::MAX).unwrap();
        assert_eq!((ids(&dead), dead[0].deliveries), (vec![0], 2));
        assert_eq!(qs.list()[0].dead, 1);
        assert_eq!(qs.ack("q", &[0]), Ok(1), "a dead letter can be acked away");
        assert_eq!(qs.dead_letters("q", usize::MAX).unwrap(), vec![]);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let mut qs = one_queue(2);
        assert_eq!(qs.create("q", 2), Err(Error::QueueExists));
        assert_eq!(qs.create("", 2), Err(Error::Invalid));
        assert_eq!(qs.create("z", 0), Err(Error::Invalid));
        assert_eq!(qs.consume("q", 1, 0, 0), Err(Error::Invalid));
        assert_eq!(qs.consume("q", CONSUME_MAX + 1, 1, 0), Err(Error::Invalid));
        assert_eq!(qs.consume("nope", 1, 1, 0), Err(Error::NoSuchQueue));
        assert_eq!(qs.delete("q"), Ok(()));
        assert_eq!(qs.delete("q"), Err(Error::NoSuchQueue));
    }

    #[test]
    fn a_backlog_encodes_as_a_run_per_produce_and_split_runs_are_refused() {
        let mut qs = one_queue(3);
        for b in 0..10 {
            qs.produce("q", 1, b, &msgs(1000), 5, 100 + b).unwrap();
        }
        qs.consume("q", 2, 10, 5).unwrap();
        let mut bytes = Vec::new();
        qs.encode(&mut bytes, false);
        // Two delivered messages, the rest of the first produce, and nine
        // untouched produces: 12 runs of 36 bytes and each message's size
        // (4 bytes: what a consume's budget counts), plus the producer's
        // window of 10 produces, 32 bytes each; not 10,000 message records.
        let run_bytes = 8 + 4 + 8 + 4 + 4 + 8;
        let bound = 12 * run_bytes + 10_000 * 4 + 10 * 32 + 100;
        assert!(bytes.len() < bound, "{} bytes", bytes.len());
        let back = Queues::decode(&mut Reader::new(&bytes), 5).unwrap();
        assert_eq!(back, qs);
        // One run written as two is not what `encode` writes: refused.
        let mut one = one_queue(3);
        one.produce("q", 1, 1, &msgs(2), 5, 7).unwrap();
        let mut bytes = Vec::new();
        one.encode(&mut bytes, false);
        let split = |b: &mut Vec<u8>| {
            // name, max_deliveries, next_id, live runs: 1
            let at = 4 + 4 + 1 + 4 + 8;
            assert_eq!(b[at..at + 4], 1u32.to_le_bytes());
            b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
            // The run, then its two messages' sizes.
            let run = b[at + 4..at + 4 + run_bytes].to_vec();
            let sizes = b[at + 4 + run_bytes..at + 4 + run_bytes + 8].to_vec();
            let mut first = run.clone();
            first[8..12].copy_from_slice(&1u32.to_le_bytes());
            first.extend_from_slice(&sizes[..4]);
            let mut second = run;
            second[..8].copy_from_slice(&1u64.to_le_bytes());
            second[8..12].copy_from_slice(&1u32.to_le_bytes());
            second[20..24].copy_from_slice(&1u32.to_le_bytes());
            second.extend_from_slice(&sizes[4..]);
            b.splice(
                at + 4..at + 4 + run_bytes + 8,
                first.into_iter().chain(second),
            );
        };
        split(&mut bytes);
        assert_eq!(Queues::decode(&mut Reader::new(&bytes), 5), None);
    }

    #[test]
    fn queues_survive_a_snapshot_and_garbage_is_refused() {
        let mut qs = one_queue(3);
        qs.create("other", 1).unwrap();
        qs.produce("q", 1, 1, &msgs(6), 5, 1).unwrap();
        qs.produce("other", 2, 9, &msgs(2), 5, 2).unwrap();
        qs.consume("q", 2, 10, 5).unwrap();
        qs.ack("q", &[0, 3]).unwrap();
        qs.consume("other", 5, 10, 5).unwrap();
        qs.consume("other", 5, 10, 50).unwrap();
        let mut bytes = Vec::new();
        qs.encode(&mut bytes, true);
        let mut r = Reader::new(&bytes);
        assert_eq!(Queues::decode(&mut r, 8), Some(qs));
        assert!(r.is_done());
        for cut in 0..bytes.len() {
            assert!(
                Queues::decode(&mut Reader::new(&bytes[..cut]), 8).is_none(),
                "cut {cut}"
            );
        }
        // A next id past every message given: an id that is neither
        // unacked, dead nor acked, which an ack could not find. "other"
        // comes first: count, name, max_deliveries, then its next id.
        let at = 4 + 4 + 5 + 4;
        assert_eq!(bytes[at..at + 8], 2u64.to_le_bytes());
        bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        assert_eq!(Queues::decode(&mut Reader::new(&bytes), 8), None);
    }

    /// A consume hands out no more than `CONSUME_BYTES_MAX` of messages
    /// (at least one, which the largest message never exceeds): 20 messages of the largest size used to make an
    /// answer no frame could carry, so they were hidden, counted as
    /// delivered and never sent, until dead-lettered.
    #[test]
    fn a_consume_stops_at_its_byte_budget() {
        let mut qs = one_queue(5);
        let big = vec![vec![7u8; MESSAGE_BYTES_MAX]; 20];
        qs.produce("q", 1, 1, &big, 0, 1).unwrap();
        let per_consume = (CONSUME_BYTES_MAX / MESSAGE_BYTES_MAX as u64) as usize;
        assert_eq!(per_consume, 8);
        let first = qs.consume("q", 20, 10, 0).unwrap();
        assert_eq!(ids(&first), (0..8).collect::<Vec<_>>());
        // The rest stay visible and undelivered for the next consume.
        let second = qs.consume("q", 20, 10, 0).unwrap();
        assert_eq!(ids(&second), (8..16).collect::<Vec<_>>());
        assert!(second.iter().all(|d| d.deliveries == 1));
        // Small messages are not held back by it.
        qs.produce("q", 1, 2, &vec![vec![1u8; 10]; 30], 0, 2)
            .unwrap();
        assert_eq!(qs.consume("q", 40, 10, 0).unwrap().len(), 4 + 30);
    }

    /// A dead-letter list is listed within the same byte budget.
    #[test]
    fn a_dead_letter_listing_stops_at_the_byte_budget() {
        let mut qs = one_queue(1);
        let big = vec![vec![7u8; MESSAGE_BYTES_MAX]; 20];
        qs.produce("q", 1, 1, &big, 0, 1).unwrap();
        for _ in 0..3 {
            qs.consume("q", 20, 10, 0).unwrap();
        }
        // Visible again after one delivery each: dead-lettered, none handed out.
        assert_eq!(qs.consume("q", 20, 10, 10).unwrap(), vec![]);
        let dead = qs.dead_letters("q", usize::MAX).unwrap();
        assert_eq!(ids(&dead), (0..8).collect::<Vec<_>>());
        assert_eq!(qs.dead_letters("q", 3).unwrap().len(), 3);
    }

    /// Sizes not recorded (a produce in the older encoding, or a format 4
    /// snapshot) count as `MESSAGE_BYTES_MAX`, the same on every replica.
    #[test]
    fn messages_of_unknown_size_count_as_the_largest() {
        let mut qs = one_queue(5);
        let small = vec![vec![1u8; 10]; 12];
        qs.produce_checked("q", (1, 1), &small, false, 0, 1, true)
            .unwrap();
        assert_eq!(qs.consume("q", 12, 10, 0).unwrap().len(), 8);
        // Format 4: one queue "q", a run of 12 live messages, no dead, no
        // acks, no producers; no sizes after the run.
        let mut v4 = Vec::new();
        put_u32(&mut v4, 1);
        put_bytes(&mut v4, b"q");
        put_u32(&mut v4, 5); // max deliveries
        put_u64(&mut v4, 12); // next id
        put_u32(&mut v4, 1); // live runs
        put_u64(&mut v4, 0); // first id
        put_u32(&mut v4, 12); // count
        put_u64(&mut v4, 7); // index
        put_u32(&mut v4, 0); // slot
        put_u32(&mut v4, 0); // deliveries
        put_u64(&mut v4, 0); // visible at
        put_u32(&mut v4, 0); // dead runs
        put_u32(&mut v4, 0); // acked ranges
        put_u32(&mut v4, 0); // producers
        let mut r = Reader::new(&v4);
        let mut old = Queues::decode(&mut r, 4).expect("a format 4 encoding");
        assert!(r.is_done());
        assert_eq!(old.consume("q", 12, 10, 0).unwrap().len(), 8);
        // Format 5 wants the sizes: the same bytes are refused.
        assert_eq!(Queues::decode(&mut Reader::new(&v4), 5), None);
        // And a size past the largest message is refused.
        let mut v5 = v4.clone();
        let tail = v5.split_off(v5.len() - 12);
        for k in 0..12u32 {
            put_u32(
                &mut v5,
                if k == 3 {
                    MESSAGE_BYTES_MAX as u32 + 1
                } else {
                    10
                },
            );
        }
        v5.extend_from_slice(&tail);
        assert_eq!(Queues::decode(&mut Reader::new(&v5), 5), None);
    }

    /// Format 8: the one-message produces of consecutive commands of an
    /// entry are one run, not 36 bytes each; the format before still
    /// reads; a run of one message that says it spans commands, a kind
    /// past 1, and two runs that are one are refused.
    #[test]
    fn one_message_produces_of_an_entry_are_one_run() {
        let mut qs = one_queue(3);
        for c in 0..100 {
            let at = Stored::at(9, c, 0);
            qs.produce_checked("q", (1, c as u64), &msgs(1), true, 5, at, true)
                .unwrap();
        }
        let (mut v8, mut v7) = (Vec::new(), Vec::new());
        qs.encode(&mut v8, true);
        qs.encode(&mut v7, false);
        // name, max_deliveries, next_id; one run of 37 bytes and 100
        // sizes; no dead, no acked; the producer's window of 64.
        let head = 4 + 4 + 1 + 4 + 8;
        assert_eq!(
            v8.len(),
            head + 4 + 37 + 400 + 4 + 4 + 4 + 8 + 8 + 4 + 64 * 32
        );
        assert_eq!(v7.len(), v8.len() + 99 * 36 - 1);
        assert_eq!(Queues::decode(&mut Reader::new(&v8), 8).as_ref(), Some(&qs));
        assert_eq!(Queues::decode(&mut Reader::new(&v7), 7).as_ref(), Some(&qs));
        let kind_at = head + 4 + 8 + 4;
        assert_eq!(v8[kind_at], 1, "spans commands");
        let mut bad = v8.clone();
        bad[kind_at] = 2;
        assert_eq!(Queues::decode(&mut Reader::new(&bad), 8), None, "kind 2");
        // Two runs of one message each, the first saying it spans commands.
        let mut two = one_queue(3);
        for c in [0, 5] {
            two.produce_checked(
                "q",
                (1, c as u64),
                &msgs(1),
                true,
                5,
                Stored::at(9, c, 0),
                true,
            )
            .unwrap();
        }
        let mut bytes = Vec::new();
        two.encode(&mut bytes, true);
        assert_eq!(
            Queues::decode(&mut Reader::new(&bytes), 8).as_ref(),
            Some(&two)
        );
        bytes[kind_at] = 1;
        assert_eq!(
            Queues::decode(&mut Reader::new(&bytes), 8),
            None,
            "one message spanning"
        );
        // The 100 as two runs of 50: the second would have gone on with
        // the first.
        let run = |first: u64, c: u32| {
            let mut b = Vec::new();
            put_u64(&mut b, first);
            put_u32(&mut b, 50);
            b.push(1);
            put_u64(&mut b, 9);
            put_u32(&mut b, c << COMMAND_SLOT_BITS);
            put_u32(&mut b, 0);
            put_u64(&mut b, 5);
            (0..50).for_each(|_| put_u32(&mut b, 1));
            b
        };
        let mut split = v8[..head].to_vec();
        put_u32(&mut split, 2);
        split.extend(run(0, 0));
        split.extend(run(50, 50));
        split.extend_from_slice(&v8[head + 4 + 37 + 400..]);
        assert_eq!(Queues::decode(&mut Reader::new(&split), 8), None, "split");
        // The same two runs, the second from another entry, read.
        let mut apart = split.clone();
        let index_at = head + 4 + (37 + 200) + 8 + 4 + 1;
        apart[index_at..index_at + 8].copy_from_slice(&10u64.to_le_bytes());
        let back = Queues::decode(&mut Reader::new(&apart), 8).expect("two runs");
        assert_eq!(back.list()[0].unacked, 100);
    }

    /// The queue as one ordered set of every unacked message: what the
    /// fresh tail must never change (the delivery order before it).
    #[derive(Default)]
    struct Model {
        next_id: u64,
        /// id -> (visible_at_ms, deliveries, counted bytes).
        live: std::collections::BTreeMap<u64, (u64, u32, u32)>,
        dead: std::collections::BTreeSet<u64>,
        acked: std::collections::BTreeSet<u64>,
    }

    impl Model {
        fn consume(
            &mut self,
            max: u32,
            visibility_ms: u64,
            now_ms: u64,
            dl: u32,
        ) -> Vec<(u64, u32)> {
            let (mut out, mut bytes) = (Vec::new(), 0u64);
            while out.len() < max as usize {
                let next = self.live.iter().map(|(&id, &(at, ..))| (at, id)).min();
                let Some((at, id)) = next.filter(|&(at, _)| at <= now_ms) else {
                    break;
                };
                let (_, deliveries, counted) = self.live[&id];
                let fits = bytes + u64::from(counted) <= CONSUME_BYTES_MAX;
                if deliveries < dl && !fits && !out.is_empty() {
                    break;
                }
                self.live.remove(&id);
                if deliveries >= dl {
                    self.dead.insert(id);
                    continue;
                }
                let _ = at;
                bytes += u64::from(counted);
                self.live
                    .insert(id, (now_ms + visibility_ms, deliveries + 1, counted));
                out.push((id, deliveries + 1));
            }
            out
        }

        fn ack(&mut self, ids: &[u64]) -> u64 {
            let mut n = 0;
            for &id in ids {
                if id < self.next_id && self.acked.insert(id) {
                    self.live.remove(&id);
                    self.dead.remove(&id);
                    n += 1;
                }
            }
            n
        }
    }

    /// Random produces (the leader's clock sometimes going back, sizes
    /// counted or not), consumes and acks (of fresh, delivered, dead,
    /// acked and unknown ids) on a queue, on a copy of it restored from
    /// its snapshot now and then, and on the model: the three deliver the
    /// same, and the two queues encode to the same bytes.
    #[test]
    fn the_fresh_tail_delivers_as_one_ordered_set_would() {
        use rand::{Rng, SeedableRng};
        for seed in 0..40u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let dl = rng.gen_range(1..4);
            let (mut a, mut b, mut model) = (one_queue(dl), one_queue(dl), Model::default());
            let (mut now, mut index, mut command) = (1_000u64, 1u64, 0usize);
            for step in 0..600u64 {
                match rng.gen_range(0..10) {
                    0..=3 => {
                        now = if rng.gen_bool(0.1) {
                            now - rng.gen_range(0..20)
                        } else {
                            now + rng.gen_range(0..5)
                        };
                        let n = rng.gen_range(0..4);
                        let batch: Vec<Vec<u8>> = (0..n)
                            .map(|k| vec![k as u8; rng.gen_range(0..50)])
                            .collect();
                        let counted = rng.gen_bool(0.8);
                        // Often the next command of the same entry: runs
                        // that span commands (format 8).
                        if rng.gen_bool(0.6) {
                            command += 1;
                        } else {
                            (index, command) = (index + 1, rng.gen_range(0..2));
                        }
                        let at = Stored::at(index, command, 0);
                        let ra = a.produce_checked("q", (1, step), &batch, counted, now, at, true);
                        let rb = b.produce_checked("q", (1, step), &batch, counted, now, at, true);
                        assert_eq!(ra, rb);
                        for m in &batch {
                            let size = if counted {
                                m.len() as u32
                            } else {
                                MESSAGE_BYTES_MAX as u32
                            };
                            model.live.insert(model.next_id, (now, 0, size));
                            model.next_id += 1;
                        }
                        assert_eq!(ra.unwrap().0.end, model.next_id, "seed {seed} step {step}");
                    }
                    4..=6 => {
                        now += rng.gen_range(0..30);
                        let (max, vis) = (rng.gen_range(1..12), rng.gen_range(1..40));
                        let da = a.consume("q", max, vis, now).unwrap();
                        let db = b.consume("q", max, vis, now).unwrap();
                        assert_eq!(da, db, "seed {seed} step {step}");
                        let got: Vec<(u64, u32)> =
                            da.iter().map(|d| (d.id, d.deliveries)).collect();
                        assert_eq!(
                            got,
                            model.consume(max, vis, now, dl),
                            "seed {seed} step {step}"
                        );
                    }
                    7 | 8 => {
                        let ids: Vec<u64> = (0..rng.gen_range(1..6))
                            .map(|_| rng.gen_range(0..model.next_id + 2))
                            .collect();
                        let n = model.ack(&ids);
                        assert_eq!(a.ack("q", &ids).unwrap(), n, "seed {seed} step {step}");
                        assert_eq!(b.ack("q", &ids).unwrap(), n);
                    }
                    _ => {
                        let mut bytes = Vec::new();
                        b.encode(&mut bytes, true);
                        b = Queues::decode(&mut Reader::new(&bytes), 8).expect("its own snapshot");
                        assert_eq!(a, b, "seed {seed} step {step}");
                    }
                }
                let info = &a.list()[0];
                let unacked = model.live.len() as u64;
                assert_eq!(
                    (info.unacked, info.dead),
                    (unacked, model.dead.len() as u64)
                );
            }
            let (mut ea, mut eb) = (Vec::new(), Vec::new());
            a.encode(&mut ea, true);
            b.encode(&mut eb, true);
            assert_eq!(ea, eb, "seed {seed}");
        }
    }
}
