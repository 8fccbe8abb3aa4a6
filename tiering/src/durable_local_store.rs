//! A local-folder object store whose writes are durable when they return.
//!
//! `object_store`'s `LocalFileSystem` writes an object to a temporary file and renames it into
//! place, but never fsyncs the file or the directories it lands in: after a power loss the
//! object can be missing or empty although the put returned, while metadata already says
//! `Archived` and the agents have dropped their local copies. This wrapper fsyncs the object's
//! file, then every directory from the object's up to the store's root (a put may have created
//! `topic=…/partition=…` on the way), before a put, a multipart completion or a copy returns.
//! Deletes are not synced: an object that comes back after a crash is an orphan, which costs
//! storage only.
//!
//! The syncs run on the blocking pool. Tests replace them with [`DurableLocalStore::with_syncer`]
//! to see what was synced.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};

/// Makes one file or directory durable (`fsync`).
pub type Syncer = Arc<dyn Fn(&std::path::Path) -> std::io::Result<()> + Send + Sync>;

fn fsync(path: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// See the module documentation.
#[derive(Clone)]
pub struct DurableLocalStore {
    inner: Arc<LocalFileSystem>,
    root: PathBuf,
    syncer: Syncer,
}

impl fmt::Debug for DurableLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableLocalStore").field("root", &self.root).finish_non_exhaustive()
    }
}

impl fmt::Display for DurableLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocalStore({})", self.root.display())
    }
}

impl DurableLocalStore {
    /// Wraps `inner`, a `LocalFileSystem` rooted at the directory `root`.
    pub fn new(inner: LocalFileSystem, root: PathBuf) -> DurableLocalStore {
        DurableLocalStore { inner: Arc::new(inner), root, syncer: Arc::new(fsync) }
    }

    /// The same store, making paths durable with `syncer` instead of `fsync`.
    pub fn with_syncer(self, syncer: Syncer) -> DurableLocalStore {
        DurableLocalStore { syncer, ..self }
    }

