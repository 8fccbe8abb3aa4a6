//! The fault schedule: drawn from the seed before the run starts, applied between simulation
//! steps, every fault healed when the fault phase ends.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use silt_agent::log::disk::{self, FaultKind};
use silt_agent::memory_network::Link;
use silt_metadata::handle::LinkState;
use silt_metadata::raft::memory_network::RaftLink;

use crate::world::{World, LEASE};
use silt_sim::history::Ms;

/// One fault, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Requests from one agent to another never arrive, their answers are lost, or each
    /// request and answer takes its own random time up to a bound (overtaking each other).
    Link { from: String, to: String, link: Link },
    /// An agent cut off from every other agent, both ways.
    Isolate { agent: String, isolated: bool },
    /// An agent's calls to metadata never arrive, or arrive and lose their answers; it still
    /// reaches the other agents.
    MetadataLink { agent: String, link: LinkState },
    /// Whichever agent writes `partition` at the time is cut off from metadata (not from the
    /// other agents): its lease lapses while it may still write to its followers. With `slow`,
    /// its requests to the other agents take up to that long too (in order), so that appends it
    /// sent before its lease lapsed arrive after the next writer took over, and the other
    /// agents' calls to metadata are slow, so that the next writer's recovery takes a while.
    /// With `follower`, that one of the other agents (in name order) is cut off from metadata
    /// too: the next writer recovers the open segment from it but, its lease lapsed, leaves it
    /// out of the segments it opens, so that only the fence the recovery raised there stops the
    /// deposed writer's appends.
    CutWriterFromMetadata { partition: u32, slow: Option<std::time::Duration>, follower: Option<usize> },
    /// The agent's machine loses power: its processes stop at once and its disks keep only
    /// what was fsynced, with the first `torn` bytes written since put down too.
    Crash { agent: String, torn: usize },
    /// The agent's process is killed (`kill -9`): what it wrote stays in the page cache.
    Kill { agent: String },
    /// The agent's machine (or process) starts again, and with it the agent.
    Restart { agent: String },
    /// The next `count` fsyncs of the agent's segments fail with EIO.
    FsyncErrors { agent: String, count: u32 },
    /// The next `count` writes to the agent's segments fail on a full disk, or stop short.
    WriteErrors { agent: String, short: bool, count: u32 },
    /// The agent is paused (SIGSTOP, a long garbage collection) or resumed: while it is,
    /// nothing it sends to other agents or to metadata leaves and nothing sent to it (by them
    /// or by clients) arrives, nor any answer either way; all of it goes on in order when the
    /// pause ends, what the sender's timeout has not given up on. Its tasks still run.
    Pause { agent: String, paused: bool },
    /// Whichever agent writes `partition` at the time is paused, as [`Fault::Pause`].
    PauseWriter { partition: u32 },
    /// Every paused agent is resumed.
    ResumeAll,
    /// The agent's wall clock jumps by `ms`.
    ClockStep { agent: String, ms: i64 },
    /// Whichever agent writes `partition` at the time is cut off from every other agent.
    IsolateWriter { partition: u32 },
    /// Whichever agent writes `partition` at the time loses power, as [`Fault::Crash`]; with
    /// `wipe`, its disk is replaced by an empty one too.
    CrashWriter { partition: u32, torn: usize, wipe: bool },
    /// Every agent whose machine is down starts again; every agent's links are mended.
    RestartAll,
    /// Every agent's link to metadata is mended.
    MendMetadataLinks,
    /// Every link, between agents and to metadata, is mended.
    MendAllLinks,
    /// With `--archive`: from now on this share of the calls to the bucket fail (a 503, a 500,
    /// a timeout, a PUT applied whose answer is lost, a slow GET), until the next such event.
    BucketErrors { percent: u32 },
    /// Metadata node `node`'s process is killed (`kill -9`): what it wrote stays. With
    /// `power_loss`, its machine loses power instead: its disk keeps only what was fsynced, with
    /// the first that many bytes written since put down too.
    MetadataKill { node: u64, power_loss: Option<usize> },
    /// Whichever metadata node leads at the time is killed, as [`Fault::MetadataKill`].
    MetadataKillLeader { power_loss: Option<usize> },
    /// Every metadata node that is down starts again.
    MetadataRestartAll,
    /// Raft's messages from one metadata node to another never arrive, lose their answers, or
    /// are slow.
    RaftLink { from: u64, to: u64, link: RaftLink },
    /// Whichever metadata node leads at the time is cut off from every other node, both ways
    /// (the agents still reach it).
    IsolateMetadataLeader,
    /// Every link between metadata nodes is mended.
    MendRaftLinks,
    /// The whole cluster loses power at once: every agent (its disks keep only what was
    /// fsynced) and every metadata node (its disk too).
    PowerLossEverywhere,
    /// Every host that is down, agent or metadata node, starts again.
    RestartEverything,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Link { from, to, link } => write!(f, "link {from} -> {to}: {link:?}"),
            Fault::Isolate { agent, isolated: true } => write!(f, "isolate {agent}"),
            Fault::Isolate { agent, isolated: false } => write!(f, "mend the links of {agent}"),
            Fault::MetadataLink { agent, link } => write!(f, "link {agent} -> metadata: {link:?}"),
            Fault::CutWriterFromMetadata { partition, slow, follower } => {
                write!(f, "cut the writer of partition {partition} off from metadata")?;
                if let Some(slow) = slow {
                    write!(f, ", its requests delayed up to {slow:?}, the others' calls to metadata slow")?;
                }
                if let Some(i) = follower {
                    write!(f, ", and the other agents' number {i} (by name) too")?;
                }
                Ok(())
            }
            Fault::MendMetadataLinks => write!(f, "mend every link to metadata"),
            Fault::MendAllLinks => write!(f, "mend every link"),
            Fault::Crash { agent, torn } => write!(f, "power loss of {agent} (torn {torn} bytes)"),
            Fault::Kill { agent } => write!(f, "kill -9 {agent}"),
            Fault::Restart { agent } => write!(f, "restart {agent}"),
            Fault::FsyncErrors { agent, count } => write!(f, "next {count} fsyncs of {agent} fail"),
            Fault::WriteErrors { agent, short, count } => {
                write!(
                    f,
                    "next {count} writes of {agent} {}",
                    if *short { "stop short" } else { "find the disk full" }
                )
            }
            Fault::Pause { agent, paused: true } => write!(f, "pause {agent}"),
            Fault::Pause { agent, paused: false } => write!(f, "resume {agent}"),
            Fault::PauseWriter { partition } => write!(f, "pause the writer of partition {partition}"),
            Fault::ResumeAll => write!(f, "resume every paused agent"),
            Fault::ClockStep { agent, ms } => write!(f, "clock of {agent} steps {ms:+} ms"),
            Fault::IsolateWriter { partition } => write!(f, "isolate the writer of partition {partition}"),
            Fault::CrashWriter { partition, torn, wipe: false } => {
                write!(f, "power loss of the writer of partition {partition} (torn {torn} bytes)")
            }
            Fault::CrashWriter { partition, wipe: true, .. } => {
                write!(f, "power loss of the writer of partition {partition}, whose disk is replaced")
            }
            Fault::RestartAll => write!(f, "restart every agent that is down, mend every link"),
            Fault::BucketErrors { percent: 0 } => write!(f, "calls to the bucket succeed again"),
            Fault::BucketErrors { percent } => write!(f, "{percent}% of the calls to the bucket fail"),
            Fault::MetadataKill { node, power_loss: None } => write!(f, "kill -9 metadata node {node}"),
            Fault::MetadataKill { node, power_loss: Some(torn) } => {
                write!(f, "power loss of metadata node {node} (torn {torn} bytes)")
            }
            Fault::MetadataKillLeader { power_loss: None } => write!(f, "kill -9 the metadata leader"),
            Fault::MetadataKillLeader { power_loss: Some(torn) } => {
                write!(f, "power loss of the metadata leader (torn {torn} bytes)")
            }
            Fault::MetadataRestartAll => write!(f, "restart every metadata node that is down"),
            Fault::RaftLink { from, to, link } => write!(f, "raft link metadata {from} -> {to}: {link:?}"),
            Fault::IsolateMetadataLeader => write!(f, "isolate the metadata leader from the other nodes"),
            Fault::MendRaftLinks => write!(f, "mend every link between metadata nodes"),
            Fault::PowerLossEverywhere => write!(f, "power loss of every agent and metadata node"),
            Fault::RestartEverything => write!(f, "restart every host that is down"),
        }
    }
}

