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

use silt::client::{Client, RecordPage};

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

/// Every file under `dir`, at any depth (none if it does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
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

/// A running `silt dev` process, or a `silt agent` (see [`SiltDev::start_agent`]): both serve
/// the agent API.
pub struct SiltDev {
    /// `["dev"]`, or `["agent", "--id", ...]`: the arguments before `--listen`.
    command: Vec<String>,
    /// Whether the command takes `--data-dir` (`silt compactor` does not).
    has_data_dir: bool,
    child: Option<Child>,
    data_dir: PathBuf,
    url: String,
    log: PathBuf,
    options: DevOptions,
    /// Every line it printed to stdout.
    printed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _tmp: Option<tempfile::TempDir>,
}

/// How to start `silt dev`.
#[derive(Debug, Clone, Default)]
pub struct DevOptions {
    /// `--object-store` URL; the default is a folder in the data directory.
    pub object_store: Option<String>,
    /// Extra environment (AWS_* for an S3 emulator, fault injection).
    pub env: Vec<(String, String)>,
    /// More arguments (`--agents 3`).
    pub args: Vec<String>,
}

/// How to start `silt agent`.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `--id`.
    pub id: String,
    /// `--metadata` nodes.
    pub metadata: Vec<String>,
    /// `--object-store`, shared by every agent of the cluster.
    pub object_store: String,
    /// `--lease`, e.g. "2s".
    pub lease: String,
    /// More arguments (`--no-compactor`).
    pub extra: Vec<String>,
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
            command: vec!["dev".into()],
            has_data_dir: true,
            child: None,
            data_dir,
            url: String::new(),
            log: tmp.path().join("silt.log"),
            options,
            printed: Default::default(),
            _tmp: Some(tmp),
        };
        dev.spawn();
        dev
    }

    /// Starts `silt agent` in a fresh temporary directory.
    pub fn start_agent(agent: &AgentOptions) -> SiltDev {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut dev = SiltDev {
            command: vec![
                "agent".into(),
                "--id".into(),
                agent.id.clone(),
                "--metadata".into(),
                agent.metadata.join(","),
                "--lease".into(),
                agent.lease.clone(),
            ]
            .into_iter()
            .chain(agent.extra.iter().cloned())
            .collect(),
            has_data_dir: true,
            child: None,
            data_dir: tmp.path().join("data"),
            url: String::new(),
            log: tmp.path().join("silt.log"),
            options: DevOptions { object_store: Some(agent.object_store.clone()), ..DevOptions::default() },
            printed: Default::default(),
            _tmp: Some(tmp),
        };
        dev.spawn();
        dev
    }

    /// Starts `silt compactor` against a metadata cluster and a bucket; its `url()` serves
    /// `/metrics`.
    pub fn start_compactor(metadata: &[String], object_store: &str) -> SiltDev {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut dev = SiltDev {
            command: vec![
                "compactor".into(),
                "--metadata".into(),
                metadata.join(","),
                "--object-store".into(),
                object_store.into(),
            ],
            has_data_dir: false,
            child: None,
            data_dir: tmp.path().join("data"),
            url: String::new(),
            log: tmp.path().join("silt.log"),
            options: DevOptions::default(),
            printed: Default::default(),
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
        let ready = self.launch("127.0.0.1:0");
        self.wait_ready(ready);
    }

    /// Starts the process listening on `listen`; [`SiltDev::wait_ready`] waits for its address.
    fn launch(&mut self, listen: &str) -> mpsc::Receiver<String> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut cmd = Command::new(silt_bin());
        cmd.args(&self.command).args(["--listen", listen]);
        if self.has_data_dir {
            cmd.arg("--data-dir").arg(&self.data_dir);
        }
        if let Some(url) = &self.options.object_store {
            cmd.args(["--object-store", url]);
        }
        cmd.args(&self.options.args);
        cmd.envs(self.options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut child = cmd
            .env("SILT_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn silt");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let ready = format!("silt {} listening on ", self.command[0]);
        let printed = std::sync::Arc::clone(&self.printed);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                printed.lock().unwrap_or_else(|e| e.into_inner()).push(line.clone());
                if let Some(rest) = line.strip_prefix(ready.as_str()) {
                    let url = rest.split_whitespace().next().unwrap_or_default().to_string();
                    let _ = tx.send(url);
                }
            }
        });
        self.child = Some(child);
        rx
    }

    /// Waits until the launched process prints that it listens, and takes its address.
    fn wait_ready(&mut self, ready: mpsc::Receiver<String>) {
        let url = ready.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!(
                "silt {} did not start within 30s; log:\n{}",
                self.command[0],
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        });
        self.url = url;
    }

    /// The lines it printed to stdout so far (`silt dev --agents N` prints each agent's
    /// address).
    pub fn printed(&self) -> Vec<String> {
        self.printed.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill");
            assert!(status.success(), "kill {signal} failed");
        }
    }

    /// Deletes the data directory of a stopped process (a lost disk).
    pub fn wipe_data_dir(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        std::fs::remove_dir_all(&self.data_dir).expect("remove the data directory");
    }

    /// Sets an environment variable for the next start (a fault to inject after a restart).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.options.env.retain(|(k, _)| k != key);
        self.options.env.push((key.to_string(), value.to_string()));
    }

    /// Starts the process again on the same data directory (on a new port).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        self.spawn();
    }

    /// Starts every one of `devs` again at once, each on the same data directory and the same
    /// port as before (as a restarted machine would), and waits until all of them listen: none
    /// waits for another to be up first.
    pub fn restart_together(devs: &mut [SiltDev]) {
        let launched: Vec<mpsc::Receiver<String>> = devs
            .iter_mut()
            .map(|d| {
                assert!(d.child.is_none(), "stop or kill first");
                let listen = d.url.trim_start_matches("http://").to_string();
                d.launch(&listen)
            })
            .collect();
        for (d, ready) in devs.iter_mut().zip(launched) {
            d.wait_ready(ready);
        }
    }
}

