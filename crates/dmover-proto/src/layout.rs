//! The dataset layout: all regular files as one virtual byte space, cut into chunks.
//!
//! Both ends compute the same [`Layout`] from the manifest and the negotiated chunk
//! size, so a data frame only needs to name its chunk: which bytes of which files it
//! carries follows from the layout.
//!
//! # Rules
//! 1. Regular files of non-zero size are laid out in manifest order.
//! 2. A file of at least [`ALIGN_MIN_SIZE`] bytes is *aligned*: it starts at a multiple
//!    of [`ALIGN`] and the next file starts no earlier than its end rounded up to
//!    [`ALIGN`]. A file of at least one chunk starts at a multiple of the chunk size, so
//!    its pieces are `[i·chunk, (i+1)·chunk)` of the file whatever precedes it (a resumed
//!    transfer, which leaves out finished files, cuts it exactly as before). Smaller
//!    files are packed end to end, with no gap.
//! 3. The virtual space ends at the last byte of the last file; chunk `k` covers
//!    `[k * chunk, min((k + 1) * chunk, total))`.
//! 4. A *piece* is the intersection of one file with one chunk. A chunk's wire payload
//!    is its pieces in order, without the padding between them; the receiver places
//!    each piece at its offset within the chunk.
//! 5. A later part of a growing manifest starts on a fresh chunk
//!    ([`Layout::extend`]), and may be cut into chunks of its own size, at most the
//!    session's ([`Layout::extend_with`], feature `PART_CHUNKS`): a *region* is a
//!    run of parts with one chunk size. Rules 2 and 3 hold within each region, counted
//!    from the region's first byte; chunk indices run on across regions.
//!
//! Rule 2 lets either end use direct I/O on big files: every piece of an aligned file
//! starts at an aligned file offset and an aligned offset within the chunk buffer, and
//! rounding its length up to [`ALIGN`] never touches another file's bytes. The padding
//! costs under 3 % for files just above the threshold and nothing on the wire.

use crate::manifest::Entry;
use crate::{Error, Result};

/// Alignment of aligned files, in bytes (the largest logical block size in common use).
pub const ALIGN: u64 = 4096;
/// Files of this size or larger are aligned (and may use direct I/O).
pub const ALIGN_MIN_SIZE: u64 = 128 * 1024;
/// Smallest chunk size.
pub const MIN_CHUNK: u32 = 64 * 1024;
/// Largest chunk size.
pub const MAX_CHUNK: u32 = 64 << 20;
/// Default chunk size.
pub const DEFAULT_CHUNK: u32 = 4 << 20;

/// Rounds `x` up to a multiple of [`ALIGN`].
#[inline]
pub const fn align_up(x: u64) -> u64 {
    (x + ALIGN - 1) & !(ALIGN - 1)
}

/// Checks a chunk size: a multiple of [`ALIGN`] within [`MIN_CHUNK`]..=[`MAX_CHUNK`].
pub fn validate_chunk_size(chunk: u32) -> Result<()> {
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) || u64::from(chunk) % ALIGN != 0 {
        return Err(Error::Violation(format!(
            "chunk size {chunk} is not a multiple of {ALIGN} between {MIN_CHUNK} and {MAX_CHUNK}"
        )));
    }
    Ok(())
}

/// Where one regular file sits in the virtual byte space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSlot {
    /// Index of the file's entry in the manifest.
    pub entry: u32,
    /// Virtual offset of the file's first byte.
    pub start: u64,
    /// File size in bytes (never 0: empty files have no slot).
    pub size: u64,
}

impl FileSlot {
    /// Virtual offset one past the file's last byte.
    #[inline]
    pub fn end(&self) -> u64 {
        self.start + self.size
    }

    /// Whether the file is aligned (rule 2) and so eligible for direct I/O.
    #[inline]
    pub fn aligned(&self) -> bool {
        self.size >= ALIGN_MIN_SIZE
    }
}

