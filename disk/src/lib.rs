//! The one seam every fsync, write and cut of Silt's durable files goes through: the agent's
//! segments and fences, the metadata service's Raft log and its atomically replaced files.
//!
//! Every fsync goes through [`sync_data`], [`sync_all`] or [`sync_filesystem`], and every write
//! and cut of a file whose bytes are read back after a crash through [`write_all_at`] and
//! [`set_len`]: there tests make fsyncs fail ([`inject_fsync_errors`]), writes fail on a full
//! disk or stop short ([`inject_write_errors`]), and a power loss take back every write no
//! fsync covered, or tear the first of them ([`record_unsynced`], [`PowerLoss::lose_unsynced`]).
//! Creations, renames and deletions of directory entries are not recorded: a power loss
//! keeps them.
//!
//! With no fault injected and no power loss recorded, each call is the system call alone,
//! after one atomic load.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Injected fsync errors; `ANY_FAULTS` spares the lock while there are none.
static FAULTS: Mutex<Vec<Arc<Fault>>> = Mutex::new(Vec::new());
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
    let faults = matching(path, FaultKind::Fsync);
    if let Some(fault) = faults.iter().find(|f| f.fires()) {
        fault.failed.fetch_add(1, Ordering::SeqCst);
        // The worst a kernel does: the data stays in the page cache, readable, and is not on
        // the disk.
        return Err(io::Error::from_raw_os_error(EIO));
    }
    sync()?;
    for f in faults {
        f.synced.fetch_add(1, Ordering::SeqCst);
    }
    synced(path);
    Ok(())
}

/// `pwrite(2)` of all of `buf` at `position` of `file` at `path`.
pub fn write_all_at(file: &File, path: &Path, buf: &[u8], position: u64) -> io::Result<()> {
    if !ANY_FAULTS.load(Ordering::Acquire) {
        return file.write_all_at(buf, position);
    }
    let faults = [matching(path, FaultKind::NoSpace), matching(path, FaultKind::ShortWrite)].concat();
    let fired = faults.iter().find(|f| f.fires());
    // A short write puts down half of the bytes before it fails; a full disk none.
    let len = match fired {
        Some(f) if f.kind == FaultKind::ShortWrite => buf.len() / 2,
        Some(_) => 0,
        None => buf.len(),
    };
    record_write(file, path, &buf[..len], position)?;
    file.write_all_at(&buf[..len], position)?;
    match fired {
        Some(f) => {
            f.failed.fetch_add(1, Ordering::SeqCst);
            Err(io::Error::from_raw_os_error(ENOSPC))
        }
        None => {
            for f in faults {
                f.synced.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }
}

/// `ftruncate(2)` of `file` at `path` to `len` bytes.
pub fn set_len(file: &File, path: &Path, len: u64) -> io::Result<()> {
    if ANY_FAULTS.load(Ordering::Acquire) {
        record_set_len(file, path, len)?;
    }
    file.set_len(len)
}

/// `syncfs(2)` of the filesystem `dir` is on: everything written under `dir` is on the disk.
pub fn sync_filesystem(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| fsync_with(dir, || rustix::fs::syncfs(&d).map_err(io::Error::from)))?;
    synced_tree(dir);
    Ok(())
}

/// Stops the faults injected for files under `dir`: for a simulation in which the process
/// that owns `dir` crashed and a new one starts, in the same process as the old one.
pub fn forget_faults_under(dir: &Path) {
    let prefix = dir.to_string_lossy();
    lock(&FAULTS).retain(|f| !f.path_part.starts_with(prefix.as_ref()));
}

/// `EIO`, what a failed writeback reports.
pub const EIO: i32 = 5;
/// `ENOSPC`, what a write to a full disk reports.
pub const ENOSPC: i32 = 28;

/// What an injected fault does to the calls it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// An fsync fails with `EIO`; the data stays in the page cache.
    Fsync,
    /// A write fails with `ENOSPC` and writes nothing.
    NoSpace,
    /// A write puts down half of its bytes, then fails with `ENOSPC`.
    ShortWrite,
}

/// Calls that are made to fail: of files whose path contains `path_part`, the `count` after
/// the first `skip` of the kind that would have run. Counts what happened to the calls it
/// matched.
#[derive(Debug)]
pub struct Fault {
    kind: FaultKind,
    path_part: String,
    skip: u32,
    count: u32,
    seen: AtomicU32,
    failed: AtomicU32,
    synced: AtomicU32,
}

impl Fault {
    /// Whether this fsync is one to fail; counts it either way.
    fn fires(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        n >= self.skip && n - self.skip < self.count
    }

    /// How many matching calls were made to fail.
    pub fn failed(&self) -> u32 {
        self.failed.load(Ordering::SeqCst)
    }

    /// How many matching calls succeeded.
    pub fn synced(&self) -> u32 {
        self.synced.load(Ordering::SeqCst)
    }
}

