//! Silt's tiered storage: the archive format and the way to the bucket.
//!
//! This crate owns:
//! - the **archive format** ([`archive_format`]): one sealed segment as one plain Parquet
//!   object, its schema, footer metadata and format version;
//! - the **object layout** ([`object_layout`]): where an archive lives in the bucket,
//!   `{prefix}/topic={topic}/partition={partition}/{base:020}-{last:020}-t{topic_id}.parquet`;
//! - **object stores by URL** ([`store_url`]: `file://`, `s3://`, `memory://`) and the
//!   wrappers that add behaviour to any store: [`RetryingObjectStore`],
//!   [`InstrumentedObjectStore`], [`DurableLocalStore`](durable_local_store::DurableLocalStore)
//!   (fsyncs a `file://` store's puts), and [`FaultInjectingObjectStore`] for tests, plus the
//!   [`conformance`] suite every backend must pass;
//! - the **topic descriptions** ([`topic_descriptor`]): each topic's id, partition count and
//!   configs under `{prefix}/_silt/topics/`, so that a rebuild from the bucket restores them;
//! - the **read router** [`locate`](locate::locate): which tier holds an offset, from the
//!   segment chain in metadata (pure, no I/O);
//! - the **cold reader** ([`ColdReader`]): reads archived records through a foyer hybrid
//!   cache, fetching only the row groups it needs, with its own bounded concurrency, and
//!   decoding the next row groups ahead of sequential reads (`readahead.rs`, bounded in bytes).
//!
//! It never decides what to archive or when to delete it: that is the compactor's job
//! (`silt-compactor`), which calls [`encode_archive`] and [`read_archive_meta`] here and commits
//! the mapping in metadata. Agents call [`locate`](locate::locate) and [`ColdReader`].
//! It talks to object storage only; it reads metadata's types (`silt-metadata`) but never the
//! metadata service, and the record type of `silt-record`.

#![cfg_attr(test, allow(clippy::unwrap_used, reason = "tests may unwrap"))]

pub mod archive_format;
pub mod cold_reader;
pub mod conformance;
pub mod durable_local_store;
mod error;
pub mod fault_injecting_object_store;
pub mod instrumented_object_store;
pub mod locate;
pub mod object_layout;
mod readahead;
pub mod retrying_object_store;
pub mod store_url;
pub mod topic_descriptor;

pub use archive_format::{
    archive_meta_from_parquet, decode_records, encode_archive, read_archive_meta, ArchiveMeta,
    ArchiveWriterOptions, FORMAT_VERSION,
};
pub use cold_reader::{ColdReader, ColdReaderOptions, ColdReaderStats};
pub use error::TieringError;
pub use fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore, FaultKind};
pub use instrumented_object_store::{
    InstrumentedObjectStore, ObjectOp, ObjectStoreStats, ObjectStoreStatsSnapshot,
};
pub use locate::{earliest_offset, locate, locate_time, Location};
pub use object_layout::{object_key, parse_object_key, ObjectName};
pub use retrying_object_store::{is_retryable, RetryConfig, RetryingObjectStore};
pub use store_url::{object_store_from_url, ObjectStoreUrl};
