//! The read router: which tier holds an offset.
//!
//! Pure functions over a partition's segment chain from metadata; no I/O. Archived segments
//! are read from the bucket ([`Location::Cold`]), open and sealed ones from a replica
//! ([`Location::Hot`]).

use silt_metadata::state::{Partition, Segment, SegmentState};

/// Where the record at an offset can be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// In a segment still held by replicas (open or sealed): read it from an agent.
    Hot {
        /// The segment's first offset.
        base_offset: u64,
    },
    /// In an archived segment: read its Parquet object.
    Cold {
        /// The object's key (full path in the bucket).
        object_key: String,
        /// The object's size.
        object_bytes: u64,
        /// The segment's first offset.
        base_offset: u64,
        /// The segment's last offset.
        last_offset: u64,
    },
    /// Not written yet: past the end of the last sealed segment.
    Future,
    /// Deleted by retention (or never existed, in a gap of the chain): the next offset that
    /// can be read is `earliest`.
    Gone {
        /// The first readable offset after the requested one.
        earliest: u64,
    },
}

/// The first offset of the partition that can still be read (where the log ends for a
/// partition whose segments retention deleted, 0 for one never written).
pub fn earliest_offset(partition: &Partition) -> u64 {
    partition.first_offset()
}

fn location_of(segment: &Segment) -> Location {
    match (segment.state, &segment.object_key, segment.last_offset) {
        (SegmentState::Archived, Some(key), Some(last_offset)) => Location::Cold {
            object_key: key.clone(),
            object_bytes: segment.object_bytes,
            base_offset: segment.base_offset,
            last_offset,
        },
        // An archived segment without its object would be a metadata bug; its replicas are
        // the only place left to try.
        (SegmentState::Archived, _, _) | (SegmentState::Open, _, _) | (SegmentState::Sealed, _, _) => {
            Location::Hot { base_offset: segment.base_offset }
        }
    }
}

/// Which tier holds `offset` of `partition`.
pub fn locate(partition: &Partition, offset: u64) -> Location {
    let Some(segment) = partition.segments.range(..=offset).next_back().map(|(_, s)| s) else {
        return match partition.segments.values().next() {
            Some(first) => Location::Gone { earliest: first.base_offset },
            None if offset < partition.empty_end => Location::Gone { earliest: partition.empty_end },
            None => Location::Future,
        };
    };
    match segment.last_offset {
        // The open segment: its end is only known to its replicas.
        None => location_of(segment),
        Some(last) if offset <= last => location_of(segment),
        Some(_) => match partition.segments.range(offset..).next() {
            // A gap in the chain: offsets declared lost (`Partition::lost_ranges`).
            Some((next_base, _)) => Location::Gone { earliest: *next_base },
            // Lost offsets at the end of the chain: the next segment starts after them.
            None if offset < partition.empty_end => Location::Gone { earliest: partition.empty_end },
            None => Location::Future,
        },
    }
}

