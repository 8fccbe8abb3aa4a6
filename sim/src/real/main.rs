//! `silt-faults`: three `silt metadata` and three `silt agent` processes, each in its own network
//! namespace, under real faults drawn from a seed (nftables drops, one way or both, SIGKILL,
//! SIGSTOP, wall clock steps, a full disk, slow fsyncs), while real clients produce and read
//! through the agents' HTTP API; then every fault is healed, every partition read to its end,
//! and the history judged by the checker `silt-sim` uses.

mod net;
mod node;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt::client::{Client, OutMessage};
use silt_metadata::{MetadataClient, MetadataClientOptions, MetadataError};
use silt_sim::check;
use silt_sim::history::{Event, History, Ms, Op, Seen};
use silt_sim::register;

use crate::net::Net;
use crate::node::{Disk, Node};

/// Runs Silt's real processes under real faults and checks what its clients saw.
///
/// Starts three metadata nodes and three agents (lease 2 s, a topic of 2 partitions with
/// replication.factor 3), each process in its own network namespace on a bridge, and for the
/// given time lets producers and readers run while faults drawn from the seed come and go, up to
/// two at once: packets between two nodes dropped (one way or both), an agent cut off from
/// metadata, a node cut off from every other, kill -9 and a restart, SIGSTOP for up to 8 s, an
/// agent's wall clock stepped by up to an hour, an agent's disk (a 256 MiB tmpfs) filled up, an
/// agent's every fsync delayed by 20 ms to 1 s. Then it heals every fault, reads every partition
/// to its end and checks the history: no acknowledged message lost, no offset with two
/// messages, no read of anything later undone, no high watermark going back. Prints the
/// verdict; the history, the faults and each process's log stay in --dir. Needs root,
/// iproute2, nftables, Debian's faketime package (for clock steps) and `libsilt_slow_fsync.so`
/// beside `silt` (for slow disks; `cargo build -p silt-slow-fsync`).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How long the faults go on, in minutes (fractions allowed).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// The seed the faults and the workload are drawn from (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The `silt` binary to run (default: the one next to this binary).
    #[arg(long)]
    silt: Option<PathBuf>,
    /// Where the processes keep their data and logs, and the history goes (default: a new
    /// directory under the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

const TOPIC: &str = "events";
const PARTITIONS: u32 = 2;
const PRODUCERS: usize = 3;
const READERS: usize = 2;
const METADATA: [&str; 3] = ["m1", "m2", "m3"];
const AGENTS: [&str; 3] = ["a1", "a2", "a3"];
const METADATA_PORT: u16 = 7100;
const AGENT_PORT: u16 = 7200;
/// The size of the tmpfs each agent keeps its data on.
const AGENT_DISK_MIB: u64 = 256;
/// How long the clients keep trying to read every partition to its end after the faults.
const RECOVERY: Duration = Duration::from_secs(120);
/// A client request that takes longer fails (and is recorded as failed: it may or may not have
/// been done).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if !(args.minutes > 0.0 && args.minutes <= 24.0 * 60.0) {
        eprintln!("error: --minutes must be above 0 and at most 1440, not {}", args.minutes);
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The cluster's processes and network, shared by the fault loops.
struct Cluster {
    net: Net,
    nodes: BTreeMap<String, Node>,
    /// Each agent's clock offset in seconds: the sum of the steps in effect (two faults may
    /// step one clock at once).
    clock_offsets: BTreeMap<String, i64>,
}

