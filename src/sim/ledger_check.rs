//! The ledger workload's history checkers, run on the whole history once a
//! run has healed and recovered:
//!
//! - fencing: once an open-with-recovery of a ledger has completed, no add
//!   or LAC update by its writer invoked after that is confirmed;
//! - LAC monotonic: if one LAC answer (a read or a writer's `SetLac`)
//!   completed before another was invoked, the later one is not lower;
//! - linearizability: per ledger (ledgers are independent), the history is
//!   linearizable against the sequential [`StateMachine`] itself, whose
//!   answers are compared as a client hears them (a refusal by its
//!   protocol `ErrorCode`).

use super::checker::Violation;
use super::linearizability::{self, Interval, Verdict};
use super::workload::{StateOp, StateRequest, StateResult};
use crate::api::ErrorCode;
use crate::node::client::dispatch::refusal_code;
use crate::state::ledger::LedgerEntry;
use crate::state::{Command, Error as StateError, Outcome, StateMachine};
use std::collections::BTreeMap;
use std::hash::Hasher;

/// Operations a linearizability search may try per ledger before it gives
/// up (and fails the run, naming the seed).
pub const LINEARIZABILITY_STEPS_MAX: u64 = 2_000_000;

/// The ledger an operation is about, if it names one or created one.
fn ledger_of(op: &StateOp) -> Option<u64> {
    match (&op.request, &op.result) {
        (
            StateRequest::Command(Command::CreateLedger { .. }),
            StateResult::Applied(Ok(Outcome::LedgerCreated(l))),
        ) => Some(*l),
        // An unknown or failed create: nobody learned its id, so no other
        // operation names that ledger through it.
        (StateRequest::Command(Command::CreateLedger { .. }), _) => None,
        (StateRequest::Command(cmd), _) => match cmd {
            Command::AddEntry { ledger, .. }
            | Command::SetLac { ledger, .. }
            | Command::CloseLedger { ledger, .. }
            | Command::OpenRecover { ledger }
            | Command::DeleteLedger { ledger } => Some(*ledger),
            _ => None,
        },
        (StateRequest::ReadLac { ledger } | StateRequest::ReadEntries { ledger, .. }, _) => {
            Some(*ledger)
        }
    }
}

/// The history's operations per (group, ledger), in history order.
fn by_ledger(history: &[StateOp]) -> BTreeMap<(usize, u64), Vec<&StateOp>> {
    let mut parts: BTreeMap<(usize, u64), Vec<&StateOp>> = BTreeMap::new();
    for op in history {
        if let Some(l) = ledger_of(op) {
            parts.entry((op.group, l)).or_default().push(op);
        }
    }
    parts
}

/// Fencing: no add or LAC update invoked after a recovery of its ledger
/// completed is confirmed.
pub fn check_fencing(history: &[StateOp]) -> Result<(), Violation> {
    for ((g, l), ops) in by_ledger(history) {
        let fenced_at = ops
            .iter()
            .filter(|op| {
                matches!(
                    op.request,
                    StateRequest::Command(Command::OpenRecover { .. })
                ) && matches!(op.result, StateResult::Applied(Ok(_)))
            })
            .map(|op| op.completed_ms)
            .min();
        let Some(fenced_at) = fenced_at else {
            continue;
        };
        let late = ops.iter().find(|op| {
            matches!(
                op.request,
                StateRequest::Command(Command::AddEntry { .. } | Command::SetLac { .. })
            ) && matches!(op.result, StateResult::Applied(Ok(_)))
                && op.invoked_ms > fenced_at
        });
        if let Some(op) = late {
            return Err(Violation {
                invariant: "fenced-writer-not-confirmed",
                detail: format!(
                    "group {g} ledger {l}: recovered (fenced) at {fenced_at} ms, yet client {}'s {} invoked at {} ms was confirmed: {:?}",
                    op.client,
                    request_name(&op.request),
                    op.invoked_ms,
                    op.result
                ),
            });
        }
    }
    Ok(())
}

