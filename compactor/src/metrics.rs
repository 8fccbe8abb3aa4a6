//! The compactor's Prometheus metrics, named `silt_compactor_<what>_<unit>`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Every metric the compactor exports.
#[derive(Debug)]
pub struct CompactorMetrics {
    registry: Registry,
    /// Segments archived.
    pub segments_archived: Counter,
    /// Records archived.
    pub records_archived: Counter,
    /// Bytes of the sealed segments archived (record batches on the agents' disks).
    pub raw_bytes_archived: Counter,
    /// Bytes of the Parquet objects written.
    pub object_bytes_archived: Counter,
    /// Archive attempts that failed (and will be retried).
    pub archive_failures: Counter,
    /// Age of the oldest sealed segment not yet archived.
    pub archive_lag_seconds: Gauge,
    /// Sealed segments waiting to be archived.
    pub segments_pending: Gauge,
    /// Archived segments deleted by retention.
    pub segments_expired: Counter,
}

impl Default for CompactorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CompactorMetrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("silt_compactor");
        let m = CompactorMetrics {
            registry: Registry::default(),
            segments_archived: Counter::default(),
            records_archived: Counter::default(),
            raw_bytes_archived: Counter::default(),
            object_bytes_archived: Counter::default(),
            archive_failures: Counter::default(),
            archive_lag_seconds: Gauge::default(),
            segments_pending: Gauge::default(),
            segments_expired: Counter::default(),
        };
        registry.register(
            "segments_archived",
            "Sealed segments archived to the bucket",
            m.segments_archived.clone(),
        );
        registry.register("records_archived", "Records archived to the bucket", m.records_archived.clone());
        registry.register(
            "raw_bytes_archived",
            "Bytes of sealed segments archived (record batches)",
            m.raw_bytes_archived.clone(),
        );
        registry.register(
            "object_bytes_archived",
            "Bytes of Parquet objects written",
            m.object_bytes_archived.clone(),
        );
        registry.register(
            "archive_failures",
            "Archive attempts that failed and will be retried",
            m.archive_failures.clone(),
        );
        registry.register(
            "archive_lag_seconds",
            "Age of the oldest sealed segment not yet archived",
            m.archive_lag_seconds.clone(),
        );
        registry.register(
            "segments_pending",
            "Sealed segments waiting to be archived",
            m.segments_pending.clone(),
        );
        registry.register(
            "segments_expired",
            "Archived segments deleted by retention.ms",
            m.segments_expired.clone(),
        );
        CompactorMetrics { registry, ..m }
    }

    /// The metrics in Prometheus text format (without the `# EOF` trailer).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
