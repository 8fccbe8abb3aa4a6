//! The replicated hot tail under faults: three real `silt metadata` processes and three
//! `silt agent` processes on loopback, topics with `replication.factor=3` (W = 2), producers
//! writing keyed messages with acknowledgements while agents are killed, paused past their
//! lease, cut off from the others by a TCP proxy (from metadata too, or only from the other
//! agents) and restarted with their disks wiped. A checker then reads everything back: no
//! acknowledged message is lost, none moved, each offset holds one message, and each
//! producer's messages keep their order within a partition.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use silt::client::{Client, OutMessage};
use silt::silt_metadata::state::Partition;
use silt::silt_metadata::MetadataState;
use silt_tests::{wait_for, AgentOptions, MetadataCluster, Proxy, SiltDev};

const LEASE: &str = "2s";
const PARTITIONS: u32 = 3;

struct Cluster {
    metadata: MetadataCluster,
    agents: Vec<SiltDev>,
    /// Per agent: the proxy other agents reach it through (its advertised address), and the
    /// proxies it reaches the metadata nodes through. Cutting them isolates the agent.
    networks: Vec<(Proxy, Vec<Proxy>)>,
    /// The agents' current API URLs (a restarted agent listens on a new port).
    urls: Arc<Mutex<Vec<String>>>,
    _bucket: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        Self::start_with(3, &[]).await
    }

    /// `n` agents, each started with `extra` arguments too.
    async fn start_with(n: usize, extra: &[&str]) -> Cluster {
        Self::start_with_lease(n, extra, LEASE).await
    }

    /// `n` agents with `extra` arguments and their lease.
    async fn start_with_lease(n: usize, extra: &[&str], lease: &str) -> Cluster {
        let metadata = MetadataCluster::start(3, &[]);
        metadata.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
        let bucket = tempfile::tempdir().expect("tempdir");
        let objects = format!("file://{}", bucket.path().display());
        let mut agents = Vec::new();
        let mut networks = Vec::new();
        for i in 1..=n {
            let inbound = Proxy::start("127.0.0.1:1").await;
            let mut to_metadata = Vec::new();
            for addr in metadata.addrs() {
                to_metadata.push(Proxy::start(&addr).await);
            }
            let agent = SiltDev::start_agent(&AgentOptions {
                id: format!("a{i}"),
                metadata: to_metadata.iter().map(|p| p.addr().to_string()).collect(),
                object_store: objects.clone(),
                lease: lease.into(),
                extra: ["--advertise", inbound.addr(), "--peer-source-ip", &source_ip(i - 1).to_string()]
                    .into_iter()
                    .chain(extra.iter().copied())
                    .map(String::from)
                    .collect(),
            });
            inbound.set_target(agent.url().trim_start_matches("http://"));
            agents.push(agent);
            networks.push((inbound, to_metadata));
        }
        let urls = Arc::new(Mutex::new(agents.iter().map(|a| a.url().to_string()).collect()));
        let cluster = Cluster { metadata, agents, networks, urls, _bucket: bucket };
        // Every agent registered, so that the first segments get a full ensemble.
        wait_for("every agent live", Duration::from_secs(20), || async {
            let s = cluster.state().await?;
            (s.agents.values().filter(|a| a.is_live(s.clock_ms)).count() == n).then_some(())
        })
        .await;
        cluster
    }

    async fn state(&self) -> Option<MetadataState> {
        self.metadata.client().read_state().await.ok().map(|r| r.state)
    }

    fn index_of(&self, agent: &str) -> usize {
        agent.trim_start_matches('a').parse::<usize>().expect("agent id") - 1
    }

    /// The last lines of every agent's log, for failure messages.
    fn logs(&self) -> String {
        self.agents
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let log = a.log();
                let tail: Vec<&str> =
                    log.lines().rev().filter(|l| !l.contains("archiving failed")).take(80).collect();
                // Whether it runs, sleeps or is stopped, and where its threads are.
                let state = a.pid().map(|pid| {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    let stacks = std::process::Command::new("gdb")
                        .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt 12"])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    format!("stat: {stat}\n{stacks}")
                });
                format!(
                    "--- a{} ---\n{}\n{}",
                    i + 1,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                    state.unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// After restarts: clients and the proxies use the agents' new ports.
    fn refresh_urls(&self) {
        *self.urls.lock().expect("urls") = self.agents.iter().map(|a| a.url().to_string()).collect();
        for (agent, (inbound, _)) in self.agents.iter().zip(&self.networks) {
            inbound.set_target(agent.url().trim_start_matches("http://"));
        }
    }

    /// Cuts agent `i` off from the other agents and from metadata (clients still reach it).
    fn isolate(&self, i: usize) {
        let (inbound, to_metadata) = &self.networks[i];
        inbound.cut();
        to_metadata.iter().for_each(Proxy::cut);
    }

    fn heal(&self, i: usize) {
        let (inbound, to_metadata) = &self.networks[i];
        inbound.heal();
        to_metadata.iter().for_each(Proxy::heal);
    }

    /// Cuts agent `i` off from the other agents, both ways, but not from metadata (nor from
    /// clients): its lease holds.
    fn cut_from_agents(&self, i: usize) {
        self.networks[i].0.cut();
        for (_, (inbound, _)) in self.networks.iter().enumerate().filter(|(j, _)| *j != i) {
            inbound.block(source_ip(i));
        }
    }

    fn heal_from_agents(&self, i: usize) {
        self.networks[i].0.heal();
        for (inbound, _) in &self.networks {
            inbound.unblock(source_ip(i));
        }
    }

    /// Waits until metadata names another writer than `writer` for each of `partitions`, and
    /// returns the state that did. Fails after 60 s.
    async fn writers_moved_from(&self, topic: &str, writer: &str, partitions: &[u32]) -> MetadataState {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.state().await;
            let still: Vec<u32> = match &s {
                Some(s) => partitions
                    .iter()
                    .copied()
                    .filter(|p| s.topics[topic].partitions[*p as usize].writer.as_deref() == Some(writer))
                    .collect(),
                None => partitions.to_vec(),
            };
            if let Some(s) = s.as_ref().filter(|_| still.is_empty()) {
                return s.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{writer} still writes partitions {still:?} of {topic} 60 s after the fault; agents: {:?}\nlogs:\n{}",
                s.map(|s| s.agents),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Partition 0 of "logs" once `done` holds of it, within 60 s of ensemble repair.
    async fn repaired(&self, done: impl Fn(&MetadataState, &Partition) -> bool) -> Partition {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.state().await.expect("state");
            let part = &s.topics["logs"].partitions[0];
            if done(&s, part) {
                return part.clone();
            }
            assert!(
                Instant::now() < deadline,
                "not repaired within 60 s: {:?}\nunder-replicated: {:?}\nlogs:\n{}",
                part.segments,
                s.under_replicated(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every member of each of the sealed segments at `bases` of partition 0 of "logs" serves it
    /// whole from its disk: every offset, each with the acknowledged value.
    async fn holders_serve_whole(&self, part: &Partition, bases: &[u64], acked: &BTreeMap<u64, String>) {
        for base in bases {
            let seg = &part.segments[base];
            let last = seg.last_offset.expect("sealed");
            for holder in &seg.ensemble {
                let agent = &self.agents[self.index_of(holder)];
                // A holder decides what is committed from its own copy of metadata (refreshed
                // every 200 ms): a follower whose copy has not applied the seal yet takes the
                // segment for open, and serves it only up to the end its writer last said was
                // committed (or answers 503 if that was of the next segment) until its copy
                // catches up. One that lacks the data never serves it whole.
                let page = wait_for(
                    &format!("{holder} to serve segment {base} of logs/0 whole"),
                    Duration::from_secs(10),
                    || async {
                        let page =
                            silt_tests::held_records_if_any(agent.url(), "logs", 0, *base, 10_000).await?;
                        page.records.last().is_some_and(|r| r.offset >= last).then_some(page)
                    },
                )
                .await;
                let offsets: Vec<u64> = page.records.iter().map(|r| r.offset).collect();
                assert_eq!(
                    offsets,
                    (*base..=last).collect::<Vec<_>>(),
                    "{holder} holds segment {base} whole"
                );
                for r in &page.records {
                    let value = String::from_utf8(r.value.clone().expect("value").to_vec()).expect("utf8");
                    assert_eq!(Some(&value), acked.get(&r.offset), "{holder} at {}", r.offset);
                }
            }
        }
    }

    /// The writer of a partition and the members of its open segment, once metadata has both.
    async fn writer_and_followers(&self, topic: &str, partition: usize) -> (String, Vec<String>) {
        wait_for("a writer with an open segment", Duration::from_secs(30), || async {
            let s = self.state().await?;
            let p = &s.topics[topic].partitions[partition];
            let writer = p.writer.clone()?;
            let open = p.open_segment()?;
            let followers = open.ensemble.iter().filter(|a| **a != writer).cloned().collect();
            Some((writer, followers))
        })
        .await
    }
}

/// The address agent `i` (from 0) connects to the other agents from: its own, so that a proxy
/// can tell its connections apart.
fn source_ip(i: usize) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + i as u8))
}

fn r3() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("replication.factor".to_string(), "3".to_string()),
        ("segment.bytes".to_string(), "65536".to_string()),
    ])
}

