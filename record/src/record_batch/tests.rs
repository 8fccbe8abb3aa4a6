use super::*;
use crate::batch_builder::{encode_batch, BatchBuilder};
use crate::record::NewRecord;
use bytes::{BufMut, BytesMut};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn new_record(timestamp_ms: i64, key: Option<&str>, value: Option<&str>) -> NewRecord {
    NewRecord {
        timestamp_ms,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        headers: Vec::new(),
    }
}

fn build(records: &[NewRecord]) -> Bytes {
    encode_batch(records).expect("batch encodes")
}

fn parse(bytes: impl Into<Bytes>) -> Result<RecordBatch, RecordError> {
    RecordBatch::parse(bytes.into())
}

fn parse_ok(bytes: impl Into<Bytes>) -> RecordBatch {
    parse(bytes).expect("batch parses")
}

/// What decoding `records` from a batch with base offset `base` must give.
fn expected(records: &[NewRecord], base: u64) -> Vec<Record> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            offset: base + i as u64,
            timestamp_ms: r.timestamp_ms,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
        })
        .collect()
}

fn recompute_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// A batch header around hand-written record bytes, with a correct
/// batchLength and CRC, so tests can reach the record-level checks.
fn raw_batch(count: i32, last_offset_delta: i32, records: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    buf.put_i64(0);
    buf.put_i32((BATCH_HEADER_BYTES - LOG_OVERHEAD + records.len()) as i32);
    buf.put_i32(-1);
    buf.put_i8(2);
    buf.put_u32(0);
    buf.put_i16(0);
    buf.put_i32(last_offset_delta);
    buf.put_i64(1000);
    buf.put_i64(1000);
    buf.put_i64(-1);
    buf.put_i16(-1);
    buf.put_i32(-1);
    buf.put_i32(count);
    buf.put_slice(records);
    recompute_crc(&mut buf);
    buf
}

