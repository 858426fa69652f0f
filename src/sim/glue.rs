//! The production glue under the seed (`Glue::Node`): each group's
//! replica on each simulated node is `node::replica::Replica`, the one
//! `quired` runs, over the real `storage::Wal` on a simulated device
//! (`device::SimDir`) and a host whose jobs run when the seed says
//! (`ManualHost`). The world only schedules: it ticks and steps Raft,
//! drives the replica, sends what it releases, wakes it when its device
//! completes a request or a snapshot job is due.
//!
//! The oracle never asks the WAL what is durable. The replica's tap
//! reports what it asked its log to write under which ticket; the device
//! reports which flushes it really synced ([`SimDir::oldest_unsynced_token`],
//! [`SimDir::highest_synced_token`]).
//! A write is in the node's *shadow* (`disk::Durable`, what the checkers
//! hold the node to) once every flush up to its ticket is synced on the
//! device and none is still queued in the WAL. At a restart the real
//! recovery's result is compared with the shadow
//! (`acknowledged-survives-recovery`), then the shadow starts from it.

use super::checker::Violation;
use super::device::{Latency, SimDir};
use super::disk::{DiskOp, Durable};
use super::host::ManualHost;
use super::pipe::Caller;
use super::trace::{chain, What};
use super::world::{Event, World};
use crate::api::Request;
use crate::consensus::{Body, Index, Message, Payload, RestoredState, Role, Term};
use crate::node::replica::tap::{GlueBug, MissingFound, Note};
use crate::node::replica::Replica;
use crate::storage::format::{decode_batch, BLOCK_BYTES};
use crate::storage::{LogDir, Wal, WalConfig};
use rand::Rng;
use std::collections::BTreeSet;

/// One group's production replica on one simulated node, with what the
/// world keeps beside it.
pub(crate) struct Hosted {
    pub(crate) replica: Replica<SimDir, ManualHost>,
    host: ManualHost,
    /// Last term in which it was seen leading.
    led_term: Term,
    /// Chain hash of what it applied (see `trace::chain`).
    chain: u64,
    /// When a wake-up for the device or the jobs is already scheduled.
    device_wake_ms: Option<u64>,
    jobs_wake_ms: Option<u64>,
    /// The log's `flushes_in_flight_max`: damage must lie further back
    /// than this many flushes from the end, or recovery rightly takes it
    /// for a torn tail.
    window: u64,
}

/// Where damage strikes a log: a batch of a segment file.
pub(crate) struct Damage {
    file: String,
    offset: u64,
    bytes: u64,
    first_index: Index,
    /// The batch lies below the snapshot (and holds entries the state
    /// refers to): Raft never sends it again, the replica repairs it from
    /// a peer.
    below: bool,
    /// Below the snapshot, the batch's whole segment may go instead: it
    /// holds nothing above the snapshot, nor the log's last batches.
    whole_file: bool,
    /// The entries the batch holds, and (`whole_file`) its segment
    /// (every batch in it, also those below what the state in memory
    /// refers to: the state at the durable snapshot may refer to them).
    batch_entries: BTreeSet<Index>,
    file_entries: BTreeSet<Index>,
}

/// A production replica's answer to one request of a client, as the
/// server would send it.
pub(crate) struct Answer {
    client: Caller,
    node: usize,
    /// The connection and request id it answers.
    conn: u64,
    id: u64,
    response: crate::api::Response,
    /// Why the node could not read an entry its state refers to, if that
    /// is what failed the request: the client only hears `Unavailable`,
    /// the run fails (`stored-bytes-readable`).
    unreadable: Option<String>,
}

/// The answers replies put here, drained by the world after each drive.
pub(crate) type Answers = std::sync::Arc<std::sync::Mutex<Vec<Answer>>>;

/// The indexes of the entries in every whole batch of segment `file`.
fn indexes_in_file(dev: &SimDir, file: &str) -> BTreeSet<Index> {
    let bytes = dev.contents(file).unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut off = 0;
    while off + BLOCK_BYTES <= bytes.len() {
        match decode_batch(&bytes[off..]) {
            Ok(b) => {
                out.extend(b.entries.iter().map(|e| e.index));
                off += b.disk_bytes;
            }
            Err(_) => off += BLOCK_BYTES,
        }
    }
    out
}

/// The scrub's rate under the simulator: a few passes over a run's logs.
const SIM_SCRUB_BYTES_PER_S: u64 = 256 << 10;

/// Chance that a repair answer carrying entries has one of them wrong.
const WRONG_REPAIR_COPY_PROBABILITY: f64 = 0.3;

/// The log's config under the simulator: small segments and batches, so
/// a run rolls, recycles and trims segments many times.
fn wal_config(w: &mut World) -> WalConfig {
    WalConfig {
        segment_bytes: 64 << 10,
        flush_bytes_max: w.rng.gen_range(2..=16) << 10,
        flushes_in_flight_max: w.rng.gen_range(1..=3),
        direct_io: false,
        read_cache_bytes: 64 << 10,
        segments_recycled_max: 2,
        planted_truncate_on_corruption: w.opts.glue_bug == Some(GlueBug::TruncateOnCorruption),
        ..WalConfig::default()
    }
}

