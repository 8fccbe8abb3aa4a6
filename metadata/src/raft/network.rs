//! [`SingleNodeNetwork`]: the Raft network of a cluster of one node.
//!
//! It reaches nobody: every RPC fails with [`Unreachable`], which openraft answers by backing
//! off. A single-node cluster (`silt dev`) never sends RPCs, so this only matters if the
//! membership names other nodes. A cluster of `silt metadata` processes uses
//! [`HttpNetwork`](crate::raft::http_network::HttpNetwork) instead.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::raft::types::{BasicNode, NodeId, TypeConfig};

/// Creates [`UnreachablePeer`]s: the network of a single-node cluster.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleNodeNetwork;

/// A connection to another metadata node that fails every RPC with [`Unreachable`].
#[derive(Debug, Clone, Copy)]
pub struct UnreachablePeer {
    target: NodeId,
}

/// Why an RPC failed.
#[derive(Debug, thiserror::Error)]
#[error(
    "metadata node {target} is unreachable: this node runs the single-node network (silt dev), which has no transport"
)]
struct NoTransport {
    target: NodeId,
}

impl UnreachablePeer {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport { target: self.target }))
    }
}

impl RaftNetworkFactory<TypeConfig> for SingleNodeNetwork {
    type Network = UnreachablePeer;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> UnreachablePeer {
        UnreachablePeer { target }
    }
}

impl RaftNetwork<TypeConfig> for UnreachablePeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
