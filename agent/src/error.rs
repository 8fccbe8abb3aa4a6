//! Errors of the agent: storage errors inside, and the stable API error at the edge (its HTTP
//! status is the API's business: `crate::api`).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use silt_metadata::MetadataError;

/// Errors of the local segment store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// Which file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A read failed.
    #[error("reading the log: {0}")]
    Read(io::Error),
    /// fsync failed. What it was to cover is cut off the file (see [`crate::log::disk`]); the log is
    /// opened again before it takes writes.
    #[error("fsync of {path} failed: {source}; what it was to make durable is dropped")]
    FsyncFailed {
        /// Which file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An fsync failed in this directory and what it may have lost could not be cut off.
    #[error("an fsync in {dir} failed and the data it may have lost could not be cut off: this agent opens no log there again until it restarts")]
    DiskDistrusted {
        /// The partition's directory.
        dir: PathBuf,
    },
    /// Recovery found damage it cannot repair by truncating a torn tail.
    #[error("{path} is corrupt at byte {position}: {reason}")]
    Corrupt {
        /// Which file.
        path: PathBuf,
        /// Byte position.
        position: u64,
        /// What was wrong.
        reason: String,
    },
    /// A read hit a batch that fails its checks; it is never served.
    #[error("the batch at byte {position} of the segment at offset {base_offset} is corrupt ({reason}); it is not served")]
    CorruptRead {
        /// The segment's base offset.
        base_offset: u64,
        /// Byte position.
        position: u64,
        /// What was wrong.
        reason: String,
    },
    /// The offset is no longer (or not yet) on this agent's disk.
    #[error("offset {offset} is out of range: this partition holds offsets {log_start} to {high_watermark} locally")]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// First local offset.
        log_start: u64,
        /// End of the log.
        high_watermark: u64,
    },
    /// A read of the page cache only would have waited for the disk; it is done again on the
    /// blocking pool.
    #[error("the read needs the disk")]
    NotCached,
    /// The partition stopped accepting writes after a fatal error.
    #[error("partition is failed and accepts no writes: {0}")]
    Failed(String),
    /// The partition is shutting down.
    #[error("the partition is shutting down")]
    ShuttingDown,
    /// A replica refused an append from a writer of an older epoch.
    #[error("fenced: this replica of {topic}/{partition} accepts epoch {fence} or newer, not {epoch}")]
    Fenced {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The sender's epoch.
        epoch: u64,
        /// The newest epoch this replica has seen.
        fence: u64,
    },
    /// A replica does not line up with what a writer sends it.
    #[error("replica diverged: {0}")]
    Diverged(String),
    /// Fewer than the write quorum of replicas answered.
    #[error("not enough replicas: {0}")]
    NotEnoughReplicas(String),
    /// The metadata service refused or failed a change the log depends on.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

impl StoreError {
    pub(crate) fn io(path: &Path, op: &'static str, source: io::Error) -> Self {
        StoreError::Io { op, path: path.to_path_buf(), source }
    }
    pub(crate) fn io_read(source: io::Error) -> Self {
        StoreError::Read(source)
    }
}

