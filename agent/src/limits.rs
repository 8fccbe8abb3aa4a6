//! Every bound the agent puts on what it is asked and what it holds, in one place, with the
//! rule of how much one read may return ([`ReadLimit`], from `silt-record`: the cold reader
//! follows it too).

use std::time::Duration;

pub use silt_record::ReadLimit;

use crate::error::{ApiError, ErrorCode};

/// Largest request body the API reads.
pub const REQUEST_BYTES_MAX: usize = 80 * 1024 * 1024;
/// Most messages in one produce request.
pub const PRODUCE_MESSAGES_MAX: usize = 100_000;
/// Most messages one poll may return.
pub const POLL_MAX: u32 = 10_000;
/// Longest a poll may wait.
pub const POLL_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// Most ids in one ack request.
pub const ACK_IDS_MAX: usize = 100_000;
/// Longest a group member may stay silent before it loses its partitions.
pub const SESSION_TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// Most messages of one partition that may be in flight for one group.
pub const IN_FLIGHT_MAX: usize = 10_000;
/// Most records one replay request returns.
pub const REPLAY_MAX: usize = 10_000;
/// Bytes of keys, values and headers one poll or replay page returns unless it asks otherwise.
pub const READ_BYTES_DEFAULT: usize = 8 * 1024 * 1024;
/// Most bytes of keys, values and headers one poll or replay page may ask for.
pub const READ_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most bytes of appends waiting for one partition's writer; producers wait beyond that.
pub const QUEUED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most bytes written between two fsyncs.
pub const GROUP_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Most appends answered by one fsync.
pub const GROUP_APPENDS_MAX: usize = 1024;
/// Most bytes one read of a replica's batches returns (recovery copies tails in such steps).
pub const REPLICA_READ_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Largest batch the store frames; anything claiming to be larger is corruption.
pub const BATCH_BYTES_MAX: usize = 64 * 1024 * 1024 + 1024;

/// [`READ_BYTES_DEFAULT`], for serde's `default =` of every request that takes `max_bytes`.
pub(crate) fn read_bytes_default() -> usize {
    READ_BYTES_DEFAULT
}

/// Refuses a `max_bytes` outside 1..=[`READ_BYTES_MAX`].
pub fn check_max_bytes(max_bytes: usize) -> Result<(), ApiError> {
    if max_bytes == 0 || max_bytes > READ_BYTES_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidMaxBytes,
            format!("max_bytes must be between 1 and {READ_BYTES_MAX}, got {max_bytes}"),
        ));
    }
    Ok(())
}
