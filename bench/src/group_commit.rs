//! The plain group-commit server: what any durable broker could reach on this machine.
//!
//! A small TCP server (`silt-bench --serve-group-commit DIR`, its own process so that its CPU
//! is counted like a broker's) that appends every request to one file and answers it after
//! the fdatasync that covers it, one fdatasync for every request waiting: group commit and
//! nothing else. No replication, no index, no consumers, no metadata. A produce to it is the
//! floor of a produce to any broker that acknowledges after fdatasync.
//!
//! Protocol: a request is a 4-byte big-endian length and that many bytes (the messages, each
//! behind its own 4-byte length); the answer is the 8-byte big-endian file offset the request
//! was written at. Answers on a connection come in the order of its requests, so a client may
//! pipeline.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::load::ProduceTarget;

/// Largest request the server takes: Silt's own limit on a produce request.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// What the report says about it.
pub const SETTINGS: &str = "a plain TCP server in silt-bench: every request appended to one file, \
answered after the fdatasync that covers it, one fdatasync for all requests waiting (group commit); \
one copy, no consumers, no index. At a fraction of max it runs at Silt R=1's rate, so latencies \
compare at the same load.";

/// One request waiting for the fdatasync that covers it.
struct Waiting {
    bytes: Vec<u8>,
    reply_to: Arc<Mutex<TcpStream>>,
}

#[derive(Default)]
struct Queue {
    waiting: Mutex<Vec<Waiting>>,
    ready: Condvar,
}

/// Runs the server on `listener`, appending to `dir/group-commit.log`, until the process ends.
pub fn serve(dir: &Path, listener: TcpListener) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("group-commit.log");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let queue = Arc::new(Queue::default());
    let writer_queue = Arc::clone(&queue);
    let writer = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut offset = file.metadata()?.len();
        let mut group = Vec::new();
        let mut buf = Vec::new();
        loop {
            {
                let mut waiting = writer_queue.waiting.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                while waiting.is_empty() {
                    waiting = writer_queue.ready.wait(waiting).map_err(|_| anyhow::anyhow!("poisoned"))?;
                }
                std::mem::swap(&mut group, &mut *waiting);
            }
            buf.clear();
            let mut offsets = Vec::with_capacity(group.len());
            for w in &group {
                offsets.push(offset + buf.len() as u64);
                buf.extend_from_slice(&w.bytes);
            }
            file.write_all(&buf)?;
            file.sync_data()?;
            offset += buf.len() as u64;
            for (w, at) in group.drain(..).zip(offsets) {
                if let Ok(mut s) = w.reply_to.lock() {
                    // A client that went away just misses its answer.
                    let _ = s.write_all(&at.to_be_bytes());
                }
            }
        }
    });
    for stream in listener.incoming() {
        let stream = stream?;
        stream.set_nodelay(true)?;
        let reply_to = Arc::new(Mutex::new(stream.try_clone()?));
        let queue = Arc::clone(&queue);
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::with_capacity(1 << 20, stream);
            let mut len = [0u8; 4];
            while reader.read_exact(&mut len).is_ok() {
                let n = u32::from_be_bytes(len) as usize;
                if n > MAX_REQUEST_BYTES {
                    return;
                }
                let mut bytes = vec![0u8; n];
                if reader.read_exact(&mut bytes).is_err() {
                    return;
                }
                let Ok(mut waiting) = queue.waiting.lock() else { return };
                waiting.push(Waiting { bytes, reply_to: Arc::clone(&reply_to) });
                queue.ready.notify_one();
            }
        });
        if writer.is_finished() {
            break;
        }
    }
    match writer.join() {
        Ok(r) => r,
        Err(_) => bail!("the writer thread panicked"),
    }
}

