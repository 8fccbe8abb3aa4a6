//! [`LogStore`]: the durable Raft log (entries, vote, committed and purged log ids) in plain
//! files, implementing openraft's [`RaftLogStorage`] and [`RaftLogReader`].
//!
//! # Layout of the directory
//! Every file holds frames: `len: u32 LE | crc: u32 LE | payload`, where `crc` is the CRC-32C of
//! the length bytes and the payload.
//! - `vote`, `committed`, `purged`: one frame each, holding the JSON of the vote, of the last
//!   committed log id and of the last purged log id. Each is replaced atomically (write
//!   `<name>.tmp`, fsync, rename, fsync the directory).
//! - `<seq>.log` (`seq` is a 20-digit sequence number): segments of the log. Each holds frames,
//!   one per entry, with the entry's JSON. Only the last segment, the active one, is appended to;
//!   a new one starts once it reaches [`LogStoreOptions::segment_bytes_max`]. [`purge`] deletes
//!   whole segments, so the log stays bounded by what openraft keeps.
//!
//! # Durability
//! An append is acknowledged (its [`LogFlushed`] callback called) only after `fdatasync` of the
//! active segment. Any I/O error, a failed fsync included, is fatal: the error goes to openraft,
//! which stops the node, and every later write of this store fails without touching the files.
//!
//! # Recovery
//! [`LogStore::open`] scans every segment. A damaged record at the end of the last segment (a
//! crash mid-write, a full disk) is cut off with a warning so the node can always restart. A
//! damaged record followed by a valid one, or in any segment but the last, is corruption: open
//! fails with an error naming the file and the byte offset. Entries are kept in memory, indexed
//! by log index, so reads never touch the disk; openraft keeps the log short by purging what
//! snapshots cover.
//!
//! Blocking file I/O runs on tokio's blocking pool; openraft serializes writes through
//! `&mut self`.
//!
//! [`purge`]: RaftLogStorage::purge
//!
//! Past 800 lines only with its tests: the code is the first 667 lines.

#![allow(
    clippy::result_large_err,
    reason = "openraft's StorageError is large; helpers return it as the trait methods do"
)]

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, OptionalSend, RaftLogReader, StorageIOError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::raft::atomic_file::{self, read_frames, sync_dir, write_atomically};
use crate::raft::frame;
use crate::raft::types::{Entry, LogId, LogState, StorageError, TypeConfig, Vote};

/// Default size at which the active segment is closed and a new one started (8 MiB).
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 8 * 1024 * 1024;
/// Largest encoded entry accepted (64 MiB); a larger length field is damage.
pub const RECORD_BYTES_MAX: usize = 64 * 1024 * 1024;

const VOTE_FILE: &str = "vote";
const COMMITTED_FILE: &str = "committed";
const PURGED_FILE: &str = "purged";
const SEGMENT_SUFFIX: &str = ".log";
const SEGMENT_SEQ_DIGITS: usize = 20;
/// Bound on the small metadata files (vote, committed, purged).
const META_BYTES_MAX: usize = 64 * 1024;

/// Tunables of a [`LogStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStoreOptions {
    /// The active segment is closed once it holds this many bytes; the next append starts a new
    /// one. Purging deletes whole segments, so this is the granularity of space reclamation.
    pub segment_bytes_max: u64,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        Self { segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT }
    }
}

/// The Raft log of one metadata node, durable in a directory. See the [module docs](self).
pub struct LogStore {
    index: Arc<RwLock<LogIndex>>,
    writer: Arc<Mutex<LogWriter>>,
}

/// Reads entries of a [`LogStore`] from its in-memory index; openraft's replication tasks use
/// one each.
#[derive(Clone)]
pub struct LogReader {
    index: Arc<RwLock<LogIndex>>,
}

