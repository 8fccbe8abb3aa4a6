//! [`MetadataClient`]: talks to a metadata cluster over its HTTP API ([`crate::api`]) from
//! another process (agents, the compactor, `silt cluster`).
//!
//! It knows the addresses of some nodes and sends each request to the node it believes leads
//! (learned from the answers' [`LEADER_HEADER`], when the leader is one of those nodes); any
//! node would do, since nodes forward to the leader. Failures are retried on the next node with exponential backoff, within a total time
//! limit ([`MetadataClientOptions::timeout`]):
//! - reads and status: every failure is retried;
//! - writes and membership changes: only failures that certainly changed nothing (no
//!   connection, or a 503 whose outcome is `not_applied`). A write that was sent and got no
//!   answer, or whose outcome the cluster does not know, fails at once with
//!   [`MetadataError::Unavailable`] saying so: retrying a command that is not idempotent could
//!   apply it twice.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::api::{
    Change, ErrorBody, MembersRequest, Outcome, StateDelta, StateReply, LEADER_HEADER, MEMBERS_PATH,
    STATE_PATH, STATUS_PATH, TIMEOUT_HEADER, WRITE_PATH,
};
use crate::node_status::{Member, NodeStatus};
use crate::raft::http_network::{base_url, root_cause};
use crate::raft::types::NodeId;
use crate::state::{Command, Response};
use crate::MetadataError;

/// The node answers this much before the client's own timeout, so its answer arrives.
const SERVER_MARGIN: Duration = Duration::from_millis(250);
/// Opening a connection to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Characters of an unexpected answer quoted in an error.
const BODY_QUOTE_CHARS_MAX: usize = 300;

/// Time limits and backoff of a [`MetadataClient`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataClientOptions {
    /// Total time a write, read or status call may take, retries included.
    pub timeout: Duration,
    /// Total time a membership change may take (the new node must catch up first).
    pub membership_timeout: Duration,
    /// First sleep between retries; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest sleep between retries.
    pub backoff_max: Duration,
}

impl Default for MetadataClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            membership_timeout: Duration::from_secs(120),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        }
    }
}

/// A client of a metadata cluster. Cloning is cheap; clones share connections and the leader
/// they learned.
#[derive(Debug, Clone)]
pub struct MetadataClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    /// Base URLs (`http://host:port`) of the nodes given.
    nodes: Vec<String>,
    /// The base URL of the node believed to lead.
    leader: Mutex<Option<String>>,
    options: MetadataClientOptions,
}

/// Whether a failed call may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads: always.
    Always,
    /// Writes: only when it certainly changed nothing.
    IfNotApplied,
}

impl MetadataClient {
    /// A client of the nodes at `addrs` (`host:port` or `http://host:port`), with default
    /// options.
    pub fn new(addrs: Vec<String>) -> Result<MetadataClient, MetadataError> {
        Self::with_options(addrs, MetadataClientOptions::default())
    }

