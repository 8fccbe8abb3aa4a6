//! An object store wrapper that retries transient errors.
//!
//! Every call is retried with exponential backoff and jitter, up to a number of attempts and
//! a total time ([`RetryConfig`]), and only when [`is_retryable`] says the error is transient.
//!
//! What is and is not retried:
//! - `get_opts` (and `get`) are retried until the response starts; an error while streaming
//!   the body afterwards reaches the caller (the stream cannot be resumed transparently).
//!   `get_range` and `get_ranges` read the whole body inside the retried call, so they are
//!   retried end to end.
//! - `list` and `list_with_offset` are retried until their first item; an error on a later
//!   page reaches the caller.
//! - Multipart uploads: creating the upload, `complete` and `abort` are retried; parts are not
//!   (calling `put_part` again would add a second part), so they rely on the store client's own
//!   request retries. A `complete` retried after a lost reply may fail with `NotFound`: the
//!   caller must then check whether the object exists.
//! - A conditional create (`PutMode::Create`) retried after a lost reply fails with
//!   `AlreadyExists` because the first attempt did write: the caller must then read the
//!   existing object and check it is the one it meant to write.
//!
//! The first retry of a call is logged at `warn`, later ones at `debug`.

use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, warn};

/// Whether an object store error is transient, so the same call may succeed later.
///
/// Retryable: `Generic` errors caused by a 5xx status, `SlowDown`, HTTP 429, timeouts,
/// connection resets and other connection failures. Not retryable: `NotFound`,
/// `AlreadyExists`, `Precondition`, `NotModified`, `PermissionDenied`, `Unauthenticated`,
/// `InvalidPath`, `NotSupported`, `NotImplemented`, configuration errors, and any other
/// `Generic` error (a bad request, a full local disk).
pub fn is_retryable(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { source, .. } => is_transient(source.as_ref()),
        // NotFound, AlreadyExists, Precondition, NotModified, PermissionDenied, Unauthenticated,
        // InvalidPath, NotSupported, NotImplemented, JoinError, UnknownConfigurationKey.
        _ => false,
    }
}

fn is_transient(source: &(dyn std::error::Error + 'static)) -> bool {
    let mut text = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(e) = next {
        if let Some(http) = e.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind;
            if matches!(
                http.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            ) {
                return true;
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind;
            if matches!(
                io.kind(),
                ErrorKind::TimedOut
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::ConnectionRefused
                    | ErrorKind::BrokenPipe
                    | ErrorKind::Interrupted
                    | ErrorKind::UnexpectedEof
            ) {
                return true;
            }
        }
        text.push_str(&e.to_string().to_ascii_lowercase());
        text.push('\n');
        next = e.source();
    }
    const TRANSIENT: &[&str] = &[
        "status code: 5",
        "status code: 429",
        "too many requests",
        "slowdown",
        "slow down",
        "503 service unavailable",
        "service unavailable",
        "500 internal server error",
        "internalerror",
        "502 bad gateway",
        "504 gateway timeout",
        "requesttimeout",
        "timed out",
        "timeout",
        "connection reset",
        "connection closed",
        "connection aborted",
        "connection refused",
        "broken pipe",
        "error sending request",
        "error trying to connect",
    ];
    TRANSIENT.iter().any(|t| text.contains(t))
}

/// How hard [`RetryingObjectStore`] tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Most attempts per call, the first included.
    pub attempts_max: u32,
    /// Backoff before the first retry; doubled for each further one.
    pub backoff_base: Duration,
    /// Longest backoff between two attempts.
    pub backoff_max: Duration,
    /// No retry is started once this much time has passed since the first attempt (an
    /// attempt in flight is never cut short).
    pub elapsed_max: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            attempts_max: 8,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            elapsed_max: Duration::from_secs(60),
        }
    }
}

