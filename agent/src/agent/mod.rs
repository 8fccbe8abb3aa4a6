//! The agent: everything behind the client API. It owns the partition writers of this
//! process, routes produce requests to them, serves replays from the local logs and runs
//! consumer-group delivery (leases, redelivery, dead-lettering, ack checkpoints).
//!
//! One `Agent`, its `impl` split by concern: this file holds its state, its lifecycle (start,
//! registration and heartbeats, shutdown) and routing; [`writers`] the partition writers and
//! their supervisor, [`topics`], [`produce`], [`read`], [`follower`] the follower's side of
//! replication, [`retired`] local logs of partitions written elsewhere, [`repair`] ensemble
//! repair, [`groups`] consumer groups.

mod follower;
mod groups;
mod produce;
mod read;
mod repair;
mod retired;
mod topics;
mod writers;

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
use crate::log::partition_log::{PartitionLog, PartitionReader};
use crate::log::replica::{join_batches, split_batches, trim_to_metadata, HeldSegment, Replica};
use crate::log::segment::ReadMode;
use crate::metrics::{ForwardLabels, LagLabels, Metrics, RepairLabels, ReplicaLabels};
use crate::replication::ensemble::FollowerLag;
use crate::replication::placement::Repair;
use crate::replication::writer::{self, PartitionHandle, WriterConfig};
use crate::transport::{CollectRequest, HttpPeers, Peers, ReplicaTarget, WireRecord};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use silt_tiering::cold_reader::ColdReader;
use silt_tiering::locate::{locate, Location};

/// How often dirty ack state is checkpointed to metadata.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);
/// How often a waiting poll asks other agents for the partitions they write.
const REMOTE_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Suffix of dead-letter topics.
pub const DLQ_SUFFIX: &str = ".dlq";

/// How often an agent that did not answer is asked whether it answers again.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long an agent that did not answer counts as unreachable before it is asked whether it
/// answers again (less than `transport::UNREACHABLE_FOR`).
const PROBE_AFTER: Duration = Duration::from_secs(3);
/// How often the agent compares the partitions it runs with the ones metadata gives it.
const SUPERVISE_INTERVAL: Duration = Duration::from_millis(250);
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
    /// The time of day commands are stamped with.
    pub clock: Arc<dyn silt_metadata::clock::Clock>,
    /// How this agent reaches the others; `None`: over HTTP, from `peer_source_ip`. Agents in
    /// one process may share a [`crate::memory_network::MemoryNetwork`] instead.
    pub peers: Option<Peers>,
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
            clock: Arc::new(silt_metadata::clock::SystemClock),
            peers: None,
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

/// A partition of a topic, by name: the key of what the agent keeps per partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PartitionKey {
    pub(crate) topic: String,
    pub(crate) partition: u32,
}

impl PartitionKey {
    pub(crate) fn new(topic: &str, partition: u32) -> PartitionKey {
        PartitionKey { topic: topic.to_string(), partition }
    }
}

impl std::fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

type CursorKey = (String, String, u32);
/// A retired local log: the topic id it belongs to, and its read half.
type Retired = (u64, Arc<PartitionReader>);
/// A retired log to check: its partition, topic id and the offset ranges it holds.
type RetiredRanges = (PartitionKey, u64, Vec<(u64, u64)>);

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

/// An agent that may be gone: what a network of agents in one process holds of each.
#[derive(Clone)]
pub(crate) struct WeakAgent(std::sync::Weak<Inner>);

impl WeakAgent {
    pub(crate) fn upgrade(&self) -> Option<Agent> {
        self.0.upgrade().map(|inner| Agent { inner })
    }
}

impl std::fmt::Debug for WeakAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.upgrade() {
            Some(a) => write!(f, "agent {}", a.id()),
            None => f.write_str("a dropped agent"),
        }
    }
}

