//! Reads: a partition's records from its local log, the other replicas of the segments this agent
//! does not hold, or the archive, as one stream of offsets; offsets for a time.

use super::*;

/// Bytes read from a partition per step of a poll or replay.
pub(super) const READ_BYTES_STEP: usize = 1024 * 1024;
/// Most records one read of another agent's replica asks for.
pub(super) const REPLAY_STEP: u64 = 10_000;

/// A read still running after this long logs where it is, and again after each further period.
pub(super) const SLOW_READ_WARN_AFTER: Duration = Duration::from_secs(20);

/// Where a read is, and at which offset, for [`Agent::read`]'s warning about slow reads.
pub(super) struct ReadStage(Mutex<(&'static str, u64)>);

impl ReadStage {
    fn new(offset: u64) -> ReadStage {
        ReadStage(Mutex::new(("starting", offset)))
    }

    fn set(&self, stage: &'static str, offset: u64) {
        *lock(&self.0) = (stage, offset);
    }

    fn get(&self) -> (&'static str, u64) {
        *lock(&self.0)
    }
}

/// Where a read stands: the records it holds, their bytes, and where it continues.
pub(super) struct Page {
    records: Vec<Record>,
    used: usize,
    next: u64,
}

impl Page {
    fn new(from: u64) -> Self {
        Self { records: Vec::new(), used: 0, next: from }
    }

    /// Moves records of `got` to the end of the page while `limit` has room for them, `next`
    /// right after the last. Returns whether a record was left out or the limit's record count
    /// is reached.
    fn fill(&mut self, got: Vec<Record>, limit: &ReadLimit) -> bool {
        for record in got {
            if !limit.admits(self.records.len(), self.used, &record) {
                return true;
            }
            self.used += record.data_len();
            self.next = record.offset + 1;
            self.records.push(record);
        }
        self.records.len() >= limit.records
    }

    /// What is left of `limit` for the rest of this page.
    fn rest(&self, limit: &ReadLimit) -> ReadLimit {
        limit.rest(self.records.len(), self.used)
    }
}

/// Reads what `limit` allows of a local log from `offset` on, ending at a batch not written
/// under `epoch` if one is given. Returns the records, where the next read starts, the log's
/// end, and the batch bytes read.
///
/// The hot tail was just written, so the page cache holds it: up to [`INLINE_READ_BYTES`] are
/// read on this runtime thread from the page cache only, and the read goes on in the blocking
/// pool only if it needs more or would wait for the disk. A poll that follows the writer then
/// costs no hand-off to another thread and back.
pub(super) async fn read_hot(
    reader: Arc<PartitionReader>,
    offset: u64,
    limit: ReadLimit,
    epoch: Option<i32>,
) -> Result<(Vec<Record>, u64, u64, usize), ApiError> {
    let mut page = HotPage::new(offset, reader.high_watermark()).of_epoch(epoch);
    match page.read(&reader, &limit, ReadMode::CachedOnly, INLINE_READ_BYTES) {
        Ok(true) => return Ok(page.into_parts()),
        Ok(false) | Err(StoreError::NotCached) => {}
        Err(e) => return Err(e.into()),
    }
    silt_metadata::runtime::spawn_blocking(move || -> Result<_, StoreError> {
        page.read(&reader, &limit, ReadMode::MayBlock, usize::MAX)?;
        Ok(page.into_parts())
    })
    .await
    .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))?
    .map_err(ApiError::from)
}

/// Batch bytes a read of the hot tail reads on a runtime thread, from the page cache, before it
/// hands the rest to the blocking pool: about 30 µs of copying and checksums.
pub(super) const INLINE_READ_BYTES: usize = 256 * 1024;

/// A page being read from a local log.
pub(super) struct HotPage {
    records: Vec<Record>,
    /// Where the next read starts.
    next: u64,
    /// The log's end, as of the last read.
    hwm: u64,
    /// Batch bytes read.
    bytes: usize,
    /// Bytes of the records' keys, values and headers.
    used: usize,
    /// Only batches of this epoch are read: the page ends at a batch of another.
    epoch: Option<i32>,
}

