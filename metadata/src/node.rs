//! [`MetadataNode`]: one running member of the metadata cluster: openraft over a [`LogStore`]
//! and a [`StateMachineStore`] in one directory.
//!
//! A node runs either alone ([`MetadataNode::open`], `silt dev`: a single-node cluster whose
//! network reaches nobody) or as a member of a cluster ([`MetadataNode::open_cluster`], `silt
//! metadata`: the [`HttpNetwork`] to its peers, served by [`crate::server`]).
//!
//! Layout of the directory:
//! - `raft-log/`: the [`LogStore`] (vote, committed, purged, `<seq>.log` segments).
//! - `state-machine/`: the [`StateMachineStore`] (`snapshot`).
//!
//! Past 800 lines only with its tests: the code is the first 719 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    ChangeMembershipError, CheckIsLeaderError, ClientWriteError, Fatal, ForwardToLeader, RaftError,
};
use openraft::network::RaftNetworkFactory;
use openraft::{ChangeMembers, Config, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lease_clock::LeaseClock;
use crate::node_status::{Member, NodeStatus};
use crate::raft::http_network::HttpNetwork;
use crate::raft::log_store::{LogStore, LogStoreOptions, SEGMENT_BYTES_MAX_DEFAULT};
use crate::raft::network::SingleNodeNetwork;
use crate::raft::state_machine_store::{Changes, StateMachineStore};
use crate::raft::types::{BasicNode, LogId, NodeId, Raft, RaftMetrics, TypeConfig};
use crate::state::{Command, MetadataState, Response};
use crate::MetadataError;

/// How long a write or a linearizable read may take before it fails as `Unavailable`, unless
/// [`MetadataNodeOptions::request_timeout_ms`] says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const LOG_DIR: &str = "raft-log";
const STATE_MACHINE_DIR: &str = "state-machine";
/// Snapshots travel in chunks of at most this many bytes (JSON-encoded, so about 3.5 times
/// larger on the wire).
const SNAPSHOT_CHUNK_BYTES_MAX: u64 = 1024 * 1024;
/// Time to send one snapshot chunk, and for the last one to be installed (written and fsynced).
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;
/// How often a wait for a membership condition looks at the metrics again.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Tunables of a [`MetadataNode`]. `Default` suits production; tests shrink the thresholds.
/// Deserializable with defaults for every missing field; unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataNodeOptions {
    /// Build a snapshot once this many entries were applied since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries already covered by a snapshot that stay in the log, so a briefly lagging
    /// follower catches up from the log instead of a snapshot.
    pub snapshot_logs_to_keep: u64,
    /// Purge the log in batches of at least this many entries.
    pub purge_batch_size: u64,
    /// Size of the log's segment files; space is reclaimed a segment at a time.
    pub log_segment_bytes_max: u64,
    /// A leader sends heartbeats this often.
    pub heartbeat_interval_ms: u64,
    /// A follower that heard no leader for a random time in `[min, max)` starts an election.
    pub election_timeout_min_ms: u64,
    /// See `election_timeout_min_ms`.
    pub election_timeout_max_ms: u64,
    /// A write or linearizable read fails as `Unavailable` after this long (no quorum, no
    /// leader).
    pub request_timeout_ms: u64,
}

impl Default for MetadataNodeOptions {
    fn default() -> Self {
        Self {
            snapshot_logs_since_last: 4096,
            snapshot_logs_to_keep: 1000,
            purge_batch_size: 256,
            log_segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            request_timeout_ms: REQUEST_TIMEOUT.as_millis() as u64,
        }
    }
}