/// What producers were told: `(partition, offset) -> value`, and for each partition when the
/// latest acknowledged request was sent and acknowledged.
#[derive(Default)]
struct Acked {
    messages: BTreeMap<(u32, u64), String>,
    last_ack: HashMap<u32, (Instant, Instant)>,
}

/// Producers that write keyed messages in batches through any agent, retrying a batch that
/// fails on another agent until it is acknowledged, until told to stop.
struct Producers {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Acked>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producers {
    fn start(n: usize, topic: &str, urls: Arc<Mutex<Vec<String>>>) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Acked::default()));
        let tasks = (0..n)
            .map(|p| {
                let (stop, acked, urls, topic) =
                    (Arc::clone(&stop), Arc::clone(&acked), Arc::clone(&urls), topic.to_string());
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    let mut attempt = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        // One key per batch: each request goes to one partition, so a
                        // partition's recovery is measured on its own.
                        let key = format!("p{p}-k{}", (seq / 10) % 5);
                        let batch: Vec<OutMessage> = (seq..seq + 10)
                            .map(|i| OutMessage {
                                key: Some(key.clone()),
                                value: Some(format!("p{p}-{i}")),
                                ..OutMessage::default()
                            })
                            .collect();
                        loop {
                            let url = {
                                let urls = urls.lock().expect("urls");
                                urls[(p + attempt) % urls.len()].clone()
                            };
                            attempt += 1;
                            let sent = Instant::now();
                            // A paused agent never answers: give up on it and try another.
                            let client = Client::with_timeout(&url, Duration::from_secs(5)).expect("client");
                            match client.produce(&topic, &batch).await {
                                Ok(ids) => {
                                    let mut a = acked.lock().expect("acked");
                                    for (id, m) in ids.iter().zip(&batch) {
                                        let (partition, offset) = offset_of(id);
                                        let value = m.value.clone().expect("value");
                                        if let Some(old) = a.messages.insert((partition, offset), value.clone()) {
                                            panic!("offset {partition}/{offset} acknowledged twice: {old} and {value}");
                                        }
                                        a.last_ack.insert(partition, (sent, Instant::now()));
                                    }
                                    break;
                                }
                                Err(_) if stop.load(Ordering::Relaxed) => return,
                                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                            }
                        }
                        seq += 10;
                    }
                })
            })
            .collect();
        Producers { stop, acked, tasks }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().expect("acked").messages.len()
    }

    /// Waits until a request sent after `since` was acknowledged for `partition`; returns how
    /// long after `since` the acknowledgement came.
    async fn acked_after(&self, partition: u32, since: Instant, cluster: &Cluster) -> Duration {
        let deadline = since + Duration::from_secs(60);
        loop {
            let got = {
                let a = self.acked.lock().expect("acked");
                a.last_ack.get(&partition).filter(|(sent, _)| *sent > since).map(|(_, acked)| *acked - since)
            };
            if let Some(took) = got {
                return took;
            }
            if Instant::now() > deadline {
                panic!(
                    "partition {partition} acknowledged nothing for 60 s; state: {:?}\nlogs:\n{}",
                    cluster.state().await.map(|s| s.topics.get("events").or(s.topics.get("orders")).cloned()),
                    cluster.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) -> BTreeMap<(u32, u64), String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("producer task");
        }
        Arc::try_unwrap(self.acked).map_err(|_| ()).expect("sole owner").into_inner().expect("acked").messages
    }
}

