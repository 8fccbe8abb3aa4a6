//! A linearizability checker for one register: whether the writes and reads a history recorded
//! can be put in one order that respects real time (an operation that ended before another
//! started comes first) and in which every read returns the value of the latest write before it
//! (the search of Wing and Gong, with Lowe's memoization of the states already explored).
//!
//! Every write writes a value of its own. A write whose outcome is unknown (its answer was lost,
//! it timed out) may have taken effect at any time after it started, or never; one whose value
//! no read returned is left out (leaving it out never makes a history less linearizable).

use std::collections::{BTreeMap, HashSet};

use crate::history::Ms;

/// One operation on the register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterOp {
    pub start: Ms,
    /// `None`: its outcome is unknown (a write only).
    pub end: Option<Ms>,
    pub kind: Access,
}

/// A write of a value, or a read that returned one (`None`: the register held nothing yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Write(u64),
    Read(Option<u64>),
}

/// Most states the search explores before it gives up (and says so, rather than pass).
const STATES_MAX: usize = 5_000_000;

/// Why a history is not linearizable, or could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotLinearizable {
    /// No order fits; `op` is the earliest operation (by start) that the order which got
    /// furthest could not place: where to look first, not necessarily the culprit.
    Violated { op: RegisterOp },
    /// The search explored [`STATES_MAX`] states without an answer.
    TooLarge,
}

/// Whether `ops` on a register that starts holding `initial` are linearizable.
pub fn check_register(initial: Option<u64>, ops: &[RegisterOp]) -> Result<(), NotLinearizable> {
    // A write of unknown outcome whose value some read returned took effect before the first
    // such read ended: it ends there, and must be placed. One whose value no read returned is
    // left out.
    let mut first_read: BTreeMap<u64, Ms> = BTreeMap::new();
    for op in ops {
        if let (Access::Read(Some(v)), Some(end)) = (op.kind, op.end) {
            let first = first_read.entry(v).or_insert(end);
            *first = (*first).min(end);
        }
    }
    let mut ops: Vec<Placed> = ops
        .iter()
        .filter_map(|o| {
            let end = match (o.end, o.kind) {
                (Some(end), _) => end,
                (None, Access::Write(v)) => *first_read.get(&v)?,
                (None, Access::Read(_)) => return None,
            };
            Some(Placed { start: o.start, end, op: o.clone() })
        })
        .collect();
    ops.sort_by_key(|o| (o.start, o.end));
    search(initial, &ops)
}

/// An operation with the time by which it must have taken effect.
struct Placed {
    start: Ms,
    end: Ms,
    op: RegisterOp,
}

/// One choice point of the search: the operations that may come next, the one being tried,
/// and the state before it.
struct Frame {
    candidates: Vec<usize>,
    next: usize,
    chosen: Option<usize>,
    value: Option<u64>,
    first_open: usize,
    placed_after: Vec<usize>,
}

/// A depth-first search over the orders (iterative: a history may hold tens of thousands of
/// operations). The operations placed are every one before `first_open` and the few after it
/// in `placed_after` (as many as ran at once); an operation may come next only if it started
/// before every operation not yet placed ended.
fn search(initial: Option<u64>, ops: &[Placed]) -> Result<(), NotLinearizable> {
    let n = ops.len();
    let mut done = vec![false; n];
    let (mut value, mut first_open, mut placed_after) = (initial, 0usize, Vec::<usize>::new());
    let mut seen: HashSet<(usize, Vec<usize>, Option<u64>)> = HashSet::new();
    let mut furthest = 0;
    if n == 0 {
        return Ok(());
    }
    let mut stack = vec![frame(ops, &done, value, first_open, placed_after.clone())];
    while let Some(top) = stack.last_mut() {
        if let Some(c) = top.chosen.take() {
            done[c] = false;
            (value, first_open, placed_after) = (top.value, top.first_open, top.placed_after.clone());
        }
        let Some(&c) = top.candidates.get(top.next) else {
            stack.pop();
            continue;
        };
        top.next += 1;
        top.chosen = Some(c);
        done[c] = true;
        if let Access::Write(v) = ops[c].op.kind {
            value = Some(v);
        }
        placed_after.push(c);
        while first_open < n && done[first_open] {
            first_open += 1;
        }
        placed_after.retain(|i| *i >= first_open);
        placed_after.sort_unstable();
        furthest = furthest.max(first_open);
        if first_open == n {
            return Ok(());
        }
        if !seen.insert((first_open, placed_after.clone(), value)) {
            continue;
        }
        if seen.len() > STATES_MAX {
            return Err(NotLinearizable::TooLarge);
        }
        stack.push(frame(ops, &done, value, first_open, placed_after.clone()));
    }
    Err(NotLinearizable::Violated { op: ops[furthest].op.clone() })
}

