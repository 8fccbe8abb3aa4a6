//! `silt metadata`: one node of a metadata cluster in its own process.
//!
//! The node keeps its Raft log and snapshots under `<data-dir>/metadata` (the layout of `silt
//! dev`), locks `<data-dir>/LOCK`, and serves the Raft RPCs of its peers and the metadata API on
//! one listener (`silt_metadata::server`). SIGINT or SIGTERM stops accepting requests,
//! finishes those in flight and stops the Raft node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use silt_metadata::{MetadataNode, MetadataNodeOptions, NodeRole};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::data_dir::lock_data_dir;

/// What `silt metadata` runs with.
#[derive(Debug, Clone)]
pub struct MetadataConfig {
    /// This node's id in the cluster.
    pub id: u64,
    /// Address to serve peers and clients on.
    pub listen: SocketAddr,
    /// All state lives under this directory.
    pub data_dir: PathBuf,
    /// The cluster's initial members, id -> `host:port` (the addresses peers and clients use).
    pub peers: BTreeMap<u64, String>,
    /// Initialize the cluster with `peers` as voters if this node is fresh.
    pub init: bool,
    /// Raft and timeout tunables.
    pub options: MetadataNodeOptions,
}

/// Parses `1=127.0.0.1:7101,2=127.0.0.1:7102` (given as separate items) into id -> address.
pub fn parse_peers(items: &[String]) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .with_context(|| format!("--peers item '{item}' is not ID=HOST:PORT (e.g. 1=127.0.0.1:7101)"))?;
        let id: u64 =
            id.trim().parse().with_context(|| format!("--peers item '{item}': '{id}' is not a node id"))?;
        let addr = addr.trim();
        if addr.is_empty() || !addr.contains(':') {
            bail!("--peers item '{item}': '{addr}' is not HOST:PORT");
        }
        if peers.insert(id, addr.to_string()).is_some() {
            bail!("--peers names node {id} twice");
        }
    }
    Ok(peers)
}

/// Runs the node until SIGINT or SIGTERM, then drains and stops.
pub async fn run(config: MetadataConfig) -> Result<()> {
    init_tracing();
    let id = config.id;
    if config.init && config.peers.is_empty() {
        bail!("--init needs --peers with every initial member, e.g. --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103");
    }
    if !config.peers.is_empty() && !config.peers.contains_key(&id) {
        bail!("--peers does not name this node (--id {id}); list every initial member, this one included");
    }
    let lock = lock_data_dir(&config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().context("listener has no address")?;
    if let Some(advertised) = config.peers.get(&id) {
        if advertised.parse::<SocketAddr>().is_ok_and(|a| a != addr) {
            warn!(%addr, %advertised, "this node listens on another address than --peers gives for it; peers and clients use the --peers address");
        }
    }

    let initial_members = config.init.then(|| config.peers.clone());
    let node =
        MetadataNode::open_cluster(&config.data_dir.join("metadata"), id, initial_members, config.options)
            .await
            .context("cannot start the metadata node")?;
    let cancel = CancellationToken::new();
    let watcher = tokio::spawn(log_role_changes(node.clone(), cancel.child_token()));

    // Tests and scripts read this line to find the address.
    println!("silt metadata listening on http://{addr} (node {id}, data in {})", config.data_dir.display());
    info!(%addr, id, "serving");
    let served = silt_metadata::server::serve(listener, node.clone(), shutdown_signal()).await;
    info!("shutting down");
    cancel.cancel();
    if let Err(e) = watcher.await {
        warn!(error = %e, "the role watcher failed");
    }
    node.shutdown().await;
    drop(lock);
    served.context("metadata server failed")
}

/// Logs when this node's role, term or leader changes, until cancelled.
async fn log_role_changes(node: MetadataNode, cancel: CancellationToken) {
    let mut metrics = node.metrics();
    let mut last: Option<(NodeRole, u64, Option<u64>)> = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (NodeRole::from(m.state), m.current_term, m.current_leader)
        };
        if last != Some(now) {
            let (role, term, leader) = now;
            info!(role = ?role, term, leader = ?leader, "metadata node role");
            last = Some(now);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

// The same as `silt dev`'s; kept here so `dev.rs` stays as it is.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_refuse_nonsense() {
        let items = vec!["1=127.0.0.1:7101".to_string(), " 2 = 127.0.0.1:7102 ".to_string()];
        let peers = parse_peers(&items).unwrap();
        assert_eq!(peers[&1], "127.0.0.1:7101");
        assert_eq!(peers[&2], "127.0.0.1:7102");
        for bad in ["127.0.0.1:7101", "x=127.0.0.1:1", "1=", "1=host"] {
            assert!(parse_peers(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert!(parse_peers(&["1=a:1".to_string(), "1=b:2".to_string()]).is_err());
    }
}
