//! The results of one run (`result.json`) and their Markdown tables (`results.md`), where every
//! Silt figure stands next to the peer's and the machine's limit as a ratio.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::latency::LatencySummary;
use crate::limits::Limits;
use crate::replay::ReplayResult;

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// When the run started, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// Wall time of the whole run, seconds.
    pub run_s: f64,
    /// The machine.
    pub machine: Machine,
    /// Which settings each side ran with.
    pub settings: Settings,
    /// Limits measured before the systems ran.
    pub limits_start: Limits,
    /// Limits measured after the systems ran (their spread from the start is the machine's noise).
    pub limits_end: Limits,
    /// Produce workloads.
    pub runs: Vec<RunResult>,
    /// Replay workloads.
    pub replays: Vec<ReplayEntry>,
}

/// What the machine was.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    /// Cores the run could use.
    pub cores: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// CPU model.
    pub cpu: String,
    /// Kernel release.
    pub kernel: String,
    /// Filesystem the systems wrote to (`df -T`).
    pub filesystem: String,
    /// 1-minute load average before and after the run.
    pub load_average: [f64; 2],
}

/// Settings of each side.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    /// Silt: process, durability, client path.
    pub silt: String,
    /// The peer.
    pub nats: String,
    /// `nats-server --version`.
    pub nats_version: String,
    /// The load generator.
    pub load: String,
}

/// One produce run: a system at one replication factor and one rate.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Workload name.
    pub workload: String,
    /// `silt` or `nats`.
    pub system: String,
    /// Replication factor.
    pub replication: u32,
    /// Whether it ran; if not, `reason` says why.
    pub available: bool,
    /// Why it did not run.
    pub reason: Option<String>,
    /// `max`, `50% of max` or `5000 msg/s`.
    pub rate: String,
    /// Rate asked for, messages per second (none for max).
    pub target_msgs_per_s: Option<f64>,
    /// Message value size.
    pub message_bytes: usize,
    /// Acknowledged messages per second in the window.
    pub throughput_msgs_per_s: f64,
    /// Acknowledged value bytes per second in the window, MB/s (10^6).
    pub throughput_mb_per_s: f64,
    /// Messages the consumers received per second in the window.
    pub consume_msgs_per_s: f64,
    /// Messages acknowledged in each second of the window.
    pub per_second_msgs: Vec<u64>,
    /// Standard deviation of the per-second throughput over its mean.
    pub throughput_cv: f64,
    /// Messages acknowledged, warm-up included.
    pub produced_msgs: u64,
    /// Messages the consumers received.
    pub consumed_msgs: u64,
    /// Failed produce requests.
    pub produce_errors: u64,
    /// The first produce failure.
    pub first_error: Option<String>,
    /// Consumer errors.
    pub consume_errors: u64,
    /// Produce-ack latency.
    pub produce_ack: LatencySummary,
    /// End-to-end latency (intended send to consumer).
    pub end_to_end: LatencySummary,
    /// Server CPU seconds per GB of message values acknowledged.
    pub server_cpu_s_per_gb: f64,
    /// Benchmark process (client) CPU seconds per GB.
    pub client_cpu_s_per_gb: f64,
    /// Peak resident memory of the servers (summed), MiB.
    pub server_peak_rss_mib: f64,
    /// Which round of the run this was (`--repeats`; the systems take turns in every round).
    #[serde(default)]
    pub round: u32,
    /// Server CPU seconds per second of the run (warm-up and drain included): cores kept busy.
    #[serde(default)]
    pub server_cpu_cores: f64,
    /// Busy CPU of the whole machine over the measured window (every process, the clients
    /// included, and the kernel's own work), cores.
    #[serde(default)]
    pub machine_cpu_cores: Option<f64>,
    /// The same, CPU seconds per GB of message values acknowledged in the window.
    #[serde(default)]
    pub machine_cpu_s_per_gb: Option<f64>,
    /// Flush requests the disk under test completed per second in the window (each fdatasync
    /// that had anything to write ends in one).
    #[serde(default)]
    pub disk_flushes_per_s: Option<f64>,
    /// Bytes written to the disk under test per byte of message values acknowledged in the
    /// window (every replica on this one disk; metadata and indexes included).
    #[serde(default)]
    pub disk_bytes_per_acked_byte: Option<f64>,
}

/// The plain group-commit server's name in [`RunResult::system`].
pub const GROUP_COMMIT: &str = "group-commit";