/// What readers see: entries after the last purged one, and the cached small files.
#[derive(Debug, Default)]
struct LogIndex {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

/// The files; only used from the blocking pool, one operation at a time.
struct LogWriter {
    dir: PathBuf,
    segment_bytes_max: u64,
    /// Oldest first; never empty; the last one is the active segment.
    segments: VecDeque<Segment>,
    /// The active segment, written at its end.
    active: File,
    /// Where each entry after the last purged one starts, for `truncate`.
    positions: BTreeMap<u64, RecordPos>,
    /// Set by the first I/O error; from then on every write fails.
    failed: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    seq: u64,
    len_bytes: u64,
    /// Index of the last record in the file, purged or not; `None` when empty. An upper bound
    /// after a truncation, which is all `purge` needs.
    last_index: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct RecordPos {
    segment_seq: u64,
    offset: u64,
}

/// Entries of one append, encoded: the bytes to write and where each entry starts in them.
struct EncodedBatch {
    bytes: Vec<u8>,
    records: Vec<(u64, u64)>,
    /// Whether the append is fsynced before it is acknowledged: always, but with the
    /// simulator's defect `raft-ack-before-fsync` (see [`crate::sim_bugs`]).
    fsync: bool,
}

impl LogStore {
    /// Opens the log in `dir` with default options, creating it if needed. Blocks on file I/O.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        Self::open_with(dir, LogStoreOptions::default())
    }

    /// Opens the log in `dir`, creating it if needed, and recovers it: a torn last record is cut
    /// off; corruption anywhere else is an `InvalidData` error naming the file and the byte
    /// offset. Blocks on file I/O.
    pub fn open_with(dir: &Path, options: LogStoreOptions) -> io::Result<LogStore> {
        atomic_file::create_dir_all_durably(dir)?;
        atomic_file::remove_tmp_files(dir)?;
        let vote: Option<Vote> = read_meta(dir, VOTE_FILE)?;
        let committed: Option<LogId> = read_meta(dir, COMMITTED_FILE)?;
        let last_purged: Option<LogId> = read_meta(dir, PURGED_FILE)?;

        let mut seqs = list_segments(dir)?;
        if seqs.is_empty() {
            File::options().create_new(true).append(true).open(segment_path(dir, 0))?;
            sync_dir(dir)?;
            seqs.push(0);
        }

        let mut scan = Scan {
            purged_index: last_purged.as_ref().map(|p| p.index),
            last_kept: None,
            entries: BTreeMap::new(),
            positions: BTreeMap::new(),
        };
        let mut segments = VecDeque::with_capacity(seqs.len());
        for (i, &seq) in seqs.iter().enumerate() {
            let is_last = i + 1 == seqs.len();
            segments.push_back(scan.segment(dir, seq, is_last)?);
        }
        let active_seq = seqs.last().copied().unwrap_or_default();
        let active = open_segment(&segment_path(dir, active_seq))?;

        tracing::info!(
            dir = %dir.display(),
            segments = segments.len(),
            entries = scan.entries.len(),
            first_index = ?scan.entries.keys().next(),
            last_index = ?scan.last_kept,
            last_purged = ?last_purged.as_ref().map(|p| p.index),
            "opened the raft log"
        );
        Ok(LogStore {
            index: Arc::new(RwLock::new(LogIndex { entries: scan.entries, last_purged, vote, committed })),
            writer: Arc::new(Mutex::new(LogWriter {
                dir: dir.to_path_buf(),
                segment_bytes_max: options.segment_bytes_max,
                segments,
                active,
                positions: scan.positions,
                failed: None,
            })),
        })
    }

    /// Runs `op` on the files in tokio's blocking pool. An error poisons the writer.
    async fn with_writer<T, F>(&self, op: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut LogWriter) -> io::Result<T> + Send + 'static,
    {
        let writer = Arc::clone(&self.writer);
        crate::runtime::spawn_blocking(move || {
            let mut writer =
                writer.lock().map_err(|_| io::Error::other("the raft log writer panicked earlier"))?;
            writer.guarded(op)
        })
        .await
        .map_err(|e| io::Error::other(format!("the raft log writer task failed: {e}")))?
    }

    fn read_index(&self) -> Result<std::sync::RwLockReadGuard<'_, LogIndex>, StorageError> {
        read_index(&self.index)
    }

