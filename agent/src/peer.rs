//! Requests from one agent to another: a client may talk to any agent, and the agent passes
//! what belongs to a partition another agent writes on to that agent.
//!
//! Forwarded requests carry [`FORWARDED_HEADER`]; an agent never forwards such a request again
//! (if it is not the writer either, the client gets `not_writer`), so a stale view of
//! metadata can cause an error but never a loop. Appends and reads travel as RecordBatch v2
//! bytes ([`RecordPage`] for reads, with the page's end in headers); deliveries to a group
//! member travel as JSON with base64 bytes ([`WireRecord`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_metadata::state::GroupMode;
use silt_record::{encode_records, split_batches, Header, Record};

use crate::error::{ApiError, ErrorCode};
use crate::group_cursor::Delivered;
use crate::limits::{ReadLimit, READ_BYTES_MAX};

/// Set on a request one agent forwards to another.
pub const FORWARDED_HEADER: &str = "x-silt-forwarded-by";
/// Longest a forwarded request may take beyond its own wait (a poll's timeout).
const PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a replica append or fence may take before the writer counts that replica as failed.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest copying one sealed segment to a new replica may take.
pub const REPAIR_TIMEOUT: Duration = Duration::from_secs(120);
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

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// How long an agent that did not answer (no connection, a timeout, a broken answer) counts
/// as unreachable from this one, unless it answers something meanwhile.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(10);

/// The HTTP client agents use to reach each other. It remembers which agents did not answer
/// lately: metadata says which agents are live (they reach metadata), not which ones this
/// agent can reach, and a writer cut off from some of them chooses its ensembles without them.
#[derive(Debug, Clone)]
pub struct Peers {
    http: reqwest::Client,
    me: String,
    unreachable: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Peers {
    /// A client that names this agent in [`FORWARDED_HEADER`].
    pub fn new(me: &str) -> Self {
        Self::with_source_ip(me, None)
    }

    /// A client whose connections leave from `source` (on hosts with several addresses), or
    /// from the address the OS chooses.
    pub fn with_source_ip(me: &str, source: Option<IpAddr>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .local_address(source)
            .build()
            .unwrap_or_default();
        Peers { http, me: me.to_string(), unreachable: Arc::default() }
    }

    /// Whether `agent` failed to answer within the last [`UNREACHABLE_FOR`] and has not
    /// answered since.
    pub fn is_unreachable(&self, agent: &str) -> bool {
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        match unreachable.get(agent) {
            Some(at) if at.elapsed() < UNREACHABLE_FOR => true,
            Some(_) => {
                unreachable.remove(agent);
                false
            }
            None => false,
        }
    }

    fn reached(&self, agent: &str, answered: bool) {
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        if answered {
            unreachable.remove(agent);
        } else {
            unreachable.insert(agent.to_string(), Instant::now());
        }
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        agent: &str,
        addr: &str,
        request: reqwest::RequestBuilder,
        wait: Duration,
    ) -> Result<T, ApiError> {
        self.send_within(agent, addr, request, wait + PEER_TIMEOUT).await
    }

    async fn send_within<T: serde::de::DeserializeOwned>(
        &self,
        agent: &str,
        addr: &str,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let (_, body) = self.send_raw(agent, addr, request, timeout).await?;
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::unavailable(format!("agent '{agent}' at {addr} answered nonsense: {e}")))
    }

