//! End-to-end tiering tests: a real `silt dev` archives to a local folder, to SeaweedFS and to
//! LocalStack; everything is replayed through Silt, read with pyarrow and DuckDB outside Silt,
//! and replayed again after metadata is rebuilt from the bucket alone.
//!
//! The S3 emulators and the Python tools are started by `scripts/test.sh`, which exports
//! `SILT_TEST_SEAWEEDFS_ENDPOINT`, `SILT_TEST_LOCALSTACK_ENDPOINT` and `SILT_TEST_PYTHON`. Without
//! them (running `cargo test` by hand) those parts are skipped with a message, except under
//! `CI=true`, where a missing emulator is a failure. `SILT_TEST_ARCHIVE_MIB` sets how much each
//! round trip produces (default 8 MiB).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use silt::client::{Client, HeaderOut, Message, OutMessage, Poll};
use silt_tests::{silt_bin, wait_for, DevOptions, SiltDev};

const TOPIC: &str = "clicks";
const PARTITIONS: u32 = 2;
/// Thirty days before the test runs: older than the default `retention.ms` (7 days), so a
/// topic whose `retention.ms=-1` were lost (by a rebuild) would lose its archive at once.
fn base_ts() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| now_ms() - 30 * 24 * 3600 * 1000)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Local,
    SeaweedFs,
    LocalStack,
}

/// Where the archive of a backend is, for the tools outside Silt.
#[derive(Clone, Debug)]
enum ArchiveAt {
    Dir,
    S3 { bucket_prefix: String, endpoint: String },
}

fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{var} is not set: run the suite with scripts/test.sh, which starts the emulators"
            );
            eprintln!("skipping: {var} is not set (scripts/test.sh sets it)");
            None
        }
    }
}

/// Topic configs from name/value pairs.
fn topic_config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn unique_prefix() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("run-{}-{nanos}", std::process::id())
}

fn backend(b: Backend, faults: bool) -> Option<(DevOptions, ArchiveAt)> {
    let mut options = DevOptions::default();
    if faults {
        options.env.push(("SILT_TEST_OBJECT_STORE_FAULTS".into(), "error_rate=0.2,seed=11".into()));
    }
    let (endpoint, secret) = match b {
        Backend::Local => return Some((options, ArchiveAt::Dir)),
        Backend::SeaweedFs => (required("SILT_TEST_SEAWEEDFS_ENDPOINT")?, "testsecret"),
        Backend::LocalStack => (required("SILT_TEST_LOCALSTACK_ENDPOINT")?, "test"),
    };
    let bucket_prefix = format!("silt-test/{}", unique_prefix());
    options.object_store = Some(format!("s3://{bucket_prefix}"));
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
    ] {
        options.env.push((k.into(), v.into()));
    }
    Some((options, ArchiveAt::S3 { bucket_prefix, endpoint }))
}

/// One produced record, as the tools outside Silt must see it.
#[derive(Clone, Debug, PartialEq)]
struct Expected {
    partition: u32,
    offset: u64,
    timestamp: i64,
    key: Option<String>,
    value: String,
    headers: Vec<(String, String)>,
}

fn message_for(i: usize, value_bytes: usize) -> OutMessage {
    let key = (!i.is_multiple_of(7)).then(|| format!("user-{}", i % 50));
    let mut value = format!("click {i} ");
    while value.len() < value_bytes {
        value.push_str(&format!("{:x}", (i * 2_654_435_761) % 0xffff_ffff));
    }
    value.truncate(value_bytes);
    let headers = if i.is_multiple_of(3) {
        vec![HeaderOut { key: "source".into(), value: format!("web-{}", i % 5) }]
    } else {
        vec![]
    };
    OutMessage { partition: None, key, value: Some(value), headers, timestamp: Some(base_ts() + i as i64) }
}

async fn produce_all(client: &Client, count: usize) -> Vec<Expected> {
    let mut expected = Vec::with_capacity(count);
    for start in (0..count).step_by(500) {
        let messages: Vec<OutMessage> =
            (start..(start + 500).min(count)).map(|i| message_for(i, 1000)).collect();
        let ids = client.produce(TOPIC, &messages).await.expect("produce");
        for (id, m) in ids.iter().zip(messages) {
            let mut parts = id.rsplitn(3, '/');
            let offset: u64 = parts.next().and_then(|o| o.parse().ok()).expect("offset");
            let partition: u32 = parts.next().and_then(|p| p.parse().ok()).expect("partition");
            expected.push(Expected {
                partition,
                offset,
                timestamp: m.timestamp.expect("timestamp"),
                key: m.key,
                value: m.value.expect("value"),
                headers: m.headers.into_iter().map(|h| (h.key, h.value)).collect(),
            });
        }
    }
    expected.sort_by_key(|e| (e.partition, e.offset));
    expected
}

fn as_expected(m: &Message) -> Expected {
    Expected {
        partition: m.partition,
        offset: m.offset,
        timestamp: m.timestamp,
        key: m.key.clone(),
        value: m.value.clone().unwrap_or_default(),
        headers: m.headers.iter().map(|h| (h.key.clone(), h.value.clone().unwrap_or_default())).collect(),
    }
}

