//! The data directory shared by `silt dev` and the offline tools.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};

/// Locks `data_dir` (creating it) so that no second process uses it; held until dropped.
pub fn lock_data_dir(data_dir: &Path) -> Result<File> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
    let lock_path = data_dir.join("LOCK");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    lock.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "data directory {} is in use by another silt process; stop it or choose another --data-dir",
            data_dir.display()
        )
    })?;
    Ok(lock)
}

/// `file://<data_dir>/objects`, the archive of `silt dev` when no object store is given.
pub fn default_object_store_url(data_dir: &Path) -> Result<String> {
    let dir = data_dir.join("objects");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let abs = dir.canonicalize().with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok(format!("file://{}", abs.display()))
}
