//! Sets of chunk indices as sorted, disjoint ranges.

use std::ops::Range;

/// A set of chunk indices, kept as sorted, disjoint, non-adjacent ranges: a whole
/// dataset is one range, a resumed one a range per run of chunks still to send, so the
/// set stays small however many chunks it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkSet {
    ranges: Vec<Range<u64>>,
    len: u64,
}

impl ChunkSet {
    /// The empty set.
    pub fn new() -> Self {
        ChunkSet::default()
    }

    /// Chunks `0..n`.
    pub fn all(n: u64) -> Self {
        let mut s = ChunkSet::new();
        s.insert_range(0..n);
        s
    }

    /// Adds `r` (which must not start before the set's last chunk, as when the chunks
    /// of a layout are listed in order); an out-of-order range is merged the slow way.
    pub fn insert_range(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        match self.ranges.last_mut() {
            None => {}
            Some(last) if r.start == last.end => {
                last.end = r.end;
                self.len += r.end - r.start;
                return;
            }
            Some(last) if r.start > last.end => {}
            Some(_) => {
                let mut all: Vec<Range<u64>> = std::mem::take(&mut self.ranges);
                all.push(r);
                all.sort_by_key(|r| r.start);
                self.len = 0;
                for r in all {
                    self.insert_sorted(r);
                }
                return;
            }
        }
        self.len += r.end - r.start;
        self.ranges.push(r);
    }

    fn insert_sorted(&mut self, r: Range<u64>) {
        match self.ranges.last_mut() {
            Some(last) if r.start <= last.end => {
                if r.end > last.end {
                    self.len += r.end - last.end;
                    last.end = r.end;
                }
            }
            _ => {
                self.len += r.end - r.start;
                self.ranges.push(r);
            }
        }
    }

    /// Adds one chunk.
    pub fn insert(&mut self, k: u64) {
        self.insert_range(k..k + 1);
    }

    /// Number of chunks.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `k` is in the set.
    pub fn contains(&self, k: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.end <= k);
        self.ranges.get(i).is_some_and(|r| r.start <= k)
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// The chunks, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|r| r.clone())
    }

    /// The smallest chunk of the set at or after `k`.
    pub fn next_from(&self, k: u64) -> Option<u64> {
        let i = self.ranges.partition_point(|r| r.end <= k);
        self.ranges.get(i).map(|r| r.start.max(k))
    }

    /// One past the largest chunk (0 when empty).
    pub fn end(&self) -> u64 {
        self.ranges.last().map_or(0, |r| r.end)
    }
}

impl FromIterator<u64> for ChunkSet {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        let mut s = ChunkSet::new();
        for k in iter {
            s.insert(k);
        }
        s
    }
}

/// A position in a [`ChunkSet`], for walking it once in order. The set may grow at
/// its end meanwhile (a growing manifest): the walk goes on into what was added.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cursor {
    range: usize,
    next: u64,
}

impl Cursor {
    /// The next chunk of `set` at or after the cursor, advancing past it.
    pub(crate) fn next(&mut self, set: &ChunkSet) -> Option<u64> {
        while let Some(r) = set.ranges.get(self.range) {
            let k = self.next.max(r.start);
            if k < r.end {
                self.next = k + 1;
                return Some(k);
            }
            // Stay on the last range: it may be extended.
            if self.range + 1 == set.ranges.len() {
                return None;
            }
            self.range += 1;
        }
        None
    }

    /// Every chunk of the set below this has been walked.
    pub(crate) fn position(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_coalesce_and_count() {
        let s: ChunkSet = [0, 1, 2, 5, 6, 9].into_iter().collect();
        assert_eq!(s.ranges(), &[0..3, 5..7, 9..10]);
        assert_eq!(s.len(), 6);
        assert!(s.contains(6) && !s.contains(7) && !s.contains(10) && s.contains(0));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2, 5, 6, 9]);
        let mut t = s.clone();
        t.insert_range(2..6);
        assert_eq!(t.ranges(), &[0..7, 9..10]);
        assert_eq!(t.len(), 8);
        assert_eq!(ChunkSet::all(0).len(), 0);
        let mut c = Cursor::default();
        let walked: Vec<u64> = std::iter::from_fn(|| c.next(&s)).collect();
        assert_eq!(walked, vec![0, 1, 2, 5, 6, 9]);
        assert_eq!(s.next_from(3), Some(5));
        assert_eq!(s.next_from(6), Some(6));
        assert_eq!(s.next_from(10), None);
    }

    #[test]
    fn a_cursor_walks_on_into_a_grown_set() {
        let mut s = ChunkSet::all(3);
        let mut c = Cursor::default();
        let walked: Vec<u64> = std::iter::from_fn(|| c.next(&s)).collect();
        assert_eq!(walked, vec![0, 1, 2]);
        s.insert_range(3..5);
        s.insert_range(7..8);
        let walked: Vec<u64> = std::iter::from_fn(|| c.next(&s)).collect();
        assert_eq!(walked, vec![3, 4, 7]);
        assert_eq!(c.position(), 8);
    }
}
