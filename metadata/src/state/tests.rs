use super::*;
use proptest::prelude::*;

fn create(state: &mut MetadataState, name: &str, partitions: u32) -> Response {
    state.apply(&Command::CreateTopic { name: name.into(), partitions, config: BTreeMap::new(), now_ms: 1 })
}

fn join(state: &mut MetadataState, member: &str, now_ms: u64) -> Response {
    state.apply(&Command::JoinGroup {
        group: "g".into(),
        topic: "t".into(),
        member: member.into(),
        mode: GroupMode::Exclusive,
        session_timeout_ms: 10_000,
        now_ms,
    })
}

#[test]
fn offsets_are_archived_when_one_archived_segment_holds_them_or_retention_deleted_them() {
    let segment = |base: u64, last: Option<u64>, state: SegmentState| Segment {
        unverified: Vec::new(),
        unverified_instances: Vec::new(),
        base_offset: base,
        last_offset: last,
        state,
        epoch: 1,
        ensemble: Vec::new(),
        instances: Vec::new(),
        size_bytes: 0,
        record_count: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        opened_ms: 0,
        sealed_ms: None,
        object_key: None,
        object_bytes: 0,
        archived_ms: None,
        witnesses_needed: None,
        silent_since_ms: Default::default(),
    };
    let mut p = Partition::default();
    for seg in [
        segment(10, Some(19), SegmentState::Archived),
        segment(20, Some(29), SegmentState::Archived),
        segment(30, Some(39), SegmentState::Sealed),
        segment(40, None, SegmentState::Open),
    ] {
        p.segments.insert(seg.base_offset, seg);
    }
    assert!(p.is_archived(10, 19) && p.is_archived(22, 25) && p.is_archived(20, 29));
    assert!(p.is_archived(0, 9), "below the chain: deleted by retention");
    assert!(!p.is_archived(5, 12), "partly below the chain, partly archived: not one segment");
    assert!(!p.is_archived(15, 25), "two archived segments: not one segment");
    assert!(!p.is_archived(30, 31) && !p.is_archived(25, 35) && !p.is_archived(40, 41));
    assert!(!Partition::default().is_archived(0, 0), "nothing archived yet");
}

#[test]
fn a_topics_configs_are_altered_all_or_none() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 1);
    let id = s.topics["t"].id;
    let alter = |topic_id: Option<u64>, pairs: &[(&str, &str)]| Command::AlterTopicConfig {
        name: "t".into(),
        topic_id,
        config: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    assert_eq!(s.apply(&alter(Some(id), &[("retention.ms", "-1"), ("segment.ms", "5000")])), Response::Ok);
    assert_eq!((s.topics["t"].config.retention_ms, s.topics["t"].config.segment_ms), (None, 5000));

    // One bad entry refuses the whole change; so do an empty one, a replication.factor
    // change, a rule spanning configs, another topic's id and an unknown topic.
    let before = s.clone();
    for (command, why) in [
        (alter(None, &[("segment.ms", "100"), ("max.deliveries", "0")]), "max.deliveries=0"),
        (alter(None, &[]), "no config to alter"),
        (alter(None, &[("replication.factor", "3")]), "replication.factor cannot be altered"),
        (alter(None, &[("min.insync.replicas", "2")]), "min.insync.replicas cannot be altered"),
        (alter(None, &[("max.message.bytes", "0")]), "max.message.bytes=0"),
        (alter(Some(id + 1), &[("segment.ms", "100")]), "deleted and created again"),
    ] {
        let r = s.apply(&command);
        assert!(
            matches!(&r, Response::Error { error } if error.to_string().contains(why)),
            "{command:?}: {r:?}"
        );
    }
    let unknown = Command::AlterTopicConfig { name: "u".into(), topic_id: None, config: BTreeMap::new() };
    assert!(matches!(s.apply(&unknown), Response::Error { error: MetadataError::UnknownTopic(_) }));
    assert_eq!(s, before);
    // Setting replication.factor to what it is already is no change, so it is accepted.
    assert_eq!(s.apply(&alter(None, &[("replication.factor", "1")])), Response::Ok);
}

#[test]
fn commands_for_a_deleted_topic_do_not_touch_its_successor() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 1);
    let old_id = s.topics["t"].id;
    assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: None }), Response::Ok);
    create(&mut s, "t", 1);
    let claim = Command::ClaimWriter {
        topic_id: None,
        topic: "t".into(),
        partition: 0,
        agent: "b".into(),
        expected_epoch: None,
    };
    assert!(matches!(s.apply(&claim), Response::Epoch { epoch: 1 }));
    let open = |topic_id| Command::OpenSegment {
        topic: "t".into(),
        topic_id,
        partition: 0,
        epoch: 1,
        base_offset: 0,
        ensemble: vec!["b".into()],
        instances: Vec::new(),
        now_ms: 1,
    };
    assert!(matches!(s.apply(&open(Some(old_id))), Response::Error { .. }));
    assert_eq!(s.apply(&open(Some(s.topics["t"].id))), Response::Ok);
    // A writer of the old topic taking a new epoch (at the epoch it wrote under, 1 as the new
    // one's) does not take the new topic's partition.
    let before = s.clone();
    let claim_old = Command::ClaimWriter {
        topic_id: Some(old_id),
        topic: "t".into(),
        partition: 0,
        agent: "a".into(),
        expected_epoch: Some(1),
    };
    assert!(matches!(s.apply(&claim_old), Response::Error { .. }));
    assert_eq!(s, before);
    let before = s.clone();
    let seal = Command::SealSegment {
        record_witnesses_needed: false,
        unverified: Vec::new(),
        replicas: None,
        topic: "t".into(),
        topic_id: Some(old_id),
        partition: 0,
        epoch: 1,
        base_offset: 0,
        record_count: 0,
        size_bytes: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        now_ms: 2,
    };
    assert!(matches!(s.apply(&seal), Response::Error { .. }), "the old writer cannot seal the new segment");
    assert_eq!(s, before);
    s.apply(&Command::JoinGroup {
        group: "g".into(),
        topic: "t".into(),
        member: "m".into(),
        mode: GroupMode::Shared,
        session_timeout_ms: 1000,
        now_ms: 2,
    });
    let before_acks = s.clone();
    let acks = Command::CommitAcks {
        group: "g".into(),
        topic: "t".into(),
        topic_id: Some(old_id),
        partition: 0,
        epoch: None,
        floor: 10,
        acked: vec![],
    };
    assert!(matches!(s.apply(&acks), Response::Error { .. }), "old ack floors do not apply to the new topic");
    assert_eq!(s, before_acks);
}

