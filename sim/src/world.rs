//! The simulated cluster: metadata nodes and agents, each a turmoil host with a runtime of its
//! own (a crash drops the runtime with every task on it), the agents reaching each other over a
//! [`MemoryNetwork`] and metadata over a [`MetadataLink`] each (a copy of its state that lags,
//! as a remote agent's does), their segment files under the process's working directory with
//! every unsynced write recorded for a power loss, and each agent's clock its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use silt::dev::LocalAgent;
use silt_agent::agent::Archive;
use silt_agent::log::disk::{self, PowerLoss};
use silt_agent::memory_network::MemoryNetwork;
use silt_agent::metrics::Metrics;
use silt_agent::{Agent, AgentConfig, ApiError};
use silt_compactor::metrics::CompactorMetrics;
use silt_compactor::{Compactor, CompactorConfig};
use silt_metadata::clock::{Clock, SystemClock};
use silt_metadata::handle::{LinkedCluster, MetadataLink};
use silt_metadata::raft::memory_network::{MemoryRaftNetwork, RaftRouter};
use silt_metadata::{Metadata, MetadataClientOptions, MetadataNode, MetadataNodeOptions, RemoteMetadata};
use silt_tiering::cold_reader::{ColdReader, ColdReaderOptions};
use silt_tiering::{FaultConfig, FaultInjectingObjectStore, RetryingObjectStore};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How long an agent's lease lasts.
pub(crate) const LEASE: Duration = Duration::from_secs(2);
/// How long a client waits for an agent's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// An agent process that runs, and the runtime it runs on.
#[derive(Clone)]
struct Running {
    agent: Agent,
    runtime: Handle,
}

/// A clock that reads the simulated wall clock moved by every step a fault made.
#[derive(Debug, Default)]
pub(crate) struct SteppedClock {
    offset_ms: AtomicI64,
}

