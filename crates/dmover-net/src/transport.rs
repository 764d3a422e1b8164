//! The transport seam: what the engine does with a joined data stream, and nothing of
//! how. A source writes chunk frames and reads acknowledgements; a sink reads chunk
//! frames and writes acknowledgements. Whether the bytes go through TCP, AES-GCM
//! records sealed in place ([`crate::chunkio`]), a join whose answer is still pending
//! ([`DataIo::awaiting_join`]) or a fault injector ([`crate::fault`]) is the
//! implementation's business: the engine names none of them.
//!
//! A sink uses a data stream ([`DataLink`]) whole; a source splits it
//! ([`DataLink::into_source`]) into a half that writes chunk frames ([`ChunkTx`]) and
//! one that reads acknowledgements ([`AckRx`]), which two tasks, or two branches of one
//! `select!`, may drive at once. [`DataIo`] over any byte stream is the first
//! implementation.
//!
//! Chunk payloads are never copied for the seam's sake: [`ChunkTx::send_chunk`] takes
//! the pool buffer the chunk was read into and the segments of it that travel (a
//! sealing stream seals its records in that buffer), and [`DataLink::recv_into`] fills
//! a caller's buffer straight from the stream (a sealing stream opens records in it).

use std::future::Future;
use std::io::{self, IoSlice};

use dmover_proto::data::{
    ACK_LEN, DIGEST_LEN, DigestEntry, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, PART_LEN,
    decode_ack, encode_ack,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::chunkio::{ChunkOut, DataWrite, Locked, ReadSide, WriteSide, write_sealed};
use crate::link::Probe;
use crate::pace::Pacer;
use crate::stream::{DataIo, DataRead};
use crate::zerocopy::{ZeroCopy, ZeroCopyStats};

/// Payload bytes sealed and written at a time: well inside a core's L2 cache, so a
/// window's records are still in the cache when the socket copies them (a 16 MiB chunk
/// is not).
pub const SEND_WINDOW: usize = 1 << 20;

/// A chunk frame to send: its header fields and where its payload lies in the buffer.
#[derive(Debug, Clone, Copy)]
pub struct ChunkFrame<'a> {
    /// The chunk.
    pub chunk: u64,
    /// CRC32C of the payload, when checksums are on.
    pub crc: Option<u32>,
    /// The digest entries (and failure markers) that follow the header; of a part
    /// frame, the chunk's failure markers only.
    pub digests: &'a [DigestEntry],
    /// `(offset, length)` runs of the buffer that make the payload, in order; none
    /// for a zeros frame.
    pub segments: &'a [(usize, usize)],
    /// A zeros frame ([`dmover_proto::data::FLAG_ZEROS`]): no payload travels.
    pub zeros: bool,
    /// A part frame ([`dmover_proto::data::FLAG_PART`]): these bytes of the chunk,
    /// from this offset (`segments` are the part's bytes).
    pub part: Option<u32>,
}

impl ChunkFrame<'_> {
    /// Payload bytes on the wire.
    pub fn payload_len(&self) -> usize {
        self.segments.iter().map(|s| s.1).sum()
    }

    /// The encoded frame header.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        FrameHeader {
            kind: FrameKind::Chunk,
            chunk: self.chunk,
            n_digests: self.digests.len() as u32,
            payload_len: self.payload_len() as u32,
            crc: self.crc,
            zeros: self.zeros,
            part: self.part.is_some(),
        }
        .encode()
    }

    /// The bytes before the payload, into `out` (cleared first): the header, a part's
    /// offset, the digest entries.
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.header());
        if let Some(offset) = self.part {
            out.extend_from_slice(&offset.to_be_bytes());
        }
        for d in self.digests {
            d.encode_into(out);
        }
    }
}

/// A frame received on a data stream, its framing decoded ([`DataLink::recv_frame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A chunk frame's head; its payload (`header.payload_len` bytes, none for a
    /// zeros frame) follows on the stream ([`DataLink::recv_into`]).
    Chunk(ChunkHead),
    /// The stream's `END` after `sent` chunk frames.
    End {
        /// Chunk frames the peer sent on the stream.
        sent: u64,
    },
}

