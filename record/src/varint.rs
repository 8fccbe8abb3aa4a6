//! Zigzag variable-length integers, exactly as Kafka's `ByteUtils` writes and
//! reads them (`writeVarint` / `readVarint`, `writeVarlong` / `readVarlong`).
//!
//! A value is first zigzag-mapped (`0, -1, 1, -2, ...` become `0, 1, 2, 3, ...`)
//! so that small negative numbers stay short, then written 7 bits at a time,
//! least significant group first, with the high bit of each byte set when more
//! bytes follow.
//!
//! Decoding follows Kafka: an `i32` varint may take at most
//! [`MAX_VARINT_BYTES`] bytes and an `i64` varlong at most
//! [`MAX_VARLONG_BYTES`]; longer encodings are rejected with
//! [`VarintError::TooLong`]. As in Kafka, bits of the final byte that do not
//! fit the integer are ignored, and non-minimal encodings are accepted.

use bytes::BufMut;
use thiserror::Error;

/// The longest encoding of an `i32` varint.
pub const MAX_VARINT_BYTES: usize = 5;

/// The longest encoding of an `i64` varlong.
pub const MAX_VARLONG_BYTES: usize = 10;

/// Why a varint could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum VarintError {
    /// The input ended while the last byte still said more bytes follow.
    #[error("variable-length integer is truncated: the input ends before its last byte")]
    Truncated,
    /// The encoding is longer than an integer of this width can need.
    #[error("variable-length integer is longer than the maximum of {max_bytes} bytes")]
    TooLong {
        /// The maximum length for this width (5 or 10).
        max_bytes: usize,
    },
}

/// Zigzag-maps an `i32` so that small magnitudes give small unsigned values.
pub fn zigzag_i32(value: i32) -> u32 {
    ((value << 1) ^ (value >> 31)) as u32
}

/// Inverse of [`zigzag_i32`].
pub fn unzigzag_i32(raw: u32) -> i32 {
    ((raw >> 1) as i32) ^ -((raw & 1) as i32)
}

/// Zigzag-maps an `i64` so that small magnitudes give small unsigned values.
pub fn zigzag_i64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// Inverse of [`zigzag_i64`].
pub fn unzigzag_i64(raw: u64) -> i64 {
    ((raw >> 1) as i64) ^ -((raw & 1) as i64)
}

/// Number of bytes [`put_varint`] writes for `value` (1 to 5).
pub fn varint_len(value: i32) -> usize {
    unsigned_len(u64::from(zigzag_i32(value)))
}

/// Number of bytes [`put_varlong`] writes for `value` (1 to 10).
pub fn varlong_len(value: i64) -> usize {
    unsigned_len(zigzag_i64(value))
}

