//! Per-file progress while pieces move: which files are in flight, how many of their
//! pieces are done, and their digests. Only in-flight files have state, so memory
//! follows what is moving, not the size of the dataset. Sharded locks keep disk
//! threads from queueing on one mutex.

use std::collections::HashMap;

use dmover_proto::digest::{FileDigest, file_digest};
use parking_lot::Mutex;

const SHARDS: usize = 32;

fn shard_of(file: u32) -> usize {
    file as usize % SHARDS
}

/// Source side: folds piece hashes into file digests as files are read.
#[derive(Debug)]
pub struct SendTracker {
    shards: Vec<Mutex<HashMap<u32, FileDigest>>>,
}

impl Default for SendTracker {
    fn default() -> Self {
        SendTracker {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl SendTracker {
    /// Records hashes of pieces of `file` that are not read in this session (the
    /// destination holds them and the source checked them).
    pub fn seed(&self, file: u32, pieces: &[(u64, u64)]) {
        if pieces.is_empty() {
            return;
        }
        let mut shard = self.shards[shard_of(file)].lock();
        let d = shard.entry(file).or_default();
        for &(i, h) in pieces {
            d.add(i, h);
        }
    }

    /// Records the hash of piece `index` of `file` (which has `n` pieces); returns the
    /// file's digest once every piece has been hashed.
    pub fn piece(&self, file: u32, index: u64, n: u64, hash: u64) -> Option<u64> {
        if n == 1 {
            return Some(file_digest(&[hash]));
        }
        let mut shard = self.shards[shard_of(file)].lock();
        let d = shard.entry(file).or_default();
        d.add(index, hash);
        let done = d.finish(n);
        if done.is_some() {
            shard.remove(&file);
        }
        done
    }
}

#[derive(Debug, Default)]
struct RecvFile {
    written: u64,
    digest: FileDigest,
    expected: Option<u64>,
}

/// A file whose pieces are all written and whose expected digest (if any) is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Complete {
    /// Digest computed from what arrived (`None` without checksums).
    pub computed: Option<u64>,
    /// Digest the source sent (`None` without checksums).
    pub expected: Option<u64>,
}

/// Destination side: counts written pieces and matches digests.
#[derive(Debug)]
pub struct RecvTracker {
    checksum: bool,
    shards: Vec<Mutex<HashMap<u32, RecvFile>>>,
}

/// Why the tracker refused an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackError {
    /// The file got a second digest.
    DuplicateDigest,
    /// The file got more pieces than it has.
    TooManyPieces,
}

impl RecvTracker {
    /// A tracker; with `checksum` a file also needs its expected digest to complete.
    pub fn new(checksum: bool) -> Self {
        RecvTracker {
            checksum,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn complete(&self, f: &RecvFile, n: u64) -> Option<Complete> {
        if f.written != n {
            return None;
        }
        if !self.checksum {
            return Some(Complete {
                computed: None,
                expected: None,
            });
        }
        Some(Complete {
            computed: Some(f.digest.finish(n)?),
            expected: Some(f.expected?),
        })
    }

    /// Marks `file` in flight before its first byte is written, so an abort knows to
    /// clean up its staging file.
    pub fn begin(&self, file: u32) {
        self.shards[shard_of(file)].lock().entry(file).or_default();
    }

    /// Records that piece `index` of `file` (of `n` pieces) is written, with its hash.
    pub fn written(
        &self,
        file: u32,
        index: u64,
        n: u64,
        hash: Option<u64>,
    ) -> Result<Option<Complete>, TrackError> {
        let mut shard = self.shards[shard_of(file)].lock();
        let f = shard.entry(file).or_default();
        if f.written >= n {
            return Err(TrackError::TooManyPieces);
        }
        f.written += 1;
        if let Some(h) = hash {
            f.digest.add(index, h);
        }
        let done = self.complete(f, n);
        if done.is_some() {
            shard.remove(&file);
        }
        Ok(done)
    }

    /// Records the digest the source computed for `file` (of `n` pieces).
    pub fn expect(&self, file: u32, n: u64, digest: u64) -> Result<Option<Complete>, TrackError> {
        let mut shard = self.shards[shard_of(file)].lock();
        let f = shard.entry(file).or_default();
        if f.expected.is_some() {
            return Err(TrackError::DuplicateDigest);
        }
        f.expected = Some(digest);
        let done = self.complete(f, n);
        if done.is_some() {
            shard.remove(&file);
        }
        Ok(done)
    }

    /// Takes up `file` (of `n` pieces) with pieces an earlier attempt wrote.
    pub fn seed(&self, file: u32, n: u64, pieces: &[(u64, u64)]) {
        let mut shard = self.shards[shard_of(file)].lock();
        let f = shard.entry(file).or_default();
        for &(i, h) in pieces {
            if f.written < n {
                f.written += 1;
                if self.checksum {
                    f.digest.add(i, h);
                }
            }
        }
    }

    /// Forgets `file` (the source could not send it).
    pub fn forget(&self, file: u32) {
        self.shards[shard_of(file)].lock().remove(&file);
    }

    /// Files in flight (begun, not complete).
    pub fn in_flight(&self) -> Vec<u32> {
        self.shards
            .iter()
            .flat_map(|s| s.lock().keys().copied().collect::<Vec<_>>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_when_pieces_and_digest_are_in_any_order() {
        let t = RecvTracker::new(true);
        let d = file_digest(&[10, 11]);
        assert_eq!(t.expect(7, 2, d), Ok(None));
        assert_eq!(t.written(7, 1, 2, Some(11)), Ok(None));
        assert_eq!(t.in_flight(), vec![7]);
        let done = t.written(7, 0, 2, Some(10)).unwrap().unwrap();
        assert_eq!(done.computed, done.expected);
        assert!(t.in_flight().is_empty());

        assert_eq!(
            t.written(8, 0, 1, Some(1)),
            Ok(None),
            "waits for the digest"
        );
        let done = t.expect(8, 1, 99).unwrap().unwrap();
        assert_ne!(
            done.computed, done.expected,
            "mismatch reported, not hidden"
        );
        assert_eq!(t.expect(9, 1, 1), Ok(None));
        assert_eq!(t.expect(9, 1, 1), Err(TrackError::DuplicateDigest));
    }

    #[test]
    fn without_checksums_counting_pieces_is_enough() {
        let t = RecvTracker::new(false);
        assert_eq!(t.written(1, 0, 2, None), Ok(None));
        assert!(t.written(1, 1, 2, None).unwrap().is_some());
        t.begin(2);
        assert_eq!(t.written(2, 0, 1, None).unwrap().unwrap().computed, None);
        t.begin(3);
        assert_eq!(t.written(3, 0, 2, None), Ok(None));
        assert_eq!(t.written(3, 1, 2, None).map(|c| c.is_some()), Ok(true));
        t.begin(4);
        assert_eq!(t.written(4, 0, 1, None).map(|c| c.is_some()), Ok(true));
    }

    #[test]
    fn send_tracker_matches_file_digest() {
        let t = SendTracker::default();
        assert_eq!(t.piece(0, 0, 1, 5), Some(file_digest(&[5])));
        assert_eq!(t.piece(1, 2, 3, 7), None);
        assert_eq!(t.piece(1, 0, 3, 5), None);
        assert_eq!(t.piece(1, 1, 3, 6), Some(file_digest(&[5, 6, 7])));
    }
}
