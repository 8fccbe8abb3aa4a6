//! Kafka's RecordBatch v2 (magic 2), the format Silt stores on disk and sends
//! on the wire.
//!
//! Layout (all integers big-endian), as in
//! <https://kafka.apache.org/documentation/#recordbatch>:
//!
//! ```text
//! offset  size  field
//!      0     8  baseOffset
//!      8     4  batchLength            bytes after this field
//!     12     4  partitionLeaderEpoch
//!     16     1  magic                  always 2
//!     17     4  crc                    CRC-32C of bytes 21..end
//!     21     2  attributes             bits 0-2 compression, 3 timestamp type,
//!                                      4 transactional, 5 control
//!     23     4  lastOffsetDelta
//!     27     8  baseTimestamp
//!     35     8  maxTimestamp
//!     43     8  producerId
//!     51     2  producerEpoch
//!     53     4  baseSequence
//!     57     4  records count
//!     61        records
//! ```
//!
//! Each record is: length varint (bytes after it), attributes i8,
//! timestampDelta varlong, offsetDelta varint, keyLength varint (-1 = null)
//! and key, valueLength varint (-1 = null) and value, header count varint,
//! then per header keyLength varint and UTF-8 key, valueLength varint
//! (-1 = null) and value. Varints are zigzag-encoded (see [`crate::varint`]).
//!
//! `baseOffset` and `partitionLeaderEpoch` lie outside the CRC, so the log
//! writer can stamp them with [`set_base_offset`] and
//! [`set_partition_leader_epoch`] without recomputing it.
//!
//! This module reads batches ([`RecordBatch::parse`]) and works on raw batch
//! bytes; [`BatchBuilder`](crate::BatchBuilder) writes them.

use std::fmt;
use std::iter::FusedIterator;

use bytes::{Bytes, BytesMut};

use crate::error::RecordError;
use crate::record::{Header, Record};
use crate::varint;

/// Size of the fixed batch header, up to and including the records count.
pub const BATCH_HEADER_BYTES: usize = 61;

/// Size of the fields before the part `batchLength` counts: `baseOffset`
/// (8 bytes) and `batchLength` itself (4 bytes).
pub const LOG_OVERHEAD: usize = 12;

/// The only batch format version Silt reads and writes.
pub const MAGIC: i8 = 2;

/// The largest batch the format can describe: `batchLength` is an `i32`.
pub const MAX_BATCH_BYTES: usize = LOG_OVERHEAD + i32::MAX as usize;

/// Smallest `batchLength` of any batch: the header after [`LOG_OVERHEAD`].
const MIN_BATCH_LENGTH: usize = BATCH_HEADER_BYTES - LOG_OVERHEAD;

/// Smallest encoded record: a one-byte length, attributes, timestamp delta,
/// offset delta, key length, value length and header count.
const MIN_RECORD_BYTES: usize = 7;

/// Smallest encoded header: an empty key's length and a null value's length.
const MIN_HEADER_BYTES: usize = 2;

// Byte offsets of the header fields.
const BASE_OFFSET_AT: usize = 0;
const BATCH_LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
pub(crate) const CRC_AT: usize = 17;
/// The CRC covers everything from here to the end of the batch.
pub(crate) const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORDS_COUNT_AT: usize = 57;

const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

// ---------------------------------------------------------------------------
// In-place header rewrites and framing helpers
// ---------------------------------------------------------------------------

