//! Per-topic configuration, named after Kafka's topic configs where one exists.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::MetadataError;

/// Largest number of partitions a topic may have.
pub const PARTITIONS_MAX: u32 = 1024;
/// Largest message a topic may be configured to accept (64 MiB).
pub const MAX_MESSAGE_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// A topic's configuration. Every field has a default; `set` parses the Kafka-style names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// `segment.bytes`: the active segment rolls once it would grow past this size.
    pub segment_bytes: u64,
    /// `segment.ms`: the active segment rolls once it is this old, even when quiet.
    pub segment_ms: u64,
    /// `retention.ms`: archived data older than this is deleted; `None` keeps it forever.
    pub retention_ms: Option<u64>,
    /// `local.retention.ms`: how long an agent keeps its copy of an archived segment.
    pub local_retention_ms: u64,
    /// `local.retention.bytes`: most bytes of archived segments an agent keeps per partition;
    /// `None` for no limit (then only `local.retention.ms` applies).
    #[serde(default)]
    pub local_retention_bytes: Option<u64>,
    /// `max.message.bytes`: the largest record batch a producer may send.
    pub max_message_bytes: u64,
    /// `visibility.timeout.ms`: an unacknowledged message is redelivered after this long.
    pub visibility_timeout_ms: u64,
    /// `max.deliveries`: after this many deliveries without an ack a message goes to `<topic>.dlq`.
    pub max_deliveries: u32,
    /// `replication.factor`: how many agents hold a replica of each segment (R).
    #[serde(default = "one")]
    pub replication_factor: u32,
    /// `min.insync.replicas`: how many replicas must have fsynced a batch before its producer
    /// is acknowledged (W); `None` for a majority, floor(R/2)+1.
    #[serde(default)]
    pub min_insync_replicas: Option<u32>,
}

fn one() -> u32 {
    1
}

/// Largest replication factor a topic may have.
pub const REPLICATION_FACTOR_MAX: u32 = 7;

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 128 * 1024 * 1024,
            segment_ms: Duration::from_secs(10 * 60).as_millis() as u64,
            retention_ms: Some(Duration::from_secs(7 * 24 * 3600).as_millis() as u64),
            local_retention_ms: Duration::from_secs(10 * 60).as_millis() as u64,
            local_retention_bytes: None,
            max_message_bytes: 1024 * 1024,
            visibility_timeout_ms: 30_000,
            max_deliveries: 5,
            replication_factor: 1,
            min_insync_replicas: None,
        }
    }
}

/// The config names `TopicConfig::set` accepts, for help texts and errors.
pub const TOPIC_CONFIG_NAMES: &[&str] = &[
    "segment.bytes",
    "segment.ms",
    "retention.ms",
    "local.retention.ms",
    "local.retention.bytes",
    "max.message.bytes",
    "visibility.timeout.ms",
    "max.deliveries",
    "replication.factor",
    "min.insync.replicas",
];

