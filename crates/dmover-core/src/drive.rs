//! The drivers of the session machines ([`dmover_proto::session`]): one per role, the
//! same for both sides of the control connection.
//!
//! ```text
//!                    ┌──────────── driver task (owns the machine) ────────────┐
//! control channel ──▶│ handle_control          poll_transmit ──▶ control channel│
//! joins ────────────▶│ stream_joined/failed    poll_command  ──▶ stream tasks   │
//! stream tasks ─────▶│ acked/arrived/stream_end  (Send, End, Ack, Close, Open)  │
//! disk pool ────────▶│ chunk_read/written      poll_event    ──▶ storage steps  │
//! clock ────────────▶│ handle_timeout          poll_timeout                     │
//!                    └────────────────────────────────────────────────────────┘
//! ```
//! A driver feeds the machine what happened, with the time from tokio's clock, and does
//! what it asks: sends control messages, opens, feeds and closes data streams, runs the
//! storage steps (prepare, resume, read, write, finish) on the disk pool. Data streams
//! run as tasks of their own that move chunk buffers between the pool and the
//! [`DataLink`]: a chunk is read into a pool buffer on a disk thread, handed to the
//! stream the machine names and written from that buffer (the machine names chunks,
//! never holds their bytes); at the sink a frame is read straight into a pool buffer,
//! the machine says whether it is the first copy, and a disk thread writes it.
//!
//! Which side dialed is the caller's business: [`Joins`] is how data streams come (the
//! dialer opens them when the machine asks, the acceptor receives them from its join
//! listener), and the machine was made with `dial` or `accept`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use dmover_net::NetError;
use dmover_net::control::ControlChannel;
use dmover_net::join::Joined;
use dmover_net::stream::DataIo;
use dmover_net::tcp;
use dmover_net::tcpinfo::TcpMeter;
use dmover_net::transport::{AckRx, ChunkFrame, ChunkTx, DataLink};
use dmover_net::zerocopy::ZeroCopyStats;
use dmover_proto::control::{
    Auth, AuthOk, Control, ErrorCode, FailedFile, Have, Hello, Open, Plan, SendReport, SessionInfo,
    SessionLimits, SessionOptions, Summary, Tuned,
};
use dmover_proto::data::{DIGEST_LEN, FrameHeader, FrameKind, FrameLimits, PART_LEN};
use dmover_proto::manifest::{Entry, EntryKind, Totals};
use dmover_proto::session::tune::{Pressure, TuneConfig, Tuner};
use dmover_proto::session::{
    AcceptEvent, Acceptance, Arrival, Cause, ChunkMeta, ChunkSet, PartRange, ReadJob, SessionError,
    Side, SinkCommand, SinkEvent, SinkSession, SourceCommand, SourceEvent, SourceSession,
    StreamStats, Timing, features,
};
use dmover_store::fault::Slow;
use dmover_store::resume::Held;
use dmover_store::sink::FileSink;
use dmover_store::source::FileSource;
use dmover_store::{Sink, Source};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::buffers::Buffers;
use crate::diskpool::DiskPool;
use crate::disktune::DiskTuner;
use crate::engine::{DataStream, DiskTuning, Progress, ProgressEvent, Run, Tuning};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolBuf};

/// The drivers' error type as the machines see it: an [`Error`] that can be cloned
/// (the machine may name it in an event and keep it as the session's failure) and
/// handed back whole at the end.
#[derive(Debug, Clone)]
pub struct Fault {
    error: Arc<Mutex<Option<Error>>>,
    text: Arc<str>,
    code: ErrorCode,
    rank: u8,
    ends_session: bool,
}

impl Fault {
    /// Wraps `e`.
    pub fn new(e: Error) -> Self {
        Fault {
            text: e.to_string().into(),
            code: e.code(),
            rank: e.rank(),
            ends_session: e.ends_session(),
            error: Arc::new(Mutex::new(Some(e))),
        }
    }

    /// This side's run was cancelled (the user, a steering client gone, a revoked
    /// credential), or this side found the fault (a message it cannot decode): the
    /// root cause, so the machine fails at once instead of waiting briefly for the
    /// peer's report as it does for a broken connection.
    fn cancelled(why: Error) -> Self {
        let rank = why.rank().max(3);
        Fault {
            rank,
            ..Fault::new(why)
        }
    }

    /// The error (once; a copy of its class and text after that).
    pub fn into_error(self) -> Error {
        self.error.lock().take().unwrap_or_else(|| Error::Refused {
            code: self.code,
            message: self.text.to_string(),
        })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Cause for Fault {
    fn code(&self) -> ErrorCode {
        self.code
    }

    fn rank(&self) -> u8 {
        self.rank
    }

    fn ends_session(&self) -> bool {
        self.ends_session
    }
}

impl From<Error> for Fault {
    fn from(e: Error) -> Self {
        Fault::new(e)
    }
}

/// The engine's error for a session failure the machine reports, with the texts, codes
/// and retry classes the engine gives the same failures.
pub fn session_error(e: SessionError<Fault>) -> Error {
    let text = e.to_string();
    match e {
        SessionError::Remote {
            peer,
            code,
            message,
        } => Error::Remote {
            peer,
            code,
            message,
        },
        SessionError::Unexpected { peer, wanted, got } => {
            Error::protocol(peer, format!("expected {wanted}, got {got}"))
        }
        SessionError::Protocol { peer, what } => Error::protocol(peer, what),
        SessionError::Malformed { peer, source } => Error::Net(NetError::proto(peer, source)),
        SessionError::Limit(what) => Error::refused(ErrorCode::Busy, what),
        SessionError::AuthRequired { .. } | SessionError::ServerProof { .. } => {
            Error::refused(ErrorCode::Auth, text)
        }
        SessionError::Silent { peer, secs } => Error::Net(NetError::Timeout {
            peer,
            what: "heartbeat: the peer went silent",
            secs,
        }),
        SessionError::Timeout { peer, what, secs } => {
            Error::Net(NetError::Timeout { peer, what, secs })
        }
        SessionError::Stalled { peer, secs, .. } => Error::Net(NetError::Timeout {
            peer,
            what: "acknowledgements on a data stream",
            secs,
        }),
        SessionError::Idle { peer, secs, .. } => Error::Net(NetError::io(
            "receiving data from",
            peer,
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no progress receiving for {secs} s"),
            ),
        )),
        SessionError::SetupTimeout { .. } | SessionError::Joins { .. } => {
            Error::refused(ErrorCode::Protocol, text)
        }
        SessionError::Stream { error, .. } | SessionError::Local(error) => error.into_error(),
        _ => Error::refused(ErrorCode::Protocol, text),
    }
}

/// The time limits of a session driven here.
pub fn timing(heartbeat: Duration, idle: Duration) -> Timing {
    Timing {
        handshake: crate::session::HANDSHAKE_TIMEOUT,
        heartbeat,
        silent_intervals: crate::session::SILENT_INTERVALS,
        stall: idle,
        stuck: dmover_proto::session::STUCK.min(idle),
        idle: Some(idle),
        join: crate::session::HANDSHAKE_TIMEOUT,
        report_wait: Duration::from_secs(2),
    }
}

/// The chunks `it` lists, as a set.
pub fn chunk_set(it: impl Iterator<Item = u64>) -> ChunkSet {
    let mut s = ChunkSet::new();
    for k in it {
        s.insert_range(k..k + 1);
    }
    s
}

/// How a session's data streams come: opened by the dialer when its machine asks, or
/// joined by the dialer and handed over by the acceptor's join listener.
pub trait Joins: Send {
    /// The data streams' transport.
    type Link: DataLink;

    /// (dialer) The session is open: its streams may be opened.
    fn opened(&mut self, info: &SessionInfo);

    /// (dialer) Opens and joins stream `stream`; the outcome comes from
    /// [`Joins::next`].
    fn open(&mut self, stream: u16);

    /// The next stream that joined, or failed to. Cancel-safe; pending for ever when no
    /// more can come.
    fn next(&mut self) -> impl Future<Output = (u16, Result<DataStream<Self::Link>>)> + Send;
}

/// Data streams handed over by an acceptor's join listener ([`JoinTable`]), each
/// wrapped on the way (fault injection).
///
/// [`JoinTable`]: dmover_net::join::JoinTable
pub struct Accepted<S, L> {
    rx: mpsc::Receiver<Joined<S>>,
    wrap: Box<dyn Fn(DataIo<S>) -> L + Send>,
}

impl<S, L> Accepted<S, L> {
    /// Streams from `rx`, wrapped with `wrap`.
    pub fn new(
        rx: mpsc::Receiver<Joined<S>>,
        wrap: impl Fn(DataIo<S>) -> L + Send + 'static,
    ) -> Self {
        Accepted {
            rx,
            wrap: Box::new(wrap),
        }
    }

    /// The listener's channel, unwrapped (for sessions no machine drives).
    pub fn into_inner(self) -> mpsc::Receiver<Joined<S>> {
        self.rx
    }
}

impl<S: Send, L: DataLink> Joins for Accepted<S, L> {
    type Link = L;

    fn opened(&mut self, _info: &SessionInfo) {}

    fn open(&mut self, _stream: u16) {}

    async fn next(&mut self) -> (u16, Result<DataStream<L>>) {
        match self.rx.recv().await {
            Some(j) => (
                j.stream,
                Ok(DataStream {
                    io: (self.wrap)(j.io),
                    peer: j.peer,
                }),
            ),
            None => std::future::pending().await,
        }
    }
}

/// A source's storage before data flows: what the sink's resume and the dialer's
/// options change, and what the report lists.
pub trait SourceStore: Source + Sized + 'static {
    /// Leaves out what the sink holds (`parts`, checked against the data here) and
    /// returns the plan to answer with.
    fn resume_from(&mut self, peer: &str, parts: &[Have]) -> Result<Plan> {
        let _ = parts;
        Err(Error::protocol(peer, "resume: this source cannot resume"))
    }

    /// Reports unreadable files instead of failing on them.
    fn set_continue_on_error(&mut self, _on: bool) {}

    /// Files that could not be read.
    fn failed(&self) -> Vec<FailedFile> {
        Vec::new()
    }

    /// Bytes the sink already held.
    fn held_bytes(&self) -> u64 {
        0
    }

    /// (growing manifest) Takes a later part of the manifest, `entries` (numbered
    /// after the earlier parts'), of which `sparse` may have holes (a live walk's,
    /// feature `WALKING`), cut into chunks of `chunk` bytes (the session's, or with
    /// [`SourceStore::part_chunks`] another no larger), and returns the layout's
    /// length in chunks with it; `None`: the storage reads any chunk already (the
    /// part says its length).
    fn grow(&self, entries: &[Entry], sparse: &[u32], chunk: u32) -> Result<Option<u64>> {
        let _ = (entries, sparse, chunk);
        Ok(None)
    }

    /// Whether [`SourceStore::grow`] lays a part out in chunks of the size it is
    /// given (feature `PART_CHUNKS`); otherwise every part is in the session's.
    fn part_chunks(&self) -> bool {
        false
    }

    /// (feature `METADATA`, growing manifest) Owners and extended attributes of the
    /// entries `from..` to send with a later part, and the entry count read up to.
    fn grown_meta(&self, from: u32) -> (Vec<dmover_proto::manifest::EntryMeta>, u32) {
        (Vec::new(), from)
    }
}

impl SourceStore for FileSource {
    fn grow(&self, entries: &[Entry], sparse: &[u32], chunk: u32) -> Result<Option<u64>> {
        Ok(Some(FileSource::grow(
            self,
            entries.to_vec(),
            sparse,
            chunk,
        )?))
    }

    fn part_chunks(&self) -> bool {
        true
    }

    fn grown_meta(&self, from: u32) -> (Vec<dmover_proto::manifest::EntryMeta>, u32) {
        FileSource::grown_meta(self, from)
    }

    fn resume_from(&mut self, peer: &str, parts: &[Have]) -> Result<Plan> {
        let chunk = self.layout().chunk_size() as u32;
        let mut held = Held::from_have(self.tree().entries(), chunk, parts)
            .map_err(|e| Error::protocol(peer, format!("resume: {e}")))?;
        let plan = Plan {
            stale: self.check_held(&held),
        };
        held.apply(&plan)
            .map_err(|e| Error::protocol("this side", e))?;
        self.resume(&held)?;
        Ok(plan)
    }

    fn set_continue_on_error(&mut self, on: bool) {
        FileSource::set_continue_on_error(self, on)
    }

    fn failed(&self) -> Vec<FailedFile> {
        FileSource::failed(self)
    }

    fn held_bytes(&self) -> u64 {
        FileSource::held_bytes(self)
    }
}

impl SourceStore for dmover_store::mem::MemSource {}

