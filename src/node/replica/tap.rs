//! What a replica did, for a simulator's checkers: off (`None`) in the
//! daemon, where it costs one branch per note. The notes name what the
//! replica asked of its log and what it applied, so an oracle can hold it
//! to what the device really made durable without asking the WAL.

use crate::consensus::{Entry, HardState, Index, Snapshot};
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
    /// The state was restored from the leader's snapshot at `index`.
    Restored { index: Index },
    /// A snapshot of this replica's own was adopted: the log names it
    /// once `ticket` is durable.
    Adopted { index: Index, ticket: Ticket },
    /// The log stopped; the group is out of service here.
    Stopped,
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
}
