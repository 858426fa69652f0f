//! The queue's tests: produce idempotence, visibility, acks, dead letters,
//! byte budgets, the fresh tail against a one-ordered-set model, and the
//! snapshot codec's formats and refusals.

use super::*;
use crate::state::stored::{Stored, COMMAND_SLOT_BITS};
use crate::state::wire::{put_bytes, put_u32, put_u64, Reader};

fn one_queue(max_deliveries: u32) -> Queues {
    let mut qs = Queues::default();
    qs.create("q", max_deliveries).unwrap();
    qs
}

fn ids(ds: &[Delivery]) -> Vec<u64> {
    ds.iter().map(|d| d.id).collect()
}

fn msgs(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| vec![i as u8]).collect()
}

#[test]
fn a_retried_produce_returns_the_first_ids_and_adds_nothing() {
    let mut qs = one_queue(5);
    assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 1), Ok((0..3, false)));
    assert_eq!(qs.produce("q", 8, 1, &msgs(2), 0, 2), Ok((3..5, false)));
    assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 3), Ok((0..3, true)));
    assert_eq!(qs.list()[0].produced, 5);
    qs.ack("q", &[0, 1, 2]).unwrap();
    assert_eq!(
        qs.produce("q", 7, 1, &msgs(3), 0, 4),
        Ok((0..3, true)),
        "after the ack"
    );
    assert_eq!(qs.list()[0].unacked, 2);
}

#[test]
fn a_reused_producer_and_seq_with_other_messages_is_a_conflict() {
    let mut qs = one_queue(5);
    assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 1), Ok((0..3, false)));
    let other = vec![b"someone else's".to_vec()];
    assert_eq!(qs.produce("q", 7, 1, &other, 0, 2), Err(Error::Conflict));
    let reordered: Vec<Vec<u8>> = msgs(3).into_iter().rev().collect();
    assert_eq!(
        qs.produce("q", 7, 1, &reordered, 0, 3),
        Err(Error::Conflict)
    );
    assert_eq!(qs.list()[0].produced, 3, "nothing added");
    assert_eq!(qs.produce("q", 7, 1, &msgs(3), 0, 4), Ok((0..3, true)));
}

#[test]
fn produce_seqs_older_than_the_window_are_refused() {
    let mut qs = one_queue(5);
    for s in 0..PRODUCE_WINDOW as u64 + 3 {
        qs.produce("q", 1, s + 10, &msgs(1), 0, s).unwrap();
    }
    assert_eq!(
        qs.produce("q", 1, 10, &msgs(1), 0, 999),
        Err(Error::Forgotten)
    );
    let (ids, retry) = qs.produce("q", 1, 13, &msgs(1), 0, 999).unwrap();
    assert_eq!((ids, retry), (3..4, true), "the oldest still in the window");
}

#[test]
fn unacked_messages_come_back_after_the_visibility_timeout() {
    let mut qs = one_queue(5);
    qs.produce("q", 1, 1, &msgs(4), 100, 1).unwrap();
    let got = qs.consume("q", 3, 1_000, 100).unwrap();
    assert_eq!(ids(&got), vec![0, 1, 2]);
    assert_eq!(got[0].deliveries, 1);
    assert_eq!(ids(&qs.consume("q", 10, 1_000, 500).unwrap()), vec![3]);
    assert_eq!(
        ids(&qs.consume("q", 10, 1_000, 1_099).unwrap()),
        Vec::<u64>::new(),
        "still hidden"
    );
    qs.ack("q", &[1]).unwrap();
    let again = qs.consume("q", 10, 1_000, 1_100).unwrap();
    assert_eq!(
        ids(&again),
        vec![0, 2],
        "unacked ones return, the acked one not"
    );
    assert_eq!(again[0].deliveries, 2);
    assert_eq!(ids(&qs.consume("q", 10, 1_000, 1_500).unwrap()), vec![3]);
}

