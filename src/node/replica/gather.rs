//! What a leader gathers in one loop turn before it proposes: the
//! records of client appends (one client batch entry) and ledger and
//! queue commands (one command batch entry), each with one waiter for
//! all of them, one CRC and one fsync share. Whichever kind arrives
//! proposes what the other kind gathered first, and every other proposal
//! proposes both, so entries keep the order their requests came in;
//! `drive` proposes what is left at the start of each turn.

use super::machine::WaiterReply;
use super::tap::WorkloadBug;
use super::Replica;
use crate::consensus::Role;
use crate::node::command::{
    ClientTicket, CommandDone, ProposeError, Reply, StateReply, TicketDone,
};
use crate::node::loops::host::Host;
use crate::state::dedup::{
    begin_client_batch, push_client_record, CLIENT_BATCH_HEADER_BYTES, CLIENT_RECORD_HEADER_BYTES,
    RECORDS_PER_ENTRY_MAX,
};
use crate::state::query::{
    begin_command_batch, push_command, COMMANDS_PER_ENTRY_MAX, COMMAND_BATCH_HEADER_BYTES,
    COMMAND_RECORD_HEADER_BYTES,
};
use crate::state::{Command, Outcome};
use crate::storage::LogDir;

/// One kind of request gathered for one entry.
#[derive(Default)]
pub(super) struct Gathered {
    /// The entry being built (empty: nothing gathered).
    bytes: Vec<u8>,
    /// Who waits for each record or command, in slot order.
    replies: Vec<WaiterReply>,
    /// Bytes of the last entry of this kind: the next one's first
    /// capacity (growing by doubling copied each turn's records twice
    /// more: memmove was 4.6% of a leader's samples).
    bytes_last: usize,
}

impl Gathered {
    /// Whether nothing is gathered.
    fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// Whether `count` more items of `bytes` bytes fit beside what is
    /// gathered, in an entry of `entry_bytes_max` holding `items_max`.
    fn fits(&self, bytes: usize, count: usize, entry_bytes_max: usize, items_max: usize) -> bool {
        self.bytes.len() + bytes <= entry_bytes_max && self.replies.len() + count <= items_max
    }

    /// Starts an entry with `begin` if none is begun, with room for about
    /// the last one's bytes.
    fn begin(&mut self, bytes: usize, entry_bytes_max: usize, begin: fn(&mut Vec<u8>)) {
        if self.bytes.is_empty() {
            let hint = self.bytes_last.max(bytes).min(entry_bytes_max);
            self.bytes.reserve(CLIENT_BATCH_HEADER_BYTES + hint);
            begin(&mut self.bytes);
        }
    }

    /// The entry and its waiters, leaving nothing gathered.
    fn take(&mut self) -> Option<(Vec<u8>, WaiterReply)> {
        if self.is_empty() {
            return None;
        }
        let data = std::mem::take(&mut self.bytes);
        self.bytes_last = data.len();
        Some((
            data,
            WaiterReply::Records(std::mem::take(&mut self.replies)),
        ))
    }
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Proposes a client append with its client id and sequence number:
    /// applied once however often it is retried; the reply is the address
    /// it was applied at (the original one for a retry). Gathered with
    /// this turn's other appends into one entry (`propose_gathered`).
    pub(crate) fn propose_client(&mut self, client_id: u64, seq: u64, data: &[u8], reply: Reply) {
        let mut reply = Some(reply);
        self.gather(client_id, seq, &[data], |_| {
            WaiterReply::Index(reply.take().expect("one record"))
        });
    }

    /// `propose_client` for a connection served on a loop: the outcome
    /// goes to `take_client_done` with `ticket`, no callback.
    pub(crate) fn propose_client_ticket(
        &mut self,
        client_id: u64,
        seq: u64,
        data: &[u8],
        ticket: ClientTicket,
    ) {
        self.gather(client_id, seq, &[data], |_| WaiterReply::Ticket(ticket));
    }

    /// The records of one `AppendBatch` as client `client_id`'s
    /// `first_seq..`: all in one entry, so their addresses are
    /// consecutive; record `k`'s outcome goes to `take_client_done` with
    /// `ticket` whose `item` is `ticket.item + k`.
    pub(crate) fn propose_client_batch<T: AsRef<[u8]>>(
        &mut self,
        client_id: u64,
        first_seq: u64,
        items: &[T],
        ticket: ClientTicket,
    ) {
        self.gather(client_id, first_seq, items, |k| {
            WaiterReply::Ticket(ClientTicket {
                item: ticket.item + k as u32,
                ..ticket
            })
        });
    }

    /// Adds `items` (seqs `first_seq..`) to this turn's client batch
    /// entry, starting another first if they do not fit beside what it
    /// holds; refuses them all if they cannot fit in one entry.
    fn gather<T: AsRef<[u8]>>(
        &mut self,
        client_id: u64,
        first_seq: u64,
        items: &[T],
        mut reply_for: impl FnMut(usize) -> WaiterReply,
    ) {
        let bytes: usize = items
            .iter()
            .map(|d| CLIENT_RECORD_HEADER_BYTES + d.as_ref().len())
            .sum();
        let refused = if let Some(why) = &self.stopped {
            Some(ProposeError::LogStopped(why.clone()))
        } else if CLIENT_BATCH_HEADER_BYTES + bytes > self.entry_bytes_max {
            Some(ProposeError::TooLarge {
                bytes: CLIENT_BATCH_HEADER_BYTES + bytes,
                max: self.entry_bytes_max,
            })
        } else if items.len() > RECORDS_PER_ENTRY_MAX {
            Some(ProposeError::Invalid(format!(
                "{} records in one batch, at most {RECORDS_PER_ENTRY_MAX}",
                items.len()
            )))
        } else {
            None
        };
        if let Some(why) = refused {
            for k in 0..items.len() {
                reply_for(k).fail(why.clone(), &mut self.client_done);
            }
            return;
        }
        self.propose_gathered_commands();
        let max = self.entry_bytes_max;
        if !self
            .appends
            .fits(bytes, items.len(), max, RECORDS_PER_ENTRY_MAX)
        {
            self.propose_gathered_appends();
        }
        self.appends.begin(bytes, max, begin_client_batch);
        for (k, data) in items.iter().enumerate() {
            let seq = first_seq.wrapping_add(k as u64);
            push_client_record(&mut self.appends.bytes, client_id, seq, data.as_ref());
            self.appends.replies.push(reply_for(k));
        }
    }

