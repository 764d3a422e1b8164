//! One file of a server written to a stream as it arrives (`dmover cp HOST:PATH -`):
//! a pull whose sink's storage is a writer ([`WriterSink`]) instead of files. Each
//! chunk's CRC is checked before its bytes are written, the file's digest once its
//! last piece is (the end-to-end check every file gets); by then the bytes are in the
//! writer, so a failed check can only fail the transfer, as with curl or xrdcp.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use dmover_proto::control::{ErrorCode, Op, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::piece_hash;
use dmover_proto::layout::Layout;
use dmover_proto::manifest::{Entry, EntryKind};
use dmover_proto::session::{Limits, SinkSession};
use dmover_store::chunk::Sink;
use dmover_store::track::RecvTracker;
use parking_lot::Mutex;

use super::Client;
use crate::dialer::now;
use crate::drive::{self, SinkStore};
use crate::engine::Run;
use crate::error::{Error, Result};

/// Where the bytes go, in order: chunks that came early wait here (only after a lost
/// stream: a session of one stream brings them in order).
struct Out {
    w: Box<dyn Write + Send>,
    next: u64,
    early: BTreeMap<u64, Vec<u8>>,
}

/// A sink's storage that writes the manifest's one regular file to a writer, in order.
pub struct WriterSink {
    entries: Vec<Entry>,
    layout: Arc<Layout>,
    checksum: bool,
    tracker: RecvTracker,
    out: Mutex<Out>,
    bytes: AtomicU64,
    chunks: AtomicU64,
    done: AtomicU64,
}

impl WriterSink {
    /// The storage for `entries` (one regular file, else refused) in `chunk`-byte
    /// chunks, writing to `w`; with `checksum` the CRCs and the digest are checked.
    pub fn new(
        entries: Vec<Entry>,
        chunk: u32,
        checksum: bool,
        w: Box<dyn Write + Send>,
    ) -> Result<Self> {
        match entries.as_slice() {
            [e] if matches!(e.kind, EntryKind::File { .. }) => {}
            [e] => {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "{} is not a regular file: '-' (stdout) takes one file",
                        String::from_utf8_lossy(&e.name)
                    ),
                ));
            }
            _ => {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    "'-' (stdout) takes one file, and the source is several entries",
                ));
            }
        }
        let layout = Layout::new(&entries, chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        Ok(WriterSink {
            entries,
            layout: Arc::new(layout),
            checksum,
            tracker: RecvTracker::new(checksum),
            out: Mutex::new(Out {
                w,
                next: 0,
                early: BTreeMap::new(),
            }),
            bytes: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            done: AtomicU64::new(0),
        })
    }

    fn complete(&self, done: dmover_store::track::Complete) -> Result<()> {
        if done.computed != done.expected {
            return Err(Error::Store(dmover_store::Error::Checksum(format!(
                "{}: the data written to stdout has digest {:016x}, the source's is {:016x}: \
                 the output is corrupt",
                String::from_utf8_lossy(&self.entries[0].name),
                done.computed.unwrap_or(0),
                done.expected.unwrap_or(0)
            ))));
        }
        self.done.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Writes chunk `k`'s bytes, and those that waited for it.
    fn emit(&self, k: u64, data: Vec<u8>) -> Result<()> {
        let mut out = self.out.lock();
        if k != out.next {
            out.early.insert(k, data);
            return Ok(());
        }
        let io = |e: std::io::Error| Error::Store(dmover_store::Error::io("writing", "stdout", e));
        out.w.write_all(&data).map_err(io)?;
        out.next += 1;
        loop {
            let next = out.next;
            let Some(d) = out.early.remove(&next) else {
                break;
            };
            out.w.write_all(&d).map_err(io)?;
            out.next += 1;
        }
        out.w.flush().map_err(io)
    }
}

