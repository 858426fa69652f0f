//! Where a connection's request goes (`LoopClients::dispatch`): an append
//! for a group this loop owns is proposed at once with a ticket, one for
//! another loop's group goes there as `CoreCommand::ClientAppends`; the
//! other calls go to the owning loop as commands whose reply comes back
//! by mail, `Leaders` and `Status` to the status thread. Nothing here
//! reads or writes a socket.

use super::conn::TailSlot;
use super::conns::{LoopClients, LoopParts, SlowCall};
use crate::api::{Request, Response};
use crate::node::client::dispatch::{
    answer_response, entries_response, error_response, long_polls_full, outcome_response,
    translate, BatchOutcomes, Dispatch, NodeCall,
};
use crate::node::command::{ClientTicket, CoreCommand, ProposeError};
use crate::node::mesh::CoreMsg;
use crate::transport::GroupId;
use std::sync::Arc;

impl LoopClients {
    /// Request `id` of connection `slot`: carried out here, handed to the
    /// loop owning its group, or answered at once.
    pub(super) fn dispatch(
        &mut self,
        slot: u32,
        generation: u32,
        id: u64,
        req: Request,
        parts: &mut LoopParts<'_>,
    ) {
        if let Some(why) = self.denied(slot, generation, &req) {
            if let Some(c) = self.live(slot, generation) {
                c.respond(id, &why);
            }
            self.mark_flush(slot);
            return;
        }
        self.charge(slot, generation, &req, parts.now_ms);
        let routing = parts.routing;
        let call = match translate(req, |g| routing.owner.contains_key(&g)) {
            Dispatch::Call(call) => call,
            Dispatch::Answer(resp) => {
                if let Some(c) = self.live(slot, generation) {
                    c.respond(id, &resp);
                }
                self.mark_flush(slot);
                return;
            }
            Dispatch::Nothing => return,
        };
        let ticket = ClientTicket {
            core: self.me,
            conn: slot,
            generation,
            request: id,
            item: 0,
        };
        match call {
            NodeCall::Append {
                group,
                client_id,
                seq,
                data,
            } => match parts.by_group.get(&group) {
                // This loop's group: proposed from the request's own
                // buffer, nothing gathered.
                Some(&i) => parts.replicas[i].propose_client_ticket(client_id, seq, &data, ticket),
                None => self.append(group, client_id, seq, &[data], ticket, parts),
            },
            NodeCall::AppendBatch {
                group,
                client_id,
                first_seq,
                items,
            } => {
                if let Some(c) = self.live(slot, generation) {
                    c.batches.insert(id, BatchOutcomes::new(items.len()));
                }
                self.append(group, client_id, first_seq, &items, ticket, parts);
            }
            NodeCall::Leaders | NodeCall::Status => {
                if let Some(c) = self.live(slot, generation) {
                    c.calls_in_flight += 1;
                }
                let status = matches!(call, NodeCall::Status);
                let answer = self.answer_back(slot, generation, id, false);
                let sent = self.port.slow.try_send(SlowCall {
                    status,
                    answer: Box::new(answer),
                });
                if sent.is_err() {
                    let busy = ProposeError::Busy("too many status requests waiting".into());
                    let resp = error_response(busy, &self.port.addrs);
                    self.answer(slot, generation, id, resp, false);
                }
            }
            // A command to this loop's group: proposed at once, so the
            // group's commands keep the order they came in on the
            // connection. One whose answer is small goes by ticket, as
            // appends do (no mail, no wake-up); a consume's answer carries
            // messages to read from the log, so it comes back by mail.
            NodeCall::State {
                group,
                client_id,
                seq,
                command,
                encoded,
            } if parts.by_group.contains_key(&group) => {
                let i = parts.by_group[&group];
                let now_ms = crate::node::command::wall_clock_ms();
                if matches!(command, crate::state::Command::Consume { .. }) {
                    if let Some(c) = self.live(slot, generation) {
                        c.calls_in_flight += 1;
                    }
                    let back = self.answer_back(slot, generation, id, false);
                    let addrs = Arc::clone(&self.port.addrs);
                    let reply = Box::new(move |r| back(outcome_response(r, &addrs)));
                    parts.replicas[i].propose_command(client_id, seq, command, now_ms, reply);
                } else {
                    let call = (client_id, seq, command, encoded);
                    parts.replicas[i].propose_command_ticket(call, now_ms, ticket);
                }
            }
            call => self.call_owner(slot, generation, id, call, parts),
        }
    }