/// The stable, machine-readable code of an [`ApiError`], written as snake_case on the wire
/// (`unknown_topic`, `message_too_large`, ...): clients branch on it, and an error another
/// agent answered keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Stored data failed its checks; it is not served.
    CorruptData,
    /// An fsync of the partition's log failed on this agent (see [`crate::log::disk`]).
    DiskFailed,
    /// The request holds nothing to do.
    EmptyRequest,
    /// A newer writer of the partition took over.
    Fenced,
    /// The group exists with another mode.
    GroupModeMismatch,
    /// A fault of the agent, not of the request.
    Internal,
    /// An ack names a message that cannot be acknowledged.
    InvalidAck,
    /// An argument is out of its bounds.
    InvalidArgument,
    /// A topic config is unknown or out of its bounds.
    InvalidConfig,
    /// A message id does not parse.
    InvalidId,
    /// The body is not the JSON expected.
    InvalidJson,
    /// A `max` is out of its bounds.
    InvalidMax,
    /// A `max_bytes` is out of its bounds.
    InvalidMaxBytes,
    /// A message is malformed.
    InvalidMessage,
    /// The query string does not parse.
    InvalidQuery,
    /// A record batch does not parse or fails its checks.
    InvalidRecordBatch,
    /// A session timeout is out of its bounds.
    InvalidSessionTimeout,
    /// A timeout is out of its bounds.
    InvalidTimeout,
    /// A topic name is not allowed.
    InvalidTopicName,
    /// A message is larger than the topic allows.
    MessageTooLarge,
    /// The message is not in flight to this group.
    NotDelivered,
    /// No such route or object.
    NotFound,
    /// Another agent writes the partition.
    NotWriter,
    /// The offset is not held here.
    OffsetOutOfRange,
    /// A replica holds other records than the writer sends.
    ReplicaDiverged,
    /// The local store failed.
    StorageError,
    /// More messages than one request may carry.
    TooManyMessages,
    /// A topic of that name exists.
    TopicExists,
    /// Try again later.
    Unavailable,
    /// No such group.
    UnknownGroup,
    /// No such partition.
    UnknownPartition,
    /// No such topic.
    UnknownTopic,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 32] = [
        ErrorCode::CorruptData,
        ErrorCode::DiskFailed,
        ErrorCode::EmptyRequest,
        ErrorCode::Fenced,
        ErrorCode::GroupModeMismatch,
        ErrorCode::Internal,
        ErrorCode::InvalidAck,
        ErrorCode::InvalidArgument,
        ErrorCode::InvalidConfig,
        ErrorCode::InvalidId,
        ErrorCode::InvalidJson,
        ErrorCode::InvalidMax,
        ErrorCode::InvalidMaxBytes,
        ErrorCode::InvalidMessage,
        ErrorCode::InvalidQuery,
        ErrorCode::InvalidRecordBatch,
        ErrorCode::InvalidSessionTimeout,
        ErrorCode::InvalidTimeout,
        ErrorCode::InvalidTopicName,
        ErrorCode::MessageTooLarge,
        ErrorCode::NotDelivered,
        ErrorCode::NotFound,
        ErrorCode::NotWriter,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::ReplicaDiverged,
        ErrorCode::StorageError,
        ErrorCode::TooManyMessages,
        ErrorCode::TopicExists,
        ErrorCode::Unavailable,
        ErrorCode::UnknownGroup,
        ErrorCode::UnknownPartition,
        ErrorCode::UnknownTopic,
    ];

    /// The code as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::CorruptData => "corrupt_data",
            ErrorCode::DiskFailed => "disk_failed",
            ErrorCode::EmptyRequest => "empty_request",
            ErrorCode::Fenced => "fenced",
            ErrorCode::GroupModeMismatch => "group_mode_mismatch",
            ErrorCode::Internal => "internal",
            ErrorCode::InvalidAck => "invalid_ack",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::InvalidConfig => "invalid_config",
            ErrorCode::InvalidId => "invalid_id",
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidMax => "invalid_max",
            ErrorCode::InvalidMaxBytes => "invalid_max_bytes",
            ErrorCode::InvalidMessage => "invalid_message",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::InvalidRecordBatch => "invalid_record_batch",
            ErrorCode::InvalidSessionTimeout => "invalid_session_timeout",
            ErrorCode::InvalidTimeout => "invalid_timeout",
            ErrorCode::InvalidTopicName => "invalid_topic_name",
            ErrorCode::MessageTooLarge => "message_too_large",
            ErrorCode::NotDelivered => "not_delivered",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NotWriter => "not_writer",
            ErrorCode::OffsetOutOfRange => "offset_out_of_range",
            ErrorCode::ReplicaDiverged => "replica_diverged",
            ErrorCode::StorageError => "storage_error",
            ErrorCode::TooManyMessages => "too_many_messages",
            ErrorCode::TopicExists => "topic_exists",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::UnknownGroup => "unknown_group",
            ErrorCode::UnknownPartition => "unknown_partition",
            ErrorCode::UnknownTopic => "unknown_topic",
        }
    }

    /// The code written `code` on the wire, if this agent knows it.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        serde_json::from_value(serde_json::Value::String(code.to_string())).ok()
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error a client sees: a stable code and a sentence to act on. The API answers it with
/// the HTTP status of its code (`crate::api`).
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// Stable, machine-readable code.
    pub code: ErrorCode,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// An error with its code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
    /// Try again later.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }
    /// A fault of this agent's, not of the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

