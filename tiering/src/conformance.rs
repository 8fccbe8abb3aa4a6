//! What Silt needs from an object store, as one suite every backend must pass.
//!
//! [`run_conformance`] checks the operations tiering and the compactor rely on: put and get,
//! range and suffix GETs, HEAD, LIST with a prefix and with a delimiter, delete, copy,
//! multipart upload, `PutMode::Create` refusing a second create with `AlreadyExists`, and keys
//! shaped like Silt's (`topic=a/partition=0/...`). Unit tests run it against `memory://` and a
//! `file://` directory; integration tests run it against S3 emulators. It works under a fresh
//! sub-prefix of `prefix` and deletes what it wrote.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload};

/// A check of [`run_conformance`] that failed.
#[derive(Debug, thiserror::Error)]
#[error("object store conformance check '{check}' failed: {detail}")]
pub struct ConformanceFailure {
    /// Which check.
    pub check: &'static str,
    /// What happened.
    pub detail: String,
}

fn fail(check: &'static str, detail: impl Into<String>) -> ConformanceFailure {
    ConformanceFailure { check, detail: detail.into() }
}

fn ensure(check: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), ConformanceFailure> {
    if ok {
        Ok(())
    } else {
        Err(fail(check, detail()))
    }
}

trait Check<T> {
    fn check(self, check: &'static str) -> Result<T, ConformanceFailure>;
}

impl<T> Check<T> for object_store::Result<T> {
    fn check(self, check: &'static str) -> Result<T, ConformanceFailure> {
        self.map_err(|e| fail(check, format!("unexpected error: {e}")))
    }
}

/// Size of the first part of the multipart check: S3 refuses parts under 5 MiB but the last.
const PART_BYTES: usize = 5 * 1024 * 1024;

/// Runs every check against `store` under a fresh directory below `prefix`.
pub async fn run_conformance(store: Arc<dyn ObjectStore>, prefix: &Path) -> Result<(), ConformanceFailure> {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let root = prefix.child(format!("conformance-{nanos}-{}", rand::random::<u32>()));
    let result = checks(store.as_ref(), &root).await;
    // Clean up whatever the checks left, even after a failure.
    let leftovers: Vec<Path> =
        store.list(Some(&root)).map_ok(|m| m.location).try_collect().await.unwrap_or_default();
    for location in leftovers {
        let _ = store.delete(&location).await;
    }
    result
}

async fn checks(store: &dyn ObjectStore, root: &Path) -> Result<(), ConformanceFailure> {
    let data = Bytes::from((0..=255u8).cycle().take(10_000).collect::<Vec<u8>>());
    let key =
        root.child("topic=a").child("partition=0").child("00000000000000000000-00000000000000000009.parquet");

    // Missing objects.
    let missing = root.child("missing");
    ensure(
        "get missing",
        matches!(store.get(&missing).await, Err(object_store::Error::NotFound { .. })),
        || "a GET of a missing object must be NotFound".into(),
    )?;
    ensure(
        "head missing",
        matches!(store.head(&missing).await, Err(object_store::Error::NotFound { .. })),
        || "a HEAD of a missing object must be NotFound".into(),
    )?;

    // Put, get, head.
    store.put(&key, PutPayload::from(data.clone())).await.check("put")?;
    let got = store.get(&key).await.check("get")?;
    ensure("get meta", got.meta.size == data.len() as u64, || format!("size {}", got.meta.size))?;
    let body = got.bytes().await.check("get body")?;
    ensure("get body", body == data, || format!("{} bytes differ", body.len()))?;
    let meta = store.head(&key).await.check("head")?;
    ensure("head", meta.size == data.len() as u64 && meta.location == key, || format!("{meta:?}"))?;

    // Ranges.
    let range = store.get_range(&key, 100..1100).await.check("get_range")?;
    ensure("get_range", range == data.slice(100..1100), || format!("{} bytes", range.len()))?;
    let ranges = store.get_ranges(&key, &[0..10, 5000..5100, 9990..10_000]).await.check("get_ranges")?;
    ensure(
        "get_ranges",
        ranges == [data.slice(0..10), data.slice(5000..5100), data.slice(9990..10_000)],
        || "ranges differ".into(),
    )?;
    let suffix = GetOptions { range: Some(GetRange::Suffix(64)), ..Default::default() };
    let got = store.get_opts(&key, suffix).await.check("suffix get")?;
    ensure("suffix get range", got.range == (9936..10_000), || format!("{:?}", got.range))?;
    let body = got.bytes().await.check("suffix get body")?;
    ensure("suffix get", body == data.slice(9936..10_000), || format!("{} bytes", body.len()))?;
    let long_suffix = GetOptions { range: Some(GetRange::Suffix(1 << 20)), ..Default::default() };
    let body =
        store.get_opts(&key, long_suffix).await.check("long suffix get")?.bytes().await.check("body")?;
    ensure("suffix longer than the object", body == data, || format!("{} bytes", body.len()))?;

    // Conditional create.
    let create = || PutOptions { mode: PutMode::Create, ..Default::default() };
    let created = root.child("topic=a").child("partition=0").child("created.parquet");
    store.put_opts(&created, PutPayload::from_static(b"first"), create()).await.check("create")?;
    match store.put_opts(&created, PutPayload::from_static(b"second"), create()).await {
        Err(object_store::Error::AlreadyExists { .. }) => {}
        other => return Err(fail("second create", format!("expected AlreadyExists, got {other:?}"))),
    }
    let body = store.get(&created).await.check("get created")?.bytes().await.check("body")?;
    ensure("create keeps the first object", body.as_ref() == b"first", || format!("{body:?}"))?;

    // Listing.
    let other = root.child("topic=a").child("partition=1").child("x.parquet");
    let top = root.child("top.txt");
    store.put(&other, PutPayload::from_static(b"x")).await.check("put other")?;
    store.put(&top, PutPayload::from_static(b"t")).await.check("put top")?;
    let mut all: Vec<Path> =
        store.list(Some(&root.child("topic=a"))).map_ok(|m| m.location).try_collect().await.check("list")?;
    all.sort();
    let mut expected = vec![key.clone(), created.clone(), other.clone()];
    expected.sort();
    ensure("list with prefix", all == expected, || format!("{all:?}"))?;
    let partition0: Vec<Path> = store
        .list(Some(&root.child("topic=a").child("partition=0")))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .check("list partition")?;
    ensure("list is per path segment", partition0.len() == 2, || format!("{partition0:?}"))?;
    let listed = store.list_with_delimiter(Some(root)).await.check("list_with_delimiter")?;
    ensure("list_with_delimiter prefixes", listed.common_prefixes == vec![root.child("topic=a")], || {
        format!("{:?}", listed.common_prefixes)
    })?;
    ensure(
        "list_with_delimiter objects",
        listed.objects.iter().map(|m| &m.location).collect::<Vec<_>>() == vec![&top],
        || format!("{:?}", listed.objects),
    )?;
    let listed = store.list_with_delimiter(Some(&root.child("topic=a"))).await.check("list partitions")?;
    let mut prefixes = listed.common_prefixes.clone();
    prefixes.sort();
    ensure(
        "list_with_delimiter on topic=",
        prefixes
            == vec![root.child("topic=a").child("partition=0"), root.child("topic=a").child("partition=1")],
        || format!("{prefixes:?}"),
    )?;

    // Copy.
    let copy = root.child("copy");
    store.copy(&key, &copy).await.check("copy")?;
    let body = store.get(&copy).await.check("get copy")?.bytes().await.check("body")?;
    ensure("copy", body == data, || "copied bytes differ".into())?;

    // Multipart.
    let big = root.child("topic=a").child("partition=0").child("big.parquet");
    let first = Bytes::from(vec![7u8; PART_BYTES]);
    let mut upload = store.put_multipart(&big).await.check("multipart create")?;
    upload.put_part(PutPayload::from(first.clone())).await.check("put part 1")?;
    upload.put_part(PutPayload::from_static(b"tail")).await.check("put part 2")?;
    upload.complete().await.check("multipart complete")?;
    let meta = store.head(&big).await.check("head multipart")?;
    ensure("multipart size", meta.size == PART_BYTES as u64 + 4, || format!("{}", meta.size))?;
    let tail = store.get_range(&big, PART_BYTES as u64 - 2..PART_BYTES as u64 + 4).await.check("range")?;
    ensure("multipart content", tail.as_ref() == b"\x07\x07tail", || format!("{tail:?}"))?;

    // Delete.
    store.delete(&copy).await.check("delete")?;
    ensure("deleted", matches!(store.head(&copy).await, Err(object_store::Error::NotFound { .. })), || {
        "a deleted object must be NotFound".into()
    })?;
    match store.delete(&copy).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(fail("delete missing", format!("expected Ok or NotFound, got {e}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_url::object_store_from_url;

    #[tokio::test]
    async fn memory_store_conforms() {
        let opened = object_store_from_url("memory://").unwrap();
        run_conformance(opened.store, &Path::from("silt")).await.unwrap();
    }

    #[tokio::test]
    async fn local_file_store_conforms() {
        let dir = tempfile::tempdir().unwrap();
        let opened = object_store_from_url(&format!("file://{}", dir.path().display())).unwrap();
        run_conformance(Arc::clone(&opened.store), &opened.prefix).await.unwrap();
        let left: Vec<_> = opened.store.list(None).try_collect().await.unwrap();
        assert!(left.is_empty(), "the suite cleans up: {left:?}");
    }

    #[tokio::test]
    async fn wrapped_stores_conform() {
        use crate::{
            FaultConfig, FaultInjectingObjectStore, FaultKind, InstrumentedObjectStore, RetryConfig,
            RetryingObjectStore,
        };
        // Composed the way a process does: a store from a URL, faults, retries, counters.
        let mut base: Arc<dyn ObjectStore> = object_store_from_url("memory://").unwrap().store;
        // A lost reply on a conditional create turns into AlreadyExists by design; not here.
        let faults = FaultConfig {
            kinds: vec![
                FaultKind::SlowDown,
                FaultKind::InternalError,
                FaultKind::Timeout,
                FaultKind::SlowGet,
            ],
            ..FaultConfig::from_env_str("error_rate=0.3,seed=3,slow_get_ms=1").unwrap()
        };
        base = Arc::new(FaultInjectingObjectStore::new(base, faults));
        let config = RetryConfig {
            backoff_base: std::time::Duration::from_millis(1),
            backoff_max: std::time::Duration::from_millis(5),
            ..RetryConfig::default()
        };
        let instrumented = InstrumentedObjectStore::new(Arc::new(
            RetryingObjectStore::new(base).with_config(config).with_seed(5),
        ));
        let stats = instrumented.stats();
        let store: Arc<dyn ObjectStore> = Arc::new(instrumented);
        run_conformance(store, &Path::default()).await.unwrap();
        assert!(stats.snapshot().requests() > 20);
        assert!(stats.encode_prometheus().contains("silt_tiering_object_requests_total{op=\"put\"}"));
    }
}
