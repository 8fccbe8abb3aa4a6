//! The writer of one partition: a task that owns the [`PartitionLog`], group-commits
//! appends (many batches, one fsync), rolls segments on size and age and records every
//! segment change in metadata under the partition's epoch.
//!
//! An append is answered only after the fsync that covers it. A failed write or fsync is
//! fatal for the partition on this agent: it stops accepting writes instead of retrying
//! (after a failed fsync the kernel may already have dropped the pages).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use silt_metadata::state::Segment;
use silt_metadata::{Command, Metadata, TopicConfig};
use silt_record::RecordBatch;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, info_span, warn, Instrument};

use crate::error::StoreError;
use crate::limits::{GROUP_APPENDS_MAX, GROUP_BYTES_MAX, QUEUED_BYTES_MAX, REPLICA_READ_BYTES_MAX};
use crate::log::partition_log::{PartitionLog, PartitionReader};
use crate::log::replica::{
    join_batches, read_fence, split_batches, trim_to_metadata, write_fence, HeldSegment,
};
use crate::metrics::Metrics;
use crate::replication::ensemble::{Ensemble, FollowerLag};
use crate::transport::{Peers, ReplicaTarget};

/// How long a recovery waits, once it has the answers it needs, for the open segment's other
/// members: each that answers in time is a holder of the sealed segment (it gets the tail
/// copied); one still silent is not, and repair copies the segment to another agent.
const RECOVERY_LATE_ANSWERS_WAIT: Duration = Duration::from_millis(500);

/// How long a failed writer refuses writes before it ends and the agent starts a new one.
const FAILED_WRITER_RESTART_AFTER: Duration = Duration::from_secs(5);
/// How long a seal waits for followers that are behind before it leaves them out of the
/// segment's replicas.
const SETTLE_AT_SEAL: Duration = Duration::from_secs(2);

/// What a writer needs to know about its partition.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Agent id recorded as writer and ensemble member.
    pub agent_id: String,
    /// Topic name.
    pub topic: String,
    /// Topic id: segment commands for a deleted and re-created topic of the same name are
    /// refused.
    pub topic_id: u64,
    /// Partition number.
    pub partition: u32,
    /// The topic's configs as metadata holds them (`segment.bytes` and `segment.ms` say when
    /// to roll, `local.retention.*` how long archived segments stay, `replication.factor` and
    /// `min.insync.replicas` the ensemble's size and write quorum); altered ones are picked up
    /// while the writer runs.
    pub topic_config: TopicConfig,
    /// The partition's local log directory (its `fence` file is the writer's epoch).
    pub dir: PathBuf,
    /// This agent's data-directory instance, recorded with each ensemble.
    pub instance: String,
    /// The time of day segments are stamped with.
    pub clock: Arc<dyn silt_metadata::clock::Clock>,
}

impl WriterConfig {
    /// `replication.factor`: agents in each segment's ensemble.
    fn replication_factor(&self) -> usize {
        self.topic_config.replication_factor as usize
    }

    /// `min.insync.replicas`: replicas that must have fsynced a batch before it is acknowledged.
    fn write_quorum(&self) -> usize {
        self.topic_config.write_quorum()
    }
}

struct AppendRequest {
    batch: RecordBatch,
    reply: oneshot::Sender<Result<(u64, u64), StoreError>>,
    /// Held until the append is answered: bounds the bytes queued for this writer.
    permit: OwnedSemaphorePermit,
}

/// A cheap, cloneable handle to append to and read from a partition.
#[derive(Debug, Clone)]
pub struct PartitionHandle {
    tx: mpsc::Sender<AppendRequest>,
    control: mpsc::Sender<oneshot::Sender<()>>,
    queued_bytes: Arc<Semaphore>,
    reader: Arc<PartitionReader>,
    epoch: u64,
    lag: Arc<std::sync::Mutex<Vec<FollowerLag>>>,
}

impl std::fmt::Debug for AppendRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendRequest").field("bytes", &self.batch.len_bytes()).finish()
    }
}

impl PartitionHandle {
    /// Appends a validated batch. Returns its first and last offset once it is durable.
    pub async fn append(&self, batch: RecordBatch) -> Result<(u64, u64), StoreError> {
        let bytes = batch.len_bytes().clamp(1, QUEUED_BYTES_MAX) as u32;
        let permit = Arc::clone(&self.queued_bytes)
            .acquire_many_owned(bytes)
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        let (reply, rx) = oneshot::channel();
        self.tx.send(AppendRequest { batch, reply, permit }).await.map_err(|_| StoreError::ShuttingDown)?;
        rx.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// Seals the active segment now if it holds records (and opens the next one), so that
    /// everything written so far can be archived. Returns once that is recorded in metadata (or
    /// has failed: the writer logs why and retries on its next tick).
    pub async fn roll(&self) -> Result<(), StoreError> {
        let (done, rx) = oneshot::channel();
        self.control.send(done).await.map_err(|_| StoreError::ShuttingDown)?;
        rx.await.map_err(|_| StoreError::ShuttingDown)
    }

    /// The read half of the log.
    pub fn reader(&self) -> &Arc<PartitionReader> {
        &self.reader
    }

    /// The epoch this agent writes under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How far each follower of the open segment is behind, as of the writer's last tick.
    pub fn follower_lag(&self) -> Vec<FollowerLag> {
        crate::sync::lock(&self.lag).clone()
    }
}

struct PartitionWriter {
    log: Option<PartitionLog>,
    config: WriterConfig,
    metadata: Metadata,
    metrics: Arc<Metrics>,
    epoch: u64,
    failed: Option<String>,
    /// A segment sealed on disk whose seal (and successor's open) metadata has not recorded yet.
    roll_pending: Option<SealedSummary>,
    first_append_at: Option<Instant>,
    peers: Peers,
    /// The other replicas of the open segment.
    ensemble: Option<Ensemble>,
    /// The write quorum was lost: the writer ends at once under a new epoch.
    quorum_lost: bool,
    lag: Arc<std::sync::Mutex<Vec<FollowerLag>>>,
}

#[derive(Debug, Clone)]
struct SealedSummary {
    base_offset: u64,
    record_count: u64,
    size_bytes: u64,
    min_timestamp_ms: Option<i64>,
    max_timestamp_ms: Option<i64>,
    /// The members holding the whole segment, when a follower left the ensemble midway.
    replicas: Option<Vec<String>>,
}

impl SealedSummary {
    fn of(s: &crate::log::segment::Segment) -> Self {
        SealedSummary {
            base_offset: s.base_offset(),
            record_count: s.next_offset() - s.base_offset(),
            size_bytes: s.size_bytes(),
            min_timestamp_ms: s.min_timestamp_ms(),
            max_timestamp_ms: s.max_timestamp_ms(),
            replicas: None,
        }
    }