/// A sink's storage before data flows: what an earlier attempt left, and the resume.
pub trait SinkStore: Sink + Sized + 'static {
    /// (growing manifest) Makes room for a later part of the manifest: its entries,
    /// whose data are the layout's `chunks`, with the owners and extended attributes
    /// that came with it (feature `METADATA`) and its sparse files (feature
    /// `WALKING`). Storage that cannot grow refuses.
    fn grow(&self, part: GrownPart) -> Result<()> {
        Err(Error::refused(
            ErrorCode::Unsupported,
            format!(
                "this destination cannot take a growing manifest (chunks {:?})",
                part.chunks
            ),
        ))
    }

    /// The layout's length in chunks (of a growing manifest: so far).
    fn layout_chunks(&self) -> u64 {
        self.layout().n_chunks()
    }

    /// What an earlier attempt left (reads the journal); by default nothing (storage
    /// that keeps nothing between sessions).
    fn held(&self) -> Held {
        Held::none(&self.entries())
    }

    /// The manifest's entries (of a growing manifest: so far).
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_;

    /// Leaves out what is held; by default only nothing can be (see
    /// [`SinkStore::held`]).
    fn resume(&mut self, held: &Held) -> Result<()> {
        if held.is_empty() {
            Ok(())
        } else {
            Err(Error::refused(
                ErrorCode::Unsupported,
                "this destination keeps nothing to resume from",
            ))
        }
    }

    /// Bytes an earlier attempt left.
    fn held_bytes(&self) -> u64 {
        0
    }

    /// Names the files that may have holes (the source's list, entry indices): file
    /// storage keeps them sparse; by default nothing changes.
    fn set_sparse(&mut self, entries: Vec<u32>) {
        let _ = entries;
    }

    /// (feature `METADATA`) The source's owners and extended attributes of the
    /// manifest's entries; storage that keeps none ignores them.
    fn set_meta(&mut self, meta: Vec<dmover_proto::manifest::EntryMeta>) {
        let _ = meta;
    }

    /// (feature `CONTINUOUS`) Newer modification times of directories of the
    /// manifest, to set at the end; storage that keeps none ignores them.
    fn set_times(&self, times: Vec<(u32, dmover_proto::manifest::Mtime)>) {
        let _ = times;
    }
}

impl SinkStore for FileSink {
    fn set_times(&self, times: Vec<(u32, dmover_proto::manifest::Mtime)>) {
        FileSink::set_times(self, times)
    }

    fn grow(&self, part: GrownPart) -> Result<()> {
        Ok(FileSink::grow(
            self,
            part.entries,
            part.chunks,
            part.meta,
            part.sparse,
            part.chunk,
        )?)
    }

    fn set_meta(&mut self, meta: Vec<dmover_proto::manifest::EntryMeta>) {
        FileSink::set_meta(self, meta)
    }

    fn held(&self) -> Held {
        FileSink::held(self)
    }

    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.tree_entries()
    }

    fn resume(&mut self, held: &Held) -> Result<()> {
        Ok(FileSink::resume(self, held)?)
    }

    fn held_bytes(&self) -> u64 {
        FileSink::held_bytes(self)
    }

    fn set_sparse(&mut self, entries: Vec<u32>) {
        FileSink::set_sparse(self, entries)
    }
}

impl SinkStore for dmover_store::mem::MemSink {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        dmover_store::mem::MemSink::entries(self)
    }
}

/// What a driver needs besides the machine, the control channel and the streams.
pub struct Env {
    /// Disk threads for storage steps.
    pub disk: Arc<DiskPool>,
    /// Cancellation (the user) and live counters.
    pub run: Arc<Run>,
    /// Pool buffers for a session of this many streams.
    pub buffers: Box<dyn Fn(u16) -> usize + Send>,
    /// Injected slowness of every chunk read or write (fault tests).
    pub chunk_delay: Option<Duration>,
    /// A source's data streams send zero-copy ([`ChunkTx::zerocopy`]): only for
    /// storage that never rewrites a buffer the kernel may still read (the memory test).
    pub zerocopy: Option<Arc<ZeroCopyUse>>,
    /// (acceptor, feature LIMITS) This side's answer to the dialer's limits; it may act
    /// on them first (a server sets the congestion control asked for on its sending
    /// ends). `None`: it answers that it has no limits.
    pub limits: Option<LimitsAnswer>,
    /// (a sink) The receive buffer its data streams may hold together
    /// ([`tcp::receive_budget`]); `None`: the kernel's autotuning alone (the user set
    /// `SO_RCVBUF`, or the streams are not TCP).
    pub receive_budget: Option<u64>,
    /// (a source) The send buffer its data streams may hold together, where a
    /// stream's autotuning reached the host's maximum and it waited on it
    /// ([`tcp::receive_budget`]'s size; [`crate::buffers`]); `None`: the kernel's
    /// autotuning alone (the user set `SO_SNDBUF`, or the streams are not TCP).
    pub send_budget: Option<u64>,
    /// (a source, feature TUNING) The streams its tuner starts with
    /// ([`crate::session::tuned_start`]).
    pub tuned_start: u16,
    /// With an elastic disk pool ([`DiskPool::elastic`]): how many more chunk buffers
    /// the session may have, of the number asked for (a server's memory budget), for
    /// the threads its disk tuner adds ([`crate::disktune`]). `None`: the disk
    /// threads are not tuned (pinned by `--io-threads`, or the buffers by `--buffers`).
    pub disk_room: Option<DiskRoom>,
}

/// See [`Env::disk_room`].
pub type DiskRoom = Box<dyn FnMut(usize) -> usize + Send>;

/// A session's disk tuner and what it acts on: this side's disk pool (threads) and
/// the session's chunk buffers, which grow with the threads so that each added thread
/// has a chunk to read or write.
struct DiskTune {
    tuner: DiskTuner,
    disk: Arc<DiskPool>,
    room: DiskRoom,
    /// The threads the session's buffers were sized for, and the buffers added since.
    start: usize,
    added: usize,
    /// What [`Progress::disk`] last heard: (kept, changes).
    told: Option<(usize, u32)>,
}

/// The most bytes of chunk buffers a session's disk tuner adds: 256 one-MiB chunks, or
/// 16 of 16 MiB (the threads grow on, sharing the buffers).
const EXTRA_BUFFER_BYTES: usize = 256 << 20;

impl DiskTune {
    /// A tuner when this side's disk pool is elastic and `env` gives room for buffers.
    fn new(env: &mut Env) -> Option<Self> {
        if !env.disk.elastic_pool() {
            return None;
        }
        let room = env.disk_room.take()?;
        let threads = env.disk.threads();
        Some(DiskTune {
            tuner: DiskTuner::new(threads, env.disk.max()),
            disk: env.disk.clone(),
            room,
            start: threads,
            added: 0,
            told: None,
        })
    }

    fn poll_timeout(&self) -> Option<std::time::Instant> {
        self.tuner.poll_timeout()
    }

    /// One step: `working`, whether the session has data to move now; `remaining`,
    /// the bytes left to move if known.
    fn step(
        &mut self,
        p: &Progress,
        pool: &Pool,
        working: bool,
        remaining: Option<u64>,
        peer: &str,
    ) {
        if !working {
            self.tuner.pause();
            return;
        }
        self.tuner.set_remaining(remaining);
        let d = self
            .tuner
            .tick(now(), p.bytes.load(Relaxed), self.disk.waited());
        if let Some(note) = self.tuner.take_note() {
            tracing::info!("disk threads of the transfer with {peer}: {note}");
        }
        // Told when it changes (this runs on every turn of the driver's loop).
        let now_at = (self.tuner.kept(), self.tuner.changes());
        if self.told != Some(now_at) {
            self.told = Some(now_at);
            *p.disk.lock() = Some(DiskTuning {
                threads: now_at.0,
                of: self.disk.max(),
                changes: now_at.1,
            });
        }
        let Some(d) = d else { return };
        // A buffer for each thread added, at most EXTRA_BUFFER_BYTES of them.
        let cap = EXTRA_BUFFER_BYTES / pool.buf_size().max(1);
        let want = d
            .threads
            .saturating_sub(self.start + self.added)
            .min(cap.saturating_sub(self.added));
        if want > 0 {
            let more = (self.room)(want);
            pool.grow(more);
            self.added += more;
        }
        self.disk.grow_to(d.threads);
        tracing::info!("disk threads of the transfer with {peer}: {}", d.reason);
        p.event(ProgressEvent::DiskTuned {
            threads: d.threads,
            rate: d.rate,
            reason: d.reason,
        });
    }
}

impl Drop for DiskTune {
    /// A probe the session ended during was never judged: its threads go (the pool,
    /// a server's shared by its sessions, keeps only what paid).
    fn drop(&mut self) {
        if self.tuner.kept() < self.tuner.threads() {
            self.disk.grow_to(self.tuner.kept());
        }
    }
}

/// The bytes a session still has to move, once its manifest is complete.
fn remaining(p: &Progress, complete: bool) -> Option<u64> {
    let total = p.total.load(Relaxed);
    (total > 0 && complete).then(|| {
        let done = p.bytes.load(Relaxed) + p.held.load(Relaxed) + p.holes.load(Relaxed);
        total.saturating_sub(done)
    })
}

/// See [`Env::limits`].
pub type LimitsAnswer = Box<dyn FnMut(&SessionLimits) -> SessionLimits + Send>;

/// The peer's limits came (feature LIMITS): an acceptor's answer, or, for a dialer,
/// nothing to answer: it keeps the acceptor's for its report
/// ([`crate::engine::Progress::peer_limits`]) and warns when the congestion control it
/// asked for was refused.
fn peer_limits(side: Side, env: &mut Env, peer: &str, l: SessionLimits) -> Option<SessionLimits> {
    match side {
        Side::Acceptor => Some(env.limits.as_mut().map(|f| f(&l)).unwrap_or_default()),
        Side::Dialer => {
            if !l.refused.is_empty() {
                tracing::warn!(
                    "{peer} cannot send with the congestion control asked for: {}; its data \
                     streams use {}",
                    l.refused.escape_debug(),
                    if l.congestion.is_empty() {
                        "its default".to_string()
                    } else {
                        format!("{:?}", l.congestion)
                    }
                );
            } else if !l.congestion.is_empty() {
                tracing::debug!("{peer} sends with congestion control {:?}", l.congestion);
            }
            *env.run.progress.peer_limits.lock() = Some(l);
            None
        }
    }
}

/// What a source's zero-copy sends did, over all its data streams.
#[derive(Debug, Default)]
pub struct ZeroCopyUse {
    /// The counters of the streams that ended.
    pub stats: Mutex<ZeroCopyStats>,
    /// Why a stream could not send zero-copy (it sent the ordinary way).
    pub refused: Mutex<Option<String>>,
}

/// A part of a manifest that grows while the session runs (feature
/// [`dmover_proto::session::features::GROWING_MANIFEST`]; see
/// [`SourceSession::grow_manifest`]): fed to [`source_growing`] by whatever produces
/// the entries. Storage that grows ([`SourceStore::grow`], file storage) takes the
/// part's entries when it comes and lays them out (`chunks` is then its answer);
/// other storage must read the part's chunks by the time the part comes.
#[derive(Debug)]
pub struct GrowPart {
    /// The part's entries, numbered after every earlier part's.
    pub entries: Vec<Entry>,
    /// Totals over every part so far.
    pub totals: Totals,
    /// The layout's length in chunks with this part.
    pub chunks: u64,
    /// The manifest is complete.
    pub last: bool,
    /// Told once the part is durable at the sink: bound to its storage and every
    /// chunk of it (and before it) written, so its files are complete under their
    /// final names (as the sink says with feature `CONTINUOUS`; without it, at the end
    /// of the session). Dropped unsent if the session fails first.
    pub durable: Option<tokio::sync::oneshot::Sender<()>>,
    /// (feature `CONTINUOUS`) Newer modification times of directories of earlier
    /// parts, sent before this part.
    pub times: Vec<(u32, dmover_proto::manifest::Mtime)>,
    /// (feature `METADATA`) Owners and extended attributes of this part's entries
    /// read already (a streamed walk's, read with the whole tree), sent before its
    /// `Grow` with what the storage reads of a later part
    /// ([`SourceStore::grown_meta`]).
    pub meta: Vec<dmover_proto::manifest::EntryMeta>,
    /// (the first part of a push's streamed manifest) Its entries went already, in
    /// the first flight: in a session without the feature `STREAMED` (not offered)
    /// the later parts follow them as one whole manifest, ended by `ManifestEnd`.
    pub sent: bool,
    /// (a live walk's part, feature `WALKING`) Its files that may have holes (entry
    /// indices, ascending), listed before its `Grow`.
    pub sparse: Vec<u32>,
}

/// A walked manifest sent in parts (a streamed manifest, feature `STREAMED`): `first`
/// (the first part's entries, which the source's storage holds already, laid out in
/// `first_chunks` chunks) and then `rest` cut at `ends` (the parts' ends, counted in
/// entries from the first, as [`crate::session::manifest_parts`] gives them; the
/// first end is `first.len()`), each part with the totals over every part so far and
/// its entries' share of `meta` (the whole tree's, by entry). A later part's chunks
/// are left to the storage, which lays it out when it comes.
pub fn streamed_parts(
    first: Vec<Entry>,
    first_chunks: u64,
    mut rest: Vec<Entry>,
    ends: &[usize],
    mut meta: Vec<dmover_proto::manifest::EntryMeta>,
) -> Vec<GrowPart> {
    meta.sort_by_key(|m| m.entry);
    let mut meta = meta.into_iter().peekable();
    let mut take_meta = |end: usize| {
        let mut v = Vec::new();
        while let Some(m) = meta.next_if(|m| (m.entry as usize) < end) {
            v.push(m);
        }
        v
    };
    let mut totals = Totals::of(&first);
    let n = first.len();
    let mut parts = vec![GrowPart {
        last: rest.is_empty(),
        totals,
        chunks: first_chunks,
        meta: take_meta(n),
        sent: false,
        entries: first,
        durable: None,
        times: Vec::new(),
        sparse: Vec::new(),
    }];
    // Ends past the first part, the last being the manifest's end.
    let total = n + rest.len();
    let mut ends: Vec<usize> = ends
        .iter()
        .copied()
        .filter(|&e| e > n && e < total)
        .collect();
    if !rest.is_empty() {
        ends.push(total);
    }
    let mut start = n;
    for end in ends {
        let tail = rest.split_off(end - start);
        let entries = std::mem::replace(&mut rest, tail);
        totals = totals.plus(Totals::of(&entries));
        parts.push(GrowPart {
            last: rest.is_empty(),
            totals,
            chunks: 0,
            meta: take_meta(end),
            sent: false,
            entries,
            durable: None,
            times: Vec::new(),
            sparse: Vec::new(),
        });
        start = end;
    }
    parts
}

