//! Idempotent appends: each client append carries the client's id and a
//! sequence number, so a retry (after a timeout, a lost reply or a leader
//! failover) is recognised when applied and answered with the index of
//! the original instead of being applied twice. The table is part of the
//! state machine: every replica builds the same one from the same log, and
//! it travels in snapshots.
//!
//! A client entry's payload: `0xC1 | client_id u64 LE | seq u64 LE | data`.
//! Per client the table keeps the last `WINDOW` sequence numbers applied,
//! their addresses and a fingerprint of their bytes; a sequence number
//! older than the window is refused as a duplicate of something forgotten
//! (clients keep fewer in flight). Its memory is bounded in bytes
//! (`REMEMBERED_BYTES_MAX` per group): past it, the clients idle the
//! longest forget their windows, and their retries are refused as
//! forgotten rather than applied twice.
//!
//! The fingerprint (length and CRC32C of the request's bytes) tells a
//! retry from a collision: the same (client, seq) with other bytes means
//! two clients drew the same id or one reused a sequence number, and it is
//! refused ([`Applied::Conflict`]) rather than answered with the index of
//! someone else's record. Client ids are 64 random bits from the OS
//! (`client::random_client_id`), so such a collision is itself rare; the
//! fingerprint makes it visible instead of a silent loss.

use crate::consensus::Index;

/// First byte of a client entry.
pub const CLIENT_ENTRY: u8 = 0xC1;
/// Header bytes of a client entry.
pub const CLIENT_HEADER_BYTES: usize = 17;
/// Sequence numbers remembered per client.
pub const WINDOW: usize = 4096;
/// Clients remembered; the least recently active is forgotten beyond it.
pub const CLIENTS_MAX: usize = 65_536;

