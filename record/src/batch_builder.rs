//! Encoding records into a RecordBatch v2.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::RecordError;
use crate::record::{Header, NewRecord, Record};
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
    let mut buf = BytesMut::new();
    encode(&mut buf, 0, records)?;
    Ok(buf.freeze())
}

/// Encodes stored records (with their offsets and timestamps) as batches laid end to end, what
/// a reader gets back from a partition: a new batch starts wherever offsets jump (records
/// deleted in between) and wherever the current one would pass `max_batch_bytes` (a single
/// record larger than that gets a batch of its own). Each batch's base offset is its first
/// record's offset; the partition leader epoch is -1.
///
/// # Errors
///
/// [`RecordError::Corrupt`] if the offsets do not increase, and
/// [`RecordError::BatchTooLarge`] if one record cannot be encoded at all.
pub fn encode_records(records: &[Record], max_batch_bytes: usize) -> Result<Bytes, RecordError> {
    // Plan every batch first, so the answer is allocated once at its full size.
    let mut batches = Vec::new();
    let mut sizes = Vec::with_capacity(records.len());
    let mut total = 0usize;
    let mut start = 0;
    while start < records.len() {
        let first = &records[start];
        let mut size = BATCH_HEADER_BYTES;
        let mut end = start;
        while end < records.len() {
            let r = &records[end];
            if end > start && r.offset != records[end - 1].offset.wrapping_add(1) {
                if r.offset <= records[end - 1].offset {
                    return Err(RecordError::Corrupt(format!(
                        "offsets must increase, but {} follows {}",
                        r.offset,
                        records[end - 1].offset
                    )));
                }
                break;
            }
            let record = record_size(r, r.timestamp_ms.wrapping_sub(first.timestamp_ms), end - start);
            let grown = size.saturating_add(record.total);
            if end > start && grown > max_batch_bytes {
                break;
            }
            sizes.push(record);
            size = grown;
            end += 1;
        }
        batches.push(start..end);
        total = total.saturating_add(size);
        start = end;
    }
    let mut buf = BytesMut::with_capacity(total.min(MAX_ENCODE_RESERVE_BYTES));
    for batch in batches {
        encode_sized(&mut buf, records[batch.start].offset, &records[batch.clone()], &sizes[batch])?;
    }
    Ok(buf.freeze())
}

/// Most that [`encode_records`] reserves up front; larger answers grow as they are written.
const MAX_ENCODE_RESERVE_BYTES: usize = 256 * 1024 * 1024;

/// What the encoder reads of a record: [`NewRecord`]s and stored [`Record`]s alike.
trait Fields {
    fn timestamp_ms(&self) -> i64;
    fn key(&self) -> Option<&[u8]>;
    fn value(&self) -> Option<&[u8]>;
    fn headers(&self) -> &[Header];
}

/// Both record types hold the fields under the same names.
macro_rules! impl_fields {
    ($($t:ty),*) => {$(
        impl Fields for $t {
            fn timestamp_ms(&self) -> i64 {
                self.timestamp_ms
            }
            fn key(&self) -> Option<&[u8]> {
                self.key.as_deref()
            }
            fn value(&self) -> Option<&[u8]> {
                self.value.as_deref()
            }
            fn headers(&self) -> &[Header] {
                &self.headers
            }
        }
    )*};
}
impl_fields!(NewRecord, Record);

/// Appends one batch of `records` to `buf`, with offset deltas `0..n` from `base_offset`.
fn encode(buf: &mut BytesMut, base_offset: u64, records: &[impl Fields]) -> Result<(), RecordError> {
    let base_timestamp = records.first().ok_or(RecordError::EmptyBatch)?.timestamp_ms();
    let sizes: Vec<RecordSize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| record_size(r, r.timestamp_ms().wrapping_sub(base_timestamp), i))
        .collect();
    encode_sized(buf, base_offset, records, &sizes)
}

