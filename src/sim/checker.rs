//! The invariants every simulated run must keep, checked as the run goes:
//! each check runs at the step that could break it, so a failure names the
//! event that broke it.
//!
//! - election safety: at most one leader per term (thesis §3.6.3 property 1);
//! - log matching: an (index, term) pair identifies the whole prefix;
//! - leader completeness: a new leader holds every committed entry;
//! - state-machine safety: no two different entries applied at one index;
//! - durability: every confirmed append is durable on a majority, forever;
//! - no node's durable commit index ever decreases;
//! - persisted before sent: a granted vote is durable before the grant
//!   leaves its node, and an acknowledgement claims only durable entries.
//! - acknowledged survives recovery (production glue): what the device
//!   synced is in what the real recovery returns, or reported for repair;
//!   the log reopens at all, and a snapshot from the leader is installed
//!   only once what was queued before it is synced;
//! - state machines equal (ledger and queue workloads): every node's
//!   machine has the same snapshot bytes at the same applied index, whether
//!   it applied each entry or resumed from a snapshot.
//! - append applied once and confirmed append at its index (log clients,
//!   `append_check`);
//! - stepped down holds no request (production glue): a replica that does
//!   not lead has answered every client request it took as leader, in
//!   the turn it stopped leading.
//!
//! Prefixes are compared by chain hash (see `trace::chain`), so each check
//! is one comparison, not a log walk.

use super::disk::Durable;
use super::trace::chain;
use crate::consensus::{AppendResult, Body, Index, Message, NodeId, Raft, Term};
use std::collections::HashMap;

/// A broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What exactly was seen.
    pub detail: String,
}

fn fail(invariant: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { invariant, detail })
}

/// Names of the invariants the ledger and queue workloads add, for
/// reports (see `ledger_check` and `queue_check`).
pub const WORKLOAD_INVARIANTS: [&str; 10] = [
    "state-machines-equal",
    "stored-bytes-readable",
    "stored-bytes-agree",
    "fenced-writer-not-confirmed",
    "lac-monotonic",
    "ledger-linearizable",
    "linearizability-search-bound",
    "acked-not-redelivered",
    "confirmed-produce-delivered",
    "produce-not-duplicated",
];

/// Names of the invariants, for reports (then three of the production
/// glue's log checks, against the device, and the log clients' two dedup
/// checks, `append_check`).
pub const INVARIANTS: [&str; 14] = [
    "persisted-before-sent",
    "election-safety",
    "log-matching",
    "leader-completeness",
    "state-machine-safety",
    "confirmed-durable-on-majority",
    "durable-commit-monotonic",
    "liveness-after-heal",
    "acknowledged-survives-recovery",
    "log-reopens",
    "snapshot-installed-after-sync",
    "append-applied-once",
    "confirmed-append-at-its-index",
    "stepped-down-holds-no-request",
];

pub(crate) struct Checker {
    quorum: usize,
    leaders: HashMap<(usize, Term), NodeId>,
    /// Per group: the highest term a leader was seen in.
    newest_leader_term: Vec<Term>,
    /// Per group, per committed index (from 1): the newest leader term
    /// seen when the index was first known committed. The commit happened
    /// in that term or an earlier one, so every leader of a later term
    /// must hold it (leader completeness covers later terms only).
    committed_by_term: Vec<Vec<Term>>,
    /// Per group: chain hash of the committed prefix at each index (from 1).
    committed: Vec<Vec<u64>>,
    /// Chain hash of every durable (group, index, term) seen anywhere.
    durable_entries: HashMap<(usize, Index, Term), u64>,
    /// Per group: the highest confirmed index and its chain hash.
    max_confirmed: Vec<Option<(Index, u64)>>,
    /// Hash of the state machine's snapshot at each (group, applied index).
    machines: HashMap<(usize, Index), u64>,
    /// The log clients' dedup and answer checks.
    pub(crate) appends: super::append_check::AppendCheck,
    /// Invariant checks performed.
    pub(crate) checks: u64,
}

