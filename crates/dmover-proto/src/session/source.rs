//! The source role: announces the manifest, answers a resume, and sends the chunks
//! over the data streams until every one is acknowledged.
//!
//! # States
//! ```text
//! Opening ─(Session | grant)─▶ Announcing ─(Have*)─▶ Checking ─(planned)─▶ Announcing
//!                                  │ (Go)
//!                                  ▼
//!                               Sending ─(all acknowledged)─▶ Draining ─(drained)─▶ Reporting ─(Done)─▶ Finished
//!                               Sending ─(all written into streams: Sent, report)─▶ Sending ─(Done)─▶ Finished
//! any state ─(error, silence, all streams lost)─▶ Failed
//! ```
//! With a growing manifest ([`super::features::GROWING_MANIFEST`]) `Go` may come
//! after the first part ([`SourceSession::grow_manifest`]); `Sending` then goes on
//! taking parts, each part's chunks joining those to send when the sink's `Grown`
//! confirms it, and leads to `Draining` only once the last part is sent and
//! confirmed and everything is acknowledged. With [`super::features::RANGES`]:
//! ```text
//! Announcing ─(OnDemand)─▶ Sending (request-driven: only wanted chunks) ─(Done, all acknowledged)─▶ Draining ─▶ Reporting ─▶ Finished
//! Sending ─(Want)─▶ Sending (wanted chunks read first)
//! ```
//! [`SourceSession::poll_read`] yields chunks of lost streams first, then wanted ones
//! (in an ordinary session only those still to send; request-driven, every one, again
//! if it was sent before), then the ordinary order.
//!
//! In `Sending` the driver asks [`SourceSession::poll_read`] what to read whenever it
//! has a free buffer (chunks to send again first), reports each read with
//! [`SourceSession::chunk_read`], and gets [`SourceCommand::Send`] naming the stream for
//! it: a joined stream that is not writing, with the fewest unacknowledged chunks and
//! fewer than the window. A stream is lost when it fails, or when it has
//! unacknowledged chunks and no progress for [`super::Timing::stall`], or for
//! [`super::Timing::stuck`] while another stream brings acknowledgements; its
//! unacknowledged chunks are read again and sent on the others.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use super::chunks::Cursor;
use super::link::{Dial, Link, Setup};
use super::{
    Cause, ChunkMeta, ChunkSet, PartPlan, PartRange, SessionError, Side, State, StreamStats,
    Timing, features,
};
use crate::control::{
    Control, FailedFile, Growth, Have, ManifestEnd, ManifestPart, MetaPart, Plan, SendReport,
    SessionInfo, SessionLimits, SessionOptions, Summary, Want, WantParts,
};
use crate::data::decode_ack;
use crate::manifest::{Entry, EntryMeta, Totals};

/// Entries per [`Control::Sparse`] message (at most 5 bytes each: well under a frame).
const SPARSE_PART: usize = 100_000;

/// What the driver is to do for the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCommand {
    /// Dial data stream `stream` and join it to the session (dialer only).
    Open {
        /// The stream index.
        stream: u16,
    },
    /// Write chunk `chunk`, read earlier, on `stream` (then report
    /// [`SourceSession::chunk_written`]).
    Send {
        /// The stream.
        stream: u16,
        /// The chunk.
        chunk: u64,
        /// Its frame fields.
        meta: ChunkMeta,
    },
    /// Every chunk is acknowledged: write `END` with the chunks sent on `stream`,
    /// flush, and close it.
    End {
        /// The stream.
        stream: u16,
        /// Chunks sent on it.
        sent: u64,
    },
    /// The stream is lost: stop using it and close it (a chunk being written on it is
    /// dropped; it is read again for another stream).
    Close {
        /// The stream.
        stream: u16,
    },
}

/// A chunk for the driver to read from storage into a free buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadJob {
    /// The chunk.
    pub chunk: u64,
    /// For a chunk sent before on a stream that was lost: its frame fields, which the
    /// read checks the data against (a file that changed since is an error).
    pub again: Option<ChunkMeta>,
    /// (feature [`features::PARTS`]) Only these bytes of the chunk are sent, as a part
    /// frame: the read gives a [`ChunkMeta`] with this `part`.
    pub part: Option<PartRange>,
}

/// What the source's application learns.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceEvent<E> {
    /// (dialer) The acceptor opened the session; [`SourceCommand::Open`]s follow.
    Opened(SessionInfo),
    /// (acceptor) The dialer's session options.
    Options(SessionOptions),
    /// The sink holds data from an earlier attempt, listed in these parts: check it
    /// and answer with [`SourceSession::planned`].
    Held(Vec<Have>),
    /// The sink is prepared: reading may start ([`SourceSession::poll_read`]).
    Go,
    /// A stream was lost; its unacknowledged chunks go on the others.
    StreamLost {
        /// The stream.
        stream: u16,
        /// Why.
        error: SessionError<E>,
        /// Chunks it had not had acknowledged.
        resent: u64,
    },
    /// Every chunk is written into the data streams (none is left to read or send,
    /// unless a stream breaks): call [`SourceSession::report`] with the files that
    /// could not be read. Not in a request-driven session, nor with
    /// `continue_on_error` (a chunk read again could find a file unreadable after the
    /// report went): there the report waits for [`SourceEvent::Drained`].
    Sent,
    /// Every chunk is acknowledged: call [`SourceSession::drained`] with the files that
    /// could not be read (ignored when [`SourceEvent::Sent`] came and was answered).
    Drained,
    /// The sink has every file: the session is over.
    Done(Summary),
    /// (feature [`features::LIMITS`]) The peer's limits. An acceptor answers with
    /// its own ([`SourceSession::limits`]).
    Limits(SessionLimits),
    /// The session failed.
    Failed(SessionError<E>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Announcing,
    Checking,
    Sending,
    Draining,
    Reporting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// Not yet joined (an acceptor waits for it; a dialer is opening it).
    Pending,
    Live,
    /// `END` sent.
    Ended,
    Lost,
    /// It failed after the report went ([`SourceEvent::Sent`]): the sink may be done
    /// and closing its streams, with acknowledgements it had not flushed. Lost only if
    /// the sink's `Done` does not come within [`Timing::report_wait`].
    Held,
}

#[derive(Debug)]
struct Stream {
    join: Join,
    /// The chunk being written.
    writing: Option<u64>,
    /// Chunks given to the stream and not acknowledged, in order.
    unacked: VecDeque<(u64, ChunkMeta)>,
    /// Chunks given to the stream.
    sent: u64,
    /// Chunks it acknowledged.
    acked: u64,
    /// Last progress while chunks were unacknowledged.
    since: Instant,
    /// The session's acknowledged chunks at `since`: how far the others got since.
    mark: u64,
    /// When the writes of the unacknowledged chunks ended, as far as reported.
    written_at: VecDeque<Instant>,
}

