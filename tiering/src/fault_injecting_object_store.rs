//! An object store wrapper that injects the failures of the design's failure model, for tests.
//!
//! With probability `error_rate`, a call suffers one of the configured [`FaultKind`]s that
//! applies to it: a `503 SlowDown`, a `500`, a timeout (all three before the call reaches the
//! inner store, as retryable `Generic` errors), a PUT whose reply was lost (the inner store
//! applies the PUT, then the caller gets a retryable error), or a slow GET (a delay, then the
//! real answer). Faults can also be queued for the next call with
//! [`FaultInjectingObjectStore::inject_next`], and single-request PUTs to keys that contain a
//! given text can be refused (`fail_puts_to`: a bucket whose policy denies one kind of object).
//! For a given seed and sequence of calls the faults are the same.
//!
//! A process can turn it on from an environment variable with [`FaultConfig::from_env_str`],
//! for example `error_rate=0.2,seed=7,slow_get_ms=50,kinds=slowdown|timeout|lost_put`.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::TieringError;

const STORE: &str = "FaultInjection";

/// A failure the store can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// `503 SlowDown`, before the call reaches the store.
    SlowDown,
    /// `500 Internal Server Error`, before the call reaches the store.
    InternalError,
    /// The request timed out, before reaching the store.
    Timeout,
    /// PUT only: the store applies the PUT, the reply is lost (a retryable error).
    LostPutReply,
    /// GET only: the answer comes after `slow_get_ms`.
    SlowGet,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::SlowDown,
        FaultKind::InternalError,
        FaultKind::Timeout,
        FaultKind::LostPutReply,
        FaultKind::SlowGet,
    ];

    /// The name [`FaultConfig::from_env_str`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::SlowDown => "slowdown",
            FaultKind::InternalError => "internal",
            FaultKind::Timeout => "timeout",
            FaultKind::LostPutReply => "lost_put",
            FaultKind::SlowGet => "slow_get",
        }
    }

    fn applies_to(self, op: Op) -> bool {
        match self {
            FaultKind::SlowDown | FaultKind::InternalError | FaultKind::Timeout => true,
            FaultKind::LostPutReply => op == Op::Put,
            FaultKind::SlowGet => op == Op::Get,
        }
    }

    fn error(self) -> object_store::Error {
        let message = match self {
            FaultKind::SlowDown => "503 SlowDown: please reduce your request rate (injected)",
            FaultKind::InternalError => "500 Internal Server Error: InternalError (injected)",
            FaultKind::Timeout => "request timed out (injected)",
            FaultKind::LostPutReply | FaultKind::SlowGet => {
                "connection reset before the response arrived; the request was applied (injected)"
            }
        };
        object_store::Error::Generic { store: STORE, source: message.into() }
    }
}

/// What a [`FaultInjectingObjectStore`] injects.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Probability that a call suffers a fault, in `0.0..=1.0`.
    pub error_rate: f64,
    /// Seed of the RNG that decides which calls fail and how.
    pub seed: u64,
    /// The faults to choose from (uniformly, among those that apply to the call).
    pub kinds: Vec<FaultKind>,
    /// Delay of a slow GET.
    pub slow_get_ms: u64,
    /// Every single-request PUT to a key containing this is refused (`403`, not retried),
    /// whatever `error_rate` says.
    pub fail_puts_to: Option<String>,
}

impl Default for FaultConfig {
    /// No faults (until `error_rate` is raised or faults are queued); every kind enabled.
    fn default() -> Self {
        FaultConfig {
            error_rate: 0.0,
            seed: 0,
            kinds: FaultKind::ALL.to_vec(),
            slow_get_ms: 100,
            fail_puts_to: None,
        }
    }
}

