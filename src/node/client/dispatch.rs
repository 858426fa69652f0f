//! Client requests as node calls, pure: what a wire `Request` asks of the
//! node's loops (a [`NodeCall`], decoded and bounded) or the answer it
//! gets at once without them (a group this node does not run, an empty
//! batch, a command or query that does not decode), and the protocol's
//! answer for each outcome the loops report, `ProposeError`s included.
//!
//! No I/O, no threads, no handle: the client server carries the calls out
//! on a `NodeHandle` and writes the answers to sockets; a simulated node
//! can carry them out on its replicas and answer byte for byte as the
//! daemon does. What is bounded here (a read's entries, a long poll's
//! wait) is the same for both; what bounds a process's threads and
//! sockets (the number of waiting long polls, connections) is the
//! server's.

use crate::api::{Entry, ErrorCode, LeaderInfo, Request, Response};
use crate::consensus::{Index, NodeId, Term};
use crate::node::command::ProposeError;
use crate::node::status::NodeStatus;
use crate::transport::GroupId;
use std::collections::BTreeMap;

// A consume's answer (its messages, and per message an id, a delivery
// count and a length: 16 bytes, 64 counted) always fits a client frame,
// or a consume that applied could never be answered.
const _: () = assert!(
    crate::state::queue::CONSUME_BYTES_MAX as usize
        + crate::state::queue::CONSUME_MAX as usize * 64
        + 4096
        <= crate::api::wire::FRAME_BYTES_MAX
);

// A ledger read's answer (its entries' bytes, and per entry an id and a
// length, 64 counted) always fits a client frame, or a ledger holding
// more than a frame's worth of entries could not be read at all.
const _: () = assert!(
    crate::state::ledger::READ_BYTES_MAX as usize
        + crate::state::ledger::READ_ENTRIES_MAX * 64
        + 4096
        <= crate::api::wire::FRAME_BYTES_MAX
);

/// Longest a Tail or a ledger long poll waits for entries, in ms.
pub const TAIL_WAIT_MS_MAX: u32 = 30_000;
/// Log entries in one Read or Tail answer at most.
pub const READ_ENTRIES_MAX: usize = 4096;

/// What a client request asks of the node's loops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeCall {
    /// Append `data` to `group`'s log as client `client_id`'s request `seq`.
    Append {
        /// The group.
        group: GroupId,
        /// The client (0: not deduplicated).
        client_id: u64,
        /// The client's sequence number for it.
        seq: u64,
        /// The record (a slice of the request's frame).
        data: bytes::Bytes,
    },
    /// Append each of `items` (never empty) as requests `first_seq`,
    /// `first_seq + 1`, ...; answered once, when every one is.
    AppendBatch {
        /// The group.
        group: GroupId,
        /// The client (0: not deduplicated).
        client_id: u64,
        /// The sequence number of the first item.
        first_seq: u64,
        /// The records, at least one (slices of the request's frame).
        items: Vec<bytes::Bytes>,
    },
    /// Committed log entries from `from` on; finding none, wait up to
    /// `wait_ms` for one (a `Tail`; a `Read` does not wait).
    Read {
        /// The group.
        group: GroupId,
        /// The first index wanted.
        from: Index,
        /// Entries at most, within `1..=READ_ENTRIES_MAX`.
        max_entries: usize,
        /// About this many data bytes at most (a `Tail`: no bound but
        /// the entry count).
        max_bytes: usize,
        /// How long to wait, within `TAIL_WAIT_MS_MAX`; 0 for a `Read`.
        wait_ms: u32,
        /// This node's applied log, leader or not, rather than a
        /// read-index round on the leader.
        stale: bool,
        /// A `Tail`: a long poll, even when `wait_ms` is 0.
        tail: bool,
    },
    /// A ledger or queue command, as client `client_id`'s request `seq`.
    State {
        /// The group.
        group: GroupId,
        /// The client (0: the command deduplicates itself).
        client_id: u64,
        /// The client's sequence number for it.
        seq: u64,
        /// The decoded command.
        command: crate::state::Command,
        /// Its encoding as the request carried it (the one decoding gives
        /// `command`), proposed as it is unless the leader stamps it.
        encoded: Vec<u8>,
    },
    /// A query on the leader; a ledger read waits up to `wait_ms` (a long
    /// poll when it is not 0, within `TAIL_WAIT_MS_MAX`).
    Query {
        /// The group.
        group: GroupId,
        /// The decoded query.
        query: crate::state::Query,
        /// How long a ledger read finding nothing past the LAC waits; 0
        /// for every other query.
        wait_ms: u32,
    },
    /// The leader of every group, as this node sees it.
    Leaders,
    /// This node's status.
    Status,
}

