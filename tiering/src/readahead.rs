//! Which row groups the cold reader decodes ahead of its reads: pure bookkeeping, no I/O.
//!
//! A read is *sequential* when it starts where an earlier read of the same object ended, or at
//! (or before) the object's first offset: a consumer replaying a partition reads one object
//! after the other from its start. Only a sequential read gets readahead: before it waits for
//! row group `k`, the next row groups `k + 1 ..= k + ROW_GROUPS_AHEAD_MAX` of the same object
//! (never beyond its last row group) are decoded in the background, so that a second core
//! decodes the next row group while the read waits for (or consumes) the current one. When
//! those run out (a stream is in the object's last row groups), the first row group of the
//! partition's next object, which the caller names, is read ahead too, within the same window
//! ([`ReadaheadPlanner::plan_next_object`]); not where a seek ended
//! ([`ReadaheadPlanner::is_stream_at`]).
//!
//! Bounded in bytes, counted with each row group's uncompressed size from the footer (about
//! the memory its decoded records take): the row groups ahead of a read may add up to at most
//! `bytes_max`, and so may all the row groups being read ahead at once, whatever the number of
//! readers. A row group larger than `bytes_max` is never read ahead.

use std::collections::VecDeque;

/// Most row groups decoded ahead of a read.
pub(crate) const ROW_GROUPS_AHEAD_MAX: usize = 2;
/// Most read ends remembered (one per consumer stream in progress, oldest forgotten first).
pub(crate) const READ_ENDS_MAX: usize = 256;

/// One row group of one object, as the planner tracks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PlannedRowGroup {
    pub(crate) object_key: String,
    pub(crate) object_bytes: u64,
    pub(crate) row_group: usize,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ReadaheadPlanner {
    bytes_max: u64,
    /// Where recent reads ended: (object key, the offset after the last record returned,
    /// whether that read was sequential itself).
    read_ends: VecDeque<(String, u64, bool)>,
    /// Row groups being decoded ahead, with their uncompressed bytes.
    in_flight: Vec<(PlannedRowGroup, u64)>,
    closed: bool,
}

impl ReadaheadPlanner {
    /// A planner that keeps at most `bytes_max` bytes ahead; 0 turns readahead off.
    pub(crate) fn new(bytes_max: u64) -> Self {
        ReadaheadPlanner { bytes_max, read_ends: VecDeque::new(), in_flight: Vec::new(), closed: false }
    }

    /// Whether a read of `object_key` from `from_offset` continues a stream: it starts where an
    /// earlier read ended, or at or before the object's `base_offset`.
    pub(crate) fn is_sequential(&self, object_key: &str, from_offset: u64, base_offset: u64) -> bool {
        from_offset <= base_offset
            || self.read_ends.iter().any(|(key, end, _)| *end == from_offset && key == object_key)
    }

    /// Whether a stream is at `offset` of `object_key`: it is the object's start, or where a
    /// sequential read ended (so not where a seek ended: one read of a message somewhere is no
    /// reason to read the next object ahead).
    pub(crate) fn is_stream_at(&self, object_key: &str, offset: u64, base_offset: u64) -> bool {
        offset <= base_offset
            || self
                .read_ends
                .iter()
                .any(|(key, end, sequential)| *sequential && *end == offset && key == object_key)
    }

    /// Remembers that a read of `object_key` from `from_offset` (`sequential` or not) returned
    /// records up to `next_offset - 1`, replacing the end of the read it continued, if any.
    pub(crate) fn read_ended(
        &mut self,
        object_key: &str,
        from_offset: u64,
        next_offset: u64,
        sequential: bool,
    ) {
        if let Some(i) =
            self.read_ends.iter().position(|(key, end, _)| *end == from_offset && key == object_key)
        {
            self.read_ends.remove(i);
        }
        if self.read_ends.len() >= READ_ENDS_MAX {
            self.read_ends.pop_front();
        }
        self.read_ends.push_back((object_key.to_string(), next_offset, sequential));
    }

