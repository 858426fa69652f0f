//! Leader election: terms, pre-vote (thesis §9.6), RequestVote (§3.4),
//! the leader lease that keeps removed or partitioned servers from
//! disrupting a healthy leader (§4.2.3), and check-quorum step-down (§6.2).

use super::{Body, Entry, Message, NodeId, Payload, Progress, Raft, Role, Term};

impl Raft {
    /// Applies the term rules common to every message (thesis figure 3.1,
    /// "all servers"). Returns false if the message must be dropped.
    pub(super) fn step_term(&mut self, msg: &Message) -> bool {
        if msg.term > self.term {
            match msg.body {
                // A pre-vote asks about a future term without starting it.
                Body::PreVote { .. } => return true,
                // A granted pre-vote carries the prospective term.
                Body::PreVoteResponse { granted: true } => return true,
                // §4.2.3: while a leader is heard from, a higher-term vote
                // request is a disruption, not news; ignore it entirely.
                Body::Vote {
                    transfer: false, ..
                } if self.in_lease() => return false,
                _ => {}
            }
            let leader = match msg.body {
                Body::Append { .. } | Body::Heartbeat { .. } | Body::InstallSnapshot { .. } => {
                    Some(msg.from)
                }
                _ => None,
            };
            self.become_follower(msg.term, leader);
            return true;
        }
        if msg.term < self.term {
            match msg.body {
                // A deposed leader that missed the election: answer with our
                // term so it steps down. With pre-vote and check-quorum it
                // might otherwise never hear of the new term.
                Body::Append { .. } | Body::Heartbeat { .. } | Body::InstallSnapshot { .. } => {
                    self.send(msg.from, Body::HeartbeatResponse { read_round: 0 });
                }
                Body::PreVote { .. } => self.reply_with_term(
                    msg.from,
                    self.term,
                    Body::PreVoteResponse { granted: false },
                ),
                _ => {}
            }
            return false;
        }
        true
    }

    /// True while this node believes a leader is alive: it leads, or heard
    /// from its leader within the minimum election timeout.
    pub(super) fn in_lease(&self) -> bool {
        if !self.cfg.check_quorum {
            return false;
        }
        match self.role {
            Role::Leader => true,
            _ => {
                self.leader.is_some()
                    && self
                        .leader_contact_ms
                        .is_some_and(|t| self.now_ms < t + self.cfg.election_timeout_ms)
            }
        }
    }

    /// Answers a pre-vote or vote request (thesis figure 3.1 RequestVote
    /// receiver rules; §3.6.1 election restriction; §9.6 pre-vote).
    pub(super) fn handle_vote_request(&mut self, msg: Message) {
        let (last_index, last_term, pre) = match msg.body {
            Body::PreVote {
                last_index,
                last_term,
            } => (last_index, last_term, true),
            Body::Vote {
                last_index,
                last_term,
                ..
            } => (last_index, last_term, false),
            _ => unreachable!("only vote requests are routed here"),
        };
        // A log under repair may lack acknowledged entries: its owner's
        // judgement of "up to date" cannot be trusted, so it grants nothing.
        let up_to_date = !self.is_repairing()
            && (last_term > self.log.last_term()
                || (last_term == self.log.last_term() && last_index >= self.log.last_index()));
        if pre {
            // Granting a pre-vote changes nothing here, so no vote is
            // recorded; the lease keeps a healthy leader in place.
            let granted = msg.term > self.term && up_to_date && !self.in_lease();
            let term = if granted { msg.term } else { self.term };
            self.reply_with_term(msg.from, term, Body::PreVoteResponse { granted });
            return;
        }
        // The term rules ran first, so msg.term == self.term here.
        let can_vote =
            self.vote == Some(msg.from) || (self.vote.is_none() && self.leader.is_none());
        let granted = can_vote && up_to_date;
        if granted {
            self.vote = Some(msg.from);
            self.reset_election_deadline();
        }
        self.send(msg.from, Body::VoteResponse { granted });
    }

    fn reply_with_term(&mut self, to: NodeId, term: Term, body: Body) {
        self.messages_after_persist.push(Message {
            from: self.id,
            to,
            term,
            body,
        });
    }

    /// Counts a pre-vote or vote answer.
    pub(super) fn handle_vote_response(
        &mut self,
        from: NodeId,
        term: Term,
        body: &Body,
        granted: bool,
    ) {
        let counts = match (self.role, body) {
            (Role::PreCandidate, Body::PreVoteResponse { .. }) => {
                (granted && term == self.term + 1) || (!granted && term == self.term)
            }
            (Role::Candidate, Body::VoteResponse { .. }) => term == self.term,
            _ => false,
        };
        if !counts || !self.membership().voters.contains(&from) {
            return;
        }
        self.votes.insert(from, granted);
        let voters = self.voters();
        let quorum = self.membership().quorum();
        let yes = voters
            .iter()
            .filter(|v| self.votes.get(v) == Some(&true))
            .count();
        let no = voters
            .iter()
            .filter(|v| self.votes.get(v) == Some(&false))
            .count();
        if yes >= quorum {
            match self.role {
                Role::PreCandidate => self.become_candidate(false),
                Role::Candidate => self.become_leader(),
                _ => {}
            }
        } else if voters.len() - no < quorum {
            // Lost: wait for a leader or the next timeout.
            self.become_follower(self.term, None);
        }
    }

