//! The clients: producers that send messages to random agents for random partitions, readers
//! that read from random offsets through random agents, and, once the faults are healed, a
//! read of every partition to its end. Every operation goes into the history.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::ObjectStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_agent::agent::ProduceMessage;
use silt_agent::limits::ReadLimit;
use silt_record::Record;

use silt_agent::agent::PollRequest;
use silt_metadata::state::{AckCheckpoint, GroupMode};
use silt_metadata::MetadataError;
use silt_record::MessageId;

use crate::world::World;
use silt_sim::history::{Delivery, Event, History, Ms, Op, Seen};
use silt_sim::register;

pub(crate) const TOPIC: &str = "events";
pub(crate) const PARTITIONS: u32 = 2;
const PRODUCERS: usize = 3;
const READERS: usize = 2;
/// With `--groups`: the consumer groups, each with two members polling through random agents.
const GROUPS: [(&str, GroupMode); 2] = [("exclusive", GroupMode::Exclusive), ("shared", GroupMode::Shared)];
const MEMBERS: [&str; 2] = ["m0", "m1"];
/// The topic's visibility timeout with `--groups`: a message not acknowledged within it is
/// delivered again, several times within the faults.
const VISIBILITY_TIMEOUT_MS: &str = "2000";
/// How often metadata's ack checkpoints are looked at.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

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
    /// Whether consumer groups poll and acknowledge too (`--groups`).
    groups: bool,
    /// Where each partition's final log ends, once read.
    final_end: Mutex<BTreeMap<u32, u64>>,
    /// Whether the topic is deleted and created again during the faults (`--recreate`).
    recreate: bool,
    /// Every produce, read and change of configs holds it shared; deleting the topic and
    /// creating it again holds it alone, so that each operation ran on one topic or the other.
    gate: tokio::sync::RwLock<()>,
    /// Timestamps of the last records reads returned (up to [`SEEN_TIMES`], a ring and where
    /// it goes on), for replays from a time.
    seen_times: Mutex<(Vec<i64>, usize)>,
}

/// How many timestamps of records read [`Clients::seen_times`] keeps.
const SEEN_TIMES: usize = 256;

/// With `--archive`: the topic's segments roll at 4 KiB (about 70 messages) or after a second,
/// and agents drop their copies of a segment once it is archived, so that reads of all but
/// the last few seconds go to the bucket.
const ARCHIVE_CONFIG: [(&str, &str); 3] =
    [("segment.bytes", "4096"), ("segment.ms", "1000"), ("local.retention.ms", "0")];
/// With `--archive`, the topic's configs change every few seconds among these (writers pick a
/// change up within a second, in the middle of a segment).
const CONFIG_CHOICES: [(&str, &[&str]); 4] = [
    ("segment.bytes", &["4096", "16384", "65536"]),
    ("segment.ms", &["300", "1000", "5000"]),
    ("local.retention.ms", &["0", "2000", "60000"]),
    ("local.retention.bytes", &["-1", "0", "8192"]),
];

impl Clients {
    pub(crate) fn new(
        world: Arc<World>,
        history: Arc<Mutex<History>>,
        groups: bool,
        recreate: bool,
    ) -> Arc<Clients> {
        Arc::new(Clients {
            world,
            history,
            acked_end: Mutex::default(),
            groups,
            final_end: Mutex::default(),
            recreate,
            gate: tokio::sync::RwLock::new(()),
            seen_times: Mutex::default(),
        })
    }

