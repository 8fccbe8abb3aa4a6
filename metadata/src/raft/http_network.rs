//! [`HttpNetwork`]: the Raft transport between metadata nodes, JSON over HTTP/1.1.
//!
//! The client side of openraft's three RPCs: each is one `POST` of the request's JSON to the
//! target's address from the membership ([`BasicNode::addr`], `host:port`) at
//! [`APPEND_PATH`], [`VOTE_PATH`] or [`SNAPSHOT_PATH`]. The answer is the JSON of the target's
//! `Result<response, RaftError>`. The server side is in [`crate::server`].
//!
//! One `reqwest` client is shared by every peer, so connections are pooled and reused (HTTP/1.1
//! keep-alive); every RPC carries openraft's deadline for it (`RPCOption::hard_ttl`). Errors are
//! classified for openraft:
//! - the connection could not be made: [`Unreachable`], which makes openraft back off before
//!   it tries that peer again ([`HttpPeer::backoff`]);
//! - anything else on the way (timeout, reset, a non-2xx reply, an unreadable body):
//!   [`NetworkError`], retried at once;
//! - the target answered with an error: [`RemoteError`].
//!
//! Snapshots go with openraft's default chunked transfer over [`SNAPSHOT_PATH`], each chunk
//! bounded by the node's `snapshot_max_chunk_size`.

use std::error::Error;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::raft::types::{BasicNode, NodeId, TypeConfig};
use crate::MetadataError;

/// Path of the AppendEntries RPC (heartbeats too).
pub const APPEND_PATH: &str = "/raft/append";
/// Path of the RequestVote RPC.
pub const VOTE_PATH: &str = "/raft/vote";
/// Path of one InstallSnapshot chunk.
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// How long opening a TCP connection to a peer may take. Loopback and a LAN answer in well under
/// a millisecond; a peer that does not accept within this is treated as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per peer: replication, heartbeats and votes run concurrently.
const POOL_IDLE_PER_HOST_MAX: usize = 8;
/// Sleeps between attempts to reach a peer that refused connections: short at first, so a
/// restarted node is caught up quickly, then one attempt a second.
const BACKOFF_MS: [u64; 4] = [100, 200, 400, 800];
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Characters of a peer's error reply quoted in the error.
const ERROR_BODY_BYTES_MAX: usize = 512;

/// Creates an [`HttpPeer`] per target; all share one connection pool. Cloning is cheap.
#[derive(Debug, Clone)]
pub struct HttpNetwork {
    http: reqwest::Client,
}

impl HttpNetwork {
    /// A network with its own connection pool.
    pub fn new() -> Result<HttpNetwork, MetadataError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| MetadataError::Unavailable(format!("cannot build the raft HTTP client: {e}")))?;
        Ok(HttpNetwork { http })
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetwork {
    type Network = HttpPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> HttpPeer {
        HttpPeer { http: self.http.clone(), target, node: node.clone(), base_url: base_url(&node.addr) }
    }
}

/// The connection to one peer.
#[derive(Debug, Clone)]
pub struct HttpPeer {
    http: reqwest::Client,
    target: NodeId,
    node: BasicNode,
    base_url: String,
}

/// Why an RPC did not get an answer from the target's Raft node.
///
/// The `reqwest` error is kept as its root cause's text: its own text and chain repeat the URL.
#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("cannot connect to metadata node {target} at {addr}: {cause}")]
    Connect { target: NodeId, addr: String, cause: String },
    #[error("RPC to metadata node {target} at {addr} failed: {cause}")]
    Transport { target: NodeId, addr: String, cause: String },
    #[error("metadata node {target} at {addr} answered HTTP {status}: {body}")]
    Status { target: NodeId, addr: String, status: u16, body: String },
}

impl HttpPeer {
    /// Posts `request` to `path` and decodes the target's `Result`.
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let url = format!("{}{path}", self.base_url);
        let addr = &self.node.addr;
        let sent = self.http.post(url).json(request).timeout(option.hard_ttl()).send().await;
        let reply = match sent {
            Ok(reply) => reply,
            Err(e) if e.is_connect() => {
                return Err(RPCError::Unreachable(Unreachable::new(&PeerError::Connect {
                    target: self.target,
                    addr: addr.clone(),
                    cause: root_cause(&e),
                })));
            }
            Err(e) => {
                let cause = root_cause(&e);
                return Err(self.network_error(PeerError::Transport {
                    target: self.target,
                    addr: addr.clone(),
                    cause,
                }));
            }
        };
        let status = reply.status();
        if !status.is_success() {
            let body: String =
                reply.text().await.unwrap_or_default().chars().take(ERROR_BODY_BYTES_MAX).collect();
            return Err(self.network_error(PeerError::Status {
                target: self.target,
                addr: addr.clone(),
                status: status.as_u16(),
                body,
            }));
        }
        let result: Result<Resp, RaftError<NodeId, E>> = reply.json().await.map_err(|e| {
            self.network_error(PeerError::Transport {
                target: self.target,
                addr: addr.clone(),
                cause: root_cause(&e),
            })
        })?;
        result
            .map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }

    fn network_error<E: Error>(&self, e: PeerError) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for HttpPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(APPEND_PATH, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(SNAPSHOT_PATH, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(VOTE_PATH, &rpc, &option).await
    }

    fn backoff(&self) -> Backoff {
        let steps = BACKOFF_MS.into_iter().map(Duration::from_millis);
        Backoff::new(steps.chain(std::iter::repeat(BACKOFF_MAX)))
    }
}

/// The innermost error of a chain, e.g. "Connection refused (os error 111)"; a timeout says so.
pub(crate) fn root_cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_string();
    }
    let mut cause: &dyn Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// `http://host:port` for an address given as `host:port` or as a URL.
pub(crate) fn base_url(addr: &str) -> String {
    let addr = addr.trim().trim_end_matches('/');
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}
