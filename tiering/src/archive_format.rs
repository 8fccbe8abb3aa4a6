//! The archive format: one sealed segment as one Parquet object.
//!
//! Plain Parquet that DuckDB, pyarrow, polars and DataFusion read without Silt:
//!
//! | column      | type                                                     | null |
//! |-------------|----------------------------------------------------------|------|
//! | `offset`    | int64                                                    | no   |
//! | `timestamp` | timestamp(ms, "UTC")                                     | no   |
//! | `key`       | binary                                                   | yes  |
//! | `value`     | binary                                                   | yes (a Kafka tombstone has a null value) |
//! | `headers`   | list<struct<key: utf8 (non-null), value: binary (nullable)>> | no (empty when a record has none) |
//!
//! Rows are in offset order (declared as the sorting column). Pages are zstd-compressed.
//! Statistics are written per row group and per page together with the page index (column
//! index + offset index), so a reader can pick the row groups and pages holding an offset or a
//! time range from the footer alone; `value` alone has no statistics (min/max of payloads
//! help no query and cost footer space). `offset` and `timestamp` use delta encoding and no
//! dictionary.
//!
//! The footer's key-value metadata makes an object self-describing, so the bucket alone is
//! enough to rebuild the offset map: `silt.topic`, `silt.partition`, `silt.partitions` (the
//! topic's partition count), `silt.base_offset`, `silt.last_offset`, `silt.record_count`,
//! `silt.min_timestamp_ms`, `silt.max_timestamp_ms` and `silt.format_version` ([`FORMAT_VERSION`]).
//! A reader refuses a version it does not know.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::builder::OffsetBufferBuilder;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BinaryViewArray, Int64Array, ListArray, RecordBatch, StringArray,
    StringViewArray, StructArray, TimestampMillisecondArray,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};
use parquet::arrow::async_reader::{MetadataFetch, MetadataSuffixFetch};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, ParquetMetaData, ParquetMetaDataReader, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use silt_record::{Header, Record};

use crate::TieringError;

/// The archive format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Footer key of the topic name.
pub const KEY_TOPIC: &str = "silt.topic";
/// Footer key of the partition number.
pub const KEY_PARTITION: &str = "silt.partition";
/// Footer key of the topic's partition count.
pub const KEY_PARTITIONS: &str = "silt.partitions";
/// Footer key of the first offset.
pub const KEY_BASE_OFFSET: &str = "silt.base_offset";
/// Footer key of the last offset.
pub const KEY_LAST_OFFSET: &str = "silt.last_offset";
/// Footer key of the number of records.
pub const KEY_RECORD_COUNT: &str = "silt.record_count";
/// Footer key of the smallest record timestamp.
pub const KEY_MIN_TIMESTAMP_MS: &str = "silt.min_timestamp_ms";
/// Footer key of the largest record timestamp.
pub const KEY_MAX_TIMESTAMP_MS: &str = "silt.max_timestamp_ms";
/// Footer key of the format version.
pub const KEY_FORMAT_VERSION: &str = "silt.format_version";

/// Column index of `offset` (root and leaf).
pub const COLUMN_OFFSET: usize = 0;
/// Column index of `timestamp` (root and leaf).
pub const COLUMN_TIMESTAMP: usize = 1;

/// How many bytes from the end of an object the first footer read fetches. Footers of archives
/// with a few row groups are a few KiB, so one request is almost always enough.
pub const FOOTER_PREFETCH_BYTES: usize = 64 * 1024;

/// What an archive holds; stored in its footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveMeta {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: u32,
    /// The topic's partition count when the segment was archived.
    pub partitions: u32,
    /// First offset.
    pub base_offset: u64,
    /// Last offset.
    pub last_offset: u64,
    /// Number of records (rows).
    pub record_count: u64,
    /// Smallest record timestamp (ms since the Unix epoch).
    pub min_timestamp_ms: i64,
    /// Largest record timestamp (ms since the Unix epoch).
    pub max_timestamp_ms: i64,
}

impl ArchiveMeta {
    fn key_values(&self) -> Vec<KeyValue> {
        [
            (KEY_FORMAT_VERSION, FORMAT_VERSION.to_string()),
            (KEY_TOPIC, self.topic.clone()),
            (KEY_PARTITION, self.partition.to_string()),
            (KEY_PARTITIONS, self.partitions.to_string()),
            (KEY_BASE_OFFSET, self.base_offset.to_string()),
            (KEY_LAST_OFFSET, self.last_offset.to_string()),
            (KEY_RECORD_COUNT, self.record_count.to_string()),
            (KEY_MIN_TIMESTAMP_MS, self.min_timestamp_ms.to_string()),
            (KEY_MAX_TIMESTAMP_MS, self.max_timestamp_ms.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| KeyValue::new(k.to_string(), v))
        .collect()
    }

    /// Checks the fields against each other.
    fn validate(&self) -> Result<(), String> {
        if self.topic.is_empty() {
            return Err("empty topic name".into());
        }
        if self.partition >= self.partitions {
            return Err(format!(
                "partition {} of a topic with {} partitions",
                self.partition, self.partitions
            ));
        }
        if self.base_offset > self.last_offset {
            return Err(format!("base offset {} after last offset {}", self.base_offset, self.last_offset));
        }
        if self.last_offset > i64::MAX as u64 {
            return Err(format!("last offset {} does not fit an int64 column", self.last_offset));
        }
        let span = self.last_offset - self.base_offset + 1;
        if self.record_count == 0 || self.record_count > span {
            return Err(format!(
                "{} records cannot span offsets {}..={}",
                self.record_count, self.base_offset, self.last_offset
            ));
        }
        if self.min_timestamp_ms > self.max_timestamp_ms {
            return Err(format!(
                "min timestamp {} after max timestamp {}",
                self.min_timestamp_ms, self.max_timestamp_ms
            ));
        }
        Ok(())
    }
}

/// How [`encode_archive`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveWriterOptions {
    /// Most rows per row group. A row group is the unit a cold reader fetches and caches.
    pub row_group_rows_max: usize,
    /// Most (estimated, encoded) bytes per row group, so a row group of large messages still
    /// fits the cold reader's cache.
    pub row_group_bytes_max: usize,
    /// Rows per data page; each page gets its own statistics in the page index.
    pub page_rows_max: usize,
    /// zstd level (1..=22).
    pub zstd_level: i32,
}

