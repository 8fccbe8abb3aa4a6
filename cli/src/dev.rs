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
use silt_metadata::MetadataNode;
use silt_record::Record;
use silt_tiering::cold_reader::{ColdReader, ColdReaderOptions};
use silt_tiering::fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore};
use silt_tiering::instrumented_object_store::InstrumentedObjectStore;
use silt_tiering::retrying_object_store::RetryingObjectStore;
use silt_tiering::store_url::object_store_from_url;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::data_dir::{default_object_store_url, lock_data_dir};

/// Environment variable that turns on fault injection in the object store, for tests only:
/// `error_rate=0.2,seed=7` (see `FaultConfig`).
pub const FAULTS_ENV: &str = "SILT_TEST_OBJECT_STORE_FAULTS";

/// What `silt dev` runs with.
#[derive(Debug, Clone)]
pub struct DevConfig {
    /// All state lives under this directory.
    pub data_dir: PathBuf,
    /// API address.
    pub listen: SocketAddr,
    /// Archive URL; default `file://<data_dir>/objects`.
    pub object_store: Option<String>,
    /// Memory of the cold-read cache.
    pub cache_memory_bytes: usize,
    /// Disk of the cold-read cache; 0 turns the disk tier off.
    pub cache_disk_bytes: usize,
}

/// The compactor reads sealed segments from the agent in the same process.
struct LocalAgent(Agent);

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

/// Runs until SIGINT or SIGTERM, then drains and stops.
pub async fn run(config: DevConfig) -> Result<()> {
    init_tracing();
    let lock = lock_data_dir(&config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().context("listener has no address")?;

    let url = match &config.object_store {
        Some(u) => u.clone(),
        None => default_object_store_url(&config.data_dir)?,
    };
    let archive =
        object_store_from_url(&url).with_context(|| format!("cannot open the object store {url}"))?;
    let mut base: Arc<dyn ObjectStore> = archive.store;
    if let Ok(spec) = std::env::var(FAULTS_ENV) {
        let faults =
            FaultConfig::from_env_str(&spec).with_context(|| format!("invalid {FAULTS_ENV}='{spec}'"))?;
        warn!(%spec, "injecting object store faults (testing only)");
        base = Arc::new(FaultInjectingObjectStore::new(base, faults));
    }
    let instrumented = InstrumentedObjectStore::new(Arc::new(RetryingObjectStore::new(base)));
    let store_stats = instrumented.stats();
    let store: Arc<dyn ObjectStore> = Arc::new(instrumented);

    let cold = ColdReader::new(
        Arc::clone(&store),
        ColdReaderOptions {
            memory_bytes: config.cache_memory_bytes,
            disk_dir: (config.cache_disk_bytes > 0).then(|| config.data_dir.join("cache")),
            disk_bytes: config.cache_disk_bytes,
            ..ColdReaderOptions::default()
        },
    )
    .await
    .context("cannot start the cold-read cache")?;
    let cold = Arc::new(cold);

    let metadata = MetadataNode::open(&config.data_dir.join("metadata"), 1, addr.to_string())
        .await
        .context("cannot start the metadata service")?;
    let cancel = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let agent = Agent::start(
        AgentConfig { agent_id: "dev".into(), data_dir: config.data_dir.join("agent") },
        metadata.clone(),
        Arc::clone(&metrics),
        Some(Archive { cold: Arc::clone(&cold), store: Arc::clone(&store), prefix: archive.prefix.clone() }),
        cancel.clone(),
    )
    .await
    .context("cannot start the agent")?;

    let compactor_metrics = Arc::new(CompactorMetrics::new());
    let compactor = Compactor::new(
        CompactorConfig::default(),
        metadata.clone(),
        Arc::clone(&store),
        archive.prefix.clone(),
        Arc::new(LocalAgent(agent.clone())),
        Arc::clone(&compactor_metrics),
    );
    let compactor_task = tokio::spawn(compactor.run(cancel.child_token()));
    {
        let compactor_metrics = Arc::clone(&compactor_metrics);
        metrics.add_source(move || compactor_metrics.encode());
        let store_stats = Arc::clone(&store_stats);
        metrics.add_source(move || store_stats.encode_prometheus());
        let cold = Arc::clone(&cold);
        metrics.add_source(move || cold.stats().encode_prometheus());
    }

    // Tests and scripts read this line to find the address.
    println!("silt dev listening on http://{addr} (data in {}, archive {url})", config.data_dir.display());
    info!(%addr, archive = %url, "serving");
    let stop = cancel.clone();
    let server = silt_agent::api::serve(listener, agent.clone(), async move {
        shutdown_signal().await;
        stop.cancel();
    });
    server.await.context("API server failed")?;
    info!("shutting down");
    if let Err(e) = compactor_task.await {
        warn!(error = %e, "the compactor task failed");
    }
    agent.shutdown().await;
    metadata.shutdown().await;
    drop(lock);
    Ok(())
}

async fn shutdown_signal() {
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

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SILT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
