//! The retry policy of one logical client call, sans-IO: which address to
//! try next, what each answer means (a redirect, a transient refusal, a
//! permanent one, a lost connection), when to back off and when to give
//! up. A call goes to a group's leader ([`Attempts::new`]) or, for a stale
//! read, to whichever node answers first ([`Attempts::any_node`]). It does no I/O, reads no clock and draws no
//! random number: the caller passes the time in, carries out each
//! [`Verdict`] (sends, sleeps) and reports each answer back. The blocking
//! [`Client`](super::Client) drives it with sockets and `thread::sleep`; a
//! simulated client can drive it with its own network and clock, and gets
//! the same policy.
//!
//! An [`Attempts`] owns the request of its call, built once: every retry
//! sends those very bytes, so an append or a command carries the same
//! (client id, seq) on every node it tries, and the node's dedup table
//! applies it once.
//!
//! The verbs, in the order a caller uses them: [`Attempts::new`] when the
//! call starts; [`Attempts::next`] for the first verdict and after waiting
//! out a [`Verdict::RetryAfter`]; [`Attempts::answered`] when the node it
//! was told to try answers (or the exchange fails). The call is over at
//! [`Verdict::Done`] or [`Verdict::Fail`].

use super::ClientError;
use crate::api::{ErrorCode, Request, Response};
use crate::consensus::NodeId;
use std::collections::BTreeMap;

/// How long to wait before the next try when no node can serve now (an
/// election is on, the leader is busy or its disk is full): long enough
/// not to spin on a node that says no, short next to an election.
pub const BACKOFF_MS: u64 = 20;

/// Why one exchange with one node failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The connection could not be made or broke: retry, here or on
    /// another node.
    Lost(String),
    /// The node refused the connection for a reason every node shares
    /// (the token is cluster-wide, so is the protocol version): retrying
    /// anywhere would only repeat it.
    Fatal(ErrorCode, String),
}

impl CallError {
    /// A connection-level refusal with `code`: fatal if no retry can help.
    pub fn refused(code: ErrorCode, message: String) -> CallError {
        match code {
            ErrorCode::Unauthorized | ErrorCode::UnsupportedVersion => {
                CallError::Fatal(code, message)
            }
            _ => CallError::Lost(format!("{code}: {message}")),
        }
    }
}

impl From<CallError> for ClientError {
    fn from(e: CallError) -> ClientError {
        match e {
            CallError::Lost(why) => ClientError::Unavailable(why),
            CallError::Fatal(code, why) => ClientError::Refused(code, why),
        }
    }
}

/// What a client knows of the cluster between calls: the node id behind
/// each address (learned from its HelloOk) and the leader of each group
/// (learned from answers and redirects).
#[derive(Clone, Debug)]
pub struct Leaders {
    /// How many addresses the client has (they are `0..addrs`).
    addrs: usize,
    /// Node id of each address, once known.
    nodes: BTreeMap<usize, NodeId>,
    /// The leader of each group, as last heard.
    groups: BTreeMap<u32, NodeId>,
}

impl Leaders {
    /// Nothing known yet of a cluster reached at `addrs` addresses.
    pub fn new(addrs: usize) -> Leaders {
        Leaders {
            addrs,
            nodes: BTreeMap::new(),
            groups: BTreeMap::new(),
        }
    }

    /// Address `addr` answered Hello as node `node`.
    pub fn connected(&mut self, addr: usize, node: NodeId) {
        self.nodes.insert(addr, node);
    }

    /// The node id behind address `addr`, once known.
    pub fn node_at(&self, addr: usize) -> Option<NodeId> {
        self.nodes.get(&addr).copied()
    }

    /// The leader of `group`, as last heard.
    pub fn leader(&self, group: u32) -> Option<NodeId> {
        self.groups.get(&group).copied()
    }