/// How long a control message may take to go out before the connection counts as
/// broken (the peer stopped reading): the default heartbeat silence.
const SEND_LIMIT: Duration = Duration::from_secs(
    crate::session::HEARTBEAT.as_secs() * crate::session::SILENT_INTERVALS as u64,
);

/// What a driver loop needs of any of the machines to run their control connection.
trait Machine {
    fn poll_transmit(&mut self) -> Option<Control>;
    fn control_closed(&mut self, now: std::time::Instant, error: Fault);
}

macro_rules! machine {
    ($t:ty) => {
        impl Machine for $t {
            fn poll_transmit(&mut self) -> Option<Control> {
                <$t>::poll_transmit(self)
            }
            fn control_closed(&mut self, now: std::time::Instant, error: Fault) {
                <$t>::control_closed(self, now, error)
            }
        }
    };
}
machine!(Acceptance<Fault>);
machine!(SourceSession<Fault>);
machine!(SinkSession<Fault>);

/// The control channel's side of a driver loop.
struct ControlLink<'a, C> {
    ch: &'a mut ControlChannel<C>,
    open: bool,
    /// Messages may still be read (not after one that could not be decoded: what
    /// follows it may be out of step).
    readable: bool,
}

impl<'a, C: AsyncRead + AsyncWrite + Unpin + Send> ControlLink<'a, C> {
    fn new(ch: &'a mut ControlChannel<C>) -> Self {
        ControlLink {
            ch,
            open: true,
            readable: true,
        }
    }

    /// Sends what `m` has to send; a broken connection is the machine's to handle.
    async fn flush(&mut self, m: &mut impl Machine) {
        let out: Vec<Control> = std::iter::from_fn(|| m.poll_transmit()).collect();
        if !out.is_empty() {
            if let Some(e) = self.send_all(out).await {
                m.control_closed(now(), Fault::new(e));
            }
        }
    }

    /// Sends `msgs` in one write ([`ControlChannel::send_all`]); the connection's
    /// failure, if it failed. Each message may take [`SEND_LIMIT`], as when they went
    /// one by one. A peer that refused the session closes the connection after its
    /// `Error`: a failed send is explained by that report when one came.
    async fn send_all(&mut self, msgs: Vec<Control>) -> Option<Error> {
        if !self.open || msgs.is_empty() {
            return None;
        }
        let limit = SEND_LIMIT * u32::try_from(msgs.len()).unwrap_or(u32::MAX);
        match tokio::time::timeout(limit, self.ch.send_all(&msgs)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                self.open = false;
                Some(crate::session::peer_report(self.ch, Error::Net(e)).await)
            }
            Err(_) => {
                self.open = false;
                Some(Error::Net(NetError::Timeout {
                    peer: self.ch.peer().to_string(),
                    what: "heartbeat: the peer went silent",
                    secs: SEND_LIMIT.as_secs().max(1),
                }))
            }
        }
    }

    async fn recv(&mut self) -> std::result::Result<Control, NetError> {
        if !self.open || !self.readable {
            return std::future::pending().await;
        }
        self.ch.recv().await
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

async fn sleep_until(t: Option<std::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

/// A stream task: where to send it work, and how to stop it.
struct Task<T> {
    tx: mpsc::UnboundedSender<T>,
    abort: AbortHandle,
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.abort.abort();
    }
}

// ---------------------------------------------------------------------------------
// Acceptor's handshake

/// Drives an acceptor's handshake ([`Acceptance`]) until the dialer's `Open`:
/// `verify` checks the credential (with the dialer's hello) and gives the answer. A
/// failure has been reported to the dialer when this returns.
///
/// The channel's frame limit is raised to [`dmover_proto::control::MAX_FRAME`], and
/// packed frames are read, as soon as `verify` accepted the credential, before `Open`
/// is read (an `Open` may carry a `--files-from` list larger than the limit for
/// unauthenticated peers).
pub async fn accept<C>(
    mut m: Acceptance<Fault>,
    ch: &mut ControlChannel<C>,
    mut verify: impl FnMut(&Hello, &Auth) -> Result<AuthOk>,
) -> Result<Open>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut ctl = ControlLink::new(ch);
    loop {
        ctl.flush(&mut m).await;
        if let Some(ev) = m.poll_event() {
            match ev {
                AcceptEvent::Verify { hello, auth } => match verify(&hello, &auth) {
                    Ok(ok) => {
                        ctl.ch.authenticated();
                        m.verified(now(), ok)
                    }
                    Err(e) => m.fail(now(), Fault::new(e)),
                },
                AcceptEvent::Opened(open) => return Ok(open),
                AcceptEvent::Failed(e) => {
                    ctl.flush(&mut m).await;
                    return Err(session_error(e));
                }
            }
            continue;
        }
        let deadline = m.poll_timeout();
        tokio::select! {
            msg = ctl.recv() => match msg {
                Ok(msg) => m.handle_control(now(), msg),
                // A message this side cannot decode (a newer client's `Open`, say): the
                // connection still works, so the peer is told why (`Error{Protocol}`).
                Err(e @ NetError::Proto { .. }) => {
                    ctl.readable = false;
                    m.fail(now(), Fault::cancelled(Error::Net(e)));
                }
                Err(e) => {
                    ctl.open = false;
                    m.control_closed(now(), Fault::new(Error::Net(e)));
                }
            },
            _ = sleep_until(deadline) => m.handle_timeout(now()),
        }
    }
}

// ---------------------------------------------------------------------------------
// Source

/// What a source session achieved.
pub struct SourceRun<K> {
    /// The session.
    pub info: SessionInfo,
    /// The sink's summary.
    pub summary: Summary,
    /// What the streams went through.
    pub stats: StreamStats,
    /// The storage, for its report.
    pub store: Arc<K>,
}

enum SrcIn<K> {
    Read {
        chunk: u64,
        read: Result<(PoolBuf, ChunkMeta)>,
    },
    Written {
        stream: u16,
        chunk: u64,
    },
    Acked {
        stream: u16,
        frames: u64,
    },
    Failed {
        stream: u16,
        error: Error,
    },
    Checked(Box<(K, Result<(Plan, ChunkSet)>)>),
}

enum SrcOut {
    Chunk {
        chunk: u64,
        buf: PoolBuf,
        meta: ChunkMeta,
        segments: Vec<(usize, usize)>,
    },
    End(u64),
}

/// Drives the source role `m` until the session ends. The manifest must already be
/// queued on `m` (see [`SourceSession::push_manifest`]).
pub async fn source<C, J, K>(
    m: SourceSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    store: K,
    env: Env,
) -> Result<SourceRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    source_growing(m, ch, joins, store, env, None).await
}

