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
    at: std::time::Instant,
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
    /// Seconds from the mark.
    pub elapsed_s: f64,
}

impl ProcMark {
    /// Marks the start: reads CPU so far and resets each server's peak memory.
    pub fn start(pids: &[u32]) -> anyhow::Result<ProcMark> {
        let mut server_cpu_s = 0.0;
        for &pid in pids {
            server_cpu_s += cpu_s(pid)?;
            reset_peak_rss(pid)?;
        }
        Ok(ProcMark {
            at: std::time::Instant::now(),
            pids: pids.to_vec(),
            server_cpu_s,
            client_cpu_s: cpu_s(0)?,
        })
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
            elapsed_s: self.at.elapsed().as_secs_f64(),
        })
    }
}

/// Busy CPU seconds of the whole machine so far, every core summed: the `cpu` line of
/// `/proc/stat` without idle and iowait, so that the kernel's own work for the systems (its
/// journal, writeback, network stack) counts as well as theirs.
pub fn machine_cpu_s() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    parse_machine_busy_ticks(&stat).map(|t| t / ticks_per_s()).context("unexpected /proc/stat")
}

/// user + nice + system + irq + softirq + steal ticks from the first line of `/proc/stat`
/// (guest time is already inside user and nice).
fn parse_machine_busy_ticks(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    (v.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// The block device a folder lives on, as `/proc/diskstats` names it: the whole disk, since
/// the kernel counts flushes there and not on its partitions. `None` for a folder on no block
/// device (tmpfs, overlay on tmpfs).
pub fn disk_of(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    // glibc's gnu_dev_major / gnu_dev_minor.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let disk = if sys.join("partition").exists() { sys.parent()?.to_path_buf() } else { sys };
    Some(disk.file_name()?.to_str()?.to_string())
}

/// What a disk has done since boot, from `/proc/diskstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Flush requests completed (what each fdatasync ends in on a disk with a write cache);
    /// 0 on kernels before 5.5, which do not count them.
    pub flushes: u64,
    /// Bytes written.
    pub bytes_written: u64,
}

/// The counters of `disk` (a name from [`disk_of`]).
pub fn disk_counters(disk: &str) -> anyhow::Result<DiskCounters> {
    let stats = std::fs::read_to_string("/proc/diskstats").context("cannot read /proc/diskstats")?;
    parse_disk_counters(&stats, disk).with_context(|| format!("no disk {disk} in /proc/diskstats"))
}

fn parse_disk_counters(stats: &str, disk: &str) -> Option<DiskCounters> {
    let fields: Vec<&str> =
        stats.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|f| f.get(2) == Some(&disk))?;
    let at = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    // After major, minor and name: sectors written is the 7th field, flushes completed the 16th.
    Some(DiskCounters { flushes: at(18).unwrap_or(0), bytes_written: at(9)? * 512 })
}

/// Machine-wide CPU and the disk under test, from one mark to now.
#[derive(Debug, Clone)]
pub struct MachineMark {
    at: std::time::Instant,
    cpu_s: f64,
    disk: Option<(String, DiskCounters)>,
}

/// What [`MachineMark::finish`] measured.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MachineUse {
    /// Seconds from the mark.
    pub elapsed_s: f64,
    /// Busy CPU seconds of the whole machine (every process and the kernel).
    pub cpu_s: f64,
    /// The disk's flush requests, if the folder is on a disk whose kernel counts them.
    pub disk_flushes: Option<u64>,
    /// Bytes written to the disk, if the folder is on one.
    pub disk_bytes_written: Option<u64>,
}

impl MachineMark {
    /// Marks the start, for the disk that holds `dir`.
    pub fn start(dir: &std::path::Path) -> anyhow::Result<MachineMark> {
        let disk = match disk_of(dir) {
            Some(d) => Some((d.clone(), disk_counters(&d)?)),
            None => None,
        };
        Ok(MachineMark { at: std::time::Instant::now(), cpu_s: machine_cpu_s()?, disk })
    }

    /// What the machine and the disk did since the mark.
    pub fn finish(&self) -> anyhow::Result<MachineUse> {
        let (flushes, written) = match &self.disk {
            Some((d, before)) => {
                let now = disk_counters(d)?;
                let flushes = (now.flushes > 0).then(|| now.flushes.saturating_sub(before.flushes));
                (flushes, Some(now.bytes_written.saturating_sub(before.bytes_written)))
            }
            None => (None, None),
        };
        Ok(MachineUse {
            elapsed_s: self.at.elapsed().as_secs_f64(),
            cpu_s: machine_cpu_s()? - self.cpu_s,
            disk_flushes: flushes,
            disk_bytes_written: written,
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
    fn machine_busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 40 9000 700 3 2 1 0 0\ncpu0 50 2 20 4500 350 1 1 0 0 0\nintr 1\n";
        assert_eq!(parse_machine_busy_ticks(stat), Some(151.0));
        assert_eq!(parse_machine_busy_ticks("intr 1\n"), None);
    }

    #[test]
    fn disk_counters_are_read_by_name() {
        let stats = " 254       0 vda 3116539 69426 154797922 4685624 2672644 369387 688149568 4872727 0 670472 9784693 384490 698 662263976 123041 743041 103299\n 254       1 vda1 10 0 80 1 20 0 160 2 0 3 3\n";
        assert_eq!(
            parse_disk_counters(stats, "vda"),
            Some(DiskCounters { flushes: 743041, bytes_written: 688149568 * 512 })
        );
        // A kernel that does not count flushes (before 5.5) has fewer fields.
        assert_eq!(
            parse_disk_counters(stats, "vda1"),
            Some(DiskCounters { flushes: 0, bytes_written: 160 * 512 })
        );
        assert_eq!(parse_disk_counters(stats, "sdb"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(cpu_s(me).unwrap() >= 0.0);
        assert!(peak_rss_bytes(me).unwrap() > 0);
    }
}
