//! The commands that change the metadata, in the Raft log as JSON, and their responses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{GroupMode, Topic};
use crate::topic_config::TopicConfig;
use crate::MetadataError;

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
        /// If set, the claim is refused unless the topic has this id (a topic re-created under
        /// the same name is another topic).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<u64>,
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
        /// Members of the ensemble, not among `replicas`, that did not answer the recovery
        /// sealing the segment: they may hold it (see `Segment::unverified`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        unverified: Vec<String>,
        /// Whether the seal records `Segment::witnesses_needed` (from the ensemble and the
        /// topic's config as they are when it is applied). Carried by the command, not decided
        /// by the metadata version that applies it: a seal written by an older agent records
        /// nothing on every node, whether it replays the log or restores a snapshot.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        record_witnesses_needed: bool,
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
    /// members than the topic's replication factor (sealed after a follower left midway), or
    /// an unverified member of it showed it holds the whole segment.
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
    /// Offsets `from..end` of a sealed segment are on no disk left, and were never
    /// acknowledged: the segment ends at `from` from now on, and the range is recorded as lost
    /// (reads step over it; no offset in it is written again). Refused unless every holder of
    /// the segment lost its disk (it registered again with another instance, or is forgotten)
    /// and the witnesses show the range was never acknowledged: `witnesses_needed` of the
    /// segment's unverified members, each on the disk recorded for it, hold less than `from`
    /// (or, with `from == end`, one holds the whole segment and nothing is lost). The
    /// witnesses holding up to `from` become its holders.
    DeclareLost {
        /// Topic name.
        topic: String,
        /// The topic's id.
        topic_id: u64,
        /// Partition number.
        partition: u32,
        /// The segment's base offset; the segment must be sealed.
        base_offset: u64,
        /// The epoch the segment was opened under.
        segment_epoch: u64,
        /// One past the segment's last offset; must be where it is sealed.
        end: u64,
        /// Where the segment ends once the range is declared lost.
        from: u64,
        /// Bytes the witnesses holding up to `from` hold.
        size_bytes: u64,
        /// What the unverified members answered.
        witnesses: Vec<super::Witness>,
    },
    /// A recovery of the open segment found its tail on fewer than W members while members
    /// that did not answer (`silent`) may still come back with their copies: records when the
    /// waiting for each began (`Segment::silent_since_ms`, metadata's clock; kept for a member
    /// already waited for), and forgets the members not named (they answered). Refused unless
    /// the segment is open under `segment_epoch`.
    WaitForSilentMembers {
        /// Topic name.
        topic: String,
        /// The topic's id.
        topic_id: u64,
        /// Partition number.
        partition: u32,
        /// The open segment's base offset.
        base_offset: u64,
        /// The epoch the segment was opened under.
        segment_epoch: u64,
        /// The members waited for (of the segment's ensemble).
        silent: Vec<String>,
        /// The proposer's clock (ms since the Unix epoch); the leader stamps its own.
        now_ms: u64,
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
        /// If set, the command is refused (`Fenced`) unless the partition's writer epoch is
        /// still this: the cursor that sends it was loaded by the writer of that epoch, and
        /// once another writer took the partition, that one's cursor carries on (a deposed
        /// writer's acknowledgements are delivered again instead of checkpointed behind it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
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
    /// cut off from them, not from metadata), or whose disk failed an fsync it could not cut
    /// back, hands its partition to another live agent: a live
    /// member of the open segment's ensemble if there is one, else the live agent with the
    /// fewest partitions; an agent that handed a partition over within the last
    /// `NO_REBALANCE_AFTER_HAND_OFF_LEASES` of its leases only when no other is live. The
    /// epoch is bumped; refused when no other agent is live.
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
    /// due, whichever agent writes it. Agents no longer propose it (they propose
    /// [`Command::MoveWriter`] for a partition they write); it is applied as before so that a
    /// log holding it replays to the same state.
    RebalanceWriters {
        /// Proposer's clock.
        now_ms: u64,
    },
    /// The writer of a partition moves it towards balance: to the agent
    /// `MetadataState::rebalance_due` names, when a move off this agent is still due. Only
    /// the writer proposes it, having stopped serving the partition: a writer cut off from
    /// metadata is never moved under it by a rebalance.
    MoveWriter {
        /// Topic name.
        topic: String,
        /// The topic's id; a topic re-created under the same name is refused.
        topic_id: u64,
        /// Partition number.
        partition: u32,
        /// The agent moving the partition away; must be its writer.
        agent: String,
        /// The partition's epoch the agent wrote under; must be the current one.
        epoch: u64,
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
    /// Why a metadata node refuses to propose this command, if it does: `RebalanceWriters`,
    /// which moved a partition under a writer that may not know it (an older agent's), is
    /// applied when a log holds it but no longer accepted.
    pub fn refused_at_proposal(&self) -> Option<String> {
        match self {
            Command::RebalanceWriters { .. } => Some(
                "RebalanceWriters is no longer accepted: a partition's writer moves it itself \
                 (MoveWriter); upgrade the agent that sent it"
                    .into(),
            ),
            _ => None,
        }
    }

    /// Replaces the proposer's clock with `now_ms` (the metadata leader's) in the commands
    /// whose clock decides something: leases (agents), topic creation (which names writers by
    /// lease), group membership (session timeouts) and a recovery's wait for silent members.
    /// Agents' clocks may disagree; the leader's, kept monotonic by `MetadataState::clock_ms`,
    /// is the one clock leases are judged by.
    pub fn stamp_clock(&mut self, now: u64) {
        match self {
            Command::RegisterAgent { now_ms, .. }
            | Command::AgentHeartbeat { now_ms, .. }
            | Command::DeregisterAgent { now_ms, .. }
            | Command::HandOffWriter { now_ms, .. }
            | Command::RebalanceWriters { now_ms }
            | Command::MoveWriter { now_ms, .. }
            | Command::CreateTopic { now_ms, .. }
            | Command::JoinGroup { now_ms, .. }
            | Command::WaitForSilentMembers { now_ms, .. } => *now_ms = now,
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