/// From now on, makes `count` fsyncs of files whose path contains `path_part` fail with `EIO`,
/// after `skip` of them ran. For tests: the process's fsyncs are the seam.
pub fn inject_fsync_errors(path_part: &str, skip: u32, count: u32) -> Arc<Fault> {
    inject(FaultKind::Fsync, path_part, skip, count)
}

/// From now on, makes `count` writes to files whose path contains `path_part` fail as `kind`
/// says ([`FaultKind::NoSpace`] or [`FaultKind::ShortWrite`]), after `skip` of them ran.
pub fn inject_write_errors(kind: FaultKind, path_part: &str, skip: u32, count: u32) -> Arc<Fault> {
    inject(kind, path_part, skip, count)
}

fn inject(kind: FaultKind, path_part: &str, skip: u32, count: u32) -> Arc<Fault> {
    let fault = Arc::new(Fault {
        kind,
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
pub fn inject_fsync_errors_from_spec(spec: &str) -> Result<Vec<Arc<Fault>>, String> {
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

/// The injected faults of `kind` that match `path`.
fn matching(path: &Path, kind: FaultKind) -> Vec<Arc<Fault>> {
    let path = path.to_string_lossy();
    lock(&FAULTS).iter().filter(|f| f.kind == kind && path.contains(f.path_part.as_str())).cloned().collect()
}

/// Files whose writes since their last fsync are recorded, to be taken back by a power loss.
static RECORDERS: Mutex<Vec<Arc<PowerLoss>>> = Mutex::new(Vec::new());

/// A power loss to come, for tests: for each file whose path contains its path part, what
/// every write and cut since the file's last fsync replaced and put down.
#[derive(Debug)]
pub struct PowerLoss {
    path_part: String,
    unsynced: Mutex<BTreeMap<PathBuf, Vec<Change>>>,
}

/// One write or cut no fsync covered yet: enough to undo it and to do it again.
#[derive(Debug)]
struct Change {
    /// The file's length before it.
    len_before: u64,
    /// Where it starts: a write's position, a cut's new length.
    position: u64,
    /// The bytes it replaced from `position` on (within `len_before`).
    replaced: Vec<u8>,
    /// A write's bytes; a cut puts down none.
    written: Option<Vec<u8>>,
    /// A cut's new length.
    cut_to: Option<u64>,
}

impl Change {
    /// The file's length after it.
    fn len_after(&self) -> u64 {
        match (&self.written, self.cut_to) {
            (Some(bytes), _) => self.len_before.max(self.position + bytes.len() as u64),
            (None, Some(len)) => len,
            (None, None) => self.len_before,
        }
    }
}

/// From now on, records writes and cuts of files whose path contains `path_part` until each
/// file's next fsync: [`PowerLoss::lose_unsynced`] takes them back.
pub fn record_unsynced(path_part: &str) -> Arc<PowerLoss> {
    let recorder = Arc::new(PowerLoss { path_part: path_part.to_string(), unsynced: Mutex::default() });
    lock(&RECORDERS).push(Arc::clone(&recorder));
    ANY_FAULTS.store(true, Ordering::Release);
    recorder
}

impl PowerLoss {
    /// Puts every recorded file back as its last fsync left it, then puts down again the first
    /// `torn` bytes of what was written to it since, in the order written (the power failed
    /// during the write that follows them; cuts among them are done again too, a cut before
    /// the first write even when `torn` is 0), each file with its own `torn` bytes. Pages
    /// written out of order are not modelled. A file deleted since is skipped, and so are its
    /// changes when another file was created under its name (told by its length at the new
    /// file's first change: one deleted when as long as the new one starts is not told apart). The process's
    /// open files must not be used afterwards: the process is gone.
    pub fn lose_unsynced(&self, torn: usize) -> io::Result<()> {
        let unsynced = std::mem::take(&mut *lock(&self.unsynced));
        for (path, changes) in unsynced {
            let file = match OpenOptions::new().write(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for c in changes.iter().rev() {
                file.write_all_at(&c.replaced, c.position)?;
                file.set_len(c.len_before)?;
            }
            let mut budget = torn;
            for c in &changes {
                match (&c.written, c.cut_to) {
                    (Some(bytes), _) => {
                        let n = bytes.len().min(budget);
                        file.write_all_at(&bytes[..n], c.position)?;
                        budget -= n;
                        if n < bytes.len() {
                            break;
                        }
                    }
                    (None, Some(len)) => file.set_len(len)?,
                    (None, None) => {}
                }
            }
            file.sync_all()?;
        }
        Ok(())
    }

    /// Bytes written and not yet covered by an fsync, over every recorded file.
    pub fn unsynced_bytes(&self) -> usize {
        lock(&self.unsynced).values().flatten().filter_map(|c| c.written.as_ref().map(Vec::len)).sum()
    }
}

fn recorders(path: &Path) -> Vec<Arc<PowerLoss>> {
    let p = path.to_string_lossy();
    lock(&RECORDERS).iter().filter(|r| p.contains(r.path_part.as_str())).cloned().collect()
}

/// What a write of `bytes` at `position` replaces, for the power losses that watch `path`.
fn record_write(file: &File, path: &Path, bytes: &[u8], position: u64) -> io::Result<()> {
    record(file, path, position, position + bytes.len() as u64, Some(bytes.to_vec()), None)
}

/// What a cut to `len` takes away, for the power losses that watch `path`.
fn record_set_len(file: &File, path: &Path, len: u64) -> io::Result<()> {
    record(file, path, len, u64::MAX, None, Some(len))
}

fn record(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
    written: Option<Vec<u8>>,
    cut_to: Option<u64>,
) -> io::Result<()> {
    let recorders = recorders(path);
    if recorders.is_empty() {
        return Ok(());
    }
    let len_before = file.metadata()?.len();
    let mut replaced = vec![0; to.min(len_before).saturating_sub(from) as usize];
    file.read_exact_at(&mut replaced, from)?;
    for r in recorders {
        let change = Change {
            len_before,
            position: from,
            replaced: replaced.clone(),
            written: written.clone(),
            cut_to,
        };
        let mut unsynced = lock(&r.unsynced);
        let changes = unsynced.entry(path.to_path_buf()).or_default();
        // A length other than the last change left: the file was deleted and another created
        // under its name (or cut outside the seam); what was recorded belongs to no file now.
        if changes.last().is_some_and(|c| c.len_after() != len_before) {
            changes.clear();
        }
        changes.push(change);
    }
    Ok(())
}

/// An fsync of `path` succeeded: what was written to it is on the disk.
fn synced(path: &Path) {
    for r in recorders(path) {
        lock(&r.unsynced).remove(path);
    }
}

/// A `syncfs` of the filesystem `dir` is on succeeded: every file under it is on the disk.
fn synced_tree(dir: &Path) {
    for r in lock(&RECORDERS).iter() {
        lock(&r.unsynced).retain(|path, _| !path.starts_with(dir));
    }
}

/// Locks `m`; what each lock here guards is consistent whenever its guard is dropped, so a
/// poisoned one is taken all the same.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        assert_eq!(e.raw_os_error(), Some(EIO), "{e}");
        assert!(sync_data(&files[1], &spared).is_ok(), "another file's fsyncs run");
    }

    #[test]
    fn a_full_disk_writes_nothing_and_a_short_write_half_and_both_say_enospc() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        let full = inject_write_errors(FaultKind::NoSpace, &path.to_string_lossy(), 1, 1);
        write_all_at(&file, &path, b"0123", 0).unwrap();
        let e = write_all_at(&file, &path, b"4567", 4).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(ENOSPC), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"0123");
        let short = inject_write_errors(FaultKind::ShortWrite, &path.to_string_lossy(), 0, 1);
        let e = write_all_at(&file, &path, b"4567", 4).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(ENOSPC), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"012345");
        write_all_at(&file, &path, b"4567", 4).unwrap();
        assert_eq!((full.failed(), full.synced(), short.failed(), short.synced()), (1, 2, 1, 1));
    }

    #[test]
    fn a_power_loss_takes_back_what_no_fsync_covered_and_may_tear_the_first_write_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.log");
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        let power = record_unsynced(&path.to_string_lossy());
        let unsynced = |torn: usize, expected: &[u8]| {
            write_all_at(&file, &path, b"synced--", 0).unwrap();
            sync_data(&file, &path).unwrap();
            assert_eq!(power.unsynced_bytes(), 0);
            write_all_at(&file, &path, b"AAAA", 4).unwrap(); // in place
            write_all_at(&file, &path, b"BBBB", 8).unwrap(); // past the end
            set_len(&file, &path, 10).unwrap();
            write_all_at(&file, &path, b"C", 2).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"syCcAAAABB");
            assert_eq!(power.unsynced_bytes(), 9);
            power.lose_unsynced(torn).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), expected, "torn after {torn} bytes");
            set_len(&file, &path, 0).unwrap();
            sync_all(&file, &path).unwrap();
        };
        unsynced(0, b"synced--");
        unsynced(2, b"syncAA--");
        unsynced(6, b"syncAAAABB");
        unsynced(8, b"syncAAAABB");
        unsynced(9, b"syCcAAAABB");
    }

    #[test]
    fn a_power_loss_leaves_a_file_created_again_under_a_deleted_ones_name_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.log");
        let power = record_unsynced(&path.to_string_lossy());
        let open = || OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        let old = open();
        write_all_at(&old, &path, b"old, never synced", 0).unwrap();
        drop(old);
        std::fs::remove_file(&path).unwrap();
        let new = open();
        write_all_at(&new, &path, b"new", 0).unwrap();
        // The power fails after the new file's first three bytes reached the disk.
        power.lose_unsynced(3).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
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
}