impl HotPage {
    /// An empty page from `offset`, of a log that ends at `hwm`.
    fn new(offset: u64, hwm: u64) -> Self {
        HotPage { records: Vec::new(), next: offset, hwm, bytes: 0, used: 0, epoch: None }
    }

    /// Ends the page at the first batch not written under `epoch`.
    fn of_epoch(self, epoch: Option<i32>) -> Self {
        HotPage { epoch, ..self }
    }

    /// Reads on until `limit` is reached or the log ends (`true`), or until `budget` more
    /// batch bytes were read (`false`: there may be more). After an error, what was read so
    /// far stays and the next call goes on from there.
    fn read(
        &mut self,
        reader: &PartitionReader,
        limit: &ReadLimit,
        mode: ReadMode,
        budget: usize,
    ) -> Result<bool, StoreError> {
        let budget_end = self.bytes.saturating_add(budget);
        while self.records.len() < limit.records {
            if self.bytes >= budget_end {
                return Ok(false);
            }
            let r = match mode {
                ReadMode::MayBlock => reader.read(self.next, READ_BYTES_STEP)?,
                ReadMode::CachedOnly => {
                    reader.read_cached(self.next, READ_BYTES_STEP.min(budget_end - self.bytes))?
                }
            };
            self.hwm = r.high_watermark;
            if r.batches.is_empty() {
                return Ok(true);
            }
            for batch in &r.batches {
                if self.epoch.is_some_and(|e| e != batch.partition_leader_epoch()) {
                    return Ok(true);
                }
                self.bytes += batch.len_bytes();
                for record in batch.records() {
                    if record.offset < self.next {
                        continue;
                    }
                    if !limit.admits(self.records.len(), self.used, &record) {
                        return Ok(true);
                    }
                    self.used += record.data_len();
                    self.next = record.offset + 1;
                    self.records.push(record);
                }
            }
            self.next = self.next.max(r.next_offset);
        }
        Ok(true)
    }

    fn into_parts(self) -> (Vec<Record>, u64, u64, usize) {
        (self.records, self.next, self.hwm, self.bytes)
    }
}

