//! `silt compactor`: the compactor in its own process, for clusters.
//!
//! It reads metadata through a metadata cluster, reads each sealed segment from an agent that
//! holds it (its ensemble, through the agent's `/internal/v1/.../held`, which serves the
//! records as stored), writes the Parquet objects to the bucket and commits them in metadata, exactly as
//! the compactor inside `silt dev` does. It keeps no state of its own: run one (or more; the
//! conditional create keeps them from archiving a segment twice). Agents then run with
//! `--no-compactor`. It serves `/metrics` and `/health` on `--listen`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::routing::get;
use silt_agent::limits::{ReadLimit, READ_BYTES_DEFAULT};
use silt_agent::transport::{HttpPeers, Peer};
use silt_compactor::metrics::CompactorMetrics;
use silt_compactor::{Compactor, CompactorConfig, SegmentSource};
use silt_metadata::{Metadata, MetadataClient, RemoteMetadata};
use silt_record::Record;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::dev::{bind, init_tracing, open_archive, shutdown_signal};

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
    peers: HttpPeers,
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
        // The agents holding the segment (its ensemble), live ones first, then its unverified
        // members; the partition's writer last (it passes reads of segments it does not hold on).
        let sources: Vec<(String, String)> = self.metadata.read_local(|s| {
            let now = s.clock_ms;
            let Some(p) = s.topics.get(topic).and_then(|t| t.partitions.get(partition as usize)) else {
                return Vec::new();
            };
            let segment = p.segments.get(&base_offset);
            let live_first = |agents: &mut Vec<&String>| {
                agents.sort_by_key(|a| !s.agents.get(*a).is_some_and(|i| i.is_live(now)));
            };
            let mut holders: Vec<&String> =
                segment.map(|seg| seg.ensemble.iter().collect()).unwrap_or_default();
            live_first(&mut holders);
            // Then the members a recovery did not hear from (`Segment::unverified`): when no
            // holder has it, one of them may (a copy short of the segment is refused below).
            let mut unverified: Vec<&String> =
                segment.map(|seg| seg.unverified.iter().collect()).unwrap_or_default();
            live_first(&mut unverified);
            holders.extend(unverified);
            let mut out: Vec<(String, String)> = holders
                .into_iter()
                .filter_map(|a| s.agents.get(a).map(|i| (a.clone(), i.addr.clone())))
                .collect();
            if let Some(w) = p.writer.as_ref().and_then(|w| s.agents.get(w)) {
                if !out.iter().any(|(a, _)| *a == w.id) {
                    out.push((w.id.clone(), w.addr.clone()));
                }
            }
            out
        });
        let mut last = format!("no agent holds segment {base_offset} of {topic}/{partition}");
        for (agent, addr) in sources {
            match self.read_from(&agent, &addr, topic, partition, base_offset, last_offset).await {
                Ok(records) => return Ok(records),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

impl AgentsOverHttp {
    async fn read_from(
        &self,
        agent: &str,
        addr: &str,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, String> {
        let mut records = Vec::new();
        let mut next = base_offset;
        while next <= last_offset {
            let want = ((last_offset - next + 1) as usize).min(PAGE_RECORDS);
            let page = self
                .peers
                .read_held((agent, addr), topic, partition, next, ReadLimit::new(want, READ_BYTES_DEFAULT))
                .await
                .map_err(|e| e.to_string())?;
            if page.records.is_empty() {
                break;
            }
            for record in page.records {
                if record.offset > last_offset {
                    return Ok(records);
                }
                next = record.offset + 1;
                records.push(record);
            }
        }
        Ok(records)
    }
}

/// Runs the compactor until SIGINT or SIGTERM.
pub async fn run(config: CompactorProcessConfig) -> Result<()> {
    init_tracing();
    let url = config.object_store.clone();
    let (store, store_stats, prefix) = open_archive(&url)?;

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
        prefix.clone(),
        Arc::new(AgentsOverHttp { metadata: metadata.clone(), peers: HttpPeers::new("compactor") }),
        Arc::clone(&metrics),
    );

    let (listener, addr) = bind(config.listen).await?;
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
