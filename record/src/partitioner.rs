//! Kafka's default key partitioner: murmur2 of the key bytes, made positive,
//! modulo the partition count.
//!
//! Using the same hash as Kafka's Java client means a key lands on the same
//! partition number in Silt as it would in a Kafka topic with the same
//! partition count.

/// Kafka's `Utils.murmur2`: 32-bit MurmurHash2 with seed `0x9747b28c`.
///
/// The result is bit-for-bit what the Java implementation returns, including
/// its sign (Java's `int` arithmetic wraps, as the wrapping `u32` arithmetic
/// here does).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java's `data.length` is an int; the hash only mixes in its low 32 bits.
    let mut h: u32 = SEED ^ (data.len() as u32);

    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }

    let tail = chunks.remainder();
    if !tail.is_empty() {
        // Java's switch falls through from case 3 to case 1.
        if let Some(&b) = tail.get(2) {
            h ^= u32::from(b) << 16;
        }
        if let Some(&b) = tail.get(1) {
            h ^= u32::from(b) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }

    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for a non-null `key`:
/// `(murmur2(key) & 0x7fffffff) % partitions`.
///
/// (Kafka spreads records without a key with its "sticky" partitioner
/// instead; that choice is not a function of the record and is not made here.)
///
/// # Panics
///
/// Panics if `partitions` is 0; a topic always has at least one partition.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic must have at least one partition");
    // Kafka's `Utils.toPositive` clears the sign bit rather than taking `abs`.
    let positive = (murmur2(key) & 0x7fff_ffff) as u32;
    positive % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases asserted by Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn matches_kafka_utils_test_vectors() {
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            (b"abc", 479470107),
        ];
        for &(key, expected) in cases {
            assert_eq!(murmur2(key), expected, "murmur2({:?})", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn covers_every_tail_length() {
        // Lengths 0..=8 exercise the empty input and each of the 0-3 tail
        // bytes after zero, one and two full blocks; the hash must differ as
        // bytes are added and must be stable.
        let data = b"abcdefgh";
        let hashes: Vec<i32> = (0..=data.len()).map(|n| murmur2(&data[..n])).collect();
        for (i, a) in hashes.iter().enumerate() {
            for b in &hashes[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(hashes, (0..=data.len()).map(|n| murmur2(&data[..n])).collect::<Vec<_>>());
    }

    #[test]
    fn partition_is_positive_hash_modulo_count() {
        // murmur2("21") = -973932308; & 0x7fffffff = 1173551340.
        assert_eq!(partition_for_key(b"21", 1), 0);
        assert_eq!(partition_for_key(b"21", 3), 1173551340 % 3);
        assert_eq!(partition_for_key(b"21", 10), 1173551340 % 10);
        // murmur2("abc") = 479470107 is already positive.
        assert_eq!(partition_for_key(b"abc", 7), 479470107 % 7);
        for partitions in 1..50 {
            assert!(partition_for_key(b"foobar", partitions) < partitions);
        }
    }

    #[test]
    #[should_panic(expected = "at least one partition")]
    fn zero_partitions_panics() {
        partition_for_key(b"k", 0);
    }
}