    /// The row groups to start decoding now, ahead of a sequential read that needs row group
    /// `current` of an object whose row groups take `row_group_bytes` each; `is_decoded` says
    /// which are decoded already. Each row group returned is in flight until
    /// [`ReadaheadPlanner::finished`] is called for it.
    pub(crate) fn plan(
        &mut self,
        object_key: &str,
        object_bytes: u64,
        current: usize,
        row_group_bytes: &[u64],
        is_decoded: impl Fn(usize) -> bool,
    ) -> Vec<PlannedRowGroup> {
        let first = current.saturating_add(1);
        let range = first..first.saturating_add(ROW_GROUPS_AHEAD_MAX);
        self.plan_range(object_key, object_bytes, range, 0, row_group_bytes, is_decoded)
    }

    /// The first row group of the object a sequential read goes on to once it is done with
    /// the one it reads (see [`ReadaheadPlanner::plan`]), if the budget has room for it after
    /// `ahead_in_current` bytes: the row groups of the current object after the read's, which
    /// are ahead of it too.
    pub(crate) fn plan_next_object(
        &mut self,
        object_key: &str,
        object_bytes: u64,
        ahead_in_current: u64,
        row_group_bytes: &[u64],
        is_decoded: impl Fn(usize) -> bool,
    ) -> Vec<PlannedRowGroup> {
        self.plan_range(object_key, object_bytes, 0..1, ahead_in_current, row_group_bytes, is_decoded)
    }

    fn plan_range(
        &mut self,
        object_key: &str,
        object_bytes: u64,
        range: std::ops::Range<usize>,
        ahead_already: u64,
        row_group_bytes: &[u64],
        is_decoded: impl Fn(usize) -> bool,
    ) -> Vec<PlannedRowGroup> {
        let mut started = Vec::new();
        if self.closed || self.bytes_max == 0 {
            return started;
        }
        let mut ahead_bytes = ahead_already;
        let end = row_group_bytes.len().min(range.end);
        for (rg, &bytes) in row_group_bytes.iter().enumerate().take(end).skip(range.start) {
            ahead_bytes = ahead_bytes.saturating_add(bytes);
            if ahead_bytes > self.bytes_max {
                break;
            }
            let planned = PlannedRowGroup { object_key: object_key.to_string(), object_bytes, row_group: rg };
            if is_decoded(rg) || self.in_flight.iter().any(|(p, _)| *p == planned) {
                continue;
            }
            if self.in_flight_bytes().saturating_add(bytes) > self.bytes_max {
                break;
            }
            self.in_flight.push((planned.clone(), bytes));
            started.push(planned);
        }
        started
    }

    /// A row group [`ReadaheadPlanner::plan`] returned is decoded (or failed).
    pub(crate) fn finished(&mut self, planned: &PlannedRowGroup) {
        if let Some(i) = self.in_flight.iter().position(|(p, _)| p == planned) {
            self.in_flight.swap_remove(i);
        }
    }

    /// Bytes of the row groups being read ahead now.
    pub(crate) fn in_flight_bytes(&self) -> u64 {
        self.in_flight.iter().map(|(_, bytes)| bytes).sum()
    }

    /// Whether nothing is being read ahead.
    pub(crate) fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Plans nothing from now on (the reader is closing).
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgs(planned: &[PlannedRowGroup]) -> Vec<usize> {
        planned.iter().map(|p| p.row_group).collect()
    }

    #[test]
    fn sequential_reads_start_at_the_object_or_where_a_read_ended() {
        let mut p = ReadaheadPlanner::new(100);
        assert!(p.is_sequential("a", 10, 10), "at the first offset");
        assert!(p.is_sequential("a", 0, 10), "before the first offset");
        assert!(!p.is_sequential("a", 15, 10), "in the middle, nothing read yet");
        p.read_ended("a", 10, 15, true);
        assert!(p.is_sequential("a", 15, 10));
        assert!(!p.is_sequential("b", 15, 10), "another object");
        assert!(!p.is_sequential("a", 16, 10), "a gap");
        p.read_ended("a", 15, 20, true);
        assert!(!p.is_sequential("a", 15, 10), "the continued read's end is replaced");
        assert!(p.is_sequential("a", 20, 10));
        for i in 0..READ_ENDS_MAX as u64 {
            p.read_ended("b", 1000 + i, 2000 + i, true);
        }
        assert!(!p.is_sequential("a", 20, 10), "the oldest end is forgotten");
        assert_eq!(p.read_ends.len(), READ_ENDS_MAX);
        // Where a seek ended, a read continuing it is sequential, but no stream is there yet.
        p.read_ended("c", 50, 60, false);
        assert!(p.is_sequential("c", 60, 10));
        assert!(!p.is_stream_at("c", 60, 10));
        assert!(p.is_stream_at("c", 10, 10), "the object's start");
        p.read_ended("c", 60, 70, true);
        assert!(p.is_stream_at("c", 70, 10));
    }

