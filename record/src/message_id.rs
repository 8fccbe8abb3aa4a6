//! The identifier of one message: topic, partition and offset.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::topic_name::{validate_topic_name, TopicNameError};

/// Names one message: the record at `offset` in `partition` of `topic`.
///
/// Its text form is `topic/partition/offset`, e.g. `orders/3/1042`, and that
/// is also how it serializes with serde. Topic names never contain `/` (see
/// [`validate_topic_name`]), so the form is unambiguous.
///
/// Ids order by topic, then partition, then offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// The topic the message was produced to.
    pub topic: String,
    /// The partition within the topic.
    pub partition: u32,
    /// The message's offset within the partition.
    pub offset: u64,
}

impl MessageId {
    /// Creates an id from its parts.
    pub fn new(topic: impl Into<String>, partition: u32, offset: u64) -> Self {
        Self { topic: topic.into(), partition, offset }
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// Why a string is not a valid [`MessageId`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageIdError {
    /// The string does not have three `/`-separated parts.
    #[error("message id '{}' is not of the form topic/partition/offset", .input.escape_debug())]
    Malformed {
        /// The rejected input.
        input: String,
    },
    /// The partition part is not a decimal `u32`.
    #[error(
        "message id '{}' is not of the form topic/partition/offset: partition '{}' is not a \
         non-negative 32-bit integer",
        .input.escape_debug(),
        .partition.escape_debug()
    )]
    BadPartition {
        /// The rejected input.
        input: String,
        /// Its partition part.
        partition: String,
    },
    /// The offset part is not a decimal `u64`.
    #[error(
        "message id '{}' is not of the form topic/partition/offset: offset '{}' is not a \
         non-negative 64-bit integer",
        .input.escape_debug(),
        .offset.escape_debug()
    )]
    BadOffset {
        /// The rejected input.
        input: String,
        /// Its offset part.
        offset: String,
    },
    /// The topic part is not a valid topic name.
    #[error("message id '{}' has an invalid topic: {source}", .input.escape_debug())]
    BadTopic {
        /// The rejected input.
        input: String,
        /// What is wrong with the topic name.
        source: TopicNameError,
    },
}

impl FromStr for MessageId {
    type Err = MessageIdError;

    /// Parses `topic/partition/offset`, splitting from the right.
    ///
    /// Partition and offset must be plain decimal numbers (digits only, no
    /// sign, no leading zeros), so every id has exactly one text form; the
    /// topic must pass [`validate_topic_name`].
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let malformed = || MessageIdError::Malformed { input: input.to_owned() };
        let (rest, offset) = input.rsplit_once('/').ok_or_else(malformed)?;
        let (topic, partition) = rest.rsplit_once('/').ok_or_else(malformed)?;
        if topic.contains('/') {
            return Err(malformed());
        }
        validate_topic_name(topic)
            .map_err(|source| MessageIdError::BadTopic { input: input.to_owned(), source })?;
        let partition_num = parse_canonical::<u32>(partition).ok_or_else(|| {
            MessageIdError::BadPartition { input: input.to_owned(), partition: partition.to_owned() }
        })?;
        let offset_num = parse_canonical::<u64>(offset).ok_or_else(|| MessageIdError::BadOffset {
            input: input.to_owned(),
            offset: offset.to_owned(),
        })?;
        Ok(Self { topic: topic.to_owned(), partition: partition_num, offset: offset_num })
    }
}

/// Parses a decimal number written the way `Display` writes it: ASCII digits
/// only, and no leading zero unless the number is 0.
fn parse_canonical<T: FromStr>(s: &str) -> Option<T> {
    let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = s.len() > 1 && s.starts_with('0');
    if !digits_only || leading_zero {
        return None;
    }
    s.parse().ok()
}

