//! One `silt` process of a `silt-faults` run, in its node's network namespace, with a wall
//! clock libfaketime can step: started, killed with SIGKILL, frozen with SIGSTOP, started again
//! on the same data directory; and an agent's disk of its own, which a fault fills up or slows.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::net::{namespace, run};

/// Where Debian's `faketime` package puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A node's process and how to start it again.
pub(crate) struct Node {
    pub(crate) name: String,
    silt: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// The file libfaketime reads the clock's offset from (`None`: the real clock).
    clock: Option<PathBuf>,
    /// Libraries preloaded into the process (libfaketime, `libsilt_slow_fsync.so`).
    preload: Vec<PathBuf>,
    child: Option<Child>,
    paused: bool,
    /// The file `libsilt_slow_fsync.so` reads each fsync's delay from (`None`: not preloaded).
    fsync_delay: Option<PathBuf>,
    /// Whether that delay is above 0 now.
    slowed: bool,
    /// The node's own disk, when it has one; dropped (unmounted) after the process ends.
    disk: Option<Disk>,
}

impl Node {
    /// A node that runs `silt <args>`, logging to `<dir>/<name>.log`; with `step_clock`, under
    /// libfaketime with an offset of 0 until [`Node::step_clock`].
    pub(crate) fn new(
        name: &str,
        silt: &Path,
        args: Vec<String>,
        dir: &Path,
        step_clock: bool,
    ) -> anyhow::Result<Node> {
        let clock = if step_clock && Path::new(LIBFAKETIME).exists() {
            let file = dir.join(format!("{name}.faketime"));
            std::fs::write(&file, "+0\n")?;
            Some(file)
        } else {
            None
        };
        Ok(Node {
            name: name.to_string(),
            silt: silt.to_path_buf(),
            args,
            log: dir.join(format!("{name}.log")),
            preload: clock.iter().map(|_| PathBuf::from(LIBFAKETIME)).collect(),
            clock,
            child: None,
            paused: false,
            fsync_delay: None,
            slowed: false,
            disk: None,
        })
    }

    /// Gives the node `disk` (its data directory lives on it), and preloads `slow_fsync` (the
    /// path of `libsilt_slow_fsync.so`, when there is one) so that its fsyncs can be slowed.
    pub(crate) fn with_disk(
        mut self,
        disk: Disk,
        slow_fsync: Option<&Path>,
        dir: &Path,
    ) -> anyhow::Result<Node> {
        self.disk = Some(disk);
        if let Some(lib) = slow_fsync {
            let file = dir.join(format!("{}.fsync-delay", self.name));
            replace_file(&file, "0\n")?;
            self.preload.push(lib.to_path_buf());
            self.fsync_delay = Some(file);
        }
        Ok(self)
    }

    /// The node's own disk, if it has one.
    pub(crate) fn disk(&self) -> Option<&Disk> {
        self.disk.as_ref()
    }

    /// Delays every fsync and fdatasync of the process by `delay_ms` from now on (`None`: no
    /// more), through the file the preloaded `libsilt_slow_fsync.so` reads at every call. False
    /// when the node runs without that library.
    pub(crate) fn slow_disk(&mut self, delay_ms: Option<u64>) -> anyhow::Result<bool> {
        let Some(file) = &self.fsync_delay else { return Ok(false) };
        replace_file(file, &format!("{}\n", delay_ms.unwrap_or(0)))?;
        self.slowed = delay_ms.is_some();
        Ok(true)
    }

    /// Whether the process's fsyncs are being delayed.
    pub(crate) fn is_slowed(&self) -> bool {
        self.slowed
    }

    /// Whether the process runs with `libsilt_slow_fsync.so`, so that [`Node::slow_disk`] works.
    pub(crate) fn has_slow_disk(&self) -> bool {
        self.fsync_delay.is_some()
    }

