//! An agent's life: its start (registration, the data directory's instance, the local logs
//! of deleted topics removed, retired logs opened, its tasks started), heartbeats, disk
//! gauges, and its drain and shutdown.

use super::*;

impl Agent {
    /// Starts the agent: registers with metadata, removes local data of deleted topics, opens
    /// the local logs it holds of partitions it does not write, and starts its tasks: the
    /// supervisor (whose first round starts the writers metadata gives this agent, while the
    /// API already serves), heartbeats, the ack checkpointer and the disk usage gauges.
    pub async fn start(
        config: AgentConfig,
        metadata: Metadata,
        metrics: Arc<Metrics>,
        archive: Option<Archive>,
        cancel: CancellationToken,
    ) -> Result<Agent, StoreError> {
        let cold = archive.as_ref().map(|a| Arc::clone(&a.cold));
        let archive_store = archive.map(|a| (a.store, a.prefix));
        let peers = match &config.peers {
            Some(peers) => Arc::clone(peers),
            None => Arc::new(HttpPeers::with_source_ip(&config.agent_id, config.peer_source_ip)),
        };
        let instance = instance_id(&config.data_dir)?;
        // Its copy of metadata must stay current within 7/8 of a lease to answer as a writer
        // (`Agent::lease_check`): a refresh whose answer is lost costs a fifth of it, as a
        // heartbeat's does.
        if let Metadata::Remote(remote) = &metadata {
            remote.bound_refreshes(config.lease / 5);
        }
        // Before any log is opened: bytes a killed process of this agent left in the page cache
        // only must not count as held.
        if let Err(e) = crate::log::disk::sync_at_start(&config.data_dir) {
            error!(error = %e, dir = %config.data_dir.display(), "syncing the data directory at start failed: this agent opens no log there until it restarts, and hands its partitions to other agents");
        }
        let agent = Agent {
            inner: Arc::new(Inner {
                peers,
                config,
                metadata,
                metrics,
                partitions: RwLock::new(HashMap::new()),
                writers: Mutex::new(HashMap::new()),
                retired: RwLock::new(HashMap::new()),
                replicas: Mutex::new(HashMap::new()),
                start_failures: Mutex::new(HashMap::new()),
                rebalance_proposed: Mutex::new(None),
                moving: Mutex::new(HashMap::new()),
                probed: Mutex::new(HashMap::new()),
                repairing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                repair_failures: Mutex::new(HashMap::new()),
                silent_waits: Arc::default(),
                started: Instant::now(),
                instance,
                incarnation: std::sync::atomic::AtomicU64::new(0),
                lease_until: Mutex::new(None),
                cursors: Mutex::new(HashMap::new()),
                heartbeats: Mutex::new(HashMap::new()),
                appended: Notify::new(),
                spread: AtomicU32::new(0),
                draining: cancel.child_token(),
                cancel,
                tasks: Mutex::new(Vec::new()),
                cold,
                archive_store,
            }),
        };
        // Another data directory may still hold this id (a replacement started while the old
        // process is paused): wait for its lease to lapse rather than take the id from it.
        loop {
            match agent.register().await {
                Ok(()) => break,
                Err(MetadataError::InvalidArgument(m)) if m.contains("another data directory") => {
                    warn!(reason = %m, "waiting to register");
                    tokio::select! {
                        () = agent.inner.cancel.cancelled() => return Err(StoreError::ShuttingDown),
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let (topics, next_topic_id): (Vec<Topic>, u64) =
            agent.inner.metadata.read(|s| (s.topics.values().cloned().collect(), s.next_topic_id)).await?;
        agent.remove_stale_topic_dirs(&topics, next_topic_id);
        agent.open_retired_logs(&topics).await;
        // Writers start in the supervisor's first round, while the API already serves: a
        // writer's start fences and copies from other agents that may be starting theirs now,
        // and needs them to answer.
        let checkpointer = agent.clone();
        let task = tokio::spawn(async move { checkpointer.run_checkpointer().await });
        lock(&agent.inner.tasks).push(task);
        let heartbeater = agent.clone();
        let task = tokio::spawn(async move { heartbeater.run_heartbeats().await });
        lock(&agent.inner.tasks).push(task);
        let supervisor = agent.clone();
        let task = tokio::spawn(async move { supervisor.run_supervisor().await });
        lock(&agent.inner.tasks).push(task);
        let measurer = agent.clone();
        let task = tokio::spawn(async move { measurer.run_disk_usage().await });
        lock(&agent.inner.tasks).push(task);
        Ok(agent)
    }

    /// Registers this process with metadata: a new incarnation and lease. Every partition it
    /// wrote before gets a new epoch, so nothing an earlier process of it did can interfere.
    pub(super) async fn register(&self) -> Result<(), MetadataError> {
        let config = &self.inner.config;
        // Until the copy of metadata includes this registration, and with it every partition
        // that moved while an earlier lease of this agent lapsed, it answers as no writer.
        *lock(&self.inner.lease_until) = None;
        let sent = Instant::now();
        let response = self
            .inner
            .metadata
            .write(Command::RegisterAgent {
                agent: config.agent_id.clone(),
                instance: self.inner.instance.clone(),
                addr: config.advertise_addr.clone(),
                lease_ms: config.lease.as_millis() as u64,
                now_ms: self.now_ms(),
            })
            .await?;
        let Response::Registered { incarnation } = response else {
            return Err(MetadataError::Unavailable(format!(
                "unexpected reply to a registration: {response:?}"
            )));
        };
        self.inner.incarnation.store(incarnation, Ordering::SeqCst);
        if !self.confirm_registration(sent).await {
            warn!("this agent's copy of metadata does not show its registration yet; it serves as no writer until a heartbeat confirms it");
        }
        self.inner.metrics.registrations.inc();
        info!(agent = %config.agent_id, incarnation, addr = %config.advertise_addr, "registered with metadata");
        Ok(())
    }

    /// Starts counting on the lease of the registration sent at `sent` once this agent's copy
    /// of metadata includes it (a read that refreshes the copy, given a fifth of the lease);
    /// a heartbeat that gets through later tries again. Whether the lease counts now.
    async fn confirm_registration(&self, sent: Instant) -> bool {
        let (me, incarnation) = (&self.inner.config.agent_id, self.inner.incarnation.load(Ordering::SeqCst));
        let read = self.inner.metadata.read(|s| s.agents.get(me).map(|a| a.incarnation));
        let seen = tokio::time::timeout(self.inner.config.lease / 5, read).await;
        if !matches!(seen, Ok(Ok(Some(i))) if i == incarnation) {
            return false;
        }
        let mut lease = lock(&self.inner.lease_until);
        if lease.is_none() {
            *lease = Some(sent);
        }
        drop(lease);
        self.lease_renewed(sent);
        true
    }

    /// Renews the lease every quarter of it. If metadata lets it lapse anyway (a pause, a
    /// partition from metadata), the agent registers again: the partitions it lost have other
    /// writers by then, and the supervisor stops its own.
    pub(super) async fn run_heartbeats(&self) {
        // Sent every quarter of the lease whatever the last one took, each given a fifth of
        // it: after one lost or slow heartbeat the next has 3/8 of the lease to get through
        // before the lease this agent counts on (7/8 of it from a send) runs out.
        let every = self.inner.config.lease / 4;
        let attempt = self.inner.config.lease / 5;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            // An agent whose copy of metadata is too old to answer for its partitions
            // (`Agent::lease_check`: its reads of metadata fail, its writes get through) lets
            // its lease lapse, so that metadata gives them to agents that can; it registers
            // again once its copy is current.
            if !self.copy_current() {
                outcome_of(&self.inner.metrics, "copy_stale");
                warn!("this agent's copy of metadata is too old to answer for its partitions; not renewing its lease until the copy is current");
                continue;
            }
            let cmd = Command::AgentHeartbeat {
                agent: self.inner.config.agent_id.clone(),
                incarnation: self.inner.incarnation.load(Ordering::SeqCst),
                now_ms: self.now_ms(),
            };
            let sent = Instant::now();
            let outcome = |outcome| outcome_of(&self.inner.metrics, outcome);
            match tokio::time::timeout(attempt, self.inner.metadata.write_unobserved(cmd)).await {
                Err(_) => {
                    outcome("timed_out");
                    warn!(
                        timeout_ms = attempt.as_millis() as u64,
                        "heartbeat to metadata took too long; sending another"
                    )
                }
                Ok(Ok(_)) => {
                    let unconfirmed = lock(&self.inner.lease_until).is_none();
                    if !unconfirmed {
                        self.lease_renewed(sent);
                        outcome("renewed");
                    } else if self.confirm_registration(sent).await {
                        outcome("renewed");
                    } else {
                        outcome("unconfirmed");
                    }
                }
                Ok(Err(MetadataError::LeaseLapsed { .. } | MetadataError::UnknownAgent { .. })) => {
                    outcome("lapsed");
                    warn!("this agent's lease lapsed; registering again");
                    self.supervise().await;
                    if let Err(e) = self.register().await {
                        warn!(error = %e, "registering again failed; will retry");
                    }
                }
                Ok(Err(e)) => {
                    outcome("failed");
                    warn!(error = %e, "heartbeat to metadata failed; will retry")
                }
            }
        }
    }

    /// Measures the disk space of the local logs and the space left, now and every
    /// [`DISK_USAGE_INTERVAL`], into the metrics.
    pub(super) async fn run_disk_usage(&self) {
        let mut warned = false;
        loop {
            let data_dir = self.inner.config.data_dir.clone();
            match silt_metadata::runtime::spawn_blocking(move || disk_usage(&data_dir)).await {
                Ok((used, filesystem)) => {
                    let m = &self.inner.metrics;
                    let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                    m.local_log_bytes.set(gauge(used));
                    match filesystem {
                        Ok((free, size)) => {
                            m.disk_free_bytes.set(gauge(free));
                            m.disk_size_bytes.set(gauge(size));
                        }
                        // The gauges keep their last values (0 before any): say why, once.
                        Err(e) if !warned => {
                            warned = true;
                            warn!(error = %e, "cannot read the free space of the data directory's filesystem");
                        }
                        Err(_) => {}
                    }
                }
                Err(e) => warn!(error = %e, "measuring the disk usage failed"),
            }
            tokio::select! {
                () = self.inner.cancel.cancelled() => return,
                () = tokio::time::sleep(DISK_USAGE_INTERVAL) => {}
            }
        }
    }

    /// Stops serving clients: polls that wait return now. Writers keep running until
    /// [`Agent::shutdown`].
    pub fn stop_serving(&self) {
        self.inner.draining.cancel();
    }

    /// Seals the active segment of every partition this agent writes that holds records, so
    /// that all of it can be archived before the agent stops.
    pub async fn roll_all(&self) {
        let handles: Vec<(PartitionKey, PartitionHandle)> = crate::sync::read_lock(&self.inner.partitions)
            .iter()
            .map(|(k, r)| (k.clone(), r.handle.clone()))
            .collect();
        for (PartitionKey { topic, partition }, handle) in handles {
            if let Err(e) = handle.roll().await {
                warn!(topic, partition, error = %e, "sealing the active segment before stopping failed");
            }
        }
    }

    /// Stops the writers after they drained, checkpoints acks a last time and leaves the
    /// cluster, so that metadata hands this agent's partitions over at once.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.inner.tasks));
        // Taken out of their slots, which stay: a slot is never replaced while anyone holds it.
        let slots: Vec<WriterSlot> = lock(&self.inner.writers).values().cloned().collect();
        let mut writers = Vec::new();
        for slot in slots {
            writers.extend(slot.lock().await.take());
        }
        for t in tasks.into_iter().chain(writers.into_iter().map(|w| w.task)) {
            if let Err(e) = t.await {
                error!(error = %e, "agent task panicked");
            }
        }
        self.checkpoint_acks().await;
        // A partition whose open segment only this agent holds (its writer could not close it)
        // must come back here: leaving would hand it to an agent that cannot recover it. The
        // lease lapses instead, and metadata gives it back when this agent registers again.
        let me = self.inner.config.agent_id.clone();
        let holding = self.inner.metadata.read(move |s| {
            s.topics
                .values()
                .flat_map(|t| t.partitions.iter())
                .filter_map(|p| p.open_segment())
                .any(|seg| seg.ensemble.iter().all(|a| *a == me) && !seg.ensemble.is_empty())
        });
        match holding.await {
            Ok(false) => {}
            Ok(true) => {
                warn!("an open segment only this agent holds is still open; not deregistering, the lease will lapse");
                return;
            }
            Err(e) => {
                warn!(error = %e, "cannot check this agent's open segments; not deregistering, the lease will lapse");
                return;
            }
        }
        let leave = Command::DeregisterAgent {
            agent: self.inner.config.agent_id.clone(),
            incarnation: self.inner.incarnation.load(Ordering::SeqCst),
            now_ms: self.now_ms(),
        };
        if let Err(e) = self.inner.metadata.write(leave).await {
            warn!(error = %e, "could not deregister from metadata; the lease will lapse instead");
        }
    }

    /// Removes local data of topics metadata has deleted. A directory whose topic id metadata
    /// has never handed out is kept (with a warning): metadata may have been lost, and the
    /// files may be the only copy.
    pub(super) fn remove_stale_topic_dirs(&self, topics: &[Topic], next_topic_id: u64) {
        let root = self.inner.config.data_dir.join("log");
        let Ok(entries) = std::fs::read_dir(&root) else { return };
        let live: std::collections::HashSet<String> =
            topics.iter().map(|t| format!("{}~{}", t.name, t.id)).collect();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if live.contains(&name) {
                continue;
            }
            let id = name.rsplit_once('~').and_then(|(_, id)| id.parse::<u64>().ok());
            match id {
                Some(id) if id < next_topic_id => {
                    info!(dir = %entry.path().display(), "removing local data of a deleted topic");
                    if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                        warn!(error = %e, dir = %entry.path().display(), "could not remove local data of a deleted topic");
                    }
                }
                _ => warn!(
                    dir = %entry.path().display(),
                    "local data of a topic metadata does not know; left in place, not served"
                ),
            }
        }
    }
}