/// A chunk frame's head: its header, a part's offset and its digest entries, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHead {
    /// The header, checked against the receiver's limits and the caller's check.
    pub header: FrameHeader,
    /// A part frame's offset into its chunk.
    pub part: Option<u32>,
    /// The digest entries (of a part: failure markers), in the order sent.
    pub digests: Vec<DigestEntry>,
}

/// Why a frame could not be received.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The stream failed or ended.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The bytes are not a frame ([`FrameHeader::decode`]'s reason).
    #[error(transparent)]
    Malformed(dmover_proto::Error),
    /// A well-formed frame the caller's check refused (e.g. against the layout).
    #[error("{0}")]
    Refused(String),
}

/// A joined data stream. A sink uses it whole (it reads a frame, then acknowledges
/// it); a source splits it ([`DataLink::into_source`]) to write chunks and read
/// acknowledgements at once.
pub trait DataLink: Send + 'static {
    /// The half that writes chunk frames.
    type Tx: ChunkTx;
    /// The half that reads acknowledgements.
    type Acks: AckRx;

    /// Splits the stream for a source. The caller times the acknowledgement reader's
    /// waits itself (it is rightly idle while nothing is in flight), so the stream's
    /// own idle limit no longer applies to reads; writes keep theirs.
    fn into_source(self) -> (Self::Tx, Self::Acks);

    /// Reads the next frame header's bytes (decode them with [`FrameHeader::decode`];
    /// [`DataLink::recv_frame`] does, and reads the rest of the frame's head).
    fn recv_header(&mut self) -> impl Future<Output = io::Result<[u8; HEADER_LEN]>> + Send;

    /// Reads the next frame's head, decoded: its header, checked against `limits`,
    /// then (a part) its offset, then `check(header, part)` — the caller's check, e.g.
    /// against the layout ([`dmover_proto::layout::Layout::check_frame`]), before
    /// anything sized by the header is read or allocated — then its digest entries.
    /// A chunk frame's payload is left on the stream for [`DataLink::recv_into`].
    fn recv_frame<'a, F>(
        &'a mut self,
        limits: FrameLimits,
        check: F,
    ) -> impl Future<Output = Result<Received, RecvError>> + Send + 'a
    where
        Self: Sized,
        F: FnOnce(&FrameHeader, Option<u32>) -> Result<(), String> + Send + 'a,
    {
        async move {
            let raw = self.recv_header().await?;
            let header = FrameHeader::decode(&raw, &limits).map_err(RecvError::Malformed)?;
            if header.kind == FrameKind::End {
                return Ok(Received::End { sent: header.chunk });
            }
            let part = if header.part {
                let mut offset = [0u8; PART_LEN];
                self.recv_into(&mut offset).await?;
                Some(u32::from_be_bytes(offset))
            } else {
                None
            };
            check(&header, part).map_err(RecvError::Refused)?;
            let mut trailer = vec![0u8; header.n_digests as usize * DIGEST_LEN];
            self.recv_into(&mut trailer).await?;
            let digests = DigestEntry::decode_all(&trailer)
                .map_err(RecvError::Malformed)?
                .collect();
            Ok(Received::Chunk(ChunkHead {
                header,
                part,
                digests,
            }))
        }
    }

    /// Fills `dst` from the stream (a frame's digest trailer or a run of its payload);
    /// an end of stream before it is full is an `UnexpectedEof` error. Dropping the
    /// future before it completes may leave the stream unusable.
    fn recv_into<'a>(
        &'a mut self,
        dst: &'a mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Writes an acknowledgement of `frames` chunk frames in all, and flushes.
    fn send_ack(&mut self, frames: u64) -> impl Future<Output = io::Result<()>> + Send;

    /// Breaks the connection at once, both ways (`reset`: with a TCP reset, losing
    /// what is unread), for fault injection.
    fn cut(&mut self, reset: bool);

    /// A sink's reads are timed by the caller from now on (a request-driven session's
    /// streams are rightly idle while nothing is asked for): the stream's own idle
    /// limit no longer applies to them; writes keep theirs. (No default: a wrapper
    /// must pass it on.)
    fn reads_timed_by_caller(&mut self);

    /// A handle on the stream's connection for the engine's tuners and budgets
    /// ([`Probe`]: drop it when the stream ends); `None` where the transport has
    /// none. (No default: a wrapper must pass it on.)
    fn probe(&self) -> Option<Probe>;
}