/// Overwrites the `baseOffset` field of the batch at the start of `batch`.
///
/// `baseOffset` lies outside the CRC, so the batch stays valid; the log
/// writer uses this to assign offsets to a batch a producer built with base
/// offset 0. Record offsets are relative, so this moves the whole batch.
///
/// # Panics
///
/// Panics if `batch` is shorter than 8 bytes or `base_offset` exceeds
/// `i64::MAX` (Kafka offsets are signed 64-bit).
pub fn set_base_offset(batch: &mut [u8], base_offset: u64) {
    assert!(i64::try_from(base_offset).is_ok(), "base offset {base_offset} exceeds the largest Kafka offset");
    batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Overwrites the `partitionLeaderEpoch` field of the batch at the start of
/// `batch`.
///
/// The field lies outside the CRC, so the batch stays valid; the log writer
/// uses this to stamp the epoch it writes under.
///
/// # Panics
///
/// Panics if `batch` is shorter than 16 bytes.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Total size ([`LOG_OVERHEAD`] + `batchLength`) of the batch starting at
/// `buf[0]`, for framing batches in a log file or a stream.
///
/// Returns `None` when fewer than [`LOG_OVERHEAD`] bytes are present or when
/// `batchLength` is smaller than any batch can be (negative or below the 49
/// bytes of header it counts), which means the bytes are not a batch. The
/// returned size may exceed `buf.len()`; nothing beyond the first 12 bytes is
/// checked.
pub fn peek_batch_len(buf: &[u8]) -> Option<usize> {
    let batch_length = i32::from_be_bytes(field(buf, BATCH_LENGTH_AT)?);
    let batch_length = usize::try_from(batch_length).ok()?;
    (batch_length >= MIN_BATCH_LENGTH).then(|| LOG_OVERHEAD + batch_length)
}

/// Splits batches laid end to end (as a segment file or a read response holds them) and
/// parses each completely.
///
/// # Errors
///
/// [`RecordError::Truncated`] if the bytes end inside a batch, [`RecordError::Corrupt`] if
/// a batch's length field is not one a batch can have, and whatever [`RecordBatch::parse`]
/// finds wrong with a batch.
pub fn split_batches(mut bytes: Bytes) -> Result<Vec<RecordBatch>, RecordError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = match peek_batch_len(&bytes) {
            Some(len) if len <= bytes.len() => len,
            Some(len) => return Err(RecordError::Truncated { needed: len, available: bytes.len() }),
            None if bytes.len() < LOG_OVERHEAD => {
                return Err(RecordError::Truncated { needed: LOG_OVERHEAD, available: bytes.len() })
            }
            None => return Err(RecordError::Corrupt("a batch length field is out of range".into())),
        };
        out.push(RecordBatch::parse(bytes.split_to(len))?);
    }
    Ok(out)
}

/// The `baseOffset` of the batch starting at `buf[0]`, or `None` if fewer
/// than 8 bytes are present or it is negative.
pub fn peek_base_offset(buf: &[u8]) -> Option<u64> {
    u64::try_from(i64::from_be_bytes(field(buf, BASE_OFFSET_AT)?)).ok()
}

/// The last offset (`baseOffset` + `lastOffsetDelta`) of the batch starting at `buf[0]`, or
/// `None` if fewer than 27 bytes are present or the fields are negative or overflow. Nothing
/// else is checked: a reader skipping batches it does not return uses it without the CRC.
pub fn peek_last_offset(buf: &[u8]) -> Option<u64> {
    let delta = u64::try_from(i32::from_be_bytes(field(buf, LAST_OFFSET_DELTA_AT)?)).ok()?;
    peek_base_offset(buf)?.checked_add(delta)
}

