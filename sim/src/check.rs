//! The checker: what a history must satisfy, whatever faults the run went through. Each
//! property is checked over the whole history; the first one violated is the verdict.
//!
//! - `acked-lost`: every acknowledged message is in the partition's final log at the offset
//!   its acknowledgement named.
//! - `two-messages-at-one-offset`: no two acknowledgements name the same offset for different
//!   messages, and no two reads return different messages at one offset.
//! - `dirty-read`: every record a read returned is in the final log at its offset (a read
//!   served nothing that was later undone: nothing beyond the high watermark).
//! - `watermark-went-back`: a read that started after an acknowledgement answered with a
//!   high watermark at or above the acknowledged offset.
//! - `out-of-order`: a read returns offsets in increasing order, from where it was asked to
//!   start, below the high watermark it answered with.
//! - `time-lookup-wrong`: a lookup of the first offset whose timestamp is at least T (where a
//!   replay from a time starts) answered an offset before which the final log holds no record
//!   stamped T or later, and whose own record, if it was acknowledged before the lookup
//!   started, is stamped T or later. (The read from there is judged as every read is.)
//! - `unrecovered`: once every fault is healed, each partition can be read to its end (a
//!   partition read only part of the way is judged by the rest first: a message acknowledged
//!   beyond what it holds is `acked-lost`).
//!
//! With consumer groups (`silt-sim --groups`):
//!
//! - `group-dirty-delivery`: every message a poll delivered is in the final log at its offset.
//! - `ack-undone`: an offset a group's checkpoint in metadata covered stays covered in every
//!   later checkpoint, and no poll that started after metadata held it delivers it again (acks
//!   not yet checkpointed may be delivered again: that is the documented bound).
//! - `checkpointed-unacked`: every offset of the final log a group's checkpoint covers was
//!   acknowledged by a member before metadata held that checkpoint (a request to acknowledge it
//!   had been sent): no message is done with for a group unless a member said so.
//! - `group-undrained`: once every fault is healed, polling and acknowledging everything
//!   brings each group's checkpoints to the end of every partition's final log.
//!
//! With the topic deleted and created again during the faults (`silt-sim --recreate`), the
//! operations before it are judged by the properties above that need no final log (an
//! acknowledgement and a read, or two reads, never name different messages at one offset;
//! reads in order; no watermark going back), those after it by all of them, and:
//!
//! - `deleted-returned`: no message produced to the deleted topic is read from the new one
//!   (acknowledged or not: a produce that failed may have landed only in the deleted topic).
//!
//! With the archive (`silt-sim --archive`):
//!
//! - `archive-differs`: every object in the bucket, read directly, holds at each offset the
//!   message the final log holds there, and one that a segment of metadata points to holds
//!   every offset of the final log in that segment's range (the archive equals the log; reads
//!   of archived offsets through agents are judged as every read is).
//!
//! With several metadata nodes (`silt-sim --metadata-nodes 3`):
//!
//! - `metadata-not-linearizable`: the writes and reads of a register in metadata (a config of
//!   a topic of its own) that clients made through random agents' copies fit one order that
//!   respects real time, each read returning the latest write before it
//!   ([`crate::linearizable`]).

use std::collections::BTreeMap;

use crate::history::{Delivery, Event, History, Op, Seen};
use crate::linearizable::{check_register, Access, NotLinearizable, RegisterOp};

/// The first property a history violates, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: &'static str,
    pub detail: String,
}

fn violation(property: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { property, detail })
}

/// Checks `history` (see the module documentation).
pub fn check(history: &History) -> Result<(), Violation> {
    check_metadata_register(&history.events)?;
    let recreated = history.events.iter().find(|e| matches!(e.op, Op::Recreate { .. }));
    let Some(recreated) = recreated else {
        return check_log(&history.events.iter().collect::<Vec<_>>(), false);
    };
    if let Op::Recreate { result: Err(why) } = &recreated.op {
        return violation("unrecovered", format!("the topic could not be deleted and created again: {why}"));
    }
    // The clients wait while the topic is deleted and created again: every other operation
    // ran before it, on the deleted topic, or after it, on the new one.
    let before: Vec<&Event> = history.events.iter().filter(|e| e.end <= recreated.start).collect();
    let after: Vec<&Event> = history.events.iter().filter(|e| e.start >= recreated.end).collect();
    check_log(&before, true)?;
    check_log(&after, false)?;
    check_deleted_stays_deleted(&before, &after)
}