/// [`encode`] with each record's size computed already (relative to the first record).
fn encode_sized(
    buf: &mut BytesMut,
    base_offset: u64,
    records: &[impl Fields],
    sizes: &[RecordSize],
) -> Result<(), RecordError> {
    let first = records.first().ok_or(RecordError::EmptyBatch)?;
    let base_timestamp = first.timestamp_ms();
    let max_timestamp = records.iter().map(Fields::timestamp_ms).max().unwrap_or(base_timestamp);
    let total = sizes.iter().fold(BATCH_HEADER_BYTES, |acc, s| acc.saturating_add(s.total));
    let too_large = RecordError::BatchTooLarge { size: total, max: MAX_BATCH_BYTES };
    if total > MAX_BATCH_BYTES {
        return Err(too_large);
    }
    // Every length below is at most `batch_length`, so every conversion to
    // i32 succeeds once this one has.
    let batch_length = i32::try_from(total - LOG_OVERHEAD).map_err(|_| too_large.clone())?;
    let count = i32::try_from(records.len()).map_err(|_| too_large.clone())?;
    let base_offset = i64::try_from(base_offset)
        .ok()
        .filter(|b| b.checked_add(i64::from(count - 1)).is_some())
        .ok_or_else(|| RecordError::Corrupt(format!("base offset {base_offset} is out of range")))?;

    let start = buf.len();
    buf.reserve(total);
    buf.put_i64(base_offset);
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

    for ((offset_delta, record), size) in records.iter().enumerate().zip(sizes) {
        put_len(buf, size.body);
        buf.put_i8(0); // record attributes, unused
        varint::put_varlong(buf, record.timestamp_ms().wrapping_sub(base_timestamp));
        put_len(buf, offset_delta);
        put_nullable(buf, record.key());
        put_nullable(buf, record.value());
        put_len(buf, record.headers().len());
        for header in record.headers() {
            put_len(buf, header.key.len());
            buf.put_slice(header.key.as_bytes());
            put_nullable(buf, header.value.as_deref());
        }
    }
    debug_assert_eq!(buf.len() - start, total, "record size computation is off");

    let crc = crc32c::crc32c(&buf[start + ATTRIBUTES_AT..]);
    buf[start + CRC_AT..start + CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(())
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
fn record_size(record: &impl Fields, timestamp_delta: i64, offset_delta: usize) -> RecordSize {
    let mut body = 1 // attributes
        + varint::varlong_len(timestamp_delta)
        + len_prefix_size(offset_delta);
    body = body
        .saturating_add(nullable_size(record.key()))
        .saturating_add(nullable_size(record.value()))
        .saturating_add(len_prefix_size(record.headers().len()));
    for header in record.headers() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_batch::{split_batches, RecordBatch};

    fn stored(offset: u64, value: &str) -> Record {
        Record {
            offset,
            timestamp_ms: 1_700_000_000_000 + (offset as i64 % 7) * 3 - 9,
            key: offset.is_multiple_of(2).then(|| Bytes::from(format!("k{offset}"))),
            value: Some(Bytes::from(value.to_string())),
            headers: vec![Header {
                key: "h".into(),
                value: offset.is_multiple_of(3).then(|| Bytes::from_static(b"v")),
            }],
        }
    }

    fn read_back(bytes: Bytes) -> (Vec<u64>, Vec<Record>) {
        let batches = split_batches(bytes).unwrap();
        let bases = batches.iter().map(RecordBatch::base_offset).collect();
        (bases, batches.iter().flat_map(RecordBatch::records).collect())
    }

    #[test]
    fn stored_records_come_back_whole_with_their_offsets() {
        let records: Vec<Record> = (40..60).map(|o| stored(o, &"x".repeat(o as usize))).collect();
        let (bases, back) = read_back(encode_records(&records, MAX_BATCH_BYTES).unwrap());
        assert_eq!(bases, vec![40]);
        assert_eq!(back, records);
    }

    #[test]
    fn a_gap_in_offsets_or_the_size_cap_starts_a_new_batch() {
        let mut records: Vec<Record> = (0..5).map(|o| stored(o, "aaaa")).collect();
        records.extend((100..104).map(|o| stored(o, "bbbb")));
        let (bases, back) = read_back(encode_records(&records, MAX_BATCH_BYTES).unwrap());
        assert_eq!(bases, vec![0, 100]);
        assert_eq!(back, records);

        // Three records of 1,000 bytes fit in no batch of 1,500: one batch each.
        let big: Vec<Record> = (7..10).map(|o| stored(o, &"z".repeat(1000))).collect();
        let (bases, back) = read_back(encode_records(&big, 1500).unwrap());
        assert_eq!(bases, vec![7, 8, 9]);
        assert_eq!(back, big);
        let (bases, _) = read_back(encode_records(&big, 2500).unwrap());
        assert_eq!(bases, vec![7, 9]);
    }

    #[test]
    fn offsets_that_do_not_increase_are_refused_and_nothing_is_empty() {
        let records = vec![stored(5, "a"), stored(5, "b")];
        assert!(matches!(encode_records(&records, MAX_BATCH_BYTES), Err(RecordError::Corrupt(_))));
        assert!(encode_records(&[], MAX_BATCH_BYTES).unwrap().is_empty());
    }

    #[test]
    fn split_batches_names_a_cut_off_end() {
        let records: Vec<Record> = (0..3).map(|o| stored(o, "abc")).collect();
        let bytes = encode_records(&records, MAX_BATCH_BYTES).unwrap();
        let cut = bytes.slice(..bytes.len() - 1);
        assert!(matches!(split_batches(cut), Err(RecordError::Truncated { .. })));
        assert!(matches!(
            split_batches(bytes.slice(..5)),
            Err(RecordError::Truncated { needed: 12, available: 5 })
        ));
    }
}