#[test]
fn acked_ids_are_kept_as_ranges_and_never_delivered_again() {
    let mut qs = one_queue(5);
    qs.produce("q", 1, 1, &msgs(10), 0, 1).unwrap();
    assert_eq!(qs.ack("q", &[0, 1, 2, 5, 4, 3, 8, 2, 99]), Ok(7));
    assert_eq!(qs.acked_ranges("q").unwrap(), vec![0..6, 8..9]);
    assert_eq!(qs.ack("q", &[7]), Ok(1));
    assert_eq!(qs.acked_ranges("q").unwrap(), vec![0..6, 7..9]);
    assert!(qs.is_acked("q", 7).unwrap() && !qs.is_acked("q", 6).unwrap());
    let mut t = 0;
    for _ in 0..4 {
        let got = qs.consume("q", 100, 10, t).unwrap();
        assert_eq!(ids(&got), vec![6, 9]);
        t += 10;
    }
}

#[test]
fn a_message_is_dead_lettered_after_max_deliveries() {
    let mut qs = one_queue(2);
    qs.produce("q", 1, 1, &msgs(2), 0, 1).unwrap();
    assert_eq!(ids(&qs.consume("q", 10, 10, 0).unwrap()), vec![0, 1]);
    qs.ack("q", &[1]).unwrap();
    let second = qs.consume("q", 10, 10, 10).unwrap();
    assert_eq!((ids(&second), second[0].deliveries), (vec![0], 2));
    assert_eq!(
        qs.consume("q", 10, 10, 20).unwrap(),
        vec![],
        "dead, not delivered"
    );
    let dead = qs.dead_letters("q", usize::MAX).unwrap();
    assert_eq!((ids(&dead), dead[0].deliveries), (vec![0], 2));
    assert_eq!(qs.list()[0].dead, 1);
    assert_eq!(qs.ack("q", &[0]), Ok(1), "a dead letter can be acked away");
    assert_eq!(qs.dead_letters("q", usize::MAX).unwrap(), vec![]);
}

#[test]
fn bad_arguments_are_refused() {
    let mut qs = one_queue(2);
    assert_eq!(qs.create("q", 2), Err(Error::QueueExists));
    assert_eq!(qs.create("", 2), Err(Error::Invalid));
    assert_eq!(qs.create("z", 0), Err(Error::Invalid));
    assert_eq!(qs.consume("q", 1, 0, 0), Err(Error::Invalid));
    assert_eq!(qs.consume("q", CONSUME_MAX + 1, 1, 0), Err(Error::Invalid));
    assert_eq!(qs.consume("nope", 1, 1, 0), Err(Error::NoSuchQueue));
    assert_eq!(qs.delete("q"), Ok(()));
    assert_eq!(qs.delete("q"), Err(Error::NoSuchQueue));
}

#[test]
fn a_backlog_encodes_as_a_run_per_produce_and_split_runs_are_refused() {
    let mut qs = one_queue(3);
    for b in 0..10 {
        qs.produce("q", 1, b, &msgs(1000), 5, 100 + b).unwrap();
    }
    qs.consume("q", 2, 10, 5).unwrap();
    let mut bytes = Vec::new();
    qs.encode(&mut bytes, false);
    // Two delivered messages, the rest of the first produce, and nine
    // untouched produces: 12 runs of 36 bytes and each message's size
    // (4 bytes: what a consume's budget counts), plus the producer's
    // window of 10 produces, 32 bytes each; not 10,000 message records.
    let run_bytes = 8 + 4 + 8 + 4 + 4 + 8;
    let bound = 12 * run_bytes + 10_000 * 4 + 10 * 32 + 100;
    assert!(bytes.len() < bound, "{} bytes", bytes.len());
    let back = Queues::decode(&mut Reader::new(&bytes), 5).unwrap();
    assert_eq!(back, qs);
    // One run written as two is not what `encode` writes: refused.
    let mut one = one_queue(3);
    one.produce("q", 1, 1, &msgs(2), 5, 7).unwrap();
    let mut bytes = Vec::new();
    one.encode(&mut bytes, false);
    let split = |b: &mut Vec<u8>| {
        // name, max_deliveries, next_id, live runs: 1
        let at = 4 + 4 + 1 + 4 + 8;
        assert_eq!(b[at..at + 4], 1u32.to_le_bytes());
        b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        // The run, then its two messages' sizes.
        let run = b[at + 4..at + 4 + run_bytes].to_vec();
        let sizes = b[at + 4 + run_bytes..at + 4 + run_bytes + 8].to_vec();
        let mut first = run.clone();
        first[8..12].copy_from_slice(&1u32.to_le_bytes());
        first.extend_from_slice(&sizes[..4]);
        let mut second = run;
        second[..8].copy_from_slice(&1u64.to_le_bytes());
        second[8..12].copy_from_slice(&1u32.to_le_bytes());
        second[20..24].copy_from_slice(&1u32.to_le_bytes());
        second.extend_from_slice(&sizes[4..]);
        b.splice(
            at + 4..at + 4 + run_bytes + 8,
            first.into_iter().chain(second),
        );
    };
    split(&mut bytes);
    assert_eq!(Queues::decode(&mut Reader::new(&bytes), 5), None);
}