/// The faults of one run, in the order they happen.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(crate) events: Vec<(Ms, Fault)>,
}

impl Schedule {
    /// Draws the faults of a run whose fault phase lasts `phase` ms over `agents`, from `seed`.
    /// Each fault that lasts ends within the phase; every fault left is healed at its end. With
    /// `disk_loss`, a writer that loses power may lose its disk too; with `archive`, windows of
    /// errors from the bucket come on top (drawn apart, so that the rest stays as it was).
    pub(crate) fn draw(seed: u64, world: &World, phase: Ms, disk_loss: bool, archive: bool) -> Schedule {
        let agents = &world.agents[..];
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5117_5111);
        let mut events = Vec::new();
        let count = rng.random_range(3..=10);
        let mut wiped = false;
        let pick = |rng: &mut StdRng| agents[rng.random_range(0..agents.len())].clone();
        for _ in 0..count {
            let at = rng.random_range(1_000..phase - 1_000);
            let lasts = rng.random_range(200..=8_000).min(phase - at);
            let end = at + lasts;
            match rng.random_range(0..15) {
                0 | 1 => {
                    let (from, to) = two(&mut rng, agents);
                    let link = match rng.random_range(0..4) {
                        0 => Link::Cut,
                        1 => Link::RepliesLost,
                        2 => Link::Duplicated,
                        _ => Link::Delayed(std::time::Duration::from_millis(rng.random_range(50..=6_000))),
                    };
                    let both = rng.random_bool(0.5);
                    events.push((at, Fault::Link { from: from.clone(), to: to.clone(), link }));
                    events.push((end, Fault::Link { from: from.clone(), to: to.clone(), link: Link::Up }));
                    if both {
                        events.push((at, Fault::Link { from: to.clone(), to: from.clone(), link }));
                        events.push((end, Fault::Link { from: to, to: from, link: Link::Up }));
                    }
                }
                2 => {
                    let agent = pick(&mut rng);
                    events.push((at, Fault::Isolate { agent: agent.clone(), isolated: true }));
                    events.push((end, Fault::Isolate { agent, isolated: false }));
                }
                3 | 4 => {
                    let agent = pick(&mut rng);
                    let torn = if rng.random_bool(0.5) { 0 } else { rng.random_range(1..200) };
                    events.push((at, Fault::Crash { agent: agent.clone(), torn }));
                    events.push((end, Fault::Restart { agent }));
                }
                5 => {
                    let agent = pick(&mut rng);
                    events.push((at, Fault::FsyncErrors { agent, count: rng.random_range(1..=3) }));
                }
                6 => {
                    let agent = pick(&mut rng);
                    let short = rng.random_bool(0.5);
                    events.push((at, Fault::WriteErrors { agent, short, count: rng.random_range(1..=3) }));
                }
                8 => {
                    let agent = pick(&mut rng);
                    events.push((at, Fault::Kill { agent: agent.clone() }));
                    events.push((end, Fault::Restart { agent }));
                }
                9 => {
                    // The writer cut off from its followers (it may acknowledge nothing more),
                    // then lost while they recover the partition without it.
                    let partition = rng.random_range(0..crate::workload::PARTITIONS);
                    let torn = if rng.random_bool(0.5) { 0 } else { rng.random_range(1..200) };
                    // One disk replaced per run: two could hold the only copies of a segment
                    // before its repair, a loss no replication factor of 3 survives.
                    let wipe = rng.random_bool(0.5) && disk_loss && !wiped;
                    wiped |= wipe;
                    events.push((at, Fault::IsolateWriter { partition }));
                    events.push((at + lasts / 2, Fault::CrashWriter { partition, torn, wipe }));
                    events.push((end, Fault::RestartAll));
                }
                11 => {
                    let agent = pick(&mut rng);
                    let link = match rng.random_range(0..4) {
                        0 => LinkState::Cut,
                        1 => LinkState::RepliesLost,
                        2 => LinkState::ReadsLost,
                        _ => LinkState::Slow,
                    };
                    events.push((at, Fault::MetadataLink { agent: agent.clone(), link }));
                    events.push((end, Fault::MetadataLink { agent, link: LinkState::Up }));
                }
                // Three times as likely as another fault: the late appends of a deposed
                // writer, which fencing stops, come only of some of these.
                12..=14 => {
                    // Longer than a lease, so that another agent takes the partition over.
                    let partition = rng.random_range(0..crate::workload::PARTITIONS);
                    let end = (at + rng.random_range(3_000..=10_000)).min(phase);
                    let slow = rng
                        .random_bool(0.5)
                        .then(|| std::time::Duration::from_millis(rng.random_range(1_000..=4_500)));
                    // Drawn apart, so that the rest of the schedule a seed draws stays as it was.
                    let mut apart = StdRng::seed_from_u64(seed ^ at ^ 0xF0_11_0E_25);
                    let follower = apart.random_bool(0.5).then(|| apart.random_range(0..agents.len() - 1));
                    events.push((at, Fault::CutWriterFromMetadata { partition, slow, follower }));
                    events.push((
                        end,
                        if slow.is_some() { Fault::MendAllLinks } else { Fault::MendMetadataLinks },
                    ));
                }
                _ => {
                    let agent = pick(&mut rng);
                    let ms = rng.random_range(1_000..=3_600_000) * if rng.random_bool(0.5) { 1 } else { -1 };
                    events.push((at, Fault::ClockStep { agent, ms }));
                }
            }
        }
        if archive {
            let mut apart = StdRng::seed_from_u64(seed ^ 0x00B0_C4E7);
            for _ in 0..apart.random_range(1..=3) {
                let at = apart.random_range(1_000..phase - 1_000);
                let end = (at + apart.random_range(1_000..=8_000)).min(phase);
                events.push((at, Fault::BucketErrors { percent: apart.random_range(10..=60) }));
                events.push((end, Fault::BucketErrors { percent: 0 }));
            }
        }
        if world.metadata_nodes.len() > 1 {
            let nodes: Vec<u64> = world.metadata_nodes.keys().copied().collect();
            let mut apart = StdRng::seed_from_u64(seed ^ 0x3E7A_DA7A);
            for _ in 0..apart.random_range(2..=6) {
                let at = apart.random_range(1_000..phase - 1_000);
                let end = (at + apart.random_range(200..=8_000)).min(phase);
                match apart.random_range(0..8) {
                    0 => {
                        let node = nodes[apart.random_range(0..nodes.len())];
                        let power_loss = power_loss(&mut apart);
                        events.push((at, Fault::MetadataKill { node, power_loss }));
                        events.push((end, Fault::MetadataRestartAll));
                    }
                    1 | 2 => {
                        let power_loss = power_loss(&mut apart);
                        events.push((at, Fault::MetadataKillLeader { power_loss }));
                        events.push((end, Fault::MetadataRestartAll));
                    }
                    3 | 4 => {
                        events.push((at, Fault::IsolateMetadataLeader));
                        events.push((end, Fault::MendRaftLinks));
                    }
                    5 | 6 => {
                        let a = apart.random_range(0..nodes.len());
                        let b = (a + apart.random_range(1..nodes.len())) % nodes.len();
                        let link = match apart.random_range(0..3) {
                            0 => RaftLink::Cut,
                            1 => RaftLink::RepliesLost,
                            _ => RaftLink::Slow(std::time::Duration::from_millis(
                                apart.random_range(20..=2_000),
                            )),
                        };
                        let (from, to) = (nodes[a], nodes[b]);
                        events.push((at, Fault::RaftLink { from, to, link }));
                        if apart.random_bool(0.5) {
                            events.push((at, Fault::RaftLink { from: to, to: from, link }));
                        }
                        events.push((end, Fault::MendRaftLinks));
                    }
                    _ => {
                        // Rarer than the others: about one run in five.
                        if apart.random_bool(0.5) {
                            events.push((at, Fault::PowerLossEverywhere));
                            events.push((end, Fault::RestartEverything));
                        }
                    }
                }
            }
        }
        if world.metadata_nodes.len() > 1 {
            const LEASE_MS: Ms = LEASE.as_millis() as Ms;
            // Pauses of agents, most of them longer than a lease, drawn apart too. (With one
            // metadata node a seed draws what it drew before they existed.)
            let mut apart = StdRng::seed_from_u64(seed ^ 0x0005_1570);
            for _ in 0..apart.random_range(0..=3) {
                let at = apart.random_range(1_000..phase - 1_000);
                let lasts = if apart.random_bool(0.25) {
                    apart.random_range(100..LEASE_MS)
                } else {
                    apart.random_range(LEASE_MS..=4 * LEASE_MS)
                };
                let end = (at + lasts).min(phase);
                if apart.random_bool(0.5) {
                    let partition = apart.random_range(0..crate::workload::PARTITIONS);
                    events.push((at, Fault::PauseWriter { partition }));
                    events.push((end, Fault::ResumeAll));
                } else {
                    let agent = agents[apart.random_range(0..agents.len())].clone();
                    events.push((at, Fault::Pause { agent: agent.clone(), paused: true }));
                    events.push((end, Fault::Pause { agent, paused: false }));
                }
            }
        }
        // Stable: events at one time keep the order they were drawn in.
        events.sort_by_key(|(at, _)| *at);
        Schedule { events }
    }
}

