//! The log clients' end-to-end checks of dedup and answer routing, from
//! what the replicas really serve: each applied client append is read
//! against the production read path's decision (`Replica::serves`, which
//! `Replica::read` skips by), not taken from the dedup table's answer.
//!
//! - append-applied-once: no (client id, seq) is served at two indexes of
//!   one group, however often it was retried;
//! - confirmed-append-at-its-index: an `Appended { index }` answer names
//!   the index where the replicas serve that (client id, seq), and never
//!   one where they applied another record.

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
    /// Per (group, address): the (client id, seq) of the record applied
    /// there, served or not (apply is the same on every replica).
    applied_at: HashMap<(usize, Index), (u64, u64)>,
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

    /// A replica of `group` applied the record of (client, seq) at
    /// `address` (served, or kept out of reads as a retry).
    pub(crate) fn applied(&mut self, group: usize, client: u64, seq: u64, address: Index) {
        self.applied_at.insert((group, address), (client, seq));
    }

    /// A replica of `group` noted the entry at `index` as a retry.
    pub(crate) fn deduplicated(&mut self, group: usize, index: Index) {
        self.deduplicated.insert((group, index));
    }

    /// Retried entries caught, each counted once over the replicas.
    pub(crate) fn deduplicated_count(&self) -> u64 {
        self.deduplicated.len() as u64
    }

    /// Checks an answer `Appended { index }` to (client, seq) against
    /// where a replica's read path served it, or what a replica applied
    /// at `index` (another record there: the answer confirmed an entry
    /// that was replaced): `Ok(false)` if none did yet.
    pub(crate) fn confirmed(
        &self,
        group: usize,
        client: u64,
        seq: u64,
        index: Index,
    ) -> Result<bool, Violation> {
        match self.served.get(&(group, client, seq)) {
            None => match self.applied_at.get(&(group, index)) {
                Some(&(other, other_seq)) if (other, other_seq) != (client, seq) => Err(Violation {
                    invariant: "confirmed-append-at-its-index",
                    detail: format!(
                        "group {group}: client {client} seq {seq} was answered at {index}, which holds client {other} seq {other_seq}; it is served nowhere"
                    ),
                }),
                _ => Ok(false),
            },
            Some(&at) if at == index => Ok(true),
            Some(&at) => Err(Violation {
                invariant: "confirmed-append-at-its-index",
                detail: format!(
                    "group {group}: client {client} seq {seq} was answered at {index}, where it is not served; it is served at {at}"
                ),
            }),
        }
    }
}
