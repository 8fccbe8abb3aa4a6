//! End-to-end tests against a real `silt dev` process on loopback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use silt::client::{Client, ClientError, Message, OutMessage, Poll};
use silt_tests::{silt_bin, silt_cli, wait_for, SiltDev};

fn poll_req(group: &str, member: &str, mode: &str, max: u32, timeout_ms: u64) -> Poll {
    Poll {
        group: group.into(),
        member: member.into(),
        mode: mode.into(),
        max,
        max_bytes: None,
        timeout_ms,
        session_timeout_ms: 10_000,
    }
}

async fn create(client: &Client, topic: &str, partitions: u32, config: &[(&str, &str)]) {
    let config: BTreeMap<String, String> =
        config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    client.create_topic(topic, partitions, &config).await.expect("create topic");
}

/// Reads a whole topic back through replay, partition by partition.
async fn replay_all(client: &Client, topic: &str, partitions: u32) -> Vec<Message> {
    let mut out = Vec::new();
    for p in 0..partitions {
        let mut from = 0;
        loop {
            let page = client.replay(topic, p, Some(from), None, 5000).await.expect("replay");
            if page.messages.is_empty() {
                break;
            }
            from = page.next_offset;
            out.extend(page.messages);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_messages_from_four_producers_are_consumed_exactly_as_acked() {
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "load", 4, &[("segment.bytes", "1048576")]).await;
    const PRODUCERS: usize = 4;
    const PER_PRODUCER: usize = 25_000;
    const BATCH: usize = 500;
    let mut tasks = Vec::new();
    for producer in 0..PRODUCERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(String, String, String)> = Vec::with_capacity(PER_PRODUCER);
            for start in (0..PER_PRODUCER).step_by(BATCH) {
                let messages: Vec<OutMessage> = (start..start + BATCH)
                    .map(|i| OutMessage {
                        key: Some(format!("p{producer}-k{}", i % 97)),
                        value: Some(format!("p{producer}-{i}")),
                        ..Default::default()
                    })
                    .collect();
                let ids = client.produce("load", &messages).await.expect("produce");
                assert_eq!(ids.len(), messages.len());
                for (id, m) in ids.into_iter().zip(messages) {
                    acked.push((id, m.key.unwrap_or_default(), m.value.unwrap_or_default()));
                }
            }
            acked
        }));
    }
    let mut acked: HashMap<String, (String, String)> = HashMap::new();
    let mut per_producer_order: Vec<Vec<String>> = Vec::new();
    for t in tasks {
        let list = t.await.expect("producer task");
        per_producer_order.push(list.iter().map(|(id, _, _)| id.clone()).collect());
        for (id, k, v) in list {
            assert!(acked.insert(id.clone(), (k, v)).is_none(), "id {id} acknowledged twice");
        }
    }
    assert_eq!(acked.len(), PRODUCERS * PER_PRODUCER);

    // Consume everything with one group, acking every poll.
    let mut consumed: Vec<Message> = Vec::new();
    let mut seen = HashSet::new();
    while consumed.len() < acked.len() {
        let batch =
            client.poll("load", &poll_req("checker", "c1", "exclusive", 5000, 5000)).await.expect("poll");
        assert!(
            !batch.is_empty(),
            "poll timed out with {} of {} messages consumed",
            consumed.len(),
            acked.len()
        );
        let ids: Vec<String> = batch.iter().map(|m| m.id.clone()).collect();
        client.ack("checker", &ids).await.expect("ack");
        for m in batch {
            assert!(seen.insert(m.id.clone()), "message {} delivered twice", m.id);
            consumed.push(m);
        }
    }
    // Every consumed message is exactly what was acknowledged under its id.
    for m in &consumed {
        let (k, v) =
            acked.get(&m.id).unwrap_or_else(|| panic!("consumed {} which was never acknowledged", m.id));
        assert_eq!(m.key.as_ref(), Some(k), "key of {}", m.id);
        assert_eq!(m.value.as_ref(), Some(v), "value of {}", m.id);
        assert_eq!(m.delivery, Some(1));
    }
    // Order per partition: offsets arrive strictly increasing.
    let mut last: HashMap<u32, u64> = HashMap::new();
    for m in &consumed {
        if let Some(prev) = last.insert(m.partition, m.offset) {
            assert!(m.offset > prev, "partition {} went from {prev} to {}", m.partition, m.offset);
        }
    }
    // Each producer's messages keep their order within a partition.
    for ids in &per_producer_order {
        let mut last: HashMap<u32, u64> = HashMap::new();
        for id in ids {
            let parts: Vec<&str> = id.rsplitn(3, '/').collect();
            let (offset, partition): (u64, u32) =
                (parts[0].parse().expect("offset"), parts[1].parse().expect("p"));
            if let Some(prev) = last.insert(partition, offset) {
                assert!(offset > prev, "a producer's messages were reordered in partition {partition}");
            }
        }
    }
    // All four partitions were used, and the group has nothing left.
    assert_eq!(last.len(), 4);
    let none = client.poll("load", &poll_req("checker", "c1", "exclusive", 10, 200)).await.expect("poll");
    assert!(none.is_empty(), "nothing is left after everything was acked");
}

