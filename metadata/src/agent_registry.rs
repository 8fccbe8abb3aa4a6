//! Agents, their leases, and which agent writes each partition.
//!
//! Part of the state machine: every function here runs inside `MetadataState::apply`, so it
//! is deterministic and judges time only by the clock carried in the commands, which the
//! metadata leader stamps when it proposes them (`Command::stamp_clock`) with the time it
//! measured itself since its term began (`lease_clock.rs`: a step of its wall clock moves no
//! lease); `MetadataState::clock_ms` keeps the newest seen, so time never runs backwards across
//! leaders either.
//!
//! An agent registers (a new incarnation, a lease), then heartbeats. Every partition has at
//! most one writer; when the writer's lease lapses (or it deregisters), the next command that
//! carries a clock names the live agent with the fewest partitions as writer and bumps the
//! partition's epoch, which fences the old writer everywhere. Registering again bumps the epoch
//! of every partition the agent writes: a restarted agent reconciles under a new epoch.
//!
//! A new writer must recover the open segment from its ensemble before it can write. Until
//! replicas exist on other agents, the lapsed writer may be the only one holding it, so a new
//! writer is chosen among the live ensemble members first, and an agent that comes back gets
//! back the partitions whose open segment it holds and whose writer has not recovered it yet
//! (the open segment is still from an older epoch).
//!
//! Past 800 lines only with its tests: the code is the first 431 lines.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::{check_name, MetadataState, Partition, Response, SegmentState};
use crate::MetadataError;

/// Shortest lease an agent may ask for.
pub const LEASE_MS_MIN: u64 = 500;
/// Longest lease an agent may ask for.
pub const LEASE_MS_MAX: u64 = 600_000;
/// Most agents the registry holds.
pub const AGENTS_MAX: usize = 1_000;
/// An agent whose lease lapsed this long ago, and that writes nothing, is forgotten.
pub const AGENT_FORGET_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest `host:port` an agent may register.
const ADDR_BYTES_MAX: usize = 255;

/// A registered agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Agent id.
    pub id: String,
    /// Where it serves (`host:port`).
    pub addr: String,
    /// Bumped at every registration; heartbeats of older incarnations are refused.
    pub incarnation: u64,
    /// The lease lapses this long after the last heartbeat.
    pub lease_ms: u64,
    /// When the current incarnation registered.
    pub registered_ms: u64,
    /// The last heartbeat (or registration).
    pub last_heartbeat_ms: u64,
    /// The data directory the current incarnation runs on (see `Command::RegisterAgent`).
    #[serde(default)]
    pub instance: String,
    /// It deregistered: its lease ended then, whatever `lease_ms` says.
    #[serde(default)]
    pub left: bool,
    /// When it last handed a partition over (`HandOffWriter`: it could not reach other
    /// agents, or its disk failed); rebalancing gives it nothing for a while after, and a
    /// hand-off passes it over while another live agent can take the partition.
    #[serde(default)]
    pub handed_off_ms: u64,
}

/// A segment with fewer intact replicas than its topic's `replication.factor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderReplicated {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The segment's first offset.
    pub base_offset: u64,
    /// Whether it is the partition's open segment.
    pub open: bool,
    /// Intact replicas.
    pub replicas: usize,
    /// Wanted.
    pub replication_factor: usize,
}

impl AgentInfo {
    /// Whether the lease still holds at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        !self.left && now_ms <= self.last_heartbeat_ms.saturating_add(self.lease_ms)
    }
}

impl MetadataState {
    /// Agents whose lease holds at the state machine's clock.
    pub fn live_agents(&self) -> impl Iterator<Item = &AgentInfo> {
        self.agents.values().filter(|a| a.is_live(self.clock_ms))
    }

    /// Segments not yet archived (open or sealed) with fewer intact replicas than their
    /// topic's `replication.factor`: a replica is intact while its agent's lease holds and the
    /// agent runs on the data directory it had when the segment opened.
    pub fn under_replicated(&self) -> Vec<UnderReplicated> {
        let mut out = Vec::new();
        for t in self.topics.values() {
            let wanted = t.config.replication_factor as usize;
            for (p, part) in t.partitions.iter().enumerate() {
                for seg in part.segments.values() {
                    if !matches!(seg.state, SegmentState::Open | SegmentState::Sealed) {
                        continue;
                    }
                    let intact = seg
                        .ensemble
                        .iter()
                        .enumerate()
                        .filter(|(i, a)| {
                            self.agents.get(*a).is_some_and(|info| {
                                info.is_live(self.clock_ms)
                                    && seg
                                        .instances
                                        .get(*i)
                                        .is_none_or(|r| r.is_empty() || *r == info.instance)
                            })
                        })
                        .count();
                    if intact < wanted {
                        out.push(UnderReplicated {
                            topic: t.name.clone(),
                            partition: p as u32,
                            base_offset: seg.base_offset,
                            open: seg.state == SegmentState::Open,
                            replicas: intact,
                            replication_factor: wanted,
                        });
                    }
                }
            }
        }
        out
    }

    pub(crate) fn advance_clock(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
    }

