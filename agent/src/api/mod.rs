//! The agent's HTTP/JSON API (documented in `docs/api.md`): the public routes here, the ones
//! other agents call in `internal.rs`; and the HTTP status every [`ErrorCode`] is answered
//! with ([`status_of`]), the only place the agent names HTTP statuses.

mod internal;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::{Deserialize, Serialize};
use silt_metadata::state::{GroupMode, Topic};
use silt_record::{Header, MessageId, Record};

use crate::agent::{Agent, PollRequest, ProduceMessage};
use crate::error::{ApiError, ErrorCode};
use crate::group_cursor::Delivered;
use crate::limits::{check_max_bytes, read_bytes_default, ReadLimit, REPLAY_MAX, REQUEST_BYTES_MAX};
use crate::transport::{
    RecordPage, FORWARDED_HEADER, HIGH_WATERMARK_HEADER, NEXT_OFFSET_HEADER, RECORD_BATCHES_TYPE,
};

/// Builds the router for an agent.
pub fn router(agent: Agent) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/topics", post(create_topic).get(list_topics))
        .route("/v1/topics/{topic}", get(describe_topic).delete(delete_topic).patch(alter_topic))
        .route("/v1/topics/{topic}/messages", post(produce))
        .route("/v1/topics/{topic}/partitions/{partition}/batches", post(produce_batch).get(replay_batches))
        .route("/v1/topics/{topic}/partitions/{partition}/messages", get(replay))
        .route("/v1/topics/{topic}/poll", post(poll))
        .route("/v1/topics/{topic}/archive", get(archive_list))
        .route("/v1/groups/{group}", get(describe_group))
        .route("/v1/groups/{group}/ack", post(ack))
        .route("/v1/groups/{group}/leave", post(leave))
        .route(
            "/internal/v1/topics/{topic}/partitions/{partition}/offset",
            get(internal::peer_offset_for_time),
        )
        .route("/internal/v1/topics/{topic}/partitions/{partition}/held", get(internal::peer_read_held))
        .route("/internal/v1/topics/{topic}/collect", post(internal::peer_collect))
        .route("/internal/v1/replicas/{topic}/{partition}/append", post(internal::replica_append))
        .route("/internal/v1/replicas/{topic}/{partition}/fence", post(internal::replica_fence))
        .route("/internal/v1/replicas/{topic}/{partition}/batches", get(internal::replica_batches))
        .route("/internal/v1/replicas/{topic}/{partition}/held", get(internal::replica_held))
        .route("/internal/v1/replicas/{topic}/{partition}/repair", post(internal::replica_repair))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(REQUEST_BYTES_MAX))
        .with_state(agent)
}

type ApiResult<T> = Result<T, ApiError>;

/// The HTTP status an error of `code` is answered with.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::EmptyRequest
        | ErrorCode::InvalidAck
        | ErrorCode::InvalidArgument
        | ErrorCode::InvalidConfig
        | ErrorCode::InvalidId
        | ErrorCode::InvalidJson
        | ErrorCode::InvalidMax
        | ErrorCode::InvalidMaxBytes
        | ErrorCode::InvalidMessage
        | ErrorCode::InvalidQuery
        | ErrorCode::InvalidRecordBatch
        | ErrorCode::InvalidSessionTimeout
        | ErrorCode::InvalidTimeout
        | ErrorCode::InvalidTopicName
        | ErrorCode::NotDelivered
        | ErrorCode::OffsetOutOfRange
        | ErrorCode::TooManyMessages => StatusCode::BAD_REQUEST,
        ErrorCode::NotFound
        | ErrorCode::UnknownGroup
        | ErrorCode::UnknownPartition
        | ErrorCode::UnknownTopic => StatusCode::NOT_FOUND,
        ErrorCode::Fenced
        | ErrorCode::GroupModeMismatch
        | ErrorCode::ReplicaDiverged
        | ErrorCode::TopicExists => StatusCode::CONFLICT,
        ErrorCode::MessageTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::NotWriter => StatusCode::MISDIRECTED_REQUEST,
        ErrorCode::DiskFailed | ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::CorruptData | ErrorCode::Internal | ErrorCode::StorageError => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a ApiError,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (status_of(self.code), Json(ErrorBody { error: &self })).into_response()
    }
}

