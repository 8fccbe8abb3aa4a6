//! What a harness's clients did and saw: every operation with the times it started and ended
//! (simulated in `silt-sim`, real in `silt-faults`), in the order operations ended. The checker
//! judges nothing else.

use std::fmt;

/// Milliseconds since the run started (simulated time in `silt-sim`).
pub type Ms = u64;

/// One partition's record as a read returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub offset: u64,
    pub value: String,
    /// The record's timestamp, ms since the Unix epoch (the agent's clock when it took it).
    pub timestamp_ms: i64,
}

/// One message a poll of a consumer group delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    pub value: String,
    /// How many times it was delivered to the group, this one included.
    pub deliveries: u32,
}

/// What one operation did.
#[derive(Debug, Clone)]
pub enum Op {
    /// A produce of one message to a partition, through an agent.
    Produce { partition: u32, via: String, value: String, result: Result<u64, String> },
    /// A read of a partition from an offset, through an agent: the records, the next offset
    /// and the high watermark it answered with.
    Read { partition: u32, via: String, from: u64, result: Result<(Vec<Seen>, u64, u64), String> },
    /// A lookup of the first offset of a partition whose timestamp is at least
    /// `timestamp_ms`, through an agent (where a replay from a time starts; a read from the
    /// answer follows it as an [`Op::Read`]).
    TimeLookup { partition: u32, via: String, timestamp_ms: i64, result: Result<u64, String> },
    /// The whole partition, read once every fault was healed (`None`: it could not be read
    /// to its end in time).
    Final { partition: u32, log: Option<Vec<Seen>>, why: String },
    /// A poll of a consumer group by one of its members, through an agent.
    Poll { group: String, member: String, via: String, result: Result<Vec<Delivery>, String> },
    /// An acknowledgement of delivered messages (partition, offset) to a group, through an
    /// agent.
    Ack { group: String, via: String, messages: Vec<(u32, u64)>, result: Result<usize, String> },
    /// A group's acknowledgement checkpoint of a partition as metadata held it, recorded when
    /// it changed: every offset below `floor` and in the inclusive `acked` ranges.
    Checkpoint { group: String, partition: u32, floor: u64, acked: Vec<(u64, u64)> },
    /// Once the faults were healed and every partition read to its end, the group was polled
    /// and acknowledged until its checkpoints reached those ends (`why` empty), or not in
    /// time (`why` says where it stopped).
    Drained { group: String, why: String },
    /// The topic deleted and created again under its name (`--recreate`), while the other
    /// clients waited: every other operation ended before this started or started after it
    /// ended.
    Recreate { result: Result<(), String> },
    /// A change of the topic's configs (`key=value` pairs) through an agent.
    Configure { via: String, config: String, result: Result<(), String> },
    /// With `--archive`, after the final reads: an object of the bucket read directly, as a
    /// tool that reads the archive does. `segment` is the range metadata's segment map names
    /// it for (`None`: no segment points to it); the result is the partition and the records
    /// the object holds, or why it could not be read.
    Archived { key: String, segment: Option<(u32, u64, u64)>, result: Result<(u32, Vec<Seen>), String> },
    /// A write of `value` to the register in metadata (it starts holding [`crate::register::INITIAL`]) (a config of a topic of its own) through
    /// the agent `via`'s copy of metadata; `Err` when its outcome is unknown (it may have taken
    /// effect). Refused ones are not recorded.
    RegisterWrite { via: String, value: u64, result: Result<(), String> },
    /// A linearizable read of the register through the agent `via`'s copy of metadata (`None`:
    /// it held nothing yet).
    RegisterRead { via: String, result: Result<Option<u64>, String> },
}

/// An operation and when it ran.
#[derive(Debug, Clone)]
pub struct Event {
    pub start: Ms,
    pub end: Ms,
    pub op: Op,
}

