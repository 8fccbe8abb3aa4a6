//! [`MemoryRaftNetwork`]: the Raft transport between metadata nodes that run in one process
//! (the simulator), over links a simulation cuts, slows and mends.
//!
//! Every node registers its Raft handle and the runtime it runs on with a shared
//! [`RaftRouter`]; an RPC runs on the target's runtime, so a node whose runtime is dropped (a
//! crash) drops the RPCs it was handling too, as a killed process does. Errors reach openraft
//! as over HTTP ([`crate::raft::http_network`]): a target that is down or whose link is cut is
//! [`Unreachable`] (openraft backs off), one that does not answer within the RPC's deadline,
//! or whose answer is lost, is a [`NetworkError`].

use std::collections::BTreeMap;
use std::error::Error;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tokio::runtime::Handle;

use crate::raft::types::{BasicNode, NodeId, Raft, TypeConfig};

/// How long an attempt to reach a node over a cut link takes before it is `Unreachable`, as a
/// TCP connection that is never accepted (the HTTP transport's connect timeout).
const CUT_CONNECT: Duration = Duration::from_millis(500);

/// What a link from one metadata node to another does to the RPCs over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftLink {
    /// RPCs arrive and are answered.
    Up,
    /// RPCs never arrive.
    Cut,
    /// RPCs arrive and take effect; their answers are lost.
    RepliesLost,
    /// RPCs and their answers each take this much longer.
    Slow(Duration),
    /// Votes and their answers arrive; appends and snapshots never do (a network that drops
    /// large packets).
    VotesOnly,
}

/// The nodes of one in-process metadata cluster that run, and the links between them.
#[derive(Default)]
pub struct RaftRouter {
    nodes: Mutex<BTreeMap<NodeId, (Raft, Handle)>>,
    /// From, to: links not listed are up.
    links: Mutex<BTreeMap<(NodeId, NodeId), RaftLink>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why an RPC failed on the way.
#[derive(Debug, thiserror::Error)]
#[error("metadata node {target} {why}")]
struct Lost {
    target: NodeId,
    why: &'static str,
}

impl RaftRouter {
    /// A router with no node running and every link up.
    pub fn new() -> Arc<RaftRouter> {
        Arc::default()
    }

    /// Node `id` runs `raft` on the runtime `runtime`: RPCs to it run there from now on.
    pub fn register(&self, id: NodeId, raft: Raft, runtime: Handle) {
        lock(&self.nodes).insert(id, (raft, runtime));
    }

    /// Node `id` is down: RPCs to it fail as to a closed port.
    pub fn unregister(&self, id: NodeId) {
        lock(&self.nodes).remove(&id);
    }

    /// From now on, RPCs from `from` to `to` (and their answers) fare as `link` says.
    pub fn set_link(&self, from: NodeId, to: NodeId, link: RaftLink) {
        let mut links = lock(&self.links);
        if link == RaftLink::Up {
            links.remove(&(from, to));
        } else {
            links.insert((from, to), link);
        }
    }

    /// Mends every link.
    pub fn heal(&self) {
        lock(&self.links).clear();
    }

    fn link(&self, from: NodeId, to: NodeId) -> RaftLink {
        lock(&self.links).get(&(from, to)).copied().unwrap_or(RaftLink::Up)
    }

    /// Runs `rpc` (a vote when `vote`) on node `to`'s runtime as sent by `from`, within `ttl`.
    async fn call<R, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        vote: bool,
        ttl: Duration,
        rpc: F,
    ) -> Result<R, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        R: Send + 'static,
        E: Error + Send + 'static,
        F: FnOnce(Raft) -> Fut,
        Fut: Future<Output = Result<R, RaftError<NodeId, E>>> + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + ttl;
        let lost = |why| Lost { target: to, why };
        match self.link(from, to) {
            RaftLink::VotesOnly if !vote => {
                tokio::time::sleep_until(deadline).await;
                return Err(RPCError::Network(NetworkError::new(&lost("never got it (only votes pass)"))));
            }
            RaftLink::Cut => {
                tokio::time::sleep(CUT_CONNECT.min(ttl)).await;
                return Err(RPCError::Unreachable(Unreachable::new(&lost("is unreachable (link cut)"))));
            }
            RaftLink::Slow(by) => tokio::time::sleep(by).await,
            RaftLink::Up | RaftLink::RepliesLost | RaftLink::VotesOnly => {}
        }
        let Some((raft, runtime)) = lock(&self.nodes).get(&to).cloned() else {
            return Err(RPCError::Unreachable(Unreachable::new(&lost("is down"))));
        };
        let task = runtime.spawn(rpc(raft));
        let answer = match tokio::time::timeout_at(deadline, task).await {
            Err(_) => return Err(RPCError::Network(NetworkError::new(&lost("did not answer in time")))),
            Ok(Err(_)) => return Err(RPCError::Network(NetworkError::new(&lost("crashed while answering")))),
            Ok(Ok(answer)) => answer,
        };
        match self.link(to, from) {
            RaftLink::Cut | RaftLink::RepliesLost => {
                tokio::time::sleep_until(deadline).await;
                return Err(RPCError::Network(NetworkError::new(&lost("answered, but the answer was lost"))));
            }
            RaftLink::Slow(by) => tokio::time::sleep(by).await,
            RaftLink::Up | RaftLink::VotesOnly => {}
        }
        if tokio::time::Instant::now() > deadline {
            return Err(RPCError::Network(NetworkError::new(&lost("did not answer in time"))));
        }
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
    }
}

/// The Raft network of node `from` over a [`RaftRouter`].
#[derive(Clone)]
pub struct MemoryRaftNetwork {
    from: NodeId,
    router: Arc<RaftRouter>,
}