/// One fault, applied at once and healed by [`heal`].
#[derive(Debug, Clone)]
enum Fault {
    /// Packets from `from` to `to` dropped (and back, with `both`).
    Drop { from: String, to: String, both: bool },
    /// An agent's packets to and from every metadata node dropped.
    CutFromMetadata { agent: String },
    /// A node's packets to and from every other node dropped (the harness still reaches it).
    Isolate { node: String },
    /// kill -9, started again when healed.
    Kill { node: String },
    /// SIGSTOP, SIGCONT when healed.
    Freeze { node: String },
    /// An agent's wall clock moved by `seconds`, back when healed.
    StepClock { agent: String, seconds: i64 },
    /// An agent's disk filled up: every write to it fails with ENOSPC until healed.
    FillDisk { agent: String },
    /// Every fsync of an agent's process delayed by `delay_ms` until healed.
    SlowDisk { agent: String, delay_ms: u64 },
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Drop { from, to, both: false } => write!(f, "drop packets {from} -> {to}"),
            Fault::Drop { from, to, both: true } => write!(f, "drop packets {from} <-> {to}"),
            Fault::CutFromMetadata { agent } => write!(f, "cut {agent} off from metadata"),
            Fault::Isolate { node } => write!(f, "isolate {node}"),
            Fault::Kill { node } => write!(f, "kill -9 {node}"),
            Fault::Freeze { node } => write!(f, "SIGSTOP {node}"),
            Fault::StepClock { agent, seconds } => write!(f, "step the clock of {agent} by {seconds:+} s"),
            Fault::FillDisk { agent } => write!(f, "fill the disk of {agent}"),
            Fault::SlowDisk { agent, delay_ms } => write!(f, "delay every fsync of {agent} by {delay_ms} ms"),
        }
    }
}

fn all_nodes() -> Vec<String> {
    METADATA.iter().chain(AGENTS.iter()).map(|s| s.to_string()).collect()
}

fn draw(rng: &mut StdRng) -> Fault {
    let nodes = all_nodes();
    let node = |rng: &mut StdRng| nodes[rng.random_range(0..nodes.len())].clone();
    let agent = |rng: &mut StdRng| AGENTS[rng.random_range(0..AGENTS.len())].to_string();
    match rng.random_range(0..9) {
        0 | 1 => {
            let from = node(rng);
            let mut to = node(rng);
            while to == from {
                to = node(rng);
            }
            Fault::Drop { from, to, both: rng.random_bool(0.5) }
        }
        2 => Fault::CutFromMetadata { agent: agent(rng) },
        3 => Fault::Isolate { node: node(rng) },
        4 => Fault::Kill { node: node(rng) },
        5 => Fault::Freeze { node: node(rng) },
        6 => {
            let seconds = rng.random_range(1..=3600) * if rng.random_bool(0.5) { 1 } else { -1 };
            Fault::StepClock { agent: agent(rng), seconds }
        }
        7 => Fault::FillDisk { agent: agent(rng) },
        _ => Fault::SlowDisk { agent: agent(rng), delay_ms: [20, 200, 1000][rng.random_range(0..3)] },
    }
}

/// Applies `fault`; false when it does not apply now (the node is down, say).
fn apply(cluster: &mut Cluster, fault: &Fault) -> anyhow::Result<bool> {
    match fault {
        Fault::Drop { from, to, both } => {
            cluster.net.drop_packets(from, to)?;
            if *both {
                cluster.net.drop_packets(to, from)?;
            }
        }
        Fault::CutFromMetadata { agent } => {
            for m in METADATA {
                cluster.net.drop_packets(agent, m)?;
                cluster.net.drop_packets(m, agent)?;
            }
        }
        Fault::Isolate { node } => {
            for other in all_nodes().iter().filter(|o| *o != node) {
                cluster.net.drop_packets(node, other)?;
                cluster.net.drop_packets(other, node)?;
            }
        }
        Fault::Kill { node } => {
            let n = cluster.nodes.get_mut(node).context("no such node")?;
            if !n.is_up() || n.is_frozen() {
                return Ok(false);
            }
            n.kill9();
        }
        Fault::Freeze { node } => {
            let n = cluster.nodes.get_mut(node).context("no such node")?;
            if !n.is_up() || n.is_frozen() {
                return Ok(false);
            }
            n.freeze(true)?;
        }
        Fault::StepClock { agent, seconds } => {
            if !cluster.nodes.get(agent).is_some_and(Node::has_fake_clock) {
                return Ok(false);
            }
            let offset = cluster.clock_offsets.entry(agent.clone()).or_default();
            *offset += seconds;
            let offset = *offset;
            cluster.nodes[agent].step_clock(offset)?;
        }
        Fault::FillDisk { agent } => {
            let Some(disk) = cluster.nodes.get(agent).and_then(Node::disk) else { return Ok(false) };
            if disk.is_full() {
                return Ok(false);
            }
            disk.fill()?;
        }
        Fault::SlowDisk { agent, delay_ms } => {
            let n = cluster.nodes.get_mut(agent).context("no such node")?;
            if n.is_slowed() {
                return Ok(false);
            }
            // A process started again meanwhile is slowed too: the file outlives it.
            return n.slow_disk(Some(*delay_ms));
        }
    }
    Ok(true)
}