impl NodeCall {
    /// Whether the call may wait on the group's loop for entries to come:
    /// the caller bounds how many such calls wait at once.
    pub fn long_poll(&self) -> bool {
        match self {
            NodeCall::Read { tail, .. } => *tail,
            NodeCall::Query { wait_ms, .. } => *wait_ms > 0,
            _ => false,
        }
    }

    /// Whether its answer is a few dozen bytes whatever the state holds:
    /// a ledger or queue command other than a consume (whose answer
    /// carries messages, up to a frame), so a connection may keep many in
    /// flight (`conn::CONN_CALLS_IN_FLIGHT_MAX` bounds the others).
    pub fn answer_is_small(&self) -> bool {
        matches!(self, NodeCall::State { command, .. }
            if !matches!(command, crate::state::Command::Consume { .. }))
    }
}

/// What to do with one client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Carry this call out on the node, then answer with its outcome.
    Call(NodeCall),
    /// Answer at once with this; the node is not asked.
    Answer(Response),
    /// Nothing: a Hello, which the session answers itself.
    Nothing,
}

/// What request `req` asks of a node that runs the groups `runs` says
/// yes to.
pub fn translate(req: Request, runs: impl Fn(GroupId) -> bool) -> Dispatch {
    if let Some(group) = request_group(&req) {
        if !runs(group) {
            return Dispatch::Answer(refusal(
                ErrorCode::UnknownGroup,
                format!("group {group} is not on this node"),
            ));
        }
    }
    let call = match req {
        Request::Append {
            group,
            client_id,
            seq,
            data,
        } => NodeCall::Append {
            group,
            client_id,
            seq,
            data,
        },
        Request::AppendBatch { items, .. } if items.is_empty() => {
            return Dispatch::Answer(refusal(ErrorCode::BadRequest, "an empty batch".into()))
        }
        Request::AppendBatch {
            group,
            client_id,
            first_seq,
            items,
        } => NodeCall::AppendBatch {
            group,
            client_id,
            first_seq,
            items,
        },
        Request::Read {
            group,
            from,
            max_entries,
            max_bytes,
            stale,
        } => NodeCall::Read {
            group,
            from,
            max_entries: (max_entries as usize).clamp(1, READ_ENTRIES_MAX),
            max_bytes: max_bytes as usize,
            wait_ms: 0,
            stale,
            tail: false,
        },
        Request::Tail {
            group,
            from,
            wait_ms,
            stale,
        } => NodeCall::Read {
            group,
            from,
            max_entries: READ_ENTRIES_MAX,
            max_bytes: usize::MAX,
            wait_ms: wait_ms.min(TAIL_WAIT_MS_MAX),
            stale,
            tail: true,
        },
        Request::Leaders => NodeCall::Leaders,
        Request::Status => NodeCall::Status,
        Request::Command {
            group,
            client_id,
            seq,
            command,
        } => {
            let Some(decoded) = crate::state::Command::decode(&command) else {
                return Dispatch::Answer(bad_request("the command does not decode"));
            };
            NodeCall::State {
                group,
                client_id,
                seq,
                command: decoded,
                encoded: command,
            }
        }
        Request::Query {
            group,
            wait_ms,
            query,
        } => {
            let Some(query) = crate::state::Query::decode(&query) else {
                return Dispatch::Answer(bad_request("the query does not decode"));
            };
            // Only a ledger read has anything to wait for.
            let waits = matches!(query, crate::state::Query::ReadLedger { .. });
            let wait_ms = if waits {
                wait_ms.min(TAIL_WAIT_MS_MAX)
            } else {
                0
            };
            NodeCall::Query {
                group,
                query,
                wait_ms,
            }
        }
        Request::Hello { .. } => return Dispatch::Nothing,
    };
    Dispatch::Call(call)
}

