//! The crate's error type.

use crate::retrying_object_store;

/// Everything that can go wrong in tiering: object store calls, archive encoding and decoding,
/// configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TieringError {
    /// An object store call failed (after the retries of any [`RetryingObjectStore`] in front
    /// of the store).
    ///
    /// [`RetryingObjectStore`]: crate::RetryingObjectStore
    #[error("object store {op} of '{path}' failed: {source}")]
    ObjectStore {
        /// The operation: `get`, `get_range`, `put`, `head`, ...
        op: &'static str,
        /// The object (or prefix) it was about.
        path: String,
        /// What the store said.
        #[source]
        source: object_store::Error,
    },
    /// Parquet could not encode or decode an archive.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow could not build or convert a record batch.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// An object is not a valid Silt archive, or disagrees with what it claims to hold.
    #[error("invalid archive: {0}")]
    InvalidArchive(String),
    /// An archive was written by a format version this build cannot read.
    #[error(
        "archive has format version '{found}', but this build of Silt reads only version {supported}; \
         upgrade Silt to read it"
    )]
    UnsupportedFormatVersion {
        /// The `silt.format_version` found in the footer.
        found: String,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The caller passed something inconsistent (records that do not match their metadata, a
    /// malformed object key, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An object store URL this crate cannot open.
    #[error("unsupported object store URL '{url}': {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused and what to use instead.
        reason: String,
    },
    /// The cold-read cache failed (for example a disk cache that cannot be opened), or a fetch
    /// shared with a concurrent reader failed.
    #[error("cold read cache: {0}")]
    Cache(String),
    /// Local I/O (creating directories for a `file://` store or the disk cache).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl TieringError {
    /// Wraps an object store error with the operation and the object it concerned.
    pub fn object_store(op: &'static str, path: impl ToString, source: object_store::Error) -> Self {
        TieringError::ObjectStore { op, path: path.to_string(), source }
    }

    /// Whether trying the same thing again later may succeed: transient object store errors
    /// (5xx, SlowDown, timeouts, connection resets) and failures of a fetch shared with another
    /// reader. Corrupt archives, missing objects and bad arguments are permanent.
    pub fn is_retryable(&self) -> bool {
        match self {
            TieringError::ObjectStore { source, .. } => retrying_object_store::is_retryable(source),
            TieringError::Cache(_) => true,
            TieringError::Parquet(_)
            | TieringError::Arrow(_)
            | TieringError::InvalidArchive(_)
            | TieringError::UnsupportedFormatVersion { .. }
            | TieringError::InvalidArgument(_)
            | TieringError::InvalidUrl { .. }
            | TieringError::Io(_) => false,
        }
    }

    /// Whether the object does not exist (for a cold read: retention deleted it after the
    /// caller looked it up; locate again).
    pub fn is_not_found(&self) -> bool {
        matches!(self, TieringError::ObjectStore { source: object_store::Error::NotFound { .. }, .. })
    }
}