impl MemoryRaftNetwork {
    /// The network node `from` sends its RPCs over.
    pub fn new(from: NodeId, router: Arc<RaftRouter>) -> MemoryRaftNetwork {
        MemoryRaftNetwork { from, router }
    }
}

/// The connection from one node to another over a [`RaftRouter`].
pub struct MemoryRaftPeer {
    from: NodeId,
    target: NodeId,
    router: Arc<RaftRouter>,
}

impl RaftNetworkFactory<TypeConfig> for MemoryRaftNetwork {
    type Network = MemoryRaftPeer;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> MemoryRaftPeer {
        MemoryRaftPeer { from: self.from, target, router: Arc::clone(&self.router) }
    }
}

impl RaftNetwork<TypeConfig> for MemoryRaftPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.router
            .call(self.from, self.target, false, option.hard_ttl(), |raft| async move {
                raft.append_entries(rpc).await
            })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.router
            .call(self.from, self.target, false, option.hard_ttl(), |raft| async move {
                raft.install_snapshot(rpc).await
            })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.router
            .call(self.from, self.target, true, option.hard_ttl(), |raft| async move { raft.vote(rpc).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::node::LeaderError;
    use crate::{Command, MetadataNode, MetadataNodeOptions};

    async fn open(
        dir: &std::path::Path,
        router: &Arc<RaftRouter>,
        ids: &[NodeId],
    ) -> BTreeMap<NodeId, MetadataNode> {
        let members: BTreeMap<NodeId, String> =
            ids.iter().map(|id| (*id, format!("memory://{id}"))).collect();
        let mut nodes = BTreeMap::new();
        for id in ids {
            let network = MemoryRaftNetwork::new(*id, Arc::clone(router));
            let node = MetadataNode::open_cluster_over(
                &dir.join(id.to_string()),
                *id,
                Some(members.clone()),
                MetadataNodeOptions::default(),
                network,
            )
            .await
            .unwrap();
            router.register(*id, node.raft().clone(), Handle::current());
            nodes.insert(*id, node);
        }
        nodes
    }

    async fn leader_among(nodes: &BTreeMap<NodeId, MetadataNode>, among: &BTreeSet<NodeId>) -> NodeId {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            for id in among {
                let m = nodes[id].raft().metrics().borrow().clone();
                if m.state == openraft::ServerState::Leader && m.current_leader == Some(*id) {
                    return *id;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "none of {among:?} became the leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn last_log_index(node: &MetadataNode) -> Option<u64> {
        node.raft().metrics().borrow().last_log_index
    }

    /// A leader of five whose write reached one follower only, then whose log lost it to a
    /// newer leader's entry, answers that it no longer leads; but the follower still holds the
    /// write, and a later leader elected with it commits it. So that answer cannot say that
    /// nothing took effect (a client would send the write again and have it applied twice).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_cut_from_a_deposed_leaders_log_may_still_be_applied_so_its_outcome_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let router = RaftRouter::new();
        let ids = [1, 2, 3, 4, 5];
        let nodes = open(dir.path(), &router, &ids).await;
        let a = leader_among(&nodes, &ids.into_iter().collect()).await;
        let b = ids.into_iter().find(|id| *id != a).unwrap();
        let rest: BTreeSet<NodeId> = ids.into_iter().filter(|id| *id != a && *id != b).collect();
        // The rest hear only each other's votes: they elect a leader X whose entries reach none
        // of them, nor A, nor B. A reaches B only.
        for x in &rest {
            for y in ids.iter().filter(|y| *y != x) {
                let link = if rest.contains(y) { RaftLink::VotesOnly } else { RaftLink::Cut };
                router.set_link(*x, *y, link);
            }
            router.set_link(a, *x, RaftLink::Cut);
            router.set_link(b, *x, RaftLink::Cut);
        }
        let x = leader_among(&nodes, &rest).await;

        // A's write reaches B, and no one else: it is not committed.
        let before = last_log_index(&nodes[&a]);
        let proposer = nodes[&a].clone();
        let write = tokio::spawn(async move {
            let cmd = Command::CreateTopic {
                name: "once".into(),
                partitions: 1,
                config: BTreeMap::new(),
                now_ms: 1,
            };
            proposer.propose(cmd, Duration::from_secs(20)).await
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while last_log_index(&nodes[&b]) <= before || last_log_index(&nodes[&b]) != last_log_index(&nodes[&a])
        {
            assert!(tokio::time::Instant::now() < deadline, "the write did not reach B");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Then A is cut off from B and hears from X, whose entry replaces the write in A's log.
        router.set_link(a, b, RaftLink::Cut);
        router.set_link(b, a, RaftLink::Cut);
        router.set_link(x, a, RaftLink::Up);
        let answered = tokio::time::timeout(Duration::from_secs(20), write).await.unwrap().unwrap();
        assert!(
            matches!(answered, Err(LeaderError::Unknown(_))),
            "the write was answered {answered:?}, as if it could not have taken effect"
        );

        // X goes; B and the other two elect B, whose log holds the write, and commit it.
        router.unregister(x);
        nodes[&x].shutdown().await;
        for y in rest.iter().filter(|y| **y != x) {
            router.set_link(*y, b, RaftLink::Up);
            router.set_link(b, *y, RaftLink::Up);
            for z in rest.iter().filter(|z| *z != y && **z != x) {
                router.set_link(*y, *z, RaftLink::Up);
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !nodes[&b].read_local(|s| s.topics.contains_key("once")) {
            assert!(tokio::time::Instant::now() < deadline, "B never applied the write");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (id, node) in &nodes {
            if *id != x {
                node.shutdown().await;
            }
        }
    }
}