fn corrupt_message(result: Result<RecordBatch, RecordError>) -> String {
    match result {
        Err(RecordError::Corrupt(message)) => message,
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Golden tests: the layout is Kafka's
// ---------------------------------------------------------------------------

/// The first batch of kafka-python's `test_records.py` fixture, "real live
/// data from a Kafka 0.11 broker": one record, null key, value "123",
/// partition leader epoch 1.
const KAFKA_BATCH_ONE_RECORD: &[u8] = &[
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // baseOffset 0
    0x00, 0x00, 0x00, 0x3b, // batchLength 59
    0x00, 0x00, 0x00, 0x01, // partitionLeaderEpoch 1
    0x02, // magic
    0x03, 0x18, 0xa2, 0x70, // crc
    0x00, 0x00, // attributes
    0x00, 0x00, 0x00, 0x00, // lastOffsetDelta 0
    0x00, 0x00, 0x01, 0x5d, 0xff, 0x7b, 0x06, 0x3c, // baseTimestamp
    0x00, 0x00, 0x01, 0x5d, 0xff, 0x7b, 0x06, 0x3c, // maxTimestamp
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // producerId -1
    0xff, 0xff, // producerEpoch -1
    0xff, 0xff, 0xff, 0xff, // baseSequence -1
    0x00, 0x00, 0x00, 0x01, // records count 1
    0x12, // record length 9
    0x00, // attributes
    0x00, // timestampDelta 0
    0x00, // offsetDelta 0
    0x01, // keyLength -1 (null)
    0x06, b'1', b'2', b'3', // valueLength 3, "123"
    0x00, // headers count 0
];

/// The second batch of the same fixture: base offset 1, epoch 2, two records
/// with null keys and empty (not null) values, 168 ms apart.
const KAFKA_BATCH_TWO_RECORDS: &[u8] = &[
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // baseOffset 1
    0x00, 0x00, 0x00, 0x40, // batchLength 64
    0x00, 0x00, 0x00, 0x02, // partitionLeaderEpoch 2
    0x02, // magic
    0xc8, 0x5c, 0xbd, 0x23, // crc
    0x00, 0x00, // attributes
    0x00, 0x00, 0x00, 0x01, // lastOffsetDelta 1
    0x00, 0x00, 0x01, 0x5d, 0xff, 0x7c, 0xdd, 0x6c, // baseTimestamp
    0x00, 0x00, 0x01, 0x5d, 0xff, 0x7c, 0xde, 0x14, // maxTimestamp
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // producerId -1
    0xff, 0xff, // producerEpoch -1
    0xff, 0xff, 0xff, 0xff, // baseSequence -1
    0x00, 0x00, 0x00, 0x02, // records count 2
    0x0c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // record 0: len 6, value ""
    0x0e, 0x00, 0xd0, 0x02, 0x02, 0x01, 0x00, 0x00, // record 1: len 7, ts +168
];

#[test]
fn parses_a_batch_written_by_a_kafka_broker() {
    let batch = parse_ok(KAFKA_BATCH_ONE_RECORD);
    assert_eq!(batch.base_offset(), 0);
    assert_eq!(batch.last_offset(), 0);
    assert_eq!(batch.next_offset(), 1);
    assert_eq!(batch.record_count(), 1);
    assert_eq!(batch.partition_leader_epoch(), 1);
    assert_eq!(batch.crc(), 0x0318_a270);
    assert_eq!(batch.attributes(), 0);
    assert_eq!(batch.base_timestamp(), 0x0000_015d_ff7b_063c);
    assert_eq!(batch.max_timestamp(), 0x0000_015d_ff7b_063c);
    assert_eq!(batch.producer_id(), -1);
    assert_eq!(batch.producer_epoch(), -1);
    assert_eq!(batch.base_sequence(), -1);
    assert_eq!(batch.len_bytes(), 71);
    assert_eq!(
        batch.records().collect::<Vec<_>>(),
        vec![Record {
            offset: 0,
            timestamp_ms: 0x0000_015d_ff7b_063c,
            key: None,
            value: Some(Bytes::from_static(b"123")),
            headers: vec![],
        }]
    );

    let batch = parse_ok(KAFKA_BATCH_TWO_RECORDS);
    assert_eq!(batch.base_offset(), 1);
    assert_eq!(batch.last_offset(), 2);
    assert_eq!(batch.partition_leader_epoch(), 2);
    let base = 0x0000_015d_ff7c_dd6c;
    assert_eq!(
        batch.records().collect::<Vec<_>>(),
        vec![
            Record { offset: 1, timestamp_ms: base, key: None, value: Some(Bytes::new()), headers: vec![] },
            Record {
                offset: 2,
                timestamp_ms: base + 168,
                key: None,
                value: Some(Bytes::new()),
                headers: vec![],
            },
        ]
    );
}

#[test]
fn builds_the_same_bytes_a_kafka_producer_does() {
    // Same records; base offset and epoch are stamped afterwards, as the
    // broker does, and the Kafka-computed CRC must match ours unchanged.
    let mut one = BytesMut::from(&build(&[new_record(0x0000_015d_ff7b_063c, None, Some("123"))])[..]);
    set_partition_leader_epoch(&mut one, 1);
    assert_eq!(&one[..], KAFKA_BATCH_ONE_RECORD);

    let base = 0x0000_015d_ff7c_dd6c;
    let mut builder = BatchBuilder::new();
    builder.push(new_record(base, None, Some("")));
    builder.push(new_record(base + 168, None, Some("")));
    assert_eq!(builder.encoded_len(), KAFKA_BATCH_TWO_RECORDS.len());
    let mut two = BytesMut::from(&builder.build().expect("builds")[..]);
    set_base_offset(&mut two, 1);
    set_partition_leader_epoch(&mut two, 2);
    assert_eq!(&two[..], KAFKA_BATCH_TWO_RECORDS);
}

#[test]
fn crc_is_castagnoli() {
    // The CRC-32C check value; plain CRC-32 would give 0xcbf43926.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
}

/// A batch assembled field by field from the spec, with a key, a value and
/// a header, must equal what the builder writes.
#[test]
fn hand_built_batch_matches_the_spec_layout() {
    let ts: i64 = 1_700_000_000_000;
    let mut expected = Vec::new();
    expected.extend_from_slice(&0i64.to_be_bytes()); // 0: baseOffset
    expected.extend_from_slice(&66i32.to_be_bytes()); // 8: batchLength = 49 + 17
    expected.extend_from_slice(&(-1i32).to_be_bytes()); // 12: partitionLeaderEpoch
    expected.push(2); // 16: magic
    expected.extend_from_slice(&[0; 4]); // 17: crc, below
    expected.extend_from_slice(&0i16.to_be_bytes()); // 21: attributes
    expected.extend_from_slice(&0i32.to_be_bytes()); // 23: lastOffsetDelta
    expected.extend_from_slice(&ts.to_be_bytes()); // 27: baseTimestamp
    expected.extend_from_slice(&ts.to_be_bytes()); // 35: maxTimestamp
    expected.extend_from_slice(&(-1i64).to_be_bytes()); // 43: producerId
    expected.extend_from_slice(&(-1i16).to_be_bytes()); // 51: producerEpoch
    expected.extend_from_slice(&(-1i32).to_be_bytes()); // 53: baseSequence
    expected.extend_from_slice(&1i32.to_be_bytes()); // 57: records count
    assert_eq!(expected.len(), BATCH_HEADER_BYTES);
    expected.extend_from_slice(&[
        0x20, // length 16 (zigzag 32)
        0x00, // attributes
        0x00, // timestampDelta 0
        0x00, // offsetDelta 0
        0x02, b'k', // key length 1, "k"
        0x0a, b'h', b'e', b'l', b'l', b'o', // value length 5, "hello"
        0x02, // 1 header
        0x02, b'h', // header key length 1, "h"
        0x02, b'v', // header value length 1, "v"
    ]);
    let crc = crc32c::crc32c(&expected[21..]);
    expected[17..21].copy_from_slice(&crc.to_be_bytes());

    let built = build(&[NewRecord {
        timestamp_ms: ts,
        key: Some(Bytes::from_static(b"k")),
        value: Some(Bytes::from_static(b"hello")),
        headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"v")) }],
    }]);
    assert_eq!(&built[..], &expected[..]);
    let batch = parse_ok(expected);
    assert_eq!(batch.crc(), crc);
    let records: Vec<_> = batch.records().collect();
    assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
    assert_eq!(records[0].headers[0].key, "h");
}

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

