//! Delivery state of one consumer group on one partition: which offsets are in flight under a
//! lease, how often each was delivered, and what is acknowledged. Pure logic, no I/O.
//!
//! Everything below `next_offset` has been delivered at least once; of those, the offsets in
//! `in_flight` await an ack and all others are acknowledged. So the ack floor is the smallest
//! in-flight offset (or `next_offset`), and the acked ranges above it are the gaps between
//! in-flight offsets. `acked_ahead` holds ranges a checkpoint recorded above its floor, which
//! are skipped rather than delivered again after a restart.

use std::collections::BTreeMap;

use silt_record::Record;

use crate::limits::IN_FLIGHT_MAX;

/// A message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Partition.
    pub partition: u32,
    /// The record.
    pub record: Record,
    /// How many times it has been delivered to this group, this one included.
    pub delivery: u32,
}

/// One delivered, unacknowledged message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// When the lease expires and the message may be delivered again (ms on the agent's
    /// monotonic lease clock, `Agent::lease_clock_ms`).
    pub deadline_ms: u64,
    /// How many times it has been delivered.
    pub deliveries: u32,
}

/// What an ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// The message was in flight and is now acknowledged.
    Acked,
    /// It was acknowledged before; acking again is harmless.
    AlreadyAcked,
    /// It was never delivered to this group.
    NotDelivered,
}

/// What to do with a message whose lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Deliver it again; this will be delivery number `deliveries`.
    Redeliver {
        /// Offset.
        offset: u64,
        /// Delivery count including this one.
        deliveries: u32,
    },
    /// It was delivered the maximum number of times: move it to the dead-letter topic.
    DeadLetter {
        /// Offset.
        offset: u64,
        /// Deliveries so far.
        deliveries: u32,
    },
}

/// A group's delivery state on one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupCursor {
    /// The topic id this state belongs to (a re-created topic starts afresh).
    topic_id: u64,
    /// The writer epoch of the partition it was loaded under: its checkpoints are refused once
    /// another writer (a later epoch) took the partition, whose cursor carries on.
    epoch: u64,
    next_offset: u64,
    in_flight: BTreeMap<u64, InFlight>,
    acked_ahead: Vec<(u64, u64)>,
    dirty: bool,
}

impl GroupCursor {
    /// Resumes from a checkpoint, for the partition's writer at `epoch`. Offsets below
    /// `log_start` no longer exist and are skipped.
    pub fn from_checkpoint(
        topic_id: u64,
        epoch: u64,
        floor: u64,
        acked: &[(u64, u64)],
        log_start: u64,
    ) -> Self {
        let mut cursor = GroupCursor {
            topic_id,
            epoch,
            next_offset: floor.max(log_start),
            in_flight: BTreeMap::new(),
            acked_ahead: acked.to_vec(),
            dirty: false,
        };
        cursor.skip_acked();
        cursor
    }

    /// The topic id this state belongs to.
    pub fn topic_id(&self) -> u64 {
        self.topic_id
    }

    /// The writer epoch it was loaded under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The next offset that has never been delivered.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Every offset below the floor is acknowledged.
    pub fn floor(&self) -> u64 {
        self.in_flight.keys().next().copied().unwrap_or(self.next_offset).min(self.next_offset)
    }

    /// Messages awaiting an ack.
    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether new messages may be delivered.
    pub fn has_room(&self) -> bool {
        self.in_flight.len() < IN_FLIGHT_MAX
    }

    /// Whether acknowledgements changed since the last checkpoint.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Marks the state as changed, so the next checkpoint writes it (after a failed write).
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// The checkpoint to store: the floor and the acknowledged ranges above it. Clears `dirty`.
    pub fn take_checkpoint(&mut self) -> (u64, Vec<(u64, u64)>) {
        self.dirty = false;
        self.checkpoint()
    }

