//! What travels between agents: the segment a replica request is about, records delivered to
//! a group member (JSON with base64 bytes), and pages of records read (RecordBatch v2 bytes
//! laid end to end, the page's end beside them).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_metadata::state::GroupMode;
use silt_record::{encode_records, split_batches, Header, Record};

use crate::error::ApiError;
use crate::group_cursor::Delivered;

/// Set on a request one agent forwards to another.
pub const FORWARDED_HEADER: &str = "x-silt-forwarded-by";
/// The media type of RecordBatch v2 bytes laid end to end (produce and read bodies).
pub const RECORD_BATCHES_TYPE: &str = "application/vnd.kafka.record-batch.v2";
/// On a read answered with record batches: where the next read starts.
pub const NEXT_OFFSET_HEADER: &str = "x-silt-next-offset";
/// On a read answered with record batches: the partition's end when read.
pub const HIGH_WATERMARK_HEADER: &str = "x-silt-high-watermark";
/// Largest batch a read answer packs records into.
const READ_BATCH_BYTES: usize = 1024 * 1024;
/// Keys, values and headers per part of an answer's body: half a batch, so that a part is
/// usually one batch whatever the records' framing adds.
const BODY_PART_BYTES: usize = READ_BATCH_BYTES / 2;

/// Which segment of which partition a replica request is about, and from which writer epoch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaTarget {
    /// The topic's id: a deleted and re-created topic of the same name is another topic.
    pub topic_id: u64,
    /// The sending writer's epoch; replicas refuse epochs older than the newest they saw.
    pub epoch: u64,
    /// The segment's base offset.
    pub segment: u64,
    /// The epoch the segment was opened under (stamped on each of its batches).
    pub segment_epoch: u64,
}

/// A record between agents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRecord {
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Timestamp (ms).
    pub timestamp_ms: i64,
    /// Key, base64.
    pub key: Option<String>,
    /// Value, base64.
    pub value: Option<String>,
    /// Headers: key and base64 value.
    pub headers: Vec<(String, Option<String>)>,
    /// Deliveries to the group, for polls.
    pub delivery: u32,
}

impl WireRecord {
    /// Encodes a record.
    pub fn new(partition: u32, record: &Record, delivery: u32) -> Self {
        let b64 = |b: &Option<Bytes>| b.as_ref().map(|b| B64.encode(b));
        WireRecord {
            partition,
            offset: record.offset,
            timestamp_ms: record.timestamp_ms,
            key: b64(&record.key),
            value: b64(&record.value),
            headers: record.headers.iter().map(|h| (h.key.clone(), b64(&h.value))).collect(),
            delivery,
        }
    }

    /// Decodes it.
    pub fn into_delivered(self) -> Result<Delivered, ApiError> {
        let bytes = |s: Option<String>| -> Result<Option<Bytes>, ApiError> {
            s.map(|s| {
                B64.decode(s)
                    .map(Bytes::from)
                    .map_err(|e| ApiError::unavailable(format!("bad record from a peer: {e}")))
            })
            .transpose()
        };
        let mut headers = Vec::with_capacity(self.headers.len());
        for (key, value) in self.headers {
            headers.push(Header { key, value: bytes(value)? });
        }
        Ok(Delivered {
            partition: self.partition,
            record: Record {
                offset: self.offset,
                timestamp_ms: self.timestamp_ms,
                key: bytes(self.key)?,
                value: bytes(self.value)?,
                headers,
            },
            delivery: self.delivery,
        })
    }
}

/// A page of records read from a partition, as a read answers it: the records as batches laid
/// end to end in the body, [`NEXT_OFFSET_HEADER`] and [`HIGH_WATERMARK_HEADER`] beside them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPage {
    /// The records, in offset order.
    pub records: Vec<Record>,
    /// Where the next read starts.
    pub next_offset: u64,
    /// The partition's end when read.
    pub high_watermark: u64,
}

