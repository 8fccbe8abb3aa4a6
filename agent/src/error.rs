//! Errors of the agent: storage errors inside, and the stable API error at the edge.

use std::io;
use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
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
    /// fsync failed. What it was to cover is cut off the file (see [`crate::disk`]); the log is
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

/// The error a client sees: an HTTP status, a stable code and a sentence to act on.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    #[serde(skip)]
    status: u16,
    /// Stable, machine-readable code (`unknown_topic`, `message_too_large`, ...).
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// An error with an explicit status.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status: status.as_u16(), code, message: message.into() }
    }
    /// 400 with a code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    /// 404 with a code.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }
    /// 503: try again later.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    /// 500: a fault of this agent's, not of the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<MetadataError> for ApiError {
    fn from(e: MetadataError) -> Self {
        let msg = e.to_string();
        match e {
            MetadataError::UnknownTopic(_) => ApiError::not_found("unknown_topic", msg),
            MetadataError::UnknownPartition { .. } => ApiError::not_found("unknown_partition", msg),
            MetadataError::UnknownGroup(_) => ApiError::not_found("unknown_group", msg),
            MetadataError::TopicExists(_) => ApiError::new(StatusCode::CONFLICT, "topic_exists", msg),
            MetadataError::GroupModeMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "group_mode_mismatch", msg)
            }
            MetadataError::InvalidConfig(_) => ApiError::bad_request("invalid_config", msg),
            MetadataError::InvalidArgument(_) => ApiError::bad_request("invalid_argument", msg),
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
            StoreError::CorruptRead { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data", e.to_string())
            }
            StoreError::ShuttingDown | StoreError::NotEnoughReplicas(_) | StoreError::NotCached => {
                ApiError::unavailable(e.to_string())
            }
            StoreError::Fenced { .. } => ApiError::new(StatusCode::CONFLICT, "fenced", e.to_string()),
            StoreError::Diverged(_) => ApiError::new(StatusCode::CONFLICT, "replica_diverged", e.to_string()),
            StoreError::OutOfRange { .. } => ApiError::bad_request("offset_out_of_range", e.to_string()),
            StoreError::DiskDistrusted { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "disk_failed", e.to_string())
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", other.to_string()),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a ApiError,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(ErrorBody { error: &self })).into_response()
    }
}