    /// Where try number `attempt` (from 0) of a call to `group` goes: its
    /// known leader on every other try, when the leader's address is
    /// known, and each address in turn otherwise, so a stale leader
    /// costs at most one try in two.
    pub fn pick(&self, group: u32, attempt: usize) -> usize {
        let leader = self
            .leader(group)
            .and_then(|l| self.nodes.iter().find(|(_, n)| **n == l).map(|(i, _)| *i));
        match leader {
            Some(i) if attempt % 2 == 0 => i,
            // The other tries go round every address in turn, from the
            // one after the first (counting only those tries: `attempt %
            // addrs` would skip half the addresses when there is an even
            // number of them).
            Some(_) => (attempt / 2 + 1) % self.addrs,
            None => attempt % self.addrs,
        }
    }

    /// `node` leads `group` (it said so, or it served a leader's request).
    pub(crate) fn lead(&mut self, group: u32, node: NodeId) {
        self.groups.insert(group, node);
    }

    /// Who leads `group` is unknown again (an election, a lost node).
    pub(crate) fn forget(&mut self, group: u32) {
        self.groups.remove(&group);
    }
}

/// What the caller of an [`Attempts`] does next.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send [`Attempts::request`] to the address of this index, then
    /// report its answer with [`Attempts::answered`].
    Send(usize),
    /// Wait this long, then ask [`Attempts::next`] again.
    RetryAfter {
        /// How long to wait, in ms.
        ms: u64,
    },
    /// The call succeeded with this answer.
    Done(Response),
    /// The call failed for good.
    Fail(ClientError),
}

/// Who may serve a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// The leader of this group.
    Leader(u32),
    /// Any node, tried in turn from the first address.
    AnyNode,
}

/// One logical call, across all its tries.
#[derive(Clone, Debug)]
pub struct Attempts {
    /// Who may serve the request.
    target: Target,
    /// The request, built once: every try sends it as it is.
    request: Request,
    /// Tries sent so far.
    sent: usize,
    /// When the call started, in the caller's ms.
    started_ms: u64,
    /// How long the call keeps trying.
    timeout_ms: u64,
    /// No try before this time (a backoff), in the caller's ms.
    not_before_ms: u64,
    /// Tries in a row whose connection failed (no answer at all): a whole
    /// round of them backs off, or a cluster that is down would be
    /// dialled in a busy loop until the deadline.
    lost_in_a_row: usize,
    /// Why the last try failed, for the error if none succeeds.
    last: String,
}

impl Attempts {
    /// A call of `request` to `group`'s leader, started at `now_ms`, that
    /// gives up `timeout_ms` later.
    pub fn new(group: u32, request: Request, now_ms: u64, timeout_ms: u64) -> Attempts {
        Attempts::to(Target::Leader(group), request, now_ms, timeout_ms)
    }

    /// A call of `request` that any node may serve (a stale read), each
    /// address tried in turn from the first, started at `now_ms`, that
    /// gives up `timeout_ms` later. It backs off only once every address
    /// in a round said it cannot serve now, and learns no leader.
    pub fn any_node(request: Request, now_ms: u64, timeout_ms: u64) -> Attempts {
        Attempts::to(Target::AnyNode, request, now_ms, timeout_ms)
    }

    fn to(target: Target, request: Request, now_ms: u64, timeout_ms: u64) -> Attempts {
        Attempts {
            target,
            request,
            sent: 0,
            started_ms: now_ms,
            timeout_ms,
            not_before_ms: now_ms,
            lost_in_a_row: 0,
            last: String::from("no node tried"),
        }
    }

    /// The request every try sends.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// How many tries were sent so far.
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// What to do at `now_ms`: call it first, and again once a
    /// [`Verdict::RetryAfter`] has been waited out. The deadline is
    /// checked before each try, never in the middle of one: a try sent
    /// just before it is still waited for.
    pub fn next(&mut self, now_ms: u64, leaders: &Leaders) -> Verdict {
        if now_ms.saturating_sub(self.started_ms) >= self.timeout_ms {
            return Verdict::Fail(ClientError::Unavailable(self.last.clone()));
        }
        if now_ms < self.not_before_ms {
            return Verdict::RetryAfter {
                ms: self.not_before_ms - now_ms,
            };
        }
        let addr = match self.target {
            Target::Leader(group) => leaders.pick(group, self.sent),
            Target::AnyNode => self.sent % leaders.addrs,
        };
        self.sent += 1;
        Verdict::Send(addr)
    }

