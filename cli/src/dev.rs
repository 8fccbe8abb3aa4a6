//! `silt dev`: one metadata node, one agent and the compactor in one process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use object_store::ObjectStore;
use silt_agent::metrics::Metrics;
use silt_agent::{Agent, AgentConfig, Archive};
use silt_compactor::metrics::CompactorMetrics;
use silt_compactor::{Compactor, CompactorConfig, SegmentSource};
use silt_metadata::{Metadata, MetadataNode};
use silt_record::Record;
use silt_tiering::cold_reader::{ColdReader, ColdReaderOptions};
use silt_tiering::fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore};
use silt_tiering::instrumented_object_store::{InstrumentedObjectStore, ObjectStoreStats};
use silt_tiering::retrying_object_store::RetryingObjectStore;
use silt_tiering::store_url::object_store_from_url;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::data_dir::{default_object_store_url, lock_data_dir};

/// Environment variable that turns on fault injection in the object store, for tests only:
/// `error_rate=0.2,seed=7` (see `FaultConfig`).
pub const FAULTS_ENV: &str = "SILT_TEST_OBJECT_STORE_FAULTS";

/// Environment variable that makes fsyncs of the agent's files fail, for tests only:
/// `<path part>:<skip>:<count>`, several separated by `;` (see `silt_agent::log::disk`).
pub const FSYNC_FAULTS_ENV: &str = "SILT_TEST_FSYNC_FAULTS";

/// What `silt dev` runs with.
#[derive(Debug, Clone)]
pub struct DevConfig {
    /// All state lives under this directory.
    pub data_dir: PathBuf,
    /// API address.
    pub listen: SocketAddr,
    /// Archive URL; default `file://<data_dir>/objects`.
    pub object_store: Option<String>,
    /// The cold reader's caches.
    pub cache: ColdCacheArgs,
    /// Agents to run in the process (1 to [`AGENTS_MAX`]).
    pub agents: u32,
}

/// The compactor reads sealed segments from the agent in the same process (in `silt dev`, in
/// each `silt agent`, and in each agent `silt-sim` runs).
pub struct LocalAgent(pub Agent);