impl Default for ArchiveWriterOptions {
    fn default() -> Self {
        ArchiveWriterOptions {
            row_group_rows_max: 32_768,
            row_group_bytes_max: 8 * 1024 * 1024,
            page_rows_max: 4096,
            zstd_level: 3,
        }
    }
}

/// The Arrow schema of an archive.
pub fn archive_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("offset", DataType::Int64, false),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("headers", DataType::List(header_item_field()), false),
    ]))
}

/// The archive schema with view types for the byte columns (`binary_view`, and `utf8_view` for
/// header keys): what the cold reader asks Parquet to decode into. Parquet then hands out PLAIN
/// values and dictionaries as views into the decompressed pages instead of copying every value
/// into one new buffer, and [`decode_records`] slices the records out of those pages. The
/// object's bytes and its stored schema stay [`archive_schema`].
pub(crate) fn archive_read_schema() -> SchemaRef {
    let header_fields = Fields::from(vec![
        Field::new("key", DataType::Utf8View, false),
        Field::new("value", DataType::BinaryView, true),
    ]);
    let header_item = Arc::new(Field::new("element", DataType::Struct(header_fields), false));
    Arc::new(Schema::new(vec![
        Field::new("offset", DataType::Int64, false),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("key", DataType::BinaryView, true),
        Field::new("value", DataType::BinaryView, true),
        Field::new("headers", DataType::List(header_item), false),
    ]))
}

fn header_fields() -> Fields {
    Fields::from(vec![Field::new("key", DataType::Utf8, false), Field::new("value", DataType::Binary, true)])
}

fn header_item_field() -> Arc<Field> {
    // "element" is the Parquet spec's name for list items; every reader understands it.
    Arc::new(Field::new("element", DataType::Struct(header_fields()), false))
}

fn invalid_input(msg: impl Into<String>) -> TieringError {
    TieringError::InvalidArgument(msg.into())
}

/// Encodes one segment's records as a Parquet object.
///
/// `records` must be in strictly increasing offset order and agree with `meta`: as many
/// records as `record_count`, the first at `base_offset`, the last at `last_offset`, and the
/// same smallest and largest timestamps. CPU-bound: call it from a blocking thread.
pub fn encode_archive(
    meta: &ArchiveMeta,
    records: &[Record],
    opts: &ArchiveWriterOptions,
) -> Result<Bytes, TieringError> {
    meta.validate().map_err(|e| invalid_input(format!("archive metadata: {e}")))?;
    check_records(meta, records)?;
    if opts.row_group_rows_max == 0 || opts.row_group_bytes_max == 0 || opts.page_rows_max == 0 {
        return Err(invalid_input("archive writer limits must be at least 1"));
    }
    let zstd = ZstdLevel::try_new(opts.zstd_level)
        .map_err(|e| invalid_input(format!("zstd level {}: {e}", opts.zstd_level)))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(zstd))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_column_statistics_enabled("value".into(), EnabledStatistics::None)
        .set_offset_index_disabled(false)
        .set_max_row_group_row_count(Some(opts.row_group_rows_max))
        .set_max_row_group_bytes(Some(opts.row_group_bytes_max))
        .set_data_page_row_count_limit(opts.page_rows_max)
        .set_column_dictionary_enabled("offset".into(), false)
        .set_column_encoding("offset".into(), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled("timestamp".into(), false)
        .set_column_encoding("timestamp".into(), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled("value".into(), false)
        .set_sorting_columns(Some(vec![SortingColumn {
            column_idx: COLUMN_OFFSET as i32,
            descending: false,
            nulls_first: false,
        }]))
        .set_key_value_metadata(Some(meta.key_values()))
        .set_created_by(format!(
            "silt-tiering {} (archive format {FORMAT_VERSION})",
            env!("CARGO_PKG_VERSION")
        ))
        .build();
    let payload_bytes: usize = records
        .iter()
        .map(|r| {
            r.key.as_ref().map_or(0, Bytes::len)
                + r.value.as_ref().map_or(0, Bytes::len)
                + r.headers
                    .iter()
                    .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                    .sum::<usize>()
        })
        .sum();
    let mut out = Vec::with_capacity(payload_bytes / 2 + 4096);
    let mut writer = ArrowWriter::try_new(&mut out, archive_schema(), Some(props))?;
    // Write in slices: the writer buffers into row groups anyway, and the Arrow copy of the
    // records stays small.
    let slice_rows = opts.page_rows_max.clamp(1, 8192);
    for chunk in records.chunks(slice_rows) {
        writer.write(&records_to_batch(chunk)?)?;
    }
    writer.close()?;
    Ok(Bytes::from(out))
}

fn check_records(meta: &ArchiveMeta, records: &[Record]) -> Result<(), TieringError> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Err(invalid_input("an archive needs at least one record"));
    };
    if records.len() as u64 != meta.record_count {
        return Err(invalid_input(format!(
            "{} records given, archive metadata says {}",
            records.len(),
            meta.record_count
        )));
    }
    if first.offset != meta.base_offset || last.offset != meta.last_offset {
        return Err(invalid_input(format!(
            "records span offsets {}..={}, archive metadata says {}..={}",
            first.offset, last.offset, meta.base_offset, meta.last_offset
        )));
    }
    if let Some(w) = records.windows(2).find(|w| w[1].offset <= w[0].offset) {
        return Err(invalid_input(format!(
            "records out of offset order: {} follows {}",
            w[1].offset, w[0].offset
        )));
    }
    let min = records.iter().map(|r| r.timestamp_ms).min().unwrap_or(i64::MIN);
    let max = records.iter().map(|r| r.timestamp_ms).max().unwrap_or(i64::MAX);
    if min != meta.min_timestamp_ms || max != meta.max_timestamp_ms {
        return Err(invalid_input(format!(
            "records have timestamps {min}..={max}, archive metadata says {}..={}",
            meta.min_timestamp_ms, meta.max_timestamp_ms
        )));
    }
    Ok(())
}

