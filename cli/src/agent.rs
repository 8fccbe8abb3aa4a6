//! `silt agent`: one agent in its own process, against a metadata cluster.
//!
//! The agent registers with metadata under `--id` (a new incarnation and a lease), heartbeats,
//! and writes the partitions metadata names it writer of. Its local logs live under
//! `<data-dir>/agent`, the cold-read cache under `<data-dir>/cache`; it keeps nothing that
//! metadata, the bucket and the replicas cannot rebuild, so an agent restarted with an empty
//! data directory rejoins and is given work. By default it also archives the sealed segments
//! it holds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use silt_metadata::{Metadata, MetadataClient, RemoteMetadata};
use tokio_util::sync::CancellationToken;

use crate::data_dir::lock_data_dir;
use crate::dev::{bind, init_tracing, serve, ColdCacheArgs, CompactorScope, ServeConfig};

/// What `silt agent` runs with.
#[derive(Debug, Clone)]
pub struct AgentProcessConfig {
    /// Agent id, stable across restarts.
    pub id: String,
    /// Address to serve the API on.
    pub listen: SocketAddr,
    /// Address recorded in metadata for other agents and clients; default `listen`.
    pub advertise: Option<String>,
    /// Metadata nodes (`host:port`); any of the cluster will do.
    pub metadata: Vec<String>,
    /// All local state lives under this directory.
    pub data_dir: PathBuf,
    /// The bucket every agent of the cluster shares.
    pub object_store: String,
    /// The cold reader's caches.
    pub cache: ColdCacheArgs,
    /// The agent's lease in metadata.
    pub lease: Duration,
    /// Archive the sealed segments this agent holds.
    pub compactor: bool,
    /// `replication.factor` of topics created through this agent without one.
    pub default_replication_factor: u32,
    /// How long an agent may be gone before its replicas of sealed segments are copied.
    pub replica_repair_after: Duration,
    /// The local address connections to other agents leave from.
    pub peer_source_ip: Option<std::net::IpAddr>,
}

/// The address other agents reach this one at when `--advertise` is not given: the listener's,
/// or, when it listens on every interface (`0.0.0.0`), the local address the kernel routes
/// towards the first metadata node (the interface the cluster shares), with the listener's port.
fn default_advertise(listen: SocketAddr, metadata: &[String]) -> Result<String> {
    if !listen.ip().is_unspecified() {
        return Ok(listen.to_string());
    }
    let first = metadata.first().context("--metadata names no node")?;
    let target = first.trim_start_matches("http://").trim_start_matches("https://");
    let probe = std::net::UdpSocket::bind(("0.0.0.0", 0))
        .and_then(|s| s.connect(target).map(|()| s))
        .and_then(|s| s.local_addr())
        .with_context(|| format!("cannot tell which address reaches {target}; give --advertise HOST:PORT"))?;
    Ok(SocketAddr::new(probe.ip(), listen.port()).to_string())
}

/// Runs the agent until SIGINT or SIGTERM, then drains, deregisters and stops.
pub async fn run(config: AgentProcessConfig) -> Result<()> {
    init_tracing();
    let lock = lock_data_dir(&config.data_dir)?;
    let (listener, addr) = bind(config.listen).await?;
    let advertise = match &config.advertise {
        Some(a) => a.clone(),
        None => default_advertise(addr, &config.metadata)?,
    };
    let client = MetadataClient::new(config.metadata.clone()).context("invalid --metadata")?;
    let cancel = CancellationToken::new();
    let remote = RemoteMetadata::connect(client, cancel.clone())
        .await
        .with_context(|| format!("cannot reach the metadata cluster at {}", config.metadata.join(",")))?;
    let served = serve(ServeConfig {
        name: "silt agent".into(),
        agent_id: config.id.clone(),
        advertise_addr: advertise,
        listener,
        data_dir: config.data_dir.clone(),
        object_store: config.object_store.clone(),
        cache: config.cache.clone(),
        metadata: Metadata::Remote(remote),
        lease: config.lease,
        compactor: if config.compactor { CompactorScope::Held } else { CompactorScope::Off },
        default_replication_factor: config.default_replication_factor,
        replica_repair_after: config.replica_repair_after,
        peer_source_ip: config.peer_source_ip,
    })
    .await;
    cancel.cancel();
    drop(lock);
    served
}