/// The choice point after the operations `done`, the register holding `value`.
fn frame(
    ops: &[Placed],
    done: &[bool],
    value: Option<u64>,
    first_open: usize,
    placed_after: Vec<usize>,
) -> Frame {
    // The earliest end of an operation not placed: none that started after it may come next.
    // Operations are sorted by start, so the scan stops at the first that starts after it.
    let mut first_end = Ms::MAX;
    for (i, o) in ops.iter().enumerate().skip(first_open) {
        if o.start > first_end {
            break;
        }
        if !done[i] {
            first_end = first_end.min(o.end);
        }
    }
    let candidates = (first_open..ops.len())
        .take_while(|i| ops[*i].start <= first_end)
        .filter(|i| !done[*i])
        .filter(|i| match ops[*i].op.kind {
            Access::Write(_) => true,
            Access::Read(r) => r == value,
        })
        .collect();
    Frame { candidates, next: 0, chosen: None, value, first_open, placed_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: Ms, end: Ms, v: u64) -> RegisterOp {
        RegisterOp { start, end: Some(end), kind: Access::Write(v) }
    }
    fn lost(start: Ms, v: u64) -> RegisterOp {
        RegisterOp { start, end: None, kind: Access::Write(v) }
    }
    fn r(start: Ms, end: Ms, v: Option<u64>) -> RegisterOp {
        RegisterOp { start, end: Some(end), kind: Access::Read(v) }
    }

    #[test]
    fn sequential_writes_and_reads_of_the_latest_value_are_linearizable() {
        let ops = [r(0, 1, None), w(2, 3, 1), r(4, 5, Some(1)), w(6, 7, 2), r(8, 9, Some(2))];
        assert_eq!(check_register(None, &ops), Ok(()));
    }

    #[test]
    fn a_read_of_a_value_overwritten_before_it_started_is_not() {
        let ops = [w(0, 1, 1), w(2, 3, 2), r(4, 5, Some(1))];
        assert_eq!(check_register(None, &ops), Err(NotLinearizable::Violated { op: r(4, 5, Some(1)) }));
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_return_either_value() {
        for seen in [Some(1), Some(2)] {
            let ops = [w(0, 1, 1), w(2, 10, 2), r(3, 5, seen)];
            assert_eq!(check_register(None, &ops), Ok(()), "read {seen:?}");
        }
    }

    #[test]
    fn reads_may_not_go_back_to_an_older_value_once_one_saw_the_newer() {
        // Both reads overlap the write, but the second starts after the first returned the
        // new value: it must not return the old one (a stale read).
        let ops = [w(0, 1, 1), w(2, 20, 2), r(3, 5, Some(2)), r(6, 8, Some(1))];
        assert!(matches!(check_register(None, &ops), Err(NotLinearizable::Violated { .. })));
    }

    #[test]
    fn a_write_of_unknown_outcome_may_take_effect_late_or_never() {
        assert_eq!(
            check_register(None, &[lost(0, 1), r(5, 6, None), r(7, 8, Some(1)), r(9, 10, Some(1))]),
            Ok(())
        );
        assert_eq!(check_register(None, &[lost(0, 1), r(5, 6, None)]), Ok(()));
        // Once it took effect it stays until the next write.
        let ops = [lost(0, 1), r(5, 6, Some(1)), r(7, 8, None)];
        assert!(matches!(check_register(None, &ops), Err(NotLinearizable::Violated { .. })));
    }

    #[test]
    fn a_register_reads_its_initial_value_until_a_write_takes_effect() {
        assert_eq!(check_register(Some(9), &[r(0, 1, Some(9)), w(2, 3, 1), r(4, 5, Some(1))]), Ok(()));
        assert!(check_register(Some(9), &[r(0, 1, None)]).is_err());
        assert!(check_register(Some(9), &[w(0, 1, 1), r(2, 3, Some(9))]).is_err());
    }

    #[test]
    fn a_read_of_a_value_never_written_is_not() {
        assert!(matches!(check_register(None, &[r(0, 1, Some(7))]), Err(NotLinearizable::Violated { .. })));
    }

    #[test]
    fn a_read_cannot_return_a_write_that_started_after_it_ended() {
        let ops = [r(0, 1, Some(1)), w(2, 3, 1)];
        assert!(matches!(check_register(None, &ops), Err(NotLinearizable::Violated { .. })));
    }

    #[test]
    fn tens_of_thousands_of_operations_of_three_clients_are_judged_quickly() {
        // Three clients, each one operation at a time, overlapping the others: half an hour
        // of a real run.
        let mut ops = Vec::new();
        let mut value = None;
        for i in 0..30_000u64 {
            let start = i * 10;
            if i % 3 == 0 {
                ops.push(w(start, start + 25, i));
                value = Some(i);
            } else {
                ops.push(r(start + 26, start + 28, value));
            }
        }
        assert_eq!(check_register(None, &ops), Ok(()));
        // And one stale read at the end is found.
        let last = ops.last().unwrap().end.unwrap();
        ops.push(r(last + 1, last + 2, Some(0)));
        assert!(matches!(check_register(None, &ops), Err(NotLinearizable::Violated { .. })));
    }
}
