//! End-to-end tests of the metadata cluster: three real `silt metadata` processes on loopback,
//! killed (SIGKILL), paused (SIGSTOP) and restarted while clients write through them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use silt::silt_metadata::api::{ErrorBody, Outcome, StateReply};
use silt::silt_metadata::{Command, Metadata, MetadataError, NodeRole, RemoteMetadata, Response};
use silt_tests::{silt_metadata_cli, wait_for, MetadataCluster};

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// `silt metadata --request-timeout` (default 5 s) plus slack for a loaded machine.
const NO_QUORUM_BOUND: Duration = Duration::from_millis(6500);

fn create_topic(name: &str) -> Command {
    Command::CreateTopic { name: name.to_string(), partitions: 1, config: BTreeMap::new(), now_ms: 1 }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("http client")
}

/// POSTs `cmd` to one node's write endpoint; returns the status and the JSON body.
async fn post_write(url: &str, cmd: &Command) -> (u16, Value) {
    let reply = http().post(format!("{url}/metadata/write")).json(cmd).send().await.expect("write request");
    let status = reply.status().as_u16();
    (status, reply.json().await.expect("json body"))
}

async fn read_state(url: &str) -> (u16, Value) {
    let reply = http().get(format!("{url}/metadata/state")).send().await.expect("read request");
    let status = reply.status().as_u16();
    (status, reply.json().await.expect("json body"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_writes_through_any_node_are_applied_on_every_node() {
    let cluster = MetadataCluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;

    for id in 1..=3 {
        let (status, body) = post_write(&cluster.node(id).url(), &create_topic(&format!("via-{id}"))).await;
        assert_eq!(status, 200, "write through node {id} (leader {leader}): {body}");
        let response: Response = serde_json::from_value(body).expect("a Response");
        assert!(matches!(response, Response::Topic { .. }), "{response:?}");
    }
    // A refused command is committed and answered with its error.
    let (status, body) = post_write(&cluster.node(1).url(), &create_topic("via-1")).await;
    assert_eq!(status, 200);
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["kind"], "topic_exists", "{body}");
    // A body that is no command is refused with a JSON error.
    let reply = http()
        .post(format!("{}/metadata/write", cluster.node(2).url()))
        .header("content-type", "application/json")
        .body(r#"{"type":"no_such_command"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 400);
    let error: ErrorBody = reply.json().await.unwrap();
    assert_eq!(error.error.code, "invalid_json");

    let mut applied = 0;
    for id in 1..=3 {
        let (status, body) = read_state(&cluster.node(id).url()).await;
        assert_eq!(status, 200, "{body}");
        let reply: StateReply = serde_json::from_value(body).unwrap();
        assert_eq!(reply.node_id, leader, "reads are served by the leader");
        let topics: Vec<&String> = reply.state.topics.keys().collect();
        assert_eq!(topics, ["via-1", "via-2", "via-3"]);
        applied = applied.max(reply.applied_index.unwrap());
    }
    // Every node applies the writes to its own state machine.
    for id in 1..=3 {
        wait_for(&format!("node {id} applies index {applied}"), Duration::from_secs(10), || async {
            let status = cluster.node(id).status().await?;
            (status.last_applied >= Some(applied) && status.committed >= Some(applied)).then_some(())
        })
        .await;
    }

    let out = silt_metadata_cli(&cluster.addrs().join(","), &["cluster", "status"]);
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["leader"]["id"], leader, "{out}");
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{out}");
    assert!(members.iter().all(|m| m["reachable"] == true && m["role"] == "voter"), "{out}");
    assert_eq!(members.iter().filter(|m| m["state"] == "leader").count(), 1, "{out}");
    assert!(members.iter().all(|m| m["last_applied"].as_u64() >= Some(applied)), "{out}");
    assert!(status["unreachable"].as_array().unwrap().is_empty(), "{out}");
}

/// One write acknowledged by the cluster: when it was sent and when the answer came.
struct Acked {
    name: String,
    sent: Instant,
    at: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_killing_the_leader_loses_no_acknowledged_write() {
    const ROUNDS: usize = 5;
    let mut cluster = MetadataCluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();

    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, acked, failed, stop) = (client.clone(), acked.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("t-{i:06}");
                i += 1;
                let sent = Instant::now();
                match client.write(create_topic(&name)).await {
                    Ok(Response::Topic { .. }) => {
                        acked.lock().unwrap().push(Acked { name, sent, at: Instant::now() })
                    }
                    Ok(other) => panic!("unexpected answer to a create: {other:?}"),
                    Err(e) => failed.lock().unwrap().push(format!("{name}: {e}")),
                }
            }
        })
    };

    let mut failovers = Vec::new();
    for round in 0..ROUNDS {
        let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
        let before = acked.lock().unwrap().len();
        wait_for("writes before the kill", Duration::from_secs(20), || async {
            (acked.lock().unwrap().len() >= before + 20).then_some(())
        })
        .await;
        let killed_at = Instant::now();
        cluster.node_mut(leader).kill9();
        // The first write sent after the kill that is acknowledged (one sent before may have been
        // committed by the old leader just before it died).
        let first_ack = wait_for("a write acknowledged after the kill", Duration::from_secs(20), || async {
            acked.lock().unwrap().iter().rev().take_while(|a| a.sent > killed_at).last().map(|a| a.at)
        })
        .await;
        let failover = first_ack - killed_at;
        eprintln!("round {round}: killed leader {leader}; first write acknowledged after {failover:?}");
        failovers.push(failover);

        // The killed node comes back and catches up with the new leader.
        let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        let new_leader = cluster.wait_for_leader(&others, LEADER_TIMEOUT).await;
        cluster.node_mut(leader).restart();
        let target = cluster.node(new_leader).status().await.and_then(|s| s.committed).unwrap();
        wait_for(
            &format!("restarted node {leader} catches up to {target}"),
            Duration::from_secs(20),
            || async {
                let status = cluster.node(leader).status().await?;
                (status.last_applied >= Some(target)).then_some(())
            },
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    let state = client.read_state().await.expect("read state").state;
    let acked = acked.lock().unwrap();
    let missing: Vec<&str> =
        acked.iter().map(|a| a.name.as_str()).filter(|n| !state.topics.contains_key(*n)).collect();
    assert!(missing.is_empty(), "acknowledged creates lost: {missing:?}\n{}", cluster.logs());
    let failed = failed.lock().unwrap();
    eprintln!(
        "{} creates acknowledged, {} failed (outcome unknown or no leader in time), {} topics in the state",
        acked.len(),
        failed.len(),
        state.topics.len()
    );
    for f in failed.iter().take(10) {
        eprintln!("  failed: {f}");
    }
    failovers.sort();
    eprintln!(
        "leader kill -9 -> first acknowledged write, {ROUNDS} rounds: p50 {:?}, p99 {:?}, max {:?}",
        percentile(&failovers, 50.0),
        percentile(&failovers, 99.0),
        failovers.last().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_restarted_node_catches_up_from_a_snapshot() {
    let mut cluster = MetadataCluster::start(3, &["--snapshot-logs", "50"]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    for i in 0..20 {
        client.write(create_topic(&format!("early-{i}"))).await.unwrap();
    }
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let before = cluster.node(follower).status().await.unwrap();
    cluster.node_mut(follower).kill9();
    let follower_last = before.last_log_index.unwrap();

    for i in 0..300 {
        client.write(create_topic(&format!("late-{i:03}"))).await.unwrap();
    }
    // The leader snapshots and purges the entries the follower lacks, so it needs a snapshot.
    let leader_status = wait_for("the leader purges its log", Duration::from_secs(20), || async {
        let s = cluster.node(leader).status().await?;
        s.purged_index.is_some_and(|p| p > follower_last + 1).then_some(s)
    })
    .await;
    let target = leader_status.last_applied.unwrap();

    cluster.node_mut(follower).restart();
    let caught_up = wait_for("the restarted follower catches up", Duration::from_secs(30), || async {
        let s = cluster.node(follower).status().await?;
        (s.last_applied >= Some(target)).then_some(s)
    })
    .await;
    assert!(
        caught_up.snapshot_index.is_some_and(|s| s > follower_last),
        "the follower installed a snapshot past its old log end {follower_last}: {caught_up:?}"
    );
    assert_eq!(caught_up.state, NodeRole::Follower);

    // It keeps up afterwards, from the log.
    client.write(create_topic("after")).await.unwrap();
    let last = cluster.node(leader).status().await.unwrap().last_applied;
    wait_for("the follower applies new writes", Duration::from_secs(10), || async {
        (cluster.node(follower).status().await?.last_applied >= last).then_some(())
    })
    .await;

    // Its state is the cluster's: with the leader gone it is one of the two that carry on.
    cluster.node_mut(leader).kill9();
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    cluster.wait_for_leader(&others, LEADER_TIMEOUT).await;
    let state = client.read_state().await.unwrap().state;
    assert_eq!(state.topics.len(), 321);
    assert!(state.topics.contains_key("late-299") && state.topics.contains_key("after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_paused_leader_steps_down_and_its_late_write_is_applied_at_most_once() {
    let mut cluster = MetadataCluster::start(3, &[]);
    let old = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    client.write(create_topic("fenced")).await.unwrap();
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();

    // Paused for well over the election timeout (300-600 ms): the others elect a new leader.
    let paused_at = Instant::now();
    cluster.node_mut(old).pause();
    let new = cluster.wait_for_leader(&others, LEADER_TIMEOUT).await;
    eprintln!("paused leader {old}; node {new} leads after {:?}", paused_at.elapsed());
    // A write sent to the paused node sits in its socket until it resumes.
    let late_url = cluster.node(old).url();
    let claim = Command::ClaimWriter {
        topic_id: None,
        topic: "fenced".into(),
        partition: 0,
        agent: "late".into(),
        expected_epoch: None,
    };
    let late_write = {
        let claim = claim.clone();
        tokio::spawn(async move { post_write(&late_url, &claim).await })
    };
    let hold = Duration::from_secs(2);
    tokio::time::sleep(hold.saturating_sub(paused_at.elapsed())).await; // the fault itself
    cluster.node_mut(old).resume();

    let (status, body) = late_write.await.unwrap();
    eprintln!("write to the resumed old leader: HTTP {status} {body}");
    let stepped_down = wait_for("the old leader steps down", Duration::from_secs(10), || async {
        let s = cluster.node(old).status().await?;
        (s.state != NodeRole::Leader && s.leader.as_ref().is_some_and(|l| l.id != old)).then_some(s)
    })
    .await;
    assert_eq!(stepped_down.state, NodeRole::Follower);

    // More writes move the log on, so anything the old leader kept from its term is settled.
    client.write(create_topic("after-resume")).await.unwrap();
    let state = client.read_state().await.unwrap().state;
    let partition = &state.topics["fenced"].partitions[0];
    match status {
        200 => {
            let response: Response = serde_json::from_value(body).unwrap();
            assert_eq!(response, Response::Epoch { epoch: 1 }, "applied exactly once");
            assert_eq!((partition.epoch, partition.writer.as_deref()), (1, Some("late")));
        }
        503 => {
            let error: ErrorBody = serde_json::from_value(body).unwrap();
            let claimed = (partition.epoch, partition.writer.as_deref());
            match error.error.outcome {
                Outcome::NotApplied => assert_eq!(claimed, (0, None), "a write said not applied was applied"),
                // Applied once, whole, or not at all: nothing else.
                Outcome::Unknown => assert!(
                    claimed == (0, None) || claimed == (1, Some("late")),
                    "neither applied once nor not at all: {partition:?}"
                ),
            }
        }
        other => panic!("unexpected HTTP {other}: {body}"),
    }
    // Whatever happened, the claim can be made exactly once more with a compare-and-set.
    let epoch = partition.epoch;
    let again = Command::ClaimWriter {
        topic_id: None,
        topic: "fenced".into(),
        partition: 0,
        agent: "next".into(),
        expected_epoch: Some(epoch),
    };
    assert_eq!(client.write(again.clone()).await.unwrap(), Response::Epoch { epoch: epoch + 1 });
    assert!(matches!(client.write(again).await, Err(MetadataError::Fenced { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_without_a_quorum_writes_and_reads_fail_with_503_in_bounded_time() {
    let mut cluster = MetadataCluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    client.write(create_topic("before")).await.unwrap();
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();

    // The leader alone: it notices that no quorum acknowledges it and proposes nothing.
    for id in &followers {
        cluster.node_mut(*id).kill9();
    }
    wait_for("the leader notices it lost its quorum", Duration::from_secs(10), || async {
        let s = cluster.node(leader).status().await?;
        s.millis_since_quorum_ack.is_some_and(|ms| ms > 1000).then_some(())
    })
    .await;
    let url = cluster.node(leader).url();
    let started = Instant::now();
    let (status, body) = post_write(&url, &create_topic("lonely")).await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(took <= NO_QUORUM_BOUND, "took {took:?}");
    let error: ErrorBody = serde_json::from_value(body).unwrap();
    assert_eq!(error.error.outcome, Outcome::NotApplied);
    assert!(error.error.message.contains("no metadata leader: "), "{}", error.error.message);
    assert!(error.error.message.contains("cannot reach a quorum of 3 nodes"), "{}", error.error.message);
    eprintln!("write to a leader without quorum: 503 after {took:?}: {}", error.error.message);

    let started = Instant::now();
    let (status, body) = read_state(&url).await;
    assert_eq!(status, 503, "{body}");
    assert!(started.elapsed() <= NO_QUORUM_BOUND, "took {:?}", started.elapsed());
    assert!(body["error"]["message"].as_str().unwrap().contains("quorum"), "{body}");

    let started = Instant::now();
    let err = client.write(create_topic("lonely")).await.unwrap_err();
    assert!(matches!(&err, MetadataError::Unavailable(m) if m.contains("quorum")), "{err}");
    assert!(started.elapsed() <= Duration::from_secs(12), "client took {:?}", started.elapsed());
    eprintln!("client write without quorum failed after {:?}: {err}", started.elapsed());

    // One follower back: a quorum again.
    cluster.node_mut(followers[0]).restart();
    wait_for("writes succeed again", Duration::from_secs(20), || async {
        client.write(create_topic("quorum-again")).await.ok()
    })
    .await;

    // A follower alone: no leader at all.
    cluster.node_mut(leader).kill9();
    let url = cluster.node(followers[0]).url();
    let started = Instant::now();
    let (status, body) = post_write(&url, &create_topic("orphan")).await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(took <= NO_QUORUM_BOUND, "took {took:?}");
    let error: ErrorBody = serde_json::from_value(body).unwrap();
    assert_eq!(error.error.outcome, Outcome::NotApplied);
    assert!(
        error.error.message.contains("no metadata leader: cannot reach a quorum of 3 nodes"),
        "{}",
        error.error.message
    );
    eprintln!("write to a follower without quorum: 503 after {took:?}: {}", error.error.message);

    // Everything acknowledged survives the outage.
    cluster.node_mut(leader).restart();
    let state = client.read_state().await.unwrap().state;
    let names: BTreeSet<&str> = state.topics.keys().map(|k| k.as_str()).collect();
    assert!(names.contains("before") && names.contains("quorum-again"), "{names:?}");
    assert!(!names.contains("lonely") && !names.contains("orphan"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cli_adds_and_removes_a_node() {
    let mut cluster = MetadataCluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    for i in 0..10 {
        client.write(create_topic(&format!("t-{i}"))).await.unwrap();
    }
    let addr4 = cluster.start_extra(4, &[]).addr().to_string();
    let metadata = cluster.addrs()[..3].join(",");

    let out = silt_metadata_cli(&metadata, &["cluster", "add-node", "4", &addr4]);
    let status: Value = serde_json::from_str(&out).unwrap();
    let voters: Vec<u64> = status["membership"]["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_u64().unwrap())
        .collect();
    assert_eq!(voters, [1, 2, 3, 4], "{out}");
    let applied = client.read_state().await.unwrap().applied_index;
    wait_for("node 4 catches up", Duration::from_secs(10), || async {
        (cluster.node(4).status().await?.last_applied >= applied).then_some(())
    })
    .await;
    // Adding it again changes nothing.
    silt_metadata_cli(&metadata, &["cluster", "add-node", "4", &addr4]);

    let out = silt_metadata_cli(&metadata, &["cluster", "remove-node", "3"]);
    let status: Value = serde_json::from_str(&out).unwrap();
    let voters: Vec<u64> = status["membership"]["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_u64().unwrap())
        .collect();
    assert_eq!(voters, [1, 2, 4], "{out}");
    cluster.node_mut(3).stop();
    client.write(create_topic("after-remove")).await.unwrap();

    let out = silt_metadata_cli(&metadata, &["cluster", "status"]);
    let status: Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<u64> =
        status["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 4], "{out}");
    assert!(status["leader"]["id"].as_u64().is_some_and(|l| l != 3), "{out}");
    let unreachable = status["unreachable"].as_array().unwrap();
    assert_eq!(unreachable.len(), 1, "node 3 was asked and is gone: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_copy_of_the_state_is_sent_only_when_it_changed() {
    let cluster = MetadataCluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    let full = client.read_state().await.expect("read");
    let index = full.applied_index.expect("an applied index");
    // Through any node (followers pass it to the leader): nothing new, no state.
    for id in 1..=3 {
        let (status, body) = read_state_after(&cluster.node(id).url(), index).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["state"].is_null(), "node {id}: {body}");
        assert_eq!(body["applied_index"], index);
    }
    let (status, body) = post_write(&cluster.node(2).url(), &create_topic("changed")).await;
    assert_eq!(status, 200, "{body}");
    let delta = client.read_state_after(index).await.expect("read after");
    let state = delta.state.expect("the state changed");
    assert!(state.topics.contains_key("changed"));
    assert!(delta.applied_index > Some(index));
    let (status, body) = read_state_after(&cluster.node(1).url(), u64::MAX).await;
    assert_eq!((status, body["state"].is_null()), (200, true), "{body}");
    let (status, body) = read_state_after(&cluster.node(1).url(), 0).await;
    assert_eq!(status, 200);
    assert!(body["state"]["topics"]["changed"].is_object(), "{body}");
}

/// An agent's copy of the state (`RemoteMetadata`) catches up by applying the commands the
/// cluster applied since, through any node and across a change of leader, and stays equal to
/// the state; it fetches the state whole only to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_remote_copy_catches_up_by_applying_changes_and_equals_the_state() {
    let mut cluster = MetadataCluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let client = cluster.client();
    let cancel = tokio_util::sync::CancellationToken::new();
    let remote = RemoteMetadata::connect(client.clone(), cancel.clone()).await.expect("connect");
    let metadata = Metadata::Remote(remote.clone());
    let before = client.read_state().await.expect("read").applied_index.expect("an index");

    // Commands of every kind that carry a clock or change writers: agents, topics, segments.
    let register = |agent: &str| Command::RegisterAgent {
        agent: agent.into(),
        instance: String::new(),
        addr: format!("127.0.0.1:{}", 7000 + agent.len()),
        lease_ms: 60_000,
        now_ms: 0,
    };
    let write = |cmd: Command| {
        let client = client.clone();
        async move { client.write(cmd).await }
    };
    write(register("a")).await.expect("register");
    write(register("bb")).await.expect("register");
    for t in ["t1", "t2", "t3"] {
        write(create_topic(t)).await.expect("create");
    }
    write(Command::DeleteTopic { name: "t2".into(), topic_id: None }).await.expect("delete");
    assert!(write(create_topic("t1")).await.is_err(), "refused, and refused on the copy too");
    let delta = client.read_changes_after(before).await.expect("changes");
    let changes = delta.changes.expect("the commands since, not the state");
    assert!(delta.state.is_none());
    assert!(changes.len() >= 7 && changes.windows(2).all(|w| w[0].index < w[1].index), "{changes:?}");
    assert!(changes.first().is_some_and(|c| c.index > before));
    let copy = metadata.read(|s| s.clone()).await.expect("refresh");
    assert_eq!(copy, client.read_state().await.expect("read").state);

    // Another leader keeps the entries it applied as a follower.
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    cluster.node_mut(leader).kill9();
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    cluster.wait_for_leader(&others, LEADER_TIMEOUT).await;
    let client = cluster.client();
    wait_for("a write through the new leader", Duration::from_secs(20), || async {
        client.write(create_topic("t4")).await.ok()
    })
    .await;
    let copy = metadata.read(|s| s.clone()).await.expect("refresh");
    assert_eq!(copy, client.read_state().await.expect("read").state);
    assert!(copy.topics.contains_key("t4") && !copy.topics.contains_key("t2"));
    let (full, by_changes) = remote.refresh_counts();
    assert_eq!(full, 1, "only the first read fetched the whole state");
    assert!(by_changes >= 2, "{by_changes} refreshes by changes");
    cancel.cancel();
}

async fn read_state_after(url: &str, after: u64) -> (u16, Value) {
    let reply = http().get(format!("{url}/metadata/state?after={after}")).send().await.expect("read request");
    let status = reply.status().as_u16();
    (status, reply.json().await.expect("json body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_export_their_raft_position_as_metrics() {
    let cluster = MetadataCluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], LEADER_TIMEOUT).await;
    let (status, body) = post_write(&cluster.node(leader).url(), &create_topic("measured")).await;
    assert_eq!(status, 200, "{body}");
    let value = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!("silt_metadata_{name} ")).and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let mut leaders = 0;
    for id in 1..=3 {
        let text = wait_for("the topic applied on every node", Duration::from_secs(10), || async {
            let text = http()
                .get(format!("{}/metrics", cluster.node(id).url()))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (text.contains("silt_metadata_topics 1")).then_some(text)
        })
        .await;
        assert!(text.ends_with("# EOF\n"), "{text}");
        leaders += value(&text, "is_leader");
        assert_eq!(value(&text, "voters"), 3);
        assert!(value(&text, "last_applied_index") >= 1);
    }
    assert_eq!(leaders, 1, "exactly one node says it leads");
}
