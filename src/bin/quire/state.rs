//! `quire ledger ...` and `quire queue ...`: the ledger and queue client
//! commands, each one request to the group's leader, printed as text or,
//! with `--json`, as one JSON object per line.

use super::cli::Target;
use super::connect::client;
use super::human;
use super::input::{queue_name, Records};
use clap::Subcommand;
use quire::client::{Client, Delivery, LedgerInfo, LedgerWriter, QueueInfo};
use quire::state::queue;
use serde_json::{json, Value};

/// Where a ledger or queue command goes, and how it prints.
#[derive(clap::Args, Debug)]
pub(crate) struct On {
    #[command(flatten)]
    target: Target,
    /// The group (disk) holding the ledger or queue.
    #[arg(long, default_value_t = 0)]
    group: u32,
    /// Print JSON, one object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum LedgerCmd {
    /// Create a ledger; prints its id and the writer token.
    Create {
        #[command(flatten)]
        on: On,
    },
    /// Add entries (one per argument) as the ledger's writer.
    Append {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
        /// The writer token `create` printed.
        #[arg(long)]
        token: u64,
        /// The entries.
        #[arg(required = true)]
        entries: Vec<String>,
    },
    /// Close a ledger as its writer, sealing its last entry.
    Close {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
        /// The writer token.
        #[arg(long)]
        token: u64,
    },
    /// Open a ledger: its metadata; with --recover, fence its writer and
    /// seal it first.
    Open {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
        /// Fence the writer (its later appends fail) and seal the ledger.
        #[arg(long)]
        recover: bool,
    },
    /// Read entries up to the LAC.
    Read {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
        /// First entry id.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Last entry id.
        #[arg(long, default_value_t = u64::MAX)]
        to: u64,
    },
    /// Follow a ledger, printing entries as its LAC passes them.
    Tail {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
        /// First entry id.
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Delete a ledger.
    Delete {
        #[command(flatten)]
        on: On,
        /// The ledger.
        #[arg(long)]
        ledger: u64,
    },
    /// List the group's ledgers with their state, length, bytes, LAC.
    List {
        #[command(flatten)]
        on: On,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum QueueCmd {
    /// Create a queue.
    Create {
        #[command(flatten)]
        on: On,
        /// The queue's name (1 to 255 bytes).
        #[arg(value_parser = queue_name)]
        name: String,
        /// Deliveries after which a message goes to the dead-letter list
        /// (1 to 1000).
        #[arg(long, default_value_t = 5,
              value_parser = clap::value_parser!(u32).range(1..=queue::DELIVERIES_PER_MESSAGE_MAX as i64))]
        max_deliveries: u32,
    },
    /// Produce messages (one per argument) as one batch; given `-`, one
    /// per line of stdin, in batches as the lines arrive.
    Produce {
        #[command(flatten)]
        on: On,
        /// The queue.
        #[arg(value_parser = queue_name)]
        name: String,
        /// The messages, or `-` for stdin's lines.
        #[arg(required = true)]
        messages: Vec<String>,
    },
    /// Pull messages; they stay hidden for the visibility timeout and
    /// come back unless acked.
    Consume {
        #[command(flatten)]
        on: On,
        /// The queue.
        #[arg(value_parser = queue_name)]
        name: String,
        /// Messages at most (1 to 1024; and at most 8 MiB of them).
        #[arg(long, default_value_t = 10,
              value_parser = clap::value_parser!(u32).range(1..=queue::CONSUME_MAX as i64))]
        max: u32,
        /// How long they stay hidden, in ms (1 to 43200000, 12 hours).
        #[arg(long, default_value_t = 30_000,
              value_parser = clap::value_parser!(u64).range(1..=queue::VISIBILITY_MS_MAX))]
        visibility_ms: u64,
    },
    /// Ack messages by id: never delivered again.
    Ack {
        #[command(flatten)]
        on: On,
        /// The queue.
        #[arg(value_parser = queue_name)]
        name: String,
        /// The message ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// List the group's queues.
    List {
        #[command(flatten)]
        on: On,
    },
    /// The queue's dead-lettered messages.
    Dead {
        #[command(flatten)]
        on: On,
        /// The queue.
        #[arg(value_parser = queue_name)]
        name: String,
    },
    /// Delete a queue and its messages.
    Delete {
        #[command(flatten)]
        on: On,
        /// The queue.
        #[arg(value_parser = queue_name)]
        name: String,
    },
}

