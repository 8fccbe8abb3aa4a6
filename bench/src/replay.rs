//! The `replay` workload on Silt: write a volume, wait until the compactor has archived all of
//! it as Parquet and the agent has dropped its local copies, then read it all back through the
//! binary replay API (`GET .../batches`, one reader per partition) and, next to it, GET the same objects from the same
//! store with a plain program.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::future::try_join_all;
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use silt::client::Client;

use crate::load::{random_text, ProduceTarget};
use crate::proc_stats::ProcMark;
use crate::silt_system::{SiltProducer, SiltServer};
use crate::workload::{ReplaySpec, Workload};

/// What a cold replay measured.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ReplayResult {
    /// Messages written and read back.
    pub messages: u64,
    /// Bytes of message values written.
    pub value_bytes: u64,
    /// Time to write them (acknowledged), seconds.
    pub produce_s: f64,
    /// Time from the first write until everything was archived, seconds.
    pub archive_s: f64,
    /// Archived objects.
    pub objects: u64,
    /// Bytes of the Parquet objects.
    pub object_bytes: u64,
    /// Bytes of the segments they came from (RecordBatch v2 as on the agent's disk).
    pub raw_bytes: u64,
    /// object_bytes / raw_bytes.
    pub parquet_size_ratio: f64,
    /// PUT requests (single PUTs, multipart creates, parts and completes) while archiving.
    pub puts: u64,
    /// PUTs per GiB of message values.
    pub puts_per_gib: f64,
    /// GET requests (whole and ranged) while replaying.
    pub gets: u64,
    /// GETs per GiB of message values.
    pub gets_per_gib: f64,
    /// Bytes the cold reader fetched from the store while replaying / object_bytes: near 1
    /// proves the replay read the bucket, not local copies.
    pub cold_fetched_fraction: f64,
    /// Cold reads while replaying that did not continue where an earlier read of the object
    /// ended (`silt_tiering_cold_reads_total{pattern="random"}`): 0 when each reader's pages
    /// follow one another, as they do; more means they lost their readahead.
    #[serde(default)]
    pub random_cold_reads: u64,
    /// Replay time, seconds.
    pub replay_s: f64,
    /// Replay throughput in object bytes per second (MB/s), comparable with the raw GET.
    pub replay_object_mb_per_s: f64,
    /// Replay throughput in message-value bytes per second (MB/s).
    pub replay_value_mb_per_s: f64,
    /// Replay throughput in messages per second.
    pub replay_msgs_per_s: f64,
    /// Standard deviation over the mean of the readers' own throughputs (each partition's
    /// reader, all running at once): the replay's noise within the run.
    #[serde(default)]
    pub reader_cv: f64,
    /// Plain GETs of every object, the same concurrency, best of two passes (MB/s).
    pub raw_get_mb_per_s: f64,
    /// replay_object_mb_per_s / raw_get_mb_per_s.
    pub replay_to_get: f64,
    /// A plain program's GETs of every object, each decoded into Arrow record batches with the
    /// parquet crate (every column, as DataFusion or pyarrow read the archive) on the blocking
    /// pool, one task per partition as in the replay (MB/s of objects): what reading the
    /// archive costs on this machine without serving it.
    #[serde(default)]
    pub get_and_decode_mb_per_s: f64,
    /// CPU seconds of that decoding alone (the decoding threads' own time), per GB of message
    /// values: the floor of the server's replay CPU per GB.
    #[serde(default)]
    pub decode_cpu_s_per_gb: f64,
    /// Server CPU seconds while writing and archiving, per GB of message values.
    pub write_and_archive_cpu_s_per_gb: f64,
    /// Server CPU seconds while replaying, per GB of message values.
    pub replay_cpu_s_per_gb: f64,
    /// Peak resident memory of the server while replaying, MiB.
    pub replay_peak_rss_mib: f64,
}

/// Rows per Arrow batch when the plain program decodes an object (the cold reader's too).
const DECODE_BATCH_ROWS: usize = 8192;