impl Checker {
    pub(crate) fn new(groups: usize, nodes: usize) -> Self {
        Checker {
            quorum: nodes / 2 + 1,
            leaders: HashMap::new(),
            newest_leader_term: vec![0; groups],
            committed_by_term: vec![Vec::new(); groups],
            committed: vec![Vec::new(); groups],
            durable_entries: HashMap::new(),
            max_confirmed: vec![None; groups],
            machines: HashMap::new(),
            appends: Default::default(),
            checks: 0,
        }
    }

    /// Chain hash of the prefix of `group` applied up to `index`, if some
    /// node applied that entry itself (0: the empty prefix).
    pub(crate) fn chain_at(&self, group: usize, index: Index) -> Option<u64> {
        if index == 0 {
            return Some(0);
        }
        let h = *self.committed[group].get(index as usize - 1)?;
        (h != 0).then_some(h)
    }

    /// Highest committed index seen in `group`.
    pub(crate) fn committed_len(&self, group: usize) -> u64 {
        self.committed[group].len() as u64
    }

    /// Election safety: `node` leads `group` in `term`.
    pub(crate) fn leader(
        &mut self,
        group: usize,
        term: Term,
        node: NodeId,
    ) -> Result<(), Violation> {
        self.checks += 1;
        let newest = &mut self.newest_leader_term[group];
        *newest = (*newest).max(term);
        match self.leaders.insert((group, term), node) {
            Some(other) if other != node => fail(
                "election-safety",
                format!("group {group} term {term} has two leaders: n{other} and n{node}"),
            ),
            _ => Ok(()),
        }
    }

    /// Leader completeness: a new leader's log contains every entry
    /// committed in an earlier term (thesis §3.6.3 property 4). Checked
    /// against the committed prefix known while every leader seen was of
    /// an older term: a leader of an older term than one seen already
    /// (its votes came late, after a newer term's leader committed) may
    /// lack what the newer term committed, and cannot commit anything
    /// itself, since a majority has moved on (ledger seed 449, 3 nodes);
    /// it must still hold what was committed before it.
    pub(crate) fn leader_complete(&mut self, group: usize, raft: &Raft) -> Result<(), Violation> {
        self.checks += 1;
        let c = self.committed_by_term[group].partition_point(|&t| t < raft.term()) as u64;
        if c == 0 {
            return Ok(());
        }
        let s = raft.first_index() - 1;
        let all = self.committed_len(group);
        if s > all {
            return fail(
                "leader-completeness",
                format!(
                    "group {group}: n{} has a snapshot at {s} beyond the commit {all}",
                    raft.id()
                ),
            );
        }
        if s >= c {
            return Ok(()); // what it must hold is inside its snapshot
        }
        // The chain at the snapshot as the cluster applied it (none known
        // there: nothing to compare the rest against).
        let Some(mut h) = self.chain_at(group, s) else {
            return Ok(());
        };
        for e in raft.entries_from(s + 1) {
            if e.index > c {
                break;
            }
            h = chain(h, e);
        }
        let expected = self.committed[group][(c - 1) as usize];
        if raft.last_index() < c || h != expected {
            return fail(
                "leader-completeness",
                format!(
                    "group {group}: new leader n{} of term {} lacks committed entries up to {c} (last index {})",
                    raft.id(),
                    raft.term(),
                    raft.last_index()
                ),
            );
        }
        Ok(())
    }

    /// State-machine safety: `node` applied the prefix ending at `index`
    /// with chain hash `h`.
    pub(crate) fn applied(
        &mut self,
        group: usize,
        node: NodeId,
        index: Index,
        h: u64,
    ) -> Result<(), Violation> {
        self.checks += 1;
        let c = &mut self.committed[group];
        let pos = (index - 1) as usize;
        if pos < c.len() {
            if c[pos] != 0 && c[pos] != h {
                return fail(
                    "state-machine-safety",
                    format!("group {group}: n{node} applied a different entry at index {index} than another node"),
                );
            }
            c[pos] = h;
        } else {
            // 0 marks an index nobody has applied individually (covered by a
            // snapshot only); the chain hash at the end still pins it.
            c.resize(pos, 0);
            c.push(h);
            let newest = self.newest_leader_term[group];
            self.committed_by_term[group].resize(pos + 1, newest);
        }
        Ok(())
    }