/// The `N` bytes at `at`, if `buf` holds them.
fn field<const N: usize>(buf: &[u8], at: usize) -> Option<[u8; N]> {
    buf.get(at..at.checked_add(N)?)?.try_into().ok()
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// A complete, validated RecordBatch v2.
///
/// [`parse`](Self::parse) checks the header, the CRC and every record, so
/// once a `RecordBatch` exists all its accessors and its record iterator are
/// infallible. The bytes are kept as they arrived; [`records`](Self::records)
/// hands out keys and values as zero-copy slices of them.
#[derive(Clone, PartialEq, Eq)]
pub struct RecordBatch {
    bytes: Bytes,
}

impl RecordBatch {
    /// Validates `bytes` as exactly one uncompressed batch.
    ///
    /// Checks, in order: the buffer holds at least [`LOG_OVERHEAD`] bytes and
    /// exactly `12 + batchLength` bytes (at least a full header); magic is 2;
    /// the CRC-32C matches; the batch is not compressed; the base offset is
    /// not negative; the record count is at least 1 and no more than the
    /// bytes could hold; `lastOffsetDelta` is `count - 1` and the last offset
    /// fits in an `i64`; and each record decodes, with offset deltas `0, 1,
    /// ...` in order, lengths that match its contents, no negative lengths
    /// other than -1 for null keys and values, UTF-8 header keys, and no
    /// bytes left over after the last record.
    ///
    /// Record attributes are ignored (Kafka leaves them unused), as is the
    /// header's `maxTimestamp` beyond being reported. Control and
    /// transactional batches are accepted; see
    /// [`is_control`](Self::is_control). Batches left behind by Kafka's own
    /// log compaction (empty, or with gaps between offset deltas) are
    /// rejected: Silt never writes them.
    ///
    /// # Errors
    ///
    /// [`RecordError::Truncated`] if the buffer is shorter than the batch,
    /// [`RecordError::TrailingBytes`] if longer, and the variant describing
    /// the first problem found otherwise.
    pub fn parse(bytes: Bytes) -> Result<Self, RecordError> {
        let available = bytes.len();
        let batch_length = field(&bytes, BATCH_LENGTH_AT)
            .map(i32::from_be_bytes)
            .ok_or(RecordError::Truncated { needed: LOG_OVERHEAD, available })?;
        let batch_length =
            usize::try_from(batch_length).ok().filter(|&len| len >= MIN_BATCH_LENGTH).ok_or_else(|| {
                RecordError::Corrupt(format!(
                    "batch length {batch_length} is smaller than the {MIN_BATCH_LENGTH}-byte \
                     minimum"
                ))
            })?;
        let batch_len = LOG_OVERHEAD + batch_length;
        if available < batch_len {
            return Err(RecordError::Truncated { needed: batch_len, available });
        }
        if available > batch_len {
            return Err(RecordError::TrailingBytes { batch_len, buffer_len: available });
        }

        let batch = Self { bytes };
        let magic = batch.bytes[MAGIC_AT] as i8;
        if magic != MAGIC {
            return Err(RecordError::BadMagic(magic));
        }
        let stored = batch.crc();
        let computed = crc32c::crc32c(&batch.bytes[ATTRIBUTES_AT..]);
        if stored != computed {
            return Err(RecordError::CrcMismatch { stored, computed });
        }
        let codec = (batch.attributes() & COMPRESSION_MASK) as u8;
        if codec != 0 {
            return Err(RecordError::UnsupportedCompression(codec));
        }
        let base_offset = batch.raw_base_offset();
        if base_offset < 0 {
            return Err(RecordError::Corrupt(format!("negative base offset {base_offset}")));
        }

        let count = batch.raw_records_count();
        if count < 0 {
            return Err(RecordError::Corrupt(format!("negative record count {count}")));
        }
        if count == 0 {
            return Err(RecordError::EmptyBatch);
        }
        let records_bytes = batch_len - BATCH_HEADER_BYTES;
        if count as usize > records_bytes / MIN_RECORD_BYTES {
            return Err(RecordError::Corrupt(format!(
                "record count {count} is more than the {records_bytes} bytes of records can hold"
            )));
        }
        let last_offset_delta = batch.last_offset_delta();
        if last_offset_delta != count - 1 {
            return Err(RecordError::Corrupt(format!(
                "last offset delta {last_offset_delta} does not match record count {count}"
            )));
        }
        if base_offset.checked_add(i64::from(last_offset_delta)).is_none() {
            return Err(RecordError::Corrupt(format!(
                "last offset overflows: base offset {base_offset} plus delta {last_offset_delta}"
            )));
        }

        let context = batch.context();
        let mut cursor = Cursor::new(&batch.bytes, BATCH_HEADER_BYTES, batch_len);
        for index in 0..count as u32 {
            decode_record(&mut cursor, index, &context)?;
        }
        if cursor.remaining() != 0 {
            return Err(RecordError::Corrupt(format!(
                "{} unexpected bytes after the last record",
                cursor.remaining()
            )));
        }
        Ok(batch)
    }

    /// Offset of the first record. Never negative: `parse` rejects that.
    pub fn base_offset(&self) -> u64 {
        // Validated non-negative in `parse`.
        self.raw_base_offset() as u64
    }

    /// Offset of the last record: base offset + `lastOffsetDelta`.
    pub fn last_offset(&self) -> u64 {
        // `parse` checked that this neither overflows nor is negative.
        self.base_offset() + self.last_offset_delta() as u64
    }

    /// The offset after the last record, where the next batch starts.
    pub fn next_offset(&self) -> u64 {
        self.last_offset() + 1
    }

    /// Number of records; at least 1.
    pub fn record_count(&self) -> u32 {
        // Validated positive in `parse`.
        self.raw_records_count() as u32
    }

    /// `lastOffsetDelta`: always `record_count() - 1`.
    pub fn last_offset_delta(&self) -> i32 {
        i32::from_be_bytes(self.fixed(LAST_OFFSET_DELTA_AT))
    }

    /// Epoch of the leader that wrote the batch; -1 when unset. Outside the
    /// CRC.
    pub fn partition_leader_epoch(&self) -> i32 {
        i32::from_be_bytes(self.fixed(PARTITION_LEADER_EPOCH_AT))
    }

    /// The stored CRC-32C (already verified).
    pub fn crc(&self) -> u32 {
        u32::from_be_bytes(self.fixed(CRC_AT))
    }

    /// The raw attributes field. Compression bits are always 0.
    pub fn attributes(&self) -> i16 {
        i16::from_be_bytes(self.fixed(ATTRIBUTES_AT))
    }

    /// Whether timestamps are log-append time (attributes bit 3) rather than
    /// create time; if so every record's timestamp is [`max_timestamp`](Self::max_timestamp).
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & TIMESTAMP_TYPE_BIT != 0
    }

    /// Whether the batch is part of a transaction (attributes bit 4).
    pub fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_BIT != 0
    }

    /// Whether this is a control batch of transaction markers (attributes
    /// bit 5) rather than user data.
    pub fn is_control(&self) -> bool {
        self.attributes() & CONTROL_BIT != 0
    }

    /// Timestamp of the first record (ms since the Unix epoch).
    pub fn base_timestamp(&self) -> i64 {
        i64::from_be_bytes(self.fixed(BASE_TIMESTAMP_AT))
    }

    /// The batch's `maxTimestamp` as stored: the largest record timestamp
    /// for create time, the append time for log-append time.
    pub fn max_timestamp(&self) -> i64 {
        i64::from_be_bytes(self.fixed(MAX_TIMESTAMP_AT))
    }

    /// Idempotent producer id; -1 when none.
    pub fn producer_id(&self) -> i64 {
        i64::from_be_bytes(self.fixed(PRODUCER_ID_AT))
    }

    /// Idempotent producer epoch; -1 when none.
    pub fn producer_epoch(&self) -> i16 {
        i16::from_be_bytes(self.fixed(PRODUCER_EPOCH_AT))
    }

    /// Sequence number of the first record; -1 when none.
    pub fn base_sequence(&self) -> i32 {
        i32::from_be_bytes(self.fixed(BASE_SEQUENCE_AT))
    }

    /// Total size in bytes, [`LOG_OVERHEAD`] included.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The batch's bytes, exactly as parsed.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The batch's bytes, exactly as parsed.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The same batch with its base offset and partition leader epoch rewritten, as a
    /// partition writer stamps them. Both fields lie outside the CRC, so the batch stays
    /// valid without being checked again. Copies only when the bytes are shared.
    ///
    /// Panics if the batch's last offset would exceed `i64::MAX`.
    pub fn with_offsets(self, base_offset: u64, partition_leader_epoch: i32) -> RecordBatch {
        let mut bytes = match self.bytes.try_into_mut() {
            Ok(m) => m,
            Err(shared) => BytesMut::from(&shared[..]),
        };
        set_base_offset(&mut bytes, base_offset);
        set_partition_leader_epoch(&mut bytes, partition_leader_epoch);
        RecordBatch { bytes: bytes.freeze() }
    }

    /// The records, in offset order.
    pub fn records(&self) -> Records<'_> {
        Records {
            bytes: &self.bytes,
            context: self.context(),
            position: BATCH_HEADER_BYTES,
            next_index: 0,
            count: self.record_count(),
        }
    }

    fn raw_base_offset(&self) -> i64 {
        i64::from_be_bytes(self.fixed(BASE_OFFSET_AT))
    }

    fn raw_records_count(&self) -> i32 {
        i32::from_be_bytes(self.fixed(RECORDS_COUNT_AT))
    }

    fn context(&self) -> BatchContext {
        BatchContext {
            base_offset: self.raw_base_offset() as u64,
            base_timestamp: self.base_timestamp(),
            log_append_time: self.is_log_append_time().then(|| self.max_timestamp()),
        }
    }

    /// The `N` header bytes at `at`. Only called for header fields, which
    /// `parse` guarantees are present.
    fn fixed<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0; N];
        out.copy_from_slice(&self.bytes[at..at + N]);
        out
    }
}