/// The half of a source's data stream that writes chunk frames.
pub trait ChunkTx: Send + 'static {
    /// Writes chunk frame `f` with its payload from `buf`, and flushes. `buf`'s bytes
    /// may be changed (records sealed in place): it is not to be used afterwards.
    fn send_chunk(
        &mut self,
        f: ChunkFrame<'_>,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// [`ChunkTx::send_chunk`] within a bandwidth limit: waits on `pacer` for the
    /// payload's bytes. A transport that sends in windows waits before each (at most
    /// [`SEND_WINDOW`] bytes); this default waits for the whole payload first.
    fn send_chunk_paced<'a>(
        &'a mut self,
        f: ChunkFrame<'a>,
        buf: &'a mut [u8],
        pacer: &'a Pacer,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        async move {
            pacer.take(f.payload_len() as u64).await;
            self.send_chunk(f, buf).await
        }
    }

    /// Writes the `END` frame after `sent` chunks, and flushes (with zero-copy on: and
    /// waits, within [`ZEROCOPY_DRAIN`], for the kernel to be done with every payload).
    fn send_end(&mut self, sent: u64) -> impl Future<Output = io::Result<()>> + Send;

    /// Breaks the connection at once (see [`DataLink::cut`]).
    fn cut(&mut self, reset: bool);

    /// Sends chunk payloads with `MSG_ZEROCOPY` from here on ([`crate::zerocopy`]): the
    /// kernel reads them from the caller's buffers after [`ChunkTx::send_chunk`]
    /// returns, so this is only for a source that never rewrites a buffer while the
    /// kernel may still read it (the memory-to-memory test's pattern). `Err`: why not
    /// (the stream transforms its bytes, or the kernel refuses); sends stay ordinary.
    /// (No default: a wrapper must pass it on; a transport without zero-copy says why.)
    fn zerocopy(&mut self) -> Result<(), String>;

    /// The zero-copy counters, when zero-copy is on.
    fn zerocopy_stats(&self) -> Option<ZeroCopyStats>;
}

/// How long [`ChunkTx::send_end`] waits for a zero-copy stream's last completions.
pub const ZEROCOPY_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The half of a source's data stream that reads acknowledgements.
pub trait AckRx: Send + 'static {
    /// Reads the next acknowledgement: the count of chunk frames received in all. An
    /// end of stream is an `UnexpectedEof` error. Cancel-safe: a wait cut short (by a
    /// timeout) keeps the bytes that arrived for the next call.
    fn recv_ack(&mut self) -> impl Future<Output = io::Result<u64>> + Send;
}

/// A connection that can be broken on purpose.
pub trait Cut {
    /// Shuts the connection down both ways (`reset`: with a TCP reset).
    fn cut(&self, reset: bool);

    /// The TCP socket under the connection, when there is one (for zero-copy sends).
    fn raw_tcp(&self) -> Option<&tokio::net::TcpStream> {
        None
    }
}

impl Cut for tokio::net::TcpStream {
    fn raw_tcp(&self) -> Option<&tokio::net::TcpStream> {
        Some(self)
    }

