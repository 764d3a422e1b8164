//! The data pipelines: disk stage ↔ buffer pool ↔ N data streams.
//!
//! ```text
//! source:  feeder ──empty buf──▶ disk pool (read_chunk) ──filled──▶ queue ──▶ stream task × N ──▶ TCP
//! dest:    TCP ──▶ stream task × N ──filled buf──▶ disk pool (write_chunk) ──▶ buffer back to pool
//! ```
//! Chunks go to whichever stream is free, so a slow stream never stalls the others.
//! The pool bounds memory; the disk pool bounds threads. The first error cancels the
//! whole session and is the one reported (see [`Run::fail`]).

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dmover_net::NetError;
use dmover_proto::control::Summary;
use dmover_proto::data::{DIGEST_LEN, FrameHeader, FrameKind, FrameLimits, HEADER_LEN};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::diskpool::DiskPool;
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolBuf};
use crate::sink::Sink;
use crate::source::Source;

/// Live counters of a session, for progress display and summaries.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes the transfer will move, once known (0 before).
    pub total: AtomicU64,
    /// Payload bytes that crossed the data streams.
    pub bytes: AtomicU64,
    /// Chunks that crossed the data streams.
    pub chunks: AtomicU64,
}

/// Shared state of one running session: cancellation, the first error, counters.
#[derive(Debug, Default)]
pub struct Run {
    cancel: CancellationToken,
    error: Mutex<Option<Error>>,
    /// Live counters.
    pub progress: Progress,
}

impl Run {
    /// A new run.
    pub fn new() -> Arc<Self> {
        Arc::new(Run::default())
    }

    /// Records an error and cancels the session. Of several errors the most telling
    /// is kept (see [`Error::rank`]); ties keep the first.
    pub fn fail(&self, e: Error) {
        let mut slot = self.error.lock();
        match &*slot {
            Some(old) if old.rank() >= e.rank() => {}
            _ => *slot = Some(e),
        }
        drop(slot);
        self.cancel.cancel();
    }

    /// Whether the session has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the session is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The recorded error, if any.
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().take()
    }

    /// `Err` with the recorded error if the session failed.
    pub fn check(&self) -> Result<()> {
        match self.take_error() {
            Some(e) => Err(e),
            None if self.is_cancelled() => Err(Error::Aborted),
            None => Ok(()),
        }
    }
}

/// A data stream: any byte stream, plus a name for messages.
pub struct DataStream<S> {
    /// The connection.
    pub io: S,
    /// The peer, for messages.
    pub peer: String,
}

struct Filled {
    chunk: u64,
    buf: PoolBuf,
    crc: Option<u32>,
    n_digests: u32,
    trailer: Vec<u8>,
}

/// Sends every chunk of `source` over `streams`. Returns when every stream has sent
/// its `END` frame (or the first error).
pub async fn send<S>(
    disk: &Arc<DiskPool>,
    source: Arc<Source>,
    pool: Pool,
    streams: Vec<DataStream<S>>,
    run: Arc<Run>,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let n = source.layout().n_chunks();
    let (qtx, qrx) = async_channel::bounded::<Filled>(pool.count().max(1));
    let read = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|s| {
            let (q, src, run) = (qrx.clone(), source.clone(), run.clone());
            tokio::spawn(async move {
                if let Err(e) = send_stream(s, q, &src, &run).await {
                    run.fail(e);
                }
            })
        })
        .collect();
    drop(qrx);
    if n == 0 {
        qtx.close();
    }
    for k in 0..n {
        let buf = tokio::select! {
            _ = run.cancelled() => break,
            b = pool.get() => b,
        };
        let (src, q, run, read) = (source.clone(), qtx.clone(), run.clone(), read.clone());
        disk.spawn(move || {
            if !run.is_cancelled() {
                let mut buf = buf;
                let mut trailer = Vec::new();
                match src.read_chunk(k, &mut buf, &mut trailer) {
                    Ok(r) => {
                        let _ = q.try_send(Filled {
                            chunk: k,
                            buf,
                            crc: r.crc,
                            n_digests: r.n_digests,
                            trailer,
                        });
                    }
                    Err(e) => run.fail(e),
                }
            }
            if read.fetch_add(1, Ordering::AcqRel) + 1 == n {
                q.close();
            }
        });
    }
    drop(qtx);
    for t in tasks {
        if let Err(e) = t.await {
            run.fail(Error::refused(
                dmover_proto::control::ErrorCode::Aborted,
                format!("a stream task failed: {e}"),
            ));
        }
    }
    run.check()
}

pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut bufs: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

async fn send_stream<S>(
    mut s: DataStream<S>,
    queue: async_channel::Receiver<Filled>,
    source: &Source,
    run: &Run,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let layout = source.layout();
    let mut segments = Vec::new();
    let mut sent = 0u64;
    let io_err = |e| Error::Net(NetError::io("sending data to", &s.peer, e));
    loop {
        let item = tokio::select! {
            biased;
            _ = run.cancelled() => return Err(Error::Aborted),
            r = queue.recv() => match r {
                Ok(item) => item,
                Err(_) => break,
            },
        };
        let payload = layout.wire_len(item.chunk);
        let header = FrameHeader {
            kind: FrameKind::Chunk,
            chunk: item.chunk,
            n_digests: item.n_digests,
            payload_len: payload as u32,
            crc: item.crc,
        }
        .encode();
        layout.segments(item.chunk, &mut segments);
        let mut iov = Vec::with_capacity(2 + segments.len());
        iov.push(IoSlice::new(&header));
        iov.push(IoSlice::new(&item.trailer));
        iov.extend(
            segments
                .iter()
                .map(|&(o, l)| IoSlice::new(&item.buf[o..o + l])),
        );
        let w = tokio::select! {
            biased;
            _ = run.cancelled() => return Err(Error::Aborted),
            w = write_all_vectored(&mut s.io, &mut iov) => w,
        };
        w.map_err(io_err)?;
        run.progress.bytes.fetch_add(payload, Ordering::Relaxed);
        run.progress.chunks.fetch_add(1, Ordering::Relaxed);
        sent += 1;
    }
    s.io.write_all(&FrameHeader::end(sent).encode())
        .await
        .map_err(io_err)?;
    s.io.flush().await.map_err(io_err)?;
    Ok(())
}

/// A set of flags, one per chunk, set at most once.
struct Seen(Vec<AtomicU64>);

