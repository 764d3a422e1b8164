//! In-memory [`Source`] and [`Sink`], for tests and benchmarks: the same layout,
//! checksums and digests as the file-backed ones, with the files' bytes in memory.
//!
//! They check what the file-backed ones check (a chunk's CRC, its digests, each
//! file's digest), so a transfer between them exercises the pipeline and the integrity
//! checks without a disk. Not meant for large datasets: a [`MemSink`] holds everything
//! it receives.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use dmover_proto::control::{ErrorCode, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::{crc32c_append, piece_hash};
use dmover_proto::layout::Layout;
use dmover_proto::manifest::{Entry, EntryKind};

use crate::chunk::{ChunkRead, Sink, Source};
use crate::error::{Error, Result};
use crate::resume::{Held, Skips};
use crate::track::{RecvTracker, SendTracker};

fn layout_of(entries: &[Entry], chunk_size: u32) -> Result<Layout> {
    Layout::new(entries, chunk_size).map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))
}

/// A [`Source`] over files held in memory (for tests and benchmarks).
#[derive(Debug)]
pub struct MemSource {
    entries: Vec<Entry>,
    /// Per manifest entry: its bytes (empty for directories and symlinks).
    data: Vec<Vec<u8>>,
    layout: std::sync::Arc<Layout>,
    checksum: bool,
    digests: SendTracker,
    /// After a resume: the pieces the sink holds, which do not travel.
    skips: Skips,
}

impl MemSource {
    /// A source of manifest `entries` whose files hold `data` (one per entry, as long as
    /// the entry's size), cut into `chunk_size` chunks; `checksum` computes chunk CRCs
    /// and file digests.
    pub fn new(
        entries: Vec<Entry>,
        data: Vec<Vec<u8>>,
        chunk_size: u32,
        checksum: bool,
    ) -> Result<Self> {
        if data.len() != entries.len()
            || entries
                .iter()
                .zip(&data)
                .any(|(e, d)| e.file_size() != d.len() as u64)
        {
            return Err(Error::refused(
                ErrorCode::Protocol,
                "in-memory source: the data does not match the entries' sizes",
            ));
        }
        let layout = layout_of(&entries, chunk_size)?;
        Ok(MemSource {
            entries,
            data,
            layout: layout.into(),
            checksum,
            digests: SendTracker::default(),
            skips: Skips::default(),
        })
    }

    /// The manifest.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The partial files of `held` whose held pieces differ from the data here (to be
    /// sent whole), as [`crate::FileSource::check_held`] finds them on disk.
    pub fn check_held(&self, held: &Held) -> Vec<u32> {
        let chunk = self.layout.chunk_size();
        let mut stale: Vec<u32> = held
            .partial
            .iter()
            .filter(|(e, pieces)| {
                let data = &self.data[**e as usize];
                !pieces.iter().all(|&(i, hash)| {
                    let from = (i * chunk) as usize;
                    let to = data.len().min(from + chunk as usize);
                    from < to && piece_hash(&data[from..to]) == hash
                })
            })
            .map(|(e, _)| *e)
            .collect();
        stale.sort_unstable();
        stale
    }

    /// Leaves out what the sink holds (`held`, after the plan was applied): lays out
    /// the files not done and skips the chunks of held pieces.
    pub fn resume(&mut self, held: &Held) -> Result<()> {
        let layout = held
            .layout(&self.entries, self.layout.chunk_size() as u32)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        let skips = held.skips(&layout);
        for f in 0..layout.files().len() as u32 {
            self.digests.seed(f, skips.held(f));
        }
        self.layout = layout.into();
        self.skips = skips;
        Ok(())
    }

    fn fill(&self, k: u64, buf: &mut [u8], mut each: impl FnMut(u32, u64, &[u8])) {
        for p in self.layout.pieces(k) {
            let entry = self.layout.files()[p.file as usize].entry;
            let from = &self.data[entry as usize][p.file_offset as usize..][..p.len];
            let to = &mut buf[p.buf_offset..p.buf_offset + p.len];
            to.copy_from_slice(from);
            each(p.file, p.index, to);
        }
    }
}

