//! [`MemoryNetwork`]: agents in one process reaching each other without sockets, for tests
//! and simulation: the in-process counterpart of the HTTP client ([`crate::transport::http`])
//! and the internal routes ([`crate::api`]) together. A request runs as its own task on the
//! receiving agent, as an HTTP server would run it, under the same timeout as over HTTP, and is
//! dropped when that runs out (as a server drops a handler whose client left). It runs on the
//! runtime the agent joined from: in the simulator each agent has a runtime of its own, which a
//! crash drops with every task on it, handlers included. The network can
//! cut a link (the request never arrives; the sender hears so at once, as from a refused
//! connection), lose its replies (the request is applied; the sender hears nothing, at once
//! rather than after the timeout), or delay each request and each answer by its own random time
//! up to a bound (so that requests overtake each other, and one that arrives too late for the
//! sender's timeout never runs), in one direction at a time. It can also pause an agent
//! ([`MemoryNetwork::pause`]): everything it sends or is sent, and every answer to or from it,
//! waits until the pause ends (or the sender's timeout runs out), as a process stopped by
//! SIGSTOP or a long garbage collection looks to the others.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::agent::{Agent, WeakAgent};
use crate::error::{ApiError, ErrorCode};
use crate::group_cursor::Delivered;
use crate::limits::{ReadLimit, READ_BYTES_MAX, REPLAY_MAX};
use crate::log::replica::HeldSegment;
use crate::transport::{
    CollectRequest, Peer, Peers, Reachability, RecordPage, ReplicaTarget, WireRecord, PEER_TIMEOUT,
    REPAIR_TIMEOUT, REPLICA_TIMEOUT,
};

/// What happens to requests from one agent to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// They arrive and are answered.
    Up,
    /// They never arrive: the sender hears nothing (at once, as from a refused connection).
    Cut,
    /// They arrive and are applied; the answer is lost.
    RepliesLost,
    /// Each request, and each answer, takes a random time up to this bound to arrive: a later
    /// message may overtake an earlier one (as over two connections).
    Delayed(Duration),
    /// As `Delayed`, but in order: no message arrives before one sent earlier the same way (a
    /// congested connection, or a sender stalled for a moment).
    Slow(Duration),
    /// Each request arrives twice: once as sent, and again once the first has run, while the
    /// sender has the first one's answer (a retry of a request that did arrive).
    Duplicated,
}

/// Agents of one process, by id, and the state of the links between them. Links are directed:
/// `set_link("a", "b", ..)` changes requests from `a` to `b` only.
#[derive(Debug, Default)]
pub struct MemoryNetwork {
    agents: RwLock<HashMap<String, Joined>>,
    links: RwLock<HashMap<(String, String), Link>>,
    /// Where the delays of [`Link::Delayed`] are drawn from (a simulation's seed decides it).
    jitter: std::sync::Mutex<u64>,
    /// When the last message over each slow link, one way, arrives.
    arrivals: std::sync::Mutex<HashMap<(String, String), tokio::time::Instant>>,
    /// The agents paused now.
    paused: tokio::sync::watch::Sender<BTreeSet<String>>,
}

impl MemoryNetwork {
    /// An empty network.
    pub fn new() -> Arc<MemoryNetwork> {
        Arc::default()
    }

    /// What the agent `me` reaches the others with (its `AgentConfig::peers`).
    pub fn peers(self: &Arc<Self>, me: &str) -> Peers {
        Arc::new(MemoryPeers { me: me.to_string(), net: Arc::clone(self), reach: Reachability::default() })
    }

    /// Makes `agent` reachable by its id; requests to it run on the runtime this is called
    /// from. An agent that stops (`Agent::shutdown`), or whose runtime is dropped, is
    /// unreachable again; a new agent joining under the same id replaces it.
    pub fn join(&self, agent: &Agent) {
        let joined = Joined { agent: agent.downgrade(), runtime: tokio::runtime::Handle::try_current().ok() };
        let mut agents = crate::sync::write_lock(&self.agents);
        agents.insert(agent.id().to_string(), joined);
    }