#[test]
fn create_and_delete_topic() {
    let mut s = MetadataState::default();
    assert!(matches!(create(&mut s, "t", 4), Response::Topic { .. }));
    assert_eq!(s.topics["t"].partitions.len(), 4);
    let before = s.clone();
    assert!(matches!(create(&mut s, "t", 2), Response::Error { error: MetadataError::TopicExists(_) }));
    assert_eq!(s, before, "a refused command changes nothing");
    assert!(matches!(create(&mut s, "u", 0), Response::Error { .. }));
    assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: None }), Response::Ok);
    assert!(s.topics.is_empty());
    create(&mut s, "t", 1);
    assert_eq!(s.topics["t"].id, 1, "ids are never reused");
}

/// Partition 0 of topic "t" (created with `config`) with writer "a" and an open segment at
/// offset 0 on "a", "b" and "c" (instances "ia", "ib", "ic").
fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn open_on_three(config: &[(&str, &str)]) -> MetadataState {
    let mut s = MetadataState::default();
    s.apply(&Command::CreateTopic {
        name: "t".into(),
        partitions: 1,
        config: config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        now_ms: 1,
    });
    let claim = Command::ClaimWriter {
        topic_id: None,
        topic: "t".into(),
        partition: 0,
        agent: "a".into(),
        expected_epoch: None,
    };
    assert_eq!(s.apply(&claim), Response::Epoch { epoch: 1 });
    let open = Command::OpenSegment {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 0,
        ensemble: vec!["a".into(), "b".into(), "c".into()],
        instances: vec!["ia".into(), "ib".into(), "ic".into()],
        now_ms: 5,
    };
    assert_eq!(s.apply(&open), Response::Ok);
    s
}

/// Seals the segment `open_on_three` opened with 10 records held whole by `replicas`.
fn seal_held_by(replicas: &[&str]) -> Command {
    seal_unverified(replicas, &[])
}

/// `seal_held_by`, with the members a recovery did not hear from.
fn seal_unverified(replicas: &[&str], unverified: &[&str]) -> Command {
    Command::SealSegment {
        record_witnesses_needed: true,
        replicas: Some(replicas.iter().map(|r| r.to_string()).collect()),
        unverified: unverified.iter().map(|r| r.to_string()).collect(),
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 0,
        record_count: 10,
        size_bytes: 100,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        now_ms: 6,
    }
}

/// Opens the segment after the 10 records `seal_held_by` seals.
fn open_after_ten(epoch: u64, base_offset: u64) -> Command {
    Command::OpenSegment {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch,
        base_offset,
        ensemble: vec!["a".into(), "b".into()],
        instances: vec!["ia".into(), "ib".into()],
        now_ms: 7,
    }
}

#[test]
fn a_roll_seals_and_opens_in_one_step_or_changes_nothing() {
    let mut s = open_on_three(&[]);
    let roll =
        |seal: Command, open: Command| Command::RollSegment { seal: Box::new(seal), open: Box::new(open) };
    let before = s.clone();
    for (refused, why) in [
        (roll(seal_held_by(&["a"]), open_after_ten(1, 11)), "the next segment must start at 10"),
        (roll(seal_held_by(&["a"]), open_after_ten(2, 10)), "one epoch"),
        (roll(seal_held_by(&["a", "x"]), open_after_ten(1, 10)), "a seal that is refused"),
        (roll(open_after_ten(1, 10), seal_held_by(&["a"])), "a seal, then an open"),
        (
            roll(seal_held_by(&["a"]), Command::DeleteTopic { name: "t".into(), topic_id: None }),
            "only an open",
        ),
    ] {
        assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
        assert_eq!(s, before, "a refused roll changes nothing ({why})");
    }
    let mut stale = seal_held_by(&["a"]);
    if let Command::SealSegment { epoch, .. } = &mut stale {
        *epoch = 0;
    }
    assert!(matches!(s.apply(&roll(stale, open_after_ten(0, 10))), Response::Error { .. }));
    assert_eq!(s, before, "a deposed writer's roll changes nothing");

    assert_eq!(s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    assert_eq!(p.segments[&0].state, SegmentState::Sealed);
    assert_eq!(p.segments[&0].last_offset, Some(9));
    let next = p.open_segment().expect("the next segment is open");
    assert_eq!((next.base_offset, next.epoch), (10, 1));
    assert_eq!(next.ensemble, ["a", "b"]);
    // The same roll again (a retry after a lost reply) is refused and changes nothing.
    let after = s.clone();
    assert!(matches!(
        s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))),
        Response::Error { .. }
    ));
    assert_eq!(s, after);
}

