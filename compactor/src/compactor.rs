//! The archive loop: sealed segments become verified Parquet objects, then `Archived` in
//! metadata; expired archived segments are forgotten in metadata, then deleted from the bucket.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use silt_metadata::clock::{Clock, SystemClock};
use silt_metadata::state::{Segment, SegmentState};
use silt_metadata::{Command, Metadata};
use silt_tiering::archive_format::{encode_archive, read_archive_meta, ArchiveMeta, ArchiveWriterOptions};
use silt_tiering::object_layout::object_key;
use silt_tiering::topic_descriptor::{write_descriptor, TopicDescriptor};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, info_span, warn, Instrument};

use crate::error::CompactorError;
use crate::metrics::CompactorMetrics;
use crate::segment_source::SegmentSource;

/// How the compactor runs.
#[derive(Debug, Clone)]
pub struct CompactorConfig {
    /// How often metadata is scanned for sealed segments and expired data.
    pub interval: Duration,
    /// Segments archived at the same time.
    pub concurrency_max: usize,
    /// Bound on the bytes of segments being archived at once (records in memory plus the
    /// encoded object); a segment larger than this is archived alone.
    pub memory_bytes_max: u64,
    /// Objects up to this size go up in one conditional PUT; larger ones use multipart.
    pub single_put_bytes_max: u64,
    /// Part size of multipart uploads.
    pub part_bytes: usize,
    /// Parquet writer settings.
    pub writer: ArchiveWriterOptions,
    /// `Some(agent)`: archive only segments whose ensemble includes this agent, and enforce
    /// retention only on the partitions it writes (a compactor inside each agent of a
    /// cluster). `None`: every sealed segment and every partition.
    pub holder: Option<String>,
    /// The time of day: commits are stamped, retention judged and lag measured by it.
    pub clock: Arc<dyn Clock>,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        CompactorConfig {
            interval: Duration::from_secs(1),
            concurrency_max: 2,
            memory_bytes_max: 512 * 1024 * 1024,
            single_put_bytes_max: 256 * 1024 * 1024,
            part_bytes: 64 * 1024 * 1024,
            writer: ArchiveWriterOptions::default(),
            holder: None,
            clock: Arc::new(SystemClock),
        }
    }
}

/// The compactor. Cheap to clone.
#[derive(Clone)]
pub struct Compactor {
    inner: Arc<Inner>,
}

struct Inner {
    config: CompactorConfig,
    metadata: Metadata,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    source: Arc<dyn SegmentSource>,
    metrics: Arc<CompactorMetrics>,
    memory: Arc<Semaphore>,
    /// The config version of each topic (name, id) whose description is known to be in the
    /// bucket.
    described: std::sync::Mutex<std::collections::HashMap<(String, u64), u64>>,
}

/// Archived segments of one partition past retention: topic, its id, partition, (base offset,
/// object key).
type Expired = (String, u64, u32, Vec<(u64, String)>);

/// A sealed segment waiting to be archived.
#[derive(Debug, Clone)]
struct Candidate {
    topic: String,
    topic_id: u64,
    partitions: u32,
    partition: u32,
    segment: Segment,
}

/// Memory permits are counted in KiB so that any segment size fits a `u32` permit count.
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

impl Compactor {
    /// A compactor writing objects under `prefix` of `store`.
    pub fn new(
        config: CompactorConfig,
        metadata: Metadata,
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        source: Arc<dyn SegmentSource>,
        metrics: Arc<CompactorMetrics>,
    ) -> Compactor {
        let memory = Arc::new(Semaphore::new(kib(config.memory_bytes_max) as usize));
        let described = std::sync::Mutex::default();
        Compactor {
            inner: Arc::new(Inner { config, metadata, store, prefix, source, metrics, memory, described }),
        }
    }

    /// The compactor's metrics.
    pub fn metrics(&self) -> &Arc<CompactorMetrics> {
        &self.inner.metrics
    }

