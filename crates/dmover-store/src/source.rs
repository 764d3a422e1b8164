//! The source side's disk stage: fill a chunk buffer from the files the layout puts in
//! it, hashing each piece on the way.
//!
//! A file that cannot be read (vanished, unreadable, changed while read) stops the
//! session, or with [`SourceOptions::continue_on_error`] is reported and marked failed
//! in the chunks that hold its pieces (see [`dmover_proto::data`]), and the rest goes on.
//!
//! Holes are not read: for a file the walk listed as sparse ([`Tree::sparse`]) the
//! data extents are found once, at its first read (`SEEK_DATA`/`SEEK_HOLE`), and a
//! piece lying wholly in a hole is zero-filled without a read. Other files pay one
//! comparison (an empty map) per piece.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};

use dmover_proto::control::FailedFile;
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::{crc32c_append, piece_hash};
use dmover_proto::layout::{Layout, Piece};
use rustix::fs::OFlags;

use crate::chunk::{ChunkRead, Source};
use crate::error::{Error, Result};
use crate::resume::{Held, Skips};
use crate::sys;
use crate::track::SendTracker;
use crate::tree::Tree;
use dmover_proto::control::DirectIo;

/// Options of the source side.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceOptions {
    /// Compute chunk CRCs and file digests.
    pub checksum: bool,
    /// When to read aligned files with `O_DIRECT` (falls back if the file system
    /// refuses).
    pub direct_io: DirectIo,
    /// Report files that cannot be read and go on with the others.
    pub continue_on_error: bool,
}

/// The file-backed [`Source`]: a walked tree, its layout and options.
/// The entry index of the send report's marker of entries the walk skipped.
pub const SKIPPED_MARKER: u32 = u32::MAX;

/// The walked entries and their layout.
#[derive(Debug)]
struct Bound {
    tree: Tree,
    layout: Arc<Layout>,
    /// Sparse files (by entry): their data extents, found at the first read.
    extents: HashMap<u32, OnceLock<Vec<(u64, u64)>>>,
}

/// A file-backed source.
#[derive(Debug)]
pub struct FileSource {
    /// The walked entries and their layout: both grow with a growing manifest
    /// ([`FileSource::grow`]). Each entry point reads them once and hands them to
    /// its helpers, so no path takes the lock twice.
    bound: RwLock<Bound>,
    opts: SourceOptions,
    digests: SendTracker,
    direct_failed: AtomicBool,
    skips: Skips,
    held_bytes: u64,
    held_files: u64,
    /// The manifest entries of the files held whole.
    held_entries: Vec<u32>,
    /// Layout file → why it could not be sent.
    failed: Mutex<BTreeMap<u32, String>>,
    /// Entries the walk skipped, reported in [`FileSource::failed`] when nonzero.
    skipped_report: u64,
    /// What a growing manifest's parts carry of their entries' metadata: the
    /// attributes in scope, and the owners or not (none: nothing).
    grown_meta: Option<(dmover_proto::manifest::XattrScope, bool)>,
}

impl FileSource {
    /// A source over `tree` cut into `chunk_size` chunks.
    pub fn new(tree: Tree, chunk_size: u32, opts: SourceOptions) -> Result<Self> {
        let layout = Layout::new(tree.entries(), chunk_size).map_err(|e| {
            Error::refused(dmover_proto::control::ErrorCode::Protocol, e.to_string())
        })?;
        Ok(FileSource {
            bound: RwLock::new(Bound {
                extents: tree
                    .sparse()
                    .iter()
                    .map(|&e| (e, OnceLock::new()))
                    .collect(),
                tree,
                layout: Arc::new(layout),
            }),
            opts,
            digests: SendTracker::default(),
            direct_failed: AtomicBool::new(false),
            skips: Skips::default(),
            held_bytes: 0,
            held_files: 0,
            held_entries: Vec::new(),
            failed: Mutex::default(),
            skipped_report: 0,
            grown_meta: None,
        })
    }

    /// The owners and the extended attributes `scope` allows of the tree's entries
    /// (feature `METADATA`; see [`crate::meta::read_tree`]).
    pub fn read_meta(
        &self,
        scope: dmover_proto::manifest::XattrScope,
    ) -> Vec<dmover_proto::manifest::EntryMeta> {
        crate::meta::read_tree(&self.bound.read().tree, scope)
    }

    /// What [`FileSource::grown_meta`] reads of a growing manifest's later parts: the
    /// extended attributes `scope` allows, and the owners if `owner`.
    pub fn set_grown_meta(&mut self, scope: dmover_proto::manifest::XattrScope, owner: bool) {
        self.grown_meta =
            (owner || scope.user || scope.acls || scope.all).then_some((scope, owner));
    }

