//! A partition's writers and segments: claims, opens, seals and rolls, members of sealed
//! segments, archiving, retention, and a rebuild's restores.

use super::*;

impl MetadataState {
    /// `agent` becomes the partition's writer at the next epoch.
    pub(super) fn claim_writer(
        &mut self,
        topic: &str,
        partition: u32,
        agent: &str,
        expected_epoch: Option<u64>,
    ) -> Result<Response, MetadataError> {
        let p = self.partition_mut(topic, partition)?;
        if let Some(expected) = expected_epoch {
            if expected != p.epoch {
                return Err(MetadataError::Fenced { expected, actual: p.epoch });
            }
        }
        p.epoch += 1;
        p.writer = Some(agent.to_string());
        Ok(Response::Epoch { epoch: p.epoch })
    }

    /// A new open segment where the partition's log ends, written by the writer of `epoch`.
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn open_segment(
        &mut self,
        topic: &str,
        topic_id: Option<u64>,
        partition: u32,
        epoch: u64,
        base_offset: u64,
        ensemble: &[String],
        instances: &[String],
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, topic_id)?;
        let p = self.partition_mut(topic, partition)?;
        check_epoch(p, epoch)?;
        if let Some(open) = p.open_segment() {
            return Err(MetadataError::InvalidArgument(format!(
                "partition {topic}/{partition} already has an open segment at offset {}",
                open.base_offset
            )));
        }
        let expected = p.next_segment_base();
        if base_offset != expected {
            return Err(MetadataError::InvalidArgument(format!(
                "a new segment of {topic}/{partition} must start at offset {expected}, not {base_offset}"
            )));
        }
        p.segments.insert(base_offset, new_open_segment(base_offset, epoch, ensemble, instances, now_ms));
        Ok(Response::Ok)
    }

    /// Seals the open segment at `base_offset` with what it holds; a seal of no records removes it.
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn seal_segment(
        &mut self,
        topic: &str,
        topic_id: Option<u64>,
        partition: u32,
        epoch: u64,
        base_offset: u64,
        record_count: u64,
        size_bytes: u64,
        min_timestamp_ms: Option<i64>,
        max_timestamp_ms: Option<i64>,
        replicas: Option<&[String]>,
        unverified: &[String],
        record_witnesses_needed: bool,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, topic_id)?;
        let write_quorum = self.topics.get(topic).map_or(1, |t| t.config.write_quorum());
        let p = self.partition_mut(topic, partition)?;
        check_epoch(p, epoch)?;
        let segment = match p.segments.get_mut(&base_offset) {
            Some(s) if s.state == SegmentState::Open => s,
            _ => {
                return Err(MetadataError::InvalidArgument(format!(
                    "partition {topic}/{partition} has no open segment at offset {base_offset}"
                )))
            }
        };
        if record_count == 0 {
            p.segments.remove(&base_offset);
            if p.segments.is_empty() {
                p.empty_end = base_offset;
            }
            return Ok(Response::Ok);
        }
        let twice = |names: &[String]| names.iter().enumerate().any(|(i, a)| names[..i].contains(a));
        if twice(unverified) || replicas.is_some_and(twice) {
            return Err(MetadataError::InvalidArgument(format!(
                "segment {base_offset}: a seal names a member twice (replicas {replicas:?}, unverified {unverified:?})"
            )));
        }
        if !unverified.is_empty() {
            let keep = replicas.unwrap_or_default();
            let named = |a: &String| segment.ensemble.contains(a) && !keep.contains(a);
            if replicas.is_none() || !unverified.iter().all(named) {
                return Err(MetadataError::InvalidArgument(format!(
                    "the unverified members of segment {base_offset} must be members of its ensemble {:?} \
                     other than its replicas {keep:?}",
                    segment.ensemble
                )));
            }
        }
        // Fixed before the seal names fewer members: the ensemble the segment was written to.
        let members = segment.ensemble.len();
        let witnesses_needed = (record_witnesses_needed && members > 0 && segment.instances.len() == members)
            .then(|| (members + 1 - write_quorum.clamp(1, members)) as u32);
        if let Some(keep) = replicas {
            // The writer names the members that hold the whole segment: a follower
            // that left the ensemble midway holds only part of it.
            if keep.is_empty() || keep.iter().any(|a| !segment.ensemble.contains(a)) {
                return Err(MetadataError::InvalidArgument(format!(
                    "the replicas of segment {base_offset} must be members of its ensemble {:?}",
                    segment.ensemble
                )));
            }
            let instance_of = |a: &String| {
                segment.ensemble.iter().position(|m| m == a).and_then(|i| segment.instances.get(i))
            };
            let unverified_instances: Vec<String> =
                unverified.iter().map(|a| instance_of(a).cloned().unwrap_or_default()).collect();
            segment.unverified_instances =
                if segment.instances.is_empty() { Vec::new() } else { unverified_instances };
            segment.unverified = unverified.to_vec();
            let kept: Vec<(String, String)> = segment
                .ensemble
                .iter()
                .enumerate()
                .filter(|(_, a)| keep.contains(a))
                .map(|(i, a)| (a.clone(), segment.instances.get(i).cloned().unwrap_or_default()))
                .collect();
            let had_instances = !segment.instances.is_empty();
            segment.ensemble = kept.iter().map(|(a, _)| a.clone()).collect();
            segment.instances =
                if had_instances { kept.into_iter().map(|(_, i)| i).collect() } else { Vec::new() };
        }
        segment.witnesses_needed = witnesses_needed;
        segment.last_offset = Some(base_offset + record_count - 1);
        segment.state = SegmentState::Sealed;
        segment.silent_since_ms.clear();
        segment.record_count = record_count;
        segment.size_bytes = size_bytes;
        segment.min_timestamp_ms = min_timestamp_ms;
        segment.max_timestamp_ms = max_timestamp_ms;
        segment.sealed_ms = Some(now_ms);
        Ok(Response::Ok)
    }

    /// A seal and the open of the next segment in one step: both or neither.
    pub(super) fn roll_segment(&mut self, seal: &Command, open: &Command) -> Result<Response, MetadataError> {
        let (
            Command::SealSegment { topic, topic_id, partition, epoch, base_offset, record_count, .. },
            Command::OpenSegment {
                topic: open_topic,
                topic_id: open_topic_id,
                partition: open_partition,
                epoch: open_epoch,
                base_offset: open_base,
                ensemble,
                instances,
                now_ms,
            },
        ) = (seal, open)
        else {
            return Err(MetadataError::InvalidArgument(
                "a roll_segment is a seal_segment and an open_segment".into(),
            ));
        };
        if (topic, topic_id, partition, epoch) != (open_topic, open_topic_id, open_partition, open_epoch) {
            return Err(MetadataError::InvalidArgument(format!(
                "a roll seals and opens segments of one partition under one epoch, not \
                 {topic}/{partition} at epoch {epoch} and {open_topic}/{open_partition} at epoch {open_epoch}"
            )));
        }
        let next = base_offset.checked_add(*record_count).ok_or_else(|| {
            MetadataError::InvalidArgument(format!(
                "{record_count} records from offset {base_offset} overflow"
            ))
        })?;
        if *open_base != next {
            return Err(MetadataError::InvalidArgument(format!(
                "the segment after {base_offset} ({record_count} records) of {topic}/{partition} \
                 must start at offset {next}, not {open_base}"
            )));
        }
        if *record_count == 0 {
            // An empty open segment opened again with another ensemble: replaced in
            // place. Removed first (as a seal of no records does), it could leave no
            // segment to say where the partition's next offset is (retention keeps
            // only the open one of a quiet partition).
            self.check_topic_id(topic, *topic_id)?;
            let p = self.partition_mut(topic, *partition)?;
            check_epoch(p, *epoch)?;
            if !p.segments.get(base_offset).is_some_and(|s| s.state == SegmentState::Open) {
                return Err(MetadataError::InvalidArgument(format!(
                    "partition {topic}/{partition} has no open segment at offset {base_offset}"
                )));
            }
            p.segments
                .insert(*base_offset, new_open_segment(*base_offset, *epoch, ensemble, instances, *now_ms));
            return Ok(Response::Ok);
        }
        // The seal changes nothing when refused. Once it is applied the open cannot be:
        // same topic, id and epoch, the partition has no open segment left, and the
        // sealed segment (the chain's last, holding records) ends where the new one starts.
        self.try_apply(seal)?;
        self.try_apply(open)
    }

    /// `with` holds a sealed segment instead of `gone`.
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn replace_replica(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        base_offset: u64,
        gone: &str,
        with: &str,
        instance: &str,
    ) -> Result<Response, MetadataError> {
        let seg = self.sealed_segment_for_new_member(topic, topic_id, partition, base_offset, with)?;
        let Some(i) = seg.ensemble.iter().position(|a| a == gone) else {
            return Err(MetadataError::InvalidArgument(format!(
                "agent '{gone}' holds no replica of segment {base_offset} of {topic}/{partition}"
            )));
        };
        seg.ensemble[i] = with.to_string();
        if let Some(slot) = seg.instances.get_mut(i) {
            *slot = instance.to_string();
        }
        // A copy from a holder replaces whatever it held unverified.
        if let Some(u) = seg.unverified.iter().position(|a| a == with) {
            seg.unverified.remove(u);
            if u < seg.unverified_instances.len() {
                seg.unverified_instances.remove(u);
            }
        }
        Ok(Response::Ok)
    }

    /// `with` holds a sealed segment short of members too.
    pub(super) fn add_replica(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        base_offset: u64,
        with: &str,
        instance: &str,
    ) -> Result<Response, MetadataError> {
        let wanted = self.topics.get(topic).map_or(0, |t| t.config.replication_factor as usize);
        let seg = self.sealed_segment_for_new_member(topic, topic_id, partition, base_offset, with)?;
        if let Some(u) = seg.unverified.iter().position(|a| a == with) {
            // An unverified member that holds the whole segment now (it showed it did, or a
            // repair copied it there, onto whatever disk it has) is a holder again.
            seg.unverified.remove(u);
            if u < seg.unverified_instances.len() {
                seg.unverified_instances.remove(u);
            }
            if seg.instances.len() == seg.ensemble.len() && !seg.instances.is_empty() {
                seg.instances.push(instance.to_string());
            }
            seg.ensemble.push(with.to_string());
            return Ok(Response::Ok);
        }
        if seg.ensemble.len() >= wanted {
            return Err(MetadataError::InvalidArgument(format!(
                "segment {base_offset} of {topic}/{partition} already has {} members (replication.factor={wanted})",
                seg.ensemble.len()
            )));
        }
        // Instances are recorded for every member or for none.
        if seg.instances.len() == seg.ensemble.len() && !seg.instances.is_empty() {
            seg.instances.push(instance.to_string());
        }
        seg.ensemble.push(with.to_string());
        Ok(Response::Ok)
    }

    /// A recovery of the open segment waits for the members `silent`, each from now on unless
    /// it already did, and no longer for the others (see `Command::WaitForSilentMembers`).
    pub(super) fn wait_for_silent_members(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        (base_offset, segment_epoch): (u64, u64),
        silent: &[String],
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, Some(topic_id))?;
        let now = self.clock_ms;
        let t = self.topics.get_mut(topic).ok_or_else(|| MetadataError::UnknownTopic(topic.to_string()))?;
        let p = t
            .partitions
            .get_mut(partition as usize)
            .ok_or_else(|| MetadataError::UnknownPartition { topic: topic.to_string(), partition })?;
        match p.segments.get_mut(&base_offset) {
            Some(seg) if seg.state == SegmentState::Open && seg.epoch == segment_epoch => {
                seg.silent_since_ms.retain(|m, _| silent.contains(m));
                for m in silent.iter().filter(|m| seg.ensemble.contains(m)) {
                    seg.silent_since_ms.entry(m.clone()).or_insert(now);
                }
                Ok(Response::Ok)
            }
            _ => Err(MetadataError::InvalidArgument(format!(
                "segment {base_offset} of {topic}/{partition} is not open under epoch {segment_epoch}"
            ))),
        }
    }

    /// Offsets `from..end` of a sealed segment are lost (see `Command::DeclareLost`).
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn declare_lost(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        base_offset: u64,
        segment_epoch: u64,
        (from, end): (u64, u64),
        size_bytes: u64,
        witnesses: &[Witness],
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, Some(topic_id))?;
        let agents = &self.agents;
        let refused = |why: String| {
            Err(MetadataError::InvalidArgument(format!(
                "offsets {from}..{end} of segment {base_offset} of {topic}/{partition} cannot be declared lost: {why}"
            )))
        };
        let t = self.topics.get_mut(topic).ok_or_else(|| MetadataError::UnknownTopic(topic.to_string()))?;
        let p = t
            .partitions
            .get_mut(partition as usize)
            .ok_or_else(|| MetadataError::UnknownPartition { topic: topic.to_string(), partition })?;
        let Some(seg) = p.segments.get_mut(&base_offset) else {
            return refused("there is no such segment".into());
        };
        if seg.state != SegmentState::Sealed
            || seg.epoch != segment_epoch
            || seg.last_offset.map(|l| l + 1) != Some(end)
        {
            return refused(format!(
                "the segment is {:?} under epoch {} ending at {:?}, not sealed under epoch {segment_epoch} ending at {}",
                seg.state,
                seg.epoch,
                seg.last_offset,
                end.saturating_sub(1)
            ));
        }
        let Some(needed) = seg.witnesses_needed else {
            return refused("its seal recorded no disk instances to judge witnesses by".into());
        };
        if from < base_offset || from > end {
            return refused("the new end must lie within the segment".into());
        }
        // Every holder lost its disk: one that is only away may come back with the range.
        if seg.instances.len() != seg.ensemble.len() {
            return refused("its holders' disk instances are not recorded".into());
        }
        let still_held = seg.ensemble.iter().zip(&seg.instances).find(|(a, recorded)| {
            recorded.is_empty() || agents.get(*a).is_some_and(|info| info.instance == **recorded)
        });
        if let Some((holder, _)) = still_held {
            return refused(format!("agent '{holder}' may still hold it on the disk it was written to"));
        }
        for (i, w) in witnesses.iter().enumerate() {
            if witnesses[..i].iter().any(|o| o.agent == w.agent) {
                return refused(format!("agent '{}' is named twice", w.agent));
            }
            let recorded = seg
                .unverified
                .iter()
                .position(|a| *a == w.agent)
                .and_then(|u| seg.unverified_instances.get(u))
                .filter(|r| !r.is_empty());
            if recorded != Some(&w.instance) {
                return refused(format!(
                    "agent '{}' is not an unverified member answering from the disk recorded for it",
                    w.agent
                ));
            }
            if w.held_end < base_offset || w.held_end > from {
                return refused(format!("agent '{}' holds up to {}, past the new end", w.agent, w.held_end));
            }
        }
        let holders: Vec<&Witness> =
            witnesses.iter().filter(|w| w.held_end == from && from > base_offset).collect();
        if from < end && witnesses.len() < needed as usize {
            return refused(format!(
                "{} witness(es) lack offset {from}, {needed} must show it was never acknowledged",
                witnesses.len()
            ));
        }
        if from > base_offset && holders.is_empty() {
            return refused(format!("no witness holds the segment up to {from}"));
        }
        if from == base_offset {
            // Nothing of it is left: the chain steps over it, as over any gap.
            p.segments.remove(&base_offset);
        } else {
            seg.last_offset = Some(from - 1);
            seg.record_count = from - base_offset;
            seg.size_bytes = size_bytes;
            seg.ensemble = holders.iter().map(|w| w.agent.clone()).collect();
            seg.instances = holders.iter().map(|w| w.instance.clone()).collect();
            let (unverified, unverified_instances): (Vec<String>, Vec<String>) = seg
                .unverified
                .iter()
                .zip(&seg.unverified_instances)
                .filter(|(a, _)| !seg.ensemble.contains(a))
                .map(|(a, i)| (a.clone(), i.clone()))
                .unzip();
            seg.unverified = unverified;
            seg.unverified_instances = unverified_instances;
        }
        if from < end {
            p.lost_ranges.push(LostRange { from, end });
            p.empty_end = p.empty_end.max(end);
        }
        Ok(Response::Ok)
    }

    /// A sealed segment is in the archive, as `object_key`.
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn archive_segment(
        &mut self,
        topic: &str,
        topic_id: Option<u64>,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
        object_key: &str,
        object_bytes: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, topic_id)?;
        let p = self.partition_mut(topic, partition)?;
        let segment = p.segments.get_mut(&base_offset).ok_or_else(|| {
            MetadataError::InvalidArgument(format!(
                "partition {topic}/{partition} has no segment at offset {base_offset}"
            ))
        })?;
        match segment.state {
            SegmentState::Sealed if segment.last_offset == Some(last_offset) => {}
            SegmentState::Archived if segment.object_key.as_deref() == Some(object_key) => {
                // A retry after a lost reply: already done.
                return Ok(Response::Ok);
            }
            state => {
                return Err(MetadataError::InvalidArgument(format!(
                    "segment {base_offset} of {topic}/{partition} is {state:?} ending at {:?}; only a sealed segment ending at {last_offset} can be archived",
                    segment.last_offset
                )))
            }
        }
        segment.state = SegmentState::Archived;
        segment.object_key = Some(object_key.to_string());
        segment.object_bytes = object_bytes;
        segment.archived_ms = Some(now_ms);
        // The archive holds it now; no local copy is waited for.
        segment.unverified.clear();
        segment.unverified_instances.clear();
        Ok(Response::Ok)
    }

    /// Retention: forgets the oldest archived segments of a partition, never its newest segment.
    pub(super) fn delete_archived_segments(
        &mut self,
        topic: &str,
        topic_id: Option<u64>,
        partition: u32,
        base_offsets: &[u64],
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, topic_id)?;
        let p = self.partition_mut(topic, partition)?;
        let oldest: Vec<u64> = p.segments.keys().take(base_offsets.len()).copied().collect();
        let mut wanted = base_offsets.to_vec();
        wanted.sort_unstable();
        if wanted != oldest || wanted.iter().any(|b| p.segments[b].state != SegmentState::Archived) {
            return Err(MetadataError::InvalidArgument(format!(
                "only the oldest archived segments of {topic}/{partition} can be deleted, in order"
            )));
        }
        // The last segment is never deleted: it anchors where the next one starts.
        if wanted.len() == p.segments.len() {
            return Err(MetadataError::InvalidArgument(format!(
                "the newest segment of {topic}/{partition} cannot be deleted"
            )));
        }
        for b in wanted {
            p.segments.remove(&b);
        }
        Ok(Response::Ok)
    }

    /// A rebuild: the partition's log ends no earlier than `end`.
    pub(super) fn restore_partition_end(
        &mut self,
        topic: &str,
        partition: u32,
        end: u64,
    ) -> Result<Response, MetadataError> {
        let p = self.partition_mut(topic, partition)?;
        if let Some(open) = p.open_segment() {
            return Err(MetadataError::InvalidArgument(format!(
                "partition {topic}/{partition} has an open segment at offset {}: only a rebuild, \
                 before any writer starts, may move where its log ends",
                open.base_offset
            )));
        }
        p.empty_end = p.empty_end.max(end);
        Ok(Response::Ok)
    }

    /// A rebuild: an archived object becomes an archived segment again (its topic created if the archive does not describe it).
    #[allow(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn restore_archived_segment(
        &mut self,
        topic: &str,
        partitions: u32,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
        record_count: u64,
        min_timestamp_ms: Option<i64>,
        max_timestamp_ms: Option<i64>,
        object_key: &str,
        object_bytes: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        if partition >= partitions {
            return Err(MetadataError::InvalidArgument(format!(
                "object {object_key} is for partition {partition} of a topic with {partitions} partitions"
            )));
        }
        if last_offset < base_offset || last_offset - base_offset + 1 != record_count {
            return Err(MetadataError::InvalidArgument(format!(
                "object {object_key} claims offsets {base_offset}..={last_offset} but {record_count} records"
            )));
        }
        if !self.topics.contains_key(topic) {
            self.create_topic(topic, partitions, &BTreeMap::new(), now_ms)?;
        }
        let p = self.partition_mut(topic, partition)?;
        // Segments never overlap one another: only the one starting at or before the
        // object and those starting inside it can overlap it (no scan of the chain:
        // a rebuild restores every object of a partition this way).
        use std::ops::Bound::{Excluded, Included};
        let overlaps = p
            .segments
            .range(..=base_offset)
            .next_back()
            .is_some_and(|(_, s)| s.last_offset.is_none_or(|end| end >= base_offset))
            || p.segments.range((Excluded(base_offset), Included(last_offset))).next().is_some();
        if overlaps {
            if p.segments.get(&base_offset).and_then(|s| s.object_key.as_deref()) == Some(object_key) {
                return Ok(Response::Ok);
            }
            return Err(MetadataError::InvalidArgument(format!(
                "object {object_key} overlaps a segment {topic}/{partition} already has"
            )));
        }
        p.segments.insert(
            base_offset,
            Segment {
                unverified: Vec::new(),
                unverified_instances: Vec::new(),
                base_offset,
                last_offset: Some(last_offset),
                state: SegmentState::Archived,
                epoch: p.epoch,
                ensemble: Vec::new(),
                instances: Vec::new(),
                size_bytes: 0,
                record_count,
                min_timestamp_ms,
                max_timestamp_ms,
                opened_ms: now_ms,
                sealed_ms: Some(now_ms),
                object_key: Some(object_key.to_string()),
                object_bytes,
                archived_ms: Some(now_ms),
                witnesses_needed: None,
                silent_since_ms: Default::default(),
            },
        );
        Ok(Response::Ok)
    }

    /// The sealed segment at `base_offset` of a partition of the topic with id `topic_id`, for
    /// `with` to become a member of: refused if there is none, or if `with` is one already.
    fn sealed_segment_for_new_member(
        &mut self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        base_offset: u64,
        with: &str,
    ) -> Result<&mut Segment, MetadataError> {
        self.check_topic_id(topic, Some(topic_id))?;
        let p = self.partition_mut(topic, partition)?;
        let Some(seg) = p.segments.get_mut(&base_offset).filter(|s| s.state == SegmentState::Sealed) else {
            return Err(MetadataError::InvalidArgument(format!(
                "{topic}/{partition} has no sealed segment at offset {base_offset}"
            )));
        };
        if seg.ensemble.iter().any(|a| a == with) {
            return Err(MetadataError::InvalidArgument(format!(
                "agent '{with}' already holds segment {base_offset} of {topic}/{partition}"
            )));
        }
        Ok(seg)
    }
}

/// A new, empty open segment at `base_offset`.
fn new_open_segment(
    base_offset: u64,
    epoch: u64,
    ensemble: &[String],
    instances: &[String],
    now_ms: u64,
) -> Segment {
    Segment {
        unverified: Vec::new(),
        unverified_instances: Vec::new(),
        base_offset,
        last_offset: None,
        state: SegmentState::Open,
        epoch,
        ensemble: ensemble.to_vec(),
        instances: instances.to_vec(),
        size_bytes: 0,
        record_count: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        opened_ms: now_ms,
        sealed_ms: None,
        object_key: None,
        object_bytes: 0,
        archived_ms: None,
        witnesses_needed: None,
        silent_since_ms: Default::default(),
    }
}

fn check_epoch(p: &Partition, epoch: u64) -> Result<(), MetadataError> {
    if p.epoch != epoch {
        return Err(MetadataError::Fenced { expected: epoch, actual: p.epoch });
    }
    Ok(())
}
