//! The agent's Prometheus metrics, named `silt_agent_<what>_<unit>`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels for per-topic counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// Topic name.
    pub topic: String,
}

/// Labels for consumer lag.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LagLabels {
    /// Group name.
    pub group: String,
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: u32,
}

/// Labels for requests passed on to other agents.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabels {
    /// `append`, `read`, `collect` or `ack`.
    pub kind: &'static str,
}

/// Labels for ensemble repairs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    /// `replaced` (a member that is gone), `added` (a segment sealed short of members) or
    /// `failed`.
    pub outcome: &'static str,
}

/// Labels for heartbeats to metadata.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeartbeatLabels {
    /// `renewed` (metadata took it and the lease counts from its sending), `unconfirmed`
    /// (metadata took it, but this agent's copy of metadata does not show its registration
    /// yet), `lapsed` (the lease had lapsed: the agent registers again), `failed` (an error),
    /// `timed_out` (no answer within a fifth of the lease) or `copy_stale` (not sent: the
    /// agent's copy of metadata is too old for it to answer for its partitions, so it lets its
    /// lease lapse).
    pub outcome: &'static str,
}

/// Labels for one follower of a partition this agent writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabels {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: u32,
    /// The follower's agent id.
    pub replica: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// Other components' metrics (compactor, object store, cold reader), already encoded.
    sources: std::sync::Mutex<Vec<Box<dyn Fn() -> String + Send + Sync>>>,
    /// Time from receiving a produce request to answering it, after fsync.
    pub produce_latency_seconds: Histogram,
    /// Time of one group commit (write + fsync).
    pub fsync_seconds: Histogram,
    /// Records appended.
    pub records_in: Family<TopicLabels, Counter>,
    /// Bytes appended (record batch bytes).
    pub bytes_in: Family<TopicLabels, Counter>,
    /// Records delivered to consumers and replays.
    pub records_out: Family<TopicLabels, Counter>,
    /// Bytes delivered (record batch bytes read).
    pub bytes_out: Family<TopicLabels, Counter>,
    /// Records between a group's ack floor and the end of the partition.
    pub consumer_lag_records: Family<LagLabels, Gauge>,
    /// Messages moved to a dead-letter topic.
    pub dead_lettered: Family<TopicLabels, Counter>,
    /// Requests passed on to the agent that writes the partition.
    pub forwarded: Family<ForwardLabels, Counter>,
    /// Partitions metadata names this agent writer of.
    pub partitions_written: Gauge,
    /// Registrations with metadata (the first, and one after every lapsed lease).
    pub registrations: Counter,
    /// Heartbeats to metadata, by outcome.
    pub heartbeats: Family<HeartbeatLabels, Counter>,
    /// Records a follower of the open segment has not acknowledged yet.
    pub replication_lag_records: Family<ReplicaLabels, Gauge>,
    /// How long a follower's oldest unacknowledged group has waited (ms).
    pub replication_lag_ms: Family<ReplicaLabels, Gauge>,
    /// Time a follower takes to append and fsync a writer's group, on the follower.
    pub replica_append_seconds: Histogram,
    /// Open segments this agent writes whose ensemble lost a follower or is short of
    /// replication.factor.
    pub under_replicated_partitions: Gauge,
    /// Completed rounds of the agent's housekeeping (writers matched to metadata, archived
    /// local copies dropped, repairs started), one about every 250 ms.
    pub housekeeping_rounds: Counter,
    /// Partitions this agent handed to another agent because it could not reach the agents
    /// it needed while metadata counted them live.
    pub writer_handoffs: Counter,
    /// Partitions this agent moved to another agent to balance the writers.
    pub writer_rebalances: Counter,
    /// Ensemble repairs this agent ran (it held the sealed segment copied), by outcome.
    pub ensemble_repairs: Family<RepairLabels, Counter>,
    /// Offsets this agent declared lost (written, never acknowledged, on no disk left), by topic.
    pub declared_lost_offsets: Family<TopicLabels, Counter>,
    /// Disk space the agent's local logs take (`<data_dir>/log`: segments, their indexes and
    /// the zeros open segments keep ahead of their data), as allocated by the filesystem.
    pub local_log_bytes: Gauge,
    /// Bytes free for the agent on the filesystem of its data directory.
    pub disk_free_bytes: Gauge,
    /// Size of the filesystem of its data directory.
    pub disk_size_bytes: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("silt_agent");
        let produce_latency_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        let fsync_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 18));
        let records_in = Family::<TopicLabels, Counter>::default();
        let bytes_in = Family::<TopicLabels, Counter>::default();
        let records_out = Family::<TopicLabels, Counter>::default();
        let bytes_out = Family::<TopicLabels, Counter>::default();
        let consumer_lag_records = Family::<LagLabels, Gauge>::default();
        let dead_lettered = Family::<TopicLabels, Counter>::default();
        let forwarded = Family::<ForwardLabels, Counter>::default();
        let ensemble_repairs = Family::<RepairLabels, Counter>::default();
        let declared_lost_offsets = Family::<TopicLabels, Counter>::default();
        let partitions_written = Gauge::default();
        let local_log_bytes = Gauge::default();
        let disk_free_bytes = Gauge::default();
        let disk_size_bytes = Gauge::default();
        let registrations = Counter::default();
        let heartbeats = Family::<HeartbeatLabels, Counter>::default();
        let replication_lag_records = Family::<ReplicaLabels, Gauge>::default();
        let replication_lag_ms = Family::<ReplicaLabels, Gauge>::default();
        let replica_append_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 18));
        let under_replicated_partitions = Gauge::default();
        let housekeeping_rounds = Counter::default();
        let writer_handoffs = Counter::default();
        let writer_rebalances = Counter::default();
        registry.register(
            "replication_lag_records",
            "Records a follower of the open segment has not acknowledged",
            replication_lag_records.clone(),
        );
        registry.register(
            "replication_lag_ms",
            "How long a follower's oldest unacknowledged group has waited",
            replication_lag_ms.clone(),
        );
        registry.register(
            "replica_append_seconds",
            "On a follower: appending and fsyncing one group a writer sent",
            replica_append_seconds.clone(),
        );
        registry.register(
            "under_replicated_partitions",
            "Partitions this agent writes whose open segment has fewer followers than replication.factor - 1",
            under_replicated_partitions.clone(),
        );
        registry.register(
            "forwarded",
            "Requests passed on to the agent that writes the partition",
            forwarded.clone(),
        );
        registry.register(
            "housekeeping_rounds",
            "Completed rounds of housekeeping: writers matched to metadata, archived local copies dropped, repairs started",
            housekeeping_rounds.clone(),
        );
        registry.register(
            "ensemble_repairs",
            "Sealed segments this agent had copied to another agent, by outcome: replaced (a member was gone), added (sealed short of members), failed",
            ensemble_repairs.clone(),
        );
        registry.register(
            "declared_lost_offsets",
            "Offsets this agent declared lost: written but never acknowledged, on no disk left (every holder's disk was replaced); reads step over them",
            declared_lost_offsets.clone(),
        );
        registry.register(
            "writer_handoffs",
            "Partitions handed to another agent because live agents did not answer this one",
            writer_handoffs.clone(),
        );
        registry.register(
            "writer_rebalances",
            "Partitions this agent moved to another agent to balance the writers (it stopped writing each before the move)",
            writer_rebalances.clone(),
        );
        registry.register("partitions_written", "Partitions this agent writes", partitions_written.clone());
        registry.register_with_unit(
            "local_log",
            "Disk space the agent's local logs take (segments, indexes and the zeros open segments keep ahead of their data), measured every 10 s",
            prometheus_client::registry::Unit::Bytes,
            local_log_bytes.clone(),
        );
        registry.register_with_unit(
            "disk_free",
            "Bytes free for the agent on the filesystem of its data directory, measured every 10 s",
            prometheus_client::registry::Unit::Bytes,
            disk_free_bytes.clone(),
        );
        registry.register_with_unit(
            "disk_size",
            "Size of the filesystem of the agent's data directory, measured every 10 s",
            prometheus_client::registry::Unit::Bytes,
            disk_size_bytes.clone(),
        );
        registry.register(
            "registrations",
            "Registrations with metadata: the first, and one after every lapsed lease",
            registrations.clone(),
        );
        registry.register(
            "heartbeats",
            "Heartbeats to metadata, by outcome: renewed, unconfirmed (the copy of metadata does not show the registration yet), lapsed (the agent registers again), failed, timed_out",
            heartbeats.clone(),
        );
        registry.register(
            "produce_latency_seconds",
            "Produce request latency until acknowledged (after fsync)",
            produce_latency_seconds.clone(),
        );
        registry.register(
            "fsync_seconds",
            "Duration of one group commit: write and fsync",
            fsync_seconds.clone(),
        );
        registry.register("records_in", "Records appended", records_in.clone());
        registry.register("bytes_in", "Record batch bytes appended", bytes_in.clone());
        registry.register("records_out", "Records delivered to consumers and replays", records_out.clone());
        registry.register(
            "bytes_out",
            "Record batch bytes read for consumers and replays",
            bytes_out.clone(),
        );
        registry.register(
            "consumer_lag_records",
            "Records between a group's ack floor and the partition end",
            consumer_lag_records.clone(),
        );
        registry.register("dead_lettered", "Messages moved to a dead-letter topic", dead_lettered.clone());
        Metrics {
            registry,
            sources: std::sync::Mutex::new(Vec::new()),
            produce_latency_seconds,
            fsync_seconds,
            records_in,
            bytes_in,
            records_out,
            bytes_out,
            consumer_lag_records,
            dead_lettered,
            forwarded,
            partitions_written,
            local_log_bytes,
            disk_free_bytes,
            disk_size_bytes,
            registrations,
            heartbeats,
            replication_lag_records,
            replication_lag_ms,
            replica_append_seconds,
            under_replicated_partitions,
            housekeeping_rounds,
            writer_handoffs,
            writer_rebalances,
            ensemble_repairs,
            declared_lost_offsets,
        }
    }

    /// The metrics in Prometheus text format, with every added source's metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).is_err() {
            out.clear();
        }
        for source in crate::sync::lock(&self.sources).iter() {
            out.push_str(&source());
        }
        out.push_str("# EOF\n");
        out
    }

    /// Adds another component's metrics, encoded in the text format without `# EOF`.
    pub fn add_source(&self, source: impl Fn() -> String + Send + Sync + 'static) {
        crate::sync::lock(&self.sources).push(Box::new(source));
    }

    /// Labels for a topic.
    pub fn topic(topic: &str) -> TopicLabels {
        TopicLabels { topic: topic.to_string() }
    }
}
