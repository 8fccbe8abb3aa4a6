//! Silt's benchmark harness (the `silt-bench` binary).
//!
//! Owns: the workload files' format, the load generator (producers at fixed rates or flat out,
//! consumers reading along, HDR latency histograms without coordinated omission), the limits
//! of the machine measured by plain programs (and the plain group-commit server), starting and stopping `silt dev` and NATS
//! JetStream servers on loopback, and the report (JSON and Markdown) in which every Silt figure
//! stands next to the peer's and the limit's as a ratio.
//!
//! Never: used by Silt itself, or pointed at anything but 127.0.0.1. It talks to Silt only
//! through the Rust client (`silt::client`), like any user, and reads the archive only through
//! the object store the tiering crate opens.

pub mod compare;
pub mod group_commit;
pub mod latency;
pub mod limits;
pub mod load;
pub mod nats_system;
pub mod proc_stats;
pub mod replay;
pub mod report;
pub mod silt_system;
pub mod workload;