/// Whether another agent forwarded this request (then it is never forwarded again).
fn forwarded(headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    body.map(|Json(v)| v).map_err(|e| ApiError::new(ErrorCode::InvalidJson, e.body_text()))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(v)| v).map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint; see docs/api.md for the API")
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn metrics(State(agent): State<Agent>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        agent.metrics().encode(),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTopic {
    name: String,
    #[serde(default = "one")]
    partitions: u32,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterTopic {
    config: BTreeMap<String, String>,
}

/// A topic as the API shows it.
#[derive(Serialize)]
pub struct TopicView {
    name: String,
    id: u64,
    config: BTreeMap<String, String>,
    partitions: Vec<PartitionView>,
}

#[derive(Serialize)]
struct PartitionView {
    partition: u32,
    writer: Option<String>,
    epoch: u64,
    high_watermark: Option<u64>,
    segments: Vec<silt_metadata::state::Segment>,
}

fn topic_view(t: Topic, hwms: Option<Vec<u64>>) -> TopicView {
    TopicView {
        name: t.name,
        id: t.id,
        config: t.config.to_named(),
        partitions: t
            .partitions
            .into_iter()
            .enumerate()
            .map(|(i, p)| PartitionView {
                partition: i as u32,
                writer: p.writer,
                epoch: p.epoch,
                high_watermark: hwms.as_ref().and_then(|h| h.get(i).copied()),
                segments: p.segments.into_values().collect(),
            })
            .collect(),
    }
}

async fn create_topic(
    State(agent): State<Agent>,
    body: Result<Json<CreateTopic>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<TopicView>)> {
    let req = json_body(body)?;
    let topic = agent.create_topic(&req.name, req.partitions, req.config).await?;
    Ok((StatusCode::CREATED, Json(topic_view(topic, None))))
}

async fn list_topics(State(agent): State<Agent>) -> ApiResult<Json<serde_json::Value>> {
    let topics = agent.list_topics().await?;
    let list: Vec<_> = topics
        .into_iter()
        .map(|t| serde_json::json!({ "name": t.name, "partitions": t.partitions.len() }))
        .collect();
    Ok(Json(serde_json::json!({ "topics": list })))
}

async fn describe_topic(State(agent): State<Agent>, Path(topic): Path<String>) -> ApiResult<Json<TopicView>> {
    let (t, hwms) = agent.describe_topic(&topic).await?;
    Ok(Json(topic_view(t, Some(hwms))))
}

async fn alter_topic(
    State(agent): State<Agent>,
    Path(topic): Path<String>,
    body: Result<Json<AlterTopic>, JsonRejection>,
) -> ApiResult<Json<TopicView>> {
    let req = json_body(body)?;
    let t = agent.alter_topic_config(&topic, req.config).await?;
    Ok(Json(topic_view(t, None)))
}

async fn delete_topic(State(agent): State<Agent>, Path(topic): Path<String>) -> ApiResult<StatusCode> {
    agent.delete_topic(&topic).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A header in JSON: the value as UTF-8 text, or base64 when it is not text.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderJson {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_b64: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProduceJson {
    messages: Vec<MessageJson>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageJson {
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_b64: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_b64: Option<String>,
    #[serde(default)]
    headers: Vec<HeaderJson>,
    #[serde(default)]
    timestamp: Option<i64>,
}

fn text_or_b64(i: usize, what: &str, text: Option<String>, b64: Option<String>) -> ApiResult<Option<Bytes>> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(ApiError::new(
            ErrorCode::InvalidMessage,
            format!("message {i}: give {what} or {what}_b64, not both"),
        )),
        (Some(t), None) => Ok(Some(Bytes::from(t))),
        (None, Some(b)) => B64.decode(b.as_bytes()).map(|v| Some(Bytes::from(v))).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidMessage,
                format!("message {i}: {what}_b64 is not valid base64: {e}"),
            )
        }),
        (None, None) => Ok(None),
    }
}

async fn produce(
    State(agent): State<Agent>,
    Path(topic): Path<String>,
    body: Result<Json<ProduceJson>, JsonRejection>,
) -> ApiResult<Json<IdsOut>> {
    let req = json_body(body)?;
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let mut headers = Vec::with_capacity(m.headers.len());
        for h in m.headers {
            headers.push(Header { key: h.key, value: text_or_b64(i, "header value", h.value, h.value_b64)? });
        }
        messages.push(ProduceMessage {
            partition: m.partition,
            key: text_or_b64(i, "key", m.key, m.key_b64)?,
            value: text_or_b64(i, "value", m.value, m.value_b64)?,
            headers,
            timestamp_ms: m.timestamp,
        });
    }
    let ids = agent.produce(&topic, messages).await?;
    Ok(Json(IdsOut { ids: ids.iter().map(MessageId::to_string).collect() }))
}

