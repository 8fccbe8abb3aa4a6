//! Silt under load: a `silt dev` process started by the tool, produced to with binary
//! RecordBatch v2 requests (`Client::produce_batch`, what a production client sends), consumed
//! by an exclusive consumer group (poll + ack).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use silt::client::{Client, Poll};
use silt_record::{BatchBuilder, NewRecord};
use tokio::sync::watch;

use crate::load::{read_stamp, ConsumeStats, ProduceTarget, Window};

/// A `silt dev` process on a loopback port with its own data directory.
pub struct SiltServer {
    child: Child,
    url: String,
    data_dir: PathBuf,
}

impl SiltServer {
    /// Starts `silt dev` with `agents` agents (each segment on `min(agents, 3)` of their
    /// disks) and waits until it serves. Its bucket is a folder in `data_dir` unless
    /// `object_store` names one (`s3://bucket/prefix`, set up by the `AWS_*` environment).
    pub async fn start(
        bin: &Path,
        data_dir: &Path,
        agents: u32,
        object_store: Option<&str>,
    ) -> anyhow::Result<SiltServer> {
        std::fs::create_dir_all(data_dir)?;
        let log = std::fs::File::create(data_dir.with_extension("log"))?;
        let mut command = Command::new(bin);
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--agents", &agents.to_string(), "--data-dir"])
            .arg(data_dir);
        if let Some(url) = object_store {
            command.args(["--object-store", url]);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        // The process prints "silt dev listening on http://..." once it serves.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("silt dev listening on ") {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                bail!("silt dev did not start within 30 s; see {}", data_dir.with_extension("log").display());
            }
        };
        let server = SiltServer { child, url, data_dir: data_dir.to_path_buf() };
        let client = server.client()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.health().await.is_err() {
            if Instant::now() > deadline {
                bail!("silt dev at {} is not healthy after 30 s", server.url);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(server)
    }

    /// A client of this server.
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::new(&self.url)?)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its data lives.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Stops it with SIGTERM (then SIGKILL after 30 s) and deletes its data.
    pub fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

impl Drop for SiltServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Produces to a workload's topics with one RecordBatch v2 per request. The load generator's
/// partition `p` is partition `p % partitions_per_topic` of topic `p / partitions_per_topic`.
pub struct SiltProducer {
    /// The client.
    pub client: Client,
    /// The topics, in order.
    pub topics: Vec<String>,
    /// Partitions of each topic.
    pub partitions_per_topic: u32,
}

#[async_trait::async_trait]
impl ProduceTarget for SiltProducer {
    async fn send(&self, partition: u32, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let per_topic = self.partitions_per_topic.max(1);
        let topic = self
            .topics
            .get((partition / per_topic) as usize)
            .with_context(|| format!("no topic holds the workload's partition {partition}"))?;
        let partition = partition % per_topic;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut b = BatchBuilder::new();
        for value in payloads {
            b.push(NewRecord { timestamp_ms: now_ms, key: None, value: Some(value), headers: Vec::new() });
        }
        self.client.produce_batch(topic, partition, b.build()?).await?;
        Ok(())
    }
}

/// Starts `members` consumers of one exclusive group on `topic`: each polls (up to `max`
/// messages, long-polling 500 ms), records end-to-end latency, and acknowledges what it got.
pub fn start_consumers(
    client: &Client,
    topic: &str,
    members: u32,
    max: u32,
    window: Window,
    stats: Arc<ConsumeStats>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..members)
        .map(|i| {
            let client = client.clone();
            let topic = topic.to_string();
            let stats = Arc::clone(&stats);
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let group = format!("{topic}-readers");
                let poll = Poll {
                    group: group.clone(),
                    member: format!("m{i}"),
                    mode: "exclusive".into(),
                    max,
                    max_bytes: None,
                    timeout_ms: 500,
                    session_timeout_ms: 30_000,
                };
                loop {
                    let polled = tokio::select! {
                        _ = stop.changed() => break,
                        r = client.poll(&topic, &poll) => r,
                    };
                    match polled {
                        Ok(msgs) if !msgs.is_empty() => {
                            stats.record(
                                &window,
                                msgs.iter()
                                    .map(|m| m.value.as_deref().and_then(|v| read_stamp(v.as_bytes()))),
                            );
                            let ids: Vec<String> = msgs.into_iter().map(|m| m.id).collect();
                            if client.ack(&group, &ids).await.is_err() {
                                stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        Ok(_) => {}
                        Err(_) => {
                            stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            })
        })
        .collect()
}
