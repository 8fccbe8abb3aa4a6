//! Workload files: what one benchmark produces and reads, in OpenMessaging Benchmark's terms
//! (topics, partitions, message size, producer rate), as small TOML files in `bench/workloads/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

/// One workload file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Name, as OpenMessaging Benchmark names its workloads (`1-topic-16-partitions-1kb`).
    pub name: String,
    /// What it measures.
    pub kind: WorkloadKind,
    /// Topics (OpenMessaging Benchmark's "N-topics"); every topic has `partitions` partitions.
    /// Produce workloads only.
    #[serde(default = "one")]
    pub topics: u32,
    /// Partitions of each topic (a Silt topic's partitions; one JetStream stream each).
    pub partitions: u32,
    /// Size of every message's value (payload) in bytes.
    pub message_bytes: usize,
    /// Replication factors to run. Silt gets `replication.factor=R` as a topic config for
    /// every R above 1; JetStream gets `num_replicas=R` on a cluster of R servers.
    pub replication_factors: Vec<u32>,
    /// Topic configs every Silt topic of this workload is created with.
    #[serde(default)]
    pub silt_topic_config: BTreeMap<String, String>,
    /// Producer and consumer settings (`kind = "produce"`).
    pub produce: Option<ProduceSpec>,
    /// Archive and replay settings (`kind = "replay"`).
    pub replay: Option<ReplaySpec>,
}

/// The kinds of workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Producers at fixed rates and at their maximum, consumers reading along.
    Produce,
    /// Write a volume, let it be archived as Parquet, read it all back from the bucket.
    Replay,
}

/// Producers and consumers of a `produce` workload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceSpec {
    /// Concurrent producer tasks; producer `i` writes partitions `i`, `i + producers`, ... in turn.
    pub producers: u32,
    /// Messages per produce request: one RecordBatch for Silt, that many publishes in flight
    /// for JetStream, acknowledged together.
    pub batch_messages: u32,
    /// Requests in flight per producer.
    pub max_inflight: u32,
    /// At a fixed rate, a batch is sent once it is full or its first message has waited this
    /// long (Kafka's `linger.ms`); at the max rate batches are always full.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Consumer-group members reading along (Silt); JetStream gets one pull consumer per stream.
    pub consumers: u32,
    /// Messages per poll / fetch.
    pub consume_max: u32,
    /// Time before measuring starts.
    #[serde(with = "humantime_serde")]
    pub warmup: Duration,
    /// Time measured.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Run once as fast as the producers can go.
    pub max_rate: bool,
    /// Then at these fractions of the rate the max run reached (each system its own).
    #[serde(default)]
    pub fractions_of_max: Vec<f64>,
    /// And at these fixed rates, the same for every system (messages per second).
    #[serde(default)]
    pub fixed_rates_msgs_per_s: Vec<u64>,
}

/// A `replay` workload: volume written, archived, then read back cold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySpec {
    /// Bytes of message values written and read back, in MiB.
    pub total_mib: u64,
    /// Producer tasks while writing.
    pub producers: u32,
    /// Messages per produce request while writing.
    pub batch_messages: u32,
    /// Messages per replay page (the replay API's `max`, at most 10,000).
    pub page_messages: usize,
    /// Longest wait for the compactor to archive everything.
    #[serde(with = "humantime_serde")]
    pub archive_timeout: Duration,
}

