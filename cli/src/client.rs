//! A Rust client for the agent's HTTP API, used by the `silt` command, the end-to-end tests
//! and the benchmark tool.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
pub use silt_agent::transport::RecordPage;

/// Errors the client returns.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an API error.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// HTTP status.
        status: u16,
        /// Stable error code.
        code: String,
        /// What went wrong.
        message: String,
    },
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the Silt agent at {url}: {source}")]
    Transport {
        /// Server URL.
        url: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// The server's answer did not parse.
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
}

impl ClientError {
    /// Whether trying again later may succeed (the server is down, restarting or busy).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Api { status, .. } => *status == 503 || *status == 429,
            ClientError::Transport { .. } => true,
            ClientError::Decode(_) => false,
        }
    }
}

/// A message to produce.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OutMessage {
    /// Explicit partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Key as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Value as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Headers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderOut>,
    /// Timestamp in ms since the Unix epoch (default: the agent's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
}

/// A header to produce.
#[derive(Debug, Clone, Serialize)]
pub struct HeaderOut {
    /// Header key.
    pub key: String,
    /// Header value.
    pub value: String,
}

/// A header as the server returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderIn {
    /// Header key.
    pub key: String,
    /// Value as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value as base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
}

/// A message as the server returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `topic/partition/offset`.
    pub id: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Timestamp, ms since the Unix epoch.
    pub timestamp: i64,
    /// Key as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Key as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// Value as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// Headers.
    #[serde(default)]
    pub headers: Vec<HeaderIn>,
    /// Delivery count (polls only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<u32>,
}

/// A poll request.
#[derive(Debug, Clone, Serialize)]
pub struct Poll {
    /// Group.
    pub group: String,
    /// Member id.
    pub member: String,
    /// `exclusive` or `shared`.
    pub mode: String,
    /// Most messages.
    pub max: u32,
    /// Most bytes of keys, values and headers (the agent's default, 8 MiB, when `None`); the
    /// first message comes back whatever its size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
    /// Longest wait.
    pub timeout_ms: u64,
    /// Session timeout.
    pub session_timeout_ms: u64,
}

/// A page of a replay.
#[derive(Debug, Clone, Deserialize)]
pub struct ReplayPage {
    /// Messages.
    pub messages: Vec<Message>,
    /// Where the next page starts.
    pub next_offset: u64,
    /// End of the partition when read.
    pub high_watermark: u64,
}

fn replay_query(
    from_offset: Option<u64>,
    from_time_ms: Option<i64>,
    max: usize,
    max_bytes: Option<usize>,
) -> Vec<(&'static str, String)> {
    let mut q = vec![("max", max.to_string())];
    if let Some(b) = max_bytes {
        q.push(("max_bytes", b.to_string()));
    }
    if let Some(o) = from_offset {
        q.push(("from_offset", o.to_string()));
    }
    if let Some(t) = from_time_ms {
        q.push(("from_time", t.to_string()));
    }
    q
}

/// Client for one agent.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Bytes of keys, values and headers a replay page may hold (`None`: the agent's default).
    read_max_bytes: Option<usize>,
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

impl Client {
    /// A client for the agent at `base` (`http://host:port`); a request that takes longer than
    /// two minutes fails.
    pub fn new(base: &str) -> Result<Client, ClientError> {
        Self::with_timeout(base, Duration::from_secs(120))
    }