/// Readers that replay every partition through any agent, round and round, while faults come
/// and go: what they were served, by (partition, offset). A read of anything not committed (past
/// the high watermark, a tail a recovery cut) would show at the end as a message the log does
/// not hold at that offset.
struct Readers {
    stop: Arc<AtomicBool>,
    read: Arc<Mutex<BTreeMap<(u32, u64), String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Readers {
    fn start(n: usize, topic: &str, urls: Arc<Mutex<Vec<String>>>) -> Readers {
        let stop = Arc::new(AtomicBool::new(false));
        let read = Arc::new(Mutex::new(BTreeMap::new()));
        let tasks = (0..n)
            .map(|r| {
                let (stop, read, urls, topic) =
                    (Arc::clone(&stop), Arc::clone(&read), Arc::clone(&urls), topic.to_string());
                tokio::spawn(async move {
                    let mut next = [0u64; PARTITIONS as usize];
                    let mut turn = r;
                    while !stop.load(Ordering::Relaxed) {
                        turn += 1;
                        let partition = (turn % PARTITIONS as usize) as u32;
                        let url = {
                            let urls = urls.lock().expect("urls");
                            urls[turn % urls.len()].clone()
                        };
                        let client = Client::with_timeout(&url, Duration::from_secs(5)).expect("client");
                        let from = next[partition as usize];
                        match client.replay(&topic, partition, Some(from), None, 500).await {
                            Ok(page) => {
                                let mut read = read.lock().expect("read");
                                for m in &page.messages {
                                    let value = m.value.clone().unwrap_or_default();
                                    if let Some(old) = read.insert((partition, m.offset), value.clone()) {
                                        assert_eq!(
                                            old, value,
                                            "two messages read at {partition}/{}",
                                            m.offset
                                        );
                                    }
                                }
                                // Start over now and then: offsets read before are read again.
                                next[partition as usize] = if page.messages.is_empty() || turn % 7 == 0 {
                                    0
                                } else {
                                    page.next_offset
                                };
                            }
                            // Faults: an agent that is down, paused or deposed. Try another.
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                })
            })
            .collect();
        Readers { stop, read, tasks }
    }

    async fn stop(self) -> BTreeMap<(u32, u64), String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("reader task");
        }
        Arc::try_unwrap(self.read).map_err(|_| ()).expect("sole owner").into_inner().expect("read")
    }
}

fn offset_of(id: &str) -> (u32, u64) {
    let mut parts = id.rsplitn(3, '/');
    let offset = parts.next().and_then(|o| o.parse().ok()).expect("offset in id");
    let partition = parts.next().and_then(|p| p.parse().ok()).expect("partition in id");
    (partition, offset)
}

/// Reads every partition back from offset 0 and checks it against what was acknowledged;
/// returns what it read.
async fn check(
    client: &Client,
    topic: &str,
    acked: &BTreeMap<(u32, u64), String>,
) -> BTreeMap<(u32, u64), String> {
    let mut whole = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let mut log: BTreeMap<u64, String> = BTreeMap::new();
        let mut next = 0;
        loop {
            let deadline = Instant::now() + Duration::from_secs(30);
            let page = loop {
                match client.replay(topic, partition, Some(next), None, 1000).await {
                    Ok(page) => break page,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => {
                        panic!("replay of {topic}/{partition} from {next} through {}: {e}", client.base())
                    }
                }
            };
            if page.messages.is_empty() {
                break;
            }
            for m in page.messages {
                assert!(m.offset >= next, "replay went backwards at {partition}/{}", m.offset);
                next = m.offset + 1;
                assert!(log.insert(m.offset, m.value.unwrap_or_default()).is_none());
            }
        }
        let offsets: Vec<u64> = log.keys().copied().collect();
        assert_eq!(offsets, (0..log.len() as u64).collect::<Vec<_>>(), "partition {partition} has no holes");
        // Every acknowledged message is at the offset it was acknowledged with.
        for ((p, offset), value) in acked.range((partition, 0)..(partition + 1, 0)) {
            assert_eq!(log.get(offset), Some(value), "acknowledged message at {p}/{offset}");
        }
        // Each producer's acknowledged messages keep their order within the partition.
        let mut last_seq: HashMap<String, u64> = HashMap::new();
        for ((_, offset), value) in acked.range((partition, 0)..(partition + 1, 0)) {
            let (producer, seq) = value.split_once('-').expect("producer-seq");
            let seq: u64 = seq.parse().expect("seq");
            if let Some(prev) = last_seq.insert(producer.to_string(), seq) {
                assert!(seq > prev, "{producer}'s message {seq} at offset {offset} comes after {prev}");
            }
        }
        whole.extend(log.into_iter().map(|(offset, value)| ((partition, offset), value)));
    }
    whole
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_loses_nothing_and_its_followers_carry_on_without_it() {
    let mut cluster = Cluster::start().await;
    let client = cluster.agents[0].client();
    client.create_topic("orders", PARTITIONS, &r3()).await.expect("create topic");
    let (writer, followers) = cluster.writer_and_followers("orders", 0).await;
    assert_eq!(followers.len(), 2, "each segment is on three agents");

    let producers = Producers::start(2, "orders", Arc::clone(&cluster.urls));
    wait_for("acknowledged messages", Duration::from_secs(30), || async {
        (producers.acked_count() >= 500).then_some(())
    })
    .await;

    // kill -9 the writer of partition 0 and leave it down: a follower becomes writer, recovers
    // the open segment from the replicas and producing continues.
    let killed = Instant::now();
    let i = cluster.index_of(&writer);
    cluster.agents[i].kill9();
    let took = producers.acked_after(0, killed, &cluster).await;
    eprintln!(
        "partition 0 acknowledged again {} ms after kill -9 of its writer (lease {LEASE})",
        took.as_millis()
    );
    let (new_writer, _) = cluster.writer_and_followers("orders", 0).await;
    assert_ne!(new_writer, writer);
    assert!(followers.contains(&new_writer), "a follower, which holds the open segment, takes over");
    let before = producers.acked_count();
    wait_for("more acknowledged messages", Duration::from_secs(30), || async {
        (producers.acked_count() >= before + 300).then_some(())
    })
    .await;

    // Operators see it: metadata counts under-replicated segments (the ones written while
    // an agent is down hold two replicas), the writers export their followers' lag.
    let s = cluster.state().await.expect("state");
    assert!(!s.under_replicated().is_empty(), "segments on two of three agents are under-replicated");
    let survivor =
        cluster.agents.iter().position(|a| a.url() != cluster.agents[i].url()).expect("a live agent");
    let metrics = cluster.agents[survivor].client().metrics().await.expect("metrics");
    for name in ["silt_agent_replication_lag_records{", "silt_agent_replica_append_seconds_count"] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }

    let acked = producers.stop().await;
    check(&cluster.agents[survivor].client(), "orders", &acked).await;