    /// Starts the process (`ip netns exec` and `env` exec it: the child's pid is silt's).
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &namespace(&self.name), "env"]);
        if !self.preload.is_empty() {
            let libs: Vec<String> = self.preload.iter().map(|l| l.display().to_string()).collect();
            cmd.arg(format!("LD_PRELOAD={}", libs.join(":")));
        }
        if let Some(file) = &self.fsync_delay {
            cmd.arg(format!("SILT_SLOW_FSYNC_FILE={}", file.display()));
        }
        if let Some(file) = &self.clock {
            cmd.arg(format!("FAKETIME_TIMESTAMP_FILE={}", file.display()))
                .arg("FAKETIME_CACHE_DURATION=1")
                .arg("FAKETIME_DONT_FAKE_MONOTONIC=1");
        }
        cmd.arg("SILT_LOG=info,openraft=warn")
            .arg(&self.silt)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(cmd.spawn().with_context(|| format!("starting {}", self.name))?);
        self.paused = false;
        Ok(())
    }

    /// Whether the process runs (or is frozen).
    pub(crate) fn is_up(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the process with SIGKILL: what it wrote stays in the page cache.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the process.
    pub(crate) fn freeze(&mut self, frozen: bool) -> anyhow::Result<()> {
        if let Some(child) = &self.child {
            let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
            signal_process(child.id(), signal)
                .with_context(|| format!("sending signal {signal} to {}", self.name))?;
            self.paused = frozen;
        }
        Ok(())
    }

    /// Whether the process is frozen.
    pub(crate) fn is_frozen(&self) -> bool {
        self.paused
    }

    /// Whether the process runs under libfaketime, so that [`Node::step_clock`] moves its clock.
    pub(crate) fn has_fake_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Moves the wall clock the process sees to `offset_s` seconds from the real one (within
    /// about two seconds: libfaketime reads the file again once a second has passed since it
    /// last did). False when the node runs without libfaketime.
    pub(crate) fn step_clock(&self, offset_s: i64) -> anyhow::Result<bool> {
        let Some(file) = &self.clock else { return Ok(false) };
        // Replaced whole: libfaketime reading a file half written (empty) would end the process.
        replace_file(file, &format!("{offset_s:+}\n"))?;
        Ok(true)
    }

    /// The last `lines` lines of the process's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Writes `text` to `file` aside and renames it over, so that no reader sees it half written.
fn replace_file(file: &Path, text: &str) -> std::io::Result<()> {
    let next = file.with_extension("next");
    std::fs::write(&next, text)?;
    std::fs::rename(&next, file)
}

/// Sends `signal` to the process `pid`.
#[allow(unsafe_code, reason = "kill(2) has no safe wrapper among this crate's dependencies")]
fn signal_process(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) takes plain integers and touches no memory of this process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.freeze(false);
        }
        self.kill9();
    }
}

/// A small tmpfs mounted for one node's data directory, so that a fault can fill it up without
/// touching the machine's own disk. Unmounted when dropped.
pub(crate) struct Disk {
    mount: PathBuf,
    /// The file that takes up the free space while the disk is full.
    ballast: PathBuf,
}

impl Disk {
    /// Mounts a tmpfs of `mib` MiB at `mount` (created if missing).
    pub(crate) fn mount(mount: &Path, mib: u64) -> anyhow::Result<Disk> {
        std::fs::create_dir_all(mount)?;
        // Whatever an interrupted run left mounted there goes first.
        let _ = run("umount", &["-l", &mount.display().to_string()]);
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "silt-faults",
                &mount.display().to_string(),
            ],
        )
        .with_context(|| format!("mounting a tmpfs at {}", mount.display()))?;
        Ok(Disk { mount: mount.to_path_buf(), ballast: mount.join("ballast") })
    }

    /// Where the node keeps its data on this disk.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.mount.join("data")
    }

    /// Takes up all the free space: every write to the disk fails with ENOSPC until
    /// [`Disk::free`]. Returns the bytes it took.
    pub(crate) fn fill(&self) -> anyhow::Result<u64> {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.ballast)?;
        let mut taken = 0u64;
        for chunk in [1 << 20, 4096, 512] {
            let buf = vec![0u8; chunk];
            loop {
                match file.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => taken += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(e) => return Err(e).context("filling a disk"),
                }
            }
        }
        Ok(taken)
    }

    /// Frees what [`Disk::fill`] took.
    pub(crate) fn free(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(&self.ballast) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).context("freeing a disk"),
            _ => Ok(()),
        }
    }

    /// Whether the disk is filled up now.
    pub(crate) fn is_full(&self) -> bool {
        self.ballast.exists()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", &self.mount.display().to_string()]);
    }
}