/// One replay workload on one system.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayEntry {
    /// Workload name.
    pub workload: String,
    /// `silt` or `nats`.
    pub system: String,
    /// Replication factor.
    pub replication: u32,
    /// Whether it ran.
    pub available: bool,
    /// Why it did not run.
    pub reason: Option<String>,
    /// What it measured.
    pub result: Option<ReplayResult>,
    /// The bucket the archive was written to and read from (`local folder`, or the S3-compatible
    /// server's name).
    #[serde(default = "local_folder")]
    pub store: String,
}

/// The store of a replay run against `silt dev`'s own bucket.
pub fn local_folder() -> String {
    "local folder".into()
}

/// Sample standard deviation over the mean: the relative spread of repeated measurements (0
/// for fewer than two, or a mean of 0).
pub fn coefficient_of_variation(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64;
    if mean > 0.0 {
        var.sqrt() / mean
    } else {
        0.0
    }
}

fn f(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// One figure of a run, if it has it.
type Getter = fn(&RunResult) -> Option<f64>;

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("**{:.2}**", a / b),
        _ => "–".into(),
    }
}

/// The median of some values (the mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// One run whose every figure is the median of the same figure over `runs` (the rounds of one
/// system at one replication factor and rate).
fn median_run(runs: &[&RunResult]) -> Option<RunResult> {
    let mut m = (*runs.first()?).clone();
    let med = |g: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| g(r)).collect()).unwrap_or(0.0);
    let med_opt = |g: &dyn Fn(&RunResult) -> Option<f64>| median(runs.iter().filter_map(|r| g(r)).collect());
    m.throughput_msgs_per_s = med(&|r| r.throughput_msgs_per_s);
    m.throughput_mb_per_s = med(&|r| r.throughput_mb_per_s);
    m.consume_msgs_per_s = med(&|r| r.consume_msgs_per_s);
    m.throughput_cv = med(&|r| r.throughput_cv);
    m.produce_ack.p50_ms = med(&|r| r.produce_ack.p50_ms);
    m.produce_ack.p99_ms = med(&|r| r.produce_ack.p99_ms);
    m.produce_ack.p999_ms = med(&|r| r.produce_ack.p999_ms);
    m.end_to_end.p50_ms = med(&|r| r.end_to_end.p50_ms);
    m.end_to_end.p99_ms = med(&|r| r.end_to_end.p99_ms);
    m.end_to_end.p999_ms = med(&|r| r.end_to_end.p999_ms);
    m.server_cpu_s_per_gb = med(&|r| r.server_cpu_s_per_gb);
    m.client_cpu_s_per_gb = med(&|r| r.client_cpu_s_per_gb);
    m.server_peak_rss_mib = med(&|r| r.server_peak_rss_mib);
    m.server_cpu_cores = med(&|r| r.server_cpu_cores);
    m.machine_cpu_cores = med_opt(&|r| r.machine_cpu_cores);
    m.machine_cpu_s_per_gb = med_opt(&|r| r.machine_cpu_s_per_gb);
    m.disk_flushes_per_s = med_opt(&|r| r.disk_flushes_per_s);
    m.disk_bytes_per_acked_byte = med_opt(&|r| r.disk_bytes_per_acked_byte);
    Some(m)
}

impl Report {
    /// Every round of one system at one replication factor and rate that ran.
    fn rounds(&self, workload: &str, system: &str, r: u32, rate: &str) -> Vec<&RunResult> {
        self.runs
            .iter()
            .filter(|x| {
                x.workload == workload
                    && x.system == system
                    && x.replication == r
                    && x.rate == rate
                    && x.available
            })
            .collect()
    }

    /// One system at one replication factor and rate: the median of its rounds, or (if none
    /// ran) the entry that says why not.
    fn find(&self, workload: &str, system: &str, r: u32, rate: &str) -> Option<RunResult> {
        median_run(&self.rounds(workload, system, r, rate)).or_else(|| {
            self.runs
                .iter()
                .find(|x| {
                    x.workload == workload && x.system == system && x.replication == r && x.rate == rate
                })
                .cloned()
        })
    }