#[async_trait::async_trait]
impl SegmentSource for LocalAgent {
    async fn read_segment(
        &self,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, String> {
        self.0.read_local_segment(topic, partition, base_offset, last_offset).await.map_err(|e| e.to_string())
    }
}

/// The cold reader's caches, as `silt dev` and `silt agent` take them.
#[derive(Debug, Clone, clap::Args)]
pub struct ColdCacheArgs {
    /// Memory for the cache of archived data read back (bytes).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub cache_memory_bytes: usize,
    /// Local disk for the cache of archived data read back (bytes); 0 turns the disk tier off.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    pub cache_disk_bytes: usize,
    /// Memory for archived records decoded for readers (bytes): it holds each reader's
    /// current row groups (up to 8 MiB of records each) and what is read ahead of
    /// sequential readers (at most half of it). Raise it for many readers replaying at once.
    #[arg(long, default_value_t = silt_tiering::cold_reader::DECODED_MEMORY_BYTES_DEFAULT)]
    pub cache_decoded_bytes: usize,
    /// A fetch of archived data from the bucket that has not finished after this long gets a
    /// second, identical request beside it, and the first success is used (a hedged request:
    /// one more GET for a request that stalls on a slow node or a lost connection; at most 5%
    /// of the fetches, and only with a fetch permit free). Keep it well above the bucket's
    /// usual latency; "0s" turns hedging off.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub cold_hedge_after: std::time::Duration,
}

impl ColdCacheArgs {
    /// The cold reader's options for an agent whose data lives in `data_dir`.
    fn options(&self, data_dir: &std::path::Path) -> ColdReaderOptions {
        ColdReaderOptions {
            memory_bytes: self.cache_memory_bytes,
            disk_dir: (self.cache_disk_bytes > 0).then(|| data_dir.join("cache")),
            disk_bytes: self.cache_disk_bytes,
            decoded_memory_bytes: self.cache_decoded_bytes,
            hedge_after: (!self.cold_hedge_after.is_zero()).then_some(self.cold_hedge_after),
            ..ColdReaderOptions::default()
        }
    }
}

/// Runs until SIGINT or SIGTERM, then drains and stops.
pub async fn run(config: DevConfig) -> Result<()> {
    init_tracing();
    let lock = lock_data_dir(&config.data_dir)?;
    let (listener, addr) = bind(config.listen).await?;
    let url = match &config.object_store {
        Some(u) => u.clone(),
        None => default_object_store_url(&config.data_dir)?,
    };
    let metadata = MetadataNode::open(&config.data_dir.join("metadata"), 1, addr.to_string())
        .await
        .context("cannot start the metadata service")?;
    // One agent by default; with --agents N, N agents in this process, each with its own
    // listener and data directory, so that segments are replicated on N local disks.
    let agents = config.agents.clamp(1, AGENTS_MAX);
    let default_replication_factor = if agents == 1 { 1 } else { agents.min(3) };
    let mut servers = vec![start(ServeConfig {
        name: "silt dev".into(),
        agent_id: "dev".into(),
        advertise_addr: addr.to_string(),
        listener,
        data_dir: config.data_dir.clone(),
        object_store: url.clone(),
        cache: config.cache.clone(),
        metadata: metadata.clone().into(),
        lease: silt_agent::agent::DEFAULT_LEASE,
        compactor: CompactorScope::All,
        default_replication_factor,
        replica_repair_after: silt_agent::agent::DEFAULT_REPLICA_REPAIR_AFTER,
        peer_source_ip: None,
    })];
    for i in 2..=agents {
        let id = format!("dev-{i}");
        // Port 0 asked for: every agent gets a free port; else the next ones.
        let port =
            if config.listen.port() == 0 { 0 } else { config.listen.port().saturating_add(i as u16 - 1) };
        let (listener, agent_addr) = bind(SocketAddr::new(addr.ip(), port)).await?;
        servers.push(start(ServeConfig {
            name: format!("silt dev agent {id}"),
            advertise_addr: agent_addr.to_string(),
            listener,
            data_dir: config.data_dir.join("agents").join(&id),
            agent_id: id,
            object_store: url.clone(),
            cache: config.cache.clone(),
            metadata: metadata.clone().into(),
            lease: silt_agent::agent::DEFAULT_LEASE,
            // The first agent's compactor archives every segment.
            compactor: CompactorScope::Off,
            default_replication_factor,
            replica_repair_after: silt_agent::agent::DEFAULT_REPLICA_REPAIR_AFTER,
            peer_source_ip: None,
        }));
    }
    // Every agent of the process is registered before any says it listens, the first one
    // ("silt dev") last: a client that starts once that line is out finds them all live.
    let started = futures::future::try_join_all(servers).await;
    let served: Result<Vec<()>> = match started {
        Ok(mut started) => {
            started.rotate_left(1);
            futures::future::join_all(started.into_iter().map(Serving::run)).await.into_iter().collect()
        }
        Err(e) => Err(e),
    };
    metadata.shutdown().await;
    drop(lock);
    served.map(|_| ())
}

/// Most agents `silt dev --agents` runs.
pub const AGENTS_MAX: u32 = 5;

/// Longest a stopping agent spends archiving what it wrote (systemd's stop timeout is 120 s).
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Listens on `listen`; returns the listener and the address it got (port 0 picks one).
pub(crate) async fn bind(listen: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr().context("listener has no address")?;
    Ok((listener, addr))
}

/// Which sealed segments the compactor of an agent process archives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactorScope {
    /// Every sealed segment (one process holds them all: `silt dev`).
    All,
    /// Those this agent holds a replica of.
    Held,
    /// None: a `silt compactor` process, or no archive.
    Off,
}

