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
use dmover_net::budget::Budget;
use dmover_net::control::ControlChannel;
use dmover_net::join::Joined;
use dmover_net::link::{Direction, Probe};
use dmover_net::stream::DataIo;
use dmover_net::transport::{AckRx, ChunkFrame, ChunkTx, DataLink, Received, RecvError};
use dmover_net::zerocopy::ZeroCopyStats;
use dmover_proto::control::{
    Auth, AuthOk, Control, ErrorCode, FailedFile, Have, Hello, Open, Plan, SendReport, SessionInfo,
    SessionLimits, SessionOptions, Summary, Tuned,
};
use dmover_proto::data::{DigestEntry, FrameLimits};
use dmover_proto::manifest::{Entry, EntryKind, EntryMeta, Totals};
use dmover_proto::session::tune::{Pressure, TuneConfig, Tuner};
use dmover_proto::session::{
    AcceptEvent, Acceptance, Arrival, Cause, ChunkMeta, ChunkSet, PartPlan, PartRange, ReadJob,
    SessionError, Side, SinkCommand, SinkEvent, SinkSession, SourceCommand, SourceEvent,
    SourceSession, StreamStats, Timing, features,
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
    m: SourceSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    store: K,
    env: Env,
    growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
) -> Result<SourceRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    SourceDriver::new(m, ch, joins, store, env, growth)
        .run()
        .await
}

/// A source session's driver: the machine, what it drives, and what it waits on. Its
/// loop ([`SourceDriver::run`]) looks after the tuners, lets the machine say all it
/// has to say ([`SourceDriver::drain`]), then waits for one thing to happen
/// ([`SourceDriver::wait`]) and feeds it in ([`SourceDriver::wake`]).
struct SourceDriver<'a, C, J: Joins, K> {
    m: SourceSession<Fault>,
    ctl: ControlLink<'a, C>,
    joins: J,
    env: Env,
    peer: String,
    /// What the stream tasks and disk threads report.
    tx: mpsc::UnboundedSender<SrcIn<K>>,
    rx: mpsc::UnboundedReceiver<SrcIn<K>>,
    /// The storage until `Go` (away on a disk thread while a resume is checked).
    prep: Option<K>,
    /// The storage, what reads it and the chunk buffers, from `Go` on.
    live: Option<(Arc<K>, Arc<dyn Source>, Pool)>,
    /// A free buffer the machine has no read for yet.
    spare: Option<PoolBuf>,
    /// Chunks read and not yet sent, by chunk and part (a request-driven session may
    /// read parts of one chunk for several reads at once).
    bufs: HashMap<(u64, Option<PartRange>), PoolBuf>,
    tasks: HashMap<u16, Task<SrcOut>>,
    cancelled: bool,
    /// The manifest's later parts (a growing manifest).
    growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
    growing: bool,
    tuner: Option<Tuner>,
    disk_tune: Option<DiskTune>,
    /// Reads on the disk threads, for the disk tuner: the data wait on them too when
    /// every chunk left is being read.
    reading: usize,
    meters: Meters,
    sendbufs: Budget,
    /// Parts so far, and the entries whose metadata went with them.
    parts: u64,
    meta_from: u32,
    /// Parts whose producer waits to hear they are durable: (the part's number, the
    /// layout's end with it, whom to tell).
    durable: VecDeque<(u64, u64, tokio::sync::oneshot::Sender<()>)>,
}

/// What a source driver woke up for.
enum SrcWake<K, L> {
    Cancelled,
    Part(Option<GrowPart>),
    Input(SrcIn<K>),
    Joined(u16, Result<DataStream<L>>),
    Control(std::result::Result<Control, NetError>),
    Buffer(PoolBuf),
    Timeout,
}

