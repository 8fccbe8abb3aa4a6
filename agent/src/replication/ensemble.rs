//! The writer half of the replicated hot tail: streaming each group of appends to the open
//! segment's other replicas and waiting for the write quorum.
//!
//! Each follower has one task and one queue, so it receives the writer's groups in order; the
//! writer waits only until W - 1 followers (W = `min.insync.replicas`, the writer's own fsync
//! being the first) have fsynced a group, and a slower follower catches up from its queue. A
//! follower that fails an append, answers out of line, or falls a whole queue behind leaves the
//! segment's ensemble for good (a gap would follow otherwise); the writer then rolls to a new
//! segment with a new ensemble. When fewer than W - 1 followers remain, the writer stops: it
//! never acknowledges below W replicas.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use silt_record::RecordBatch;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::error::{ErrorCode, StoreError};
use crate::log::replica::join_batches;
use crate::transport::{Peers, ReplicaTarget};

/// Groups queued for one follower before it counts as failed.
const FOLLOWER_QUEUE_GROUPS: usize = 256;

struct Job {
    body: Bytes,
    end: u64,
    committed: u64,
    done: oneshot::Sender<Result<(), String>>,
}

/// One follower of the open segment, as the writer sees it.
struct Follower {
    agent: String,
    tx: mpsc::Sender<Job>,
    state: Arc<FollowerState>,
    task: JoinHandle<()>,
}

struct FollowerState {
    failed: AtomicBool,
    /// It refused an append as fenced: a writer of a newer epoch took the partition over.
    fenced: AtomicBool,
    /// It answered an append with a failure of its disk: 1 for a failed write or fsync
    /// (`storage_error`), 2 when it opens no log of the partition until its process restarts
    /// (`disk_failed`).
    disk_failed: std::sync::atomic::AtomicU8,
    /// One past the last offset it has acknowledged.
    acked: AtomicU64,
    /// When the oldest group it has not acknowledged was sent (ms since `epoch`), 0 if none.
    oldest_pending_ms: AtomicU64,
    /// Woken whenever any follower of the ensemble acknowledges or fails (shared by all).
    changed: Arc<Notify>,
}

impl FollowerState {
    fn ack(&self, end: u64) {
        self.acked.store(end, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
        self.changed.notify_waiters();
    }
}

/// A follower's replication lag, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerLag {
    /// The follower's agent id.
    pub agent: String,
    /// Records the writer has written that it has not acknowledged.
    pub records: u64,
    /// How long its oldest unacknowledged group has waited.
    pub ms: u64,
    /// Whether it left the ensemble.
    pub failed: bool,
}

/// The replicas of the segment a writer has open.
pub struct Ensemble {
    /// The segment's base offset.
    pub base: u64,
    followers: Vec<Follower>,
    /// Follower acknowledgements a group needs besides the writer's own fsync (W - 1).
    needed: usize,
    /// Members metadata records for the segment, the writer included: a seal names fewer
    /// holders when fewer hold it whole.
    recorded: usize,
    started: Instant,
    /// Woken when a follower acknowledges or fails.
    changed: Arc<Notify>,
}

impl std::fmt::Debug for Ensemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ensemble")
            .field("base", &self.base)
            .field("followers", &self.followers.iter().map(|f| &f.agent).collect::<Vec<_>>())
            .field("needed", &self.needed)
            .finish()
    }
}

