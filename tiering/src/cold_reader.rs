//! Reads archived segments from the bucket, through a cache.
//!
//! The unit fetched and cached is one row group: the bytes of all its column chunks, keyed by
//! (object key, object size, row group index), in a foyer hybrid cache (memory, plus a local
//! disk directory when one is configured). Parsed footers live in a small in-memory cache
//! keyed by (object key, object size). A read uses the row-group statistics on `offset` to
//! fetch only the row groups holding the offsets it needs, stops once it has enough records,
//! and decodes with Parquet's async reader over the cached bytes.
//!
//! Cold reads have their own bounded concurrency: at most `concurrency_max` object store
//! fetches at once per reader, whatever the number of readers waiting, so a burst of catch-up
//! consumers cannot take the bucket bandwidth the write path (the compactor) needs. Concurrent
//! reads of the same row group share one fetch.
//!
//! A sequential read (one that continues where an earlier read of the object ended, or starts
//! at the object's first offset) also starts decoding the next row group or two of the object
//! in the background, on the blocking pool, bounded by `readahead_bytes` of uncompressed row
//! groups (see `readahead.rs`), so that fetching and decoding the next row group overlap
//! with the current one, on another core. A read never waits for a readahead it does not need,
//! and it gets the same records with or without one.
//!
//! A fetch (a row group or a footer) that has not finished after `hedge_after` (1 s by
//! default, far above an object store's usual answer) gets a second, identical request beside
//! it, and the first to succeed is used (a hedged request): object stores have a long tail of
//! requests that stall on a slow node or a lost connection, and a reader should not wait out a
//! client timeout and retries for one of them. A hedge needs a free fetch permit (hedges never
//! take the store past `concurrency_max` requests) and comes out of a budget of 5% of the
//! fetches made (at most 10 saved up), so a store that is slow for every request (throttling,
//! a full link) gets at most 5% more requests, not twice as many.
//!
//! Objects are immutable once archived (conditional create), so cached bytes never go stale;
//! the object size in the key keeps a re-created object at the same key apart.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::{Array, Int64Array, RecordBatch, TimestampMillisecondArray};
use bytes::Bytes;
use foyer::{
    BlockEngineConfig, Cache, CacheBuilder, Code, DeviceBuilder, FsDeviceBuilder, HybridCache,
    HybridCacheBuilder, HybridCacheProperties, Location, PsyncIoEngineConfig,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use silt_record::{ReadLimit, Record};
use tokio::sync::{Notify, Semaphore};
use tracing::debug;

use crate::archive_format::{
    archive_read_schema, decode_records, read_archive_meta_counted, row_group_byte_ranges, row_group_stats,
    ArchiveMeta, RowGroupStats, COLUMN_OFFSET, COLUMN_TIMESTAMP,
};
use crate::readahead::{PlannedRowGroup, ReadaheadPlanner, ROW_GROUPS_AHEAD_MAX};
use crate::TieringError;

/// Rows decoded per Arrow batch.
const BATCH_ROWS_MAX: usize = 8192;
/// Largest disk cache block: the eviction unit and the largest entry the disk cache takes.
const DISK_BLOCK_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Default memory for decoded row groups: room for the current row groups of about a dozen readers
/// (at most 8 MiB of records each by default) and what is read ahead of them.
pub const DECODED_MEMORY_BYTES_DEFAULT: usize = 256 * 1024 * 1024;

/// Smallest disk cache accepted.
const DISK_BYTES_MIN: usize = 4 * 1024 * 1024;

/// How a [`ColdReader`] caches and fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdReaderOptions {
    /// Memory for cached row groups.
    pub memory_bytes: usize,
    /// Directory of the disk cache; `None` caches in memory only.
    pub disk_dir: Option<PathBuf>,
    /// Size of the disk cache.
    pub disk_bytes: usize,
    /// Most object store fetches in flight at once.
    pub concurrency_max: usize,
    /// Memory for parsed footers.
    pub footer_memory_bytes: usize,
    /// Memory for decoded row groups, so that consecutive small reads (a consumer polling 100
    /// records at a time) decode each row group once.
    pub decoded_memory_bytes: usize,
    /// Most bytes of row groups (their uncompressed size in the footer, about the memory they
    /// take decoded) decoded ahead of sequential reads, at most 2 row groups ahead of a read
    /// and never more than half of `decoded_memory_bytes`; 0 turns readahead off.
    pub readahead_bytes: usize,
    /// A fetch (a row group, or a footer) that has not finished after this long gets a second,
    /// identical request beside it, within a budget of 5% of the fetches and when a fetch
    /// permit is free; the first to succeed is used, the other dropped. `None` never hedges.
    pub hedge_after: Option<Duration>,
}

/// Default of [`ColdReaderOptions::hedge_after`].
pub const HEDGE_AFTER_DEFAULT: Duration = Duration::from_secs(1);

impl Default for ColdReaderOptions {
    fn default() -> Self {
        ColdReaderOptions {
            memory_bytes: 64 * 1024 * 1024,
            disk_dir: None,
            disk_bytes: 1024 * 1024 * 1024,
            concurrency_max: 8,
            footer_memory_bytes: 16 * 1024 * 1024,
            decoded_memory_bytes: DECODED_MEMORY_BYTES_DEFAULT,
            readahead_bytes: 32 * 1024 * 1024,
            hedge_after: Some(HEDGE_AFTER_DEFAULT),
        }
    }
}

/// A stream that is due to read the partition's next object ahead
/// ([`ColdReader::next_object_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextObjectDue {
    /// Bytes of the current object's row groups after the stream's, ahead of it too.
    ahead_in_current: u64,
}

/// Counters of a [`ColdReader`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdReaderStats {
    /// Row groups served from the cache (memory or disk), or from a fetch another read started.
    pub cache_hits: u64,
    /// Row groups fetched from the object store.
    pub cache_misses: u64,
    /// Footers served from the footer cache.
    pub footer_hits: u64,
    /// Footers fetched from the object store.
    pub footer_misses: u64,
    /// Object store requests made (footers and row groups).
    pub fetches: u64,
    /// Bytes fetched from the object store.
    pub bytes_fetched: u64,
    /// Row groups whose decode a readahead started.
    pub readahead_row_groups: u64,
    /// Reads that continued an earlier read of the same object, or started at its first
    /// record (a replay or a consumer reading on).
    pub sequential_reads: u64,
    /// Reads that started anywhere else (a seek).
    pub random_reads: u64,
    /// Fetches (row groups and footers) that had not finished after `hedge_after` and got a
    /// second request.
    pub hedged_fetches: u64,
    /// Hedged fetches whose answer came from the hedge.
    pub hedge_wins: u64,
}

impl ColdReaderStats {
    /// The counters in the Prometheus text format: `silt_tiering_cold_row_groups_total` and
    /// `silt_tiering_cold_footers_total` (label `result`: `hit` or `miss`),
    /// `silt_tiering_cold_fetches_total`, `silt_tiering_cold_fetched_bytes_total`,
    /// `silt_tiering_cold_readahead_row_groups_total` and `silt_tiering_cold_reads_total`
    /// (label `pattern`: `sequential` or `random`).
    pub fn encode_prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for (name, help, hits, misses) in [
            (
                "row_groups",
                "Row groups a cold read needed, by cache result.",
                self.cache_hits,
                self.cache_misses,
            ),
            (
                "footers",
                "Archive footers a cold read needed, by cache result.",
                self.footer_hits,
                self.footer_misses,
            ),
        ] {
            let _ = writeln!(out, "# HELP silt_tiering_cold_{name}_total {help}");
            let _ = writeln!(out, "# TYPE silt_tiering_cold_{name}_total counter");
            let _ = writeln!(out, "silt_tiering_cold_{name}_total{{result=\"hit\"}} {hits}");
            let _ = writeln!(out, "silt_tiering_cold_{name}_total{{result=\"miss\"}} {misses}");
        }
        let _ =
            writeln!(out, "# HELP silt_tiering_cold_fetches_total Object store requests made by cold reads.");
        let _ = writeln!(out, "# TYPE silt_tiering_cold_fetches_total counter");
        let _ = writeln!(out, "silt_tiering_cold_fetches_total {}", self.fetches);
        let _ = writeln!(
            out,
            "# HELP silt_tiering_cold_fetched_bytes_total Bytes cold reads fetched from the object store."
        );
        let _ = writeln!(out, "# TYPE silt_tiering_cold_fetched_bytes_total counter");
        let _ = writeln!(out, "silt_tiering_cold_fetched_bytes_total {}", self.bytes_fetched);
        let _ = writeln!(
            out,
            "# HELP silt_tiering_cold_readahead_row_groups_total Row groups decoded ahead of sequential cold reads."
        );
        let _ = writeln!(out, "# TYPE silt_tiering_cold_readahead_row_groups_total counter");
        let _ = writeln!(out, "silt_tiering_cold_readahead_row_groups_total {}", self.readahead_row_groups);
        let _ = writeln!(
            out,
            "# HELP silt_tiering_cold_reads_total Cold reads, by whether they continued an earlier read of the object (sequential, read ahead and kept out of the disk cache) or not."
        );
        let _ = writeln!(out, "# TYPE silt_tiering_cold_reads_total counter");
        let _ = writeln!(
            out,
            "silt_tiering_cold_reads_total{{pattern=\"sequential\"}} {}",
            self.sequential_reads
        );
        let _ = writeln!(out, "silt_tiering_cold_reads_total{{pattern=\"random\"}} {}", self.random_reads);
        let _ = writeln!(
            out,
            "# HELP silt_tiering_cold_hedged_fetches_total Fetches (row groups and footers) that had not finished after the hedge delay and got a second request, by whose answer was used (original when both failed)."
        );
        let _ = writeln!(out, "# TYPE silt_tiering_cold_hedged_fetches_total counter");
        let _ = writeln!(
            out,
            "silt_tiering_cold_hedged_fetches_total{{used=\"original\"}} {}",
            self.hedged_fetches.saturating_sub(self.hedge_wins)
        );
        let _ = writeln!(out, "silt_tiering_cold_hedged_fetches_total{{used=\"hedge\"}} {}", self.hedge_wins);
        out
    }
}