#[test]
fn queues_survive_a_snapshot_and_garbage_is_refused() {
    let mut qs = one_queue(3);
    qs.create("other", 1).unwrap();
    qs.produce("q", 1, 1, &msgs(6), 5, 1).unwrap();
    qs.produce("other", 2, 9, &msgs(2), 5, 2).unwrap();
    qs.consume("q", 2, 10, 5).unwrap();
    qs.ack("q", &[0, 3]).unwrap();
    qs.consume("other", 5, 10, 5).unwrap();
    qs.consume("other", 5, 10, 50).unwrap();
    let mut bytes = Vec::new();
    qs.encode(&mut bytes, true);
    let mut r = Reader::new(&bytes);
    assert_eq!(Queues::decode(&mut r, 8), Some(qs));
    assert!(r.is_done());
    for cut in 0..bytes.len() {
        assert!(
            Queues::decode(&mut Reader::new(&bytes[..cut]), 8).is_none(),
            "cut {cut}"
        );
    }
    // A next id past every message given: an id that is neither
    // unacked, dead nor acked, which an ack could not find. "other"
    // comes first: count, name, max_deliveries, then its next id.
    let at = 4 + 4 + 5 + 4;
    assert_eq!(bytes[at..at + 8], 2u64.to_le_bytes());
    bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(Queues::decode(&mut Reader::new(&bytes), 8), None);
}

/// A consume hands out no more than `CONSUME_BYTES_MAX` of messages
/// (at least one, which the largest message never exceeds): 20 messages of the largest size used to make an
/// answer no frame could carry, so they were hidden, counted as
/// delivered and never sent, until dead-lettered.
#[test]
fn a_consume_stops_at_its_byte_budget() {
    let mut qs = one_queue(5);
    let big = vec![vec![7u8; MESSAGE_BYTES_MAX]; 20];
    qs.produce("q", 1, 1, &big, 0, 1).unwrap();
    let per_consume = (CONSUME_BYTES_MAX / MESSAGE_BYTES_MAX as u64) as usize;
    assert_eq!(per_consume, 8);
    let first = qs.consume("q", 20, 10, 0).unwrap();
    assert_eq!(ids(&first), (0..8).collect::<Vec<_>>());
    // The rest stay visible and undelivered for the next consume.
    let second = qs.consume("q", 20, 10, 0).unwrap();
    assert_eq!(ids(&second), (8..16).collect::<Vec<_>>());
    assert!(second.iter().all(|d| d.deliveries == 1));
    // Small messages are not held back by it.
    qs.produce("q", 1, 2, &vec![vec![1u8; 10]; 30], 0, 2)
        .unwrap();
    assert_eq!(qs.consume("q", 40, 10, 0).unwrap().len(), 4 + 30);
}

