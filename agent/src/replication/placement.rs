//! Which agents hold a segment, decided without I/O: the ensemble of a new segment (the writer
//! itself, then the reachable live agents that are members of the fewest open segments, ties by
//! id, so that every writer decides alike, up to the replication factor), and the repair of a
//! sealed segment short of replicas (which member is gone, and which agent copies it).

use std::collections::{BTreeMap, HashMap};

use silt_metadata::state::{Segment, SegmentState};
use silt_metadata::MetadataState;

/// The ensemble of a new segment written by `me`: `me` first, then up to
/// `replication_factor - 1` of `reachable` (other live agents that answered lately), the least
/// loaded first, where an agent's load is how many of `open_ensembles` it is a member of. Fewer
/// members than the replication factor when there are not enough agents.
pub(crate) fn choose_ensemble<'a>(
    me: &str,
    reachable: &[String],
    open_ensembles: impl IntoIterator<Item = &'a [String]>,
    replication_factor: usize,
) -> Vec<String> {
    let mut load: BTreeMap<&str, usize> =
        reachable.iter().filter(|a| *a != me).map(|a| (a.as_str(), 0)).collect();
    for ensemble in open_ensembles {
        for a in ensemble {
            if let Some(n) = load.get_mut(a.as_str()) {
                *n += 1;
            }
        }
    }
    let mut others: Vec<(&str, usize)> = load.into_iter().collect();
    others.sort_by_key(|(id, n)| (*n, *id));
    std::iter::once(me)
        .chain(others.into_iter().map(|(id, _)| id))
        .take(replication_factor.max(1))
        .map(String::from)
        .collect()
}

/// A sealed segment short of replicas, and the agent that is to copy it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repair {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub segment: u64,
    pub segment_epoch: u64,
    /// The member `with` replaces; `None` adds `with` to a segment sealed with fewer than R
    /// members.
    pub gone: Option<String>,
    pub with: String,
    pub with_addr: String,
    pub with_instance: String,
}

/// The first repair `me` is to lead, judged at the state's clock: a sealed segment whose first
/// intact member (live, on the disk it was written to) is `me`, with a member gone (its lease
/// lapsed more than `repair_after_ms` ago, or it came back with another disk) or fewer members
/// than the topic's replication factor; copied by the live agent outside the ensemble that is
/// a member of the fewest segments (ties by id), never the partition's writer and never one
/// that `failed_lately(topic, partition, segment, agent)`.
pub(crate) fn repair_candidate(
    s: &MetadataState,
    me: &str,
    repair_after_ms: u64,
    failed_lately: impl Fn(&str, u32, u64, &str) -> bool,
) -> Option<Repair> {
    let now = s.clock_ms;
    let recorded = |seg: &Segment, i: usize| seg.instances.get(i).filter(|r| !r.is_empty()).cloned();
    let intact = |seg: &Segment, i: usize, a: &str| {
        s.agents
            .get(a)
            .is_some_and(|info| info.is_live(now) && recorded(seg, i).is_none_or(|r| r == info.instance))
    };
    let gone = |seg: &Segment, i: usize, a: &str| match s.agents.get(a) {
        None => true,
        Some(info) => {
            recorded(seg, i).is_some_and(|r| r != info.instance)
                || (!info.is_live(now)
                    && now
                        >= info
                            .last_heartbeat_ms
                            .saturating_add(info.lease_ms)
                            .saturating_add(repair_after_ms))
        }
    };
    let mut load: HashMap<&str, usize> = s.live_agents().map(|a| (a.id.as_str(), 0)).collect();
    for seg in s.topics.values().flat_map(|t| t.partitions.iter()).flat_map(|p| p.segments.values()) {
        for a in &seg.ensemble {
            if let Some(n) = load.get_mut(a.as_str()) {
                *n += 1;
            }
        }
    }
    for t in s.topics.values() {
        for (p, part) in t.partitions.iter().enumerate() {
            for seg in part.segments.values().filter(|seg| seg.state == SegmentState::Sealed) {
                let first = seg.ensemble.iter().enumerate().find(|(i, a)| intact(seg, *i, a));
                if first.map(|(_, a)| a.as_str()) != Some(me) {
                    continue;
                }
                // A member gone, or else a missing one: a segment sealed after a follower left
                // midway has fewer than R members.
                let gone = seg.ensemble.iter().enumerate().find(|(i, a)| gone(seg, *i, a));
                let short = seg.ensemble.len() < t.config.replication_factor as usize;
                if gone.is_none() && !short {
                    continue;
                }
                // A live agent outside the ensemble; not the partition's writer, whose log
                // belongs to its writer task, nor one that failed this copy lately.
                let with = s
                    .live_agents()
                    .filter(|a| {
                        !seg.ensemble.contains(&a.id)
                            && part.writer.as_deref() != Some(a.id.as_str())
                            && !failed_lately(&t.name, p as u32, seg.base_offset, &a.id)
                    })
                    .min_by_key(|a| (load.get(a.id.as_str()).copied().unwrap_or(0), a.id.as_str()));
                let Some(with) = with else { continue };
                return Some(Repair {
                    topic: t.name.clone(),
                    topic_id: t.id,
                    partition: p as u32,
                    segment: seg.base_offset,
                    segment_epoch: seg.epoch,
                    gone: gone.map(|(_, a)| a.clone()),
                    with: with.id.clone(),
                    with_addr: with.addr.clone(),
                    with_instance: with.instance.clone(),
                });
            }
        }
    }
    None
}

