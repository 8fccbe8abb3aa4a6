//! The metadata state machine: plain data and a deterministic `apply`, with no I/O.
//!
//! Everything that varies between replicas (wall-clock time, ids) arrives inside the
//! [`Command`], so every node that applies the same log reaches the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::agent_registry::AgentInfo;
use crate::topic_config::{TopicConfig, PARTITIONS_MAX};
use crate::MetadataError;

/// Longest consumer group or member name.
pub const NAME_BYTES_MAX: usize = 249;
/// Most acknowledged ranges above the floor one checkpoint may carry per partition.
pub const ACKED_RANGES_MAX: usize = 10_000;
/// Most members one group may have on one topic.
pub const GROUP_MEMBERS_MAX: usize = 1_000;

/// The whole replicated metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataState {
    /// Topics by name.
    pub topics: BTreeMap<String, Topic>,
    /// Consumer groups by name.
    pub groups: BTreeMap<String, Group>,
    /// Id given to the next topic created; ids are never reused.
    pub next_topic_id: u64,
    /// Registered agents by id, live or with a lapsed lease.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentInfo>,
    /// The newest proposer clock seen (ms since the Unix epoch); leases are judged by it, so
    /// time in the state machine never runs backwards.
    #[serde(default)]
    pub clock_ms: u64,
    /// When a partition last moved to balance the writers (`clock_ms` then).
    #[serde(default)]
    pub last_rebalance_ms: u64,
}

/// A topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    /// The topic name (Kafka's naming rules).
    pub name: String,
    /// Unique for the lifetime of the cluster: a deleted and re-created topic gets a new id.
    pub id: u64,
    /// The topic's configuration.
    pub config: TopicConfig,
    /// Partitions, indexed by partition number.
    pub partitions: Vec<Partition>,
    /// When the topic was created (ms since the Unix epoch).
    pub created_ms: u64,
    /// Bumped by every change of `config`: the archive's description of the topic with the
    /// highest version is the newest (see `silt_tiering::topic_descriptor`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub config_version: u64,
}

/// One partition: who writes it, under which epoch, and its chain of segments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// The agent that currently writes this partition.
    pub writer: Option<String>,
    /// Bumped every time the writer changes; replicas refuse older epochs.
    pub epoch: u64,
    /// Segments by base offset.
    pub segments: BTreeMap<u64, Segment>,
    /// Where the log ends when no segment says so, and the least offset the next segment may
    /// start at: a seal of no records removed the chain's only segment (retention had deleted
    /// the others), or a rebuild of metadata from the archive found local data past the
    /// archived end (those offsets may have been acknowledged). The next segment starts here or
    /// after, never below, or offsets would be used twice. 0 for a partition never written.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub empty_end: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Partition {
    /// The offset the next new segment must start at: one past the last sealed record, or
    /// `empty_end` where that is further.
    pub fn next_segment_base(&self) -> u64 {
        self.segments
            .values()
            .next_back()
            .map_or(self.empty_end, |s| s.last_offset.map_or(s.base_offset, |l| l + 1))
            .max(self.empty_end)
    }

    /// The first offset the chain describes: its first segment's, or where an empty chain ends
    /// (everything below was deleted by retention).
    pub fn first_offset(&self) -> u64 {
        self.segments.keys().next().copied().unwrap_or(self.empty_end)
    }

    /// Whether every offset of `first..=last` is in an archived segment, or was deleted by
    /// retention (it is below the chain's first segment): a local copy of them is only a cache.
    pub fn is_archived(&self, first: u64, last: u64) -> bool {
        let start = self.first_offset();
        // Segments do not overlap: only the one holding `first` can hold all of them.
        last < start
            || self.segments.range(..=first).next_back().is_some_and(|(_, seg)| {
                seg.state == SegmentState::Archived && seg.last_offset.is_some_and(|l| l >= last)
            })
    }

    /// The segment that is open for appends, if any.
    pub fn open_segment(&self) -> Option<&Segment> {
        self.segments.values().next_back().filter(|s| s.state == SegmentState::Open)
    }
}

/// Lifecycle of a segment: `Open -> Sealed -> Archived -> Deleted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentState {
    /// Receiving appends from its writer.
    Open,
    /// Immutable; waiting to be archived.
    Sealed,
    /// Its records live in an object in the bucket.
    Archived,
}

/// A contiguous range of a partition's offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// First offset of the segment.
    pub base_offset: u64,
    /// Last offset, known once sealed.
    pub last_offset: Option<u64>,
    /// Lifecycle state.
    pub state: SegmentState,
    /// Partition epoch under which the segment was opened.
    pub epoch: u64,
    /// Agents holding replicas; the writer that opened the segment first.
    pub ensemble: Vec<String>,
    /// The data-directory instance of each ensemble member when the segment was opened
    /// (empty if unknown): a member whose instance changed since lost its replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
    /// Bytes on disk (known once sealed).
    pub size_bytes: u64,
    /// Records in the segment (known once sealed).
    pub record_count: u64,
    /// Smallest and largest record timestamp (known once sealed).
    pub min_timestamp_ms: Option<i64>,
    /// Largest record timestamp.
    pub max_timestamp_ms: Option<i64>,
    /// When the segment was opened.
    pub opened_ms: u64,
    /// When the segment was sealed.
    pub sealed_ms: Option<u64>,
    /// Object key once archived.
    pub object_key: Option<String>,
    /// Size of the archived object.
    #[serde(default)]
    pub object_bytes: u64,
    /// When the segment was archived.
    #[serde(default)]
    pub archived_ms: Option<u64>,
}

/// How a group shares a topic among its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupMode {
    /// Partitions are assigned to members; order is kept per partition.
    Exclusive,
    /// Any member gets any message under a lease, like a work queue.
    Shared,
}

impl std::fmt::Display for GroupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GroupMode::Exclusive => "exclusive",
            GroupMode::Shared => "shared",
        })
    }
}

/// A consumer group: its mode and its state per subscribed topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// Chosen by the first member that joins; later members must agree.
    pub mode: GroupMode,
    /// State per topic.
    pub topics: BTreeMap<String, GroupTopic>,
}

/// A group's members, assignment and acknowledgements on one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupTopic {
    /// Live members by id.
    pub members: BTreeMap<String, Member>,
    /// Bumped whenever the assignment changes.
    pub generation: u64,
    /// Partition -> member (exclusive mode only).
    pub assignment: BTreeMap<u32, String>,
    /// Acknowledgement checkpoint per partition.
    pub acks: BTreeMap<u32, AckCheckpoint>,
}

/// A group member's liveness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Last join or heartbeat.
    pub last_seen_ms: u64,
    /// The member is dropped when not seen for this long.
    pub session_timeout_ms: u64,
}

/// Acknowledged offsets of one partition: everything below `floor`, plus `acked` ranges above it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckCheckpoint {
    /// Every offset below this is acknowledged. Never moves backwards.
    pub floor: u64,
    /// Sorted, disjoint, inclusive ranges of acknowledged offsets above `floor`.
    pub acked: Vec<(u64, u64)>,
}

