//! The destination side's disk stage: write received chunks into staging files and give
//! each file its final name once it is complete and verified.
//!
//! # Lifecycle
//! 1. [`Sink::prepare`] creates the directories (owner-only until the end).
//! 2. [`Sink::write_chunk`], from any disk thread, in any chunk order: check the chunk's
//!    CRC, write each piece into its file's staging name
//!    (`.dmv.<session>.<entry>.<name>` in the same directory), fold the piece's hash
//!    into the file's digest, record digests the source sent. A file whose pieces are
//!    all written and whose digests match is finalised at once: truncated to size
//!    (after rounded direct-I/O writes), mode and mtime set, renamed into place.
//! 3. [`Sink::finish`] creates empty files and symlinks (also via staging names), sets
//!    directory modes and mtimes deepest first, and checks that every file arrived.
//!
//! A sink dropped before `finish` succeeded removes the staging files of every file
//! still in flight: a failed transfer leaves no partial file under a final name, and
//! no debris under a staging one.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dmover_proto::control::{ErrorCode, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::{crc32c_append, piece_hash};
use dmover_proto::layout::{Layout, Piece};
use dmover_proto::manifest::{EntryKind, MAX_NAME};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::DirectIo;
use crate::error::{Error, Result};
use crate::sys;
use crate::track::{Complete, RecvTracker, TrackError};
use crate::tree::Tree;

/// Files at least this large are preallocated before their first write.
const PREALLOC_MIN: u64 = 1 << 20;

/// Options of the destination side.
#[derive(Debug, Clone, Copy, Default)]
pub struct SinkOptions {
    /// Verify chunk CRCs and file digests.
    pub checksum: bool,
    /// When to write aligned files with `O_DIRECT` (falls back if the file system
    /// refuses). `Auto` writes direct: received data is not read again soon.
    pub direct_io: DirectIo,
    /// `fsync` each file before renaming it into place.
    pub fsync: bool,
    /// Test hook: sleep this long before writing each chunk.
    pub chunk_delay: Option<std::time::Duration>,
}

/// A staging file just written.
struct Staged {
    fd: std::os::fd::OwnedFd,
    /// Created with its final mode already.
    mode_set: bool,
}

/// The destination side of a session.
#[derive(Debug)]
pub struct Sink {
    tree: Tree,
    layout: Layout,
    session: u64,
    opts: SinkOptions,
    tracker: RecvTracker,
    direct_failed: AtomicBool,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    chunks_done: AtomicU64,
    finished: AtomicBool,
}

impl Sink {
    /// A sink writing `tree` (bound to destination handles) for session `session`.
    pub fn new(tree: Tree, chunk_size: u32, session: u64, opts: SinkOptions) -> Result<Self> {
        let layout = Layout::new(tree.entries(), chunk_size)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        Ok(Sink {
            tree,
            layout,
            session,
            opts,
            tracker: RecvTracker::new(opts.checksum),
            direct_failed: AtomicBool::new(false),
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            chunks_done: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        })
    }

    /// The dataset layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether checksums are on.
    pub fn checksum(&self) -> bool {
        self.opts.checksum
    }

    fn staging_name(&self, entry: u32, name: &[u8]) -> Vec<u8> {
        let mut s = format!(".dmv.{:016x}.{entry:x}.", self.session).into_bytes();
        let room = MAX_NAME.saturating_sub(s.len()).min(name.len());
        s.extend_from_slice(&name[..room]);
        s
    }