/// Undoes `fault` (the drops it added, the process it stopped).
fn heal(cluster: &mut Cluster, fault: &Fault) -> anyhow::Result<()> {
    match fault {
        Fault::Drop { from, to, both } => {
            cluster.net.pass_packets(from, to)?;
            if *both {
                cluster.net.pass_packets(to, from)?;
            }
        }
        Fault::CutFromMetadata { agent } => {
            for m in METADATA {
                cluster.net.pass_packets(agent, m)?;
                cluster.net.pass_packets(m, agent)?;
            }
        }
        Fault::Isolate { node } => {
            for other in all_nodes().iter().filter(|o| *o != node) {
                cluster.net.pass_packets(node, other)?;
                cluster.net.pass_packets(other, node)?;
            }
        }
        Fault::Kill { node } => {
            let n = cluster.nodes.get_mut(node).context("no such node")?;
            if !n.is_up() {
                n.start()?;
            }
        }
        Fault::Freeze { node } => cluster.nodes.get_mut(node).context("no such node")?.freeze(false)?,
        Fault::StepClock { agent, seconds } => {
            let offset = cluster.clock_offsets.entry(agent.clone()).or_default();
            *offset -= seconds;
            let offset = *offset;
            if let Some(node) = cluster.nodes.get(agent) {
                node.step_clock(offset)?;
            }
        }
        Fault::FillDisk { agent } => {
            if let Some(disk) = cluster.nodes.get(agent).and_then(Node::disk) {
                disk.free()?;
            }
        }
        Fault::SlowDisk { agent, .. } => {
            cluster.nodes.get_mut(agent).context("no such node")?.slow_disk(None)?;
        }
    }
    Ok(())
}

