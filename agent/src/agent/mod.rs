//! The agent: everything behind the client API. It owns the partition writers of this
//! process, routes produce requests to them, serves replays from the local logs and runs
//! consumer-group delivery (leases, redelivery, dead-lettering, ack checkpoints).
//!
//! One `Agent`, its `impl` split by concern: this file holds its state and routing;
//! [`lifecycle`] its start, registration, heartbeats and shutdown; [`writers`] the partition writers and
//! their supervisor, [`topics`], [`produce`], [`read`], [`follower`] the follower's side of
//! replication, [`retired`] local logs of partitions written elsewhere, [`repair`] ensemble
//! repair, [`groups`] consumer groups.

mod follower;
mod groups;
mod lifecycle;
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
/// The shortest wait of a poll for a message's lease to expire (one that expired already but
/// was not delivered again is not waited for in a loop that does not let time pass).
const LEASE_WAKE_MIN: Duration = Duration::from_millis(10);
/// How often the agent compares the partitions it runs with the ones metadata gives it.
const SUPERVISE_INTERVAL: Duration = Duration::from_millis(250);
/// How often the agent measures the disk space its logs take and the space left.
const DISK_USAGE_INTERVAL: Duration = Duration::from_secs(10);
/// How soon a writer that failed to start is tried again (after its first failure in a row).
const START_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// The longest wait between two starts of a writer that keeps failing to start.
const START_RETRY_MAX_INTERVAL: Duration = Duration::from_secs(1);
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
    /// How long after this failure the next start is tried: [`START_RETRY_INTERVAL`],
    /// doubling with each failure in the streak up to [`START_RETRY_MAX_INTERVAL`] (each start
    /// opens the log and fences every member of the open segment).
    fn retry_after(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(16);
        START_RETRY_INTERVAL.saturating_mul(1 << doublings).min(START_RETRY_MAX_INTERVAL)
    }

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
/// A cursor's key with its topic id and writer epoch, the floor and acked ranges to checkpoint.
type Checkpoint = (CursorKey, (u64, u64), u64, Vec<(u64, u64)>);

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
    /// When this process's recoveries began waiting for silent members of open segments.
    silent_waits: Arc<crate::replication::recovery::SilentWaits>,
    /// When the agent started: the origin of the monotonic clock delivery leases are measured
    /// by ([`Agent::lease_clock_ms`]).
    started: Instant,
    /// Writers that failed to start (see [`START_RETRY_INTERVAL`]).
    start_failures: Mutex<HashMap<PartitionKey, StartFailure>>,
    /// Agents found unreachable that were asked lately whether they answer again, and when.
    probed: Mutex<HashMap<String, Instant>>,
    /// When this agent last moved a partition away towards balance (`MoveWriter`).
    rebalance_proposed: Mutex<Option<Instant>>,
    /// Partitions this agent stopped writing to move them away towards balance, with the
    /// epoch it wrote them under and until when no writer starts for them at that epoch
    /// (while the move is proposed, and until this agent's copy shows its outcome).
    moving: Mutex<HashMap<PartitionKey, (u64, Instant)>>,
    /// Identifies this agent's data directory to metadata (see `Command::RegisterAgent`).
    instance: String,
    /// This process's registration: `RegisterAgent` gave it this incarnation.
    incarnation: std::sync::atomic::AtomicU64,
    /// Until when this agent's lease certainly holds: a lease from the start of its last
    /// registration or heartbeat that metadata took, less a margin (see [`Agent::lease_held`]);
    /// `None` from a registration until this agent's copy of metadata includes it.
    lease_until: Mutex<Option<Instant>>,
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

/// Takes back a redelivery a poll picked and did not hand out.
fn release(cursors: &Mutex<HashMap<CursorKey, GroupCursor>>, key: &CursorKey, offset: u64) {
    if let Some(cursor) = lock(cursors).get_mut(key) {
        cursor.release(offset);
    }
}

use crate::sync::lock;

/// The part of a lease an agent counts on after metadata took its heartbeat: metadata's lease
/// runs from when it applied the heartbeat, after it was sent, and the margin leaves room for
/// the two clocks' rates to differ.
const LEASE_COUNTED: f64 = 0.875;

