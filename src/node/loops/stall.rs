//! The loop's own clock, which does not count the time the loop itself
//! was not running.
//!
//! A node that was paused (SIGSTOP, a whole-VM pause, a page-fault storm,
//! starved of CPU on a busy host) saw nothing while it was paused; when it
//! resumes, the datagrams and serial bytes its peers sent meanwhile are
//! still waiting in its sockets. Timing its peers against the wall clock
//! would blame them for its own pause: every link would be declared dead
//! at once and an election started against a healthy leader (corosync's
//! pause detection and Cassandra's GC-pause handling avoid the same).
//!
//! So each loop measures its own stalls: every turn it knows how long it
//! asked to wait; when the turn comes back later than that by more than
//! `stall_grace_ms`, the excess is a stall, and the loop's clock (which
//! Raft's timers, the failure detector and the WAL's stall check all read)
//! does not advance by it. The clock stays monotonic. Real failures are
//! still detected within the configured deadtime of the loop's own
//! running time; a loop that is never late runs on the wall clock.
//!
//! Sans-IO: the caller passes in the real time (ms since the node's start)
//! at each point; nothing here reads a clock.

use std::cell::Cell;

/// A stall at least this long is logged (shorter ones are only counted).
pub(crate) const STALL_LOGGED_MS: u64 = 100;

/// The loop's stall-compensated clock.
#[derive(Clone, Debug)]
pub(crate) struct StallClock {
    /// Lateness beyond the wait asked for that is not yet a stall.
    grace_ms: u64,
    /// Real ms at the end of the last wait, and the wait asked for since.
    last_wake_real_ms: u64,
    wait_asked_ms: u64,
    /// Total ms not counted, since the start.
    stalled_ms: u64,
    /// The latest time handed out: the clock never goes back. A cell, so
    /// that reading the clock takes `&self` like reading a real one.
    last_now_ms: Cell<u64>,
    /// Turns that stalled, and the longest stall, in ms.
    stalls: u64,
    longest_ms: u64,
}

impl StallClock {
    /// A clock that starts at `real_ms` and forgives lateness up to
    /// `grace_ms` per turn.
    pub(crate) fn new(real_ms: u64, grace_ms: u64) -> Self {
        StallClock {
            grace_ms,
            last_wake_real_ms: real_ms,
            wait_asked_ms: 0,
            stalled_ms: 0,
            last_now_ms: Cell::new(real_ms),
            stalls: 0,
            longest_ms: 0,
        }
    }

    /// The loop is about to wait up to `wait_ms`.
    pub(crate) fn waiting(&mut self, wait_ms: u64) {
        self.wait_asked_ms = wait_ms;
    }

    /// The loop woke at `real_ms`. Returns the stall found (ms not
    /// counted), if any: the time since the last wake beyond the wait
    /// asked for and the grace. That time spans this turn's work and its
    /// wait, both of which the loop spent not looking at its peers.
    pub(crate) fn woke(&mut self, real_ms: u64) -> Option<u64> {
        let gap = real_ms.saturating_sub(self.last_wake_real_ms);
        self.last_wake_real_ms = real_ms;
        let late = gap.saturating_sub(self.wait_asked_ms.saturating_add(self.grace_ms));
        // Never hand out a time before one already handed out.
        let room = real_ms
            .saturating_sub(self.stalled_ms)
            .saturating_sub(self.last_now_ms.get());
        let stall = late.min(room);
        if stall == 0 {
            return None;
        }
        self.stalled_ms += stall;
        self.stalls += 1;
        self.longest_ms = self.longest_ms.max(stall);
        Some(stall)
    }

    /// The loop's time at real time `real_ms`: the real time less every
    /// stall so far; never less than a time already returned.
    pub(crate) fn now(&self, real_ms: u64) -> u64 {
        let now = real_ms
            .saturating_sub(self.stalled_ms)
            .max(self.last_now_ms.get());
        self.last_now_ms.set(now);
        now
    }

    /// What [`StallClock::now`] would return, without counting it as
    /// handed out: a turn's work done after a peek can still be found to
    /// have been a stall at the next wake.
    pub(crate) fn peek(&self, real_ms: u64) -> u64 {
        real_ms
            .saturating_sub(self.stalled_ms)
            .max(self.last_now_ms.get())
    }

    /// Total ms not counted since the start.
    pub(crate) fn stalled_ms(&self) -> u64 {
        self.stalled_ms
    }

    /// Turns that stalled since the start.
    pub(crate) fn stalls(&self) -> u64 {
        self.stalls
    }

    /// The longest stall since the start, in ms.
    pub(crate) fn longest_ms(&self) -> u64 {
        self.longest_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_on_time_runs_on_the_real_clock() {
        let mut c = StallClock::new(0, 20);
        let mut real = 0;
        for _ in 0..1000 {
            c.waiting(10);
            real += 10 + 5; // the wait plus some work, within the grace
            assert_eq!(c.woke(real), None);
            assert_eq!(c.now(real), real);
        }
        assert_eq!((c.stalled_ms(), c.stalls()), (0, 0));
    }

    #[test]
    fn a_pause_is_not_counted_and_the_clock_stays_monotonic() {
        let mut c = StallClock::new(1_000, 20);
        c.waiting(10);
        assert_eq!(c.woke(1_010), None);
        assert_eq!(c.now(1_010), 1_010);
        // Paused for two seconds inside a 10 ms wait.
        c.waiting(10);
        assert_eq!(c.woke(3_010), Some(2_000 - 10 - 20));
        let after = c.now(3_010);
        assert_eq!(after, 1_010 + 10 + 20, "only the wait and the grace count");
        assert_eq!((c.stalls(), c.longest_ms()), (1, 1_970));
        // A turn whose work took 490 ms: what was handed out during it is
        // never taken back, so only the 10 ms since can be discounted.
        c.waiting(10);
        let during = c.now(3_500);
        assert_eq!(during, 3_500 - 1_970);
        assert_eq!(c.woke(3_510), Some(10));
        assert_eq!(c.now(3_510), during);
        assert_eq!(c.now(3_600), during + 90, "then it runs on");
    }

    #[test]
    fn a_turn_that_blocks_after_its_time_was_read_is_a_stall_too() {
        // The turn's time is read at the wake; its work then blocks for
        // 2 s (a synchronous disk call under I/O pressure); the next wait
        // is computed from a peek. The block is discounted at the wake.
        let mut c = StallClock::new(0, 20);
        c.waiting(10);
        assert_eq!(c.woke(10), None);
        let turn = c.now(10);
        assert_eq!(c.peek(2_010), 2_010, "a peek sees the real time");
        c.waiting(0);
        assert_eq!(c.woke(2_011), Some(2_001 - 20));
        assert_eq!(c.now(2_011), turn + 20, "the 20 ms of grace count");
    }

    #[test]
    fn a_clock_that_is_never_late_detects_a_silent_peer_in_real_time() {
        // The compensation only ever removes the loop's own lateness: a
        // peer silent for 250 ms of real time while the loop ran on time
        // is 250 ms late on this clock too.
        let mut c = StallClock::new(0, 20);
        let heard = c.now(0);
        let mut real = 0;
        while real < 250 {
            c.waiting(10);
            real += 10;
            c.woke(real);
        }
        assert_eq!(c.now(real) - heard, 250);
    }
}