    #[test]
    fn plans_at_most_two_row_groups_and_never_beyond_the_object() {
        let mut p = ReadaheadPlanner::new(1000);
        let sizes = [10, 10, 10, 10];
        assert_eq!(rgs(&p.plan("a", 1, 0, &sizes, |_| false)), [1, 2]);
        assert_eq!(rgs(&p.plan("a", 1, 0, &sizes, |_| false)), Vec::<usize>::new(), "already in flight");
        assert_eq!(rgs(&p.plan("a", 1, 1, &sizes, |_| false)), [3]);
        assert_eq!(rgs(&p.plan("a", 1, 3, &sizes, |_| false)), Vec::<usize>::new(), "the last row group");
        assert_eq!(rgs(&p.plan("a", 1, 7, &sizes, |_| false)), Vec::<usize>::new(), "past the end");
        for rg in 1..=3 {
            p.finished(&PlannedRowGroup { object_key: "a".into(), object_bytes: 1, row_group: rg });
        }
        assert!(p.is_idle());
        assert_eq!(rgs(&p.plan("a", 1, 0, &sizes, |rg| rg == 1)), [2], "decoded already");
        assert_eq!(rgs(&p.plan("a", 2, 0, &sizes, |_| false)), [1, 2], "another object size");
        assert_eq!(rgs(&p.plan_next_object("n", 1, 0, &sizes, |_| false)), [0], "the next object's first");
        assert_eq!(rgs(&p.plan_next_object("n", 1, 0, &sizes, |_| false)), Vec::<usize>::new(), "in flight");
        assert_eq!(rgs(&p.plan_next_object("m", 1, 0, &sizes, |rg| rg == 0)), Vec::<usize>::new(), "decoded");
        assert_eq!(rgs(&p.plan_next_object("e", 1, 0, &[], |_| false)), Vec::<usize>::new(), "no row group");
        // What is ahead in the current object counts against the budget first.
        assert_eq!(
            rgs(&p.plan_next_object("f", 1, 995, &sizes, |_| false)),
            Vec::<usize>::new(),
            "995 + 10 > 1000"
        );
        assert_eq!(rgs(&p.plan_next_object("f", 1, 990, &sizes, |_| false)), [0]);
    }

    #[test]
    fn plans_within_the_byte_budget() {
        let mut p = ReadaheadPlanner::new(25);
        // The window ahead of a read: 10 + 10 fits, a third would not (and is not asked for).
        assert_eq!(rgs(&p.plan("a", 1, 0, &[10, 10, 10, 10], |_| false)), [1, 2]);
        assert_eq!(p.in_flight_bytes(), 20);
        // All reads together: 5 bytes left, so another object's row group of 10 waits.
        assert_eq!(rgs(&p.plan("b", 1, 0, &[10, 10], |_| false)), Vec::<usize>::new());
        assert_eq!(rgs(&p.plan("b", 1, 0, &[10, 5], |_| false)), [1]);
        assert_eq!(p.in_flight_bytes(), 25);

        let mut p = ReadaheadPlanner::new(25);
        assert_eq!(rgs(&p.plan("a", 1, 0, &[10, 20, 10], |_| false)), [1], "20 + 10 > 25");
        assert_eq!(
            rgs(&p.plan("c", 1, 0, &[1, 30], |_| false)),
            Vec::<usize>::new(),
            "larger than the budget"
        );
        // Row groups decoded ahead still count in the window of a read.
        let mut p = ReadaheadPlanner::new(25);
        assert_eq!(rgs(&p.plan("a", 1, 0, &[10, 20, 10], |rg| rg == 1)), Vec::<usize>::new());
    }

    #[test]
    fn plans_nothing_when_off_or_closed() {
        let mut p = ReadaheadPlanner::new(0);
        assert!(p.plan("a", 1, 0, &[1, 1, 1], |_| false).is_empty());
        let mut p = ReadaheadPlanner::new(100);
        p.close();
        assert!(p.plan("a", 1, 0, &[1, 1, 1], |_| false).is_empty());
    }
}
