//! The follower's side of replication: the replicas this agent holds of partitions other
//! agents write, opened cut back to what metadata recorded, and the requests their writers send
//! (fence, append, batches of a segment for a recovery, a sealed segment's copy for a repair).

use super::*;

impl Agent {
    /// The replica of a partition this agent follows, opened on first use. Refused when
    /// metadata shows that the sender was deposed (a newer epoch, or the segment sealed). A
    /// writer of the partition running here under an older epoch is stopped first.
    async fn replica(
        &self,
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<SharedReplica, ApiError> {
        let key = PartitionKey::new(topic, partition);
        // Whether metadata knows the partition (of this topic id); refused if it shows the
        // sender deposed.
        let check = |agent: &Agent| -> Result<bool, ApiError> {
            agent.inner.metadata.read_local(|s| {
                let Some(p) = s
                    .topics
                    .get(topic)
                    .filter(|t| t.id == target.topic_id)
                    .and_then(|t| t.partitions.get(partition as usize))
                else {
                    return Ok(false);
                };
                if p.epoch > target.epoch {
                    return Err(StoreError::Fenced {
                        topic: topic.into(),
                        partition,
                        epoch: target.epoch,
                        fence: p.epoch,
                    }
                    .into());
                }
                if let Some(seg) = p.segments.get(&target.segment) {
                    if seg.state != silt_metadata::state::SegmentState::Open
                        || seg.epoch != target.segment_epoch
                    {
                        return Err(StoreError::Diverged(format!(
                            "segment {} of {topic}/{partition} is no longer open under epoch {}",
                            target.segment, target.segment_epoch
                        ))
                        .into());
                    }
                }
                Ok(true)
            })
        };
        if !check(self)? {
            // Created or changed through another agent: catch up once.
            self.inner.metadata.read(|_| ()).await?;
            if !check(self)? {
                return Err(MetadataError::UnknownPartition { topic: topic.to_string(), partition }.into());
            }
        }
        if let Some(r) = self.open_replica_if_any(topic, partition) {
            return Ok(r);
        }
        // What the replica is cut back to on opening is decided from a linearizable read: a
        // stale copy may not know the newest segment yet, whose batches may be acknowledged.
        let part = self
            .inner
            .metadata
            .read(|s| {
                s.topics
                    .get(topic)
                    .filter(|t| t.id == target.topic_id)
                    .and_then(|t| t.partitions.get(partition as usize).cloned())
            })
            .await?
            .ok_or_else(|| {
                ApiError::from(MetadataError::UnknownPartition { topic: topic.to_string(), partition })
            })?;
        let running = crate::sync::read_lock(&self.inner.partitions).get(&key).map(|r| (r.topic_id, r.epoch));
        if let Some((topic_id, epoch)) = running {
            // A writer of a deleted topic of the same name is stopped whatever its epoch: the
            // epochs of two topics are not comparable.
            if topic_id == target.topic_id && epoch >= target.epoch {
                return Err(StoreError::Fenced {
                    topic: topic.into(),
                    partition,
                    epoch: target.epoch,
                    fence: epoch,
                }
                .into());
            }
            info!(topic, partition, epoch, newer = target.epoch, "a newer writer fenced this agent's writer");
            self.stop_writer(topic, partition).await;
        }
        self.open_replica(topic, partition, target.topic_id, part).await
    }

    /// The replica of a partition this agent already has open, if any.
    pub(super) fn open_replica_if_any(&self, topic: &str, partition: u32) -> Option<SharedReplica> {
        let key = PartitionKey::new(topic, partition);
        let mut replicas = lock(&self.inner.replicas);
        let r = replicas.get(&key).cloned()?;
        let mut replica = lock(&r);
        // One whose directory an fsync failure left distrusted is closed: opening it again
        // answers `disk_failed`.
        if replica.as_mut().is_some_and(|rep| rep.log_mut().is_distrusted()) {
            *replica = None;
        }
        if replica.is_some() {
            drop(replica);
            return Some(r);
        }
        replicas.remove(&key);
        None
    }

    /// Opens the local log of a partition this agent does not write as a replica (cut back to
    /// what metadata recorded), or returns the one already open.
    async fn open_replica(
        &self,
        topic: &str,
        partition: u32,
        topic_id: u64,
        part: silt_metadata::state::Partition,
    ) -> Result<SharedReplica, ApiError> {
        let key = PartitionKey::new(topic, partition);
        let slot = self.writer_slot(&key);
        let writer = slot.lock().await;
        if writer.is_some() {
            return Err(ApiError::unavailable(format!("this agent writes {topic}/{partition}; retry")));
        }
        if let Some(r) = self.open_replica_if_any(topic, partition) {
            return Ok(r);
        }
        let dir = self.topic_dir(topic, topic_id).join(partition.to_string());
        let replica = silt_metadata::runtime::spawn_blocking(move || Replica::open(&dir, topic_id, &part))
            .await
            .map_err(|e| ApiError::unavailable(format!("opening a replica panicked: {e}")))??;
        crate::sync::write_lock(&self.inner.retired).insert(key.clone(), (topic_id, replica.reader()));
        let shared = Arc::new(Mutex::new(Some(replica)));
        lock(&self.inner.replicas).insert(key, Arc::clone(&shared));
        drop(writer);
        Ok(shared)
    }

    /// Ensemble repair, on the agent that is to hold a new replica: copies the sealed segment
    /// `target` names from agent `source`, which holds it, into the local log.
    pub async fn replica_repair(
        &self,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
        source: &str,
    ) -> Result<(), ApiError> {
        let part = self.inner.metadata.read(|s| {
            s.topics
                .get(topic)
                .filter(|t| t.id == target.topic_id)
                .and_then(|t| t.partitions.get(partition as usize).cloned())
        });
        let part = part.await?.ok_or_else(|| {
            ApiError::from(MetadataError::UnknownPartition { topic: topic.into(), partition })
        })?;
        let last = part
            .segments
            .get(&target.segment)
            .filter(|s| {
                s.state == silt_metadata::state::SegmentState::Sealed && s.epoch == target.segment_epoch
            })
            .and_then(|s| s.last_offset)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("{topic}/{partition} has no sealed segment at offset {} to copy", target.segment),
                )
            })?;
        let addr = self
            .inner
            .metadata
            .read_local(|s| s.agents.get(source).map(|a| a.addr.clone()))
            .ok_or_else(|| ApiError::unavailable(format!("agent '{source}' is not registered")))?;
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut next = target.segment;
        while next <= last {
            let body =
                self.inner.peers.replica_batches((source, &addr), topic, partition, &target, next).await?;
            let got: Vec<RecordBatch> = split_batches(body)?
                .into_iter()
                .skip_while(|b| b.last_offset() < next)
                .take_while(|b| b.base_offset() <= last)
                .collect();
            let Some(end) = got.last().map(|b| b.next_offset()) else {
                return Err(ApiError::unavailable(format!(
                    "agent '{source}' holds nothing of segment {} at offset {next}",
                    target.segment
                )));
            };
            batches.extend(got);
            next = end;
        }
        if next != last + 1 {
            return Err(ApiError::unavailable(format!(
                "the copy of segment {} ends at offset {}, not {}",
                target.segment,
                next - 1,
                last
            )));
        }
        let shared = self.open_replica(topic, partition, target.topic_id, part).await?;
        silt_metadata::runtime::spawn_blocking(move || {
            let mut guard = lock(&shared);
            let replica =
                guard.as_mut().ok_or_else(|| StoreError::Failed("the replica was closed; retry".into()))?;
            let r = replica.log_mut().insert_sealed(&batches);
            if let Err(e) = &r {
                if !matches!(e, StoreError::Diverged(_) | StoreError::Failed(_)) {
                    // As after a failed append: opened again from disk on next use.
                    error!(partition, error = %e, "a replica failed while taking a copy; it is opened again from disk");
                    *guard = None;
                }
            }
            r
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("repair task panicked: {e}")))??;
        info!(
            topic,
            partition,
            segment = target.segment,
            from = source,
            "copied a sealed segment: a new replica"
        );
        Ok(())
    }

    /// Runs `f` on a followed partition's replica on the blocking pool. A storage failure
    /// closes the replica (it is opened from disk again on next use; after a failed fsync the
    /// kernel may have dropped pages).
    async fn on_replica<T: Send + 'static>(
        &self,
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        f: impl FnOnce(&mut Replica) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let shared = self.replica(topic, partition, target).await?;
        let (topic, epoch) = (topic.to_string(), target.epoch);
        silt_metadata::runtime::spawn_blocking(move || {
            let mut guard = lock(&shared);
            let Some(replica) = guard.as_mut() else {
                return Err(StoreError::Failed("the replica was closed; retry".into()));
            };
            replica.admit(&topic, partition, epoch)?;
            let r = f(replica);
            if let Err(e) = &r {
                if !matches!(e, StoreError::Fenced { .. } | StoreError::Diverged(_)) {
                    error!(topic, partition, error = %e, "a replica failed; it is opened again from disk");
                    *guard = None;
                }
            }
            r
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("replica task panicked: {e}")))?
        .map_err(ApiError::from)
    }

    /// A writer's append to a segment this agent holds a replica of. Returns the end held.
    pub async fn replica_append(
        &self,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
        committed: Option<u64>,
        body: Bytes,
    ) -> Result<u64, ApiError> {
        let batches = split_batches(body)?;
        if let Some(b) =
            batches.iter().find(|b| i64::from(b.partition_leader_epoch()) != target.segment_epoch as i64)
        {
            return Err(ApiError::new(
                ErrorCode::InvalidRecordBatch,
                format!(
                    "batch at offset {} carries epoch {}, not the segment's {}",
                    b.base_offset(),
                    b.partition_leader_epoch(),
                    target.segment_epoch
                ),
            ));
        }
        let (segment, segment_epoch) = (target.segment, target.segment_epoch);
        let started = Instant::now();
        let end = self
            .on_replica(topic, partition, &target, move |r| {
                let end = r.append(segment, segment_epoch, &batches)?;
                if let Some(c) = committed {
                    r.note_committed(segment, c);
                }
                Ok(end)
            })
            .await?;
        self.inner.metrics.replica_append_seconds.observe(started.elapsed().as_secs_f64());
        Ok(end)
    }

    /// A recovering writer fences this agent's replica of a partition at its epoch and asks
    /// what it holds of a segment.
    pub async fn replica_fence(
        &self,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let instance = self.inner.instance.clone();
        let (segment, segment_epoch) = (target.segment, target.segment_epoch);
        if crate::sim_bugs::on(crate::sim_bugs::Bug::SkipFence) {
            // Answers what it holds, and leaves the fence where it was.
            let shared = self.replica(topic, partition, &target).await?;
            return silt_metadata::runtime::spawn_blocking(move || match lock(&shared).as_mut() {
                Some(r) => HeldSegment::of(r.log_mut(), segment, segment_epoch, &instance),
                None => Err(StoreError::Failed("the replica was closed; retry".into())),
            })
            .await
            .map_err(|e| ApiError::unavailable(format!("replica task panicked: {e}")))?
            .map_err(ApiError::from);
        }
        self.on_replica(topic, partition, &target, move |r| {
            HeldSegment::of(r.log_mut(), segment, segment_epoch, &instance)
        })
        .await
    }

    /// What this agent holds of a sealed segment, asked by an agent that is to declare a range
    /// of it lost (`Command::DeclareLost`): changes nothing here. Refused while this agent
    /// runs the writer that wrote the segment (it may hold acknowledged batches it has not
    /// published yet), and when it cannot tell (a local log of the partition that is not
    /// open): an answer that it holds less than it does could lose acknowledged messages.
    pub async fn replica_held(
        &self,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let known = self.with_partition(topic, partition, |p| {
            p.segments.get(&target.segment).map(|s| (s.state, s.epoch))
        });
        let topic_id = self.inner.metadata.read_local(|s| s.topics.get(topic).map(|t| t.id));
        if topic_id != Some(target.topic_id)
            || known.flatten() != Some((silt_metadata::state::SegmentState::Sealed, target.segment_epoch))
        {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{topic}/{partition} has no sealed segment at offset {} opened under epoch {} as this agent's metadata shows it",
                    target.segment, target.segment_epoch
                ),
            ));
        }
        let key = PartitionKey::new(topic, partition);
        let writing = crate::sync::read_lock(&self.inner.partitions).get(&key).map(|r| (r.topic_id, r.epoch));
        if writing.is_some_and(|(id, epoch)| id == target.topic_id && epoch <= target.segment_epoch) {
            return Err(ApiError::unavailable(format!(
                "this agent still runs the writer of {topic}/{partition} that wrote segment {}",
                target.segment
            )));
        }
        let instance = self.inner.instance.clone();
        let (segment, segment_epoch) = (target.segment, target.segment_epoch);
        let nothing = HeldSegment {
            base_offset: segment,
            end_offset: segment,
            instance: instance.clone(),
            ..Default::default()
        };
        let Some(reader) = self.local_reader_of(topic, partition, Some(target.topic_id)) else {
            // No log open: one with no records is not opened at start. What its directory
            // holds tells, as long as it has no segment file at that offset (one that does is
            // read only through an open log, which checks its epoch and cuts a torn tail).
            let dir = self.topic_dir(topic, target.topic_id).join(partition.to_string());
            if !dir.exists() {
                return Ok(nothing);
            }
            let held = silt_metadata::runtime::spawn_blocking(move || {
                crate::log::partition_log::segment_ranges_held(&dir)
            })
            .await
            .map_err(|e| ApiError::unavailable(format!("listing a log panicked: {e}")))??;
            if held.iter().any(|(base, end)| *base == segment && *end > segment) {
                return Err(ApiError::unavailable(format!(
                    "this agent's local log of {topic}/{partition} is not open; it cannot tell what it holds of segment {segment}"
                )));
            }
            return Ok(nothing);
        };
        silt_metadata::runtime::spawn_blocking(move || {
            HeldSegment::of_reader(&reader, segment, segment_epoch, &instance)
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))?
        .map_err(ApiError::from)
    }

    /// Whole batches of a segment this agent holds, from `from` on, as stored (up to
    /// [`REPLICA_READ_BYTES_MAX`]); a recovering writer copies a tail with them.
    pub async fn replica_batches(
        &self,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
        from: u64,
    ) -> Result<Bytes, ApiError> {
        let reader = self.local_reader(topic, partition).ok_or_else(|| {
            ApiError::unavailable(format!("this agent holds no local log of {topic}/{partition}"))
        })?;
        let batches =
            silt_metadata::runtime::spawn_blocking(move || reader.read(from, REPLICA_READ_BYTES_MAX))
                .await
                .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))??
                .batches;
        let batches: Vec<RecordBatch> = batches
            .into_iter()
            .skip_while(|b| b.last_offset() < from)
            .take_while(|b| {
                b.base_offset() >= target.segment
                    && i64::from(b.partition_leader_epoch()) == target.segment_epoch as i64
            })
            .collect();
        Ok(join_batches(&batches))
    }
}