    /// Runs until `cancel`; a round in progress finishes its uploads and commits first.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.inner.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.run_once().await;
        }
        info!("compactor stopped");
    }

    /// Archives until no sealed segment in scope is left or `timeout` passed (an agent that is
    /// stopping hands over only archived data). Returns how many are left.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = self.candidates().len();
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return left;
            }
            if self.run_once().await == 0 {
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
                )
                .await;
            }
        }
    }

    /// One round: archive every sealed segment, then apply retention. Returns how many segments
    /// were archived.
    pub async fn run_once(&self) -> usize {
        self.describe_topics().await;
        let mut candidates = self.candidates();
        self.update_lag(&candidates);
        // No object goes into the bucket before its topic (that incarnation of it) is
        // described there.
        {
            let described = self.inner.described.lock().unwrap_or_else(|e| e.into_inner());
            candidates.retain(|c| described.contains_key(&(c.topic.clone(), c.topic_id)));
        }
        let concurrency = Arc::new(Semaphore::new(self.inner.config.concurrency_max.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for c in candidates {
            let this = self.clone();
            let concurrency = Arc::clone(&concurrency);
            let span = info_span!("archive", topic = %c.topic, partition = c.partition, base_offset = c.segment.base_offset);
            tasks.spawn(
                async move {
                    let Ok(_slot) = concurrency.acquire_owned().await else { return false };
                    match this.archive(&c).await {
                        Ok(()) => true,
                        Err(e) => {
                            this.inner.metrics.archive_failures.inc();
                            warn!(error = %e, "archiving failed; the segment stays sealed and will be retried");
                            false
                        }
                    }
                }
                .instrument(span),
            );
        }
        let mut archived = 0;
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(true) => archived += 1,
                Ok(false) => {}
                Err(e) => error!(error = %e, "an archive task panicked"),
            }
        }
        if let Err(e) = self.enforce_retention().await {
            warn!(error = %e, "retention failed; will retry");
        }
        archived
    }

    /// Writes the description of every topic in scope whose configs changed since it was last
    /// written (all of them on the first round). A topic that could not be described is not
    /// archived this round.
    async fn describe_topics(&self) {
        let holder = self.inner.config.holder.as_deref();
        let topics: Vec<TopicDescriptor> = self.inner.metadata.read_local(|s| {
            s.topics
                .values()
                .filter(|t| {
                    holder.is_none_or(|h| {
                        t.partitions.iter().any(|p| {
                            p.writer.as_deref() == Some(h)
                                || p.segments
                                    .values()
                                    .any(|seg| seg.ensemble.iter().chain(&seg.unverified).any(|a| a == h))
                        })
                    })
                })
                .map(TopicDescriptor::of)
                .collect()
        });
        let stale: Vec<TopicDescriptor> = {
            let mut described = self.inner.described.lock().unwrap_or_else(|e| e.into_inner());
            described.retain(|(name, id), _| topics.iter().any(|t| (&t.name, t.id) == (name, *id)));
            topics
                .into_iter()
                .filter(|t| described.get(&(t.name.clone(), t.id)) != Some(&t.config_version))
                .collect()
        };
        for d in stale {
            match write_descriptor(self.inner.store.as_ref(), &self.inner.prefix, &d).await {
                Ok(()) => {
                    let mut described = self.inner.described.lock().unwrap_or_else(|e| e.into_inner());
                    described.insert((d.name.clone(), d.id), d.config_version);
                }
                Err(e) => {
                    warn!(error = %e, topic = %d.name, "describing the topic in the bucket failed; its segments wait");
                }
            }
        }
    }

    fn candidates(&self) -> Vec<Candidate> {
        let holder = self.inner.config.holder.as_deref();
        let mut out: Vec<Candidate> = self.inner.metadata.read_local(|s| {
            // Of the agents holding a segment, the first one live on the disk it had when the
            // segment opened archives it; with none, the first such unverified member (which
            // may hold it: the archive is checked against the segment's count and offsets).
            let archiver = |seg: &silt_metadata::state::Segment| {
                let intact = |instances: &[String], (i, a): (usize, &String)| {
                    s.agents.get(a).is_some_and(|info| {
                        info.is_live(s.clock_ms)
                            && instances.get(i).is_none_or(|r| r.is_empty() || *r == info.instance)
                    })
                };
                let holder = seg.ensemble.iter().enumerate().find(|m| intact(&seg.instances, *m));
                let unverified =
                    || seg.unverified.iter().enumerate().find(|m| intact(&seg.unverified_instances, *m));
                holder.or_else(unverified).map(|(_, a)| a).or(seg.ensemble.first()).cloned()
            };
            s.topics
                .values()
                .flat_map(|t| {
                    t.partitions.iter().enumerate().flat_map(move |(p, part)| {
                        part.segments
                            .values()
                            .filter(move |seg| {
                                seg.state == SegmentState::Sealed
                                    && holder.is_none_or(|h| archiver(seg).as_deref() == Some(h))
                            })
                            .map(move |seg| Candidate {
                                topic: t.name.clone(),
                                topic_id: t.id,
                                partitions: t.partitions.len() as u32,
                                partition: p as u32,
                                segment: seg.clone(),
                            })
                    })
                })
                .collect()
        });
        out.sort_by_key(|c| c.segment.sealed_ms.unwrap_or(0));
        out
    }

    fn update_lag(&self, candidates: &[Candidate]) {
        let now = self.inner.config.clock.now_ms();
        let oldest = candidates.iter().filter_map(|c| c.segment.sealed_ms).min();
        let lag = oldest.map_or(0, |t| now.saturating_sub(t) / 1000);
        self.inner.metrics.archive_lag_seconds.set(lag as i64);
        self.inner.metrics.segments_pending.set(candidates.len() as i64);
    }

    /// Archives one sealed segment: read, encode, upload, verify, commit.
    async fn archive(&self, c: &Candidate) -> Result<(), CompactorError> {
        let seg = &c.segment;
        let Some(last_offset) = seg.last_offset else { return Ok(()) };
        let budget = kib(seg.size_bytes.saturating_mul(2)).min(kib(self.inner.config.memory_bytes_max));
        let _memory = Arc::clone(&self.inner.memory)
            .acquire_many_owned(budget.max(1))
            .await
            .map_err(|e| CompactorError::Task(e.to_string()))?;
        let mismatch = |reason: String| CompactorError::Mismatch {
            topic: c.topic.clone(),
            partition: c.partition,
            base_offset: seg.base_offset,
            reason,
        };
        let records = self
            .inner
            .source
            .read_segment(&c.topic, c.partition, seg.base_offset, last_offset)
            .await
            .map_err(|reason| CompactorError::Source {
                topic: c.topic.clone(),
                partition: c.partition,
                base_offset: seg.base_offset,
                reason,
            })?;
        if records.len() as u64 != seg.record_count {
            return Err(mismatch(format!("{} records read, {} sealed", records.len(), seg.record_count)));
        }
        if let Some((i, r)) =
            records.iter().enumerate().find(|(i, r)| r.offset != seg.base_offset + *i as u64)
        {
            return Err(mismatch(format!(
                "record {i} has offset {}, not {}",
                r.offset,
                seg.base_offset + i as u64
            )));
        }
        let meta = ArchiveMeta {
            topic: c.topic.clone(),
            partition: c.partition,
            partitions: c.partitions,
            base_offset: seg.base_offset,
            last_offset,
            record_count: seg.record_count,
            min_timestamp_ms: records.iter().map(|r| r.timestamp_ms).min().unwrap_or(0),
            max_timestamp_ms: records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0),
        };
        let writer = self.inner.config.writer.clone();
        let meta_for_encode = meta.clone();
        let object = silt_metadata::runtime::spawn_blocking(move || {
            encode_archive(&meta_for_encode, &records, &writer)
        })
        .await
        .map_err(|e| CompactorError::Task(e.to_string()))??;
        let key =
            object_key(&self.inner.prefix, &c.topic, c.topic_id, c.partition, seg.base_offset, last_offset);
        let object_bytes = object.len() as u64;
        self.upload(&key, object, &meta).await?;
        // Read the footer back from the bucket: the object is what metadata will point at.
        let (stored, _) = read_archive_meta(self.inner.store.as_ref(), &key, Some(object_bytes)).await?;
        if stored != meta {
            return Err(mismatch(format!("the uploaded object's footer says {stored:?}, expected {meta:?}")));
        }
        let committed = self
            .inner
            .metadata
            .write(Command::ArchiveSegment {
                topic: c.topic.clone(),
                topic_id: Some(c.topic_id),
                partition: c.partition,
                base_offset: seg.base_offset,
                last_offset,
                object_key: key.to_string(),
                object_bytes,
                now_ms: self.inner.config.clock.now_ms(),
            })
            .await;
        if let Err(e) = &committed {
            // The topic was deleted (and maybe created again, with another id) while its
            // segment was being archived: nothing will ever point at this object.
            let (name, id) = (c.topic.as_str(), c.topic_id);
            let gone = self.inner.metadata.read_local(|s| s.topics.get(name).is_none_or(|t| t.id != id));
            if gone {
                if let Err(d) = self.inner.store.delete(&key).await {
                    warn!(error = %d, object = %key, "deleting the object of a deleted topic failed; it is orphaned");
                }
                return Err(CompactorError::from(e.clone()));
            }
        }
        committed?;
        let m = &self.inner.metrics;
        m.segments_archived.inc();
        m.records_archived.inc_by(seg.record_count);
        m.raw_bytes_archived.inc_by(seg.size_bytes);
        m.object_bytes_archived.inc_by(object_bytes);
        info!(object = %key, records = seg.record_count, raw_bytes = seg.size_bytes, object_bytes, "segment archived");
        Ok(())
    }

    /// Uploads with a conditional create, so a retry can never write a second, different object.
    /// If the object is already there (an earlier attempt whose reply was lost, or a crash before
    /// the metadata commit), it is kept if its footer matches; otherwise archiving the segment
    /// fails, and nothing is overwritten.
    async fn upload(&self, key: &Path, object: Bytes, meta: &ArchiveMeta) -> Result<(), CompactorError> {
        let store = &self.inner.store;
        let len = object.len() as u64;
        let result = if len <= self.inner.config.single_put_bytes_max {
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            store.put_opts(key, PutPayload::from(object.clone()), opts).await.map(|_| ())
        } else {
            // Multipart uploads cannot be conditional everywhere; check first instead. Only one
            // compactor archives a segment, so the check cannot race with another writer.
            match store.head(key).await {
                Ok(_) => {
                    Err(object_store::Error::AlreadyExists { path: key.to_string(), source: "exists".into() })
                }
                Err(object_store::Error::NotFound { .. }) => self.multipart(key, object.clone()).await,
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let (existing, _) = read_archive_meta(store.as_ref(), key, None).await?;
                if &existing == meta {
                    info!(object = %key, "the object is already in the bucket from an earlier attempt; keeping it");
                    return Ok(());
                }
                // The key carries the topic's id and the segment's offsets, and a sealed
                // segment never changes: another object there is damage, never replaced.
                Err(CompactorError::Mismatch {
                    topic: meta.topic.clone(),
                    partition: meta.partition,
                    base_offset: meta.base_offset,
                    reason: format!("{key} already exists with different contents: {existing:?}"),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn multipart(&self, key: &Path, object: Bytes) -> Result<(), object_store::Error> {
        let upload = self.inner.store.put_multipart(key).await?;
        let mut writer =
            object_store::WriteMultipart::new_with_chunk_size(upload, self.inner.config.part_bytes);
        writer.put(object);
        writer.finish().await.map(|_| ())
    }

    /// Deletes archived data older than `retention.ms`: metadata first, so no reader is ever sent
    /// to a missing object, then the objects.
    async fn enforce_retention(&self) -> Result<(), CompactorError> {
        let now = self.inner.config.clock.now_ms();
        let holder = self.inner.config.holder.as_deref();
        let expired: Vec<Expired> = self.inner.metadata.read_local(|s| {
            let mut out = Vec::new();
            for t in s.topics.values() {
                let Some(retention_ms) = t.config.retention_ms else { continue };
                let cutoff = now.saturating_sub(retention_ms) as i64;
                for (p, part) in t.partitions.iter().enumerate() {
                    if holder.is_some_and(|h| part.writer.as_deref() != Some(h)) {
                        continue;
                    }
                    let n = part.segments.len();
                    let old: Vec<(u64, String)> = part
                        .segments
                        .values()
                        .take(n.saturating_sub(1))
                        .take_while(|seg| {
                            seg.state == SegmentState::Archived
                                && seg.max_timestamp_ms.is_some_and(|ts| ts < cutoff)
                        })
                        .filter_map(|seg| seg.object_key.clone().map(|k| (seg.base_offset, k)))
                        .collect();
                    if !old.is_empty() {
                        out.push((t.name.clone(), t.id, p as u32, old));
                    }
                }
            }
            out
        });
        for (topic, topic_id, partition, segments) in expired {
            let base_offsets = segments.iter().map(|(b, _)| *b).collect();
            self.inner
                .metadata
                .write(Command::DeleteArchivedSegments {
                    topic: topic.clone(),
                    topic_id: Some(topic_id),
                    partition,
                    base_offsets,
                })
                .await?;
            for (_, key) in segments {
                let path = Path::parse(key.as_str()).unwrap_or_else(|_| Path::from(key.as_str()));
                match self.inner.store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    // Metadata no longer points at it; an orphan costs storage, not correctness.
                    Err(e) => {
                        warn!(error = %e, object = %key, "deleting an expired object failed; it is orphaned")
                    }
                }
                self.inner.metrics.segments_expired.inc();
                info!(%topic, partition, object = %key, "expired archived segment deleted");
            }
        }
        Ok(())
    }
}