/// What the production glue did in a run, summed over every replica and
/// every life of it: the sweep tests hold floors on these, so a path the
/// faults should reach and never do is noticed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlueCounts {
    /// Log opens: the real recovery scan, one per start of a replica.
    pub recoveries: u64,
    /// Recoveries that discarded a torn tail.
    pub torn_tails: u64,
    /// Damaged batches recovery found in the middle of a log and reported
    /// for repair (Raft re-fetches them from the leader).
    pub corruptions_found: u64,
    /// Group commits (WAL flushes) completed.
    pub flushes: u64,
    /// Appends the WAL refused for a full disk.
    pub disk_full_refusals: u64,
    /// Snapshots from a leader installed.
    pub snapshots_installed: u64,
    /// Chunks of snapshot images staged by followers.
    pub image_chunks_staged: u64,
    /// Staged images taken up again after a crash.
    pub images_resumed: u64,
    /// Snapshots of a replica's own adopted (its log compacted under them).
    pub snapshots_adopted: u64,
    /// Batches read back on the ring for answers (cold reads: ledger
    /// entries and queue messages below the snapshot).
    pub cold_reads: u64,
    /// Entries below the snapshot repaired from a peer.
    pub entries_repaired: u64,
    /// Copies from peers refused by their checks (the simulator's wrong
    /// repair copies).
    pub repair_copies_rejected: u64,
    /// Batches the background scrub read and found whole.
    pub scrub_batches_verified: u64,
    /// Damaged batches the scrub found (the faults damage a log only at
    /// a crash, where recovery finds it: any here is a false alarm).
    pub scrub_damaged_batches: u64,
    /// Times a leader stopped leading with client requests waiting on it.
    pub step_downs_with_waiters: u64,
    /// Client requests a leader answered (sent on) as it stopped leading.
    pub step_down_answers: u64,
}

impl GlueCounts {
    /// Adds another run's (or replica's) counts.
    pub fn add(&mut self, o: &GlueCounts) {
        self.recoveries += o.recoveries;
        self.torn_tails += o.torn_tails;
        self.corruptions_found += o.corruptions_found;
        self.flushes += o.flushes;
        self.disk_full_refusals += o.disk_full_refusals;
        self.snapshots_installed += o.snapshots_installed;
        self.snapshots_adopted += o.snapshots_adopted;
        self.image_chunks_staged += o.image_chunks_staged;
        self.images_resumed += o.images_resumed;
        self.entries_repaired += o.entries_repaired;
        self.repair_copies_rejected += o.repair_copies_rejected;
        self.scrub_batches_verified += o.scrub_batches_verified;
        self.scrub_damaged_batches += o.scrub_damaged_batches;
        self.cold_reads += o.cold_reads;
        self.step_downs_with_waiters += o.step_downs_with_waiters;
        self.step_down_answers += o.step_down_answers;
    }

    /// The counters one replica's life kept itself (its WAL's, its
    /// repair's).
    fn of_life(r: &Replica<SimDir, ManualHost>) -> GlueCounts {
        let m = r.wal.metrics();
        GlueCounts {
            flushes: m.flushes,
            disk_full_refusals: m.disk_full_refusals,
            cold_reads: m.cold_reads,
            repair_copies_rejected: r.repair_stats().rejected,
            scrub_batches_verified: r.scrub_stats().batches_verified,
            scrub_damaged_batches: r.scrub_stats().damaged_batches,
            image_chunks_staged: r.snapshot_stats.image_chunks_staged,
            images_resumed: r.snapshot_stats.images_resumed,
            ..GlueCounts::default()
        }
    }
}

impl World {
    /// The device holding group `g`'s log on node `n`, set up from the seed.
    pub(crate) fn new_device(&mut self, n: usize, g: usize) -> SimDir {
        let dir = SimDir::new(&format!("n{}/g{g}", n + 1), self.rng.gen());
        dir.set_latency(Some(Latency {
            min_us: self.p.disk_latency_min_ms * 1000,
            jitter_us: self.p.disk_jitter_ms * 1000,
            spike_probability: self.p.disk_spike_probability,
            spike_us_max: 200_000,
        }));
        dir
    }

    /// Opens group `g`'s replica on node `n` from its device: the real
    /// recovery, checked against the shadow, then the replica.
    pub(crate) fn start_hosted(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        if self.nodes[n].hosted[g].is_some() {
            return Ok(());
        }
        let dir = self.nodes[n].devices[g].clone();
        dir.set_now_us(self.now * 1000);
        let cfg = wal_config(self);
        let window = u64::from(cfg.flushes_in_flight_max);
        let (wal, report) = Wal::open_in(dir, cfg).map_err(|e| Violation {
            invariant: "log-reopens",
            detail: format!("n{} g{g}: the log does not reopen: {e}", n + 1),
        })?;
        self.glue.recoveries += 1;
        self.glue.torn_tails += u64::from(report.torn_tail.is_some());
        self.glue.corruptions_found += report.corruption.len() as u64;
        self.recovered_against_shadow(n, g, &report.restored)?;
        let restored = report.restored;
        let snapshot = restored.snapshot.clone();
        let host = ManualHost::seeded(self.rng.gen());
        host.set_now_us(self.now * 1000);
        let mut cfg = self.raft_config(n, g);
        cfg.snapshot_with_entries = true;
        let raft = crate::consensus::Raft::restore(cfg, self.rng.gen(), self.now, restored)
            .expect("the simulator draws valid timers and limits");
        let mut replica = Replica::new(g as u32, raft, wal, self.now, 1 << 20, host.clone());
        // On before the state's check, so what it finds missing is noted.
        replica.tap = Some(Vec::new());
        let mut chain = 0;
        if let Some(s) = &snapshot {
            if !replica.restore_state(s.index, &s.data) {
                return Err(Violation {
                    invariant: "log-reopens",
                    detail: format!(
                        "n{} g{g}: the snapshot at {} does not decode",
                        n + 1,
                        s.index
                    ),
                });
            }
            replica.check_stored_entries(MissingFound::Open);
            chain = self.chain_or_fail(g, s.index)?;
        }
        // An image staged before the crash goes on, as in the daemon.
        replica.resume_staged();
        // The scrub runs under the seed too; the faults damage a log only
        // at a crash, so it must find nothing a recovery did not.
        replica.set_scrub_rate(SIM_SCRUB_BYTES_PER_S);
        replica.planted = self.opts.glue_bug;
        replica.planted_workload = self.opts.workload_bug;
        self.nodes[n].hosted[g] = Some(Hosted {
            replica,
            host,
            led_term: 0,
            chain,
            device_wake_ms: None,
            jobs_wake_ms: None,
            window,
        });
        Ok(())
    }