    /// Proposes a ledger or queue command as client `client_id`'s request
    /// `seq` (0: not deduplicated); the reply is its outcome once applied.
    /// The leader's wall clock (`now_ms`) is stamped on the commands that
    /// carry one: every replica then applies the same time. Gathered with
    /// this turn's other commands into one command batch entry.
    pub(crate) fn propose_command(
        &mut self,
        client_id: u64,
        seq: u64,
        command: Command,
        now_ms: u64,
        reply: StateReply,
    ) {
        self.gather_command(
            client_id,
            seq,
            command,
            None,
            now_ms,
            WaiterReply::State(reply),
        );
    }

    /// `propose_command` for a connection served on this loop: the
    /// outcome goes to `take_command_done` with `ticket` (a failure to
    /// `take_client_done`), no callback and no mail. Not for a consume,
    /// whose outcome carries messages to fill in from the log.
    /// `call`: the client, its seq, the command and the encoding it
    /// came in (proposed as it is unless the leader stamps the command).
    pub(crate) fn propose_command_ticket(
        &mut self,
        (client_id, seq, command, encoded): (u64, u64, Command, Vec<u8>),
        now_ms: u64,
        ticket: ClientTicket,
    ) {
        if matches!(command, Command::Consume { .. }) {
            let why = ProposeError::Internal("a consume cannot be answered by ticket".into());
            self.client_done.push((ticket, Err(why)));
            return;
        }
        let reply = WaiterReply::CommandTicket(ticket);
        self.gather_command(client_id, seq, command, Some(encoded), now_ms, reply);
    }

    /// `encoded`: the command's encoding, if the caller has it.
    fn gather_command(
        &mut self,
        client_id: u64,
        seq: u64,
        mut command: Command,
        mut encoded: Option<Vec<u8>>,
        now_ms: u64,
        reply: WaiterReply,
    ) {
        match &mut command {
            Command::CreateLedger { now_ms: t, .. } | Command::Consume { now_ms: t, .. } => {
                *t = now_ms;
                encoded = None; // stamped: no longer what the client sent
            }
            _ => {}
        }
        if let (Some(WorkloadBug::AckNotReplicated), Command::Ack { ids, .. }, Role::Leader) =
            (self.planted_workload, &command, self.raft.role())
        {
            let acked = Outcome::Acked(ids.len() as u64);
            match reply {
                WaiterReply::State(r) => r(Ok(acked)),
                WaiterReply::CommandTicket(t) => self.command_done.push((t, acked)),
                other => other.fail(
                    ProposeError::Internal("not a command".into()),
                    &mut self.client_done,
                ),
            }
            return;
        }
        let encoded = encoded.unwrap_or_else(|| command.encode());
        let bytes = COMMAND_RECORD_HEADER_BYTES + encoded.len();
        let max = self.entry_bytes_max;
        let refused = if let Some(why) = &self.stopped {
            Some(ProposeError::LogStopped(why.clone()))
        } else if COMMAND_BATCH_HEADER_BYTES + bytes > max {
            Some(ProposeError::TooLarge {
                bytes: COMMAND_BATCH_HEADER_BYTES + bytes,
                max,
            })
        } else {
            None
        };
        if let Some(why) = refused {
            reply.fail(why, &mut self.client_done);
            return;
        }
        self.propose_gathered_appends();
        if !self.commands.fits(bytes, 1, max, COMMANDS_PER_ENTRY_MAX) {
            self.propose_gathered_commands();
        }
        self.commands.begin(bytes, max, begin_command_batch);
        push_command(&mut self.commands.bytes, client_id, seq, &encoded);
        self.commands.replies.push(reply);
    }

    /// Proposes what was gathered since the last call, appends and
    /// commands (one entry each; at most one kind is gathered at a time,
    /// as each proposes the other's first). Called at the start of every
    /// `drive`, and before any other proposal, so entries keep the order
    /// their requests came in.
    pub(super) fn propose_gathered(&mut self) {
        self.propose_gathered_appends();
        self.propose_gathered_commands();
    }

    fn propose_gathered_appends(&mut self) {
        if let Some((data, replies)) = self.appends.take() {
            self.propose_now(data, replies);
        }
    }

    fn propose_gathered_commands(&mut self) {
        if let Some((data, replies)) = self.commands.take() {
            self.propose_now(data, replies);
        }
    }

    /// The outcomes of ticketed appends since the last call, and the
    /// failures of ticketed commands, moved into `into` (which the caller
    /// reuses, so no allocation per turn).
    pub(crate) fn take_client_done(&mut self, into: &mut Vec<TicketDone>) {
        into.append(&mut self.client_done);
    }

    /// The outcomes of ticketed commands applied since the last call,
    /// moved into `into`.
    pub(crate) fn take_command_done(&mut self, into: &mut Vec<CommandDone>) {
        into.append(&mut self.command_done);
    }
}