    /// The try sent to address `addr` ended at `now_ms` with `r`: learns
    /// from it what `leaders` should know, and says what to do next.
    pub fn answered(
        &mut self,
        now_ms: u64,
        leaders: &mut Leaders,
        addr: usize,
        r: Result<Response, CallError>,
    ) -> Verdict {
        if r.is_ok() {
            self.lost_in_a_row = 0;
        }
        let Target::Leader(group) = self.target else {
            return self.answered_by_any(now_ms, leaders, addr, r);
        };
        match r {
            Ok(Response::Error {
                code: ErrorCode::NotLeader,
                leader,
                message,
            }) => {
                self.last = message;
                match leader {
                    // Straight to the leader it names, no wait.
                    Some((l, _)) => leaders.lead(group, l),
                    None => {
                        leaders.forget(group);
                        return self.back_off(now_ms); // an election is on
                    }
                }
            }
            Ok(Response::Error { code, message, .. })
                if matches!(
                    code,
                    ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::DiskFull
                ) =>
            {
                self.last = format!("{code}: {message}");
                return self.back_off(now_ms);
            }
            Ok(Response::Error { code, message, .. }) => {
                return Verdict::Fail(ClientError::Refused(code, message))
            }
            Ok(resp) => {
                if let Some(n) = leaders.node_at(addr) {
                    leaders.lead(group, n);
                }
                return Verdict::Done(resp);
            }
            Err(CallError::Fatal(code, message)) => {
                return Verdict::Fail(ClientError::Refused(code, message))
            }
            Err(CallError::Lost(e)) => {
                // The leader may be the node that went: ask around.
                self.last = e;
                leaders.forget(group);
                if self.lost_round(leaders) {
                    return self.back_off(now_ms);
                }
            }
        }
        self.next(now_ms, leaders)
    }

    /// `answered` for a call any node may serve: a node that cannot serve
    /// now passes it on to the next address, and only a whole round of
    /// them waits.
    fn answered_by_any(
        &mut self,
        now_ms: u64,
        leaders: &Leaders,
        addr: usize,
        r: Result<Response, CallError>,
    ) -> Verdict {
        match r {
            Ok(Response::Error { code, message, .. })
                if matches!(code, ErrorCode::Unavailable | ErrorCode::Timeout) =>
            {
                self.last = format!("{code}: {message}");
                if addr + 1 == leaders.addrs {
                    return self.back_off(now_ms); // every node said so
                }
            }
            Ok(Response::Error { code, message, .. }) | Err(CallError::Fatal(code, message)) => {
                return Verdict::Fail(ClientError::Refused(code, message))
            }
            Ok(resp) => return Verdict::Done(resp),
            Err(CallError::Lost(e)) => {
                self.last = e;
                if self.lost_round(leaders) {
                    return self.back_off(now_ms);
                }
            }
        }
        self.next(now_ms, leaders)
    }

    /// Counts a try whose connection failed; true when a whole round of
    /// addresses failed so in a row (the next try waits).
    fn lost_round(&mut self, leaders: &Leaders) -> bool {
        self.lost_in_a_row += 1;
        if self.lost_in_a_row >= leaders.addrs.max(1) {
            self.lost_in_a_row = 0;
            return true;
        }
        false
    }

    /// No try before `BACKOFF_MS` from `now_ms`. The wait comes before
    /// the deadline is looked at again, as a try does: a call whose time
    /// ran out during the wait fails when it ends.
    fn back_off(&mut self, now_ms: u64) -> Verdict {
        self.not_before_ms = now_ms.saturating_add(BACKOFF_MS);
        Verdict::RetryAfter { ms: BACKOFF_MS }
    }
}

#[cfg(test)]
mod tests;
