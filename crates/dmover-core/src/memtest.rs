//! The memory-to-memory network test ([`Op::MemTest`], `dmover bench net`): dmover's own
//! control channel, session, data streams and chunk frames, with no disk on either end,
//! so the gap between what the network carries and what file transfers reach is visible.
//!
//! The sending side writes `Chunk` frames of the session's chunk size from one buffer on
//! every stream until the test's time is up, then `END`; with zero-copy it sends the
//! payload with `MSG_ZEROCOPY` (the 24-byte headers are copied) and reaps the completions
//! ([`dmover_net::zerocopy`]). The receiving side checks every frame (and its CRC32C when
//! the session has checksums), discards the payload and reports what arrived in `Done`.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dmover_net::NetError;
use dmover_net::control::ControlChannel;
use dmover_net::stream::DataIo;
use dmover_net::tcp::{self, SocketOptions};
use dmover_net::zerocopy::{ZeroCopy, ZeroCopyStats};
use dmover_proto::control::{Control, MemDirection, MemTest, Op, Summary};
use dmover_proto::data::{FrameHeader, FrameKind, FrameLimits, HEADER_LEN};
use dmover_proto::digest::crc32c_append;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::Client;
use crate::engine::{DataStream, Run};
use crate::error::{Error, Result};
use crate::session::{self, Heartbeat, unexpected};

/// Longest test a server runs, whatever the client asks.
pub const MAX_MILLIS: u32 = 120_000;
/// Chunk size of a test when the client leaves it to us.
pub const DEFAULT_CHUNK: u32 = 4 << 20;
/// How long a sender waits for its last zero-copy completions.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// What a client asks of a test.
#[derive(Debug, Clone)]
pub struct MemTestOptions {
    /// Which way data flows.
    pub direction: MemDirection,
    /// How long the sender sends.
    pub duration: Duration,
    /// Zero-copy sends on the sending side.
    pub zerocopy: bool,
    /// Congestion control for the server's ends of the streams (the client's ends use
    /// the client's socket options).
    pub congestion: Option<String>,
}

/// How zero-copy went on the sending side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZeroCopyOutcome {
    /// Not asked for.
    Off,
    /// Asked for, but the kernel refused `SO_ZEROCOPY`: ordinary sends were used.
    Unsupported(String),
    /// Used by this side; the counters over all streams.
    Used(ZeroCopyStats),
    /// Used by the server (it sends in this direction); its counters stay there.
    Remote,
}

/// What a test measured.
#[derive(Debug, Clone)]
pub struct MemTestReport {
    /// Payload bytes the receiver got.
    pub bytes: u64,
    /// Frames the receiver got.
    pub frames: u64,
    /// Seconds from the start signal (`Go`) until the receiver had every stream's `END`,
    /// as seen by the client.
    pub seconds: f64,
    /// Data streams used.
    pub streams: u16,
    /// Payload bytes per frame.
    pub chunk_size: u32,
    /// Zero-copy on the sending side.
    pub zerocopy: ZeroCopyOutcome,
}

impl MemTestReport {
    /// Payload throughput in Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.seconds.max(1e-9) / 1e9
    }
}

/// A data stream whose TCP socket may be used directly: for zero-copy sends and for
/// per-stream congestion control. Streams that transform their bytes (encryption,
/// authentication records) return `None`, and the test falls back to ordinary sends.
pub trait RawTcp {
    /// The socket, when bytes written to it arrive unchanged.
    fn raw_tcp(&self) -> Option<&TcpStream>;
}

