//! Small files replaced atomically: write `<name>.tmp`, fsync it, rename it over `<name>`, fsync
//! the directory. A reader sees the old or the new content, never a mix, even after a crash.
//!
//! Every such file holds [`frame`](crate::raft::frame)s, so damage is detected when it is read back.

use std::fs::{self, File};
use std::io;
use std::path::Path;

use crate::raft::frame;

/// Suffix of files being written; leftovers of a crash are removed by [`remove_tmp_files`].
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Replaces `dir/name` with `bytes`, durably.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let file = File::options().read(true).write(true).create(true).truncate(true).open(&tmp)?;
    silt_disk::write_all_at(&file, &tmp, bytes, 0)?;
    silt_disk::sync_all(&file, &tmp)?;
    drop(file);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes creations, renames and deletions of entries in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    silt_disk::sync_all(&File::open(dir)?, dir)
}

/// Creates `dir` and its missing parents durably: each directory created is fsynced into its
/// parent, so that a node that crashes right after creating its log (and voting) finds it again.
/// `dir`'s own entry is synced into its parent even when it exists: an earlier run may have
/// created it and crashed before its fsync.
pub(crate) fn create_dir_all_durably(dir: &Path) -> io::Result<()> {
    create_dir_all_durably_with(dir, &sync_dir)
}

fn create_dir_all_durably_with(dir: &Path, sync: &dyn Fn(&Path) -> io::Result<()>) -> io::Result<()> {
    let mut missing: Vec<&Path> =
        dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
    if missing.is_empty() {
        missing.push(dir);
    }
    fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync(parent)?,
            _ => sync(Path::new("."))?,
        }
    }
    Ok(())
}

/// Removes the `*.tmp` files a crash left behind in `dir`.
pub(crate) fn remove_tmp_files(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
            tracing::info!(file = %entry.path().display(), "removing a partly written file");
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Reads `dir/name` and splits it into frames, each of at most `payload_bytes_max` bytes.
/// `Ok(None)` when the file does not exist; an `InvalidData` error naming the file and the
/// offset when it is damaged.
pub(crate) fn read_frames(
    dir: &Path,
    name: &str,
    payload_bytes_max: usize,
) -> io::Result<Option<Vec<Vec<u8>>>> {
    let path = dir.join(name);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut frames = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let (payload, frame_bytes) = frame::decode(&bytes[offset..], payload_bytes_max).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is damaged at byte offset {offset}: {e}", path.display()),
            )
        })?;
        frames.push(payload.to_vec());
        offset += frame_bytes;
    }
    Ok(Some(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_directory_created_is_synced_into_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let synced = std::sync::Mutex::new(Vec::new());
        let record = |p: &Path| {
            synced.lock().unwrap().push(p.to_path_buf());
            sync_dir(p)
        };
        let target = dir.path().join("node").join("raft").join("log");
        create_dir_all_durably_with(&target, &record).unwrap();
        assert!(target.is_dir());
        let want = [dir.path().to_path_buf(), dir.path().join("node"), dir.path().join("node").join("raft")];
        assert_eq!(*synced.lock().unwrap(), want);
        // Nothing created: its entry is synced again all the same.
        synced.lock().unwrap().clear();
        create_dir_all_durably_with(&target, &record).unwrap();
        assert_eq!(*synced.lock().unwrap(), [dir.path().join("node").join("raft")]);
    }

    #[test]
    fn replaces_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_frames(dir.path(), "f", 100).unwrap(), None);
        write_atomically(dir.path(), "f", &frame::encode(b"one").unwrap()).unwrap();
        write_atomically(dir.path(), "f", &frame::encode(b"two").unwrap()).unwrap();
        assert_eq!(read_frames(dir.path(), "f", 100).unwrap(), Some(vec![b"two".to_vec()]));

        fs::write(dir.path().join("f.tmp"), b"partial").unwrap();
        remove_tmp_files(dir.path()).unwrap();
        assert!(!dir.path().join("f.tmp").exists());

        fs::write(dir.path().join("f"), b"garbage!!").unwrap();
        let err = read_frames(dir.path(), "f", 100).unwrap_err();
        assert!(err.to_string().contains("damaged at byte offset 0"), "{err}");
    }
}