/// A sealed segment whose holders all lost their disks, and the unverified members that may
/// show that the part of it they lack was never acknowledged (`Command::DeclareLost`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostRangeCheck {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub segment: u64,
    pub segment_epoch: u64,
    /// One past the segment's last offset.
    pub end: u64,
    /// The live unverified members on the disks recorded for them: (agent, address, instance).
    pub witnesses: Vec<(String, String, String)>,
    /// How many must lack an offset to show it was never acknowledged.
    pub needed: usize,
}

/// The first sealed segment, judged at the state's clock, whose holders all lost their disks
/// (each registered again with another instance, or forgotten) and whose first live unverified
/// member on the disk recorded for it is `me`, unless `failed_lately(topic, partition,
/// segment)`. A holder that is only away is waited for: it may come back with the segment.
pub(crate) fn lost_range_candidate(
    s: &MetadataState,
    me: &str,
    failed_lately: impl Fn(&str, u32, u64) -> bool,
) -> Option<LostRangeCheck> {
    let now = s.clock_ms;
    for t in s.topics.values() {
        for (p, part) in t.partitions.iter().enumerate() {
            for seg in part.segments.values().filter(|seg| seg.state == SegmentState::Sealed) {
                let (Some(needed), Some(last)) = (seg.witnesses_needed, seg.last_offset) else { continue };
                if seg.unverified.is_empty() || seg.instances.len() != seg.ensemble.len() {
                    continue;
                }
                let all_lost = seg.ensemble.iter().zip(&seg.instances).all(|(a, recorded)| {
                    !recorded.is_empty() && s.agents.get(a).is_none_or(|info| info.instance != *recorded)
                });
                if !all_lost {
                    continue;
                }
                let witnesses: Vec<(String, String, String)> = seg
                    .unverified
                    .iter()
                    .zip(&seg.unverified_instances)
                    .filter_map(|(a, recorded)| {
                        let info = s.agents.get(a)?;
                        (!recorded.is_empty() && info.instance == *recorded && info.is_live(now))
                            .then(|| (a.clone(), info.addr.clone(), recorded.clone()))
                    })
                    .collect();
                if witnesses.first().map(|(a, _, _)| a.as_str()) != Some(me)
                    || failed_lately(&t.name, p as u32, seg.base_offset)
                {
                    continue;
                }
                return Some(LostRangeCheck {
                    topic: t.name.clone(),
                    topic_id: t.id,
                    partition: p as u32,
                    segment: seg.base_offset,
                    segment_epoch: seg.epoch,
                    end: last + 1,
                    witnesses,
                    needed: needed as usize,
                });
            }
        }
    }
    None
}

/// A witness's answer: the agent, the instance it answered from, where its copy ends.
pub(crate) type WitnessAnswer = (String, String, u64);