/// Lines of a process's log a failing test prints.
const LOG_LINES_ON_FAILURE: usize = 80;

impl Drop for SiltDev {
    fn drop(&mut self) {
        self.kill9();
        // A failing test's output carries what the process logged last, since its data
        // directory (and the log in it) goes with the test.
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- last {} of {} lines of silt {}'s log ({}):\n{}",
                LOG_LINES_ON_FAILURE.min(lines.len()),
                lines.len(),
                self.command[0],
                self.log.display(),
                lines[lines.len().saturating_sub(LOG_LINES_ON_FAILURE)..].join("\n")
            );
        }
    }
}

/// What the agent at `agent_url` holds in its own log of `topic`/`partition` from `from` on (at
/// most `max` records), read through the endpoint other agents and the compactor use.
pub async fn held_records(agent_url: &str, topic: &str, partition: u32, from: u64, max: usize) -> RecordPage {
    held_records_if_any(agent_url, topic, partition, from, max)
        .await
        .unwrap_or_else(|| panic!("{agent_url} holds nothing of {topic}/{partition} committed at {from}"))
}

/// Like [`held_records`], but `None` when the agent answers that it holds no committed
/// segment at `from` (503), or that its log starts after `from` (`offset_out_of_range`: it
/// dropped its copies of archived segments).
pub async fn held_records_if_any(
    agent_url: &str,
    topic: &str,
    partition: u32,
    from: u64,
    max: usize,
) -> Option<RecordPage> {
    let url = format!(
        "{agent_url}/internal/v1/topics/{topic}/partitions/{partition}/held?from_offset={from}&max={max}"
    );
    let reply = reqwest::get(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = reply.status();
    let headers = reply.headers().clone();
    let body = reply.bytes().await.expect("held body");
    let out_of_range = status == reqwest::StatusCode::BAD_REQUEST
        && String::from_utf8_lossy(&body).contains("\"offset_out_of_range\"");
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE || out_of_range {
        return None;
    }
    assert!(status.is_success(), "{url}: {status} {}", String::from_utf8_lossy(&body));
    Some(RecordPage::decode(&headers, body).unwrap_or_else(|e| panic!("{url}: {e}")))
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

/// Runs the `silt` CLI with `args` against the metadata nodes `metadata` (`host:port,...`) and
/// returns stdout, failing on error.
pub fn silt_metadata_cli(metadata: &str, args: &[&str]) -> String {
    let out = Command::new(silt_bin())
        .args(args)
        .env("SILT_METADATA", metadata)
        .stdin(Stdio::null())
        .output()
        .expect("run silt");
    assert!(
        out.status.success(),
        "silt {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 stdout")
}

/// `n` distinct free loopback ports: each was bound on 127.0.0.1:0 and released. Another process
/// could take one in between; that is unlikely enough for tests.
pub fn free_loopback_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    listeners.iter().map(|l| l.local_addr().expect("local addr").port()).collect()
}

/// A running `silt metadata` process.
pub struct MetadataProcess {
    id: u64,
    addr: String,
    args: Vec<String>,
    data_dir: PathBuf,
    log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    paused: bool,
}

impl MetadataProcess {
    /// Starts `silt metadata --id <id> --listen <addr> --data-dir <dir>/m<id> <extra...>`, logging
    /// to `<dir>/m<id>.log`, and waits until it listens.
    pub fn start(dir: &Path, id: u64, addr: &str, extra: &[String]) -> MetadataProcess {
        MetadataProcess::start_with_env(dir, id, addr, extra, &[])
    }

    /// [`MetadataProcess::start`] with more environment variables (a fake clock, say).
    pub fn start_with_env(
        dir: &Path,
        id: u64,
        addr: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> MetadataProcess {
        let data_dir = dir.join(format!("m{id}"));
        let mut args: Vec<String> = vec![
            "metadata".into(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        args.extend(extra.iter().cloned());
        let mut node = MetadataProcess {
            id,
            addr: addr.to_string(),
            args,
            data_dir,
            log: dir.join(format!("m{id}.log")),
            env: env.to_vec(),
            child: None,
            paused: false,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut child = Command::new(silt_bin())
            .args(&self.args)
            .env("SILT_LOG", std::env::var("SILT_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn silt metadata");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("silt metadata listening on ") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("silt metadata node {} did not start within 30s; log:\n{}", self.id, self.log());
        }
        self.child = Some(child);
    }

    /// The node id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Whether the process runs (it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the node is not running");
        let status = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill {signal} node {} failed", self.id);
    }

    /// Kills the process with SIGKILL and waits for it to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Stops the process with SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) {
        if self.paused {
            self.resume();
        }
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let status = child.wait().expect("wait");
            assert!(status.success(), "silt metadata exited with {status}; log:\n{}", self.log());
        }
    }

    /// Starts the process again with the same arguments and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        self.spawn();
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    /// Its `/metadata/status`, or `None` if it does not answer within a second.
    pub async fn status(&self) -> Option<silt::silt_metadata::NodeStatus> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().ok()?;
        let reply = http.get(format!("{}/metadata/status", self.url())).send().await.ok()?;
        reply.json().await.ok()
    }
}

impl Drop for MetadataProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A cluster of `silt metadata` processes on free loopback ports, in one temporary directory.
pub struct MetadataCluster {
    nodes: Vec<MetadataProcess>,
    tmp: tempfile::TempDir,
}

impl MetadataCluster {
    /// Starts nodes `1..=n` with `--peers` naming them all, node 1 with `--init`, each with
    /// `extra` arguments too.
    pub fn start(n: u64, extra: &[&str]) -> MetadataCluster {
        MetadataCluster::start_with_env(n, extra, &[])
    }

    /// [`MetadataCluster::start`] with more environment variables for every node.
    pub fn start_with_env(n: u64, extra: &[&str], env: &[(String, String)]) -> MetadataCluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ports = free_loopback_ports(n as usize);
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let peers = peers.join(",");
        let nodes = (1..=n)
            .map(|id| {
                let mut args: Vec<String> = vec!["--peers".into(), peers.clone()];
                if id == 1 {
                    args.push("--init".into());
                }
                args.extend(extra.iter().map(|s| s.to_string()));
                MetadataProcess::start_with_env(tmp.path(), id, &addrs[id as usize - 1], &args, env)
            })
            .collect();
        MetadataCluster { nodes, tmp }
    }

    /// Starts one more node, `id`, on a free port without `--init` or `--peers`: it waits to be
    /// added (`silt cluster add-node`).
    pub fn start_extra(&mut self, id: u64, extra: &[&str]) -> &MetadataProcess {
        let port = free_loopback_ports(1)[0];
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        self.nodes.push(MetadataProcess::start(self.tmp.path(), id, &format!("127.0.0.1:{port}"), &args));
        self.node(id)
    }

    /// Node `id`.
    pub fn node(&self, id: u64) -> &MetadataProcess {
        self.nodes.iter().find(|n| n.id == id).expect("no such node")
    }

    /// Node `id`, to kill, pause or restart it.
    pub fn node_mut(&mut self, id: u64) -> &mut MetadataProcess {
        self.nodes.iter_mut().find(|n| n.id == id).expect("no such node")
    }

    /// Every node's `host:port`, in id order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// A client of every node.
    pub fn client(&self) -> silt::silt_metadata::MetadataClient {
        silt::silt_metadata::MetadataClient::new(self.addrs()).expect("metadata client")
    }

    /// Waits until the running, unpaused nodes among `among` agree on one leader among them that
    /// reports itself leading; returns its id.
    pub async fn wait_for_leader(&self, among: &[u64], timeout: Duration) -> u64 {
        wait_for("a metadata leader", timeout, || async {
            let mut leader = None;
            for id in among {
                let node = self.node(*id);
                if !node.is_running() || node.paused {
                    continue;
                }
                let status = node.status().await?;
                let seen = status.leader.as_ref()?.id;
                if leader.is_some_and(|l| l != seen) || !among.contains(&seen) {
                    return None;
                }
                leader = Some(seen);
            }
            let leader = leader?;
            let status = self.node(leader).status().await?;
            (status.state == silt::silt_metadata::NodeRole::Leader).then_some(leader)
        })
        .await
    }

    /// Every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes.iter().map(|n| format!("--- node {} ---\n{}", n.id, n.log())).collect()
    }
}

