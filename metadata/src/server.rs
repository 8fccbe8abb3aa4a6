//! The HTTP server of a metadata node: the Raft RPCs from its peers ([`crate::raft::http_network`])
//! and the client-facing metadata API ([`crate::api`]) on one listener.
//!
//! Every client request that needs the leader (writes, linearizable reads, membership changes)
//! follows one loop until its deadline (the node's request timeout, or less if the caller says
//! so in [`TIMEOUT_HEADER`]):
//! - this node leads and a quorum acknowledged it recently: do it here;
//! - another node leads: forward the request to it, once (a forwarded request is never
//!   forwarded again, so two nodes with different views cannot bounce it);
//! - no usable leader (an election, no quorum): wait and look again.
//!
//! A write is only retried inside the loop while nothing can have taken effect: this node was
//! not the leader when it proposed it, the leader could not be connected to, or the leader said
//! `not_applied`. A write that was proposed or sent and got no answer in time, or whose entry
//! was cut from this node's log when it lost its leadership (a follower may still hold it and
//! commit it once it leads), fails with outcome `unknown`, never retried, so it is never
//! applied twice by this server. At the deadline the answer is 503 with the reason, e.g. "no
//! metadata leader: cannot reach a quorum of 3 nodes".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::api::{
    Change, ErrorBody, ErrorDetail, MembersRequest, Outcome, StateDelta, StateReply, CODE_INVALID_ARGUMENT,
    CODE_INVALID_JSON, CODE_UNAVAILABLE, FORWARDED_HEADER, LEADER_HEADER, MEMBERS_PATH, STATE_PATH,
    STATUS_PATH, TIMEOUT_HEADER, WRITE_PATH,
};
use crate::node::{LeaderError, Route};
use crate::node_status::Member;
use crate::raft::http_network::{base_url, root_cause, APPEND_PATH, SNAPSHOT_PATH, VOTE_PATH};
use crate::raft::state_machine_store::Changes;
use crate::raft::types::{NodeId, TypeConfig};
use crate::state::Command;
use crate::MetadataNode;

/// Largest Raft RPC body: a batch of log entries or one snapshot chunk.
const RAFT_BODY_BYTES_MAX: usize = 128 * 1024 * 1024;
/// Largest client request body: one command.
const API_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// A membership change waits for the new node to catch up, which may take a snapshot transfer.
const MEMBERS_TIMEOUT: Duration = Duration::from_secs(120);
/// A forwarded request tells the leader to answer this much before the forwarder gives up.
const FORWARD_MARGIN: Duration = Duration::from_millis(200);
/// How often a request waiting for a leader looks again.
const ROUTE_POLL: Duration = Duration::from_millis(25);
/// A write is not proposed with less time than this left.
const PROPOSE_TIME_MIN: Duration = Duration::from_millis(100);
/// Client requests one node handles at once (each may wait for a leader up to its deadline);
/// more are refused with 503 `not_applied`.
const API_INFLIGHT_MAX: usize = 1024;
/// Connecting to the leader to forward a request.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Serves `router(node)` on `listener` until `shutdown` completes, then finishes the requests in
/// flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    node: MetadataNode,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router(node).map_err(|e| std::io::Error::other(e.to_string()))?;
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

/// The routes of a metadata node: `/raft/{append,vote,snapshot}` for its peers and
/// `/metadata/{write,state,status,members}` for clients.
pub fn router(node: MetadataNode) -> Result<Router, crate::MetadataError> {
    let http =
        reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).build().map_err(
            |e| crate::MetadataError::Unavailable(format!("cannot build the forwarding HTTP client: {e}")),
        )?;
    let server = Arc::new(Server { node, http, inflight: Semaphore::new(API_INFLIGHT_MAX) });
    let raft = Router::new()
        .route(APPEND_PATH, post(raft_append))
        .route(VOTE_PATH, post(raft_vote))
        .route(SNAPSHOT_PATH, post(raft_snapshot))
        .layer(DefaultBodyLimit::max(RAFT_BODY_BYTES_MAX));
    let api = Router::new()
        .route(WRITE_PATH, post(write))
        .route(STATE_PATH, get(read_state))
        .route(STATUS_PATH, get(status))
        .route(MEMBERS_PATH, post(members))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(API_BODY_BYTES_MAX));
    Ok(raft.merge(api).with_state(server))
}

