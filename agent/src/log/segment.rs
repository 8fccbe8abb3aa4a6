//! One segment of a partition's log on local disk: a file of record batches, a sparse
//! offset index and a time index.
//!
//! Files, named by the segment's base offset (20 digits, so they sort):
//! - `{base}.log`: record batches (Kafka RecordBatch v2) back to back, nothing else.
//! - `{base}.index`: written when the segment is sealed; `(offset u64, position u64)` pairs
//!   every [`INDEX_INTERVAL_BYTES`], then a CRC-32C of the entries.
//! - `{base}.timeindex`: written at seal; `(max timestamp so far i64, offset u64)` pairs at
//!   the same points, then a CRC-32C.
//!
//! The open segment keeps its indexes in memory only; recovery rebuilds them by scanning the
//! log file, checking every batch's CRC. Index files of a sealed segment that are missing or
//! fail their checksum are rebuilt the same way.

//!
//! One file of about a thousand lines: the file's layout (batches back to back, zero-filled
//! space ahead of the appends, indexes written at seal, a torn tail cut at open) is one
//! invariant that creating, scanning, appending, syncing, sealing, truncating and reading all
//! keep, and they are read together when it changes.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use bytes::{Bytes, BytesMut};
use silt_record::{
    peek_base_offset, peek_batch_len, peek_last_offset, RecordBatch, BATCH_HEADER_BYTES, LOG_OVERHEAD,
};
use tracing::{debug, error, warn};

use crate::error::StoreError;
use crate::limits::{BATCH_BYTES_MAX, GROUP_BYTES_MAX, REPLICA_READ_BYTES_MAX};
use crate::sync::{read_lock, write_lock};

/// An index entry is added at most every this many bytes of log.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
/// Most zero-filled space kept ahead of an open segment's data (see [`Segment::sync_appends`]).
pub const PREALLOCATE_BYTES_MAX: u64 = 256 * 1024;
/// Least zero-filled space worth writing ahead of a small segment's data.
const PREALLOCATE_BYTES_MIN: u64 = 4 * 1024;

/// What a recovery scan found in a log file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Bytes of valid log.
    pub valid_bytes: u64,
    /// Bytes cut off the end (a torn write that was never acknowledged).
    pub truncated_bytes: u64,
    /// Zero-filled space after the last batch (written ahead of appends), cut off the end.
    pub preallocated_bytes: u64,
    /// Byte ranges in the middle whose batches fail their checks; never served.
    pub corrupt_ranges: Vec<(u64, u64)>,
    /// The segment is sealed and was loaded from its index files without a scan.
    pub from_index_files: bool,
}

/// What a scan may find after the last batch it can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// The file was synced whole: a bad batch with valid ones after it is damage.
    Synced,
    /// The last segment file of a partition: its last group may have been cut by a crash
    /// anywhere, gaps included.
    MayBeTorn,
}

/// Location of a batch within a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// First offset of the batch.
    pub offset: u64,
    /// Byte position of the batch in the log file.
    pub position: u64,
}

/// Time index entry: every batch at or after `offset` has timestamps after those before it
/// that are no larger than `max_timestamp_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeIndexEntry {
    /// Largest timestamp in the segment up to (excluding) the batch at `offset`.
    pub max_timestamp_ms: i64,
    /// First offset of the indexed batch.
    pub offset: u64,
}

/// One segment. Appends and reads use positional I/O on one shared file handle, so readers
/// never block the writer; the caller publishes `size_bytes` only after an fsync.
#[derive(Debug)]
pub struct Segment {
    base_offset: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Bytes written (not necessarily durable until `sync`).
    size_bytes: u64,
    /// Length of the file: `size_bytes` and the zero-filled space after it.
    allocated_bytes: u64,
    /// `size_bytes` at the last [`Segment::sync_appends`].
    synced_bytes: u64,
    /// Offset the next appended batch gets.
    next_offset: u64,
    record_count: u64,
    min_timestamp_ms: Option<i64>,
    max_timestamp_ms: Option<i64>,
    index: Arc<RwLock<Vec<IndexEntry>>>,
    time_index: Arc<RwLock<Vec<TimeIndexEntry>>>,
    last_indexed_position: Option<u64>,
    corrupt_ranges: Vec<(u64, u64)>,
}

/// Everything a reader needs to read a segment without holding any lock.
#[derive(Debug, Clone)]
pub struct SegmentView {
    /// First offset.
    pub base_offset: u64,
    /// One past the last readable offset.
    pub end_offset: u64,
    /// Readable bytes.
    pub size_bytes: u64,
    /// Shared file handle.
    pub file: Arc<File>,
    /// Sparse offset index, shared with the writer; it may hold entries past `size_bytes`.
    pub index: Arc<RwLock<Vec<IndexEntry>>>,
    /// Sparse time index, shared with the writer.
    pub time_index: Arc<RwLock<Vec<TimeIndexEntry>>>,
}

pub(crate) fn log_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.log")
}

