//! `silt-bench`: Silt's benchmark harness.
//!
//! Runs the workloads of `bench/workloads/` (OpenMessaging Benchmark style) against Silt and,
//! in the same run on the same machine, against NATS JetStream at the same durability, and
//! measures the machine's own limits (disk fdatasync bandwidth, latency and CPU cost, loopback
//! TCP throughput and round trip) at the start and the end. Writes `result.json` and `results.md` under a results folder; every
//! Silt figure is shown next to the peer's and the limit's as a ratio. `bench/run.sh` is the one
//! command that installs what it needs, builds, runs this and draws the plot.
//!
//! It starts every server itself on loopback ports under a work folder, and stops them and
//! deletes their data after each workload. It never talks to anything but 127.0.0.1.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;

use silt_bench::group_commit::GroupCommitServer;
use silt_bench::load::{LoadPlan, ProduceTarget};
use silt_bench::nats_system::{NatsCluster, NatsProducer};
use silt_bench::proc_stats::{MachineMark, MachineUse, ProcMark};
use silt_bench::report::{local_folder, Machine, ReplayEntry, Report, RunResult, Settings};
use silt_bench::silt_system::{SiltProducer, SiltServer};
use silt_bench::workload::{ProduceSpec, Workload, WorkloadKind};

/// Benchmarks Silt next to NATS JetStream and the machine's limits.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Folder of workload files (`*.toml`).
    #[arg(long, default_value = "bench/workloads")]
    workloads: PathBuf,
    /// Run only these workloads (by name; repeatable). Default: all.
    #[arg(long)]
    only: Vec<String>,
    /// Where results go: `<results>/<run id>/result.json` and `results.md`, copied to
    /// `<results>/latest/`.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Folder for the servers' data (on the disk under test). Default: `<results>/work`.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// The `silt` binary (a release build).
    #[arg(long, env = "SILT_BIN", required_unless_present_any = ["compare", "serve_group_commit"])]
    silt_bin: Option<PathBuf>,
    /// The `nats-server` binary; without it the peer's rows say it was not run.
    #[arg(long, env = "NATS_SERVER_BIN")]
    nats_server: Option<PathBuf>,
    /// Override every produce workload's measured time (e.g. "2s" for a quick look).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Override every produce workload's warm-up.
    #[arg(long, value_parser = humantime::parse_duration)]
    warmup: Option<Duration>,
    /// Override the replay workloads' volume, MiB.
    #[arg(long)]
    replay_mib: Option<u64>,
    /// Time each limit is measured for.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    limits_time: Duration,
    /// Longest wait for consumers to catch up after the producers stop.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    drain: Duration,
    /// Also run the replay workloads with the bucket on this S3-compatible store
    /// (`s3://bucket/prefix`; endpoint and credentials from `AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID`, ...), next to the local folder. `bench/run.sh` starts SeaweedFS on
    /// loopback for it.
    #[arg(long)]
    replay_s3: Option<String>,
    /// What to call that store in the report.
    #[arg(long, default_value = "S3 API")]
    replay_s3_name: String,
    /// Run nothing: compare two earlier runs' `result.json` figure by figure, each difference
    /// next to the noise the runs themselves report, and print it as Markdown.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    compare: Option<Vec<PathBuf>>,
    /// Rounds of every produce workload: in each round every system runs every rate in turn,
    /// and the report shows the median and the range of the rounds (the replay workloads run
    /// once).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    repeats: u32,
    /// Run nothing else: serve as the plain group-commit server, appending to a file in this
    /// folder (started by the benchmark itself, as a process of its own).
    #[arg(long, hide = true, value_name = "DIR")]
    serve_group_commit: Option<PathBuf>,
}