/// `metadata-not-linearizable`: the writes and reads of the register in metadata fit one
/// order that respects real time.
fn check_metadata_register(events: &[Event]) -> Result<(), Violation> {
    let ops: Vec<RegisterOp> = events
        .iter()
        .filter_map(|e| match &e.op {
            Op::RegisterWrite { value, result, .. } => Some(RegisterOp {
                start: e.start,
                end: result.is_ok().then_some(e.end),
                kind: Access::Write(*value),
            }),
            Op::RegisterRead { result: Ok(value), .. } => {
                Some(RegisterOp { start: e.start, end: Some(e.end), kind: Access::Read(*value) })
            }
            _ => None,
        })
        .collect();
    match check_register(Some(crate::register::INITIAL), &ops) {
        Ok(()) => Ok(()),
        Err(NotLinearizable::TooLarge) => violation(
            "metadata-not-linearizable",
            format!("the {} operations on the register are too many to judge", ops.len()),
        ),
        Err(NotLinearizable::Violated { op }) => violation(
            "metadata-not-linearizable",
            format!(
                "no order of the {} operations on the register respects real time and places {:?} (from {} to {:?} ms)",
                ops.len(),
                op.kind,
                op.start,
                op.end
            ),
        ),
    }
}

/// `deleted-returned`: no message produced to the deleted topic is read from the new one.
fn check_deleted_stays_deleted(before: &[&Event], after: &[&Event]) -> Result<(), Violation> {
    let mut produced: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    for e in before {
        if let Op::Produce { value, result, .. } = &e.op {
            produced.insert(value.as_str(), result.as_ref().ok().copied());
        }
    }
    for e in after {
        let (partition, records, how) = match &e.op {
            Op::Read { partition, via, result: Ok((records, ..)), .. } => {
                (*partition, records, format!("a read via {via} at {} ms", e.end))
            }
            Op::Final { partition, log: Some(log), .. } => (*partition, log, "the final log".to_string()),
            _ => continue,
        };
        for Seen { offset, value, .. } in records {
            if let Some(acked) = produced.get(value.as_str()) {
                let was = acked.map_or("its produce failed".to_string(), |o| format!("acknowledged at {o}"));
                return violation(
                    "deleted-returned",
                    format!(
                        "{how} returned {value} at partition {partition} offset {offset} of the new topic; it was produced to the deleted one ({was})"
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Checks the operations on one topic (see the module documentation); `deleted`: the topic was
/// deleted, and there is no final log to judge by.
fn check_log(events: &[&Event], deleted: bool) -> Result<(), Violation> {
    let mut finals: BTreeMap<u32, BTreeMap<u64, &str>> = BTreeMap::new();
    // A partition read only part of the way: judged `unrecovered` unless what it lost of the
    // acknowledged messages says more.
    let mut unrecovered = None;
    // The longest read of each partition to its end is its final log (with `--groups`, each
    // is read again after the groups are drained).
    for e in events {
        if let Op::Final { partition, log, why } = &e.op {
            let Some(log) = log else {
                return violation("unrecovered", format!("partition {partition}: {why}"));
            };
            if !why.is_empty() && unrecovered.is_none() {
                unrecovered = Some(format!("partition {partition}: {why}"));
            }
            // A read cut short never replaces a longer one (the log only grows).
            if finals.get(partition).is_none_or(|f| f.len() <= log.len()) {
                finals.insert(*partition, log.iter().map(|r| (r.offset, r.value.as_str())).collect());
            }
        }
    }
    let empty = BTreeMap::new();
    let final_of = |p: u32| finals.get(&p).unwrap_or(&empty);

    // Acknowledgements: one message per offset, each in the final log.
    let mut acked: BTreeMap<(u32, u64), (&str, u64)> = BTreeMap::new();
    for e in events {
        let Op::Produce { partition, value, result: Ok(offset), .. } = &e.op else { continue };
        if let Some((other, _)) = acked.get(&(*partition, *offset)) {
            if *other != value {
                return violation(
                    "two-messages-at-one-offset",
                    format!("partition {partition} offset {offset} acknowledged for {other} and for {value}"),
                );
            }
        }
        acked.insert((*partition, *offset), (value.as_str(), e.end));
    }
    for ((partition, offset), (value, at)) in acked.iter().filter(|_| !deleted) {
        match final_of(*partition).get(offset) {
            Some(v) if v == value => {}
            Some(v) => {
                return violation(
                    "acked-lost",
                    format!("partition {partition} offset {offset}: {value} acknowledged at {at} ms, the log holds {v}"),
                )
            }
            None => {
                return violation(
                    "acked-lost",
                    format!("partition {partition} offset {offset}: {value} acknowledged at {at} ms, the log ends before it"),
                )
            }
        }
    }

    if let Some(why) = unrecovered {
        return violation("unrecovered", why);
    }

    // Reads: in order, below their watermark, never undone, never behind an acknowledgement.
    let mut read_at: BTreeMap<(u32, u64), &str> = BTreeMap::new();
    for e in events {
        let Op::Read { partition, via, from, result: Ok((records, _next, hwm)) } = &e.op else { continue };
        let mut expected_above = *from;
        for (i, Seen { offset, value, .. }) in records.iter().enumerate() {
            if *offset < expected_above || (i > 0 && *offset == expected_above) || *offset >= *hwm {
                return violation(
                    "out-of-order",
                    format!("read of partition {partition} from {from} via {via} at {} ms returned offset {offset} (hwm {hwm})", e.end),
                );
            }
            expected_above = *offset;
            if let Some(other) = read_at.insert((*partition, *offset), value) {
                if other != value {
                    return violation(
                        "two-messages-at-one-offset",
                        format!("partition {partition} offset {offset} read as {other} and as {value}"),
                    );
                }
            }
            if deleted {
                // No final log: judged by what was acknowledged.
                match acked.get(&(*partition, *offset)) {
                    Some((v, _)) if v != value => {
                        return violation(
                            "two-messages-at-one-offset",
                            format!(
                                "partition {partition} offset {offset} acknowledged for {v}, read as {value}"
                            ),
                        )
                    }
                    _ => continue,
                }
            }
            match final_of(*partition).get(offset) {
                Some(v) if v == value => {}
                found => {
                    return violation(
                        "dirty-read",
                        format!(
                            "read of partition {partition} via {via} at {} ms returned {value} at {offset}; the log holds {}",
                            e.end,
                            found.map_or("nothing there".to_string(), |v| v.to_string())
                        ),
                    )
                }
            }
        }
        if let Some(((_, offset), (value, at))) =
            acked.range((*partition, *hwm)..(*partition, u64::MAX)).find(|(_, (_, at))| *at < e.start)
        {
            return violation(
                "watermark-went-back",
                format!(
                    "read of partition {partition} via {via} started at {} ms answered hwm {hwm}; {value} was acknowledged at {offset} at {at} ms",
                    e.start
                ),
            );
        }
    }
    if !deleted {
        check_time_lookups(events, &acked)?;
    }
    check_groups(events, &final_of)?;
    check_archive(events, &final_of)
}

/// `time-lookup-wrong` (see the module documentation).
fn check_time_lookups(events: &[&Event], acked: &BTreeMap<(u32, u64), (&str, u64)>) -> Result<(), Violation> {
    // Each partition's final log with the records' timestamps (the longest read, as above).
    let mut finals: BTreeMap<u32, &[Seen]> = BTreeMap::new();
    for e in events {
        if let Op::Final { partition, log: Some(log), .. } = &e.op {
            if finals.get(partition).is_none_or(|f| f.len() <= log.len()) {
                finals.insert(*partition, log);
            }
        }
    }
    for e in events {
        let Op::TimeLookup { partition, via, timestamp_ms: time, result: Ok(answer) } = &e.op else {
            continue;
        };
        let log = finals.get(partition).copied().unwrap_or_default();
        let lookup = format!("lookup of partition {partition} for time {time} via {via} at {} ms", e.end);
        if let Some(r) = log.iter().take_while(|r| r.offset < *answer).find(|r| r.timestamp_ms >= *time) {
            return violation(
                "time-lookup-wrong",
                format!(
                    "{lookup} answered {answer}, but {} at offset {} before it bears {}",
                    r.value, r.offset, r.timestamp_ms
                ),
            );
        }
        let Some(r) = log.iter().find(|r| r.offset == *answer) else { continue };
        let held_then = acked.get(&(*partition, *answer)).is_some_and(|(_, at)| *at < e.start);
        if held_then && r.timestamp_ms < *time {
            return violation(
                "time-lookup-wrong",
                format!(
                    "{lookup} answered {answer}, whose record {} (acknowledged before) bears {}",
                    r.value, r.timestamp_ms
                ),
            );
        }
    }
    Ok(())
}

/// The archive's property (see the module documentation).
fn check_archive<'a>(
    events: &[&'a Event],
    final_of: &dyn Fn(u32) -> &'a BTreeMap<u64, &'a str>,
) -> Result<(), Violation> {
    for e in events {
        let Op::Archived { key, segment, result } = &e.op else { continue };
        let (partition, records) = match result {
            Ok(read) => read,
            Err(why) => return violation("archive-differs", format!("object {key} cannot be read: {why}")),
        };
        let log = final_of(*partition);
        for Seen { offset, value, .. } in records {
            match log.get(offset) {
                Some(v) if v == value => {}
                found => {
                    return violation(
                        "archive-differs",
                        format!(
                            "object {key} holds {value} at partition {partition} offset {offset}; the log holds {}",
                            found.map_or("nothing there".to_string(), |v| v.to_string())
                        ),
                    )
                }
            }
        }
        if let Some((p, base, last)) = segment {
            if p != partition {
                return violation(
                    "archive-differs",
                    format!("object {key} of partition {partition} is archived for partition {p}"),
                );
            }
            let held: std::collections::BTreeSet<u64> = records.iter().map(|r| r.offset).collect();
            if let Some((offset, value)) = log.range(*base..=*last).find(|(o, _)| !held.contains(o)) {
                return violation(
                    "archive-differs",
                    format!(
                        "object {key}, archived for offsets {base}..={last} of partition {partition}, lacks offset {offset} ({value})"
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Whether a checkpoint (`floor`, inclusive `acked` ranges) covers `offset`.
fn covers(floor: u64, acked: &[(u64, u64)], offset: u64) -> bool {
    offset < floor || acked.iter().any(|(a, b)| *a <= offset && offset <= *b)
}

/// The consumer groups' properties (see the module documentation).
fn check_groups<'a>(
    events: &[&'a Event],
    final_of: &dyn Fn(u32) -> &'a BTreeMap<u64, &'a str>,
) -> Result<(), Violation> {
    // Checkpoints in the order they were seen, per group and partition: (seen at, floor, acked).
    type Seen<'h> = (u64, u64, &'h [(u64, u64)]);
    let mut checkpoints: BTreeMap<(&str, u32), Vec<Seen>> = BTreeMap::new();
    // When a member first asked to acknowledge each message, per group.
    let mut ack_sent: BTreeMap<(&str, u32, u64), u64> = BTreeMap::new();
    for e in events {
        if let Op::Ack { group, messages, .. } = &e.op {
            for (partition, offset) in messages {
                let at = ack_sent.entry((group.as_str(), *partition, *offset)).or_insert(e.start);
                *at = (*at).min(e.start);
            }
        }
    }
    for e in events {
        match &e.op {
            Op::Checkpoint { group, partition, floor, acked } => {
                let seen = checkpoints.entry((group.as_str(), *partition)).or_default();
                if let Some((at, before_floor, before)) = seen.last() {
                    let undone = (0..*before_floor)
                        .chain(before.iter().flat_map(|(a, b)| *a..=*b))
                        .find(|o| !covers(*floor, acked, *o));
                    if let Some(offset) = undone {
                        return violation(
                            "ack-undone",
                            format!(
                                "group {group} partition {partition}: offset {offset}, checkpointed at {at} ms, is not in the checkpoint at {} ms (floor {floor}, acked {acked:?})",
                                e.end
                            ),
                        );
                    }
                }
                let before = seen.last().copied();
                let sent = |o: u64| ack_sent.get(&(group.as_str(), *partition, o)).copied();
                let unacked = final_of(*partition).keys().find(|o| {
                    covers(*floor, acked, **o)
                        && !before.is_some_and(|(_, f, a)| covers(f, a, **o))
                        && sent(**o).is_none_or(|at| at > e.end)
                });
                if let Some(offset) = unacked {
                    let first_ack = sent(*offset)
                        .map_or(String::new(), |at| format!(" (the first ack of it was sent at {at} ms)"));
                    return violation(
                        "checkpointed-unacked",
                        format!(
                            "group {group} partition {partition}: the checkpoint at {} ms (floor {floor}) covers offset {offset}, which no member had acknowledged{first_ack}",
                            e.end
                        ),
                    );
                }
                seen.push((e.end, *floor, acked));
            }
            Op::Poll { group, member, via, result: Ok(got) } => {
                for Delivery { partition, offset, value, deliveries } in got {
                    match final_of(*partition).get(offset) {
                        Some(v) if v == value => {}
                        found => {
                            return violation(
                                "group-dirty-delivery",
                                format!(
                                    "poll of group {group} by {member} via {via} at {} ms delivered {value} at partition {partition} offset {offset}; the log holds {}",
                                    e.end,
                                    found.map_or("nothing there".to_string(), |v| v.to_string())
                                ),
                            )
                        }
                    }
                    let before = checkpoints.get(&(group.as_str(), *partition)).and_then(|seen| {
                        seen.iter()
                            .rev()
                            .find(|(at, floor, acked)| *at < e.start && covers(*floor, acked, *offset))
                    });
                    if let Some((at, ..)) = before {
                        return violation(
                            "ack-undone",
                            format!(
                                "poll of group {group} by {member} via {via} started at {} ms delivered partition {partition} offset {offset} again (delivery {deliveries}); metadata's checkpoint covered it at {at} ms",
                                e.start
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    for e in events {
        if let Op::Drained { group, why } = &e.op {
            if !why.is_empty() {
                return violation("group-undrained", format!("group {group}: {why}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Event;

    fn produce(end: u64, value: &str, offset: u64) -> Event {
        Event {
            start: end,
            end,
            op: Op::Produce { partition: 0, via: "a".into(), value: value.into(), result: Ok(offset) },
        }
    }

    fn read(start: u64, from: u64, records: &[(u64, &str)], hwm: u64) -> Event {
        let records =
            records.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string(), timestamp_ms: 0 }).collect();
        Event {
            start,
            end: start + 1,
            op: Op::Read { partition: 0, via: "a".into(), from, result: Ok((records, hwm, hwm)) },
        }
    }

    fn fin(records: &[(u64, &str)]) -> Event {
        let log =
            records.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string(), timestamp_ms: 0 }).collect();
        Event { start: 1000, end: 1000, op: Op::Final { partition: 0, log: Some(log), why: String::new() } }
    }

    fn verdict(events: Vec<Event>) -> Result<(), &'static str> {
        check(&History { events }).map_err(|v| v.property)
    }

    #[test]
    fn a_history_that_keeps_every_promise_passes() {
        let events = vec![
            produce(1, "m0", 0),
            produce(2, "m1", 1),
            read(3, 0, &[(0, "m0"), (1, "m1")], 2),
            fin(&[(0, "m0"), (1, "m1"), (2, "m2")]),
        ];
        assert_eq!(verdict(events), Ok(()));
    }

    #[test]
    fn each_broken_promise_is_named() {
        assert_eq!(verdict(vec![produce(1, "m0", 0), fin(&[])]), Err("acked-lost"));
        assert_eq!(verdict(vec![produce(1, "m0", 0), fin(&[(0, "mX")])]), Err("acked-lost"));
        assert_eq!(
            verdict(vec![produce(1, "m0", 0), produce(2, "m1", 0), fin(&[(0, "m0")])]),
            Err("two-messages-at-one-offset")
        );
        assert_eq!(verdict(vec![read(1, 0, &[(0, "m9")], 1), fin(&[(0, "m0")])]), Err("dirty-read"));
        assert_eq!(
            verdict(vec![read(1, 0, &[(0, "m9")], 1), read(2, 0, &[(0, "m8")], 1), fin(&[(0, "m9")])]),
            Err("two-messages-at-one-offset")
        );
        assert_eq!(
            verdict(vec![
                produce(1, "m0", 0),
                produce(2, "m1", 1),
                read(3, 0, &[(0, "m0")], 1),
                fin(&[(0, "m0"), (1, "m1")])
            ]),
            Err("watermark-went-back")
        );
        assert_eq!(verdict(vec![read(1, 1, &[(0, "m0")], 2), fin(&[(0, "m0")])]), Err("out-of-order"));
        assert_eq!(verdict(vec![read(1, 0, &[(0, "m0")], 0), fin(&[(0, "m0")])]), Err("out-of-order"));
        let unreadable =
            Event { start: 0, end: 0, op: Op::Final { partition: 0, log: None, why: "no writer".into() } };
        assert_eq!(verdict(vec![unreadable]), Err("unrecovered"));
        let short = |log: &[(u64, &str)]| Event {
            start: 0,
            end: 0,
            op: Op::Final {
                partition: 0,
                log: Some(
                    log.iter()
                        .map(|(o, v)| Seen { offset: *o, value: v.to_string(), timestamp_ms: 0 })
                        .collect(),
                ),
                why: "hwm 1 below the acknowledged 1".into(),
            },
        };
        assert_eq!(
            verdict(vec![produce(1, "m0", 0), produce(2, "m1", 1), short(&[(0, "m0")])]),
            Err("acked-lost")
        );
        assert_eq!(verdict(vec![produce(1, "m0", 0), short(&[(0, "m0")])]), Err("unrecovered"));
    }

    #[test]
    fn a_lookup_by_time_answers_the_first_offset_stamped_that_late() {
        // Timestamps out of order (a clock stepped back): 0 -> 100, 1 -> 300, 2 -> 200.
        let stamped = Seen { offset: 0, value: "m0".into(), timestamp_ms: 100 };
        let log = vec![
            stamped.clone(),
            Seen { offset: 1, value: "m1".into(), timestamp_ms: 300 },
            Seen { offset: 2, value: "m2".into(), timestamp_ms: 200 },
        ];
        let fin = Event {
            start: 1000,
            end: 1000,
            op: Op::Final { partition: 0, log: Some(log), why: String::new() },
        };
        let lookup = |start: u64, time: i64, answer: u64| Event {
            start,
            end: start + 1,
            op: Op::TimeLookup { partition: 0, via: "a".into(), timestamp_ms: time, result: Ok(answer) },
        };
        let produced = vec![produce(1, "m0", 0), produce(2, "m1", 1), produce(3, "m2", 2)];
        let judge = |l: Event| verdict([produced.clone(), vec![l, fin.clone()]].concat());
        assert_eq!(judge(lookup(10, 150, 1)), Ok(()));
        assert_eq!(judge(lookup(10, 250, 1)), Ok(()));
        assert_eq!(judge(lookup(10, 50, 0)), Ok(()));
        assert_eq!(judge(lookup(10, 400, 3)), Ok(()), "nothing that late: the end");
        assert_eq!(judge(lookup(10, 150, 2)), Err("time-lookup-wrong"), "skips offset 1, stamped 300");
        assert_eq!(judge(lookup(10, 150, 0)), Err("time-lookup-wrong"), "offset 0 is stamped 100");
        // An answer whose record came after the lookup began may be the end of the log then.
        assert_eq!(judge(lookup(0, 150, 0)), Ok(()));
    }

    fn poll(start: u64, delivered: &[(u64, &str)]) -> Event {
        let got = delivered
            .iter()
            .map(|(o, v)| Delivery { partition: 0, offset: *o, value: v.to_string(), deliveries: 1 })
            .collect();
        Event {
            start,
            end: start + 1,
            op: Op::Poll { group: "g".into(), member: "m".into(), via: "a".into(), result: Ok(got) },
        }
    }

    fn checkpoint(at: u64, floor: u64, acked: &[(u64, u64)]) -> Event {
        Event {
            start: at,
            end: at,
            op: Op::Checkpoint { group: "g".into(), partition: 0, floor, acked: acked.to_vec() },
        }
    }

    fn ack(start: u64, offsets: &[u64]) -> Event {
        let messages = offsets.iter().map(|o| (0, *o)).collect();
        Event {
            start,
            end: start + 1,
            op: Op::Ack { group: "g".into(), via: "a".into(), messages, result: Ok(offsets.len()) },
        }
    }

    fn drained(why: &str) -> Event {
        Event { start: 2000, end: 2000, op: Op::Drained { group: "g".into(), why: why.into() } }
    }

    #[test]
    fn a_group_that_gets_every_message_until_it_is_checkpointed_passes() {
        let log = [(0, "m0"), (1, "m1"), (2, "m2")];
        let events = vec![
            poll(1, &[(0, "m0"), (1, "m1")]),
            ack(2, &[0, 1]),
            checkpoint(3, 1, &[]),
            // Acknowledged but not yet checkpointed: delivered again within the bound.
            poll(4, &[(1, "m1"), (2, "m2")]),
            ack(5, &[1, 2]),
            checkpoint(6, 2, &[]),
            checkpoint(7, 3, &[]),
            fin(&log),
            drained(""),
        ];
        assert_eq!(verdict(events), Ok(()));
        let above_floor = vec![poll(1, &log), ack(2, &[2]), checkpoint(3, 0, &[(2, 2)]), fin(&log)];
        assert_eq!(verdict(above_floor), Ok(()));
    }

    #[test]
    fn each_broken_promise_of_a_group_is_named() {
        let log = [(0, "m0"), (1, "m1"), (2, "m2")];
        let with_log = |mut events: Vec<Event>| {
            events.push(fin(&log));
            verdict(events)
        };
        assert_eq!(with_log(vec![poll(1, &[(0, "mX")])]), Err("group-dirty-delivery"));
        assert_eq!(with_log(vec![poll(1, &[(5, "m5")])]), Err("group-dirty-delivery"));
        let acked_both = || vec![poll(1, &[(0, "m0"), (1, "m1")]), ack(2, &[0, 1])];
        let redelivered = [checkpoint(3, 2, &[]), poll(4, &[(1, "m1")])];
        assert_eq!(with_log([acked_both(), redelivered.to_vec()].concat()), Err("ack-undone"));
        let floor_back = [checkpoint(3, 2, &[]), checkpoint(5, 1, &[])];
        assert_eq!(with_log([acked_both(), floor_back.to_vec()].concat()), Err("ack-undone"));
        let range_dropped = vec![
            poll(1, &[(0, "m0"), (2, "m2")]),
            ack(2, &[0, 2]),
            checkpoint(3, 1, &[(2, 2)]),
            checkpoint(5, 1, &[]),
        ];
        assert_eq!(with_log(range_dropped), Err("ack-undone"));
        let in_flight_checkpointed =
            vec![poll(1, &[(0, "m0"), (1, "m1")]), ack(2, &[0]), checkpoint(3, 2, &[])];
        assert_eq!(with_log(in_flight_checkpointed), Err("checkpointed-unacked"));
        let before_its_ack = vec![poll(1, &[(1, "m1")]), checkpoint(3, 0, &[(1, 1)]), ack(4, &[1])];
        assert_eq!(with_log(before_its_ack), Err("checkpointed-unacked"));
        let one_in_the_middle = vec![poll(1, &log), ack(2, &[0, 2]), checkpoint(3, 3, &[])];
        assert_eq!(with_log(one_in_the_middle), Err("checkpointed-unacked"));
        assert_eq!(with_log(vec![drained("partition 0 checkpointed to 1 of 3")]), Err("group-undrained"));
    }

    #[test]
    fn a_read_concurrent_with_an_acknowledgement_may_miss_it() {
        // The read started before the produce ended: it may answer the old watermark.
        let events = vec![read(1, 0, &[], 0), produce(2, "m0", 0), fin(&[(0, "m0")])];
        assert_eq!(verdict(events), Ok(()));
    }

    fn archived(segment: Option<(u64, u64)>, records: &[(u64, &str)]) -> Event {
        let records =
            records.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string(), timestamp_ms: 0 }).collect();
        Event {
            start: 3000,
            end: 3000,
            op: Op::Archived {
                key: "silt/topic=events/partition=0/x.parquet".into(),
                segment: segment.map(|(base, last)| (0, base, last)),
                result: Ok((0, records)),
            },
        }
    }

    #[test]
    fn an_archive_that_equals_the_log_passes_and_one_that_differs_is_named() {
        let log = [(0, "m0"), (1, "m1"), (2, "m2")];
        let with_log = |events: Vec<Event>| verdict([vec![fin(&log)], events].concat());
        assert_eq!(with_log(vec![archived(Some((0, 1)), &[(0, "m0"), (1, "m1")])]), Ok(()));
        // An object no segment points to (a compactor that died before its commit) may hold
        // a part of a range; what it holds is still the log.
        assert_eq!(with_log(vec![archived(None, &[(1, "m1")])]), Ok(()));
        assert_eq!(with_log(vec![archived(None, &[(1, "mX")])]), Err("archive-differs"));
        assert_eq!(with_log(vec![archived(None, &[(7, "m7")])]), Err("archive-differs"));
        assert_eq!(with_log(vec![archived(Some((0, 2)), &[(0, "m0"), (2, "m2")])]), Err("archive-differs"));
        let unreadable = Event {
            start: 3000,
            end: 3000,
            op: Op::Archived { key: "k".into(), segment: Some((0, 0, 0)), result: Err("not found".into()) },
        };
        assert_eq!(with_log(vec![unreadable]), Err("archive-differs"));
        let elsewhere = Event {
            start: 3000,
            end: 3000,
            op: Op::Archived {
                key: "k".into(),
                segment: Some((1, 0, 0)),
                result: Ok((0, vec![Seen { offset: 0, value: "m0".into(), timestamp_ms: 0 }])),
            },
        };
        assert_eq!(with_log(vec![elsewhere]), Err("archive-differs"));
    }

    fn recreated(start: u64, end: u64) -> Event {
        Event { start, end, op: Op::Recreate { result: Ok(()) } }
    }

    #[test]
    fn a_topic_created_again_is_judged_apart_from_the_deleted_one() {
        // Offset 0 held m0 in the deleted topic and m5 in the new one; the deleted topic has no
        // final log, and lost m1 with it.
        let events = vec![
            produce(1, "m0", 0),
            produce(2, "m1", 1),
            read(3, 0, &[(0, "m0")], 2),
            recreated(10, 20),
            produce(21, "m5", 0),
            read(22, 0, &[(0, "m5")], 1),
            fin(&[(0, "m5")]),
        ];
        assert_eq!(verdict(events), Ok(()));
        let events =
            vec![produce(1, "m0", 0), recreated(10, 20), read(22, 0, &[(0, "m0")], 1), fin(&[(0, "m0")])];
        assert_eq!(verdict(events), Err("deleted-returned"));
        let events = vec![produce(1, "m0", 0), read(3, 0, &[(0, "mX")], 1), recreated(10, 20), fin(&[])];
        assert_eq!(verdict(events), Err("two-messages-at-one-offset"));
        // After it, everything is judged as ever.
        let events = vec![recreated(10, 20), produce(21, "m5", 0), fin(&[])];
        assert_eq!(verdict(events), Err("acked-lost"));
        let failed =
            Event { start: 10, end: 20, op: Op::Recreate { result: Err("no agent answered".into()) } };
        assert_eq!(verdict(vec![failed, fin(&[])]), Err("unrecovered"));
    }
}