/// Chunks each other stream must have had acknowledged, on average, while a stream
/// made no progress, before [`Timing::stuck`] may declare it lost: a healthy stream
/// that shares the link lags its peers by less.
const STUCK_CHUNKS: u64 = 4;

/// Most chunk ranges a sink may have waiting in its requests.
const MAX_WANTED: usize = 1 << 20;

/// The source role of a session (see the module docs).
#[derive(Debug)]
pub struct SourceSession<E> {
    link: Link<E>,
    phase: Phase,
    info: Option<SessionInfo>,
    streams: Vec<Stream>,
    /// Chunks to send (set by the driver with the manifest, or after a resume plan,
    /// and grown by the parts of a growing manifest the sink confirmed).
    chunks: ChunkSet,
    fresh: Cursor,
    /// The manifest, or the first part of a growing one, is ended: `Go` may come.
    manifest_ended: bool,
    /// The manifest is complete.
    manifest_done: bool,
    /// The manifest grows (its parts end with `Grow`).
    growing: bool,
    /// The layout's chunks, as far as announced.
    layout_chunks: Option<u64>,
    /// Growing: the layout's chunks the sink is prepared for (`Go`, then `Grown`).
    confirmed: u64,
    /// Growing: chunks of later parts the sink confirmed (kept across a resume plan).
    grown: ChunkSet,
    /// Chunks the sink wants, in its order, ahead of `fresh`.
    wanted: VecDeque<Range<u64>>,
    /// (feature `PARTS`) Parts of chunks the sink wants, in its order, ahead of
    /// `wanted`.
    parts: VecDeque<(u64, PartRange)>,
    /// Chunks of `chunks` read ahead of `fresh` because they were wanted.
    jumped: BTreeSet<u64>,
    /// Chunk sends besides `chunks` (request-driven: every wanted chunk).
    extra: u64,
    /// The session is request-driven (`OnDemand`).
    on_demand: bool,
    /// Request-driven: the sink closed it (`Done`).
    closed: bool,
    /// Chunks of lost streams, to read again.
    again: VecDeque<(u64, ChunkMeta)>,
    /// Chunks (or parts) being read.
    reading: Vec<(u64, Option<PartRange>)>,
    /// Chunks read, waiting for a stream.
    ready: VecDeque<(u64, ChunkMeta)>,
    acked: u64,
    /// (feature `CONTINUOUS`) Every chunk below this is written at the sink.
    stored_below: u64,
    /// Parts of the manifest the sink is prepared for: the first at `Go`, each later
    /// one at its `Grown`.
    parts_confirmed: u64,
    window: usize,
    /// Live streams that get chunks (the first ones by index): all, unless tuned.
    active: usize,
    /// The shortest time from a chunk's write to its acknowledgement.
    ack_rtt: Option<Duration>,
    held: Vec<Have>,
    plan_sent: bool,
    stats: StreamStats,
    commands: VecDeque<SourceCommand>,
    events: VecDeque<SourceEvent<E>>,
    done: Option<Summary>,
    reported: bool,
    /// [`SourceEvent::Sent`] was told.
    sent_told: bool,
    /// The dialer's options ask the source to skip unreadable files and go on.
    continue_on_error: bool,
    /// Streams that failed after the report ([`Join::Held`]), with why, and when they
    /// count as lost unless `Done` came.
    held_losses: Vec<(u16, SessionError<E>)>,
    held_until: Option<Instant>,
    /// (feature `METADATA`) Entries' owners and xattrs, sent after `ManifestEnd`
    /// once the session is known to use the feature.
    meta: Vec<EntryMeta>,
    /// `ManifestEnd` is queued and its metadata not yet sent (or dropped).
    meta_due: bool,
    /// Early data: sending begins without `Go` (a dialer's session, assumed open
    /// from the start: [`SourceSession::dial_early`]; an acceptor's, of a pull with
    /// [`features::EARLY`]); `Some(true)` once the sink's `Go` came.
    early: Option<bool>,
    /// Early data: what the session proper sent before the sink's `Go` (tuning
    /// decisions, the report of an empty transfer), told after it.
    early_held: Vec<Control>,
}

