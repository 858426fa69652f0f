//! Staged images: a snapshot image streamed from the leader, written
//! chunk by chunk into a set of segment files beside the live log, and
//! adopted as the whole log at once when complete ([`Wal::adopt_staged`]).
//!
//! The live log stays in force while an image streams in (the node still
//! votes, and a new leader may append to it instead). So staged files are
//! named `<id>.staged`, which recovery ignores, with segment numbers and
//! batch sequence numbers reserved far above the live log's
//! ([`STAGED_SEGMENT_GAP`], [`STAGED_SEQ_GAP`]): each batch names the
//! segment it is in, so a staged file becomes a segment by a rename alone,
//! and its batches read as the newest of the log. An adoption whose
//! reserved numbers the live log reached meanwhile is refused (the image
//! is fetched afresh).
//!
//! Resuming after a crash: every chunk is durable (file data, then the
//! manifest `staged.head`, written whole and renamed into place) before
//! the leader is told it is held, so the manifest names what a restarted
//! node holds; [`StagedImage::resume`] reads the files back, checking
//! every batch, and zeroes what a chunk in flight at the crash left after.
//! The image's first part (its header and the snapshot's state, `meta`)
//! goes to `staged.meta`, and is held in memory: it is the state the node
//! restores, as large as an installed snapshot's state, whatever the
//! entries that follow it weigh.

use super::config::io_err;
use super::WalError;
use crate::consensus::{Entry, Index, Membership, Snapshot, Term};
use crate::storage::dir::{LogDir, LogFile};
use crate::storage::format::{decode_batch, BatchBuilder, Placement, BLOCK_BYTES};
use crate::storage::recovery::BatchLocation;

/// Segment numbers between the live log's highest and a staged image's
/// first: room for the live log to grow while an image streams in.
pub(super) const STAGED_SEGMENT_GAP: u64 = 1 << 20;
/// Batch sequence numbers between the live log's next and a staged
/// image's first.
pub(super) const STAGED_SEQ_GAP: u64 = 1 << 40;
/// Largest staged meta (the image's header and the snapshot's state,
/// which the node holds in memory once installed anyway).
pub const STAGED_META_BYTES_MAX: u64 = 1 << 30;

pub(super) const MANIFEST: &str = "staged.head";
const MANIFEST_TMP: &str = "staged.head.tmp";
pub(super) const META: &str = "staged.meta";
const MANIFEST_MAGIC: [u8; 4] = *b"QSH1";

/// The file name of staged segment `id`.
pub(super) fn staged_name(id: u64) -> String {
    format!("{id:016x}.staged")
}

/// The name an old segment takes while a staged image replaces the log
/// (`Wal::adopt_staged`): renamed back by recovery if the install did
/// not finish, removed if it did.
pub(super) fn replaced_name(id: u64) -> String {
    format!("{id:016x}.replaced")
}

/// The name of a staged segment being removed on a helper thread.
fn dropped_name(id: u64) -> String {
    format!("{id:016x}.dropped")
}

/// Removes a file, a missing one included (another remover got it).
fn remove_if_there<D: LogDir>(dir: &D, name: &str) -> Result<(), WalError> {
    match dir.remove(name) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_err(format!("removing staged file {name}"))(e))
        }
        _ => Ok(()),
    }
}

/// What a staged image holds, as its manifest records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedHead {
    /// The snapshot the image is of.
    pub index: Index,
    /// Its term.
    pub term: Term,
    /// Its membership.
    pub membership: Membership,
    /// The image's length in positions (see `consensus::image`).
    pub total: u64,
    /// Positions held durably.
    pub held: u64,
    /// Bytes of `staged.meta` held.
    pub meta_bytes: u64,
    /// The first staged segment's number.
    pub seg_base: u64,
    /// The first staged batch's sequence number.
    pub seq_base: u64,
    /// Staged segment files written.
    pub files: u64,
    /// Where the last file ends.
    pub end_offset: u64,
    /// The next batch's sequence number.
    pub next_seq: u64,
    /// The next entry expected (0: none staged yet).
    pub next_index: Index,
    /// The last entry staged (index, term).
    pub last: (Index, Term),
}

