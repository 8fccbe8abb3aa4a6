//! Consumer groups: polls (on this agent's partitions, and asked of the writers of the others),
//! heartbeats, acks, dead letters, and the checkpoints of the delivery state to metadata.

use super::*;

impl Agent {
    /// Long-polls for messages on behalf of a group member.
    pub async fn poll(&self, req: PollRequest) -> Result<Vec<Delivered>, ApiError> {
        if req.max == 0 || req.max > POLL_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidMax,
                format!("max must be between 1 and {POLL_MAX}, got {}", req.max),
            ));
        }
        check_max_bytes(req.max_bytes)?;
        if req.timeout > POLL_TIMEOUT_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidTimeout,
                format!("timeout may be at most {}s", POLL_TIMEOUT_MAX.as_secs()),
            ));
        }
        if req.session_timeout < Duration::from_secs(1) || req.session_timeout > SESSION_TIMEOUT_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidSessionTimeout,
                format!("session timeout must be between 1s and {}s", SESSION_TIMEOUT_MAX.as_secs()),
            ));
        }
        let topic = self.topic_info(&req.topic).await?;
        let deadline = Instant::now() + req.timeout;
        loop {
            self.heartbeat(&req).await?;
            let partitions = self.assigned_partitions(&req, topic.partitions);
            let notified = self.inner.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (delivered, local, remote) = self.collect_everywhere(&req, &topic, &partitions).await?;
            if !delivered.is_empty() || Instant::now() >= deadline {
                return Ok(delivered);
            }
            // Wake on new data, on the next lease expiry, or at the deadline (at least every second
            // so that assignment changes are seen, and often when other agents write some of the
            // partitions: their new data does not wake this agent). Only the leases of the
            // partitions served here count: one whose writer cannot start keeps its expired
            // leases until it does, and must not wake the poll at once, again and again.
            let every = if remote { REMOTE_POLL_INTERVAL } else { Duration::from_secs(1) };
            let mut wake = deadline.min(Instant::now() + every);
            if let Some(d) = self.earliest_deadline(&req, &local) {
                let now = self.lease_clock_ms();
                let until = Duration::from_millis(d.saturating_sub(now)).max(LEASE_WAKE_MIN);
                wake = wake.min(Instant::now() + until);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = self.inner.draining.cancelled() => return Ok(Vec::new()),
            }
        }
    }

    /// Delivers from the partitions this agent writes, and asks the writers of the others.
    /// Returns what was delivered, the partitions served here, and whether any partition is
    /// written elsewhere.
    async fn collect_everywhere(
        &self,
        req: &PollRequest,
        topic: &TopicInfo,
        partitions: &[u32],
    ) -> Result<(Vec<Delivered>, Vec<u32>, bool), ApiError> {
        let mut local = Vec::new();
        let mut remote: BTreeMap<(String, String), Vec<u32>> = BTreeMap::new();
        let mut unavailable = None;
        for &p in partitions {
            match self.target(&req.topic, p, false).await {
                Ok(Target::Local(_)) => local.push(p),
                Ok(Target::Remote { agent, addr }) => remote.entry((agent, addr)).or_default().push(p),
                // One partition that cannot be served (its writer is starting, or waiting for
                // the agent that holds its open segment) does not hold up the others.
                Err(e) => {
                    warn!(topic = %req.topic, partition = p, error = %e.message, "skipping a partition in a poll");
                    unavailable.get_or_insert(e);
                }
            }
        }
        if let Some(e) = unavailable.filter(|_| local.is_empty() && remote.is_empty()) {
            return Err(e);
        }
        let budget = ReadLimit::new(req.max as usize, req.max_bytes);
        let mut delivered = self.collect(req, topic, &local, budget).await?;
        for ((agent, addr), partitions) in &remote {
            let used: usize = delivered.iter().map(|d| d.record.data_len()).sum();
            let rest = budget.rest(delivered.len(), used);
            if rest.is_spent() {
                break;
            }
            let ask = CollectRequest {
                group: req.group.clone(),
                member: req.member.clone(),
                mode: req.mode,
                partitions: partitions.clone(),
                max: rest.records as u32,
                max_bytes: rest.bytes,
                at_least_one: rest.at_least_one,
            };
            self.count_forwarded("collect");
            match self.inner.peers.collect((agent, addr), &req.topic, &ask).await {
                Ok(got) => delivered.extend(got),
                // What was delivered elsewhere already is returned; the rest of the member's
                // partitions are tried on the next poll.
                Err(e) if !delivered.is_empty() => {
                    warn!(agent = %agent, error = %e, "collecting from another agent failed");
                }
                Err(e) => return Err(e),
            }
        }
        Ok((delivered, local, !remote.is_empty()))
    }

    /// Delivers messages of partitions this agent writes to a member polling through another
    /// agent (which sent the group heartbeat already). Does not wait.
    pub async fn collect_for_peer(
        &self,
        topic: &str,
        ask: CollectRequest,
    ) -> Result<Vec<WireRecord>, ApiError> {
        if ask.max == 0 || ask.max > POLL_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidMax,
                format!("max must be between 1 and {POLL_MAX}"),
            ));
        }
        if ask.max_bytes > READ_BYTES_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidMaxBytes,
                format!("max_bytes may be at most {READ_BYTES_MAX}"),
            ));
        }
        let t = self.topic_info(topic).await?;
        let req = PollRequest {
            topic: topic.to_string(),
            group: ask.group,
            member: ask.member,
            mode: ask.mode,
            max: ask.max,
            max_bytes: ask.max_bytes,
            timeout: Duration::ZERO,
            session_timeout: SESSION_TIMEOUT_MAX,
        };
        let budget =
            ReadLimit { records: ask.max as usize, bytes: ask.max_bytes, at_least_one: ask.at_least_one };
        let delivered = self.collect(&req, &t, &ask.partitions, budget).await?;
        Ok(delivered.iter().map(|d| WireRecord::new(d.partition, &d.record, d.delivery)).collect())
    }

    async fn heartbeat(&self, req: &PollRequest) -> Result<(), ApiError> {
        let key = (req.group.clone(), req.topic.clone(), req.member.clone());
        let due = lock(&self.inner.heartbeats)
            .get(&key)
            .is_none_or(|last| last.elapsed() >= req.session_timeout / 3);
        if due {
            self.inner
                .metadata
                .write(Command::JoinGroup {
                    group: req.group.clone(),
                    topic: req.topic.clone(),
                    member: req.member.clone(),
                    mode: req.mode,
                    session_timeout_ms: req.session_timeout.as_millis() as u64,
                    now_ms: self.now_ms(),
                })
                .await?;
            let mut heartbeats = lock(&self.inner.heartbeats);
            // Members that vanished without leaving would otherwise stay here forever.
            heartbeats.retain(|_, last| last.elapsed() < SESSION_TIMEOUT_MAX);
            heartbeats.insert(key, Instant::now());
        }
        Ok(())
    }

    /// Leaves a group so that its partitions go to the remaining members at once.
    pub async fn leave(&self, group: &str, topic: &str, member: &str) -> Result<(), ApiError> {
        lock(&self.inner.heartbeats).remove(&(group.to_string(), topic.to_string(), member.to_string()));
        self.inner
            .metadata
            .write(Command::LeaveGroup { group: group.into(), topic: topic.into(), member: member.into() })
            .await?;
        Ok(())
    }

    fn assigned_partitions(&self, req: &PollRequest, count: u32) -> Vec<u32> {
        match req.mode {
            GroupMode::Shared => (0..count).collect(),
            GroupMode::Exclusive => self.inner.metadata.read_local(|s| {
                s.groups
                    .get(&req.group)
                    .and_then(|g| g.topics.get(&req.topic))
                    .map(|gt| {
                        gt.assignment.iter().filter(|(_, m)| **m == req.member).map(|(p, _)| *p).collect()
                    })
                    .unwrap_or_default()
            }),
        }
    }

    fn earliest_deadline(&self, req: &PollRequest, partitions: &[u32]) -> Option<u64> {
        let cursors = lock(&self.inner.cursors);
        partitions
            .iter()
            .filter_map(|p| cursors.get(&(req.group.clone(), req.topic.clone(), *p)))
            .filter_map(|c| c.earliest_deadline_ms())
            .min()
    }

    /// The delivery state of `group` on a partition this agent writes at `epoch`, from the
    /// checkpoint in this agent's copy of metadata: a copy that shows this agent as the writer
    /// at `epoch` holds every checkpoint an earlier writer's cursor got in (those of later
    /// ones are refused, `CommitAcks`'s epoch).
    fn load_cursor(
        &self,
        group: &str,
        topic: &TopicInfo,
        (partition, epoch): (u32, u64),
        log_start: u64,
    ) -> GroupCursor {
        let (floor, acked) = self.inner.metadata.read_local(|s| {
            s.groups
                .get(group)
                .and_then(|g| g.topics.get(&topic.name))
                .and_then(|gt| gt.acks.get(&partition))
                .map(|cp| (cp.floor, cp.acked.clone()))
                .unwrap_or_default()
        });
        GroupCursor::from_checkpoint(topic.id, epoch, floor, &acked, log_start)
    }

    /// Delivers what `budget` allows from `partitions` (all written here) to a member.
    async fn collect(
        &self,
        req: &PollRequest,
        topic: &TopicInfo,
        partitions: &[u32],
        budget: ReadLimit,
    ) -> Result<Vec<Delivered>, ApiError> {
        let max = budget.records;
        let mut used = 0usize;
        let visibility_ms = topic.config.visibility_timeout_ms;
        let mut out: Vec<Delivered> = Vec::new();
        if partitions.is_empty() {
            return Ok(out);
        }
        let start = self.inner.spread.fetch_add(1, Ordering::Relaxed) as usize % partitions.len();
        let order: Vec<u32> = partitions.iter().cycle().skip(start).take(partitions.len()).copied().collect();
        for &p in &order {
            let rest = budget.rest(out.len(), used);
            if rest.is_spent() {
                break;
            }
            let handle = match self.partition(&req.topic, p).await {
                Ok(handle) => handle,
                // Its writer here ended since the partitions were chosen: what this poll took
                // from others is answered, and this one is polled again next time.
                Err(e) if !out.is_empty() => {
                    warn!(topic = %req.topic, partition = p, error = %e.message, "a partition left this poll");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let reader = Arc::clone(handle.reader());
            let key: CursorKey = (req.group.clone(), req.topic.clone(), p);
            // Phase 1: under the lock, decide redeliveries and dead letters.
            let now = self.lease_clock_ms();
            let picked = {
                let mut cursors = lock(&self.inner.cursors);
                let earliest = self.earliest_offset(&req.topic, p, reader.log_start());
                let epoch = handle.epoch();
                let same_topic = |c: &GroupCursor| c.topic_id() == topic.id;
                // A writer of a newer epoch started here while this poll held the older one's
                // handle: its cursor is not this poll's to touch.
                let newer = cursors.get(&key).is_some_and(|c| same_topic(c) && c.epoch() > epoch);
                if cursors.get(&key).is_some_and(|c| !same_topic(c) || c.epoch() < epoch) {
                    // The topic was deleted and created again: its old delivery state is gone.
                    // Or the writer started again under a new epoch: the state is loaded again
                    // from the checkpoints (another writer may have delivered meanwhile).
                    cursors.remove(&key);
                }
                (!newer).then(|| {
                    let cursor = cursors
                        .entry(key.clone())
                        .or_insert_with(|| self.load_cursor(&req.group, topic, (p, epoch), earliest));
                    let expired = cursor.expired(now, topic.config.max_deliveries, max - out.len());
                    for e in &expired {
                        if let Expired::Redeliver { offset, .. } = e {
                            cursor.redeliver(*offset, now + visibility_ms);
                        }
                    }
                    (expired, cursor.has_room().then_some(cursor.next_offset()))
                })
            };
            let Some((expired, next_offset)) = picked else { continue };
            // Phase 2: read what phase 1 picked, and new messages, without the lock. A message
            // picked for redelivery that does not fit in what is left of the poll's bytes is
            // handed back, due again at once, and so is every one picked after it.
            let mut room = true;
            for e in expired {
                match e {
                    Expired::Redeliver { offset, .. } if !room => release(&self.inner.cursors, &key, offset),
                    Expired::Redeliver { offset, deliveries } => {
                        match self.read_one(&req.topic, p, offset).await? {
                            Some(record) if budget.admits(out.len(), used, &record) => {
                                used += record.data_len();
                                out.push(Delivered { partition: p, record, delivery: deliveries });
                            }
                            Some(_) => {
                                room = false;
                                release(&self.inner.cursors, &key, offset);
                            }
                            None => self.forget_if_gone(&key, offset),
                        }
                    }
                    Expired::DeadLetter { offset, deliveries } => {
                        self.dead_letter(req, topic, p, offset, deliveries).await;
                    }
                }
            }
            let Some(next_offset) = next_offset else { continue };
            if out.len() >= max || next_offset >= reader.high_watermark() {
                continue;
            }
            let rest = budget.rest(out.len(), used);
            if rest.is_spent() {
                continue;
            }
            let (records, _, _) = self.read(&req.topic, p, next_offset, rest, true).await?;
            // Phase 3: deliver what nobody else took meanwhile.
            let mut cursors = lock(&self.inner.cursors);
            let Some(cursor) = cursors.get_mut(&key) else { continue };
            let deadline = self.lease_clock_ms() + visibility_ms;
            for record in records {
                if out.len() >= max || !cursor.has_room() {
                    break;
                }
                if record.offset < cursor.next_offset() {
                    continue;
                }
                if !cursor.wants(record.offset) {
                    cursor.skip_to(record.offset + 1);
                    continue;
                }
                cursor.skip_to(record.offset);
                cursor.deliver(record.offset, deadline);
                used += record.data_len();
                out.push(Delivered { partition: p, record, delivery: 1 });
            }
        }
        Ok(out)
    }

    /// A message in flight whose offset no longer exists (deleted by retention, or declared
    /// lost: `Location::Gone`) is done with: nothing is left to deliver or dead-letter, and
    /// kept in flight it would hold the group's checkpoint back for good.
    fn forget_if_gone(&self, key: &CursorKey, offset: u64) {
        let gone = self
            .with_partition(&key.1, key.2, |part| matches!(locate(part, offset), Location::Gone { .. }))
            .unwrap_or(false);
        if !gone {
            return;
        }
        if let Some(c) = lock(&self.inner.cursors).get_mut(key) {
            c.ack(offset);
            info!(group = %key.0, topic = %key.1, partition = key.2, offset, "a message in flight is gone from the partition (deleted or declared lost); the group is done with it");
        }
    }

    async fn read_one(&self, topic: &str, partition: u32, offset: u64) -> Result<Option<Record>, ApiError> {
        let (records, _, _) = self.read(topic, partition, offset, ReadLimit::new(1, 1), true).await?;
        Ok(records.into_iter().find(|r| r.offset == offset))
    }

    async fn dead_letter(
        &self,
        req: &PollRequest,
        topic: &TopicInfo,
        partition: u32,
        offset: u64,
        deliveries: u32,
    ) {
        let result: Result<(), ApiError> = async {
            let dlq = format!("{}{DLQ_SUFFIX}", topic.name);
            if self.topic_local(&dlq).is_err() {
                match self.create_topic(&dlq, topic.partitions, BTreeMap::new()).await {
                    Ok(_) => {}
                    Err(e) if e.code == ErrorCode::TopicExists => {}
                    Err(e) => return Err(e),
                }
            }
            let Some(record) = self.read_one(&topic.name, partition, offset).await? else {
                self.forget_if_gone(&(req.group.clone(), topic.name.clone(), partition), offset);
                return Ok(());
            };
            let id = MessageId::new(topic.name.clone(), partition, offset);
            let mut headers = record.headers.clone();
            headers.push(Header { key: "silt.original.id".into(), value: Some(Bytes::from(id.to_string())) });
            headers.push(Header { key: "silt.group".into(), value: Some(Bytes::from(req.group.clone())) });
            headers.push(Header {
                key: "silt.deliveries".into(),
                value: Some(Bytes::from(deliveries.to_string())),
            });
            let message = ProduceMessage {
                partition: Some(partition),
                key: record.key.clone(),
                value: record.value.clone(),
                headers,
                timestamp_ms: Some(record.timestamp_ms),
            };
            self.produce(&dlq, vec![message]).await?;
            let key: CursorKey = (req.group.clone(), topic.name.clone(), partition);
            if let Some(c) = lock(&self.inner.cursors).get_mut(&key) {
                c.ack(offset);
            }
            self.inner.metrics.dead_lettered.get_or_create(&Metrics::topic(&topic.name)).inc();
            info!(%id, group = %req.group, deliveries, "moved to the dead-letter topic");
            Ok(())
        }
        .await;
        if let Err(e) = result {
            warn!(error = %e, topic = %topic.name, partition, offset, "moving a message to the dead-letter topic failed; will retry");
        }
    }

    /// Acknowledges messages for a group. All ids are checked first: if any is malformed or was
    /// never delivered to the group, nothing is acknowledged.
    ///
    /// Ids of partitions other agents write are acknowledged there. Every id is checked
    /// (everywhere) before any is acknowledged, so a request with a bad id changes nothing;
    /// `dry_run` only checks.
    pub async fn ack(
        &self,
        group: &str,
        ids: &[String],
        dry_run: bool,
        forwarded: bool,
    ) -> Result<usize, ApiError> {
        if ids.is_empty() || ids.len() > ACK_IDS_MAX {
            return Err(ApiError::new(
                ErrorCode::InvalidAck,
                format!("an ack request needs between 1 and {ACK_IDS_MAX} ids"),
            ));
        }
        // Ids by partition: where each partition is written is looked up once per request.
        let mut by_partition: BTreeMap<PartitionKey, Vec<(u64, &String)>> = BTreeMap::new();
        for id in ids {
            let parsed: MessageId = id.parse().map_err(|e: silt_record::MessageIdError| {
                ApiError::new(ErrorCode::InvalidId, e.to_string())
            })?;
            by_partition
                .entry(PartitionKey { topic: parsed.topic, partition: parsed.partition })
                .or_default()
                .push((parsed.offset, id));
        }
        let mut local: Vec<(PartitionKey, Vec<u64>)> = Vec::new();
        let mut remote: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (PartitionKey { topic, partition }, offsets) in by_partition {
            match self.target(&topic, partition, forwarded).await? {
                Target::Local(_) => {
                    local.push((PartitionKey { topic, partition }, offsets.iter().map(|(o, _)| *o).collect()))
                }
                Target::Remote { agent, addr } => remote
                    .entry((agent, addr))
                    .or_default()
                    .extend(offsets.into_iter().map(|(_, id)| id.clone())),
            }
        }
        self.ack_local(group, &local, true)?;
        for ((agent, addr), ids) in &remote {
            self.inner.peers.ack((agent, addr), group, ids, true).await?;
        }
        if dry_run {
            return Ok(0);
        }
        let mut acked = self.ack_local(group, &local, false)?;
        for ((agent, addr), ids) in &remote {
            self.count_forwarded("ack");
            acked += self.inner.peers.ack((agent, addr), group, ids, false).await?;
        }
        Ok(acked)
    }

    /// Checks (`dry_run`) or acknowledges offsets of partitions this agent writes.
    fn ack_local(
        &self,
        group: &str,
        local: &[(PartitionKey, Vec<u64>)],
        dry_run: bool,
    ) -> Result<usize, ApiError> {
        let mut cursors = lock(&self.inner.cursors);
        for (PartitionKey { topic, partition }, offsets) in local {
            let cursor = cursors.get(&(group.to_string(), topic.clone(), *partition));
            for offset in offsets {
                let outcome = cursor.map(|c| c.check_ack(*offset));
                if outcome.is_none_or(|o| o == AckOutcome::NotDelivered) {
                    // Not in memory: acked before a restart counts as acknowledged.
                    let acked_before = self.inner.metadata.read_local(|s| {
                        s.groups
                            .get(group)
                            .and_then(|g| g.topics.get(topic))
                            .and_then(|gt| gt.acks.get(partition))
                            .is_some_and(|cp| cp.is_acked(*offset))
                    });
                    if !acked_before {
                        let id = MessageId { topic: topic.clone(), partition: *partition, offset: *offset };
                        return Err(ApiError::new(
                            ErrorCode::NotDelivered,
                            format!("message {id} was never delivered to group '{group}'; only delivered messages can be acknowledged"),
                        ));
                    }
                }
            }
        }
        if dry_run {
            return Ok(0);
        }
        let mut acked = 0;
        for (PartitionKey { topic, partition }, offsets) in local {
            if let Some(c) = cursors.get_mut(&(group.to_string(), topic.clone(), *partition)) {
                acked += offsets.iter().filter(|o| c.ack(**o) == AckOutcome::Acked).count();
            }
        }
        Ok(acked)
    }

    /// Lag and delivery state of a group, per topic and partition.
    pub async fn describe_group(
        &self,
        group: &str,
    ) -> Result<(GroupMode, BTreeMap<String, Vec<PartitionLag>>, BTreeMap<String, Vec<String>>), ApiError>
    {
        let g = self
            .inner
            .metadata
            .read(|s| s.groups.get(group).cloned())
            .await?
            .ok_or_else(|| MetadataError::UnknownGroup(group.to_string()))?;
        let mut out = BTreeMap::new();
        let mut members = BTreeMap::new();
        for (topic, gt) in &g.topics {
            let Ok(t) = self.topic_local(topic) else { continue };
            let mut lags = Vec::new();
            for p in 0..t.partitions.len() as u32 {
                let hwm = self.high_watermark(topic, p).await?;
                let (floor, in_flight) =
                    match lock(&self.inner.cursors).get(&(group.to_string(), topic.clone(), p)) {
                        Some(c) => (c.floor(), c.in_flight_len()),
                        None => (gt.acks.get(&p).map_or(0, |cp| cp.floor), 0),
                    };
                lags.push(PartitionLag {
                    partition: p,
                    member: gt.assignment.get(&p).cloned(),
                    ack_floor: floor,
                    high_watermark: hwm,
                    lag: hwm.saturating_sub(floor),
                    in_flight,
                });
            }
            out.insert(topic.clone(), lags);
            members.insert(topic.clone(), gt.members.keys().cloned().collect());
        }
        Ok((g.mode, out, members))
    }

    pub(super) async fn run_checkpointer(&self) {
        let mut tick = tokio::time::interval(CHECKPOINT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => break,
                _ = tick.tick() => self.checkpoint_acks().await,
            }
        }
    }

    /// Writes every changed ack state to metadata and refreshes the lag gauges.
    pub async fn checkpoint_acks(&self) {
        let dirty: Vec<Checkpoint> = lock(&self.inner.cursors)
            .iter_mut()
            .filter(|(_, c)| c.is_dirty())
            .map(|(k, c)| {
                let (floor, acked) = c.take_checkpoint();
                (k.clone(), (c.topic_id(), c.epoch()), floor, acked)
            })
            .collect();
        for ((group, topic, partition), (topic_id, epoch), floor, acked) in dirty {
            let hwm = crate::sync::read_lock(&self.inner.partitions)
                .get(&PartitionKey::new(&topic, partition))
                .map(|r| r.handle.reader().high_watermark());
            if let Some(hwm) = hwm {
                self.inner
                    .metrics
                    .consumer_lag_records
                    .get_or_create(&LagLabels { group: group.clone(), topic: topic.clone(), partition })
                    .set(hwm.saturating_sub(floor) as i64);
            }
            let acked: Vec<(u64, u64)> =
                acked.into_iter().take(silt_metadata::state::ACKED_RANGES_MAX).collect();
            let cmd = Command::CommitAcks {
                group: group.clone(),
                topic: topic.clone(),
                topic_id: Some(topic_id),
                partition,
                epoch: Some(epoch),
                floor,
                acked,
            };
            match self.inner.metadata.write(cmd).await {
                Ok(_) => {}
                // The topic or group is gone, or was created again, or another writer took the
                // partition (its cursor carries on): this state is stale.
                Err(
                    MetadataError::UnknownTopic(_)
                    | MetadataError::UnknownGroup(_)
                    | MetadataError::InvalidArgument(_)
                    | MetadataError::Fenced { .. },
                ) => {
                    let mut cursors = lock(&self.inner.cursors);
                    if cursors
                        .get(&(group.clone(), topic.clone(), partition))
                        .is_some_and(|c| c.topic_id() == topic_id && c.epoch() == epoch)
                    {
                        cursors.remove(&(group, topic, partition));
                    }
                }
                Err(e) => {
                    warn!(error = %e, group, topic, partition, "checkpointing acks failed; will retry");
                    if let Some(c) = lock(&self.inner.cursors).get_mut(&(group, topic, partition)) {
                        c.mark_dirty();
                    }
                }
            }
        }
    }
}