/// The decisions shared by every call of one store: when to retry and how long to wait.
struct RetryPolicy {
    config: RetryConfig,
    rng: Mutex<StdRng>,
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy").field("config", &self.config).finish_non_exhaustive()
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (1-based): exponential, capped, with jitter
    /// drawn from its upper half.
    fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .config
            .backoff_base
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.config.backoff_max);
        let nanos = u64::try_from(exp.as_nanos()).unwrap_or(u64::MAX);
        let jittered = match self.rng.lock() {
            Ok(mut rng) if nanos > 1 => rng.random_range(nanos / 2..=nanos),
            _ => nanos,
        };
        Duration::from_nanos(jittered)
    }

    /// Whether to retry after `attempt` failed with `e`, and after how long.
    fn next_delay(
        &self,
        op: &'static str,
        path: &str,
        attempt: u32,
        started: Instant,
        e: &object_store::Error,
    ) -> Option<Duration> {
        if !is_retryable(e) || attempt >= self.config.attempts_max {
            return None;
        }
        let delay = self.backoff(attempt);
        if started.elapsed() + delay > self.config.elapsed_max {
            return None;
        }
        if attempt == 1 {
            warn!(op, path, error = %e, delay_ms = delay.as_millis() as u64, "object store call failed; retrying");
        } else {
            debug!(op, path, attempt, error = %e, delay_ms = delay.as_millis() as u64, "retrying object store call");
        }
        Some(delay)
    }

    async fn run<R, F, Fut>(&self, op: &'static str, path: &str, mut call: F) -> object_store::Result<R>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<R>>,
    {
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(v) => {
                    if attempt > 1 {
                        debug!(op, path, attempts = attempt, "object store call succeeded after retries");
                    }
                    return Ok(v);
                }
                Err(e) => match self.next_delay(op, path, attempt, started, &e) {
                    Some(delay) => {
                        tokio::time::sleep(delay).await;
                        attempt += 1;
                    }
                    None => return Err(e),
                },
            }
        }
    }

    /// Retries opening a stream until it yields its first item.
    fn run_stream<F>(
        self: Arc<Self>,
        op: &'static str,
        path: String,
        open: F,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>>
    where
        F: Fn() -> BoxStream<'static, object_store::Result<ObjectMeta>> + Send + 'static,
    {
        let first = async move {
            let started = Instant::now();
            let mut attempt = 1;
            loop {
                let mut stream = open();
                match stream.next().await {
                    Some(Err(e)) => match self.next_delay(op, &path, attempt, started, &e) {
                        Some(delay) => {
                            tokio::time::sleep(delay).await;
                            attempt += 1;
                        }
                        None => return futures::stream::iter([Err(e)]).boxed(),
                    },
                    first => return futures::stream::iter(first).chain(stream).boxed(),
                }
            }
        };
        futures::stream::once(first).flatten().boxed()
    }
}

/// Wraps an object store so that transient errors are retried. See the module documentation.
#[derive(Debug)]
pub struct RetryingObjectStore<T: ObjectStore + ?Sized> {
    inner: Arc<T>,
    policy: Arc<RetryPolicy>,
}

impl<T: ObjectStore + ?Sized> RetryingObjectStore<T> {
    /// Wraps `inner` with the default [`RetryConfig`], drawing jitter from an OS-seeded RNG.
    pub fn new(inner: Arc<T>) -> Self {
        let policy = RetryPolicy {
            config: RetryConfig::default(),
            rng: Mutex::new(StdRng::seed_from_u64(rand::random())),
        };
        RetryingObjectStore { inner, policy: Arc::new(policy) }
    }

    /// Uses `config` instead of the default.
    pub fn with_config(self, config: RetryConfig) -> Self {
        let rng = self
            .policy
            .rng
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|_| StdRng::seed_from_u64(rand::random()));
        RetryingObjectStore {
            inner: self.inner,
            policy: Arc::new(RetryPolicy { config, rng: Mutex::new(rng) }),
        }
    }

    /// Draws jitter from an RNG seeded with `seed` (deterministic backoffs for tests).
    pub fn with_seed(self, seed: u64) -> Self {
        let config = self.policy.config.clone();
        let policy = RetryPolicy { config, rng: Mutex::new(StdRng::seed_from_u64(seed)) };
        RetryingObjectStore { inner: self.inner, policy: Arc::new(policy) }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }

    /// The retry configuration.
    pub fn config(&self) -> &RetryConfig {
        &self.policy.config
    }
}