/// Converts records to an Arrow batch of the [`archive_schema`].
pub fn records_to_batch(records: &[Record]) -> Result<RecordBatch, TieringError> {
    let offsets = records
        .iter()
        .map(|r| {
            i64::try_from(r.offset)
                .map_err(|_| invalid_input(format!("offset {} does not fit an int64 column", r.offset)))
        })
        .collect::<Result<Vec<i64>, _>>()?;
    let timestamps =
        TimestampMillisecondArray::from(records.iter().map(|r| r.timestamp_ms).collect::<Vec<_>>())
            .with_timezone("UTC");
    let keys = BinaryArray::from_iter(records.iter().map(|r| r.key.as_deref()));
    let values = BinaryArray::from_iter(records.iter().map(|r| r.value.as_deref()));
    let mut header_offsets = OffsetBufferBuilder::<i32>::new(records.len());
    let mut header_keys = Vec::new();
    let mut header_values = Vec::new();
    for r in records {
        header_offsets.push_length(r.headers.len());
        for h in &r.headers {
            header_keys.push(h.key.as_str());
            header_values.push(h.value.as_deref());
        }
    }
    let header_structs = StructArray::try_new(
        header_fields(),
        vec![
            Arc::new(StringArray::from(header_keys)) as ArrayRef,
            Arc::new(BinaryArray::from_iter(header_values)) as ArrayRef,
        ],
        None,
    )?;
    let headers =
        ListArray::try_new(header_item_field(), header_offsets.finish(), Arc::new(header_structs), None)?;
    Ok(RecordBatch::try_new(
        archive_schema(),
        vec![
            Arc::new(Int64Array::from(offsets)),
            Arc::new(timestamps),
            Arc::new(keys),
            Arc::new(values),
            Arc::new(headers),
        ],
    )?)
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str, what: &str) -> Result<&'a T, TieringError> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| TieringError::InvalidArchive(format!("no '{name}' column")))?;
    col.as_any().downcast_ref::<T>().ok_or_else(|| {
        TieringError::InvalidArchive(format!("column '{name}' is {}, expected {what}", col.data_type()))
    })
}

/// One binary column whose values are handed out as [`Bytes`] that share the Arrow buffers:
/// each buffer is wrapped once per batch, and each value is a slice of it, so no value is
/// copied. (A value slice keeps its whole buffer alive, as the decoded row group does anyway.)
enum BinaryValues<'a> {
    /// `binary`: one values buffer, indexed by the offsets.
    Offsets { array: &'a BinaryArray, values: Bytes },
    /// `binary_view`: values of up to 12 bytes are inline in the view, longer ones point into
    /// one of the data buffers (for PLAIN pages, the decompressed page itself).
    Views { array: &'a BinaryViewArray, buffers: Vec<Bytes> },
}

/// Longest value a `binary_view` keeps inline in its 16-byte view.
const VIEW_INLINE_BYTES_MAX: usize = 12;

impl<'a> BinaryValues<'a> {
    fn new(array: &'a dyn Array, what: &str) -> Result<Self, TieringError> {
        if let Some(array) = array.as_any().downcast_ref::<BinaryArray>() {
            return Ok(BinaryValues::Offsets { array, values: Bytes::from(array.values().clone()) });
        }
        if let Some(array) = array.as_any().downcast_ref::<BinaryViewArray>() {
            let buffers = array.data_buffers().iter().map(|b| Bytes::from(b.clone())).collect();
            return Ok(BinaryValues::Views { array, buffers });
        }
        Err(TieringError::InvalidArchive(format!("{what} are {}, expected binary", array.data_type())))
    }

    fn len(&self) -> usize {
        match self {
            BinaryValues::Offsets { array, .. } => array.len(),
            BinaryValues::Views { array, .. } => array.len(),
        }
    }

    /// Value `i` (`None` when null), or an error when the array points outside its buffers.
    fn get(&self, i: usize) -> Result<Option<Bytes>, TieringError> {
        let malformed = || TieringError::InvalidArchive(format!("binary value {i} lies outside its buffer"));
        match self {
            BinaryValues::Offsets { array, values } => {
                if array.is_null(i) {
                    return Ok(None);
                }
                let offsets = array.value_offsets();
                let (Some(&start), Some(&end)) = (offsets.get(i), offsets.get(i + 1)) else {
                    return Err(malformed());
                };
                let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
                    return Err(malformed());
                };
                if start > end || end > values.len() {
                    return Err(malformed());
                }
                Ok(Some(values.slice(start..end)))
            }
            BinaryValues::Views { array, buffers } => {
                if array.is_null(i) {
                    return Ok(None);
                }
                let view = *array.views().get(i).ok_or_else(malformed)?;
                // The view layout of the Arrow spec: length in the low 32 bits, then a 4-byte
                // prefix, the buffer index and the offset in that buffer.
                let len = (view as u32) as usize;
                if len <= VIEW_INLINE_BYTES_MAX {
                    return Ok(Some(Bytes::copy_from_slice(array.value(i))));
                }
                let buffer = buffers.get(((view >> 64) as u32) as usize).ok_or_else(malformed)?;
                let start = ((view >> 96) as u32) as usize;
                if start.checked_add(len).is_none_or(|end| end > buffer.len()) {
                    return Err(malformed());
                }
                Ok(Some(buffer.slice(start..start + len)))
            }
        }
    }
}