/// The group a request is for, if it is for one.
fn request_group(req: &Request) -> Option<GroupId> {
    match req {
        Request::Append { group, .. }
        | Request::AppendBatch { group, .. }
        | Request::Read { group, .. }
        | Request::Tail { group, .. }
        | Request::Command { group, .. }
        | Request::Query { group, .. } => Some(*group),
        _ => None,
    }
}

/// The protocol's answer for a node error; `addrs` maps node ids to their
/// client addresses, for the leader a `NotLeader` names.
pub fn error_response(e: ProposeError, addrs: &BTreeMap<NodeId, String>) -> Response {
    let (code, leader) = match &e {
        // A leader that stepped down sends its clients on at once: the
        // retry carries the same (client, seq), so it applies once.
        ProposeError::NotLeader(l) | ProposeError::SteppedDown(l) => (
            ErrorCode::NotLeader,
            l.map(|l| (l, addrs.get(&l).cloned().unwrap_or_default())),
        ),
        ProposeError::DiskFull => (ErrorCode::DiskFull, None),
        ProposeError::Timeout => (ErrorCode::Timeout, None),
        // Another node may serve it, or the outcome is unknown: the
        // client retries (the same seq, so nothing applies twice).
        ProposeError::Lost
        | ProposeError::LogStopped(_)
        | ProposeError::Stopping
        | ProposeError::Compacted { .. }
        | ProposeError::Unreadable(_)
        | ProposeError::Internal(_) => (ErrorCode::Unavailable, None),
        ProposeError::UnknownGroup(_) => (ErrorCode::UnknownGroup, None),
        // Permanent: the same seq is refused again, wherever it is sent.
        ProposeError::SeqForgotten { .. } => (ErrorCode::Conflict, None),
        ProposeError::Refused(r) => (refusal_code(*r), None),
        ProposeError::TooLarge { .. } => (ErrorCode::TooLarge, None),
        ProposeError::Conflict { .. } => (ErrorCode::Conflict, None),
        // Only membership changes give these, and clients cannot ask one.
        ProposeError::Invalid(_) => (ErrorCode::BadRequest, None),
        ProposeError::Busy(_) | ProposeError::Lagging(_) => (ErrorCode::Unavailable, None),
    };
    Response::Error {
        code,
        message: e.to_string(),
        leader,
    }
}

/// The protocol's code for a state-machine refusal.
pub fn refusal_code(e: crate::state::Error) -> ErrorCode {
    use crate::state::Error as E;
    match e {
        E::Fenced => ErrorCode::Fenced,
        E::NoSuchLedger | E::NoSuchQueue => ErrorCode::NotFound,
        E::NotWriter
        | E::Closed
        | E::LacBeyondEnd
        | E::QueueExists
        | E::Forgotten
        | E::Conflict => ErrorCode::Conflict,
        E::Limit(_) => ErrorCode::TooLarge,
        E::Invalid => ErrorCode::BadRequest,
        E::AlreadyApplied => ErrorCode::Internal,
    }
}

/// The answer to a long poll refused because as many as the node allows
/// wait already.
pub fn long_polls_full(addrs: &BTreeMap<NodeId, String>) -> Response {
    error_response(
        ProposeError::Busy("too many long polls waiting".into()),
        addrs,
    )
}

/// The answer to an `Append`.
pub fn appended_response(
    r: Result<Index, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    or_error(r, addrs, |index| Response::Appended { index })
}

/// The outcomes of an `AppendBatch`'s appends, gathered as the loop
/// reports them (in any order) until the last one makes the answer.
#[derive(Debug)]
pub struct BatchOutcomes {
    /// The outcomes so far, in the order they came.
    results: Vec<Result<Index, ProposeError>>,
    /// Outcomes still to come.
    left: usize,
}

impl BatchOutcomes {
    /// Waiting for the outcomes of `count` appends.
    pub fn new(count: usize) -> BatchOutcomes {
        BatchOutcomes {
            results: Vec::with_capacity(count),
            left: count,
        }
    }

