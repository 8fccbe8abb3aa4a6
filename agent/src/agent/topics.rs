//! Topics: created, altered and deleted through metadata, described in the bucket for a
//! rebuild of metadata, and read from this agent's copy of metadata (or a linearizable read when
//! the copy does not know one yet).

use super::*;

impl Agent {
    pub(super) fn topic_local(&self, topic: &str) -> Result<Topic, ApiError> {
        Ok(self.inner.metadata.read_local(|s| s.topic(topic).cloned())?)
    }

    /// The topic from the local copy of metadata, or, if the copy does not have it (it may
    /// lag behind a topic just created through another agent), from a linearizable read.
    pub(super) async fn topic(&self, topic: &str) -> Result<Topic, ApiError> {
        match self.topic_local(topic) {
            Ok(t) => Ok(t),
            Err(_) => Ok(self.inner.metadata.read(|s| s.topic(topic).cloned()).await??),
        }
    }

    /// [`Agent::topic`] without the partitions' segment chains: what request paths need.
    pub(super) async fn topic_info(&self, topic: &str) -> Result<TopicInfo, ApiError> {
        match self.inner.metadata.read_local(|s| s.topic(topic).map(TopicInfo::of)) {
            Ok(t) => Ok(t),
            Err(_) => Ok(self.inner.metadata.read(|s| s.topic(topic).map(TopicInfo::of)).await??),
        }
    }