struct Server {
    node: MetadataNode,
    /// Forwards requests to the leader; pooled connections.
    http: reqwest::Client,
    /// Bounds the client requests in flight.
    inflight: Semaphore,
}

type Shared = State<Arc<Server>>;

async fn raft_append(
    State(s): Shared,
    Json(rpc): Json<AppendEntriesRequest<TypeConfig>>,
) -> Json<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> {
    Json(s.node.raft().append_entries(rpc).await)
}

async fn raft_vote(
    State(s): Shared,
    Json(rpc): Json<VoteRequest<NodeId>>,
) -> Json<Result<VoteResponse<NodeId>, RaftError<NodeId>>> {
    Json(s.node.raft().vote(rpc).await)
}

async fn raft_snapshot(
    State(s): Shared,
    Json(rpc): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Json<Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>> {
    Json(s.node.raft().install_snapshot(rpc).await)
}

async fn status(State(s): Shared) -> Response {
    Json(s.node.status().await).into_response()
}

/// `GET /metrics`: this node's Raft position and what its state machine holds, in the
/// Prometheus/OpenMetrics text format.
async fn metrics(State(s): Shared) -> Response {
    let status = s.node.status().await;
    // Leases are judged by the clock metadata stamps on commands, not the wall clock.
    let now_ms = s.node.lease_clock_ms();
    let (topics, partitions, segments, groups, agents, live_agents, under_replicated) =
        s.node.read_local(|st| {
            let partitions: usize = st.topics.values().map(|t| t.partitions.len()).sum();
            let segments: usize =
                st.topics.values().flat_map(|t| t.partitions.iter()).map(|p| p.segments.len()).sum();
            let live = st.agents.values().filter(|a| a.is_live(now_ms.max(st.clock_ms))).count();
            let under = st.under_replicated().len();
            (st.topics.len(), partitions, segments, st.groups.len(), st.agents.len(), live, under)
        });
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: Option<u64>| {
        if let Some(v) = value {
            out.push_str(&format!("# HELP silt_metadata_{name} {help}\n# TYPE silt_metadata_{name} gauge\nsilt_metadata_{name} {v}\n"));
        }
    };
    gauge("is_leader", "1 on the leader", Some(u64::from(status.state == crate::NodeRole::Leader)));
    gauge("term", "The Raft term this node is in", Some(status.current_term));
    gauge("last_log_index", "Index of the last entry in this node's log", status.last_log_index);
    gauge("last_applied_index", "Index of the last entry applied to the state machine", status.last_applied);
    gauge("committed_index", "Index of the last entry known committed", status.committed);
    gauge("snapshot_index", "Last index covered by the latest snapshot", status.snapshot_index);
    gauge("purged_index", "Entries up to this index were deleted from the log", status.purged_index);
    gauge("voters", "Voters in the membership", Some(status.membership.voters.len() as u64));
    gauge("learners", "Learners in the membership", Some(status.membership.learners.len() as u64));
    gauge(
        "millis_since_quorum_ack",
        "On the leader: time since a quorum last acknowledged it",
        status.millis_since_quorum_ack,
    );
    gauge("topics", "Topics", Some(topics as u64));
    gauge("partitions", "Partitions of all topics", Some(partitions as u64));
    gauge("segments", "Segments in all partitions' chains", Some(segments as u64));
    gauge("groups", "Consumer groups", Some(groups as u64));
    gauge("agents", "Registered agents", Some(agents as u64));
    gauge("live_agents", "Agents whose lease holds", Some(live_agents as u64));
    gauge(
        "under_replicated_segments",
        "Open or sealed segments with fewer intact replicas than replication.factor",
        Some(under_replicated as u64),
    );
    out.push_str("# EOF\n");
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], out)
        .into_response()
}

/// What forwarding a request to the leader gave.
enum Forwarded {
    /// The leader's answer, to pass on.
    Answer(StatusCode, Bytes),
    /// Certainly not applied (no connection, or the leader said so): route again.
    NotApplied(String),
    /// Sent, but no answer: it may have taken effect.
    Lost(String),
}