impl<E: Cause + Clone> SourceSession<E> {
    fn new(peer: String, side: Side, timing: Timing) -> Self {
        SourceSession {
            link: Link::new(peer, side, timing),
            phase: Phase::Opening,
            info: None,
            streams: Vec::new(),
            chunks: ChunkSet::new(),
            fresh: Cursor::default(),
            manifest_ended: false,
            manifest_done: false,
            growing: false,
            layout_chunks: None,
            confirmed: 0,
            grown: ChunkSet::new(),
            wanted: VecDeque::new(),
            parts: VecDeque::new(),
            jumped: BTreeSet::new(),
            extra: 0,
            on_demand: false,
            closed: false,
            again: VecDeque::new(),
            reading: Vec::new(),
            ready: VecDeque::new(),
            acked: 0,
            stored_below: 0,
            parts_confirmed: 0,
            window: usize::MAX,
            active: usize::MAX,
            ack_rtt: None,
            held: Vec::new(),
            plan_sent: false,
            stats: StreamStats::default(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            done: None,
            reported: false,
            sent_told: false,
            continue_on_error: false,
            held_losses: Vec::new(),
            held_until: None,
            meta: Vec::new(),
            meta_due: false,
            early: None,
            early_held: Vec::new(),
        }
    }

    /// A dialer that is the source (a push): its first flight goes out at once, and
    /// the manifest may follow right behind it ([`SourceSession::push_manifest`]).
    pub fn dial(now: Instant, peer: impl Into<String>, timing: Timing, d: Dial) -> Self {
        let mut s = Self::new(peer.into(), Side::Dialer, timing);
        s.continue_on_error = d.options.continue_on_error;
        s.link.dial(now, d);
        s
    }

    /// A dialer that is the source of a fresh push (no resume) sending early data
    /// (protocol version 8): the session is taken as open at once, as
    /// [`Dial::assumed`] describes it with `id` and `salt` (which the dialer derived
    /// from the control connection: [`crate::auth::session_id`]), its data streams are
    /// opened now, and chunks go out as soon as the manifest (or a growing one's first
    /// part) is ended, without waiting for `Session` and `Go`. The acceptor's `Session`
    /// must then be exactly that one (else the session fails); its `Go` changes
    /// nothing but release the tuning decisions ([`SourceSession::tuned`]) and the
    /// report of a transfer with nothing to send, which wait for it: a sink takes no
    /// message of the session proper before it said `Go`. The sink reads the data
    /// streams only once it said `Go`, so the chunks wait in the connections
    /// meanwhile.
    pub fn dial_early(
        now: Instant,
        peer: impl Into<String>,
        timing: Timing,
        d: Dial,
        id: u64,
        salt: [u8; 32],
    ) -> Self {
        let info = d.assumed(id, salt);
        let mut s = Self::dial(now, peer, timing, d);
        s.early = Some(false);
        s.open(now, info.clone());
        for i in 0..info.streams {
            s.commands.push_back(SourceCommand::Open { stream: i });
        }
        s.events.push_back(SourceEvent::Opened(info));
        s
    }

    /// Sends a message of the session proper; with early data, only once the sink said
    /// `Go` (before it, a sink takes none).
    fn send_after_go(&mut self, msg: Control) {
        if self.early == Some(false) {
            self.early_held.push(msg);
        } else {
            self.link.send(msg);
        }
    }

    /// Early data: once the manifest (or its first part) is ended, sending starts as
    /// it would at `Go` (a dialer's at once; an acceptor's, of a pull with
    /// [`features::EARLY`], once the dialer's options said it does not resume).
    fn early_go(&mut self) {
        if self.early.is_some()
            && self.manifest_ended
            && self.phase == Phase::Announcing
            && self.link.live()
        {
            self.go(false);
        }
    }

    /// `Go` (or `OnDemand`, `on_demand`): sending starts. (An acceptor awaits the
    /// joins from then: the caller starts that clock first.)
    fn go(&mut self, on_demand: bool) {
        if on_demand {
            // Only what the sink asks for is sent.
            self.on_demand = true;
            self.set_chunks(ChunkSet::new());
        }
        self.phase = Phase::Sending;
        self.parts_confirmed = 1;
        // Streams that joined before `Go` count (else a session of over the join
        // limit failed with all of them joined).
        self.check_joins_complete();
        self.events.push_back(SourceEvent::Go);
        self.check_drained();
    }

    /// An acceptor that is the source (a pull): [`SourceSession::grant`] opens the
    /// session. `setup_deadline` bounds everything up to the dialer's options.
    pub fn accept(
        _now: Instant,
        peer: impl Into<String>,
        timing: Timing,
        setup_deadline: Instant,
    ) -> Self {
        let mut s = Self::new(peer.into(), Side::Acceptor, timing);
        s.link.set_up_by(setup_deadline);
        s
    }

    /// (acceptor) Opens the session the dialer asked for.
    pub fn grant(&mut self, now: Instant, info: SessionInfo) {
        if self.link.side != Side::Acceptor || self.info.is_some() || !self.link.live() {
            return;
        }
        self.link.send(Control::Session(info.clone()));
        self.open(now, info);
        self.link.expect(now, "session options");
    }

    fn open(&mut self, now: Instant, info: SessionInfo) {
        self.streams = (0..info.streams)
            .map(|_| Stream {
                join: Join::Pending,
                writing: None,
                unacked: VecDeque::new(),
                sent: 0,
                acked: 0,
                since: now,
                mark: 0,
                written_at: VecDeque::new(),
            })
            .collect();
        self.info = Some(info);
        self.phase = Phase::Announcing;
        self.flush_meta();
    }

    /// (feature [`features::METADATA`]) Queues the manifest's metadata (owners,
    /// xattrs), before [`SourceSession::end_manifest`]. It goes out after
    /// `ManifestEnd` once the session is known to use the feature (a dialer's at once,
    /// in its first flight: [`features::BASE`]), and is dropped otherwise; a source
    /// that queues none sends an empty last part.
    pub fn push_meta(&mut self, meta: Vec<EntryMeta>) {
        self.meta.extend(meta);
    }

    /// (feature [`features::METADATA`], growing manifest) Owners and extended
    /// attributes of entries of the part about to end (or of earlier parts not told
    /// yet), sent before its `Grow` ([`SourceSession::grow_manifest`]): the sink
    /// applies them as it binds the part. Dropped in a session without the features
    /// or after the last part. Before the first part's `Grow` only a sink that offered
    /// [`features::STREAMED`] takes them.
    pub fn grow_meta(&mut self, meta: Vec<EntryMeta>) {
        if meta.is_empty()
            || !self.uses(features::GROWING_MANIFEST)
            || (!self.growing && !self.uses(features::STREAMED))
            || self.manifest_done
            || !self.uses(features::METADATA)
            || !self.link.live()
        {
            return;
        }
        for r in crate::manifest::meta_parts(&meta) {
            self.link.send(Control::Meta(MetaPart {
                entries: meta[r].to_vec(),
                last: false,
            }));
        }
    }

    /// Sends the queued metadata (or drops it) once both the session's features and
    /// the manifest's end are known.
    fn flush_meta(&mut self) {
        if !self.meta_due || self.features().is_none() {
            return;
        }
        self.meta_due = false;
        let meta = std::mem::take(&mut self.meta);
        if !self.uses(features::METADATA) {
            return;
        }
        let parts = crate::manifest::meta_parts(&meta);
        let n = parts.len();
        for (i, r) in parts.into_iter().enumerate() {
            self.link.send(Control::Meta(MetaPart {
                entries: meta[r].to_vec(),
                last: i + 1 == n,
            }));
        }
        if n == 0 {
            self.link.send(Control::Meta(MetaPart {
                entries: Vec::new(),
                last: true,
            }));
        }
    }

    /// The session, once open.
    pub fn info(&self) -> Option<&SessionInfo> {
        self.info.as_ref()
    }

    /// Which side of the control connection this machine is on.
    pub fn side(&self) -> Side {
        self.link.side
    }

    /// (acceptor, feature [`features::LIMITS`]) Answers the dialer's limits
    /// ([`SourceEvent::Limits`]) with this side's; once, and only in a session that uses
    /// the feature. (A dialer's own go in its [`Dial`].)
    pub fn limits(&mut self, l: SessionLimits) {
        self.link.answer_limits(self.info.as_ref(), l);
    }

    /// Where the session stands.
    pub fn state(&self) -> State {
        self.link.state
    }

    /// What the streams went through.
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// Caps the unacknowledged chunks per stream (default: no cap but the buffers).
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
    }

    /// Sends chunks on the first `streams` live streams only (at least one): the
    /// others finish what they carry and then idle. Only in a session that uses
    /// [`features::TUNING`], where the sink does not take an idle stream for a lost
    /// one (elsewhere this does nothing).
    pub fn set_active(&mut self, now: Instant, streams: u16) {
        if self.uses(features::TUNING) {
            self.active = usize::from(streams.max(1));
            self.assign(now);
        }
    }

    /// Live streams that get chunks.
    pub fn active(&self) -> u16 {
        let live = self.streams.iter().filter(|s| s.join == Join::Live).count();
        live.min(self.active) as u16
    }

    /// Whether chunks wait to be read or sent (a tuner measures only then: at the
    /// tail, or while a growing manifest waits for its next part, the rate says
    /// nothing of the settings).
    pub fn has_work(&self) -> bool {
        self.phase == Phase::Sending
            && (!self.again.is_empty()
                || !self.ready.is_empty()
                || !self.wanted.is_empty()
                || self.fresh.clone().next(&self.chunks).is_some())
    }

