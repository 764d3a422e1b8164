//! The memory-to-memory network test ([`Op::MemTest`], `dmover bench net`): dmover's own
//! control channel, session machines, data streams and chunk frames, with no disk on
//! either end, so the gap between what the network carries and what file transfers
//! reach is visible.
//!
//! A test is an ordinary session of the role drivers ([`crate::drive`]) over a manifest
//! that grows while the test runs ([`features::GROWING_MANIFEST`]): the sending side's
//! storage is [`Pattern`] (a chunk is a pool buffer as it is, never written, so with
//! zero-copy the kernel sends it from there), its manifest is fed about a tenth of a
//! second ahead of the sending ([`feed`]) until the test's time is up, and the receiving
//! side's storage is [`Discard`] (checks each chunk's CRC32C when the session has
//! checksums, keeps nothing). Acknowledgements, resends after a lost stream, heartbeats
//! and errors are those of a file transfer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use dmover_net::zerocopy::ZeroCopyStats;
use dmover_proto::control::{ErrorCode, MemDirection, MemTest, Op, Summary};
use dmover_proto::digest::crc32c_append;
use dmover_proto::layout::Layout;
use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals};
use dmover_proto::session::{Limits, SinkSession, SourceSession, features};
use dmover_store::{ChunkRead, Sink, Source};
use tokio::sync::mpsc;

use crate::dialer::Dialer;
use crate::drive::{self, GrowPart, SinkStore, SourceStore, ZeroCopyUse};
use crate::engine::{Progress, Run};
use crate::error::{Error, Result};

/// Longest test a server runs, whatever the client asks.
pub const MAX_MILLIS: u32 = 120_000;
/// Chunk size of a test when the client leaves it to us.
pub const DEFAULT_CHUNK: u32 = 4 << 20;
/// How far ahead of the sending the manifest grows: long enough for the feeder's
/// looks ([`FEED_TICK`]) to keep every stream busy, short enough that a test ends
/// close to its time.
const FEED_AHEAD: Duration = Duration::from_millis(100);
/// How often the feeder looks at the sending.
const FEED_TICK: Duration = Duration::from_millis(5);
/// The feeder's rate is the chunks sent over at least this long: the first chunks
/// "cross" as fast as the sockets' buffers take them, and a rate from a few
/// milliseconds would announce seconds of sending that the test must then finish.
const RATE_OVER: Duration = Duration::from_millis(250);
/// Chunks of the (virtual) file the test's storage lays out: more than any test sends.
const LAYOUT_CHUNKS: u64 = 1 << 32;

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

impl ZeroCopyOutcome {
    fn of(z: Option<&ZeroCopyUse>) -> Self {
        match z {
            None => ZeroCopyOutcome::Off,
            Some(z) => match z.refused.lock().clone() {
                Some(why) => ZeroCopyOutcome::Unsupported(why),
                None => ZeroCopyOutcome::Used(*z.stats.lock()),
            },
        }
    }
}

/// What a test measured.
#[derive(Debug, Clone)]
pub struct MemTestReport {
    /// Payload bytes the receiver got.
    pub bytes: u64,
    /// Frames the receiver got.
    pub frames: u64,
    /// Seconds from the first chunk on a data stream until the session ended, as seen
    /// by the client.
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

/// The layout both ends' storage uses: one file far larger than any test, so every
/// chunk is a whole chunk of payload and needs no digest. The session machines check
/// chunk numbers against the manifest as it grows; this layout only says how a chunk
/// lies in its buffer.
fn test_layout(chunk: u32) -> Result<Layout> {
    let e = entry(0, u64::from(chunk) * LAYOUT_CHUNKS);
    Layout::new(&[e], chunk).map_err(layout_error)
}

fn layout_error(e: dmover_proto::Error) -> Error {
    Error::refused(ErrorCode::Protocol, e.to_string())
}

/// The manifest entry of the test's part `i`: a file of `size` bytes.
fn entry(i: u64, size: u64) -> Entry {
    Entry {
        parent: NO_PARENT,
        name: format!("memtest-{i}").into_bytes(),
        kind: EntryKind::File { size },
        mode: 0o644,
        mtime: Mtime { sec: 0, nsec: 0 },
    }
}

/// The sending side's storage: every chunk is zeros, sent from a pool buffer that is
/// never written while it holds them, so the kernel may send it zero-copy. (Only a
/// buffer an encrypting stream sealed in place is zeroed again, found by its CRC32C;
/// without checksums its bytes are sent as they are.)
pub struct Pattern {
    layout: std::sync::Arc<Layout>,
    checksum: bool,
    /// CRC32C of a chunk of zeros.
    zeros: u32,
}

impl Pattern {
    /// Storage for a test of `chunk`-byte chunks; `checksum`: a CRC32C with each.
    pub fn new(chunk: u32, checksum: bool) -> Result<Self> {
        Ok(Pattern {
            layout: test_layout(chunk)?.into(),
            checksum,
            zeros: crc32c_append(0, &vec![0; chunk as usize]),
        })
    }