/// Every fault healed: every packet passes, every process runs on its real clock.
fn heal_all(cluster: &mut Cluster) -> anyhow::Result<()> {
    cluster.net.heal()?;
    cluster.clock_offsets.clear();
    for n in cluster.nodes.values_mut() {
        n.slow_disk(None)?;
        if let Some(disk) = n.disk() {
            disk.free()?;
        }
        if n.is_frozen() {
            n.freeze(false)?;
        }
        if !n.is_up() {
            n.start()?;
        }
        n.step_clock(0)?;
    }
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    });
    let silt = match args.silt {
        Some(s) => s,
        None => std::env::current_exe()?.with_file_name("silt"),
    };
    if !silt.exists() {
        bail!("no silt binary at {} (build it with `cargo build -p silt`, or give --silt)", silt.display());
    }
    let dir = match args.dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("silt-faults-{seed}")),
    };
    if dir.exists() {
        // Only what an earlier run left is cleared: anything else is refused.
        let earlier = dir.join("history.txt").exists() || dir.join("m1.log").exists();
        let empty = std::fs::read_dir(&dir)?.next().is_none();
        if !earlier && !empty {
            bail!("{} exists and holds no earlier run of silt-faults: give another --dir", dir.display());
        }
        // An interrupted run may have left its agents' disks mounted.
        for a in AGENTS {
            let _ = net::run("umount", &["-l", &dir.join(format!("{a}-disk")).display().to_string()]);
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    // The processes are given absolute paths (the bucket is a file:// URL).
    let dir = dir.canonicalize()?;
    println!("silt-faults: seed {seed}, {} minutes, files in {}", args.minutes, dir.display());

    let names = all_nodes();
    let net = Net::create(&names.iter().map(String::as_str).collect::<Vec<_>>())?;
    let cluster =
        Arc::new(Mutex::new(Cluster { net, nodes: BTreeMap::new(), clock_offsets: BTreeMap::new() }));
    // Interrupted (SIGINT, SIGTERM), it still stops every process and removes every namespace
    // it made.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = exercise(&cluster, &silt, &dir, seed, args.minutes) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
    };
    let mut c = lock(&cluster);
    c.nodes.clear();
    c.net.destroy();
    outcome
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn exercise(
    cluster: &Arc<Mutex<Cluster>>,
    silt: &Path,
    dir: &Path,
    seed: u64,
    minutes: f64,
) -> anyhow::Result<bool> {
    let agent_urls: Vec<String>;
    let metadata_addrs: Vec<String>;
    {
        let mut c = lock(cluster);
        let peers: Vec<String> = METADATA
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{}={}:{METADATA_PORT}", i + 1, c.net.ip(m)))
            .collect();
        metadata_addrs = METADATA.iter().map(|m| format!("{}:{METADATA_PORT}", c.net.ip(m))).collect();
        let bucket = dir.join("bucket");
        std::fs::create_dir_all(&bucket)?;
        for (i, m) in METADATA.iter().enumerate() {
            let mut args = vec![
                "metadata".to_string(),
                "--id".into(),
                (i + 1).to_string(),
                "--listen".into(),
                format!("{}:{METADATA_PORT}", c.net.ip(m)),
                "--data-dir".into(),
                dir.join(m).display().to_string(),
                "--peers".into(),
                peers.join(","),
            ];
            if i == 0 {
                args.push("--init".into());
            }
            let mut node = Node::new(m, silt, args, dir, false)?;
            node.start()?;
            c.nodes.insert(m.to_string(), node);
        }
        // Beside silt, as cargo builds it (`cargo build -p silt-slow-fsync`).
        let slow_fsync = Some(silt.with_file_name("libsilt_slow_fsync.so")).filter(|l| l.exists());
        for a in AGENTS {
            let disk = Disk::mount(&dir.join(format!("{a}-disk")), AGENT_DISK_MIB)?;
            let addr = format!("{}:{AGENT_PORT}", c.net.ip(a));
            let args = vec![
                "agent".to_string(),
                "--id".into(),
                a.into(),
                "--listen".into(),
                addr,
                "--metadata".into(),
                metadata_addrs.join(","),
                "--data-dir".into(),
                disk.data_dir().display().to_string(),
                "--object-store".into(),
                format!("file://{}", bucket.display()),
                "--lease".into(),
                "2s".into(),
            ];
            let mut node =
                Node::new(a, silt, args, dir, true)?.with_disk(disk, slow_fsync.as_deref(), dir)?;
            node.start()?;
            c.nodes.insert(a.to_string(), node);
        }
        agent_urls = AGENTS.iter().map(|a| format!("http://{}:{AGENT_PORT}", c.net.ip(a))).collect();
    }
    if !lock(cluster).nodes.values().any(Node::has_fake_clock) {
        println!("silt-faults: libfaketime not found (Debian's faketime package): no clock steps");
    }
    if !lock(cluster).nodes.values().any(Node::has_slow_disk) {
        println!("silt-faults: no libsilt_slow_fsync.so beside silt (cargo build -p silt-slow-fsync): no slow disks");
    }
    let clients = Arc::new(Clients::new(&agent_urls, metadata_addrs)?);
    clients.create_topic(cluster).await?;
    println!("silt-faults: cluster up, topic created; faults for {minutes} minutes");

    let phase = Duration::from_secs_f64(minutes * 60.0);
    let phase_end = clients.now() + phase.as_millis() as Ms;
    let faults_log = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for p in 0..PRODUCERS {
        let (clients, seed) = (Arc::clone(&clients), rng.random());
        tasks.push(tokio::spawn(async move { clients.produce(p, seed, phase_end).await }));
    }
    for _ in 0..READERS {
        let (clients, seed) = (Arc::clone(&clients), rng.random());
        tasks.push(tokio::spawn(async move { clients.read(seed, phase_end).await }));
    }
    let mut apart = StdRng::seed_from_u64(seed ^ 0x3E61_57E2);
    for client in 0..register::CLIENTS {
        let (clients, seed) = (Arc::clone(&clients), apart.random());
        tasks.push(tokio::spawn(async move { clients.register(client, seed, phase_end).await }));
    }
    // Two fault loops: up to two faults at once.
    let mut fault_tasks = Vec::new();
    for _ in 0..2 {
        let (cluster, clients, log, seed) =
            (Arc::clone(cluster), Arc::clone(&clients), Arc::clone(&faults_log), rng.random::<u64>());
        fault_tasks.push(tokio::spawn(async move { faults(cluster, clients, log, seed, phase_end).await }));
    }
    // A fault loop that fails (an nft or signal that did not take) ends the run: every other
    // task is stopped before the cluster goes.
    let mut failed = None;
    for t in &mut fault_tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(e),
            Err(e) => failed = Some(e.into()),
        }
        if failed.is_some() {
            break;
        }
    }
    if let Some(e) = failed {
        fault_tasks.iter().for_each(tokio::task::JoinHandle::abort);
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
        return Err(e.context("a fault could not be applied or healed"));
    }
    for t in tasks {
        t.await?;
    }
    // Every fault loop has healed its faults: a process down now exited on its own.
    let exited: Vec<String> = lock(cluster)
        .nodes
        .values_mut()
        .filter_map(|n| {
            (!n.is_up())
                .then(|| format!("--- {} exited on its own; its log ends:\n{}", n.name, n.log_tail(30)))
        })
        .collect();
    heal_all(&mut lock(cluster))?;
    lock(&faults_log).push(format!("{:>8} heal every fault", clients.now()));
    println!("silt-faults: faults healed; reading every partition to its end");
    for partition in 0..PARTITIONS {
        clients.read_to_end(partition).await;
    }

    let history = std::mem::take(&mut *lock(&clients.history));
    let mut text = String::new();
    for line in lock(&faults_log).iter() {
        text.push_str(line);
        text.push('\n');
    }
    for e in &history.events {
        text.push_str(&format!("{e}\n"));
    }
    std::fs::write(dir.join("history.txt"), text)?;
    let (mut produced, mut acked, mut reads, mut register) = (0, 0, 0, 0);
    for e in &history.events {
        match &e.op {
            Op::Produce { result, .. } => {
                produced += 1;
                acked += usize::from(result.is_ok());
            }
            Op::Read { .. } => reads += 1,
            Op::RegisterWrite { .. } | Op::RegisterRead { .. } => register += 1,
            _ => {}
        }
    }
    let faults = lock(&faults_log).len();
    println!(
        "silt-faults: {produced} produces ({acked} acknowledged), {reads} reads, {register} operations on the register in metadata, {faults} fault events; history in {}",
        dir.join("history.txt").display()
    );
    let verdict = match exited.is_empty() {
        true => check::check(&history),
        false => Err(check::Violation { property: "process-exited", detail: exited.join("\n") }),
    };
    match verdict {
        Ok(()) => {
            println!("seed {seed}: ok");
            Ok(true)
        }
        Err(v) => {
            println!("faults of the run (ms since the start):");
            for line in lock(&faults_log).iter() {
                println!("{line}");
            }
            println!("seed {seed}: failed: {}: {}", v.property, v.detail);
            Ok(false)
        }
    }
}

