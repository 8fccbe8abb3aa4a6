//! Length + CRC-32C framing shared by every file the metadata service writes.
//!
//! A frame is `len: u32 LE | crc: u32 LE | payload (len bytes)`. `crc` is the CRC-32C of the
//! four length bytes followed by the payload, so a torn or zeroed header fails the check just
//! like a damaged payload. Empty payloads are never written, which makes a zero-filled region
//! (what some file systems leave after a crash) fail fast.

use std::fmt;

/// Bytes in a frame header: length and checksum.
pub(crate) const HEADER_BYTES: usize = 8;

/// Why bytes do not start with a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The header or the payload extends past the end of the bytes.
    Truncated {
        /// Bytes the frame needs.
        needed_bytes: usize,
        /// Bytes available.
        available_bytes: usize,
    },
    /// The length field is zero or larger than the caller allows.
    BadLength {
        /// The stored length.
        len_bytes: usize,
    },
    /// The checksum does not match.
    Checksum {
        /// Checksum stored in the header.
        stored: u32,
        /// Checksum of the bytes found.
        computed: u32,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { needed_bytes, available_bytes } => {
                write!(f, "record needs {needed_bytes} bytes but only {available_bytes} remain")
            }
            FrameError::BadLength { len_bytes } => write!(f, "implausible record length {len_bytes}"),
            FrameError::Checksum { stored, computed } => {
                write!(f, "CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
        }
    }
}

/// Appends one frame holding `payload` to `buf`. Fails for an empty payload or one of 4 GiB or
/// more.
pub(crate) fn encode_into(buf: &mut Vec<u8>, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).ok().filter(|len| *len > 0).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("cannot frame a payload of {} bytes", payload.len()),
        )
    })?;
    let len_bytes = len.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload);
    buf.reserve(HEADER_BYTES + payload.len());
    buf.extend_from_slice(&len_bytes);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(payload);
    Ok(())
}

/// Returns one frame holding `payload`.
pub(crate) fn encode(payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(HEADER_BYTES + payload.len());
    encode_into(&mut buf, payload)?;
    Ok(buf)
}

/// Decodes the frame at the start of `buf`: its payload and the bytes the whole frame takes.
///
/// `payload_bytes_max` bounds the length field, so a damaged length is refused before it is
/// trusted.
pub(crate) fn decode(buf: &[u8], payload_bytes_max: usize) -> Result<(&[u8], usize), FrameError> {
    let truncated = |needed_bytes| FrameError::Truncated { needed_bytes, available_bytes: buf.len() };
    let header = buf.get(..HEADER_BYTES).ok_or_else(|| truncated(HEADER_BYTES))?;
    let (len_field, crc_field) = header.split_at(4);
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(len_field);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc_field);
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len == 0 || len > payload_bytes_max {
        return Err(FrameError::BadLength { len_bytes: len });
    }
    let frame_bytes = HEADER_BYTES + len;
    let payload = buf.get(HEADER_BYTES..frame_bytes).ok_or_else(|| truncated(frame_bytes))?;
    let stored = u32::from_le_bytes(crc_bytes);
    let computed = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload);
    if stored != computed {
        return Err(FrameError::Checksum { stored, computed });
    }
    Ok((payload, frame_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refuses_empty_payload() {
        assert!(encode(b"").is_err());
    }

    #[test]
    fn zeroes_are_not_a_frame() {
        assert!(decode(&[0u8; 64], 1024).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(payloads in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 1..200), 1..8)) {
            let mut buf = Vec::new();
            for p in &payloads {
                encode_into(&mut buf, p).unwrap();
            }
            let mut offset = 0;
            for p in &payloads {
                let (payload, n) = decode(&buf[offset..], 1024).unwrap();
                prop_assert_eq!(payload, &p[..]);
                offset += n;
            }
            prop_assert_eq!(offset, buf.len());
        }

        #[test]
        fn any_single_bit_flip_is_detected(
            payload in proptest::collection::vec(any::<u8>(), 1..100),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut buf = encode(&payload).unwrap();
            let bit = bit.index(buf.len() * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode(&buf, 1024).is_err());
        }

        #[test]
        fn every_prefix_is_truncated(payload in proptest::collection::vec(any::<u8>(), 1..100)) {
            let buf = encode(&payload).unwrap();
            for cut in 0..buf.len() {
                prop_assert!(decode(&buf[..cut], 1024).is_err());
            }
        }
    }
}