#[derive(Debug, Default)]
struct Counters {
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    footer_hits: AtomicU64,
    footer_misses: AtomicU64,
    fetches: AtomicU64,
    bytes_fetched: AtomicU64,
    readahead_row_groups: AtomicU64,
    sequential_reads: AtomicU64,
    random_reads: AtomicU64,
    hedged_fetches: AtomicU64,
    hedge_wins: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Thousandths of a hedge each fetch earns: hedges add at most 5% to the fetches made, however
/// slow the store gets (a store that throttles or a full link slows every request, and
/// hedging all of them would double the load when it can take the least).
const HEDGE_MILLIS_PER_FETCH: u64 = 50;
/// Most hedges saved up for a burst of stalls (and what a reader starts with).
const HEDGE_BURST: u64 = 10;

/// When a fetch gets a hedge: after `after`, within the budget, with a free fetch permit.
struct Hedging {
    after: Duration,
    /// The reader's fetch permits: a hedge needs one that is free, so hedges never take the
    /// store past `concurrency_max` requests at once.
    permits: Arc<Semaphore>,
    /// Thousandths of a hedge earned and not spent, at most `HEDGE_BURST` whole ones.
    budget_millis: AtomicU64,
}

impl Hedging {
    fn new(after: Duration, permits: Arc<Semaphore>) -> Hedging {
        Hedging { after, permits, budget_millis: AtomicU64::new(HEDGE_BURST * 1000) }
    }

    /// A fetch is made: it earns its share of a hedge.
    fn earn(&self) {
        let _ = self.budget_millis.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            Some((b + HEDGE_MILLIS_PER_FETCH).min(HEDGE_BURST * 1000))
        });
    }

    /// A free permit for a hedge, if the budget has one whole hedge and a permit is free.
    fn take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.budget_millis
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1000))
            .ok()?;
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.budget_millis.fetch_add(1000, Ordering::Relaxed);
                None
            }
        }
    }
}

/// Runs `call`, and if it has not finished after the hedging delay (and [`Hedging::take`]
/// allows one), a second one beside it: the first to succeed is the answer and the other is
/// dropped (cancelled). When one fails, the other is waited for; when both fail, the first
/// one's error is returned. `None` runs `call` alone.
async fn hedged<T, E, F, Fut>(hedging: Option<&Hedging>, counters: &Counters, call: F) -> Result<T, E>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let first = call();
    let Some(hedging) = hedging else { return first.await };
    hedging.earn();
    tokio::pin!(first);
    tokio::select! {
        r = &mut first => return r,
        () = tokio::time::sleep(hedging.after) => {}
    }
    let Some(_permit) = hedging.take() else { return first.await };
    bump(&counters.hedged_fetches, 1);
    bump(&counters.fetches, 1);
    let second = call();
    tokio::pin!(second);
    tokio::select! {
        r = &mut first => match r {
            Ok(v) => Ok(v),
            Err(e) => match second.await {
                Ok(v) => {
                    bump(&counters.hedge_wins, 1);
                    Ok(v)
                }
                Err(_) => Err(e),
            },
        },
        r = &mut second => match r {
            Ok(v) => {
                bump(&counters.hedge_wins, 1);
                Ok(v)
            }
            Err(_) => first.await,
        },
    }
}

/// Cache key of one row group of one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RowGroupKey {
    object_key: String,
    object_bytes: u64,
    row_group: u32,
}

/// The column-chunk bytes of one row group, each with its position in the object.
#[derive(Debug, Clone, Default)]
struct RowGroupBytes {
    chunks: Vec<(u64, Bytes)>,
}

impl RowGroupBytes {
    fn len_bytes(&self) -> usize {
        self.chunks.iter().map(|(_, b)| b.len()).sum()
    }

    fn slice(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        self.chunks
            .iter()
            .find(|(start, b)| *start <= range.start && range.end <= start + b.len() as u64)
            .map(|(start, b)| b.slice((range.start - start) as usize..(range.end - start) as usize))
            .ok_or_else(|| {
                ParquetError::General(format!("byte range {range:?} is not in the cached row group"))
            })
    }
}

const CHUNKS_MAX: u64 = 4096;
const CHUNK_BYTES_MAX: u64 = 1 << 32;
const KEY_BYTES_MAX: u64 = 64 * 1024;

fn write_u64(w: &mut impl std::io::Write, v: u64) -> foyer::Result<()> {
    w.write_all(&v.to_le_bytes()).map_err(foyer::Error::io_error)
}

fn read_u64(r: &mut impl std::io::Read) -> foyer::Result<u64> {
    let mut buf = [0u8; 8];
    r.read_exact(&mut buf).map_err(foyer::Error::io_error)?;
    Ok(u64::from_le_bytes(buf))
}

fn read_bytes(r: &mut impl std::io::Read, len: u64, max: u64) -> foyer::Result<Vec<u8>> {
    if len > max {
        return Err(foyer::Error::new(foyer::ErrorKind::Parse, "cold cache entry length out of bounds"));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).map_err(foyer::Error::io_error)?;
    Ok(buf)
}

impl Code for RowGroupKey {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        write_u64(writer, self.object_key.len() as u64)?;
        writer.write_all(self.object_key.as_bytes()).map_err(foyer::Error::io_error)?;
        write_u64(writer, self.object_bytes)?;
        write_u64(writer, u64::from(self.row_group))
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        let len = read_u64(reader)?;
        let object_key = String::from_utf8(read_bytes(reader, len, KEY_BYTES_MAX)?).map_err(|e| {
            foyer::Error::new(foyer::ErrorKind::Parse, "cold cache key is not UTF-8").with_source(e)
        })?;
        let object_bytes = read_u64(reader)?;
        let row_group = u32::try_from(read_u64(reader)?).map_err(|e| {
            foyer::Error::new(foyer::ErrorKind::Parse, "row group out of range").with_source(e)
        })?;
        Ok(RowGroupKey { object_key, object_bytes, row_group })
    }

    fn estimated_size(&self) -> usize {
        24 + self.object_key.len()
    }
}

impl Code for RowGroupBytes {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        write_u64(writer, self.chunks.len() as u64)?;
        for (start, bytes) in &self.chunks {
            write_u64(writer, *start)?;
            write_u64(writer, bytes.len() as u64)?;
            writer.write_all(bytes).map_err(foyer::Error::io_error)?;
        }
        Ok(())
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        let count = read_u64(reader)?;
        if count > CHUNKS_MAX {
            return Err(foyer::Error::new(foyer::ErrorKind::Parse, "too many chunks in a cold cache entry"));
        }
        let mut chunks = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let start = read_u64(reader)?;
            let len = read_u64(reader)?;
            chunks.push((start, Bytes::from(read_bytes(reader, len, CHUNK_BYTES_MAX)?)));
        }
        Ok(RowGroupBytes { chunks })
    }

    fn estimated_size(&self) -> usize {
        8 + self.chunks.len() * 16 + self.len_bytes()
    }
}

/// A parsed footer and what is derived from it once.
#[derive(Debug)]
struct Footer {
    meta: ArchiveMeta,
    metadata: Arc<ParquetMetaData>,
    arrow: ArrowReaderMetadata,
    row_groups: Vec<Option<RowGroupStats>>,
    /// Uncompressed bytes of each row group (what readahead counts).
    row_group_bytes: Vec<u64>,
}

/// Serves the Parquet async reader from one row group's cached bytes.
struct CachedRowGroup {
    metadata: Arc<ParquetMetaData>,
    bytes: RowGroupBytes,
}

impl AsyncFileReader for CachedRowGroup {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        futures::future::ready(self.bytes.slice(range)).boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        futures::future::ready(Ok(Arc::clone(&self.metadata))).boxed()
    }
}

/// What fetches and decodes row groups: cheap to clone into a fetch that outlives the call
/// that started it (a readahead).
#[derive(Clone)]
struct RowGroupSource {
    store: Arc<dyn ObjectStore>,
    row_groups: HybridCache<RowGroupKey, RowGroupBytes>,
    fetch_permits: Arc<Semaphore>,
    counters: Arc<Counters>,
    hedging: Option<Arc<Hedging>>,
}

/// Decodes row groups ahead of sequential reads; see `readahead.rs`.
struct Readahead {
    planner: Mutex<ReadaheadPlanner>,
    /// Notified whenever a row group read ahead is done.
    done: Notify,
}

impl Readahead {
    fn planner(&self) -> std::sync::MutexGuard<'_, ReadaheadPlanner> {
        // The planner is plain bookkeeping that cannot be left half-updated: use it after a panic.
        self.planner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Releases a row group's readahead budget when its decode ends, however it ends.
///
/// Its drop takes the planner's mutex, so it must never be dropped inside the decoded cache:
/// the cache drops fetch futures it does not run while it holds its shard lock, and a thread
/// holding the planner's mutex while waiting for that shard lock would then wait forever (a
/// whole agent froze that way). Only the task [`ColdReader::start_read_ahead`] spawns owns
/// one, and the planner's mutex is a leaf: nothing is called while it is held.
struct ReadaheadSlot {
    readahead: Arc<Readahead>,
    planned: PlannedRowGroup,
}

impl Drop for ReadaheadSlot {
    fn drop(&mut self) {
        self.readahead.planner().finished(&self.planned);
        self.readahead.done.notify_waiters();
    }
}

/// Reads archived segments. See the module documentation.
pub struct ColdReader {
    source: RowGroupSource,
    footers: Cache<(String, u64), Arc<Footer>>,
    decoded: Cache<RowGroupKey, Arc<DecodedRowGroup>>,
    readahead: Arc<Readahead>,
    options: ColdReaderOptions,
}

impl std::fmt::Debug for ColdReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdReader")
            .field("store", &self.source.store.to_string())
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish()
    }
}

fn cache_error(what: &str, e: impl std::fmt::Display) -> TieringError {
    TieringError::Cache(format!("{what}: {e}"))
}