    fn cut(&self, reset: bool) {
        let s = socket2::SockRef::from(self);
        if reset {
            let _ = s.set_linger(Some(std::time::Duration::ZERO));
        }
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

impl Cut for tokio::io::DuplexStream {
    /// An in-memory pipe cannot be shut down from a shared reference: the cutting side
    /// fails its own reads and writes from then on (see [`crate::fault`]).
    fn cut(&self, _reset: bool) {}
}

/// Cuts `segments` into `pieces` so that none crosses a multiple of [`SEND_WINDOW`]
/// payload bytes, and returns in `bounds` where each window's pieces start (and, last,
/// where they end): window `i` is `pieces[bounds[i]..bounds[i + 1]]`. No segments: one
/// empty window (a chunk's head still goes out).
pub fn send_windows(
    segments: &[(usize, usize)],
    pieces: &mut Vec<(usize, usize)>,
    bounds: &mut Vec<usize>,
) {
    pieces.clear();
    bounds.clear();
    bounds.push(0);
    let mut fill = 0;
    for &(mut o, mut l) in segments {
        while l > 0 {
            let k = l.min(SEND_WINDOW - fill);
            pieces.push((o, k));
            o += k;
            l -= k;
            fill += k;
            if fill == SEND_WINDOW {
                bounds.push(pieces.len());
                fill = 0;
            }
        }
    }
    if bounds.len() == 1 || fill > 0 {
        bounds.push(pieces.len());
    }
}

/// The chunk-writing half of a split [`DataIo`] (or any [`DataWrite`] stream).
pub struct IoTx<S> {
    w: WriteSide<S>,
    out: ChunkOut,
    /// The frame's head as sent (header, part offset, digests), reused.
    head: Vec<u8>,
    pieces: Vec<(usize, usize)>,
    bounds: Vec<usize>,
    /// Zero-copy sending, once on: every write goes through it from then on.
    zc: Option<ZeroCopy>,
}

/// The acknowledgement-reading half of a split [`DataIo`].
pub struct IoAcks<S> {
    r: ReadSide<S>,
    ack: [u8; ACK_LEN],
    have: usize,
}

impl<S> DataLink for DataIo<S>
where
    S: AsyncRead + AsyncWrite + Cut + Unpin + Send + 'static,
{
    type Tx = IoTx<DataIo<S>>;
    type Acks = IoAcks<DataIo<S>>;

    fn into_source(mut self) -> (Self::Tx, Self::Acks) {
        DataRead::reads_timed_by_caller(&mut self);
        let (r, w) = Locked::split(self);
        (
            IoTx {
                w,
                out: ChunkOut::default(),
                head: Vec::new(),
                pieces: Vec::new(),
                bounds: Vec::new(),
                zc: None,
            },
            IoAcks {
                r,
                ack: [0; ACK_LEN],
                have: 0,
            },
        )
    }

    async fn recv_header(&mut self) -> io::Result<[u8; HEADER_LEN]> {
        let mut h = [0u8; HEADER_LEN];
        self.read_exact(&mut h).await?;
        Ok(h)
    }

    fn recv_into<'a>(
        &'a mut self,
        dst: &'a mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        self.read_exact_into(dst)
    }

    async fn send_ack(&mut self, frames: u64) -> io::Result<()> {
        self.write_all(&encode_ack(frames)).await?;
        self.flush().await
    }

    fn cut(&mut self, reset: bool) {
        self.get_ref().cut(reset);
    }

    fn reads_timed_by_caller(&mut self) {
        DataRead::reads_timed_by_caller(self);
    }

    fn probe(&self) -> Option<Probe> {
        Probe::tcp(self.get_ref().raw_tcp()?).ok()
    }
}

impl<S> IoTx<DataIo<S>>
where
    S: AsyncRead + AsyncWrite + Cut + Unpin + Send + 'static,
{
    /// Sends a chunk frame, waiting on `pacer` (if any) before each window.
    async fn send(
        &mut self,
        f: ChunkFrame<'_>,
        buf: &mut [u8],
        pacer: Option<&Pacer>,
    ) -> io::Result<()> {
        f.encode_head(&mut self.head);
        if let Some(zc) = &mut self.zc {
            if let Some(p) = pacer {
                p.take(f.payload_len() as u64).await;
            }
            // The head changes every frame: copied. The payload is sent from the
            // buffer.
            zc.send_copied(&[IoSlice::new(&self.head)]).await?;
            let iov: Vec<IoSlice<'_>> = f
                .segments
                .iter()
                .map(|&(o, l)| IoSlice::new(&buf[o..o + l]))
                .collect();
            return zc.send_all(&iov).await;
        }
        send_windows(f.segments, &mut self.pieces, &mut self.bounds);
        for (i, b) in self.bounds.windows(2).enumerate() {
            let head: &[&[u8]] = if i == 0 { &[&self.head] } else { &[] };
            let window = &self.pieces[b[0]..b[1]];
            if let Some(p) = pacer {
                p.take(window.iter().map(|w| w.1 as u64).sum()).await;
            }
            let out = &mut self.out;
            self.w.with(|s| s.seal_chunk(head, buf, window, out));
            let mut iov = Vec::with_capacity(2 + 3 * window.len());
            self.out.slices(buf, &mut iov);
            write_sealed(&self.w, &mut iov).await?;
        }
        // Flushed: a stream may wrap its bytes in records it buffers, and a chunk left
        // half in such a buffer while this stream waits for the next one would never be
        // acknowledged.
        self.w.flush().await
    }
}

impl<S> ChunkTx for IoTx<DataIo<S>>
where
    S: AsyncRead + AsyncWrite + Cut + Unpin + Send + 'static,
{
    fn send_chunk(
        &mut self,
        f: ChunkFrame<'_>,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send {
        self.send(f, buf, None)
    }

    fn send_chunk_paced<'a>(
        &'a mut self,
        f: ChunkFrame<'a>,
        buf: &'a mut [u8],
        pacer: &'a Pacer,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        self.send(f, buf, Some(pacer))
    }