impl Source for MemSource {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(self.skips.chunks(&self.layout))
    }

    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<ChunkRead> {
        digests.clear();
        let (mut crc, mut n_digests) = (0u32, 0u32);
        self.fill(k, buf, |file, index, data| {
            if !self.checksum {
                return;
            }
            crc = crc32c_append(crc, data);
            let n = self.layout.n_pieces(file);
            if let Some(digest) = self.digests.piece(file, index, n, piece_hash(data)) {
                digests.push(DigestEntry { file, digest });
                n_digests += 1;
            }
        });
        Ok(ChunkRead {
            crc: self.checksum.then_some(crc),
            n_digests,
            zeros: false,
        })
    }

    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> Result<()> {
        let mut again = 0u32;
        self.fill(k, buf, |_, _, data| again = crc32c_append(again, data));
        if crc.is_some_and(|c| c != again) {
            return Err(Error::Changed {
                path: format!("chunk {k}"),
                what: "it reads differently than when it was first sent".into(),
            });
        }
        Ok(())
    }
}

/// A [`Sink`] that keeps what it receives in memory (for tests and benchmarks).
#[derive(Debug)]
pub struct MemSink {
    entries: Vec<Entry>,
    layout: std::sync::Arc<Layout>,
    checksum: bool,
    tracker: RecvTracker,
    /// Per layout file: its bytes so far.
    files: Vec<Mutex<Vec<u8>>>,
    /// Per manifest entry: complete and verified.
    done: Mutex<Vec<bool>>,
    files_done: AtomicU64,
    bytes: AtomicU64,
    chunks: AtomicU64,
    aborted: std::sync::atomic::AtomicBool,
    /// What an earlier attempt left: per manifest entry, a complete file's bytes, or
    /// a partial file's pieces (index, bytes).
    left: Vec<Left>,
    /// After a resume: the held pieces of partial files, which do not travel.
    skips: Skips,
}

/// What an earlier attempt left of one manifest entry ([`MemSink::leave`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Left {
    /// Nothing.
    #[default]
    Nothing,
    /// The whole file.
    Done(Vec<u8>),
    /// Pieces of the file: (index, bytes), increasing.
    Pieces(Vec<(u64, Vec<u8>)>),
}

impl MemSink {
    /// A sink receiving manifest `entries` in `chunk_size` chunks; with `checksum` it
    /// checks chunk CRCs and file digests.
    pub fn new(entries: Vec<Entry>, chunk_size: u32, checksum: bool) -> Result<Self> {
        let layout = layout_of(&entries, chunk_size)?;
        let entries_len = entries.len();
        let files = layout
            .files()
            .iter()
            .map(|s| Mutex::new(vec![0; s.size as usize]))
            .collect();
        Ok(MemSink {
            done: Mutex::new(vec![false; entries.len()]),
            entries,
            layout: layout.into(),
            checksum,
            tracker: RecvTracker::new(checksum),
            files,
            files_done: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            aborted: Default::default(),
            left: vec![Left::Nothing; entries_len],
            skips: Skips::default(),
        })
    }

    /// Takes what an earlier attempt left of entry `entry` (before [`MemSink::held`]).
    pub fn leave(&mut self, entry: u32, left: Left) {
        self.left[entry as usize] = left;
    }

    /// What an earlier attempt left, as a file sink's journal tells it.
    pub fn held(&self) -> Held {
        let mut held = Held::none(&self.entries);
        for (e, left) in self.left.iter().enumerate() {
            match left {
                Left::Nothing => {}
                Left::Done(_) => held.done[e] = true,
                Left::Pieces(p) => {
                    let hashes = p.iter().map(|(i, b)| (*i, piece_hash(b))).collect();
                    held.partial.insert(e as u32, hashes);
                }
            }
        }
        held
    }

    /// Leaves out what is held (`held`, as the source agreed it): lays out the files
    /// not done, takes up the held pieces of partial files, and keeps the done ones.
    pub fn resume(&mut self, held: &Held) -> Result<()> {
        let chunk = self.layout.chunk_size();
        let layout = held
            .layout(&self.entries, chunk as u32)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        let skips = held.skips(&layout);
        let mut files = Vec::with_capacity(layout.files().len());
        for (f, slot) in layout.files().iter().enumerate() {
            let mut bytes = vec![0; slot.size as usize];
            let pieces = skips.held(f as u32);
            if let (false, Left::Pieces(left)) =
                (pieces.is_empty(), &self.left[slot.entry as usize])
            {
                for (i, b) in left
                    .iter()
                    .filter(|(i, _)| pieces.iter().any(|p| p.0 == *i))
                {
                    bytes[(i * chunk) as usize..][..b.len()].copy_from_slice(b);
                }
                self.tracker
                    .seed(f as u32, layout.n_pieces(f as u32), pieces);
            }
            files.push(Mutex::new(bytes));
        }
        let mut done = self.done.lock();
        for (e, d) in held.done.iter().enumerate() {
            done[e] = *d;
        }
        drop(done);
        self.files = files;
        self.layout = layout.into();
        self.skips = skips;
        Ok(())
    }

