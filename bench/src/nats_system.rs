//! The peer: NATS JetStream, one server (R=1) or a cluster of three on loopback (R=3), with
//! `sync_interval: always` so that every write is fsynced before it is acknowledged, as Silt
//! does. Driven with NATS's own Rust client (`async-nats`).
//!
//! A Silt partition is an independent ordered log with its own writer; JetStream's unit of
//! ordering, storage and replication is the stream, so a topic of N partitions is N streams
//! (`<topic>-<p>`, subject `<topic>.<p>`), each with one pull consumer.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use crate::load::{read_stamp, ConsumeStats, ProduceTarget, Window};

/// How long a publish or API request may wait for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The JetStream settings every server runs with, for the report.
pub const SETTINGS: &str = "jetstream { sync_interval: always } (fsync before every ack), file storage, \
one stream per partition with num_replicas=R on R servers, pull consumers with ack_policy=all";

/// One or three `nats-server` processes on loopback ports.
pub struct NatsCluster {
    children: Vec<Child>,
    client_urls: Vec<String>,
    dir: PathBuf,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl NatsCluster {
    /// Starts `servers` servers under `dir` and waits until JetStream is up.
    pub async fn start(bin: &Path, dir: &Path, servers: u32) -> anyhow::Result<NatsCluster> {
        std::fs::create_dir_all(dir)?;
        let client_ports: Vec<u16> = (0..servers).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
        let cluster_ports: Vec<u16> = (0..servers).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
        let mut cluster =
            NatsCluster { children: Vec::new(), client_urls: Vec::new(), dir: dir.to_path_buf() };
        for i in 0..servers as usize {
            let store = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&store)?;
            let mut conf = format!(
                "server_name: n{i}\nlisten: \"127.0.0.1:{}\"\nmax_payload: 8MB\n\
                 jetstream {{\n  store_dir: \"{}\"\n  sync_interval: always\n  max_file_store: 64GB\n  max_memory_store: 1GB\n}}\n",
                client_ports[i],
                store.display()
            );
            if servers > 1 {
                let routes: Vec<String> =
                    cluster_ports.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
                conf.push_str(&format!(
                    "cluster {{\n  name: bench\n  listen: \"127.0.0.1:{}\"\n  routes: [{}]\n}}\n",
                    cluster_ports[i],
                    routes.join(", ")
                ));
            }
            let conf_path = dir.join(format!("n{i}.conf"));
            std::fs::write(&conf_path, conf)?;
            let log = std::fs::File::create(dir.join(format!("n{i}.log")))?;
            let child = Command::new(bin)
                .arg("-c")
                .arg(&conf_path)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            cluster.children.push(child);
            cluster.client_urls.push(format!("127.0.0.1:{}", client_ports[i]));
        }
        // Wait until a stream can be created (the cluster has elected its JetStream leader).
        let js = cluster.connect().await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let probe = stream::Config {
                name: "bench-probe".into(),
                subjects: vec!["bench-probe".into()],
                num_replicas: servers as usize,
                ..Default::default()
            };
            match js.create_stream(probe).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => bail!("JetStream on {} servers did not come up in 60 s: {e}", servers),
            }
        }
        let _ = js.delete_stream("bench-probe").await;
        Ok(cluster)
    }

    /// A JetStream context on a new connection to the first server.
    pub async fn connect(&self) -> anyhow::Result<jetstream::Context> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            match async_nats::connect(self.client_urls[0].as_str()).await {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!("cannot connect to nats-server at {}: {e}", self.client_urls[0]),
            }
        };
        let mut js = jetstream::new(client);
        js.set_timeout(REQUEST_TIMEOUT);
        Ok(js)
    }

    /// The server processes.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Stops every server and deletes their data.
    pub fn stop(mut self) {
        for c in &self.children {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for c in &mut self.children {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The streams of one topic.
pub fn stream_name(topic: &str, partition: u32) -> String {
    format!("{topic}-{partition}")
}

fn subject(topic: &str, partition: u32) -> String {
    format!("{topic}.{partition}")
}

/// Creates one file-backed stream per partition with `replicas` replicas.
pub async fn create_topic(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
    replicas: u32,
) -> anyhow::Result<()> {
    for p in 0..partitions {
        js.create_stream(stream::Config {
            name: stream_name(topic, p),
            subjects: vec![subject(topic, p)],
            storage: stream::StorageType::File,
            num_replicas: replicas as usize,
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot create stream {}", stream_name(topic, p)))?;
    }
    Ok(())
}

/// Deletes the streams of a topic.
pub async fn delete_topic(js: &jetstream::Context, topic: &str, partitions: u32) {
    for p in 0..partitions {
        let _ = js.delete_stream(stream_name(topic, p)).await;
    }
}

/// Publishes a request's messages back to back and waits for every ack (JetStream's
/// asynchronous publish), over a few connections taken in turn.
pub struct NatsProducer {
    /// One context per connection.
    pub contexts: Vec<jetstream::Context>,
    /// The topic.
    pub topic: String,
    /// The next connection to use.
    pub next: AtomicUsize,
}

#[async_trait::async_trait]
impl ProduceTarget for NatsProducer {
    async fn send(&self, partition: u32, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let js = &self.contexts[self.next.fetch_add(1, Ordering::Relaxed) % self.contexts.len()];
        let subject = subject(&self.topic, partition);
        let mut acks = Vec::with_capacity(payloads.len());
        for p in payloads {
            acks.push(js.publish(subject.clone(), p).await?);
        }
        for ack in acks {
            ack.await?;
        }
        Ok(())
    }
}

/// Starts one pull consumer per stream, each acknowledging (ack-all) every 256th message and
/// the last one pending.
#[allow(clippy::too_many_arguments)]
pub async fn start_consumers(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
    replicas: u32,
    max: u32,
    window: Window,
    stats: Arc<ConsumeStats>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for p in 0..partitions {
        let stream = js.get_stream(stream_name(topic, p)).await?;
        let consumer: consumer::PullConsumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("readers".into()),
                ack_policy: consumer::AckPolicy::All,
                max_ack_pending: 100_000,
                num_replicas: replicas as usize,
                ..Default::default()
            })
            .await
            .with_context(|| format!("cannot create a consumer on {}", stream_name(topic, p)))?;
        let mut messages = consumer.stream().max_messages_per_batch(max as usize).messages().await?;
        let stats = Arc::clone(&stats);
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut n: u64 = 0;
            loop {
                let next = tokio::select! {
                    _ = stop.changed() => break,
                    m = messages.next() => m,
                };
                match next {
                    Some(Ok(m)) => {
                        stats.record(&window, std::iter::once(read_stamp(&m.payload)));
                        n += 1;
                        let last = m.info().map(|i| i.pending == 0).unwrap_or(true);
                        if (n.is_multiple_of(256) || last) && m.ack().await.is_err() {
                            stats.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(Err(_)) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }));
    }
    Ok(tasks)
}