async fn write(State(s): Shared, headers: HeaderMap, body: Result<Json<Command>, JsonRejection>) -> Response {
    let Json(cmd) = match body {
        Ok(body) => body,
        Err(e) => return invalid(CODE_INVALID_JSON, format!("the body is not a metadata command: {e}")),
    };
    let Ok(_permit) = s.inflight.try_acquire() else { return s.busy() };
    let deadline = deadline(&headers, s.node.request_timeout());
    let forwarded = headers.contains_key(FORWARDED_HEADER);
    let mut last = s.node.quorum_summary();
    loop {
        match s.node.route() {
            // Too little time left to commit anything: proposing now would only leave the outcome
            // unknown.
            Route::Local if remaining(deadline) < PROPOSE_TIME_MIN => {}
            Route::Local => match s.node.propose(cmd.clone(), remaining(deadline)).await {
                Ok(response) => return s.ok(response),
                Err(LeaderError::NotLeader) => {
                    last = format!("metadata node {} lost its leadership", s.node.node_id())
                }
                Err(LeaderError::Retry(message)) => last = message,
                Err(LeaderError::Unknown(message)) => return s.unavailable(Outcome::Unknown, message),
                Err(LeaderError::Invalid(message)) => return invalid(CODE_INVALID_ARGUMENT, message),
            },
            Route::Forward(leader) if forwarded => return s.not_leader(&leader),
            Route::Forward(leader) => {
                match s.forward(Method::POST, WRITE_PATH, &leader, Some(&cmd), deadline).await {
                    Forwarded::Answer(status, body) => return passthrough(status, body),
                    Forwarded::NotApplied(message) => last = message,
                    Forwarded::Lost(message) => {
                        return s.unavailable(
                            Outcome::Unknown,
                            format!("{message}; the write may or may not have been applied"),
                        )
                    }
                }
            }
            Route::Wait(message) if forwarded => return s.unavailable(Outcome::NotApplied, message),
            Route::Wait(message) => last = message,
        }
        if !pause(deadline).await {
            return s.gave_up(last, deadline_ms(&headers, s.node.request_timeout()));
        }
    }
}

/// `?after=N`: answer a [`StateDelta`] instead of the whole state; with `&changes=true`, the
/// commands applied after `N` when this node still keeps them.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateQuery {
    after: Option<u64>,
    #[serde(default)]
    changes: bool,
}

/// The answer of a state read this node leads: the whole state, or, after index `after`,
/// nothing, the commands applied since (when asked for and still kept) or the whole state.
async fn answer_state(
    s: &Server,
    after: Option<u64>,
    changes: bool,
    timeout: Duration,
) -> Result<Response, LeaderError> {
    let node_id = s.node.node_id();
    let Some(n) = after else {
        let (applied_index, state) = s.node.read_state(timeout).await?;
        let clock_now_ms = Some(s.node.lease_clock_ms().max(state.clock_ms));
        return Ok(s.ok(StateReply { node_id, applied_index, state, clock_now_ms }));
    };
    if !changes {
        let (applied_index, state) = s.node.read_state(timeout).await?;
        let unchanged = applied_index.is_some_and(|i| i <= n);
        let state = (!unchanged).then_some(state);
        return Ok(s.ok(StateDelta { node_id, applied_index, state, changes: None }));
    }
    let (applied_index, changes) = s.node.read_changes(timeout, n).await?;
    let (state, changes) = match changes {
        Changes::Unchanged => (None, None),
        Changes::State(state) => (Some(state), None),
        Changes::Commands(commands) => {
            (None, Some(commands.into_iter().map(|(index, command)| Change { index, command }).collect()))
        }
    };
    Ok(s.ok(StateDelta { node_id, applied_index, state, changes }))
}

