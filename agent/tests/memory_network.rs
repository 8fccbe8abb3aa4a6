//! Three agents and a metadata node in one process, reaching each other over a
//! [`MemoryNetwork`] instead of HTTP: the replication protocol under link faults a real
//! network makes hard to stage (one direction cut, an append applied whose answer is lost),
//! with real segment files and fsyncs underneath.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_agent::agent::ProduceMessage;
use silt_agent::limits::ReadLimit;
use silt_agent::memory_network::{Link, MemoryNetwork};
use silt_agent::metrics::Metrics;
use silt_agent::{Agent, AgentConfig, ApiError};
use silt_metadata::handle::{LinkState, MetadataLink};
use silt_metadata::{Metadata, MetadataNode, RemoteMetadata};
use silt_record::{MessageId, Record};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "events";

struct Cluster {
    net: Arc<MemoryNetwork>,
    agents: Vec<Agent>,
    /// Each agent's link to metadata, when it reaches metadata over one.
    metadata_links: HashMap<String, Arc<MetadataLink>>,
    metadata: MetadataNode,
    cancel: CancellationToken,
    lease: Duration,
    /// The agents' `replica_repair_after`.
    repair_after: Duration,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(false).await
    }

    /// With `linked`, each agent reaches metadata over a link of its own (a copy of the state
    /// that lags as a remote one does, and a link the test can cut).
    async fn start_with(linked: bool) -> Cluster {
        Cluster::start_with_lease(linked, Duration::from_secs(2)).await
    }

    /// [`start_with`](Self::start_with), the agents taking leases of `lease`.
    async fn start_with_lease(linked: bool, lease: Duration) -> Cluster {
        Cluster::start_with_timings(linked, lease, silt_agent::agent::DEFAULT_REPLICA_REPAIR_AFTER).await
    }

    /// [`start_with_lease`](Self::start_with_lease), the agents waiting `repair_after` for a
    /// member that is gone before repair replaces it (and a recovery seals without it).
    async fn start_with_timings(linked: bool, lease: Duration, repair_after: Duration) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let metadata = MetadataNode::open(&dir.path().join("metadata"), 1, "memory".into())
            .await
            .expect("metadata node");
        let net = MemoryNetwork::new();
        let cancel = CancellationToken::new();
        let mut agents = Vec::new();
        let mut metadata_links = HashMap::new();
        for i in 0..3 {
            let id = format!("agent-{i}");
            let handle = if linked {
                let link = MetadataLink::new(Duration::from_secs(3));
                metadata_links.insert(id.clone(), Arc::clone(&link));
                let copy = RemoteMetadata::linked(metadata.clone(), link, cancel.child_token()).await;
                Metadata::Remote(copy.expect("a copy of the metadata state"))
            } else {
                Metadata::from(metadata.clone())
            };
            let mut config = AgentConfig::new(&id, format!("memory-{i}"), dir.path().join(&id));
            config.lease = lease;
            config.replica_repair_after = repair_after;
            config.default_replication_factor = 3;
            config.peers = Some(net.peers(&id));
            let agent = Agent::start(config, handle, Arc::new(Metrics::new()), None, cancel.child_token())
                .await
                .expect("agent starts");
            net.join(&agent);
            agents.push(agent);
        }
        Cluster { net, agents, metadata_links, metadata, cancel, lease, repair_after, dir }
    }

    /// Stops agent `id`: it leaves metadata, and requests to it go unanswered.
    async fn stop_agent(&self, id: &str) {
        self.agent(id).shutdown().await;
    }

    /// Starts agent `id` again (stopping it first if it runs) on its data directory, emptied
    /// first with `wipe` (its disk replaced), reaching metadata directly.
    async fn restart(&mut self, id: &str, wipe: bool) {
        let i = self.agents.iter().position(|a| a.id() == id).expect("an agent of the cluster");
        self.agents[i].shutdown().await;
        let dir = self.dir.path().join(id);
        if wipe {
            std::fs::remove_dir_all(&dir).expect("the agent's data directory removed");
        }
        let mut config = AgentConfig::new(id, format!("memory-{i}"), dir);
        config.lease = self.lease;
        config.replica_repair_after = self.repair_after;
        config.default_replication_factor = 3;
        config.peers = Some(self.net.peers(id));
        let metadata = Metadata::from(self.metadata.clone());
        let agent = Agent::start(config, metadata, Arc::new(Metrics::new()), None, self.cancel.child_token())
            .await
            .expect("agent starts");
        self.net.join(&agent);
        self.agents[i] = agent;
    }

    fn agent(&self, id: &str) -> &Agent {
        self.agents.iter().find(|a| a.id() == id).expect("an agent of the cluster")
    }

    /// The partition's writer and the other members of its open segment, once it has them all.
    async fn ensemble(&self) -> (String, Vec<String>) {
        self.ensemble_of(3).await
    }

    /// The partition's writer and the other members of its open segment, once it has `members`.
    async fn ensemble_of(&self, members: usize) -> (String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self
                .metadata
                .read(|s| {
                    let p = &s.topics.get(TOPIC)?.partitions[0];
                    let writer = p.writer.clone()?;
                    let open = p.open_segment()?;
                    let followers: Vec<String> =
                        open.ensemble.iter().filter(|a| **a != writer).cloned().collect();
                    (followers.len() + 1 == members).then_some((writer, followers))
                })
                .await
                .expect("metadata read");
            if let Some(found) = found {
                return found;
            }
            assert!(Instant::now() < deadline, "no writer with a whole ensemble within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        for a in &self.agents {
            a.shutdown().await;
        }
        self.cancel.cancel();
        self.metadata.shutdown().await;
    }
}

fn message(i: usize) -> ProduceMessage {
    ProduceMessage {
        partition: Some(0),
        value: Some(Bytes::from(format!("message {i}"))),
        ..ProduceMessage::default()
    }
}

