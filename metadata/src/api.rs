//! The client-facing metadata HTTP API: paths, headers and bodies shared by the server
//! ([`crate::server`]) and [`crate::MetadataClient`].
//!
//! | request | answer |
//! |---|---|
//! | `POST /metadata/write` with a [`Command`](crate::Command) | 200 with the [`Response`](crate::Response) applying it produced (a refused command is `{"type":"error",...}`: it was committed and changed nothing) |
//! | `GET /metadata/state` | 200 with a [`StateReply`]: a linearizable read of the whole state |
//! | `GET /metadata/state?after=N` | 200 with a [`StateDelta`]: the same read, but the state only if something was applied after index `N` |
//! | `GET /metadata/state?after=N&changes=true` | 200 with a [`StateDelta`]: the same, but the commands applied after `N` instead of the state while the leader keeps them (its last 4096 log entries) |
//! | `GET /metadata/status` | 200 with this node's [`NodeStatus`](crate::NodeStatus) |
//! | `POST /metadata/members` with a [`MembersRequest`] | 200 with the leader's [`NodeStatus`](crate::NodeStatus) after the change |
//!
//! Any node accepts every request: a node that does not lead forwards writes, reads and
//! membership changes to the leader. Errors are JSON [`ErrorBody`]s; 503 means "retry" (no
//! leader with a quorum in time, or the node has too many requests in flight), and its
//! [`Outcome`] says whether the request certainly changed nothing (`not_applied`) or may still
//! take effect (`unknown`: it was proposed, but no commit was seen within the time limit).

use serde::{Deserialize, Serialize};

use crate::node_status::Member;
use crate::raft::types::NodeId;
use crate::state::{Command, MetadataState};

/// Path of writes.
pub const WRITE_PATH: &str = "/metadata/write";
/// Path of linearizable reads of the whole state.
pub const STATE_PATH: &str = "/metadata/state";
/// Path of a node's status.
pub const STATUS_PATH: &str = "/metadata/status";
/// Path of membership changes.
pub const MEMBERS_PATH: &str = "/metadata/members";

/// Set on a request one node forwards to the leader (value: the forwarding node's id). A
/// forwarded request is never forwarded again.
pub const FORWARDED_HEADER: &str = "x-silt-forwarded-by";
/// How long the caller waits for the answer, in milliseconds. The node answers within the
/// smaller of this and its own request timeout.
pub const TIMEOUT_HEADER: &str = "x-silt-timeout-ms";
/// On answers: the leader the answering node knows, as `id=host:port`.
pub const LEADER_HEADER: &str = "x-silt-leader";

/// The answer to `GET /metadata/state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateReply {
    /// The node that served the read (the leader).
    pub node_id: NodeId,
    /// The state includes every entry up to this log index, and every write acknowledged before
    /// the read started.
    pub applied_index: Option<u64>,
    /// The whole metadata state.
    pub state: MetadataState,
    /// The leader's lease clock when it answered (what leases are judged by now; the state's
    /// `clock_ms` moves only when a command carrying a clock is applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_now_ms: Option<u64>,
}

/// The answer to `GET /metadata/state?after=N`: the whole state only if it changed since the
/// caller's copy at applied index `N`. With `&changes=true`, the commands applied since instead
/// when the leader still keeps them all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDelta {
    /// The node that served the read (the leader).
    pub node_id: NodeId,
    /// The applied index the answer is current at.
    pub applied_index: Option<u64>,
    /// The whole state, or `None` when nothing was applied after `N` (the caller's copy is
    /// current) or when `changes` holds what was.
    pub state: Option<MetadataState>,
    /// The commands applied after `N` up to `applied_index`, in order: applying them to the
    /// state at `N` gives the state at `applied_index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<Change>>,
}

/// A command applied at a log index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The log index it was applied at.
    pub index: u64,
    /// The command, as applied (its clock stamped by the leader that proposed it).
    pub command: Command,
}

/// The body of `POST /metadata/members`: exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MembersRequest {
    /// Add a node: as a learner first, then, once it caught up, as a voter.
    Add(Member),
    /// Remove a node (voter or learner) from the membership.
    Remove(NodeId),
}

/// Whether a failed request may still take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing was proposed, or what was proposed was discarded: safe to retry anywhere.
    NotApplied,
    /// Proposed but not seen committed in time: it may still be applied. Check before retrying a
    /// command that is not idempotent.
    Unknown,
}

/// An error answer: `{"error": {"code": ..., "message": ..., "outcome": ..., "leader": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// See [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable code: `unavailable` (503), `invalid_json`, `invalid_argument` (400).
    pub code: String,
    /// What happened and what to do, for a person.
    pub message: String,
    /// Whether the request may still take effect.
    pub outcome: Outcome,
    /// The leader the answering node knows, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<Member>,
}

/// Code of 503 answers.
pub const CODE_UNAVAILABLE: &str = "unavailable";
/// Code of a body that is not the expected JSON.
pub const CODE_INVALID_JSON: &str = "invalid_json";
/// Code of a request the node refuses as such.
pub const CODE_INVALID_ARGUMENT: &str = "invalid_argument";
