//! The checks, as pure functions of a history and the logs read back from
//! the nodes after healing, so that each can be fed a doctored history or
//! log in a test of its own and shown to fire. Each returns the violations
//! it found, one line each (empty: the property holds).
//!
//! The ledger and queue checks (`ledger_fencing`, `queue_redelivery`)
//! judge the records of `state::StateWorkload`. Adding a check: record
//! what it needs, write it here as a function of the records and what is
//! read back, call it from the schedule, and give it a test in
//! tests/faults.rs that feeds it a doctored record and shows it fires.

use super::cluster::LogEntry;
use super::history::{Op, Outcome};
use super::state::{LedgerRun, QueueRun};
use quire::consensus::NodeId;
use std::collections::{BTreeMap, BTreeSet};

/// Every confirmed append is in every node's log, at the index it was
/// confirmed at. A log shorter than that index (a node read before it
/// caught up) counts as missing too: read the logs once every node has
/// committed the highest confirmed index.
pub fn lost(ops: &[Op], logs: &BTreeMap<NodeId, Vec<LogEntry>>) -> Vec<String> {
    let mut out = Vec::new();
    for (node, log) in logs {
        let at: BTreeMap<u64, &[u8]> = log.iter().map(|(i, _, d)| (*i, &d[..])).collect();
        let mut missing = 0;
        for op in ops {
            let Outcome::Ok(index) = op.outcome else {
                continue;
            };
            if at.get(&index) != Some(&&op.value[..]) {
                missing += 1;
                if missing <= 5 {
                    out.push(format!(
                        "node {node}: confirmed append {} (client {} seq {}, index {index}) is \
                         lost: the log has {}",
                        show(&op.value),
                        op.client,
                        op.seq,
                        at.get(&index).map_or("nothing".into(), |d| show(d))
                    ));
                }
            }
        }
        if missing > 5 {
            out.push(format!(
                "node {node}: {missing} confirmed appends lost in all"
            ));
        }
    }
    out
}

/// No value appears twice in a log (every value of the history is
/// unique, and retries reuse the client's sequence number, so a second
/// copy means an append was applied twice).
pub fn duplicates(logs: &BTreeMap<NodeId, Vec<LogEntry>>) -> Vec<String> {
    let mut out = Vec::new();
    for (node, log) in logs {
        let mut seen: BTreeMap<&[u8], u64> = BTreeMap::new();
        for (index, _, data) in log {
            if let Some(first) = seen.insert(&data[..], *index) {
                out.push(format!(
                    "node {node}: {} applied twice, at {first} and {index}",
                    show(data)
                ));
            }
        }
    }
    out
}

/// Every entry read back was appended by some client of the history and
/// not refused: nothing invented, nothing refused applied.
pub fn phantoms(
    ops: &[Op],
    logs: &BTreeMap<NodeId, Vec<LogEntry>>,
    extra_ok: &[&[u8]],
) -> Vec<String> {
    let invoked: BTreeMap<&[u8], &Outcome> =
        ops.iter().map(|o| (&o.value[..], &o.outcome)).collect();
    let mut out = Vec::new();
    for (node, log) in logs {
        for (index, _, data) in log {
            if extra_ok.iter().any(|p| data.starts_with(p)) {
                continue;
            }
            match invoked.get(&data[..]) {
                None => out.push(format!(
                    "node {node}: index {index} holds {}, which no client appended",
                    show(data)
                )),
                Some(Outcome::Failed(why)) => out.push(format!(
                    "node {node}: index {index} holds {}, which was refused ({why})",
                    show(data)
                )),
                Some(_) => {}
            }
        }
    }
    out
}

/// Every node's log is identical up to the lowest commit among them: the
/// same (term, data) at every index both hold, and no index one holds
/// that another, committed past it, lacks.
pub fn divergence(logs: &BTreeMap<NodeId, Vec<LogEntry>>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(common) = logs.values().map(|l| l.last().map_or(0, |e| e.0)).min() else {
        return out;
    };
    let upto =
        |l: &[LogEntry]| -> Vec<LogEntry> { l.iter().filter(|e| e.0 <= common).cloned().collect() };
    let mut iter = logs.iter();
    let Some((&first, base)) = iter.next() else {
        return out;
    };
    let base = upto(base);
    for (&node, log) in iter {
        let log = upto(log);
        let differs = base.iter().zip(&log).find(|(a, b)| a != b).map(|(a, b)| {
            format!(
                "nodes {first} and {node} differ at index {}: term {} {} vs index {} term {} {}",
                a.0,
                a.1,
                show(&a.2),
                b.0,
                b.1,
                show(&b.2)
            )
        });
        match differs {
            Some(d) => out.push(d),
            None if base.len() != log.len() => out.push(format!(
                "nodes {first} and {node} hold {} and {} entries up to index {common}",
                base.len(),
                log.len()
            )),
            None => {}
        }
    }
    out
}

/// Confirmed appends of one client are ordered in the log as the client
/// made them (a client waits for each before the next).
pub fn client_order(ops: &[Op]) -> Vec<String> {
    let mut last: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut by_time: Vec<&Op> = ops.iter().collect();
    by_time.sort_by_key(|o| o.invoke);
    for op in by_time {
        if let Outcome::Ok(index) = op.outcome {
            if let Some(&(seq, prev)) = last.get(&op.client) {
                if index <= prev {
                    out.push(format!(
                        "client {}: seq {} confirmed at {index}, not after seq {seq} at {prev}",
                        op.client, op.seq
                    ));
                }
            }
            last.insert(op.client, (op.seq, index));
        }
    }
    out
}

