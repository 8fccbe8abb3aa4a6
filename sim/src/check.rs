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

use std::collections::BTreeMap;

use crate::history::{Delivery, History, Op, Seen};

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
    let mut finals: BTreeMap<u32, BTreeMap<u64, &str>> = BTreeMap::new();
    // A partition read only part of the way: judged `unrecovered` unless what it lost of the
    // acknowledged messages says more.
    let mut unrecovered = None;
    // The longest read of each partition to its end is its final log (with `--groups`, each
    // is read again after the groups are drained).
    for e in &history.events {
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
    for e in &history.events {
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
    for ((partition, offset), (value, at)) in &acked {
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
    for e in &history.events {
        let Op::Read { partition, via, from, result: Ok((records, _next, hwm)) } = &e.op else { continue };
        let mut expected_above = *from;
        for (i, Seen { offset, value }) in records.iter().enumerate() {
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
    check_groups(history, &final_of)
}

/// Whether a checkpoint (`floor`, inclusive `acked` ranges) covers `offset`.
fn covers(floor: u64, acked: &[(u64, u64)], offset: u64) -> bool {
    offset < floor || acked.iter().any(|(a, b)| *a <= offset && offset <= *b)
}

/// The consumer groups' properties (see the module documentation).
fn check_groups<'a>(
    history: &'a History,
    final_of: &dyn Fn(u32) -> &'a BTreeMap<u64, &'a str>,
) -> Result<(), Violation> {
    // Checkpoints in the order they were seen, per group and partition: (seen at, floor, acked).
    type Seen<'h> = (u64, u64, &'h [(u64, u64)]);
    let mut checkpoints: BTreeMap<(&str, u32), Vec<Seen>> = BTreeMap::new();
    // When a member first asked to acknowledge each message, per group.
    let mut ack_sent: BTreeMap<(&str, u32, u64), u64> = BTreeMap::new();
    for e in &history.events {
        if let Op::Ack { group, messages, .. } = &e.op {
            for (partition, offset) in messages {
                let at = ack_sent.entry((group.as_str(), *partition, *offset)).or_insert(e.start);
                *at = (*at).min(e.start);
            }
        }
    }
    for e in &history.events {
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
    for e in &history.events {
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
        let records = records.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string() }).collect();
        Event {
            start,
            end: start + 1,
            op: Op::Read { partition: 0, via: "a".into(), from, result: Ok((records, hwm, hwm)) },
        }
    }

    fn fin(records: &[(u64, &str)]) -> Event {
        let log = records.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string() }).collect();
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
                log: Some(log.iter().map(|(o, v)| Seen { offset: *o, value: v.to_string() }).collect()),
                why: "hwm 1 below the acknowledged 1".into(),
            },
        };
        assert_eq!(
            verdict(vec![produce(1, "m0", 0), produce(2, "m1", 1), short(&[(0, "m0")])]),
            Err("acked-lost")
        );
        assert_eq!(verdict(vec![produce(1, "m0", 0), short(&[(0, "m0")])]), Err("unrecovered"));
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
}