    /// State-machine equality: `node`'s machine hashes to `h` after
    /// applying up to `index`; every node must agree, whether it applied
    /// each entry or resumed from a snapshot.
    pub(crate) fn machine_state(
        &mut self,
        group: usize,
        node: NodeId,
        index: Index,
        h: u64,
    ) -> Result<(), Violation> {
        self.checks += 1;
        match self.machines.insert((group, index), h) {
            Some(other) if other != h => fail(
                "state-machines-equal",
                format!("group {group}: n{node}'s state machine at applied index {index} differs from another node's"),
            ),
            _ => Ok(()),
        }
    }

    /// Log matching: an entry became durable on some node with this prefix.
    pub(crate) fn durable_entry(
        &mut self,
        group: usize,
        node: NodeId,
        index: Index,
        term: Term,
        prefix: u64,
    ) -> Result<(), Violation> {
        self.checks += 1;
        match self.durable_entries.insert((group, index, term), prefix) {
            Some(p) if p != prefix => fail(
                "log-matching",
                format!("group {group}: n{node} holds index {index} term {term} after a prefix that differs from another node's"),
            ),
            _ => Ok(()),
        }
    }

    /// A durable commit index changed on one node.
    pub(crate) fn durable_commit(
        &mut self,
        group: usize,
        node: NodeId,
        before: Index,
        after: Index,
    ) -> Result<(), Violation> {
        self.checks += 1;
        if after < before {
            return fail(
                "durable-commit-monotonic",
                format!("group {group}: n{node}'s durable commit went from {before} to {after}"),
            );
        }
        Ok(())
    }

    /// Persisted before sent: `msg` is leaving `durable`'s node.
    pub(crate) fn leaving(
        &mut self,
        group: usize,
        msg: &Message,
        durable: &Durable,
    ) -> Result<(), Violation> {
        match msg.body {
            Body::VoteResponse { granted: true } => {
                self.checks += 1;
                let hs = durable.hard_state;
                let recorded =
                    hs.term > msg.term || (hs.term == msg.term && hs.vote == Some(msg.to));
                if !recorded {
                    return fail(
                        "persisted-before-sent",
                        format!(
                            "group {group}: n{} granted its vote in term {} to n{} but its durable hard state says term {} vote {:?}",
                            msg.from, msg.term, msg.to, hs.term, hs.vote
                        ),
                    );
                }
            }
            Body::AppendResponse(AppendResult::Accepted { match_index }) => {
                self.checks += 1;
                if durable.prefix_at(match_index).is_none() {
                    return fail(
                        "persisted-before-sent",
                        format!(
                            "group {group}: n{} acknowledged index {match_index} before it was durable",
                            msg.from
                        ),
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A client was told `index` (chain hash `h`) is confirmed.
    pub(crate) fn confirmed(
        &mut self,
        group: usize,
        index: Index,
        h: u64,
        disks: &[&Durable],
    ) -> Result<(), Violation> {
        if self.max_confirmed[group].is_none_or(|(i, _)| index > i) {
            self.max_confirmed[group] = Some((index, h));
        }
        self.confirmed_still_durable(group, disks)
    }

    /// Durability: the highest confirmed index is durable on a majority.
    /// The chain hash makes that cover every lower confirmed index too.
    pub(crate) fn confirmed_still_durable(
        &mut self,
        group: usize,
        disks: &[&Durable],
    ) -> Result<(), Violation> {
        self.checks += 1;
        let Some((index, h)) = self.max_confirmed[group] else {
            return Ok(());
        };
        let holders = disks
            .iter()
            .filter(|d| match d.prefix_at(index) {
                Some(None) => true, // inside the snapshot
                Some(Some(p)) => p == h,
                None => false,
            })
            .count();
        if holders < self.quorum {
            return fail(
                "confirmed-durable-on-majority",
                format!(
                    "group {group}: confirmed index {index} is durable on {holders} nodes, fewer than a majority ({})",
                    self.quorum
                ),
            );
        }
        Ok(())
    }
}