    // The killed agent comes back and serves all of it too; the writers open segments on all
    // three agents again, and once the segments written meanwhile are archived nothing is
    // under-replicated.
    cluster.agents[i].restart();
    cluster.refresh_urls();
    check(&cluster.agents[i].client(), "orders", &acked).await;
    wait_for("no under-replicated segment", Duration::from_secs(60), || async {
        cluster.state().await?.under_replicated().is_empty().then_some(())
    })
    .await;
}

/// Every process of the cluster killed with kill -9 at once (the three metadata nodes and the
/// three agents) and started again together, each agent on its old address: every partition
/// takes messages again within two leases, and every acknowledged message is still there. Each
/// restarted writer fences and copies from agents that are starting writers of their own at
/// the same moment; none waits for another to finish its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_killed_at_once_takes_messages_on_every_partition_within_two_leases() {
    let mut cluster = Cluster::start().await;
    cluster.agents[0].client().create_topic("orders", PARTITIONS, &r3()).await.expect("create topic");
    let producers = Producers::start(2, "orders", Arc::clone(&cluster.urls));
    wait_for("acknowledged messages", Duration::from_secs(30), || async {
        (producers.acked_count() >= 500).then_some(())
    })
    .await;
    let mut acked = producers.stop().await;

    for id in 1..=3 {
        cluster.metadata.node_mut(id).kill9();
    }
    for agent in &mut cluster.agents {
        agent.kill9();
    }
    let restarted = Instant::now();
    for id in 1..=3 {
        cluster.metadata.node_mut(id).restart();
    }
    SiltDev::restart_together(&mut cluster.agents);
    cluster.refresh_urls();

    // One message to each partition, through each agent in turn, until each is acknowledged.
    let lease = Duration::from_secs(2);
    let urls = cluster.urls.lock().expect("urls").clone();
    let probes: Vec<_> = (0..PARTITIONS)
        .map(|partition| {
            let urls = urls.clone();
            tokio::spawn(async move {
                for attempt in 0usize.. {
                    let client = Client::with_timeout(&urls[attempt % urls.len()], Duration::from_secs(1))
                        .expect("client");
                    let m = OutMessage {
                        partition: Some(partition),
                        value: Some(format!("probe{partition}-0")),
                        ..OutMessage::default()
                    };
                    match client.produce("orders", &[m]).await {
                        Ok(ids) => {
                            return (offset_of(&ids[0]), format!("probe{partition}-0"), restarted.elapsed())
                        }
                        Err(_) if restarted.elapsed() < Duration::from_secs(60) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => {
                            panic!("partition {partition} takes no message 60 s after the restart: {e}")
                        }
                    }
                }
                unreachable!("the attempts never end")
            })
        })
        .collect();
    let mut probed = Vec::new();
    for probe in probes {
        probed.push(probe.await.expect("probe"));
    }
    let took: Vec<u128> = probed.iter().map(|(_, _, took)| took.as_millis()).collect();
    eprintln!(
        "every partition took a message again {took:?} ms after the whole cluster restarted (lease {LEASE})"
    );
    for ((offset, value, took), partition) in probed.into_iter().zip(0..) {
        assert!(
            took <= 2 * lease,
            "partition {partition} took a message only {} ms after the restart, more than two leases; logs:\n{}",
            took.as_millis(),
            cluster.logs()
        );
        acked.insert(offset, value);
    }
    check(&cluster.agents[1].client(), "orders", &acked).await;
}

/// The writer of a partition whose fsync fails and whose file cannot even be cut back to what
/// the last successful fsync covered (the second fsync fails too): it acknowledges nothing of
/// the failed group, opens no log of the partition again, and hands the partition to another
/// agent, which recovers the open segment from the other replicas; no acknowledged message is
/// lost, and producing goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_disk_fails_an_fsync_hands_its_partition_over_and_loses_nothing() {
    let mut cluster = Cluster::start().await;
    cluster.agents[0].client().create_topic("orders", PARTITIONS, &r3()).await.expect("create topic");
    let (writer, _) = cluster.writer_and_followers("orders", 0).await;
    let id = cluster.state().await.expect("state").topics["orders"].id;
    // The writer restarts with a disk whose fsyncs of partition 0's files fail, twice in a row,
    // once it has made 40 of them: well after its start, while it appends.
    let w = cluster.index_of(&writer);
    cluster.agents[w].kill9();
    cluster.agents[w].set_env("SILT_TEST_FSYNC_FAULTS", &format!("/orders~{id}/0/:40:2"));
    cluster.agents[w].restart();
    cluster.refresh_urls();
    let epoch =
        wait_for("the restarted agent writing partition 0 again", Duration::from_secs(30), || async {
            let s = cluster.state().await?;
            let p = &s.topics["orders"].partitions[0];
            (p.writer.as_deref() == Some(writer.as_str()) && p.open_segment().is_some()).then_some(p.epoch)
        })
        .await;

    let producers = Producers::start(2, "orders", Arc::clone(&cluster.urls));
    let s = cluster.writers_moved_from("orders", &writer, &[0]).await;
    assert!(s.topics["orders"].partitions[0].epoch > epoch, "the new writer has a higher epoch");
    // It says why (the hand-off is logged once metadata applied it, which the state may show
    // first).
    for said in
        ["an fsync failed and the segment cannot be cut back", "an fsync of its local log failed here"]
    {
        let agent = &cluster.agents[w];
        wait_for(
            &format!("the agent whose disk failed to say \"{said}\""),
            Duration::from_secs(10),
            || async { agent.log().contains(said).then_some(()) },
        )
        .await;
    }
    let handed_over = Instant::now();
    producers.acked_after(0, handed_over, &cluster).await;
    let acked = producers.stop().await;
    assert!(acked.keys().any(|(p, _)| *p == 0), "partition 0 took messages");
    let other = (w + 1) % cluster.agents.len();
    check(&cluster.agents[other].client(), "orders", &acked).await;
}

