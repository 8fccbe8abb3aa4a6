//! The register in metadata that both harnesses' clients write and read for the
//! linearizability check (`metadata-not-linearizable`): the `retention.ms` of a topic of its
//! own, which nothing else reads or writes, each write a value no other write wrote.

use std::collections::BTreeMap;

use silt_metadata::{Command, MetadataState};

/// The register's topic.
pub const TOPIC: &str = "register";
/// What the register holds before any write: the topic is created with it.
pub const INITIAL: u64 = 1_000_000;
/// How many clients write and read the register, one operation at a time each.
pub const CLIENTS: u64 = 3;

/// The register's topic's configs at its creation.
pub fn topic_config() -> BTreeMap<String, String> {
    BTreeMap::from([("retention.ms".to_string(), INITIAL.to_string())])
}

/// The `n`th value client `client` writes (`n` from 1): unique, and never [`INITIAL`].
pub fn value(client: u64, n: u64) -> u64 {
    (client + 1) * INITIAL + n
}

/// The command that writes `value` to the register.
pub fn write(value: u64) -> Command {
    Command::AlterTopicConfig {
        name: TOPIC.to_string(),
        topic_id: None,
        config: BTreeMap::from([("retention.ms".to_string(), value.to_string())]),
    }
}

/// What the register holds in `state` (`None`: its topic does not exist).
pub fn read(state: &MetadataState) -> Option<u64> {
    state.topics.get(TOPIC).and_then(|t| t.config.retention_ms)
}
