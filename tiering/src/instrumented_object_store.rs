//! An object store wrapper that counts requests and bytes.
//!
//! Counts every call that reaches the wrapped store by kind (when it is made, so a call dropped
//! before its answer counts too), its errors, the bytes sent
//! (`out`: PUT bodies and multipart parts) and the bytes received (`in`: the ranges GETs
//! return, counted when the response starts). Put it *inside* a
//! [`crate::RetryingObjectStore`] to count every attempt, outside to count calls.
//!
//! The counters are atomics in a shared [`ObjectStoreStats`]: read them with
//! [`ObjectStoreStats::snapshot`], or expose them with [`ObjectStoreStats::encode_prometheus`]
//! as `silt_tiering_object_requests_total{op="put"}`,
//! `silt_tiering_object_request_errors_total{op=..}` and
//! `silt_tiering_object_bytes_total{direction="in"|"out"}`.

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};

/// A kind of object store request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectOp {
    /// A single PUT.
    Put,
    /// Creating a multipart upload.
    MultipartCreate,
    /// Uploading one part.
    PutPart,
    /// Completing a multipart upload.
    MultipartComplete,
    /// Aborting a multipart upload.
    MultipartAbort,
    /// A GET of a whole object.
    Get,
    /// A GET of byte ranges (`get_range`, `get_ranges`, ranged `get_opts`).
    GetRange,
    /// A HEAD.
    Head,
    /// A LIST (recursive or with a delimiter).
    List,
    /// A DELETE.
    Delete,
    /// A COPY.
    Copy,
}

impl ObjectOp {
    /// Every kind, in the order metrics list them.
    pub const ALL: [ObjectOp; 11] = [
        ObjectOp::Put,
        ObjectOp::MultipartCreate,
        ObjectOp::PutPart,
        ObjectOp::MultipartComplete,
        ObjectOp::MultipartAbort,
        ObjectOp::Get,
        ObjectOp::GetRange,
        ObjectOp::Head,
        ObjectOp::List,
        ObjectOp::Delete,
        ObjectOp::Copy,
    ];

    /// The `op` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectOp::Put => "put",
            ObjectOp::MultipartCreate => "multipart_create",
            ObjectOp::PutPart => "put_part",
            ObjectOp::MultipartComplete => "multipart_complete",
            ObjectOp::MultipartAbort => "multipart_abort",
            ObjectOp::Get => "get",
            ObjectOp::GetRange => "get_range",
            ObjectOp::Head => "head",
            ObjectOp::List => "list",
            ObjectOp::Delete => "delete",
            ObjectOp::Copy => "copy",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Shared counters of an [`InstrumentedObjectStore`].
#[derive(Debug, Default)]
pub struct ObjectStoreStats {
    requests: [AtomicU64; ObjectOp::ALL.len()],
    errors: [AtomicU64; ObjectOp::ALL.len()],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// A point-in-time copy of [`ObjectStoreStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectStoreStatsSnapshot {
    /// Single PUTs.
    pub put: u64,
    /// Multipart uploads created.
    pub multipart_create: u64,
    /// Parts uploaded.
    pub put_part: u64,
    /// Multipart uploads completed.
    pub multipart_complete: u64,
    /// Multipart uploads aborted.
    pub multipart_abort: u64,
    /// Whole-object GETs.
    pub get: u64,
    /// Ranged GETs (a `get_ranges` call counts once, as stores coalesce its ranges).
    pub get_range: u64,
    /// HEADs.
    pub head: u64,
    /// LISTs.
    pub list: u64,
    /// DELETEs.
    pub delete: u64,
    /// COPYs.
    pub copy: u64,
    /// Requests that failed, of any kind.
    pub errors: u64,
    /// Bytes received (GET bodies).
    pub bytes_in: u64,
    /// Bytes sent (PUT bodies and parts).
    pub bytes_out: u64,
}

impl ObjectStoreStatsSnapshot {
    /// All requests, of every kind.
    pub fn requests(&self) -> u64 {
        self.put
            + self.multipart_create
            + self.put_part
            + self.multipart_complete
            + self.multipart_abort
            + self.get
            + self.get_range
            + self.head
            + self.list
            + self.delete
            + self.copy
    }

    /// GETs of any kind.
    pub fn gets(&self) -> u64 {
        self.get + self.get_range
    }
}

impl ObjectStoreStats {
    /// Requests of one kind so far.
    pub fn requests(&self, op: ObjectOp) -> u64 {
        self.requests[op.index()].load(Ordering::Relaxed)
    }

    /// Failed requests of one kind so far.
    pub fn errors(&self, op: ObjectOp) -> u64 {
        self.errors[op.index()].load(Ordering::Relaxed)
    }

