//! Resuming a transfer: what the destination already holds, how the source checks it,
//! and which chunks then travel.
//!
//! The destination answers the manifest with [`Have`] parts built from its journal
//! ([`crate::journal`]): files complete under their final names (same size and mtime as
//! the manifest says, checked on disk), and pieces of large files held in staging files.
//! The source re-reads the pieces the destination claims and compares their hashes; a
//! file whose held pieces differ from what the source now reads changed between
//! attempts and is sent whole ([`Plan::stale`]). Both sides then lay out only the files
//! not done ([`Held::layout`]) and skip the chunks made only of held pieces
//! ([`Skips::chunk_skipped`]). Only files of at least one chunk have held pieces: they
//! start at a chunk boundary, so their pieces are the same in every layout, and each
//! piece but the last fills a chunk by itself. A file's last piece is always sent
//! again, and with it the file's end-to-end digest, which the source computes over the
//! hashes of the held pieces (which it checked) and of the pieces it sends.

use std::collections::HashMap;

use dmover_proto::control::{EntryRange, Have, PartialFile, Plan};
use dmover_proto::layout::Layout;
use dmover_proto::manifest::{Entry, EntryKind};

/// Have parts are cut at about this many encoded bytes.
const PART_BYTES: usize = 512 * 1024;

/// What the destination holds of a transfer, agreed by both sides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Per manifest entry: the file is complete at the destination.
    pub done: Vec<bool>,
    /// Held pieces of partial files: entry → `(piece index, piece hash)`, increasing.
    pub partial: HashMap<u32, Vec<(u64, u64)>>,
}

/// Number of pieces of a file of `size` bytes that starts at a chunk boundary.
fn pieces_of(size: u64, chunk: u64) -> u64 {
    size.div_ceil(chunk)
}

impl Held {
    /// Nothing held.
    pub fn none(entries: &[Entry]) -> Self {
        Held {
            done: vec![false; entries.len()],
            partial: HashMap::new(),
        }
    }

    /// Whether anything is held.
    pub fn is_empty(&self) -> bool {
        self.partial.is_empty() && !self.done.iter().any(|&d| d)
    }

    /// Bytes of file data held: done files and held pieces.
    pub fn bytes(&self, entries: &[Entry], chunk: u32) -> u64 {
        let chunk = u64::from(chunk);
        let done: u64 = entries
            .iter()
            .zip(&self.done)
            .filter(|(_, d)| **d)
            .map(|(e, _)| e.file_size())
            .sum();
        let partial: u64 = self.partial.values().map(|p| p.len() as u64 * chunk).sum();
        done + partial
    }

    /// Files complete at the destination.
    pub fn done_files(&self) -> u64 {
        self.done.iter().filter(|&&d| d).count() as u64
    }

    /// Builds the destination's answer, in parts of bounded size.
    pub fn to_have(&self, entries: &[Entry]) -> Vec<Have> {
        let mut parts = Vec::new();
        let mut cur = Have::default();
        let mut bytes = 0;
        let mut open: Option<EntryRange> = None;
        for (i, e) in entries.iter().enumerate() {
            let i = i as u32;
            if self.done[i as usize] {
                match &mut open {
                    Some(r) if r.first + r.count == i => r.count += 1,
                    _ => {
                        if let Some(r) = open.take() {
                            cur.done.push(r);
                            bytes += 10;
                        }
                        open = Some(EntryRange { first: i, count: 1 });
                    }
                }
            } else if e.file_size() == 0 {
                // Not a file with data: a range may run through it.
                if let Some(r) = &mut open {
                    if r.first + r.count == i {
                        r.count += 1;
                    }
                }
            }
            if bytes >= PART_BYTES {
                parts.push(std::mem::take(&mut cur));
                bytes = 0;
            }
        }
        if let Some(r) = open {
            cur.done.push(r);
        }
        let mut partial: Vec<_> = self.partial.iter().collect();
        partial.sort_by_key(|(e, _)| **e);
        for (&entry, pieces) in partial {
            bytes += 8 + pieces.len() * 18;
            cur.partial.push(PartialFile {
                entry,
                pieces: pieces.clone(),
            });
            if bytes >= PART_BYTES {
                parts.push(std::mem::take(&mut cur));
                bytes = 0;
            }
        }
        cur.last = true;
        parts.push(cur);
        parts
    }

