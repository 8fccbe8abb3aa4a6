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
//! Every fsync of the agent's logs and fences goes through [`sync_data`] or [`sync_all`], the
//! seam where tests make fsyncs fail ([`inject_fsync_errors`]).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Directories an fsync failed in whose data could not be cut back to what is on disk.
static DISTRUSTED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Injected fsync errors; `ANY_FAULTS` spares the lock while there are none.
static FAULTS: Mutex<Vec<Arc<FsyncFault>>> = Mutex::new(Vec::new());
static ANY_FAULTS: AtomicBool = AtomicBool::new(false);

/// `fdatasync(2)` of `file` at `path`.
pub fn sync_data(file: &File, path: &Path) -> io::Result<()> {
    fsync_with(path, || file.sync_data())
}

/// `fsync(2)` of `file` (or a directory) at `path`.
pub fn sync_all(file: &File, path: &Path) -> io::Result<()> {
    fsync_with(path, || file.sync_all())
}

fn fsync_with(path: &Path, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    if !ANY_FAULTS.load(Ordering::Acquire) {
        return sync();
    }
    let faults: Vec<Arc<FsyncFault>> = lock(&FAULTS)
        .iter()
        .filter(|f| path.to_string_lossy().contains(f.path_part.as_str()))
        .cloned()
        .collect();
    if let Some(fault) = faults.iter().find(|f| f.fires()) {
        fault.failed.fetch_add(1, Ordering::SeqCst);
        // The worst a kernel does: the data stays in the page cache, readable, and is not on
        // the disk.
        return Err(io::Error::from_raw_os_error(libc_eio()));
    }
    sync()?;
    for f in faults {
        f.synced.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// `EIO`, what a failed writeback reports.
const fn libc_eio() -> i32 {
    5
}

/// Makes everything written under `data_dir` durable before an agent reads it: a process of
/// the agent that was killed may have left bytes in the page cache only, which a log opened
/// now would count as held. One `syncfs(2)` of the filesystem, however many logs there are.
/// If it fails, nothing tells which bytes are on the disk: `data_dir` is distrusted.
pub fn sync_at_start(data_dir: &Path) -> io::Result<()> {
    let synced = File::open(data_dir)
        .and_then(|dir| fsync_with(data_dir, || rustix::fs::syncfs(&dir).map_err(io::Error::from)));
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

/// Whether an fsync failure left `dir` (or a directory it is in) distrusted.
pub fn is_distrusted(dir: &Path) -> bool {
    lock(&DISTRUSTED).iter().any(|d| dir.starts_with(d))
}

/// fsyncs that are made to fail: of files whose path contains `path_part`, the `count` after
/// the first `skip` that would have run. Counts what happened to the fsyncs it matched.
#[derive(Debug)]
pub struct FsyncFault {
    path_part: String,
    skip: u32,
    count: u32,
    seen: AtomicU32,
    failed: AtomicU32,
    synced: AtomicU32,
}

impl FsyncFault {
    /// Whether this fsync is one to fail; counts it either way.
    fn fires(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        n >= self.skip && n - self.skip < self.count
    }

    /// How many matching fsyncs were made to fail.
    pub fn failed(&self) -> u32 {
        self.failed.load(Ordering::SeqCst)
    }

    /// How many matching fsyncs succeeded.
    pub fn synced(&self) -> u32 {
        self.synced.load(Ordering::SeqCst)
    }
}

/// From now on, makes `count` fsyncs of files whose path contains `path_part` fail with `EIO`,
/// after `skip` of them ran. For tests: the process's fsyncs are the seam.
pub fn inject_fsync_errors(path_part: &str, skip: u32, count: u32) -> Arc<FsyncFault> {
    let fault = Arc::new(FsyncFault {
        path_part: path_part.to_string(),
        skip,
        count,
        seen: AtomicU32::new(0),
        failed: AtomicU32::new(0),
        synced: AtomicU32::new(0),
    });
    lock(&FAULTS).push(Arc::clone(&fault));
    ANY_FAULTS.store(true, Ordering::Release);
    fault
}

/// Injects the fsync errors `spec` lists, for tests of whole processes:
/// `<path part>:<skip>:<count>`, several separated by `;` (see [`inject_fsync_errors`]).
pub fn inject_fsync_errors_from_spec(spec: &str) -> Result<Vec<Arc<FsyncFault>>, String> {
    let mut parsed = Vec::new();
    for fault in spec.split(';').filter(|f| !f.trim().is_empty()) {
        let mut fields = fault.trim().rsplitn(3, ':');
        let (count, skip, path_part) = (fields.next(), fields.next(), fields.next());
        let (Some(count), Some(skip), Some(path_part)) = (count, skip, path_part) else {
            return Err(format!("'{fault}' is not <path part>:<skip>:<count>"));
        };
        let number = |v: &str, what: &str| {
            v.parse::<u32>().map_err(|_| format!("'{fault}': {what} '{v}' is not a whole number"))
        };
        if path_part.is_empty() {
            return Err(format!("'{fault}': the path part is empty (it would match every file)"));
        }
        parsed.push((path_part.to_string(), number(skip, "skip")?, number(count, "count")?));
    }
    Ok(parsed
        .into_iter()
        .map(|(path_part, skip, count)| inject_fsync_errors(&path_part, skip, count))
        .collect())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use super::*;

    #[test]
    fn injected_fsync_errors_hit_the_matching_fsyncs_after_the_skipped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (hit, spared) = (dir.path().join("a:1.log"), dir.path().join("b.log"));
        let files = [&hit, &spared].map(|p| File::create(p).unwrap());
        let faults = inject_fsync_errors_from_spec(&format!("{}:1:2", hit.display())).unwrap();
        let outcomes: Vec<bool> = (0..4).map(|_| sync_data(&files[0], &hit).is_ok()).collect();
        assert_eq!(outcomes, [true, false, false, true]);
        assert_eq!((faults[0].failed(), faults[0].synced()), (2, 2));
        inject_fsync_errors(&hit.to_string_lossy(), 0, 1);
        let e = sync_all(&files[0], &hit).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc_eio()), "{e}");
        assert!(sync_data(&files[1], &spared).is_ok(), "another file's fsyncs run");
    }

    #[test]
    fn a_fault_spec_that_does_not_parse_says_why_and_injects_nothing() {
        for (spec, why) in [
            ("x.log:1", "is not <path part>:<skip>:<count>"),
            (":1:2", "the path part is empty"),
            ("x.log:one:2", "skip 'one' is not a whole number"),
            ("x.log:0:2;y.log:1:-1", "count '-1' is not a whole number"),
        ] {
            let e = inject_fsync_errors_from_spec(spec).unwrap_err();
            assert!(e.contains(why), "{spec}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let file = File::create(&path).unwrap();
        assert!(sync_data(&file, &path).is_ok(), "a spec that does not parse injects none of its faults");
    }

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
        assert_eq!(e.raw_os_error(), Some(libc_eio()), "{e}");
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