impl StagedHead {
    fn encode(&self) -> Vec<u8> {
        let mut b = MANIFEST_MAGIC.to_vec();
        for v in [
            self.index,
            self.term,
            self.total,
            self.held,
            self.meta_bytes,
            self.seg_base,
            self.seq_base,
            self.files,
            self.end_offset,
            self.next_seq,
            self.next_index,
            self.last.0,
            self.last.1,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let m = &self.membership;
        b.extend_from_slice(&(m.voters.len() as u32).to_le_bytes());
        b.extend_from_slice(&(m.learners.len() as u32).to_le_bytes());
        for id in m.voters.iter().chain(&m.learners) {
            b.extend_from_slice(&id.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(bytes: &[u8]) -> Option<StagedHead> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32c::crc32c(body).to_le_bytes() != crc || body.get(..4)? != MANIFEST_MAGIC {
            return None;
        }
        let mut r = &body[4..];
        let mut u64s = [0u64; 13];
        for v in &mut u64s {
            let (h, rest) = r.split_at_checked(8)?;
            *v = u64::from_le_bytes(h.try_into().ok()?);
            r = rest;
        }
        let (counts, mut ids) = r.split_at_checked(8)?;
        let voters = u32::from_le_bytes(counts[..4].try_into().ok()?) as usize;
        let learners = u32::from_le_bytes(counts[4..].try_into().ok()?) as usize;
        if ids.len() != voters.checked_add(learners)?.checked_mul(8)? {
            return None;
        }
        let mut membership = Membership::default();
        for i in 0..voters + learners {
            let (h, rest) = ids.split_at(8);
            let id = u64::from_le_bytes(h.try_into().ok()?);
            ids = rest;
            if i < voters {
                membership.voters.insert(id);
            } else {
                membership.learners.insert(id);
            }
        }
        let [index, term, total, held, meta_bytes, seg_base, seq_base, files, end_offset, next_seq, next_index, last_index, last_term] =
            u64s;
        Some(StagedHead {
            index,
            term,
            membership,
            total,
            held,
            meta_bytes,
            seg_base,
            seq_base,
            files,
            end_offset,
            next_seq,
            next_index,
            last: (last_index, last_term),
        })
    }
}

/// A staged image being written, on any thread (it owns its files).
pub struct StagedImage<D: LogDir> {
    pub(super) dir: D,
    /// What is held durably.
    pub head: StagedHead,
    pub(super) segment_bytes: u64,
    /// The image's first part received so far.
    pub meta: Vec<u8>,
    /// Where each staged batch is (the log's batch index once adopted).
    pub(super) locations: Vec<BatchLocation>,
    /// The last staged file, open.
    pub(super) file: Option<(u64, D::File)>,
}

impl<D: LogDir> std::fmt::Debug for StagedImage<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedImage")
            .field("head", &self.head)
            .field("meta_bytes", &self.meta.len())
            .field("batches", &self.locations.len())
            .finish()
    }
}

/// Removes every staged file from `dir`: an image abandoned or adopted.
pub fn discard_staged<D: LogDir>(dir: &D) -> Result<(), WalError> {
    let names = dir.list().map_err(io_err("listing the log directory"))?;
    let mut removed = false;
    for name in names {
        let staged = name.ends_with(".staged") || name.ends_with(".dropped");
        if staged || name.starts_with("staged.") {
            remove_if_there(dir, &name)?;
            removed = true;
        }
    }
    if removed {
        dir.sync().map_err(io_err("syncing the log directory"))?;
    }
    Ok(())
}

/// Drops the staged image at once, cheaply (renames, on the loop): its
/// segments are renamed out of the way, to be removed by
/// [`remove_dropped`] on a helper thread, so an image staged next is never
/// caught by that removal.
pub fn drop_staged<D: LogDir>(dir: &D) -> Result<Vec<String>, WalError> {
    let names = dir.list().map_err(io_err("listing the log directory"))?;
    let mut dropped = Vec::new();
    for name in names {
        let id = name
            .strip_suffix(".staged")
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        if let Some(id) = id {
            dir.rename(&name, &dropped_name(id))
                .map_err(io_err(format!("dropping staged file {name}")))?;
            dropped.push(dropped_name(id));
        } else if name.starts_with("staged.") {
            remove_if_there(dir, &name)?;
        }
    }
    Ok(dropped)
}

/// Removes staged segments [`drop_staged`] set aside (any thread).
pub fn remove_dropped<D: LogDir>(dir: &D, names: &[String]) -> Result<(), WalError> {
    for name in names {
        remove_if_there(dir, name)?;
    }
    dir.sync().map_err(io_err("syncing the log directory"))
}

impl<D: LogDir> StagedImage<D> {
    /// Starts staging the image of `snapshot` (its data left out), of
    /// `total` positions, with numbers the log reserved for it
    /// ([`Wal::staged_numbers`]); any staged files left go first.
    pub fn begin(
        dir: D,
        snapshot: &Snapshot,
        total: u64,
        (seg_base, seq_base): (u64, u64),
        segment_bytes: u64,
    ) -> Result<Self, WalError> {
        discard_staged(&dir)?;
        let head = StagedHead {
            index: snapshot.index,
            term: snapshot.term,
            membership: snapshot.membership.clone(),
            total,
            held: 0,
            meta_bytes: 0,
            seg_base,
            seq_base,
            files: 0,
            end_offset: 0,
            next_seq: seq_base,
            next_index: 0,
            last: (0, 0),
        };
        Ok(StagedImage {
            dir,
            head,
            segment_bytes,
            meta: Vec::new(),
            locations: Vec::new(),
            file: None,
        })
    }