impl Segment {
    /// Creates a new, empty segment file and fsyncs its directory.
    pub fn create(dir: &Path, base_offset: u64) -> Result<Segment, StoreError> {
        let path = dir.join(log_file_name(base_offset));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| StoreError::io(&path, "create", e))?;
        sync_dir(dir)?;
        Ok(Segment::new(base_offset, path, file))
    }

    fn new(base_offset: u64, path: PathBuf, file: File) -> Segment {
        Segment {
            base_offset,
            path,
            file: Arc::new(file),
            size_bytes: 0,
            allocated_bytes: 0,
            synced_bytes: 0,
            next_offset: base_offset,
            record_count: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            index: Arc::default(),
            time_index: Arc::default(),
            last_indexed_position: None,
            corrupt_ranges: Vec::new(),
        }
    }

    /// Opens an existing segment. A sealed segment with valid index files is loaded from them;
    /// otherwise (the last segment file of a partition, or missing indexes) the log is scanned,
    /// every batch's CRC checked, and a torn tail truncated.
    pub fn open(path: &Path, base_offset: u64, sealed: bool) -> Result<(Segment, ScanReport), StoreError> {
        let tail = if sealed { Tail::Synced } else { Tail::MayBeTorn };
        Segment::open_with(path, base_offset, sealed, tail)
    }

    fn open_with(
        path: &Path,
        base_offset: u64,
        sealed: bool,
        tail: Tail,
    ) -> Result<(Segment, ScanReport), StoreError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| StoreError::io(path, "open", e))?;
        let mut segment = Segment::new(base_offset, path.to_path_buf(), file);
        if sealed {
            if let Some(()) = segment.load_indexes()? {
                let report = ScanReport {
                    valid_bytes: segment.size_bytes,
                    from_index_files: true,
                    ..Default::default()
                };
                return Ok((segment, report));
            }
            warn!(path = %path.display(), "index files missing or damaged; rebuilding by scanning the log");
        }
        let report = segment.scan(tail)?;
        Ok((segment, report))
    }

    /// Scans the whole file, rebuilding the in-memory state. Truncates a torn tail.
    ///
    /// With [`Tail::MayBeTorn`] a bad batch is a torn tail, not damage in the middle, also when
    /// valid batches follow it, if it is the last group's ([`Segment::is_torn_last_group`]):
    /// small groups overwrite zeros written ahead of them, and a crash during their fdatasync
    /// can leave any of their sectors unwritten (the disk persists them in no set order), so a
    /// later batch of the same never-acknowledged group may have reached the disk when an
    /// earlier one did not. Every earlier group was synced whole, so such a gap can only be in
    /// the last group, and everything from it on goes.
    fn scan(&mut self, tail: Tail) -> Result<ScanReport, StoreError> {
        let len = self.file.metadata().map_err(|e| StoreError::io(&self.path, "stat", e))?.len();
        let mut report = ScanReport::default();
        let mut position = 0u64;
        while position < len {
            // Offsets are contiguous within a segment, from its base offset on. `baseOffset` lies
            // outside the CRC, so a batch that passes its CRC at the wrong offset is damage too.
            let checked = self.read_batch_at(position, len).and_then(|batch| {
                if batch.base_offset() == self.next_offset {
                    Ok(batch)
                } else {
                    Err(format!(
                        "batch starts at offset {} but offset {} was expected",
                        batch.base_offset(),
                        self.next_offset
                    ))
                }
            });
            match checked {
                Ok(batch) => {
                    let len_bytes = batch.len_bytes() as u64;
                    self.note_batch(position, &batch);
                    position += len_bytes;
                }
                Err(reason) => {
                    let resumes = match self.resync(position, len) {
                        Some((next, _))
                            if tail == Tail::MayBeTorn && self.is_torn_last_group(position, next, len)? =>
                        {
                            error!(
                                path = %self.path.display(),
                                at = position,
                                resumes_at = next,
                                %reason,
                                "a bad batch with an unwritten sector in the last segment: the last group, \
                                 which a crash left with gaps and was never acknowledged; cutting it and \
                                 the batches after it"
                            );
                            None
                        }
                        resumes => resumes,
                    };
                    match resumes {
                        Some((next_position, next_offset)) => {
                            error!(
                                path = %self.path.display(),
                                from = position,
                                to = next_position,
                                %reason,
                                "corrupt batch in the middle of a segment; it will never be served"
                            );
                            report.corrupt_ranges.push((position, next_position));
                            self.corrupt_ranges.push((position, next_position));
                            // The damaged batch's offsets are lost to this replica; skip them.
                            self.next_offset = next_offset;
                            position = next_position;
                            // Index the next good batch, so that reads of the offsets after the
                            // damage start there instead of running into it.
                            self.last_indexed_position = None;
                        }
                        None if self.zeros_from(position, len)? => {
                            // Space written ahead of appends that never came: nothing was lost.
                            // Cut without an fsync: zeros that come back after a crash are cut again.
                            debug!(path = %self.path.display(), at = position, bytes = len - position, "dropping zero-filled space after the last batch");
                            crate::log::disk::set_len(&self.file, &self.path, position)
                                .map_err(|e| StoreError::io(&self.path, "truncate", e))?;
                            report.preallocated_bytes = len - position;
                            break;
                        }
                        None => {
                            warn!(
                                path = %self.path.display(),
                                at = position,
                                bytes = len - position,
                                %reason,
                                "truncating a torn tail that was never acknowledged"
                            );
                            crate::log::disk::set_len(&self.file, &self.path, position)
                                .map_err(|e| StoreError::io(&self.path, "truncate", e))?;
                            crate::log::disk::sync_all(&self.file, &self.path)
                                .map_err(|e| StoreError::io(&self.path, "fsync", e))?;
                            report.truncated_bytes = len - position;
                            break;
                        }
                    }
                }
            }
        }
        self.size_bytes = position;
        self.allocated_bytes = position;
        self.synced_bytes = position;
        report.valid_bytes = position;
        Ok(report)
    }

    /// Whether the bad batch at `from`, with a valid batch after it at `to`, is part of the
    /// last group written, with sectors a crash left unwritten (see [`Segment::scan`]): fewer
    /// bytes than a group holds before its last batch lie between it and the file's last batch
    /// (so that damage further back is never taken for one), and part of it reads as the zeros
    /// that were there before: a whole 512-byte sector from it up to the end of the sector
    /// holding `to`, or the rest of its first sector where that cannot be the start of a batch
    /// header (the synced data before it shares that sector).
    fn is_torn_last_group(&self, from: u64, to: u64, len: u64) -> Result<bool, StoreError> {
        const SECTOR: u64 = 512;
        // A writer's group holds batches while it has fewer than GROUP_BYTES_MAX bytes; a
        // recovery copies a tail in reads of at most REPLICA_READ_BYTES_MAX.
        let before_last = GROUP_BYTES_MAX.max(REPLICA_READ_BYTES_MAX) as u64;
        if self.last_batch_start(to, len)? - from >= before_last {
            return Ok(false);
        }
        let boundary = from.div_ceil(SECTOR) * SECTOR;
        if boundary > from {
            let mut first = vec![0u8; (boundary.min(to) - from) as usize];
            self.file.read_exact_at(&mut first, from).map_err(|e| StoreError::io(&self.path, "read", e))?;
            if first.iter().all(|&b| b == 0) {
                let expected = self.next_offset.to_be_bytes();
                let header_like =
                    first.len() < LOG_OVERHEAD && expected.iter().take(first.len()).all(|&b| b == 0);
                if !header_like {
                    return Ok(true);
                }
            }
        }
        let end = (to.div_ceil(SECTOR) * SECTOR).min(len);
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = boundary;
        while at + SECTOR <= end {
            let n = (buf.len() as u64).min((end - at) / SECTOR * SECTOR) as usize;
            let chunk = &mut buf[..n];
            self.file.read_exact_at(chunk, at).map_err(|e| StoreError::io(&self.path, "read", e))?;
            if chunk.chunks_exact(SECTOR as usize).any(|sector| sector.iter().all(|&b| b == 0)) {
                return Ok(true);
            }
            at += n as u64;
        }
        Ok(false)
    }

    /// Where the file's last batch starts, walking from the batch at `at` by the batches'
    /// lengths and over bad bytes to the next valid batch.
    fn last_batch_start(&self, mut at: u64, len: u64) -> Result<u64, StoreError> {
        let mut last = at;
        let mut head = [0u8; LOG_OVERHEAD];
        while at + LOG_OVERHEAD as u64 <= len {
            self.file.read_exact_at(&mut head, at).map_err(|e| StoreError::io(&self.path, "read", e))?;
            match peek_batch_len(&head) {
                Some(n) if n <= BATCH_BYTES_MAX && at + n as u64 <= len => {
                    last = at;
                    at += n as u64;
                }
                _ => match self.resync(at, len) {
                    Some((next, _)) => at = next,
                    None => break,
                },
            }
        }
        Ok(last)
    }

    /// Whether every byte of the file from `position` to `len` is zero.
    fn zeros_from(&self, mut position: u64, len: u64) -> Result<bool, StoreError> {
        let mut buf = vec![0u8; 64 * 1024];
        while position < len {
            let n = buf.len().min((len - position) as usize);
            let chunk = &mut buf[..n];
            self.file.read_exact_at(chunk, position).map_err(|e| StoreError::io(&self.path, "read", e))?;
            if chunk.iter().any(|&b| b != 0) {
                return Ok(false);
            }
            position += n as u64;
        }
        Ok(true)
    }

    /// The offset after the last valid batch of the segment file at `path` (`base_offset`
    /// when it holds none), read without changing the file: a torn tail stays, and batches
    /// after damage count. For tools that inspect a data directory no agent runs on.
    pub fn end_offset_held(path: &Path, base_offset: u64) -> Result<u64, StoreError> {
        let file = File::open(path).map_err(|e| StoreError::io(path, "open", e))?;
        let mut segment = Segment::new(base_offset, path.to_path_buf(), file);
        let len = segment.file.metadata().map_err(|e| StoreError::io(path, "stat", e))?.len();
        let mut position = 0u64;
        while position < len {
            match segment.read_batch_at(position, len) {
                Ok(batch) if batch.base_offset() >= segment.next_offset => {
                    segment.next_offset = batch.last_offset() + 1;
                    position += batch.len_bytes() as u64;
                }
                _ => match segment.resync(position, len) {
                    Some((next_position, _)) => position = next_position,
                    None => break,
                },
            }
        }
        Ok(segment.next_offset)
    }

    /// After a bad batch at `position`, looks for a later valid batch. Finding one means the
    /// damage is in the middle (not a torn tail) and must not be truncated away.
    fn resync(&self, position: u64, len: u64) -> Option<(u64, u64)> {
        const MAGIC_AT: u64 = 16;
        let mut buf = vec![0u8; 64 * 1024];
        let mut start = position + 1;
        while start + MAGIC_AT < len {
            let n = self.file.read_at(&mut buf, start).ok()?;
            if n == 0 {
                return None;
            }
            for i in 0..n {
                let candidate = start + i as u64;
                if buf.get(i + MAGIC_AT as usize) != Some(&2) && (i + MAGIC_AT as usize) < n {
                    continue;
                }
                if let Ok(batch) = self.read_batch_at(candidate, len) {
                    if batch.base_offset() >= self.next_offset {
                        return Some((candidate, batch.base_offset()));
                    }
                }
            }
            start += n as u64;
        }
        None
    }

    /// Reads and fully validates the batch at `position`.
    fn read_batch_at(&self, position: u64, len: u64) -> Result<RecordBatch, String> {
        self.read_batch(position, len).map_err(|e| match e {
            StoreError::Read(io) => io.to_string(),
            StoreError::Corrupt { reason, .. } => reason,
            other => other.to_string(),
        })
    }

    /// The batch at `position` of a file `len` bytes long: a read the disk failed is
    /// [`StoreError::Read`], bytes that are no whole valid batch [`StoreError::Corrupt`].
    fn read_batch(&self, position: u64, len: u64) -> Result<RecordBatch, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt { path: self.path.clone(), position, reason };
        let mut head = [0u8; LOG_OVERHEAD];
        if position + LOG_OVERHEAD as u64 > len {
            return Err(corrupt("incomplete batch header".into()));
        }
        self.file.read_exact_at(&mut head, position).map_err(StoreError::io_read)?;
        let batch_len =
            peek_batch_len(&head).ok_or_else(|| corrupt("batch length field is invalid".into()))?;
        if batch_len > BATCH_BYTES_MAX || position + batch_len as u64 > len {
            return Err(corrupt(format!("batch of {batch_len} bytes runs past the end of the file")));
        }
        let mut buf = BytesMut::zeroed(batch_len);
        self.file.read_exact_at(&mut buf, position).map_err(StoreError::io_read)?;
        RecordBatch::parse(buf.freeze()).map_err(|e| corrupt(e.to_string()))
    }

    fn note_batch(&mut self, position: u64, batch: &RecordBatch) {
        let due = match self.last_indexed_position {
            None => true,
            Some(last) => position - last >= INDEX_INTERVAL_BYTES,
        };
        if due {
            write_lock(&self.index).push(IndexEntry { offset: batch.base_offset(), position });
            write_lock(&self.time_index).push(TimeIndexEntry {
                max_timestamp_ms: self.max_timestamp_ms.unwrap_or(i64::MIN),
                offset: batch.base_offset(),
            });
            self.last_indexed_position = Some(position);
        }
        self.record_count += u64::from(batch.record_count());
        self.next_offset = batch.last_offset() + 1;
        let (lo, hi) = timestamp_range(batch);
        self.min_timestamp_ms = Some(self.min_timestamp_ms.map_or(lo, |m| m.min(lo)));
        self.max_timestamp_ms = Some(self.max_timestamp_ms.map_or(hi, |m| m.max(hi)));
    }

    /// Writes a batch whose offsets the caller already assigned (starting at `next_offset`).
    /// Not durable until [`Segment::sync`].
    pub fn append(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        debug_assert_eq!(batch.base_offset(), self.next_offset);
        let position = self.size_bytes;
        if let Err(e) = crate::log::disk::write_all_at(&self.file, &self.path, batch.as_bytes(), position) {
            // What the group wrote before is never acknowledged, and may be torn: cut it off.
            return Err(self.discard_unsynced(StoreError::io(&self.path, "write", e)));
        }
        self.size_bytes += batch.len_bytes() as u64;
        self.note_batch(position, batch);
        Ok(())
    }

    /// Makes every appended byte durable. After an error the segment holds only what the
    /// last successful fsync covered ([`Segment::discard_unsynced`]).
    fn sync(&mut self) -> Result<(), StoreError> {
        match crate::log::disk::sync_data(&self.file, &self.path) {
            Ok(()) => Ok(()),
            Err(e) => {
                Err(self.discard_unsynced(StoreError::FsyncFailed { path: self.path.clone(), source: e }))
            }
        }
    }

    /// After the failed write or fsync that gave `error`: the bytes written since the last
    /// successful fsync may be in the page cache only (a later read would still see them), so the file is
    /// cut back to what that fsync covered, the cut made durable, and the segment loaded again
    /// from the file: nothing the failure may have lost is ever counted as held. When that
    /// fails too, the directory is distrusted ([`crate::log::disk::distrust`]). Returns `error`.
    fn discard_unsynced(&mut self, error: StoreError) -> StoreError {
        let durable = self.synced_bytes;
        let cut = crate::log::disk::set_len(&self.file, &self.path, durable)
            .and_then(|()| crate::log::disk::sync_all(&self.file, &self.path))
            .map_err(|e| StoreError::io(&self.path, "cut back to its last fsync", e))
            .and_then(|()| Segment::open_with(&self.path, self.base_offset, false, Tail::Synced));
        match cut {
            Ok((segment, _)) => {
                warn!(path = %self.path.display(), %error, kept_bytes = durable, dropped_bytes = self.size_bytes - durable, "a write or an fsync failed: the segment is cut back to what its last successful fsync covered");
                *self = segment;
            }
            Err(cut) => {
                let dir = self.path.parent().unwrap_or(&self.path);
                error!(path = %self.path.display(), %error, %cut, "a write or an fsync failed and the segment cannot be cut back to what is on disk: this agent opens no log in its directory again until it restarts");
                crate::log::disk::distrust(dir);
            }
        }
        error
    }

    /// [`Segment::sync`] for the end of a group of appends. When the group was small, zero-filled
    /// space is first written after the data (made durable by the same fdatasync), so that the
    /// next small groups overwrite it in place: an fdatasync of a write within the file has no
    /// new file size or block allocation to commit to the filesystem's journal, and on ext4
    /// costs about half the time and CPU of one that appends. Large groups append as they are:
    /// they commit one file size per many bytes anyway, and writing zeros ahead of them would
    /// double what they send to the disk. The space ahead grows with the segment (as much as
    /// it already holds, from [`PREALLOCATE_BYTES_MIN`] to [`PREALLOCATE_BYTES_MAX`]), so a
    /// quiet partition's open segment stays small, and [`Segment::seal`] cuts it off.
    pub fn sync_appends(&mut self) -> Result<(), StoreError> {
        let group = self.size_bytes - self.synced_bytes.min(self.size_bytes);
        self.allocated_bytes = self.allocated_bytes.max(self.size_bytes);
        let ahead = self.size_bytes.clamp(PREALLOCATE_BYTES_MIN, PREALLOCATE_BYTES_MAX);
        if group <= ahead / 4 && self.allocated_bytes - self.size_bytes < ahead / 2 {
            self.zero_fill(self.size_bytes + ahead);
        }
        self.sync()?;
        self.synced_bytes = self.size_bytes;
        Ok(())
    }

    /// Writes zeros from the end of the file to `to`. A failure (a full disk) only means the
    /// next appends extend the file themselves.
    fn zero_fill(&mut self, to: u64) {
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        while self.allocated_bytes < to {
            let n = ZEROS.len().min((to - self.allocated_bytes) as usize);
            if let Err(e) =
                crate::log::disk::write_all_at(&self.file, &self.path, &ZEROS[..n], self.allocated_bytes)
            {
                debug!(path = %self.path.display(), error = %e, "cannot write zero-filled space ahead of appends");
                return;
            }
            self.allocated_bytes += n as u64;
        }
    }

    /// Seals the segment: cuts off any zero-filled space after the data, fsyncs the log, then
    /// writes both index files.
    ///
    /// The index files are not fsynced: they only spare a scan of the log at the next start,
    /// and one that a crash left short, stale or empty fails its checksum or its checks against
    /// the log and is rebuilt by scanning ([`Segment::open`]). Only the log's own fsync sits on
    /// the path of a roll.
    pub fn seal(&mut self) -> Result<(), StoreError> {
        // By the file's own length: a zero fill that failed midway wrote some of its zeros.
        let len = self.file.metadata().map_err(|e| StoreError::io(&self.path, "stat", e))?.len();
        if len > self.size_bytes {
            crate::log::disk::set_len(&self.file, &self.path, self.size_bytes)
                .map_err(|e| StoreError::io(&self.path, "truncate", e))?;
        }
        self.allocated_bytes = self.size_bytes;
        self.sync()?;
        self.synced_bytes = self.size_bytes;
        let mut idx = Vec::new();
        for e in read_lock(&self.index).iter() {
            idx.extend_from_slice(&e.offset.to_be_bytes());
            idx.extend_from_slice(&e.position.to_be_bytes());
        }
        write_with_crc(&self.path.with_extension("index"), idx)?;
        let mut tidx = Vec::new();
        for e in read_lock(&self.time_index).iter() {
            tidx.extend_from_slice(&e.max_timestamp_ms.to_be_bytes());
            tidx.extend_from_slice(&e.offset.to_be_bytes());
        }
        write_with_crc(&self.path.with_extension("timeindex"), tidx)
    }

    /// Loads a sealed segment's indexes. `None` if they are missing, damaged or disagree with
    /// the log; `self` is only changed when they load, so a scan can start from scratch.
    fn load_indexes(&mut self) -> Result<Option<()>, StoreError> {
        let len = self.file.metadata().map_err(|e| StoreError::io(&self.path, "stat", e))?.len();
        let (Some(idx), Some(tidx)) = (
            read_with_crc(&self.path.with_extension("index")),
            read_with_crc(&self.path.with_extension("timeindex")),
        ) else {
            return Ok(None);
        };
        if idx.len() % 16 != 0 || idx.len() != tidx.len() || idx.is_empty() {
            return Ok(None);
        }
        let pairs = |b: &[u8]| -> Vec<(u64, u64)> {
            b.chunks_exact(16)
                .map(|c| {
                    let (a, b) = c.split_at(8);
                    (
                        u64::from_be_bytes(a.try_into().unwrap_or_default()),
                        u64::from_be_bytes(b.try_into().unwrap_or_default()),
                    )
                })
                .collect()
        };
        let index: Vec<IndexEntry> =
            pairs(&idx).into_iter().map(|(offset, position)| IndexEntry { offset, position }).collect();
        let time_index: Vec<TimeIndexEntry> = pairs(&tidx)
            .into_iter()
            .map(|(ts, offset)| TimeIndexEntry { max_timestamp_ms: ts as i64, offset })
            .collect();
        // The index must describe this log: it starts at the segment's first batch, both
        // indexes mark the same batches, and offsets and positions only grow.
        let starts_here = index.first() == Some(&IndexEntry { offset: self.base_offset, position: 0 });
        let same_points = index.iter().zip(&time_index).all(|(e, t)| e.offset == t.offset);
        let increasing = index.windows(2).all(|w| w[0].offset < w[1].offset && w[0].position < w[1].position);
        let Some(last) = index.last().copied() else { return Ok(None) };
        if !starts_here || !same_points || !increasing || last.position >= len {
            return Ok(None);
        }
        // The last indexed batch and those after it give the end offset and timestamps.
        let mut max_ts = time_index.last().map_or(i64::MIN, |t| t.max_timestamp_ms);
        let mut position = last.position;
        let mut next = last.offset;
        while position < len {
            let Ok(batch) = self.read_batch_at(position, len) else { return Ok(None) };
            if batch.base_offset() != next {
                return Ok(None);
            }
            next = batch.last_offset() + 1;
            max_ts = max_ts.max(batch.max_timestamp());
            position += batch.len_bytes() as u64;
        }
        *write_lock(&self.index) = index;
        *write_lock(&self.time_index) = time_index;
        self.size_bytes = len;
        self.allocated_bytes = len;
        self.synced_bytes = len;
        self.next_offset = next;
        self.last_indexed_position = Some(last.position);
        // Exact counts and the minimum timestamp are in metadata; here only the bounds matter.
        self.record_count = next - self.base_offset;
        self.max_timestamp_ms = Some(max_ts);
        Ok(Some(()))
    }

    /// A lock-free snapshot for readers, bounded by `durable_size` bytes.
    pub fn view(&self, durable_size: u64, end_offset: u64) -> SegmentView {
        SegmentView {
            base_offset: self.base_offset,
            end_offset,
            size_bytes: durable_size,
            file: Arc::clone(&self.file),
            index: Arc::clone(&self.index),
            time_index: Arc::clone(&self.time_index),
        }
    }

    /// First offset.
    pub fn base_offset(&self) -> u64 {
        self.base_offset
    }
    /// Offset the next batch gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }
    /// Bytes written.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// Records written.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }
    /// Smallest record timestamp.
    pub fn min_timestamp_ms(&self) -> Option<i64> {
        self.min_timestamp_ms
    }
    /// Largest record timestamp.
    pub fn max_timestamp_ms(&self) -> Option<i64> {
        self.max_timestamp_ms
    }
    /// Byte ranges that failed their CRC at recovery.
    pub fn corrupt_ranges(&self) -> &[(u64, u64)] {
        &self.corrupt_ranges
    }
    /// Path of the log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The epoch stamped on the segment's first batch (every batch of a segment carries the
    /// epoch it was opened under), or `None` if it holds none.
    pub fn first_epoch(&self) -> Result<Option<i32>, StoreError> {
        if self.size_bytes == 0 {
            return Ok(None);
        }
        // A failed read or a damaged batch is a storage error (a writer takes it for a failing
        // disk), never a retry.
        let batch = self.read_batch(0, self.size_bytes)?;
        Ok(Some(batch.partition_leader_epoch()))
    }

    /// Cuts the segment back to `end_offset`, which must be a batch boundary: the records from
    /// there on were never acknowledged (recovery sealed the segment shorter, or another
    /// writer's segment took these offsets). Returns the segment as reopened from disk; it is
    /// sealed again (index files) if `sealed`.
    pub fn truncated(self, end_offset: u64, sealed: bool) -> Result<Segment, StoreError> {
        if end_offset >= self.next_offset {
            return Ok(self);
        }
        let view = self.view(self.size_bytes, self.next_offset);
        let mut at = view.entry_for(end_offset.max(self.base_offset));
        while at.offset < end_offset {
            let batch = self.read_batch(at.position, self.size_bytes)?;
            if batch.next_offset() > end_offset {
                return Err(StoreError::Failed(format!(
                    "{}: offset {end_offset} is inside the batch {}..={}, not at a batch boundary",
                    self.path.display(),
                    batch.base_offset(),
                    batch.last_offset()
                )));
            }
            at = IndexEntry { offset: batch.next_offset(), position: at.position + batch.len_bytes() as u64 };
        }
        warn!(
            path = %self.path.display(),
            from = end_offset,
            to = self.next_offset,
            "truncating records that were never acknowledged"
        );
        for p in [self.path.with_extension("index"), self.path.with_extension("timeindex")] {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&p, "remove", e)),
            }
        }
        crate::log::disk::set_len(&self.file, &self.path, at.position)
            .map_err(|e| StoreError::io(&self.path, "truncate", e))?;
        crate::log::disk::sync_all(&self.file, &self.path)
            .map_err(|e| StoreError::FsyncFailed { path: self.path.clone(), source: e })?;
        // Synced up to the cut: whatever is bad in it is damage, not a torn group.
        let (mut segment, _) = Segment::open_with(&self.path, self.base_offset, false, Tail::Synced)?;
        if sealed {
            segment.seal()?;
        }
        Ok(segment)
    }

    /// Deletes the segment's files.
    pub fn delete_files(&self) -> Result<(), StoreError> {
        for p in [self.path.clone(), self.path.with_extension("index"), self.path.with_extension("timeindex")]
        {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&p, "remove", e)),
            }
        }
        Ok(())
    }
}