#[test]
fn builder_sets_header_fields() {
    let records = [
        new_record(5_000, Some("a"), Some("1")),
        new_record(9_000, None, Some("2")),
        new_record(1_000, Some("c"), None),
    ];
    let batch = parse_ok(build(&records));
    assert_eq!(batch.base_offset(), 0);
    assert_eq!(batch.last_offset_delta(), 2);
    assert_eq!(batch.last_offset(), 2);
    assert_eq!(batch.record_count(), 3);
    assert_eq!(batch.partition_leader_epoch(), -1);
    assert_eq!(batch.attributes(), 0);
    assert!(!batch.is_log_append_time());
    assert!(!batch.is_transactional());
    assert!(!batch.is_control());
    assert_eq!(batch.base_timestamp(), 5_000, "the first record's timestamp");
    assert_eq!(batch.max_timestamp(), 9_000);
    assert_eq!(batch.producer_id(), -1);
    assert_eq!(batch.producer_epoch(), -1);
    assert_eq!(batch.base_sequence(), -1);
    assert_eq!(batch.records().collect::<Vec<_>>(), expected(&records, 0));
}

#[test]
fn building_an_empty_batch_fails() {
    assert_eq!(BatchBuilder::new().build(), Err(RecordError::EmptyBatch));
    assert_eq!(encode_batch(&[]), Err(RecordError::EmptyBatch));
    assert_eq!(BatchBuilder::default().encoded_len(), BATCH_HEADER_BYTES);
    assert!(BatchBuilder::new().is_empty());
}

#[test]
fn encoded_len_predicts_the_built_size() {
    let big = "x".repeat(300);
    let records = vec![
        new_record(i64::MAX, Some(&big), Some("")),
        new_record(i64::MIN, None, None),
        NewRecord {
            timestamp_ms: 0,
            key: None,
            value: Some(Bytes::from(vec![7; 20_000])),
            headers: vec![
                Header { key: "trace-id".into(), value: Some(Bytes::from(big.clone())) },
                Header { key: String::new(), value: None },
            ],
        },
    ];
    let mut builder = BatchBuilder::new();
    for record in &records {
        let predicted = builder.encoded_len_with(record);
        builder.push(record.clone());
        assert_eq!(builder.encoded_len(), predicted);
    }
    assert_eq!(builder.len(), 3);
    let len = builder.encoded_len();
    let bytes = builder.build().expect("builds");
    assert_eq!(bytes.len(), len);
    assert_eq!(peek_batch_len(&bytes), Some(len));
    assert_eq!(parse_ok(bytes).records().collect::<Vec<_>>(), expected(&records, 0));
}

