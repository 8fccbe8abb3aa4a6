//! Where archived segments live in the bucket.
//!
//! `{prefix}/topic={topic}/partition={partition}/{base_offset:020}-{last_offset:020}-t{topic_id}.parquet`
//!
//! Hive-style `key=value` directories let DuckDB, pyarrow, polars and DataFusion read a topic
//! as one partitioned dataset; zero-padded offsets make a listing sort in offset order. The
//! name alone says which offsets an object holds and which incarnation of the topic wrote it
//! (a topic deleted and created again under the same name gets a new id, so its objects never
//! meet the old one's), so the bucket is enough to rebuild the offset map (the footer says the
//! rest, see [`crate::archive_format`]). Keys written before the id was part of them
//! (`{base}-{last}.parquet`) still parse, with no id.

use object_store::path::Path;
use silt_record::validate_topic_name;

/// File name extension of archived segments.
pub const OBJECT_SUFFIX: &str = ".parquet";

/// What an object key says about the object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectName {
    /// Topic name.
    pub topic: String,
    /// The id of the topic (the incarnation of that name) that wrote it; `None` for a key
    /// written before ids were part of keys.
    pub topic_id: Option<u64>,
    /// Partition number.
    pub partition: u32,
    /// First offset in the object.
    pub base_offset: u64,
    /// Last offset in the object.
    pub last_offset: u64,
}

/// The key of the object that archives offsets `base_offset..=last_offset` of a partition of
/// the topic with id `topic_id`.
///
/// An empty `prefix` puts the `topic=` directory at the root of the store (no leading slash).
pub fn object_key(
    prefix: &Path,
    topic: &str,
    topic_id: u64,
    partition: u32,
    base_offset: u64,
    last_offset: u64,
) -> Path {
    partition_prefix(prefix, topic, partition)
        .child(format!("{base_offset:020}-{last_offset:020}-t{topic_id}{OBJECT_SUFFIX}"))
}

/// The directory (prefix) holding every object of a partition.
pub fn partition_prefix(prefix: &Path, topic: &str, partition: u32) -> Path {
    prefix.child(format!("topic={topic}")).child(format!("partition={partition}"))
}

/// Parses a key made by [`object_key`] (or by Silt before ids were part of keys), whatever the
/// prefix before it. Returns `None` for any other object (a valid topic name, a decimal
/// partition, two 20-digit offsets with `base <= last`, a decimal topic id).
pub fn parse_object_key(key: &Path) -> Option<ObjectName> {
    let parts: Vec<_> = key.parts().collect();
    let [.., topic_part, partition_part, file_part] = parts.as_slice() else {
        return None;
    };
    let topic = topic_part.as_ref().strip_prefix("topic=")?;
    validate_topic_name(topic).ok()?;
    let partition = parse_decimal_u32(partition_part.as_ref().strip_prefix("partition=")?)?;
    let stem = file_part.as_ref().strip_suffix(OBJECT_SUFFIX)?;
    let (base, rest) = stem.split_once('-')?;
    let (last, topic_id) = match rest.split_once('-') {
        Some((last, id)) => (last, Some(parse_decimal_u64(id.strip_prefix('t')?)?)),
        None => (rest, None),
    };
    let base_offset = parse_padded_u64(base)?;
    let last_offset = parse_padded_u64(last)?;
    if base_offset > last_offset {
        return None;
    }
    Some(ObjectName { topic: topic.to_string(), topic_id, partition, base_offset, last_offset })
}

fn parse_decimal_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

fn parse_decimal_u32(s: &str) -> Option<u32> {
    // `u32::from_str` accepts a leading '+'; the layout never writes one.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

fn parse_padded_u64(s: &str) -> Option<u64> {
    if s.len() != 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_matches_the_design() {
        let key = object_key(&Path::from("archive/v1"), "orders", 7, 3, 0, 41);
        assert_eq!(
            key.as_ref(),
            "archive/v1/topic=orders/partition=3/00000000000000000000-00000000000000000041-t7.parquet"
        );
        let key = object_key(&Path::default(), "orders", 12, 0, 7, u64::MAX);
        assert_eq!(
            key.as_ref(),
            "topic=orders/partition=0/00000000000000000007-18446744073709551615-t12.parquet",
            "an empty prefix adds no leading slash"
        );
        assert_eq!(partition_prefix(&Path::default(), "a", 1).as_ref(), "topic=a/partition=1");
    }

    #[test]
    fn keys_from_before_ids_still_parse() {
        let old = "p/topic=t/partition=2/00000000000000000001-00000000000000000002.parquet";
        let name =
            ObjectName { topic: "t".into(), topic_id: None, partition: 2, base_offset: 1, last_offset: 2 };
        assert_eq!(parse_object_key(&Path::from(old)), Some(name));
    }

    #[test]
    fn parse_refuses_other_objects() {
        let ok = "p/topic=t/partition=0/00000000000000000001-00000000000000000002-t3.parquet";
        assert!(parse_object_key(&Path::from(ok)).is_some());
        for bad in [
            "topic=t/partition=0/1-2.parquet",
            "topic=t/partition=0/00000000000000000003-00000000000000000002.parquet",
            "topic=t/partition=x/00000000000000000001-00000000000000000002.parquet",
            "topic=t/partition=01/00000000000000000001-00000000000000000002.parquet",
            "topic=t/partition=+1/00000000000000000001-00000000000000000002.parquet",
            "topic=t/partition=4294967296/00000000000000000001-00000000000000000002.parquet",
            "topic=t/partition=0/00000000000000000001-00000000000000000002.json",
            "topic=t/partition=0/99999999999999999999-99999999999999999999.parquet",
            "topic=/partition=0/00000000000000000001-00000000000000000002.parquet",
            "t/partition=0/00000000000000000001-00000000000000000002.parquet",
            "partition=0/00000000000000000001-00000000000000000002.parquet",
            "topic=t/partition=0/00000000000000000001-00000000000000000002-3.parquet",
            "topic=t/partition=0/00000000000000000001-00000000000000000002-t.parquet",
            "topic=t/partition=0/00000000000000000001-00000000000000000002-t03.parquet",
            "topic=t/partition=0/00000000000000000001-00000000000000000002-t3-t4.parquet",
        ] {
            assert_eq!(parse_object_key(&Path::from(bad)), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn object_keys_round_trip(
            prefix in proptest::collection::vec("[a-z0-9=_.-]{1,8}", 0..3),
            topic in "[a-zA-Z0-9._-]{1,40}",
            topic_id in any::<u64>(),
            partition in any::<u32>(),
            base in any::<u64>(),
            len in any::<u64>(),
        ) {
            prop_assume!(topic != "." && topic != "..");
            prop_assume!(prefix.iter().all(|p| p != "." && p != ".."));
            let last = base.saturating_add(len);
            let prefix = Path::from_iter(prefix.iter().map(String::as_str));
            let key = object_key(&prefix, &topic, topic_id, partition, base, last);
            let parsed = parse_object_key(&key);
            prop_assert_eq!(
                parsed,
                Some(ObjectName { topic: topic.clone(), topic_id: Some(topic_id), partition, base_offset: base, last_offset: last })
            );
            // Keys sort like offsets within a partition.
            let next = object_key(&prefix, &topic, topic_id, partition, last.saturating_add(1), last.saturating_add(1));
            prop_assert!(last == u64::MAX || key.as_ref() < next.as_ref());
            // A key survives a trip through its string form (what metadata stores).
            prop_assert_eq!(Path::parse(key.as_ref()).ok(), Some(key.clone()));
        }
    }
}
