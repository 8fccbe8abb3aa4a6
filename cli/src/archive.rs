//! `silt archive rebuild-metadata`: disaster recovery of topics and the offset map from the
//! bucket alone.
//!
//! Order: read the bucket's topic descriptions and every object's footer, then look at the
//! agents' local logs, and refuse (changing nothing) while they hold data past the archive,
//! unless told to discard it. Then restore the topics with their ids and configs, their
//! archived segments, and where each partition's log ended, so that no offset a producer may
//! have been given is handed out again. Local logs go aside last.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use futures::TryStreamExt;
use serde::Serialize;
use silt_agent::log::partition_log::segment_ranges_held;
use silt_metadata::clock::{Clock, SystemClock};
use silt_metadata::{Command, MetadataNode, TopicConfig};
use silt_tiering::archive_format::{read_archive_meta, ArchiveMeta};
use silt_tiering::object_layout::parse_object_key;
use silt_tiering::store_url::object_store_from_url;
use silt_tiering::topic_descriptor::read_descriptors;

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
    /// Topics restored without a description in the bucket (archived by a Silt that wrote
    /// none): they have default configs but `retention.ms=-1`.
    pub undescribed_topics: Vec<String>,
    /// Objects and descriptions that could not be used, and why.
    pub skipped: Vec<(String, String)>,
    /// Local data past the archive that was discarded (`--discard-unarchived`).
    pub discarded_unarchived: Vec<String>,
    /// Where the local logs that metadata no longer describes were moved.
    pub moved_local_data: Vec<PathBuf>,
}

/// A partition's log in an agent's data directory.
#[derive(Debug)]
struct LocalPartition {
    dir: PathBuf,
    topic: String,
    topic_id: u64,
    partition: u32,
    /// The offsets each segment file holds, `(base, end)`, end exclusive.
    ranges: Vec<(u64, u64)>,
    /// Where the local log ends: the last file's end (its base when it holds nothing).
    end: u64,
}

/// The parts of `[base, end)` that no range of `covered` (`(base, end)`, sorted, end
/// exclusive) holds.
fn uncovered(base: u64, end: u64, covered: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut next = base;
    for &(b, e) in covered {
        if e <= next {
            continue;
        }
        if b >= end {
            break;
        }
        if b > next {
            out.push((next, b));
        }
        next = next.max(e);
        if next >= end {
            break;
        }
    }
    if next < end {
        out.push((next, end));
    }
    out
}

/// The local log directories of `silt dev`'s agents: `<data-dir>/agent/log` and
/// `<data-dir>/agents/<id>/agent/log`.
fn local_log_dirs(data_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = vec![data_dir.join("agent").join("log")];
    let agents = data_dir.join("agents");
    if agents.is_dir() {
        for entry in
            std::fs::read_dir(&agents).with_context(|| format!("cannot list {}", agents.display()))?
        {
            dirs.push(entry?.path().join("agent").join("log"));
        }
    }
    dirs.retain(|d| d.is_dir());
    Ok(dirs)
}