    /// Bytes received so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Bytes sent so far.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> ObjectStoreStatsSnapshot {
        let r = |op| self.requests(op);
        ObjectStoreStatsSnapshot {
            put: r(ObjectOp::Put),
            multipart_create: r(ObjectOp::MultipartCreate),
            put_part: r(ObjectOp::PutPart),
            multipart_complete: r(ObjectOp::MultipartComplete),
            multipart_abort: r(ObjectOp::MultipartAbort),
            get: r(ObjectOp::Get),
            get_range: r(ObjectOp::GetRange),
            head: r(ObjectOp::Head),
            list: r(ObjectOp::List),
            delete: r(ObjectOp::Delete),
            copy: r(ObjectOp::Copy),
            errors: ObjectOp::ALL.iter().map(|op| self.errors(*op)).sum(),
            bytes_in: self.bytes_in(),
            bytes_out: self.bytes_out(),
        }
    }

    /// The counters in the Prometheus text format: `silt_tiering_object_requests_total`,
    /// `silt_tiering_object_request_errors_total` (label `op`) and
    /// `silt_tiering_object_bytes_total` (label `direction`: `in` received, `out` sent).
    pub fn encode_prometheus(&self) -> String {
        self.encode_prometheus_with_prefix("silt_tiering")
    }

    /// [`ObjectStoreStats::encode_prometheus`] with another name prefix than `silt_tiering`
    /// (for a second store in the same process).
    pub fn encode_prometheus_with_prefix(&self, prefix: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP {prefix}_object_requests_total Object store requests by operation.");
        let _ = writeln!(out, "# TYPE {prefix}_object_requests_total counter");
        for op in ObjectOp::ALL {
            let _ = writeln!(
                out,
                "{prefix}_object_requests_total{{op=\"{}\"}} {}",
                op.as_str(),
                self.requests(op)
            );
        }
        let _ = writeln!(
            out,
            "# HELP {prefix}_object_request_errors_total Failed object store requests by operation."
        );
        let _ = writeln!(out, "# TYPE {prefix}_object_request_errors_total counter");
        for op in ObjectOp::ALL {
            let _ = writeln!(
                out,
                "{prefix}_object_request_errors_total{{op=\"{}\"}} {}",
                op.as_str(),
                self.errors(op)
            );
        }
        let _ = writeln!(out, "# HELP {prefix}_object_bytes_total Bytes received (in) and sent (out).");
        let _ = writeln!(out, "# TYPE {prefix}_object_bytes_total counter");
        let _ = writeln!(out, "{prefix}_object_bytes_total{{direction=\"in\"}} {}", self.bytes_in());
        let _ = writeln!(out, "{prefix}_object_bytes_total{{direction=\"out\"}} {}", self.bytes_out());
        out
    }

