//! [`StateMachineStore`]: the applied [`MetadataState`] with its snapshots, implementing
//! openraft's [`RaftStateMachine`] and [`RaftSnapshotBuilder`].
//!
//! `apply` changes memory only. Durability comes from the Raft log plus snapshots: the latest
//! snapshot is kept in the file `snapshot` of the store's directory, written atomically (write
//! `snapshot.tmp`, fsync, rename, fsync the directory), as two length + CRC-32C frames: the JSON
//! of the [`SnapshotMeta`], then the JSON of the [`MetadataState`]. [`StateMachineStore::open`]
//! starts from that snapshot and openraft re-applies the committed log entries after it.
//!
//! Readers run closures over the current state with [`StateMachineStore::read`] and wait for
//! changes with [`StateMachineStore::subscribe`].

use std::collections::VecDeque;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{AnyError, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use tokio::sync::watch;

use crate::raft::atomic_file::{self, read_frames, write_atomically};
use crate::raft::frame;
use crate::raft::types::{
    Entry, EntryPayload, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::state::{Command, MetadataState, Response};

const SNAPSHOT_FILE: &str = "snapshot";
/// Most applied log entries kept in memory for [`StateMachineStore::changes_after`]: copies of
/// the state that far behind catch up by replaying commands instead of fetching it whole.
pub const RECENT_ENTRIES_MAX: usize = 4096;
/// Largest snapshot file section accepted when reading one back (4 GiB - 1, the frame limit).
const SNAPSHOT_BYTES_MAX: usize = u32::MAX as usize;

/// The replicated state machine of one metadata node. Cloning is cheap and shares the state.
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    applied: RwLock<Applied>,
    /// The latest durable snapshot. Its lock also orders snapshot file writes.
    snapshot: Mutex<Option<StoredSnapshot>>,
    changes: watch::Sender<Option<LogId>>,
    /// Makes snapshot ids unique within this process; seeded with the clock across restarts.
    snapshot_seq: AtomicU64,
}

/// The state and how far it reaches in the log.
struct Applied {
    state: MetadataState,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    /// The latest applied entries by log index, without gaps: the command of a normal entry,
    /// `None` for the others (blank, membership). Emptied when a snapshot is installed.
    recent: VecDeque<(u64, Option<Command>)>,
}

/// What changed in the state after a log index (see [`StateMachineStore::changes_after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Nothing was applied after it.
    Unchanged,
    /// The commands applied after it, with their log indexes, in order.
    Commands(Vec<(u64, Command)>),
    /// The entries after it are no longer kept: the whole state.
    State(MetadataState),
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

impl StateMachineStore {
    /// Opens the store in `dir`, creating it if needed, and loads the latest snapshot. A damaged
    /// snapshot is an `InvalidData` error naming the file. Blocks on file I/O.
    pub fn open(dir: &Path) -> io::Result<StateMachineStore> {
        atomic_file::create_dir_all_durably(dir)?;
        atomic_file::remove_tmp_files(dir)?;
        let snapshot = read_snapshot(dir)?;
        let applied = match &snapshot {
            Some(s) => Applied {
                state: decode_state(&s.data).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} holds no metadata state: {e}", dir.join(SNAPSHOT_FILE).display()),
                    )
                })?,
                last_applied: s.meta.last_log_id,
                last_membership: s.meta.last_membership.clone(),
                recent: VecDeque::new(),
            },
            None => Applied {
                state: MetadataState::default(),
                last_applied: None,
                last_membership: StoredMembership::default(),
                recent: VecDeque::new(),
            },
        };
        tracing::info!(
            dir = %dir.display(),
            snapshot = ?snapshot.as_ref().map(|s| &s.meta.snapshot_id),
            last_applied = ?applied.last_applied,
            "opened the metadata state machine"
        );
        let clock_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let (changes, _) = watch::channel(applied.last_applied);
        Ok(StateMachineStore {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                applied: RwLock::new(applied),
                snapshot: Mutex::new(snapshot),
                changes,
                snapshot_seq: AtomicU64::new(clock_ms),
            }),
        })
    }

    /// Runs `f` over the current state, as of the last applied entry.
    pub fn read<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> T {
        f(&self.applied().state)
    }

    /// Runs `f` over the current state and returns it with the last applied entry's id, read
    /// together: the state is exactly the one at that index (a copy that later applies the
    /// commands after it must not apply any twice).
    pub fn read_at<T>(&self, f: impl FnOnce(&MetadataState) -> T) -> (Option<LogId>, T) {
        let applied = self.applied();
        (applied.last_applied, f(&applied.state))
    }

    /// What was applied after log index `after`, and the index that reaches, read together:
    /// the commands if every entry since is still kept (a copy of the state at `after` that
    /// applies them in order equals this one), else the whole state.
    pub fn changes_after(&self, after: u64) -> (Option<u64>, Changes) {
        let applied = self.applied();
        let last = applied.last_applied.map(|l| l.index);
        if last.is_none_or(|l| l <= after) {
            return (last, Changes::Unchanged);
        }
        let kept = applied.recent.front().is_some_and(|(first, _)| *first <= after + 1)
            && applied.recent.back().map(|(i, _)| *i) == last;
        if !kept {
            return (last, Changes::State(applied.state.clone()));
        }
        let commands = applied
            .recent
            .iter()
            .filter(|(i, _)| *i > after)
            .filter_map(|(i, c)| c.clone().map(|c| (*i, c)))
            .collect();
        (last, Changes::Commands(commands))
    }

    /// The id of the last applied log entry.
    pub fn last_applied(&self) -> Option<LogId> {
        self.applied().last_applied
    }

    /// A channel that holds the last applied log id and changes on every apply or snapshot
    /// install. Wait with `changed()`, then [`read`](Self::read).
    pub fn subscribe(&self) -> watch::Receiver<Option<LogId>> {
        self.inner.changes.subscribe()
    }

    fn applied(&self) -> std::sync::RwLockReadGuard<'_, Applied> {
        // Readers cannot change the state, so a lock poisoned by a panicking reader guards a
        // consistent state. A panic inside `apply` stops the Raft node (openraft reports it as
        // fatal), after which local reads see the state as the panic left it.
        self.inner.applied.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn applied_mut(&self) -> std::sync::RwLockWriteGuard<'_, Applied> {
        self.inner.applied.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `snapshot` to disk unless a newer one is there, then makes it current.
    async fn persist_snapshot(&self, snapshot: StoredSnapshot) -> Result<(), StorageError> {
        let inner = Arc::clone(&self.inner);
        let signature = snapshot.meta.signature();
        crate::runtime::spawn_blocking(move || -> io::Result<()> {
            let mut current = inner.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|c| c.meta.last_log_id > snapshot.meta.last_log_id) {
                return Ok(());
            }
            let mut bytes = Vec::with_capacity(snapshot.data.len() + 1024);
            frame::encode_into(&mut bytes, &serde_json::to_vec(&snapshot.meta)?)?;
            frame::encode_into(&mut bytes, &snapshot.data)?;
            write_atomically(&inner.dir, SNAPSHOT_FILE, &bytes)?;
            *current = Some(snapshot);
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(signature.clone()), AnyError::error(e)))?
        .map_err(|e| StorageIOError::write_snapshot(Some(signature), &e))?;
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (state, last_applied, last_membership) = {
            let applied = self.applied();
            (applied.state.clone(), applied.last_applied, applied.last_membership.clone())
        };
        let data = crate::runtime::spawn_blocking(move || serde_json::to_vec(&state))
            .await
            .map_err(|e| StorageIOError::read_state_machine(AnyError::error(e)))?
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let seq = self.inner.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match last_applied {
            Some(id) => format!("{}-{}-{}-{seq}", id.leader_id.term, id.leader_id.node_id, id.index),
            None => format!("none-{seq}"),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership, snapshot_id };
        self.persist_snapshot(StoredSnapshot { meta: meta.clone(), data: data.clone() }).await?;
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "built a metadata snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.applied();
        Ok((applied.last_applied, applied.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        let last_applied = {
            let mut applied = self.applied_mut();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let (response, command) = match entry.payload {
                    EntryPayload::Blank => (Response::Ok, None),
                    EntryPayload::Normal(command) => (applied.state.apply(&command), Some(command)),
                    EntryPayload::Membership(membership) => {
                        applied.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                        (Response::Ok, None)
                    }
                };
                // A gap (the first entries after a restart follow the snapshot, not what was
                // kept) starts the record afresh.
                if applied.recent.back().is_some_and(|(i, _)| *i + 1 != entry.log_id.index) {
                    applied.recent.clear();
                }
                applied.recent.push_back((entry.log_id.index, command));
                if applied.recent.len() > RECENT_ENTRIES_MAX {
                    applied.recent.pop_front();
                }
                responses.push(response);
            }
            applied.last_applied
        };
        self.inner.changes.send_replace(last_applied);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let state =
            decode_state(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        self.persist_snapshot(StoredSnapshot { meta: meta.clone(), data }).await?;
        {
            let mut applied = self.applied_mut();
            applied.state = state;
            applied.last_applied = meta.last_log_id;
            applied.last_membership = meta.last_membership.clone();
            applied.recent.clear();
        }
        self.inner.changes.send_replace(meta.last_log_id);
        tracing::info!(snapshot = %meta.snapshot_id, "installed a metadata snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self.inner.snapshot.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Ok(current.map(|s| Snapshot { meta: s.meta, snapshot: Box::new(Cursor::new(s.data)) }))
    }
}

fn decode_state(data: &[u8]) -> Result<MetadataState, serde_json::Error> {
    serde_json::from_slice(data)
}

/// Reads the snapshot file of `dir`, if there is one.
fn read_snapshot(dir: &Path) -> io::Result<Option<StoredSnapshot>> {
    let Some(frames) = read_frames(dir, SNAPSHOT_FILE, SNAPSHOT_BYTES_MAX)? else {
        return Ok(None);
    };
    let path = dir.join(SNAPSHOT_FILE);
    let invalid = |reason: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot {} is damaged: {reason}; refusing to start", path.display()),
        )
    };
    let [meta, data] = <[Vec<u8>; 2]>::try_from(frames)
        .map_err(|frames| invalid(format!("expected 2 sections, found {}", frames.len())))?;
    let meta: SnapshotMeta = serde_json::from_slice(&meta).map_err(|e| invalid(e.to_string()))?;
    Ok(Some(StoredSnapshot { meta, data }))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{CommittedLeaderId, Membership};

    use super::*;
    use crate::raft::types::BasicNode;
    use crate::state::Command;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn create_topic(index: u64, name: &str) -> Entry {
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Command::CreateTopic {
                name: name.to_string(),
                partitions: 2,
                config: BTreeMap::new(),
                now_ms: 7,
            }),
        }
    }

    fn membership(index: u64) -> Entry {
        let nodes = BTreeMap::from([(1, BasicNode::new("127.0.0.1:1"))]);
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1])], nodes)),
        }
    }

    /// A copy of the state at some index catches up by applying the commands after it, until
    /// the store no longer keeps them all.
    #[tokio::test]
    async fn changes_after_an_index_rebuild_the_state_from_a_copy_at_that_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(sm.changes_after(0), (None, Changes::Unchanged));
        sm.apply([membership(1), create_topic(2, "a")]).await.unwrap();
        let copy_at_2 = sm.read(|s| s.clone());
        assert_eq!(sm.changes_after(2), (Some(2), Changes::Unchanged));
        let blank = |index| Entry { log_id: log_id(index), payload: EntryPayload::Blank };
        sm.apply([create_topic(3, "b"), blank(4), create_topic(5, "a"), create_topic(6, "c")]).await.unwrap();
        let (index, changes) = sm.changes_after(2);
        assert_eq!(index, Some(6));
        let Changes::Commands(commands) = changes else { panic!("{changes:?}") };
        assert_eq!(commands.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![3, 5, 6], "commands only");
        let mut copy = copy_at_2;
        for (_, c) in &commands {
            copy.apply(c);
        }
        assert_eq!(copy, sm.read(|s| s.clone()), "the refused duplicate is refused on the copy too");

        // Once the entries after an index are no longer all kept: the whole state.
        let many: Vec<Entry> = (7..7 + RECENT_ENTRIES_MAX as u64).map(blank).collect();
        sm.apply(many).await.unwrap();
        let last = 6 + RECENT_ENTRIES_MAX as u64;
        assert!(
            matches!(sm.changes_after(6), (Some(l), Changes::Commands(ref c)) if l == last && c.is_empty())
        );
        assert_eq!(sm.changes_after(5), (Some(last), Changes::State(sm.read(|s| s.clone()))));
        // Nor after a restart (the log is applied again from the snapshot on).
        drop(sm);
        let sm = StateMachineStore::open(dir.path()).unwrap();
        assert!(matches!(sm.changes_after(0), (None, Changes::Unchanged)), "nothing applied yet");
    }

    #[tokio::test]
    async fn applies_commands_and_restores_from_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        let mut changes = sm.subscribe();
        let responses = sm.apply([membership(0), create_topic(1, "a"), create_topic(2, "a")]).await.unwrap();
        assert_eq!(responses[0], Response::Ok);
        assert!(matches!(responses[1], Response::Topic { .. }));
        assert!(matches!(responses[2], Response::Error { .. }), "duplicate topic is refused");
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), Some(log_id(2)));
        assert_eq!(sm.read(|s| s.topics.len()), 1);

        let state_at_snapshot = sm.read(|s| s.clone());
        let membership_at_snapshot = sm.applied_state().await.unwrap().1;
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(2)));
        sm.apply([create_topic(3, "b")]).await.unwrap();
        drop(sm);

        // Memory is lost; the snapshot is what survives. openraft re-applies the log after it.
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(sm.read(|s| s.clone()), state_at_snapshot);
        assert_eq!(sm.applied_state().await.unwrap(), (Some(log_id(2)), membership_at_snapshot));
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snapshot.meta);
    }

    #[tokio::test]
    async fn installed_snapshot_is_durable() {
        let leader_dir = tempfile::tempdir().unwrap();
        let mut leader = StateMachineStore::open(leader_dir.path()).unwrap();
        leader.apply([membership(0), create_topic(1, "x")]).await.unwrap();
        let snapshot = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();

        let dir = tempfile::tempdir().unwrap();
        let mut follower = StateMachineStore::open(dir.path()).unwrap();
        follower.apply([create_topic(0, "stale")]).await.unwrap();
        follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        assert_eq!(follower.read(|s| s.topics.keys().cloned().collect::<Vec<_>>()), ["x"]);
        drop(follower);
        let mut follower = StateMachineStore::open(dir.path()).unwrap();
        assert_eq!(follower.read(|s| s.clone()), leader.read(|s| s.clone()));
        assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(1)));
    }

    #[tokio::test]
    async fn damaged_snapshot_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        sm.apply([create_topic(0, "a")]).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        drop(sm);
        let path = dir.path().join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x04;
        std::fs::write(&path, &bytes).unwrap();
        let message = StateMachineStore::open(dir.path()).err().expect("open must fail").to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
    }
}