    fn write_index(&self) -> Result<std::sync::RwLockWriteGuard<'_, LogIndex>, StorageError> {
        self.index.write().map_err(|_| poisoned_index())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self.read_index()?.range(range))
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(read_index(&self.index)?.range(range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState, StorageError> {
        let index = self.read_index()?;
        let last_log_id = index.entries.values().next_back().map(|e| e.log_id).or(index.last_purged);
        Ok(LogState { last_purged_log_id: index.last_purged, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader { index: Arc::clone(&self.index) }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = encode_meta(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.with_writer(move |w| w.save_meta(VOTE_FILE, &bytes))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.write_index()?.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.read_index()?.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let bytes = encode_meta(&committed).map_err(|e| StorageIOError::write(&e))?;
        // With the defect, what was never fsynced is lost as a power loss would lose it.
        if !crate::sim_bugs::unsynced_log() {
            self.with_writer(move |w| w.save_meta(COMMITTED_FILE, &bytes))
                .await
                .map_err(|e| StorageIOError::write(&e))?;
        }
        self.write_index()?.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_index()?.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = self.read_index()?.new_entries(entries)?;
        if entries.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        let mut batch = encode_batch(&entries).map_err(|e| StorageIOError::write_logs(&e))?;
        if crate::sim_bugs::unsynced_log() {
            batch.fsync =
                entries.iter().any(|e| !matches!(e.payload, crate::raft::types::EntryPayload::Normal(_)));
        }
        if let Err(e) = self.with_writer(move |w| w.append(batch)).await {
            callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(StorageIOError::write_logs(&e).into());
        }
        {
            let mut index = self.write_index()?;
            for entry in entries {
                index.entries.insert(entry.log_id.index, entry);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let since = log_id.index;
        tracing::debug!(since, "truncating the raft log");
        self.with_writer(move |w| w.truncate(since)).await.map_err(|e| StorageIOError::write_logs(&e))?;
        self.write_index()?.entries.split_off(&since);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let already = self.read_index()?.last_purged.is_some_and(|p| p.index >= log_id.index);
        if already {
            return Ok(());
        }
        tracing::debug!(upto = log_id.index, "purging the raft log");
        let bytes = encode_meta(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let upto = log_id.index;
        self.with_writer(move |w| w.purge(upto, &bytes)).await.map_err(|e| StorageIOError::write_logs(&e))?;
        let mut index = self.write_index()?;
        index.last_purged = Some(log_id);
        index.entries = index.entries.split_off(&upto.saturating_add(1));
        Ok(())
    }
}

impl LogIndex {
    fn range(&self, range: impl RangeBounds<u64>) -> Vec<Entry> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Bound::Included(e),
            Bound::Excluded(&e) => Bound::Excluded(e),
            Bound::Unbounded => Bound::Unbounded,
        };
        let empty = match end {
            Bound::Included(e) => start > e,
            Bound::Excluded(e) => start >= e,
            Bound::Unbounded => false,
        };
        if empty {
            return Vec::new();
        }
        self.entries.range((Bound::Included(start), end)).map(|(_, e)| e.clone()).collect()
    }

    /// The entries to store of an append: those after the purge point (earlier ones are
    /// covered by a snapshot and dropped). Refuses entries that would leave a hole or overwrite
    /// without a truncate first: openraft never sends them, and persisting them would leave a
    /// log that does not recover.
    fn new_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<Vec<Entry>, StorageError> {
        let purged = self.last_purged.map(|p| p.index);
        let mut expected = match self.entries.keys().next_back() {
            Some(&last) => Some(last + 1),
            None => purged.map(|p| p + 1),
        };
        let mut kept = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            if purged.is_some_and(|p| index <= p) {
                tracing::debug!(index, "dropping an appended entry at or below the purge point");
                continue;
            }
            if expected.is_some_and(|e| e != index) {
                return Err(StorageIOError::write_logs(AnyError::error(format!(
                    "append of log index {index} where {expected:?} was expected would leave a hole"
                )))
                .into());
            }
            expected = Some(index + 1);
            kept.push(entry);
        }
        Ok(kept)
    }
}

impl LogWriter {
    /// Runs `op` unless an earlier operation failed; remembers the first failure.
    fn guarded<T>(&mut self, op: impl FnOnce(&mut Self) -> io::Result<T>) -> io::Result<T> {
        if let Some(reason) = &self.failed {
            return Err(io::Error::other(format!(
                "the raft log refuses writes after an earlier I/O error: {reason}"
            )));
        }
        op(self).inspect_err(|e| {
            tracing::error!(dir = %self.dir.display(), error = %e, "raft log I/O failed; the log is now read-only");
            self.failed = Some(e.to_string());
        })
    }

    fn save_meta(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        write_atomically(&self.dir, name, bytes)
    }

    fn active_mut(&mut self) -> io::Result<&mut Segment> {
        self.segments.back_mut().ok_or_else(|| io::Error::other("the raft log has no segment"))
    }

    fn append(&mut self, batch: EncodedBatch) -> io::Result<()> {
        let active = *self.active_mut()?;
        if active.len_bytes >= self.segment_bytes_max && active.len_bytes > 0 {
            self.roll()?;
        }
        let active = *self.active_mut()?;
        let path = segment_path(&self.dir, active.seq);
        silt_disk::write_all_at(&self.active, &path, &batch.bytes, active.len_bytes)?;
        if batch.fsync {
            silt_disk::sync_data(&self.active, &path)?;
        }
        let segment = self.active_mut()?;
        let (seq, base) = (segment.seq, segment.len_bytes);
        segment.len_bytes += batch.bytes.len() as u64;
        segment.last_index = batch.records.last().map(|&(index, _)| index).or(segment.last_index);
        for (index, offset) in batch.records {
            self.positions.insert(index, RecordPos { segment_seq: seq, offset: base + offset });
        }
        Ok(())
    }

    /// Starts a new, empty active segment. The current one is already durable: every append
    /// is fsynced before it is acknowledged.
    fn roll(&mut self) -> io::Result<()> {
        let seq = self.active_mut()?.seq + 1;
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).open(segment_path(&self.dir, seq))?;
        sync_dir(&self.dir)?;
        self.segments.push_back(Segment { seq, len_bytes: 0, last_index: None });
        self.active = file;
        tracing::debug!(seq, "started a new raft log segment");
        Ok(())
    }

    /// Cuts the log before entry `since`: deletes later segments, then truncates the file that
    /// holds it at its first byte.
    fn truncate(&mut self, since: u64) -> io::Result<()> {
        let Some((_, &pos)) = self.positions.range(since..).next() else {
            return Ok(());
        };
        let mut removed = false;
        while let Some(last) = self.segments.back().copied() {
            if last.seq <= pos.segment_seq {
                break;
            }
            fs::remove_file(segment_path(&self.dir, last.seq))?;
            self.segments.pop_back();
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        let path = segment_path(&self.dir, pos.segment_seq);
        let file = open_segment(&path)?;
        silt_disk::set_len(&file, &path, pos.offset)?;
        silt_disk::sync_all(&file, &path)?;
        self.active = file;
        let segment = self.active_mut()?;
        if segment.seq != pos.segment_seq {
            return Err(io::Error::other(format!(
                "raft log index points to segment {} but the active segment is {}",
                pos.segment_seq, segment.seq
            )));
        }
        segment.len_bytes = pos.offset;
        segment.last_index = if pos.offset > 0 { since.checked_sub(1) } else { None };
        self.positions.split_off(&since);
        Ok(())
    }

    /// Persists the purge point, then deletes every segment whose records are all purged.
    fn purge(&mut self, upto: u64, purged_bytes: &[u8]) -> io::Result<()> {
        write_atomically(&self.dir, PURGED_FILE, purged_bytes)?;
        self.positions = self.positions.split_off(&upto.saturating_add(1));
        if self.active_mut()?.last_index.is_some_and(|last| last <= upto) {
            self.roll()?;
        }
        let mut removed = 0;
        while self.segments.len() > 1 {
            let Some(first) = self.segments.front().copied() else { break };
            if first.last_index.is_some_and(|last| last > upto) {
                break;
            }
            fs::remove_file(segment_path(&self.dir, first.seq))?;
            self.segments.pop_front();
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
            tracing::debug!(upto, removed, "deleted purged raft log segments");
        }
        Ok(())
    }
}

/// State carried across segments while recovering.
struct Scan {
    purged_index: Option<u64>,
    last_kept: Option<u64>,
    entries: BTreeMap<u64, Entry>,
    positions: BTreeMap<u64, RecordPos>,
}

impl Scan {
    /// Reads one segment into the index; cuts a torn tail off the last one.
    fn segment(&mut self, dir: &Path, seq: u64, is_last: bool) -> io::Result<Segment> {
        let path = segment_path(dir, seq);
        let bytes = fs::read(&path)?;
        let mut segment = Segment { seq, len_bytes: 0, last_index: None };
        let mut offset = 0usize;
        while offset < bytes.len() {
            let (payload, frame_bytes) = match frame::decode(&bytes[offset..], RECORD_BYTES_MAX) {
                Ok(decoded) => decoded,
                Err(e) => {
                    if !is_last {
                        return Err(corrupt(
                            &path,
                            offset,
                            &format!("{e}, in a segment that is not the last"),
                        ));
                    }
                    if let Some(next) = find_valid_record(&bytes, offset + 1) {
                        return Err(corrupt(
                            &path,
                            offset,
                            &format!("{e}, followed by a valid record at byte offset {next}"),
                        ));
                    }
                    tracing::warn!(
                        file = %path.display(),
                        offset,
                        dropped_bytes = bytes.len() - offset,
                        reason = %e,
                        "cutting off a torn record at the end of the raft log (crash or full disk during a write)"
                    );
                    let file = open_segment(&path)?;
                    silt_disk::set_len(&file, &path, offset as u64)?;
                    silt_disk::sync_all(&file, &path)?;
                    break;
                }
            };
            let entry: Entry = serde_json::from_slice(payload)
                .map_err(|e| corrupt(&path, offset, &format!("the record holds no log entry: {e}")))?;
            let index = entry.log_id.index;
            self.add(entry, RecordPos { segment_seq: seq, offset: offset as u64 })
                .map_err(|reason| corrupt(&path, offset, &reason))?;
            segment.last_index = Some(index);
            offset += frame_bytes;
        }
        segment.len_bytes = offset as u64;
        Ok(segment)
    }

    /// Checks that `entry` continues the log and keeps it unless purged.
    fn add(&mut self, entry: Entry, pos: RecordPos) -> Result<(), String> {
        let index = entry.log_id.index;
        if self.purged_index.is_some_and(|p| index <= p) {
            return match self.last_kept {
                Some(kept) => Err(format!("entry {index} (purged) follows entry {kept}")),
                None => Ok(()),
            };
        }
        let expected = match self.last_kept {
            Some(kept) => Some(kept + 1),
            None => self.purged_index.map(|p| p + 1),
        };
        if let Some(expected) = expected.filter(|&e| e != index) {
            return Err(format!("entry {index} where entry {expected} was expected"));
        }
        self.last_kept = Some(index);
        self.positions.insert(index, pos);
        self.entries.insert(index, entry);
        Ok(())
    }
}

/// The offset of the first valid record at or after `start`, if any.
fn find_valid_record(bytes: &[u8], start: usize) -> Option<usize> {
    (start..bytes.len()).find(|&offset| {
        frame::decode(&bytes[offset..], RECORD_BYTES_MAX)
            .is_ok_and(|(payload, _)| serde_json::from_slice::<Entry>(payload).is_ok())
    })
}

fn corrupt(path: &Path, offset: usize, reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "raft log file {} is corrupt at byte offset {offset}: {reason}; refusing to start \
             (restore this node's directory or replace the node)",
            path.display()
        ),
    )
}

/// Opens the segment at `path` to write at its end and to read (the disk seam reads what a
/// write replaces, for power losses in tests).
fn open_segment(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:0width$}{SEGMENT_SUFFIX}", width = SEGMENT_SEQ_DIGITS))
}

/// Sequence numbers of the segments in `dir`, ascending.
fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(SEGMENT_SUFFIX)) else {
            continue;
        };
        if stem.len() == SEGMENT_SEQ_DIGITS && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(seq) = stem.parse() {
                seqs.push(seq);
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

fn encode_batch(entries: &[Entry]) -> io::Result<EncodedBatch> {
    let mut bytes = Vec::new();
    let mut records = Vec::with_capacity(entries.len());
    for entry in entries {
        let json = serde_json::to_vec(entry)?;
        if json.len() > RECORD_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "log entry {} encodes to {} bytes, more than the {RECORD_BYTES_MAX} allowed",
                    entry.log_id.index,
                    json.len()
                ),
            ));
        }
        records.push((entry.log_id.index, bytes.len() as u64));
        frame::encode_into(&mut bytes, &json)?;
    }
    Ok(EncodedBatch { bytes, records, fsync: true })
}