/// A dead-letter list is listed within the same byte budget.
#[test]
fn a_dead_letter_listing_stops_at_the_byte_budget() {
    let mut qs = one_queue(1);
    let big = vec![vec![7u8; MESSAGE_BYTES_MAX]; 20];
    qs.produce("q", 1, 1, &big, 0, 1).unwrap();
    for _ in 0..3 {
        qs.consume("q", 20, 10, 0).unwrap();
    }
    // Visible again after one delivery each: dead-lettered, none handed out.
    assert_eq!(qs.consume("q", 20, 10, 10).unwrap(), vec![]);
    let dead = qs.dead_letters("q", usize::MAX).unwrap();
    assert_eq!(ids(&dead), (0..8).collect::<Vec<_>>());
    assert_eq!(qs.dead_letters("q", 3).unwrap().len(), 3);
}

/// Sizes not recorded (a produce in the older encoding, or a format 4
/// snapshot) count as `MESSAGE_BYTES_MAX`, the same on every replica.
#[test]
fn messages_of_unknown_size_count_as_the_largest() {
    let mut qs = one_queue(5);
    let small = vec![vec![1u8; 10]; 12];
    qs.produce_checked("q", (1, 1), &small, false, 0, 1, true)
        .unwrap();
    assert_eq!(qs.consume("q", 12, 10, 0).unwrap().len(), 8);
    // Format 4: one queue "q", a run of 12 live messages, no dead, no
    // acks, no producers; no sizes after the run.
    let mut v4 = Vec::new();
    put_u32(&mut v4, 1);
    put_bytes(&mut v4, b"q");
    put_u32(&mut v4, 5); // max deliveries
    put_u64(&mut v4, 12); // next id
    put_u32(&mut v4, 1); // live runs
    put_u64(&mut v4, 0); // first id
    put_u32(&mut v4, 12); // count
    put_u64(&mut v4, 7); // index
    put_u32(&mut v4, 0); // slot
    put_u32(&mut v4, 0); // deliveries
    put_u64(&mut v4, 0); // visible at
    put_u32(&mut v4, 0); // dead runs
    put_u32(&mut v4, 0); // acked ranges
    put_u32(&mut v4, 0); // producers
    let mut r = Reader::new(&v4);
    let mut old = Queues::decode(&mut r, 4).expect("a format 4 encoding");
    assert!(r.is_done());
    assert_eq!(old.consume("q", 12, 10, 0).unwrap().len(), 8);
    // Format 5 wants the sizes: the same bytes are refused.
    assert_eq!(Queues::decode(&mut Reader::new(&v4), 5), None);
    // And a size past the largest message is refused.
    let mut v5 = v4.clone();
    let tail = v5.split_off(v5.len() - 12);
    for k in 0..12u32 {
        put_u32(
            &mut v5,
            if k == 3 {
                MESSAGE_BYTES_MAX as u32 + 1
            } else {
                10
            },
        );
    }
    v5.extend_from_slice(&tail);
    assert_eq!(Queues::decode(&mut Reader::new(&v5), 5), None);
}

