//! What a replica did, for a simulator's checkers: off (`None`) in the
//! daemon, where it costs one branch per note. The notes name what the
//! replica asked of its log and what it applied, so an oracle can hold it
//! to what the device really made durable without asking the WAL.

use crate::consensus::{Entry, HardState, Index, Snapshot, Term};
use crate::storage::Ticket;

/// One thing a replica did, in the order it did it.
#[derive(Clone, Debug)]
pub(crate) enum Note {
    /// A snapshot from the leader was installed, durable on return.
    Installed { snapshot: Snapshot },
    /// Writes were queued in the log, durable once `ticket` is.
    Wrote {
        ticket: Ticket,
        truncate_from: Option<Index>,
        entries: Vec<Entry>,
        hard_state: Option<HardState>,
    },
    /// A committed entry was applied.
    Applied { entry: Entry },
    /// The dedup table caught the client record at `address` as a retry
    /// of one applied before.
    Deduplicated { address: u64 },
    /// The state was restored from the leader's snapshot at `index`.
    Restored { index: Index },
    /// A snapshot of this replica's own was adopted: the log names it
    /// once `ticket` is durable.
    Adopted { index: Index, ticket: Ticket },
    /// The log stopped; the group is out of service here.
    Stopped,
    /// A log entry the state refers to was found missing or damaged here
    /// and is to be repaired from a peer.
    Missing { index: Index, found: MissingFound },
    /// Copies of entries from a peer passed their checks and are stored.
    Repaired { entries: Vec<Entry> },
    /// This replica stopped leading `term` and answered at once the
    /// `answered` client requests that waited on that leadership.
    SteppedDown { term: Term, answered: u64 },
}

/// When a replica found a referenced entry missing (a simulator tells
/// damage it did from a bug by it: an install must bring every entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MissingFound {
    /// At open (`check_stored_entries` after the state is restored).
    Open,
    /// Right after installing a leader's snapshot.
    Install,
    /// When an answer could not read it back.
    Read,
    /// By the background scrub.
    Scrub,
}

/// The bugs a simulator plants in a replica to show its checkers catch
/// them; never set by the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlueBug {
    /// Votes and acknowledgements leave before the writes they vouch for
    /// are durable (the ticket is not waited for).
    ReleaseBeforeDurable,
    /// The log's recovery truncates at damage in the middle of the log as
    /// if it were a torn tail, instead of reporting it for repair (set on
    /// the WAL: `WalConfig::planted_truncate_on_corruption`).
    TruncateOnCorruption,
    /// The dedup table's verdict is ignored: a retried append is applied
    /// again at its new index (and answered with it).
    RetryAppliedTwice,
    /// A retry the dedup table caught is answered with the duplicate
    /// entry's own index, which holds nothing, not the original's.
    RetryWrongIndex,
    /// The snapshot writer skips its fsync: the log adopts (names in its
    /// superblock, trims the segments below) a snapshot a crash can lose.
    AdoptUnsyncedSnapshot,
    /// A leader that stops leading answers its waiting proposals "ok"
    /// (at the index proposed) instead of sending them on: an entry the
    /// new leader replaces was confirmed.
    StepDownAnswersOk,
}

/// The bugs a simulator plants in a replica's state-machine policy (its
/// reads, its apply, its snapshots) to show a history checker catches
/// them; never set by the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadBug {
    /// Open-with-recovery seals nothing and fences nobody: the writer
    /// keeps getting confirms (breaks fencing).
    LedgerNoFence,
    /// Reads are answered at once by whichever node the client asked,
    /// from its local state, without the read index (breaks
    /// linearizability: followers and deposed leaders lag).
    StaleLac,
    /// The leader answers an ack at once without proposing it: the
    /// message comes back after its visibility timeout.
    AckNotReplicated,
    /// The produce dedup window is bypassed: a retried (producer, seq)
    /// is stored again under new ids.
    ProduceNoDedup,
    /// The produce dedup window is keyed by seq alone: another producer's
    /// batch with a seq already seen is answered as a retry and dropped
    /// (a confirmed produce is lost).
    DedupIgnoresProducer,
    /// Snapshots leave the state machine out: a node restored from one
    /// starts from an empty machine (its state diverges).
    SnapshotWithoutMachine,
    /// A snapshot sent to a follower leaves out the log entries its
    /// machine refers to: the follower cannot read back the messages it
    /// should hand out.
    SnapshotWithoutEntries,
    /// A repaired copy of an entry below the snapshot is taken without
    /// checking it against the term and CRC32C the state recorded: a
    /// wrong copy is then served as the entry.
    RepairUnverified,
    /// The ledger adds of one command batch entry are applied in reverse
    /// slot order: a writer's pipelined adds take entry ids out of the
    /// order it sent them in.
    LedgerAddsReordered,
    /// The acks of a command batch entry after its first command are
    /// answered as applied but not applied (an off-by-one over the
    /// batch): acked messages come back after their visibility timeout.
    AckBatchCutShort,
}