impl TopicConfig {
    /// Builds a config from defaults overridden by `overrides`, validating every entry.
    pub fn from_overrides(overrides: &BTreeMap<String, String>) -> Result<Self, MetadataError> {
        let mut config = Self::default();
        for (name, value) in overrides {
            config.set(name, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// This config with `changes` (Kafka-style names) applied, validated as a whole.
    /// `replication.factor` cannot change: each segment keeps the ensemble it was opened with,
    /// and the sealed ones would count as under-replicated against a larger one. Nor can the
    /// write quorum (`min.insync.replicas`): recovering an open segment reads R - W + 1 of its
    /// replicas, which holds every acknowledged batch only for the W it was written with.
    pub fn altered(&self, changes: &BTreeMap<String, String>) -> Result<Self, MetadataError> {
        if changes.is_empty() {
            return Err(MetadataError::InvalidConfig("no config to alter".into()));
        }
        let mut config = self.clone();
        for (name, value) in changes {
            config.set(name, value)?;
        }
        if config.replication_factor != self.replication_factor {
            return Err(MetadataError::InvalidConfig(format!(
                "replication.factor cannot be altered after creation (it is {}): create a new topic",
                self.replication_factor
            )));
        }
        if config.write_quorum() != self.write_quorum() {
            return Err(MetadataError::InvalidConfig(format!(
                "min.insync.replicas cannot be altered after creation (it is {}): create a new topic",
                self.write_quorum()
            )));
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules that span several configs.
    pub fn validate(&self) -> Result<(), MetadataError> {
        if let Some(w) = self.min_insync_replicas {
            if w > self.replication_factor {
                return Err(MetadataError::InvalidConfig(format!(
                    "min.insync.replicas={w} is more than replication.factor={}",
                    self.replication_factor
                )));
            }
        }
        Ok(())
    }

    /// W: how many replicas (the writer's own included) must have fsynced a batch before it
    /// is acknowledged.
    pub fn write_quorum(&self) -> usize {
        self.min_insync_replicas.unwrap_or(self.replication_factor / 2 + 1) as usize
    }

    /// Sets one config by its Kafka-style name.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), MetadataError> {
        let invalid = |why: &str| MetadataError::InvalidConfig(format!("{name}={value}: {why}"));
        let number = || -> Result<u64, MetadataError> {
            value.trim().parse::<u64>().map_err(|_| invalid("expected a non-negative integer"))
        };
        match name {
            "segment.bytes" => {
                let v = number()?;
                if !(4096..=(1u64 << 31)).contains(&v) {
                    return Err(invalid("must be between 4096 and 2147483648"));
                }
                self.segment_bytes = v;
            }
            "segment.ms" => {
                let v = number()?;
                if v < 100 {
                    return Err(invalid("must be at least 100"));
                }
                self.segment_ms = v;
            }
            "retention.ms" => {
                self.retention_ms = if value.trim() == "-1" { None } else { Some(number()?) };
            }
            "local.retention.ms" => self.local_retention_ms = number()?,
            "local.retention.bytes" => {
                self.local_retention_bytes = if value.trim() == "-1" { None } else { Some(number()?) };
            }
            "max.message.bytes" => {
                let v = number()?;
                if !(1..=MAX_MESSAGE_BYTES_LIMIT).contains(&v) {
                    return Err(invalid(&format!("must be between 1 and {MAX_MESSAGE_BYTES_LIMIT}")));
                }
                self.max_message_bytes = v;
            }
            "visibility.timeout.ms" => {
                let v = number()?;
                if !(100..=12 * 3600 * 1000).contains(&v) {
                    return Err(invalid("must be between 100 and 43200000 (12 hours)"));
                }
                self.visibility_timeout_ms = v;
            }
            "max.deliveries" => {
                let v = number()?;
                if !(1..=1000).contains(&v) {
                    return Err(invalid("must be between 1 and 1000"));
                }
                self.max_deliveries = v as u32;
            }
            "replication.factor" => {
                let v = number()?;
                if !(1..=u64::from(REPLICATION_FACTOR_MAX)).contains(&v) {
                    return Err(invalid(&format!("must be between 1 and {REPLICATION_FACTOR_MAX}")));
                }
                self.replication_factor = v as u32;
            }
            "min.insync.replicas" => {
                self.min_insync_replicas = if value.trim() == "-1" {
                    None
                } else {
                    let v = number()?;
                    if !(1..=u64::from(REPLICATION_FACTOR_MAX)).contains(&v) {
                        return Err(invalid(&format!(
                            "must be between 1 and {REPLICATION_FACTOR_MAX} (or -1 for a majority of replication.factor)"
                        )));
                    }
                    Some(v as u32)
                };
            }
            _ => {
                return Err(MetadataError::InvalidConfig(format!(
                    "unknown topic config '{name}'; known configs: {}",
                    TOPIC_CONFIG_NAMES.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// The config as Kafka-style name/value pairs, as `describe` shows it.
    pub fn to_named(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("segment.bytes".into(), self.segment_bytes.to_string());
        m.insert("segment.ms".into(), self.segment_ms.to_string());
        m.insert("retention.ms".into(), self.retention_ms.map_or("-1".to_string(), |v| v.to_string()));
        m.insert("local.retention.ms".into(), self.local_retention_ms.to_string());
        m.insert(
            "local.retention.bytes".into(),
            self.local_retention_bytes.map_or("-1".to_string(), |v| v.to_string()),
        );
        m.insert("max.message.bytes".into(), self.max_message_bytes.to_string());
        m.insert("visibility.timeout.ms".into(), self.visibility_timeout_ms.to_string());
        m.insert("max.deliveries".into(), self.max_deliveries.to_string());
        m.insert("replication.factor".into(), self.replication_factor.to_string());
        m.insert("min.insync.replicas".into(), self.write_quorum().to_string());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_round_trip() {
        let mut c = TopicConfig::default();
        c.set("segment.bytes", "1048576").unwrap();
        c.set("retention.ms", "-1").unwrap();
        let back = TopicConfig::from_overrides(&c.to_named()).unwrap();
        // `describe` shows the write quorum in effect (a majority unless set).
        c.min_insync_replicas = Some(c.write_quorum() as u32);
        assert_eq!(back, c);
        assert_eq!(back.segment_bytes, 1048576);
        assert_eq!(back.retention_ms, None);
    }

    #[test]
    fn rejects_unknown_and_bad_values() {
        let mut c = TopicConfig::default();
        let e = c.set("segment.bites", "1").unwrap_err().to_string();
        assert!(e.contains("unknown topic config 'segment.bites'"), "{e}");
        assert!(c.set("segment.bytes", "12").is_err());
        assert!(c.set("max.message.bytes", "x").is_err());
        assert!(c.set("max.deliveries", "0").is_err());
        assert_eq!(c, TopicConfig::default(), "a rejected value changes nothing");
    }

    #[test]
    fn write_quorum_is_a_majority_unless_set() {
        let quorum = |r: &str, w: Option<&str>| {
            let mut o = BTreeMap::from([("replication.factor".to_string(), r.to_string())]);
            if let Some(w) = w {
                o.insert("min.insync.replicas".into(), w.into());
            }
            TopicConfig::from_overrides(&o).map(|c| c.write_quorum())
        };
        assert_eq!(quorum("1", None).unwrap(), 1);
        assert_eq!(quorum("3", None).unwrap(), 2);
        assert_eq!(quorum("5", None).unwrap(), 3);
        assert_eq!(quorum("3", Some("3")).unwrap(), 3);
        let e = quorum("3", Some("4")).unwrap_err().to_string();
        assert!(e.contains("more than replication.factor=3"), "{e}");
        assert!(quorum("0", None).is_err());
        assert!(quorum("8", None).is_err());
    }
}
