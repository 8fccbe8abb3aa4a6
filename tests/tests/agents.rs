//! End-to-end tests of agents against a metadata cluster: three real `silt metadata`
//! processes and `silt agent` processes on loopback, killed (SIGKILL) and restarted while
//! clients produce and consume through the agents.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use silt::client::{Client, OutMessage, Poll};
use silt::silt_metadata::MetadataState;
use silt_tests::{silt_metadata_cli, wait_for, AgentOptions, MetadataCluster, SiltDev};

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

fn objects_url(dir: &std::path::Path) -> String {
    let objects = dir.join("objects");
    std::fs::create_dir_all(&objects).expect("objects dir");
    format!("file://{}", objects.display())
}

fn agent(id: &str, cluster: &MetadataCluster, objects: &str, lease: &str) -> SiltDev {
    agent_with(id, cluster, objects, lease, &[])
}

/// An agent whose topics keep one replica per segment (these tests are about leases, writers
/// and handover; `replication.rs` tests replicated segments).
fn agent_with(id: &str, cluster: &MetadataCluster, objects: &str, lease: &str, extra: &[&str]) -> SiltDev {
    SiltDev::start_agent(&AgentOptions {
        id: id.into(),
        metadata: cluster.addrs(),
        object_store: objects.into(),
        lease: lease.into(),
        extra: ["--default-replication-factor", "1"].iter().chain(extra).map(|a| a.to_string()).collect(),
    })
}

/// Three metadata nodes with a leader, and a bucket folder for the agents to share.
async fn cluster_and_bucket() -> (MetadataCluster, tempfile::TempDir, String) {
    let cluster = MetadataCluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let objects = objects_url(tmp.path());
    (cluster, tmp, objects)
}

async fn state(cluster: &MetadataCluster) -> Option<MetadataState> {
    cluster.client().read_state().await.ok().map(|r| r.state)
}

fn writer_of(s: &MetadataState, topic: &str, partition: usize) -> (Option<String>, u64) {
    let p = &s.topics[topic].partitions[partition];
    (p.writer.clone(), p.epoch)
}

fn messages(partition: Option<u32>, tag: &str, n: usize) -> Vec<OutMessage> {
    (0..n)
        .map(|i| OutMessage {
            partition,
            key: Some(format!("key-{}", i % 7)),
            value: Some(format!("{tag}-{i}")),
            ..OutMessage::default()
        })
        .collect()
}

/// Every record of a partition from offset 0, as (offset, value).
async fn read_all(client: &Client, topic: &str, partition: u32) -> Vec<(u64, String)> {
    match try_read_all(client, topic, partition).await {
        Ok(records) => records,
        Err(e) => panic!("replay: {e}"),
    }
}

async fn try_read_all(
    client: &Client,
    topic: &str,
    partition: u32,
) -> Result<Vec<(u64, String)>, silt::client::ClientError> {
    let mut out = Vec::new();
    let mut next = 0;
    loop {
        let page = client.replay(topic, partition, Some(next), None, 1000).await?;
        if page.messages.is_empty() {
            return Ok(out);
        }
        for m in page.messages {
            next = m.offset + 1;
            out.push((m.offset, m.value.unwrap_or_default()));
        }
    }
}