impl RawTcp for TcpStream {
    fn raw_tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl RawTcp for DataIo<TcpStream> {
    fn raw_tcp(&self) -> Option<&TcpStream> {
        self.plain()
    }
}

/// Bounds of a data stream the test can use.
pub trait TestStream: AsyncRead + AsyncWrite + RawTcp + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + RawTcp + Unpin + Send + 'static> TestStream for T {}

/// What one sending stream did.
struct Sent {
    zc: Option<ZeroCopyStats>,
}

/// Sends frames on `s` until `deadline`, then `END`.
async fn send_stream<D: TestStream>(
    s: &mut DataStream<D>,
    payload: &[u8],
    checksum: bool,
    zerocopy: Option<ZeroCopy>,
    deadline: Instant,
    run: &Run,
) -> Result<Sent> {
    let peer = s.peer.clone();
    let io_err = |e| Error::Net(NetError::io("sending data to", &peer, e));
    let mut zc = zerocopy;
    let mut seq = 0u64;
    while Instant::now() < deadline && !run.is_cancelled() {
        let crc = checksum.then(|| crc32c_append(0, payload));
        let header = FrameHeader {
            kind: FrameKind::Chunk,
            chunk: seq,
            n_digests: 0,
            payload_len: payload.len() as u32,
            crc,
        }
        .encode();
        match zc.as_mut() {
            // The header changes every frame, so it is copied; the payload never changes.
            // Once zero-copy is on, every write must go through it (see dmover_net::zerocopy).
            Some(z) => {
                z.send_copied(&[IoSlice::new(&header)])
                    .await
                    .map_err(io_err)?;
                z.send_all(&[IoSlice::new(payload)]).await.map_err(io_err)?;
            }
            None => {
                let mut iov = [IoSlice::new(&header), IoSlice::new(payload)];
                crate::engine::write_all_vectored(&mut s.io, &mut iov)
                    .await
                    .map_err(io_err)?;
            }
        }
        run.progress
            .bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        seq += 1;
    }
    if run.is_cancelled() {
        return Err(Error::Aborted);
    }
    let end = FrameHeader::end(seq).encode();
    let zc = match zc {
        Some(mut z) => {
            z.send_copied(&[IoSlice::new(&end)]).await.map_err(io_err)?;
            z.drain(DRAIN_LIMIT).await.map_err(io_err)?;
            Some(z.stats())
        }
        None => {
            s.io.write_all(&end).await.map_err(io_err)?;
            s.io.flush().await.map_err(io_err)?;
            None
        }
    };
    Ok(Sent { zc })
}

/// Receives frames on `s` until `END`; returns (bytes, frames).
async fn recv_stream<D: TestStream>(
    s: &mut DataStream<D>,
    chunk: u32,
    run: &Run,
) -> Result<(u64, u64)> {
    let peer = s.peer.clone();
    let io_err = |e| Error::Net(NetError::io("receiving data from", &peer, e));
    let limits = FrameLimits {
        max_payload: chunk,
        max_digests: 0,
    };
    let mut buf = vec![0u8; chunk as usize];
    let (mut bytes, mut frames) = (0u64, 0u64);
    loop {
        let mut hb = [0u8; HEADER_LEN];
        s.io.read_exact(&mut hb).await.map_err(io_err)?;
        let h =
            FrameHeader::decode(&hb, &limits).map_err(|e| Error::Net(NetError::proto(&peer, e)))?;
        if h.kind == FrameKind::End {
            if h.chunk != frames {
                return Err(Error::protocol(
                    &peer,
                    format!("stream says it sent {} frames, {frames} arrived", h.chunk),
                ));
            }
            return Ok((bytes, frames));
        }
        if h.chunk != frames {
            return Err(Error::protocol(
                &peer,
                format!("frame {} arrived where {frames} was due", h.chunk),
            ));
        }
        let p = &mut buf[..h.payload_len as usize];
        s.io.read_exact(p).await.map_err(io_err)?;
        if let Some(crc) = h.crc {
            if crc32c_append(0, p) != crc {
                return Err(Error::protocol(
                    &peer,
                    format!("frame {frames} fails its CRC32C"),
                ));
            }
        }
        bytes += u64::from(h.payload_len);
        frames += 1;
        run.progress
            .bytes
            .fetch_add(u64::from(h.payload_len), Ordering::Relaxed);
        if run.is_cancelled() {
            return Err(Error::Aborted);
        }
    }
}

fn task_failed(e: tokio::task::JoinError) -> Error {
    Error::refused(
        dmover_proto::control::ErrorCode::Aborted,
        format!("a stream task failed: {e}"),
    )
}

/// A payload buffer of `len` pseudo-random bytes.
fn payload(len: u32) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v = Vec::with_capacity(len as usize + 8);
    while v.len() < len as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len as usize);
    v
}