impl From<MetadataError> for ApiError {
    fn from(e: MetadataError) -> Self {
        let msg = e.to_string();
        match e {
            MetadataError::UnknownTopic(_) => ApiError::new(ErrorCode::UnknownTopic, msg),
            MetadataError::UnknownPartition { .. } => ApiError::new(ErrorCode::UnknownPartition, msg),
            MetadataError::UnknownGroup(_) => ApiError::new(ErrorCode::UnknownGroup, msg),
            MetadataError::TopicExists(_) => ApiError::new(ErrorCode::TopicExists, msg),
            MetadataError::GroupModeMismatch { .. } => ApiError::new(ErrorCode::GroupModeMismatch, msg),
            MetadataError::InvalidConfig(_) => ApiError::new(ErrorCode::InvalidConfig, msg),
            MetadataError::InvalidArgument(_) => ApiError::new(ErrorCode::InvalidArgument, msg),
            MetadataError::Fenced { .. } => {
                ApiError::unavailable(format!("{msg}; the partition changed writer, retry"))
            }
            MetadataError::Unavailable(_)
            | MetadataError::UnknownAgent { .. }
            | MetadataError::LeaseLapsed { .. } => ApiError::unavailable(msg),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Metadata(m) => m.into(),
            StoreError::CorruptRead { .. } => ApiError::new(ErrorCode::CorruptData, e.to_string()),
            // A failed partition (a writer restarted from disk, a replica closed under a request
            // or opened again after it diverged) is retried; only a disk operation that failed
            // is `storage_error`, which a writer takes for a failing disk.
            StoreError::ShuttingDown
            | StoreError::NotEnoughReplicas(_)
            | StoreError::NotCached
            | StoreError::Failed(_) => ApiError::unavailable(e.to_string()),
            StoreError::Fenced { .. } => ApiError::new(ErrorCode::Fenced, e.to_string()),
            StoreError::Diverged(_) => ApiError::new(ErrorCode::ReplicaDiverged, e.to_string()),
            StoreError::OutOfRange { .. } => ApiError::new(ErrorCode::OffsetOutOfRange, e.to_string()),
            StoreError::DiskDistrusted { .. } => ApiError::new(ErrorCode::DiskFailed, e.to_string()),
            other => ApiError::new(ErrorCode::StorageError, other.to_string()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_written_as_its_name_and_read_back() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let body = serde_json::to_value(ApiError::unavailable("m")).unwrap();
            assert_eq!(body["code"], "unavailable");
        }
        assert_eq!(ErrorCode::parse("from_a_newer_agent"), None);
    }

    #[test]
    fn only_a_failed_disk_operation_is_answered_as_a_storage_failure() {
        // A writer leaves out of its next segments a follower that answers `storage_error`, so
        // a replica closed under a request, or opened again after it diverged, is not one.
        let disk = [
            StoreError::io(Path::new("p"), "write", io::Error::other("EIO")),
            StoreError::io_read(io::Error::other("EIO")),
            StoreError::FsyncFailed { path: "p".into(), source: io::Error::other("EIO") },
        ];
        for e in disk {
            assert_eq!(ApiError::from(e).code, ErrorCode::StorageError);
        }
        let not_disk = [
            StoreError::Failed("the replica was closed; retry".into()),
            StoreError::Failed(
                "cannot start a segment at offset 640, past the start of the writer's new segment".into(),
            ),
        ];
        for e in not_disk {
            let api = ApiError::from(e);
            assert_eq!(api.code, ErrorCode::Unavailable, "{api}");
        }
    }
}