    /// With the members of `ensemble` (if any) that hold the whole segment, when some do not
    /// (a follower left midway, or is still behind: it is given a moment to catch up).
    async fn held_by(mut self, me: &str, ensemble: Option<&Ensemble>) -> Self {
        if let Some(e) = ensemble {
            let end = self.base_offset + self.record_count;
            let followers = e.settle(end, SETTLE_AT_SEAL).await;
            if followers.len() + 1 < e.recorded() {
                self.replicas = Some(std::iter::once(me.to_string()).chain(followers).collect());
            }
        }
        self
    }
}

/// Reconciles the recovered log with the metadata's segment chain under `epoch` (metadata
/// named this agent writer at that epoch) and starts the writer task.
pub async fn start(
    log: PartitionLog,
    config: WriterConfig,
    epoch: u64,
    metadata: Metadata,
    metrics: Arc<Metrics>,
    peers: Peers,
    cancel: CancellationToken,
) -> Result<(PartitionHandle, JoinHandle<()>), StoreError> {
    let reader = log.reader();
    let lag = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut writer = PartitionWriter {
        log: Some(log),
        config,
        metadata,
        metrics,
        epoch,
        failed: None,
        roll_pending: None,
        first_append_at: None,
        peers,
        ensemble: None,
        quorum_lost: false,
        lag: Arc::clone(&lag),
    };
    writer.reconcile().await?;
    let (tx, rx) = mpsc::channel(GROUP_APPENDS_MAX);
    let (control, control_rx) = mpsc::channel(4);
    let handle = PartitionHandle {
        tx,
        control,
        queued_bytes: Arc::new(Semaphore::new(QUEUED_BYTES_MAX)),
        reader,
        epoch,
        lag,
    };
    let span = info_span!("partition_writer", topic = %writer.config.topic, partition = writer.config.partition, epoch);
    let task = tokio::spawn(writer.run(rx, control_rx, cancel).instrument(span));
    Ok((handle, task))
}

impl PartitionWriter {
    fn log(&self) -> &PartitionLog {
        // The log is only taken out while a blocking write runs, and put back before any
        // other method can run.
        self.log.as_ref().expect("partition log is present outside blocking sections")
    }

    /// Every start is a writer change (a new epoch): the fence of the local replica is raised
    /// to it, the local log is cut back to what metadata recorded, the segment that was open
    /// is recovered and sealed, and a new segment is opened with a new ensemble.
    async fn reconcile(&mut self) -> Result<(), StoreError> {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition);
        let dir = self.config.dir.clone();
        let epoch = self.epoch;
        let fence = tokio::task::spawn_blocking(move || -> Result<u64, StoreError> {
            let fence = read_fence(&dir)?;
            if fence < epoch {
                write_fence(&dir, epoch)?;
            }
            Ok(fence)
        })
        .await
        .map_err(|e| StoreError::Failed(format!("raising the fence panicked: {e}")))??;
        if fence > epoch {
            return Err(StoreError::Fenced { topic, partition, epoch, fence });
        }
        let meta = self
            .metadata
            .read(|s| s.topic(&topic).map(|t| t.partitions.get(partition as usize).cloned()))
            .await??
            .ok_or_else(|| {
                StoreError::Metadata(silt_metadata::MetadataError::UnknownPartition {
                    topic: topic.clone(),
                    partition,
                })
            })?;
        let chain = meta.clone();
        self.on_log("trim", move |log| trim_to_metadata(log, &chain, epoch).map(|_| ())).await?;
        if let Some(open) = meta.open_segment().cloned() {
            self.recover(&open).await?;
        }
        let next_base = self
            .metadata
            .read(|s| s.topics.get(&topic).map(|t| t.partitions[partition as usize].next_segment_base()))
            .await?
            .ok_or_else(|| StoreError::Metadata(silt_metadata::MetadataError::UnknownTopic(topic.clone())))?;
        // Segments of the partition this agent holds no replica of are a gap in its log: their
        // offsets are read from other replicas or the archive.
        self.on_log("start", move |log| log.start_segment_at(next_base)).await?;
        self.open_segment().await
    }