impl Ensemble {
    /// Starts streaming to `followers` (agent id and address) the segment `target` names, whose
    /// ensemble in metadata has `recorded` members, the writer included.
    pub fn start(
        peers: &Peers,
        topic: &str,
        partition: u32,
        target: ReplicaTarget,
        followers: Vec<(String, String)>,
        recorded: usize,
        write_quorum: usize,
    ) -> Ensemble {
        let started = Instant::now();
        let base = target.segment;
        let changed = Arc::new(Notify::new());
        let followers = followers
            .into_iter()
            .map(|(agent, addr)| {
                let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE_GROUPS);
                let state = Arc::new(FollowerState {
                    failed: AtomicBool::new(false),
                    fenced: AtomicBool::new(false),
                    disk_failed: std::sync::atomic::AtomicU8::new(0),
                    acked: AtomicU64::new(base),
                    oldest_pending_ms: AtomicU64::new(0),
                    changed: Arc::clone(&changed),
                });
                let link = Link {
                    peers: peers.clone(),
                    topic: topic.to_string(),
                    partition,
                    target: target.clone(),
                    agent: agent.clone(),
                    addr,
                    state: Arc::clone(&state),
                    started,
                };
                let task = tokio::spawn(link.run(rx));
                Follower { agent, tx, state, task }
            })
            .collect();
        Ensemble { base, followers, needed: write_quorum.saturating_sub(1), recorded, started, changed }
    }

    /// Sends a group of batches (ending at `end`) to every follower still in the ensemble and
    /// waits until W - 1 of them have fsynced it. `committed` is the end committed before it.
    pub async fn replicate(
        &self,
        batches: &[RecordBatch],
        end: u64,
        committed: u64,
    ) -> Result<(), StoreError> {
        debug_assert!(committed <= end, "committed {committed} past the group's end {end}");
        debug_assert!(
            batches.windows(2).all(|w| w[0].next_offset() == w[1].base_offset()),
            "a group's batches leave a gap or overlap"
        );
        // No early return for an ensemble short of followers: W - 1 acknowledgements are
        // needed whatever the writer's copy of metadata named.
        if self.needed == 0 && self.followers.is_empty() {
            return Ok(());
        }
        let body = join_batches(batches);
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let mut waits = FuturesUnordered::new();
        let mut errors: Vec<String> = Vec::new();
        for f in &self.followers {
            if f.state.failed.load(Ordering::Relaxed) {
                continue;
            }
            let (done, rx) = oneshot::channel();
            match f.tx.try_send(Job { body: body.clone(), end, committed, done }) {
                Ok(()) => {
                    let _ = f.state.oldest_pending_ms.compare_exchange(
                        0,
                        now,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    waits.push(async move { (f.agent.as_str(), rx.await) });
                }
                Err(_) => {
                    warn!(follower = %f.agent, "a follower fell a whole queue behind; it leaves the segment's ensemble");
                    f.state.fail();
                    errors.push(format!("{}: too far behind", f.agent));
                }
            }
        }
        let mut acked = 0;
        if acked >= self.needed {
            return Ok(());
        }
        while let Some((agent, r)) = waits.next().await {
            match r {
                Ok(Ok(())) => {
                    acked += 1;
                    if acked >= self.needed {
                        return Ok(());
                    }
                }
                Ok(Err(e)) => errors.push(format!("{agent}: {e}")),
                Err(_) => errors.push(format!("{agent}: its replication task ended")),
            }
        }
        Err(StoreError::NotEnoughReplicas(format!(
            "{} of the {} follower acknowledgements a write needs (min.insync.replicas {}): {}",
            acked,
            self.needed,
            self.needed + 1,
            errors.join("; ")
        )))
    }

    /// Replicas of the segment: the writer and its followers.
    pub fn size(&self) -> usize {
        self.followers.len() + 1
    }

    /// The followers it streams to, those that left included.
    pub fn followers(&self) -> impl Iterator<Item = &str> {
        self.followers.iter().map(|f| f.agent.as_str())
    }

    /// Members metadata records for the segment, the writer included (more than
    /// [`size`](Self::size) when the writer's copy of metadata named fewer followers).
    pub fn recorded(&self) -> usize {
        self.recorded.max(self.size())
    }

    /// Waits (up to `timeout`) until every follower still in the ensemble has acknowledged
    /// everything up to `end`, and returns those that have: they hold the whole segment.
    pub async fn settle(&self, end: u64, timeout: std::time::Duration) -> Vec<String> {
        let caught_up = |f: &Follower| {
            !f.state.failed.load(Ordering::Relaxed) && f.state.acked.load(Ordering::Relaxed) >= end
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so an acknowledgement in between is not missed.
            let changed = self.changed.notified();
            let waiting =
                self.followers.iter().any(|f| !f.state.failed.load(Ordering::Relaxed) && !caught_up(f));
            if !waiting || tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.followers.iter().filter(|f| caught_up(f)).map(|f| f.agent.clone()).collect()
    }

    /// The followers that left after their disk failed an append, each with whether it opens
    /// no log of the partition until it restarts (`disk_failed`, rather than one failed write
    /// or fsync).
    pub fn disk_failed(&self) -> impl Iterator<Item = (&str, bool)> {
        self.followers.iter().filter_map(|f| match f.state.disk_failed.load(Ordering::Relaxed) {
            0 => None,
            n => Some((f.agent.as_str(), n > 1)),
        })
    }

    /// Whether a follower refused an append as fenced: a writer of a newer epoch has fenced
    /// its replica, so this writer is deposed (whatever its copy of metadata says yet).
    pub fn fenced(&self) -> bool {
        self.followers.iter().any(|f| f.state.fenced.load(Ordering::Relaxed))
    }

    /// Whether a follower left the ensemble (the writer rolls to a new segment).
    pub fn degraded(&self) -> bool {
        self.followers.iter().any(|f| f.state.failed.load(Ordering::Relaxed))
    }

    /// Each follower's lag behind `end`, the writer's end.
    pub fn lag(&self, end: u64) -> Vec<FollowerLag> {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        self.followers
            .iter()
            .map(|f| {
                let pending = f.state.oldest_pending_ms.load(Ordering::Relaxed);
                FollowerLag {
                    agent: f.agent.clone(),
                    records: end.saturating_sub(f.state.acked.load(Ordering::Relaxed)),
                    ms: if pending == 0 { 0 } else { now.saturating_sub(pending) },
                    failed: f.state.failed.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        // Nothing queued may reach a replica after the writer moved on (a new writer may be
        // reading the replicas' ends by then).
        for f in &self.followers {
            f.task.abort();
        }
    }
}

struct Link {
    peers: Peers,
    topic: String,
    partition: u32,
    target: ReplicaTarget,
    agent: String,
    addr: String,
    state: Arc<FollowerState>,
    started: Instant,
}

impl Link {
    async fn run(self, mut rx: mpsc::Receiver<Job>) {
        while let Some(job) = rx.recv().await {
            if self.state.failed.load(Ordering::Relaxed) {
                let _ = job.done.send(Err("left the ensemble after an earlier failure".into()));
                continue;
            }
            let r = self
                .peers
                .replica_append(
                    (&self.agent, &self.addr),
                    &self.topic,
                    self.partition,
                    &self.target,
                    Some(job.committed),
                    job.body,
                )
                .await;
            let outcome = match r {
                Ok(end) if end == job.end => Ok(()),
                Ok(end) => Err(format!("holds the segment up to offset {end}, expected {}", job.end)),
                Err(e) => {
                    let disk = match e.code {
                        ErrorCode::DiskFailed => 2,
                        ErrorCode::StorageError => 1,
                        _ => 0,
                    };
                    self.state.disk_failed.fetch_max(disk, Ordering::Relaxed);
                    if e.code == ErrorCode::Fenced {
                        self.state.fenced.store(true, Ordering::Relaxed);
                    }
                    Err(e.message)
                }
            };
            match outcome {
                Ok(()) => {
                    self.state.ack(job.end);
                    let next_pending =
                        if rx.is_empty() { 0 } else { self.started.elapsed().as_millis() as u64 + 1 };
                    self.state.oldest_pending_ms.store(next_pending, Ordering::Relaxed);
                    let _ = job.done.send(Ok(()));
                }
                Err(e) => {
                    warn!(follower = %self.agent, topic = %self.topic, partition = self.partition, error = %e,
                        "a follower failed an append; it leaves the segment's ensemble");
                    self.state.fail();
                    let _ = job.done.send(Err(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The followers a writer streams to come from its copy of metadata: a segment another
    /// writer sealed meanwhile, or a member metadata forgot, leaves fewer than W - 1 of them.
    #[tokio::test]
    async fn an_ensemble_with_fewer_followers_than_the_write_quorum_needs_acknowledges_nothing() {
        let peers: Peers = Arc::new(crate::transport::HttpPeers::new("w"));
        let target = ReplicaTarget { topic_id: 1, epoch: 2, segment: 0, segment_epoch: 2 };
        for (followers, w) in [(0, 2), (0, 3)] {
            let followers: Vec<(String, String)> =
                (0..followers).map(|i| (format!("f{i}"), "127.0.0.1:9".to_string())).collect();
            let e = Ensemble::start(&peers, "t", 0, target.clone(), followers.clone(), 3, w);
            match e.replicate(&[], 10, 0).await {
                Err(StoreError::NotEnoughReplicas(_)) => {}
                other => panic!("{} followers, W={w}: {other:?}", followers.len()),
            }
        }
        let e = Ensemble::start(&peers, "t", 0, target, Vec::new(), 3, 1);
        assert!(e.replicate(&[], 10, 0).await.is_ok(), "W=1 needs no follower");
    }
}
