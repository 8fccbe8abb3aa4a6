//! A partition's local log: its chain of segments on disk.
//!
//! The log is split in two halves so that readers never wait for the writer's fsync:
//! [`PartitionLog`] is owned by the partition's writer task and does all writes;
//! [`PartitionReader`] is shared with every reader and only ever sees bytes that are durable.
//! The writer publishes a new high watermark after each fsync.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use silt_record::RecordBatch;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::StoreError;
use crate::segment::{sync_dir, IndexEntry, ScanReport, Segment, SegmentView};

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

impl PartitionLog {
    /// Opens (or creates) the log in `dir`. Every segment but the last is taken as sealed;
    /// the last is scanned batch by batch and its torn tail, if any, truncated.
    pub fn open(dir: &Path) -> Result<(PartitionLog, Vec<ScanReport>), StoreError> {
        fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, "create directory", e))?;
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
            let path = dir.join(crate::segment::log_file_name(*base));
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
        let mut ranges = Vec::with_capacity(batches.len());
        for batch in batches {
            let base = self.next_offset();
            let batch = batch.with_offsets(base, epoch_i32(epoch));
            ranges.push((base, batch.last_offset()));
            self.active_mut().append(&batch)?;
        }
        self.active().sync()?;
        Ok(ranges)
    }

    /// Makes everything synced so far visible to readers and wakes waiting consumers.
    pub fn publish(&self) {
        let views: Vec<SegmentView> =
            self.segments.iter().map(|s| s.view(s.size_bytes(), s.next_offset())).collect();
        let hwm = self.next_offset();
        {
            let mut state = self.reader.state.write().unwrap_or_else(|e| e.into_inner());
            state.log_start = views.first().map_or(0, |v| v.base_offset);
            state.segments = views;
            state.high_watermark = hwm;
        }
        self.reader.high_watermark.send_replace(hwm);
    }

    /// Seals the active segment on disk (fsync, index files) and starts a new one at the
    /// current end. The caller records both in metadata.
    pub fn roll(&mut self) -> Result<(), StoreError> {
        self.active().seal()?;
        let base = self.next_offset();
        let segment = Segment::create(&self.dir, base)?;
        self.segments.push(segment);
        self.publish();
        Ok(())
    }

    /// Removes the active segment if it holds no records and a new empty one is wanted at the
    /// same base (used when reconciling with metadata after a restart).
    pub fn seal_active_on_disk(&self) -> Result<(), StoreError> {
        self.active().seal()
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

/// How much `offset_for_time` reads per step while it scans for a timestamp.
const OFFSET_FOR_TIME_READ_BYTES: usize = 1024 * 1024;

/// Kafka's partitionLeaderEpoch is an i32; Silt's epochs stay far below that.
fn epoch_i32(epoch: u64) -> i32 {
    i32::try_from(epoch).unwrap_or(i32::MAX)
}

impl PartitionReader {
    /// The durable end of the log: one past the last offset a reader may see.
    pub fn high_watermark(&self) -> u64 {
        *self.high_watermark.borrow()
    }

    /// The first offset still on local disk.
    pub fn log_start(&self) -> u64 {
        self.state.read().unwrap_or_else(|e| e.into_inner()).log_start
    }

    /// A receiver that changes whenever the high watermark moves.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.high_watermark.subscribe()
    }

    /// Reads whole batches starting with the one that holds `offset`, up to about
    /// `max_bytes`, never past the durable end. Offsets below the log start are an error the
    /// caller turns into "out of range".
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<ReadResult, StoreError> {
        let (views, hwm) = {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
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
            let mut start = view.entry_for(offset);
            loop {
                let batches = view.read_batches(start, max_bytes)?;
                let Some(last) = batches.last() else { break };
                let bytes: u64 = batches.iter().map(|b| b.len_bytes() as u64).sum();
                start = IndexEntry { offset: last.next_offset(), position: start.position + bytes };
                let kept: Vec<RecordBatch> =
                    batches.into_iter().filter(|b| b.last_offset() >= offset).collect();
                if let Some(last) = kept.last() {
                    let next_offset = last.next_offset();
                    return Ok(ReadResult { batches: kept, next_offset, high_watermark: hwm });
                }
            }
        }
        Ok(ReadResult { batches: Vec::new(), next_offset: offset, high_watermark: hwm })
    }

    /// The first offset whose record timestamp is at least `timestamp_ms`, or the high
    /// watermark if there is none.
    pub fn offset_for_time(&self, timestamp_ms: i64) -> Result<u64, StoreError> {
        let (views, hwm) = {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
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
