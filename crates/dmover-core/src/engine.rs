//! The data pipelines: disk stage ↔ buffer pool ↔ N data streams.
//!
//! ```text
//! source:  feeder ──empty buf──▶ disk pool (read_chunk) ──filled──▶ queue ──▶ stream task × N ──▶ TCP
//! dest:    TCP ──▶ stream task × N ──filled buf──▶ disk pool (write_chunk) ──▶ buffer back to pool
//! ```
//! Chunks go to whichever stream is free, so a slow stream never stalls the others.
//! The pool bounds memory; the disk pool bounds threads. The first error cancels the
//! whole session and is the one reported (see [`Run::fail`]).
//!
//! A broken data stream is not an error while another one lives: the destination
//! acknowledges every chunk it has read whole (see [`dmover_proto::data`]), the source
//! keeps the chunks each stream has not acknowledged and, when a stream breaks (an I/O
//! error, the peer closing it, or no acknowledgement for `send`'s `stall`, by default
//! [`STREAM_STALL`]), reads them from disk again and sends them on the other streams.
//! The destination keeps the first whole copy of a chunk and drops later ones.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dmover_net::NetError;
use dmover_net::transport::{AckRx, ChunkFrame, ChunkTx, DataLink};
use dmover_proto::control::Summary;
use dmover_proto::data::{DIGEST_LEN, FrameHeader, FrameKind, FrameLimits};
use dmover_store::{Sink, Source};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::diskpool::DiskPool;
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolBuf};

/// Live counters of a transfer, for progress display and summaries. Shared by the
/// attempts of a transfer that is retried.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes the transfer will move, once known (0 before).
    pub total: AtomicU64,
    /// Payload bytes that crossed the data streams (resent chunks count again).
    pub bytes: AtomicU64,
    /// Chunks that crossed the data streams.
    pub chunks: AtomicU64,
    /// Bytes the destination already held when the latest attempt started.
    pub held: AtomicU64,
}

/// Shared state of one running session: cancellation, the first error, counters.
#[derive(Debug, Default)]
pub struct Run {
    cancel: CancellationToken,
    error: Mutex<Option<Error>>,
    /// Live counters.
    pub progress: Arc<Progress>,
}

impl Run {
    /// A new run.
    pub fn new() -> Arc<Self> {
        Arc::new(Run::default())
    }

    /// A run for one attempt of this transfer: cancelled when this one is, sharing
    /// its counters, with its own error.
    pub fn attempt(&self) -> Arc<Self> {
        Arc::new(Run {
            cancel: self.cancel.child_token(),
            error: Mutex::new(None),
            progress: self.progress.clone(),
        })
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

/// The default of [`send`]'s `stall`: a source stream that has not heard an
/// acknowledgement for this long while chunks are outstanding on it declares it broken
/// and sends them on the other streams.
pub const STREAM_STALL: Duration = Duration::from_secs(120);
/// Once every chunk has arrived, how long the destination's streams wait for their END
/// (in the background: the summary does not wait for it).
const END_GRACE: Duration = Duration::from_secs(30);

struct Filled {
    chunk: u64,
    buf: PoolBuf,
    crc: Option<u32>,
    trailer: Vec<u8>,
}

/// A chunk sent on a stream and not yet acknowledged: enough to send it again.
struct Sent {
    chunk: u64,
    crc: Option<u32>,
    trailer: Vec<u8>,
}

enum Job {
    Fresh(u64),
    Again(Sent),
}

/// What the source side's streams went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Chunks sent again because their stream broke before acknowledging them.
    pub chunks_resent: u64,
    /// Streams that broke.
    pub streams_lost: u32,
}

struct SendShared {
    run: Arc<Run>,
    filled: async_channel::Sender<Filled>,
    again: async_channel::Sender<Sent>,
    /// Chunks not yet acknowledged.
    outstanding: AtomicU64,
    live: AtomicUsize,
    resent: AtomicU64,
    lost: AtomicU32,
    all_acked: CancellationToken,
}

impl SendShared {
    fn acked(&self, n: u64) {
        if n > 0 && self.outstanding.fetch_sub(n, Ordering::AcqRel) == n {
            self.finish();
        }
    }

