//! How much one read (a replay page, a poll's part of a partition, a read of the archive) may
//! return: the one rule every reader follows.

use crate::Record;

/// How much one read (a replay page, or one partition's part of a poll) may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimit {
    /// Most records.
    pub records: usize,
    /// Most bytes of keys, values and headers.
    pub bytes: usize,
    /// The first record is returned whatever its size, so that a message larger than `bytes`
    /// is delivered alone rather than never. Off for the later partitions of a poll that has
    /// messages already.
    pub at_least_one: bool,
}

impl ReadLimit {
    /// At most `records` records and `bytes` bytes, and always the first record.
    pub fn new(records: usize, bytes: usize) -> Self {
        Self { records, bytes, at_least_one: true }
    }

    /// Whether a read that holds `taken` records of `used` bytes has room for `record`.
    pub fn admits(&self, taken: usize, used: usize, record: &Record) -> bool {
        taken < self.records
            && ((taken == 0 && self.at_least_one) || used.saturating_add(record.data_len()) <= self.bytes)
    }

    /// Whether nothing more may be read.
    pub fn is_spent(&self) -> bool {
        self.records == 0 || (self.bytes == 0 && !self.at_least_one)
    }

    /// What is left of this limit once `taken` records of `used` bytes are read.
    pub fn rest(&self, taken: usize, used: usize) -> Self {
        Self {
            records: self.records.saturating_sub(taken),
            bytes: self.bytes.saturating_sub(used),
            at_least_one: self.at_least_one && taken == 0,
        }
    }
}