    /// A closure that takes an answer to request `id` of `slot` back to
    /// this loop (from whichever thread answers it).
    /// `small`: the answer is a small one (not counted in
    /// `calls_in_flight`).
    pub(super) fn answer_back(
        &self,
        slot: u32,
        generation: u32,
        id: u64,
        small: bool,
    ) -> impl FnOnce(Response) + Send {
        let mail = self.mail.clone();
        move |response| {
            mail.send(CoreMsg::ClientAnswer {
                conn: slot,
                generation,
                request: id,
                response,
                small,
            })
        }
    }

    /// Appends `items` as client `client_id`'s `first_seq..`: proposed
    /// here if this loop owns `group` (copied once, into the entry), else
    /// copied out of the frame and handed to its owner, so that no frame
    /// outlives its dispatch and pins the connection's read buffer.
    pub(super) fn append(
        &mut self,
        group: GroupId,
        client_id: u64,
        first_seq: u64,
        items: &[bytes::Bytes],
        ticket: ClientTicket,
        parts: &mut LoopParts<'_>,
    ) {
        if let Some(&i) = parts.by_group.get(&group) {
            parts.replicas[i].propose_client_batch(client_id, first_seq, items, ticket);
            return;
        }
        let Some(&owner) = parts.routing.owner.get(&group) else {
            return; // translate answered an unknown group already
        };
        let count = items.len();
        let cmd = CoreCommand::ClientAppends {
            group,
            client_id,
            first_seq,
            items: items.iter().map(|item| item.to_vec()).collect(),
            ticket,
        };
        if parts.routing.cores[owner].try_command(cmd).is_err() {
            let why = ProposeError::Busy(format!(
                "the queue of the core serving group {group} is full"
            ));
            let addrs = Arc::clone(&self.port.addrs);
            if let Some(c) = self.live(ticket.conn, ticket.generation) {
                for k in 0..count {
                    let t = ClientTicket {
                        item: k as u32,
                        ..ticket
                    };
                    c.outcome(t, Err(why.clone()), &addrs);
                }
            }
            self.mark_flush(ticket.conn);
        }
    }

    /// A read, a tail, a ledger or queue command: to the loop owning its
    /// group (this one too) as a command whose reply comes back here.
    pub(super) fn call_owner(
        &mut self,
        slot: u32,
        generation: u32,
        id: u64,
        call: NodeCall,
        parts: &mut LoopParts<'_>,
    ) {
        let addrs = Arc::clone(&self.port.addrs);
        let small = call.answer_is_small();
        if let Some(c) = self.live(slot, generation) {
            if !small {
                c.calls_in_flight += 1;
            }
        }
        // A long poll waits on the group's loop; it holds one of the
        // node's long-poll slots until it is answered.
        let tail_slot = if !call.long_poll() {
            None
        } else if let Some(s) = TailSlot::take(&self.port.tails, self.port.tails_max) {
            Some(s)
        } else {
            self.answer(slot, generation, id, long_polls_full(&addrs), false);
            return;
        };
        let back = self.answer_back(slot, generation, id, small);
        let done = move |resp: Response| {
            drop(tail_slot);
            back(resp);
        };
        let (group, cmd) = match call {
            NodeCall::Read {
                group,
                from,
                max_entries,
                max_bytes,
                wait_ms,
                stale,
                tail: _,
            } => (
                group,
                CoreCommand::Read {
                    group,
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    stale,
                    reply: Box::new(move |r| done(entries_response(r, &addrs))),
                },
            ),
            NodeCall::State {
                group,
                client_id,
                seq,
                command,
                ..
            } => (
                group,
                CoreCommand::State {
                    group,
                    client_id,
                    seq,
                    command,
                    reply: Box::new(move |r| done(outcome_response(r, &addrs))),
                },
            ),
            NodeCall::Query {
                group,
                query,
                wait_ms,
            } => (
                group,
                CoreCommand::Query {
                    group,
                    query,
                    wait_ms,
                    reply: Box::new(move |r| done(answer_response(r, &addrs))),
                },
            ),
            NodeCall::Append { .. }
            | NodeCall::AppendBatch { .. }
            | NodeCall::Leaders
            | NodeCall::Status => unreachable!("served by dispatch"),
        };
        let Some(&owner) = parts.routing.owner.get(&group) else {
            cmd.fail(ProposeError::UnknownGroup(group));
            return;
        };
        if let Err(cmd) = parts.routing.cores[owner].try_command(cmd) {
            cmd.fail(ProposeError::Busy(format!(
                "the queue of the core serving group {group} is full"
            )));
        }
    }
}
