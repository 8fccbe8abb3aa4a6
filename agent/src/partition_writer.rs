//! The writer of one partition: a task that owns the [`PartitionLog`], group-commits
//! appends (many batches, one fsync), rolls segments on size and age and records every
//! segment change in metadata under the partition's epoch.
//!
//! An append is answered only after the fsync that covers it. A failed write or fsync is
//! fatal for the partition on this agent: it stops accepting writes instead of retrying
//! (after a failed fsync the kernel may already have dropped the pages).

use std::sync::Arc;
use std::time::{Duration, Instant};

use silt_metadata::{Command, Metadata};
use silt_record::RecordBatch;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, info_span, warn, Instrument};

use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::partition_log::{PartitionLog, PartitionReader};

/// Most bytes of appends waiting for one partition's writer; producers wait beyond that.
pub const QUEUED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most bytes written between two fsyncs.
pub const GROUP_BYTES_MAX: usize = 8 * 1024 * 1024;
/// How long a failed writer refuses writes before it ends and the agent starts a new one.
const FAILED_WRITER_RESTART_AFTER: Duration = Duration::from_secs(5);
/// Most appends answered by one fsync.
pub const GROUP_APPENDS_MAX: usize = 1024;

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
    /// Roll when the active segment would grow past this.
    pub segment_bytes: u64,
    /// Roll when the active segment's first record is this old.
    pub segment_ms: u64,
    /// Keep the local copy of an archived segment this long after it was archived.
    pub local_retention_ms: u64,
    /// Keep at most this many bytes of archived segments locally.
    pub local_retention_bytes: Option<u64>,
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
}

#[derive(Debug, Clone)]
struct SealedSummary {
    base_offset: u64,
    record_count: u64,
    size_bytes: u64,
    min_timestamp_ms: Option<i64>,
    max_timestamp_ms: Option<i64>,
    next_base: u64,
}

