//! The checks, as pure functions of a history and the logs read back from
//! the nodes after healing, so that each can be fed a doctored history or
//! log in a test of its own and shown to fire. Each returns the violations
//! it found, one line each (empty: the property holds).
//!
//! Adding a check (ledger fencing, queue redelivery, once the client has
//! ledgers and queues): record the ledger/queue operations in the history
//! (`history::Outcome` per op), write the check here as a function of the
//! history and what is read back, add it to `all`, and give it a planted-
//! fault test in tests/faults.rs next to the others.

use super::cluster::LogEntry;
use super::history::{Op, Outcome};
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