    /// Where damage may strike group `g`'s log on node `n` so that
    /// recovery can tell it from a torn tail: a synced batch wholly above
    /// the snapshot followed by a durable batch more than the in-flight
    /// window later.
    pub(crate) fn damage_target(&mut self, n: usize, g: usize) -> Option<Damage> {
        let h = self.nodes[n].hosted[g].as_ref()?;
        let (lo, hi) = (h.replica.raft.first_index(), h.replica.wal.durable().0);
        if lo > hi {
            return None;
        }
        let located = h.replica.wal.locate(lo, hi).ok()?;
        let last_seq = located.last()?.1.seq;
        let window = h.window;
        let candidates: Vec<_> = located
            .into_iter()
            // Not a batch that also holds entries below the snapshot: Raft
            // repairs only its own log, and the entries the state keeps
            // below it come back from no peer yet (issue 24).
            .filter(|(_, l)| l.seq + window < last_seq && l.count > 0 && l.first_index >= lo)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (file, loc) = candidates[self.rng.gen_range(0..candidates.len())].clone();
        Some(Damage {
            file,
            offset: loc.offset,
            bytes: loc.disk_bytes,
            first_index: loc.first_index,
            below: false,
            whole_file: false,
            batch_entries: BTreeSet::new(),
            file_entries: BTreeSet::new(),
        })
    }

