//! Where a simulator's planted workload bugs ([`WorkloadBug`]) change a
//! replica's state-machine policy: applying a command, answering a query
//! or an ack, what a snapshot holds. The daemon plants none, so each is
//! one comparison with `None` on its path.

use super::tap::{GlueBug, WorkloadBug};
use crate::consensus::Index;
use crate::state::{Command, Error, Outcome, StateMachine};

/// Applies a committed command to the machine, with the bug planted in
/// applying, if any.
pub(super) fn apply_command(
    sm: &mut StateMachine,
    index: Index,
    cmd: &Command,
    bug: Option<WorkloadBug>,
) -> Result<Outcome, Error> {
    match (bug, cmd) {
        (Some(WorkloadBug::LedgerNoFence), Command::OpenRecover { ledger }) => {
            // Answers with the last entry but seals and fences nothing; the
            // index still counts as applied (a refused no-op command).
            let last = sm
                .ledgers()
                .list()
                .into_iter()
                .find(|l| l.id == *ledger)
                .map(|l| l.length.checked_sub(1));
            let _ = sm.apply(index, &Command::DeleteLedger { ledger: u64::MAX });
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
                producer_id: producer_id ^ index.rotate_left(32),
                seq: *seq,
                messages: messages.clone(),
            };
            sm.apply(index, &cmd)
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
            sm.apply_without_produce_fingerprints(index, &cmd)
        }
        _ => sm.apply(index, cmd),
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