/// Adds in order: a writer's confirmed adds to one ledger have entry ids
/// in the order it sent them (the history holds one client's operations
/// in that order, a burst's too), however many it had in flight. A
/// linearizability check alone allows any order among adds in flight at
/// once; a pipelining writer is promised its own.
pub fn check_adds_in_order(history: &[StateOp]) -> Result<(), Violation> {
    let mut last: BTreeMap<(usize, usize, u64), u64> = BTreeMap::new();
    for op in history {
        let (
            StateRequest::Command(Command::AddEntry { ledger, .. }),
            StateResult::Applied(Ok(Outcome::EntryAdded(id))),
        ) = (&op.request, &op.result)
        else {
            continue;
        };
        let key = (op.group, op.client, *ledger);
        if let Some(&before) = last.get(&key) {
            if *id <= before {
                return Err(Violation {
                    invariant: "ledger-adds-in-order",
                    detail: format!(
                        "group {} ledger {ledger}: client {}'s add invoked at {} ms got entry {id}, after its earlier add got entry {before}",
                        op.group, op.client, op.invoked_ms
                    ),
                });
            }
        }
        last.insert(key, *id);
    }
    Ok(())
}

/// The LAC an answer reveals: `Some(None)` for "no entry confirmed yet".
fn lac_seen(op: &StateOp) -> Option<Option<u64>> {
    match (&op.request, &op.result) {
        (StateRequest::ReadLac { .. }, StateResult::Lac(Ok(lac))) => Some(*lac),
        (
            StateRequest::Command(Command::SetLac { .. }),
            StateResult::Applied(Ok(Outcome::Lac(l))),
        ) => Some(Some(*l)),
        _ => None,
    }
}