    async fn send_end(&mut self, sent: u64) -> io::Result<()> {
        let end = FrameHeader::end(sent).encode();
        if let Some(zc) = &mut self.zc {
            zc.send_copied(&[IoSlice::new(&end)]).await?;
            if !zc.drain(ZEROCOPY_DRAIN).await? {
                tracing::debug!("zero-copy sends still outstanding after {ZEROCOPY_DRAIN:?}");
            }
            return Ok(());
        }
        self.w.write_all(&end).await?;
        self.w.flush().await
    }

    fn cut(&mut self, reset: bool) {
        self.w.with(|s| s.get_ref().cut(reset));
    }

    fn zerocopy(&mut self) -> Result<(), String> {
        if self.zc.is_some() {
            return Ok(());
        }
        // Only a plain stream (no records, no join answer pending) carries the frame's
        // bytes unchanged.
        let zc = self.w.with(|s| match s.plain().and_then(|s| s.raw_tcp()) {
            Some(tcp) => ZeroCopy::enable(tcp).map_err(|e| e.to_string()),
            None => Err("the data streams transform their bytes (not raw TCP)".to_string()),
        })?;
        self.zc = Some(zc);
        Ok(())
    }

    fn zerocopy_stats(&self) -> Option<ZeroCopyStats> {
        self.zc.as_ref().map(ZeroCopy::stats)
    }
}