    fn finish(&self) {
        self.filled.close();
        self.all_acked.cancel();
    }

    /// A stream broke: its unacknowledged chunks go to the others.
    fn lost(&self, peer: &str, e: Error, unacked: VecDeque<Sent>) {
        let n = unacked.len() as u64;
        for s in unacked {
            let _ = self.again.try_send(s);
        }
        self.resent.fetch_add(n, Ordering::Relaxed);
        self.lost.fetch_add(1, Ordering::Relaxed);
        let live = self.live.fetch_sub(1, Ordering::AcqRel) - 1;
        if live == 0 {
            if self.outstanding.load(Ordering::Acquire) > 0 {
                self.run.fail(e);
            }
        } else {
            tracing::warn!(
                "data stream to {peer} broke ({e}); sending its {n} unacknowledged chunks on the other {live}"
            );
        }
    }
}

/// Sends the source's chunks over `streams`. Each stream's unacknowledged chunks are
/// sent again on the others if it breaks; returns once every chunk is acknowledged and
/// every live stream has sent its `END` frame (or at the first error). A stream with
/// chunks outstanding that hears no acknowledgement for `stall` is declared broken (a
/// connection that went silent without closing).
pub async fn send<S>(
    disk: &Arc<DiskPool>,
    source: Arc<dyn Source>,
    pool: Pool,
    streams: Vec<DataStream<S>>,
    run: Arc<Run>,
    stall: Duration,
) -> Result<SendStats>
where
    S: DataLink,
{
    let total = source.chunks().count() as u64;
    let (ftx, frx) = async_channel::bounded::<Filled>(pool.count().max(1));
    let (atx, arx) = async_channel::unbounded::<Sent>();
    let sh = Arc::new(SendShared {
        run: run.clone(),
        filled: ftx,
        again: atx,
        outstanding: AtomicU64::new(total),
        live: AtomicUsize::new(streams.len()),
        resent: AtomicU64::new(0),
        lost: AtomicU32::new(0),
        all_acked: CancellationToken::new(),
    });
    if total == 0 {
        sh.finish();
    }
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|s| {
            tokio::spawn(send_stream(
                s,
                frx.clone(),
                sh.clone(),
                source.clone(),
                stall,
            ))
        })
        .collect();
    drop(frx);
    let mut fresh = source.chunks();
    loop {
        let job = if let Ok(s) = arx.try_recv() {
            Job::Again(s)
        } else if let Some(k) = fresh.next() {
            Job::Fresh(k)
        } else {
            tokio::select! {
                biased;
                _ = run.cancelled() => break,
                _ = sh.all_acked.cancelled() => break,
                r = arx.recv() => match r {
                    Ok(s) => Job::Again(s),
                    Err(_) => break,
                },
            }
        };
        let buf = tokio::select! {
            biased;
            _ = run.cancelled() => break,
            _ = sh.all_acked.cancelled() => break,
            b = pool.get() => b,
        };
        let (src, sh) = (source.clone(), sh.clone());
        disk.spawn(move || {
            if sh.run.is_cancelled() {
                return;
            }
            let mut buf = buf;
            let filled = match job {
                Job::Fresh(k) => {
                    let mut trailer = Vec::new();
                    src.read_chunk(k, &mut buf, &mut trailer).map(|r| Filled {
                        chunk: k,
                        buf,
                        crc: r.crc,
                        trailer,
                    })
                }
                Job::Again(s) => src.reread_chunk(s.chunk, &mut buf, s.crc).map(|()| Filled {
                    chunk: s.chunk,
                    buf,
                    crc: s.crc,
                    trailer: s.trailer,
                }),
            };
            match filled {
                // The queue holds at most the pool's buffers: never full.
                Ok(f) => {
                    let _ = sh.filled.try_send(f);
                }
                Err(e) => sh.run.fail(e.into()),
            }
        });
    }
    drop(fresh);
    for t in tasks {
        if let Err(e) = t.await {
            run.fail(Error::refused(
                dmover_proto::control::ErrorCode::Aborted,
                format!("a stream task failed: {e}"),
            ));
        }
    }
    run.check()?;
    Ok(SendStats {
        chunks_resent: sh.resent.load(Ordering::Relaxed),
        streams_lost: sh.lost.load(Ordering::Relaxed),
    })
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
    s: DataStream<S>,
    queue: async_channel::Receiver<Filled>,
    sh: Arc<SendShared>,
    source: Arc<dyn Source>,
    stall: Duration,
) where
    S: DataLink,
{
    let peer = s.peer;
    // The acknowledgement reader below times itself (`stall`, only while chunks are
    // outstanding): a stream with nothing in flight, waiting for work while another
    // stream's chunks are sent again, is idle, not broken.
    let (mut tx, mut acks) = s.io.into_source();
    let unacked: Mutex<VecDeque<Sent>> = Mutex::new(VecDeque::new());
    // When the stream last made progress while chunks were outstanding: the moment the
    // first of them was queued to it, or the last acknowledgement.
    let since = Mutex::new(tokio::time::Instant::now());
    let written = AtomicU64::new(0);
    let run = &sh.run;
    // A stream that sent its first chunks before its join's answer reports a failed
    // join as the join would have (see `Error::data`).
    let io_err = |what, e| Error::data(what, &peer, e);
    let writer = async {
        let mut segments = Vec::new();
        let mut sent = 0u64;
        loop {
            let item = tokio::select! {
                biased;
                _ = run.cancelled() => return Err(Error::Aborted),
                r = queue.recv() => match r {
                    Ok(item) => item,
                    Err(_) => break,
                },
            };
            {
                let mut u = unacked.lock();
                if u.is_empty() {
                    *since.lock() = tokio::time::Instant::now();
                }
                u.push_back(Sent {
                    chunk: item.chunk,
                    crc: item.crc,
                    trailer: item.trailer.clone(),
                });
            }
            let layout = source.layout();
            let payload = layout.wire_len(item.chunk);
            layout.segments(item.chunk, &mut segments);
            let mut item = item;
            let frame = ChunkFrame {
                chunk: item.chunk,
                crc: item.crc,
                trailer: &item.trailer,
                segments: &segments,
            };
            // The transport may seal the chunk's records in its buffer and write them
            // from there (dmover_net::chunkio); the buffer is not used after this.
            let w = tokio::select! {
                biased;
                _ = run.cancelled() => return Err(Error::Aborted),
                w = tx.send_chunk(frame, &mut item.buf) => w,
            };
            w.map_err(|e| io_err("sending data to", e))?;
            sent += 1;
            written.store(sent, Ordering::Release);
            run.progress.bytes.fetch_add(payload, Ordering::Relaxed);
            run.progress.chunks.fetch_add(1, Ordering::Relaxed);
        }
        tx.send_end(sent)
            .await
            .map_err(|e| io_err("sending data to", e))?;
        Ok(())
    };
    let acker = async {
        let mut acked = 0u64;
        loop {
            // Idle (nothing outstanding): check again after `stall`. Busy: the limit
            // counts from the last progress, so a chunk queued to a stream that had
            // waited for work gets its full `stall`.
            let deadline = if unacked.lock().is_empty() {
                tokio::time::Instant::now() + stall
            } else {
                *since.lock() + stall
            };
            // Cancel-safe: a timeout keeps a partly read acknowledgement.
            let c = match tokio::time::timeout_at(deadline, acks.recv_ack()).await {
                Err(_) if unacked.lock().is_empty() => continue,
                Err(_) if since.lock().elapsed() < stall => continue,
                Err(_) => {
                    return Error::Net(NetError::Timeout {
                        peer: peer.clone(),
                        what: "acknowledgements on a data stream",
                        secs: stall.as_secs(),
                    });
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Error::Net(NetError::Closed { peer: peer.clone() });
                }
                Ok(Err(e)) => return io_err("reading acknowledgements from", e),
                Ok(Ok(c)) => c,
            };
            if c <= acked || c > written.load(Ordering::Acquire) {
                return Error::protocol(
                    &peer,
                    format!(
                        "acknowledgement of {c} chunks after {acked}, with {} sent",
                        written.load(Ordering::Acquire)
                    ),
                );
            }
            let n = c - acked;
            acked = c;
            {
                let mut u = unacked.lock();
                for _ in 0..n {
                    u.pop_front();
                }
                *since.lock() = tokio::time::Instant::now();
            }
            sh.acked(n);
        }
    };
    let r = tokio::select! {
        r = writer => r,
        e = acker => Err(e),
    };
    match r {
        Ok(()) => {}
        Err(_) if run.is_cancelled() => {}
        // Every chunk is acknowledged: the destination may close its end as soon as
        // it has what it needs; nothing is lost.
        Err(_) if sh.all_acked.is_cancelled() => {}
        Err(e) if e.ends_session() => run.fail(e),
        Err(e) => sh.lost(&peer, e, unacked.into_inner()),
    }
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
    sink: Arc<dyn Sink>,
    disk: Arc<DiskPool>,
    pool: Pool,
    run: Arc<Run>,
    seen: Seen,
    /// Chunks to receive.
    expected: u64,
    /// Distinct chunks received whole.
    distinct: AtomicU64,
    /// Copies of chunks already received (sent again after a stream broke).
    duplicates: AtomicU64,
    /// Every expected chunk has arrived.
    complete: CancellationToken,
    /// Chunks not yet written to disk.
    pending: AtomicU64,
    all_written: tokio::sync::Notify,
}

