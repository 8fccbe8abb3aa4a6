//! The record types the batch codec reads and writes.

use bytes::Bytes;

/// A record header: a UTF-8 key and an optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header key; Kafka requires it to be present and valid UTF-8.
    pub key: String,
    /// Header value; `None` is Kafka's null, distinct from empty.
    pub value: Option<Bytes>,
}

/// A record decoded from a batch, with absolute offset and timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record's offset: the batch's base offset plus its offset delta.
    pub offset: u64,
    /// Milliseconds since the Unix epoch: the batch's base timestamp plus the
    /// record's delta, or the batch's max timestamp when the batch uses
    /// log-append time (as Kafka reports it).
    pub timestamp_ms: i64,
    /// The key; `None` is Kafka's null key.
    pub key: Option<Bytes>,
    /// The value; `None` is Kafka's null value (a tombstone).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<Header>,
}

impl Record {
    /// Bytes of the key, the value and the headers' keys and values: what limits on reads
    /// count.
    pub fn data_len(&self) -> usize {
        let headers: usize =
            self.headers.iter().map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len)).sum();
        self.key.as_ref().map_or(0, Bytes::len) + self.value.as_ref().map_or(0, Bytes::len) + headers
    }
}

/// A record to be encoded into a batch by [`BatchBuilder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRecord {
    /// Milliseconds since the Unix epoch (Kafka's CreateTime).
    pub timestamp_ms: i64,
    /// The key; `None` is Kafka's null key.
    pub key: Option<Bytes>,
    /// The value; `None` is Kafka's null value (a tombstone).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<Header>,
}