/// What an agent process (`silt dev`, `silt agent`) serves with.
pub(crate) struct ServeConfig {
    /// How the startup line names the process.
    pub name: String,
    pub agent_id: String,
    pub advertise_addr: String,
    pub listener: tokio::net::TcpListener,
    /// `<data_dir>/agent` holds the local logs, `<data_dir>/cache` the cold-read cache.
    pub data_dir: PathBuf,
    pub object_store: String,
    pub cache: ColdCacheArgs,
    pub metadata: Metadata,
    pub lease: std::time::Duration,
    pub compactor: CompactorScope,
    /// `replication.factor` of topics created without one.
    pub default_replication_factor: u32,
    /// How long an agent may be gone before its replicas of sealed segments are copied.
    pub replica_repair_after: std::time::Duration,
    /// The local address connections to other agents leave from; `None` lets the OS choose.
    pub peer_source_ip: Option<std::net::IpAddr>,
}

/// The bucket at `url` as every process uses it: retried, instrumented, and with injected
/// faults when `SILT_TEST_OBJECT_STORE_FAULTS` asks for them. Returns the store, its request
/// counters and Silt's prefix in it.
pub(crate) fn open_archive(
    url: &str,
) -> Result<(Arc<dyn ObjectStore>, Arc<ObjectStoreStats>, object_store::path::Path)> {
    let archive =
        object_store_from_url(url).with_context(|| format!("cannot open the object store {url}"))?;
    let mut base: Arc<dyn ObjectStore> = archive.store;
    if let Ok(spec) = std::env::var(FAULTS_ENV) {
        let faults =
            FaultConfig::from_env_str(&spec).with_context(|| format!("invalid {FAULTS_ENV}='{spec}'"))?;
        warn!(%spec, "injecting object store faults (testing only)");
        base = Arc::new(FaultInjectingObjectStore::new(base, faults));
    }
    let instrumented = InstrumentedObjectStore::new(Arc::new(RetryingObjectStore::new(base)));
    let stats = instrumented.stats();
    Ok((Arc::new(instrumented), stats, archive.prefix))
}

/// Serves the agent API (and the compactor) until SIGINT or SIGTERM, then drains and stops
/// the agent. The caller owns the metadata and the data directory lock.
pub(crate) async fn serve(config: ServeConfig) -> Result<()> {
    start(config).await?.run().await
}

/// An agent process registered with metadata, its compactor running, that has not yet said
/// it listens nor accepted a connection.
pub(crate) struct Serving {
    name: String,
    agent_id: String,
    listener: tokio::net::TcpListener,
    data_dir: PathBuf,
    url: String,
    scope: CompactorScope,
    agent: Agent,
    cold: Arc<ColdReader>,
    compactor: Option<Compactor>,
    compactor_task: Option<tokio::task::JoinHandle<()>>,
    stop_compactor: CancellationToken,
}

