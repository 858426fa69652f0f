//! Where a simulator's planted workload bugs ([`WorkloadBug`]) change a
//! replica's state-machine policy: applying a command, answering a query
//! or an ack, what a snapshot holds. The daemon plants none, so each is
//! one comparison with `None` on its path.

use super::tap::{GlueBug, WorkloadBug};
use crate::consensus::Index;
use crate::state::{Command, Error, Outcome, StateMachine, Stored};

/// The order in which the commands of one command entry are applied:
/// slot order, or with the bug planted in it, if any.
pub(super) fn command_order(
    commands: &[(u64, u64, &[u8])],
    bug: Option<WorkloadBug>,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..commands.len()).collect();
    if bug == Some(WorkloadBug::LedgerAddsReordered) {
        // The batch's ledger adds are applied last first (as a gather
        // that popped them off a stack would): each takes another's id.
        let adds: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&k| {
                matches!(
                    Command::decode(commands[k].2),
                    Some(Command::AddEntry { .. })
                )
            })
            .collect();
        for (&k, &j) in adds.iter().zip(adds.iter().rev()) {
            order[k] = j;
        }
    }
    order
}

/// Applies command `slot` of a committed command entry, at `at`, to the
/// machine, with the bug planted in applying, if any.
pub(super) fn apply_command(
    sm: &mut StateMachine,
    at: Stored,
    slot: usize,
    cmd: &Command,
    bug: Option<WorkloadBug>,
) -> Result<Outcome, Error> {
    match (bug, cmd) {
        (Some(WorkloadBug::AckBatchCutShort), Command::Ack { ids, .. }) if slot > 0 => {
            // Answered as applied, but only a batch's first command is
            // (an off-by-one over the batch): the ids stay unacked.
            let _ = sm.apply(at, &Command::DeleteLedger { ledger: u64::MAX });
            Ok(Outcome::Acked(ids.len() as u64))
        }
        (Some(WorkloadBug::LedgerNoFence), Command::OpenRecover { ledger }) => {
            // Answers with the last entry but seals and fences nothing; the
            // index still counts as applied (a refused no-op command).
            let last = sm
                .ledgers()
                .list()
                .into_iter()
                .find(|l| l.id == *ledger)
                .map(|l| l.length.checked_sub(1));
            let _ = sm.apply(at, &Command::DeleteLedger { ledger: u64::MAX });
            last.map(Outcome::Sealed).ok_or(Error::NoSuchLedger)
        }
        (
            Some(WorkloadBug::ProduceNoDedup),
            Command::Produce {
                queue,
                producer_id,
                seq,
                messages,
            },
        ) => {
            // A fresh producer id per entry: the window never matches.
            let cmd = Command::Produce {
                queue: queue.clone(),
                producer_id: producer_id ^ at.index.rotate_left(32) ^ slot as u64,
                seq: *seq,
                messages: messages.clone(),
            };
            sm.apply(at, &cmd)
        }
        (
            Some(WorkloadBug::DedupIgnoresProducer),
            Command::Produce {
                queue,
                seq,
                messages,
                ..
            },
        ) => {
            // Every producer shares one window, matched by seq alone (as
            // before fingerprints, which would refuse the other batch).
            let cmd = Command::Produce {
                queue: queue.clone(),
                producer_id: 0,
                seq: *seq,
                messages: messages.clone(),
            };
            sm.apply_without_produce_fingerprints(at, &cmd)
        }
        _ => sm.apply(at, cmd),
    }
}

/// What a replica does with the client append at `index` that the dedup
/// table caught as a retry of the one at `at`: the index it answers, and
/// whether it applies the append anyway, with the bug planted, if any.
pub(super) fn duplicate(index: Index, at: Index, bug: Option<GlueBug>) -> (Index, bool) {
    match bug {
        Some(GlueBug::RetryAppliedTwice) => (index, true),
        Some(GlueBug::RetryWrongIndex) => (index, false),
        _ => (at, false),
    }
}
