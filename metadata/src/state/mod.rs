//! The metadata state machine: plain data and a deterministic `apply`, with no I/O.
//!
//! Everything that varies between replicas (wall-clock time, ids) arrives inside the
//! [`Command`], so every node that applies the same log reaches the same state.
//!
//! The commands and their responses are in `command.rs`. `apply` hands each command to one
//! function of its own, by concern: `topics.rs`,
//! `segments.rs` (writers, segments, archive, rebuild), `groups.rs`, and
//! `crate::agent_registry` (agents, leases and which agent writes each partition).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::agent_registry::AgentInfo;
use crate::topic_config::{TopicConfig, PARTITIONS_MAX};
use crate::MetadataError;

mod command;
mod groups;
mod segments;
mod topics;

pub use command::{Command, Response};

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
    /// Offsets declared lost (`Command::DeclareLost`): written but never acknowledged, and on
    /// no disk left. Reads step over them; no offset in them is ever written again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_ranges: Vec<LostRange>,
}

/// Offsets `from..end` of a partition that were declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRange {
    /// The first offset lost.
    pub from: u64,
    /// One past the last offset lost.
    pub end: u64,
}

/// What a member of a sealed segment answered when asked what it holds of it
/// (`Command::DeclareLost`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Witness {
    /// The member.
    pub agent: String,
    /// The data-directory instance it answered from.
    pub instance: String,
    /// One past the last offset of the segment it holds (the segment's base if none).
    pub held_end: u64,
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
    /// Members of the open segment that did not answer the recovery that sealed it: each may
    /// hold all of the sealed range, a prefix of it, or nothing. None is a holder (in
    /// `ensemble`) until it shows it holds the whole range (`Command::AddReplica`); reads and
    /// the archiver turn to them when no holder answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<String>,
    /// The data-directory instance of each unverified member when the segment was opened
    /// (empty if unknown): one whose instance changed since holds nothing of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified_instances: Vec<String>,
    /// How many members of the ensemble the segment was opened with, each on the disk it had
    /// then and holding less than an offset, show that the offset was never acknowledged:
    /// R - W + 1, fixed at the seal (R the members then, W `min.insync.replicas` clamped to
    /// 1..=R). An acknowledged offset is on W of the R members, so at most R - W lack it.
    /// `None` when the seal could not tell (no instances recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witnesses_needed: Option<u32>,
    /// While the segment is open: the members a recovery of it waits for, each with when the
    /// waiting for it began (metadata's clock; `Command::WaitForSilentMembers`). A recovery
    /// that finds the tail on fewer than W members waits for a member that did not answer and
    /// may come back with its copy until the agent's `--replica-repair-after` past this, then
    /// seals on the members that answered. Kept in metadata, so that the wait survives a
    /// writer's move or restart; a member that answers a later recovery is dropped from it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub silent_since_ms: BTreeMap<String, u64>,
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
                self.create_topic(name, *partitions, config, *now_ms)
            }
            Command::DeleteTopic { name, topic_id } => self.delete_topic(name, *topic_id),
            Command::AlterTopicConfig { name, topic_id, config } => {
                self.alter_topic_config(name, *topic_id, config)
            }
            Command::RestoreTopic { name, id, partitions, config, config_version, created_ms } => {
                self.restore_topic(name, *id, *partitions, config, *config_version, *created_ms)
            }
            Command::ReserveTopicIds { below } => self.reserve_topic_ids(*below),
            Command::ClaimWriter { topic, topic_id, partition, agent, expected_epoch } => {
                self.check_topic_id(topic, *topic_id)?;
                self.claim_writer(topic, *partition, agent, *expected_epoch)
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
            } => self.open_segment(
                topic,
                *topic_id,
                *partition,
                *epoch,
                *base_offset,
                ensemble,
                instances,
                *now_ms,
            ),
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
                unverified,
                record_witnesses_needed,
                now_ms,
            } => self.seal_segment(
                topic,
                *topic_id,
                *partition,
                *epoch,
                *base_offset,
                *record_count,
                *size_bytes,
                *min_timestamp_ms,
                *max_timestamp_ms,
                replicas.as_deref(),
                unverified,
                *record_witnesses_needed,
                *now_ms,
            ),
            Command::RollSegment { seal, open } => self.roll_segment(seal, open),
            Command::WaitForSilentMembers {
                topic,
                topic_id,
                partition,
                base_offset,
                segment_epoch,
                silent,
                now_ms,
            } => {
                self.advance_clock(*now_ms);
                self.wait_for_silent_members(
                    topic,
                    *topic_id,
                    *partition,
                    (*base_offset, *segment_epoch),
                    silent,
                )
            }
            Command::ReplaceReplica { topic, topic_id, partition, base_offset, gone, with, instance } => {
                self.replace_replica(topic, *topic_id, *partition, *base_offset, gone, with, instance)
            }
            Command::AddReplica { topic, topic_id, partition, base_offset, with, instance } => {
                self.add_replica(topic, *topic_id, *partition, *base_offset, with, instance)
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
            } => self.archive_segment(
                topic,
                *topic_id,
                *partition,
                *base_offset,
                *last_offset,
                object_key,
                *object_bytes,
                *now_ms,
            ),
            Command::DeleteArchivedSegments { topic, topic_id, partition, base_offsets } => {
                self.delete_archived_segments(topic, *topic_id, *partition, base_offsets)
            }
            Command::RestorePartitionEnd { topic, partition, end } => {
                self.restore_partition_end(topic, *partition, *end)
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
            } => self.restore_archived_segment(
                topic,
                *partitions,
                *partition,
                *base_offset,
                *last_offset,
                *record_count,
                *min_timestamp_ms,
                *max_timestamp_ms,
                object_key,
                *object_bytes,
                *now_ms,
            ),
            Command::JoinGroup { group, topic, member, mode, session_timeout_ms, now_ms } => {
                self.join_group(group, topic, member, *mode, *session_timeout_ms, *now_ms)
            }
            Command::LeaveGroup { group, topic, member } => self.leave_group(group, topic, member),
            Command::CommitAcks { group, topic, topic_id, partition, epoch, floor, acked } => {
                self.commit_acks(group, topic, *topic_id, (*partition, *epoch), *floor, acked)
            }
            Command::DeleteGroup { group } => self.delete_group(group),
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
            Command::MoveWriter { topic, topic_id, partition, agent, epoch, now_ms } => {
                self.move_writer(topic, *topic_id, *partition, agent, *epoch, *now_ms)
            }
            Command::DeclareLost {
                topic,
                topic_id,
                partition,
                base_offset,
                segment_epoch,
                end,
                from,
                size_bytes,
                witnesses,
            } => self.declare_lost(
                topic,
                *topic_id,
                *partition,
                *base_offset,
                *segment_epoch,
                (*from, *end),
                *size_bytes,
                witnesses,
            ),
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

pub(crate) fn check_name(what: &str, name: &str) -> Result<(), MetadataError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name.chars().any(|c| c.is_control()) {
        return Err(MetadataError::InvalidArgument(format!(
            "{what} name must be 1 to {NAME_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
