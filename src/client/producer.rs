//! The pipelined producer: one application thread keeps hundreds of
//! appends in flight, on one connection per node, and learns each one's
//! outcome (its log index, or its error) in the order it sent them per
//! group, without a thread per request.
//!
//! **Who does the I/O.** The caller's thread, inside the producer's calls:
//! the sockets are non-blocking and the producer has no thread of its
//! own. [`Producer::send`] only buffers (it does I/O only when it must
//! wait for room); [`Producer::poll`], [`Producer::wait`] and
//! [`Producer::flush`] write what is due, wait on every socket with one
//! `ppoll(2)`, read the answers and carry out retries. So nothing goes on
//! the wire until the caller calls one of them, and a linger that expired
//! is noticed at the next call: an application that does other work
//! between calls should call `poll(Duration::ZERO)` now and then. Why not
//! an I/O thread: it would put a channel and a wake-up between the caller
//! and its socket on every append, which is what the per-connection
//! threads of the client server cost; here the caller's turn writes all
//! it queued in one `write` per connection.
//!
//! **Batching** (Kafka's producer knobs): records for one group gather in
//! a batch until it holds `batch_bytes_max` record bytes (or
//! `batch_records_max` records), or its first record has waited
//! `linger_us`, or the caller flushes; then it goes out as one `Append`
//! (one record) or `AppendBatch` frame, on the group's leader's
//! connection, if that connection has fewer than `in_flight_max` requests
//! waiting; otherwise it keeps gathering (and batches queue behind it)
//! until a slot frees. With `linger_us` 0 a record goes out at the next
//! turn, in a batch with whatever else came since the last one.
//!
//! **Retries** follow the client's retry policy (`retry::Attempts`: the
//! same `NotLeader` redirects, backoffs and deadline as the blocking
//! `Client`), and every retry carries the same (client id, seq), so the
//! node's dedup table applies each record once. A request answered
//! `NotLeader` (a leader that stepped down answers so every request it
//! holds) is sent again whole to the leader named, or after a backoff to
//! the next node: a batch's records are in one entry, which commits or
//! is dropped whole, so the in-flight window moves to the new leader at
//! once and in order. A batch that fails in any other way but the
//! deadline is split: each of its records is retried as
//! an `Append` of its own with its own seq, because a batch may have been
//! applied in part (one record refused, or a failover in its middle), and
//! an `AppendedBatch` answer names consecutive indexes that a part
//! applied earlier would not have.
//!
//! **Order.** Outcomes are released in the order of sends per group,
//! always (a later record's outcome waits for every earlier one's). The
//! log holds a group's records in that order too: records that failed a
//! try are retried one at a time, lowest seq first, and no new batch of
//! the group goes until they are through. The one exception is a
//! failover in the middle of a pipeline: a request that the old leader
//! committed while an earlier one was lost lands before the earlier
//! one's retry. (Retrying one at a time is slow while it lasts: a round
//! trip per record, as the blocking `append_all` always did.)
//!
//! **Bounds.** `pending_max` tickets issued and not yet taken back by the
//! caller (at most the dedup window, `state::dedup::WINDOW`, so no
//! record still retrying can fall out of the node's memory of applied
//! seqs); `buffered_bytes_max` record bytes held (batched, in flight, or
//! waiting to retry); `in_flight_max` requests per connection. `send`
//! waits (doing I/O) while the bytes are at their bound, and refuses with
//! [`SendError::Full`] when `pending_max` outcomes wait to be taken.

use super::link::{CallId, Link};
use super::retry::{Attempts, CallError, Leaders, Verdict, BACKOFF_MS};
use super::ClientError;
use crate::api::wire::ITEMS_MAX;
use crate::api::{ErrorCode, Received, Request, RequestError, Response};
use crate::state::dedup::WINDOW;
use crate::tls::ClientTls;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Longest one blocking wait inside `send` or `flush` before the
/// producer looks at its timers again.
const TURN_SLICE: Duration = Duration::from_millis(50);

/// The producer's knobs; every limit is named with its unit last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerConfig {
    /// How long the first record of a batch waits for others, in µs (0:
    /// it goes out at the next turn).
    pub linger_us: u64,
    /// Most record bytes in one batch request (a record larger than this
    /// is a batch of its own).
    pub batch_bytes_max: usize,
    /// Most records in one batch request (at most `api::wire::ITEMS_MAX`).
    pub batch_records_max: usize,
    /// Requests waiting for answers on one connection at most.
    pub in_flight_max: usize,
    /// Tickets issued and not yet taken back by `poll`, `wait` or `flush`
    /// (at most `state::dedup::WINDOW`).
    pub pending_max: usize,
    /// Record bytes the producer holds at most (batched, in flight,
    /// waiting to retry).
    pub buffered_bytes_max: usize,
    /// How long one record keeps being retried before it fails with
    /// `Unavailable`, in ms, from its first send.
    pub deadline_ms: u64,
    /// How long a TCP connect may take, in ms (the one blocking step).
    pub connect_timeout_ms: u64,
    /// How long a connection with requests waiting may stay silent before
    /// it is given up and its requests retried, in ms.
    pub request_timeout_ms: u64,
}