impl<'a, C, J, K> SourceDriver<'a, C, J, K>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    fn new(
        m: SourceSession<Fault>,
        ch: &'a mut ControlChannel<C>,
        joins: J,
        store: K,
        env: Env,
        growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
    ) -> Self {
        let ctl = ControlLink::new(ch);
        let peer = ctl.ch.peer().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let sendbufs = Budget::new(Direction::Send, env.send_budget, &peer);
        SourceDriver {
            m,
            ctl,
            joins,
            env,
            peer,
            tx,
            rx,
            prep: Some(store),
            live: None,
            spare: None,
            bufs: HashMap::new(),
            tasks: HashMap::new(),
            cancelled: false,
            growing: growth.is_some(),
            growth,
            tuner: None,
            disk_tune: None,
            reading: 0,
            meters: Meters::default(),
            sendbufs,
            parts: 0,
            meta_from: 0,
            durable: VecDeque::new(),
        }
    }

    async fn run(mut self) -> Result<SourceRun<K>> {
        loop {
            self.look_after();
            if let Some(end) = self.drain().await {
                return end;
            }
            let wake = self.wait().await;
            self.wake(wake);
        }
    }

    /// The tuners' turn, the buffers' and the durable parts' news.
    fn look_after(&mut self) {
        let p = &self.env.run.progress;
        if let Some(t) = self.tuner.as_mut() {
            tune_step(t, &mut self.m, &self.meters, p, &self.peer);
            self.sendbufs.sending(t.streams());
        }
        self.sendbufs.check(now());
        if let Some(share) = self.sendbufs.take_set() {
            p.send_buffer.store(share, Relaxed);
        }
        if let (Some(t), Some((.., pool))) = (self.disk_tune.as_mut(), &self.live) {
            let left = remaining(p, self.m.manifest_complete());
            let working = self.m.has_work() || self.reading > 0;
            t.step(p, pool, working, left, &self.peer);
        }
        while let Some((i, end, _)) = self.durable.front() {
            if self.m.parts_confirmed() <= *i || self.m.stored_below() < *end {
                break;
            }
            if let Some((.., tell)) = self.durable.pop_front() {
                let _ = tell.send(());
            }
        }
    }

    /// What the machine asks, until it asks nothing more; the session's end when it
    /// came.
    async fn drain(&mut self) -> Option<Result<SourceRun<K>>> {
        loop {
            self.ctl.flush(&mut self.m).await;
            let mut busy = false;
            while let Some(c) = self.m.poll_command() {
                busy = true;
                self.command(c);
            }
            while let Some(ev) = self.m.poll_event() {
                busy = true;
                if let Some(end) = self.event(ev).await {
                    return Some(end);
                }
            }
            busy |= self.read_more();
            if !busy {
                return None;
            }
        }
    }

    fn command(&mut self, c: SourceCommand) {
        match c {
            SourceCommand::Open { stream } => self.joins.open(stream),
            SourceCommand::Send {
                stream,
                chunk,
                meta,
            } => self.send(stream, chunk, meta),
            SourceCommand::End { stream, sent } => {
                if let Some(t) = self.tasks.get(&stream) {
                    let _ = t.tx.send(SrcOut::End(sent));
                }
            }
            SourceCommand::Close { stream } => self.retire(stream),
        }
    }

    /// Hands chunk `chunk`'s buffer to stream `stream`'s task.
    fn send(&mut self, stream: u16, chunk: u64, meta: ChunkMeta) {
        let (Some(buf), Some((_, src, _))) = (self.bufs.remove(&(chunk, meta.part)), &self.live)
        else {
            return;
        };
        let Some(t) = self.tasks.get(&stream) else {
            return;
        };
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

    /// Stream `stream` ended, was lost or closed: its task and its probes go.
    fn retire(&mut self, stream: u16) {
        self.tasks.remove(&stream);
        self.meters.retire(stream);
        self.sendbufs.retire(stream);
    }

    /// One of the machine's events; the session's end when it ended.
    async fn event(&mut self, ev: SourceEvent<Fault>) -> Option<Result<SourceRun<K>>> {
        match ev {
            SourceEvent::Opened(info) => self.joins.opened(&info),
            SourceEvent::Limits(l) => {
                if let Some(a) = peer_limits(self.m.side(), &mut self.env, &self.peer, l) {
                    self.m.limits(a);
                }
            }
            SourceEvent::Options(o) => {
                if let Some(k) = self.prep.as_mut() {
                    k.set_continue_on_error(o.continue_on_error);
                }
            }
            SourceEvent::Held(parts) => self.check_held(parts),
            SourceEvent::Go => self.go(),
            SourceEvent::StreamLost {
                stream,
                error,
                resent,
            } => self.stream_lost(stream, &error, resent),
            SourceEvent::Sent => {
                let failed = self.live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                self.m.report(failed);
            }
            SourceEvent::Drained => {
                // The streams end: their connections must close with them.
                self.meters.retire_all();
                self.sendbufs.retire_all();
                let failed = self.live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                self.m.drained(failed);
            }
            SourceEvent::Done(summary) => return Some(Ok(self.done(summary).await)),
            SourceEvent::Failed(e) => {
                self.ctl.flush(&mut self.m).await;
                return Some(Err(self
                    .env
                    .run
                    .take_error()
                    .unwrap_or_else(|| session_error(e))));
            }
        }
        None
    }

    /// The sink told what it holds: the storage checks it on a disk thread.
    fn check_held(&mut self, parts: Vec<Have>) {
        let Some(mut k) = self.prep.take() else {
            return;
        };
        let (tx, peer) = (self.tx.clone(), self.peer.clone());
        self.env.disk.spawn(move || {
            let r = k
                .resume_from(&peer, &parts)
                .map(|plan| (plan, chunk_set(k.chunks())));
            let _ = tx.send(SrcIn::Checked(Box::new((k, r))));
        });
    }

    /// `Go`: the storage is bound, the chunk buffers made, the tuners start.
    fn go(&mut self) {
        let Some(k) = self.prep.take() else {
            return;
        };
        let info = self.m.info().expect("open before Go").clone();
        self.env.run.progress.held.store(k.held_bytes(), Relaxed);
        let k = Arc::new(k);
        let mut src: Arc<dyn Source> = k.clone();
        if let Some(d) = self.env.chunk_delay {
            src = Arc::new(Slow::new(src, d));
        }
        let tuned = info.features & features::TUNING != 0;
        let n = (self.env.buffers)(crate::session::buffer_streams(info.streams, tuned));
        if tuned {
            self.start_tuner(info.streams);
        }
        // The sink's chunk requests (feature RANGES) are checked against the whole
        // layout; a growing manifest's against what it confirmed.
        if !self.growing {
            self.m.set_layout_chunks(src.layout().n_chunks());
        }
        self.live = Some((k, src, Pool::new(n, info.chunk_size as usize)));
        self.disk_tune = DiskTune::new(&mut self.env);
    }

    /// The stream tuner starts (feature TUNING) on its first streams of `of`.
    fn start_tuner(&mut self, of: u16) {
        let t = Tuner::new(TuneConfig::new(self.env.tuned_start, of));
        self.m.set_active(now(), t.streams());
        let reason = format!("starting with {} of {of} streams", t.streams());
        self.m.tuned(Tuned {
            at_ms: 0,
            streams: t.streams(),
            rate: 0,
            reason: reason.clone(),
        });
        let p = &self.env.run.progress;
        p.event(ProgressEvent::Tuned {
            streams: t.streams(),
            rate: 0,
            reason,
        });
        *p.tuning.lock() = Some(Tuning {
            streams: t.streams(),
            of,
            active: t.streams(),
            changes: 0,
            settled_ms: None,
        });
        self.tuner = Some(t);
    }

    fn stream_lost(&mut self, stream: u16, error: &SessionError<Fault>, resent: u64) {
        tracing::warn!(
            "data stream {stream} to {} broke ({error}); sending its {resent} \
             unacknowledged chunks on the others",
            self.peer
        );
        let p = &self.env.run.progress;
        p.streams_lost.fetch_add(1, Relaxed);
        p.chunks_resent.fetch_add(resent, Relaxed);
        p.event(ProgressEvent::StreamLost {
            stream,
            error: error.to_string(),
            resent: Some(resent),
        });
    }

    /// The session ended well: parts still waiting hear they are durable.
    async fn done(&mut self, summary: Summary) -> SourceRun<K> {
        self.ctl.flush(&mut self.m).await;
        for (.., tell) in self.durable.drain(..) {
            let _ = tell.send(());
        }
        let store = match self.live.take() {
            Some((k, ..)) => k,
            None => Arc::new(self.prep.take().expect("the store is here")),
        };
        SourceRun {
            info: self.m.info().expect("open before the end").clone(),
            summary,
            stats: self.m.stats(),
            store,
        }
    }

    /// Starts a read into the free buffer, if the machine has a chunk to read.
    fn read_more(&mut self) -> bool {
        let (Some((_, src, _)), Some(buf)) = (&self.live, self.spare.take()) else {
            return false;
        };
        match self.m.poll_read() {
            Some(job) => {
                spawn_read(&self.env.disk, src.clone(), job, buf, self.tx.clone());
                self.reading += 1;
                true
            }
            None => {
                self.spare = Some(buf);
                false
            }
        }
    }

    /// The earliest of the machine's and the tuners' timers.
    fn deadline(&self) -> Option<std::time::Instant> {
        [
            self.m.poll_timeout(),
            self.tuner.as_ref().and_then(Tuner::poll_timeout),
            self.disk_tune.as_ref().and_then(DiskTune::poll_timeout),
            self.sendbufs.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the next part of a growing manifest may be taken now (the machine's
    /// rule: [`SourceSession::ready_for_part`]).
    fn wants_part(&self) -> bool {
        self.growth.is_some() && self.m.ready_for_part(self.parts)
    }

    /// Waits for the next thing to happen.
    async fn wait(&mut self) -> SrcWake<K, J::Link> {
        let deadline = self.deadline();
        let wants_part = self.wants_part();
        let pool = self.live.as_ref().map(|l| l.2.clone());
        let wants_buffer = pool.is_some() && self.spare.is_none();
        let SourceDriver {
            env,
            cancelled,
            growth,
            rx,
            joins,
            ctl,
            ..
        } = self;
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !*cancelled => SrcWake::Cancelled,
            part = next_part(growth), if wants_part => SrcWake::Part(part),
            Some(input) = rx.recv() => SrcWake::Input(input),
            (i, r) = joins.next() => SrcWake::Joined(i, r),
            msg = ctl.recv() => SrcWake::Control(msg),
            b = async { pool.as_ref().expect("checked").get().await }, if wants_buffer => {
                SrcWake::Buffer(b)
            }
            _ = sleep_until(deadline) => SrcWake::Timeout,
        }
    }

    /// Feeds in what happened.
    fn wake(&mut self, wake: SrcWake<K, J::Link>) {
        match wake {
            SrcWake::Cancelled => {
                self.cancelled = true;
                // Why the run was cancelled (an interrupt, a revoked credential) is
                // what the peer learns; without a reason, the session was aborted.
                let why = self.env.run.take_error().unwrap_or(Error::Aborted);
                self.m.fail(now(), Fault::cancelled(why));
            }
            SrcWake::Part(part) => self.part(part),
            SrcWake::Input(input) => self.input(input),
            SrcWake::Joined(i, r) => self.joined(i, r),
            SrcWake::Control(Ok(msg)) => self.m.handle_control(now(), msg),
            SrcWake::Control(Err(e)) => {
                self.ctl.open = false;
                self.m.control_closed(now(), Fault::new(Error::Net(e)));
            }
            SrcWake::Buffer(b) => self.spare = Some(b),
            SrcWake::Timeout => self.m.handle_timeout(now()),
        }
    }

    /// What a stream task or a disk thread reported.
    fn input(&mut self, input: SrcIn<K>) {
        match input {
            SrcIn::Read {
                chunk,
                read: Ok((buf, meta)),
            } => {
                self.reading -= 1;
                self.bufs.insert((chunk, meta.part), buf);
                self.m.chunk_read(now(), chunk, meta);
            }
            SrcIn::Read { read: Err(e), .. } => {
                self.reading -= 1;
                self.m.fail(now(), Fault::new(e));
            }
            SrcIn::Written { stream, chunk } => {
                if let Some((_, src, _)) = &self.live {
                    self.env.run.progress.count_files(&src.layout(), chunk);
                }
                self.m.chunk_written(now(), stream, chunk)
            }
            SrcIn::Acked { stream, frames } => self.m.acked(now(), stream, frames),
            SrcIn::Failed { stream, error } => {
                self.retire(stream);
                self.m.stream_failed(now(), stream, Fault::new(error));
            }
            SrcIn::Checked(b) => {
                let (k, r) = *b;
                self.prep = Some(k);
                match r {
                    Ok((plan, chunks)) => self.m.planned(now(), plan, chunks),
                    Err(e) => self.m.fail(now(), Fault::new(e)),
                }
            }
        }
    }

    /// A data stream joined (or failed to): its task starts.
    fn joined(&mut self, i: u16, r: Result<DataStream<J::Link>>) {
        let s = match r {
            Ok(s) => s,
            Err(e) => return self.m.stream_failed(now(), i, Fault::new(e)),
        };
        let probe = s.io.probe();
        if self.m.uses(features::TUNING) {
            self.meters.add(i, probe.clone());
        }
        self.sendbufs.join(now(), i, probe.as_ref());
        let (ttx, trx) = mpsc::unbounded_channel();
        let h = tokio::spawn(source_stream(
            i,
            s,
            trx,
            self.tx.clone(),
            self.env.run.progress.clone(),
            self.env.zerocopy.clone(),
            // The sink knows the sparse files only under LINKS.
            self.m.uses(features::LINKS),
        ));
        self.tasks.insert(
            i,
            Task {
                tx: ttx,
                abort: h.abort_handle(),
            },
        );
        self.m.stream_joined(now(), i);
    }

    /// The next part of a growing manifest came from its producer (`None`: the
    /// producer stopped before the last).
    fn part(&mut self, part: Option<GrowPart>) {
        let Some(p) = part else {
            self.growth = None;
            let e = Error::refused(
                ErrorCode::Aborted,
                "the manifest's producer stopped before its last part",
            );
            return self.m.fail(now(), Fault::new(e));
        };
        let links_or_holes = !p.sparse.is_empty()
            || p.entries
                .iter()
                .any(|e| matches!(e.kind, EntryKind::HardLink { .. }));
        match self.m.plan_part(self.parts, p.sent, links_or_holes) {
            PartPlan::Grow => self.grow(p),
            PartPlan::RestWhole => self.rest_whole(p),
            PartPlan::Refuse => {
                self.growth = None;
                let e = Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "{}: the server takes no hard links or sparse files in a manifest \
                         sent while the walk runs (it predates that); upgrade it, or copy \
                         with --resume, which walks the whole tree first",
                        self.peer
                    ),
                );
                self.m.fail(now(), Fault::new(e));
            }
        }
    }

    /// The sink does not take parts: the rest of the manifest goes whole behind the
    /// first part's entries, as a push's always did.
    fn rest_whole(&mut self, p: GrowPart) {
        let (mut rest, mut meta, mut totals) = (Vec::new(), p.meta, p.totals);
        if let Some(g) = self.growth.as_mut() {
            while let Ok(mut q) = g.try_recv() {
                rest.append(&mut q.entries);
                meta.append(&mut q.meta);
                totals = q.totals;
            }
        }
        self.growth = None;
        self.growing = false;
        let grown = match self.prep.as_ref() {
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
            Err(e) => return self.m.fail(now(), Fault::new(e)),
        };
        self.env.run.progress.total.store(totals.bytes, Relaxed);
        self.m.push_manifest(&rest);
        self.m.push_meta(meta);
        self.m.end_manifest(totals, chunks);
    }

    /// A part goes to the sink: a later one laid out by storage that grows first.
    fn grow(&mut self, mut p: GrowPart) {
        let mut meta = Vec::new();
        let mut part_chunk = None;
        if self.parts > 0 {
            match self.lay_out(&mut p) {
                Ok((chunk, m)) => (part_chunk, meta) = (Some(chunk), m),
                Err(e) => {
                    self.growth = None;
                    return self.m.fail(now(), Fault::new(e));
                }
            }
        }
        meta.append(&mut p.meta);
        self.parts += 1;
        let progress = &self.env.run.progress;
        if self.parts > 1 && self.m.uses(features::STREAMED) {
            progress.manifest_grown.fetch_add(1, Relaxed);
        }
        self.m.times(std::mem::take(&mut p.times));
        if let Some(tell) = p.durable.take() {
            self.durable.push_back((self.parts - 1, p.chunks, tell));
        }
        if !p.sent {
            self.m.push_manifest(&p.entries);
        }
        self.m.sparse_files(&p.sparse);
        self.m.grow_meta(meta);
        // A streamed manifest's source knows the whole total already.
        progress.total.fetch_max(p.totals.bytes, Relaxed);
        if let Some(c) = part_chunk {
            self.m.part_chunk(now(), c);
        }
        self.m.grow_manifest(now(), p.totals, p.chunks, p.last);
        if p.last {
            self.growth = None;
        }
    }

    /// A later part: storage that grows lays it out now (in chunks of the part's own
    /// size where both ends can, feature PART_CHUNKS; `p.chunks` becomes the layout's
    /// length with it), and reads its entries' metadata (the first part's root's too).
    /// Returns the part's chunk size and that metadata.
    fn lay_out(&mut self, p: &mut GrowPart) -> Result<(u32, Vec<EntryMeta>)> {
        let store = self.prep.as_ref().or(self.live.as_ref().map(|l| &*l.0));
        let Some(k) = store else {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "a later part of the manifest came while a resume was checked",
            ));
        };
        let session = k.layout().chunk_size() as u32;
        let chunk = if k.part_chunks() && self.m.uses(features::PART_CHUNKS) {
            crate::session::part_chunk(&p.entries, session)
        } else {
            session
        };
        if chunk != session {
            let t = Totals::of(&p.entries);
            tracing::info!(
                "chunks of the transfer to {}: a later part's {} files hold {} bytes: {} \
                 KiB chunks for them (the session's: {} KiB)",
                self.peer,
                t.files,
                t.bytes,
                chunk >> 10,
                session >> 10
            );
        }
        if let Some(n) = k.grow(&p.entries, &p.sparse, chunk)? {
            p.chunks = n;
        }
        let meta;
        (meta, self.meta_from) = k.grown_meta(self.meta_from);
        Ok((chunk, meta))
    }
}