    /// Sets what happens to requests from `from` to `to`.
    pub fn set_link(&self, from: &str, to: &str, link: Link) {
        let mut links = crate::sync::write_lock(&self.links);
        if link == Link::Up {
            links.remove(&(from.to_string(), to.to_string()));
        } else {
            links.insert((from.to_string(), to.to_string()), link);
        }
    }

    /// Cuts every link to and from `agent` (a partition of the network with `agent` alone on
    /// its side), or mends them all.
    pub fn isolate(&self, agent: &str, isolated: bool) {
        let ids: Vec<String> = {
            let agents = crate::sync::read_lock(&self.agents);
            agents.keys().filter(|id| id.as_str() != agent).cloned().collect()
        };
        let link = if isolated { Link::Cut } else { Link::Up };
        for other in ids {
            self.set_link(agent, &other, link);
            self.set_link(&other, agent, link);
        }
    }

    /// Pauses `agent` (or ends its pause): until it ends, every request it sends or is sent,
    /// and every answer to or from it, waits (within the sender's timeout), then goes on in
    /// the order it came. Its own tasks still run meanwhile: this pauses what it says and
    /// hears, not its timers.
    pub fn pause(&self, agent: &str, paused: bool) {
        self.paused.send_modify(|p| {
            if paused {
                p.insert(agent.to_string());
            } else {
                p.remove(agent);
            }
        });
    }

    /// Waits until neither of `agents` is paused; false if `deadline` came first.
    pub async fn unpaused(&self, agents: [&str; 2], deadline: tokio::time::Instant) -> bool {
        let mut paused = self.paused.subscribe();
        let running = |p: &BTreeSet<String>| agents.iter().all(|a| !p.contains(*a));
        let resumed = tokio::time::timeout_at(deadline, paused.wait_for(running)).await;
        matches!(resumed, Ok(Ok(_)))
    }

    /// How long one message from `from` to `to` over `link` takes: up to the bound of a delayed
    /// or slow link, and over a slow one no less than the message before it has left to go.
    fn delay(&self, from: &str, to: &str, link: Link) -> Duration {
        let (Link::Delayed(max) | Link::Slow(max)) = link else { return Duration::ZERO };
        let drawn = self.draw(max);
        if !matches!(link, Link::Slow(_)) {
            return drawn;
        }
        // A millisecond (the timer's grain) after the one before at the least, so that no two
        // arrive at once, in either order.
        let now = tokio::time::Instant::now();
        let mut arrivals = crate::sync::lock(&self.arrivals);
        let last = arrivals.entry((from.to_string(), to.to_string())).or_insert(now);
        *last = (*last + Duration::from_millis(1)).max(now + drawn);
        *last - now
    }

    /// A random time up to `max`.
    fn draw(&self, max: Duration) -> Duration {
        // splitmix64: the draws depend only on their order, which a simulation's seed fixes.
        let mut state = crate::sync::lock(&self.jitter);
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        max.mul_f64((z >> 11) as f64 / (1u64 << 53) as f64)
    }

    fn link(&self, from: &str, to: &str) -> Link {
        let links = crate::sync::read_lock(&self.links);
        links.get(&(from.to_string(), to.to_string())).copied().unwrap_or(Link::Up)
    }

    fn agent(&self, id: &str) -> Option<(Agent, Option<tokio::runtime::Handle>)> {
        let agents = crate::sync::read_lock(&self.agents);
        let joined = agents.get(id)?;
        let agent = joined.agent.upgrade().filter(|a| !a.is_stopped())?;
        Some((agent, joined.runtime.clone()))
    }
}

/// An agent on the network, and the runtime its handlers run on.
#[derive(Debug, Clone)]
struct Joined {
    agent: WeakAgent,
    runtime: Option<tokio::runtime::Handle>,
}