impl Seen {
    fn new(n: u64) -> Self {
        Seen((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// Sets flag `k`; false if it was already set.
    fn insert(&self, k: u64) -> bool {
        let bit = 1u64 << (k % 64);
        self.0[(k / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
}

struct RecvShared {
    sink: Arc<Sink>,
    disk: Arc<DiskPool>,
    pool: Pool,
    run: Arc<Run>,
    seen: Seen,
    /// Chunks not yet written to disk.
    pending: AtomicU64,
    all_written: tokio::sync::Notify,
}

/// Receives every chunk of `sink`'s layout over `streams` and finishes the sink.
pub async fn receive<S>(
    disk: &Arc<DiskPool>,
    sink: Arc<Sink>,
    pool: Pool,
    streams: Vec<DataStream<S>>,
    run: Arc<Run>,
) -> Result<Summary>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let n = sink.layout().n_chunks();
    let shared = Arc::new(RecvShared {
        sink: sink.clone(),
        disk: disk.clone(),
        pool,
        run: run.clone(),
        seen: Seen::new(n),
        pending: AtomicU64::new(n),
        all_written: tokio::sync::Notify::new(),
    });
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|s| {
            let shared = shared.clone();
            tokio::spawn(async move {
                match recv_stream(s, &shared).await {
                    Ok(got) => got,
                    Err(e) => {
                        shared.run.fail(e);
                        0
                    }
                }
            })
        })
        .collect();
    let mut received = 0;
    for t in tasks {
        match t.await {
            Ok(got) => received += got,
            Err(e) => run.fail(Error::refused(
                dmover_proto::control::ErrorCode::Aborted,
                format!("a stream task failed: {e}"),
            )),
        }
    }
    run.check()?;
    if received != n {
        return Err(Error::protocol(
            "the source",
            format!("streams ended after {received} of {n} chunks"),
        ));
    }
    if shared.pending.load(Ordering::Acquire) != 0 {
        tokio::select! {
            _ = run.cancelled() => {}
            _ = shared.all_written.notified() => {}
        }
    }
    run.check()?;
    disk.run(move || sink.finish())
        .await
        .unwrap_or(Err(Error::Aborted))
}

async fn recv_stream<S>(mut s: DataStream<S>, sh: &Arc<RecvShared>) -> Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let layout = sh.sink.layout();
    let n = layout.n_chunks();
    let limits = FrameLimits {
        max_payload: layout.chunk_size() as u32,
        max_digests: layout.chunk_size() as u32,
    };
    let peer = s.peer.clone();
    let io_err = |e| Error::Net(NetError::io("receiving data from", &peer, e));
    let proto_err = |what: String| Error::protocol(&peer, what);
    let mut segments = Vec::new();
    let mut got = 0u64;
    loop {
        let mut hb = [0u8; HEADER_LEN];
        tokio::select! {
            biased;
            _ = sh.run.cancelled() => return Err(Error::Aborted),
            r = s.io.read_exact(&mut hb) => { r.map_err(io_err)?; }
        }
        let h =
            FrameHeader::decode(&hb, &limits).map_err(|e| Error::Net(NetError::proto(&peer, e)))?;
        if h.kind == FrameKind::End {
            if h.chunk != got {
                return Err(proto_err(format!(
                    "stream says it sent {} chunks, {got} arrived",
                    h.chunk
                )));
            }
            return Ok(got);
        }
        let k = h.chunk;
        if k >= n {
            return Err(proto_err(format!(
                "chunk {k} out of range (the dataset has {n})"
            )));
        }
        if !sh.seen.insert(k) {
            return Err(proto_err(format!("chunk {k} sent twice")));
        }
        let expected = layout.wire_len(k);
        if u64::from(h.payload_len) != expected {
            return Err(proto_err(format!(
                "chunk {k} has {} bytes, the layout says {expected}",
                h.payload_len
            )));
        }
        let pieces = layout.pieces(k).count() as u64;
        if u64::from(h.n_digests) > pieces {
            return Err(proto_err(format!(
                "chunk {k} carries {} digests for {pieces} files",
                h.n_digests
            )));
        }
        let mut trailer = vec![0u8; h.n_digests as usize * DIGEST_LEN];
        let mut buf = tokio::select! {
            biased;
            _ = sh.run.cancelled() => return Err(Error::Aborted),
            b = async {
                s.io.read_exact(&mut trailer).await?;
                Ok::<_, std::io::Error>(sh.pool.get().await)
            } => b.map_err(io_err)?,
        };
        layout.segments(k, &mut segments);
        for &(off, len) in &segments {
            tokio::select! {
                biased;
                _ = sh.run.cancelled() => return Err(Error::Aborted),
                r = s.io.read_exact(&mut buf[off..off + len]) => { r.map_err(io_err)?; }
            }
        }
        sh.run.progress.bytes.fetch_add(expected, Ordering::Relaxed);
        sh.run.progress.chunks.fetch_add(1, Ordering::Relaxed);
        got += 1;
        let job = sh.clone();
        let crc = h.crc;
        sh.disk.spawn(move || {
            if !job.run.is_cancelled() {
                if let Err(e) = job.sink.write_chunk(k, &buf, &trailer, crc) {
                    job.run.fail(e);
                }
            }
            drop(buf);
            if job.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                job.all_written.notify_one();
            }
        });
    }
}