/// The server as a process of its own: `silt-bench --serve-group-commit DIR`.
pub struct GroupCommitServer {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl GroupCommitServer {
    /// Starts `bench_bin --serve-group-commit dir` and waits until it listens.
    pub fn start(bench_bin: &Path, dir: &Path) -> anyhow::Result<GroupCommitServer> {
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(bench_bin)
            .arg("--serve-group-commit")
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {}", bench_bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("group-commit server listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(addr) => Ok(GroupCommitServer { child, addr, dir: dir.to_path_buf() }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the group-commit server did not start within 10 s")
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Opens `connections` connections to it.
    pub async fn producer(&self, connections: u32) -> anyhow::Result<GroupCommitProducer> {
        let mut conns = Vec::new();
        for _ in 0..connections.max(1) {
            conns.push(Connection::open(&self.addr).await?);
        }
        Ok(GroupCommitProducer { conns })
    }

    /// Kills it and deletes its file.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for GroupCommitServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One pipelined connection: requests go out under the writer's lock in the order their
/// answers will come back, and a reader task hands each answer to the oldest waiter.
struct Connection {
    writer: tokio::sync::Mutex<(tokio::net::tcp::OwnedWriteHalf, Waiters)>,
}

/// Who waits for the next answers on a connection, oldest first.
type Waiters = Arc<Mutex<VecDeque<oneshot::Sender<u64>>>>;

impl Connection {
    async fn open(addr: &str) -> anyhow::Result<Connection> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        let (mut read, write) = stream.into_split();
        let waiters: Waiters = Arc::default();
        let reader_waiters = Arc::clone(&waiters);
        tokio::spawn(async move {
            let mut answer = [0u8; 8];
            while read.read_exact(&mut answer).await.is_ok() {
                let next = reader_waiters.lock().ok().and_then(|mut w| w.pop_front());
                if let Some(tx) = next {
                    let _ = tx.send(u64::from_be_bytes(answer));
                }
            }
            // The server went away: waiters still queued see their senders dropped.
            if let Ok(mut w) = reader_waiters.lock() {
                w.clear();
            }
        });
        Ok(Connection { writer: tokio::sync::Mutex::new((write, waiters)) })
    }

    async fn send(&self, request: Bytes) -> anyhow::Result<u64> {
        let (tx, rx) = oneshot::channel();
        {
            let mut guard = self.writer.lock().await;
            let (write, waiters) = &mut *guard;
            waiters.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push_back(tx);
            write.write_all(&request).await.context("cannot send to the group-commit server")?;
        }
        rx.await.context("the group-commit server closed the connection")
    }
}

/// Produces to the group-commit server: a partition picks a connection.
pub struct GroupCommitProducer {
    conns: Vec<Connection>,
}

#[async_trait::async_trait]
impl ProduceTarget for GroupCommitProducer {
    async fn send(&self, partition: u32, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let body: usize = payloads.iter().map(|p| 4 + p.len()).sum();
        anyhow::ensure!(body <= MAX_REQUEST_BYTES, "a request of {body} bytes is over the server's limit");
        let mut request = BytesMut::with_capacity(4 + body);
        request.put_u32(body as u32);
        for p in &payloads {
            request.put_u32(p.len() as u32);
            request.put_slice(p);
        }
        let conn = &self.conns[partition as usize % self.conns.len()];
        conn.send(request.freeze()).await?;
        Ok(())
    }
}

/// Runs the server for `silt-bench --serve-group-commit DIR`: binds a loopback port, prints it,
/// serves until killed.
pub fn serve_main(dir: &Path) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("group-commit server listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    serve(dir, listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_request_is_on_disk_at_the_offset_it_was_answered_with() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = dir.path().to_path_buf();
        std::thread::spawn(move || serve(&served, listener));
        let producer = GroupCommitProducer {
            conns: vec![Connection::open(&addr).await.unwrap(), Connection::open(&addr).await.unwrap()],
        };
        let producer = Arc::new(producer);
        let mut sends = Vec::new();
        for i in 0..40u32 {
            let producer = Arc::clone(&producer);
            sends.push(tokio::spawn(async move {
                let payloads =
                    vec![Bytes::from(format!("message {i} a")), Bytes::from(format!("message {i} b"))];
                let mut request = BytesMut::new();
                request.put_u32(payloads.iter().map(|p| 4 + p.len() as u32).sum());
                for p in &payloads {
                    request.put_u32(p.len() as u32);
                    request.put_slice(p);
                }
                let at = producer.conns[i as usize % 2].send(request.clone().freeze()).await.unwrap();
                (at, request.freeze())
            }));
        }
        let file = dir.path().join("group-commit.log");
        for s in sends {
            let (at, request) = s.await.unwrap();
            // Answered means written: the bytes are in the file at the offset given.
            let on_disk = std::fs::read(&file).unwrap();
            let body = &request[4..];
            assert_eq!(&on_disk[at as usize..at as usize + body.len()], body);
        }
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            40 * 2 * (4 + "message 00 a".len() as u64) - 10 * 2
        );
        // The ProduceTarget path frames the same way.
        producer.send(3, vec![Bytes::from_static(b"x")]).await.unwrap();
    }
}