    pub(crate) fn register_agent(
        &mut self,
        agent: &str,
        instance: &str,
        addr: &str,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        check_name("agent", agent)?;
        if addr.is_empty() || addr.len() > ADDR_BYTES_MAX || addr.chars().any(|c| c.is_control() || c == ' ')
        {
            return Err(MetadataError::InvalidArgument(format!(
                "agent address must be host:port, 1 to {ADDR_BYTES_MAX} bytes, got '{addr}'"
            )));
        }
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
            return Err(MetadataError::InvalidArgument(format!(
                "agent lease must be between {LEASE_MS_MIN} and {LEASE_MS_MAX} ms, got {lease_ms}"
            )));
        }
        if !self.agents.contains_key(agent) && self.agents.len() >= AGENTS_MAX {
            return Err(MetadataError::InvalidArgument(format!(
                "the cluster already has {AGENTS_MAX} registered agents"
            )));
        }
        let now = self.clock_ms.max(now_ms);
        if let Some(a) = self.agents.get(agent) {
            let other = !a.instance.is_empty() && !instance.is_empty() && a.instance != instance;
            if other && a.is_live(now) {
                let left = (a.last_heartbeat_ms + a.lease_ms).saturating_sub(now);
                return Err(MetadataError::InvalidArgument(format!(
                    "agent id '{agent}' is in use by another data directory (at {}, lease for {left} more ms); \
                     give this agent another --id, or wait for that one's lease to lapse",
                    a.addr
                )));
            }
        }
        self.advance_clock(now_ms);
        let incarnation = self.agents.get(agent).map_or(1, |a| a.incarnation + 1);
        self.agents.insert(
            agent.to_string(),
            AgentInfo {
                id: agent.to_string(),
                addr: addr.to_string(),
                incarnation,
                lease_ms,
                registered_ms: now,
                last_heartbeat_ms: now,
                instance: instance.to_string(),
                left: false,
                handed_off_ms: 0,
            },
        );
        for p in self.topics.values_mut().flat_map(|t| t.partitions.iter_mut()) {
            let unrecovered = p.open_segment().is_some_and(|open| {
                open.epoch < p.epoch
                    && open.ensemble.iter().any(|a| a == agent)
                    && !p.writer.as_ref().is_some_and(|w| open.ensemble.contains(w))
            });
            if p.writer.as_deref() == Some(agent) || unrecovered {
                p.writer = Some(agent.to_string());
                p.epoch += 1;
            }
        }
        self.assign_writers();
        Ok(Response::Registered { incarnation })
    }

    pub(crate) fn heartbeat_agent(
        &mut self,
        agent: &str,
        incarnation: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        self.check_incarnation(agent, incarnation)?;
        let now = self.clock_ms.max(now_ms);
        if !self.agents.get(agent).is_some_and(|a| a.is_live(now)) {
            // Its partitions may have new writers already: it must register again (and learn
            // what it writes now) instead of carrying on.
            return Err(MetadataError::LeaseLapsed { agent: agent.to_string() });
        }
        self.advance_clock(now_ms);
        if let Some(a) = self.agents.get_mut(agent) {
            a.last_heartbeat_ms = now;
        }
        self.assign_writers();
        Ok(Response::Ok)
    }

    pub(crate) fn deregister_agent(
        &mut self,
        agent: &str,
        incarnation: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        self.check_incarnation(agent, incarnation)?;
        self.advance_clock(now_ms);
        let now = self.clock_ms;
        if let Some(a) = self.agents.get_mut(agent) {
            // It stays listed (and keeps counting incarnations) until forgotten.
            a.left = true;
            a.last_heartbeat_ms = now;
        }
        self.assign_writers();
        Ok(Response::Ok)
    }

    /// `topic/partition` (of topic `topic_id`, if given), if `agent` writes it under `epoch`.
    fn written_by(
        &self,
        topic: &str,
        topic_id: Option<u64>,
        partition: u32,
        agent: &str,
        epoch: u64,
    ) -> Result<&Partition, MetadataError> {
        let p = self
            .topics
            .get(topic)
            .filter(|t| topic_id.is_none_or(|id| t.id == id))
            .ok_or_else(|| MetadataError::UnknownTopic(topic.to_string()))?
            .partitions
            .get(partition as usize)
            .ok_or_else(|| MetadataError::UnknownPartition { topic: topic.to_string(), partition })?;
        if p.epoch != epoch {
            return Err(MetadataError::Fenced { expected: epoch, actual: p.epoch });
        }
        if p.writer.as_deref() != Some(agent) {
            return Err(MetadataError::InvalidArgument(format!(
                "'{agent}' does not write {topic}/{partition} (writer: {})",
                p.writer.as_deref().unwrap_or("none")
            )));
        }
        Ok(p)
    }

    pub(crate) fn hand_off_writer(
        &mut self,
        topic: &str,
        partition: u32,
        agent: &str,
        epoch: u64,
        avoid: &[String],
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        // The clock moves only when the command applies: a refused one changes nothing.
        let now = self.clock_ms.max(now_ms);
        let p = self.written_by(topic, None, partition, agent, epoch)?;
        let members: Vec<&String> = p.open_segment().map(|o| o.ensemble.iter().collect()).unwrap_or_default();
        // Agents the proposer cannot reach either are passed over, unless it reaches none (it
        // is the one cut off).
        let others = || self.agents.values().filter(|a| a.id != agent && a.is_live(now));
        let reachable = others().any(|a| !avoid.contains(&a.id));
        let mut load: std::collections::BTreeMap<&str, usize> =
            others().filter(|a| !reachable || !avoid.contains(&a.id)).map(|a| (a.id.as_str(), 0)).collect();
        for w in self.topics.values().flat_map(|t| t.partitions.iter()).filter_map(|p| p.writer.as_deref()) {
            if let Some(n) = load.get_mut(w) {
                *n += 1;
            }
        }
        // An agent that handed a partition over lately may have the same trouble (a failed
        // disk, a cut link): two of them would pass the partition back and forth while a
        // healthy one waits. Among the others, a member of the open segment holds its tail:
        // the recovery needs it anyway.
        let handed_off_lately = |id: &str| {
            self.agents.get(id).is_some_and(|a| {
                let wait = a.lease_ms.saturating_mul(NO_REBALANCE_AFTER_HAND_OFF_LEASES);
                a.handed_off_ms != 0 && a.handed_off_ms.saturating_add(wait) > now
            })
        };
        let Some(next) = load
            .iter()
            .min_by_key(|(id, n)| (handed_off_lately(id), !members.iter().any(|m| m == *id), **n, **id))
            .map(|(id, _)| id.to_string())
        else {
            return Err(MetadataError::InvalidArgument(format!(
                "no agent other than '{agent}' is live to take over {topic}/{partition}"
            )));
        };
        self.advance_clock(now_ms);
        if let Some(a) = self.agents.get_mut(agent) {
            a.handed_off_ms = now;
        }
        let p = self.partition_mut(topic, partition)?;
        p.writer = Some(next.clone());
        p.epoch += 1;
        Ok(Response::Writer { agent: next, epoch: p.epoch })
    }

    fn check_incarnation(&self, agent: &str, incarnation: u64) -> Result<(), MetadataError> {
        match self.agents.get(agent) {
            Some(a) if a.incarnation == incarnation => Ok(()),
            _ => Err(MetadataError::UnknownAgent { agent: agent.to_string(), incarnation }),
        }
    }

    /// Names a writer for every partition that has none or whose writer's lease lapsed: a live
    /// member of the open segment's ensemble if there is one, else the live agent with the
    /// fewest partitions (ties by id), bumping the epoch. Without a live agent a partition
    /// keeps its writer (and epoch) until one appears.
    pub(crate) fn assign_writers(&mut self) {
        let now = self.clock_ms;
        self.agents.retain(|id, a| {
            a.last_heartbeat_ms.saturating_add(a.lease_ms).saturating_add(AGENT_FORGET_MS) >= now
                || self.topics.values().any(|t| t.partitions.iter().any(|p| p.writer.as_deref() == Some(id)))
        });
        let mut load: std::collections::BTreeMap<String, usize> =
            self.live_agents().map(|a| (a.id.clone(), 0)).collect();
        if load.is_empty() {
            return;
        }
        for p in self.topics.values().flat_map(|t| t.partitions.iter()) {
            if let Some(n) = p.writer.as_ref().and_then(|w| load.get_mut(w)) {
                *n += 1;
            }
        }
        for p in self.topics.values_mut().flat_map(|t| t.partitions.iter_mut()) {
            if p.writer.as_ref().is_some_and(|w| load.contains_key(w)) {
                continue;
            }
            let holders: Vec<&String> = p
                .open_segment()
                .map(|o| o.ensemble.iter().filter(|a| load.contains_key(*a)).collect())
                .unwrap_or_default();
            let Some(agent) = load
                .iter()
                .filter(|(id, _)| holders.is_empty() || holders.contains(id))
                .min_by_key(|(id, n)| (**n, (*id).clone()))
                .map(|(id, _)| id.clone())
            else {
                return;
            };
            *load.entry(agent.clone()).or_default() += 1;
            p.writer = Some(agent);
            p.epoch += 1;
        }
    }
}