fn offset_of(id: &str) -> (u32, u64) {
    let mut parts = id.rsplitn(3, '/');
    let offset = parts.next().and_then(|o| o.parse().ok()).expect("offset in id");
    let partition = parts.next().and_then(|p| p.parse().ok()).expect("partition in id");
    (partition, offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_keep_every_acknowledged_message_and_ack_while_metadata_leaders_are_killed() {
    let mut cluster = MetadataCluster::start(3, &[]);
    let first_leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let objects = objects_url(tmp.path());
    let a1 = agent("a1", &cluster, &objects, "5s");
    let client = a1.client();
    client.create_topic("orders", 2, &BTreeMap::new()).await.expect("create topic");

    // Produce while the metadata leader is killed halfway; a request that fails is retried.
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
    for round in 0..40 {
        if round == 15 {
            cluster.node_mut(first_leader).kill9();
        }
        let batch = messages(None, &format!("r{round}"), 25);
        let deadline = Instant::now() + Duration::from_secs(30);
        let ids = loop {
            match client.produce("orders", &batch).await {
                Ok(ids) => break ids,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("produce round {round} failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("produce round {round} kept failing: {e}\n{}", a1.log()),
            }
        };
        for (id, m) in ids.into_iter().zip(&batch) {
            acked.insert(id, m.value.clone().unwrap_or_default());
        }
    }
    let others: Vec<u64> = (1..=3).filter(|id| *id != first_leader).collect();
    cluster.wait_for_leader(&others, LEADER_TIMEOUT).await;
    // Metadata changes go through the new leader.
    wait_for("a topic created after the failover", Duration::from_secs(30), || async {
        client.create_topic("after-failover", 1, &BTreeMap::new()).await.ok()
    })
    .await;

    // Every acknowledged message is at its offset with its value; offsets are dense.
    for p in 0..2 {
        let records = read_all(&client, "orders", p).await;
        let offsets: Vec<u64> = records.iter().map(|r| r.0).collect();
        assert_eq!(offsets, (0..records.len() as u64).collect::<Vec<_>>(), "dense offsets in partition {p}");
        for (id, value) in acked.iter().filter(|(id, _)| offset_of(id).0 == p) {
            let (_, offset) = offset_of(id);
            assert_eq!(records[offset as usize].1, *value, "message {id}");
        }
    }
    assert_eq!(acked.len(), 1000);

    // A group consumes everything and acks it; once the acks are checkpointed in metadata, the
    // loss of the next leader redelivers nothing.
    let poll = Poll {
        group: "billing".into(),
        member: "m1".into(),
        mode: "exclusive".into(),
        max: 1000,
        max_bytes: None,
        timeout_ms: 1000,
        session_timeout_ms: 30_000,
    };
    let mut consumed = 0;
    while consumed < acked.len() {
        let got = client.poll("orders", &poll).await.expect("poll");
        assert!(!got.is_empty(), "poll returned nothing after {consumed} of {}", acked.len());
        for m in &got {
            assert_eq!(acked.get(&m.id), Some(m.value.as_ref().expect("value")), "message {}", m.id);
        }
        consumed += got.len();
        let ids: Vec<String> = got.into_iter().map(|m| m.id).collect();
        client.ack("billing", &ids).await.expect("ack");
    }
    assert_eq!(consumed, acked.len());
    wait_for("acks checkpointed in metadata", Duration::from_secs(20), || async {
        let s = state(&cluster).await?;
        let acks = &s.groups.get("billing")?.topics.get("orders")?.acks;
        let floors: u64 = (0..2).map(|p| acks.get(&p).map_or(0, |c| c.floor)).sum();
        (floors == acked.len() as u64).then_some(())
    })
    .await;
    cluster.node_mut(first_leader).restart();
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    wait_for("the restarted node caught up", Duration::from_secs(30), || async {
        let s = cluster.node(first_leader).status().await?;
        (s.last_applied.is_some() && s.last_applied >= cluster.node(leader).status().await?.last_applied)
            .then_some(())
    })
    .await;
    cluster.node_mut(leader).kill9();
    let again = Poll { timeout_ms: 500, ..poll.clone() };
    let redelivered = client.poll("orders", &again).await.expect("poll after the second failover");
    assert!(redelivered.is_empty(), "acknowledged messages came back: {:?}", redelivered.first());
    let ids = client.produce("orders", &messages(Some(1), "late", 1)).await.expect("produce after failover");
    let got = client.poll("orders", &Poll { timeout_ms: 5000, ..poll }).await.expect("poll new");
    assert_eq!(got.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), ids);

    // The operator sees the agent, its lease and the writers.
    let status: serde_json::Value =
        serde_json::from_str(&silt_metadata_cli(&cluster.addrs().join(","), &["cluster", "status"]))
            .expect("status json");
    let agents = status["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{status}");
    assert_eq!(agents[0]["id"], "a1");
    assert_eq!(agents[0]["live"], true);
    assert_eq!(agents[0]["partitions"], 3, "{status}");
    let partitions = status["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), 3);
    assert!(partitions.iter().all(|p| p["writer"] == "a1" && p["epoch"].as_u64() >= Some(1)), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_agents_partitions_get_a_new_writer_with_a_higher_epoch() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let mut a1 = agent("a1", &cluster, &objects, "2s");
    let a2 = agent("a2", &cluster, &objects, "2s");
    a1.client().create_topic("t", 2, &BTreeMap::new()).await.expect("create topic");
    let s = state(&cluster).await.expect("state");
    assert_eq!(writer_of(&s, "t", 0).0.as_deref(), Some("a1"), "partitions are spread");
    assert_eq!(writer_of(&s, "t", 1).0.as_deref(), Some("a2"), "partitions are spread");
    let epoch0 = writer_of(&s, "t", 0).1;

    // Each agent writes its own partition, and passes what belongs to the other one on.
    let before0 = a1.client().produce("t", &messages(Some(0), "before", 50)).await.expect("produce p0");
    let mut before1 = a2.client().produce("t", &messages(Some(1), "before", 25)).await.expect("produce p1");
    before1
        .extend(a1.client().produce("t", &messages(Some(1), "before", 25)).await.expect("produce p1 via a1"));
    assert_eq!(before1.iter().map(|id| offset_of(id).1).collect::<Vec<_>>(), (0..50).collect::<Vec<u64>>());

    // kill -9 the writer of partition 0: within its lease, a2 is writer with a higher epoch.
    a1.kill9();
    let killed = Instant::now();
    let epoch1 = wait_for("a2 writes partition 0", Duration::from_secs(15), || async {
        let s = state(&cluster).await?;
        let (writer, epoch) = writer_of(&s, "t", 0);
        (writer.as_deref() == Some("a2")).then_some(epoch)
    })
    .await;
    let takeover = killed.elapsed();
    eprintln!("writer of t/0 moved to a2 {} ms after kill -9 of a1 (lease 2 s)", takeover.as_millis());
    assert!(epoch1 > epoch0);
    // The open segment of partition 0 lives only on a1's disk (one replica): a2 refuses to
    // write rather than drop it, and says why.
    // (Until a2's copy of metadata shows it as writer, a2 passes the request to a1, which is
    // down: an error too, but another one.)
    let c2 = a2.client();
    wait_for("a2 to say why it cannot write p0", Duration::from_secs(10), || async {
        let e = c2.produce("t", &messages(Some(0), "x", 1)).await.expect_err("p0 cannot be recovered yet");
        e.to_string().contains("held by agent(s) a1").then_some(())
    })
    .await;
    // Partition 1 is unaffected.
    a2.client().produce("t", &messages(Some(1), "during", 10)).await.expect("produce p1 while a1 is down");

    // a1 comes back with its data: it gets partition 0 back under a newer epoch, and producing
    // to it continues after every acknowledged message.
    a1.restart();
    let epoch2 = wait_for("a1 writes partition 0 again", Duration::from_secs(15), || async {
        let s = state(&cluster).await?;
        let (writer, epoch) = writer_of(&s, "t", 0);
        (writer.as_deref() == Some("a1") && epoch > epoch1).then_some(epoch)
    })
    .await;
    assert!(epoch2 > epoch1);
    let client = a1.client();
    let after = wait_for("produce to partition 0 after a1's restart", Duration::from_secs(15), || async {
        client.produce("t", &messages(Some(0), "after", 20)).await.ok()
    })
    .await;
    let records = read_all(&client, "t", 0).await;
    let values: Vec<String> = records.iter().map(|r| r.1.clone()).collect();
    let expected: Vec<String> =
        (0..50).map(|i| format!("before-{i}")).chain((0..20).map(|i| format!("after-{i}"))).collect();
    assert_eq!(values, expected);
    assert_eq!(records.iter().map(|r| r.0).collect::<Vec<_>>(), (0..70).collect::<Vec<u64>>());
    assert_eq!(before0.last().map(|id| offset_of(id).1), Some(49));
    assert_eq!(after.first().map(|id| offset_of(id).1), Some(50));
    let p1 = read_all(&a2.client(), "t", 1).await;
    assert_eq!(p1.len(), 60);

    // More rounds, to measure how long a takeover takes: kill -9 the writer, wait until the
    // other agent is named writer, restart, wait until it is back.
    let rounds: usize =
        std::env::var("SILT_TEST_TAKEOVER_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let mut takeovers = vec![takeover];
    let mut epoch = epoch2;
    for _ in 1..rounds {
        a1.kill9();
        let killed = Instant::now();
        epoch = wait_for("a2 writes partition 0", Duration::from_secs(15), || async {
            let s = state(&cluster).await?;
            let (writer, e) = writer_of(&s, "t", 0);
            (writer.as_deref() == Some("a2") && e > epoch).then_some(e)
        })
        .await;
        takeovers.push(killed.elapsed());
        a1.restart();
        epoch = wait_for("a1 writes partition 0 again", Duration::from_secs(15), || async {
            let s = state(&cluster).await?;
            let (writer, e) = writer_of(&s, "t", 0);
            (writer.as_deref() == Some("a1") && e > epoch).then_some(e)
        })
        .await;
    }
    takeovers.sort();
    let ms: Vec<u128> = takeovers.iter().map(Duration::as_millis).collect();
    eprintln!(
        "kill -9 of the writer agent to a new writer in metadata, lease 2 s, {} rounds: p50 {} ms, p99 {} ms, all {ms:?}",
        ms.len(),
        ms[(ms.len() - 1) / 2],
        ms[ms.len() - 1]
    );
    // Every round ends with a1 writing again; nothing it acknowledged is lost.
    let client = a1.client();
    wait_for("produce to partition 0 after the last round", Duration::from_secs(15), || async {
        client.produce("t", &messages(Some(0), "last", 1)).await.ok()
    })
    .await;
    assert_eq!(read_all(&client, "t", 0).await.len(), 71);

    let status: serde_json::Value =
        serde_json::from_str(&silt_metadata_cli(&cluster.addrs().join(","), &["cluster", "status"]))
            .expect("status json");
    let agents = status["agents"].as_array().expect("agents");
    let a1_status = agents.iter().find(|a| a["id"] == "a1").expect("a1 listed");
    assert_eq!(a1_status["incarnation"], rounds as u64 + 1, "{status}");
    assert_eq!(a1_status["live"], true);
    assert!(status["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .any(|p| p["topic"] == "t" && p["partition"] == 0 && p["writer"] == "a1" && p["epoch"] == epoch));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_agent_serves_produce_replay_poll_and_ack_for_every_partition() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let a1 = agent("a1", &cluster, &objects, "5s");
    let a2 = agent("a2", &cluster, &objects, "5s");
    let (c1, c2) = (a1.client(), a2.client());
    c1.create_topic("events", 4, &BTreeMap::new()).await.expect("create topic");
    let s = state(&cluster).await.expect("state");
    let writers: Vec<String> = (0..4).map(|p| writer_of(&s, "events", p).0.expect("writer")).collect();
    assert!(writers.contains(&"a1".to_string()) && writers.contains(&"a2".to_string()), "{writers:?}");

    // Keyed messages through one agent land on every partition, whoever writes it.
    let mut produced: BTreeMap<String, String> = BTreeMap::new();
    for (round, client) in [&c1, &c2, &c1, &c2].into_iter().enumerate() {
        let batch = messages(None, &format!("r{round}"), 100);
        let ids = client.produce("events", &batch).await.expect("produce");
        for (id, m) in ids.into_iter().zip(&batch) {
            produced.insert(id, m.value.clone().expect("value"));
        }
    }
    assert!((0..4).all(|p| produced.keys().any(|id| offset_of(id).0 == p)), "keys spread over partitions");

    // Replay through either agent reads every partition identically.
    for p in 0..4 {
        let via1 = read_all(&c1, "events", p).await;
        let via2 = read_all(&c2, "events", p).await;
        assert_eq!(via1, via2, "partition {p}");
        for (id, value) in produced.iter().filter(|(id, _)| offset_of(id).0 == p) {
            assert_eq!(via1[offset_of(id).1 as usize].1, *value, "{id}");
        }
    }
    let described = c2.describe_topic("events").await.expect("describe");
    let hwms: u64 = described["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["high_watermark"].as_u64().expect("hwm"))
        .sum();
    assert_eq!(hwms, produced.len() as u64, "{described}");

    // A shared group polls through a2 and acks through a1: every message exactly once.
    let poll = Poll {
        group: "workers".into(),
        member: "w1".into(),
        mode: "shared".into(),
        max: 150,
        // Bytes run out before messages: the partitions a2 collects from a1 keep to what is
        // left of the poll's bytes.
        max_bytes: Some(600),
        timeout_ms: 2000,
        session_timeout_ms: 30_000,
    };
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    while seen.len() < produced.len() {
        let got = c2.poll("events", &poll).await.expect("poll");
        assert!(!got.is_empty(), "poll returned nothing after {} of {}", seen.len(), produced.len());
        let bytes: usize = got
            .iter()
            .map(|m| m.key.as_ref().map_or(0, String::len) + m.value.as_ref().map_or(0, String::len))
            .sum();
        assert!(bytes <= 600, "a poll of {} messages returned {bytes} bytes", got.len());
        let ids: Vec<String> = got.iter().map(|m| m.id.clone()).collect();
        // One id that was never delivered spoils the whole ack: nothing is acknowledged.
        let mut bad = ids.clone();
        bad.push("events/0/999999".into());
        let refused = c1.ack("workers", &bad).await.expect_err("an undelivered id is refused");
        assert!(refused.to_string().contains("not_delivered"), "{refused}");
        assert_eq!(c1.ack("workers", &ids).await.expect("ack"), ids.len() as u64, "none was acked before");
        for m in got {
            assert!(seen.insert(m.id.clone(), m.value.expect("value")).is_none(), "{} delivered twice", m.id);
        }
    }
    assert_eq!(seen, produced);
    let idle = c1.poll("events", &Poll { timeout_ms: 300, ..poll }).await.expect("poll");
    assert!(idle.is_empty(), "acknowledged messages came back: {:?}", idle.first());

    // Each agent counts what it passed on, and the partitions it writes.
    let written: Vec<u64> = writers.iter().map(|w| if w == "a1" { 1 } else { 0 }).collect();
    for (client, mine) in [(&c1, written.iter().sum::<u64>()), (&c2, 4 - written.iter().sum::<u64>())] {
        let metrics = client.metrics().await.expect("metrics");
        let value = |name: &str| -> f64 {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
                .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
        };
        assert_eq!(value("silt_agent_partitions_written ") as u64, mine);
        assert!(value("silt_agent_forwarded_total{kind=\"append\"} ") > 0.0);
        assert_eq!(value("silt_agent_registrations_total ") as u64, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_with_an_empty_data_dir_rejoins_serves_the_archive_and_writes_again() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let mut a1 = agent("a1", &cluster, &objects, "2s");
    let config = BTreeMap::from([("segment.ms".to_string(), "200".to_string())]);
    a1.client().create_topic("logs", 1, &config).await.expect("create topic");
    let before = a1.client().produce("logs", &messages(Some(0), "before", 100)).await.expect("produce");
    assert_eq!(before.last().map(|id| offset_of(id).1), Some(99));
    // The quiet segment seals on age and the agent's compactor archives it.
    wait_for("offsets 0..=99 archived", Duration::from_secs(30), || async {
        let s = state(&cluster).await?;
        let p = &s.topics["logs"].partitions[0];
        p.segments.values().any(|seg| seg.object_key.is_some() && seg.last_offset == Some(99)).then_some(())
    })
    .await;

    // The disk is lost: the agent comes back empty, registers again and writes the partition.
    a1.kill9();
    a1.wipe_data_dir();
    a1.restart();
    let client = a1.client();
    let after = wait_for("produce after the restart", Duration::from_secs(20), || async {
        client.produce("logs", &messages(Some(0), "after", 10)).await.ok()
    })
    .await;
    assert_eq!(after.first().map(|id| offset_of(id).1), Some(100), "the log continues after the archive");
    let records = read_all(&client, "logs", 0).await;
    let expected: Vec<(u64, String)> = (0..100)
        .map(|i| format!("before-{i}"))
        .chain((0..10).map(|i| format!("after-{i}")))
        .enumerate()
        .map(|(o, v)| (o as u64, v))
        .collect();
    assert_eq!(records, expected, "archived records are read back from the bucket");
    let s = state(&cluster).await.expect("state");
    assert_eq!(s.agents["a1"].incarnation, 2);
    assert_eq!(writer_of(&s, "logs", 0).0.as_deref(), Some("a1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_process_archives_what_the_agents_write() {
    let (cluster, tmp, objects) = cluster_and_bucket().await;
    let start = |id: &str| agent_with(id, &cluster, &objects, "5s", &["--no-compactor"]);
    let (a1, a2) = (start("a1"), start("a2"));
    let config = BTreeMap::from([("segment.ms".to_string(), "200".to_string())]);
    a1.client().create_topic("clicks", 2, &config).await.expect("create topic");
    let mut produced: BTreeMap<String, String> = BTreeMap::new();
    for client in [a1.client(), a2.client()] {
        let batch = messages(None, "click", 150);
        for (id, m) in client.produce("clicks", &batch).await.expect("produce").into_iter().zip(&batch) {
            produced.insert(id, m.value.clone().expect("value"));
        }
    }
    let ends: Vec<u64> =
        (0..2).map(|p| produced.keys().filter(|id| offset_of(id).0 == p).count() as u64).collect();
    assert!(ends.iter().all(|n| *n > 0), "{ends:?}");

    // Sealed segments stay unarchived without a compactor...
    wait_for("segments sealed on age", Duration::from_secs(20), || async {
        let s = state(&cluster).await?;
        let parts = &s.topics["clicks"].partitions;
        parts
            .iter()
            .zip(&ends)
            .all(|(p, end)| p.segments.values().any(|seg| seg.last_offset == Some(end - 1)))
            .then_some(())
    })
    .await;
    let s = state(&cluster).await.expect("state");
    assert!(s.topics["clicks"]
        .partitions
        .iter()
        .all(|p| p.segments.values().all(|seg| seg.object_key.is_none())));

    // ... until one runs: it reads them from their agents, archives and commits them.
    let compactor = SiltDev::start_compactor(&cluster.addrs(), &objects);
    wait_for("every produced offset archived", Duration::from_secs(30), || async {
        let s = state(&cluster).await?;
        let parts = &s.topics["clicks"].partitions;
        parts
            .iter()
            .zip(&ends)
            .all(|(p, end)| {
                p.segments
                    .values()
                    .filter(|seg| seg.object_key.is_some())
                    .filter_map(|seg| seg.last_offset)
                    .max()
                    == Some(end - 1)
            })
            .then_some(())
    })
    .await;
    let metrics = reqwest::get(format!("{}/metrics", compactor.url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let archived: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("silt_compactor_records_archived_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no records_archived in\n{metrics}"));
    assert_eq!(archived as usize, produced.len());
    // The objects are in the shared bucket, and both agents read them back identically.
    let files = silt_tests::files_under(&tmp.path().join("objects"));
    assert!(files.iter().filter(|f| f.extension().is_some_and(|e| e == "parquet")).count() >= 2, "{files:?}");
    for p in 0..2 {
        let via1 = read_all(&a1.client(), "clicks", p).await;
        assert_eq!(via1, read_all(&a2.client(), "clicks", p).await);
        for (id, value) in produced.iter().filter(|(id, _)| offset_of(id).0 == p) {
            assert_eq!(via1[offset_of(id).1 as usize].1, *value, "{id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_hands_its_partitions_over_archived_and_producing_continues() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let mut a1 = agent("a1", &cluster, &objects, "5s");
    let mut a2 = agent("a2", &cluster, &objects, "5s");
    a2.client().create_topic("orders", 1, &BTreeMap::new()).await.expect("create topic");
    let s = state(&cluster).await.expect("state");
    assert_eq!(writer_of(&s, "orders", 0).0.as_deref(), Some("a1"));
    let first = a2.client().produce("orders", &messages(Some(0), "first", 50)).await.expect("produce via a2");
    assert_eq!(first.last().map(|id| offset_of(id).1), Some(49));

    // SIGTERM: a1 seals and archives what it wrote, then leaves; a2 takes over at once.
    a1.stop();
    let s = state(&cluster).await.expect("state");
    let (writer, _) = writer_of(&s, "orders", 0);
    assert_eq!(
        writer.as_deref(),
        Some("a2"),
        "a deregistered agent's partitions move without waiting for its lease"
    );
    let p = &s.topics["orders"].partitions[0];
    assert!(p.segments.values().any(|seg| seg.object_key.is_some() && seg.last_offset == Some(49)), "{p:?}");
    assert!(p.open_segment().is_none_or(|o| o.ensemble != ["a1"]), "no open segment left on a1: {p:?}");
    let c2 = a2.client();
    let second = wait_for("produce through a2 after a1 stopped", Duration::from_secs(10), || async {
        c2.produce("orders", &messages(Some(0), "second", 20)).await.ok()
    })
    .await;
    assert_eq!(second.first().map(|id| offset_of(id).1), Some(50));

    // a1 comes back with its (archived) local copy; then a2 stops: a1 writes on after a2's
    // records although its own log ends before them.
    a1.restart();
    wait_for("a1 registered again", Duration::from_secs(10), || async {
        let s = state(&cluster).await?;
        s.agents.get("a1").filter(|a| a.incarnation == 2).map(|_| ())
    })
    .await;
    a2.stop();
    let c1 = a1.client();
    let third = wait_for("produce through a1 after a2 stopped", Duration::from_secs(10), || async {
        c1.produce("orders", &messages(Some(0), "third", 10)).await.ok()
    })
    .await;
    assert_eq!(third.first().map(|id| offset_of(id).1), Some(70));
    let values: Vec<String> = read_all(&c1, "orders", 0).await.into_iter().map(|r| r.1).collect();
    let expected: Vec<String> = (0..50)
        .map(|i| format!("first-{i}"))
        .chain((0..20).map(|i| format!("second-{i}")))
        .chain((0..10).map(|i| format!("third-{i}")))
        .collect();
    assert_eq!(values, expected);
}

/// Metadata's state clock moves only with the commands it applies, and with every agent dead
/// none comes: `silt cluster status` judges leases by the leader's lease clock when it answered,
/// so a killed agent shows as not live once its lease lapsed, though nothing was applied since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_shows_a_killed_agent_down_once_its_lease_lapsed_with_no_agent_left() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let mut a1 = agent("a1", &cluster, &objects, "2s");
    let live = || {
        let status: serde_json::Value =
            serde_json::from_str(&silt_metadata_cli(&cluster.addrs().join(","), &["cluster", "status"]))
                .expect("status json");
        let agents = status["agents"].as_array().expect("agents").clone();
        agents.iter().find(|a| a["id"] == "a1").map(|a| a["live"] == true)
    };
    assert_eq!(live(), Some(true));
    a1.kill9();
    wait_for("a1 shown down by cluster status", Duration::from_secs(20), || async {
        (!live()?).then_some(())
    })
    .await;
}

/// Produces ten messages to each of the four partitions of `spread`, recording what was
/// acknowledged. A partition moving at that moment refuses its request; the next round retries.
async fn produce_round(client: &Client, round: usize, acked: &mut BTreeMap<(u32, u64), String>) {
    for p in 0..4 {
        if let Ok(ids) = client.produce("spread", &messages(Some(p), &format!("r{round}"), 10)).await {
            for (i, id) in ids.iter().enumerate() {
                assert!(
                    acked.insert(offset_of(id), format!("r{round}-{i}")).is_none(),
                    "{id} acknowledged twice"
                );
            }
        }
    }
}

/// An agent that joins a running cluster gets its share of the partitions (one moved every
/// three of its leases, once it has been registered that long) while producers carry on:
/// every acknowledged message stays at its offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_agent_takes_its_share_of_the_partitions_and_nothing_is_lost() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let a1 = agent("a1", &cluster, &objects, "1s");
    let client = a1.client();
    client.create_topic("spread", 4, &BTreeMap::new()).await.expect("create topic");
    let written_by = |s: &MetadataState, agent: &str| {
        s.topics["spread"].partitions.iter().filter(|p| p.writer.as_deref() == Some(agent)).count()
    };
    assert_eq!(written_by(&state(&cluster).await.expect("state"), "a1"), 4);
    let a2 = agent("a2", &cluster, &objects, "1s");

    let mut acked: BTreeMap<(u32, u64), String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut round = 0;
    loop {
        produce_round(&client, round, &mut acked).await;
        round += 1;
        let s = state(&cluster).await.expect("state");
        if written_by(&s, "a2") == 2 {
            assert_eq!(written_by(&s, "a1"), 2);
            break;
        }
        assert!(Instant::now() < deadline, "a2 writes {} of 4 partitions after 60 s", written_by(&s, "a2"));
    }
    // Both agents keep what they write now: two more rounds through a2 change nothing.
    produce_round(&a2.client(), round, &mut acked).await;
    produce_round(&a2.client(), round + 1, &mut acked).await;
    let s = state(&cluster).await.expect("state");
    assert_eq!((written_by(&s, "a1"), written_by(&s, "a2")), (2, 2));
    // Its copy of metadata followed every change by applying commands; it was fetched whole
    // only when the agent started.
    let metrics = a2.client().metrics().await.expect("metrics");
    let refreshes = |how: &str| {
        let prefix = format!("silt_agent_metadata_refreshes_total{{how=\"{how}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&prefix)?.parse::<u64>().ok())
    };
    assert_eq!(refreshes("whole"), Some(1), "{metrics}");
    assert!(refreshes("changes").is_some_and(|n| n > 0), "{metrics}");
    assert!(acked.len() >= 4 * 10 * 3, "only {} messages acknowledged", acked.len());
    for p in 0..4u32 {
        // Right after a move the former writer's copy of metadata may still show its segment
        // open, and it answers `unavailable` until it catches up: retry.
        let c2 = a2.client();
        let log: BTreeMap<u64, String> =
            wait_for("a replay of the partition", Duration::from_secs(30), || async {
                try_read_all(&c2, "spread", p).await.ok()
            })
            .await
            .into_iter()
            .collect();
        for ((_, offset), value) in acked.range((p, 0)..(p + 1, 0)) {
            assert_eq!(log.get(offset), Some(value), "{p}/{offset}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_left_on_an_agent_that_no_longer_writes_the_partition_stay_readable_until_archived() {
    let (cluster, _tmp, objects) = cluster_and_bucket().await;
    let start = |id: &str| agent_with(id, &cluster, &objects, "5s", &["--no-compactor"]);
    let (mut a1, a2) = (start("a1"), start("a2"));
    a1.client().create_topic("moves", 1, &BTreeMap::new()).await.expect("create topic");
    assert_eq!(writer_of(&state(&cluster).await.expect("state"), "moves", 0).0.as_deref(), Some("a1"));
    a1.client().produce("moves", &messages(Some(0), "first", 50)).await.expect("produce");

    // a1 stops without archiving (no compactor anywhere yet): a2 writes on after offset 49.
    a1.stop();
    let c2 = a2.client();
    let second = wait_for("produce through a2", Duration::from_secs(10), || async {
        c2.produce("moves", &messages(Some(0), "second", 20)).await.ok()
    })
    .await;
    assert_eq!(second.first().map(|id| offset_of(id).1), Some(50));

    // a1 comes back: it does not write the partition, but serves what it holds of it.
    a1.restart();
    let expected: Vec<(u64, String)> = (0..50)
        .map(|i| format!("first-{i}"))
        .chain((0..20).map(|i| format!("second-{i}")))
        .enumerate()
        .map(|(o, v)| (o as u64, v))
        .collect();
    let via2 = wait_for("a2 reads offsets 0..49 from a1", Duration::from_secs(10), || async {
        let records = try_read_all(&c2, "moves", 0).await.ok()?;
        (records.len() == 70).then_some(records)
    })
    .await;
    assert_eq!(via2, expected);

    // The compactor archives the segment from a1; a1 then drops its copy, and reads come from
    // the bucket.
    let _compactor = SiltDev::start_compactor(&cluster.addrs(), &objects);
    wait_for("offsets 0..=49 archived", Duration::from_secs(30), || async {
        let s = state(&cluster).await?;
        s.topics["moves"].partitions[0]
            .segments
            .values()
            .any(|seg| seg.object_key.is_some() && seg.last_offset == Some(49))
            .then_some(())
    })
    .await;
    let s = state(&cluster).await.expect("state");
    let local =
        a1.data_dir().join("agent").join("log").join(format!("moves~{}", s.topics["moves"].id)).join("0");
    wait_for("a1 drops its archived copy", Duration::from_secs(10), || async {
        (!local.exists()).then_some(())
    })
    .await;
    assert_eq!(read_all(&a1.client(), "moves", 0).await, expected);
}

/// libfaketime, from Debian's `faketime` (installed by `scripts/test.sh`).
fn libfaketime() -> Option<String> {
    let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    if std::path::Path::new(lib).exists() {
        return Some(lib.into());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{lib} is missing: scripts/test.sh installs faketime"
    );
    eprintln!("skipping: {lib} is missing (apt-get install faketime)");
    None
}

/// Waits until metadata's clock has moved `ms` past `from`, and returns it.
async fn clock_past(cluster: &MetadataCluster, from: u64, ms: u64) -> u64 {
    wait_for(&format!("metadata's clock to pass {from} + {ms} ms"), Duration::from_secs(60), || async {
        let now = state(cluster).await?.clock_ms;
        (now >= from + ms).then_some(now)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_of_the_metadata_leaders_wall_clock_moves_no_writer() {
    let Some(lib) = libfaketime() else { return };
    // The metadata node's wall clock is offset by what this file says (read on every call);
    // its monotonic clock is left alone, as an NTP or operator step leaves it.
    let clock_dir = tempfile::tempdir().expect("tempdir");
    let offset = clock_dir.path().join("offset");
    std::fs::write(&offset, "+0\n").expect("offset");
    let env: Vec<(String, String)> = [
        ("LD_PRELOAD", lib.as_str()),
        ("FAKETIME_TIMESTAMP_FILE", &offset.display().to_string()),
        ("FAKETIME_NO_CACHE", "1"),
        ("DONT_FAKE_MONOTONIC", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cluster = MetadataCluster::start_with_env(1, &[], &env);
    cluster.wait_for_leader(&[1], LEADER_TIMEOUT).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let objects = objects_url(tmp.path());
    let lease_ms = 2_000;
    let a1 = agent("a1", &cluster, &objects, "2s");
    let mut a2 = agent("a2", &cluster, &objects, "2s");
    let client = a1.client();
    client.create_topic("t", 4, &BTreeMap::new()).await.expect("create");
    let writers = |s: &MetadataState| (0..4).map(|p| writer_of(s, "t", p)).collect::<Vec<_>>();
    let before = wait_for("every partition written by a live agent", Duration::from_secs(30), || async {
        let s = state(&cluster).await?;
        let w = writers(&s);
        w.iter().all(|(a, _)| a.is_some()).then_some((w, s.clock_ms))
    })
    .await;
    let (before, clock) = before;
    assert!(before.iter().any(|(a, _)| a.as_deref() == Some("a2")), "{before:?}");
    for p in 0..4 {
        client.produce("t", &messages(Some(p), "before", 5)).await.expect("produce");
    }

    // An hour forward: no lease lapses, no partition changes writer.
    std::fs::write(&offset, "+3600\n").expect("offset");
    let clock = clock_past(&cluster, clock, 3 * lease_ms).await;
    assert_eq!(writers(&state(&cluster).await.expect("state")), before, "after a step forward");
    let real_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    assert!(
        clock < real_ms + 600_000,
        "metadata's clock jumped with the wall clock: {clock}, really {real_ms}"
    );
    // And back, two hours: time goes on, and a lease that is no longer renewed still lapses.
    std::fs::write(&offset, "-3600\n").expect("offset");
    clock_past(&cluster, clock, 3 * lease_ms).await;
    assert_eq!(writers(&state(&cluster).await.expect("state")), before, "after a step back");
    a2.kill9();
    wait_for("a2's partitions to move to a1", Duration::from_secs(30), || async {
        let s = state(&cluster).await?;
        writers(&s).iter().all(|(a, _)| a.as_deref() == Some("a1")).then_some(())
    })
    .await;
    // One replica per segment: a2's open segments come back with it.
    a2.restart();
    for p in 0..4 {
        // Until a2 is back and a1's writers recovered its segments, producers retry.
        wait_for(&format!("a produce to partition {p} after the steps"), Duration::from_secs(30), || async {
            client.produce("t", &messages(Some(p), "after", 5)).await.ok()
        })
        .await;
        let values: Vec<String> = read_all(&client, "t", p).await.into_iter().map(|(_, v)| v).collect();
        assert_eq!(values.len(), 10, "partition {p}: {values:?}");
    }
}