impl fmt::Debug for RecordBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordBatch")
            .field("base_offset", &self.base_offset())
            .field("record_count", &self.record_count())
            .field("partition_leader_epoch", &self.partition_leader_epoch())
            .field("base_timestamp", &self.base_timestamp())
            .field("max_timestamp", &self.max_timestamp())
            .field("attributes", &self.attributes())
            .field("len_bytes", &self.len_bytes())
            .finish()
    }
}

impl AsRef<[u8]> for RecordBatch {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl<'a> IntoIterator for &'a RecordBatch {
    type Item = Record;
    type IntoIter = Records<'a>;

    fn into_iter(self) -> Records<'a> {
        self.records()
    }
}

/// Iterator over the records of a [`RecordBatch`], from
/// [`RecordBatch::records`].
///
/// Infallible: the batch was fully decoded once when it was parsed.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    bytes: &'a Bytes,
    context: BatchContext,
    position: usize,
    next_index: u32,
    count: u32,
}

impl Iterator for Records<'_> {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        if self.next_index >= self.count {
            return None;
        }
        let mut cursor = Cursor::new(self.bytes, self.position, self.bytes.len());
        match decode_record(&mut cursor, self.next_index, &self.context) {
            Ok(record) => {
                self.position = cursor.position;
                self.next_index += 1;
                Some(record)
            }
            Err(err) => {
                // Unreachable: `RecordBatch::parse` decoded these very bytes.
                if cfg!(debug_assertions) {
                    panic!("record of a validated batch failed to decode: {err}");
                }
                self.next_index = self.count;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.count - self.next_index) as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Records<'_> {}

impl FusedIterator for Records<'_> {}

/// Batch-level values every record's decoding needs.
#[derive(Debug, Clone, Copy)]
struct BatchContext {
    base_offset: u64,
    base_timestamp: i64,
    /// Kafka reports the batch's max timestamp for every record of a
    /// log-append-time batch.
    log_append_time: Option<i64>,
}

/// Bounds-checked reader over `bytes[position..end]`.
struct Cursor<'a> {
    bytes: &'a Bytes,
    position: usize,
    end: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a Bytes, position: usize, end: usize) -> Self {
        Self { bytes, position, end }
    }

    fn remaining(&self) -> usize {
        self.end - self.position
    }

    fn rest(&self) -> &[u8] {
        &self.bytes[self.position..self.end]
    }

    fn i8(&mut self, index: u32, what: &str) -> Result<i8, RecordError> {
        let byte = *self.rest().first().ok_or_else(|| corrupt(index, format!("{what} is missing")))?;
        self.position += 1;
        Ok(byte as i8)
    }

    fn varint(&mut self, index: u32, what: &str) -> Result<i32, RecordError> {
        let (value, len) =
            varint::get_varint(self.rest()).map_err(|e| corrupt(index, format!("{what}: {e}")))?;
        self.position += len;
        Ok(value)
    }

    fn varlong(&mut self, index: u32, what: &str) -> Result<i64, RecordError> {
        let (value, len) =
            varint::get_varlong(self.rest()).map_err(|e| corrupt(index, format!("{what}: {e}")))?;
        self.position += len;
        Ok(value)
    }

    /// A non-negative length or count, checked against the bytes left given
    /// that each counted item takes at least `min_item_bytes`.
    fn count(&mut self, index: u32, what: &str, min_item_bytes: usize) -> Result<usize, RecordError> {
        let value = self.varint(index, what)?;
        let count =
            usize::try_from(value).map_err(|_| corrupt(index, format!("{what} {value} is negative")))?;
        if count > self.remaining() / min_item_bytes {
            return Err(corrupt(
                index,
                format!("{what} {count} is more than the {} remaining bytes can hold", self.remaining()),
            ));
        }
        Ok(count)
    }

    fn take(&mut self, len: usize) -> Bytes {
        let bytes = self.bytes.slice(self.position..self.position + len);
        self.position += len;
        bytes
    }

    /// A length-prefixed byte string where length -1 means null.
    fn nullable_bytes(&mut self, index: u32, what: &str) -> Result<Option<Bytes>, RecordError> {
        // The error context is formatted only on error: this runs for every key and value.
        let (len, read) =
            varint::get_varint(self.rest()).map_err(|e| corrupt(index, format!("{what} length: {e}")))?;
        self.position += read;
        if len == -1 {
            return Ok(None);
        }
        let len =
            usize::try_from(len).map_err(|_| corrupt(index, format!("{what} length {len} is invalid")))?;
        if len > self.remaining() {
            return Err(corrupt(
                index,
                format!("{what} length {len} exceeds the {} remaining bytes", self.remaining()),
            ));
        }
        Ok(Some(self.take(len)))
    }
}