    /// The lowest and highest of a figure over the rounds, when there was more than one.
    fn range(&self, workload: &str, system: &str, r: u32, rate: &str, get: Getter) -> Option<(f64, f64)> {
        let values: Vec<f64> = self.rounds(workload, system, r, rate).into_iter().filter_map(get).collect();
        (values.len() > 1).then(|| {
            (
                values.iter().copied().fold(f64::INFINITY, f64::min),
                values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        })
    }

    /// Rounds each system ran at each rate (the most of any).
    pub fn rounds_run(&self) -> u32 {
        self.runs.iter().map(|r| r.round + 1).max().unwrap_or(0)
    }

    /// The better of the start and end measurements: a limit is the best the machine did.
    fn disk_bw(&self) -> f64 {
        self.limits_start.seq_write_fdatasync_mb_per_s.max(self.limits_end.seq_write_fdatasync_mb_per_s)
    }

    fn disk_lat(&self, pick: fn(&LatencySummary) -> f64) -> f64 {
        pick(&self.limits_start.write_4k_fdatasync).min(pick(&self.limits_end.write_4k_fdatasync))
    }

    /// The disk's flush capacity: flushes per second of back-to-back 4 KiB overwrites +
    /// fdatasync, the better of start and end, if the run measured it.
    fn disk_flush_capacity(&self) -> Option<f64> {
        [self.limits_start.overwrite_4k_disk_flushes_per_s, self.limits_end.overwrite_4k_disk_flushes_per_s]
            .into_iter()
            .flatten()
            .max_by(f64::total_cmp)
    }

    /// The better p99 of the loopback round trip's two measurements, if the run measured it.
    fn round_trip_p99(&self) -> Option<f64> {
        [&self.limits_start.loopback_round_trip, &self.limits_end.loopback_round_trip]
            .into_iter()
            .filter(|l| l.count > 0)
            .map(|l| l.p99_ms)
            .min_by(f64::total_cmp)
    }

    /// The Markdown tables.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(
            s,
            "Machine: {} cores ({}), {:.0} GiB, Linux {}, data on {}; load average {:.2} before, {:.2} after. \
             Run took {:.0} s.\n",
            m.cores, m.cpu, m.memory_gib, m.kernel, m.filesystem, m.load_average[0], m.load_average[1], self.run_s
        );
        if self.rounds_run() > 1 {
            let _ = writeln!(
                s,
                "Every produce workload ran {} rounds, the systems taking turns in each; every figure is \
                 the median of the rounds, with their lowest and highest in parentheses.\n",
                self.rounds_run()
            );
        }
        let _ = writeln!(s, "- **Silt:** {}", self.settings.silt);
        let _ = writeln!(s, "- **NATS JetStream** ({}): {}", self.settings.nats_version, self.settings.nats);
        let _ = writeln!(s, "- **Load:** {}\n", self.settings.load);

        // Limits.
        let (a, b) = (&self.limits_start, &self.limits_end);
        let _ = writeln!(s, "### Limits of this machine (plain programs, start and end of the run)\n");
        let _ = writeln!(s, "| limit | start | end |\n|---|---|---|");
        let lat = |l: &LatencySummary| format!("{} / {} / {} ms", f(l.p50_ms), f(l.p99_ms), f(l.p999_ms));
        let flushes = |l: &Limits| match l.overwrite_4k_disk_flushes_per_s {
            Some(d) => {
                format!("{} fdatasyncs/s, {} disk flushes/s", f(l.overwrite_4k_fdatasyncs_per_s), f(d))
            }
            None if l.overwrite_4k_fdatasyncs_per_s > 0.0 => {
                format!("{} fdatasyncs/s", f(l.overwrite_4k_fdatasyncs_per_s))
            }
            None => "–".into(),
        };
        let rows: [(&str, String, String); 8] = [
            (
                "sequential write, 8 MiB per write + fdatasync",
                format!("{} MB/s", f(a.seq_write_fdatasync_mb_per_s)),
                format!("{} MB/s", f(b.seq_write_fdatasync_mb_per_s)),
            ),
            ("4 KiB write + fdatasync, p50 / p99 / p999", lat(&a.write_4k_fdatasync), lat(&b.write_4k_fdatasync)),
            (
                "4 KiB write + fdatasync, CPU time of the writing thread per write",
                format!("{} µs", f(a.write_4k_fdatasync_cpu_us)),
                format!("{} µs", f(b.write_4k_fdatasync_cpu_us)),
            ),
            (
                "4 KiB overwrite + fdatasync (a file written before; how Silt writes small groups), p50 / p99 / p999",
                lat(&a.overwrite_4k_fdatasync),
                lat(&b.overwrite_4k_fdatasync),
            ),
            (
                "4 KiB overwrite + fdatasync, CPU time of the writing thread per write",
                format!("{} µs", f(a.overwrite_4k_fdatasync_cpu_us)),
                format!("{} µs", f(b.overwrite_4k_fdatasync_cpu_us)),
            ),
            (
                "4 KiB overwrite + fdatasync back to back from one thread: the disk's flush capacity",
                flushes(a),
                flushes(b),
            ),
            (
                "loopback TCP, one stream",
                format!("{} MB/s", f(a.loopback_tcp_mb_per_s)),
                format!("{} MB/s", f(b.loopback_tcp_mb_per_s)),
            ),
            (
                "loopback TCP round trip between two threads (1 KiB request, 16-byte reply), p50 / p99 / p999",
                lat(&a.loopback_round_trip),
                lat(&b.loopback_round_trip),
            ),
        ];
        for (limit, start, end) in rows {
            let _ = writeln!(s, "| {limit} | {start} | {end} |");
        }
        let _ = writeln!(s);