impl SegmentView {
    /// Where to start reading to find `offset`: the last index entry at or before it, or the
    /// segment's first batch.
    pub fn entry_for(&self, offset: u64) -> IndexEntry {
        let index = read_lock(&self.index);
        let i = index.partition_point(|e| e.offset <= offset);
        match i.checked_sub(1) {
            Some(last) => index[last],
            None => IndexEntry { offset: self.base_offset, position: 0 },
        }
    }

    /// Where to start scanning for the first record with timestamp >= `ts`.
    pub fn entry_for_time(&self, ts: i64) -> IndexEntry {
        // Entries before the first one whose preceding max timestamp reaches `ts` cannot hold it.
        let offset = {
            let time_index = read_lock(&self.time_index);
            let i = time_index.partition_point(|e| e.max_timestamp_ms < ts);
            match i.checked_sub(1) {
                Some(last) => time_index[last].offset,
                None => return IndexEntry { offset: self.base_offset, position: 0 },
            }
        };
        self.entry_for(offset)
    }

    /// Reads whole batches from `start`, a batch boundary whose first offset is known, up to
    /// `max_bytes` (at least one batch) within the readable size. Every batch's CRC and offset
    /// are checked; a bad batch is never served. If it comes after good ones, those are
    /// returned and the read that starts at the bad batch gets the error.
    pub fn read_batches(&self, start: IndexEntry, max_bytes: usize) -> Result<Vec<RecordBatch>, StoreError> {
        self.read_batches_from(start, start.offset, max_bytes, ReadMode::MayBlock)
    }