    /// Creates every directory of the manifest, owner-only until [`Sink::finish`]
    /// gives them their modes. Existing directories are reused.
    pub fn prepare(&self) -> Result<()> {
        for (i, e) in self.tree.entries().iter().enumerate() {
            if e.kind != EntryKind::Dir {
                continue;
            }
            let i = i as u32;
            let path = || self.tree.display(i);
            let (dir, name) = self
                .tree
                .locate(i)
                .map_err(|e| Error::io("opening the parent of", path(), e))?;
            match rustix::fs::mkdirat(&*dir, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(Errno::EXIST) => {
                    let st = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| Error::io("checking", path(), e))?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                        return Err(Error::refused(
                            ErrorCode::Io,
                            format!("{} exists and is not a directory", path()),
                        ));
                    }
                }
                Err(e) => return Err(Error::io("creating directory", path(), e)),
            }
        }
        Ok(())
    }

    /// Writes chunk `k`, whose wire payload has been placed in `buf` at the layout's
    /// offsets, with the digest `trailer` and `crc` from its frame.
    pub fn write_chunk(&self, k: u64, buf: &[u8], trailer: &[u8], crc: Option<u32>) -> Result<()> {
        if let Some(d) = self.opts.chunk_delay {
            std::thread::sleep(d);
        }
        if self.opts.checksum {
            let Some(want) = crc else {
                return Err(Error::protocol(
                    "the source",
                    format!("chunk {k} carries no CRC"),
                ));
            };
            let got = self.layout.pieces(k).fold(0, |c, p| {
                crc32c_append(c, &buf[p.buf_offset..p.buf_offset + p.len])
            });
            if got != want {
                return Err(Error::Checksum(format!(
                    "chunk {k} arrived corrupted (CRC32C {got:08x}, sent as {want:08x})"
                )));
            }
        }
        // Digests first: a file held whole by this chunk then completes as its data is
        // written, and is finalised through the descriptor already open.
        let digests = DigestEntry::decode_all(trailer)
            .map_err(|e| Error::protocol("the source", format!("chunk {k} digest trailer: {e}")))?;
        let mut pieces = self.layout.pieces(k).peekable();
        let mut previous = None;
        for d in digests {
            // Entries come in file order, each naming a file this chunk holds a piece of:
            // one merge pass checks both.
            if previous.is_some_and(|f| d.file <= f) {
                return Err(Error::protocol(
                    "the source",
                    format!("chunk {k}: digest entries out of order"),
                ));
            }
            previous = Some(d.file);
            while pieces.next_if(|p| p.file < d.file).is_some() {}
            if pieces.peek().map(|p| p.file) != Some(d.file) {
                return Err(Error::protocol(
                    "the source",
                    format!(
                        "chunk {k} carries a digest for file {} it holds no piece of",
                        d.file
                    ),
                ));
            }
            match self
                .tracker
                .expect(d.file, self.layout.n_pieces(d.file), d.digest)
            {
                Ok(Some(done)) => self.finalize(d.file, done, None)?,
                Ok(None) => {}
                Err(e) => return Err(self.track_error(d.file, e)),
            }
        }
        for p in self.layout.pieces(k) {
            let file = p.file;
            self.tracker.begin(file);
            let data = &buf[p.buf_offset..p.buf_offset + p.len];
            let hash = self.opts.checksum.then(|| piece_hash(data));
            let n = self.layout.n_pieces(file);
            let staged = self.write_piece(&p, n, buf)?;
            match self.tracker.written(file, p.index, n, hash) {
                Ok(Some(done)) => self.finalize(file, done, Some(staged))?,
                Ok(None) => {}
                Err(e) => return Err(self.track_error(file, e)),
            }
        }
        self.chunks_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn track_error(&self, file: u32, e: TrackError) -> Error {
        let path = self.tree.display(self.layout.files()[file as usize].entry);
        Error::protocol("the source", format!("{path}: {e:?}"))
    }

    /// Writes one piece into its file's staging file, creating it if needed; returns the
    /// open descriptor, for finalising the file if this piece completes it.
    fn write_piece(&self, p: &Piece, n_pieces: u64, buf: &[u8]) -> Result<Staged> {
        let slot = self.layout.files()[p.file as usize];
        let path = || self.tree.display(slot.entry);
        let (dir, name) = self
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening the directory of", path(), e))?;
        let staging = self.staging_name(slot.entry, name);
        let mut direct = self.opts.direct_io != DirectIo::Never
            && p.aligned
            && !self.direct_failed.load(Ordering::Relaxed);
        // A file held whole by one piece is created with its final mode when the umask
        // lets it through (saving a chmod); others stay owner-writable until finalised,
        // since later pieces reopen them for writing.
        let mode = self.tree.entries()[slot.entry as usize].mode;
        let final_mode = n_pieces == 1 && mode & !sys::umask() == mode;
        let create_mode = if final_mode { mode } else { 0o600 };
        let fd = loop {
            let mut flags = OFlags::WRONLY | OFlags::CREATE;
            if direct {
                flags |= OFlags::DIRECT;
            }
            match sys::open_in(&*dir, &staging, flags, create_mode) {
                Ok(fd) => break fd,
                Err(e) if direct && sys::is_direct_unsupported(&e) => {
                    self.note_direct_failed(&path());
                    direct = false;
                }
                Err(e) => return Err(Error::io("creating", path(), e)),
            }
        };
        if p.index == 0 && slot.size >= PREALLOC_MIN {
            sys::preallocate(&fd, slot.size)
                .map_err(|e| Error::io("allocating space for", path(), e))?;
        }
        let exact = &buf[p.buf_offset..p.buf_offset + p.len];
        let r = if direct {
            // Rounded up to the alignment: the bytes past the piece land beyond the end
            // of the file (only a last piece can be unaligned) and are cut off when the
            // file is finalised.
            match sys::pwrite_all(
                &fd,
                &buf[p.buf_offset..p.buf_offset + p.direct_len()],
                p.file_offset,
            ) {
                Err(e) if sys::is_direct_unsupported(&e) => {
                    self.note_direct_failed(&path());
                    sys::pwrite_all(&fd, exact, p.file_offset)
                }
                r => r,
            }
        } else {
            sys::pwrite_all(&fd, exact, p.file_offset)
        };
        r.map_err(|e| Error::io("writing", path(), e))?;
        self.bytes_done.fetch_add(p.len as u64, Ordering::Relaxed);
        Ok(Staged {
            fd,
            mode_set: final_mode,
        })
    }

    fn note_direct_failed(&self, path: &str) {
        if !self.direct_failed.swap(true, Ordering::Relaxed) {
            tracing::warn!("direct I/O is not supported for {path}; using buffered writes");
        }
    }

    /// Gives a complete file its final name, if its digest matches. `staged` is the
    /// descriptor of the write that completed it, if that is how it completed.
    fn finalize(&self, file: u32, done: Complete, staged: Option<Staged>) -> Result<()> {
        let slot = self.layout.files()[file as usize];
        let entry = &self.tree.entries()[slot.entry as usize];
        let path = || self.tree.display(slot.entry);
        let (dir, name) = self
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening the directory of", path(), e))?;
        let staging = self.staging_name(slot.entry, name);
        if done.computed != done.expected {
            drop(staged);
            let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
            return Err(Error::Checksum(format!(
                "{}: received data has digest {:016x}, the source's is {:016x}",
                path(),
                done.computed.unwrap_or(0),
                done.expected.unwrap_or(0)
            )));
        }
        let Staged { fd, mode_set } = match staged {
            Some(s) => s,
            None => Staged {
                fd: sys::open_in(&*dir, &staging, OFlags::WRONLY, 0)
                    .map_err(|e| Error::io("opening", path(), e))?,
                mode_set: false,
            },
        };
        let meta = || -> std::io::Result<()> {
            if self.opts.direct_io != DirectIo::Never && slot.aligned() {
                // Cut what rounded direct writes put past the end.
                rustix::fs::ftruncate(&fd, slot.size)?;
            }
            if !mode_set {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(entry.mode))?;
            }
            sys::set_mtime_fd(&fd, entry.mtime.sec, entry.mtime.nsec)?;
            if self.opts.fsync {
                rustix::fs::fsync(&fd)?;
            }
            Ok(())
        };
        meta().map_err(|e| Error::io("finalising", path(), e))?;
        drop(fd);
        rustix::fs::renameat(&*dir, staging.as_slice(), &*dir, name)
            .map_err(|e| Error::io("finalising", path(), e))?;
        self.files_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sets metadata on a staging entry and renames it to its final name.
    fn install(
        &self,
        dir: &impl AsFd,
        staging: &[u8],
        name: &[u8],
        mode: u32,
        mtime: dmover_proto::manifest::Mtime,
        set_mode: bool,
    ) -> std::io::Result<()> {
        if set_mode {
            sys::set_mode(dir, staging, mode)?;
        }
        sys::set_mtime(dir, staging, mtime.sec, mtime.nsec)?;
        rustix::fs::renameat(dir, staging, dir, name)?;
        Ok(())
    }

    /// Completes the transfer once every chunk is written: empty files, symlinks,
    /// directory metadata, and the check that every file arrived.
    pub fn finish(&self) -> Result<Summary> {
        let expected_files = self.layout.files().len() as u64;
        let done_files = self.files_done.load(Ordering::Relaxed);
        if done_files != expected_files {
            let missing = self.tracker.in_flight();
            let example = missing
                .first()
                .map(|&f| self.tree.display(self.layout.files()[f as usize].entry))
                .unwrap_or_default();
            return Err(Error::protocol(
                "the source",
                format!(
                    "{} of {expected_files} files incomplete at the end of the transfer (e.g. {example})",
                    expected_files - done_files
                ),
            ));
        }
        let mut summary = Summary {
            bytes: self.bytes_done.load(Ordering::Relaxed),
            files: done_files,
            chunks: self.chunks_done.load(Ordering::Relaxed),
            verified: self.opts.checksum,
            ..Summary::default()
        };
        let entries = self.tree.entries();
        for (i, e) in entries.iter().enumerate() {
            let i = i as u32;
            let path = || self.tree.display(i);
            match &e.kind {
                EntryKind::File { size: 0 } => {
                    let (dir, name) = self
                        .tree
                        .locate(i)
                        .map_err(|e| Error::io("opening the directory of", path(), e))?;
                    let staging = self.staging_name(i, name);
                    let fd = sys::open_in(
                        &*dir,
                        &staging,
                        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
                        0o600,
                    )
                    .map_err(|e| Error::io("creating", path(), e))?;
                    drop(fd);
                    self.install(&*dir, &staging, name, e.mode, e.mtime, true)
                        .map_err(|err| {
                            let _ =
                                rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                            Error::io("finalising", path(), err)
                        })?;
                    summary.files += 1;
                }
                EntryKind::Symlink { target } => {
                    let (dir, name) = self
                        .tree
                        .locate(i)
                        .map_err(|e| Error::io("opening the directory of", path(), e))?;
                    let staging = self.staging_name(i, name);
                    let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                    rustix::fs::symlinkat(target.as_slice(), &*dir, staging.as_slice())
                        .map_err(|e| Error::io("creating symlink", path(), e))?;
                    self.install(&*dir, &staging, name, e.mode, e.mtime, false)
                        .map_err(|err| {
                            let _ =
                                rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                            Error::io("finalising", path(), err)
                        })?;
                    summary.symlinks += 1;
                }
                _ => {}
            }
        }
        // Directories last, deepest first: creating their contents changed their mtimes.
        for (i, e) in entries.iter().enumerate().rev() {
            if e.kind != EntryKind::Dir {
                continue;
            }
            let i = i as u32;
            let path = || self.tree.display(i);
            let (dir, name) = self
                .tree
                .locate(i)
                .map_err(|e| Error::io("opening the directory of", path(), e))?;
            sys::set_mode(&*dir, name, e.mode)
                .map_err(|e| Error::io("setting the mode of", path(), e))?;
            sys::set_mtime(&*dir, name, e.mtime.sec, e.mtime.nsec)
                .map_err(|e| Error::io("setting the mtime of", path(), e))?;
            summary.dirs += 1;
        }
        self.finished.store(true, Ordering::Release);
        Ok(summary)
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_done.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        let mut removed = 0;
        for f in self.tracker.in_flight() {
            let entry = self.layout.files()[f as usize].entry;
            if let Ok((dir, name)) = self.tree.locate(entry) {
                let staging = self.staging_name(entry, name);
                if rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty()).is_ok() {
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            tracing::info!("removed {removed} incomplete staging files");
        }
    }
}
