//! [`HttpPeers`]: the [`Peer`] of agents in separate processes, over HTTP (the routes of
//! `crate::api`'s internal half and the public produce and replay routes).
//!
//! Forwarded requests carry [`FORWARDED_HEADER`]; an agent never forwards such a request again
//! (if it is not the writer either, the client gets `not_writer`), so a stale view of
//! metadata can cause an error but never a loop. Appends and reads travel as RecordBatch v2
//! bytes ([`RecordPage`] for reads, with the page's end in headers); deliveries to a group
//! member travel as JSON with base64 bytes ([`WireRecord`]).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;

use super::wire::{
    CollectRequest, RecordPage, ReplicaTarget, WireRecord, FORWARDED_HEADER, RECORD_BATCHES_TYPE,
};
use super::{Peer, Reachability, PEER_TIMEOUT, PROBE_TIMEOUT, REPAIR_TIMEOUT, REPLICA_TIMEOUT};
use crate::error::{ApiError, ErrorCode};
use crate::group_cursor::Delivered;
use crate::limits::{ReadLimit, READ_BYTES_MAX};
use crate::log::replica::HeldSegment;

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// The HTTP client agents use to reach each other.
#[derive(Debug, Clone)]
pub struct HttpPeers {
    http: reqwest::Client,
    me: String,
    reach: Reachability,
}

impl HttpPeers {
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
        HttpPeers { http, me: me.to_string(), reach: Reachability::default() }
    }

    fn reached(&self, agent: &str, answered: bool) {
        self.reach.reached(agent, answered);
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
                Err(match ErrorCode::parse(&error.code) {
                    Some(code) => ApiError::new(code, error.message),
                    // A code this agent does not know (from a newer one): a fault of the request
                    // stays one, anything else is taken for "try again".
                    None if status.is_client_error() => ApiError::new(
                        ErrorCode::InvalidArgument,
                        format!("{} (agent '{agent}' answered {status} {})", error.message, error.code),
                    ),
                    None => ApiError::unavailable(format!(
                        "{} (agent '{agent}' answered {status} {})",
                        error.message, error.code
                    )),
                })
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
}

#[async_trait::async_trait]
impl Peer for HttpPeers {
    fn unreachable_since(&self, agent: &str) -> Option<Instant> {
        self.reach.unreachable_since(agent)
    }

    async fn probe(&self, (agent, addr): (&str, &str)) -> bool {
        let request = self.http.get(Self::url(addr, "/health")).timeout(PROBE_TIMEOUT);
        let answered = request.send().await.is_ok_and(|r| r.status().is_success());
        if answered {
            self.reached(agent, true);
        }
        answered
    }

    async fn append(
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

    async fn read(
        &self,
        agent: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        self.page(agent, &format!("/v1/topics/{topic}/partitions/{partition}/batches"), offset, limit).await
    }

    async fn read_held(
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

    async fn replica_append(
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

    async fn replica_fence(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let request = self
            .http
            .post(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/fence")))
            .query(target);
        self.send_within(agent, addr, request, REPLICA_TIMEOUT).await
    }

    async fn replica_held(
        &self,
        (agent, addr): (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let request = self
            .http
            .get(Self::url(addr, &format!("/internal/v1/replicas/{topic}/{partition}/held")))
            .query(target);
        self.send_within(agent, addr, request, REPLICA_TIMEOUT).await
    }

    async fn replica_batches(
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

    async fn replica_repair(
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

    async fn offset_for_time(
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

    async fn collect(
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

    async fn ack(
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