    /// Adds bytes of the image's first part; held durably up to `held`
    /// positions once this returns.
    pub fn add_meta(&mut self, bytes: &[u8], held: u64) -> Result<(), WalError> {
        let at = self.head.meta_bytes;
        if at + bytes.len() as u64 > STAGED_META_BYTES_MAX {
            return Err(WalError::Invalid(format!(
                "a staged image's state over {STAGED_META_BYTES_MAX} bytes"
            )));
        }
        let (f, _, _) = self
            .dir
            .open(META, false)
            .map_err(io_err("opening staged.meta"))?;
        f.write_at(bytes, at)
            .map_err(io_err("writing staged.meta"))?;
        f.sync_data().map_err(io_err("syncing staged.meta"))?;
        if at == 0 {
            self.dir
                .sync()
                .map_err(io_err("syncing the log directory"))?;
        }
        self.meta.extend_from_slice(bytes);
        self.head.meta_bytes += bytes.len() as u64;
        self.head.held = held;
        self.write_manifest()
    }

    /// Adds entries, consecutive from the last one staged (from `first`
    /// for the first), as one batch; held durably up to `held` positions
    /// once this returns.
    pub fn add_entries(
        &mut self,
        first: Index,
        entries: &[Entry],
        held: u64,
    ) -> Result<(), WalError> {
        let expected = if self.head.next_index == 0 {
            first
        } else {
            self.head.next_index
        };
        let consecutive = entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.index == expected + i as u64);
        let Some(last) = entries.last().filter(|_| consecutive) else {
            return Err(WalError::Invalid(format!(
                "staged entries not consecutive from {expected}"
            )));
        };
        if last.index > self.head.index {
            return Err(WalError::Invalid(format!(
                "a staged entry at {} past the snapshot at {}",
                last.index, self.head.index
            )));
        }
        // Batches of at most half a segment, as the live log stores its
        // entries (a chunk may be larger than a small segment's half).
        let limit = (self.segment_bytes / 2).max(BLOCK_BYTES as u64);
        let mut batches = vec![BatchBuilder::new(expected)];
        for e in entries {
            let b = batches.last_mut().expect("one at least");
            if b.count() > 0 && (b.disk_bytes() + e.size_bytes() + 64) as u64 > limit {
                batches.push(BatchBuilder::new(e.index));
            }
            batches.last_mut().expect("one at least").push(e);
        }
        for batch in batches {
            self.write_batch(batch)?;
        }
        if let Some((_, f)) = &self.file {
            f.sync_data().map_err(io_err("syncing a staged segment"))?;
        }
        self.head.next_index = last.index + 1;
        self.head.last = (last.index, last.term);
        self.head.held = held;
        self.write_manifest()
    }