async fn replay_all(client: &Client) -> Vec<Expected> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let mut from = 0;
        loop {
            let page = client.replay(TOPIC, p, Some(from), None, 5000).await.expect("replay");
            if page.messages.is_empty() {
                break;
            }
            from = page.next_offset;
            out.extend(page.messages.iter().map(as_expected));
        }
    }
    out
}

/// Every record of the topic through the binary replay (`GET .../batches`).
async fn read_all_batches(client: &Client) -> Vec<Expected> {
    let text = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| String::from_utf8(b.to_vec()).expect("utf8"));
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let mut from = 0;
        loop {
            let page = client.read_batches(TOPIC, p, Some(from), None, 5000).await.expect("read batches");
            if page.records.is_empty() {
                break;
            }
            from = page.next_offset;
            out.extend(page.records.iter().map(|r| Expected {
                partition: p,
                offset: r.offset,
                timestamp: r.timestamp_ms,
                key: text(&r.key),
                value: text(&r.value).unwrap_or_default(),
                headers:
                    r.headers.iter().map(|h| (h.key.clone(), text(&h.value).unwrap_or_default())).collect(),
            }));
        }
    }
    out
}

/// Reads a partition from its start in binary pages of at most `max_bytes`: the pages read and
/// the offsets they held.
async fn read_limited_pages(client: &Client, partition: u32, max_bytes: usize) -> (u64, Vec<u64>) {
    let limited = client.clone().with_read_max_bytes(max_bytes);
    let (mut from, mut pages, mut got) = (0u64, 0u64, Vec::new());
    loop {
        let page =
            limited.read_batches(TOPIC, partition, Some(from), None, 5000).await.expect("read batches");
        let Some(last) = page.records.last() else { break };
        let bytes: usize = page.records.iter().map(|r| r.data_len()).sum();
        assert!(bytes <= max_bytes, "a page of at most {max_bytes} bytes returned {bytes}");
        from = last.offset + 1;
        got.extend(page.records.iter().map(|r| r.offset));
        pages += 1;
    }
    (pages, got)
}

/// The agent's cold reads so far: (sequential, random).
async fn cold_reads(client: &Client) -> (u64, u64) {
    let sequential = cold_counter(client, "silt_tiering_cold_reads_total{pattern=\"sequential\"} ").await;
    (sequential, cold_counter(client, "silt_tiering_cold_reads_total{pattern=\"random\"} ").await)
}

