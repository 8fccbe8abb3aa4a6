//! `silt cluster`: inspect and change the metadata cluster through its HTTP API.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;
use silt_metadata::{MetadataClient, MetadataState, NodeRole, NodeStatus};

/// How long each node may take to answer `cluster status`.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// What `silt cluster status` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The leader, as the node with the highest term that knows one reports it.
    pub leader: Option<silt_metadata::Member>,
    /// The highest term any node reported.
    pub term: u64,
    /// True while a membership change is under way.
    pub joint: bool,
    /// Every member of the membership (as the leader sees it), with its own view of its log.
    pub members: Vec<MemberStatus>,
    /// Nodes that did not answer, with why.
    pub unreachable: Vec<Unreachable>,
    /// Registered agents, from a linearizable read (empty if the read failed: see `state_error`).
    pub agents: Vec<AgentStatus>,
    /// Every partition's writer and epoch.
    pub partitions: Vec<PartitionWriterStatus>,
    /// Segments not archived yet with fewer intact replicas than their replication.factor.
    pub under_replicated: Vec<silt_metadata::agent_registry::UnderReplicated>,
    /// Why agents and partitions could not be read (no quorum), if so.
    pub state_error: Option<String>,
}

/// One agent in [`ClusterStatus`].
#[derive(Debug, Clone, Serialize)]
pub struct AgentStatus {
    /// Agent id.
    pub id: String,
    /// Where it serves.
    pub addr: String,
    /// Which registration of the agent this is (bumped at every start).
    pub incarnation: u64,
    /// Whether its lease holds now, by this machine's clock.
    pub live: bool,
    /// Milliseconds since its last heartbeat, by this machine's clock.
    pub lease_age_ms: u64,
    /// Its lease.
    pub lease_ms: u64,
    /// Partitions it writes.
    pub partitions: usize,
}

/// One partition's writer in [`ClusterStatus`].
#[derive(Debug, Clone, Serialize)]
pub struct PartitionWriterStatus {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The writer agent.
    pub writer: Option<String>,
    /// The partition epoch (bumped at every writer change).
    pub epoch: u64,
    /// The open segment's first offset, if one is open.
    pub open_segment: Option<u64>,
    /// The agents holding the open segment.
    pub ensemble: Vec<String>,
}

/// One member in [`ClusterStatus`].
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    /// Node id.
    pub id: u64,
    /// Address.
    pub addr: String,
    /// `voter` or `learner`.
    pub role: &'static str,
    /// Its Raft state (`leader`, `follower`, `candidate`, `learner`), or null if unreachable.
    pub state: Option<NodeRole>,
    /// Its term.
    pub term: Option<u64>,
    /// Last index in its log.
    pub last_log_index: Option<u64>,
    /// Last index applied to its state machine.
    pub last_applied: Option<u64>,
    /// Last index it knows committed.
    pub committed: Option<u64>,
    /// Last index its snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Its log starts after this index.
    pub purged_index: Option<u64>,
    /// What the leader knows it has replicated to this member.
    pub matched_index: Option<u64>,
    /// Whether it answered.
    pub reachable: bool,
}

/// A node that did not answer.
#[derive(Debug, Clone, Serialize)]
pub struct Unreachable {
    /// The address asked.
    pub addr: String,
    /// Why it did not answer.
    pub error: String,
}