/// One agent's side of a [`MemoryNetwork`].
#[derive(Debug)]
struct MemoryPeers {
    me: String,
    net: Arc<MemoryNetwork>,
    reach: Reachability,
}

impl MemoryPeers {
    /// Runs `request` on agent `to` as its own task, within `timeout`, through the link.
    async fn send<T, F, Fut>(
        &self,
        (to, _): (&str, &str),
        timeout: Duration,
        request: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Agent) -> Fut + Clone,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let lost = |what: &str| ApiError::unavailable(format!("agent '{to}' did not answer: {what}"));
        let link = self.net.link(&self.me, to);
        let again = (link == Link::Duplicated).then(|| request.clone());
        let deadline = tokio::time::Instant::now() + timeout;
        let there = self.net.delay(&self.me, to, link);
        if !there.is_zero() {
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + there)).await;
            if tokio::time::Instant::now() >= deadline {
                self.reach.reached(to, false);
                return Err(lost(&format!("no answer within {timeout:?}")));
            }
        }
        if !self.net.unpaused([&self.me, to], deadline).await {
            self.reach.reached(to, false);
            return Err(lost(&format!("no answer within {timeout:?}")));
        }
        let Some((agent, runtime)) = self.net.agent(to).filter(|_| link != Link::Cut) else {
            self.reach.reached(to, false);
            return Err(lost("unreachable"));
        };
        let spawn = |request: F, agent: Agent| match &runtime {
            Some(runtime) => runtime.spawn(request(agent)),
            None => tokio::spawn(request(agent)),
        };
        let mut task = spawn(request, agent.clone());
        let answer = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.reach.reached(to, false);
                return Err(lost(&format!("its handler failed: {e}")));
            }
            Err(_) => {
                task.abort();
                self.reach.reached(to, false);
                return Err(lost(&format!("no answer within {timeout:?}")));
            }
        };
        if let Some(again) = again {
            // Its answer goes nowhere; it runs alongside whatever the sender does next.
            drop(spawn(again, agent));
        }
        if link == Link::RepliesLost {
            self.reach.reached(to, false);
            return Err(lost("its answer was lost"));
        }
        let back = self.net.delay(to, &self.me, link);
        if !back.is_zero() {
            if tokio::time::Instant::now() + back > deadline {
                tokio::time::sleep_until(deadline).await;
                self.reach.reached(to, false);
                return Err(lost(&format!("no answer within {timeout:?}")));
            }
            tokio::time::sleep(back).await;
        }
        if !self.net.unpaused([&self.me, to], deadline).await {
            self.reach.reached(to, false);
            return Err(lost(&format!("no answer within {timeout:?}")));
        }
        self.reach.reached(to, true);
        answer
    }
}

/// A forwarded read's limit as the answering agent takes it: `HttpPeers` sends the byte limit
/// within bounds, and the route refuses a record count out of them.
fn forwarded_read(limit: ReadLimit) -> Result<ReadLimit, ApiError> {
    if limit.records == 0 || limit.records > REPLAY_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidMax,
            format!("max must be between 1 and {REPLAY_MAX}, got {}", limit.records),
        ));
    }
    Ok(ReadLimit::new(limit.records, limit.bytes.clamp(1, READ_BYTES_MAX)))
}

/// A held read's limit as the answering agent takes it (the route clamps both).
fn held_read(limit: ReadLimit) -> ReadLimit {
    ReadLimit::new(limit.records.clamp(1, REPLAY_MAX), limit.bytes.clamp(1, READ_BYTES_MAX))
}

#[async_trait::async_trait]
impl Peer for MemoryPeers {
    fn unreachable_since(&self, agent: &str) -> Option<Instant> {
        self.reach.unreachable_since(agent)
    }

