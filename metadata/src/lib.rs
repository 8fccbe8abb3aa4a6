//! Silt's metadata service.
//!
//! Owns the replicated state of a Silt cluster: topics with their configs, partitions with
//! their writer and epoch, the chain of segments of every partition (state, offset range,
//! ensemble, object key) and consumer groups (members, assignments, ack checkpoints).
//! The state machine ([`state`], with [`agent_registry`]) is plain code without I/O;
//! [`MetadataNode`] ([`node`]) replicates it with openraft ([`raft`]: its types, a durable
//! on-disk Raft log in `raft::log_store` and snapshots in `raft::state_machine_store`). A single
//! node (`silt dev`) uses `raft::network`, which reaches nobody; a cluster of `silt metadata`
//! processes talks JSON over HTTP: `raft::http_network` sends the Raft RPCs and [`server`]
//! serves them together with the client-facing API ([`api`]: writes forwarded to the leader,
//! linearizable reads, status, membership changes), which [`MetadataClient`] ([`client`]) uses
//! from other processes.
//!
//! It never holds message payloads. Agents and the compactor talk to it through
//! [`MetadataNode`] in the same process or [`MetadataClient`] over HTTP; it talks to nothing but
//! its own Raft peers.

#![cfg_attr(test, allow(clippy::unwrap_used, reason = "tests may unwrap"))]

pub mod agent_registry;
pub mod api;
pub mod client;
pub mod clock;
mod error;
pub mod handle;
mod lease_clock;
mod node;
pub mod node_status;
pub mod raft;
pub mod runtime;
pub mod server;
pub mod sim_bugs;
pub mod state;
pub mod topic_config;

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod storage_suite_tests;

pub use api::StateReply;
pub use client::{MetadataClient, MetadataClientOptions};
pub use error::MetadataError;
pub use handle::{Metadata, RemoteMetadata};
pub use node::{MetadataNode, MetadataNodeOptions, REQUEST_TIMEOUT};
pub use node_status::{Member, NodeRole, NodeStatus};
pub use raft::log_store::LogStore;
pub use raft::state_machine_store::StateMachineStore;
pub use raft::types::TypeConfig;
pub use state::{Command, GroupMode, MetadataState, Response};
pub use topic_config::TopicConfig;
