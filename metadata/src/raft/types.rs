//! The openraft type configuration of the metadata service and short names for its types.
//!
//! Log entries carry a [`Command`]; applying one yields a [`Response`]. Nodes are numbered with
//! `u64` and carry their address in a [`BasicNode`]. Snapshots travel as bytes.

use std::io::Cursor;

pub use openraft::BasicNode;

use crate::state::{Command, Response};

openraft::declare_raft_types!(
    /// The openraft type configuration of Silt's metadata cluster.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Identifies a metadata node in the cluster.
pub type NodeId = u64;
/// The running Raft node.
pub type Raft = openraft::Raft<TypeConfig>;
/// Position of an entry in the log: leader term, leader node and index.
pub type LogId = openraft::LogId<NodeId>;
/// One entry of the Raft log.
pub type Entry = openraft::Entry<TypeConfig>;
/// What an entry carries.
pub type EntryPayload = openraft::EntryPayload<TypeConfig>;
/// A node's vote (term, candidate, committed).
pub type Vote = openraft::Vote<NodeId>;
/// Last purged and last present log ids.
pub type LogState = openraft::LogState<TypeConfig>;
/// A membership config with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;
/// What a snapshot covers: last log id, membership and id.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, BasicNode>;
/// A snapshot with its data.
pub type Snapshot = openraft::Snapshot<TypeConfig>;
/// Error openraft expects from storage; any such error stops the node.
pub type StorageError = openraft::StorageError<NodeId>;
/// Metrics a Raft node publishes.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, BasicNode>;