impl RecordPage {
    /// The body of the answer: the records as batches of at most [`READ_BATCH_BYTES`], a part
    /// of about [`BODY_PART_BYTES`] of keys and values at a time, each encoded only when the
    /// part before it is on its way: an answer never holds a second copy of the whole page, and
    /// its buffers are the same few sizes over and over.
    pub fn into_body_parts(self) -> impl Iterator<Item = Result<Bytes, std::io::Error>> + Send {
        let mut bounds = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, r) in self.records.iter().enumerate() {
            let len = r.data_len();
            if i > start && bytes + len > BODY_PART_BYTES {
                bounds.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += len;
        }
        if start < self.records.len() {
            bounds.push(start..self.records.len());
        }
        let records = self.records;
        bounds.into_iter().map(move |part| {
            encode_records(&records[part], READ_BATCH_BYTES)
                .map_err(|e| std::io::Error::other(format!("encoding records read: {e}")))
        })
    }

    /// Reads an answer back; the error says what was wrong with it.
    pub fn decode(headers: &reqwest::header::HeaderMap, body: Bytes) -> Result<RecordPage, String> {
        let number = |name: &str| -> Result<u64, String> {
            let value = headers.get(name).ok_or_else(|| format!("the answer has no {name} header"))?;
            value
                .to_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("the answer's {name} header is not a number: {value:?}"))
        };
        let (next_offset, high_watermark) = (number(NEXT_OFFSET_HEADER)?, number(HIGH_WATERMARK_HEADER)?);
        let batches =
            split_batches(body).map_err(|e| format!("the answer's records are not whole batches: {e}"))?;
        let records = batches.iter().flat_map(silt_record::RecordBatch::records).collect();
        Ok(RecordPage { records, next_offset, high_watermark })
    }
}

/// What a front agent asks a partition's writer to deliver to a group member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CollectRequest {
    /// Group.
    pub group: String,
    /// Member.
    pub member: String,
    /// Mode.
    pub mode: GroupMode,
    /// Partitions the member may take from that this writer writes.
    pub partitions: Vec<u32>,
    /// Most messages.
    pub max: u32,
    /// Most bytes of keys, values and headers.
    #[serde(default = "crate::limits::read_bytes_default")]
    pub max_bytes: usize,
    /// Whether the first message is delivered whatever its size (the poll has none yet).
    #[serde(default = "default_true")]
    pub at_least_one: bool,
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_record::{split_batches, Record};

    fn page(sizes: &[usize]) -> RecordPage {
        let records = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Record {
                offset: 100 + i as u64,
                timestamp_ms: 1_700_000_000_000 + i as i64,
                key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![b'a' + (i % 26) as u8; n])),
                headers: Vec::new(),
            })
            .collect();
        RecordPage { records, next_offset: 100 + sizes.len() as u64, high_watermark: 1000 }
    }

    fn body(page: RecordPage) -> (usize, Bytes) {
        let parts: Vec<Bytes> = page.into_body_parts().map(|p| p.expect("encodes")).collect();
        let n = parts.len();
        (n, Bytes::from(parts.concat()))
    }

    #[test]
    fn an_answer_is_sent_in_parts_of_whole_batches_holding_every_record_in_order() {
        // 3,000 records of 1 KiB (3 MiB), then one of 3 MiB (larger than a batch), then small ones.
        let mut sizes = vec![1024; 3000];
        sizes.push(3 << 20);
        sizes.extend([10; 50]);
        let want = page(&sizes).records;
        let (parts, bytes) = body(page(&sizes));
        assert!(parts >= 7, "{parts} parts");
        let batches = split_batches(bytes).expect("whole batches");
        let got: Vec<Record> = batches.iter().flat_map(|b| b.records()).collect();
        assert_eq!(got, want);
        for b in &batches {
            assert!(b.len_bytes() <= READ_BATCH_BYTES || b.record_count() == 1, "{} bytes", b.len_bytes());
        }
        // Nothing to send: no part at all.
        assert_eq!(body(page(&[])).0, 0);
    }
}
