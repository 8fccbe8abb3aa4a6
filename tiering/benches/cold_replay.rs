//! Cold replay of an archived segment next to a plain GET of the same object, measured in the
//! same run so the ratio replay/GET means something, plus the archive's size against the raw
//! record batches and the PUT requests it costs.
//!
//! - **Data:** 65,536 records of exactly 1 KiB each as a RecordBatch v2 record (64 MiB of
//!   records): a 16-byte key (`cust-` and 11 digits, 100,000 distinct customers), one header
//!   `trace-id` with a 16-byte hex value, and a 973-byte JSON-like value: order fields with
//!   random numbers, a 128-character random base64 token and a note of words drawn from a
//!   64-word vocabulary (so the value compresses, but not to nothing). Timestamps are 1 ms
//!   apart. Seeded, so every run archives the same bytes.
//! - **Raw bytes:** the same records encoded with `silt_record::BatchBuilder` in batches of at
//!   most 64 KiB, which is what the agent keeps on disk and what the compactor counts as
//!   `raw_bytes_archived`.
//! - **Archive:** `encode_archive` with `ArchiveWriterOptions::default()`, uploaded the way the
//!   compactor does with its default settings (one conditional PUT up to 256 MiB), through an
//!   `InstrumentedObjectStore` that counts the real requests, then its footer is read back.
//! - **`raw_get`:** `store.get(key).bytes()` of the whole object.
//! - **`replay`:** every record through `ColdReader::read` in pages of 10,000 records, with a new
//!   memory-only `ColdReader` (default options) for each pass, so every row group and the footer
//!   are fetched again. Throughput is counted in the same object bytes as `raw_get`.
//!   `SILT_BENCH_PAGE_RECORDS` changes the page size (the replay API's default is 1,000),
//!   `SILT_BENCH_READAHEAD_BYTES` the reader's `readahead_bytes` (0 turns readahead off).
//! - **`replay_warm_cache`** (file store only): the same with a reader whose cache already holds
//!   every row group, so it measures decoding alone.
//!
//! Stores: a `file://` temporary directory always; when `SILT_BENCH_S3_ENDPOINT` is set (one
//! endpoint or several separated by commas, e.g. `http://127.0.0.1:8333`), also
//! `s3://$SILT_BENCH_S3_BUCKET/bench-<unique>` (bucket `silt-test` by default, it must exist) on
//! each endpoint, with `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` from the environment. The
//! objects are deleted at the end.
//!
//! Run with `cargo bench -p silt-tiering --bench cold_replay`; results are in
//! docs/benchmarks.md.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, WriteMultipart};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_record::{BatchBuilder, Header, NewRecord, Record};
use silt_tiering::store_url::object_store_from_url_with_env;
use silt_tiering::{
    encode_archive, object_key, read_archive_meta, ArchiveMeta, ArchiveWriterOptions, ColdReader,
    ColdReaderOptions, InstrumentedObjectStore, ObjectStoreStats,
};

/// Records archived: 64 MiB of 1 KiB records.
const RECORDS: usize = 64 * 1024;
/// With these sizes a record encodes to exactly 1 KiB in a batch of up to 64 records.
const KEY_BYTES: usize = 16;
const HEADER_KEY: &str = "trace-id";
const VALUE_BYTES: usize = 973;
const RECORD_BYTES: usize = 1024;
/// Raw record batches are at most this large (what producers and the agent write).
const BATCH_BYTES_MAX: usize = 64 * 1024;
/// Records per `ColdReader::read` call, unless `SILT_BENCH_PAGE_RECORDS` says otherwise.
const PAGE_RECORDS: usize = 10_000;
const BASE_OFFSET: u64 = 1_000_000;
const TOPIC: &str = "bench";

/// Default `segment.bytes` (metadata/src/topic_config.rs): one segment, one object.
const SEGMENT_BYTES_DEFAULT: u64 = 128 * 1024 * 1024;
/// `CompactorConfig::default().single_put_bytes_max` (compactor/src/compactor.rs).
const SINGLE_PUT_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// `CompactorConfig::default().part_bytes`.
const PART_BYTES: usize = 64 * 1024 * 1024;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