/// Faults on a running cluster, each followed by recovery, while producers write and readers
/// replay every partition through any agent: how many rounds run is `SILT_TEST_FAULT_ROUNDS`
/// (default 8: every kind of fault once, the writer killed twice); `SILT_TEST_FAULT` (for
/// example "pause the writer") runs that kind in every round. One kind is two faults at once
/// (the writer and a follower killed together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_rounds_of_kills_pauses_partitions_and_wiped_disks() {
    let mut cluster = Cluster::start().await;
    cluster.agents[0].client().create_topic("events", PARTITIONS, &r3()).await.expect("create topic");
    for p in 0..PARTITIONS as usize {
        cluster.writer_and_followers("events", p).await;
    }
    let producers = Producers::start(3, "events", Arc::clone(&cluster.urls));
    let readers = Readers::start(2, "events", Arc::clone(&cluster.urls));
    let rounds: usize =
        std::env::var("SILT_TEST_FAULT_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(8).max(1);
    let mut recoveries: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for round in 0..rounds {
        let partition = (round % PARTITIONS as usize) as u32;
        let (writer, followers) = cluster.writer_and_followers("events", partition as usize).await;
        let w = cluster.index_of(&writer);
        let before = producers.acked_count();
        wait_for("acknowledgements before the fault", Duration::from_secs(60), || async {
            (producers.acked_count() >= before + 200).then_some(())
        })
        .await;
        const FAULTS: [&str; 7] = [
            "kill the writer",
            "kill a follower",
            "pause the writer",
            "wipe the writer",
            "isolate the writer",
            "cut the writer from the agents",
            "kill the writer and a follower",
        ];
        // `SILT_TEST_FAULT` runs one kind only, in every round.
        let only = std::env::var("SILT_TEST_FAULT").ok();
        let faults: Vec<&str> =
            FAULTS.iter().copied().filter(|f| only.as_deref().is_none_or(|o| o == *f)).collect();
        assert!(!faults.is_empty(), "SILT_TEST_FAULT names none of {FAULTS:?}");
        let fault = faults[round % faults.len()];
        let at = Instant::now();
        match fault {
            "kill the writer" => {
                cluster.agents[w].kill9();
                recoveries
                    .entry(fault)
                    .or_default()
                    .push(producers.acked_after(partition, at, &cluster).await);
                cluster.agents[w].restart();
                cluster.refresh_urls();
            }
            "kill the writer and a follower" => {
                // Two of three replicas gone at once: the partition cannot reach W until one
                // is back; both come back, and nothing acknowledged is lost.
                let f = cluster.index_of(&followers[0]);
                cluster.agents[w].kill9();
                cluster.agents[f].kill9();
                cluster.agents[f].restart();
                cluster.agents[w].restart();
                cluster.refresh_urls();
                recoveries
                    .entry(fault)
                    .or_default()
                    .push(producers.acked_after(partition, at, &cluster).await);
            }
            "kill a follower" => {
                let f = cluster.index_of(&followers[0]);
                cluster.agents[f].kill9();
                recoveries
                    .entry(fault)
                    .or_default()
                    .push(producers.acked_after(partition, at, &cluster).await);
                cluster.agents[f].restart();
                cluster.refresh_urls();
            }
            "isolate the writer" => {
                // Cut off from the other agents and metadata: its lease lapses, another agent
                // fences the replicas and takes over; the isolated one can no longer reach W.
                cluster.isolate(w);
                // Clients still reach it, and until the new writer fences its followers it may
                // still be acknowledged: recovery is an acknowledgement after the takeover.
                cluster.writers_moved_from("events", &writer, &[partition]).await;
                let moved = Instant::now();
                let took = producers.acked_after(partition, moved, &cluster).await + (moved - at);
                recoveries.entry(fault).or_default().push(took);
                cluster.heal(w);
            }
            "cut the writer from the agents" => {
                // It still reaches metadata, so its lease holds: it hands its partitions over.
                cluster.cut_from_agents(w);
                cluster.writers_moved_from("events", &writer, &[partition]).await;
                let moved = Instant::now();
                let took = producers.acked_after(partition, moved, &cluster).await + (moved - at);
                recoveries.entry(fault).or_default().push(took);
                cluster.heal_from_agents(w);
            }
            "pause the writer" => {
                // Past its lease: another agent takes over; the paused one wakes up deposed.
                cluster.agents[w].pause();
                recoveries
                    .entry(fault)
                    .or_default()
                    .push(producers.acked_after(partition, at, &cluster).await);
                tokio::time::sleep(Duration::from_secs(1)).await;
                cluster.agents[w].resume();
            }
            _ => {
                cluster.agents[w].kill9();
                cluster.agents[w].wipe_data_dir();
                cluster.agents[w].restart();
                // Clients and the proxy in front of it go to its new port at once.
                cluster.refresh_urls();
                recoveries
                    .entry(fault)
                    .or_default()
                    .push(producers.acked_after(partition, at, &cluster).await);
            }
        }
        cluster.refresh_urls();
        // Everyone is back: wait until the cluster writes all partitions again, each to a
        // segment on all three agents (one fault at a time).
        let since = Instant::now();
        for p in 0..PARTITIONS {
            producers.acked_after(p, since, &cluster).await;
        }
        wait_for("every open segment on three live agents", Duration::from_secs(60), || async {
            let s = cluster.state().await?;
            let healthy = s.topics["events"].partitions.iter().all(|p| {
                p.open_segment().is_some_and(|open| {
                    open.ensemble.len() == 3
                        && open.ensemble.iter().zip(&open.instances).all(|(a, i)| {
                            s.agents
                                .get(a)
                                .is_some_and(|info| info.is_live(s.clock_ms) && info.instance == *i)
                        })
                })
            });
            healthy.then_some(())
        })
        .await;
        eprintln!("round {round}: {fault} on partition {partition}, recovered");
        if std::env::var("SILT_TEST_DEBUG").is_ok() {
            eprintln!("{}", cluster.logs());
        }
    }
    let acked = producers.stop().await;
    let read = readers.stop().await;
    eprintln!(
        "{rounds} fault rounds, {} messages acknowledged, {} read during them",
        acked.len(),
        read.len()
    );
    for (fault, mut times) in recoveries {
        times.sort();
        eprintln!(
            "{fault}: {} rounds, first acknowledgement after the fault p50 {} ms, p99 {} ms",
            times.len(),
            percentile(&times, 0.5).as_millis(),
            percentile(&times, 0.99).as_millis()
        );
    }
    for agent in &cluster.agents {
        let log = check(&agent.client(), "events", &acked).await;
        // What was read during the faults is in the log, at the offset it was read at.
        for ((partition, offset), value) in &read {
            assert_eq!(
                log.get(&(*partition, *offset)),
                Some(value),
                "read at {partition}/{offset} during the faults"
            );
        }
        assert!(read.len() > acked.len() / 10, "the readers read {} of {} messages", read.len(), acked.len());
    }
}

/// An agent that reaches metadata but none of the other agents keeps its lease, so nobody would
/// take its partitions over; it cannot reach the replicas it needs either. Its writers hand
/// their partitions to other agents, and producers carry on through those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cut_off_from_the_other_agents_but_not_from_metadata_hands_its_partitions_over() {
    cut_off_writer_hands_its_partitions_over(&Cluster::start().await, r3()).await;
}