const SILT_SETTINGS: &str = "`silt dev --agents R` (metadata, R agents and the compactor in one process, \
each agent with its own data directory; bucket in a local folder), topics with replication.factor=R: \
every produce acknowledged after fdatasync (group commit) on a majority of the R replicas (R=1: the \
writer's disk; R=3: the writer and one of two followers). Produced with `Client::produce_batch` (binary RecordBatch v2, one batch per \
request, what a production client sends); consumed by one exclusive consumer group (long-poll + ack \
per poll, JSON).";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.serve_group_commit {
        return silt_bench::group_commit::serve_main(dir);
    }
    if let Some(paths) = &args.compare {
        let read = |p: &PathBuf| -> anyhow::Result<Report> {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a silt-bench result", p.display()))
        };
        let (a, b) = (read(&paths[0])?, read(&paths[1])?);
        let name = |p: &PathBuf| p.display().to_string();
        print!("{}", silt_bench::compare::markdown(&a, &b, &name(&paths[0]), &name(&paths[1])));
        return Ok(());
    }
    let started = Instant::now();
    let started_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut workloads = silt_bench::workload::load_dir(&args.workloads)?;
    if !args.only.is_empty() {
        workloads.retain(|w| args.only.contains(&w.name));
        anyhow::ensure!(!workloads.is_empty(), "no workload named {:?}", args.only);
    }
    for w in &mut workloads {
        if let Some(p) = &mut w.produce {
            p.duration = args.duration.unwrap_or(p.duration);
            p.warmup = args.warmup.unwrap_or(p.warmup);
        }
        if let (Some(r), Some(mib)) = (&mut w.replay, args.replay_mib) {
            r.total_mib = mib;
        }
    }
    let run_dir = args.results.join(format!("run-{}", started_unix_ms / 1000));
    std::fs::create_dir_all(&run_dir)?;
    let work = args.work_dir.clone().unwrap_or_else(|| args.results.join("work"));
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;

    let load_before = load_average();
    eprintln!("== limits (start)");
    let limits_start = silt_bench::limits::measure(&work.join("limits"), args.limits_time)?;

    let nats_version = match &args.nats_server {
        Some(bin) => std::process::Command::new(bin)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default(),
        None => "not run".into(),
    };
    let mut runs = Vec::new();
    let mut replays = Vec::new();
    for round in 0..args.repeats {
        for (wi, w) in workloads.iter().enumerate() {
            match w.kind {
                WorkloadKind::Produce => {
                    let Some(spec) = &w.produce else { continue };
                    if args.repeats > 1 {
                        eprintln!("== round {} of {}", round + 1, args.repeats);
                    }
                    runs.extend(run_produce_workload(&args, &work, wi, w, spec, round).await?);
                }
                WorkloadKind::Replay if round == 0 => {
                    replays.extend(run_replay_workload(&args, &work, wi, w).await?);
                }
                WorkloadKind::Replay => {}
            }
        }
    }

    eprintln!("== limits (end)");
    let limits_end = silt_bench::limits::measure(&work.join("limits"), args.limits_time)?;
    let report = Report {
        started_unix_ms,
        run_s: started.elapsed().as_secs_f64(),
        machine: machine(&work, [load_before, load_average()]),
        settings: Settings {
            silt: SILT_SETTINGS.into(),
            nats: silt_bench::nats_system::SETTINGS.into(),
            nats_version,
            load: "OpenMessaging-style producers at a fixed rate (latency counted from each message's \
                   intended send time, so falling behind shows) or as fast as they go; batches close when \
                   full or after the linger; consumers read along; figures from the measured window after \
                   the warm-up."
                .into(),
        },
        limits_start,
        limits_end,
        runs,
        replays,
    };
    let json = serde_json::to_string_pretty(&report)?;
    let md = report.markdown();
    std::fs::write(run_dir.join("result.json"), &json)?;
    std::fs::write(run_dir.join("results.md"), &md)?;
    let latest = args.results.join("latest");
    std::fs::create_dir_all(&latest)?;
    std::fs::write(latest.join("result.json"), &json)?;
    std::fs::write(latest.join("results.md"), &md)?;
    println!("{md}");
    eprintln!("== wrote {} and {}", run_dir.join("result.json").display(), latest.display());
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// The rates of a produce workload in order: max, fractions of the max, fixed.
enum Rate {
    Max,
    Fraction(f64),
    Fixed(u64),
}

