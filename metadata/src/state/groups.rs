//! Consumer groups: membership, exclusive assignment, and acknowledgement checkpoints.

use super::*;

impl MetadataState {
    /// `member` joins (or renews its session in) a group on a topic; members whose sessions lapsed leave.
    pub(super) fn join_group(
        &mut self,
        group: &str,
        topic: &str,
        member: &str,
        mode: GroupMode,
        session_timeout_ms: u64,
        now_ms: u64,
    ) -> Result<Response, MetadataError> {
        let partitions = self.topic(topic)?.partitions.len() as u32;
        check_name("group", group)?;
        check_name("member", member)?;
        let g =
            self.groups.entry(group.to_string()).or_insert_with(|| Group { mode, topics: BTreeMap::new() });
        if g.mode != mode {
            let existing = g.mode;
            if g.topics.is_empty() {
                g.mode = mode;
            } else {
                return Err(MetadataError::GroupModeMismatch {
                    group: group.to_string(),
                    existing,
                    requested: mode,
                });
            }
        }
        let gt = g.topics.entry(topic.to_string()).or_default();
        if !gt.members.contains_key(member) && gt.members.len() >= GROUP_MEMBERS_MAX {
            return Err(MetadataError::InvalidArgument(format!(
                "group '{group}' already has {GROUP_MEMBERS_MAX} members on topic '{topic}'"
            )));
        }
        gt.members.insert(member.to_string(), Member { last_seen_ms: now_ms, session_timeout_ms });
        gt.members.retain(|_, m| m.last_seen_ms.saturating_add(m.session_timeout_ms) >= now_ms);
        gt.rebalance(mode, partitions);
        Ok(gt.membership(mode, member, partitions))
    }

    /// `member` leaves a group on a topic.
    pub(super) fn leave_group(
        &mut self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Response, MetadataError> {
        let g = self.groups.get_mut(group).ok_or_else(|| MetadataError::UnknownGroup(group.to_string()))?;
        let mode = g.mode;
        let partitions = self.topics.get(topic).map_or(0, |t| t.partitions.len() as u32);
        if let Some(gt) = g.topics.get_mut(topic) {
            if gt.members.remove(member).is_some() {
                gt.rebalance(mode, partitions);
            }
        }
        Ok(Response::Ok)
    }

    /// Merges a group's acknowledgements of a partition into its checkpoint.
    pub(super) fn commit_acks(
        &mut self,
        group: &str,
        topic: &str,
        topic_id: Option<u64>,
        (partition, epoch): (u32, Option<u64>),
        floor: u64,
        acked: &[(u64, u64)],
    ) -> Result<Response, MetadataError> {
        self.check_topic_id(topic, topic_id)?;
        let Some(p) = self.topic(topic)?.partitions.get(partition as usize) else {
            return Err(MetadataError::UnknownPartition { topic: topic.to_string(), partition });
        };
        if let Some(epoch) = epoch.filter(|e| *e != p.epoch) {
            return Err(MetadataError::Fenced { expected: epoch, actual: p.epoch });
        }
        if acked.len() > ACKED_RANGES_MAX {
            return Err(MetadataError::InvalidArgument(format!(
                "an ack checkpoint may carry at most {ACKED_RANGES_MAX} ranges"
            )));
        }
        let g = self.groups.get_mut(group).ok_or_else(|| MetadataError::UnknownGroup(group.to_string()))?;
        let gt = g.topics.entry(topic.to_string()).or_default();
        let cp = gt.acks.entry(partition).or_default();
        cp.merge(floor, acked);
        Ok(Response::Ok)
    }

    /// Forgets a group.
    pub(super) fn delete_group(&mut self, group: &str) -> Result<Response, MetadataError> {
        if self.groups.remove(group).is_none() {
            return Err(MetadataError::UnknownGroup(group.to_string()));
        }
        Ok(Response::Ok)
    }
}

impl GroupTopic {
    /// Recomputes the exclusive assignment: partitions dealt round-robin to members in id order.
    fn rebalance(&mut self, mode: GroupMode, partitions: u32) {
        let assignment: BTreeMap<u32, String> = match mode {
            GroupMode::Shared => BTreeMap::new(),
            GroupMode::Exclusive => {
                let members: Vec<&String> = self.members.keys().collect();
                if members.is_empty() {
                    BTreeMap::new()
                } else {
                    (0..partitions).map(|p| (p, members[p as usize % members.len()].clone())).collect()
                }
            }
        };
        if assignment != self.assignment {
            self.assignment = assignment;
            self.generation += 1;
        }
    }

    fn membership(&self, mode: GroupMode, member: &str, partitions: u32) -> Response {
        let partitions = match mode {
            GroupMode::Shared => (0..partitions).collect(),
            GroupMode::Exclusive => {
                self.assignment.iter().filter(|(_, m)| m.as_str() == member).map(|(p, _)| *p).collect()
            }
        };
        Response::Membership { generation: self.generation, partitions }
    }
}

impl AckCheckpoint {
    /// Merges a newer checkpoint into this one. The floor never moves backwards and no
    /// acknowledged offset is forgotten.
    pub fn merge(&mut self, floor: u64, acked: &[(u64, u64)]) {
        let mut ranges: Vec<(u64, u64)> =
            self.acked.iter().chain(acked.iter()).copied().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        let mut floor = self.floor.max(floor);
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            if end < floor {
                continue;
            }
            let start = start.max(floor);
            if start == floor {
                floor = end + 1;
                continue;
            }
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        // A range that reached the floor after it was pushed must be folded in too.
        merged.retain(|(_, end)| *end >= floor);
        while let Some(first) = merged.first() {
            if first.0 <= floor {
                floor = floor.max(first.1 + 1);
                merged.remove(0);
            } else {
                break;
            }
        }
        self.floor = floor;
        self.acked = merged;
    }

    /// Whether `offset` is acknowledged.
    pub fn is_acked(&self, offset: u64) -> bool {
        offset < self.floor || self.acked.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }
}