async fn read_state(State(s): Shared, headers: HeaderMap, Query(query): Query<StateQuery>) -> Response {
    let Ok(_permit) = s.inflight.try_acquire() else { return s.busy() };
    let deadline = deadline(&headers, s.node.request_timeout());
    let forwarded = headers.contains_key(FORWARDED_HEADER);
    let after = query.after;
    let path = match after {
        None => STATE_PATH.to_string(),
        Some(n) if query.changes => format!("{STATE_PATH}?after={n}&changes=true"),
        Some(n) => format!("{STATE_PATH}?after={n}"),
    };
    let mut last: String;
    loop {
        match s.node.route() {
            Route::Local => match answer_state(&s, after, query.changes, remaining(deadline)).await {
                Ok(answer) => return answer,
                Err(LeaderError::NotLeader) => {
                    last = format!("metadata node {} lost its leadership", s.node.node_id())
                }
                Err(
                    LeaderError::Retry(message)
                    | LeaderError::Unknown(message)
                    | LeaderError::Invalid(message),
                ) => last = message,
            },
            Route::Forward(leader) if forwarded => return s.not_leader(&leader),
            Route::Forward(leader) => {
                match s.forward::<()>(Method::GET, &path, &leader, None, deadline).await {
                    Forwarded::Answer(status, body) => return passthrough(status, body),
                    Forwarded::NotApplied(message) | Forwarded::Lost(message) => last = message,
                }
            }
            Route::Wait(message) if forwarded => return s.unavailable(Outcome::NotApplied, message),
            Route::Wait(message) => last = message,
        }
        if !pause(deadline).await {
            return s.gave_up(last, deadline_ms(&headers, s.node.request_timeout()));
        }
    }
}

async fn members(
    State(s): Shared,
    headers: HeaderMap,
    body: Result<Json<MembersRequest>, JsonRejection>,
) -> Response {
    let Json(request) = match body {
        Ok(body) => body,
        Err(e) => {
            return invalid(
                CODE_INVALID_JSON,
                format!(
                    r#"the body must be {{"add": {{"id": 4, "addr": "host:port"}}}} or {{"remove": 3}}: {e}"#
                ),
            )
        }
    };
    if let MembersRequest::Add(member) = &request {
        if member.addr.trim().is_empty() {
            return invalid(
                CODE_INVALID_ARGUMENT,
                format!("node {} needs an address (host:port)", member.id),
            );
        }
    }
    let Ok(_permit) = s.inflight.try_acquire() else { return s.busy() };
    let deadline = deadline(&headers, MEMBERS_TIMEOUT);
    let forwarded = headers.contains_key(FORWARDED_HEADER);
    let mut last: String;
    loop {
        match s.node.route() {
            Route::Local => {
                let done = match &request {
                    MembersRequest::Add(m) => {
                        s.node.add_node(m.id, m.addr.clone(), remaining(deadline)).await
                    }
                    MembersRequest::Remove(id) => s.node.remove_node(*id, remaining(deadline)).await,
                };
                match done {
                    Ok(()) => return s.ok(s.node.status().await),
                    Err(LeaderError::NotLeader) => {
                        last = format!("metadata node {} lost its leadership", s.node.node_id())
                    }
                    Err(LeaderError::Retry(message)) => last = message,
                    Err(LeaderError::Unknown(message)) => return s.unavailable(Outcome::Unknown, message),
                    Err(LeaderError::Invalid(message)) => return invalid(CODE_INVALID_ARGUMENT, message),
                }
            }
            Route::Forward(leader) if forwarded => return s.not_leader(&leader),
            Route::Forward(leader) => {
                match s.forward(Method::POST, MEMBERS_PATH, &leader, Some(&request), deadline).await {
                    Forwarded::Answer(status, body) => return passthrough(status, body),
                    Forwarded::NotApplied(message) => last = message,
                    Forwarded::Lost(message) => {
                        return s.unavailable(
                            Outcome::Unknown,
                            format!("{message}; the membership change may or may not have been made"),
                        )
                    }
                }
            }
            Route::Wait(message) if forwarded => return s.unavailable(Outcome::NotApplied, message),
            Route::Wait(message) => last = message,
        }
        if !pause(deadline).await {
            return s.gave_up(last, deadline_ms(&headers, MEMBERS_TIMEOUT));
        }
    }
}

impl Server {
    /// The answer when [`API_INFLIGHT_MAX`] requests are in flight already.
    fn busy(&self) -> Response {
        let message = format!(
            "metadata node {} has {API_INFLIGHT_MAX} requests in flight; retry shortly",
            self.node.node_id()
        );
        self.unavailable(Outcome::NotApplied, message)
    }