/// Format 8: the one-message produces of consecutive commands of an
/// entry are one run, not 36 bytes each; the format before still
/// reads; a run of one message that says it spans commands, a kind
/// past 1, and two runs that are one are refused.
#[test]
fn one_message_produces_of_an_entry_are_one_run() {
    let mut qs = one_queue(3);
    for c in 0..100 {
        let at = Stored::at(9, c, 0);
        qs.produce_checked("q", (1, c as u64), &msgs(1), true, 5, at, true)
            .unwrap();
    }
    let (mut v8, mut v7) = (Vec::new(), Vec::new());
    qs.encode(&mut v8, true);
    qs.encode(&mut v7, false);
    // name, max_deliveries, next_id; one run of 37 bytes and 100
    // sizes; no dead, no acked; the producer's window of 64.
    let head = 4 + 4 + 1 + 4 + 8;
    assert_eq!(
        v8.len(),
        head + 4 + 37 + 400 + 4 + 4 + 4 + 8 + 8 + 4 + 64 * 32
    );
    assert_eq!(v7.len(), v8.len() + 99 * 36 - 1);
    assert_eq!(Queues::decode(&mut Reader::new(&v8), 8).as_ref(), Some(&qs));
    assert_eq!(Queues::decode(&mut Reader::new(&v7), 7).as_ref(), Some(&qs));
    let kind_at = head + 4 + 8 + 4;
    assert_eq!(v8[kind_at], 1, "spans commands");
    let mut bad = v8.clone();
    bad[kind_at] = 2;
    assert_eq!(Queues::decode(&mut Reader::new(&bad), 8), None, "kind 2");
    // Two runs of one message each, the first saying it spans commands.
    let mut two = one_queue(3);
    for c in [0, 5] {
        two.produce_checked(
            "q",
            (1, c as u64),
            &msgs(1),
            true,
            5,
            Stored::at(9, c, 0),
            true,
        )
        .unwrap();
    }
    let mut bytes = Vec::new();
    two.encode(&mut bytes, true);
    assert_eq!(
        Queues::decode(&mut Reader::new(&bytes), 8).as_ref(),
        Some(&two)
    );
    bytes[kind_at] = 1;
    assert_eq!(
        Queues::decode(&mut Reader::new(&bytes), 8),
        None,
        "one message spanning"
    );
    // The 100 as two runs of 50: the second would have gone on with
    // the first.
    let run = |first: u64, c: u32| {
        let mut b = Vec::new();
        put_u64(&mut b, first);
        put_u32(&mut b, 50);
        b.push(1);
        put_u64(&mut b, 9);
        put_u32(&mut b, c << COMMAND_SLOT_BITS);
        put_u32(&mut b, 0);
        put_u64(&mut b, 5);
        (0..50).for_each(|_| put_u32(&mut b, 1));
        b
    };
    let mut split = v8[..head].to_vec();
    put_u32(&mut split, 2);
    split.extend(run(0, 0));
    split.extend(run(50, 50));
    split.extend_from_slice(&v8[head + 4 + 37 + 400..]);
    assert_eq!(Queues::decode(&mut Reader::new(&split), 8), None, "split");
    // The same two runs, the second from another entry, read.
    let mut apart = split.clone();
    let index_at = head + 4 + (37 + 200) + 8 + 4 + 1;
    apart[index_at..index_at + 8].copy_from_slice(&10u64.to_le_bytes());
    let back = Queues::decode(&mut Reader::new(&apart), 8).expect("two runs");
    assert_eq!(back.list()[0].unacked, 100);
}

/// The queue as one ordered set of every unacked message: what the
/// fresh tail must never change (the delivery order before it).
#[derive(Default)]
struct Model {
    next_id: u64,
    /// id -> (visible_at_ms, deliveries, counted bytes).
    live: std::collections::BTreeMap<u64, (u64, u32, u32)>,
    dead: std::collections::BTreeSet<u64>,
    acked: std::collections::BTreeSet<u64>,
}

impl Model {
    fn consume(&mut self, max: u32, visibility_ms: u64, now_ms: u64, dl: u32) -> Vec<(u64, u32)> {
        let (mut out, mut bytes) = (Vec::new(), 0u64);
        while out.len() < max as usize {
            let next = self.live.iter().map(|(&id, &(at, ..))| (at, id)).min();
            let Some((at, id)) = next.filter(|&(at, _)| at <= now_ms) else {
                break;
            };
            let (_, deliveries, counted) = self.live[&id];
            let fits = bytes + u64::from(counted) <= CONSUME_BYTES_MAX;
            if deliveries < dl && !fits && !out.is_empty() {
                break;
            }
            self.live.remove(&id);
            if deliveries >= dl {
                self.dead.insert(id);
                continue;
            }
            let _ = at;
            bytes += u64::from(counted);
            self.live
                .insert(id, (now_ms + visibility_ms, deliveries + 1, counted));
            out.push((id, deliveries + 1));
        }
        out
    }