/// [`source`] of a manifest that grows while the session runs: the parts come from
/// `growth` (the first of them stands for the whole manifest of [`source`]); the
/// session must use [`dmover_proto::session::features::GROWING_MANIFEST`]. The
/// storage must read a part's chunks by the time the part comes.
pub async fn source_growing<C, J, K>(
    mut m: SourceSession<Fault>,
    ch: &mut ControlChannel<C>,
    mut joins: J,
    store: K,
    mut env: Env,
    mut growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
) -> Result<SourceRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    let mut ctl = ControlLink::new(ch);
    let peer = ctl.ch.peer().to_string();
    let (tx, mut rx) = mpsc::unbounded_channel::<SrcIn<K>>();
    let mut prep = Some(store);
    let mut live: Option<(Arc<K>, Arc<dyn Source>, Pool)> = None;
    let mut spare: Option<PoolBuf> = None;
    // Chunks read and not yet sent, by chunk and part (a request-driven session may
    // read parts of one chunk for several reads at once).
    let mut bufs: HashMap<(u64, Option<PartRange>), PoolBuf> = HashMap::new();
    let mut tasks: HashMap<u16, Task<SrcOut>> = HashMap::new();
    let mut cancelled = false;
    let mut growing = growth.is_some();
    let mut tuner: Option<Tuner> = None;
    let mut disk_tune: Option<DiskTune> = None;
    // Reads on the disk threads, for the disk tuner: the data wait on them too when
    // every chunk left is being read.
    let mut reading = 0usize;
    let mut meters = Meters::default();
    let mut sendbufs = Buffers::new(
        tcp::Buffer::Send,
        env.send_budget,
        env.run.progress.clone(),
        &peer,
    );
    // Parts so far, and those whose producer waits to hear they are durable: (the
    // part's number, the layout's end with it, whom to tell).
    let mut parts = 0u64;
    let mut meta_from = 0u32;
    let mut durable: VecDeque<(u64, u64, tokio::sync::oneshot::Sender<()>)> = VecDeque::new();
    loop {
        if let Some(t) = tuner.as_mut() {
            tune_step(t, &mut m, &meters, &env.run.progress, &peer);
            sendbufs.sending(t.streams());
        }
        sendbufs.check(now());
        if let (Some(t), Some((.., pool))) = (disk_tune.as_mut(), &live) {
            let left = remaining(&env.run.progress, m.manifest_complete());
            t.step(
                &env.run.progress,
                pool,
                m.has_work() || reading > 0,
                left,
                &peer,
            );
        }
        while let Some((i, end, _)) = durable.front() {
            if m.parts_confirmed() <= *i || m.stored_below() < *end {
                break;
            }
            if let Some((.., tell)) = durable.pop_front() {
                let _ = tell.send(());
            }
        }
        // What the machine asks, until it asks nothing more.
        loop {
            ctl.flush(&mut m).await;
            let mut busy = false;
            while let Some(c) = m.poll_command() {
                busy = true;
                match c {
                    SourceCommand::Open { stream } => joins.open(stream),
                    SourceCommand::Send {
                        stream,
                        chunk,
                        meta,
                    } => {
                        let (Some(buf), Some((_, src, _))) =
                            (bufs.remove(&(chunk, meta.part)), &live)
                        else {
                            continue;
                        };
                        if let Some(t) = tasks.get(&stream) {
                            let mut segments = Vec::new();
                            src.layout().segments(chunk, &mut segments);
                            if let Some(p) = meta.part {
                                // Checked when read: within one segment.
                                segments = part_segments(&segments, p).unwrap_or_default();
                            }
                            let _ = t.tx.send(SrcOut::Chunk {
                                chunk,
                                buf,
                                meta,
                                segments,
                            });
                        }
                    }
                    SourceCommand::End { stream, sent } => {
                        if let Some(t) = tasks.get(&stream) {
                            let _ = t.tx.send(SrcOut::End(sent));
                        }
                    }
                    SourceCommand::Close { stream } => {
                        tasks.remove(&stream);
                        meters.retire(stream);
                        sendbufs.retire(stream);
                    }
                }
            }
            while let Some(ev) = m.poll_event() {
                busy = true;
                match ev {
                    SourceEvent::Opened(info) => joins.opened(&info),
                    SourceEvent::Limits(l) => {
                        if let Some(a) = peer_limits(m.side(), &mut env, &peer, l) {
                            m.limits(a);
                        }
                    }
                    SourceEvent::Options(o) => {
                        if let Some(k) = prep.as_mut() {
                            k.set_continue_on_error(o.continue_on_error);
                        }
                    }
                    SourceEvent::Held(parts) => {
                        let Some(mut k) = prep.take() else { continue };
                        let (tx, peer) = (tx.clone(), peer.clone());
                        env.disk.spawn(move || {
                            let r = k
                                .resume_from(&peer, &parts)
                                .map(|plan| (plan, chunk_set(k.chunks())));
                            let _ = tx.send(SrcIn::Checked(Box::new((k, r))));
                        });
                    }
                    SourceEvent::Go => {
                        let Some(k) = prep.take() else { continue };
                        let info = m.info().expect("open before Go").clone();
                        env.run.progress.held.store(k.held_bytes(), Relaxed);
                        let k = Arc::new(k);
                        let mut src: Arc<dyn Source> = k.clone();
                        if let Some(d) = env.chunk_delay {
                            src = Arc::new(Slow::new(src, d));
                        }
                        let tuned = info.features & features::TUNING != 0;
                        let n = (env.buffers)(crate::session::buffer_streams(info.streams, tuned));
                        if tuned {
                            let t = Tuner::new(TuneConfig::new(env.tuned_start, info.streams));
                            m.set_active(now(), t.streams());
                            let reason = format!(
                                "starting with {} of {} streams",
                                t.streams(),
                                info.streams
                            );
                            m.tuned(Tuned {
                                at_ms: 0,
                                streams: t.streams(),
                                rate: 0,
                                reason: reason.clone(),
                            });
                            env.run.progress.event(ProgressEvent::Tuned {
                                streams: t.streams(),
                                rate: 0,
                                reason,
                            });
                            *env.run.progress.tuning.lock() = Some(Tuning {
                                streams: t.streams(),
                                of: info.streams,
                                active: t.streams(),
                                changes: 0,
                                settled_ms: None,
                            });
                            tuner = Some(t);
                        }
                        // The sink's chunk requests (feature RANGES) are checked against
                        // the whole layout; a growing manifest's against what it confirmed.
                        if !growing {
                            m.set_layout_chunks(src.layout().n_chunks());
                        }
                        live = Some((k, src, Pool::new(n, info.chunk_size as usize)));
                        disk_tune = DiskTune::new(&mut env);
                    }
                    SourceEvent::StreamLost {
                        stream,
                        error,
                        resent,
                    } => {
                        tracing::warn!(
                            "data stream {stream} to {peer} broke ({error}); sending its {resent} \
                             unacknowledged chunks on the others"
                        );
                        let p = &env.run.progress;
                        p.streams_lost.fetch_add(1, Relaxed);
                        p.chunks_resent.fetch_add(resent, Relaxed);
                        p.event(ProgressEvent::StreamLost {
                            stream,
                            error: error.to_string(),
                            resent: Some(resent),
                        });
                    }
                    SourceEvent::Sent => {
                        let failed = live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                        m.report(failed);
                    }
                    SourceEvent::Drained => {
                        // The streams end: their connections must close with them.
                        meters.retire_all();
                        sendbufs.retire_all();
                        let failed = live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                        m.drained(failed);
                    }
                    SourceEvent::Done(summary) => {
                        ctl.flush(&mut m).await;
                        for (.., tell) in durable.drain(..) {
                            let _ = tell.send(());
                        }
                        let store = match live {
                            Some((k, ..)) => k,
                            None => Arc::new(prep.take().expect("the store is here")),
                        };
                        return Ok(SourceRun {
                            info: m.info().expect("open before the end").clone(),
                            summary,
                            stats: m.stats(),
                            store,
                        });
                    }
                    SourceEvent::Failed(e) => {
                        ctl.flush(&mut m).await;
                        return Err(env.run.take_error().unwrap_or_else(|| session_error(e)));
                    }
                }
            }
            // Reads into free buffers, as long as the machine has chunks to read.
            if let (Some((_, src, _)), Some(buf)) = (&live, spare.take()) {
                match m.poll_read() {
                    Some(job) => {
                        spawn_read(&env.disk, src.clone(), job, buf, tx.clone());
                        reading += 1;
                        busy = true;
                    }
                    None => spare = Some(buf),
                }
            }
            if !busy {
                break;
            }
        }
        let mut deadline = m.poll_timeout();
        if let Some(t) = tuner.as_ref().and_then(Tuner::poll_timeout) {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        if let Some(t) = disk_tune.as_ref().and_then(DiskTune::poll_timeout) {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        if let Some(t) = sendbufs.poll_timeout() {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        let pool = live.as_ref().map(|l| l.2.clone());
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !cancelled => {
                cancelled = true;
                // Why the run was cancelled (an interrupt, a revoked credential) is
                // what the peer learns; without a reason, the session was aborted.
                let why = env.run.take_error().unwrap_or(Error::Aborted);
                m.fail(now(), Fault::cancelled(why));
            }
            // A streamed manifest's parts (feature STREAMED) go one ahead of the
            // sink's confirmations: a part written while the control connection is
            // still in slow start waits in its send buffer, and the control link's
            // writes would hold this loop (and the data) until it drained. A dialer's
            // first part ends in its first flight (the features are known: BASE);
            // its later parts wait for `Session` (whether they may hold hard links
            // and holes, feature WALKING), which comes before the first `Grown`.
            part = next_part(&mut growth), if growth.is_some()
                && m.features().is_some()
                && (parts == 0 || m.negotiated())
                && (!m.uses(features::STREAMED) || m.parts_confirmed() + 1 >= parts) => match part {
                Some(p) if p.sent && parts == 0 && !m.uses(features::STREAMED) => {
                    // The sink does not take parts: the rest of the manifest goes
                    // whole behind the first part's entries, as a push's always did.
                    let (mut rest, mut meta, mut totals) = (Vec::new(), p.meta, p.totals);
                    if let Some(g) = growth.as_mut() {
                        while let Ok(mut q) = g.try_recv() {
                            rest.append(&mut q.entries);
                            meta.append(&mut q.meta);
                            totals = q.totals;
                        }
                    }
                    growth = None;
                    growing = false;
                    let grown = match prep.as_ref() {
                        Some(k) => {
                            let chunk = k.layout().chunk_size() as u32;
                            k.grow(&rest, &[], chunk).map(|_| chunk_set(k.chunks()))
                        }
                        None => Err(Error::refused(
                            ErrorCode::Unsupported,
                            "the manifest's rest came after the storage was bound",
                        )),
                    };
                    let chunks = match grown {
                        Ok(c) => c,
                        Err(e) => {
                            m.fail(now(), Fault::new(e));
                            continue;
                        }
                    };
                    env.run.progress.total.store(totals.bytes, Relaxed);
                    m.push_manifest(&rest);
                    m.push_meta(meta);
                    m.end_manifest(totals, chunks);
                }
                Some(p) if parts > 0
                    && !m.uses(features::WALKING)
                    && (!p.sparse.is_empty()
                        || p.entries.iter().any(|e| matches!(e.kind, EntryKind::HardLink { .. }))) =>
                {
                    // A live walk's later part with hard links or holes, to a sink that
                    // takes neither in later parts (a server older than the live walk
                    // of pushes, whose `Session` did not grant `WALKING`).
                    growth = None;
                    m.fail(now(), Fault::new(Error::refused(
                        ErrorCode::Unsupported,
                        format!(
                            "{}: the server takes no hard links or sparse files in a manifest \
                             sent while the walk runs (it predates that); upgrade it, or copy \
                             with --resume, which walks the whole tree first",
                            peer
                        ),
                    )));
                }
                Some(mut p) => {
                    let mut meta = Vec::new();
                    let mut part_chunk = None;
                    if parts > 0 {
                        // A later part: storage that grows lays it out now (in chunks
                        // of the part's own size where both ends can, feature
                        // PART_CHUNKS), and reads its entries' metadata (the first
                        // part's root's too).
                        let store = prep.as_ref().or(live.as_ref().map(|l| &*l.0));
                        let grown = match store {
                            Some(k) => {
                                let session = k.layout().chunk_size() as u32;
                                let chunk = if k.part_chunks() && m.uses(features::PART_CHUNKS) {
                                    crate::session::part_chunk(&p.entries, session)
                                } else {
                                    session
                                };
                                if chunk != session {
                                    let t = Totals::of(&p.entries);
                                    tracing::info!(
                                        "chunks of the transfer to {peer}: a later part's {} \
                                         files hold {} bytes: {} KiB chunks for them (the \
                                         session's: {} KiB)",
                                        t.files,
                                        t.bytes,
                                        chunk >> 10,
                                        session >> 10
                                    );
                                }
                                part_chunk = Some(chunk);
                                k.grow(&p.entries, &p.sparse, chunk).inspect(|_| {
                                    (meta, meta_from) = k.grown_meta(meta_from);
                                })
                            }
                            None => Err(Error::refused(
                                ErrorCode::Unsupported,
                                "a later part of the manifest came while a resume was checked",
                            )),
                        };
                        match grown {
                            Ok(Some(n)) => p.chunks = n,
                            Ok(None) => {}
                            Err(e) => {
                                growth = None;
                                m.fail(now(), Fault::new(e));
                                continue;
                            }
                        }
                    }
                    meta.append(&mut p.meta);
                    parts += 1;
                    if parts > 1 && m.uses(features::STREAMED) {
                        env.run.progress.manifest_grown.fetch_add(1, Relaxed);
                    }
                    m.times(std::mem::take(&mut p.times));
                    if let Some(tell) = p.durable.take() {
                        durable.push_back((parts - 1, p.chunks, tell));
                    }
                    if !p.sent {
                        m.push_manifest(&p.entries);
                    }
                    m.sparse_files(&p.sparse);
                    m.grow_meta(meta);
                    // A streamed manifest's source knows the whole total already.
                    env.run.progress.total.fetch_max(p.totals.bytes, Relaxed);
                    if let Some(c) = part_chunk {
                        m.part_chunk(now(), c);
                    }
                    m.grow_manifest(now(), p.totals, p.chunks, p.last);
                    if p.last {
                        growth = None;
                    }
                }
                None => {
                    growth = None;
                    m.fail(now(), Fault::new(Error::refused(
                        ErrorCode::Aborted,
                        "the manifest's producer stopped before its last part",
                    )));
                }
            },
            Some(input) = rx.recv() => match input {
                SrcIn::Read { chunk, read: Ok((buf, meta)) } => {
                    reading -= 1;
                    bufs.insert((chunk, meta.part), buf);
                    m.chunk_read(now(), chunk, meta);
                }
                SrcIn::Read { read: Err(e), .. } => {
                    reading -= 1;
                    m.fail(now(), Fault::new(e));
                }
                SrcIn::Written { stream, chunk } => {
                    if let Some((_, src, _)) = &live {
                        env.run.progress.count_files(&src.layout(), chunk);
                    }
                    m.chunk_written(now(), stream, chunk)
                }
                SrcIn::Acked { stream, frames } => m.acked(now(), stream, frames),
                SrcIn::Failed { stream, error } => {
                    tasks.remove(&stream);
                    meters.retire(stream);
                    sendbufs.retire(stream);
                    m.stream_failed(now(), stream, Fault::new(error));
                }
                SrcIn::Checked(b) => {
                    let (k, r) = *b;
                    prep = Some(k);
                    match r {
                        Ok((plan, chunks)) => m.planned(now(), plan, chunks),
                        Err(e) => m.fail(now(), Fault::new(e)),
                    }
                }
            },
            (i, r) = joins.next() => match r {
                Ok(s) => {
                    if m.uses(features::TUNING) {
                        meters.add(i, s.io.meter());
                    }
                    sendbufs.join(now(), i, s.io.meter());
                    let (ttx, trx) = mpsc::unbounded_channel();
                    let h = tokio::spawn(source_stream(
                        i,
                        s,
                        trx,
                        tx.clone(),
                        env.run.progress.clone(),
                        env.zerocopy.clone(),
                        // The sink knows the sparse files only under LINKS.
                        m.uses(features::LINKS),
                    ));
                    tasks.insert(i, Task { tx: ttx, abort: h.abort_handle() });
                    m.stream_joined(now(), i);
                }
                Err(e) => m.stream_failed(now(), i, Fault::new(e)),
            },
            msg = ctl.recv() => match msg {
                Ok(msg) => m.handle_control(now(), msg),
                Err(e) => {
                    ctl.open = false;
                    m.control_closed(now(), Fault::new(Error::Net(e)));
                }
            },
            b = async { pool.as_ref().expect("checked").get().await }, if pool.is_some() && spare.is_none() => {
                spare = Some(b);
            }
            _ = sleep_until(deadline) => m.handle_timeout(now()),
        }
    }
}

/// The TCP counters of a tuned source's data streams ([`TcpMeter`]), which its tuner
/// measures with. A meter holds its stream's connection open: it goes when the
/// stream ends or is lost.
#[derive(Default)]
struct Meters {
    /// Each stream's meter, and whether its congestion control is model-based (BBR).
    live: HashMap<u16, (TcpMeter, bool)>,
    /// Bytes acknowledged on streams whose meters went.
    retired: u64,
    /// Their busy and window-limited times.
    retired_pressure: (Duration, Duration),
    /// A stream joined without one (not TCP): measure with the chunks sent instead.
    unmetered: bool,
}

impl Meters {
    fn add(&mut self, stream: u16, meter: Option<TcpMeter>) {
        match meter {
            Some(mt) => {
                let model_based =
                    dmover_net::tcp::congestion_of(&mt).is_ok_and(|cc| cc.starts_with("bbr"));
                self.live.insert(stream, (mt, model_based));
            }
            None => self.unmetered = true,
        }
    }

    fn retire(&mut self, stream: u16) {
        if let Some((mt, _)) = self.live.remove(&stream) {
            if let Ok(s) = mt.read() {
                self.retired += s.bytes_acked;
                self.retired_pressure.0 += s.busy;
                self.retired_pressure.1 += s.window_limited;
            }
        }
    }

    fn retire_all(&mut self) {
        let streams: Vec<u16> = self.live.keys().copied().collect();
        for i in streams {
            self.retire(i);
        }
    }

    /// Bytes delivered on every stream so far (acknowledged, and on live streams held
    /// by the peer beyond a hole: see [`dmover_net::tcpinfo::TcpSample::bytes_sacked`]),
    /// the smallest round trip seen, and what the streams waited on.
    fn read(&self) -> Option<(u64, Option<Duration>, Pressure)> {
        if self.unmetered || self.live.is_empty() {
            return None;
        }
        let (mut bytes, mut rtt) = (self.retired, None::<Duration>);
        let mut p = Pressure {
            busy: self.retired_pressure.0,
            window_limited: self.retired_pressure.1,
            model_based: true,
        };
        for (mt, model_based) in self.live.values() {
            let s = mt.read().ok()?;
            bytes += s.bytes_acked + s.bytes_sacked;
            if !s.min_rtt.is_zero() {
                rtt = Some(rtt.map_or(s.min_rtt, |r| r.min(s.min_rtt)));
            }
            p.busy += s.busy;
            p.window_limited += s.window_limited;
            p.model_based &= model_based;
        }
        Some((bytes, rtt, p))
    }
}

/// Feeds the source's tuner the clock and the bytes sent (as the streams' TCP
/// counters have them acknowledged, or else as written), and applies its decision:
/// the machine sends on that many streams and tells the sink; the progress says so.
fn tune_step(
    t: &mut Tuner,
    m: &mut SourceSession<Fault>,
    meters: &Meters,
    p: &Progress,
    peer: &str,
) {
    let at = now();
    let decision = if m.has_work() {
        let (bytes, rtt, pressure) = match meters.read() {
            Some((b, rtt, pressure)) => (b, rtt.or(m.ack_rtt()), Some(pressure)),
            None => (p.bytes.load(Relaxed), m.ack_rtt(), None),
        };
        t.set_pressure(pressure);
        if let Some(rtt) = rtt {
            t.set_rtt(rtt);
            p.note_rtt(rtt);
        }
        // What is left to send, once the manifest is complete (a growing one, as the
        // memory test's, has a total of what it announced so far, not of what it will
        // send).
        t.set_remaining(remaining(p, m.manifest_complete()));
        let d = t.tick(at, bytes);
        if let Some(note) = t.take_note() {
            tracing::info!("tuning the transfer to {peer}: {note}");
        }
        d
    } else {
        if t.poll_timeout().is_some() {
            tracing::debug!(
                "tuning the transfer to {peer}: nothing to send, the period is dropped"
            );
        }
        t.pause();
        None
    };
    let first = p.first_data();
    let since_first = |i: std::time::Instant| {
        first.map_or(0, |f| i.saturating_duration_since(f).as_millis() as u64)
    };
    let mut tuning = p.tuning.lock();
    if let Some(s) = tuning.as_mut() {
        s.streams = t.kept();
        s.active = t.streams();
        s.changes = t.changes();
        s.settled_ms = t.settled_after().map(|d| d.as_millis() as u64);
    }
    drop(tuning);
    let Some(d) = decision else { return };
    tracing::info!("tuning the transfer to {peer}: {}", d.reason);
    m.set_active(at, d.streams);
    m.tuned(Tuned {
        at_ms: since_first(at),
        streams: d.streams,
        rate: d.rate,
        reason: d.reason.clone(),
    });
    p.event(ProgressEvent::Tuned {
        streams: d.streams,
        rate: d.rate,
        reason: d.reason,
    });
}

/// The next part of a growing manifest (never, without one).
async fn next_part(g: &mut Option<mpsc::UnboundedReceiver<GrowPart>>) -> Option<GrowPart> {
    match g {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn spawn_read<K>(
    disk: &DiskPool,
    src: Arc<dyn Source>,
    job: ReadJob,
    mut buf: PoolBuf,
    tx: mpsc::UnboundedSender<SrcIn<K>>,
) where
    K: Send + 'static,
{
    disk.spawn(move || {
        let read = match (job.again, job.part) {
            (None, None) => {
                let mut trailer = Vec::new();
                src.read_chunk(job.chunk, &mut buf, &mut trailer)
                    .map_err(Error::from)
                    .map(|r| {
                        (
                            buf,
                            ChunkMeta {
                                crc: r.crc,
                                trailer,
                                zeros: r.zeros,
                                part: None,
                            },
                        )
                    })
            }
            (Some(meta), None) => src
                .reread_chunk(job.chunk, &mut buf, meta.crc)
                .map_err(Error::from)
                .map(|()| (buf, meta)),
            (again, Some(p)) => read_part(&*src, job.chunk, p, buf).and_then(|(buf, meta)| {
                // Sent before on a lost stream: the bytes must be the same.
                match again {
                    Some(m) if m.crc.is_some() && m.crc != meta.crc => Err(Error::refused(
                        ErrorCode::Io,
                        format!(
                            "chunk {} changed at the source while it was being sent",
                            job.chunk
                        ),
                    )),
                    _ => Ok((buf, meta)),
                }
            }),
        };
        let _ = tx.send(SrcIn::Read {
            chunk: job.chunk,
            read,
        });
    });
}

/// The runs of a chunk's buffer that make part `p` of its payload, `p.offset` being an
/// offset into the chunk's virtual range (as a buffer offset): `None` unless the part
/// lies within one of `segments` (one piece, one file).
fn part_segments(segments: &[(usize, usize)], p: PartRange) -> Option<Vec<(usize, usize)>> {
    let (from, len) = (p.offset as usize, p.len as usize);
    segments
        .iter()
        .find(|&&(o, l)| o <= from && from + len <= o + l)
        .map(|_| vec![(from, len)])
}

/// Reads chunk `k` for part `p` of it: the chunk as usual, then the part's frame fields
/// (the CRC of its bytes, its offset and the chunk's failure markers as its trailer).
fn read_part(
    src: &dyn Source,
    k: u64,
    p: PartRange,
    mut buf: PoolBuf,
) -> Result<(PoolBuf, ChunkMeta)> {
    let mut trailer = Vec::new();
    let r = src.read_chunk(k, &mut buf, &mut trailer)?;
    let mut segments = Vec::new();
    src.layout().segments(k, &mut segments);
    if r.zeros || part_segments(&segments, p).is_none() {
        return Err(Error::protocol(
            "the sink",
            format!(
                "asked for {} bytes at {} of chunk {k}, not within one file's piece of it",
                p.len, p.offset
            ),
        ));
    }
    let bytes = &buf[p.offset as usize..(p.offset + p.len) as usize];
    let crc = r.crc.map(|_| dmover_proto::digest::crc32c_append(0, bytes));
    let mut head = p.offset.to_be_bytes().to_vec();
    let markers = dmover_proto::data::DigestEntry::decode_all(&trailer)
        .map_err(|e| Error::protocol("this side", format!("chunk {k} trailer: {e}")))?;
    for d in markers.filter(|d| d.is_failure()) {
        d.encode_into(&mut head);
    }
    Ok((
        buf,
        ChunkMeta {
            crc,
            trailer: head,
            zeros: false,
            part: Some(p),
        },
    ))
}

/// A source's data stream: writes the chunks it is given and reads acknowledgements.
async fn source_stream<L: DataLink, K>(
    i: u16,
    s: DataStream<L>,
    mut work: mpsc::UnboundedReceiver<SrcOut>,
    tx: mpsc::UnboundedSender<SrcIn<K>>,
    progress: Arc<Progress>,
    zerocopy: Option<Arc<ZeroCopyUse>>,
    zero_frames: bool,
) {
    let peer = s.peer;
    let (mut out, mut acks) = s.io.into_source();
    if let Some(z) = &zerocopy {
        if let Err(e) = out.zerocopy() {
            *z.refused.lock() = Some(e);
        }
    }
    // A stream that sent its first chunks before its join's answer reports a failed
    // join as the join would have (see `Error::data`).
    let io_err = |what, e| Error::data(what, &peer, e);
    let writer = async {
        while let Some(item) = work.recv().await {
            match item {
                SrcOut::Chunk {
                    chunk,
                    mut buf,
                    meta,
                    segments,
                } => {
                    let zeros = meta.zeros && zero_frames;
                    let frame = ChunkFrame {
                        chunk,
                        crc: meta.crc,
                        trailer: &meta.trailer,
                        segments: if zeros { &[] } else { &segments },
                        zeros,
                        part: meta.part.is_some(),
                    };
                    let payload = frame.payload_len() as u64;
                    if zeros {
                        let len: usize = segments.iter().map(|s| s.1).sum();
                        progress.holes.fetch_add(len as u64, Relaxed);
                    }
                    // The transport may seal the chunk's records in its buffer and
                    // write them from there; the buffer is not used after this.
                    out.send_chunk(frame, &mut buf)
                        .await
                        .map_err(|e| io_err("sending data to", e))?;
                    drop(buf);
                    progress.bytes.fetch_add(payload, Relaxed);
                    progress.stream_bytes.add(i, payload);
                    progress.chunks.fetch_add(1, Relaxed);
                    progress.data_flowing();
                    let _ = tx.send(SrcIn::Written { stream: i, chunk });
                }
                SrcOut::End(sent) => {
                    out.send_end(sent)
                        .await
                        .map_err(|e| io_err("sending data to", e))?;
                    if let (Some(z), Some(st)) = (&zerocopy, out.zerocopy_stats()) {
                        let mut t = z.stats.lock();
                        t.sends += st.sends;
                        t.completed += st.completed;
                        t.copied += st.copied;
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    };
    let acker = async {
        loop {
            match acks.recv_ack().await {
                Ok(frames) => {
                    let _ = tx.send(SrcIn::Acked { stream: i, frames });
                }
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Error::Net(NetError::Closed { peer: peer.clone() });
                }
                Err(e) => return io_err("reading acknowledgements from", e),
            }
        }
    };
    let r = tokio::select! {
        r = writer => r,
        e = acker => Err(e),
    };
    if let Err(error) = r {
        let _ = tx.send(SrcIn::Failed { stream: i, error });
    }
}

// ---------------------------------------------------------------------------------
// Sink

/// What a sink session achieved.
pub struct SinkRun<K> {
    /// The session.
    pub info: SessionInfo,
    /// What the sink did.
    pub summary: Summary,
    /// The source's account of its sending.
    pub report: SendReport,
    /// What the streams went through.
    pub stats: StreamStats,
    /// The storage.
    pub store: Arc<K>,
}

/// Makes the sink for a manifest (on a disk thread): the entries, the session's chunk
/// size and options.
pub type Prepare<K> = Box<dyn FnOnce(Vec<Entry>, u32, &SessionOptions) -> Result<K> + Send>;

enum SinkIn<K> {
    Arrived {
        stream: u16,
        chunk: u64,
        buf: PoolBuf,
        trailer: Vec<u8>,
        crc: Option<u32>,
    },
    /// A part frame (feature `PARTS`).
    Part {
        stream: u16,
        chunk: u64,
        offset: u32,
        data: Vec<u8>,
        trailer: Vec<u8>,
        crc: Option<u32>,
    },
    PartWritten(Result<()>),
    End {
        stream: u16,
        sent: u64,
    },
    Failed {
        stream: u16,
        error: Error,
    },
    Written {
        chunk: u64,
        result: Result<()>,
    },
    Prepared(Result<(K, Held)>),
    Finished(Result<Summary>),
}

/// Drives the sink role `m` until the session ends. `options`: the session's options
/// when this side dialed (an acceptor takes the dialer's).
pub async fn sink<C, J, K>(
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    sink_with(m, ch, joins, prepare, options, env, None).await
}

/// What the owner of a request-driven sink ([`sink_on_demand`]) asks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DemandAsk {
    /// Send these chunks of the layout (each again if it came before: its next copy
    /// is written again; one already on its way is not asked for twice).
    Want(Vec<std::ops::Range<u64>>),
    /// (feature `PARTS`, when [`DemandEvent::Ready`] said the session uses it) Send
    /// these byte ranges of chunks, each as a part frame (the storage's `write_part`).
    WantParts(Vec<dmover_proto::control::Part>),
    /// Close the session: the storage's `finish`, then `Done` (dropping the sender
    /// does the same).
    Close,
}

/// What a request-driven sink tells its owner.
#[derive(Debug)]
pub enum DemandEvent<K> {
    /// The storage is prepared and `OnDemand` went out: requests may follow. With the
    /// session's features.
    Ready(Arc<K>, u64),
    /// Chunk `k` arrived whole and is written into the storage.
    Written(u64),
}

/// The owner's side of a request-driven sink: its requests in, the sink's news out.
#[derive(Debug)]
pub struct Demand<K> {
    /// Requests, taken once the storage is prepared ([`DemandEvent::Ready`]).
    pub asks: mpsc::UnboundedReceiver<DemandAsk>,
    /// News for the owner.
    pub events: mpsc::UnboundedSender<DemandEvent<K>>,
}

/// [`sink`] of a request-driven session (feature
/// [`dmover_proto::session::features::RANGES`], which the session must use): the
/// manifest is answered with `OnDemand`, the source sends only the chunks `demand`
/// asks for, and the session lasts until the owner closes it ([`DemandAsk::Close`]).
pub async fn sink_on_demand<C, J, K>(
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
    demand: Demand<K>,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    sink_with(m, ch, joins, prepare, options, env, Some(demand)).await
}

/// The next request of a request-driven sink's owner (never, without one); `None`: the
/// owner is gone.
async fn next_ask(d: &mut Option<mpsc::UnboundedReceiver<DemandAsk>>) -> Option<DemandAsk> {
    match d {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sink_with<C, J, K>(
    mut m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    mut joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    mut env: Env,
    demand: Option<Demand<K>>,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    let (mut asks, news) = match demand {
        Some(d) => (Some(d.asks), Some(d.events)),
        None => (None, None),
    };
    let mut closing = false;
    let mut ctl = ControlLink::new(ch);
    let peer = ctl.ch.peer().to_string();
    let (tx, mut rx) = mpsc::unbounded_channel::<SinkIn<K>>();
    let mut prepare = Some(prepare);
    let mut options = options;
    let mut prep: Option<(K, Held)> = None;
    // Files the source listed as sparse (before its manifest), for the storage.
    let mut sparse: Vec<u32> = Vec::new();
    let mut live: Option<(Arc<K>, Arc<dyn Sink>, Pool)> = None;
    let mut waiting: Vec<(u16, DataStream<J::Link>)> = Vec::new();
    let mut tasks: HashMap<u16, Task<u64>> = HashMap::new();
    let mut summary: Option<Summary> = None;
    let mut grown: Vec<GrownPart> = Vec::new();
    let mut times = Vec::new();
    let mut meta = Vec::new();
    let mut cancelled = false;
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut windows = Buffers::new(
        tcp::Buffer::Receive,
        env.receive_budget,
        env.run.progress.clone(),
        &peer,
    );
    let mut disk_tune: Option<DiskTune> = None;
    loop {
        if let Some((k, ..)) = &live
            && !times.is_empty()
        {
            k.set_times(std::mem::take(&mut times));
        }
        windows.check(now());
        // A request-driven sink (a mount) moves what its reader asks for, in bursts:
        // its disk threads are not tuned.
        if let Some((.., pool)) = &live
            && asks.is_none()
        {
            if disk_tune.is_none() {
                disk_tune = DiskTune::new(&mut env);
            }
            if let Some(t) = disk_tune.as_mut() {
                let left = remaining(&env.run.progress, m.manifest_complete());
                t.step(&env.run.progress, pool, m.outstanding() > 0, left, &peer);
            }
        }
        loop {
            ctl.flush(&mut m).await;
            let mut busy = false;
            while let Some(c) = m.poll_command() {
                busy = true;
                match c {
                    SinkCommand::Open { stream } => joins.open(stream),
                    SinkCommand::Ack { stream, frames } => {
                        if let Some(t) = tasks.get(&stream) {
                            let _ = t.tx.send(frames);
                        }
                    }
                    SinkCommand::Close { stream } => {
                        tasks.remove(&stream);
                        windows.retire(stream);
                        waiting.retain(|(i, _)| *i != stream);
                    }
                }
            }
            while let Some(ev) = m.poll_event() {
                busy = true;
                match ev {
                    SinkEvent::Opened(info) => joins.opened(&info),
                    SinkEvent::Options(o) => options = Some(o),
                    SinkEvent::Sparse(list) => sparse = list,
                    SinkEvent::Meta(m) => meta = m,
                    SinkEvent::Manifest(entries) => {
                        let (Some(f), Some(info)) = (prepare.take(), m.info()) else {
                            continue;
                        };
                        let totals = dmover_proto::manifest::Totals::of(&entries);
                        env.run.progress.total.store(totals.bytes, Relaxed);
                        let files = crate::engine::files_with_data(&entries);
                        env.run.progress.total_files.store(files, Relaxed);
                        env.run.progress.set_manifest(&entries);
                        let o = options.unwrap_or(SessionOptions {
                            resume: false,
                            journal: true,
                            fsync: false,
                            verify: false,
                            continue_on_error: false,
                            heartbeat_ms: 0,
                        });
                        let (chunk, tx) = (info.chunk_size, tx.clone());
                        let sparse = std::mem::take(&mut sparse);
                        let meta = std::mem::take(&mut meta);
                        env.disk.spawn(move || {
                            let r = f(entries, chunk, &o).map(|mut k| {
                                if !sparse.is_empty() {
                                    k.set_sparse(sparse);
                                }
                                if !meta.is_empty() {
                                    k.set_meta(meta);
                                }
                                let held = if o.resume {
                                    k.held()
                                } else {
                                    Held::none(&k.entries())
                                };
                                (k, held)
                            });
                            let _ = tx.send(SinkIn::Prepared(r));
                        });
                    }
                    SinkEvent::Plan(plan) => {
                        let Some((mut k, mut held)) = prep.take() else {
                            continue;
                        };
                        let r = held
                            .apply(&plan)
                            .map_err(|e| Error::protocol(&peer, format!("resume: {e}")))
                            .and_then(|()| {
                                if !held.is_empty() {
                                    tracing::info!(
                                        "resuming: {} files and {} bytes already here",
                                        held.done_files(),
                                        held.bytes(&k.entries(), k.layout().chunk_size() as u32)
                                    );
                                }
                                k.resume(&held)
                            });
                        match r {
                            Ok(()) => start_sink(
                                &mut m,
                                k,
                                &env,
                                &mut live,
                                &mut waiting,
                                &mut tasks,
                                &tx,
                                &mut grown,
                                news.as_ref(),
                            ),
                            Err(e) => m.fail(now(), Fault::new(e)),
                        }
                    }
                    SinkEvent::Grown {
                        entries,
                        chunks,
                        meta,
                        sparse,
                        chunk,
                    } => {
                        env.run.progress.grow_manifest(&entries);
                        let part = GrownPart {
                            entries,
                            chunks,
                            meta,
                            sparse,
                            chunk,
                        };
                        match &live {
                            Some((k, ..)) => grow_sink(&mut m, &**k, part),
                            // Before the sink is prepared: when it is.
                            None => grown.push(part),
                        }
                    }
                    SinkEvent::Times(t) => match (&live, &prep) {
                        (Some((k, ..)), _) => k.set_times(t),
                        (None, Some((k, _))) => k.set_times(t),
                        // Between the preparation and the start (the storage on a disk
                        // thread): with the next.
                        (None, None) => times.extend(t),
                    },
                    SinkEvent::Complete => {
                        let Some((_, sink, _)) = &live else { continue };
                        let (sink, tx) = (sink.clone(), tx.clone());
                        env.disk.spawn(move || {
                            let _ = tx.send(SinkIn::Finished(sink.finish().map_err(Error::from)));
                        });
                    }
                    SinkEvent::Limits(l) => {
                        if let Some(a) = peer_limits(m.side(), &mut env, &peer, l) {
                            m.limits(a);
                        }
                    }
                    SinkEvent::Tuned(t) => {
                        tracing::info!("{peer} tuned the transfer: {}", t.reason);
                        windows.sending(t.streams);
                        let p = &env.run.progress;
                        let of = m.info().map_or(t.streams, |i| i.streams);
                        // The first decision is where the tuner starts; changes follow.
                        let mut tuning = p.tuning.lock();
                        match tuning.as_mut() {
                            None => {
                                *tuning = Some(Tuning {
                                    streams: t.streams,
                                    of,
                                    active: t.streams,
                                    changes: 0,
                                    settled_ms: None,
                                })
                            }
                            Some(s) => {
                                s.streams = t.streams;
                                s.active = t.streams;
                                s.changes += 1;
                                s.settled_ms = Some(t.at_ms);
                            }
                        }
                        drop(tuning);
                        p.event(ProgressEvent::Tuned {
                            streams: t.streams,
                            rate: t.rate,
                            reason: t.reason,
                        });
                    }
                    SinkEvent::StreamLost { stream, error } => {
                        tracing::warn!(
                            "data stream {stream} from {peer} broke ({error}); waiting for its \
                             chunks on the others"
                        );
                        env.run.progress.streams_lost.fetch_add(1, Relaxed);
                        env.run.progress.event(ProgressEvent::StreamLost {
                            stream,
                            error: error.to_string(),
                            resent: None,
                        });
                    }
                    SinkEvent::Done(report) => {
                        ctl.flush(&mut m).await;
                        let (Some(summary), Some((store, ..))) = (summary.take(), live.take())
                        else {
                            return Err(Error::protocol(&peer, "session ended before its data"));
                        };
                        return Ok(SinkRun {
                            info: m.info().expect("open before the end").clone(),
                            summary,
                            report,
                            stats: m.stats(),
                            store,
                        });
                    }
                    SinkEvent::Failed(e) => {
                        ctl.flush(&mut m).await;
                        tasks.clear();
                        windows.retire_all();
                        // Writes still queued are skipped; the sink gives up (nothing
                        // incomplete under a final name) when the last of those that
                        // run lets it go: aborting under a running write could journal
                        // a piece whose staging file is gone.
                        stopped.store(true, Relaxed);
                        return Err(env.run.take_error().unwrap_or_else(|| session_error(e)));
                    }
                }
            }
            if !busy {
                break;
            }
        }
        let mut deadline = m.poll_timeout();
        if let Some(t) = disk_tune.as_ref().and_then(DiskTune::poll_timeout) {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        if let Some(t) = windows.poll_timeout() {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !cancelled => {
                cancelled = true;
                // Why the run was cancelled (an interrupt, a revoked credential) is
                // what the peer learns; without a reason, the session was aborted.
                let why = env.run.take_error().unwrap_or(Error::Aborted);
                m.fail(now(), Fault::cancelled(why));
            }
            Some(input) = rx.recv() => match input {
                SinkIn::Arrived { stream, chunk, buf, trailer, crc } => {
                    if m.arrived(now(), stream, chunk) == Arrival::Write {
                        let (Some((_, sink, _)), tx) = (&live, tx.clone()) else { continue };
                        let (sink, stopped) = (sink.clone(), stopped.clone());
                        env.disk.spawn(move || {
                            if stopped.load(Relaxed) {
                                return;
                            }
                            let result = sink.write_chunk(chunk, &buf, &trailer, crc).map_err(Error::from);
                            drop(buf);
                            let _ = tx.send(SinkIn::Written { chunk, result });
                        });
                    }
                }
                SinkIn::Part { stream, chunk, offset, data, trailer, crc } => {
                    let range = PartRange { offset, len: data.len() as u32 };
                    if m.arrived_part(now(), stream, chunk, range) == Arrival::Write {
                        let (Some((_, sink, _)), tx) = (&live, tx.clone()) else { continue };
                        let (sink, stopped) = (sink.clone(), stopped.clone());
                        env.disk.spawn(move || {
                            if stopped.load(Relaxed) {
                                return;
                            }
                            let r = sink.write_part(chunk, offset, &data, &trailer, crc);
                            let _ = tx.send(SinkIn::PartWritten(r.map_err(Error::from)));
                        });
                    }
                }
                SinkIn::PartWritten(Ok(())) => m.part_written(now()),
                SinkIn::PartWritten(Err(e)) => m.fail(now(), Fault::new(e)),
                SinkIn::End { stream, sent } => {
                    tasks.remove(&stream);
                    windows.retire(stream);
                    m.stream_end(now(), stream, sent);
                }
                SinkIn::Failed { stream, error } => {
                    tasks.remove(&stream);
                    windows.retire(stream);
                    m.stream_failed(now(), stream, Fault::new(error));
                }
                SinkIn::Written { chunk, result: Ok(()) } => {
                    if let Some((_, sink, _)) = &live {
                        env.run.progress.count_files(&sink.layout(), chunk);
                    }
                    m.chunk_written(now(), chunk);
                    if let Some(n) = &news {
                        let _ = n.send(DemandEvent::Written(chunk));
                    }
                }
                SinkIn::Written { result: Err(e), .. } => m.fail(now(), Fault::new(e)),
                SinkIn::Prepared(Ok((mut k, held))) => {
                    if options.as_ref().is_some_and(|o| o.resume) {
                        let parts = held.to_have(&k.entries());
                        prep = Some((k, held));
                        m.resume(now(), parts);
                    } else {
                        match k.resume(&held) {
                            Ok(()) => start_sink(&mut m, k, &env, &mut live, &mut waiting, &mut tasks, &tx, &mut grown, news.as_ref()),
                            Err(e) => m.fail(now(), Fault::new(e)),
                        }
                    }
                }
                SinkIn::Prepared(Err(e)) => m.fail(now(), Fault::new(e)),
                SinkIn::Finished(Ok(s)) => {
                    summary = Some(s);
                    m.finished(s);
                }
                SinkIn::Finished(Err(e)) => m.fail(now(), Fault::new(e)),
            },
            // A request-driven sink's owner, once the sink is prepared.
            ask = next_ask(&mut asks), if asks.is_some() && live.is_some() && !closing => match ask {
                Some(DemandAsk::Want(chunks)) => m.want(now(), &chunks),
                Some(DemandAsk::WantParts(parts)) => m.want_parts(now(), &parts),
                Some(DemandAsk::Close) | None => {
                    closing = true;
                    let Some((_, sink, _)) = &live else { continue };
                    let (sink, tx) = (sink.clone(), tx.clone());
                    env.disk.spawn(move || {
                        let _ = tx.send(SinkIn::Finished(sink.finish().map_err(Error::from)));
                    });
                }
            },
            (i, r) = joins.next() => match r {
                Ok(s) => {
                    m.stream_joined(now(), i);
                    windows.join(now(), i, s.io.meter());
                    match &live {
                        Some((_, sink, pool)) => {
                            let timed = news.is_some() || m.uses(features::TUNING);
                            let t = spawn_sink_stream(i, s, sink.clone(), pool.clone(), &tx, &env.run.progress, timed);
                            tasks.insert(i, t);
                        }
                        None => waiting.push((i, s)),
                    }
                }
                Err(e) => m.stream_failed(now(), i, Fault::new(e)),
            },
            msg = ctl.recv() => match msg {
                Ok(msg) => m.handle_control(now(), msg),
                Err(e) => {
                    ctl.open = false;
                    m.control_closed(now(), Fault::new(Error::Net(e)));
                }
            },
            _ = sleep_until(deadline) => m.handle_timeout(now()),
        }
    }
}

/// A later part of a growing manifest at the sink.
pub struct GrownPart {
    /// Its entries, numbered after every earlier part's.
    pub entries: Vec<Entry>,
    /// The layout's chunks it adds.
    pub chunks: std::ops::Range<u64>,
    /// (feature `METADATA`) Owners and extended attributes of its entries (or earlier
    /// ones).
    pub meta: Vec<dmover_proto::manifest::EntryMeta>,
    /// (feature `WALKING`) Its files that may have holes (entry indices, ascending).
    pub sparse: Vec<u32>,
    /// The size of its chunks: the session's, or (feature `PART_CHUNKS`) another no
    /// larger.
    pub chunk: u32,
}

/// A later part of a growing manifest: the storage makes room, the machine hears it.
fn grow_sink<K: SinkStore>(m: &mut SinkSession<Fault>, k: &K, part: GrownPart) {
    let end = part.chunks.end;
    match k.grow(part) {
        Ok(()) => m.grown(now(), end),
        Err(e) => m.fail(now(), Fault::new(e)),
    }
}

/// The sink is prepared: says `Go` (`OnDemand` for a request-driven sink, whose owner
/// hears of it), and starts reading the streams that joined; then the parts of a
/// growing manifest that came meanwhile.
#[allow(clippy::too_many_arguments)]
fn start_sink<K: SinkStore, L: DataLink>(
    m: &mut SinkSession<Fault>,
    k: K,
    env: &Env,
    live: &mut Option<(Arc<K>, Arc<dyn Sink>, Pool)>,
    waiting: &mut Vec<(u16, DataStream<L>)>,
    tasks: &mut HashMap<u16, Task<u64>>,
    tx: &mpsc::UnboundedSender<SinkIn<K>>,
    grown: &mut Vec<GrownPart>,
    demand: Option<&mpsc::UnboundedSender<DemandEvent<K>>>,
) {
    let info = m.info().expect("open before the manifest").clone();
    env.run.progress.held.store(k.held_bytes(), Relaxed);
    let k = Arc::new(k);
    let mut sink: Arc<dyn Sink> = k.clone();
    if let Some(d) = env.chunk_delay {
        sink = Arc::new(Slow::new(sink, d));
    }
    let tuned = info.features & features::TUNING != 0;
    let pool = Pool::new(
        (env.buffers)(crate::session::buffer_streams(info.streams, tuned)),
        info.chunk_size as usize,
    );
    let expected = chunk_set(sink.chunks());
    let n = k.layout_chunks();
    for (i, s) in waiting.drain(..) {
        let t = spawn_sink_stream(
            i,
            s,
            sink.clone(),
            pool.clone(),
            tx,
            &env.run.progress,
            demand.is_some() || tuned,
        );
        tasks.insert(i, t);
    }
    match demand {
        Some(d) => {
            m.ready_on_demand(now(), n);
            let features = m.info().map_or(0, |i| i.features);
            let _ = d.send(DemandEvent::Ready(k.clone(), features));
        }
        None => m.ready(now(), expected, n),
    }
    for part in grown.drain(..) {
        grow_sink(m, &*k, part);
    }
    *live = Some((k, sink, pool));
}

fn spawn_sink_stream<L: DataLink, K: Send + 'static>(
    i: u16,
    mut s: DataStream<L>,
    sink: Arc<dyn Sink>,
    pool: Pool,
    tx: &mpsc::UnboundedSender<SinkIn<K>>,
    progress: &Arc<Progress>,
    timed_by_machine: bool,
) -> Task<u64> {
    if timed_by_machine {
        // Idle while nothing is asked for (request-driven) or while the source's tuner
        // leaves it out (tuning); the machine times the streams instead.
        s.io.reads_timed_by_caller();
    }
    let (atx, arx) = mpsc::unbounded_channel();
    let (tx, progress) = (tx.clone(), progress.clone());
    let h = tokio::spawn(async move {
        match sink_stream(i, s, sink, pool, arx, &tx, &progress).await {
            Ok(Some(sent)) => {
                let _ = tx.send(SinkIn::End { stream: i, sent });
            }
            Ok(None) => {}
            Err(error) => {
                let _ = tx.send(SinkIn::Failed { stream: i, error });
            }
        }
    });
    Task {
        tx: atx,
        abort: h.abort_handle(),
    }
}

/// A sink's data stream: reads chunk frames into pool buffers, hands them to the
/// driver, and writes the acknowledgements the machine asks for. Ends with `END`
/// (`Some(sent)`), when the driver lets it go (`None`), or with the error.
async fn sink_stream<L: DataLink, K>(
    i: u16,
    mut s: DataStream<L>,
    sink: Arc<dyn Sink>,
    pool: Pool,
    mut acks: mpsc::UnboundedReceiver<u64>,
    tx: &mpsc::UnboundedSender<SinkIn<K>>,
    progress: &Progress,
) -> Result<Option<u64>> {
    let mut layout = sink.layout();
    let mut n = layout.n_chunks();
    let limits = FrameLimits {
        max_payload: layout.chunk_size() as u32,
        max_digests: layout.chunk_size() as u32,
    };
    let peer = s.peer.clone();
    // A record that fails authentication (InvalidData) is altered data, not a broken
    // link: it fails the session at once and is reported as the root cause, like a
    // checksum mismatch.
    let lost = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            Error::refused(
                ErrorCode::Checksum,
                format!("receiving data from {peer}: {e}"),
            )
        } else {
            Error::data("receiving data from", &peer, e)
        }
    };
    let fatal = |what: String| Error::protocol(&peer, what);
    let mut segments = Vec::new();
    loop {
        let hb = s.io.recv_header().await.map_err(lost)?;
        let h =
            FrameHeader::decode(&hb, &limits).map_err(|e| Error::Net(NetError::proto(&peer, e)))?;
        if h.kind == FrameKind::End {
            return Ok(Some(h.chunk));
        }
        let k = h.chunk;
        if h.part {
            let mut off = [0u8; PART_LEN];
            s.io.recv_into(&mut off).await.map_err(lost)?;
            let offset = u32::from_be_bytes(off);
            if k >= n {
                layout = sink.layout();
                n = layout.n_chunks();
            }
            let (lo, hi) = layout.chunk_bounds(k);
            if k >= n || u64::from(offset) + u64::from(h.payload_len) > hi - lo {
                return Err(fatal(format!(
                    "a part of {} bytes at {offset} of chunk {k}, beyond it",
                    h.payload_len
                )));
            }
            let mut trailer = vec![0u8; h.n_digests as usize * DIGEST_LEN];
            s.io.recv_into(&mut trailer).await.map_err(lost)?;
            let mut data = vec![0u8; h.payload_len as usize];
            s.io.recv_into(&mut data).await.map_err(lost)?;
            let wire = u64::from(h.payload_len);
            progress.bytes.fetch_add(wire, Relaxed);
            progress.stream_bytes.add(i, wire);
            progress.data_flowing();
            let _ = tx.send(SinkIn::Part {
                stream: i,
                chunk: k,
                offset,
                data,
                trailer,
                crc: h.crc,
            });
            let Some(frames) = acks.recv().await else {
                return Ok(None);
            };
            s.io.send_ack(frames).await.map_err(lost)?;
            continue;
        }
        if k >= n {
            // A growing manifest's later part: its chunks come once the storage laid
            // it out (the source waits for `Grown`).
            layout = sink.layout();
            n = layout.n_chunks();
        }
        if k >= n {
            return Err(fatal(format!(
                "chunk {k} out of range (the dataset has {n})"
            )));
        }
        let expected = layout.wire_len(k);
        if !h.zeros && u64::from(h.payload_len) != expected {
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
        if h.zeros && !sink.sparse_chunk(k) {
            return Err(fatal(format!(
                "chunk {k} sent as zeros holds a file not listed as sparse"
            )));
        }
        let mut trailer = vec![0u8; h.n_digests as usize * DIGEST_LEN];
        s.io.recv_into(&mut trailer).await.map_err(lost)?;
        let mut buf = pool.get().await;
        layout.segments(k, &mut segments);
        for &(off, len) in &segments {
            if h.zeros {
                buf[off..off + len].fill(0);
                continue;
            }
            // Sealed records are opened straight into the pool buffer.
            s.io.recv_into(&mut buf[off..off + len])
                .await
                .map_err(lost)?;
        }
        // Bytes that crossed the stream (none for a zeros frame).
        let wire = if h.zeros {
            progress.holes.fetch_add(expected, Relaxed);
            0
        } else {
            expected
        };
        progress.bytes.fetch_add(wire, Relaxed);
        progress.stream_bytes.add(i, wire);
        progress.chunks.fetch_add(1, Relaxed);
        progress.data_flowing();
        let _ = tx.send(SinkIn::Arrived {
            stream: i,
            chunk: k,
            buf,
            trailer,
            crc: h.crc,
        });
        let Some(frames) = acks.recv().await else {
            return Ok(None);
        };
        s.io.send_ack(frames).await.map_err(lost)?;
    }
}

#[cfg(test)]
mod tests {
    //! Both role drivers against each other in one process: a control channel and data
    //! streams over in-memory pipes, memory storage, the dialer's handshake answered by
    //! [`accept`]. Everything but sockets and files is the code a real session runs.

    use super::*;

    use dmover_net::fault::{FaultPlan, Faulty};
    use dmover_net::stream::DataIo;
    use dmover_proto::auth::Role;
    use dmover_proto::control::{Credential, DataProtection, DirectIo, Op, Welcome};
    use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT, Totals};
    use dmover_proto::session::{Dial, Limits};
    use dmover_store::mem::{MemSink, MemSource};
    use tokio::io::DuplexStream;

    const CHUNK: u32 = 64 << 10;
    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn streamed_parts_cut_the_manifest_with_running_totals_and_their_metadata() {
        use dmover_proto::manifest::EntryMeta;
        let mtime = Mtime { sec: 1, nsec: 2 };
        let mut entries = vec![Entry {
            parent: NO_PARENT,
            name: b"d".to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime,
        }];
        for i in 0..9u64 {
            entries.push(Entry {
                parent: 0,
                name: format!("f{i}").into_bytes(),
                kind: EntryKind::File { size: i },
                mode: 0o644,
                mtime,
            });
        }
        let meta = |entry: u32| EntryMeta {
            entry,
            uid: entry,
            gid: 0,
            xattrs: Vec::new(),
        };
        let rest = entries.split_off(3);
        let first = entries.clone();
        // Metadata out of order, one entry past the manifest (dropped).
        let all_meta = vec![meta(9), meta(0), meta(4), meta(12), meta(2), meta(7)];
        let parts = streamed_parts(first.clone(), 1, rest, &[3, 5, 8, 10], all_meta);
        let shape: Vec<(usize, u64, u64, bool, Vec<u32>)> = parts
            .iter()
            .map(|p| {
                (
                    p.entries.len(),
                    p.totals.entries,
                    p.totals.bytes,
                    p.last,
                    p.meta.iter().map(|m| m.entry).collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (3, 3, 1, false, vec![0, 2]),
                (2, 5, 1 + 2 + 3, false, vec![4]),
                (3, 8, 6 + 4 + 5 + 6, false, vec![7]),
                (2, 10, 21 + 7 + 8, true, vec![9]),
            ]
        );
        assert_eq!(parts[0].entries, first);
        assert_eq!(parts[0].chunks, 1);
        assert_eq!(parts[3].entries[1].name, b"f8");
        // Ends short of the manifest: the rest is a last part of its own.
        let rest: Vec<Entry> = parts
            .iter()
            .skip(1)
            .flat_map(|p| p.entries.clone())
            .collect();
        let short = streamed_parts(first.clone(), 1, rest, &[3, 5], Vec::new());
        let lens: Vec<(usize, bool)> = short.iter().map(|p| (p.entries.len(), p.last)).collect();
        assert_eq!(lens, vec![(3, false), (2, false), (5, true)]);
        assert_eq!(short[2].totals.entries, 10);
        // A manifest that fits its first part: one part, the last.
        let parts = streamed_parts(first, 1, vec![], &[3], Vec::new());
        assert_eq!(parts.len(), 1);
        assert!(parts[0].last);
    }

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
        let sizes = [
            0usize,
            1,
            4095,
            65_536,
            3 * 65_536 + 17,
            200_000,
            300,
            500_000,
        ];
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

    /// The dialer's streams: an in-memory pipe per stream, the far end handed to the
    /// acceptor as its join listener would; `plan` cuts the dialer's ends.
    struct Pipes {
        to_acceptor: mpsc::Sender<Joined<DuplexStream>>,
        plan: Option<Arc<FaultPlan>>,
        ready: Vec<u16>,
    }

    impl Joins for Pipes {
        type Link = Faulty<DataIo<DuplexStream>>;

        fn opened(&mut self, _info: &SessionInfo) {}

        fn open(&mut self, stream: u16) {
            self.ready.push(stream);
        }

        async fn next(&mut self) -> (u16, Result<DataStream<Self::Link>>) {
            let Some(i) = self.ready.pop() else {
                return std::future::pending().await;
            };
            let (a, b) = tokio::io::duplex(128 << 10);
            let p = DataProtection::Authenticated;
            let far = DataIo::new(b, p, &KEY, i, Role::Server, None);
            let _ = self
                .to_acceptor
                .send(Joined {
                    stream: i,
                    io: far,
                    peer: "source".into(),
                })
                .await;
            let near = DataIo::new(a, p, &KEY, i, Role::Client, None);
            let io = Faulty::new(near, self.plan.clone());
            let peer = "sink".into();
            (i, Ok(DataStream { io, peer }))
        }
    }

    fn env(buffers: usize) -> Env {
        Env {
            disk: Arc::new(DiskPool::new(2, "test-disk")),
            run: Run::new(),
            buffers: Box::new(move |_| buffers),
            chunk_delay: None,
            zerocopy: None,
            limits: None,
            receive_budget: None,
            send_budget: None,
            tuned_start: crate::session::TUNED_START,
            disk_room: None,
        }
    }

    fn options() -> SessionOptions {
        SessionOptions {
            resume: false,
            journal: false,
            fsync: false,
            verify: false,
            continue_on_error: false,
            heartbeat_ms: 0,
        }
    }

    /// Pushes `source` into a memory sink over `streams` streams: the source dials, the
    /// sink accepts.
    async fn push<K: SourceStore + Entries>(
        source: K,
        checksum: bool,
        streams: u16,
        plan: Option<Arc<FaultPlan>>,
    ) -> (Result<SourceRun<K>>, Result<SinkRun<MemSink>>) {
        let entries = source.layout_entries().to_vec();
        let chunks = chunk_set(source.chunks());
        let prepare: Prepare<MemSink> =
            Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, checksum)?));
        pair(source, checksum, streams, plan, 0, prepare, |m| {
            m.push_manifest(&entries);
            m.end_manifest(Totals::of(&entries), chunks);
            None
        })
        .await
    }

    /// A session between both drivers: `source` dials with `features`, `manifest`
    /// queues the manifest on its machine (or returns the feed of a growing one), the
    /// sink accepts with the storage `prepare` makes.
    async fn pair<K: SourceStore, S: SinkStore>(
        source: K,
        checksum: bool,
        streams: u16,
        plan: Option<Arc<FaultPlan>>,
        features: u64,
        prepare: Prepare<S>,
        manifest: impl FnOnce(&mut SourceSession<Fault>) -> Option<mpsc::UnboundedReceiver<GrowPart>>,
    ) -> (Result<SourceRun<K>>, Result<SinkRun<S>>) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let max = dmover_proto::control::MAX_FRAME;
        let mut dialer = ControlChannel::new(a, "sink", max);
        let mut acceptor = ControlChannel::new(b, "source", max);
        let timing = timing(Duration::from_secs(5), Duration::from_secs(30));
        let start = now();
        let d = Dial {
            hello: Hello {
                software: "test".into(),
                nonce: [1; 32],
            },
            auth: Auth {
                user: String::new(),
                credential: Credential::None,
            },
            open: Open {
                op: Op::Push {
                    dest: b"d".to_vec(),
                },
                streams,
                chunk_size: CHUNK,
                checksum,
                direct_io: DirectIo::Auto,
                protection: DataProtection::Authenticated,
                features,
            },
            options: options(),
            server_proof: None,
            limits: Default::default(),
        };
        let mut m = SourceSession::dial(start, "sink", timing, d);
        let growth = manifest(&mut m);
        let (tx, rx) = mpsc::channel(streams as usize);
        let pipes = Pipes {
            to_acceptor: tx,
            plan,
            ready: Vec::new(),
        };
        let sending =
            async { self::source_growing(m, &mut dialer, pipes, source, env(6), growth).await };
        let receiving = async {
            let welcome = Welcome {
                software: "test".into(),
                nonce: [2; 32],
                auth: dmover_proto::control::AuthMethod::None,
            };
            let deadline = start + Duration::from_secs(30);
            let a = Acceptance::new("source", timing, deadline, welcome);
            let open = accept(a, &mut acceptor, |_, _| Ok(AuthOk { proof: None })).await?;
            let mut m = SinkSession::accept(now(), "source", timing, Limits::default(), deadline);
            m.grant(
                now(),
                SessionInfo {
                    id: 9,
                    salt: [3; 32],
                    streams: open.streams,
                    chunk_size: open.chunk_size,
                    features: dmover_proto::session::features::negotiate(
                        open.features,
                        dmover_proto::session::features::SUPPORTED,
                    ),
                },
            );
            let joins = Accepted::new(rx, |io| io);
            sink(m, &mut acceptor, joins, prepare, None, env(4)).await
        };
        tokio::join!(sending, receiving)
    }

    /// A manifest that grows in parts, some sent before the sink is prepared and some
    /// while data flows, over the memory test's storage: every chunk of every part
    /// arrives once, and the session ends after the last part.
    #[test]
    fn a_growing_manifest_through_both_drivers() {
        use crate::memtest::{Discard, Pattern};
        use dmover_proto::session::features::GROWING_MANIFEST;
        for (checksum, cut) in [(true, None), (false, None), (true, Some(300_000))] {
            let plan = cut.map(|at| FaultPlan::new(Some((at, false))));
            let (tx, rx) = mpsc::unbounded_channel();
            let source = Pattern::new(CHUNK, checksum).unwrap();
            let prepare: Prepare<Discard> =
                Box::new(move |entries, chunk, _| Discard::new(entries, chunk, checksum));
            let rt = runtime();
            let parts = [3u64, 1, 7, 0, 5];
            let feeding = async {
                let mut totals = Totals::default();
                let mut chunks = 0;
                for (i, &n) in parts.iter().enumerate() {
                    let mut entries = Vec::new();
                    if n > 0 {
                        entries.push(Entry {
                            parent: NO_PARENT,
                            name: format!("p{i}").into_bytes(),
                            kind: EntryKind::File {
                                size: n * u64::from(CHUNK),
                            },
                            mode: 0o644,
                            mtime: Mtime { sec: 0, nsec: 0 },
                        });
                    }
                    totals.entries += entries.len() as u64;
                    totals.files += entries.len() as u64;
                    totals.bytes += n * u64::from(CHUNK);
                    chunks += n;
                    let last = i + 1 == parts.len();
                    tx.send(GrowPart {
                        entries,
                        totals,
                        chunks,
                        last,
                        durable: None,
                        times: Vec::new(),
                        meta: Vec::new(),
                        sent: false,
                        sparse: Vec::new(),
                    })
                    .unwrap();
                    tokio::time::sleep(Duration::from_millis(if i == 0 { 0 } else { 20 })).await;
                }
            };
            let session = pair(
                source,
                checksum,
                3,
                plan.clone(),
                GROWING_MANIFEST,
                prepare,
                |_| Some(rx),
            );
            let ((sent, received), ()) = rt.block_on(async { tokio::join!(session, feeding) });
            let sent = sent.unwrap();
            let r = received.unwrap();
            let total: u64 = parts.iter().sum();
            assert_eq!(r.summary.chunks, total, "each chunk written once");
            assert_eq!(r.summary.bytes, r.summary.chunks * u64::from(CHUNK));
            assert_eq!(r.summary.verified, checksum);
            assert_eq!(sent.summary, r.summary);
            if let Some(p) = plan {
                assert!(p.cut_done());
                assert_eq!(sent.stats.streams_lost, 1, "{:?}", sent.stats);
            }
        }
    }

    /// A sink whose storage cannot grow refuses a growing manifest's later parts: the
    /// session fails at both ends with that reason.
    #[test]
    fn storage_that_cannot_grow_fails_a_growing_session() {
        use crate::memtest::Pattern;
        use dmover_proto::session::features::GROWING_MANIFEST;
        let (tx, rx) = mpsc::unbounded_channel();
        let source = Pattern::new(CHUNK, true).unwrap();
        let prepare: Prepare<MemSink> =
            Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, true)?));
        let file = |i: u64| Entry {
            parent: NO_PARENT,
            name: format!("p{i}").into_bytes(),
            kind: EntryKind::File {
                size: u64::from(CHUNK),
            },
            mode: 0o644,
            mtime: Mtime { sec: 0, nsec: 0 },
        };
        let mut t = Totals {
            entries: 1,
            files: 1,
            bytes: u64::from(CHUNK),
            ..Totals::default()
        };
        tx.send(GrowPart {
            entries: vec![file(0)],
            totals: t,
            chunks: 1,
            last: false,
            durable: None,
            times: Vec::new(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        })
        .unwrap();
        t.entries += 1;
        t.files += 1;
        t.bytes += u64::from(CHUNK);
        tx.send(GrowPart {
            entries: vec![file(1)],
            totals: t,
            chunks: 2,
            last: true,
            durable: None,
            times: Vec::new(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        })
        .unwrap();
        let (sent, received) = runtime().block_on(pair(
            source,
            true,
            2,
            None,
            GROWING_MANIFEST,
            prepare,
            |_| Some(rx),
        ));
        let e = received.err().expect("the sink refuses").to_string();
        assert!(e.contains("cannot take a growing manifest"), "{e}");
        let e = sent.err().expect("the source hears it").to_string();
        assert!(e.contains("cannot take a growing manifest"), "{e}");
    }

    /// The manifest a memory source was made with.
    trait Entries {
        fn layout_entries(&self) -> &[Entry];
    }

    impl Entries for MemSource {
        fn layout_entries(&self) -> &[Entry] {
            self.entries()
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn memory_source_to_memory_sink_through_both_drivers() {
        let (entries, data) = dataset();
        let total: usize = data.iter().map(Vec::len).sum();
        for checksum in [true, false] {
            let source = MemSource::new(entries.clone(), data.clone(), CHUNK, checksum).unwrap();
            let (sent, received) = runtime().block_on(push(source, checksum, 3, None));
            let sent = sent.unwrap();
            assert_eq!(sent.stats.streams_lost, 0);
            let r = received.unwrap();
            assert_eq!(r.stats.duplicates, 0);
            assert_eq!(
                sent.summary, r.summary,
                "both ends report the sink's summary"
            );
            assert_eq!(r.report.streams_lost, 0);
            assert_eq!(
                (
                    r.summary.bytes,
                    r.summary.files,
                    r.summary.dirs,
                    r.summary.verified
                ),
                (total as u64, 8, 1, checksum)
            );
            for (i, want) in data.iter().enumerate().skip(1) {
                assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
            }
        }
    }

    /// A push whose first part went in the first flight (`GrowPart::sent`) in a
    /// session that does not take parts (no `STREAMED` offered): the rest follows as
    /// one manifest, and every file arrives.
    #[test]
    fn a_streamed_push_to_a_sink_without_parts_goes_whole() {
        use dmover_proto::session::features::GROWING_MANIFEST;
        let (entries, data) = dataset();
        let total: usize = data.iter().map(Vec::len).sum();
        let source = MemSource::new(entries.clone(), data.clone(), CHUNK, true).unwrap();
        let prepare: Prepare<MemSink> =
            Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, true)?));
        let (first, rest) = entries.split_at(3);
        let mut parts = streamed_parts(first.to_vec(), 0, rest.to_vec(), &[3, 5], Vec::new());
        assert_eq!(parts.len(), 3);
        parts[0].sent = true;
        let first = first.to_vec();
        let (sent, received) = runtime().block_on(pair(
            source,
            true,
            3,
            None,
            GROWING_MANIFEST,
            prepare,
            move |m| {
                m.push_manifest(&first);
                let (tx, rx) = mpsc::unbounded_channel();
                for p in parts {
                    let _ = tx.send(p);
                }
                Some(rx)
            },
        ));
        let r = received.unwrap();
        assert_eq!(sent.unwrap().summary, r.summary);
        assert_eq!(
            (r.summary.bytes, r.summary.files, r.summary.dirs),
            (total as u64, 8, 1)
        );
        for (i, want) in data.iter().enumerate().skip(1) {
            assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
        }
    }

    /// A stream cut in the middle of a chunk: the source sends its unacknowledged
    /// chunks on the others, the sink keeps the first whole copy of each, and every
    /// byte arrives.
    #[test]
    fn a_stream_cut_mid_chunk_is_survived() {
        let (entries, data) = dataset();
        let source = MemSource::new(entries, data.clone(), CHUNK, true).unwrap();
        let plan = FaultPlan::new(Some((100_000, false)));
        let (sent, received) = runtime().block_on(push(source, true, 3, Some(plan.clone())));
        assert!(plan.cut_done());
        let sent = sent.unwrap();
        let r = received.unwrap();
        assert_eq!(sent.stats.streams_lost, 1, "{:?}", sent.stats);
        assert!(sent.stats.chunks_resent >= 1, "{:?}", sent.stats);
        assert_eq!(r.report.streams_lost, 1);
        for (i, want) in data.iter().enumerate().skip(1) {
            assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
        }
    }

    /// A source whose bytes differ from what it hashed: the sink refuses the file with
    /// the checksum error a disk sink gives, and both ends fail with its code.
    #[test]
    fn a_digest_mismatch_fails_the_transfer_at_both_ends() {
        let (entries, data) = dataset();
        let mut wrong = data.clone();
        wrong[5][70_000] ^= 1;
        // The source announces digests of `data` but sends `wrong`: a sink built for
        // checksums sees a CRC that matches the bytes sent and a file digest that does not.
        struct Lying(MemSource, MemSource);
        impl Source for Lying {
            fn layout(&self) -> std::sync::Arc<dmover_proto::layout::Layout> {
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
                    zeros: false,
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
        impl SourceStore for Lying {}
        impl Entries for Lying {
            fn layout_entries(&self) -> &[Entry] {
                self.0.entries()
            }
        }
        let source = Lying(
            MemSource::new(entries.clone(), data, CHUNK, true).unwrap(),
            MemSource::new(entries, wrong, CHUNK, true).unwrap(),
        );
        let (sent, received) = runtime().block_on(push(source, true, 2, None));
        let e = received.err().expect("the sink fails");
        assert_eq!(e.code(), ErrorCode::Checksum, "{e}");
        assert!(
            e.to_string()
                .starts_with("checksum mismatch: f4: received data has digest"),
            "{e}"
        );
        let e = sent.err().expect("the source fails");
        assert!(
            matches!(&e, Error::Remote { code: ErrorCode::Checksum, message, .. }
                if message.starts_with("checksum mismatch: f4")),
            "the source reports the sink's error: {e}"
        );
    }
}