    /// Sends the request on to the leader, with what is left of the deadline.
    async fn forward<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        leader: &Member,
        body: Option<&B>,
        deadline: Instant,
    ) -> Forwarded {
        let left = remaining(deadline);
        if left.is_zero() {
            return Forwarded::NotApplied("no time left to forward the request to the leader".into());
        }
        let url = format!("{}{path}", base_url(&leader.addr));
        let mut request = self
            .http
            .request(method, url)
            .timeout(left)
            .header(FORWARDED_HEADER, self.node.node_id().to_string())
            .header(TIMEOUT_HEADER, left.saturating_sub(FORWARD_MARGIN).as_millis().max(1).to_string());
        if let Some(body) = body {
            request = request.json(body);
        }
        let (id, addr) = (leader.id, &leader.addr);
        let reply = match request.send().await {
            Ok(reply) => reply,
            Err(e) if e.is_connect() => {
                return Forwarded::NotApplied(format!(
                    "cannot reach the metadata leader, node {id} at {addr}: {}",
                    root_cause(&e)
                ))
            }
            Err(e) => {
                return Forwarded::Lost(format!(
                    "no answer from the metadata leader, node {id} at {addr}: {}",
                    root_cause(&e)
                ))
            }
        };
        let status = reply.status();
        let body = match reply.bytes().await {
            Ok(body) => body,
            Err(e) => {
                return Forwarded::Lost(format!(
                    "the answer of the metadata leader, node {id} at {addr}, broke off: {}",
                    root_cause(&e)
                ))
            }
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            if let Ok(error) = serde_json::from_slice::<ErrorBody>(&body) {
                if error.error.outcome == Outcome::NotApplied {
                    return Forwarded::NotApplied(error.error.message);
                }
            }
        }
        Forwarded::Answer(status, body)
    }

    /// 200 with `body`, telling the caller which node leads.
    fn ok(&self, body: impl Serialize) -> Response {
        let mut response = Json(body).into_response();
        if let Some(leader) = self.node.known_leader() {
            if let Ok(value) = HeaderValue::from_str(&format!("{}={}", leader.id, leader.addr)) {
                response.headers_mut().insert(LEADER_HEADER, value);
            }
        }
        response
    }

    fn unavailable(&self, outcome: Outcome, message: String) -> Response {
        error(StatusCode::SERVICE_UNAVAILABLE, CODE_UNAVAILABLE, outcome, message, self.node.known_leader())
    }

    fn not_leader(&self, leader: &Member) -> Response {
        let message = format!(
            "metadata node {} is not the leader; the leader is node {} at {}",
            self.node.node_id(),
            leader.id,
            leader.addr
        );
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            CODE_UNAVAILABLE,
            Outcome::NotApplied,
            message,
            Some(leader.clone()),
        )
    }

    fn gave_up(&self, last: String, waited_ms: u128) -> Response {
        self.unavailable(
            Outcome::NotApplied,
            format!("{last} (gave up after {waited_ms} ms; nothing was applied)"),
        )
    }
}

fn invalid(code: &str, message: String) -> Response {
    error(StatusCode::BAD_REQUEST, code, Outcome::NotApplied, message, None)
}

fn error(
    status: StatusCode,
    code: &str,
    outcome: Outcome,
    message: String,
    leader: Option<Member>,
) -> Response {
    let body = ErrorBody { error: ErrorDetail { code: code.to_string(), message, outcome, leader } };
    (status, Json(body)).into_response()
}

fn passthrough(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// The caller's time budget: the node's limit, or less if the caller asks for less.
fn deadline(headers: &HeaderMap, limit: Duration) -> Instant {
    Instant::now() + Duration::from_millis(deadline_ms(headers, limit) as u64)
}

fn deadline_ms(headers: &HeaderMap, limit: Duration) -> u128 {
    let asked =
        headers.get(TIMEOUT_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u128>().ok());
    asked.map_or(limit.as_millis(), |ms| ms.min(limit.as_millis()))
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Waits a little before routing again; false when the deadline has passed.
async fn pause(deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    tokio::time::sleep_until(deadline.min(now + ROUTE_POLL)).await;
    true
}