impl Rate {
    fn label(&self) -> String {
        match self {
            Rate::Max => "max".into(),
            Rate::Fraction(f) => format!("{:.0}% of max", f * 100.0),
            Rate::Fixed(r) => format!("{r} msg/s"),
        }
    }
}

fn rates(spec: &ProduceSpec) -> Vec<Rate> {
    let mut v = Vec::new();
    if spec.max_rate {
        v.push(Rate::Max);
    }
    v.extend(spec.fractions_of_max.iter().map(|f| Rate::Fraction(*f)));
    v.extend(spec.fixed_rates_msgs_per_s.iter().map(|r| Rate::Fixed(*r)));
    v
}

fn plan(w: &Workload, spec: &ProduceSpec, rate: Option<f64>) -> LoadPlan {
    LoadPlan {
        partitions: w.total_partitions(),
        message_bytes: w.message_bytes,
        producers: spec.producers,
        batch_messages: spec.batch_messages,
        max_inflight: spec.max_inflight,
        linger: spec.linger,
        warmup: spec.warmup,
        duration: spec.duration,
        rate_msgs_per_s: rate,
    }
}

fn unavailable(w: &Workload, system: &str, r: u32, rate: &str, reason: String) -> RunResult {
    RunResult {
        workload: w.name.clone(),
        system: system.into(),
        replication: r,
        available: false,
        reason: Some(reason),
        rate: rate.into(),
        message_bytes: w.message_bytes,
        ..RunResult::default()
    }
}