/// Disk space `<data_dir>/log` and everything in it take as the filesystem allocated them
/// (as `du` counts; the zeros an open segment keeps ahead of its data included), and the bytes free for this
/// process and the size of the filesystem of `data_dir`. Files that go while the walk runs (a
/// segment dropped once archived) are skipped.
pub(super) fn disk_usage(data_dir: &std::path::Path) -> (u64, Result<(u64, u64), rustix::io::Errno>) {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &std::path::Path, total: &mut u64) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            *total += meta.blocks() * 512;
            if meta.is_dir() {
                walk(&entry.path(), total);
            }
        }
    }
    let log = data_dir.join("log");
    let mut used = std::fs::metadata(&log).map_or(0, |m| m.blocks() * 512);
    walk(&log, &mut used);
    let filesystem = rustix::fs::statvfs(data_dir)
        .map(|s| (s.f_bavail.saturating_mul(s.f_frsize), s.f_blocks.saturating_mul(s.f_frsize)));
    (used, filesystem)
}

/// The id of this agent's data directory: made once (random enough: time and process id),
/// kept in `<data_dir>/instance`. A wiped directory gets a new one.
pub(super) fn instance_id(data_dir: &std::path::Path) -> Result<String, StoreError> {
    let path = data_dir.join("instance");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io(&path, "read", e)),
    }
    std::fs::create_dir_all(data_dir).map_err(|e| StoreError::io(data_dir, "create directory", e))?;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let id = format!("{nanos:x}-{:x}", std::process::id());
    let tmp = data_dir.join("instance.tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(id.as_bytes())?;
        crate::log::disk::sync_all(&f, &tmp)?;
        std::fs::rename(&tmp, &path)?;
        crate::log::disk::sync_all(&std::fs::File::open(data_dir)?, data_dir)
    };
    write().map_err(|e| StoreError::io(&path, "write", e))?;
    Ok(id)
}