#[test]
fn an_empty_open_segment_rolled_to_a_new_ensemble_is_replaced_in_place() {
    let mut s = open_on_three(&[]);
    let roll =
        |seal: Command, open: Command| Command::RollSegment { seal: Box::new(seal), open: Box::new(open) };
    assert_eq!(s.apply(&roll(seal_held_by(&["a", "b", "c"]), open_after_ten(1, 10))), Response::Ok);
    // Retention dropped the archived segment: the open one is all the chain holds.
    s.topics.get_mut("t").unwrap().partitions[0].segments.remove(&0);
    let empty_at = |base_offset: u64| Command::SealSegment {
        record_witnesses_needed: false,
        unverified: Vec::new(),
        replicas: None,
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset,
        record_count: 0,
        size_bytes: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        now_ms: 8,
    };
    let mut reopen = open_after_ten(1, 10);
    if let Command::OpenSegment { ensemble, instances, .. } = &mut reopen {
        *ensemble = vec!["a".into(), "c".into()];
        *instances = vec!["ia".into(), "ic".into()];
    }
    let before = s.clone();
    let mut wrong = reopen.clone();
    if let Command::OpenSegment { base_offset, .. } = &mut wrong {
        *base_offset = 11;
    }
    assert!(matches!(s.apply(&roll(empty_at(11), wrong)), Response::Error { .. }), "no open segment at 11");
    assert_eq!(s, before, "a refused roll changes nothing");
    assert_eq!(s.apply(&roll(empty_at(10), reopen)), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    assert_eq!(p.segments.len(), 1);
    let open = p.open_segment().expect("still open");
    assert_eq!((open.base_offset, open.record_count), (10, 0));
    assert_eq!(open.ensemble, ["a", "c"]);
    assert_eq!(open.instances, ["ia", "ic"]);
    assert_eq!(p.next_segment_base(), 10, "the partition's end is kept");
}

#[test]
fn a_chain_emptied_by_a_seal_of_no_records_keeps_where_the_log_ends() {
    let mut s = open_on_three(&[]);
    let roll =
        Command::RollSegment { seal: Box::new(seal_held_by(&["a"])), open: Box::new(open_after_ten(1, 10)) };
    assert_eq!(s.apply(&roll), Response::Ok);
    // Retention dropped the archived segment; a clean stop then closes the empty open one.
    s.topics.get_mut("t").unwrap().partitions[0].segments.remove(&0);
    let close = Command::SealSegment {
        record_witnesses_needed: false,
        unverified: Vec::new(),
        replicas: None,
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        epoch: 1,
        base_offset: 10,
        record_count: 0,
        size_bytes: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        now_ms: 9,
    };
    assert_eq!(s.apply(&close), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    assert!(p.segments.is_empty());
    assert_eq!(p.next_segment_base(), 10, "offsets 0..10 are never used again");
    assert_eq!(p.first_offset(), 10);
    assert!(p.is_archived(0, 9), "what retention deleted counts as archived");
    assert!(!p.is_archived(9, 10));
    let before = s.clone();
    assert!(matches!(s.apply(&open_after_ten(1, 0)), Response::Error { .. }), "not from 0 again");
    assert_eq!(s, before);
    assert_eq!(s.apply(&open_after_ten(1, 10)), Response::Ok);
    // The field survives a snapshot, and a partition never emptied has none.
    let json = serde_json::to_string(&s).unwrap();
    let back: MetadataState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    assert!(!serde_json::to_string(&open_on_three(&[])).unwrap().contains("empty_end"));
}

#[test]
fn a_seal_keeps_only_the_replicas_that_hold_the_whole_segment() {
    let mut s = open_on_three(&[]);
    let before = s.clone();
    assert!(matches!(s.apply(&seal_held_by(&["a", "x"])), Response::Error { .. }), "only members");
    assert!(matches!(s.apply(&seal_held_by(&[])), Response::Error { .. }), "at least one");
    assert_eq!(s, before, "a refused seal changes nothing");
    assert_eq!(s.apply(&seal_held_by(&["a", "c"])), Response::Ok);
    let seg = &s.topics["t"].partitions[0].segments[&0];
    assert_eq!(seg.ensemble, ["a", "c"]);
    assert_eq!(seg.instances, ["ia", "ic"], "instances follow their members");
    assert_eq!(seg.state, SegmentState::Sealed);
}

#[test]
fn a_seal_names_the_members_a_recovery_did_not_hear_from_until_one_shows_it_holds_the_segment() {
    let mut s = open_on_three(&[("replication.factor", "3")]);
    let id = s.topics["t"].id;
    let before = s.clone();
    for (refused, why) in [
        (seal_unverified(&["a"], &["x"]), "not a member"),
        (seal_unverified(&["a", "b"], &["b"]), "a holder"),
        (seal_unverified(&["a"], &["b", "b"]), "named twice"),
        (seal_unverified(&["a", "a"], &["b"]), "a holder named twice"),
    ] {
        assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
    }
    let mut all_hold = seal_held_by(&["a"]);
    if let Command::SealSegment { replicas, unverified, .. } = &mut all_hold {
        *replicas = None;
        *unverified = vec!["b".into()];
    }
    assert!(matches!(s.apply(&all_hold), Response::Error { .. }), "every member holds it: none unverified");
    assert_eq!(s, before, "a refused seal changes nothing");
    // a answered and holds it; b did not answer; c lost its disk.
    assert_eq!(s.apply(&seal_unverified(&["a"], &["b"])), Response::Ok);
    let seg = &s.topics["t"].partitions[0].segments[&0];
    assert_eq!(
        (seg.ensemble.clone(), seg.instances.clone()),
        (vec!["a".to_string()], vec!["ia".to_string()])
    );
    assert_eq!(seg.unverified, ["b"]);
    assert_eq!(seg.unverified_instances, ["ib"], "its instance when the segment opened");
    let add = |with: &str, instance: &str| Command::AddReplica {
        topic: "t".into(),
        topic_id: id,
        partition: 0,
        base_offset: 0,
        with: with.into(),
        instance: instance.into(),
    };
    // b holds the whole segment now (a repair copied it onto its new disk): a holder again,
    // on that disk, though the replication factor is reached with it.
    let mut promoted = s.clone();
    assert_eq!(promoted.apply(&add("b", "ib-new")), Response::Ok);
    let seg = &promoted.topics["t"].partitions[0].segments[&0];
    assert_eq!((seg.ensemble.clone(), seg.instances.clone()), (names(&["a", "b"]), names(&["ia", "ib-new"])));
    assert!(seg.unverified.is_empty() && seg.unverified_instances.is_empty());
    // Or it showed it holds it on the disk it had.
    assert_eq!(s.apply(&add("b", "ib")), Response::Ok);
    let seg = &s.topics["t"].partitions[0].segments[&0];
    assert_eq!(seg.ensemble, ["a", "b"]);
    assert_eq!(seg.instances, ["ia", "ib"]);
    assert!(seg.unverified.is_empty() && seg.unverified_instances.is_empty());
    let before = s.clone();
    assert!(matches!(s.apply(&add("b", "ib")), Response::Error { .. }), "a holder already");
    assert_eq!(s, before);
}

#[test]
fn a_seal_from_before_unverified_members_reads_as_naming_none() {
    let json = serde_json::to_value(seal_held_by(&["a"])).expect("to json");
    assert!(json.to_string().find("unverified").is_none(), "not written when empty: {json}");
    let old: Command = serde_json::from_value(json).expect("an older seal decodes");
    let Command::SealSegment { unverified, .. } = old else { panic!("{old:?}") };
    assert!(unverified.is_empty());
}

#[test]
fn a_sealed_segment_short_of_members_takes_new_ones_up_to_the_replication_factor() {
    let mut s = open_on_three(&[("replication.factor", "3")]);
    let id = s.topics["t"].id;
    let add = |with: &str, base_offset: u64, topic_id: u64| Command::AddReplica {
        topic: "t".into(),
        topic_id,
        partition: 0,
        base_offset,
        with: with.into(),
        instance: format!("i{with}"),
    };
    let before = s.clone();
    assert!(matches!(s.apply(&add("d", 0, id)), Response::Error { .. }), "an open segment");
    assert_eq!(s, before, "a refused command changes nothing");
    // Sealed after b left midway: a and c hold it whole.
    assert_eq!(s.apply(&seal_held_by(&["a", "c"])), Response::Ok);
    let before = s.clone();
    for (refused, why) in [
        (add("c", 0, id), "a member"),
        (add("b", 7, id), "no segment there"),
        (add("b", 0, id + 1), "another topic id"),
    ] {
        assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
    }
    assert_eq!(s, before, "refused commands change nothing");
    assert_eq!(s.apply(&add("b", 0, id)), Response::Ok);
    let seg = &s.topics["t"].partitions[0].segments[&0];
    assert_eq!(seg.ensemble, ["a", "c", "b"]);
    assert_eq!(seg.instances, ["ia", "ic", "ib"], "the new member's instance is recorded");
    let before = s.clone();
    assert!(matches!(s.apply(&add("d", 0, id)), Response::Error { .. }), "already R members");
    assert_eq!(s, before);
}

#[test]
fn segments_follow_epochs_and_offsets() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 1);
    let claim = |s: &mut MetadataState| {
        s.apply(&Command::ClaimWriter {
            topic_id: None,
            topic: "t".into(),
            partition: 0,
            agent: "a".into(),
            expected_epoch: None,
        })
    };
    assert_eq!(claim(&mut s), Response::Epoch { epoch: 1 });
    let open = |s: &mut MetadataState, epoch, base| {
        s.apply(&Command::OpenSegment {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch,
            base_offset: base,
            ensemble: vec!["a".into()],
            instances: Vec::new(),
            now_ms: 5,
        })
    };
    let seal = |s: &mut MetadataState, epoch, base, count| {
        s.apply(&Command::SealSegment {
            record_witnesses_needed: false,
            unverified: Vec::new(),
            replicas: None,
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch,
            base_offset: base,
            record_count: count,
            size_bytes: 100,
            min_timestamp_ms: Some(1),
            max_timestamp_ms: Some(2),
            now_ms: 6,
        })
    };
    assert_eq!(open(&mut s, 1, 0), Response::Ok);
    assert!(matches!(open(&mut s, 1, 0), Response::Error { .. }), "one open segment at a time");
    assert_eq!(seal(&mut s, 1, 0, 10), Response::Ok);
    assert!(matches!(open(&mut s, 1, 5), Response::Error { .. }), "no gaps or overlaps");
    assert_eq!(open(&mut s, 1, 10), Response::Ok);
    assert_eq!(claim(&mut s), Response::Epoch { epoch: 2 });
    assert!(matches!(seal(&mut s, 1, 10, 3), Response::Error { error: MetadataError::Fenced { .. } }));
    assert_eq!(seal(&mut s, 2, 10, 0), Response::Ok, "an empty segment is dropped");
    assert_eq!(s.topics["t"].partitions[0].next_segment_base(), 10);
    assert_eq!(s.topics["t"].partitions[0].segments[&0].last_offset, Some(9));
}