async fn run_produce_workload(
    args: &Args,
    work: &Path,
    wi: usize,
    w: &Workload,
    spec: &ProduceSpec,
    round: u32,
) -> anyhow::Result<Vec<RunResult>> {
    let mut out = Vec::new();
    let rates = rates(spec);
    // What each Silt replication factor sustained at max, for the group-commit server's rates.
    let mut silt_max: Vec<(u32, f64)> = Vec::new();

    // Silt: one server per replication factor (`silt dev --agents R`: R agents in one process,
    // each with its own data directory), a fresh topic for every run.
    for &r in &w.replication_factors {
        eprintln!("== {}: silt R={r}", w.name);
        let server =
            SiltServer::start(silt_bin_of(args), &work.join(format!("silt-{wi}-r{r}")), r, None).await?;
        let mut max: Option<f64> = None;
        for (ri, rate) in rates.iter().enumerate() {
            let topics: Vec<String> = match w.topics {
                1 => vec![format!("w{wi}-r{r}-{ri}")],
                n => (0..n).map(|t| format!("w{wi}-r{r}-{ri}-t{t}")).collect(),
            };
            let client = server.client()?;
            for topic in &topics {
                client
                    .create_topic(topic, w.partitions, &w.silt_topic_config(r))
                    .await
                    .with_context(|| format!("cannot create the Silt topic {topic}"))?;
            }
            let target_rate = target(rate, max);
            eprintln!("   silt R={r} {}", rate.label());
            let target: Arc<dyn ProduceTarget> = Arc::new(SiltProducer {
                client: client.clone(),
                topics: topics.clone(),
                partitions_per_topic: w.partitions,
            });
            let mark = ProcMark::start(&[server.pid()])?;
            let members = spec.consumers;
            let max_poll = spec.consume_max;
            let sampled = WindowUse::default();
            let (outcome, stats, _) = silt_bench::load::run(
                target,
                &plan(w, spec, target_rate),
                args.drain,
                |window, stats, stop| {
                    sample_window(&sampled, work, window);
                    let consumers = topics
                        .iter()
                        .flat_map(|topic| {
                            silt_bench::silt_system::start_consumers(
                                &client,
                                topic,
                                members,
                                max_poll,
                                window,
                                Arc::clone(&stats),
                                stop.clone(),
                            )
                        })
                        .collect();
                    async move { Ok(consumers) }
                },
            )
            .await?;
            let used = mark.finish()?;
            let machine = machine_use(&sampled).await;
            let res = result(w, "silt", r, rate, target_rate, spec, &outcome, &stats, used, machine, round);
            if matches!(rate, Rate::Max) {
                max = Some(sustained(&res));
                silt_max.push((r, sustained(&res)));
            }
            out.push(res);
            for topic in &topics {
                let _ = client.delete_topic(topic).await;
            }
        }
        tokio::task::spawn_blocking(move || server.stop()).await?;
    }

    // NATS JetStream: R servers for each replication factor.
    for &r in &w.replication_factors {
        let Some(bin) = &args.nats_server else {
            for rate in &rates {
                out.push(unavailable(
                    w,
                    "nats",
                    r,
                    &rate.label(),
                    "nats-server not given (--nats-server)".into(),
                ));
            }
            continue;
        };
        eprintln!("== {}: nats R={r}", w.name);
        let cluster = NatsCluster::start(bin, &work.join(format!("nats-{wi}-r{r}")), r).await?;
        let mut contexts = Vec::new();
        for _ in 0..spec.producers.min(4) {
            contexts.push(cluster.connect().await?);
        }
        let admin = cluster.connect().await?;
        let mut max: Option<f64> = None;
        for (ri, rate) in rates.iter().enumerate() {
            let topic = format!("w{wi}-r{r}-{ri}");
            silt_bench::nats_system::create_topic(&admin, &topic, w.total_partitions(), r).await?;
            let target_rate = target(rate, max);
            eprintln!("   nats R={r} {}", rate.label());
            let target: Arc<dyn ProduceTarget> = Arc::new(NatsProducer {
                contexts: contexts.clone(),
                topic: topic.clone(),
                next: AtomicUsize::new(0),
            });
            let mark = ProcMark::start(&cluster.pids())?;
            let (partitions, max_fetch) = (w.total_partitions(), spec.consume_max);
            let sampled = WindowUse::default();
            let (outcome, stats, _) = silt_bench::load::run(
                target,
                &plan(w, spec, target_rate),
                args.drain,
                |window, stats, stop| {
                    sample_window(&sampled, work, window);
                    let admin = admin.clone();
                    let topic = topic.clone();
                    async move {
                        silt_bench::nats_system::start_consumers(
                            &admin, &topic, partitions, r, max_fetch, window, stats, stop,
                        )
                        .await
                    }
                },
            )
            .await?;
            let used = mark.finish()?;
            let machine = machine_use(&sampled).await;
            let res = result(w, "nats", r, rate, target_rate, spec, &outcome, &stats, used, machine, round);
            if matches!(rate, Rate::Max) {
                max = Some(sustained(&res));
            }
            out.push(res);
            silt_bench::nats_system::delete_topic(&admin, &topic, w.total_partitions()).await;
        }
        drop(contexts);
        tokio::task::spawn_blocking(move || cluster.stop()).await?;
    }

    // The plain group-commit server: its own max, then Silt R=1's rates (so that latencies
    // compare at the same load), then the fixed rates. One copy, so one run whatever R.
    eprintln!("== {}: group commit", w.name);
    let bench_bin = std::env::current_exe().context("cannot find the silt-bench binary")?;
    let server = GroupCommitServer::start(&bench_bin, &work.join(format!("group-commit-{wi}")))?;
    let silt_r1_max = silt_max.iter().find(|(r, _)| *r == 1).map(|(_, m)| *m);
    let mut max: Option<f64> = None;
    for rate in &rates {
        let target_rate = match rate {
            Rate::Fraction(_) => target(rate, silt_r1_max.or(max)),
            _ => target(rate, max),
        };
        eprintln!("   group commit {}", rate.label());
        let target: Arc<dyn ProduceTarget> = Arc::new(server.producer(spec.producers).await?);
        let mark = ProcMark::start(&[server.pid()])?;
        let sampled = WindowUse::default();
        let (outcome, stats, _) =
            silt_bench::load::run(target, &plan(w, spec, target_rate), args.drain, |window, _, _| {
                sample_window(&sampled, work, window);
                async { Ok(Vec::new()) }
            })
            .await?;
        let used = mark.finish()?;
        let machine = machine_use(&sampled).await;
        let res = result(w, GROUP_COMMIT, 1, rate, target_rate, spec, &outcome, &stats, used, machine, round);
        if matches!(rate, Rate::Max) {
            max = Some(res.throughput_msgs_per_s.max(1.0));
        }
        out.push(res);
    }
    tokio::task::spawn_blocking(move || server.stop()).await?;
    Ok(out)
}

