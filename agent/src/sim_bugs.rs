//! Deliberate defects, for `silt-sim --bug NAME` to show that its checker catches what it
//! claims to. Each is a one-line departure from the protocol at the place it names. The code
//! exists only with the `sim-bugs` feature (which only `silt-sim` enables), and even then a
//! defect is off until [`enable`] turns it on; without the feature [`on`] is a constant
//! `false` the compiler removes with the branch it guards.

/// A defect the simulator can turn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The writer acknowledges a group once its own fsync is done, whatever the followers
    /// answered.
    AckBeforeQuorum,
    /// A follower asked by a recovering writer what it holds answers without raising its
    /// fence: the former writer's appends still reach it.
    SkipFence,
    /// A follower takes a writer's appends (and cuts its log back to them) without checking
    /// that the writer's epoch is at least its fence: a deposed writer still writes there.
    TrimWithoutEpochCheck,
    /// A writer recovering the segment its predecessor left open (after that one crashed or
    /// was cut off) seals it where its own replica ends, not at the longest tail a quorum
    /// holds, and counts the next offsets from there: offsets acknowledged before are given
    /// out again.
    ReuseOffsetAfterCrash,
    /// The writer makes a group visible to readers once its own fsync is done, before the
    /// followers' (past the high watermark), and leaves it visible when replication fails.
    ServePastWatermark,
    /// A consumer group's checkpoint counts the messages in flight as acknowledged: one a
    /// member took and never acknowledged is done with for the group once the checkpoint is
    /// written (caught with `--groups`).
    CheckpointInFlight,
    /// A linearizable read of metadata through an agent's copy answers from the copy as it
    /// is, without asking the leader: a write another agent made before the read started may
    /// be missing (caught with `--metadata-nodes 3`, by the check of the register).
    StaleMetadataRead,
    /// A metadata node's Raft log acknowledges appends of commands (not of membership
    /// changes), and records how far it is committed, without fsyncing either: a power loss
    /// of metadata nodes takes back entries a quorum counted as held (caught with
    /// `--metadata-nodes 3`, whose faults include such power losses).
    RaftAckBeforeFsync,
}

impl Bug {
    /// Every defect, with the name `--bug` takes.
    pub const ALL: [(Bug, &'static str); 8] = [
        (Bug::AckBeforeQuorum, "ack-before-quorum"),
        (Bug::SkipFence, "skip-fence"),
        (Bug::TrimWithoutEpochCheck, "trim-without-epoch-check"),
        (Bug::ReuseOffsetAfterCrash, "reuse-offset-after-crash"),
        (Bug::ServePastWatermark, "serve-past-watermark"),
        (Bug::CheckpointInFlight, "checkpoint-in-flight"),
        (Bug::StaleMetadataRead, "stale-metadata-read"),
        (Bug::RaftAckBeforeFsync, "raft-ack-before-fsync"),
    ];

    /// The defect `--bug` names `name`.
    pub fn named(name: &str) -> Option<Bug> {
        Bug::ALL.iter().find(|(_, n)| *n == name).map(|(b, _)| *b)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

#[cfg(feature = "sim-bugs")]
static ON: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Turns `bug` on for the rest of the process.
#[cfg(feature = "sim-bugs")]
pub fn enable(bug: Bug) {
    match bug {
        Bug::StaleMetadataRead => silt_metadata::sim_bugs::enable_stale_reads(),
        Bug::RaftAckBeforeFsync => silt_metadata::sim_bugs::enable_unsynced_log(),
        _ => {}
    }
    ON.fetch_or(bug.bit(), std::sync::atomic::Ordering::SeqCst);
}

/// Whether `bug` is on.
#[cfg(feature = "sim-bugs")]
pub(crate) fn on(bug: Bug) -> bool {
    ON.load(std::sync::atomic::Ordering::Relaxed) & bug.bit() != 0
}

/// Whether `bug` is on: never, in a build without the `sim-bugs` feature.
#[cfg(not(feature = "sim-bugs"))]
#[inline(always)]
pub(crate) fn on(bug: Bug) -> bool {
    let _ = bug.bit();
    false
}
