//! [`NodeStatus`]: what one metadata node knows about itself and its cluster, as served by
//! `GET /metadata/status` and printed by `silt cluster status`.

use std::collections::BTreeMap;

use openraft::ServerState;
use serde::{Deserialize, Serialize};

use crate::raft::types::{NodeId, RaftMetrics};

/// One node's view of the Raft cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node's id.
    pub id: NodeId,
    /// This node's address in the membership, if it is a member.
    pub addr: Option<String>,
    /// This node's role.
    pub state: NodeRole,
    /// The term this node is in.
    pub current_term: u64,
    /// The leader this node follows (itself when it leads), if it knows one.
    pub leader: Option<Member>,
    /// The membership this node applies.
    pub membership: MembershipView,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to this node's state machine.
    pub last_applied: Option<u64>,
    /// Index of the last entry this node knows to be committed.
    pub committed: Option<u64>,
    /// Last index covered by this node's latest snapshot.
    pub snapshot_index: Option<u64>,
    /// Entries up to this index were deleted from this node's log (a snapshot covers them).
    pub purged_index: Option<u64>,
    /// On the leader: how long ago a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// On the leader: the last log index known to be on each member (`null` for none yet).
    pub replication: Option<BTreeMap<NodeId, Option<u64>>>,
}

/// The role of a node in the Raft protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    /// Accepts writes and replicates them.
    Leader,
    /// Replicates the leader's log and votes.
    Follower,
    /// Campaigns to become leader.
    Candidate,
    /// Replicates the log without voting (also a node not yet part of any cluster).
    Learner,
    /// Stopping.
    Shutdown,
}

impl From<ServerState> for NodeRole {
    fn from(s: ServerState) -> Self {
        match s {
            ServerState::Leader => NodeRole::Leader,
            ServerState::Follower => NodeRole::Follower,
            ServerState::Candidate => NodeRole::Candidate,
            ServerState::Learner => NodeRole::Learner,
            ServerState::Shutdown => NodeRole::Shutdown,
        }
    }
}

/// A member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Member {
    /// Node id.
    pub id: NodeId,
    /// Its Raft and API address (`host:port`).
    pub addr: String,
}

/// The voters and learners of a membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipView {
    /// Members that vote; a majority of them must acknowledge every commit.
    pub voters: Vec<Member>,
    /// Members that replicate the log without voting.
    pub learners: Vec<Member>,
    /// True during a membership change: the old and the new voter set must both agree.
    pub joint: bool,
    /// Index of the log entry that introduced this membership.
    pub log_index: Option<u64>,
}

impl NodeStatus {
    /// The status as of `metrics`, with the committed index read separately.
    pub(crate) fn from_metrics(m: &RaftMetrics, committed: Option<u64>) -> NodeStatus {
        let stored = &m.membership_config;
        let membership = stored.membership();
        let member = |id: NodeId| Member {
            id,
            addr: membership.get_node(&id).map(|n| n.addr.clone()).unwrap_or_default(),
        };
        let leader = m.current_leader.map(member);
        NodeStatus {
            id: m.id,
            addr: membership.get_node(&m.id).map(|n| n.addr.clone()),
            state: m.state.into(),
            current_term: m.current_term,
            leader,
            membership: MembershipView {
                voters: membership.voter_ids().map(member).collect(),
                learners: membership.learner_ids().map(member).collect(),
                joint: membership.get_joint_config().len() > 1,
                log_index: stored.log_id().map(|l| l.index),
            },
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            committed,
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            replication: m
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(id, matched)| (*id, matched.map(|l| l.index))).collect()),
        }
    }
}
