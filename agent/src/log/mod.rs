//! The local segment store: what an agent keeps on its own disk, and nothing else (no
//! network, no metadata writes).
//!
//! [`segment`] is one file of record batches with its indexes; [`partition_log`] a partition's
//! chain of segments, written by one task and read by many; [`replica`] the follower's side
//! (replicas of segments another agent writes, and the fence that refuses a deposed writer);
//! [`trim`] which local segments to cut back to what metadata recorded (no I/O);
//! [`disk`] the fsync seam every durable write goes through.

pub mod disk;
pub mod partition_log;
pub mod replica;
pub mod segment;
pub mod trim;