    /// Reads the destination's answer on the source side, checking that every claim
    /// names a file of this manifest that can be held that way.
    pub fn from_have(entries: &[Entry], chunk: u32, parts: &[Have]) -> Result<Self, String> {
        let chunk = u64::from(chunk);
        let mut held = Held::none(entries);
        for part in parts {
            for r in &part.done {
                let end = r
                    .first
                    .checked_add(r.count)
                    .filter(|&e| e as usize <= entries.len())
                    .ok_or_else(|| format!("done range {r:?} is outside the manifest"))?;
                for i in r.first..end {
                    if entries[i as usize].file_size() > 0 {
                        held.done[i as usize] = true;
                    }
                }
            }
            for p in &part.partial {
                let size = match entries.get(p.entry as usize).map(|e| &e.kind) {
                    Some(EntryKind::File { size }) => *size,
                    _ => return Err(format!("entry {} is not a regular file", p.entry)),
                };
                let n = pieces_of(size, chunk);
                if size < chunk || n < 2 {
                    return Err(format!(
                        "entry {} is too small to be held in pieces",
                        p.entry
                    ));
                }
                if !p.pieces.windows(2).all(|w| w[0].0 < w[1].0)
                    || p.pieces.last().is_some_and(|l| l.0 + 1 >= n)
                {
                    return Err(format!("entry {}: bad list of held pieces", p.entry));
                }
                if held.partial.insert(p.entry, p.pieces.clone()).is_some() {
                    return Err(format!("entry {} listed twice", p.entry));
                }
            }
        }
        for e in held.partial.keys() {
            if held.done[*e as usize] {
                return Err(format!("entry {e} is both done and partial"));
            }
        }
        Ok(held)
    }

    /// Applies the source's plan: stale partial files are sent whole.
    pub fn apply(&mut self, plan: &Plan) -> Result<(), String> {
        for e in &plan.stale {
            if self.partial.remove(e).is_none() {
                return Err(format!("the plan names entry {e}, which is not partial"));
            }
        }
        Ok(())
    }

    /// The layout of what is left to send.
    pub fn layout(&self, entries: &[Entry], chunk: u32) -> dmover_proto::Result<Layout> {
        Layout::with_filter(entries, chunk, |i| !self.done[i])
    }

    /// The held pieces in terms of `layout` (which must be [`Held::layout`]).
    pub fn skips(&self, layout: &Layout) -> Skips {
        let mut by_file = HashMap::new();
        if !self.partial.is_empty() {
            for (f, s) in layout.files().iter().enumerate() {
                if let Some(p) = self.partial.get(&s.entry) {
                    by_file.insert(f as u32, p.clone());
                }
            }
        }
        Skips { by_file }
    }
}

/// Held pieces by layout file index.
#[derive(Debug, Clone, Default)]
pub struct Skips {
    by_file: HashMap<u32, Vec<(u64, u64)>>,
}

impl Skips {
    /// Whether piece `index` of layout file `file` is held.
    pub fn piece_held(&self, file: u32, index: u64) -> bool {
        self.by_file
            .get(&file)
            .is_some_and(|p| p.binary_search_by_key(&index, |x| x.0).is_ok())
    }

    /// The held pieces of layout file `file`.
    pub fn held(&self, file: u32) -> &[(u64, u64)] {
        self.by_file.get(&file).map_or(&[], |v| v.as_slice())
    }

    /// Whether any pieces are held.
    pub fn is_empty(&self) -> bool {
        self.by_file.is_empty()
    }

    /// Whether chunk `k` consists of held pieces only (and so does not travel).
    pub fn chunk_skipped(&self, layout: &Layout, k: u64) -> bool {
        !self.by_file.is_empty() && layout.pieces(k).all(|p| self.piece_held(p.file, p.index))
    }