        // Produce workloads.
        let mut workloads: Vec<&str> = Vec::new();
        for r in &self.runs {
            if !workloads.contains(&r.workload.as_str()) {
                workloads.push(&r.workload);
            }
        }
        let mut notes: Vec<String> = Vec::new();
        for w in &workloads {
            let _ = writeln!(s, "### {w}\n");
            let _ = writeln!(
                s,
                "At `max` the producers go flat out; `50% of max` is half of the lower of that run's \
                 produce and consume rates (what the system sustained end to end), each system its own. \
                 Ratios are Silt / the other column; for throughput higher is better, for latency, CPU and \
                 memory lower is better. The limit for throughput is the disk's sequential fdatasync \
                 bandwidth, for latency the disk's 4 KiB write + fdatasync at the same percentile \
                 (the better of start and end). ± is the spread of the per-second throughput (one standard \
                 deviation).\n"
            );
            let _ = writeln!(
                s,
                "The group-commit server appends every request to one file with one fdatasync per group \
                 and does nothing else (one copy, no consumers); at a fraction of max it runs at Silt \
                 R=1's rate. Machine CPU and disk figures are machine-wide over the measured window \
                 (`/proc/stat`, `/proc/diskstats`): the clients and the kernel's own work count; the \
                 limit for disk flushes is the disk's flush capacity (back-to-back 4 KiB fdatasyncs).\n"
            );
            let _ = writeln!(
                s,
                "| rate | metric | Silt R=1 | NATS R=1 | Silt/NATS R=1 | NATS R=3 | Silt R=3 | Silt R=1/NATS R=3 | group commit | Silt R=1/group commit | limit | Silt R=1/limit |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
            let mut rates: Vec<&str> = Vec::new();
            for r in self.runs.iter().filter(|r| r.workload == *w) {
                if !rates.contains(&r.rate.as_str()) {
                    rates.push(&r.rate);
                }
            }
            for rate in rates {
                let silt = self.find(w, "silt", 1, rate).filter(|r| r.available);
                let nats1 = self.find(w, "nats", 1, rate).filter(|r| r.available);
                let nats3 = self.find(w, "nats", 3, rate).filter(|r| r.available);
                let gc = self.find(w, GROUP_COMMIT, 1, rate).filter(|r| r.available);
                let silt3 = self.find(w, "silt", 3, rate);
                if let Some(reason) = silt3.as_ref().and_then(|r| r.reason.clone()) {
                    if !notes.contains(&reason) {
                        notes.push(reason);
                    }
                }
                let (silt, nats1, nats3, gc) = (silt.as_ref(), nats1.as_ref(), nats3.as_ref(), gc.as_ref());
                let rows: [(&str, Getter, Option<f64>, &str); 17] = [
                    ("produce MB/s", |r| Some(r.throughput_mb_per_s), Some(self.disk_bw()), "MB/s"),
                    ("produce msgs/s", |r| Some(r.throughput_msgs_per_s), None, ""),
                    ("consume msgs/s", |r| consumed(r.consume_msgs_per_s), None, ""),
                    (
                        "produce-ack p50 ms",
                        |r| Some(r.produce_ack.p50_ms),
                        Some(self.disk_lat(|l| l.p50_ms)),
                        "ms",
                    ),
                    (
                        "produce-ack p99 ms",
                        |r| Some(r.produce_ack.p99_ms),
                        Some(self.disk_lat(|l| l.p99_ms)),
                        "ms",
                    ),
                    (
                        "produce-ack p999 ms",
                        |r| Some(r.produce_ack.p999_ms),
                        Some(self.disk_lat(|l| l.p999_ms)),
                        "ms",
                    ),
                    (
                        "end-to-end p50 ms",
                        |r| consumed(r.end_to_end.p50_ms),
                        Some(self.disk_lat(|l| l.p50_ms)),
                        "ms",
                    ),
                    (
                        "end-to-end p99 ms",
                        |r| consumed(r.end_to_end.p99_ms),
                        Some(self.disk_lat(|l| l.p99_ms)),
                        "ms",
                    ),
                    (
                        "end-to-end p999 ms",
                        |r| consumed(r.end_to_end.p999_ms),
                        Some(self.disk_lat(|l| l.p999_ms)),
                        "ms",
                    ),
                    ("server CPU s per GB", |r| Some(r.server_cpu_s_per_gb), None, ""),
                    ("server CPU, cores", |r| Some(r.server_cpu_cores), None, ""),
                    ("machine CPU s per GB", |r| r.machine_cpu_s_per_gb, None, ""),
                    ("machine CPU, cores", |r| r.machine_cpu_cores, None, ""),
                    ("client CPU s per GB", |r| Some(r.client_cpu_s_per_gb), None, ""),
                    ("disk flushes per s", |r| r.disk_flushes_per_s, self.disk_flush_capacity(), "/s"),
                    ("disk bytes written per byte acknowledged", |r| r.disk_bytes_per_acked_byte, None, ""),
                    ("server peak RSS MiB", |r| Some(r.server_peak_rss_mib), None, ""),
                ];
                for (i, (name, get, limit, unit)) in rows.iter().enumerate() {
                    // The median of the rounds, with their range when there were several (or,
                    // for throughput from one round, the spread of its seconds).
                    let cell = |system: &str, replication: u32, r: Option<&RunResult>| {
                        let Some((r, Some(v))) = r.map(|r| (r, get(r))) else { return "–".to_string() };
                        match self.range(w, system, replication, rate, *get) {
                            Some((lo, hi)) => format!("{} ({}–{})", f(v), f(lo), f(hi)),
                            None if i == 0 => format!("{} ±{:.0}%", f(v), r.throughput_cv * 100.0),
                            None => f(v),
                        }
                    };
                    let silt3_cell = match silt3.as_ref() {
                        Some(r) if r.available => cell("silt", 3, Some(r)),
                        _ => "n/a¹".into(),
                    };
                    let sv = silt.and_then(get);
                    let _ = writeln!(
                        s,
                        "| {} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        if i == 0 { rate } else { "" },
                        cell("silt", 1, silt),
                        cell("nats", 1, nats1),
                        ratio(sv, nats1.and_then(get)),
                        cell("nats", 3, nats3),
                        silt3_cell,
                        ratio(sv, nats3.and_then(get)),
                        cell(GROUP_COMMIT, 1, gc),
                        ratio(sv, gc.and_then(get)),
                        limit.map_or("–".into(), |l| format!("{} {unit}", f(l))),
                        ratio(sv, *limit),
                    );
                }
            }
            for r in self.runs.iter().filter(|r| r.workload == *w && r.available) {
                // The group-commit server has no consumers.
                let unconsumed = r.system != GROUP_COMMIT && r.consumed_msgs < r.produced_msgs;
                if r.produce_errors > 0 || r.consume_errors > 0 || unconsumed {
                    let _ = writeln!(
                        s,
                        "\n{} R={} at {}: {} produce errors{}, {} consumer errors, {} of {} acknowledged messages consumed.",
                        r.system,
                        r.replication,
                        r.rate,
                        r.produce_errors,
                        r.first_error.as_ref().map_or(String::new(), |e| format!(" (first: {e})")),
                        r.consume_errors,
                        r.consumed_msgs,
                        r.produced_msgs
                    );
                }
            }
            let _ = writeln!(s);
        }

        // Replays.
        for e in self.replays.iter().filter(|e| e.system == "silt" && e.replication == 1) {
            let _ = writeln!(s, "### {} (bucket: {})\n", e.workload, e.store);
            let Some(r) = &e.result else {
                let _ = writeln!(s, "Not run: {}\n", e.reason.clone().unwrap_or_default());
                continue;
            };
            let r3 = self.replays.iter().find(|x| {
                x.workload == e.workload && x.system == "silt" && x.replication == 3 && x.store == e.store
            });
            if let Some(reason) = r3.and_then(|x| x.reason.clone()) {
                if !notes.contains(&reason) {
                    notes.push(reason);
                }
            }
            let peer = self.replays.iter().find(|x| x.workload == e.workload && x.system == "nats");
            let _ = writeln!(
                s,
                "{} messages ({} MiB of values) written, archived as {} Parquet objects, local copies dropped, \
                 then replayed through the binary replay API (`GET .../batches`), one reader per partition. Written in {:.1} s, all \
                 archived {:.1} s after the first write. The cold reader fetched {:.2}× the object bytes \
                 from the bucket while replaying (1 means every byte came from the bucket).\n",
                r.messages,
                r.value_bytes >> 20,
                r.objects,
                r.produce_s,
                r.archive_s,
                r.cold_fetched_fraction
            );
            let _ = writeln!(
                s,
                "| metric | Silt R=1 | Silt R=3 | limit | Silt R=1/limit |\n|---|---|---|---|---|"
            );
            let r3 = r3.and_then(|x| x.result.as_ref());
            let _ = writeln!(
                s,
                "| replay, object bytes per second | {} MB/s | {} | raw GET of the same objects: {} MB/s | {} |",
                f(r.replay_object_mb_per_s),
                r3.map_or("n/a¹".into(), |x| format!("{} MB/s", f(x.replay_object_mb_per_s))),
                f(r.raw_get_mb_per_s),
                ratio(Some(r.replay_object_mb_per_s), Some(r.raw_get_mb_per_s))
            );
            // A run from before the plain reader was measured has zeros here.
            let measured = |v: f64| (v > 0.0).then_some(v);
            let _ = writeln!(
                s,
                "| replay against a plain reader, object bytes per second | {} MB/s | {} | GET + Parquet decode \
                 of the same objects by a plain program (every column): {} | {} |",
                f(r.replay_object_mb_per_s),
                r3.map_or("n/a¹".into(), |x| format!("{} MB/s", f(x.replay_object_mb_per_s))),
                measured(r.get_and_decode_mb_per_s).map_or("–".into(), |v| format!("{} MB/s", f(v))),
                ratio(Some(r.replay_object_mb_per_s), measured(r.get_and_decode_mb_per_s))
            );
            let _ = writeln!(
                s,
                "| server CPU s per GB, replay | {} | {} | the plain program's Parquet decoding alone: {} | {} |",
                f(r.replay_cpu_s_per_gb),
                r3.map_or("n/a¹".into(), |x| f(x.replay_cpu_s_per_gb)),
                measured(r.decode_cpu_s_per_gb).map_or("–".into(), f),
                ratio(Some(r.replay_cpu_s_per_gb), measured(r.decode_cpu_s_per_gb))
            );
            type Cell = fn(&ReplayResult) -> String;
            let rows: [(&str, Cell); 8] = [
                ("replay, message values per second", |x| format!("{} MB/s", f(x.replay_value_mb_per_s))),
                ("replay, messages per second", |x| f(x.replay_msgs_per_s)),
                ("PUTs per GiB of values (archiving)", |x| f(x.puts_per_gib)),
                ("GETs per GiB of values (replay)", |x| f(x.gets_per_gib)),
                ("cold reads that were seeks (replay; 0 expected)", |x| x.random_cold_reads.to_string()),
                ("Parquet size / segment size", |x| format!("{:.3}", x.parquet_size_ratio)),
                ("server CPU s per GB, write + archive", |x| f(x.write_and_archive_cpu_s_per_gb)),
                ("server peak RSS while replaying, MiB", |x| f(x.replay_peak_rss_mib)),
            ];
            for (name, cell) in rows {
                let _ = writeln!(s, "| {name} | {} | {} | – | – |", cell(r), r3.map_or("n/a¹".into(), cell));
            }
            if let Some(p) = peer.and_then(|p| p.reason.clone()) {
                let _ = writeln!(s, "\nPeer: {p}");
            }
            let _ = writeln!(s);
        }

        // Targets.
        let _ = writeln!(s, "### Targets\n\n| target | measured | met |\n|---|---|---|");
        let w16 = "1-topic-16-partitions-1kb";
        let silt_max = self.find(w16, "silt", 1, "max").filter(|r| r.available);
        let nats3_max = self.find(w16, "nats", 3, "max").filter(|r| r.available);
        let silt3_max = self.find(w16, "silt", 3, "max").filter(|r| r.available);
        match (&silt3_max, &nats3_max) {
            (Some(a), Some(b)) => {
                let v = a.throughput_mb_per_s / b.throughput_mb_per_s;
                let _ = writeln!(
                    s,
                    "| R=3 produce throughput ≥ 0.8 × NATS R=3 ({w16}) | {v:.2} | {} |",
                    yes(v >= 0.8)
                );
            }
            _ => {
                let reference = ratio(
                    silt_max.map(|r| r.throughput_mb_per_s),
                    nats3_max.as_ref().map(|r| r.throughput_mb_per_s),
                );
                let missing =
                    if silt3_max.is_none() { "Silt R=3 not available¹" } else { "NATS R=3 not run" };
                let _ = writeln!(
                    s,
                    "| R=3 produce throughput ≥ 0.8 × NATS R=3 ({w16}) | not measurable: {missing} \
                     (Silt R=1 / NATS R=3: {reference}) | – |"
                );
            }
        }
        for w in &workloads {
            if let Some(r) = self.find(w, "silt", 1, "50% of max").filter(|r| r.available) {
                let v = r.produce_ack.p99_ms / self.disk_lat(|l| l.p99_ms);
                let floor = match self.round_trip_p99() {
                    Some(rt) => format!(
                        "; one loopback round trip plus one 4 KiB fdatasync alone: {} ms",
                        f(rt + self.disk_lat(|l| l.p99_ms))
                    ),
                    None => String::new(),
                };
                let _ = writeln!(
                    s,
                    "| produce-ack p99 at 50% of max ≤ 2 × disk 4 KiB write + fdatasync p99 ({w}) | {v:.2} × \
                     (p99 {} ms{floor}) | {} |",
                    f(r.produce_ack.p99_ms),
                    yes(v <= 2.0)
                );
            }
        }
        self.journal_targets(&mut s);
        for e in self.replays.iter().filter(|e| e.system == "silt" && e.replication == 1) {
            if let Some(r) = &e.result {
                let _ = writeln!(
                    s,
                    "| cold replay ≥ 0.5 × raw GET from the same store ({}, bucket: {}) | {:.2} | {} |",
                    e.workload,
                    e.store,
                    r.replay_to_get,
                    yes(r.replay_to_get >= 0.5)
                );
            }
        }
        for (i, n) in notes.iter().enumerate() {
            let _ = writeln!(s, "\n{} {n}", if i == 0 { "¹" } else { "" });
        }
        s
    }
}

