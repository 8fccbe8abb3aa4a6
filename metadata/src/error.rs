//! Errors the metadata state machine and service return.

use serde::{Deserialize, Serialize};

use crate::state::GroupMode;

/// Why the metadata refused a command or a read. Each variant names what the user can fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum MetadataError {
    /// The topic does not exist.
    #[error("topic '{0}' does not exist")]
    UnknownTopic(String),
    /// A topic of this name exists already.
    #[error("topic '{0}' already exists")]
    TopicExists(String),
    /// The partition does not exist.
    #[error("topic '{topic}' has no partition {partition}")]
    UnknownPartition {
        /// Topic name.
        topic: String,
        /// Requested partition.
        partition: u32,
    },
    /// The group does not exist.
    #[error("consumer group '{0}' does not exist")]
    UnknownGroup(String),
    /// A member asked for a mode other than the group's.
    #[error("consumer group '{group}' is {existing}; poll it with mode={existing} or use another group name for mode={requested}")]
    GroupModeMismatch {
        /// Group name.
        group: String,
        /// The group's mode.
        existing: GroupMode,
        /// What the member asked for.
        requested: GroupMode,
    },
    /// A topic config is unknown or out of range.
    #[error("invalid topic config: {0}")]
    InvalidConfig(String),
    /// An argument is out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// The caller's epoch is not the partition's: another writer took over.
    #[error("fenced: the request carries epoch {expected} but the partition is at epoch {actual}")]
    Fenced {
        /// Epoch the caller holds.
        expected: u64,
        /// The partition's epoch.
        actual: u64,
    },
    /// The agent is not registered, or registered again since (a newer incarnation).
    #[error("agent '{agent}' is not registered as incarnation {incarnation}; it must register again")]
    UnknownAgent {
        /// Agent id.
        agent: String,
        /// The incarnation the caller holds.
        incarnation: u64,
    },
    /// The agent's lease lapsed; its partitions may have new writers.
    #[error("the lease of agent '{agent}' lapsed; it must register again")]
    LeaseLapsed {
        /// Agent id.
        agent: String,
    },
    /// The metadata service could not complete the request (no quorum, storage failure, shutdown).
    #[error("metadata service unavailable: {0}")]
    Unavailable(String),
}

impl MetadataError {
    /// Whether retrying the same request later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, MetadataError::Unavailable(_))
    }
}