    /// The metadata of entries `from..` (a growing manifest's part, see
    /// [`FileSource::set_grown_meta`]) and the entry count it went up to.
    pub fn grown_meta(&self, from: u32) -> (Vec<dmover_proto::manifest::EntryMeta>, u32) {
        let b = self.bound.read();
        let n = b.tree.entries().len() as u32;
        let Some((scope, owner)) = self.grown_meta else {
            return (Vec::new(), n);
        };
        let mut meta = crate::meta::read_entries(&b.tree, from.min(n)..n, scope);
        if !owner {
            for m in &mut meta {
                (m.uid, m.gid) = (u32::MAX, u32::MAX);
            }
        }
        (meta, n)
    }

    /// Checks the pieces the destination says it holds against the files as they are
    /// now, returning the entries whose held pieces differ (changed since).
    pub fn check_held(&self, held: &Held) -> Vec<u32> {
        let b = self.bound.read();
        let chunk = b.layout.chunk_size();
        let mut stale = Vec::new();
        let mut buf = vec![0u8; chunk as usize];
        let mut entries: Vec<_> = held.partial.keys().copied().collect();
        entries.sort_unstable();
        for entry in entries {
            let size = b.tree.entries()[entry as usize].file_size();
            let same = (|| -> std::io::Result<bool> {
                let (dir, name) = b.tree.locate(entry)?;
                let fd = sys::open_regular(&*dir, name)?;
                for &(i, hash) in &held.partial[&entry] {
                    let len = chunk.min(size - i * chunk) as usize;
                    let got = sys::pread_full(&fd, &mut buf[..len], i * chunk)?;
                    if got < len || piece_hash(&buf[..len]) != hash {
                        return Ok(false);
                    }
                }
                Ok(true)
            })()
            .unwrap_or(false);
            if !same {
                tracing::info!(
                    "{} changed since the last attempt; sending it whole",
                    b.tree.display(entry)
                );
                stale.push(entry);
            }
        }
        stale
    }

    /// Leaves out what the destination holds (`held`, after the plan was applied).
    pub fn resume(&mut self, held: &Held) -> Result<()> {
        let b = self.bound.get_mut();
        let layout = held
            .layout(b.tree.entries(), b.layout.chunk_size() as u32)
            .map_err(|e| {
                Error::refused(dmover_proto::control::ErrorCode::Protocol, e.to_string())
            })?;
        let skips = held.skips(&layout);
        for f in 0..layout.files().len() as u32 {
            self.digests.seed(f, skips.held(f));
        }
        let held_bytes = held.bytes(b.tree.entries(), b.layout.chunk_size() as u32);
        b.layout = Arc::new(layout);
        self.held_bytes = held_bytes;
        self.held_files = held.done_files();
        self.held_entries = (held.done.iter().enumerate())
            .filter(|(_, d)| **d)
            .map(|(i, _)| i as u32)
            .collect();
        self.skips = skips;
        Ok(())
    }

    /// Bytes of file data the destination already held.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Files the destination already held whole.
    pub fn held_files(&self) -> u64 {
        self.held_files
    }

    /// Their manifest entries, in order.
    pub fn held_entries(&self) -> &[u32] {
        &self.held_entries
    }

    /// Files that could not be sent, with why, in layout order; then, when
    /// [`FileSource::report_skipped`] was given a count, the marker
    /// `FailedFile { entry: u32::MAX, message: count }` (docs/protocol.md, "Sync").
    pub fn failed(&self) -> Vec<FailedFile> {
        let b = self.bound.read();
        let mut v: Vec<FailedFile> = self
            .failed
            .lock()
            .iter()
            .map(|(&f, m)| FailedFile {
                entry: b.layout.files()[f as usize].entry,
                message: m.clone(),
            })
            .collect();
        if self.skipped_report > 0 {
            v.push(FailedFile {
                entry: SKIPPED_MARKER,
                message: self.skipped_report.to_string(),
            });
        }
        v
    }

    /// Reports `n` entries the walk skipped (special files, vanished files) in the
    /// send report, for a client that asked ([`dmover_proto::control::PullFiltered`]).
    pub fn report_skipped(&mut self, n: u64) {
        self.skipped_report = n;
    }

    /// Reports unreadable files and goes on (see the module docs).
    pub fn set_continue_on_error(&mut self, on: bool) {
        self.opts.continue_on_error = on;
    }

    /// The dataset layout (of a growing manifest: so far).
    pub fn layout(&self) -> Arc<Layout> {
        self.bound.read().layout.clone()
    }

