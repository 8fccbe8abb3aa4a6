//! Silt's metadata service.
//!
//! Owns the replicated state of a Silt cluster: topics with their configs, partitions with
//! their writer and epoch, the chain of segments of every partition (state, offset range,
//! ensemble, object key) and consumer groups (members, assignments, ack checkpoints).
//! The state machine ([`state`]) is plain code without I/O; [`MetadataNode`] replicates it with
//! openraft ([`raft_types`]) over a durable on-disk Raft log ([`log_store`]) and snapshots
//! ([`state_machine_store`]). A single node (`silt dev`) uses [`network`], which reaches nobody;
//! a cluster of `silt metadata` processes talks JSON over HTTP: [`http_network`] sends the Raft
//! RPCs and [`metadata_server`] serves them together with the client-facing API
//! ([`http_api`]: writes forwarded to the leader, linearizable reads, status, membership
//! changes), which [`MetadataClient`] uses from other processes.
//!
//! It never holds message payloads. Agents and the compactor talk to it through
//! [`MetadataNode`] in the same process or [`MetadataClient`] over HTTP; it talks to nothing but
//! its own Raft peers.

#![cfg_attr(test, allow(clippy::unwrap_used, reason = "tests may unwrap"))]

pub mod agent_registry;
mod atomic_file;
pub mod clock;
mod error;
mod frame;
pub mod http_api;
pub mod http_network;
mod lease_clock;
pub mod log_store;
pub mod metadata_client;
pub mod metadata_handle;
mod metadata_node;
pub mod metadata_server;
pub mod network;
pub mod node_status;
pub mod raft_types;
pub mod state;
pub mod state_machine_store;
pub mod topic_config;

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod storage_suite_tests;

pub use error::MetadataError;
pub use http_api::StateReply;
pub use log_store::LogStore;
pub use metadata_client::{MetadataClient, MetadataClientOptions};
pub use metadata_handle::{Metadata, RemoteMetadata};
pub use metadata_node::{MetadataNode, MetadataNodeOptions, REQUEST_TIMEOUT};
pub use node_status::{Member, NodeRole, NodeStatus};
pub use raft_types::TypeConfig;
pub use state::{Command, GroupMode, MetadataState, Response};
pub use state_machine_store::StateMachineStore;
pub use topic_config::TopicConfig;
