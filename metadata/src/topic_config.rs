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

/// One topic config, described once: its Kafka-style name, what it means, the values it
/// takes, whether it can change after creation, and where it lives in [`TopicConfig`]. Parsing,
/// bounds and their errors, `describe` and `alter`'s rules all come from [`TOPIC_CONFIGS`].
pub struct ConfigSpec {
    /// Kafka-style name.
    pub name: &'static str,
    /// What it does, for help texts.
    pub meaning: &'static str,
    /// Smallest value accepted.
    pub min: u64,
    /// Largest value accepted.
    pub max: u64,
    /// What `-1` means, where it is accepted (the config is then unset).
    pub minus_one: Option<&'static str>,
    /// Whether `alter` may change it after the topic is created.
    pub alterable: bool,
    /// The value in effect (`None` for `-1`).
    get: fn(&TopicConfig) -> Option<u64>,
    /// Sets the value, already checked against the bounds.
    put: fn(&mut TopicConfig, Option<u64>),
}

/// Every topic config.
pub const TOPIC_CONFIGS: &[ConfigSpec] = &[
    ConfigSpec {
        name: "segment.bytes",
        meaning: "roll the active segment when it would grow past this many bytes",
        min: 4096,
        max: 1 << 31,
        minus_one: None,
        alterable: true,
        get: |c| Some(c.segment_bytes),
        put: |c, v| c.segment_bytes = v.unwrap_or_default(),
    },
    ConfigSpec {
        name: "segment.ms",
        meaning: "roll the active segment when its first record is this old",
        min: 100,
        max: u64::MAX,
        minus_one: None,
        alterable: true,
        get: |c| Some(c.segment_ms),
        put: |c, v| c.segment_ms = v.unwrap_or_default(),
    },
    ConfigSpec {
        name: "retention.ms",
        meaning: "delete archived data older than this",
        min: 0,
        max: u64::MAX,
        minus_one: Some("keep it forever"),
        alterable: true,
        get: |c| c.retention_ms,
        put: |c, v| c.retention_ms = v,
    },
    ConfigSpec {
        name: "local.retention.ms",
        meaning: "keep an agent's copy of an archived segment this long after it was archived",
        min: 0,
        max: u64::MAX,
        minus_one: None,
        alterable: true,
        get: |c| Some(c.local_retention_ms),
        put: |c, v| c.local_retention_ms = v.unwrap_or_default(),
    },
    ConfigSpec {
        name: "local.retention.bytes",
        meaning: "keep at most this many bytes of archived segments on an agent, per partition",
        min: 0,
        max: u64::MAX,
        minus_one: Some("no limit"),
        alterable: true,
        get: |c| c.local_retention_bytes,
        put: |c, v| c.local_retention_bytes = v,
    },
    ConfigSpec {
        name: "max.message.bytes",
        meaning: "largest record batch a producer may send",
        min: 1,
        max: MAX_MESSAGE_BYTES_LIMIT,
        minus_one: None,
        alterable: true,
        get: |c| Some(c.max_message_bytes),
        put: |c, v| c.max_message_bytes = v.unwrap_or_default(),
    },
    ConfigSpec {
        name: "visibility.timeout.ms",
        meaning: "deliver an unacknowledged message again after this long",
        min: 100,
        max: 12 * 3600 * 1000,
        minus_one: None,
        alterable: true,
        get: |c| Some(c.visibility_timeout_ms),
        put: |c, v| c.visibility_timeout_ms = v.unwrap_or_default(),
    },
    ConfigSpec {
        name: "max.deliveries",
        meaning: "after this many deliveries without an ack a message moves to <topic>.dlq",
        min: 1,
        max: 1000,
        minus_one: None,
        alterable: true,
        get: |c| Some(u64::from(c.max_deliveries)),
        put: |c, v| c.max_deliveries = v.unwrap_or_default() as u32,
    },
    ConfigSpec {
        name: "replication.factor",
        meaning: "agents holding a replica of each segment (R)",
        min: 1,
        max: REPLICATION_FACTOR_MAX as u64,
        minus_one: None,
        alterable: false,
        get: |c| Some(u64::from(c.replication_factor)),
        put: |c, v| c.replication_factor = v.unwrap_or_default() as u32,
    },
    ConfigSpec {
        name: "min.insync.replicas",
        meaning: "replicas, the writer's own included, that must have fsynced a batch before it is acknowledged (W)",
        min: 1,
        max: REPLICATION_FACTOR_MAX as u64,
        minus_one: Some("a majority of replication.factor"),
        alterable: false,
        // The value in effect: a majority unless set.
        get: |c| Some(c.write_quorum() as u64),
        put: |c, v| c.min_insync_replicas = v.map(|v| v as u32),
    },
];