    /// The chunks that travel, in order.
    pub fn chunks<'a>(&'a self, layout: &'a Layout) -> impl Iterator<Item = u64> + 'a {
        (0..layout.n_chunks()).filter(move |&k| !self.chunk_skipped(layout, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::manifest::{Mtime, NO_PARENT};

    fn tree() -> Vec<Entry> {
        let e = |parent, name: &str, kind| Entry {
            parent,
            name: name.into(),
            kind,
            mode: 0o644,
            mtime: Mtime::default(),
        };
        vec![
            e(NO_PARENT, "d", EntryKind::Dir),
            e(0, "a", EntryKind::File { size: 10 }),
            e(0, "empty", EntryKind::File { size: 0 }),
            e(0, "b", EntryKind::File { size: 20 }),
            e(0, "big", EntryKind::File { size: 5 << 20 }),
            e(0, "c", EntryKind::File { size: 30 }),
        ]
    }

    #[test]
    fn have_round_trips_and_ranges_run_through_empty_files() {
        let entries = tree();
        let mut held = Held::none(&entries);
        held.done[1] = true;
        held.done[3] = true;
        held.done[5] = true;
        held.partial.insert(4, vec![(0, 7), (2, 9)]);
        let parts = held.to_have(&entries);
        assert_eq!(parts.len(), 1);
        assert!(parts[0].last);
        assert_eq!(
            parts[0].done,
            vec![
                EntryRange { first: 1, count: 3 },
                EntryRange { first: 5, count: 1 }
            ]
        );
        let back = Held::from_have(&entries, 1 << 20, &parts).unwrap();
        assert_eq!(back, held);
        assert_eq!(back.bytes(&entries, 1 << 20), 60 + (2 << 20));
    }

    #[test]
    fn bad_claims_are_refused() {
        let entries = tree();
        let have = |done: Vec<EntryRange>, partial: Vec<PartialFile>| {
            Held::from_have(
                &entries,
                1 << 20,
                &[Have {
                    done,
                    partial,
                    last: true,
                }],
            )
        };
        assert!(have(vec![EntryRange { first: 5, count: 2 }], vec![]).is_err());
        assert!(
            have(
                vec![EntryRange {
                    first: u32::MAX,
                    count: 2
                }],
                vec![]
            )
            .is_err()
        );
        let partial = |entry, pieces: Vec<(u64, u64)>| vec![PartialFile { entry, pieces }];
        assert!(
            have(vec![], partial(1, vec![(0, 1)])).is_err(),
            "small file"
        );
        assert!(have(vec![], partial(0, vec![(0, 1)])).is_err(), "directory");
        assert!(
            have(vec![], partial(4, vec![(4, 1)])).is_err(),
            "the last piece"
        );
        assert!(have(vec![], partial(4, vec![(1, 1), (1, 1)])).is_err());
        assert!(have(vec![], partial(4, vec![(1, 1), (3, 1)])).is_ok());
        assert!(
            have(
                vec![EntryRange { first: 4, count: 1 }],
                partial(4, vec![(1, 1)])
            )
            .is_err()
        );
    }

    #[test]
    fn only_chunks_of_held_pieces_are_skipped() {
        let entries = tree();
        let mut held = Held::none(&entries);
        held.done[1] = true;
        held.partial.insert(4, vec![(0, 7), (2, 9)]);
        assert!(held.apply(&Plan { stale: vec![1] }).is_err());
        let layout = held.layout(&entries, 1 << 20).unwrap();
        assert_eq!(layout.files().len(), 3, "the done file is left out");
        let skips = held.skips(&layout);
        let sent: Vec<u64> = skips.chunks(&layout).collect();
        // Chunk 0: b; big fills chunks 1..=5 (pieces 0..=4); c is chunk 6.
        assert_eq!(layout.n_chunks(), 7);
        assert_eq!(sent, vec![0, 2, 4, 5, 6]);
        held.apply(&Plan { stale: vec![4] }).unwrap();
        let skips = held.skips(&layout);
        assert_eq!(skips.chunks(&layout).count() as u64, layout.n_chunks());
    }
}