/// Half of the metadata nodes' crashes are power losses, half of those tear a write.
fn power_loss(rng: &mut StdRng) -> Option<usize> {
    match rng.random_range(0..4) {
        0 | 1 => None,
        2 => Some(0),
        _ => Some(rng.random_range(1..200)),
    }
}

fn two(rng: &mut StdRng, agents: &[String]) -> (String, String) {
    let a = rng.random_range(0..agents.len());
    let b = (a + rng.random_range(1..agents.len())) % agents.len();
    (agents[a].clone(), agents[b].clone())
}

/// Applies `fault` to the world and the simulation.
pub(crate) fn apply(fault: &Fault, world: &World, sim: &mut turmoil::Sim<'_>) -> anyhow::Result<()> {
    match fault {
        Fault::Link { from, to, link } => world.net.set_link(from, to, *link),
        Fault::Isolate { agent, isolated } => world.net.isolate(agent, *isolated),
        Fault::MetadataLink { agent, link } => world.metadata_links[agent].set(*link),
        Fault::CutWriterFromMetadata { partition, slow, follower } => {
            if let Some(agent) = world.writer_of(*partition) {
                world.metadata_links[&agent].set(LinkState::Cut);
                for other in world.agents.iter().filter(|a| **a != agent) {
                    if let Some(slow) = slow {
                        world.net.set_link(&agent, other, Link::Slow(*slow));
                        // The next writer's recovery takes a while: appends sent before it
                        // fenced a member may arrive before it is done.
                        world.metadata_links[other].set(LinkState::Slow);
                    }
                }
                if let Some(other) =
                    follower.and_then(|i| world.agents.iter().filter(|a| **a != agent).nth(i))
                {
                    world.metadata_links[other].set(LinkState::Cut);
                }
            }
        }
        Fault::MendMetadataLinks => {
            for link in world.metadata_links.values() {
                link.set(LinkState::Up);
            }
        }
        Fault::MendAllLinks => {
            apply(&Fault::MendMetadataLinks, world, sim)?;
            for agent in &world.agents {
                world.net.isolate(agent, false);
            }
        }
        Fault::Crash { agent, torn } => {
            if sim.is_host_running(agent.as_str()) {
                world.forget(agent);
                sim.crash(agent.as_str());
                world.lose_power(agent, *torn)?;
            }
        }
        Fault::Kill { agent } => {
            if sim.is_host_running(agent.as_str()) {
                world.forget(agent);
                sim.crash(agent.as_str());
                world.forget_process(agent);
            }
        }
        Fault::Restart { agent } => {
            if !sim.is_host_running(agent.as_str()) {
                sim.bounce(agent.as_str());
            }
        }
        Fault::FsyncErrors { agent, count } => {
            disk::inject_fsync_errors(&format!("{agent}/"), 0, *count);
        }
        Fault::WriteErrors { agent, short, count } => {
            let kind = if *short { FaultKind::ShortWrite } else { FaultKind::NoSpace };
            disk::inject_write_errors(kind, &format!("{agent}/"), 0, *count);
        }
        Fault::Pause { agent, paused } => {
            world.net.pause(agent, *paused);
            world.metadata_links[agent].pause(*paused);
        }
        Fault::PauseWriter { partition } => {
            if let Some(agent) = world.writer_of(*partition) {
                apply(&Fault::Pause { agent, paused: true }, world, sim)?;
            }
        }
        Fault::ResumeAll => {
            for agent in &world.agents {
                apply(&Fault::Pause { agent: agent.clone(), paused: false }, world, sim)?;
            }
        }
        Fault::ClockStep { agent, ms } => world.clocks[agent].step(*ms),
        Fault::IsolateWriter { partition } => {
            if let Some(agent) = world.writer_of(*partition) {
                apply(&Fault::Isolate { agent, isolated: true }, world, sim)?;
            }
        }
        Fault::CrashWriter { partition, torn, wipe } => {
            if let Some(agent) = world.writer_of(*partition) {
                apply(&Fault::Crash { agent: agent.clone(), torn: *torn }, world, sim)?;
                if *wipe {
                    world.replace_disk(&agent)?;
                }
            }
        }
        Fault::RestartAll => {
            for agent in &world.agents {
                apply(&Fault::Isolate { agent: agent.clone(), isolated: false }, world, sim)?;
                apply(&Fault::Restart { agent: agent.clone() }, world, sim)?;
            }
        }
        Fault::BucketErrors { percent } => {
            if let Some(bucket) = &world.bucket {
                bucket.faults.set_error_rate(f64::from(*percent) / 100.0);
            }
        }
        Fault::MetadataKill { node, power_loss } => {
            let host = world.metadata_nodes[node].as_str();
            if sim.is_host_running(host) {
                world.metadata_down(*node);
                sim.crash(host);
                if let Some(torn) = power_loss {
                    world.lose_power(host, *torn)?;
                }
            }
        }
        Fault::MetadataKillLeader { power_loss } => {
            if let Some(node) = world.metadata_leader() {
                apply(&Fault::MetadataKill { node, power_loss: *power_loss }, world, sim)?;
            }
        }
        Fault::MetadataRestartAll => {
            for host in world.metadata_nodes.values() {
                if !sim.is_host_running(host.as_str()) {
                    sim.bounce(host.as_str());
                }
            }
        }
        Fault::RaftLink { from, to, link } => world.raft.set_link(*from, *to, *link),
        Fault::IsolateMetadataLeader => {
            if let Some(leader) = world.metadata_leader() {
                for other in world.metadata_nodes.keys().filter(|n| **n != leader) {
                    world.raft.set_link(leader, *other, RaftLink::Cut);
                    world.raft.set_link(*other, leader, RaftLink::Cut);
                }
            }
        }
        Fault::MendRaftLinks => world.raft.heal(),
        Fault::PowerLossEverywhere => {
            for agent in &world.agents {
                apply(&Fault::Crash { agent: agent.clone(), torn: 0 }, world, sim)?;
            }
            for node in world.metadata_nodes.keys() {
                apply(&Fault::MetadataKill { node: *node, power_loss: Some(0) }, world, sim)?;
            }
        }
        Fault::RestartEverything => {
            apply(&Fault::MetadataRestartAll, world, sim)?;
            apply(&Fault::RestartAll, world, sim)?;
        }
    }
    Ok(())
}

/// What heals every fault still in effect at the end of the fault phase: paused agents
/// resumed, links (to metadata and between metadata nodes too) mended, metadata nodes that are down started again,
/// crashed agents started again, and agents that distrust a directory after a failed fsync
/// restarted (as an operator does when told so). Injected disk errors not yet used up stay;
/// they are few.
pub(crate) fn heal_all(world: &World) -> Vec<Fault> {
    let mut heal = vec![Fault::MendMetadataLinks, Fault::MendRaftLinks, Fault::MetadataRestartAll];
    if world.bucket.is_some() {
        heal.push(Fault::BucketErrors { percent: 0 });
    }
    for a in &world.agents {
        heal.push(Fault::Pause { agent: a.clone(), paused: false });
        heal.push(Fault::Isolate { agent: a.clone(), isolated: false });
        if disk::distrusts_any_under(std::path::Path::new(a)) {
            heal.push(Fault::Kill { agent: a.clone() });
        }
        heal.push(Fault::Restart { agent: a.clone() });
    }
    heal
}