#[test]
fn exclusive_groups_rebalance_and_expire() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 4);
    assert_eq!(
        join(&mut s, "m1", 1000),
        Response::Membership { generation: 1, partitions: vec![0, 1, 2, 3] }
    );
    assert_eq!(join(&mut s, "m2", 1000), Response::Membership { generation: 2, partitions: vec![1, 3] });
    assert_eq!(join(&mut s, "m1", 2000), Response::Membership { generation: 2, partitions: vec![0, 2] });
    // m2 stops heartbeating; m1's next heartbeat after the session timeout takes everything.
    assert_eq!(
        join(&mut s, "m1", 11_500),
        Response::Membership { generation: 3, partitions: vec![0, 1, 2, 3] }
    );
    let shared = s.apply(&Command::JoinGroup {
        group: "g".into(),
        topic: "t".into(),
        member: "x".into(),
        mode: GroupMode::Shared,
        session_timeout_ms: 10_000,
        now_ms: 11_500,
    });
    assert!(matches!(shared, Response::Error { error: MetadataError::GroupModeMismatch { .. } }));
}

#[test]
fn ack_floor_never_moves_backwards() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 1);
    join(&mut s, "m1", 1);
    let commit_at = |s: &mut MetadataState, epoch, floor, acked: Vec<(u64, u64)>| {
        s.apply(&Command::CommitAcks {
            group: "g".into(),
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch,
            floor,
            acked,
        })
    };
    let commit = |s: &mut MetadataState, floor, acked| commit_at(s, None, floor, acked);
    assert_eq!(commit(&mut s, 10, vec![(12, 14)]), Response::Ok);
    assert_eq!(commit(&mut s, 5, vec![(11, 11)]), Response::Ok);
    let cp = &s.groups["g"].topics["t"].acks[&0];
    assert_eq!(cp.floor, 10);
    assert_eq!(cp.acked, vec![(11, 14)]);
    assert_eq!(commit(&mut s, 11, vec![]), Response::Ok);
    let cp = &s.groups["g"].topics["t"].acks[&0];
    assert_eq!((cp.floor, cp.acked.clone()), (15, vec![]));
    assert!(matches!(commit(&mut s, 1, vec![]), Response::Ok));
    assert_eq!(s.groups["g"].topics["t"].acks[&0].floor, 15);
    // A checkpoint from the cursor of the partition's writer at its epoch is taken; one from a
    // cursor of an earlier writer is refused and changes nothing.
    let epoch = s.topics["t"].partitions[0].epoch;
    assert_eq!(commit_at(&mut s, Some(epoch), 16, vec![]), Response::Ok);
    let before = s.clone();
    assert_eq!(
        commit_at(&mut s, Some(epoch + 1), 20, vec![]),
        Response::Error { error: MetadataError::Fenced { expected: epoch + 1, actual: epoch } }
    );
    let claim = Command::ClaimWriter {
        topic_id: None,
        topic: "t".into(),
        partition: 0,
        agent: "b".into(),
        expected_epoch: Some(epoch),
    };
    assert!(matches!(s.apply(&claim), Response::Epoch { .. }));
    let claimed = s.clone();
    assert!(matches!(commit_at(&mut s, Some(epoch), 30, vec![(32, 33)]), Response::Error { .. }));
    assert_eq!(s.groups, claimed.groups, "a deposed writer's cursor checkpointed nothing");
    assert_eq!(before.groups["g"].topics["t"].acks[&0].floor, 16);
}