impl FaultConfig {
    /// Parses `key=value` pairs separated by commas: `error_rate` (0..=1), `seed`,
    /// `slow_get_ms`, `kinds` (names separated by `|` or `+`: `slowdown`, `internal`,
    /// `timeout`, `lost_put`, `slow_get`) and `fail_puts_to` (a text in keys). Unset keys keep their defaults, except that without
    /// `kinds` slow GETs are only injected when `slow_get_ms` is given. Unknown keys are an
    /// error.
    pub fn from_env_str(s: &str) -> Result<FaultConfig, TieringError> {
        let bad = |msg: String| TieringError::InvalidArgument(format!("fault injection config '{s}': {msg}"));
        let mut config = FaultConfig::default();
        let mut kinds_given = false;
        let mut slow_given = false;
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) =
                pair.split_once('=').ok_or_else(|| bad(format!("'{pair}' is not key=value")))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "error_rate" => {
                    config.error_rate = value
                        .parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .ok_or_else(|| bad(format!("error_rate '{value}' is not between 0 and 1")))?;
                }
                "seed" => {
                    config.seed = value.parse().map_err(|_| bad(format!("seed '{value}' is not a u64")))?
                }
                "slow_get_ms" => {
                    config.slow_get_ms =
                        value.parse().map_err(|_| bad(format!("slow_get_ms '{value}' is not a number")))?;
                    slow_given = true;
                }
                "kinds" => {
                    kinds_given = true;
                    config.kinds = value
                        .split(['|', '+'])
                        .map(str::trim)
                        .filter(|k| !k.is_empty())
                        .map(|k| {
                            FaultKind::ALL.into_iter().find(|f| f.name() == k).ok_or_else(|| {
                                bad(format!(
                                    "unknown fault kind '{k}' (use slowdown, internal, timeout, lost_put, slow_get)"
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?;
                }
                "fail_puts_to" if !value.is_empty() => config.fail_puts_to = Some(value.to_string()),
                "fail_puts_to" => return Err(bad("fail_puts_to is empty (it would fail every PUT)".into())),
                other => {
                    return Err(bad(format!(
                        "unknown key '{other}' (use error_rate, seed, slow_get_ms, kinds, fail_puts_to)"
                    )))
                }
            }
        }
        if !kinds_given && !slow_given {
            config.kinds.retain(|k| *k != FaultKind::SlowGet);
        }
        Ok(config)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Put,
    Get,
    Other,
}

/// Wraps an object store and injects faults. See the module documentation.
#[derive(Debug)]
pub struct FaultInjectingObjectStore<T: ObjectStore + ?Sized> {
    inner: Arc<T>,
    config: FaultConfig,
    rng: Mutex<StdRng>,
    queued: Mutex<VecDeque<FaultKind>>,
    injected: AtomicU64,
    /// The error rate now (the bits of an `f64`): the config's until [`Self::set_error_rate`].
    error_rate: AtomicU64,
}

impl<T: ObjectStore + ?Sized> FaultInjectingObjectStore<T> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<T>, config: FaultConfig) -> Self {
        let rng = Mutex::new(StdRng::seed_from_u64(config.seed));
        let error_rate = AtomicU64::new(config.error_rate.to_bits());
        FaultInjectingObjectStore {
            inner,
            error_rate,
            config,
            rng,
            queued: Mutex::new(VecDeque::new()),
            injected: AtomicU64::new(0),
        }
    }

    /// Queues a fault for the next call it applies to, whatever `error_rate` says.
    pub fn inject_next(&self, kind: FaultKind) {
        if let Ok(mut q) = self.queued.lock() {
            q.push_back(kind);
        }
    }

    /// From now on a call suffers a fault with probability `rate` (clamped to `0.0..=1.0`):
    /// a window of errors that opens and closes while the store is in use.
    pub fn set_error_rate(&self, rate: f64) {
        let rate = if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) };
        self.error_rate.store(rate.to_bits(), Ordering::SeqCst);
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }

    fn pick(&self, op: Op) -> Option<FaultKind> {
        let queued = self.queued.lock().ok().and_then(|mut q| {
            let i = q.iter().position(|k| k.applies_to(op))?;
            q.remove(i)
        });
        let fault = queued.or_else(|| {
            let mut rng = self.rng.lock().ok()?;
            let error_rate = f64::from_bits(self.error_rate.load(Ordering::SeqCst));
            if error_rate <= 0.0 || rng.random::<f64>() >= error_rate {
                return None;
            }
            let candidates: Vec<FaultKind> =
                self.config.kinds.iter().copied().filter(|k| k.applies_to(op)).collect();
            if candidates.is_empty() {
                return None;
            }
            Some(candidates[rng.random_range(0..candidates.len())])
        })?;
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }

    /// For calls other than PUT and GET: fail before reaching the store, or not at all.
    fn check(&self) -> object_store::Result<()> {
        match self.pick(Op::Other) {
            Some(fault) => Err(fault.error()),
            None => Ok(()),
        }
    }

    /// For GETs: fail, delay, or neither.
    async fn check_get(&self) -> object_store::Result<()> {
        match self.pick(Op::Get) {
            Some(FaultKind::SlowGet) => {
                // The injected fault itself: a slow answer.
                tokio::time::sleep(Duration::from_millis(self.config.slow_get_ms)).await;
                Ok(())
            }
            Some(fault) => Err(fault.error()),
            None => Ok(()),
        }
    }
}