impl SteppedClock {
    /// Moves the clock by `ms` (back when negative).
    pub(crate) fn step(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for SteppedClock {
    fn now_ms(&self) -> u64 {
        (SystemClock.now_ms() as i64 + self.offset_ms.load(Ordering::SeqCst)).max(0) as u64
    }
}

/// With `--archive`: the bucket every agent's compactor writes to and its cold reader reads
/// from, in memory (it outlives every crash), behind a window of errors the schedule opens and
/// closes.
pub(crate) struct Bucket {
    /// What the bucket holds.
    pub(crate) objects: Arc<InMemory>,
    /// The errors on the way to it.
    pub(crate) faults: Arc<FaultInjectingObjectStore<InMemory>>,
}

/// Where Silt's objects live in the bucket.
pub(crate) const BUCKET_PREFIX: &str = "silt";

/// How often each agent's compactor looks for sealed segments.
const COMPACTOR_EVERY: Duration = Duration::from_millis(500);

impl Bucket {
    fn new() -> Bucket {
        let objects = Arc::new(InMemory::new());
        let faults = Arc::new(FaultInjectingObjectStore::new(Arc::clone(&objects), FaultConfig::default()));
        Bucket { objects, faults }
    }

    /// The bucket as an agent's process opens it: through the retries every Silt process
    /// makes.
    fn open(&self) -> Arc<dyn ObjectStore> {
        Arc::new(RetryingObjectStore::new(Arc::clone(&self.faults)))
    }
}

/// Everything the hosts, the clients and the fault schedule share.
pub(crate) struct World {
    pub(crate) agents: Vec<String>,
    pub(crate) net: Arc<MemoryNetwork>,
    running: Mutex<BTreeMap<String, Running>>,
    /// The metadata nodes' ids (1, 2, ...) and their hosts' names.
    pub(crate) metadata_nodes: BTreeMap<u64, String>,
    /// The metadata nodes that run, as the agents reach them.
    metadata: Arc<LinkedCluster>,
    /// Each metadata node's election timeout in ms, drawn from the seed.
    election_timeouts: BTreeMap<u64, u64>,
    /// The Raft network between the metadata nodes.
    pub(crate) raft: Arc<RaftRouter>,
    pub(crate) clocks: BTreeMap<String, Arc<SteppedClock>>,
    /// Each agent's link to metadata.
    pub(crate) metadata_links: BTreeMap<String, Arc<MetadataLink>>,
    power: BTreeMap<String, Arc<PowerLoss>>,
    /// With `--archive`: the bucket, and each agent runs a compactor and reads archived data.
    pub(crate) bucket: Option<Bucket>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl World {
    /// A world of `agents` agents and `metadata_nodes` metadata nodes, none started; with
    /// `archive`, a bucket for the agents.
    pub(crate) fn new(seed: u64, agents: usize, metadata_nodes: u64, archive: bool) -> Arc<World> {
        let metadata_nodes: BTreeMap<u64, String> = match metadata_nodes {
            1 => BTreeMap::from([(1, "metadata".to_string())]),
            n => (1..=n).map(|id| (id, format!("metadata-{id}"))).collect(),
        };
        // openraft draws each election timeout from `rand` 0.8's thread RNG, which reads the
        // kernel's randomness by a raw system call that `overrides.rs` cannot answer: each
        // node's timeout is fixed instead, drawn from the seed, a rank of 100 ms apart from
        // every other node's so that no two time out together for good.
        let mut rng = StdRng::seed_from_u64(seed ^ 0xE1EC_7104);
        let mut ranks: Vec<u64> = (0..metadata_nodes.len() as u64).collect();
        ranks.shuffle(&mut rng);
        let election_timeouts = metadata_nodes
            .keys()
            .zip(ranks)
            .map(|(id, rank)| (*id, 300 + rank * 100 + rng.random_range(0..90)))
            .collect();
        let agents: Vec<String> = (0..agents).map(|i| format!("agent-{i}")).collect();
        let clocks = agents.iter().map(|a| (a.clone(), Arc::new(SteppedClock::default()))).collect();
        let power = agents
            .iter()
            .chain(metadata_nodes.values())
            .map(|host| (host.clone(), disk::record_unsynced(&format!("{host}/"))))
            .collect();
        let timeout = MetadataClientOptions::default().timeout;
        let metadata_links = agents.iter().map(|a| (a.clone(), MetadataLink::new(timeout))).collect();
        Arc::new(World {
            agents,
            net: MemoryNetwork::new(),
            running: Mutex::new(BTreeMap::new()),
            metadata_nodes,
            metadata: LinkedCluster::new(),
            election_timeouts,
            raft: RaftRouter::new(),
            clocks,
            metadata_links,
            power,
            bucket: archive.then(Bucket::new),
        })
    }

    /// A metadata host's software: opens node `id` under the directory of its host's name
    /// and serves. One node is a cluster of its own (as `silt dev`'s); several are one Raft
    /// cluster over [`World::raft`], each initialized with them all (as `silt metadata --init`
    /// does; a node that is already initialized ignores it).
    pub(crate) async fn run_metadata(self: Arc<World>, id: u64) -> turmoil::Result {
        let host = &self.metadata_nodes[&id];
        let node = if self.metadata_nodes.len() == 1 {
            MetadataNode::open(Path::new(host), id, format!("sim://{host}")).await?
        } else {
            let members =
                self.metadata_nodes.iter().map(|(id, host)| (*id, format!("sim://{host}"))).collect();
            let timeout = self.election_timeouts[&id];
            let options = MetadataNodeOptions {
                election_timeout_min_ms: timeout,
                election_timeout_max_ms: timeout + 1,
                ..MetadataNodeOptions::default()
            };
            MetadataNode::open_cluster_over(
                Path::new(host),
                id,
                Some(members),
                options,
                MemoryRaftNetwork::new(id, Arc::clone(&self.raft)),
            )
            .await?
        };
        self.raft.register(id, node.raft().clone(), Handle::current());
        self.metadata.up(node);
        std::future::pending::<()>().await;
        Ok(())
    }

    /// Before metadata node `id`'s host crashes: nothing reaches it any more.
    pub(crate) fn metadata_down(&self, id: u64) {
        self.metadata.down(id);
        self.raft.unregister(id);
    }

    /// The metadata node that runs and has applied the most: what metadata holds, as far as
    /// anyone can know (a node applies only what a quorum committed).
    fn metadata_node(&self) -> Option<MetadataNode> {
        self.metadata.nodes().into_iter().max_by_key(|n| n.raft().metrics().borrow().last_applied)
    }

    /// The metadata node that leads now, if any leads.
    pub(crate) fn metadata_leader(&self) -> Option<u64> {
        let node = self.metadata_node()?;
        let leader = node.raft().metrics().borrow().current_leader;
        leader
    }

    /// An agent host's software: starts the agent `id` on its data directory once metadata
    /// serves (as a service manager would, again after a failed start), then serves.
    pub(crate) async fn run_agent(self: Arc<World>, id: String) -> turmoil::Result {
        let agent = loop {
            if self.metadata.nodes().is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let link = Arc::clone(&self.metadata_links[&id]);
            let cluster = Arc::clone(&self.metadata);
            let metadata = match RemoteMetadata::linked_cluster(cluster, link, CancellationToken::new()).await
            {
                Ok(remote) => Metadata::Remote(remote),
                Err(e) => {
                    warn!(agent = %id, error = %e, "cannot reach metadata; trying again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut config = AgentConfig::new(&id, format!("sim://{id}"), PathBuf::from(&id));
            config.lease = LEASE;
            config.default_replication_factor = 3;
            config.peers = Some(self.net.peers(&id));
            config.clock = Arc::clone(&self.clocks[&id]) as Arc<dyn Clock>;
            let archive = match &self.bucket {
                None => None,
                Some(bucket) => {
                    let store = bucket.open();
                    let options = ColdReaderOptions { memory_bytes: 8 << 20, ..ColdReaderOptions::default() };
                    match ColdReader::new(Arc::clone(&store), options).await {
                        Ok(cold) => {
                            Some(Archive { cold: Arc::new(cold), store, prefix: BUCKET_PREFIX.into() })
                        }
                        Err(e) => {
                            warn!(agent = %id, error = %e, "cannot open the cold reader; trying again in a second");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                }
            };
            let store = archive.as_ref().map(|a| Arc::clone(&a.store));
            let started = Agent::start(
                config,
                metadata.clone(),
                Arc::new(Metrics::new()),
                archive,
                CancellationToken::new(),
            )
            .await;
            match started {
                Ok(agent) => {
                    if let Some(store) = store {
                        // Its compactor archives the sealed segments it holds, as `silt agent`'s
                        // does, on the same host: it stops with it.
                        let compactor = Compactor::new(
                            CompactorConfig {
                                interval: COMPACTOR_EVERY,
                                holder: Some(id.clone()),
                                clock: Arc::clone(&self.clocks[&id]) as Arc<dyn Clock>,
                                ..CompactorConfig::default()
                            },
                            metadata,
                            store,
                            BUCKET_PREFIX.into(),
                            Arc::new(LocalAgent(agent.clone())),
                            Arc::new(CompactorMetrics::new()),
                        );
                        tokio::spawn(compactor.run(CancellationToken::new()));
                    }
                    break agent;
                }
                Err(e) => {
                    warn!(agent = %id, error = %e, "the agent did not start; starting it again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        self.net.join(&agent);
        lock(&self.running).insert(id, Running { agent, runtime: Handle::current() });
        std::future::pending::<()>().await;
        Ok(())
    }

    /// Before the host of agent `id` crashes: it is gone for the clients.
    pub(crate) fn forget(&self, id: &str) {
        lock(&self.running).remove(id);
    }

    /// After host `id` (an agent's or a metadata node's) crashed: its disk loses what no fsync
    /// covered, the first `torn` bytes of it put down, and the next process of it starts afresh.
    pub(crate) fn lose_power(&self, id: &str, torn: usize) -> std::io::Result<()> {
        self.power[id].lose_unsynced(torn)?;
        disk::forget_process(Path::new(id));
        Ok(())
    }

    /// While the host of agent `id` is down: its disk is replaced by an empty one.
    pub(crate) fn replace_disk(&self, id: &str) -> std::io::Result<()> {
        match std::fs::remove_dir_all(id) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The agent that writes `partition` of the workload's topic now, if metadata names one.
    pub(crate) fn writer_of(&self, partition: u32) -> Option<String> {
        let node = self.metadata_node()?;
        node.read_local(|s| {
            s.topics.get(crate::workload::TOPIC)?.partitions.get(partition as usize)?.writer.clone()
        })
    }

    /// The id of the workload's topic metadata holds, if it holds one.
    pub(crate) fn topic_id(&self) -> Option<u64> {
        let node = self.metadata_node()?;
        node.read_local(|s| s.topics.get(crate::workload::TOPIC).map(|t| t.id))
    }

    /// The object key of every archived segment of the workload's topic metadata holds, with
    /// the segment's partition and offsets.
    pub(crate) fn archived_segments(&self) -> BTreeMap<String, (u32, u64, u64)> {
        let Some(node) = self.metadata_node() else { return BTreeMap::new() };
        node.read_local(|s| {
            let Some(topic) = s.topics.get(crate::workload::TOPIC) else { return BTreeMap::new() };
            let mut archived = BTreeMap::new();
            for (p, partition) in topic.partitions.iter().enumerate() {
                for seg in partition.segments.values() {
                    if let (Some(key), Some(last)) = (&seg.object_key, seg.last_offset) {
                        archived.insert(key.clone(), (p as u32, seg.base_offset, last));
                    }
                }
            }
            archived
        })
    }

    /// The ack checkpoints of `group` on `topic` metadata holds, per partition: the floor and
    /// the acknowledged ranges above it.
    pub(crate) fn checkpoints(&self, group: &str, topic: &str) -> BTreeMap<u32, (u64, Vec<(u64, u64)>)> {
        let Some(node) = self.metadata_node() else { return BTreeMap::new() };
        node.read_local(|s| {
            s.groups
                .get(group)
                .and_then(|g| g.topics.get(topic))
                .map(|t| t.acks.iter().map(|(p, a)| (*p, (a.floor, a.acked.clone()))).collect())
                .unwrap_or_default()
        })
    }

    /// After the process of agent `id` was killed: the next one starts afresh (without the
    /// old one's distrust of its directories and injected faults).
    pub(crate) fn forget_process(&self, id: &str) {
        disk::forget_process(Path::new(id));
    }

    /// Runs `request` on agent `id`, on its runtime, as a client's request over the network
    /// would, and waits for the answer up to the client's timeout.
    pub(crate) async fn call<T, F, Fut>(&self, id: &str, request: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(Agent) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let Some(running) = lock(&self.running).get(id).cloned() else {
            return Err(format!("{id} is down"));
        };
        // A paused agent hears the request, and its answer leaves, once the pause ends.
        let deadline = tokio::time::Instant::now() + CLIENT_TIMEOUT;
        let timed_out = || Err(format!("{id} did not answer within {CLIENT_TIMEOUT:?}"));
        if !self.net.unpaused([id, id], deadline).await {
            return timed_out();
        }
        let task = running.runtime.spawn(request(running.agent));
        let answer = match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Ok(answer))) => Ok(answer),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => return Err(format!("{id} crashed while answering")),
            Err(_) => return timed_out(),
        };
        if !self.net.unpaused([id, id], deadline).await {
            return timed_out();
        }
        answer
    }
}