    /// Seals the segment a former writer left open (BookKeeper's ledger recovery): fences its
    /// replicas at this epoch, reads what at least R - W + 1 of them hold (a member whose
    /// data directory was replaced holds nothing and does not count), copies the longest
    /// tail to every replica that answered with less, and seals the segment there by a
    /// compare-and-set on the epoch. Every acknowledged batch is on W replicas, so on one of
    /// those that answered: the seal never drops one. The seal names as holders exactly the
    /// members that hold the sealed range (`recovery::sealed_holders`); one that did not
    /// answer is no longer a holder, and repair copies the segment to others.
    async fn recover(&mut self, open: &Segment) -> Result<(), StoreError> {
        let me = self.config.agent_id.clone();
        let (topic, partition, base) = (self.config.topic.clone(), self.config.partition, open.base_offset);
        let members = &open.ensemble;
        let w = self.config.write_quorum().clamp(1, members.len().max(1));
        let needed = crate::replication::recovery::answers_needed(members.len(), w);
        let target = ReplicaTarget {
            topic_id: self.config.topic_id,
            epoch: self.epoch,
            segment: base,
            segment_epoch: open.epoch,
        };
        let addrs: Vec<Option<String>> = self
            .metadata
            .read_local(|s| members.iter().map(|m| s.agents.get(m).map(|a| a.addr.clone())).collect());
        let fences: futures::stream::FuturesUnordered<_> = members
            .iter()
            .zip(&addrs)
            .filter(|(m, _)| **m != me)
            .map(|(m, addr)| {
                let (peers, target, topic) = (self.peers.clone(), target.clone(), topic.clone());
                async move {
                    let r = match addr {
                        Some(addr) => peers.replica_fence((m, addr), &topic, partition, &target).await,
                        None => {
                            Err(crate::error::ApiError::unavailable(format!("agent '{m}' is not registered")))
                        }
                    };
                    (m.clone(), r.map_err(|e| e.message))
                }
            })
            .collect();
        let mut held: Vec<(String, HeldSegment)> = Vec::new();
        let mut missing: Vec<(String, String)> = Vec::new();
        let mut lost: Vec<String> = Vec::new();
        let classify = |m: String,
                        answer: Result<HeldSegment, String>,
                        held: &mut Vec<(String, HeldSegment)>,
                        missing: &mut Vec<(String, String)>,
                        lost: &mut Vec<String>| {
            let recorded = members
                .iter()
                .position(|x| *x == m)
                .and_then(|i| open.instances.get(i))
                .filter(|i| !i.is_empty());
            match answer {
                Ok(h) if recorded.is_some_and(|i| *i != h.instance) => lost.push(m),
                Ok(h) => held.push((m, h)),
                Err(e) => missing.push((m, e)),
            }
        };
        if members.contains(&me) {
            let local = HeldSegment::of(self.log(), base, open.epoch, &self.config.instance)
                .map_err(|e| e.to_string());
            classify(me.clone(), local, &mut held, &mut missing, &mut lost);
        }
        // Enough answers is enough: a member that is slow or paused is not waited for. Every
        // member that answered is fenced (the former writer too: an agent stops its writer of
        // an older epoch before it answers), so the former writer, needing W - 1 followers,
        // can no longer gather a quorum.
        let mut fences = fences;
        while held.len() < needed {
            let Some((m, answer)) = fences.next().await else { break };
            classify(m, answer, &mut held, &mut missing, &mut lost);
        }
        // The seal names exactly the members that hold the sealed range: the others get a
        // moment to answer too, so that a member that is merely slower stays a holder (one
        // that answers is fenced, and gets the tail copied like the rest).
        if held.len() >= needed {
            let until = tokio::time::Instant::now() + RECOVERY_LATE_ANSWERS_WAIT;
            while let Ok(Some((m, answer))) = tokio::time::timeout_at(until, fences.next()).await {
                classify(m, answer, &mut held, &mut missing, &mut lost);
            }
        }
        drop(fences);
        if !lost.is_empty() {
            // A member whose data directory was replaced holds nothing of the segment.
            let level = if lost.len() >= w {
                "every replica of some acknowledged batches may be lost"
            } else {
                "the others hold what it held"
            };
            warn!(lost = %lost.join(", "), "replicas of the open segment were on disks that are gone; {level}");
        }
        // Waiting helps only while some member may come back with what it holds; when every
        // member answered or is known to have lost its disk, the longest answer is all there is.
        let answers: Vec<(String, crate::replication::recovery::Answer)> = held
            .iter()
            .map(|(m, h)| (m.clone(), crate::replication::recovery::Answer::Holds { end: h.end_offset }))
            .chain(lost.iter().map(|m| (m.clone(), crate::replication::recovery::Answer::Lost)))
            .chain(missing.iter().map(|(m, _)| (m.clone(), crate::replication::recovery::Answer::Missing)))
            .collect();
        let (source, end, mut holding, copy_to) = match crate::replication::recovery::plan(
            members.len(),
            w,
            &answers,
        ) {
            crate::replication::recovery::Plan::Wait { needed, counted } => {
                let why: Vec<String> = missing.iter().map(|(m, e)| format!("{m}: {e}")).collect();
                return Err(StoreError::NotEnoughReplicas(format!(
                    "partition {topic}/{partition} is waiting for its open segment at offset {base} held by agent(s) {}: \
                     recovering it needs {needed} of them to answer, {counted} did: {}; it becomes writable when enough of them are back",
                    members.join(", "),
                    why.join("; ")
                )));
            }
            crate::replication::recovery::Plan::SealEmpty => {
                error!(
                    base_offset = base,
                    "no replica of the open segment is left (their disks were replaced); sealing it empty: what it held is lost"
                );
                let empty = SealedSummary {
                    base_offset: base,
                    record_count: 0,
                    size_bytes: 0,
                    min_timestamp_ms: None,
                    max_timestamp_ms: None,
                    replicas: None,
                };
                self.metadata.write(self.seal_command(&empty)).await?;
                return Ok(());
            }
            crate::replication::recovery::Plan::Seal { source, end, holding, copy_to } => {
                (source, end, holding, copy_to)
            }
        };
        let Some(best) = held.iter().find(|(m, _)| *m == source).map(|(_, h)| h.clone()) else {
            return Err(StoreError::Failed(format!("recovery chose '{source}', which did not answer")));
        };
        for (m, from) in copy_to {
            match self.copy_tail(&target, &source, &m, from, end).await {
                Ok(()) => holding.push(m),
                Err(e) => warn!(replica = %m, error = %e, "copying the recovered tail to a replica failed"),
            }
        }
        let holders = holding.len();
        if !crate::replication::recovery::enough_holders(w, held.len(), holders, base, end) {
            return Err(StoreError::NotEnoughReplicas(format!(
                "partition {topic}/{partition}: the recovered tail of segment {base} is on {holders} replica(s), \
                 min.insync.replicas is {w}; retrying"
            )));
        }
        let summary = SealedSummary {
            base_offset: base,
            record_count: end - base,
            size_bytes: best.size_bytes,
            min_timestamp_ms: best.min_timestamp_ms,
            max_timestamp_ms: best.max_timestamp_ms,
            // Members that did not answer, or that a copy failed to reach, are not holders.
            replicas: crate::replication::recovery::sealed_holders(members, &holding),
        };
        self.metadata.write(self.seal_command(&summary)).await?;
        info!(base_offset = base, end, replicas = holders, from = %source, "recovered and sealed the open segment");
        Ok(())
    }