    /// Sends a request; a success's headers and body, or the error the agent answered.
    async fn send_raw(
        &self,
        agent: &str,
        addr: &str,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<(reqwest::header::HeaderMap, Bytes), ApiError> {
        let reply =
            request.header(FORWARDED_HEADER, &self.me).timeout(timeout).send().await.map_err(|e| {
                self.reached(agent, false);
                ApiError::unavailable(format!("agent '{agent}' at {addr} did not answer: {e}"))
            })?;
        let status = reply.status();
        let headers = reply.headers().clone();
        let body = reply.bytes().await.map_err(|e| {
            self.reached(agent, false);
            ApiError::unavailable(format!("agent '{agent}' at {addr} broke off its answer: {e}"))
        })?;
        self.reached(agent, true);
        if status.is_success() {
            return Ok((headers, body));
        }
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(ErrorBody { error }) => {
                // A code this agent does not know (from a newer one) is taken for "try again".
                let code = ErrorCode::parse(&error.code).unwrap_or(ErrorCode::Unavailable);
                Err(ApiError::new(status, code, error.message))
            }
            Err(_) => Err(ApiError::unavailable(format!(
                "agent '{agent}' at {addr} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ))),
        }
    }

    fn url(addr: &str, path: &str) -> String {
        format!("http://{addr}{path}")
    }

    /// Appends a batch on the partition's writer; returns its first and last offset.
    pub async fn append(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        batch: Bytes,
    ) -> Result<(u64, u64), ApiError> {
        #[derive(Deserialize)]
        struct Range {
            base_offset: u64,
            last_offset: u64,
        }
        let request = self
            .http
            .post(Self::url(addr, &format!("/v1/topics/{topic}/partitions/{partition}/batches")))
            .header("content-type", RECORD_BATCHES_TYPE)
            .body(batch);
        let r: Range = self.send(agent, addr, request, Duration::ZERO).await?;
        Ok((r.base_offset, r.last_offset))
    }

    /// Reads records of a partition from its writer (which reads the archive too), as a
    /// replay through the writer would.
    pub async fn read(
        &self,
        agent: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        self.page(agent, &format!("/v1/topics/{topic}/partitions/{partition}/batches"), offset, limit).await
    }

    /// Reads records an agent holds in its local log of a partition, whether or not it writes
    /// the partition.
    pub async fn read_held(
        &self,
        agent: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        self.page(agent, &format!("/internal/v1/topics/{topic}/partitions/{partition}/held"), offset, limit)
            .await
    }

    async fn page(
        &self,
        (agent, addr): (&str, &str),
        path: &str,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        // The answering agent returns its first record whatever the byte limit; the caller
        // keeps what its own limit allows.
        let request = self.http.get(Self::url(addr, path)).query(&[
            ("from_offset", offset.to_string()),
            ("max", limit.records.to_string()),
            ("max_bytes", limit.bytes.clamp(1, READ_BYTES_MAX).to_string()),
        ]);
        let (headers, body) = self.send_raw(agent, addr, request, PEER_TIMEOUT).await?;
        RecordPage::decode(&headers, body)
            .map_err(|e| ApiError::unavailable(format!("agent '{agent}' at {addr} answered a bad read: {e}")))
    }

    /// Appends a writer's batches to a follower's replica; returns the end it holds.
    /// `committed` is the writer's committed end before these batches: the follower serves
    /// reads of the open segment up to there.
    pub async fn replica_append(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        committed: Option<u64>,
        batches: Bytes,
    ) -> Result<u64, ApiError> {
        #[derive(Deserialize)]
        struct End {
            end_offset: u64,
        }
        let mut request = self
            .http
            .post(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/append")))
            .query(target);
        if let Some(c) = committed {
            request = request.query(&[("committed", c)]);
        }
        let request = request.header("content-type", RECORD_BATCHES_TYPE).body(batches);
        let e: End = self.send_within(agent, addr, request, REPLICA_TIMEOUT).await?;
        Ok(e.end_offset)
    }

    /// Raises a replica's fence to `target.epoch` and returns what it holds of the segment.
    pub async fn replica_fence(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<crate::replica::HeldSegment, ApiError> {
        let request = self
            .http
            .post(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/fence")))
            .query(target);
        self.send_within(agent, addr, request, REPLICA_TIMEOUT).await
    }

    /// Reads whole batches of a replica's segment from `from` on, as stored (recovery copies
    /// a segment's tail with it); empty when the replica holds nothing there.
    pub async fn replica_batches(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        from: u64,
    ) -> Result<Bytes, ApiError> {
        let request = self
            .http
            .get(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/batches")))
            .query(target)
            .query(&[("from", from)]);
        let (_, body) = self.send_raw(agent, addr, request, REPLICA_TIMEOUT).await?;
        Ok(body)
    }

    /// Asks agent `to` to copy a sealed segment from agent `source` (ensemble repair).
    pub async fn replica_repair(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        source: &str,
    ) -> Result<(), ApiError> {
        let request = self
            .http
            .post(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/repair")))
            .query(target)
            .query(&[("source", source)]);
        let _: serde_json::Value = self.send_within(agent, addr, request, REPAIR_TIMEOUT).await?;
        Ok(())
    }

    /// The first offset at or after a time, from the partition's writer.
    pub async fn offset_for_time(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
    ) -> Result<u64, ApiError> {
        #[derive(Deserialize)]
        struct Offset {
            offset: u64,
        }
        let request = self
            .http
            .get(Self::url(addr, &format!("/internal/v1/topics/{topic}/partitions/{partition}/offset")))
            .query(&[("time", timestamp_ms.to_string())]);
        let o: Offset = self.send(agent, addr, request, Duration::ZERO).await?;
        Ok(o.offset)
    }

    /// Delivers messages of the writer's partitions to a group member (no waiting).
    pub async fn collect(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        req: &CollectRequest,
    ) -> Result<Vec<Delivered>, ApiError> {
        let request =
            self.http.post(Self::url(addr, &format!("/internal/v1/topics/{topic}/collect"))).json(req);
        let records: Vec<WireRecord> = self.send(agent, addr, request, Duration::ZERO).await?;
        records.into_iter().map(WireRecord::into_delivered).collect()
    }

    /// Acknowledges messages on their partitions' writer; `dry_run` only checks them.
    pub async fn ack(
        &self,
        (agent, addr): (&str, &str),
        group: &str,
        ids: &[String],
        dry_run: bool,
    ) -> Result<usize, ApiError> {
        #[derive(Deserialize)]
        struct Acked {
            acked: usize,
        }
        let request = self
            .http
            .post(Self::url(addr, &format!("/v1/groups/{group}/ack")))
            .query(&[("dry_run", dry_run.to_string())])
            .json(&serde_json::json!({ "ids": ids }));
        let a: Acked = self.send(agent, addr, request, Duration::ZERO).await?;
        Ok(a.acked)
    }
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