#[test]
fn a_rebuild_restores_topics_as_described_and_never_reuses_an_id_or_an_offset() {
    let mut s = MetadataState::default();
    let config = TopicConfig { retention_ms: None, replication_factor: 3, ..TopicConfig::default() };
    let restore = |name: &str, id: Option<u64>, partitions: u32| Command::RestoreTopic {
        name: name.into(),
        id,
        partitions,
        config: config.clone(),
        config_version: 4,
        created_ms: 5,
    };
    let Response::Topic { topic } = s.apply(&restore("a", Some(7), 2)) else { panic!("restored") };
    assert_eq!((topic.id, topic.config_version, topic.created_ms), (7, 4, 5));
    assert_eq!(topic.config, config);
    assert_eq!(s.next_topic_id, 8);
    assert!(matches!(s.apply(&restore("a", Some(7), 2)), Response::Topic { .. }), "twice is harmless");
    let before = s.clone();
    for refused in
        [restore("a", Some(9), 2), restore("a", Some(7), 3), restore("b", Some(7), 1), restore("c", None, 0)]
    {
        assert!(matches!(s.apply(&refused), Response::Error { .. }), "{refused:?}");
        assert_eq!(s, before);
    }
    // Ids of deleted topics are never handed out again.
    assert_eq!(s.apply(&Command::ReserveTopicIds { below: 20 }), Response::Ok);
    assert_eq!(s.apply(&Command::ReserveTopicIds { below: 3 }), Response::Ok);
    let Response::Topic { topic } = s.apply(&restore("d", None, 1)) else { panic!("restored") };
    assert_eq!(topic.id, 20);
    // A config change bumps the version the archive's description is written under.
    let alter = Command::AlterTopicConfig {
        name: "a".into(),
        topic_id: None,
        config: BTreeMap::from([("max.deliveries".to_string(), "9".to_string())]),
    };
    assert_eq!(s.apply(&alter), Response::Ok);
    assert_eq!(s.topics["a"].config_version, 5);

    // Offsets found in local logs past the archive are never handed out again.
    let end = |end: u64| Command::RestorePartitionEnd { topic: "a".into(), partition: 1, end };
    assert_eq!(s.apply(&end(30)), Response::Ok);
    assert_eq!(s.apply(&end(10)), Response::Ok, "never lowered");
    assert_eq!(s.topics["a"].partitions[1].next_segment_base(), 30);
    let archived = Command::RestoreArchivedSegment {
        topic: "a".into(),
        partitions: 2,
        partition: 1,
        base_offset: 0,
        last_offset: 19,
        record_count: 20,
        min_timestamp_ms: Some(1),
        max_timestamp_ms: Some(2),
        object_key: "o".into(),
        object_bytes: 3,
        now_ms: 4,
    };
    assert_eq!(s.apply(&archived), Response::Ok);
    let p = &s.topics["a"].partitions[1];
    assert_eq!((p.first_offset(), p.next_segment_base()), (0, 30), "the archive ends at 20, the log at 30");
    let mut open = open_after_ten(0, 20);
    if let Command::OpenSegment { topic, partition, .. } = &mut open {
        (*topic, *partition) = ("a".into(), 1);
    }
    assert!(matches!(s.apply(&open), Response::Error { .. }), "a segment may not start at 20");
}

