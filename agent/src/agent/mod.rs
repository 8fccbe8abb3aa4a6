//! The agent: everything behind the client API. It owns the partition writers of this
//! process, routes produce requests to them, serves replays from the local logs and runs
//! consumer-group delivery (leases, redelivery, dead-lettering, ack checkpoints).
//!
//! One `Agent`, its `impl` split by concern: this file holds its state, lifecycle, the
//! supervisor of writers, topics, produce and reads; [`follower`] the follower's side of
//! replication, [`repair`] ensemble repair, [`groups`] consumer groups.

mod follower;
mod groups;
mod repair;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_metadata::state::{GroupMode, Topic};
use silt_metadata::{Command, Metadata, MetadataError, Response};
use silt_record::{
    partition_for_key, validate_topic_name, BatchBuilder, Header, MessageId, NewRecord, Record, RecordBatch,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::{ApiError, ErrorCode, StoreError};
use crate::group_cursor::{AckOutcome, Delivered, Expired, GroupCursor};
use crate::limits::{
    check_max_bytes, ReadLimit, ACK_IDS_MAX, POLL_MAX, POLL_TIMEOUT_MAX, PRODUCE_MESSAGES_MAX,
    READ_BYTES_DEFAULT, READ_BYTES_MAX, REPLICA_READ_BYTES_MAX, SESSION_TIMEOUT_MAX,
};
use crate::metrics::{ForwardLabels, LagLabels, Metrics, RepairLabels, ReplicaLabels};
use crate::partition_log::{PartitionLog, PartitionReader};
use crate::partition_writer::{self, PartitionHandle, WriterConfig};
use crate::peer::{CollectRequest, Peers, ReplicaTarget, WireRecord};
use crate::replica::{join_batches, split_batches, trim_to_metadata, HeldSegment, Replica};
use crate::replication::FollowerLag;
use crate::segment::ReadMode;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use silt_tiering::cold_reader::ColdReader;
use silt_tiering::locate::{locate, Location};

/// Bytes read from a partition per step of a poll or replay.
const READ_BYTES_STEP: usize = 1024 * 1024;
/// Most records one read of another agent's replica asks for.
const REPLAY_STEP: u64 = 10_000;
/// How often dirty ack state is checkpointed to metadata.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);
/// How often a waiting poll asks other agents for the partitions they write.
const REMOTE_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Suffix of dead-letter topics.
pub const DLQ_SUFFIX: &str = ".dlq";

/// How often the agent compares the partitions it runs with the ones metadata gives it.
const SUPERVISE_INTERVAL: Duration = Duration::from_millis(250);
/// A read still running after this long logs where it is, and again after each further period.
const SLOW_READ_WARN_AFTER: Duration = Duration::from_secs(20);

/// Where a read is, and at which offset, for [`Agent::read`]'s warning about slow reads.
struct ReadStage(Mutex<(&'static str, u64)>);

impl ReadStage {
    fn new(offset: u64) -> ReadStage {
        ReadStage(Mutex::new(("starting", offset)))
    }

    fn set(&self, stage: &'static str, offset: u64) {
        *lock(&self.0) = (stage, offset);
    }

    fn get(&self) -> (&'static str, u64) {
        *lock(&self.0)
    }
}

/// How often the agent measures the disk space its logs take and the space left.
const DISK_USAGE_INTERVAL: Duration = Duration::from_secs(10);
/// How soon a writer that failed to start is tried again.
const START_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// The default agent lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// How long an agent may be gone before its replicas of sealed segments are copied elsewhere.
pub const DEFAULT_REPLICA_REPAIR_AFTER: Duration = Duration::from_secs(60);

/// Where and who this agent is.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Id recorded as partition writer.
    pub agent_id: String,
    /// Where other agents and clients reach this agent (`host:port`), recorded in metadata.
    pub advertise_addr: String,
    /// Root of the agent's local state (`{data_dir}/log/...`).
    pub data_dir: PathBuf,
    /// Metadata names another writer for this agent's partitions when it has not heartbeated
    /// for this long. It heartbeats every third of it.
    pub lease: Duration,
    /// `replication.factor` of topics created through this agent without one.
    pub default_replication_factor: u32,
    /// Ensemble repair: a sealed segment's replica on an agent gone for this long (lease
    /// lapsed) is copied to another agent. A replica on a replaced disk is copied at once.
    pub replica_repair_after: Duration,
    /// The local address connections to other agents leave from (hosts with several
    /// addresses); `None` lets the OS choose.
    pub peer_source_ip: Option<std::net::IpAddr>,
}

impl AgentConfig {
    /// A config with the default lease.
    pub fn new(agent_id: impl Into<String>, advertise_addr: impl Into<String>, data_dir: PathBuf) -> Self {
        AgentConfig {
            agent_id: agent_id.into(),
            advertise_addr: advertise_addr.into(),
            data_dir,
            lease: DEFAULT_LEASE,
            default_replication_factor: 1,
            replica_repair_after: DEFAULT_REPLICA_REPAIR_AFTER,
            peer_source_ip: None,
        }
    }
}

/// A partition writer this agent runs: under which topic id and epoch, and how to stop it.
struct Running {
    topic_id: u64,
    epoch: u64,
    handle: PartitionHandle,
    /// The topic's replication.factor, for the under-replication metric.
    replication_factor: usize,
}

/// A partition whose writer failed to start or ended on its own (it lost its quorum, or a
/// write failed), and has not run for a whole lease since.
struct StartFailure {
    /// The first failure of the streak.
    since: Instant,
    /// The latest one.
    at: Instant,
    error: ApiError,
    /// Failures in the streak.
    failures: u32,
    /// When the writer started after the latest failure, if it runs: a writer that keeps
    /// running for a lease ends the streak.
    started: Option<Instant>,
    /// When handing the partition to another agent last failed.
    handoff_failed: Option<Instant>,
}

impl StartFailure {
    /// Counts a failure `now` into the streak `previous` (if any).
    fn after(previous: Option<&StartFailure>, error: ApiError) -> StartFailure {
        let now = Instant::now();
        StartFailure {
            since: previous.map_or(now, |f| f.since),
            at: now,
            error,
            failures: previous.map_or(1, |f| f.failures + 1),
            started: None,
            handoff_failed: previous.and_then(|f| f.handoff_failed),
        }
    }
}

/// Where requests about one partition go.
enum Target {
    /// This agent writes it.
    Local(PartitionHandle),
    /// Another agent writes it.
    Remote {
        /// Its id.
        agent: String,
        /// Where it serves.
        addr: String,
    },
}

impl Target {
    fn peer(&self) -> Option<(&str, &str)> {
        match self {
            Target::Local(_) => None,
            Target::Remote { agent, addr } => Some((agent, addr)),
        }
    }
}

/// What stops a running writer and waits for it.
struct WriterTask {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

/// A partition's writer task while one runs here. Its lock is the partition's alone: held while
/// the writer starts (which fences and copies over the network) or stops, and by what must not
/// overlap with that (opening a replica, dropping the local log). Requests about other
/// partitions, the fences other agents send while they start writers of their own among them,
/// never wait for it.
type WriterSlot = Arc<tokio::sync::Mutex<Option<WriterTask>>>;

/// A message to produce, before it has a partition.
#[derive(Debug, Clone, Default)]
pub struct ProduceMessage {
    /// Explicit partition; otherwise chosen by key, or spread when there is no key.
    pub partition: Option<u32>,
    /// Key.
    pub key: Option<Bytes>,
    /// Value.
    pub value: Option<Bytes>,
    /// Headers.
    pub headers: Vec<Header>,
    /// Timestamp; the agent's clock when absent.
    pub timestamp_ms: Option<i64>,
}

/// A poll request.
#[derive(Debug, Clone)]
pub struct PollRequest {
    /// Topic.
    pub topic: String,
    /// Group.
    pub group: String,
    /// Member id of the caller.
    pub member: String,
    /// Group mode.
    pub mode: GroupMode,
    /// Most messages to return.
    pub max: u32,
    /// Most bytes of keys, values and headers to return (the first message whatever its size).
    pub max_bytes: usize,
    /// Longest to wait for one.
    pub timeout: Duration,
    /// The member loses its partitions after this long without a poll.
    pub session_timeout: Duration,
}

/// Lag and delivery state of a group on one partition.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartitionLag {
    /// Partition.
    pub partition: u32,
    /// Assigned member (exclusive mode).
    pub member: Option<String>,
    /// Every offset below is acknowledged.
    pub ack_floor: u64,
    /// End of the partition.
    pub high_watermark: u64,
    /// Records between the floor and the end.
    pub lag: u64,
    /// Delivered and not yet acknowledged.
    pub in_flight: usize,
}

type CursorKey = (String, String, u32);
/// A retired local log: the topic id it belongs to, and its read half.
type Retired = (u64, Arc<PartitionReader>);
/// A retired log to check: its partition, topic id and the offset ranges it holds.
type RetiredRanges = ((String, u32), u64, Vec<(u64, u64)>);
/// One ensemble repair: copy a sealed segment to `with` in place of `gone`.
struct Repair {
    topic: String,
    topic_id: u64,
    partition: u32,
    segment: u64,
    segment_epoch: u64,
    /// The member `with` replaces; `None` adds `with` to a segment sealed with fewer than R
    /// members.
    gone: Option<String>,
    with: String,
    with_addr: String,
    with_instance: String,
}

/// What request paths need of a topic: its name, id, configuration and partition count, read
/// from metadata without copying the partitions' segment chains. A chain grows with the topic's
/// history; copying it on every produce or poll made requests slower the older the topic.
#[derive(Debug, Clone)]
struct TopicInfo {
    name: String,
    id: u64,
    config: silt_metadata::TopicConfig,
    partitions: u32,
}

impl TopicInfo {
    fn of(t: &Topic) -> TopicInfo {
        TopicInfo {
            name: t.name.clone(),
            id: t.id,
            config: t.config.clone(),
            partitions: u32::try_from(t.partitions.len()).unwrap_or(u32::MAX),
        }
    }
}

/// A followed partition's replica; `None` once closed (the agent writes the partition now, or
/// the replica failed and is opened again from disk).
type SharedReplica = Arc<Mutex<Option<Replica>>>;
/// A cursor's key with its topic id, the floor and acked ranges to checkpoint.
type Checkpoint = (CursorKey, u64, u64, Vec<(u64, u64)>);

/// The agent. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    config: AgentConfig,
    metadata: Metadata,
    metrics: Arc<Metrics>,
    partitions: RwLock<HashMap<(String, u32), Running>>,
    /// Each partition's writer slot (see [`WriterSlot`]); this lock is only held to find one.
    writers: Mutex<HashMap<(String, u32), WriterSlot>>,
    /// Reaches other agents, for requests about partitions they write.
    peers: Peers,
    /// Local logs of partitions this agent held but no longer writes, by topic and partition,
    /// with the topic id: they stay readable (for reads and the compactor) until archived.
    retired: RwLock<HashMap<(String, u32), Retired>>,
    /// Partitions this agent follows (holds replicas of segments another agent writes).
    replicas: Mutex<HashMap<(String, u32), SharedReplica>>,
    /// Whether an ensemble repair runs (one at a time).
    repairing: Arc<std::sync::atomic::AtomicBool>,
    /// Repairs that failed lately, by topic, partition, segment and the agent that was to
    /// hold the copy, with when that agent may be asked again for that segment
    /// ([`REPAIR_RETRY_AFTER`], or [`REPAIR_RETRY_AFTER_DIVERGED`] if it holds other records
    /// there): a copy it keeps refusing neither repeats every round nor holds up the repair
    /// of other segments.
    repair_failures: Mutex<HashMap<(String, u32, u64, String), Instant>>,
    /// Writers that failed to start (see [`START_RETRY_INTERVAL`]).
    start_failures: Mutex<HashMap<(String, u32), StartFailure>>,
    /// When this agent last proposed `RebalanceWriters`.
    rebalance_proposed: Mutex<Option<Instant>>,
    /// Identifies this agent's data directory to metadata (see `Command::RegisterAgent`).
    instance: String,
    /// This process's registration: `RegisterAgent` gave it this incarnation.
    incarnation: std::sync::atomic::AtomicU64,
    cursors: Mutex<HashMap<CursorKey, GroupCursor>>,
    heartbeats: Mutex<HashMap<(String, String, String), Instant>>,
    appended: Notify,
    spread: AtomicU32,
    cancel: CancellationToken,
    /// Cancelled when the agent stops serving clients: waiting polls return at once.
    draining: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Reads archived segments; `None` when no object store is configured.
    cold: Option<Arc<ColdReader>>,
    /// The bucket and prefix, to delete a deleted topic's objects.
    archive_store: Option<(Arc<dyn ObjectStore>, Path)>,
}

/// The archive an agent reads from: the cold reader, and the bucket it reads.
#[derive(Clone)]
pub struct Archive {
    /// Reads archived segments through the cache.
    pub cold: Arc<ColdReader>,
    /// The bucket.
    pub store: Arc<dyn ObjectStore>,
    /// Where Silt's objects live in it.
    pub prefix: Path,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Disk space `<data_dir>/log` and everything in it take as the filesystem allocated them
/// (as `du` counts; the zeros an open segment keeps ahead of its data included), and the bytes free for this
/// process and the size of the filesystem of `data_dir`. Files that go while the walk runs (a
/// segment dropped once archived) are skipped.
fn disk_usage(data_dir: &std::path::Path) -> (u64, Result<(u64, u64), rustix::io::Errno>) {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &std::path::Path, total: &mut u64) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            *total += meta.blocks() * 512;
            if meta.is_dir() {
                walk(&entry.path(), total);
            }
        }
    }
    let log = data_dir.join("log");
    let mut used = std::fs::metadata(&log).map_or(0, |m| m.blocks() * 512);
    walk(&log, &mut used);
    let filesystem = rustix::fs::statvfs(data_dir)
        .map(|s| (s.f_bavail.saturating_mul(s.f_frsize), s.f_blocks.saturating_mul(s.f_frsize)));
    (used, filesystem)
}