    /// Whether the session's features are known: an acceptor's once it granted
    /// them, a dialer's once `Session` came, so that [`SourceSession::uses`] answers for
    /// negotiated features too (before it, a dialer knows only the base ones it
    /// offered).
    pub fn negotiated(&self) -> bool {
        match self.link.side {
            Side::Dialer => self.link.opened(),
            Side::Acceptor => self.info.is_some(),
        }
    }

    /// Whether the session uses `bit` (see [`features`]). A dialer knows it from
    /// the start for the bits of [`features::BASE`] it offered.
    pub fn uses(&self, bit: u64) -> bool {
        self.features().is_some_and(|f| f & bit != 0)
    }

    /// The features the session uses, as far as known: `Session`'s, or before it a
    /// dialer's offered base features.
    pub fn features(&self) -> Option<u64> {
        self.info
            .as_ref()
            .map(|i| i.features)
            .or_else(|| self.link.offered())
    }

    /// (feature [`features::GROWING_MANIFEST`]) Whether the producer's next part may
    /// be taken now, `given` parts having gone before it: once the session's features
    /// are known (a dialer's first part ends its first flight: [`features::BASE`]); a
    /// later part once the session is negotiated (its `Session` says whether later
    /// parts may hold hard links and holes, [`features::WALKING`]); and a streamed
    /// manifest's parts ([`features::STREAMED`]) at most one ahead of the sink's
    /// confirmations (a part written while the control connection is still in slow
    /// start waits in its send buffer, and would hold the driver, and the data, until
    /// it drained).
    pub fn ready_for_part(&self, given: u64) -> bool {
        self.features().is_some()
            && (given == 0 || self.negotiated())
            && (!self.uses(features::STREAMED) || self.parts_confirmed + 1 >= given)
    }

    /// (feature [`features::GROWING_MANIFEST`]) How the producer's next part goes,
    /// `given` parts having gone before it: `sent`, its entries went already (the
    /// first part of a push's streamed manifest, in the first flight); `links_or_holes`,
    /// it holds hard links or files with holes.
    pub fn plan_part(&self, given: u64, sent: bool, links_or_holes: bool) -> PartPlan {
        if sent && given == 0 && !self.uses(features::STREAMED) {
            PartPlan::RestWhole
        } else if given > 0 && links_or_holes && !self.uses(features::WALKING) {
            PartPlan::Refuse
        } else {
            PartPlan::Grow
        }
    }

    /// (feature [`features::TUNING`]) Tells the sink of a tuning decision.
    pub fn tuned(&mut self, t: crate::control::Tuned) {
        if self.uses(features::TUNING) && self.phase == Phase::Sending {
            self.send_after_go(Control::Tuned(t));
        }
    }

    /// The shortest time from the end of a chunk's write to its acknowledgement seen so
    /// far: the round trip, plus what waited in the socket before it.
    pub fn ack_rtt(&self) -> Option<Duration> {
        self.ack_rtt
    }

    /// Queues manifest entries, in parts of about a megabyte.
    pub fn push_manifest(&mut self, entries: &[Entry]) {
        for r in crate::manifest::parts(entries) {
            self.link.send(Control::Manifest(ManifestPart {
                entries: entries[r].to_vec(),
            }));
        }
    }

    /// (feature [`features::LINKS`]) Lists the files of the manifest that may have
    /// holes (entry indices of regular files, ascending), after
    /// [`SourceSession::push_manifest`] and before [`SourceSession::end_manifest`];
    /// of a growing manifest (feature [`features::WALKING`]), those of the part about
    /// to end, before its [`SourceSession::grow_manifest`].
    /// Nothing is sent for an empty list, nor in a session without the feature (a
    /// dialer's, in its first flight, when it offered it), nor for a later part of a
    /// growing manifest without `WALKING`.
    pub fn sparse_files(&mut self, entries: &[u32]) {
        if entries.is_empty()
            || !self.uses(features::LINKS)
            || self.manifest_done
            || (self.growing && !self.uses(features::WALKING))
        {
            return;
        }
        for part in entries.chunks(SPARSE_PART) {
            self.link.send(Control::Sparse(crate::control::SparseFiles {
                entries: part.to_vec(),
            }));
        }
    }

