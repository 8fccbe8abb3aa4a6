//! Where the compactor reads a sealed segment from.

use silt_record::Record;

/// A replica of sealed segments. In `silt dev` this is the agent in the same process; in a
/// cluster it is any agent of the segment's ensemble.
#[async_trait::async_trait]
pub trait SegmentSource: Send + Sync {
    /// Every record of the sealed segment `base_offset..=last_offset`, in offset order.
    async fn read_segment(
        &self,
        topic: &str,
        partition: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<Vec<Record>, String>;
}
