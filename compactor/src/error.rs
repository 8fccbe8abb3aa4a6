//! Compactor errors.

use silt_metadata::MetadataError;
use silt_tiering::TieringError;

/// Why archiving a segment failed. Every failure leaves the segment sealed and its replicas in
/// place; the next round tries again.
#[derive(Debug, thiserror::Error)]
pub enum CompactorError {
    /// The replica could not provide the segment.
    #[error("reading segment {base_offset} of {topic}/{partition} from a replica: {reason}")]
    Source {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Segment base offset.
        base_offset: u64,
        /// What went wrong.
        reason: String,
    },
    /// The replica's records do not match what metadata says the segment holds.
    #[error("segment {base_offset} of {topic}/{partition} does not match metadata: {reason}")]
    Mismatch {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Segment base offset.
        base_offset: u64,
        /// What differs.
        reason: String,
    },
    /// Encoding, uploading or verifying the object failed.
    #[error(transparent)]
    Tiering(#[from] TieringError),
    /// The object store failed.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// Metadata refused or failed the commit.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// A background task panicked.
    #[error("a compactor task failed: {0}")]
    Task(String),
}