impl<T: ObjectStore + ?Sized> std::fmt::Display for FaultInjectingObjectStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultInjectingObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore + ?Sized> ObjectStore for FaultInjectingObjectStore<T> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.config.fail_puts_to.as_deref().is_some_and(|t| location.as_ref().contains(t)) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "403 AccessDenied: the bucket refuses this key (injected)".into(),
            });
        }
        match self.pick(Op::Put) {
            Some(FaultKind::LostPutReply) => {
                // Applied, but the caller never hears; an error from the store itself is real.
                self.inner.put_opts(location, payload, opts).await?;
                Err(FaultKind::LostPutReply.error())
            }
            Some(fault) => Err(fault.error()),
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        if options.head {
            self.check()?;
        } else {
            self.check_get().await?;
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        self.check_get().await?;
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.check_get().await?;
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> object_store::Result<ObjectMeta> {
        self.check()?;
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.check()?;
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.check() {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.check() {
            Ok(()) => self.inner.list_with_offset(prefix, offset),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.check()?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy_if_not_exists(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrying_object_store::is_retryable;
    use object_store::memory::InMemory;

    #[test]
    fn parses_env_strings() {
        let c = FaultConfig::from_env_str("error_rate=0.2,seed=7,slow_get_ms=50").unwrap();
        assert_eq!(c.error_rate, 0.2);
        assert_eq!(c.seed, 7);
        assert_eq!(c.slow_get_ms, 50);
        assert_eq!(c.kinds, FaultKind::ALL.to_vec());
        let c = FaultConfig::from_env_str(" error_rate = 1 , kinds=slowdown|lost_put ").unwrap();
        assert_eq!(c.kinds, vec![FaultKind::SlowDown, FaultKind::LostPutReply]);
        let c = FaultConfig::from_env_str("error_rate=0.5").unwrap();
        assert!(!c.kinds.contains(&FaultKind::SlowGet), "slow GETs only when asked for");
        let c = FaultConfig::from_env_str("fail_puts_to=deleted.json").unwrap();
        assert_eq!((c.error_rate, c.fail_puts_to.as_deref()), (0.0, Some("deleted.json")));
        for bad in [
            "error_rate=2",
            "error_rate=x",
            "seed=-1",
            "kinds=fire",
            "colour=blue",
            "error_rate",
            "fail_puts_to=",
        ] {
            assert!(FaultConfig::from_env_str(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn injected_errors_are_retryable() {
        for kind in FaultKind::ALL {
            assert!(is_retryable(&kind.error()), "{kind:?}");
        }
    }

    async fn run(seed: u64) -> Vec<bool> {
        let store = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { error_rate: 0.3, seed, slow_get_ms: 1, ..FaultConfig::default() },
        );
        let mut outcomes = Vec::new();
        for i in 0..50 {
            let path = Path::from(format!("k{i}"));
            outcomes.push(store.put(&path, "x".into()).await.is_ok());
            outcomes.push(store.head(&path).await.is_ok());
        }
        outcomes
    }

    #[tokio::test]
    async fn deterministic_for_a_seed() {
        let a = run(7).await;
        assert_eq!(a, run(7).await);
        assert_ne!(a, run(8).await);
        let failures = a.iter().filter(|ok| !**ok).count();
        assert!((10..=50).contains(&failures), "about 30% of 100 calls fail: {failures}");
    }

    #[tokio::test]
    async fn puts_to_the_keys_named_fail_and_others_do_not() {
        let store = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { fail_puts_to: Some("deleted".into()), ..FaultConfig::default() },
        );
        assert!(store.put(&Path::from("t/1/deleted.json"), "x".into()).await.is_err());
        assert!(store.put(&Path::from("t/1/v0.json"), "x".into()).await.is_ok());
        assert!(store.inner().head(&Path::from("t/1/deleted.json")).await.is_err(), "nothing was written");
        assert_eq!(store.injected(), 1);
    }

    #[tokio::test]
    async fn lost_put_replies_are_applied() {
        let store = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { error_rate: 1.0, kinds: vec![FaultKind::LostPutReply], ..FaultConfig::default() },
        );
        let path = Path::from("x");
        assert!(store.put(&path, "v".into()).await.is_err());
        assert_eq!(store.inner().get(&path).await.unwrap().bytes().await.unwrap().as_ref(), b"v");
        assert!(store.head(&path).await.is_ok(), "lost replies only hit PUTs");
    }

    #[tokio::test]
    async fn a_window_of_errors_opens_and_closes() {
        let store = FaultInjectingObjectStore::new(
            Arc::new(InMemory::new()),
            FaultConfig { kinds: vec![FaultKind::InternalError], ..FaultConfig::default() },
        );
        let path = Path::from("x");
        assert!(store.put(&path, "v".into()).await.is_ok(), "no error before the window");
        store.set_error_rate(1.0);
        assert!(store.head(&path).await.is_err(), "every call fails inside the window");
        assert!(store.put(&path, "w".into()).await.is_err());
        store.set_error_rate(f64::NAN);
        assert!(store.head(&path).await.is_ok(), "a rate that is no number is none");
        store.set_error_rate(0.0);
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap().as_ref(), b"v");
        assert_eq!(store.injected(), 2);
    }
}