/// Feeds numbered lines to a `silt produce` process until it dies; returns (lines sent, ids printed).
fn spawn_cli_producer(
    url: &str,
    producer: usize,
    lines: usize,
) -> (std::process::Child, std::thread::JoinHandle<()>, std::thread::JoinHandle<Vec<String>>) {
    let mut child = Command::new(silt_bin())
        .args(["produce", "crash", "--key-separator", "\\t", "--server", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn silt produce");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        for i in 0..lines {
            if writeln!(stdin, "p{producer}-k{}\tp{producer}-{i}", i % 13).is_err() {
                return;
            }
            if i % 200 == 0 && stdin.flush().is_err() {
                return;
            }
        }
    });
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect());
    (child, writer, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_produce_loses_no_acknowledged_message() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    create(&client, "crash", 4, &[("segment.bytes", "65536")]).await;
    const PRODUCERS: usize = 4;
    const LINES: usize = 1_000_000;
    let producers: Vec<_> = (0..PRODUCERS).map(|p| spawn_cli_producer(dev.url(), p, LINES)).collect();
    // Let the producers get well into their work, then kill -9 the server mid-stream.
    wait_for("messages to be acknowledged", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let t = client.describe_topic("crash").await.ok()?;
            let total: u64 =
                t["partitions"].as_array()?.iter().filter_map(|p| p["high_watermark"].as_u64()).sum();
            (total >= 20_000).then_some(())
        }
    })
    .await;
    dev.kill9();
    let mut printed: Vec<Vec<String>> = Vec::new();
    for (mut child, writer, reader) in producers {
        let _ = child.wait();
        let _ = writer.join();
        printed.push(reader.join().expect("reader thread"));
    }
    let total_printed: usize = printed.iter().map(Vec::len).sum();
    eprintln!(
        "acknowledged before the kill: {total_printed} ({:?} per producer)",
        printed.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(total_printed > 0, "producers printed no id before the kill");
    assert!(printed.iter().all(|p| p.len() < LINES), "the kill came after a producer had finished");

    dev.restart();
    let client = dev.client();
    let messages = replay_all(&client, "crash", 4).await;
    let by_id: HashMap<&str, &Message> = messages.iter().map(|m| (m.id.as_str(), m)).collect();
    assert_eq!(by_id.len(), messages.len(), "an offset holds two messages");
    // The i-th id a producer printed is its i-th line, at exactly that offset.
    for (producer, ids) in printed.iter().enumerate() {
        for (i, id) in ids.iter().enumerate() {
            let m = by_id.get(id.as_str()).unwrap_or_else(|| {
                panic!("acknowledged message {id} (producer {producer}, line {i}) is lost")
            });
            assert_eq!(m.value.as_deref(), Some(format!("p{producer}-{i}").as_str()), "message at {id}");
            assert_eq!(m.key.as_deref(), Some(format!("p{producer}-k{}", i % 13).as_str()), "key at {id}");
        }
    }
    // Offsets are dense per partition: no holes were left by the crash.
    for p in 0..4u32 {
        let offsets: Vec<u64> = messages.iter().filter(|m| m.partition == p).map(|m| m.offset).collect();
        assert!(offsets.iter().enumerate().all(|(i, o)| *o == i as u64), "partition {p} has holes");
    }
    // A group consuming after the restart gets every acknowledged message exactly as acked, in
    // offset order per partition.
    let mut consumed: HashMap<String, Message> = HashMap::new();
    let mut last: HashMap<u32, u64> = HashMap::new();
    while consumed.len() < messages.len() {
        let batch =
            client.poll("crash", &poll_req("after", "c", "exclusive", 5000, 5000)).await.expect("poll");
        assert!(!batch.is_empty(), "poll timed out with {} of {} consumed", consumed.len(), messages.len());
        let ids: Vec<String> = batch.iter().map(|m| m.id.clone()).collect();
        client.ack("after", &ids).await.expect("ack");
        for m in batch {
            if let Some(prev) = last.insert(m.partition, m.offset) {
                assert!(m.offset > prev, "partition {} went from {prev} to {}", m.partition, m.offset);
            }
            assert!(consumed.insert(m.id.clone(), m).is_none(), "delivered twice");
        }
    }
    for ids in &printed {
        for id in ids {
            assert_eq!(consumed.get(id).map(|m| &m.value), by_id.get(id.as_str()).map(|m| &m.value), "{id}");
        }
    }
    // The restarted server accepts writes after the recovered end.
    let ids = client
        .produce(
            "crash",
            &[OutMessage { partition: Some(0), value: Some("after".into()), ..Default::default() }],
        )
        .await
        .expect("produce after restart");
    let expected = messages.iter().filter(|m| m.partition == 0).count();
    assert_eq!(ids[0], format!("crash/0/{expected}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_message_is_redelivered_and_then_dead_lettered() {
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "jobs", 1, &[("visibility.timeout.ms", "300"), ("max.deliveries", "2")]).await;
    let ids = client
        .produce(
            "jobs",
            &[OutMessage { key: Some("k".into()), value: Some("work".into()), ..Default::default() }],
        )
        .await
        .expect("produce");
    let first = client.poll("jobs", &poll_req("workers", "w1", "shared", 10, 1000)).await.expect("poll");
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].id.as_str(), first[0].delivery), (ids[0].as_str(), Some(1)));
    // Not acked: it comes back after the visibility timeout, with the delivery count raised.
    let second = client.poll("jobs", &poll_req("workers", "w1", "shared", 10, 5000)).await.expect("poll");
    assert_eq!(second.len(), 1, "redelivered after the visibility timeout");
    assert_eq!((second[0].id.as_str(), second[0].delivery), (ids[0].as_str(), Some(2)));
    // After max.deliveries it moves to the dead-letter topic instead of coming back.
    let dlq = wait_for("the dead-letter topic to receive the message", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let again =
                client.poll("jobs", &poll_req("workers", "w1", "shared", 10, 500)).await.expect("poll");
            assert!(again.is_empty(), "a message past max.deliveries was delivered again: {again:?}");
            let page = client.replay("jobs.dlq", 0, Some(0), None, 10).await.ok()?;
            (!page.messages.is_empty()).then_some(page.messages)
        }
    })
    .await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].value.as_deref(), Some("work"));
    assert_eq!(dlq[0].key.as_deref(), Some("k"));
    let header = |name: &str| dlq[0].headers.iter().find(|h| h.key == name).and_then(|h| h.value.clone());
    assert_eq!(header("silt.original.id"), Some(ids[0].clone()));
    assert_eq!(header("silt.group").as_deref(), Some("workers"));
    // The dead-lettered message counts as handled for the group.
    let group = wait_for("the ack floor to pass the dead-lettered message", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let g = client.describe_group("workers").await.ok()?;
            (g["topics"]["jobs"]["partitions"][0]["ack_floor"].as_u64() == Some(1)).then_some(g)
        }
    })
    .await;
    assert_eq!(group["topics"]["jobs"]["lag"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_messages_stay_acked_across_a_restart() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    create(&client, "ledger", 1, &[]).await;
    let messages: Vec<OutMessage> =
        (0..10).map(|i| OutMessage { value: Some(format!("m{i}")), ..Default::default() }).collect();
    client.produce("ledger", &messages).await.expect("produce");
    let got = client.poll("ledger", &poll_req("g", "m", "exclusive", 10, 2000)).await.expect("poll");
    assert_eq!(got.len(), 10);
    // Ack all but offsets 3 and 7.
    let ids: Vec<String> =
        got.iter().filter(|m| m.offset != 3 && m.offset != 7).map(|m| m.id.clone()).collect();
    client.ack("g", &ids).await.expect("ack");
    wait_for("the ack checkpoint", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let g = client.describe_group("g").await.ok()?;
            (g["topics"]["ledger"]["partitions"][0]["ack_floor"].as_u64() == Some(3)).then_some(())
        }
    })
    .await;
    dev.stop();
    dev.restart();
    let client = dev.client();
    // Only the two unacknowledged messages come back, once.
    let again = client.poll("ledger", &poll_req("g", "m", "exclusive", 10, 2000)).await.expect("poll");
    let offsets: Vec<u64> = again.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![3, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_groups_split_partitions_and_shared_groups_split_messages() {
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "split", 4, &[]).await;
    let messages: Vec<OutMessage> = (0..40)
        .map(|i| OutMessage { partition: Some(i % 4), value: Some(format!("m{i}")), ..Default::default() })
        .collect();
    client.produce("split", &messages).await.expect("produce");

    // Exclusive: a joins alone and owns every partition; once b joins, each owns two.
    client.poll("split", &poll_req("ex", "a", "exclusive", 1, 0)).await.expect("poll a");
    client.poll("split", &poll_req("ex", "b", "exclusive", 1, 0)).await.expect("poll b");
    let g = client.describe_group("ex").await.expect("describe");
    let owners: Vec<String> = g["topics"]["split"]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["member"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(owners.iter().filter(|m| *m == "a").count(), 2, "{owners:?}");
    assert_eq!(owners.iter().filter(|m| *m == "b").count(), 2, "{owners:?}");
    let from_b = client.poll("split", &poll_req("ex", "b", "exclusive", 100, 1000)).await.expect("poll b");
    assert!(!from_b.is_empty());
    for m in &from_b {
        assert_eq!(owners[m.partition as usize], "b", "b got a message of a partition it does not own");
    }
    // b leaves; a gets everything.
    client.leave("ex", "split", "b").await.expect("leave");
    let g = client.describe_group("ex").await.expect("describe");
    assert!(g["topics"]["split"]["partitions"].as_array().expect("p").iter().all(|p| p["member"] == "a"));

    // Shared: two members draw disjoint messages from the same partitions.
    let x = client.poll("split", &poll_req("sh", "x", "shared", 15, 1000)).await.expect("poll x");
    let y = client.poll("split", &poll_req("sh", "y", "shared", 40, 1000)).await.expect("poll y");
    assert_eq!(x.len(), 15);
    let ids: HashSet<&str> = x.iter().chain(y.iter()).map(|m| m.id.as_str()).collect();
    assert_eq!(ids.len(), x.len() + y.len(), "a message went to two shared members");
    assert_eq!(ids.len(), 40);
    // A group's mode is fixed once it exists.
    let err = client.poll("split", &poll_req("sh", "z", "exclusive", 1, 0)).await.expect_err("mode mismatch");
    assert!(
        matches!(err, ClientError::Api { status: 409, ref code, .. } if code == "group_mode_mismatch"),
        "{err}"
    );
}

async fn raw(url: &str, method: reqwest::Method, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, format!("{url}{path}"));
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_string());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let dev = SiltDev::start();
    let url = dev.url().to_string();
    let client = dev.client();
    create(&client, "good", 2, &[("max.message.bytes", "1024")]).await;
    client
        .produce("good", &[OutMessage { partition: Some(0), value: Some("v".into()), ..Default::default() }])
        .await
        .expect("produce");
    use reqwest::Method;
    // (method, path, body, expected status, expected code, phrase the message must contain)
    type Case = (Method, String, Option<String>, u16, &'static str, &'static str);
    let cases: Vec<Case> = vec![
        (
            Method::POST,
            "/v1/topics".into(),
            Some(r#"{"name":"bad name"}"#.into()),
            400,
            "invalid_topic_name",
            "contains",
        ),
        (
            Method::POST,
            "/v1/topics".into(),
            Some(format!(r#"{{"name":"{}"}}"#, "x".repeat(250))),
            400,
            "invalid_topic_name",
            "249",
        ),
        (
            Method::POST,
            "/v1/topics".into(),
            Some(r#"{"name":"good"}"#.into()),
            409,
            "topic_exists",
            "already exists",
        ),
        (
            Method::POST,
            "/v1/topics".into(),
            Some(r#"{"name":"t2","config":{"segment.bites":"1"}}"#.into()),
            400,
            "invalid_config",
            "unknown topic config",
        ),
        (
            Method::POST,
            "/v1/topics".into(),
            Some(r#"{"name":"t3","partitions":0}"#.into()),
            400,
            "invalid_argument",
            "partitions",
        ),
        (Method::POST, "/v1/topics".into(), Some(r#"{"name": "#.into()), 400, "invalid_json", ""),
        (
            Method::POST,
            "/v1/topics/nope/messages".into(),
            Some(r#"{"messages":[{"value":"v"}]}"#.into()),
            404,
            "unknown_topic",
            "'nope' does not exist",
        ),
        (
            Method::POST,
            "/v1/topics/good/messages".into(),
            Some(format!(r#"{{"messages":[{{"value":"small"}},{{"value":"{}"}}]}}"#, "x".repeat(2000))),
            413,
            "message_too_large",
            "max.message.bytes",
        ),
        (
            Method::POST,
            "/v1/topics/good/messages".into(),
            Some(r#"{"messages":[{"value":"v","partition":7}]}"#.into()),
            404,
            "unknown_partition",
            "no partition 7",
        ),
        (
            Method::POST,
            "/v1/topics/good/messages".into(),
            Some(r#"{"messages":[{"valeu":"v"}]}"#.into()),
            400,
            "invalid_json",
            "valeu",
        ),
        (
            Method::POST,
            "/v1/topics/good/messages".into(),
            Some(r#"{"messages":[]}"#.into()),
            400,
            "empty_request",
            "",
        ),
        (
            Method::POST,
            "/v1/topics/good/partitions/0/batches".into(),
            Some("not a batch".into()),
            400,
            "invalid_record_batch",
            "",
        ),
        (
            Method::POST,
            "/v1/topics/good/poll".into(),
            Some(r#"{"group":"g","max":0}"#.into()),
            400,
            "invalid_max",
            "between 1 and",
        ),
        (
            Method::POST,
            "/v1/topics/good/poll".into(),
            Some(r#"{"group":"g","max":100001}"#.into()),
            400,
            "invalid_max",
            "",
        ),
        (
            Method::POST,
            "/v1/groups/g/ack".into(),
            Some(r#"{"ids":["good/0/0"]}"#.into()),
            400,
            "not_delivered",
            "never delivered",
        ),
        (
            Method::POST,
            "/v1/groups/g/ack".into(),
            Some(r#"{"ids":["not-an-id"]}"#.into()),
            400,
            "invalid_id",
            "topic/partition/offset",
        ),
        (
            Method::GET,
            "/v1/topics/good/partitions/0/messages?from_offset=abc".into(),
            None,
            400,
            "invalid_query",
            "",
        ),
        (
            Method::PATCH,
            "/v1/topics/good".into(),
            Some(r#"{"config":{"max.message.bytes":"4096","replication.factor":"3"}}"#.into()),
            400,
            "invalid_config",
            "replication.factor cannot be altered",
        ),
        (
            Method::PATCH,
            "/v1/topics/good".into(),
            Some(r#"{"config":{"segment.ms":"1000","max.deliveries":"0"}}"#.into()),
            400,
            "invalid_config",
            "max.deliveries=0",
        ),
        (
            Method::PATCH,
            "/v1/topics/good".into(),
            Some(r#"{"config":{}}"#.into()),
            400,
            "invalid_config",
            "no config",
        ),
        (
            Method::PATCH,
            "/v1/topics/nope".into(),
            Some(r#"{"config":{"segment.ms":"1000"}}"#.into()),
            404,
            "unknown_topic",
            "'nope' does not exist",
        ),
        (Method::GET, "/v1/groups/nobody".into(), None, 404, "unknown_group", ""),
        (Method::GET, "/v2/whatever".into(), None, 404, "not_found", ""),
    ];
    for (method, path, body, status, code, phrase) in cases {
        let (got_status, json) = raw(&url, method.clone(), &path, body.as_deref()).await;
        assert_eq!(got_status, status, "{method} {path}: {json}");
        assert_eq!(json["error"]["code"], code, "{method} {path}: {json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(phrase), "{method} {path}: message '{message}' should mention '{phrase}'");
    }
    // Nothing changed: still one message in partition 0, none in 1, only one topic.
    let t = client.describe_topic("good").await.expect("describe");
    assert_eq!(t["config"]["max.message.bytes"], "1024");
    assert_eq!(t["config"]["segment.ms"], "600000");
    assert_eq!(t["partitions"][0]["high_watermark"], 1);
    assert_eq!(t["partitions"][1]["high_watermark"], 0);
    let topics = client.list_topics().await.expect("list");
    assert_eq!(topics["topics"].as_array().map(Vec::len), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_walkthrough_from_the_readme() {
    let dev = SiltDev::start();
    let url = dev.url().to_string();
    silt_cli(
        &url,
        &["topic", "create", "orders", "--partitions", "4", "--config", "segment.bytes=1048576"],
        None,
    );
    let produced = silt_cli(&url, &["produce", "orders", "--key-separator", "\\t"], Some("k1\tv1\nk2\tv2\n"));
    let ids: Vec<&str> = produced.lines().collect();
    assert_eq!(ids.len(), 2, "{produced}");
    let consumed =
        silt_cli(&url, &["consume", "orders", "--group", "billing", "--max", "100", "--timeout", "1s"], None);
    let messages: Vec<Message> =
        consumed.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    let mut pairs: Vec<(String, String, String)> = messages
        .iter()
        .map(|m| (m.id.clone(), m.key.clone().unwrap_or_default(), m.value.clone().unwrap_or_default()))
        .collect();
    pairs.sort();
    let mut expected = vec![
        (ids[0].to_string(), "k1".to_string(), "v1".to_string()),
        (ids[1].to_string(), "k2".to_string(), "v2".to_string()),
    ];
    expected.sort();
    assert_eq!(pairs, expected);
    // Consumed and acked: a second consume gets nothing.
    let again = silt_cli(&url, &["consume", "orders", "--group", "billing", "--timeout", "300ms"], None);
    assert_eq!(again, "");
    // Replay touches no group and sees everything.
    let replayed = silt_cli(&url, &["replay", "orders"], None);
    assert_eq!(replayed.lines().count(), 2);
    // Pages bounded to one byte hold one message each: the same lines.
    assert_eq!(silt_cli(&url, &["replay", "orders", "--max-bytes", "1"], None), replayed);
    // Each line is the message exactly as the JSON replay shows it, partition after partition.
    let mut shown = Vec::new();
    for p in 0..4 {
        let (status, body) =
            raw(&url, reqwest::Method::GET, &format!("/v1/topics/orders/partitions/{p}/messages"), None)
                .await;
        assert_eq!(status, 200, "{body}");
        shown.extend(body["messages"].as_array().cloned().unwrap_or_default());
    }
    let printed: Vec<serde_json::Value> =
        replayed.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(printed, shown);
    let describe: serde_json::Value =
        serde_json::from_str(&silt_cli(&url, &["topic", "describe", "orders"], None)).expect("describe json");
    assert_eq!(describe["partitions"].as_array().map(Vec::len), Some(4));
    assert!(describe["partitions"][0]["epoch"].as_u64() >= Some(1));
    // Health and metrics.
    let client = dev.client();
    assert_eq!(client.health().await.expect("health")["status"], "ok");
    let metrics = client.metrics().await.expect("metrics");
    assert!(metrics.contains("silt_agent_produce_latency_seconds_bucket"), "{metrics}");
    assert!(metrics.contains("silt_agent_records_in_total{topic=\"orders\"} 2"), "{metrics}");
    // Disk space: measured since the agent started (every 10 s), free space above zero.
    assert!(metrics.contains("silt_agent_local_log_bytes "), "{metrics}");
    let free = metrics
        .lines()
        .find_map(|l| l.strip_prefix("silt_agent_disk_free_bytes ")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no silt_agent_disk_free_bytes in\n{metrics}"));
    assert!(free > 0);
    assert!(metrics.contains("silt_agent_disk_size_bytes "), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_segments_seal_on_age_and_replay_finds_offsets_by_time() {
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "quiet", 1, &[("segment.ms", "200")]).await;
    let messages: Vec<OutMessage> = (0..5)
        .map(|i| OutMessage {
            value: Some(format!("m{i}")),
            timestamp: Some(1_000_000 + i * 1000),
            ..Default::default()
        })
        .collect();
    client.produce("quiet", &messages).await.expect("produce");
    // No more messages arrive, yet the segment seals once it is segment.ms old.
    let sealed = wait_for("the quiet segment to seal", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let t = client.describe_topic("quiet").await.ok()?;
            let segments = t["partitions"][0]["segments"].as_array()?.clone();
            segments.iter().find(|s| s["state"] == "sealed").cloned()
        }
    })
    .await;
    assert_eq!(sealed["base_offset"], 0);
    assert_eq!(sealed["last_offset"], 4);
    assert_eq!(sealed["record_count"], 5);
    assert_eq!(sealed["min_timestamp_ms"], 1_000_000);
    assert_eq!(sealed["max_timestamp_ms"], 1_004_000);
    // Replay by time: the first message at or after the time, then everything after it.
    let page = client.replay("quiet", 0, None, Some(1_002_500), 10).await.expect("replay by time");
    let offsets: Vec<u64> = page.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![3, 4]);
    let page = client.replay("quiet", 0, None, Some(0), 10).await.expect("replay from the start");
    assert_eq!(page.messages.len(), 5);
    let page = client.replay("quiet", 0, None, Some(2_000_000), 10).await.expect("replay past the end");
    assert!(page.messages.is_empty());
    // A read starting inside the batch returns records from that offset on.
    let page = client.replay("quiet", 0, Some(2), None, 10).await.expect("replay mid-batch");
    let values: Vec<&str> = page.messages.iter().filter_map(|m| m.value.as_deref()).collect();
    assert_eq!(values, vec!["m2", "m3", "m4"]);
}

/// `silt topic alter`: requests use the new values at once, the running writer on its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altered_topic_configs_apply_to_requests_and_to_the_running_writer() {
    let dev = SiltDev::start();
    let url = dev.url().to_string();
    let client = dev.client();
    // The default segment.ms is ten minutes.
    create(&client, "tuned", 1, &[]).await;
    let message = |value: String| OutMessage { value: Some(value), ..Default::default() };
    client.produce("tuned", &[message("a".into())]).await.expect("produce");
    let big = message("x".repeat(4096));
    client.produce("tuned", std::slice::from_ref(&big)).await.expect("4 KiB fits the default limit");

    let altered = silt_cli(
        &url,
        &["topic", "alter", "tuned", "--config", "segment.ms=200", "--config", "max.message.bytes=2048"],
        None,
    );
    let altered: serde_json::Value = serde_json::from_str(&altered).expect("the topic as JSON");
    assert_eq!(altered["config"]["segment.ms"], "200");
    assert_eq!(altered["config"]["max.message.bytes"], "2048");

    // The writer's open segment seals without another message, as a 200 ms segment does.
    let sealed = wait_for("the open segment to seal on the new segment.ms", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let t = client.describe_topic("tuned").await.ok()?;
            let segments = t["partitions"][0]["segments"].as_array()?.clone();
            segments.iter().find(|s| s["state"] != "open").cloned()
        }
    })
    .await;
    assert_eq!((sealed["base_offset"].as_u64(), sealed["last_offset"].as_u64()), (Some(0), Some(1)));
    // The new limit holds at once; a message within it is accepted.
    match client.produce("tuned", &[big]).await {
        Err(ClientError::Api { code, .. }) => assert_eq!(code, "message_too_large"),
        other => panic!("a 4 KiB message past max.message.bytes=2048: {other:?}"),
    }
    client.produce("tuned", &[message("y".repeat(1024))]).await.expect("within the new limit");
    let values: Vec<usize> = replay_all(&client, "tuned", 1)
        .await
        .iter()
        .map(|m| m.value.as_deref().map_or(0, str::len))
        .collect();
    assert_eq!(values, vec![1, 4096, 1024]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topic_is_gone_and_a_recreated_one_starts_empty() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    create(&client, "temp", 2, &[]).await;
    let messages: Vec<OutMessage> =
        (0..10).map(|i| OutMessage { value: Some(format!("m{i}")), ..Default::default() }).collect();
    client.produce("temp", &messages).await.expect("produce");
    client.poll("temp", &poll_req("g", "m", "exclusive", 5, 1000)).await.expect("poll");
    client.delete_topic("temp").await.expect("delete");
    let err = client.describe_topic("temp").await.expect_err("deleted");
    assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err}");
    let err = client.delete_topic("temp").await.expect_err("deleted twice");
    assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err}");
    create(&client, "temp", 2, &[]).await;
    assert!(replay_all(&client, "temp", 2).await.is_empty(), "a re-created topic starts empty");
    // Also after a restart: the old incarnation's files must not come back.
    dev.stop();
    dev.restart();
    let client = dev.client();
    assert!(replay_all(&client, "temp", 2).await.is_empty());
    let ids = client
        .produce(
            "temp",
            &[OutMessage { partition: Some(1), value: Some("new".into()), ..Default::default() }],
        )
        .await
        .expect("produce");
    assert_eq!(ids, vec!["temp/1/0".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_built_record_batch_is_stored_as_sent() {
    use silt_record::{BatchBuilder, Header, NewRecord};
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "binary", 2, &[]).await;
    let mut builder = BatchBuilder::new();
    for i in 0..3i64 {
        builder.push(NewRecord {
            timestamp_ms: 1_700_000_000_000 + i,
            key: (i != 1).then(|| bytes::Bytes::from(vec![0xff, i as u8])),
            value: Some(bytes::Bytes::from(format!("payload-{i}"))),
            headers: vec![Header { key: "h".into(), value: Some(bytes::Bytes::from_static(b"\x00\x01")) }],
        });
    }
    let batch = builder.build().expect("batch");
    let batch_bytes = batch.clone();
    assert_eq!(client.produce_batch("binary", 1, batch.clone()).await.expect("produce batch"), (0, 2));
    assert_eq!(client.produce_batch("binary", 1, batch).await.expect("produce batch"), (3, 5));
    let page = client.replay("binary", 1, Some(0), None, 10).await.expect("replay");
    assert_eq!(page.messages.len(), 6);
    let m = &page.messages[4];
    assert_eq!((m.offset, m.timestamp), (4, 1_700_000_000_001));
    assert_eq!((m.key.as_deref(), m.key_b64.as_deref()), (None, None), "a null key stays null");
    assert_eq!(page.messages[3].key_b64.as_deref(), Some("/wA="), "non-UTF-8 keys come back as base64");
    assert_eq!(m.value.as_deref(), Some("payload-1"));
    assert_eq!(m.headers[0].value.as_deref(), Some("\u{0}\u{1}"));
    // A batch with a bad CRC is refused and changes nothing.
    let mut bad = silt_record::encode_batch(&[NewRecord {
        timestamp_ms: 0,
        key: None,
        value: Some(bytes::Bytes::from_static(b"x")),
        headers: vec![],
    }])
    .expect("batch")
    .to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let err = client.produce_batch("binary", 1, bytes::Bytes::from(bad)).await.expect_err("corrupt batch");
    assert!(
        matches!(err, ClientError::Api { status: 400, ref code, .. } if code == "invalid_record_batch"),
        "{err}"
    );
    assert_eq!(client.replay("binary", 1, Some(0), None, 10).await.expect("replay").high_watermark, 6);

    // Read back as record batches: the same records, byte for byte, from any offset on.
    let sent: Vec<silt_record::Record> =
        silt_record::RecordBatch::parse(batch_bytes.clone()).expect("parse").records().collect();
    let page = client.read_batches("binary", 1, Some(0), None, 10).await.expect("read batches");
    assert_eq!((page.next_offset, page.high_watermark), (6, 6));
    let offsets: Vec<u64> = page.records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..6).collect::<Vec<_>>());
    for (got, want) in page.records.iter().zip(sent.iter().chain(&sent)) {
        assert_eq!(
            (&got.key, &got.value, &got.headers, got.timestamp_ms),
            (&want.key, &want.value, &want.headers, want.timestamp_ms)
        );
    }
    let page = client.read_batches("binary", 1, Some(4), None, 1).await.expect("read from inside a batch");
    assert_eq!(page.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![4]);
    assert_eq!(page.next_offset, 5);
    // From a time: the first record at or after it, then everything after it.
    let page =
        client.read_batches("binary", 1, None, Some(1_700_000_000_002), 10).await.expect("read by time");
    assert_eq!(page.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    let page = client.read_batches("binary", 0, Some(0), None, 10).await.expect("read an empty partition");
    assert!(page.records.is_empty());
    // Bad reads get the same clear errors as the JSON replay.
    for (topic, from_offset, from_time, max, status, want) in [
        ("binary", Some(0), None, 0, 400, "invalid_max"),
        ("binary", Some(0), None, 10_001, 400, "invalid_max"),
        ("binary", Some(0), Some(5), 10, 400, "invalid_query"),
        ("missing", Some(0), None, 10, 404, "unknown_topic"),
    ] {
        let err = client.read_batches(topic, 1, from_offset, from_time, max).await.expect_err("bad read");
        assert!(
            matches!(err, ClientError::Api { status: s, ref code, .. } if s == status && code == want),
            "{topic} {from_offset:?} {from_time:?} {max}: {err}"
        );
    }
}

/// Value bytes of a page of messages (they have no key and no headers here).
fn value_bytes(messages: &[Message]) -> usize {
    messages.iter().map(|m| m.value.as_ref().map_or(0, String::len)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_poll_pages_stay_within_max_bytes() {
    let dev = SiltDev::start();
    let client = dev.client();
    create(&client, "big", 1, &[]).await;
    // 40 messages of 100,000 bytes, then one of 900,000 (under max.message.bytes).
    let mut sizes = vec![100_000; 40];
    sizes.push(900_000);
    for chunk in sizes.chunks(10) {
        let messages: Vec<OutMessage> =
            chunk.iter().map(|&n| OutMessage { value: Some("x".repeat(n)), ..Default::default() }).collect();
        client.produce("big", &messages).await.expect("produce");
    }
    let url = dev.url();
    let page = |from: u64, max_bytes: usize| async move {
        let path =
            format!("/v1/topics/big/partitions/0/messages?from_offset={from}&max=1000&max_bytes={max_bytes}");
        let (status, body) = raw(url, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{body}");
        let messages: Vec<Message> = serde_json::from_value(body["messages"].clone()).expect("messages");
        (messages, body["next_offset"].as_u64().expect("next_offset"))
    };

    // A page holds what fits, and continues where it stopped.
    let (messages, next) = page(0, 350_000).await;
    assert_eq!(messages.iter().map(|m| m.offset).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(next, 3);
    // Paging through the partition returns every message once, in order, each page within the
    // limit unless it holds a single message larger than it.
    let (mut from, mut offsets) = (0, Vec::new());
    loop {
        let (messages, next) = page(from, 350_000).await;
        if messages.is_empty() {
            break;
        }
        assert!(messages.len() == 1 || value_bytes(&messages) <= 350_000, "{} bytes", value_bytes(&messages));
        offsets.extend(messages.iter().map(|m| m.offset));
        from = next;
    }
    assert_eq!(offsets, (0..41).collect::<Vec<u64>>());
    // A message larger than the limit comes back alone rather than never.
    let (messages, next) = page(40, 350_000).await;
    assert_eq!((messages.len(), value_bytes(&messages), next), (1, 900_000, 41));
    let (messages, _) = page(0, 1).await;
    assert_eq!(messages.len(), 1);
    // The default is 8 MiB: all 41 messages (4.9 MB) in one page.
    let replayed = client.replay("big", 0, Some(0), None, 1000).await.expect("replay");
    assert_eq!(replayed.messages.len(), 41);
    // A client bounds its replays' pages the same way, JSON or record batches.
    let bounded = client.clone().with_read_max_bytes(350_000);
    let replayed = bounded.replay("big", 0, Some(0), None, 1000).await.expect("replay");
    assert_eq!((replayed.messages.len(), replayed.next_offset), (3, 3));
    let batches = bounded.read_batches("big", 0, Some(3), None, 1000).await.expect("read batches");
    let offsets: Vec<u64> = batches.records.iter().map(|r| r.offset).collect();
    assert_eq!((offsets, batches.next_offset), (vec![3, 4, 5], 6));

    // Polls stay within their max_bytes too, and deliver everything exactly once.
    let mut delivered = HashSet::new();
    while delivered.len() < 41 {
        let poll = Poll { max_bytes: Some(250_000), ..poll_req("g", "m", "exclusive", 1000, 5000) };
        let got = client.poll("big", &poll).await.expect("poll");
        assert!(!got.is_empty(), "poll timed out at {} of 41", delivered.len());
        assert!(got.len() == 1 || value_bytes(&got) <= 250_000, "{} bytes", value_bytes(&got));
        let ids: Vec<String> = got.iter().map(|m| m.id.clone()).collect();
        client.ack("g", &ids).await.expect("ack");
        for m in &got {
            assert!(delivered.insert(m.offset), "offset {} delivered twice", m.offset);
        }
    }

    // Redeliveries keep to it as well: what does not fit waits for the next poll, and is not
    // counted as delivered meanwhile.
    create(&client, "redo", 1, &[("visibility.timeout.ms", "2000")]).await;
    let messages: Vec<OutMessage> =
        (0..6).map(|_| OutMessage { value: Some("y".repeat(100_000)), ..Default::default() }).collect();
    client.produce("redo", &messages).await.expect("produce");
    let first = client.poll("redo", &poll_req("r", "m", "exclusive", 1000, 5000)).await.expect("poll");
    assert_eq!(first.len(), 6, "not acked, so each comes back after the visibility timeout");
    let mut redelivered = Vec::new();
    while redelivered.len() < 6 {
        let poll = Poll { max_bytes: Some(250_000), ..poll_req("r", "m", "exclusive", 1000, 10_000) };
        let got = client.poll("redo", &poll).await.expect("poll");
        assert!(!got.is_empty(), "redelivery timed out at {} of 6", redelivered.len());
        assert!(value_bytes(&got) <= 250_000, "{} bytes redelivered in one poll", value_bytes(&got));
        redelivered.extend(got.iter().map(|m| (m.offset, m.delivery)));
    }
    assert_eq!(redelivered, (0..6).map(|o| (o, Some(2))).collect::<Vec<_>>());

    // A max_bytes out of range is refused, and changes nothing.
    for path in [
        "/v1/topics/big/partitions/0/messages?max_bytes=0".to_string(),
        format!("/v1/topics/big/partitions/0/messages?max_bytes={}", 64 * 1024 * 1024 + 1),
        "/v1/topics/big/partitions/0/batches?max_bytes=0".to_string(),
    ] {
        let (status, body) = raw(url, reqwest::Method::GET, &path, None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_max_bytes")),
            "{path}: {body}"
        );
    }
    let (status, body) =
        raw(url, reqwest::Method::POST, "/v1/topics/big/poll", Some(r#"{"group":"g2","max_bytes":0}"#)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_max_bytes")), "{body}");
    let lag = client.describe_group("g2").await;
    assert!(lag.is_err(), "the refused poll created group g2: {lag:?}");
}