const WORDS: [&str; 64] = [
    "order",
    "shipped",
    "delayed",
    "customer",
    "warehouse",
    "north",
    "south",
    "east",
    "west",
    "express",
    "standard",
    "priority",
    "return",
    "refund",
    "invoice",
    "paid",
    "pending",
    "cancelled",
    "gift",
    "wrap",
    "fragile",
    "handle",
    "with",
    "care",
    "leave",
    "at",
    "door",
    "call",
    "before",
    "delivery",
    "weekend",
    "morning",
    "evening",
    "box",
    "pallet",
    "crate",
    "large",
    "small",
    "medium",
    "blue",
    "red",
    "green",
    "black",
    "white",
    "size",
    "color",
    "discount",
    "coupon",
    "loyalty",
    "member",
    "new",
    "repeat",
    "bulk",
    "single",
    "store",
    "pickup",
    "locker",
    "signature",
    "required",
    "no",
    "yes",
    "the",
    "and",
    "please",
];
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Bytes, records and time of every timed pass, by benchmark name, for the summary.
#[derive(Debug, Clone, Default)]
struct Total {
    name: String,
    bytes: u64,
    records: u64,
    elapsed: Duration,
}

static TOTALS: Mutex<Vec<Total>> = Mutex::new(Vec::new());

fn add_total(name: &str, bytes: u64, records: u64, elapsed: Duration) {
    let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    match totals.iter_mut().find(|t| t.name == name) {
        Some(t) => {
            t.bytes += bytes;
            t.records += records;
            t.elapsed += elapsed;
        }
        None => totals.push(Total { name: name.to_owned(), bytes, records, elapsed }),
    }
}

fn total(name: &str) -> Option<Total> {
    TOTALS.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|t| t.name == name).cloned()
}

fn value(rng: &mut StdRng, i: usize) -> Bytes {
    let mut v = String::with_capacity(VALUE_BYTES + 16);
    let _ = write!(
        v,
        r#"{{"order":{},"customer":"cust-{:011}","status":"{}","currency":"EUR","amount":{}.{:02},"items":["#,
        BASE_OFFSET as usize + i,
        rng.random_range(0..100_000u32),
        WORDS[rng.random_range(0..WORDS.len())],
        rng.random_range(1..10_000u32),
        rng.random_range(0..100u32),
    );
    for n in 0..rng.random_range(1..4) {
        let comma = if n == 0 { "" } else { "," };
        let _ = write!(
            v,
            r#"{comma}{{"sku":"SKU-{:06}","qty":{}}}"#,
            rng.random_range(0..1_000_000u32),
            rng.random_range(1..10u32)
        );
    }
    v.push_str(r#"],"token":""#);
    for _ in 0..128 {
        v.push(char::from(BASE64[rng.random_range(0..BASE64.len())]));
    }
    v.push_str(r#"","note":""#);
    while v.len() < VALUE_BYTES - 2 {
        v.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        v.push(' ');
    }
    v.truncate(VALUE_BYTES - 2);
    v.push_str("\"}");
    Bytes::from(v)
}

/// The records, and the same records as raw batches of at most 64 KiB (returned as their total
/// size).
fn records() -> (Vec<Record>, u64) {
    let mut rng = StdRng::seed_from_u64(0x5117);
    let ts0 = 1_760_000_000_000i64;
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record {
            offset: BASE_OFFSET + i as u64,
            timestamp_ms: ts0 + i as i64,
            key: Some(Bytes::from(format!("cust-{:011}", rng.random_range(0..100_000u32)))),
            value: Some(value(&mut rng, i)),
            headers: vec![Header {
                key: HEADER_KEY.into(),
                value: Some(Bytes::from(format!("{:016x}", rng.random::<u64>()))),
            }],
        })
        .collect();
    assert!(records.iter().all(|r| r.key.as_ref().is_some_and(|k| k.len() == KEY_BYTES)));
    assert!(records.iter().all(|r| r.value.as_ref().is_some_and(|v| v.len() == VALUE_BYTES)));

    let mut raw_bytes = 0u64;
    let mut batches = 0u64;
    let mut builder = BatchBuilder::new();
    for r in &records {
        let new = NewRecord {
            timestamp_ms: r.timestamp_ms,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
        };
        if !builder.is_empty() && builder.encoded_len_with(&new) > BATCH_BYTES_MAX {
            let full = std::mem::take(&mut builder);
            raw_bytes += full.build().expect("the batch builds").len() as u64;
            batches += 1;
        }
        builder.push(new);
    }
    raw_bytes += builder.build().expect("the batch builds").len() as u64;
    batches += 1;
    let header_bytes = raw_bytes - (RECORDS * RECORD_BYTES) as u64;
    assert_eq!(header_bytes % batches, 0, "every record is {RECORD_BYTES} bytes in a batch");
    (records, raw_bytes)
}

fn meta(records: &[Record]) -> ArchiveMeta {
    ArchiveMeta {
        topic: TOPIC.into(),
        partition: 0,
        partitions: 1,
        base_offset: BASE_OFFSET,
        last_offset: BASE_OFFSET + records.len() as u64 - 1,
        record_count: records.len() as u64,
        min_timestamp_ms: records.iter().map(|r| r.timestamp_ms).min().unwrap_or(0),
        max_timestamp_ms: records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0),
    }
}