impl MetadataNodeOptions {
    fn raft_config(&self) -> Result<Config, MetadataError> {
        if self.request_timeout_ms == 0 {
            return Err(MetadataError::InvalidArgument(
                "the metadata request timeout must be above 0".into(),
            ));
        }
        let config = Config {
            cluster_name: "silt-metadata".to_string(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: self.snapshot_logs_to_keep,
            purge_batch_size: self.purge_batch_size.max(1),
            // A follower further behind than this gets a snapshot; openraft wants it above the
            // snapshot interval.
            replication_lag_threshold: self.snapshot_logs_since_last.saturating_mul(2).max(1000),
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES_MAX,
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            ..Config::default()
        };
        config
            .validate()
            .map_err(|e| MetadataError::InvalidArgument(format!("invalid metadata raft config: {e}")))
    }
}

/// A running metadata node. Cloning is cheap; all clones drive the same node.
#[derive(Clone)]
pub struct MetadataNode {
    node_id: NodeId,
    raft: Raft,
    state_machine: StateMachineStore,
    request_timeout: Duration,
    /// A leader whose last quorum acknowledgement is older than this may have been deposed: it
    /// proposes nothing until a quorum answers again.
    quorum_ack_stale_ms: u64,
    /// The time stamped on commands this node proposes as leader (see `lease_clock.rs`).
    lease_clock: Arc<std::sync::Mutex<LeaseClock>>,
    /// Where the lease clock's monotonic readings are measured from.
    started: std::time::Instant,
}

impl fmt::Debug for MetadataNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataNode").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

/// Where a request that needs the leader should go, as this node sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// This node leads and a quorum acknowledged it recently.
    Local,
    /// Another node leads.
    Forward(Member),
    /// No usable leader right now (election under way, no quorum): wait and look again.
    Wait(String),
}

/// Why a request that needs the leader failed on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaderError {
    /// This node does not lead (any more); nothing took effect here. Route again.
    NotLeader,
    /// Nothing took effect; may succeed if retried (a read without quorum).
    Retry(String),
    /// Proposed, but its fate is unknown (not committed in time, the node stopped).
    Unknown(String),
    /// Refused as asked; retrying will not help.
    Invalid(String),
}