impl ColdReader {
    /// Opens the caches (creating the disk cache directory if needed) over `store`, the store
    /// the object keys given to [`ColdReader::read`] are paths of.
    pub async fn new(store: Arc<dyn ObjectStore>, options: ColdReaderOptions) -> Result<Self, TieringError> {
        if options.concurrency_max == 0 || options.memory_bytes == 0 || options.footer_memory_bytes == 0 {
            return Err(TieringError::InvalidArgument(
                "cold reader memory sizes and concurrency must be at least 1".into(),
            ));
        }
        let memory = HybridCacheBuilder::new()
            .with_name("silt-cold-row-groups")
            .memory(options.memory_bytes)
            .with_shards(4)
            .with_weighter(|k: &RowGroupKey, v: &RowGroupBytes| k.object_key.len() + 64 + v.len_bytes());
        let row_groups = match &options.disk_dir {
            None => memory.storage().build().await,
            Some(dir) => {
                if options.disk_bytes < DISK_BYTES_MIN {
                    return Err(TieringError::InvalidArgument(format!(
                        "the cold read disk cache needs at least {DISK_BYTES_MIN} bytes, got {}",
                        options.disk_bytes
                    )));
                }
                std::fs::create_dir_all(dir)?;
                let device = FsDeviceBuilder::new(dir)
                    .with_capacity(options.disk_bytes)
                    .build()
                    .map_err(|e| cache_error(&format!("cannot open disk cache in {}", dir.display()), e))?;
                let block_bytes = (options.disk_bytes / 4).min(DISK_BLOCK_BYTES_MAX);
                memory
                    .storage()
                    .with_io_engine_config(PsyncIoEngineConfig::new())
                    .with_engine_config(BlockEngineConfig::new(device).with_block_size(block_bytes))
                    .build()
                    .await
            }
        }
        .map_err(|e| cache_error("cannot build the row group cache", e))?;
        let footers = CacheBuilder::new(options.footer_memory_bytes)
            .with_shards(1)
            .with_weighter(|k: &(String, u64), v: &Arc<Footer>| k.0.len() + v.metadata.memory_size())
            .build();
        let decoded = CacheBuilder::new(options.decoded_memory_bytes.max(1))
            .with_shards(1)
            .with_weighter(|k: &RowGroupKey, v: &Arc<DecodedRowGroup>| k.object_key.len() + 64 + v.bytes)
            .build();
        // What is read ahead lands in the decoded cache: keep it to half of it, so that it does
        // not push out the row group a read is in.
        let readahead_bytes = options.readahead_bytes.min(options.decoded_memory_bytes / 2);
        let fetch_permits = Arc::new(Semaphore::new(options.concurrency_max));
        let hedging = options
            .hedge_after
            .filter(|d| !d.is_zero())
            .map(|after| Arc::new(Hedging::new(after, Arc::clone(&fetch_permits))));
        Ok(ColdReader {
            source: RowGroupSource { store, row_groups, fetch_permits, counters: Arc::default(), hedging },
            footers,
            decoded,
            readahead: Arc::new(Readahead {
                planner: Mutex::new(ReadaheadPlanner::new(readahead_bytes as u64)),
                done: Notify::new(),
            }),
            options,
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> ColdReaderStats {
        let c = &self.source.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ColdReaderStats {
            cache_hits: get(&c.cache_hits),
            cache_misses: get(&c.cache_misses),
            footer_hits: get(&c.footer_hits),
            footer_misses: get(&c.footer_misses),
            fetches: get(&c.fetches),
            bytes_fetched: get(&c.bytes_fetched),
            readahead_row_groups: get(&c.readahead_row_groups),
            sequential_reads: get(&c.sequential_reads),
            random_reads: get(&c.random_reads),
            hedged_fetches: get(&c.hedged_fetches),
            hedge_wins: get(&c.hedge_wins),
        }
    }

    /// Stops reading ahead, waits for the row groups being read ahead, then flushes and closes
    /// the disk cache.
    pub async fn close(&self) -> Result<(), TieringError> {
        self.readahead.planner().close();
        self.readahead_drained().await;
        self.source.row_groups.close().await.map_err(|e| cache_error("closing the row group cache", e))
    }

    /// Waits until no row group is being read ahead.
    async fn readahead_drained(&self) {
        loop {
            let done = self.readahead.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.readahead.planner().is_idle() {
                return;
            }
            done.await;
        }
    }

    /// Up to `max_records` records of the archive at `object_key` (of `object_bytes` bytes),
    /// in offset order, starting at the first offset at or after `from_offset`. Empty when
    /// `from_offset` is past the archive's last offset.
    pub async fn read(
        &self,
        object_key: &str,
        object_bytes: u64,
        from_offset: u64,
        max_records: usize,
    ) -> Result<Vec<Record>, TieringError> {
        self.read_limited(object_key, object_bytes, from_offset, ReadLimit::new(max_records, usize::MAX))
            .await
    }

    /// [`read`](Self::read), as much as `limit` admits ([`ReadLimit::admits`]: records, bytes
    /// of keys, values and headers, and the first record whatever its size if it says so). The next read continues where this one
    /// ended, and counts as sequential for readahead: so a caller should take every record
    /// returned, and ask for no more than it can take (a record it then drops would make its
    /// next read start before this read's end, a seek).
    pub async fn read_limited(
        &self,
        object_key: &str,
        object_bytes: u64,
        from_offset: u64,
        limit: ReadLimit,
    ) -> Result<Vec<Record>, TieringError> {
        if limit.is_spent() {
            return Ok(Vec::new());
        }
        let footer = self.footer(object_key, object_bytes).await?;
        if from_offset > footer.meta.last_offset {
            return Ok(Vec::new());
        }
        let sequential =
            self.readahead.planner().is_sequential(object_key, from_offset, footer.meta.base_offset);
        let counters = &self.source.counters;
        bump(if sequential { &counters.sequential_reads } else { &counters.random_reads }, 1);
        let mut out: Vec<Record> = Vec::new();
        let mut used = 0usize;
        'row_groups: for (rg, stats) in footer.row_groups.iter().enumerate() {
            if stats.is_some_and(|s| s.max_offset < from_offset) {
                continue;
            }
            if sequential {
                self.read_ahead(object_key, object_bytes, &footer, rg);
            }
            let decoded = self.decoded_row_group(object_key, object_bytes, &footer, rg, sequential).await?;
            let start = decoded.records.partition_point(|r| r.offset < from_offset);
            for record in &decoded.records[start..] {
                if !limit.admits(out.len(), used, record) {
                    break 'row_groups;
                }
                used += record.data_len();
                out.push(record.clone());
            }
            if out.len() >= limit.records {
                break;
            }
        }
        if let Some(last) = out.last() {
            self.readahead.planner().read_ended(
                object_key,
                from_offset,
                last.offset.saturating_add(1),
                sequential,
            );
        }
        Ok(out)
    }

    /// Starts decoding the row groups after `current` that the readahead planner picks. Each
    /// is fetched and decoded by the decoded cache's own task, so a read that needs it later
    /// waits for that decode instead of starting another, and it runs to its end even when no
    /// read waits for it.
    fn read_ahead(&self, object_key: &str, object_bytes: u64, footer: &Arc<Footer>, current: usize) {
        let first = current.saturating_add(1);
        let candidates = first..first.saturating_add(ROW_GROUPS_AHEAD_MAX);
        self.start_read_ahead(object_key, object_bytes, footer, candidates, |planner, is_decoded| {
            planner.plan(object_key, object_bytes, current, &footer.row_group_bytes, is_decoded)
        });
    }

    /// Whether a stream of sequential reads of `object_key`, now at `next_offset` (the object's
    /// start, or where a sequential read ended), is due to read the partition's next object
    /// ahead: it is in the row groups the object's own readahead has nothing after. Decided
    /// now, before the read that goes on from there moves the stream on; never after a seek.
    /// [`ColdReader::read_ahead_next_object`] then starts on the next object, so that the
    /// stream does not wait for a fetch where one object ends and the next begins.
    pub async fn next_object_due(
        &self,
        object_key: &str,
        object_bytes: u64,
        next_offset: u64,
    ) -> Result<Option<NextObjectDue>, TieringError> {
        let footer = self.footer(object_key, object_bytes).await?;
        if !self.readahead.planner().is_stream_at(object_key, next_offset, footer.meta.base_offset) {
            return Ok(None);
        }
        let current = footer
            .row_groups
            .iter()
            .position(|s| s.is_none_or(|s| s.max_offset >= next_offset))
            .unwrap_or(footer.row_groups.len());
        if current.saturating_add(ROW_GROUPS_AHEAD_MAX) < footer.row_groups.len() {
            return Ok(None);
        }
        let ahead_in_current = footer.row_group_bytes.iter().skip(current.saturating_add(1)).sum();
        Ok(Some(NextObjectDue { ahead_in_current }))
    }

    /// Starts decoding the first row group of `then_key` (of `then_bytes` bytes) for a stream
    /// [`ColdReader::next_object_due`] found due, fetching its footer first if needed.
    pub async fn read_ahead_next_object(
        &self,
        due: NextObjectDue,
        then_key: &str,
        then_bytes: u64,
    ) -> Result<(), TieringError> {
        let then = self.footer(then_key, then_bytes).await?;
        self.start_read_ahead(then_key, then_bytes, &then, 0..1, |planner, is_decoded| {
            planner.plan_next_object(
                then_key,
                then_bytes,
                due.ahead_in_current,
                &then.row_group_bytes,
                is_decoded,
            )
        });
        Ok(())
    }

    /// Starts decoding the row groups of `object_key` that `plan` picks among `candidates`,
    /// each on a task of its own (see [`ColdReader::read_ahead`]).
    ///
    /// Lock order: the cache is asked which candidates it holds (taking its shard lock) before
    /// the planner's mutex is taken, and nothing is called under that mutex; a stale answer at
    /// worst starts a readahead that finds the row group in the cache.
    fn start_read_ahead(
        &self,
        object_key: &str,
        object_bytes: u64,
        footer: &Arc<Footer>,
        candidates: Range<usize>,
        plan: impl FnOnce(&mut ReadaheadPlanner, &dyn Fn(usize) -> bool) -> Vec<PlannedRowGroup>,
    ) {
        let key = |rg: usize| RowGroupKey {
            object_key: object_key.to_string(),
            object_bytes,
            row_group: u32::try_from(rg).unwrap_or(u32::MAX),
        };
        let end = candidates.end.min(footer.row_group_bytes.len());
        let cached: Vec<usize> =
            (candidates.start..end).filter(|&rg| self.decoded.contains(&key(rg))).collect();
        let planned = {
            let mut planner = self.readahead.planner();
            plan(&mut planner, &|rg| cached.contains(&rg))
        };
        for planned in planned {
            let rg = planned.row_group;
            let slot = ReadaheadSlot { readahead: Arc::clone(&self.readahead), planned };
            let Ok(row_group) = u32::try_from(rg) else { continue };
            bump(&self.source.counters.readahead_row_groups, 1);
            let (source, footer, key) = (self.source.clone(), Arc::clone(footer), key(rg));
            let cache = self.decoded.clone();
            // The slot lives in this task, never in the future handed to the cache (see
            // `ReadaheadSlot`), and is released once the row group is in the cache or failed.
            tokio::spawn(async move {
                let fetch_key = key.clone();
                let fetch = async move {
                    let decoded = source.decode(&fetch_key, &footer, row_group, true, true).await;
                    if let Err(e) = &decoded {
                        // The read that needs this row group fetches it again and reports it.
                        debug!(object = %fetch_key.object_key, row_group, error = %e, "readahead failed");
                    }
                    decoded.map(Arc::new).map_err(|e| std::io::Error::other(e.to_string()))
                };
                // The outcome is the cache's: a read that needs the row group finds it there,
                // or fetches it again and reports the error.
                let _outcome = cache.get_or_fetch(&key, move || fetch).await;
                drop(slot);
            });
        }
    }

    /// Every record of one row group, decoded once on the blocking pool and kept in a memory
    /// cache; keys and values are reference-counted, so handing out records copies no payload.
    /// Concurrent reads of a row group, and a read of a row group being read ahead, share one
    /// decode. A read that is part of a sequential scan (`scan`) keeps what it fetches out of
    /// the disk cache, like its readahead.
    async fn decoded_row_group(
        &self,
        object_key: &str,
        object_bytes: u64,
        footer: &Arc<Footer>,
        rg: usize,
        scan: bool,
    ) -> Result<Arc<DecodedRowGroup>, TieringError> {
        let row_group =
            u32::try_from(rg).map_err(|_| TieringError::InvalidArchive("too many row groups".into()))?;
        let key = RowGroupKey { object_key: object_key.to_string(), object_bytes, row_group };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let outcome = Arc::new(FetchOutcome::default());
            let fetch = {
                let (source, footer, key) = (self.source.clone(), Arc::clone(footer), key.clone());
                async move { source.decode(&key, &footer, row_group, false, scan).await.map(Arc::new) }
            };
            let wrapped = outcome.wrap(fetch);
            match self.decoded.get_or_fetch(&key, move || wrapped).await {
                Ok(entry) => {
                    let decoded = Arc::clone(entry.value());
                    // A decode this call ran counted its row group already, and so did a
                    // readahead the first time a read uses what it decoded.
                    if !outcome.ran() && !decoded.read_ahead_unclaimed.swap(false, Ordering::Relaxed) {
                        bump(&self.source.counters.cache_hits, 1);
                    }
                    return Ok(decoded);
                }
                // This call waited for another call's decode (a readahead, say), which failed:
                // try once itself, so that the error it reports is its own.
                Err(_) if !outcome.ran() && attempts < 2 => continue,
                Err(e) => return Err(outcome.error("decoding a row group", e)),
            }
        }
    }

    /// The offset of the first record (in offset order) of the archive whose timestamp is at
    /// or after `timestamp_ms`, or `None` when every record is older. Row groups whose
    /// largest timestamp is older are skipped without being fetched.
    pub async fn offset_for_time(
        &self,
        object_key: &str,
        object_bytes: u64,
        timestamp_ms: i64,
    ) -> Result<Option<u64>, TieringError> {
        let footer = self.footer(object_key, object_bytes).await?;
        if footer.meta.max_timestamp_ms < timestamp_ms {
            return Ok(None);
        }
        let projection = ProjectionMask::roots(
            footer.metadata.file_metadata().schema_descr(),
            [COLUMN_OFFSET, COLUMN_TIMESTAMP],
        );
        for (rg, stats) in footer.row_groups.iter().enumerate() {
            if stats.is_some_and(|s| s.max_timestamp_ms < timestamp_ms) {
                continue;
            }
            let bytes = self.source.row_group(object_key, object_bytes, &footer, rg, false).await?;
            let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(
                CachedRowGroup { metadata: Arc::clone(&footer.metadata), bytes },
                footer.arrow.clone(),
            )
            .with_row_groups(vec![rg])
            .with_projection(projection.clone())
            .with_batch_size(BATCH_ROWS_MAX)
            .build()?;
            while let Some(batch) = stream.next().await {
                if let Some(offset) = first_at_or_after(&batch?, timestamp_ms)? {
                    return Ok(Some(offset));
                }
            }
        }
        Ok(None)
    }

    async fn footer(&self, object_key: &str, object_bytes: u64) -> Result<Arc<Footer>, TieringError> {
        let cache_key = (object_key.to_string(), object_bytes);
        let path = parse_key(object_key)?;
        let outcome = Arc::new(FetchOutcome::default());
        let fetch = {
            let source = self.source.clone();
            async move {
                let (meta, metadata, bytes) = {
                    let _permit = source
                        .fetch_permits
                        .acquire_owned()
                        .await
                        .map_err(|e| cache_error("fetch limiter", e))?;
                    bump(&source.counters.fetches, 1);
                    hedged(source.hedging.as_deref(), &source.counters, || {
                        read_archive_meta_counted(source.store.as_ref(), &path, Some(object_bytes))
                    })
                    .await?
                };
                bump(&source.counters.bytes_fetched, bytes);
                let options = ArrowReaderOptions::new().with_schema(archive_read_schema());
                let arrow = ArrowReaderMetadata::try_new(Arc::clone(&metadata), options)?;
                let row_groups =
                    (0..metadata.num_row_groups()).map(|i| row_group_stats(&metadata, i)).collect();
                let row_group_bytes = metadata
                    .row_groups()
                    .iter()
                    .map(|rg| u64::try_from(rg.total_byte_size()).unwrap_or(u64::MAX))
                    .collect();
                Ok(Arc::new(Footer { meta, metadata, arrow, row_groups, row_group_bytes }))
            }
        };
        let wrapped = outcome.wrap(fetch);
        match self.footers.get_or_fetch(&cache_key, move || wrapped).await {
            Ok(entry) => {
                let counters = &self.source.counters;
                bump(if outcome.ran() { &counters.footer_misses } else { &counters.footer_hits }, 1);
                Ok(Arc::clone(entry.value()))
            }
            Err(e) => Err(outcome.error("fetching a footer", e)),
        }
    }
}

impl RowGroupSource {
    /// Fetches row group `rg` (through the row group cache) and decodes every record of it on
    /// the blocking pool. `read_ahead` marks a decode no read asked for yet.
    async fn decode(
        &self,
        key: &RowGroupKey,
        footer: &Arc<Footer>,
        rg: u32,
        read_ahead: bool,
        scan: bool,
    ) -> Result<DecodedRowGroup, TieringError> {
        let rg = rg as usize;
        let bytes = self.row_group(&key.object_key, key.object_bytes, footer, rg, scan).await?;
        let footer = Arc::clone(footer);
        // Decoding is CPU work over bytes already in memory: keep it off the async workers.
        silt_metadata::runtime::spawn_blocking(move || {
            futures::executor::block_on(async move {
                let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(
                    CachedRowGroup { metadata: Arc::clone(&footer.metadata), bytes },
                    footer.arrow.clone(),
                )
                .with_row_groups(vec![rg])
                .with_batch_size(BATCH_ROWS_MAX)
                .build()?;
                let mut records = Vec::new();
                while let Some(batch) = stream.next().await {
                    records.extend(decode_records(&batch?)?);
                }
                let bytes = records
                    .iter()
                    .map(|r: &Record| {
                        64 + r.key.as_ref().map_or(0, Bytes::len)
                            + r.value.as_ref().map_or(0, Bytes::len)
                            + r.headers
                                .iter()
                                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len) + 32)
                                .sum::<usize>()
                    })
                    .sum();
                Ok::<_, TieringError>(DecodedRowGroup {
                    records,
                    bytes,
                    read_ahead_unclaimed: AtomicBool::new(read_ahead),
                })
            })
        })
        .await
        .map_err(|e| TieringError::Cache(format!("decoding a row group panicked: {e}")))?
    }

    /// One row group's bytes, from the cache or the bucket. A row group fetched for a
    /// sequential scan (`scan`: a readahead, or a read that continues an earlier one or starts
    /// at the object's first record) stays in memory only: a long scan passes through
    /// without writing everything it reads to the disk cache and pushing out what other reads
    /// keep coming back to.
    async fn row_group(
        &self,
        object_key: &str,
        object_bytes: u64,
        footer: &Footer,
        rg: usize,
        scan: bool,
    ) -> Result<RowGroupBytes, TieringError> {
        let key = RowGroupKey {
            object_key: object_key.to_string(),
            object_bytes,
            row_group: u32::try_from(rg)
                .map_err(|_| TieringError::InvalidArchive("too many row groups".into()))?,
        };
        let ranges = row_group_byte_ranges(&footer.metadata, rg, object_bytes)?;
        let path = parse_key(object_key)?;
        let outcome = Arc::new(FetchOutcome::default());
        let fetch = {
            let (store, permits, counters) =
                (Arc::clone(&self.store), Arc::clone(&self.fetch_permits), Arc::clone(&self.counters));
            let hedging = self.hedging.clone();
            async move {
                let parts = {
                    let _permit =
                        permits.acquire_owned().await.map_err(|e| cache_error("fetch limiter", e))?;
                    bump(&counters.fetches, 1);
                    hedged(hedging.as_deref(), &counters, || store.get_ranges(&path, &ranges))
                        .await
                        .map_err(|e| TieringError::object_store("get_ranges", &path, e))?
                };
                if parts.len() != ranges.len() {
                    return Err(TieringError::InvalidArchive(format!(
                        "asked '{path}' for {} ranges, got {}",
                        ranges.len(),
                        parts.len()
                    )));
                }
                let bytes = RowGroupBytes { chunks: ranges.iter().map(|r| r.start).zip(parts).collect() };
                bump(&counters.bytes_fetched, bytes.len_bytes() as u64);
                let location = if scan { Location::InMem } else { Location::Default };
                Ok((bytes, HybridCacheProperties::default().with_location(location)))
            }
        };
        let wrapped = outcome.wrap(fetch);
        match self.row_groups.get_or_fetch(&key, move || wrapped).await {
            Ok(entry) => {
                bump(if outcome.ran() { &self.counters.cache_misses } else { &self.counters.cache_hits }, 1);
                Ok(entry.value().clone())
            }
            Err(e) => Err(outcome.error("fetching a row group", e)),
        }
    }
}

