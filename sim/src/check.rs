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

use std::collections::BTreeMap;

use crate::history::{History, Op, Seen};

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
    for e in &history.events {
        if let Op::Final { partition, log, why } = &e.op {
            let Some(log) = log else {
                return violation("unrecovered", format!("partition {partition}: {why}"));
            };
            if !why.is_empty() && unrecovered.is_none() {
                unrecovered = Some(format!("partition {partition}: {why}"));
            }
            finals.insert(*partition, log.iter().map(|r| (r.offset, r.value.as_str())).collect());
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

    #[test]
    fn a_read_concurrent_with_an_acknowledgement_may_miss_it() {
        // The read started before the produce ended: it may answer the old watermark.
        let events = vec![read(1, 0, &[], 0), produce(2, "m0", 0), fin(&[(0, "m0")])];
        assert_eq!(verdict(events), Ok(()));
    }
}