/// This node's clock, in ms since the Unix epoch.
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl MetadataNode {
    /// Opens the node stored in `dir` (created if missing) with default options. A fresh
    /// directory becomes a single-node cluster of `node_id` reachable at `addr`; an existing one
    /// comes back with all committed state. Returns once this node leads.
    pub async fn open(dir: &Path, node_id: u64, addr: String) -> Result<MetadataNode, MetadataError> {
        Self::open_with(dir, node_id, addr, MetadataNodeOptions::default()).await
    }

    /// [`open`](Self::open) with explicit options.
    pub async fn open_with(
        dir: &Path,
        node_id: u64,
        addr: String,
        options: MetadataNodeOptions,
    ) -> Result<MetadataNode, MetadataError> {
        let node = Self::start(dir, node_id, &options, SingleNodeNetwork).await?;
        if let Err(e) = node.start_leading(addr).await {
            node.shutdown().await;
            return Err(e);
        }
        Ok(node)
    }

    /// Opens the node stored in `dir` (created if missing) as a member of a multi-node cluster
    /// whose peers talk over HTTP ([`HttpNetwork`]); serve [`crate::server::router`] on
    /// this node's address so they can reach it.
    ///
    /// With `initial_members` (`silt metadata --init`), a fresh node initializes the cluster with
    /// them all as voters (id -> `host:port`; they must include `node_id`); a node that is
    /// already initialized ignores it. Without, the node waits to be contacted by a leader: as
    /// one of the initial members, or as a node added later ([`add_node`](Self::add_node)).
    /// Returns at once, without waiting for a leader.
    pub async fn open_cluster(
        dir: &Path,
        node_id: u64,
        initial_members: Option<BTreeMap<NodeId, String>>,
        options: MetadataNodeOptions,
    ) -> Result<MetadataNode, MetadataError> {
        Self::open_cluster_over(dir, node_id, initial_members, options, HttpNetwork::new()?).await
    }

    /// [`open_cluster`](Self::open_cluster) over the Raft network `network` (the simulator's
    /// nodes in one process talk over a
    /// [`MemoryRaftNetwork`](crate::raft::memory_network::MemoryRaftNetwork)).
    pub async fn open_cluster_over<N: RaftNetworkFactory<TypeConfig>>(
        dir: &Path,
        node_id: u64,
        initial_members: Option<BTreeMap<NodeId, String>>,
        options: MetadataNodeOptions,
        network: N,
    ) -> Result<MetadataNode, MetadataError> {
        if let Some(members) = &initial_members {
            if !members.contains_key(&node_id) {
                return Err(MetadataError::InvalidArgument(format!(
                    "the initial members {:?} do not include this node ({node_id})",
                    members.keys().collect::<Vec<_>>()
                )));
            }
        }
        let node = Self::start(dir, node_id, &options, network).await?;
        if let Some(members) = initial_members {
            if let Err(e) = node.initialize(members).await {
                node.shutdown().await;
                return Err(e);
            }
        }
        Ok(node)
    }

    async fn start<N: RaftNetworkFactory<TypeConfig>>(
        dir: &Path,
        node_id: u64,
        options: &MetadataNodeOptions,
        network: N,
    ) -> Result<MetadataNode, MetadataError> {
        let config = options.raft_config()?;
        let log_dir = dir.join(LOG_DIR);
        let sm_dir = dir.join(STATE_MACHINE_DIR);
        let log_options = LogStoreOptions { segment_bytes_max: options.log_segment_bytes_max };
        let (log_store, state_machine) = crate::runtime::spawn_blocking(move || {
            let log_store = LogStore::open_with(&log_dir, log_options)
                .map_err(|e| format!("cannot open the raft log in {}: {e}", log_dir.display()))?;
            let state_machine = StateMachineStore::open(&sm_dir)
                .map_err(|e| format!("cannot open the state machine in {}: {e}", sm_dir.display()))?;
            Ok::<_, String>((log_store, state_machine))
        })
        .await
        .map_err(|e| MetadataError::Unavailable(format!("opening the metadata stores failed: {e}")))?
        .map_err(MetadataError::Unavailable)?;

        let raft = Raft::new(node_id, Arc::new(config), network, log_store, state_machine.clone())
            .await
            .map_err(|e| stopped(&e))?;
        Ok(MetadataNode {
            node_id,
            raft,
            state_machine,
            request_timeout: Duration::from_millis(options.request_timeout_ms),
            quorum_ack_stale_ms: options.election_timeout_min_ms,
            lease_clock: Arc::default(),
            started: std::time::Instant::now(),
        })
    }

    /// Initializes a fresh node as a single-node cluster and waits until it leads.
    async fn start_leading(&self, addr: String) -> Result<(), MetadataError> {
        let node_id = self.node_id;
        if !self.raft.is_initialized().await.map_err(|e| stopped(&e))? {
            tracing::info!(node_id, %addr, "initializing a single-node metadata cluster");
            let members = BTreeMap::from([(node_id, BasicNode::new(addr))]);
            self.raft.initialize(members).await.map_err(|e| {
                MetadataError::Unavailable(format!("cannot initialize the metadata cluster: {e}"))
            })?;
        }
        let voters = self.voter_ids().await?;
        if !voters.contains(&node_id) {
            return Err(MetadataError::InvalidArgument(format!(
                "this directory belongs to a metadata cluster of nodes {voters:?}, which does not include node {node_id}"
            )));
        }
        if voters.len() == 1 {
            self.raft
                .wait(Some(self.request_timeout))
                .state(ServerState::Leader, "single metadata node becomes leader")
                .await
                .map_err(|e| {
                    MetadataError::Unavailable(format!(
                        "node {node_id} did not become the metadata leader: {e}"
                    ))
                })?;
        }
        Ok(())
    }

    /// Initializes a fresh node with `members` as voters; does nothing if it is initialized.
    async fn initialize(&self, members: BTreeMap<NodeId, String>) -> Result<(), MetadataError> {
        let node_id = self.node_id;
        if self.raft.is_initialized().await.map_err(|e| stopped(&e))? {
            let voters = self.voter_ids().await?;
            tracing::info!(node_id, ?voters, "the metadata cluster is already initialized; ignoring --init");
            return Ok(());
        }
        tracing::info!(node_id, ?members, "initializing the metadata cluster");
        let members: BTreeMap<NodeId, BasicNode> =
            members.into_iter().map(|(id, addr)| (id, BasicNode::new(addr))).collect();
        self.raft
            .initialize(members)
            .await
            .map_err(|e| MetadataError::Unavailable(format!("cannot initialize the metadata cluster: {e}")))
    }

    async fn voter_ids(&self) -> Result<BTreeSet<NodeId>, MetadataError> {
        self.raft
            .with_raft_state(|st| st.membership_state.effective().voter_ids().collect())
            .await
            .map_err(|e| stopped(&e))
    }

    /// The time to stamp on a command proposed now: the state's clock when this node's term
    /// began, plus the time its monotonic clock measured since (see `lease_clock.rs`). On a
    /// follower, an estimate of the leader's.
    pub(crate) fn lease_clock_ms(&self) -> u64 {
        let term = self.raft.metrics().borrow().current_term;
        let state_clock_ms = self.read_local(|s| s.clock_ms);
        let mut clock = self.lease_clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.now_ms(term, state_clock_ms, wall_clock_ms(), self.started.elapsed())
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// How long a write or linearizable read may take here.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Proposes `cmd`, waits until it is committed and applied, and returns what applying it
    /// produced. A refused command is `Err` with its domain error.
    ///
    /// `Unavailable` when this node does not lead, no quorum answers within the request timeout
    /// ([`REQUEST_TIMEOUT`] by default), or the node stopped. After a timeout the command may
    /// still be applied later, so commands should be safe to retry (epochs and expected values
    /// make them so).
    pub async fn write(&self, mut cmd: Command) -> Result<Response, MetadataError> {
        if let Some(why) = cmd.refused_at_proposal() {
            return Err(MetadataError::InvalidArgument(why));
        }
        cmd.stamp_clock(self.lease_clock_ms());
        let written =
            tokio::time::timeout(self.request_timeout, self.raft.client_write(cmd)).await.map_err(|_| {
                MetadataError::Unavailable(format!(
                    "metadata write not committed within {} ms (no quorum?)",
                    self.request_timeout.as_millis()
                ))
            })?;
        match written {
            Ok(reply) => reply.data.into_result(),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(not_leader(&f)),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(MetadataError::Unavailable(format!("metadata membership change refused: {e}")))
            }
            Err(RaftError::Fatal(f)) => Err(stopped(&f)),
        }
    }

    /// Proposes `cmd` on this node, for the HTTP API: like [`write`](Self::write), but says
    /// whether a failed proposal can have taken effect. openraft answers that this node does
    /// not lead for an entry it never appended, and for one it appended and then cut from its
    /// log for a newer leader's: that entry may still be committed by a later leader elected
    /// with a follower that holds it (with five nodes or more, a newer leader can be elected
    /// without any node that holds it). So `NotLeader` (certainly nothing took effect) is
    /// answered only when this node did not lead as the proposal was made; otherwise the
    /// outcome is `Unknown`.
    pub(crate) async fn propose(&self, mut cmd: Command, timeout: Duration) -> Result<Response, LeaderError> {
        if let Some(why) = cmd.refused_at_proposal() {
            return Ok(Response::Error { error: MetadataError::InvalidArgument(why) });
        }
        cmd.stamp_clock(self.lease_clock_ms());
        let leading = self.raft.metrics().borrow().state == ServerState::Leader;
        match tokio::time::timeout(timeout, self.raft.client_write(cmd)).await {
            Err(_) => Err(LeaderError::Unknown(format!(
                "the write was proposed by metadata node {} but not committed within {} ms (no quorum? {}); \
                 it may still be applied if enough nodes come back: check before retrying it",
                self.node_id,
                timeout.as_millis(),
                quorum_phrase(self.voter_count())
            ))),
            Ok(Ok(reply)) => Ok(reply.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) if !leading => {
                Err(LeaderError::NotLeader)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => Err(LeaderError::Unknown(format!(
                "metadata node {} lost its leadership while the write was under way; another node may hold it \
                 and commit it once it leads: check before retrying it",
                self.node_id
            ))),
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(LeaderError::Invalid(format!("metadata membership change refused: {e}")))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(LeaderError::Unknown(stopped(&f).to_string())),
        }
    }

    /// Runs `f` over a state that includes every write committed before this call (a read-index
    /// read: this node first confirms it still leads).
    pub async fn read<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> Result<T, MetadataError> {
        let confirmed = tokio::time::timeout(self.request_timeout, self.raft.ensure_linearizable())
            .await
            .map_err(|_| {
                MetadataError::Unavailable(format!(
                    "metadata read could not confirm leadership within {} ms (no quorum?)",
                    self.request_timeout.as_millis()
                ))
            })?;
        match confirmed {
            Ok(_) => Ok(self.state_machine.read(f)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(not_leader(&f)),
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(MetadataError::Unavailable(format!("metadata read without quorum: {e}")))
            }
            Err(RaftError::Fatal(f)) => Err(stopped(&f)),
        }
    }

    /// A linearizable read of the whole state on this node, for the HTTP API: the state and the
    /// index of the last entry it includes.
    pub(crate) async fn read_state(
        &self,
        timeout: Duration,
    ) -> Result<(Option<u64>, MetadataState), LeaderError> {
        self.confirm_leadership(timeout).await?;
        let (applied, state) = self.state_machine.read_at(MetadataState::clone);
        Ok((applied.map(|l| l.index), state))
    }

    /// A linearizable read of what changed after log index `after` (see
    /// [`StateMachineStore::changes_after`]), and the index it reaches.
    pub(crate) async fn read_changes(
        &self,
        timeout: Duration,
        after: u64,
    ) -> Result<(Option<u64>, Changes), LeaderError> {
        self.confirm_leadership(timeout).await?;
        Ok(self.state_machine.changes_after(after))
    }

    /// Confirms with a quorum that this node leads, so that what it applied includes every
    /// write acknowledged before the call.
    async fn confirm_leadership(&self, timeout: Duration) -> Result<(), LeaderError> {
        let confirmed =
            tokio::time::timeout(timeout, self.raft.ensure_linearizable()).await.map_err(|_| {
                LeaderError::Retry(format!(
                    "metadata node {} could not confirm its leadership within {} ms (no quorum? {})",
                    self.node_id,
                    timeout.as_millis(),
                    quorum_phrase(self.voter_count())
                ))
            })?;
        match confirmed {
            Ok(_) => {}
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                return Err(LeaderError::NotLeader)
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                return Err(LeaderError::Retry(format!("metadata read without quorum: {e}")))
            }
            Err(RaftError::Fatal(f)) => return Err(LeaderError::Retry(stopped(&f).to_string())),
        }
        Ok(())
    }

    /// Where a request that needs the leader should go, from this node's current metrics.
    pub(crate) fn route(&self) -> Route {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters = membership.voter_ids().count();
        if m.state == ServerState::Leader && m.current_leader == Some(self.node_id) {
            let fresh =
                voters <= 1 || m.millis_since_quorum_ack.is_some_and(|ms| ms <= self.quorum_ack_stale_ms);
            return if fresh {
                Route::Local
            } else {
                let since =
                    m.millis_since_quorum_ack.map_or_else(|| "a while".to_string(), |ms| format!("{ms} ms"));
                Route::Wait(format!(
                    "no metadata leader: node {} leads but no quorum acknowledged it for {since}; {}",
                    self.node_id,
                    quorum_phrase(voters)
                ))
            };
        }
        match m.current_leader {
            Some(id) if id != self.node_id => match membership.get_node(&id) {
                Some(node) => Route::Forward(Member { id, addr: node.addr.clone() }),
                None => Route::Wait(format!("the leader, node {id}, has no address in the membership")),
            },
            _ => Route::Wait(no_leader_message(voters)),
        }
    }

    /// The leader this node knows (itself when it leads), with its address.
    pub(crate) fn known_leader(&self) -> Option<Member> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id).map(|n| n.addr.clone())?;
        Some(Member { id, addr })
    }

    /// "No leader, cannot reach a quorum" in words, for error messages.
    pub(crate) fn quorum_summary(&self) -> String {
        no_leader_message(self.voter_count())
    }

    fn voter_count(&self) -> usize {
        self.raft.metrics().borrow().membership_config.membership().voter_ids().count()
    }

    /// This node's view of the cluster.
    pub async fn status(&self) -> NodeStatus {
        let committed = self.raft.with_raft_state(|st| st.committed.map(|c| c.index)).await.ok().flatten();
        let m = self.raft.metrics().borrow().clone();
        NodeStatus::from_metrics(&m, committed)
    }

    /// On the leader: adds node `id` at `addr` (`host:port`, where `silt metadata --id <id>` must
    /// be listening) as a learner, waits until it has caught up, then makes it a voter.
    /// Idempotent: a node that is already a voter at that address is left as it is.
    pub(crate) async fn add_node(
        &self,
        id: NodeId,
        addr: String,
        timeout: Duration,
    ) -> Result<(), LeaderError> {
        let deadline = Instant::now() + timeout;
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        if let Some(node) = membership.get_node(&id) {
            if node.addr != addr {
                return Err(LeaderError::Invalid(format!(
                    "metadata node {id} is already a member at {}; remove it first to move it to {addr}",
                    node.addr
                )));
            }
        }
        let is_voter = membership.voter_ids().any(|v| v == id);
        if is_voter {
            return Ok(());
        }
        let is_learner = membership.learner_ids().any(|l| l == id);
        let membership_index = if is_learner {
            membership_log_index(&self.raft.metrics().borrow())
        } else {
            tracing::info!(id, %addr, "adding a metadata node as a learner");
            let added =
                within(deadline, self.raft.add_learner(id, BasicNode::new(addr.clone()), false)).await?;
            Some(membership_reply(added)?.log_id.index)
        };
        tracing::info!(id, %addr, "waiting for the new metadata node to catch up");
        self.wait_metrics(deadline, |m| {
            let matched = m.replication.as_ref().and_then(|r| r.get(&id)).copied().flatten().map(|l| l.index);
            matched.is_some() && matched >= membership_index
        })
        .await
        .map_err(|e| match e {
            LeaderError::Retry(_) => LeaderError::Unknown(format!(
                "metadata node {id} at {addr} did not catch up within {} ms: is `silt metadata --id {id}` \
                 listening there? It stays a learner; run add-node again once it runs, or remove-node {id}",
                timeout.as_millis()
            )),
            other => other,
        })?;
        tracing::info!(id, %addr, "promoting the metadata node to voter");
        let promoted = within(
            deadline,
            self.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false),
        )
        .await?;
        membership_reply(promoted)?;
        Ok(())
    }

    /// On the leader: removes node `id` from the membership, voter or learner. Removing a node
    /// that is not a member does nothing.
    pub(crate) async fn remove_node(&self, id: NodeId, timeout: Duration) -> Result<(), LeaderError> {
        let deadline = Instant::now() + timeout;
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(LeaderError::Invalid(format!(
                    "metadata node {id} is the only voter; a cluster cannot remove its last voter"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else if membership.learner_ids().any(|l| l == id) {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            return Ok(());
        };
        tracing::info!(id, "removing a metadata node");
        let changed = within(deadline, self.raft.change_membership(change, false)).await?;
        let index = membership_reply(changed)?.log_id.index;
        self.wait_for_membership(deadline, index).await
    }

    /// Waits until the metrics show the membership of log entry `index` or a later one, so a
    /// status read afterwards shows the change. A node that removed itself stops leading: fine.
    async fn wait_for_membership(&self, deadline: Instant, index: u64) -> Result<(), LeaderError> {
        match self.wait_metrics(deadline, |m| membership_log_index(m) >= Some(index)).await {
            Ok(()) | Err(LeaderError::NotLeader) => Ok(()),
            Err(_) => Err(LeaderError::Unknown(format!(
                "the membership change at log index {index} was committed but not yet applied here"
            ))),
        }
    }

    /// Waits until `done` holds for this node's metrics; `Retry` at the deadline, `NotLeader`
    /// when this node stops leading.
    async fn wait_metrics(
        &self,
        deadline: Instant,
        done: impl Fn(&RaftMetrics) -> bool,
    ) -> Result<(), LeaderError> {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_and_update();
                if m.state != ServerState::Leader {
                    return Err(LeaderError::NotLeader);
                }
                if done(&m) {
                    return Ok(());
                }
            }
            let wake = deadline.min(Instant::now() + POLL_INTERVAL);
            if Instant::now() >= deadline {
                return Err(LeaderError::Retry("timed out".into()));
            }
            // Metrics are republished on every tick of the Raft core; the poll interval bounds
            // the wait in case they are not.
            let _ = tokio::time::timeout_at(wake, metrics.changed()).await;
        }
    }

    /// Runs `f` over this node's current state without confirming leadership: fast, possibly
    /// stale on a node that lost its leadership. For hot paths that tolerate that.
    pub fn read_local<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> T {
        self.state_machine.read(f)
    }

    /// A channel holding the last applied log id; it changes on every applied entry. Wait with
    /// `changed()`, then read.
    pub fn changes(&self) -> watch::Receiver<Option<LogId>> {
        self.state_machine.subscribe()
    }

    /// openraft's metrics of this node (role, leader, log and snapshot positions).
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics> {
        self.raft.metrics()
    }

    /// The underlying Raft node, for the transport that delivers RPCs from peers.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops the node: pending requests fail with `Unavailable`; the stores are closed.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::error!(node_id = self.node_id, error = %e, "the metadata raft task failed while shutting down");
        }
    }
}

