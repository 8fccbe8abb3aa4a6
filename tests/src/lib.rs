//! Harness for Silt's end-to-end tests: starts real `silt` processes on loopback ports with
//! temporary directories and talks to them the way a user would.
//!
//! The binary is taken from `$SILT_BIN`, or from the cargo target directory this test binary
//! was built in (`cargo build -p silt` first; the README's test command does).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use silt::client::Client;

/// Path of the `silt` binary under test.
pub fn silt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SILT_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test binary> -> target/<profile>/silt
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("silt");
    assert!(bin.exists(), "{} not found: run `cargo build -p silt` first or set SILT_BIN", bin.display());
    bin
}

/// Waits until `check` returns `Some`, polling every 20 ms, failing after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running `silt dev` process.
pub struct SiltDev {
    child: Option<Child>,
    data_dir: PathBuf,
    url: String,
    log: PathBuf,
    options: DevOptions,
    _tmp: Option<tempfile::TempDir>,
}

/// How to start `silt dev`.
#[derive(Debug, Clone, Default)]
pub struct DevOptions {
    /// `--object-store` URL; the default is a folder in the data directory.
    pub object_store: Option<String>,
    /// Extra environment (AWS_* for an S3 emulator, fault injection).
    pub env: Vec<(String, String)>,
}

impl SiltDev {
    /// Starts `silt dev` in a fresh temporary directory.
    pub fn start() -> SiltDev {
        Self::start_with(DevOptions::default())
    }

    /// Starts `silt dev` in a fresh temporary directory with options.
    pub fn start_with(options: DevOptions) -> SiltDev {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = tmp.path().join("data");
        let mut dev = SiltDev {
            child: None,
            data_dir,
            url: String::new(),
            log: tmp.path().join("silt.log"),
            options,
            _tmp: Some(tmp),
        };
        dev.spawn();
        dev
    }

    /// The options it was started with.
    pub fn options(&self) -> &DevOptions {
        &self.options
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut cmd = Command::new(silt_bin());
        cmd.args(["dev", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&self.data_dir);
        if let Some(url) = &self.options.object_store {
            cmd.args(["--object-store", url]);
        }
        cmd.envs(self.options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut child = cmd
            .env("SILT_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn silt dev");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("silt dev listening on ") {
                    let url = rest.split_whitespace().next().unwrap_or_default().to_string();
                    let _ = tx.send(url);
                }
            }
        });
        let url = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!(
                "silt dev did not start within 30s; log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        });
        self.url = url;
        self.child = Some(child);
    }

    /// The API URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A client for this process.
    pub fn client(&self) -> Client {
        Client::new(&self.url).expect("client")
    }

    /// The process's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process with SIGKILL and waits for it to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let status = child.wait().expect("wait");
            assert!(status.success(), "silt dev exited with {status}; log:\n{}", self.log());
        }
    }

    /// Starts the process again on the same data directory (on a new port).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        self.spawn();
    }
}

impl Drop for SiltDev {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs the `silt` CLI with `args` against `server` and returns stdout, failing on error.
pub fn silt_cli(server: &str, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(silt_bin())
        .args(args)
        .env("SILT_SERVER", server)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn silt");
    if let Some(input) = stdin {
        let mut s = child.stdin.take().expect("stdin");
        s.write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait silt");
    assert!(
        out.status.success(),
        "silt {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 stdout")
}