    /// The manifest's entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The bytes of manifest entry `entry`, once it is complete and verified (an empty
    /// file is complete after [`Sink::finish`]); `None` before, or after an abort.
    pub fn file(&self, entry: u32) -> Option<Vec<u8>> {
        if self.aborted.load(Ordering::Acquire) || !self.done.lock()[entry as usize] {
            return None;
        }
        let f = self.layout.files().iter().position(|s| s.entry == entry);
        Some(match (f, &self.left[entry as usize]) {
            (Some(f), _) => self.files[f].lock().clone(),
            (None, Left::Done(bytes)) => bytes.clone(),
            (None, _) => Vec::new(),
        })
    }

    fn complete(&self, file: u32, done: crate::track::Complete) -> Result<()> {
        let entry = self.layout.files()[file as usize].entry;
        if done.computed != done.expected {
            return Err(Error::Checksum(format!(
                "{}: received data has digest {:016x}, the source's is {:016x}",
                String::from_utf8_lossy(&self.entries[entry as usize].name),
                done.computed.unwrap_or(0),
                done.expected.unwrap_or(0)
            )));
        }
        self.done.lock()[entry as usize] = true;
        self.files_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Sink for MemSink {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(self.skips.chunks(&self.layout))
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        if self.checksum {
            crate::chunk::check_crc(&self.layout, k, buf, crc, "the source")?;
        }
        let bad = |what: String| Error::protocol("the source", format!("chunk {k}: {what}"));
        for d in digests {
            let file = d.index();
            if d.is_failure() || !self.layout.pieces(k).any(|p| p.file == file) {
                return Err(bad(format!("unexpected digest entry for file {file}")));
            }
            match self
                .tracker
                .expect(file, self.layout.n_pieces(file), d.digest)
            {
                Ok(Some(done)) => self.complete(file, done)?,
                Ok(None) => {}
                Err(e) => return Err(bad(format!("file {file}: {e:?}"))),
            }
        }
        for p in self.layout.pieces(k) {
            let data = &buf[p.buf_offset..p.buf_offset + p.len];
            self.tracker.begin(p.file);
            self.files[p.file as usize].lock()[p.file_offset as usize..][..p.len]
                .copy_from_slice(data);
            self.bytes.fetch_add(p.len as u64, Ordering::Relaxed);
            let hash = self.checksum.then(|| piece_hash(data));
            let n = self.layout.n_pieces(p.file);
            match self.tracker.written(p.file, p.index, n, hash) {
                Ok(Some(done)) => self.complete(p.file, done)?,
                Ok(None) => {}
                Err(e) => return Err(bad(format!("file {}: {e:?}", p.file))),
            }
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&self) -> Result<Summary> {
        let expected = self.layout.files().len() as u64;
        let done = self.files_done.load(Ordering::Relaxed);
        if done != expected {
            return Err(Error::protocol(
                "the source",
                format!(
                    "{} of {expected} files incomplete at the end of the transfer",
                    expected - done
                ),
            ));
        }
        let mut summary = Summary {
            bytes: self.bytes.load(Ordering::Relaxed),
            files: done,
            chunks: self.chunks.load(Ordering::Relaxed),
            verified: self.checksum,
            ..Summary::default()
        };
        let mut flags = self.done.lock();
        for (e, d) in self.entries.iter().zip(flags.iter_mut()) {
            match e.kind {
                EntryKind::File { size: 0 } => {
                    summary.files += 1;
                    *d = true;
                }
                EntryKind::Dir => summary.dirs += 1,
                EntryKind::Symlink { .. } => summary.symlinks += 1,
                EntryKind::File { .. } | EntryKind::HardLink { .. } => {}
            }
        }
        Ok(summary)
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }
}
