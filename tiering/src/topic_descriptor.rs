//! The bucket's description of each topic: its id, partition count and configs, so that a
//! rebuild of metadata from the bucket alone restores topics as they were (a topic rebuilt with
//! default configs would have `retention.ms` of 7 days and lose older archives at once).
//!
//! ```text
//! {prefix}/_silt/topics/{topic}/{id:020}/v{config_version:020}.json   one per config version
//! {prefix}/_silt/topics/{topic}/{id:020}/deleted.json                 the topic was deleted
//! ```
//!
//! Every object is written once, with a conditional create: two writers of the same version
//! write the same bytes, and a writer that is behind can never replace a newer version, since
//! the newest version is the one with the highest number. Older versions are deleted after a
//! newer one is in place (a crash in between leaves both; readers take the highest). The
//! tombstone is written before a deleted topic's objects are deleted, so a rebuild never
//! resurrects a topic that was deleted. `_silt` starts with an underscore, which pyarrow's
//! datasets skip, and holds no `.parquet` file: tools reading the archive never see it.

use std::collections::{BTreeMap, BTreeSet};

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use silt_metadata::state::Topic;
use silt_metadata::TopicConfig;

use crate::TieringError;

/// The version of the descriptor format this build writes and reads.
pub const DESCRIPTOR_FORMAT_VERSION: u32 = 1;

/// Largest descriptor read back (a topic's configs fit in a few hundred bytes).
const DESCRIPTOR_BYTES_MAX: u64 = 64 * 1024;

const TOMBSTONE: &str = "deleted.json";

/// What the bucket says of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicDescriptor {
    /// [`DESCRIPTOR_FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// Topic name.
    pub name: String,
    /// The topic's id in metadata.
    pub id: u64,
    /// Number of partitions.
    pub partitions: u32,
    /// Every config, defaults included (a later default must not change a restored topic).
    pub config: TopicConfig,
    /// Bumped by every change of the configs.
    pub config_version: u64,
    /// When the topic was created (ms since the Unix epoch).
    pub created_ms: u64,
}

impl TopicDescriptor {
    /// The description of a topic as metadata holds it.
    pub fn of(topic: &Topic) -> TopicDescriptor {
        TopicDescriptor {
            format_version: DESCRIPTOR_FORMAT_VERSION,
            name: topic.name.clone(),
            id: topic.id,
            partitions: topic.partitions.len() as u32,
            config: topic.config.clone(),
            config_version: topic.config_version,
            created_ms: topic.created_ms,
        }
    }
}

fn topics_root(prefix: &Path) -> Path {
    prefix.child("_silt").child("topics")
}

fn id_dir(prefix: &Path, name: &str, id: u64) -> Path {
    topics_root(prefix).child(name).child(format!("{id:020}"))
}

/// The key of version `config_version` of the description of topic `name` with id `id`.
pub fn descriptor_key(prefix: &Path, name: &str, id: u64, config_version: u64) -> Path {
    id_dir(prefix, name, id).child(format!("v{config_version:020}.json"))
}

/// The key of the mark that topic `name` with id `id` was deleted.
pub fn tombstone_key(prefix: &Path, name: &str, id: u64) -> Path {
    id_dir(prefix, name, id).child(TOMBSTONE)
}

/// What a key under `_silt/topics/` names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DescriptorObject {
    Version { name: String, id: u64, config_version: u64 },
    Tombstone { name: String, id: u64 },
}

fn parse_key(key: &Path) -> Option<DescriptorObject> {
    let parts: Vec<_> = key.parts().collect();
    let [.., silt, topics, name, id, file] = parts.as_slice() else { return None };
    if silt.as_ref() != "_silt" || topics.as_ref() != "topics" {
        return None;
    }
    silt_record::validate_topic_name(name.as_ref()).ok()?;
    let name = name.as_ref().to_string();
    let id = parse_padded(id.as_ref())?;
    if file.as_ref() == TOMBSTONE {
        return Some(DescriptorObject::Tombstone { name, id });
    }
    let version = file.as_ref().strip_prefix('v')?.strip_suffix(".json")?;
    Some(DescriptorObject::Version { name, id, config_version: parse_padded(version)? })
}

