//! The codec every Silt component shares.
//!
//! This crate owns the formats that cross component boundaries:
//!
//! - the on-disk and on-wire **batch format**, Kafka's RecordBatch v2
//!   (magic 2, uncompressed): [`BatchBuilder`] / [`encode_batch`] write it,
//!   [`RecordBatch::parse`] validates it completely (header, CRC-32C and every
//!   record), and [`set_base_offset`], [`set_partition_leader_epoch`],
//!   [`peek_batch_len`] and [`peek_base_offset`] let the log writer and
//!   segment recovery work on raw bytes; [`encode_records`] and
//!   [`split_batches`] carry stored records to readers as batches laid end to end;
//! - the zigzag [`varint`] encoding the format uses;
//! - **ids**: [`MessageId`] (`topic/partition/offset`) and topic-name rules
//!   ([`validate_topic_name`]);
//! - the **partitioner**: Kafka's [`murmur2`] and [`partition_for_key`], so a
//!   key maps to the same partition as with Kafka's default partitioner.
//!
//! It is pure: it never does I/O and never spawns. Parsing never panics,
//! whatever the input: malformed bytes become a [`RecordError`].

mod batch_builder;
mod error;
mod message_id;
mod partitioner;
mod read_limit;
mod record;
mod record_batch;
mod topic_name;
pub mod varint;

pub use batch_builder::{encode_batch, encode_records, BatchBuilder};
pub use error::RecordError;
pub use message_id::{MessageId, MessageIdError};
pub use partitioner::{murmur2, partition_for_key};
pub use read_limit::ReadLimit;
pub use record::{Header, NewRecord, Record};
pub use record_batch::{
    peek_base_offset, peek_batch_len, peek_last_offset, set_base_offset, set_partition_leader_epoch,
    split_batches, RecordBatch, Records, BATCH_HEADER_BYTES, LOG_OVERHEAD, MAGIC, MAX_BATCH_BYTES,
};
pub use topic_name::{validate_topic_name, TopicNameError, MAX_TOPIC_NAME_LEN};