impl<T: ObjectStore + ?Sized> std::fmt::Display for RetryingObjectStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RetryingObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore + ?Sized> ObjectStore for RetryingObjectStore<T> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let path = location.as_ref();
        self.policy.run("put", path, || self.inner.put_opts(location, payload.clone(), opts.clone())).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let path = location.as_ref();
        let upload = self
            .policy
            .run("put_multipart", path, || self.inner.put_multipart_opts(location, opts.clone()))
            .await?;
        Ok(Box::new(RetryingUpload {
            inner: upload,
            policy: Arc::clone(&self.policy),
            path: path.to_string(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.policy.run("get", location.as_ref(), || self.inner.get_opts(location, options.clone())).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        self.policy
            .run("get_range", location.as_ref(), || self.inner.get_range(location, range.clone()))
            .await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.policy.run("get_ranges", location.as_ref(), || self.inner.get_ranges(location, ranges)).await
    }

    async fn head(&self, location: &Path) -> object_store::Result<ObjectMeta> {
        self.policy.run("head", location.as_ref(), || self.inner.head(location)).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.policy.run("delete", location.as_ref(), || self.inner.delete(location)).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.cloned();
        let path = prefix.as_ref().map_or_else(String::new, |p| p.to_string());
        Arc::clone(&self.policy).run_stream("list", path, move || inner.list(prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.cloned();
        let offset = offset.clone();
        let path = prefix.as_ref().map_or_else(String::new, |p| p.to_string());
        Arc::clone(&self.policy)
            .run_stream("list", path, move || inner.list_with_offset(prefix.as_ref(), &offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let path = prefix.map_or("", |p| p.as_ref());
        self.policy.run("list", path, || self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.policy.run("copy", to.as_ref(), || self.inner.copy(from, to)).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.policy.run("copy", to.as_ref(), || self.inner.copy_if_not_exists(from, to)).await
    }
}

/// A multipart upload whose `complete` and `abort` are retried (parts are not; see the module
/// documentation).
#[derive(Debug)]
struct RetryingUpload {
    inner: Box<dyn MultipartUpload>,
    policy: Arc<RetryPolicy>,
    path: String,
}

impl RetryingUpload {
    async fn finish<R>(
        &mut self,
        op: &'static str,
        call: fn(&mut Box<dyn MultipartUpload>) -> futures::future::BoxFuture<'_, object_store::Result<R>>,
    ) -> object_store::Result<R> {
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            match call(&mut self.inner).await {
                Ok(v) => return Ok(v),
                Err(e) => match self.policy.next_delay(op, &self.path, attempt, started, &e) {
                    Some(delay) => {
                        tokio::time::sleep(delay).await;
                        attempt += 1;
                    }
                    None => return Err(e),
                },
            }
        }
    }
}

#[async_trait]
impl MultipartUpload for RetryingUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.finish("complete_multipart", |u| u.complete()).await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.finish("abort_multipart", |u| u.abort()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault_injecting_object_store::{FaultConfig, FaultInjectingObjectStore, FaultKind};
    use object_store::memory::InMemory;
    use object_store::PutMode;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic { store: "test", source: msg.to_string().into() }
    }

    fn quick() -> RetryConfig {
        RetryConfig {
            attempts_max: 8,
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(4),
            elapsed_max: Duration::from_secs(10),
        }
    }

    #[test]
    fn classifies_errors() {
        for msg in [
            "Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>",
            "Server returned non-2xx status code: 500 Internal Server Error: ",
            "503 SlowDown (injected)",
            "request timed out",
            "error sending request for url: connection reset by peer",
        ] {
            assert!(is_retryable(&generic(msg)), "{msg}");
        }
        assert!(is_retryable(&object_store::Error::Generic {
            store: "io",
            source: Box::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "x")),
        }));
        for msg in ["Server returned non-2xx status code: 400 Bad Request: bad", "No space left on device"] {
            assert!(!is_retryable(&generic(msg)), "{msg}");
        }
        let path = || "p".to_string();
        let src = || -> Box<dyn std::error::Error + Send + Sync> { "x".into() };
        for e in [
            object_store::Error::NotFound { path: path(), source: src() },
            object_store::Error::AlreadyExists { path: path(), source: src() },
            object_store::Error::Precondition { path: path(), source: src() },
            object_store::Error::NotModified { path: path(), source: src() },
            object_store::Error::PermissionDenied { path: path(), source: src() },
            object_store::Error::Unauthenticated { path: path(), source: src() },
            object_store::Error::NotSupported { source: src() },
            object_store::Error::NotImplemented,
            object_store::Error::InvalidPath {
                source: object_store::path::Error::EmptySegment { path: path() },
            },
        ] {
            assert!(!is_retryable(&e), "{e}");
        }
    }

    #[test]
    fn backoff_grows_caps_and_jitters_deterministically() {
        let config = RetryConfig {
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            ..RetryConfig::default()
        };
        let a = RetryingObjectStore::new(Arc::new(InMemory::new())).with_config(config.clone()).with_seed(9);
        let b = RetryingObjectStore::new(Arc::new(InMemory::new())).with_config(config).with_seed(9);
        for retry in 1..12 {
            let (da, db) = (a.policy.backoff(retry), b.policy.backoff(retry));
            assert_eq!(da, db, "same seed, same delays");
            let exp = Duration::from_millis(50 * (1u64 << (retry - 1))).min(Duration::from_secs(5));
            assert!(da <= exp && da >= exp / 2, "retry {retry}: {da:?} vs {exp:?}");
        }
    }

    #[tokio::test]
    async fn retries_transient_errors_only() {
        let faulty = FaultInjectingObjectStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store = RetryingObjectStore::new(Arc::new(faulty)).with_config(quick()).with_seed(1);
        let path = Path::from("a/b");
        store.inner().inject_next(FaultKind::SlowDown);
        store.inner().inject_next(FaultKind::InternalError);
        store.inner().inject_next(FaultKind::Timeout);
        store.put(&path, "v".into()).await.unwrap();
        assert_eq!(store.inner().injected(), 3);
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.as_ref(), b"v");

        // NotFound is permanent: one attempt.
        let err = store.head(&Path::from("missing")).await.unwrap_err();
        assert!(matches!(err, object_store::Error::NotFound { .. }));

        // Bounded attempts: a store that always fails gives up after attempts_max.
        let always = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { error_rate: 1.0, kinds: vec![FaultKind::SlowDown], ..FaultConfig::default() },
        );
        let store = RetryingObjectStore::new(Arc::new(always))
            .with_config(RetryConfig { attempts_max: 3, ..quick() })
            .with_seed(1);
        let err = store.head(&path).await.unwrap_err();
        assert!(is_retryable(&err));
        assert_eq!(store.inner().injected(), 3);

        // Bounded time: no retry starts past elapsed_max.
        let always = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { error_rate: 1.0, kinds: vec![FaultKind::Timeout], ..FaultConfig::default() },
        );
        let config = RetryConfig {
            attempts_max: 1000,
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(20),
            elapsed_max: Duration::from_millis(100),
        };
        let store = RetryingObjectStore::new(Arc::new(always)).with_config(config).with_seed(1);
        let started = Instant::now();
        assert!(store.get(&path).await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(store.inner().injected() < 20);
    }

    #[tokio::test]
    async fn lists_are_retried_before_their_first_item() {
        let faulty = FaultInjectingObjectStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store = RetryingObjectStore::new(Arc::new(faulty)).with_config(quick()).with_seed(1);
        for i in 0..3 {
            store.put(&Path::from(format!("d/{i}")), "x".into()).await.unwrap();
        }
        store.inner().inject_next(FaultKind::SlowDown);
        let listed: Vec<_> = store.list(Some(&Path::from("d"))).collect().await;
        assert_eq!(listed.len(), 3);
        assert!(listed.iter().all(Result::is_ok));
        assert_eq!(store.inner().injected(), 1);
        store.inner().inject_next(FaultKind::InternalError);
        let listed = store.list_with_delimiter(Some(&Path::from("d"))).await.unwrap();
        assert_eq!(listed.objects.len(), 3);
    }

    #[tokio::test]
    async fn a_lost_create_reply_surfaces_as_already_exists() {
        let faulty = FaultInjectingObjectStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store = RetryingObjectStore::new(Arc::new(faulty)).with_config(quick()).with_seed(1);
        let path = Path::from("topic=a/partition=0/x.parquet");
        store.inner().inject_next(FaultKind::LostPutReply);
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        let err = store.put_opts(&path, "data".into(), opts).await.unwrap_err();
        assert!(matches!(err, object_store::Error::AlreadyExists { .. }), "{err}");
        // The first attempt did write: the caller verifies the object is the one it meant.
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.as_ref(), b"data");

        // An overwrite retried after a lost reply just writes again.
        store.inner().inject_next(FaultKind::LostPutReply);
        store.put(&path, "data2".into()).await.unwrap();
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap().as_ref(), b"data2");
    }

    #[tokio::test]
    async fn multipart_uploads_complete_through_retries() {
        let faulty = FaultInjectingObjectStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let store = RetryingObjectStore::new(Arc::new(faulty)).with_config(quick()).with_seed(1);
        let path = Path::from("big");
        store.inner().inject_next(FaultKind::SlowDown);
        let mut upload = store.put_multipart(&path).await.unwrap();
        upload.put_part("ab".into()).await.unwrap();
        upload.put_part("cd".into()).await.unwrap();
        upload.complete().await.unwrap();
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap().as_ref(), b"abcd");
    }
}