/// The value of the agent's metric line that starts with `name` (with its labels and a space).
async fn cold_counter(client: &Client, name: &str) -> u64 {
    let metrics = client.metrics().await.expect("metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

async fn archived_records(client: &Client) -> (u64, usize) {
    let objects = client.archive_list(TOPIC).await.expect("archive ls");
    (objects.iter().filter_map(|o| o["records"].as_u64()).sum(), objects.len())
}

fn local_log_files(data_dir: &Path) -> usize {
    let root = data_dir.join("agent").join("log");
    let Ok(topics) = std::fs::read_dir(&root) else { return 0 };
    let mut n = 0;
    for t in topics.flatten() {
        for p in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
            n += std::fs::read_dir(p.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.path().extension().is_some_and(|e| e == "log"))
                .count();
        }
    }
    n
}

fn verify_with_pyarrow(dev: &SiltDev, at: &ArchiveAt, expected: &[Expected], objects: usize) {
    let Some(python) = required("SILT_TEST_PYTHON") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("expected.jsonl");
    let mut f = std::fs::File::create(&file).expect("expected file");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    for e in expected {
        let line = serde_json::json!({
            "topic": TOPIC,
            "partition": e.partition,
            "offset": e.offset,
            "timestamp": e.timestamp,
            "key_b64": e.key.as_deref().map(b64),
            "value_b64": b64(&e.value),
            "headers": e.headers.iter().map(|(k, v)| vec![k.clone(), b64(v)]).collect::<Vec<_>>(),
        });
        writeln!(f, "{line}").expect("write expected");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("verify_archive.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(&file).args(["--objects", &objects.to_string()]);
    match at {
        ArchiveAt::Dir => {
            cmd.arg("--dir").arg(dev.data_dir().join("objects"));
        }
        ArchiveAt::S3 { bucket_prefix, endpoint } => {
            cmd.args(["--s3", bucket_prefix, "--endpoint", endpoint]);
            cmd.envs(dev.options().env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
    }
    let out = cmd.output().expect("run verify_archive.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "reading the archive outside Silt failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), format!("ok {}", expected.len()));
}

fn rebuild_metadata(dev: &SiltDev) -> serde_json::Value {
    rebuild_metadata_with(dev, &[]).expect("rebuild-metadata")
}

/// Runs `silt archive rebuild-metadata` on the stopped `dev`: its report, or what it printed
/// when it refused.
fn rebuild_metadata_with(dev: &SiltDev, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new(silt_bin());
    cmd.args(["archive", "rebuild-metadata", "--data-dir"]).arg(dev.data_dir()).args(args);
    if let Some(url) = &dev.options().object_store {
        cmd.args(["--object-store", url]);
    }
    cmd.envs(
        dev.options()
            .env
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let out = cmd.output().expect("run silt archive rebuild-metadata");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("rebuild report"))
}

async fn round_trip(backend_kind: Backend, faults: bool) {
    let Some((options, at)) = backend(backend_kind, faults) else { return };
    let mib: usize = std::env::var("SILT_TEST_ARCHIVE_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let count = mib * 1024;
    let mut dev = SiltDev::start_with(options);
    let client = dev.client();
    let config = topic_config(&[
        ("segment.bytes", "262144"),
        ("segment.ms", "300"),
        ("local.retention.ms", "0"),
        ("retention.ms", "-1"),
    ]);
    client.create_topic(TOPIC, PARTITIONS, &config).await.expect("create topic");
    let expected = produce_all(&client, count).await;
    assert_eq!(expected.len(), count);

    // Everything is archived (the last segments seal on segment.ms once producing stops) ...
    let (_, objects) = wait_for("every record to be archived", Duration::from_secs(300), || {
        let client = client.clone();
        async move {
            let (records, objects) = archived_records(&client).await;
            (records == count as u64).then_some((records, objects))
        }
    })
    .await;
    // ... and the agents drop their local copies, keeping only each partition's open segment.
    wait_for("local copies to be dropped", Duration::from_secs(60), || {
        let n = local_log_files(dev.data_dir());
        async move { (n <= PARTITIONS as usize).then_some(()) }
    })
    .await;

    // Replayed through Silt, from the archive: identical, in order, at the same offsets.
    let replayed = replay_all(&client).await;
    assert_eq!(replayed.len(), expected.len());
    for (got, want) in replayed.iter().zip(&expected) {
        assert_eq!(got, want);
    }
    // The same as record batches.
    let read = read_all_batches(&client).await;
    assert_eq!(read.len(), expected.len());
    for (got, want) in read.iter().zip(&expected) {
        assert_eq!(got, want);
    }
    // Pages that end on a byte limit each continue the one before: the agent's cold reads
    // stay sequential (read ahead, and kept out of the disk cache), none looks like a seek.
    let before = cold_reads(&client).await;
    let (pages, got) = read_limited_pages(&client, 0, 300_000).await;
    let want: Vec<u64> = expected.iter().filter(|e| e.partition == 0).map(|e| e.offset).collect();
    assert_eq!(got, want);
    assert!(pages >= 10, "the byte limit ended the pages: {pages} pages");
    let after = cold_reads(&client).await;
    assert_eq!(after.1, before.1, "byte-limited pages read as seeks: {before:?} then {after:?}");
    assert!(after.0 >= before.0 + pages, "{pages} pages, sequential reads {before:?} then {after:?}");
    // A new group starting at the earliest offset reads from the archive transparently.
    let mut consumed: HashMap<(u32, u64), Expected> = HashMap::new();
    while consumed.len() < count {
        let poll = Poll {
            group: "late-joiner".into(),
            member: "m".into(),
            mode: "exclusive".into(),
            max: 5000,
            max_bytes: Some(300_000),
            timeout_ms: 5000,
            session_timeout_ms: 30_000,
        };
        let batch = client.poll(TOPIC, &poll).await.expect("poll");
        assert!(!batch.is_empty(), "poll timed out at {} of {count}", consumed.len());
        // Polls of archived data stay within their max_bytes.
        let bytes: usize = batch
            .iter()
            .map(as_expected)
            .map(|e| {
                e.key.map_or(0, |k| k.len())
                    + e.value.len()
                    + e.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            })
            .sum();
        assert!(bytes <= 300_000, "a poll returned {bytes} bytes");
        let ids: Vec<String> = batch.iter().map(|m| m.id.clone()).collect();
        client.ack("late-joiner", &ids).await.expect("ack");
        for m in &batch {
            assert!(consumed.insert((m.partition, m.offset), as_expected(m)).is_none(), "delivered twice");
        }
    }
    for e in &expected {
        assert_eq!(consumed.get(&(e.partition, e.offset)), Some(e));
    }
    // Replay by time finds the first record at or after the time in the archive.
    let t = base_ts() + (count / 2) as i64;
    let page = client.replay(TOPIC, 0, None, Some(t), 1).await.expect("replay by time");
    let want = expected.iter().find(|e| e.partition == 0 && e.timestamp >= t).expect("a record after t");
    assert_eq!(page.messages.first().map(as_expected).as_ref(), Some(want));

    // Outside Silt: pyarrow and DuckDB read the same records from the bucket, no object twice.
    verify_with_pyarrow(&dev, &at, &expected, objects);

    // Metadata lost: rebuilt from the objects' footers alone, the replay is still identical.
    dev.stop();
    std::fs::remove_dir_all(dev.data_dir().join("metadata")).expect("delete metadata");
    let report = rebuild_metadata(&dev);
    assert_eq!(report["restored"].as_u64(), Some(objects as u64), "{report}");
    assert_eq!(report["skipped"].as_array().map(Vec::len), Some(0), "{report}");
    dev.restart();
    let client = dev.client();
    // Pages that end inside an object, from a restarted agent (nothing decoded yet): the objects
    // hold one row group each, so what the agent reads ahead it reads from the next object,
    // started in the background while a page ends near the end of one.
    let pages = read_limited_pages(&client, 0, 100_000).await;
    assert!(pages.0 >= 20, "the byte limit ended the pages: {} pages", pages.0);
    let read_ahead = cold_counter(&client, "silt_tiering_cold_readahead_row_groups_total ").await;
    eprintln!("{read_ahead} row groups read ahead over {} pages", pages.0);
    assert!(read_ahead > 0, "no archived object was read ahead over {} pages", pages.0);
    let replayed = replay_all(&client).await;
    assert_eq!(replayed.len(), expected.len());
    for (got, want) in replayed.iter().zip(&expected) {
        assert_eq!(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_round_trip_local_folder() {
    round_trip(Backend::Local, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_round_trip_local_folder_with_faults() {
    round_trip(Backend::Local, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_round_trip_seaweedfs() {
    round_trip(Backend::SeaweedFs, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_round_trip_seaweedfs_with_faults() {
    round_trip(Backend::SeaweedFs, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_round_trip_localstack() {
    round_trip(Backend::LocalStack, false).await;
}

/// Produces `count` messages of 1,000 bytes to partition 0 of `topic`, stamped from `ts` on,
/// 20 to a request (a batch each, so that segments can roll between them): their offsets.
async fn produce_to(client: &Client, topic: &str, count: usize, ts: i64) -> Vec<u64> {
    let messages: Vec<OutMessage> = (0..count)
        .map(|i| OutMessage {
            partition: Some(0),
            value: Some(format!("{i:01000}")),
            timestamp: Some(ts + i as i64),
            ..Default::default()
        })
        .collect();
    let mut offsets = Vec::with_capacity(count);
    for chunk in messages.chunks(20) {
        let ids = client.produce(topic, chunk).await.expect("produce");
        offsets.extend(
            ids.iter().map(|id| id.rsplit('/').next().and_then(|o| o.parse::<u64>().ok()).expect("offset")),
        );
    }
    offsets
}

/// Waits until the archive of `topic` holds `records` records.
async fn wait_archived(client: &Client, topic: &str, records: u64) {
    wait_for(&format!("{records} records of {topic} archived"), Duration::from_secs(120), || {
        let client = client.clone();
        let topic = topic.to_string();
        async move {
            let objects = client.archive_list(&topic).await.expect("archive ls");
            let n: u64 = objects.iter().filter_map(|o| o["records"].as_u64()).sum();
            (n == records).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_restores_topic_configs_refuses_to_drop_unarchived_data_and_never_reuses_an_offset() {
    let options = DevOptions { args: vec!["--agents".into(), "3".into()], ..DevOptions::default() };
    let mut dev = SiltDev::start_with(options);
    let client = dev.client();
    // Segments roll on size only: the last one stays open, on the agents' disks only.
    let config = topic_config(&[
        ("replication.factor", "3"),
        ("segment.bytes", "65536"),
        ("segment.ms", "3600000"),
        ("retention.ms", "-1"),
        ("local.retention.ms", "0"),
    ]);
    client.create_topic("kept", 1, &config).await.expect("create");
    client.alter_topic_config("kept", &topic_config(&[("max.deliveries", "9")])).await.expect("alter");
    // A month old: the default retention.ms would delete all of it.
    let produced = produce_to(&client, "kept", 300, base_ts()).await;
    assert_eq!(produced, (0..300).collect::<Vec<u64>>());
    // Every sealed segment archived: what is left is the open segment's.
    let archived = wait_for("every sealed segment archived", Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            let t = client.describe_topic("kept").await.expect("describe");
            let sealed: u64 = t["partitions"][0]["segments"]
                .as_array()?
                .iter()
                .filter(|s| s["state"] != "open")
                .map(|s| s["record_count"].as_u64().unwrap_or(0))
                .sum();
            let objects = client.archive_list("kept").await.expect("archive ls");
            let n: u64 = objects.iter().filter_map(|o| o["records"].as_u64()).sum();
            (n == sealed && n > 0).then_some(n)
        }
    })
    .await;
    assert!(archived < 300, "the open segment holds the last records: {archived} archived");
    let before = client.describe_topic("kept").await.expect("describe");

    dev.stop();
    std::fs::remove_dir_all(dev.data_dir().join("metadata")).expect("delete metadata");
    let refused = rebuild_metadata_with(&dev, &[]).expect_err("a rebuild that would drop acknowledged data");
    assert!(refused.contains(&format!("kept/0: offsets {archived}..300")), "{refused}");
    assert!(refused.contains("--discard-unarchived"), "{refused}");
    assert!(!dev.data_dir().join("metadata").exists(), "a refused rebuild changed metadata");
    assert!(dev.data_dir().join("agent").join("log").is_dir(), "a refused rebuild moved the local logs");

    let report = rebuild_metadata_with(&dev, &["--discard-unarchived"]).expect("rebuild");
    assert_eq!(report["topics"], serde_json::json!(["kept"]), "{report}");
    assert_eq!(report["undescribed_topics"], serde_json::json!([]), "{report}");
    // One line for each agent holding a replica of the open segment.
    assert_eq!(report["discarded_unarchived"].as_array().map(Vec::len), Some(3), "{report}");
    assert_eq!(report["moved_local_data"].as_array().map(Vec::len), Some(3), "{report}");
    dev.restart();
    let client = dev.client();
    let after = client.describe_topic("kept").await.expect("describe");
    assert_eq!(after["config"], before["config"], "configs after the rebuild");
    assert_eq!(after["id"], before["id"]);
    assert_eq!(after["config"]["replication.factor"], "3");
    assert_eq!(after["config"]["retention.ms"], "-1");
    assert_eq!(after["config"]["segment.bytes"], "65536");

    // The offsets of the discarded messages are never handed out again.
    client.alter_topic_config("kept", &topic_config(&[("segment.ms", "200")])).await.expect("alter");
    let next = produce_to(&client, "kept", 1, now_ms()).await;
    assert_eq!(next, [300]);
    // Two more archive rounds, each followed by retention: the month-old archive stays.
    wait_archived(&client, "kept", archived + 1).await;
    let last = produce_to(&client, "kept", 1, now_ms()).await;
    assert_eq!(last, [301]);
    wait_archived(&client, "kept", archived + 2).await;
    let mut offsets = Vec::new();
    loop {
        let from = offsets.last().map_or(0, |o| o + 1);
        let page = client.replay("kept", 0, Some(from), None, 1000).await.expect("replay");
        if page.messages.is_empty() {
            break;
        }
        offsets.extend(page.messages.iter().map(|m| m.offset));
    }
    let want: Vec<u64> = (0..archived).chain([300, 301]).collect();
    assert_eq!(offsets, want);
}

/// A replay whose page runs from one archived object into another that cannot be read answers
/// the records it read, ending where it stopped; the replay that starts at the unreadable
/// object is refused with the reason, and nothing is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_answers_what_it_read_before_an_archived_object_it_cannot_read() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    let config = topic_config(&[("segment.ms", "200"), ("local.retention.ms", "0"), ("retention.ms", "-1")]);
    client.create_topic("two", 1, &config).await.expect("create");
    // One request each, so one segment and one object each.
    assert_eq!(produce_to(&client, "two", 20, now_ms()).await, (0..20).collect::<Vec<u64>>());
    wait_archived(&client, "two", 20).await;
    assert_eq!(produce_to(&client, "two", 20, now_ms()).await, (20..40).collect::<Vec<u64>>());
    wait_archived(&client, "two", 40).await;
    wait_for("local copies to be dropped", Duration::from_secs(60), || {
        let n = local_log_files(dev.data_dir());
        async move { (n <= 1).then_some(()) }
    })
    .await;
    let objects = client.archive_list("two").await.expect("archive ls");
    let second = objects
        .iter()
        .find(|o| o["base_offset"] == 20)
        .and_then(|o| o["object_key"].as_str())
        .unwrap_or_else(|| panic!("an object from offset 20: {objects:?}"))
        .to_string();
    dev.stop();
    // The second object is gone from the bucket, and nothing is cached.
    let file = silt_tests::files_under(&dev.data_dir().join("objects"))
        .into_iter()
        .find(|f| f.to_string_lossy().ends_with(&second))
        .unwrap_or_else(|| panic!("{second} in the bucket"));
    std::fs::remove_file(&file).expect("remove the object");
    let _ = std::fs::remove_dir_all(dev.data_dir().join("cache"));
    dev.restart();
    let client = dev.client();

    let page = client.replay("two", 0, Some(0), None, 100).await.expect("a replay from 0");
    assert_eq!(page.messages.iter().map(|m| m.offset).collect::<Vec<u64>>(), (0..20).collect::<Vec<u64>>());
    assert_eq!(page.next_offset, 20, "the next replay starts where this one stopped");
    match client.replay("two", 0, Some(20), None, 100).await {
        Err(silt::client::ClientError::Api { status: 503, message, .. }) => {
            assert!(message.contains("reading archived data"), "{message}")
        }
        other => panic!("a replay of the unreadable object: {other:?}"),
    }
}

/// Eight replays at once from offset 0 of a freshly restored archive, round after round (the
/// agent restarted each time, so nothing is decoded yet), each round under a deadline: the
/// readers meet each other's readahead in the decoded cache all the time, which once froze a
/// whole agent. `SILT_TEST_REPLAY_ROUNDS` rounds (default 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replays_of_a_restored_archive_never_freeze_the_agent() {
    let rounds: usize =
        std::env::var("SILT_TEST_REPLAY_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(30).max(1);
    // Two runtime threads, as on the smallest machines, whatever this one has.
    let options =
        DevOptions { env: vec![("TOKIO_WORKER_THREADS".into(), "2".into())], ..DevOptions::default() };
    let mut dev = SiltDev::start_with(options);
    let client = dev.client();
    let config = topic_config(&[
        ("segment.bytes", "131072"),
        ("segment.ms", "300"),
        ("local.retention.ms", "0"),
        ("retention.ms", "-1"),
    ]);
    client.create_topic(TOPIC, PARTITIONS, &config).await.expect("create topic");
    let expected = produce_all(&client, 1024).await;
    wait_archived_all(&client, expected.len() as u64).await;
    wait_for("local copies to be dropped", Duration::from_secs(60), || {
        let n = local_log_files(dev.data_dir());
        async move { (n <= PARTITIONS as usize).then_some(()) }
    })
    .await;
    dev.stop();
    std::fs::remove_dir_all(dev.data_dir().join("metadata")).expect("delete metadata");
    rebuild_metadata(&dev);
    let want = |p: u32| expected.iter().filter(|e| e.partition == p).map(|e| e.offset).collect::<Vec<u64>>();
    for round in 0..rounds {
        dev.restart();
        let client = Client::with_timeout(dev.url(), Duration::from_secs(30)).expect("client");
        let mut replays = tokio::task::JoinSet::new();
        for r in 0..8u32 {
            let client = client.clone();
            replays.spawn(async move {
                let partition = r % PARTITIONS;
                let offsets = if r % 4 < 2 {
                    // JSON pages.
                    let (mut from, mut got) = (0u64, Vec::new());
                    loop {
                        let page =
                            client.replay(TOPIC, partition, Some(from), None, 150).await.expect("replay");
                        if page.messages.is_empty() {
                            break got;
                        }
                        from = page.next_offset;
                        got.extend(page.messages.iter().map(|m| m.offset));
                    }
                } else {
                    // Binary pages ending on a byte limit, which read the next object ahead.
                    read_limited_pages(&client, partition, 50_000).await.1
                };
                (partition, offsets)
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(60), async {
            let mut out = Vec::new();
            while let Some(done) = replays.join_next().await {
                out.push(done.expect("replay task"));
            }
            out
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: eight replays did not finish within 60 s"));
        for (partition, offsets) in all {
            assert_eq!(offsets, want(partition), "round {round}, partition {partition}");
        }
        let read_ahead = cold_counter(&client, "silt_tiering_cold_readahead_row_groups_total ").await;
        assert!(read_ahead > 0, "round {round}: nothing was read ahead");
        dev.stop();
    }
}

/// Waits until the archive of [`TOPIC`] holds `records` records.
async fn wait_archived_all(client: &Client, records: u64) {
    wait_for("every record to be archived", Duration::from_secs(120), || {
        let client = client.clone();
        async move { (archived_records(&client).await.0 == records).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_expired_archives_and_replay_skips_them() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    let config = topic_config(&[
        ("segment.bytes", "65536"),
        ("segment.ms", "200"),
        ("retention.ms", "3600000"),
        // Local copies would be kept for an hour: only retention can remove them.
        ("local.retention.ms", "3600000"),
    ]);
    client.create_topic("old", 1, &config).await.expect("create");
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    // Two hours old: past retention.ms as soon as it is archived.
    let old: Vec<OutMessage> = (0..400)
        .map(|i| OutMessage {
            value: Some(format!("{i:01000}")),
            timestamp: Some(now - 7_200_000 + i),
            ..Default::default()
        })
        .collect();
    // Several requests, so several segments (a segment rolls between batches, never inside one).
    for chunk in old.chunks(50) {
        client.produce("old", chunk).await.expect("produce");
    }
    let objects = dev.data_dir().join("objects").join("topic=old").join("partition=0");
    let parquet_files = |dir: &Path| {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|f| f.path().extension().is_some_and(|e| e == "parquet")).count())
            .unwrap_or(0)
    };
    // Archived first (objects appear and metadata lists them) ...
    let metrics_say = |name: &'static str| {
        let client = client.clone();
        async move {
            let text = client.metrics().await.ok()?;
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        }
    };
    let archived = wait_for("the old segments to be archived", Duration::from_secs(60), || async {
        metrics_say("silt_compactor_segments_archived_total").await.filter(|n| *n >= 2)
    })
    .await;
    // ... then expired: metadata forgets them and the objects are deleted.
    wait_for("the expired archives to be deleted", Duration::from_secs(60), || async {
        let expired = metrics_say("silt_compactor_segments_expired_total").await?;
        let listed = client.archive_list("old").await.ok()?.len();
        (expired >= archived && listed == 0 && parquet_files(&objects) == 0).then_some(())
    })
    .await;
    // The agent drops its local copies of the deleted segments on its next tick.
    wait_for("expired records to be gone from replay", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let page = client.replay("old", 0, Some(0), None, 100).await.ok()?;
            page.messages.is_empty().then_some(())
        }
    })
    .await;
    // A clean restart closes the partition's empty open segment, the only one retention left
    // in its chain: the log still continues at 400, never at 0 again.
    dev.stop();
    dev.restart();
    let client = dev.client();
    // New data is served from where the log continues; the expired range is skipped.
    let ids = wait_for("a produce after the restart", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            client
                .produce(
                    "old",
                    &[OutMessage { value: Some("fresh".into()), timestamp: Some(now), ..Default::default() }],
                )
                .await
                .ok()
        }
    })
    .await;
    assert_eq!(ids, vec!["old/0/400".to_string()]);
    let page = client.replay("old", 0, Some(0), None, 100).await.expect("replay");
    let got: Vec<(u64, Option<String>)> = page.messages.iter().map(|m| (m.offset, m.value.clone())).collect();
    assert_eq!(got, vec![(400, Some("fresh".to_string()))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_init_creates_and_configures_the_bucket() {
    let Some(endpoint) = required("SILT_TEST_LOCALSTACK_ENDPOINT") else { return };
    let bucket = format!("silt-init-{}", std::process::id());
    let run = || {
        let out = Command::new(silt_bin())
            .args(["bucket", "init", &format!("s3://{bucket}/archive"), "--versioning"])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &endpoint)
            .output()
            .expect("run silt bucket init");
        assert!(out.status.success(), "bucket init failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("report")
    };
    let first = run();
    let steps: BTreeMap<String, String> = first["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (s[0].as_str().unwrap_or_default().to_string(), s[1].as_str().unwrap_or_default().to_string())
        })
        .collect();
    assert_eq!(steps["create bucket"], "created", "{first}");
    for step in ["block public access", "default encryption", "lifecycle", "versioning"] {
        assert_eq!(steps[step], "applied", "{step}: {first}");
    }
    // Running it again changes nothing and succeeds.
    let second = run();
    assert_eq!(second["steps"][0][1], "exists", "{second}");
    // Read the settings back from the store itself.
    let http = reqwest::Client::new();
    let get = |q: &'static str| {
        let http = http.clone();
        let url = format!("{endpoint}/{bucket}?{q}");
        async move { http.get(url).send().await.expect("get").text().await.expect("body") }
    };
    assert!(get("encryption").await.contains("AES256"));
    let lifecycle = get("lifecycle").await;
    assert!(lifecycle.contains("<DaysAfterInitiation>1</DaysAfterInitiation>"), "{lifecycle}");
    assert!(lifecycle.contains("<Prefix>archive</Prefix>"), "{lifecycle}");
    assert!(get("versioning").await.contains("Enabled"));
    let pab = get("publicAccessBlock").await;
    assert!(pab.contains("<BlockPublicAcls>true</BlockPublicAcls>"), "{pab}");
    // A URL that is not s3:// is refused with a clear message.
    let out = Command::new(silt_bin()).args(["bucket", "init", "file:///tmp/x"]).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an s3:// URL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_topic_deletes_its_objects_and_a_new_topic_of_that_name_archives_anew() {
    let dev = SiltDev::start();
    let client = dev.client();
    let config = topic_config(&[("segment.bytes", "8192"), ("segment.ms", "200"), ("retention.ms", "-1")]);
    let objects = dev.data_dir().join("objects").join("topic=gone").join("partition=0");
    let parquet_files = |dir: &Path| {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|f| f.path().extension().is_some_and(|e| e == "parquet")).count())
            .unwrap_or(0)
    };
    let produce_and_archive = |label: &'static str| {
        let client = client.clone();
        let config = config.clone();
        async move {
            client.create_topic("gone", 1, &config).await.expect("create");
            for chunk in 0..4 {
                let messages: Vec<OutMessage> = (0..20)
                    .map(|i| OutMessage {
                        value: Some(format!("{label}-{chunk}-{i:0500}")),
                        ..Default::default()
                    })
                    .collect();
                client.produce("gone", &messages).await.expect("produce");
            }
            wait_for("the topic to be archived", Duration::from_secs(60), || {
                let client = client.clone();
                async move {
                    let objects = client.archive_list("gone").await.ok()?;
                    let records: u64 = objects.iter().filter_map(|o| o["records"].as_u64()).sum();
                    (records == 80).then_some(objects.len())
                }
            })
            .await
        }
    };
    let first = produce_and_archive("old").await;
    assert_eq!(parquet_files(&objects), first);
    // An object with a key from before ids were part of keys (no metadata points at it).
    std::fs::write(objects.join("00000000000000000900-00000000000000000901.parquet"), b"old").expect("write");
    client.delete_topic("gone").await.expect("delete");
    assert_eq!(parquet_files(&objects), 0, "a deleted topic's objects are deleted");
    // The same name again: same offsets, same object keys, new contents.
    let second = produce_and_archive("new").await;
    assert_eq!(parquet_files(&objects), second);
    let page = client.replay("gone", 0, Some(0), None, 100).await.expect("replay");
    assert_eq!(page.messages.len(), 80);
    assert!(page.messages.iter().all(|m| m.value.as_deref().is_some_and(|v| v.starts_with("new-"))));
    // Every key names the new incarnation's id.
    let id = client.describe_topic("gone").await.expect("describe")["id"].as_u64().expect("id");
    let names: Vec<String> = std::fs::read_dir(&objects)
        .expect("objects")
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(&format!("-t{id}.parquet"))), "{names:?}");
    // A rebuild brings back the new topic only, with its id.
    let mut dev = dev;
    dev.stop();
    std::fs::remove_dir_all(dev.data_dir().join("metadata")).expect("delete metadata");
    let report = rebuild_metadata(&dev);
    assert_eq!(report["restored"].as_u64(), Some(second as u64), "{report}");
    dev.restart();
    let client = dev.client();
    assert_eq!(client.describe_topic("gone").await.expect("describe")["id"].as_u64(), Some(id));
    let page = client.replay("gone", 0, Some(0), None, 100).await.expect("replay");
    assert_eq!(page.messages.len(), 80);
    assert!(page.messages.iter().all(|m| m.value.as_deref().is_some_and(|v| v.starts_with("new-"))));
}

/// A bucket that refuses the mark saying a topic is deleted: the topic is deleted in metadata,
/// and its objects stay whole in the bucket (a rebuild would bring it back whole, never in part);
/// a new topic of that name archives beside them under its own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topic_whose_mark_the_bucket_refuses_keeps_its_objects() {
    let dev = SiltDev::start_with(DevOptions {
        env: vec![("SILT_TEST_OBJECT_STORE_FAULTS".into(), "fail_puts_to=deleted.json".into())],
        ..DevOptions::default()
    });
    let client = dev.client();
    let config = topic_config(&[("segment.bytes", "8192"), ("segment.ms", "200"), ("retention.ms", "-1")]);
    let objects = dev.data_dir().join("objects").join("topic=kept").join("partition=0");
    let parquet_files = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|f| f.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".parquet"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let mut ids = Vec::new();
    for label in ["old", "new"] {
        client.create_topic("kept", 1, &config).await.expect("create");
        ids.push(client.describe_topic("kept").await.expect("describe")["id"].as_u64().expect("id"));
        let messages: Vec<OutMessage> = (0..40)
            .map(|i| OutMessage { value: Some(format!("{label}-{i:0500}")), ..Default::default() })
            .collect();
        client.produce("kept", &messages).await.expect("produce");
        wait_for("the topic to be archived", Duration::from_secs(60), || async {
            let objects = client.archive_list("kept").await.ok()?;
            (objects.iter().filter_map(|o| o["records"].as_u64()).sum::<u64>() == 40).then_some(())
        })
        .await;
        if label == "old" {
            let before = parquet_files(&objects);
            assert!(!before.is_empty());
            client.delete_topic("kept").await.expect("delete");
            assert!(client.describe_topic("kept").await.is_err(), "deleted in metadata");
            assert_eq!(parquet_files(&objects), before, "its objects are kept whole");
            assert!(dev
                .log()
                .contains("marking the topic deleted in the bucket failed; its objects are kept"));
        }
    }
    let names = parquet_files(&objects);
    for id in &ids {
        assert!(names.iter().any(|n| n.ends_with(&format!("-t{id}.parquet"))), "t{id} in {names:?}");
    }
    let page = client.replay("kept", 0, Some(0), None, 100).await.expect("replay");
    assert_eq!(page.messages.len(), 40);
    assert!(page.messages.iter().all(|m| m.value.as_deref().is_some_and(|v| v.starts_with("new-"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_while_archiving_loses_nothing_and_archives_nothing_twice() {
    let mut dev = SiltDev::start();
    let client = dev.client();
    let config = topic_config(&[
        ("segment.bytes", "65536"),
        ("segment.ms", "300"),
        ("local.retention.ms", "0"),
        ("retention.ms", "-1"),
    ]);
    client.create_topic(TOPIC, PARTITIONS, &config).await.expect("create topic");
    let count = 6000;
    let expected = produce_all(&client, count).await;
    // Kill -9 once archiving is under way (usually mid-way; the checks hold either way).
    wait_for("archiving to start", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let (records, _) = archived_records(&client).await;
            (records > 0).then_some(())
        }
    })
    .await;
    dev.kill9();
    dev.restart();
    let client = dev.client();
    let objects = wait_for("every record to be archived after the restart", Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            let (records, objects) = archived_records(&client).await;
            (records == count as u64).then_some(objects)
        }
    })
    .await;
    let on_disk = std::fs::read_dir(dev.data_dir().join("objects").join(format!("topic={TOPIC}")))
        .expect("objects")
        .flatten()
        .flat_map(|p| std::fs::read_dir(p.path()).into_iter().flatten().flatten())
        .filter(|f| f.path().extension().is_some_and(|e| e == "parquet"))
        .count();
    assert_eq!(on_disk, objects, "every object in the bucket is one metadata points at");
    let replayed = replay_all(&client).await;
    assert_eq!(replayed.len(), expected.len());
    for (got, want) in replayed.iter().zip(&expected) {
        assert_eq!(got, want);
    }
}