    /// The chunk's CRC32C, with its bytes made zeros if they were not.
    fn settle(&self, buf: &mut [u8]) -> Option<u32> {
        if !self.checksum {
            return None;
        }
        let chunk = &mut buf[..self.layout.chunk_size() as usize];
        if crc32c_append(0, chunk) != self.zeros {
            chunk.fill(0);
        }
        Some(self.zeros)
    }
}

impl Source for Pattern {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    /// The chunks come with the manifest's parts ([`feed`]).
    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(std::iter::empty())
    }

    fn read_chunk(
        &self,
        _k: u64,
        buf: &mut [u8],
        digests: &mut Vec<dmover_proto::data::DigestEntry>,
    ) -> dmover_store::Result<ChunkRead> {
        digests.clear();
        Ok(ChunkRead {
            crc: self.settle(buf),
            n_digests: 0,
            zeros: false,
        })
    }

    fn reread_chunk(&self, _k: u64, buf: &mut [u8], _crc: Option<u32>) -> dmover_store::Result<()> {
        self.settle(buf);
        Ok(())
    }
}

impl SourceStore for Pattern {}

/// The receiving side's storage: checks each chunk's CRC32C (with checksums on),
/// counts it and forgets it.
pub struct Discard {
    layout: std::sync::Arc<Layout>,
    entries: Vec<Entry>,
    /// Chunks of the first part of the manifest.
    first: u64,
    checksum: bool,
    bytes: AtomicU64,
    chunks: AtomicU64,
}

impl Discard {
    /// Storage for the first part of a test's manifest, `entries`, in `chunk`-byte
    /// chunks.
    pub fn new(entries: Vec<Entry>, chunk: u32, checksum: bool) -> Result<Self> {
        let first = Layout::new(&entries, chunk)
            .map_err(layout_error)?
            .n_chunks();
        Ok(Discard {
            layout: test_layout(chunk)?.into(),
            entries,
            first,
            checksum,
            bytes: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
        })
    }
}

impl Sink for Discard {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(0..self.first)
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        _digests: &[dmover_proto::data::DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        let len = self.layout.wire_len(k) as usize;
        if self.checksum {
            let got = crc32c_append(0, &buf[..len]);
            if crc != Some(got) {
                return Err(dmover_store::Error::Checksum(format!(
                    "chunk {k} fails its CRC32C"
                )));
            }
        }
        self.bytes.fetch_add(len as u64, Relaxed);
        self.chunks.fetch_add(1, Relaxed);
        Ok(())
    }

    fn finish(&self) -> dmover_store::Result<Summary> {
        Ok(Summary {
            bytes: self.bytes.load(Relaxed),
            chunks: self.chunks.load(Relaxed),
            verified: self.checksum,
            ..Summary::default()
        })
    }

    fn abort(&self) {}
}

impl SinkStore for Discard {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.entries.as_slice()
    }

    fn grow(&self, _part: crate::drive::GrownPart) -> Result<()> {
        Ok(())
    }

    fn layout_chunks(&self) -> u64 {
        self.first
    }
}

/// The parts of a test's manifest so far.
struct Parts {
    chunk: u64,
    totals: Totals,
    /// Chunks announced.
    announced: u64,
}