/// One store under test, with the archived object in it.
struct Target {
    name: String,
    url: String,
    store: Arc<dyn ObjectStore>,
    stats: Arc<ObjectStoreStats>,
    key: Path,
    object_bytes: u64,
    /// Write requests (PUT, multipart create, parts, complete) of the upload.
    upload_writes: u64,
    /// Read requests of the footer check after the upload.
    verify_reads: u64,
}

/// Write requests counted so far.
fn writes(stats: &ObjectStoreStats) -> u64 {
    let s = stats.snapshot();
    s.put + s.multipart_create + s.put_part + s.multipart_complete
}

/// Uploads as the compactor does with its default settings, then reads the footer back.
async fn upload(target: &mut Target, object: &Bytes, meta: &ArchiveMeta) {
    let writes_before = writes(&target.stats);
    if object.len() as u64 <= SINGLE_PUT_BYTES_MAX {
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        target.store.put_opts(&target.key, PutPayload::from(object.clone()), create).await.expect("PUT");
    } else {
        let upload = target.store.put_multipart(&target.key).await.expect("multipart create");
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        writer.put(object.clone());
        writer.finish().await.expect("multipart upload");
    }
    let between = target.stats.snapshot();
    let (stored, _) = read_archive_meta(target.store.as_ref(), &target.key, Some(object.len() as u64))
        .await
        .expect("the footer reads back");
    assert_eq!(&stored, meta);
    target.upload_writes = writes(&target.stats) - writes_before;
    target.verify_reads = target.stats.snapshot().requests() - between.requests();
}

/// Every record of the object through a cold reader, page by page; returns the records read.
async fn replay(reader: &ColdReader, target: &Target, mut check: Option<&[Record]>) -> u64 {
    let page_records = page_records();
    let mut from = BASE_OFFSET;
    let mut count = 0u64;
    loop {
        let page = reader
            .read(target.key.as_ref(), target.object_bytes, from, page_records)
            .await
            .expect("cold read");
        let Some(last) = page.last() else { break };
        from = last.offset + 1;
        if let Some(expected) = check.as_mut() {
            assert_eq!(page.as_slice(), &expected[..page.len()], "replayed records differ");
            *expected = &expected[page.len()..];
        }
        count += page.len() as u64;
    }
    assert_eq!(count, RECORDS as u64, "every record replayed");
    count
}

fn page_records() -> usize {
    std::env::var("SILT_BENCH_PAGE_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(PAGE_RECORDS)
}

/// Default options, but `SILT_BENCH_READAHEAD_BYTES` (0 turns readahead off).
fn reader_options() -> ColdReaderOptions {
    let defaults = ColdReaderOptions::default();
    let readahead_bytes = std::env::var("SILT_BENCH_READAHEAD_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(defaults.readahead_bytes);
    ColdReaderOptions { readahead_bytes, ..defaults }
}

async fn cold_reader(store: &Arc<dyn ObjectStore>) -> ColdReader {
    ColdReader::new(Arc::clone(store), reader_options()).await.expect("cold reader")
}

fn bench_raw_get(group: &mut BenchmarkGroup<'_, WallTime>, rt: &tokio::runtime::Runtime, t: &Target) {
    let name = format!("{}/raw_get", t.name);
    group.bench_function("raw_get", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let bytes = t.store.get(&t.key).await.expect("GET").bytes().await.expect("body");
                    elapsed += started.elapsed();
                    assert_eq!(bytes.len() as u64, t.object_bytes);
                }
                add_total(&name, iters * t.object_bytes, 0, elapsed);
                elapsed
            })
        })
    });
}

fn bench_replay(group: &mut BenchmarkGroup<'_, WallTime>, rt: &tokio::runtime::Runtime, t: &Target) {
    let name = format!("{}/replay", t.name);
    group.bench_function("replay", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                let mut records = 0;
                for _ in 0..iters {
                    // A new reader: empty caches, so the footer and every row group are fetched.
                    let reader = cold_reader(&t.store).await;
                    let started = Instant::now();
                    records += replay(&reader, t, None).await;
                    elapsed += started.elapsed();
                }
                add_total(&name, iters * t.object_bytes, records, elapsed);
                elapsed
            })
        })
    });
}

