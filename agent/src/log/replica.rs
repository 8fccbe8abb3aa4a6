//! The follower half of the replicated hot tail: replicas this agent holds of segments another
//! agent writes, and the fence that makes every replica refuse a deposed writer.
//!
//! A partition's local log (`{data}/log/{topic}-{id}/{partition}/`) holds the segments of that
//! partition this agent is an ensemble member of, whether it wrote them or followed them:
//! when a follower becomes the writer, its replicas are already in its log. Segments it was
//! not a member of are gaps; reads of them go to other replicas or the archive.
//!
//! Fencing (Apache BookKeeper's ledger recovery): each partition directory keeps the newest
//! writer epoch it has seen in `fence`. An append from an older epoch is refused; a new
//! writer raises the fence on a segment's replicas before it reads their ends, so the writer
//! it replaces can no longer gather a write quorum.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_metadata::state::Partition;
use silt_record::RecordBatch;
use tracing::warn;

use crate::error::StoreError;
use crate::log::partition_log::{PartitionLog, PartitionReader};
use crate::log::trim::{self, Held};

const FENCE_FILE: &str = "fence";

/// The newest writer epoch a partition directory has seen (0 if none).
pub fn read_fence(dir: &Path) -> Result<u64, StoreError> {
    let path = dir.join(FENCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => s.trim().parse::<u64>().map_err(|_| StoreError::Corrupt {
            path,
            position: 0,
            reason: format!("fence file holds '{}', not an epoch", s.trim()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(StoreError::io(&path, "read", e)),
    }
}

/// Records `epoch` as the partition directory's fence, durably (write, fsync, rename, fsync).
/// A fence only grows: callers raise it to a newer epoch than the one it holds.
pub fn write_fence(dir: &Path, epoch: u64) -> Result<(), StoreError> {
    use std::io::Write as _;
    debug_assert!(
        read_fence(dir).map_or(true, |fence| fence <= epoch),
        "the fence of {} would go down to {epoch}",
        dir.display()
    );
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, "create directory", e))?;
    let path = dir.join(FENCE_FILE);
    let tmp = dir.join("fence.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| StoreError::io(&tmp, "create", e))?;
    f.write_all(epoch.to_string().as_bytes()).map_err(|e| StoreError::io(&tmp, "write", e))?;
    crate::log::disk::sync_all(&f, &tmp)
        .map_err(|e| StoreError::FsyncFailed { path: tmp.clone(), source: e })?;
    std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(&path, "rename", e))?;
    crate::log::segment::sync_dir(dir)
}

/// One segment as one replica holds it: what a recovering writer needs to seal it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSegment {
    /// The segment's first offset.
    pub base_offset: u64,
    /// One past the last offset this replica holds (`base_offset` if none).
    pub end_offset: u64,
    /// Bytes held.
    pub size_bytes: u64,
    /// Smallest record timestamp held.
    pub min_timestamp_ms: Option<i64>,
    /// Largest record timestamp held.
    pub max_timestamp_ms: Option<i64>,
    /// The replica's data-directory instance: a recovering writer ignores a member whose
    /// instance changed since the segment opened (its disk was wiped).
    pub instance: String,
}

impl HeldSegment {
    /// What `log` holds of the segment at `base` written under `segment_epoch`; a segment of
    /// another epoch at that offset is not it.
    pub fn of(log: &PartitionLog, base: u64, segment_epoch: u64, instance: &str) -> Result<Self, StoreError> {
        let mut held = HeldSegment {
            base_offset: base,
            end_offset: base,
            instance: instance.into(),
            ..Default::default()
        };
        if let Some(s) = log.segments().iter().find(|s| s.base_offset() == base) {
            if s.first_epoch()?.is_some_and(|e| i64::from(e) == segment_epoch as i64) {
                held.end_offset = s.next_offset();
                held.size_bytes = s.size_bytes();
                held.min_timestamp_ms = s.min_timestamp_ms();
                held.max_timestamp_ms = s.max_timestamp_ms();
            }
        }
        Ok(held)
    }
}