/// LAC monotonic: an answer invoked after another completed never shows
/// a lower LAC, whichever clients asked.
pub fn check_lac_monotonic(history: &[StateOp]) -> Result<(), Violation> {
    for ((g, l), ops) in by_ledger(history) {
        let mut seen: Vec<(&StateOp, Option<u64>)> = ops
            .iter()
            .filter_map(|op| lac_seen(op).map(|lac| (*op, lac)))
            .collect();
        let mut by_completion = seen.clone();
        by_completion.sort_by_key(|(op, _)| op.completed_ms);
        seen.sort_by_key(|(op, _)| op.invoked_ms);
        // Sweep by invocation, keeping the highest LAC among the answers
        // that completed strictly before.
        let mut done = 0;
        let mut highest: Option<(&StateOp, Option<u64>)> = None;
        for (op, lac) in seen {
            while done < by_completion.len() && by_completion[done].0.completed_ms < op.invoked_ms {
                let (o, x) = by_completion[done];
                if highest.is_none_or(|(_, h)| x > h) {
                    highest = Some((o, x));
                }
                done += 1;
            }
            if let Some((before, h)) = highest {
                if lac < h {
                    return Err(Violation {
                        invariant: "lac-monotonic",
                        detail: format!(
                            "group {g} ledger {l}: client {} saw LAC {h:?} by {} ms, then client {} invoked at {} ms saw {lac:?}",
                            before.client, before.completed_ms, op.client, op.invoked_ms
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Linearizability of every ledger's history against the state machine.
pub fn check_linearizable(history: &[StateOp]) -> Result<(), Violation> {
    for ((g, l), ops) in by_ledger(history) {
        // Reads that never came back had no effect: leave them out.
        let ops: Vec<&StateOp> = ops
            .into_iter()
            .filter(|op| {
                matches!(op.request, StateRequest::Command(_)) || op.result != StateResult::Unknown
            })
            .collect();
        let intervals: Vec<Interval> = ops
            .iter()
            .map(|op| Interval {
                invoked_ms: op.invoked_ms,
                completed_ms: (op.result != StateResult::Unknown).then_some(op.completed_ms),
            })
            .collect();
        let verdict = linearizability::check(
            &intervals,
            Model::default(),
            |m, i| model_step(m, ops[i]),
            fingerprint,
            LINEARIZABILITY_STEPS_MAX,
        );
        match verdict {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable { longest_prefix } => {
                let stuck: Vec<String> = ops
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !longest_prefix.contains(i))
                    .take(4)
                    .map(|(_, op)| describe(op))
                    .collect();
                return Err(Violation {
                    invariant: "ledger-linearizable",
                    detail: format!(
                        "group {g} ledger {l}: no linearization of its {} operations; at most {} linearize, not these: {}",
                        ops.len(),
                        longest_prefix.len(),
                        stuck.join("; ")
                    ),
                });
            }
            Verdict::BoundHit { steps } => {
                return Err(Violation {
                    invariant: "linearizability-search-bound",
                    detail: format!(
                        "group {g} ledger {l}: gave up after {steps} steps over {} operations",
                        ops.len()
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Every ledger check, most specific first.
pub(crate) fn check_ledger_history(history: &[StateOp]) -> Result<(), Violation> {
    check_fencing(history)?;
    check_adds_in_order(history)?;
    check_linearizable(history)?;
    check_lac_monotonic(history)
}

/// The sequential model: one ledger in a state machine, and the log the
/// model's commands form (its entries' bytes live there, as in a node).
#[derive(Clone, Default)]
struct Model {
    sm: StateMachine,
    /// The bytes each add carried, by the model's log index.
    added: imbl::OrdMap<u64, Vec<u8>>,
}

/// The model holds one ledger, id 0: every id the operation names is
/// rewritten to it.
fn model_step(m: &Model, op: &StateOp) -> Option<Model> {
    let sm = &m.sm;
    let unknown = op.result == StateResult::Unknown;
    match &op.request {
        StateRequest::Command(cmd) => {
            let cmd = match cmd.clone() {
                Command::AddEntry {
                    writer_token, data, ..
                } => Command::AddEntry {
                    ledger: 0,
                    writer_token,
                    data,
                },
                Command::SetLac {
                    writer_token, lac, ..
                } => Command::SetLac {
                    ledger: 0,
                    writer_token,
                    lac,
                },
                Command::CloseLedger { writer_token, .. } => Command::CloseLedger {
                    ledger: 0,
                    writer_token,
                },
                Command::OpenRecover { .. } => Command::OpenRecover { ledger: 0 },
                Command::DeleteLedger { .. } => Command::DeleteLedger { ledger: 0 },
                other => other,
            };
            let mut next = m.clone();
            let index = sm.applied_index() + 1;
            let got = next.sm.apply(index, &cmd);
            if let (Ok(Outcome::EntryAdded(_)), Command::AddEntry { data, .. }) = (&got, &cmd) {
                next.added.insert(index, data.clone());
            }
            let matches = unknown
                || match (&op.result, &got) {
                    (
                        StateResult::Applied(Ok(Outcome::LedgerCreated(_))),
                        Ok(Outcome::LedgerCreated(_)),
                    ) => true,
                    (StateResult::Applied(r), got) => *r == answered(got.clone()),
                    _ => false,
                };
            matches.then_some(next)
        }
        StateRequest::ReadLac { .. } => {
            let got = answered(sm.ledgers().lac(0));
            (op.result == StateResult::Lac(got)).then(|| m.clone())
        }
        StateRequest::ReadEntries { from, to, .. } => {
            let bytes = |e: LedgerEntry| (e.id, m.added[&e.stored.index].clone());
            let got = sm
                .ledgers()
                .read(0, *from, *to)
                .map(|v| v.into_iter().map(bytes).collect());
            let got = answered(got);
            (op.result == StateResult::Entries(got)).then(|| m.clone())
        }
    }
}

/// The model's result as a client hears it: a refusal by its protocol code.
fn answered<T>(r: Result<T, StateError>) -> Result<T, ErrorCode> {
    r.map_err(refusal_code)
}

fn fingerprint(m: &Model) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(&m.sm.snapshot());
    // The snapshot names where entries are, not what they hold.
    for (index, data) in &m.added {
        h.write_u64(*index);
        h.write(data);
    }
    h.finish()
}

fn request_name(r: &StateRequest) -> &'static str {
    match r {
        StateRequest::Command(Command::CreateLedger { .. }) => "create",
        StateRequest::Command(Command::AddEntry { .. }) => "add",
        StateRequest::Command(Command::SetLac { .. }) => "set-lac",
        StateRequest::Command(Command::CloseLedger { .. }) => "close",
        StateRequest::Command(Command::OpenRecover { .. }) => "open-recover",
        StateRequest::Command(_) => "command",
        StateRequest::ReadLac { .. } => "read-lac",
        StateRequest::ReadEntries { .. } => "read",
    }
}

fn describe(op: &StateOp) -> String {
    format!(
        "client {} {} [{}..{} ms] -> {:?}",
        op.client,
        request_name(&op.request),
        op.invoked_ms,
        op.completed_ms,
        op.result
    )
}