    /// [`new`](Self::new) with explicit options.
    pub fn with_options(
        addrs: Vec<String>,
        options: MetadataClientOptions,
    ) -> Result<MetadataClient, MetadataError> {
        let nodes: Vec<String> =
            addrs.iter().map(|a| a.trim()).filter(|a| !a.is_empty()).map(base_url).collect();
        if nodes.is_empty() {
            return Err(MetadataError::InvalidArgument(
                "no metadata node address given (expected host:port[,host:port...])".into(),
            ));
        }
        let http =
            reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).build().map_err(
                |e| MetadataError::Unavailable(format!("cannot build the metadata HTTP client: {e}")),
            )?;
        Ok(MetadataClient { inner: Arc::new(Inner { http, nodes, leader: Mutex::new(None), options }) })
    }

    /// The nodes' base URLs, as given.
    pub fn nodes(&self) -> &[String] {
        &self.inner.nodes
    }

    /// Commits `cmd` and returns what applying it produced; a refused command is `Err` with its
    /// domain error (like [`MetadataNode::write`](crate::MetadataNode::write)).
    ///
    /// `Unavailable` when no leader with a quorum answered in time (then nothing was applied), or
    /// when the write was sent but its outcome is unknown (the message says so; it may still be
    /// applied).
    pub async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        let response: Response = self
            .call(Method::POST, WRITE_PATH, Some(&cmd), self.inner.options.timeout, Retry::IfNotApplied)
            .await?;
        response.into_result()
    }

    /// A linearizable read of the whole state: it includes every write acknowledged before the
    /// call.
    pub async fn read_state(&self) -> Result<StateReply, MetadataError> {
        self.call::<(), _>(Method::GET, STATE_PATH, None, self.inner.options.timeout, Retry::Always).await
    }

    /// Like [`read_state`](Self::read_state), but the state comes only if something was applied
    /// after index `after` (the caller's copy is current otherwise).
    pub async fn read_state_after(&self, after: u64) -> Result<StateDelta, MetadataError> {
        let path = format!("{STATE_PATH}?after={after}");
        self.call::<(), _>(Method::GET, &path, None, self.inner.options.timeout, Retry::Always).await
    }

    /// Like [`read_state_after`](Self::read_state_after), but answered with the commands
    /// applied after `after` (in `changes`) while the leader keeps them, so that a copy of the
    /// state at `after` catches up without fetching it whole.
    /// A change this version cannot decode (a command a newer version added) is an
    /// `InvalidArgument` error: the caller reads the whole state instead.
    pub async fn read_changes_after(&self, after: u64) -> Result<StateDelta, MetadataError> {
        let path = format!("{STATE_PATH}?after={after}&changes=true");
        let raw: RawStateDelta =
            self.call::<(), _>(Method::GET, &path, None, self.inner.options.timeout, Retry::Always).await?;
        raw.decode()
    }

    /// The status of the first node that answers (the leader, if known).
    pub async fn status(&self) -> Result<NodeStatus, MetadataError> {
        self.call::<(), _>(Method::GET, STATUS_PATH, None, self.inner.options.timeout, Retry::Always).await
    }

    /// The status of the node at `addr` (`host:port`), asked once within `timeout`.
    pub async fn status_of(&self, addr: &str, timeout: Duration) -> Result<NodeStatus, MetadataError> {
        let base = base_url(addr);
        match self.send::<()>(&base, Method::GET, STATUS_PATH, None, timeout).await {
            Ok((StatusCode::OK, body)) => decode(&base, &body),
            Ok((status, body)) => Err(MetadataError::Unavailable(unexpected(&base, status, &body))),
            Err(e) => Err(MetadataError::Unavailable(format!(
                "metadata node {base} did not answer: {}",
                root_cause(&e)
            ))),
        }
    }

    /// The status of every node given, asked concurrently, in the order given.
    pub async fn statuses(&self, timeout: Duration) -> Vec<(String, Result<NodeStatus, MetadataError>)> {
        let asks =
            self.inner.nodes.iter().map(|n| async move { (n.clone(), self.status_of(n, timeout).await) });
        futures::future::join_all(asks).await
    }

    /// Adds node `id` listening at `addr` (`host:port`): as a learner, then, once it caught up,
    /// as a voter. Returns the leader's status afterwards.
    pub async fn add_node(&self, id: NodeId, addr: &str) -> Result<NodeStatus, MetadataError> {
        let request = MembersRequest::Add(Member { id, addr: addr.trim().to_string() });
        self.call(
            Method::POST,
            MEMBERS_PATH,
            Some(&request),
            self.inner.options.membership_timeout,
            Retry::IfNotApplied,
        )
        .await
    }

    /// Removes node `id` from the membership. Returns the leader's status afterwards.
    pub async fn remove_node(&self, id: NodeId) -> Result<NodeStatus, MetadataError> {
        let request = MembersRequest::Remove(id);
        self.call(
            Method::POST,
            MEMBERS_PATH,
            Some(&request),
            self.inner.options.membership_timeout,
            Retry::IfNotApplied,
        )
        .await
    }

    /// Sends the request to the leader or the next node until it succeeds, fails for good, or
    /// `total` has passed.
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        total: Duration,
        retry: Retry,
    ) -> Result<T, MetadataError> {
        let deadline = Instant::now() + total;
        let mut backoff = self.inner.options.backoff_initial;
        let mut next = 0usize;
        let mut last_error: String;
        // The last refusal from a node that answered says more than a failed connection.
        let mut last_answer: Option<String> = None;
        let mut unreachable: BTreeSet<String> = BTreeSet::new();
        loop {
            let target = match self.leader() {
                Some(leader) => leader,
                None => {
                    let target = self.inner.nodes[next % self.inner.nodes.len()].clone();
                    next += 1;
                    target
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let mut sleep_first = true;
            match self.send(&target, method.clone(), path, body, left).await {
                Ok((status, bytes)) if status.is_success() => return decode(&target, &bytes),
                Ok((status, bytes)) => {
                    let error = serde_json::from_slice::<ErrorBody>(&bytes).ok().map(|b| b.error);
                    match error {
                        Some(e) if status == StatusCode::SERVICE_UNAVAILABLE => {
                            if e.outcome == Outcome::Unknown && retry == Retry::IfNotApplied {
                                return Err(MetadataError::Unavailable(e.message));
                            }
                            self.forget_leader(&target);
                            // Follow a hint to another node; a node that names itself and failed
                            // may be cut off from the rest, so try the others then.
                            let hint = e.leader.map(|l| base_url(&l.addr)).filter(|h| *h != target);
                            if let Some(leader) = hint {
                                self.set_leader(leader);
                            }
                            unreachable.remove(&target);
                            last_answer = Some(e.message.clone());
                            last_error = e.message;
                        }
                        Some(e) if status.is_client_error() => {
                            return Err(MetadataError::InvalidArgument(e.message));
                        }
                        // Refused without an error body (a node of another version that does
                        // not know the request): another node will not take it either.
                        _ if status == StatusCode::BAD_REQUEST => {
                            return Err(MetadataError::InvalidArgument(unexpected(&target, status, &bytes)));
                        }
                        _ => {
                            let message = unexpected(&target, status, &bytes);
                            if retry == Retry::IfNotApplied {
                                return Err(MetadataError::Unavailable(format!(
                                    "{message}; the request may or may not have been applied"
                                )));
                            }
                            self.forget_leader(&target);
                            last_error = message;
                        }
                    }
                }
                Err(e) if e.is_connect() => {
                    self.forget_leader(&target);
                    last_error = format!("cannot connect to metadata node {target}: {}", root_cause(&e));
                    unreachable.insert(target.clone());
                    // Nothing was sent: try the next node at once, and sleep only after a round.
                    sleep_first = next.is_multiple_of(self.inner.nodes.len());
                }
                Err(e) => {
                    let message = format!("no answer from metadata node {target}: {}", root_cause(&e));
                    if retry == Retry::IfNotApplied {
                        return Err(MetadataError::Unavailable(format!(
                            "{message}; the request may or may not have been applied"
                        )));
                    }
                    self.forget_leader(&target);
                    last_error = message;
                }
            }
            let now = Instant::now();
            if now >= deadline || (sleep_first && now + backoff >= deadline) {
                let reason = last_answer.unwrap_or(last_error);
                let cannot_connect = if unreachable.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; could not connect to {}",
                        unreachable.into_iter().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(MetadataError::Unavailable(format!(
                    "{reason} (gave up after {} ms trying {}{cannot_connect})",
                    total.as_millis(),
                    self.inner.nodes.join(", ")
                )));
            }
            if sleep_first {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(self.inner.options.backoff_max);
            }
        }
    }

    /// One HTTP request; `timeout` bounds it, and the node is asked to answer a little sooner.
    async fn send<B: Serialize>(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), reqwest::Error> {
        let server_ms = timeout.saturating_sub(SERVER_MARGIN).as_millis().max(1);
        let mut request = self
            .inner
            .http
            .request(method, format!("{base}{path}"))
            .timeout(timeout.max(Duration::from_millis(1)))
            .header(TIMEOUT_HEADER, server_ms.to_string());
        if let Some(body) = body {
            request = request.json(body);
        }
        let reply = request.send().await?;
        let status = reply.status();
        if status.is_success() {
            if let Some(leader) = reply.headers().get(LEADER_HEADER).and_then(|v| v.to_str().ok()) {
                if let Some((_, addr)) = leader.split_once('=') {
                    self.set_leader(base_url(addr));
                }
            }
        }
        let bytes = reply.bytes().await?;
        Ok((status, bytes))
    }

    fn leader(&self) -> Option<String> {
        self.inner.leader.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sends to the leader directly from now on, if it is one of the configured nodes: an
    /// address the cluster advertises may not be reachable from here (behind a proxy, NAT or
    /// a load balancer); any configured node forwards to the leader.
    fn set_leader(&self, base: String) {
        if self.inner.nodes.contains(&base) {
            *self.inner.leader.lock().unwrap_or_else(PoisonError::into_inner) = Some(base);
        }
    }

    fn forget_leader(&self, base: &str) {
        let mut leader = self.inner.leader.lock().unwrap_or_else(PoisonError::into_inner);
        if leader.as_deref() == Some(base) {
            *leader = None;
        }
    }
}

/// A [`StateDelta`] whose changes are not decoded yet.
#[derive(serde::Deserialize)]
struct RawStateDelta {
    node_id: NodeId,
    applied_index: Option<u64>,
    state: Option<crate::MetadataState>,
    #[serde(default)]
    changes: Option<Vec<serde_json::Value>>,
}

impl RawStateDelta {
    fn decode(self) -> Result<StateDelta, MetadataError> {
        let changes = self
            .changes
            .map(|changes| {
                changes.into_iter().map(serde_json::from_value::<Change>).collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|e| {
                MetadataError::InvalidArgument(format!(
                    "a change this version cannot apply ({e}); read the whole state"
                ))
            })?;
        Ok(StateDelta {
            node_id: self.node_id,
            applied_index: self.applied_index,
            state: self.state,
            changes,
        })
    }
}

fn decode<T: DeserializeOwned>(base: &str, body: &[u8]) -> Result<T, MetadataError> {
    serde_json::from_slice(body).map_err(|e| {
        MetadataError::Unavailable(format!(
            "metadata node {base} answered something unexpected ({e}): {}",
            quote(body)
        ))
    })
}

fn unexpected(base: &str, status: StatusCode, body: &[u8]) -> String {
    format!("metadata node {base} answered HTTP {status}: {}", quote(body))
}

fn quote(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(BODY_QUOTE_CHARS_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_this_version_cannot_decode_asks_for_the_whole_state() {
        let known = serde_json::json!({"type": "delete_topic", "name": "t"});
        let raw = |command: serde_json::Value| RawStateDelta {
            node_id: 1,
            applied_index: Some(9),
            state: None,
            changes: Some(vec![
                serde_json::json!({"index": 8, "command": known}),
                serde_json::json!({"index": 9, "command": command}),
            ]),
        };
        let delta = raw(known.clone()).decode().expect("known commands decode");
        let changes = delta.changes.expect("changes");
        assert_eq!(changes[1].command, Command::DeleteTopic { name: "t".into(), topic_id: None });
        let e = raw(serde_json::json!({"type": "a_command_from_the_future"})).decode().unwrap_err();
        assert!(matches!(e, MetadataError::InvalidArgument(ref m) if m.contains("whole state")), "{e}");
    }
}
