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
