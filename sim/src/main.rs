//! `silt-sim`: the whole Silt cluster in one deterministic process (a metadata node, or a Raft
//! cluster of three or five, and three agents, each a simulated host with its own runtime and
//! disk), run under a fault schedule
//! drawn from a seed, with a checker over everything its clients saw. The same seed gives the
//! same run, byte for byte: time is simulated (turmoil), the process's randomness and clocks
//! come from the seed (`overrides`), blocking work runs inline, and each seed runs in a process
//! of its own.

mod faults;
mod overrides;
mod workload;
mod world;

use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use silt_agent::sim_bugs::Bug;

use crate::faults::Schedule;
use crate::world::World;
use silt_sim::check;
use silt_sim::history::{History, Ms};

/// Runs Silt's cluster under seeded fault schedules and checks what its clients saw.
///
/// Every seed draws a fault schedule (crashes with power loss, torn writes, one-way and
/// two-way link cuts, lost replies, isolated agents, fsync and write errors, clock steps;
/// errors from the bucket with --archive; metadata nodes killed or cut off with
/// --metadata-nodes 3), runs a workload of producers and readers through it, heals every
/// fault, reads every partition to its end and checks the history: no acknowledged message
/// lost, no offset with two messages, no read of anything later undone, no high watermark
/// going back (and, with --metadata-nodes 3, metadata's reads and writes linearizable).
#[derive(Debug, Parser)]
#[command(name = "silt-sim", version)]
struct Args {
    /// Runs the seeds START..END (END excluded), each in a process of its own; prints one
    /// line per failing seed with the first property it violated, then `N seeds, F failed`.
    #[arg(long, value_name = "START..END", value_parser = parse_range, conflicts_with = "seed")]
    seeds: Option<Range<u64>>,
    /// Runs one seed and prints its verdict.
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// With --seed: prints the fault schedule, the agents' logs and the history too.
    #[arg(long, requires = "seed")]
    trace: bool,
    /// Turns on a deliberate defect, to see the checker catch it: ack-before-quorum,
    /// skip-fence, trim-without-epoch-check, reuse-offset-after-crash, serve-past-watermark,
    /// checkpoint-in-flight (with --groups), stale-metadata-read and raft-ack-before-fsync
    /// (with --metadata-nodes 3).
    #[arg(long, value_name = "NAME", value_parser = parse_bug)]
    bug: Option<String>,
    /// Also replaces the disk of a writer that lost power (at most one per run). Off by
    /// default, so that a seed draws the same schedule as before it existed; scripts/test.sh
    /// runs a short schedule with it (see docs/reliability.md).
    #[arg(long)]
    disk_loss: bool,
    /// Also runs two consumer groups (one exclusive, one shared; two members each) that poll
    /// and acknowledge through random agents, and checks what they were delivered and what
    /// metadata checkpointed. Off by default, so that a seed runs as before it existed;
    /// scripts/test.sh runs a short schedule with it.
    #[arg(long)]
    groups: bool,
    /// Also gives every agent the archive: a bucket (in memory, outliving every crash) its
    /// compactor writes sealed segments to and its reads of archived offsets come from, with
    /// windows of errors from the bucket; segments roll every 4 KiB or second and agents drop
    /// archived ones at once, so that most reads go to the bucket. After the run every object
    /// in the bucket is read directly and checked against the log. Off by default, so that a
    /// seed runs as before it existed; scripts/test.sh runs a short schedule with it.
    #[arg(long)]
    archive: bool,
    /// Also deletes the topic and creates it again once during the faults (with --archive,
    /// while its segments are being archived), the other clients held back meanwhile, and
    /// checks that nothing of the deleted topic comes back in the new one. Off by default, so
    /// that a seed runs as before it existed.
    #[arg(long, conflicts_with = "groups")]
    recreate: bool,
    /// How many metadata nodes run: 1 (a cluster of one, as `silt dev`'s) or 3 or 5, one Raft
    /// cluster over a simulated network, under faults of their own (kill -9 or power loss of
    /// any node and of the leader, isolated nodes, links between nodes cut, losing their
    /// answers or slow, and once in a while the whole cluster, agents and metadata, losing
    /// power at once), with agents paused (SIGSTOP, a long GC: nothing they send or are sent
    /// moves until they resume), most longer than a lease. 1 by default, so that a seed runs
    /// as before these existed; the cluster as deployed is 3.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_metadata_nodes)]
    metadata_nodes: u64,
    /// With --seeds: how many seeds run at once.
    #[arg(long, short = 'j', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
    /// With --seeds: stops at the first failing seed.
    #[arg(long)]
    stop_at_first: bool,
}

fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("'{s}' is not START..END"))?;
    let a: u64 = a.parse().map_err(|_| format!("'{a}' is not a whole number"))?;
    let b: u64 = b.parse().map_err(|_| format!("'{b}' is not a whole number"))?;
    if a >= b {
        return Err(format!("'{s}' holds no seed: END must be above START"));
    }
    Ok(a..b)
}

fn parse_metadata_nodes(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!("'{s}' metadata nodes: give 1, 3 or 5 (a Raft cluster of an odd size)")),
    }
}

fn parse_bug(s: &str) -> Result<String, String> {
    match Bug::named(s) {
        Some(_) => Ok(s.to_string()),
        None => {
            let names: Vec<&str> = Bug::ALL.iter().map(|(_, n)| *n).collect();
            Err(format!("no defect is named '{s}'; the defects are {}", names.join(", ")))
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match (&args.seeds, args.seed) {
        (Some(seeds), _) => run_seeds(&args, seeds.clone()),
        (None, Some(seed)) => run_one(seed, args.bug.as_deref(), args.trace, args.options()),
        (None, None) => {
            eprintln!("silt-sim: give --seeds START..END or --seed S (see --help)");
            ExitCode::from(2)
        }
    }
}

/// How long the faults go on, in simulated time.
const FAULT_PHASE: Ms = 30_000;
/// The simulation's step.
const TICK: Duration = Duration::from_millis(1);

/// Runs one seed in this process and prints its verdict (and, with `trace`, all of it).
/// What a run includes beyond the default schedule and workload.
#[derive(Debug, Clone, Copy)]
struct Options {
    disk_loss: bool,
    groups: bool,
    archive: bool,
    recreate: bool,
    metadata_nodes: u64,
}

impl Args {
    fn options(&self) -> Options {
        Options {
            disk_loss: self.disk_loss,
            groups: self.groups,
            archive: self.archive,
            recreate: self.recreate,
            metadata_nodes: self.metadata_nodes,
        }
    }
}

fn run_one(seed: u64, bug: Option<&str>, trace: bool, options: Options) -> ExitCode {
    silt_metadata::runtime::run_blocking_inline();
    if let Some(bug) = bug.and_then(Bug::named) {
        silt_agent::sim_bugs::enable(bug);
    }
    init_logs(trace);
    let dir = match work_dir(seed) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("silt-sim: cannot make a directory for seed {seed}: {e}");
            return ExitCode::from(2);
        }
    };
    // A thread of its own, whose randomness and clocks are the simulation's from its start
    // (std draws a thread's HashMap keys at its first HashMap).
    let run = std::thread::spawn(move || {
        overrides::enter(seed);
        simulate(seed, trace, options)
    });
    let outcome = run.join();
    let _ = std::env::set_current_dir("/");
    let _ = std::fs::remove_dir_all(&dir);
    let verdict = match outcome {
        Ok(Ok(history)) => check::check(&history).map_err(|v| format!("{}: {}", v.property, v.detail)),
        Ok(Err(e)) => Err(format!("simulation-failed: {e:#}")),
        Err(_) => Err("simulation-failed: it panicked (see above)".to_string()),
    };
    match verdict {
        Ok(()) => {
            println!("seed {seed}: ok");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("seed {seed}: failed: {why}");
            ExitCode::FAILURE
        }
    }
}

/// A directory for the seed's files, the working directory from now on: on tmpfs where there
/// is one (the simulated disks record what an fsync covers; the real fsyncs need not be slow),
/// and paths in the logs relative to it, the same in every run.
fn work_dir(seed: u64) -> std::io::Result<std::path::PathBuf> {
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let dir = base.join(format!("silt-sim-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::env::set_current_dir(&dir)?;
    Ok(dir)
}

/// The agents' logs, stamped with simulated time: to stdout with `trace`, else nowhere (set up
/// alike either way, so that a traced run is the same run).
fn init_logs(trace: bool) {
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            write!(w, "{:>7}", workload::now())
        }
    }
    let filter = tracing_subscriber::EnvFilter::new("info,openraft=warn");
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_timer(SimTime).with_ansi(false);
    if trace {
        builder.with_writer(std::io::stdout).init();
    } else {
        builder.with_writer(std::io::sink).init();
    }
}

