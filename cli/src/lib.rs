//! The `silt` command and the Rust client library.
//!
//! This crate is its own workspace member because it ties the components together: `silt dev`
//! runs metadata, an agent and the compactor in one process, the offline tools
//! (`archive rebuild-metadata`, `bucket init`) open the stores directly, and [`client`] is the
//! Rust client every tool shares (the CLI, the end-to-end tests, the benchmark tool). It holds
//! no state of its own.

pub mod archive;
pub mod bucket;
pub mod client;
pub mod data_dir;
pub mod dev;