fn connect(on: &On) -> Result<Client, String> {
    client(&on.target)
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn state_name(l: &LedgerInfo) -> &'static str {
    if l.state == quire::state::ledger::LedgerState::Closed {
        "closed"
    } else {
        "open"
    }
}

fn ledger_json(l: &LedgerInfo) -> Value {
    json!({
        "ledger": l.id,
        "state": state_name(l),
        "fenced": l.fenced,
        "length": l.length,
        "bytes": l.bytes,
        "lac": l.lac,
        "created_ms": l.created_ms,
    })
}

fn queue_json(q: &QueueInfo) -> Value {
    json!({
        "queue": q.name,
        "max_deliveries": q.max_deliveries,
        "produced": q.produced,
        "unacked": q.unacked,
        "dead": q.dead,
    })
}

fn delivery_json(d: &Delivery) -> Value {
    json!({"id": d.id, "deliveries": d.deliveries, "data": text(&d.data)})
}

/// Prints `v` as JSON, or the `plain` text.
fn say(on: &On, v: Value, plain: String) {
    if on.json {
        println!("{v}");
    } else {
        println!("{plain}");
    }
}

fn e(err: quire::client::ClientError) -> String {
    err.to_string()
}

/// Runs a `quire ledger` command.
pub(crate) fn ledger(cmd: LedgerCmd) -> Result<(), String> {
    match cmd {
        LedgerCmd::Create { on } => {
            let w = connect(&on)?.ledger_create(on.group).map_err(e)?;
            let plain = format!("ledger {} created; writer token {}", w.id, w.token);
            say(&on, json!({"ledger": w.id, "token": w.token}), plain);
        }
        LedgerCmd::Append {
            on,
            ledger,
            token,
            entries,
        } => {
            let mut c = connect(&on)?;
            let w = LedgerWriter { id: ledger, token };
            for entry in entries {
                let id = c.ledger_append(on.group, w, entry.as_bytes()).map_err(e)?;
                say(
                    &on,
                    json!({"ledger": ledger, "entry": id}),
                    format!("entry {id}: {entry}"),
                );
            }
        }
        LedgerCmd::Close { on, ledger, token } => {
            let w = LedgerWriter { id: ledger, token };
            let last = connect(&on)?.ledger_close(on.group, w).map_err(e)?;
            let plain = format!("ledger {ledger} closed; last entry {}", human::opt(last));
            say(&on, json!({"ledger": ledger, "last_entry": last}), plain);
        }
        LedgerCmd::Open {
            on,
            ledger,
            recover,
        } => {
            let l = connect(&on)?
                .ledger_open(on.group, ledger, recover)
                .map_err(e)?;
            let plain = format!(
                "ledger {}: {}{}, {} entries, {} bytes, LAC {}, created {}",
                l.id,
                state_name(&l),
                if l.fenced { " (fenced)" } else { "" },
                l.length,
                l.bytes,
                human::opt(l.lac),
                human::rfc3339_local(l.created_ms)
            );
            say(&on, ledger_json(&l), plain);
        }
        LedgerCmd::Read {
            on,
            ledger,
            from,
            to,
        } => {
            let mut c = connect(&on)?;
            let mut next = from;
            // A read answers at most READ_ENTRIES_MAX entries and
            // READ_BYTES_MAX bytes: page on.
            while next <= to {
                let es = c.ledger_read(on.group, ledger, next, to).map_err(e)?;
                let Some(&(last, _)) = es.last() else { break };
                for (id, d) in es {
                    say(
                        &on,
                        json!({"entry": id, "data": text(&d)}),
                        format!("{id}\t{}", text(&d)),
                    );
                }
                next = last + 1;
            }
        }
        LedgerCmd::Tail { on, ledger, from } => {
            let mut c = connect(&on)?;
            let mut next = from;
            loop {
                for (id, d) in c.ledger_tail(on.group, ledger, next, 1_500).map_err(e)? {
                    say(
                        &on,
                        json!({"entry": id, "data": text(&d)}),
                        format!("{id}\t{}", text(&d)),
                    );
                    next = id + 1;
                }
            }
        }
        LedgerCmd::Delete { on, ledger } => {
            connect(&on)?.ledger_delete(on.group, ledger).map_err(e)?;
            say(
                &on,
                json!({"ledger": ledger, "deleted": true}),
                format!("ledger {ledger} deleted"),
            );
        }
        LedgerCmd::List { on } => {
            for l in connect(&on)?.ledger_list(on.group).map_err(e)? {
                let plain = format!(
                    "{}\t{}{}\t{} entries\t{} bytes\tLAC {}\tcreated {}",
                    l.id,
                    state_name(&l),
                    if l.fenced { " fenced" } else { "" },
                    l.length,
                    l.bytes,
                    human::opt(l.lac),
                    human::rfc3339_local(l.created_ms)
                );
                say(&on, ledger_json(&l), plain);
            }
        }
    }
    Ok(())
}

