//! A client batch entry's decoder on untrusted bytes (an entry that passed
//! its checksum but was written by a buggy or hostile leader): never a
//! panic, never a record past the bytes, at most the count it claims and
//! `RECORDS_PER_ENTRY_MAX`; records that decode re-encode to a prefix of
//! the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::state::dedup::{
    begin_client_batch, client_records, push_client_record, CLIENT_BATCH_ENTRY,
    RECORDS_PER_ENTRY_MAX,
};

fuzz_target!(|data: &[u8]| {
    let Some(records) = client_records(data) else {
        return;
    };
    let records: Vec<_> = records.collect();
    assert!(records.len() <= RECORDS_PER_ENTRY_MAX);
    if data[0] == CLIENT_BATCH_ENTRY {
        let mut again = Vec::new();
        begin_client_batch(&mut again);
        for (client, seq, bytes) in &records {
            push_client_record(&mut again, *client, *seq, bytes);
        }
        // Same records, same bytes (the count aside).
        assert_eq!(again[5..], data[5..again.len()]);
    }
});
