//! How an agent reaches another one: a client may talk to any agent, and the agent passes
//! what belongs to a partition another agent writes on to that agent; a partition's writer
//! streams appends to its followers, fences them and copies from them; one agent asks another
//! to repair a segment.
//!
//! All of it goes through the [`Peer`] trait: [`http::HttpPeers`] between processes,
//! `crate::memory_network::MemoryNetwork` between agents in one process (tests, and a
//! simulated network that cuts links and loses replies; it sits above the agent, whose methods
//! it calls). Both follow the same rules: a request forwarded once is never
//! forwarded again (an agent that is not the writer either answers `not_writer`), so a stale
//! view of metadata can cause an error but never a loop; a request that gets no answer within
//! its timeout fails as `unavailable`, and may still have been applied; an agent that did not
//! answer counts as unreachable for [`UNREACHABLE_FOR`] unless it answers something meanwhile.

pub mod http;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::ApiError;
use crate::group_cursor::Delivered;
use crate::limits::ReadLimit;
use crate::log::replica::HeldSegment;

pub use http::HttpPeers;
pub use wire::{
    CollectRequest, RecordPage, ReplicaTarget, WireRecord, FORWARDED_HEADER, HIGH_WATERMARK_HEADER,
    NEXT_OFFSET_HEADER, RECORD_BATCHES_TYPE,
};

/// Longest a probe of an agent that did not answer may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a forwarded request may take beyond its own wait (a poll's timeout).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a replica append or fence may take before the writer counts that replica as failed.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest copying one sealed segment to a new replica may take.
pub const REPAIR_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an agent that did not answer (no connection, a timeout, a broken answer) counts
/// as unreachable from this one, unless it answers something meanwhile.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(10);

/// Requests from this agent to another one, named as `(id, address)`. Every error is an [`ApiError`]: the one the other
/// agent answered, or `unavailable` when it did not answer (the request may still have been
/// applied there).
#[async_trait::async_trait]
pub trait Peer: std::fmt::Debug + Send + Sync + 'static {
    /// Since when `agent` counts as unreachable from this one: it failed to answer a request
    /// within the last [`UNREACHABLE_FOR`] and has not answered anything since. Metadata says
    /// which agents are live (they reach metadata), not which ones this agent can reach: a
    /// writer cut off from some chooses its ensembles without them.
    fn unreachable_since(&self, agent: &str) -> Option<Instant>;

    /// Whether `agent` counts as unreachable ([`Peer::unreachable_since`]).
    fn is_unreachable(&self, agent: &str) -> bool {
        self.unreachable_since(agent).is_some()
    }

    /// Asks `to` whether it answers at all, so that an agent that did not answer counts as
    /// reachable again as soon as it answers, not only once [`UNREACHABLE_FOR`] has passed. An
    /// answer clears the mark; no answer leaves it as it is (a probe neither makes nor
    /// prolongs one, so one that fails late cannot mark an agent that answered meanwhile).
    /// Whether it answered.
    async fn probe(&self, to: (&str, &str)) -> bool;

    /// Appends a batch on the partition's writer; returns its first and last offset.
    async fn append(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        batch: Bytes,
    ) -> Result<(u64, u64), ApiError>;

    /// Reads records of a partition from its writer (which reads the archive too), as a
    /// replay through the writer would.
    async fn read(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError>;

    /// Reads records an agent holds in its local log of a partition, whether or not it writes
    /// the partition.
    async fn read_held(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError>;

    /// Appends a writer's batches to a follower's replica; returns the end it holds.
    /// `committed` is the writer's committed end before these batches: the follower serves
    /// reads of the open segment up to there.
    async fn replica_append(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        committed: Option<u64>,
        batches: Bytes,
    ) -> Result<u64, ApiError>;

    /// Raises a replica's fence to `target.epoch` and returns what it holds of the segment.
    async fn replica_fence(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError>;

    /// What a replica holds of a sealed segment, changing nothing there (a range of it is to
    /// be declared lost).
    async fn replica_held(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError>;

    /// Reads whole batches of a replica's segment from `from` on, as stored (recovery copies
    /// a segment's tail with it); empty when the replica holds nothing there.
    async fn replica_batches(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        from: u64,
    ) -> Result<Bytes, ApiError>;

    /// Asks agent `to` to copy a sealed segment from agent `source` (ensemble repair).
    async fn replica_repair(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        source: &str,
    ) -> Result<(), ApiError>;

    /// The first offset at or after a time, from the partition's writer.
    async fn offset_for_time(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
    ) -> Result<u64, ApiError>;

    /// Delivers messages of the writer's partitions to a group member (no waiting).
    async fn collect(
        &self,
        to: (&str, &str),
        topic: &str,
        req: &CollectRequest,
    ) -> Result<Vec<Delivered>, ApiError>;

    /// Acknowledges messages on their partitions' writer; `dry_run` only checks them.
    async fn ack(
        &self,
        to: (&str, &str),
        group: &str,
        ids: &[String],
        dry_run: bool,
    ) -> Result<usize, ApiError>;
}

/// How an agent reaches the others: shared by its writers, repairs and forwarded requests.
pub type Peers = Arc<dyn Peer>;

/// Which agents did not answer lately, and since when.
#[derive(Debug, Clone, Default)]
pub struct Reachability {
    unreachable: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Reachability {
    /// Since when `agent` has not answered, if it failed to answer within the last
    /// [`UNREACHABLE_FOR`] and has not answered since.
    pub fn unreachable_since(&self, agent: &str) -> Option<Instant> {
        let mut unreachable = crate::sync::lock(&self.unreachable);
        match unreachable.get(agent) {
            Some(at) if at.elapsed() < UNREACHABLE_FOR => Some(*at),
            Some(_) => {
                unreachable.remove(agent);
                None
            }
            None => None,
        }
    }

    /// Records that `agent` answered (anything, an error included) or did not.
    pub fn reached(&self, agent: &str, answered: bool) {
        let mut unreachable = crate::sync::lock(&self.unreachable);
        if answered {
            unreachable.remove(agent);
        } else {
            unreachable.insert(agent.to_string(), Instant::now());
        }
    }
}