    /// Copies the batches `[from, end)` of a segment from replica `source` to replica `dest`
    /// (either may be this agent's own log).
    async fn copy_tail(
        &mut self,
        target: &ReplicaTarget,
        source: &str,
        dest: &str,
        from: u64,
        end: u64,
    ) -> Result<(), StoreError> {
        let me = self.config.agent_id.clone();
        let (topic, partition) = (self.config.topic.clone(), self.config.partition);
        let metadata = self.metadata.clone();
        let addr_of = |agent: &str| {
            metadata
                .read_local(|s| s.agents.get(agent).map(|a| a.addr.clone()))
                .ok_or_else(|| StoreError::NotEnoughReplicas(format!("agent '{agent}' is not registered")))
        };
        let mut next = from;
        while next < end {
            let body = if source == me {
                let reader = Arc::clone(&self.log().reader());
                tokio::task::spawn_blocking(move || reader.read(next, REPLICA_READ_BYTES_MAX))
                    .await
                    .map_err(|e| StoreError::Failed(format!("read task panicked: {e}")))??
                    .batches
            } else {
                let addr = addr_of(source)?;
                let body = self
                    .peers
                    .replica_batches((source, &addr), &topic, partition, target, next)
                    .await
                    .map_err(|e| StoreError::NotEnoughReplicas(e.message))?;
                split_batches(body)?
            };
            let batches: Vec<RecordBatch> = body
                .into_iter()
                .skip_while(|b| b.last_offset() < next)
                .take_while(|b| {
                    b.base_offset() < end
                        && i64::from(b.partition_leader_epoch()) == target.segment_epoch as i64
                })
                .collect();
            let Some(last) = batches.last().map(|b| b.next_offset()) else {
                return Err(StoreError::NotEnoughReplicas(format!(
                    "replica {source} holds nothing of segment {} at offset {next}",
                    target.segment
                )));
            };
            if dest == me {
                let base = target.segment;
                self.on_log("copy", move |log| {
                    log.start_segment_at(base)?;
                    log.append_replicated(&batches)
                })
                .await?;
            } else {
                let addr = addr_of(dest)?;
                self.peers
                    .replica_append((dest, &addr), &topic, partition, target, None, join_batches(&batches))
                    .await
                    .map_err(|e| StoreError::NotEnoughReplicas(e.message))?;
            }
            next = last;
        }
        Ok(())
    }

    /// Opens a segment at the log's end with a new ensemble (this agent and R - 1 live
    /// agents, the least busy first) and starts streaming to it.
    async fn open_segment(&mut self) -> Result<(), StoreError> {
        self.ensemble = None;
        let base = self.log().next_offset();
        let (ensemble, instances) = self.choose_ensemble()?;
        match self.metadata.write(self.open_command(base, ensemble, instances)).await {
            Ok(_) => {}
            // A retry after a lost reply finds the segment open already.
            Err(silt_metadata::MetadataError::InvalidArgument(_)) if self.is_open_in_metadata(base).await => {
            }
            Err(e) => return Err(e.into()),
        }
        self.start_ensemble(base);
        Ok(())
    }

    fn open_command(&self, base_offset: u64, ensemble: Vec<String>, instances: Vec<String>) -> Command {
        Command::OpenSegment {
            topic: self.config.topic.clone(),
            topic_id: Some(self.config.topic_id),
            partition: self.config.partition,
            epoch: self.epoch,
            base_offset,
            ensemble,
            instances,
            now_ms: self.config.clock.now_ms(),
        }
    }

    /// Starts streaming to the followers metadata records for the open segment at `base`.
    fn start_ensemble(&mut self, base: u64) {
        let me = self.config.agent_id.clone();
        let (topic, partition) = (self.config.topic.clone(), self.config.partition as usize);
        let r = self.config.replication_factor().max(1);
        let (followers, recorded): (Vec<(String, String)>, Option<usize>) = self.metadata.read_local(|s| {
            let Some(seg) = s
                .topics
                .get(&topic)
                .and_then(|t| t.partitions.get(partition))
                .and_then(|p| p.open_segment())
                .filter(|seg| seg.base_offset == base)
            else {
                return (Vec::new(), None);
            };
            let followers = seg
                .ensemble
                .iter()
                .filter(|a| **a != me)
                .filter_map(|a| s.agents.get(a).map(|i| (a.clone(), i.addr.clone())))
                .collect();
            (followers, Some(seg.ensemble.len()))
        });
        if followers.len() + 1 < self.config.write_quorum() {
            // A stale copy, another writer that sealed the segment meanwhile, or a member
            // metadata forgot: every write fails for want of acknowledgements until the next
            // writer recovers the segment (an idle writer opens another one first).
            warn!(topic = %topic, partition, segment = base, followers = followers.len(),
                found = recorded.is_some(), write_quorum = self.config.write_quorum(),
                "this agent's copy of metadata names fewer followers of the segment it opened than the write quorum needs");
        }
        let target = ReplicaTarget {
            topic_id: self.config.topic_id,
            epoch: self.epoch,
            segment: base,
            segment_epoch: self.epoch,
        };
        self.ensemble = Some(Ensemble::start(
            &self.peers,
            &self.config.topic,
            self.config.partition,
            target,
            followers,
            recorded.unwrap_or(r),
            self.config.write_quorum(),
        ));
    }

