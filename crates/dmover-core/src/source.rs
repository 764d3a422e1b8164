//! The source side's disk stage: fill a chunk buffer from the files the layout puts in
//! it, hashing each piece on the way.

use std::sync::atomic::{AtomicBool, Ordering};

use dmover_proto::data::DigestEntry;
use dmover_proto::digest::{crc32c_append, piece_hash};
use dmover_proto::layout::{Layout, Piece};
use rustix::fs::OFlags;

use crate::DirectIo;
use crate::error::{Error, Result};
use crate::sys;
use crate::track::SendTracker;
use crate::tree::Tree;

/// What reading a chunk produced besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRead {
    /// CRC32C of the wire payload (with checksums on).
    pub crc: Option<u32>,
    /// Digest entries appended to the trailer.
    pub n_digests: u32,
}

/// Options of the source side.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceOptions {
    /// Compute chunk CRCs and file digests.
    pub checksum: bool,
    /// When to read aligned files with `O_DIRECT` (falls back if the file system
    /// refuses).
    pub direct_io: DirectIo,
    /// Test hook: sleep this long before reading each chunk.
    pub chunk_delay: Option<std::time::Duration>,
}

/// The source side of a session: a walked tree, its layout and options.
#[derive(Debug)]
pub struct Source {
    tree: Tree,
    layout: Layout,
    opts: SourceOptions,
    digests: SendTracker,
    direct_failed: AtomicBool,
}

impl Source {
    /// A source over `tree` cut into `chunk_size` chunks.
    pub fn new(tree: Tree, chunk_size: u32, opts: SourceOptions) -> Result<Self> {
        let layout = Layout::new(tree.entries(), chunk_size).map_err(|e| {
            Error::refused(dmover_proto::control::ErrorCode::Protocol, e.to_string())
        })?;
        Ok(Source {
            tree,
            layout,
            opts,
            digests: SendTracker::default(),
            direct_failed: AtomicBool::new(false),
        })
    }

    /// The dataset layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The walked tree.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Whether checksums are on.
    pub fn checksum(&self) -> bool {
        self.opts.checksum
    }

    /// Reads chunk `k` into `buf` (at least the chunk size), appending digest entries
    /// of files it completes to `trailer`.
    pub fn read_chunk(&self, k: u64, buf: &mut [u8], trailer: &mut Vec<u8>) -> Result<ChunkRead> {
        if let Some(d) = self.opts.chunk_delay {
            std::thread::sleep(d);
        }
        trailer.clear();
        let mut n_digests = 0;
        let mut crc = 0u32;
        for p in self.layout.pieces(k) {
            self.read_piece(&p, buf)?;
            let data = &buf[p.buf_offset..p.buf_offset + p.len];
            if self.opts.checksum {
                // The wire payload is the pieces back to back, so a running CRC over
                // them in order is the payload's CRC.
                crc = crc32c_append(crc, data);
                let n = self.layout.n_pieces(p.file);
                if let Some(digest) = self.digests.piece(p.file, p.index, n, piece_hash(data)) {
                    DigestEntry {
                        file: p.file,
                        digest,
                    }
                    .encode_into(trailer);
                    n_digests += 1;
                }
            }
        }
        Ok(ChunkRead {
            crc: self.opts.checksum.then_some(crc),
            n_digests,
        })
    }

    fn read_piece(&self, p: &Piece, buf: &mut [u8]) -> Result<()> {
        let slot = self.layout.files()[p.file as usize];
        let path = || self.tree.display(slot.entry);
        let (dir, name) = self
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening", path(), e))?;
        let fd = sys::open_in(&*dir, name, OFlags::RDONLY, 0)
            .map_err(|e| Error::io("opening", path(), e))?;
        let mut direct = p.aligned
            && !self.direct_failed.load(Ordering::Relaxed)
            && match self.opts.direct_io {
                DirectIo::Never => false,
                DirectIo::Always => true,
                // Cold data: straight from the device, no page cache churn. Data
                // already cached (just written, or read before) is cheaper to copy.
                DirectIo::Auto => !sys::is_cached(&fd, p.file_offset),
            };
        if direct {
            if let Err(e) = rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY | OFlags::DIRECT) {
                self.note_direct_failed(&path(), &e.into());
                direct = false;
            }
        }
        let want = if direct { p.direct_len() } else { p.len };
        let got = match sys::pread_full(
            &fd,
            &mut buf[p.buf_offset..p.buf_offset + want],
            p.file_offset,
        ) {
            Err(e) if direct && sys::is_direct_unsupported(&e) => {
                self.note_direct_failed(&path(), &e);
                let _ = rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY);
                sys::pread_full(
                    &fd,
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
        if p.last {
            let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("reading", path(), e))?;
            if st.st_size as u64 != slot.size {
                return Err(Error::Changed {
                    path: path(),
                    what: format!("size went from {} to {} bytes", slot.size, st.st_size),
                });
            }
        }
        Ok(())
    }

    fn note_direct_failed(&self, path: &str, e: &std::io::Error) {
        if !self.direct_failed.swap(true, Ordering::Relaxed) {
            tracing::warn!("direct I/O is not supported for {path} ({e}); using buffered reads");
        }
    }
}