impl<S> AckRx for IoAcks<DataIo<S>>
where
    S: AsyncRead + AsyncWrite + Cut + Unpin + Send + 'static,
{
    async fn recv_ack(&mut self) -> io::Result<u64> {
        while self.have < ACK_LEN {
            let n = self.r.read(&mut self.ack[self.have..]).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the data stream ended",
                ));
            }
            self.have += n;
        }
        self.have = 0;
        Ok(decode_ack(self.ack))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{FaultPlan, Faulty};
    use dmover_proto::auth::Role;
    use dmover_proto::control::DataProtection;
    use dmover_proto::data::FrameLimits;

    fn pair(
        p: DataProtection,
    ) -> (
        DataIo<tokio::io::DuplexStream>,
        DataIo<tokio::io::DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let key = [9u8; 32];
        (
            DataIo::new(a, p, &key, 0, Role::Client, None),
            DataIo::new(b, p, &key, 0, Role::Server, None),
        )
    }

    /// Chunks written through the seam arrive as decoded frames with their digests
    /// and payload byte for byte (a zeros frame, chunk 1, with its digests and no
    /// payload; a part frame, chunk 3, with its offset and a failure marker),
    /// acknowledgements come back, and END closes the stream, for every protection.
    #[tokio::test]
    async fn chunks_and_acks_cross_the_seam_unchanged() {
        for p in [
            DataProtection::Plain,
            DataProtection::Authenticated,
            DataProtection::Encrypted,
        ] {
            let (src, mut dst) = pair(p);
            let (mut tx, mut acks) = src.into_source();
            let data: Vec<u8> = (0..3 * SEND_WINDOW + 77)
                .map(|i| (i * 31 % 251) as u8)
                .collect();
            let segs = [(0, 5000), (8192, 2 * SEND_WINDOW), (3 * SEND_WINDOW, 77)];
            let want: Vec<u8> = segs
                .iter()
                .flat_map(|&(o, l)| data[o..o + l].to_vec())
                .collect();
            let digests = [DigestEntry { file: 1, digest: 7 }, DigestEntry::failure(2)];
            let sender = tokio::spawn(async move {
                for k in 0..4u64 {
                    let mut buf = data.clone();
                    let f = ChunkFrame {
                        chunk: k,
                        crc: Some(k as u32),
                        digests: if k == 3 { &digests[1..] } else { &digests },
                        segments: match k {
                            1 => &[],
                            3 => &[(100, 50)],
                            _ => &segs,
                        },
                        zeros: k == 1,
                        part: (k == 3).then_some(100),
                    };
                    tx.send_chunk(f, &mut buf).await.unwrap();
                    assert_eq!(acks.recv_ack().await.unwrap(), k + 1);
                }
                tx.send_end(4).await.unwrap();
            });
            let limits = FrameLimits {
                max_payload: 1 << 26,
                max_digests: 16,
            };
            for k in 0..4u64 {
                let Received::Chunk(head) = dst.recv_frame(limits, |_, _| Ok(())).await.unwrap()
                else {
                    panic!("{p:?}: chunk {k} expected");
                };
                let h = head.header;
                assert_eq!(
                    (h.kind, h.chunk, h.crc),
                    (FrameKind::Chunk, k, Some(k as u32))
                );
                assert_eq!(h.zeros, k == 1);
                if k == 3 {
                    assert_eq!(
                        (head.part, head.digests.as_slice()),
                        (Some(100), &digests[1..])
                    );
                    let mut got = vec![0u8; h.payload_len as usize];
                    dst.recv_into(&mut got).await.unwrap();
                    assert_eq!(
                        got,
                        (100..150).map(|i| (i * 31 % 251) as u8).collect::<Vec<_>>()
                    );
                    dst.send_ack(k + 1).await.unwrap();
                    continue;
                }
                assert_eq!((head.part, head.digests.as_slice()), (None, &digests[..]));
                if h.zeros {
                    assert_eq!(h.payload_len, 0);
                    dst.send_ack(k + 1).await.unwrap();
                    continue;
                }
                let mut got = vec![0u8; h.payload_len as usize];
                dst.recv_into(&mut got).await.unwrap();
                assert!(got == want, "{p:?}: chunk {k} payload differs");
                dst.send_ack(k + 1).await.unwrap();
            }
            let end = dst.recv_frame(limits, |_, _| Ok(())).await.unwrap();
            assert_eq!(end, Received::End { sent: 4 });
            sender.await.unwrap();
        }
    }

    /// The caller's check sees the header (and a part's offset) before the digests
    /// are read, and its refusal is the frame's; a header past the limits is
    /// malformed.
    #[tokio::test]
    async fn a_frame_is_checked_before_its_digests_are_read() {
        let (src, mut dst) = pair(DataProtection::Plain);
        let (mut tx, _acks) = src.into_source();
        let digests = [DigestEntry { file: 0, digest: 1 }];
        let mut buf = vec![1u8; 64];
        let f = ChunkFrame {
            chunk: 9,
            crc: None,
            digests: &digests,
            segments: &[(0, 64)],
            zeros: false,
            part: None,
        };
        tx.send_chunk(f, &mut buf).await.unwrap();
        tx.send_chunk(f, &mut buf).await.unwrap();
        let limits = FrameLimits {
            max_payload: 1 << 20,
            max_digests: 4,
        };
        let e = dst
            .recv_frame(limits, |h, part| {
                assert_eq!((h.chunk, h.n_digests, part), (9, 1, None));
                Err("chunk 9 out of range".into())
            })
            .await
            .unwrap_err();
        assert!(
            matches!(e, RecvError::Refused(ref m) if m == "chunk 9 out of range"),
            "{e}"
        );
        // The refused frame's rest is still on the stream: the next header is garbage.
        let tight = FrameLimits {
            max_payload: 1 << 20,
            max_digests: 0,
        };
        let e = dst.recv_frame(tight, |_, _| Ok(())).await.unwrap_err();
        assert!(matches!(e, RecvError::Malformed(_)), "{e}");
    }

    /// A plan's cut breaks the first stream that passes its byte count, once, in the
    /// middle of a chunk, on the sending and on the receiving side.
    #[tokio::test]
    async fn a_fault_plan_cuts_one_stream_once_mid_chunk() {
        let plan = FaultPlan::new(Some((10_000, false)));
        let (src, _dst) = pair(DataProtection::Plain);
        let (mut tx, _acks) = Faulty::new(src, Some(plan.clone())).into_source();
        let segs = [(0, 6000)];
        let mut buf = vec![0u8; 6000];
        let f = ChunkFrame {
            chunk: 0,
            crc: None,
            digests: &[],
            segments: &segs,
            zeros: false,
            part: None,
        };
        tx.send_chunk(f, &mut buf).await.unwrap();
        let e = tx.send_chunk(f, &mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert!(plan.cut_done());
        assert!(tx.send_end(1).await.is_err(), "a cut stream stays cut");
        // Once per plan: another stream is left alone.
        let (src2, _dst2) = pair(DataProtection::Plain);
        let (mut tx2, _a) = Faulty::new(src2, Some(plan.clone())).into_source();
        tx2.send_chunk(f, &mut buf).await.unwrap();
        tx2.send_chunk(f, &mut buf).await.unwrap();
        // The receiving side of a fresh plan cuts inside a payload.
        let plan = FaultPlan::new(Some((4000, true)));
        let (src3, dst3) = pair(DataProtection::Plain);
        let (mut tx3, _a3) = src3.into_source();
        tx3.send_chunk(f, &mut buf).await.unwrap();
        let mut rx = Faulty::new(dst3, Some(plan.clone()));
        rx.recv_header().await.unwrap();
        let mut got = vec![0u8; 6000];
        let e = rx.recv_into(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert!(plan.cut_done());
        assert!(rx.send_ack(1).await.is_err());
    }

    #[test]
    fn send_windows_cut_at_window_multiples_and_keep_every_byte() {
        let w = SEND_WINDOW;
        let (mut pieces, mut bounds) = (Vec::new(), Vec::new());
        send_windows(&[], &mut pieces, &mut bounds);
        assert_eq!((pieces.len(), bounds), (0, vec![0, 0]));
        let mut bounds = Vec::new();
        let segs = [
            (0, 10),
            (4096, w),
            (4096 + w + 100, 2 * w + 5),
            (9 * w, w - 10),
        ];
        send_windows(&segs, &mut pieces, &mut bounds);
        // Same bytes, in order, each window at most SEND_WINDOW, all but the last full.
        let flat: Vec<(usize, usize)> = pieces.clone();
        let mut at = 0;
        for &(o, l) in &segs {
            let mut got = 0;
            while got < l {
                assert_eq!(flat[at].0, o + got);
                got += flat[at].1;
                at += 1;
            }
            assert_eq!(got, l);
        }
        assert_eq!(at, flat.len());
        let sizes: Vec<usize> = bounds
            .windows(2)
            .map(|b| pieces[b[0]..b[1]].iter().map(|p| p.1).sum())
            .collect();
        let total: usize = segs.iter().map(|s| s.1).sum();
        assert_eq!(sizes.iter().sum::<usize>(), total);
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&s| s == w),
            "{sizes:?}"
        );
        assert!(*sizes.last().unwrap() <= w && *sizes.last().unwrap() > 0);
        // Exactly one window's worth: one window, no empty one after it.
        send_windows(&[(0, w)], &mut pieces, &mut bounds);
        assert_eq!(bounds, vec![0, 1]);
    }
}
