//! The queue workload's history checkers, run once a run has healed and
//! recovered. The final drain consumes everything left in a copy of each
//! group's replicated machine (all replicas are equal at equal index, which
//! `state-machines-equal` checks), with a clock past every visibility
//! timeout, so its deliveries are what a consumer would get after healing.
//!
//! - acked not redelivered: no consume invoked after an ack of a message
//!   completed delivers it again, and the drain does not;
//! - confirmed produce delivered: every message of a confirmed produce is
//!   delivered at least once, to a consumer or to the drain (nothing
//!   confirmed is lost; acked messages were delivered before their ack);
//! - produce not duplicated: every message's payload (unique per producer,
//!   seq and position) is seen under one id only, however often its
//!   produce was retried through the idempotent path.

use super::checker::Violation;
use super::workload::{StateOp, StateRequest, StateResult};
use crate::state::queue::{Delivery, CONSUME_MAX};
use crate::state::{Command, Lookup, Outcome, StateMachine, Unfilled};
use std::collections::{BTreeMap, HashMap};

/// Consumes everything deliverable from a copy of `sm`'s queue `name`,
/// the messages' bytes read through `payload_at` (the replica's log);
/// `Err` names a log entry the state refers to and it lacks.
pub fn drain(
    sm: &StateMachine,
    name: &str,
    payload_at: &mut dyn FnMut(u64) -> Lookup,
) -> Result<Vec<Delivery>, Unfilled> {
    let mut sm = sm.clone();
    // Far past every visibility timeout the workload sets; one clock for
    // the whole drain, so nothing it hands out comes back within it.
    let now_ms = sm.clock_ms() + 3_600_000;
    let mut out = Vec::new();
    loop {
        let cmd = Command::Consume {
            queue: name.to_string(),
            consumer: u64::MAX,
            max: CONSUME_MAX,
            visibility_ms: 1,
            now_ms,
        };
        let index = sm.applied_index() + 1;
        match sm.apply(index, &cmd) {
            Ok(Outcome::Consumed(d)) if !d.is_empty() => out.extend(d),
            _ => break,
        }
    }
    if let Ok(dead) = sm.queues().dead_letters(name, usize::MAX) {
        out.extend(dead);
    }
    crate::state::stored::fill(out.iter_mut().map(|d| (d.stored, &mut d.data)), payload_at)?;
    Ok(out)
}

/// Every queue check for one group's history and its final machine
/// (drained here, on a copy).
pub fn check_queue_history(
    group: usize,
    history: &[StateOp],
    final_sm: &StateMachine,
    name: &str,
    payload_at: &mut dyn FnMut(u64) -> Lookup,
) -> Result<(), Violation> {
    let drained = drain(final_sm, name, payload_at).map_err(|u| Violation {
        invariant: "stored-bytes-readable",
        detail: match u {
            Unfilled::Missing(index) => format!(
                "group {group}: the final state refers to log entry {index}, which its replica does not hold"
            ),
            Unfilled::Reading => format!("group {group}: a blocking read left entries unread"),
        },
    })?;
    let ops: Vec<&StateOp> = history.iter().filter(|op| op.group == group).collect();
    // When each id's first ack completed.
    let mut acked_at: HashMap<u64, u64> = HashMap::new();
    for op in &ops {
        if let (StateRequest::Command(Command::Ack { ids, .. }), StateResult::Applied(Ok(_))) =
            (&op.request, &op.result)
        {
            for id in ids {
                let t = acked_at.entry(*id).or_insert(op.completed_ms);
                *t = (*t).min(op.completed_ms);
            }
        }
    }
    // Every delivery: (invoked_ms, delivery); the drain comes after all.
    let mut deliveries: Vec<(u64, &Delivery)> = Vec::new();
    for op in &ops {
        if let StateResult::Applied(Ok(Outcome::Consumed(d))) = &op.result {
            deliveries.extend(d.iter().map(|m| (op.invoked_ms, m)));
        }
    }
    deliveries.extend(drained.iter().map(|m| (u64::MAX, m)));

    for &(invoked_ms, m) in &deliveries {
        if let Some(&t) = acked_at.get(&m.id) {
            if invoked_ms > t {
                let when = if invoked_ms == u64::MAX {
                    "the final drain".to_string()
                } else {
                    format!("a consume invoked at {invoked_ms} ms")
                };
                return Err(Violation {
                    invariant: "acked-not-redelivered",
                    detail: format!(
                        "group {group}: message {} ({}) was acked by {t} ms, yet {when} delivered it again (delivery {})",
                        m.id,
                        String::from_utf8_lossy(&m.data),
                        m.deliveries
                    ),
                });
            }
        }
    }

    let mut ids_of_payload: BTreeMap<&[u8], u64> = BTreeMap::new();
    for &(_, m) in &deliveries {
        if let Some(&other) = ids_of_payload.get(m.data.as_slice()) {
            if other != m.id {
                return Err(Violation {
                    invariant: "produce-not-duplicated",
                    detail: format!(
                        "group {group}: payload {} was delivered as message {other} and as message {}",
                        String::from_utf8_lossy(&m.data),
                        m.id
                    ),
                });
            }
        }
        ids_of_payload.insert(&m.data, m.id);
    }

    // Delivered at least once: a message is acked only after a consume
    // handed it out, so every confirmed payload shows up in a delivery
    // answered to a client or in the drain.
    let delivered: std::collections::HashSet<&[u8]> =
        deliveries.iter().map(|(_, m)| m.data.as_slice()).collect();
    for op in &ops {
        let (
            StateRequest::Command(Command::Produce {
                producer_id,
                seq,
                messages,
                ..
            }),
            StateResult::Applied(Ok(Outcome::Produced { .. })),
        ) = (&op.request, &op.result)
        else {
            continue;
        };
        if let Some(lost) = messages.iter().find(|m| !delivered.contains(m.as_slice())) {
            return Err(Violation {
                invariant: "confirmed-produce-delivered",
                detail: format!(
                    "group {group}: message {} of producer {producer_id:x} seq {seq}, confirmed at {} ms, was never delivered",
                    String::from_utf8_lossy(lost),
                    op.completed_ms
                ),
            });
        }
    }
    Ok(())
}
