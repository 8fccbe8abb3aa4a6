//! [`Metadata`]: how agents and the compactor reach the metadata service, whether it runs in
//! the same process (`silt dev`) or is a cluster of `silt metadata` processes.
//!
//! Both kinds offer the same three operations: `write` (commit a command), `read` (a
//! linearizable read, for decisions) and `read_local` (this process's latest copy, for hot
//! paths that tolerate a slightly stale view). For a remote cluster the local copy is the
//! whole state, refreshed by a background task every [`REFRESH_INTERVAL`] and right after each
//! write, so a write is followed by a local view that includes it. A refresh asks for the state
//! only if something was applied since the copy's index, so an idle cluster costs a small
//! answer per refresh.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::api::Change;
use crate::{Command, MetadataClient, MetadataError, MetadataNode, MetadataState, Response};

/// How often a remote copy of the state is refreshed when nothing asks for it sooner.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(200);
/// Longest a write waits for the local copy to include it before returning anyway.
const READ_YOUR_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The metadata service as agents and the compactor see it. Cheap to clone.
#[derive(Clone)]
pub enum Metadata {
    /// A node in this process (`silt dev`, tests).
    Local(MetadataNode),
    /// A `silt metadata` cluster, with a local copy of its state.
    Remote(RemoteMetadata),
}

impl From<MetadataNode> for Metadata {
    fn from(node: MetadataNode) -> Self {
        Metadata::Local(node)
    }
}

impl Metadata {
    /// Commits `cmd` and returns what applying it produced; a refused command is `Err`.
    pub async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        match self {
            Metadata::Local(node) => node.write(cmd).await,
            Metadata::Remote(remote) => remote.write(cmd).await,
        }
    }

    /// Like [`write`](Self::write), without waiting for this process's copy to include the
    /// write (heartbeats: nothing reads what they change here).
    pub async fn write_unobserved(&self, cmd: Command) -> Result<Response, MetadataError> {
        match self {
            Metadata::Local(node) => node.write(cmd).await,
            Metadata::Remote(remote) => remote.inner.client.write(cmd).await,
        }
    }

    /// Runs `f` over a state that includes every write committed before this call.
    pub async fn read<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> Result<T, MetadataError> {
        match self {
            Metadata::Local(node) => node.read(f).await,
            Metadata::Remote(remote) => {
                let state = remote.refresh().await?;
                Ok(f(&state))
            }
        }
    }

    /// Runs `f` over this process's latest copy of the state: fast, possibly a little stale.
    pub fn read_local<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> T {
        match self {
            Metadata::Local(node) => node.read_local(f),
            Metadata::Remote(remote) => f(&remote.snapshot()),
        }
    }

    /// Stops the in-process node, or the remote copy's refresher.
    pub async fn shutdown(&self) {
        match self {
            Metadata::Local(node) => node.shutdown().await,
            Metadata::Remote(remote) => remote.inner.cancel.cancel(),
        }
    }
}

/// A remote metadata cluster and a local copy of its state. Cheap to clone.
#[derive(Clone)]
pub struct RemoteMetadata {
    inner: Arc<RemoteInner>,
}

struct RemoteInner {
    client: MetadataClient,
    /// The copy, and the applied index it is current at.
    state: RwLock<(Arc<MetadataState>, Option<u64>)>,
    /// Bumped by every caller that needs a refresh that starts after it asked.
    requested: AtomicU64,
    /// The highest request number a finished refresh covers.
    completed: watch::Sender<u64>,
    wake: Notify,
    cancel: CancellationToken,
    /// Refreshes that fetched the whole state, and those that applied changes.
    full_reads: AtomicU64,
    change_reads: AtomicU64,
}

impl RemoteMetadata {
    /// Connects: reads the state once (so the local copy is never empty), then keeps it fresh
    /// until `cancel`.
    pub async fn connect(client: MetadataClient, cancel: CancellationToken) -> Result<Self, MetadataError> {
        let first = client.read_state().await?;
        let remote = RemoteMetadata {
            inner: Arc::new(RemoteInner {
                client,
                state: RwLock::new((Arc::new(first.state), first.applied_index)),
                requested: AtomicU64::new(0),
                completed: watch::Sender::new(0),
                wake: Notify::new(),
                cancel,
                full_reads: AtomicU64::new(1),
                change_reads: AtomicU64::new(0),
            }),
        };
        let refresher = remote.clone();
        tokio::spawn(async move { refresher.run_refresher().await });
        Ok(remote)
    }

    /// How many refreshes fetched the whole state (the first one included) and how many caught
    /// up by applying the commands applied since.
    pub fn refresh_counts(&self) -> (u64, u64) {
        (self.inner.full_reads.load(Ordering::Relaxed), self.inner.change_reads.load(Ordering::Relaxed))
    }

