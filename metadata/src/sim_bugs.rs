//! A deliberate defect, for `silt-sim --bug stale-metadata-read` to show that its checker
//! catches a metadata read that is not linearizable: [`Metadata::read`](crate::Metadata::read)
//! through a remote copy answers from the copy as it is, without asking the leader. The code
//! exists only with the `sim-bugs` feature (which only `silt-sim` enables, through
//! `silt-agent`'s), and even then the defect is off until [`enable_stale_reads`] turns it on.

#[cfg(feature = "sim-bugs")]
static STALE_READS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the defect on for the rest of the process.
#[cfg(feature = "sim-bugs")]
pub fn enable_stale_reads() {
    STALE_READS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the defect is on.
#[cfg(feature = "sim-bugs")]
pub(crate) fn stale_reads() -> bool {
    STALE_READS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the defect is on: never, in a build without the `sim-bugs` feature.
#[cfg(not(feature = "sim-bugs"))]
#[inline(always)]
pub(crate) fn stale_reads() -> bool {
    false
}
