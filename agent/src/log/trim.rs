//! Which local segments a log must cut back to what metadata recorded, decided without I/O
//! ([`plan`]); [`crate::log::replica::trim_to_metadata`] gathers what the log holds and makes
//! the cuts.

use silt_metadata::state::{Partition, SegmentState};

/// What a local log holds of one segment, as a trim decides by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The segment's base offset.
    pub base: u64,
    /// One past its last offset.
    pub next_offset: u64,
    /// Records in it.
    pub records: u64,
    /// The epoch stamped on its first batch (`None` when it holds none).
    pub first_epoch: Option<i32>,
}

/// The cuts that bring `held` (a log's segments, in order) in line with `part`: for each,
/// the segment's base and the offset it is cut back to (its base: cut to nothing). A segment
/// metadata sealed shorter is cut to the sealed end; one that is not the segment metadata knows
/// at its offset (another epoch wrote it, or it was never recorded, as at or past the end of a
/// chain left with no segment) is cut to nothing; one below metadata's chain that runs past
/// its start is cut back to that start; an open one, an empty one, or one wholly below
/// metadata's chain (deleted by retention, trimmed once archived) is left alone. What is cut
/// was never acknowledged.
///
/// `part` must be a view taken after the log's data was written. A view older than what the
/// directory has seen (`fence`, or a segment's epoch above the view's) is refused: cutting by it
/// could cut acknowledged data. The error says why.
pub fn plan(held: &[Held], part: &Partition, fence: u64) -> Result<Vec<(u64, u64)>, String> {
    let newest_seen = held
        .iter()
        .filter(|s| s.records > 0)
        .map(|s| s.first_epoch.map_or(0, |e| u64::try_from(e).unwrap_or(0)))
        .fold(fence, u64::max);
    if newest_seen > part.epoch {
        return Err(format!(
            "the metadata view of the partition is at epoch {} but its local log has seen epoch {newest_seen}: \
             nothing is cut by a view that old; retry with a fresh one",
            part.epoch
        ));
    }
    // With no segment left, the chain ends where `empty_end` says: below it retention deleted,
    // and from it on nothing was recorded (a seal of no records removed the only segment).
    let first = part.first_offset();
    let mut cuts = Vec::new();
    // A segment below the chain that runs past its start holds from there on what metadata
    // never recorded in it (a recovery sealed it shorter while this copy was away).
    for s in held.iter().filter(|s| s.records > 0 && s.base < first && s.next_offset > first) {
        cuts.push((s.base, first));
    }
    for s in held.iter().filter(|s| s.records > 0 && s.base >= first) {
        let cut = match part.segments.get(&s.base) {
            Some(m) if s.first_epoch.is_some_and(|e| i64::from(e) != m.epoch as i64) => Some(s.base),
            Some(m) if m.state == SegmentState::Open => None,
            Some(m) => m.last_offset.map(|l| l + 1).filter(|end| *end < s.next_offset),
            None => Some(s.base),
        };
        if let Some(end) = cut {
            cuts.push((s.base, end));
        }
    }
    Ok(cuts)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use silt_metadata::state::Segment;

    use super::*;

    fn segment(base: u64, last: Option<u64>, state: SegmentState, epoch: u64) -> Segment {
        Segment {
            unverified: Vec::new(),
            unverified_instances: Vec::new(),
            base_offset: base,
            last_offset: last,
            state,
            epoch,
            ensemble: vec!["a".into(), "b".into(), "c".into()],
            instances: Vec::new(),
            size_bytes: 0,
            record_count: last.map_or(0, |l| l + 1 - base),
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            opened_ms: 0,
            sealed_ms: None,
            object_key: None,
            object_bytes: 0,
            archived_ms: None,
            witnesses_needed: None,
            silent_since_ms: Default::default(),
        }
    }

    /// Metadata's chain: [0, 10) sealed under epoch 1, [10, 20) sealed under epoch 2, [20, ..)
    /// open under epoch 3; the partition at epoch 3.
    fn partition() -> Partition {
        let segments = [
            segment(0, Some(9), SegmentState::Sealed, 1),
            segment(10, Some(19), SegmentState::Sealed, 2),
            segment(20, None, SegmentState::Open, 3),
        ];
        Partition {
            writer: Some("a".into()),
            epoch: 3,
            segments: segments.into_iter().map(|s| (s.base_offset, s)).collect(),
            empty_end: 0,
            lost_ranges: Vec::new(),
        }
    }

    /// What a case is called, what the log holds, and the cuts it must get.
    type Case = (&'static str, Vec<Held>, Vec<(u64, u64)>);

    fn held(base: u64, next_offset: u64, epoch: i32) -> Held {
        Held { base, next_offset, records: next_offset - base, first_epoch: Some(epoch) }
    }

    #[test]
    fn every_kind_of_local_segment_is_cut_as_metadata_recorded_it() {
        let part = partition();
        let empty = Held { base: 30, next_offset: 30, records: 0, first_epoch: None };
        let cases: &[Case] = &[
            ("a log that matches metadata", vec![held(0, 10, 1), held(10, 20, 2), held(20, 25, 3)], vec![]),
            ("a sealed segment held longer than sealed", vec![held(10, 24, 2)], vec![(10, 20)]),
            ("a sealed segment held shorter (repair copies it)", vec![held(10, 15, 2)], vec![]),
            ("a segment another epoch wrote at that offset", vec![held(10, 20, 1)], vec![(10, 10)]),
            ("the open segment, however long", vec![held(20, 99, 3)], vec![]),
            ("the open segment of another epoch", vec![held(20, 22, 2)], vec![(20, 20)]),
            ("a segment metadata never recorded", vec![held(0, 10, 1), held(5, 8, 1)], vec![(5, 5)]),
            ("an empty segment", vec![empty], vec![]),
            ("one below metadata's chain", vec![held(0, 10, 1)], vec![]),
            ("several at once", vec![held(10, 21, 2), held(20, 26, 1)], vec![(10, 20), (20, 20)]),
        ];
        for (what, held, cuts) in cases {
            let mut part = part.clone();
            if *what == "one below metadata's chain" {
                part.segments.remove(&0);
            }
            assert_eq!(plan(held, &part, 3).as_ref(), Ok(cuts), "{what}");
        }
    }

    #[test]
    fn a_view_older_than_what_the_directory_has_seen_cuts_nothing() {
        let part = partition();
        let e = plan(&[held(10, 24, 2)], &part, 4).unwrap_err();
        assert!(e.contains("epoch 3") && e.contains("seen epoch 4"), "{e}");
        let e = plan(&[held(20, 24, 5)], &part, 3).unwrap_err();
        assert!(e.contains("seen epoch 5"), "{e}");
        // An empty segment's epoch says nothing; the fence at the view's epoch is no newer.
        let empty = Held { base: 30, next_offset: 30, records: 0, first_epoch: Some(9) };
        assert_eq!(plan(&[empty], &part, 3), Ok(vec![]));
    }

    #[test]
    fn a_chain_left_with_no_segment_cuts_what_lies_at_or_past_its_end() {
        // A recovery sealed the only segment with no records, which removed it: the record a
        // silent member holds at its base was never recorded, nor acknowledged.
        let bare = Partition { epoch: 3, ..Partition::default() };
        assert_eq!(plan(&[held(0, 10, 1)], &bare, 3), Ok(vec![(0, 0)]));
        // Below where the empty chain ends, retention deleted: left alone.
        let deleted = Partition { epoch: 3, empty_end: 10, ..Partition::default() };
        assert_eq!(plan(&[held(0, 10, 1)], &deleted, 3), Ok(vec![]));
        assert_eq!(plan(&[held(0, 10, 1), held(10, 12, 2)], &deleted, 3), Ok(vec![(10, 10)]));
    }

    #[test]
    fn a_segment_that_runs_past_where_the_chain_starts_is_cut_back_to_it() {
        // A recovery sealed [0, 12) at 10 while this member was away; the segment was archived
        // and deleted by retention, and the chain goes on from 10 (or, once a later segment
        // closed with no records, ends there). What this member holds from 10 on was never
        // acknowledged, and the next writer's segment starts at 10.
        let emptied = Partition { epoch: 3, empty_end: 10, ..Partition::default() };
        assert_eq!(plan(&[held(0, 12, 1)], &emptied, 3), Ok(vec![(0, 10)]));
        let mut going_on = partition();
        going_on.segments.remove(&0);
        assert_eq!(plan(&[held(0, 12, 1)], &going_on, 3), Ok(vec![(0, 10)]));
        // Ending where the chain starts, it is left alone.
        assert_eq!(plan(&[held(0, 10, 1)], &going_on, 3), Ok(vec![]));
    }
}
