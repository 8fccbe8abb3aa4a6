//! The RecordBatch v2 codec on what a replay page carries: 10,000 records of a 16-byte key and
//! a 1 KiB value (10 MiB), encoded into batches of at most 1 MiB (what an agent answers a read
//! with), then split and decoded back the way a client reads that answer.
//!
//! - **`encode_page`:** `encode_records` of the 10,000 records.
//! - **`parse_page`:** `split_batches` alone: the checks an agent makes of every produced batch
//!   (CRC, framing of every record).
//! - **`decode_page`:** `split_batches` of the encoded page (which checks every batch's CRC and
//!   every record's framing) and every record of every batch through `RecordBatch::records`.
//!
//! Throughput is counted in encoded bytes. Run with `cargo bench -p silt-record --bench codec`.

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use silt_record::{encode_records, split_batches, Record};

const RECORDS: u64 = 10_000;
const VALUE_BYTES: usize = 1024;
const BATCH_BYTES: usize = 1024 * 1024;

fn records() -> Vec<Record> {
    // A fixed pseudo-random fill: the codec does not look at the bytes.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..RECORDS)
        .map(|offset| {
            let value: Vec<u8> = (0..VALUE_BYTES)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    b'A' + (state % 26) as u8
                })
                .collect();
            Record {
                offset,
                timestamp_ms: 1_700_000_000_000 + offset as i64,
                key: Some(Bytes::from(format!("cust-{:011}", offset % 100_000))),
                value: Some(Bytes::from(value)),
                headers: Vec::new(),
            }
        })
        .collect()
}

fn codec(c: &mut Criterion) {
    let records = records();
    let page = encode_records(&records, BATCH_BYTES).expect("encodes");
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(page.len() as u64));
    group.bench_function("encode_page", |b| {
        b.iter(|| encode_records(&records, BATCH_BYTES).expect("encodes"))
    });
    group.bench_function("parse_page", |b| {
        b.iter(|| split_batches(page.clone()).expect("whole batches"));
    });
    group.bench_function("decode_page", |b| {
        b.iter(|| {
            let batches = split_batches(page.clone()).expect("whole batches");
            let decoded: Vec<Record> = batches.iter().flat_map(|b| b.records()).collect();
            assert_eq!(decoded.len() as u64, RECORDS);
            decoded
        });
    });
    group.finish();
}

criterion::criterion_group!(benches, codec);
criterion::criterion_main!(benches);
