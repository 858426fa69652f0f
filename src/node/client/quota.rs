//! Quotas per principal: bytes/s and requests/s of writes (log appends,
//! ledger entries, queue produces), as Kafka and Redpanda enforce them:
//! by backpressure, never by refusing or dropping a write. A connection
//! of a principal over its quota is neither served (what it sent waits
//! in its buffer) nor read from until the quota allows again, whether it
//! made the principal go over or is new; the request that went over is
//! served, and its cost paid by the wait after it.
//!
//! Each quota is a GCRA (the generic cell rate algorithm, a token bucket
//! kept as one number): the theoretical arrival time `tat` moves on by a
//! request's cost (`units / rate` seconds) from `max(tat, now)`; the
//! connection waits until `tat - burst`. One atomic per quota, shared by
//! every loop (a principal's connections may be on any core): no lock, and
//! a principal without a quota costs nothing. Sans-IO: time comes in as
//! node nanoseconds.

use crate::api::Request;
use crate::state::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// How far ahead of its rate a principal may get before it waits: this
/// many milliseconds' worth of its quota (so over any window of W ms it
/// is served at most `(W + QUOTA_BURST_MS) * rate` and one request).
pub const QUOTA_BURST_MS: u64 = 100;

/// A principal's quotas, as its credentials name them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// Bytes of writes per second (a write's payload: the record, the
    /// ledger entry or command, the message).
    pub bytes_per_s: Option<u64>,
    /// Write requests per second (an `AppendBatch` is one).
    pub requests_per_s: Option<u64>,
}

impl Quota {
    /// Whether it limits anything.
    pub fn is_limited(&self) -> bool {
        self.bytes_per_s.is_some() || self.requests_per_s.is_some()
    }
}

/// One rate: a GCRA over node nanoseconds.
#[derive(Debug)]
struct Rate {
    per_s: u64,
    /// The theoretical arrival time (node ns).
    tat_ns: AtomicU64,
}

impl Rate {
    fn new(per_s: u64) -> Rate {
        Rate {
            per_s: per_s.max(1),
            tat_ns: AtomicU64::new(0),
        }
    }

    /// Pays for `units` at `now_ns` (always: the request is served).
    fn charge(&self, units: u64, now_ns: u64) {
        let cost = (u128::from(units) * 1_000_000_000 / u128::from(self.per_s)) as u64;
        let _ = self
            .tat_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(tat.max(now_ns).saturating_add(cost))
            });
    }

    /// The time (node ns) before which the payer must not be served, if
    /// that is after `now_ns`: it is more than the burst ahead.
    fn free_at(&self, now_ns: u64) -> Option<u64> {
        let burst = QUOTA_BURST_MS * 1_000_000;
        let free_at = self.tat_ns.load(Ordering::Acquire).saturating_sub(burst);
        (free_at > now_ns).then_some(free_at)
    }
}

/// One principal's quota state and counters.
#[derive(Debug, Default)]
pub struct PrincipalQuota {
    quota: Quota,
    bytes: Option<Rate>,
    requests: Option<Rate>,
    charged_bytes: AtomicU64,
    charged_requests: AtomicU64,
    holds: AtomicU64,
    held_ns: AtomicU64,
}

/// What a principal's quota has done, for `/metrics` and `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaView {
    /// The principal.
    pub principal: String,
    /// Its quota.
    pub quota: Quota,
    /// Bytes of writes charged to it.
    pub bytes: u64,
    /// Write requests charged to it.
    pub requests: u64,
    /// Times one of its connections was held (not read) for the quota.
    pub holds: u64,
    /// The time its connections were held, summed (ms).
    pub held_ms: u64,
}

/// Every principal's quota state: one per node, shared by the loops.
#[derive(Debug, Default)]
pub struct Quotas {
    /// Indexed by principal id; `None` for a principal without quota.
    by_principal: Vec<Option<PrincipalQuota>>,
    names: Vec<String>,
}

impl Quotas {
    /// The quotas of the principals `(name, quota)`, in the order of
    /// their ids (`node::credentials`).
    pub fn new(principals: impl IntoIterator<Item = (String, Quota)>) -> Quotas {
        let (names, by_principal) = principals
            .into_iter()
            .map(|(name, quota)| {
                let q = quota.is_limited().then(|| PrincipalQuota {
                    quota,
                    bytes: quota.bytes_per_s.map(Rate::new),
                    requests: quota.requests_per_s.map(Rate::new),
                    ..PrincipalQuota::default()
                });
                (name, q)
            })
            .unzip();
        Quotas {
            by_principal,
            names,
        }
    }

    /// Whether some principal has a quota (else nothing is charged).
    pub fn any(&self) -> bool {
        self.by_principal.iter().any(Option::is_some)
    }

    /// Charges `req` of `principal` at `now_ns` if it is a write and the
    /// principal has a quota.
    pub fn charge(&self, principal: u32, req: &Request, now_ns: u64) {
        let Some(q) = self.get(principal) else {
            return;
        };
        let Some(bytes) = write_bytes(req) else {
            return;
        };
        q.charged_bytes.fetch_add(bytes, Ordering::Relaxed);
        q.charged_requests.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = &q.bytes {
            r.charge(bytes, now_ns);
        }
        if let Some(r) = &q.requests {
            r.charge(1, now_ns);
        }
    }

