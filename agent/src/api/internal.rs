//! The routes other agents call: forwarded reads and deliveries, and replication (appends,
//! fences, batch copies, repairs). `crate::transport::http` is their client.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{batches_response, json_body, query, ApiResult};
use crate::agent::Agent;
use crate::error::{ApiError, ErrorCode};
use crate::limits::{read_bytes_default, ReadLimit, READ_BYTES_MAX, REPLAY_MAX};
use crate::transport::{CollectRequest, RecordPage, ReplicaTarget, WireRecord, RECORD_BATCHES_TYPE};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerReadParams {
    from_offset: u64,
    max: usize,
    #[serde(default = "read_bytes_default")]
    max_bytes: usize,
}

/// Another agent (or the compactor) reads what this agent holds locally of a partition,
/// whether or not it writes it.
pub(super) async fn peer_read_held(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<PeerReadParams>, QueryRejection>,
) -> ApiResult<Response> {
    let p = query(params)?;
    let limit = ReadLimit::new(p.max.clamp(1, REPLAY_MAX), p.max_bytes.clamp(1, READ_BYTES_MAX));
    let (records, next_offset, high_watermark) =
        agent.read_held(&topic, partition, p.from_offset, limit).await?;
    batches_response(RecordPage { records, next_offset, high_watermark })
}

/// The query of every replication request: the segment it is about, and what one kind of
/// request adds. (`#[serde(flatten)]` would read the numbers as strings from a query.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplicaQuery {
    topic_id: u64,
    epoch: u64,
    segment: u64,
    segment_epoch: u64,
    /// Appends: the writer's committed end before these batches.
    committed: Option<u64>,
    /// Batch reads: where to start.
    from: Option<u64>,
    /// Repairs: the agent to copy from.
    source: Option<String>,
}

impl ReplicaQuery {
    fn target(&self) -> ReplicaTarget {
        ReplicaTarget {
            topic_id: self.topic_id,
            epoch: self.epoch,
            segment: self.segment,
            segment_epoch: self.segment_epoch,
        }
    }
}

fn required<T>(value: Option<T>, name: &str) -> ApiResult<T> {
    value.ok_or_else(|| ApiError::new(ErrorCode::InvalidQuery, format!("the query needs '{name}'")))
}

/// A writer streams batches to a follower's replica.
pub(super) async fn replica_append(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplicaQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let p = query(params)?;
    let end = agent.replica_append(&topic, partition, p.target(), p.committed, body).await?;
    Ok(Json(serde_json::json!({ "end_offset": end })))
}

/// A recovering writer fences a replica and asks what it holds of a segment.
pub(super) async fn replica_fence(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplicaQuery>, QueryRejection>,
) -> ApiResult<Json<crate::log::replica::HeldSegment>> {
    let p = query(params)?;
    Ok(Json(agent.replica_fence(&topic, partition, p.target()).await?))
}

/// An agent asks what a replica holds of a sealed segment (to declare a range of it lost).
pub(super) async fn replica_held(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplicaQuery>, QueryRejection>,
) -> ApiResult<Json<crate::log::replica::HeldSegment>> {
    let p = query(params)?;
    Ok(Json(agent.replica_held(&topic, partition, p.target()).await?))
}

/// A recovering writer copies a segment's tail from a replica: whole batches as stored.
pub(super) async fn replica_batches(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplicaQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let p = query(params)?;
    let from = required(p.from, "from")?;
    let body = agent.replica_batches(&topic, partition, p.target(), from).await?;
    Ok(([(header::CONTENT_TYPE, RECORD_BATCHES_TYPE)], body).into_response())
}

/// Ensemble repair: this agent is to hold a new replica of a sealed segment, copied from
/// the agent `source`.
pub(super) async fn replica_repair(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplicaQuery>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let p = query(params)?;
    let source = required(p.source.clone(), "source")?;
    agent.replica_repair(&topic, partition, p.target(), &source).await?;
    Ok(Json(serde_json::json!({ "copied": true })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerTimeParams {
    time: i64,
}

/// Another agent looks up an offset by time in a partition this agent writes.
pub(super) async fn peer_offset_for_time(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<PeerTimeParams>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let p = query(params)?;
    let offset = agent.offset_for_time(&topic, partition, p.time, true).await?;
    Ok(Json(serde_json::json!({ "offset": offset })))
}

/// Another agent delivers messages of partitions this agent writes to a member polling there.
pub(super) async fn peer_collect(
    State(agent): State<Agent>,
    Path(topic): Path<String>,
    body: Result<Json<CollectRequest>, JsonRejection>,
) -> ApiResult<Json<Vec<WireRecord>>> {
    let ask = json_body(body)?;
    Ok(Json(agent.collect_for_peer(&topic, ask).await?))
}