/// One row group's records, decoded.
#[derive(Debug)]
struct DecodedRowGroup {
    records: Vec<Record>,
    /// Approximate memory held, for the cache's weighter.
    bytes: usize,
    /// Decoded by a readahead and not used by a read yet (its row group was counted as a hit
    /// or miss when the readahead fetched it).
    read_ahead_unclaimed: AtomicBool,
}

/// What happened to one call's cache fetch: whether it ran (a miss, not a hit) and the error
/// it met, kept whole because the cache hands back only a wrapped copy.
#[derive(Debug, Default)]
struct FetchOutcome {
    ran: AtomicBool,
    failure: Mutex<Option<TieringError>>,
}

impl FetchOutcome {
    fn wrap<T>(
        self: &Arc<Self>,
        fetch: impl std::future::Future<Output = Result<T, TieringError>> + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T, std::io::Error>> + Send + 'static {
        let outcome = Arc::clone(self);
        async move {
            outcome.ran.store(true, Ordering::Relaxed);
            fetch.await.map_err(|e| {
                let message = e.to_string();
                if let Ok(mut slot) = outcome.failure.lock() {
                    *slot = Some(e);
                }
                std::io::Error::other(message)
            })
        }
    }

    fn ran(&self) -> bool {
        self.ran.load(Ordering::Relaxed)
    }

