//! The writer of one partition: a task that owns the [`PartitionLog`], group-commits
//! appends (many batches, one fsync), rolls segments on size and age and records every
//! segment change in metadata under the partition's epoch.
//!
//! An append is answered only after the fsync that covers it. A failed write or fsync is
//! fatal for the partition on this agent: it stops accepting writes instead of retrying
//! (after a failed fsync the kernel may already have dropped the pages).
//!
//! This file holds the writer's state, its handle and its loop (group commit, replication,
//! the end of a writer); [`recover`] its start, [`segments`] opening, rolling, sealing and
//! trimming segments.

mod recover;
mod segments;

use std::collections::HashMap;
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
use crate::sim_bugs::Bug;
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
/// How long a writer leaves out of new segments a follower that opens no log of the
/// partition until it restarts (`disk_failed`), if it does not register again first.
const DISK_FAILED_AVOID: Duration = Duration::from_secs(300);
/// And one whose write or fsync failed (`storage_error`: a full or failing disk).
const STORAGE_ERROR_AVOID: Duration = Duration::from_secs(30);

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
    /// How long a recovery that finds the open segment's tail on fewer than W members waits
    /// for a member that did not answer: no longer than this past its lease, nor past the
    /// first recovery of the segment that waited for it (`Segment::silent_since_ms`, or this
    /// process's own record, `silent_waits`); the agent's `--replica-repair-after`.
    pub replica_repair_after: Duration,
    /// When this process began waiting for silent members of open segments (shared by the
    /// agent's writers, so that the wait outlasts a writer that starts again).
    pub silent_waits: Arc<crate::replication::recovery::SilentWaits>,
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
    /// Set once the writer lost its write quorum, was fenced or is stopped: another writer may
    /// acknowledge past this log's end any moment, so nothing is answered as this partition's
    /// end from here.
    ended: Arc<std::sync::atomic::AtomicBool>,
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

    /// Whether the writer lost its write quorum, was fenced by a newer epoch, or was stopped:
    /// its log's end is no longer the partition's.
    pub fn ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks the writer ended (see [`ended`](Self::ended)), as it is stopped.
    pub(crate) fn end(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
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
    /// Shared with the handle: see [`PartitionHandle::ended`].
    ended: Arc<std::sync::atomic::AtomicBool>,
    lag: Arc<std::sync::Mutex<Vec<FollowerLag>>>,
    /// Followers whose disk failed an append of this partition, with their incarnation then
    /// and until when they are left out: no new segment is opened on them until then, or
    /// until they register again (a restart). Each would fail the first append of every
    /// segment and make the writer roll again, a segment per write.
    disk_failed: HashMap<String, (u64, Instant)>,
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
    /// Members that did not answer the recovery sealing the segment (see
    /// `Segment::unverified`).
    unverified: Vec<String>,
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
            unverified: Vec::new(),
        }
    }

    /// With the members of `ensemble` (if any) that hold the whole segment, when some do not
    /// (a follower left midway, or is still behind: it is given a moment to catch up). The
    /// followers that did not catch up are named unverified: each may hold acknowledged
    /// records the others lose with their disks, as it may have been part of their quorum.
    async fn held_by(mut self, me: &str, ensemble: Option<&Ensemble>) -> Self {
        if let Some(e) = ensemble {
            let end = self.base_offset + self.record_count;
            let settled = e.settle(end, SETTLE_AT_SEAL).await;
            if settled.len() + 1 < e.recorded() {
                self.unverified =
                    e.followers().filter(|f| !settled.iter().any(|s| s == f)).map(String::from).collect();
                self.replicas = Some(std::iter::once(me.to_string()).chain(settled).collect());
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
        ended: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        lag: Arc::clone(&lag),
        disk_failed: HashMap::new(),
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
        ended: Arc::clone(&writer.ended),
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
                    // A writer deposed on a tick (a follower fenced it) ends now, not at the
                    // next append.
                    if let Some(reason) = self.failed.clone() {
                        self.end_failed(reason, &mut rx, &cancel).await;
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
                self.end_failed(reason, &mut rx, &cancel).await;
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

    /// Ends a failed writer: it refuses writes for a while, then abandons the partition so
    /// that the agent's supervisor starts a new writer, which recovers the log from disk
    /// (never retrying on the same state).
    async fn end_failed(
        &mut self,
        reason: String,
        rx: &mut mpsc::Receiver<AppendRequest>,
        cancel: &CancellationToken,
    ) {
        error!(%reason, "the partition writer failed; it stops and is restarted from disk");
        // A log this agent distrusts cannot be restarted here: the partition is handed to
        // another agent at once.
        let wait = if self.log().is_distrusted() { Duration::ZERO } else { FAILED_WRITER_RESTART_AFTER };
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
        // The next writer recovers the open segment under a new epoch: its followers may hold
        // a group this log lost (see `reconcile`).
        if !cancel.is_cancelled() {
            self.abandon().await;
        }
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
            // Acknowledged or not, a follower fenced by a newer writer means this one is
            // deposed: it ends now, rather than answer reads with an end the newer writer may
            // already have acknowledged past (its copy of metadata may not show the move yet).
            let deposed = self.deposed_by_a_follower();
            match result {
                Ok(()) => {
                    self.first_append_at.get_or_insert_with(Instant::now);
                    for ((reply, _permit), range) in replies.into_iter().zip(ranges) {
                        let _ = reply.send(Ok(range));
                    }
                    if !deposed && self.ensemble.as_ref().is_some_and(|e| e.degraded()) {
                        // A follower left: the next batches go to a segment with a full
                        // ensemble rather than wait for the next tick.
                        info!("a follower left the open segment's ensemble; rolling to a segment with a new ensemble");
                        self.roll().await;
                    }
                }
                Err(e @ StoreError::NotEnoughReplicas(_)) => {
                    error!(error = %e, "lost the write quorum; this writer ends and the partition is recovered under a new epoch");
                    self.failed.get_or_insert_with(|| e.to_string());
                    self.lose_quorum();
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
        let local = silt_metadata::runtime::spawn_blocking(move || {
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
        if crate::sim_bugs::on(Bug::ServePastWatermark) {
            self.log().publish();
        }
        if !crate::sim_bugs::on(Bug::AckBeforeQuorum) {
            replicated?;
        }
        self.log().publish();
        Ok(())
    }

    /// Marks the write quorum lost: the writer ends at the next turn of its loop, and its
    /// handle answers for the partition no more at once (see [`PartitionHandle::ended`]).
    fn lose_quorum(&mut self) {
        self.quorum_lost = true;
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// After the write quorum was lost: takes a new epoch for this agent (so that nothing the
    /// ended writer still had in flight is accepted by a replica after the next writer fenced
    /// them), and lets the agent start a new writer, which recovers the open segment.
    async fn abandon(&mut self) {
        self.ensemble = None;
        if !self.topic_is_current().await {
            info!("the topic was deleted; no new epoch to take");
            return;
        }
        let claim = Command::ClaimWriter {
            topic_id: Some(self.config.topic_id),
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

    /// Whether a follower refused an append as fenced by a newer writer; if so this writer is
    /// deposed, refuses writes and answers for the partition no more (as after [`Self::fenced`]).
    fn deposed_by_a_follower(&mut self) -> bool {
        if !self.ensemble.as_ref().is_some_and(|e| e.fenced()) {
            return false;
        }
        if self.failed.is_none() {
            warn!("a follower's replica is fenced by a newer writer; this writer is deposed and ends");
            self.failed = Some("deposed: a follower's replica is fenced by a newer writer".into());
        }
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        true
    }

    /// A metadata write refused for a newer epoch: this writer is deposed and refuses writes.
    fn fenced(&mut self, expected: u64, actual: u64) -> StoreError {
        self.failed = Some(format!("fenced: epoch {expected} was superseded by {actual}"));
        // Another writer holds the partition at a newer epoch.
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        StoreError::Metadata(silt_metadata::MetadataError::Fenced { expected, actual })
    }

    /// Whether metadata records the segment `s` describes as sealed (or no longer has it), read
    /// linearizably; false when the partition is another topic's now (deleted and created
    /// again under the same name).
    async fn is_sealed_in_metadata(&self, s: &SealedSummary) -> Result<bool, StoreError> {
        let (topic, id, partition, base) =
            (self.config.topic.clone(), self.config.topic_id, self.config.partition as usize, s.base_offset);
        Ok(self
            .metadata
            .read(move |st| {
                let Some(p) =
                    st.topics.get(&topic).filter(|t| t.id == id).and_then(|t| t.partitions.get(partition))
                else {
                    return false;
                };
                p.segments.get(&base).is_none_or(|seg| seg.state != silt_metadata::state::SegmentState::Open)
            })
            .await?)
    }

    /// The ensemble metadata committed for the open segment at `base`, when that is one this
    /// writer opened (under its epoch), read linearizably.
    async fn open_ensemble_in_metadata(&self, base: u64) -> Result<Option<Vec<String>>, StoreError> {
        let (topic, id, partition, epoch) =
            (self.config.topic.clone(), self.config.topic_id, self.config.partition as usize, self.epoch);
        Ok(self
            .metadata
            .read(move |st| {
                let t = st.topics.get(&topic).filter(|t| t.id == id)?;
                let open = t.partitions.get(partition)?.open_segment()?;
                (open.base_offset == base && open.epoch == epoch).then(|| open.ensemble.clone())
            })
            .await?)
    }

    /// Whether the topic this writer writes is still the one of that name in metadata (not
    /// deleted, nor created again); true when metadata cannot be read.
    async fn topic_is_current(&self) -> bool {
        let (topic, id) = (self.config.topic.clone(), self.config.topic_id);
        self.metadata.read(move |st| st.topics.get(&topic).is_some_and(|t| t.id == id)).await.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment of 10 records from offset 0, before `held_by`.
    fn ten_records() -> SealedSummary {
        SealedSummary {
            base_offset: 0,
            record_count: 10,
            size_bytes: 100,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            replicas: None,
            unverified: Vec::new(),
        }
    }

    /// A seal names only the members that hold the segment whole: the writer alone when it
    /// streamed to none of the followers metadata recorded (its copy of metadata named none).
    #[tokio::test]
    async fn a_seal_names_the_writer_alone_when_it_streamed_to_no_recorded_follower() {
        let peers: Peers = Arc::new(crate::transport::HttpPeers::new("w"));
        let target = ReplicaTarget { topic_id: 1, epoch: 2, segment: 0, segment_epoch: 2 };
        let summary = ten_records();
        let e = Ensemble::start(&peers, "t", 0, target.clone(), Vec::new(), 3, 1);
        assert_eq!(summary.clone().held_by("w", Some(&e)).await.replicas, Some(vec!["w".to_string()]));
        let e = Ensemble::start(&peers, "t", 0, target, Vec::new(), 1, 1);
        assert_eq!(summary.held_by("w", Some(&e)).await.replicas, None, "R=1: the writer holds it whole");
    }

    /// A follower that has not acknowledged the whole segment when it is sealed may still hold
    /// acknowledged records (it was part of their quorum): the seal names it unverified rather
    /// than forget it, so reads turn to it if the holders lose their disks.
    #[tokio::test(start_paused = true)]
    async fn a_seal_names_the_followers_that_did_not_catch_up_unverified() {
        let peers: Peers = Arc::new(crate::transport::HttpPeers::new("w"));
        let target = ReplicaTarget { topic_id: 1, epoch: 2, segment: 0, segment_epoch: 2 };
        let summary = ten_records();
        // Nothing was streamed: neither follower acknowledged the segment's records.
        let followers = vec![
            ("f1".to_string(), "127.0.0.1:9".to_string()),
            ("f2".to_string(), "127.0.0.1:9".to_string()),
        ];
        let e = Ensemble::start(&peers, "t", 0, target, followers, 3, 2);
        let sealed = summary.held_by("w", Some(&e)).await;
        assert_eq!(sealed.replicas, Some(vec!["w".to_string()]));
        assert_eq!(sealed.unverified, ["f1", "f2"]);
    }
}
