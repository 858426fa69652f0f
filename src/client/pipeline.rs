//! The pipelined command client: one application thread keeps hundreds of
//! ledger and queue commands (produces, ledger adds, acks, consumes) in
//! flight on one connection to a group's leader, and takes each one's
//! outcome back by its ticket, in the order it sent them. The leader
//! gathers the commands of a turn into one log entry (one fsync share for
//! all of them), so a pipeline reaches the log's speed where blocking
//! calls pay a round trip each.
//!
//! **Who does the I/O.** The caller's thread, inside [`CommandPipeline::poll`],
//! [`CommandPipeline::wait`] and [`CommandPipeline::flush`], as with the
//! [`Producer`](super::Producer): `send` only queues; a turn writes what
//! is queued, waits on the socket with one `ppoll(2)` and reads answers.
//!
//! **Order.** Every command carries this pipeline's client id and its own
//! seq, so the node's dedup table applies each once however often it is
//! sent. Commands go out in the order of sends on one connection, and the
//! leader applies them in that order (one turn's in one entry, in slot
//! order): a ledger's adds take entry ids in the order they were sent.
//! When a try fails (a `NotLeader`, an `Unavailable`, a lost or silent
//! connection), the connection is dropped and every command without an
//! outcome is sent again, in order, on a connection to the leader named
//! (or, after a backoff, the next node): a command the old leader had
//! applied is answered from the dedup table with its first outcome. The
//! one exception to the order is a failover in the middle of a pipeline,
//! as for the producer: a command the old leader refused while it was
//! not leading yet, followed by one it applied, lands after it.
//!
//! **Bounds.** `in_flight_max` requests on the wire; `pending_max`
//! tickets issued and not yet taken back (at most the dedup window,
//! `state::dedup::WINDOW`, so no command still retrying can fall out of
//! the node's memory of applied seqs); each command is retried until
//! `deadline_ms` after its first send, then fails `Unavailable` (its
//! outcome unknown: it may have been applied).

use super::link::Link;
use super::retry::{CallError, Leaders, BACKOFF_MS};
use super::{ClientError, SendError, Ticket};
use crate::api::{ErrorCode, Received, Request, Response};
use crate::state::dedup::WINDOW;
use crate::state::{Command, Outcome};
use crate::tls::ClientTls;
use nix::sys::time::TimeSpec;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// The pipeline's knobs; every limit is named with its unit last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Commands waiting for answers on the connection at most.
    pub in_flight_max: usize,
    /// Tickets issued and not yet taken back (at most
    /// `state::dedup::WINDOW`).
    pub pending_max: usize,
    /// How long one command keeps being retried before it fails with
    /// `Unavailable`, in ms, from its first send.
    pub deadline_ms: u64,
    /// How long a TCP connect may take, in ms (the one blocking step).
    pub connect_timeout_ms: u64,
    /// How long the connection may stay silent with commands waiting
    /// before it is given up and they are sent again, in ms.
    pub request_timeout_ms: u64,
}

impl Default for PipelineConfig {
    fn default() -> PipelineConfig {
        PipelineConfig {
            in_flight_max: 256,
            pending_max: WINDOW,
            deadline_ms: 10_000,
            connect_timeout_ms: 1000,
            request_timeout_ms: 2000,
        }
    }
}

/// The outcome of one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandCompletion {
    /// The command's ticket.
    pub ticket: Ticket,
    /// Its outcome once applied (durable on a majority), or why not.
    pub result: Result<Outcome, ClientError>,
}

/// What the pipeline did so far; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Command requests put on the wire, retries included.
    pub requests_sent: u64,
    /// Times every command without an outcome was sent again on a new
    /// connection (after a redirect, a refusal to retry or a lost link).
    pub resends: u64,
    /// TCP connections opened.
    pub connections_opened: u64,
}