    /// (feature [`features::PART_CHUNKS`]) Names the chunk size of the later part of a
    /// growing manifest about to end, before its [`SourceSession::grow_manifest`]:
    /// the part was laid out in chunks of `chunk` bytes (at most the session's). The
    /// session's size needs no message; another one, before `Session` (a dialer's
    /// later parts wait for it), in a session without the feature or for the first
    /// part, fails the session.
    pub fn part_chunk(&mut self, now: Instant, chunk: u32) {
        let session = self.info.as_ref().map_or(0, |i| i.chunk_size);
        if chunk == session || !self.link.live() {
            return;
        }
        let what = if self.info.is_none() {
            Some("a part's chunk size before the session is open")
        } else if !self.uses(features::PART_CHUNKS) {
            Some("chunks of another size for a part in a session without the feature")
        } else if !self.growing || self.manifest_done {
            Some("chunks of another size for a part that is not a later one")
        } else if chunk > session || crate::layout::validate_chunk_size(chunk).is_err() {
            Some("a part's chunk size that is not a valid one no larger than the session's")
        } else {
            None
        };
        if let Some(what) = what {
            let e = SessionError::Protocol {
                peer: "this side".into(),
                what: format!("{what} ({chunk} bytes; the session's: {session})"),
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        self.link.send(Control::PartChunk(chunk));
    }

    /// Ends the manifest with its totals; `chunks` are the chunks to send unless the
    /// sink holds some ([`SourceEvent::Held`]).
    pub fn end_manifest(&mut self, totals: Totals, chunks: ChunkSet) {
        self.link.send(Control::ManifestEnd(ManifestEnd { totals }));
        self.manifest_ended = true;
        self.manifest_done = true;
        self.meta_due = true;
        self.flush_meta();
        self.set_chunks(chunks);
        self.early_go();
    }

    /// The layout's number of chunks, against which the sink's requests
    /// ([`Control::Want`]) are checked (without it: the chunks to send).
    pub fn set_layout_chunks(&mut self, chunks: u64) {
        self.layout_chunks = Some(chunks);
    }

    /// (feature [`features::GROWING_MANIFEST`]) Ends a part of a growing manifest: the
    /// entries queued with [`SourceSession::push_manifest`] since the previous part,
    /// `totals` over every part, the layout now `chunks` long (each part's files start
    /// on a fresh chunk, so its chunks are `previous..chunks`); `last`: the manifest is
    /// complete. The first part stands for [`SourceSession::end_manifest`] (its chunks
    /// are to send unless the sink holds some, and the sink answers it with `Go`);
    /// a later part's chunks are sent once the sink confirms it is prepared for them.
    /// The session must use the feature (a dialer that offered it knows it does from
    /// the start: [`features::BASE`]); otherwise the session fails.
    pub fn grow_manifest(&mut self, now: Instant, totals: Totals, chunks: u64, last: bool) {
        if !self.link.live() || self.manifest_done {
            return;
        }
        let uses = self.uses(features::GROWING_MANIFEST);
        let prev = if self.growing {
            self.layout_chunks.unwrap_or(0)
        } else {
            0
        };
        let what = if !uses {
            Some("a growing manifest in a session without the feature".to_string())
        } else if chunks < prev {
            Some(format!("the layout shrinks from {prev} to {chunks} chunks"))
        } else {
            None
        };
        if let Some(what) = what {
            let e = SessionError::Protocol {
                peer: "this side".into(),
                what,
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        self.link.send(Control::Grow(Growth {
            totals,
            chunks,
            last,
        }));
        if !self.growing {
            self.set_chunks(ChunkSet::all(chunks));
            self.confirmed = chunks;
        }
        self.growing = true;
        self.manifest_ended = true;
        self.manifest_done = last;
        self.layout_chunks = Some(chunks);
        self.check_drained();
        self.early_go();
    }

    /// Whether the manifest is complete: ended whole, or its last part grown. Until
    /// then the bytes still to send are not known (a growing manifest, such as the
    /// memory test's or `sync --watch`'s, may never complete).
    pub fn manifest_complete(&self) -> bool {
        self.manifest_done
    }

    /// Whether the sink made the session request-driven ([`Control::OnDemand`]).
    pub fn on_demand(&self) -> bool {
        self.on_demand
    }

    /// Chunk sends the session owes the sink.
    fn owed(&self) -> u64 {
        self.chunks.len() + self.extra
    }

    /// Whether the session still needs a stream: chunks unacknowledged, or more to
    /// come (a growing manifest, an open request-driven session).
    fn owes_more(&self) -> bool {
        self.acked < self.owed()
            || self.growing && !(self.manifest_done && self.confirmed >= self.layout_end())
            || self.on_demand && !self.closed
    }

    fn layout_end(&self) -> u64 {
        self.layout_chunks.unwrap_or(0)
    }
    fn set_chunks(&mut self, chunks: ChunkSet) {
        self.chunks = chunks;
        self.fresh = Cursor::default();
    }

    /// The answer to [`SourceEvent::Held`]: the plan to send and the chunks still to
    /// send.
    pub fn planned(&mut self, now: Instant, plan: Plan, chunks: ChunkSet) {
        if self.phase != Phase::Checking || !self.link.live() {
            return;
        }
        self.link.send(Control::Plan(plan));
        self.plan_sent = true;
        self.set_chunks(chunks);
        // The plan covers the first part of a growing manifest; later parts are new.
        for r in self.grown.ranges().to_vec() {
            self.chunks.insert_range(r);
        }
        self.phase = Phase::Announcing;
        self.link.expect(now, "Go");
    }

    /// A control message from the peer.
    pub fn handle_control(&mut self, now: Instant, msg: Control) {
        let Some(msg) = self.link.screen(now, msg) else {
            return self.flush_failure();
        };
        if matches!(msg, Control::Ping) && self.link.heartbeat_running() {
            return;
        }
        let r = self.on_control(now, msg);
        if let Err(e) = r {
            self.link.fail(now, e);
        }
        self.flush_failure();
    }

    fn on_control(&mut self, now: Instant, msg: Control) -> Result<(), SessionError<E>> {
        let msg = match self.link.setup(now, msg, true, self.info.is_some())? {
            Setup::Taken => return Ok(()),
            Setup::Opened(info) if self.early.is_some() => {
                // Early data: the session was taken as open; this must be that one.
                // Its features the link checked (every base bit offered, nothing not
                // offered): it may grant negotiated bits offered too (a push's live
                // walk offers `WALKING`), which the session now uses.
                return match self.info.as_mut() {
                    Some(assumed)
                        if SessionInfo {
                            features: assumed.features,
                            ..info.clone()
                        } == *assumed =>
                    {
                        assumed.features = info.features;
                        Ok(())
                    }
                    assumed => Err(SessionError::Protocol {
                        peer: self.link.peer.clone(),
                        what: format!(
                            "Session {info:?} differs from the one early data assumed ({assumed:?})"
                        ),
                    }),
                };
            }
            Setup::Opened(info) => {
                self.open(now, info.clone());
                for i in 0..info.streams {
                    self.commands.push_back(SourceCommand::Open { stream: i });
                }
                self.events.push_back(SourceEvent::Opened(info));
                return Ok(());
            }
            Setup::Options(o) => {
                let resume = o.resume;
                self.continue_on_error = o.continue_on_error;
                self.events.push_back(SourceEvent::Options(o));
                if self.uses(features::EARLY) && !resume {
                    // (acceptor, a pull) Early data: the sink's streams are joining
                    // and it will say `Go`; sending starts at the manifest's end.
                    self.early = Some(false);
                    self.link.await_joins(now);
                    self.early_go();
                }
                return Ok(());
            }
            Setup::Session(msg) => msg,
        };
        let peer = self.link.peer.clone();
        super::check_feature(&peer, self.info.as_ref(), &msg)?;
        if let Control::Limits(l) = msg {
            self.link.on_limits(&l)?;
            self.events.push_back(SourceEvent::Limits(l));
            return Ok(());
        }
        match (self.phase, msg) {
            (Phase::Announcing, Control::Have(h)) if !self.plan_sent => {
                let last = h.last;
                self.held.push(h);
                if last {
                    self.phase = Phase::Checking;
                    self.events
                        .push_back(SourceEvent::Held(std::mem::take(&mut self.held)));
                }
                Ok(())
            }
            (Phase::Announcing, msg @ (Control::Go | Control::OnDemand))
                if self.manifest_ended && self.early.is_none() =>
            {
                self.link.await_joins(now);
                self.go(msg == Control::OnDemand);
                Ok(())
            }
            // Early data: sending began without it; what waited for it goes now.
            (_, Control::Go) if self.early == Some(false) && self.manifest_ended => {
                self.early = Some(true);
                for msg in std::mem::take(&mut self.early_held) {
                    self.link.send(msg);
                }
                Ok(())
            }
            // `Done` may overtake the last acknowledgements (they travel on the data
            // streams): the session ends once those are in too.
            (Phase::Reporting | Phase::Draining | Phase::Sending, Control::Done(s))
                if self.done.is_none() =>
            {
                self.done = Some(s);
                if self.on_demand {
                    // The sink closed the session: what it wanted and was not read yet
                    // is dropped, what is read goes out and is acknowledged.
                    self.closed = true;
                    self.wanted.clear();
                    self.parts.clear();
                    self.check_drained();
                }
                self.check_finished();
                Ok(())
            }
            (Phase::Sending, Control::Want(w)) if !self.closed => self.on_want(w),
            (Phase::Sending, Control::WantPart(w)) if !self.closed => self.on_want_part(w),
            // A request that crossed the last acknowledgements: everything is here.
            (Phase::Draining | Phase::Reporting, Control::Want(_)) if !self.on_demand => Ok(()),
            (_, Control::Stored(n))
                if self.growing && n >= self.stored_below && n <= self.confirmed =>
            {
                self.stored_below = n;
                Ok(())
            }
            (_, Control::Grown(n))
                if self.growing && n >= self.confirmed && n <= self.layout_end() =>
            {
                let r = self.confirmed..n;
                self.confirmed = n;
                self.parts_confirmed += 1;
                self.grown.insert_range(r.clone());
                if !self.on_demand {
                    self.chunks.insert_range(r);
                }
                self.check_drained();
                Ok(())
            }
            (_, other) => {
                let wanted = match self.phase {
                    Phase::Announcing if self.held.is_empty() => "Go",
                    Phase::Announcing | Phase::Checking => "Have",
                    _ => "Done",
                };
                Err(super::unexpected(&peer, &other, wanted))
            }
        }
    }

    /// The chunks a request may name: those the sink is prepared for.
    fn want_limit(&self) -> u64 {
        if self.growing {
            self.confirmed
        } else {
            self.layout_chunks.unwrap_or_else(|| self.chunks.end())
        }
    }

    fn on_want(&mut self, w: Want) -> Result<(), SessionError<E>> {
        let limit = self.want_limit();
        for r in w.chunks {
            if r.start >= r.end {
                continue;
            }
            if r.end > limit {
                return Err(SessionError::Protocol {
                    peer: self.link.peer.clone(),
                    what: format!("Want of chunks {r:?} beyond the layout's {limit}"),
                });
            }
            if self.wanted.len() >= MAX_WANTED {
                return Err(SessionError::Limit(format!(
                    "more than {MAX_WANTED} chunk ranges wanted at once"
                )));
            }
            self.wanted.push_back(r);
        }
        Ok(())
    }

    fn on_want_part(&mut self, w: WantParts) -> Result<(), SessionError<E>> {
        let chunk_size = self.info.as_ref().map_or(0, |i| u64::from(i.chunk_size));
        let limit = self.want_limit();
        for p in w.parts {
            let what = if !self.on_demand {
                Some("WantPart outside a request-driven session".to_string())
            } else if p.chunk >= limit {
                Some(format!(
                    "WantPart of chunk {} beyond the layout's {limit}",
                    p.chunk
                ))
            } else if p.len == 0 || u64::from(p.offset) + u64::from(p.len) > chunk_size {
                Some(format!(
                    "WantPart of {} bytes at {} of chunk {}, whose size is {chunk_size}",
                    p.len, p.offset, p.chunk
                ))
            } else {
                None
            };
            if let Some(what) = what {
                return Err(SessionError::Protocol {
                    peer: self.link.peer.clone(),
                    what,
                });
            }
            if self.parts.len() >= MAX_WANTED {
                return Err(SessionError::Limit(format!(
                    "more than {MAX_WANTED} parts wanted at once"
                )));
            }
            let r = PartRange {
                offset: p.offset,
                len: p.len,
            };
            self.parts.push_back((p.chunk, r));
        }
        Ok(())
    }

    /// The next wanted chunk to read: request-driven, each one named; else those still
    /// to send and not read yet.
    fn next_wanted(&mut self) -> Option<u64> {
        while let Some(r) = self.wanted.front_mut() {
            if r.start >= r.end {
                self.wanted.pop_front();
                continue;
            }
            if self.on_demand {
                let k = r.start;
                r.start += 1;
                self.extra += 1;
                return Some(k);
            }
            let from = r.start.max(self.fresh.position());
            match self.chunks.next_from(from) {
                Some(k) if k < r.end => {
                    r.start = k + 1;
                    if self.jumped.insert(k) {
                        return Some(k);
                    }
                }
                _ => {
                    self.wanted.pop_front();
                }
            }
        }
        None
    }

    /// Data stream `stream` joined the session (an acceptor's driver accepted its join,
    /// or a dialer's join was answered).
    pub fn stream_joined(&mut self, now: Instant, stream: u16) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if s.join == Join::Pending && self.link.live() {
            s.join = Join::Live;
            s.since = now;
            s.mark = self.acked;
            self.assign(now);
            self.check_joins_complete();
        }
    }

    fn check_joins_complete(&mut self) {
        if self.streams.iter().all(|s| s.join != Join::Pending) {
            self.link.joins_done();
        }
    }

    /// A data stream failed (its join, a write, the connection).
    pub fn stream_failed(&mut self, now: Instant, stream: u16, error: E) {
        let Some(s) = self.streams.get(stream as usize) else {
            return;
        };
        if matches!(s.join, Join::Lost | Join::Ended | Join::Held) || !self.link.live() {
            return;
        }
        if self.phase == Phase::Draining || self.phase == Phase::Reporting {
            // Everything is acknowledged: nothing on it can matter any more.
            self.streams[stream as usize].join = Join::Lost;
            return;
        }
        if self.reported && self.sent_told && s.join == Join::Live && !error.ends_session() {
            // Every chunk is sent and the report went: the sink may be done, closing
            // its streams before its `Done` (on the control connection) arrives here.
            self.streams[stream as usize].join = Join::Held;
            self.held_losses
                .push((stream, SessionError::Stream { stream, error }));
            self.held_until
                .get_or_insert(now + self.link.timing.report_wait);
            return;
        }
        // A dialer's stream that fails to join fails the session, as at the sink.
        if error.ends_session() || s.join == Join::Pending && self.link.side == Side::Dialer {
            self.link.fail(now, SessionError::Stream { stream, error });
            return self.flush_failure();
        }
        self.lose(now, stream, SessionError::Stream { stream, error });
    }

    fn lose(&mut self, now: Instant, stream: u16, error: SessionError<E>) {
        let s = &mut self.streams[stream as usize];
        s.join = Join::Lost;
        s.writing = None;
        s.written_at.clear();
        let unacked = std::mem::take(&mut s.unacked);
        let n = unacked.len() as u64;
        // Chunks of the lost stream go before anything else.
        for c in unacked.into_iter().rev() {
            self.again.push_front(c);
        }
        self.stats.streams_lost += 1;
        self.stats.chunks_resent += n;
        self.commands.push_back(SourceCommand::Close { stream });
        let live = self
            .streams
            .iter()
            .filter(|s| matches!(s.join, Join::Live | Join::Pending))
            .count();
        if live == 0 && self.owes_more() {
            self.link.fail(now, error);
            return self.flush_failure();
        }
        self.events.push_back(SourceEvent::StreamLost {
            stream,
            error,
            resent: n,
        });
        self.assign(now);
    }

    /// The next chunk to read into a free buffer, if any.
    pub fn poll_read(&mut self) -> Option<ReadJob> {
        if self.phase != Phase::Sending || !self.link.live() {
            return None;
        }
        let job = if let Some((chunk, meta)) = self.again.pop_front() {
            ReadJob {
                chunk,
                part: meta.part,
                again: Some(meta),
            }
        } else if let Some((chunk, part)) = self.parts.pop_front() {
            // A part answers a read that waits for it: ahead of whole chunks.
            self.extra += 1;
            ReadJob {
                chunk,
                again: None,
                part: Some(part),
            }
        } else if let Some(chunk) = self.next_wanted() {
            ReadJob {
                chunk,
                again: None,
                part: None,
            }
        } else {
            let chunk = loop {
                let k = self.fresh.next(&self.chunks)?;
                if !self.jumped.remove(&k) {
                    break k;
                }
            };
            ReadJob {
                chunk,
                again: None,
                part: None,
            }
        };
        self.reading.push((job.chunk, job.part));
        Some(job)
    }

    /// A chunk asked for by [`SourceSession::poll_read`] is in a buffer.
    pub fn chunk_read(&mut self, now: Instant, chunk: u64, meta: ChunkMeta) {
        let Some(i) = self.reading.iter().position(|&r| r == (chunk, meta.part)) else {
            return;
        };
        self.reading.swap_remove(i);
        if !self.link.live() {
            return;
        }
        self.ready.push_back((chunk, meta));
        self.assign(now);
    }

    /// Chunks read and not yet given to a stream (their buffers are held).
    pub fn queued(&self) -> usize {
        self.ready.len()
    }

    /// The write of `chunk` on `stream` finished.
    pub fn chunk_written(&mut self, now: Instant, stream: u16, chunk: u64) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if s.writing == Some(chunk) {
            s.writing = None;
            s.written_at.push_back(now);
            self.assign(now);
            self.check_sent();
        }
    }

    /// Stream `stream` acknowledged `frames` chunks in all (its 8-byte ack decoded with
    /// [`decode_ack`]).
    pub fn acked(&mut self, now: Instant, stream: u16, frames: u64) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if s.join != Join::Live || !self.link.live() {
            return;
        }
        if frames <= s.acked || frames > s.sent {
            let what = format!(
                "acknowledgement of {frames} chunks after {}, with {} sent",
                s.acked, s.sent
            );
            let e = SessionError::Protocol {
                peer: self.link.peer.clone(),
                what,
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        let n = frames - s.acked;
        s.acked = frames;
        for _ in 0..n {
            s.unacked.pop_front();
            if let Some(w) = s.written_at.pop_front() {
                let rtt = now.saturating_duration_since(w);
                self.ack_rtt = Some(self.ack_rtt.map_or(rtt, |r| r.min(rtt)));
            }
        }
        s.since = now;
        self.acked += n;
        s.mark = self.acked;
        self.lose_stuck(now, stream);
        self.check_drained();
        self.assign(now);
    }

    /// Streams other than `moving` (which just brought an acknowledgement) that have
    /// unacknowledged chunks and made no progress for [`Timing::stuck`], while the
    /// others acknowledged [`STUCK_CHUNKS`] chunks each on average: lost, their chunks
    /// go on the others. (A stuck connection among moving ones; when none moves, or
    /// all move slowly — a low bandwidth limit with large chunks — the whole
    /// [`Timing::stall`] applies.)
    fn lose_stuck(&mut self, now: Instant, moving: u16) {
        let stuck = self.link.timing.stuck;
        let live = self.streams.iter().filter(|s| s.join == Join::Live).count() as u64;
        let others = STUCK_CHUNKS * live.saturating_sub(1).max(1);
        let acked = self.acked;
        let ids: Vec<u16> = self
            .streams
            .iter()
            .enumerate()
            .filter(|&(i, s)| {
                i != moving as usize
                    && s.join == Join::Live
                    && !s.unacked.is_empty()
                    && now >= s.since + stuck
                    && acked - s.mark >= others
            })
            .map(|(i, _)| i as u16)
            .collect();
        for i in ids {
            if !self.link.live() {
                break;
            }
            let e = SessionError::Stalled {
                peer: self.link.peer.clone(),
                stream: i,
                secs: stuck.as_secs(),
            };
            self.lose(now, i, e);
        }
    }

    /// (feature [`features::CONTINUOUS`], growing manifest) Newer modification times
    /// of directories already in the manifest, for the sink to set at the end: sent
    /// before the next part (so at the latest with the last). Dropped in a session
    /// without the feature or after the last part.
    pub fn times(&mut self, entries: Vec<(u32, crate::manifest::Mtime)>) {
        if entries.is_empty()
            || !self.growing
            || self.manifest_done
            || !self.uses(features::CONTINUOUS)
            || !self.link.live()
        {
            return;
        }
        self.link
            .send(Control::Times(crate::control::TimesPart { entries }));
    }

    /// (feature [`features::CONTINUOUS`]) Every chunk below this is written at the sink
    /// and the files it ends are complete under their final names, as the sink last
    /// said ([`Control::Stored`]); 0 without the feature. A producer of a growing
    /// manifest learns from it when a part is durable.
    pub fn stored_below(&self) -> u64 {
        self.stored_below
    }

    /// Parts of the manifest the sink is prepared for (bound to its storage): the
    /// first (the whole manifest, unless it grows) at `Go`, each later part of a
    /// growing manifest at its `Grown`, also one that adds no chunks. A part is
    /// durable at the sink once it is confirmed and its chunks are stored
    /// ([`SourceSession::stored_below`]).
    pub fn parts_confirmed(&self) -> u64 {
        self.parts_confirmed
    }

    /// [`SourceSession::acked`] with the acknowledgement's bytes.
    pub fn acked_bytes(&mut self, now: Instant, stream: u16, ack: [u8; crate::data::ACK_LEN]) {
        self.acked(now, stream, decode_ack(ack));
    }

    /// Tells [`SourceEvent::Sent`] once every chunk owed is written into a live
    /// stream: the report may go then, and arrives about with the last data, instead
    /// of a round trip after it (the acknowledgements' way back and the report's
    /// way out), which a pulling client waited for.
    fn check_sent(&mut self) {
        if self.sent_told
            || self.phase != Phase::Sending
            || self.on_demand
            || self.continue_on_error
            || !self.manifest_done
            || self.growing && self.confirmed < self.layout_end()
            || !self.again.is_empty()
            || !self.ready.is_empty()
            || !self.reading.is_empty()
            || !self.link.live()
        {
            return;
        }
        let mut flying = 0;
        for s in self.streams.iter().filter(|s| s.join == Join::Live) {
            if s.writing.is_some() {
                return;
            }
            flying += s.unacked.len() as u64;
        }
        if self.acked + flying >= self.owed() {
            self.sent_told = true;
            self.events.push_back(SourceEvent::Sent);
        }
    }

    fn check_drained(&mut self) {
        self.check_sent();
        let ended = if self.on_demand {
            self.closed
        } else {
            self.manifest_done && (!self.growing || self.confirmed >= self.layout_end())
        };
        if self.phase == Phase::Sending && ended && self.acked >= self.owed() {
            self.phase = Phase::Draining;
            for (i, s) in self.streams.iter_mut().enumerate() {
                if s.join == Join::Live {
                    s.join = Join::Ended;
                    self.commands.push_back(SourceCommand::End {
                        stream: i as u16,
                        sent: s.sent,
                    });
                }
            }
            self.link.joins_done();
            self.events.push_back(SourceEvent::Drained);
        }
    }

    /// The answer to [`SourceEvent::Sent`]: sends the report, with the files that
    /// could not be read. Its counts of lost streams and chunks sent again are those
    /// up to now: a stream that breaks later has its chunks sent again all the same,
    /// and [`SourceSession::stats`] counts them.
    pub fn report(&mut self, failed: Vec<FailedFile>) {
        if self.reported || !self.sent_told || !self.link.live() {
            return;
        }
        self.send_report(failed);
        self.check_finished();
    }

    fn send_report(&mut self, failed: Vec<FailedFile>) {
        self.send_after_go(Control::SendReport(SendReport {
            chunks_resent: self.stats.chunks_resent,
            streams_lost: self.stats.streams_lost,
            failed,
        }));
        self.reported = true;
    }

    /// The answer to [`SourceEvent::Drained`]: sends the report, with the files that
    /// could not be read, unless it went at [`SourceEvent::Sent`].
    pub fn drained(&mut self, failed: Vec<FailedFile>) {
        if self.phase != Phase::Draining || !self.link.live() {
            return;
        }
        if !self.reported {
            self.send_report(failed);
        }
        self.phase = Phase::Reporting;
        self.check_finished();
    }

    /// The session ends once the report went and the sink said `Done`: after every
    /// acknowledgement, or, when the report went at [`SourceEvent::Sent`], at once:
    /// `Done` says the sink holds every chunk, so acknowledgements still on their way
    /// (or lost with a stream the sink closed) change nothing.
    fn check_finished(&mut self) {
        let ended = match self.phase {
            Phase::Reporting => true,
            // The sink may close the control connection right after its `Done` (it
            // has the report): waiting for `drained` here would fail the session.
            // (`sent_told` is never set in a request-driven session.)
            Phase::Sending | Phase::Draining => self.sent_told,
            _ => false,
        };
        if self.reported && ended {
            if let Some(s) = self.done.take() {
                self.link.finish();
                self.events.push_back(SourceEvent::Done(s));
            }
        }
    }

    /// Gives read chunks to streams that can take them.
    fn assign(&mut self, now: Instant) {
        if self.phase != Phase::Sending || !self.link.live() {
            return;
        }
        while !self.ready.is_empty() {
            let window = self.window;
            let best = self
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| s.join == Join::Live)
                .take(self.active)
                .filter(|(_, s)| s.writing.is_none())
                .filter(|(_, s)| s.unacked.len() < window)
                .min_by_key(|(i, s)| (s.unacked.len(), *i))
                .map(|(i, _)| i);
            let Some(i) = best else { return };
            let (chunk, meta) = self.ready.pop_front().expect("not empty");
            let acked = self.acked;
            let s = &mut self.streams[i];
            if s.unacked.is_empty() {
                s.since = now;
                s.mark = acked;
            }
            s.unacked.push_back((chunk, meta.clone()));
            s.writing = Some(chunk);
            s.sent += 1;
            self.commands.push_back(SourceCommand::Send {
                stream: i as u16,
                chunk,
                meta,
            });
        }
    }

    /// The driver failed: the session ends (the peer is told, see the module docs of
    /// [`super`]).
    pub fn fail(&mut self, now: Instant, error: E) {
        self.link.fail(now, SessionError::Local(error));
        self.flush_failure();
    }

    /// The control connection closed or failed.
    pub fn control_closed(&mut self, now: Instant, error: E) {
        if self.link.state != State::Running {
            return;
        }
        self.link.control_closed(now, error);
        self.flush_failure();
    }

    /// When [`SourceSession::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.link.poll_timeout();
        if self.link.live() && self.phase == Phase::Sending {
            for s in &self.streams {
                if s.join == Join::Live && !s.unacked.is_empty() {
                    let d = s.since + self.link.timing.stall;
                    t = Some(t.map_or(d, |t| t.min(d)));
                }
            }
            if let Some(d) = self.held_until {
                t = Some(t.map_or(d, |t| t.min(d)));
            }
        }
        t
    }

    /// Handles every deadline due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.link.on_timeout(now);
        if self.held_until.is_some_and(|t| now >= t) && self.link.live() {
            // No `Done` came: the held streams are lost, their chunks sent again.
            self.held_until = None;
            for (i, e) in std::mem::take(&mut self.held_losses) {
                if !self.link.live() || self.phase != Phase::Sending {
                    break;
                }
                self.lose(now, i, e);
            }
        }
        if self.link.live() && self.phase == Phase::Sending {
            let stall = self.link.timing.stall;
            let stalled: Vec<u16> = self
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| s.join == Join::Live && !s.unacked.is_empty())
                .filter(|(_, s)| now >= s.since + stall)
                .map(|(i, _)| i as u16)
                .collect();
            for i in stalled {
                if !self.link.live() {
                    break;
                }
                let e = SessionError::Stalled {
                    peer: self.link.peer.clone(),
                    stream: i,
                    secs: stall.as_secs(),
                };
                self.lose(now, i, e);
            }
        }
        let joined = self
            .streams
            .iter()
            .filter(|s| s.join != Join::Pending)
            .count();
        self.link.check_joins(now, joined, self.streams.len());
        self.flush_failure();
    }

    /// The next control message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.link.poll_transmit()
    }

    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<SourceCommand> {
        self.commands.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<SourceEvent<E>> {
        self.events.pop_front()
    }

    /// Turns a failure into commands and an event, once.
    fn flush_failure(&mut self) {
        if let Some(e) = self.link.failure.take() {
            for (i, s) in self.streams.iter_mut().enumerate() {
                if matches!(s.join, Join::Live | Join::Pending) {
                    s.join = Join::Lost;
                    self.commands
                        .push_back(SourceCommand::Close { stream: i as u16 });
                }
            }
            self.ready.clear();
            self.again.clear();
            self.events.push_back(SourceEvent::Failed(e));
        }
    }
}
