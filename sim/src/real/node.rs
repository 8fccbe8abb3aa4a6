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
            let signal = if frozen { "-STOP" } else { "-CONT" };
            crate::net::run("kill", &[signal, &child.id().to_string()])?;
            self.paused = frozen;
        }
        Ok(())
    }

    /// Whether the process is frozen.
    pub(crate) fn is_frozen(&self) -> bool {
        self.paused
    }

    /// Moves the wall clock the process sees to `offset_s` seconds from the real one (within
    /// a second: libfaketime reads the file that often). False when the node runs without
    /// libfaketime.
    pub(crate) fn step_clock(&self, offset_s: i64) -> anyhow::Result<bool> {
        let Some(file) = &self.clock else { return Ok(false) };
        std::fs::write(file, format!("{offset_s:+}\n"))?;
        Ok(true)
    }

    /// The last `lines` lines of the process's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
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