/// The segment to start reading at to find the first record with a timestamp at or after
/// `timestamp_ms`: the first segment whose largest timestamp is at or after it (or whose
/// largest timestamp is not known yet, like the open segment's). `None` when every record is
/// older. The caller finds the exact offset inside the segment (for a cold one with
/// [`crate::ColdReader::offset_for_time`]).
pub fn locate_time(partition: &Partition, timestamp_ms: i64) -> Option<Location> {
    partition
        .segments
        .values()
        .find(|s| s.max_timestamp_ms.is_none_or(|max| max >= timestamp_ms))
        .map(location_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segment(base: u64, last: Option<u64>, state: SegmentState, max_ts: Option<i64>) -> Segment {
        Segment {
            unverified: Vec::new(),
            unverified_instances: Vec::new(),
            base_offset: base,
            last_offset: last,
            state,
            epoch: 1,
            ensemble: vec!["a".into()],
            instances: Vec::new(),
            size_bytes: 0,
            record_count: last.map_or(0, |l| l - base + 1),
            min_timestamp_ms: max_ts,
            max_timestamp_ms: max_ts,
            opened_ms: 0,
            sealed_ms: None,
            object_key: (state == SegmentState::Archived).then(|| format!("p/{base}.parquet")),
            object_bytes: if state == SegmentState::Archived { 1000 + base } else { 0 },
            archived_ms: None,
            witnesses_needed: None,
            silent_since_ms: Default::default(),
        }
    }

    fn partition(segments: Vec<Segment>) -> Partition {
        Partition {
            writer: None,
            epoch: 1,
            segments: segments.into_iter().map(|s| (s.base_offset, s)).collect(),
            empty_end: 0,
            lost_ranges: Vec::new(),
        }
    }

    #[test]
    fn a_partition_whose_segments_retention_deleted_reads_from_where_its_log_ends() {
        let mut p = partition(Vec::new());
        assert_eq!(earliest_offset(&p), 0);
        assert_eq!(locate(&p, 0), Location::Future, "never written");
        p.empty_end = 40;
        assert_eq!(earliest_offset(&p), 40);
        assert_eq!(locate(&p, 39), Location::Gone { earliest: 40 });
        assert_eq!(locate(&p, 40), Location::Future);
    }

    #[test]
    fn routes_each_tier() {
        let p = partition(vec![
            segment(10, Some(19), SegmentState::Archived, Some(100)),
            segment(20, Some(29), SegmentState::Sealed, Some(200)),
            segment(30, None, SegmentState::Open, None),
        ]);
        assert_eq!(earliest_offset(&p), 10);
        assert_eq!(locate(&p, 0), Location::Gone { earliest: 10 });
        assert_eq!(locate(&p, 9), Location::Gone { earliest: 10 });
        let cold = Location::Cold {
            object_key: "p/10.parquet".into(),
            object_bytes: 1010,
            base_offset: 10,
            last_offset: 19,
        };
        assert_eq!(locate(&p, 10), cold);
        assert_eq!(locate(&p, 19), cold);
        assert_eq!(locate(&p, 20), Location::Hot { base_offset: 20 });
        assert_eq!(locate(&p, 29), Location::Hot { base_offset: 20 });
        assert_eq!(locate(&p, 30), Location::Hot { base_offset: 30 });
        assert_eq!(locate(&p, u64::MAX), Location::Hot { base_offset: 30 });

        let sealed_end = partition(vec![segment(0, Some(4), SegmentState::Sealed, Some(1))]);
        assert_eq!(locate(&sealed_end, 5), Location::Future);
        assert_eq!(locate(&Partition::default(), 0), Location::Future);
        assert_eq!(earliest_offset(&Partition::default()), 0);

        let gap = partition(vec![
            segment(0, Some(4), SegmentState::Sealed, Some(1)),
            segment(8, Some(9), SegmentState::Sealed, Some(1)),
        ]);
        assert_eq!(locate(&gap, 5), Location::Gone { earliest: 8 });

        // Offsets 5..8 declared lost at the chain's end: stepped over to where it goes on.
        let mut lost_tail = partition(vec![segment(0, Some(4), SegmentState::Sealed, Some(1))]);
        lost_tail.empty_end = 8;
        assert_eq!(locate(&lost_tail, 4), Location::Hot { base_offset: 0 });
        assert_eq!(locate(&lost_tail, 5), Location::Gone { earliest: 8 });
        assert_eq!(locate(&lost_tail, 7), Location::Gone { earliest: 8 });
        assert_eq!(locate(&lost_tail, 8), Location::Future);
    }

    #[test]
    fn routes_times() {
        let p = partition(vec![
            segment(10, Some(19), SegmentState::Archived, Some(100)),
            segment(20, Some(29), SegmentState::Sealed, Some(200)),
        ]);
        assert!(matches!(locate_time(&p, 50), Some(Location::Cold { base_offset: 10, .. })));
        assert!(matches!(locate_time(&p, 100), Some(Location::Cold { base_offset: 10, .. })));
        assert_eq!(locate_time(&p, 101), Some(Location::Hot { base_offset: 20 }));
        assert_eq!(locate_time(&p, 201), None);
        let mut with_open = p.clone();
        with_open.segments.insert(30, segment(30, None, SegmentState::Open, None));
        assert_eq!(locate_time(&with_open, 201), Some(Location::Hot { base_offset: 30 }));
    }

    fn state_strategy() -> impl Strategy<Value = SegmentState> {
        prop_oneof![Just(SegmentState::Archived), Just(SegmentState::Sealed)]
    }

    proptest! {
        #[test]
        fn every_offset_maps_to_its_segment(
            first in 0u64..1000,
            chain in proptest::collection::vec((1u64..20, state_strategy()), 0..8),
            open_tail in any::<bool>(),
        ) {
            let mut segments = Vec::new();
            let mut base = first;
            for (len, state) in &chain {
                segments.push(segment(base, Some(base + len - 1), *state, Some(0)));
                base += len;
            }
            if open_tail {
                segments.push(segment(base, None, SegmentState::Open, None));
            }
            let p = partition(segments.clone());
            let end = base; // first offset after the sealed chain
            prop_assert_eq!(earliest_offset(&p), if segments.is_empty() { 0 } else { first });
            for offset in 0..end + 30 {
                let got = locate(&p, offset);
                let containing = segments.iter().find(|s| {
                    offset >= s.base_offset && s.last_offset.is_none_or(|l| offset <= l)
                });
                match containing {
                    Some(s) => prop_assert_eq!(got, location_of(s), "offset {}", offset),
                    None if segments.is_empty() || offset >= end => prop_assert_eq!(got, Location::Future),
                    None => prop_assert_eq!(got, Location::Gone { earliest: first }),
                }
            }
        }
    }
}
