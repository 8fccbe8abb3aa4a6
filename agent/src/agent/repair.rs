//! Ensemble repair: finds a sealed segment short of replicas (a member gone longer than
//! `replica_repair_after`, a replaced disk, a segment sealed without a member that left midway)
//! whose first intact replica is here, and has a live agent outside its ensemble copy it.

use super::*;

/// How long an agent that failed to take a copy of a segment is not asked for it again.
const REPAIR_RETRY_AFTER: Duration = Duration::from_secs(30);
/// And when it answered that it holds other records where the copy goes (`replica_diverged`),
/// which only changes once those are archived or the agent's disk is replaced.
const REPAIR_RETRY_AFTER_DIVERGED: Duration = Duration::from_secs(600);

impl Agent {
    /// Ensemble repair: of the sealed segments whose first intact replica is on this agent,
    /// finds one with a replica on an agent gone longer than `replica_repair_after` (or on a
    /// replaced disk), or with fewer members than the topic's replication factor (sealed after
    /// a follower left midway), has a live agent outside the ensemble copy it from here, and
    /// records the new member in metadata. One repair runs at a time.
    pub(super) fn start_repair(&self) {
        use std::sync::atomic::Ordering as O;
        if self.inner.repairing.load(O::Relaxed) {
            return;
        }
        let Some(repair) = self.repair_candidate() else {
            self.start_lost_range_check();
            return;
        };
        self.inner.repairing.store(true, O::Relaxed);
        let agent = self.clone();
        tokio::spawn(async move {
            let r = &repair;
            let target = ReplicaTarget {
                topic_id: r.topic_id,
                epoch: 0,
                segment: r.segment,
                segment_epoch: r.segment_epoch,
            };
            let me = agent.inner.config.agent_id.clone();
            let copied = agent
                .inner
                .peers
                .replica_repair((&r.with, &r.with_addr), &r.topic, r.partition, &target, &me)
                .await;
            let record = match &r.gone {
                Some(gone) => Command::ReplaceReplica {
                    topic: r.topic.clone(),
                    topic_id: r.topic_id,
                    partition: r.partition,
                    base_offset: r.segment,
                    gone: gone.clone(),
                    with: r.with.clone(),
                    instance: r.with_instance.clone(),
                },
                None => Command::AddReplica {
                    topic: r.topic.clone(),
                    topic_id: r.topic_id,
                    partition: r.partition,
                    base_offset: r.segment,
                    with: r.with.clone(),
                    instance: r.with_instance.clone(),
                },
            };
            let result = match copied {
                Ok(()) => agent.inner.metadata.write(record).await.map(|_| ()).map_err(ApiError::from),
                Err(e) => Err(e),
            };
            let outcome = match (&result, &r.gone) {
                (Err(_), _) => "failed",
                (Ok(()), Some(_)) => "replaced",
                (Ok(()), None) => "added",
            };
            agent.inner.metrics.ensemble_repairs.get_or_create(&RepairLabels { outcome }).inc();
            match result {
                Ok(()) => {
                    let gone = r.gone.as_deref().unwrap_or("none (the segment was sealed short of members)");
                    info!(topic = %r.topic, partition = r.partition, segment = r.segment, gone, with = %r.with,
                    "repaired an ensemble: the segment has a new replica")
                }
                Err(e) => {
                    warn!(topic = %r.topic, partition = r.partition, segment = r.segment, with = %r.with,
                    error = %e.message, "ensemble repair failed; will retry, with another agent if there is one");
                    let wait = if e.code == ErrorCode::ReplicaDiverged {
                        REPAIR_RETRY_AFTER_DIVERGED
                    } else {
                        REPAIR_RETRY_AFTER
                    };
                    lock(&agent.inner.repair_failures).insert(
                        (r.topic.clone(), r.partition, r.segment, r.with.clone()),
                        Instant::now() + wait,
                    );
                }
            }
            agent.inner.repairing.store(false, O::Relaxed);
        });
    }

