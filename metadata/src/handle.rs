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
//!
//! A remote copy reaches its cluster over HTTP, or, in the simulator, a node in the same
//! process over a [`MetadataLink`] that can be cut or lose its replies: the copy then lags and
//! its calls time out exactly as over a partitioned network.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::api::{Change, StateDelta};
use crate::node::{LeaderError, Route};
use crate::raft::state_machine_store::Changes;
use crate::raft::types::NodeId;
use crate::{Command, MetadataClient, MetadataError, MetadataNode, MetadataState, Response};

/// Most refreshes of a copy under way at once: one that takes longer than its attempt (see
/// `RemoteMetadata::bound_refreshes`) keeps going while the next starts.
const REFRESHES_IN_FLIGHT_MAX: u64 = 2;

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
            Metadata::Remote(remote) => remote.inner.source.write(cmd).await,
        }
    }

    /// Runs `f` over a state that includes every write committed before this call.
    pub async fn read<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> Result<T, MetadataError> {
        match self {
            Metadata::Local(node) => node.read(f).await,
            Metadata::Remote(remote) => {
                if crate::sim_bugs::stale_reads() {
                    return Ok(f(&remote.snapshot()));
                }
                let state = remote.refresh().await?;
                Ok(f(&state))
            }
        }
    }

    /// When this process's copy of the state was last known current: it includes every write
    /// committed before then. The node in this process is always current (`now`).
    pub fn current_as_of(&self) -> std::time::Instant {
        match self {
            Metadata::Local(_) => std::time::Instant::now(),
            Metadata::Remote(remote) => remote.current_as_of(),
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
    source: Source,
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
    /// When the latest refresh that succeeded started: the copy includes every write
    /// committed before then.
    current_as_of: std::sync::Mutex<std::time::Instant>,
    /// How long the refresher waits for one refresh before it starts the next beside it, in
    /// ms (0: it waits as long as the source's own timeout).
    refresh_attempt_ms: AtomicU64,
}

impl RemoteMetadata {
    /// Connects: reads the state once (so the local copy is never empty), then keeps it fresh
    /// until `cancel`.
    pub async fn connect(client: MetadataClient, cancel: CancellationToken) -> Result<Self, MetadataError> {
        Self::start(Source::Http(client), cancel).await
    }

    /// Like [`connect`](Self::connect), to `node` in this process over `link` (the simulator's
    /// agents: a copy that lags as a remote one does, behind a link that can fail).
    pub async fn linked(
        node: MetadataNode,
        link: Arc<MetadataLink>,
        cancel: CancellationToken,
    ) -> Result<Self, MetadataError> {
        Self::linked_cluster(LinkedCluster::of(node), link, cancel).await
    }

    /// Like [`linked`](Self::linked), to the nodes of `cluster`, whichever leads.
    pub async fn linked_cluster(
        cluster: Arc<LinkedCluster>,
        link: Arc<MetadataLink>,
        cancel: CancellationToken,
    ) -> Result<Self, MetadataError> {
        Self::start(Source::Linked { cluster, link }, cancel).await
    }

    async fn start(source: Source, cancel: CancellationToken) -> Result<Self, MetadataError> {
        let started = std::time::Instant::now();
        let (first_index, first) = source.read_state().await?;
        let remote = RemoteMetadata {
            inner: Arc::new(RemoteInner {
                source,
                state: RwLock::new((Arc::new(first), first_index)),
                requested: AtomicU64::new(0),
                completed: watch::Sender::new(0),
                wake: Notify::new(),
                cancel,
                full_reads: AtomicU64::new(1),
                change_reads: AtomicU64::new(0),
                current_as_of: std::sync::Mutex::new(started),
                refresh_attempt_ms: AtomicU64::new(0),
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

    fn snapshot(&self) -> Arc<MetadataState> {
        Arc::clone(&self.inner.state.read().unwrap_or_else(|e| e.into_inner()).0)
    }

    async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        let response = self.inner.source.write(cmd).await;
        // Refused commands were committed too; either way the copy should catch up.
        if !matches!(response, Err(MetadataError::Unavailable(_))) {
            let wanted = self.inner.requested.fetch_add(1, Ordering::SeqCst) + 1;
            self.inner.wake.notify_one();
            let mut completed = self.inner.completed.subscribe();
            let _ = tokio::time::timeout(READ_YOUR_WRITE_WAIT, completed.wait_for(|c| *c >= wanted)).await;
        }
        response
    }

    /// From now on the refresher waits `attempt` for a refresh, then starts the next one
    /// beside it (an answer lost on the way costs that long, not the source's whole timeout;
    /// the slow one still counts if it lands): an agent bounds it by a part of its lease, which
    /// its copy must stay current within.
    pub fn bound_refreshes(&self, attempt: Duration) {
        self.inner.refresh_attempt_ms.store(attempt.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// When the latest refresh of the copy that succeeded started: the copy includes every
    /// write metadata committed before then (and it may lag behind everything since).
    pub fn current_as_of(&self) -> std::time::Instant {
        *self.inner.current_as_of.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A linearizable read of the whole state, which also refreshes the local copy.
    async fn refresh(&self) -> Result<Arc<MetadataState>, MetadataError> {
        let started = std::time::Instant::now();
        let covers = self.inner.requested.load(Ordering::SeqCst);
        let known = self.inner.state.read().unwrap_or_else(|e| e.into_inner()).1;
        let state = match known {
            Some(index) => {
                // Only what changed, while the leader keeps it; a node that does not answer
                // with changes (an older version) sends the whole state instead.
                let delta = self.inner.source.read_changes_after(index).await?;
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
                let (applied_index, state) = self.inner.source.read_state().await?;
                self.inner.full_reads.fetch_add(1, Ordering::Relaxed);
                self.replace(state, applied_index)
            }
        };
        {
            let mut as_of = self.inner.current_as_of.lock().unwrap_or_else(|e| e.into_inner());
            *as_of = (*as_of).max(started);
        }
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
        let in_flight = Arc::new(AtomicU64::new(0));
        loop {
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(REFRESH_INTERVAL) => {}
            }
            let attempt = Duration::from_millis(self.inner.refresh_attempt_ms.load(Ordering::Relaxed));
            let refreshed = if attempt.is_zero() {
                self.refresh().await.map(|_| ())
            } else if in_flight.load(Ordering::SeqCst) >= REFRESHES_IN_FLIGHT_MAX {
                // The earlier ones are still out: wait for them rather than pile more on.
                continue;
            } else {
                // A refresh that takes longer is not dropped (a large state may need that long,
                // and it is current as of its start whenever it lands); the next starts beside it.
                let (me, counted) = (self.clone(), InFlight::count(&in_flight));
                let task = tokio::spawn(async move {
                    let _counted = counted;
                    me.refresh().await.map(|_| ())
                });
                match tokio::time::timeout(attempt, task).await {
                    Ok(Ok(refreshed)) => refreshed,
                    Ok(Err(e)) => Err(MetadataError::Unavailable(format!("the refresh task failed: {e}"))),
                    Err(_) => Err(MetadataError::Unavailable(format!(
                        "metadata did not answer a refresh within {} ms; another starts beside it",
                        attempt.as_millis()
                    ))),
                }
            };
            match refreshed {
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

/// One refresh under way, counted in the refresher's count until it ends (or its task is
/// dropped).
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    fn count(count: &Arc<AtomicU64>) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a remote copy reads its state and sends its writes.
enum Source {
    /// A `silt metadata` cluster.
    Http(MetadataClient),
    /// Nodes in this process, over a link that can fail.
    Linked { cluster: Arc<LinkedCluster>, link: Arc<MetadataLink> },
}

impl Source {
    async fn write(&self, cmd: Command) -> Result<Response, MetadataError> {
        match self {
            Source::Http(client) => client.write(cmd).await,
            Source::Linked { cluster, link } => {
                let cmd = &cmd;
                cluster
                    .on_leader(link, false, |node, timeout| async move {
                        node.propose(cmd.clone(), timeout).await
                    })
                    .await?
                    .into_result()
            }
        }
    }

    /// A linearizable read of the whole state, and the applied index it is current at.
    async fn read_state(&self) -> Result<(Option<u64>, MetadataState), MetadataError> {
        match self {
            Source::Http(client) => client.read_state().await.map(|r| (r.applied_index, r.state)),
            Source::Linked { cluster, link } => {
                cluster
                    .on_leader(link, true, |node, timeout| async move { node.read_state(timeout).await })
                    .await
            }
        }
    }

    /// A linearizable read of what changed after index `after`.
    async fn read_changes_after(&self, after: u64) -> Result<StateDelta, MetadataError> {
        match self {
            Source::Http(client) => match client.read_changes_after(after).await {
                // A node that does not answer with changes (an older version) sends the whole
                // state instead.
                Err(MetadataError::InvalidArgument(_)) => client.read_state_after(after).await,
                other => other,
            },
            Source::Linked { cluster, link } => {
                let (node_id, (applied_index, changes)) = cluster
                    .on_leader(link, true, |node, timeout| async move {
                        node.read_changes(timeout, after).await.map(|c| (node.node_id(), c))
                    })
                    .await?;
                let (state, changes) = match changes {
                    Changes::Unchanged => (None, None),
                    Changes::State(state) => (Some(state), None),
                    Changes::Commands(commands) => (
                        None,
                        Some(
                            commands.into_iter().map(|(index, command)| Change { index, command }).collect(),
                        ),
                    ),
                };
                Ok(StateDelta { node_id, applied_index, state, changes })
            }
        }
    }
}

/// The metadata nodes that run in this process (the simulator's cluster, or one node), as a
/// remote copy reaches them: a call goes to the node that leads, found as a client of a real
/// cluster finds it (the one that answered last, then each in turn, again with backoff while
/// none leads), within the link's timeout. A node that is down (see [`down`](Self::down)) is
/// skipped, as one whose port is closed.
#[derive(Default)]
pub struct LinkedCluster {
    nodes: std::sync::Mutex<BTreeMap<NodeId, MetadataNode>>,
    /// The node that answered last.
    leader: AtomicU64,
}

/// First sleep when no node leads; it doubles up to [`LEADER_BACKOFF_MAX`].
const LEADER_BACKOFF: Duration = Duration::from_millis(50);
const LEADER_BACKOFF_MAX: Duration = Duration::from_secs(1);

impl LinkedCluster {
    /// A cluster of which no node runs yet.
    pub fn new() -> Arc<LinkedCluster> {
        Arc::default()
    }

    /// A cluster of the one node `node`.
    pub fn of(node: MetadataNode) -> Arc<LinkedCluster> {
        let cluster = LinkedCluster::new();
        cluster.up(node);
        cluster
    }

    /// `node` runs: calls may go to it.
    pub fn up(&self, node: MetadataNode) {
        self.lock().insert(node.node_id(), node);
    }

    /// Node `id` is down (before its runtime is dropped): calls skip it.
    pub fn down(&self, id: NodeId) {
        self.lock().remove(&id);
    }

    /// The nodes that run.
    pub fn nodes(&self) -> Vec<MetadataNode> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, MetadataNode>> {
        self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `call` on the node that leads, over `link` (a read when `read`). A node that does
    /// not lead, or answers that nothing took effect (`Retry`), is passed over for the next;
    /// a call whose outcome is unknown is not sent again.
    async fn on_leader<T, F, Fut>(&self, link: &MetadataLink, read: bool, call: F) -> Result<T, MetadataError>
    where
        F: Fn(MetadataNode, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, LeaderError>>,
    {
        let deadline = link.send(read).await?;
        let mut backoff = LEADER_BACKOFF;
        let mut why = "no metadata node runs".to_string();
        loop {
            let mut nodes = self.nodes();
            let hint = self.leader.load(Ordering::Relaxed);
            nodes.sort_by_key(|n| (n.node_id() != hint, n.node_id()));
            for node in nodes {
                match node.route() {
                    Route::Local => {}
                    Route::Forward(leader) => {
                        why = format!(
                            "metadata node {} does not lead; node {} does",
                            node.node_id(),
                            leader.id
                        );
                        continue;
                    }
                    Route::Wait(m) => {
                        why = m;
                        continue;
                    }
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let outcome = match call(node.clone(), left.min(node.request_timeout())).await {
                    Ok(answer) => {
                        self.leader.store(node.node_id(), Ordering::Relaxed);
                        Ok(answer)
                    }
                    Err(LeaderError::NotLeader) => {
                        why = format!("metadata node {} lost its leadership", node.node_id());
                        continue;
                    }
                    Err(LeaderError::Retry(m)) if read => {
                        why = m;
                        continue;
                    }
                    Err(LeaderError::Retry(m) | LeaderError::Unknown(m)) => {
                        Err(MetadataError::Unavailable(m))
                    }
                    Err(LeaderError::Invalid(m)) => Err(MetadataError::InvalidArgument(m)),
                };
                return link.answer(outcome, read, deadline).await;
            }
            if tokio::time::Instant::now() + backoff >= deadline {
                return link.answer(Err(MetadataError::Unavailable(why)), read, deadline).await;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(LEADER_BACKOFF_MAX);
        }
    }
}

/// What a [`MetadataLink`] does to the calls over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    /// Calls arrive and are answered.
    Up = 0,
    /// Calls never arrive: each fails once the client's time is up.
    Cut = 1,
    /// Calls arrive and take effect, but their answers are lost: each fails once the client's
    /// time is up.
    RepliesLost = 2,
    /// Writes arrive and are answered; reads, with them every refresh of the copy, fail once
    /// the client's time is up: the copy falls behind what this process writes, as it does
    /// between two refreshes, for as long as the link stays so.
    ReadsLost = 3,
    /// Calls arrive and are answered, each [`SLOW_CALL`] later than over an `Up` link (a
    /// metadata cluster under load, a congested network).
    Slow = 4,
}

/// How much longer a call over a [`LinkState::Slow`] link takes, half of it each way.
pub const SLOW_CALL: Duration = Duration::from_millis(250);

/// A link from a process to a metadata node in the same process, which a simulation cuts and
/// mends. A call that fails on it takes the whole client timeout first, as one to an
/// unreachable cluster does.
#[derive(Debug)]
pub struct MetadataLink {
    state: AtomicU8,
    timeout: Duration,
    /// Whether the process at this end is paused ([`MetadataLink::pause`]).
    paused: tokio::sync::watch::Sender<bool>,
}

impl MetadataLink {
    /// A link that is up, whose failed calls take `timeout`.
    pub fn new(timeout: Duration) -> Arc<MetadataLink> {
        Arc::new(MetadataLink {
            state: AtomicU8::new(LinkState::Up as u8),
            timeout,
            paused: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Pauses the process at this end (or ends its pause): until it ends, its calls leave and
    /// their answers reach it no sooner, within each call's timeout, as with a process
    /// stopped by SIGSTOP. Its tasks still run meanwhile.
    pub fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Waits until the process at this end is not paused; false if `deadline` came first.
    async fn unpaused(&self, deadline: tokio::time::Instant) -> bool {
        let mut paused = self.paused.subscribe();
        let resumed = tokio::time::timeout_at(deadline, paused.wait_for(|p| !*p)).await;
        matches!(resumed, Ok(Ok(_)))
    }

    /// From now on, calls fare as `state` says.
    pub fn set(&self, state: LinkState) {
        self.state.store(state as u8, Ordering::SeqCst);
    }

    /// What the link does now.
    pub fn state(&self) -> LinkState {
        match self.state.load(Ordering::SeqCst) {
            0 => LinkState::Up,
            1 => LinkState::Cut,
            2 => LinkState::RepliesLost,
            3 => LinkState::ReadsLost,
            _ => LinkState::Slow,
        }
    }

    fn lost(&self) -> MetadataError {
        MetadataError::Unavailable(format!(
            "metadata did not answer within {} ms (unreachable)",
            self.timeout.as_millis()
        ))
    }

    /// A call leaving (a write, or a read when `read`): fails (after the timeout) when the
    /// link does not carry it; else the deadline of the whole call.
    async fn send(&self, read: bool) -> Result<tokio::time::Instant, MetadataError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match (self.state(), read) {
            (LinkState::Cut, _) | (LinkState::ReadsLost, true) => {
                tokio::time::sleep_until(deadline).await;
                return Err(self.lost());
            }
            (LinkState::Slow, _) => tokio::time::sleep(SLOW_CALL / 2).await,
            _ => {}
        }
        if !self.unpaused(deadline).await {
            return Err(self.lost());
        }
        Ok(deadline)
    }

    /// A call's answer coming back: lost (at the call's deadline) unless the link carries it
    /// now and the deadline has not passed.
    async fn answer<T>(
        &self,
        answer: Result<T, MetadataError>,
        read: bool,
        deadline: tokio::time::Instant,
    ) -> Result<T, MetadataError> {
        if !self.unpaused(deadline).await {
            return Err(self.lost());
        }
        let carried = match self.state() {
            LinkState::Up => true,
            LinkState::Slow => {
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + SLOW_CALL / 2)).await;
                true
            }
            LinkState::ReadsLost => !read,
            LinkState::Cut | LinkState::RepliesLost => false,
        };
        if !carried || tokio::time::Instant::now() > deadline {
            tokio::time::sleep_until(deadline).await;
            return Err(self.lost());
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn create_topic(name: &str) -> Command {
        Command::CreateTopic { name: name.to_string(), partitions: 1, config: BTreeMap::new(), now_ms: 1_000 }
    }

    fn has_topic(metadata: &Metadata, name: &str) -> bool {
        metadata.read_local(|s| s.topics.contains_key(name))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_linked_copy_of_a_three_node_cluster_follows_its_leader_when_the_leader_is_cut_off() {
        use crate::raft::memory_network::{MemoryRaftNetwork, RaftLink, RaftRouter};
        use crate::MetadataNodeOptions;

        let dir = tempfile::tempdir().unwrap();
        let router = RaftRouter::new();
        let cluster = LinkedCluster::new();
        let members: BTreeMap<NodeId, String> =
            (1..=3).map(|id| (id, format!("sim://metadata-{id}"))).collect();
        for id in 1..=3 {
            let network = MemoryRaftNetwork::new(id, Arc::clone(&router));
            let node = MetadataNode::open_cluster_over(
                &dir.path().join(id.to_string()),
                id,
                Some(members.clone()),
                MetadataNodeOptions::default(),
                network,
            )
            .await
            .unwrap();
            router.register(id, node.raft().clone(), tokio::runtime::Handle::current());
            cluster.up(node);
        }
        let link = MetadataLink::new(Duration::from_secs(10));
        let cancel = CancellationToken::new();
        let copy = Metadata::Remote(
            RemoteMetadata::linked_cluster(Arc::clone(&cluster), link, cancel.clone()).await.unwrap(),
        );
        copy.write(create_topic("first")).await.unwrap();
        assert!(has_topic(&copy, "first"));

        let leader = cluster.nodes()[0].raft().metrics().borrow().current_leader.unwrap();
        for other in (1..=3).filter(|id| *id != leader) {
            router.set_link(leader, other, RaftLink::Cut);
            router.set_link(other, leader, RaftLink::Cut);
        }
        // The cut-off leader's proposals cannot commit; once the others elected a leader of
        // their own (and the old one has heard from no quorum for a while), calls go there.
        let other = cluster.nodes().into_iter().find(|n| n.node_id() != leader).unwrap();
        other
            .raft()
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.current_leader.is_some_and(|l| l != leader), "the majority elects a new leader")
            .await
            .unwrap();
        copy.write(create_topic("after")).await.unwrap();
        assert!(
            copy.read(|s| s.topics.contains_key("first") && s.topics.contains_key("after")).await.unwrap(),
            "the majority's new leader holds what the old one committed, and the write made after the cut"
        );

        router.heal();
        cancel.cancel();
        for node in cluster.nodes() {
            node.shutdown().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_linked_copy_fails_as_a_partitioned_remote_one_does_and_catches_up_once_mended() {
        let dir = tempfile::tempdir().unwrap();
        let node = MetadataNode::open(dir.path(), 1, "127.0.0.1:7000".into()).await.unwrap();
        let link = MetadataLink::new(Duration::from_millis(300));
        let cancel = CancellationToken::new();
        let copy = Metadata::Remote(
            RemoteMetadata::linked(node.clone(), Arc::clone(&link), cancel.clone()).await.unwrap(),
        );

        copy.write(create_topic("up")).await.unwrap();
        assert!(has_topic(&copy, "up"), "a write over a link that is up is in the copy when it returns");

        link.set(LinkState::Cut);
        let cut = copy.write(create_topic("cut")).await;
        assert!(matches!(cut, Err(MetadataError::Unavailable(_))), "{cut:?}");
        assert!(!node.read_local(|s| s.topics.contains_key("cut")), "a write over a cut link never arrives");
        node.write(create_topic("meanwhile")).await.unwrap();
        assert!(matches!(copy.read(|_| ()).await, Err(MetadataError::Unavailable(_))));
        assert!(!has_topic(&copy, "meanwhile"), "the copy lags while the link is cut");

        link.set(LinkState::RepliesLost);
        let lost = copy.write(create_topic("lost")).await;
        assert!(matches!(lost, Err(MetadataError::Unavailable(_))), "{lost:?}");
        assert!(
            node.read_local(|s| s.topics.contains_key("lost")),
            "a write whose answer is lost took effect"
        );

        link.set(LinkState::Up);
        assert!(copy
            .read(|s| s.topics.contains_key("meanwhile") && s.topics.contains_key("lost"))
            .await
            .unwrap());
        assert!(has_topic(&copy, "lost"), "a read refreshes the copy");
        cancel.cancel();
        node.shutdown().await;
    }
}