fn parse_padded(s: &str) -> Option<u64> {
    if s.len() != 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

async fn get_small(store: &dyn ObjectStore, key: &Path) -> Result<bytes::Bytes, TieringError> {
    let result = store.get(key).await.map_err(|e| TieringError::object_store("get", key, e))?;
    if result.meta.size > DESCRIPTOR_BYTES_MAX {
        return Err(TieringError::InvalidArchive(format!(
            "{key} has {} bytes; a topic description has at most {DESCRIPTOR_BYTES_MAX}",
            result.meta.size
        )));
    }
    result.bytes().await.map_err(|e| TieringError::object_store("get", key, e))
}

fn decode(key: &Path, bytes: &[u8]) -> Result<TopicDescriptor, TieringError> {
    let d: TopicDescriptor = serde_json::from_slice(bytes)
        .map_err(|e| TieringError::InvalidArchive(format!("{key} is not a topic description: {e}")))?;
    if d.format_version != DESCRIPTOR_FORMAT_VERSION {
        return Err(TieringError::UnsupportedFormatVersion {
            found: d.format_version.to_string(),
            supported: DESCRIPTOR_FORMAT_VERSION,
        });
    }
    Ok(d)
}

/// Writes `d` unless that version is in the bucket already (a different description under
/// the same version is kept, with a warning), then deletes the older versions of the same
/// topic id. Idempotent; safe to run from several processes at once.
pub async fn write_descriptor(
    store: &dyn ObjectStore,
    prefix: &Path,
    d: &TopicDescriptor,
) -> Result<(), TieringError> {
    let key = descriptor_key(prefix, &d.name, d.id, d.config_version);
    let body = serde_json::to_vec_pretty(d)
        .map_err(|e| TieringError::InvalidArgument(format!("cannot encode {key}: {e}")))?;
    let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
    match store.put_opts(&key, PutPayload::from(body), opts).await {
        Ok(_) => {}
        Err(object_store::Error::AlreadyExists { .. }) => {
            let existing = decode(&key, &get_small(store, &key).await?)?;
            if &existing != d {
                // Two metadata nodes counted versions differently (a snapshot from before
                // versions were kept): the first description stays until the next version
                // replaces it. Archiving must not stop for that.
                tracing::warn!(object = %key, ?existing, wanted = ?d, "the bucket describes this version of the topic otherwise; keeping it");
            }
        }
        Err(e) => return Err(TieringError::object_store("put", &key, e)),
    }
    let dir = id_dir(prefix, &d.name, d.id);
    let listed: Vec<object_store::ObjectMeta> = store
        .list(Some(&dir))
        .try_collect()
        .await
        .map_err(|e| TieringError::object_store("list", &dir, e))?;
    for o in listed {
        if let Some(DescriptorObject::Version { config_version, .. }) = parse_key(&o.location) {
            if config_version < d.config_version {
                match store.delete(&o.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(TieringError::object_store("delete", &o.location, e)),
                }
            }
        }
    }
    Ok(())
}

/// Marks topic `name` with id `id` deleted; its descriptions stay (they cost nothing) but are
/// never restored again.
pub async fn write_tombstone(
    store: &dyn ObjectStore,
    prefix: &Path,
    name: &str,
    id: u64,
) -> Result<(), TieringError> {
    let key = tombstone_key(prefix, name, id);
    let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
    match store.put_opts(&key, PutPayload::from_static(b"{}\n"), opts).await {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(TieringError::object_store("put", &key, e)),
    }
}

/// Every topic the bucket describes.
#[derive(Debug, Default)]
pub struct DescribedTopics {
    /// By name, the newest description of the topic's live incarnation: the highest id that
    /// is not deleted, at its highest config version.
    pub live: BTreeMap<String, TopicDescriptor>,
    /// Topics (name, id) marked deleted.
    pub deleted: BTreeSet<(String, u64)>,
    /// Descriptions that could not be read, and why.
    pub skipped: Vec<(String, String)>,
    /// The highest topic id any key names, readable or not: ids up to it were handed out.
    pub highest_id: Option<u64>,
}

impl DescribedTopics {
    /// Whether every incarnation of `name` the bucket knows was deleted (objects of that
    /// name then belong to a deleted topic).
    pub fn only_deleted(&self, name: &str) -> bool {
        !self.live.contains_key(name) && self.deleted.iter().any(|(n, _)| n == name)
    }
}

/// Reads every topic description under `prefix` (a listing: for rebuilds, not the hot path).
pub async fn read_descriptors(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<DescribedTopics, TieringError> {
    let root = topics_root(prefix);
    let listed: Vec<object_store::ObjectMeta> = store
        .list(Some(&root))
        .try_collect()
        .await
        .map_err(|e| TieringError::object_store("list", &root, e))?;
    let mut out = DescribedTopics::default();
    // (name, id) -> the highest version's key.
    let mut newest: BTreeMap<(String, u64), (u64, Path)> = BTreeMap::new();
    for o in listed {
        let parsed = parse_key(&o.location);
        if let Some(DescriptorObject::Tombstone { id, .. } | DescriptorObject::Version { id, .. }) = &parsed {
            out.highest_id = out.highest_id.max(Some(*id));
        }
        match parsed {
            Some(DescriptorObject::Tombstone { name, id }) => {
                out.deleted.insert((name, id));
            }
            Some(DescriptorObject::Version { name, id, config_version }) => {
                let entry = newest.entry((name, id)).or_insert((config_version, o.location.clone()));
                if config_version > entry.0 {
                    *entry = (config_version, o.location.clone());
                }
            }
            None => out.skipped.push((o.location.to_string(), "not a topic description".into())),
        }
    }
    for ((name, id), (_, key)) in newest.into_iter().rev() {
        if out.deleted.contains(&(name.clone(), id)) || out.live.contains_key(&name) {
            continue;
        }
        let described = match get_small(store, &key).await.and_then(|b| decode(&key, &b)) {
            Ok(d) if d.name == name && d.id == id => d,
            Ok(d) => {
                out.skipped.push((key.to_string(), format!("describes topic '{}' id {}", d.name, d.id)));
                continue;
            }
            Err(e) => {
                out.skipped.push((key.to_string(), e.to_string()));
                continue;
            }
        };
        out.live.insert(name, described);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn descriptor(name: &str, id: u64, version: u64, retention_ms: Option<u64>) -> TopicDescriptor {
        TopicDescriptor {
            format_version: DESCRIPTOR_FORMAT_VERSION,
            name: name.into(),
            id,
            partitions: 3,
            config: TopicConfig { retention_ms, replication_factor: 3, ..TopicConfig::default() },
            config_version: version,
            created_ms: 17,
        }
    }

    #[test]
    fn keys_sit_outside_the_topic_folders_and_parse_back() {
        let prefix = Path::from("archive");
        let key = descriptor_key(&prefix, "orders", 7, 2);
        assert_eq!(
            key.as_ref(),
            "archive/_silt/topics/orders/00000000000000000007/v00000000000000000002.json"
        );
        assert_eq!(
            parse_key(&key),
            Some(DescriptorObject::Version { name: "orders".into(), id: 7, config_version: 2 })
        );
        assert_eq!(
            parse_key(&tombstone_key(&prefix, "orders", 7)),
            Some(DescriptorObject::Tombstone { name: "orders".into(), id: 7 })
        );
        for bad in [
            "archive/_silt/topics/orders/7/v00000000000000000002.json",
            "archive/_silt/topics/orders/00000000000000000007/00000000000000000002.json",
            "archive/silt/topics/orders/00000000000000000007/v00000000000000000002.json",
            "archive/_silt/topics/bad name/00000000000000000007/v00000000000000000002.json",
        ] {
            assert_eq!(parse_key(&Path::from(bad)), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn the_newest_version_of_the_newest_live_incarnation_is_read_back() {
        let store = InMemory::new();
        let prefix = Path::from("p");
        write_descriptor(&store, &prefix, &descriptor("a", 1, 0, None)).await.unwrap();
        write_descriptor(&store, &prefix, &descriptor("a", 1, 3, Some(5))).await.unwrap();
        // A writer that is behind writes an old version again: the newest still wins.
        write_descriptor(&store, &prefix, &descriptor("a", 1, 1, Some(9))).await.unwrap();
        // Same version, same bytes, twice: fine. Same version, other contents: the first stays.
        write_descriptor(&store, &prefix, &descriptor("a", 1, 3, Some(5))).await.unwrap();
        write_descriptor(&store, &prefix, &descriptor("a", 1, 3, Some(6))).await.unwrap();
        // "b" was deleted and created again with id 4; "c" deleted for good.
        write_descriptor(&store, &prefix, &descriptor("b", 2, 0, None)).await.unwrap();
        write_tombstone(&store, &prefix, "b", 2).await.unwrap();
        write_tombstone(&store, &prefix, "b", 2).await.unwrap();
        write_descriptor(&store, &prefix, &descriptor("b", 4, 0, Some(1))).await.unwrap();
        write_descriptor(&store, &prefix, &descriptor("c", 3, 0, None)).await.unwrap();
        write_tombstone(&store, &prefix, "c", 3).await.unwrap();

        let read = read_descriptors(&store, &prefix).await.unwrap();
        assert_eq!(read.live.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(read.live["a"], descriptor("a", 1, 3, Some(5)));
        assert_eq!(read.live["b"], descriptor("b", 4, 0, Some(1)));
        assert_eq!(read.deleted, BTreeSet::from([("b".to_string(), 2), ("c".to_string(), 3)]));
        assert!(read.only_deleted("c") && !read.only_deleted("b") && !read.only_deleted("d"));
        assert!(read.skipped.is_empty(), "{:?}", read.skipped);
        assert_eq!(read.highest_id, Some(4));
        // Versions below the newest were deleted when it was written (again, after the one
        // that was behind).
        let a: Vec<_> = store.list(Some(&id_dir(&prefix, "a", 1))).try_collect().await.unwrap();
        assert_eq!(
            a.iter().map(|o| o.location.clone()).collect::<Vec<_>>(),
            [descriptor_key(&prefix, "a", 1, 3)]
        );
    }

    #[tokio::test]
    async fn an_unreadable_description_is_skipped_and_said() {
        let store = InMemory::new();
        let prefix = Path::from("p");
        store.put(&descriptor_key(&prefix, "a", 1, 0), PutPayload::from_static(b"{not json")).await.unwrap();
        store.put(&topics_root(&prefix).child("stray.txt"), PutPayload::from_static(b"x")).await.unwrap();
        let read = read_descriptors(&store, &prefix).await.unwrap();
        assert!(read.live.is_empty());
        assert_eq!(read.skipped.len(), 2, "{:?}", read.skipped);
    }
}