impl Default for ProducerConfig {
    fn default() -> ProducerConfig {
        ProducerConfig {
            linger_us: 0,
            batch_bytes_max: 64 << 10,
            batch_records_max: 1024,
            in_flight_max: 256,
            pending_max: WINDOW,
            buffered_bytes_max: 32 << 20,
            deadline_ms: 10_000,
            connect_timeout_ms: 1000,
            request_timeout_ms: 2000,
        }
    }
}

impl ProducerConfig {
    /// Panics, naming the knob, if a limit is outside what works.
    fn check(&self) {
        assert!(self.in_flight_max >= 1, "in_flight_max must be at least 1");
        assert!(
            (1..=ITEMS_MAX).contains(&self.batch_records_max),
            "batch_records_max must be within 1..={ITEMS_MAX}"
        );
        assert!(
            self.batch_bytes_max >= 1,
            "batch_bytes_max must be at least 1"
        );
        assert!(
            (1..=WINDOW).contains(&self.pending_max),
            "pending_max must be within 1..={WINDOW} (the nodes' dedup window)"
        );
        assert!(
            self.buffered_bytes_max >= 1,
            "buffered_bytes_max must be at least 1"
        );
    }
}

/// One record sent: its place in the order of sends (tickets grow by one
/// per send, across groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// The ticket's number: 1 for the producer's first send, and so on.
    pub fn number(self) -> u64 {
        self.0
    }
}

/// The outcome of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The record's ticket.
    pub ticket: Ticket,
    /// The group it was sent to.
    pub group: u32,
    /// Its log index once durable on a majority and applied, or why not.
    pub result: Result<u64, ClientError>,
}

/// Why [`Producer::send`] took no record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendError {
    /// `pending_max` outcomes are waiting to be taken: take some with
    /// `poll`, `wait` or `flush`, then send again.
    Full,
    /// The record is larger than `buffered_bytes_max`: it can never be
    /// sent by this producer.
    TooLarge {
        /// The record's size.
        bytes: usize,
        /// The bound it exceeds.
        buffered_bytes_max: usize,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Full => f.write_str("pending_max outcomes wait to be taken"),
            SendError::TooLarge {
                bytes,
                buffered_bytes_max,
            } => write!(
                f,
                "a record of {bytes} bytes exceeds buffered_bytes_max ({buffered_bytes_max})"
            ),
        }
    }
}

impl std::error::Error for SendError {}

/// What the producer did so far; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Append and AppendBatch requests put on the wire, retries included.
    pub requests_sent: u64,
    /// Records in those requests.
    pub records_sent: u64,
    /// Batches split into one request per record after a failed try.
    pub batches_split: u64,
    /// Requests (batches or single records) sent again whole after a
    /// `NotLeader` answer (a leader that stepped down, or a node that
    /// does not lead).
    pub batches_redirected: u64,
    /// TCP connections opened.
    pub connections_opened: u64,
}

/// Records of one group not yet sent, with consecutive seqs.
struct Batch {
    first_seq: u64,
    items: Vec<bytes::Bytes>,
    bytes: usize,
    /// When its first record came: it goes out `linger_us` later at the latest.
    opened: Instant,
    /// Takes no more records: it goes out as soon as a slot is free.
    full: bool,
}

/// A ticket of a group, in the order of sends, until it is released.
struct Slot {
    ticket: u64,
    seq: u64,
    result: Option<Result<u64, ClientError>>,
}

/// One group's records on their way.
struct Group {
    /// Seqs are per group (each group's dedup table is its own).
    next_seq: u64,
    /// Not yet sent, oldest first; only the last one takes records.
    batches: VecDeque<Batch>,
    /// Tickets not yet released to the caller, in the order of sends.
    order: VecDeque<Slot>,
    /// Calls of the group waiting out a backoff: while there are any, no
    /// new batch goes (the leader is being elected, or busy).
    backing_off: usize,
    /// The one record being retried (see `redo`).
    active: Option<CallId>,
    /// Records to retry after a failed try, by seq: one at a time, the
    /// lowest first, each once the one before has its outcome, and no
    /// new batch of the group goes until they all have. Records that
    /// would each find their own way (one to a node it dialled at once,
    /// one to the leader learnt a moment later) would reach the log out
    /// of order; one at a time they reach it in the order sent, as the
    /// blocking `append_all` always did.
    redo: BTreeMap<u64, CallId>,
    /// Calls of the group sent on whole after a `NotLeader` answer and
    /// not answered since: while there are any, no new batch goes (sent
    /// straight to the leader, it could land before them).
    redirected: usize,
}