/// Every partition log under the local log directories, `<log>/<topic>~<id>/<partition>/`,
/// with where it ends.
fn local_partitions(log_dirs: &[PathBuf]) -> Result<Vec<LocalPartition>> {
    let mut out = Vec::new();
    for log in log_dirs {
        for topic_entry in std::fs::read_dir(log).with_context(|| format!("cannot list {}", log.display()))? {
            let topic_entry = topic_entry?;
            let name = topic_entry.file_name().to_string_lossy().to_string();
            let Some((topic, id)) =
                name.rsplit_once('~').and_then(|(t, id)| Some((t, id.parse::<u64>().ok()?)))
            else {
                continue;
            };
            if !topic_entry.path().is_dir() {
                continue;
            }
            for partition_entry in std::fs::read_dir(topic_entry.path())? {
                let partition_entry = partition_entry?;
                let Ok(partition) = partition_entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let dir = partition_entry.path();
                let ranges = segment_ranges_held(&dir)
                    .with_context(|| format!("cannot read the log in {}", dir.display()))?;
                if let Some(&(_, end)) = ranges.last() {
                    out.push(LocalPartition {
                        dir,
                        topic: topic.to_string(),
                        topic_id: id,
                        partition,
                        ranges,
                        end,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Rebuilds metadata in `<data_dir>/metadata` from the archive at `url` (default: the one of
/// `silt dev` in `data_dir`). See the module docs for the order.
pub async fn rebuild_metadata(
    data_dir: &Path,
    url: Option<&str>,
    discard_unarchived: bool,
) -> Result<RebuildReport> {
    let _lock = lock_data_dir(data_dir)?;
    let url = match url {
        Some(u) => u.to_string(),
        None => default_object_store_url(data_dir)?,
    };
    let archive = object_store_from_url(&url).with_context(|| format!("cannot open the archive at {url}"))?;
    let store = archive.store.as_ref();
    let described = read_descriptors(store, &archive.prefix)
        .await
        .with_context(|| format!("cannot read the topic descriptions in {url}"))?;
    let mut skipped = described.skipped.clone();

    // Listing is fine here: this is a recovery tool, not the hot path.
    let listing: Vec<object_store::ObjectMeta> = store
        .list(Some(&archive.prefix))
        .try_collect()
        .await
        .with_context(|| format!("cannot list {url}"))?;
    let mut objects: Vec<_> =
        listing.into_iter().filter_map(|o| parse_object_key(&o.location).map(|name| (name, o))).collect();
    objects.sort_by(|(a, _), (b, _)| {
        (&a.topic, a.partition, a.base_offset).cmp(&(&b.topic, b.partition, b.base_offset))
    });
    let mut footers: Vec<(ArchiveMeta, object_store::ObjectMeta)> = Vec::new();
    let max_object_id = objects.iter().filter_map(|(name, _)| name.topic_id).max();
    // Of a topic the bucket does not describe, the newest incarnation its keys name.
    let mut undescribed_ids: BTreeMap<String, u64> = BTreeMap::new();
    for (name, _) in &objects {
        let id = name.topic_id.filter(|id| !described.deleted.contains(&(name.topic.clone(), *id)));
        if let (false, Some(id)) = (described.live.contains_key(&name.topic), id) {
            let newest = undescribed_ids.entry(name.topic.clone()).or_default();
            *newest = (*newest).max(id);
        }
    }
    for (name, object) in objects {
        let key = object.location.to_string();
        let live_id =
            described.live.get(&name.topic).map(|d| d.id).or(undescribed_ids.get(&name.topic).copied());
        let deleted = match name.topic_id {
            Some(id) => {
                described.deleted.contains(&(name.topic.clone(), id)) || live_id.is_some_and(|l| l != id)
            }
            None => described.only_deleted(&name.topic),
        };
        if deleted {
            skipped.push((key, format!("an object of topic '{}' that was deleted", name.topic)));
            continue;
        }
        let meta = match read_archive_meta(store, &object.location, Some(object.size)).await {
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
        footers.push((meta, object));
    }
    // What the archive holds of each partition, `(base, end)` sorted.
    let mut archived: BTreeMap<(String, u32), Vec<(u64, u64)>> = BTreeMap::new();
    for (meta, _) in &footers {
        let ranges = archived.entry((meta.topic.clone(), meta.partition)).or_default();
        ranges.push((meta.base_offset, meta.last_offset + 1));
    }
    for ranges in archived.values_mut() {
        ranges.sort_unstable();
    }

    // Local data of a live topic that the archive does not hold may have been acknowledged.
    // Every local segment file counts, not only the last: the compactor archives segments in
    // parallel, so an older one may not be archived while a newer one is.
    let log_dirs = local_log_dirs(data_dir)?;
    let local = local_partitions(&log_dirs)?;
    let is_live = |l: &LocalPartition| {
        let live_id = described.live.get(&l.topic).map(|d| d.id).or(undescribed_ids.get(&l.topic).copied());
        !described.deleted.contains(&(l.topic.clone(), l.topic_id))
            && live_id.is_none_or(|id| id == l.topic_id)
    };
    let unarchived: Vec<String> = local
        .iter()
        .filter(|l| is_live(l))
        .flat_map(|l| {
            let covered = archived.get(&(l.topic.clone(), l.partition)).map_or(&[][..], Vec::as_slice);
            l.ranges
                .iter()
                .flat_map(|&(base, end)| uncovered(base, end, covered))
                .map(|(from, to)| {
                    format!(
                        "{}/{}: offsets {from}..{to} are in {} and not in the archive",
                        l.topic,
                        l.partition,
                        l.dir.display()
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if !unarchived.is_empty() && !discard_unarchived {
        bail!(
            "nothing was changed: local logs hold data that is not archived and may have been acknowledged:\n  {}\n\
             Start Silt with its metadata if it can still be had, or run again with --discard-unarchived \
             to give that data up (it is kept, moved aside, for inspection)",
            unarchived.join("\n  ")
        );
    }

    let metadata = MetadataNode::open(&data_dir.join("metadata"), 1, "rebuild-metadata".into())
        .await
        .context("cannot open the metadata directory")?;
    // Topics: as described, then those archived by a Silt that did not describe them.
    for d in described.live.values() {
        metadata
            .write(Command::RestoreTopic {
                name: d.name.clone(),
                id: Some(d.id),
                partitions: d.partitions,
                config: d.config.clone(),
                config_version: d.config_version,
                created_ms: d.created_ms,
            })
            .await
            .with_context(|| format!("cannot restore topic '{}'", d.name))?;
    }
    let reserved = described
        .highest_id
        .into_iter()
        .chain(max_object_id)
        .chain(local.iter().map(|l| l.topic_id))
        .max()
        .map_or(0, |id| id + 1);
    metadata.write(Command::ReserveTopicIds { below: reserved }).await?;
    let mut undescribed: BTreeMap<String, u32> = BTreeMap::new();
    for (meta, _) in &footers {
        if !described.live.contains_key(&meta.topic) {
            let p = undescribed.entry(meta.topic.clone()).or_default();
            *p = (*p).max(meta.partitions);
        }
    }
    for (name, partitions) in &undescribed {
        // Default configs would delete archives older than a week as soon as Silt starts.
        let config = TopicConfig { retention_ms: None, ..TopicConfig::default() };
        metadata
            .write(Command::RestoreTopic {
                name: name.clone(),
                id: undescribed_ids.get(name).copied(),
                partitions: *partitions,
                config,
                config_version: 0,
                created_ms: SystemClock.now_ms(),
            })
            .await
            .with_context(|| format!("cannot restore topic '{name}'"))?;
    }

    let mut restored = 0;
    for (meta, object) in footers {
        let key = object.location.to_string();
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
            now_ms: SystemClock.now_ms(),
        };
        match metadata.write(cmd).await {
            Ok(_) => restored += 1,
            Err(e) => skipped.push((key, e.to_string())),
        }
    }
    // Offsets found locally are never handed out again, discarded or not.
    let topics: BTreeSet<String> = metadata.read(|s| s.topics.keys().cloned().collect()).await?;
    for l in local.iter().filter(|l| is_live(l) && topics.contains(&l.topic)) {
        let cmd = Command::RestorePartitionEnd { topic: l.topic.clone(), partition: l.partition, end: l.end };
        if let Err(e) = metadata.write(cmd).await {
            skipped.push((l.dir.display().to_string(), e.to_string()));
        }
    }
    metadata.shutdown().await;

    // Local segment files are named by topic ids the old metadata handed out and hold
    // replicas the new metadata knows nothing of. Keep them for inspection, out of the way.
    let mut moved_local_data = Vec::new();
    let stamp = SystemClock.now_ms();
    for log in log_dirs {
        let aside = log.with_file_name(format!("log.before-rebuild-{stamp}"));
        std::fs::rename(&log, &aside).with_context(|| format!("cannot move {} aside", log.display()))?;
        moved_local_data.push(aside);
    }
    Ok(RebuildReport {
        object_store: url,
        restored,
        topics: topics.into_iter().collect(),
        undescribed_topics: undescribed.into_keys().collect(),
        skipped,
        discarded_unarchived: if discard_unarchived { unarchived } else { Vec::new() },
        moved_local_data,
    })
}

#[cfg(test)]
mod tests {
    use super::uncovered;

    #[test]
    fn the_parts_of_a_range_the_archive_does_not_hold() {
        let archived = [(0, 10), (20, 30), (30, 35)];
        let none: Vec<(u64, u64)> = Vec::new();
        assert_eq!(uncovered(0, 10, &archived), none);
        assert_eq!(uncovered(0, 35, &archived), [(10, 20)], "an older segment not archived yet");
        assert_eq!(uncovered(5, 40, &archived), [(10, 20), (35, 40)]);
        assert_eq!(uncovered(40, 50, &archived), [(40, 50)]);
        assert_eq!(uncovered(7, 7, &archived), none, "an empty file");
        assert_eq!(uncovered(3, 8, &[]), [(3, 8)]);
    }
}
