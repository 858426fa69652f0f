//! Helpers shared by the WAL parts' unit tests.

use super::{Wal, WalConfig};
use crate::consensus::{Entry, Index, Membership, Payload, Snapshot};
use crate::io::BackendChoice;

/// Small segments (16 blocks) and flushes, buffered writes: many rolls
/// and batches from a few entries, on any filesystem.
pub(super) fn small_cfg() -> WalConfig {
    WalConfig {
        segment_bytes: 64 << 10,
        flush_bytes_max: 16 << 10,
        backend: BackendChoice::Portable,
        direct_io: false,
        ..WalConfig::default()
    }
}

/// Entry `i` of term 1, about 3 KiB, checkable from its index alone.
pub(super) fn entry(i: Index) -> Entry {
    Entry {
        term: 1,
        index: i,
        payload: Payload::Normal(vec![i as u8; 3000].into()),
    }
}

/// Appends `n` entries after the last one, each made durable.
pub(super) fn append_durably(wal: &mut Wal, n: u64) {
    let first = wal.last().0 + 1;
    for i in first..first + n {
        wal.append(None, &[entry(i)]).expect("append");
        wal.sync().expect("sync");
    }
}

/// A snapshot at `index` with no state.
pub(super) fn snapshot(index: Index) -> Snapshot {
    Snapshot {
        index,
        term: 1,
        membership: Membership::with_voters([1]),
        data: Vec::new(),
    }
}

/// The indexes of entries.
pub(super) fn indexes(entries: &[Entry]) -> Vec<Index> {
    entries.iter().map(|e| e.index).collect()
}