    /// The topic's configs.
    fn topic_config(&self) -> BTreeMap<String, String> {
        let mut config = BTreeMap::new();
        if self.groups {
            // Redelivered soon, never dead-lettered within a run.
            config.insert("visibility.timeout.ms".to_string(), VISIBILITY_TIMEOUT_MS.to_string());
            config.insert("max.deliveries".to_string(), "1000".to_string());
        }
        if self.world.bucket.is_some() {
            config.extend(ARCHIVE_CONFIG.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        }
        config
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
            let config = self.topic_config();
            let created = self
                .world
                .call(&via, |a| async move { a.create_topic(TOPIC, PARTITIONS, config).await })
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
        if self.groups {
            for (group, mode) in GROUPS {
                for member in MEMBERS {
                    let (clients, seed) = (Arc::clone(&self), rng.random());
                    tasks.push(tokio::task::spawn_local(async move {
                        clients.consume(group, mode, member, seed, phase_end).await
                    }));
                }
            }
        }
        if self.world.bucket.is_some() {
            let (clients, seed) = (Arc::clone(&self), rng.random());
            tasks.push(tokio::task::spawn_local(async move { clients.configure(seed, phase_end).await }));
        }
        if self.recreate {
            let (clients, seed) = (Arc::clone(&self), rng.random());
            tasks.push(tokio::task::spawn_local(async move { clients.recreate(seed, phase_end).await }));
        }
        if self.world.metadata_nodes.len() > 1 {
            let mut apart = StdRng::seed_from_u64(seed ^ 0x3E61_57E2);
            for client in 0..register::CLIENTS {
                let (clients, seed) = (Arc::clone(&self), apart.random());
                tasks.push(tokio::task::spawn_local(async move {
                    clients.register(client, seed, phase_end).await
                }));
            }
        }
        // Replays from a time, the last client started and drawn apart, so that the others
        // draw what they drew before it existed.
        let (clients, apart) = (Arc::clone(&self), seed ^ 0x0071_4E5A);
        tasks.push(tokio::task::spawn_local(async move { clients.replays(apart, phase_end).await }));
        let watch = self.groups.then(|| {
            let clients = Arc::clone(&self);
            tokio::task::spawn_local(async move { clients.watch_checkpoints().await })
        });
        for t in tasks {
            t.await?;
        }
        for partition in 0..PARTITIONS {
            self.read_to_end(partition).await;
        }
        if self.groups {
            for (group, mode) in GROUPS {
                self.drain(group, mode, &mut rng).await;
            }
            // A recovery that ended meanwhile may have sealed a tail of messages whose produce
            // failed (their outcome unknown) after the partition's end read before: the groups
            // were delivered them, and the checker judges against the log as it ends now.
            for partition in 0..PARTITIONS {
                self.read_to_end(partition).await;
            }
        }
        if let Some(watch) = watch {
            watch.abort();
        }
        self.read_bucket().await;
        Ok(())
    }

    /// With `--archive`: every object in the bucket and every one metadata's segments name,
    /// read directly, as DuckDB or pyarrow would.
    async fn read_bucket(&self) {
        let Some(bucket) = &self.world.bucket else { return };
        let mut segments = self.world.archived_segments();
        let topic_id = self.world.topic_id();
        let prefix = object_store::path::Path::from(crate::world::BUCKET_PREFIX);
        let listed: Vec<_> = bucket.objects.list(Some(&prefix)).collect().await;
        let mut keys = Vec::new();
        for meta in listed {
            match meta {
                // The objects of this topic (a topic deleted before may have left some behind:
                // they carry its id, and no reader of this one meets them).
                Ok(meta)
                    if meta.location.as_ref().ends_with(silt_tiering::object_layout::OBJECT_SUFFIX)
                        && silt_tiering::object_layout::parse_object_key(&meta.location)
                            .is_none_or(|n| n.topic_id.is_none() || n.topic_id == topic_id) =>
                {
                    keys.push(meta.location.to_string())
                }
                Ok(_) => {}
                Err(e) => {
                    let start = now();
                    let result = Err(format!("the bucket cannot be listed: {e}"));
                    self.record(start, Op::Archived { key: prefix.to_string(), segment: None, result });
                    return;
                }
            }
        }
        // Named by a segment but not in the bucket: read anyway, to say so.
        keys.extend(segments.keys().filter(|k| !keys.contains(k)).cloned().collect::<Vec<_>>());
        keys.sort();
        for key in keys {
            let start = now();
            let segment = segments.remove(&key);
            let path = object_store::path::Path::from(key.as_str());
            let result = match bucket.objects.get(&path).await {
                Ok(got) => match got.bytes().await {
                    Ok(bytes) => silt_tiering::archive_format::decode_archive(bytes)
                        .map(|(meta, records)| (meta.partition, seen(&records)))
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            self.record(start, Op::Archived { key, segment, result });
        }
    }

    /// One member of a group: polls through a random agent and acknowledges what it got,
    /// mostly all of it, sometimes some or none (to be delivered again), mostly through the
    /// agent it polled.
    async fn consume(
        self: Arc<Clients>,
        group: &str,
        mode: GroupMode,
        member: &str,
        seed: u64,
        phase_end: Ms,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        while now() < phase_end {
            let via = self.agent(&mut rng);
            let delivered = self.poll(group, mode, member, &via, Duration::from_millis(200)).await;
            if let Ok(delivered) = delivered {
                let share = match rng.random_range(0..10) {
                    0 => 0.0,
                    1 => 0.5,
                    _ => 1.0,
                };
                let acks: Vec<(u32, u64)> = delivered
                    .iter()
                    .filter(|_| rng.random_bool(share))
                    .map(|d| (d.partition, d.offset))
                    .collect();
                let via = if rng.random_bool(0.8) { via } else { self.agent(&mut rng) };
                self.ack(group, &via, acks).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
    }

    /// A poll of `group` by `member` through `via`, recorded.
    async fn poll(
        &self,
        group: &str,
        mode: GroupMode,
        member: &str,
        via: &str,
        timeout: Duration,
    ) -> Result<Vec<Delivery>, String> {
        let request = PollRequest {
            topic: TOPIC.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            mode,
            max: 20,
            max_bytes: 1 << 20,
            timeout,
            session_timeout: Duration::from_secs(10),
        };
        let start = now();
        let result = self.world.call(via, move |a| async move { a.poll(request).await }).await.map(|got| {
            got.iter()
                .map(|d| Delivery {
                    partition: d.partition,
                    offset: d.record.offset,
                    value: value_of(&d.record),
                    deliveries: d.delivery,
                })
                .collect::<Vec<_>>()
        });
        self.record(
            start,
            Op::Poll { group: group.into(), member: member.into(), via: via.into(), result: result.clone() },
        );
        result
    }

    /// An acknowledgement of `messages` to `group` through `via`, recorded (none: nothing sent).
    async fn ack(&self, group: &str, via: &str, messages: Vec<(u32, u64)>) {
        if messages.is_empty() {
            return;
        }
        let ids: Vec<String> =
            messages.iter().map(|(p, o)| MessageId::new(TOPIC.to_string(), *p, *o).to_string()).collect();
        let start = now();
        let g = group.to_string();
        let result = self.world.call(via, move |a| async move { a.ack(&g, &ids, false, false).await }).await;
        self.record(start, Op::Ack { group: group.into(), via: via.into(), messages, result });
    }

    /// Records each group's ack checkpoints as metadata holds them, whenever one changes.
    async fn watch_checkpoints(&self) {
        let mut seen: BTreeMap<(String, u32), AckCheckpoint> = BTreeMap::new();
        loop {
            for (group, _) in GROUPS {
                for (partition, (floor, acked)) in self.world.checkpoints(group, TOPIC) {
                    let key = (group.to_string(), partition);
                    let checkpoint = AckCheckpoint { floor, acked };
                    if seen.get(&key) != Some(&checkpoint) {
                        let start = now();
                        let (floor, acked) = (checkpoint.floor, checkpoint.acked.clone());
                        self.record(start, Op::Checkpoint { group: group.into(), partition, floor, acked });
                        seen.insert(key, checkpoint);
                    }
                }
            }
            tokio::time::sleep(CHECKPOINT_EVERY).await;
        }
    }

    /// Once every fault is healed: both members poll `group` and acknowledge everything they
    /// get until its checkpoints reach the end of every partition's final log, or the recovery
    /// time is up.
    async fn drain(&self, group: &str, mode: GroupMode, rng: &mut StdRng) {
        let start = now();
        let deadline = start + RECOVERY.as_millis() as Ms;
        let ends = self.final_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let behind = || -> Vec<String> {
            let checkpoints = self.world.checkpoints(group, TOPIC);
            ends.iter()
                .filter_map(|(p, end)| {
                    let floor = checkpoints.get(p).map_or(0, |(floor, _)| *floor);
                    (floor < *end).then(|| format!("partition {p} checkpointed to {floor} of {end}"))
                })
                .collect()
        };
        let mut turn = 0;
        loop {
            let left = behind();
            if left.is_empty() {
                self.record(start, Op::Drained { group: group.into(), why: String::new() });
                return;
            }
            if now() >= deadline {
                let why = format!("not within {RECOVERY:?}: {}", left.join(", "));
                self.record(start, Op::Drained { group: group.into(), why });
                return;
            }
            let member = MEMBERS[turn % MEMBERS.len()];
            turn += 1;
            let via = self.agent(rng);
            if let Ok(delivered) = self.poll(group, mode, member, &via, Duration::from_millis(500)).await {
                let acks = delivered.iter().map(|d| (d.partition, d.offset)).collect();
                self.ack(group, &via, acks).await;
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Once, 8 - 20 s into the faults: waits for every produce, read and change of configs under
    /// way to end and holds the others back, deletes the topic and creates it again (through
    /// random agents, until metadata holds a new topic of the name), then lets them go on.
    async fn recreate(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        tokio::time::sleep(Duration::from_millis(rng.random_range(8_000..20_000).min(phase_end))).await;
        let _alone = self.gate.write().await;
        let start = now();
        let deadline = start + RECOVERY.as_millis() as Ms;
        let result = async {
            let mut why = String::new();
            // As a client does: until an agent says it is deleted, or that there is no such
            // topic (an attempt whose answer was lost deleted it).
            loop {
                if now() >= deadline {
                    return Err(format!("not deleted within {RECOVERY:?}: {why}"));
                }
                let via = self.agent(&mut rng);
                match self.world.call(&via, |a| async move { a.delete_topic(TOPIC).await }).await {
                    Ok(()) => break,
                    Err(e) if e.starts_with("unknown_topic") => break,
                    Err(e) => {
                        why = e;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            // Until metadata holds a topic of the name again.
            while self.world.topic_id().is_none() {
                if now() >= deadline {
                    return Err(format!("not created again within {RECOVERY:?}: {why}"));
                }
                let (via, config) = (self.agent(&mut rng), self.topic_config());
                let created = self
                    .world
                    .call(&via, |a| async move { a.create_topic(TOPIC, PARTITIONS, config).await })
                    .await;
                if let Err(e) = created {
                    why = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Ok(())
        }
        .await;
        // The new topic starts empty.
        self.acked_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        self.record(start, Op::Recreate { result });
    }

    /// Changes one or two of the topic's configs through a random agent every 2 - 6 s.
    async fn configure(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        loop {
            tokio::time::sleep(Duration::from_millis(rng.random_range(2_000..6_000))).await;
            if now() >= phase_end {
                return;
            }
            let mut config = BTreeMap::new();
            for _ in 0..rng.random_range(1..=2) {
                let (key, values) = CONFIG_CHOICES[rng.random_range(0..CONFIG_CHOICES.len())];
                config.insert(key.to_string(), values[rng.random_range(0..values.len())].to_string());
            }
            let shown = config.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            let via = self.agent(&mut rng);
            let _gate = self.gate.read().await;
            let start = now();
            let result = self
                .world
                .call(&via, move |a| async move { a.alter_topic_config(TOPIC, config).await })
                .await
                .map(|_| ());
            self.record(start, Op::Configure { via, config: shown, result });
        }
    }

    /// With several metadata nodes: writes unique values to the register and reads it, through
    /// random agents' copies of metadata (a write as every agent commits a command, a read as
    /// every agent's linearizable read), until `phase_end`. The first client creates the
    /// register's topic; the others wait until a read finds it.
    async fn register(self: Arc<Clients>, client: u64, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        loop {
            let via = self.agent(&mut rng);
            let exists = if client == 0 {
                let created = self
                    .world
                    .call(&via, |a| async move {
                        let config = register::topic_config();
                        a.create_topic(register::TOPIC, 1, config).await
                    })
                    .await;
                created.is_ok() || created.is_err_and(|e| e.contains("already exists"))
            } else {
                let read = self
                    .world
                    .call(&via, |a| async move {
                        Ok(a.metadata().read(|s| s.topics.contains_key(register::TOPIC)).await)
                    })
                    .await;
                matches!(read, Ok(Ok(true)))
            };
            if exists {
                break;
            }
            if now() >= phase_end {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut written = 0;
        while now() < phase_end {
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..300))).await;
            let via = self.agent(&mut rng);
            let start = now();
            if rng.random_bool(0.5) {
                written += 1;
                let value = register::value(client, written);
                let command = register::write(value);
                let answer = self
                    .world
                    .call(&via, move |a| async move { Ok(a.metadata().write(command).await.map(|_| ())) })
                    .await;
                let result = match answer {
                    Ok(Ok(())) => Ok(()),
                    // It may have been committed: its answer was lost, or it timed out.
                    Ok(Err(MetadataError::Unavailable(e))) | Err(e) => Err(e),
                    // Refused: it took no effect.
                    Ok(Err(_)) => continue,
                };
                self.record(start, Op::RegisterWrite { via, value, result });
            } else {
                let read = self
                    .world
                    .call(&via, |a| async move { Ok(a.metadata().read(register::read).await) })
                    .await;
                let result = match read {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(e),
                };
                self.record(start, Op::RegisterRead { via, result });
            }
        }
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
            let gate = self.gate.read().await;
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
            drop(gate);
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        }
    }

    async fn read(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        while now() < phase_end {
            let (partition, via) = (rng.random_range(0..PARTITIONS), self.agent(&mut rng));
            let gate = self.gate.read().await;
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
            if let Ok(records) = self.read_from(partition, via, from).await {
                self.saw_times(&records);
            }
            drop(gate);
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
    }

    /// Keeps the timestamps of the last [`SEEN_TIMES`] records read, for replays from a time.
    fn saw_times(&self, records: &[Seen]) {
        let mut seen = self.seen_times.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (times, next) = &mut *seen;
        for r in records {
            if times.len() < SEEN_TIMES {
                times.push(r.timestamp_ms);
            } else {
                times[*next % SEEN_TIMES] = r.timestamp_ms;
            }
            *next += 1;
        }
    }

    /// Replays from a time, now and then until `phase_end`.
    async fn replays(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        while now() < phase_end {
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
            let gate = self.gate.read().await;
            self.replay_from_a_time(&mut rng).await;
            drop(gate);
        }
    }

    /// A replay from a time: the first offset whose timestamp is at least a time some record
    /// read earlier bears (or a millisecond later), looked up through an agent, then a read
    /// from there.
    async fn replay_from_a_time(&self, rng: &mut StdRng) {
        let time = {
            let seen = self.seen_times.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let times = &seen.0;
            if times.is_empty() {
                return;
            }
            times[rng.random_range(0..times.len())] + rng.random_range(0..=1)
        };
        let (partition, via) = (rng.random_range(0..PARTITIONS), self.agent(rng));
        let start = now();
        let result = self
            .world
            .call(&via, move |a| async move { a.offset_for_time(TOPIC, partition, time, false).await })
            .await;
        self.record(
            start,
            Op::TimeLookup { partition, via: via.clone(), timestamp_ms: time, result: result.clone() },
        );
        if let Ok(from) = result {
            let _ = self.read_from(partition, via, from).await;
        }
    }

    /// Reads up to 100 records of `partition` from `from` through `via`, and records the read;
    /// returns what it returned.
    async fn read_from(&self, partition: u32, via: String, from: u64) -> Result<Vec<Seen>, String> {
        let start = now();
        let result = self
            .world
            .call(&via, move |a| async move {
                a.read(TOPIC, partition, from, ReadLimit::new(100, 1 << 20), false).await
            })
            .await
            .map(|(records, next, hwm)| (seen(&records), next, hwm));
        let records = result.as_ref().map(|(records, ..)| records.clone()).map_err(String::clone);
        self.record(start, Op::Read { partition, via, from, result });
        records
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
                    self.final_end
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(partition, hwm);
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
        .map(|r| Seen { offset: r.offset, value: value_of(r), timestamp_ms: r.timestamp_ms })
        .collect()
}

fn value_of(record: &Record) -> String {
    record.value.as_deref().map_or_else(|| "<none>".to_string(), |v| String::from_utf8_lossy(v).into_owned())
}