/// Encodes a client entry's payload.
pub fn encode_client_entry(client_id: u64, seq: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLIENT_HEADER_BYTES + data.len());
    out.push(CLIENT_ENTRY);
    out.extend_from_slice(&client_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// Splits a client entry's payload into (client id, seq, data); `None`
/// for any other payload.
pub fn decode_client_entry(payload: &[u8]) -> Option<(u64, u64, &[u8])> {
    if payload.len() < CLIENT_HEADER_BYTES || payload[0] != CLIENT_ENTRY {
        return None;
    }
    let id = u64::from_le_bytes(payload[1..9].try_into().ok()?);
    let seq = u64::from_le_bytes(payload[9..17].try_into().ok()?);
    Some((id, seq, &payload[CLIENT_HEADER_BYTES..]))
}

/// First byte of a client batch entry: the records of one or more client
/// appends gathered in one leader turn, one Raft entry for all of them.
/// `0xC3 | count u32 LE | count × (client_id u64 | seq u64 | len u32 | data)`.
pub const CLIENT_BATCH_ENTRY: u8 = 0xC3;
/// Header bytes of a client batch entry (the tag and the count).
pub const CLIENT_BATCH_HEADER_BYTES: usize = 5;
/// Bytes before each record's data in a client batch entry.
pub const CLIENT_RECORD_HEADER_BYTES: usize = 20;
/// Low bits of a record address that number the record in its entry.
pub const RECORD_SLOT_BITS: u32 = 16;
/// Records one entry holds at most (every record of the largest
/// `AppendBatch`, `api::ITEMS_MAX`, fits in one entry).
pub const RECORDS_PER_ENTRY_MAX: usize = 1 << RECORD_SLOT_BITS;

/// The address of record `slot` of the entry at `index`: what an append
/// is answered with and a read starts from. Ordered as the log is; the
/// addresses of one entry's records are consecutive.
pub fn record_address(index: Index, slot: usize) -> u64 {
    debug_assert!(slot < RECORDS_PER_ENTRY_MAX);
    (index << RECORD_SLOT_BITS) | slot as u64
}

/// The log index of the entry holding the record at `address`.
pub fn address_index(address: u64) -> Index {
    address >> RECORD_SLOT_BITS
}

/// Starts a client batch entry in `out` (cleared first).
pub fn begin_client_batch(out: &mut Vec<u8>) {
    out.clear();
    out.push(CLIENT_BATCH_ENTRY);
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Appends one record to the client batch entry begun in `out`.
pub fn push_client_record(out: &mut Vec<u8>, client_id: u64, seq: u64, data: &[u8]) {
    let count = u32::from_le_bytes(out[1..5].try_into().expect("a begun batch"));
    out[1..5].copy_from_slice(&(count + 1).to_le_bytes());
    out.extend_from_slice(&client_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
}

/// The records of a client entry (one, in the single-record format) or of
/// a client batch entry, in slot order, as (client id, seq, data); `None`
/// for any other payload. A batch whose bytes end early, or hold more
/// than its count says, yields the records that decode whole and stops:
/// every replica decodes the same bytes alike.
pub fn client_records(payload: &[u8]) -> Option<ClientRecords<'_>> {
    match payload.first() {
        Some(&CLIENT_ENTRY) => decode_client_entry(payload).map(ClientRecords::one),
        Some(&CLIENT_BATCH_ENTRY) => ClientRecords::batch(payload, RECORDS_PER_ENTRY_MAX),
        _ => None,
    }
}

/// The records of a client entry: see [`client_records`].
pub struct ClientRecords<'a> {
    single: Option<(u64, u64, &'a [u8])>,
    rest: &'a [u8],
    left: usize,
}

impl<'a> ClientRecords<'a> {
    /// One record, as an entry in a single-record format holds it.
    pub(crate) fn one(record: (u64, u64, &'a [u8])) -> ClientRecords<'a> {
        ClientRecords {
            single: Some(record),
            rest: &[],
            left: 0,
        }
    }

    /// The records of a batch in the layout of a client batch entry
    /// (`tag | count u32 | records`), whatever its tag, at most
    /// `records_max` of them; `None` if the header is cut short.
    pub(crate) fn batch(payload: &'a [u8], records_max: usize) -> Option<ClientRecords<'a>> {
        let count = u32::from_le_bytes(payload.get(1..CLIENT_BATCH_HEADER_BYTES)?.try_into().ok()?);
        Some(ClientRecords {
            single: None,
            rest: &payload[CLIENT_BATCH_HEADER_BYTES..],
            left: (count as usize).min(records_max),
        })
    }
}

impl<'a> Iterator for ClientRecords<'a> {
    type Item = (u64, u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(r) = self.single.take() {
            return Some(r);
        }
        if self.left == 0 || self.rest.len() < CLIENT_RECORD_HEADER_BYTES {
            return None;
        }
        let h = &self.rest[..CLIENT_RECORD_HEADER_BYTES];
        let client = u64::from_le_bytes(h[0..8].try_into().ok()?);
        let seq = u64::from_le_bytes(h[8..16].try_into().ok()?);
        let len = u32::from_le_bytes(h[16..20].try_into().ok()?) as usize;
        let body = &self.rest[CLIENT_RECORD_HEADER_BYTES..];
        if body.len() < len {
            self.left = 0;
            return None;
        }
        self.rest = &body[len..];
        self.left -= 1;
        Some((client, seq, &body[..len]))
    }
}

/// A request's fingerprint: its length and CRC32C, never 0 (0 stands for
/// "not recorded", in tables restored from snapshots written before
/// fingerprints, and matches any bytes).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    fingerprint_of_crc(crc32c::crc32c(bytes), bytes.len())
}

/// `fingerprint` of `len` bytes whose CRC32C is `crc`, for a caller that
/// has the CRC already (apply hashes each record's bytes once).
pub fn fingerprint_of_crc(crc: u32, len: usize) -> u64 {
    ((len as u64 + 1) << 32) | u64::from(crc)
}

/// What applying a client entry found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// New: apply it; it is now recorded at this index.
    New,
    /// Already applied at this index: do not apply again.
    Duplicate(Index),
    /// The same (client, seq) was applied at this index with other bytes:
    /// do not apply, and refuse it.
    Conflict(Index),
    /// Older than the window: it may have been applied; do not apply.
    Forgotten,
}

/// One remembered request: its seq, the address it was applied at, and
/// its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    seq: u64,
    index: Index,
    fingerprint: u64,
}

/// What the table accounts for one remembered request, in bytes (a
/// [`Seen`] in a chunk of the persistent vector).
pub const SEEN_BYTES: usize = std::mem::size_of::<Seen>();
/// What it accounts for one remembered client: its map entry and the
/// vector's header and tail chunk slack, rounded up.
pub const CLIENT_BYTES: usize = 256;
/// Memory the table may hold per group, in bytes ([`SEEN_BYTES`] per
/// request, [`CLIENT_BYTES`] per client): past it, the clients idle the
/// longest forget their windows. Without it, `CLIENTS_MAX` full windows
/// would take gigabytes. The same on every replica: what is forgotten is
/// part of the replicated state.
pub const REMEMBERED_BYTES_MAX: usize = 64 << 20;

#[derive(Clone, Debug, Default)]
struct Client {
    /// The last `WINDOW` applied, by seq ascending: a persistent vector,
    /// so a snapshot's copy of the table shares it.
    recent: imbl::Vector<Seen>,
    /// Address of its last applied record (for forgetting idle clients).
    last_index: Index,
    /// Seqs below this may have been applied and are no longer
    /// remembered: refused as [`Applied::Forgotten`].
    forgotten_below: u64,
    /// No seq in `recent` is above this: a pipelining client's next seq
    /// is, and then the window is not searched (`Vector::back` walks the
    /// tree; it was a fifth of `apply`).
    seq_max: u64,
}

/// The remembered state only: `seq_max` is a bound derived from it.
impl PartialEq for Client {
    fn eq(&self, other: &Client) -> bool {
        self.recent == other.recent
            && self.last_index == other.last_index
            && self.forgotten_below == other.forgotten_below
    }
}

impl Eq for Client {}

impl Client {
    /// The remembered request with `seq`: a binary search, skipped for a
    /// pipelining client's next seq (above every one remembered).
    fn find(&self, seq: u64) -> Option<&Seen> {
        if self.recent.is_empty() || seq > self.seq_max {
            return None;
        }
        let at = self.recent.binary_search_by_key(&seq, |s| s.seq).ok()?;
        self.recent.get(at)
    }
}

/// The table of applied client sequence numbers. Its maps are persistent
/// (`imbl`), so a snapshot captures it in O(1) and the live table copies
/// only the chunks it changes afterwards.
#[derive(Clone, Debug)]
pub struct DedupTable {
    clients: imbl::OrdMap<u64, Client>,
    /// Requests remembered, over all clients.
    remembered: usize,
    /// `REMEMBERED_BYTES_MAX`, smaller in tests.
    bytes_max: usize,
}

impl Default for DedupTable {
    fn default() -> Self {
        DedupTable {
            clients: imbl::OrdMap::new(),
            remembered: 0,
            bytes_max: REMEMBERED_BYTES_MAX,
        }
    }
}

/// The remembered state only: the count is derived from it.
impl PartialEq for DedupTable {
    fn eq(&self, other: &DedupTable) -> bool {
        self.clients == other.clients
    }
}

impl Eq for DedupTable {}

/// First four bytes of a table encoded with fingerprints, in apply order
/// and without `forgotten_below`. Tables encoded before that start with
/// their client count, which is at most `CLIENTS_MAX` and so never
/// equals this.
const FINGERPRINTED_MAGIC: u32 = u32::from_le_bytes(*b"QDD2");
/// First four bytes of a table encoded with each client's
/// `forgotten_below`, windows by seq.
const FORGETFUL_MAGIC: u32 = u32::from_le_bytes(*b"QDD3");

impl DedupTable {
    /// Records `(client, seq)` applied at `index` with bytes of
    /// `fingerprint`, or says it already was (or was, with other bytes).
    /// O(log) in the window and the clients; forgetting (past
    /// `CLIENTS_MAX` or `REMEMBERED_BYTES_MAX`) is done in batches, so it
    /// is O(1) per request amortised.
    pub fn apply(&mut self, client: u64, seq: u64, index: Index, fingerprint: u64) -> Applied {
        let seen = Seen {
            seq,
            index,
            fingerprint,
        };
        // One lookup for a known client (every request but its first).
        let Some(c) = self.clients.get_mut(&client) else {
            if self.clients.len() >= CLIENTS_MAX {
                self.forget_idle_clients();
            }
            let mut c = Client {
                last_index: index,
                seq_max: seq,
                ..Client::default()
            };
            c.recent.push_back(seen);
            self.clients.insert(client, c);
            self.remembered += 1;
            self.bound_bytes();
            return Applied::New;
        };
        if let Some(seen) = c.find(seq) {
            let same = seen.fingerprint == 0 || seen.fingerprint == fingerprint;
            return if same {
                Applied::Duplicate(seen.index)
            } else {
                Applied::Conflict(seen.index)
            };
        }
        // Everything forgotten is below `forgotten_below`, so a seq at or
        // above it that is not in the window was never applied.
        if seq < c.forgotten_below {
            return Applied::Forgotten;
        }
        if seq > c.seq_max || c.recent.is_empty() {
            c.recent.push_back(seen);
        } else {
            // A request sent before the newest: in seq order.
            let at = c
                .recent
                .binary_search_by_key(&seq, |s| s.seq)
                .unwrap_or_else(|a| a);
            c.recent.insert(at, seen);
        }
        c.seq_max = c.seq_max.max(seq);
        c.last_index = index;
        if c.recent.len() > WINDOW {
            if let Some(old) = c.recent.pop_front() {
                c.forgotten_below = c.forgotten_below.max(old.seq + 1);
            }
        } else {
            self.remembered += 1;
            self.bound_bytes();
        }
        Applied::New
    }

    /// Past `REMEMBERED_BYTES_MAX`, forgets the idlest windows.
    fn bound_bytes(&mut self) {
        if self.remembered_bytes() > self.bytes_max {
            self.forget_idle_windows();
        }
    }

    /// Bytes the table accounts for (see [`REMEMBERED_BYTES_MAX`]).
    pub fn remembered_bytes(&self) -> usize {
        self.remembered * SEEN_BYTES + self.clients.len() * CLIENT_BYTES
    }

    /// The clients by how long they have been idle, longest first
    /// (deterministic: every replica applies the same entries).
    fn idlest_first(&self) -> Vec<(Index, u64)> {
        let mut by_idle: Vec<(Index, u64)> = self
            .clients
            .iter()
            .map(|(&id, c)| (c.last_index, id))
            .collect();
        by_idle.sort_unstable();
        by_idle
    }

    /// At `CLIENTS_MAX`: forgets the eighth of the clients idle the
    /// longest, whole (a retry of theirs would be new again: the clients
    /// a bound cannot keep), in one pass for many new clients.
    fn forget_idle_clients(&mut self) {
        let forget = (self.clients.len() / 8).max(1);
        for (_, id) in self.idlest_first().into_iter().take(forget) {
            if let Some(c) = self.clients.remove(&id) {
                self.remembered -= c.recent.len();
            }
        }
    }

    /// Past `REMEMBERED_BYTES_MAX`: the clients idle the longest forget
    /// their windows (their retries are refused as forgotten, never
    /// applied twice) until the table is down to seven eighths of it.
    fn forget_idle_windows(&mut self) {
        let target = self.bytes_max / 8 * 7;
        for (_, id) in self.idlest_first() {
            if self.remembered_bytes() <= target {
                break;
            }
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            if let Some(newest) = c.recent.back() {
                c.forgotten_below = c.forgotten_below.max(newest.seq + 1);
                self.remembered -= c.recent.len();
                c.recent = imbl::Vector::new();
            }
        }
    }

    /// Clients remembered.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// True if no client is remembered.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Appends the table's encoding (for snapshots) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&FORGETFUL_MAGIC.to_le_bytes());
        out.extend_from_slice(&(self.clients.len() as u32).to_le_bytes());
        for (id, c) in &self.clients {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&c.last_index.to_le_bytes());
            out.extend_from_slice(&c.forgotten_below.to_le_bytes());
            out.extend_from_slice(&(c.recent.len() as u32).to_le_bytes());
            for s in &c.recent {
                out.extend_from_slice(&s.seq.to_le_bytes());
                out.extend_from_slice(&s.index.to_le_bytes());
                out.extend_from_slice(&s.fingerprint.to_le_bytes());
            }
        }
    }

    /// Decodes a table from the start of `bytes` (this encoding, or one
    /// from before: without `forgotten_below`, or also without
    /// fingerprints, which read as 0); returns it and the bytes used, or
    /// `None` if they are not a valid table (a snapshot is untrusted
    /// input: bounds are checked before anything is allocated). A table
    /// over `REMEMBERED_BYTES_MAX` (from an older node) is trimmed as
    /// `apply` would.
    pub fn decode(bytes: &[u8]) -> Option<(DedupTable, usize)> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = bytes.get(at..at.checked_add(n)?)?;
            at += n;
            Some(s)
        };
        let u32_ = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let u64_ = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let mut n = u32_(take(4)?);
        let (fingerprinted, forgetful) = match n {
            FORGETFUL_MAGIC => (true, true),
            FINGERPRINTED_MAGIC => (true, false),
            _ => (false, false),
        };
        if fingerprinted {
            n = u32_(take(4)?);
        }
        if n as usize > CLIENTS_MAX {
            return None;
        }
        let mut table = DedupTable::default();
        for _ in 0..n {
            let id = u64_(take(8)?);
            let last_index = u64_(take(8)?);
            let forgotten = if forgetful {
                Some(u64_(take(8)?))
            } else {
                None
            };
            let k = u32_(take(4)?) as usize;
            if k > WINDOW {
                return None;
            }
            let mut recent = Vec::with_capacity(k);
            for _ in 0..k {
                let (seq, index) = (u64_(take(8)?), u64_(take(8)?));
                let fingerprint = if fingerprinted { u64_(take(8)?) } else { 0 };
                recent.push(Seen {
                    seq,
                    index,
                    fingerprint,
                });
            }
            // Older encodings kept apply order; a full window refused
            // anything older than its oldest.
            recent.sort_by_key(|s| s.seq);
            let forgotten_below = forgotten.unwrap_or_else(|| {
                if k == WINDOW {
                    recent.first().map_or(0, |s| s.seq)
                } else {
                    0
                }
            });
            table.remembered += k;
            let client = Client {
                seq_max: recent.last().map_or(0, |s| s.seq),
                recent: recent.into_iter().collect(),
                last_index,
                forgotten_below,
            };
            if table.clients.insert(id, client).is_some() {
                return None; // the same client twice
            }
        }
        if table.remembered_bytes() > table.bytes_max {
            table.forget_idle_windows();
        }
        Some((table, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl DedupTable {
        fn with_bytes_max(bytes_max: usize) -> DedupTable {
            DedupTable {
                bytes_max,
                ..DedupTable::default()
            }
        }
    }

    #[test]
    fn memory_is_bounded_in_bytes_and_the_idlest_forget_without_duplicates() {
        let max = 100 * CLIENT_BYTES + 2_000 * SEEN_BYTES;
        let mut t = DedupTable::with_bytes_max(max);
        let mut address = 0;
        let mut last = [0; 20];
        // Ten clients send 150 requests each, then ten others do: 3,000
        // remembered would be over the bound.
        for client in 0..20 {
            for seq in 0..150 {
                address += 1;
                assert_eq!(t.apply(client, seq, address, 1), Applied::New);
                assert!(
                    t.remembered_bytes() <= max,
                    "{} > {max}",
                    t.remembered_bytes()
                );
            }
            last[client as usize] = address;
        }
        // The idlest (the first few) forgot theirs: a retry is refused,
        // never applied again.
        assert_eq!(t.apply(0, 149, address + 1, 1), Applied::Forgotten);
        assert_eq!(t.apply(0, 5, address + 2, 1), Applied::Forgotten);
        // The others still answer retries with their index.
        assert_eq!(t.apply(9, 149, address + 3, 1), Applied::Duplicate(last[9]));
        assert_eq!(
            t.apply(19, 149, address + 4, 1),
            Applied::Duplicate(last[19])
        );
        // A client that forgot still takes new requests, and remembers them.
        assert_eq!(t.apply(0, 150, address + 5, 1), Applied::New);
        assert_eq!(
            t.apply(0, 150, address + 6, 1),
            Applied::Duplicate(address + 5)
        );
        // What was forgotten travels in the snapshot.
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        let (mut back, _) = DedupTable::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.apply(0, 149, address + 7, 1), Applied::Forgotten);
    }

    #[test]
    fn past_clients_max_the_idlest_eighth_is_forgotten_at_once() {
        let mut t = DedupTable::default();
        for client in 0..CLIENTS_MAX as u64 {
            t.apply(client, 1, client + 1, 1);
        }
        assert_eq!(t.len(), CLIENTS_MAX);
        let new = CLIENTS_MAX as u64;
        assert_eq!(t.apply(new, 1, new + 1, 1), Applied::New);
        assert_eq!(t.len(), CLIENTS_MAX - CLIENTS_MAX / 8 + 1);
        // The idlest went, the rest are remembered.
        assert_eq!(t.apply(0, 1, new + 2, 1), Applied::New);
        let kept = (CLIENTS_MAX / 8) as u64;
        assert_eq!(t.apply(kept, 1, new + 3, 1), Applied::Duplicate(kept + 1));
    }

    #[test]
    fn a_snapshot_copy_is_shared_and_unchanged_by_later_applies() {
        let mut t = DedupTable::default();
        for seq in 0..500 {
            t.apply(seq % 7, seq, seq + 1, fingerprint(&seq.to_le_bytes()));
        }
        let copy = t.clone();
        assert!(copy.clients.ptr_eq(&t.clients), "the copy shares the table");
        let mut before = Vec::new();
        copy.encode(&mut before);
        for seq in 500..1_000 {
            t.apply(seq % 11, seq, seq + 1, 3);
        }
        let mut after = Vec::new();
        copy.encode(&mut after);
        assert_eq!(
            before, after,
            "the live table's changes do not reach the copy"
        );
        assert_ne!(copy, t);
    }

    #[test]
    fn a_batch_entry_yields_its_records_in_slot_order() {
        let mut b = Vec::new();
        begin_client_batch(&mut b);
        push_client_record(&mut b, 7, 1, b"one");
        push_client_record(&mut b, 8, 5, b"");
        push_client_record(&mut b, 7, 2, &[9; 300]);
        let got: Vec<_> = client_records(&b).unwrap().collect();
        assert_eq!(
            got,
            vec![
                (7, 1, &b"one"[..]),
                (8, 5, &b""[..]),
                (7, 2, &[9u8; 300][..])
            ]
        );
        let single = encode_client_entry(3, 4, b"x");
        assert_eq!(
            client_records(&single).unwrap().collect::<Vec<_>>(),
            vec![(3, 4, &b"x"[..])]
        );
        assert!(client_records(b"raw bytes").is_none());
        assert!(client_records(&[]).is_none());
    }

    #[test]
    fn a_cut_or_lying_batch_yields_only_whole_records() {
        let mut b = Vec::new();
        begin_client_batch(&mut b);
        push_client_record(&mut b, 1, 1, b"whole");
        push_client_record(&mut b, 1, 2, b"cut short");
        let first_end = CLIENT_BATCH_HEADER_BYTES + CLIENT_RECORD_HEADER_BYTES + b"whole".len();
        for cut in 0..b.len() {
            let n = client_records(&b[..cut]).map_or(0, |r| r.count());
            let whole = usize::from(cut >= first_end);
            assert_eq!(n, whole, "cut at {cut} of {}", b.len());
        }
        assert_eq!(client_records(&b).unwrap().count(), 2);
        // A count above what follows stops at the bytes' end.
        b[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(client_records(&b).unwrap().count(), 2);
    }

    #[test]
    fn record_addresses_order_as_the_log_and_split_back() {
        let a = record_address(5, 3);
        assert_eq!((address_index(a), a - record_address(5, 0)), (5, 3));
        assert!(record_address(5, RECORDS_PER_ENTRY_MAX - 1) < record_address(6, 0));
        assert_eq!(
            record_address(6, 0),
            record_address(5, RECORDS_PER_ENTRY_MAX - 1) + 1
        );
    }

    #[test]
    fn a_retry_below_the_newest_seq_is_found_also_after_a_snapshot() {
        let mut t = DedupTable::default();
        assert_eq!(t.apply(1, 5, 10, 0), Applied::New);
        // Out of order (a retry of a request sent before 5): new, and
        // found afterwards though it is below the newest seq.
        assert_eq!(t.apply(1, 3, 11, 0), Applied::New);
        assert_eq!(t.apply(1, 3, 12, 0), Applied::Duplicate(11));
        assert_eq!(t.apply(1, 5, 13, 0), Applied::Duplicate(10));
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        let (mut back, _) = DedupTable::decode(&bytes).expect("decodes");
        assert_eq!(back, t);
        assert_eq!(back.apply(1, 3, 14, 0), Applied::Duplicate(11));
        assert_eq!(back.apply(1, 6, 15, 0), Applied::New);
    }

    #[test]
    fn a_retry_is_answered_with_the_original_index() {
        let mut t = DedupTable::default();
        assert_eq!(t.apply(7, 1, 10, 1), Applied::New);
        assert_eq!(t.apply(7, 2, 11, 2), Applied::New);
        assert_eq!(t.apply(7, 1, 12, 1), Applied::Duplicate(10));
        assert_eq!(t.apply(8, 1, 13, 9), Applied::New, "another client's seq 1");
    }

    #[test]
    fn a_reused_id_and_seq_with_other_bytes_is_a_conflict() {
        let mut t = DedupTable::default();
        let (a, b) = (fingerprint(b"record from client A"), fingerprint(b"from B"));
        assert_ne!(a, b);
        assert_eq!(t.apply(7, 1, 10, a), Applied::New);
        assert_eq!(t.apply(7, 1, 11, b), Applied::Conflict(10));
        assert_eq!(t.apply(7, 1, 12, a), Applied::Duplicate(10), "a true retry");
        assert_ne!(fingerprint(b""), 0, "0 is reserved for unrecorded");
        assert_ne!(fingerprint(b"ab"), fingerprint(b"ba"));
    }

    #[test]
    fn tables_from_before_fingerprints_decode_and_match_any_retry() {
        // The encoding before fingerprints: count, then per client id,
        // last index, count and (seq, index) pairs.
        let mut old = Vec::new();
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&7u64.to_le_bytes());
        old.extend_from_slice(&10u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&1u64.to_le_bytes());
        old.extend_from_slice(&10u64.to_le_bytes());
        let (mut t, used) = DedupTable::decode(&old).unwrap();
        assert_eq!(used, old.len());
        assert_eq!(t.apply(7, 1, 11, fingerprint(b"x")), Applied::Duplicate(10));
    }

    #[test]
    fn seqs_older_than_the_window_are_refused() {
        let mut t = DedupTable::default();
        for s in 0..WINDOW as u64 + 10 {
            assert_eq!(t.apply(1, s + 100, s, 5), Applied::New);
        }
        assert_eq!(t.apply(1, 100, 999_999, 5), Applied::Forgotten);
        assert_eq!(
            t.apply(1, 105 + WINDOW as u64, 1_000_000, 5),
            Applied::Duplicate(5 + WINDOW as u64)
        );
    }

    #[test]
    fn a_seq_never_applied_inside_a_full_window_is_new_then_remembered() {
        let mut t = DedupTable::default();
        let seqs = (0..WINDOW as u64 + 10).filter(|&s| s != 50);
        for (i, s) in seqs.enumerate() {
            assert_eq!(t.apply(1, s, i as u64 + 1, 5), Applied::New);
        }
        // Seqs 0..=8 were forgotten; 50 never came: it is new, in seq order.
        assert_eq!(t.apply(1, 8, 99_998, 5), Applied::Forgotten);
        assert_eq!(t.apply(1, 50, 99_999, 5), Applied::New);
        assert_eq!(t.apply(1, 50, 100_000, 5), Applied::Duplicate(99_999));
        assert_eq!(
            t.apply(1, 9, 100_001, 5),
            Applied::Forgotten,
            "pushed out by 50"
        );
        assert_eq!(t.apply(1, 10, 100_002, 5), Applied::Duplicate(11));
    }

    #[test]
    fn client_entries_round_trip_and_others_are_not_mistaken() {
        let p = encode_client_entry(3, 9, b"data");
        assert_eq!(decode_client_entry(&p), Some((3, 9, &b"data"[..])));
        assert_eq!(decode_client_entry(b"plain"), None);
        assert_eq!(decode_client_entry(&p[..16]), None);
    }

    #[test]
    fn the_table_survives_a_snapshot_and_garbage_is_refused() {
        let mut t = DedupTable::default();
        for c in 0..5 {
            for s in 0..7 {
                t.apply(c, s, c * 100 + s, fingerprint(&[c as u8, s as u8]));
            }
        }
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        let (back, used) = DedupTable::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(used, bytes.len());
        for cut in 0..bytes.len() {
            assert!(DedupTable::decode(&bytes[..cut]).is_none(), "cut at {cut}");
        }
        assert!(DedupTable::decode(&[0xff, 0xff, 0xff, 0xff]).is_none());
    }
}
