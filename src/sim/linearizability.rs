//! A linearizability checker for recorded histories, in the style of
//! Wing & Gong as refined by Lowe and by Porcupine: a depth-first search
//! over linearization orders that only ever tries an operation whose call
//! comes before every pending return, memoising each (set linearized,
//! model state) it has explored so that no state is searched twice.
//!
//! The caller partitions its history into independent parts (the ledger
//! checker: one part per ledger) and runs this on each; the search is
//! exponential in the worst case, so it is bounded in steps and reports
//! when it gave up rather than running on.
//!
//! An operation whose outcome is unknown (a timeout, a crash) gets a return
//! at infinity: it may be linearized anywhere after its call, including
//! after everything else, which is the same as not taking effect.

use std::collections::HashSet;

/// One operation's real-time interval, in simulated ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// When it was invoked.
    pub invoked_ms: u64,
    /// When its answer arrived; `None` if the outcome is unknown.
    pub completed_ms: Option<u64>,
}

/// What the search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some order consistent with real time explains every answer.
    Linearizable,
    /// No such order; the longest prefix any attempt linearized, by
    /// operation position, to show where it got stuck.
    NotLinearizable {
        /// The longest linearized prefix found.
        longest_prefix: Vec<usize>,
    },
    /// The search gave up after this many steps.
    BoundHit {
        /// Steps taken.
        steps: u64,
    },
}

/// Searches for a linearization of `ops` against a sequential model.
///
/// `step(state, i)` applies operation `i` to `state` and returns the new
/// state if the operation's recorded answer is what the model answers
/// there (an unknown answer always matches), `None` otherwise.
/// `fingerprint` hashes a state for the memo; equal states must give
/// equal fingerprints (a 64-bit collision between different states could
/// prune a branch wrongly, which a good hash makes vanishingly unlikely).
/// At most `steps_max` operations are tried.
pub fn check<S: Clone>(
    ops: &[Interval],
    init: S,
    mut step: impl FnMut(&S, usize) -> Option<S>,
    fingerprint: impl Fn(&S) -> u64,
    steps_max: u64,
) -> Verdict {
    let n = ops.len();
    // Events 0..n are calls, n..2n returns; 2n is the list head.
    let mut events: Vec<usize> = (0..2 * n).collect();
    let time = |e: usize| -> (u64, u8) {
        if e < n {
            (ops[e].invoked_ms, 0)
        } else {
            // Calls sort before returns at the same ms: operations whose
            // ends touch count as concurrent, which never invents a violation.
            (ops[e - n].completed_ms.unwrap_or(u64::MAX), 1)
        }
    };
    events.sort_by_key(|&e| (time(e), e));
    let head = 2 * n;
    let mut next = vec![usize::MAX; 2 * n + 1];
    let mut prev = vec![usize::MAX; 2 * n + 1];
    let mut last = head;
    for &e in &events {
        next[last] = e;
        prev[e] = last;
        last = e;
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        let (p, q) = (prev[e], next[e]);
        next[p] = q;
        if q != usize::MAX {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        let (p, q) = (prev[e], next[e]);
        next[p] = e;
        if q != usize::MAX {
            prev[q] = e;
        }
    };

    let words = n.div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut memo: HashSet<(Vec<u64>, u64)> = HashSet::new();
    let mut stack: Vec<(usize, S)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut state = init;
    let mut steps = 0u64;
    let mut entry = next[head];
    loop {
        if next[head] == usize::MAX {
            return Verdict::Linearizable;
        }
        if entry < n {
            let i = entry;
            steps += 1;
            if steps > steps_max {
                return Verdict::BoundHit { steps };
            }
            let mut tried = None;
            if let Some(s) = step(&state, i) {
                linearized[i / 64] |= 1 << (i % 64);
                if memo.insert((linearized.clone(), fingerprint(&s))) {
                    tried = Some(s);
                } else {
                    linearized[i / 64] &= !(1 << (i % 64));
                }
            }
            match tried {
                Some(s) => {
                    stack.push((i, std::mem::replace(&mut state, s)));
                    // Lift the operation: its call and its return leave the list.
                    unlink(&mut next, &mut prev, i);
                    unlink(&mut next, &mut prev, i + n);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|(op, _)| *op).collect();
                    }
                    entry = next[head];
                }
                None => entry = next[entry],
            }
        } else {
            // A return whose call is still in the list: the operations
            // linearized so far cannot be extended; undo the latest.
            let Some((i, old)) = stack.pop() else {
                return Verdict::NotLinearizable {
                    longest_prefix: longest,
                };
            };
            state = old;
            linearized[i / 64] &= !(1 << (i % 64));
            relink(&mut next, &mut prev, i + n);
            relink(&mut next, &mut prev, i);
            entry = next[i];
        }
        if entry == usize::MAX && next[head] != usize::MAX {
            // Past the end without lifting everything (cannot happen while
            // every call precedes its return; kept as a dead end for safety).
            let Some((i, old)) = stack.pop() else {
                return Verdict::NotLinearizable {
                    longest_prefix: longest,
                };
            };
            state = old;
            linearized[i / 64] &= !(1 << (i % 64));
            relink(&mut next, &mut prev, i + n);
            relink(&mut next, &mut prev, i);
            entry = next[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (invoked, completed or unknown, value written, value read).
    type RegisterOp = (u64, Option<u64>, Option<u64>, Option<u64>);

    /// Checks a history of a register that starts at 0.
    fn register(ops: &[RegisterOp]) -> Verdict {
        let intervals: Vec<Interval> = ops
            .iter()
            .map(|&(a, b, _, _)| Interval {
                invoked_ms: a,
                completed_ms: b,
            })
            .collect();
        check(
            &intervals,
            0u64,
            |s, i| match ops[i] {
                (_, _, Some(w), _) => Some(w),
                (_, _, None, Some(r)) => (r == *s).then_some(*s),
                (_, _, None, None) => Some(*s),
            },
            |s| *s,
            10_000,
        )
    }

    #[test]
    fn overlapping_write_and_reads_linearize() {
        // write 1 during [0, 10]; a read during [5, 6] sees 1, a later one too.
        let h = [
            (0, Some(10), Some(1), None),
            (5, Some(6), None, Some(1)),
            (11, Some(12), None, Some(1)),
        ];
        assert_eq!(register(&h), Verdict::Linearizable);
    }

    #[test]
    fn a_stale_read_after_a_completed_write_does_not() {
        let h = [(0, Some(10), Some(1), None), (11, Some(12), None, Some(0))];
        assert!(matches!(register(&h), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn an_unknown_write_may_or_may_not_take_effect() {
        let took = [(0, None, Some(1), None), (20, Some(21), None, Some(1))];
        assert_eq!(register(&took), Verdict::Linearizable);
        let did_not = [(0, None, Some(1), None), (20, Some(21), None, Some(0))];
        assert_eq!(register(&did_not), Verdict::Linearizable);
    }
}
