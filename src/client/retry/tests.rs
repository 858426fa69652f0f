//! The retry policy driven by hand: each test plays the nodes' answers
//! and the clock, and checks the verdicts. No sockets, no sleeps.

use super::*;

/// Three addresses whose HelloOk named nodes 1, 2 and 3.
fn three_nodes() -> Leaders {
    let mut leaders = Leaders::new(3);
    for (addr, node) in [(0, 1), (1, 2), (2, 3)] {
        leaders.connected(addr, node);
    }
    leaders
}

fn append(client_id: u64, seq: u64) -> Request {
    Request::Append {
        group: 0,
        client_id,
        seq,
        data: b"x".to_vec().into(),
    }
}

fn not_leader(leader: Option<NodeId>) -> Result<Response, CallError> {
    Ok(Response::Error {
        code: ErrorCode::NotLeader,
        message: "not the leader".into(),
        leader: leader.map(|l| (l, format!("node{l}:7000"))),
    })
}

fn refused(code: ErrorCode, message: &str) -> Result<Response, CallError> {
    Ok(Response::Error {
        code,
        message: message.into(),
        leader: None,
    })
}

fn lost(why: &str) -> Result<Response, CallError> {
    Err(CallError::Lost(why.into()))
}

#[test]
fn a_redirect_is_followed_to_the_named_leader_and_remembered() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    // Node 1 names node 3, at address 2. The leader gets every other
    // try, so the odd second try still rotates (to address 1) ...
    assert_eq!(
        call.answered(1, &mut leaders, 0, not_leader(Some(3))),
        Verdict::Send(1)
    );
    assert_eq!(leaders.leader(0), Some(3));
    // ... and the third goes to the leader; a redirect never waits.
    assert_eq!(
        call.answered(2, &mut leaders, 1, not_leader(Some(3))),
        Verdict::Send(2)
    );
    let done = Response::Appended { index: 9 };
    assert_eq!(
        call.answered(3, &mut leaders, 2, Ok(done.clone())),
        Verdict::Done(done)
    );
    // The next call starts at the leader.
    let mut again = Attempts::new(0, append(7, 2), 4, 1000);
    assert_eq!(again.next(4, &leaders), Verdict::Send(2));
}

#[test]
fn with_no_leader_known_each_address_is_tried_in_turn() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    let mut tried = vec![];
    let mut t = 0;
    let mut v = call.next(t, &leaders);
    while tried.len() < 5 {
        t += 1;
        v = match v {
            Verdict::Send(addr) => {
                tried.push(addr);
                call.answered(t, &mut leaders, addr, lost("connection refused"))
            }
            // A whole round lost waits (a_whole_round_of_lost_connections_backs_off).
            Verdict::RetryAfter { ms } => {
                t += ms;
                call.next(t, &leaders)
            }
            other => panic!("expected a send or a wait, got {other:?}"),
        };
    }
    assert_eq!(tried, [0, 1, 2, 0, 1]);
    assert_eq!(v, Verdict::Send(2)); // the sixth, already handed out
    assert_eq!(call.sent(), 6);
}

#[test]
fn a_lost_answer_is_retried_with_the_same_client_id_and_seq() {
    let mut leaders = three_nodes();
    leaders.lead(0, 1); // address 0 leads, then goes
    let request = append(7, 42);
    let mut call = Attempts::new(0, request.clone(), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    let sent_first = call.request().clone();
    // The leader is forgotten with the connection: ask around, at once.
    assert_eq!(
        call.answered(5, &mut leaders, 0, lost("connection reset")),
        Verdict::Send(1)
    );
    assert_eq!(leaders.leader(0), None);
    assert_eq!(call.request(), &sent_first);
    assert_eq!(call.request(), &request);
    let Request::Append { client_id, seq, .. } = call.request() else {
        panic!("the request changed kind")
    };
    assert_eq!((*client_id, *seq), (7, 42));
}

#[test]
fn success_is_done_and_names_the_leader() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    let done = Response::Appended { index: 3 };
    assert_eq!(
        call.answered(1, &mut leaders, 0, Ok(done.clone())),
        Verdict::Done(done)
    );
    assert_eq!(leaders.leader(0), Some(1));
}

#[test]
fn a_busy_cluster_backs_off_before_the_next_try() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    let mut now_ms = 0;
    for code in [
        ErrorCode::Unavailable,
        ErrorCode::Timeout,
        ErrorCode::DiskFull,
    ] {
        let Verdict::Send(addr) = call.next(now_ms, &leaders) else {
            panic!("no send at {now_ms} ms")
        };
        assert_eq!(
            call.answered(now_ms, &mut leaders, addr, refused(code, "busy")),
            Verdict::RetryAfter { ms: BACKOFF_MS }
        );
        // Asked early, it says how much of the wait is left.
        assert_eq!(
            call.next(now_ms + 5, &leaders),
            Verdict::RetryAfter { ms: BACKOFF_MS - 5 }
        );
        now_ms += BACKOFF_MS;
    }
    // An election (no leader named) waits too.
    let Verdict::Send(addr) = call.next(now_ms, &leaders) else {
        panic!("no send after the wait")
    };
    assert_eq!(
        call.answered(now_ms, &mut leaders, addr, not_leader(None)),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(call.sent(), 4);
}

