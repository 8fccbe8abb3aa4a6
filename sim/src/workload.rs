//! The clients: producers that send messages to random agents for random partitions, readers
//! that read from random offsets through random agents, and, once the faults are healed, a
//! read of every partition to its end. Every operation goes into the history.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_agent::agent::ProduceMessage;
use silt_agent::limits::ReadLimit;
use silt_record::Record;

use crate::world::World;
use silt_sim::history::{Event, History, Ms, Op, Seen};

pub(crate) const TOPIC: &str = "events";
pub(crate) const PARTITIONS: u32 = 2;
const PRODUCERS: usize = 3;
const READERS: usize = 2;
/// How long the clients keep trying to read every partition to its end after the faults.
const RECOVERY: Duration = Duration::from_secs(180);

/// Simulated milliseconds since the start.
pub(crate) fn now() -> Ms {
    turmoil::sim_elapsed().unwrap_or_default().as_millis() as Ms
}

/// What the clients share.
pub(crate) struct Clients {
    pub(crate) world: Arc<World>,
    pub(crate) history: Arc<Mutex<History>>,
    /// The highest offset acknowledged per partition, for readers to aim at.
    acked_end: Mutex<BTreeMap<u32, u64>>,
}

impl Clients {
    pub(crate) fn new(world: Arc<World>, history: Arc<Mutex<History>>) -> Arc<Clients> {
        Arc::new(Clients { world, history, acked_end: Mutex::default() })
    }

    fn record(&self, start: Ms, op: Op) {
        let mut history = self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        history.events.push(Event { start, end: now(), op });
    }

    fn agent(&self, rng: &mut StdRng) -> String {
        self.world.agents[rng.random_range(0..self.world.agents.len())].clone()
    }

    /// The clients' whole run: the topic created, the workload until `phase_end` ms, then every
    /// partition read to its end once the faults are healed.
    pub(crate) async fn run(self: Arc<Clients>, seed: u64, phase_end: Ms) -> turmoil::Result {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xC11E);
        loop {
            let via = self.agent(&mut rng);
            let created = self
                .world
                .call(&via, |a| async move { a.create_topic(TOPIC, PARTITIONS, BTreeMap::new()).await })
                .await;
            match created {
                Ok(_) => break,
                Err(e) if e.contains("already exists") => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        let mut tasks = Vec::new();
        for p in 0..PRODUCERS {
            let (clients, seed) = (Arc::clone(&self), rng.random());
            tasks.push(tokio::task::spawn_local(async move { clients.produce(p, seed, phase_end).await }));
        }
        for _ in 0..READERS {
            let (clients, seed) = (Arc::clone(&self), rng.random());
            tasks.push(tokio::task::spawn_local(async move { clients.read(seed, phase_end).await }));
        }
        for t in tasks {
            t.await?;
        }
        for partition in 0..PARTITIONS {
            self.read_to_end(partition).await;
        }
        Ok(())
    }

    async fn produce(self: Arc<Clients>, producer: usize, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0;
        while now() < phase_end {
            let (partition, via) = (rng.random_range(0..PARTITIONS), self.agent(&mut rng));
            let value = format!("c{producer}-{n}");
            n += 1;
            let message = ProduceMessage {
                partition: Some(partition),
                value: Some(Bytes::from(value.clone())),
                ..ProduceMessage::default()
            };
            let start = now();
            let result = self
                .world
                .call(&via, |a| async move { a.produce(TOPIC, vec![message]).await })
                .await
                .and_then(|ids| ids.first().map(|id| id.offset).ok_or_else(|| "no message id".to_string()));
            if let Ok(offset) = result {
                let mut ends = self.acked_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let end = ends.entry(partition).or_default();
                *end = (*end).max(offset + 1);
            }
            self.record(start, Op::Produce { partition, via, value, result });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        }
    }

    async fn read(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        while now() < phase_end {
            let (partition, via) = (rng.random_range(0..PARTITIONS), self.agent(&mut rng));
            let end = self
                .acked_end
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&partition)
                .copied()
                .unwrap_or(0);
            // Half the reads follow the tail (where a dirty read would show), half go back.
            let from = if rng.random_bool(0.5) {
                end.saturating_sub(rng.random_range(0..4))
            } else {
                rng.random_range(0..=end)
            };
            let start = now();
            let result = self
                .world
                .call(&via, move |a| async move {
                    a.read(TOPIC, partition, from, ReadLimit::new(100, 1 << 20), false).await
                })
                .await
                .map(|(records, next, hwm)| (seen(&records), next, hwm));
            self.record(start, Op::Read { partition, via, from, result });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
    }

    /// Reads `partition` from 0 to the end through each agent in turn until one read gets to
    /// the end of what was acknowledged, or the recovery time is up.
    async fn read_to_end(&self, partition: u32) {
        let start = now();
        let deadline = start + RECOVERY.as_millis() as Ms;
        let acked_end =
            self.acked_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&partition).copied();
        let mut why = String::from("no read was tried");
        let mut longest: Option<Vec<Seen>> = None;
        let mut attempt = 0;
        while now() < deadline {
            let via = self.world.agents[attempt % self.world.agents.len()].clone();
            attempt += 1;
            match self.read_all(&via, partition).await {
                Ok((log, hwm)) if hwm >= acked_end.unwrap_or(0) => {
                    self.record(start, Op::Final { partition, log: Some(log), why: String::new() });
                    return;
                }
                Ok((log, hwm)) => {
                    why = format!("{via} answered hwm {hwm}, below the acknowledged {acked_end:?}");
                    if longest.as_ref().is_none_or(|l| l.len() < log.len()) {
                        longest = Some(log);
                    }
                }
                Err(e) => why = e,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.record(
            start,
            Op::Final { partition, log: longest, why: format!("not within {RECOVERY:?}: {why}") },
        );
    }

    async fn read_all(&self, via: &str, partition: u32) -> Result<(Vec<Seen>, u64), String> {
        let mut log = Vec::new();
        let mut offset = 0;
        loop {
            let (records, next, hwm) = self
                .world
                .call(via, move |a| async move {
                    a.read(TOPIC, partition, offset, ReadLimit::new(1000, 1 << 24), false).await
                })
                .await?;
            log.extend(seen(&records));
            if next >= hwm || records.is_empty() && next == offset {
                return Ok((log, hwm));
            }
            offset = next;
        }
    }
}

fn seen(records: &[Record]) -> Vec<Seen> {
    records
        .iter()
        .map(|r| Seen {
            offset: r.offset,
            value: r
                .value
                .as_deref()
                .map_or_else(|| "<none>".to_string(), |v| String::from_utf8_lossy(v).into_owned()),
        })
        .collect()
}