fn bench_replay_warm(group: &mut BenchmarkGroup<'_, WallTime>, rt: &tokio::runtime::Runtime, t: &Target) {
    let name = format!("{}/replay_warm_cache", t.name);
    let reader = rt.block_on(async {
        let options = ColdReaderOptions { memory_bytes: 4 * t.object_bytes as usize, ..reader_options() };
        let reader = ColdReader::new(Arc::clone(&t.store), options).await.expect("cold reader");
        replay(&reader, t, None).await;
        reader
    });
    group.bench_function("replay_warm_cache", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                let mut records = 0;
                let misses = reader.stats().cache_misses;
                for _ in 0..iters {
                    let started = Instant::now();
                    records += replay(&reader, t, None).await;
                    elapsed += started.elapsed();
                }
                assert_eq!(reader.stats().cache_misses, misses, "the warm cache served everything");
                add_total(&name, iters * t.object_bytes, records, elapsed);
                elapsed
            })
        })
    });
}

/// Opens every store: the file store, and one S3 store per endpoint, with the process's `AWS_*`
/// variables and that endpoint as `AWS_ENDPOINT`.
fn open_targets(dir: &std::path::Path, meta: &ArchiveMeta) -> Vec<Target> {
    let mut targets = Vec::new();
    let process_env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k != "AWS_ENDPOINT")
        .collect();
    let mut open = |name: String, url: String, endpoint: Option<&str>| {
        let mut env = process_env.clone();
        env.extend(endpoint.map(|e| ("AWS_ENDPOINT".to_string(), e.to_string())));
        let opened =
            object_store_from_url_with_env(&url, &env).unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
        let instrumented = InstrumentedObjectStore::new(opened.store);
        let stats = instrumented.stats();
        let key =
            object_key(&opened.prefix, &meta.topic, 1, meta.partition, meta.base_offset, meta.last_offset);
        targets.push(Target {
            name,
            url,
            store: Arc::new(instrumented),
            stats,
            key,
            object_bytes: 0,
            upload_writes: 0,
            verify_reads: 0,
        });
    };
    open("file".into(), format!("file://{}", dir.join("bucket").display()), None);
    if let Ok(endpoints) = std::env::var("SILT_BENCH_S3_ENDPOINT") {
        let bucket = std::env::var("SILT_BENCH_S3_BUCKET").unwrap_or_else(|_| "silt-test".into());
        let unique = format!(
            "bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
        );
        for (i, endpoint) in endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
            let host = endpoint.rsplit('/').next().unwrap_or(endpoint);
            let name = format!("s3_{}", host.rsplit(':').next().unwrap_or(&i.to_string()));
            println!("{name}: s3://{bucket}/{unique} at {endpoint}");
            open(name, format!("s3://{bucket}/{unique}"), Some(endpoint));
        }
    }
    targets
}

fn mb_per_s(t: &Total) -> f64 {
    t.bytes as f64 / t.elapsed.as_secs_f64() / 1e6
}