/// Sends on every stream for `duration`; zero-copy if asked and available.
async fn send_all<D: TestStream>(
    streams: Vec<DataStream<D>>,
    chunk: u32,
    checksum: bool,
    zerocopy: bool,
    duration: Duration,
    run: &Arc<Run>,
) -> Result<ZeroCopyOutcome> {
    let buf = Arc::new(payload(chunk));
    let mut outcome = if zerocopy {
        ZeroCopyOutcome::Used(ZeroCopyStats::default())
    } else {
        ZeroCopyOutcome::Off
    };
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::with_capacity(streams.len());
    for mut s in streams {
        let zc = if zerocopy {
            match s.io.raw_tcp().map(ZeroCopy::enable) {
                Some(Ok(z)) => Some(z),
                Some(Err(e)) => {
                    outcome = ZeroCopyOutcome::Unsupported(e.to_string());
                    None
                }
                None => {
                    outcome = ZeroCopyOutcome::Unsupported(
                        "the data streams transform their bytes (not raw TCP)".into(),
                    );
                    None
                }
            }
        } else {
            None
        };
        let (buf, run) = (buf.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            match send_stream(&mut s, &buf, checksum, zc, deadline, &run).await {
                Ok(sent) => Some(sent),
                Err(e) => {
                    run.fail(e);
                    None
                }
            }
        }));
    }
    for t in tasks {
        let sent = t.await.map_err(task_failed)?;
        if let (ZeroCopyOutcome::Used(total), Some(z)) = (&mut outcome, sent.and_then(|s| s.zc)) {
            total.sends += z.sends;
            total.completed += z.completed;
            total.copied += z.copied;
        }
    }
    run.check()?;
    Ok(outcome)
}

/// Receives on every stream until each has sent `END`; returns (bytes, frames).
async fn recv_all<D: TestStream>(
    streams: Vec<DataStream<D>>,
    chunk: u32,
    run: &Arc<Run>,
) -> Result<(u64, u64)> {
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            let run = run.clone();
            tokio::spawn(async move {
                match recv_stream(&mut s, chunk, &run).await {
                    Ok(got) => got,
                    Err(e) => {
                        run.fail(e);
                        (0, 0)
                    }
                }
            })
        })
        .collect();
    let (mut bytes, mut frames) = (0, 0);
    for t in tasks {
        let (b, f) = t.await.map_err(task_failed)?;
        bytes += b;
        frames += f;
    }
    run.check()?;
    Ok((bytes, frames))
}

/// The server's side of a test whose streams have joined.
pub(crate) async fn serve<C, D>(
    ch: &mut ControlChannel<C>,
    m: &MemTest,
    checksum: bool,
    chunk: u32,
    streams: Vec<DataStream<D>>,
    run: &Arc<Run>,
) -> Result<u64>
where
    C: AsyncRead + AsyncWrite + Unpin,
    D: TestStream,
{
    if !m.congestion.is_empty() {
        let opts = SocketOptions {
            congestion: Some(m.congestion.clone()),
            ..SocketOptions::default()
        };
        for tcp in streams.iter().filter_map(|s| s.io.raw_tcp()) {
            tcp::tune_stream(tcp, &opts);
        }
    }
    let peer = ch.peer().to_string();
    let hb = Heartbeat::default();
    match m.direction {
        MemDirection::ToServer => {
            ch.send(&Control::Go).await?;
            let ((bytes, frames), _) =
                session::watch_control(ch, run, hb, recv_all(streams, chunk, run)).await?;
            ch.send(&Control::Done(Summary {
                bytes,
                chunks: frames,
                verified: checksum,
                ..Summary::default()
            }))
            .await?;
            Ok(bytes)
        }
        MemDirection::FromServer => {
            match session::recv_live(ch, hb).await? {
                Control::Go => {}
                other => return Err(unexpected(&peer, other, "Go")),
            }
            let millis = m.millis.min(MAX_MILLIS);
            let (outcome, early) = session::watch_control(
                ch,
                run,
                hb,
                send_all(
                    streams,
                    chunk,
                    checksum,
                    m.zerocopy,
                    Duration::from_millis(u64::from(millis)),
                    run,
                ),
            )
            .await?;
            if let ZeroCopyOutcome::Used(z) = &outcome {
                tracing::info!(
                    "{peer}: memtest zero-copy: {} sends, {} completed, {} copied by the kernel",
                    z.sends,
                    z.completed,
                    z.copied
                );
            }
            let done = match early.into_iter().next() {
                Some(m) => m,
                None => session::recv_live(ch, hb).await?,
            };
            match done {
                Control::Done(s) => Ok(s.bytes),
                other => Err(unexpected(&peer, other, "Done")),
            }
        }
    }
}