type MembershipResult = Result<
    openraft::raft::ClientWriteResponse<TypeConfig>,
    RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
>;

/// Runs a membership change with a deadline; a timeout leaves its outcome unknown.
async fn within(
    deadline: Instant,
    change: impl std::future::Future<Output = MembershipResult>,
) -> Result<MembershipResult, LeaderError> {
    tokio::time::timeout_at(deadline, change)
        .await
        .map_err(|_| LeaderError::Unknown("the membership change was not committed in time".into()))
}

fn membership_reply(
    result: MembershipResult,
) -> Result<openraft::raft::ClientWriteResponse<TypeConfig>, LeaderError> {
    match result {
        Ok(reply) => Ok(reply),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(LeaderError::NotLeader),
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => match e {
            ChangeMembershipError::InProgress(_) => {
                Err(LeaderError::Retry(format!("another membership change is in progress: {e}")))
            }
            other => Err(LeaderError::Invalid(format!("membership change refused: {other}"))),
        },
        Err(RaftError::Fatal(f)) => Err(LeaderError::Unknown(stopped(&f).to_string())),
    }
}

fn membership_log_index(m: &RaftMetrics) -> Option<u64> {
    m.membership_config.log_id().map(|l| l.index)
}

fn no_leader_message(voters: usize) -> String {
    format!("no metadata leader: {}", quorum_phrase(voters))
}