/// The plain group-commit server's name in the results.
const GROUP_COMMIT: &str = silt_bench::report::GROUP_COMMIT;

/// Machine-wide CPU and the disk's counters over one run's measured window, sampled by a task
/// of its own.
type WindowUse = Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<anyhow::Result<MachineUse>>>>>;

/// Starts sampling the machine over `window` (the disk is the one that holds `work`).
fn sample_window(slot: &WindowUse, work: &Path, window: silt_bench::load::Window) {
    let dir = work.to_path_buf();
    let task = tokio::spawn(async move {
        tokio::time::sleep_until(window.start.into()).await;
        let mark = MachineMark::start(&dir)?;
        tokio::time::sleep_until(window.end.into()).await;
        mark.finish()
    });
    if let Ok(mut slot) = slot.lock() {
        *slot = Some(task);
    }
}

/// What the sampler measured (none if it could not read `/proc`).
async fn machine_use(slot: &WindowUse) -> Option<MachineUse> {
    let task = slot.lock().ok()?.take()?;
    match task.await {
        Ok(Ok(used)) => Some(used),
        Ok(Err(e)) => {
            eprintln!("   cannot measure the machine: {e:#}");
            None
        }
        Err(_) => None,
    }
}

/// What a max run sustained end to end: the lower of the produce and consume rates.
fn sustained(r: &RunResult) -> f64 {
    r.throughput_msgs_per_s.min(r.consume_msgs_per_s).max(1.0)
}

fn target(rate: &Rate, max: Option<f64>) -> Option<f64> {
    match rate {
        Rate::Max => None,
        Rate::Fraction(f) => Some((max.unwrap_or(1000.0) * f).max(1.0)),
        Rate::Fixed(r) => Some(*r as f64),
    }
}

#[allow(clippy::too_many_arguments)]
fn result(
    w: &Workload,
    system: &str,
    r: u32,
    rate: &Rate,
    target_rate: Option<f64>,
    spec: &ProduceSpec,
    outcome: &silt_bench::load::ProduceOutcome,
    stats: &silt_bench::load::ConsumeStats,
    used: silt_bench::proc_stats::ProcUse,
    machine: Option<MachineUse>,
    round: u32,
) -> RunResult {
    let window_s = spec.duration.as_secs_f64();
    let msgs_per_s = outcome.acked_in_window as f64 / window_s;
    let samples: Vec<f64> = outcome.per_second_msgs.iter().map(|v| *v as f64).collect();
    let cv = silt_bench::report::coefficient_of_variation(&samples);
    let gb = (outcome.acked_total * w.message_bytes as u64) as f64 / 1e9;
    let window_gb = (outcome.acked_in_window * w.message_bytes as u64) as f64 / 1e9;
    let e2e = stats.end_to_end.lock().map(|h| h.summary()).unwrap_or_default();
    RunResult {
        workload: w.name.clone(),
        system: system.into(),
        replication: r,
        available: true,
        reason: None,
        rate: rate.label(),
        target_msgs_per_s: target_rate,
        message_bytes: w.message_bytes,
        throughput_msgs_per_s: msgs_per_s,
        throughput_mb_per_s: msgs_per_s * w.message_bytes as f64 / 1e6,
        consume_msgs_per_s: stats.received_in_window.load(Ordering::Relaxed) as f64 / window_s,
        per_second_msgs: outcome.per_second_msgs.clone(),
        throughput_cv: cv,
        produced_msgs: outcome.acked_total,
        consumed_msgs: stats.received.load(Ordering::Relaxed),
        produce_errors: outcome.errors,
        first_error: outcome.first_error.clone(),
        consume_errors: stats.errors.load(Ordering::Relaxed),
        produce_ack: outcome.produce_ack.summary(),
        end_to_end: e2e,
        server_cpu_s_per_gb: if gb > 0.0 { used.server_cpu_s / gb } else { 0.0 },
        client_cpu_s_per_gb: if gb > 0.0 { used.client_cpu_s / gb } else { 0.0 },
        server_peak_rss_mib: used.server_peak_rss_bytes as f64 / f64::from(1u32 << 20),
        round,
        server_cpu_cores: if used.elapsed_s > 0.0 { used.server_cpu_s / used.elapsed_s } else { 0.0 },
        machine_cpu_cores: machine.map(|m| m.cpu_s / m.elapsed_s),
        machine_cpu_s_per_gb: machine.filter(|_| window_gb > 0.0).map(|m| m.cpu_s / window_gb),
        disk_flushes_per_s: machine.and_then(|m| Some(m.disk_flushes? as f64 / m.elapsed_s)),
        disk_bytes_per_acked_byte: machine
            .filter(|_| window_gb > 0.0)
            .and_then(|m| Some(m.disk_bytes_written? as f64 / (window_gb * 1e9))),
    }
}