    /// One append's outcome `r`; the batch's answer once it is the last:
    /// the lowest index and the count if every append succeeded, else the
    /// first error that came.
    pub fn add(
        &mut self,
        r: Result<Index, ProposeError>,
        addrs: &BTreeMap<NodeId, String>,
    ) -> Option<Response> {
        self.results.push(r);
        self.left = self
            .left
            .checked_sub(1)
            .expect("more outcomes than appends");
        if self.left > 0 {
            return None;
        }
        let results = std::mem::take(&mut self.results);
        Some(match results.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(indexes) => Response::AppendedBatch {
                first_index: indexes.iter().copied().min().unwrap_or(0),
                count: indexes.len() as u32,
            },
            Err(e) => error_response(e, addrs),
        })
    }
}

/// The answer to a `Read` or a `Tail`.
pub fn entries_response(
    r: Result<Vec<(Index, Term, bytes::Bytes)>, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    or_error(r, addrs, |v| Response::Entries {
        entries: v
            .into_iter()
            .map(|(index, term, data)| Entry { index, term, data })
            .collect(),
    })
}

/// The answer to a `Command`.
pub fn outcome_response(
    r: Result<crate::state::Outcome, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    or_error(r, addrs, |o| Response::Outcome {
        outcome: o.encode(),
    })
}

/// The answer to a `Query`.
pub fn answer_response(
    r: Result<crate::state::Answer, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    or_error(r, addrs, |a| Response::Answer { answer: a.encode() })
}

/// The answer to `Leaders` from the node's status (`None`: the node is
/// stopping).
pub fn leaders_response(status: Option<&NodeStatus>, addrs: &BTreeMap<NodeId, String>) -> Response {
    match status {
        Some(s) => Response::LeaderMap {
            groups: s
                .groups
                .iter()
                .map(|g| LeaderInfo {
                    group: g.group,
                    leader: g.leader.unwrap_or(0),
                    addr: g
                        .leader
                        .and_then(|l| addrs.get(&l).cloned())
                        .unwrap_or_default(),
                })
                .collect(),
        },
        None => error_response(ProposeError::Stopping, addrs),
    }
}

/// `ok`'s answer for a success, `error_response`'s for a failure.
fn or_error<T>(
    r: Result<T, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
    ok: impl FnOnce(T) -> Response,
) -> Response {
    r.map_or_else(|e| error_response(e, addrs), ok)
}

/// An error answer with no leader to name.
fn refusal(code: ErrorCode, message: String) -> Response {
    Response::Error {
        code,
        message,
        leader: None,
    }
}