fn quorum_phrase(voters: usize) -> String {
    let quorum = voters / 2 + 1;
    format!(
        "cannot reach a quorum of {voters} node{} ({quorum} must answer); check that the metadata \
         nodes are running and can reach each other",
        if voters == 1 { "" } else { "s" }
    )
}

fn not_leader(f: &ForwardToLeader<NodeId, BasicNode>) -> MetadataError {
    MetadataError::Unavailable(match (&f.leader_id, &f.leader_node) {
        (Some(id), Some(node)) => {
            format!("this metadata node is not the leader; the leader is node {id} at {}", node.addr)
        }
        (Some(id), None) => format!("this metadata node is not the leader; the leader is node {id}"),
        (None, _) => {
            "this metadata node is not the leader and no leader is known yet; retry shortly".to_string()
        }
    })
}

fn stopped(f: &Fatal<NodeId>) -> MetadataError {
    MetadataError::Unavailable(format!("the metadata raft node has stopped: {f}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::GroupMode;

    fn create_topic(name: &str, partitions: u32) -> Command {
        Command::CreateTopic { name: name.to_string(), partitions, config: BTreeMap::new(), now_ms: 1_000 }
    }

    fn addr() -> String {
        "127.0.0.1:7000".to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restart_keeps_committed_state_and_accepts_writes() {
        let dir = tempfile::tempdir().unwrap();
        let node = MetadataNode::open(dir.path(), 1, addr()).await.unwrap();
        assert_eq!(node.metrics().borrow().current_leader, Some(1));
        let changes = node.changes();

        assert!(matches!(node.write(create_topic("orders", 3)).await.unwrap(), Response::Topic { .. }));
        assert!(changes.has_changed().unwrap(), "applying a write ticks the change channel");
        let epoch = node
            .write(Command::ClaimWriter {
                topic_id: None,
                topic: "orders".into(),
                partition: 1,
                agent: "agent-a".into(),
                expected_epoch: None,
            })
            .await
            .unwrap();
        assert_eq!(epoch, Response::Epoch { epoch: 1 });
        node.write(Command::JoinGroup {
            group: "billing".into(),
            topic: "orders".into(),
            member: "m1".into(),
            mode: GroupMode::Exclusive,
            session_timeout_ms: 30_000,
            now_ms: 1_000,
        })
        .await
        .unwrap();
        assert_eq!(
            node.write(create_topic("orders", 1)).await,
            Err(MetadataError::TopicExists("orders".into())),
            "domain errors come back as Err"
        );
        let before = node.read(|s| s.clone()).await.unwrap();
        assert_eq!(before.topics["orders"].partitions[1].writer.as_deref(), Some("agent-a"));
        node.shutdown().await;
        assert!(matches!(node.write(create_topic("late", 1)).await, Err(MetadataError::Unavailable(_))));

        let node = MetadataNode::open(dir.path(), 1, addr()).await.unwrap();
        assert_eq!(node.read(|s| s.clone()).await.unwrap(), before);
        assert_eq!(node.read_local(|s| s.clone()), before);
        node.write(create_topic("payments", 2)).await.unwrap();
        let topics = node.read(|s| s.topics.keys().cloned().collect::<Vec<_>>()).await.unwrap();
        assert_eq!(topics, ["orders", "payments"]);
        node.shutdown().await;

        let err = MetadataNode::open(dir.path(), 2, addr()).await.unwrap_err();
        assert!(err.to_string().contains("does not include node 2"), "{err}");
    }

    /// An older agent's `RebalanceWriters` (which moved partitions it did not write) is refused
    /// before it reaches the log; the state is unchanged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rebalance_proposed_by_an_older_agent_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let node = MetadataNode::open(dir.path(), 1, addr()).await.unwrap();
        node.write(create_topic("orders", 3)).await.unwrap();
        let before = node.read(|s| s.clone()).await.unwrap();
        let r = node.write(Command::RebalanceWriters { now_ms: 1_000 }).await;
        assert!(matches!(&r, Err(MetadataError::InvalidArgument(m)) if m.contains("MoveWriter")), "{r:?}");
        let r = node.propose(Command::RebalanceWriters { now_ms: 1_000 }, Duration::from_secs(5)).await;
        assert!(matches!(r, Ok(Response::Error { error: MetadataError::InvalidArgument(_) })), "{r:?}");
        assert_eq!(node.read(|s| s.clone()).await.unwrap(), before);
        node.shutdown().await;
    }

    fn log_bytes(dir: &Path) -> (usize, u64) {
        let mut files = 0;
        let mut bytes = 0;
        for entry in std::fs::read_dir(dir.join(LOG_DIR)).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name().to_string_lossy().ends_with(".log") {
                files += 1;
                bytes += entry.metadata().unwrap().len();
            }
        }
        (files, bytes)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshots_bound_the_log_and_restore_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let options = MetadataNodeOptions {
            snapshot_logs_since_last: 20,
            snapshot_logs_to_keep: 5,
            purge_batch_size: 1,
            log_segment_bytes_max: 1024,
            ..MetadataNodeOptions::default()
        };
        let node = MetadataNode::open_with(dir.path(), 1, addr(), options.clone()).await.unwrap();
        let writes = 300;
        for i in 0..writes {
            node.write(create_topic(&format!("topic-{i:03}"), 1)).await.unwrap();
        }
        let last_index = node.metrics().borrow().last_log_index.unwrap();
        let metrics = node
            .raft()
            .wait(Some(REQUEST_TIMEOUT))
            .metrics(
                |m| {
                    m.snapshot.is_some_and(|s| s.index + 20 > last_index)
                        && m.purged.is_some_and(|p| p.index + 30 > last_index)
                },
                "snapshot and purge catch up",
            )
            .await
            .unwrap();
        let (files, bytes) = log_bytes(dir.path());
        // Unbounded, the log would hold 300 entries of ~200 bytes in ~60 segments.
        assert!(files <= 8 && bytes <= 8 * 1024, "{files} segment files, {bytes} bytes");
        let before = node.read(|s| s.clone()).await.unwrap();
        assert_eq!(before.topics.len(), writes);
        node.shutdown().await;

        let node = MetadataNode::open_with(dir.path(), 1, addr(), options).await.unwrap();
        let reopened = node.metrics().borrow().clone();
        let purged = reopened.purged.expect("the log starts after a purge point");
        assert!(purged.index >= metrics.purged.unwrap().index);
        assert!(reopened.snapshot.is_some_and(|s| s.index >= purged.index), "state starts from the snapshot");
        assert_eq!(node.read(|s| s.clone()).await.unwrap(), before);
        node.write(create_topic("after-restart", 1)).await.unwrap();
        assert_eq!(node.read_local(|s| s.topics.len()), writes + 1);
        node.shutdown().await;
    }
}
