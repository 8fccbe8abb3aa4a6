//! The Silt compactor: turns sealed segments into Parquet objects in the bucket.
//!
//! Owns the archive pipeline of every sealed segment — read it from a replica, write Parquet in
//! the archive format, upload it with a conditional create, read the footer back and verify it,
//! then commit `Archived` in metadata — and retention of archived data (`retention.ms`: the
//! metadata entry goes first, then the object). Only after the commit may agents drop their
//! local copies; the compactor never deletes a local replica itself.
//!
//! It never serves clients. It talks to metadata, to a replica through [`SegmentSource`] and to
//! the bucket through `object_store`.

pub mod compactor;
pub mod error;
pub mod metrics;
pub mod segment_source;

pub use compactor::{Compactor, CompactorConfig};
pub use error::CompactorError;
pub use segment_source::SegmentSource;
