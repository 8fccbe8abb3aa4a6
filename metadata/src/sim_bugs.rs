//! Deliberate defects of the metadata service, for `silt-sim --bug NAME` to show that its
//! checker catches them: `stale-metadata-read` ([`Metadata::read`](crate::Metadata::read)
//! through a remote copy answers from the copy as it is, without asking the leader) and
//! `raft-ack-before-fsync` (the Raft log acknowledges appends of commands, not of membership
//! changes, and records how far it is committed, without fsyncing either: a power loss takes
//! back entries a quorum counted as held, and the node starts again as if they had never
//! been there). The code exists only with the `sim-bugs` feature (which only `silt-sim`
//! enables, through `silt-agent`'s), and even then a defect is off until it is turned on.

#[cfg(feature = "sim-bugs")]
static STALE_READS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
#[cfg(feature = "sim-bugs")]
static UNSYNCED_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns `stale-metadata-read` on for the rest of the process.
#[cfg(feature = "sim-bugs")]
pub fn enable_stale_reads() {
    STALE_READS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Turns `raft-ack-before-fsync` on for the rest of the process.
#[cfg(feature = "sim-bugs")]
pub fn enable_unsynced_log() {
    UNSYNCED_LOG.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether `stale-metadata-read` is on.
#[cfg(feature = "sim-bugs")]
pub(crate) fn stale_reads() -> bool {
    STALE_READS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `raft-ack-before-fsync` is on.
#[cfg(feature = "sim-bugs")]
pub(crate) fn unsynced_log() -> bool {
    UNSYNCED_LOG.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `stale-metadata-read` is on: never, in a build without the `sim-bugs` feature.
#[cfg(not(feature = "sim-bugs"))]
#[inline(always)]
pub(crate) fn stale_reads() -> bool {
    false
}

/// Whether `raft-ack-before-fsync` is on: never, in a build without the `sim-bugs` feature.
#[cfg(not(feature = "sim-bugs"))]
#[inline(always)]
pub(crate) fn unsynced_log() -> bool {
    false
}