/// One command from its send until its outcome is taken.
struct Call {
    /// The request every try sends: the same client id and seq.
    request: Request,
    /// On the current connection (or queued on it).
    sent: bool,
    /// When it was sent (queued), in the pipeline's ms: its deadline
    /// counts from there.
    started_ms: u64,
    result: Option<Result<Outcome, ClientError>>,
}

/// A pipelined command client of one group; see the module docs.
pub struct CommandPipeline {
    config: PipelineConfig,
    addrs: Vec<SocketAddr>,
    token: Vec<u8>,
    tls: Option<Arc<ClientTls>>,
    client_id: u64,
    group: u32,
    leaders: Leaders,
    /// The connection and its address's index.
    link: Option<(usize, Link)>,
    /// Tries of the current round of connections: which node is next.
    attempt: usize,
    /// No connection before this (a backoff).
    not_before: Option<Instant>,
    /// Why the last try failed, for a command that runs out of time.
    last_failure: String,
    /// Commands not yet taken back, in the order of sends; the front's
    /// ticket is `first_ticket`.
    calls: VecDeque<Call>,
    first_ticket: u64,
    next_seq: u64,
    epoch: Instant,
    buf: Vec<u8>,
    received: Vec<Received>,
    stats: PipelineStats,
}

impl CommandPipeline {
    /// A pipeline to `group` of the cluster whose nodes listen on `addrs`,
    /// presenting `token`, as client `client_id` (its own: seqs count
    /// from 1 for each client). Connects lazily.
    pub fn new(
        addrs: Vec<SocketAddr>,
        token: &[u8],
        client_id: u64,
        group: u32,
        config: PipelineConfig,
    ) -> CommandPipeline {
        assert!(!addrs.is_empty(), "a pipeline needs at least one address");
        assert!(
            config.in_flight_max >= 1,
            "in_flight_max must be at least 1"
        );
        assert!(
            (1..=WINDOW).contains(&config.pending_max),
            "pending_max must be within 1..={WINDOW} (the dedup window)"
        );
        let leaders = Leaders::new(addrs.len());
        CommandPipeline {
            config,
            addrs,
            token: token.to_vec(),
            tls: None,
            client_id,
            group,
            leaders,
            link: None,
            attempt: 0,
            not_before: None,
            last_failure: String::from("no node tried"),
            calls: VecDeque::new(),
            first_ticket: 1,
            next_seq: 1,
            epoch: Instant::now(),
            buf: vec![0; READ_CHUNK_BYTES],
            received: Vec::new(),
            stats: PipelineStats::default(),
        }
    }

    /// The same pipeline speaking TLS with `tls` (before the first send).
    pub fn with_tls(mut self, tls: Arc<ClientTls>) -> CommandPipeline {
        self.tls = Some(tls);
        self
    }

    /// What it did so far.
    pub fn stats(&self) -> PipelineStats {
        self.stats
    }

    /// Tickets issued and not yet taken back.
    pub fn pending(&self) -> usize {
        self.calls.len()
    }