/// What the destination side's streams went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvStats {
    /// Streams that broke.
    pub streams_lost: u32,
    /// Chunks that arrived more than once.
    pub duplicates: u64,
}

/// How a stream ended, if not with its `END` frame.
enum StreamEnd {
    /// The session cannot go on (a protocol violation, a cancelled run).
    Fatal(Error),
    /// The connection broke; the source sends its chunks on the other streams.
    Lost(Error),
}

/// Receives the chunks the sink expects over `streams`, tolerating broken streams as
/// long as one remains and keeping the first whole copy of a chunk, and finishes the
/// sink.
pub async fn receive<S>(
    disk: &Arc<DiskPool>,
    sink: Arc<dyn Sink>,
    pool: Pool,
    streams: Vec<DataStream<S>>,
    run: Arc<Run>,
) -> Result<(Summary, RecvStats)>
where
    S: DataLink,
{
    let n = sink.layout().n_chunks();
    let seen = Seen::new(n);
    let mut expected = 0;
    {
        let mut next = 0;
        for k in sink.chunks() {
            // Chunks that do not travel count as seen: a copy would be a duplicate.
            for skipped in next..k {
                seen.insert(skipped);
            }
            next = k + 1;
            expected += 1;
        }
        for skipped in next..n {
            seen.insert(skipped);
        }
    }
    let shared = Arc::new(RecvShared {
        sink: sink.clone(),
        disk: disk.clone(),
        pool,
        run: run.clone(),
        seen,
        expected,
        distinct: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        complete: CancellationToken::new(),
        pending: AtomicU64::new(expected),
        all_written: tokio::sync::Notify::new(),
    });
    if expected == 0 {
        shared.complete.cancel();
    }
    let mut live = streams.len();
    let mut lost = 0u32;
    let mut set = tokio::task::JoinSet::new();
    for s in streams {
        let shared = shared.clone();
        set.spawn(async move { recv_stream(s, &shared).await });
    }
    let mut complete = false;
    loop {
        let next = tokio::select! {
            x = set.join_next() => x,
            _ = shared.complete.cancelled() => {
                complete = true;
                break;
            }
        };
        match next {
            None => break,
            Some(Ok(Ok(_))) => {}
            Some(Ok(Err(StreamEnd::Fatal(e)))) => run.fail(e),
            Some(Ok(Err(StreamEnd::Lost(e)))) => {
                live -= 1;
                lost += 1;
                if shared.complete.is_cancelled() {
                } else if live == 0 {
                    run.fail(e);
                } else {
                    tracing::warn!("{e}; waiting for its chunks on the other {live} streams");
                }
            }
            Some(Err(e)) => run.fail(Error::refused(
                dmover_proto::control::ErrorCode::Aborted,
                format!("a stream task failed: {e}"),
            )),
        }
    }
    if complete {
        // Every chunk is here: the summary does not wait for the streams' END, which
        // the source sends only once our acknowledgements reached it (a round trip).
        // The streams still run on their own, so acknowledgements go out and each
        // connection ends cleanly with its END (or is dropped after END_GRACE); what
        // happens on them now cannot change the data (later copies are duplicates).
        tokio::spawn(async move {
            let drained = tokio::time::timeout(END_GRACE, async {
                while let Some(r) = set.join_next().await {
                    if let Ok(Err(StreamEnd::Fatal(e) | StreamEnd::Lost(e))) = r {
                        tracing::debug!("a data stream ended badly after the last chunk: {e}");
                    }
                }
            })
            .await;
            if drained.is_err() {
                tracing::info!("giving up on data streams that did not end");
            }
        });
    }
    run.check()?;
    let got = shared.distinct.load(Ordering::Acquire);
    if got != expected {
        return Err(Error::protocol(
            "the source",
            format!("streams ended after {got} of {expected} chunks"),
        ));
    }
    if shared.pending.load(Ordering::Acquire) != 0 {
        tokio::select! {
            _ = run.cancelled() => {}
            _ = shared.all_written.notified() => {}
        }
    }
    run.check()?;
    let stats = RecvStats {
        streams_lost: lost,
        duplicates: shared.duplicates.load(Ordering::Relaxed),
    };
    let summary = disk
        .run(move || sink.finish().map_err(Error::from))
        .await
        .unwrap_or(Err(Error::Aborted))?;
    Ok((summary, stats))
}