fn encode_meta<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    frame::encode(&serde_json::to_vec(value)?)
}

/// Reads a small file written by [`encode_meta`]; `None` when absent.
fn read_meta<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    let Some(frames) = read_frames(dir, name, META_BYTES_MAX)? else {
        return Ok(None);
    };
    let invalid = |reason: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is damaged: {reason}; refusing to start", dir.join(name).display()),
        )
    };
    match frames.as_slice() {
        [payload] => serde_json::from_slice(payload).map(Some).map_err(|e| invalid(e.to_string())),
        other => Err(invalid(format!("expected one record, found {}", other.len()))),
    }
}

fn read_index(index: &RwLock<LogIndex>) -> Result<std::sync::RwLockReadGuard<'_, LogIndex>, StorageError> {
    index.read().map_err(|_| poisoned_index())
}

fn poisoned_index() -> StorageError {
    StorageIOError::read_logs(AnyError::error("the raft log index lock is poisoned")).into()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::storage::RaftLogStorageExt;
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::raft::types::EntryPayload;
    use crate::state::Command;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(Command::CreateTopic {
                name: format!("topic-{index}"),
                partitions: 1,
                config: BTreeMap::new(),
                now_ms: index,
            }),
        }
    }

    fn entries(term: u64, indexes: impl IntoIterator<Item = u64>) -> Vec<Entry> {
        indexes.into_iter().map(|i| entry(term, i)).collect()
    }

    fn small_segments() -> LogStoreOptions {
        LogStoreOptions { segment_bytes_max: 512 }
    }

    async fn ids(store: &mut LogStore) -> Vec<LogId> {
        store.try_get_log_entries(..).await.unwrap().iter().map(|e| e.log_id).collect()
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        list_segments(dir).unwrap().into_iter().map(|seq| segment_path(dir, seq)).collect()
    }

    /// Byte offsets of the records in a segment file.
    fn record_offsets(path: &Path) -> Vec<usize> {
        let bytes = fs::read(path).unwrap();
        let mut offsets = Vec::new();
        let mut offset = 0;
        while offset < bytes.len() {
            offsets.push(offset);
            offset += frame::decode(&bytes[offset..], RECORD_BYTES_MAX).unwrap().1;
        }
        offsets
    }

    #[tokio::test]
    async fn append_read_truncate_purge_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        assert_eq!(store.get_log_state().await.unwrap(), LogState::default());
        for batch in [0..5, 5..6, 6..20, 20..31] {
            store.blocking_append(entries(1, batch)).await.unwrap();
        }
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
        store.save_committed(Some(log_id(1, 20))).await.unwrap();
        store.truncate(log_id(1, 25)).await.unwrap();
        store.blocking_append(entries(2, 25..28)).await.unwrap();
        let segments_before_purge = segment_files(dir.path()).len();
        store.purge(log_id(1, 10)).await.unwrap();
        assert!(segment_files(dir.path()).len() < segments_before_purge, "purge deletes segments");

        let expected: Vec<LogId> =
            (11..25).map(|i| log_id(1, i)).chain((25..28).map(|i| log_id(2, i))).collect();
        assert_eq!(ids(&mut store).await, expected);
        drop(store);

        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        assert_eq!(ids(&mut store).await, expected);
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 20)));
        assert_eq!(
            store.get_log_state().await.unwrap(),
            LogState { last_purged_log_id: Some(log_id(1, 10)), last_log_id: Some(log_id(2, 27)) }
        );
        let got = store.try_get_log_entries(12..14).await.unwrap();
        assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), [12, 13]);
        assert!(
            matches!(&got[0].payload, EntryPayload::Normal(Command::CreateTopic { name, .. }) if name == "topic-12")
        );

        // Truncating inside an older segment drops the later segments.
        store.truncate(log_id(1, 13)).await.unwrap();
        store.blocking_append(entries(3, 13..15)).await.unwrap();
        drop(store);
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        let expected: Vec<LogId> =
            (11..13).map(|i| log_id(1, i)).chain((13..15).map(|i| log_id(3, i))).collect();
        assert_eq!(ids(&mut store).await, expected);
    }

    #[tokio::test]
    async fn a_power_loss_takes_back_nothing_the_log_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let power = silt_disk::record_unsynced(&dir.path().to_string_lossy());
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        let mut steps = Vec::new();
        for batch in [0..5, 5..6, 6..20, 20..31] {
            store.blocking_append(entries(1, batch.clone())).await.unwrap();
            steps.push((format!("append {batch:?}"), power.unsynced_bytes()));
        }
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
        steps.push(("save the vote".into(), power.unsynced_bytes()));
        store.save_committed(Some(log_id(1, 20))).await.unwrap();
        steps.push(("save the committed log id".into(), power.unsynced_bytes()));
        store.truncate(log_id(1, 25)).await.unwrap();
        steps.push(("truncate".into(), power.unsynced_bytes()));
        store.blocking_append(entries(2, 25..28)).await.unwrap();
        steps.push(("append after the truncation".into(), power.unsynced_bytes()));
        let unsynced: Vec<_> = steps.iter().filter(|(_, bytes)| *bytes > 0).collect();
        assert!(unsynced.is_empty(), "acknowledged with bytes no fsync covered: {unsynced:?}");
        drop(store);

        power.lose_unsynced(0).unwrap();
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        let expected: Vec<LogId> =
            (0..25).map(|i| log_id(1, i)).chain((25..28).map(|i| log_id(2, i))).collect();
        assert_eq!(ids(&mut store).await, expected);
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 20)));
    }

    #[tokio::test]
    async fn purge_keeps_the_log_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        for start in (0..2000).step_by(10) {
            store.blocking_append(entries(1, start..start + 10)).await.unwrap();
            if start >= 100 {
                store.purge(log_id(1, start - 100)).await.unwrap();
            }
        }
        let bytes: u64 = segment_files(dir.path()).iter().map(|p| fs::metadata(p).unwrap().len()).sum();
        assert!(bytes < 40 * 1024, "{bytes} bytes of log for ~110 retained entries");
        drop(store);
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        assert_eq!(ids(&mut store).await, (1891..2000).map(|i| log_id(1, i)).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn purge_past_the_last_entry_then_append() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..6)).await.unwrap();
        store.purge(log_id(2, 20)).await.unwrap();
        assert_eq!(
            store.get_log_state().await.unwrap(),
            LogState { last_purged_log_id: Some(log_id(2, 20)), last_log_id: Some(log_id(2, 20)) }
        );
        store.blocking_append(entries(2, 21..24)).await.unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(ids(&mut store).await, (21..24).map(|i| log_id(2, i)).collect::<Vec<_>>());
    }

    async fn ten_entries(dir: &Path) -> PathBuf {
        let mut store = LogStore::open(dir).unwrap();
        for i in 0..10 {
            store.blocking_append(entries(1, i..i + 1)).await.unwrap();
        }
        let files = segment_files(dir);
        assert_eq!(files.len(), 1);
        files[0].clone()
    }

    #[tokio::test]
    async fn torn_tail_is_cut_off_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = ten_entries(dir.path()).await;
        let intact_bytes = fs::read(&file).unwrap();
        let offsets = record_offsets(&file);

        // A half-written record: its header promises more bytes than were written.
        let mut torn = intact_bytes.clone();
        torn.extend_from_slice(&intact_bytes[offsets[3]..offsets[3] + 20]);
        fs::write(&file, &torn).unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(ids(&mut store).await, (0..10).map(|i| log_id(1, i)).collect::<Vec<_>>());
        assert_eq!(fs::read(&file).unwrap(), intact_bytes, "the torn bytes are cut off");
        store.blocking_append(entries(1, 10..11)).await.unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(ids(&mut store).await, (0..11).map(|i| log_id(1, i)).collect::<Vec<_>>());
        drop(store);

        // Zeros after the last record (a file system that extended the file before a crash).
        let before = fs::read(&file).unwrap();
        let mut zeroed = before.clone();
        zeroed.extend_from_slice(&[0u8; 4096]);
        fs::write(&file, &zeroed).unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(ids(&mut store).await.len(), 11);
        assert_eq!(fs::read(&file).unwrap(), before);
        drop(store);

        // The file cut in the middle of the last record.
        let last = *record_offsets(&file).last().unwrap();
        fs::write(&file, &before[..last + 11]).unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(ids(&mut store).await, (0..10).map(|i| log_id(1, i)).collect::<Vec<_>>());
        assert_eq!(fs::metadata(&file).unwrap().len(), last as u64);
    }

    #[tokio::test]
    async fn damaged_record_before_valid_ones_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = ten_entries(dir.path()).await;
        let offsets = record_offsets(&file);
        let mut bytes = fs::read(&file).unwrap();
        bytes[offsets[4] + 30] ^= 0x01;
        fs::write(&file, &bytes).unwrap();

        let err = LogStore::open(dir.path()).err().expect("open must fail");
        let message = err.to_string();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(message.contains(&file.display().to_string()), "{message}");
        assert!(message.contains(&format!("byte offset {}", offsets[4])), "{message}");
        assert!(message.contains("CRC-32C mismatch"), "{message}");
    }

    #[tokio::test]
    async fn damage_in_an_older_segment_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open_with(dir.path(), small_segments()).unwrap();
        for i in 0..20 {
            store.blocking_append(entries(1, i..i + 1)).await.unwrap();
        }
        drop(store);
        let files = segment_files(dir.path());
        assert!(files.len() > 2);
        // Cut the first segment's last record short: harmless at the end of the log, corruption
        // anywhere else.
        let len = fs::metadata(&files[0]).unwrap().len();
        OpenOptions::new().write(true).open(&files[0]).unwrap().set_len(len - 3).unwrap();
        let message =
            LogStore::open_with(dir.path(), small_segments()).err().expect("open must fail").to_string();
        assert!(message.contains(&files[0].display().to_string()), "{message}");
        assert!(message.contains("not the last"), "{message}");
    }

    #[tokio::test]
    async fn damaged_vote_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store.save_vote(&Vote::new(1, 1)).await.unwrap();
        drop(store);
        let path = dir.path().join(VOTE_FILE);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        let message = LogStore::open(dir.path()).err().expect("open must fail").to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
    }

    #[tokio::test]
    async fn an_io_error_makes_every_later_write_fail() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..2)).await.unwrap();
        let failed = store
            .with_writer(|_| Err::<(), _>(io::Error::other("injected fsync failure")))
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("injected"));
        let err = store.blocking_append(entries(1, 2..3)).await.unwrap_err();
        assert!(err.to_string().contains("injected fsync failure"), "{err}");
        assert!(store.save_vote(&Vote::new(1, 1)).await.is_err());
        assert_eq!(ids(&mut store).await.len(), 2, "the failed append is not readable");
    }

    #[tokio::test]
    async fn refuses_holes() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..2)).await.unwrap();
        assert!(store.blocking_append(entries(1, 3..4)).await.is_err());
    }
}