/// The id of this agent's data directory: made once (random enough: time and process id),
/// kept in `<data_dir>/instance`. A wiped directory gets a new one.
fn instance_id(data_dir: &std::path::Path) -> Result<String, StoreError> {
    let path = data_dir.join("instance");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io(&path, "read", e)),
    }
    std::fs::create_dir_all(data_dir).map_err(|e| StoreError::io(data_dir, "create directory", e))?;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let id = format!("{nanos:x}-{:x}", std::process::id());
    let tmp = data_dir.join("instance.tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(id.as_bytes())?;
        crate::disk::sync_all(&f, &tmp)?;
        std::fs::rename(&tmp, &path)?;
        crate::disk::sync_all(&std::fs::File::open(data_dir)?, data_dir)
    };
    write().map_err(|e| StoreError::io(&path, "write", e))?;
    Ok(id)
}

/// Where a read stands: the records it holds, their bytes, and where it continues.
struct Page {
    records: Vec<Record>,
    used: usize,
    next: u64,
}

impl Page {
    fn new(from: u64) -> Self {
        Self { records: Vec::new(), used: 0, next: from }
    }

    /// Moves records of `got` to the end of the page while `limit` has room for them, `next`
    /// right after the last. Returns whether a record was left out or the limit's record count
    /// is reached.
    fn fill(&mut self, got: Vec<Record>, limit: &ReadLimit) -> bool {
        for record in got {
            if !limit.admits(self.records.len(), self.used, &record) {
                return true;
            }
            self.used += record.data_len();
            self.next = record.offset + 1;
            self.records.push(record);
        }
        self.records.len() >= limit.records
    }

    /// What is left of `limit` for the rest of this page.
    fn rest(&self, limit: &ReadLimit) -> ReadLimit {
        limit.rest(self.records.len(), self.used)
    }
}

/// Reads what `limit` allows of a local log from `offset` on, ending at a batch not written
/// under `epoch` if one is given. Returns the records, where the next read starts, the log's
/// end, and the batch bytes read.
///
/// The hot tail was just written, so the page cache holds it: up to [`INLINE_READ_BYTES`] are
/// read on this runtime thread from the page cache only, and the read goes on in the blocking
/// pool only if it needs more or would wait for the disk. A poll that follows the writer then
/// costs no hand-off to another thread and back.
async fn read_hot(
    reader: Arc<PartitionReader>,
    offset: u64,
    limit: ReadLimit,
    epoch: Option<i32>,
) -> Result<(Vec<Record>, u64, u64, usize), ApiError> {
    let mut page = HotPage::new(offset, reader.high_watermark()).of_epoch(epoch);
    match page.read(&reader, &limit, ReadMode::CachedOnly, INLINE_READ_BYTES) {
        Ok(true) => return Ok(page.into_parts()),
        Ok(false) | Err(StoreError::NotCached) => {}
        Err(e) => return Err(e.into()),
    }
    tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        page.read(&reader, &limit, ReadMode::MayBlock, usize::MAX)?;
        Ok(page.into_parts())
    })
    .await
    .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))?
    .map_err(ApiError::from)
}

/// How long an agent that failed to take a copy of a segment is not asked for it again.
const REPAIR_RETRY_AFTER: Duration = Duration::from_secs(30);
/// And when it answered that it holds other records where the copy goes (`replica_diverged`),
/// which only changes once those are archived or the agent's disk is replaced.
const REPAIR_RETRY_AFTER_DIVERGED: Duration = Duration::from_secs(600);

/// Batch bytes a read of the hot tail reads on a runtime thread, from the page cache, before it
/// hands the rest to the blocking pool: about 30 µs of copying and checksums.
const INLINE_READ_BYTES: usize = 256 * 1024;

/// A page being read from a local log.
struct HotPage {
    records: Vec<Record>,
    /// Where the next read starts.
    next: u64,
    /// The log's end, as of the last read.
    hwm: u64,
    /// Batch bytes read.
    bytes: usize,
    /// Bytes of the records' keys, values and headers.
    used: usize,
    /// Only batches of this epoch are read: the page ends at a batch of another.
    epoch: Option<i32>,
}

impl HotPage {
    /// An empty page from `offset`, of a log that ends at `hwm`.
    fn new(offset: u64, hwm: u64) -> Self {
        HotPage { records: Vec::new(), next: offset, hwm, bytes: 0, used: 0, epoch: None }
    }

    /// Ends the page at the first batch not written under `epoch`.
    fn of_epoch(self, epoch: Option<i32>) -> Self {
        HotPage { epoch, ..self }
    }

    /// Reads on until `limit` is reached or the log ends (`true`), or until `budget` more
    /// batch bytes were read (`false`: there may be more). After an error, what was read so
    /// far stays and the next call goes on from there.
    fn read(
        &mut self,
        reader: &PartitionReader,
        limit: &ReadLimit,
        mode: ReadMode,
        budget: usize,
    ) -> Result<bool, StoreError> {
        let budget_end = self.bytes.saturating_add(budget);
        while self.records.len() < limit.records {
            if self.bytes >= budget_end {
                return Ok(false);
            }
            let r = match mode {
                ReadMode::MayBlock => reader.read(self.next, READ_BYTES_STEP)?,
                ReadMode::CachedOnly => {
                    reader.read_cached(self.next, READ_BYTES_STEP.min(budget_end - self.bytes))?
                }
            };
            self.hwm = r.high_watermark;
            if r.batches.is_empty() {
                return Ok(true);
            }
            for batch in &r.batches {
                if self.epoch.is_some_and(|e| e != batch.partition_leader_epoch()) {
                    return Ok(true);
                }
                self.bytes += batch.len_bytes();
                for record in batch.records() {
                    if record.offset < self.next {
                        continue;
                    }
                    if !limit.admits(self.records.len(), self.used, &record) {
                        return Ok(true);
                    }
                    self.used += record.data_len();
                    self.next = record.offset + 1;
                    self.records.push(record);
                }
            }
            self.next = self.next.max(r.next_offset);
        }
        Ok(true)
    }

    fn into_parts(self) -> (Vec<Record>, u64, u64, usize) {
        (self.records, self.next, self.hwm, self.bytes)
    }
}

