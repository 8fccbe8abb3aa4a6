//! The Silt agent: a stateless broker.
//!
//! Layers, each using only the ones above it in this list:
//! - [`limits`], [`error`], [`metrics`], [`group_cursor`], `sync`: bounds, error codes, gauges, a
//!   group's delivery state on a partition (no I/O), the one way std locks are taken.
//! - [`log`]: the local segment store, disk only: segments of Kafka RecordBatch v2 batches
//!   with sparse offset and time indexes, a partition's chain of them, the follower's replicas
//!   and fence, and the fsync seam ([`log::disk`]).
//! - [`transport`]: the [`transport::Peer`] trait through which an agent reaches another one,
//!   its wire types and its HTTP client.
//! - [`replication`]: the partition writer (an actor that group-commits appends and streams
//!   them to the open segment's ensemble), and the decisions of placement and recovery, which
//!   do no I/O.
//! - [`agent`]: the [`Agent`] facade, a file per concern (writers and their supervisor, topics,
//!   produce, reads, the follower's side, repair, consumer groups).
//! - [`api`]: the public HTTP routes and the internal ones other agents call;
//!   [`memory_network`]: agents of one process calling each other's methods directly, with
//!   links that can be cut (tests and simulation).
//!
//! It never keeps state that metadata and the logs cannot rebuild. Consumer-group delivery
//! state lives in memory and is checkpointed to metadata ([`silt_metadata::MetadataNode`]).

pub mod agent;
pub mod api;
pub mod error;
pub mod group_cursor;
pub mod limits;
pub mod log;
pub mod memory_network;
pub mod metrics;
pub mod replication;
pub mod sim_bugs;
mod sync;
pub mod transport;

pub use agent::{Agent, AgentConfig, Archive};
pub use error::{ApiError, StoreError};
