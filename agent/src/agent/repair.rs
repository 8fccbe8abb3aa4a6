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
        let Some(repair) = self.repair_candidate() else { return };
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

    fn repair_candidate(&self) -> Option<Repair> {
        let me = self.inner.config.agent_id.as_str();
        let after = self.inner.config.replica_repair_after.as_millis() as u64;
        let failures = {
            let mut failures = lock(&self.inner.repair_failures);
            let now = Instant::now();
            failures.retain(|_, until| *until > now);
            failures.clone()
        };
        let failed_lately = |key: &(String, u32, u64, String)| failures.contains_key(key);
        self.inner.metadata.read_local(|s| {
            let now = s.clock_ms;
            let recorded = |seg: &silt_metadata::state::Segment, i: usize| {
                seg.instances.get(i).filter(|r| !r.is_empty()).cloned()
            };
            let intact = |seg: &silt_metadata::state::Segment, i: usize, a: &str| {
                s.agents.get(a).is_some_and(|info| {
                    info.is_live(now) && recorded(seg, i).is_none_or(|r| r == info.instance)
                })
            };
            let gone = |seg: &silt_metadata::state::Segment, i: usize, a: &str| match s.agents.get(a) {
                None => true,
                Some(info) => {
                    recorded(seg, i).is_some_and(|r| r != info.instance)
                        || (!info.is_live(now)
                            && now
                                >= info.last_heartbeat_ms.saturating_add(info.lease_ms).saturating_add(after))
                }
            };
            let mut load: HashMap<&str, usize> = s.live_agents().map(|a| (a.id.as_str(), 0)).collect();
            for seg in s.topics.values().flat_map(|t| t.partitions.iter()).flat_map(|p| p.segments.values()) {
                for a in &seg.ensemble {
                    if let Some(n) = load.get_mut(a.as_str()) {
                        *n += 1;
                    }
                }
            }
            for t in s.topics.values() {
                for (p, part) in t.partitions.iter().enumerate() {
                    for seg in part
                        .segments
                        .values()
                        .filter(|seg| seg.state == silt_metadata::state::SegmentState::Sealed)
                    {
                        let first = seg.ensemble.iter().enumerate().find(|(i, a)| intact(seg, *i, a));
                        if first.map(|(_, a)| a.as_str()) != Some(me) {
                            continue;
                        }
                        // A member gone, or else a missing one: a segment sealed after a
                        // follower left midway has fewer than R members.
                        let gone = seg.ensemble.iter().enumerate().find(|(i, a)| gone(seg, *i, a));
                        let short = seg.ensemble.len() < t.config.replication_factor as usize;
                        if gone.is_none() && !short {
                            continue;
                        }
                        // A live agent outside the ensemble; not the partition's writer, whose
                        // log belongs to its writer task, nor one that failed this copy lately.
                        let with = s
                            .live_agents()
                            .filter(|a| {
                                !seg.ensemble.contains(&a.id)
                                    && part.writer.as_deref() != Some(a.id.as_str())
                                    && !failed_lately(&(
                                        t.name.clone(),
                                        p as u32,
                                        seg.base_offset,
                                        a.id.clone(),
                                    ))
                            })
                            .min_by_key(|a| (load.get(a.id.as_str()).copied().unwrap_or(0), a.id.clone()));
                        let Some(with) = with else { continue };
                        return Some(Repair {
                            topic: t.name.clone(),
                            topic_id: t.id,
                            partition: p as u32,
                            segment: seg.base_offset,
                            segment_epoch: seg.epoch,
                            gone: gone.map(|(_, a)| a.clone()),
                            with: with.id.clone(),
                            with_addr: with.addr.clone(),
                            with_instance: with.instance.clone(),
                        });
                    }
                }
            }
            None
        })
    }
}