async fn produce_batch(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let (base, last) = agent.produce_batch(&topic, partition, body, forwarded(&headers)).await?;
    Ok(Json(serde_json::json!({
        "base_offset": base,
        "last_offset": last,
        "first_id": MessageId::new(topic, partition, base).to_string(),
    })))
}

/// A message as the API returns it.
#[derive(Serialize)]
pub struct MessageOut {
    id: String,
    topic: String,
    partition: u32,
    offset: u64,
    timestamp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Utf8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_b64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Utf8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_b64: Option<String>,
    headers: Vec<HeaderJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery: Option<u32>,
}

/// Text in a record's own bytes (checked to be UTF-8 when made): written out as a JSON string
/// without a copy.
struct Utf8(Bytes);

impl Serialize for Utf8 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(std::str::from_utf8(&self.0).map_err(serde::ser::Error::custom)?)
    }
}

/// Bytes as UTF-8 text when they are, else as base64.
fn split(bytes: Option<Bytes>) -> (Option<Utf8>, Option<String>) {
    match bytes {
        None => (None, None),
        Some(b) if std::str::from_utf8(&b).is_ok() => (Some(Utf8(b)), None),
        Some(b) => (None, Some(B64.encode(&b))),
    }
}

/// A produce's answer: one id per message, in order.
#[derive(Serialize)]
struct IdsOut {
    ids: Vec<String>,
}

/// Messages as polls and replays answer them, written out straight from the messages.
#[derive(Serialize)]
struct MessagesOut {
    messages: Vec<MessageOut>,
    /// Replays: where the next page starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_offset: Option<u64>,
    /// Replays: the partition's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    high_watermark: Option<u64>,
}

/// A record as the JSON API shows it: key, value and header values as text when they are UTF-8,
/// as base64 (`*_b64`) when not. `silt replay` prints the same.
pub fn message_out(topic: &str, partition: u32, record: Record, delivery: Option<u32>) -> MessageOut {
    let (key, key_b64) = split(record.key);
    let (value, value_b64) = split(record.value);
    MessageOut {
        id: MessageId::new(topic, partition, record.offset).to_string(),
        topic: topic.to_string(),
        partition,
        offset: record.offset,
        timestamp: record.timestamp_ms,
        key,
        key_b64,
        value,
        value_b64,
        headers: record
            .headers
            .into_iter()
            .map(|h| {
                let (value, value_b64) = split(h.value);
                let value = value.map(|text| String::from_utf8_lossy(&text.0).into_owned());
                HeaderJson { key: h.key, value, value_b64 }
            })
            .collect(),
        delivery,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayParams {
    #[serde(default)]
    from_offset: Option<u64>,
    #[serde(default)]
    from_time: Option<i64>,
    #[serde(default = "replay_default_max")]
    max: usize,
    #[serde(default = "read_bytes_default")]
    max_bytes: usize,
}

fn replay_default_max() -> usize {
    1000
}

/// What a replay asks for, checked; the records from there.
async fn replay_page(
    agent: &Agent,
    topic: &str,
    partition: u32,
    params: Result<Query<ReplayParams>, QueryRejection>,
    forwarded: bool,
) -> ApiResult<RecordPage> {
    let p = query(params)?;
    if p.max == 0 || p.max > REPLAY_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidMax,
            format!("max must be between 1 and {REPLAY_MAX}, got {}", p.max),
        ));
    }
    check_max_bytes(p.max_bytes)?;
    let from = match (p.from_offset, p.from_time) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(ErrorCode::InvalidQuery, "give from_offset or from_time, not both"));
        }
        (Some(o), None) => o,
        (None, Some(t)) => agent.offset_for_time(topic, partition, t, forwarded).await?,
        (None, None) => 0,
    };
    let limit = ReadLimit::new(p.max, p.max_bytes);
    let (records, next_offset, high_watermark) = agent.read(topic, partition, from, limit, forwarded).await?;
    Ok(RecordPage { records, next_offset, high_watermark })
}

async fn replay(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    params: Result<Query<ReplayParams>, QueryRejection>,
) -> ApiResult<Json<MessagesOut>> {
    let page = replay_page(&agent, &topic, partition, params, false).await?;
    let messages: Vec<MessageOut> =
        page.records.into_iter().map(|r| message_out(&topic, partition, r, None)).collect();
    Ok(Json(MessagesOut {
        messages,
        next_offset: Some(page.next_offset),
        high_watermark: Some(page.high_watermark),
    }))
}