/// One fault loop: a fault every 1 - 6 s, lasting 1 - 8 s, until `phase_end`.
async fn faults(
    cluster: Arc<Mutex<Cluster>>,
    clients: Arc<Clients>,
    log: Arc<Mutex<Vec<String>>>,
    seed: u64,
    phase_end: Ms,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=6_000))).await;
        let lasts = Duration::from_millis(rng.random_range(1_000..=8_000));
        if clients.now() + lasts.as_millis() as Ms >= phase_end {
            return Ok(());
        }
        let fault = draw(&mut rng);
        let applied = apply(&mut lock(&cluster), &fault)?;
        if !applied {
            continue;
        }
        lock(&log).push(format!("{:>8} {fault}", clients.now()));
        tokio::time::sleep(lasts).await;
        heal(&mut lock(&cluster), &fault)?;
        lock(&log).push(format!("{:>8} end of: {fault}", clients.now()));
    }
}

/// The clients: producers and readers through random agents, each operation recorded.
struct Clients {
    agents: Vec<(String, Client)>,
    /// The metadata nodes' addresses (`host:port`).
    metadata: Vec<String>,
    started: Instant,
    history: Mutex<History>,
    /// The highest offset acknowledged per partition, for readers to aim at.
    acked_end: Mutex<BTreeMap<u32, u64>>,
}

