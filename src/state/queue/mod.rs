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
//!
//! Here: the queue's state and what `apply` does to it; `codec.rs`: its
//! snapshot encoding and the decoder's refusals; `tests.rs`.

use super::machine::Error;
use super::stored::Stored;
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

mod codec;
#[cfg(test)]
mod tests;