    /// Whether a new segment would get a better ensemble than the open one: a member's data
    /// directory changed since it opened, or it is short of replication.factor and more
    /// agents are live.
    fn ensemble_can_improve(&self, size: usize) -> bool {
        let (topic, partition) = (self.config.topic.as_str(), self.config.partition as usize);
        let me = self.config.agent_id.as_str();
        self.metadata.read_local(|s| {
            let Some(open) =
                s.topics.get(topic).and_then(|t| t.partitions.get(partition)).and_then(|p| p.open_segment())
            else {
                return false;
            };
            let replaced = open.ensemble.iter().zip(&open.instances).any(|(a, recorded)| {
                s.agents.get(a).is_some_and(|i| !recorded.is_empty() && i.instance != *recorded)
            });
            // Live, and not known to be out of this agent's reach.
            let usable = |a: &str| a == me || !self.peers.is_unreachable(a);
            let live_members = open
                .ensemble
                .iter()
                .filter(|a| s.agents.get(*a).is_some_and(|i| i.is_live(s.clock_ms)) && usable(a))
                .count();
            let live = s.live_agents().filter(|a| usable(&a.id)).count();
            // A member whose lease lapsed or that this agent cannot reach, while another live
            // agent could take its place.
            let lapsed = live_members < open.ensemble.len() && live > live_members;
            replaced || lapsed || (size < self.config.replication_factor() && live > size)
        })
    }