async fn recv_stream<S>(mut s: DataStream<S>, sh: &Arc<RecvShared>) -> Result<u64, StreamEnd>
where
    S: DataLink,
{
    let layout = sh.sink.layout();
    let n = layout.n_chunks();
    let limits = FrameLimits {
        max_payload: layout.chunk_size() as u32,
        max_digests: layout.chunk_size() as u32,
    };
    let peer = s.peer.clone();
    // A record that fails authentication (InvalidData) is altered data, not a broken
    // link: it fails the session at once and is reported as the root cause, like a
    // checksum mismatch (the peer, whose stream merely broke, waits for our report;
    // as a connection error both ends waited for each other's report for 2 s and the
    // source could give up first and show only its broken pipe).
    let lost = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            StreamEnd::Fatal(Error::refused(
                dmover_proto::control::ErrorCode::Checksum,
                format!("receiving data from {peer}: {e}"),
            ))
        } else {
            StreamEnd::Lost(Error::Net(NetError::io("receiving data from", &peer, e)))
        }
    };
    let fatal = |what: String| StreamEnd::Fatal(Error::protocol(&peer, what));
    let aborted = || StreamEnd::Fatal(Error::Aborted);
    let mut segments = Vec::new();
    let mut got = 0u64;
    loop {
        let hb = tokio::select! {
            biased;
            _ = sh.run.cancelled() => return Err(aborted()),
            r = s.io.recv_header() => r.map_err(lost)?,
        };
        let h = FrameHeader::decode(&hb, &limits)
            .map_err(|e| StreamEnd::Fatal(Error::Net(NetError::proto(&peer, e))))?;
        if h.kind == FrameKind::End {
            if h.chunk != got {
                return Err(fatal(format!(
                    "stream says it sent {} chunks, {got} arrived",
                    h.chunk
                )));
            }
            return Ok(got);
        }
        let k = h.chunk;
        if k >= n {
            return Err(fatal(format!(
                "chunk {k} out of range (the dataset has {n})"
            )));
        }
        let expected = layout.wire_len(k);
        if u64::from(h.payload_len) != expected {
            return Err(fatal(format!(
                "chunk {k} has {} bytes, the layout says {expected}",
                h.payload_len
            )));
        }
        let pieces = layout.pieces(k).count() as u64;
        if u64::from(h.n_digests) > pieces {
            return Err(fatal(format!(
                "chunk {k} carries {} digests for {pieces} files",
                h.n_digests
            )));
        }
        let mut trailer = vec![0u8; h.n_digests as usize * DIGEST_LEN];
        let mut buf = tokio::select! {
            biased;
            _ = sh.run.cancelled() => return Err(aborted()),
            b = async {
                s.io.recv_into(&mut trailer).await?;
                Ok::<_, std::io::Error>(sh.pool.get().await)
            } => b.map_err(lost)?,
        };
        layout.segments(k, &mut segments);
        for &(off, len) in &segments {
            tokio::select! {
                biased;
                _ = sh.run.cancelled() => return Err(aborted()),
                // Sealed records are opened straight into the pool buffer.
                r = s.io.recv_into(&mut buf[off..off + len]) => { r.map_err(lost)?; }
            }
        }
        sh.run.progress.bytes.fetch_add(expected, Ordering::Relaxed);
        sh.run.progress.chunks.fetch_add(1, Ordering::Relaxed);
        got += 1;
        if sh.seen.insert(k) {
            if sh.distinct.fetch_add(1, Ordering::AcqRel) + 1 == sh.expected {
                sh.complete.cancel();
            }
            let job = sh.clone();
            let crc = h.crc;
            sh.disk.spawn(move || {
                if !job.run.is_cancelled() {
                    if let Err(e) = job.sink.write_chunk(k, &buf, &trailer, crc) {
                        job.run.fail(e.into());
                    }
                }
                drop(buf);
                if job.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                    job.all_written.notify_one();
                }
            });
        } else {
            sh.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            biased;
            _ = sh.run.cancelled() => return Err(aborted()),
            r = s.io.send_ack(got) => { r.map_err(lost)?; }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use dmover_net::stream::DataIo;
    use dmover_proto::auth::Role;
    use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT};
    use dmover_store::mem::{MemSink, MemSource};

    const CHUNK: u32 = 64 << 10;

    /// A directory with files of every shape the layout cuts differently: empty, one
    /// byte, unaligned, one chunk exactly, several chunks and a tail, aligned and not.
    fn dataset() -> (Vec<Entry>, Vec<Vec<u8>>) {
        let mtime = Mtime { sec: 1, nsec: 2 };
        let mut entries = vec![Entry {
            parent: NO_PARENT,
            name: b"d".to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime,
        }];
        let mut data = vec![Vec::new()];
        let sizes = [0usize, 1, 4095, 65_536, 3 * 65_536 + 17, 200_000, 300];
        for (i, &size) in sizes.iter().enumerate() {
            entries.push(Entry {
                parent: 0,
                name: format!("f{i}").into_bytes(),
                kind: EntryKind::File { size: size as u64 },
                mode: 0o644,
                mtime,
            });
            data.push((0..size).map(|j| (j * 31 + i * 7) as u8).collect());
        }
        (entries, data)
    }

    /// Runs `send` and `receive` against each other over `n` in-process streams.
    async fn transfer(
        source: Arc<dyn Source>,
        sink: Arc<dyn Sink>,
        n: usize,
    ) -> (Result<SendStats>, Result<(Summary, RecvStats)>) {
        let disk = Arc::new(DiskPool::new(2, "test-disk"));
        let (mut out, mut inc) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (a, b) = tokio::io::duplex(128 << 10);
            let link = |io, role| {
                let p = dmover_proto::control::DataProtection::Authenticated;
                DataIo::new(io, p, &[7; 32], i as u16, role, None)
            };
            out.push(DataStream {
                io: link(a, Role::Client),
                peer: format!("sink {i}"),
            });
            inc.push(DataStream {
                io: link(b, Role::Server),
                peer: format!("source {i}"),
            });
        }
        let pool = || Pool::new(4, CHUNK as usize);
        tokio::join!(
            send(&disk, source, pool(), out, Run::new(), STREAM_STALL),
            receive(&disk, sink, pool(), inc, Run::new()),
        )
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn memory_source_to_memory_sink_through_the_pipeline() {
        let (entries, data) = dataset();
        let total: usize = data.iter().map(Vec::len).sum();
        for checksum in [true, false] {
            let source = MemSource::new(entries.clone(), data.clone(), CHUNK, checksum).unwrap();
            let sink = Arc::new(MemSink::new(entries.clone(), CHUNK, checksum).unwrap());
            let (sent, received) = runtime().block_on(transfer(Arc::new(source), sink.clone(), 3));
            assert_eq!(sent.unwrap().streams_lost, 0);
            let (summary, stats) = received.unwrap();
            assert_eq!(stats.duplicates, 0);
            assert_eq!(
                (summary.bytes, summary.files, summary.dirs, summary.verified),
                (total as u64, 7, 1, checksum)
            );
            for (i, want) in data.iter().enumerate().skip(1) {
                assert_eq!(sink.file(i as u32).as_ref(), Some(want), "entry {i}");
            }
        }
    }

    /// A source whose bytes differ from what it hashed: the sink refuses the file with
    /// the checksum error a disk sink gives, and the session fails with its code.
    #[test]
    fn a_digest_mismatch_fails_the_transfer() {
        let (entries, data) = dataset();
        let mut wrong = data.clone();
        wrong[5][70_000] ^= 1;
        // The source announces digests of `data` but sends `wrong`: a sink built for
        // checksums sees a CRC that matches the bytes sent and a file digest that does not.
        struct Lying(MemSource, MemSource);
        impl Source for Lying {
            fn layout(&self) -> &dmover_proto::layout::Layout {
                self.0.layout()
            }
            fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
                self.0.chunks()
            }
            fn read_chunk(
                &self,
                k: u64,
                buf: &mut [u8],
                trailer: &mut Vec<u8>,
            ) -> dmover_store::Result<dmover_store::ChunkRead> {
                let honest = self.0.read_chunk(k, buf, trailer)?;
                let mut ignored = Vec::new();
                let sent = self.1.read_chunk(k, buf, &mut ignored)?;
                Ok(dmover_store::ChunkRead {
                    crc: sent.crc,
                    n_digests: honest.n_digests,
                })
            }
            fn reread_chunk(
                &self,
                k: u64,
                buf: &mut [u8],
                crc: Option<u32>,
            ) -> dmover_store::Result<()> {
                self.1.reread_chunk(k, buf, crc)
            }
        }
        let source = Lying(
            MemSource::new(entries.clone(), data, CHUNK, true).unwrap(),
            MemSource::new(entries.clone(), wrong, CHUNK, true).unwrap(),
        );
        let sink = Arc::new(MemSink::new(entries, CHUNK, true).unwrap());
        let (_, received) = runtime().block_on(transfer(Arc::new(source), sink.clone(), 2));
        let e = received.unwrap_err();
        assert_eq!(e.code(), dmover_proto::control::ErrorCode::Checksum, "{e}");
        assert!(
            e.to_string()
                .starts_with("checksum mismatch: f4: received data has digest"),
            "{e}"
        );
        assert!(sink.file(5).is_none());
    }
}
