//! The log clients' end-to-end checks of dedup and answer routing, from
//! what the replicas really serve: each applied client append is read
//! back through the production read path (`Replica::read`, which skips
//! what the dedup table kept out), not taken from the dedup table's word.
//!
//! - append-applied-once: no (client id, seq) is served at two indexes of
//!   one group, however often it was retried;
//! - confirmed-append-at-its-index: an `Appended { index }` answer names
//!   the index where the answering replica serves that call's value
//!   (values are unique per (client id, seq)).

use super::checker::Violation;
use crate::consensus::Index;
use std::collections::{BTreeSet, HashMap};

/// What the checks remember.
#[derive(Default)]
pub(crate) struct AppendCheck {
    /// Per (group, client id, seq): the index it was served at.
    served: HashMap<(usize, u64, u64), Index>,
    /// Entries the dedup table caught as retries, by (group, index).
    deduplicated: BTreeSet<(usize, Index)>,
}

impl AppendCheck {
    /// A replica of `group` serves (client, seq) at `index`.
    pub(crate) fn served(
        &mut self,
        group: usize,
        client: u64,
        seq: u64,
        index: Index,
    ) -> Result<(), Violation> {
        let first = *self.served.entry((group, client, seq)).or_insert(index);
        if first != index {
            return Err(Violation {
                invariant: "append-applied-once",
                detail: format!(
                    "group {group}: client {client} seq {seq} is applied at {first} and again at {index}"
                ),
            });
        }
        Ok(())
    }

    /// A replica of `group` noted the entry at `index` as a retry.
    pub(crate) fn deduplicated(&mut self, group: usize, index: Index) {
        self.deduplicated.insert((group, index));
    }

    /// Retried entries caught, each counted once over the replicas.
    pub(crate) fn deduplicated_count(&self) -> u64 {
        self.deduplicated.len() as u64
    }
}

/// Checks the answer `Appended { index }` for `value` against what the
/// answering replica serves from `index` on (`read`: the first entry it
/// serves there, if any): `Ok(false)` when `index` was compacted.
pub(crate) fn confirmed_at_its_index(
    group: usize,
    node: usize,
    index: Index,
    value: &[u8],
    read: Result<Option<(Index, Vec<u8>)>, crate::node::ProposeError>,
) -> Result<bool, Violation> {
    let served = match read {
        Ok(s) => s,
        Err(crate::node::ProposeError::Compacted { .. }) => return Ok(false),
        Err(e) => Some((0, format!("unreadable: {e}").into_bytes())),
    };
    match served {
        Some((at, data)) if at == index && data == value => Ok(true),
        other => Err(Violation {
            invariant: "confirmed-append-at-its-index",
            detail: format!(
                "group {group}: n{} answered {:?} at {index}, where it serves {:?}",
                node + 1,
                String::from_utf8_lossy(value),
                other.map(|(at, d)| (at, String::from_utf8_lossy(&d).into_owned()))
            ),
        }),
    }
}