async fn run_replay_workload(
    args: &Args,
    work: &Path,
    wi: usize,
    w: &Workload,
) -> anyhow::Result<Vec<ReplayEntry>> {
    let Some(spec) = &w.replay else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for &r in &w.replication_factors {
        let mut stores = vec![(local_folder(), None)];
        if let Some(url) = &args.replay_s3 {
            stores.push((
                args.replay_s3_name.clone(),
                Some(format!("{}/w{wi}-r{r}", url.trim_end_matches('/'))),
            ));
        }
        for (store, url) in stores {
            eprintln!("== {}: silt R={r} ({} MiB, bucket: {store})", w.name, spec.total_mib);
            let dir = work.join(format!("silt-{wi}-r{r}"));
            let server = SiltServer::start(silt_bin_of(args), &dir, r, url.as_deref()).await?;
            let store_url = match &url {
                Some(u) => u.clone(),
                None => format!("file://{}", server.data_dir().join("objects").display()),
            };
            let res = silt_bench::replay::run(&server, w, spec, &format!("w{wi}-replay-r{r}"), r, &store_url)
                .await?;
            out.push(ReplayEntry {
                workload: w.name.clone(),
                system: "silt".into(),
                replication: r,
                available: true,
                reason: None,
                result: Some(res),
                store,
            });
            tokio::task::spawn_blocking(move || server.stop()).await?;
        }
    }
    for &r in &w.replication_factors {
        out.push(ReplayEntry {
            workload: w.name.clone(),
            system: "nats".into(),
            replication: r,
            available: false,
            reason: Some(
                "JetStream keeps streams on its servers' disks only; it has no object-store tier to \
                 replay from, so the limit (a plain GET of the same objects) is the comparison."
                    .into(),
            ),
            result: None,
            store: local_folder(),
        });
    }
    Ok(out)
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

fn machine(work: &Path, load_average: [f64; 2]) -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let mem_kib: f64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    let filesystem = std::process::Command::new("df")
        .arg("-T")
        .arg(work)
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let line = text.lines().nth(1)?.to_string();
            let cols: Vec<&str> = line.split_whitespace().collect();
            Some(format!("{} {}", cols.first()?, cols.get(1)?))
        })
        .unwrap_or_default();
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gib: mem_kib / 1024.0 / 1024.0,
        cpu,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        filesystem,
        load_average,
    }
}

/// The `silt` binary; clap requires it whenever the tool runs anything.
fn silt_bin_of(args: &Args) -> &Path {
    args.silt_bin.as_deref().unwrap_or_else(|| Path::new("silt"))
}