    /// [`refresh_counts`](Self::refresh_counts) in the Prometheus text format, as
    /// `silt_agent_metadata_refreshes_total{how="whole"|"changes"}`.
    pub fn encode_prometheus(&self) -> String {
        let (whole, changes) = self.refresh_counts();
        format!(
            "# HELP silt_agent_metadata_refreshes_total Refreshes of this process's copy of the metadata state: by fetching it whole, or by applying the commands applied since.\n\
             # TYPE silt_agent_metadata_refreshes_total counter\n\
             silt_agent_metadata_refreshes_total{{how=\"whole\"}} {whole}\n\
             silt_agent_metadata_refreshes_total{{how=\"changes\"}} {changes}\n"
        )
    }

    /// The client this copy reads through.
    pub fn client(&self) -> &MetadataClient {
        &self.inner.client
    }

    fn snapshot(&self) -> Arc<MetadataState> {
        Arc::clone(&self.inner.state.read().unwrap_or_else(|e| e.into_inner()).0)
    }

    async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        let response = self.inner.client.write(cmd).await;
        // Refused commands were committed too; either way the copy should catch up.
        if !matches!(response, Err(MetadataError::Unavailable(_))) {
            let wanted = self.inner.requested.fetch_add(1, Ordering::SeqCst) + 1;
            self.inner.wake.notify_one();
            let mut completed = self.inner.completed.subscribe();
            let _ = tokio::time::timeout(READ_YOUR_WRITE_WAIT, completed.wait_for(|c| *c >= wanted)).await;
        }
        response
    }

    /// A linearizable read of the whole state, which also refreshes the local copy.
    async fn refresh(&self) -> Result<Arc<MetadataState>, MetadataError> {
        let covers = self.inner.requested.load(Ordering::SeqCst);
        let known = self.inner.state.read().unwrap_or_else(|e| e.into_inner()).1;
        let state = match known {
            Some(index) => {
                // Only what changed, while the leader keeps it; a node that does not answer
                // with changes (an older version) sends the whole state instead.
                let delta = match self.inner.client.read_changes_after(index).await {
                    Err(MetadataError::InvalidArgument(_)) => {
                        self.inner.client.read_state_after(index).await?
                    }
                    other => other?,
                };
                match (delta.state, delta.changes) {
                    (Some(state), _) => {
                        self.inner.full_reads.fetch_add(1, Ordering::Relaxed);
                        self.replace(state, delta.applied_index)
                    }
                    (None, Some(changes)) => {
                        self.inner.change_reads.fetch_add(1, Ordering::Relaxed);
                        self.apply_changes(&changes, delta.applied_index)
                    }
                    (None, None) => self.snapshot(),
                }
            }
            None => {
                let reply = self.inner.client.read_state().await?;
                self.inner.full_reads.fetch_add(1, Ordering::Relaxed);
                self.replace(reply.state, reply.applied_index)
            }
        };
        self.inner.completed.send_if_modified(|c| {
            let newer = covers > *c;
            *c = (*c).max(covers);
            newer
        });
        Ok(state)
    }

    /// Applies to the copy the commands it does not include yet (the changes start at or before
    /// its index: it only moves forward), as the metadata nodes applied them.
    fn apply_changes(&self, changes: &[Change], applied_index: Option<u64>) -> Arc<MetadataState> {
        let mut copy = self.inner.state.write().unwrap_or_else(|e| e.into_inner());
        if applied_index > copy.1 {
            let from = copy.1;
            // Copied only if a reader still holds the current one.
            let state = Arc::make_mut(&mut copy.0);
            for change in changes.iter().filter(|c| Some(c.index) > from) {
                state.apply(&change.command);
            }
            copy.1 = applied_index;
        }
        Arc::clone(&copy.0)
    }

    fn replace(&self, state: MetadataState, applied_index: Option<u64>) -> Arc<MetadataState> {
        let state = Arc::new(state);
        let mut copy = self.inner.state.write().unwrap_or_else(|e| e.into_inner());
        // Answers may arrive out of order (a read and the refresher): keep the newer one.
        if applied_index >= copy.1 {
            *copy = (Arc::clone(&state), applied_index);
        }
        Arc::clone(&copy.0)
    }

    async fn run_refresher(&self) {
        let mut failing = false;
        loop {
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(REFRESH_INTERVAL) => {}
            }
            match self.refresh().await {
                Ok(_) => failing = false,
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "cannot refresh the metadata copy; serving the last one");
                    }
                    failing = true;
                }
            }
        }
    }
}
