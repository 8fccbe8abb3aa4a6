//! The `silt` command: runs Silt (`silt dev`, `silt metadata`) and talks to it (topics, produce,
//! consume, replay, cluster).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use silt::client::{Client, HeaderOut, OutMessage, Poll};
use silt_agent::api::message_out;
use silt_agent::limits::REPLAY_MAX;
use tokio::io::AsyncBufReadExt;

#[derive(Parser)]
#[command(
    name = "silt",
    version,
    about = "Silt: a message queue whose hot tail lives on agent disks and whose history lives in object storage",
    long_about = "Silt: a message queue whose hot tail lives on agent disks and whose history lives in object storage.\n\nStart everything in one process with `silt dev`, then use the client commands against it.\nClient commands talk to --server (or $SILT_SERVER, default http://127.0.0.1:7070).\nA cluster runs as `silt metadata` processes (three or five), `silt agent` processes and a\n`silt compactor`; `silt cluster` inspects and changes it (--metadata or $SILT_METADATA)."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args, Clone)]
struct ServerArg {
    /// The agent to talk to.
    #[arg(long, env = "SILT_SERVER", default_value = "http://127.0.0.1:7070", global = true)]
    server: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run metadata, an agent and (later) the compactor in one process, all state under --data-dir.
    Dev {
        /// Directory for all state (created if missing).
        #[arg(long, default_value = "./silt-data")]
        data_dir: PathBuf,
        /// Address to serve the API on; use port 0 to pick a free port.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// Where archived segments go: s3://bucket/prefix (with the standard AWS_* variables;
        /// AWS_ENDPOINT_URL for LocalStack or MinIO) or file:///path. Default: <data-dir>/objects.
        #[arg(long, env = "SILT_OBJECT_STORE", value_name = "URL")]
        object_store: Option<String>,
        #[command(flatten)]
        cache: silt::dev::ColdCacheArgs,
        /// Agents to run in this process (1 to 5), each on its own port (--listen's port, then
        /// the next ones) with its own data directory (<data-dir>/agents/dev-N). With 2 or
        /// more, topics default to replication.factor min(agents, 3): each segment is written
        /// to that many local disks and a produce is acknowledged once a majority fsynced it.
        /// Each agent prints where it listens once all of them are registered, the first one
        /// ("silt dev listening on ...") last.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=5))]
        agents: u32,
    },
    /// Run one node of a metadata cluster (openraft over HTTP); run three or five of them.
    ///
    /// Each node keeps its Raft log and snapshots in --data-dir and serves its peers and clients
    /// on --listen. Start every node with the same --peers; start exactly one of them with --init
    /// the first time (it makes all --peers voters; later starts ignore --init). A node started
    /// without --init waits to be contacted by the leader: as an initial member, or as a new
    /// node added with `silt cluster add-node`. Any node accepts writes and forwards them to the
    /// leader. SIGINT or SIGTERM finishes requests in flight and exits.
    ///
    /// Example, three nodes on one machine:
    ///   silt metadata --id 1 --listen 127.0.0.1:7101 --data-dir m1 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 --init
    ///   silt metadata --id 2 --listen 127.0.0.1:7102 --data-dir m2 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103
    ///   silt metadata --id 3 --listen 127.0.0.1:7103 --data-dir m3 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103
    #[command(verbatim_doc_comment)]
    Metadata {
        /// This node's id, unique in the cluster and never reused.
        #[arg(long)]
        id: u64,
        /// Address to serve peers and clients on. It must be the address --peers gives for
        /// this node (that is where the others connect).
        #[arg(long)]
        listen: SocketAddr,
        /// Directory for this node's Raft log and snapshots (created if missing).
        #[arg(long, default_value = "./silt-metadata")]
        data_dir: PathBuf,
        /// The initial members as ID=HOST:PORT, comma separated, this node included.
        #[arg(long, value_delimiter = ',', value_name = "ID=HOST:PORT,...")]
        peers: Vec<String>,
        /// Form the cluster with --peers as voters, if this node is fresh. Give it to one node.
        #[arg(long)]
        init: bool,
        /// A write or read that cannot reach a leader with a quorum fails with 503 after this.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        request_timeout: Duration,
        /// Snapshot every N applied entries and keep N/2 older entries (testing; default 4096).
        #[arg(long, hide = true)]
        snapshot_logs: Option<u64>,
        /// Leader heartbeat interval in ms (testing; default 50).
        #[arg(long, hide = true)]
        heartbeat_ms: Option<u64>,
        /// Minimum election timeout in ms, the maximum is twice it (testing; default 300).
        #[arg(long, hide = true)]
        election_timeout_ms: Option<u64>,
    },
    /// Run an agent against a metadata cluster; run several, each with its own --id and --data-dir.
    ///
    /// The agent registers with metadata, holds a lease it renews every third of --lease, and
    /// writes the partitions metadata gives it. When its lease lapses (a crash, a pause, a cut
    /// network), metadata names another live agent writer of its partitions with a higher
    /// epoch. Every agent of a cluster shares one bucket (--object-store). By default it also
    /// archives the sealed segments it holds. SIGINT or SIGTERM stops serving, seals and
    /// archives what it wrote (up to 90 s), deregisters (its partitions move at once) and exits.
    ///
    /// Example, against the three metadata nodes of `silt metadata --help`:
    ///   silt agent --id a1 --listen 127.0.0.1:7201 --metadata 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 \
    ///     --data-dir a1 --object-store s3://silt-archive/prod
    #[command(verbatim_doc_comment)]
    Agent {
        /// This agent's id: stable across restarts, unique in the cluster.
        #[arg(long)]
        id: String,
        /// Address to serve the API on.
        #[arg(long, default_value = "127.0.0.1:7201")]
        listen: SocketAddr,
        /// Address other agents and clients use to reach this one, as HOST:PORT. Default:
        /// --listen, or, when that is 0.0.0.0, the local address that routes to the first
        /// metadata node, with the --listen port.
        #[arg(long, value_name = "HOST:PORT")]
        advertise: Option<String>,
        /// Metadata nodes as HOST:PORT, comma separated; any node of the cluster will do.
        #[arg(long, env = "SILT_METADATA", value_delimiter = ',', required = true)]
        metadata: Vec<String>,
        /// Directory for the local logs and the cache (created if missing).
        #[arg(long, default_value = "./silt-agent")]
        data_dir: PathBuf,
        /// The bucket all agents share: s3://bucket/prefix (standard AWS_* variables) or
        /// file:///path (a folder every agent can reach).
        #[arg(long, env = "SILT_OBJECT_STORE", value_name = "URL")]
        object_store: String,
        #[command(flatten)]
        cache: silt::dev::ColdCacheArgs,
        /// Metadata moves this agent's partitions to another agent when it has not heartbeated
        /// for this long (0.5s to 10m). An agent that reaches metadata but not the other agents
        /// hands over each partition whose writer has failed to start for this long.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        lease: Duration,
        /// Do not archive sealed segments from this agent (a `silt compactor` does it).
        #[arg(long)]
        no_compactor: bool,
        /// replication.factor of topics created through this agent without one: how many
        /// agents hold each segment. A produce is acknowledged once min.insync.replicas of
        /// them (a majority by default) have fsynced it.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=7))]
        default_replication_factor: u32,
        /// Ensemble repair: when an agent holding replicas of sealed, not yet archived segments
        /// has been gone (lease lapsed) this long, another agent copies them from the
        /// survivors so that replication.factor holds again. Replicas on a wiped disk are
        /// copied at once. Also how long a writer recovering a partition waits for a member
        /// of its open segment that did not answer, when fewer than min.insync.replicas
        /// members hold the tail it recovered (a segment whose ensemble shrank to W members):
        /// no longer than this past the member's lease, nor past the first recovery of the
        /// segment that waited, on any agent.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        replica_repair_after: Duration,
        /// Local IP address that connections to other agents leave from, on hosts with
        /// several addresses. Default: the one the OS routes through.
        #[arg(long, value_name = "IP")]
        peer_source_ip: Option<std::net::IpAddr>,
    },
    /// Run the compactor in its own process, for a cluster of `silt agent`s.
    ///
    /// It archives every sealed segment: reads it from the agent that writes its partition,
    /// writes a Parquet object to the bucket, verifies it and commits it in metadata; it also
    /// enforces retention.ms. It keeps no state: run it anywhere that reaches the metadata
    /// nodes, the agents and the bucket, and start the agents with --no-compactor (agents
    /// archive the segments they hold themselves otherwise). Serves /metrics and /health on
    /// --listen. SIGINT or SIGTERM finishes the uploads in flight and exits.
    ///
    /// Example:
    ///   silt compactor --metadata 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --object-store s3://silt-archive/prod
    #[command(verbatim_doc_comment)]
    Compactor {
        /// Metadata nodes as HOST:PORT, comma separated; any node of the cluster will do.
        #[arg(long, env = "SILT_METADATA", value_delimiter = ',', required = true)]
        metadata: Vec<String>,
        /// The bucket the agents share: s3://bucket/prefix (standard AWS_* variables) or file:///path.
        #[arg(long, env = "SILT_OBJECT_STORE", value_name = "URL")]
        object_store: String,
        /// Address to serve /metrics and /health on.
        #[arg(long, default_value = "127.0.0.1:7301")]
        listen: SocketAddr,
        /// Segments archived at the same time.
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        /// Bytes of segments being archived at once (records in memory plus the encoded object).
        #[arg(long, default_value_t = 512 * 1024 * 1024)]
        memory_bytes: u64,
    },
    /// Inspect and change the metadata cluster (`silt metadata` nodes).
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
        /// Metadata nodes to ask, as HOST:PORT, comma separated; any node of the cluster will do.
        #[arg(
            long,
            env = "SILT_METADATA",
            value_delimiter = ',',
            default_value = "127.0.0.1:7101",
            global = true
        )]
        metadata: Vec<String>,
    },
    /// Inspect the archive, or rebuild metadata from it.
    Archive {
        #[command(subcommand)]
        command: ArchiveCmd,
    },
    /// Prepare an S3 bucket for Silt.
    Bucket {
        #[command(subcommand)]
        command: BucketCmd,
    },
    /// Create, list, describe and delete topics.
    Topic {
        #[command(subcommand)]
        command: TopicCmd,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Produce stdin to a topic, one message per line; prints each message id once it is durable.
    Produce {
        /// Topic to produce to.
        topic: String,
        /// Split each line at the first SEP into key and value (escapes like \t are understood).
        #[arg(long, value_name = "SEP")]
        key_separator: Option<String>,
        /// Send every message to this partition (default: by key, or spread when there is no key).
        #[arg(long)]
        partition: Option<u32>,
        /// Add a header to every message, as KEY=VALUE (repeatable).
        #[arg(long = "header", value_name = "KEY=VALUE")]
        headers: Vec<String>,
        /// How long to wait for more lines before sending a batch.
        #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
        linger: Duration,
        /// Most messages in one request.
        #[arg(long, default_value_t = 1000)]
        batch_max: usize,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Consume a topic with a group, printing JSON lines and acknowledging each message.
    Consume {
        /// Topic to consume.
        topic: String,
        /// Consumer group.
        #[arg(long)]
        group: String,
        /// Exit after this many messages.
        #[arg(long, default_value_t = 100)]
        max: u64,
        /// Exit when no message arrives for this long.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// Group mode: exclusive (partitions assigned to members, order per partition) or shared (a work queue).
        #[arg(long, value_enum, default_value_t = Mode::Exclusive)]
        mode: Mode,
        /// Member id (default: unique per process).
        #[arg(long)]
        member: Option<String>,
        /// Print without acknowledging: the messages come back after the visibility timeout.
        #[arg(long)]
        no_ack: bool,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Read a topic from an offset or a time without a group, printing JSON lines.
    Replay {
        /// Topic to read.
        topic: String,
        /// Only this partition (default: every partition, one after the other).
        #[arg(long)]
        partition: Option<u32>,
        /// Start at this offset.
        #[arg(long, conflicts_with = "from_time")]
        from_offset: Option<u64>,
        /// Start at the first message at or after this time (RFC 3339, e.g. 2026-11-30T10:00:00Z).
        #[arg(long)]
        from_time: Option<String>,
        /// Stop after this many messages in total.
        #[arg(long)]
        max: Option<u64>,
        /// Read pages of about this many bytes of keys, values and headers (1 to 67108864;
        /// default: the agent's, 8 MiB). Smaller pages hold less in memory at a time.
        #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=64 * 1024 * 1024))]
        max_bytes: Option<u64>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Inspect consumer groups.
    Group {
        #[command(subcommand)]
        command: GroupCmd,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(Subcommand)]
enum TopicCmd {
    /// Create a topic.
    Create {
        /// Topic name: ASCII letters, digits, '.', '_' and '-', at most 249 characters.
        name: String,
        /// Number of partitions.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Topic config as NAME=VALUE (repeatable); --help lists every one.
        #[arg(long = "config", value_name = "NAME=VALUE", long_help = config_help(false))]
        config: Vec<String>,
    },
    /// Change some of a topic's configs, all or none; prints the topic as it is after.
    ///
    /// Requests use the new values at once; partition writers within a second (segment.bytes
    /// and segment.ms apply to the open segment). --config --help lists the configs that can
    /// change.
    ///
    /// Example: silt topic alter orders --config retention.ms=86400000 --config max.message.bytes=2097152
    Alter {
        /// Topic name.
        name: String,
        /// New value as NAME=VALUE (repeatable, at least one); --help lists the configs that
        /// can change.
        #[arg(long = "config", value_name = "NAME=VALUE", required = true, long_help = config_help(true))]
        config: Vec<String>,
    },
    /// List topics.
    List,
    /// Show a topic's partitions, writers, epochs and segments as JSON.
    Describe {
        /// Topic name.
        name: String,
    },
    /// Delete a topic and all its data. In a cluster it returns a lease (--lease of the
    /// agents) after metadata took the deletion, once no agent can still answer for the topic;
    /// a topic created again under the name after that starts empty.
    Delete {
        /// Topic name.
        name: String,
    },
}

#[derive(Subcommand)]
enum ArchiveCmd {
    /// One JSON line per archived object of a topic: partition, offsets, records, bytes, timestamps, key.
    Ls {
        /// Topic name.
        topic: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Disaster recovery: rebuild topics and the offset map from the bucket alone.
    ///
    /// Run it with Silt stopped, after the metadata directory was lost. Topics come back with
    /// the ids, partition counts and configs the bucket describes (topics archived by a Silt
    /// that did not describe them come back with retention.ms=-1, so nothing is deleted; set
    /// it again with `silt topic alter`), and every archived segment from the objects' footers.
    ///
    /// Local data of the agents' logs past what is archived may have been acknowledged: the
    /// rebuild refuses to run while there is any, and says where, unless told
    /// --discard-unarchived. Either way offsets found locally are never handed out again.
    /// Local logs are then moved aside to <agent-dir>/agent/log.before-rebuild-<time>.
    RebuildMetadata {
        /// The data directory of `silt dev`.
        #[arg(long, default_value = "./silt-data")]
        data_dir: PathBuf,
        /// The archive: s3://bucket/prefix or file:///path. Default: <data-dir>/objects.
        #[arg(long, env = "SILT_OBJECT_STORE", value_name = "URL")]
        object_store: Option<String>,
        /// Rebuild even though local logs hold data the archive does not: that data is lost
        /// (it stays in the moved-aside logs for inspection).
        #[arg(long)]
        discard_unarchived: bool,
    },
}

#[derive(Subcommand)]
enum BucketCmd {
    /// Create the bucket if needed and apply Silt's settings: encryption (SSE-S3), public access
    /// blocked, incomplete multipart uploads aborted after a day, optional versioning (noncurrent
    /// versions then expire after 7 days).
    Init {
        /// s3://bucket[/prefix]
        url: String,
        /// Turn on object versioning.
        #[arg(long)]
        versioning: bool,
    },
    /// Print the settings `bucket init` applies, as JSON.
    Settings,
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Print the metadata cluster as JSON: leader, term, every member with its role, state and
    /// log indexes (last log, applied, committed, snapshot, what the leader replicated to it),
    /// and the nodes that did not answer.
    Status,
    /// Add a metadata node: start `silt metadata --id ID --listen ADDR` (without --init) first.
    /// It joins as a learner, catches up (from a snapshot if needed), then becomes a voter.
    AddNode {
        /// The new node's id.
        id: u64,
        /// The address it listens on, HOST:PORT.
        addr: String,
    },
    /// Remove a metadata node (voter or learner) from the cluster; stop its process afterwards.
    RemoveNode {
        /// The node's id.
        id: u64,
    },
}

#[derive(Subcommand)]
enum GroupCmd {
    /// Show a group's members, assignment and lag per partition as JSON.
    Describe {
        /// Group name.
        name: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Exclusive,
    Shared,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Dev { data_dir, listen, object_store, cache, agents } => {
            silt::dev::run(silt::dev::DevConfig { data_dir, listen, object_store, cache, agents }).await
        }
        Cmd::Agent {
            id,
            listen,
            advertise,
            metadata,
            data_dir,
            object_store,
            cache,
            lease,
            no_compactor,
            default_replication_factor,
            replica_repair_after,
            peer_source_ip,
        } => {
            silt::agent::run(silt::agent::AgentProcessConfig {
                id,
                listen,
                advertise,
                metadata,
                data_dir,
                object_store,
                cache,
                lease,
                compactor: !no_compactor,
                default_replication_factor,
                replica_repair_after,
                peer_source_ip,
            })
            .await
        }
        Cmd::Compactor { metadata, object_store, listen, concurrency, memory_bytes } => {
            silt::compactor::run(silt::compactor::CompactorProcessConfig {
                metadata,
                object_store,
                listen,
                concurrency,
                memory_bytes,
            })
            .await
        }
        Cmd::Metadata {
            id,
            listen,
            data_dir,
            peers,
            init,
            request_timeout,
            snapshot_logs,
            heartbeat_ms,
            election_timeout_ms,
        } => {
            let mut options = silt_metadata::MetadataNodeOptions {
                request_timeout_ms: request_timeout.as_millis().max(1) as u64,
                ..Default::default()
            };
            if let Some(n) = snapshot_logs {
                options.snapshot_logs_since_last = n.max(1);
                options.snapshot_logs_to_keep = n / 2;
                options.purge_batch_size = (n / 10).max(1);
            }
            if let Some(ms) = heartbeat_ms {
                options.heartbeat_interval_ms = ms;
            }
            if let Some(ms) = election_timeout_ms {
                options.election_timeout_min_ms = ms;
                options.election_timeout_max_ms = ms * 2;
            }
            let peers = silt::metadata::parse_peers(&peers)?;
            silt::metadata::run(silt::metadata::MetadataConfig { id, listen, data_dir, peers, init, options })
                .await
        }
        Cmd::Cluster { command, metadata } => {
            let client = silt_metadata::MetadataClient::new(metadata)?;
            let out = match command {
                ClusterCmd::Status => serde_json::to_value(silt::cluster::status(&client).await?)?,
                ClusterCmd::AddNode { id, addr } => serde_json::to_value(client.add_node(id, &addr).await?)?,
                ClusterCmd::RemoveNode { id } => serde_json::to_value(client.remove_node(id).await?)?,
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Cmd::Archive { command: ArchiveCmd::Ls { topic, server } } => {
            let objects = Client::new(&server.server)?.archive_list(&topic).await?;
            let mut out = std::io::stdout().lock();
            for o in objects {
                writeln!(out, "{}", serde_json::to_string(&o)?)?;
            }
            Ok(())
        }
        Cmd::Archive {
            command: ArchiveCmd::RebuildMetadata { data_dir, object_store, discard_unarchived },
        } => {
            let report =
                silt::archive::rebuild_metadata(&data_dir, object_store.as_deref(), discard_unarchived)
                    .await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Cmd::Bucket { command: BucketCmd::Init { url, versioning } } => {
            let applied = silt::bucket::init(&url, versioning).await?;
            println!("{}", serde_json::to_string_pretty(&applied)?);
            Ok(())
        }
        Cmd::Bucket { command: BucketCmd::Settings } => {
            println!("{}", serde_json::to_string_pretty(&silt::bucket::BucketSettings::default())?);
            Ok(())
        }
        Cmd::Topic { command, server } => topic(command, &Client::new(&server.server)?).await,
        Cmd::Produce { topic, key_separator, partition, headers, linger, batch_max, server } => {
            let headers = headers
                .iter()
                .map(|h| {
                    h.split_once('=')
                        .map(|(k, v)| HeaderOut { key: k.to_string(), value: v.to_string() })
                        .with_context(|| format!("header '{h}' is not KEY=VALUE"))
                })
                .collect::<Result<Vec<_>>>()?;
            let sep = key_separator.map(|s| unescape(&s));
            produce(
                &Client::new(&server.server)?,
                &topic,
                sep,
                partition,
                headers,
                linger,
                batch_max.clamp(1, 10_000),
            )
            .await
        }
        Cmd::Consume { topic, group, max, timeout, mode, member, no_ack, server } => {
            let member = member.unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
            let mode = match mode {
                Mode::Exclusive => "exclusive",
                Mode::Shared => "shared",
            };
            consume(&Client::new(&server.server)?, &topic, &group, &member, mode, max, timeout, !no_ack).await
        }
        Cmd::Replay { topic, partition, from_offset, from_time, max, max_bytes, server } => {
            let from_time_ms = match from_time {
                Some(t) => Some(
                    humantime::parse_rfc3339_weak(&t)
                        .with_context(|| {
                            format!("--from-time '{t}' is not an RFC 3339 time like 2026-11-30T10:00:00Z")
                        })?
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(0),
                ),
                None => None,
            };
            let mut client = Client::new(&server.server)?;
            if let Some(bytes) = max_bytes {
                client = client.with_read_max_bytes(bytes as usize);
            }
            replay(&client, &topic, partition, from_offset, from_time_ms, max).await
        }
        Cmd::Group { command: GroupCmd::Describe { name }, server } => {
            let g = Client::new(&server.server)?.describe_group(&name).await?;
            println!("{}", serde_json::to_string_pretty(&g)?);
            Ok(())
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "consumer".into())
}

/// Turns `\t`, `\n`, `\r`, `\0` and `\\` into the characters they name.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

async fn topic(cmd: TopicCmd, client: &Client) -> Result<()> {
    let out = match cmd {
        TopicCmd::Create { name, partitions, config } => {
            client.create_topic(&name, partitions, &config_pairs(&config)?).await?
        }
        TopicCmd::Alter { name, config } => client.alter_topic_config(&name, &config_pairs(&config)?).await?,
        TopicCmd::List => client.list_topics().await?,
        TopicCmd::Describe { name } => client.describe_topic(&name).await?,
        TopicCmd::Delete { name } => {
            client.delete_topic(&name).await?;
            serde_json::json!({ "deleted": name })
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The long help of `--config`: every topic config (or every one `alter` may change) with what
/// it does and the values it takes, from the table metadata checks them against.
fn config_help(alterable_only: bool) -> String {
    use std::fmt::Write as _;
    let mut help = if alterable_only {
        "New value as NAME=VALUE (repeatable, at least one). Configs that can change:\n".to_string()
    } else {
        "Topic config as NAME=VALUE (repeatable):\n".to_string()
    };
    for c in silt_metadata::topic_config::TOPIC_CONFIGS.iter().filter(|c| c.alterable || !alterable_only) {
        let _ = writeln!(help, "  {}: {}; {}", c.name, c.meaning, c.bounds());
    }
    if alterable_only {
        let fixed: Vec<&str> = silt_metadata::topic_config::TOPIC_CONFIGS
            .iter()
            .filter(|c| !c.alterable)
            .map(|c| c.name)
            .collect();
        let _ = write!(help, "Fixed when the topic is created: {}.", fixed.join(", "));
    }
    help
}

/// `--config NAME=VALUE` arguments as a map.
fn config_pairs(args: &[String]) -> Result<BTreeMap<String, String>> {
    args.iter()
        .map(|c| {
            let (k, v) = c.split_once('=').with_context(|| format!("--config '{c}' is not NAME=VALUE"))?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

async fn produce(
    client: &Client,
    topic: &str,
    sep: Option<String>,
    partition: Option<u32>,
    headers: Vec<HeaderOut>,
    linger: Duration,
    batch_max: usize,
) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(batch_max * 4);
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).await.is_err() {
                break;
            }
        }
    });
    let mut stdout = std::io::stdout().lock();
    loop {
        let Some(first) = rx.recv().await else { break };
        let mut lines = vec![first];
        let deadline = tokio::time::Instant::now() + linger;
        while lines.len() < batch_max {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(line)) => lines.push(line),
                Ok(None) | Err(_) => break,
            }
        }
        let messages: Vec<OutMessage> = lines
            .into_iter()
            .map(|line| {
                let (key, value) = match &sep {
                    Some(sep) => match line.split_once(sep.as_str()) {
                        Some((k, v)) => (Some(k.to_string()), v.to_string()),
                        None => (None, line),
                    },
                    None => (None, line),
                };
                OutMessage { partition, key, value: Some(value), headers: headers.clone(), timestamp: None }
            })
            .collect();
        let ids = client.produce(topic, &messages).await?;
        for id in ids {
            writeln!(stdout, "{id}")?;
        }
        stdout.flush()?;
    }
    reader.abort();
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn consume(
    client: &Client,
    topic: &str,
    group: &str,
    member: &str,
    mode: &str,
    max: u64,
    timeout: Duration,
    ack: bool,
) -> Result<()> {
    let mut seen = 0u64;
    let mut stdout = std::io::stdout().lock();
    let mut idle_since = Instant::now();
    while seen < max {
        let remaining = timeout.saturating_sub(idle_since.elapsed());
        if remaining.is_zero() {
            break;
        }
        let poll = Poll {
            group: group.to_string(),
            member: member.to_string(),
            mode: mode.to_string(),
            max: (max - seen).min(1000) as u32,
            max_bytes: None,
            timeout_ms: remaining.as_millis().min(30_000) as u64,
            session_timeout_ms: 30_000,
        };
        let messages = client.poll(topic, &poll).await?;
        if messages.is_empty() {
            continue;
        }
        idle_since = Instant::now();
        let mut ids = Vec::with_capacity(messages.len());
        for m in &messages {
            writeln!(stdout, "{}", serde_json::to_string(m)?)?;
            ids.push(m.id.clone());
        }
        stdout.flush()?;
        seen += messages.len() as u64;
        if ack {
            client.ack(group, &ids).await?;
        }
    }
    if let Err(e) = client.leave(group, topic, member).await {
        eprintln!("warning: leaving group '{group}' failed: {e}");
    }
    Ok(())
}

async fn replay(
    client: &Client,
    topic: &str,
    partition: Option<u32>,
    from_offset: Option<u64>,
    from_time_ms: Option<i64>,
    max: Option<u64>,
) -> Result<()> {
    let partitions: Vec<u32> = match partition {
        Some(p) => vec![p],
        None => {
            let t = client.describe_topic(topic).await?;
            let n = t["partitions"].as_array().map_or(0, |a| a.len()) as u32;
            if n == 0 {
                bail!("topic '{topic}' has no partitions");
            }
            (0..n).collect()
        }
    };
    use std::io::IsTerminal;
    let progress = std::io::stderr().is_terminal();
    let mut left = max.unwrap_or(u64::MAX);
    let mut stdout = std::io::stdout().lock();
    let mut total = 0u64;
    // Record batches rather than the JSON replay: the agent does no JSON, and the lines printed
    // are what the JSON replay would show.
    let page_max = |left: u64| left.min(REPLAY_MAX as u64) as usize;
    for p in partitions {
        let mut page = client.read_batches(topic, p, from_offset, from_time_ms, page_max(left)).await?;
        let end = page.high_watermark;
        loop {
            let n = page.records.len() as u64;
            for record in page.records {
                writeln!(stdout, "{}", serde_json::to_string(&message_out(topic, p, record, None))?)?;
            }
            left -= n;
            total += n;
            if progress {
                let pct = (page.next_offset.min(end) * 100).checked_div(end).unwrap_or(100);
                eprint!(
                    "\r\x1b[2Kpartition {p}: offset {} of {end} ({pct}%), {total} messages",
                    page.next_offset
                );
            }
            if left == 0 || n == 0 || page.next_offset >= end {
                break;
            }
            page = client.read_batches(topic, p, Some(page.next_offset), None, page_max(left)).await?;
        }
        stdout.flush()?;
        if left == 0 {
            break;
        }
    }
    if progress {
        eprintln!();
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use clap::CommandFactory;
    use silt_metadata::topic_config::TOPIC_CONFIGS;

    fn long_help(sub: &str) -> String {
        let mut cli = super::Cli::command();
        let topic = cli.find_subcommand_mut("topic").unwrap();
        topic.find_subcommand_mut(sub).unwrap().render_long_help().to_string()
    }

    #[test]
    fn topic_config_help_lists_every_config_and_alter_names_what_it_may_change() {
        let (create, alter) = (long_help("create"), long_help("alter"));
        for c in TOPIC_CONFIGS {
            let line = format!("{}: {}; {}", c.name, c.meaning, c.bounds());
            assert!(create.contains(&line), "create --help lacks {line:?}:\n{create}");
            assert_eq!(alter.contains(&line), c.alterable, "alter --help and {}:\n{alter}", c.name);
        }
        assert!(
            alter.contains("Fixed when the topic is created: replication.factor, min.insync.replicas."),
            "{alter}"
        );
    }
}
