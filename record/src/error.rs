//! The error type for decoding and encoding record batches.

use thiserror::Error;

/// Why a record batch could not be parsed or built.
///
/// Every variant's message is written to be shown to a user as is: it says
/// what was wrong with the batch, not only where the decoder gave up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    /// The buffer ends before the batch does.
    #[error("record batch is truncated: it needs {needed} bytes but only {available} are available")]
    Truncated {
        /// Bytes the batch needs (the whole batch when its length is known).
        needed: usize,
        /// Bytes actually present.
        available: usize,
    },

    /// The buffer holds more bytes than the batch's length field accounts for.
    #[error(
        "record batch length field says the batch is {batch_len} bytes, \
         but the buffer holds {buffer_len} bytes"
    )]
    TrailingBytes {
        /// Total size of the batch according to its header (12 + batchLength).
        batch_len: usize,
        /// Size of the buffer that was handed to the parser.
        buffer_len: usize,
    },

    /// The magic byte is not 2, so this is not a Kafka RecordBatch v2.
    #[error(
        "unsupported record batch magic {0}: only magic 2 (the Kafka RecordBatch v2 format) \
         is supported"
    )]
    BadMagic(i8),

    /// The stored CRC-32C does not match the bytes it covers.
    #[error(
        "record batch CRC mismatch (stored {stored:#010x}, computed {computed:#010x}): \
         the batch is corrupt"
    )]
    CrcMismatch {
        /// CRC read from the batch header.
        stored: u32,
        /// CRC computed over the batch's bytes from `attributes` to the end.
        computed: u32,
    },

    /// The batch is compressed; Silt only stores and serves uncompressed batches.
    #[error(
        "record batch is compressed with {name} (codec {0}), but only uncompressed batches are \
         supported",
        name = codec_name(*.0)
    )]
    UnsupportedCompression(u8),

    /// The batch holds no records.
    #[error("record batch contains no records; a batch must hold at least one")]
    EmptyBatch,

    /// The batch would not fit the format's 32-bit length field.
    #[error("record batch of {size} bytes exceeds the maximum batch size of {max} bytes")]
    BatchTooLarge {
        /// Size the batch would have.
        size: usize,
        /// Largest encodable batch.
        max: usize,
    },

    /// The batch is structurally invalid; the message says what was wrong.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
}

/// Kafka's name for a compression codec id (attributes bits 0-2).
fn codec_name(codec: u8) -> &'static str {
    match codec {
        0 => "none",
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "an unknown codec",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_well() {
        assert_eq!(
            RecordError::UnsupportedCompression(4).to_string(),
            "record batch is compressed with zstd (codec 4), but only uncompressed batches are supported"
        );
        assert_eq!(
            RecordError::UnsupportedCompression(7).to_string(),
            "record batch is compressed with an unknown codec (codec 7), but only uncompressed \
             batches are supported"
        );
        assert_eq!(
            RecordError::CrcMismatch { stored: 0x0318_a270, computed: 0xdead_beef }.to_string(),
            "record batch CRC mismatch (stored 0x0318a270, computed 0xdeadbeef): the batch is corrupt"
        );
        assert_eq!(
            RecordError::Truncated { needed: 71, available: 30 }.to_string(),
            "record batch is truncated: it needs 71 bytes but only 30 are available"
        );
        assert_eq!(
            RecordError::BadMagic(1).to_string(),
            "unsupported record batch magic 1: only magic 2 (the Kafka RecordBatch v2 format) is supported"
        );
        assert_eq!(
            RecordError::Corrupt("record 0 has offset delta 3, expected 0".into()).to_string(),
            "corrupt record batch: record 0 has offset delta 3, expected 0"
        );
    }
}