impl Agent {
    /// Metadata took a heartbeat of this agent sent at `sent` (or a registration whose effects
    /// this agent's copy of metadata includes). Nothing is renewed while the lease is unset:
    /// after a registration until the copy includes it (see `Agent::register`).
    fn lease_renewed(&self, sent: Instant) {
        let until = sent + self.inner.config.lease.mul_f64(LEASE_COUNTED);
        let mut lease = lock(&self.inner.lease_until);
        if let Some(l) = lease.as_mut() {
            *l = (*l).max(until);
        }
    }

    /// Whether this agent's lease certainly holds. Once it may have lapsed, metadata may have
    /// given this agent's partitions to other agents, and this agent's copy of metadata cannot
    /// tell (it cannot reach metadata, or it is paused): it neither acknowledges nor answers
    /// for a partition as its writer until a heartbeat gets through again, so that a client it
    /// refuses goes to another agent rather than read an end of the partition that is no
    /// longer the end.
    pub(crate) fn lease_held(&self) -> bool {
        lock(&self.inner.lease_until).is_some_and(|until| Instant::now() < until)
    }

    /// [`lease_held`](Self::lease_held) as the answer to a request for `topic/partition` that
    /// this agent would serve as its writer: checked before it starts, and again when it has
    /// the high watermark it answers with.
    ///
    /// Its copy of metadata must be current too, as of less than [`LEASE_COUNTED`] of a lease
    /// ago (`Metadata::current_as_of`): an agent whose reads of metadata fail while its
    /// heartbeats get through keeps its lease, but cannot tell that its topic was deleted
    /// (and maybe created again): a deletion returns only once that long has passed
    /// (`Agent::delete_topic`), so that no agent answers for the deleted topic after it.
    pub(crate) fn lease_check(&self, topic: &str, partition: u32) -> Result<(), ApiError> {
        if !self.lease_held() {
            return Err(ApiError::unavailable(format!(
                "agent '{}' has not renewed its lease with metadata lately: another agent may write \
                 {topic}/{partition} by now; retry through another agent",
                self.id()
            )));
        }
        self.copy_check(self.inner.metadata.current_as_of(), topic, partition)
    }

    /// Whether a view of this agent's copy of metadata taken after `as_of` (the copy's
    /// [`Metadata::current_as_of`] read before the view) may be answered from now.
    pub(crate) fn copy_check(&self, as_of: Instant, topic: &str, partition: u32) -> Result<(), ApiError> {
        if self.copy_current_as_of(as_of) {
            return Ok(());
        }
        Err(ApiError::unavailable(format!(
            "agent '{}' has not refreshed its copy of metadata lately: {topic}/{partition} may \
             have been deleted or moved since; retry through another agent",
            self.id()
        )))
    }

    /// Whether this agent's copy of metadata is current as of less than [`LEASE_COUNTED`] of
    /// a lease ago.
    pub(crate) fn copy_current(&self) -> bool {
        self.copy_current_as_of(self.inner.metadata.current_as_of())
    }

    fn copy_current_as_of(&self, as_of: Instant) -> bool {
        Instant::now() < as_of + self.inner.config.lease.mul_f64(LEASE_COUNTED)
    }

    /// Whether an end of the partition read from `handle` may be answered now: its writer
    /// has not lost its write quorum since, and this agent's lease holds.
    pub(crate) fn end_check(
        &self,
        handle: &PartitionHandle,
        topic: &str,
        partition: u32,
    ) -> Result<(), ApiError> {
        // The deliberate defect leaves what a failed replication published visible.
        let serve_anyway = crate::sim_bugs::on(crate::sim_bugs::Bug::ServePastWatermark);
        if handle.ended() && !serve_anyway {
            return Err(ApiError::unavailable(format!(
                "the writer of {topic}/{partition} on this agent ended (it lost its write quorum, was fenced or stopped); retry"
            )));
        }
        self.lease_check(topic, partition)
    }

    /// The time of day, from the agent's clock.
    fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Milliseconds since the agent started, on the monotonic clock: what the visibility
    /// timeouts of messages in flight are measured by, so that a step of the time of day
    /// neither delivers them again early nor holds them back for the length of the step.
    fn lease_clock_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
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

    fn topic_dir(&self, topic: &str, id: u64) -> PathBuf {
        self.inner.config.data_dir.join("log").join(format!("{topic}~{id}"))
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