#[test]
fn extreme_timestamps_round_trip() {
    // Deltas wrap around i64, exactly as Java's long arithmetic does.
    let records = [
        new_record(i64::MIN, None, Some("a")),
        new_record(i64::MAX, None, Some("b")),
        new_record(-1, None, Some("c")),
        new_record(0, None, Some("d")),
    ];
    let batch = parse_ok(build(&records));
    assert_eq!(batch.base_timestamp(), i64::MIN);
    assert_eq!(batch.max_timestamp(), i64::MAX);
    assert_eq!(batch.records().collect::<Vec<_>>(), expected(&records, 0));
}

#[test]
fn records_share_the_batch_buffer() {
    let batch = parse_ok(build(&[new_record(1, Some("key"), Some("value"))]));
    let record = batch.records().next().expect("one record");
    let range = batch.as_bytes().as_ptr_range();
    let value = record.value.expect("has a value");
    assert!(range.contains(&value.as_ptr()), "value is a slice of the batch");
}

// ---------------------------------------------------------------------------
// In-place rewrites and peeking
// ---------------------------------------------------------------------------

#[test]
fn rewriting_offset_and_epoch_keeps_the_batch_valid() {
    let records = [new_record(1, None, Some("a")), new_record(2, None, Some("b"))];
    let mut bytes = BytesMut::from(&build(&records)[..]);
    let crc = parse_ok(bytes.clone().freeze()).crc();
    set_base_offset(&mut bytes, 1_000);
    set_partition_leader_epoch(&mut bytes, 7);
    assert_eq!(peek_base_offset(&bytes), Some(1_000));
    assert_eq!(peek_last_offset(&bytes), Some(1_001));
    assert_eq!(peek_last_offset(&bytes[..26]), None, "the delta is not all there");
    let batch = parse_ok(bytes.freeze());
    assert_eq!(batch.crc(), crc, "both fields lie outside the CRC");
    assert_eq!(batch.base_offset(), 1_000);
    assert_eq!(batch.last_offset(), 1_001);
    assert_eq!(batch.next_offset(), 1_002);
    assert_eq!(batch.partition_leader_epoch(), 7);
    assert_eq!(batch.records().collect::<Vec<_>>(), expected(&records, 1_000));

    let mut bytes = BytesMut::from(&build(&records[..1])[..]);
    set_base_offset(&mut bytes, i64::MAX as u64);
    assert_eq!(parse_ok(bytes.freeze()).last_offset(), i64::MAX as u64);
}

#[test]
#[should_panic(expected = "exceeds the largest Kafka offset")]
fn base_offset_beyond_i64_panics() {
    let mut bytes = BytesMut::from(&build(&[new_record(1, None, None)])[..]);
    set_base_offset(&mut bytes, u64::MAX);
}

#[test]
fn peek_batch_len_frames_concatenated_batches() {
    let batches = [
        build(&[new_record(1, None, Some("a"))]),
        build(&[new_record(2, Some("k"), Some("bb")), new_record(3, None, None)]),
        build(&[new_record(4, None, Some(&"c".repeat(500)))]),
    ];
    let mut log = Vec::new();
    for batch in &batches {
        log.extend_from_slice(batch);
    }
    let log = Bytes::from(log);
    let mut framed = Vec::new();
    let mut at = 0;
    while let Some(len) = peek_batch_len(&log[at..]) {
        framed.push(parse_ok(log.slice(at..at + len)).into_bytes());
        at += len;
    }
    assert_eq!(at, log.len());
    assert_eq!(framed, batches);
}

#[test]
fn peek_batch_len_rejects_impossible_lengths() {
    let batch = build(&[new_record(1, None, Some("a"))]);
    assert_eq!(peek_batch_len(&batch), Some(batch.len()));
    assert_eq!(peek_batch_len(&batch[..12]), Some(batch.len()), "only 12 bytes are needed");
    assert_eq!(peek_batch_len(&batch[..11]), None);
    assert_eq!(peek_batch_len(&[]), None);
    let mut header = [0u8; 12];
    header[8..12].copy_from_slice(&49i32.to_be_bytes());
    assert_eq!(peek_batch_len(&header), Some(61));
    header[8..12].copy_from_slice(&48i32.to_be_bytes());
    assert_eq!(peek_batch_len(&header), None);
    header[8..12].copy_from_slice(&(-1i32).to_be_bytes());
    assert_eq!(peek_batch_len(&header), None);
    header[8..12].copy_from_slice(&0i32.to_be_bytes());
    assert_eq!(peek_batch_len(&header), None, "zeroed file tail is not a batch");
}

