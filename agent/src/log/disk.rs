//! fsync, the call durability rests on, and what the agent does when one fails.
//!
//! After a failed fsync the kernel may keep the written pages in its cache, marked clean, and
//! serve them to reads although they never reached the disk (and drop them at any moment):
//! a file reopened after the failure can show bytes no fsync covered. So a segment whose
//! fsync fails cuts its file back to what its last successful fsync covered, durably, before
//! anything reads it again ([`crate::log::segment::Segment::sync_appends`]): what was cut is taken
//! again from the writer, or was never acknowledged. When the cut cannot be made durable
//! either, the partition's directory is distrusted ([`distrust`]): this process opens no log
//! there again, and hands the partition's writing to another agent.
//!
//! A failed write is handled alike: the bytes written before it since the last fsync belong to
//! a group that is never acknowledged, and are cut back with the rest.
//!
//! Every fsync of the agent's logs and fences, and every write and cut of a segment's log file,
//! goes through the seam of [`silt_disk`] (re-exported here), where tests inject fsync errors,
//! full disks and power losses.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use silt_disk::{
    inject_fsync_errors, inject_fsync_errors_from_spec, inject_write_errors, record_unsynced, set_len,
    sync_all, sync_data, write_all_at, Fault, FaultKind, PowerLoss,
};

use crate::sync::lock;

/// Directories an fsync failed in whose data could not be cut back to what is on disk.
static DISTRUSTED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Makes everything written under `data_dir` durable before an agent reads it: a process of
/// the agent that was killed may have left bytes in the page cache only, which a log opened
/// now would count as held. One `syncfs(2)` of the filesystem, however many logs there are.
/// If it fails, nothing tells which bytes are on the disk: `data_dir` is distrusted.
pub fn sync_at_start(data_dir: &Path) -> io::Result<()> {
    let synced = silt_disk::sync_filesystem(data_dir);
    if synced.is_err() {
        distrust(data_dir);
    }
    synced
}

/// Marks `dir` (a partition's directory) as holding data that may not be on its disk: no log
/// is opened there again by this process.
pub fn distrust(dir: &Path) {
    lock(&DISTRUSTED).insert(dir.to_path_buf());
}

/// Forgets what this process distrusted under `data_dir` and stops the faults injected for
/// files there: for a simulation in which the agent of `data_dir` crashed and a new process
/// of it starts, in the same process as the old one.
pub fn forget_process(data_dir: &Path) {
    lock(&DISTRUSTED).retain(|d| !d.starts_with(data_dir));
    silt_disk::forget_faults_under(data_dir);
}

/// Whether an fsync failure left some directory under `data_dir` distrusted: the agent of
/// `data_dir` needs a restart to use it again.
pub fn distrusts_any_under(data_dir: &Path) -> bool {
    lock(&DISTRUSTED).iter().any(|d| d.starts_with(data_dir))
}

/// Whether an fsync failure left `dir` (or a directory it is in) distrusted.
pub fn is_distrusted(dir: &Path) -> bool {
    lock(&DISTRUSTED).iter().any(|d| dir.starts_with(d))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use silt_disk::EIO;

    use super::*;

    #[test]
    fn what_an_agent_finds_at_start_is_made_durable_or_distrusted() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("agent");
        std::fs::create_dir_all(data.join("log").join("t~1").join("0")).unwrap();
        let fault = inject_fsync_errors(&data.to_string_lossy(), 1, 1);
        sync_at_start(&data).unwrap();
        assert_eq!(fault.synced(), 1, "synced");
        assert!(!is_distrusted(&data.join("log")));
        let e = sync_at_start(&data).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(EIO), "{e}");
        assert!(is_distrusted(&data.join("log").join("t~1").join("0")), "every log under it");
    }

    #[test]
    fn a_directory_is_distrusted_with_everything_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let partition = dir.path().join("t~1").join("0");
        assert!(!is_distrusted(&partition));
        distrust(&partition);
        assert!(is_distrusted(&partition) && is_distrusted(&partition.join("x")));
        assert!(!is_distrusted(&dir.path().join("t~1").join("1")));
    }
}