    /// Like [`SegmentView::read_batches`], for the batches that hold offsets from `from` on:
    /// batches between `start` and the one holding `from` are stepped over by their headers
    /// (neither returned nor checked beyond their offsets). The file is read in chunks of at
    /// least [`READ_CHUNK_BYTES`], and the batches returned are slices of them. With
    /// [`ReadMode::CachedOnly`], a read that would wait for the disk ends the batches there, or
    /// fails with [`StoreError::NotCached`] if there are none yet (also when the first batch
    /// is larger than `max_bytes`).
    pub fn read_batches_from(
        &self,
        start: IndexEntry,
        from: u64,
        max_bytes: usize,
        mode: ReadMode,
    ) -> Result<Vec<RecordBatch>, StoreError> {
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut chunk = Chunk::default();
        let IndexEntry { offset: mut expected, mut position } = start;
        while position < self.size_bytes && (out.is_empty() || total < max_bytes) {
            // The first batch comes whatever its size, except to a read of the page cache
            // only: on a runtime thread, a batch larger than asked for is left to a read that
            // may block (the blocking pool).
            let room = match (out.is_empty(), mode) {
                (true, ReadMode::MayBlock) => usize::MAX,
                _ => max_bytes - total,
            };
            let want = max_bytes.saturating_sub(total).clamp(READ_CHUNK_BYTES, READ_CHUNK_BYTES_MAX);
            let batch = match self.batch_at(&mut chunk, position, expected, from, room, want, mode) {
                Ok(Found::Batch(batch)) => batch,
                Ok(Found::Before { len, next }) => {
                    position += len as u64;
                    expected = next;
                    continue;
                }
                Ok(Found::TooLarge) if out.is_empty() => return Err(StoreError::NotCached),
                Ok(Found::TooLarge) => break,
                Err(_) if !out.is_empty() => break,
                Err(e) => return Err(e),
            };
            total += batch.len_bytes();
            position += batch.len_bytes() as u64;
            expected = batch.next_offset();
            out.push(batch);
        }
        if out.is_empty() && from < self.end_offset {
            // Stepped over every batch to the end: a header's offsets are damaged.
            return Err(StoreError::CorruptRead {
                base_offset: self.base_offset,
                position,
                reason: format!("no batch holds offset {from}, below the segment's end {}", self.end_offset),
            });
        }
        Ok(out)
    }

