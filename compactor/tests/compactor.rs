//! The compactor against a real metadata node on disk and in-memory or faulty object stores,
//! with a segment source that serves known records.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use silt_compactor::metrics::CompactorMetrics;
use silt_compactor::{Compactor, CompactorConfig, SegmentSource};
use silt_metadata::state::SegmentState;
use silt_metadata::{Command, MetadataNode};
use silt_record::{Header, Record};
use silt_tiering::archive_format::{encode_archive, read_archive_meta, ArchiveMeta, ArchiveWriterOptions};
use silt_tiering::fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore};
use silt_tiering::object_layout::object_key;
use silt_tiering::retrying_object_store::{RetryConfig, RetryingObjectStore};

struct Source {
    records: Vec<Record>,
}

#[async_trait::async_trait]
impl SegmentSource for Source {
    async fn read_segment(&self, _: &str, _: u32, base: u64, last: u64) -> Result<Vec<Record>, String> {
        Ok(self.records.iter().filter(|r| r.offset >= base && r.offset <= last).cloned().collect())
    }
}

fn records(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            offset: i,
            timestamp_ms: 1_000 + i as i64,
            key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(vec![b'v'; 200 + (i % 7) as usize])),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"x")) }],
        })
        .collect()
}

/// A topic with one partition whose first segment is sealed with `count` records.
async fn sealed_segment(dir: &std::path::Path, count: u64) -> MetadataNode {
    let m = MetadataNode::open(dir, 1, "test".into()).await.expect("metadata");
    seal_first_segment(&m, count).await;
    m
}

/// Creates topic "t" with one partition and seals its first segment with `count` records.
async fn seal_first_segment(m: &MetadataNode, count: u64) {
    m.write(Command::CreateTopic { name: "t".into(), partitions: 1, config: BTreeMap::new(), now_ms: 1 })
        .await
        .expect("create");
    m.write(Command::ClaimWriter {
        topic_id: None,
        topic: "t".into(),
        partition: 0,
        agent: "a".into(),
        expected_epoch: None,
    })
    .await
    .expect("claim");
    m.write(Command::OpenSegment {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 0,
        ensemble: vec!["a".into()],
        instances: Vec::new(),
        now_ms: 1,
    })
    .await
    .expect("open");
    m.write(Command::SealSegment {
        record_witnesses_needed: false,
        unverified: Vec::new(),
        replicas: None,
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 0,
        record_count: count,
        size_bytes: count * 250,
        min_timestamp_ms: Some(1_000),
        max_timestamp_ms: Some(1_000 + count as i64 - 1),
        now_ms: 2,
    })
    .await
    .expect("seal");
}

fn segment_state(m: &MetadataNode) -> (SegmentState, Option<String>) {
    m.read_local(|s| {
        let seg = &s.topics["t"].partitions[0].segments[&0];
        (seg.state, seg.object_key.clone())
    })
}

fn compactor(
    m: &MetadataNode,
    store: Arc<dyn ObjectStore>,
    source: impl SegmentSource + 'static,
    config: CompactorConfig,
) -> Compactor {
    Compactor::new(
        config,
        m.clone().into(),
        store,
        Path::from("archive"),
        Arc::new(source),
        Arc::new(CompactorMetrics::new()),
    )
}

/// Archived segments in the bucket (the topics' descriptions beside them not counted).
async fn object_count(store: &dyn ObjectStore) -> usize {
    use futures::TryStreamExt;
    let objects = store.list(None).try_collect::<Vec<_>>().await.expect("list");
    objects.iter().filter(|o| o.location.as_ref().ends_with(".parquet")).count()
}