#[test]
fn peek_base_offset_reads_the_first_field() {
    assert_eq!(peek_base_offset(&[0, 0, 0, 0, 0, 0, 1, 0]), Some(256));
    assert_eq!(peek_base_offset(&[0, 0, 0, 0, 0, 0, 1]), None);
    assert_eq!(peek_base_offset(&[0xff; 8]), None, "negative");
}

// ---------------------------------------------------------------------------
// Header validation
// ---------------------------------------------------------------------------

#[test]
fn rejects_short_buffers() {
    assert_eq!(parse(Bytes::new()).map(|_| ()), Err(RecordError::Truncated { needed: 12, available: 0 }));
    let batch = build(&[new_record(1, None, Some("abc"))]);
    assert_eq!(
        parse(batch.slice(..40)).map(|_| ()),
        Err(RecordError::Truncated { needed: batch.len(), available: 40 })
    );
}

#[test]
fn rejects_trailing_bytes() {
    let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
    let len = bytes.len();
    bytes.push(0);
    assert_eq!(
        parse(bytes).map(|_| ()),
        Err(RecordError::TrailingBytes { batch_len: len, buffer_len: len + 1 })
    );
}

#[test]
fn rejects_batch_length_below_header() {
    let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
    bytes[8..12].copy_from_slice(&10i32.to_be_bytes());
    assert_eq!(corrupt_message(parse(bytes.clone())), "batch length 10 is smaller than the 49-byte minimum");
    bytes[8..12].copy_from_slice(&i32::MIN.to_be_bytes());
    assert!(matches!(parse(bytes), Err(RecordError::Corrupt(_))));
}

#[test]
fn rejects_other_magic() {
    let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
    bytes[MAGIC_AT] = 1;
    assert_eq!(parse(bytes).map(|_| ()), Err(RecordError::BadMagic(1)));
}

#[test]
fn rejects_crc_mismatch() {
    let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
    let stored = u32::from_be_bytes([bytes[17], bytes[18], bytes[19], bytes[20]]);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let computed = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
    assert_eq!(parse(bytes).map(|_| ()), Err(RecordError::CrcMismatch { stored, computed }));
}

#[test]
fn rejects_compressed_batches() {
    for codec in 1..=7u8 {
        let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
        bytes[ATTRIBUTES_AT + 1] = codec;
        recompute_crc(&mut bytes);
        assert_eq!(parse(bytes).map(|_| ()), Err(RecordError::UnsupportedCompression(codec)));
    }
}

#[test]
fn rejects_negative_base_offset() {
    let mut bytes = build(&[new_record(1, None, Some("abc"))]).to_vec();
    bytes[..8].copy_from_slice(&(-1i64).to_be_bytes());
    assert_eq!(corrupt_message(parse(bytes)), "negative base offset -1");
}

#[test]
fn rejects_last_offset_overflow() {
    let mut bytes = build(&[new_record(1, None, None), new_record(1, None, None)]).to_vec();
    bytes[..8].copy_from_slice(&i64::MAX.to_be_bytes());
    assert!(corrupt_message(parse(bytes)).starts_with("last offset overflows"));
}

#[test]
fn rejects_bad_record_counts() {
    let record = [0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00];
    assert!(parse(raw_batch(1, 0, &record)).is_ok());
    assert_eq!(parse(raw_batch(0, -1, &[])).map(|_| ()), Err(RecordError::EmptyBatch));
    assert_eq!(corrupt_message(parse(raw_batch(-1, 0, &record))), "negative record count -1");
    assert_eq!(
        corrupt_message(parse(raw_batch(2, 1, &record))),
        "record count 2 is more than the 7 bytes of records can hold"
    );
    assert!(corrupt_message(parse(raw_batch(i32::MAX, i32::MAX - 1, &record)))
        .starts_with("record count 2147483647"));
    assert_eq!(
        corrupt_message(parse(raw_batch(1, 5, &record))),
        "last offset delta 5 does not match record count 1"
    );
}