/// Takes back a redelivery a poll picked and did not hand out.
fn release(cursors: &Mutex<HashMap<CursorKey, GroupCursor>>, key: &CursorKey, offset: u64) {
    if let Some(cursor) = lock(cursors).get_mut(key) {
        cursor.release(offset);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agent {
    /// Starts the agent: registers with metadata, removes local data of deleted topics, opens
    /// the local logs it holds of partitions it does not write, and starts its tasks: the
    /// supervisor (whose first round starts the writers metadata gives this agent, while the
    /// API already serves), heartbeats, the ack checkpointer and the disk usage gauges.
    pub async fn start(
        config: AgentConfig,
        metadata: Metadata,
        metrics: Arc<Metrics>,
        archive: Option<Archive>,
        cancel: CancellationToken,
    ) -> Result<Agent, StoreError> {
        let cold = archive.as_ref().map(|a| Arc::clone(&a.cold));
        let archive_store = archive.map(|a| (a.store, a.prefix));
        let peers = Peers::with_source_ip(&config.agent_id, config.peer_source_ip);
        let instance = instance_id(&config.data_dir)?;
        // Before any log is opened: bytes a killed process of this agent left in the page cache
        // only must not count as held.
        if let Err(e) = crate::disk::sync_at_start(&config.data_dir) {
            error!(error = %e, dir = %config.data_dir.display(), "syncing the data directory at start failed: this agent opens no log there until it restarts, and hands its partitions to other agents");
        }
        let agent = Agent {
            inner: Arc::new(Inner {
                peers,
                config,
                metadata,
                metrics,
                partitions: RwLock::new(HashMap::new()),
                writers: Mutex::new(HashMap::new()),
                retired: RwLock::new(HashMap::new()),
                replicas: Mutex::new(HashMap::new()),
                start_failures: Mutex::new(HashMap::new()),
                rebalance_proposed: Mutex::new(None),
                repairing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                repair_failures: Mutex::new(HashMap::new()),
                instance,
                incarnation: std::sync::atomic::AtomicU64::new(0),
                cursors: Mutex::new(HashMap::new()),
                heartbeats: Mutex::new(HashMap::new()),
                appended: Notify::new(),
                spread: AtomicU32::new(0),
                draining: cancel.child_token(),
                cancel,
                tasks: Mutex::new(Vec::new()),
                cold,
                archive_store,
            }),
        };
        // Another data directory may still hold this id (a replacement started while the old
        // process is paused): wait for its lease to lapse rather than take the id from it.
        loop {
            match agent.register().await {
                Ok(()) => break,
                Err(MetadataError::InvalidArgument(m)) if m.contains("another data directory") => {
                    warn!(reason = %m, "waiting to register");
                    tokio::select! {
                        () = agent.inner.cancel.cancelled() => return Err(StoreError::ShuttingDown),
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let (topics, next_topic_id): (Vec<Topic>, u64) =
            agent.inner.metadata.read(|s| (s.topics.values().cloned().collect(), s.next_topic_id)).await?;
        agent.remove_stale_topic_dirs(&topics, next_topic_id);
        agent.open_retired_logs(&topics).await;
        // Writers start in the supervisor's first round, while the API already serves: a
        // writer's start fences and copies from other agents that may be starting theirs now,
        // and needs them to answer.
        let checkpointer = agent.clone();
        let task = tokio::spawn(async move { checkpointer.run_checkpointer().await });
        lock(&agent.inner.tasks).push(task);
        let heartbeater = agent.clone();
        let task = tokio::spawn(async move { heartbeater.run_heartbeats().await });
        lock(&agent.inner.tasks).push(task);
        let supervisor = agent.clone();
        let task = tokio::spawn(async move { supervisor.run_supervisor().await });
        lock(&agent.inner.tasks).push(task);
        let measurer = agent.clone();
        let task = tokio::spawn(async move { measurer.run_disk_usage().await });
        lock(&agent.inner.tasks).push(task);
        Ok(agent)
    }

    /// Registers this process with metadata: a new incarnation and lease. Every partition it
    /// wrote before gets a new epoch, so nothing an earlier process of it did can interfere.
    async fn register(&self) -> Result<(), MetadataError> {
        let config = &self.inner.config;
        let response = self
            .inner
            .metadata
            .write(Command::RegisterAgent {
                agent: config.agent_id.clone(),
                instance: self.inner.instance.clone(),
                addr: config.advertise_addr.clone(),
                lease_ms: config.lease.as_millis() as u64,
                now_ms: now_ms(),
            })
            .await?;
        let Response::Registered { incarnation } = response else {
            return Err(MetadataError::Unavailable(format!(
                "unexpected reply to a registration: {response:?}"
            )));
        };
        self.inner.incarnation.store(incarnation, Ordering::SeqCst);
        self.inner.metrics.registrations.inc();
        info!(agent = %config.agent_id, incarnation, addr = %config.advertise_addr, "registered with metadata");
        Ok(())
    }

    /// Renews the lease every third of it. If metadata lets it lapse anyway (a pause, a
    /// partition from metadata), the agent registers again: the partitions it lost have other
    /// writers by then, and the supervisor stops its own.
    async fn run_heartbeats(&self) {
        let every = self.inner.config.lease / 3;
        loop {
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let cmd = Command::AgentHeartbeat {
                agent: self.inner.config.agent_id.clone(),
                incarnation: self.inner.incarnation.load(Ordering::SeqCst),
                now_ms: now_ms(),
            };
            match self.inner.metadata.write_unobserved(cmd).await {
                Ok(_) => {}
                Err(MetadataError::LeaseLapsed { .. } | MetadataError::UnknownAgent { .. }) => {
                    warn!("this agent's lease lapsed; registering again");
                    self.supervise().await;
                    if let Err(e) = self.register().await {
                        warn!(error = %e, "registering again failed; will retry");
                    }
                }
                Err(e) => warn!(error = %e, "heartbeat to metadata failed; will retry"),
            }
        }
    }

    /// Measures the disk space of the local logs and the space left, now and every
    /// [`DISK_USAGE_INTERVAL`], into the metrics.
    async fn run_disk_usage(&self) {
        let mut warned = false;
        loop {
            let data_dir = self.inner.config.data_dir.clone();
            match tokio::task::spawn_blocking(move || disk_usage(&data_dir)).await {
                Ok((used, filesystem)) => {
                    let m = &self.inner.metrics;
                    let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                    m.local_log_bytes.set(gauge(used));
                    match filesystem {
                        Ok((free, size)) => {
                            m.disk_free_bytes.set(gauge(free));
                            m.disk_size_bytes.set(gauge(size));
                        }
                        // The gauges keep their last values (0 before any): say why, once.
                        Err(e) if !warned => {
                            warned = true;
                            warn!(error = %e, "cannot read the free space of the data directory's filesystem");
                        }
                        Err(_) => {}
                    }
                }
                Err(e) => warn!(error = %e, "measuring the disk usage failed"),
            }
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = tokio::time::sleep(DISK_USAGE_INTERVAL) => {}
            }
        }
    }

    async fn run_supervisor(&self) {
        loop {
            self.supervise().await;
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = tokio::time::sleep(SUPERVISE_INTERVAL) => {}
            }
        }
    }

    /// Makes the running writers match metadata: stops every writer whose partition has
    /// another writer or a newer epoch now, and starts one for every partition this agent
    /// writes. A writer that cannot start is retried on the next round.
    async fn supervise(&self) {
        let me = self.inner.config.agent_id.clone();
        let wanted: HashMap<(String, u32), (u64, u64)> = self.inner.metadata.read_local(|s| {
            s.topics
                .values()
                .flat_map(|t| {
                    let me = &me;
                    t.partitions
                        .iter()
                        .enumerate()
                        .filter(move |(_, p)| p.writer.as_deref() == Some(me.as_str()))
                        .map(move |(i, p)| ((t.name.clone(), i as u32), (t.id, p.epoch)))
                })
                .collect()
        });
        self.inner.metrics.partitions_written.set(wanted.len() as i64);
        self.export_replication_lag();
        self.drop_archived_retired_logs().await;
        self.trim_replicas().await;
        self.start_repair();
        let stale: Vec<(String, u32)> = self
            .inner
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, r)| wanted.get(*k) != Some(&(r.topic_id, r.epoch)))
            .map(|(k, _)| k.clone())
            .collect();
        // Writers that ended on their own (a failed write) are started again from disk. A slot
        // that is locked is starting or stopping its writer.
        let ended: Vec<(String, u32)> = lock(&self.inner.writers)
            .iter()
            .filter(|(_, slot)| {
                slot.try_lock().is_ok_and(|w| w.as_ref().is_some_and(|w| w.task.is_finished()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        {
            let mut failures = lock(&self.inner.start_failures);
            for key in &ended {
                let error = ApiError::unavailable(format!(
                    "the writer of {}/{} ended (it lost its write quorum or a write failed); it starts again",
                    key.0, key.1
                ));
                let failure = StartFailure::after(failures.get(key), error);
                failures.insert(key.clone(), failure);
            }
        }
        let stale: Vec<(String, u32)> = stale.into_iter().chain(ended).collect();
        for (topic, partition) in stale {
            self.stop_writer(&topic, partition).await;
        }
        for (topic, partition) in wanted.keys() {
            if let Err(e) = self.partition(topic, *partition).await {
                warn!(topic, partition, error = %e.message, "cannot start the partition writer; will retry");
            }
        }
        self.hand_off_unreachable_partitions(&wanted).await;
        self.propose_rebalance().await;
        self.inner.metrics.housekeeping_rounds.inc();
    }

    /// Asks metadata to move a partition towards balance when this agent's copy of the state
    /// shows a move is due (`MetadataState::rebalance_due`), at most once per lease. Metadata
    /// decides again on the state it has when it applies the command.
    async fn propose_rebalance(&self) {
        if self.inner.cancel.is_cancelled() || self.inner.metadata.read_local(|s| s.rebalance_due()).is_none()
        {
            return;
        }
        {
            let mut proposed = lock(&self.inner.rebalance_proposed);
            if proposed.is_some_and(|at| at.elapsed() < self.inner.config.lease) {
                return;
            }
            *proposed = Some(Instant::now());
        }
        if let Err(e) = self.inner.metadata.write(Command::RebalanceWriters { now_ms: now_ms() }).await {
            warn!(error = %e, "proposing to rebalance the partition writers failed; trying again after a lease");
        }
    }

    /// Hands over the partitions whose writer has not run for a whole lease (it failed to
    /// start, or ended again and again) while live agents do not answer this one. Such an
    /// agent is cut off from the others but not from metadata: its lease holds, so nobody else
    /// would take its partitions, and it cannot reach the replicas it needs. Metadata names
    /// another live agent that this one did not find unreachable (preferring a holder of the
    /// open segment); if that one cannot write either, it hands over in turn.
    ///
    /// A partition whose local log this agent distrusts after a failed fsync (see
    /// [`crate::disk`]) is handed over at once, to any other live agent.
    async fn hand_off_unreachable_partitions(&self, wanted: &HashMap<(String, u32), (u64, u64)>) {
        let lease = self.inner.config.lease;
        let due: Vec<((String, u32), String, bool)> = {
            let mut failures = lock(&self.inner.start_failures);
            // A partition that moved away starts afresh if it comes back, and a writer that
            // ran for a whole lease ends its streak.
            failures.retain(|k, f| wanted.contains_key(k) && f.started.is_none_or(|t| t.elapsed() < lease));
            failures
                .iter()
                .map(|(k, f)| (k, f, f.error.code == ErrorCode::DiskFailed))
                // A writer that runs after one failure is given its lease; one that keeps
                // failing (it starts, then loses its quorum at once) is not.
                .filter(|(_, f, disk)| {
                    let retry_due = f.handoff_failed.is_none_or(|t| t.elapsed() >= lease);
                    (*disk && retry_due)
                        || (f.since.elapsed() >= lease && (f.started.is_none() || f.failures >= 2))
                })
                .map(|(k, f, disk)| (k.clone(), f.error.message.clone(), disk))
                .collect()
        };
        if due.is_empty() || self.inner.cancel.is_cancelled() {
            return;
        }
        let me = self.inner.config.agent_id.clone();
        let unreachable: Vec<String> = self.inner.metadata.read_local(|s| {
            s.live_agents()
                .filter(|a| a.id != me && self.inner.peers.is_unreachable(&a.id))
                .map(|a| a.id.clone())
                .collect()
        });
        for (key, reason, disk) in due {
            if unreachable.is_empty() && !disk {
                continue;
            }
            let (topic, partition) = (key.0.clone(), key.1);
            let epoch = wanted[&key].1;
            let cmd = Command::HandOffWriter {
                topic: topic.clone(),
                partition,
                agent: me.clone(),
                epoch,
                avoid: unreachable.clone(),
                now_ms: now_ms(),
            };
            match self.inner.metadata.write(cmd).await {
                Ok(Response::Writer { agent, epoch }) => {
                    warn!(
                        topic,
                        partition,
                        to = %agent,
                        epoch,
                        unreachable = %unreachable.join(", "),
                        reason,
                        "{}",
                        if disk {
                            "handed the partition to another agent: an fsync of its local log failed here"
                        } else {
                            "handed the partition to another agent: its writer could not start here for a lease, and live agents do not answer this one"
                        }
                    );
                    lock(&self.inner.start_failures).remove(&key);
                    self.inner.metrics.writer_handoffs.inc();
                }
                other => {
                    if let Err(e) = other {
                        warn!(topic, partition, error = %e, "handing the partition to another agent failed; trying again after a lease");
                    }
                    if let Some(f) = lock(&self.inner.start_failures).get_mut(&key) {
                        f.since = Instant::now();
                        f.handoff_failed = Some(Instant::now());
                    }
                }
            }
        }
    }

    /// The writer slot of a partition (created on first use, forgotten when its topic is
    /// deleted and nobody holds it).
    fn writer_slot(&self, key: &(String, u32)) -> WriterSlot {
        Arc::clone(lock(&self.inner.writers).entry(key.clone()).or_default())
    }

    /// Stops a partition's writer and waits until it has answered everything queued.
    async fn stop_writer(&self, topic: &str, partition: u32) {
        let key = (topic.to_string(), partition);
        let slot = self.writer_slot(&key);
        let mut writer = slot.lock().await;
        let running = self.inner.partitions.write().unwrap_or_else(|e| e.into_inner()).remove(&key);
        if let Some(r) = running {
            // Its local log stays readable until everything in it is archived.
            let reader = Arc::clone(r.handle.reader());
            self.inner
                .retired
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), (r.topic_id, reader));
        }
        if let Some(w) = writer.take() {
            w.cancel.cancel();
            if let Err(e) = w.task.await {
                error!(topic, partition, error = %e, "partition writer panicked");
            }
            info!(topic, partition, "stopped the partition writer: metadata names another writer or epoch");
        }
        drop(writer);
        self.retire_cursors(topic, partition).await;
    }

    /// Checkpoints and forgets the groups' delivery state of a partition this agent no longer
    /// writes: its next writer resumes from the checkpoint, and if the partition comes back
    /// here, so does this agent.
    async fn retire_cursors(&self, topic: &str, partition: u32) {
        let retired: Vec<(String, GroupCursor)> = {
            let mut cursors = lock(&self.inner.cursors);
            let keys: Vec<CursorKey> =
                cursors.keys().filter(|(_, t, p)| t == topic && *p == partition).cloned().collect();
            keys.into_iter().filter_map(|k| cursors.remove(&k).map(|c| (k.0, c))).collect()
        };
        for (group, mut cursor) in retired {
            if !cursor.is_dirty() {
                continue;
            }
            let (floor, acked) = cursor.take_checkpoint();
            let cmd = Command::CommitAcks {
                group: group.clone(),
                topic: topic.to_string(),
                topic_id: Some(cursor.topic_id()),
                partition,
                floor,
                acked: acked.into_iter().take(silt_metadata::state::ACKED_RANGES_MAX).collect(),
            };
            match self.inner.metadata.write(cmd).await {
                Ok(_) | Err(MetadataError::UnknownTopic(_) | MetadataError::UnknownGroup(_)) => {}
                Err(e) => {
                    warn!(error = %e, group, topic, partition, "checkpointing the acks of a partition this agent stopped writing failed; they are delivered again")
                }
            }
        }
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The metadata service.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.metadata
    }

    /// Stops serving clients: polls that wait return now. Writers keep running until
    /// [`Agent::shutdown`].
    pub fn stop_serving(&self) {
        self.inner.draining.cancel();
    }

    /// Seals the active segment of every partition this agent writes that holds records, so
    /// that all of it can be archived before the agent stops.
    pub async fn roll_all(&self) {
        let handles: Vec<((String, u32), PartitionHandle)> = self
            .inner
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, r)| (k.clone(), r.handle.clone()))
            .collect();
        for ((topic, partition), handle) in handles {
            if let Err(e) = handle.roll().await {
                warn!(topic, partition, error = %e, "sealing the active segment before stopping failed");
            }
        }
    }

    /// Stops the writers after they drained, checkpoints acks a last time and leaves the
    /// cluster, so that metadata hands this agent's partitions over at once.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.inner.tasks));
        // Taken out of their slots, which stay: a slot is never replaced while anyone holds it.
        let slots: Vec<WriterSlot> = lock(&self.inner.writers).values().cloned().collect();
        let mut writers = Vec::new();
        for slot in slots {
            writers.extend(slot.lock().await.take());
        }
        for t in tasks.into_iter().chain(writers.into_iter().map(|w| w.task)) {
            if let Err(e) = t.await {
                error!(error = %e, "agent task panicked");
            }
        }
        self.checkpoint_acks().await;
        // A partition whose open segment only this agent holds (its writer could not close it)
        // must come back here: leaving would hand it to an agent that cannot recover it. The
        // lease lapses instead, and metadata gives it back when this agent registers again.
        let me = self.inner.config.agent_id.clone();
        let holding = self.inner.metadata.read(move |s| {
            s.topics
                .values()
                .flat_map(|t| t.partitions.iter())
                .filter_map(|p| p.open_segment())
                .any(|seg| seg.ensemble.iter().all(|a| *a == me) && !seg.ensemble.is_empty())
        });
        match holding.await {
            Ok(false) => {}
            Ok(true) => {
                warn!("an open segment only this agent holds is still open; not deregistering, the lease will lapse");
                return;
            }
            Err(e) => {
                warn!(error = %e, "cannot check this agent's open segments; not deregistering, the lease will lapse");
                return;
            }
        }
        let leave = Command::DeregisterAgent {
            agent: self.inner.config.agent_id.clone(),
            incarnation: self.inner.incarnation.load(Ordering::SeqCst),
            now_ms: now_ms(),
        };
        if let Err(e) = self.inner.metadata.write(leave).await {
            warn!(error = %e, "could not deregister from metadata; the lease will lapse instead");
        }
    }

    fn topic_dir(&self, topic: &str, id: u64) -> PathBuf {
        self.inner.config.data_dir.join("log").join(format!("{topic}~{id}"))
    }

    /// Removes local data of topics metadata has deleted. A directory whose topic id metadata
    /// has never handed out is kept (with a warning): metadata may have been lost, and the
    /// files may be the only copy.
    fn remove_stale_topic_dirs(&self, topics: &[Topic], next_topic_id: u64) {
        let root = self.inner.config.data_dir.join("log");
        let Ok(entries) = std::fs::read_dir(&root) else { return };
        let live: std::collections::HashSet<String> =
            topics.iter().map(|t| format!("{}~{}", t.name, t.id)).collect();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if live.contains(&name) {
                continue;
            }
            let id = name.rsplit_once('~').and_then(|(_, id)| id.parse::<u64>().ok());
            match id {
                Some(id) if id < next_topic_id => {
                    info!(dir = %entry.path().display(), "removing local data of a deleted topic");
                    if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                        warn!(error = %e, dir = %entry.path().display(), "could not remove local data of a deleted topic");
                    }
                }
                _ => warn!(
                    dir = %entry.path().display(),
                    "local data of a topic metadata does not know; left in place, not served"
                ),
            }
        }
    }

    /// The writer handle of a partition this agent writes, opening the local log and
    /// reconciling it with metadata on first use. A partition another agent writes is a
    /// `not_writer` error naming that agent.
    pub async fn partition(&self, topic: &str, partition: u32) -> Result<PartitionHandle, ApiError> {
        let key = (topic.to_string(), partition);
        // The running writer if it matches metadata (topic id, writer, epoch: read without
        // copying the topic, this runs on every request), else the epoch to start one at.
        let decide = |agent: &Agent| -> Result<Result<PartitionHandle, u64>, ApiError> {
            let view = agent.inner.metadata.read_local(|s| {
                s.topics.get(topic).map(|t| {
                    (t.id, t.partitions.get(partition as usize).map(|p| (p.epoch, p.writer.clone())))
                })
            });
            let Some((topic_id, meta)) = view else {
                return Err(MetadataError::UnknownTopic(topic.to_string()).into());
            };
            let Some((epoch, writer)) = meta else {
                return Err(MetadataError::UnknownPartition { topic: topic.into(), partition }.into());
            };
            let running = agent
                .inner
                .partitions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .filter(|r| r.topic_id == topic_id && r.epoch == epoch)
                .map(|r| r.handle.clone());
            if let Some(h) = running {
                return Ok(Ok(h));
            }
            if writer.as_deref() != Some(agent.inner.config.agent_id.as_str()) {
                return Err(agent.not_writer(topic, partition, writer.as_deref()));
            }
            Ok(Err(epoch))
        };
        match decide(self) {
            Ok(Ok(h)) => return Ok(h),
            Ok(Err(_)) => {}
            // A topic this agent's copy does not know yet (created through another agent).
            Err(e) if e.code == ErrorCode::UnknownTopic => {
                self.topic_info(topic).await?;
            }
            Err(e) => return Err(e),
        }
        let slot = self.writer_slot(&key);
        let mut writer = slot.lock().await;
        // Metadata may have moved on while this call waited for the lock: decide on what it
        // says now, and never replace a writer of a newer epoch with an older one.
        let epoch = match decide(self)? {
            Ok(h) => return Ok(h),
            Err(epoch) => epoch,
        };
        let t = self.topic_local(topic)?;
        if self.inner.cancel.is_cancelled() {
            return Err(ApiError::unavailable("the agent is shutting down"));
        }
        // A start that just failed (its open segment's replicas are not back yet) is not tried
        // again for every request: they get the same answer until the next attempt is due.
        if let Some(f) = lock(&self.inner.start_failures).get(&key) {
            if f.at.elapsed() < START_RETRY_INTERVAL {
                return Err(f.error.clone());
            }
        }
        let newer = self
            .inner
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .is_some_and(|r| r.topic_id == t.id && r.epoch > epoch);
        if newer {
            return Err(ApiError::unavailable(format!(
                "partition {topic}/{partition}: this agent's metadata copy is behind its writer; retry"
            )));
        }
        // An older writer of this partition (earlier epoch or topic id) must be gone before
        // the log is opened again.
        self.inner.partitions.write().unwrap_or_else(|e| e.into_inner()).remove(&key);
        if let Some(old) = writer.take() {
            old.cancel.cancel();
            if let Err(e) = old.task.await {
                error!(topic, partition, error = %e, "partition writer panicked");
            }
        }
        let retired = self.inner.retired.write().unwrap_or_else(|e| e.into_inner()).remove(&key);
        // A replica this agent held as a follower is the writer's log now.
        if let Some(replica) = lock(&self.inner.replicas).remove(&key) {
            *lock(&replica) = None;
        }
        let dir = self.topic_dir(topic, t.id).join(partition.to_string());
        let log_dir = dir.clone();
        let opened = tokio::task::spawn_blocking(move || PartitionLog::open(&log_dir))
            .await
            .map_err(|e| ApiError::unavailable(format!("opening the partition log panicked: {e}")))?;
        let (log, _reports) = opened.map_err(|e| {
            // Counted like a failed start: a log this agent distrusts is handed over.
            let e = ApiError::from(e);
            let mut failures = lock(&self.inner.start_failures);
            let failure = StartFailure::after(failures.get(&key), e.clone());
            failures.insert(key.clone(), failure);
            // What it published stays readable (it was fsynced): segments only this agent
            // holds are read, repaired and archived from it.
            if let Some(retired) = retired {
                self.inner.retired.write().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), retired);
            }
            e
        })?;
        let config = WriterConfig {
            agent_id: self.inner.config.agent_id.clone(),
            topic: topic.to_string(),
            topic_id: t.id,
            partition,
            segment_bytes: t.config.segment_bytes,
            segment_ms: t.config.segment_ms,
            local_retention_ms: t.config.local_retention_ms,
            local_retention_bytes: t.config.local_retention_bytes,
            dir,
            replication_factor: t.config.replication_factor as usize,
            write_quorum: t.config.write_quorum(),
            instance: self.inner.instance.clone(),
        };
        let cancel = self.inner.cancel.child_token();
        let reader = log.reader();
        let (handle, task) = partition_writer::start(
            log,
            config,
            epoch,
            self.inner.metadata.clone(),
            Arc::clone(&self.inner.metrics),
            self.inner.peers.clone(),
            cancel.clone(),
        )
        .await
        .map_err(|e| {
            let e = ApiError::from(e);
            let mut failures = lock(&self.inner.start_failures);
            let failure = StartFailure::after(failures.get(&key), e.clone());
            failures.insert(key.clone(), failure);
            // The local log stays readable while no writer runs here: the segments it holds
            // may be the only full copies (a recovery that needed no other agent sealed one
            // at this agent's end).
            self.inner.retired.write().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), (t.id, reader));
            e
        })?;
        if let Some(f) = lock(&self.inner.start_failures).get_mut(&key) {
            f.started = Some(Instant::now());
        }
        *writer = Some(WriterTask { cancel, task });
        self.inner.partitions.write().unwrap_or_else(|e| e.into_inner()).insert(
            key,
            Running {
                topic_id: t.id,
                epoch,
                handle: handle.clone(),
                replication_factor: t.config.replication_factor as usize,
            },
        );
        Ok(handle)
    }

    /// Where requests about a partition go: its writer here, or the agent that writes it. A
    /// request another agent forwarded is never forwarded again.
    async fn target(&self, topic: &str, partition: u32, forwarded: bool) -> Result<Target, ApiError> {
        match self.partition(topic, partition).await {
            Ok(handle) => Ok(Target::Local(handle)),
            Err(e) if e.code == ErrorCode::NotWriter && forwarded => {
                // The sender's metadata says this agent writes the partition; this agent's copy
                // may lag behind it. Catch up once, then answer for certain.
                self.inner.metadata.read(|_| ()).await?;
                self.partition(topic, partition).await.map(Target::Local)
            }
            Err(e) if e.code == ErrorCode::NotWriter => {
                let remote = self.inner.metadata.read_local(|s| {
                    let writer = s.topics.get(topic)?.partitions.get(partition as usize)?.writer.clone()?;
                    let addr = s.agents.get(&writer)?.addr.clone();
                    Some((writer, addr))
                });
                match remote {
                    Some((agent, addr)) => Ok(Target::Remote { agent, addr }),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    fn count_forwarded(&self, kind: &'static str) {
        self.inner.metrics.forwarded.get_or_create(&ForwardLabels { kind }).inc();
    }

    fn not_writer(&self, topic: &str, partition: u32, writer: Option<&str>) -> ApiError {
        let Some(writer) = writer else {
            return ApiError::unavailable(format!(
                "partition {topic}/{partition} has no writer yet: no agent is registered and live"
            ));
        };
        let addr = self.inner.metadata.read_local(|s| s.agents.get(writer).map(|a| a.addr.clone()));
        ApiError::new(
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            ErrorCode::NotWriter,
            format!(
                "partition {topic}/{partition} is written by agent '{writer}' at {}; send it there",
                addr.as_deref().unwrap_or("an unknown address")
            ),
        )
    }

    fn topic_local(&self, topic: &str) -> Result<Topic, ApiError> {
        Ok(self.inner.metadata.read_local(|s| s.topic(topic).cloned())?)
    }

    /// The topic from the local copy of metadata, or, if the copy does not have it (it may
    /// lag behind a topic just created through another agent), from a linearizable read.
    async fn topic(&self, topic: &str) -> Result<Topic, ApiError> {
        match self.topic_local(topic) {
            Ok(t) => Ok(t),
            Err(_) => Ok(self.inner.metadata.read(|s| s.topic(topic).cloned()).await??),
        }
    }

    /// [`Agent::topic`] without the partitions' segment chains: what request paths need.
    async fn topic_info(&self, topic: &str) -> Result<TopicInfo, ApiError> {
        match self.inner.metadata.read_local(|s| s.topic(topic).map(TopicInfo::of)) {
            Ok(t) => Ok(t),
            Err(_) => Ok(self.inner.metadata.read(|s| s.topic(topic).map(TopicInfo::of)).await??),
        }
    }

    /// Creates a topic and opens its partitions.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: BTreeMap<String, String>,
    ) -> Result<Topic, ApiError> {
        validate_topic_name(name)
            .map_err(|e| ApiError::bad_request(ErrorCode::InvalidTopicName, e.to_string()))?;
        let mut config = config;
        config
            .entry("replication.factor".to_string())
            .or_insert_with(|| self.inner.config.default_replication_factor.to_string());
        let response = self
            .inner
            .metadata
            .write(Command::CreateTopic { name: name.to_string(), partitions, config, now_ms: now_ms() })
            .await?;
        let Response::Topic { topic } = response else {
            return Err(ApiError::unavailable(format!("unexpected metadata reply: {response:?}")));
        };
        self.describe_in_archive(&topic).await;
        // Start the writers this agent was given now, so the topic is ready when this returns.
        self.supervise().await;
        Ok(self.topic_local(name).unwrap_or(topic))
    }

    /// Alters some of a topic's configs, all or none (`replication.factor` and
    /// `min.insync.replicas` cannot change). Requests read them from metadata; writers pick
    /// them up on their next tick (within a second).
    pub async fn alter_topic_config(
        &self,
        name: &str,
        config: BTreeMap<String, String>,
    ) -> Result<Topic, ApiError> {
        let id = self.topic_info(name).await?.id;
        self.inner
            .metadata
            .write(Command::AlterTopicConfig { name: name.to_string(), topic_id: Some(id), config })
            .await?;
        let topic = self.inner.metadata.read(|s| s.topic(name).cloned()).await??;
        self.describe_in_archive(&topic).await;
        Ok(topic)
    }

    /// Writes the topic's description to the bucket, so that a rebuild of metadata restores
    /// its configs. A failure is only logged: the compactor writes it again before it
    /// archives any of the topic's segments.
    async fn describe_in_archive(&self, topic: &Topic) {
        if let Some((store, prefix)) = &self.inner.archive_store {
            let d = silt_tiering::topic_descriptor::TopicDescriptor::of(topic);
            if let Err(e) = silt_tiering::topic_descriptor::write_descriptor(store.as_ref(), prefix, &d).await
            {
                warn!(error = %e, topic = %topic.name, "describing the topic in the bucket failed; the compactor will");
            }
        }
    }

    /// Deletes a topic: metadata first, then the local data.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        let t = self.topic(name).await?;
        let (id, count) = (t.id, t.partitions.len() as u32);
        // Of this incarnation only: a retry that finds the name created again deletes nothing.
        self.inner
            .metadata
            .write(Command::DeleteTopic { name: name.to_string(), topic_id: Some(id) })
            .await?;
        // Keys from before ids were part of them are this topic's when its segments named them.
        let referenced: std::collections::HashSet<String> = t
            .partitions
            .iter()
            .flat_map(|p| p.segments.values().filter_map(|s| s.object_key.clone()))
            .collect();
        let mut guards = Vec::new();
        for p in 0..count {
            self.stop_writer(name, p).await;
            // No writer or replica of the partition opens while its files go.
            guards.push(self.writer_slot(&(name.to_string(), p)).lock_owned().await);
        }
        lock(&self.inner.cursors).retain(|(_, t, _), _| t != name);
        let dir = self.topic_dir(name, id);
        // Writers notice their channel closed and stop; their files go with the directory.
        if let Err(e) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await {
            warn!(error = %e, topic = name, "removing local data of a deleted topic failed");
        }
        drop(guards);
        // The deleted topic's slots that nobody holds, waits for or runs a writer in go (the
        // name may be a new topic's already, with writers of its own).
        lock(&self.inner.writers).retain(|(t, p), slot| {
            let idle = Arc::strong_count(slot) == 1 && slot.try_lock().is_ok_and(|w| w.is_none());
            !(t == name && *p < count && idle)
        });
        // Metadata no longer points at the topic's objects: delete them (listing is fine for an
        // admin operation). A failure leaves orphans, which cost storage only: keys carry the
        // topic id, so a topic created again under the name never meets them.
        if let Some((store, prefix)) = &self.inner.archive_store {
            // First the mark, so that a rebuild never brings the topic back, even if deleting
            // its objects stops halfway.
            if let Err(e) =
                silt_tiering::topic_descriptor::write_tombstone(store.as_ref(), prefix, name, id).await
            {
                // Its objects stay: a rebuild would restore the topic whole rather than in part.
                warn!(error = %e, topic = name, "marking the topic deleted in the bucket failed; its objects are kept");
                return Ok(());
            }
            let topic_prefix = prefix.child(format!("topic={name}"));
            let listed: Result<Vec<object_store::ObjectMeta>, _> =
                store.list(Some(&topic_prefix)).try_collect().await;
            match listed {
                Ok(objects) => {
                    // Only this incarnation's: a topic created again under the name has its own.
                    // Keys without an id were written before ids were part of keys, by this
                    // incarnation or an earlier, deleted one: they go too.
                    let ours = objects.into_iter().filter(|o| {
                        let named = silt_tiering::object_layout::parse_object_key(&o.location);
                        match named.map(|n| n.topic_id) {
                            Some(Some(object_id)) => object_id == id,
                            Some(None) => true,
                            None => referenced.contains(o.location.as_ref()),
                        }
                    });
                    for o in ours {
                        if let Err(e) = store.delete(&o.location).await {
                            warn!(error = %e, object = %o.location, "deleting an object of a deleted topic failed");
                        }
                    }
                }
                Err(e) => warn!(error = %e, topic = name, "listing the objects of a deleted topic failed"),
            }
        }
        Ok(())
    }

    /// All topics.
    pub async fn list_topics(&self) -> Result<Vec<Topic>, ApiError> {
        Ok(self.inner.metadata.read(|s| s.topics.values().cloned().collect()).await?)
    }

    /// One topic as metadata knows it, with each partition's local high watermark.
    pub async fn describe_topic(&self, name: &str) -> Result<(Topic, Vec<u64>), ApiError> {
        let topic = self.inner.metadata.read(|s| s.topic(name).cloned()).await??;
        let mut hwms = Vec::with_capacity(topic.partitions.len());
        for p in 0..topic.partitions.len() as u32 {
            hwms.push(self.high_watermark(name, p).await?);
        }
        Ok((topic, hwms))
    }

    /// The end of a partition, from its writer.
    async fn high_watermark(&self, topic: &str, partition: u32) -> Result<u64, ApiError> {
        match self.target(topic, partition, false).await? {
            Target::Local(handle) => Ok(handle.reader().high_watermark()),
            remote => {
                let peer = remote.peer().unwrap_or_default();
                Ok(self
                    .inner
                    .peers
                    .read(peer, topic, partition, u64::MAX, ReadLimit::new(1, 1))
                    .await?
                    .high_watermark)
            }
        }
    }

    /// Produces messages. Returns one id per message, in order, once all are durable.
    pub async fn produce(
        &self,
        topic: &str,
        messages: Vec<ProduceMessage>,
    ) -> Result<Vec<MessageId>, ApiError> {
        let started = Instant::now();
        if messages.is_empty() {
            return Err(ApiError::bad_request(
                ErrorCode::EmptyRequest,
                "a produce request needs at least one message",
            ));
        }
        if messages.len() > PRODUCE_MESSAGES_MAX {
            return Err(ApiError::bad_request(
                ErrorCode::TooManyMessages,
                format!(
                    "a produce request may carry at most {PRODUCE_MESSAGES_MAX} messages, got {}",
                    messages.len()
                ),
            ));
        }
        let t = self.topic_info(topic).await?;
        let partitions = t.partitions;
        let max_bytes = t.config.max_message_bytes as usize;
        let spread = self.inner.spread.fetch_add(1, Ordering::Relaxed) % partitions;
        let now = now_ms() as i64;
        // Group messages per partition into batches no larger than max.message.bytes.
        let mut per_partition: BTreeMap<u32, Vec<(usize, BatchBuilder)>> = BTreeMap::new();
        let mut slots: Vec<(u32, usize, usize)> = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            let partition = match (m.partition, &m.key) {
                (Some(p), _) if p < partitions => p,
                (Some(p), _) => {
                    return Err(MetadataError::UnknownPartition { topic: topic.into(), partition: p }.into());
                }
                (None, Some(key)) => partition_for_key(key, partitions),
                (None, None) => spread,
            };
            let record = NewRecord {
                timestamp_ms: m.timestamp_ms.unwrap_or(now),
                key: m.key,
                value: m.value,
                headers: m.headers,
            };
            let batches = per_partition.entry(partition).or_default();
            let alone = BatchBuilder::new().encoded_len_with(&record);
            if alone > max_bytes {
                return Err(ApiError::new(
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::MessageTooLarge,
                    format!(
                        "message {i} is {alone} bytes as a record batch, over the topic's max.message.bytes of {max_bytes}"
                    ),
                ));
            }
            let fits = batches.last().is_some_and(|(_, b)| b.encoded_len_with(&record) <= max_bytes);
            if !fits {
                batches.push((0, BatchBuilder::new()));
            }
            let batch_index = batches.len() - 1;
            let Some((count, builder)) = batches.last_mut() else { unreachable!("pushed above") };
            builder.push(record);
            slots.push((partition, batch_index, *count));
            *count += 1;
        }
        let mut appends = Vec::new();
        for (partition, batches) in per_partition {
            let target = Arc::new(self.target(topic, partition, false).await?);
            // Batches for another agent go one after the other (a fair lock taken in order), so
            // they get offsets in order, and none follows one that failed.
            let in_order = Arc::new(tokio::sync::Mutex::new(false));
            for (batch_index, (_, builder)) in batches.into_iter().enumerate() {
                let bytes = builder
                    .build()
                    .map_err(|e| ApiError::bad_request(ErrorCode::InvalidMessage, e.to_string()))?;
                let batch = RecordBatch::parse(bytes).map_err(|e| ApiError::internal(e.to_string()))?;
                let (target, in_order) = (Arc::clone(&target), Arc::clone(&in_order));
                let (peers, this) = (&self.inner.peers, self);
                appends.push(async move {
                    let (count, len) = (batch.record_count(), batch.len_bytes());
                    let result = match &*target {
                        Target::Local(handle) => handle.append(batch).await.map_err(ApiError::from),
                        remote => {
                            let mut failed = in_order.lock().await;
                            if *failed {
                                Err(ApiError::unavailable(format!(
                                    "an earlier batch of this request to partition {partition} failed; this one was not sent"
                                )))
                            } else {
                                let peer = remote.peer().unwrap_or_default();
                                this.count_forwarded("append");
                                let r = peers.append(peer, topic, partition, batch.into_bytes()).await;
                                *failed = r.is_err();
                                r
                            }
                        }
                    };
                    (partition, batch_index, count, len, result)
                });
            }
        }
        let results = futures::future::join_all(appends).await;
        let mut bases: HashMap<(u32, usize), u64> = HashMap::new();
        let mut first_error = None;
        let labels = Metrics::topic(topic);
        for (partition, batch_index, count, len, result) in results {
            match result {
                Ok((base, _)) => {
                    bases.insert((partition, batch_index), base);
                    self.inner.metrics.records_in.get_or_create(&labels).inc_by(u64::from(count));
                    self.inner.metrics.bytes_in.get_or_create(&labels).inc_by(len as u64);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.inner.appended.notify_waiters();
        if let Some(e) = first_error {
            return Err(e);
        }
        let ids =
            slots.into_iter().map(|(p, b, i)| MessageId::new(topic, p, bases[&(p, b)] + i as u64)).collect();
        self.inner.metrics.produce_latency_seconds.observe(started.elapsed().as_secs_f64());
        Ok(ids)
    }

    /// Appends a client-built RecordBatch v2 as it is (checked, then given offsets).
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: u32,
        body: Bytes,
        forwarded: bool,
    ) -> Result<(u64, u64), ApiError> {
        let started = Instant::now();
        let t = self.topic_info(topic).await?;
        if body.len() as u64 > t.config.max_message_bytes {
            return Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::MessageTooLarge,
                format!(
                    "record batch of {} bytes is over the topic's max.message.bytes of {}",
                    body.len(),
                    t.config.max_message_bytes
                ),
            ));
        }
        let batch = RecordBatch::parse(body)
            .map_err(|e| ApiError::bad_request(ErrorCode::InvalidRecordBatch, e.to_string()))?;
        let (count, len) = (batch.record_count(), batch.len_bytes());
        let range = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => handle.append(batch).await?,
            remote => {
                let peer = remote.peer().unwrap_or_default();
                self.count_forwarded("append");
                return self.inner.peers.append(peer, topic, partition, batch.into_bytes()).await;
            }
        };
        self.inner.appended.notify_waiters();
        let labels = Metrics::topic(topic);
        self.inner.metrics.records_in.get_or_create(&labels).inc_by(u64::from(count));
        self.inner.metrics.bytes_in.get_or_create(&labels).inc_by(len as u64);
        self.inner.metrics.produce_latency_seconds.observe(started.elapsed().as_secs_f64());
        Ok(range)
    }

    /// Reads records of one partition from `offset` without touching any group: archived
    /// offsets from the bucket through the cold reader, the rest from the local log, as one
    /// stream, as much as `limit` allows. Offsets deleted by retention are skipped.
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        forwarded: bool,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        // A read that takes this long says where it is, every SLOW_READ_WARN_AFTER, until it ends.
        let stage = ReadStage::new(offset);
        let read = self.read_staged(topic, partition, offset, limit, forwarded, &stage);
        tokio::pin!(read);
        let started = Instant::now();
        loop {
            tokio::select! {
                r = &mut read => return r,
                () = tokio::time::sleep(SLOW_READ_WARN_AFTER) => {
                    let (at, next) = stage.get();
                    warn!(
                        topic, partition, offset, stage = at, next_offset = next,
                        elapsed_ms = started.elapsed().as_millis() as u64, "a read is still running"
                    );
                }
            }
        }
    }

    async fn read_staged(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        forwarded: bool,
        stage: &ReadStage,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        let limit = ReadLimit { records: limit.records.max(1), ..limit };
        stage.set("finding the partition's writer", offset);
        let reader = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => Arc::clone(handle.reader()),
            remote => {
                let peer = remote.peer().unwrap_or_default();
                self.count_forwarded("read");
                stage.set("reading from the writer", offset);
                let answer = self.inner.peers.read(peer, topic, partition, offset, limit).await?;
                // The writer returns its first record whatever its size; this read may not.
                let mut page = Page::new(offset);
                if !page.fill(answer.records, &limit) {
                    page.next = answer.next_offset;
                }
                return Ok((page.records, page.next, answer.high_watermark));
            }
        };
        let mut page = Page::new(offset);
        // Cold part: offsets below what this agent holds locally.
        let labels = Metrics::topic(topic);
        let mut refreshed = false;
        let mut attempts = 0;
        loop {
            // Full once the limit has no room left (the cold reader would otherwise return a
            // record this page cannot take, and take the next page's read for a seek).
            let mut full = page.rest(&limit).is_spent();
            while !full && !reader.holds(page.next) {
                let next = page.next;
                let located = self.with_partition(topic, partition, |part| {
                    let location = locate(part, next);
                    let ensemble = match &location {
                        Location::Hot { base_offset } => {
                            part.segments.get(base_offset).map(|s| s.ensemble.clone())
                        }
                        _ => None,
                    };
                    (location, ensemble)
                });
                let Some((location, ensemble)) = located else { break };
                let rest = page.rest(&limit);
                if let Location::Hot { .. } = location {
                    // Written before this agent took the partition over, not archived yet.
                    let Some(ensemble) = ensemble else { break };
                    // At least one record, so that an empty answer means there is nothing
                    // there: whether it fits is for `fill` to say.
                    let ask = ReadLimit { at_least_one: true, ..rest };
                    stage.set("reading unarchived segments other agents hold", next);
                    let got = match self.read_elsewhere(topic, partition, next, ask, &ensemble).await {
                        Ok(got) => got,
                        // The holders may have dropped it because it is archived by now, which this
                        // agent's metadata copy does not show yet: catch up once and look again.
                        Err(_) if !refreshed => {
                            refreshed = true;
                            self.inner.metadata.read(|_| ()).await?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if got.is_empty() {
                        break;
                    }
                    full = page.fill(got, &limit);
                    continue;
                }
                let Some(cold) = &self.inner.cold else { break };
                match location {
                    Location::Cold { object_key, object_bytes, last_offset, .. } => {
                        stage.set("starting on the next archived object", next);
                        self.read_ahead_next_object(
                            cold,
                            topic,
                            partition,
                            &object_key,
                            object_bytes,
                            last_offset,
                            next,
                        )
                        .await;
                        stage.set("reading archived data", next);
                        let got = cold
                            .read_limited(
                                &object_key,
                                object_bytes,
                                next,
                                rest.records,
                                rest.bytes,
                                rest.at_least_one,
                            )
                            .await
                            .map_err(|e| ApiError::unavailable(format!("reading archived data: {e}")))?;
                        if got.is_empty() && !rest.at_least_one {
                            // No room for its next record: the page ends here.
                            full = true;
                            continue;
                        }
                        let Some(last) = got.last().map(|r| r.offset) else {
                            page.next = last_offset + 1;
                            continue;
                        };
                        // Short of the record limit and of the object's end, the cold reader
                        // stopped at the byte limit: the next record does not fit.
                        let at_byte_limit = got.len() < rest.records && last < last_offset;
                        full = page.fill(got, &limit) || at_byte_limit || page.rest(&limit).is_spent();
                    }
                    Location::Gone { earliest } if earliest > next => page.next = earliest,
                    _ => break,
                }
            }
            if full {
                self.inner.metrics.records_out.get_or_create(&labels).inc_by(page.records.len() as u64);
                return Ok((page.records, page.next, reader.high_watermark()));
            }
            stage.set("reading the local log", page.next);
            match read_hot(Arc::clone(&reader), page.next, page.rest(&limit), None).await {
                Ok((hot, next, hwm, bytes)) => {
                    let mut records = page.records;
                    records.extend(hot);
                    self.inner.metrics.records_out.get_or_create(&labels).inc_by(records.len() as u64);
                    self.inner.metrics.bytes_out.get_or_create(&labels).inc_by(bytes as u64);
                    return Ok((records, next, hwm));
                }
                // The local copy of these offsets was dropped (archived) while this read ran:
                // read them from where they are now.
                Err(e)
                    if e.code == ErrorCode::OffsetOutOfRange && !reader.holds(page.next) && attempts < 3 =>
                {
                    attempts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every record of a sealed segment from the local log (what the compactor archives).
    pub async fn read_local_segment(
        &self,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, ApiError> {
        // The local copy first; a copy this agent lacks (a wiped disk) or holds only in part is
        // completed from the other members.
        let epoch = self
            .with_partition(topic, partition, |p| {
                p.segments.get(&base_offset).map(|s| crate::partition_log::epoch_i32(s.epoch))
            })
            .flatten();
        let mut records = match (self.local_reader(topic, partition), epoch) {
            (Some(reader), Some(epoch)) => {
                Self::read_segment_from(reader, base_offset, last_offset, epoch).await.unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // A replica that left the ensemble early holds a shorter copy: the rest is on the
        // others.
        let mut next = records.last().map_or(base_offset, |r| r.offset + 1);
        if next <= last_offset {
            let ensemble = self
                .with_partition(topic, partition, |p| {
                    p.segments.get(&base_offset).map(|s| s.ensemble.clone())
                })
                .flatten()
                .unwrap_or_default();
            let me = self.inner.config.agent_id.clone();
            let others: Vec<String> = ensemble.into_iter().filter(|a| *a != me).collect();
            while next <= last_offset {
                let want = (last_offset - next + 1).min(REPLAY_STEP) as usize;
                let got = self
                    .read_elsewhere(topic, partition, next, ReadLimit::new(want, READ_BYTES_DEFAULT), &others)
                    .await?;
                let Some(last) = got.last() else { break };
                next = last.offset + 1;
                records.extend(got.into_iter().filter(|r| r.offset <= last_offset));
            }
        }
        Ok(records)
    }

    /// The records `base_offset..=last_offset` of the local log's copy of a segment written
    /// under `epoch` (stamped as batches carry it); they end at a batch of another epoch.
    async fn read_segment_from(
        reader: Arc<PartitionReader>,
        base_offset: u64,
        last_offset: u64,
        epoch: i32,
    ) -> Result<Vec<Record>, ApiError> {
        tokio::task::spawn_blocking(move || -> Result<Vec<Record>, StoreError> {
            let mut records = Vec::new();
            let mut next = base_offset;
            while next <= last_offset {
                let r = reader.read(next, 4 * READ_BYTES_STEP)?;
                if r.batches.is_empty() {
                    break;
                }
                for batch in &r.batches {
                    if batch.partition_leader_epoch() != epoch {
                        return Ok(records);
                    }
                    records.extend(
                        batch.records().filter(|rec| rec.offset >= next && rec.offset <= last_offset),
                    );
                }
                next = r.next_offset;
            }
            Ok(records)
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))?
        .map_err(ApiError::from)
    }

    /// The local log of a partition: its writer's here, or a retired one.
    fn local_reader(&self, topic: &str, partition: u32) -> Option<Arc<PartitionReader>> {
        let key = (topic.to_string(), partition);
        let running = self
            .inner
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map(|r| Arc::clone(r.handle.reader()));
        running.or_else(|| {
            self.inner.retired.read().unwrap_or_else(|e| e.into_inner()).get(&key).map(|(_, r)| Arc::clone(r))
        })
    }

    /// Reads records this agent holds in its local log of a partition, whether or not it
    /// writes the partition (segments it wrote or follows), never past their committed end.
    pub async fn read_held(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        let reader = self.local_reader(topic, partition).ok_or_else(|| {
            ApiError::unavailable(format!("this agent holds no local log of {topic}/{partition}"))
        })?;
        // Only what is committed is served from a replica (it may hold a tail that was never
        // acknowledged): a sealed segment up to the end metadata sealed, the open one up to the
        // end its writer last said was committed.
        let segment = self
            .with_partition(topic, partition, |p| {
                p.segments.range(..=offset).next_back().map(|(_, s)| s.clone())
            })
            .flatten();
        let epoch = segment.as_ref().map(|seg| crate::partition_log::epoch_i32(seg.epoch));
        let committed_last = segment.and_then(|seg| {
            if seg.state != silt_metadata::state::SegmentState::Open {
                return seg.last_offset;
            }
            let replica = self.open_replica_if_any(topic, partition)?;
            let end = lock(&replica).as_ref()?.committed_end(seg.base_offset)?;
            end.checked_sub(1).filter(|l| *l >= seg.base_offset)
        });
        let Some(last) = committed_last.filter(|l| *l >= offset) else {
            return Err(ApiError::unavailable(format!(
                "offset {offset} of {topic}/{partition} is not committed in a segment this agent holds; read it from the partition's writer"
            )));
        };
        let want = limit.records.max(1).min((last - offset + 1) as usize);
        // Only the copy of the segment metadata records there: a local segment of another
        // epoch at these offsets holds records a recovery dropped, not yet cut back here.
        let (records, next, hwm, _) =
            read_hot(reader, offset, ReadLimit { records: want, ..limit }, epoch).await?;
        if records.is_empty() {
            return Err(ApiError::unavailable(format!(
                "this agent's replica of {topic}/{partition} does not hold offset {offset} as written under epoch {}",
                epoch.unwrap_or_default()
            )));
        }
        Ok((records, next, hwm))
    }

    /// Reads offsets of a segment that is neither archived nor in this agent's writer log:
    /// from this agent's retired log if it holds the segment, else from an agent of its
    /// ensemble.
    async fn read_elsewhere(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        ensemble: &[String],
    ) -> Result<Vec<Record>, ApiError> {
        let me = self.inner.config.agent_id.as_str();
        if ensemble.iter().any(|a| a == me) {
            if let Ok((records, _, _)) = self.read_held(topic, partition, offset, limit).await {
                if !records.is_empty() {
                    return Ok(records);
                }
            }
        }
        let mut last = ApiError::unavailable(format!(
            "offset {offset} of {topic}/{partition} is held by agent(s) {} and none answered",
            ensemble.join(", ")
        ));
        for agent in ensemble.iter().filter(|a| *a != me) {
            let Some(addr) = self.inner.metadata.read_local(|s| s.agents.get(agent).map(|a| a.addr.clone()))
            else {
                continue;
            };
            self.count_forwarded("read");
            match self.inner.peers.read_held((agent, &addr), topic, partition, offset, limit).await {
                Ok(page) => return Ok(page.records),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Sets the replication metrics from the writers' last view of their followers.
    fn export_replication_lag(&self) {
        let m = &self.inner.metrics;
        m.replication_lag_records.clear();
        m.replication_lag_ms.clear();
        let running: Vec<((String, u32), Vec<FollowerLag>, usize)> = self
            .inner
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, r)| (k.clone(), r.handle.follower_lag(), r.replication_factor))
            .collect();
        let mut under = 0;
        for ((topic, partition), lag, replication_factor) in running {
            if lag.iter().filter(|l| !l.failed).count() + 1 < replication_factor {
                under += 1;
            }
            for l in lag {
                let labels = ReplicaLabels { topic: topic.clone(), partition, replica: l.agent };
                m.replication_lag_records.get_or_create(&labels).set(l.records as i64);
                m.replication_lag_ms.get_or_create(&labels).set(l.ms as i64);
            }
        }
        m.under_replicated_partitions.set(under);
    }

    /// Drops the segments of followed partitions that are archived (oldest first): the bucket
    /// holds them now. When the last one is archived too (the writer has moved on to a segment
    /// this agent does not hold yet), an empty segment at its end takes its place: the
    /// directory, with its fence, stays for the next segment this agent follows.
    async fn trim_replicas(&self) {
        let replicas: Vec<((String, u32), SharedReplica)> =
            lock(&self.inner.replicas).iter().map(|(k, r)| (k.clone(), Arc::clone(r))).collect();
        for ((topic, partition), shared) in replicas {
            // The chain from the segment holding the replica's first offset on (the chain
            // before it can be long): what `is_archived` needs of it for the replica's segments.
            let start = self.local_reader(&topic, partition).map_or(0, |r| r.log_start());
            let chain = self.with_partition(&topic, partition, |p| silt_metadata::state::Partition {
                writer: None,
                epoch: p.epoch,
                empty_end: p.empty_end,
                segments: p
                    .segments
                    .range(..=start)
                    .next_back()
                    .into_iter()
                    .chain(p.segments.range(start.saturating_add(1)..))
                    .map(|(base, seg)| (*base, seg.clone()))
                    .collect(),
            });
            let Some(part) = chain else { continue };
            let result = tokio::task::spawn_blocking(move || -> Result<usize, StoreError> {
                let mut guard = lock(&shared);
                let Some(replica) = guard.as_mut() else { return Ok(0) };
                let log = replica.log_mut();
                let archived = |s: &crate::segment::Segment| {
                    s.record_count() == 0 || part.is_archived(s.base_offset(), s.next_offset() - 1)
                };
                if log.active().record_count() > 0 && log.segments().iter().all(archived) {
                    log.start_segment_at(log.next_offset())?;
                }
                let sealed = &log.segments()[..log.segments().len() - 1];
                match sealed.iter().take_while(|s| archived(s)).last() {
                    Some(s) => log.delete_before(s.next_offset()),
                    None => Ok(0),
                }
            });
            match result.await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => info!(topic, partition, segments = n, "dropped archived segments of a replica"),
                Ok(Err(e)) => {
                    warn!(topic, partition, error = %e, "dropping archived segments of a replica failed")
                }
                Err(e) => {
                    warn!(topic, partition, error = %e, "dropping archived segments of a replica panicked")
                }
            }
        }
    }

    /// Opens the local logs of partitions this agent does not write but holds data of (it
    /// wrote them before a restart), so that they stay readable until archived.
    async fn open_retired_logs(&self, topics: &[Topic]) {
        let me = self.inner.config.agent_id.clone();
        for t in topics {
            for (p, part) in t.partitions.iter().enumerate() {
                if part.writer.as_deref() == Some(me.as_str()) {
                    continue;
                }
                let dir = self.topic_dir(&t.name, t.id).join(p.to_string());
                if !dir.exists() {
                    continue;
                }
                let chain = part.clone();
                let opened = tokio::task::spawn_blocking(move || {
                    let (mut log, _) = PartitionLog::open(&dir)?;
                    let fence = crate::replica::read_fence(&dir)?;
                    trim_to_metadata(&mut log, &chain, fence)?;
                    Ok::<_, StoreError>(log)
                });
                match opened.await {
                    Ok(Ok(log)) if !log.reader().ranges().is_empty() => {
                        self.inner
                            .retired
                            .write()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert((t.name.clone(), p as u32), (t.id, log.reader()));
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        warn!(topic = %t.name, partition = p, error = %e, "cannot open a local log this agent no longer writes")
                    }
                    Err(e) => {
                        warn!(topic = %t.name, partition = p, error = %e, "opening a local log panicked")
                    }
                }
            }
        }
    }

    /// Forgets retired local logs whose records are all archived (or deleted by retention),
    /// and deletes their files, unless this agent writes the partition again or follows it
    /// (see [`retired_log_droppable`]); a followed partition's archived segments are dropped
    /// by [`Agent::trim_replicas`] instead.
    async fn drop_archived_retired_logs(&self) {
        let retired: Vec<RetiredRanges> = self
            .inner
            .retired
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, (id, r))| (k.clone(), *id, r.ranges()))
            .collect();
        for (key, topic_id, ranges) in retired {
            if !self.retired_log_droppable(&key, topic_id, &ranges) {
                continue;
            }
            let slot = self.writer_slot(&key);
            let writer = slot.lock().await;
            if writer.is_some() {
                continue;
            }
            // Again under the lock that opening a writer or a replica takes: what was read
            // above may have changed (a replica opened, a writer appended to it since).
            let current = self
                .inner
                .retired
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .filter(|(id, _)| *id == topic_id)
                .map(|(_, r)| r.ranges());
            let Some(ranges) = current else { continue };
            if !self.retired_log_droppable(&key, topic_id, &ranges) {
                continue;
            }
            self.inner.retired.write().unwrap_or_else(|e| e.into_inner()).remove(&key);
            if let Some(replica) = lock(&self.inner.replicas).remove(&key) {
                *lock(&replica) = None;
            }
            let (topic, partition) = key;
            let dir = self.topic_dir(&topic, topic_id).join(partition.to_string());
            match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await {
                Ok(Ok(())) => info!(
                    topic,
                    partition, "dropped the archived local log of a partition another agent writes"
                ),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                Ok(Err(e)) => warn!(topic, partition, error = %e, "deleting an archived local log failed"),
                Err(e) => warn!(topic, partition, error = %e, "deleting an archived local log panicked"),
            }
            drop(writer);
        }
    }

    /// Whether the retired log of `key` (topic id `topic_id`), holding `ranges`, may go.
    fn retired_log_droppable(&self, key: &(String, u32), topic_id: u64, ranges: &[(u64, u64)]) -> bool {
        let followed = lock(&self.inner.replicas).contains_key(key);
        self.inner.metadata.read_local(|s| {
            let part = s
                .topics
                .get(&key.0)
                .filter(|t| t.id == topic_id)
                .and_then(|t| t.partitions.get(key.1 as usize));
            retired_log_droppable(part.is_some(), followed, ranges, |first, last| {
                part.is_some_and(|p| p.is_archived(first, last))
            })
        })
    }

    fn partition_meta(&self, topic: &str, partition: u32) -> Option<silt_metadata::state::Partition> {
        self.with_partition(topic, partition, Clone::clone)
    }

    /// Before a read of archived `object_key` (offsets up to `last_offset`) at `next`: if a
    /// stream nearing this object's end is there ([`ColdReader::next_object_due`], decided now,
    /// before the read moves it on), has the cold reader start on the partition's next archived
    /// object in the background, so the read does not wait for that object's footer. A failure
    /// is left to the read that needs the next object.
    #[allow(clippy::too_many_arguments)]
    async fn read_ahead_next_object(
        &self,
        cold: &Arc<ColdReader>,
        topic: &str,
        partition: u32,
        object_key: &str,
        object_bytes: u64,
        last_offset: u64,
        next: u64,
    ) {
        let due = match cold.next_object_due(object_key, object_bytes, next).await {
            Ok(Some(due)) => due,
            // Not due; or this object's footer could not be read, which the read reports.
            Ok(None) | Err(_) => return,
        };
        let then = self.with_partition(topic, partition, |part| match locate(part, last_offset + 1) {
            Location::Cold { object_key, object_bytes, .. } => Some((object_key, object_bytes)),
            _ => None,
        });
        let Some(Some((then_key, then_bytes))) = then else { return };
        let cold = Arc::clone(cold);
        tokio::spawn(async move {
            if let Err(e) = cold.read_ahead_next_object(due, &then_key, then_bytes).await {
                debug!(object = %then_key, error = %e, "reading the next archived object ahead failed");
            }
        });
    }

    /// `f` of a partition in the local copy of metadata, without copying the partition (its
    /// segment chain grows with its history): what request paths use.
    fn with_partition<T>(
        &self,
        topic: &str,
        partition: u32,
        f: impl FnOnce(&silt_metadata::state::Partition) -> T,
    ) -> Option<T> {
        self.inner
            .metadata
            .read_local(|s| s.topics.get(topic).and_then(|t| t.partitions.get(partition as usize)).map(f))
    }

    /// The first offset of a partition that still exists anywhere (bucket or local disk).
    fn earliest_offset(&self, topic: &str, partition: u32, local_start: u64) -> u64 {
        if self.inner.cold.is_none() {
            return local_start;
        }
        self.with_partition(topic, partition, silt_tiering::locate::earliest_offset)
            .map_or(local_start, |earliest| earliest.min(local_start))
    }

    /// The first offset of a partition whose timestamp is at least `timestamp_ms`, looking in
    /// archived segments (by their timestamp range) before the local log.
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
        forwarded: bool,
    ) -> Result<u64, ApiError> {
        let reader = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => Arc::clone(handle.reader()),
            remote => {
                let peer = remote.peer().unwrap_or_default();
                return self.inner.peers.offset_for_time(peer, topic, partition, timestamp_ms).await;
            }
        };
        if let (Some(cold), Some(part)) = (&self.inner.cold, self.partition_meta(topic, partition)) {
            let local_start = reader.log_start();
            for seg in part.segments.values() {
                if seg.base_offset >= local_start && reader.holds(seg.base_offset) {
                    break;
                }
                if seg.max_timestamp_ms.is_some_and(|m| m < timestamp_ms) {
                    continue;
                }
                let (Some(key), Some(_)) = (&seg.object_key, seg.last_offset) else { continue };
                let found = cold
                    .offset_for_time(key, seg.object_bytes, timestamp_ms)
                    .await
                    .map_err(|e| ApiError::unavailable(format!("reading archived data: {e}")))?;
                if let Some(offset) = found {
                    return Ok(offset);
                }
            }
        }
        Ok(tokio::task::spawn_blocking(move || reader.offset_for_time(timestamp_ms))
            .await
            .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))??)
    }
}

/// Whether a local log this agent does not write may be deleted. Its topic is gone: yes.
/// Otherwise only if it is not followed and holds records, all of them archived. A followed
/// partition's directory holds the fence that refuses deposed writers, and a writer may
/// append to the replica at any moment: a replica just opened holds nothing yet, which is not
/// the same as holding nothing that is not archived.
fn retired_log_droppable(
    topic_exists: bool,
    followed: bool,
    ranges: &[(u64, u64)],
    archived: impl Fn(u64, u64) -> bool,
) -> bool {
    if !topic_exists {
        return true;
    }
    !followed && !ranges.is_empty() && ranges.iter().all(|&(first, last)| archived(first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: u64, value_bytes: usize) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(vec![b'v'; value_bytes])),
            headers: vec![silt_record::Header { key: "h".into(), value: Some(Bytes::from_static(b"hv")) }],
        }
    }

    fn offsets(records: &[Record]) -> Vec<u64> {
        records.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn disk_usage_counts_what_the_files_under_the_log_directory_take() {
        let dir = tempfile::tempdir().expect("tempdir");
        let partition = dir.path().join("log").join("orders~1").join("0");
        std::fs::create_dir_all(&partition).expect("mkdir");
        std::fs::write(partition.join("00000000000000000000.log"), vec![1u8; 10_000]).expect("write");
        std::fs::write(partition.join("00000000000000000000.index"), vec![2u8; 100]).expect("write");
        // An open segment with space written ahead of its data (zeros in Silt; a pattern here,
        // which a filesystem that compresses cannot turn into a hole).
        let open = std::fs::File::create(partition.join("00000000000000000042.log")).expect("create");
        std::os::unix::fs::FileExt::write_all_at(&open, &vec![0x5au8; 64 * 1024], 0).expect("write");
        // Outside `log/`: not the logs'.
        std::fs::write(dir.path().join("instance"), vec![3u8; 200_000]).expect("write");
        let (used, filesystem) = disk_usage(dir.path());
        assert!(used >= 10_000 + 100 + 64 * 1024, "{used}");
        assert!(used < 200_000, "{used}: counted a file outside log/");
        let (free, size) = filesystem.expect("statvfs");
        assert!(free > 0 && free <= size, "free {free} of {size}");
        // No log directory yet (an agent before its first partition): nothing used.
        assert_eq!(disk_usage(&dir.path().join("elsewhere")).0, 0);
    }

    #[test]
    fn a_local_log_goes_only_when_everything_it_holds_is_archived_and_nobody_follows_it() {
        let archived_below_100 = |_first: u64, last: u64| last < 100;
        assert!(retired_log_droppable(true, false, &[(0, 49), (50, 99)], archived_below_100));
        assert!(!retired_log_droppable(true, false, &[(0, 49), (50, 100)], archived_below_100));
        // A replica just opened holds nothing yet, and a followed partition keeps its fence.
        assert!(!retired_log_droppable(true, false, &[], archived_below_100));
        assert!(!retired_log_droppable(true, true, &[(0, 49)], archived_below_100));
        // The topic is gone (or is another topic of the same name now): nothing is kept.
        assert!(retired_log_droppable(false, true, &[(0, 200)], |_, _| false));
    }

    #[test]
    fn a_hot_read_takes_the_page_cache_here_and_the_rest_from_the_disk_on_the_blocking_pool() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let batch = |n: u64| {
            let records: Vec<silt_record::NewRecord> = (0..n)
                .map(|i| silt_record::NewRecord {
                    timestamp_ms: i as i64,
                    key: None,
                    value: Some(Bytes::from(vec![b'v'; 100])),
                    headers: Vec::new(),
                })
                .collect();
            RecordBatch::parse(silt_record::encode_batch(&records).unwrap()).unwrap()
        };
        // Two segments of 50 batches of 10 records.
        for _ in 0..2 {
            log.append_and_sync((0..50).map(|_| batch(10)).collect(), 1).unwrap();
            log.roll().unwrap();
        }
        log.publish();
        let reader = log.reader();
        let all = ReadLimit::new(10_000, usize::MAX);
        let page = || HotPage::new(0, 0);
        let mut whole = page();
        assert!(whole.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&whole.records), (0..1000).collect::<Vec<_>>());
        assert_eq!(whole.hwm, 1000);

        // All in the page cache: read here, and a budget stops the read at a batch boundary.
        let mut cached = page();
        assert!(cached.read(&reader, &all, ReadMode::CachedOnly, usize::MAX).unwrap());
        assert_eq!(offsets(&cached.records), offsets(&whole.records));
        let mut part = page();
        assert!(!part.read(&reader, &all, ReadMode::CachedOnly, 2 * whole.bytes / 100).unwrap());
        assert!(part.records.len() < 100 && part.records.len() % 10 == 0, "{}", part.records.len());
        assert!(part.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&part.records), offsets(&whole.records), "the rest follows on");

        // The second segment out of the page cache: the cached read stops there, and the
        // read that may wait goes on from where it stopped.
        let second = &log.segments()[1];
        let file = std::fs::File::open(second.path()).unwrap();
        // Dropping pages is advice: a kernel busy writing back other files may keep them for
        // a while, so a read that still found everything cached is tried again (for 10 s).
        let (mut attempts, deadline) = (0, Instant::now() + Duration::from_secs(10));
        let (mut mixed, stopped) = loop {
            rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            let mut mixed = page();
            let stopped = mixed.read(&reader, &all, ReadMode::CachedOnly, usize::MAX);
            attempts += 1;
            if !matches!(stopped, Ok(true)) || Instant::now() > deadline {
                break (mixed, stopped);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(matches!(stopped, Err(StoreError::NotCached)), "{stopped:?} after {attempts} attempts");
        assert_eq!(offsets(&mixed.records), (0..500).collect::<Vec<_>>());
        assert!(mixed.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&mixed.records), offsets(&whole.records));
        assert_eq!((mixed.bytes, mixed.used, mixed.hwm), (whole.bytes, whole.used, whole.hwm));
    }

    /// A local log may hold, at offsets metadata records for a segment of one epoch, batches
    /// of another (what a recovery that did not hear from this replica dropped, in a log not
    /// cut back yet): reads of a held segment return only batches of its epoch.
    #[tokio::test]
    async fn reads_of_a_held_segment_return_only_batches_of_its_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let batch = |tag: &str| {
            let records: Vec<silt_record::NewRecord> = (0..5)
                .map(|i| silt_record::NewRecord {
                    timestamp_ms: i,
                    key: None,
                    value: Some(Bytes::from(format!("{tag}{i}"))),
                    headers: Vec::new(),
                })
                .collect();
            RecordBatch::parse(silt_record::encode_batch(&records).unwrap()).unwrap()
        };
        // Offsets 0..10 written under epoch 1, then 10..20 under epoch 2, in one segment file.
        log.append_and_sync(vec![batch("a"), batch("b")], 1).unwrap();
        log.append_and_sync(vec![batch("c"), batch("d")], 2).unwrap();
        log.publish();
        let reader = log.reader();
        let all = ReadLimit::new(10_000, usize::MAX);
        let read = |from: u64, epoch: Option<i32>| {
            let mut page = HotPage::new(from, 0).of_epoch(epoch);
            assert!(page.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
            offsets(&page.records)
        };
        assert_eq!(read(0, None), (0..20).collect::<Vec<_>>());
        assert_eq!(read(0, Some(1)), (0..10).collect::<Vec<_>>(), "ends at the first batch of epoch 2");
        assert_eq!(read(3, Some(2)), Vec::<u64>::new(), "offset 3 is of epoch 1 here");
        assert_eq!(read(12, Some(2)), (12..20).collect::<Vec<_>>());
        let (records, _, _, _) = read_hot(Arc::clone(&reader), 0, all, Some(2)).await.unwrap();
        assert!(records.is_empty(), "{:?}", offsets(&records));

        // What the compactor archives from this log.
        let segment = |first, last, epoch| Agent::read_segment_from(Arc::clone(&reader), first, last, epoch);
        assert_eq!(offsets(&segment(0, 19, 1).await.unwrap()), (0..10).collect::<Vec<_>>());
        assert!(segment(0, 19, 2).await.unwrap().is_empty());
        assert_eq!(offsets(&segment(10, 14, 2).await.unwrap()), (10..15).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_counts_its_key_value_and_headers() {
        assert_eq!(record(0, 10).data_len(), 1 + 10 + 1 + 2);
        let empty = Record { offset: 0, timestamp_ms: 0, key: None, value: None, headers: Vec::new() };
        assert_eq!(empty.data_len(), 0);
    }

    #[test]
    fn fill_stops_at_the_byte_limit_and_at_the_record_limit() {
        let got = || (0..10).map(|o| record(o, 96)).collect::<Vec<_>>(); // 100 bytes each
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(10, 350)));
        assert_eq!((offsets(&page.records), page.used, page.next), (vec![0, 1, 2], 300, 3));
        // Exactly at the limit still fits.
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(10, 300)));
        assert_eq!(offsets(&page.records), vec![0, 1, 2]);
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(2, 10_000)));
        assert_eq!(offsets(&page.records), vec![0, 1]);
        // Room for more: not full.
        let mut page = Page::new(0);
        assert!(!page.fill(got(), &ReadLimit::new(20, 10_000)));
        assert_eq!(page.records.len(), 10);
    }

    #[test]
    fn the_first_record_comes_whatever_its_size_unless_the_read_may_come_back_empty() {
        let big = || vec![record(0, 1_000_000), record(1, 10)];
        let mut page = Page::new(0);
        assert!(page.fill(big(), &ReadLimit::new(10, 100)));
        assert_eq!(offsets(&page.records), vec![0]);
        let later = ReadLimit { at_least_one: false, ..ReadLimit::new(10, 100) };
        let mut page = Page::new(0);
        assert!(page.fill(big(), &later));
        assert!(page.records.is_empty());
    }

    #[test]
    fn what_is_left_of_a_limit_carries_on_across_reads() {
        let limit = ReadLimit::new(10, 1000);
        let rest = limit.rest(3, 400);
        assert_eq!(rest, ReadLimit { records: 7, bytes: 600, at_least_one: false });
        assert!(!rest.is_spent());
        assert!(limit.rest(3, 1000).is_spent());
        assert!(limit.rest(10, 0).is_spent());
        // Nothing read yet: the first record still comes whatever the bytes left.
        assert!(!ReadLimit::new(10, 0).is_spent());
        assert_eq!(limit.rest(0, 0), limit);
    }
}