/// One request on its way: a batch (or a single record) and its retry
/// policy. Its records are `first_seq .. first_seq + count` of `group`.
struct Call {
    group: u32,
    first_seq: u64,
    count: usize,
    bytes: usize,
    attempts: Attempts,
    /// Its first send, in the producer's ms: split records keep it, so
    /// the deadline counts from the record's first try.
    started_ms: u64,
    /// Sent on whole after a `NotLeader` answer, not answered since
    /// (counted in its group's `redirected`).
    redirected: bool,
}

/// A pipelined producer of appends; see the module docs.
pub struct Producer {
    config: ProducerConfig,
    addrs: Vec<SocketAddr>,
    token: Vec<u8>,
    client_id: u64,
    leaders: Leaders,
    links: Vec<Option<Link>>,
    /// An address whose connect just failed, until when, and why: the
    /// other calls of the same turn fail at once instead of each dialling.
    down: Vec<Option<(Instant, String)>>,
    groups: BTreeMap<u32, Group>,
    calls: HashMap<CallId, Call>,
    next_call: CallId,
    /// Calls waiting out a backoff, soonest first.
    timers: BinaryHeap<Reverse<(Instant, CallId)>>,
    next_ticket: u64,
    /// Outcomes released in order per group, not yet taken.
    ready: VecDeque<Completion>,
    /// Tickets issued and not yet taken.
    pending: usize,
    /// Tickets issued and not yet resolved.
    unresolved: usize,
    /// Record bytes held.
    held_bytes: usize,
    /// Send every batch now, lingering or not.
    flushing: bool,
    /// Send the batches of this group up to this seq now (a `wait`).
    urgent: Option<(u32, u64)>,
    /// `activate_next` is on the stack.
    activating: bool,
    epoch: Instant,
    buf: Vec<u8>,
    received: Vec<Received>,
    pollfds: Vec<libc::pollfd>,
    stats: ProducerStats,
    tls: Option<Arc<ClientTls>>,
}

impl Producer {
    /// A producer to the cluster whose nodes listen on `addrs`, presenting
    /// `token`, as client `client_id`: its own id (a random one, see
    /// `random_client_id`), shared with no other client, since seqs count
    /// per group from 1 for each producer. Connects lazily.
    pub fn new(
        addrs: Vec<SocketAddr>,
        token: &[u8],
        client_id: u64,
        config: ProducerConfig,
    ) -> Producer {
        let leaders = Leaders::new(addrs.len());
        Producer::with_leaders(addrs, token, client_id, config, leaders)
    }

    /// The same producer speaking TLS with `tls` to every node (call it
    /// before the first send: open connections stay as they are).
    pub fn with_tls(mut self, tls: Arc<ClientTls>) -> Producer {
        self.tls = Some(tls);
        self
    }

    /// `new`, starting from what `leaders` knows (the blocking client's).
    pub(crate) fn with_leaders(
        addrs: Vec<SocketAddr>,
        token: &[u8],
        client_id: u64,
        config: ProducerConfig,
        leaders: Leaders,
    ) -> Producer {
        config.check();
        assert!(!addrs.is_empty(), "a producer needs at least one address");
        let n = addrs.len();
        Producer {
            config,
            addrs,
            token: token.to_vec(),
            client_id,
            leaders,
            links: (0..n).map(|_| None).collect(),
            down: vec![None; n],
            groups: BTreeMap::new(),
            calls: HashMap::new(),
            next_call: 1,
            timers: BinaryHeap::new(),
            next_ticket: 1,
            ready: VecDeque::new(),
            pending: 0,
            unresolved: 0,
            tls: None,
            held_bytes: 0,
            flushing: false,
            urgent: None,
            activating: false,
            epoch: Instant::now(),
            buf: vec![0; READ_CHUNK_BYTES],
            received: Vec::new(),
            pollfds: Vec::new(),
            stats: ProducerStats::default(),
        }
    }

    /// The knobs it runs with.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// What it did so far.
    pub fn stats(&self) -> ProducerStats {
        self.stats
    }

    /// Tickets issued and not yet taken back (at most `pending_max`).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Tickets whose outcome is not known yet.
    pub fn unresolved(&self) -> usize {
        self.unresolved
    }

    /// What it learnt of the cluster's leaders.
    pub(crate) fn leaders(&self) -> &Leaders {
        &self.leaders
    }

    /// Numbers `group`'s next records from `seq` on (the blocking client
    /// shares one seq counter across its calls). Only while nothing of
    /// `group` is on its way.
    pub(crate) fn set_next_seq(&mut self, group: u32, seq: u64) {
        let g = self.group(group);
        assert!(
            g.order.is_empty(),
            "renumbering a group with records on their way"
        );
        g.next_seq = seq;
    }

