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

/// Why a cancelled run's session fails: the reason it was cancelled for (an
/// interrupt, a revoked credential), which the peer learns; without one, aborted.
fn cancellation(run: &Run) -> Fault {
    Fault::cancelled(run.take_error().unwrap_or(Error::Aborted))
}

/// The time limits of a session driven here, whose data streams time out after
/// `idle` without progress.
///
/// A sink gives its streams half as long again ([`Timing::idle`]) as a source does
/// ([`Timing::stall`]): at the end of a transfer every stream may wait on the chunks of
/// one silent stream, and then only the source knows which stream is at fault (it
/// lacks that stream's acknowledgements); with equal limits the sink would give up
/// every quiet stream at the moment the source gives up the silent one, and fail a
/// session that the other streams could finish (found by the pair schedules of
/// `harness/props.rs` on the paused clock).
pub fn timing(heartbeat: Duration, idle: Duration) -> Timing {
    Timing {
        handshake: crate::session::HANDSHAKE_TIMEOUT,
        heartbeat,
        silent_intervals: crate::session::SILENT_INTERVALS,
        stall: idle,
        stuck: dmover_proto::session::STUCK.min(idle),
        idle: Some(idle + idle / 2),
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

    /// The manifest entries of the files the sink already held whole.
    fn held_entries(&self) -> Vec<u32> {
        Vec::new()
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

    fn held_entries(&self) -> Vec<u32> {
        FileSource::held_entries(self).to_vec()
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
    /// (a sink) The session's charge on the server's manifest budget
    /// ([`crate::manifests`]): the manifest's memory is charged as it arrives, and a
    /// manifest that does not fit fails the session. `None`: no budget (a client).
    pub manifest_charge: Option<crate::manifests::Charge>,
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

mod sink;
mod source;
#[cfg(test)]
mod tests;

pub use sink::{Demand, DemandAsk, DemandEvent, GrownPart, Prepare, SinkRun, sink, sink_on_demand};
pub use source::{SourceRun, source, source_growing};
