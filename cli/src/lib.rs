//! The `silt` command and the Rust client library.
//!
//! This crate is its own workspace member because it ties the components together: `silt dev`
//! runs metadata, an agent and the compactor in one process, `silt metadata` runs one node of a
//! metadata cluster and `silt cluster` inspects and changes it, the offline tools
//! (`archive rebuild-metadata`, `bucket init`) open the stores directly, and [`client`] is the
//! Rust client every tool shares (the CLI, the end-to-end tests, the benchmark tool). It holds
//! no state of its own.

pub mod agent;
pub mod archive;
pub mod bucket;
pub mod client;
pub mod cluster;
pub mod compactor;
pub mod data_dir;
pub mod dev;
pub mod metadata;

/// The metadata crate, for programs that talk to a metadata cluster (its `MetadataClient`,
/// commands and state) through this client library.
pub use silt_metadata;
