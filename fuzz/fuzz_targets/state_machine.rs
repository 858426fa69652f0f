//! The ledger and queue state machine on untrusted bytes: the first byte
//! picks a command entry, a snapshot, a query, an answer or an outcome
//! (the last three as the client protocol carries them). Never a panic;
//! anything decoded or restored re-encodes to the same bytes, and a
//! restored state (however odd) applies further commands and answers
//! queries without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::state::{Answer, Command, Outcome, Query, StateMachine};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        2 => {
            if let Some(q) = Query::decode(rest) {
                assert_eq!(q.encode(), rest, "an accepted query is canonical");
                let _ = StateMachine::new().query(&q);
            }
            return;
        }
        3 => {
            if let Some(a) = Answer::decode(rest) {
                assert_eq!(a.encode(), rest, "an accepted answer is canonical");
            }
            return;
        }
        4 => {
            if let Some(o) = Outcome::decode(rest) {
                assert_eq!(o.encode(), rest, "an accepted outcome is canonical");
            }
            return;
        }
        _ => {}
    }
    if mode % 5 == 0 {
        if let Some(cmd) = Command::decode(rest) {
            assert_eq!(cmd.encode(), rest, "an accepted command is canonical");
            let mut sm = StateMachine::new();
            let _ = sm.apply(1, &cmd);
        }
        return;
    }
    // A snapshot: a fixed set of commands is applied to whatever restores
    // (ledger 0 and queue "q" are the ones the fuzzer can forge).
    if let Ok(mut sm) = StateMachine::restore(rest) {
        assert_eq!(sm.snapshot(), rest, "an accepted snapshot is canonical");
        let q = || "q".to_string();
        let cmds = [
            Command::CreateLedger {
                writer_token: 1,
                now_ms: 1,
            },
            Command::AddEntry {
                ledger: 0,
                writer_token: 1,
                data: vec![1],
            },
            Command::SetLac {
                ledger: 0,
                writer_token: 1,
                lac: 0,
            },
            Command::OpenRecover { ledger: 0 },
            Command::Produce {
                queue: q(),
                producer_id: 1,
                seq: 1,
                messages: vec![vec![2]],
            },
            Command::Consume {
                queue: q(),
                consumer: 1,
                max: 8,
                visibility_ms: 1,
                now_ms: u64::MAX,
            },
            Command::Ack {
                queue: q(),
                ids: vec![0, 1, u64::MAX],
            },
        ];
        for cmd in &cmds {
            let next = sm.applied_index().saturating_add(1);
            let _ = sm.apply(next, cmd);
        }
        for q in [
            Query::ListLedgers,
            Query::ListQueues,
            Query::Ledger { ledger: 0 },
            Query::ReadLedger {
                ledger: 0,
                from: 0,
                to: u64::MAX,
            },
            Query::DeadLetters { queue: q() },
        ] {
            let _ = sm.query(&q);
        }
    }
});