impl Parts {
    /// The next part: a file of `n` chunks (none: no entry), `last` or not.
    fn grow(&mut self, n: u64, last: bool) -> GrowPart {
        let mut entries = Vec::new();
        if n > 0 {
            entries.push(entry(self.totals.entries, n * self.chunk));
            self.totals.entries += 1;
            self.totals.files += 1;
            self.totals.bytes += n * self.chunk;
            self.announced += n;
        }
        GrowPart {
            entries,
            totals: self.totals,
            chunks: self.announced,
            last,
            durable: None,
            times: Vec::new(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        }
    }
}

/// Feeds the sending side's growing manifest: a first part of two chunks per stream,
/// then parts that keep about [`FEED_AHEAD`] of sending announced at the rate so far,
/// until `duration` after the first chunk went out; then the last part.
///
/// `pool`: in a tuned session, the source's chunk buffers, kept announced on top: its
/// tuner measures only while chunks wait to be read or sent, and a source that has
/// read every announced chunk into its buffers has none waiting, though its streams
/// are busy (0 otherwise: the test's tail stays short).
pub fn feed(
    chunk: u32,
    streams: u16,
    pool: u64,
    duration: Duration,
    progress: Arc<Progress>,
) -> mpsc::UnboundedReceiver<GrowPart> {
    let (tx, rx) = mpsc::unbounded_channel();
    let c = u64::from(chunk);
    tokio::spawn(async move {
        let mut parts = Parts {
            chunk: c,
            totals: Totals::default(),
            announced: 0,
        };
        let first = u64::from(streams) * 2;
        if tx.send(parts.grow(first.max(2), false)).is_err() {
            return;
        }
        let mut tick = tokio::time::interval(FEED_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.is_closed() {
                return;
            }
            let Some(t0) = progress.first_data() else {
                continue;
            };
            let elapsed = t0.elapsed();
            if elapsed >= duration {
                let _ = tx.send(parts.grow(0, true));
                return;
            }
            let sent = progress.chunks.load(Relaxed);
            // A tuned session sends on the tuner's streams, not on all it has.
            let active = progress.tuning.lock().map_or(streams, |t| t.active);
            let ahead = feed_ahead(sent, elapsed, active);
            let left = parts.announced.saturating_sub(sent);
            if left < ahead + pool && tx.send(parts.grow(ahead * 2 + pool - left, false)).is_err() {
                return;
            }
        }
    });
    rx
}

/// The streams a test's first part is sized for: a tuned session starts on
/// [`crate::session::TUNED_START`] of them.
fn first_streams(streams: u16, tuned: bool) -> u16 {
    if tuned {
        streams.min(crate::session::TUNED_START)
    } else {
        streams
    }
}

/// Chunks to keep announced ahead of the sending: [`FEED_AHEAD`] of it at the rate so
/// far (`sent` chunks in `elapsed`, over at least [`RATE_OVER`]), and at least two per
/// stream sending.
fn feed_ahead(sent: u64, elapsed: Duration, streams: u16) -> u64 {
    let rate = sent as f64 / elapsed.max(RATE_OVER).as_secs_f64();
    ((rate * FEED_AHEAD.as_secs_f64()) as u64).max(u64::from(streams.max(1)) * 2)
}

/// The server's side of a test: the op `m`, the session granted with `info` (which
/// must use the growing manifest), the driver's environment.
pub(crate) async fn serve<C>(
    ch: &mut dmover_net::control::ControlChannel<C>,
    m: &MemTest,
    machine: ServeRole,
    checksum: bool,
    joins: impl drive::Joins,
    mut env: drive::Env,
) -> Result<u64>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    let peer = ch.peer().to_string();
    match machine {
        ServeRole::Source(s) => {
            let info = s.info().expect("granted").clone();
            let millis = m.millis.min(MAX_MILLIS);
            let z = m.zerocopy.then(|| Arc::new(ZeroCopyUse::default()));
            env.zerocopy = z.clone();
            // A tuned session starts on a few of its streams.
            let tuned = info.features & features::TUNING != 0;
            let pool = if tuned {
                (env.buffers)(crate::session::buffer_streams(info.streams, tuned)) as u64
            } else {
                0
            };
            let growth = feed(
                info.chunk_size,
                first_streams(info.streams, tuned),
                pool,
                Duration::from_millis(u64::from(millis)),
                env.run.progress.clone(),
            );
            let store = Pattern::new(info.chunk_size, checksum)?;
            let r = drive::source_growing(s, ch, joins, store, env, Some(growth)).await?;
            match ZeroCopyOutcome::of(z.as_deref()) {
                ZeroCopyOutcome::Used(z) => tracing::info!(
                    "{peer}: memtest zero-copy: {} sends, {} completed, {} copied by the kernel",
                    z.sends,
                    z.completed,
                    z.copied
                ),
                ZeroCopyOutcome::Unsupported(why) => {
                    tracing::info!("{peer}: memtest without zero-copy: {why}")
                }
                _ => {}
            }
            Ok(r.summary.bytes)
        }
        ServeRole::Sink(s) => {
            let prepare: drive::Prepare<Discard> =
                Box::new(move |entries, chunk, _| Discard::new(entries, chunk, checksum));
            let r = drive::sink(s, ch, joins, prepare, None, env).await?;
            Ok(r.summary.bytes)
        }
    }
}