/// One UTF-8 column (`utf8` or `utf8_view`), read value by value.
enum StringValues<'a> {
    Offsets(&'a StringArray),
    Views(&'a StringViewArray),
}

impl<'a> StringValues<'a> {
    fn new(array: &'a dyn Array, what: &str) -> Result<Self, TieringError> {
        if let Some(array) = array.as_any().downcast_ref::<StringArray>() {
            return Ok(StringValues::Offsets(array));
        }
        if let Some(array) = array.as_any().downcast_ref::<StringViewArray>() {
            return Ok(StringValues::Views(array));
        }
        Err(TieringError::InvalidArchive(format!("{what} are {}, expected utf8", array.data_type())))
    }

    /// Value `i`, `None` when null.
    fn get(&self, i: usize) -> Option<&str> {
        match self {
            StringValues::Offsets(array) => array.is_valid(i).then(|| array.value(i)),
            StringValues::Views(array) => array.is_valid(i).then(|| array.value(i)),
        }
    }
}

/// Converts a batch read from an archive back to records: the exact inverse of
/// [`records_to_batch`] (null and empty keys and values stay distinct; headers keep their
/// order and their null values).
///
/// Keys, values and header values are slices of the batch's Arrow buffers, not copies; the
/// batch may hold them as `binary` (the archive's schema) or as `binary_view` (and header keys
/// as `utf8` or `utf8_view`), which the cold reader asks Parquet for because it decodes PLAIN
/// pages without copying them.
pub fn decode_records(batch: &RecordBatch) -> Result<Vec<Record>, TieringError> {
    let offsets: &Int64Array = column(batch, "offset", "int64")?;
    let timestamps: &TimestampMillisecondArray = column(batch, "timestamp", "timestamp(ms)")?;
    let keys = BinaryValues::new(column_any(batch, "key")?, "keys")?;
    let values = BinaryValues::new(column_any(batch, "value")?, "values")?;
    let headers: &ListArray = column(batch, "headers", "list<struct<key, value>>")?;
    let header_structs =
        headers.values().as_any().downcast_ref::<StructArray>().filter(|s| s.num_columns() == 2).ok_or_else(
            || TieringError::InvalidArchive("'headers' items are not struct<key, value>".into()),
        )?;
    let header_keys = StringValues::new(header_structs.column(0).as_ref(), "header keys")?;
    let header_values = BinaryValues::new(header_structs.column(1).as_ref(), "header values")?;
    let header_offsets = headers.value_offsets();
    let rows = batch.num_rows();
    if keys.len() != rows || values.len() != rows || header_values.len() != header_structs.len() {
        return Err(TieringError::InvalidArchive("columns of different lengths".into()));
    }

    let mut records = Vec::with_capacity(rows);
    for i in 0..rows {
        if offsets.is_null(i) || timestamps.is_null(i) {
            return Err(TieringError::InvalidArchive(format!("row {i} has a null offset or timestamp")));
        }
        let offset = u64::try_from(offsets.value(i))
            .map_err(|_| TieringError::InvalidArchive(format!("row {i} has offset {}", offsets.value(i))))?;
        let mut record_headers = Vec::new();
        if headers.is_valid(i) {
            let range = usize::try_from(header_offsets[i]).unwrap_or(0)
                ..usize::try_from(header_offsets[i + 1]).unwrap_or(0);
            record_headers.reserve(range.len());
            for h in range {
                let key = (h < header_structs.len()).then(|| header_keys.get(h)).flatten();
                let Some(key) = key else {
                    return Err(TieringError::InvalidArchive(format!("row {i} has a malformed header")));
                };
                record_headers.push(Header { key: key.to_string(), value: header_values.get(h)? });
            }
        }
        records.push(Record {
            offset,
            timestamp_ms: timestamps.value(i),
            key: keys.get(i)?,
            value: values.get(i)?,
            headers: record_headers,
        });
    }
    Ok(records)
}

/// Every record of a whole archive object, with its archive metadata (checked as
/// [`archive_meta_from_parquet`] checks it): what a tool that reads the bucket directly sees.
pub fn decode_archive(object: Bytes) -> Result<(ArchiveMeta, Vec<Record>), TieringError> {
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(object)?;
    let meta = archive_meta_from_parquet(builder.metadata())?;
    let mut records = Vec::with_capacity(meta.record_count as usize);
    for batch in builder.build()? {
        records.extend(decode_records(&batch?)?);
    }
    Ok((meta, records))
}

fn column_any<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array, TieringError> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| TieringError::InvalidArchive(format!("no '{name}' column")))
}