#[tokio::test]
async fn a_sealed_segment_is_archived_verified_and_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 500).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let c = compactor(&m, Arc::clone(&store), Source { records: records(500) }, CompactorConfig::default());
    assert_eq!(c.run_once().await, 1);
    let (state, key) = segment_state(&m);
    assert_eq!(state, SegmentState::Archived);
    let key = key.expect("object key");
    let id = m.read(|s| s.topics["t"].id).await.expect("topic id");
    assert_eq!(key, object_key(&Path::from("archive"), "t", id, 0, 0, 499).to_string());
    let (meta, _) =
        read_archive_meta(store.as_ref(), &Path::parse(&key).expect("path"), None).await.expect("footer");
    assert_eq!((meta.record_count, meta.base_offset, meta.last_offset, meta.partitions), (500, 0, 499, 1));
    assert_eq!(c.run_once().await, 0, "nothing left to archive");
    assert_eq!(object_count(store.as_ref()).await, 1);
    // The topic is described beside its objects, for a rebuild of metadata.
    let described = silt_tiering::topic_descriptor::read_descriptors(store.as_ref(), &Path::from("archive"))
        .await
        .expect("descriptions");
    let topic = m.read(|s| s.topics["t"].clone()).await.expect("topic");
    assert_eq!(described.live.get("t"), Some(&silt_tiering::topic_descriptor::TopicDescriptor::of(&topic)));
}

#[tokio::test]
async fn large_objects_go_up_in_parts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 2000).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let config =
        CompactorConfig { single_put_bytes_max: 1024, part_bytes: 5 * 1024 * 1024, ..Default::default() };
    let c = compactor(&m, Arc::clone(&store), Source { records: records(2000) }, config);
    assert_eq!(c.run_once().await, 1);
    assert_eq!(segment_state(&m).0, SegmentState::Archived);
}

#[tokio::test]
async fn an_object_left_by_an_earlier_attempt_is_kept_only_if_it_matches() {
    let meta = ArchiveMeta {
        topic: "t".into(),
        partition: 0,
        partitions: 1,
        base_offset: 0,
        last_offset: 99,
        record_count: 100,
        min_timestamp_ms: 1_000,
        max_timestamp_ms: 1_099,
    };
    // Same content already there (a PUT whose reply was lost): archived, still one object.
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 100).await;
    let id = m.read(|s| s.topics["t"].id).await.expect("topic id");
    let key = object_key(&Path::from("archive"), "t", id, 0, 0, 99);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let body = encode_archive(&meta, &records(100), &ArchiveWriterOptions::default()).expect("encode");
    store.put(&key, PutPayload::from(body)).await.expect("put");
    let c = compactor(&m, Arc::clone(&store), Source { records: records(100) }, CompactorConfig::default());
    assert_eq!(c.run_once().await, 1);
    assert_eq!(segment_state(&m).0, SegmentState::Archived);
    assert_eq!(object_count(store.as_ref()).await, 1);

    // Different content at the key (which names this topic's id and the segment's offsets):
    // refused, the object untouched, the segment still sealed.
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 100).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let other = ArchiveMeta { max_timestamp_ms: 5_000, ..meta.clone() };
    let mut shifted = records(100);
    shifted[99].timestamp_ms = 5_000;
    let body = encode_archive(&other, &shifted, &ArchiveWriterOptions::default()).expect("encode");
    store.put(&key, PutPayload::from(body.clone())).await.expect("put");
    let c = compactor(&m, Arc::clone(&store), Source { records: records(100) }, CompactorConfig::default());
    assert_eq!(c.run_once().await, 0);
    assert_eq!(segment_state(&m).0, SegmentState::Sealed);
    let stored = store.get(&key).await.expect("get").bytes().await.expect("bytes");
    assert_eq!(stored, body);
}

#[tokio::test]
async fn a_replica_that_disagrees_with_metadata_is_not_archived() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 100).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let c = compactor(&m, Arc::clone(&store), Source { records: records(99) }, CompactorConfig::default());
    assert_eq!(c.run_once().await, 0);
    assert_eq!(segment_state(&m).0, SegmentState::Sealed);
    assert_eq!(object_count(store.as_ref()).await, 0, "nothing is uploaded");
    assert_eq!(c.metrics().archive_failures.get(), 1);
}

#[tokio::test]
async fn a_faulty_store_is_retried_until_the_segment_is_archived_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 300).await;
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faults = FaultConfig::from_env_str("error_rate=0.4,seed=3").expect("faults");
    let faulty = Arc::new(FaultInjectingObjectStore::new(Arc::clone(&inner), faults));
    let retry = RetryConfig { attempts_max: 3, ..RetryConfig::default() };
    let store: Arc<dyn ObjectStore> =
        Arc::new(RetryingObjectStore::new(faulty.clone()).with_config(retry).with_seed(1));
    let c = compactor(&m, store, Source { records: records(300) }, CompactorConfig::default());
    let mut rounds = 0;
    while segment_state(&m).0 != SegmentState::Archived {
        rounds += 1;
        assert!(rounds <= 50, "not archived after 50 rounds");
        c.run_once().await;
    }
    assert!(faulty.injected() > 0, "faults were injected");
    assert_eq!(object_count(inner.as_ref()).await, 1, "exactly one object");
}