/// A change to the metadata. Each is applied atomically, in log order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Command {
    /// Create a topic.
    CreateTopic {
        /// Topic name; validated by the caller against Kafka's naming rules.
        name: String,
        /// Number of partitions.
        partitions: u32,
        /// Config overrides by Kafka-style name.
        config: BTreeMap<String, String>,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Change some of a topic's configs (all or none): agents apply them from their next
    /// housekeeping round on. `replication.factor` and `min.insync.replicas` cannot change.
    AlterTopicConfig {
        /// Topic name.
        name: String,
        /// If set, the command is refused unless the topic has this id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// New values by Kafka-style name.
        config: BTreeMap<String, String>,
    },
    /// Delete a topic and every group's state for it.
    DeleteTopic {
        /// Topic name.
        name: String,
        /// If set, the command is refused unless the topic has this id (it was not deleted
        /// and re-created since the proposer looked).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
    },
    /// Make `agent` the writer of a partition, bumping the epoch.
    ClaimWriter {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: u32,
        /// The agent that becomes writer.
        agent: String,
        /// If set, the claim only succeeds when the current epoch equals this.
        expected_epoch: Option<u64>,
    },
    /// Open a new segment at the end of the partition.
    OpenSegment {
        /// Topic name.
        topic: String,
        /// If set, the command is refused unless the topic has this id (it was not deleted
        /// and re-created since the proposer looked).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// Partition number.
        partition: u32,
        /// Writer's epoch; must be the partition's current epoch.
        epoch: u64,
        /// First offset; must follow the last sealed segment.
        base_offset: u64,
        /// Agents holding replicas, the writer first.
        ensemble: Vec<String>,
        /// Their data-directory instances, in the same order (may be empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        instances: Vec<String>,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Seal the open segment at its final end. An empty segment is removed instead.
    SealSegment {
        /// The ensemble members that hold the whole segment, if not all of them (a follower
        /// that left the ensemble midway holds only part of it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replicas: Option<Vec<String>>,
        /// Topic name.
        topic: String,
        /// If set, the command is refused unless the topic has this id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// Partition number.
        partition: u32,
        /// Writer's epoch; must be the partition's current epoch.
        epoch: u64,
        /// The segment's base offset.
        base_offset: u64,
        /// Records in the segment; `0` removes it.
        record_count: u64,
        /// Bytes on disk.
        size_bytes: u64,
        /// Smallest record timestamp.
        min_timestamp_ms: Option<i64>,
        /// Largest record timestamp.
        max_timestamp_ms: Option<i64>,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// A writer's roll: `seal` (a `seal_segment`) and then `open` (an `open_segment` of the same
    /// partition under the same epoch, starting right after the sealed segment), both or neither.
    RollSegment {
        /// Seals the open segment.
        seal: Box<Command>,
        /// Opens the next one.
        open: Box<Command>,
    },
    /// Ensemble repair: agent `with` now holds a full copy of a sealed segment that has fewer
    /// members than the topic's replication factor (sealed after a follower left midway).
    AddReplica {
        /// Topic name.
        topic: String,
        /// The topic's id.
        topic_id: u64,
        /// Partition number.
        partition: u32,
        /// The segment's base offset; the segment must be sealed.
        base_offset: u64,
        /// The new member; not yet in the ensemble.
        with: String,
        /// The new member's data-directory instance.
        instance: String,
    },
    /// Ensemble repair: agent `with` now holds a full copy of a sealed segment in place of
    /// `gone` (an agent that is gone, or lost its disk).
    ReplaceReplica {
        /// Topic name.
        topic: String,
        /// The topic's id.
        topic_id: u64,
        /// Partition number.
        partition: u32,
        /// The segment's base offset; the segment must be sealed.
        base_offset: u64,
        /// The member replaced.
        gone: String,
        /// The new member; not yet in the ensemble.
        with: String,
        /// The new member's data-directory instance.
        instance: String,
    },
    /// Record that a sealed segment's records are in an object in the bucket. Only after this
    /// may agents drop their local copies.
    ArchiveSegment {
        /// Topic name.
        topic: String,
        /// If set, the command is refused unless the topic has this id (it was not deleted
        /// and re-created since the proposer looked).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// Partition number.
        partition: u32,
        /// The segment's base offset.
        base_offset: u64,
        /// Its last offset, as the archived object holds it; must match the sealed segment.
        last_offset: u64,
        /// Object key (full path in the bucket).
        object_key: String,
        /// Object size.
        object_bytes: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Forget archived segments (retention): the objects are deleted after this is applied.
    DeleteArchivedSegments {
        /// Topic name.
        topic: String,
        /// If set, the command is refused unless the topic has this id (it was not deleted
        /// and re-created since the proposer looked).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// Partition number.
        partition: u32,
        /// Base offsets of the segments to forget; each must be archived and older than any
        /// segment that stays.
        base_offsets: Vec<u64>,
    },
    /// Rebuild the topics from the bucket's description of them: create a topic with the id,
    /// configs and partition count it had. Restoring a topic that exists with the same id and
    /// partition count is harmless; any other topic of that name is refused. Ids handed out
    /// later are above `id`.
    RestoreTopic {
        /// Topic name.
        name: String,
        /// The id it had; `None` for the next free id (an archive that does not describe it).
        id: Option<u64>,
        /// Number of partitions.
        partitions: u32,
        /// Its configuration, whole.
        config: TopicConfig,
        /// Its config version.
        config_version: u64,
        /// When it was created.
        created_ms: u64,
    },
    /// Rebuild: topic ids below `below` were handed out (to topics since deleted, or found in
    /// local logs) and are never handed out again.
    ReserveTopicIds {
        /// The least id the next topic created may get.
        below: u64,
    },
    /// Rebuild: the next segment of a partition starts at `end` or after, because offsets
    /// below it may have been handed out (local data past the archive). Never lowers it.
    RestorePartitionEnd {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: u32,
        /// The least offset the next segment may start at.
        end: u64,
    },
    /// Rebuild the offset map from the bucket: add an archived segment found in an object's
    /// footer, creating the topic with default configs if it does not exist.
    RestoreArchivedSegment {
        /// Topic name.
        topic: String,
        /// The topic's partition count, from the footer.
        partitions: u32,
        /// Partition number.
        partition: u32,
        /// First offset.
        base_offset: u64,
        /// Last offset.
        last_offset: u64,
        /// Records in the object.
        record_count: u64,
        /// Smallest record timestamp.
        min_timestamp_ms: Option<i64>,
        /// Largest record timestamp.
        max_timestamp_ms: Option<i64>,
        /// Object key.
        object_key: String,
        /// Object size.
        object_bytes: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Join a group on a topic, or heartbeat as an existing member.
    JoinGroup {
        /// Group name.
        group: String,
        /// Topic name.
        topic: String,
        /// Member id.
        member: String,
        /// Requested mode; must match the group's.
        mode: GroupMode,
        /// The member is dropped after this long without a heartbeat.
        session_timeout_ms: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Leave a group on a topic.
    LeaveGroup {
        /// Group name.
        group: String,
        /// Topic name.
        topic: String,
        /// Member id.
        member: String,
    },
    /// Record acknowledgements. The floor never moves backwards.
    CommitAcks {
        /// Group name.
        group: String,
        /// Topic name.
        topic: String,
        /// If set, the command is refused unless the topic has this id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
        /// Partition number.
        partition: u32,
        /// Everything below is acknowledged.
        floor: u64,
        /// Acknowledged inclusive ranges above the floor.
        acked: Vec<(u64, u64)>,
    },
    /// Delete a group.
    DeleteGroup {
        /// Group name.
        group: String,
    },
    /// An agent (re)starts: it gets a new incarnation and a lease, and every partition it
    /// writes gets a new epoch, so whatever its previous incarnation did is fenced.
    RegisterAgent {
        /// Agent id.
        agent: String,
        /// Identifies the agent's data directory (made once, kept in it). While the id's
        /// current incarnation is live, only the same data directory may register it again.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        instance: String,
        /// Where other agents and clients reach it (`host:port`).
        addr: String,
        /// The lease lapses this long after the last heartbeat.
        lease_ms: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// An agent renews its lease. Partitions of agents whose lease lapsed get new writers.
    AgentHeartbeat {
        /// Agent id.
        agent: String,
        /// The incarnation `RegisterAgent` returned; an older one is refused.
        incarnation: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// A writer that cannot reach a quorum of agents while metadata counts them live (it is
    /// cut off from them, not from metadata) hands its partition to another live agent: a live
    /// member of the open segment's ensemble if there is one, else the live agent with the
    /// fewest partitions. The epoch is bumped; refused when no other agent is live.
    HandOffWriter {
        /// Topic name.
        topic: String,
        /// Partition number.
        partition: u32,
        /// The agent handing the partition off; must be its writer.
        agent: String,
        /// The partition's epoch the agent writes under; must be the current one.
        epoch: u64,
        /// Agents the proposer cannot reach: passed over, unless it reaches no live agent.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        avoid: Vec<String>,
        /// Proposer's clock.
        now_ms: u64,
    },
    /// Move one partition towards balance (see `MetadataState::rebalance_writers`), if one is
    /// due. Agents propose it when their copy of the state shows one is.
    RebalanceWriters {
        /// Proposer's clock.
        now_ms: u64,
    },
    /// An agent leaves on purpose: its lease ends now, so its partitions get new writers at once.
    DeregisterAgent {
        /// Agent id.
        agent: String,
        /// The incarnation `RegisterAgent` returned; an older one is refused.
        incarnation: u64,
        /// Proposer's clock.
        now_ms: u64,
    },
}

/// What applying a command produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Response {
    /// Applied; nothing to return.
    Ok,
    /// The topic as it is after the command.
    Topic {
        /// The topic.
        topic: Topic,
    },
    /// The partition's epoch after a writer claim.
    Epoch {
        /// New epoch.
        epoch: u64,
    },
    /// A partition's writer and epoch after a hand-off.
    Writer {
        /// The new writer.
        agent: String,
        /// The new epoch.
        epoch: u64,
    },
    /// A member's view of its group after join or heartbeat.
    Membership {
        /// Assignment generation.
        generation: u64,
        /// Partitions assigned to this member (all partitions in shared mode).
        partitions: Vec<u32>,
    },
    /// An agent's incarnation after it registered.
    Registered {
        /// Distinguishes this process of the agent from earlier ones.
        incarnation: u64,
    },
    /// The command was refused; the state is unchanged.
    Error {
        /// Why.
        error: MetadataError,
    },
}

impl Command {
    /// Replaces the proposer's clock with `now_ms` (the metadata leader's) in the commands
    /// whose clock decides something: leases (agents), topic creation (which names writers by
    /// lease) and group membership (session timeouts). Agents' clocks may disagree; the
    /// leader's, kept monotonic by `MetadataState::clock_ms`, is the one clock leases are
    /// judged by.
    pub fn stamp_clock(&mut self, now: u64) {
        match self {
            Command::RegisterAgent { now_ms, .. }
            | Command::AgentHeartbeat { now_ms, .. }
            | Command::DeregisterAgent { now_ms, .. }
            | Command::HandOffWriter { now_ms, .. }
            | Command::RebalanceWriters { now_ms }
            | Command::CreateTopic { now_ms, .. }
            | Command::JoinGroup { now_ms, .. } => *now_ms = now,
            _ => {}
        }
    }
}

impl Response {
    /// Turns an `Error` response into `Err`.
    pub fn into_result(self) -> Result<Response, MetadataError> {
        match self {
            Response::Error { error } => Err(error),
            other => Ok(other),
        }
    }
}

impl MetadataState {
    /// Applies one command. On error the state is unchanged.
    pub fn apply(&mut self, command: &Command) -> Response {
        match self.try_apply(command) {
            Ok(r) => r,
            Err(error) => Response::Error { error },
        }
    }

    fn try_apply(&mut self, command: &Command) -> Result<Response, MetadataError> {
        match command {
            Command::CreateTopic { name, partitions, config, now_ms } => {
                if self.topics.contains_key(name) {
                    return Err(MetadataError::TopicExists(name.clone()));
                }
                if *partitions == 0 || *partitions > PARTITIONS_MAX {
                    return Err(MetadataError::InvalidArgument(format!(
                        "a topic needs between 1 and {PARTITIONS_MAX} partitions, got {partitions}"
                    )));
                }
                let config = TopicConfig::from_overrides(config)?;
                let topic = Topic {
                    name: name.clone(),
                    id: self.next_topic_id,
                    config,
                    partitions: vec![Partition::default(); *partitions as usize],
                    created_ms: *now_ms,
                    config_version: 0,
                };
                self.next_topic_id += 1;
                self.topics.insert(name.clone(), topic);
                self.advance_clock(*now_ms);
                self.assign_writers();
                Ok(Response::Topic { topic: self.topics[name].clone() })
            }
            Command::DeleteTopic { name, topic_id } => {
                self.check_topic_id(name, *topic_id)?;
                if self.topics.remove(name).is_none() {
                    return Err(MetadataError::UnknownTopic(name.clone()));
                }
                for group in self.groups.values_mut() {
                    group.topics.remove(name);
                }
                self.groups.retain(|_, g| !g.topics.is_empty());
                Ok(Response::Ok)
            }
            Command::AlterTopicConfig { name, topic_id, config } => {
                self.check_topic_id(name, *topic_id)?;
                let topic =
                    self.topics.get_mut(name).ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                topic.config = topic.config.altered(config)?;
                topic.config_version += 1;
                Ok(Response::Ok)
            }
            Command::ClaimWriter { topic, partition, agent, expected_epoch } => {
                let p = self.partition_mut(topic, *partition)?;
                if let Some(expected) = expected_epoch {
                    if *expected != p.epoch {
                        return Err(MetadataError::Fenced { expected: *expected, actual: p.epoch });
                    }
                }
                p.epoch += 1;
                p.writer = Some(agent.clone());
                Ok(Response::Epoch { epoch: p.epoch })
            }
            Command::OpenSegment {
                topic,
                topic_id,
                partition,
                epoch,
                base_offset,
                ensemble,
                instances,
                now_ms,
            } => {
                self.check_topic_id(topic, *topic_id)?;
                let p = self.partition_mut(topic, *partition)?;
                check_epoch(p, *epoch)?;
                if let Some(open) = p.open_segment() {
                    return Err(MetadataError::InvalidArgument(format!(
                        "partition {topic}/{partition} already has an open segment at offset {}",
                        open.base_offset
                    )));
                }
                let expected = p.next_segment_base();
                if *base_offset != expected {
                    return Err(MetadataError::InvalidArgument(format!(
                        "a new segment of {topic}/{partition} must start at offset {expected}, not {base_offset}"
                    )));
                }
                p.segments
                    .insert(*base_offset, open_segment(*base_offset, *epoch, ensemble, instances, *now_ms));
                Ok(Response::Ok)
            }
            Command::SealSegment {
                topic,
                topic_id,
                partition,
                epoch,
                base_offset,
                record_count,
                size_bytes,
                min_timestamp_ms,
                max_timestamp_ms,
                replicas,
                now_ms,
            } => {
                self.check_topic_id(topic, *topic_id)?;
                let p = self.partition_mut(topic, *partition)?;
                check_epoch(p, *epoch)?;
                let segment = match p.segments.get_mut(base_offset) {
                    Some(s) if s.state == SegmentState::Open => s,
                    _ => {
                        return Err(MetadataError::InvalidArgument(format!(
                            "partition {topic}/{partition} has no open segment at offset {base_offset}"
                        )))
                    }
                };
                if *record_count == 0 {
                    p.segments.remove(base_offset);
                    if p.segments.is_empty() {
                        p.empty_end = *base_offset;
                    }
                    return Ok(Response::Ok);
                }
                if let Some(keep) = replicas {
                    // The writer names the members that hold the whole segment: a follower
                    // that left the ensemble midway holds only part of it.
                    if keep.is_empty() || keep.iter().any(|a| !segment.ensemble.contains(a)) {
                        return Err(MetadataError::InvalidArgument(format!(
                            "the replicas of segment {base_offset} must be members of its ensemble {:?}",
                            segment.ensemble
                        )));
                    }
                    let kept: Vec<(String, String)> = segment
                        .ensemble
                        .iter()
                        .enumerate()
                        .filter(|(_, a)| keep.contains(a))
                        .map(|(i, a)| (a.clone(), segment.instances.get(i).cloned().unwrap_or_default()))
                        .collect();
                    let had_instances = !segment.instances.is_empty();
                    segment.ensemble = kept.iter().map(|(a, _)| a.clone()).collect();
                    segment.instances =
                        if had_instances { kept.into_iter().map(|(_, i)| i).collect() } else { Vec::new() };
                }
                segment.last_offset = Some(base_offset + record_count - 1);
                segment.state = SegmentState::Sealed;
                segment.record_count = *record_count;
                segment.size_bytes = *size_bytes;
                segment.min_timestamp_ms = *min_timestamp_ms;
                segment.max_timestamp_ms = *max_timestamp_ms;
                segment.sealed_ms = Some(*now_ms);
                Ok(Response::Ok)
            }
            Command::RollSegment { seal, open } => {
                let (
                    Command::SealSegment {
                        topic, topic_id, partition, epoch, base_offset, record_count, ..
                    },
                    Command::OpenSegment {
                        topic: open_topic,
                        topic_id: open_topic_id,
                        partition: open_partition,
                        epoch: open_epoch,
                        base_offset: open_base,
                        ensemble,
                        instances,
                        now_ms,
                    },
                ) = (seal.as_ref(), open.as_ref())
                else {
                    return Err(MetadataError::InvalidArgument(
                        "a roll_segment is a seal_segment and an open_segment".into(),
                    ));
                };
                if (topic, topic_id, partition, epoch)
                    != (open_topic, open_topic_id, open_partition, open_epoch)
                {
                    return Err(MetadataError::InvalidArgument(format!(
                        "a roll seals and opens segments of one partition under one epoch, not \
                         {topic}/{partition} at epoch {epoch} and {open_topic}/{open_partition} at epoch {open_epoch}"
                    )));
                }
                let next = base_offset.checked_add(*record_count).ok_or_else(|| {
                    MetadataError::InvalidArgument(format!(
                        "{record_count} records from offset {base_offset} overflow"
                    ))
                })?;
                if *open_base != next {
                    return Err(MetadataError::InvalidArgument(format!(
                        "the segment after {base_offset} ({record_count} records) of {topic}/{partition} \
                         must start at offset {next}, not {open_base}"
                    )));
                }
                if *record_count == 0 {
                    // An empty open segment opened again with another ensemble: replaced in
                    // place. Removed first (as a seal of no records does), it could leave no
                    // segment to say where the partition's next offset is (retention keeps
                    // only the open one of a quiet partition).
                    self.check_topic_id(topic, *topic_id)?;
                    let p = self.partition_mut(topic, *partition)?;
                    check_epoch(p, *epoch)?;
                    if !p.segments.get(base_offset).is_some_and(|s| s.state == SegmentState::Open) {
                        return Err(MetadataError::InvalidArgument(format!(
                            "partition {topic}/{partition} has no open segment at offset {base_offset}"
                        )));
                    }
                    p.segments.insert(
                        *base_offset,
                        open_segment(*base_offset, *epoch, ensemble, instances, *now_ms),
                    );
                    return Ok(Response::Ok);
                }
                // The seal changes nothing when refused. Once it is applied the open cannot be:
                // same topic, id and epoch, the partition has no open segment left, and the
                // sealed segment (the chain's last, holding records) ends where the new one starts.
                self.try_apply(seal)?;
                self.try_apply(open)
            }
            Command::ReplaceReplica { topic, topic_id, partition, base_offset, gone, with, instance } => {
                let seg =
                    self.sealed_segment_for_new_member(topic, *topic_id, *partition, *base_offset, with)?;
                let Some(i) = seg.ensemble.iter().position(|a| a == gone) else {
                    return Err(MetadataError::InvalidArgument(format!(
                        "agent '{gone}' holds no replica of segment {base_offset} of {topic}/{partition}"
                    )));
                };
                seg.ensemble[i] = with.clone();
                if let Some(slot) = seg.instances.get_mut(i) {
                    *slot = instance.clone();
                }
                Ok(Response::Ok)
            }
            Command::AddReplica { topic, topic_id, partition, base_offset, with, instance } => {
                let wanted = self.topics.get(topic).map_or(0, |t| t.config.replication_factor as usize);
                let seg =
                    self.sealed_segment_for_new_member(topic, *topic_id, *partition, *base_offset, with)?;
                if seg.ensemble.len() >= wanted {
                    return Err(MetadataError::InvalidArgument(format!(
                        "segment {base_offset} of {topic}/{partition} already has {} members (replication.factor={wanted})",
                        seg.ensemble.len()
                    )));
                }
                // Instances are recorded for every member or for none.
                if seg.instances.len() == seg.ensemble.len() && !seg.instances.is_empty() {
                    seg.instances.push(instance.clone());
                }
                seg.ensemble.push(with.clone());
                Ok(Response::Ok)
            }
            Command::ArchiveSegment {
                topic,
                topic_id,
                partition,
                base_offset,
                last_offset,
                object_key,
                object_bytes,
                now_ms,
            } => {
                self.check_topic_id(topic, *topic_id)?;
                let p = self.partition_mut(topic, *partition)?;
                let segment = p.segments.get_mut(base_offset).ok_or_else(|| {
                    MetadataError::InvalidArgument(format!(
                        "partition {topic}/{partition} has no segment at offset {base_offset}"
                    ))
                })?;
                match segment.state {
                    SegmentState::Sealed if segment.last_offset == Some(*last_offset) => {}
                    SegmentState::Archived if segment.object_key.as_deref() == Some(object_key.as_str()) => {
                        // A retry after a lost reply: already done.
                        return Ok(Response::Ok);
                    }
                    state => {
                        return Err(MetadataError::InvalidArgument(format!(
                            "segment {base_offset} of {topic}/{partition} is {state:?} ending at {:?}; only a sealed segment ending at {last_offset} can be archived",
                            segment.last_offset
                        )))
                    }
                }
                segment.state = SegmentState::Archived;
                segment.object_key = Some(object_key.clone());
                segment.object_bytes = *object_bytes;
                segment.archived_ms = Some(*now_ms);
                Ok(Response::Ok)
            }
            Command::DeleteArchivedSegments { topic, topic_id, partition, base_offsets } => {
                self.check_topic_id(topic, *topic_id)?;
                let p = self.partition_mut(topic, *partition)?;
                let oldest: Vec<u64> = p.segments.keys().take(base_offsets.len()).copied().collect();
                let mut wanted = base_offsets.clone();
                wanted.sort_unstable();
                if wanted != oldest || wanted.iter().any(|b| p.segments[b].state != SegmentState::Archived) {
                    return Err(MetadataError::InvalidArgument(format!(
                        "only the oldest archived segments of {topic}/{partition} can be deleted, in order"
                    )));
                }
                // The last segment is never deleted: it anchors where the next one starts.
                if wanted.len() == p.segments.len() {
                    return Err(MetadataError::InvalidArgument(format!(
                        "the newest segment of {topic}/{partition} cannot be deleted"
                    )));
                }
                for b in wanted {
                    p.segments.remove(&b);
                }
                Ok(Response::Ok)
            }
            Command::RestoreTopic { name, id, partitions, config, config_version, created_ms } => {
                if *partitions == 0 || *partitions > PARTITIONS_MAX {
                    return Err(MetadataError::InvalidArgument(format!(
                        "a topic needs between 1 and {PARTITIONS_MAX} partitions, got {partitions}"
                    )));
                }
                if let Some(existing) = self.topics.get(name) {
                    if id.is_none_or(|id| id == existing.id)
                        && existing.partitions.len() == *partitions as usize
                    {
                        return Ok(Response::Topic { topic: existing.clone() });
                    }
                    return Err(MetadataError::TopicExists(name.clone()));
                }
                if let Some(taken) = id.and_then(|id| self.topics.values().find(|t| t.id == id)) {
                    return Err(MetadataError::InvalidArgument(format!(
                        "topic '{name}' cannot have id {} again: topic '{}' has it",
                        taken.id, taken.name
                    )));
                }
                let id = id.unwrap_or(self.next_topic_id);
                let topic = Topic {
                    name: name.clone(),
                    id,
                    config: config.clone(),
                    partitions: vec![Partition::default(); *partitions as usize],
                    created_ms: *created_ms,
                    config_version: *config_version,
                };
                self.next_topic_id = self.next_topic_id.max(id + 1);
                self.topics.insert(name.clone(), topic);
                self.assign_writers();
                Ok(Response::Topic { topic: self.topics[name].clone() })
            }
            Command::ReserveTopicIds { below } => {
                self.next_topic_id = self.next_topic_id.max(*below);
                Ok(Response::Ok)
            }
            Command::RestorePartitionEnd { topic, partition, end } => {
                let p = self.partition_mut(topic, *partition)?;
                if let Some(open) = p.open_segment() {
                    return Err(MetadataError::InvalidArgument(format!(
                        "partition {topic}/{partition} has an open segment at offset {}: only a rebuild, \
                         before any writer starts, may move where its log ends",
                        open.base_offset
                    )));
                }
                p.empty_end = p.empty_end.max(*end);
                Ok(Response::Ok)
            }
            Command::RestoreArchivedSegment {
                topic,
                partitions,
                partition,
                base_offset,
                last_offset,
                record_count,
                min_timestamp_ms,
                max_timestamp_ms,
                object_key,
                object_bytes,
                now_ms,
            } => {
                if *partition >= *partitions {
                    return Err(MetadataError::InvalidArgument(format!(
                        "object {object_key} is for partition {partition} of a topic with {partitions} partitions"
                    )));
                }
                if last_offset < base_offset || last_offset - base_offset + 1 != *record_count {
                    return Err(MetadataError::InvalidArgument(format!(
                        "object {object_key} claims offsets {base_offset}..={last_offset} but {record_count} records"
                    )));
                }
                if !self.topics.contains_key(topic) {
                    self.try_apply(&Command::CreateTopic {
                        name: topic.clone(),
                        partitions: *partitions,
                        config: BTreeMap::new(),
                        now_ms: *now_ms,
                    })?;
                }
                let p = self.partition_mut(topic, *partition)?;
                // Segments never overlap one another: only the one starting at or before the
                // object and those starting inside it can overlap it (no scan of the chain:
                // a rebuild restores every object of a partition this way).
                use std::ops::Bound::{Excluded, Included};
                let overlaps = p
                    .segments
                    .range(..=*base_offset)
                    .next_back()
                    .is_some_and(|(_, s)| s.last_offset.is_none_or(|end| end >= *base_offset))
                    || p.segments.range((Excluded(*base_offset), Included(*last_offset))).next().is_some();
                if overlaps {
                    if p.segments.get(base_offset).and_then(|s| s.object_key.as_deref())
                        == Some(object_key.as_str())
                    {
                        return Ok(Response::Ok);
                    }
                    return Err(MetadataError::InvalidArgument(format!(
                        "object {object_key} overlaps a segment {topic}/{partition} already has"
                    )));
                }
                p.segments.insert(
                    *base_offset,
                    Segment {
                        base_offset: *base_offset,
                        last_offset: Some(*last_offset),
                        state: SegmentState::Archived,
                        epoch: p.epoch,
                        ensemble: Vec::new(),
                        instances: Vec::new(),
                        size_bytes: 0,
                        record_count: *record_count,
                        min_timestamp_ms: *min_timestamp_ms,
                        max_timestamp_ms: *max_timestamp_ms,
                        opened_ms: *now_ms,
                        sealed_ms: Some(*now_ms),
                        object_key: Some(object_key.clone()),
                        object_bytes: *object_bytes,
                        archived_ms: Some(*now_ms),
                    },
                );
                Ok(Response::Ok)
            }
            Command::JoinGroup { group, topic, member, mode, session_timeout_ms, now_ms } => {
                let partitions = self.topic(topic)?.partitions.len() as u32;
                check_name("group", group)?;
                check_name("member", member)?;
                let g = self
                    .groups
                    .entry(group.clone())
                    .or_insert_with(|| Group { mode: *mode, topics: BTreeMap::new() });
                if g.mode != *mode {
                    let existing = g.mode;
                    if g.topics.is_empty() {
                        g.mode = *mode;
                    } else {
                        return Err(MetadataError::GroupModeMismatch {
                            group: group.clone(),
                            existing,
                            requested: *mode,
                        });
                    }
                }
                let gt = g.topics.entry(topic.clone()).or_default();
                if !gt.members.contains_key(member) && gt.members.len() >= GROUP_MEMBERS_MAX {
                    return Err(MetadataError::InvalidArgument(format!(
                        "group '{group}' already has {GROUP_MEMBERS_MAX} members on topic '{topic}'"
                    )));
                }
                gt.members.insert(
                    member.clone(),
                    Member { last_seen_ms: *now_ms, session_timeout_ms: *session_timeout_ms },
                );
                gt.members.retain(|_, m| m.last_seen_ms.saturating_add(m.session_timeout_ms) >= *now_ms);
                gt.rebalance(*mode, partitions);
                Ok(gt.membership(*mode, member, partitions))
            }
            Command::LeaveGroup { group, topic, member } => {
                let g =
                    self.groups.get_mut(group).ok_or_else(|| MetadataError::UnknownGroup(group.clone()))?;
                let mode = g.mode;
                let partitions = self.topics.get(topic).map_or(0, |t| t.partitions.len() as u32);
                if let Some(gt) = g.topics.get_mut(topic) {
                    if gt.members.remove(member).is_some() {
                        gt.rebalance(mode, partitions);
                    }
                }
                Ok(Response::Ok)
            }
            Command::CommitAcks { group, topic, topic_id, partition, floor, acked } => {
                self.check_topic_id(topic, *topic_id)?;
                let partitions = self.topic(topic)?.partitions.len() as u32;
                if *partition >= partitions {
                    return Err(MetadataError::UnknownPartition {
                        topic: topic.clone(),
                        partition: *partition,
                    });
                }
                if acked.len() > ACKED_RANGES_MAX {
                    return Err(MetadataError::InvalidArgument(format!(
                        "an ack checkpoint may carry at most {ACKED_RANGES_MAX} ranges"
                    )));
                }
                let g =
                    self.groups.get_mut(group).ok_or_else(|| MetadataError::UnknownGroup(group.clone()))?;
                let gt = g.topics.entry(topic.clone()).or_default();
                let cp = gt.acks.entry(*partition).or_default();
                cp.merge(*floor, acked);
                Ok(Response::Ok)
            }
            Command::DeleteGroup { group } => {
                if self.groups.remove(group).is_none() {
                    return Err(MetadataError::UnknownGroup(group.clone()));
                }
                Ok(Response::Ok)
            }
            Command::RegisterAgent { agent, instance, addr, lease_ms, now_ms } => {
                self.register_agent(agent, instance, addr, *lease_ms, *now_ms)
            }
            Command::AgentHeartbeat { agent, incarnation, now_ms } => {
                self.heartbeat_agent(agent, *incarnation, *now_ms)
            }
            Command::DeregisterAgent { agent, incarnation, now_ms } => {
                self.deregister_agent(agent, *incarnation, *now_ms)
            }
            Command::HandOffWriter { topic, partition, agent, epoch, avoid, now_ms } => {
                self.hand_off_writer(topic, *partition, agent, *epoch, avoid, *now_ms)
            }
            Command::RebalanceWriters { now_ms } => {
                self.advance_clock(*now_ms);
                self.rebalance_writers();
                Ok(Response::Ok)
            }
        }
    }

    /// Looks up a topic.
    pub fn topic(&self, name: &str) -> Result<&Topic, MetadataError> {
        self.topics.get(name).ok_or_else(|| MetadataError::UnknownTopic(name.to_string()))
    }

    fn check_topic_id(&self, topic: &str, id: Option<u64>) -> Result<(), MetadataError> {
        match (id, self.topics.get(topic)) {
            (Some(id), Some(t)) if t.id != id => Err(MetadataError::InvalidArgument(format!(
                "topic '{topic}' was deleted and created again (id {} is now {}); the command was for the old one",
                id, t.id
            ))),
            _ => Ok(()),
        }
    }

    /// The sealed segment at `base_offset` of a partition of the topic with id `topic_id`, for
    /// `with` to become a member of: refused if there is none, or if `with` is one already.
    fn sealed_segment_for_new_member(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        base_offset: u64,
        with: &str,
    ) -> Result<&mut Segment, MetadataError> {
        self.check_topic_id(topic, Some(topic_id))?;
        let p = self.partition_mut(topic, partition)?;
        let Some(seg) = p.segments.get_mut(&base_offset).filter(|s| s.state == SegmentState::Sealed) else {
            return Err(MetadataError::InvalidArgument(format!(
                "{topic}/{partition} has no sealed segment at offset {base_offset}"
            )));
        };
        if seg.ensemble.iter().any(|a| a == with) {
            return Err(MetadataError::InvalidArgument(format!(
                "agent '{with}' already holds segment {base_offset} of {topic}/{partition}"
            )));
        }
        Ok(seg)
    }

    pub(crate) fn partition_mut(
        &mut self,
        topic: &str,
        partition: u32,
    ) -> Result<&mut Partition, MetadataError> {
        let t = self.topics.get_mut(topic).ok_or_else(|| MetadataError::UnknownTopic(topic.to_string()))?;
        t.partitions
            .get_mut(partition as usize)
            .ok_or_else(|| MetadataError::UnknownPartition { topic: topic.to_string(), partition })
    }
}

/// A new, empty open segment at `base_offset`.
fn open_segment(
    base_offset: u64,
    epoch: u64,
    ensemble: &[String],
    instances: &[String],
    now_ms: u64,
) -> Segment {
    Segment {
        base_offset,
        last_offset: None,
        state: SegmentState::Open,
        epoch,
        ensemble: ensemble.to_vec(),
        instances: instances.to_vec(),
        size_bytes: 0,
        record_count: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        opened_ms: now_ms,
        sealed_ms: None,
        object_key: None,
        object_bytes: 0,
        archived_ms: None,
    }
}

fn check_epoch(p: &Partition, epoch: u64) -> Result<(), MetadataError> {
    if p.epoch != epoch {
        return Err(MetadataError::Fenced { expected: epoch, actual: p.epoch });
    }
    Ok(())
}

pub(crate) fn check_name(what: &str, name: &str) -> Result<(), MetadataError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.chars().any(|c| c.is_control()) {
        return Err(MetadataError::InvalidArgument(format!(
            "{what} name must be 1 to {NAME_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(())
}

impl GroupTopic {
    /// Recomputes the exclusive assignment: partitions dealt round-robin to members in id order.
    fn rebalance(&mut self, mode: GroupMode, partitions: u32) {
        let assignment: BTreeMap<u32, String> = match mode {
            GroupMode::Shared => BTreeMap::new(),
            GroupMode::Exclusive => {
                let members: Vec<&String> = self.members.keys().collect();
                if members.is_empty() {
                    BTreeMap::new()
                } else {
                    (0..partitions).map(|p| (p, members[p as usize % members.len()].clone())).collect()
                }
            }
        };
        if assignment != self.assignment {
            self.assignment = assignment;
            self.generation += 1;
        }
    }

    fn membership(&self, mode: GroupMode, member: &str, partitions: u32) -> Response {
        let partitions = match mode {
            GroupMode::Shared => (0..partitions).collect(),
            GroupMode::Exclusive => {
                self.assignment.iter().filter(|(_, m)| m.as_str() == member).map(|(p, _)| *p).collect()
            }
        };
        Response::Membership { generation: self.generation, partitions }
    }
}

impl AckCheckpoint {
    /// Merges a newer checkpoint into this one. The floor never moves backwards and no
    /// acknowledged offset is forgotten.
    pub fn merge(&mut self, floor: u64, acked: &[(u64, u64)]) {
        let mut ranges: Vec<(u64, u64)> =
            self.acked.iter().chain(acked.iter()).copied().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        let mut floor = self.floor.max(floor);
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            if end < floor {
                continue;
            }
            let start = start.max(floor);
            if start == floor {
                floor = end + 1;
                continue;
            }
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        // A range that reached the floor after it was pushed must be folded in too.
        merged.retain(|(_, end)| *end >= floor);
        while let Some(first) = merged.first() {
            if first.0 <= floor {
                floor = floor.max(first.1 + 1);
                merged.remove(0);
            } else {
                break;
            }
        }
        self.floor = floor;
        self.acked = merged;
    }

    /// Whether `offset` is acknowledged.
    pub fn is_acked(&self, offset: u64) -> bool {
        offset < self.floor || self.acked.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn create(state: &mut MetadataState, name: &str, partitions: u32) -> Response {
        state.apply(&Command::CreateTopic {
            name: name.into(),
            partitions,
            config: BTreeMap::new(),
            now_ms: 1,
        })
    }

    fn join(state: &mut MetadataState, member: &str, now_ms: u64) -> Response {
        state.apply(&Command::JoinGroup {
            group: "g".into(),
            topic: "t".into(),
            member: member.into(),
            mode: GroupMode::Exclusive,
            session_timeout_ms: 10_000,
            now_ms,
        })
    }

    #[test]
    fn offsets_are_archived_when_one_archived_segment_holds_them_or_retention_deleted_them() {
        let segment = |base: u64, last: Option<u64>, state: SegmentState| Segment {
            base_offset: base,
            last_offset: last,
            state,
            epoch: 1,
            ensemble: Vec::new(),
            instances: Vec::new(),
            size_bytes: 0,
            record_count: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            opened_ms: 0,
            sealed_ms: None,
            object_key: None,
            object_bytes: 0,
            archived_ms: None,
        };
        let mut p = Partition::default();
        for seg in [
            segment(10, Some(19), SegmentState::Archived),
            segment(20, Some(29), SegmentState::Archived),
            segment(30, Some(39), SegmentState::Sealed),
            segment(40, None, SegmentState::Open),
        ] {
            p.segments.insert(seg.base_offset, seg);
        }
        assert!(p.is_archived(10, 19) && p.is_archived(22, 25) && p.is_archived(20, 29));
        assert!(p.is_archived(0, 9), "below the chain: deleted by retention");
        assert!(!p.is_archived(5, 12), "partly below the chain, partly archived: not one segment");
        assert!(!p.is_archived(15, 25), "two archived segments: not one segment");
        assert!(!p.is_archived(30, 31) && !p.is_archived(25, 35) && !p.is_archived(40, 41));
        assert!(!Partition::default().is_archived(0, 0), "nothing archived yet");
    }

    #[test]
    fn a_topics_configs_are_altered_all_or_none() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 1);
        let id = s.topics["t"].id;
        let alter = |topic_id: Option<u64>, pairs: &[(&str, &str)]| Command::AlterTopicConfig {
            name: "t".into(),
            topic_id,
            config: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        assert_eq!(
            s.apply(&alter(Some(id), &[("retention.ms", "-1"), ("segment.ms", "5000")])),
            Response::Ok
        );
        assert_eq!((s.topics["t"].config.retention_ms, s.topics["t"].config.segment_ms), (None, 5000));

        // One bad entry refuses the whole change; so do an empty one, a replication.factor
        // change, a rule spanning configs, another topic's id and an unknown topic.
        let before = s.clone();
        for (command, why) in [
            (alter(None, &[("segment.ms", "100"), ("max.deliveries", "0")]), "max.deliveries=0"),
            (alter(None, &[]), "no config to alter"),
            (alter(None, &[("replication.factor", "3")]), "replication.factor cannot be altered"),
            (alter(None, &[("min.insync.replicas", "2")]), "min.insync.replicas cannot be altered"),
            (alter(None, &[("max.message.bytes", "0")]), "max.message.bytes=0"),
            (alter(Some(id + 1), &[("segment.ms", "100")]), "deleted and created again"),
        ] {
            let r = s.apply(&command);
            assert!(
                matches!(&r, Response::Error { error } if error.to_string().contains(why)),
                "{command:?}: {r:?}"
            );
        }
        let unknown = Command::AlterTopicConfig { name: "u".into(), topic_id: None, config: BTreeMap::new() };
        assert!(matches!(s.apply(&unknown), Response::Error { error: MetadataError::UnknownTopic(_) }));
        assert_eq!(s, before);
        // Setting replication.factor to what it is already is no change, so it is accepted.
        assert_eq!(s.apply(&alter(None, &[("replication.factor", "1")])), Response::Ok);
    }

    #[test]
    fn commands_for_a_deleted_topic_do_not_touch_its_successor() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 1);
        let old_id = s.topics["t"].id;
        assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: None }), Response::Ok);
        create(&mut s, "t", 1);
        let claim =
            Command::ClaimWriter { topic: "t".into(), partition: 0, agent: "b".into(), expected_epoch: None };
        assert!(matches!(s.apply(&claim), Response::Epoch { epoch: 1 }));
        let open = |topic_id| Command::OpenSegment {
            topic: "t".into(),
            topic_id,
            partition: 0,
            epoch: 1,
            base_offset: 0,
            ensemble: vec!["b".into()],
            instances: Vec::new(),
            now_ms: 1,
        };
        assert!(matches!(s.apply(&open(Some(old_id))), Response::Error { .. }));
        assert_eq!(s.apply(&open(Some(s.topics["t"].id))), Response::Ok);
        let before = s.clone();
        let seal = Command::SealSegment {
            replicas: None,
            topic: "t".into(),
            topic_id: Some(old_id),
            partition: 0,
            epoch: 1,
            base_offset: 0,
            record_count: 0,
            size_bytes: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 2,
        };
        assert!(
            matches!(s.apply(&seal), Response::Error { .. }),
            "the old writer cannot seal the new segment"
        );
        assert_eq!(s, before);
        s.apply(&Command::JoinGroup {
            group: "g".into(),
            topic: "t".into(),
            member: "m".into(),
            mode: GroupMode::Shared,
            session_timeout_ms: 1000,
            now_ms: 2,
        });
        let before_acks = s.clone();
        let acks = Command::CommitAcks {
            group: "g".into(),
            topic: "t".into(),
            topic_id: Some(old_id),
            partition: 0,
            floor: 10,
            acked: vec![],
        };
        assert!(
            matches!(s.apply(&acks), Response::Error { .. }),
            "old ack floors do not apply to the new topic"
        );
        assert_eq!(s, before_acks);
    }

    #[test]
    fn create_and_delete_topic() {
        let mut s = MetadataState::default();
        assert!(matches!(create(&mut s, "t", 4), Response::Topic { .. }));
        assert_eq!(s.topics["t"].partitions.len(), 4);
        let before = s.clone();
        assert!(matches!(create(&mut s, "t", 2), Response::Error { error: MetadataError::TopicExists(_) }));
        assert_eq!(s, before, "a refused command changes nothing");
        assert!(matches!(create(&mut s, "u", 0), Response::Error { .. }));
        assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: None }), Response::Ok);
        assert!(s.topics.is_empty());
        create(&mut s, "t", 1);
        assert_eq!(s.topics["t"].id, 1, "ids are never reused");
    }

    /// Partition 0 of topic "t" (created with `config`) with writer "a" and an open segment at
    /// offset 0 on "a", "b" and "c" (instances "ia", "ib", "ic").
    fn open_on_three(config: &[(&str, &str)]) -> MetadataState {
        let mut s = MetadataState::default();
        s.apply(&Command::CreateTopic {
            name: "t".into(),
            partitions: 1,
            config: config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            now_ms: 1,
        });
        let claim =
            Command::ClaimWriter { topic: "t".into(), partition: 0, agent: "a".into(), expected_epoch: None };
        assert_eq!(s.apply(&claim), Response::Epoch { epoch: 1 });
        let open = Command::OpenSegment {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset: 0,
            ensemble: vec!["a".into(), "b".into(), "c".into()],
            instances: vec!["ia".into(), "ib".into(), "ic".into()],
            now_ms: 5,
        };
        assert_eq!(s.apply(&open), Response::Ok);
        s
    }

    /// Seals the segment `open_on_three` opened with 10 records held whole by `replicas`.
    fn seal_held_by(replicas: &[&str]) -> Command {
        Command::SealSegment {
            replicas: Some(replicas.iter().map(|r| r.to_string()).collect()),
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset: 0,
            record_count: 10,
            size_bytes: 100,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 6,
        }
    }

    /// Opens the segment after the 10 records `seal_held_by` seals.
    fn open_after_ten(epoch: u64, base_offset: u64) -> Command {
        Command::OpenSegment {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch,
            base_offset,
            ensemble: vec!["a".into(), "b".into()],
            instances: vec!["ia".into(), "ib".into()],
            now_ms: 7,
        }
    }

    #[test]
    fn a_roll_seals_and_opens_in_one_step_or_changes_nothing() {
        let mut s = open_on_three(&[]);
        let roll = |seal: Command, open: Command| Command::RollSegment {
            seal: Box::new(seal),
            open: Box::new(open),
        };
        let before = s.clone();
        for (refused, why) in [
            (roll(seal_held_by(&["a"]), open_after_ten(1, 11)), "the next segment must start at 10"),
            (roll(seal_held_by(&["a"]), open_after_ten(2, 10)), "one epoch"),
            (roll(seal_held_by(&["a", "x"]), open_after_ten(1, 10)), "a seal that is refused"),
            (roll(open_after_ten(1, 10), seal_held_by(&["a"])), "a seal, then an open"),
            (
                roll(seal_held_by(&["a"]), Command::DeleteTopic { name: "t".into(), topic_id: None }),
                "only an open",
            ),
        ] {
            assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
            assert_eq!(s, before, "a refused roll changes nothing ({why})");
        }
        let mut stale = seal_held_by(&["a"]);
        if let Command::SealSegment { epoch, .. } = &mut stale {
            *epoch = 0;
        }
        assert!(matches!(s.apply(&roll(stale, open_after_ten(0, 10))), Response::Error { .. }));
        assert_eq!(s, before, "a deposed writer's roll changes nothing");

        assert_eq!(s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))), Response::Ok);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.segments[&0].state, SegmentState::Sealed);
        assert_eq!(p.segments[&0].last_offset, Some(9));
        let next = p.open_segment().expect("the next segment is open");
        assert_eq!((next.base_offset, next.epoch), (10, 1));
        assert_eq!(next.ensemble, ["a", "b"]);
        // The same roll again (a retry after a lost reply) is refused and changes nothing.
        let after = s.clone();
        assert!(matches!(
            s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))),
            Response::Error { .. }
        ));
        assert_eq!(s, after);
    }

    #[test]
    fn an_empty_open_segment_rolled_to_a_new_ensemble_is_replaced_in_place() {
        let mut s = open_on_three(&[]);
        let roll = |seal: Command, open: Command| Command::RollSegment {
            seal: Box::new(seal),
            open: Box::new(open),
        };
        assert_eq!(s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))), Response::Ok);
        // Retention dropped the archived segment: the open one is all the chain holds.
        s.topics.get_mut("t").unwrap().partitions[0].segments.remove(&0);
        let empty_at = |base_offset: u64| Command::SealSegment {
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset,
            record_count: 0,
            size_bytes: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 8,
        };
        let mut reopen = open_after_ten(1, 10);
        if let Command::OpenSegment { ensemble, instances, .. } = &mut reopen {
            *ensemble = vec!["a".into(), "c".into()];
            *instances = vec!["ia".into(), "ic".into()];
        }
        let before = s.clone();
        let mut wrong = reopen.clone();
        if let Command::OpenSegment { base_offset, .. } = &mut wrong {
            *base_offset = 11;
        }
        assert!(
            matches!(s.apply(&roll(empty_at(11), wrong)), Response::Error { .. }),
            "no open segment at 11"
        );
        assert_eq!(s, before, "a refused roll changes nothing");
        assert_eq!(s.apply(&roll(empty_at(10), reopen)), Response::Ok);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.segments.len(), 1);
        let open = p.open_segment().expect("still open");
        assert_eq!((open.base_offset, open.record_count), (10, 0));
        assert_eq!(open.ensemble, ["a", "c"]);
        assert_eq!(open.instances, ["ia", "ic"]);
        assert_eq!(p.next_segment_base(), 10, "the partition's end is kept");
    }

    #[test]
    fn a_chain_emptied_by_a_seal_of_no_records_keeps_where_the_log_ends() {
        let mut s = open_on_three(&[]);
        let roll = Command::RollSegment {
            seal: Box::new(seal_held_by(&["a"])),
            open: Box::new(open_after_ten(1, 10)),
        };
        assert_eq!(s.apply(&roll), Response::Ok);
        // Retention dropped the archived segment; a clean stop then closes the empty open one.
        s.topics.get_mut("t").unwrap().partitions[0].segments.remove(&0);
        let close = Command::SealSegment {
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset: 10,
            record_count: 0,
            size_bytes: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            now_ms: 9,
        };
        assert_eq!(s.apply(&close), Response::Ok);
        let p = &s.topics["t"].partitions[0];
        assert!(p.segments.is_empty());
        assert_eq!(p.next_segment_base(), 10, "offsets 0..10 are never used again");
        assert_eq!(p.first_offset(), 10);
        assert!(p.is_archived(0, 9), "what retention deleted counts as archived");
        assert!(!p.is_archived(9, 10));
        let before = s.clone();
        assert!(matches!(s.apply(&open_after_ten(1, 0)), Response::Error { .. }), "not from 0 again");
        assert_eq!(s, before);
        assert_eq!(s.apply(&open_after_ten(1, 10)), Response::Ok);
        // The field survives a snapshot, and a partition never emptied has none.
        let json = serde_json::to_string(&s).unwrap();
        let back: MetadataState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(!serde_json::to_string(&open_on_three(&[])).unwrap().contains("empty_end"));
    }

    #[test]
    fn a_seal_keeps_only_the_replicas_that_hold_the_whole_segment() {
        let mut s = open_on_three(&[]);
        let before = s.clone();
        assert!(matches!(s.apply(&seal_held_by(&["a", "x"])), Response::Error { .. }), "only members");
        assert!(matches!(s.apply(&seal_held_by(&[])), Response::Error { .. }), "at least one");
        assert_eq!(s, before, "a refused seal changes nothing");
        assert_eq!(s.apply(&seal_held_by(&["a", "c"])), Response::Ok);
        let seg = &s.topics["t"].partitions[0].segments[&0];
        assert_eq!(seg.ensemble, ["a", "c"]);
        assert_eq!(seg.instances, ["ia", "ic"], "instances follow their members");
        assert_eq!(seg.state, SegmentState::Sealed);
    }

    #[test]
    fn a_sealed_segment_short_of_members_takes_new_ones_up_to_the_replication_factor() {
        let mut s = open_on_three(&[("replication.factor", "3")]);
        let id = s.topics["t"].id;
        let add = |with: &str, base_offset: u64, topic_id: u64| Command::AddReplica {
            topic: "t".into(),
            topic_id,
            partition: 0,
            base_offset,
            with: with.into(),
            instance: format!("i{with}"),
        };
        let before = s.clone();
        assert!(matches!(s.apply(&add("d", 0, id)), Response::Error { .. }), "an open segment");
        assert_eq!(s, before, "a refused command changes nothing");
        // Sealed after b left midway: a and c hold it whole.
        assert_eq!(s.apply(&seal_held_by(&["a", "c"])), Response::Ok);
        let before = s.clone();
        for (refused, why) in [
            (add("c", 0, id), "a member"),
            (add("b", 7, id), "no segment there"),
            (add("b", 0, id + 1), "another topic id"),
        ] {
            assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
        }
        assert_eq!(s, before, "refused commands change nothing");
        assert_eq!(s.apply(&add("b", 0, id)), Response::Ok);
        let seg = &s.topics["t"].partitions[0].segments[&0];
        assert_eq!(seg.ensemble, ["a", "c", "b"]);
        assert_eq!(seg.instances, ["ia", "ic", "ib"], "the new member's instance is recorded");
        let before = s.clone();
        assert!(matches!(s.apply(&add("d", 0, id)), Response::Error { .. }), "already R members");
        assert_eq!(s, before);
    }

    #[test]
    fn segments_follow_epochs_and_offsets() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 1);
        let claim = |s: &mut MetadataState| {
            s.apply(&Command::ClaimWriter {
                topic: "t".into(),
                partition: 0,
                agent: "a".into(),
                expected_epoch: None,
            })
        };
        assert_eq!(claim(&mut s), Response::Epoch { epoch: 1 });
        let open = |s: &mut MetadataState, epoch, base| {
            s.apply(&Command::OpenSegment {
                topic: "t".into(),
                topic_id: None,
                partition: 0,
                epoch,
                base_offset: base,
                ensemble: vec!["a".into()],
                instances: Vec::new(),
                now_ms: 5,
            })
        };
        let seal = |s: &mut MetadataState, epoch, base, count| {
            s.apply(&Command::SealSegment {
                replicas: None,
                topic: "t".into(),
                topic_id: None,
                partition: 0,
                epoch,
                base_offset: base,
                record_count: count,
                size_bytes: 100,
                min_timestamp_ms: Some(1),
                max_timestamp_ms: Some(2),
                now_ms: 6,
            })
        };
        assert_eq!(open(&mut s, 1, 0), Response::Ok);
        assert!(matches!(open(&mut s, 1, 0), Response::Error { .. }), "one open segment at a time");
        assert_eq!(seal(&mut s, 1, 0, 10), Response::Ok);
        assert!(matches!(open(&mut s, 1, 5), Response::Error { .. }), "no gaps or overlaps");
        assert_eq!(open(&mut s, 1, 10), Response::Ok);
        assert_eq!(claim(&mut s), Response::Epoch { epoch: 2 });
        assert!(matches!(seal(&mut s, 1, 10, 3), Response::Error { error: MetadataError::Fenced { .. } }));
        assert_eq!(seal(&mut s, 2, 10, 0), Response::Ok, "an empty segment is dropped");
        assert_eq!(s.topics["t"].partitions[0].next_segment_base(), 10);
        assert_eq!(s.topics["t"].partitions[0].segments[&0].last_offset, Some(9));
    }

    #[test]
    fn exclusive_groups_rebalance_and_expire() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 4);
        assert_eq!(
            join(&mut s, "m1", 1000),
            Response::Membership { generation: 1, partitions: vec![0, 1, 2, 3] }
        );
        assert_eq!(join(&mut s, "m2", 1000), Response::Membership { generation: 2, partitions: vec![1, 3] });
        assert_eq!(join(&mut s, "m1", 2000), Response::Membership { generation: 2, partitions: vec![0, 2] });
        // m2 stops heartbeating; m1's next heartbeat after the session timeout takes everything.
        assert_eq!(
            join(&mut s, "m1", 11_500),
            Response::Membership { generation: 3, partitions: vec![0, 1, 2, 3] }
        );
        let shared = s.apply(&Command::JoinGroup {
            group: "g".into(),
            topic: "t".into(),
            member: "x".into(),
            mode: GroupMode::Shared,
            session_timeout_ms: 10_000,
            now_ms: 11_500,
        });
        assert!(matches!(shared, Response::Error { error: MetadataError::GroupModeMismatch { .. } }));
    }

    #[test]
    fn ack_floor_never_moves_backwards() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 1);
        join(&mut s, "m1", 1);
        let commit = |s: &mut MetadataState, floor, acked: Vec<(u64, u64)>| {
            s.apply(&Command::CommitAcks {
                group: "g".into(),
                topic: "t".into(),
                topic_id: None,
                partition: 0,
                floor,
                acked,
            })
        };
        assert_eq!(commit(&mut s, 10, vec![(12, 14)]), Response::Ok);
        assert_eq!(commit(&mut s, 5, vec![(11, 11)]), Response::Ok);
        let cp = &s.groups["g"].topics["t"].acks[&0];
        assert_eq!(cp.floor, 10);
        assert_eq!(cp.acked, vec![(11, 14)]);
        assert_eq!(commit(&mut s, 11, vec![]), Response::Ok);
        let cp = &s.groups["g"].topics["t"].acks[&0];
        assert_eq!((cp.floor, cp.acked.clone()), (15, vec![]));
        assert!(matches!(commit(&mut s, 1, vec![]), Response::Ok));
        assert_eq!(s.groups["g"].topics["t"].acks[&0].floor, 15);
    }

    #[test]
    fn a_rebuild_restores_topics_as_described_and_never_reuses_an_id_or_an_offset() {
        let mut s = MetadataState::default();
        let config = TopicConfig { retention_ms: None, replication_factor: 3, ..TopicConfig::default() };
        let restore = |name: &str, id: Option<u64>, partitions: u32| Command::RestoreTopic {
            name: name.into(),
            id,
            partitions,
            config: config.clone(),
            config_version: 4,
            created_ms: 5,
        };
        let Response::Topic { topic } = s.apply(&restore("a", Some(7), 2)) else { panic!("restored") };
        assert_eq!((topic.id, topic.config_version, topic.created_ms), (7, 4, 5));
        assert_eq!(topic.config, config);
        assert_eq!(s.next_topic_id, 8);
        assert!(matches!(s.apply(&restore("a", Some(7), 2)), Response::Topic { .. }), "twice is harmless");
        let before = s.clone();
        for refused in [
            restore("a", Some(9), 2),
            restore("a", Some(7), 3),
            restore("b", Some(7), 1),
            restore("c", None, 0),
        ] {
            assert!(matches!(s.apply(&refused), Response::Error { .. }), "{refused:?}");
            assert_eq!(s, before);
        }
        // Ids of deleted topics are never handed out again.
        assert_eq!(s.apply(&Command::ReserveTopicIds { below: 20 }), Response::Ok);
        assert_eq!(s.apply(&Command::ReserveTopicIds { below: 3 }), Response::Ok);
        let Response::Topic { topic } = s.apply(&restore("d", None, 1)) else { panic!("restored") };
        assert_eq!(topic.id, 20);
        // A config change bumps the version the archive's description is written under.
        let alter = Command::AlterTopicConfig {
            name: "a".into(),
            topic_id: None,
            config: BTreeMap::from([("max.deliveries".to_string(), "9".to_string())]),
        };
        assert_eq!(s.apply(&alter), Response::Ok);
        assert_eq!(s.topics["a"].config_version, 5);

        // Offsets found in local logs past the archive are never handed out again.
        let end = |end: u64| Command::RestorePartitionEnd { topic: "a".into(), partition: 1, end };
        assert_eq!(s.apply(&end(30)), Response::Ok);
        assert_eq!(s.apply(&end(10)), Response::Ok, "never lowered");
        assert_eq!(s.topics["a"].partitions[1].next_segment_base(), 30);
        let archived = Command::RestoreArchivedSegment {
            topic: "a".into(),
            partitions: 2,
            partition: 1,
            base_offset: 0,
            last_offset: 19,
            record_count: 20,
            min_timestamp_ms: Some(1),
            max_timestamp_ms: Some(2),
            object_key: "o".into(),
            object_bytes: 3,
            now_ms: 4,
        };
        assert_eq!(s.apply(&archived), Response::Ok);
        let p = &s.topics["a"].partitions[1];
        assert_eq!(
            (p.first_offset(), p.next_segment_base()),
            (0, 30),
            "the archive ends at 20, the log at 30"
        );
        let mut open = open_after_ten(0, 20);
        if let Command::OpenSegment { topic, partition, .. } = &mut open {
            (*topic, *partition) = ("a".into(), 1);
        }
        assert!(matches!(s.apply(&open), Response::Error { .. }), "a segment may not start at 20");
    }

    #[test]
    fn commands_for_a_deleted_topic_never_reach_one_created_again_under_its_name() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 1);
        let old = s.topics["t"].id;
        assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: Some(old) }), Response::Ok);
        create(&mut s, "t", 1);
        let new = s.topics["t"].id;
        assert_ne!(old, new);
        let before = s.clone();
        for late in [
            Command::DeleteTopic { name: "t".into(), topic_id: Some(old) },
            Command::ArchiveSegment {
                topic: "t".into(),
                topic_id: Some(old),
                partition: 0,
                base_offset: 0,
                last_offset: 9,
                object_key: "k".into(),
                object_bytes: 1,
                now_ms: 1,
            },
            Command::DeleteArchivedSegments {
                topic: "t".into(),
                topic_id: Some(old),
                partition: 0,
                base_offsets: vec![0],
            },
        ] {
            assert!(matches!(s.apply(&late), Response::Error { .. }), "{late:?}");
            assert_eq!(s, before, "{late:?}");
        }
        assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: Some(new) }), Response::Ok);
    }

    #[test]
    fn archive_delete_and_restore_segments() {
        let mut s = MetadataState::default();
        create(&mut s, "t", 2);
        s.apply(&Command::ClaimWriter {
            topic: "t".into(),
            partition: 0,
            agent: "a".into(),
            expected_epoch: None,
        });
        for (base, count) in [(0u64, 10u64), (10, 5), (15, 0)] {
            let open = Command::OpenSegment {
                topic: "t".into(),
                topic_id: None,
                partition: 0,
                epoch: 1,
                base_offset: base,
                ensemble: vec!["a".into()],
                instances: Vec::new(),
                now_ms: 1,
            };
            assert_eq!(s.apply(&open), Response::Ok);
            if count > 0 {
                let seal = Command::SealSegment {
                    replicas: None,
                    topic: "t".into(),
                    topic_id: None,
                    partition: 0,
                    epoch: 1,
                    base_offset: base,
                    record_count: count,
                    size_bytes: 1,
                    min_timestamp_ms: Some(1),
                    max_timestamp_ms: Some(2),
                    now_ms: 2,
                };
                assert_eq!(s.apply(&seal), Response::Ok);
            }
        }
        let archive = |base: u64, last: u64| Command::ArchiveSegment {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            base_offset: base,
            last_offset: last,
            object_key: format!("k{base}"),
            object_bytes: 100,
            now_ms: 3,
        };
        let before = s.clone();
        assert!(matches!(s.apply(&archive(0, 8)), Response::Error { .. }), "the offset range must match");
        assert!(
            matches!(s.apply(&archive(15, 20)), Response::Error { .. }),
            "an open segment cannot be archived"
        );
        assert_eq!(s, before);
        assert_eq!(s.apply(&archive(0, 9)), Response::Ok);
        assert_eq!(s.apply(&archive(0, 9)), Response::Ok, "archiving again is a harmless retry");
        let seg = &s.topics["t"].partitions[0].segments[&0];
        assert_eq!(
            (seg.state, seg.object_key.as_deref(), seg.object_bytes),
            (SegmentState::Archived, Some("k0"), 100)
        );
        let delete = |bases: Vec<u64>| Command::DeleteArchivedSegments {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            base_offsets: bases,
        };
        assert!(
            matches!(s.apply(&delete(vec![10])), Response::Error { .. }),
            "only the oldest, only archived"
        );
        assert_eq!(s.apply(&delete(vec![0])), Response::Ok);
        assert_eq!(s.topics["t"].partitions[0].segments.keys().copied().collect::<Vec<_>>(), vec![10, 15]);

        // Restoring into empty metadata creates the topic and the chain.
        let mut fresh = MetadataState::default();
        let restore = |base: u64, last: u64, partition: u32| Command::RestoreArchivedSegment {
            topic: "r".into(),
            partitions: 3,
            partition,
            base_offset: base,
            last_offset: last,
            record_count: last - base + 1,
            min_timestamp_ms: Some(5),
            max_timestamp_ms: Some(6),
            object_key: format!("o{base}"),
            object_bytes: 7,
            now_ms: 9,
        };
        assert_eq!(fresh.apply(&restore(10, 19, 1)), Response::Ok);
        assert_eq!(fresh.apply(&restore(0, 9, 1)), Response::Ok);
        assert_eq!(fresh.apply(&restore(0, 9, 1)), Response::Ok, "restoring twice is harmless");
        assert!(matches!(fresh.apply(&restore(5, 12, 1)), Response::Error { .. }), "overlaps are refused");
        let before = fresh.clone();
        assert!(matches!(fresh.apply(&restore(0, 9, 3)), Response::Error { .. }));
        assert_eq!(fresh, before);
        let p = &fresh.topics["r"].partitions[1];
        assert_eq!(fresh.topics["r"].partitions.len(), 3);
        assert_eq!(p.next_segment_base(), 20);
        assert!(p.segments.values().all(|s| s.state == SegmentState::Archived));
        // Objects restored out of order: gaps are fine, overlaps on either side are refused.
        assert_eq!(fresh.apply(&restore(30, 39, 1)), Response::Ok, "a gap before it");
        for (base, last) in [(19, 19), (20, 30), (25, 31), (39, 45), (15, 35)] {
            let r = fresh.apply(&restore(base, last, 1));
            assert!(matches!(r, Response::Error { .. }), "{base}..={last} overlaps: {r:?}");
        }
        assert_eq!(fresh.apply(&restore(20, 29, 1)), Response::Ok, "the gap filled exactly");
        assert_eq!(
            fresh.topics["r"].partitions[1].segments.keys().copied().collect::<Vec<_>>(),
            vec![0, 10, 20, 30]
        );
    }

    proptest! {
        #[test]
        fn ack_merge_keeps_every_acked_offset(
            steps in proptest::collection::vec((0u64..50, proptest::collection::vec((0u64..60, 0u64..5), 0..6)), 1..8)
        ) {
            let mut cp = AckCheckpoint::default();
            let mut acked = std::collections::BTreeSet::new();
            let mut last_floor = 0;
            for (floor, ranges) in steps {
                let ranges: Vec<(u64, u64)> = ranges.into_iter().map(|(a, len)| (a, a + len)).collect();
                acked.extend(0..floor);
                for (a, b) in &ranges { acked.extend(*a..=*b); }
                cp.merge(floor, &ranges);
                prop_assert!(cp.floor >= last_floor);
                last_floor = cp.floor;
                for o in 0..80u64 {
                    prop_assert_eq!(cp.is_acked(o), acked.contains(&o), "offset {}", o);
                }
                for w in cp.acked.windows(2) {
                    prop_assert!(w[0].1 + 1 < w[1].0, "ranges are disjoint and not adjacent");
                }
                if let Some(first) = cp.acked.first() { prop_assert!(first.0 > cp.floor); }
            }
        }
    }
}