#[test]
fn commands_for_a_deleted_topic_never_reach_one_created_again_under_its_name() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 1);
    let old = s.topics["t"].id;
    assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: Some(old) }), Response::Ok);
    create(&mut s, "t", 1);
    let new = s.topics["t"].id;
    assert_ne!(old, new);
    let before = s.clone();
    for late in [
        Command::DeleteTopic { name: "t".into(), topic_id: Some(old) },
        Command::ArchiveSegment {
            topic: "t".into(),
            topic_id: Some(old),
            partition: 0,
            base_offset: 0,
            last_offset: 9,
            object_key: "k".into(),
            object_bytes: 1,
            now_ms: 1,
        },
        Command::DeleteArchivedSegments {
            topic: "t".into(),
            topic_id: Some(old),
            partition: 0,
            base_offsets: vec![0],
        },
    ] {
        assert!(matches!(s.apply(&late), Response::Error { .. }), "{late:?}");
        assert_eq!(s, before, "{late:?}");
    }
    assert_eq!(s.apply(&Command::DeleteTopic { name: "t".into(), topic_id: Some(new) }), Response::Ok);
}

#[test]
fn archive_delete_and_restore_segments() {
    let mut s = MetadataState::default();
    create(&mut s, "t", 2);
    s.apply(&Command::ClaimWriter {
        topic_id: None,
        topic: "t".into(),
        partition: 0,
        agent: "a".into(),
        expected_epoch: None,
    });
    for (base, count) in [(0u64, 10u64), (10, 5), (15, 0)] {
        let open = Command::OpenSegment {
            topic: "t".into(),
            topic_id: None,
            partition: 0,
            epoch: 1,
            base_offset: base,
            ensemble: vec!["a".into()],
            instances: Vec::new(),
            now_ms: 1,
        };
        assert_eq!(s.apply(&open), Response::Ok);
        if count > 0 {
            let seal = Command::SealSegment {
                record_witnesses_needed: false,
                unverified: Vec::new(),
                replicas: None,
                topic: "t".into(),
                topic_id: None,
                partition: 0,
                epoch: 1,
                base_offset: base,
                record_count: count,
                size_bytes: 1,
                min_timestamp_ms: Some(1),
                max_timestamp_ms: Some(2),
                now_ms: 2,
            };
            assert_eq!(s.apply(&seal), Response::Ok);
        }
    }
    let archive = |base: u64, last: u64| Command::ArchiveSegment {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        base_offset: base,
        last_offset: last,
        object_key: format!("k{base}"),
        object_bytes: 100,
        now_ms: 3,
    };
    let before = s.clone();
    assert!(matches!(s.apply(&archive(0, 8)), Response::Error { .. }), "the offset range must match");
    assert!(
        matches!(s.apply(&archive(15, 20)), Response::Error { .. }),
        "an open segment cannot be archived"
    );
    assert_eq!(s, before);
    assert_eq!(s.apply(&archive(0, 9)), Response::Ok);
    assert_eq!(s.apply(&archive(0, 9)), Response::Ok, "archiving again is a harmless retry");
    let seg = &s.topics["t"].partitions[0].segments[&0];
    assert_eq!(
        (seg.state, seg.object_key.as_deref(), seg.object_bytes),
        (SegmentState::Archived, Some("k0"), 100)
    );
    let delete = |bases: Vec<u64>| Command::DeleteArchivedSegments {
        topic: "t".into(),
        topic_id: None,
        partition: 0,
        base_offsets: bases,
    };
    assert!(matches!(s.apply(&delete(vec![10])), Response::Error { .. }), "only the oldest, only archived");
    assert_eq!(s.apply(&delete(vec![0])), Response::Ok);
    assert_eq!(s.topics["t"].partitions[0].segments.keys().copied().collect::<Vec<_>>(), vec![10, 15]);

    // Restoring into empty metadata creates the topic and the chain.
    let mut fresh = MetadataState::default();
    let restore = |base: u64, last: u64, partition: u32| Command::RestoreArchivedSegment {
        topic: "r".into(),
        partitions: 3,
        partition,
        base_offset: base,
        last_offset: last,
        record_count: last - base + 1,
        min_timestamp_ms: Some(5),
        max_timestamp_ms: Some(6),
        object_key: format!("o{base}"),
        object_bytes: 7,
        now_ms: 9,
    };
    assert_eq!(fresh.apply(&restore(10, 19, 1)), Response::Ok);
    assert_eq!(fresh.apply(&restore(0, 9, 1)), Response::Ok);
    assert_eq!(fresh.apply(&restore(0, 9, 1)), Response::Ok, "restoring twice is harmless");
    assert!(matches!(fresh.apply(&restore(5, 12, 1)), Response::Error { .. }), "overlaps are refused");
    let before = fresh.clone();
    assert!(matches!(fresh.apply(&restore(0, 9, 3)), Response::Error { .. }));
    assert_eq!(fresh, before);
    let p = &fresh.topics["r"].partitions[1];
    assert_eq!(fresh.topics["r"].partitions.len(), 3);
    assert_eq!(p.next_segment_base(), 20);
    assert!(p.segments.values().all(|s| s.state == SegmentState::Archived));
    // Objects restored out of order: gaps are fine, overlaps on either side are refused.
    assert_eq!(fresh.apply(&restore(30, 39, 1)), Response::Ok, "a gap before it");
    for (base, last) in [(19, 19), (20, 30), (25, 31), (39, 45), (15, 35)] {
        let r = fresh.apply(&restore(base, last, 1));
        assert!(matches!(r, Response::Error { .. }), "{base}..={last} overlaps: {r:?}");
    }
    assert_eq!(fresh.apply(&restore(20, 29, 1)), Response::Ok, "the gap filled exactly");
    assert_eq!(
        fresh.topics["r"].partitions[1].segments.keys().copied().collect::<Vec<_>>(),
        vec![0, 10, 20, 30]
    );
}