/// How many of an agent's leases pass between two partitions moving to balance the writers,
/// and how long it must have been registered before any moves to it.
pub const REBALANCE_EVERY_LEASES: u64 = 3;
/// How many of an agent's leases after it handed a partition over for being cut off from the
/// other agents (`HandOffWriter`) no partition moves to it to balance the writers.
pub const NO_REBALANCE_AFTER_HAND_OFF_LEASES: u64 = 10;

impl MetadataState {
    /// The move that balancing the writers calls for now, if any: one partition from the live
    /// agent that writes the most to the settled live agent that writes the fewest, when they
    /// differ by two or more (an agent that joined, or came back after its partitions moved
    /// away, gets its share). Settled: registered for [`REBALANCE_EVERY_LEASES`] of its leases,
    /// no partition moved to balance the writers (to any agent) within that time, and no
    /// hand-off for being cut off within [`NO_REBALANCE_AFTER_HAND_OFF_LEASES`]. A partition
    /// whose open segment the receiver holds a replica of goes first (its recovery reads the
    /// tail locally). Returns the topic, the partition and the receiving agent.
    pub fn rebalance_due(&self) -> Option<(String, u32, String)> {
        let now = self.clock_ms;
        let mut load: BTreeMap<&str, usize> = self.live_agents().map(|a| (a.id.as_str(), 0)).collect();
        for w in self.topics.values().flat_map(|t| t.partitions.iter()).filter_map(|p| p.writer.as_deref()) {
            if let Some(n) = load.get_mut(w) {
                *n += 1;
            }
        }
        let settled = |a: &AgentInfo| {
            let wait = a.lease_ms.saturating_mul(REBALANCE_EVERY_LEASES);
            let cut_off = a.lease_ms.saturating_mul(NO_REBALANCE_AFTER_HAND_OFF_LEASES);
            a.registered_ms.saturating_add(wait) <= now
                && self.last_rebalance_ms.saturating_add(wait) <= now
                && (a.handed_off_ms == 0 || a.handed_off_ms.saturating_add(cut_off) <= now)
        };
        let (to, to_n) = load
            .iter()
            .filter(|(id, _)| self.agents.get(**id).is_some_and(settled))
            .min_by_key(|(id, n)| (**n, **id))
            .map(|(id, n)| (*id, *n))?;
        let (from, from_n) =
            load.iter().max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id))).map(|(id, n)| (*id, *n))?;
        if from_n < to_n + 2 {
            return None;
        }
        let written = self.topics.values().flat_map(|t| {
            t.partitions
                .iter()
                .enumerate()
                .filter(|(_, p)| p.writer.as_deref() == Some(from))
                .map(move |(i, p)| (t, i, p))
        });
        let mut first = None;
        for (t, i, p) in written {
            if p.open_segment().is_some_and(|o| o.ensemble.iter().any(|a| a == to)) {
                return Some((t.name.clone(), i as u32, to.to_string()));
            }
            first.get_or_insert((t.name.clone(), i as u32, to.to_string()));
        }
        first
    }

    /// Moves `topic/partition` off `agent`, its writer under `epoch`, to the agent
    /// [`rebalance_due`](Self::rebalance_due) names, if that is the move due at `now_ms` (or
    /// one of the same agent to the same receiver): a writer change like any other, under a
    /// new epoch. Refused, changing nothing, when the partition has another writer or epoch,
    /// a segment open under that epoch (its writer did not stop, or started again), or no
    /// move off `agent` is due any more (the agent then starts writing it again).
    pub(crate) fn move_writer(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        agent: &str,
        epoch: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        let p = self.written_by(topic, Some(topic_id), partition, agent, epoch)?;
        // A segment open under this epoch is the writer's: it has not stopped, or it started
        // again at this epoch (it opens a segment before it serves anything), and a move now
        // would go on under it.
        if p.open_segment().is_some_and(|o| o.epoch == epoch) {
            return Err(MetadataError::InvalidArgument(format!(
                "{topic}/{partition} has a segment open under epoch {epoch}: its writer on '{agent}' has not stopped; it keeps the partition"
            )));
        }
        // Decided on the clock the command would move the state to; a refusal leaves it.
        let clock = self.clock_ms;
        self.advance_clock(now_ms);
        let due = self.rebalance_due();
        let to = match due {
            Some((due_topic, due_partition, to))
                if self.topics[&due_topic].partitions[due_partition as usize].writer.as_deref()
                    == Some(agent) =>
            {
                to
            }
            _ => {
                self.clock_ms = clock;
                return Err(MetadataError::InvalidArgument(format!(
                    "no rebalance moves a partition off '{agent}' now; it keeps {topic}/{partition}"
                )));
            }
        };
        let now = self.clock_ms;
        let p = self.partition_mut(topic, partition)?;
        p.writer = Some(to.clone());
        p.epoch += 1;
        let epoch = p.epoch;
        self.last_rebalance_ms = now;
        Ok(Response::Writer { agent: to, epoch })
    }

    /// Makes the move [`rebalance_due`](Self::rebalance_due) calls for, if any, as a writer
    /// change like any other: the epoch is bumped and the new writer recovers the open segment.
    /// Applied for `RebalanceWriters`, which agents no longer propose.
    pub(crate) fn rebalance_writers(&mut self) {
        let Some((topic, partition, to)) = self.rebalance_due() else { return };
        let now = self.clock_ms;
        if let Ok(p) = self.partition_mut(&topic, partition) {
            p.writer = Some(to);
            p.epoch += 1;
            self.last_rebalance_ms = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::Command;

    fn register(s: &mut MetadataState, agent: &str, now_ms: u64) -> u64 {
        let r = s.apply(&Command::RegisterAgent {
            agent: agent.into(),
            instance: String::new(),
            addr: format!("127.0.0.1:{}", 7000 + agent.len()),
            lease_ms: 1000,
            now_ms,
        });
        let Response::Registered { incarnation } = r else { panic!("{r:?}") };
        incarnation
    }

    fn heartbeat(s: &mut MetadataState, agent: &str, incarnation: u64, now_ms: u64) -> Response {
        s.apply(&Command::AgentHeartbeat { agent: agent.into(), incarnation, now_ms })
    }

    fn create(s: &mut MetadataState, name: &str, partitions: u32, now_ms: u64) {
        let r =
            s.apply(&Command::CreateTopic { name: name.into(), partitions, config: BTreeMap::new(), now_ms });
        assert!(matches!(r, Response::Topic { .. }), "{r:?}");
    }

    fn writers(s: &MetadataState, topic: &str) -> Vec<(Option<String>, u64)> {
        s.topics[topic].partitions.iter().map(|p| (p.writer.clone(), p.epoch)).collect()
    }

    #[test]
    fn partitions_are_spread_over_live_agents() {
        let mut s = MetadataState::default();
        create(&mut s, "early", 2, 10);
        assert_eq!(writers(&s, "early"), vec![(None, 0), (None, 0)], "no agent yet: no writer");
        register(&mut s, "a", 100);
        assert_eq!(writers(&s, "early"), vec![(Some("a".into()), 1), (Some("a".into()), 1)]);
        register(&mut s, "b", 200);
        create(&mut s, "t", 4, 300);
        let w: Vec<String> = writers(&s, "t").into_iter().map(|(w, _)| w.unwrap()).collect();
        assert_eq!(w, ["b", "b", "a", "b"], "the least loaded agent first, ties by id");
        assert!(writers(&s, "t").iter().all(|(_, e)| *e == 1));
    }

    #[test]
    fn a_lapsed_lease_moves_partitions_with_a_new_epoch() {
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 0);
        create(&mut s, "t", 2, 0);
        let b = register(&mut s, "b", 10);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 1), (Some("a".into()), 1)]);
        // Within the lease nothing moves.
        assert_eq!(heartbeat(&mut s, "b", b, 1000), Response::Ok);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 1), (Some("a".into()), 1)]);
        // a's lease (1000 ms from 0) lapsed at 1001: b's heartbeat takes its partitions over.
        assert_eq!(heartbeat(&mut s, "b", b, 1001), Response::Ok);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2), (Some("b".into()), 2)]);
        // a comes back with an incarnation it never had: refused, nothing changes.
        let before = s.clone();
        assert!(matches!(
            heartbeat(&mut s, "a", a + 7, 1002),
            Response::Error { error: MetadataError::UnknownAgent { .. } }
        ));
        assert_eq!(s, before);
        // Nor with its current one: the lease lapsed. Registering again gives no partitions back.
        assert!(matches!(
            heartbeat(&mut s, "a", a, 1002),
            Response::Error { error: MetadataError::LeaseLapsed { .. } }
        ));
        let a2 = register(&mut s, "a", 1003);
        assert_eq!(a2, a + 1);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2), (Some("b".into()), 2)]);
        assert_eq!(s.live_agents().count(), 2);
    }

    #[test]
    fn registering_again_bumps_the_epochs_of_the_agents_partitions() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 1)]);
        register(&mut s, "a", 5);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 2)], "a restart is a writer change");
    }

    fn open_segment(s: &mut MetadataState, topic: &str, partition: u32, ensemble: &[&str]) {
        let p = &s.topics[topic].partitions[partition as usize];
        let (epoch, base_offset) = (p.epoch, p.next_segment_base());
        let r = s.apply(&Command::OpenSegment {
            topic: topic.into(),
            topic_id: None,
            partition,
            epoch,
            base_offset,
            ensemble: ensemble.iter().map(|a| a.to_string()).collect(),
            instances: Vec::new(),
            now_ms: 0,
        });
        assert_eq!(r, Response::Ok);
    }

    #[test]
    fn a_joining_agent_gets_its_share_of_partitions_one_move_per_three_leases() {
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 0);
        create(&mut s, "t", 5, 0);
        open_segment(&mut s, "t", 3, &["a", "b"]);
        let b = register(&mut s, "b", 100);
        let count = |s: &MetadataState, agent: &str| {
            s.topics["t"].partitions.iter().filter(|p| p.writer.as_deref() == Some(agent)).count()
        };
        // Heartbeats move nothing; a writer moves a partition when its copy shows a move off
        // it is due.
        let beat = |s: &mut MetadataState, now: u64| {
            assert_eq!(heartbeat(s, "a", a, now), Response::Ok);
            assert_eq!(heartbeat(s, "b", b, now), Response::Ok);
            match s.rebalance_due() {
                Some((_, p, to)) => {
                    stop_writer(s, p, now);
                    let r = move_writer(s, p, "a", now);
                    assert_eq!(
                        r,
                        Response::Writer { agent: to, epoch: s.topics["t"].partitions[p as usize].epoch }
                    );
                }
                None => {
                    let before = s.clone();
                    let mine =
                        writers(s, "t").iter().position(|(w, _)| w.as_deref() == Some("a")).unwrap() as u32;
                    let r = move_writer(s, mine, "a", now);
                    assert!(
                        matches!(r, Response::Error { error: MetadataError::InvalidArgument(_) }),
                        "{r:?}"
                    );
                    assert_eq!(*s, before, "at {now}: nothing due, nothing moves");
                }
            }
        };
        // b has not been registered for three of its leases (1 s each): nothing moves.
        for now in [500, 1000, 2000, 3000] {
            beat(&mut s, now);
            assert_eq!(count(&s, "b"), 0, "at {now}");
        }
        // Then one partition moves: the one whose open segment b holds, under a new epoch.
        beat(&mut s, 3100);
        assert_eq!(writers(&s, "t")[3], (Some("b".into()), 2));
        assert_eq!(count(&s, "b"), 1);
        // The next one only three leases later; then 3 / 2, which stays.
        for now in [3500, 4000, 5000, 6000] {
            beat(&mut s, now);
            assert_eq!(count(&s, "b"), 1, "at {now}");
        }
        beat(&mut s, 6100);
        assert_eq!((count(&s, "a"), count(&s, "b")), (3, 2));
        for now in (7000..20_000).step_by(500) {
            beat(&mut s, now);
        }
        assert_eq!((count(&s, "a"), count(&s, "b")), (3, 2), "balanced within one: no more moves");
        // An agent whose lease lapsed takes nothing: b stops heartbeating, its partitions go
        // back to a, and nothing moves to b while it is gone.
        for now in (20_000..30_000).step_by(500) {
            assert_eq!(heartbeat(&mut s, "a", a, now), Response::Ok);
        }
        assert_eq!(count(&s, "a"), 5);
    }

    #[test]
    fn an_agent_that_handed_partitions_over_gets_none_back_for_ten_leases() {
        let mut s = MetadataState::default();
        let (a, b) = (register(&mut s, "a", 0), register(&mut s, "b", 0));
        create(&mut s, "t", 4, 0);
        let mine: Vec<u32> =
            (0..4).filter(|p| s.topics["t"].partitions[*p as usize].writer.as_deref() == Some("b")).collect();
        assert_eq!(mine.len(), 2);
        // b cannot reach a (but reaches metadata): it hands its partitions over at 100.
        for p in mine {
            let epoch = s.topics["t"].partitions[p as usize].epoch;
            let r = s.apply(&Command::HandOffWriter {
                topic: "t".into(),
                partition: p,
                agent: "b".into(),
                epoch,
                avoid: vec!["c".into()],
                now_ms: 100,
            });
            assert!(matches!(r, Response::Writer { ref agent, .. } if agent == "a"), "{r:?}");
        }
        let step = |s: &mut MetadataState, now: u64| {
            heartbeat(s, "a", a, now);
            heartbeat(s, "b", b, now);
            if let Some((_, p, _)) = s.rebalance_due() {
                stop_writer(s, p, now);
                move_writer(s, p, "a", now);
            }
            writers(s, "t").iter().filter(|(w, _)| w.as_deref() == Some("b")).count()
        };
        for now in (500..10_100).step_by(500) {
            assert_eq!(step(&mut s, now), 0, "at {now}: b handed partitions over at 100");
        }
        assert_eq!(step(&mut s, 10_100), 1);
    }

    /// What a writer's stop leaves in metadata: no segment open under its epoch (an empty one
    /// is removed).
    fn stop_writer(s: &mut MetadataState, partition: u32, now_ms: u64) {
        let p = &s.topics["t"].partitions[partition as usize];
        let Some(open) = p.open_segment().filter(|o| o.epoch == p.epoch) else { return };
        let seal = Command::SealSegment {
            record_witnesses_needed: false,
            unverified: Vec::new(),
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition,
            epoch: p.epoch,
            base_offset: open.base_offset,
            record_count: 0,
            size_bytes: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms,
        };
        assert_eq!(s.apply(&seal), Response::Ok);
    }

    /// `agent` moves `t/partition` away to balance the writers, at the partition's epoch.
    fn move_writer(s: &mut MetadataState, partition: u32, agent: &str, now_ms: u64) -> Response {
        let t = &s.topics["t"];
        let cmd = Command::MoveWriter {
            topic: "t".into(),
            topic_id: t.id,
            partition,
            agent: agent.into(),
            epoch: t.partitions[partition as usize].epoch,
            now_ms,
        };
        s.apply(&cmd)
    }

    /// a writes the 4 partitions of t; b, registered at 100 (leases of 1 s), is settled at
    /// 3100, when a move from a to b is due. Returns the state and a's and b's incarnations.
    fn a_move_due_at_3100() -> (MetadataState, u64, u64) {
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 0);
        create(&mut s, "t", 4, 0);
        let b = register(&mut s, "b", 100);
        for now in [500, 1000, 1500, 2000, 2500, 3000, 3100] {
            heartbeat(&mut s, "a", a, now);
            heartbeat(&mut s, "b", b, now);
        }
        (s, a, b)
    }

    #[test]
    fn only_the_writer_moves_a_partition_to_balance_and_only_while_a_move_off_it_is_due() {
        let (mut s, a, b) = a_move_due_at_3100();
        assert_eq!(s.rebalance_due(), Some(("t".into(), 0, "b".into())));
        let unchanged = |s: &mut MetadataState, cmd: Command, what: &str| {
            let before = s.clone();
            let r = s.apply(&cmd);
            assert!(matches!(r, Response::Error { .. }), "{what}: {r:?}");
            assert_eq!(*s, before, "{what}: a refused move changes nothing");
        };
        let cmd = |topic_id: u64, partition: u32, agent: &str, epoch: u64| Command::MoveWriter {
            topic: "t".into(),
            topic_id,
            partition,
            agent: agent.into(),
            epoch,
            now_ms: 3150,
        };
        let id = s.topics["t"].id;
        // Another agent cannot move a's partition, nor can a move it at an old epoch or of
        // another topic of the same name.
        unchanged(&mut s, cmd(id, 0, "b", 1), "not the writer");
        unchanged(&mut s, cmd(id, 0, "a", 0), "an old epoch");
        unchanged(&mut s, cmd(id + 1, 0, "a", 1), "another topic id");
        unchanged(&mut s, cmd(id, 9, "a", 1), "no such partition");
        // A segment open under the writer's epoch: the writer has not stopped (or started
        // again at that epoch), and keeps the partition.
        open_segment(&mut s, "t", 1, &["a", "b"]);
        unchanged(&mut s, cmd(id, 1, "a", 1), "a segment open under the writer's epoch");
        // The writer moves any of its partitions (not only the one the copy named first).
        assert_eq!(s.apply(&cmd(id, 2, "a", 1)), Response::Writer { agent: "b".into(), epoch: 2 });
        assert_eq!(writers(&s, "t")[2], (Some("b".into()), 2));
        // The next move is due three leases later: a proposal now is refused, and leaves the
        // clock where it was though it carries a later one.
        heartbeat(&mut s, "a", a, 3100);
        heartbeat(&mut s, "b", b, 3100);
        assert_eq!(s.clock_ms, 3150);
        let mut later = cmd(id, 0, "a", 1);
        if let Command::MoveWriter { now_ms, .. } = &mut later {
            *now_ms = 3400;
        }
        unchanged(&mut s, later, "a move no longer due");
    }

    #[test]
    fn a_rebalance_command_in_a_log_written_earlier_is_applied_as_before() {
        let (mut s, _, _) = a_move_due_at_3100();
        assert_eq!(s.apply(&Command::RebalanceWriters { now_ms: 3100 }), Response::Ok);
        assert_eq!(writers(&s, "t")[0], (Some("b".into()), 2));
    }

    fn hand_off(s: &mut MetadataState, agent: &str, epoch: u64, now_ms: u64) -> Response {
        s.apply(&Command::HandOffWriter {
            topic: "t".into(),
            partition: 0,
            agent: agent.into(),
            epoch,
            avoid: Vec::new(),
            now_ms,
        })
    }

    #[test]
    fn a_hand_off_skips_the_agents_the_writer_cannot_reach_unless_it_reaches_none() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        register(&mut s, "b", 0);
        register(&mut s, "c", 0);
        open_segment(&mut s, "t", 0, &["a", "c"]);
        let from = |agent: &str, epoch: u64, avoid: &[&str]| Command::HandOffWriter {
            topic: "t".into(),
            partition: 0,
            agent: agent.into(),
            epoch,
            avoid: avoid.iter().map(|a| a.to_string()).collect(),
            now_ms: 100,
        };
        // c holds the open segment, but a cannot reach it either: b.
        assert_eq!(s.apply(&from("a", 1, &["c"])), Response::Writer { agent: "b".into(), epoch: 2 });
        // b reaches nobody: it is the one cut off, and any live agent will do (a holder that
        // did not hand a partition over just now first).
        assert_eq!(s.apply(&from("b", 2, &["a", "c"])), Response::Writer { agent: "c".into(), epoch: 3 });
    }

    #[test]
    fn a_hand_off_passes_over_agents_that_handed_a_partition_over_lately_unless_none_else_is_live() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        register(&mut s, "b", 0);
        register(&mut s, "c", 0);
        open_segment(&mut s, "t", 0, &["a", "b"]);
        // a's disk failed: the other holder of the open segment, b, takes over.
        assert_eq!(hand_off(&mut s, "a", 1, 100), Response::Writer { agent: "b".into(), epoch: 2 });
        // b's disk fails too: not back to a, which handed a partition over lately, but to c,
        // though c holds nothing of the open segment.
        assert_eq!(hand_off(&mut s, "b", 2, 200), Response::Writer { agent: "c".into(), epoch: 3 });
        // c hands over while a and b both did lately: the holder with the fewest partitions.
        assert_eq!(hand_off(&mut s, "c", 3, 300), Response::Writer { agent: "a".into(), epoch: 4 });

        // Ten of its leases later an agent's hand-off is forgotten: the holder of the open
        // segment first again.
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        let (b, c) = (register(&mut s, "b", 0), register(&mut s, "c", 0));
        open_segment(&mut s, "t", 0, &["a", "b"]);
        assert_eq!(hand_off(&mut s, "a", 1, 100), Response::Writer { agent: "b".into(), epoch: 2 });
        let later = 100 + NO_REBALANCE_AFTER_HAND_OFF_LEASES * 1_000;
        for now in (500..=later).step_by(500) {
            for (agent, incarnation) in [("a", a), ("b", b), ("c", c)] {
                heartbeat(&mut s, agent, incarnation, now);
            }
        }
        assert_eq!(hand_off(&mut s, "b", 2, later), Response::Writer { agent: "a".into(), epoch: 3 });
    }

    #[test]
    fn a_writer_hands_its_partition_to_a_live_holder_of_the_open_segment_first() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 2, 0);
        let (b, c) = (register(&mut s, "b", 0), register(&mut s, "c", 0));
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 1), (Some("a".into()), 1)]);
        open_segment(&mut s, "t", 0, &["a", "c"]);
        // b writes nothing and c holds the open segment: c takes it.
        assert_eq!(hand_off(&mut s, "a", 1, 100), Response::Writer { agent: "c".into(), epoch: 2 });
        assert_eq!(writers(&s, "t")[0], (Some("c".into()), 2));

        // Refused, changing nothing: an agent that is not the writer, a stale epoch.
        let before = s.clone();
        let r = hand_off(&mut s, "a", 2, 100);
        assert!(matches!(r, Response::Error { error: MetadataError::InvalidArgument(_) }), "{r:?}");
        let r = hand_off(&mut s, "c", 1, 100);
        assert!(matches!(r, Response::Error { error: MetadataError::Fenced { .. } }), "{r:?}");
        assert_eq!(s, before);

        // c's only holder-peer a lapses: the live agent with the fewest partitions, b.
        heartbeat(&mut s, "b", b, 900);
        heartbeat(&mut s, "c", c, 900);
        heartbeat(&mut s, "b", b, 1_500);
        heartbeat(&mut s, "c", c, 1_500);
        assert_eq!(hand_off(&mut s, "c", 2, 1_500), Response::Writer { agent: "b".into(), epoch: 3 });

        // Nobody else live: refused, the writer keeps the partition.
        heartbeat(&mut s, "b", b, 2_400);
        let before = s.clone();
        let r = hand_off(&mut s, "b", 3, 3_000);
        assert!(matches!(r, Response::Error { error: MetadataError::InvalidArgument(_) }), "{r:?}");
        assert_eq!(s, before);
    }

    #[test]
    fn the_open_segments_holders_are_preferred_and_get_unrecovered_partitions_back() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        open_segment(&mut s, "t", 0, &["a", "c"]);
        let b = register(&mut s, "b", 500);
        let c = register(&mut s, "c", 600);
        // a lapses: c holds the open segment, so c (not the idle b) becomes writer.
        heartbeat(&mut s, "b", b, 1100);
        heartbeat(&mut s, "c", c, 1100);
        assert_eq!(writers(&s, "t"), vec![(Some("c".into()), 2)]);

        // With the only holder gone, any live agent is named; when the holder comes back
        // before the new writer recovered the segment, it gets the partition back.
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        open_segment(&mut s, "t", 0, &["a"]);
        let b = register(&mut s, "b", 500);
        heartbeat(&mut s, "b", b, 1001);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2)]);
        register(&mut s, "a", 1002);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 3)]);

        // Once the new writer recovered (a segment opened under its epoch), nothing moves back.
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        open_segment(&mut s, "t", 0, &["a"]);
        let b = register(&mut s, "b", 500);
        heartbeat(&mut s, "b", b, 1001);
        let r = s.apply(&Command::SealSegment {
            record_witnesses_needed: false,
            unverified: Vec::new(),
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 2,
            base_offset: 0,
            record_count: 5,
            size_bytes: 100,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 1001,
        });
        assert_eq!(r, Response::Ok);
        open_segment(&mut s, "t", 0, &["b"]);
        register(&mut s, "a", 1002);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2)]);
    }

    #[test]
    fn deregistering_hands_partitions_over_at_once() {
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        register(&mut s, "b", 1);
        assert_eq!(
            s.apply(&Command::DeregisterAgent { agent: "a".into(), incarnation: a, now_ms: 2 }),
            Response::Ok
        );
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2)]);
        assert_eq!(s.live_agents().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(register(&mut s, "a", 3), a + 1, "incarnations keep counting");
    }

    #[test]
    fn the_clock_never_runs_backwards() {
        let mut s = MetadataState::default();
        let a = register(&mut s, "a", 5000);
        create(&mut s, "t", 1, 0);
        let b = register(&mut s, "b", 100);
        // b's clock is behind: its registration is stamped with the state's clock.
        assert_eq!(s.agents["b"].last_heartbeat_ms, 5000);
        assert_eq!(heartbeat(&mut s, "a", a, 10), Response::Ok);
        assert_eq!(s.clock_ms, 5000);
        assert_eq!(heartbeat(&mut s, "b", b, 6000), Response::Ok);
        assert_eq!(writers(&s, "t"), vec![(Some("a".into()), 1)], "a heartbeat at 5000 holds until 6000");
        assert_eq!(heartbeat(&mut s, "b", b, 6001), Response::Ok);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2)]);
    }

    #[test]
    fn the_leader_stamps_its_clock_on_lease_commands() {
        let mut heartbeat = Command::AgentHeartbeat { agent: "a".into(), incarnation: 1, now_ms: 5 };
        heartbeat.stamp_clock(1_000);
        assert_eq!(heartbeat, Command::AgentHeartbeat { agent: "a".into(), incarnation: 1, now_ms: 1_000 });
        let mut seal = Command::SealSegment {
            record_witnesses_needed: false,
            unverified: Vec::new(),
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset: 0,
            record_count: 1,
            size_bytes: 1,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 5,
        };
        let before = seal.clone();
        seal.stamp_clock(1_000);
        assert_eq!(seal, before, "only commands whose clock decides something are stamped");
    }

    #[test]
    fn a_live_id_is_refused_to_another_data_directory() {
        let mut s = MetadataState::default();
        let reg = |instance: &str, now_ms| Command::RegisterAgent {
            agent: "a".into(),
            instance: instance.into(),
            addr: "h:1".into(),
            lease_ms: 1000,
            now_ms,
        };
        assert_eq!(s.apply(&reg("dir-1", 0)), Response::Registered { incarnation: 1 });
        // The same directory (a restart) registers again at once.
        assert_eq!(s.apply(&reg("dir-1", 10)), Response::Registered { incarnation: 2 });
        let before = s.clone();
        let refused = s.apply(&reg("dir-2", 20));
        assert!(
            matches!(&refused, Response::Error { error } if error.to_string().contains("another data directory")),
            "{refused:?}"
        );
        assert_eq!(s, before);
        // Once that lease lapsed, the id is free.
        assert_eq!(s.apply(&reg("dir-2", 1011)), Response::Registered { incarnation: 3 });
    }

    #[test]
    fn bad_registrations_change_nothing() {
        let mut s = MetadataState::default();
        for (agent, addr, lease_ms) in [
            ("", "h:1", 1000),
            ("a", "", 1000),
            ("a", "h 1", 1000),
            ("a", "h:1", 10),
            ("a", "h:1", 10_000_000),
        ] {
            let r = s.apply(&Command::RegisterAgent {
                instance: String::new(),
                agent: agent.into(),
                addr: addr.into(),
                lease_ms,
                now_ms: 1,
            });
            assert!(matches!(r, Response::Error { .. }), "{agent} {addr} {lease_ms}: {r:?}");
        }
        assert_eq!(s, MetadataState::default());
        assert!(matches!(heartbeat(&mut s, "nobody", 1, 1), Response::Error { .. }));
    }

    #[test]
    fn long_gone_agents_are_forgotten_once_they_write_nothing() {
        let mut s = MetadataState::default();
        register(&mut s, "a", 0);
        create(&mut s, "t", 1, 0);
        let b = register(&mut s, "b", 1);
        heartbeat(&mut s, "b", b, 1001);
        assert_eq!(writers(&s, "t"), vec![(Some("b".into()), 2)]);
        assert!(s.agents.contains_key("a"), "lapsed agents stay listed");
        register(&mut s, "c", AGENT_FORGET_MS + 2000);
        assert!(!s.agents.contains_key("a"), "lapsed long ago and writes nothing");
        assert!(s.agents.contains_key("b"), "it still wrote t/0 when the registry was pruned");
        assert_eq!(writers(&s, "t"), vec![(Some("c".into()), 3)]);
    }
}
