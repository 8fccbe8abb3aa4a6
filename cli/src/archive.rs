//! `silt archive rebuild-metadata`: disaster recovery of the offset map from the bucket alone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use serde::Serialize;
use silt_metadata::{Command, MetadataNode};
use silt_tiering::archive_format::read_archive_meta;
use silt_tiering::object_layout::parse_object_key;
use silt_tiering::store_url::object_store_from_url;

use crate::data_dir::{default_object_store_url, lock_data_dir};

/// What a rebuild found and did.
#[derive(Debug, Serialize)]
pub struct RebuildReport {
    /// The archive read.
    pub object_store: String,
    /// Objects restored into metadata.
    pub restored: usize,
    /// Topics that now exist.
    pub topics: Vec<String>,
    /// Objects that could not be used, and why.
    pub skipped: Vec<(String, String)>,
    /// Where local hot data that metadata no longer describes was moved.
    pub moved_local_data: Option<PathBuf>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Lists the archive, reads every object's footer and records each as an archived segment.
pub async fn rebuild_metadata(data_dir: &Path, url: Option<&str>) -> Result<RebuildReport> {
    let _lock = lock_data_dir(data_dir)?;
    let url = match url {
        Some(u) => u.to_string(),
        None => default_object_store_url(data_dir)?,
    };
    let archive = object_store_from_url(&url).with_context(|| format!("cannot open the archive at {url}"))?;
    let metadata = MetadataNode::open(&data_dir.join("metadata"), 1, "rebuild-metadata".into())
        .await
        .context("cannot open the metadata directory")?;
    // Listing is fine here: this is a recovery tool, not the hot path.
    let listing: Vec<object_store::ObjectMeta> = archive
        .store
        .list(Some(&archive.prefix))
        .try_collect()
        .await
        .with_context(|| format!("cannot list {url}"))?;
    let mut objects: Vec<_> =
        listing.into_iter().filter_map(|o| parse_object_key(&o.location).map(|name| (name, o))).collect();
    objects.sort_by(|(a, _), (b, _)| {
        (&a.topic, a.partition, a.base_offset).cmp(&(&b.topic, b.partition, b.base_offset))
    });
    let mut restored = 0;
    let mut skipped = Vec::new();
    for (name, object) in objects {
        let key = object.location.to_string();
        let meta = match read_archive_meta(archive.store.as_ref(), &object.location, Some(object.size)).await
        {
            Ok((meta, _)) => meta,
            Err(e) => {
                skipped.push((key, e.to_string()));
                continue;
            }
        };
        if (meta.topic.as_str(), meta.partition, meta.base_offset, meta.last_offset)
            != (name.topic.as_str(), name.partition, name.base_offset, name.last_offset)
        {
            skipped.push((key, format!("the footer ({meta:?}) does not match the object's name")));
            continue;
        }
        let cmd = Command::RestoreArchivedSegment {
            topic: meta.topic.clone(),
            partitions: meta.partitions,
            partition: meta.partition,
            base_offset: meta.base_offset,
            last_offset: meta.last_offset,
            record_count: meta.record_count,
            min_timestamp_ms: Some(meta.min_timestamp_ms),
            max_timestamp_ms: Some(meta.max_timestamp_ms),
            object_key: key.clone(),
            object_bytes: object.size,
            now_ms: now_ms(),
        };
        match metadata.write(cmd).await {
            Ok(_) => restored += 1,
            Err(e) => skipped.push((key, e.to_string())),
        }
    }
    let topics = metadata.read(|s| s.topics.keys().cloned().collect()).await?;
    metadata.shutdown().await;
    // Local segment files are named by topic ids the old metadata handed out; the new metadata
    // knows none of them. Keep them for inspection, out of the agent's way.
    let local = data_dir.join("agent").join("log");
    let moved_local_data = if local.exists() {
        let aside = data_dir.join("agent").join(format!("log.before-rebuild-{}", now_ms()));
        std::fs::rename(&local, &aside).with_context(|| format!("cannot move {} aside", local.display()))?;
        Some(aside)
    } else {
        None
    };
    Ok(RebuildReport { object_store: url, restored, topics, skipped, moved_local_data })
}