fn corrupt(index: u32, message: String) -> RecordError {
    RecordError::Corrupt(format!("record {index}: {message}"))
}

/// Decodes the record at the cursor, which must be record number `index` of
/// its batch, and advances past it.
fn decode_record(batch: &mut Cursor<'_>, index: u32, context: &BatchContext) -> Result<Record, RecordError> {
    let body_len = batch.count(index, "length", 1)?;
    let body_start = batch.position;
    let mut cursor = Cursor::new(batch.bytes, body_start, body_start + body_len);

    let _attributes = cursor.i8(index, "attributes")?;
    let timestamp_delta = cursor.varlong(index, "timestamp delta")?;
    let offset_delta = cursor.varint(index, "offset delta")?;
    if i64::from(offset_delta) != i64::from(index) {
        return Err(corrupt(index, format!("offset delta is {offset_delta}, expected {index}")));
    }
    let key = cursor.nullable_bytes(index, "key")?;
    let value = cursor.nullable_bytes(index, "value")?;
    let header_count = cursor.count(index, "header count", MIN_HEADER_BYTES)?;
    let mut headers = Vec::with_capacity(header_count);
    for _ in 0..header_count {
        let key_len = cursor.count(index, "header key length", 1)?;
        let key_bytes = cursor.take(key_len);
        let key = std::str::from_utf8(&key_bytes)
            .map_err(|_| corrupt(index, "header key is not valid UTF-8".to_owned()))?
            .to_owned();
        let value = cursor.nullable_bytes(index, "header value")?;
        headers.push(Header { key, value });
    }
    if cursor.remaining() != 0 {
        return Err(corrupt(
            index,
            format!("{} unexpected bytes after the headers (length says {body_len})", cursor.remaining()),
        ));
    }
    batch.position = cursor.end;

    Ok(Record {
        // `parse` checked base offset + last offset delta fits an i64.
        offset: context.base_offset + u64::from(index),
        // Java's long arithmetic wraps, and so does the encoder's subtraction.
        timestamp_ms: context
            .log_append_time
            .unwrap_or_else(|| context.base_timestamp.wrapping_add(timestamp_delta)),
        key,
        value,
        headers,
    })
}

#[cfg(test)]
mod tests;