/// Produces message `i` through `agent` until it is acknowledged (an error may be `not_writer`
/// or `unavailable` while the partition changes hands: the producer retries, as clients do).
async fn produce_acked(agent: &Agent, i: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match agent.produce(TOPIC, vec![message(i)]).await {
            Ok(ids) => return offset(&ids[0]),
            Err(e) => assert!(Instant::now() < deadline, "message {i} not acknowledged within 30 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn offset(id: &MessageId) -> u64 {
    assert_eq!((id.topic.as_str(), id.partition), (TOPIC, 0));
    id.offset
}

/// Everything `agent` serves of the partition, from offset 0 to the end.
async fn read_all(agent: &Agent) -> Vec<Record> {
    let mut records = Vec::new();
    let mut offset = 0;
    loop {
        let (page, next, end) =
            agent.read(TOPIC, 0, offset, ReadLimit::new(1000, 1 << 20), false).await.expect("read");
        records.extend(page);
        if next >= end {
            return records;
        }
        offset = next;
    }
}

/// Every acknowledged message is at its offset, once, and no offset holds anything else.
fn check(records: &[Record], acked: &HashMap<u64, usize>) {
    let by_offset: BTreeMap<u64, &Record> = records.iter().map(|r| (r.offset, r)).collect();
    assert_eq!(by_offset.len(), records.len(), "an offset read twice");
    for (offset, i) in acked {
        let r =
            by_offset.get(offset).unwrap_or_else(|| panic!("acknowledged message {i} at {offset} is gone"));
        assert_eq!(r.value.as_deref(), Some(format!("message {i}").as_bytes()), "offset {offset}");
    }
}

/// What `follower` serves of its local log of the partition agrees with the writer's log at
/// every offset.
async fn check_held(follower: &Agent, writer_records: &[Record]) {
    let by_offset: BTreeMap<u64, &Record> = writer_records.iter().map(|r| (r.offset, r)).collect();
    let (held, _, _) =
        follower.read_held(TOPIC, 0, 0, ReadLimit::new(10_000, 1 << 24)).await.expect("read held");
    for r in &held {
        assert_eq!(
            by_offset.get(&r.offset).copied(),
            Some(r),
            "{} holds another record at {}",
            follower.id(),
            r.offset
        );
    }
}

/// The partition's writer once it is not `old`.
async fn writer_other_than(cluster: &Cluster, old: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let writer = cluster
            .metadata
            .read(|s| s.topics.get(TOPIC).and_then(|t| t.partitions[0].writer.clone()))
            .await
            .expect("metadata read");
        match writer {
            Some(w) if w != old => return w,
            _ => assert!(Instant::now() < deadline, "{old} still writes the partition after 30 s"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the partition from its writer and checks it, then stops the writer cut off from the
/// others (it serves nothing more), lets another agent take the partition over, and checks
/// again: every acknowledged message is at its offset, and the new writer serves the same
/// record as the old one at every offset. Returns what the new writer serves.
async fn check_after_losing_the_writer(cluster: &Cluster, acked: &HashMap<u64, usize>) -> Vec<Record> {
    let (old, _) = cluster.ensemble().await;
    let before = read_all(cluster.agent(&old)).await;
    check(&before, acked);
    cluster.net.isolate(&old, true);
    cluster.agent(&old).shutdown().await;
    let new = writer_other_than(cluster, &old).await;
    let after = read_all(cluster.agent(&new)).await;
    check(&after, acked);
    let before: BTreeMap<u64, &Record> = before.iter().map(|r| (r.offset, r)).collect();
    for r in &after {
        if let Some(b) = before.get(&r.offset) {
            assert_eq!(*b, r, "{new} serves another record at {} than {old} did", r.offset);
        }
    }
    after
}

/// A cluster whose agents reach metadata over links of their own, the topic created and ten
/// messages acknowledged by its writer: the cluster, the writer, and the acknowledged messages
/// by offset.
async fn linked_cluster_with_ten_acknowledged() -> (Cluster, String, HashMap<u64, usize>) {
    let cluster = Cluster::start_with(true).await;
    create_topic(&cluster).await;
    let (writer, _) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..10 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    (cluster, writer, acked)
}

async fn create_topic(cluster: &Cluster) {
    cluster.agents[0].create_topic(TOPIC, 1, BTreeMap::new()).await.expect("create topic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_keeps_acknowledging_with_one_follower_cut_off_and_acknowledges_nothing_with_both() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer_id, followers) = cluster.ensemble().await;
    let writer = cluster.agent(&writer_id);
    let mut acked = HashMap::new();
    for i in 0..20 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    // Requests from the writer to one follower are lost; the follower still reaches the writer.
    cluster.net.set_link(&writer_id, &followers[0], Link::Cut);
    for i in 20..40 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    // With both followers cut off, W = 2 cannot be reached: nothing is acknowledged.
    cluster.net.set_link(&writer_id, &followers[1], Link::Cut);
    let refused: Result<Vec<MessageId>, ApiError> = writer.produce(TOPIC, vec![message(40)]).await;
    assert!(refused.is_err(), "acknowledged with no follower reachable: {refused:?}");
    cluster.net.set_link(&writer_id, &followers[0], Link::Up);
    cluster.net.set_link(&writer_id, &followers[1], Link::Up);
    for i in 41..60 {
        acked.insert(produce_acked(&cluster.agents[i % 3], i).await, i);
    }
    check_after_losing_the_writer(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_applied_by_a_follower_whose_answers_are_lost_leave_no_second_record_at_any_offset() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer_id, followers) = cluster.ensemble().await;
    let writer = cluster.agent(&writer_id);
    let mut acked = HashMap::new();
    for i in 0..10 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    // The follower applies and fsyncs every append; the writer never hears that it did.
    cluster.net.set_link(&writer_id, &followers[0], Link::RepliesLost);
    for i in 10..30 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    cluster.net.set_link(&writer_id, &followers[0], Link::Up);
    for i in 30..40 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    let writer_records = read_all(writer).await;
    // What it applied agrees with the writer's log wherever it serves it.
    check_held(cluster.agent(&followers[0]), &writer_records).await;
    check_after_losing_the_writer(&cluster, &acked).await;
    cluster.stop().await;
}

/// How many ensemble repairs `agent` counted with `outcome`.
/// Every request from the writer to its followers arrives twice, the copy once the first has
/// run (appends, seals, the opening of the next segment): no offset holds two messages, every
/// acknowledged message is at its offset, and the followers hold what the writer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_arrive_twice_leave_one_record_at_each_offset() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer_id, followers) = cluster.ensemble().await;
    let writer = cluster.agent(&writer_id);
    for f in &followers {
        cluster.net.set_link(&writer_id, f, Link::Duplicated);
    }
    let mut acked = HashMap::new();
    for i in 0..20 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    writer.roll_all().await;
    for i in 20..40 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    for f in &followers {
        cluster.net.set_link(&writer_id, f, Link::Up);
    }
    let writer_records = read_all(writer).await;
    check(&writer_records, &acked);
    for f in &followers {
        check_held(cluster.agent(f), &writer_records).await;
    }
    check_after_losing_the_writer(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_and_overtaking_messages_keep_every_acknowledged_message_at_one_offset() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    cluster.ensemble().await;
    // Every request and every answer between any two agents takes up to 300 ms, each its own
    // time: forwarded produces and appends overtake each other.
    let ids: Vec<String> = cluster.agents.iter().map(|a| a.id().to_string()).collect();
    for from in &ids {
        for to in ids.iter().filter(|to| *to != from) {
            cluster.net.set_link(from, to, Link::Delayed(Duration::from_millis(300)));
        }
    }
    let produced = (0..30).map(|i| produce_acked(&cluster.agents[i % 3], i));
    let offsets = futures::future::join_all(produced).await;
    let acked: HashMap<u64, usize> = offsets.into_iter().zip(0..).collect();
    assert_eq!(acked.len(), 30, "two acknowledgements named one offset");
    for from in &ids {
        for to in ids.iter().filter(|to| *to != from) {
            cluster.net.set_link(from, to, Link::Up);
        }
    }
    check_after_losing_the_writer(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cut_off_from_metadata_stops_answering_for_the_partition_once_its_lease_may_have_lapsed() {
    let (cluster, old, mut acked) = linked_cluster_with_ten_acknowledged().await;
    // The writer still reaches the other agents, but not metadata: its lease lapses there and
    // another agent takes the partition over, while the old writer's copy still names it.
    cluster.metadata_links[&old].set(LinkState::Cut);
    let new = writer_other_than(&cluster, &old).await;
    let mut last = 0;
    for i in 10..20 {
        let offset = produce_acked(cluster.agent(&new), i).await;
        acked.insert(offset, i);
        last = last.max(offset);
    }
    // Every answer the old writer gives from now on is either a refusal or at least as new as
    // the last acknowledgement: never a stale end of the partition.
    assert_no_stale_end(cluster.agent(&old), last).await;
    // A produce through it is refused, or acknowledged at an offset after the new writer's.
    if let Ok(ids) = cluster.agent(&old).produce(TOPIC, vec![message(20)]).await {
        assert!(offset(&ids[0]) > last, "{old} acknowledged at {}, not after {last}", offset(&ids[0]));
        acked.insert(offset(&ids[0]), 20);
    }
    cluster.metadata_links[&old].set(LinkState::Up);
    check(&read_all(cluster.agent(&new)).await, &acked);
    cluster.stop().await;
}

/// A writer paused longer than its lease (SIGSTOP, a long garbage collection) is replaced
/// meanwhile. What it took just before the pause and sends on when it resumes, while the next
/// writer recovers the partition, is fenced off or acknowledged at an offset it holds for
/// good; it never gives a stale end of the partition; every acknowledged message stays at its
/// offset on the new writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_paused_longer_than_its_lease_is_replaced_and_what_it_sends_on_resuming_is_fenced_off() {
    let (cluster, old, mut acked) = linked_cluster_with_ten_acknowledged().await;
    cluster.net.pause(&old, true);
    cluster.metadata_links[&old].pause(true);
    // A produce that reached it as the pause began: its appends wait with everything else.
    let in_flight = tokio::spawn({
        let agent = cluster.agent(&old).clone();
        async move { agent.produce(TOPIC, vec![message(10)]).await }
    });
    // Metadata names another writer; the old one resumes as it recovers the partition (a
    // member paused for good would hold the recovery up for a peer timeout), and what it held
    // goes on meanwhile.
    let new = writer_other_than(&cluster, &old).await;
    cluster.net.pause(&old, false);
    cluster.metadata_links[&old].pause(false);
    let mut last = 0;
    for i in 11..20 {
        let offset = produce_acked(cluster.agent(&new), i).await;
        acked.insert(offset, i);
        last = last.max(offset);
    }
    if let Ok(ids) = in_flight.await.expect("the produce task") {
        acked.insert(offset(&ids[0]), 10);
    }
    assert_no_stale_end(cluster.agent(&old), last).await;
    check(&read_all(cluster.agent(&new)).await, &acked);
    cluster.stop().await;
}

/// An agent whose lease lapsed registers again while its copy of metadata still names it the
/// writer of a partition that moved meanwhile: until its copy includes the registration it
/// answers for the partition as no writer, never with the end of its own log, behind what the
/// new writer acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registered_again_answers_as_no_writer_until_its_copy_of_metadata_includes_the_registration()
{
    // A lease longer than a write waits for the copy to include it.
    let cluster = Cluster::start_with_lease(true, Duration::from_secs(6)).await;
    create_topic(&cluster).await;
    let (old, _) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..10 {
        acked.insert(produce_acked(cluster.agent(&old), i).await, i);
    }
    let registered = registrations(cluster.agent(&old));
    // Cut off from metadata and the other agents (none fences its log), it still runs its
    // writer while its lease lapses and another agent takes the partition over.
    cluster.metadata_links[&old].set(LinkState::Cut);
    for other in cluster.agents.iter().map(|a| a.id().to_string()).filter(|a| *a != old) {
        cluster.net.set_link(&old, &other, Link::Cut);
        cluster.net.set_link(&other, &old, Link::Cut);
    }
    let new = writer_other_than(&cluster, &old).await;
    let mut last = 0;
    for i in 10..20 {
        let offset = produce_acked(cluster.agent(&new), i).await;
        acked.insert(offset, i);
        last = last.max(offset);
    }
    // Its writes reach metadata again, its reads do not: its copy, from before the partition
    // moved, is too old to answer from, and it sends no heartbeat (which would find its lease
    // lapsed and register it again) until the copy is current.
    cluster.metadata_links[&old].set(LinkState::ReadsLost);
    let deadline = Instant::now() + Duration::from_secs(30);
    while heartbeats(cluster.agent(&old), "copy_stale") == 0 {
        assert!(Instant::now() < deadline, "{old} sent heartbeats with a copy too old to answer from");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_no_stale_end(cluster.agent(&old), last).await;
    assert_eq!(registrations(cluster.agent(&old)), registered, "{old} registered again with a stale copy");
    // Its reads get through again: it registers again, and answers with no stale end
    // throughout, before its copy includes the registration and after.
    cluster.metadata_links[&old].set(LinkState::Up);
    while registrations(cluster.agent(&old)) == registered {
        assert!(Instant::now() < deadline, "{old} did not register again within 30 s");
        assert_no_stale_end(cluster.agent(&old), last).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_no_stale_end(cluster.agent(&old), last).await;
    check(&read_all(cluster.agent(&new)).await, &acked);
    cluster.stop().await;
}

/// A topic deleted through a follower while the writer and the other follower cannot read
/// metadata (their copies do not learn of the deletion; their heartbeats keep their leases):
/// once the deletion returns, neither answers for the deleted topic, no produce to it is
/// acknowledged and no read of it answered, until their copies catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_whose_copy_of_metadata_lags_answer_for_a_deleted_topic_no_more_once_the_deletion_returns() {
    let cluster = Cluster::start_with(true).await;
    create_topic(&cluster).await;
    let (writer, followers) = cluster.ensemble().await;
    produce_acked(cluster.agent(&writer), 0).await;
    let (deleter, other) = (&followers[0], &followers[1]);
    cluster.metadata_links[&writer].set(LinkState::ReadsLost);
    cluster.metadata_links[other].set(LinkState::ReadsLost);
    cluster.agent(deleter).delete_topic(TOPIC).await.expect("the topic deleted");
    // And created again, empty.
    cluster.agent(deleter).create_topic(TOPIC, 1, BTreeMap::new()).await.expect("the topic created again");
    let stale = |e: &ApiError| e.to_string().contains("has not refreshed its copy of metadata");
    for agent in [&writer, other] {
        let produced = cluster.agent(agent).produce(TOPIC, vec![message(1)]).await;
        assert!(produced.as_ref().is_err_and(stale), "{agent} answered a produce with {produced:?}");
        let read = cluster.agent(agent).read(TOPIC, 0, 0, ReadLimit::new(10, 1 << 20), false).await;
        assert!(read.as_ref().is_err_and(stale), "{agent} answered a read with {read:?}");
    }
    cluster.metadata_links[&writer].set(LinkState::Up);
    cluster.metadata_links[other].set(LinkState::Up);
    cluster.stop().await;
}

/// An agent whose reads of metadata are lost while its heartbeats get through answers for its
/// partitions no more once its copy is 7/8 of a lease old, and stops renewing its lease, so
/// that metadata gives them to an agent that can: the partition takes produces again there,
/// and nothing acknowledged before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_read_metadata_lets_its_partitions_move_to_one_that_can() {
    let cluster = Cluster::start_with(true).await;
    create_topic(&cluster).await;
    let (writer, _) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..5 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    cluster.metadata_links[&writer].set(LinkState::ReadsLost);
    let new = writer_other_than(&cluster, &writer).await;
    for i in 5..10 {
        acked.insert(produce_acked(cluster.agent(&new), i).await, i);
    }
    assert!(heartbeats(cluster.agent(&writer), "copy_stale") > 0, "{writer} kept renewing its lease");
    cluster.metadata_links[&writer].set(LinkState::Up);
    check(&read_all(cluster.agent(&new)).await, &acked);
    cluster.stop().await;
}

/// A heartbeat whose answer is lost does not hold up the next one: a writer whose link to
/// metadata loses the answers for a moment keeps its lease, and keeps answering, throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_whose_answer_is_lost_does_not_keep_the_next_from_renewing_the_lease() {
    let cluster = Cluster::start_with(true).await;
    create_topic(&cluster).await;
    let (writer, _) = cluster.ensemble().await;
    let writer_agent = cluster.agent(&writer);
    produce_acked(writer_agent, 0).await;
    // Right after a heartbeat renewed the lease (every 1/2 s with a 2 s lease), the answers
    // are lost for 0.6 s: the next heartbeat takes effect but its answer is lost, the one after
    // gets through.
    let renewed = heartbeats(writer_agent, "renewed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while heartbeats(writer_agent, "renewed") == renewed {
        assert!(Instant::now() < deadline, "no heartbeat of {writer} renewed its lease within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lost_until = Instant::now() + Duration::from_millis(600);
    cluster.metadata_links[&writer].set(LinkState::RepliesLost);
    let watch_until = lost_until + Duration::from_secs(3);
    while Instant::now() < watch_until {
        if Instant::now() >= lost_until {
            cluster.metadata_links[&writer].set(LinkState::Up);
        }
        if let Err(e) = cluster.agent(&writer).read(TOPIC, 0, 0, ReadLimit::new(10, 1 << 20), false).await {
            panic!(
                "{writer} refused a read {:?} after the answers were lost for 0.6 s: {e}",
                Instant::now() - lost_until
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}

fn heartbeats(agent: &Agent, outcome: &str) -> u64 {
    let prefix = format!("silt_agent_heartbeats_total{{outcome=\"{outcome}\"}} ");
    agent.metrics().encode().lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

fn registrations(agent: &Agent) -> u64 {
    let prefix = "silt_agent_registrations_total ";
    agent.metrics().encode().lines().find_map(|l| l.strip_prefix(prefix)?.parse().ok()).unwrap_or(0)
}

/// A recovery that hears from some members of the open segment only seals it naming the others
/// as unverified: once the disks of the members it named are replaced, the acknowledged
/// messages are read from one that did not answer then. The unacknowledged tail the seal took
/// in, on no disk left, is declared lost on that member's word (it lacks it, so it was never
/// acknowledged), the member becomes the segment's holder, and reads go on past the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_sealed_without_hearing_from_a_member_is_read_from_it_once_the_holders_disks_are_replaced()
{
    // The recovery waits for the stopped member for a second past its lease, then seals
    // without it.
    let (mut cluster, writer, follower, mut acked) =
        two_member_partition(Duration::from_secs(2), Duration::from_secs(1)).await;
    // The follower goes; the writer's next write lacks its quorum, and the writer recovers
    // the open segment from its own copy (R - W + 1 = 1 answer of a two-member ensemble).
    cluster.stop_agent(&follower).await;
    let _ = cluster.agent(&writer).produce(TOPIC, vec![message(10)]).await;
    let sealed = |s: &silt_metadata::MetadataState| {
        let seg = s.topics[TOPIC].partitions[0].segments.values().next()?;
        seg.last_offset.map(|_| (seg.ensemble.clone(), seg.unverified.clone()))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (holders, unverified) = loop {
        if let Some(found) = cluster.metadata.read(sealed).await.expect("metadata read") {
            break found;
        }
        assert!(Instant::now() < deadline, "the first segment is not sealed within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(holders, vec![writer.clone()], "sealed by the writer alone");
    assert_eq!(unverified, vec![follower.clone()], "the follower that did not answer stays named");
    let segment_end = cluster
        .metadata
        .read(|s| s.topics[TOPIC].partitions[0].segments.values().next().and_then(|seg| seg.last_offset))
        .await
        .expect("metadata read")
        .expect("sealed")
        + 1;
    assert_eq!(segment_end, 11, "the seal took in the unacknowledged message 10, on the writer alone");
    // The writer's disk is replaced; the follower comes back with its copy.
    cluster.restart(&writer, true).await;
    cluster.restart(&follower, false).await;
    cluster.restart("agent-2", false).await;
    let after = produce_acked(cluster.agent("agent-2"), 11).await;
    assert!(after >= segment_end, "message 11 at {after}, inside the sealed segment");
    acked.insert(after, 11);
    // Message 10 was on the writer's disk alone: once the follower showed it lacks it, reads
    // step over it to what comes after.
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let (records, error) = read_until_refused(cluster.agent("agent-2")).await;
        if error.is_none() && records.iter().any(|r| r.offset == after) {
            break records;
        }
        if Instant::now() >= deadline {
            let part = cluster.metadata.read(|s| s.topics[TOPIC].partitions[0].clone()).await;
            panic!(
                "the messages after the lost tail are not readable within 30 s ({} read): {error:?}; metadata: {part:?}",
                records.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check(&records, &acked);
    assert!(records.iter().all(|r| r.offset != 10), "offset 10 is on no disk left");
    let part = cluster.metadata.read(|s| s.topics[TOPIC].partitions[0].clone()).await.expect("metadata read");
    assert_eq!(part.lost_ranges, [silt_metadata::state::LostRange { from: 10, end: 11 }]);
    let first = part.segments.values().next().expect("the first segment");
    assert_eq!(
        (first.last_offset, first.ensemble.clone()),
        (Some(9), vec![follower.clone()]),
        "the follower holds it"
    );
    assert_eq!(declared_lost(cluster.agent(&follower)), 1, "declared by the follower, its first witness");
    cluster.stop().await;
}

fn declared_lost(agent: &Agent) -> u64 {
    let prefix = format!("silt_agent_declared_lost_offsets_total{{topic=\"{TOPIC}\"}} ");
    agent.metrics().encode().lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

/// A group's message in flight at an offset that is then declared lost (an unacknowledged tail
/// a lone recovery sealed, on a disk since replaced) is done with: the group's floor moves past
/// it, instead of the message staying in flight, redelivered as nothing, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_done_with_a_message_in_flight_whose_offset_is_declared_lost() {
    // The writer waits for the stopped follower for a second past its lease, then seals alone.
    let mut cluster = Cluster::start_with_timings(true, Duration::from_secs(2), Duration::from_secs(1)).await;
    cluster.stop_agent("agent-2").await;
    // Redelivered often, never dead-lettered within the test.
    let config = [("visibility.timeout.ms", "300"), ("max.deliveries", "1000")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    cluster.agents[0].create_topic(TOPIC, 1, config).await.expect("create topic");
    let (writer, followers) = cluster.ensemble_of(2).await;
    let follower = followers[0].clone();
    for i in 0..10 {
        produce_acked(cluster.agent(&writer), i).await;
    }
    // The follower goes; the writer recovers alone and seals message 10, which nobody
    // acknowledged, on its own disk.
    cluster.stop_agent(&follower).await;
    let _ = cluster.agent(&writer).produce(TOPIC, vec![message(10)]).await;
    let sealed_end = |s: &silt_metadata::MetadataState| {
        s.topics[TOPIC].partitions[0].segments.values().next().and_then(|seg| seg.last_offset)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.metadata.read(sealed_end).await.expect("metadata read") != Some(10) {
        assert!(Instant::now() < deadline, "the first segment is not sealed at 10 within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The others come back, and the writer is cut off from metadata (not from them): another
    // agent takes the partition, and with it the group's deliveries.
    cluster.restart(&follower, false).await;
    cluster.restart("agent-2", false).await;
    cluster.metadata_links[&writer].set(LinkState::Cut);
    let next = writer_other_than(&cluster, &writer).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut delivered = std::collections::BTreeSet::new();
    while !(0..=10).all(|o| delivered.contains(&o)) {
        assert!(Instant::now() < deadline, "offsets 0..=10 not delivered within 30 s: {delivered:?}");
        if let Ok(got) = poll_group(cluster.agent(&next)).await {
            delivered.extend(got.iter().map(|d| d.record.offset));
        }
    }
    let ids: Vec<String> = (0..10).map(|o| MessageId::new(TOPIC.to_string(), 0, o).to_string()).collect();
    cluster.agent(&next).ack("g", &ids, false, false).await.expect("ack 0..10");
    // The writer's disk is replaced: offset 10 is on no disk left, and is declared lost.
    cluster.restart(&writer, true).await;
    let lost = |s: &silt_metadata::MetadataState| s.topics[TOPIC].partitions[0].lost_ranges.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.metadata.read(lost).await.expect("metadata read").is_empty() {
        assert!(Instant::now() < deadline, "offset 10 not declared lost within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = poll_group(cluster.agent(&next)).await;
        let (_, lags, _) = cluster.agent(&next).describe_group("g").await.expect("describe the group");
        let lag = &lags[TOPIC][0];
        if lag.ack_floor >= 11 && lag.in_flight == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the group still waits for the lost offset 10 after 30 s: {lag:?}"
        );
    }
    cluster.stop().await;
}

/// One poll of group `g` by member `m` through `agent`.
async fn poll_group(agent: &Agent) -> Result<Vec<silt_agent::group_cursor::Delivered>, ApiError> {
    agent
        .poll(silt_agent::agent::PollRequest {
            topic: TOPIC.into(),
            group: "g".into(),
            member: "m".into(),
            mode: silt_metadata::state::GroupMode::Exclusive,
            max: 100,
            max_bytes: 1 << 20,
            timeout: Duration::from_millis(200),
            session_timeout: Duration::from_secs(60),
        })
        .await
}

/// A recovery that hears from fewer members than W does not seal the tail on those alone while
/// a member that did not answer may come back with its copy: sealed, a tail nobody acknowledged
/// would be served from then on, and lost with the disks of the members that answered. Once the
/// member is back, the segment is sealed with both members holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_waits_for_a_member_that_may_come_back_before_it_seals_a_tail_on_fewer_than_w() {
    let (mut cluster, writer, follower, acked) =
        two_member_partition(Duration::from_secs(2), silt_agent::agent::DEFAULT_REPLICA_REPAIR_AFTER).await;
    let epoch = |s: &silt_metadata::MetadataState| s.topics[TOPIC].partitions[0].epoch;
    let before = cluster.metadata.read(epoch).await.expect("metadata read");
    // The follower goes; the writer's next write lacks its quorum, and it recovers the open
    // segment under a new epoch, hearing from itself alone.
    cluster.stop_agent(&follower).await;
    let _ = cluster.agent(&writer).produce(TOPIC, vec![message(10)]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.metadata.read(epoch).await.expect("metadata read") == before {
        assert!(Instant::now() < deadline, "no recovery under a new epoch within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first =
        |s: &silt_metadata::MetadataState| s.topics[TOPIC].partitions[0].segments.values().next().cloned();
    // Past the follower's lease (2 s), well within --replica-repair-after: not sealed alone.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let seg = cluster.metadata.read(first).await.expect("metadata read").expect("the first segment");
        assert_eq!(seg.last_offset, None, "sealed without the follower, which may come back: {seg:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.restart(&follower, false).await;
    let seg = first_segment_sealed(&cluster, "of the follower's return").await;
    let mut holders = seg.ensemble.clone();
    holders.sort();
    let mut both = vec![writer.clone(), follower.clone()];
    both.sort();
    assert_eq!((holders, seg.unverified.clone()), (both, Vec::<String>::new()), "both hold the sealed tail");
    check(&read_all(cluster.agent(&follower)).await, &acked);
    cluster.stop().await;
}

/// A member that stays live to metadata but does not answer the agents (cut off from them
/// alone) is waited for no longer than `replica_repair_after` from the first recovery of the
/// segment that waited, whatever its lease and whichever agent recovers: the writer cannot
/// reach it, hands the partition to the third agent after a lease, which cannot either, and so
/// on; the wait is metadata's, so the tail is sealed on the member that answered, the silent
/// one named unverified, instead of the partition's acknowledged messages staying behind an
/// open segment for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_stops_waiting_for_a_live_member_that_does_not_answer_after_replica_repair_after() {
    // The wait is three leases: a wait that started again with each agent never ends.
    let (mut cluster, writer, follower, acked) =
        two_member_partition(Duration::from_secs(2), Duration::from_secs(6)).await;
    cluster.restart("agent-2", false).await;
    // The follower is cut off from the agents, not from metadata: its lease holds.
    cluster.net.isolate(&follower, true);
    let isolated = Instant::now();
    let _ = cluster.agent(&writer).produce(TOPIC, vec![message(10)]).await;
    let seg = first_segment_sealed(&cluster, "while the follower stays live and silent").await;
    // Not before the wait: the follower may come back until then.
    assert!(
        isolated.elapsed() >= cluster.repair_after,
        "sealed {:?} after the follower went silent, before --replica-repair-after ({:?})",
        isolated.elapsed(),
        cluster.repair_after
    );
    let live = |s: &silt_metadata::MetadataState| s.agents[&follower].is_live(s.clock_ms);
    assert!(cluster.metadata.read(live).await.expect("metadata read"), "the follower's lease held");
    assert_eq!(
        (seg.ensemble.clone(), seg.unverified.clone()),
        (vec![writer.clone()], vec![follower.clone()]),
        "sealed on the writer, the silent follower unverified"
    );
    // Once the follower answers again, the partition is writable and holds every
    // acknowledged message.
    cluster.net.isolate(&follower, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.agent(&writer).produce(TOPIC, vec![message(11)]).await.is_err() {
        assert!(Instant::now() < deadline, "not writable within 30 s of the follower's return");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check(&read_all(cluster.agent(&writer)).await, &acked);
    cluster.stop().await;
}

/// A cluster whose agents take leases of `lease` and wait `repair_after` for a member that is
/// gone, with the third agent stopped before the topic is created: the partition's open
/// segment has two members, the writer and the follower (W = 2), and holds 10 acknowledged
/// messages (by offset).
async fn two_member_partition(
    lease: Duration,
    repair_after: Duration,
) -> (Cluster, String, String, HashMap<u64, usize>) {
    let cluster = Cluster::start_with_timings(false, lease, repair_after).await;
    cluster.stop_agent("agent-2").await;
    create_topic(&cluster).await;
    let (writer, followers) = cluster.ensemble_of(2).await;
    let mut acked = HashMap::new();
    for i in 0..10 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    (cluster, writer, followers[0].clone(), acked)
}

/// The partition's first segment once metadata has it sealed (within 30 s, `when`).
async fn first_segment_sealed(cluster: &Cluster, when: &str) -> silt_metadata::state::Segment {
    let first =
        |s: &silt_metadata::MetadataState| s.topics[TOPIC].partitions[0].segments.values().next().cloned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seg = cluster.metadata.read(first).await.expect("metadata read").expect("the first segment");
        if seg.last_offset.is_some() {
            return seg;
        }
        assert!(Instant::now() < deadline, "the first segment is not sealed within 30 s {when}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `agent` serves of the partition from offset 0, to the end or to the first refusal.
async fn read_until_refused(agent: &Agent) -> (Vec<Record>, Option<ApiError>) {
    let mut records = Vec::new();
    let mut offset = 0;
    loop {
        match agent.read(TOPIC, 0, offset, ReadLimit::new(1000, 1 << 20), false).await {
            Ok((page, next, end)) => {
                records.extend(page);
                if next >= end {
                    return (records, None);
                }
                offset = next;
            }
            Err(e) => return (records, Some(e)),
        }
    }
}

/// Every answer `old` gives to reads of the partition is a refusal (`unavailable`) or at least
/// as new as offset `last`, acknowledged before: never a stale end of the partition.
async fn assert_no_stale_end(old: &Agent, last: u64) {
    for _ in 0..5 {
        match old.read(TOPIC, 0, 0, ReadLimit::new(1000, 1 << 20), false).await {
            Ok((_, _, hwm)) => {
                assert!(hwm > last, "{} answered hwm {hwm}; offset {last} was acknowledged before", old.id())
            }
            Err(e) => assert_eq!(e.code, silt_agent::error::ErrorCode::Unavailable, "{e}"),
        }
    }
}

fn repairs(agent: &Agent, outcome: &str) -> u64 {
    let prefix = format!("silt_agent_ensemble_repairs_total{{outcome=\"{outcome}\"}} ");
    agent.metrics().encode().lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

/// A segment sealed while a follower was cut off from the writer is short of a replica; the
/// writer, its repairer, does not ask the agent it cannot reach to copy it (a refused attempt
/// would keep that agent from being asked again for a while), and has it copied once the link
/// is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_sealed_without_a_cut_off_follower_is_repaired_by_it_once_the_link_is_back() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer_id, followers) = cluster.ensemble().await;
    let writer = cluster.agent(&writer_id);
    let mut acked = HashMap::new();
    for i in 0..10 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    cluster.net.set_link(&writer_id, &followers[0], Link::Cut);
    for i in 10..20 {
        acked.insert(produce_acked(writer, i).await, i);
    }
    writer.roll_all().await;
    let short = |s: &silt_metadata::MetadataState| {
        let p = &s.topics[TOPIC].partitions[0];
        p.segments.values().filter(|seg| seg.last_offset.is_some()).any(|seg| seg.ensemble.len() < 3)
    };
    assert!(
        cluster.metadata.read(short).await.expect("metadata read"),
        "a segment sealed short of a replica"
    );
    // Rounds of the writer's supervisor pass while the follower stays cut off.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert_eq!(repairs(writer, "failed"), 0, "a repair asked an agent the writer cannot reach");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.net.set_link(&writer_id, &followers[0], Link::Up);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.metadata.read(short).await.expect("metadata read") {
        assert!(
            Instant::now() < deadline,
            "a sealed segment still short of a replica 60 s after the link is back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(repairs(writer, "failed"), 0);
    assert!(repairs(writer, "added") >= 1);
    check_after_losing_the_writer(&cluster, &acked).await;
    cluster.stop().await;
}

/// A probe clears the unreachable mark of an agent that answers again, and neither makes nor
/// prolongs one when it gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_clears_the_mark_of_an_agent_that_answers_again_and_makes_none() {
    let cluster = Cluster::start().await;
    let observer = cluster.net.peers("observer");
    let target = ("agent-0", "memory-0");
    cluster.net.set_link("observer", "agent-0", Link::Cut);
    assert!(!observer.probe(target).await, "answered across a cut link");
    assert!(!observer.is_unreachable("agent-0"), "a probe that got no answer made a mark");
    // A request that gets no answer makes one.
    assert!(observer.offset_for_time(target, TOPIC, 0, 0).await.is_err());
    let since = observer.unreachable_since("agent-0").expect("marked unreachable");
    assert!(!observer.probe(target).await);
    assert_eq!(
        observer.unreachable_since("agent-0"),
        Some(since),
        "a probe that got no answer prolonged the mark"
    );
    cluster.net.set_link("observer", "agent-0", Link::Up);
    assert!(observer.probe(target).await);
    assert!(!observer.is_unreachable("agent-0"), "answered, yet still marked");
    cluster.stop().await;
}

/// A follower whose disk fails under the partition (every fsync fails) is left out of the
/// segments the writer opens next for a while, rather than chosen again for each one, which
/// would seal a segment for every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_failed_under_the_partition_is_left_out_of_new_segments() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer, followers) = cluster.ensemble().await;
    let failing = followers[0].clone();
    let _fault = silt_agent::log::disk::inject_fsync_errors(&format!("{failing}/log/"), 0, u32::MAX);
    let mut acked = HashMap::new();
    for i in 0..30 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    let ensembles: Vec<Vec<String>> = cluster
        .metadata
        .read(|s| s.topics[TOPIC].partitions[0].segments.values().map(|seg| seg.ensemble.clone()).collect())
        .await
        .expect("metadata read");
    // The segment the fault hit, and one without the follower.
    assert!(ensembles.len() <= 2, "a segment for every few writes: {ensembles:?}");
    let open = ensembles.last().expect("an open segment");
    assert!(!open.contains(&failing), "{failing} is in the open segment: {ensembles:?}");
    assert_eq!(open.len(), 2, "the writer and the other follower: {ensembles:?}");
    check(&read_all(cluster.agent(&writer)).await, &acked);
    cluster.stop().await;
}

/// A writer whose own write fails after its followers took the group (the disk is full) ends,
/// and the writer that starts after it recovers the segment under a new epoch rather than
/// continue it under the old one: otherwise a follower's copy of the failed group and a later,
/// acknowledged one could sit at the same offsets under the same epoch, and a recovery would
/// take either for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_own_write_failed_is_followed_by_one_under_a_new_epoch() {
    let cluster = Cluster::start().await;
    create_topic(&cluster).await;
    let (writer, followers) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..5 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    let epoch = || async {
        cluster.metadata.read(|s| s.topics[TOPIC].partitions[0].epoch).await.expect("metadata read")
    };
    let before = epoch().await;
    let full = silt_agent::log::disk::inject_write_errors(
        silt_agent::log::disk::FaultKind::NoSpace,
        &format!("{writer}/log/"),
        0,
        1,
    );
    let refused = cluster.agent(&writer).produce(TOPIC, vec![message(5)]).await;
    assert!(refused.is_err(), "a write the writer's disk refused was acknowledged: {refused:?}");
    assert_eq!(full.failed(), 1, "the write was not refused: this is not the case under test");
    for i in 6..12 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    let after = epoch().await;
    assert!(after > before, "the partition is still at epoch {before} after its writer's write failed");
    let records = read_all(cluster.agent(&writer)).await;
    check(&records, &acked);
    assert!(records.iter().filter(|r| r.value.as_deref() == Some(&b"message 5"[..])).count() <= 1);
    for f in &followers {
        check_held(cluster.agent(f), &records).await;
    }
    cluster.stop().await;
}

/// A writer that lost its write quorum answers no read with its end of the partition from then
/// on, though its lease still holds: a newer writer may be acknowledging past that end already
/// (here the old one cannot even tell metadata it gives the partition up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_lost_its_write_quorum_answers_no_read_with_its_end() {
    let cluster = Cluster::start_with(true).await;
    create_topic(&cluster).await;
    let (writer, followers) = cluster.ensemble().await;
    for i in 0..5 {
        produce_acked(cluster.agent(&writer), i).await;
    }
    let w = cluster.agent(&writer);
    // Its lease holds (it was renewed a moment ago) while the writer loses its quorum.
    w.read(TOPIC, 0, 0, ReadLimit::new(10, 1 << 20), false).await.expect("a read before the cut");
    cluster.metadata_links[&writer].set(LinkState::Cut);
    for f in &followers {
        cluster.net.set_link(&writer, f, Link::Cut);
        cluster.net.set_link(f, &writer, Link::Cut);
    }
    let lost = w.produce(TOPIC, vec![message(5)]).await;
    assert!(lost.is_err(), "acknowledged without a quorum: {lost:?}");
    match w.read(TOPIC, 0, 0, ReadLimit::new(10, 1 << 20), false).await {
        Err(e) => assert_eq!(e.code, silt_agent::error::ErrorCode::Unavailable, "{e}"),
        Ok((_, _, hwm)) => panic!("{writer} answered with its end {hwm} after losing its write quorum"),
    }
    cluster.metadata_links[&writer].set(LinkState::Up);
    cluster.stop().await;
}

/// A writer streams each new segment to the ensemble metadata committed for it, not to the
/// one its copy of metadata shows: here its copy stops following (its reads are lost, its
/// writes arrive) while segments roll every 100 ms, and every message is still acknowledged
/// by a quorum and held by the followers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_copy_of_metadata_lags_replicates_each_new_segment_to_the_ensemble_it_opened() {
    // A lease longer than the six rolls below, each of whose writes waits 2 s for the copy to
    // include it: a writer answers only while its copy is current as of 7/8 of a lease ago.
    let cluster = Cluster::start_with_lease(true, Duration::from_secs(24)).await;
    let config = BTreeMap::from([("segment.ms".to_string(), "100".to_string())]);
    cluster.agents[0].create_topic(TOPIC, 1, config).await.expect("create topic");
    let (writer, followers) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..3 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    let segments = || async {
        cluster.metadata.read(|s| s.topics[TOPIC].partitions[0].segments.len()).await.expect("metadata read")
    };
    cluster.metadata_links[&writer].set(LinkState::ReadsLost);
    for i in 3..9 {
        let before = segments().await;
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
        // The segment rolls 100 ms after its first record; the next message goes to a new one.
        let deadline = Instant::now() + Duration::from_secs(10);
        while segments().await == before {
            assert!(
                Instant::now() < deadline,
                "no segment rolled within 10 s: this is not the case under test"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    cluster.metadata_links[&writer].set(LinkState::Up);
    let records = read_all(cluster.agent(&writer)).await;
    check(&records, &acked);
    // A quorum of 2 of 3: the writer and at least one follower hold every acknowledged message
    // (a follower serves it once its copy of metadata shows it committed).
    for (offset, i) in &acked {
        let deadline = Instant::now() + Duration::from_secs(10);
        'held: loop {
            for f in &followers {
                let held = cluster.agent(f).read_held(TOPIC, 0, *offset, ReadLimit::new(1, 1 << 20)).await;
                if let Ok((records, _, _)) = held {
                    let r = records.first().expect("a held record");
                    let value = format!("message {i}");
                    assert_eq!((r.offset, r.value.as_deref()), (*offset, Some(value.as_bytes())));
                    break 'held;
                }
            }
            assert!(Instant::now() < deadline, "no follower holds acknowledged offset {offset}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    cluster.stop().await;
}

/// A seal metadata refuses for good (its record of the open segment names other members than
/// the writer streamed to, which no retry changes) ends the writer, and the next one recovers
/// the segment under a new epoch: the partition takes writes again and keeps every
/// acknowledged message, where retrying the seal would refuse every write for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_seal_metadata_refuses_for_good_ends_and_the_next_one_takes_the_partition_on() {
    let cluster = Cluster::start().await;
    let config = BTreeMap::from([("segment.ms".to_string(), "100".to_string())]);
    cluster.agents[0].create_topic(TOPIC, 1, config).await.expect("create topic");
    let (writer, followers) = cluster.ensemble().await;
    let mut acked = HashMap::new();
    for i in 0..3 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    // Once the segment holding them rolled, the open one stays empty until the next write.
    let end = acked.keys().max().unwrap() + 1;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (topic_id, epoch, members, instances) = loop {
        let open = cluster
            .metadata
            .read(|s| {
                let t = &s.topics[TOPIC];
                let p = &t.partitions[0];
                let open = p.open_segment().filter(|o| o.base_offset == end)?;
                Some((t.id, p.epoch, open.ensemble.clone(), open.instances.clone()))
            })
            .await
            .expect("metadata read");
        if let Some(open) = open {
            break open;
        }
        assert!(Instant::now() < deadline, "no empty segment opened at {end} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Metadata's record of it changes under the writer: one follower fewer.
    let gone = followers[0].clone();
    let kept: Vec<usize> = (0..members.len()).filter(|i| members[*i] != gone).collect();
    let seal = silt_metadata::Command::SealSegment {
        record_witnesses_needed: false,
        topic: TOPIC.into(),
        topic_id: Some(topic_id),
        partition: 0,
        epoch,
        base_offset: end,
        record_count: 0,
        size_bytes: 0,
        min_timestamp_ms: None,
        max_timestamp_ms: None,
        replicas: None,
        unverified: Vec::new(),
        now_ms: 1,
    };
    let open = silt_metadata::Command::OpenSegment {
        topic: TOPIC.into(),
        topic_id: Some(topic_id),
        partition: 0,
        epoch,
        base_offset: end,
        ensemble: kept.iter().map(|i| members[*i].clone()).collect(),
        instances: kept.iter().filter_map(|i| instances.get(*i).cloned()).collect(),
        now_ms: 1,
    };
    let roll = silt_metadata::Command::RollSegment { seal: Box::new(seal), open: Box::new(open) };
    cluster.metadata.write(roll).await.expect("the open segment replaced in place");
    // Acknowledged by the writer and the follower metadata no longer names, the other one cut
    // off, then sealed 100 ms later naming that follower a replica: refused at every attempt.
    let cut = followers[1].clone();
    cluster.net.set_link(&writer, &cut, Link::Cut);
    cluster.net.set_link(&cut, &writer, Link::Cut);
    let offset = produce_acked(cluster.agent(&writer), 3).await;
    assert_eq!(offset, end, "message 3 is not in the segment metadata's record of changed");
    acked.insert(offset, 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.metadata.read(|s| s.topics[TOPIC].partitions[0].epoch).await.expect("metadata read")
        == epoch
    {
        assert!(
            Instant::now() < deadline,
            "the partition is still at epoch {epoch} 30 s after a refused seal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.net.set_link(&writer, &cut, Link::Up);
    cluster.net.set_link(&cut, &writer, Link::Up);
    let (writer, _) = cluster.ensemble_of(3).await;
    for i in 4..8 {
        acked.insert(produce_acked(cluster.agent(&writer), i).await, i);
    }
    // The next writer sealed the segment the refused seal was for, with message 3 in it.
    let sealed = cluster
        .metadata
        .read(move |s| {
            s.topics[TOPIC].partitions[0].segments.get(&end).map(|seg| (seg.state, seg.record_count))
        })
        .await
        .expect("metadata read");
    assert_eq!(sealed, Some((silt_metadata::state::SegmentState::Sealed, 1)));
    check(&read_all(cluster.agent(&writer)).await, &acked);
    cluster.stop().await;
}

fn counter(agent: &Agent, name: &str) -> u64 {
    let prefix = format!("silt_agent_{name}_total ");
    agent.metrics().encode().lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

/// The writer and epoch of each partition of the topic, as metadata has them.
async fn writers(cluster: &Cluster) -> Vec<(Option<String>, u64)> {
    cluster
        .metadata
        .read(|s| s.topics[TOPIC].partitions.iter().map(|p| (p.writer.clone(), p.epoch)).collect())
        .await
        .expect("metadata read")
}

/// Produces message `i` to `partition` through `agent` until it is acknowledged; its offset.
async fn produce_to(agent: &Agent, partition: u32, i: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = ProduceMessage { partition: Some(partition), ..message(i) };
    loop {
        match agent.produce(TOPIC, vec![m.clone()]).await {
            Ok(ids) => return ids[0].offset,
            Err(e) => assert!(Instant::now() < deadline, "message {i} not acknowledged within 30 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rebalance moves a partition only when its writer moves it: one whose copy of metadata
/// lags (its reads lost, its heartbeats through, so its lease holds) keeps its partitions
/// however long a move is due, and never answers with an end another writer went past. Once
/// its copy is current it stops the partition's writer and moves the partition itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_moves_a_partition_only_when_its_writer_hands_it_over() {
    // A lease long enough for the move to fall due, and the others to look at it, while
    // agent-0's copy lags less than 7/8 of a lease (beyond, it answers for nothing).
    let mut cluster = Cluster::start_with_lease(true, Duration::from_secs(8)).await;
    // agent-0 alone is live when the topic is created: it writes both partitions.
    cluster.stop_agent("agent-1").await;
    cluster.stop_agent("agent-2").await;
    cluster.agents[0].create_topic(TOPIC, 2, BTreeMap::new()).await.expect("create topic");
    let registered = Instant::now();
    cluster.restart("agent-1", false).await;
    cluster.restart("agent-2", false).await;
    let old = cluster.agent("agent-0");
    for p in 0..2 {
        produce_to(old, p, p as usize).await;
    }
    let before = writers(&cluster).await;
    assert!(before.iter().all(|(w, _)| w.as_deref() == Some("agent-0")), "{before:?}");
    // The others are settled (and a move due) three leases after they registered: agent-0's
    // copy stops three seconds before then.
    let cut_at = cluster.lease * 3 - Duration::from_secs(3);
    while registered.elapsed() < cut_at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.metadata_links["agent-0"].set(LinkState::ReadsLost);
    assert!(registered.elapsed() < cluster.lease * 3, "the copy was cut too late for this test");
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.metadata.read(|s| s.rebalance_due()).await.expect("metadata read").is_none() {
        assert!(Instant::now() < deadline, "no rebalance due within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each of the others runs its housekeeping (which moved partitions it did not write,
    // when a rebalance was due) a few times over: nothing moves.
    let rounds = |a: &Agent| counter(a, "housekeeping_rounds");
    let start: Vec<u64> = cluster.agents[1..].iter().map(rounds).collect();
    while cluster.agents[1..].iter().zip(&start).any(|(a, s)| rounds(a) < s + 4) {
        assert!(Instant::now() < deadline, "the agents' housekeeping stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(writers(&cluster).await, before, "a partition moved off a writer whose copy lags");
    // Nor does agent-0 answer for them once its copy lags 7/8 of a lease: for all it knows,
    // they were deleted since. What it acknowledged before then is kept.
    let mut acked: HashMap<u64, usize> = HashMap::new();
    let m = ProduceMessage { partition: Some(0), ..message(10) };
    loop {
        match cluster.agent("agent-0").produce(TOPIC, vec![m.clone()]).await {
            Ok(ids) => acked.insert(ids[0].offset, 10),
            Err(e) if e.to_string().contains("has not refreshed its copy of metadata") => break,
            Err(e) => panic!("agent-0 refused a produce with {e}"),
        };
        assert!(Instant::now() < deadline, "agent-0 answered as a writer with a copy that lags for good");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // With its copy current again, it answers again and moves one partition itself.
    cluster.metadata_links["agent-0"].set(LinkState::Up);
    acked.insert(produce_to(cluster.agent("agent-0"), 0, 11).await, 11);
    let moved = loop {
        let now = writers(&cluster).await;
        if let Some(p) = now.iter().position(|(w, _)| w.as_deref() != Some("agent-0")) {
            break p as u32;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(30), "agent-0 moved nothing: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = writers(&cluster).await;
    let (to, epoch) = after[moved as usize].clone();
    let to = to.expect("a writer");
    assert_eq!(epoch, before[moved as usize].1 + 1, "moved under a new epoch");
    // Counted once agent-0's copy includes the move.
    while counter(cluster.agent("agent-0"), "writer_rebalances") == 0 {
        assert!(Instant::now() < deadline + Duration::from_secs(30), "agent-0 did not count its move");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counter(cluster.agent("agent-0"), "writer_rebalances"), 1);
    // The new writer takes on from the end; agent-0 answers for the partition no more.
    let mut last = 0;
    for i in 20..25 {
        last = produce_to(cluster.agent(&to), moved, i).await;
    }
    for _ in 0..5 {
        match cluster.agent("agent-0").read(TOPIC, moved, 0, ReadLimit::new(1000, 1 << 20), false).await {
            Ok((_, _, hwm)) => {
                assert!(hwm > last, "agent-0 answered hwm {hwm}; offset {last} was acknowledged")
            }
            Err(e) => assert!(
                matches!(
                    e.code,
                    silt_agent::error::ErrorCode::NotWriter | silt_agent::error::ErrorCode::Unavailable
                ),
                "agent-0 refused a read of {TOPIC}/{moved} with {e}"
            ),
        }
    }
    if moved == 0 {
        check(&read_all(cluster.agent(&to)).await, &acked);
    }
    cluster.stop().await;
}
