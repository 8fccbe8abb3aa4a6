//! Local logs of partitions this agent does not write (it wrote them before, or follows them):
//! kept readable until archived, then dropped; replicas cut back as their segments are archived.

use super::*;

impl Agent {
    /// Drops the segments of followed partitions that are archived (oldest first): the bucket
    /// holds them now. When the last one is archived too (the writer has moved on to a segment
    /// this agent does not hold yet), an empty segment at its end takes its place: the
    /// directory, with its fence, stays for the next segment this agent follows.
    pub(super) async fn trim_replicas(&self) {
        let replicas: Vec<(PartitionKey, SharedReplica)> =
            lock(&self.inner.replicas).iter().map(|(k, r)| (k.clone(), Arc::clone(r))).collect();
        for (PartitionKey { topic, partition }, shared) in replicas {
            // The chain from the segment holding the replica's first offset on (the chain
            // before it can be long): what `is_archived` needs of it for the replica's segments.
            let start = self.local_reader(&topic, partition).map_or(0, |r| r.log_start());
            let chain = self.with_partition(&topic, partition, |p| silt_metadata::state::Partition {
                writer: None,
                epoch: p.epoch,
                empty_end: p.empty_end,
                lost_ranges: Vec::new(),
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
            let result = silt_metadata::runtime::spawn_blocking(move || -> Result<usize, StoreError> {
                let mut guard = lock(&shared);
                let Some(replica) = guard.as_mut() else { return Ok(0) };
                let log = replica.log_mut();
                let archived = |s: &crate::log::segment::Segment| {
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
    pub(super) async fn open_retired_logs(&self, topics: &[Topic]) {
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
                let opened = silt_metadata::runtime::spawn_blocking(move || {
                    let (mut log, _) = PartitionLog::open(&dir)?;
                    let fence = crate::log::replica::read_fence(&dir)?;
                    trim_to_metadata(&mut log, &chain, fence)?;
                    Ok::<_, StoreError>(log)
                });
                match opened.await {
                    Ok(Ok(log)) if !log.reader().ranges().is_empty() => {
                        crate::sync::write_lock(&self.inner.retired)
                            .insert(PartitionKey::new(&t.name, p as u32), (t.id, log.reader()));
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
    pub(super) async fn drop_archived_retired_logs(&self) {
        let retired: Vec<RetiredRanges> = crate::sync::read_lock(&self.inner.retired)
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
            let current = crate::sync::read_lock(&self.inner.retired)
                .get(&key)
                .filter(|(id, _)| *id == topic_id)
                .map(|(_, r)| r.ranges());
            let Some(ranges) = current else { continue };
            if !self.retired_log_droppable(&key, topic_id, &ranges) {
                continue;
            }
            crate::sync::write_lock(&self.inner.retired).remove(&key);
            if let Some(replica) = lock(&self.inner.replicas).remove(&key) {
                *lock(&replica) = None;
            }
            let PartitionKey { topic, partition } = key;
            let dir = self.topic_dir(&topic, topic_id).join(partition.to_string());
            match silt_metadata::runtime::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await {
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
    pub(super) fn retired_log_droppable(
        &self,
        key: &PartitionKey,
        topic_id: u64,
        ranges: &[(u64, u64)],
    ) -> bool {
        let followed = lock(&self.inner.replicas).contains_key(key);
        self.inner.metadata.read_local(|s| {
            let part = s
                .topics
                .get(&key.topic)
                .filter(|t| t.id == topic_id)
                .and_then(|t| t.partitions.get(key.partition as usize));
            retired_log_droppable(part.is_some(), followed, ranges, |first, last| {
                part.is_some_and(|p| p.is_archived(first, last))
            })
        })
    }
}