    fn ack(&mut self, ids: &[u64]) -> u64 {
        let mut n = 0;
        for &id in ids {
            if id < self.next_id && self.acked.insert(id) {
                self.live.remove(&id);
                self.dead.remove(&id);
                n += 1;
            }
        }
        n
    }
}

/// Random produces (the leader's clock sometimes going back, sizes
/// counted or not), consumes and acks (of fresh, delivered, dead,
/// acked and unknown ids) on a queue, on a copy of it restored from
/// its snapshot now and then, and on the model: the three deliver the
/// same, and the two queues encode to the same bytes.
#[test]
fn the_fresh_tail_delivers_as_one_ordered_set_would() {
    use rand::{Rng, SeedableRng};
    for seed in 0..40u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let dl = rng.gen_range(1..4);
        let (mut a, mut b, mut model) = (one_queue(dl), one_queue(dl), Model::default());
        let (mut now, mut index, mut command) = (1_000u64, 1u64, 0usize);
        for step in 0..600u64 {
            match rng.gen_range(0..10) {
                0..=3 => {
                    now = if rng.gen_bool(0.1) {
                        now - rng.gen_range(0..20)
                    } else {
                        now + rng.gen_range(0..5)
                    };
                    let n = rng.gen_range(0..4);
                    let batch: Vec<Vec<u8>> = (0..n)
                        .map(|k| vec![k as u8; rng.gen_range(0..50)])
                        .collect();
                    let counted = rng.gen_bool(0.8);
                    // Often the next command of the same entry: runs
                    // that span commands (format 8).
                    if rng.gen_bool(0.6) {
                        command += 1;
                    } else {
                        (index, command) = (index + 1, rng.gen_range(0..2));
                    }
                    let at = Stored::at(index, command, 0);
                    let ra = a.produce_checked("q", (1, step), &batch, counted, now, at, true);
                    let rb = b.produce_checked("q", (1, step), &batch, counted, now, at, true);
                    assert_eq!(ra, rb);
                    for m in &batch {
                        let size = if counted {
                            m.len() as u32
                        } else {
                            MESSAGE_BYTES_MAX as u32
                        };
                        model.live.insert(model.next_id, (now, 0, size));
                        model.next_id += 1;
                    }
                    assert_eq!(ra.unwrap().0.end, model.next_id, "seed {seed} step {step}");
                }
                4..=6 => {
                    now += rng.gen_range(0..30);
                    let (max, vis) = (rng.gen_range(1..12), rng.gen_range(1..40));
                    let da = a.consume("q", max, vis, now).unwrap();
                    let db = b.consume("q", max, vis, now).unwrap();
                    assert_eq!(da, db, "seed {seed} step {step}");
                    let got: Vec<(u64, u32)> = da.iter().map(|d| (d.id, d.deliveries)).collect();
                    assert_eq!(
                        got,
                        model.consume(max, vis, now, dl),
                        "seed {seed} step {step}"
                    );
                }
                7 | 8 => {
                    let ids: Vec<u64> = (0..rng.gen_range(1..6))
                        .map(|_| rng.gen_range(0..model.next_id + 2))
                        .collect();
                    let n = model.ack(&ids);
                    assert_eq!(a.ack("q", &ids).unwrap(), n, "seed {seed} step {step}");
                    assert_eq!(b.ack("q", &ids).unwrap(), n);
                }
                _ => {
                    let mut bytes = Vec::new();
                    b.encode(&mut bytes, true);
                    b = Queues::decode(&mut Reader::new(&bytes), 8).expect("its own snapshot");
                    assert_eq!(a, b, "seed {seed} step {step}");
                }
            }
            let info = &a.list()[0];
            let unacked = model.live.len() as u64;
            assert_eq!(
                (info.unacked, info.dead),
                (unacked, model.dead.len() as u64)
            );
        }
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        a.encode(&mut ea, true);
        b.encode(&mut eb, true);
        assert_eq!(ea, eb, "seed {seed}");
    }
}