    /// If `principal` is over its quota at `now_ns`, the time (node ns)
    /// until which a connection of its with requests to serve must wait
    /// (counted as a hold); `None` if it may be served now.
    pub fn hold(&self, principal: u32, now_ns: u64) -> Option<u64> {
        let q = self.get(principal)?;
        let by_bytes = q.bytes.as_ref().and_then(|r| r.free_at(now_ns));
        let by_requests = q.requests.as_ref().and_then(|r| r.free_at(now_ns));
        let until = by_bytes.max(by_requests)?;
        q.holds.fetch_add(1, Ordering::Relaxed);
        q.held_ns.fetch_add(until - now_ns, Ordering::Relaxed);
        Some(until)
    }

    fn get(&self, principal: u32) -> Option<&PrincipalQuota> {
        self.by_principal.get(principal as usize)?.as_ref()
    }

    /// Each principal with a quota, and what it has done.
    pub fn views(&self) -> Vec<QuotaView> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.by_principal
            .iter()
            .zip(&self.names)
            .filter_map(|(q, name)| {
                let q = q.as_ref()?;
                Some(QuotaView {
                    principal: name.clone(),
                    quota: q.quota,
                    bytes: get(&q.charged_bytes),
                    requests: get(&q.charged_requests),
                    holds: get(&q.holds),
                    held_ms: get(&q.held_ns) / 1_000_000,
                })
            })
            .collect()
    }
}

/// The payload bytes of `req` if it is a write (what `append` allows):
/// `None` for every other request, which no quota charges.
fn write_bytes(req: &Request) -> Option<u64> {
    match req {
        Request::Append { data, .. } => Some(data.len() as u64),
        Request::AppendBatch { items, .. } => Some(items.iter().map(|i| i.len() as u64).sum()),
        Request::Command { command, .. } => {
            // Only writes (what the `append` permission covers): a
            // consume or a create is not charged.
            let is_write = matches!(
                Command::decode(command),
                Some(
                    Command::AddEntry { .. }
                        | Command::SetLac { .. }
                        | Command::CloseLedger { .. }
                        | Command::Produce { .. }
                        | Command::ProduceUncounted { .. }
                )
            );
            // Decoded here and again when served: only for a principal
            // with a quota, and commands are small.
            is_write.then_some(command.len() as u64)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_rate_lets_its_burst_through_then_holds_to_the_rate() {
        // 1000 units/s: 1 ms a unit, 100 units of burst.
        let r = Rate::new(1000);
        let t0 = 1_000 * MS;
        for _ in 0..100 {
            r.charge(1, t0);
            assert_eq!(r.free_at(t0), None, "within the burst");
        }
        // The 101st is served, and then its payer waits 1 ms.
        r.charge(1, t0);
        assert_eq!(r.free_at(t0), Some(t0 + MS));
        // Served again at that time, it waits 1 ms more: the rate.
        r.charge(1, t0 + MS);
        assert_eq!(r.free_at(t0 + MS), Some(t0 + 2 * MS));
        // Idle for long, the bucket refills to its burst, no more.
        let later = t0 + 10_000 * MS;
        for _ in 0..100 {
            r.charge(1, later);
            assert_eq!(r.free_at(later), None);
        }
        r.charge(1, later);
        assert!(r.free_at(later).is_some());
    }

    #[test]
    fn over_any_window_the_rate_holds_within_the_burst() {
        // A payer served whenever it may, 1 KiB at a time, at 1 MiB/s.
        let r = Rate::new(1 << 20);
        let mut now = 5 * MS;
        let start = now;
        let mut served = 0u64;
        while now < start + 10_000 * MS {
            if let Some(until) = r.free_at(now) {
                now = until;
                continue;
            }
            served += 1024;
            r.charge(1024, now);
        }
        let expected = 10 * (1u64 << 20);
        let burst = (1u64 << 20) * QUOTA_BURST_MS / 1000;
        assert!(
            served >= expected && served <= expected + burst + 1024,
            "{served} bytes in 10 s at 1 MiB/s"
        );
    }

    #[test]
    fn a_principal_over_its_quota_is_held_on_every_connection() {
        let quotas = Quotas::new([
            ("free".to_string(), Quota::default()),
            (
                "metered".to_string(),
                Quota {
                    bytes_per_s: Some(1000),
                    requests_per_s: None,
                },
            ),
        ]);
        let append = Request::Append {
            group: 0,
            client_id: 1,
            seq: 1,
            data: vec![0; 600].into(),
        };
        let t0 = 7 * MS;
        assert_eq!(quotas.hold(1, t0), None);
        quotas.charge(1, &append, t0);
        // 600 ms of debt less the 100 ms burst: held until t0 + 500 ms,
        // whichever connection asks next (a new one too).
        assert_eq!(quotas.hold(1, t0), Some(t0 + 500 * MS));
        assert_eq!(quotas.hold(1, t0 + 500 * MS), None);
        quotas.charge(0, &append, t0);
        assert_eq!(quotas.hold(0, t0), None, "no quota, never held");
        let v = quotas.views();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].bytes, v[0].requests, v[0].holds), (600, 1, 1));
        assert_eq!(v[0].held_ms, 500);
    }

    #[test]
    fn only_writes_are_charged() {
        let read = Request::Read {
            group: 0,
            from: 1,
            max_entries: 1,
            max_bytes: 1,
            stale: false,
        };
        assert_eq!(write_bytes(&read), None);
        let append = Request::Append {
            group: 0,
            client_id: 1,
            seq: 1,
            data: vec![0; 10].into(),
        };
        assert_eq!(write_bytes(&append), Some(10));
        let consume = Request::Command {
            group: 0,
            client_id: 1,
            seq: 1,
            command: Command::Consume {
                queue: "q".into(),
                consumer: 1,
                max: 1,
                visibility_ms: 1,
                now_ms: 0,
            }
            .encode(),
        };
        assert_eq!(write_bytes(&consume), None);
    }
}