/// A replay answered as record batches (what the JSON replay holds, without the JSON).
/// Other agents read partitions this agent writes through it too.
async fn replay_batches(
    State(agent): State<Agent>,
    Path((topic, partition)): Path<(String, u32)>,
    headers: axum::http::HeaderMap,
    params: Result<Query<ReplayParams>, QueryRejection>,
) -> ApiResult<Response> {
    let page = replay_page(&agent, &topic, partition, params, forwarded(&headers)).await?;
    batches_response(page)
}

/// A [`RecordPage`] as an answer: the batches, with where the page ends in headers.
fn batches_response(page: RecordPage) -> ApiResult<Response> {
    let (next_offset, high_watermark) = (page.next_offset, page.high_watermark);
    let body = axum::body::Body::from_stream(futures::stream::iter(page.into_body_parts()));
    Ok((
        [
            (header::CONTENT_TYPE, RECORD_BATCHES_TYPE.to_string()),
            (HeaderName::from_static(NEXT_OFFSET_HEADER), next_offset.to_string()),
            (HeaderName::from_static(HIGH_WATERMARK_HEADER), high_watermark.to_string()),
        ],
        body,
    )
        .into_response())
}

/// One archived object as `silt archive ls` shows it.
#[derive(Serialize)]
struct ArchivedObject {
    partition: u32,
    base_offset: u64,
    last_offset: Option<u64>,
    records: u64,
    bytes: u64,
    raw_bytes: u64,
    min_timestamp: Option<i64>,
    max_timestamp: Option<i64>,
    archived_at: Option<u64>,
    object_key: Option<String>,
}