impl Clients {
    fn new(urls: &[String], metadata: Vec<String>) -> anyhow::Result<Clients> {
        let agents = AGENTS
            .iter()
            .zip(urls)
            .map(|(name, url)| Ok((name.to_string(), Client::with_timeout(url, REQUEST_TIMEOUT)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Clients {
            agents,
            metadata,
            started: Instant::now(),
            history: Mutex::default(),
            acked_end: Mutex::default(),
        })
    }

    fn now(&self) -> Ms {
        self.started.elapsed().as_millis() as Ms
    }

    fn record(&self, start: Ms, op: Op) {
        lock(&self.history).events.push(Event { start, end: self.now(), op });
    }

    fn pick(&self, rng: &mut StdRng) -> &(String, Client) {
        &self.agents[rng.random_range(0..self.agents.len())]
    }

    /// Creates the topic through any agent, within a minute.
    async fn create_topic(&self, cluster: &Mutex<Cluster>) -> anyhow::Result<()> {
        let config = BTreeMap::from([("replication.factor".to_string(), "3".to_string())]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            for (_, client) in &self.agents {
                match client.create_topic(TOPIC, PARTITIONS, &config).await {
                    Ok(_) => return Ok(()),
                    Err(silt::client::ClientError::Api { code, .. }) if code == "topic_exists" => {
                        return Ok(())
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let c = lock(cluster);
        let logs: Vec<String> =
            c.nodes.values().map(|n| format!("--- {}:\n{}", n.name, n.log_tail(20))).collect();
        bail!("the cluster did not take the topic within 60 s: {last}\n{}", logs.join("\n"))
    }

    /// Writes unique values to the register and reads it (linearizable reads of the whole
    /// state) through a client of the metadata cluster of its own, until `phase_end`. The
    /// first client creates the register's topic through the agents; the others wait until a
    /// read finds it.
    async fn register(self: Arc<Clients>, client: u64, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        let options = MetadataClientOptions { timeout: REQUEST_TIMEOUT, ..MetadataClientOptions::default() };
        let metadata = match MetadataClient::with_options(self.metadata.clone(), options) {
            Ok(metadata) => metadata,
            Err(e) => {
                let start = self.now();
                self.record(start, Op::RegisterRead { via: "metadata".into(), result: Err(e.to_string()) });
                return;
            }
        };
        loop {
            let exists = if client == 0 {
                let (_, agent) = self.pick(&mut rng);
                let config = register::topic_config();
                match agent.create_topic(register::TOPIC, 1, &config).await {
                    Ok(_) => true,
                    Err(silt::client::ClientError::Api { code, .. }) => code == "topic_exists",
                    Err(_) => false,
                }
            } else {
                metadata.read_state().await.is_ok_and(|r| r.state.topics.contains_key(register::TOPIC))
            };
            if exists {
                break;
            }
            if self.now() >= phase_end {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut written = 0;
        while self.now() < phase_end {
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..300))).await;
            let start = self.now();
            if rng.random_bool(0.5) {
                written += 1;
                let value = register::value(client, written);
                let command = register::write(value);
                let result = match metadata.write(command).await {
                    Ok(_) => Ok(()),
                    // It may have been committed: no answer, or one that says so.
                    Err(MetadataError::Unavailable(e)) => Err(e),
                    // Refused: it took no effect.
                    Err(_) => continue,
                };
                self.record(start, Op::RegisterWrite { via: "metadata".into(), value, result });
            } else {
                let result =
                    metadata.read_state().await.map(|r| register::read(&r.state)).map_err(|e| e.to_string());
                self.record(start, Op::RegisterRead { via: "metadata".into(), result });
            }
        }
    }

    async fn produce(self: Arc<Clients>, producer: usize, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0;
        while self.now() < phase_end {
            let partition = rng.random_range(0..PARTITIONS);
            let (via, client) = self.pick(&mut rng);
            let value = format!("c{producer}-{n}");
            n += 1;
            let message = OutMessage {
                partition: Some(partition),
                value: Some(value.clone()),
                ..OutMessage::default()
            };
            let start = self.now();
            let result = match client.produce(TOPIC, &[message]).await {
                Ok(ids) => offset_of(&ids, partition),
                Err(e) => Err(e.to_string()),
            };
            if let Ok(offset) = result {
                let mut ends = lock(&self.acked_end);
                let end = ends.entry(partition).or_default();
                *end = (*end).max(offset + 1);
            }
            self.record(start, Op::Produce { partition, via: via.clone(), value, result });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        }
    }

    async fn read(self: Arc<Clients>, seed: u64, phase_end: Ms) {
        let mut rng = StdRng::seed_from_u64(seed);
        while self.now() < phase_end {
            let partition = rng.random_range(0..PARTITIONS);
            let (via, client) = self.pick(&mut rng);
            let end = lock(&self.acked_end).get(&partition).copied().unwrap_or(0);
            // Half the reads follow the tail (where a dirty read would show), half go back.
            let from = if rng.random_bool(0.5) {
                end.saturating_sub(rng.random_range(0..4))
            } else {
                rng.random_range(0..=end)
            };
            let start = self.now();
            let result = client
                .replay(TOPIC, partition, Some(from), None, 100)
                .await
                .map(|page| (seen(&page.messages), page.next_offset, page.high_watermark))
                .map_err(|e| e.to_string());
            self.record(start, Op::Read { partition, via: via.clone(), from, result });
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
    }

    /// Reads `partition` from 0 to the end through each agent in turn until one read gets to
    /// the end of what was acknowledged, or the recovery time is up.
    async fn read_to_end(&self, partition: u32) {
        let start = self.now();
        let deadline = Instant::now() + RECOVERY;
        let acked_end = lock(&self.acked_end).get(&partition).copied().unwrap_or(0);
        let mut why = String::from("no read was tried");
        let mut longest: Option<Vec<Seen>> = None;
        let mut attempt = 0;
        while Instant::now() < deadline {
            let (via, client) = &self.agents[attempt % self.agents.len()];
            attempt += 1;
            match read_all(client, partition).await {
                Ok((log, hwm)) if hwm >= acked_end => {
                    self.record(start, Op::Final { partition, log: Some(log), why: String::new() });
                    return;
                }
                Ok((log, hwm)) => {
                    why = format!("{via} answered hwm {hwm}, below the acknowledged {acked_end}");
                    if longest.as_ref().is_none_or(|l| l.len() < log.len()) {
                        longest = Some(log);
                    }
                }
                Err(e) => why = format!("{via}: {e}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.record(
            start,
            Op::Final { partition, log: longest, why: format!("not within {RECOVERY:?}: {why}") },
        );
    }
}

/// The offset of the one message a produce to `partition` was acknowledged with, from its id
/// (`topic/partition/offset`).
fn offset_of(ids: &[String], partition: u32) -> Result<u64, String> {
    let [id] = ids else { return Err(format!("acknowledged with {} ids, not one: {ids:?}", ids.len())) };
    let mut parts = id.rsplitn(3, '/');
    let (offset, p) = (parts.next(), parts.next());
    match (p.and_then(|p| p.parse::<u32>().ok()), offset.and_then(|o| o.parse::<u64>().ok())) {
        (Some(p), Some(offset)) if p == partition => Ok(offset),
        _ => Err(format!("acknowledged with the id {id}, not one of partition {partition}")),
    }
}

/// Every record of `partition` from offset 0 to the high watermark, through one agent.
async fn read_all(client: &Client, partition: u32) -> Result<(Vec<Seen>, u64), String> {
    let mut log = Vec::new();
    let mut offset = 0;
    loop {
        let page =
            client.replay(TOPIC, partition, Some(offset), None, 1000).await.map_err(|e| e.to_string())?;
        log.extend(seen(&page.messages));
        if page.next_offset >= page.high_watermark {
            return Ok((log, page.high_watermark));
        }
        if page.messages.is_empty() && page.next_offset == offset {
            // Not read to the end: tried again, or judged unrecovered.
            return Err(format!(
                "no record at offset {offset}, below the high watermark {}",
                page.high_watermark
            ));
        }
        offset = page.next_offset;
    }
}

fn seen(messages: &[silt::client::Message]) -> Vec<Seen> {
    messages
        .iter()
        .map(|m| Seen {
            offset: m.offset,
            value: m.value.clone().unwrap_or_else(|| "<none>".to_string()),
            timestamp_ms: m.timestamp,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::offset_of;

    #[test]
    fn an_acknowledgement_names_one_offset_of_the_partition_produced_to() {
        assert_eq!(offset_of(&["events/1/42".to_string()], 1), Ok(42));
        assert_eq!(
            offset_of(&["a/b/1/7".to_string()], 1),
            Ok(7),
            "a topic name holds no '/', but the id is read from its end"
        );
        assert!(offset_of(&["events/0/42".to_string()], 1).is_err(), "another partition's id");
        assert!(offset_of(&[], 1).is_err());
        assert!(offset_of(&["events/1/2".to_string(), "events/1/3".to_string()], 1).is_err());
        assert!(offset_of(&["events/1/x".to_string()], 1).is_err());
    }
}