    /// The batch at `position`, which must start at offset `expected`: stepped over if it ends
    /// before `from`, too large if it is more than `room` bytes.
    #[allow(clippy::too_many_arguments, reason = "one read's cursor and bounds, private")]
    fn batch_at(
        &self,
        chunk: &mut Chunk,
        position: u64,
        expected: u64,
        from: u64,
        room: usize,
        want: usize,
        mode: ReadMode,
    ) -> Result<Found, StoreError> {
        let corrupt =
            |reason: String| StoreError::CorruptRead { base_offset: self.base_offset, position, reason };
        if position + LOG_OVERHEAD as u64 > self.size_bytes {
            return Err(corrupt("incomplete batch header".into()));
        }
        self.fill(chunk, position, LOG_OVERHEAD, want, mode)?;
        let len = peek_batch_len(chunk.at(position)).ok_or_else(|| corrupt("invalid batch length".into()))?;
        if len > BATCH_BYTES_MAX || position + len as u64 > self.size_bytes {
            return Err(corrupt(format!("batch of {len} bytes runs past the end of the segment")));
        }
        // A batch length is at least a whole header: its offsets are there.
        self.fill(chunk, position, BATCH_HEADER_BYTES, want, mode)?;
        let head = chunk.at(position);
        let base = peek_base_offset(head);
        if base != Some(expected) {
            return Err(corrupt(format!(
                "batch starts at offset {base:?} but offset {expected} was expected"
            )));
        }
        let last = peek_last_offset(head).ok_or_else(|| corrupt("invalid last offset delta".into()))?;
        if last < from {
            return Ok(Found::Before { len, next: last + 1 });
        }
        if len > room {
            return Ok(Found::TooLarge);
        }
        self.fill(chunk, position, len, want, mode)?;
        let at = (position - chunk.at) as usize;
        let batch =
            RecordBatch::parse(chunk.bytes.slice(at..at + len)).map_err(|e| corrupt(e.to_string()))?;
        Ok(Found::Batch(batch))
    }

    /// Makes `chunk` hold the file's bytes `position..position + need` (within the readable
    /// size), reading `want` bytes or more at once and keeping what it held of them.
    fn fill(
        &self,
        chunk: &mut Chunk,
        position: u64,
        need: usize,
        want: usize,
        mode: ReadMode,
    ) -> Result<(), StoreError> {
        let held_end = chunk.at + chunk.bytes.len() as u64;
        if position >= chunk.at && position + need as u64 <= held_end {
            return Ok(());
        }
        let len = need.max(want).min((self.size_bytes - position) as usize);
        let mut buf = BytesMut::zeroed(len);
        let kept = if (chunk.at..held_end).contains(&position) {
            let tail = &chunk.bytes[(position - chunk.at) as usize..];
            buf[..tail.len()].copy_from_slice(tail);
            tail.len()
        } else {
            0
        };
        let read = read_at_least(
            &self.file,
            &mut buf[kept..],
            position + kept as u64,
            need.saturating_sub(kept),
            mode,
        )?;
        buf.truncate(kept + read);
        *chunk = Chunk { at: position, bytes: buf.freeze() };
        Ok(())
    }
}

/// Whether a read may wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Reads wait for the disk as needed (on the blocking pool).
    MayBlock,
    /// Reads only what the page cache holds (`preadv2` with `RWF_NOWAIT`): a runtime thread can
    /// serve the hot tail itself instead of handing the read to the blocking pool, and a read
    /// that would wait for the disk fails with [`StoreError::NotCached`] instead.
    CachedOnly,
}

/// Bytes a segment read fetches from the file at once, at least: the skip from an index entry
/// to the offset asked for (at most [`INDEX_INTERVAL_BYTES`]) and small batches after it take
/// one read.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// And at most, unless one batch is larger.
const READ_CHUNK_BYTES_MAX: usize = 1024 * 1024;

/// Bytes of a segment file in memory, from file position `at`.
#[derive(Default)]
struct Chunk {
    at: u64,
    bytes: Bytes,
}

impl Chunk {
    /// The bytes from file position `position` on; the caller filled them.
    fn at(&self, position: u64) -> &[u8] {
        &self.bytes[(position - self.at) as usize..]
    }
}