/// Counts a heartbeat's outcome.
fn outcome_of(metrics: &Metrics, outcome: &'static str) {
    metrics.heartbeats.get_or_create(&crate::metrics::HeartbeatLabels { outcome }).inc();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap")]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_what_the_files_under_the_log_directory_take() {
        let dir = tempfile::tempdir().expect("tempdir");
        let partition = dir.path().join("log").join("orders~1").join("0");
        std::fs::create_dir_all(&partition).expect("mkdir");
        std::fs::write(partition.join("00000000000000000000.log"), vec![1u8; 10_000]).expect("write");
        std::fs::write(partition.join("00000000000000000000.index"), vec![2u8; 100]).expect("write");
        // An open segment with space written ahead of its data (zeros in Silt; a pattern here,
        // which a filesystem that compresses cannot turn into a hole).
        let open = std::fs::File::create(partition.join("00000000000000000042.log")).expect("create");
        std::os::unix::fs::FileExt::write_all_at(&open, &vec![0x5au8; 64 * 1024], 0).expect("write");
        // Outside `log/`: not the logs'.
        std::fs::write(dir.path().join("instance"), vec![3u8; 200_000]).expect("write");
        let (used, filesystem) = disk_usage(dir.path());
        assert!(used >= 10_000 + 100 + 64 * 1024, "{used}");
        assert!(used < 200_000, "{used}: counted a file outside log/");
        let (free, size) = filesystem.expect("statvfs");
        assert!(free > 0 && free <= size, "free {free} of {size}");
        // No log directory yet (an agent before its first partition): nothing used.
        assert_eq!(disk_usage(&dir.path().join("elsewhere")).0, 0);
    }
}
