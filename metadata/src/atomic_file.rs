//! Small files replaced atomically: write `<name>.tmp`, fsync it, rename it over `<name>`, fsync
//! the directory. A reader sees the old or the new content, never a mix, even after a crash.
//!
//! Every such file holds [`frame`](crate::frame)s, so damage is detected when it is read back.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use crate::frame;

/// Suffix of files being written; leftovers of a crash are removed by [`remove_tmp_files`].
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Replaces `dir/name` with `bytes`, durably.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes creations, renames and deletions of entries in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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
