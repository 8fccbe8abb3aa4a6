//! The machine's own limits, measured by plain programs in the same run as the systems: what a
//! broker on this box could reach at best.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
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
/// Bytes of the request in a loopback round trip (a small produce request); the reply is 16 bytes.
pub const ROUND_TRIP_REQUEST_BYTES: usize = 1024;
const ROUND_TRIP_REPLY_BYTES: usize = 16;

/// One measurement of the limits.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Limits {
    /// Sequential write bandwidth, 8 MiB per `write` + fdatasync, MB/s (10^6 bytes).
    pub seq_write_fdatasync_mb_per_s: f64,
    /// Latency of one 4 KiB append + fdatasync.
    pub write_4k_fdatasync: LatencySummary,
    /// One TCP stream over loopback, MB/s.
    pub loopback_tcp_mb_per_s: f64,
    /// CPU time (user + system) the writing thread spent per 4 KiB append + fdatasync, µs.
    #[serde(default)]
    pub write_4k_fdatasync_cpu_us: f64,
    /// Latency of one round trip between two threads over a loopback TCP connection: a 1 KiB
    /// request, a 16-byte reply (what any request to a server on this machine costs at least).
    #[serde(default)]
    pub loopback_round_trip: LatencySummary,
    /// Latency of one 4 KiB write + fdatasync within a file already written (zeros, then
    /// overwritten in place): no file size or block allocation to commit, how Silt writes the
    /// small groups of an open segment.
    #[serde(default)]
    pub overwrite_4k_fdatasync: LatencySummary,
    /// CPU time the writing thread spent per 4 KiB overwrite + fdatasync, µs.
    #[serde(default)]
    pub overwrite_4k_fdatasync_cpu_us: f64,
    /// 4 KiB overwrites + fdatasync one thread completes per second back to back: the disk's
    /// flush capacity, against which a system's fdatasyncs per second are read.
    #[serde(default)]
    pub overwrite_4k_fdatasyncs_per_s: f64,
    /// Flush requests the disk completed per second meanwhile (`/proc/diskstats`; none where
    /// the folder is on no block device or the kernel does not count them).
    #[serde(default)]
    pub overwrite_4k_disk_flushes_per_s: Option<f64>,
}

/// Measures all limits, writing files under `dir` (the filesystem the systems write to).
pub fn measure(dir: &Path, each: Duration) -> anyhow::Result<Limits> {
    std::fs::create_dir_all(dir)?;
    let seq = seq_write(dir, each)?;
    let (small, small_cpu_us, _) = small_writes(dir, each, SmallWrites::Append)?;
    let (over, over_cpu_us, over_flushes) = small_writes(dir, each, SmallWrites::Overwrite)?;
    let tcp = loopback_tcp(each)?;
    let round_trip = loopback_round_trips(each)?;
    Ok(Limits {
        seq_write_fdatasync_mb_per_s: seq,
        write_4k_fdatasync: small.summary(),
        loopback_tcp_mb_per_s: tcp,
        write_4k_fdatasync_cpu_us: small_cpu_us,
        loopback_round_trip: round_trip.summary(),
        overwrite_4k_fdatasync: over.summary(),
        overwrite_4k_fdatasync_cpu_us: over_cpu_us,
        overwrite_4k_fdatasyncs_per_s: over_flushes.fdatasyncs_per_s,
        overwrite_4k_disk_flushes_per_s: over_flushes.disk_flushes_per_s,
    })
}

/// Where the small writes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SmallWrites {
    /// At the end of the file, which grows with every write.
    Append,
    /// Into a file of [`OVERWRITE_FILE_BYTES`] written and synced first, from its start (and
    /// round again): the file's size and blocks never change.
    Overwrite,
}

/// Size of the file the overwrites go into.
const OVERWRITE_FILE_BYTES: u64 = 16 * 1024 * 1024;

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

/// How often small writes flushed.
struct FlushRate {
    fdatasyncs_per_s: f64,
    disk_flushes_per_s: Option<f64>,
}

/// Appends 4 KiB with fdatasync after each for `each` (at most 100,000 writes); returns their
/// latency, the CPU time this thread spent per write, µs, and how often they flushed.
fn small_writes(dir: &Path, each: Duration, mode: SmallWrites) -> anyhow::Result<(Latency, f64, FlushRate)> {
    let path = dir.join("limits-4k.bin");
    let _ = std::fs::remove_file(&path);
    let mut f = OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
    if mode == SmallWrites::Overwrite {
        let zeros = vec![0u8; 1024 * 1024];
        for _ in 0..OVERWRITE_FILE_BYTES / zeros.len() as u64 {
            f.write_all(&zeros)?;
        }
        f.sync_all()?;
        f.seek(SeekFrom::Start(0))?;
    }
    let block = pseudo_random(SMALL_WRITE_BYTES);
    let mut lat = Latency::new();
    let cpu_before = crate::proc_stats::thread_cpu_s()?;
    let machine = crate::proc_stats::MachineMark::start(dir)?;
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < each && n < 100_000 {
        let t = Instant::now();
        if mode == SmallWrites::Overwrite && f.stream_position()? >= OVERWRITE_FILE_BYTES {
            f.seek(SeekFrom::Start(0))?;
        }
        f.write_all(&block)?;
        f.sync_data()?;
        lat.record(t.elapsed());
        n += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let used = machine.finish()?;
    let cpu_us = (crate::proc_stats::thread_cpu_s()? - cpu_before) * 1e6 / f64::from(n.max(1));
    drop(f);
    let _ = std::fs::remove_file(&path);
    let rate = FlushRate {
        fdatasyncs_per_s: f64::from(n) / elapsed,
        disk_flushes_per_s: used.disk_flushes.map(|d| d as f64 / used.elapsed_s),
    };
    Ok((lat, cpu_us, rate))
}

/// Round trips over one loopback TCP connection (Nagle off) between this thread and another:
/// a 1 KiB request, read whole by the other thread, then a 16-byte reply, for `each` (at most
/// 100,000).
fn loopback_round_trips(each: Duration) -> anyhow::Result<Latency> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut request = vec![0u8; ROUND_TRIP_REQUEST_BYTES];
        let reply = [7u8; ROUND_TRIP_REPLY_BYTES];
        loop {
            match s.read_exact(&mut request) {
                Ok(()) => s.write_all(&reply)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let request = pseudo_random(ROUND_TRIP_REQUEST_BYTES);
    let mut reply = [0u8; ROUND_TRIP_REPLY_BYTES];
    let mut lat = Latency::new();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < each && n < 100_000 {
        let t = Instant::now();
        s.write_all(&request)?;
        s.read_exact(&mut reply)?;
        lat.record(t.elapsed());
        n += 1;
    }
    drop(s);
    server.join().map_err(|_| anyhow::anyhow!("loopback server panicked"))?.context("loopback server")?;
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
        assert!(l.loopback_round_trip.count > 0);
        assert!(l.loopback_round_trip.p50_ms > 0.0);
        assert!(l.write_4k_fdatasync_cpu_us >= 0.0 && l.write_4k_fdatasync_cpu_us.is_finite());
        assert!(l.overwrite_4k_fdatasync.count > 0);
        assert!(l.overwrite_4k_fdatasync_cpu_us >= 0.0 && l.overwrite_4k_fdatasync_cpu_us.is_finite());
        assert!(l.overwrite_4k_fdatasyncs_per_s > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files are removed");
    }
}
