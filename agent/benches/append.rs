//! Append throughput of the local segment store next to the disk's raw sequential write with
//! fdatasync, measured in the same run so the ratio Silt/raw means something.
//!
//! - `append_1_batch/silt`: `PartitionLog::append_and_sync` with one 64 KiB batch per call
//!   (one fdatasync per group commit), then `publish`, as the partition writer does.
//! - `append_1_batch/raw`: `File::write_all` of the same bytes, then `sync_data`.
//! - `append_8_batches/*`: the same with eight batches (512 KiB) per fdatasync.
//!
//! A batch is 64 records of exactly 1 KiB each (a 1015-byte value, no key, no headers), built
//! with `BatchBuilder` and parsed once. Each call gets unshared copies made before timing, as the
//! partition writer hands over batches it owns, so offsets are stamped in place.
//! Files live in a temporary directory under `std::env::temp_dir()` (normally /tmp). Both sides
//! start a new file every [`FILE_BYTES_MAX`]: Silt rolls the segment and deletes the old one,
//! raw replaces its file; that housekeeping is not timed.
//!
//! Run with `cargo bench -p silt-agent --bench append`; results are in docs/benchmarks.md.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use silt_agent::log::partition_log::PartitionLog;
use silt_record::{BatchBuilder, NewRecord, RecordBatch};

const RECORDS_PER_BATCH: usize = 64;
/// With this value a record encodes to exactly 1 KiB: its length (2 bytes), attributes,
/// timestamp delta, offset delta, null key, value length (2 bytes) and header count.
const VALUE_BYTES: usize = 1015;
const RECORD_BYTES: usize = 1024;
/// Batches per `append_and_sync` call (and 64 KiB writes per fdatasync for raw).
const GROUP_SIZES: [usize; 2] = [1, 8];
/// Both sides start a new file after this many bytes, so nothing grows without bound.
const FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Bytes and time of every timed call, by benchmark name, for the Silt/raw summary.
static TOTALS: Mutex<Vec<(String, u64, Duration)>> = Mutex::new(Vec::new());

fn add_total(name: &str, bytes: u64, elapsed: Duration) {
    let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    match totals.iter_mut().find(|(n, _, _)| n == name) {
        Some((_, b, t)) => {
            *b += bytes;
            *t += elapsed;
        }
        None => totals.push((name.to_owned(), bytes, elapsed)),
    }
}

fn batch() -> RecordBatch {
    let mut builder = BatchBuilder::new();
    for _ in 0..RECORDS_PER_BATCH {
        builder.push(NewRecord {
            timestamp_ms: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from(vec![0x5a; VALUE_BYTES])),
            headers: Vec::new(),
        });
    }
    let batch = RecordBatch::parse(builder.build().expect("the batch builds")).expect("the batch parses");
    assert_eq!(batch.len_bytes(), RECORDS_PER_BATCH * RECORD_BYTES + silt_record::BATCH_HEADER_BYTES);
    batch
}

fn bench_silt(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    dir: &Path,
    batch: &RecordBatch,
    n: usize,
) {
    let name = format!("{}/silt", group_name(n));
    let (mut log, _) = PartitionLog::open(&dir.join(format!("silt-{n}"))).expect("the log opens");
    let bytes_per_call = (n * batch.len_bytes()) as u64;
    group.bench_function("silt", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                // Unshared copies, made before timing: the partition writer hands over batches
                // it owns, so stamping offsets happens in place.
                let batches: Vec<RecordBatch> = (0..n)
                    .map(|_| {
                        RecordBatch::parse(bytes::Bytes::copy_from_slice(batch.as_bytes())).expect("batch")
                    })
                    .collect();
                let started = Instant::now();
                log.append_and_sync(batches, 1).expect("append_and_sync");
                log.publish();
                elapsed += started.elapsed();
                if log.active().size_bytes() >= FILE_BYTES_MAX {
                    log.roll().expect("roll");
                    log.delete_before(log.next_offset()).expect("delete_before");
                }
            }
            add_total(&name, iters * bytes_per_call, elapsed);
            elapsed
        })
    });
}

fn bench_raw(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    dir: &Path,
    buf: &[u8],
    n: usize,
) {
    let name = format!("{}/raw", group_name(n));
    let path = dir.join(format!("raw-{n}.dat"));
    let create = |path: &PathBuf| File::create(path).expect("the raw file is created");
    let mut file = create(&path);
    let mut written = 0u64;
    let bytes_per_call = (n * buf.len()) as u64;
    group.bench_function("raw", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                for _ in 0..n {
                    file.write_all(buf).expect("write");
                }
                file.sync_data().expect("fdatasync");
                elapsed += started.elapsed();
                written += bytes_per_call;
                if written >= FILE_BYTES_MAX {
                    fs::remove_file(&path).expect("the raw file is removed");
                    file = create(&path);
                    written = 0;
                }
            }
            add_total(&name, iters * bytes_per_call, elapsed);
            elapsed
        })
    });
}

fn group_name(n: usize) -> String {
    if n == 1 {
        "append_1_batch".to_owned()
    } else {
        format!("append_{n}_batches")
    }
}

fn print_summary() {
    let totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let mb_per_s = |name: &str| {
        totals.iter().find(|(n, _, _)| n == name).map(|(_, b, t)| *b as f64 / t.as_secs_f64() / 1e6)
    };
    println!("\nSilt/raw, from the total bytes and time of every timed call (warm-up included):");
    println!("{:<18} {:>12} {:>12} {:>10}", "group", "silt MB/s", "raw MB/s", "silt/raw");
    for n in GROUP_SIZES {
        let group = group_name(n);
        if let (Some(silt), Some(raw)) =
            (mb_per_s(&format!("{group}/silt")), mb_per_s(&format!("{group}/raw")))
        {
            println!("{group:<18} {silt:>12.1} {raw:>12.1} {:>10.2}", silt / raw);
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let dir = tempfile::Builder::new().prefix("silt-bench-").tempdir().expect("a temporary directory");
    if let Ok(out) = Command::new("df").arg("-T").arg(dir.path()).output() {
        println!("benchmark files in {}:\n{}", dir.path().display(), String::from_utf8_lossy(&out.stdout));
    }
    let batch = batch();
    for n in GROUP_SIZES {
        let mut group = c.benchmark_group(group_name(n));
        group.throughput(Throughput::Bytes((n * batch.len_bytes()) as u64));
        // Raw first, then Silt, on fresh files each: the two run back to back.
        bench_raw(&mut group, dir.path(), batch.as_bytes(), n);
        bench_silt(&mut group, dir.path(), &batch, n);
        group.finish();
    }
    c.final_summary();
    print_summary();
}
