//! The partition writers this agent runs: the supervisor that makes them match metadata
//! (every 250 ms, its first round as the API starts serving), a writer started on demand for
//! the partitions metadata gives this agent, stopped when it moves, and handed to another agent
//! when it cannot run here. Starting or stopping one locks only its partition ([`WriterSlot`]).

use super::*;

impl Agent {
    pub(super) async fn run_supervisor(&self) {
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
    pub(super) async fn supervise(&self) {
        let me = self.inner.config.agent_id.clone();
        let wanted: HashMap<PartitionKey, (u64, u64)> = self.inner.metadata.read_local(|s| {
            s.topics
                .values()
                .flat_map(|t| {
                    let me = &me;
                    t.partitions
                        .iter()
                        .enumerate()
                        .filter(move |(_, p)| p.writer.as_deref() == Some(me.as_str()))
                        .map(move |(i, p)| (PartitionKey::new(&t.name, i as u32), (t.id, p.epoch)))
                })
                .collect()
        });
        self.inner.metrics.partitions_written.set(wanted.len() as i64);
        self.export_replication_lag();
        self.drop_archived_retired_logs().await;
        self.trim_replicas().await;
        self.probe_unreachable();
        self.start_repair();
        let stale: Vec<PartitionKey> = crate::sync::read_lock(&self.inner.partitions)
            .iter()
            .filter(|(k, r)| wanted.get(*k) != Some(&(r.topic_id, r.epoch)))
            .map(|(k, _)| k.clone())
            .collect();
        // Writers that ended on their own (a failed write) are started again from disk. A slot
        // that is locked is starting or stopping its writer.
        let ended: Vec<PartitionKey> = lock(&self.inner.writers)
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
                    key.topic, key.partition
                ));
                let failure = StartFailure::after(failures.get(key), error);
                failures.insert(key.clone(), failure);
            }
        }
        let stale: Vec<PartitionKey> = stale.into_iter().chain(ended).collect();
        for PartitionKey { topic, partition } in stale {
            self.stop_writer(&topic, partition).await;
        }
        for PartitionKey { topic, partition } in wanted.keys() {
            if let Err(e) = self.partition(topic, *partition).await {
                warn!(topic, partition, error = %e.message, "cannot start the partition writer; will retry");
            }
        }
        self.hand_off_unreachable_partitions(&wanted).await;
        self.propose_rebalance().await;
        self.inner.metrics.housekeeping_rounds.inc();
    }

    /// Moves a partition this agent writes to another agent when this agent's copy of the
    /// state shows a rebalance off it is due (`MetadataState::rebalance_due`), at most once
    /// per lease: it stops the partition's writer first, so that no read is answered with its
    /// end from then on, then asks metadata to move it (`MoveWriter`), which decides again on
    /// the state it has. Only a partition's writer moves it away to balance the writers: one
    /// cut off from metadata keeps its partitions until its lease lapses, and stops answering
    /// for them before that (see [`Agent::lease_held`]), so no client reads an end of a
    /// partition another writer has gone past.
    pub(super) async fn propose_rebalance(&self) {
        let me = self.inner.config.agent_id.clone();
        let due = self.inner.metadata.read_local(|s| {
            let (topic, partition, _) = s.rebalance_due()?;
            let t = &s.topics[&topic];
            let p = &t.partitions[partition as usize];
            (p.writer.as_deref() == Some(me.as_str())).then_some((topic.clone(), t.id, partition, p.epoch))
        });
        let Some((topic, topic_id, partition, epoch)) = due else { return };
        if self.inner.cancel.is_cancelled() || !self.lease_held() {
            return;
        }
        {
            let mut proposed = lock(&self.inner.rebalance_proposed);
            if proposed.is_some_and(|at| at.elapsed() < self.inner.config.lease) {
                return;
            }
            *proposed = Some(Instant::now());
        }
        let key = PartitionKey::new(&topic, partition);
        // No writer starts for it at this epoch while the move is under way.
        lock(&self.inner.moving).insert(key.clone(), (epoch, Instant::now() + self.inner.config.lease));
        self.stop_writer(&topic, partition).await;
        let cmd = Command::MoveWriter {
            topic: topic.clone(),
            topic_id,
            partition,
            agent: me,
            epoch,
            now_ms: self.now_ms(),
        };
        match self.inner.metadata.write(cmd).await {
            Ok(Response::Writer { agent, epoch }) => {
                info!(topic, partition, to = %agent, epoch, "moved the partition to another agent to balance the writers");
                self.inner.metrics.writer_rebalances.inc();
            }
            Ok(other) => {
                warn!(topic, partition, answer = ?other, "moving the partition to another agent got an unexpected answer; writing it again");
                lock(&self.inner.moving).remove(&key);
            }
            // Another epoch is current: the partition moved already (a lease lapsed, or this
            // move was applied and its answer lost). The hold stays: no writer starts here
            // at the old epoch on a copy that does not show it yet.
            Err(e @ silt_metadata::MetadataError::Fenced { .. }) => {
                info!(topic, partition, reason = %e, "the partition has a newer writer already");
            }
            // Refused: the partition is this agent's again, and its writer starts.
            Err(e) if !e.is_retryable() => {
                info!(topic, partition, reason = %e, "metadata kept the partition here; writing it again");
                lock(&self.inner.moving).remove(&key);
            }
            // The move may have been applied (an answer lost): the copy tells within the hold.
            // A writer started here after it opens a segment under this epoch before it serves
            // anything: metadata refuses that if the partition moved, and refuses the move
            // once that segment is open.
            Err(e) => {
                warn!(topic, partition, error = %e, "moving the partition to another agent may have failed; unless this agent's copy of metadata shows it moved, it is written here again after a lease");
            }
        }
    }

    /// Whether a writer of `key` at `epoch` may not start now: this agent is moving it away.
    fn moving_away(&self, key: &PartitionKey, epoch: u64) -> bool {
        let mut moving = lock(&self.inner.moving);
        moving.retain(|_, (_, until)| Instant::now() < *until);
        moving.get(key).is_some_and(|(e, _)| *e == epoch)
    }

    /// Hands over the partitions whose writer has not run for a whole lease (it failed to
    /// start, or ended again and again) while live agents do not answer this one. Such an
    /// agent is cut off from the others but not from metadata: its lease holds, so nobody else
    /// would take its partitions, and it cannot reach the replicas it needs. Metadata names
    /// another live agent that this one did not find unreachable (preferring a holder of the
    /// open segment); if that one cannot write either, it hands over in turn.
    ///
    /// A partition whose local log this agent distrusts after a failed fsync (see
    /// [`crate::log::disk`]) is handed over at once, to any other live agent.
    pub(super) async fn hand_off_unreachable_partitions(&self, wanted: &HashMap<PartitionKey, (u64, u64)>) {
        let lease = self.inner.config.lease;
        let due: Vec<(PartitionKey, String, bool)> = {
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
            let (topic, partition) = (key.topic.clone(), key.partition);
            let epoch = wanted[&key].1;
            let cmd = Command::HandOffWriter {
                topic: topic.clone(),
                partition,
                agent: me.clone(),
                epoch,
                avoid: unreachable.clone(),
                now_ms: self.now_ms(),
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
    pub(super) fn writer_slot(&self, key: &PartitionKey) -> WriterSlot {
        Arc::clone(lock(&self.inner.writers).entry(key.clone()).or_default())
    }

    /// Stops a partition's writer and waits until it has answered everything queued.
    pub(super) async fn stop_writer(&self, topic: &str, partition: u32) {
        let key = PartitionKey::new(topic, partition);
        let slot = self.writer_slot(&key);
        let mut writer = slot.lock().await;
        let running = crate::sync::write_lock(&self.inner.partitions).remove(&key);
        if let Some(r) = running {
            // A read that has its handle answers with no end of the partition from now on.
            r.handle.end();
            // Its local log stays readable until everything in it is archived.
            let reader = Arc::clone(r.handle.reader());
            crate::sync::write_lock(&self.inner.retired).insert(key.clone(), (r.topic_id, reader));
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
    pub(super) async fn retire_cursors(&self, topic: &str, partition: u32) {
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
                epoch: Some(cursor.epoch()),
                floor,
                acked: acked.into_iter().take(silt_metadata::state::ACKED_RANGES_MAX).collect(),
            };
            match self.inner.metadata.write(cmd).await {
                Ok(_)
                | Err(
                    MetadataError::UnknownTopic(_)
                    | MetadataError::UnknownGroup(_)
                    | MetadataError::Fenced { .. },
                ) => {}
                Err(e) => {
                    warn!(error = %e, group, topic, partition, "checkpointing the acks of a partition this agent stopped writing failed; they are delivered again")
                }
            }
        }
    }

    /// The writer handle of a partition this agent writes, opening the local log and
    /// reconciling it with metadata on first use. A partition another agent writes is a
    /// `not_writer` error naming that agent.
    pub async fn partition(&self, topic: &str, partition: u32) -> Result<PartitionHandle, ApiError> {
        let key = PartitionKey::new(topic, partition);
        // The running writer if it matches metadata (topic id, writer, epoch: read without
        // copying the topic, this runs on every request), else the epoch to start one at.
        let decide = |agent: &Agent| -> Result<Result<PartitionHandle, u64>, ApiError> {
            // Read before the view: a refresh that lands between the two must not make an
            // older view pass for a current one.
            let as_of = agent.inner.metadata.current_as_of();
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
            let running = crate::sync::read_lock(&agent.inner.partitions)
                .get(&key)
                .filter(|r| r.topic_id == topic_id && r.epoch == epoch)
                .map(|r| r.handle.clone());
            if let Some(h) = running {
                // One that lost its write quorum answers nothing: a newer writer may have
                // acknowledged past its log's end already.
                agent.end_check(&h, topic, partition)?;
                agent.copy_check(as_of, topic, partition)?;
                return Ok(Ok(h));
            }
            if writer.as_deref() != Some(agent.inner.config.agent_id.as_str()) {
                return Err(agent.not_writer(topic, partition, writer.as_deref()));
            }
            Ok(Err(epoch))
        };
        match decide(self) {
            Ok(Ok(h)) => {
                self.lease_check(topic, partition)?;
                return Ok(h);
            }
            Ok(Err(_)) => self.lease_check(topic, partition)?,
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
            Ok(h) => {
                self.lease_check(topic, partition)?;
                return Ok(h);
            }
            Err(epoch) => epoch,
        };
        // No writer starts (and recovers the open segment) on a lease that may have lapsed.
        self.lease_check(topic, partition)?;
        if self.moving_away(&key, epoch) {
            return Err(ApiError::unavailable(format!(
                "agent '{}' is moving {topic}/{partition} to another agent to balance the writers; retry",
                self.id()
            )));
        }
        let t = self.topic_local(topic)?;
        if self.inner.cancel.is_cancelled() {
            return Err(ApiError::unavailable("the agent is shutting down"));
        }
        // A start that just failed (its open segment's replicas are not back yet) is not tried
        // again for every request: they get the same answer until the next attempt is due.
        if let Some(f) = lock(&self.inner.start_failures).get(&key) {
            if f.at.elapsed() < f.retry_after() {
                return Err(f.error.clone());
            }
        }
        let newer = crate::sync::read_lock(&self.inner.partitions)
            .get(&key)
            .is_some_and(|r| r.topic_id == t.id && r.epoch > epoch);
        if newer {
            return Err(ApiError::unavailable(format!(
                "partition {topic}/{partition}: this agent's metadata copy is behind its writer; retry"
            )));
        }
        // An older writer of this partition (earlier epoch or topic id) must be gone before
        // the log is opened again.
        crate::sync::write_lock(&self.inner.partitions).remove(&key);
        if let Some(old) = writer.take() {
            old.cancel.cancel();
            if let Err(e) = old.task.await {
                error!(topic, partition, error = %e, "partition writer panicked");
            }
        }
        let retired = crate::sync::write_lock(&self.inner.retired).remove(&key);
        // A replica this agent held as a follower is the writer's log now.
        if let Some(replica) = lock(&self.inner.replicas).remove(&key) {
            *lock(&replica) = None;
        }
        let dir = self.topic_dir(topic, t.id).join(partition.to_string());
        let log_dir = dir.clone();
        let opened = silt_metadata::runtime::spawn_blocking(move || PartitionLog::open(&log_dir))
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
                crate::sync::write_lock(&self.inner.retired).insert(key.clone(), retired);
            }
            e
        })?;
        let config = WriterConfig {
            agent_id: self.inner.config.agent_id.clone(),
            topic: topic.to_string(),
            topic_id: t.id,
            partition,
            topic_config: t.config.clone(),
            dir,
            instance: self.inner.instance.clone(),
            clock: Arc::clone(&self.inner.config.clock),
            replica_repair_after: self.inner.config.replica_repair_after,
            silent_waits: Arc::clone(&self.inner.silent_waits),
        };
        let cancel = self.inner.cancel.child_token();
        let reader = log.reader();
        let (handle, task) = writer::start(
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
            crate::sync::write_lock(&self.inner.retired).insert(key.clone(), (t.id, reader));
            e
        })?;
        if let Some(f) = lock(&self.inner.start_failures).get_mut(&key) {
            f.started = Some(Instant::now());
        }
        *writer = Some(WriterTask { cancel, task });
        crate::sync::write_lock(&self.inner.partitions).insert(
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

    /// Asks each live agent this one found unreachable, for at least [`PROBE_AFTER`], whether
    /// it answers again, at most every [`PROBE_INTERVAL`]: ensemble choice and repair leave
    /// unreachable agents out, and a link that is back should count soon, not once the mark
    /// runs out. The mark lasts at least [`PROBE_AFTER`] all the same: an agent that timed out
    /// on appends (a stalled disk) may still answer a probe, and is not chosen again at once.
    fn probe_unreachable(&self) {
        let me = self.inner.config.agent_id.as_str();
        let now_ms = self.now_ms();
        let due: Vec<(String, String)> = self.inner.metadata.read_local(|s| {
            s.agents
                .values()
                .filter(|a| a.id != me && a.is_live(now_ms))
                .filter(|a| {
                    self.inner.peers.unreachable_since(&a.id).is_some_and(|t| t.elapsed() >= PROBE_AFTER)
                })
                .map(|a| (a.id.clone(), a.addr.clone()))
                .collect()
        });
        let mut probed = lock(&self.inner.probed);
        probed.retain(|id, at| at.elapsed() < PROBE_INTERVAL && due.iter().any(|(d, _)| d == id));
        for (id, addr) in due {
            if probed.contains_key(&id) {
                continue;
            }
            probed.insert(id.clone(), Instant::now());
            let peers = self.inner.peers.clone();
            tokio::spawn(async move { peers.probe((&id, &addr)).await });
        }
    }
}
