//! A writer's start: the fence raised to its epoch, the local log cut back to what metadata
//! recorded, and the segment that was open recovered (the members fenced, their answers
//! planned by [`crate::replication::recovery::plan`], the longest tail copied) and sealed.

use super::*;

impl PartitionWriter {
    /// Every start is a writer change (a new epoch): the fence of the local replica is raised
    /// to it, the local log is cut back to what metadata recorded, the segment that was open
    /// is recovered and sealed, and a new segment is opened with a new ensemble.
    pub(super) async fn reconcile(&mut self) -> Result<(), StoreError> {
        let (topic, partition) = (self.config.topic.clone(), self.config.partition);
        let dir = self.config.dir.clone();
        let epoch = self.epoch;
        let fence = silt_metadata::runtime::spawn_blocking(move || -> Result<u64, StoreError> {
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
        // Only the topic this writer was started for: one deleted and created again under its
        // name has a chain of its own, which says nothing about this directory.
        let topic_id = self.config.topic_id;
        let meta = self
            .metadata
            .read(|s| {
                s.topic(&topic)
                    .map(|t| t.partitions.get(partition as usize).filter(|_| t.id == topic_id).cloned())
            })
            .await??
            .ok_or_else(|| {
                StoreError::Metadata(silt_metadata::MetadataError::UnknownPartition {
                    topic: topic.clone(),
                    partition,
                })
            })?;
        if let Some(open) = meta.open_segment().filter(|open| open.epoch >= epoch) {
            // A writer of this epoch ended here without sealing its segment (a write of its
            // own failed): its followers may hold a group this log does not, at the same
            // offsets under the same epoch. Recovered and continued under that epoch, a
            // segment opened at one of those offsets would be taken for theirs, and what
            // they hold for what was acknowledged. The segment is recovered under a new epoch.
            let base_offset = open.base_offset;
            warn!(
                base_offset,
                epoch,
                "the open segment was written under this writer's epoch; taking a new one to recover it"
            );
            self.abandon().await;
            return Err(StoreError::Metadata(silt_metadata::MetadataError::Fenced {
                expected: epoch,
                actual: epoch + 1,
            }));
        }
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
    /// members that hold the sealed range (`recovery::sealed_members`); one that did not
    /// answer is no longer a holder, and repair copies the segment to others, but it stays
    /// named as unverified: reads turn to it when no holder answers.
    pub(super) async fn recover(&mut self, open: &Segment) -> Result<(), StoreError> {
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
                    (m.clone(), r.map_err(|e| (e.message, e.code == crate::error::ErrorCode::DiskFailed)))
                }
            })
            .collect();
        let mut held: Vec<(String, HeldSegment)> = Vec::new();
        let mut missing: Vec<(String, String)> = Vec::new();
        let mut lost: Vec<String> = Vec::new();
        // Members that answered that their disk failed under the partition: they take no copy
        // before they restart (this process distrusts their logs).
        let mut disk_failed: Vec<String> = Vec::new();
        let mut classify = |m: String,
                            answer: Result<HeldSegment, (String, bool)>,
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
                Err((e, failed)) => {
                    if failed {
                        disk_failed.push(m.clone());
                    }
                    missing.push((m, e));
                }
            }
        };
        if members.contains(&me) {
            let local = HeldSegment::of(self.log(), base, open.epoch, &self.config.instance)
                .map_err(|e| (e.to_string(), matches!(e, StoreError::DiskDistrusted { .. })));
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
                    unverified: Vec::new(),
                };
                self.metadata.write(self.seal_command(&empty)).await?;
                return Ok(());
            }
            crate::replication::recovery::Plan::Seal { source, end, holding, copy_to } => {
                match held.iter().find(|(m, _)| *m == me) {
                    Some((_, mine)) if crate::sim_bugs::on(Bug::ReuseOffsetAfterCrash) => (
                        me.clone(),
                        mine.end_offset,
                        held.iter().map(|(m, _)| m.clone()).collect(),
                        Vec::new(),
                    ),
                    _ => (source, end, holding, copy_to),
                }
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
        let repair_after_ms = self.config.replica_repair_after.as_millis() as u64;
        // Members that did not answer (an error, or no answer in time) and may still come
        // back with their copies: not one whose disk failed under the partition (it takes no
        // copy before it restarts), nor this agent. Each with how long recoveries of this
        // segment have waited for it, by metadata's clock (`None`: none waited yet); and whom
        // metadata records as waited for.
        let (silent, recorded) = self.metadata.read_local(|s| {
            let seg = s
                .topics
                .get(&topic)
                .and_then(|t| t.partitions.get(partition as usize))
                .and_then(|p| p.segments.get(&base))
                .filter(|seg| {
                    seg.state == silt_metadata::state::SegmentState::Open && seg.epoch == open.epoch
                });
            let silent: Vec<(String, Option<u64>)> = members
                .iter()
                .enumerate()
                .filter(|(_, m)| {
                    **m != me
                        && !held.iter().any(|(h, _)| h == *m)
                        && !lost.contains(m)
                        && !disk_failed.contains(m)
                })
                .filter(|(i, m)| {
                    let recorded = open.instances.get(*i).map_or("", String::as_str);
                    crate::replication::recovery::may_come_back(
                        s.agents.get(*m),
                        recorded,
                        s.clock_ms,
                        repair_after_ms,
                    )
                })
                .map(|(_, m)| {
                    let since = seg.and_then(|seg| seg.silent_since_ms.get(m));
                    (m.clone(), since.map(|since| s.clock_ms.saturating_sub(*since)))
                })
                .collect();
            let recorded: Vec<String> =
                seg.map(|seg| seg.silent_since_ms.keys().cloned().collect()).unwrap_or_default();
            (silent, recorded)
        });
        let key: crate::replication::recovery::OpenSegmentKey = (topic.clone(), partition, base, open.epoch);
        let names: Vec<String> = silent.iter().map(|(m, _)| m.clone()).collect();
        let here = self.config.silent_waits.waiting(&key, &names);
        // A member is waited for until either record of the wait for it (metadata's, or this
        // process's when metadata's could not be written) reaches --replica-repair-after: one
        // that stays live without answering (cut off from the agents, not from metadata) holds
        // the tail up no longer, whichever agent recovers it.
        let coming_back: Vec<(String, u64)> = silent
            .iter()
            .map(|(m, in_metadata)| {
                let waited = in_metadata.unwrap_or(0).max(here.get(m).map_or(0, |d| d.as_millis() as u64));
                (m.clone(), waited)
            })
            .filter(|(_, waited)| *waited < repair_after_ms)
            .collect();
        if !crate::replication::recovery::enough_holders(
            w,
            held.len(),
            holders,
            !coming_back.is_empty(),
            base,
            end,
        ) {
            let why = if coming_back.is_empty() {
                String::new()
            } else {
                // Metadata records whom recoveries of this segment wait for, and since when,
                // unless it holds that already.
                let mut wanted = names.clone();
                wanted.sort();
                if wanted != recorded {
                    let command = Command::WaitForSilentMembers {
                        topic: topic.clone(),
                        topic_id: self.config.topic_id,
                        partition,
                        base_offset: base,
                        segment_epoch: open.epoch,
                        silent: wanted,
                        now_ms: self.config.clock.now_ms(),
                    };
                    if let Err(e) = self.metadata.write(command).await {
                        warn!(base_offset = base, error = %e, "recording whom the recovery waits for failed");
                    }
                }
                let left = coming_back.iter().map(|(_, waited)| repair_after_ms - waited).max().unwrap_or(0);
                format!(
                    "; waiting for agent(s) {} to come back with their copies, for up to {:.1}s more (--replica-repair-after)",
                    coming_back.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>().join(", "),
                    left as f64 / 1000.0
                )
            };
            return Err(StoreError::NotEnoughReplicas(format!(
                "partition {topic}/{partition}: the recovered tail of segment {base} is on {holders} replica(s), \
                 min.insync.replicas is {w}{why}; retrying"
            )));
        }
        if !silent.is_empty() && holders < w {
            warn!(
                base_offset = base,
                silent = %names.join(", "),
                "the recovered tail is on fewer than min.insync.replicas members; sealing it after waiting --replica-repair-after for the members that did not answer"
            );
        }
        // Members that did not answer, or that a copy failed to reach, are not holders; they
        // stay named as unverified: one may hold what no holder will once a disk is lost.
        let (replicas, unverified) = crate::replication::recovery::sealed_members(members, &holding, &lost);
        if !unverified.is_empty() {
            warn!(
                base_offset = base,
                unverified = %unverified.join(", "),
                "sealing the open segment without hearing from every member; those are asked again when no holder answers"
            );
        }
        let summary = SealedSummary {
            base_offset: base,
            record_count: end - base,
            size_bytes: best.size_bytes,
            min_timestamp_ms: best.min_timestamp_ms,
            max_timestamp_ms: best.max_timestamp_ms,
            replicas,
            unverified,
        };
        self.metadata.write(self.seal_command(&summary)).await?;
        self.config.silent_waits.sealed(&key);
        info!(base_offset = base, end, replicas = holders, from = %source, "recovered and sealed the open segment");
        Ok(())
    }

    /// Copies the batches `[from, end)` of a segment from replica `source` to replica `dest`
    /// (either may be this agent's own log).
    pub(super) async fn copy_tail(
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
                silt_metadata::runtime::spawn_blocking(move || reader.read(next, REPLICA_READ_BYTES_MAX))
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
}