    /// The election timer expired on a follower or candidate.
    pub(super) fn election_timeout_fired(&mut self) {
        if self.promotable() {
            self.start_election(false);
        } else {
            self.reset_election_deadline();
        }
    }

    /// Starts an election: a pre-vote round first unless disabled or the
    /// leader asked us to take over.
    pub(super) fn start_election(&mut self, transfer: bool) {
        if self.cfg.pre_vote && !transfer {
            self.become_pre_candidate();
        } else {
            self.become_candidate(transfer);
        }
    }

    fn become_pre_candidate(&mut self) {
        self.role = Role::PreCandidate;
        self.leader = None;
        self.votes.clear();
        self.reset_election_deadline();
        let (last_index, last_term) = (self.log.last_index(), self.log.last_term());
        for v in self.voters() {
            if v != self.id {
                self.send(
                    v,
                    Body::PreVote {
                        last_index,
                        last_term,
                    },
                );
            }
        }
        // Our own pre-vote: counted like anyone else's, which also handles a
        // single-voter group.
        let term = self.term + 1;
        self.handle_vote_response(
            self.id,
            term,
            &Body::PreVoteResponse { granted: true },
            true,
        );
    }

    fn become_candidate(&mut self, transfer: bool) {
        self.role = Role::Candidate;
        self.term += 1;
        self.vote = Some(self.id);
        self.leader = None;
        self.leader_contact_ms = None;
        self.votes.clear();
        self.stats.elections_started += 1;
        self.reset_election_deadline();
        let (last_index, last_term) = (self.log.last_index(), self.log.last_term());
        for v in self.voters() {
            if v != self.id {
                // Queued behind the hard state that records our own vote.
                self.send(
                    v,
                    Body::Vote {
                        last_index,
                        last_term,
                        transfer,
                    },
                );
            }
        }
        let term = self.term;
        self.handle_vote_response(self.id, term, &Body::VoteResponse { granted: true }, true);
    }

    fn become_leader(&mut self) {
        self.role = Role::Leader;
        self.leader = Some(self.id);
        self.votes.clear();
        self.stats.leaderships_won += 1;
        let next = self.log.last_index() + 1;
        self.progress = self
            .peers()
            .into_iter()
            .map(|p| (p, Progress::new(next)))
            .collect();
        self.heartbeat_deadline_ms = self.now_ms + self.cfg.heartbeat_interval_ms;
        self.quorum_check_deadline_ms = self.now_ms + self.cfg.election_timeout_ms;
        self.preferred_hold_on_election();
        // Any membership entry not yet committed counts as pending.
        self.pending_membership_index = *self.memberships.keys().next_back().unwrap_or(&0);
        // §6.4: a new leader commits an entry of its own term at once, which
        // also commits everything before it (figure 3.7's rule in §3.6.2).
        let index = self.log.last_index() + 1;
        self.log.append(Entry {
            term: self.term,
            index,
            payload: Payload::Noop,
        });
        self.replication_dirty = true;
    }

    /// Leader timers: heartbeats, check-quorum, transfer timeout.
    pub(super) fn tick_leader(&mut self) {
        if self.now_ms >= self.heartbeat_deadline_ms {
            self.heartbeat_deadline_ms = self.now_ms + self.cfg.heartbeat_interval_ms;
            self.broadcast_heartbeat(self.reads.latest_round());
        }
        if self.now_ms >= self.quorum_check_deadline_ms {
            // §6.2: step down once an election timeout has passed without a
            // majority answering. Checked every heartbeat interval, so the
            // step-down lags the timeout by at most that.
            self.quorum_check_deadline_ms = self.now_ms + self.cfg.heartbeat_interval_ms;
            if self.cfg.check_quorum && !self.quorum_recently_active() {
                self.stats.check_quorum_step_downs += 1;
                self.become_follower(self.term, None);
                return;
            }
        }
        if self
            .transfer
            .as_ref()
            .is_some_and(|t| self.now_ms >= t.deadline_ms)
        {
            self.transfer_timed_out(); // the target did not take over in time
            if !self.may_lead {
                // It was handing over because it may not lead.
                self.become_follower(self.term, None);
                return;
            }
        }
        self.tick_preferred_leader();
    }

    /// True if a majority of voters answered within the last election
    /// timeout (the same window as a follower's lease in `in_lease`).
    fn quorum_recently_active(&self) -> bool {
        let (now, timeout) = (self.now_ms, self.cfg.election_timeout_ms);
        let active = self
            .membership()
            .voters
            .iter()
            .filter(|&&v| {
                v == self.id
                    || self
                        .progress
                        .get(&v)
                        .and_then(|p| p.last_active_ms)
                        .is_some_and(|t| now < t + timeout)
            })
            .count();
        active >= self.membership().quorum()
    }
}