    /// The walked tree (of a growing manifest: so far). Holds the source's entries
    /// locked against growth until dropped.
    pub fn tree(&self) -> MappedRwLockReadGuard<'_, Tree> {
        RwLockReadGuard::map(self.bound.read(), |b| &b.tree)
    }

    /// (growing manifest) Adds a later part of the manifest: `entries`, numbered
    /// after every earlier part's (parents among them or earlier), laid out on fresh
    /// chunks of `chunk` bytes (at most the session's, see [`Layout::extend_with`])
    /// after the earlier parts'; `sparse`: its files that may have holes (a live
    /// walk's part). Returns the layout's length in chunks with the part.
    pub fn grow(
        &self,
        entries: Vec<dmover_proto::manifest::Entry>,
        sparse: &[u32],
        chunk: u32,
    ) -> Result<u64> {
        let mut b = self.bound.write();
        let from = b.tree.entries().len();
        b.tree.extend(entries);
        let added = b.tree.add_sparse(from, sparse);
        let Bound {
            tree,
            layout,
            extents,
        } = &mut *b;
        extents.extend(added.iter().map(|&e| (e, OnceLock::new())));
        Arc::make_mut(layout)
            .extend_with(tree.entries(), from, chunk)
            .map_err(|e| {
                Error::refused(dmover_proto::control::ErrorCode::Protocol, e.to_string())
            })?;
        Ok(layout.n_chunks())
    }

    /// Whether checksums are on.
    pub fn checksum(&self) -> bool {
        self.opts.checksum
    }

    /// Reads a piece; with `continue_on_error` a file that cannot be read is recorded
    /// as failed and its piece zeroed (`Ok(false)`).
    fn read_or_fail(&self, b: &Bound, p: &Piece, buf: &mut [u8]) -> Result<bool> {
        if self.opts.continue_on_error && self.failed.lock().contains_key(&p.file) {
            buf[p.buf_offset..p.buf_offset + p.len].fill(0);
            return Ok(false);
        }
        match self.read_piece(b, p, buf) {
            Ok(()) => Ok(true),
            Err(e) if self.opts.continue_on_error => {
                let msg = e.to_string();
                if let std::collections::btree_map::Entry::Vacant(v) =
                    self.failed.lock().entry(p.file)
                {
                    tracing::warn!("skipping a file: {msg}");
                    v.insert(msg);
                }
                buf[p.buf_offset..p.buf_offset + p.len].fill(0);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn read_piece(&self, b: &Bound, p: &Piece, buf: &mut [u8]) -> Result<()> {
        let slot = b.layout.files()[p.file as usize];
        let path = || b.tree.display(slot.entry);
        let (dir, name) = b
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening", path(), e))?;
        let fd = sys::open_regular(&*dir, name).map_err(|e| {
            if sys::is_not_regular(&e) {
                // Swapped for a FIFO, device or directory since the walk.
                Error::Changed {
                    path: path(),
                    what: sys::NOT_REGULAR.into(),
                }
            } else {
                Error::io("opening", path(), e)
            }
        })?;
        if Self::in_hole(b, slot.entry, &fd, p.file_offset, p.len as u64, slot.size) {
            buf[p.buf_offset..p.buf_offset + p.len].fill(0);
        } else {
            self.read_data(b, p, &fd, buf, &path)?;
        }
        if p.last {
            let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("reading", path(), e))?;
            if st.st_size as u64 != slot.size {
                return Err(Error::Changed {
                    path: path(),
                    what: format!("size went from {} to {} bytes", slot.size, st.st_size),
                });
            }
            let m = b.tree.entries()[slot.entry as usize].mtime;
            if st.st_mtime != m.sec || st.st_mtime_nsec as u32 != m.nsec {
                return Err(Error::Changed {
                    path: path(),
                    what: "it was modified while being read".into(),
                });
            }
        }
        Ok(())
    }

    /// Whether `[offset, offset + len)` of file `entry` (open as `fd`) lies wholly in
    /// a hole: only a sparse file's can. Its extents are found at the first call; a
    /// file that cannot be sought counts as all data.
    fn in_hole(b: &Bound, entry: u32, fd: &OwnedFd, offset: u64, len: u64, size: u64) -> bool {
        if b.extents.is_empty() {
            return false;
        }
        let Some(cell) = b.extents.get(&entry) else {
            return false;
        };
        let extents =
            cell.get_or_init(|| sys::data_extents(fd, size).unwrap_or_else(|_| vec![(0, size)]));
        !sys::has_data(extents, offset, offset + len)
    }

    /// Whether piece `p`, just read, lay wholly in a hole of a sparse file (its extents
    /// are known by then).
    fn known_hole(&self, b: &Bound, p: &Piece) -> bool {
        let slot = b.layout.files()[p.file as usize];
        b.extents
            .get(&slot.entry)
            .and_then(|c| c.get())
            .is_some_and(|ext| !sys::has_data(ext, p.file_offset, p.file_offset + p.len as u64))
    }

    /// Reads a piece's bytes (direct I/O where it pays).
    fn read_data(
        &self,
        b: &Bound,
        p: &Piece,
        fd: &OwnedFd,
        buf: &mut [u8],
        path: &dyn Fn() -> String,
    ) -> Result<()> {
        let slot = b.layout.files()[p.file as usize];
        let mut direct = p.aligned
            && !self.direct_failed.load(Ordering::Relaxed)
            && match self.opts.direct_io {
                DirectIo::Never => false,
                DirectIo::Always => true,
                // Cold data: straight from the device, no page cache churn. Data
                // already cached (just written, or read before) is cheaper to copy.
                DirectIo::Auto => !sys::is_cached(fd, p.file_offset),
            };
        if direct {
            if let Err(e) = rustix::fs::fcntl_setfl(fd, OFlags::RDONLY | OFlags::DIRECT) {
                self.note_direct_failed(&path(), &e.into());
                direct = false;
            }
        }
        let want = if direct { p.direct_len() } else { p.len };
        let got = match sys::pread_full(
            fd,
            &mut buf[p.buf_offset..p.buf_offset + want],
            p.file_offset,
        ) {
            Err(e) if direct && sys::is_direct_unsupported(&e) => {
                self.note_direct_failed(&path(), &e);
                let _ = rustix::fs::fcntl_setfl(fd, OFlags::RDONLY);
                sys::pread_full(
                    fd,
                    &mut buf[p.buf_offset..p.buf_offset + p.len],
                    p.file_offset,
                )
            }
            r => r,
        }
        .map_err(|e| Error::io("reading", path(), e))?;
        if got < p.len {
            return Err(Error::Changed {
                path: path(),
                what: format!(
                    "it is now shorter than the {} bytes it had when the transfer started",
                    slot.size
                ),
            });
        }
        Ok(())
    }

    fn note_direct_failed(&self, path: &str, e: &std::io::Error) {
        if !self.direct_failed.swap(true, Ordering::Relaxed) {
            tracing::warn!("direct I/O is not supported for {path} ({e}); using buffered reads");
        }
    }
}

impl Source for FileSource {
    fn layout(&self) -> Arc<Layout> {
        FileSource::layout(self)
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        // The first part's (a growing manifest's later parts are all sent).
        let layout = self.layout();
        let chunks: Vec<u64> = self.skips.chunks(&layout).collect();
        Box::new(chunks.into_iter())
    }

    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<ChunkRead> {
        digests.clear();
        let mut n_digests = 0;
        let mut crc = 0u32;
        let b = self.bound.read();
        let mut zeros = !b.extents.is_empty();
        for p in b.layout.pieces(k) {
            let ok = self.read_or_fail(&b, &p, buf)?;
            zeros = zeros && ok && self.known_hole(&b, &p);
            let data = &buf[p.buf_offset..p.buf_offset + p.len];
            if self.opts.checksum {
                // The wire payload is the pieces back to back, so a running CRC over
                // them in order is the payload's CRC.
                crc = crc32c_append(crc, data);
            }
            if !ok {
                digests.push(DigestEntry::failure(p.file));
                n_digests += 1;
            } else if self.opts.checksum && !self.skips.piece_held(p.file, p.index) {
                let n = b.layout.n_pieces(p.file);
                if let Some(digest) = self.digests.piece(p.file, p.index, n, piece_hash(data)) {
                    digests.push(DigestEntry {
                        file: p.file,
                        digest,
                    });
                    n_digests += 1;
                }
            }
        }
        Ok(ChunkRead {
            crc: self.opts.checksum.then_some(crc),
            n_digests,
            zeros,
        })
    }

    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> Result<()> {
        let mut again = 0u32;
        let b = self.bound.read();
        for p in b.layout.pieces(k) {
            self.read_or_fail(&b, &p, buf)?;
            if crc.is_some() {
                again = crc32c_append(again, &buf[p.buf_offset..p.buf_offset + p.len]);
            }
        }
        if crc.is_some_and(|c| c != again) {
            let first = b.layout.pieces(k).next().map(|p| p.file).unwrap_or(0);
            return Err(Error::Changed {
                path: b.tree.display(b.layout.files()[first as usize].entry),
                what: format!("chunk {k} reads differently than when it was first sent"),
            });
        }
        Ok(())
    }
}