    /// The fetch's own error, or (when another call's fetch failed) the cache's copy of it.
    fn error(&self, what: &str, wrapped: impl std::fmt::Display) -> TieringError {
        self.failure
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .unwrap_or_else(|| cache_error(what, wrapped))
    }
}

fn parse_key(object_key: &str) -> Result<Path, TieringError> {
    Path::parse(object_key).map_err(|e| {
        TieringError::InvalidArgument(format!("object key '{object_key}' is not a valid path: {e}"))
    })
}

fn first_at_or_after(batch: &RecordBatch, timestamp_ms: i64) -> Result<Option<u64>, TieringError> {
    let offsets = batch.column_by_name("offset").and_then(|c| c.as_any().downcast_ref::<Int64Array>());
    let timestamps = batch
        .column_by_name("timestamp")
        .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>());
    let (Some(offsets), Some(timestamps)) = (offsets, timestamps) else {
        return Err(TieringError::InvalidArchive(
            "no int64 'offset' or timestamp(ms) 'timestamp' column".into(),
        ));
    };
    for i in 0..batch.num_rows() {
        if timestamps.is_valid(i) && timestamps.value(i) >= timestamp_ms && offsets.is_valid(i) {
            let offset = u64::try_from(offsets.value(i))
                .map_err(|_| TieringError::InvalidArchive(format!("negative offset {}", offsets.value(i))))?;
            return Ok(Some(offset));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive_format::tests::{meta_for, random_records};
    use crate::archive_format::{encode_archive, read_archive_meta, ArchiveWriterOptions};
    use crate::{
        object_key, object_store_from_url, FaultConfig, FaultInjectingObjectStore, FaultKind,
        InstrumentedObjectStore, ObjectStoreStats, RetryConfig, RetryingObjectStore,
    };
    use object_store::{PutMode, PutOptions, PutPayload};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::time::Duration;

    struct Fixture {
        _dir: tempfile::TempDir,
        records: Vec<Record>,
        key: String,
        object_bytes: u64,
        stats: Arc<ObjectStoreStats>,
        reader: ColdReader,
    }

    /// 10,000 records in a multi-row-group object in a `file://` store, a reader with a disk
    /// cache over an instrumented view of the same store.
    async fn fixture(base: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join("bucket");
        let opened = object_store_from_url(&format!("file://{}", bucket.display())).unwrap();
        let records = random_records(42, base, 10_000);
        let meta = meta_for(&records);
        let opts = ArchiveWriterOptions { row_group_rows_max: 1000, ..Default::default() };
        let object = encode_archive(&meta, &records, &opts).unwrap();
        let object_bytes = object.len() as u64;
        let key =
            object_key(&opened.prefix, &meta.topic, 1, meta.partition, meta.base_offset, meta.last_offset);
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        opened.store.put_opts(&key, PutPayload::from(object), create).await.unwrap();
        let (stored, md) = read_archive_meta(opened.store.as_ref(), &key, Some(object_bytes)).await.unwrap();
        assert_eq!(stored, meta);
        assert_eq!(md.num_row_groups(), 10);

        let instrumented = InstrumentedObjectStore::new(Arc::clone(&opened.store));
        let stats = instrumented.stats();
        let options = ColdReaderOptions {
            memory_bytes: 4 * 1024 * 1024,
            disk_dir: Some(dir.path().join("cache")),
            disk_bytes: 32 * 1024 * 1024,
            ..ColdReaderOptions::default()
        };
        let reader = ColdReader::new(Arc::new(instrumented), options).await.unwrap();
        Fixture { _dir: dir, records, key: key.to_string(), object_bytes, stats, reader }
    }

    fn expected(records: &[Record], from: u64, max: usize) -> Vec<Record> {
        records.iter().filter(|r| r.offset >= from).take(max).cloned().collect()
    }

    #[tokio::test]
    async fn reads_return_exactly_the_archived_records() {
        let f = fixture(5_000).await;
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..60 {
            let from = rng.random_range(4_990..15_010);
            let max = rng.random_range(1..40);
            let got = f.reader.read(&f.key, f.object_bytes, from, max).await.unwrap();
            assert_eq!(got, expected(&f.records, from, max), "from {from}, max {max}");
        }
        // Across row group boundaries, from the start, the whole object.
        let got = f.reader.read(&f.key, f.object_bytes, 5_990, 25).await.unwrap();
        assert_eq!(got, expected(&f.records, 5_990, 25));
        let got = f.reader.read(&f.key, f.object_bytes, 0, 3).await.unwrap();
        assert_eq!(got, expected(&f.records, 0, 3));
        let all = f.reader.read(&f.key, f.object_bytes, 5_000, 20_000).await.unwrap();
        assert_eq!(all, f.records);
        assert!(f.reader.read(&f.key, f.object_bytes, 15_000, 10).await.unwrap().is_empty());
        assert!(f.reader.read(&f.key, f.object_bytes, 5_000, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn reads_fetch_only_the_row_groups_they_need_and_cache_them() {
        let f = fixture(0).await;
        let got = f.reader.read(&f.key, f.object_bytes, 9_990, 10).await.unwrap();
        assert_eq!(got, expected(&f.records, 9_990, 10));
        let first = f.reader.stats();
        assert_eq!((first.footer_misses, first.cache_misses, first.cache_hits), (1, 1, 0));
        let fetched = f.stats.snapshot().bytes_in;
        assert_eq!(fetched, first.bytes_fetched, "the reader counts what the store served");
        assert!(
            fetched * 4 < f.object_bytes,
            "reading the last 10 records fetched {fetched} of {} bytes",
            f.object_bytes
        );

        // The same range again: cache hits, no request at all.
        let gets = f.stats.snapshot().requests();
        let again = f.reader.read(&f.key, f.object_bytes, 9_990, 10).await.unwrap();
        assert_eq!(again, got);
        let second = f.reader.stats();
        assert_eq!((second.footer_hits, second.cache_hits, second.cache_misses), (1, 1, 1));
        assert_eq!(f.stats.snapshot().requests(), gets, "a cached read issues no GET");
        let text = second.encode_prometheus();
        assert!(text.contains("silt_tiering_cold_row_groups_total{result=\"hit\"} 1\n"), "{text}");
        assert!(text.contains("silt_tiering_cold_footers_total{result=\"miss\"} 1\n"), "{text}");
        assert!(
            text.contains(&format!("silt_tiering_cold_fetched_bytes_total {}\n", second.bytes_fetched)),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_disk_cache_survives_a_restart() {
        let f = fixture(0).await;
        let all = f.reader.read(&f.key, f.object_bytes, 0, 10_000).await.unwrap();
        assert_eq!(all, f.records);
        assert_eq!(f.reader.stats().cache_misses, 10);
        f.reader.close().await.unwrap();
        let options = f.reader.options.clone();
        let store = Arc::clone(&f.reader.source.store);
        let Fixture { _dir, records, key, object_bytes, stats, reader } = f;
        drop(reader);

        let reopened = ColdReader::new(store, options).await.unwrap();
        let gets = stats.snapshot().gets();
        let again = reopened.read(&key, object_bytes, 0, 10_000).await.unwrap();
        assert_eq!(again, records);
        let s = reopened.stats();
        assert_eq!((s.cache_hits, s.cache_misses), (10, 0), "{s:?}");
        assert_eq!(stats.snapshot().gets(), gets + 1, "only the footer is fetched again");
    }

    #[tokio::test]
    async fn a_sequential_scan_keeps_what_it_reads_out_of_the_disk_cache() {
        let f = fixture(0).await;
        // A memory tier smaller than a row group: every row group leaves memory right after
        // its read, to the disk tier unless it was read for a scan.
        let disk_written = |readahead_bytes: usize, backwards: bool, dir: &str| {
            let options = ColdReaderOptions {
                memory_bytes: 16 * 1024,
                readahead_bytes,
                disk_dir: Some(f._dir.path().join(dir)),
                ..f.reader.options.clone()
            };
            let (store, key, object_bytes, records) =
                (Arc::clone(&f.reader.source.store), f.key.clone(), f.object_bytes, f.records.clone());
            async move {
                let reader = ColdReader::new(store, options).await.unwrap();
                // Pages of 500 from the start, or the same pages last to first (no read then
                // continues the one before it).
                let mut starts: Vec<u64> = records.iter().step_by(500).map(|r| r.offset).collect();
                if backwards {
                    starts.reverse();
                }
                let mut pages = Vec::new();
                for from in starts {
                    pages.push(reader.read(&key, object_bytes, from, 500).await.unwrap());
                }
                if backwards {
                    pages.reverse();
                }
                assert_eq!(pages.concat(), records);
                drained(&reader).await;
                reader.source.row_groups.storage().wait().await;
                (reader.source.row_groups.statistics().disk_write_bytes(), reader.stats())
            }
        };
        let (random, random_stats) = disk_written(0, true, "random").await;
        let (plain, plain_stats) = disk_written(0, false, "plain").await;
        let (scan, scan_stats) = disk_written(32 * 1024 * 1024, false, "scan").await;
        assert_eq!(plain_stats.readahead_row_groups, 0);
        assert!(scan_stats.readahead_row_groups >= 5, "most of the scan is read ahead: {scan_stats:?}");
        let row_groups = random_stats.bytes_fetched - 65_536; // less the footer read
        assert!(
            random as u64 * 2 >= row_groups,
            "reads that do not continue each other keep row groups on disk: {random} bytes written of {row_groups} read"
        );
        assert_eq!(plain, 0, "a scan without readahead wrote {plain} bytes to the disk cache");
        assert_eq!(scan, 0, "a scan with readahead wrote {scan} bytes to the disk cache");
    }

    #[tokio::test]
    async fn finds_offsets_by_time() {
        let f = fixture(100).await;
        let mut rng = StdRng::seed_from_u64(2);
        let min = f.records.iter().map(|r| r.timestamp_ms).min().unwrap();
        let max = f.records.iter().map(|r| r.timestamp_ms).max().unwrap();
        let mut probes: Vec<i64> = (0..30).map(|_| rng.random_range(min - 10..=max + 10)).collect();
        probes.extend([min, max, max + 1, i64::MIN]);
        for t in probes {
            let want = f.records.iter().find(|r| r.timestamp_ms >= t).map(|r| r.offset);
            assert_eq!(f.reader.offset_for_time(&f.key, f.object_bytes, t).await.unwrap(), want, "t {t}");
        }
        // A time past the last record needs the footer only.
        let before = f.reader.stats().cache_misses + f.reader.stats().cache_hits;
        assert_eq!(f.reader.offset_for_time(&f.key, f.object_bytes, max + 1).await.unwrap(), None);
        assert_eq!(f.reader.stats().cache_misses + f.reader.stats().cache_hits, before);
    }

    #[tokio::test]
    async fn missing_and_bad_objects_are_clear_errors() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let reader = ColdReader::new(Arc::clone(&store), ColdReaderOptions::default()).await.unwrap();
        let err = reader.read("topic=a/partition=0/missing.parquet", 1000, 0, 10).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        store.put(&Path::from("junk"), PutPayload::from_static(b"0123456789abcdef")).await.unwrap();
        let err = reader.read("junk", 16, 0, 10).await.unwrap_err();
        assert!(matches!(err, TieringError::InvalidArchive(_)), "{err}");
        assert!(reader.read("a//b", 16, 0, 1).await.is_err());
        let bad = ColdReaderOptions { concurrency_max: 0, ..ColdReaderOptions::default() };
        assert!(ColdReader::new(store, bad).await.is_err());
    }

    #[tokio::test]
    async fn concurrent_reads_share_one_fetch() {
        let faulty = FaultInjectingObjectStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig {
                error_rate: 1.0,
                kinds: vec![FaultKind::SlowGet],
                slow_get_ms: 50,
                ..FaultConfig::default()
            },
        );
        let instrumented = InstrumentedObjectStore::new(Arc::new(faulty));
        let stats = instrumented.stats();
        let store: Arc<dyn ObjectStore> = Arc::new(instrumented);
        let records = random_records(9, 0, 3000);
        let object = encode_archive(&meta_for(&records), &records, &ArchiveWriterOptions::default()).unwrap();
        let bytes = object.len() as u64;
        store.put(&Path::from("o.parquet"), PutPayload::from(object)).await.unwrap();
        let reader = Arc::new(ColdReader::new(store, ColdReaderOptions::default()).await.unwrap());
        let reads = (0..8).map(|i| {
            let reader = Arc::clone(&reader);
            tokio::spawn(async move { reader.read("o.parquet", bytes, i * 100, 50).await })
        });
        for (i, read) in futures::future::join_all(reads).await.into_iter().enumerate() {
            assert_eq!(read.unwrap().unwrap(), expected(&records, i as u64 * 100, 50));
        }
        let s = reader.stats();
        assert_eq!((s.footer_misses, s.cache_misses), (1, 1), "{s:?}");
        assert_eq!(stats.snapshot().gets(), 2, "one footer GET and one row group GET for 8 readers");
    }

    #[tokio::test]
    async fn a_fetch_that_stalls_is_answered_by_a_hedged_request() {
        let faulty = Arc::new(FaultInjectingObjectStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            // Only the queued fault below, and it stalls for an hour.
            FaultConfig { error_rate: 0.0, slow_get_ms: 3_600_000, ..FaultConfig::default() },
        ));
        let instrumented = InstrumentedObjectStore::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>);
        let stats = instrumented.stats();
        let store: Arc<dyn ObjectStore> = Arc::new(instrumented);
        let records = random_records(3, 0, 3000);
        let opts = ArchiveWriterOptions { row_group_rows_max: 500, ..Default::default() };
        let object = encode_archive(&meta_for(&records), &records, &opts).unwrap();
        let bytes = object.len() as u64;
        store.put(&Path::from("o.parquet"), PutPayload::from(object)).await.unwrap();
        let options = ColdReaderOptions {
            hedge_after: Some(Duration::from_millis(20)),
            readahead_bytes: 0,
            ..ColdReaderOptions::default()
        };
        let reader = ColdReader::new(store, options).await.unwrap();
        // Footer and first row group: answered at once, nothing hedged.
        assert_eq!(reader.read("o.parquet", bytes, 0, 10).await.unwrap(), expected(&records, 0, 10));
        assert_eq!((reader.stats().hedged_fetches, stats.snapshot().gets()), (0, 2));
        // The next request (the one `read` makes first) stalls for an hour unless hedged.
        let stalled_read = |key: &'static str, bytes: u64, from: u64| {
            faulty.inject_next(FaultKind::SlowGet);
            let read = reader.read(key, bytes, from, 10);
            async move {
                tokio::time::timeout(Duration::from_secs(60), read)
                    .await
                    .unwrap_or_else(|_| panic!("a stalled fetch of {key} was waited out instead of hedged"))
                    .unwrap()
            }
        };
        // The next row group's request stalls; the hedge beside it answers.
        assert_eq!(stalled_read("o.parquet", bytes, 2_600).await, expected(&records, 2_600, 10));
        assert_eq!(faulty.injected(), 1);
        let s = reader.stats();
        assert_eq!((s.hedged_fetches, s.hedge_wins, s.cache_misses), (1, 1, 2), "{s:?}");
        // The store counts both requests, the dropped one too: the bucket got (and bills) it.
        assert_eq!(stats.snapshot().gets(), 4);
        let text = s.encode_prometheus();
        assert!(text.contains("silt_tiering_cold_hedged_fetches_total{used=\"hedge\"} 1"), "{text}");
        assert!(text.contains("silt_tiering_cold_hedged_fetches_total{used=\"original\"} 0"), "{text}");

        // A footer fetch that stalls is hedged too.
        let other = random_records(4, 3000, 1000);
        let object = encode_archive(&meta_for(&other), &other, &opts).unwrap();
        let other_bytes = object.len() as u64;
        reader.source.store.put(&Path::from("p.parquet"), PutPayload::from(object)).await.unwrap();
        assert_eq!(stalled_read("p.parquet", other_bytes, 3000).await, expected(&other, 3000, 10));
        assert_eq!(faulty.injected(), 2);
        let s = reader.stats();
        assert_eq!((s.footer_misses, s.hedged_fetches, s.hedge_wins), (2, 2, 2), "{s:?}");
    }

    /// A call of [`hedged`] whose attempts end when the test says, each with its own result.
    struct Attempts {
        started: std::sync::atomic::AtomicUsize,
        release: Vec<Notify>,
        results: Vec<Result<&'static str, &'static str>>,
    }

    impl Attempts {
        fn new(results: Vec<Result<&'static str, &'static str>>) -> Arc<Attempts> {
            Arc::new(Attempts {
                started: Default::default(),
                release: (0..results.len()).map(|_| Notify::new()).collect(),
                results,
            })
        }

        async fn call(self: Arc<Self>) -> Result<&'static str, &'static str> {
            let i = self.started.fetch_add(1, Ordering::SeqCst);
            self.release[i].notified().await;
            self.results[i]
        }

        /// Starts `hedged` over these attempts on its own task, and waits until `n` of them
        /// started.
        async fn start(
            self: &Arc<Self>,
            hedging: Option<Hedging>,
            counters: &Arc<Counters>,
            n: usize,
        ) -> tokio::task::JoinHandle<Result<&'static str, &'static str>> {
            let (a, c) = (Arc::clone(self), Arc::clone(counters));
            let run =
                tokio::spawn(async move { hedged(hedging.as_ref(), &c, || Arc::clone(&a).call()).await });
            self.wait_started(n).await;
            run
        }

        async fn wait_started(&self, n: usize) {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while self.started.load(Ordering::SeqCst) < n {
                assert!(std::time::Instant::now() < deadline, "attempt {n} never started");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    #[tokio::test]
    async fn a_hedge_waits_for_the_other_request_when_one_fails_and_both_failing_is_the_first_error() {
        let after = || Some(Hedging::new(Duration::from_millis(5), Arc::new(Semaphore::new(8))));
        // The original fails after the hedge started: the hedge's answer is used.
        let attempts = Attempts::new(vec![Err("original failed"), Ok("hedge")]);
        let counters = Arc::new(Counters::default());
        let run = attempts.start(after(), &counters, 2).await;
        attempts.release[0].notify_one();
        attempts.release[1].notify_one();
        assert_eq!(run.await.unwrap(), Ok("hedge"));
        assert_eq!(get(&counters.hedged_fetches), 1);
        assert_eq!(get(&counters.hedge_wins), 1);

        // The hedge fails first: the original's answer is used, and it is no win.
        let attempts = Attempts::new(vec![Ok("original"), Err("hedge failed")]);
        let counters = Arc::new(Counters::default());
        let run = attempts.start(after(), &counters, 2).await;
        attempts.release[1].notify_one();
        attempts.release[0].notify_one();
        assert_eq!(run.await.unwrap(), Ok("original"));
        assert_eq!((get(&counters.hedged_fetches), get(&counters.hedge_wins)), (1, 0));

        // Both fail: the original's error.
        let attempts = Attempts::new(vec![Err("original failed"), Err("hedge failed")]);
        let counters = Arc::new(Counters::default());
        let run = attempts.start(after(), &counters, 2).await;
        attempts.release[0].notify_one();
        attempts.release[1].notify_one();
        assert_eq!(run.await.unwrap(), Err("original failed"));

        // Without hedging, or without a free fetch permit, never a second request, however
        // long the first takes (a request that answers after 50 times the delay).
        let no_permit = Hedging::new(Duration::from_millis(1), Arc::new(Semaphore::new(0)));
        for hedging in [None, Some(no_permit)] {
            let started = std::sync::atomic::AtomicUsize::new(0);
            let counters = Counters::default();
            let slow_request = || {
                started.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, &str>("only")
                }
            };
            assert_eq!(hedged(hedging.as_ref(), &counters, slow_request).await, Ok("only"));
            assert_eq!(started.load(Ordering::SeqCst), 1);
            assert_eq!(get(&counters.hedged_fetches), 0);
        }
    }

    #[test]
    fn hedges_come_out_of_a_budget_of_a_twentieth_of_the_fetches_and_need_a_free_permit() {
        let permits = Arc::new(Semaphore::new(100));
        let hedging = Hedging::new(Duration::from_secs(1), Arc::clone(&permits));
        // A burst of stalls gets HEDGE_BURST hedges, then none.
        let burst: Vec<_> = (0..HEDGE_BURST).map(|_| hedging.take().expect("a hedge of the burst")).collect();
        assert!(hedging.take().is_none());
        assert_eq!(permits.available_permits(), 100 - HEDGE_BURST as usize);
        drop(burst);
        // Then one hedge per 20 fetches.
        for _ in 0..19 {
            hedging.earn();
        }
        assert!(hedging.take().is_none(), "19 fetches do not earn a hedge");
        hedging.earn();
        assert!(hedging.take().is_some(), "20 fetches earn one");
        // Saving stops at the burst.
        for _ in 0..10_000 {
            hedging.earn();
        }
        assert_eq!((0..HEDGE_BURST + 5).filter_map(|_| hedging.take()).count() as u64, HEDGE_BURST);
        // With the budget there but no free permit, no hedge, and the budget is kept.
        let none_free = Hedging::new(Duration::from_secs(1), Arc::new(Semaphore::new(0)));
        assert!(none_free.take().is_none());
        assert_eq!(none_free.budget_millis.load(Ordering::Relaxed), HEDGE_BURST * 1000);
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn archives_round_trip_through_a_failing_store() {
        let faulty = FaultInjectingObjectStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig { error_rate: 0.3, seed: 11, slow_get_ms: 2, ..FaultConfig::default() },
        );
        let config = RetryConfig {
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(8),
            ..RetryConfig::default()
        };
        let store: Arc<dyn ObjectStore> =
            Arc::new(RetryingObjectStore::new(Arc::new(faulty)).with_config(config).with_seed(3));
        let reader = ColdReader::new(Arc::clone(&store), ColdReaderOptions::default()).await.unwrap();
        for (i, base) in [0u64, 700, 1900].into_iter().enumerate() {
            let records = random_records(i as u64, base, 700);
            let meta = meta_for(&records);
            let opts = ArchiveWriterOptions { row_group_rows_max: 128, ..Default::default() };
            let object = encode_archive(&meta, &records, &opts).unwrap();
            let bytes = object.len() as u64;
            let key = object_key(&Path::from("silt"), &meta.topic, 1, meta.partition, base, meta.last_offset);
            // Overwrite puts: a lost reply is simply written again.
            store.put(&key, PutPayload::from(object)).await.unwrap();
            let (stored, _) = read_archive_meta(store.as_ref(), &key, None).await.unwrap();
            assert_eq!(stored, meta);
            let mut got = Vec::new();
            while got.len() < records.len() {
                let from = got.last().map_or(base, |r: &Record| r.offset + 1);
                got.extend(reader.read(key.as_ref(), bytes, from, 97).await.unwrap());
            }
            assert_eq!(got, records);
        }
    }

    /// A memory-only reader over the fixture's store.
    async fn reader_with(f: &Fixture, readahead_bytes: usize, decoded_memory_bytes: usize) -> ColdReader {
        let options =
            ColdReaderOptions { readahead_bytes, decoded_memory_bytes, ..ColdReaderOptions::default() };
        ColdReader::new(Arc::clone(&f.reader.source.store), options).await.unwrap()
    }

    async fn drained(reader: &ColdReader) {
        tokio::time::timeout(Duration::from_secs(30), reader.readahead_drained())
            .await
            .expect("the readahead finishes");
    }

    /// Eight sequential readers of one object at once, from its start, in byte-limited pages,
    /// thirty rounds each with a fresh reader (nothing decoded yet): they meet each other's
    /// readahead in the decoded cache all the time (hits, fetches in flight). The runtime runs
    /// on a thread of its own so that a reader frozen on a lock (which no timeout inside the
    /// runtime can end) fails the test at its deadline instead of hanging it.
    #[test]
    fn concurrent_sequential_readers_never_freeze_the_reader() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async {
                let f = fixture(0).await;
                for round in 0..30 {
                    let reader = Arc::new(reader_with(&f, 4 * 1024 * 1024, 8 * 1024 * 1024).await);
                    let mut readers = tokio::task::JoinSet::new();
                    for r in 0..8usize {
                        let (reader, key, bytes) = (Arc::clone(&reader), f.key.clone(), f.object_bytes);
                        readers.spawn(async move {
                            let (mut from, mut got) = (0u64, 0usize);
                            while got < 10_000 {
                                let page = reader
                                    .read_limited(&key, bytes, from, ReadLimit::new(700 + 97 * r, 64 * 1024))
                                    .await
                                    .unwrap();
                                assert_eq!(page.first().map(|rec| rec.offset), Some(from));
                                got += page.len();
                                from += page.len() as u64;
                            }
                            got
                        });
                    }
                    while let Some(got) = readers.join_next().await {
                        assert_eq!(got.unwrap(), 10_000, "round {round}");
                    }
                    drained(&reader).await;
                }
            });
            done_tx.send(()).unwrap();
        });
        done_rx.recv_timeout(Duration::from_secs(300)).expect("the readers finish: none froze");
    }

    /// The lock order, shown without waiting for a rare interleaving: a thread holds the decoded
    /// cache's shard lock (inside the cache, dropping a fetch future it will not run, as it does
    /// for a hit), and a readahead starts meanwhile. The readahead may wait for the cache, but
    /// never while it holds the planner's mutex: a thread holding the cache's lock that took
    /// the planner's (a readahead slot's drop once did) would otherwise wait on it forever.
    /// The check runs for two seconds; an order that is wrong shows as soon as the readahead
    /// thread runs.
    #[test]
    fn a_readahead_never_waits_for_the_cache_while_it_holds_the_planner() {
        use std::sync::mpsc;
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let f = runtime.block_on(fixture(0));
        let reader = Arc::new(runtime.block_on(reader_with(&f, 32 * 1024 * 1024, 64 * 1024 * 1024)));
        // Row group 0 decoded and in the cache, the readahead it started done.
        runtime.block_on(async {
            reader.read(&f.key, f.object_bytes, 0, 10).await.unwrap();
            drained(&reader).await;
        });
        let footer = runtime.block_on(reader.footer(&f.key, f.object_bytes)).unwrap();
        let hit = RowGroupKey { object_key: f.key.clone(), object_bytes: f.object_bytes, row_group: 0 };
        assert!(reader.decoded.contains(&hit));

        /// Dropped by the cache under its shard lock: says so, then holds the lock until told.
        struct InsideTheCache {
            inside: mpsc::Sender<()>,
            go: std::sync::Mutex<mpsc::Receiver<()>>,
        }
        impl Drop for InsideTheCache {
            fn drop(&mut self) {
                let _ = self.inside.send(());
                let _ = self.go.lock().unwrap().recv();
            }
        }
        let (inside_tx, inside_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        let probe = InsideTheCache { inside: inside_tx, go: std::sync::Mutex::new(go_rx) };
        let holder = {
            let (reader, handle) = (Arc::clone(&reader), runtime.handle().clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let fetch = async move {
                    let _probe = probe;
                    Err::<Arc<DecodedRowGroup>, std::io::Error>(std::io::Error::other("never run"))
                };
                drop(reader.decoded.get_or_fetch(&hit, move || fetch));
            })
        };
        inside_rx.recv_timeout(Duration::from_secs(30)).expect("the cache dropped the fetch");
        let readahead = {
            let (reader, handle, footer, key, bytes) = (
                Arc::clone(&reader),
                runtime.handle().clone(),
                Arc::clone(&footer),
                f.key.clone(),
                f.object_bytes,
            );
            std::thread::spawn(move || {
                let _entered = handle.enter();
                reader.read_ahead(&key, bytes, &footer, 0);
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let mut held_while_waiting = false;
        while std::time::Instant::now() < deadline && !readahead.is_finished() {
            if reader.readahead.planner.try_lock().is_err() {
                held_while_waiting = true;
                break;
            }
            std::thread::yield_now();
        }
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        readahead.join().unwrap();
        assert!(!held_while_waiting, "a readahead held the planner's mutex while it waited for the cache");
        runtime.block_on(drained(&reader));
    }

    #[tokio::test]
    async fn readahead_returns_the_same_records() {
        let f = fixture(3_000).await;
        let without = reader_with(&f, 0, 64 * 1024 * 1024).await;
        let with = reader_with(&f, 32 * 1024 * 1024, 64 * 1024 * 1024).await;
        for page in [1usize, 333, 1000, 2500] {
            let (mut from, mut got_without, mut got_with) = (3_000u64, Vec::new(), Vec::new());
            loop {
                let a = without.read(&f.key, f.object_bytes, from, page).await.unwrap();
                let b = with.read(&f.key, f.object_bytes, from, page).await.unwrap();
                assert_eq!(a, b, "page of {page} from {from}");
                let Some(last) = b.last() else { break };
                from = last.offset + 1;
                got_without.extend(a);
                got_with.extend(b);
            }
            assert_eq!(got_without, f.records);
            assert_eq!(got_with, f.records);
        }
        drained(&with).await;
        let (a, b) = (without.stats(), with.stats());
        assert_eq!(a.readahead_row_groups, 0);
        assert!(b.readahead_row_groups > 0, "{b:?}");
        // Each row group is fetched once either way: the reads wait for what is read ahead.
        assert_eq!((a.cache_misses, b.cache_misses), (10, 10), "{a:?} {b:?}");
        assert_eq!(a.bytes_fetched, b.bytes_fetched);
    }

    #[tokio::test]
    async fn byte_limited_pages_return_every_record_once_and_keep_the_readahead_going() {
        let f = fixture(0).await;
        let reader = reader_with(&f, 32 * 1024 * 1024, 64 * 1024 * 1024).await;
        let mean = f.records.iter().map(Record::data_len).sum::<usize>() / f.records.len();
        let max_bytes = 700 * mean;
        let (mut from, mut got, mut pages) = (0u64, Vec::new(), 0);
        loop {
            let page = reader
                .read_limited(&f.key, f.object_bytes, from, ReadLimit::new(10_000, max_bytes))
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            let bytes: usize = page.iter().map(Record::data_len).sum();
            assert!(page.len() == 1 || bytes <= max_bytes, "{bytes} bytes in a page of {max_bytes}");
            from = last.offset + 1;
            got.extend(page);
            pages += 1;
        }
        assert_eq!(got, f.records);
        assert!(pages >= 10, "the byte limit ended the pages, not the record limit: {pages} pages");
        // Each page continues the one before, so the readahead keeps going past the first.
        drained(&reader).await;
        let stats = reader.stats();
        assert!(stats.readahead_row_groups >= 8, "{stats:?}");
        // The first record comes whatever its size.
        let one = reader.read_limited(&f.key, f.object_bytes, 0, ReadLimit::new(10, 1)).await.unwrap();
        assert_eq!(one, f.records[..1].to_vec());
        // Unless the caller has no room for it: then nothing, and the stream is undisturbed.
        let later = ReadLimit { at_least_one: false, ..ReadLimit::new(10, 1) };
        let none = reader.read_limited(&f.key, f.object_bytes, 1, later).await.unwrap();
        assert!(none.is_empty());
        let stats = reader.stats();
        let rest = ReadLimit { at_least_one: false, ..ReadLimit::new(10, usize::MAX) };
        let next = reader.read_limited(&f.key, f.object_bytes, 1, rest).await.unwrap();
        assert_eq!(next, f.records[1..11].to_vec());
        assert_eq!(
            reader.stats().sequential_reads,
            stats.sequential_reads + 1,
            "it continues the read of one"
        );
    }

    /// Both halves of reading the next object ahead, as the agent calls them.
    async fn read_ahead_next(reader: &ColdReader, f: &Fixture, next: u64, then_key: &str, then_bytes: u64) {
        if let Some(due) = reader.next_object_due(&f.key, f.object_bytes, next).await.unwrap() {
            reader.read_ahead_next_object(due, then_key, then_bytes).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_stream_near_the_end_of_an_object_reads_the_next_object_ahead() {
        let f = fixture(0).await;
        // The partition's next object: offsets 10,000 to 19,999 in ten row groups.
        let records = random_records(43, 10_000, 10_000);
        let opts = ArchiveWriterOptions { row_group_rows_max: 1000, ..Default::default() };
        let object = encode_archive(&meta_for(&records), &records, &opts).unwrap();
        let then_bytes = object.len() as u64;
        let then_key =
            f.key.replace(&format!("{:020}-{:020}", 0, 9_999), &format!("{:020}-{:020}", 10_000, 19_999));
        assert_ne!(then_key, f.key);
        f.reader.source.store.put(&Path::from(then_key.as_str()), PutPayload::from(object)).await.unwrap();
        let reader = reader_with(&f, 32 * 1024 * 1024, 64 * 1024 * 1024).await;
        let read_to = |to: u64| {
            let reader = &reader;
            let key = f.key.clone();
            async move {
                let mut from = 0;
                while from < to {
                    let page = reader.read(&key, f.object_bytes, from, 1000).await.unwrap();
                    from = page.last().unwrap().offset + 1;
                }
                from
            }
        };
        // In the middle of the object its own readahead has row groups to go: nothing more.
        let next = read_to(3_000).await;
        drained(&reader).await;
        let work = |s: ColdReaderStats| (s.cache_misses, s.fetches, s.readahead_row_groups);
        let mid = reader.stats();
        read_ahead_next(&reader, &f, next, &then_key, then_bytes).await;
        drained(&reader).await;
        assert_eq!(work(reader.stats()), work(mid), "read the next object ahead from the middle of this one");
        // Where a seek near the end ended (a message read on its own): nothing either.
        let seek = reader.read(&f.key, f.object_bytes, 9_500, 1).await.unwrap();
        assert_eq!(seek, f.records[9_500..9_501].to_vec());
        drained(&reader).await;
        let sought = reader.stats();
        read_ahead_next(&reader, &f, 9_501, &then_key, then_bytes).await;
        drained(&reader).await;
        assert_eq!(work(reader.stats()), work(sought), "read the next object ahead after a seek");
        // In the last row groups: the next object's first row group is decoded in the background,
        // and the stream's first read there fetches nothing.
        let next = read_to(9_000).await;
        read_ahead_next(&reader, &f, next, &then_key, then_bytes).await;
        drained(&reader).await;
        let before = reader.stats();
        assert_eq!(read_to(10_000).await, 10_000);
        let first = reader.read(&then_key, then_bytes, 10_000, 1000).await.unwrap();
        assert_eq!(first, records[..1000].to_vec());
        let after = reader.stats();
        assert_eq!(after.cache_misses, before.cache_misses, "{before:?} then {after:?}");
    }

    #[tokio::test]
    async fn concurrent_scans_fetch_each_row_group_once() {
        let f = fixture(0).await;
        let footer = f.reader.footer(&f.key, f.object_bytes).await.unwrap();
        let largest = *footer.row_group_bytes.iter().max().unwrap() as usize;
        // Room for each scan's current row group and the two read ahead of them, and no more.
        let reader = Arc::new(reader_with(&f, 4 * largest, 8 * largest).await);
        let scans = [(0u64, 5_000u64), (5_000, 10_000)].map(|(from, end)| {
            let (reader, key, object_bytes) = (Arc::clone(&reader), f.key.clone(), f.object_bytes);
            tokio::spawn(async move {
                let (mut next, mut got) = (from, Vec::new());
                while next < end {
                    let page = reader.read(&key, object_bytes, next, 250).await.unwrap();
                    next = page.last().expect("records up to the end").offset + 1;
                    got.extend(page.into_iter().filter(|r| r.offset < end));
                }
                got
            })
        });
        let mut got = Vec::new();
        for scan in scans {
            got.extend(scan.await.unwrap());
        }
        assert_eq!(got, f.records);
        drained(&reader).await;
        let s = reader.stats();
        assert!(s.readahead_row_groups >= 4, "{s:?}");
        assert_eq!(s.cache_misses, 10, "every row group fetched once, none again after an eviction: {s:?}");
    }

    #[tokio::test]
    async fn readahead_only_follows_sequential_reads_within_its_bounds() {
        let f = fixture(0).await;
        let footer = f.reader.footer(&f.key, f.object_bytes).await.unwrap();
        let largest = *footer.row_group_bytes.iter().max().unwrap() as usize;
        assert!(footer.row_group_bytes.windows(2).all(|w| (w[0] + w[1]) as usize > largest));

        // A budget of one row group: one row group ahead.
        let reader = reader_with(&f, largest, 1024 * 1024 * 1024).await;
        let got = reader.read(&f.key, f.object_bytes, 5_500, 10).await.unwrap();
        assert_eq!(got, expected(&f.records, 5_500, 10));
        drained(&reader).await;
        let s = reader.stats();
        assert_eq!((s.readahead_row_groups, s.cache_misses), (0, 1), "a read in the middle: {s:?}");

        let got = reader.read(&f.key, f.object_bytes, 5_510, 10).await.unwrap();
        assert_eq!(got, expected(&f.records, 5_510, 10));
        drained(&reader).await;
        let s = reader.stats();
        assert_eq!((s.readahead_row_groups, s.cache_misses), (1, 2), "it continues: row group 6 {s:?}");
        let gets = f.stats.snapshot().gets();

        // At the object's start; then a sequential pass to the end reads ahead every row group
        // once, and nothing past the last.
        let reader = reader_with(&f, largest, 1024 * 1024 * 1024).await;
        let mut from = 0;
        while from < 10_000 {
            let got = reader.read(&f.key, f.object_bytes, from, 400).await.unwrap();
            assert_eq!(got, expected(&f.records, from, 400));
            drained(&reader).await;
            let s = reader.stats();
            // Fetched: every row group read so far, and the one after the last.
            let last = (from + 399).min(9_999) / 1000;
            assert_eq!(
                (s.readahead_row_groups, s.cache_misses),
                ((last + 1).min(9), (last + 2).min(10)),
                "{from}: {s:?}"
            );
            from += 400;
        }
        let s = reader.stats();
        assert_eq!((s.readahead_row_groups, s.cache_misses), (9, 10), "{s:?}");
        assert_eq!(f.stats.snapshot().gets(), gets + 1 + 10, "the footer and each row group once");

        // A budget of two row groups: two ahead.
        let reader = reader_with(&f, 2 * largest, 1024 * 1024 * 1024).await;
        reader.read(&f.key, f.object_bytes, 0, 10).await.unwrap();
        drained(&reader).await;
        let s = reader.stats();
        assert_eq!((s.readahead_row_groups, s.cache_misses), (2, 3), "{s:?}");

        // Never more than half of the decoded cache.
        assert!(footer.row_group_bytes.iter().all(|b| *b as usize > largest / 2));
        let reader = reader_with(&f, 2 * largest, largest).await;
        reader.read(&f.key, f.object_bytes, 0, 10).await.unwrap();
        drained(&reader).await;
        assert_eq!(reader.stats().readahead_row_groups, 0, "{:?}", reader.stats());
    }

    #[tokio::test]
    async fn memory_only_cache_evicts_but_stays_correct() {
        let f = fixture(0).await;
        let options = ColdReaderOptions { memory_bytes: 64 * 1024, ..ColdReaderOptions::default() };
        let small = ColdReader::new(Arc::clone(&f.reader.source.store), options).await.unwrap();
        for from in [0u64, 5_000, 9_000, 0] {
            let got = small.read(&f.key, f.object_bytes, from, 1500).await.unwrap();
            assert_eq!(got, expected(&f.records, from, 1500));
        }
    }
}