impl Workload {
    /// Reads and checks a workload file.
    pub fn load(path: &Path) -> anyhow::Result<Workload> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let w = Workload::parse(&text).with_context(|| format!("in {}", path.display()))?;
        Ok(w)
    }

    /// Parses and checks a workload from TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Workload> {
        let w: Workload = toml::from_str(text)?;
        w.validate()?;
        Ok(w)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if !(1..=1024).contains(&self.partitions) {
            bail!("partitions must be 1 to 1024 (per topic), not {}", self.partitions);
        }
        if !(1..=100).contains(&self.topics) {
            bail!("topics must be 1 to 100, not {}", self.topics);
        }
        if self.topics > 1 && self.kind != WorkloadKind::Produce {
            bail!("only a produce workload can have more than one topic");
        }
        if !(16..=1 << 20).contains(&self.message_bytes) {
            bail!("message_bytes must be 16 (the send time is written in the first 16) to 1 MiB");
        }
        if self.replication_factors.is_empty()
            || self.replication_factors.iter().any(|r| ![1, 3, 5].contains(r))
        {
            bail!("replication_factors must list 1, 3 or 5");
        }
        match self.kind {
            WorkloadKind::Produce => {
                let Some(p) = &self.produce else { bail!("a produce workload needs a [produce] section") };
                if p.producers == 0 || p.batch_messages == 0 || p.max_inflight == 0 || p.consumers == 0 {
                    bail!("producers, batch_messages, max_inflight and consumers must be at least 1");
                }
                if !(1..=10_000).contains(&p.consume_max) {
                    bail!("consume_max must be 1 to 10,000");
                }
                if p.duration.is_zero() {
                    bail!("duration must be above zero");
                }
                if p.fractions_of_max.iter().any(|f| !(*f > 0.0 && *f < 1.0)) {
                    bail!("fractions_of_max must be between 0 and 1");
                }
                if !p.max_rate && !p.fractions_of_max.is_empty() {
                    bail!("fractions_of_max needs max_rate = true");
                }
                if p.fixed_rates_msgs_per_s.contains(&0) {
                    bail!("fixed rates must be above zero");
                }
            }
            WorkloadKind::Replay => {
                let Some(r) = &self.replay else { bail!("a replay workload needs a [replay] section") };
                if r.total_mib == 0 || r.producers == 0 || r.batch_messages == 0 {
                    bail!("total_mib, producers and batch_messages must be at least 1");
                }
                if !(1..=10_000).contains(&r.page_messages) {
                    bail!("page_messages must be 1 to 10,000");
                }
            }
        }
        Ok(())
    }

    /// Partitions of all topics together.
    pub fn total_partitions(&self) -> u32 {
        self.topics * self.partitions
    }

    /// The Silt topic configs for replication factor `r`: the workload's own, plus
    /// `replication.factor`.
    pub fn silt_topic_config(&self, r: u32) -> BTreeMap<String, String> {
        let mut c = self.silt_topic_config.clone();
        c.insert("replication.factor".into(), r.to_string());
        c
    }
}

fn one() -> u32 {
    1
}

/// Loads every `*.toml` file of a folder, sorted by file name.
pub fn load_dir(dir: &Path) -> anyhow::Result<Vec<Workload>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Workload::load(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_workloads_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let all = load_dir(&dir).unwrap();
        let names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "1-topic-1-partition-100b",
                "1-topic-16-partitions-1kb",
                "1000-partitions-10-msgs-per-s",
                "10000-partitions-1-msg-per-s",
                "replay-cold"
            ]
        );
        let many = &all[3];
        assert_eq!((many.topics, many.partitions, many.total_partitions()), (10, 1000, 10_000));
        for w in &all {
            assert_eq!(w.replication_factors, [1, 3], "{}", w.name);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let ok = r#"
            name = "x"
            kind = "replay"
            partitions = 1
            message_bytes = 100
            replication_factors = [1]
            [replay]
            total_mib = 1
            producers = 1
            batch_messages = 10
            page_messages = 1000
            archive_timeout = "10s"
        "#;
        Workload::parse(ok).unwrap();
        let e = Workload::parse(&ok.replace("partitions = 1", "partitions = 1\nparitions = 2")).unwrap_err();
        assert!(format!("{e:#}").contains("paritions"), "{e:#}");
        assert!(Workload::parse(&ok.replace("message_bytes = 100", "message_bytes = 8")).is_err());
        assert!(Workload::parse(&ok.replace("kind = \"replay\"", "kind = \"produce\"")).is_err());
        assert!(Workload::parse(&ok.replace("partitions = 1", "partitions = 1025")).is_err());
        let e = Workload::parse(&ok.replace("partitions = 1", "topics = 2\npartitions = 1")).unwrap_err();
        assert!(format!("{e:#}").contains("only a produce workload"), "{e:#}");
    }

    #[test]
    fn replication_above_one_is_a_topic_config() {
        let w = Workload::parse(
            r#"
            name = "x"
            kind = "replay"
            partitions = 1
            message_bytes = 100
            replication_factors = [1, 3]
            silt_topic_config = { "segment.bytes" = "1048576" }
            [replay]
            total_mib = 1
            producers = 1
            batch_messages = 10
            page_messages = 1000
            archive_timeout = "10s"
        "#,
        )
        .unwrap();
        assert_eq!(w.silt_topic_config(1)["replication.factor"], "1");
        assert_eq!(w.silt_topic_config(3)["replication.factor"], "3");
        assert_eq!(w.silt_topic_config(3)["segment.bytes"], "1048576");
    }
}