async fn archive_list(
    State(agent): State<Agent>,
    Path(topic): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let (t, _) = agent.describe_topic(&topic).await?;
    let objects: Vec<ArchivedObject> = t
        .partitions
        .into_iter()
        .enumerate()
        .flat_map(|(p, part)| {
            part.segments
                .into_values()
                .filter(|s| s.state == silt_metadata::state::SegmentState::Archived)
                .map(move |s| ArchivedObject {
                    partition: p as u32,
                    base_offset: s.base_offset,
                    last_offset: s.last_offset,
                    records: s.record_count,
                    bytes: s.object_bytes,
                    raw_bytes: s.size_bytes,
                    min_timestamp: s.min_timestamp_ms,
                    max_timestamp: s.max_timestamp_ms,
                    archived_at: s.archived_ms,
                    object_key: s.object_key,
                })
        })
        .collect();
    Ok(Json(serde_json::json!({ "objects": objects })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PollJson {
    group: String,
    #[serde(default = "default_member")]
    member: String,
    #[serde(default = "default_mode")]
    mode: GroupMode,
    #[serde(default = "default_poll_max")]
    max: u32,
    #[serde(default = "read_bytes_default")]
    max_bytes: usize,
    #[serde(default)]
    timeout_ms: u64,
    #[serde(default = "default_session_ms")]
    session_timeout_ms: u64,
}

fn default_member() -> String {
    "default".into()
}
fn default_mode() -> GroupMode {
    GroupMode::Exclusive
}
fn default_poll_max() -> u32 {
    100
}
fn default_session_ms() -> u64 {
    30_000
}

async fn poll(
    State(agent): State<Agent>,
    Path(topic): Path<String>,
    body: Result<Json<PollJson>, JsonRejection>,
) -> ApiResult<Json<MessagesOut>> {
    let req = json_body(body)?;
    let delivered = agent
        .poll(PollRequest {
            topic: topic.clone(),
            group: req.group,
            member: req.member,
            mode: req.mode,
            max: req.max,
            max_bytes: req.max_bytes,
            timeout: Duration::from_millis(req.timeout_ms),
            session_timeout: Duration::from_millis(req.session_timeout_ms),
        })
        .await?;
    let messages: Vec<MessageOut> = delivered
        .into_iter()
        .map(|Delivered { partition, record, delivery }| {
            message_out(&topic, partition, record, Some(delivery))
        })
        .collect();
    Ok(Json(MessagesOut { messages, next_offset: None, high_watermark: None }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckJson {
    ids: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckParams {
    #[serde(default)]
    dry_run: bool,
}

async fn ack(
    State(agent): State<Agent>,
    Path(group): Path<String>,
    headers: axum::http::HeaderMap,
    params: Result<Query<AckParams>, QueryRejection>,
    body: Result<Json<AckJson>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let params = query(params)?;
    let req = json_body(body)?;
    let acked = agent.ack(&group, &req.ids, params.dry_run, forwarded(&headers)).await?;
    Ok(Json(serde_json::json!({ "acked": acked })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaveJson {
    topic: String,
    member: String,
}

async fn leave(
    State(agent): State<Agent>,
    Path(group): Path<String>,
    body: Result<Json<LeaveJson>, JsonRejection>,
) -> ApiResult<StatusCode> {
    let req = json_body(body)?;
    agent.leave(&group, &req.topic, &req.member).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn describe_group(
    State(agent): State<Agent>,
    Path(group): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let (mode, lags, members) = agent.describe_group(&group).await?;
    let topics: BTreeMap<String, serde_json::Value> = lags
        .into_iter()
        .map(|(topic, partitions)| {
            let total: u64 = partitions.iter().map(|p| p.lag).sum();
            let m = members.get(&topic).cloned().unwrap_or_default();
            (topic, serde_json::json!({ "members": m, "lag": total, "partitions": partitions }))
        })
        .collect();
    Ok(Json(serde_json::json!({ "group": group, "mode": mode, "topics": topics })))
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    agent: Agent,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(agent)).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use silt_record::Header;

    use super::*;

    #[test]
    fn messages_are_written_as_text_when_utf8_and_as_base64_when_not() {
        let record = |key: Option<&[u8]>, value: Option<&[u8]>| Record {
            offset: 7,
            timestamp_ms: 1_000,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: vec![
                Header { key: "text".into(), value: Some(Bytes::from_static("ü\"\n".as_bytes())) },
                Header { key: "binary".into(), value: Some(Bytes::from_static(&[0xff, 0])) },
                Header { key: "none".into(), value: None },
            ],
        };
        let page = MessagesOut {
            messages: vec![
                message_out("t", 2, record(Some(b"k"), Some("h\u{e9}llo \"q\"\n".as_bytes())), Some(3)),
                message_out("t", 2, record(None, Some(&[0xc3, 0x28])), None),
                message_out("t", 2, record(Some(&[0x80]), None), None),
            ],
            next_offset: Some(8),
            high_watermark: None,
        };
        let json: serde_json::Value = serde_json::from_slice(&serde_json::to_vec(&page).unwrap()).unwrap();
        let headers = serde_json::json!([
            { "key": "text", "value": "ü\"\n" },
            { "key": "binary", "value_b64": "/wA=" },
            { "key": "none" },
        ]);
        assert_eq!(
            json,
            serde_json::json!({
                "messages": [
                    { "id": "t/2/7", "topic": "t", "partition": 2, "offset": 7, "timestamp": 1000,
                      "key": "k", "value": "h\u{e9}llo \"q\"\n", "headers": headers, "delivery": 3 },
                    { "id": "t/2/7", "topic": "t", "partition": 2, "offset": 7, "timestamp": 1000,
                      "value_b64": "wyg=", "headers": headers },
                    { "id": "t/2/7", "topic": "t", "partition": 2, "offset": 7, "timestamp": 1000,
                      "key_b64": "gA==", "headers": headers },
                ],
                "next_offset": 8,
            })
        );
    }

    #[test]
    fn every_code_is_answered_with_the_status_of_whose_fault_it_is() {
        for code in ErrorCode::ALL {
            let status = status_of(code).as_u16();
            let name = code.as_str();
            if name.starts_with("invalid_") {
                assert_eq!(status, 400, "{name}");
            }
            if name.starts_with("unknown_") {
                assert_eq!(status, 404, "{name}");
            }
            // Clients retry a 503 and nothing else of the 5xx: every code that means "try again"
            // is one, and no fault of the request is.
            let retry = matches!(code, ErrorCode::Unavailable | ErrorCode::DiskFailed);
            assert_eq!(status == 503, retry, "{name}");
            assert!((400..600).contains(&status), "{name}: {status}");
        }
        let response = ApiError::new(ErrorCode::NotWriter, "m").into_response();
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
    }

    #[test]
    fn docs_api_md_lists_every_code_under_its_status() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md")).unwrap();
        let rows: Vec<(u16, &str)> = doc
            .lines()
            .filter_map(|l| {
                let mut cells = l.strip_prefix("| ")?.splitn(2, " | ");
                Some((cells.next()?.parse().ok()?, cells.next()?))
            })
            .collect();
        for code in ErrorCode::ALL {
            let quoted = format!("`{}`", code.as_str());
            let listed: Vec<u16> =
                rows.iter().filter(|(_, r)| r.contains(&quoted)).map(|(s, _)| *s).collect();
            assert_eq!(listed, [status_of(code).as_u16()], "docs/api.md lists {quoted} under {listed:?}");
        }
    }
}