impl Report {
    /// The rows of the targets for one journal per agent (group commit across partitions).
    fn journal_targets(&self, s: &mut String) {
        let w16 = "1-topic-16-partitions-1kb";
        for (r, goal) in [(1, 0.30), (3, 0.12)] {
            if let Some(x) = self.find(w16, "silt", r, "max").filter(|x| x.available) {
                let mb = x.throughput_msgs_per_s.min(x.consume_msgs_per_s) * x.message_bytes as f64 / 1e6;
                let v = mb / self.disk_bw();
                let _ = writeln!(
                    s,
                    "| R={r}, produce + consume ÷ disk sequential write + fdatasync bandwidth ≥ {goal} ({w16}) | \
                     {v:.2} ({} MB/s end to end) | {} |",
                    f(mb),
                    yes(v >= goal)
                );
            }
        }
        for (r, goal) in [(1, 4.0), (3, 10.0)] {
            if let Some(x) = self.find(w16, "silt", r, "max").filter(|x| x.available) {
                let v = x.server_cpu_s_per_gb;
                let _ = writeln!(
                    s,
                    "| R={r}, server CPU s per GB ≤ {goal} ({w16}, max) | {} | {} |",
                    f(v),
                    yes(v <= goal)
                );
            }
        }
        let mut workloads: Vec<&str> = Vec::new();
        for r in &self.runs {
            if !workloads.contains(&r.workload.as_str()) {
                workloads.push(&r.workload);
            }
        }
        for w in workloads {
            let silt = self.find(w, "silt", 1, "50% of max").filter(|x| x.available);
            let gc = self.find(w, GROUP_COMMIT, 1, "50% of max").filter(|x| x.available);
            if let (Some(a), Some(b)) = (&silt, &gc) {
                let v = a.produce_ack.p99_ms / b.produce_ack.p99_ms;
                let _ = writeln!(
                    s,
                    "| produce-ack p99 at 50% of max ≤ 1.5 × the group-commit server's at the same rate ({w}) | \
                     {v:.2} ({} ms / {} ms) | {} |",
                    f(a.produce_ack.p99_ms),
                    f(b.produce_ack.p99_ms),
                    yes(v <= 1.5)
                );
            }
            if let (Some(a), Some(cap)) = (&silt, self.disk_flush_capacity()) {
                if let Some(flushes) = a.disk_flushes_per_s {
                    let v = flushes / cap;
                    let _ = writeln!(
                        s,
                        "| disk flushes per s at 50% of max ≤ 0.3 × the disk's flush capacity ({w}) | {v:.2} \
                         ({} / {} per s) | {} |",
                        f(flushes),
                        f(cap),
                        yes(v <= 0.3)
                    );
                }
            }
        }
        let many = "1000-partitions-10-msgs-per-s";
        // Once for each replication factor and rate, over the medians of the rounds.
        let mut seen: Vec<(u32, &str)> = Vec::new();
        for x in self.runs.iter().filter(|x| x.workload == many && x.system == "silt" && x.available) {
            if !seen.contains(&(x.replication, x.rate.as_str())) {
                seen.push((x.replication, x.rate.as_str()));
            }
        }
        for x in seen.into_iter().filter_map(|(r, rate)| self.find(many, "silt", r, rate)) {
            if let Some(flushes) = x.disk_flushes_per_s {
                let _ = writeln!(
                    s,
                    "| R={}, disk flushes per s ≤ 400 ({many} at {}) | {} | {} |",
                    x.replication,
                    x.rate,
                    f(flushes),
                    yes(flushes <= 400.0)
                );
            }
            let _ = writeln!(
                s,
                "| R={}, server CPU ≤ 0.3 cores ({many} at {}) | {} | {} |",
                x.replication,
                x.rate,
                f(x.server_cpu_cores),
                yes(x.server_cpu_cores <= 0.3)
            );
        }
    }
}