    /// Creates a topic and opens its partitions.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: BTreeMap<String, String>,
    ) -> Result<Topic, ApiError> {
        validate_topic_name(name).map_err(|e| ApiError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
        let mut config = config;
        config
            .entry("replication.factor".to_string())
            .or_insert_with(|| self.inner.config.default_replication_factor.to_string());
        let response = self
            .inner
            .metadata
            .write(Command::CreateTopic { name: name.to_string(), partitions, config, now_ms: self.now_ms() })
            .await?;
        let Response::Topic { topic } = response else {
            return Err(ApiError::unavailable(format!("unexpected metadata reply: {response:?}")));
        };
        self.describe_in_archive(&topic).await;
        // Start the writers this agent was given now, so the topic is ready when this returns.
        self.supervise().await;
        Ok(self.topic_local(name).unwrap_or(topic))
    }

    /// Alters some of a topic's configs, all or none (`replication.factor` and
    /// `min.insync.replicas` cannot change). Requests read them from metadata; writers pick
    /// them up on their next tick (within a second).
    pub async fn alter_topic_config(
        &self,
        name: &str,
        config: BTreeMap<String, String>,
    ) -> Result<Topic, ApiError> {
        let id = self.topic_info(name).await?.id;
        self.inner
            .metadata
            .write(Command::AlterTopicConfig { name: name.to_string(), topic_id: Some(id), config })
            .await?;
        let topic = self.inner.metadata.read(|s| s.topic(name).cloned()).await??;
        self.describe_in_archive(&topic).await;
        Ok(topic)
    }

    /// Writes the topic's description to the bucket, so that a rebuild of metadata restores
    /// its configs. A failure is only logged: the compactor writes it again before it
    /// archives any of the topic's segments.
    pub(super) async fn describe_in_archive(&self, topic: &Topic) {
        if let Some((store, prefix)) = &self.inner.archive_store {
            let d = silt_tiering::topic_descriptor::TopicDescriptor::of(topic);
            if let Err(e) = silt_tiering::topic_descriptor::write_descriptor(store.as_ref(), prefix, &d).await
            {
                warn!(error = %e, topic = %topic.name, "describing the topic in the bucket failed; the compactor will");
            }
        }
    }

    /// Deletes a topic: metadata first, then the local data; returns once no agent answers
    /// for it any more. Another agent's copy of metadata may not include the deletion yet, and
    /// it serves the topic until it does, but not once its copy is older than 7/8 of a lease
    /// (`Agent::lease_check`): with metadata in another process, this waits a lease from the
    /// deletion before it returns.
    ///
    /// A topic metadata does not hold is answered `unknown_topic` after the same wait: an
    /// earlier attempt whose answer was lost may have deleted it a moment ago, and the client
    /// that sends it again must not go on (create the topic again, say) while agents may still
    /// answer for the deleted one.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        let remote = matches!(self.inner.metadata, silt_metadata::Metadata::Remote(_));
        let deleted = match self.delete_topic_now(name).await {
            Ok(deleted) => deleted,
            Err(e) if remote && e.code == ErrorCode::UnknownTopic => {
                tokio::time::sleep(self.inner.config.lease).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if remote {
            tokio::time::sleep_until((deleted + self.inner.config.lease).into()).await;
        }
        Ok(())
    }

    /// [`delete_topic`](Self::delete_topic) without the wait: returns when metadata took the
    /// deletion.
    async fn delete_topic_now(&self, name: &str) -> Result<std::time::Instant, ApiError> {
        let t = self.topic(name).await?;
        let (id, count) = (t.id, t.partitions.len() as u32);
        // Of this incarnation only: a retry that finds the name created again deletes nothing.
        self.inner
            .metadata
            .write(Command::DeleteTopic { name: name.to_string(), topic_id: Some(id) })
            .await?;
        let deleted = std::time::Instant::now();
        // Keys from before ids were part of them are this topic's when its segments named them.
        let referenced: std::collections::HashSet<String> = t
            .partitions
            .iter()
            .flat_map(|p| p.segments.values().filter_map(|s| s.object_key.clone()))
            .collect();
        let mut guards = Vec::new();
        for p in 0..count {
            self.stop_writer(name, p).await;
            // No writer or replica of the partition opens while its files go.
            guards.push(self.writer_slot(&PartitionKey::new(name, p)).lock_owned().await);
        }
        lock(&self.inner.cursors).retain(|(_, t, _), _| t != name);
        let dir = self.topic_dir(name, id);
        // Writers notice their channel closed and stop; their files go with the directory.
        if let Err(e) = silt_metadata::runtime::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await {
            warn!(error = %e, topic = name, "removing local data of a deleted topic failed");
        }
        drop(guards);
        // The deleted topic's slots that nobody holds, waits for or runs a writer in go (the
        // name may be a new topic's already, with writers of its own).
        lock(&self.inner.writers).retain(|PartitionKey { topic: t, partition: p }, slot| {
            let idle = Arc::strong_count(slot) == 1 && slot.try_lock().is_ok_and(|w| w.is_none());
            !(t == name && *p < count && idle)
        });
        // Metadata no longer points at the topic's objects: delete them (listing is fine for an
        // admin operation). A failure leaves orphans, which cost storage only: keys carry the
        // topic id, so a topic created again under the name never meets them.
        if let Some((store, prefix)) = &self.inner.archive_store {
            // First the mark, so that a rebuild never brings the topic back, even if deleting
            // its objects stops halfway.
            if let Err(e) =
                silt_tiering::topic_descriptor::write_tombstone(store.as_ref(), prefix, name, id).await
            {
                // Its objects stay: a rebuild would restore the topic whole rather than in part.
                warn!(error = %e, topic = name, "marking the topic deleted in the bucket failed; its objects are kept");
                return Ok(deleted);
            }
            let topic_prefix = prefix.child(format!("topic={name}"));
            let listed: Result<Vec<object_store::ObjectMeta>, _> =
                store.list(Some(&topic_prefix)).try_collect().await;
            match listed {
                Ok(objects) => {
                    // Only this incarnation's: a topic created again under the name has its own.
                    // Keys without an id were written before ids were part of keys, by this
                    // incarnation or an earlier, deleted one: they go too.
                    let ours = objects.into_iter().filter(|o| {
                        let named = silt_tiering::object_layout::parse_object_key(&o.location);
                        match named.map(|n| n.topic_id) {
                            Some(Some(object_id)) => object_id == id,
                            Some(None) => true,
                            None => referenced.contains(o.location.as_ref()),
                        }
                    });
                    for o in ours {
                        if let Err(e) = store.delete(&o.location).await {
                            warn!(error = %e, object = %o.location, "deleting an object of a deleted topic failed");
                        }
                    }
                }
                Err(e) => warn!(error = %e, topic = name, "listing the objects of a deleted topic failed"),
            }
        }
        Ok(deleted)
    }

    /// All topics.
    pub async fn list_topics(&self) -> Result<Vec<Topic>, ApiError> {
        Ok(self.inner.metadata.read(|s| s.topics.values().cloned().collect()).await?)
    }

    /// One topic as metadata knows it, with each partition's local high watermark.
    pub async fn describe_topic(&self, name: &str) -> Result<(Topic, Vec<u64>), ApiError> {
        let topic = self.inner.metadata.read(|s| s.topic(name).cloned()).await??;
        let mut hwms = Vec::with_capacity(topic.partitions.len());
        for p in 0..topic.partitions.len() as u32 {
            hwms.push(self.high_watermark(name, p).await?);
        }
        Ok((topic, hwms))
    }
}
