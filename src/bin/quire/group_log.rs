//! `quire append`, `quire read` and `quire tail`: the raw log of a group,
//! appended to (from the arguments or stdin's lines), read linearizably
//! or stale, and followed; each record printed as text or JSON.

use super::cli::Target;
use super::connect::client;
use super::input;

/// `quire append`: `records` (or stdin's lines, given `-`) appended to
/// `group`'s log, each printed with its index.
pub(crate) fn append(
    target: &Target,
    group: u32,
    records: Vec<String>,
    json: bool,
) -> Result<(), String> {
    client(target).and_then(|mut c| {
        let mut records = input::Records::from_args(records);
        // Up to 1024 records in flight on the leader's connection, 64
        // to a batch request (`Client::append_all`).
        while let Some(batch) = records.next_batch(1024, 1 << 20)? {
            let indexes = c
                .append_all(group, &batch, 16, 64)
                .map_err(|e| e.to_string())?;
            for (index, r) in indexes.iter().zip(&batch) {
                let data = String::from_utf8_lossy(r);
                if json {
                    println!("{}", serde_json::json!({"index": index, "data": data}));
                } else {
                    println!("appended at index {index}: {data}");
                }
            }
        }
        Ok(())
    })
}

/// `quire read`: at most `max` committed records of `group`'s log from
/// index `from`, from its leader (or, `stale`, from any node).
pub(crate) fn read(
    target: &Target,
    group: u32,
    from: u64,
    max: u32,
    stale: bool,
    json: bool,
) -> Result<(), String> {
    client(target).and_then(|mut c| {
        let entries = if stale {
            c.read_stale(group, from, max)
        } else {
            c.read(group, from, max)
        };
        for e in entries.map_err(|e| e.to_string())? {
            print_entry(&e, json);
        }
        Ok(())
    })
}

/// `quire tail`: `group`'s log followed from index `from`, each record
/// printed as it commits (or, `stale`, as a node applies it); never ends.
pub(crate) fn tail(
    target: &Target,
    group: u32,
    from: u64,
    stale: bool,
    json: bool,
) -> Result<(), String> {
    client(target).and_then(|mut c| {
        let mut next = from;
        loop {
            // A long poll on the leader (or, stale, on the first node
            // that answers): it answers as soon as an entry at or after
            // `next` is applied there (or after 1.5 s, empty; the client
            // waits 2 s for an answer).
            let entries = if stale {
                c.tail_stale(group, next, 1_500)
            } else {
                c.tail(group, next, 1_500)
            };
            let entries = entries.map_err(|e| e.to_string())?;
            for e in entries {
                print_entry(&e, json);
                next = e.index + 1;
            }
        }
    })
}

/// One record of a group's log as `quire read` and `quire tail` print it:
/// `INDEX<TAB>TERM<TAB>DATA`, or with `json` one JSON object.
fn print_entry(e: &quire::client::Entry, json: bool) {
    let data = String::from_utf8_lossy(&e.data);
    if json {
        let v = serde_json::json!({"index": e.index, "term": e.term, "data": data});
        println!("{v}");
    } else {
        println!("{}\t{}\t{}", e.index, e.term, data);
    }
}