    fn group(&mut self, group: u32) -> &mut Group {
        self.groups.entry(group).or_insert_with(|| Group {
            next_seq: 1,
            batches: VecDeque::new(),
            order: VecDeque::new(),
            backing_off: 0,
            active: None,
            redo: BTreeMap::new(),
            redirected: 0,
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Takes `data` for `group` and returns its ticket. Does no I/O unless
    /// `buffered_bytes_max` record bytes are held: then it turns (writes,
    /// waits, reads) until the record fits, which answers or the deadline
    /// always allow.
    pub fn send(&mut self, group: u32, data: &[u8]) -> Result<Ticket, SendError> {
        if data.len() > self.config.buffered_bytes_max {
            return Err(SendError::TooLarge {
                bytes: data.len(),
                buffered_bytes_max: self.config.buffered_bytes_max,
            });
        }
        if self.pending >= self.config.pending_max {
            return Err(SendError::Full);
        }
        while self.held_bytes > 0 && self.held_bytes + data.len() > self.config.buffered_bytes_max {
            self.turn(TURN_SLICE);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending += 1;
        self.unresolved += 1;
        self.held_bytes += data.len();
        let (bytes_max, records_max) = (self.config.batch_bytes_max, self.config.batch_records_max);
        let g = self.group(group);
        let seq = g.next_seq;
        g.next_seq += 1;
        g.order.push_back(Slot {
            ticket,
            seq,
            result: None,
        });
        let fits = g.batches.back_mut().filter(|b| !b.full).and_then(|b| {
            if b.bytes + data.len() <= bytes_max {
                Some(b)
            } else {
                // It does not fit: this batch is complete.
                b.full = true;
                None
            }
        });
        let batch = match fits {
            Some(b) => b,
            None => {
                g.batches.push_back(Batch {
                    first_seq: seq,
                    items: Vec::new(),
                    bytes: 0,
                    opened: Instant::now(),
                    full: false,
                });
                g.batches.back_mut().expect("just pushed")
            }
        };
        debug_assert_eq!(batch.first_seq + batch.items.len() as u64, seq);
        batch.items.push(bytes::Bytes::copy_from_slice(data));
        batch.bytes += data.len();
        if batch.bytes >= bytes_max || batch.items.len() >= records_max {
            batch.full = true;
        }
        Ok(Ticket(ticket))
    }

    /// The next outcome, in the order of sends per group: at once if one
    /// is waiting, else after turning (sending what is due, reading
    /// answers) for up to `timeout`. `None` if none came in that time, or
    /// if nothing is on its way.
    pub fn poll(&mut self, timeout: Duration) -> Option<Completion> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(c) = self.take_front() {
                return Some(c);
            }
            if self.unresolved == 0 {
                return None;
            }
            let left = until.saturating_duration_since(Instant::now());
            self.turn(left);
            if left.is_zero() {
                return self.take_front();
            }
        }
    }

    /// Turns until `ticket`'s outcome is known and every earlier ticket of
    /// its group too, and returns it (the other outcomes stay for
    /// `poll`). The batches of its group up to it go at once, lingering
    /// or not: the caller waits for them. A ticket already taken, or
    /// never issued, is refused with `BadRequest`.
    pub fn wait(&mut self, ticket: Ticket) -> Result<u64, ClientError> {
        let slot = self.groups.iter().find_map(|(&group, g)| {
            let s = g.order.iter().find(|s| s.ticket == ticket.0)?;
            Some((group, s.seq))
        });
        let Some((group, seq)) = slot.or_else(|| {
            let c = self.ready.iter().find(|c| c.ticket == ticket)?;
            Some((c.group, 0))
        }) else {
            return Err(ClientError::Refused(
                ErrorCode::BadRequest,
                format!("ticket {} is not waiting to be taken", ticket.0),
            ));
        };
        self.urgent = Some((group, seq));
        loop {
            if let Some(at) = self.ready.iter().position(|c| c.ticket == ticket) {
                let c = self.ready.remove(at).expect("found");
                self.pending -= 1;
                self.urgent = None;
                return c.result;
            }
            self.turn(TURN_SLICE);
        }
    }

    /// Sends every batch now (lingering or not), turns until every record
    /// sent so far has its outcome, and returns every outcome not yet
    /// taken, in the order of sends per group.
    pub fn flush(&mut self) -> Vec<Completion> {
        self.flushing = true;
        while self.unresolved > 0 {
            self.turn(TURN_SLICE);
        }
        self.flushing = false;
        self.pending -= self.ready.len();
        self.ready.drain(..).collect()
    }

    fn take_front(&mut self) -> Option<Completion> {
        let c = self.ready.pop_front()?;
        self.pending -= 1;
        Some(c)
    }

    /// One turn: timers, due batches, writes, one wait of at most
    /// `timeout` on every socket, reads and what the answers lead to.
    fn turn(&mut self, timeout: Duration) {
        let now = Instant::now();
        self.fire_timers(now);
        self.dispatch(now);
        self.write_all();
        let wake = self.next_wake(now, timeout);
        self.wait_sockets(wake.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        self.check_silence(now);
        self.fire_timers(now);
        self.dispatch(now);
        self.write_all();
    }

    /// When the turn must end at the latest: its timeout, the next
    /// backoff, the next lingering batch, the next silent connection.
    fn next_wake(&self, now: Instant, timeout: Duration) -> Instant {
        let mut wake = now + timeout;
        if let Some(Reverse((t, _))) = self.timers.peek() {
            wake = wake.min(*t);
        }
        let linger = Duration::from_micros(self.config.linger_us);
        for (&group, g) in &self.groups {
            if let Some(b) = g.batches.front() {
                // A due batch that waits for a slot waits for an answer.
                if !self.due(group, b, now) {
                    wake = wake.min(b.opened + linger);
                }
            }
        }
        let silence = Duration::from_millis(self.config.request_timeout_ms);
        for l in self.links.iter().flatten() {
            if !l.waiting.is_empty() {
                wake = wake.min(l.heard + silence);
            }
        }
        wake
    }

    fn due(&self, group: u32, b: &Batch, now: Instant) -> bool {
        b.full
            || self.flushing
            || self
                .urgent
                .is_some_and(|(g, seq)| g == group && b.first_seq <= seq)
            || now.saturating_duration_since(b.opened)
                >= Duration::from_micros(self.config.linger_us)
    }

    /// Calls whose backoff is over try again.
    fn fire_timers(&mut self, now: Instant) {
        while let Some(Reverse((t, id))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let now_ms = self.now_ms();
            let Some(call) = self.calls.get_mut(&id) else {
                continue;
            };
            if let Some(g) = self.groups.get_mut(&call.group) {
                g.backing_off -= 1;
            }
            let v = call.attempts.next(now_ms, &self.leaders);
            self.carry(id, v);
        }
    }

    /// Sends each group's due batches, oldest first, while the leader's
    /// connection has a free slot.
    fn dispatch(&mut self, now: Instant) {
        let groups: Vec<u32> = self.groups.keys().copied().collect();
        for group in groups {
            loop {
                let g = &self.groups[&group];
                let Some(b) = g.batches.front() else {
                    break;
                };
                let retrying = g.active.is_some() || !g.redo.is_empty() || g.redirected > 0;
                if retrying || g.backing_off > 0 || !self.due(group, b, now) {
                    break;
                }
                let addr = self.leaders.pick(group, 0);
                let room = self.links[addr]
                    .as_ref()
                    .is_none_or(|l| l.load() < self.config.in_flight_max);
                if !room {
                    break;
                }
                let b = self
                    .groups
                    .get_mut(&group)
                    .and_then(|g| g.batches.pop_front())
                    .expect("front exists");
                let (count, bytes, first_seq) = (b.items.len(), b.bytes, b.first_seq);
                let req = if count == 1 {
                    Request::Append {
                        group,
                        client_id: self.client_id,
                        seq: first_seq,
                        data: b.items.into_iter().next().expect("one item"),
                    }
                } else {
                    Request::AppendBatch {
                        group,
                        client_id: self.client_id,
                        first_seq,
                        items: b.items,
                    }
                };
                let now_ms = self.now_ms();
                let id = self.add_call(Call {
                    group,
                    first_seq,
                    count,
                    bytes,
                    attempts: Attempts::new(group, req, now_ms, self.config.deadline_ms),
                    started_ms: now_ms,
                    redirected: false,
                });
                let v = self
                    .calls
                    .get_mut(&id)
                    .expect("added")
                    .attempts
                    .next(now_ms, &self.leaders);
                self.carry(id, v);
            }
        }
    }

    fn add_call(&mut self, call: Call) -> CallId {
        let id = self.next_call;
        self.next_call += 1;
        self.calls.insert(id, call);
        id
    }

    /// Carries out `verdict` for call `id`, through every verdict that
    /// follows at once (a connect that fails, a request that cannot be
    /// encoded), until the call is on a connection, waiting out a
    /// backoff, split or settled.
    fn carry(&mut self, id: CallId, mut verdict: Verdict) {
        loop {
            match verdict {
                Verdict::Send(addr) => {
                    if let Err(e) = self.ensure_link(addr) {
                        match self.judge(id, addr, Err(e)) {
                            Some(v) => verdict = v,
                            None => return,
                        }
                        continue;
                    }
                    let link = self.links[addr].as_mut().expect("linked");
                    if link.waiting.len() >= self.config.in_flight_max {
                        link.backlog.push_back(id);
                        return;
                    }
                    match self.put_on(addr, id) {
                        Ok(()) => return,
                        Err(v) => verdict = v,
                    }
                }
                Verdict::RetryAfter { ms } => {
                    let at = Instant::now() + Duration::from_millis(ms);
                    self.timers.push(Reverse((at, id)));
                    let group = self.calls.get(&id).expect("a live call").group;
                    self.group(group).backing_off += 1;
                    return;
                }
                Verdict::Done(resp) => return self.done(id, resp),
                Verdict::Fail(e) => return self.failed(id, e),
            }
        }
    }

    /// Encodes call `id`'s request onto connection `addr`, which has a
    /// free slot; the verdict to carry instead if it cannot go.
    fn put_on(&mut self, addr: usize, id: CallId) -> Result<(), Verdict> {
        let call = self.calls.get(&id).expect("a live call");
        let link = self.links[addr].as_mut().expect("linked");
        match link.queue(id, call.attempts.request()) {
            Ok(()) => {
                self.stats.requests_sent += 1;
                self.stats.records_sent += call.count as u64;
                Ok(())
            }
            Err(RequestError::Encode(e)) => {
                let e = ClientError::Refused(ErrorCode::TooLarge, e.to_string());
                Err(Verdict::Fail(e))
            }
            Err(e @ (RequestError::InFlightFull | RequestError::Closed)) => {
                // The session is closed (or in disorder): the connection
                // is as good as lost.
                match self.judge(id, addr, Err(CallError::Lost(e.to_string()))) {
                    Some(v) => Err(v),
                    None => Ok(()),
                }
            }
        }
    }

    /// Opens connection `addr` unless it is open, or failed to open a
    /// moment ago.
    fn ensure_link(&mut self, addr: usize) -> Result<(), CallError> {
        if self.links[addr].is_some() {
            return Ok(());
        }
        let now = Instant::now();
        if let Some((until, why)) = &self.down[addr] {
            if now < *until {
                return Err(CallError::Lost(why.clone()));
            }
        }
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        match Link::open(
            self.addrs[addr],
            &self.token,
            self.config.in_flight_max,
            timeout,
            self.tls.as_deref(),
        ) {
            Ok(link) => {
                self.stats.connections_opened += 1;
                self.down[addr] = None;
                self.links[addr] = Some(link);
                Ok(())
            }
            Err(e) => {
                let why = match &e {
                    CallError::Lost(w) | CallError::Fatal(_, w) => w.clone(),
                };
                // Shorter than a backoff: a try after one dials again.
                let until = now + Duration::from_millis(BACKOFF_MS / 2);
                self.down[addr] = Some((until, why));
                Err(e)
            }
        }
    }

    /// The retry policy's verdict on try `r` of call `id` at `addr`, or
    /// `None` if the call was split or settled here: a batch is never
    /// tried twice as a batch (see the module docs).
    fn judge(
        &mut self,
        id: CallId,
        addr: usize,
        r: Result<Response, CallError>,
    ) -> Option<Verdict> {
        let now_ms = self.now_ms();
        let redirected = matches!(
            &r,
            Ok(Response::Error {
                code: ErrorCode::NotLeader,
                ..
            })
        );
        let call = self.calls.get_mut(&id).expect("a live call");
        let v = call.attempts.answered(now_ms, &mut self.leaders, addr, r);
        let (group, seq, count) = (call.group, call.first_seq, call.count);
        let was_redirected = std::mem::take(&mut call.redirected);
        if was_redirected {
            self.group(group).redirected -= 1;
        }
        let retrying_one_by_one = self
            .groups
            .get(&group)
            .is_some_and(|g| g.active.is_some() || !g.redo.is_empty());
        // Redirected whole: a request answered `NotLeader` was never
        // proposed, or proposed as one entry by a leader that then stepped
        // down, which commits or is dropped whole, so a batch's indexes
        // stay consecutive whatever the retry finds. The group's requests
        // answered so go on in the order they came back (one connection's
        // order), and no new batch goes until each is answered again
        // (`Group::redirected`), so none overtakes them. Not while records
        // of the group retry one by one: they go first.
        if redirected
            && !retrying_one_by_one
            && matches!(v, Verdict::Send(_) | Verdict::RetryAfter { .. })
        {
            self.stats.batches_redirected += 1;
            self.calls.get_mut(&id).expect("a live call").redirected = true;
            self.group(group).redirected += 1;
            return Some(v);
        }
        if count == 1 {
            if !matches!(v, Verdict::Send(_) | Verdict::RetryAfter { .. }) {
                return Some(v);
            }
            // A record to retry: it goes now if it leads its group's
            // retries, else it waits its turn (see `Group::redo`).
            let g = self.groups.get_mut(&group).expect("its group");
            if g.active == Some(id) || (g.active.is_none() && g.redo.is_empty()) {
                g.active = Some(id);
                return Some(v);
            }
            g.redo.insert(seq, id);
            return None;
        }
        match v {
            Verdict::Done(_) => Some(v),
            // The deadline: every record's outcome is unknown alike.
            Verdict::Fail(ClientError::Unavailable(_)) => Some(v),
            // The connection itself was refused: so is every record.
            Verdict::Fail(ClientError::Refused(
                ErrorCode::Unauthorized | ErrorCode::UnsupportedVersion,
                _,
            )) => Some(v),
            other => {
                self.split(id, other);
                None
            }
        }
    }

    /// Replaces batch call `id` with one call per record (same seqs, same
    /// start), each continuing from `verdict`: waiting out its backoff,
    /// or trying where the policy now points.
    fn split(&mut self, id: CallId, verdict: Verdict) {
        let call = self.calls.remove(&id).expect("a live call");
        self.stats.batches_split += 1;
        let Request::AppendBatch { items, .. } = call.attempts.request() else {
            unreachable!("only batches are split");
        };
        let wait = match verdict {
            Verdict::RetryAfter { ms } => Some(ms),
            _ => None,
        };
        for (k, data) in items.iter().enumerate() {
            let seq = call.first_seq + k as u64;
            let req = Request::Append {
                group: call.group,
                client_id: self.client_id,
                seq,
                data: data.clone(),
            };
            let single = self.add_call(Call {
                group: call.group,
                first_seq: seq,
                count: 1,
                bytes: data.len(),
                attempts: Attempts::new(call.group, req, call.started_ms, self.config.deadline_ms),
                started_ms: call.started_ms,
                redirected: false,
            });
            let g = self.groups.get_mut(&call.group).expect("its group");
            if g.active.is_some() || !g.redo.is_empty() {
                g.redo.insert(seq, single);
                continue;
            }
            g.active = Some(single);
            let v = match wait {
                Some(ms) => Verdict::RetryAfter { ms },
                None => {
                    let now_ms = self.now_ms();
                    let c = self.calls.get_mut(&single).expect("added");
                    c.attempts.next(now_ms, &self.leaders)
                }
            };
            self.carry(single, v);
        }
    }

    /// Starts `group`'s next retry, lowest seq first, once none is on its
    /// way. Not re-entered: a retry that settles at once (its deadline
    /// passed) lets this loop start the next one.
    fn activate_next(&mut self, group: u32) {
        if self.activating {
            return;
        }
        self.activating = true;
        loop {
            let g = self.groups.get_mut(&group).expect("its group");
            if g.active.is_some() {
                break;
            }
            let Some((_, id)) = g.redo.pop_first() else {
                break;
            };
            g.active = Some(id);
            let now_ms = self.now_ms();
            let c = self.calls.get_mut(&id).expect("a live call");
            let v = c.attempts.next(now_ms, &self.leaders);
            self.carry(id, v);
        }
        self.activating = false;
    }

    /// Call `id` succeeded with `resp`.
    fn done(&mut self, id: CallId, resp: Response) {
        let records = self.calls.get(&id).expect("a live call").count;
        match resp {
            Response::Appended { index } if records == 1 => {
                self.settle(id, |_| Ok(index));
            }
            Response::AppendedBatch { first_index, count } if count as usize == records => {
                self.settle(id, |k| Ok(first_index + k as u64));
            }
            // Not what the request asks for: each record finds out alone.
            _ if records > 1 => {
                let now_ms = self.now_ms();
                let v = self
                    .calls
                    .get_mut(&id)
                    .expect("live")
                    .attempts
                    .next(now_ms, &self.leaders);
                self.split(id, v);
            }
            other => {
                let e = ClientError::Unavailable(format!("unexpected answer {other:?}"));
                self.settle(id, |_| Err(e.clone()));
            }
        }
    }

    /// Call `id` failed for good with `e`: every record of it did.
    fn failed(&mut self, id: CallId, e: ClientError) {
        self.settle(id, |_| Err(e.clone()));
    }

    /// Records the outcome of each record `k` of call `id` and releases
    /// what is now complete at the front of its group.
    fn settle(&mut self, id: CallId, outcome: impl Fn(usize) -> Result<u64, ClientError>) {
        let call = self.calls.remove(&id).expect("a live call");
        self.held_bytes -= call.bytes;
        self.unresolved -= call.count;
        let g = self.groups.get_mut(&call.group).expect("its group");
        if call.redirected {
            g.redirected -= 1;
        }
        let at = g
            .order
            .binary_search_by_key(&call.first_seq, |s| s.seq)
            .expect("an unreleased record has its slot");
        for k in 0..call.count {
            let slot = &mut g.order[at + k];
            debug_assert_eq!(slot.seq, call.first_seq + k as u64);
            debug_assert!(slot.result.is_none(), "a record settled twice");
            slot.result = Some(outcome(k));
        }
        while g.order.front().is_some_and(|s| s.result.is_some()) {
            let s = g.order.pop_front().expect("front");
            self.ready.push_back(Completion {
                ticket: Ticket(s.ticket),
                group: call.group,
                result: s.result.expect("settled"),
            });
        }
        if g.active == Some(id) {
            g.active = None;
        }
        self.activate_next(call.group);
    }

    /// Writes every connection's queued frames; a write error loses that
    /// connection.
    fn write_all(&mut self) {
        for addr in 0..self.links.len() {
            let Some(link) = self.links[addr].as_mut() else {
                continue;
            };
            if !link.wants_write() {
                continue;
            }
            if let Err(e) = link.write() {
                self.lose(addr, e);
            }
        }
    }

    /// Waits up to `timeout` for any socket to be readable (or writable,
    /// for one with bytes queued), then reads and writes what is ready.
    fn wait_sockets(&mut self, timeout: Duration) {
        self.pollfds.clear();
        let mut addrs = Vec::new();
        for (addr, link) in self.links.iter().enumerate() {
            let Some(link) = link else { continue };
            let mut events = libc::POLLIN;
            if link.wants_write() {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd: link.fd(),
                events,
                revents: 0,
            });
            addrs.push(addr);
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `pollfds` is a valid array of `len` pollfd structs that
        // outlives the call; a null sigmask leaves the mask alone.
        let n = unsafe {
            libc::ppoll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n <= 0 {
            return; // timed out, or interrupted: the caller turns again
        }
        let ready: Vec<(usize, i16)> = addrs
            .into_iter()
            .zip(self.pollfds.iter().map(|p| p.revents))
            .filter(|(_, r)| *r != 0)
            .collect();
        for (addr, revents) in ready {
            if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                self.read_link(addr);
            }
            if revents & libc::POLLOUT != 0 {
                if let Some(link) = self.links[addr].as_mut() {
                    if let Err(e) = link.write() {
                        self.lose(addr, e);
                    }
                }
            }
        }
    }

    /// Reads connection `addr` and acts on every answer.
    fn read_link(&mut self, addr: usize) {
        let Some(link) = self.links[addr].as_mut() else {
            return;
        };
        let mut got = std::mem::take(&mut self.received);
        let r = link.read(&mut self.buf, &mut got);
        for item in got.drain(..) {
            if self.links[addr].is_none() {
                break; // lost while acting on an earlier answer
            }
            match item {
                Received::Response { id, resp } => self.answer(addr, id, resp),
                Received::ConnectionError { code, message } => {
                    self.lose(addr, CallError::refused(code, message));
                }
            }
        }
        self.received = got;
        if let Err(e) = r {
            if self.links[addr].is_some() {
                self.lose(addr, e);
            }
        }
    }

    /// The answer `resp` to request `id` on connection `addr`.
    fn answer(&mut self, addr: usize, id: u64, resp: Response) {
        let link = self.links[addr].as_mut().expect("linked");
        if id == link.hello_id {
            match resp {
                Response::HelloOk { node } => self.leaders.connected(addr, node),
                Response::Error { code, message, .. } => {
                    let why = format!("{}: {message}", self.addrs[addr]);
                    self.lose(addr, CallError::refused(code, why));
                }
                other => self.lose(
                    addr,
                    CallError::Lost(format!("unexpected answer to Hello: {other:?}")),
                ),
            }
            return;
        }
        let Some(call) = link.waiting.remove(&id) else {
            return; // the session checked it; nothing waits for it
        };
        if let Some(v) = self.judge(call, addr, Ok(resp)) {
            self.carry(call, v);
        }
        self.refill(addr);
    }

    /// Sends calls waiting in connection `addr`'s backlog while it has
    /// free slots.
    fn refill(&mut self, addr: usize) {
        loop {
            let Some(link) = self.links[addr].as_mut() else {
                return;
            };
            if link.waiting.len() >= self.config.in_flight_max {
                return;
            }
            let Some(call) = link.backlog.pop_front() else {
                return;
            };
            if let Err(v) = self.put_on(addr, call) {
                self.carry(call, v);
            }
        }
    }

    /// Gives up connection `addr` for `e`: every call on it or waiting
    /// for it is judged as a try that got no answer.
    fn lose(&mut self, addr: usize, e: CallError) {
        let Some(mut link) = self.links[addr].take() else {
            return;
        };
        let mut calls: Vec<(u64, CallId)> = link.waiting.drain().collect();
        calls.sort_unstable();
        let calls = calls
            .into_iter()
            .map(|(_, c)| c)
            .chain(link.backlog.drain(..));
        for call in calls.collect::<Vec<_>>() {
            if let Some(v) = self.judge(call, addr, Err(e.clone())) {
                self.carry(call, v);
            }
        }
    }

    /// Gives up every connection with requests waiting that heard nothing
    /// for `request_timeout_ms`.
    fn check_silence(&mut self, now: Instant) {
        let silence = Duration::from_millis(self.config.request_timeout_ms);
        for addr in 0..self.links.len() {
            let silent = self.links[addr]
                .as_ref()
                .is_some_and(|l| !l.waiting.is_empty() && now >= l.heard + silence);
            if silent {
                self.lose(addr, CallError::Lost("timed out".into()));
            }
        }
    }
}
