//! CPU time and peak memory of processes, read from `/proc`.

use std::sync::OnceLock;

use anyhow::Context;

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux almost always).
fn ticks_per_s() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// User plus system CPU seconds a process (all its threads) has used so far.
pub fn cpu_s(pid: u32) -> anyhow::Result<f64> {
    let path = if pid == 0 { "/proc/self/stat".to_string() } else { format!("/proc/{pid}/stat") };
    cpu_s_of(&path)
}

/// User plus system CPU seconds from a `stat` file of `/proc` (a process's or a thread's).
pub fn cpu_s_of(path: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    parse_cpu_ticks(&stat).map(|t| t / ticks_per_s()).with_context(|| format!("unexpected {path}"))
}

/// utime + stime from the text of `/proc/<pid>/stat`. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted from the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (field 3) is index 0, so utime (field 14) is 11 and stime 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds the calling thread has used: nanoseconds on the CPU from
/// `/proc/thread-self/schedstat`, or user + system clock ticks from its `stat` where the kernel
/// keeps no schedstat (no file, or zeros).
pub fn thread_cpu_s() -> anyhow::Result<f64> {
    let on_cpu_ns = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        // A kernel that keeps no schedstat information shows zeros.
        .filter(|ns| *ns > 0);
    match on_cpu_ns {
        Some(ns) => Ok(ns as f64 / 1e9),
        None => cpu_s_of("/proc/thread-self/stat"),
    }
}

/// Peak resident memory (`VmHWM`) of a process in bytes.
pub fn peak_rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM line")?;
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).context("bad VmHWM")?;
    Ok(kib * 1024)
}

/// Resets a process's peak resident memory to its current resident memory, so that the next
/// [`peak_rss_bytes`] is the peak of what runs from now on (`echo 5 > /proc/<pid>/clear_refs`).
pub fn reset_peak_rss(pid: u32) -> anyhow::Result<()> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").with_context(|| format!("cannot write {path}"))
}

/// CPU and memory of a set of server processes, from one mark to now.
#[derive(Debug, Clone)]
pub struct ProcMark {
    pids: Vec<u32>,
    server_cpu_s: f64,
    client_cpu_s: f64,
}

/// What [`ProcMark::finish`] measured.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ProcUse {
    /// CPU seconds of the server processes, summed.
    pub server_cpu_s: f64,
    /// CPU seconds of the benchmark process itself (the clients).
    pub client_cpu_s: f64,
    /// Peak resident memory of the server processes, summed, in bytes.
    pub server_peak_rss_bytes: u64,
}

impl ProcMark {
    /// Marks the start: reads CPU so far and resets each server's peak memory.
    pub fn start(pids: &[u32]) -> anyhow::Result<ProcMark> {
        let mut server_cpu_s = 0.0;
        for &pid in pids {
            server_cpu_s += cpu_s(pid)?;
            reset_peak_rss(pid)?;
        }
        Ok(ProcMark { pids: pids.to_vec(), server_cpu_s, client_cpu_s: cpu_s(0)? })
    }

    /// CPU used since the mark and peak memory since the mark.
    pub fn finish(&self) -> anyhow::Result<ProcUse> {
        let mut cpu = 0.0;
        let mut rss = 0;
        for &pid in &self.pids {
            cpu += cpu_s(pid)?;
            rss += peak_rss_bytes(pid)?;
        }
        Ok(ProcUse {
            server_cpu_s: cpu - self.server_cpu_s,
            client_cpu_s: cpu_s(0)? - self.client_cpu_s,
            server_peak_rss_bytes: rss,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let stat = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 1000 50";
        assert_eq!(parse_cpu_ticks(stat), Some(300.0));
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(cpu_s(me).unwrap() >= 0.0);
        assert!(peak_rss_bytes(me).unwrap() > 0);
    }
}