/// What a read found at a batch boundary.
enum Found {
    Batch(RecordBatch),
    /// A batch of `len` bytes before the offset asked for; the next one starts at `next`.
    Before {
        len: usize,
        next: u64,
    },
    /// A batch larger than the room left.
    TooLarge,
}

/// Reads into `buf` from `file` at `position`: all of it, or with [`ReadMode::CachedOnly`] what
/// the page cache holds of it, which must be `min` bytes at least. Returns the bytes read.
fn read_at_least(
    file: &File,
    buf: &mut [u8],
    position: u64,
    min: usize,
    mode: ReadMode,
) -> Result<usize, StoreError> {
    if mode == ReadMode::MayBlock {
        file.read_exact_at(buf, position).map_err(StoreError::io_read)?;
        return Ok(buf.len());
    }
    let mut read = 0;
    while read < buf.len() {
        let flags = rustix::io::ReadWriteFlags::NOWAIT;
        let at = position + read as u64;
        match rustix::io::preadv2(file, &mut [io::IoSliceMut::new(&mut buf[read..])], at, flags) {
            Ok(0) => return Err(StoreError::io_read(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => read += n,
            Err(rustix::io::Errno::INTR) => {}
            // The rest is not in the page cache (or the kernel or filesystem has no RWF_NOWAIT).
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => break,
            Err(e) => return Err(StoreError::io_read(e.into())),
        }
    }
    if read < min {
        return Err(StoreError::NotCached);
    }
    Ok(read)
}

/// Writes `data` and its CRC-32C to `path` through a temporary file and a rename, so that the
/// file is whole or absent to a reader; not fsynced (see [`Segment::seal`]).
fn write_with_crc(path: &Path, mut data: Vec<u8>) -> Result<(), StoreError> {
    let crc = crc32c::crc32c(&data);
    data.extend_from_slice(&crc.to_be_bytes());
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, &data).map_err(|e| StoreError::io(&tmp, "write", e))?;
    fs::rename(&tmp, path).map_err(|e| StoreError::io(path, "rename", e))
}

fn read_with_crc(path: &Path) -> Option<Vec<u8>> {
    let mut data = fs::read(path).ok()?;
    if data.len() < 4 {
        return None;
    }
    let tail = data.split_off(data.len() - 4);
    let stored = u32::from_be_bytes(tail.try_into().ok()?);
    (crc32c::crc32c(&data) == stored).then_some(data)
}

/// Fsyncs a directory so that created, renamed and removed entries are durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| crate::log::disk::sync_all(&d, dir))
        .map_err(|e| StoreError::FsyncFailed { path: dir.to_path_buf(), source: e })
}