impl ConfigSpec {
    /// The spec of the config called `name`.
    pub fn named(name: &str) -> Option<&'static ConfigSpec> {
        TOPIC_CONFIGS.iter().find(|c| c.name == name)
    }

    /// The value in effect in `config`, as `describe` shows it.
    pub fn shown(&self, config: &TopicConfig) -> String {
        (self.get)(config).map_or("-1".to_string(), |v| v.to_string())
    }

    /// The values it takes, in words.
    pub fn bounds(&self) -> String {
        let range = match (self.min, self.max) {
            (0, u64::MAX) => "a non-negative integer".to_string(),
            (min, u64::MAX) => format!("at least {min}"),
            (min, max) => format!("between {min} and {max}"),
        };
        match self.minus_one {
            Some(meaning) => format!("{range}, or -1 ({meaning})"),
            None => range,
        }
    }
}

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
        for spec in TOPIC_CONFIGS.iter().filter(|c| !c.alterable) {
            if (spec.get)(&config) != (spec.get)(self) {
                return Err(MetadataError::InvalidConfig(format!(
                    "{} cannot be altered after creation (it is {}): create a new topic",
                    spec.name,
                    spec.shown(self)
                )));
            }
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

    /// Sets one config by its Kafka-style name, within its bounds ([`TOPIC_CONFIGS`]).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), MetadataError> {
        let Some(spec) = ConfigSpec::named(name) else {
            let known: Vec<&str> = TOPIC_CONFIGS.iter().map(|c| c.name).collect();
            return Err(MetadataError::InvalidConfig(format!(
                "unknown topic config '{name}'; known configs: {}",
                known.join(", ")
            )));
        };
        let invalid = || MetadataError::InvalidConfig(format!("{name}={value}: must be {}", spec.bounds()));
        let value = value.trim();
        let v = if value == "-1" && spec.minus_one.is_some() {
            None
        } else {
            let v = value.parse::<u64>().map_err(|_| invalid())?;
            if !(spec.min..=spec.max).contains(&v) {
                return Err(invalid());
            }
            Some(v)
        };
        (spec.put)(self, v);
        Ok(())
    }

    /// The config as Kafka-style name/value pairs, as `describe` shows it: the values in
    /// effect (`min.insync.replicas` a majority of `replication.factor` unless set).
    pub fn to_named(&self) -> BTreeMap<String, String> {
        TOPIC_CONFIGS.iter().map(|c| (c.name.to_string(), c.shown(self))).collect()
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

    /// Every config takes its bounds and refuses one past them, changing nothing; -1 only
    /// where it means something; every default is within bounds; describe shows what was set.
    #[test]
    fn every_config_takes_the_values_its_spec_names_and_no_other() {
        let default = TopicConfig::default();
        for spec in TOPIC_CONFIGS {
            let name = spec.name;
            let shown = spec.shown(&default);
            assert!(
                shown == "-1" && spec.minus_one.is_some()
                    || shown.parse::<u64>().is_ok_and(|v| (spec.min..=spec.max).contains(&v)),
                "{name}'s default {shown}"
            );
            for v in [spec.min, spec.max] {
                let mut c = TopicConfig::default();
                c.set(name, &v.to_string()).unwrap_or_else(|e| panic!("{name}={v}: {e}"));
                assert_eq!(c.to_named()[name], v.to_string(), "{name}={v}");
            }
            let refused: Vec<String> = [
                spec.min.checked_sub(1).map(|v| v.to_string()),
                spec.max.checked_add(1).map(|v| v.to_string()),
                Some("x".into()),
                Some("1.5".into()),
                spec.minus_one.is_none().then(|| "-1".into()),
            ]
            .into_iter()
            .flatten()
            .collect();
            for v in refused {
                let mut c = TopicConfig::default();
                let e = c.set(name, &v).expect_err(&format!("{name}={v}")).to_string();
                assert!(e.contains(&format!("{name}={v}: must be {}", spec.bounds())), "{e}");
                assert_eq!(c, default, "{name}={v} changed nothing");
            }
            if spec.minus_one.is_some() {
                let mut c = TopicConfig::default();
                c.set(name, "-1").unwrap();
                assert_eq!(
                    TopicConfig::from_overrides(&c.to_named()).unwrap().to_named()[name],
                    spec.shown(&c)
                );
            }
        }
    }

    /// `alter` refuses a change of exactly the configs that are not alterable.
    #[test]
    fn alter_changes_every_alterable_config_and_refuses_the_others() {
        let created = TopicConfig::from_overrides(&BTreeMap::from([(
            "replication.factor".to_string(),
            "3".to_string(),
        )]))
        .unwrap();
        for spec in TOPIC_CONFIGS {
            let now: u64 = spec.shown(&created).parse().unwrap_or(spec.min);
            let other = if now < spec.max && spec.name != "min.insync.replicas" { now + 1 } else { now - 1 };
            let change = BTreeMap::from([(spec.name.to_string(), other.to_string())]);
            match created.altered(&change) {
                Ok(c) => {
                    assert!(spec.alterable, "{} was altered", spec.name);
                    assert_eq!(c.to_named()[spec.name], other.to_string());
                }
                Err(e) => {
                    assert!(!spec.alterable, "{}: {e}", spec.name);
                    assert!(e.to_string().contains("cannot be altered after creation"), "{e}");
                }
            }
        }
    }

    /// docs/api.md's table of configs names every config with its default.
    #[test]
    fn the_api_docs_list_every_config() {
        let docs = include_str!("../../docs/api.md");
        for spec in TOPIC_CONFIGS {
            let row = format!("| `{}` | ", spec.name);
            assert!(docs.contains(&row), "docs/api.md has no row for {}", spec.name);
        }
    }
}
