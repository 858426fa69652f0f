//! What a replica does when its leadership ends or is handed over: the
//! client requests it held for that leadership are answered at once
//! (`answer_lost_leadership`, run at the end of every `drive`), and an
//! operator's transfer (`POST /leader`) is started and answered once the
//! target leads (`settle_transfer`). See docs/internals/node.md, "When a
//! leader stops leading".

use super::tap::{GlueBug, Note};
use super::{reads, refused_by_raft, Replica};
use crate::consensus::{NodeId, Role};
use crate::node::command::{ProposeError, Reply};
use crate::node::loops::host::Host;
use crate::storage::LogDir;

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Once this replica stops leading the term it led (a majority fell
    /// silent, a leadership transfer, a higher term, its disk stalled),
    /// answers at once everything a client waits on here for that
    /// leadership: proposals not yet applied, reads waiting for their
    /// read-index round, long polls. Each gets `SteppedDown` (or
    /// `NotLeader`) with the leader it knows, which clients take as a
    /// redirect: an old leader cut off from the majority learns neither
    /// that its entries committed nor that they were replaced until the
    /// cut heals, and its clients would wait out their timeouts. A retry
    /// carries the same (client, seq): an entry that does commit under
    /// the new leader is answered from the dedup table with its first
    /// index, so nothing applies twice.
    pub(super) fn answer_lost_leadership(&mut self) {
        let leading = (self.raft.role() == Role::Leader).then(|| self.raft.term());
        // Held by a node that does not lead (it took them and lost the
        // leadership before a `drive` saw it lead): answered as well.
        let held = self.requests_held() > 0
            || !self.tails.is_empty()
            || self.log_tails.iter().any(reads::LogTail::is_linear);
        let unchanged = leading == self.led_term && (leading.is_some() || !held);
        // Just elected: what it holds was taken in this term (a follower
        // refuses proposals and read-index rounds), nothing to send on.
        let elected = self.led_term.is_none() && leading.is_some();
        if unchanged || elected {
            self.led_term = leading;
            if leading.is_some() {
                self.transfer_target = self.raft.transfer_target();
            }
            return;
        }
        let led = self.led_term.unwrap_or(self.raft.term());
        self.led_term = leading;
        // Leading again in a later term, it names itself: the retry comes
        // back here and is answered from the dedup table.
        let leader = self.raft.leader().or(self.transfer_target.take());
        self.transfer_target = None;
        let mut answered = 0u64;
        let waiting = std::mem::take(&mut self.waiters);
        let planted_ok = self.planted == Some(GlueBug::StepDownAnswersOk);
        for (index, w) in waiting {
            if w.term > led {
                // Proposed in the term it leads now: still its own.
                self.waiters.insert(index, w);
                continue;
            }
            answered += w.reply.count();
            if planted_ok {
                w.reply.planted_ok(index, &mut self.client_done);
            } else {
                w.reply
                    .fail(ProposeError::SteppedDown(leader), &mut self.client_done);
            }
        }
        // Read-index rounds: the core dropped them as it stepped down (a
        // round asked in a later term it leads again is sent round too:
        // its retry comes back here).
        for (_, read) in std::mem::take(&mut self.reads_pending) {
            read.fail(ProposeError::NotLeader(leader));
            answered += 1;
        }
        // Long polls and linear tails a read-index round vouched for wait
        // on this leadership; leading again, they may go on waiting.
        if leading.is_none() {
            for (_, _, reply) in std::mem::take(&mut self.tails) {
                reply(Err(ProposeError::NotLeader(leader)));
                answered += 1;
            }
            let tails = self.log_tails.len();
            self.fail_linear_log_tails(&ProposeError::NotLeader(leader));
            answered += (tails - self.log_tails.len()) as u64;
        }
        self.step_down_answers += answered;
        self.note(|| Note::SteppedDown {
            term: led,
            answered,
        });
    }

    /// Client requests waiting on this replica's leadership: proposals
    /// not yet applied and reads waiting for their read-index round.
    pub(crate) fn requests_held(&self) -> usize {
        self.waiters.len() + self.reads_pending.len()
    }

    /// Hands this group's leadership to voter `to` (an operator's ask:
    /// draining a node, handing a group back). `reply` gets the term `to`
    /// leads once this node hears from it, or why not (`settle_transfer`).
    /// Proposals are refused (`Busy`) while the transfer is on, at most
    /// an election timeout.
    pub(crate) fn transfer_leadership(&mut self, to: NodeId, reply: Reply) {
        self.propose_gathered();
        if let Some(why) = &self.stopped {
            reply(Err(ProposeError::LogStopped(why.clone())));
            return;
        }
        if let Err(e) = self.raft.transfer_leadership(to) {
            reply(Err(refused_by_raft(e)));
            return;
        }
        if let Some((_, _, older)) = self.transfer_asked.take() {
            older(Err(ProposeError::Busy(format!(
                "superseded by a transfer to node {to}"
            ))));
        }
        self.transfer_asked = Some((to, self.raft.term(), reply));
        self.settle_transfer();
    }

    /// Answers the operator's transfer once its outcome is known here:
    /// `to` leads (the term it leads), the transfer gave up with this
    /// node still leading, or another node won; while nobody is known to
    /// lead, it waits (the caller's timeout is the last resort).
    pub(super) fn settle_transfer(&mut self) {
        let Some(&(to, asked_in, _)) = self.transfer_asked.as_ref() else {
            return;
        };
        let still_leading = self.raft.role() == Role::Leader && self.raft.term() == asked_in;
        let outcome = match self.raft.leader() {
            Some(l) if l == to => Ok(self.raft.term()),
            _ if still_leading && self.raft.transfer_target() == Some(to) => return,
            _ if still_leading => Err(ProposeError::Busy(format!(
                "node {to} did not take the leadership within an election timeout; this node still leads"
            ))),
            Some(l) => Err(ProposeError::Busy(format!(
                "node {l} leads now, not node {to}"
            ))),
            None => return,
        };
        let (_, _, reply) = self.transfer_asked.take().expect("checked above");
        reply(outcome);
    }
}