impl SealedSummary {
    fn of(s: &crate::segment::Segment) -> Self {
        SealedSummary {
            base_offset: s.base_offset(),
            record_count: s.next_offset() - s.base_offset(),
            size_bytes: s.size_bytes(),
            min_timestamp_ms: s.min_timestamp_ms(),
            max_timestamp_ms: s.max_timestamp_ms(),
            next_base: s.next_offset(),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Reconciles the recovered log with the metadata's segment chain under `epoch` (metadata
/// named this agent writer at that epoch) and starts the writer task.
pub async fn start(
    log: PartitionLog,
    config: WriterConfig,
    epoch: u64,
    metadata: Metadata,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> Result<(PartitionHandle, JoinHandle<()>), StoreError> {
    let reader = log.reader();
    let mut writer = PartitionWriter {
        log: Some(log),
        config,
        metadata,
        metrics,
        epoch,
        failed: None,
        roll_pending: None,
        first_append_at: None,
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

    /// Every start is a writer change (a new epoch), so the segment that was open is sealed at
    /// the end this replica recovered and a new one is opened after it.
    async fn reconcile(&mut self) -> Result<(), StoreError> {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition);
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
        if let Some(open) = meta.open_segment() {
            // Only a member of the open segment's ensemble holds a replica of it: any other
            // local segment at that offset (a fresh empty log starts at 0) is not one.
            let member = open.ensemble.contains(&self.config.agent_id);
            let local = self
                .log()
                .segments()
                .iter()
                .find(|s| member && s.base_offset() == open.base_offset)
                .map(SealedSummary::of);
            if !member {
                // The open segment's records are on other agents' disks: sealing it here would
                // drop acknowledged messages. Wait until one of them writes it again (metadata
                // gives the partition back to a returning ensemble member).
                return Err(StoreError::Failed(format!(
                    "partition {topic}/{partition} is waiting for its open segment at offset {} held by agent(s) {}; \
                     it becomes writable when one of them is back",
                    open.base_offset,
                    open.ensemble.join(", ")
                )));
            }
            if local.is_none() {
                error!(
                    base_offset = open.base_offset,
                    "this agent held the open segment but its local log does not have it (a new or wiped data \
                     directory); sealing it empty: whatever it held was on this agent only and is lost"
                );
            }
            let summary = local.unwrap_or(SealedSummary {
                base_offset: open.base_offset,
                record_count: 0,
                size_bytes: 0,
                min_timestamp_ms: None,
                max_timestamp_ms: None,
                next_base: open.base_offset,
            });
            self.metadata.write(self.seal_command(&summary)).await?;
        }
        let next_base = self
            .metadata
            .read(|s| s.topic(&topic).map(|t| t.partitions[partition as usize].next_segment_base()))
            .await??;
        let local_next = self.log().next_offset();
        let empty = self.log().segments().len() == 1 && self.log().active().record_count() == 0;
        if local_next < next_base && empty {
            // A fresh replica (new disk, or metadata rebuilt from the bucket): earlier offsets
            // are archived or on other replicas; this log starts where the next segment does.
            info!(from = local_next, to = next_base, "starting an empty local log at the partition's end");
            self.on_log("reset", move |log| log.restart_empty_at(next_base)).await?;
        } else if local_next < next_base && self.local_log_is_archived(&topic, partition).await? {
            // Other agents wrote the partition since this one did, and everything this log
            // holds is in the bucket: it is only a cache, so start afresh at the end.
            info!(
                from = local_next,
                to = next_base,
                "local log is archived; starting afresh at the partition's end"
            );
            self.on_log("reset", move |log| log.reset_at(next_base)).await?;
        }
        let local_next = self.log().next_offset();
        if local_next != next_base {
            return Err(StoreError::Failed(format!(
                "local log of {topic}/{partition} ends at offset {local_next} but metadata says the next segment starts at {next_base}; refusing to serve a log that disagrees with metadata"
            )));
        }
        if self.log().active().record_count() > 0 {
            self.on_log("roll", |log| log.roll()).await?;
        }
        self.metadata.write(self.open_command()).await?;
        Ok(())
    }

    /// Whether every record of the local log is in an archived segment (or was deleted by
    /// retention), by a linearizable read of metadata.
    async fn local_log_is_archived(&self, topic: &str, partition: u32) -> Result<bool, StoreError> {
        let ranges: Vec<(u64, u64)> = self
            .log()
            .segments()
            .iter()
            .filter(|s| s.record_count() > 0)
            .map(|s| (s.base_offset(), s.next_offset() - 1))
            .collect();
        let topic = topic.to_string();
        let covered = self
            .metadata
            .read(move |s| {
                s.topics
                    .get(&topic)
                    .and_then(|t| t.partitions.get(partition as usize))
                    .is_some_and(|p| ranges.iter().all(|&(first, last)| p.is_archived(first, last)))
            })
            .await?;
        Ok(covered)
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
            now_ms: now_ms(),
        }
    }

    fn open_command(&self) -> Command {
        Command::OpenSegment {
            topic: self.config.topic.clone(),
            topic_id: Some(self.config.topic_id),
            partition: self.config.partition,
            epoch: self.epoch,
            base_offset: self.log().next_offset(),
            ensemble: vec![self.config.agent_id.clone()],
            now_ms: now_ms(),
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<AppendRequest>,
        mut control: mpsc::Receiver<oneshot::Sender<()>>,
        cancel: CancellationToken,
    ) {
        let tick_ms = (self.config.segment_ms / 4).clamp(25, 1000);
        let mut tick = tokio::time::interval(Duration::from_millis(tick_ms));
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
                    self.roll_if_old().await;
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
            if let Some(reason) = self.failed.clone() {
                // Refuse writes for a while, then end: the agent's supervisor starts a new
                // writer, which recovers the log from disk (never retrying on the same state).
                error!(%reason, "the partition writer failed; it stops and is restarted from disk");
                let until = tokio::time::Instant::now() + FAILED_WRITER_RESTART_AFTER;
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
                if size > 0 && size + len > self.config.segment_bytes {
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
            let epoch = self.epoch;
            let started = Instant::now();
            let result = self
                .on_log("append", move |log| {
                    let ranges = log.append_and_sync(batches, epoch)?;
                    log.publish();
                    Ok(ranges)
                })
                .await;
            self.metrics.fsync_seconds.observe(started.elapsed().as_secs_f64());
            match result {
                Ok(ranges) => {
                    self.first_append_at.get_or_insert_with(Instant::now);
                    for ((reply, _permit), range) in replies.into_iter().zip(ranges) {
                        let _ = reply.send(Ok(range));
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

    /// On a clean stop, leaves no open segment of this agent in metadata: an empty one is
    /// removed, one with records is sealed on disk and in metadata. The next writer, here or
    /// on another agent, then starts at the partition's end without recovering anything.
    async fn close(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.finish_pending_roll().await {
            warn!(error = %e, "recording a segment roll in metadata failed at stop; the next writer reconciles it");
            return;
        }
        let summary = SealedSummary::of(self.log().active());
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
        let old = self
            .first_append_at
            .is_some_and(|t| t.elapsed() >= Duration::from_millis(self.config.segment_ms));
        if old && self.log().active().record_count() > 0 {
            self.roll().await;
        }
    }

    /// Drops local copies of segments that metadata says are archived, once they are older than
    /// `local.retention.ms` or beyond `local.retention.bytes`. A segment that is not archived is
    /// never dropped: the local copy may be the only one.
    async fn trim_local(&mut self) {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition as usize);
        type Archived = std::collections::BTreeMap<u64, (Option<u64>, Option<u64>)>;
        // Archived segments, and where metadata's chain starts now (retention deletes from the
        // front: anything below it is gone from the bucket and must go from here too).
        let (archived, earliest): (Archived, Option<u64>) = self.metadata.read_local(|s| {
            s.topics
                .get(&topic)
                .and_then(|t| t.partitions.get(partition))
                .map(|p| {
                    let archived = p
                        .segments
                        .values()
                        .filter(|seg| seg.state == silt_metadata::state::SegmentState::Archived)
                        .map(|seg| (seg.base_offset, (seg.last_offset, seg.archived_ms)))
                        .collect();
                    (archived, p.segments.keys().next().copied())
                })
                .unwrap_or_default()
        });
        let now = now_ms();
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
            let expired = archived_ms.is_some_and(|t| t + self.config.local_retention_ms <= now);
            let over = self.config.local_retention_bytes.is_some_and(|max| local_bytes > max);
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
        let summary = SealedSummary::of(self.log().active());
        match self.on_log("roll", |log| log.roll()).await {
            Ok(()) => {
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

    async fn finish_pending_roll(&mut self) -> Result<(), StoreError> {
        let Some(summary) = self.roll_pending.clone() else { return Ok(()) };
        let sealed = self.metadata.write(self.seal_command(&summary)).await;
        match sealed {
            Ok(_) => {}
            // A retry after a lost reply finds the segment already sealed; go on to the open.
            Err(silt_metadata::MetadataError::InvalidArgument(_))
                if self.is_sealed_in_metadata(&summary).await => {}
            Err(silt_metadata::MetadataError::Fenced { expected, actual }) => {
                self.failed = Some(format!("fenced: epoch {expected} was superseded by {actual}"));
                return Err(StoreError::Metadata(silt_metadata::MetadataError::Fenced { expected, actual }));
            }
            Err(e) => return Err(e.into()),
        }
        match self.metadata.write(self.open_command()).await {
            Ok(_) => {}
            Err(silt_metadata::MetadataError::InvalidArgument(_))
                if self.is_open_in_metadata(summary.next_base).await => {}
            Err(e) => return Err(e.into()),
        }
        self.roll_pending = None;
        Ok(())
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
