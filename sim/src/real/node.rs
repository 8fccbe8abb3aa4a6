//! One `silt` process of a `silt-faults` run, in its node's network namespace, with a wall
//! clock libfaketime can step: started, killed with SIGKILL, frozen with SIGSTOP, started again
//! on the same data directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::net::namespace;

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
    child: Option<Child>,
    paused: bool,
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
            clock,
            child: None,
            paused: false,
        })
    }

    /// Starts the process (`ip netns exec` and `env` exec it: the child's pid is silt's).
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &namespace(&self.name), "env"]);
        if let Some(file) = &self.clock {
            cmd.arg(format!("LD_PRELOAD={LIBFAKETIME}"))
                .arg(format!("FAKETIME_TIMESTAMP_FILE={}", file.display()))
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
        // Written aside and renamed over: libfaketime reading a file half written (empty) would
        // end the process.
        let next = file.with_extension("next");
        std::fs::write(&next, format!("{offset_s:+}\n"))?;
        std::fs::rename(&next, file)?;
        Ok(true)
    }

    /// The last `lines` lines of the process's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
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