proptest! {
    #[test]
    fn ack_merge_keeps_every_acked_offset(
        steps in proptest::collection::vec((0u64..50, proptest::collection::vec((0u64..60, 0u64..5), 0..6)), 1..8)
    ) {
        let mut cp = AckCheckpoint::default();
        let mut acked = std::collections::BTreeSet::new();
        let mut last_floor = 0;
        for (floor, ranges) in steps {
            let ranges: Vec<(u64, u64)> = ranges.into_iter().map(|(a, len)| (a, a + len)).collect();
            acked.extend(0..floor);
            for (a, b) in &ranges { acked.extend(*a..=*b); }
            cp.merge(floor, &ranges);
            prop_assert!(cp.floor >= last_floor);
            last_floor = cp.floor;
            for o in 0..80u64 {
                prop_assert_eq!(cp.is_acked(o), acked.contains(&o), "offset {}", o);
            }
            for w in cp.acked.windows(2) {
                prop_assert!(w[0].1 + 1 < w[1].0, "ranges are disjoint and not adjacent");
            }
            if let Some(first) = cp.acked.first() { prop_assert!(first.0 > cp.floor); }
        }
    }
}

/// `open_on_three` with a, b and c registered on the disks the segment records, sealed with
/// a alone holding its 10 records and b and c unverified (the recovery heard from a alone).
fn sealed_by_a_alone(config: &[(&str, &str)]) -> MetadataState {
    let mut s = open_on_three(config);
    assert_eq!(s.apply(&seal_unverified(&["a"], &["b", "c"])), Response::Ok);
    for a in ["a", "b", "c"] {
        let register = Command::RegisterAgent {
            agent: a.into(),
            instance: format!("i{a}"),
            addr: format!("{a}:1"),
            lease_ms: 1_000,
            now_ms: 5,
        };
        assert!(matches!(s.apply(&register), Response::Registered { .. }), "{a}");
    }
    s
}

fn declare_lost(from: u64, witnesses: &[(&str, &str, u64)]) -> Command {
    Command::DeclareLost {
        topic: "t".into(),
        topic_id: 0,
        partition: 0,
        base_offset: 0,
        segment_epoch: 1,
        end: 10,
        from,
        size_bytes: 60,
        witnesses: witnesses
            .iter()
            .map(|(agent, instance, held_end)| Witness {
                agent: agent.to_string(),
                instance: instance.to_string(),
                held_end: *held_end,
            })
            .collect(),
    }
}

#[test]
fn a_seal_records_how_many_members_lacking_an_offset_show_it_was_never_acknowledged() {
    for (min_insync, needed) in [(None, 2), (Some("1"), 3), (Some("2"), 2), (Some("3"), 1)] {
        let mut config = vec![("replication.factor", "3")];
        config.extend(min_insync.map(|w| ("min.insync.replicas", w)));
        let mut s = open_on_three(&config);
        assert_eq!(s.topics["t"].partitions[0].segments[&0].witnesses_needed, None, "open");
        assert_eq!(s.apply(&seal_unverified(&["a"], &["b", "c"])), Response::Ok);
        let seg = &s.topics["t"].partitions[0].segments[&0];
        assert_eq!(seg.witnesses_needed, Some(needed), "R=3, min.insync.replicas {min_insync:?}");
    }
    // A seal from before (an older agent's, or one in a log written earlier) records nothing,
    // on a node that replays it as on one that restores a snapshot taken before.
    let mut older = seal_unverified(&["a"], &["b", "c"]);
    if let Command::SealSegment { record_witnesses_needed, .. } = &mut older {
        *record_witnesses_needed = false;
    }
    let json = serde_json::to_string(&older).unwrap();
    assert!(!json.contains("record_witnesses_needed"), "{json}");
    let mut s = open_on_three(&[("replication.factor", "3")]);
    assert_eq!(s.apply(&serde_json::from_str(&json).unwrap()), Response::Ok);
    assert_eq!(s.topics["t"].partitions[0].segments[&0].witnesses_needed, None);
}