    /// [`DurableLocalStore::make_durable`]; when that fails, the object is deleted before the
    /// error is returned: after a failed fsync the kernel may have dropped its pages, and a
    /// later attempt that found the object in place (and its fsync error already reported)
    /// would take a copy that is only in memory for a durable one.
    async fn durable_or_deleted(&self, location: &Path) -> object_store::Result<()> {
        if let Err(e) = self.make_durable(location).await {
            if let Err(d) = self.inner.delete(location).await {
                tracing::warn!(error = %d, object = %location, "deleting an object whose fsync failed failed too");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Fsyncs the file of `location`, then its directories up to the root.
    async fn make_durable(&self, location: &Path) -> object_store::Result<()> {
        let file = self.inner.path_to_filesystem(location)?;
        let (root, syncer) = (self.root.clone(), Arc::clone(&self.syncer));
        let synced = silt_metadata::runtime::spawn_blocking(move || {
            syncer(&file)?;
            let mut dir = file.parent();
            while let Some(d) = dir {
                syncer(d)?;
                if d == root {
                    break;
                }
                dir = d.parent().filter(|p| p.starts_with(&root));
            }
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| object_store::Error::Generic { store: "DurableLocalStore", source: Box::new(e) })?;
        // An object whose fsync failed may not be on disk: the put fails, and the caller (the
        // compactor) never points metadata at it.
        synced.map_err(|e| object_store::Error::Generic { store: "DurableLocalStore", source: Box::new(e) })
    }
}

#[async_trait]
impl ObjectStore for DurableLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.inner.put_opts(location, payload, opts).await {
            Ok(result) => {
                self.durable_or_deleted(location).await?;
                Ok(result)
            }
            // What is there may be an earlier put whose fsync failed, or that a crash cut short
            // of it: make it durable before the caller trusts it.
            Err(e @ object_store::Error::AlreadyExists { .. }) => {
                self.make_durable(location).await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(DurableUpload { inner, store: self.clone(), location: location.clone() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> object_store::Result<ObjectMeta> {
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await?;
        self.durable_or_deleted(to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        match self.inner.copy_if_not_exists(from, to).await {
            Ok(()) => self.durable_or_deleted(to).await,
            Err(e @ object_store::Error::AlreadyExists { .. }) => {
                self.make_durable(to).await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// A multipart upload whose completion is durable when it returns.
#[derive(Debug)]
struct DurableUpload {
    inner: Box<dyn MultipartUpload>,
    store: DurableLocalStore,
    location: Path,
}

#[async_trait]
impl MultipartUpload for DurableUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let result = self.inner.complete().await?;
        self.store.durable_or_deleted(&self.location).await?;
        Ok(result)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn recording(dir: &std::path::Path) -> (DurableLocalStore, Arc<Mutex<Vec<PathBuf>>>) {
        let synced = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&synced);
        let local = LocalFileSystem::new_with_prefix(dir).unwrap();
        let store = DurableLocalStore::new(local, dir.to_path_buf()).with_syncer(Arc::new(move |p| {
            log.lock().unwrap().push(p.to_path_buf());
            fsync(p)
        }));
        (store, synced)
    }

    #[tokio::test]
    async fn a_put_returns_after_the_file_and_every_directory_up_to_the_root_are_synced() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let (store, synced) = recording(&root);
        let key = Path::from("topic=a/partition=0/x.parquet");
        store.put(&key, PutPayload::from_static(b"data")).await.unwrap();
        let want = vec![
            root.join("topic=a/partition=0/x.parquet"),
            root.join("topic=a/partition=0"),
            root.join("topic=a"),
            root.clone(),
        ];
        assert_eq!(*synced.lock().unwrap(), want);

        // A multipart upload: synced on completion, not before.
        synced.lock().unwrap().clear();
        let key = Path::from("topic=a/partition=1/y.parquet");
        let mut upload = store.put_multipart(&key).await.unwrap();
        upload.put_part(PutPayload::from_static(b"part")).await.unwrap();
        assert!(synced.lock().unwrap().is_empty());
        upload.complete().await.unwrap();
        assert_eq!(synced.lock().unwrap().first(), Some(&root.join("topic=a/partition=1/y.parquet")));
        assert_eq!(synced.lock().unwrap().last(), Some(&root));
        assert_eq!(store.get(&key).await.unwrap().bytes().await.unwrap().as_ref(), b"part");
    }

    #[tokio::test]
    async fn a_put_whose_sync_fails_fails_and_leaves_no_object_a_retry_could_take_for_durable() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let synced = Arc::new(Mutex::new(Vec::new()));
        let (f, log) = (Arc::clone(&failing), Arc::clone(&synced));
        let local = LocalFileSystem::new_with_prefix(&root).unwrap();
        let store = DurableLocalStore::new(local, root.clone()).with_syncer(Arc::new(move |p| {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::other("EIO"));
            }
            log.lock().unwrap().push(p.to_path_buf());
            Ok(())
        }));
        let key = Path::from("a/b");
        let create = || PutOptions { mode: object_store::PutMode::Create, ..Default::default() };
        let err = store.put_opts(&key, PutPayload::from_static(b"x"), create()).await.unwrap_err();
        assert!(err.to_string().contains("EIO"), "{err}");
        assert!(
            matches!(store.head(&key).await, Err(object_store::Error::NotFound { .. })),
            "the object is gone"
        );
        // An object already there (a crash between the rename and the fsync) is made durable
        // before a conditional put reports it.
        failing.store(false, std::sync::atomic::Ordering::SeqCst);
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/b"), b"x").unwrap();
        let err = store.put_opts(&key, PutPayload::from_static(b"x"), create()).await.unwrap_err();
        assert!(matches!(err, object_store::Error::AlreadyExists { .. }), "{err}");
        assert_eq!(synced.lock().unwrap().first(), Some(&root.join("a/b")));
    }
}
