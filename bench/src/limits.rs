//! The machine's own limits, measured by plain programs in the same run as the systems: what a
//! broker on this box could reach at best.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::latency::{Latency, LatencySummary};

/// Sequential writes of this many bytes, each followed by fdatasync: the largest group commit a
/// Silt partition writer makes (8 MiB).
pub const SEQ_WRITE_CHUNK_BYTES: usize = 8 << 20;
/// Bytes of one small durable write.
pub const SMALL_WRITE_BYTES: usize = 4096;

/// One measurement of the limits.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Limits {
    /// Sequential write bandwidth, 8 MiB per `write` + fdatasync, MB/s (10^6 bytes).
    pub seq_write_fdatasync_mb_per_s: f64,
    /// Latency of one 4 KiB append + fdatasync.
    pub write_4k_fdatasync: LatencySummary,
    /// One TCP stream over loopback, MB/s.
    pub loopback_tcp_mb_per_s: f64,
}

/// Measures all limits, writing files under `dir` (the filesystem the systems write to).
pub fn measure(dir: &Path, each: Duration) -> anyhow::Result<Limits> {
    std::fs::create_dir_all(dir)?;
    let seq = seq_write(dir, each)?;
    let small = small_writes(dir, each)?;
    let tcp = loopback_tcp(each)?;
    Ok(Limits {
        seq_write_fdatasync_mb_per_s: seq,
        write_4k_fdatasync: small.summary(),
        loopback_tcp_mb_per_s: tcp,
    })
}

fn pseudo_random(len: usize) -> Vec<u8> {
    // Incompressible enough for a disk that does not compress; no need for a real RNG here.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Appends 8 MiB chunks with fdatasync after each for `each`; starts a new file every 256 MiB
/// (not timed), as a log rolls its segments.
fn seq_write(dir: &Path, each: Duration) -> anyhow::Result<f64> {
    let path = dir.join("limits-seq.bin");
    let chunk = pseudo_random(SEQ_WRITE_CHUNK_BYTES);
    let mut written: u64 = 0;
    let mut timed = Duration::ZERO;
    while timed < each {
        let _ = std::fs::remove_file(&path);
        let mut f = OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
        for _ in 0..32 {
            let t = Instant::now();
            f.write_all(&chunk)?;
            f.sync_data()?;
            timed += t.elapsed();
            written += chunk.len() as u64;
            if timed >= each {
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok(written as f64 / timed.as_secs_f64() / 1e6)
}

/// Appends 4 KiB with fdatasync after each for `each` (at most 100,000 writes).
fn small_writes(dir: &Path, each: Duration) -> anyhow::Result<Latency> {
    let path = dir.join("limits-4k.bin");
    let _ = std::fs::remove_file(&path);
    let mut f = OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
    let block = pseudo_random(SMALL_WRITE_BYTES);
    let mut lat = Latency::new();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < each && n < 100_000 {
        let t = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        lat.record(t.elapsed());
        n += 1;
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(lat)
}

/// One TCP stream from a thread to another over 127.0.0.1, 256 KiB writes, for `each`.
fn loopback_tcp(each: Duration) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = pseudo_random(256 << 10);
    let start = Instant::now();
    while start.elapsed() < each {
        s.write_all(&buf)?;
    }
    drop(s);
    let total =
        reader.join().map_err(|_| anyhow::anyhow!("loopback reader panicked"))?.context("loopback read")?;
    Ok(total as f64 / start.elapsed().as_secs_f64() / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_measure_something() {
        let dir = tempfile::tempdir().unwrap();
        let l = measure(dir.path(), Duration::from_millis(200)).unwrap();
        assert!(l.seq_write_fdatasync_mb_per_s > 0.0);
        assert!(l.write_4k_fdatasync.count > 0);
        assert!(l.loopback_tcp_mb_per_s > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files are removed");
    }
}