/// Reads and validates the archive metadata in a parsed footer: the format version first
/// (refusing versions this build does not know), then every `silt.*` key, their consistency,
/// and that the file holds exactly `record_count` rows.
pub fn archive_meta_from_parquet(md: &ParquetMetaData) -> Result<ArchiveMeta, TieringError> {
    let kv = md.file_metadata().key_value_metadata();
    let get = |key: &str| -> Option<&str> {
        kv.and_then(|kv| kv.iter().find(|e| e.key == key)).and_then(|e| e.value.as_deref())
    };
    let version = get(KEY_FORMAT_VERSION).ok_or_else(|| {
        TieringError::InvalidArchive(format!("no '{KEY_FORMAT_VERSION}' in the footer: not a Silt archive"))
    })?;
    if version.trim().parse::<u32>().ok() != Some(FORMAT_VERSION) {
        return Err(TieringError::UnsupportedFormatVersion {
            found: version.to_string(),
            supported: FORMAT_VERSION,
        });
    }
    fn parse<T: std::str::FromStr>(key: &str, value: Option<&str>) -> Result<T, TieringError> {
        let value = value.ok_or_else(|| TieringError::InvalidArchive(format!("no '{key}' in the footer")))?;
        value.parse().map_err(|_| TieringError::InvalidArchive(format!("'{key}' is '{value}', not a number")))
    }
    let meta = ArchiveMeta {
        topic: get(KEY_TOPIC)
            .ok_or_else(|| TieringError::InvalidArchive(format!("no '{KEY_TOPIC}' in the footer")))?
            .to_string(),
        partition: parse(KEY_PARTITION, get(KEY_PARTITION))?,
        partitions: parse(KEY_PARTITIONS, get(KEY_PARTITIONS))?,
        base_offset: parse(KEY_BASE_OFFSET, get(KEY_BASE_OFFSET))?,
        last_offset: parse(KEY_LAST_OFFSET, get(KEY_LAST_OFFSET))?,
        record_count: parse(KEY_RECORD_COUNT, get(KEY_RECORD_COUNT))?,
        min_timestamp_ms: parse(KEY_MIN_TIMESTAMP_MS, get(KEY_MIN_TIMESTAMP_MS))?,
        max_timestamp_ms: parse(KEY_MAX_TIMESTAMP_MS, get(KEY_MAX_TIMESTAMP_MS))?,
    };
    meta.validate().map_err(TieringError::InvalidArchive)?;
    let rows = md.file_metadata().num_rows();
    if u64::try_from(rows).ok() != Some(meta.record_count) {
        return Err(TieringError::InvalidArchive(format!(
            "the footer says {} records but the file has {rows} rows",
            meta.record_count
        )));
    }
    let names: Vec<&str> =
        md.file_metadata().schema_descr().root_schema().get_fields().iter().map(|f| f.name()).collect();
    if names != ["offset", "timestamp", "key", "value", "headers"] {
        return Err(TieringError::InvalidArchive(format!("unexpected columns {names:?}")));
    }
    Ok(meta)
}

/// Reads an archive's footer and its metadata, fetching only the end of the object: one
/// range GET of the last [`FOOTER_PREFETCH_BYTES`] when `size` is known, a suffix range GET
/// when it is not (no HEAD either way), and a second GET only for an unusually large footer.
/// Page indexes are not loaded. Checks everything [`archive_meta_from_parquet`] checks.
pub async fn read_archive_meta(
    store: &dyn ObjectStore,
    location: &Path,
    size: Option<u64>,
) -> Result<(ArchiveMeta, Arc<ParquetMetaData>), TieringError> {
    let (meta, md, _) = read_archive_meta_counted(store, location, size).await?;
    Ok((meta, md))
}

/// [`read_archive_meta`], also returning the bytes fetched.
pub(crate) async fn read_archive_meta_counted(
    store: &dyn ObjectStore,
    location: &Path,
    size: Option<u64>,
) -> Result<(ArchiveMeta, Arc<ParquetMetaData>, u64), TieringError> {
    let mut fetch = FooterFetch { store, location, error: None, fetched_bytes: 0 };
    let reader = ParquetMetaDataReader::new().with_prefetch_hint(Some(FOOTER_PREFETCH_BYTES));
    let result = match size {
        Some(size) => reader.load_and_finish(&mut fetch, size).await,
        None => reader.load_via_suffix_and_finish(&mut fetch).await,
    };
    let md = result.map_err(|e| match fetch.error.take() {
        Some((op, source)) => TieringError::object_store(op, location, source),
        None => TieringError::InvalidArchive(format!("'{location}': {e}")),
    })?;
    let meta = archive_meta_from_parquet(&md).map_err(|e| match e {
        TieringError::InvalidArchive(reason) => {
            TieringError::InvalidArchive(format!("'{location}': {reason}"))
        }
        other => other,
    })?;
    Ok((meta, Arc::new(md), fetch.fetched_bytes))
}

/// Serves the Parquet metadata reader's byte requests with range GETs, remembering the object
/// store's own error so a missing object surfaces as `NotFound`, not as a Parquet error.
struct FooterFetch<'a> {
    store: &'a dyn ObjectStore,
    location: &'a Path,
    error: Option<(&'static str, object_store::Error)>,
    fetched_bytes: u64,
}