/// What a tuned source's data streams delivered, as their connections count it
/// ([`Probe`]), which its tuner measures with. A probe holds its stream's connection
/// open: it goes when the stream ends or is lost.
#[derive(Default)]
struct Meters {
    /// Each stream's probe, and whether its congestion control is model-based (BBR).
    live: HashMap<u16, (Probe, bool)>,
    /// Bytes delivered on streams whose probes went.
    retired: u64,
    /// Their busy and window-limited times.
    retired_pressure: (Duration, Duration),
    /// A stream joined without one: measure with the chunks sent instead.
    unmetered: bool,
}

impl Meters {
    fn add(&mut self, stream: u16, probe: Option<Probe>) {
        match probe {
            Some(p) => {
                let model_based = p.model_based();
                self.live.insert(stream, (p, model_based));
            }
            None => self.unmetered = true,
        }
    }

    fn retire(&mut self, stream: u16) {
        if let Some((p, _)) = self.live.remove(&stream) {
            if let Ok(s) = p.sample() {
                self.retired += s.delivered;
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
    /// by the peer beyond a loss: see
    /// [`dmover_net::link::StreamSample::delivered_beyond_loss`]), the smallest round
    /// trip seen, and what the streams waited on.
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
        for (probe, model_based) in self.live.values() {
            let s = probe.sample().ok()?;
            bytes += s.delivered + s.delivered_beyond_loss;
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
                let mut digests = Vec::new();
                src.read_chunk(job.chunk, &mut buf, &mut digests)
                    .map_err(Error::from)
                    .map(|r| {
                        (
                            buf,
                            ChunkMeta {
                                crc: r.crc,
                                digests,
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
/// (the CRC of its bytes, and the chunk's failure markers as its digests).
fn read_part(
    src: &dyn Source,
    k: u64,
    p: PartRange,
    mut buf: PoolBuf,
) -> Result<(PoolBuf, ChunkMeta)> {
    let mut digests = Vec::new();
    let r = src.read_chunk(k, &mut buf, &mut digests)?;
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
    digests.retain(DigestEntry::is_failure);
    Ok((
        buf,
        ChunkMeta {
            crc,
            digests,
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
                        digests: &meta.digests,
                        segments: if zeros { &[] } else { &segments },
                        zeros,
                        part: meta.part.map(|p| p.offset),
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
        digests: Vec<DigestEntry>,
        crc: Option<u32>,
    },
    /// A part frame (feature `PARTS`).
    Part {
        stream: u16,
        chunk: u64,
        offset: u32,
        data: Vec<u8>,
        digests: Vec<DigestEntry>,
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
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
    demand: Option<Demand<K>>,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    SinkDriver::new(m, ch, joins, prepare, options, env, demand)
        .run()
        .await
}

/// A sink session's driver (see [`SourceDriver`]: the same loop).
struct SinkDriver<'a, C, J: Joins, K> {
    m: SinkSession<Fault>,
    ctl: ControlLink<'a, C>,
    joins: J,
    env: Env,
    peer: String,
    /// What the stream tasks and disk threads report.
    tx: mpsc::UnboundedSender<SinkIn<K>>,
    rx: mpsc::UnboundedReceiver<SinkIn<K>>,
    /// Makes the storage once the manifest is in.
    prepare: Option<Prepare<K>>,
    /// The session's options (a dialer's own, or as the dialer sent them).
    options: Option<SessionOptions>,
    /// The storage and what an earlier attempt left, while the resume is agreed.
    prep: Option<(K, Held)>,
    /// Files the source listed as sparse, and the metadata it sent, before its
    /// manifest: for the storage.
    sparse: Vec<u32>,
    meta: Vec<EntryMeta>,
    /// The storage, what writes it and the chunk buffers, once prepared.
    live: Option<(Arc<K>, Arc<dyn Sink>, Pool)>,
    /// Streams that joined before the storage was ready.
    waiting: Vec<(u16, DataStream<J::Link>)>,
    tasks: HashMap<u16, Task<u64>>,
    summary: Option<Summary>,
    /// Later parts of a growing manifest that came before the storage was ready.
    grown: Vec<GrownPart>,
    /// Newer directory times that came while the storage was on a disk thread.
    times: Vec<(u32, dmover_proto::manifest::Mtime)>,
    cancelled: bool,
    /// Writes still queued are skipped once the session failed.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    windows: Budget,
    disk_tune: Option<DiskTune>,
    /// A request-driven sink's owner: its requests, and where its news go.
    asks: Option<mpsc::UnboundedReceiver<DemandAsk>>,
    news: Option<mpsc::UnboundedSender<DemandEvent<K>>>,
    closing: bool,
}

/// What a sink driver woke up for.
enum SinkWake<K, L> {
    Cancelled,
    Input(SinkIn<K>),
    Ask(Option<DemandAsk>),
    Joined(u16, Result<DataStream<L>>),
    Control(std::result::Result<Control, NetError>),
    Timeout,
}

impl<'a, C, J, K> SinkDriver<'a, C, J, K>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    fn new(
        m: SinkSession<Fault>,
        ch: &'a mut ControlChannel<C>,
        joins: J,
        prepare: Prepare<K>,
        options: Option<SessionOptions>,
        env: Env,
        demand: Option<Demand<K>>,
    ) -> Self {
        let (asks, news) = match demand {
            Some(d) => (Some(d.asks), Some(d.events)),
            None => (None, None),
        };
        let ctl = ControlLink::new(ch);
        let peer = ctl.ch.peer().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let windows = Budget::new(Direction::Receive, env.receive_budget, &peer);
        SinkDriver {
            m,
            ctl,
            joins,
            env,
            peer,
            tx,
            rx,
            prepare: Some(prepare),
            options,
            prep: None,
            sparse: Vec::new(),
            meta: Vec::new(),
            live: None,
            waiting: Vec::new(),
            tasks: HashMap::new(),
            summary: None,
            grown: Vec::new(),
            times: Vec::new(),
            cancelled: false,
            stopped: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            windows,
            disk_tune: None,
            asks,
            news,
            closing: false,
        }
    }

    async fn run(mut self) -> Result<SinkRun<K>> {
        loop {
            self.look_after();
            if let Some(end) = self.drain().await {
                return end;
            }
            let wake = self.wait().await;
            self.wake(wake);
        }
    }

    /// Times that waited for the storage, the buffers' and the disk tuner's turn.
    fn look_after(&mut self) {
        if let Some((k, ..)) = &self.live
            && !self.times.is_empty()
        {
            k.set_times(std::mem::take(&mut self.times));
        }
        self.windows.check(now());
        let p = &self.env.run.progress;
        if let Some(share) = self.windows.take_set() {
            p.receive_buffer.store(share, Relaxed);
        }
        // A request-driven sink (a mount) moves what its reader asks for, in bursts:
        // its disk threads are not tuned.
        if let Some((.., pool)) = &self.live
            && self.asks.is_none()
        {
            if self.disk_tune.is_none() {
                self.disk_tune = DiskTune::new(&mut self.env);
            }
            if let Some(t) = self.disk_tune.as_mut() {
                let p = &self.env.run.progress;
                let left = remaining(p, self.m.manifest_complete());
                t.step(p, pool, self.m.outstanding() > 0, left, &self.peer);
            }
        }
    }

    /// What the machine asks, until it asks nothing more; the session's end when it
    /// came.
    async fn drain(&mut self) -> Option<Result<SinkRun<K>>> {
        loop {
            self.ctl.flush(&mut self.m).await;
            let mut busy = false;
            while let Some(c) = self.m.poll_command() {
                busy = true;
                self.command(c);
            }
            while let Some(ev) = self.m.poll_event() {
                busy = true;
                if let Some(end) = self.event(ev).await {
                    return Some(end);
                }
            }
            if !busy {
                return None;
            }
        }
    }

    fn command(&mut self, c: SinkCommand) {
        match c {
            SinkCommand::Open { stream } => self.joins.open(stream),
            SinkCommand::Ack { stream, frames } => {
                if let Some(t) = self.tasks.get(&stream) {
                    let _ = t.tx.send(frames);
                }
            }
            SinkCommand::Close { stream } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.waiting.retain(|(i, _)| *i != stream);
            }
        }
    }

    /// One of the machine's events; the session's end when it ended.
    async fn event(&mut self, ev: SinkEvent<Fault>) -> Option<Result<SinkRun<K>>> {
        match ev {
            SinkEvent::Opened(info) => self.joins.opened(&info),
            SinkEvent::Options(o) => self.options = Some(o),
            SinkEvent::Sparse(list) => self.sparse = list,
            SinkEvent::Meta(m) => self.meta = m,
            SinkEvent::Manifest(entries) => self.prepare(entries),
            SinkEvent::Plan(plan) => self.planned(&plan),
            SinkEvent::Grown {
                entries,
                chunks,
                meta,
                sparse,
                chunk,
            } => {
                self.env.run.progress.grow_manifest(&entries);
                let part = GrownPart {
                    entries,
                    chunks,
                    meta,
                    sparse,
                    chunk,
                };
                match &self.live {
                    Some((k, ..)) => grow_sink(&mut self.m, &**k, part),
                    // Before the sink is prepared: when it is.
                    None => self.grown.push(part),
                }
            }
            SinkEvent::Times(t) => match (&self.live, &self.prep) {
                (Some((k, ..)), _) => k.set_times(t),
                (None, Some((k, _))) => k.set_times(t),
                // Between the preparation and the start (the storage on a disk
                // thread): with the next.
                (None, None) => self.times.extend(t),
            },
            SinkEvent::Complete => self.finish(),
            SinkEvent::Limits(l) => {
                if let Some(a) = peer_limits(self.m.side(), &mut self.env, &self.peer, l) {
                    self.m.limits(a);
                }
            }
            SinkEvent::Tuned(t) => self.tuned(t),
            SinkEvent::StreamLost { stream, error } => {
                tracing::warn!(
                    "data stream {stream} from {} broke ({error}); waiting for its chunks on \
                     the others",
                    self.peer
                );
                let p = &self.env.run.progress;
                p.streams_lost.fetch_add(1, Relaxed);
                p.event(ProgressEvent::StreamLost {
                    stream,
                    error: error.to_string(),
                    resent: None,
                });
            }
            SinkEvent::Done(report) => return Some(self.done(report).await),
            SinkEvent::Failed(e) => {
                self.ctl.flush(&mut self.m).await;
                self.tasks.clear();
                self.windows.retire_all();
                // Writes still queued are skipped; the sink gives up (nothing
                // incomplete under a final name) when the last of those that run lets
                // it go: aborting under a running write could journal a piece whose
                // staging file is gone.
                self.stopped.store(true, Relaxed);
                let e = self
                    .env
                    .run
                    .take_error()
                    .unwrap_or_else(|| session_error(e));
                return Some(Err(e));
            }
        }
        None
    }

    /// The manifest is in: the storage is made on a disk thread, with what an
    /// earlier attempt left when resuming.
    fn prepare(&mut self, entries: Vec<Entry>) {
        let (Some(f), Some(info)) = (self.prepare.take(), self.m.info()) else {
            return;
        };
        let p = &self.env.run.progress;
        let totals = dmover_proto::manifest::Totals::of(&entries);
        p.total.store(totals.bytes, Relaxed);
        let files = crate::engine::files_with_data(&entries);
        p.total_files.store(files, Relaxed);
        p.set_manifest(&entries);
        let o = self.options.unwrap_or(SessionOptions {
            resume: false,
            journal: true,
            fsync: false,
            verify: false,
            continue_on_error: false,
            heartbeat_ms: 0,
        });
        let (chunk, tx) = (info.chunk_size, self.tx.clone());
        let sparse = std::mem::take(&mut self.sparse);
        let meta = std::mem::take(&mut self.meta);
        self.env.disk.spawn(move || {
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

    /// The storage is made: a resume tells the source what is held, otherwise data
    /// may flow.
    fn prepared(&mut self, mut k: K, held: Held) {
        if self.options.as_ref().is_some_and(|o| o.resume) {
            let parts = held.to_have(&k.entries());
            self.prep = Some((k, held));
            self.m.resume(now(), parts);
            return;
        }
        match k.resume(&held) {
            Ok(()) => self.start(k),
            Err(e) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// The source's plan for a resume: what stays held, then data may flow.
    fn planned(&mut self, plan: &Plan) {
        let Some((mut k, mut held)) = self.prep.take() else {
            return;
        };
        let r = held
            .apply(plan)
            .map_err(|e| Error::protocol(&self.peer, format!("resume: {e}")))
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
            Ok(()) => self.start(k),
            Err(e) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// The sink is prepared: says `Go` (`OnDemand` for a request-driven sink, whose
    /// owner hears of it), and starts reading the streams that joined; then the parts
    /// of a growing manifest that came meanwhile.
    fn start(&mut self, k: K) {
        let info = self.m.info().expect("open before the manifest").clone();
        self.env.run.progress.held.store(k.held_bytes(), Relaxed);
        let k = Arc::new(k);
        let mut sink: Arc<dyn Sink> = k.clone();
        if let Some(d) = self.env.chunk_delay {
            sink = Arc::new(Slow::new(sink, d));
        }
        let tuned = info.features & features::TUNING != 0;
        let pool = Pool::new(
            (self.env.buffers)(crate::session::buffer_streams(info.streams, tuned)),
            info.chunk_size as usize,
        );
        let expected = chunk_set(sink.chunks());
        let n = k.layout_chunks();
        let timed = self.news.is_some() || tuned;
        for (i, s) in std::mem::take(&mut self.waiting) {
            let p = &self.env.run.progress;
            let t = spawn_sink_stream(i, s, sink.clone(), pool.clone(), &self.tx, p, timed);
            self.tasks.insert(i, t);
        }
        match &self.news {
            Some(d) => {
                self.m.ready_on_demand(now(), n);
                let features = self.m.info().map_or(0, |i| i.features);
                let _ = d.send(DemandEvent::Ready(k.clone(), features));
            }
            None => self.m.ready(now(), expected, n),
        }
        for part in std::mem::take(&mut self.grown) {
            grow_sink(&mut self.m, &*k, part);
        }
        self.live = Some((k, sink, pool));
    }

    /// Every chunk is written (or the owner closes a request-driven sink): the
    /// storage finishes on a disk thread.
    fn finish(&mut self) {
        let Some((_, sink, _)) = &self.live else {
            return;
        };
        let (sink, tx) = (sink.clone(), self.tx.clone());
        self.env.disk.spawn(move || {
            let _ = tx.send(SinkIn::Finished(sink.finish().map_err(Error::from)));
        });
    }

    /// The source's tuner changed its streams (feature TUNING).
    fn tuned(&mut self, t: Tuned) {
        tracing::info!("{} tuned the transfer: {}", self.peer, t.reason);
        self.windows.sending(t.streams);
        let p = &self.env.run.progress;
        let of = self.m.info().map_or(t.streams, |i| i.streams);
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

    async fn done(&mut self, report: SendReport) -> Result<SinkRun<K>> {
        self.ctl.flush(&mut self.m).await;
        let (Some(summary), Some((store, ..))) = (self.summary.take(), self.live.take()) else {
            return Err(Error::protocol(&self.peer, "session ended before its data"));
        };
        Ok(SinkRun {
            info: self.m.info().expect("open before the end").clone(),
            summary,
            report,
            stats: self.m.stats(),
            store,
        })
    }

    /// The earliest of the machine's and the tuners' timers.
    fn deadline(&self) -> Option<std::time::Instant> {
        [
            self.m.poll_timeout(),
            self.disk_tune.as_ref().and_then(DiskTune::poll_timeout),
            self.windows.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Waits for the next thing to happen.
    async fn wait(&mut self) -> SinkWake<K, J::Link> {
        let deadline = self.deadline();
        // A request-driven sink's owner, once the sink is prepared.
        let wants_ask = self.asks.is_some() && self.live.is_some() && !self.closing;
        let SinkDriver {
            env,
            cancelled,
            rx,
            asks,
            joins,
            ctl,
            ..
        } = self;
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !*cancelled => SinkWake::Cancelled,
            Some(input) = rx.recv() => SinkWake::Input(input),
            ask = next_ask(asks), if wants_ask => SinkWake::Ask(ask),
            (i, r) = joins.next() => SinkWake::Joined(i, r),
            msg = ctl.recv() => SinkWake::Control(msg),
            _ = sleep_until(deadline) => SinkWake::Timeout,
        }
    }

    /// Feeds in what happened.
    fn wake(&mut self, wake: SinkWake<K, J::Link>) {
        match wake {
            SinkWake::Cancelled => {
                self.cancelled = true;
                // Why the run was cancelled (an interrupt, a revoked credential) is
                // what the peer learns; without a reason, the session was aborted.
                let why = self.env.run.take_error().unwrap_or(Error::Aborted);
                self.m.fail(now(), Fault::cancelled(why));
            }
            SinkWake::Input(input) => self.input(input),
            SinkWake::Ask(Some(DemandAsk::Want(chunks))) => self.m.want(now(), &chunks),
            SinkWake::Ask(Some(DemandAsk::WantParts(parts))) => self.m.want_parts(now(), &parts),
            SinkWake::Ask(Some(DemandAsk::Close) | None) => {
                self.closing = true;
                self.finish();
            }
            SinkWake::Joined(i, r) => self.joined(i, r),
            SinkWake::Control(Ok(msg)) => self.m.handle_control(now(), msg),
            SinkWake::Control(Err(e)) => {
                self.ctl.open = false;
                self.m.control_closed(now(), Fault::new(Error::Net(e)));
            }
            SinkWake::Timeout => self.m.handle_timeout(now()),
        }
    }

    /// What a stream task or a disk thread reported.
    fn input(&mut self, input: SinkIn<K>) {
        match input {
            SinkIn::Arrived {
                stream,
                chunk,
                buf,
                digests,
                crc,
            } => {
                if self.m.arrived(now(), stream, chunk) == Arrival::Write {
                    self.write(move |sink| {
                        let result = sink.write_chunk(chunk, &buf, &digests, crc);
                        drop(buf);
                        SinkIn::Written {
                            chunk,
                            result: result.map_err(Error::from),
                        }
                    });
                }
            }
            SinkIn::Part {
                stream,
                chunk,
                offset,
                data,
                digests,
                crc,
            } => {
                let range = PartRange {
                    offset,
                    len: data.len() as u32,
                };
                if self.m.arrived_part(now(), stream, chunk, range) == Arrival::Write {
                    self.write(move |sink| {
                        let r = sink.write_part(chunk, offset, &data, &digests, crc);
                        SinkIn::PartWritten(r.map_err(Error::from))
                    });
                }
            }
            SinkIn::PartWritten(Ok(())) => self.m.part_written(now()),
            SinkIn::End { stream, sent } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.m.stream_end(now(), stream, sent);
            }
            SinkIn::Failed { stream, error } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.m.stream_failed(now(), stream, Fault::new(error));
            }
            SinkIn::Written {
                chunk,
                result: Ok(()),
            } => {
                if let Some((_, sink, _)) = &self.live {
                    self.env.run.progress.count_files(&sink.layout(), chunk);
                }
                self.m.chunk_written(now(), chunk);
                if let Some(n) = &self.news {
                    let _ = n.send(DemandEvent::Written(chunk));
                }
            }
            SinkIn::Prepared(Ok((k, held))) => self.prepared(k, held),
            SinkIn::Finished(Ok(s)) => {
                self.summary = Some(s);
                self.m.finished(s);
            }
            SinkIn::PartWritten(Err(e))
            | SinkIn::Written { result: Err(e), .. }
            | SinkIn::Prepared(Err(e))
            | SinkIn::Finished(Err(e)) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// Runs `write` on the storage on a disk thread, unless the session failed first.
    fn write(&self, write: impl FnOnce(&dyn Sink) -> SinkIn<K> + Send + 'static) {
        let Some((_, sink, _)) = &self.live else {
            return;
        };
        let (sink, stopped, tx) = (sink.clone(), self.stopped.clone(), self.tx.clone());
        self.env.disk.spawn(move || {
            if stopped.load(Relaxed) {
                return;
            }
            let _ = tx.send(write(&*sink));
        });
    }

    /// A data stream joined (or failed to): its task starts once the storage is.
    fn joined(&mut self, i: u16, r: Result<DataStream<J::Link>>) {
        let s = match r {
            Ok(s) => s,
            Err(e) => return self.m.stream_failed(now(), i, Fault::new(e)),
        };
        self.m.stream_joined(now(), i);
        self.windows.join(now(), i, s.io.probe().as_ref());
        match &self.live {
            Some((_, sink, pool)) => {
                let timed = self.news.is_some() || self.m.uses(features::TUNING);
                let p = &self.env.run.progress;
                let t = spawn_sink_stream(i, s, sink.clone(), pool.clone(), &self.tx, p, timed);
                self.tasks.insert(i, t);
            }
            None => self.waiting.push((i, s)),
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
    let mut segments = Vec::new();
    loop {
        // Checked against the layout before anything the header sizes is read; a
        // growing manifest's later part is laid out by the time its chunks come (the
        // source waits for `Grown`), so a chunk past the layout looks again first.
        let mut len = 0;
        let check = |h: &dmover_proto::data::FrameHeader, part: Option<u32>| {
            if h.chunk >= layout.n_chunks() {
                layout = sink.layout();
            }
            len = layout.check_frame(h, part, |k| sink.sparse_chunk(k))?;
            Ok(())
        };
        let head = match s.io.recv_frame(limits, check).await {
            Ok(Received::Chunk(head)) => head,
            Ok(Received::End { sent }) => return Ok(Some(sent)),
            Err(RecvError::Io(e)) => return Err(lost(e)),
            Err(RecvError::Malformed(e)) => return Err(Error::Net(NetError::proto(&peer, e))),
            Err(RecvError::Refused(what)) => return Err(Error::protocol(&peer, what)),
        };
        let (h, k) = (head.header, head.header.chunk);
        let arrived = match head.part {
            Some(offset) => {
                let mut data = vec![0u8; h.payload_len as usize];
                s.io.recv_into(&mut data).await.map_err(lost)?;
                progress.bytes.fetch_add(len, Relaxed);
                progress.stream_bytes.add(i, len);
                SinkIn::Part {
                    stream: i,
                    chunk: k,
                    offset,
                    data,
                    digests: head.digests,
                    crc: h.crc,
                }
            }
            None => {
                let mut buf = pool.get().await;
                layout.segments(k, &mut segments);
                for &(off, n) in &segments {
                    if h.zeros {
                        buf[off..off + n].fill(0);
                        continue;
                    }
                    // Sealed records are opened straight into the pool buffer.
                    s.io.recv_into(&mut buf[off..off + n]).await.map_err(lost)?;
                }
                // Bytes that crossed the stream (none for a zeros frame).
                let wire = if h.zeros {
                    progress.holes.fetch_add(len, Relaxed);
                    0
                } else {
                    len
                };
                progress.bytes.fetch_add(wire, Relaxed);
                progress.stream_bytes.add(i, wire);
                progress.chunks.fetch_add(1, Relaxed);
                SinkIn::Arrived {
                    stream: i,
                    chunk: k,
                    buf,
                    digests: head.digests,
                    crc: h.crc,
                }
            }
        };
        progress.data_flowing();
        let _ = tx.send(arrived);
        let Some(frames) = acks.recv().await else {
            return Ok(None);
        };
        s.io.send_ack(frames).await.map_err(lost)?;
    }
}

#[cfg(test)]
mod tests {
    //! Both role drivers against each other in one process: a control channel over an
    //! in-memory pipe, data streams over the in-memory transport (`memnet`: the
    //! dialer's production `Dialing` joins them through a real `JoinTable` with the
    //! real proofs, the acceptor's `Accepted` takes them as a server's does), memory
    //! storage, the dialer's handshake answered by [`accept`]. Everything but sockets
    //! and files is the code a real session runs.

    use super::*;

    use dmover_net::fault::{FaultPlan, Faulty};
    use dmover_proto::control::{Credential, DataProtection, DirectIo, Op, Welcome};
    use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT, Totals};
    use dmover_proto::session::{Dial, Limits};
    use dmover_store::mem::{MemSink, MemSource};

    const CHUNK: u32 = 64 << 10;
    /// The control connection's secret both sides derive the session key from.
    const MASTER: [u8; 32] = [7; 32];

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
        // The data streams: the production dialer's joins over in-memory pipes, through
        // the acceptor's join table, with the real proofs; `plan` cuts the sink's ends.
        let net = dmover_net::memnet::MemNet::new(Duration::from_secs(30), Duration::from_secs(5));
        let mode = dmover_net::join::LinkMode {
            protection: DataProtection::Authenticated,
            idle: Duration::from_secs(30),
        };
        let dial = net.dialer("sink", Duration::from_secs(5));
        let joins = crate::dialer::Dialing::new(
            dial,
            mode,
            dmover_net::join::JoinWait::Pipelined,
            MASTER,
            Default::default(),
            None,
        );
        let sending =
            async { self::source_growing(m, &mut dialer, joins, source, env(6), growth).await };
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
            let info = SessionInfo {
                id: 9,
                salt: [3; 32],
                streams: open.streams,
                chunk_size: open.chunk_size,
                features: dmover_proto::session::features::negotiate(
                    open.features,
                    dmover_proto::session::features::SUPPORTED,
                ),
            };
            let key = dmover_proto::auth::session_key(&MASTER, info.id, &info.salt);
            let rx = net
                .table()
                .open(info.id, key, open.protection, info.streams)
                .expect("a new session");
            m.grant(now(), info);
            let joins = Accepted::new(rx, move |io| Faulty::new(io, plan.clone()));
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
                digests: &mut Vec<DigestEntry>,
            ) -> dmover_store::Result<dmover_store::ChunkRead> {
                let honest = self.0.read_chunk(k, buf, digests)?;
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
