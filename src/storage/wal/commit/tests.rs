use super::super::test_support::{entry, indexes, small_cfg};
use super::*;
use crate::consensus::Payload;

#[test]
fn tickets_become_durable_in_order_and_cover_their_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    let mut tickets = Vec::new();
    for i in 1..=20 {
        tickets.push(wal.append(None, &[entry(i)]).unwrap());
        wal.poll().unwrap();
        assert!(wal.durable_ticket() <= *tickets.last().unwrap());
        assert!(wal.durable().0 <= i);
    }
    assert!(tickets.windows(2).all(|w| w[0] <= w[1]));
    wal.sync().unwrap();
    assert_eq!(wal.durable_ticket(), *tickets.last().unwrap());
    assert_eq!(wal.durable(), (20, 1));
    assert_eq!(wal.queue_depth(), 0);
    assert_eq!(wal.metrics().records, 20);
}

#[test]
fn an_entry_larger_than_a_flush_gets_a_batch_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    let big = Entry {
        term: 1,
        index: 2,
        payload: Payload::Normal(vec![7; 20 << 10].into()),
    };
    wal.append(None, &[entry(1), big.clone(), entry(3)])
        .unwrap();
    wal.sync().unwrap();
    let batch = wal.batch_at(2).unwrap();
    assert_eq!((batch.first_index, batch.count), (2, 1));
    assert_eq!(wal.read(1, 3).unwrap()[1], big);
}

#[test]
fn an_entry_the_log_cannot_store_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    let too_big = Entry {
        term: 1,
        index: 1,
        payload: Payload::Normal(vec![0; wal.entry_bytes_max() + 1].into()),
    };
    let err = wal.append(None, &[too_big]).expect_err("refused");
    assert!(matches!(err, WalError::Invalid(_)), "{err}");
    assert_eq!(wal.last().0, 0);
    wal.append(None, &[entry(1)]).unwrap();
    wal.sync().unwrap();
    assert_eq!(wal.durable().0, 1);
}

#[test]
fn a_truncation_replaces_the_tail_with_the_new_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), small_cfg()).unwrap();
    wal.append(None, &(1..=6).map(entry).collect::<Vec<_>>())
        .unwrap();
    wal.sync().unwrap();
    let rewritten: Vec<Entry> = (4..=5)
        .map(|i| Entry {
            term: 2,
            ..entry(i)
        })
        .collect();
    wal.append(Some(4), &rewritten).unwrap();
    wal.sync().unwrap();
    assert_eq!(wal.last(), (5, 2));
    let read = wal.read(1, 5).unwrap();
    assert_eq!(indexes(&read), [1, 2, 3, 4, 5]);
    assert_eq!(read[3].term, 2);
    assert!(!wal.holds(6));
}