impl HeldSegment {
    /// What a log's read half holds of the segment at `base` written under `segment_epoch`,
    /// without the log itself (it may be a writer's): the local segment starting there, if its
    /// first batch carries that epoch. Timestamps are left out.
    pub fn of_reader(
        reader: &PartitionReader,
        base: u64,
        segment_epoch: u64,
        instance: &str,
    ) -> Result<Self, StoreError> {
        let mut held = HeldSegment {
            base_offset: base,
            end_offset: base,
            instance: instance.into(),
            ..Default::default()
        };
        let Some((end, size_bytes)) = reader.segment_extent(base).filter(|(end, _)| *end > base) else {
            return Ok(held);
        };
        let first = reader.read(base, 1)?.batches.into_iter().next();
        if first.is_some_and(|b| {
            b.base_offset() == base && i64::from(b.partition_leader_epoch()) == segment_epoch as i64
        }) {
            held.end_offset = end;
            held.size_bytes = size_bytes;
        }
        Ok(held)
    }
}

/// Brings a local log in line with metadata before it is served or written: a segment that
/// metadata sealed shorter is cut back to the sealed end, and a segment that is not the one
/// metadata knows at its offset (another epoch wrote it, or it was never recorded) is cut to
/// nothing. What is cut was never acknowledged. Segments below metadata's chain (deleted by
/// retention) are left to the trimming of archived data. Returns how many segments changed.
///
/// `part` must be a view of metadata taken after the log's data was written (a linearizable
/// read): a stale copy does not know the newest segments, and cutting by it would cut
/// acknowledged data. A view older than what the directory has seen (its `fence`, or a
/// segment's epoch above the view's epoch) is refused, and nothing is cut.
pub fn trim_to_metadata(log: &mut PartitionLog, part: &Partition, fence: u64) -> Result<usize, StoreError> {
    let held = log
        .segments()
        .iter()
        .map(|s| {
            Ok(Held {
                base: s.base_offset(),
                next_offset: s.next_offset(),
                records: s.record_count(),
                first_epoch: if s.record_count() > 0 { s.first_epoch()? } else { None },
            })
        })
        .collect::<Result<Vec<Held>, StoreError>>()?;
    let cuts = trim::plan(&held, part, fence).map_err(StoreError::Failed)?;
    for (base, end) in &cuts {
        warn!(base, end, "cutting a local segment back to what metadata recorded");
        log.truncate_segment(*base, *end)?;
    }
    Ok(cuts.len())
}

/// Splits a body of RecordBatch v2 batches laid end to end.
pub fn split_batches(body: Bytes) -> Result<Vec<RecordBatch>, StoreError> {
    silt_record::split_batches(body)
        .map_err(|e| StoreError::Diverged(format!("a replicated body is not whole batches: {e}")))
}

/// Lays batches end to end, as [`split_batches`] reads them.
pub fn join_batches(batches: &[RecordBatch]) -> Bytes {
    let mut out = bytes::BytesMut::with_capacity(batches.iter().map(|b| b.len_bytes()).sum());
    for b in batches {
        out.extend_from_slice(b.as_bytes());
    }
    out.freeze()
}

/// A partition's local log held as a follower.
#[derive(Debug)]
pub struct Replica {
    /// The topic id the log belongs to.
    pub topic_id: u64,
    dir: PathBuf,
    log: PartitionLog,
    fence: u64,
    /// The open segment followed, and the end its writer last said was committed (on W
    /// replicas, acknowledged): this replica serves reads of that segment up to there.
    committed: Option<(u64, u64)>,
}

impl Replica {
    /// Opens the log in `dir`, cut back to what metadata recorded.
    pub fn open(dir: &Path, topic_id: u64, part: &Partition) -> Result<Replica, StoreError> {
        let (mut log, _) = PartitionLog::open(dir)?;
        let fence = read_fence(dir)?;
        trim_to_metadata(&mut log, part, fence)?;
        Ok(Replica { topic_id, dir: dir.to_path_buf(), log, fence, committed: None })
    }

    /// The read half of the log.
    pub fn reader(&self) -> Arc<PartitionReader> {
        self.log.reader()
    }

    /// The log.
    pub fn log_mut(&mut self) -> &mut PartitionLog {
        &mut self.log
    }

    /// The newest epoch seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Records that the writer has committed the segment at `segment` up to `end` (never
    /// beyond what this replica holds, never backwards).
    pub fn note_committed(&mut self, segment: u64, end: u64) {
        let held = self
            .log
            .segments()
            .iter()
            .find(|s| s.base_offset() == segment)
            .map_or(segment, |s| s.next_offset());
        let end = end.min(held);
        let before = self.committed.filter(|(s, _)| *s == segment).map_or(segment, |(_, e)| e);
        self.committed = Some((segment, end.max(before)));
    }

    /// One past the last offset of the open segment at `segment` known to be committed.
    pub fn committed_end(&self, segment: u64) -> Option<u64> {
        self.committed.filter(|(s, _)| *s == segment).map(|(_, e)| e)
    }