    /// A client whose requests fail after `timeout` (a long poll needs more than its wait).
    pub fn with_timeout(base: &str, timeout: Duration) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .build()
            .map_err(|e| ClientError::Transport { url: base.to_string(), source: e })?;
        Ok(Client { base: base.trim_end_matches('/').to_string(), http, read_max_bytes: None })
    }

    /// Bounds every page [`replay`](Self::replay) and [`read_batches`](Self::read_batches) read
    /// to about `bytes` of keys, values and headers (the first message of a page comes whatever
    /// its size); without it the agent's default applies (8 MiB; at most 64 MiB).
    pub fn with_read_max_bytes(mut self, bytes: usize) -> Client {
        self.read_max_bytes = Some(bytes);
        self
    }

    /// The server URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, ClientError> {
        let (_, body) = self.send_raw(req).await?;
        if body.is_empty() {
            return serde_json::from_slice(b"null").map_err(|e| ClientError::Decode(e.to_string()));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Sends a request; a success's headers and body, or the API error answered.
    async fn send_raw(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(reqwest::header::HeaderMap, bytes::Bytes), ClientError> {
        let resp =
            req.send().await.map_err(|e| ClientError::Transport { url: self.base.clone(), source: e })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body =
            resp.bytes().await.map_err(|e| ClientError::Transport { url: self.base.clone(), source: e })?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(e) => {
                    ClientError::Api { status: status.as_u16(), code: e.error.code, message: e.error.message }
                }
                Err(_) => ClientError::Api {
                    status: status.as_u16(),
                    code: "http_error".into(),
                    message: String::from_utf8_lossy(&body).into_owned(),
                },
            });
        }
        Ok((headers, body))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<serde_json::Value, ClientError> {
        self.send(self.http.get(self.url("/health"))).await
    }

    /// Creates a topic.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: &BTreeMap<String, String>,
    ) -> Result<serde_json::Value, ClientError> {
        let body = serde_json::json!({ "name": name, "partitions": partitions, "config": config });
        self.send(self.http.post(self.url("/v1/topics")).json(&body)).await
    }

    /// Alters some of a topic's configs (Kafka-style names), all or none; answers the topic
    /// as it is after the change.
    pub async fn alter_topic_config(
        &self,
        name: &str,
        config: &BTreeMap<String, String>,
    ) -> Result<serde_json::Value, ClientError> {
        let body = serde_json::json!({ "config": config });
        self.send(self.http.patch(self.url(&format!("/v1/topics/{name}"))).json(&body)).await
    }

    /// Lists topics.
    pub async fn list_topics(&self) -> Result<serde_json::Value, ClientError> {
        self.send(self.http.get(self.url("/v1/topics"))).await
    }

    /// Describes a topic.
    pub async fn describe_topic(&self, name: &str) -> Result<serde_json::Value, ClientError> {
        self.send(self.http.get(self.url(&format!("/v1/topics/{name}")))).await
    }

    /// Deletes a topic.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ClientError> {
        let _: Option<serde_json::Value> =
            self.send(self.http.delete(self.url(&format!("/v1/topics/{name}")))).await?;
        Ok(())
    }

    /// Produces messages; returns their ids once durable.
    pub async fn produce(&self, topic: &str, messages: &[OutMessage]) -> Result<Vec<String>, ClientError> {
        #[derive(Deserialize)]
        struct Ids {
            ids: Vec<String>,
        }
        let body = serde_json::json!({ "messages": messages });
        let ids: Ids =
            self.send(self.http.post(self.url(&format!("/v1/topics/{topic}/messages"))).json(&body)).await?;
        Ok(ids.ids)
    }

    /// Produces one RecordBatch v2 to a partition; returns its first and last offset.
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: u32,
        batch: bytes::Bytes,
    ) -> Result<(u64, u64), ClientError> {
        #[derive(Deserialize)]
        struct Range {
            base_offset: u64,
            last_offset: u64,
        }
        let r: Range = self
            .send(
                self.http
                    .post(self.url(&format!("/v1/topics/{topic}/partitions/{partition}/batches")))
                    .header("content-type", silt_agent::transport::RECORD_BATCHES_TYPE)
                    .body(batch),
            )
            .await?;
        Ok((r.base_offset, r.last_offset))
    }

    /// Polls for messages.
    pub async fn poll(&self, topic: &str, poll: &Poll) -> Result<Vec<Message>, ClientError> {
        #[derive(Deserialize)]
        struct Messages {
            messages: Vec<Message>,
        }
        let m: Messages =
            self.send(self.http.post(self.url(&format!("/v1/topics/{topic}/poll"))).json(poll)).await?;
        Ok(m.messages)
    }

    /// Acknowledges messages; returns how many were newly acknowledged.
    pub async fn ack(&self, group: &str, ids: &[String]) -> Result<u64, ClientError> {
        #[derive(Deserialize)]
        struct Acked {
            acked: u64,
        }
        let body = serde_json::json!({ "ids": ids });
        let a: Acked =
            self.send(self.http.post(self.url(&format!("/v1/groups/{group}/ack"))).json(&body)).await?;
        Ok(a.acked)
    }

    /// Leaves a group.
    pub async fn leave(&self, group: &str, topic: &str, member: &str) -> Result<(), ClientError> {
        let body = serde_json::json!({ "topic": topic, "member": member });
        let _: Option<serde_json::Value> =
            self.send(self.http.post(self.url(&format!("/v1/groups/{group}/leave"))).json(&body)).await?;
        Ok(())
    }

    /// Reads a partition from an offset (or time) without a group, as JSON.
    pub async fn replay(
        &self,
        topic: &str,
        partition: u32,
        from_offset: Option<u64>,
        from_time_ms: Option<i64>,
        max: usize,
    ) -> Result<ReplayPage, ClientError> {
        self.send(
            self.http
                .get(self.url(&format!("/v1/topics/{topic}/partitions/{partition}/messages")))
                .query(&replay_query(from_offset, from_time_ms, max, self.read_max_bytes)),
        )
        .await
    }

    /// Reads a partition from an offset (or time) without a group, as record batches: what
    /// [`replay`](Self::replay) reads, without JSON on either side.
    pub async fn read_batches(
        &self,
        topic: &str,
        partition: u32,
        from_offset: Option<u64>,
        from_time_ms: Option<i64>,
        max: usize,
    ) -> Result<RecordPage, ClientError> {
        let (headers, body) = self
            .send_raw(
                self.http
                    .get(self.url(&format!("/v1/topics/{topic}/partitions/{partition}/batches")))
                    .query(&replay_query(from_offset, from_time_ms, max, self.read_max_bytes)),
            )
            .await?;
        RecordPage::decode(&headers, body).map_err(ClientError::Decode)
    }

    /// The archived objects of a topic.
    pub async fn archive_list(&self, topic: &str) -> Result<Vec<serde_json::Value>, ClientError> {
        #[derive(Deserialize)]
        struct Objects {
            objects: Vec<serde_json::Value>,
        }
        let o: Objects = self.send(self.http.get(self.url(&format!("/v1/topics/{topic}/archive")))).await?;
        Ok(o.objects)
    }

    /// Describes a group.
    pub async fn describe_group(&self, group: &str) -> Result<serde_json::Value, ClientError> {
        self.send(self.http.get(self.url(&format!("/v1/groups/{group}")))).await
    }

    /// Fetches `/metrics` as text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let resp = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .map_err(|e| ClientError::Transport { url: self.base.clone(), source: e })?;
        resp.text().await.map_err(|e| ClientError::Transport { url: self.base.clone(), source: e })
    }
}
