//! The Silt agent: a stateless broker.
//!
//! Owns the client API ([`api`]: produce, poll, ack, replay, admin), the writers of the
//! partitions it leads ([`partition_writer`]) and the local segment store
//! ([`partition_log`], [`segment`]): Kafka RecordBatch v2 batches in segment files with sparse
//! offset and time indexes, group-committed and acknowledged only after fsync.
//! Consumer-group delivery state lives in memory ([`group_cursor`]) and is checkpointed to
//! metadata; everything here can be rebuilt from the local logs and metadata.
//!
//! It never keeps state that metadata and the logs cannot rebuild. It talks to the metadata
//! service ([`silt_metadata::MetadataNode`]) and to clients.

pub mod agent;
pub mod api;
pub mod disk;
pub mod error;
pub mod group_cursor;
pub mod limits;
pub mod metrics;
pub mod partition_log;
pub mod partition_writer;
pub mod peer;
mod placement;
mod recovery;
pub mod replica;
pub mod replication;
pub mod segment;

pub use agent::{Agent, AgentConfig, Archive};
pub use error::{ApiError, StoreError};
