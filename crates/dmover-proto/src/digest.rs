//! Checksums and digests, defined here so both ends compute them identically.
//!
//! - **Chunk checksum**: CRC32C (Castagnoli, hardware-accelerated on x86-64 and
//!   aarch64) over a chunk's wire payload, i.e. its pieces in order without the
//!   layout's alignment padding. Catches corruption in transit before anything is
//!   written.
//! - **File digest**: each piece of a file (its intersection with one chunk, see
//!   [`crate::layout`]) is hashed with xxh3-64; the file's digest is xxh3-64 over the
//!   little-endian piece hashes in piece order. Pieces can be hashed in any order, on any
//!   thread, while the data passes through memory, so neither end reads a byte twice.
//!   The source computes it when it reads, the destination when it receives; they are
//!   compared before the file gets its final name.
//!
//! Both bulk functions run over every byte at both ends, so their speed is part of
//! dmover's cost per byte: [`crc32c_append`] uses `crc-fast` (carry-less multiply
//! folding, AVX-512/VPCLMULQDQ where the CPU has it, picked at run time: ~3.5x the
//! `crc32c` crate's SSE4.2 loop on cache-resident data) and [`piece_hash`] uses
//! `twox-hash` (AVX2 picked at run time: ~1.7x `xxhash-rust`, which uses only what
//! the build targets, SSE2 on a default x86-64 build). The values are the standard
//! CRC-32C and xxh3-64; tests pin them against the reference crates. File digests fold
//! 8 bytes per piece with `twox-hash`'s streaming hasher.

use crc_fast::{CrcAlgorithm, Digest};
use std::hash::Hasher;

use twox_hash::XxHash3_64;

/// CRC32C of `data`, continuing from `crc` (start with 0).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if crc == 0 {
        return crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32;
    }
    // A finished CRC-32C is the register inverted: continue from the register.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// The hash of one piece of a file.
#[inline]
pub fn piece_hash(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

/// A file's digest from the hashes of its pieces, in piece order.
pub fn file_digest(piece_hashes: &[u64]) -> u64 {
    let mut h = XxHash3_64::new();
    for p in piece_hashes {
        h.write(&p.to_le_bytes());
    }
    h.finish()
}

/// Builds a file's digest from piece hashes arriving in any order, holding only the
/// out-of-order ones: memory is bounded by how far pieces run ahead, not by file size.
/// Equal to [`file_digest`] over the hashes sorted by index.
#[derive(Clone, Default)]
pub struct FileDigest {
    hasher: XxHash3_64,
    next: u64,
    pending: std::collections::BTreeMap<u64, u64>,
}

impl std::fmt::Debug for FileDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDigest")
            .field("next", &self.next)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl FileDigest {
    /// Adds the hash of piece `index`. Each index must be added once.
    pub fn add(&mut self, index: u64, hash: u64) {
        if index != self.next {
            self.pending.insert(index, hash);
            return;
        }
        self.hasher.write(&hash.to_le_bytes());
        self.next += 1;
        while let Some(h) = self.pending.remove(&self.next) {
            self.hasher.write(&h.to_le_bytes());
            self.next += 1;
        }
    }

    /// Number of leading pieces already folded in.
    pub fn contiguous(&self) -> u64 {
        self.next
    }

    /// The digest, once pieces `0..n` have all been added; `None` if some are missing.
    pub fn finish(&self, n: u64) -> Option<u64> {
        (self.next == n && self.pending.is_empty()).then(|| self.hasher.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // RFC 3720 B.4: CRC32C of 32 zero bytes.
        assert_eq!(crc32c_append(0, &[0u8; 32]), 0x8a91_36aa);
        assert_eq!(
            crc32c_append(crc32c_append(0, b"1234"), b"56789"),
            0xe306_9283
        );
        // xxh3-64 of the empty input, from the reference implementation.
        assert_eq!(piece_hash(b""), 0x2d06_8005_38d3_94c2);
        assert_ne!(file_digest(&[1, 2]), file_digest(&[2, 1]));
        assert_ne!(file_digest(&[]), file_digest(&[0]));
    }

    /// The fast implementations give the reference crates' values (the other end may
    /// run an older dmover): every length up to 600 (xxh3's short-input paths, CRC
    /// tails), large unaligned buffers, and CRCs continued across every kind of split.
    #[test]
    fn fast_implementations_match_the_references() {
        let data: Vec<u8> = (0..(3usize << 20) + 77)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for n in 0..=600 {
            let d = &data[n..2 * n];
            assert_eq!(piece_hash(d), xxhash_rust::xxh3::xxh3_64(d), "len {n}");
            assert_eq!(crc32c_append(0, d), crc32c::crc32c(d), "len {n}");
        }
        for (at, n) in [(0, 4096), (1, 65_536 + 3), (13, 1 << 20), (7, 3 << 20)] {
            let d = &data[at..at + n];
            assert_eq!(piece_hash(d), xxhash_rust::xxh3::xxh3_64(d));
            assert_eq!(crc32c_append(0, d), crc32c::crc32c(d));
            for cut in [1, 15, 16, 255, 4096, n / 3, n - 1] {
                let (x, y) = d.split_at(cut);
                let want = crc32c::crc32c_append(crc32c::crc32c(x), y);
                assert_eq!(crc32c_append(crc32c_append(0, x), y), want, "{n} cut {cut}");
                assert_eq!(want, crc32c::crc32c(d));
            }
        }
        // File digests: the streaming hasher folds piece hashes as `xxhash-rust`'s did
        // (8 bytes at a time, across its internal block and stripe boundaries).
        for n in [0u64, 1, 2, 7, 8, 9, 127, 128, 129, 1000] {
            let hashes: Vec<u64> = (0..n)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for p in &hashes {
                h.update(&p.to_le_bytes());
            }
            assert_eq!(file_digest(&hashes), h.digest(), "{n} pieces");
        }
        // Continuing from arbitrary CRC values, including 0 mid-stream.
        for seed in [1u32, 0xffff_ffff, 0x8000_0000, 0xdead_beef] {
            assert_eq!(
                crc32c_append(seed, &data[..1000]),
                crc32c::crc32c_append(seed, &data[..1000])
            );
        }
    }

    #[test]
    fn incremental_digest_matches_in_any_order() {
        let hashes: Vec<u64> = (0..10u64).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mut d = FileDigest::default();
        for i in [3u64, 0, 1, 9, 2, 5, 4, 8, 7] {
            d.add(i, hashes[i as usize]);
        }
        assert_eq!(d.finish(10), None, "piece 6 is missing");
        d.add(6, hashes[6]);
        assert_eq!(d.finish(10), Some(file_digest(&hashes)));
    }
}
