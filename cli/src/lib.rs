//! The `silt` command and the Rust client library.
//!
//! This crate is its own workspace member because it ties the components together: `silt dev`
//! runs metadata, an agent and (later) the compactor in one process, and [`client`] is the Rust
//! client every tool shares (the CLI, the end-to-end tests, the benchmark tool). It holds no
//! state of its own.

pub mod client;
pub mod dev;
