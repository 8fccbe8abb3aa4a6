//! Encoding records into a RecordBatch v2.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::RecordError;
use crate::record::NewRecord;
use crate::record_batch::{ATTRIBUTES_AT, BATCH_HEADER_BYTES, CRC_AT, LOG_OVERHEAD, MAGIC, MAX_BATCH_BYTES};
use crate::varint;

/// Accumulates [`NewRecord`]s and encodes them as one uncompressed batch.
///
/// The built batch has base offset 0, partition leader epoch -1, attributes 0
/// (no compression, CreateTime, not transactional), producer id, epoch and
/// base sequence -1, the first record's timestamp as base timestamp, the
/// largest record timestamp as max timestamp, offset deltas `0..n` and a
/// valid CRC; this is what a non-idempotent Kafka producer sends.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    records: Vec<NewRecord>,
    encoded_len: usize,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self { records: Vec::new(), encoded_len: BATCH_HEADER_BYTES }
    }

    /// Adds a record; it gets the next offset delta.
    pub fn push(&mut self, record: NewRecord) {
        self.encoded_len = self.encoded_len_with(&record);
        self.records.push(record);
    }

    /// Number of records pushed so far.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record has been pushed yet.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Size in bytes of the batch [`build`](Self::build) would produce now,
    /// header included ([`BATCH_HEADER_BYTES`] for an empty builder, although
    /// building an empty batch fails).
    pub fn encoded_len(&self) -> usize {
        self.encoded_len
    }

    /// Size in bytes the batch would have after pushing `record`; use it to
    /// cap a batch by size before adding to it.
    pub fn encoded_len_with(&self, record: &NewRecord) -> usize {
        let base_timestamp = self.records.first().map_or(record.timestamp_ms, |first| first.timestamp_ms);
        let size = record_size(record, record.timestamp_ms.wrapping_sub(base_timestamp), self.records.len());
        self.encoded_len.saturating_add(size.total)
    }

    /// Encodes the batch.
    ///
    /// # Errors
    ///
    /// [`RecordError::EmptyBatch`] if no record was pushed, and
    /// [`RecordError::BatchTooLarge`] if the batch would exceed
    /// [`MAX_BATCH_BYTES`].
    pub fn build(self) -> Result<Bytes, RecordError> {
        encode_batch(&self.records)
    }
}

/// Encodes `records` as one batch, exactly as [`BatchBuilder::build`] does.
///
/// # Errors
///
/// [`RecordError::EmptyBatch`] if `records` is empty, and
/// [`RecordError::BatchTooLarge`] if the batch would exceed
/// [`MAX_BATCH_BYTES`].
pub fn encode_batch(records: &[NewRecord]) -> Result<Bytes, RecordError> {
    let first = records.first().ok_or(RecordError::EmptyBatch)?;
    let base_timestamp = first.timestamp_ms;
    let max_timestamp = records.iter().map(|r| r.timestamp_ms).max().unwrap_or(base_timestamp);

    let sizes: Vec<RecordSize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| record_size(r, r.timestamp_ms.wrapping_sub(base_timestamp), i))
        .collect();
    let total = sizes.iter().fold(BATCH_HEADER_BYTES, |acc, s| acc.saturating_add(s.total));
    let too_large = RecordError::BatchTooLarge { size: total, max: MAX_BATCH_BYTES };
    if total > MAX_BATCH_BYTES {
        return Err(too_large);
    }
    // Every length below is at most `batch_length`, so every conversion to
    // i32 succeeds once this one has.
    let batch_length = i32::try_from(total - LOG_OVERHEAD).map_err(|_| too_large.clone())?;
    let count = i32::try_from(records.len()).map_err(|_| too_large)?;

    let mut buf = BytesMut::with_capacity(total);
    buf.put_i64(0); // baseOffset
    buf.put_i32(batch_length);
    buf.put_i32(-1); // partitionLeaderEpoch
    buf.put_i8(MAGIC);
    buf.put_u32(0); // crc, filled in below
    buf.put_i16(0); // attributes
    buf.put_i32(count - 1); // lastOffsetDelta
    buf.put_i64(base_timestamp);
    buf.put_i64(max_timestamp);
    buf.put_i64(-1); // producerId
    buf.put_i16(-1); // producerEpoch
    buf.put_i32(-1); // baseSequence
    buf.put_i32(count);

    for ((offset_delta, record), size) in records.iter().enumerate().zip(&sizes) {
        put_len(&mut buf, size.body);
        buf.put_i8(0); // record attributes, unused
        varint::put_varlong(&mut buf, record.timestamp_ms.wrapping_sub(base_timestamp));
        put_len(&mut buf, offset_delta);
        put_nullable(&mut buf, record.key.as_deref());
        put_nullable(&mut buf, record.value.as_deref());
        put_len(&mut buf, record.headers.len());
        for header in &record.headers {
            put_len(&mut buf, header.key.len());
            buf.put_slice(header.key.as_bytes());
            put_nullable(&mut buf, header.value.as_deref());
        }
    }
    debug_assert_eq!(buf.len(), total, "record size computation is off");

    let crc = crc32c::crc32c(&buf[ATTRIBUTES_AT..]);
    buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(buf.freeze())
}

/// Encoded size of one record.
#[derive(Debug, Clone, Copy)]
struct RecordSize {
    /// Bytes after the record's length prefix.
    body: usize,
    /// Bytes including the length prefix.
    total: usize,
}

/// Computes a record's encoded size without overflowing, whatever the input;
/// sizes that cannot be encoded come out larger than [`MAX_BATCH_BYTES`].
fn record_size(record: &NewRecord, timestamp_delta: i64, offset_delta: usize) -> RecordSize {
    let mut body = 1 // attributes
        + varint::varlong_len(timestamp_delta)
        + len_prefix_size(offset_delta);
    body = body
        .saturating_add(nullable_size(record.key.as_deref()))
        .saturating_add(nullable_size(record.value.as_deref()))
        .saturating_add(len_prefix_size(record.headers.len()));
    for header in &record.headers {
        body = body
            .saturating_add(len_prefix_size(header.key.len()))
            .saturating_add(header.key.len())
            .saturating_add(nullable_size(header.value.as_deref()));
    }
    RecordSize { body, total: body.saturating_add(len_prefix_size(body)) }
}

fn len_prefix_size(len: usize) -> usize {
    varint::varlong_len(i64::try_from(len).unwrap_or(i64::MAX))
}

fn nullable_size(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => varint::varint_len(-1),
        Some(b) => len_prefix_size(b.len()).saturating_add(b.len()),
    }
}

/// Writes a length or count as a varint. Only called once the whole batch is
/// known to fit in [`MAX_BATCH_BYTES`], so `len` fits in an `i32`; for such
/// values varint and varlong encodings are identical, and writing the varlong
/// keeps this total without a fallible conversion.
fn put_len(buf: &mut BytesMut, len: usize) {
    varint::put_varlong(buf, i64::try_from(len).unwrap_or(i64::MAX));
}

fn put_nullable(buf: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        None => varint::put_varint(buf, -1),
        Some(b) => {
            put_len(buf, b.len());
            buf.put_slice(b);
        }
    }
}