/// Sum of a Prometheus counter over the label sets whose text contains `label` (all if empty).
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (n, rest) = key.split_once('{').unwrap_or((key, ""));
            (n == name && (labels.is_empty() || labels.iter().any(|want| rest.contains(want))))
                .then(|| value.parse::<f64>().ok().map(|v| v as u64))?
        })
        .sum()
}

const PUT_OPS: [&str; 4] =
    ["op=\"put\"", "op=\"put_part\"", "op=\"multipart_create\"", "op=\"multipart_complete\""];
const GET_OPS: [&str; 2] = ["op=\"get\"", "op=\"get_range\""];

fn local_log_bytes(dir: &Path) -> u64 {
    fn walk(dir: &Path, total: &mut u64) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, total);
            } else if p.extension().is_some_and(|x| x == "log") {
                *total += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    let mut total = 0;
    walk(dir, &mut total);
    total
}

/// Runs the replay workload against a running `silt dev` whose bucket is `store_url`.
pub async fn run(
    server: &SiltServer,
    w: &Workload,
    spec: &ReplaySpec,
    topic: &str,
    replication: u32,
    store_url: &str,
) -> anyhow::Result<ReplayResult> {
    let client = server.client()?;
    client.create_topic(topic, w.partitions, &w.silt_topic_config(replication)).await?;
    let per_message = w.message_bytes as u64;
    let messages = spec.total_mib * 1024 * 1024 / per_message;
    let mut r = ReplayResult { messages, value_bytes: messages * per_message, ..ReplayResult::default() };
    let gb = r.value_bytes as f64 / 1e9;
    let gib = r.value_bytes as f64 / f64::from(1u32 << 30);

    // Write.
    let metrics_before = client.metrics().await?;
    let mark = ProcMark::start(&[server.pid()])?;
    let start = Instant::now();
    let target = Arc::new(SiltProducer {
        client: client.clone(),
        topics: vec![topic.to_string()],
        partitions_per_topic: w.partitions,
    });
    let per_producer = messages.div_ceil(u64::from(spec.producers));
    let writers = (0..spec.producers).map(|p| {
        let target = Arc::clone(&target);
        let message_bytes = w.message_bytes;
        let partitions = w.partitions;
        let batch = u64::from(spec.batch_messages);
        async move {
            let first = u64::from(p) * per_producer;
            let end = (first + per_producer).min(messages);
            let mut k = first;
            let mut turn = p;
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (u64::from(p) + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
            while k < end {
                let n = batch.min(end - k);
                let payloads: Vec<Bytes> = (0..n).map(|_| random_text(message_bytes, &mut rng)).collect();
                target.send(turn % partitions, payloads).await?;
                turn += spec.producers;
                k += n;
            }
            anyhow::Ok(())
        }
    });
    try_join_all(writers).await.context("writing the replay volume")?;
    r.produce_s = start.elapsed().as_secs_f64();

    // Wait until everything is archived and the local copies are gone.
    let deadline = start + spec.archive_timeout;
    loop {
        let objects = client.archive_list(topic).await?;
        let archived: u64 = objects.iter().filter_map(|o| o["records"].as_u64()).sum();
        if archived >= messages {
            r.archive_s = start.elapsed().as_secs_f64();
            r.objects = objects.len() as u64;
            r.object_bytes = objects.iter().filter_map(|o| o["bytes"].as_u64()).sum();
            r.raw_bytes = objects.iter().filter_map(|o| o["raw_bytes"].as_u64()).sum();
            break;
        }
        if Instant::now() > deadline {
            bail!("only {archived} of {messages} messages archived after {:?}", spec.archive_timeout);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let write_use = mark.finish()?;
    r.write_and_archive_cpu_s_per_gb = write_use.server_cpu_s / gb;
    let metrics_archived = client.metrics().await?;
    r.puts = metric_sum(&metrics_archived, "silt_tiering_object_requests_total", &PUT_OPS)
        - metric_sum(&metrics_before, "silt_tiering_object_requests_total", &PUT_OPS);
    r.puts_per_gib = r.puts as f64 / gib;
    r.parquet_size_ratio = r.object_bytes as f64 / r.raw_bytes.max(1) as f64;
    let log_dir = server.data_dir().join("agent").join("log");
    while local_log_bytes(&log_dir) > 1 << 20 {
        if Instant::now() > deadline {
            bail!("the agent still holds {} bytes of local segments", local_log_bytes(&log_dir));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Replay, one reader per partition.
    let before = client.metrics().await?;
    let mark = ProcMark::start(&[server.pid()])?;
    let start = Instant::now();
    let readers = (0..w.partitions).map(|p| read_partition(&client, topic, p, spec.page_messages));
    let counts = try_join_all(readers).await.context("replaying")?;
    r.replay_s = start.elapsed().as_secs_f64();
    let replay_use = mark.finish()?;
    let after = client.metrics().await?;
    let read: u64 = counts.iter().map(|c| c.0).sum();
    let read_bytes: u64 = counts.iter().map(|c| c.1).sum();
    let rates: Vec<f64> = counts.iter().map(|c| c.1 as f64 / c.2.max(1e-9)).collect();
    r.reader_cv = crate::report::coefficient_of_variation(&rates);
    if read != messages || read_bytes != r.value_bytes {
        bail!(
            "replay returned {read} messages ({read_bytes} bytes), not {messages} ({} bytes)",
            r.value_bytes
        );
    }
    r.gets = metric_sum(&after, "silt_tiering_object_requests_total", &GET_OPS)
        - metric_sum(&before, "silt_tiering_object_requests_total", &GET_OPS);
    r.gets_per_gib = r.gets as f64 / gib;
    let fetched = metric_sum(&after, "silt_tiering_cold_fetched_bytes_total", &[])
        - metric_sum(&before, "silt_tiering_cold_fetched_bytes_total", &[]);
    r.cold_fetched_fraction = fetched as f64 / r.object_bytes.max(1) as f64;
    r.random_cold_reads = metric_sum(&after, "silt_tiering_cold_reads_total", &["pattern=\"random\""])
        - metric_sum(&before, "silt_tiering_cold_reads_total", &["pattern=\"random\""]);
    r.replay_object_mb_per_s = r.object_bytes as f64 / r.replay_s / 1e6;
    r.replay_value_mb_per_s = r.value_bytes as f64 / r.replay_s / 1e6;
    r.replay_msgs_per_s = messages as f64 / r.replay_s;
    r.replay_cpu_s_per_gb = replay_use.server_cpu_s / gb;
    r.replay_peak_rss_mib = replay_use.server_peak_rss_bytes as f64 / f64::from(1u32 << 20);

    // The same objects by plain GETs from the same store, one reader per partition.
    let objects = client.archive_list(topic).await?;
    let store = silt_tiering::store_url::object_store_from_url(store_url)?;
    let mut best: f64 = 0.0;
    for _ in 0..2 {
        best = best.max(raw_get(&store.store, &objects, w.partitions).await?);
    }
    r.raw_get_mb_per_s = best;
    r.replay_to_get = r.replay_object_mb_per_s / best.max(f64::MIN_POSITIVE);
    let decoded = get_and_decode(&store.store, &objects, w.partitions).await?;
    if decoded.rows != messages {
        bail!("decoding the archive gave {} rows, not {messages}", decoded.rows);
    }
    r.get_and_decode_mb_per_s = decoded.object_bytes as f64 / decoded.seconds / 1e6;
    r.decode_cpu_s_per_gb = decoded.decode_cpu_s / gb;
    client.delete_topic(topic).await?;
    Ok(r)
}

/// Reads one partition from its start to its end: messages, value bytes and seconds taken.
async fn read_partition(
    client: &Client,
    topic: &str,
    partition: u32,
    page: usize,
) -> anyhow::Result<(u64, u64, f64)> {
    let started = Instant::now();
    let mut from = 0;
    let mut n = 0u64;
    let mut bytes = 0u64;
    loop {
        let p = client.read_batches(topic, partition, Some(from), None, page).await?;
        n += p.records.len() as u64;
        bytes += p.records.iter().map(|r| r.value.as_ref().map_or(0, |v| v.len() as u64)).sum::<u64>();
        from = p.next_offset;
        if p.records.is_empty() || from >= p.high_watermark {
            return Ok((n, bytes, started.elapsed().as_secs_f64()));
        }
    }
}

/// The keys of a partition's objects, in the archive listing's order.
fn partition_keys(objects: &[serde_json::Value], partition: u32) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["partition"].as_u64() == Some(u64::from(partition)))
        .filter_map(|o| o["object_key"].as_str().map(str::to_string))
        .collect()
}

/// GETs every object once, one task per partition reading its objects in order; MB/s.
async fn raw_get(
    store: &Arc<dyn ObjectStore>,
    objects: &[serde_json::Value],
    partitions: u32,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let tasks = (0..partitions).map(|p| {
        let keys = partition_keys(objects, p);
        let store = Arc::clone(store);
        async move {
            let mut total = 0u64;
            for k in keys {
                total += store.get(&object_store::path::Path::from(k)).await?.bytes().await?.len() as u64;
            }
            anyhow::Ok(total)
        }
    });
    let total: u64 = try_join_all(tasks).await?.into_iter().sum();
    Ok(total as f64 / start.elapsed().as_secs_f64() / 1e6)
}

/// What [`get_and_decode`] measured.
struct Decoded {
    rows: u64,
    object_bytes: u64,
    seconds: f64,
    decode_cpu_s: f64,
}

/// GETs every object, one task per partition reading its objects in order, and decodes each
/// with the parquet crate on the blocking pool, so that GETs and decoding of different
/// partitions overlap on both cores as the replay's do.
async fn get_and_decode(
    store: &Arc<dyn ObjectStore>,
    objects: &[serde_json::Value],
    partitions: u32,
) -> anyhow::Result<Decoded> {
    let start = Instant::now();
    let tasks = (0..partitions).map(|p| {
        let keys = partition_keys(objects, p);
        let store = Arc::clone(store);
        async move {
            let (mut rows, mut bytes, mut cpu) = (0u64, 0u64, 0.0f64);
            for k in keys {
                let object = store.get(&object_store::path::Path::from(k.as_str())).await?.bytes().await?;
                bytes += object.len() as u64;
                let (n, s) = tokio::task::spawn_blocking(move || decode_object(object))
                    .await?
                    .with_context(|| format!("decoding {k}"))?;
                rows += n;
                cpu += s;
            }
            anyhow::Ok((rows, bytes, cpu))
        }
    });
    let parts = try_join_all(tasks).await?;
    Ok(Decoded {
        rows: parts.iter().map(|p| p.0).sum(),
        object_bytes: parts.iter().map(|p| p.1).sum(),
        seconds: start.elapsed().as_secs_f64(),
        decode_cpu_s: parts.iter().map(|p| p.2).sum(),
    })
}

/// Decodes a whole Parquet object into Arrow record batches: rows, and the CPU seconds this
/// thread spent on it.
fn decode_object(object: Bytes) -> anyhow::Result<(u64, f64)> {
    let cpu = crate::proc_stats::thread_cpu_s()?;
    let reader =
        ParquetRecordBatchReaderBuilder::try_new(object)?.with_batch_size(DECODE_BATCH_ROWS).build()?;
    let mut rows = 0u64;
    for batch in reader {
        rows += batch?.num_rows() as u64;
    }
    Ok((rows, crate::proc_stats::thread_cpu_s()? - cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_filter_by_label() {
        let text = "# HELP x\nsilt_tiering_object_requests_total{op=\"put\"} 3\n\
                    silt_tiering_object_requests_total{op=\"get_range\"} 5\n\
                    silt_tiering_object_requests_total{op=\"get\"} 2\n\
                    silt_tiering_cold_fetched_bytes_total 1000\n";
        assert_eq!(metric_sum(text, "silt_tiering_object_requests_total", &PUT_OPS), 3);
        assert_eq!(metric_sum(text, "silt_tiering_object_requests_total", &GET_OPS), 7);
        assert_eq!(metric_sum(text, "silt_tiering_cold_fetched_bytes_total", &[]), 1000);
    }
}