/// A TCP proxy on loopback between Silt processes that a test can cut (open connections are
/// dropped, new ones closed at once) and heal: a network partition without root or iptables.
pub struct Proxy {
    addr: String,
    state: std::sync::Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

struct ProxyState {
    target: std::sync::Mutex<String>,
    /// Replaced on every cut: connections end when theirs is cancelled.
    cut: std::sync::Mutex<Option<tokio::sync::watch::Sender<bool>>>,
    /// Source addresses whose connections are refused (and dropped when blocked).
    blocked: tokio::sync::watch::Sender<std::collections::HashSet<std::net::IpAddr>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target` (host:port).
    pub async fn start(target: &str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let (open, _) = tokio::sync::watch::channel(false);
        let state = std::sync::Arc::new(ProxyState {
            target: std::sync::Mutex::new(target.to_string()),
            cut: std::sync::Mutex::new(Some(open)),
            blocked: tokio::sync::watch::channel(Default::default()).0,
        });
        let shared = std::sync::Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, from)) = listener.accept().await else { continue };
                let stop = shared.cut.lock().expect("proxy").as_ref().map(|tx| tx.subscribe());
                let mut blocked = shared.blocked.subscribe();
                let Some(mut stop) = stop.filter(|_| !blocked.borrow_and_update().contains(&from.ip()))
                else {
                    drop(inbound);
                    continue;
                };
                let target = shared.target.lock().expect("proxy").clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    let (mut inbound, mut outbound) = (inbound, outbound);
                    let source_blocked = async {
                        while blocked.changed().await.is_ok() {
                            if blocked.borrow_and_update().contains(&from.ip()) {
                                return;
                            }
                        }
                        std::future::pending::<()>().await
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = stop.changed() => {}
                        _ = source_blocked => {}
                    }
                });
            }
        });
        Proxy { addr, state, task }
    }

    /// Where to connect (host:port).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Forwards new connections to `target` from now on (a restarted process's new port).
    pub fn set_target(&self, target: &str) {
        *self.state.target.lock().expect("proxy") = target.to_string();
    }

    /// Drops every open connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        if let Some(tx) = self.state.cut.lock().expect("proxy").take() {
            let _ = tx.send(true);
        }
    }

    /// Drops the connections from `source` and refuses new ones until [`Proxy::unblock`]:
    /// with processes that connect from addresses of their own (127.0.0.2, ...), a cut
    /// between two of them that leaves the others connected.
    pub fn block(&self, source: std::net::IpAddr) {
        self.state.blocked.send_modify(|b| {
            b.insert(source);
        });
    }

    /// Lets connections from `source` through again.
    pub fn unblock(&self, source: std::net::IpAddr) {
        self.state.blocked.send_modify(|b| {
            b.remove(&source);
        });
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        let mut cut = self.state.cut.lock().expect("proxy");
        if cut.is_none() {
            *cut = Some(tokio::sync::watch::channel(false).0);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
