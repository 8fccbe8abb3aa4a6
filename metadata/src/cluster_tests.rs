//! Metadata nodes in one process, talking to each other over loopback HTTP: the transport, the
//! forwarding server and the client together. The end-to-end tests in `tests/tests/cluster.rs`
//! kill and pause real processes; these check the plumbing quickly.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{ErrorBody, Outcome};
use crate::server;
use crate::{Command, MetadataClient, MetadataError, MetadataNode, MetadataNodeOptions, NodeRole, Response};

struct Running {
    node: MetadataNode,
    addr: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn shutdown(self) {
        let _ = self.stop.send(());
        self.server.await.unwrap().unwrap();
        self.node.shutdown().await;
    }
}

fn options() -> MetadataNodeOptions {
    MetadataNodeOptions { request_timeout_ms: 2_000, ..MetadataNodeOptions::default() }
}

async fn start(dir: &Path, id: u64, listener: TcpListener, init: Option<BTreeMap<u64, String>>) -> Running {
    let addr = listener.local_addr().unwrap().to_string();
    let node = MetadataNode::open_cluster(&dir.join(format!("m{id}")), id, init, options()).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(listener, node.clone(), async move {
        let _ = stopped.await;
    }));
    Running { node, addr, stop, server }
}

fn create_topic(name: &str) -> Command {
    Command::CreateTopic { name: name.into(), partitions: 1, config: BTreeMap::new(), now_ms: 1 }
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_forward_and_change_membership() {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = Vec::new();
    for _ in 0..4 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    let members: BTreeMap<u64, String> = (1..=3).map(|id| (id, addrs[id as usize - 1].clone())).collect();
    let mut listeners = listeners.into_iter();
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let init = (id == 1).then(|| members.clone());
        nodes.push(start(dir.path(), id, listeners.next().unwrap(), init).await);
    }

    let client = MetadataClient::new(addrs[..3].to_vec()).unwrap();
    assert!(matches!(client.write(create_topic("a")).await.unwrap(), Response::Topic { .. }));
    assert_eq!(client.write(create_topic("a")).await, Err(MetadataError::TopicExists("a".into())));
    let leader = client.status().await.unwrap().leader.unwrap().id;

    // Through a follower's HTTP API: forwarded to the leader.
    let follower = nodes.iter().find(|n| n.node.node_id() != leader).unwrap();
    let only_follower = MetadataClient::new(vec![follower.addr.clone()]).unwrap();
    assert!(matches!(only_follower.write(create_topic("b")).await.unwrap(), Response::Topic { .. }));
    let read = only_follower.read_state().await.unwrap();
    assert_eq!(read.node_id, leader);
    assert_eq!(read.state.topics.keys().collect::<Vec<_>>(), ["a", "b"]);
    let applied = read.applied_index;
    for n in &nodes {
        wait_until("every node applies the writes", async || n.node.status().await.last_applied >= applied)
            .await;
        assert_eq!(n.node.read_local(|s| s.topics.len()), 2);
    }
    let statuses = client.statuses(Duration::from_secs(2)).await;
    assert_eq!(statuses.len(), 3);
    let roles: Vec<NodeRole> = statuses.iter().map(|(_, s)| s.as_ref().unwrap().state).collect();
    assert_eq!(roles.iter().filter(|r| **r == NodeRole::Leader).count(), 1, "{roles:?}");

    // A fourth node joins as learner, catches up and becomes a voter; then it leaves again.
    let fourth = start(dir.path(), 4, listeners.next().unwrap(), None).await;
    let status = client.add_node(4, &fourth.addr).await.unwrap();
    let voters: Vec<u64> = status.membership.voters.iter().map(|m| m.id).collect();
    assert_eq!(voters, [1, 2, 3, 4]);
    assert_eq!(fourth.node.read_local(|s| s.topics.len()), 2, "caught up before it became a voter");
    let status = client.add_node(4, "127.0.0.1:1").await.unwrap_err();
    assert!(
        matches!(&status, MetadataError::InvalidArgument(m) if m.contains("already a member")),
        "{status}"
    );
    let status = client.remove_node(4).await.unwrap();
    assert_eq!(status.membership.voters.len(), 3);
    assert!(status.membership.learners.is_empty());
    fourth.shutdown().await;

    // Two of three gone: a write fails with a clear 503 within the request timeout.
    let survivor = nodes.remove(nodes.iter().position(|n| n.node.node_id() == leader).unwrap());
    for n in nodes {
        n.shutdown().await;
    }
    let started = std::time::Instant::now();
    let reply = reqwest::Client::new()
        .post(format!("http://{}/metadata/write", survivor.addr))
        .json(&create_topic("c"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 503);
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let error: ErrorBody = reply.json().await.unwrap();
    assert!(error.error.message.contains("quorum of 3 nodes"), "{}", error.error.message);
    if error.error.outcome == Outcome::NotApplied {
        assert!(error.error.message.contains("no metadata leader"), "{}", error.error.message);
    }
    survivor.shutdown().await;
}