    /// Where damage below the snapshot may strike group `g`'s log on node
    /// `n`: a batch wholly at or below both the durable snapshot and
    /// Raft's first index, holding an entry the state refers to, and more
    /// than the in-flight window before the log's last batch (or recovery
    /// rightly takes it for a torn tail).
    pub(crate) fn damage_below_target(&mut self, n: usize, g: usize) -> Option<Damage> {
        let base = self.nodes[n].disks[g].durable.base().0;
        let h = self.nodes[n].hosted[g].as_ref()?;
        let limit = base.min(h.replica.raft.first_index().saturating_sub(1));
        let mut referenced = BTreeSet::new();
        h.replica.machine.each_stored(&mut |i| {
            if i <= limit {
                referenced.insert(i);
            }
        });
        let (&lo, &hi) = (referenced.first()?, referenced.last()?);
        // (Fails where a repaired copy stands in a batch's place: no
        // damage then.)
        let below = h.replica.wal.locate(lo, hi).ok()?;
        let durable = h.replica.wal.durable().0;
        let above = if durable > limit {
            h.replica.wal.locate(limit + 1, durable).ok()?
        } else {
            Vec::new()
        };
        let last_seq = above.last().or(below.last())?.1.seq;
        let last_file = above.last().or(below.last())?.0.clone();
        let window = h.window;
        let holds_referenced = |l: &crate::storage::recovery::BatchLocation| {
            referenced
                .range(l.first_index..l.first_index + l.count)
                .next()
                .is_some()
        };
        let candidates: Vec<_> = below
            .iter()
            .filter(|(_, l)| {
                l.count > 0
                    && l.first_index + l.count - 1 <= limit
                    && l.seq + window < last_seq
                    && holds_referenced(l)
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (file, loc) = candidates[self.rng.gen_range(0..candidates.len())].clone();
        let whole_file = file != last_file
            && above
                .iter()
                .chain(&below)
                .filter(|(f, _)| *f == file)
                .all(|(_, l)| l.first_index + l.count - 1 <= limit && l.seq + window < last_seq);
        let file_entries = indexes_in_file(&self.nodes[n].devices[g], &file);
        Some(Damage {
            offset: loc.offset,
            bytes: loc.disk_bytes,
            first_index: loc.first_index,
            below: true,
            whole_file,
            batch_entries: (loc.first_index..loc.first_index + loc.count).collect(),
            file_entries,
            file,
        })
    }

    /// Damages group `g`'s log on node `n` (after a crash) at `d`: one
    /// byte rots inside the batch, or (`misdirected`) the batch is zeros,
    /// as where a write reported durable never landed. The next recovery
    /// finds it; the shadow expects repair from the batch's first index.
    pub(crate) fn damage(&mut self, n: usize, g: usize, d: Damage, misdirected: bool) {
        let dev = self.nodes[n].devices[g].clone();
        if d.below {
            // Found at the next open (the scan checks every batch, or the
            // file is gone), repaired from a peer; the shadow, which holds
            // the log above the snapshot, is untouched.
            let whole = d.whole_file && self.rng.gen_bool(0.3);
            let lost = if whole {
                d.file_entries.clone()
            } else {
                d.batch_entries.clone()
            };
            let disk = &mut self.nodes[n].disks[g];
            disk.damaged_below.extend(lost.clone());
            disk.unrepaired_below.extend(lost);
            if whole {
                let gone = dev.remove(&d.file).and_then(|()| dev.sync());
                assert!(gone.is_ok(), "the segment exists: {gone:?}");
                self.faults.lost_segments += 1;
                self.record(n, g, What::Fault("lost-segment"));
                return;
            }
            self.faults.damaged_below_snapshot += 1;
            self.record(n, g, What::Fault("damage-below-snapshot"));
        }
        if misdirected {
            dev.rot(&d.file, d.offset, &vec![0u8; d.bytes as usize]);
            if !d.below {
                self.faults.misdirected_writes += 1;
                self.record(n, g, What::Fault("misdirected-write"));
            }
        } else {
            // Past the batch header, inside its entries.
            let at = d.offset + self.rng.gen_range(64..d.bytes.max(65));
            let Some(byte) = dev
                .contents(&d.file)
                .and_then(|b| b.get(at as usize).copied())
            else {
                return;
            };
            dev.rot(&d.file, at, &[byte ^ 0x5a]);
            if !d.below {
                self.faults.corruptions += 1;
                self.record(n, g, What::Fault("bit-rot"));
            }
        }
        // Recovery cannot tell how far back a rotten batch rewrote the log
        // (one below the snapshot too): it may distrust what follows, up to
        // what the batches before it say was committed, and fetch it again.
        self.nodes[n].disks[g].durable.damage_from(d.first_index);
    }

    /// The (node, group) replicas still repairing entries below their
    /// snapshots (a run is not over until they are done).
    pub(crate) fn repairing(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            for (g, h) in node.hosted.iter().enumerate() {
                if h.as_ref()
                    .is_some_and(|h| h.replica.repair_stats().missing > 0)
                {
                    out.push((n + 1, g));
                }
            }
        }
        out
    }

    /// Now and then makes one copy in a repair answer arriving at node
    /// `to` wrong, one that node still misses and will check, as if it had gone bad past
    /// the sender's own checks (a bad block read back as a good one, or
    /// memory corruption; the transport's MAC cannot tell): the receiver
    /// must refuse it by the check its state recorded.
    pub(crate) fn maybe_wrong_repair_copy(&mut self, to: usize, g: usize, msg: &mut Message) {
        let Body::RepairEntries { entries, .. } = &mut msg.body else {
            return;
        };
        let Some(h) = self.nodes[to].hosted[g].as_ref() else {
            return;
        };
        let wanted: Vec<usize> = (0..entries.len())
            .filter(|&k| h.replica.repair_checks(entries[k].index))
            .collect();
        if wanted.is_empty() || !self.rng.gen_bool(WRONG_REPAIR_COPY_PROBABILITY) {
            return;
        }
        let k = wanted[self.rng.gen_range(0..wanted.len())];
        let Payload::Normal(p) = &entries[k].payload else {
            return;
        };
        if p.is_empty() {
            return;
        }
        let mut bytes = p.to_vec();
        let at = self.rng.gen_range(0..bytes.len());
        bytes[at] ^= 0x5a;
        entries[k].payload = Payload::Normal(bytes.into());
        self.faults.wrong_repair_copies += 1;
        self.record(to, g, What::Fault("wrong-repair-copy"));
    }

    /// Fills group `g`'s device on node `n` until `until_ms`: nothing
    /// that needs more space succeeds (`ENOSPC`), so the log refuses new
    /// appends (`DiskFull`) until space returns.
    pub(crate) fn fill_disk(&mut self, n: usize, g: usize, until_ms: u64) {
        let dev = &self.nodes[n].devices[g];
        dev.set_capacity_bytes(Some(dev.used_bytes()));
        self.faults.disks_full += 1;
        self.record(n, g, What::Fault("disk-full"));
        self.schedule(until_ms, Event::DiskSpace { node: n, group: g });
    }

    fn chain_or_fail(&self, g: usize, index: Index) -> Result<u64, Violation> {
        self.checker.chain_at(g, index).ok_or_else(|| Violation {
            invariant: "state-machine-safety",
            detail: format!("group {g}: a snapshot at {index} that no node applied up to"),
        })
    }

    /// Acknowledged survives recovery: everything the shadow holds (the
    /// device synced it) is in what recovery returned, unless a write
    /// lost in the crash legitimately replaced it. Then the shadow starts
    /// from what recovery returned.
    fn recovered_against_shadow(
        &mut self,
        n: usize,
        g: usize,
        r: &RestoredState,
    ) -> Result<(), Violation> {
        let id = n as u64 + 1;
        let disk = &self.nodes[n].disks[g];
        let shadow = &disk.durable;
        let replaced_from = disk.lost_rewrite_from;
        let fail = |what: String| {
            Err(Violation {
                invariant: "acknowledged-survives-recovery",
                detail: format!("group {g}: n{id} {what}"),
            })
        };
        let hs = r.hard_state;
        let (sterm, svote) = (shadow.hard_state.term, shadow.hard_state.vote);
        if hs.term < sterm || (hs.term == sterm && svote.is_some() && hs.vote != svote) {
            return fail(format!(
                "recovered term {} vote {:?}, after term {sterm} vote {svote:?} was durable",
                hs.term, hs.vote
            ));
        }
        let r_base = r.snapshot.as_ref().map_or(0, |s| s.index);
        let r_last = r.entries.last().map_or(r_base, |e| e.index);
        let (s_base, _) = shadow.base();
        let s_last = shadow.last_index();
        // Rot the simulator planted, or found before and not yet repaired:
        // recovery must report it for repair (`repair_until`), never drop
        // what follows it silently.
        let damaged_from = shadow
            .latent_damage
            .into_iter()
            .chain(shadow.damaged.iter().map(|&(i, _)| i))
            .min();
        // (Recovery may also distrust entries below the damaged batch: it
        // cannot tell how far back a rotten batch rewrote the log.)
        let repairing = |i: Index| damaged_from.is_some() && r.repair_until.is_some_and(|u| i <= u);
        for (k, e) in shadow.entries.iter().enumerate() {
            let i = s_base + 1 + k as u64;
            if i <= r_base || replaced_from.is_some_and(|f| i >= f) || repairing(i) {
                continue;
            }
            let held = r
                .entries
                .get((i - r_base - 1) as usize)
                .is_some_and(|x| x.index == i && x.term == e.term);
            if !held {
                return fail(format!(
                    "recovered its log up to {r_last} without entry {i} (term {}), durable before",
                    e.term
                ));
            }
        }
        if r_last < s_last && replaced_from.is_none_or(|f| f > r_last + 1) && !repairing(s_last) {
            return fail(format!(
                "recovered its log up to {r_last}, durable up to {s_last} before"
            ));
        }
        let before_commit = shadow.hard_state.commit;
        // The shadow starts again from what recovery found.
        let base_chain = match &r.snapshot {
            Some(s) => Some(self.chain_or_fail(g, s.index)?),
            None => None,
        };
        // Entries recovery could not read stay on the platter: counted
        // as held (with their prefixes) until the node fetches them again.
        let mut damaged: Vec<(Index, u64)> = shadow
            .entries
            .iter()
            .zip(&shadow.prefix)
            .map(|(e, &p)| (e.index, p))
            .filter(|&(i, _)| i > r_last && repairing(i))
            .collect();
        for &(i, p) in &shadow.damaged {
            if i > r_last && repairing(i) && !damaged.iter().any(|&(j, _)| j == i) {
                damaged.push((i, p));
            }
        }
        let mut fresh = Durable {
            hard_state: r.hard_state,
            snapshot: r.snapshot.clone(),
            base_chain,
            repair_until: r.repair_until,
            damaged,
            ..Durable::default()
        };
        let mut prev = fresh.base().1;
        for e in &r.entries {
            prev = chain(prev, e);
            fresh.prefix.push(prev);
            fresh.entries.push(e.clone());
        }
        let news: Vec<(Index, Term, u64)> = fresh
            .entries
            .iter()
            .zip(&fresh.prefix)
            .map(|(e, &p)| (e.index, e.term, p))
            .collect();
        let disk = &mut self.nodes[n].disks[g];
        disk.durable = fresh;
        disk.lost_rewrite_from = None;
        for (index, term, prefix) in news {
            self.checker.durable_entry(g, id, index, term, prefix)?;
        }
        // The commit rides lazily in batch headers, but what one recovery
        // found, the next must find too, unless damage cut the log short
        // (the commit is capped at what recovery can vouch for).
        if damaged_from.is_some() {
            return Ok(());
        }
        self.checker
            .durable_commit(g, id, before_commit, r.hard_state.commit)
    }

    /// Group `g` stops on node `n` (its log failed, or the node crashed):
    /// the replica goes, its device loses what it did not sync.
    pub(crate) fn stop_hosted(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        let Some(h) = self.nodes[n].hosted[g].take() else {
            return Ok(());
        };
        let stats = h.replica.raft.stats();
        self.retired_elections += stats.elections_started;
        self.retired_snapshots += stats.snapshots_sent;
        self.retired_preferred_handovers += stats.preferred_leader_transfers;
        self.glue.add(&GlueCounts::of_life(&h.replica));
        drop(h);
        self.nodes[n].devices[g].crash();
        // A lost write that rewrote the log from an index may have reached
        // the platter anyway: recovery may then hold its entries instead.
        let lost = self.nodes[n].disks[g].take_volatile();
        let rewrite = lost
            .iter()
            .filter_map(|op| match op {
                DiskOp::Write {
                    truncate_from,
                    entries,
                    ..
                } => truncate_from.or(entries.first().map(|e| e.index)),
                DiskOp::Compact { .. } => None,
            })
            .min();
        let disk = &mut self.nodes[n].disks[g];
        disk.lost_rewrite_from = match (disk.lost_rewrite_from, rewrite) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.abandon_clients_on(n, g);
        self.abandon_state_clients_on(n, g);
        let disks = super::world::durables(&self.nodes, g);
        self.checker.confirmed_still_durable(g, &disks)
    }

    /// Runs group `g`'s replica on node `n`: due jobs, the Ready loop, the
    /// notes its tap took, durability on the device, the messages it
    /// released, the answers to clients; then schedules its next wake-up.
    pub(crate) fn drive_hosted(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        let now = self.now;
        self.nodes[n].devices[g].set_now_us(now * 1000);
        let Some(h) = self.nodes[n].hosted[g].as_mut() else {
            return Ok(());
        };
        h.host.set_now_us(now * 1000);
        if h.jobs_wake_ms.is_some_and(|t| t <= now) {
            h.jobs_wake_ms = None;
            h.host.run_next();
        }
        if h.device_wake_ms.is_some_and(|t| t <= now) {
            h.device_wake_ms = None;
        }
        let mut out = Vec::new();
        h.replica.drive(now, &mut out);
        let held = h.replica.requests_held();
        if h.replica.raft.role() != Role::Leader && held > 0 {
            return Err(Violation {
                invariant: "stepped-down-holds-no-request",
                detail: format!(
                    "group {g}: n{} no longer leads (term {}) and still holds {held} client requests it took as leader",
                    n + 1,
                    h.replica.raft.term()
                ),
            });
        }
        let became_leader =
            h.replica.raft.role() == Role::Leader && h.led_term != h.replica.raft.term();
        if became_leader {
            h.led_term = h.replica.raft.term();
            let term = h.led_term;
            self.leaders += 1;
            self.record(n, g, What::BecameLeader { term });
            self.checker.leader(g, term, n as u64 + 1)?;
            let h = self.nodes[n].hosted[g].as_ref().expect("live");
            self.checker.leader_complete(g, &h.replica.raft)?;
        }
        let stopped = self.take_notes(n, g)?;
        self.advance_shadow(n, g)?;
        for m in out {
            self.send(g, m)?;
        }
        self.take_ticket_answers(n, g);
        self.take_answers()?;
        if stopped {
            self.record(n, g, What::DiskEio);
            return self.stop_hosted(n, g);
        }
        self.schedule_wakes(n, g);
        Ok(())
    }

    /// Handles what the replica's tap noted; true if its log stopped.
    fn take_notes(&mut self, n: usize, g: usize) -> Result<bool, Violation> {
        let id = n as u64 + 1;
        let h = self.nodes[n].hosted[g].as_mut().expect("live");
        let notes = std::mem::take(h.replica.tap.as_mut().expect("tap on"));
        let mut stopped = false;
        let mut state_changed = false;
        let mut appends = Vec::new();
        for note in notes {
            match note {
                Note::Missing { index, found } => {
                    // Only the simulator's damage below the snapshot makes
                    // an entry the state refers to go missing; an install
                    // brings every entry its state refers to (the leader
                    // holds them all), so one missing after it is a bug
                    // (a snapshot sent without the entries it needs).
                    let damaged = self.nodes[n].disks[g].damaged_below.contains(&index);
                    if found == MissingFound::Install || !damaged {
                        return Err(Violation {
                            invariant: "stored-bytes-readable",
                            detail: format!(
                                "group {g}: n{id}'s state refers to log entry {index}, which its log does not hold ({found:?})"
                            ),
                        });
                    }
                }
                Note::SteppedDown { term, answered } => {
                    self.record(n, g, What::SteppedDown { term, answered });
                    if answered > 0 {
                        self.glue.step_downs_with_waiters += 1;
                        self.glue.step_down_answers += answered;
                    }
                }
                Note::Repaired { entries } => {
                    self.glue.entries_repaired += entries.len() as u64;
                    let disk = &mut self.nodes[n].disks[g];
                    for e in &entries {
                        disk.unrepaired_below.remove(&e.index);
                    }
                }
                Note::Wrote {
                    ticket,
                    truncate_from,
                    entries,
                    hard_state,
                } => {
                    // The commit alone rides lazily in batch headers: the
                    // shadow takes it from recovery, not from here.
                    let disk = &mut self.nodes[n].disks[g];
                    let hard_state = hard_state.map(|hs| crate::consensus::HardState {
                        commit: disk.durable.hard_state.commit,
                        ..hs
                    });
                    let op = DiskOp::Write {
                        snapshot: None,
                        snapshot_chain: None,
                        snapshot_entries: Vec::new(),
                        truncate_from,
                        entries,
                        hard_state,
                    };
                    disk.submit_as(ticket, op);
                }
                Note::Installed { snapshot } => {
                    self.glue.snapshots_installed += 1;
                    // Synchronous: everything before it was synced first.
                    self.advance_shadow(n, g)?;
                    let index = snapshot.index;
                    let base = self.chain_or_fail(g, index)?;
                    let disk = &mut self.nodes[n].disks[g];
                    if disk.has_volatile() {
                        return Err(Violation {
                            invariant: "snapshot-installed-after-sync",
                            detail: format!(
                                "group {g}: n{id} installed the snapshot at {index} before the writes queued ahead of it were synced on its device"
                            ),
                        });
                    }
                    disk.apply_now(DiskOp::Write {
                        snapshot: Some(snapshot),
                        snapshot_chain: Some(base),
                        snapshot_entries: Vec::new(),
                        truncate_from: None,
                        entries: Vec::new(),
                        hard_state: None,
                    });
                }
                Note::Adopted { index, ticket } => {
                    self.glue.snapshots_adopted += 1;
                    let Some(snapshot) = self.nodes[n].hosted[g]
                        .as_ref()
                        .and_then(|h| h.replica.raft.snapshot().cloned())
                        .filter(|s| s.index == index)
                    else {
                        continue;
                    };
                    let base = self.chain_or_fail(g, index)?;
                    let disk = &mut self.nodes[n].disks[g];
                    disk.submit_as(
                        ticket,
                        DiskOp::Compact {
                            snapshot,
                            snapshot_chain: Some(base),
                            retained: Vec::new(),
                        },
                    );
                }
                Note::Applied { entry } => {
                    state_changed = true;
                    if let crate::consensus::Payload::Normal(p) = &entry.payload {
                        if let Some(records) = crate::state::dedup::client_records(p) {
                            for (slot, (client, seq, _)) in records.enumerate() {
                                let address =
                                    crate::state::dedup::record_address(entry.index, slot);
                                appends.push((address, client, seq));
                            }
                        }
                    }
                    let h = self.nodes[n].hosted[g].as_mut().expect("live");
                    h.chain = chain(h.chain, &entry);
                    let c = h.chain;
                    self.checker.applied(g, id, entry.index, c)?;
                }
                Note::Restored { index } => {
                    state_changed = true;
                    let c = self.chain_or_fail(g, index)?;
                    let h = self.nodes[n].hosted[g].as_mut().expect("live");
                    h.chain = c;
                    self.checker.applied(g, id, index, c)?;
                }
                Note::Deduplicated { address } => self.checker.appends.deduplicated(g, address),
                Note::Stopped => stopped = true,
            }
        }
        self.served_once(n, g, appends)?;
        if state_changed && self.opts.workload != super::Workload::Log {
            let h = self.nodes[n].hosted[g].as_ref().expect("live");
            let (index, state) = (h.replica.applied, machine_hash(&h.replica.machine));
            self.checker.machine_state(g, id, index, state)?;
        }
        Ok(stopped)
    }

    /// Moves into the shadow every write whose ticket the device has
    /// synced, and checks what became durable.
    fn advance_shadow(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        let id = n as u64 + 1;
        let Some(h) = self.nodes[n].hosted[g].as_ref() else {
            return Ok(());
        };
        let wal = &h.replica.wal;
        // Positive evidence only: a ticket is durable once the device
        // synced a flush at or above it, and none below it is unsynced or
        // still queued in the WAL (a batch the WAL lost never counts).
        let device = &self.nodes[n].devices[g];
        let mut through = wal.current_ticket().min(device.highest_synced_token());
        let pending = [
            device.oldest_unsynced_token(),
            wal.oldest_unsubmitted_ticket(),
        ];
        for t in pending.into_iter().flatten() {
            through = through.min(t.saturating_sub(1));
        }
        let disk = &mut self.nodes[n].disks[g];
        let applied = disk.complete_through(through);
        for a in &applied {
            for &(index, term, prefix) in &a.new_entries {
                self.checker.durable_entry(g, id, index, term, prefix)?;
            }
        }
        Ok(())
    }

    /// Schedules the replica's next wake-up: its device's next completion,
    /// a queued job at a seeded delay (sometimes at once, so a snapshot
    /// can finish before the log is durable up to it).
    fn schedule_wakes(&mut self, n: usize, g: usize) {
        let now = self.now;
        let due = self.nodes[n].devices[g].next_due_us();
        let jobs = {
            let h = self.nodes[n].hosted[g].as_ref().expect("live");
            h.host.has_queued() && h.jobs_wake_ms.is_none()
        };
        let job_at = jobs.then(|| {
            if self.rng.gen_bool(0.3) {
                now
            } else {
                now + self.rng.gen_range(1..=30)
            }
        });
        let h = self.nodes[n].hosted[g].as_mut().expect("live");
        let mut wakes = Vec::new();
        if let Some(us) = due {
            let at = us.div_ceil(1000).max(now);
            if h.device_wake_ms.is_none_or(|t| at < t) {
                h.device_wake_ms = Some(at);
                wakes.push(at);
            }
        }
        if let Some(at) = job_at {
            h.jobs_wake_ms = Some(at);
            wakes.push(at);
        }
        for at in wakes {
            self.schedule(at, Event::Wake { node: n, group: g });
        }
    }

    /// Node `n` serves request `id` of client `who` on connection `conn`
    /// as the production server does (`client_conns::LoopClients`): the
    /// request translated (`client::dispatch::translate`), the append,
    /// command or query handed to the group's replica, its outcome turned
    /// into the response the client would read by the daemon's builders;
    /// it comes through `answers`. A ledger read waits for entries only
    /// when the request asks (the simulated clients never do), bounded by
    /// the replica's own deadline.
    pub(crate) fn serve_hosted(
        &mut self,
        who: Caller,
        n: usize,
        conn: u64,
        id: u64,
        request: Request,
    ) {
        use crate::node::client::dispatch::{
            answer_response, outcome_response, translate, Dispatch, NodeCall,
        };
        let g = self.caller_group(who);
        let answers = self.answers.clone();
        let answer = move |response, unreadable| {
            answers.lock().expect("answers").push(Answer {
                client: who,
                node: n,
                conn,
                id,
                response,
                unreadable,
            });
        };
        let addrs = client_addrs(self.nodes.len());
        let now = self.now;
        let runs = self.nodes[n].runs(g);
        let dispatch = translate(request, |group| group as usize == g && runs);
        let Dispatch::Call(call) = dispatch else {
            if let Dispatch::Answer(response) = dispatch {
                answer(response, None);
            }
            return;
        };
        let replica = &mut self.nodes[n].hosted[g].as_mut().expect("runs").replica;
        match call {
            NodeCall::Append {
                client_id,
                seq,
                data,
                ..
            } => {
                // By ticket, as a loop-served connection's append: the
                // outcome is taken after the replica's next drive.
                let ticket = crate::node::ClientTicket {
                    core: n,
                    conn: conn as u32,
                    generation: (conn >> 32) as u32,
                    request: id,
                    item: 0,
                };
                replica.propose_client_ticket(client_id, seq, &data, ticket);
                self.ticket_callers.insert((n, conn, id), who);
            }
            NodeCall::State {
                client_id,
                seq,
                command,
                ..
            } => replica.propose_command(
                client_id,
                seq,
                command,
                now,
                Box::new(move |r| {
                    let why = unreadable(&r);
                    answer(outcome_response(r, &addrs), why)
                }),
            ),
            NodeCall::Query { query, wait_ms, .. } => replica.query(
                query,
                wait_ms,
                Box::new(move |r| {
                    let why = unreadable(&r);
                    answer(answer_response(r, &addrs), why)
                }),
            ),
            other => panic!("the simulated clients send no {other:?}"),
        }
    }

    /// Asks node `n`'s read path about each client append
    /// (index, client id, seq) it just applied: one it serves is applied.
    fn served_once(
        &mut self,
        n: usize,
        g: usize,
        appends: Vec<(Index, u64, u64)>,
    ) -> Result<(), Violation> {
        for (address, client, seq) in appends {
            let Some(h) = self.nodes[n].hosted[g].as_mut() else {
                return Ok(());
            };
            // The read path's own decision, without a log read: a read
            // here would be I/O the run did not ask for.
            let served = h.replica.serves(address);
            self.checker.appends.applied(g, client, seq, address);
            if served {
                self.checker.appends.served(g, client, seq, address)?;
            }
        }
        Ok(())
    }

    /// The glue's counts so far: the retired lives' and the live ones'.
    pub(crate) fn glue_counts(&self) -> GlueCounts {
        let mut counts = self.glue;
        for h in self.nodes.iter().flat_map(|n| n.hosted.iter().flatten()) {
            counts.add(&GlueCounts::of_life(&h.replica));
        }
        counts
    }

    /// Hands the outcomes of node `n` group `g`'s ticketed appends to
    /// their clients.
    fn take_ticket_answers(&mut self, n: usize, g: usize) {
        let mut done = Vec::new();
        if let Some(h) = self.nodes[n].hosted[g].as_mut() {
            h.replica.take_client_done(&mut done);
        }
        let addrs = client_addrs(self.nodes.len());
        for (t, r) in done {
            let conn = u64::from(t.conn) | u64::from(t.generation) << 32;
            if let Some(who) = self.ticket_callers.remove(&(n, conn, t.request)) {
                let response = crate::node::client::dispatch::appended_response(r, &addrs);
                self.respond(who, n, conn, t.request, &response);
            }
        }
    }

    /// Hands the replicas' answers to their clients.
    pub(crate) fn take_answers(&mut self) -> Result<(), Violation> {
        let answers = std::mem::take(&mut *self.answers.lock().expect("answers"));
        for a in answers {
            if let Some(why) = a.unreadable {
                let g = self.caller_group(a.client);
                return Err(Violation {
                    invariant: "stored-bytes-readable",
                    detail: format!("node {} group {g}: {why}", a.node + 1),
                });
            }
            self.respond(a.client, a.node, a.conn, a.id, &a.response);
        }
        Ok(())
    }

    /// Whether group `g`'s leader on `n` must step down: its own disk has
    /// had a write pending for `stall_ms` (the production rule).
    pub(crate) fn hosted_disk_stalled(&self, n: usize, g: usize, stall_ms: u64) -> bool {
        self.nodes[n].hosted[g]
            .as_ref()
            .is_some_and(|h| h.replica.disk_stalled(self.now, stall_ms))
    }
}

/// A hash of a state machine's snapshot, the same in every run (SipHash
/// with its fixed default keys).
pub(crate) fn machine_hash(sm: &crate::state::StateMachine) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(&sm.snapshot());
    hasher.finish()
}

/// Why a request failed for an entry its node could not read, if it did.
fn unreadable<T>(r: &Result<T, crate::node::ProposeError>) -> Option<String> {
    match r {
        Err(crate::node::ProposeError::Unreadable(why)) => Some(why.clone()),
        _ => None,
    }
}

/// The client addresses a `NotLeader` names the leader by: the
/// simulated clients reach node `i + 1` at address `i`.
fn client_addrs(nodes: usize) -> std::collections::BTreeMap<crate::consensus::NodeId, String> {
    (0..nodes)
        .map(|i| (i as u64 + 1, format!("n{}", i + 1)))
        .collect()
}

/// The planted glue bugs by their command-line names.
pub const GLUE_BUGS: [(&str, GlueBug); 6] = [
    ("release-before-durable", GlueBug::ReleaseBeforeDurable),
    ("truncate-on-corruption", GlueBug::TruncateOnCorruption),
    ("adopt-unsynced-snapshot", GlueBug::AdoptUnsyncedSnapshot),
    ("retry-applied-twice", GlueBug::RetryAppliedTwice),
    ("retry-wrong-index", GlueBug::RetryWrongIndex),
    ("step-down-answers-ok", GlueBug::StepDownAnswersOk),
];