struct Inner {
    config: AgentConfig,
    metadata: Metadata,
    metrics: Arc<Metrics>,
    partitions: RwLock<HashMap<PartitionKey, Running>>,
    /// Each partition's writer slot (see [`WriterSlot`]); this lock is only held to find one.
    writers: Mutex<HashMap<PartitionKey, WriterSlot>>,
    /// Reaches other agents, for requests about partitions they write.
    peers: Peers,
    /// Local logs of partitions this agent held but no longer writes, by topic and partition,
    /// with the topic id: they stay readable (for reads and the compactor) until archived.
    retired: RwLock<HashMap<PartitionKey, Retired>>,
    /// Partitions this agent follows (holds replicas of segments another agent writes).
    replicas: Mutex<HashMap<PartitionKey, SharedReplica>>,
    /// Whether an ensemble repair runs (one at a time).
    repairing: Arc<std::sync::atomic::AtomicBool>,
    /// Repairs that failed lately, by topic, partition, segment and the agent that was to
    /// hold the copy, with when that agent may be asked again for that segment
    /// ([`REPAIR_RETRY_AFTER`], or [`REPAIR_RETRY_AFTER_DIVERGED`] if it holds other records
    /// there): a copy it keeps refusing neither repeats every round nor holds up the repair
    /// of other segments.
    repair_failures: Mutex<HashMap<(String, u32, u64, String), Instant>>,
    /// Writers that failed to start (see [`START_RETRY_INTERVAL`]).
    start_failures: Mutex<HashMap<PartitionKey, StartFailure>>,
    /// Agents found unreachable that were asked lately whether they answer again, and when.
    probed: Mutex<HashMap<String, Instant>>,
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
        crate::log::disk::sync_all(&f, &tmp)?;
        std::fs::rename(&tmp, &path)?;
        crate::log::disk::sync_all(&std::fs::File::open(data_dir)?, data_dir)
    };
    write().map_err(|e| StoreError::io(&path, "write", e))?;
    Ok(id)
}

/// Takes back a redelivery a poll picked and did not hand out.
fn release(cursors: &Mutex<HashMap<CursorKey, GroupCursor>>, key: &CursorKey, offset: u64) {
    if let Some(cursor) = lock(cursors).get_mut(key) {
        cursor.release(offset);
    }
}

use crate::sync::lock;

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
        let peers = match &config.peers {
            Some(peers) => Arc::clone(peers),
            None => Arc::new(HttpPeers::with_source_ip(&config.agent_id, config.peer_source_ip)),
        };
        let instance = instance_id(&config.data_dir)?;
        // Before any log is opened: bytes a killed process of this agent left in the page cache
        // only must not count as held.
        if let Err(e) = crate::log::disk::sync_at_start(&config.data_dir) {
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
                probed: Mutex::new(HashMap::new()),
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
                now_ms: self.now_ms(),
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
                now_ms: self.now_ms(),
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

    /// The time of day, from the agent's clock.
    fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// This agent's id.
    pub fn id(&self) -> &str {
        &self.inner.config.agent_id
    }

    /// Whether [`Agent::shutdown`] began (or the agent's cancel token was cancelled).
    pub fn is_stopped(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    pub(crate) fn downgrade(&self) -> WeakAgent {
        WeakAgent(Arc::downgrade(&self.inner))
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
        let handles: Vec<(PartitionKey, PartitionHandle)> = crate::sync::read_lock(&self.inner.partitions)
            .iter()
            .map(|(k, r)| (k.clone(), r.handle.clone()))
            .collect();
        for (PartitionKey { topic, partition }, handle) in handles {
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
            now_ms: self.now_ms(),
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
            ErrorCode::NotWriter,
            format!(
                "partition {topic}/{partition} is written by agent '{writer}' at {}; send it there",
                addr.as_deref().unwrap_or("an unknown address")
            ),
        )
    }

    /// Sets the replication metrics from the writers' last view of their followers.
    fn export_replication_lag(&self) {
        let m = &self.inner.metrics;
        m.replication_lag_records.clear();
        m.replication_lag_ms.clear();
        let running: Vec<(PartitionKey, Vec<FollowerLag>, usize)> =
            crate::sync::read_lock(&self.inner.partitions)
                .iter()
                .map(|(k, r)| (k.clone(), r.handle.follower_lag(), r.replication_factor))
                .collect();
        let mut under = 0;
        for (PartitionKey { topic, partition }, lag, replication_factor) in running {
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

    fn partition_meta(&self, topic: &str, partition: u32) -> Option<silt_metadata::state::Partition> {
        self.with_partition(topic, partition, Clone::clone)
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
}