/// One file's bytes within one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the file in [`Layout::files`].
    pub file: u32,
    /// Index of this piece among the file's pieces (0-based, in file order).
    pub index: u64,
    /// Offset of the piece within the file.
    pub file_offset: u64,
    /// Offset of the piece within the chunk buffer.
    pub buf_offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Whether this is the file's last piece.
    pub last: bool,
    /// Whether the file is aligned (see [`FileSlot::aligned`]).
    pub aligned: bool,
}

impl Piece {
    /// The piece's length rounded up for direct I/O; only meaningful when `aligned`.
    #[inline]
    pub fn direct_len(&self) -> usize {
        align_up(self.len as u64) as usize
    }
}

/// The virtual layout of a dataset: one chunk size, or (a growing manifest with
/// feature `PART_CHUNKS`) one per region, none larger than the session's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The session's chunk size: the largest chunk of any region.
    chunk: u64,
    files: Vec<FileSlot>,
    total: u64,
    /// At least one; the first starts at chunk 0, byte 0 and file 0.
    regions: Vec<Region>,
}

/// A run of chunks of one size (rule 5 of the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    /// Index of its first chunk.
    first_chunk: u64,
    /// Virtual offset of its first byte (a multiple of [`ALIGN`]).
    base: u64,
    /// Its chunk size.
    chunk: u64,
    /// Index in [`Layout::files`] of its first file.
    first_file: usize,
    /// Virtual offset one past its last file's last byte (`base` while it has none).
    end: u64,
}

impl Region {
    fn n_chunks(&self) -> u64 {
        (self.end - self.base).div_ceil(self.chunk)
    }

    /// Virtual range `[lo, hi)` of chunk `k`, one of this region's.
    fn bounds(&self, k: u64) -> (u64, u64) {
        let lo = self.base + (k - self.first_chunk) * self.chunk;
        (lo, (lo + self.chunk).min(self.end))
    }
}

impl Layout {
    /// Lays out the regular files of a (validated) manifest.
    pub fn new(entries: &[Entry], chunk_size: u32) -> Result<Self> {
        Self::with_filter(entries, chunk_size, |_| true)
    }

    /// Lays out the regular files of a (validated) manifest whose index `include`
    /// accepts (a resumed transfer leaves out the files the destination already has).
    pub fn with_filter(
        entries: &[Entry],
        chunk_size: u32,
        include: impl Fn(usize) -> bool,
    ) -> Result<Self> {
        validate_chunk_size(chunk_size)?;
        let chunk = u64::from(chunk_size);
        let mut files = Vec::new();
        let mut cursor: u64 = 0;
        let mut total: u64 = 0;
        for (i, e) in entries.iter().enumerate() {
            let size = e.file_size();
            if size == 0 || !include(i) {
                continue;
            }
            let slot = FileSlot {
                entry: i as u32,
                start: 0,
                size,
            };
            let start = if size >= chunk {
                cursor.div_ceil(chunk) * chunk
            } else if slot.aligned() {
                align_up(cursor)
            } else {
                cursor
            };
            let end = start
                .checked_add(size)
                .filter(|&e| e < u64::MAX - ALIGN)
                .ok_or_else(|| Error::Violation("dataset layout overflows 64 bits".into()))?;
            cursor = if slot.aligned() { align_up(end) } else { end };
            total = end;
            files.push(FileSlot { start, ..slot });
        }
        Ok(Layout {
            chunk,
            files,
            total,
            regions: vec![Region {
                first_chunk: 0,
                base: 0,
                chunk,
                first_file: 0,
                end: total,
            }],
        })
    }

    /// Lays out the regular files of `entries[from..]` (a later part of a growing
    /// manifest, `entries` every part so far) after the files already laid out, the
    /// first of them on a fresh chunk: the part adds chunks `n_chunks()..` and
    /// changes none before (docs/protocol.md, "Growing manifest"). A part without
    /// data adds nothing.
    pub fn extend(&mut self, entries: &[Entry], from: usize) -> Result<()> {
        let chunk = u32::try_from(self.chunk)
            .map_err(|_| Error::Violation("chunk size out of range".into()))?;
        self.extend_with(entries, from, chunk)
    }