impl Agent {
    /// Reads records of one partition from `offset` without touching any group: archived
    /// offsets from the bucket through the cold reader, the rest from the local log, as one
    /// stream, as much as `limit` allows. Offsets deleted by retention are skipped.
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        forwarded: bool,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        // A read that takes this long says where it is, every SLOW_READ_WARN_AFTER, until it ends.
        let stage = ReadStage::new(offset);
        let read = self.read_staged(topic, partition, offset, limit, forwarded, &stage);
        tokio::pin!(read);
        let started = Instant::now();
        loop {
            tokio::select! {
                r = &mut read => return r,
                () = tokio::time::sleep(SLOW_READ_WARN_AFTER) => {
                    let (at, next) = stage.get();
                    warn!(
                        topic, partition, offset, stage = at, next_offset = next,
                        elapsed_ms = started.elapsed().as_millis() as u64, "a read is still running"
                    );
                }
            }
        }
    }

    pub(super) async fn read_staged(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        forwarded: bool,
        stage: &ReadStage,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        let limit = ReadLimit { records: limit.records.max(1), ..limit };
        stage.set("finding the partition's writer", offset);
        let (reader, handle) = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => (Arc::clone(handle.reader()), handle),
            remote => {
                let peer = remote.peer().unwrap_or_default();
                self.count_forwarded("read");
                stage.set("reading from the writer", offset);
                let answer = self.inner.peers.read(peer, topic, partition, offset, limit).await?;
                // The writer returns its first record whatever its size; this read may not.
                let mut page = Page::new(offset);
                if !page.fill(answer.records, &limit) {
                    page.next = answer.next_offset;
                }
                return Ok((page.records, page.next, answer.high_watermark));
            }
        };
        let mut page = Page::new(offset);
        // Cold part: offsets below what this agent holds locally.
        let labels = Metrics::topic(topic);
        let mut refreshed = false;
        let mut attempts = 0;
        loop {
            // Full once the limit has no room left (the cold reader would otherwise return a
            // record this page cannot take, and take the next page's read for a seek).
            let mut full = page.rest(&limit).is_spent();
            while !full && !reader.holds(page.next) {
                let next = page.next;
                let located = self.with_partition(topic, partition, |part| {
                    let location = locate(part, next);
                    let ensemble = match &location {
                        Location::Hot { base_offset } => part.segments.get(base_offset).map(holders_first),
                        _ => None,
                    };
                    (location, ensemble)
                });
                let Some((location, ensemble)) = located else { break };
                let rest = page.rest(&limit);
                if let Location::Hot { .. } = location {
                    // Written before this agent took the partition over, not archived yet.
                    let Some(ensemble) = ensemble else { break };
                    // At least one record, so that an empty answer means there is nothing
                    // there: whether it fits is for `fill` to say.
                    let ask = ReadLimit { at_least_one: true, ..rest };
                    stage.set("reading unarchived segments other agents hold", next);
                    let got = match self.read_elsewhere(topic, partition, next, ask, &ensemble).await {
                        Ok(got) => got,
                        // The holders may have dropped it because it is archived by now, which this
                        // agent's metadata copy does not show yet: catch up once and look again.
                        Err(_) if !refreshed => {
                            refreshed = true;
                            self.inner.metadata.read(|_| ()).await?;
                            continue;
                        }
                        Err(e) if page.records.is_empty() => return Err(e),
                        // What the page has is answered; the next read starts where it failed.
                        Err(_) => {
                            full = true;
                            continue;
                        }
                    };
                    if got.is_empty() {
                        break;
                    }
                    full = page.fill(got, &limit);
                    continue;
                }
                // Offsets deleted by retention, or declared lost: the read goes on after them.
                if let Location::Gone { earliest } = location {
                    if earliest <= next {
                        break;
                    }
                    page.next = earliest;
                    continue;
                }
                let Some(cold) = &self.inner.cold else { break };
                match location {
                    Location::Cold { object_key, object_bytes, last_offset, .. } => {
                        stage.set("starting on the next archived object", next);
                        self.read_ahead_next_object(
                            cold,
                            topic,
                            partition,
                            &object_key,
                            object_bytes,
                            last_offset,
                            next,
                        )
                        .await;
                        stage.set("reading archived data", next);
                        let got = match cold.read_limited(&object_key, object_bytes, next, rest).await {
                            Ok(got) => got,
                            Err(e) if page.records.is_empty() => {
                                return Err(ApiError::unavailable(format!("reading archived data: {e}")))
                            }
                            // What the page has is answered; the next read starts where it failed.
                            Err(_) => {
                                full = true;
                                continue;
                            }
                        };
                        if got.is_empty() && !rest.at_least_one {
                            // No room for its next record: the page ends here.
                            full = true;
                            continue;
                        }
                        let Some(last) = got.last().map(|r| r.offset) else {
                            page.next = last_offset + 1;
                            continue;
                        };
                        // Short of the record limit and of the object's end, the cold reader
                        // stopped at the byte limit: the next record does not fit.
                        let at_byte_limit = got.len() < rest.records && last < last_offset;
                        full = page.fill(got, &limit) || at_byte_limit || page.rest(&limit).is_spent();
                    }
                    _ => break,
                }
            }
            if full {
                let hwm = reader.high_watermark();
                // The read may have taken a while: the end it answers is the end only if this
                // agent still writes the partition.
                self.end_check(&handle, topic, partition)?;
                self.inner.metrics.records_out.get_or_create(&labels).inc_by(page.records.len() as u64);
                return Ok((page.records, page.next, hwm));
            }
            stage.set("reading the local log", page.next);
            match read_hot(Arc::clone(&reader), page.next, page.rest(&limit), None).await {
                Ok((hot, next, hwm, bytes)) => {
                    self.end_check(&handle, topic, partition)?;
                    let mut records = page.records;
                    records.extend(hot);
                    self.inner.metrics.records_out.get_or_create(&labels).inc_by(records.len() as u64);
                    self.inner.metrics.bytes_out.get_or_create(&labels).inc_by(bytes as u64);
                    return Ok((records, next, hwm));
                }
                // The local copy of these offsets was dropped (archived) while this read ran:
                // read them from where they are now.
                Err(e)
                    if e.code == ErrorCode::OffsetOutOfRange && !reader.holds(page.next) && attempts < 3 =>
                {
                    attempts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every record of a sealed segment from the local log (what the compactor archives).
    pub async fn read_local_segment(
        &self,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, ApiError> {
        // The local copy first; a copy this agent lacks (a wiped disk) or holds only in part is
        // completed from the other members.
        let epoch = self
            .with_partition(topic, partition, |p| {
                p.segments.get(&base_offset).map(|s| crate::log::partition_log::epoch_i32(s.epoch))
            })
            .flatten();
        let mut records = match (self.local_reader(topic, partition), epoch) {
            (Some(reader), Some(epoch)) => {
                Self::read_segment_from(reader, base_offset, last_offset, epoch).await.unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // A replica that left the ensemble early holds a shorter copy: the rest is on the
        // others.
        let mut next = records.last().map_or(base_offset, |r| r.offset + 1);
        if next <= last_offset {
            let ensemble = self
                .with_partition(topic, partition, |p| p.segments.get(&base_offset).map(holders_first))
                .flatten()
                .unwrap_or_default();
            let me = self.inner.config.agent_id.clone();
            let others: Vec<String> = ensemble.into_iter().filter(|a| *a != me).collect();
            while next <= last_offset {
                let want = (last_offset - next + 1).min(REPLAY_STEP) as usize;
                let got = self
                    .read_elsewhere(topic, partition, next, ReadLimit::new(want, READ_BYTES_DEFAULT), &others)
                    .await?;
                let Some(last) = got.last() else { break };
                next = last.offset + 1;
                records.extend(got.into_iter().filter(|r| r.offset <= last_offset));
            }
        }
        Ok(records)
    }

    /// The records `base_offset..=last_offset` of the local log's copy of a segment written
    /// under `epoch` (stamped as batches carry it); they end at a batch of another epoch.
    pub(super) async fn read_segment_from(
        reader: Arc<PartitionReader>,
        base_offset: u64,
        last_offset: u64,
        epoch: i32,
    ) -> Result<Vec<Record>, ApiError> {
        silt_metadata::runtime::spawn_blocking(move || -> Result<Vec<Record>, StoreError> {
            let mut records = Vec::new();
            let mut next = base_offset;
            while next <= last_offset {
                let r = reader.read(next, 4 * READ_BYTES_STEP)?;
                if r.batches.is_empty() {
                    break;
                }
                for batch in &r.batches {
                    if batch.partition_leader_epoch() != epoch {
                        return Ok(records);
                    }
                    records.extend(
                        batch.records().filter(|rec| rec.offset >= next && rec.offset <= last_offset),
                    );
                }
                next = r.next_offset;
            }
            Ok(records)
        })
        .await
        .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))?
        .map_err(ApiError::from)
    }

    /// The local log of a partition: its writer's here, or a retired one.
    pub(super) fn local_reader(&self, topic: &str, partition: u32) -> Option<Arc<PartitionReader>> {
        self.local_reader_of(topic, partition, None)
    }

    /// [`Agent::local_reader`], of the topic with id `topic_id` if one is given (not of a
    /// deleted topic of the same name).
    pub(super) fn local_reader_of(
        &self,
        topic: &str,
        partition: u32,
        topic_id: Option<u64>,
    ) -> Option<Arc<PartitionReader>> {
        let key = PartitionKey::new(topic, partition);
        let running = crate::sync::read_lock(&self.inner.partitions)
            .get(&key)
            .filter(|r| topic_id.is_none_or(|id| r.topic_id == id))
            .map(|r| Arc::clone(r.handle.reader()));
        running.or_else(|| {
            crate::sync::read_lock(&self.inner.retired)
                .get(&key)
                .filter(|(id, _)| topic_id.is_none_or(|want| *id == want))
                .map(|(_, r)| Arc::clone(r))
        })
    }

    /// Reads records this agent holds in its local log of a partition, whether or not it
    /// writes the partition (segments it wrote or follows), never past their committed end.
    pub async fn read_held(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
    ) -> Result<(Vec<Record>, u64, u64), ApiError> {
        let reader = self.local_reader(topic, partition).ok_or_else(|| {
            ApiError::unavailable(format!("this agent holds no local log of {topic}/{partition}"))
        })?;
        // Only what is committed is served from a replica (it may hold a tail that was never
        // acknowledged): a sealed segment up to the end metadata sealed, the open one up to the
        // end its writer last said was committed.
        let segment = self
            .with_partition(topic, partition, |p| {
                p.segments.range(..=offset).next_back().map(|(_, s)| s.clone())
            })
            .flatten();
        let epoch = segment.as_ref().map(|seg| crate::log::partition_log::epoch_i32(seg.epoch));
        let committed_last = segment.and_then(|seg| {
            if seg.state != silt_metadata::state::SegmentState::Open {
                return seg.last_offset;
            }
            let replica = self.open_replica_if_any(topic, partition)?;
            let end = lock(&replica).as_ref()?.committed_end(seg.base_offset)?;
            end.checked_sub(1).filter(|l| *l >= seg.base_offset)
        });
        let Some(last) = committed_last.filter(|l| *l >= offset) else {
            return Err(ApiError::unavailable(format!(
                "offset {offset} of {topic}/{partition} is not committed in a segment this agent holds; read it from the partition's writer"
            )));
        };
        let want = limit.records.max(1).min((last - offset + 1) as usize);
        // Only the copy of the segment metadata records there: a local segment of another
        // epoch at these offsets holds records a recovery dropped, not yet cut back here.
        let (records, next, hwm, _) =
            read_hot(reader, offset, ReadLimit { records: want, ..limit }, epoch).await?;
        if records.is_empty() {
            return Err(ApiError::unavailable(format!(
                "this agent's replica of {topic}/{partition} does not hold offset {offset} as written under epoch {}",
                epoch.unwrap_or_default()
            )));
        }
        Ok((records, next, hwm))
    }

    /// Reads offsets of a segment that is neither archived nor in this agent's writer log:
    /// from this agent's retired log if it holds the segment, else from the first agent of
    /// `ensemble` that has them (an unverified member may hold less than the segment).
    pub(super) async fn read_elsewhere(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        limit: ReadLimit,
        ensemble: &[String],
    ) -> Result<Vec<Record>, ApiError> {
        let me = self.inner.config.agent_id.as_str();
        if ensemble.iter().any(|a| a == me) {
            if let Ok((records, _, _)) = self.read_held(topic, partition, offset, limit).await {
                if !records.is_empty() {
                    return Ok(records);
                }
            }
        }
        let mut last = ApiError::unavailable(format!(
            "offset {offset} of {topic}/{partition} is held by agent(s) {} and none answered",
            ensemble.join(", ")
        ));
        let mut empty = false;
        for agent in ensemble.iter().filter(|a| *a != me) {
            let Some(addr) = self.inner.metadata.read_local(|s| s.agents.get(agent).map(|a| a.addr.clone()))
            else {
                continue;
            };
            self.count_forwarded("read");
            match self.inner.peers.read_held((agent, &addr), topic, partition, offset, limit).await {
                Ok(page) if !page.records.is_empty() => return Ok(page.records),
                Ok(_) => empty = true,
                Err(e) => last = e,
            }
        }
        if empty {
            return Ok(Vec::new());
        }
        Err(last)
    }

    /// Before a read of archived `object_key` (offsets up to `last_offset`) at `next`: if a
    /// stream nearing this object's end is there ([`ColdReader::next_object_due`], decided now,
    /// before the read moves it on), has the cold reader start on the partition's next archived
    /// object in the background, so the read does not wait for that object's footer. A failure
    /// is left to the read that needs the next object.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn read_ahead_next_object(
        &self,
        cold: &Arc<ColdReader>,
        topic: &str,
        partition: u32,
        object_key: &str,
        object_bytes: u64,
        last_offset: u64,
        next: u64,
    ) {
        let due = match cold.next_object_due(object_key, object_bytes, next).await {
            Ok(Some(due)) => due,
            // Not due; or this object's footer could not be read, which the read reports.
            Ok(None) | Err(_) => return,
        };
        let then = self.with_partition(topic, partition, |part| match locate(part, last_offset + 1) {
            Location::Cold { object_key, object_bytes, .. } => Some((object_key, object_bytes)),
            _ => None,
        });
        let Some(Some((then_key, then_bytes))) = then else { return };
        let cold = Arc::clone(cold);
        tokio::spawn(async move {
            if let Err(e) = cold.read_ahead_next_object(due, &then_key, then_bytes).await {
                debug!(object = %then_key, error = %e, "reading the next archived object ahead failed");
            }
        });
    }

    /// The first offset of a partition that still exists anywhere (bucket or local disk).
    pub(super) fn earliest_offset(&self, topic: &str, partition: u32, local_start: u64) -> u64 {
        if self.inner.cold.is_none() {
            return local_start;
        }
        self.with_partition(topic, partition, silt_tiering::locate::earliest_offset)
            .map_or(local_start, |earliest| earliest.min(local_start))
    }

    /// The first offset from `base` to `last` whose record is stamped `timestamp_ms` or later,
    /// read through this agent's read path (which asks the agents holding the segment).
    async fn first_stamped_elsewhere(
        &self,
        topic: &str,
        partition: u32,
        base: u64,
        last: u64,
        timestamp_ms: i64,
    ) -> Result<Option<u64>, ApiError> {
        let mut next = base;
        while next <= last {
            let limit = ReadLimit::new(crate::limits::REPLAY_MAX, 1 << 20);
            let (records, after, _) = Box::pin(self.read(topic, partition, next, limit, true)).await?;
            let in_segment = records.iter().take_while(|r| r.offset <= last);
            if let Some(r) = in_segment.clone().find(|r| r.timestamp_ms >= timestamp_ms) {
                return Ok(Some(r.offset));
            }
            if records.is_empty() || after <= next {
                break;
            }
            next = after;
        }
        Ok(None)
    }

    /// The first offset of a partition whose timestamp is at least `timestamp_ms`: in the local
    /// log, or before it in archived segments (by their timestamp range) and in segments only
    /// other agents hold.
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
        forwarded: bool,
    ) -> Result<u64, ApiError> {
        let (reader, handle) = match self.target(topic, partition, forwarded).await? {
            Target::Local(handle) => (Arc::clone(handle.reader()), handle),
            remote => {
                let peer = remote.peer().unwrap_or_default();
                return self.inner.peers.offset_for_time(peer, topic, partition, timestamp_ms).await;
            }
        };
        // The local log first; then any segment before what it found that this agent holds no
        // whole copy of (archived and dropped, or written before it took the partition over and
        // not archived yet) may hold an earlier record that late.
        let local_reader = Arc::clone(&reader);
        let local =
            silt_metadata::runtime::spawn_blocking(move || local_reader.offset_for_time(timestamp_ms))
                .await
                .map_err(|e| ApiError::unavailable(format!("read task panicked: {e}")))??;
        if let Some(part) = self.partition_meta(topic, partition) {
            for seg in part.segments.values() {
                if seg.base_offset >= local {
                    break;
                }
                // A replica here may end short of the sealed segment (its tail was written while
                // this agent was away): such a segment is read from the others too.
                let held_whole =
                    reader.holds(seg.base_offset) && seg.last_offset.is_none_or(|l| reader.holds(l));
                if held_whole || seg.max_timestamp_ms.is_some_and(|m| m < timestamp_ms) {
                    continue;
                }
                let found = match (&seg.object_key, seg.last_offset, &self.inner.cold) {
                    (Some(key), Some(_), Some(cold)) => cold
                        .offset_for_time(key, seg.object_bytes, timestamp_ms)
                        .await
                        .map_err(|e| ApiError::unavailable(format!("reading archived data: {e}")))?,
                    (None, Some(last), _) => {
                        self.first_stamped_elsewhere(topic, partition, seg.base_offset, last, timestamp_ms)
                            .await?
                    }
                    _ => None,
                };
                if let Some(offset) = found {
                    return Ok(offset.min(local));
                }
            }
        }
        let offset = local;
        // With no record that late, the answer is the log's end: this writer's to give only.
        self.end_check(&handle, topic, partition)?;
        Ok(offset)
    }
}

/// Who may hold a segment not archived yet, in the order to ask: its holders, then the members
/// that did not answer the recovery that sealed it (see `Segment::unverified`).
fn holders_first(segment: &silt_metadata::state::Segment) -> Vec<String> {
    segment.ensemble.iter().chain(&segment.unverified).cloned().collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use super::*;

    fn record(offset: u64, value_bytes: usize) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(vec![b'v'; value_bytes])),
            headers: vec![silt_record::Header { key: "h".into(), value: Some(Bytes::from_static(b"hv")) }],
        }
    }

    fn offsets(records: &[Record]) -> Vec<u64> {
        records.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn a_hot_read_takes_the_page_cache_here_and_the_rest_from_the_disk_on_the_blocking_pool() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let batch = |n: u64| {
            let records: Vec<silt_record::NewRecord> = (0..n)
                .map(|i| silt_record::NewRecord {
                    timestamp_ms: i as i64,
                    key: None,
                    value: Some(Bytes::from(vec![b'v'; 100])),
                    headers: Vec::new(),
                })
                .collect();
            RecordBatch::parse(silt_record::encode_batch(&records).unwrap()).unwrap()
        };
        // Two segments of 50 batches of 10 records.
        for _ in 0..2 {
            log.append_and_sync((0..50).map(|_| batch(10)).collect(), 1).unwrap();
            log.roll().unwrap();
        }
        log.publish();
        let reader = log.reader();
        let all = ReadLimit::new(10_000, usize::MAX);
        let page = || HotPage::new(0, 0);
        let mut whole = page();
        assert!(whole.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&whole.records), (0..1000).collect::<Vec<_>>());
        assert_eq!(whole.hwm, 1000);

        // All in the page cache: read here, and a budget stops the read at a batch boundary.
        let mut cached = page();
        assert!(cached.read(&reader, &all, ReadMode::CachedOnly, usize::MAX).unwrap());
        assert_eq!(offsets(&cached.records), offsets(&whole.records));
        let mut part = page();
        assert!(!part.read(&reader, &all, ReadMode::CachedOnly, 2 * whole.bytes / 100).unwrap());
        assert!(part.records.len() < 100 && part.records.len() % 10 == 0, "{}", part.records.len());
        assert!(part.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&part.records), offsets(&whole.records), "the rest follows on");

        // The second segment out of the page cache: the cached read stops there, and the
        // read that may wait goes on from where it stopped.
        let second = &log.segments()[1];
        let file = std::fs::File::open(second.path()).unwrap();
        // Dropping pages is advice: a kernel busy writing back other files may keep them for
        // a while, so a read that still found everything cached is tried again (for 10 s).
        let (mut attempts, deadline) = (0, Instant::now() + Duration::from_secs(10));
        let (mut mixed, stopped) = loop {
            rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            let mut mixed = page();
            let stopped = mixed.read(&reader, &all, ReadMode::CachedOnly, usize::MAX);
            attempts += 1;
            if !matches!(stopped, Ok(true)) || Instant::now() > deadline {
                break (mixed, stopped);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(matches!(stopped, Err(StoreError::NotCached)), "{stopped:?} after {attempts} attempts");
        assert_eq!(offsets(&mixed.records), (0..500).collect::<Vec<_>>());
        assert!(mixed.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
        assert_eq!(offsets(&mixed.records), offsets(&whole.records));
        assert_eq!((mixed.bytes, mixed.used, mixed.hwm), (whole.bytes, whole.used, whole.hwm));
    }

    /// A local log may hold, at offsets metadata records for a segment of one epoch, batches
    /// of another (what a recovery that did not hear from this replica dropped, in a log not
    /// cut back yet): reads of a held segment return only batches of its epoch.
    #[tokio::test]
    async fn reads_of_a_held_segment_return_only_batches_of_its_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path()).unwrap();
        let batch = |tag: &str| {
            let records: Vec<silt_record::NewRecord> = (0..5)
                .map(|i| silt_record::NewRecord {
                    timestamp_ms: i,
                    key: None,
                    value: Some(Bytes::from(format!("{tag}{i}"))),
                    headers: Vec::new(),
                })
                .collect();
            RecordBatch::parse(silt_record::encode_batch(&records).unwrap()).unwrap()
        };
        // Offsets 0..10 written under epoch 1, then 10..20 under epoch 2, in one segment file.
        log.append_and_sync(vec![batch("a"), batch("b")], 1).unwrap();
        log.append_and_sync(vec![batch("c"), batch("d")], 2).unwrap();
        log.publish();
        let reader = log.reader();
        let all = ReadLimit::new(10_000, usize::MAX);
        let read = |from: u64, epoch: Option<i32>| {
            let mut page = HotPage::new(from, 0).of_epoch(epoch);
            assert!(page.read(&reader, &all, ReadMode::MayBlock, usize::MAX).unwrap());
            offsets(&page.records)
        };
        assert_eq!(read(0, None), (0..20).collect::<Vec<_>>());
        assert_eq!(read(0, Some(1)), (0..10).collect::<Vec<_>>(), "ends at the first batch of epoch 2");
        assert_eq!(read(3, Some(2)), Vec::<u64>::new(), "offset 3 is of epoch 1 here");
        assert_eq!(read(12, Some(2)), (12..20).collect::<Vec<_>>());
        let (records, _, _, _) = read_hot(Arc::clone(&reader), 0, all, Some(2)).await.unwrap();
        assert!(records.is_empty(), "{:?}", offsets(&records));

        // What the compactor archives from this log.
        let segment = |first, last, epoch| Agent::read_segment_from(Arc::clone(&reader), first, last, epoch);
        assert_eq!(offsets(&segment(0, 19, 1).await.unwrap()), (0..10).collect::<Vec<_>>());
        assert!(segment(0, 19, 2).await.unwrap().is_empty());
        assert_eq!(offsets(&segment(10, 14, 2).await.unwrap()), (10..15).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_counts_its_key_value_and_headers() {
        assert_eq!(record(0, 10).data_len(), 1 + 10 + 1 + 2);
        let empty = Record { offset: 0, timestamp_ms: 0, key: None, value: None, headers: Vec::new() };
        assert_eq!(empty.data_len(), 0);
    }

    #[test]
    fn fill_stops_at_the_byte_limit_and_at_the_record_limit() {
        let got = || (0..10).map(|o| record(o, 96)).collect::<Vec<_>>(); // 100 bytes each
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(10, 350)));
        assert_eq!((offsets(&page.records), page.used, page.next), (vec![0, 1, 2], 300, 3));
        // Exactly at the limit still fits.
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(10, 300)));
        assert_eq!(offsets(&page.records), vec![0, 1, 2]);
        let mut page = Page::new(0);
        assert!(page.fill(got(), &ReadLimit::new(2, 10_000)));
        assert_eq!(offsets(&page.records), vec![0, 1]);
        // Room for more: not full.
        let mut page = Page::new(0);
        assert!(!page.fill(got(), &ReadLimit::new(20, 10_000)));
        assert_eq!(page.records.len(), 10);
    }

    #[test]
    fn the_first_record_comes_whatever_its_size_unless_the_read_may_come_back_empty() {
        let big = || vec![record(0, 1_000_000), record(1, 10)];
        let mut page = Page::new(0);
        assert!(page.fill(big(), &ReadLimit::new(10, 100)));
        assert_eq!(offsets(&page.records), vec![0]);
        let later = ReadLimit { at_least_one: false, ..ReadLimit::new(10, 100) };
        let mut page = Page::new(0);
        assert!(page.fill(big(), &later));
        assert!(page.records.is_empty());
    }

    #[test]
    fn what_is_left_of_a_limit_carries_on_across_reads() {
        let limit = ReadLimit::new(10, 1000);
        let rest = limit.rest(3, 400);
        assert_eq!(rest, ReadLimit { records: 7, bytes: 600, at_least_one: false });
        assert!(!rest.is_spent());
        assert!(limit.rest(3, 1000).is_spent());
        assert!(limit.rest(10, 0).is_spent());
        // Nothing read yet: the first record still comes whatever the bytes left.
        assert!(!ReadLimit::new(10, 0).is_spent());
        assert_eq!(limit.rest(0, 0), limit);
    }
}
