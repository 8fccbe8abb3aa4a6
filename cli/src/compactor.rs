//! `silt compactor`: the compactor in its own process, for clusters.
//!
//! It reads metadata through a metadata cluster, reads each sealed segment from the agent that
//! writes its partition (the agent's `/internal/v1/.../records`, which serves the records as
//! stored), writes the Parquet objects to the bucket and commits them in metadata, exactly as
//! the compactor inside `silt dev` does. It keeps no state of its own: run one (or more; the
//! conditional create keeps them from archiving a segment twice). Agents then run with
//! `--no-compactor`. It serves `/metrics` and `/health` on `--listen`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::routing::get;
use object_store::ObjectStore;
use silt_agent::peer::Peers;
use silt_compactor::metrics::CompactorMetrics;
use silt_compactor::{Compactor, CompactorConfig, SegmentSource};
use silt_metadata::{Metadata, MetadataClient, RemoteMetadata};
use silt_record::Record;
use silt_tiering::fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore};
use silt_tiering::instrumented_object_store::InstrumentedObjectStore;
use silt_tiering::retrying_object_store::RetryingObjectStore;
use silt_tiering::store_url::object_store_from_url;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::dev::{init_tracing, shutdown_signal, FAULTS_ENV};

/// Most records asked of an agent per request while reading a segment.
const PAGE_RECORDS: usize = 10_000;

/// What `silt compactor` runs with.
#[derive(Debug, Clone)]
pub struct CompactorProcessConfig {
    /// Metadata nodes (`host:port`).
    pub metadata: Vec<String>,
    /// The bucket the agents share.
    pub object_store: String,
    /// Where `/metrics` and `/health` are served.
    pub listen: SocketAddr,
    /// Segments archived at the same time.
    pub concurrency: usize,
    /// Bytes of segments being archived at once.
    pub memory_bytes: u64,
}

/// Reads sealed segments from the agents that write their partitions.
struct AgentsOverHttp {
    metadata: Metadata,
    peers: Peers,
}

#[async_trait::async_trait]
impl SegmentSource for AgentsOverHttp {
    async fn read_segment(
        &self,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, String> {
        let writer = self.metadata.read_local(|s| {
            let writer = s.topics.get(topic)?.partitions.get(partition as usize)?.writer.clone()?;
            let addr = s.agents.get(&writer)?.addr.clone();
            Some((writer, addr))
        });
        let (agent, addr) =
            writer.ok_or_else(|| format!("partition {topic}/{partition} has no live writer"))?;
        let mut records = Vec::new();
        let mut next = base_offset;
        while next <= last_offset {
            let want = ((last_offset - next + 1) as usize).min(PAGE_RECORDS);
            let page = self
                .peers
                .read((&agent, &addr), topic, partition, next, want)
                .await
                .map_err(|e| e.to_string())?;
            if page.records.is_empty() {
                break;
            }
            for r in page.records {
                let d = r.into_delivered().map_err(|e| e.to_string())?;
                if d.record.offset > last_offset {
                    return Ok(records);
                }
                next = d.record.offset + 1;
                records.push(d.record);
            }
        }
        Ok(records)
    }
}

/// Runs the compactor until SIGINT or SIGTERM.
pub async fn run(config: CompactorProcessConfig) -> Result<()> {
    init_tracing();
    let url = config.object_store.clone();
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

    let cancel = CancellationToken::new();
    let client = MetadataClient::new(config.metadata.clone()).context("invalid --metadata")?;
    let remote = RemoteMetadata::connect(client, cancel.clone())
        .await
        .with_context(|| format!("cannot reach the metadata cluster at {}", config.metadata.join(",")))?;
    let metadata = Metadata::Remote(remote);
    let metrics = Arc::new(CompactorMetrics::new());
    let compactor = Compactor::new(
        CompactorConfig {
            concurrency_max: config.concurrency.max(1),
            memory_bytes_max: config.memory_bytes,
            ..CompactorConfig::default()
        },
        metadata.clone(),
        Arc::clone(&store),
        archive.prefix.clone(),
        Arc::new(AgentsOverHttp { metadata: metadata.clone(), peers: Peers::new("compactor") }),
        Arc::clone(&metrics),
    );

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().context("listener has no address")?;
    let router = axum::Router::new()
        .route("/health", get(|| async { axum::Json(serde_json::json!({ "status": "ok" })) }))
        .route(
            "/metrics",
            get(move || {
                let (metrics, store_stats) = (Arc::clone(&metrics), Arc::clone(&store_stats));
                async move {
                    let mut text = metrics.encode();
                    text.push_str(&store_stats.encode_prometheus());
                    text.push_str("# EOF\n");
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        );
    let task = tokio::spawn(compactor.run(cancel.child_token()));
    println!("silt compactor listening on http://{addr} (archive {url})");
    info!(%addr, archive = %url, "compacting");
    let stop = cancel.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            stop.cancel();
        })
        .await
        .context("metrics server failed")?;
    if let Err(e) = task.await {
        warn!(error = %e, "the compactor task failed");
    }
    metadata.shutdown().await;
    Ok(())
}
