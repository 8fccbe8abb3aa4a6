//! Topic name validation with Kafka's rules.

use thiserror::Error;

/// The longest topic name Kafka (and Silt) accepts, in characters.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Why a topic name is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TopicNameError {
    /// The name is the empty string.
    #[error("topic name must not be empty")]
    Empty,
    /// The name is `.` or `..`, which would be confused with directory names.
    #[error("topic name '{0}' is not allowed")]
    Reserved(String),
    /// The name is longer than [`MAX_TOPIC_NAME_LEN`] characters.
    #[error("topic name is {len} characters long, the maximum is {MAX_TOPIC_NAME_LEN}")]
    TooLong {
        /// Length of the rejected name, in characters.
        len: usize,
    },
    /// The name contains a character outside `[A-Za-z0-9._-]`.
    #[error(
        "topic name '{}' contains '{}', only ASCII letters, digits, '.', '_' and '-' are allowed",
        .name.escape_debug(),
        .invalid.escape_debug()
    )]
    InvalidChar {
        /// The rejected name.
        name: String,
        /// The first character that is not allowed.
        invalid: char,
    },
}

/// Checks `name` against Kafka's topic naming rules: non-empty, at most 249
/// characters, only ASCII letters, digits, `.`, `_` and `-`, and neither `.`
/// nor `..`.
///
/// Because `/` is never allowed, a topic name can safely be used as a path
/// component and as the first part of a [`MessageId`](crate::MessageId).
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() {
        return Err(TopicNameError::Empty);
    }
    if name == "." || name == ".." {
        return Err(TopicNameError::Reserved(name.to_owned()));
    }
    let len = name.chars().count();
    if len > MAX_TOPIC_NAME_LEN {
        return Err(TopicNameError::TooLong { len });
    }
    if let Some(invalid) = name.chars().find(|&c| !is_legal_char(c)) {
        return Err(TopicNameError::InvalidChar { name: name.to_owned(), invalid });
    }
    Ok(())
}

fn is_legal_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kafka_legal_names() {
        for name in [
            "orders",
            "a",
            "ORDERS.v2",
            "my_topic-1",
            "...",
            ".hidden",
            "__consumer_offsets",
            "0",
            &"x".repeat(MAX_TOPIC_NAME_LEN),
        ] {
            assert_eq!(validate_topic_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_empty_and_reserved() {
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert_eq!(validate_topic_name("."), Err(TopicNameError::Reserved(".".into())));
        assert_eq!(validate_topic_name(".."), Err(TopicNameError::Reserved("..".into())));
        assert_eq!(
            validate_topic_name("..").map_err(|e| e.to_string()),
            Err("topic name '..' is not allowed".to_owned())
        );
    }

    #[test]
    fn rejects_too_long() {
        let name = "x".repeat(MAX_TOPIC_NAME_LEN + 1);
        let err = validate_topic_name(&name).expect_err("250 characters is too long");
        assert_eq!(err, TopicNameError::TooLong { len: 250 });
        assert_eq!(err.to_string(), "topic name is 250 characters long, the maximum is 249");
    }

    #[test]
    fn rejects_illegal_characters() {
        for (name, invalid) in
            [("a b", ' '), ("a/b", '/'), ("a:b", ':'), ("é", 'é'), ("tab\there", '\t'), ("ok*", '*')]
        {
            assert_eq!(
                validate_topic_name(name),
                Err(TopicNameError::InvalidChar { name: name.into(), invalid }),
                "{name}"
            );
        }
        assert_eq!(
            validate_topic_name("a b").expect_err("space is illegal").to_string(),
            "topic name 'a b' contains ' ', only ASCII letters, digits, '.', '_' and '-' are allowed"
        );
        assert_eq!(
            validate_topic_name("a\nb").expect_err("newline is illegal").to_string(),
            "topic name 'a\\nb' contains '\\n', only ASCII letters, digits, '.', '_' and '-' are allowed"
        );
    }
}