/// All checks; the violations of each, by name.
pub fn all(
    ops: &[Op],
    logs: &BTreeMap<NodeId, Vec<LogEntry>>,
) -> BTreeMap<&'static str, Vec<String>> {
    // Health-check appends are made outside the history on purpose: they
    // are not judged, only read past.
    let extra: &[&[u8]] = &[b"health check "];
    BTreeMap::from([
        ("no confirmed append lost", lost(ops, logs)),
        ("no append applied twice", duplicates(logs)),
        (
            "nothing invented or refused applied",
            phantoms(ops, logs, extra),
        ),
        ("logs identical up to the commit index", divergence(logs)),
        ("each client's appends in order", client_order(ops)),
    ])
}

/// Prints each check's verdict and panics if any found a violation.
pub fn assert_all(ops: &[Op], logs: &BTreeMap<NodeId, Vec<LogEntry>>) {
    let verdicts = all(ops, logs);
    let mut failed = BTreeSet::new();
    for (name, v) in &verdicts {
        if v.is_empty() {
            out!("check: {name}: ok");
        } else {
            failed.insert(*name);
            out!("check: {name}: {} VIOLATIONS", v.len());
            for line in v.iter().take(10) {
                out!("  {line}");
            }
        }
    }
    assert!(failed.is_empty(), "checks failed: {failed:?}");
}

/// A value for a message: short ones whole, long ones cut.
fn show(v: &[u8]) -> String {
    let s = String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned();
    if v.len() > 24 {
        format!("{s:?}.. ({} bytes)", v.len())
    } else {
        format!("{s:?}")
    }
}

/// Ledger fencing holds: once an open with recovery returned, no add sent
/// after it is confirmed; every confirmed add lies within the sealed
/// length and reads back with its data at its entry id; the sealed ledger
/// holds nothing its writer did not add, and nothing twice.
pub fn ledger_fencing(ledgers: &[LedgerRun]) -> Vec<String> {
    let mut out = Vec::new();
    for l in ledgers {
        let Some((fenced_at, len)) = l.fenced else {
            out.push(format!("ledger {}: never fenced", l.id));
            continue;
        };
        let read: BTreeMap<u64, &[u8]> = l.read_back.iter().map(|(i, d)| (*i, &d[..])).collect();
        for a in &l.adds {
            let Ok(id) = a.outcome else { continue };
            if a.sent > fenced_at {
                out.push(format!(
                    "ledger {}: add {} sent after the fence was confirmed as entry {id}",
                    l.id, a.k
                ));
            }
            if id >= len {
                out.push(format!(
                    "ledger {}: add {} confirmed as entry {id}, beyond the sealed length {len}",
                    l.id, a.k
                ));
            } else if read.get(&id) != Some(&&a.data[..]) {
                out.push(format!(
                    "ledger {}: confirmed entry {id} ({}) reads back as {:?}",
                    l.id,
                    show(&a.data),
                    read.get(&id).map(|d| show(d))
                ));
            }
        }
        let written: BTreeSet<&[u8]> = l.adds.iter().map(|a| &a.data[..]).collect();
        let mut seen = BTreeSet::new();
        for (i, (id, data)) in l.read_back.iter().enumerate() {
            if *id != i as u64 {
                out.push(format!("ledger {}: entry ids not dense at {id}", l.id));
            }
            if !written.contains(&data[..]) {
                out.push(format!(
                    "ledger {}: entry {id} holds {}, never added",
                    l.id,
                    show(data)
                ));
            }
            if !seen.insert(&data[..]) {
                out.push(format!("ledger {}: {} sealed twice", l.id, show(data)));
            }
        }
    }
    out
}

/// No acked queue message is redelivered: no delivery of an id comes from
/// a pull sent after an ack of that id was confirmed. And no confirmed
/// produce is lost: after draining, every one was delivered.
pub fn queue_redelivery(q: &QueueRun) -> Vec<String> {
    let mut out = Vec::new();
    let mut acked_at: BTreeMap<u64, std::time::Instant> = BTreeMap::new();
    for (ids, at) in &q.acked {
        for &id in ids {
            let t = acked_at.entry(id).or_insert(*at);
            *t = (*t).min(*at);
        }
    }
    for &(id, sent) in &q.delivered {
        if acked_at.get(&id).is_some_and(|&a| sent > a) {
            out.push(format!(
                "message {id} delivered again after its ack was confirmed"
            ));
        }
    }
    let delivered: BTreeSet<u64> = q.delivered.iter().map(|d| d.0).collect();
    let lost: Vec<u64> = q
        .produced
        .iter()
        .map(|p| p.0)
        .filter(|id| !delivered.contains(id))
        .collect();
    if !lost.is_empty() {
        out.push(format!(
            "{} confirmed messages never delivered, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        ));
    }
    out
}

/// Runs the ledger and queue checks, prints their verdicts, panics on a
/// violation.
pub fn assert_state(ledgers: &[LedgerRun], q: &QueueRun) {
    let adds: usize = ledgers.iter().map(|l| l.adds.len()).sum();
    let confirmed: usize = ledgers
        .iter()
        .map(|l| l.adds.iter().filter(|a| a.outcome.is_ok()).count())
        .sum();
    out!(
        "ledgers: {} fenced, {adds} adds, {confirmed} confirmed; queue: {} produced, {} deliveries, {} acks",
        ledgers.len(),
        q.produced.len(),
        q.delivered.len(),
        q.acked.len()
    );
    let mut failed = Vec::new();
    for (name, v) in [
        ("ledger fencing holds", ledger_fencing(ledgers)),
        (
            "no acked queue message redelivered, none lost",
            queue_redelivery(q),
        ),
    ] {
        if v.is_empty() {
            out!("check: {name}: ok");
        } else {
            out!("check: {name}: {} VIOLATIONS", v.len());
            for line in v.iter().take(10) {
                out!("  {line}");
            }
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "checks failed: {failed:?}");
}