/// Asks every given node and every member they name for its status, and puts the views
/// together.
pub async fn status(client: &MetadataClient) -> Result<ClusterStatus> {
    let mut answers: Vec<(String, Result<NodeStatus, String>)> = client
        .statuses(STATUS_TIMEOUT)
        .await
        .into_iter()
        .map(|(addr, r)| (strip_scheme(&addr), r.map_err(|e| e.to_string())))
        .collect();
    let asked: Vec<String> = answers.iter().map(|(a, _)| a.clone()).collect();
    // Members not given on the command line are asked too.
    let named: Vec<String> = answers
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|s| s.membership.voters.iter().chain(&s.membership.learners))
        .map(|m| m.addr.clone())
        .filter(|a| !asked.contains(a))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for addr in named {
        let answer = client.status_of(&addr, STATUS_TIMEOUT).await.map_err(|e| e.to_string());
        answers.push((addr, answer));
    }

    let reachable: Vec<&NodeStatus> = answers.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    if reachable.is_empty() {
        let reasons: Vec<String> = answers.iter().filter_map(|(_, r)| r.as_ref().err()).cloned().collect();
        bail!("no metadata node answered: {}", reasons.join("; "));
    }
    let term = reachable.iter().map(|s| s.current_term).max().unwrap_or_default();
    // The view to trust: a leader of the highest term, else the highest-term node.
    let reference = reachable
        .iter()
        .copied()
        .filter(|s| s.state == NodeRole::Leader)
        .max_by_key(|s| s.current_term)
        .or_else(|| reachable.iter().copied().max_by_key(|s| (s.current_term, s.membership.log_index)));
    let Some(reference) = reference else { bail!("no metadata node answered") };
    let leader = reachable
        .iter()
        .filter(|s| s.current_term == term)
        .find_map(|s| s.leader.clone())
        .or_else(|| reference.leader.clone());
    let by_id: BTreeMap<u64, &NodeStatus> = reachable.iter().map(|s| (s.id, *s)).collect();
    let replication = reachable
        .iter()
        .filter(|s| s.state == NodeRole::Leader && s.current_term == term)
        .find_map(|s| s.replication.clone())
        .unwrap_or_default();
    let roles = reference
        .membership
        .voters
        .iter()
        .map(|m| (m, "voter"))
        .chain(reference.membership.learners.iter().map(|m| (m, "learner")));
    let members = roles
        .map(|(m, role)| {
            let own = by_id.get(&m.id);
            MemberStatus {
                id: m.id,
                addr: m.addr.clone(),
                role,
                state: own.map(|s| s.state),
                term: own.map(|s| s.current_term),
                last_log_index: own.and_then(|s| s.last_log_index),
                last_applied: own.and_then(|s| s.last_applied),
                committed: own.and_then(|s| s.committed),
                snapshot_index: own.and_then(|s| s.snapshot_index),
                purged_index: own.and_then(|s| s.purged_index),
                matched_index: replication.get(&m.id).copied().flatten(),
                reachable: own.is_some(),
            }
        })
        .collect();
    let unreachable = answers
        .iter()
        .filter_map(|(addr, r)| {
            r.as_ref().err().map(|e| Unreachable { addr: addr.clone(), error: e.clone() })
        })
        .collect();
    let (agents, partitions, under_replicated, state_error) = match client.read_state().await {
        Ok(reply) => {
            let (agents, partitions) = agents_and_writers(&reply.state, reply.clock_now_ms);
            (agents, partitions, reply.state.under_replicated(), None)
        }
        Err(e) => (Vec::new(), Vec::new(), Vec::new(), Some(e.to_string())),
    };
    Ok(ClusterStatus {
        leader,
        term,
        joint: reference.membership.joint,
        members,
        unreachable,
        agents,
        partitions,
        under_replicated,
        state_error,
    })
}

fn agents_and_writers(
    state: &MetadataState,
    clock_now_ms: Option<u64>,
) -> (Vec<AgentStatus>, Vec<PartitionWriterStatus>) {
    // Leases are judged by metadata's own clock (the leader's measured time, which falls
    // behind the wall clock by every gap between leaders), never by this machine's: the
    // leader's clock when it answered, which moves also when no agent heartbeats.
    let now = clock_now_ms.unwrap_or(state.clock_ms).max(state.clock_ms);
    let partitions: Vec<PartitionWriterStatus> = state
        .topics
        .values()
        .flat_map(|t| {
            t.partitions.iter().enumerate().map(|(i, p)| PartitionWriterStatus {
                topic: t.name.clone(),
                partition: i as u32,
                writer: p.writer.clone(),
                epoch: p.epoch,
                open_segment: p.open_segment().map(|s| s.base_offset),
                ensemble: p.open_segment().map(|s| s.ensemble.clone()).unwrap_or_default(),
            })
        })
        .collect();
    let agents = state
        .agents
        .values()
        .map(|a| AgentStatus {
            id: a.id.clone(),
            addr: a.addr.clone(),
            incarnation: a.incarnation,
            live: a.is_live(now),
            lease_age_ms: now.saturating_sub(a.last_heartbeat_ms),
            lease_ms: a.lease_ms,
            partitions: partitions.iter().filter(|p| p.writer.as_deref() == Some(a.id.as_str())).count(),
        })
        .collect();
    (agents, partitions)
}

fn strip_scheme(base: &str) -> String {
    base.trim_start_matches("http://").trim_start_matches("https://").to_string()
}
