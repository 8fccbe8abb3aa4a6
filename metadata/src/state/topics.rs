//! Topics: create, delete, alter, and a rebuild's restores.

use super::*;

impl MetadataState {
    /// A new topic with the next id, its partitions given writers.
    pub(super) fn create_topic(
        &mut self,
        name: &str,
        partitions: u32,
        config: &BTreeMap<String, String>,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        if self.topics.contains_key(name) {
            return Err(MetadataError::TopicExists(name.to_string()));
        }
        if partitions == 0 || partitions > PARTITIONS_MAX {
            return Err(MetadataError::InvalidArgument(format!(
                "a topic needs between 1 and {PARTITIONS_MAX} partitions, got {partitions}"
            )));
        }
        let config = TopicConfig::from_overrides(config)?;
        let topic = Topic {
            name: name.to_string(),
            id: self.next_topic_id,
            config,
            partitions: vec![Partition::default(); partitions as usize],
            created_ms: now_ms,
            config_version: 0,
        };
        self.next_topic_id += 1;
        self.topics.insert(name.to_string(), topic);
        self.advance_clock(now_ms);
        self.assign_writers();
        Ok(Response::Topic { topic: self.topics[name].clone() })
    }

    /// Forgets a topic and every group's state of it.
    pub(super) fn delete_topic(
        &mut self,
        name: &str,
        topic_id: Option<u64>,
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(name, topic_id)?;
        if self.topics.remove(name).is_none() {
            return Err(MetadataError::UnknownTopic(name.to_string()));
        }
        for group in self.groups.values_mut() {
            group.topics.remove(name);
        }
        self.groups.retain(|_, g| !g.topics.is_empty());
        Ok(Response::Ok)
    }

    /// Changes some of a topic's configs, all or none.
    pub(super) fn alter_topic_config(
        &mut self,
        name: &str,
        topic_id: Option<u64>,
        config: &BTreeMap<String, String>,
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(name, topic_id)?;
        let topic = self.topics.get_mut(name).ok_or_else(|| MetadataError::UnknownTopic(name.to_string()))?;
        topic.config = topic.config.altered(config)?;
        topic.config_version += 1;
        Ok(Response::Ok)
    }

    /// A topic as the archive describes it (a rebuild); the same topic again is a no-op.
    pub(super) fn restore_topic(
        &mut self,
        name: &str,
        id: Option<u64>,
        partitions: u32,
        config: &TopicConfig,
        config_version: u64,
        created_ms: u64,
    ) -> Result<Response, MetadataError> {
        if partitions == 0 || partitions > PARTITIONS_MAX {
            return Err(MetadataError::InvalidArgument(format!(
                "a topic needs between 1 and {PARTITIONS_MAX} partitions, got {partitions}"
            )));
        }
        if let Some(existing) = self.topics.get(name) {
            if id.is_none_or(|id| id == existing.id) && existing.partitions.len() == partitions as usize {
                return Ok(Response::Topic { topic: existing.clone() });
            }
            return Err(MetadataError::TopicExists(name.to_string()));
        }
        if let Some(taken) = id.and_then(|id| self.topics.values().find(|t| t.id == id)) {
            return Err(MetadataError::InvalidArgument(format!(
                "topic '{name}' cannot have id {} again: topic '{}' has it",
                taken.id, taken.name
            )));
        }
        let id = id.unwrap_or(self.next_topic_id);
        let topic = Topic {
            name: name.to_string(),
            id,
            config: config.clone(),
            partitions: vec![Partition::default(); partitions as usize],
            created_ms,
            config_version,
        };
        self.next_topic_id = self.next_topic_id.max(id + 1);
        self.topics.insert(name.to_string(), topic);
        self.assign_writers();
        Ok(Response::Topic { topic: self.topics[name].clone() })
    }

    /// No topic created later takes an id below `below`.
    pub(super) fn reserve_topic_ids(&mut self, below: u64) -> Result<Response, MetadataError> {
        self.next_topic_id = self.next_topic_id.max(below);
        Ok(Response::Ok)
    }
}