/// Starts the agent (it registers with metadata) and its compactor.
pub(crate) async fn start(config: ServeConfig) -> Result<Serving> {
    let url = config.object_store.clone();
    let (store, store_stats, prefix) = open_archive(&url)?;
    if let Ok(spec) = std::env::var(FSYNC_FAULTS_ENV) {
        silt_agent::log::disk::inject_fsync_errors_from_spec(&spec)
            .map_err(|e| anyhow::anyhow!("invalid {FSYNC_FAULTS_ENV}='{spec}': {e}"))?;
        warn!(%spec, "injecting fsync errors (testing only)");
    }

    let cold = ColdReader::new(Arc::clone(&store), config.cache.options(&config.data_dir))
        .await
        .context("cannot start the cold-read cache")?;
    let cold = Arc::new(cold);

    let cancel = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let mut agent_config = AgentConfig::new(
        config.agent_id.clone(),
        config.advertise_addr.clone(),
        config.data_dir.join("agent"),
    );
    agent_config.lease = config.lease;
    agent_config.default_replication_factor = config.default_replication_factor;
    agent_config.replica_repair_after = config.replica_repair_after;
    agent_config.peer_source_ip = config.peer_source_ip;
    let agent = Agent::start(
        agent_config,
        config.metadata.clone(),
        Arc::clone(&metrics),
        Some(Archive { cold: Arc::clone(&cold), store: Arc::clone(&store), prefix: prefix.clone() }),
        cancel.clone(),
    )
    .await
    .context("cannot start the agent")?;

    let compactor_metrics = Arc::new(CompactorMetrics::new());
    let compactor = (config.compactor != CompactorScope::Off).then(|| {
        Compactor::new(
            CompactorConfig {
                holder: (config.compactor == CompactorScope::Held).then(|| config.agent_id.clone()),
                ..CompactorConfig::default()
            },
            config.metadata.clone(),
            Arc::clone(&store),
            prefix.clone(),
            Arc::new(LocalAgent(agent.clone())),
            Arc::clone(&compactor_metrics),
        )
    });
    // The API stops first, then the compactor's loop, then (after the drain) the agent.
    let stop_compactor = CancellationToken::new();
    let compactor_task = compactor.clone().map(|c| tokio::spawn(c.run(stop_compactor.clone())));
    {
        let compactor_metrics = Arc::clone(&compactor_metrics);
        metrics.add_source(move || compactor_metrics.encode());
        let store_stats = Arc::clone(&store_stats);
        metrics.add_source(move || store_stats.encode_prometheus());
        let cold = Arc::clone(&cold);
        metrics.add_source(move || cold.stats().encode_prometheus());
        if let Metadata::Remote(remote) = &config.metadata {
            let remote = remote.clone();
            metrics.add_source(move || remote.encode_prometheus());
        }
    }

    Ok(Serving {
        name: config.name,
        agent_id: config.agent_id,
        listener: config.listener,
        data_dir: config.data_dir,
        url,
        scope: config.compactor,
        agent,
        cold,
        compactor,
        compactor_task,
        stop_compactor,
    })
}

impl Serving {
    /// Says where it listens, then serves until SIGINT or SIGTERM, drains and stops.
    pub(crate) async fn run(self) -> Result<()> {
        let Serving {
            name,
            agent_id,
            listener,
            data_dir,
            url,
            scope,
            agent,
            cold,
            compactor,
            compactor_task,
            stop_compactor,
        } = self;
        let addr = listener.local_addr().context("listener has no address")?;
        // Tests and scripts read this line to find the address.
        println!("{name} listening on http://{addr} (data in {}, archive {url})", data_dir.display());
        info!(%addr, archive = %url, agent = %agent_id, "serving");
        let stop = stop_compactor.clone();
        let serving = agent.clone();
        let server = silt_agent::api::serve(listener, agent.clone(), async move {
            shutdown_signal().await;
            serving.stop_serving();
            stop.cancel();
        });
        server.await.context("API server failed")?;
        info!("shutting down");
        if let Some(task) = compactor_task {
            if let Err(e) = task.await {
                warn!(error = %e, "the compactor task failed");
            }
        }
        if let Some(compactor) = compactor.filter(|_| scope == CompactorScope::Held) {
            // An agent of a cluster hands over only archived data: it seals what it wrote and
            // archives it, so that its partitions' next writers need nothing from its disk.
            agent.roll_all().await;
            let left = compactor.drain(DRAIN_TIMEOUT).await;
            if left > 0 {
                warn!(
                    segments = left,
                    "stopping with sealed segments not archived yet; they stay on this agent's disk"
                );
            }
        }
        agent.shutdown().await;
        // The cold-read cache writes what it holds in memory to its disk tier as it closes: done
        // here, while the runtime still runs its tasks, rather than cut off when the runtime stops.
        if let Err(e) = cold.close().await {
            warn!(error = %e, "closing the cold-read cache failed; it starts cold next time");
        }
        Ok(())
    }
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SILT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