#[test]
fn a_range_no_disk_left_holds_is_declared_lost_only_when_enough_witnesses_show_it_was_never_acknowledged() {
    let mut s = sealed_by_a_alone(&[("replication.factor", "3")]);
    let good = declare_lost(6, &[("b", "ib", 6), ("c", "ic", 4)]);
    let before = s.clone();
    assert!(
        matches!(s.apply(&good), Response::Error { .. }),
        "a, its holder, is on the disk it was written to: it may come back with the range"
    );
    assert_eq!(s, before, "a refused declaration changes nothing");
    // a registers again from a new disk: what it held is gone.
    let again = Command::RegisterAgent {
        agent: "a".into(),
        instance: "ia-new".into(),
        addr: "a:1".into(),
        lease_ms: 1_000,
        now_ms: 2_000,
    };
    assert!(matches!(s.apply(&again), Response::Registered { .. }));
    let before = s.clone();
    let mut wrong_topic = good.clone();
    if let Command::DeclareLost { topic_id, .. } = &mut wrong_topic {
        *topic_id += 1;
    }
    let mut wrong_epoch = good.clone();
    if let Command::DeclareLost { segment_epoch, .. } = &mut wrong_epoch {
        *segment_epoch = 2;
    }
    let mut wrong_end = good.clone();
    if let Command::DeclareLost { end, .. } = &mut wrong_end {
        *end = 11;
    }
    for (refused, why) in [
        (declare_lost(6, &[("b", "ib", 6)]), "one witness of the two R - W + 1 needs"),
        (declare_lost(6, &[("b", "ib", 6), ("b", "ib", 6)]), "a witness named twice"),
        (declare_lost(6, &[("b", "ib", 6), ("c", "ic-new", 4)]), "c answers from another disk"),
        (declare_lost(6, &[("b", "ib", 6), ("a", "ia-new", 0)]), "a is not unverified"),
        (declare_lost(5, &[("b", "ib", 6), ("c", "ic", 4)]), "b holds past the new end"),
        (declare_lost(7, &[("b", "ib", 6), ("c", "ic", 4)]), "no witness holds up to 7"),
        (declare_lost(11, &[("b", "ib", 11), ("c", "ic", 4)]), "past the segment"),
        (wrong_topic, "another topic id"),
        (wrong_epoch, "another segment epoch"),
        (wrong_end, "not where the segment is sealed"),
    ] {
        assert!(matches!(s.apply(&refused), Response::Error { .. }), "{why}");
        assert_eq!(s, before, "{why}: a refused declaration changes nothing");
    }
    assert_eq!(s.apply(&good), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    let seg = &p.segments[&0];
    assert_eq!((seg.last_offset, seg.record_count, seg.size_bytes), (Some(5), 6, 60));
    assert_eq!((seg.ensemble.clone(), seg.instances.clone()), (names(&["b"]), names(&["ib"])), "b holds it");
    assert_eq!((seg.unverified.clone(), seg.unverified_instances.clone()), (names(&["c"]), names(&["ic"])));
    assert_eq!(p.lost_ranges, [LostRange { from: 6, end: 10 }]);
    assert_eq!(p.next_segment_base(), 10, "offsets 6..10 are never written again");
    let before = s.clone();
    assert!(matches!(s.apply(&good), Response::Error { .. }), "declared already");
    // a's partition got a new writer when a registered again.
    let epoch = s.topics["t"].partitions[0].epoch;
    assert!(matches!(s.apply(&open_after_ten(epoch, 6)), Response::Error { .. }), "not at a lost offset");
    assert_eq!(s, before);
    assert_eq!(s.apply(&open_after_ten(epoch, 10)), Response::Ok);
    // It all survives a snapshot.
    let back: MetadataState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_witness_holding_the_whole_segment_becomes_its_holder_and_one_holding_none_of_it_loses_it_all() {
    let lost_a = |s: &mut MetadataState| {
        s.agents.get_mut("a").expect("registered").instance = "ia-new".into();
    };
    // b holds all of it: nothing is lost, and one witness is enough to say so.
    let mut s = sealed_by_a_alone(&[("replication.factor", "3")]);
    lost_a(&mut s);
    assert_eq!(s.apply(&declare_lost(10, &[("b", "ib", 10)])), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    assert_eq!((p.segments[&0].ensemble.clone(), p.segments[&0].last_offset), (names(&["b"]), Some(9)));
    assert!(p.lost_ranges.is_empty() && p.empty_end == 0);
    assert!(!serde_json::to_string(p).unwrap().contains("lost_ranges"), "not written when empty");
    // Neither holds any of it: the segment is gone from the chain, and so are its offsets.
    let mut s = sealed_by_a_alone(&[("replication.factor", "3")]);
    lost_a(&mut s);
    assert_eq!(s.apply(&declare_lost(0, &[("b", "ib", 0), ("c", "ic", 0)])), Response::Ok);
    let p = &s.topics["t"].partitions[0];
    assert!(p.segments.is_empty());
    assert_eq!(p.lost_ranges, [LostRange { from: 0, end: 10 }]);
    assert_eq!((p.first_offset(), p.next_segment_base()), (10, 10));
}

#[test]
fn a_recovery_waits_for_each_silent_member_from_the_first_time_one_waited_for_it_until_the_segment_is_sealed()
{
    let mut s = open_on_three(&[]);
    let id = s.topics["t"].id;
    let wait_of = |topic_id: u64, base_offset: u64, segment_epoch: u64, silent: &[&str], now_ms: u64| {
        Command::WaitForSilentMembers {
            topic: "t".into(),
            topic_id,
            partition: 0,
            base_offset,
            segment_epoch,
            silent: names(silent),
            now_ms,
        }
    };
    let wait = |silent: &[&str], now_ms| wait_of(id, 0, 1, silent, now_ms);
    let since = |s: &MetadataState| s.topics["t"].partitions[0].segments[&0].silent_since_ms.clone();
    let map =
        |pairs: &[(&str, u64)]| pairs.iter().map(|(m, t)| (m.to_string(), *t)).collect::<BTreeMap<_, _>>();
    // An open segment as older versions wrote it reads as waiting for nobody.
    let json = serde_json::to_string(&s.topics["t"].partitions[0].segments[&0]).expect("serialize");
    assert!(!json.contains("silent_since_ms"), "{json}");
    assert_eq!(since(&s), map(&[]));
    assert_eq!(s.apply(&wait(&["b", "c"], 1_000)), Response::Ok);
    assert_eq!(
        since(&s),
        map(&[("b", 1_000), ("c", 1_000)]),
        "metadata's clock when the first recovery waited"
    );
    // A later recovery (another writer, or the same one after a restart) keeps the starts.
    assert_eq!(s.apply(&wait(&["b", "c"], 9_000)), Response::Ok);
    assert_eq!(since(&s), map(&[("b", 1_000), ("c", 1_000)]));
    // One that heard from b forgets it; b silent again is waited for from then; a name outside
    // the ensemble is not recorded.
    assert_eq!(s.apply(&wait(&["c"], 9_500)), Response::Ok);
    assert_eq!(since(&s), map(&[("c", 1_000)]));
    assert_eq!(s.apply(&wait(&["b", "c", "x"], 9_600)), Response::Ok);
    assert_eq!(since(&s), map(&[("b", 9_600), ("c", 1_000)]));
    // Another segment, another epoch, or another topic id change nothing.
    let before = s.clone();
    for (command, why) in [
        (wait_of(id, 10, 1, &["b"], 9_700), "no segment there"),
        (wait_of(id, 0, 2, &["b"], 9_700), "opened under another epoch"),
        (wait_of(id + 1, 0, 1, &["b"], 9_700), "another topic id"),
    ] {
        assert!(matches!(s.apply(&command), Response::Error { .. }), "{why}");
        assert_eq!(s.topics, before.topics, "{why}");
    }
    // Sealed, the segment waits for nobody; a late command does not mark it.
    assert_eq!(s.apply(&seal_held_by(&["a", "b"])), Response::Ok);
    assert_eq!(since(&s), map(&[]));
    assert!(matches!(s.apply(&wait(&["c"], 9_800)), Response::Error { .. }));
    assert_eq!(since(&s), map(&[]));
}