fn print_summary(targets: &[Target], raw_bytes: u64) {
    println!("\nFrom the total bytes and time of every timed pass (warm-up included); MB = 10^6 bytes,");
    println!("throughput in object bytes for GET and replay alike:");
    println!(
        "{:<10} {:>12} {:>12} {:>11} {:>12} {:>16}",
        "store", "GET MB/s", "replay MB/s", "replay/GET", "records/s", "raw records MB/s"
    );
    for t in targets {
        let (Some(get), Some(replay)) =
            (total(&format!("{}/raw_get", t.name)), total(&format!("{}/replay", t.name)))
        else {
            continue;
        };
        let secs = replay.elapsed.as_secs_f64();
        let raw_rate = replay.records as f64 * (raw_bytes as f64 / RECORDS as f64) / secs / 1e6;
        println!(
            "{:<10} {:>12.1} {:>12.1} {:>11.2} {:>12.0} {:>16.1}",
            t.name,
            mb_per_s(&get),
            mb_per_s(&replay),
            mb_per_s(&replay) / mb_per_s(&get),
            replay.records as f64 / secs,
            raw_rate
        );
        if let Some(warm) = total(&format!("{}/replay_warm_cache", t.name)) {
            println!(
                "{:<10} {:>12} {:>12.1} {:>11.2} {:>12.0} {:>16.1}   (warm cache: decoding only)",
                t.name,
                "",
                mb_per_s(&warm),
                mb_per_s(&warm) / mb_per_s(&get),
                warm.records as f64 / warm.elapsed.as_secs_f64(),
                warm.records as f64 * (raw_bytes as f64 / RECORDS as f64) / warm.elapsed.as_secs_f64() / 1e6
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .configure_from_args();
    let dir = tempfile::Builder::new().prefix("silt-bench-").tempdir().expect("a temporary directory");

    let started = Instant::now();
    let (records, raw_bytes) = records();
    let meta = meta(&records);
    let generated = started.elapsed();
    let started = Instant::now();
    let object = encode_archive(&meta, &records, &ArchiveWriterOptions::default()).expect("encode");
    let encoded = started.elapsed();
    let object_bytes = object.len() as u64;
    let ratio = object_bytes as f64 / raw_bytes as f64;

    let mut targets = open_targets(dir.path(), &meta);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let (footer_rows, row_groups) = rt.block_on(async {
        for t in &mut targets {
            t.object_bytes = object_bytes;
            upload(t, &object, &meta).await;
            // Once, outside timing: the replay returns exactly the archived records.
            let reader = cold_reader(&t.store).await;
            let before = t.stats.snapshot();
            replay(&reader, t, Some(&records)).await;
            let after = t.stats.snapshot();
            let s = reader.stats();
            println!(
                "{} ({}): one cold replay made {} requests ({} GET range calls), fetched {} of {} object bytes; \
                 row groups: {} misses, {} hits, {} read ahead; footers: {} misses",
                t.name,
                t.url,
                after.requests() - before.requests(),
                after.get_range - before.get_range,
                after.bytes_in - before.bytes_in,
                object_bytes,
                s.cache_misses,
                s.cache_hits,
                s.readahead_row_groups,
                s.footer_misses,
            );
        }
        let (_, md) = read_archive_meta(targets[0].store.as_ref(), &targets[0].key, Some(object_bytes))
            .await
            .expect("footer");
        let sizes: Vec<i64> = md.row_groups().iter().map(|rg| rg.total_byte_size()).collect();
        println!("row groups, uncompressed bytes: {sizes:?}");
        (md.file_metadata().num_rows(), md.num_row_groups())
    });
    drop(records);

    println!(
        "\nreplay pages of {} records, readahead_bytes {}",
        page_records(),
        reader_options().readahead_bytes
    );
    println!("records: {RECORDS} of {RECORD_BYTES} bytes (key {KEY_BYTES}, one header, value {VALUE_BYTES}), generated in {generated:.2?}");
    println!("raw record batches (<= 64 KiB each): {raw_bytes} bytes");
    println!(
        "archive: {object_bytes} bytes, {footer_rows} rows in {row_groups} row groups, encoded in {encoded:.2?} ({:.1} MB/s of raw bytes)",
        raw_bytes as f64 / encoded.as_secs_f64() / 1e6
    );
    println!("archive bytes / raw bytes: {ratio:.3}");
    for t in &targets {
        println!(
            "{}: upload made {} write request(s) and the footer check {} read request(s)",
            t.name, t.upload_writes, t.verify_reads
        );
    }
    // With the defaults a segment holds up to segment.bytes of raw batches and becomes one
    // object of ratio × that, sent with one PUT while it is at most 256 MiB.
    let writes_per_object = targets[0].upload_writes as f64;
    let segment_object_bytes = SEGMENT_BYTES_DEFAULT as f64 * ratio;
    let writes_per_segment = if segment_object_bytes <= SINGLE_PUT_BYTES_MAX as f64 {
        writes_per_object
    } else {
        2.0 + (segment_object_bytes / PART_BYTES as f64).ceil()
    };
    println!(
        "PUTs per GiB archived (segment.bytes 128 MiB, {writes_per_segment} write request(s) per segment): \
         {:.2} per GiB of raw segments, {:.2} per GiB of objects written",
        writes_per_segment * GIB / SEGMENT_BYTES_DEFAULT as f64,
        writes_per_segment * GIB / segment_object_bytes,
    );
    println!();

    for t in &targets {
        let mut group = c.benchmark_group(format!("cold_replay_{}", t.name));
        group.throughput(Throughput::Bytes(object_bytes)).sampling_mode(SamplingMode::Flat);
        // Raw first, then the replay, back to back.
        bench_raw_get(&mut group, &rt, t);
        bench_replay(&mut group, &rt, t);
        if t.name == "file" {
            bench_replay_warm(&mut group, &rt, t);
        }
        group.finish();
    }
    c.final_summary();

    rt.block_on(async {
        for t in &targets {
            if let Err(e) = t.store.delete(&t.key).await {
                eprintln!("could not delete {} from {}: {e}", t.key, t.url);
            }
        }
    });
    print_summary(&targets, raw_bytes);
}