    /// Counts requests as they are sent, so that one dropped before its answer (the losing
    /// request of a hedged pair, a caller that gave up) is counted too: the store got it.
    fn start(&self, op: ObjectOp, n: u64) {
        self.requests[op.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a request's error once it has answered.
    fn finish<R>(&self, op: ObjectOp, result: &object_store::Result<R>) {
        if result.is_err() {
            self.errors[op.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn add_in(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    fn add_out(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Wraps an object store and counts what goes through it. See the module documentation.
#[derive(Debug)]
pub struct InstrumentedObjectStore<T: ObjectStore + ?Sized> {
    inner: Arc<T>,
    stats: Arc<ObjectStoreStats>,
}

impl<T: ObjectStore + ?Sized> InstrumentedObjectStore<T> {
    /// Wraps `inner` with fresh counters.
    pub fn new(inner: Arc<T>) -> Self {
        Self::with_stats(inner, Arc::default())
    }

    /// Wraps `inner`, adding to existing counters (several stores can share them).
    pub fn with_stats(inner: Arc<T>, stats: Arc<ObjectStoreStats>) -> Self {
        InstrumentedObjectStore { inner, stats }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<ObjectStoreStats> {
        Arc::clone(&self.stats)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }
}

impl<T: ObjectStore + ?Sized> std::fmt::Display for InstrumentedObjectStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InstrumentedObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore + ?Sized> ObjectStore for InstrumentedObjectStore<T> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let len = payload.content_length() as u64;
        self.stats.start(ObjectOp::Put, 1);
        let result = self.inner.put_opts(location, payload, opts).await;
        self.stats.finish(ObjectOp::Put, &result);
        if result.is_ok() {
            self.stats.add_out(len);
        }
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.stats.start(ObjectOp::MultipartCreate, 1);
        let result = self.inner.put_multipart_opts(location, opts).await;
        self.stats.finish(ObjectOp::MultipartCreate, &result);
        let upload = result?;
        Ok(Box::new(InstrumentedUpload { inner: upload, stats: Arc::clone(&self.stats) }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let op = if options.head {
            ObjectOp::Head
        } else if options.range.is_some() {
            ObjectOp::GetRange
        } else {
            ObjectOp::Get
        };
        self.stats.start(op, 1);
        let result = self.inner.get_opts(location, options).await;
        self.stats.finish(op, &result);
        if let (Ok(r), false) = (&result, op == ObjectOp::Head) {
            self.stats.add_in(r.range.end.saturating_sub(r.range.start));
        }
        result
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        self.stats.start(ObjectOp::GetRange, 1);
        let result = self.inner.get_range(location, range).await;
        self.stats.finish(ObjectOp::GetRange, &result);
        if let Ok(b) = &result {
            self.stats.add_in(b.len() as u64);
        }
        result
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        // One call, however many ranges: the store may coalesce them into fewer requests.
        self.stats.start(ObjectOp::GetRange, 1);
        let result = self.inner.get_ranges(location, ranges).await;
        self.stats.finish(ObjectOp::GetRange, &result);
        if let Ok(parts) = &result {
            self.stats.add_in(parts.iter().map(|b| b.len() as u64).sum());
        }
        result
    }

    async fn head(&self, location: &Path) -> object_store::Result<ObjectMeta> {
        self.stats.start(ObjectOp::Head, 1);
        let result = self.inner.head(location).await;
        self.stats.finish(ObjectOp::Head, &result);
        result
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.stats.start(ObjectOp::Delete, 1);
        let result = self.inner.delete(location).await;
        self.stats.finish(ObjectOp::Delete, &result);
        result
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.stats.start(ObjectOp::List, 1);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.stats.start(ObjectOp::List, 1);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.stats.start(ObjectOp::List, 1);
        let result = self.inner.list_with_delimiter(prefix).await;
        self.stats.finish(ObjectOp::List, &result);
        result
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.stats.start(ObjectOp::Copy, 1);
        let result = self.inner.copy(from, to).await;
        self.stats.finish(ObjectOp::Copy, &result);
        result
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.stats.start(ObjectOp::Copy, 1);
        let result = self.inner.copy_if_not_exists(from, to).await;
        self.stats.finish(ObjectOp::Copy, &result);
        result
    }
}

#[derive(Debug)]
struct InstrumentedUpload {
    inner: Box<dyn MultipartUpload>,
    stats: Arc<ObjectStoreStats>,
}

#[async_trait]
impl MultipartUpload for InstrumentedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        let stats = Arc::clone(&self.stats);
        let part = self.inner.put_part(data);
        stats.start(ObjectOp::PutPart, 1);
        Box::pin(async move {
            let result = part.await;
            stats.finish(ObjectOp::PutPart, &result);
            if result.is_ok() {
                stats.add_out(len);
            }
            result
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.stats.start(ObjectOp::MultipartComplete, 1);
        let result = self.inner.complete().await;
        self.stats.finish(ObjectOp::MultipartComplete, &result);
        result
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.stats.start(ObjectOp::MultipartAbort, 1);
        let result = self.inner.abort().await;
        self.stats.finish(ObjectOp::MultipartAbort, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn counts_requests_and_bytes() {
        let store = InstrumentedObjectStore::new(Arc::new(InMemory::new()));
        let stats = store.stats();
        let p = Path::from("a/b");
        store.put(&p, "hello".into()).await.unwrap();
        store.get(&p).await.unwrap().bytes().await.unwrap();
        store.get_range(&p, 1..3).await.unwrap();
        store.get_ranges(&p, &[0..1, 2..4]).await.unwrap();
        store.head(&p).await.unwrap();
        let _: Vec<_> = store.list(None).try_collect().await.unwrap();
        store.list_with_delimiter(None).await.unwrap();
        store.copy(&p, &Path::from("a/c")).await.unwrap();
        store.delete(&Path::from("a/c")).await.unwrap();
        assert!(store.head(&Path::from("missing")).await.is_err());
        let mut upload = store.put_multipart(&Path::from("m")).await.unwrap();
        upload.put_part("abc".into()).await.unwrap();
        upload.complete().await.unwrap();

        let s = stats.snapshot();
        assert_eq!(
            s,
            ObjectStoreStatsSnapshot {
                put: 1,
                multipart_create: 1,
                put_part: 1,
                multipart_complete: 1,
                multipart_abort: 0,
                get: 1,
                get_range: 2,
                head: 2,
                list: 2,
                delete: 1,
                copy: 1,
                errors: 1,
                bytes_in: 5 + 2 + 3,
                bytes_out: 5 + 3,
            }
        );
        assert_eq!(s.requests(), 13);
        let text = stats.encode_prometheus();
        assert!(stats
            .encode_prometheus_with_prefix("x")
            .contains("x_object_bytes_total{direction=\"out\"} 8\n"));
        assert!(text.contains("silt_tiering_object_requests_total{op=\"put\"} 1\n"), "{text}");
        assert!(text.contains("silt_tiering_object_requests_total{op=\"get_range\"} 2\n"), "{text}");
        assert!(text.contains("silt_tiering_object_request_errors_total{op=\"head\"} 1\n"), "{text}");
        assert!(text.contains("silt_tiering_object_bytes_total{direction=\"in\"} 10\n"), "{text}");
        assert!(text.contains("silt_tiering_object_bytes_total{direction=\"out\"} 8\n"), "{text}");
    }
}