impl Serialize for MessageId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MessageId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MessageIdVisitor;

        impl Visitor<'_> for MessageIdVisitor {
            type Value = MessageId;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message id of the form topic/partition/offset")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<MessageId, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(MessageIdVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn displays_as_topic_partition_offset() {
        assert_eq!(MessageId::new("orders", 3, 1042).to_string(), "orders/3/1042");
    }

    #[test]
    fn parses_from_the_right() {
        assert_eq!(
            "orders.v2_eu-west/3/1042".parse::<MessageId>(),
            Ok(MessageId::new("orders.v2_eu-west", 3, 1042))
        );
        assert_eq!("t/0/0".parse::<MessageId>(), Ok(MessageId::new("t", 0, 0)));
        assert_eq!(
            format!("t/{}/{}", u32::MAX, u64::MAX).parse::<MessageId>(),
            Ok(MessageId::new("t", u32::MAX, u64::MAX))
        );
    }

    #[test]
    fn rejects_malformed_ids() {
        for input in ["", "x", "orders/3", "a/b/3/4", "/", "//"] {
            let err = input.parse::<MessageId>().expect_err(input);
            assert!(
                matches!(err, MessageIdError::Malformed { .. } | MessageIdError::BadTopic { .. }),
                "{input}: {err:?}"
            );
        }
        assert_eq!(
            "x".parse::<MessageId>().expect_err("no slashes").to_string(),
            "message id 'x' is not of the form topic/partition/offset"
        );
        assert_eq!(
            "a/b/3/4".parse::<MessageId>(),
            Err(MessageIdError::Malformed { input: "a/b/3/4".into() })
        );
    }

    #[test]
    fn rejects_bad_numbers() {
        for input in ["t/-1/0", "t/+1/0", "t/01/0", "t/x/0", "t//0", "t/4294967296/0", "t/ 1/0"] {
            assert!(
                matches!(input.parse::<MessageId>(), Err(MessageIdError::BadPartition { .. })),
                "{input}"
            );
        }
        for input in ["t/0/-1", "t/0/+1", "t/0/007", "t/0/", "t/0/18446744073709551616"] {
            assert!(matches!(input.parse::<MessageId>(), Err(MessageIdError::BadOffset { .. })), "{input}");
        }
        assert_eq!(
            "t/x/0".parse::<MessageId>().expect_err("bad partition").to_string(),
            "message id 't/x/0' is not of the form topic/partition/offset: partition 'x' is not a \
             non-negative 32-bit integer"
        );
    }

    #[test]
    fn rejects_bad_topics() {
        let err = "a b/0/1".parse::<MessageId>().expect_err("space in topic");
        assert_eq!(
            err.to_string(),
            "message id 'a b/0/1' has an invalid topic: topic name 'a b' contains ' ', only ASCII \
             letters, digits, '.', '_' and '-' are allowed"
        );
        assert!(matches!(
            "/0/1".parse::<MessageId>(),
            Err(MessageIdError::BadTopic { source: TopicNameError::Empty, .. })
        ));
        assert!(matches!("../0/1".parse::<MessageId>(), Err(MessageIdError::BadTopic { .. })));
    }

    #[test]
    fn serde_uses_the_string_form() {
        let id = MessageId::new("orders", 3, 1042);
        let json = serde_json::to_string(&id).expect("serializes");
        assert_eq!(json, r#""orders/3/1042""#);
        let back: MessageId = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, id);

        let err = serde_json::from_str::<MessageId>(r#""nope""#).expect_err("malformed");
        assert!(
            err.to_string().contains("message id 'nope' is not of the form topic/partition/offset"),
            "{err}"
        );
        assert!(serde_json::from_str::<MessageId>("42").is_err());
    }

    #[test]
    fn orders_by_topic_partition_offset() {
        let mut ids = vec![
            MessageId::new("b", 0, 0),
            MessageId::new("a", 1, 0),
            MessageId::new("a", 0, 10),
            MessageId::new("a", 0, 2),
        ];
        ids.sort();
        assert_eq!(
            ids,
            vec![
                MessageId::new("a", 0, 2),
                MessageId::new("a", 0, 10),
                MessageId::new("a", 1, 0),
                MessageId::new("b", 0, 0),
            ]
        );
    }

    proptest! {
        #[test]
        fn display_then_parse_round_trips(
            topic in "[A-Za-z0-9._-]{1,40}",
            partition: u32,
            offset: u64,
        ) {
            prop_assume!(topic != "." && topic != "..");
            let id = MessageId::new(topic, partition, offset);
            prop_assert_eq!(id.to_string().parse::<MessageId>(), Ok(id));
        }

        #[test]
        fn parsing_arbitrary_strings_never_panics(input in "\\PC*") {
            if let Ok(id) = input.parse::<MessageId>() {
                prop_assert_eq!(id.to_string(), input);
            }
        }
    }
}