    /// Writes one batch at the end of the last staged file, or of a new
    /// one; a file left behind is synced first.
    fn write_batch(&mut self, batch: BatchBuilder) -> Result<(), WalError> {
        let bytes = batch.disk_bytes() as u64;
        if bytes > self.segment_bytes {
            return Err(WalError::Invalid(format!(
                "{bytes} bytes of staged entries do not fit a segment"
            )));
        }
        let fits = self
            .file
            .as_ref()
            .is_some_and(|_| self.head.end_offset + bytes <= self.segment_bytes);
        if !fits {
            if let Some((_, f)) = &self.file {
                f.sync_data().map_err(io_err("syncing a staged segment"))?;
            }
            let id = self.head.seg_base + self.head.files;
            let (f, _, _) = self
                .dir
                .open(&staged_name(id), false)
                .map_err(io_err("creating a staged segment"))?;
            self.dir
                .sync()
                .map_err(io_err("syncing the log directory"))?;
            self.file = Some((id, f));
            self.head.files += 1;
            self.head.end_offset = 0;
        }
        let (id, f) = self.file.as_ref().expect("opened above");
        let (first_index, count) = (batch.first_index(), u64::from(batch.count()));
        let seq = self.head.next_seq;
        let place = Placement {
            segment: *id,
            recycled: false,
        };
        let buf = batch.finish(seq, self.head.index, place);
        let offset = self.head.end_offset;
        f.write_at(buf.as_slice(), offset)
            .map_err(io_err("writing a staged segment"))?;
        self.locations.push(BatchLocation {
            segment: *id,
            offset,
            disk_bytes: bytes,
            seq,
            first_index,
            count,
            recycled: false,
        });
        self.head.end_offset += bytes;
        self.head.next_seq += 1;
        Ok(())
    }

    fn write_manifest(&self) -> Result<(), WalError> {
        let bytes = self.head.encode();
        let (f, _, _) = self
            .dir
            .open(MANIFEST_TMP, false)
            .map_err(io_err("opening staged.head.tmp"))?;
        f.write_at(&bytes, 0)
            .map_err(io_err("writing staged.head.tmp"))?;
        f.sync_data().map_err(io_err("syncing staged.head.tmp"))?;
        self.dir
            .rename(MANIFEST_TMP, MANIFEST)
            .map_err(io_err("renaming staged.head"))?;
        self.dir.sync().map_err(io_err("syncing the log directory"))
    }