    /// The checkpoint without clearing `dirty`.
    pub fn checkpoint(&self) -> (u64, Vec<(u64, u64)>) {
        if crate::sim_bugs::on(crate::sim_bugs::Bug::CheckpointInFlight) {
            return (
                self.next_offset,
                self.acked_ahead.iter().copied().filter(|(_, b)| *b >= self.next_offset).collect(),
            );
        }
        let floor = self.floor();
        let mut ranges = Vec::new();
        let mut start = floor;
        for &offset in self.in_flight.keys() {
            if offset > start {
                ranges.push((start, offset - 1));
            }
            start = offset + 1;
        }
        if start < self.next_offset && start > floor {
            ranges.push((start, self.next_offset - 1));
        }
        ranges.extend(self.acked_ahead.iter().copied());
        (floor, ranges)
    }

    /// Leases expired at `now_ms`, oldest offset first, at most `max`.
    pub fn expired(&self, now_ms: u64, max_deliveries: u32, max: usize) -> Vec<Expired> {
        self.in_flight
            .iter()
            .filter(|(_, f)| f.deadline_ms <= now_ms)
            .take(max)
            .map(|(&offset, f)| {
                if f.deliveries >= max_deliveries {
                    Expired::DeadLetter { offset, deliveries: f.deliveries }
                } else {
                    Expired::Redeliver { offset, deliveries: f.deliveries + 1 }
                }
            })
            .collect()
    }

    /// Renews the lease of an expired message that is being delivered again.
    pub fn redeliver(&mut self, offset: u64, deadline_ms: u64) -> Option<u32> {
        let f = self.in_flight.get_mut(&offset)?;
        f.deliveries += 1;
        f.deadline_ms = deadline_ms;
        Some(f.deliveries)
    }

    /// Takes back a [`redeliver`](Self::redeliver) whose message was not handed out after all
    /// (the poll ran out of room): it counts no delivery and is due again at once.
    pub fn release(&mut self, offset: u64) {
        if let Some(f) = self.in_flight.get_mut(&offset) {
            f.deliveries = f.deliveries.saturating_sub(1).max(1);
            f.deadline_ms = 0;
        }
    }

    /// Whether `offset` is the next new message to deliver (or lies in a gap before it).
    pub fn wants(&self, offset: u64) -> bool {
        offset >= self.next_offset && !self.in_acked_ahead(offset)
    }

    /// Records the first delivery of `offset` (which must satisfy [`GroupCursor::wants`]).
    pub fn deliver(&mut self, offset: u64, deadline_ms: u64) {
        debug_assert!(self.wants(offset));
        self.in_flight.insert(offset, InFlight { deadline_ms, deliveries: 1 });
        self.next_offset = offset + 1;
        self.skip_acked();
    }

    /// Moves past offsets that were skipped because they no longer exist (a gap or retention).
    pub fn skip_to(&mut self, offset: u64) {
        if offset > self.next_offset {
            self.next_offset = offset;
            self.skip_acked();
            self.dirty = true;
        }
    }

    /// Acknowledges `offset`.
    pub fn ack(&mut self, offset: u64) -> AckOutcome {
        if self.in_flight.remove(&offset).is_some() {
            self.dirty = true;
            AckOutcome::Acked
        } else if offset < self.next_offset || self.in_acked_ahead(offset) {
            AckOutcome::AlreadyAcked
        } else {
            AckOutcome::NotDelivered
        }
    }

    /// What acking `offset` would do, without doing it.
    pub fn check_ack(&self, offset: u64) -> AckOutcome {
        if self.in_flight.contains_key(&offset) {
            AckOutcome::Acked
        } else if offset < self.next_offset || self.in_acked_ahead(offset) {
            AckOutcome::AlreadyAcked
        } else {
            AckOutcome::NotDelivered
        }
    }

    /// The earliest lease deadline, to know when to wake up.
    pub fn earliest_deadline_ms(&self) -> Option<u64> {
        self.in_flight.values().map(|f| f.deadline_ms).min()
    }

    fn in_acked_ahead(&self, offset: u64) -> bool {
        self.acked_ahead.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }

    fn skip_acked(&mut self) {
        loop {
            let next = self.next_offset;
            match self.acked_ahead.iter().find(|(a, b)| *a <= next && next <= *b) {
                Some(&(_, end)) => self.next_offset = end + 1,
                None => break,
            }
        }
        let next = self.next_offset;
        self.acked_ahead.retain(|(_, b)| *b >= next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_and_checkpoint_follow_acks() {
        let mut c = GroupCursor::from_checkpoint(0, 1, 0, &[], 0);
        for o in 0..5 {
            assert!(c.wants(o));
            c.deliver(o, 100);
        }
        assert_eq!(c.floor(), 0);
        assert_eq!(c.ack(1), AckOutcome::Acked);
        assert_eq!(c.ack(3), AckOutcome::Acked);
        assert_eq!(c.ack(3), AckOutcome::AlreadyAcked);
        assert_eq!(c.ack(9), AckOutcome::NotDelivered);
        assert_eq!(c.checkpoint(), (0, vec![(1, 1), (3, 3)]));
        assert_eq!(c.ack(0), AckOutcome::Acked);
        assert_eq!(c.checkpoint(), (2, vec![(3, 3)]));
        c.ack(2);
        c.ack(4);
        assert_eq!(c.checkpoint(), (5, vec![]));
    }

    #[test]
    fn resume_skips_acked_ranges() {
        let mut c = GroupCursor::from_checkpoint(0, 1, 2, &[(3, 4), (7, 7)], 0);
        assert_eq!(c.next_offset(), 2);
        c.deliver(2, 10);
        assert_eq!(c.next_offset(), 5, "3 and 4 were acked before the restart");
        assert!(!c.wants(7));
        c.deliver(5, 10);
        c.deliver(6, 10);
        assert_eq!(c.next_offset(), 8);
        assert_eq!(c.ack(7), AckOutcome::AlreadyAcked);
        assert_eq!(c.checkpoint(), (2, vec![(3, 4), (7, 7)]));
    }

    #[test]
    fn a_released_redelivery_is_due_again_and_counts_no_delivery() {
        let mut c = GroupCursor::from_checkpoint(0, 1, 0, &[], 0);
        c.deliver(0, 100);
        assert_eq!(c.expired(100, 5, 10), vec![Expired::Redeliver { offset: 0, deliveries: 2 }]);
        assert_eq!(c.redeliver(0, 200), Some(2));
        assert!(c.expired(150, 5, 10).is_empty(), "leased again");
        c.release(0);
        assert_eq!(c.expired(150, 5, 10), vec![Expired::Redeliver { offset: 0, deliveries: 2 }]);
        // Releasing what is not in flight changes nothing.
        c.release(7);
        assert_eq!(c.in_flight_len(), 1);
    }

    #[test]
    fn expiry_redelivers_then_dead_letters() {
        let mut c = GroupCursor::from_checkpoint(0, 1, 0, &[], 0);
        c.deliver(0, 100);
        assert!(c.expired(99, 2, 10).is_empty());
        assert_eq!(c.expired(100, 2, 10), vec![Expired::Redeliver { offset: 0, deliveries: 2 }]);
        assert_eq!(c.redeliver(0, 200), Some(2));
        assert_eq!(c.expired(200, 2, 10), vec![Expired::DeadLetter { offset: 0, deliveries: 2 }]);
        assert_eq!(c.ack(0), AckOutcome::Acked);
        assert_eq!(c.floor(), 1);
    }

    #[test]
    fn checkpoint_round_trips_through_resume() {
        let mut c = GroupCursor::from_checkpoint(0, 1, 0, &[], 0);
        for o in 0..10 {
            c.deliver(o, 1);
        }
        for o in [0, 2, 3, 7] {
            c.ack(o);
        }
        let (floor, acked) = c.take_checkpoint();
        let resumed = GroupCursor::from_checkpoint(0, 1, floor, &acked, 0);
        for o in 0..10 {
            let delivered_again = o >= resumed.next_offset() && resumed.wants(o);
            assert_eq!(delivered_again, ![0, 2, 3, 7].contains(&o), "offset {o}");
        }
    }
}