impl Client {
    /// Runs a memory-to-memory test against `server` (`host:port`) with this client's
    /// streams, chunk size (0: [`DEFAULT_CHUNK`]), checksum setting and socket options.
    pub async fn memtest(
        &self,
        server: &str,
        t: &MemTestOptions,
        run: Arc<Run>,
    ) -> Result<MemTestReport> {
        let chunk = match self.opts.chunk_size {
            0 => DEFAULT_CHUNK,
            c => c,
        };
        let millis = t.duration.as_millis().min(u128::from(MAX_MILLIS)) as u32;
        let op = Op::MemTest(MemTest {
            direction: t.direction,
            millis,
            zerocopy: t.zerocopy,
            congestion: t.congestion.clone().unwrap_or_default(),
        });
        let mut conn = self.open(server, op, chunk).await?.accepted(server).await?;
        let s = conn.session.clone();
        let dials = std::mem::take(&mut conn.dials);
        let streams = self
            .open_streams(
                server,
                &s,
                conn.key,
                dials,
                dmover_net::join::JoinWait::Answer,
            )
            .await?;
        let checksum = self.opts.checksum;
        let hb = Heartbeat::default();
        let (bytes, frames, seconds, zerocopy) = match t.direction {
            MemDirection::ToServer => {
                match session::recv_live(&mut conn.ch, hb).await? {
                    Control::Go => {}
                    other => return Err(unexpected(server, other, "Go")),
                }
                let started = Instant::now();
                let (outcome, early) = session::watch_control(
                    &mut conn.ch,
                    &run,
                    hb,
                    send_all(
                        streams,
                        s.chunk_size,
                        checksum,
                        t.zerocopy,
                        Duration::from_millis(u64::from(millis)),
                        &run,
                    ),
                )
                .await?;
                let done = match early.into_iter().next() {
                    Some(m) => m,
                    None => session::recv_live(&mut conn.ch, hb).await?,
                };
                let secs = started.elapsed().as_secs_f64();
                match done {
                    Control::Done(sum) => (sum.bytes, sum.chunks, secs, outcome),
                    other => return Err(unexpected(server, other, "Done")),
                }
            }
            MemDirection::FromServer => {
                conn.ch.send(&Control::Go).await?;
                let started = Instant::now();
                let ((bytes, frames), _) = session::watch_control(
                    &mut conn.ch,
                    &run,
                    hb,
                    recv_all(streams, s.chunk_size, &run),
                )
                .await?;
                let secs = started.elapsed().as_secs_f64();
                conn.ch
                    .send(&Control::Done(Summary {
                        bytes,
                        chunks: frames,
                        verified: checksum,
                        ..Summary::default()
                    }))
                    .await?;
                let zc = if t.zerocopy {
                    ZeroCopyOutcome::Remote
                } else {
                    ZeroCopyOutcome::Off
                };
                (bytes, frames, secs, zc)
            }
        };
        Ok(MemTestReport {
            bytes,
            frames,
            seconds,
            streams: s.streams,
            chunk_size: s.chunk_size,
            zerocopy,
        })
    }
}
