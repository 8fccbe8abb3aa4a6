//! `silt dev`: one metadata node, one agent and (later) the compactor in one process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use silt_agent::metrics::Metrics;
use silt_agent::{Agent, AgentConfig};
use silt_metadata::MetadataNode;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// What `silt dev` runs with.
#[derive(Debug, Clone)]
pub struct DevConfig {
    /// All state lives under this directory.
    pub data_dir: PathBuf,
    /// API address.
    pub listen: SocketAddr,
}

/// Runs until SIGINT or SIGTERM, then drains and stops.
pub async fn run(config: DevConfig) -> Result<()> {
    init_tracing();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;
    // One process per data directory: a second one would corrupt the logs.
    let lock_path = config.data_dir.join("LOCK");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    lock.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "data directory {} is in use by another silt process; stop it or choose another --data-dir",
            config.data_dir.display()
        )
    })?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().context("listener has no address")?;
    let metadata = MetadataNode::open(&config.data_dir.join("metadata"), 1, addr.to_string())
        .await
        .context("cannot start the metadata service")?;
    let cancel = CancellationToken::new();
    let agent = Agent::start(
        AgentConfig { agent_id: "dev".into(), data_dir: config.data_dir.join("agent") },
        metadata.clone(),
        Arc::new(Metrics::new()),
        cancel.clone(),
    )
    .await
    .context("cannot start the agent")?;
    // Tests and scripts read this line to find the address.
    println!("silt dev listening on http://{addr} (data in {})", config.data_dir.display());
    info!(%addr, "serving");
    let stop = cancel.clone();
    let server = silt_agent::api::serve(listener, agent.clone(), async move {
        shutdown_signal().await;
        stop.cancel();
    });
    server.await.context("API server failed")?;
    info!("shutting down");
    agent.shutdown().await;
    metadata.shutdown().await;
    drop(lock);
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
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
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SILT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