    /// Queues `command` and returns its ticket; nothing goes on the wire
    /// until `poll`, `wait` or `flush`. A produce is renumbered to this
    /// client's id and the command's seq as its producer and seq (so its
    /// idempotence holds across retries whatever the caller put there);
    /// the leader stamps its clock on the commands that carry one.
    pub fn send(&mut self, mut command: Command) -> Result<Ticket, SendError> {
        if self.calls.len() >= self.config.pending_max {
            return Err(SendError::Full);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Command::Produce {
            producer_id,
            seq: s,
            ..
        } = &mut command
        {
            (*producer_id, *s) = (produce_producer_id(self.client_id, seq), seq);
        }
        let request = Request::Command {
            group: self.group,
            client_id: self.client_id,
            seq,
            command: command.encode(),
        };
        let started_ms = self.now_ms().max(1);
        self.calls.push_back(Call {
            request,
            sent: false,
            started_ms,
            result: None,
        });
        Ok(Ticket(self.first_ticket + self.calls.len() as u64 - 1))
    }

    /// The next outcome in the order of sends, waiting up to `timeout`
    /// for it (doing the I/O meanwhile); `None` if it is not known by
    /// then, or nothing was sent.
    pub fn poll(&mut self, timeout: Duration) -> Option<CommandCompletion> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(c) = self.take_front() {
                return Some(c);
            }
            if self.calls.is_empty() {
                return None;
            }
            let now = Instant::now();
            self.turn(until.saturating_duration_since(now));
            if Instant::now() >= until {
                return self.take_front();
            }
        }
    }

    /// Waits for `ticket`'s outcome (and every earlier one's, which are
    /// dropped: take them first with `poll` if they matter).
    pub fn wait(&mut self, ticket: Ticket) -> Result<Outcome, ClientError> {
        loop {
            match self.poll(Duration::from_millis(50)) {
                Some(c) if c.ticket == ticket => return c.result,
                Some(c) if c.ticket > ticket => break,
                Some(_) => {}
                None if self.calls.is_empty() => break,
                None => {}
            }
        }
        Err(ClientError::Unavailable(format!(
            "ticket {} was taken already",
            ticket.number()
        )))
    }

    /// Every outcome not yet taken, once all are known.
    pub fn flush(&mut self) -> Vec<CommandCompletion> {
        let mut out = Vec::new();
        while !self.calls.is_empty() {
            if let Some(c) = self.poll(Duration::from_millis(50)) {
                out.push(c);
            }
        }
        out
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The front command's outcome, if it is known.
    fn take_front(&mut self) -> Option<CommandCompletion> {
        self.calls.front()?.result.as_ref()?;
        let call = self.calls.pop_front().expect("checked");
        let ticket = Ticket(self.first_ticket);
        self.first_ticket += 1;
        Some(CommandCompletion {
            ticket,
            result: call.result.expect("checked"),
        })
    }

    /// One turn: connect if need be, send what waits, wait on the socket
    /// up to `timeout`, read answers, fail what ran out of time.
    fn turn(&mut self, timeout: Duration) {
        let now = Instant::now();
        self.expire(now);
        if self.link.is_none() && self.not_before.is_none_or(|t| now >= t) {
            self.connect();
        }
        self.send_waiting();
        let wait = match (&self.link, self.not_before) {
            (Some(_), _) => timeout.min(Duration::from_millis(self.config.request_timeout_ms)),
            (None, Some(t)) => timeout.min(t.saturating_duration_since(now)),
            (None, None) => Duration::ZERO,
        };
        match self.link.as_mut() {
            Some((_, link)) => {
                if let Err(e) = link.write() {
                    self.lose(e);
                    return;
                }
                let (readable, writable) = wait_socket(link, wait);
                if writable {
                    if let Err(e) = link.write() {
                        self.lose(e);
                        return;
                    }
                }
                if readable {
                    self.read();
                }
                self.check_silence();
            }
            None => std::thread::sleep(wait),
        }
    }

    /// Opens a connection to the node most likely to lead the group.
    fn connect(&mut self) {
        let addr = self.leaders.pick(self.group, self.attempt);
        self.attempt += 1;
        let opened = Link::open(
            self.addrs[addr],
            &self.token,
            self.config.in_flight_max,
            Duration::from_millis(self.config.connect_timeout_ms),
            self.tls.as_deref(),
        );
        match opened {
            Ok(link) => {
                self.stats.connections_opened += 1;
                self.link = Some((addr, link));
            }
            Err(CallError::Fatal(code, why)) => self.fail_all(ClientError::Refused(code, why)),
            Err(CallError::Lost(why)) => {
                self.last_failure = why;
                self.leaders.forget(self.group);
                if self.attempt % self.addrs.len() == 0 {
                    self.back_off();
                }
            }
        }
    }

    /// Puts the commands without an outcome that are not on the
    /// connection yet on it, in order, while it has room.
    fn send_waiting(&mut self) {
        let Some((_, link)) = self.link.as_mut() else {
            return;
        };
        for (k, call) in self.calls.iter_mut().enumerate() {
            if link.waiting.len() >= self.config.in_flight_max {
                break;
            }
            if call.sent || call.result.is_some() {
                continue;
            }
            match link.queue(self.first_ticket + k as u64, &call.request) {
                Ok(()) => {}
                // Never sent: refused here, as every node would refuse it.
                Err(crate::api::RequestError::Encode(e)) => {
                    call.result = Some(Err(ClientError::Refused(
                        ErrorCode::TooLarge,
                        format!("the command cannot be sent: {e}"),
                    )));
                    continue;
                }
                Err(_) => break, // the session is full: the next turn
            }
            call.sent = true;
            self.stats.requests_sent += 1;
        }
    }

    /// Reads the connection and acts on every answer.
    fn read(&mut self) {
        let Some((_, link)) = self.link.as_mut() else {
            return;
        };
        let mut got = std::mem::take(&mut self.received);
        let r = link.read(&mut self.buf, &mut got);
        for item in got.drain(..) {
            if self.link.is_none() {
                break; // given up while acting on an earlier answer
            }
            match item {
                Received::Response { id, resp } => self.answer(id, resp),
                Received::ConnectionError { code, message } => {
                    self.lose(CallError::refused(code, message))
                }
            }
        }
        self.received = got;
        if let Err(e) = r {
            if self.link.is_some() {
                self.lose(e);
            }
        }
    }

    /// The answer `resp` to request `id`.
    fn answer(&mut self, id: u64, resp: Response) {
        let Some((addr, link)) = self.link.as_mut() else {
            return;
        };
        let addr = *addr;
        if id == link.hello_id {
            match resp {
                Response::HelloOk { node } => self.leaders.connected(addr, node),
                Response::Error { code, message, .. } => {
                    let why = format!("{}: {message}", self.addrs[addr]);
                    self.lose(CallError::refused(code, why));
                }
                other => self.lose(CallError::Lost(format!(
                    "unexpected answer to Hello: {other:?}"
                ))),
            }
            return;
        }
        let Some(ticket) = link.waiting.remove(&id) else {
            return;
        };
        let Some(k) = ticket.checked_sub(self.first_ticket) else {
            return; // taken already (failed by its deadline)
        };
        let result = match resp {
            Response::Outcome { outcome } => match Outcome::decode(&outcome) {
                Some(o) => Ok(o),
                None => Err(ClientError::Unavailable(
                    "an outcome that does not decode".into(),
                )),
            },
            Response::Error {
                code: ErrorCode::NotLeader,
                leader,
                message,
            } => {
                self.last_failure = message;
                match leader {
                    Some((l, _)) => self.leaders.lead(self.group, l),
                    None => {
                        self.leaders.forget(self.group);
                        self.back_off();
                    }
                }
                self.resend_all();
                return;
            }
            Response::Error { code, message, .. }
                if matches!(
                    code,
                    ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::DiskFull
                ) =>
            {
                self.last_failure = format!("{code}: {message}");
                self.back_off();
                self.resend_all();
                return;
            }
            Response::Error { code, message, .. } => Err(ClientError::Refused(code, message)),
            other => Err(ClientError::Unavailable(format!(
                "unexpected answer to a command: {other:?}"
            ))),
        };
        if result.is_ok() {
            if let Some(n) = self.leaders.node_at(addr) {
                self.leaders.lead(self.group, n);
            }
            self.attempt = 0;
        }
        if let Some(call) = self.calls.get_mut(k as usize) {
            if call.result.is_none() {
                call.result = Some(result);
            }
        }
    }

    /// Drops the connection and sends every command without an outcome
    /// again, in order, on the next one (the dedup table answers those
    /// the node applied already).
    fn resend_all(&mut self) {
        self.link = None;
        self.stats.resends += 1;
        for call in &mut self.calls {
            call.sent = false;
        }
    }

    /// The connection failed with `e`.
    fn lose(&mut self, e: CallError) {
        match e {
            CallError::Fatal(code, why) => {
                self.link = None;
                self.fail_all(ClientError::Refused(code, why));
            }
            CallError::Lost(why) => {
                self.last_failure = why;
                self.leaders.forget(self.group);
                self.back_off();
                self.resend_all();
            }
        }
    }

    /// No connection for `BACKOFF_MS` (a leader is being elected, or busy).
    fn back_off(&mut self) {
        self.not_before = Some(Instant::now() + Duration::from_millis(BACKOFF_MS));
    }

    /// Every command without an outcome fails with `e` (a refusal every
    /// node would give).
    fn fail_all(&mut self, e: ClientError) {
        for call in &mut self.calls {
            if call.result.is_none() {
                call.result = Some(Err(e.clone()));
            }
        }
    }

    /// Fails the commands whose deadline passed: their outcome is unknown.
    fn expire(&mut self, _now: Instant) {
        let now_ms = self.now_ms();
        let deadline = self.config.deadline_ms;
        for call in &mut self.calls {
            let late = now_ms.saturating_sub(call.started_ms) >= deadline;
            if late && call.result.is_none() {
                call.result = Some(Err(ClientError::Unavailable(format!(
                    "no outcome within {deadline} ms (it may have been applied): {}",
                    self.last_failure
                ))));
            }
        }
    }

    /// Gives the connection up if commands wait on it and it heard
    /// nothing for `request_timeout_ms`.
    fn check_silence(&mut self) {
        let silence = Duration::from_millis(self.config.request_timeout_ms);
        let silent = self
            .link
            .as_ref()
            .is_some_and(|(_, l)| !l.waiting.is_empty() && Instant::now() >= l.heard + silence);
        if silent {
            self.lose(CallError::Lost("timed out".into()));
        }
    }
}