    /// [`Layout::extend`] with the part cut into chunks of `chunk_size` bytes, at most
    /// the session's ([`Layout::chunk_size`]; feature `PART_CHUNKS`, docs/protocol.md
    /// "Chunks per part"): a part of another size than the one before it starts a
    /// region, whose chunks and files are cut as the part alone would be.
    pub fn extend_with(&mut self, entries: &[Entry], from: usize, chunk_size: u32) -> Result<()> {
        validate_chunk_size(chunk_size)?;
        let chunk = u64::from(chunk_size);
        if chunk > self.chunk {
            return Err(Error::Violation(format!(
                "a part's chunk size {chunk} is larger than the session's {}",
                self.chunk
            )));
        }
        let part = Layout::with_filter(entries, chunk_size, |i| i >= from)?;
        if part.files.is_empty() {
            return Ok(());
        }
        let n_chunks = self.n_chunks();
        let last = self.regions.last_mut().expect("a region");
        let base = if last.chunk == chunk || last.end == last.base {
            // The same size (or a region with nothing in it yet, which takes the
            // part's): the region goes on, from a fresh chunk.
            last.chunk = chunk;
            last.base + last.n_chunks() * chunk
        } else {
            let base = last.base + last.n_chunks() * last.chunk;
            self.regions.push(Region {
                first_chunk: n_chunks,
                base,
                chunk,
                first_file: self.files.len(),
                end: base,
            });
            base
        };
        let total = base
            .checked_add(part.total)
            .filter(|&t| t < u64::MAX - ALIGN)
            .ok_or_else(|| Error::Violation("dataset layout overflows 64 bits".into()))?;
        self.files.extend(part.files.iter().map(|f| FileSlot {
            start: base + f.start,
            ..*f
        }));
        self.total = total;
        self.regions.last_mut().expect("a region").end = total;
        Ok(())
    }

    /// The session's chunk size in bytes: every chunk's, or (with regions) the
    /// largest a chunk may be, which buffers are sized for.
    #[inline]
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// The size of chunk `k`'s region's chunks (the session's when `k` is out of
    /// range).
    pub fn chunk_of(&self, k: u64) -> u64 {
        self.region_of_chunk(k).map_or(self.chunk, |r| r.chunk)
    }

    /// The size of the chunks file `f` is cut into.
    pub fn file_chunk(&self, f: u32) -> u64 {
        self.region_of_file(f as usize).chunk
    }

    /// The chunk sizes in use and the chunks of each, in layout order (one entry for
    /// a layout of one size, empty regions left out).
    pub fn chunk_sizes(&self) -> Vec<(u64, u64)> {
        self.regions
            .iter()
            .filter(|r| r.end > r.base)
            .map(|r| (r.chunk, r.n_chunks()))
            .collect()
    }

    fn region_of_chunk(&self, k: u64) -> Option<&Region> {
        if k >= self.n_chunks() {
            return None;
        }
        let i = self.regions.partition_point(|r| r.first_chunk <= k);
        Some(&self.regions[i - 1])
    }

    fn region_of_file(&self, f: usize) -> &Region {
        let i = self.regions.partition_point(|r| r.first_file <= f);
        &self.regions[i.max(1) - 1]
    }

    /// The regular files with data, in layout order.
    #[inline]
    pub fn files(&self) -> &[FileSlot] {
        &self.files
    }

    /// Size of the virtual byte space (data plus alignment padding).
    #[inline]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of chunks.
    #[inline]
    pub fn n_chunks(&self) -> u64 {
        let last = self.regions.last().expect("a region");
        last.first_chunk + last.n_chunks()
    }

    /// Virtual range `[lo, hi)` of chunk `k`; empty (`(total, total)`) when `k` is out
    /// of range, so a chunk index read from the wire can never overflow it.
    #[inline]
    pub fn chunk_bounds(&self, k: u64) -> (u64, u64) {
        match self.region_of_chunk(k) {
            Some(r) => r.bounds(k),
            None => (self.total, self.total),
        }
    }

    /// Number of pieces file `f` is cut into.
    pub fn n_pieces(&self, f: u32) -> u64 {
        let s = &self.files[f as usize];
        let r = self.region_of_file(f as usize);
        (s.end() - 1 - r.base) / r.chunk - (s.start - r.base) / r.chunk + 1
    }