#[test]
fn past_the_deadline_it_fails_with_the_last_error() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 1000, 100);
    assert_eq!(call.next(1000, &leaders), Verdict::Send(0));
    assert_eq!(
        call.answered(
            1050,
            &mut leaders,
            0,
            refused(ErrorCode::Timeout, "no quorum")
        ),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(call.next(1070, &leaders), Verdict::Send(1));
    // The answer of a try sent in time is still taken ...
    assert_eq!(
        call.answered(1120, &mut leaders, 1, lost("10.0.0.2:7000: timed out")),
        Verdict::Fail(ClientError::Unavailable("10.0.0.2:7000: timed out".into()))
    );
    // ... and a refusal's text is what the error says when it was last.
    let mut call = Attempts::new(0, append(7, 2), 0, 10);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    assert_eq!(
        call.answered(
            5,
            &mut leaders,
            0,
            refused(ErrorCode::Unavailable, "node stopping")
        ),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(
        call.next(25, &leaders),
        Verdict::Fail(ClientError::Unavailable(
            "unavailable: node stopping".into()
        ))
    );
    // No time at all: nothing is sent.
    let mut call = Attempts::new(0, append(7, 3), 0, 0);
    assert_eq!(
        call.next(0, &leaders),
        Verdict::Fail(ClientError::Unavailable("no node tried".into()))
    );
    assert_eq!(call.sent(), 0);
}

#[test]
fn a_permanent_refusal_fails_at_once() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    assert_eq!(
        call.answered(
            1,
            &mut leaders,
            0,
            refused(ErrorCode::Conflict, "seq forgotten")
        ),
        Verdict::Fail(ClientError::Refused(
            ErrorCode::Conflict,
            "seq forgotten".into()
        ))
    );
    // A connection refusal every node shares: not retried anywhere.
    let mut call = Attempts::new(0, append(7, 2), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    let r = Err(CallError::refused(
        ErrorCode::Unauthorized,
        "bad token".into(),
    ));
    assert_eq!(
        call.answered(1, &mut leaders, 0, r),
        Verdict::Fail(ClientError::Refused(
            ErrorCode::Unauthorized,
            "bad token".into()
        ))
    );
    assert_eq!(call.sent(), 1);
    // Any other connection refusal is a lost try.
    assert_eq!(
        CallError::refused(ErrorCode::Unavailable, "full".into()),
        CallError::Lost("unavailable: full".into())
    );
}

fn stale_read() -> Request {
    Request::Read {
        group: 0,
        from: 1,
        max_entries: 10,
        max_bytes: 1 << 20,
        stale: true,
    }
}

#[test]
fn a_call_any_node_may_serve_goes_round_and_waits_only_after_a_whole_round() {
    let mut leaders = three_nodes();
    leaders.lead(0, 3); // not consulted: any node serves
    let mut call = Attempts::any_node(stale_read(), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    let busy = || refused(ErrorCode::Unavailable, "catching up");
    assert_eq!(call.answered(1, &mut leaders, 0, busy()), Verdict::Send(1));
    assert_eq!(
        call.answered(2, &mut leaders, 1, lost("connection refused")),
        Verdict::Send(2)
    );
    assert_eq!(
        call.answered(3, &mut leaders, 2, refused(ErrorCode::Timeout, "slow")),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(call.next(3 + BACKOFF_MS, &leaders), Verdict::Send(0));
    let entries = Response::Entries { entries: vec![] };
    assert_eq!(
        call.answered(30, &mut leaders, 0, Ok(entries.clone())),
        Verdict::Done(entries)
    );
    // A stale answer says nothing of who leads.
    assert_eq!(leaders.leader(0), Some(3));
}

#[test]
fn a_call_any_node_may_serve_stops_at_a_refusal_and_at_its_deadline() {
    let mut leaders = three_nodes();
    let mut call = Attempts::any_node(stale_read(), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    assert_eq!(
        call.answered(1, &mut leaders, 0, not_leader(Some(2))),
        Verdict::Fail(ClientError::Refused(
            ErrorCode::NotLeader,
            "not the leader".into()
        ))
    );
    let mut call = Attempts::any_node(stale_read(), 0, 10);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    assert_eq!(
        call.answered(10, &mut leaders, 0, lost("timed out")),
        Verdict::Fail(ClientError::Unavailable("timed out".into()))
    );
}

#[test]
fn a_whole_round_of_lost_connections_backs_off() {
    let mut leaders = three_nodes();
    let mut call = Attempts::new(0, append(7, 1), 0, 1000);
    assert_eq!(call.next(0, &leaders), Verdict::Send(0));
    // One node gone: the next is tried at once.
    assert_eq!(
        call.answered(1, &mut leaders, 0, lost("refused")),
        Verdict::Send(1)
    );
    assert_eq!(
        call.answered(2, &mut leaders, 1, lost("refused")),
        Verdict::Send(2)
    );
    // Every address failed in a row: the cluster is not dialled in a
    // busy loop.
    assert_eq!(
        call.answered(3, &mut leaders, 2, lost("refused")),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(
        call.next(3 + BACKOFF_MS - 1, &leaders),
        Verdict::RetryAfter { ms: 1 }
    );
    assert_eq!(call.next(3 + BACKOFF_MS, &leaders), Verdict::Send(0));
    // An answer in between starts the count again.
    assert_eq!(
        call.answered(30, &mut leaders, 0, not_leader(None)),
        Verdict::RetryAfter { ms: BACKOFF_MS }
    );
    assert_eq!(call.next(50, &leaders), Verdict::Send(1));
    assert_eq!(
        call.answered(51, &mut leaders, 1, lost("refused")),
        Verdict::Send(2)
    );
}

#[test]
fn with_a_leader_known_the_other_tries_reach_every_address() {
    // Four addresses: the tries between the leader's must still go round
    // all of them.
    let mut leaders = Leaders::new(4);
    for addr in 0..4 {
        leaders.connected(addr, addr as NodeId + 1);
    }
    leaders.lead(0, 2); // address 1
    let picks: Vec<usize> = (0..8).map(|a| leaders.pick(0, a)).collect();
    assert_eq!(picks, [1, 1, 1, 2, 1, 3, 1, 0]);
}