#[test]
fn control_and_log_append_time_batches() {
    let records = [new_record(100, None, Some("a")), new_record(200, None, Some("b"))];
    let mut bytes = build(&records).to_vec();
    let attributes = TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT;
    bytes[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    bytes[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&999i64.to_be_bytes());
    recompute_crc(&mut bytes);
    let batch = parse_ok(bytes);
    assert!(batch.is_log_append_time());
    assert!(batch.is_transactional());
    assert!(batch.is_control());
    let timestamps: Vec<i64> = batch.records().map(|r| r.timestamp_ms).collect();
    assert_eq!(timestamps, [999, 999], "log-append time replaces record timestamps");
}

// ---------------------------------------------------------------------------
// Record validation
// ---------------------------------------------------------------------------

#[test]
fn rejects_malformed_records() {
    // (record bytes, expected message); each record is alone in its batch.
    let cases: &[(&[u8], &str)] = &[
        (&[0x0c, 0x00, 0x00, 0x02, 0x01, 0x01, 0x00], "record 0: offset delta is 1, expected 0"),
        (&[0x0c, 0x00, 0x00, 0x00, 0x03, 0x01, 0x00], "record 0: key length -2 is invalid"),
        (&[0x0c, 0x00, 0x00, 0x00, 0x01, 0x03, 0x00], "record 0: value length -2 is invalid"),
        (
            &[0x0c, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00],
            "record 0: value length 2 exceeds the 1 remaining bytes",
        ),
        (&[0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01], "record 0: header count -1 is negative"),
        (
            &[0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02],
            "record 0: header count 1 is more than the 0 remaining bytes can hold",
        ),
        (
            &[0x10, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x01, 0x01],
            "record 0: header key length -1 is negative",
        ),
        (
            &[0x12, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x02, 0xff, 0x01],
            "record 0: header key is not valid UTF-8",
        ),
        (
            &[0x12, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x00, 0x05, 0x00],
            "record 0: header value length -3 is invalid",
        ),
        (
            // Length 7 but the fields end after 6 bytes.
            &[0x0e, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00],
            "record 0: 1 unexpected bytes after the headers (length says 7)",
        ),
        (
            // Length 5 cuts the header count off.
            &[0x0a, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00],
            "record 0: header count: variable-length integer is truncated: the input ends before \
             its last byte",
        ),
        (&[0x01, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00], "record 0: length -1 is negative"),
        (
            &[0x20, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00],
            "record 0: length 16 is more than the 6 remaining bytes can hold",
        ),
        (
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00],
            "record 0: length: variable-length integer is longer than the maximum of 5 bytes",
        ),
        (&[0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00], "2 unexpected bytes after the last record"),
    ];
    for &(record, message) in cases {
        assert_eq!(corrupt_message(parse(raw_batch(1, 0, record))), message, "{record:x?}");
    }
}

#[test]
fn reports_which_record_is_malformed() {
    let good = [0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00];
    let bad_delta = [0x0c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00];
    let records = [&good[..], &bad_delta[..]].concat();
    assert_eq!(corrupt_message(parse(raw_batch(2, 1, &records))), "record 1: offset delta is 0, expected 1");
}

#[test]
fn record_iterator_is_exact_size_and_fused() {
    let records: Vec<NewRecord> = (0..5).map(|i| new_record(i, None, Some("v"))).collect();
    let batch = parse_ok(build(&records));
    let mut iter = batch.records();
    assert_eq!(iter.len(), 5);
    iter.next();
    assert_eq!(iter.len(), 4);
    assert_eq!(iter.by_ref().count(), 4);
    assert_eq!(iter.next(), None);
    assert_eq!((&batch).into_iter().count(), 5);
}