impl Sink for WriterSink {
    fn layout(&self) -> Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(0..self.layout.n_chunks())
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        use dmover_store::Error as E;
        if self.checksum {
            dmover_store::chunk::check_crc(&self.layout, k, buf, crc, "the source")?;
        }
        let bad = |what: String| E::protocol("the source", format!("chunk {k}: {what}"));
        let failed = |e: Error| match e {
            Error::Store(e) => e,
            other => E::Checksum(other.to_string()),
        };
        for d in digests {
            let file = d.index();
            if d.is_failure() || !self.layout.pieces(k).any(|p| p.file == file) {
                return Err(bad(format!("unexpected digest entry for file {file}")));
            }
            match self
                .tracker
                .expect(file, self.layout.n_pieces(file), d.digest)
            {
                Ok(Some(done)) => self.complete(done).map_err(failed)?,
                Ok(None) => {}
                Err(e) => return Err(bad(format!("file {file}: {e:?}"))),
            }
        }
        let mut data = Vec::with_capacity(buf.len());
        let mut completed = None;
        for p in self.layout.pieces(k) {
            let piece = &buf[p.buf_offset..p.buf_offset + p.len];
            data.extend_from_slice(piece);
            self.tracker.begin(p.file);
            let hash = self.checksum.then(|| piece_hash(piece));
            let n = self.layout.n_pieces(p.file);
            match self.tracker.written(p.file, p.index, n, hash) {
                Ok(done) => completed = completed.or(done),
                Err(e) => return Err(bad(format!("file {}: {e:?}", p.file))),
            }
        }
        self.bytes.fetch_add(data.len() as u64, Relaxed);
        self.emit(k, data).map_err(failed)?;
        // The digest is checked once the file's bytes are all out: a mismatch fails
        // the transfer (the output has them already).
        if let Some(done) = completed {
            self.complete(done).map_err(failed)?;
        }
        self.chunks.fetch_add(1, Relaxed);
        Ok(())
    }

    fn finish(&self) -> dmover_store::Result<Summary> {
        let empty = matches!(self.entries[0].kind, EntryKind::File { size: 0 });
        let written = self.out.lock().next;
        if !empty && (self.done.load(Relaxed) != 1 || written != self.layout.n_chunks()) {
            return Err(dmover_store::Error::protocol(
                "the source",
                "the file is incomplete at the end of the transfer",
            ));
        }
        Ok(Summary {
            bytes: self.bytes.load(Relaxed),
            files: 1,
            chunks: self.chunks.load(Relaxed),
            verified: self.checksum,
            ..Summary::default()
        })
    }

    fn abort(&self) {}
}

impl SinkStore for WriterSink {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.entries.as_slice()
    }
}

impl Client {
    /// Pulls the one regular file `source` on `server` and writes it to `w` as it
    /// arrives (one data stream, so that its chunks come in order), its CRCs and its
    /// digest checked; a tree is refused before any data. Not resumed, not retried:
    /// what was written cannot be taken back. Returns the bytes written.
    pub async fn pull_to_writer(
        &self,
        server: &str,
        source: &[u8],
        w: Box<dyn Write + Send>,
        run: Arc<Run>,
    ) -> Result<Summary> {
        let mut opts = self.opts.clone();
        opts.streams = 1;
        opts.tune = false;
        opts.resume = false;
        let one = self.dialer.with_options(opts);
        let op = Op::Pull {
            sources: vec![source.to_vec()],
        };
        let mut p = one.session(server, op, one.opts.chunk_size, &run).await?;
        p.dial.limits = one.limits(true);
        let m = SinkSession::dial(now(), server, p.timing, Limits::default(), p.dial);
        let checksum = one.opts.checksum;
        let prepare: drive::Prepare<WriterSink> =
            Box::new(move |entries, chunk, _| WriterSink::new(entries, chunk, checksum, w));
        let r = drive::sink(m, &mut p.ch, p.joins, prepare, Some(p.options), p.env).await?;
        Ok(r.summary)
    }
}