fn bad_request(message: &str) -> Response {
    refusal(ErrorCode::BadRequest, message.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Query;

    fn addrs() -> BTreeMap<NodeId, String> {
        BTreeMap::from([(2, "10.0.0.2:7000".to_string())])
    }

    /// A node that runs group 0 only.
    fn on_group_0(req: Request) -> Dispatch {
        translate(req, |g| g == 0)
    }

    fn refused_with(d: &Dispatch) -> ErrorCode {
        match d {
            Dispatch::Answer(Response::Error { code, .. }) => *code,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[test]
    fn a_group_the_node_does_not_run_is_refused_before_anything_else() {
        let req = Request::AppendBatch {
            group: 5,
            client_id: 1,
            first_seq: 1,
            items: vec![], // empty too: the group is checked first
        };
        assert_eq!(refused_with(&on_group_0(req)), ErrorCode::UnknownGroup);
    }

    #[test]
    fn requests_that_cannot_be_served_are_answered_at_once() {
        let empty = Request::AppendBatch {
            group: 0,
            client_id: 1,
            first_seq: 1,
            items: vec![],
        };
        assert_eq!(refused_with(&on_group_0(empty)), ErrorCode::BadRequest);
        let garbled = Request::Command {
            group: 0,
            client_id: 1,
            seq: 1,
            command: vec![0xff; 3],
        };
        assert_eq!(refused_with(&on_group_0(garbled)), ErrorCode::BadRequest);
        let hello = Request::Hello {
            version: 1,
            token: vec![],
        };
        assert_eq!(on_group_0(hello), Dispatch::Nothing);
    }

    #[test]
    fn reads_and_waits_are_bounded() {
        let read = Request::Read {
            group: 0,
            from: 3,
            max_entries: 0,
            max_bytes: 100,
            stale: true,
        };
        let Dispatch::Call(call) = on_group_0(read) else {
            panic!("not a call")
        };
        assert!(!call.long_poll());
        assert!(matches!(
            call,
            NodeCall::Read {
                max_entries: 1,
                max_bytes: 100,
                wait_ms: 0,
                stale: true,
                tail: false,
                ..
            }
        ));
        let tail = Request::Tail {
            group: 0,
            from: 3,
            wait_ms: u32::MAX,
            stale: false,
        };
        assert_eq!(
            on_group_0(tail),
            Dispatch::Call(NodeCall::Read {
                group: 0,
                from: 3,
                max_entries: READ_ENTRIES_MAX,
                max_bytes: usize::MAX,
                wait_ms: TAIL_WAIT_MS_MAX,
                stale: false,
                tail: true,
            })
        );
        // A tail is a long poll even when it does not wait.
        let now = Request::Tail {
            group: 0,
            from: 3,
            wait_ms: 0,
            stale: false,
        };
        let Dispatch::Call(call) = on_group_0(now) else {
            panic!("not a call")
        };
        assert!(call.long_poll());
    }

    #[test]
    fn only_a_ledger_read_waits() {
        let query = |query: &Query, wait_ms| Request::Query {
            group: 0,
            wait_ms,
            query: query.encode(),
        };
        let read = Query::ReadLedger {
            ledger: 1,
            from: 0,
            to: 9,
        };
        let Dispatch::Call(call) = on_group_0(query(&read, 90_000)) else {
            panic!("not a call")
        };
        assert!(call.long_poll());
        assert!(matches!(
            call,
            NodeCall::Query {
                wait_ms: TAIL_WAIT_MS_MAX,
                ..
            }
        ));
        let Dispatch::Call(call) = on_group_0(query(&Query::ListLedgers, 500)) else {
            panic!("not a call")
        };
        assert!(!call.long_poll());
        assert!(matches!(call, NodeCall::Query { wait_ms: 0, .. }));
    }

    #[test]
    fn not_leader_names_the_leaders_client_address() {
        let r = error_response(ProposeError::NotLeader(Some(2)), &addrs());
        let Response::Error { code, leader, .. } = r else {
            panic!("not an error")
        };
        assert_eq!(code, ErrorCode::NotLeader);
        assert_eq!(leader, Some((2, "10.0.0.2:7000".to_string())));
        // Retryable node errors are Unavailable; a forgotten seq is not.
        let code = |e| match error_response(e, &addrs()) {
            Response::Error { code, .. } => code,
            other => panic!("not an error: {other:?}"),
        };
        assert_eq!(code(ProposeError::Lost), ErrorCode::Unavailable);
        // A leader that stepped down redirects, naming the new one.
        let r = error_response(ProposeError::SteppedDown(Some(2)), &addrs());
        assert!(
            matches!(&r, Response::Error { code: ErrorCode::NotLeader, leader: Some((2, a)), .. } if a == "10.0.0.2:7000"),
            "{r:?}"
        );
        assert_eq!(code(ProposeError::SteppedDown(None)), ErrorCode::NotLeader);
        assert_eq!(
            code(ProposeError::SeqForgotten {
                client_id: 1,
                seq: 1
            }),
            ErrorCode::Conflict
        );
        assert_eq!(
            code(ProposeError::Refused(crate::state::Error::Fenced)),
            ErrorCode::Fenced
        );
    }

    #[test]
    fn a_batch_answers_once_its_last_append_does() {
        let mut b = BatchOutcomes::new(3);
        assert_eq!(b.add(Ok(12), &addrs()), None);
        assert_eq!(b.add(Ok(10), &addrs()), None);
        assert_eq!(
            b.add(Ok(11), &addrs()),
            Some(Response::AppendedBatch {
                first_index: 10,
                count: 3
            })
        );
        let mut b = BatchOutcomes::new(2);
        assert_eq!(b.add(Err(ProposeError::DiskFull), &addrs()), None);
        let Some(Response::Error { code, .. }) = b.add(Ok(4), &addrs()) else {
            panic!("the batch did not fail")
        };
        assert_eq!(code, ErrorCode::DiskFull);
    }
}