    /// The staged image a crash left in `dir`, read back and checked
    /// (every batch, and the meta's length); `None` if there is none or it
    /// does not check out, in which case its files go.
    pub fn resume(dir: D, segment_bytes: u64) -> Result<Option<Self>, WalError> {
        let head = match dir.read(MANIFEST) {
            Ok(b) => StagedHead::decode(&b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(WalError::Io("reading staged.head".into(), e)),
        };
        let Some(head) = head else {
            discard_staged(&dir)?;
            return Ok(None);
        };
        match Self::read_back(dir.clone(), head, segment_bytes) {
            Ok(s) => Ok(Some(s)),
            Err(_) => {
                discard_staged(&dir)?;
                Ok(None)
            }
        }
    }

    fn read_back(dir: D, head: StagedHead, segment_bytes: u64) -> Result<Self, WalError> {
        let bad = |why: &str| WalError::Corrupt(format!("staged image: {why}"));
        let mut meta = if head.meta_bytes > 0 {
            dir.read(META).map_err(io_err("reading staged.meta"))?
        } else {
            Vec::new()
        };
        if (meta.len() as u64) < head.meta_bytes {
            return Err(bad("staged.meta is short"));
        }
        meta.truncate(head.meta_bytes as usize);
        let mut locations = Vec::new();
        let mut seq = head.seq_base;
        let mut next_index = 0;
        let mut file = None;
        for k in 0..head.files {
            let id = head.seg_base + k;
            // Read-write: the last one is written on.
            let name = staged_name(id);
            if !dir.exists(&name) {
                return Err(bad("a staged segment is missing"));
            }
            let (f, _, _) = dir
                .open(&name, false)
                .map_err(io_err("opening a staged segment"))?;
            let len = f.size_bytes().map_err(io_err("sizing a staged segment"))?;
            let end = if k + 1 == head.files {
                head.end_offset
            } else {
                len
            };
            if end > len {
                return Err(bad("a staged segment is short"));
            }
            let mut off = 0u64;
            while off < end {
                let mut first = vec![0u8; BLOCK_BYTES];
                f.read_at(&mut first, off)
                    .map_err(io_err("reading a staged segment"))?;
                let Some(size) = batch_disk_bytes(&first) else {
                    // A file that was the last one once, zeroed past its
                    // end at a resume; the count of batches checks the rest.
                    if k + 1 < head.files && first.iter().all(|&b| b == 0) {
                        break;
                    }
                    return Err(bad("a torn batch"));
                };
                let mut bytes = vec![0u8; size];
                f.read_at(&mut bytes, off)
                    .map_err(io_err("reading a staged segment"))?;
                let b = decode_batch(&bytes).map_err(|e| bad(&e.to_string()))?;
                let follows = next_index == 0 || b.first_index == next_index;
                if b.seq != seq || b.place.segment != id || !follows || b.entries.is_empty() {
                    return Err(bad("batches out of order"));
                }
                locations.push(BatchLocation {
                    segment: id,
                    offset: off,
                    disk_bytes: size as u64,
                    seq,
                    first_index: b.first_index,
                    count: b.entries.len() as u64,
                    recycled: false,
                });
                next_index = b.first_index + b.entries.len() as u64;
                seq += 1;
                off += size as u64;
            }
            if k + 1 == head.files {
                // A chunk in flight at the crash may have gone further.
                let zeros = vec![0u8; (len - end).min(segment_bytes) as usize];
                if !zeros.is_empty() {
                    f.write_at(&zeros, end)
                        .map_err(io_err("zeroing a staged segment"))?;
                    f.sync_data().map_err(io_err("syncing a staged segment"))?;
                }
                file = Some((id, f));
            }
        }
        if seq != head.next_seq || next_index != head.next_index {
            return Err(bad("the manifest does not match the files"));
        }
        // Files past the manifest's (a chunk in flight) go.
        for name in dir.list().map_err(io_err("listing the log directory"))? {
            let id = name
                .strip_suffix(".staged")
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            if id.is_some_and(|id| id >= head.seg_base + head.files) {
                dir.remove(&name)
                    .map_err(io_err("removing a staged segment"))?;
            }
        }
        Ok(StagedImage {
            dir,
            head,
            segment_bytes,
            meta,
            locations,
            file,
        })
    }

    /// True once every position of the image is held.
    pub fn complete(&self) -> bool {
        self.head.held == self.head.total
    }
}

/// The bytes a batch occupies, from its first block; `None` if that block
/// does not start a batch.
fn batch_disk_bytes(block: &[u8]) -> Option<usize> {
    // The batch header's payload: count u32, batch_bytes u32, ...
    let size = u32::from_le_bytes(block.get(36..40)?.try_into().ok()?) as usize;
    (size >= BLOCK_BYTES && size % BLOCK_BYTES == 0 && size <= 1 << 30).then_some(size)
}

#[cfg(test)]
mod tests;