impl FooterFetch<'_> {
    async fn get(&mut self, op: &'static str, range: GetRange) -> parquet::errors::Result<Bytes> {
        let result = match range {
            GetRange::Bounded(r) => self.store.get_range(self.location, r).await,
            range => {
                let opts = GetOptions { range: Some(range), ..Default::default() };
                match self.store.get_opts(self.location, opts).await {
                    Ok(r) => r.bytes().await,
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(bytes) => {
                self.fetched_bytes += bytes.len() as u64;
                Ok(bytes)
            }
            Err(e) => {
                let message = e.to_string();
                self.error = Some((op, e));
                Err(ParquetError::External(message.into()))
            }
        }
    }
}

impl MetadataFetch for &mut FooterFetch<'_> {
    fn fetch(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.get("get_range", GetRange::Bounded(range)).boxed()
    }
}

impl MetadataSuffixFetch for &mut FooterFetch<'_> {
    fn fetch_suffix(&mut self, suffix: usize) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.get("get_suffix", GetRange::Suffix(suffix as u64)).boxed()
    }
}

/// What a row group's statistics say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowGroupStats {
    /// Rows in the row group.
    pub num_rows: u64,
    /// Smallest offset.
    pub min_offset: u64,
    /// Largest offset.
    pub max_offset: u64,
    /// Smallest timestamp.
    pub min_timestamp_ms: i64,
    /// Largest timestamp.
    pub max_timestamp_ms: i64,
}

impl RowGroupStats {
    /// Whether the row group's offsets are exactly `min_offset..=max_offset` (rows are in
    /// strictly increasing offset order, so a row count equal to the span means no gaps), which
    /// lets a reader compute the row of an offset.
    pub fn is_contiguous(&self) -> bool {
        self.max_offset >= self.min_offset && self.max_offset - self.min_offset + 1 == self.num_rows
    }
}

fn int64_min_max(stats: Option<&Statistics>) -> Option<(i64, i64)> {
    match stats? {
        Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?)),
        _ => None,
    }
}

/// The offset and timestamp statistics of row group `index`, or `None` when the file does not
/// have them (it was not written by [`encode_archive`]).
pub fn row_group_stats(md: &ParquetMetaData, index: usize) -> Option<RowGroupStats> {
    let rg = md.row_groups().get(index)?;
    if rg.num_columns() <= COLUMN_TIMESTAMP {
        return None;
    }
    let (min_offset, max_offset) = int64_min_max(rg.column(COLUMN_OFFSET).statistics())?;
    let (min_ts, max_ts) = int64_min_max(rg.column(COLUMN_TIMESTAMP).statistics())?;
    Some(RowGroupStats {
        num_rows: u64::try_from(rg.num_rows()).ok()?,
        min_offset: u64::try_from(min_offset).ok()?,
        max_offset: u64::try_from(max_offset).ok()?,
        min_timestamp_ms: min_ts,
        max_timestamp_ms: max_ts,
    })
}