/// What to declare of a segment ending at `end`, from what the witnesses answered (agent,
/// the instance it answered from, where its copy ends), those on another disk than the one
/// recorded already left out: where the segment ends from now on (the longest copy a witness
/// holds), and the witnesses; `None` when that shows nothing (the longest copy is shorter,
/// and fewer than `needed` lack the rest).
pub(crate) fn lost_range_declaration(
    end: u64,
    needed: usize,
    answers: &[WitnessAnswer],
) -> Option<(u64, Vec<WitnessAnswer>)> {
    let from = answers.iter().map(|(_, _, held)| (*held).min(end)).max()?;
    if from < end && answers.len() < needed {
        return None;
    }
    let witnesses = answers.iter().map(|(a, i, held)| (a.clone(), i.clone(), (*held).min(end))).collect();
    Some((from, witnesses))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_writer_comes_first_then_the_least_loaded_by_id() {
        let reachable = names(&["c", "b", "d", "a"]);
        let open = [names(&["x", "b", "c"]), names(&["y", "b"]), names(&["z", "d"])];
        let open: Vec<&[String]> = open.iter().map(Vec::as_slice).collect();
        // Loads: a 0, b 2, c 1, d 1.
        for (r, want) in [
            (1, vec!["w"]),
            (2, vec!["w", "a"]),
            (3, vec!["w", "a", "c"]),
            (4, vec!["w", "a", "c", "d"]),
            (5, vec!["w", "a", "c", "d", "b"]),
            (7, vec!["w", "a", "c", "d", "b"]),
        ] {
            assert_eq!(choose_ensemble("w", &reachable, open.iter().copied(), r), names(&want), "R={r}");
        }
        assert_eq!(choose_ensemble("w", &[], open.iter().copied(), 3), names(&["w"]), "alone");
        assert_eq!(choose_ensemble("w", &reachable, [], 0), names(&["w"]), "at least the writer");
    }

    /// Every number of other agents up to 5, every replication factor up to 5, every load of
    /// each agent up to 2 open segments: the writer first, no agent twice, none that is not
    /// reachable, as many members as there can be, and no member more loaded than an agent left
    /// out.
    #[test]
    fn an_ensemble_is_as_large_as_it_can_be_and_never_passes_over_a_less_loaded_agent() {
        for n in 0..=5usize {
            let others: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
            for loads in 0..3usize.pow(n as u32) {
                let load_of: Vec<usize> = (0..n).map(|i| (loads / 3usize.pow(i as u32)) % 3).collect();
                // Each open segment is one agent's membership, beside agents that are not
                // reachable (they count for nothing).
                let open: Vec<Vec<String>> = others
                    .iter()
                    .zip(&load_of)
                    .flat_map(|(a, l)| std::iter::repeat_n(vec![a.clone(), "gone".to_string()], *l))
                    .collect();
                for r in 1..=5usize {
                    let chosen = choose_ensemble("me", &others, open.iter().map(Vec::as_slice), r);
                    let case = format!("n={n} loads={load_of:?} R={r}");
                    assert_eq!(chosen[0], "me", "{case}");
                    assert_eq!(chosen.len(), r.min(n + 1), "{case}");
                    let mut unique = chosen.clone();
                    unique.sort();
                    unique.dedup();
                    assert_eq!(unique.len(), chosen.len(), "{case}: {chosen:?}");
                    let load = |a: &String| others.iter().position(|o| o == a).map(|i| load_of[i]);
                    assert!(chosen[1..].iter().all(|a| load(a).is_some()), "{case}: {chosen:?}");
                    let most_chosen = chosen[1..].iter().filter_map(load).max();
                    let least_left = others.iter().filter(|a| !chosen.contains(a)).filter_map(load).min();
                    if let (Some(most), Some(least)) = (most_chosen, least_left) {
                        assert!(most <= least, "{case}: {chosen:?}");
                    }
                }
            }
        }
    }

    /// A cluster's metadata built by applying commands, as metadata does.
    mod repair {
        use silt_metadata::{Command, MetadataState, Response};

        use super::super::{repair_candidate, Repair};

        const LEASE: u64 = 1_000;
        const AFTER: u64 = 5_000;

        fn apply(s: &mut MetadataState, c: Command) {
            if let Response::Error { error } = s.apply(&c) {
                panic!("{c:?}: {error}");
            }
        }

        fn register(s: &mut MetadataState, a: &str, disk: u32, now_ms: u64) {
            let (agent, instance, addr) = (a.to_string(), format!("{a}-disk{disk}"), format!("{a}:1"));
            apply(s, Command::RegisterAgent { agent, instance, addr, lease_ms: LEASE, now_ms });
        }

        /// `agents` heartbeat every half lease until `until`; the others' leases lapse.
        fn keep_alive(s: &mut MetadataState, agents: &[&str], until: u64) {
            let mut now_ms = s.clock_ms;
            while now_ms < until {
                now_ms = (now_ms + LEASE / 2).min(until);
                for a in agents {
                    let incarnation = s.agents[*a].incarnation;
                    apply(s, Command::AgentHeartbeat { agent: a.to_string(), incarnation, now_ms });
                }
            }
        }

        /// Agents a1..a5 at time 1,000, and topic `t` with one sealed segment of ten records
        /// written by `writer` on `ensemble`, with replication factor `r`.
        fn cluster(r: u32, ensemble: &[&str], writer: &str) -> MetadataState {
            let mut s = MetadataState::default();
            for a in ["a1", "a2", "a3", "a4", "a5"] {
                register(&mut s, a, 1, 1_000);
            }
            sealed(&mut s, "t", r, ensemble, writer);
            s
        }

        fn sealed(s: &mut MetadataState, topic: &str, r: u32, ensemble: &[&str], writer: &str) {
            sealed_naming(s, topic, r, ensemble, writer, None, &[]);
        }

        /// [`sealed`], the seal (a recovery's) naming `holders` and `unverified` members.
        fn sealed_naming(
            s: &mut MetadataState,
            topic: &str,
            r: u32,
            ensemble: &[&str],
            writer: &str,
            holders: Option<&[&str]>,
            unverified: &[&str],
        ) {
            let now_ms = s.clock_ms;
            let config = [("replication.factor".to_string(), r.to_string())].into();
            let (name, topic) = (topic.to_string(), topic.to_string());
            apply(s, Command::CreateTopic { name, partitions: 1, config, now_ms });
            let (agent, expected_epoch) = (writer.to_string(), None);
            apply(
                s,
                Command::ClaimWriter {
                    topic_id: None,
                    topic: topic.clone(),
                    partition: 0,
                    agent,
                    expected_epoch,
                },
            );
            let epoch = s.topics[&topic].partitions[0].epoch;
            let topic_id = Some(s.topics[&topic].id);
            let instances = ensemble.iter().map(|a| s.agents[*a].instance.clone()).collect();
            let ensemble = ensemble.iter().map(|a| a.to_string()).collect();
            apply(
                s,
                Command::OpenSegment {
                    topic: topic.clone(),
                    topic_id,
                    partition: 0,
                    epoch,
                    base_offset: 0,
                    ensemble,
                    instances,
                    now_ms,
                },
            );
            apply(
                s,
                Command::SealSegment {
                    record_witnesses_needed: true,
                    unverified: unverified.iter().map(|a| a.to_string()).collect(),
                    replicas: holders.map(|h| h.iter().map(|a| a.to_string()).collect()),
                    topic,
                    topic_id,
                    partition: 0,
                    epoch,
                    base_offset: 0,
                    record_count: 10,
                    size_bytes: 1_000,
                    min_timestamp_ms: None,
                    max_timestamp_ms: None,
                    now_ms,
                },
            );
        }

        fn candidate(s: &MetadataState, me: &str) -> Option<Repair> {
            repair_candidate(s, me, AFTER, |_, _, _, _| false)
        }

        /// (gone, with) of the repair `me` leads.
        fn chosen(s: &MetadataState, me: &str) -> Option<(Option<String>, String)> {
            candidate(s, me).map(|r| (r.gone, r.with))
        }

        fn some(gone: Option<&str>, with: &str) -> Option<(Option<String>, String)> {
            Some((gone.map(String::from), with.to_string()))
        }

        const ALL: [&str; 5] = ["a1", "a2", "a3", "a4", "a5"];

        #[test]
        fn a_whole_segment_on_live_members_needs_no_repair() {
            let mut s = cluster(3, &["a1", "a2", "a3"], "a1");
            keep_alive(&mut s, &ALL, 1_000 + 100 * LEASE);
            for me in ALL {
                assert_eq!(candidate(&s, me), None, "{me}");
            }
        }

        #[test]
        fn a_member_gone_past_its_lease_and_the_wait_is_replaced_by_the_least_loaded_live_agent() {
            let mut s = cluster(3, &["a1", "a2", "a3"], "a1");
            let live = ["a1", "a3", "a4", "a5"];
            // a2's last heartbeat was at 1,000: its lease lapses at 2,000, and it counts as
            // gone AFTER later.
            keep_alive(&mut s, &live, 1_000 + LEASE + AFTER - 1);
            assert_eq!(candidate(&s, "a1"), None, "a lapsed lease is not yet a member gone");
            keep_alive(&mut s, &live, 1_000 + LEASE + AFTER);
            let r = candidate(&s, "a1").expect("a1, the first intact member, leads the repair");
            let t = &s.topics["t"];
            assert_eq!((r.topic.as_str(), r.topic_id, r.partition, r.segment), ("t", t.id, 0, 0));
            assert_eq!(r.segment_epoch, t.partitions[0].segments[&0].epoch);
            assert_eq!(
                (r.gone.as_deref(), r.with.as_str()),
                (Some("a2"), "a4"),
                "a4 and a5 hold nothing: by id"
            );
            assert_eq!((r.with_addr.as_str(), r.with_instance.as_str()), ("a4:1", "a4-disk1"));
            for me in ["a2", "a3", "a4", "a5"] {
                assert_eq!(candidate(&s, me), None, "{me} is not the first intact member");
            }
            // a4 holds another segment: a5 is less loaded.
            sealed(&mut s, "u", 1, &["a4"], "a4");
            assert_eq!(chosen(&s, "a1"), some(Some("a2"), "a5"));
            // Nor does an agent that failed this copy lately take it again.
            let failed = |t: &str, p: u32, seg: u64, a: &str| (t, p, seg, a) == ("t", 0, 0, "a5");
            assert_eq!(repair_candidate(&s, "a1", AFTER, failed).map(|r| r.with), Some("a4".into()));
            assert_eq!(
                repair_candidate(&s, "a1", AFTER, |_, _, _, _| true),
                None,
                "no agent left to copy it"
            );
        }

        #[test]
        fn the_first_intact_member_leads_when_the_first_member_is_gone() {
            let mut s = cluster(3, &["a1", "a2", "a3"], "a1");
            keep_alive(&mut s, &["a3", "a4", "a5"], 1_000 + LEASE + AFTER);
            let r = candidate(&s, "a3").expect("a3 is the only intact member");
            assert_eq!(r.gone.as_deref(), Some("a1"), "the first member gone");
            let writer = s.topics["t"].partitions[0].writer.clone();
            assert!(
                ["a4", "a5"].contains(&r.with.as_str()) && Some(&r.with) != writer.as_ref(),
                "{r:?}, writer {writer:?}"
            );
            assert_eq!(candidate(&s, "a1"), None, "a1 is gone");
        }

        #[test]
        fn a_member_back_with_another_disk_is_replaced_at_once() {
            let mut s = cluster(3, &["a1", "a2", "a3"], "a1");
            // a2's lease lapsed at 2,000; it registers again from a new disk at 2,001, long
            // before it would count as gone for being away.
            keep_alive(&mut s, &["a1", "a3", "a4", "a5"], 2_001);
            register(&mut s, "a2", 2, 2_001);
            assert_eq!(chosen(&s, "a1"), some(Some("a2"), "a4"));
        }

        #[test]
        fn a_member_metadata_forgot_is_replaced_at_once() {
            let mut s = cluster(3, &["a1", "a2", "a3"], "a1");
            s.agents.remove("a2");
            assert_eq!(chosen(&s, "a1"), some(Some("a2"), "a4"));
        }

        #[test]
        fn a_segment_sealed_short_of_members_gets_one_more_never_from_the_writer() {
            let s = cluster(3, &["a1", "a2"], "a1");
            assert_eq!(chosen(&s, "a1"), some(None, "a3"));
            assert_eq!(candidate(&s, "a2"), None);
            let s = cluster(3, &["a1", "a2"], "a3");
            assert_eq!(
                chosen(&s, "a1"),
                some(None, "a4"),
                "a3 writes the partition: its log is its writer's"
            );
            let s = cluster(2, &["a1", "a2"], "a1");
            assert_eq!(candidate(&s, "a1"), None, "R=2 is met");
        }

        /// Topic `t` with one segment of ten records opened on a1, a2, a3 (replication factor
        /// 3, so 2 witnesses are needed) and sealed by a recovery that heard from a1 alone.
        fn sealed_by_a1_alone() -> MetadataState {
            let mut s = MetadataState::default();
            for a in ALL {
                register(&mut s, a, 1, 1_000);
            }
            sealed_naming(&mut s, "t", 3, &["a1", "a2", "a3"], "a1", Some(&["a1"]), &["a2", "a3"]);
            s
        }

        fn lost_check(s: &MetadataState, me: &str) -> Option<super::super::LostRangeCheck> {
            super::super::lost_range_candidate(s, me, |_, _, _| false)
        }

        #[test]
        fn a_range_is_checked_only_once_every_holder_lost_its_disk_by_the_first_live_witness() {
            let mut s = sealed_by_a1_alone();
            assert_eq!(lost_check(&s, "a2"), None, "a1, the holder, is on its disk");
            // a1 is away past its lease and the repair wait: it may come back with the segment.
            keep_alive(&mut s, &["a2", "a3", "a4", "a5"], 1_000 + LEASE + AFTER + 1);
            assert_eq!(lost_check(&s, "a2"), None, "a holder only away is waited for");
            let now = s.clock_ms;
            register(&mut s, "a1", 2, now);
            let c = lost_check(&s, "a2").expect("a2, the first unverified member, checks it");
            assert_eq!((c.topic.as_str(), c.partition, c.segment, c.end, c.needed), ("t", 0, 0, 10, 2));
            let witnesses: Vec<&str> = c.witnesses.iter().map(|(a, _, _)| a.as_str()).collect();
            assert_eq!(witnesses, ["a2", "a3"]);
            assert_eq!(c.witnesses[0].2, "a2-disk1", "the instance recorded for it");
            for me in ["a1", "a3", "a4"] {
                assert_eq!(lost_check(&s, me), None, "{me} does not lead");
            }
            assert_eq!(super::super::lost_range_candidate(&s, "a2", |_, _, _| true), None, "failed lately");
            // a2's disk is gone too: it is no witness, and a3 leads with itself alone.
            let until = s.clock_ms + 2 * LEASE;
            keep_alive(&mut s, &["a1", "a3", "a4", "a5"], until);
            let now = s.clock_ms;
            register(&mut s, "a2", 2, now);
            let c = lost_check(&s, "a3").expect("a3 leads");
            assert_eq!(c.witnesses.len(), 1);
            assert_eq!(lost_check(&s, "a2"), None);
            // And with a3's disk gone as well, nobody can say what the segment held.
            let until = s.clock_ms + 2 * LEASE;
            keep_alive(&mut s, &["a1", "a2", "a4", "a5"], until);
            let now = s.clock_ms;
            register(&mut s, "a3", 2, now);
            for me in ALL {
                assert_eq!(lost_check(&s, me), None, "{me}");
            }
        }

        #[test]
        fn the_answers_declare_lost_only_what_enough_witnesses_lack() {
            use super::super::lost_range_declaration as declare;
            let answer = |a: &str, held: u64| (a.to_string(), format!("{a}-disk1"), held);
            assert_eq!(declare(10, 2, &[]), None, "no answer");
            assert_eq!(declare(10, 2, &[answer("a2", 6)]), None, "one of the two needed");
            assert_eq!(
                declare(10, 2, &[answer("a2", 6), answer("a3", 4)]),
                Some((6, vec![answer("a2", 6), answer("a3", 4)])),
                "6..10 lost: both lack offset 6"
            );
            assert_eq!(
                declare(10, 2, &[answer("a2", 10)]),
                Some((10, vec![answer("a2", 10)])),
                "a2 holds it all: nothing is lost, one answer is enough"
            );
            assert_eq!(
                declare(10, 2, &[answer("a2", 12), answer("a3", 0)]),
                Some((10, vec![answer("a2", 10), answer("a3", 0)])),
                "a tail past the sealed end is not the segment's"
            );
        }
    }
}