/// Smallest and largest timestamp of a batch as its header states them.
pub fn timestamp_range(batch: &RecordBatch) -> (i64, i64) {
    (batch.base_timestamp().min(batch.max_timestamp()), batch.max_timestamp())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use bytes::Bytes;
    use silt_record::{encode_batch, Header, NewRecord};

    use super::*;

    /// A batch of `records` records at `base`, each with a `value_bytes` value.
    fn batch(base: u64, records: u64, value_bytes: usize) -> RecordBatch {
        let records: Vec<NewRecord> = (base..base + records)
            .map(|o| NewRecord {
                timestamp_ms: 1_000 + o as i64,
                key: Some(Bytes::from(format!("key-{o}"))),
                value: Some(Bytes::from(vec![o as u8; value_bytes])),
                headers: vec![Header { key: "h".into(), value: Some(Bytes::from(format!("{o}"))) }],
            })
            .collect();
        RecordBatch::parse(encode_batch(&records).unwrap()).unwrap().with_offsets(base, 1)
    }

    /// Everything recovery derives from a sealed segment's files.
    type Derived = (u64, u64, u64, Option<i64>, Vec<IndexEntry>, Vec<TimeIndexEntry>);

    fn derived(s: &Segment) -> Derived {
        (
            s.next_offset(),
            s.size_bytes(),
            s.record_count(),
            s.max_timestamp_ms(),
            read_lock(&s.index).clone(),
            read_lock(&s.time_index).clone(),
        )
    }

    /// Every batch of the segment, read through its view from the start.
    fn read_all(s: &Segment) -> Vec<RecordBatch> {
        let view = s.view(s.size_bytes(), s.next_offset());
        view.read_batches(IndexEntry { offset: s.base_offset(), position: 0 }, usize::MAX).unwrap()
    }

    /// A sealed segment at base 100 whose batches span several index intervals.
    fn sealed_segment(dir: &Path) -> (PathBuf, Vec<RecordBatch>) {
        let mut segment = Segment::create(dir, 100).unwrap();
        let mut written = Vec::new();
        for _ in 0..40 {
            let b = batch(segment.next_offset(), 3, 200);
            segment.append(&b).unwrap();
            written.push(b);
        }
        segment.seal().unwrap();
        (segment.path().to_path_buf(), written)
    }

    /// Drops the pages of `file` from `from` on out of the page cache (they are clean: synced).
    fn evict(file: &File, from: u64) {
        rustix::fs::fadvise(file, from, None, rustix::fs::Advice::DontNeed).unwrap();
    }

    #[test]
    fn reads_step_over_earlier_batches_and_read_only_the_page_cache_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sealed_segment(dir.path());
        let (segment, _) = Segment::open(&path, 100, true).unwrap();
        let view = segment.view(segment.size_bytes(), segment.next_offset());
        let from_on = |from: u64| -> Vec<RecordBatch> {
            written.iter().filter(|b| b.last_offset() >= from).cloned().collect()
        };
        for from in [100, 101, 150, 152, 153, 219] {
            let start = view.entry_for(from);
            assert!(start.offset < from || from == 100, "the read starts before the batch holding {from}");
            for mode in [ReadMode::MayBlock, ReadMode::CachedOnly] {
                let got = view.read_batches_from(start, from, usize::MAX, mode).unwrap();
                assert_eq!(got, from_on(from), "from {from}, {mode:?}");
                // One batch at least (asked for fewer bytes, a read of the page cache only
                // leaves it to one that may block), then whole batches up to the bytes asked for.
                let got = view.read_batches_from(start, from, 1, mode);
                match mode {
                    ReadMode::MayBlock => assert_eq!(got.unwrap(), from_on(from)[..1], "from {from}"),
                    ReadMode::CachedOnly => assert!(matches!(got, Err(StoreError::NotCached)), "{got:?}"),
                }
                let one = from_on(from)[0].len_bytes();
                let got = view.read_batches_from(start, from, one, mode).unwrap();
                assert_eq!(got, from_on(from)[..1], "from {from}, {mode:?}");
                let two = from_on(from).iter().take(2).map(RecordBatch::len_bytes).sum::<usize>();
                let got = view.read_batches_from(start, from, two, mode).unwrap();
                assert_eq!(got, from_on(from)[..2.min(from_on(from).len())], "from {from}, {mode:?}");
            }
        }

        // Out of the page cache: a read of the page cache only says the disk is needed (the
        // kernel starts reading the pages in, so only its first answer is certain); a read that
        // may wait reads everything, and then the page cache serves it again.
        // Dropping pages is advice: a kernel busy writing back other files may keep them for
        // a while, so a read that still found everything cached is tried again (for 10 s).
        let (mut attempts, deadline) = (0, std::time::Instant::now() + std::time::Duration::from_secs(10));
        let err = loop {
            evict(&view.file, 0);
            let r = view.read_batches_from(view.entry_for(150), 150, usize::MAX, ReadMode::CachedOnly);
            attempts += 1;
            if r.is_err() || std::time::Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(matches!(err, Err(StoreError::NotCached)), "{err:?} after {attempts} attempts");
        let start = IndexEntry { offset: 100, position: 0 };
        assert_eq!(view.read_batches_from(start, 100, usize::MAX, ReadMode::MayBlock).unwrap(), written);
        assert_eq!(view.read_batches_from(start, 100, usize::MAX, ReadMode::CachedOnly).unwrap(), written);
    }

    #[test]
    fn reads_across_many_chunks_return_every_batch_once_in_order() {
        // About 600 KiB of 5 KiB batches with one of 1.5 MiB in the middle: reads refill
        // their chunk many times, keep the tail of one chunk in the next, and meet batches
        // that run past a chunk's end or are larger than the largest chunk.
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 0).unwrap();
        let mut written = Vec::new();
        for i in 0..120u64 {
            let value_bytes = if i == 60 { 1536 * 1024 } else { 5000 + (i as usize * 37) % 900 };
            let b = batch(segment.next_offset(), 1 + i % 3, value_bytes / (1 + i as usize % 3));
            segment.append(&b).unwrap();
            written.push(b);
        }
        segment.sync().unwrap();
        let view = segment.view(segment.size_bytes(), segment.next_offset());
        let end = segment.next_offset();
        for max_bytes in [1, 7000, 64 * 1024, 300 * 1024, usize::MAX] {
            for mode in [ReadMode::MayBlock, ReadMode::CachedOnly] {
                let mut next = 0;
                let mut got = Vec::new();
                while next < end {
                    let batches = match view.read_batches_from(view.entry_for(next), next, max_bytes, mode) {
                        Ok(batches) => batches,
                        // Larger than asked for: left to a read that may block.
                        Err(StoreError::NotCached) if mode == ReadMode::CachedOnly => view
                            .read_batches_from(view.entry_for(next), next, max_bytes, ReadMode::MayBlock)
                            .unwrap(),
                        Err(e) => panic!("{max_bytes} {mode:?} at {next}: {e}"),
                    };
                    let first = batches.first().expect("a batch");
                    assert!(first.base_offset() <= next && next <= first.last_offset(), "at {next}");
                    let bytes: usize = batches.iter().map(RecordBatch::len_bytes).sum();
                    assert!(batches.len() == 1 || bytes <= max_bytes, "{bytes} > {max_bytes}");
                    next = batches.last().unwrap().next_offset();
                    got.extend(batches);
                }
                assert_eq!(got, written, "max_bytes {max_bytes}, {mode:?}");
            }
        }
        // From the middle of every batch, too.
        for b in &written {
            let from = b.last_offset();
            let got = view.read_batches_from(view.entry_for(from), from, 20_000, ReadMode::MayBlock).unwrap();
            assert_eq!(got.first(), Some(b));
        }
    }

    #[test]
    fn small_appends_go_into_zero_filled_space_that_a_seal_or_a_restart_cuts_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 0).unwrap();
        let file_len = |s: &Segment| fs::metadata(s.path()).unwrap().len();
        let mut written = Vec::new();
        let mut grew = 0;
        for _ in 0..200 {
            let b = batch(segment.next_offset(), 2, 300);
            segment.append(&b).unwrap();
            written.push(b);
            let before = file_len(&segment);
            segment.sync_appends().unwrap();
            let after = file_len(&segment);
            assert!(after >= segment.size_bytes(), "the data is in the file");
            assert!(after - segment.size_bytes() <= PREALLOCATE_BYTES_MAX, "{after} bytes of file");
            if after != before {
                grew += 1;
            }
        }
        // Most syncs found the file already long enough: their appends overwrote zeros.
        assert!(grew <= 20, "the file grew at {grew} of 200 syncs");
        assert!(file_len(&segment) > segment.size_bytes());
        assert_eq!(read_all(&segment), written);

        // A group larger than a quarter of the space ahead appends without zeros after it.
        let b = batch(segment.next_offset(), 1, 2 * PREALLOCATE_BYTES_MAX as usize);
        segment.append(&b).unwrap();
        written.push(b);
        segment.sync_appends().unwrap();
        assert_eq!(file_len(&segment), segment.size_bytes());

        // A crash after zeros were written ahead: the restart drops them and reports them as
        // such (not as a torn write), and appends continue where the data ends.
        for _ in 0..3 {
            let b = batch(segment.next_offset(), 2, 300);
            segment.append(&b).unwrap();
            written.push(b);
            segment.sync_appends().unwrap();
        }
        let (path, size) = (segment.path().to_path_buf(), segment.size_bytes());
        let zeros = file_len(&segment) - size;
        assert!(zeros > 0);
        drop(segment);
        let (mut segment, report) = Segment::open(&path, 0, false).unwrap();
        assert_eq!((report.valid_bytes, report.truncated_bytes, report.preallocated_bytes), (size, 0, zeros));
        assert_eq!(file_len(&segment), size);
        assert_eq!(read_all(&segment), written);
        let b = batch(segment.next_offset(), 2, 300);
        segment.append(&b).unwrap();
        written.push(b);
        segment.sync_appends().unwrap();
        assert!(file_len(&segment) > segment.size_bytes());

        // A seal leaves the file exactly as long as its data, and it loads from its indexes.
        segment.seal().unwrap();
        assert_eq!(file_len(&segment), segment.size_bytes());
        let (sealed, report) = Segment::open(&path, 0, true).unwrap();
        assert!(report.from_index_files);
        assert_eq!(read_all(&sealed), written);
    }

    #[test]
    fn a_group_a_crash_left_with_a_gap_is_cut_from_the_open_segment_and_is_damage_in_a_sealed_one() {
        // A crash during the fdatasync of a group of two batches written into the zeros: the
        // second batch reached the disk, and one sector of the first did not (it holds what it
        // held before: the synced data, then zeros). Each case picks where the synced data
        // ends (`synced`) relative to the first batch's length (`first`).
        type Case = (&'static str, fn(u64, u64) -> bool, fn(u64, u64) -> (u64, u64));
        let cases: [Case; 3] = [
            (
                "a whole sector",
                |synced, _| (64..=448).contains(&(synced % 512)),
                |synced, _| (synced.div_ceil(512) * 512, 512),
            ),
            (
                "the rest of the sector shared with the synced data",
                |synced, _| (64..=448).contains(&(synced % 512)),
                |synced, _| (synced, 512 - synced % 512),
            ),
            (
                "the sector holding the end of the first batch and the start of the second",
                |synced, first| (505..=511).contains(&((synced + first) % 512)),
                |synced, first| ((synced + first) / 512 * 512, 512),
            ),
        ];
        for (what, fits, gap) in cases {
            let dir = tempfile::tempdir().unwrap();
            let mut segment = Segment::create(dir.path(), 0).unwrap();
            // Groups of one small batch, until zeros are written ahead and the case fits.
            let mut acked = Vec::new();
            loop {
                let ahead = fs::metadata(segment.path()).unwrap().len() > segment.size_bytes();
                let first = batch(segment.next_offset(), 2, 700).len_bytes() as u64;
                if ahead && fits(segment.size_bytes(), first) {
                    break;
                }
                let b = batch(segment.next_offset(), 1, 100 + acked.len() % 7);
                segment.append(&b).unwrap();
                acked.push(b);
                segment.sync_appends().unwrap();
                assert!(acked.len() < 2000, "{what}: no fitting place");
            }
            let synced = segment.size_bytes();
            let end = segment.next_offset();
            for _ in 0..2 {
                segment.append(&batch(segment.next_offset(), 2, 700)).unwrap();
            }
            let path = segment.path().to_path_buf();
            drop(segment);
            let (at, len) = gap(synced, batch(end, 2, 700).len_bytes() as u64);
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(&vec![0; len as usize], at).unwrap();
            drop(file);

            // Taken as sealed (synced whole before it was sealed), the gap is damage in the
            // middle: reported, never served, and the batch after it kept.
            let (sealed, report) = Segment::open(&path, 0, true).unwrap();
            assert_eq!(report.corrupt_ranges.len(), 1, "{what}: {report:?}");
            assert_eq!(report.corrupt_ranges[0].0, synced, "{what}");
            assert_eq!(sealed.next_offset(), end + 4, "{what}");
            drop(sealed);
            // As the last segment it is the torn last group: cut, with everything after it.
            let (open, report) = Segment::open(&path, 0, false).unwrap();
            assert!(report.corrupt_ranges.is_empty(), "{what}: {report:?}");
            assert_eq!(report.valid_bytes, synced, "{what}");
            assert!(report.truncated_bytes > 0, "{what}");
            assert_eq!(fs::metadata(&path).unwrap().len(), synced, "{what}");
            assert_eq!(open.next_offset(), end, "{what}");
            assert_eq!(read_all(&open), acked, "{what}");
        }
    }

    #[test]
    fn damage_with_more_than_a_group_after_it_is_never_taken_for_a_torn_group() {
        // A batch of zeros (a sector of them) early in the last segment, then more than any
        // group holds: a bit flip in it is damage, and every batch after it stays.
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 0).unwrap();
        let zeros = RecordBatch::parse(
            encode_batch(&[NewRecord {
                timestamp_ms: 1,
                key: None,
                value: Some(Bytes::from(vec![0; 4096])),
                headers: vec![],
            }])
            .unwrap(),
        )
        .unwrap()
        .with_offsets(0, 1);
        segment.append(&zeros).unwrap();
        let group_max = GROUP_BYTES_MAX.max(REPLICA_READ_BYTES_MAX) as u64;
        while segment.size_bytes() <= group_max + 4 * 1024 * 1024 {
            segment.append(&batch(segment.next_offset(), 1, 4 * 1024 * 1024)).unwrap();
        }
        segment.sync_appends().unwrap();
        let (path, end) = (segment.path().to_path_buf(), segment.next_offset());
        drop(segment);
        // The flip, in the batch's CRC-covered bytes after its zeros.
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let at = zeros.len_bytes() as u64 - 1;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 1], at).unwrap();
        drop(file);
        let (open, report) = Segment::open(&path, 0, false).unwrap();
        assert_eq!(report.corrupt_ranges, vec![(0, zeros.len_bytes() as u64)]);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(open.next_offset(), end);
    }

    #[test]
    fn a_damaged_last_offset_is_an_error_not_an_empty_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 100).unwrap();
        let mut written = Vec::new();
        for _ in 0..10 {
            let b = batch(segment.next_offset(), 3, 200);
            segment.append(&b).unwrap();
            written.push(b);
        }
        segment.sync().unwrap();
        // On disk, the last batch's lastOffsetDelta (bytes 23..27 of its header) turns from 2
        // to 0 (bit rot, after the segment was written and indexed).
        let last_at: usize = written[..written.len() - 1].iter().map(RecordBatch::len_bytes).sum();
        let file = OpenOptions::new().write(true).open(segment.path()).unwrap();
        file.write_all_at(&0i32.to_be_bytes(), last_at as u64 + 23).unwrap();
        let view = segment.view(segment.size_bytes(), segment.next_offset());
        let from = written.last().unwrap().last_offset();
        let read = view.read_batches_from(view.entry_for(from), from, usize::MAX, ReadMode::MayBlock);
        assert!(matches!(read, Err(StoreError::CorruptRead { .. })), "{read:?}");
    }

    #[test]
    fn sealed_segment_loads_from_index_files_or_rebuilds_them_identically() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sealed_segment(dir.path());
        let (loaded, report) = Segment::open(&path, 100, true).unwrap();
        assert!(report.from_index_files);
        assert!(read_lock(&loaded.index).len() > 3, "the test needs several index entries");
        assert_eq!(read_all(&loaded), written);
        let expected = derived(&loaded);
        assert_eq!(expected.0, 220);

        let index = path.with_extension("index");
        let timeindex = path.with_extension("timeindex");
        let (index_bytes, timeindex_bytes) = (fs::read(&index).unwrap(), fs::read(&timeindex).unwrap());
        let entries = &index_bytes[..index_bytes.len() - 4];
        // Checksummed and well formed, but the last entry points into the middle of a batch.
        let mut off_boundary = entries.to_vec();
        let last_position_at = off_boundary.len() - 8;
        let last_position = u64::from_be_bytes(off_boundary[last_position_at..].try_into().unwrap());
        off_boundary[last_position_at..].copy_from_slice(&(last_position + 1).to_be_bytes());
        type Damage<'a> = Box<dyn Fn() + 'a>;
        let damage: [(&str, Damage); 6] = [
            ("index deleted", Box::new(|| fs::remove_file(&index).unwrap())),
            ("time index deleted", Box::new(|| fs::remove_file(&timeindex).unwrap())),
            (
                "index bit flip",
                Box::new(|| {
                    let mut b = index_bytes.clone();
                    b[5] ^= 0x10;
                    fs::write(&index, b).unwrap();
                }),
            ),
            ("time index truncated", Box::new(|| fs::write(&timeindex, &timeindex_bytes[..20]).unwrap())),
            ("index empty", Box::new(|| fs::write(&index, b"").unwrap())),
            (
                "index off a batch boundary",
                Box::new(|| write_with_crc(&index, off_boundary.clone()).unwrap()),
            ),
        ];
        for (what, damage) in damage {
            fs::write(&index, &index_bytes).unwrap();
            fs::write(&timeindex, &timeindex_bytes).unwrap();
            damage();
            let (rebuilt, report) = Segment::open(&path, 100, true).unwrap();
            assert!(!report.from_index_files, "{what}");
            assert_eq!(report.truncated_bytes, 0, "{what}");
            assert!(report.corrupt_ranges.is_empty(), "{what}");
            assert_eq!(derived(&rebuilt), expected, "{what}");
            assert_eq!(read_all(&rebuilt), written, "{what}");
        }
    }

    #[test]
    fn batch_at_a_wrong_offset_is_a_corrupt_range_not_a_failed_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 0).unwrap();
        let mut positions = Vec::new();
        for _ in 0..5 {
            positions.push(segment.size_bytes());
            segment.append(&batch(segment.next_offset(), 4, 50)).unwrap();
        }
        segment.sync().unwrap();
        let path = segment.path().to_path_buf();
        let end = segment.size_bytes();
        drop(segment);
        // `baseOffset` (bytes 0..8) is outside the CRC: batch 2 still passes it, claiming 9..12.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[9], positions[2] + 7).unwrap();
        drop(file);

        let (segment, report) = Segment::open(&path, 0, false).unwrap();
        assert_eq!(report.corrupt_ranges, vec![(positions[2], positions[3])]);
        assert_eq!((report.valid_bytes, report.truncated_bytes), (end, 0));
        assert_eq!(segment.next_offset(), 20);
        let view = segment.view(segment.size_bytes(), segment.next_offset());
        // Reading from before the damage returns the good batches and stops there.
        let before = view.read_batches(view.entry_for(0), usize::MAX).unwrap();
        assert_eq!(before.iter().map(RecordBatch::base_offset).collect::<Vec<_>>(), vec![0, 4]);
        let at = IndexEntry { offset: 8, position: positions[2] };
        assert!(matches!(view.read_batches(at, usize::MAX), Err(StoreError::CorruptRead { .. })));
        // The first good batch after the damage is indexed, so later offsets stay reachable.
        assert_eq!(view.entry_for(12), IndexEntry { offset: 12, position: positions[3] });
        let after = view.read_batches(view.entry_for(13), usize::MAX).unwrap();
        assert_eq!(after.iter().map(RecordBatch::base_offset).collect::<Vec<_>>(), vec![12, 16]);
    }

    #[test]
    fn entries_for_offsets_and_times_never_start_after_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sealed_segment(dir.path());
        let (segment, _) = Segment::open(&path, 100, true).unwrap();
        let view = segment.view(segment.size_bytes(), segment.next_offset());
        let mut position = 0;
        for b in &written {
            for offset in b.base_offset()..=b.last_offset() {
                let entry = view.entry_for(offset);
                assert!(entry.offset <= b.base_offset() && entry.position <= position, "offset {offset}");
                for r in b.records().filter(|r| r.offset == offset) {
                    let entry = view.entry_for_time(r.timestamp_ms);
                    assert!(entry.offset <= offset, "timestamp of offset {offset}");
                }
            }
            position += b.len_bytes() as u64;
        }
    }
}