/// The run of one seed: the cluster, the clients and the schedule, until the clients are done.
fn simulate(seed: u64, trace: bool, options: Options) -> anyhow::Result<History> {
    let world = World::new(seed, 3, options.metadata_nodes, options.archive);
    let schedule = Schedule::draw(seed, &world, FAULT_PHASE, options.disk_loss, options.archive);
    if trace {
        println!("schedule of seed {seed}:");
        for (at, fault) in &schedule.events {
            println!("{at:>7} {fault}");
        }
    }
    let history = Arc::new(Mutex::new(History::default()));
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(3_600))
        .build();
    for (id, host) in world.metadata_nodes.clone() {
        let w = Arc::clone(&world);
        sim.host(host.as_str(), move || Arc::clone(&w).run_metadata(id));
    }
    for id in world.agents.clone() {
        let (w, host) = (Arc::clone(&world), id.clone());
        sim.host(host.as_str(), move || Arc::clone(&w).run_agent(id.clone()));
    }
    let clients =
        workload::Clients::new(Arc::clone(&world), Arc::clone(&history), options.groups, options.recreate);
    sim.client("clients", Arc::clone(&clients).run(seed, FAULT_PHASE));
    let mut pending = schedule.events.into_iter().peekable();
    let mut healed = false;
    loop {
        let at = sim.elapsed().as_millis() as Ms;
        while let Some((_, fault)) = pending.next_if(|(t, _)| *t <= at) {
            if trace {
                println!("{at:>7} fault: {fault}");
            }
            faults::apply(&fault, &world, &mut sim)?;
        }
        if !healed && at >= FAULT_PHASE {
            healed = true;
            for fault in faults::heal_all(&world) {
                faults::apply(&fault, &world, &mut sim)?;
            }
            if trace {
                println!("{at:>7} fault: every fault healed");
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => anyhow::bail!("{e}"),
        }
    }
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    if trace {
        println!("history of seed {seed} (start, end ms):");
        for e in &history.events {
            println!("{e}");
        }
    }
    Ok(history)
}

/// Runs `seeds`, each as `silt-sim --seed S` in a process of its own, `jobs` at a time.
fn run_seeds(args: &Args, seeds: Range<u64>) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("silt-sim: cannot find its own executable: {e}");
            return ExitCode::from(2);
        }
    };
    let next = AtomicU64::new(seeds.start);
    let (failed, ran) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for _ in 0..args.jobs {
            s.spawn(|| loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= seeds.end {
                    return;
                }
                let verdict = run_child(&exe, seed, args.bug.as_deref(), args.options());
                ran.fetch_add(1, Ordering::SeqCst);
                if let Err(line) = verdict {
                    failed.fetch_add(1, Ordering::SeqCst);
                    let mut out = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                    if args.stop_at_first {
                        stop.store(true, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    let (ran, failed) = (ran.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("{ran} seeds, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How long one seed may run, in wall time, before it is taken for a livelock (a task that
/// loops without letting simulated time pass) and killed. A seed takes a few seconds.
const SEED_WALL_LIMIT: Duration = Duration::from_secs(600);

/// The output of `child` once it exits, or `None` (it is killed) if it runs longer than `limit`.
fn wait_with_limit(
    mut child: std::process::Child,
    limit: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() >= limit {
            child.kill()?;
            child.wait()?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    Ok(status.map(|status| std::process::Output { status, stdout, stderr }))
}

/// One seed in a child process: `Err` with its verdict line when it failed.
fn run_child(exe: &std::path::Path, seed: u64, bug: Option<&str>, options: Options) -> Result<(), String> {
    let mut cmd = Command::new(exe);
    cmd.arg("--seed").arg(seed.to_string()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(bug) = bug {
        cmd.arg("--bug").arg(bug);
    }
    if options.disk_loss {
        cmd.arg("--disk-loss");
    }
    if options.groups {
        cmd.arg("--groups");
    }
    if options.archive {
        cmd.arg("--archive");
    }
    if options.recreate {
        cmd.arg("--recreate");
    }
    if options.metadata_nodes != 1 {
        cmd.arg("--metadata-nodes").arg(options.metadata_nodes.to_string());
    }
    let child =
        cmd.spawn().map_err(|e| format!("seed {seed}: failed: simulation-failed: cannot start it: {e}"))?;
    let output = wait_with_limit(child, SEED_WALL_LIMIT)
        .map_err(|e| format!("seed {seed}: failed: simulation-failed: {e}"))?
        .ok_or_else(|| {
            format!(
                "seed {seed}: failed: simulation-failed: no verdict within {SEED_WALL_LIMIT:?} of wall time \
                 (simulated time stopped moving: replay it with --seed {seed} --trace)"
            )
        })?;
    let stdout = BufReader::new(&output.stdout[..]);
    let verdict = stdout.lines().map_while(Result::ok).find(|l| l.starts_with(&format!("seed {seed}: ")));
    match verdict {
        Some(line) if output.status.success() && line.ends_with(": ok") => Ok(()),
        Some(line) => Err(line),
        None => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            Err(format!("seed {seed}: failed: simulation-failed: it ended with {} ({last})", output.status))
        }
    }
}