    async fn probe(&self, (to, _): (&str, &str)) -> bool {
        let link = self.net.link(&self.me, to);
        let paused = self.net.paused.borrow().iter().any(|p| *p == self.me || p == to);
        let answered =
            !matches!(link, Link::Cut | Link::RepliesLost) && !paused && self.net.agent(to).is_some();
        if answered {
            self.reach.reached(to, true);
        }
        answered
    }

    async fn append(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        batch: Bytes,
    ) -> Result<(u64, u64), ApiError> {
        let topic = topic.to_string();
        self.send(
            to,
            PEER_TIMEOUT,
            move |a| async move { a.produce_batch(&topic, partition, batch, true).await },
        )
        .await
    }

    async fn read(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        let topic = topic.to_string();
        self.send(to, PEER_TIMEOUT, move |a| async move {
            let (records, next_offset, high_watermark) =
                a.read(&topic, partition, offset, forwarded_read(limit)?, true).await?;
            Ok(RecordPage { records, next_offset, high_watermark })
        })
        .await
    }

    async fn read_held(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<RecordPage, ApiError> {
        let topic = topic.to_string();
        self.send(to, PEER_TIMEOUT, move |a| async move {
            let (records, next_offset, high_watermark) =
                a.read_held(&topic, partition, offset, held_read(limit)).await?;
            Ok(RecordPage { records, next_offset, high_watermark })
        })
        .await
    }

    async fn replica_append(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        committed: Option<u64>,
        batches: Bytes,
    ) -> Result<u64, ApiError> {
        let (topic, target) = (topic.to_string(), target.clone());
        self.send(to, REPLICA_TIMEOUT, move |a| async move {
            a.replica_append(&topic, partition, target, committed, batches).await
        })
        .await
    }

    async fn replica_fence(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let (topic, target) = (topic.to_string(), target.clone());
        self.send(
            to,
            REPLICA_TIMEOUT,
            move |a| async move { a.replica_fence(&topic, partition, target).await },
        )
        .await
    }

    async fn replica_held(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
    ) -> Result<HeldSegment, ApiError> {
        let (topic, target) = (topic.to_string(), target.clone());
        self.send(
            to,
            REPLICA_TIMEOUT,
            move |a| async move { a.replica_held(&topic, partition, target).await },
        )
        .await
    }

    async fn replica_batches(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        from: u64,
    ) -> Result<Bytes, ApiError> {
        let (topic, target) = (topic.to_string(), target.clone());
        self.send(to, REPLICA_TIMEOUT, move |a| async move {
            a.replica_batches(&topic, partition, target, from).await
        })
        .await
    }

    async fn replica_repair(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        target: &ReplicaTarget,
        source: &str,
    ) -> Result<(), ApiError> {
        let (topic, target, source) = (topic.to_string(), target.clone(), source.to_string());
        self.send(to, REPAIR_TIMEOUT, move |a| async move {
            a.replica_repair(&topic, partition, target, &source).await
        })
        .await
    }

    async fn offset_for_time(
        &self,
        to: (&str, &str),
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
    ) -> Result<u64, ApiError> {
        let topic = topic.to_string();
        self.send(to, PEER_TIMEOUT, move |a| async move {
            a.offset_for_time(&topic, partition, timestamp_ms, true).await
        })
        .await
    }

    async fn collect(
        &self,
        to: (&str, &str),
        topic: &str,
        req: &CollectRequest,
    ) -> Result<Vec<Delivered>, ApiError> {
        let (topic, req) = (topic.to_string(), req.clone());
        let records = self
            .send(to, PEER_TIMEOUT, move |a| async move { a.collect_for_peer(&topic, req).await })
            .await?;
        records.into_iter().map(WireRecord::into_delivered).collect()
    }

    async fn ack(
        &self,
        to: (&str, &str),
        group: &str,
        ids: &[String],
        dry_run: bool,
    ) -> Result<usize, ApiError> {
        let (group, ids) = (group.to_string(), ids.to_vec());
        self.send(to, PEER_TIMEOUT, move |a| async move { a.ack(&group, &ids, dry_run, true).await }).await
    }
}