/// A consumer figure, or none where nothing was consumed (the group-commit server has no
/// consumers).
fn consumed(v: f64) -> Option<f64> {
    (v > 0.0).then_some(v)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, round: u32, mb_per_s: f64, p99_ms: f64) -> RunResult {
        let mut r = RunResult {
            workload: "w".into(),
            system: system.into(),
            replication: 1,
            available: true,
            rate: "max".into(),
            throughput_mb_per_s: mb_per_s,
            round,
            ..RunResult::default()
        };
        r.produce_ack.p99_ms = p99_ms;
        r
    }

    #[test]
    fn medians_of_the_rounds_with_their_range() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN]), None);
        let runs = vec![
            run("silt", 0, 30.0, 9.0),
            run(GROUP_COMMIT, 0, 90.0, 2.0),
            run("silt", 1, 10.0, 5.0),
            run(GROUP_COMMIT, 1, 80.0, 3.0),
            run("silt", 2, 20.0, 7.0),
            run(GROUP_COMMIT, 2, 70.0, 4.0),
        ];
        let limits: Limits = serde_json::from_str(
            r#"{"seq_write_fdatasync_mb_per_s": 100.0, "loopback_tcp_mb_per_s": 1000.0,
                "write_4k_fdatasync": {"count": 1, "p50_ms": 1.0, "p99_ms": 1.0, "p999_ms": 1.0, "max_ms": 1.0,
                "mean_ms": 1.0, "distribution": []}}"#,
        )
        .unwrap();
        let report = Report {
            started_unix_ms: 0,
            run_s: 0.0,
            machine: Machine::default(),
            settings: Settings::default(),
            limits_start: limits.clone(),
            limits_end: limits,
            runs,
            replays: Vec::new(),
        };
        assert_eq!(report.rounds_run(), 3);
        let silt = report.find("w", "silt", 1, "max").unwrap();
        assert_eq!((silt.throughput_mb_per_s, silt.produce_ack.p99_ms), (20.0, 7.0));
        let md = report.markdown();
        assert!(md.contains("ran 3 rounds"), "{md}");
        // Silt's median and range, the group-commit server's, and the ratio of the medians.
        assert!(md.contains("| max | produce MB/s | 20.0 (10.0–30.0) |"), "{md}");
        assert!(md.contains("| 80.0 (70.0–90.0) | **0.25** |"), "{md}");
        assert!(md.contains("| produce-ack p99 ms | 7.00 (5.00–9.00) |"), "{md}");

        // The targets of many partitions take the median of the rounds, once.
        let mut many = report.clone();
        many.runs = [(0, 1.2), (1, 1.4), (2, 1.3)]
            .into_iter()
            .map(|(round, cores)| RunResult {
                workload: "1000-partitions-10-msgs-per-s".into(),
                rate: "10000 msg/s".into(),
                server_cpu_cores: cores,
                ..run("silt", round, 10.0, 5.0)
            })
            .collect();
        let md = many.markdown();
        let rows: Vec<&str> = md.lines().filter(|l| l.contains("server CPU ≤ 0.3 cores")).collect();
        assert_eq!(rows.len(), 1, "{md}");
        assert!(rows[0].contains("| 1.30 | no |"), "{md}");
    }
}