/// The server's role in a test, its machine made and granted.
pub(crate) enum ServeRole {
    /// The server sends ([`MemDirection::FromServer`]).
    Source(SourceSession<drive::Fault>),
    /// The server receives.
    Sink(SinkSession<drive::Fault>),
}

/// Whether a session may run a test: it must use the growing manifest.
pub(crate) fn check_features(features: u64) -> Result<()> {
    if features & features::GROWING_MANIFEST == 0 {
        return Err(Error::refused(
            ErrorCode::Unsupported,
            "the memory-to-memory test needs a dmover that speaks the growing manifest \
             (upgrade the client)",
        ));
    }
    Ok(())
}

/// Runs a memory-to-memory test against `server` (`host:port`) with `dialer`'s
/// streams, chunk size (0: [`DEFAULT_CHUNK`]), checksum setting and socket options.
pub(crate) async fn run(
    dialer: &Dialer,
    server: &str,
    t: &MemTestOptions,
    run: Arc<Run>,
) -> Result<MemTestReport> {
    let chunk = match dialer.opts.chunk_size {
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
    let mut s = dialer.session(server, op, chunk, &run).await?;
    let checksum = dialer.opts.checksum;
    let (bytes, frames, streams, chunk_size, zerocopy) = match t.direction {
        MemDirection::ToServer => {
            let z = t.zerocopy.then(|| Arc::new(ZeroCopyUse::default()));
            s.env.zerocopy = z.clone();
            let m = SourceSession::dial(std::time::Instant::now(), server, s.timing, s.dial);
            // The streams are as many as the client asked for until the session says
            // otherwise: the feed's first part only sizes itself by them.
            let tuned = dialer.opts.tune;
            let pool = if tuned {
                (s.env.buffers)(crate::session::buffer_streams(dialer.opts.streams, tuned)) as u64
            } else {
                0
            };
            let growth = feed(
                chunk,
                first_streams(dialer.opts.streams, tuned),
                pool,
                Duration::from_millis(u64::from(millis)),
                run.progress.clone(),
            );
            let store = Pattern::new(chunk, checksum)?;
            let r =
                drive::source_growing(m, &mut s.ch, s.joins, store, s.env, Some(growth)).await?;
            let zc = ZeroCopyOutcome::of(z.as_deref());
            (
                r.summary.bytes,
                r.summary.chunks,
                r.info.streams,
                r.info.chunk_size,
                zc,
            )
        }
        MemDirection::FromServer => {
            let m = SinkSession::dial(
                std::time::Instant::now(),
                server,
                s.timing,
                Limits::default(),
                s.dial,
            );
            let prepare: drive::Prepare<Discard> =
                Box::new(move |entries, chunk, _| Discard::new(entries, chunk, checksum));
            let r = drive::sink(m, &mut s.ch, s.joins, prepare, Some(s.options), s.env).await?;
            let zc = if t.zerocopy {
                ZeroCopyOutcome::Remote
            } else {
                ZeroCopyOutcome::Off
            };
            (
                r.summary.bytes,
                r.summary.chunks,
                r.info.streams,
                r.info.chunk_size,
                zc,
            )
        }
    };
    let seconds = run
        .progress
        .first_data()
        .map_or(0.0, |t0| Instant::now().duration_since(t0).as_secs_f64());
    Ok(MemTestReport {
        bytes,
        frames,
        seconds,
        streams,
        chunk_size,
        zerocopy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_keeps_a_tenth_of_a_second_ahead() {
        // 1000 chunks a second: 100 ahead.
        assert_eq!(feed_ahead(2000, Duration::from_secs(2), 4), 100);
        // Slow: two per stream sending.
        assert_eq!(feed_ahead(10, Duration::from_secs(2), 4), 8);
        assert_eq!(feed_ahead(10, Duration::from_secs(2), 16), 32);
        assert_eq!(feed_ahead(0, Duration::ZERO, 0), 2);
    }

    #[test]
    fn the_first_chunks_do_not_inflate_the_feed() {
        // 32 chunks "sent" in 5 ms went into socket buffers: counted over 250 ms, they
        // announce 12 chunks ahead (two per stream: 32), not 640 (20 s of sending at
        // the real rate of a slow link).
        assert_eq!(feed_ahead(32, Duration::from_millis(5), 16), 32);
        assert_eq!(feed_ahead(32, Duration::from_millis(5), 4), 12);
    }
}