    /// Refuses `epoch` if a newer writer fenced this replica, and raises the fence to it.
    pub fn admit(&mut self, topic: &str, partition: u32, epoch: u64) -> Result<(), StoreError> {
        if epoch < self.fence && !crate::sim_bugs::on(crate::sim_bugs::Bug::TrimWithoutEpochCheck) {
            return Err(StoreError::Fenced { topic: topic.into(), partition, epoch, fence: self.fence });
        }
        if epoch > self.fence {
            write_fence(&self.dir, epoch)?;
            self.fence = epoch;
        }
        debug_assert!(self.fence >= epoch, "admitted epoch {epoch} above the fence {}", self.fence);
        Ok(())
    }

    /// Appends a writer's batches of the segment at `segment` (opened under `segment_epoch`)
    /// and fsyncs them. Returns the end this replica holds of that segment.
    pub fn append(
        &mut self,
        segment: u64,
        segment_epoch: u64,
        batches: &[RecordBatch],
    ) -> Result<u64, StoreError> {
        let local = self.log.segments().iter().position(|s| s.base_offset() == segment);
        if let Some(i) = local {
            let s = &self.log.segments()[i];
            let stale = s.first_epoch()?.is_some_and(|e| i64::from(e) != segment_epoch as i64);
            if stale {
                // Another epoch's segment at this offset: its records were never acknowledged
                // (metadata replaced that segment); the writer's segment takes its place.
                self.log.truncate_segment(segment, segment)?;
            } else if i + 1 < self.log.segments().len() {
                // A segment this replica has sealed: only a retry of batches it holds fits.
                if batches.iter().all(|b| b.last_offset() < s.next_offset()) {
                    return Ok(s.next_offset());
                }
                return Err(StoreError::Diverged(format!(
                    "segment {segment} is sealed on this replica at offset {}",
                    s.next_offset()
                )));
            }
        }
        if self.log.segments().iter().all(|s| s.base_offset() != segment) {
            // The writer opened `segment` in metadata after sealing the one before it, so
            // whatever this replica holds from `segment` on was never acknowledged: a tail it
            // took from a writer whose recovery did not hear from it. Failing (not diverging)
            // closes the replica; it is opened again cut back to what metadata recorded.
            self.log.start_segment_at(segment).map_err(|e| match e {
                StoreError::Diverged(reason) => StoreError::Failed(format!(
                    "{reason}, past the start of the writer's new segment; the replica is opened again, cut back to what metadata recorded"
                )),
                e => e,
            })?;
        }
        let end = self.log.append_replicated(batches)?;
        self.log.publish();
        Ok(end)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use silt_record::{encode_batch, NewRecord};

    use silt_metadata::state::SegmentState;

    use super::*;

    fn batch(base: u64, n: usize, epoch: i32) -> RecordBatch {
        let records: Vec<NewRecord> = (0..n)
            .map(|i| NewRecord {
                timestamp_ms: 1_000 + i as i64,
                key: None,
                value: Some(Bytes::from(format!("v{}", base + i as u64))),
                headers: Vec::new(),
            })
            .collect();
        RecordBatch::parse(encode_batch(&records).unwrap()).unwrap().with_offsets(base, epoch)
    }

    fn partition(segments: &[(u64, Option<u64>, SegmentState, u64)]) -> Partition {
        let mut p = Partition::default();
        for (base, last, state, epoch) in segments {
            p.segments.insert(
                *base,
                silt_metadata::state::Segment {
                    unverified: Vec::new(),
                    unverified_instances: Vec::new(),
                    base_offset: *base,
                    last_offset: *last,
                    state: *state,
                    epoch: *epoch,
                    ensemble: vec!["a".into()],
                    instances: Vec::new(),
                    size_bytes: 0,
                    record_count: 0,
                    min_timestamp_ms: None,
                    max_timestamp_ms: None,
                    opened_ms: 0,
                    sealed_ms: None,
                    object_key: None,
                    object_bytes: 0,
                    archived_ms: None,
                    witnesses_needed: None,
                    silent_since_ms: Default::default(),
                },
            );
        }
        // The partition's epoch is its newest writer's: at least every segment's.
        p.epoch = segments.iter().map(|s| s.3).max().unwrap_or(0);
        p
    }

    #[test]
    fn fence_refuses_older_epochs_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let part = partition(&[(0, None, SegmentState::Open, 3)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        r.admit("t", 0, 3).unwrap();
        r.append(0, 3, &[batch(0, 2, 3)]).unwrap();
        r.admit("t", 0, 5).unwrap();
        let e = r.admit("t", 0, 4).unwrap_err();
        assert!(matches!(e, StoreError::Fenced { fence: 5, epoch: 4, .. }), "{e}");
        drop(r);
        // Reopened with metadata that knows the writer of epoch 5 (one that does not is
        // refused: `a_stale_view_of_metadata_cuts_nothing`).
        let part = Partition { epoch: 5, ..part };
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        assert_eq!(r.fence(), 5, "the fence is durable");
        assert!(r.admit("t", 0, 4).is_err());
    }

    #[test]
    fn appends_continue_the_segment_skip_retries_and_refuse_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let part = partition(&[(10, None, SegmentState::Open, 2)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        assert_eq!(r.append(10, 2, &[batch(10, 3, 2)]).unwrap(), 13);
        // The same batch again (a retry after a lost reply) changes nothing.
        assert_eq!(r.append(10, 2, &[batch(10, 3, 2), batch(13, 1, 2)]).unwrap(), 14);
        let e = r.append(10, 2, &[batch(20, 1, 2)]).unwrap_err();
        assert!(matches!(e, StoreError::Diverged(_)), "{e}");
        // A later segment of the partition leaves a gap this replica does not hold.
        assert_eq!(r.append(30, 4, &[batch(30, 2, 4)]).unwrap(), 32);
        let reader = r.reader();
        assert!(reader.holds(12) && reader.holds(31));
        assert!(!reader.holds(20), "offsets of segments this replica does not hold are elsewhere");
        let read = reader.read(14, 1 << 20).unwrap();
        assert!(read.batches.is_empty(), "a read never skips over a gap: {:?}", read.next_offset);
    }

    #[test]
    fn a_tail_past_the_writers_new_segment_is_cut_when_the_replica_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let part = partition(&[(0, None, SegmentState::Open, 1)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        r.append(0, 1, &[batch(0, 3, 1), batch(3, 3, 1)]).unwrap();
        // A recovery that did not hear from this replica sealed segment 0 at offset 2, and the
        // new writer (epoch 2) opened segment 3 with this replica in its ensemble.
        let e = r.append(3, 2, &[batch(3, 1, 2)]).unwrap_err();
        assert!(matches!(e, StoreError::Failed(_)), "the replica is to be opened again: {e}");
        drop(r);
        let part = partition(&[(0, Some(2), SegmentState::Sealed, 1), (3, None, SegmentState::Open, 2)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        assert_eq!(r.append(3, 2, &[batch(3, 1, 2)]).unwrap(), 4);
        let mut held = Vec::new();
        for from in [0, 3] {
            let read = r.reader().read(from, 1 << 20).unwrap();
            held.extend(
                read.batches.iter().map(|b| (b.base_offset(), b.last_offset(), b.partition_leader_epoch())),
            );
        }
        assert_eq!(held, [(0, 2, 1), (3, 3, 2)], "the unacknowledged tail is gone, the new segment follows");
    }

    #[test]
    fn a_stale_view_of_metadata_cuts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = partition(&[(0, Some(1), SegmentState::Sealed, 4), (2, None, SegmentState::Open, 5)]);
        {
            let mut r = Replica::open(dir.path(), 1, &fresh).unwrap();
            r.admit("t", 0, 5).unwrap();
            r.append(2, 5, &[batch(2, 3, 5)]).unwrap();
        }
        // A copy of metadata from before epoch 5 knows neither the writer nor its segment.
        let stale = partition(&[(0, None, SegmentState::Open, 4)]);
        let e = Replica::open(dir.path(), 1, &stale).unwrap_err();
        assert!(e.to_string().contains("epoch 4") && e.to_string().contains("epoch 5"), "{e}");
        // Nothing was cut: a fresh view finds the acknowledged batches where they were.
        let r = Replica::open(dir.path(), 1, &fresh).unwrap();
        let read = r.reader().read(2, 1 << 20).unwrap();
        assert_eq!(
            read.batches.iter().map(|b| (b.base_offset(), b.last_offset())).collect::<Vec<_>>(),
            [(2, 4)]
        );
    }

    /// A replica whose fsync fails holds, opened again, only what an fsync covered: a retry
    /// of the failed batch is written and fsynced again, never skipped as already held (the
    /// page cache may show it, the disk may not hold it).
    #[test]
    fn after_a_failed_fsync_a_replica_holds_only_what_an_fsync_covered() {
        let dir = tempfile::tempdir().unwrap();
        let part = partition(&[(0, None, SegmentState::Open, 1)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        assert_eq!(r.append(0, 1, &[batch(0, 3, 1)]).unwrap(), 3);
        let segment_file = dir.path().join(crate::log::segment::log_file_name(0));
        let fault = crate::log::disk::inject_fsync_errors(&segment_file.to_string_lossy(), 0, 1);
        let e = r.append(0, 1, &[batch(3, 2, 1)]).unwrap_err();
        assert!(matches!(e, StoreError::FsyncFailed { .. }), "{e}");
        assert_eq!(fault.failed(), 1);
        // The agent opens a failed replica again from disk.
        drop(r);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        let ends: Vec<u64> = r.log_mut().segments().iter().map(|s| s.next_offset()).collect();
        assert_eq!(ends, [3], "the batch whose fsync failed is not held");
        let synced = fault.synced();
        assert_eq!(r.append(0, 1, &[batch(3, 2, 1)]).unwrap(), 5, "the writer's retry");
        assert_eq!(fault.synced(), synced + 1, "the retried batch was fsynced before it was acknowledged");
        drop(r);
        let r = Replica::open(dir.path(), 1, &part).unwrap();
        let read = r.reader().read(0, 1 << 20).unwrap();
        assert_eq!(
            read.batches.iter().map(|b| (b.base_offset(), b.last_offset())).collect::<Vec<_>>(),
            [(0, 2), (3, 4)]
        );
    }

    /// When not even the cut back to the last fsync can be made durable, the directory is
    /// distrusted: the replica is not opened there again, with an error that says why.
    #[test]
    fn a_replica_whose_failed_fsync_cannot_be_cut_off_is_not_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let part = partition(&[(0, None, SegmentState::Open, 1)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        r.append(0, 1, &[batch(0, 3, 1)]).unwrap();
        let segment_file = dir.path().join(crate::log::segment::log_file_name(0));
        // The append's fsync and the cut's.
        let fault = crate::log::disk::inject_fsync_errors(&segment_file.to_string_lossy(), 0, 2);
        let e = r.append(0, 1, &[batch(3, 2, 1)]).unwrap_err();
        assert!(matches!(e, StoreError::FsyncFailed { .. }), "{e}");
        assert_eq!(fault.failed(), 2);
        // Still open, it takes no more writes: a later fsync may report success for pages
        // the failed one lost.
        let e = r.append(0, 1, &[batch(3, 2, 1)]).unwrap_err();
        assert!(matches!(e, StoreError::DiskDistrusted { .. }), "{e}");
        assert_eq!(fault.synced(), 0, "nothing was fsynced after the failures");
        drop(r);
        let e = Replica::open(dir.path(), 1, &part).unwrap_err();
        assert!(matches!(e, StoreError::DiskDistrusted { .. }), "{e}");
        let api = crate::error::ApiError::from(e);
        assert_eq!(api.code, crate::error::ErrorCode::DiskFailed, "{api}");
    }

    #[test]
    fn trim_cuts_unacknowledged_tails_and_other_epochs_segments() {
        let dir = tempfile::tempdir().unwrap();
        {
            let part = partition(&[(0, None, SegmentState::Open, 1)]);
            let mut r = Replica::open(dir.path(), 1, &part).unwrap();
            r.append(0, 1, &[batch(0, 2, 1), batch(2, 2, 1)]).unwrap();
            r.append(4, 2, &[batch(4, 3, 2)]).unwrap();
        }
        // Recovery sealed segment 0 at offset 2 (offsets 2 and 3 were never acknowledged),
        // and a writer of epoch 3 replaced segment 4 with its own.
        let part = partition(&[(0, Some(1), SegmentState::Sealed, 1), (2, None, SegmentState::Open, 3)]);
        let mut r = Replica::open(dir.path(), 1, &part).unwrap();
        let segments: Vec<(u64, u64)> =
            r.log_mut().segments().iter().map(|s| (s.base_offset(), s.next_offset())).collect();
        assert_eq!(segments, [(0, 2), (4, 4)], "tail cut, other epoch's segment emptied");
        assert_eq!(r.append(2, 3, &[batch(2, 1, 3)]).unwrap(), 3, "the new writer's segment takes its place");
        let e = r.append(0, 1, &[batch(2, 1, 1)]).unwrap_err();
        assert!(matches!(e, StoreError::Diverged(_)), "a sealed segment takes no more: {e}");
    }
}