#[test]
fn debug_output_summarises_instead_of_dumping_bytes() {
    let batch = parse_ok(build(&[new_record(1, None, Some("abc"))]));
    let debug = format!("{batch:?}");
    assert!(debug.starts_with("RecordBatch { base_offset: 0, record_count: 1"), "{debug}");
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

fn arb_payload() -> impl Strategy<Value = Option<Bytes>> {
    prop::option::of(prop::collection::vec(any::<u8>(), 0..200).prop_map(Bytes::from))
}

fn arb_timestamp() -> impl Strategy<Value = i64> {
    prop_oneof![1_600_000_000_000i64..1_800_000_000_000, -1_000i64..1_000, any::<i64>(),]
}

fn arb_header() -> impl Strategy<Value = Header> {
    (".{0,12}", arb_payload()).prop_map(|(key, value)| Header { key, value })
}

fn arb_record() -> impl Strategy<Value = NewRecord> {
    (arb_timestamp(), arb_payload(), arb_payload(), prop::collection::vec(arb_header(), 0..4))
        .prop_map(|(timestamp_ms, key, value, headers)| NewRecord { timestamp_ms, key, value, headers })
}

fn arb_records() -> impl Strategy<Value = Vec<NewRecord>> {
    prop::collection::vec(arb_record(), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_parse_round_trips(records in arb_records(), base_offset in 0u64..1 << 40, epoch: i32) {
        let mut builder = BatchBuilder::new();
        for record in &records {
            builder.push(record.clone());
        }
        let len = builder.encoded_len();
        let mut bytes = BytesMut::from(&builder.build().expect("builds")[..]);
        prop_assert_eq!(bytes.len(), len);
        set_base_offset(&mut bytes, base_offset);
        set_partition_leader_epoch(&mut bytes, epoch);

        let batch = RecordBatch::parse(bytes.freeze()).expect("parses");
        prop_assert_eq!(batch.base_offset(), base_offset);
        prop_assert_eq!(batch.record_count() as usize, records.len());
        prop_assert_eq!(batch.last_offset(), base_offset + records.len() as u64 - 1);
        prop_assert_eq!(batch.partition_leader_epoch(), epoch);
        prop_assert_eq!(batch.base_timestamp(), records[0].timestamp_ms);
        prop_assert_eq!(
            batch.max_timestamp(),
            records.iter().map(|r| r.timestamp_ms).max().unwrap_or_default()
        );
        prop_assert_eq!(batch.records().collect::<Vec<_>>(), expected(&records, base_offset));
    }

    #[test]
    fn any_bit_flip_from_the_magic_byte_on_is_detected(
        records in arb_records(),
        position in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut bytes = encode_batch(&records).expect("builds").to_vec();
        let at = MAGIC_AT + position.index(bytes.len() - MAGIC_AT);
        bytes[at] ^= 1 << bit;
        prop_assert!(RecordBatch::parse(Bytes::from(bytes)).is_err(), "flip at byte {}", at);
    }

    #[test]
    fn every_truncation_fails_cleanly(records in prop::collection::vec(arb_record(), 1..4)) {
        let bytes = encode_batch(&records).expect("builds");
        for len in 0..bytes.len() {
            let result = RecordBatch::parse(bytes.slice(..len));
            let expected_needed = if len < LOG_OVERHEAD { LOG_OVERHEAD } else { bytes.len() };
            prop_assert_eq!(
                result.map(|_| ()),
                Err(RecordError::Truncated { needed: expected_needed, available: len })
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = RecordBatch::parse(Bytes::from(bytes.clone()));
        let _ = peek_batch_len(&bytes);
        let _ = peek_base_offset(&bytes);
    }

    /// Random bytes behind a header that passes every batch-level check, so
    /// the record decoder itself is fuzzed. Whatever parses must iterate to
    /// exactly `record_count` records (a decoding failure during iteration
    /// panics in debug builds).
    #[test]
    fn arbitrary_records_area_never_panics(
        count in 1i32..6,
        records in prop::collection::vec(any::<u8>(), 0..120),
    ) {
        let batch = RecordBatch::parse(Bytes::from(raw_batch(count, count - 1, &records)));
        if let Ok(batch) = batch {
            prop_assert_eq!(batch.records().count(), count as usize);
        }
    }

    /// Mutations of a valid batch with the CRC fixed up afterwards, so they
    /// reach every check behind it.
    #[test]
    fn mutated_batches_with_valid_crc_never_panic(
        records in prop::collection::vec(arb_record(), 1..4),
        mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode_batch(&records).expect("builds").to_vec();
        for (position, value) in mutations {
            let at = ATTRIBUTES_AT + position.index(bytes.len() - ATTRIBUTES_AT);
            bytes[at] = value;
        }
        recompute_crc(&mut bytes);
        if let Ok(batch) = RecordBatch::parse(Bytes::from(bytes)) {
            prop_assert_eq!(batch.records().count(), batch.record_count() as usize);
        }
    }
}