    /// Of the sealed segments whose holders all lost their disks and whose first live
    /// unverified member is this agent, asks the unverified members what they hold of one,
    /// and declares the range none of them holds lost when enough of them lack it to show it
    /// was never acknowledged (`Command::DeclareLost`); the members holding the rest become its
    /// holders. Without it, reads of the partition would stop at the first offset no disk
    /// holds. Runs in place of a repair.
    fn start_lost_range_check(&self) {
        use std::sync::atomic::Ordering as O;
        let me = self.inner.config.agent_id.clone();
        let failures = self.recent_repair_failures();
        let failed_lately = |topic: &str, partition: u32, segment: u64| {
            failures.contains_key(&(topic.to_string(), partition, segment, me.clone()))
        };
        let Some(check) = self
            .inner
            .metadata
            .read_local(|s| crate::replication::placement::lost_range_candidate(s, &me, failed_lately))
        else {
            return;
        };
        self.inner.repairing.store(true, O::Relaxed);
        let agent = self.clone();
        tokio::spawn(async move {
            let c = &check;
            let result = agent.check_lost_range(c).await;
            match &result {
                Ok(Some((from, end))) if from < end => {
                    agent
                        .inner
                        .metrics
                        .declared_lost_offsets
                        .get_or_create(&Metrics::topic(&c.topic))
                        .inc_by(end - from);
                    error!(topic = %c.topic, partition = c.partition, segment = c.segment, from, end,
                    "offsets were on disks that are gone and were never acknowledged: declared lost; reads step over them")
                }
                Ok(Some(_)) => info!(topic = %c.topic, partition = c.partition, segment = c.segment,
                    "an unverified member holds the whole segment, whose holders' disks are gone: it holds it now"),
                Ok(None) | Err(_) => {
                    if let Err(e) = &result {
                        warn!(topic = %c.topic, partition = c.partition, segment = c.segment, error = %e.message,
                        "checking a segment whose holders' disks are gone failed; will retry");
                    }
                    lock(&agent.inner.repair_failures).insert(
                        (c.topic.clone(), c.partition, c.segment, me.clone()),
                        Instant::now() + REPAIR_RETRY_AFTER,
                    );
                }
            }
            agent.inner.repairing.store(false, O::Relaxed);
        });
    }

    /// Asks the witnesses of `c` (every live unverified member on the disk recorded for it)
    /// what they hold, and proposes what that shows once all of them answered. Returns the
    /// range declared (`from == end`: none, a witness holds it all), or `None` when the
    /// answers show nothing yet.
    async fn check_lost_range(
        &self,
        c: &crate::replication::placement::LostRangeCheck,
    ) -> Result<Option<(u64, u64)>, ApiError> {
        let target = ReplicaTarget {
            topic_id: c.topic_id,
            epoch: 0,
            segment: c.segment,
            segment_epoch: c.segment_epoch,
        };
        let me = self.inner.config.agent_id.as_str();
        let asked = c.witnesses.iter().map(|(agent, addr, recorded)| {
            let target = target.clone();
            async move {
                let held = if agent == me {
                    self.replica_held(&c.topic, c.partition, target).await
                } else {
                    self.inner.peers.replica_held((agent, addr), &c.topic, c.partition, &target).await
                };
                (agent.clone(), recorded.clone(), held)
            }
        });
        let mut answers: Vec<(String, String, u64)> = Vec::new();
        let mut sizes: Vec<(u64, u64)> = Vec::new();
        for (agent, recorded, held) in futures::future::join_all(asked).await {
            match held {
                // One whose disk was replaced since answers for another: it holds nothing.
                Ok(h) if h.instance == recorded => {
                    sizes.push((h.end_offset, h.size_bytes));
                    answers.push((agent, h.instance, h.end_offset));
                }
                Ok(_) => {}
                // Every live witness answers, or nothing is declared: the range declared lost
                // ends where the longest copy among them all ends, so no agent serves an offset
                // in it from a copy of its own (the partition's writer may be one of them).
                Err(e) => {
                    debug!(agent, error = %e.message, "a witness of a lost range did not answer");
                    return Ok(None);
                }
            }
        }
        let Some((from, witnesses)) =
            crate::replication::placement::lost_range_declaration(c.end, c.needed, &answers)
        else {
            return Ok(None);
        };
        // The bytes of a witness holding up to `from`: the segment's size from now on.
        let size_bytes = sizes.iter().find(|(end, _)| (*end).min(c.end) == from).map_or(0, |(_, size)| *size);
        let command = Command::DeclareLost {
            topic: c.topic.clone(),
            topic_id: c.topic_id,
            partition: c.partition,
            base_offset: c.segment,
            segment_epoch: c.segment_epoch,
            end: c.end,
            from,
            size_bytes,
            witnesses: witnesses
                .into_iter()
                .map(|(agent, instance, held_end)| silt_metadata::state::Witness {
                    agent,
                    instance,
                    held_end,
                })
                .collect(),
        };
        self.inner.metadata.write(command).await?;
        Ok(Some((from, c.end)))
    }

    /// The copies (and lost-range checks, keyed by this agent) that failed lately, each until
    /// it may be tried again; those whose wait is over are forgotten.
    fn recent_repair_failures(&self) -> HashMap<(String, u32, u64, String), Instant> {
        let mut failures = lock(&self.inner.repair_failures);
        let now = Instant::now();
        failures.retain(|_, until| *until > now);
        failures.clone()
    }

    fn repair_candidate(&self) -> Option<Repair> {
        let me = self.inner.config.agent_id.as_str();
        let after = self.inner.config.replica_repair_after.as_millis() as u64;
        let failures = self.recent_repair_failures();
        // An agent this one cannot reach would refuse the copy, and be kept from being asked
        // again for REPAIR_RETRY_AFTER after the link is back: it is not asked at all.
        let failed_lately = |topic: &str, partition: u32, segment: u64, agent: &str| {
            failures.contains_key(&(topic.to_string(), partition, segment, agent.to_string()))
                || self.inner.peers.is_unreachable(agent)
        };
        self.inner
            .metadata
            .read_local(|s| crate::replication::placement::repair_candidate(s, me, after, failed_lately))
    }
}