/// The same with two replicas (W = 2) and a lease as long as agents remember a peer that did
/// not answer: the cut-off writer's recovery needs no other agent to answer, but the other
/// member holds less than W copies of the tail without it, so each recovery (the cut-off
/// writer's, then the next writer's, which cannot reach it either) waits for the silent member
/// up to `--replica-repair-after` (5 s here) from the first that waited, then seals on the
/// member that answered. The writer hands its partitions over all the same, and what was
/// sealed stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_writer_whose_recovery_needs_no_other_agent_hands_over_too() {
    let config = BTreeMap::from([
        ("replication.factor".to_string(), "2".to_string()),
        ("segment.bytes".to_string(), "65536".to_string()),
    ]);
    let cluster = Cluster::start_with_lease(3, &["--replica-repair-after", "5s"], "10s").await;
    cut_off_writer_hands_its_partitions_over(&cluster, config).await;
}

async fn cut_off_writer_hands_its_partitions_over(cluster: &Cluster, config: BTreeMap<String, String>) {
    let replicas: usize = config["replication.factor"].parse().expect("replication.factor");
    cluster.agents[0].client().create_topic("events", PARTITIONS, &config).await.expect("create topic");
    for p in 0..PARTITIONS as usize {
        cluster.writer_and_followers("events", p).await;
    }
    let (writer, _) = cluster.writer_and_followers("events", 0).await;
    let w = cluster.index_of(&writer);
    let producers = Producers::start(3, "events", Arc::clone(&cluster.urls));
    wait_for("acknowledged messages", Duration::from_secs(30), || async {
        (producers.acked_count() >= 300).then_some(())
    })
    .await;

    cluster.cut_from_agents(w);
    let cut = Instant::now();
    let all: Vec<u32> = (0..PARTITIONS).collect();
    let s = cluster.writers_moved_from("events", &writer, &all).await;
    let moved = Instant::now();
    // The lease held all along: the partitions moved because their writer handed them over,
    // not because metadata gave up on it.
    assert!(s.agents[&writer].is_live(s.clock_ms), "{writer}'s lease lapsed; agents: {:?}", s.agents);
    for p in 0..PARTITIONS {
        producers.acked_after(p, moved, cluster).await;
    }
    eprintln!("{writer}'s partitions moved {} ms after it was cut off", (moved - cut).as_millis());
    // Operators see why in its metrics (clients still reach it).
    let metrics = cluster.agents[w].client().metrics().await.expect("metrics");
    let handoffs = metrics
        .lines()
        .find_map(|l| l.strip_prefix("silt_agent_writer_handoffs_total ")?.parse::<u64>().ok());
    assert!(handoffs.is_some_and(|n| n >= 1), "no hand-off counted: {handoffs:?}");
    cluster.heal_from_agents(w);
    let since = Instant::now();
    for p in 0..PARTITIONS {
        producers.acked_after(p, since, cluster).await;
    }
    // The agents left it out of their ensembles while it did not answer; once it does again,
    // new segments have all their replicas.
    wait_for("every open segment on all its replicas after healing", Duration::from_secs(60), || async {
        let s = cluster.state().await?;
        s.topics["events"]
            .partitions
            .iter()
            .all(|p| p.open_segment().is_some_and(|open| open.ensemble.len() == replicas))
            .then_some(())
    })
    .await;
    let acked = producers.stop().await;
    for agent in &cluster.agents {
        check(&agent.client(), "events", &acked).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_an_agent_gone_too_long_are_copied_to_another_agent() {
    // No archiving: sealed segments stay on the agents' disks, the only copies there are.
    let mut cluster = Cluster::start_with(4, &["--no-compactor", "--replica-repair-after", "1s"]).await;
    let client = cluster.agents[0].client();
    let config = BTreeMap::from([
        ("replication.factor".to_string(), "3".to_string()),
        ("segment.ms".to_string(), "200".to_string()),
    ]);
    client.create_topic("logs", 1, &config).await.expect("create topic");
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    for round in 0..3 {
        let batch: Vec<OutMessage> = (0..50)
            .map(|i| OutMessage {
                key: Some("k".into()),
                value: Some(format!("r{round}-{i}")),
                ..OutMessage::default()
            })
            .collect();
        let ids = client.produce("logs", &batch).await.expect("produce");
        for (id, m) in ids.iter().zip(&batch) {
            acked.insert(offset_of(id).1, m.value.clone().expect("value"));
        }
        let last = *acked.keys().last().expect("acked");
        wait_for("the round's segment sealed", Duration::from_secs(20), || async {
            let s = cluster.state().await?;
            s.topics["logs"].partitions[0]
                .segments
                .values()
                .any(|seg| seg.last_offset == Some(last))
                .then_some(())
        })
        .await;
    }
    // A follower of the sealed segments goes away for good.
    let s = cluster.state().await.expect("state");
    let part = &s.topics["logs"].partitions[0];
    let writer = part.writer.clone().expect("writer");
    let sealed: Vec<u64> =
        part.segments.values().filter(|seg| seg.last_offset.is_some()).map(|seg| seg.base_offset).collect();
    let gone = part.segments[&sealed[0]].ensemble.iter().find(|a| **a != writer).expect("a follower").clone();
    let g = cluster.index_of(&gone);
    cluster.agents[g].kill9();

    // Within the lease and the repair delay, every sealed segment it held is on three live
    // agents again, and nothing is under-replicated.
    let repaired = cluster
        .repaired(|s, part| {
            sealed.iter().all(|b| !part.segments[b].ensemble.contains(&gone))
                && s.under_replicated().is_empty()
        })
        .await;
    // The new holders serve the copies: every acknowledged record, straight from their disks.
    cluster.holders_serve_whole(&repaired, &sealed, &acked).await;
}

/// A follower cut off from the writer midway leaves the open segment's ensemble, and the writer
/// seals that segment with the two members that hold it whole. Once the follower answers
/// again, the sealed segment gets a third replica back: the follower itself, whose copy of the
/// segment's beginning is replaced by a whole one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_sealed_after_a_follower_left_midway_gets_its_missing_replica_back() {
    // No archiving: sealed segments stay on the agents' disks, the only copies there are.
    let cluster = Cluster::start_with(3, &["--no-compactor", "--replica-repair-after", "1s"]).await;
    let config = BTreeMap::from([("replication.factor".to_string(), "3".to_string())]);
    cluster.agents[0].client().create_topic("logs", 1, &config).await.expect("create topic");
    let (writer, followers) = cluster.writer_and_followers("logs", 0).await;
    assert_eq!(followers.len(), 2);
    let client = cluster.agents[cluster.index_of(&writer)].client();
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    let mut round = 0;
    let mut produce = async |acked: &mut BTreeMap<u64, String>| {
        let batch: Vec<OutMessage> = (0..20)
            .map(|i| OutMessage { value: Some(format!("r{round}-{i}")), ..OutMessage::default() })
            .collect();
        round += 1;
        let ids = client.produce("logs", &batch).await.expect("produce");
        for (id, m) in ids.iter().zip(&batch) {
            acked.insert(offset_of(id).1, m.value.clone().expect("value"));
        }
    };
    produce(&mut acked).await;
    let s = cluster.state().await.expect("state");
    let segment = s.topics["logs"].partitions[0].open_segment().expect("open segment").base_offset;
    let left = followers[0].clone();
    let l = cluster.index_of(&left);
    cluster.cut_from_agents(l);
    // Writes go on at W = 2; the segment is sealed without the follower that left.
    let deadline = Instant::now() + Duration::from_secs(60);
    let short = loop {
        produce(&mut acked).await;
        let s = cluster.state().await.expect("state");
        let seg = &s.topics["logs"].partitions[0].segments[&segment];
        if seg.last_offset.is_some() {
            assert!(!seg.ensemble.contains(&left), "{left} left midway, yet holds it whole: {seg:?}");
            break seg.clone();
        }
        assert!(Instant::now() < deadline, "segment {segment} not sealed 60 s after the cut: {seg:?}");
    };
    assert_eq!(short.ensemble.len(), 2, "{short:?}");
    let s = cluster.state().await.expect("state");
    assert!(
        s.under_replicated().iter().any(|u| u.base_offset == segment && !u.open && u.replicas == 2),
        "reported under-replicated: {:?}",
        s.under_replicated()
    );
    // What the follower kept: the segment's beginning.
    let name = format!("{segment:020}.log");
    let kept = || -> Vec<u64> {
        segment_files_holding_records(cluster.agents[l].data_dir())
            .into_iter()
            .filter(|(path, _)| path.ends_with(&name))
            .map(|(_, len)| len)
            .collect()
    };
    let before = kept();
    assert!(
        matches!(before[..], [len] if len < short.size_bytes),
        "{left} holds the beginning of segment {segment} ({} bytes): {before:?}",
        short.size_bytes
    );
    cluster.heal_from_agents(l);

    // Every sealed segment gets its third replica back.
    let repaired = cluster
        .repaired(|_, part| {
            part.segments.values().filter(|seg| seg.last_offset.is_some()).all(|seg| seg.ensemble.len() == 3)
        })
        .await;
    assert!(repaired.segments[&segment].ensemble.contains(&left), "{:?}", repaired.segments[&segment]);
    // The repairer (the segment's first member, the writer) counts what it added.
    wait_for("the repair counted", Duration::from_secs(20), || async {
        let metrics = client.metrics().await.ok()?;
        let added = metrics.lines().find_map(|l| {
            l.strip_prefix("silt_agent_ensemble_repairs_total{outcome=\"added\"} ")?.parse::<u64>().ok()
        });
        added.is_some_and(|n| n >= 1).then_some(())
    })
    .await;
    // Each holder serves each sealed segment whole: every acknowledged record, from its disk.
    let sealed: Vec<u64> = repaired
        .segments
        .values()
        .filter(|seg| seg.last_offset.is_some())
        .map(|seg| seg.base_offset)
        .collect();
    cluster.holders_serve_whole(&repaired, &sealed, &acked).await;
    assert_eq!(kept(), [short.size_bytes], "{left}'s copy of segment {segment} is whole now");
}

/// A recovering writer raises the fence of a replica that holds nothing yet, and the agent's
/// housekeeping (which drops the local copies of archived data) runs round after round: the
/// fence holds, the deposed writer's appends never land on that replica, and the first one it
/// refuses ends that writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_on_a_replica_that_holds_nothing_yet_outlives_housekeeping() {
    let cluster = Cluster::start().await;
    let client = cluster.agents[0].client();
    client.create_topic("fenced", 1, &r3()).await.expect("create topic");
    let (_, followers) = cluster.writer_and_followers("fenced", 0).await;
    let s = cluster.state().await.expect("state");
    let topic = &s.topics["fenced"];
    let part = &topic.partitions[0];
    let open = part.open_segment().expect("open segment");
    let fenced = &cluster.agents[cluster.index_of(&followers[0])];
    let url = format!(
        "{}/internal/v1/replicas/fenced/0/fence?topic_id={}&epoch={}&segment={}&segment_epoch={}",
        fenced.url(),
        topic.id,
        part.epoch + 1,
        open.base_offset,
        open.epoch
    );
    let reply = reqwest::Client::new().post(&url).send().await.expect("fence");
    assert!(reply.status().is_success(), "{url}: {}", reply.text().await.unwrap_or_default());

    let rounds = || async {
        let metrics = fenced.client().metrics().await.ok()?;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("silt_agent_housekeeping_rounds_total ")?.parse::<u64>().ok())
    };
    let before = rounds().await.expect("housekeeping rounds in /metrics");
    wait_for("two more rounds of housekeeping", Duration::from_secs(20), || async {
        (rounds().await? >= before + 2).then_some(())
    })
    .await;

    // The writer (epoch part.epoch) appends. The fenced replica refuses, which tells the writer
    // a newer one may hold the partition: it ends, and the partition is taken at a newer epoch
    // (here by the same agent, no other writer being there). A replica that took the append
    // (its fence lost) would keep the writer going at its epoch.
    let m = OutMessage { value: Some("m0".into()), ..OutMessage::default() };
    // Acknowledged by the writer and its other follower, or refused as the writer ends.
    let produced = client.produce("fenced", &[m]).await;
    wait_for("the partition taken at a newer epoch", Duration::from_secs(20), || async {
        let s = cluster.state().await?;
        (s.topics["fenced"].partitions[0].epoch > part.epoch).then_some(())
    })
    .await;
    // Whatever the fenced agent holds is the message, copied there by the next writer's
    // recovery once it was acknowledged.
    let held = silt_tests::held_records_if_any(fenced.url(), "fenced", 0, 0, 100).await;
    for r in held.iter().flat_map(|page| &page.records) {
        assert_eq!(r.value.as_deref(), Some(&b"m0"[..]), "{held:?} (the produce answered {produced:?})");
    }
}