/// Every operation of a run, in the order they ended.
#[derive(Debug, Default)]
pub struct History {
    pub events: Vec<Event>,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>7} {:>7} ", self.start, self.end)?;
        match &self.op {
            Op::Produce { partition, via, value, result } => match result {
                Ok(offset) => write!(f, "produce p{partition} via {via} {value} -> acked at {offset}"),
                Err(e) => write!(f, "produce p{partition} via {via} {value} -> failed: {e}"),
            },
            Op::Read { partition, via, from, result } => match result {
                Ok((records, next, hwm)) => {
                    write!(
                        f,
                        "read p{partition} via {via} from {from} -> {} records, next {next}, hwm {hwm}",
                        records.len()
                    )?;
                    for r in records {
                        write!(f, " {}={}", r.offset, r.value)?;
                    }
                    Ok(())
                }
                Err(e) => write!(f, "read p{partition} via {via} from {from} -> failed: {e}"),
            },
            Op::TimeLookup { partition, via, timestamp_ms, result } => match result {
                Ok(offset) => write!(f, "time lookup p{partition} via {via} at {timestamp_ms} -> {offset}"),
                Err(e) => write!(f, "time lookup p{partition} via {via} at {timestamp_ms} -> failed: {e}"),
            },
            Op::Final { partition, log: Some(log), .. } => {
                write!(f, "final p{partition} -> {} records", log.len())?;
                for r in log {
                    write!(f, " {}={}", r.offset, r.value)?;
                }
                Ok(())
            }
            Op::Final { partition, log: None, why } => write!(f, "final p{partition} -> unreadable: {why}"),
            Op::Poll { group, member, via, result } => match result {
                Ok(delivered) => {
                    write!(f, "poll {group}/{member} via {via} -> {} messages", delivered.len())?;
                    for d in delivered {
                        write!(f, " p{}:{}={}", d.partition, d.offset, d.value)?;
                        if d.deliveries > 1 {
                            write!(f, "(#{})", d.deliveries)?;
                        }
                    }
                    Ok(())
                }
                Err(e) => write!(f, "poll {group}/{member} via {via} -> failed: {e}"),
            },
            Op::Ack { group, via, messages, result } => {
                write!(f, "ack {group} via {via}")?;
                for (p, o) in messages {
                    write!(f, " p{p}:{o}")?;
                }
                match result {
                    Ok(n) => write!(f, " -> {n} acknowledged"),
                    Err(e) => write!(f, " -> failed: {e}"),
                }
            }
            Op::Checkpoint { group, partition, floor, acked } => {
                write!(f, "checkpoint {group} p{partition} floor {floor} acked {acked:?}")
            }
            Op::Drained { group, why } if why.is_empty() => write!(f, "drained {group}"),
            Op::Drained { group, why } => write!(f, "drained {group} -> not: {why}"),
            Op::Recreate { result: Ok(()) } => write!(f, "delete the topic and create it again -> done"),
            Op::Recreate { result: Err(e) } => {
                write!(f, "delete the topic and create it again -> failed: {e}")
            }
            Op::Configure { via, config, result: Ok(()) } => {
                write!(f, "configure via {via} {config} -> done")
            }
            Op::Configure { via, config, result: Err(e) } => {
                write!(f, "configure via {via} {config} -> failed: {e}")
            }
            Op::Archived { key, segment, result } => {
                write!(f, "archived {key}")?;
                if let Some((p, base, last)) = segment {
                    write!(f, " (segment p{p} {base}..={last})")?;
                }
                match result {
                    Ok((p, records)) => {
                        write!(f, " -> p{p}, {} records", records.len())?;
                        for r in records {
                            write!(f, " {}={}", r.offset, r.value)?;
                        }
                        Ok(())
                    }
                    Err(e) => write!(f, " -> unreadable: {e}"),
                }
            }
            Op::RegisterWrite { via, value, result: Ok(()) } => {
                write!(f, "register write {value} via {via} -> done")
            }
            Op::RegisterWrite { via, value, result: Err(e) } => {
                write!(f, "register write {value} via {via} -> unknown: {e}")
            }
            Op::RegisterRead { via, result: Ok(value) } => write!(f, "register read via {via} -> {value:?}"),
            Op::RegisterRead { via, result: Err(e) } => write!(f, "register read via {via} -> failed: {e}"),
        }
    }
}
