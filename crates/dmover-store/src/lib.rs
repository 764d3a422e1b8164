//! dmover's storage: everything that touches the disk, and nothing that touches the
//! network.
//!
//! - [`tree`], [`paths`], [`sys`]: every file operation goes through directory handles,
//!   so a server never follows a path out of its root.
//! - [`walk`]: a source tree into a manifest; [`filter`]: rsync-style include/exclude
//!   rules and `--files-from`, applied during the walk; [`prune`]: `sync --delete`.
//! - [`Source`] and [`Sink`] ([`chunk`]): the two sides of the chunk pipeline. A source
//!   fills a caller's chunk buffer with the pieces the layout puts in it and hashes them;
//!   a sink writes a received chunk at the layout's offsets, verifies each file as it
//!   completes, and finishes or aborts the transfer. [`source::FileSource`] and
//!   [`sink::FileSink`] are the file-backed ones, [`mem::MemSource`] and
//!   [`mem::MemSink`] in-memory ones for tests and benchmarks.
//! - [`journal`], [`resume`], [`track`]: what an interrupted transfer left, what both
//!   sides agree to skip, and per-file digests while pieces move.
//! - [`catalog`]: the checksums file catalogs use (adler32, MD5, CRC32C), combined
//!   from pieces and cached in a reserved xattr.
//! - [`verify`]: comparing two trees (tests, the demo, benchmark copies).
//! - [`Error`]: the storage error, wrapped transparently by `dmover_core::Error`.

#![deny(clippy::too_many_lines)]

pub mod catalog;
pub mod chunk;
pub mod error;
pub mod fault;
pub mod filter;
pub mod journal;
pub mod mem;
pub mod meta;
pub mod paths;
pub mod prune;
pub mod resume;
pub mod sink;
pub mod source;
pub mod sys;
pub mod track;
pub mod tree;
pub mod verify;
pub mod walk;

pub use chunk::{ChunkRead, Sink, Source};
pub use error::{Error, Result};

pub use dmover_proto::control::DirectIo;