fn unsigned_len(raw: u64) -> usize {
    // Each byte carries 7 bits; zero still takes one byte.
    let bits = 64 - raw.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Appends the zigzag varint encoding of `value` to `buf`.
pub fn put_varint(buf: &mut impl BufMut, value: i32) {
    put_unsigned(buf, u64::from(zigzag_i32(value)));
}

/// Appends the zigzag varlong encoding of `value` to `buf`.
pub fn put_varlong(buf: &mut impl BufMut, value: i64) {
    put_unsigned(buf, zigzag_i64(value));
}

fn put_unsigned(buf: &mut impl BufMut, mut raw: u64) {
    while raw >= 0x80 {
        buf.put_u8((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    buf.put_u8(raw as u8);
}

/// Decodes a zigzag varint from the start of `buf`.
///
/// Returns the value and the number of bytes it occupied.
pub fn get_varint(buf: &[u8]) -> Result<(i32, usize), VarintError> {
    let mut raw: u32 = 0;
    for (i, &byte) in buf.iter().take(MAX_VARINT_BYTES).enumerate() {
        // In the fifth byte only the low 4 bits fit; like Kafka, drop the rest.
        raw |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((unzigzag_i32(raw), i + 1));
        }
    }
    if buf.len() >= MAX_VARINT_BYTES {
        Err(VarintError::TooLong { max_bytes: MAX_VARINT_BYTES })
    } else {
        Err(VarintError::Truncated)
    }
}

/// Decodes a zigzag varlong from the start of `buf`.
///
/// Returns the value and the number of bytes it occupied.
pub fn get_varlong(buf: &[u8]) -> Result<(i64, usize), VarintError> {
    let mut raw: u64 = 0;
    for (i, &byte) in buf.iter().take(MAX_VARLONG_BYTES).enumerate() {
        // In the tenth byte only the low bit fits; like Kafka, drop the rest.
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((unzigzag_i64(raw), i + 1));
        }
    }
    if buf.len() >= MAX_VARLONG_BYTES {
        Err(VarintError::TooLong { max_bytes: MAX_VARLONG_BYTES })
    } else {
        Err(VarintError::Truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_i32(value: i32) -> Vec<u8> {
        let mut buf = Vec::new();
        put_varint(&mut buf, value);
        buf
    }

    fn encode_i64(value: i64) -> Vec<u8> {
        let mut buf = Vec::new();
        put_varlong(&mut buf, value);
        buf
    }

    #[test]
    fn zigzag_matches_kafka() {
        for (value, raw) in [(0, 0u32), (-1, 1), (1, 2), (-2, 3), (2, 4)] {
            assert_eq!(zigzag_i32(value), raw);
            assert_eq!(unzigzag_i32(raw), value);
        }
        assert_eq!(zigzag_i32(i32::MAX), u32::MAX - 1);
        assert_eq!(zigzag_i32(i32::MIN), u32::MAX);
        assert_eq!(zigzag_i64(i64::MAX), u64::MAX - 1);
        assert_eq!(zigzag_i64(i64::MIN), u64::MAX);
    }

    /// Vectors from Kafka's `ByteUtilsTest` (`testVarintSerde` / `testVarlongSerde`).
    #[test]
    fn kafka_varint_vectors() {
        let cases: &[(&[u8], i32)] = &[
            (&[0x00], 0),
            (&[0x01], -1),
            (&[0x02], 1),
            (&[0x7E], 63),
            (&[0x7F], -64),
            (&[0x80, 0x01], 64),
            (&[0x81, 0x01], -65),
            (&[0xFE, 0x7F], 8191),
            (&[0xFF, 0x7F], -8192),
            (&[0x80, 0x80, 0x01], 8192),
            (&[0x81, 0x80, 0x01], -8193),
            (&[0xFE, 0xFF, 0x7F], 1048575),
            (&[0xFF, 0xFF, 0x7F], -1048576),
            (&[0x80, 0x80, 0x80, 0x01], 1048576),
            (&[0x81, 0x80, 0x80, 0x01], -1048577),
            (&[0xFE, 0xFF, 0xFF, 0x7F], 134217727),
            (&[0xFF, 0xFF, 0xFF, 0x7F], -134217728),
            (&[0x80, 0x80, 0x80, 0x80, 0x01], 134217728),
            (&[0x81, 0x80, 0x80, 0x80, 0x01], -134217729),
            (&[0xFE, 0xFF, 0xFF, 0xFF, 0x0F], i32::MAX),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F], i32::MIN),
        ];
        for &(bytes, value) in cases {
            assert_eq!(encode_i32(value), bytes, "encoding {value}");
            assert_eq!(get_varint(bytes), Ok((value, bytes.len())), "decoding {value}");
            assert_eq!(varint_len(value), bytes.len());
        }
    }

    #[test]
    fn kafka_varlong_vectors() {
        let cases: &[(&[u8], i64)] = &[
            (&[0x00], 0),
            (&[0x01], -1),
            (&[0x02], 1),
            (&[0x7E], 63),
            (&[0x7F], -64),
            (&[0x80, 0x01], 64),
            (&[0x81, 0x01], -65),
            (&[0xFE, 0xFF, 0xFF, 0xFF, 0x0F], 2147483647),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F], -2147483648),
            (&[0x80, 0x80, 0x80, 0x80, 0x10], 2147483648),
            (&[0x81, 0x80, 0x80, 0x80, 0x10], -2147483649),
            (&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], 4611686018427387904),
            (&[0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], -4611686018427387905),
            (&[0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], i64::MAX),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], i64::MIN),
        ];
        for &(bytes, value) in cases {
            assert_eq!(encode_i64(value), bytes, "encoding {value}");
            assert_eq!(get_varlong(bytes), Ok((value, bytes.len())), "decoding {value}");
            assert_eq!(varlong_len(value), bytes.len());
        }
    }

    #[test]
    fn rejects_overlong_encodings() {
        assert_eq!(
            get_varint(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]),
            Err(VarintError::TooLong { max_bytes: 5 })
        );
        assert_eq!(get_varint(&[0xFF; 5]), Err(VarintError::TooLong { max_bytes: 5 }));
        assert_eq!(get_varlong(&[0x80; 11]), Err(VarintError::TooLong { max_bytes: 10 }));
        assert_eq!(get_varlong(&[0xFF; 10]), Err(VarintError::TooLong { max_bytes: 10 }));
    }

    #[test]
    fn rejects_truncated_encodings() {
        assert_eq!(get_varint(&[]), Err(VarintError::Truncated));
        assert_eq!(get_varint(&[0x80, 0x80]), Err(VarintError::Truncated));
        assert_eq!(get_varlong(&[]), Err(VarintError::Truncated));
        assert_eq!(get_varlong(&[0xFF; 9]), Err(VarintError::Truncated));
    }

    #[test]
    fn like_kafka_ignores_excess_bits_in_last_byte_and_accepts_padding() {
        // Fifth byte 0x7F: only its low 4 bits fit in 32 bits.
        assert_eq!(get_varint(&[0xFE, 0xFF, 0xFF, 0xFF, 0x7F]), Ok((i32::MAX, 5)));
        // A non-minimal encoding of zero.
        assert_eq!(get_varint(&[0x80, 0x00]), Ok((0, 2)));
        // Decoding stops at the first byte without the continuation bit.
        assert_eq!(get_varint(&[0x02, 0xFF, 0xFF]), Ok((1, 1)));
    }

    proptest! {
        #[test]
        fn varint_round_trips(value: i32, trailing in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut buf = encode_i32(value);
            let len = buf.len();
            prop_assert_eq!(len, varint_len(value));
            buf.extend_from_slice(&trailing);
            prop_assert_eq!(get_varint(&buf), Ok((value, len)));
        }

        #[test]
        fn varlong_round_trips(value: i64, trailing in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut buf = encode_i64(value);
            let len = buf.len();
            prop_assert_eq!(len, varlong_len(value));
            buf.extend_from_slice(&trailing);
            prop_assert_eq!(get_varlong(&buf), Ok((value, len)));
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = get_varint(&bytes);
            let _ = get_varlong(&bytes);
        }
    }
}