    /// This agent first, then R - 1 live agents that are members of the fewest open
    /// segments, leaving out those that did not answer this agent lately
    /// ([`Peer::is_unreachable`](crate::transport::Peer::is_unreachable)). Fewer than W is an error: nothing could be acknowledged.
    fn choose_ensemble(&self) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let me = self.config.agent_id.as_str();
        let (r, w) = (self.config.replication_factor().max(1), self.config.write_quorum().max(1));
        let (chosen, instances, live, unreachable) = self.metadata.read_local(|s| {
            let (reachable, unreachable): (Vec<String>, Vec<String>) = s
                .live_agents()
                .filter(|a| a.id != me)
                .map(|a| a.id.clone())
                .partition(|a| !self.peers.is_unreachable(a));
            let live = reachable.len() + 1;
            let open = s
                .topics
                .values()
                .flat_map(|t| t.partitions.iter())
                .filter_map(|p| p.open_segment())
                .map(|seg| seg.ensemble.as_slice());
            let chosen = crate::replication::placement::choose_ensemble(me, &reachable, open, r);
            let instances = chosen
                .iter()
                .map(|a| s.agents.get(a).map(|i| i.instance.clone()).unwrap_or_default())
                .collect();
            (chosen, instances, live + unreachable.len(), unreachable)
        });
        if chosen.len() < w {
            let cut_off = if unreachable.is_empty() {
                String::new()
            } else {
                format!(", and {} did not answer this agent lately", unreachable.join(", "))
            };
            return Err(StoreError::NotEnoughReplicas(format!(
                "replication.factor {r} with min.insync.replicas {w} needs at least {w} live agents to open a segment; {live} are live{cut_off}"
            )));
        }
        if chosen.len() < r {
            warn!(
                replicas = chosen.len(),
                replication_factor = r,
                "opening an under-replicated segment: too few live agents"
            );
        }
        Ok((chosen, instances))
    }

    fn seal_command(&self, s: &SealedSummary) -> Command {
        Command::SealSegment {
            topic: self.config.topic.clone(),
            topic_id: Some(self.config.topic_id),
            partition: self.config.partition,
            epoch: self.epoch,
            base_offset: s.base_offset,
            record_count: s.record_count,
            size_bytes: s.size_bytes,
            min_timestamp_ms: s.min_timestamp_ms,
            max_timestamp_ms: s.max_timestamp_ms,
            replicas: s.replicas.clone(),
            now_ms: self.config.clock.now_ms(),
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<AppendRequest>,
        mut control: mpsc::Receiver<oneshot::Sender<()>>,
        cancel: CancellationToken,
    ) {
        let tick_every = |segment_ms: u64| Duration::from_millis((segment_ms / 4).clamp(25, 1000));
        let mut tick = tokio::time::interval(tick_every(self.config.topic_config.segment_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => break,
                },
                _ = tick.tick() => {
                    self.refresh_config();
                    self.roll_if_old().await;
                    if self.quorum_lost {
                        self.abandon().await;
                        break;
                    }
                    if tick.period() != tick_every(self.config.topic_config.segment_ms) {
                        tick = tokio::time::interval(tick_every(self.config.topic_config.segment_ms));
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    }
                    continue;
                }
                Some(done) = control.recv() => {
                    if self.failed.is_none() && self.log().active().record_count() > 0 {
                        self.roll().await;
                    }
                    let _ = done.send(());
                    continue;
                }
            };
            let mut group = vec![first];
            let mut bytes = group[0].batch.len_bytes();
            while bytes < GROUP_BYTES_MAX && group.len() < GROUP_APPENDS_MAX {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += r.batch.len_bytes();
                        group.push(r);
                    }
                    Err(_) => break,
                }
            }
            self.process(group).await;
            if self.quorum_lost {
                self.abandon().await;
                break;
            }
            if let Some(reason) = self.failed.clone() {
                // Refuse writes for a while, then end: the agent's supervisor starts a new
                // writer, which recovers the log from disk (never retrying on the same state).
                error!(%reason, "the partition writer failed; it stops and is restarted from disk");
                // A log this agent distrusts cannot be restarted here: the partition is handed
                // to another agent at once.
                let wait =
                    if self.log().is_distrusted() { Duration::ZERO } else { FAILED_WRITER_RESTART_AFTER };
                let until = tokio::time::Instant::now() + wait;
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep_until(until) => break,
                        r = rx.recv() => match r {
                            Some(r) => { let _ = r.reply.send(Err(StoreError::Failed(reason.clone()))); }
                            None => break,
                        },
                    }
                }
                break;
            }
        }
        // Drain: everything already queued is written (or refused) before the task ends.
        rx.close();
        let mut rest = Vec::new();
        while let Ok(r) = rx.try_recv() {
            rest.push(r);
        }
        if !rest.is_empty() {
            self.process(rest).await;
        }
        self.close().await;
        info!("partition writer stopped");
    }

    async fn process(&mut self, group: Vec<AppendRequest>) {
        let mut pending = group.into_iter().peekable();
        while pending.peek().is_some() {
            if let Some(reason) = &self.failed {
                for r in pending {
                    let _ = r.reply.send(Err(StoreError::Failed(reason.clone())));
                }
                return;
            }
            if let Err(e) = self.finish_pending_roll().await {
                for r in pending {
                    let _ = r.reply.send(Err(StoreError::Failed(e.to_string())));
                }
                return;
            }
            let active_bytes = self.log().active().size_bytes();
            let mut size = active_bytes;
            let mut chunk = Vec::new();
            while let Some(r) = pending.peek() {
                let len = r.batch.len_bytes() as u64;
                if size > 0 && size + len > self.config.topic_config.segment_bytes {
                    break;
                }
                size += len;
                chunk.extend(pending.next());
            }
            if chunk.is_empty() {
                self.roll().await;
                continue;
            }
            // Move the batches out so their bytes are not shared: stamping offsets then needs no copy.
            let (batches, replies): (Vec<RecordBatch>, Vec<_>) =
                chunk.into_iter().map(|r| (r.batch, (r.reply, r.permit))).unzip();
            let epoch = i32::try_from(self.epoch).unwrap_or(i32::MAX);
            let mut next = self.log().next_offset();
            let stamped: Vec<RecordBatch> = batches
                .into_iter()
                .map(|b| {
                    let b = b.with_offsets(next, epoch);
                    next = b.next_offset();
                    b
                })
                .collect();
            let ranges: Vec<(u64, u64)> =
                stamped.iter().map(|b| (b.base_offset(), b.last_offset())).collect();
            let result = self.write_replicated(stamped, next).await;
            match result {
                Ok(()) => {
                    self.first_append_at.get_or_insert_with(Instant::now);
                    for ((reply, _permit), range) in replies.into_iter().zip(ranges) {
                        let _ = reply.send(Ok(range));
                    }
                    if self.ensemble.as_ref().is_some_and(|e| e.degraded()) {
                        // A follower left: the next batches go to a segment with a full
                        // ensemble rather than wait for the next tick.
                        info!("a follower left the open segment's ensemble; rolling to a segment with a new ensemble");
                        self.roll().await;
                    }
                }
                Err(e @ StoreError::NotEnoughReplicas(_)) => {
                    error!(error = %e, "lost the write quorum; this writer ends and the partition is recovered under a new epoch");
                    self.failed.get_or_insert_with(|| e.to_string());
                    self.quorum_lost = true;
                    for (reply, _permit) in replies {
                        let _ = reply.send(Err(StoreError::NotEnoughReplicas(e.to_string())));
                    }
                }
                Err(e) => {
                    error!(error = %e, "write failed; the partition stops accepting writes on this agent");
                    self.failed.get_or_insert_with(|| e.to_string());
                    for (reply, _permit) in replies {
                        let _ = reply.send(Err(StoreError::Failed(e.to_string())));
                    }
                }
            }
        }
    }

    /// Writes stamped batches (ending at `end`) to the local replica and the followers at
    /// once, and returns when the local fsync and W - 1 followers' fsyncs are done; only then
    /// are they visible to readers.
    async fn write_replicated(&mut self, batches: Vec<RecordBatch>, end: u64) -> Result<(), StoreError> {
        let Some(mut log) = self.log.take() else {
            return Err(StoreError::Failed(self.failed.clone().unwrap_or_else(|| "the log is gone".into())));
        };
        let local_batches = batches.clone();
        let local = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let r = log.append_replicated(&local_batches);
            (log, r, started.elapsed())
        });
        let committed = batches.first().map_or(end, |b| b.base_offset());
        let replicated = match &self.ensemble {
            Some(e) => e.replicate(&batches, end, committed).await,
            None => Err(StoreError::NotEnoughReplicas("the open segment has no ensemble".into())),
        };
        let local = match local.await {
            Ok((log, r, took)) => {
                self.log = Some(log);
                self.metrics.fsync_seconds.observe(took.as_secs_f64());
                r
            }
            Err(e) => {
                let reason = format!("append task panicked: {e}");
                self.failed = Some(reason.clone());
                return Err(StoreError::Failed(reason));
            }
        };
        local?;
        replicated?;
        self.log().publish();
        Ok(())
    }

    /// After the write quorum was lost: takes a new epoch for this agent (so that nothing the
    /// ended writer still had in flight is accepted by a replica after the next writer fenced
    /// them), and lets the agent start a new writer, which recovers the open segment.
    async fn abandon(&mut self) {
        self.ensemble = None;
        let claim = Command::ClaimWriter {
            topic: self.config.topic.clone(),
            partition: self.config.partition,
            agent: self.config.agent_id.clone(),
            expected_epoch: Some(self.epoch),
        };
        match self.metadata.write(claim).await {
            Ok(_) => info!("took a new epoch to recover the partition"),
            Err(e) => {
                warn!(error = %e, "taking a new epoch failed; metadata or the lease decides the next writer")
            }
        }
    }

    /// On a clean stop, leaves no open segment of this agent in metadata: an empty one is
    /// removed, one with records is sealed on disk and in metadata. The next writer, here or
    /// on another agent, then starts at the partition's end without recovering anything.
    async fn close(&mut self) {
        let ensemble = self.ensemble.take();
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.finish_pending_roll().await {
            warn!(error = %e, "recording a segment roll in metadata failed at stop; the next writer reconciles it");
            return;
        }
        let summary =
            SealedSummary::of(self.log().active()).held_by(&self.config.agent_id, ensemble.as_ref()).await;
        drop(ensemble);
        if summary.record_count > 0 {
            if let Err(e) = self.on_log("seal", |log| log.seal_active_on_disk()).await {
                error!(error = %e, "sealing the active segment at stop failed");
                return;
            }
        }
        match self.metadata.write(self.seal_command(&summary)).await {
            Ok(_) => info!(
                base_offset = summary.base_offset,
                records = summary.record_count,
                "open segment closed at stop"
            ),
            Err(e) => {
                warn!(error = %e, "closing the open segment in metadata failed; the next writer reconciles it")
            }
        }
    }

    /// Picks up configs altered since this writer started (`AlterTopicConfig`; the replication
    /// factor and the write quorum never change).
    fn refresh_config(&mut self) {
        let (topic, id) = (self.config.topic.as_str(), self.config.topic_id);
        let Some(c) = self
            .metadata
            .read_local(|s| s.topics.get(topic).filter(|t| t.id == id).map(|t| t.config.clone()))
        else {
            return;
        };
        self.config.topic_config = c;
    }

    /// Rolls the active segment when it is older than `segment.ms`, or when its ensemble
    /// should change (a follower left, or more agents could join it).
    async fn roll_if_old(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if self.roll_pending.is_some() {
            if let Err(e) = self.finish_pending_roll().await {
                warn!(error = %e, "recording a segment roll in metadata failed; will retry");
            }
            return;
        }
        self.trim_local().await;
        if let Some(e) = &self.ensemble {
            *crate::sync::lock(&self.lag) = e.lag(self.log().next_offset());
        }
        let old = self
            .first_append_at
            .is_some_and(|t| t.elapsed() >= Duration::from_millis(self.config.topic_config.segment_ms));
        let degraded = self.ensemble.as_ref().is_some_and(|e| {
            // A follower left, or lost its disk (it registered from another data directory),
            // or the segment opened with fewer replicas than replication.factor and more
            // agents are live now.
            e.degraded() || self.ensemble_can_improve(e.size())
        });
        if (old || degraded) && self.log().active().record_count() > 0 {
            if degraded {
                info!("the open segment's ensemble lost a follower or can grow; rolling to a segment with a new ensemble");
            }
            self.roll().await;
        } else if degraded {
            // Nothing written to it yet: open it again with a new ensemble.
            self.roll_pending = Some(SealedSummary::of(self.log().active()));
            if let Err(e) = self.finish_pending_roll().await {
                warn!(error = %e, "opening the segment with a new ensemble failed; will retry");
            }
        }
    }

    /// Drops local copies of segments that metadata says are archived, once they are older than
    /// `local.retention.ms` or beyond `local.retention.bytes`. A segment that is not archived is
    /// never dropped: the local copy may be the only one.
    async fn trim_local(&mut self) {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition as usize);
        type Archived = std::collections::BTreeMap<u64, (Option<u64>, Option<u64>)>;
        // Archived segments from the local log's start on (the chain before it can be long),
        // and where metadata's chain starts now (retention deletes from the front: anything
        // below it is gone from the bucket and must go from here too).
        let local_start = self.log().segments().first().map_or(0, |s| s.base_offset());
        let (archived, earliest): (Archived, Option<u64>) = self.metadata.read_local(|s| {
            s.topics
                .get(&topic)
                .and_then(|t| t.partitions.get(partition))
                .map(|p| {
                    let archived = p
                        .segments
                        .range(local_start..)
                        .map(|(_, seg)| seg)
                        .filter(|seg| seg.state == silt_metadata::state::SegmentState::Archived)
                        .map(|seg| (seg.base_offset, (seg.last_offset, seg.archived_ms)))
                        .collect();
                    (archived, p.segments.keys().next().copied())
                })
                .unwrap_or_default()
        });
        let now = self.config.clock.now_ms();
        let log = self.log();
        let sealed = &log.segments()[..log.segments().len() - 1];
        // Local segments whose records metadata has deleted (retention) go first, whatever
        // local.retention says.
        let expired_before = sealed
            .iter()
            .take_while(|seg| earliest.is_some_and(|e| seg.next_offset() <= e))
            .last()
            .map(|seg| seg.next_offset());
        if archived.is_empty() && expired_before.is_none() {
            return;
        }
        // Then the archived prefix of the local log, oldest first.
        let prefix: Vec<(u64, u64, u64, Option<u64>)> = sealed
            .iter()
            .skip_while(|seg| expired_before.is_some_and(|b| seg.next_offset() <= b))
            .map_while(|seg| {
                let (last, archived_ms) = archived.get(&seg.base_offset())?;
                (*last == Some(seg.next_offset().saturating_sub(1))).then_some((
                    seg.base_offset(),
                    seg.next_offset(),
                    seg.size_bytes(),
                    *archived_ms,
                ))
            })
            .collect();
        let mut local_bytes: u64 = prefix.iter().map(|s| s.2).sum();
        let mut drop_before = expired_before;
        for (_, next, size, archived_ms) in &prefix {
            let expired = archived_ms.is_some_and(|t| t + self.config.topic_config.local_retention_ms <= now);
            let over = self.config.topic_config.local_retention_bytes.is_some_and(|max| local_bytes > max);
            if !(expired || over) {
                break;
            }
            local_bytes -= size;
            drop_before = Some(*next);
        }
        let Some(before) = drop_before else { return };
        match self.on_log("trim", move |log| log.delete_before(before)).await {
            Ok(n) => info!(segments = n, before, "dropped local copies of archived segments"),
            Err(e) => warn!(error = %e, "dropping local copies of archived segments failed"),
        }
    }

    /// Seals the active segment on disk and records the seal and the new segment in metadata.
    async fn roll(&mut self) {
        let summary = SealedSummary::of(self.log().active())
            .held_by(&self.config.agent_id, self.ensemble.as_ref())
            .await;
        match self.on_log("roll", |log| log.roll()).await {
            Ok(()) => {
                self.ensemble = None;
                self.first_append_at = None;
                info!(base_offset = summary.base_offset, records = summary.record_count, "segment sealed");
                self.roll_pending = Some(summary);
                if let Err(e) = self.finish_pending_roll().await {
                    warn!(error = %e, "recording a segment roll in metadata failed; will retry");
                }
            }
            Err(e) => {
                error!(error = %e, "sealing a segment failed; the partition stops accepting writes");
                self.failed.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// Runs `f` on the log on the blocking pool: file I/O and fsync must not stall the runtime.
    /// A panic there loses the log, so the partition is marked failed and refuses every write.
    async fn on_log<T: Send + 'static>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut PartitionLog) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let Some(mut log) = self.log.take() else {
            return Err(StoreError::Failed(self.failed.clone().unwrap_or_else(|| "the log is gone".into())));
        };
        match tokio::task::spawn_blocking(move || {
            let r = f(&mut log);
            (log, r)
        })
        .await
        {
            Ok((log, r)) => {
                self.log = Some(log);
                r
            }
            Err(e) => {
                let reason = format!("{what} task panicked: {e}");
                error!(%reason, "the partition stops accepting writes");
                self.failed = Some(reason.clone());
                Err(StoreError::Failed(reason))
            }
        }
    }

    /// Records a roll in metadata: the seal of the segment `roll_pending` describes and the
    /// open of the next one, in one commit when there are agents for the next ensemble.
    async fn finish_pending_roll(&mut self) -> Result<(), StoreError> {
        let Some(summary) = self.roll_pending.clone() else { return Ok(()) };
        self.ensemble = None;
        let next = self.log().next_offset();
        if let Ok((ensemble, instances)) = self.choose_ensemble() {
            let roll = Command::RollSegment {
                seal: Box::new(self.seal_command(&summary)),
                open: Box::new(self.open_command(next, ensemble, instances)),
            };
            let rolled = match self.metadata.write(roll).await {
                Ok(_) => true,
                Err(silt_metadata::MetadataError::Fenced { expected, actual }) => {
                    return Err(self.fenced(expected, actual));
                }
                // A retry after a lost reply finds the next segment open already.
                Err(silt_metadata::MetadataError::InvalidArgument(_))
                    if self.is_open_in_metadata(next).await =>
                {
                    true
                }
                // Sealed already (by an earlier attempt of the steps below): open alone.
                Err(silt_metadata::MetadataError::InvalidArgument(_))
                    if self.is_sealed_in_metadata(&summary).await =>
                {
                    false
                }
                Err(e) => return Err(e.into()),
            };
            if rolled {
                self.start_ensemble(next);
                self.roll_pending = None;
                return Ok(());
            }
        }
        // Too few agents for the next ensemble (the open below says so and the writer ends),
        // or the seal is recorded already: one step at a time.
        match self.metadata.write(self.seal_command(&summary)).await {
            Ok(_) => {}
            // A retry after a lost reply finds the segment already sealed; go on to the open.
            Err(silt_metadata::MetadataError::InvalidArgument(_))
                if self.is_sealed_in_metadata(&summary).await => {}
            Err(silt_metadata::MetadataError::Fenced { expected, actual }) => {
                return Err(self.fenced(expected, actual));
            }
            Err(e) => return Err(e.into()),
        }
        if let Err(e) = self.open_segment().await {
            if matches!(e, StoreError::NotEnoughReplicas(_)) {
                // Too few agents to open the next segment with: the writer ends like one that
                // lost its quorum, and the agent starts it again (handing the partition over
                // if it is this agent that cannot reach the others).
                self.failed.get_or_insert_with(|| e.to_string());
                self.quorum_lost = true;
            }
            return Err(e);
        }
        self.roll_pending = None;
        Ok(())
    }

    /// A metadata write refused for a newer epoch: this writer is deposed and refuses writes.
    fn fenced(&mut self, expected: u64, actual: u64) -> StoreError {
        self.failed = Some(format!("fenced: epoch {expected} was superseded by {actual}"));
        StoreError::Metadata(silt_metadata::MetadataError::Fenced { expected, actual })
    }

    async fn is_sealed_in_metadata(&self, s: &SealedSummary) -> bool {
        let (topic, partition, base) =
            (self.config.topic.clone(), self.config.partition as usize, s.base_offset);
        self.metadata
            .read(move |st| {
                st.topics.get(&topic).and_then(|t| t.partitions.get(partition)).is_some_and(|p| {
                    p.segments
                        .get(&base)
                        .is_none_or(|seg| seg.state != silt_metadata::state::SegmentState::Open)
                })
            })
            .await
            .unwrap_or(false)
    }

    async fn is_open_in_metadata(&self, base: u64) -> bool {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition as usize);
        self.metadata
            .read(move |st| {
                st.topics
                    .get(&topic)
                    .and_then(|t| t.partitions.get(partition))
                    .and_then(|p| p.open_segment())
                    .is_some_and(|seg| seg.base_offset == base)
            })
            .await
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seal names only the members that hold the segment whole: the writer alone when it
    /// streamed to none of the followers metadata recorded (its copy of metadata named none).
    #[tokio::test]
    async fn a_seal_names_the_writer_alone_when_it_streamed_to_no_recorded_follower() {
        let peers: Peers = Arc::new(crate::transport::HttpPeers::new("w"));
        let target = ReplicaTarget { topic_id: 1, epoch: 2, segment: 0, segment_epoch: 2 };
        let summary = SealedSummary {
            base_offset: 0,
            record_count: 10,
            size_bytes: 100,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            replicas: None,
        };
        let e = Ensemble::start(&peers, "t", 0, target.clone(), Vec::new(), 3, 1);
        assert_eq!(summary.clone().held_by("w", Some(&e)).await.replicas, Some(vec!["w".to_string()]));
        let e = Ensemble::start(&peers, "t", 0, target, Vec::new(), 1, 1);
        assert_eq!(summary.held_by("w", Some(&e)).await.replicas, None, "R=1: the writer holds it whole");
    }
}