/// The producer id of this client's produce `seq`: seqs go to
/// `PRODUCERS_PER_PIPELINE` producer ids in turn, 64 consecutive seqs
/// (a producer window, `state::queue::PRODUCE_WINDOW`) each, so that no
/// window drops a produce while its seq may still be retried (the last
/// 8192 seqs stay in some window; a pipeline has at most 4096 unresolved),
/// and a retry the node's dedup table catches is answered with the ids
/// its first try got. A fixed set: a new producer id every 64 produces
/// made the queue evict and re-create producers, which cost ~10% of the
/// daemons' CPU per produce.
fn produce_producer_id(client_id: u64, seq: u64) -> u64 {
    let bucket = (seq / 64) % PRODUCERS_PER_PIPELINE;
    client_id ^ bucket.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Producer ids one pipeline's produces use (see `produce_producer_id`).
const PRODUCERS_PER_PIPELINE: u64 = 128;
const _: () = assert!(
    PRODUCERS_PER_PIPELINE * crate::state::queue::PRODUCE_WINDOW as u64
        >= 2 * crate::state::dedup::WINDOW as u64
);

/// Waits up to `timeout` for `link`'s socket: (readable or closed,
/// writable).
fn wait_socket(link: &Link, timeout: Duration) -> (bool, bool) {
    use nix::poll::{ppoll, PollFd, PollFlags};
    let mut events = PollFlags::POLLIN;
    if link.wants_write() {
        events |= PollFlags::POLLOUT;
    }
    let mut fds = [PollFd::new(link.as_fd(), events)];
    match ppoll(&mut fds, Some(TimeSpec::from_duration(timeout)), None) {
        Ok(n) if n > 0 => {}
        _ => return (false, false),
    }
    let revents = fds[0].revents().unwrap_or(PollFlags::empty());
    let readable = revents.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR);
    (readable, revents.contains(PollFlags::POLLOUT))
}