    /// The pieces of file `f` as `(index, file_offset, len)`, in order.
    pub fn file_pieces(&self, f: u32) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let s = self.files[f as usize];
        let r = *self.region_of_file(f as usize);
        let first = (s.start - r.base) / r.chunk;
        (0..self.n_pieces(f)).map(move |i| {
            let from = s.start.max(r.base + (first + i) * r.chunk);
            let to = s.end().min(r.base + (first + i + 1) * r.chunk);
            (i, from - s.start, to - from)
        })
    }

    /// Whether file `f` starts at a chunk boundary (it is at least a chunk long), so its
    /// pieces are the same in every layout with its chunk size.
    pub fn chunk_aligned(&self, f: u32) -> bool {
        self.files[f as usize].size >= self.file_chunk(f)
    }

    /// The pieces of chunk `k`, in order. Empty when `k` is out of range.
    pub fn pieces(&self, k: u64) -> Pieces<'_> {
        let (lo, hi, base, chunk) = match self.region_of_chunk(k) {
            Some(r) => {
                let (lo, hi) = r.bounds(k);
                (lo, hi, r.base, r.chunk)
            }
            None => (0, 0, 0, self.chunk),
        };
        let next = self.files.partition_point(|f| f.end() <= lo);
        Pieces {
            layout: self,
            lo,
            hi,
            next,
            base,
            chunk,
        }
    }

    /// Number of payload bytes chunk `k` carries on the wire.
    pub fn wire_len(&self, k: u64) -> u64 {
        self.pieces(k).map(|p| p.len as u64).sum()
    }

    /// Checks a received chunk frame's header against the layout, before its trailer
    /// and payload are read (a pure function of what the transport decoded): the chunk
    /// exists; a whole frame's payload is the chunk's wire length and a part's lies
    /// within the chunk; the frame carries no more digest entries than the chunk has
    /// pieces; and a zeros frame holds only pieces of files listed as sparse
    /// (`sparse(k)` says whether; asked only for zeros frames). Returns the bytes of
    /// the chunk the frame stands for (a zeros frame: the hole's), or what is wrong.
    pub fn check_frame(
        &self,
        h: &crate::data::FrameHeader,
        part: Option<u32>,
        sparse: impl FnOnce(u64) -> bool,
    ) -> std::result::Result<u64, String> {
        let (k, n) = (h.chunk, self.n_chunks());
        let pieces = || self.pieces(k).count() as u64;
        if let Some(offset) = part {
            let (lo, hi) = self.chunk_bounds(k);
            if k >= n || u64::from(offset) + u64::from(h.payload_len) > hi - lo {
                return Err(format!(
                    "a part of {} bytes at {offset} of chunk {k}, beyond it",
                    h.payload_len
                ));
            }
            if u64::from(h.n_digests) > pieces() {
                return Err(format!(
                    "a part of chunk {k} carries {} failure markers for {} files",
                    h.n_digests,
                    pieces()
                ));
            }
            return Ok(h.payload_len.into());
        }
        if k >= n {
            return Err(format!("chunk {k} out of range (the dataset has {n})"));
        }
        let expected = self.wire_len(k);
        if !h.zeros && u64::from(h.payload_len) != expected {
            return Err(format!(
                "chunk {k} has {} bytes, the layout says {expected}",
                h.payload_len
            ));
        }
        let pieces = pieces();
        if u64::from(h.n_digests) > pieces {
            return Err(format!(
                "chunk {k} carries {} digests for {pieces} files",
                h.n_digests
            ));
        }
        if h.zeros && !sparse(k) {
            return Err(format!(
                "chunk {k} sent as zeros holds a file not listed as sparse"
            ));
        }
        Ok(expected)
    }

    /// The contiguous runs of chunk `k`'s buffer that travel on the wire, as
    /// `(buf_offset, len)`, merged where pieces touch. Clears `out` first.
    pub fn segments(&self, k: u64, out: &mut Vec<(usize, usize)>) {
        out.clear();
        for p in self.pieces(k) {
            match out.last_mut() {
                Some((off, len)) if *off + *len == p.buf_offset => *len += p.len,
                _ => out.push((p.buf_offset, p.len)),
            }
        }
    }
}

