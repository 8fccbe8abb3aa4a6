//! A writer's segments: opening one with its ensemble, rolling on size, age or a better
//! ensemble, sealing, and trimming local copies of archived segments.

use super::*;

impl PartitionWriter {
    /// Opens a segment at the log's end with a new ensemble (this agent and R - 1 live
    /// agents, the least busy first) and starts streaming to it.
    pub(super) async fn open_segment(&mut self) -> Result<(), StoreError> {
        self.ensemble = None;
        let base = self.log().next_offset();
        let (ensemble, instances) = self.choose_ensemble()?;
        let members = match self.metadata.write(self.open_command(base, ensemble.clone(), instances)).await {
            Ok(_) => ensemble,
            Err(silt_metadata::MetadataError::InvalidArgument(reason)) => {
                // A retry after a lost reply finds the segment open already, perhaps with the
                // ensemble an earlier attempt chose.
                match self.open_ensemble_in_metadata(base).await? {
                    Some(members) => members,
                    None => return Err(silt_metadata::MetadataError::InvalidArgument(reason).into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        self.start_ensemble(base, &members);
        Ok(())
    }

    pub(super) fn open_command(
        &self,
        base_offset: u64,
        ensemble: Vec<String>,
        instances: Vec<String>,
    ) -> Command {
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

    /// Starts streaming the open segment at `base` to the followers among `members`, the
    /// ensemble metadata committed for it. Never the ensemble this agent's copy of metadata
    /// shows: a copy that lags may still hold an earlier open segment at the same offset (an
    /// empty one opened again with other members), and acknowledgements from agents that are
    /// not members would count toward a quorum no recovery reads from.
    pub(super) fn start_ensemble(&mut self, base: u64, members: &[String]) {
        let me = self.config.agent_id.clone();
        let wanted: Vec<String> = members.iter().filter(|a| **a != me).cloned().collect();
        // Addresses from the copy: an agent it does not know yet is left out (fewer followers,
        // never others), and so is one it knows under an address since changed.
        let followers: Vec<(String, String)> = self.metadata.read_local(|s| {
            wanted.iter().filter_map(|a| s.agents.get(a).map(|i| (a.clone(), i.addr.clone()))).collect()
        });
        if followers.len() + 1 < self.config.write_quorum() {
            // A member this agent's copy of metadata does not know yet: every write fails for
            // want of acknowledgements until the next writer recovers the segment (an idle
            // writer opens another one first).
            warn!(topic = %self.config.topic, partition = self.config.partition, segment = base,
                followers = followers.len(), members = ?members, write_quorum = self.config.write_quorum(),
                "this agent's copy of metadata knows the addresses of fewer followers of the segment it opened than the write quorum needs");
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
            members.len().max(1),
            self.config.write_quorum(),
        ));
    }

    /// Whether a new segment would get a better ensemble than the open one: a member's data
    /// directory changed since it opened, or it is short of replication.factor and more
    /// agents are live.
    pub(super) fn ensemble_can_improve(&self, size: usize) -> bool {
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
            // Live, not known to be out of this agent's reach, and not known to have no disk
            // for the partition.
            let usable = |a: &str| a == me || (!self.peers.is_unreachable(a) && !self.disk_failed_at(s, a));
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

    /// Records the followers of the open segment that answered that their disk failed under
    /// this partition (see `PartitionWriter::disk_failed`).
    pub(super) fn note_disk_failures(&mut self) {
        let now = Instant::now();
        self.disk_failed.retain(|_, (_, until)| *until > now);
        let Some(e) = &self.ensemble else { return };
        let failed: Vec<(String, bool)> =
            e.disk_failed().map(|(a, distrusted)| (a.to_string(), distrusted)).collect();
        for (agent, distrusted) in failed {
            let incarnation = self.metadata.read_local(|s| s.agents.get(&agent).map(|i| i.incarnation));
            let Some(incarnation) = incarnation else { continue };
            if self.disk_failed.get(&agent).is_some_and(|(noted, _)| *noted == incarnation) {
                continue;
            }
            let avoid = if distrusted { DISK_FAILED_AVOID } else { STORAGE_ERROR_AVOID };
            warn!(follower = %agent, incarnation, avoid_s = avoid.as_secs(),
                "a follower's disk failed an append of this partition; new segments leave it out for a while, or until it restarts");
            self.disk_failed.insert(agent, (incarnation, now + avoid));
        }
    }

    /// Whether `agent`'s disk failed an append of this partition lately, in the incarnation
    /// `s` shows.
    pub(super) fn disk_failed_at(&self, s: &silt_metadata::MetadataState, agent: &str) -> bool {
        self.disk_failed.get(agent).is_some_and(|(incarnation, until)| {
            *until > Instant::now() && s.agents.get(agent).is_some_and(|i| i.incarnation == *incarnation)
        })
    }

    /// This agent first, then R - 1 live agents that are members of the fewest open
    /// segments, leaving out those that did not answer this agent lately
    /// ([`Peer::is_unreachable`](crate::transport::Peer::is_unreachable)) and those whose disk
    /// failed under this partition. Fewer than W is an error: nothing could be acknowledged.
    pub(super) fn choose_ensemble(&self) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let me = self.config.agent_id.as_str();
        let (r, w) = (self.config.replication_factor().max(1), self.config.write_quorum().max(1));
        let (chosen, instances, live, unreachable, disk_failed) = self.metadata.read_local(|s| {
            let (failed, others): (Vec<String>, Vec<String>) = s
                .live_agents()
                .filter(|a| a.id != me)
                .map(|a| a.id.clone())
                .partition(|a| self.disk_failed_at(s, a));
            let (reachable, unreachable): (Vec<String>, Vec<String>) =
                others.into_iter().partition(|a| !self.peers.is_unreachable(a));
            let live = reachable.len() + 1 + failed.len();
            let open = s
                .topics
                .values()
                .flat_map(|t| t.partitions.iter())
                .filter_map(|p| p.open_segment())
                .map(|seg| seg.ensemble.as_slice());
            let open: Vec<&[String]> = open.collect();
            let mut chosen =
                crate::replication::placement::choose_ensemble(me, &reachable, open.iter().copied(), r);
            if chosen.len() < w && !failed.is_empty() {
                // Too few without them: better a follower whose disk failed lately than no
                // writes at all.
                let usable = failed.iter().filter(|a| !self.peers.is_unreachable(a));
                let all: Vec<String> = reachable.iter().chain(usable).cloned().collect();
                chosen = crate::replication::placement::choose_ensemble(me, &all, open.iter().copied(), r);
            }
            let instances = chosen
                .iter()
                .map(|a| s.agents.get(a).map(|i| i.instance.clone()).unwrap_or_default())
                .collect();
            (chosen, instances, live + unreachable.len(), unreachable, failed)
        });
        if chosen.len() < w {
            let mut cut_off = String::new();
            if !unreachable.is_empty() {
                cut_off += &format!(", and {} did not answer this agent lately", unreachable.join(", "));
            }
            if !disk_failed.is_empty() {
                cut_off += &format!(
                    ", and the disk of {} failed an append of this partition lately",
                    disk_failed.join(", ")
                );
            }
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

    pub(super) fn seal_command(&self, s: &SealedSummary) -> Command {
        Command::SealSegment {
            record_witnesses_needed: true,
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
            unverified: s.unverified.clone(),
            now_ms: self.config.clock.now_ms(),
        }
    }

    /// Rolls the active segment when it is older than `segment.ms`, or when its ensemble
    /// should change (a follower left, or more agents could join it).
    pub(super) async fn roll_if_old(&mut self) {
        if self.failed.is_some() || self.deposed_by_a_follower() {
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
        self.note_disk_failures();
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
    pub(super) async fn trim_local(&mut self) {
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

    /// After metadata refused a pending seal for a reason no lost reply explains. When the seal
    /// names unverified members metadata does not have (the followers this writer streamed to
    /// came from a copy of metadata that had not caught up with it), keeps only those it has,
    /// so that the next attempt succeeds. Any other refusal would be refused again at every
    /// retry, the partition taking no write: metadata and this writer disagree about the
    /// segment, so the writer ends, and the next one recovers the segment from the members
    /// metadata records, under a new epoch. Returns the refusal.
    async fn seal_refused(&mut self, reason: String) -> StoreError {
        let refused: StoreError = silt_metadata::MetadataError::InvalidArgument(reason.clone()).into();
        match self.seal_without_unverified(&reason).await {
            Ok(true) => return refused,
            // Not known yet whether dropping some would do: the next tick asks again.
            Err(e) => return e,
            Ok(false) => {}
        }
        error!(%reason, "metadata refused the seal of a segment for good; the writer ends and the next one recovers it");
        self.failed.get_or_insert_with(|| format!("metadata refused the seal of a segment: {reason}"));
        self.lose_quorum();
        refused
    }

    /// Drops from the pending seal's unverified members those metadata's ensemble of the
    /// segment lacks; whether it dropped any.
    async fn seal_without_unverified(&mut self, reason: &str) -> Result<bool, StoreError> {
        let Some(base) =
            self.roll_pending.as_ref().filter(|p| !p.unverified.is_empty()).map(|p| p.base_offset)
        else {
            return Ok(false);
        };
        let (topic, id, partition) =
            (self.config.topic.clone(), self.config.topic_id, self.config.partition as usize);
        let members = self
            .metadata
            .read(move |s| {
                let p = s.topics.get(&topic).filter(|t| t.id == id)?.partitions.get(partition)?;
                p.segments.get(&base).map(|seg| seg.ensemble.clone())
            })
            .await?;
        let Some(members) = members else { return Ok(false) };
        let Some(pending) = self.roll_pending.as_mut() else { return Ok(false) };
        let holders = pending.replicas.clone().unwrap_or_default();
        let before = pending.unverified.len();
        pending.unverified.retain(|a| members.contains(a) && !holders.contains(a));
        if pending.unverified.len() == before {
            return Ok(false);
        }
        warn!(%reason, kept = ?pending.unverified,
            "metadata refused followers a seal named unverified that are not members of the segment; sealing without them");
        Ok(true)
    }

    /// Seals the active segment on disk and records the seal and the new segment in metadata.
    pub(super) async fn roll(&mut self) {
        self.note_disk_failures();
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
    pub(super) async fn on_log<T: Send + 'static>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&mut PartitionLog) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let Some(mut log) = self.log.take() else {
            return Err(StoreError::Failed(self.failed.clone().unwrap_or_else(|| "the log is gone".into())));
        };
        match silt_metadata::runtime::spawn_blocking(move || {
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
    pub(super) async fn finish_pending_roll(&mut self) -> Result<(), StoreError> {
        let Some(summary) = self.roll_pending.clone() else { return Ok(()) };
        self.ensemble = None;
        let next = self.log().next_offset();
        if let Ok((ensemble, instances)) = self.choose_ensemble() {
            let roll = Command::RollSegment {
                seal: Box::new(self.seal_command(&summary)),
                open: Box::new(self.open_command(next, ensemble.clone(), instances)),
            };
            let members = match self.metadata.write(roll).await {
                Ok(_) => Some(ensemble),
                Err(silt_metadata::MetadataError::Fenced { expected, actual }) => {
                    return Err(self.fenced(expected, actual));
                }
                Err(silt_metadata::MetadataError::InvalidArgument(reason)) => {
                    // A read that fails leaves the question open: the next tick asks again.
                    if let Some(members) = self.open_ensemble_in_metadata(next).await? {
                        // A retry after a lost reply finds the next segment open already,
                        // perhaps with the ensemble an earlier attempt chose.
                        Some(members)
                    } else if self.is_sealed_in_metadata(&summary).await? {
                        // Sealed already (by an earlier attempt of the steps below): open alone.
                        None
                    } else {
                        return Err(self.seal_refused(reason).await);
                    }
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(members) = members {
                self.start_ensemble(next, &members);
                self.roll_pending = None;
                return Ok(());
            }
        }
        // Too few agents for the next ensemble (the open below says so and the writer ends),
        // or the seal is recorded already: one step at a time.
        match self.metadata.write(self.seal_command(&summary)).await {
            Ok(_) => {}
            Err(silt_metadata::MetadataError::Fenced { expected, actual }) => {
                return Err(self.fenced(expected, actual));
            }
            Err(silt_metadata::MetadataError::InvalidArgument(reason)) => {
                // A retry after a lost reply finds the segment already sealed; go on to the open.
                if !self.is_sealed_in_metadata(&summary).await? {
                    return Err(self.seal_refused(reason).await);
                }
            }
            Err(e) => return Err(e.into()),
        }
        if let Err(e) = self.open_segment().await {
            if matches!(e, StoreError::NotEnoughReplicas(_)) {
                // Too few agents to open the next segment with: the writer ends like one that
                // lost its quorum, and the agent starts it again (handing the partition over
                // if it is this agent that cannot reach the others).
                self.failed.get_or_insert_with(|| e.to_string());
                self.lose_quorum();
            }
            return Err(e);
        }
        self.roll_pending = None;
        Ok(())
    }
}
