//! Produce: messages to the writers of their partitions, here or on the agents that write them.

use super::*;

impl Agent {
    /// The end of a partition, from its writer.
    pub(super) async fn high_watermark(&self, topic: &str, partition: u32) -> Result<u64, ApiError> {
        match self.target(topic, partition, false).await? {
            Target::Local(handle) => {
                let hwm = handle.reader().high_watermark();
                self.end_check(&handle, topic, partition)?;
                Ok(hwm)
            }
            remote => {
                let peer = remote.peer().unwrap_or_default();
                Ok(self
                    .inner
                    .peers
                    .read(peer, topic, partition, u64::MAX, ReadLimit::new(1, 1))
                    .await?
                    .high_watermark)
            }
        }
    }

    /// Produces messages. Returns one id per message, in order, once all are durable.
    pub async fn produce(
        &self,
        topic: &str,
        messages: Vec<ProduceMessage>,
    ) -> Result<Vec<MessageId>, ApiError> {
        let started = Instant::now();
        if messages.is_empty() {
            return Err(ApiError::new(
                ErrorCode::EmptyRequest,
                "a produce request needs at least one message",
            ));
        }
        if messages.len() > PRODUCE_MESSAGES_MAX {
            return Err(ApiError::new(
                ErrorCode::TooManyMessages,
                format!(
                    "a produce request may carry at most {PRODUCE_MESSAGES_MAX} messages, got {}",
                    messages.len()
                ),
            ));
        }
        let t = self.topic_info(topic).await?;
        let partitions = t.partitions;
        let max_bytes = t.config.max_message_bytes as usize;
        let spread = self.inner.spread.fetch_add(1, Ordering::Relaxed) % partitions;
        let now = self.now_ms() as i64;
        // Group messages per partition into batches no larger than max.message.bytes.
        let mut per_partition: BTreeMap<u32, Vec<(usize, BatchBuilder)>> = BTreeMap::new();
        let mut slots: Vec<(u32, usize, usize)> = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            let partition = match (m.partition, &m.key) {
                (Some(p), _) if p < partitions => p,
                (Some(p), _) => {
                    return Err(MetadataError::UnknownPartition { topic: topic.into(), partition: p }.into());
                }
                (None, Some(key)) => partition_for_key(key, partitions),
                (None, None) => spread,
            };
            let record = NewRecord {
                timestamp_ms: m.timestamp_ms.unwrap_or(now),
                key: m.key,
                value: m.value,
                headers: m.headers,
            };
            let batches = per_partition.entry(partition).or_default();
            let alone = BatchBuilder::new().encoded_len_with(&record);
            if alone > max_bytes {
                return Err(ApiError::new(ErrorCode::MessageTooLarge,
                    format!(
                        "message {i} is {alone} bytes as a record batch, over the topic's max.message.bytes of {max_bytes}"
                    ),
                ));
            }
            let fits = batches.last().is_some_and(|(_, b)| b.encoded_len_with(&record) <= max_bytes);
            if !fits {
                batches.push((0, BatchBuilder::new()));
            }
            let batch_index = batches.len() - 1;
            let Some((count, builder)) = batches.last_mut() else { unreachable!("pushed above") };
            builder.push(record);
            slots.push((partition, batch_index, *count));
            *count += 1;
        }
        let mut appends = Vec::new();
        for (partition, batches) in per_partition {
            let target = Arc::new(self.target(topic, partition, false).await?);
            // Batches for another agent go one after the other (a fair lock taken in order), so
            // they get offsets in order, and none follows one that failed.
            let in_order = Arc::new(tokio::sync::Mutex::new(false));
            for (batch_index, (_, builder)) in batches.into_iter().enumerate() {
                let bytes =
                    builder.build().map_err(|e| ApiError::new(ErrorCode::InvalidMessage, e.to_string()))?;
                let batch = RecordBatch::parse(bytes).map_err(|e| ApiError::internal(e.to_string()))?;
                let (target, in_order) = (Arc::clone(&target), Arc::clone(&in_order));
                let (peers, this) = (&self.inner.peers, self);
                appends.push(async move {
                    let (count, len) = (batch.record_count(), batch.len_bytes());
                    let result = match &*target {
                        Target::Local(handle) => handle.append(batch).await.map_err(ApiError::from),
                        remote => {
                            let mut failed = in_order.lock().await;
                            if *failed {
                                Err(ApiError::unavailable(format!(
                                    "an earlier batch of this request to partition {partition} failed; this one was not sent"
                                )))
                            } else {
                                let peer = remote.peer().unwrap_or_default();
                                this.count_forwarded("append");
                                let r = peers.append(peer, topic, partition, batch.into_bytes()).await;
                                *failed = r.is_err();
                                r
                            }
                        }
                    };
                    (partition, batch_index, count, len, result)
                });
            }
        }
        let results = futures::future::join_all(appends).await;
        let mut bases: HashMap<(u32, usize), u64> = HashMap::new();
        let mut first_error = None;
        let labels = Metrics::topic(topic);
        for (partition, batch_index, count, len, result) in results {
            match result {
                Ok((base, _)) => {
                    bases.insert((partition, batch_index), base);
                    self.inner.metrics.records_in.get_or_create(&labels).inc_by(u64::from(count));
                    self.inner.metrics.bytes_in.get_or_create(&labels).inc_by(len as u64);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.inner.appended.notify_waiters();
        if let Some(e) = first_error {
            return Err(e);
        }
        let ids =
            slots.into_iter().map(|(p, b, i)| MessageId::new(topic, p, bases[&(p, b)] + i as u64)).collect();
        self.inner.metrics.produce_latency_seconds.observe(started.elapsed().as_secs_f64());
        Ok(ids)
    }

    /// Appends a client-built RecordBatch v2 as it is (checked, then given offsets).
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: u32,
        body: Bytes,
        forwarded: bool,
    ) -> Result<(u64, u64), ApiError> {
        let started = Instant::now();
        let t = self.topic_info(topic).await?;
        if body.len() as u64 > t.config.max_message_bytes {
            return Err(ApiError::new(
                ErrorCode::MessageTooLarge,
                format!(
                    "record batch of {} bytes is over the topic's max.message.bytes of {}",
                    body.len(),
                    t.config.max_message_bytes
                ),
            ));
        }
        let batch = RecordBatch::parse(body)
            .map_err(|e| ApiError::new(ErrorCode::InvalidRecordBatch, e.to_string()))?;
        let (count, len) = (batch.record_count(), batch.len_bytes());
        let range = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => handle.append(batch).await?,
            remote => {
                let peer = remote.peer().unwrap_or_default();
                self.count_forwarded("append");
                return self.inner.peers.append(peer, topic, partition, batch.into_bytes()).await;
            }
        };
        self.inner.appended.notify_waiters();
        let labels = Metrics::topic(topic);
        self.inner.metrics.records_in.get_or_create(&labels).inc_by(u64::from(count));
        self.inner.metrics.bytes_in.get_or_create(&labels).inc_by(len as u64);
        self.inner.metrics.produce_latency_seconds.observe(started.elapsed().as_secs_f64());
        Ok(range)
    }
}