/// Runs a `quire queue` command.
pub(crate) fn queue(cmd: QueueCmd) -> Result<(), String> {
    match cmd {
        QueueCmd::Create {
            on,
            name,
            max_deliveries,
        } => {
            connect(&on)?
                .queue_create(on.group, &name, max_deliveries)
                .map_err(e)?;
            say(
                &on,
                json!({"queue": name, "created": true}),
                format!("queue {name} created"),
            );
        }
        QueueCmd::Produce { on, name, messages } => {
            let mut c = connect(&on)?;
            let mut records = Records::from_args(messages);
            // One produce per batch: at most PRODUCE_MESSAGES_MAX messages,
            // and well inside an entry's bytes.
            while let Some(batch) = records.next_batch(queue::PRODUCE_MESSAGES_MAX, 256 << 10)? {
                let ids = c.produce(on.group, &name, &batch).map_err(e)?;
                let plain = format!("produced ids {}..{}", ids.start, ids.end);
                say(
                    &on,
                    json!({"queue": name, "first_id": ids.start, "count": ids.end - ids.start}),
                    plain,
                );
            }
        }
        QueueCmd::Consume {
            on,
            name,
            max,
            visibility_ms,
        } => {
            for d in connect(&on)?
                .consume(on.group, &name, max, visibility_ms)
                .map_err(e)?
            {
                let plain = format!("{}\t{}\t(delivery {})", d.id, text(&d.data), d.deliveries);
                say(&on, delivery_json(&d), plain);
            }
        }
        QueueCmd::Ack { on, name, ids } => {
            let n = connect(&on)?.ack(on.group, &name, &ids).map_err(e)?;
            say(
                &on,
                json!({"queue": name, "acked": n}),
                format!("{n} acked"),
            );
        }
        QueueCmd::List { on } => {
            for q in connect(&on)?.queue_list(on.group).map_err(e)? {
                let plain = format!(
                    "{}\tproduced {}\tunacked {}\tdead {}\tmax deliveries {}",
                    q.name, q.produced, q.unacked, q.dead, q.max_deliveries
                );
                say(&on, queue_json(&q), plain);
            }
        }
        QueueCmd::Dead { on, name } => {
            let mut client = connect(&on)?;
            let dead = client.dead_letters(on.group, &name).map_err(e)?;
            for d in &dead {
                let plain = format!("{}\t{}\t({} deliveries)", d.id, text(&d.data), d.deliveries);
                say(&on, delivery_json(d), plain);
            }
            // One answer holds a bounded list: say so when this one was
            // cut, rather than let it pass for the whole list.
            let listed = client.queue_list(on.group).map_err(e)?;
            if let Some(q) = listed.iter().find(|q| q.name == name) {
                if q.dead > dead.len() as u64 {
                    eprintln!(
                        "quire: listed the oldest {} of {} dead letters of {name}: one answer holds \
                         at most {} messages and {} MiB of them",
                        dead.len(),
                        q.dead,
                        quire::state::query::ANSWER_ITEMS_MAX,
                        queue::CONSUME_BYTES_MAX >> 20
                    );
                }
            }
        }
        QueueCmd::Delete { on, name } => {
            connect(&on)?.queue_delete(on.group, &name).map_err(e)?;
            say(
                &on,
                json!({"queue": name, "deleted": true}),
                format!("queue {name} deleted"),
            );
        }
    }
    Ok(())
}