/// Iterator over the pieces of one chunk; see [`Layout::pieces`].
#[derive(Debug, Clone)]
pub struct Pieces<'a> {
    layout: &'a Layout,
    lo: u64,
    hi: u64,
    next: usize,
    /// The chunk's region's first byte and chunk size.
    base: u64,
    chunk: u64,
}

impl Iterator for Pieces<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let f = self.layout.files.get(self.next)?;
        if f.start >= self.hi {
            return None;
        }
        let file = self.next as u32;
        self.next += 1;
        let from = f.start.max(self.lo);
        let to = f.end().min(self.hi);
        let (base, chunk) = (self.base, self.chunk);
        Some(Piece {
            file,
            index: (from - base) / chunk - (f.start - base) / chunk,
            file_offset: from - f.start,
            buf_offset: (from - self.lo) as usize,
            len: (to - from) as usize,
            last: to == f.end(),
            aligned: f.aligned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{EntryKind, Mtime, NO_PARENT};

    fn files(sizes: &[u64]) -> Vec<Entry> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Entry {
                parent: NO_PARENT,
                name: format!("f{i}").into_bytes(),
                kind: EntryKind::File { size },
                mode: 0o644,
                mtime: Mtime::default(),
            })
            .collect()
    }

    #[test]
    fn a_later_part_starts_on_a_fresh_chunk() {
        let c = 256 * 1024;
        let all = files(&[100, 300_000, 10, 0, 5, 600_000]);
        let mut l = Layout::new(&all[..3], c).unwrap();
        assert_eq!(l.n_chunks(), 3);
        // A part with only an empty file adds nothing.
        l.extend(&all[..4], 3).unwrap();
        assert_eq!((l.n_chunks(), l.files().len()), (3, 3));
        l.extend(&all, 4).unwrap();
        let alone = Layout::new(&all[4..], c).unwrap();
        assert_eq!(l.n_chunks(), 3 + alone.n_chunks());
        assert_eq!(l.files()[3].start, 3 * u64::from(c));
        assert_eq!((l.files()[3].entry, l.files()[4].entry), (4, 5));
        // Chunks of the part hold the same pieces as the part laid out alone.
        for k in 0..alone.n_chunks() {
            let a: Vec<_> = alone
                .pieces(k)
                .map(|p| (p.index, p.file_offset, p.len))
                .collect();
            let b: Vec<_> = l
                .pieces(3 + k)
                .map(|p| (p.index, p.file_offset, p.len))
                .collect();
            assert_eq!(a, b, "chunk {k}");
            assert!(l.pieces(3 + k).all(|p| p.file >= 3));
        }
        // The earlier chunks did not change.
        let first = Layout::new(&all[..3], c).unwrap();
        for k in 0..3 {
            assert_eq!(
                first.pieces(k).collect::<Vec<_>>(),
                l.pieces(k).collect::<Vec<_>>()
            );
        }
    }

    /// Every byte of every file in exactly one piece, in order, within its chunk.
    fn assert_covers(l: &Layout) {
        let mut covered = vec![0u64; l.files().len()];
        let mut next_index = vec![0u64; l.files().len()];
        for k in 0..l.n_chunks() {
            let (lo, hi) = l.chunk_bounds(k);
            assert!(hi - lo <= l.chunk_of(k) && l.chunk_of(k) <= l.chunk_size());
            let mut wire = 0;
            for p in l.pieces(k) {
                let slot = l.files()[p.file as usize];
                assert_eq!(p.file_offset, covered[p.file as usize], "in order, no gap");
                assert_eq!(p.index, next_index[p.file as usize]);
                assert_eq!(slot.start + p.file_offset, lo + p.buf_offset as u64);
                assert!(lo + (p.buf_offset + p.len) as u64 <= hi);
                assert_eq!(l.file_chunk(p.file), l.chunk_of(k));
                if p.aligned {
                    assert_eq!(p.file_offset % ALIGN, 0);
                    assert_eq!(p.buf_offset as u64 % ALIGN, 0);
                    assert!((p.buf_offset + p.direct_len()) as u64 <= l.chunk_of(k));
                }
                covered[p.file as usize] += p.len as u64;
                next_index[p.file as usize] += 1;
                assert_eq!(p.last, covered[p.file as usize] == slot.size);
                wire += p.len as u64;
            }
            assert!(wire > 0, "no chunk is all padding");
            assert_eq!(wire, l.wire_len(k));
        }
        for (i, s) in l.files().iter().enumerate() {
            assert_eq!(covered[i], s.size);
            assert_eq!(next_index[i], l.n_pieces(i as u32));
            let cuts: Vec<_> = l.file_pieces(i as u32).collect();
            assert_eq!(cuts.len() as u64, l.n_pieces(i as u32));
            assert_eq!(cuts.iter().map(|c| c.2).sum::<u64>(), s.size);
        }
    }

    #[test]
    fn a_part_may_have_chunks_of_its_own_size() {
        let big = 1u32 << 20;
        let small = 64 * 1024;
        let all = files(&[3 << 20, 5000, 200_000, 10, 70_000, 100, (1 << 20) + 5, 9]);
        let mut l = Layout::new(&all[..2], big).unwrap();
        assert_eq!(l.n_chunks(), 4);
        let before: Vec<_> = (0..4).map(|k| l.pieces(k).collect::<Vec<_>>()).collect();
        // A larger chunk than the session's is refused; so is a bad one.
        assert!(l.clone().extend_with(&all, 2, 2 << 20).is_err());
        assert!(l.clone().extend_with(&all, 2, small + 1).is_err());
        l.extend_with(&all[..5], 2, small).unwrap();
        let alone = Layout::new(&all[2..5], small).unwrap();
        assert_eq!(l.n_chunks(), 4 + alone.n_chunks());
        let cut = |l: &Layout, k| {
            l.pieces(k)
                .map(|p| (p.index, p.file_offset, p.buf_offset, p.len, p.last))
                .collect::<Vec<_>>()
        };
        for k in 0..alone.n_chunks() {
            assert_eq!(cut(&alone, k), cut(&l, 4 + k), "chunk {k}");
            assert_eq!(l.chunk_of(4 + k), u64::from(small));
        }
        for (k, b) in before.iter().enumerate() {
            assert_eq!(
                &l.pieces(k as u64).collect::<Vec<_>>(),
                b,
                "earlier chunks stay"
            );
        }
        assert_eq!(l.file_chunk(0), u64::from(big));
        assert_eq!(l.file_chunk(2), u64::from(small));
        assert!(l.chunk_aligned(4), "70 000 bytes is over a 64 KiB chunk");
        assert!(!l.chunk_aligned(1) && l.chunk_aligned(0));
        // A part of the same size goes on in the region; back to the session's size
        // starts another.
        l.extend_with(&all[..6], 5, small).unwrap();
        let n = l.n_chunks();
        l.extend(&all, 6).unwrap();
        assert_eq!(l.chunk_of(n), u64::from(big));
        assert_eq!(
            l.chunk_sizes(),
            vec![
                (u64::from(big), 4),
                (u64::from(small), n - 4),
                (u64::from(big), l.n_chunks() - n)
            ]
        );
        let f6 = l.files().iter().position(|f| f.entry == 6).unwrap();
        assert_eq!(l.files()[f6].start, l.chunk_bounds(n).0, "on a fresh chunk");
        assert_eq!(l.n_pieces(f6 as u32), 2, "1 MiB + 5 bytes in 1 MiB chunks");
        assert_covers(&l);
        // Out of range.
        let end = l.n_chunks();
        assert_eq!(l.chunk_bounds(end), (l.total(), l.total()));
        assert_eq!(l.pieces(end).count(), 0);
        assert_eq!(l.chunk_bounds(u64::MAX), (l.total(), l.total()));
    }

    #[test]
    fn an_empty_start_takes_the_first_parts_size() {
        let all = files(&[0, 100, 200_000]);
        let mut l = Layout::new(&all[..1], 1 << 20).unwrap();
        assert_eq!(l.n_chunks(), 0);
        l.extend_with(&all, 1, 64 * 1024).unwrap();
        assert_eq!(l, {
            let mut m = Layout::new(&all[..1], 1 << 20).unwrap();
            m.extend_with(&all, 1, 64 * 1024).unwrap();
            m
        });
        assert_eq!(
            l.chunk_sizes(),
            vec![(64 * 1024, 5)],
            "200 000 bytes from 64 KiB on"
        );
        assert_eq!(
            l.chunk_size(),
            1 << 20,
            "buffers are still the session's size"
        );
        assert_covers(&l);
    }

    #[test]
    fn small_files_pack_and_big_files_align() {
        let l = Layout::new(&files(&[100, 0, 200_000, 10, 70_000, 140_000]), 256 * 1024).unwrap();
        let f = l.files();
        assert_eq!(f.len(), 5, "the empty file has no slot");
        assert_eq!((f[0].start, f[0].entry), (0, 0));
        assert_eq!(
            (f[1].start, f[1].entry),
            (4096, 2),
            "aligned file rounded up"
        );
        assert_eq!(
            f[2].start,
            align_up(4096 + 200_000),
            "next file after aligned extent"
        );
        assert_eq!(f[3].start, f[2].start + 10, "small files packed");
        assert_eq!(f[4].start, align_up(f[3].end()));

        // A file of a chunk or more starts at a chunk boundary.
        let l = Layout::new(&files(&[100, 0, 200_000, 10, 70_000]), 64 * 1024).unwrap();
        let f = l.files();
        assert_eq!((f[1].start, f[1].entry), (65_536, 2));
        assert!(l.chunk_aligned(1) && !l.chunk_aligned(0));
        assert_eq!(
            f[2].start,
            align_up(65_536 + 200_000),
            "next file after aligned extent"
        );
        assert_eq!(f[3].start, 5 * 65_536, "70,000 bytes is over a chunk");
        assert_eq!(l.total(), f[3].end());
    }

    #[test]
    fn hard_links_take_no_bytes() {
        let mut entries = files(&[100, 200_000, 10]);
        let plain = Layout::new(&entries, 64 * 1024).unwrap();
        entries.insert(
            2,
            Entry {
                kind: EntryKind::HardLink { first: 1 },
                ..entries[1].clone()
            },
        );
        let l = Layout::new(&entries, 64 * 1024).unwrap();
        assert_eq!(l.files().len(), 3, "the link has no slot");
        assert_eq!(l.files()[2].entry, 3);
        assert_eq!(l.total(), plain.total());
        assert_eq!(l.n_chunks(), plain.n_chunks());
    }

    #[test]
    fn pieces_cover_every_byte_once() {
        let sizes = [1, 5000, 300_000, 7, 0, 65_536, 131_072, 131_071, 1 << 20, 3];
        for chunk in [64 * 1024, 128 * 1024, 1 << 20] {
            assert_covers(&Layout::new(&files(&sizes), chunk).unwrap());
        }
    }

    #[test]
    fn big_files_are_cut_alike_whatever_precedes_them() {
        let sizes = [5000, 3 << 20, 70_000, (5 << 20) + 7];
        let all = Layout::new(&files(&sizes), 1 << 20).unwrap();
        let some = Layout::with_filter(&files(&sizes), 1 << 20, |i| i != 0 && i != 2).unwrap();
        assert_eq!(some.files().len(), 2);
        let cuts = |l: &Layout, f: u32| l.file_pieces(f).collect::<Vec<_>>();
        assert_eq!(cuts(&all, 1), cuts(&some, 0));
        assert_eq!(cuts(&all, 3), cuts(&some, 1));
        assert_eq!(cuts(&all, 3).len(), 6);
        assert_eq!(cuts(&all, 3)[5], (5, 5 << 20, 7));
        // file_pieces agrees with the chunk view.
        for (f, _) in all.files().iter().enumerate() {
            let from_chunks: Vec<_> = (0..all.n_chunks())
                .flat_map(|k| all.pieces(k))
                .filter(|p| p.file == f as u32)
                .map(|p| (p.index, p.file_offset, p.len as u64))
                .collect();
            assert_eq!(cuts(&all, f as u32), from_chunks);
        }
    }

    #[test]
    fn segments_merge_touching_pieces() {
        let l = Layout::new(&files(&[10, 20, 200_000]), 1 << 20).unwrap();
        let mut segs = Vec::new();
        l.segments(0, &mut segs);
        assert_eq!(segs, vec![(0, 30), (4096, 200_000)]);
    }

    #[test]
    fn empty_and_bad_chunk_sizes() {
        let l = Layout::new(&files(&[0, 0]), DEFAULT_CHUNK).unwrap();
        assert_eq!(l.n_chunks(), 0);
        assert_eq!(l.pieces(0).count(), 0);
        assert!(Layout::new(&[], 1000).is_err());
        assert!(Layout::new(&[], MAX_CHUNK + 4096).is_err());
        assert!(Layout::new(&[], MIN_CHUNK + 1).is_err());
    }

    /// What a hostile or broken source may put in a frame header is refused before
    /// the trailer or payload is read, each with its reason.
    #[test]
    fn frames_are_checked_against_the_layout() {
        use crate::data::{FrameHeader, FrameKind};
        // Three small files packed into chunk 0, a large one in chunks of its own.
        let l = Layout::new(&files(&[100, 1, 5000, 70_000]), 65536).unwrap();
        let n = l.n_chunks();
        let (w0, p0) = (l.wire_len(0) as u32, l.pieces(0).count() as u32);
        let last = n - 1;
        let wl = l.wire_len(last) as u32;
        assert!(p0 >= 3 && n >= 2, "{n} chunks, {p0} pieces in the first");
        let h = |chunk, payload_len, n_digests, zeros| FrameHeader {
            kind: FrameKind::Chunk,
            chunk,
            n_digests,
            payload_len,
            crc: None,
            zeros,
            part: false,
        };
        let never = |_| panic!("asked whether a chunk is sparse for a frame that is not zeros");
        assert_eq!(
            l.check_frame(&h(0, w0, p0, false), None, never),
            Ok(w0.into())
        );
        assert_eq!(
            l.check_frame(&h(last, wl, 1, false), None, never),
            Ok(wl.into())
        );
        let e = l.check_frame(&h(n, 10, 0, false), None, never).unwrap_err();
        assert_eq!(e, format!("chunk {n} out of range (the dataset has {n})"));
        let e = l
            .check_frame(&h(u64::MAX, 10, 0, false), None, never)
            .unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = l
            .check_frame(&h(0, w0 - 1, 0, false), None, never)
            .unwrap_err();
        assert_eq!(
            e,
            format!("chunk 0 has {} bytes, the layout says {w0}", w0 - 1)
        );
        let e = l
            .check_frame(&h(0, w0, p0 + 1, false), None, never)
            .unwrap_err();
        assert_eq!(
            e,
            format!("chunk 0 carries {} digests for {p0} files", p0 + 1)
        );
        assert_eq!(
            l.check_frame(&h(last, 0, 0, true), None, |k| k == last),
            Ok(wl.into())
        );
        let e = l
            .check_frame(&h(last, 0, 0, true), None, |_| false)
            .unwrap_err();
        assert!(e.contains("not listed as sparse"), "{e}");
        // Parts: within the chunk, no more markers than pieces.
        let (lo, hi) = l.chunk_bounds(last);
        let room = (hi - lo) as u32;
        assert_eq!(
            l.check_frame(&h(last, 5, 0, false), Some(room - 5), never),
            Ok(5)
        );
        let e = l
            .check_frame(&h(last, 6, 0, false), Some(room - 5), never)
            .unwrap_err();
        assert_eq!(
            e,
            format!(
                "a part of 6 bytes at {} of chunk {last}, beyond it",
                room - 5
            )
        );
        let e = l
            .check_frame(&h(n, 1, 0, false), Some(0), never)
            .unwrap_err();
        assert!(e.contains("beyond it"), "{e}");
        let e = l
            .check_frame(&h(last, 5, 2, false), Some(0), never)
            .unwrap_err();
        assert!(e.contains("2 failure markers for 1 files"), "{e}");
    }
}
