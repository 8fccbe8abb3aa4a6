//! [`MetadataNode`]: one running member of the metadata cluster: openraft over a [`LogStore`]
//! and a [`StateMachineStore`] in one directory.
//!
//! Layout of the directory:
//! - `raft-log/`: the [`LogStore`] (vote, committed, purged, `<seq>.log` segments).
//! - `state-machine/`: the [`StateMachineStore`] (`snapshot`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, Fatal, ForwardToLeader, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::{Config, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::log_store::{LogStore, LogStoreOptions, SEGMENT_BYTES_MAX_DEFAULT};
use crate::network::SingleNodeNetwork;
use crate::raft_types::{BasicNode, LogId, NodeId, Raft, RaftMetrics, TypeConfig};
use crate::state::{Command, MetadataState, Response};
use crate::state_machine_store::StateMachineStore;
use crate::MetadataError;

/// How long a write or a linearizable read may take before it fails as `Unavailable`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const LOG_DIR: &str = "raft-log";
const STATE_MACHINE_DIR: &str = "state-machine";

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
        }
    }
}

impl MetadataNodeOptions {
    fn raft_config(&self) -> Result<Config, MetadataError> {
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
}

impl fmt::Debug for MetadataNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataNode").field("node_id", &self.node_id).finish_non_exhaustive()
    }
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
        Self::start(dir, node_id, addr, options, SingleNodeNetwork).await
    }

    async fn start<N: RaftNetworkFactory<TypeConfig>>(
        dir: &Path,
        node_id: u64,
        addr: String,
        options: MetadataNodeOptions,
        network: N,
    ) -> Result<MetadataNode, MetadataError> {
        let config = options.raft_config()?;
        let log_dir = dir.join(LOG_DIR);
        let sm_dir = dir.join(STATE_MACHINE_DIR);
        let log_options = LogStoreOptions { segment_bytes_max: options.log_segment_bytes_max };
        let (log_store, state_machine) = tokio::task::spawn_blocking(move || {
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
        let node = MetadataNode { node_id, raft, state_machine };
        if let Err(e) = node.start_leading(addr).await {
            node.shutdown().await;
            return Err(e);
        }
        Ok(node)
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
        let voters: BTreeSet<NodeId> = self
            .raft
            .with_raft_state(|st| st.membership_state.effective().voter_ids().collect())
            .await
            .map_err(|e| stopped(&e))?;
        if !voters.contains(&node_id) {
            return Err(MetadataError::InvalidArgument(format!(
                "this directory belongs to a metadata cluster of nodes {voters:?}, which does not include node {node_id}"
            )));
        }
        if voters.len() == 1 {
            self.raft
                .wait(Some(REQUEST_TIMEOUT))
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

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Proposes `cmd`, waits until it is committed and applied, and returns what applying it
    /// produced. A refused command is `Err` with its domain error.
    ///
    /// `Unavailable` when this node does not lead, no quorum answers within
    /// [`REQUEST_TIMEOUT`], or the node stopped. After a timeout the command may still be applied
    /// later, so commands should be safe to retry (epochs and expected values make them so).
    pub async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        let written =
            tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(cmd)).await.map_err(|_| {
                MetadataError::Unavailable(format!(
                    "metadata write not committed within {} s (no quorum?)",
                    REQUEST_TIMEOUT.as_secs()
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

    /// Runs `f` over a state that includes every write committed before this call (a read-index
    /// read: this node first confirms it still leads).
    pub async fn read<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> Result<T, MetadataError> {
        let confirmed =
            tokio::time::timeout(REQUEST_TIMEOUT, self.raft.ensure_linearizable()).await.map_err(|_| {
                MetadataError::Unavailable(format!(
                    "metadata read could not confirm leadership within {} s (no quorum?)",
                    REQUEST_TIMEOUT.as_secs()
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

    /// The underlying Raft node, for the transport that will deliver RPCs from peers.
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