/// Deletes topic "t" and creates it again (sealing its first segment) the first time it is
/// read: the topic changes incarnation while the compactor archives the old one's segment.
struct RecreatedWhileRead {
    records: Vec<Record>,
    metadata: MetadataNode,
    recreated: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl SegmentSource for RecreatedWhileRead {
    async fn read_segment(&self, t: &str, p: u32, base: u64, last: u64) -> Result<Vec<Record>, String> {
        if !self.recreated.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let id = self.metadata.read(|s| s.topics["t"].id).await.expect("topic id");
            let delete = Command::DeleteTopic { name: "t".into(), topic_id: Some(id) };
            self.metadata.write(delete).await.expect("delete");
            seal_first_segment(&self.metadata, 50).await;
        }
        Source { records: self.records.clone() }.read_segment(t, p, base, last).await
    }
}

#[tokio::test]
async fn a_topic_deleted_and_created_again_while_its_segment_is_archived_gets_none_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 100).await;
    let old_id = m.read(|s| s.topics["t"].id).await.expect("topic id");
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let source = RecreatedWhileRead {
        records: records(100),
        metadata: m.clone(),
        recreated: std::sync::atomic::AtomicBool::new(false),
    };
    let c = compactor(&m, Arc::clone(&store), source, CompactorConfig::default());
    // The old incarnation's segment: encoded and uploaded, its commit refused, its object
    // deleted again.
    assert_eq!(c.run_once().await, 0);
    assert_eq!(c.metrics().archive_failures.get(), 1);
    let old_key = object_key(&Path::from("archive"), "t", old_id, 0, 0, 99);
    assert!(store.head(&old_key).await.is_err(), "the deleted topic's object is gone");
    let new_id = m.read(|s| s.topics["t"].id).await.expect("topic id");
    assert_ne!(new_id, old_id);
    assert_eq!(segment_state(&m).0, SegmentState::Sealed, "the new topic's segment is untouched");

    // The new incarnation's own segment (offsets 0..=49) is archived under its own key.
    assert_eq!(c.run_once().await, 1);
    let (state, key) = segment_state(&m);
    assert_eq!(state, SegmentState::Archived);
    assert_eq!(key, Some(object_key(&Path::from("archive"), "t", new_id, 0, 0, 49).to_string()));
    assert_eq!(object_count(store.as_ref()).await, 1);
}

/// Retention is judged by the compactor's clock: an archived segment whose newest record is
/// within `retention.ms` (7 days by default) of it stays, and goes, from metadata and from the
/// bucket, once the clock passes that.
#[tokio::test]
async fn archived_data_goes_when_the_compactors_clock_passes_its_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = sealed_segment(dir.path(), 100).await;
    // The next segment is open: the newest segment of a partition is never deleted.
    m.write(Command::OpenSegment {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 100,
        ensemble: vec!["a".into()],
        instances: Vec::new(),
        now_ms: 3,
    })
    .await
    .expect("open");
    let week_ms = 7 * 24 * 3600 * 1000;
    let newest_record_ms = 1_099;
    let clock = Arc::new(silt_metadata::clock::ManualClock::at(newest_record_ms + week_ms - 3_600_000));
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let config = CompactorConfig { clock: clock.clone(), ..CompactorConfig::default() };
    let c = compactor(&m, Arc::clone(&store), Source { records: records(100) }, config);
    assert_eq!(c.run_once().await, 1);
    assert_eq!(segment_state(&m).0, SegmentState::Archived, "within retention: kept");
    assert_eq!(object_count(store.as_ref()).await, 1);

    clock.advance_ms(2 * 3_600_000);
    c.run_once().await;
    let segments: Vec<u64> =
        m.read(|s| s.topics["t"].partitions[0].segments.keys().copied().collect()).await.expect("read");
    assert_eq!(segments, [100], "segment 0 is past retention: gone from metadata");
    assert_eq!(object_count(store.as_ref()).await, 0, "and from the bucket");
}