/// Segment files (`*.log`) under `dir` that hold something, every agent's data directory
/// included (metadata's Raft log is not one), with the bytes of record batches in each (an
/// open segment's file also holds zero-filled space after them).
fn segment_files_holding_records(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n == "metadata") {
            continue;
        }
        if path.is_dir() {
            out.extend(segment_files_holding_records(&path));
        } else if path.extension().is_some_and(|e| e == "log") {
            let len = std::fs::read(&path).map_or(0, |bytes| batches_end(&bytes));
            if len > 0 {
                out.push((path.display().to_string(), len));
            }
        }
    }
    out
}

/// Where the record batches at the start of a segment file end: at the first batch header
/// whose length is zero (zero-filled space) or at the end of the file.
fn batches_end(file: &[u8]) -> u64 {
    let mut at = 0usize;
    while let Some(len) = file.get(at + 8..at + 12) {
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len == 0 {
            break;
        }
        at = (at + 12 + len).min(file.len());
    }
    at as u64
}

/// Once a segment is archived, the writer and its followers drop their copies, the last
/// segment a follower held included; the messages are read back from the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_and_followers_drop_their_copies_of_archived_segments() {
    let dev = SiltDev::start_with(silt_tests::DevOptions {
        args: vec!["--agents".into(), "3".into()],
        ..Default::default()
    });
    let client = dev.client();
    let config = BTreeMap::from([
        ("replication.factor".to_string(), "3".to_string()),
        ("segment.ms".to_string(), "300".to_string()),
        ("local.retention.ms".to_string(), "0".to_string()),
    ]);
    client.create_topic("tiered", 2, &config).await.expect("create topic");
    let mut expected: Vec<(u32, u64, String)> = Vec::new();
    for round in 0..3 {
        let batch: Vec<OutMessage> = (0..40)
            .map(|i| OutMessage {
                partition: Some(i % 2),
                value: Some(format!("r{round}-{i}")),
                ..OutMessage::default()
            })
            .collect();
        let ids = client.produce("tiered", &batch).await.expect("produce");
        for (id, m) in ids.iter().zip(&batch) {
            let (p, o) = offset_of(id);
            expected.push((p, o, m.value.clone().expect("value")));
        }
    }
    wait_for("every message archived", Duration::from_secs(60), || async {
        let objects = client.archive_list("tiered").await.ok()?;
        let archived: u64 = objects.iter().filter_map(|o| o["records"].as_u64()).sum();
        (archived == expected.len() as u64).then_some(())
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = segment_files_holding_records(dev.data_dir());
        if held.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "copies of archived segments still on disk after 60 s: {held:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut replayed = Vec::new();
    for p in 0..2 {
        let page = client.replay("tiered", p, Some(0), None, 1000).await.expect("replay");
        replayed.extend(page.messages.into_iter().map(|m| (p, m.offset, m.value.unwrap_or_default())));
    }
    expected.sort();
    replayed.sort();
    assert_eq!(replayed, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silt_dev_with_three_agents_keeps_each_segment_on_three_disks() {
    let dev = SiltDev::start_with(silt_tests::DevOptions {
        args: vec!["--agents".into(), "3".into()],
        ..Default::default()
    });
    let client = dev.client();
    let topic = client.create_topic("demo", 2, &BTreeMap::new()).await.expect("create topic");
    assert_eq!(topic["config"]["replication.factor"], "3", "three agents: three replicas by default");
    assert_eq!(topic["config"]["min.insync.replicas"], "2");
    // `silt dev` says it listens once all its agents are registered: the first segment of each
    // partition has three members, and no other segment is ever opened.
    // Two requests: a follower learns that the first one's records are committed with the
    // second, and serves them from its replica.
    let mut ids = Vec::new();
    for half in [0..50, 50..100] {
        let batch: Vec<OutMessage> = half
            .map(|i| OutMessage {
                partition: Some(i % 2),
                value: Some(format!("m{i}")),
                ..OutMessage::default()
            })
            .collect();
        ids.extend(client.produce("demo", &batch).await.expect("produce"));
    }
    assert_eq!(ids.len(), 100);
    let described = client.describe_topic("demo").await.expect("describe");
    for p in described["partitions"].as_array().expect("partitions") {
        let segments = p["segments"].as_array().expect("segments");
        let [open] = segments.as_slice() else { panic!("one segment for each partition: {p}") };
        assert_eq!(open["state"], "open", "{p}");
        let mut ensemble: Vec<&str> =
            open["ensemble"].as_array().expect("ensemble").iter().filter_map(|a| a.as_str()).collect();
        ensemble.sort();
        assert_eq!(ensemble, ["dev", "dev-2", "dev-3"], "{p}");
    }
    // A follower serves the open segment's committed records, the same as acknowledged.
    // Each agent prints where it listens: "silt dev agent dev-2 listening on http://...".
    let url_of = |agent: &str| {
        let prefix = if agent == "dev" {
            "silt dev listening on ".to_string()
        } else {
            format!("silt dev agent {agent} listening on ")
        };
        dev.printed()
            .iter()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|r| r.split_whitespace().next()).map(String::from))
    };
    // "silt dev" is the last line of the three.
    for agent in ["dev", "dev-2", "dev-3"] {
        assert!(url_of(agent).is_some(), "{agent} said where it listens: {:?}", dev.printed());
    }
    for part in described["partitions"].as_array().expect("partitions") {
        let writer = part["writer"].as_str().expect("writer");
        let p = part["partition"].as_u64().expect("partition") as usize;
        let segments = part["segments"].as_array().expect("segments");
        let open = segments.iter().find(|s| s["state"] == "open").expect("open segment");
        let ensemble = open["ensemble"].as_array().expect("ensemble");
        for follower in ensemble.iter().filter_map(|a| a.as_str()).filter(|a| *a != writer) {
            let base = url_of(follower).expect("url");
            let page = silt_tests::held_records(&base, "demo", p as u32, 0, 1000).await;
            let records = &page.records;
            assert!(
                records.len() >= 25 && records.len() <= 50,
                "{follower} serves what is committed: {page:?}"
            );
            for (i, r) in records.iter().enumerate() {
                let value = String::from_utf8(r.value.clone().expect("value").to_vec()).expect("utf8");
                assert_eq!(r.offset, i as u64);
                assert_eq!(value, format!("m{}", 2 * i + p), "{follower}");
            }
        }
    }
    // Every agent of the process serves it.
    let mut values = Vec::new();
    for p in 0..2 {
        let page = client.replay("demo", p, Some(0), None, 1000).await.expect("replay");
        values.extend(page.messages.into_iter().map(|m| m.value.unwrap_or_default()));
    }
    values.sort();
    let mut expected: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(values, expected);
}