/// The byte ranges of every column chunk of row group `index`, checked against the object
/// size (a corrupt footer must not make a reader fetch beyond the object or panic).
pub fn row_group_byte_ranges(
    md: &ParquetMetaData,
    index: usize,
    object_bytes: u64,
) -> Result<Vec<Range<u64>>, TieringError> {
    let rg = md
        .row_groups()
        .get(index)
        .ok_or_else(|| TieringError::InvalidArchive(format!("no row group {index}")))?;
    rg.columns()
        .iter()
        .map(|c| {
            let start = c.dictionary_page_offset().unwrap_or_else(|| c.data_page_offset());
            let len = c.compressed_size();
            match (u64::try_from(start), u64::try_from(len)) {
                (Ok(start), Ok(len)) if start.checked_add(len).is_some_and(|end| end <= object_bytes) => {
                    Ok(start..start + len)
                }
                _ => Err(TieringError::InvalidArchive(format!(
                    "row group {index} column chunk at {start} of {len} bytes lies outside the {object_bytes}-byte object"
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;
    use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
    use parquet::file::metadata::PageIndexPolicy;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random records at `base..base+count` with every shape the format must keep apart:
    /// null and empty keys and values, headers with null and empty values.
    pub(crate) fn random_records(seed: u64, base: u64, count: usize) -> Vec<Record> {
        fn bytes(rng: &mut StdRng, max: usize) -> Option<Bytes> {
            match rng.random_range(0..10) {
                0 => None,
                1 => Some(Bytes::new()),
                _ => {
                    let len = rng.random_range(1..=max);
                    Some(Bytes::from((0..len).map(|_| rng.random::<u8>()).collect::<Vec<u8>>()))
                }
            }
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ts = 1_700_000_000_000i64;
        (0..count)
            .map(|i| {
                ts += rng.random_range(-5..50);
                let headers = (0..rng.random_range(0..3))
                    .map(|h| Header {
                        key: format!("h{h}-{}", rng.random_range(0..3)),
                        value: bytes(&mut rng, 8),
                    })
                    .collect();
                Record {
                    offset: base + i as u64,
                    timestamp_ms: ts,
                    key: bytes(&mut rng, 16),
                    value: bytes(&mut rng, 200),
                    headers,
                }
            })
            .collect()
    }

    pub(crate) fn meta_for(records: &[Record]) -> ArchiveMeta {
        ArchiveMeta {
            topic: "orders".into(),
            partition: 2,
            partitions: 4,
            base_offset: records.first().map_or(0, |r| r.offset),
            last_offset: records.last().map_or(0, |r| r.offset),
            record_count: records.len() as u64,
            min_timestamp_ms: records.iter().map(|r| r.timestamp_ms).min().unwrap_or(0),
            max_timestamp_ms: records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0),
        }
    }

    fn decode_all(object: &Bytes) -> Vec<Record> {
        decode_archive(object.clone()).unwrap().1
    }

    /// As the cold reader decodes: into view types.
    fn decode_all_as_views(object: &Bytes) -> Vec<Record> {
        let options = ArrowReaderOptions::new().with_schema(archive_read_schema());
        let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(object.clone(), options)
            .unwrap()
            .build()
            .unwrap();
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            assert_eq!(batch.column_by_name("value").unwrap().data_type(), &DataType::BinaryView);
            out.extend(decode_records(&batch).unwrap());
        }
        out
    }

    #[test]
    fn decoding_slices_values_out_of_the_arrow_buffers() {
        // Values of 100 bytes, so that views point into the pages rather than inline.
        let mut records = random_records(6, 0, 200);
        for (i, r) in records.iter_mut().enumerate() {
            r.value = Some(Bytes::from(vec![i as u8; 100]));
        }
        let object = encode_archive(&meta_for(&records), &records, &ArchiveWriterOptions::default()).unwrap();

        let batch = ParquetRecordBatchReaderBuilder::try_new(object.clone())
            .unwrap()
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let values = batch.column_by_name("value").unwrap().as_any().downcast_ref::<BinaryArray>().unwrap();
        let decoded = decode_records(&batch).unwrap();
        assert_eq!(decoded, records[..decoded.len()]);
        for (i, r) in decoded.iter().enumerate() {
            assert_eq!(r.value.as_ref().unwrap().as_ptr(), values.value(i).as_ptr(), "value {i} was copied");
        }

        let options = ArrowReaderOptions::new().with_schema(archive_read_schema());
        let batch = ParquetRecordBatchReaderBuilder::try_new_with_options(object, options)
            .unwrap()
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let values =
            batch.column_by_name("value").unwrap().as_any().downcast_ref::<BinaryViewArray>().unwrap();
        let decoded = decode_records(&batch).unwrap();
        assert_eq!(decoded, records[..decoded.len()]);
        for (i, r) in decoded.iter().enumerate() {
            assert_eq!(r.value.as_ref().unwrap().as_ptr(), values.value(i).as_ptr(), "value {i} was copied");
        }
    }

    #[test]
    fn round_trips_every_record_shape() {
        let mut records = random_records(1, 100, 500);
        records[0].key = None;
        records[1].key = Some(Bytes::new());
        records[2].value = None;
        records[3].value = Some(Bytes::new());
        records[4].headers = vec![
            Header { key: "a".into(), value: None },
            Header { key: "a".into(), value: Some(Bytes::new()) },
            Header { key: "".into(), value: Some(Bytes::from_static(b"x")) },
        ];
        let meta = meta_for(&records);
        let object = encode_archive(&meta, &records, &ArchiveWriterOptions::default()).unwrap();
        assert_eq!(decode_all(&object), records);
        assert_eq!(decode_all_as_views(&object), records);
    }

    #[test]
    fn writes_statistics_and_page_index() {
        let records = random_records(2, 0, 3000);
        let opts =
            ArchiveWriterOptions { row_group_rows_max: 1000, page_rows_max: 250, ..Default::default() };
        let object = encode_archive(&meta_for(&records), &records, &opts).unwrap();
        let md = ParquetMetaDataReader::new()
            .with_page_index_policy(PageIndexPolicy::Required)
            .parse_and_finish(&object)
            .unwrap();
        assert_eq!(md.num_row_groups(), 3);
        for i in 0..3 {
            let stats = row_group_stats(&md, i).unwrap();
            assert_eq!((stats.min_offset, stats.max_offset), (i as u64 * 1000, i as u64 * 1000 + 999));
            assert!(stats.is_contiguous());
            let slice = &records[i * 1000..(i + 1) * 1000];
            assert_eq!(stats.min_timestamp_ms, slice.iter().map(|r| r.timestamp_ms).min().unwrap());
            assert_eq!(stats.max_timestamp_ms, slice.iter().map(|r| r.timestamp_ms).max().unwrap());
            for c in md.row_group(i).columns() {
                let is_value = c.column_path().string() == "value";
                assert_eq!(
                    c.column_index_range().is_some(),
                    !is_value,
                    "column index for {}",
                    c.column_path()
                );
                assert!(c.offset_index_range().is_some(), "offset index for {}", c.column_path());
                assert!(matches!(c.compression(), Compression::ZSTD(_)), "zstd for {}", c.column_path());
            }
        }
        assert!(md.page_index().is_some(), "the page index was loaded");
        assert_eq!(archive_meta_from_parquet(&md).unwrap(), meta_for(&records));
    }

    #[test]
    fn refuses_records_that_disagree_with_meta() {
        let records = random_records(3, 10, 20);
        let opts = ArchiveWriterOptions::default();
        let good = meta_for(&records);
        let cases: Vec<(ArchiveMeta, Vec<Record>)> = vec![
            (ArchiveMeta { record_count: 19, ..good.clone() }, records.clone()),
            (ArchiveMeta { base_offset: 9, ..good.clone() }, records.clone()),
            (ArchiveMeta { last_offset: 30, ..good.clone() }, records.clone()),
            (ArchiveMeta { max_timestamp_ms: good.max_timestamp_ms + 1, ..good.clone() }, records.clone()),
            (ArchiveMeta { partition: 4, ..good.clone() }, records.clone()),
            (good.clone(), {
                let mut r = records.clone();
                r.swap(3, 4);
                r
            }),
            (ArchiveMeta { record_count: 0, ..good.clone() }, vec![]),
        ];
        for (meta, records) in cases {
            let err = encode_archive(&meta, &records, &opts).unwrap_err();
            assert!(matches!(err, TieringError::InvalidArgument(_)), "{err}");
        }
        let huge = Record { offset: u64::MAX, ..records[0].clone() };
        assert!(encode_archive(&meta_for(std::slice::from_ref(&huge)), &[huge], &opts).is_err());
        assert!(encode_archive(&good, &records, &ArchiveWriterOptions { zstd_level: 99, ..opts.clone() })
            .is_err());
        assert!(
            encode_archive(&good, &records, &ArchiveWriterOptions { row_group_rows_max: 0, ..opts }).is_err()
        );
    }

    fn with_kv(object: &Bytes, key: &str, value: Option<&str>) -> ParquetMetaData {
        let md = ParquetMetaDataReader::new().parse_and_finish(object).unwrap();
        let mut kv: Vec<KeyValue> = md.file_metadata().key_value_metadata().cloned().unwrap_or_default();
        kv.retain(|e| e.key != key);
        if let Some(v) = value {
            kv.push(KeyValue::new(key.to_string(), v.to_string()));
        }
        let fmd = md.file_metadata();
        let file_metadata = parquet::file::metadata::FileMetaData::new(
            fmd.version(),
            fmd.num_rows(),
            fmd.created_by().map(str::to_string),
            Some(kv),
            fmd.schema_descr_ptr(),
            fmd.column_orders().cloned(),
        );
        ParquetMetaData::new(file_metadata, md.row_groups().to_vec())
    }

    #[test]
    fn refuses_unknown_format_versions_and_bad_footers() {
        let records = random_records(4, 0, 10);
        let object = encode_archive(&meta_for(&records), &records, &ArchiveWriterOptions::default()).unwrap();
        let err = archive_meta_from_parquet(&with_kv(&object, KEY_FORMAT_VERSION, Some("2"))).unwrap_err();
        assert!(matches!(err, TieringError::UnsupportedFormatVersion { .. }), "{err}");
        assert!(err.to_string().contains("upgrade Silt"), "{err}");
        let err = archive_meta_from_parquet(&with_kv(&object, KEY_FORMAT_VERSION, None)).unwrap_err();
        assert!(err.to_string().contains("not a Silt archive"), "{err}");
        let err = archive_meta_from_parquet(&with_kv(&object, KEY_RECORD_COUNT, Some("11"))).unwrap_err();
        assert!(matches!(err, TieringError::InvalidArchive(_)), "{err}");
        let err = archive_meta_from_parquet(&with_kv(&object, KEY_PARTITION, Some("x"))).unwrap_err();
        assert!(err.to_string().contains("not a number"), "{err}");
        let err = archive_meta_from_parquet(&with_kv(&object, KEY_TOPIC, None)).unwrap_err();
        assert!(err.to_string().contains(KEY_TOPIC), "{err}");
    }

    #[tokio::test]
    async fn reads_the_footer_with_one_request() {
        let store = crate::InstrumentedObjectStore::new(Arc::new(InMemory::new()));
        let stats = store.stats();
        let records = random_records(5, 7, 2000);
        let object = encode_archive(&meta_for(&records), &records, &ArchiveWriterOptions::default()).unwrap();
        let path = Path::from("a/topic=orders/partition=2/x.parquet");
        store.put(&path, PutPayload::from(object.clone())).await.unwrap();
        let before = stats.snapshot();
        let (meta, md) = read_archive_meta(&store, &path, Some(object.len() as u64)).await.unwrap();
        assert_eq!(meta, meta_for(&records));
        assert_eq!(md.file_metadata().num_rows(), 2000);
        let after = stats.snapshot();
        assert_eq!(after.requests() - before.requests(), 1, "one range GET, no HEAD");
        assert_eq!(after.head, before.head);
        assert!(after.bytes_in - before.bytes_in <= FOOTER_PREFETCH_BYTES as u64);

        let (meta2, _) = read_archive_meta(&store, &path, None).await.unwrap();
        assert_eq!(meta2, meta);
        assert_eq!(stats.snapshot().head, before.head, "an unknown size costs no HEAD either");

        let err = read_archive_meta(&store, &Path::from("missing.parquet"), None).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        store.put(&Path::from("junk"), PutPayload::from_static(b"not parquet at all")).await.unwrap();
        let err = read_archive_meta(&store, &Path::from("junk"), Some(18)).await.unwrap_err();
        assert!(matches!(err, TieringError::InvalidArchive(_)), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        #[test]
        fn archives_round_trip(seed in any::<u64>(), base in 0u64..1_000_000, count in 1usize..300, rg in 1usize..64) {
            let records = random_records(seed, base, count);
            let opts = ArchiveWriterOptions { row_group_rows_max: rg, page_rows_max: 7, ..Default::default() };
            let object = encode_archive(&meta_for(&records), &records, &opts).unwrap();
            prop_assert_eq!(decode_all(&object), records.clone());
            prop_assert_eq!(decode_all_as_views(&object), records);
        }
    }
}
