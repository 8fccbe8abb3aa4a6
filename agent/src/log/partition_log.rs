//! A partition's local log: its chain of segments on disk.
//!
//! The log is split in two halves so that readers never wait for the writer's fsync:
//! [`PartitionLog`] is owned by the partition's writer task and does all writes;
//! [`PartitionReader`] is shared with every reader and only ever sees bytes that are durable.
//! The writer publishes a new high watermark after each fsync.
//!
//! Past 800 lines only with its tests: the code is the first 559 lines.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use silt_record::RecordBatch;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::StoreError;
use crate::log::segment::{sync_dir, IndexEntry, ReadMode, ScanReport, Segment, SegmentView};

/// The writer's half of a partition log. Not `Clone`: there is one writer per partition.
#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    /// Sealed segments followed by the active one; never empty after `open`.
    segments: Vec<Segment>,
    reader: Arc<PartitionReader>,
}

/// The readers' half: segment views bounded by the durable end, and the high watermark.
#[derive(Debug)]
pub struct PartitionReader {
    state: RwLock<ReadState>,
    high_watermark: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct ReadState {
    segments: Vec<SegmentView>,
    log_start: u64,
    /// The end of `segments`, published with them so a read never reports a high watermark
    /// below the batches it returns.
    high_watermark: u64,
}

/// Batches read from a partition, and where the next read starts.
#[derive(Debug, Default)]
pub struct ReadResult {
    /// Whole batches; the first may start before the requested offset.
    pub batches: Vec<RecordBatch>,
    /// Offset after the last batch returned (or the requested one if none).
    pub next_offset: u64,
    /// The durable end of the log when the read happened.
    pub high_watermark: u64,
}

/// The offsets each segment file in the partition directory `dir` holds, as `(base, end)`
/// with `end` exclusive (equal to `base` for a file that holds no batch), in offset order.
/// Read without changing anything (see [`Segment::end_offset_held`]).
pub fn segment_ranges_held(dir: &Path) -> Result<Vec<(u64, u64)>, StoreError> {
    let mut bases: Vec<u64> = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| StoreError::io(dir, "list", e))? {
        let entry = entry.map_err(|e| StoreError::io(dir, "list", e))?;
        if let Some(base) =
            entry.file_name().to_string_lossy().strip_suffix(".log").and_then(|s| s.parse().ok())
        {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    bases
        .into_iter()
        .map(|base| {
            Segment::end_offset_held(&dir.join(crate::log::segment::log_file_name(base)), base)
                .map(|end| (base, end))
        })
        .collect()
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`. Every segment but the last is taken as sealed;
    /// the last is scanned batch by batch and its torn tail, if any, truncated.
    pub fn open(dir: &Path) -> Result<(PartitionLog, Vec<ScanReport>), StoreError> {
        if crate::log::disk::is_distrusted(dir) {
            return Err(StoreError::DiskDistrusted { dir: dir.to_path_buf() });
        }
        fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, "create directory", e))?;
        // A repair copy a crash cut short: the segment it was to replace is still in place.
        remove_copy_staging(dir)?;
        let mut bases: Vec<u64> = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| StoreError::io(dir, "list", e))? {
            let entry = entry.map_err(|e| StoreError::io(dir, "list", e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(stem) = name.strip_suffix(".log") {
                match stem.parse::<u64>() {
                    Ok(base) => bases.push(base),
                    Err(_) => warn!(file = %name, "ignoring a file that is not a segment"),
                }
            }
        }
        bases.sort_unstable();
        let mut segments = Vec::with_capacity(bases.len().max(1));
        let mut reports = Vec::new();
        for (i, base) in bases.iter().enumerate() {
            let sealed = i + 1 < bases.len();
            let path = dir.join(crate::log::segment::log_file_name(*base));
            let (segment, report) = Segment::open(&path, *base, sealed)?;
            if report.truncated_bytes > 0 || !report.corrupt_ranges.is_empty() {
                info!(path = %path.display(), ?report, "recovered segment");
            }
            reports.push(report);
            segments.push(segment);
        }
        if segments.is_empty() {
            segments.push(Segment::create(dir, 0)?);
        }
        let log_start = segments[0].base_offset();
        let end = segments.last().map_or(0, |s| s.next_offset());
        let reader = Arc::new(PartitionReader {
            state: RwLock::new(ReadState { segments: Vec::new(), log_start, high_watermark: end }),
            high_watermark: watch::Sender::new(end),
        });
        let log = PartitionLog { dir: dir.to_path_buf(), segments, reader };
        log.publish();
        Ok((log, reports))
    }

    /// Refuses every write once an fsync failure left this log's directory distrusted (see
    /// [`crate::log::disk`]): a later fsync may report success for pages an earlier one lost.
    fn check_trusted(&self) -> Result<(), StoreError> {
        if crate::log::disk::is_distrusted(&self.dir) {
            return Err(StoreError::DiskDistrusted { dir: self.dir.clone() });
        }
        Ok(())
    }

    /// Whether an fsync failure left this log's directory distrusted.
    pub fn is_distrusted(&self) -> bool {
        crate::log::disk::is_distrusted(&self.dir)
    }

    /// The shared read half.
    pub fn reader(&self) -> Arc<PartitionReader> {
        Arc::clone(&self.reader)
    }

    /// The segment receiving appends.
    pub fn active(&self) -> &Segment {
        // `open` guarantees at least one segment and nothing removes the last one.
        &self.segments[self.segments.len() - 1]
    }

    fn active_mut(&mut self) -> &mut Segment {
        let last = self.segments.len() - 1;
        &mut self.segments[last]
    }

    /// Offset the next appended record gets.
    pub fn next_offset(&self) -> u64 {
        self.active().next_offset()
    }

    /// Writes batches to the active segment, assigning consecutive offsets and stamping the
    /// epoch, then fsyncs once for all of them. Returns each batch's offset range. Nothing is
    /// visible to readers until [`PartitionLog::publish`].
    pub fn append_and_sync(
        &mut self,
        batches: Vec<RecordBatch>,
        epoch: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        self.check_trusted()?;
        let mut ranges = Vec::with_capacity(batches.len());
        for batch in batches {
            let base = self.next_offset();
            let batch = batch.with_offsets(base, epoch_i32(epoch));
            ranges.push((base, batch.last_offset()));
            self.active_mut().append(&batch)?;
        }
        self.active_mut().sync_appends()?;
        Ok(ranges)
    }

    /// Writes batches whose offsets and epoch another agent's writer assigned (a replica's
    /// appends, or a recovery copying a segment's tail), then fsyncs once. Batches this log
    /// already holds (a retry after a lost reply) are skipped; a batch that would leave a gap
    /// or overlap part of one is refused. Returns the log's end. Not visible to readers until
    /// [`PartitionLog::publish`].
    pub fn append_replicated(&mut self, batches: &[RecordBatch]) -> Result<u64, StoreError> {
        self.check_trusted()?;
        let mut wrote = false;
        for batch in batches {
            let next = self.next_offset();
            if batch.last_offset() < next && batch.base_offset() >= self.active().base_offset() {
                continue;
            }
            if batch.base_offset() != next {
                return Err(StoreError::Diverged(format!(
                    "a batch at offsets {}..={} does not continue this replica, which ends at {next}",
                    batch.base_offset(),
                    batch.last_offset()
                )));
            }
            self.active_mut().append(batch)?;
            wrote = true;
        }
        if wrote {
            self.active_mut().sync_appends()?;
        }
        Ok(self.next_offset())
    }

    /// Makes `base` the active segment's base: a no-op if the active segment starts there;
    /// otherwise the active segment is sealed on disk (or removed, if empty) and a new one is
    /// created at `base`. Offsets between the old end and `base` are not held here (this agent
    /// holds no replica of the segments in between): reads of them find nothing here.
    pub fn start_segment_at(&mut self, base: u64) -> Result<(), StoreError> {
        self.check_trusted()?;
        if self.active().base_offset() == base {
            return Ok(());
        }
        let empty = self.active().record_count() == 0;
        let held_end = if empty {
            self.segments.iter().rev().nth(1).map_or(0, |s| s.next_offset())
        } else {
            self.next_offset()
        };
        if base < held_end {
            return Err(StoreError::Diverged(format!(
                "cannot start a segment at offset {base}: this replica holds offsets up to {held_end}"
            )));
        }
        if empty {
            let old = self.segments.pop().expect("a log has an active segment");
            old.delete_files()?;
        } else {
            self.active_mut().seal()?;
        }
        self.segments.push(Segment::create(&self.dir, base)?);
        self.publish();
        Ok(())
    }

    /// Adds a whole sealed segment (its batches, offsets contiguous) that this log holds no
    /// part of, or only a beginning of: ensemble repair copies it from another replica. It
    /// goes where its offsets belong, between the segments around it; placed after the last
    /// one, the active segment is sealed (or dropped, if empty) and a new empty one starts
    /// after the copy. A segment held here from the same offset whose batches are the copy's
    /// first batches, byte for byte (what a follower that left the ensemble midway kept), is
    /// replaced by the copy.
    pub fn insert_sealed(&mut self, batches: &[RecordBatch]) -> Result<(), StoreError> {
        self.check_trusted()?;
        // A copy that is not whole is the source's fault, not a disagreement with this log.
        let (Some(first), Some(last)) = (batches.first(), batches.last()) else {
            return Err(StoreError::Failed("an empty segment cannot be copied".into()));
        };
        if let Some(w) = batches.windows(2).find(|w| w[1].base_offset() != w[0].next_offset()) {
            return Err(StoreError::Failed(format!(
                "a copied batch at offset {} does not follow offset {}",
                w[1].base_offset(),
                w[0].last_offset()
            )));
        }
        let (base, end) = (first.base_offset(), last.next_offset());
        let placed = self.place_sealed(batches, base, end);
        // Whatever happened, readers see the segments as they are now.
        self.publish();
        placed
    }

    /// Takes segment `i` out of the list, which is never left empty: if it is the only one, an
    /// empty active segment at `end` (where a copy being placed ends) takes its place first.
    fn remove_segment(&mut self, i: usize, end: u64) -> Result<Segment, StoreError> {
        if self.segments.len() == 1 {
            self.segments.push(Segment::create(&self.dir, end)?);
        }
        Ok(self.segments.remove(i))
    }

    /// [`PartitionLog::insert_sealed`] of contiguous `batches`, offsets `base..end`.
    fn place_sealed(&mut self, batches: &[RecordBatch], base: u64, end: u64) -> Result<(), StoreError> {
        // An empty active segment in the way holds nothing: drop it (a follower starts it again).
        if self.active().record_count() == 0 && self.active().base_offset() < end {
            let old = self.remove_segment(self.segments.len() - 1, end)?;
            old.delete_files()?;
        }
        if let Some(i) = self.segments.iter().position(|s| s.base_offset() == base && s.next_offset() <= end)
        {
            if self.segments.get(i + 1).is_none_or(|next| next.base_offset() >= end)
                && self.segments[i].record_count() > 0
                && is_prefix(&self.segments[i], batches)?
            {
                return self.replace_prefix(i, batches, base, end);
            }
        }
        let at = self.segments.partition_point(|s| s.base_offset() < base);
        let overlaps_before = at > 0 && self.segments[at - 1].next_offset() > base;
        let overlaps_after = self.segments.get(at).is_some_and(|next| next.base_offset() < end);
        if overlaps_before || overlaps_after {
            return Err(StoreError::Diverged(format!(
                "a copy of offsets {base}..{end} overlaps segments this replica holds"
            )));
        }
        let after_all = at == self.segments.len();
        if after_all {
            if let Some(last) = self.segments.last_mut().filter(|s| s.record_count() > 0) {
                last.seal()?;
            }
        }
        let mut segment = Segment::create(&self.dir, base)?;
        if let Err(e) = batches.iter().try_for_each(|b| segment.append(b)).and_then(|()| segment.seal()) {
            // A copy cut short goes (it would be in the next copy's way); metadata never
            // recorded it.
            let _ = segment.delete_files();
            return Err(e);
        }
        let at = self.segments.partition_point(|s| s.base_offset() < base);
        self.segments.insert(at, segment);
        if after_all {
            self.segments.push(Segment::create(&self.dir, end)?);
        }
        Ok(())
    }

    /// [`PartitionLog::place_sealed`] over segment `i`, which holds the first of `batches`: the
    /// copy is written whole beside it (in [`COPY_STAGING_DIR`]) and then renamed over it, so
    /// that what it held stays until the copy is whole: a failed copy, or a crash at any
    /// point, leaves it or the copy, never neither. (What a member holds of a segment is what
    /// a recovery, or a declaration that a range is lost, takes its word for.)
    fn replace_prefix(
        &mut self,
        i: usize,
        batches: &[RecordBatch],
        base: u64,
        end: u64,
    ) -> Result<(), StoreError> {
        let staging = self.dir.join(COPY_STAGING_DIR);
        remove_copy_staging(&self.dir)?;
        fs::create_dir(&staging).map_err(|e| StoreError::io(&staging, "create", e))?;
        let mut copy = Segment::create(&staging, base)?;
        if let Err(e) = batches.iter().try_for_each(|b| copy.append(b)).and_then(|()| copy.seal()) {
            drop(copy);
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
        drop(copy);
        // The log first: once it is renamed the copy is in place; index files that a crash
        // leaves behind it disagree with it and are rebuilt by a scan at the next open.
        let name = crate::log::segment::log_file_name(base);
        let log = self.dir.join(&name);
        for ext in ["log", "index", "timeindex"] {
            let (from, to) = (staging.join(&name).with_extension(ext), log.with_extension(ext));
            fs::rename(&from, &to).map_err(|e| StoreError::io(&to, "rename", e))?;
        }
        sync_dir(&self.dir)?;
        let _ = fs::remove_dir_all(&staging);
        let (placed, _) = Segment::open(&log, base, true)?;
        let was_active = i + 1 == self.segments.len();
        self.segments[i] = placed;
        if was_active {
            self.segments.push(Segment::create(&self.dir, end)?);
        }
        Ok(())
    }

    /// Cuts the segment starting at `base` back to `end` (a batch boundary): the records from
    /// there on were never acknowledged. A sealed segment cut to nothing is removed.
    pub fn truncate_segment(&mut self, base: u64, end: u64) -> Result<(), StoreError> {
        let Some(i) = self.segments.iter().position(|s| s.base_offset() == base) else {
            return Ok(());
        };
        if self.segments[i].next_offset() <= end {
            return Ok(());
        }
        let last = i + 1 == self.segments.len();
        // Readers holding views of the old file see only what they saw; publish after.
        let segment = self.segments.remove(i).truncated(end, !last)?;
        if !last && segment.record_count() == 0 {
            segment.delete_files()?;
            sync_dir(&self.dir)?;
        } else {
            self.segments.insert(i, segment);
        }
        self.publish();
        Ok(())
    }

    /// Makes everything synced so far visible to readers and wakes waiting consumers.
    pub fn publish(&self) {
        let views: Vec<SegmentView> =
            self.segments.iter().map(|s| s.view(s.size_bytes(), s.next_offset())).collect();
        let hwm = self.next_offset();
        {
            let mut state = crate::sync::write_lock(&self.reader.state);
            state.log_start = views.first().map_or(0, |v| v.base_offset);
            state.segments = views;
            state.high_watermark = hwm;
        }
        self.reader.high_watermark.send_replace(hwm);
    }

    /// Seals the active segment on disk (fsync, index files) and starts a new one at the
    /// current end. The caller records both in metadata.
    pub fn roll(&mut self) -> Result<(), StoreError> {
        self.active_mut().seal()?;
        let base = self.next_offset();
        let segment = Segment::create(&self.dir, base)?;
        self.segments.push(segment);
        self.publish();
        Ok(())
    }

    /// Writes the active segment's index files (after an fsync of its log) without starting a
    /// new segment; appends may continue, and a later seal rewrites them.
    pub fn seal_active_on_disk(&mut self) -> Result<(), StoreError> {
        self.active_mut().seal()
    }

    /// Moves an empty log's start to `base`: the earlier offsets live elsewhere (archived, or
    /// on other replicas). Refused when the log holds any record.
    pub fn restart_empty_at(&mut self, base: u64) -> Result<(), StoreError> {
        if self.segments.len() != 1 || self.active().record_count() > 0 {
            return Err(StoreError::Failed(format!(
                "cannot move the start of a log that holds records to offset {base}"
            )));
        }
        let old = self.segments.remove(0);
        old.delete_files()?;
        self.segments.push(Segment::create(&self.dir, base)?);
        self.publish();
        Ok(())
    }

    /// Deletes every segment and starts an empty log at `base`. Only for a log whose records
    /// all live elsewhere (archived): the caller checks that.
    pub fn reset_at(&mut self, base: u64) -> Result<(), StoreError> {
        // Oldest first, and the new segment only once they are all gone: a crash in between
        // leaves a contiguous suffix of the old log, never a gap.
        while !self.segments.is_empty() {
            let old = self.segments.remove(0);
            old.delete_files()?;
        }
        sync_dir(&self.dir)?;
        self.segments.push(Segment::create(&self.dir, base)?);
        sync_dir(&self.dir)?;
        self.publish();
        Ok(())
    }

    /// Sealed segments and the active one, oldest first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Deletes the oldest segments whose last offset is below `offset`; never the active one.
    pub fn delete_before(&mut self, offset: u64) -> Result<usize, StoreError> {
        let mut removed = 0;
        while self.segments.len() > 1 && self.segments[0].next_offset() <= offset {
            let segment = self.segments.remove(0);
            self.publish();
            segment.delete_files()?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }
}

/// Where a copy of a sealed segment is written before it takes the place of the beginning of it
/// a replica held (`PartitionLog::replace_prefix`); a copy a crash left there is removed by the
/// next one.
const COPY_STAGING_DIR: &str = "copy-staging";

/// Removes what a repair copy left in `dir`'s [`COPY_STAGING_DIR`], if anything.
fn remove_copy_staging(dir: &Path) -> Result<(), StoreError> {
    let staging = dir.join(COPY_STAGING_DIR);
    match fs::remove_dir_all(&staging) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(&staging, "remove", e)),
    }
}

/// How much `offset_for_time` reads per step while it scans for a timestamp.
const OFFSET_FOR_TIME_READ_BYTES: usize = 1024 * 1024;

/// Whether `held` holds exactly the first batches of `batches`, byte for byte.
fn is_prefix(held: &Segment, batches: &[RecordBatch]) -> Result<bool, StoreError> {
    let view = held.view(held.size_bytes(), held.next_offset());
    let ours = view.read_batches(IndexEntry { offset: held.base_offset(), position: 0 }, usize::MAX)?;
    if ours.last().map(RecordBatch::next_offset) != Some(held.next_offset()) || ours.len() > batches.len() {
        return Ok(false);
    }
    Ok(ours.iter().zip(batches).all(|(a, b)| a.as_bytes() == b.as_bytes()))
}

/// The epoch as batches carry it: Kafka's partitionLeaderEpoch is an i32; Silt's epochs stay
/// far below that.
pub(crate) fn epoch_i32(epoch: u64) -> i32 {
    i32::try_from(epoch).unwrap_or(i32::MAX)
}

impl PartitionReader {
    /// The durable end of the log: one past the last offset a reader may see.
    pub fn high_watermark(&self) -> u64 {
        *self.high_watermark.borrow()
    }

    /// The first offset still on local disk.
    pub fn log_start(&self) -> u64 {
        crate::sync::read_lock(&self.state).log_start
    }

    /// The offset ranges (first, last) of the segments that hold records.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let state = crate::sync::read_lock(&self.state);
        state
            .segments
            .iter()
            .filter(|v| v.end_offset > v.base_offset)
            .map(|v| (v.base_offset, v.end_offset - 1))
            .collect()
    }

    /// The local segment starting at `base`, if there is one: one past its last readable
    /// offset, and its readable bytes.
    pub fn segment_extent(&self, base: u64) -> Option<(u64, u64)> {
        let state = crate::sync::read_lock(&self.state);
        state.segments.iter().find(|v| v.base_offset == base).map(|v| (v.end_offset, v.size_bytes))
    }

    /// Whether a read at `offset` is answered from this log: it lies in a local segment, or
    /// at or past the log's end. Offsets below the log start or in a gap between segments are
    /// held elsewhere (other replicas, or the archive).
    pub fn holds(&self, offset: u64) -> bool {
        let state = crate::sync::read_lock(&self.state);
        offset >= state.high_watermark
            || state.segments.iter().any(|v| v.base_offset <= offset && offset < v.end_offset)
    }

    /// A receiver that changes whenever the high watermark moves.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.high_watermark.subscribe()
    }

    /// Reads whole batches starting with the one that holds `offset`, up to about
    /// `max_bytes`, never past the durable end. Offsets below the log start are an error the
    /// caller turns into "out of range".
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<ReadResult, StoreError> {
        self.read_with(offset, max_bytes, ReadMode::MayBlock)
    }

    /// Like [`PartitionReader::read`], from the page cache only: fewer batches if the rest
    /// would wait for the disk, [`StoreError::NotCached`] if the first would. For runtime
    /// threads, which must not wait for the disk.
    pub fn read_cached(&self, offset: u64, max_bytes: usize) -> Result<ReadResult, StoreError> {
        self.read_with(offset, max_bytes, ReadMode::CachedOnly)
    }

    fn read_with(&self, offset: u64, max_bytes: usize, mode: ReadMode) -> Result<ReadResult, StoreError> {
        let (views, hwm) = {
            let state = crate::sync::read_lock(&self.state);
            let hwm = state.high_watermark;
            if offset < state.log_start {
                return Err(StoreError::OutOfRange {
                    offset,
                    log_start: state.log_start,
                    high_watermark: hwm,
                });
            }
            let first = state.segments.partition_point(|v| v.base_offset <= offset).saturating_sub(1);
            (state.segments[first.min(state.segments.len())..].to_vec(), hwm)
        };
        for view in views.iter().filter(|v| v.end_offset > offset) {
            if view.base_offset > offset {
                // A gap: this log holds no replica of the segments in between.
                break;
            }
            // Batches before the one holding `offset` are stepped over, not returned.
            let batches = view.read_batches_from(view.entry_for(offset), offset, max_bytes, mode)?;
            if let Some(next_offset) = batches.last().map(RecordBatch::next_offset) {
                return Ok(ReadResult { batches, next_offset, high_watermark: hwm });
            }
        }
        Ok(ReadResult { batches: Vec::new(), next_offset: offset, high_watermark: hwm })
    }

    /// The first offset whose record timestamp is at least `timestamp_ms`, or the high
    /// watermark if there is none.
    pub fn offset_for_time(&self, timestamp_ms: i64) -> Result<u64, StoreError> {
        let (views, hwm) = {
            let state = crate::sync::read_lock(&self.state);
            (state.segments.clone(), state.high_watermark)
        };
        for view in views {
            let mut start = view.entry_for_time(timestamp_ms);
            loop {
                let batches = view.read_batches(start, OFFSET_FOR_TIME_READ_BYTES)?;
                if batches.is_empty() {
                    break;
                }
                for batch in &batches {
                    start = IndexEntry {
                        offset: batch.next_offset(),
                        position: start.position + batch.len_bytes() as u64,
                    };
                    if batch.max_timestamp() >= timestamp_ms {
                        if let Some(record) = batch.records().find(|r| r.timestamp_ms >= timestamp_ms) {
                            return Ok(record.offset);
                        }
                    }
                }
            }
        }
        Ok(hwm)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    use bytes::Bytes;
    use proptest::prelude::*;
    use silt_record::{encode_batch, Header, NewRecord, Record};

    use super::*;

    const EPOCH: u64 = 7;

    /// Records numbered from `tag`, with every kind of key, value and header.
    fn records(
        tag: u64,
        count: u64,
        value_bytes: usize,
        timestamp_ms: impl Fn(u64) -> i64,
    ) -> Vec<NewRecord> {
        (tag..tag + count)
            .map(|n| NewRecord {
                timestamp_ms: timestamp_ms(n),
                key: (n % 5 != 0).then(|| Bytes::from(format!("key-{n}"))),
                value: (n % 7 != 3).then(|| Bytes::from(vec![n as u8; value_bytes])),
                headers: (0..n % 3)
                    .map(|h| Header {
                        key: format!("h{h}"),
                        value: (h != 1).then(|| Bytes::from(format!("{n}/{h}"))),
                    })
                    .collect(),
            })
            .collect()
    }

    fn batch(records: &[NewRecord]) -> RecordBatch {
        RecordBatch::parse(encode_batch(records).unwrap()).unwrap()
    }

    /// Appends one group of batches and publishes it; returns the records by offset.
    fn append(log: &mut PartitionLog, groups: &[Vec<NewRecord>]) -> Vec<NewRecord> {
        let next = log.next_offset();
        let ranges = log.append_and_sync(groups.iter().map(|r| batch(r)).collect(), EPOCH).unwrap();
        let mut base = next;
        for (range, records) in ranges.iter().zip(groups) {
            assert_eq!(*range, (base, base + records.len() as u64 - 1));
            base = range.1 + 1;
        }
        log.publish();
        groups.concat()
    }

    /// Reads from `from` to the end, `max_bytes` at a time, checking that every read starts
    /// with the batch holding the requested offset and never skips one.
    fn read_all(reader: &PartitionReader, from: u64, max_bytes: usize) -> Vec<Record> {
        let mut out = Vec::new();
        let mut next = from;
        loop {
            let r = reader.read(next, max_bytes).unwrap();
            let Some(first) = r.batches.first() else {
                assert_eq!(r.next_offset, next);
                return out;
            };
            assert!(
                first.base_offset() <= next && next <= first.last_offset(),
                "read at {next} got {first:?}"
            );
            assert!(r.next_offset <= r.high_watermark);
            for b in &r.batches {
                assert_eq!(b.partition_leader_epoch(), EPOCH as i32);
                for record in b.records() {
                    if record.offset >= next {
                        assert_eq!(record.offset, next, "no offset is skipped");
                        next += 1;
                        out.push(record);
                    }
                }
            }
            assert_eq!(r.next_offset, next);
        }
    }

    fn assert_records(read: &[Record], expected: &[NewRecord], from: u64) {
        assert_eq!(read.len(), expected.len() - from as usize);
        for (r, e) in read.iter().zip(&expected[from as usize..]) {
            let got = (r.timestamp_ms, &r.key, &r.value, &r.headers);
            assert_eq!(got, (e.timestamp_ms, &e.key, &e.value, &e.headers), "offset {}", r.offset);
        }
    }

    /// 10 appends of 1 to 3 batches of small records, rolled every 3 appends: several sealed
    /// segments with several index entries each, and an active segment.
    fn filled_log(dir: &Path) -> (PartitionLog, Vec<NewRecord>) {
        let (mut log, _) = PartitionLog::open(dir).unwrap();
        let mut expected = Vec::new();
        for i in 0..10u64 {
            let groups: Vec<Vec<NewRecord>> = (0..1 + i % 3)
                .map(|g| {
                    let tag = expected.len() as u64 + g * 100;
                    records(tag, 1 + (i + g) % 5, 200 + 150 * (i as usize % 4), |n| 10_000 + 10 * n as i64)
                })
                .collect();
            let before = expected.len() as u64;
            expected.extend(append(&mut log, &groups));
            assert_eq!(log.reader().high_watermark(), expected.len() as u64);
            assert_eq!(log.next_offset(), before + groups.iter().map(|g| g.len() as u64).sum::<u64>());
            if i % 3 == 2 {
                log.roll().unwrap();
            }
        }
        (log, expected)
    }

    #[test]
    fn appends_read_back_across_rolled_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (log, expected) = filled_log(dir.path());
        assert_eq!(log.segments().len(), 4);
        for s in &log.segments()[..3] {
            let index_entries = s.view(s.size_bytes(), s.next_offset()).index.read().unwrap().len();
            assert!(index_entries >= 2, "segment {} has {index_entries} index entries", s.base_offset());
        }
        for pair in log.segments().windows(2) {
            assert_eq!(pair[1].base_offset(), pair[0].next_offset());
        }
        let reader = log.reader();
        for max_bytes in [1, 300, 1 << 20] {
            assert_records(&read_all(&reader, 0, max_bytes), &expected, 0);
        }
    }

    #[test]
    fn reads_from_the_middle_of_a_batch_return_it_whole_and_skip_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (log, expected) = filled_log(dir.path());
        let reader = log.reader();
        for from in 0..expected.len() as u64 {
            for max_bytes in [1, 1 << 20] {
                let r = reader.read(from, max_bytes).unwrap();
                let first = &r.batches[0];
                assert!(first.base_offset() <= from && from <= first.last_offset(), "read at {from}");
                assert_records(&read_all(&reader, from, max_bytes), &expected, from);
            }
        }
        let end = expected.len() as u64;
        let r = reader.read(end, 1 << 20).unwrap();
        assert!(r.batches.is_empty());
        assert_eq!((r.next_offset, r.high_watermark), (end, end));
    }

    /// A writer's log whose fsync fails holds, opened again (the writer restarts from disk),
    /// only what fsyncs covered: the failed group is not counted as held by a recovery, and the
    /// offsets it took are taken again by the next appends.
    #[test]
    fn after_a_failed_fsync_the_log_holds_only_what_an_fsync_covered() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let kept = append(&mut log, &[records(0, 5, 100, |n| n as i64)]);
        let segment_file = dir.path().join(crate::log::segment::log_file_name(0));
        let fault = crate::log::disk::inject_fsync_errors(&segment_file.to_string_lossy(), 0, 1);
        let e = log.append_and_sync(vec![batch(&records(5, 5, 100, |n| n as i64))], EPOCH).unwrap_err();
        assert!(matches!(e, StoreError::FsyncFailed { .. }), "{e}");
        assert_eq!(fault.failed(), 1);
        drop(log);
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(log.next_offset(), 5, "the group whose fsync failed is not held");
        let held = crate::log::replica::HeldSegment::of(&log, 0, EPOCH, "instance").unwrap();
        assert_eq!(held.end_offset, 5, "a recovery is told what fsyncs covered");
        let synced = fault.synced();
        let later = append(&mut log, &[records(50, 2, 100, |n| n as i64)]);
        assert_eq!(fault.synced(), synced + 1);
        assert_records(&read_all(&log.reader(), 0, 1 << 20), &[kept, later].concat(), 0);
    }

    #[test]
    fn after_a_failed_write_the_log_holds_only_what_an_fsync_covered() {
        use crate::log::disk::{inject_write_errors, FaultKind};
        for kind in [FaultKind::NoSpace, FaultKind::ShortWrite] {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
            let kept = append(&mut log, &[records(0, 5, 100, |n| n as i64)]);
            let segment_file = dir.path().join(crate::log::segment::log_file_name(0));
            // The third batch of the next group fails; the two before it are written, not synced.
            let fault = inject_write_errors(kind, &segment_file.to_string_lossy(), 2, 1);
            let group: Vec<RecordBatch> =
                (0..3).map(|i| batch(&records(5 + 5 * i, 5, 100, |n| n as i64))).collect();
            let e = log.append_and_sync(group, EPOCH).unwrap_err();
            assert!(matches!(e, StoreError::Io { .. }), "{kind:?}: {e}");
            assert_eq!(fault.failed(), 1, "{kind:?}");
            assert_eq!(log.next_offset(), 5, "{kind:?}: the failed group is not held");
            drop(log);
            let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
            assert_eq!(log.next_offset(), 5, "{kind:?}: the failed group is not held after reopening");
            let later = append(&mut log, &[records(50, 2, 100, |n| n as i64)]);
            assert_records(&read_all(&log.reader(), 0, 1 << 20), &[kept, later].concat(), 0);
        }
    }

    #[test]
    fn read_never_returns_appended_data_that_is_not_published() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let reader = log.reader();
        let published = append(&mut log, &[records(0, 5, 10, |n| n as i64)]);
        // Synced but not published, in the active segment and then in a new one.
        log.append_and_sync(vec![batch(&records(5, 5, 10, |n| 1_000 + n as i64))], EPOCH).unwrap();
        let check = |reader: &PartitionReader| {
            assert_eq!(reader.high_watermark(), 5);
            assert_records(&read_all(reader, 0, 1 << 20), &published, 0);
            let r = reader.read(5, 1 << 20).unwrap();
            assert!(r.batches.is_empty());
            assert_eq!((r.next_offset, r.high_watermark), (5, 5));
            assert_eq!(reader.offset_for_time(1_000).unwrap(), 5, "nothing published is that recent");
        };
        check(&reader);
        log.publish();
        assert_eq!(reader.high_watermark(), 10);
        log.roll().unwrap();
        log.append_and_sync(vec![batch(&records(10, 5, 10, |n| 2_000 + n as i64))], EPOCH).unwrap();
        assert_eq!(reader.high_watermark(), 10);
        assert_eq!(read_all(&reader, 0, 1 << 20).len(), 10);
        assert_eq!(reader.offset_for_time(2_000).unwrap(), 10);
        log.publish();
        assert_eq!(read_all(&reader, 0, 1 << 20).len(), 15);
    }

    type Observed = (Vec<Record>, Vec<u64>, Vec<(u64, u64, u64)>);

    /// Reads, time lookups and segment bounds: what a reopened log must reproduce.
    fn observed(log: &PartitionLog) -> Observed {
        let reader = log.reader();
        let times = (9_990..11_000).step_by(5).map(|t| reader.offset_for_time(t).unwrap()).collect();
        let bounds =
            log.segments().iter().map(|s| (s.base_offset(), s.next_offset(), s.size_bytes())).collect();
        (read_all(&reader, 0, 700), times, bounds)
    }

    /// A writer's sealed segment of 8 batches (offsets 0..), its batches, and its records.
    fn written_segment(dir: &Path, tag: u64) -> (Vec<RecordBatch>, Vec<NewRecord>) {
        let (mut log, _) = PartitionLog::open(dir).unwrap();
        let mut expected = Vec::new();
        for i in 0..8 {
            expected.extend(append(&mut log, &[records(tag + 10 * i, 3, 100, |n| n as i64)]));
        }
        log.roll().unwrap();
        let batches = log.reader().read(0, usize::MAX).unwrap().batches;
        assert_eq!(batches.len(), 8);
        (batches, expected)
    }

    #[test]
    fn a_copy_replaces_the_beginning_of_its_segment_a_follower_kept_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (batches, expected) = written_segment(&dir.path().join("writer"), 0);
        let end = batches.last().unwrap().next_offset();
        let ranges = |log: &PartitionLog| -> Vec<(u64, u64)> {
            log.segments().iter().map(|s| (s.base_offset(), s.next_offset())).collect()
        };

        // The follower left the ensemble after 3 batches: they are its active segment.
        let kept = dir.path().join("kept");
        let (mut log, _) = PartitionLog::open(&kept).unwrap();
        log.append_replicated(&batches[..3]).unwrap();
        log.publish();
        log.insert_sealed(&batches).unwrap();
        assert_eq!(ranges(&log), [(0, end), (end, end)]);
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);
        drop(log);
        let (log, _) = PartitionLog::open(&kept).unwrap();
        assert_eq!(ranges(&log), [(0, end), (end, end)], "as reopened from disk");
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);

        // ... and later followed a newer segment of the partition.
        let later = dir.path().join("later");
        let (mut log, _) = PartitionLog::open(&later).unwrap();
        log.append_replicated(&batches[..5]).unwrap();
        log.start_segment_at(end + 30).unwrap();
        log.insert_sealed(&batches).unwrap();
        assert_eq!(ranges(&log), [(0, end), (end + 30, end + 30)]);
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);

        // A segment at the same offset with other records is not a beginning of the copy.
        let (other, _) = written_segment(&dir.path().join("other writer"), 1000);
        let diverged = dir.path().join("diverged");
        let (mut log, _) = PartitionLog::open(&diverged).unwrap();
        log.append_replicated(&other[..3]).unwrap();
        log.publish();
        let before = read_all(&log.reader(), 0, 700);
        assert!(matches!(log.insert_sealed(&batches), Err(StoreError::Diverged(_))));
        assert_eq!(ranges(&log).len(), 1);
        assert_eq!(read_all(&log.reader(), 0, 700), before, "a refused copy changes nothing");
        // Nor is a segment longer than the copy.
        let longer = dir.path().join("longer");
        let (mut log, _) = PartitionLog::open(&longer).unwrap();
        log.append_replicated(&batches).unwrap();
        log.publish();
        assert!(matches!(log.insert_sealed(&batches[..4]), Err(StoreError::Diverged(_))));
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);
    }

    /// A copy that fails midway (a full disk) leaves the beginning a follower kept as it was,
    /// after reopening too: a replica never answers that it holds less than it fsynced.
    #[test]
    fn a_copy_that_fails_midway_leaves_the_beginning_a_follower_kept() {
        use crate::log::disk::{inject_write_errors, FaultKind};
        let dir = tempfile::tempdir().unwrap();
        let (batches, expected) = written_segment(&dir.path().join("writer"), 0);
        let end = batches.last().unwrap().next_offset();
        let kept = dir.path().join("kept");
        let (mut log, _) = PartitionLog::open(&kept).unwrap();
        log.append_replicated(&batches[..3]).unwrap();
        log.publish();
        let held = expected[..9].to_vec();
        let fault =
            inject_write_errors(FaultKind::NoSpace, &kept.join(COPY_STAGING_DIR).to_string_lossy(), 2, 1);
        assert!(log.insert_sealed(&batches).is_err());
        assert_eq!(fault.failed(), 1);
        assert_records(&read_all(&log.reader(), 0, 700), &held, 0);
        drop(log);
        // As a crash midway would leave it: a copy cut short beside the beginning.
        let staging = kept.join(COPY_STAGING_DIR);
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(staging.join(crate::log::segment::log_file_name(0)), b"cut short").unwrap();
        let (mut log, _) = PartitionLog::open(&kept).unwrap();
        assert_records(&read_all(&log.reader(), 0, 700), &held, 0);
        assert!(!staging.exists(), "what the cut-short copy left is removed at the next open");
        // The next copy takes its place, over what the failed one left.
        log.insert_sealed(&batches).unwrap();
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);
        let bounds: Vec<(u64, u64)> =
            log.segments().iter().map(|s| (s.base_offset(), s.next_offset())).collect();
        assert_eq!(bounds, [(0, end), (end, end)]);
        assert!(!kept.join(COPY_STAGING_DIR).exists());
        drop(log);
        let (log, _) = PartitionLog::open(&kept).unwrap();
        assert_records(&read_all(&log.reader(), 0, 700), &expected, 0);
    }

    #[test]
    fn reopen_loads_sealed_segments_from_index_files_and_rebuilds_damaged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (log, expected) = filled_log(dir.path());
        let before = observed(&log);
        assert_records(&before.0, &expected, 0);
        let paths: Vec<PathBuf> = log.segments().iter().map(|s| s.path().to_path_buf()).collect();
        drop(log);

        let (log, reports) = PartitionLog::open(dir.path()).unwrap();
        let from_index: Vec<bool> = reports.iter().map(|r| r.from_index_files).collect();
        assert_eq!(
            from_index,
            vec![true, true, true, false],
            "sealed segments load, the active one is scanned"
        );
        assert_eq!(observed(&log), before);
        drop(log);

        fs::remove_file(paths[0].with_extension("index")).unwrap();
        let timeindex = paths[1].with_extension("timeindex");
        let mut damaged = fs::read(&timeindex).unwrap();
        damaged[3] ^= 1;
        fs::write(&timeindex, damaged).unwrap();
        let (log, reports) = PartitionLog::open(dir.path()).unwrap();
        let from_index: Vec<bool> = reports.iter().map(|r| r.from_index_files).collect();
        assert_eq!(from_index, vec![false, false, true, false]);
        assert!(reports.iter().all(|r| r.truncated_bytes == 0 && r.corrupt_ranges.is_empty()));
        assert_eq!(observed(&log), before);
    }

    #[test]
    fn torn_tail_is_truncated_and_appends_continue_after_it() {
        type Tail = fn(&[u8]) -> Vec<u8>;
        let tails: [(&str, Tail); 5] = [
            ("half a batch", |b| b[..b.len() / 2].to_vec()),
            ("all but the last byte of a batch", |b| b[..b.len() - 1].to_vec()),
            ("a few header bytes", |b| b[..7].to_vec()),
            ("part of a batch, then zeros", |b| [&b[..b.len() / 2], &[0; 5000][..]].concat()),
            ("zeros", |_| vec![0; 5000]),
        ];
        for (what, tail) in tails {
            let dir = tempfile::tempdir().unwrap();
            let (log, mut expected) = filled_log(dir.path());
            let synced_len = log.active().size_bytes();
            let path = log.active().path().to_path_buf();
            drop(log);
            // A crash while writing the next batch leaves part of it behind.
            let next = batch(&records(999, 4, 100, |n| n as i64)).with_offsets(expected.len() as u64, 1);
            let garbage = tail(next.as_bytes());
            OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&garbage, synced_len).unwrap();
            // After the data: the tail, and whatever is left of the zeros written ahead of it.
            let after_data = fs::metadata(&path).unwrap().len() - synced_len;
            let only_zeros = garbage.iter().all(|&b| b == 0);

            let (mut log, reports) = PartitionLog::open(dir.path()).unwrap();
            let report = reports.last().unwrap();
            let (torn, zeros) = if only_zeros { (0, after_data) } else { (after_data, 0) };
            assert_eq!(
                (report.valid_bytes, report.truncated_bytes, report.preallocated_bytes),
                (synced_len, torn, zeros),
                "{what}"
            );
            assert!(report.corrupt_ranges.is_empty(), "{what}");
            assert_eq!(fs::metadata(&path).unwrap().len(), synced_len, "{what}");
            assert_eq!(log.next_offset(), expected.len() as u64, "{what}");
            assert_records(&read_all(&log.reader(), 0, 1 << 20), &expected, 0);

            expected.extend(append(&mut log, &[records(500, 3, 20, |n| n as i64)]));
            drop(log);
            let (log, reports) = PartitionLog::open(dir.path()).unwrap();
            assert_eq!(reports.last().unwrap().truncated_bytes, 0, "{what}");
            assert_records(&read_all(&log.reader(), 0, 1 << 20), &expected, 0);
        }
    }

    /// Six one-batch appends of four records at offsets 0, 4, ..., 20; batch positions.
    fn six_batches(dir: &Path) -> (PartitionLog, Vec<NewRecord>, Vec<u64>) {
        let (mut log, _) = PartitionLog::open(dir).unwrap();
        let mut expected = Vec::new();
        let mut positions = Vec::new();
        for i in 0..6 {
            positions.push(log.active().size_bytes());
            expected.extend(append(&mut log, &[records(i * 4, 4, 30, |n| 100 + n as i64)]));
        }
        positions.push(log.active().size_bytes());
        (log, expected, positions)
    }

    fn flip_byte(path: &Path, at: u64, mask: u8) {
        let file = OpenOptions::new().read(true).write(true).open(path).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ mask], at).unwrap();
    }

    #[test]
    fn bit_flip_in_the_middle_is_reported_never_served_and_later_batches_stay() {
        // A flip in a record (caught by the CRC) and one in `baseOffset` (outside the CRC).
        for (what, at_in_batch) in [("record bytes", 70u64), ("base offset", 7)] {
            let dir = tempfile::tempdir().unwrap();
            let (log, mut expected, positions) = six_batches(dir.path());
            let path = log.active().path().to_path_buf();
            drop(log);
            flip_byte(&path, positions[2] + at_in_batch, 0x04);

            let (mut log, reports) = PartitionLog::open(dir.path()).unwrap();
            let report = &reports[0];
            assert_eq!(report.corrupt_ranges, vec![(positions[2], positions[3])], "{what}");
            assert_eq!((report.valid_bytes, report.truncated_bytes), (positions[6], 0), "{what}");
            assert_eq!(fs::metadata(&path).unwrap().len(), positions[6], "{what}: nothing truncated");
            let check = |log: &PartitionLog, expected: &[NewRecord]| {
                let reader = log.reader();
                for offset in 8..12 {
                    let err = reader.read(offset, 1 << 20).unwrap_err();
                    assert!(matches!(err, StoreError::CorruptRead { .. }), "{what}: offset {offset}: {err}");
                }
                let r = reader.read(0, 1 << 20).unwrap();
                assert_eq!(r.batches.iter().map(RecordBatch::base_offset).collect::<Vec<_>>(), vec![0, 4]);
                assert_eq!(r.next_offset, 8);
                for from in 12..24 {
                    assert_records(&read_all(&reader, from, 1), expected, from);
                }
            };
            check(&log, &expected);
            assert_eq!(log.next_offset(), 24);
            expected.extend(append(&mut log, &[records(24, 2, 30, |n| 100 + n as i64)]));
            assert_records(&read_all(&log.reader(), 12, 1 << 20), &expected, 12);
            // Sealed and reloaded from its index files, the damage is still never served.
            log.roll().unwrap();
            drop(log);
            let (log, reports) = PartitionLog::open(dir.path()).unwrap();
            assert!(reports[0].from_index_files);
            check(&log, &expected);
        }
    }

    #[test]
    fn offset_for_time_finds_the_first_record_at_or_after_a_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        // Mostly rising timestamps with some late records, over several segments.
        let ts = |n: u64| if n % 11 == 4 { 1_000 + 3 * n as i64 - 200 } else { 1_000 + 3 * n as i64 };
        let mut expected = Vec::new();
        for i in 0..30u64 {
            let base = expected.len() as u64;
            expected.extend(append(&mut log, &[records(base, 1 + i % 6, 150, ts)]));
            if i % 8 == 7 {
                log.roll().unwrap();
            }
        }
        let reader = log.reader();
        let end = expected.len() as u64;
        for t in 0..1_000 + 3 * end as i64 + 5 {
            let want = expected.iter().position(|r| r.timestamp_ms >= t).map_or(end, |p| p as u64);
            assert_eq!(reader.offset_for_time(t).unwrap(), want, "timestamp {t}");
        }
    }

    #[test]
    fn delete_before_removes_only_whole_old_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let mut expected = Vec::new();
        for i in 0..4 {
            expected.extend(append(&mut log, &[records(i * 10, 10, 20, |n| n as i64)]));
            if i < 3 {
                log.roll().unwrap();
            }
        }
        let paths: Vec<PathBuf> = log.segments().iter().map(|s| s.path().to_path_buf()).collect();
        let reader = log.reader();

        assert_eq!(log.delete_before(15).unwrap(), 1, "offsets 10..20 are still wanted");
        assert_eq!(reader.log_start(), 10);
        for ext in ["log", "index", "timeindex"] {
            assert!(!paths[0].with_extension(ext).exists(), "{ext}");
            assert!(paths[1].with_extension(ext).exists(), "{ext}");
        }
        assert!(matches!(reader.read(9, 100), Err(StoreError::OutOfRange { offset: 9, log_start: 10, .. })));
        assert_records(&read_all(&reader, 10, 1 << 20), &expected, 10);
        assert_eq!(log.delete_before(19).unwrap(), 0);
        assert_eq!(log.delete_before(20).unwrap(), 1);
        assert_eq!(log.delete_before(1_000).unwrap(), 1, "never the active segment");
        assert_eq!(log.segments().len(), 1);
        assert_eq!(reader.log_start(), 30);
        assert_records(&read_all(&reader, 30, 1 << 20), &expected, 30);
        drop(log);
        let (log, _) = PartitionLog::open(dir.path()).unwrap();
        assert_eq!((log.reader().log_start(), log.next_offset()), (30, 40));
    }

    /// One `append_and_sync` call: per batch, its record count and value size.
    type Group = Vec<(u64, usize)>;

    /// Every batch `reader` serves, from offset 0 on.
    fn read_batches(reader: &PartitionReader) -> Vec<RecordBatch> {
        let mut read_back = Vec::new();
        let mut next = 0;
        loop {
            let r = reader.read(next, 1).unwrap();
            if r.batches.is_empty() {
                return read_back;
            }
            next = r.next_offset;
            read_back.extend(r.batches);
        }
    }

    fn group() -> impl Strategy<Value = Group> {
        proptest::collection::vec((1..5u64, 0..300usize), 1..4)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// Groups of appends, each of which may fail (a full disk or a short write at any of its
        /// batches, or its fsync), the log opened again after each failure as a writer or a
        /// replica would; then a group written and not synced, and a power loss that takes back
        /// every write no fsync covered or tears it anywhere ([`crate::log::disk::PowerLoss`]).
        /// The log holds every acknowledged batch at its offsets, then a prefix of the unsynced
        /// group in whole batches, and nothing else; appends continue right after it.
        #[test]
        fn a_power_loss_after_failed_writes_and_fsyncs_keeps_exactly_the_acknowledged_batches(
            steps in proptest::collection::vec((group(), 0..6u8, any::<u8>()), 1..10),
            unsynced in group(),
            torn in any::<u32>(),
        ) {
            use crate::log::disk::{inject_fsync_errors, inject_write_errors, record_unsynced, FaultKind};
            let dir = tempfile::tempdir().unwrap();
            let path_part = dir.path().to_string_lossy().to_string();
            let power = record_unsynced(&path_part);
            let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
            let mut tag = 0;
            let mut acked: Vec<RecordBatch> = Vec::new();
            for (group, fault, at) in &steps {
                let batches: Vec<RecordBatch> = group
                    .iter()
                    .map(|&(count, value_bytes)| {
                        tag += count;
                        batch(&records(tag - count, count, value_bytes, |n| n as i64))
                    })
                    .collect();
                let at = u32::from(*at) % batches.len() as u32;
                let injected = match fault {
                    3 => Some(inject_write_errors(FaultKind::NoSpace, &path_part, at, 1)),
                    4 => Some(inject_write_errors(FaultKind::ShortWrite, &path_part, at, 1)),
                    5 => Some(inject_fsync_errors(&path_part, 0, 1)),
                    _ => None,
                };
                match log.append_and_sync(batches.clone(), EPOCH) {
                    Ok(ranges) => {
                        prop_assert!(injected.is_none());
                        acked.extend(
                            batches.into_iter().zip(ranges).map(|(b, (base, _))| b.with_offsets(base, EPOCH as i32)),
                        );
                        log.publish();
                    }
                    Err(e) => {
                        prop_assert!(injected.is_some_and(|f| f.failed() == 1), "{e}");
                        drop(log);
                        log = PartitionLog::open(dir.path()).unwrap().0;
                    }
                }
                prop_assert_eq!(log.next_offset(), acked.last().map_or(0, RecordBatch::next_offset));
            }
            let mut written = Vec::new();
            for &(count, value_bytes) in &unsynced {
                let base = log.next_offset();
                let b = batch(&records(tag, count, value_bytes, |n| n as i64)).with_offsets(base, EPOCH as i32);
                tag += count;
                log.active_mut().append(&b).unwrap();
                written.push(b);
            }
            drop(log);
            let unsynced_bytes = power.unsynced_bytes();
            prop_assert!(unsynced_bytes >= written.iter().map(|b| b.len_bytes()).sum::<usize>());
            power.lose_unsynced(torn as usize % (unsynced_bytes + 1)).unwrap();

            let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
            let reader = log.reader();
            let read_back = read_batches(&reader);
            prop_assert!(read_back.len() >= acked.len(), "{} of {} acknowledged batches", read_back.len(), acked.len());
            prop_assert_eq!(&read_back[..acked.len()], &acked[..]);
            let survivors = &read_back[acked.len()..];
            prop_assert!(survivors.len() <= written.len());
            prop_assert_eq!(survivors, &written[..survivors.len()]);
            let end = read_back.last().map_or(0, RecordBatch::next_offset);
            prop_assert_eq!(log.next_offset(), end);
            let after = log.append_and_sync(vec![batch(&records(10_000, 2, 5, |n| n as i64))], EPOCH).unwrap();
            prop_assert_eq!(after[0].0, end);
        }

        /// Acknowledged groups survive a crash that cuts the active segment anywhere after the
        /// last acknowledged fsync, and leaves any of the unacknowledged group's sectors
        /// unwritten (holding what they held before: the synced data, then zeros); what
        /// survives of that group is a prefix of it at the right offsets, and appends continue
        /// right after it.
        #[test]
        fn acknowledged_batches_survive_a_crash_anywhere_after_the_last_sync(
            steps in proptest::collection::vec((group(), any::<bool>()), 1..10),
            unacked in group(),
            crash_at in any::<u64>(),
            zeros_after in any::<bool>(),
            unwritten_sectors in any::<u8>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
            let mut tag = 0;
            let mut make = |group: &Group| -> Vec<RecordBatch> {
                group
                    .iter()
                    .map(|&(count, value_bytes)| {
                        tag += count;
                        batch(&records(tag - count, count, value_bytes, |n| n as i64))
                    })
                    .collect()
            };
            let stamp = |log: &mut PartitionLog, batches: Vec<RecordBatch>| -> Vec<RecordBatch> {
                let ranges = log.append_and_sync(batches.clone(), EPOCH).unwrap();
                batches.into_iter().zip(ranges).map(|(b, (base, _))| b.with_offsets(base, EPOCH as i32)).collect()
            };
            let mut acked = Vec::new();
            for (group, roll) in &steps {
                let batches = make(group);
                acked.extend(stamp(&mut log, batches));
                log.publish();
                if *roll && log.active().size_bytes() > 0 {
                    log.roll().unwrap();
                }
            }
            let synced_len = log.active().size_bytes();
            let path = log.active().path().to_path_buf();
            let batches = make(&unacked);
            let unacked = stamp(&mut log, batches);
            // The crash: the fsync of the last group never returned, and only part of it is on disk.
            let written = log.active().size_bytes();
            drop(log);
            let cut = synced_len + crash_at % (written - synced_len + 1);
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            for i in (0..8u64).filter(|i| unwritten_sectors & (1 << i) != 0) {
                let sector = (synced_len / 512 + i) * 512;
                let (from, to) = (sector.max(synced_len), (sector + 512).min(written));
                if from < to {
                    file.write_all_at(&vec![0; (to - from) as usize], from).unwrap();
                }
            }
            file.set_len(cut).unwrap();
            if zeros_after {
                // The space written ahead of the appends reads as zeros after what survived.
                file.set_len(cut + 4096).unwrap();
            }
            drop(file);

            let (mut log, reports) = PartitionLog::open(dir.path()).unwrap();
            prop_assert!(reports.iter().all(|r| r.corrupt_ranges.is_empty()));
            let reader = log.reader();
            let read_back = read_batches(&reader);
            prop_assert!(read_back.len() >= acked.len());
            prop_assert_eq!(&read_back[..acked.len()], &acked[..]);
            let survivors = &read_back[acked.len()..];
            prop_assert!(survivors.len() <= unacked.len());
            prop_assert_eq!(survivors, &unacked[..survivors.len()]);
            let kept_bytes: u64 = survivors.iter().map(|b| b.len_bytes() as u64).sum();
            let report = reports.last().unwrap();
            // (Zeros where the batch had zeros anyway, such as the high bytes of its offset or
            // its last record's header count, are told from the zeros written ahead by
            // nothing: the batch survives whole, or what is cut counts with those zeros.)
            let file_len = cut + if zeros_after { 4096 } else { 0 };
            let after_kept = file_len - synced_len - kept_bytes;
            prop_assert_eq!(report.truncated_bytes + report.preallocated_bytes, after_kept);
            let end = read_back.last().map_or(0, RecordBatch::next_offset);
            prop_assert_eq!(log.next_offset(), end);
            prop_assert_eq!(reader.high_watermark(), end);
            let after = stamp(&mut log, vec![batch(&records(10_000, 2, 5, |n| n as i64))]);
            prop_assert_eq!(after[0].base_offset(), end);
        }
    }
}
