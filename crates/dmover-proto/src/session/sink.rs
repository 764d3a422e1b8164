//! The sink role: takes the manifest (within limits), negotiates a resume, says `Go`,
//! keeps the first whole copy of each chunk, acknowledges every frame, and reports
//! `Done` once every file is finalised.
//!
//! # States
//! ```text
//! Opening ─(Session | grant)─▶ Listing ─(ManifestEnd)─▶ Preparing ─(resume: Have*)─▶ Resuming ─(Plan)─▶ Planning
//!                                                          │ (ready)                                     │ (ready)
//!                                                          ▼                                             ▼
//!                                                       Receiving ◀──────────────────────────────────────┘
//!                                                          │ (every expected chunk arrived and written)
//!                                                          ▼
//!                                 Finishing ─(finished: Done)─▶ Reporting ─(SendReport)─▶ Finished
//! any state ─(error, silence, every stream lost)─▶ Failed
//! ```
//! With a growing manifest ([`super::features::GROWING_MANIFEST`]) the first `Grow`
//! ends `Listing` as `ManifestEnd` does; later parts come in any state after it, until
//! the one marked last, as [`SinkEvent::Grown`], each answered by [`SinkSession::grown`]
//! (`Grown` to the source), and `Receiving` leads to `Finishing` only once the last
//! part came, is prepared for, and every chunk is written. With
//! [`super::features::RANGES`]:
//! ```text
//! Preparing | Planning ─(ready_on_demand: OnDemand)─▶ Receiving (request-driven) ─(finished: Done)─▶ Reporting ─(SendReport)─▶ Finished
//! Receiving ─(want: Want)─▶ Receiving
//! ```
//! A request-driven session expects only the chunks [`SinkSession::want`] asked for
//! (a chunk that arrived before and is wanted again is expected, and written, again),
//! never completes by itself, and lasts until the sink closes it with
//! [`SinkSession::finished`].
//!
//! Frames are acknowledged as they arrive, duplicates too, until the source's report
//! says it has every acknowledgement: a chunk sent again after a stream was lost may
//! arrive twice, and the source waits for an acknowledgement of each copy it sent.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use super::link::{Dial, Link, Setup};
use super::{Cause, ChunkSet, PartRange, SessionError, Side, State, StreamStats, Timing, features};
use crate::control::{
    Control, Growth, Have, Part, Plan, SendReport, SessionInfo, SessionLimits, SessionOptions,
    Summary, Want, WantParts,
};
use crate::manifest::{self, Entry, EntryMeta, XattrScope};

/// What the driver is to do for the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkCommand {
    /// Dial data stream `stream` and join it to the session (dialer only).
    Open {
        /// The stream index.
        stream: u16,
    },
    /// Send this acknowledgement on `stream` ([`crate::data::encode_ack`]).
    Ack {
        /// The stream.
        stream: u16,
        /// Frames received on it so far.
        frames: u64,
    },
    /// The stream is lost or done: stop reading it and close it.
    Close {
        /// The stream.
        stream: u16,
    },
}

/// What to do with a chunk that arrived whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The first copy: write it, then report [`SinkSession::chunk_written`].
    Write,
    /// A copy of a chunk already here (or one not expected): drop it.
    Duplicate,
    /// The session failed or the stream is gone: drop it.
    Refused,
}

/// What the sink's application learns.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkEvent<E> {
    /// (dialer) The acceptor opened the session; [`SinkCommand::Open`]s follow.
    Opened(SessionInfo),
    /// (acceptor) The dialer's session options.
    Options(SessionOptions),
    /// (feature [`features::METADATA`]) The entries' owners and extended attributes,
    /// checked (attributes out of [`Limits::xattrs`] dropped), right before
    /// [`SinkEvent::Manifest`]: keep them for the storage the manifest is bound to.
    Meta(Vec<EntryMeta>),
    /// The whole manifest, checked: bind it to the destination, then call
    /// [`SinkSession::resume`] (when the options ask for it) or [`SinkSession::ready`].
    Manifest(Vec<Entry>),
    /// (feature [`features::LINKS`]) The files of the manifest that may have holes
    /// (entry indices of regular files, ascending), checked; comes right before
    /// [`SinkEvent::Manifest`], only when the source listed some: keep them sparse.
    Sparse(Vec<u32>),
    /// The source's answer to a resume: apply it, then call [`SinkSession::ready`].
    Plan(Plan),
    /// (feature [`features::GROWING_MANIFEST`]) A later part of a growing manifest,
    /// checked with the parts before it: extend the layout (its chunks `chunks` come
    /// after every earlier one), then call [`SinkSession::grown`] with `chunks.end`.
    Grown {
        /// The part's entries, numbered after every earlier entry.
        entries: Vec<Entry>,
        /// The chunks the part adds to the layout.
        chunks: Range<u64>,
        /// (feature [`features::METADATA`]) Owners and extended attributes of the
        /// part's entries (or earlier ones), to apply as it is bound.
        meta: Vec<EntryMeta>,
        /// (feature [`features::WALKING`]) The part's files that may have holes
        /// (entry indices, ascending), checked: keep them sparse.
        sparse: Vec<u32>,
        /// The size of the part's chunks: the session's, or (feature
        /// [`features::PART_CHUNKS`]) the one the source named, checked (a valid
        /// chunk size, at most the session's).
        chunk: u32,
    },
    /// (feature [`features::CONTINUOUS`]) Newer modification times of entries of
    /// earlier parts (directories), to set at the end instead of the manifest's.
    Times(Vec<(u32, crate::manifest::Mtime)>),
    /// Every expected chunk arrived and is written: finalise, then call
    /// [`SinkSession::finished`].
    Complete,
    /// A stream was lost; its chunks come on the others.
    StreamLost {
        /// The stream.
        stream: u16,
        /// Why.
        error: SessionError<E>,
    },
    /// (feature [`features::TUNING`]) The source changed the data streams it sends on.
    Tuned(crate::control::Tuned),
    /// The session is over; the source's account of its sending.
    Done(SendReport),
    /// (feature [`features::LIMITS`]) The peer's limits. An acceptor answers with
    /// its own ([`SinkSession::limits`]).
    Limits(SessionLimits),
    /// The session failed.
    Failed(SessionError<E>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Opening,
    Listing,
    Preparing,
    Resuming,
    Planning,
    Receiving,
    Finishing,
    Reporting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    Pending,
    Live,
    Ended,
    Lost,
}

#[derive(Debug)]
struct Stream {
    join: Join,
    frames: u64,
    last_frame: Instant,
}

/// Limits on what a source may announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most manifest entries.
    pub max_entries: u64,
    /// Most memory the manifest's entries may take ([`manifest::entry_bytes`]),
    /// their metadata included ([`manifest::meta_bytes`]).
    pub max_manifest_bytes: u64,
    /// (feature [`features::METADATA`]) The extended attributes this side takes;
    /// others are dropped on arrival.
    pub xattrs: XattrScope,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: manifest::MAX_ENTRIES,
            max_manifest_bytes: manifest::MAX_MANIFEST_BYTES,
            xattrs: XattrScope::DEFAULT,
        }
    }
}

/// Most chunk ranges in one `Want` message.
const WANT_RANGES: usize = 1 << 16;

/// The sink role of a session (see the module docs).
#[derive(Debug)]
pub struct SinkSession<E> {
    link: Link<E>,
    limits: Limits,
    phase: Phase,
    info: Option<SessionInfo>,
    streams: Vec<Stream>,
    entries: Vec<Entry>,
    entry_bytes: u64,
    /// Entries received in all.
    n_entries: u64,
    /// Files the source listed as sparse ([`Control::Sparse`]).
    sparse: Vec<u32>,
    /// A growing manifest: the parts checked so far.
    growth: Option<manifest::Validator>,
    /// Growing: the last part came.
    sealed: bool,
    /// Growing: the layout's chunks as announced by the parts.
    announced: u64,
    /// Growing: the chunks of the first part.
    first_chunks: u64,
    /// (feature `PART_CHUNKS`) The chunk size the source named for the part it sends.
    part_chunk: Option<u32>,
    /// Growing: the chunks of later parts prepared for before [`SinkSession::ready`].
    grown: ChunkSet,
    /// The session is request-driven (`OnDemand`).
    on_demand: bool,
    /// Request-driven: the last frame on any stream, or the request that ended a
    /// quiet spell (nothing outstanding): the streams' idle limit counts from here.
    progress: Instant,
    expected: ChunkSet,
    seen: Vec<u64>,
    n_chunks: u64,
    distinct: u64,
    writing: u64,
    /// (feature `PARTS`) Parts asked for and not arrived, with how many times each.
    parts_out: std::collections::HashMap<(u64, PartRange), u32>,
    /// The number of those.
    n_parts_out: u64,
    stats: StreamStats,
    report: Option<SendReport>,
    commands: VecDeque<SinkCommand>,
    events: VecDeque<SinkEvent<E>>,
    /// (feature `METADATA`) The manifest ended; its metadata parts are awaited.
    meta_wait: bool,
    /// The metadata received so far.
    meta: Vec<EntryMeta>,
    /// Every chunk below this is written (or not expected).
    written_below: u64,
    /// Chunks written at or above `written_below`.
    written_above: BTreeSet<u64>,
    /// (feature `CONTINUOUS`) Ends of the parts prepared for whose chunks are not all
    /// written yet, and the last count sent in `Stored`.
    part_ends: BTreeSet<u64>,
    stored_sent: u64,
    /// (dialer) Early data ([`SinkSession::dial_early`]): the session id and salt
    /// its streams joined with.
    early: Option<(u64, [u8; 32])>,
}

/// What is wrong with a sparse file list for `entries`, if anything: each must be a
/// regular file, in strictly ascending order.
fn sparse_error(entries: &[Entry], sparse: &[u32]) -> Option<String> {
    let mut last = None;
    for &i in sparse {
        if last.is_some_and(|l| i <= l) {
            return Some(format!("sparse file list not ascending at entry {i}"));
        }
        last = Some(i);
        if !entries
            .get(i as usize)
            .is_some_and(|e| matches!(e.kind, manifest::EntryKind::File { .. }))
        {
            return Some(format!(
                "sparse file list names entry {i}, not a regular file"
            ));
        }
    }
    None
}

impl<E: Cause + Clone> SinkSession<E> {
    fn new(peer: String, side: Side, timing: Timing, limits: Limits) -> Self {
        SinkSession {
            link: Link::new(peer, side, timing),
            limits,
            phase: Phase::Opening,
            info: None,
            streams: Vec::new(),
            entries: Vec::new(),
            entry_bytes: 0,
            n_entries: 0,
            sparse: Vec::new(),
            growth: None,
            sealed: false,
            announced: 0,
            first_chunks: 0,
            part_chunk: None,
            grown: ChunkSet::new(),
            on_demand: false,
            progress: Instant::now(),
            expected: ChunkSet::new(),
            seen: Vec::new(),
            n_chunks: 0,
            distinct: 0,
            writing: 0,
            parts_out: std::collections::HashMap::new(),
            n_parts_out: 0,
            stats: StreamStats::default(),
            report: None,
            commands: VecDeque::new(),
            events: VecDeque::new(),
            meta_wait: false,
            meta: Vec::new(),
            written_below: 0,
            written_above: BTreeSet::new(),
            part_ends: BTreeSet::new(),
            stored_sent: 0,
            early: None,
        }
    }

    /// A dialer that is the sink (a pull): its first flight goes out at once.
    pub fn dial(
        now: Instant,
        peer: impl Into<String>,
        timing: Timing,
        limits: Limits,
        d: Dial,
    ) -> Self {
        let mut s = Self::new(peer.into(), Side::Dialer, timing, limits);
        s.link.dial(now, d);
        s
    }

    /// A dialer that is the sink of a fresh pull sending early data (protocol
    /// version 8, feature [`features::EARLY`] offered): its data streams, as many as
    /// asked for, are opened now, with the session id and salt the dialer derived from
    /// the control connection (`id`, `salt`: [`crate::auth::session_id`]), so that
    /// they join as the first flight goes out; the acceptor's `Session` must name them
    /// and grant those streams (else the session fails). The driver reads the streams
    /// only once the sink said `Go`, as always.
    pub fn dial_early(
        now: Instant,
        peer: impl Into<String>,
        timing: Timing,
        limits: Limits,
        d: Dial,
        id: u64,
        salt: [u8; 32],
    ) -> Self {
        let streams = d.open.streams;
        let mut s = Self::dial(now, peer, timing, limits, d);
        s.early = Some((id, salt));
        s.streams = (0..streams)
            .map(|_| Stream {
                join: Join::Pending,
                frames: 0,
                last_frame: now,
            })
            .collect();
        for i in 0..streams {
            s.commands.push_back(SinkCommand::Open { stream: i });
        }
        s
    }

    /// An acceptor that is the sink (a push): [`SinkSession::grant`] opens the session.
    pub fn accept(
        _now: Instant,
        peer: impl Into<String>,
        timing: Timing,
        limits: Limits,
        setup_deadline: Instant,
    ) -> Self {
        let mut s = Self::new(peer.into(), Side::Acceptor, timing, limits);
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
        if self.early.is_some() {
            // The streams were opened at the start.
            self.info = Some(info);
            self.phase = Phase::Listing;
            return;
        }
        self.streams = (0..info.streams)
            .map(|_| Stream {
                join: Join::Pending,
                frames: 0,
                last_frame: now,
            })
            .collect();
        self.info = Some(info);
        self.phase = Phase::Listing;
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
    /// ([`SinkEvent::Limits`]) with this side's; once, and only in a session that uses
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

    /// Memory the manifest received so far takes ([`manifest::entry_bytes`] of its
    /// entries, and [`manifest::meta_bytes`] of their metadata): what
    /// [`Limits::max_manifest_bytes`] bounds.
    pub fn manifest_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Distinct expected chunks arrived so far.
    pub fn arrived_chunks(&self) -> u64 {
        self.distinct
    }

    /// A control message from the peer.
    pub fn handle_control(&mut self, now: Instant, msg: Control) {
        let Some(msg) = self.link.screen(now, msg) else {
            return self.flush_failure();
        };
        if matches!(msg, Control::Ping) && self.link.heartbeat_running() {
            return;
        }
        if let Err(e) = self.on_control(now, msg) {
            self.link.fail(now, e);
        }
        self.flush_failure();
    }

    fn on_control(&mut self, now: Instant, msg: Control) -> Result<(), SessionError<E>> {
        let msg = match self.link.setup(now, msg, false, self.info.is_some())? {
            Setup::Taken => return Ok(()),
            Setup::Opened(info) => {
                if let Some((id, salt)) = self.early {
                    if (info.id, info.salt, usize::from(info.streams))
                        != (id, salt, self.streams.len())
                    {
                        return Err(SessionError::Protocol {
                            peer: self.link.peer.clone(),
                            what: format!(
                                "Session {info:?} unlike the one early data assumed (id \
                                 {id:016x}, {} streams)",
                                self.streams.len()
                            ),
                        });
                    }
                } else {
                    for i in 0..info.streams {
                        self.commands.push_back(SinkCommand::Open { stream: i });
                    }
                }
                self.open(now, info.clone());
                self.events.push_back(SinkEvent::Opened(info));
                return Ok(());
            }
            Setup::Options(o) => {
                self.events.push_back(SinkEvent::Options(o));
                return Ok(());
            }
            Setup::Session(msg) => msg,
        };
        let peer = self.link.peer.clone();
        super::check_feature(&peer, self.info.as_ref(), &msg)?;
        if let Control::Limits(l) = msg {
            self.link.on_limits(&l)?;
            self.events.push_back(SinkEvent::Limits(l));
            return Ok(());
        }
        let growing = self.growth.is_some() && !self.sealed;
        match (self.phase, msg) {
            (phase, Control::Manifest(part)) if phase == Phase::Listing || growing => {
                let n = self.n_entries + part.entries.len() as u64;
                if n > self.limits.max_entries {
                    return Err(SessionError::Limit(format!(
                        "manifest exceeds {} entries",
                        self.limits.max_entries
                    )));
                }
                self.entry_bytes += part.entries.iter().map(manifest::entry_bytes).sum::<u64>();
                if self.entry_bytes > self.limits.max_manifest_bytes {
                    return Err(SessionError::Limit(format!(
                        "manifest exceeds {} bytes of memory",
                        self.limits.max_manifest_bytes
                    )));
                }
                self.n_entries = n;
                self.entries.extend(part.entries);
                Ok(())
            }
            (Phase::Listing, Control::Sparse(s)) if !self.meta_wait => self.on_sparse(s),
            // (feature WALKING) A live walk's later part: its sparse files come
            // before its `Grow`.
            (phase, Control::Sparse(s))
                if phase > Phase::Listing && growing && self.uses(features::WALKING) =>
            {
                self.on_sparse(s)
            }
            (phase, Control::Grow(g)) if phase == Phase::Listing || growing => self.on_grow(now, g),
            // (feature PART_CHUNKS) A later part's chunk size, before its `Grow`.
            (phase, Control::PartChunk(c)) if phase > Phase::Listing && growing => {
                let session = self.info.as_ref().map_or(0, |i| i.chunk_size);
                let bad = crate::layout::validate_chunk_size(c)
                    .err()
                    .map(|e| e.to_string())
                    .or_else(|| {
                        (c > session).then(|| {
                            format!("a part's chunk size {c} exceeds the session's {session}")
                        })
                    });
                if let Some(what) = bad {
                    return Err(SessionError::Protocol { peer, what });
                }
                self.part_chunk = Some(c);
                Ok(())
            }
            (phase, Control::Times(t)) if phase > Phase::Listing && growing => {
                // Entries of parts already checked (not of one still coming).
                let known = self.n_entries - self.entries.len() as u64;
                if t.entries.len() as u64 > self.limits.max_entries {
                    return Err(SessionError::Limit(format!(
                        "more than {} modification times at once",
                        self.limits.max_entries
                    )));
                }
                if let Some((i, _)) = t.entries.iter().find(|(i, _)| u64::from(*i) >= known) {
                    return Err(SessionError::Protocol {
                        peer,
                        what: format!("a modification time for entry {i} of {known}"),
                    });
                }
                self.events.push_back(SinkEvent::Times(t.entries));
                Ok(())
            }
            (Phase::Listing, Control::Meta(part)) if self.meta_wait => self.on_meta(part),
            // A streamed manifest's first part: its metadata comes before its `Grow`,
            // as a later part's.
            (Phase::Listing, Control::Meta(part))
                if self.growth.is_none() && !part.last && self.uses(features::GROWING_MANIFEST) =>
            {
                self.check_meta(part, self.entries.len() as u64)
            }
            // A growing manifest's later part: its metadata comes before its `Grow`.
            (phase, Control::Meta(part)) if phase > Phase::Listing && growing && !part.last => {
                self.check_meta(part, self.n_entries)
            }
            (Phase::Listing, Control::ManifestEnd(end)) if !self.meta_wait => {
                let totals = manifest::validate(&self.entries, self.limits.max_entries).map_err(
                    |source| SessionError::Malformed {
                        peer: peer.clone(),
                        source,
                    },
                )?;
                if totals != end.totals {
                    return Err(SessionError::Protocol {
                        peer,
                        what: format!(
                            "manifest totals {:?} do not match its entries {totals:?}",
                            end.totals
                        ),
                    });
                }
                let sparse = std::mem::take(&mut self.sparse);
                if let Some(bad) = sparse_error(&self.entries, &sparse) {
                    return Err(SessionError::Protocol { peer, what: bad });
                }
                if self.uses(features::METADATA) {
                    // The manifest is prepared for once its metadata came.
                    self.sparse = sparse;
                    self.meta_wait = true;
                    return Ok(());
                }
                self.phase = Phase::Preparing;
                let entries = std::mem::take(&mut self.entries);
                if !sparse.is_empty() {
                    self.events.push_back(SinkEvent::Sparse(sparse));
                }
                self.events.push_back(SinkEvent::Manifest(entries));
                Ok(())
            }
            (Phase::Resuming, Control::Plan(plan)) => {
                self.phase = Phase::Planning;
                self.events.push_back(SinkEvent::Plan(plan));
                Ok(())
            }
            (Phase::Receiving | Phase::Finishing | Phase::Reporting, Control::Tuned(t)) => {
                if t.reason.len() > crate::control::MAX_TUNED_REASON
                    || t.streams == 0
                    || self.info.as_ref().is_some_and(|i| t.streams > i.streams)
                {
                    return Err(SessionError::Protocol {
                        peer,
                        what: format!(
                            "tuning decision for {} streams with a {}-byte reason",
                            t.streams,
                            t.reason.len()
                        ),
                    });
                }
                self.events.push_back(SinkEvent::Tuned(t));
                Ok(())
            }
            (Phase::Receiving | Phase::Finishing | Phase::Reporting, Control::SendReport(r))
                if self.report.is_none() =>
            {
                self.report = Some(r);
                self.check_finished();
                Ok(())
            }
            (phase, other) => {
                let wanted = match phase {
                    Phase::Listing => "manifest",
                    Phase::Resuming => "Plan",
                    Phase::Receiving | Phase::Finishing | Phase::Reporting => "SendReport",
                    _ => "nothing",
                };
                Err(super::unexpected(&peer, &other, wanted))
            }
        }
    }

    /// (feature `LINKS`) A part of the list of sparse files, kept until the manifest
    /// (or its part) ends.
    fn on_sparse(&mut self, s: crate::control::SparseFiles) -> Result<(), SessionError<E>> {
        if self.sparse.len() + s.entries.len() > self.limits.max_entries as usize {
            return Err(SessionError::Limit(format!(
                "sparse file list exceeds {} entries",
                self.limits.max_entries
            )));
        }
        self.sparse.extend(s.entries);
        Ok(())
    }

    /// (feature `METADATA`) A part of the manifest's metadata: checked against the
    /// limits and the manifest, attributes out of scope dropped; the last one lets
    /// the manifest be prepared for.
    fn on_meta(&mut self, part: crate::control::MetaPart) -> Result<(), SessionError<E>> {
        let last = part.last;
        self.check_meta(part, self.entries.len() as u64)?;
        if last {
            self.meta_wait = false;
            self.phase = Phase::Preparing;
            let sparse = std::mem::take(&mut self.sparse);
            if !sparse.is_empty() {
                self.events.push_back(SinkEvent::Sparse(sparse));
            }
            let meta = std::mem::take(&mut self.meta);
            if !meta.is_empty() {
                self.events.push_back(SinkEvent::Meta(meta));
            }
            let entries = std::mem::take(&mut self.entries);
            self.events.push_back(SinkEvent::Manifest(entries));
        }
        Ok(())
    }

    /// Checks a metadata part against the limits and the `n` entries it may name,
    /// drops the attributes out of scope, and keeps it.
    fn check_meta(
        &mut self,
        part: crate::control::MetaPart,
        n: u64,
    ) -> Result<(), SessionError<E>> {
        let peer = self.link.peer.clone();
        for mut m in part.entries {
            manifest::validate_meta(
                &m,
                n,
                XattrScope {
                    user: true,
                    acls: true,
                    all: true,
                },
            )
            .map_err(|source| SessionError::Malformed {
                peer: peer.clone(),
                source,
            })?;
            m.xattrs.retain(|x| self.limits.xattrs.allows(&x.name));
            self.entry_bytes += manifest::meta_bytes(&m);
            if self.entry_bytes > self.limits.max_manifest_bytes {
                return Err(SessionError::Limit(format!(
                    "manifest exceeds {} bytes of memory with its metadata",
                    self.limits.max_manifest_bytes
                )));
            }
            self.meta.push(m);
        }
        Ok(())
    }

    /// A part of a growing manifest ends.
    fn on_grow(&mut self, now: Instant, g: Growth) -> Result<(), SessionError<E>> {
        let peer = self.link.peer.clone();
        let part = std::mem::take(&mut self.entries);
        let v = self.growth.get_or_insert_with(manifest::Validator::new);
        let totals =
            v.extend(&part, self.limits.max_entries)
                .map_err(|source| SessionError::Malformed {
                    peer: peer.clone(),
                    source,
                })?;
        if totals != g.totals {
            return Err(SessionError::Protocol {
                peer,
                what: format!(
                    "manifest totals {:?} do not match its entries {totals:?}",
                    g.totals
                ),
            });
        }
        if g.chunks < self.announced {
            return Err(SessionError::Protocol {
                peer,
                what: format!(
                    "the layout shrinks from {} to {} chunks",
                    self.announced, g.chunks
                ),
            });
        }
        // The part's sparse files (a live walk's, feature WALKING; a first part's
        // list may come without it): entries of this part, ascending, regular files.
        let sparse = std::mem::take(&mut self.sparse);
        let base = totals.entries - part.len() as u64;
        let off = |i: u32| {
            u64::from(i)
                .checked_sub(base)
                .and_then(|j| u32::try_from(j).ok())
        };
        let relative: Option<Vec<u32>> = sparse.iter().map(|&i| off(i)).collect();
        let bad = match &relative {
            Some(r) => sparse_error(&part, r),
            None => Some("sparse file list names an entry of an earlier part".to_string()),
        };
        if let Some(what) = bad {
            return Err(SessionError::Protocol { peer, what });
        }
        let chunks = self.announced..g.chunks;
        self.announced = g.chunks;
        self.sealed = g.last;
        if self.phase == Phase::Listing {
            self.first_chunks = g.chunks;
            self.phase = Phase::Preparing;
            let meta = std::mem::take(&mut self.meta);
            if !sparse.is_empty() {
                self.events.push_back(SinkEvent::Sparse(sparse));
            }
            if !meta.is_empty() {
                self.events.push_back(SinkEvent::Meta(meta));
            }
            self.events.push_back(SinkEvent::Manifest(part));
        } else {
            let session = self.info.as_ref().map_or(0, |i| i.chunk_size);
            self.events.push_back(SinkEvent::Grown {
                entries: part,
                chunks,
                meta: std::mem::take(&mut self.meta),
                sparse,
                chunk: self.part_chunk.take().unwrap_or(session),
            });
            self.check_complete();
            if self.phase >= Phase::Receiving {
                self.check_streams_left(now, None);
            }
        }
        Ok(())
    }

    /// (feature [`features::GROWING_MANIFEST`]) The answer to [`SinkEvent::Grown`]:
    /// the layout covers `n_chunks` chunks now; the source may send them (a part's
    /// chunks are expected from here on, unless the session is request-driven).
    pub fn grown(&mut self, now: Instant, n_chunks: u64) {
        if self.growth.is_none() || self.phase < Phase::Preparing || !self.link.live() {
            return;
        }
        let have = self.n_chunks.max(self.first_chunks + self.grown.len());
        if n_chunks < have || n_chunks > self.announced {
            let e = SessionError::Protocol {
                peer: "this side".into(),
                what: format!(
                    "prepared for {n_chunks} chunks, with {have} before and {} announced",
                    self.announced
                ),
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        // Every part is answered, also one that adds no chunks: its entries are bound
        // (the source counts the answers to learn which parts are durable here).
        self.link.send(Control::Grown(n_chunks));
        if self.reports_stored() {
            self.part_ends.insert(n_chunks);
        }
        if n_chunks > have {
            // A quiet spell (everything arrived, nothing expected) ends here: the
            // streams' idle limit counts from now.
            self.progress = self.progress.max(now);
        }
        self.report_stored();
        if n_chunks == have {
            return;
        }
        if self.phase >= Phase::Receiving {
            self.extend_layout(have..n_chunks);
            self.check_streams_left(now, None);
        } else {
            self.grown.insert_range(have..n_chunks);
        }
    }

    fn extend_layout(&mut self, r: Range<u64>) {
        self.n_chunks = self.n_chunks.max(r.end);
        self.seen.resize(self.n_chunks.div_ceil(64) as usize, 0);
        if !self.on_demand {
            self.expected.insert_range(r);
        }
    }

    /// Answers the manifest with what an earlier attempt left (resume): the `Have`
    /// parts, the last marked. The source answers with a plan ([`SinkEvent::Plan`]).
    pub fn resume(&mut self, now: Instant, parts: Vec<Have>) {
        if self.phase != Phase::Preparing || !self.link.live() {
            return;
        }
        let mut parts = parts;
        if parts.is_empty() {
            parts.push(Have::default());
        }
        if let Some(last) = parts.last_mut() {
            last.last = true;
        }
        for p in parts {
            self.link.send(Control::Have(p));
        }
        self.phase = Phase::Resuming;
        self.link.expect(now, "Plan");
    }

    /// The sink is prepared for `expected` of the layout's `n_chunks` chunks: says
    /// `Go`. (Of a growing manifest: the first part's layout.)
    pub fn ready(&mut self, now: Instant, expected: ChunkSet, n_chunks: u64) {
        self.start(now, expected, n_chunks, false);
    }

    /// (feature [`features::RANGES`]) In place of [`SinkSession::ready`]: the sink is
    /// prepared for the layout's `n_chunks` chunks and makes the session
    /// request-driven (`OnDemand`): the source sends only what
    /// [`SinkSession::want`] asks for, and the session lasts until
    /// [`SinkSession::finished`] (a mount until it is unmounted).
    pub fn ready_on_demand(&mut self, now: Instant, n_chunks: u64) {
        self.start(now, ChunkSet::new(), n_chunks, true);
    }

    /// Whether the session uses `bit` (see [`features`]).
    pub fn uses(&self, bit: u64) -> bool {
        self.info.as_ref().is_some_and(|i| i.features & bit != 0)
    }

    fn start(&mut self, now: Instant, expected: ChunkSet, n_chunks: u64, on_demand: bool) {
        if !matches!(self.phase, Phase::Preparing | Phase::Planning) || !self.link.live() {
            return;
        }
        let what = if expected.end() > n_chunks {
            Some(format!(
                "expects chunk {} of a layout of {n_chunks}",
                expected.end() - 1
            ))
        } else if self.growth.is_some() && n_chunks != self.first_chunks {
            Some(format!(
                "a layout of {n_chunks} chunks for a first part of {}",
                self.first_chunks
            ))
        } else if on_demand && !self.uses(features::RANGES) {
            Some("a request-driven session without the ranges feature".into())
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
        self.on_demand = on_demand;
        self.expected = expected;
        self.seen = vec![0; n_chunks.div_ceil(64) as usize];
        self.n_chunks = n_chunks;
        for r in self.grown.ranges().to_vec() {
            self.extend_layout(r);
        }
        if self.reports_stored() {
            self.part_ends.insert(n_chunks);
            self.advance_written();
        }
        self.phase = Phase::Receiving;
        self.link.send(if on_demand {
            Control::OnDemand
        } else {
            Control::Go
        });
        for s in &mut self.streams {
            s.last_frame = now;
        }
        self.link.await_joins(now);
        // Streams that joined before `Go` count.
        if self.streams.iter().all(|s| s.join != Join::Pending) {
            self.link.joins_done();
        }
        self.check_complete();
    }

    /// (feature [`features::RANGES`]) Asks for chunks, in this order (a mount maps
    /// the byte ranges it reads to chunks with the layout). In an ordinary session the
    /// source sends those still expected first (chunks that arrived are not asked for
    /// again); in a request-driven one each chunk named comes, again if it came before
    /// (its next copy is to be written), unless it is already on its way.
    pub fn want(&mut self, now: Instant, chunks: &[Range<u64>]) {
        if self.phase != Phase::Receiving || !self.link.live() {
            return;
        }
        let beyond = chunks
            .iter()
            .find(|r| r.end > self.n_chunks && r.start < r.end);
        let what = if !self.uses(features::RANGES) {
            Some("chunk requests without the ranges feature".to_string())
        } else {
            beyond.map(|r| format!("wants chunks {r:?} of a layout of {}", self.n_chunks))
        };
        if let Some(what) = what {
            let e = SessionError::Protocol {
                peer: "this side".into(),
                what,
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        if self.on_demand && self.all_arrived() && self.writing == 0 {
            // A quiet spell ends: no stream was idle while nothing was asked for.
            self.progress = now;
        }
        let mut ask: Vec<Range<u64>> = Vec::new();
        for r in chunks {
            for k in r.clone() {
                let (word, bit) = ((k / 64) as usize, 1u64 << (k % 64));
                let seen = self.seen[word] & bit != 0;
                let take = if self.on_demand {
                    if seen {
                        self.seen[word] &= !bit;
                        self.distinct -= 1;
                        true
                    } else if self.expected.contains(k) {
                        false
                    } else {
                        self.expected.insert(k);
                        true
                    }
                } else {
                    !seen && self.expected.contains(k)
                };
                if take {
                    match ask.last_mut() {
                        Some(last) if last.end == k => last.end += 1,
                        _ => ask.push(k..k + 1),
                    }
                }
            }
        }
        for part in ask.chunks(WANT_RANGES) {
            self.link.send(Control::Want(Want {
                chunks: part.to_vec(),
            }));
        }
    }

    /// (feature [`features::PARTS`], request-driven) Asks for byte ranges of chunks,
    /// each to come as a part frame ([`SinkSession::arrived_part`]); a part asked for
    /// again while on its way comes twice.
    pub fn want_parts(&mut self, now: Instant, parts: &[Part]) {
        if self.phase != Phase::Receiving || !self.link.live() || parts.is_empty() {
            return;
        }
        let what = if !self.on_demand || !self.uses(features::PARTS) {
            Some("parts of chunks asked for without a request-driven session using the parts feature".to_string())
        } else {
            let cs = self.info.as_ref().map_or(0, |i| u64::from(i.chunk_size));
            parts
                .iter()
                .find(|p| {
                    p.chunk >= self.n_chunks
                        || p.len == 0
                        || u64::from(p.offset) + u64::from(p.len) > cs
                })
                .map(|p| {
                    format!(
                        "wants {p:?} of a layout of {} chunks of {cs} bytes",
                        self.n_chunks
                    )
                })
        };
        if let Some(what) = what {
            let e = SessionError::Protocol {
                peer: "this side".into(),
                what,
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        if self.all_arrived() && self.writing == 0 {
            // A quiet spell ends: no stream was idle while nothing was asked for.
            self.progress = now;
        }
        for p in parts {
            let r = PartRange {
                offset: p.offset,
                len: p.len,
            };
            *self.parts_out.entry((p.chunk, r)).or_default() += 1;
            self.n_parts_out += 1;
        }
        for batch in parts.chunks(WANT_RANGES) {
            self.link.send(Control::WantPart(WantParts {
                parts: batch.to_vec(),
            }));
        }
    }

    /// Whether the whole manifest is here: it came whole, or a growing one's last part
    /// came.
    pub fn manifest_complete(&self) -> bool {
        self.growth.is_none() || self.sealed
    }

    /// Chunks expected that have not arrived or are being written (parts too).
    pub fn outstanding(&self) -> u64 {
        self.expected.len() - self.distinct + self.writing + self.n_parts_out
    }

    /// Data stream `stream` joined the session.
    pub fn stream_joined(&mut self, now: Instant, stream: u16) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if s.join == Join::Pending && self.link.live() {
            s.join = Join::Live;
            s.last_frame = now;
            if self.streams.iter().all(|s| s.join != Join::Pending) {
                self.link.joins_done();
            }
        }
    }

    /// A chunk frame arrived whole on `stream` (its header checked against the layout
    /// by the driver, [`crate::layout::Layout::wire_len`]).
    pub fn arrived(&mut self, now: Instant, stream: u16, chunk: u64) -> Arrival {
        let Some(s) = self.streams.get(stream as usize) else {
            return Arrival::Refused;
        };
        if s.join != Join::Live || !self.link.live() {
            return Arrival::Refused;
        }
        if self.phase < Phase::Receiving || chunk >= self.n_chunks {
            let what = if self.phase < Phase::Receiving {
                format!("chunk {chunk} before Go")
            } else {
                format!("chunk {chunk} out of range")
            };
            let e = SessionError::Protocol {
                peer: self.link.peer.clone(),
                what,
            };
            self.link.fail(now, e);
            self.flush_failure();
            return Arrival::Refused;
        }
        self.count_frame(now, stream);
        let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
        if self.expected.contains(chunk) && self.seen[word] & bit == 0 {
            self.seen[word] |= bit;
            self.distinct += 1;
            self.writing += 1;
            Arrival::Write
        } else {
            self.stats.duplicates += 1;
            Arrival::Duplicate
        }
    }

    /// A part frame of `chunk` arrived whole on `stream` with the bytes `range` (its
    /// header checked against the layout by the driver): [`Arrival::Write`] if it was
    /// asked for and is not here yet (then report [`SinkSession::chunk_written`]).
    pub fn arrived_part(
        &mut self,
        now: Instant,
        stream: u16,
        chunk: u64,
        range: PartRange,
    ) -> Arrival {
        let Some(s) = self.streams.get(stream as usize) else {
            return Arrival::Refused;
        };
        if s.join != Join::Live || !self.link.live() {
            return Arrival::Refused;
        }
        if self.phase < Phase::Receiving || !self.on_demand || !self.uses(features::PARTS) {
            let e = SessionError::Protocol {
                peer: self.link.peer.clone(),
                what: format!(
                    "a part of chunk {chunk}, which only a request-driven session using the parts feature asks for"
                ),
            };
            self.link.fail(now, e);
            self.flush_failure();
            return Arrival::Refused;
        }
        self.count_frame(now, stream);
        match self.parts_out.get_mut(&(chunk, range)) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.parts_out.remove(&(chunk, range));
                }
                self.n_parts_out -= 1;
                self.writing += 1;
                Arrival::Write
            }
            None => {
                // Sent again after a stream broke, and here already (or not asked for:
                // harmless, dropped).
                self.stats.duplicates += 1;
                Arrival::Duplicate
            }
        }
    }

    /// A whole frame came on `stream`: counted, and acknowledged (with the count).
    fn count_frame(&mut self, now: Instant, stream: u16) {
        let s = &mut self.streams[stream as usize];
        s.frames += 1;
        s.last_frame = now;
        self.progress = now;
        self.commands.push_back(SinkCommand::Ack {
            stream,
            frames: s.frames,
        });
    }

    /// A part [`SinkSession::arrived_part`] said to write is written.
    pub fn part_written(&mut self, _now: Instant) {
        self.writing = self.writing.saturating_sub(1);
    }

    /// A chunk [`Arrival::Write`] said to write is written.
    pub fn chunk_written(&mut self, _now: Instant, chunk: u64) {
        if self.writing == 0 {
            return;
        }
        self.writing -= 1;
        if self.reports_stored() && chunk >= self.written_below {
            self.written_above.insert(chunk);
            self.advance_written();
            self.report_stored();
        }
        self.check_complete();
    }

    /// Whether this side says how far the written chunks reach (`Stored`): a growing
    /// manifest's session with feature `CONTINUOUS`, not request-driven.
    fn reports_stored(&self) -> bool {
        self.growth.is_some() && !self.on_demand && self.uses(features::CONTINUOUS)
    }

    /// Moves `written_below` over the chunks written and those not expected.
    fn advance_written(&mut self) {
        while self.written_below < self.n_chunks {
            if self.written_above.remove(&self.written_below) {
                self.written_below += 1;
            } else if !self.expected.contains(self.written_below) {
                self.written_below = self
                    .expected
                    .next_from(self.written_below)
                    .unwrap_or(self.n_chunks)
                    .min(self.n_chunks);
            } else {
                break;
            }
        }
    }

    /// (feature `CONTINUOUS`, growing manifest) Tells the source how far the written
    /// chunks reach once they pass the end of a part.
    fn report_stored(&mut self) {
        if !self.reports_stored() || !self.link.live() {
            return;
        }
        let mut passed = false;
        while let Some(&end) = self.part_ends.first() {
            if end > self.written_below {
                break;
            }
            self.part_ends.pop_first();
            passed = true;
        }
        if passed && self.written_below > self.stored_sent {
            self.stored_sent = self.written_below;
            self.link.send(Control::Stored(self.written_below));
        }
    }

    /// Every chunk expected so far arrived.
    fn all_arrived(&self) -> bool {
        self.phase >= Phase::Receiving
            && self.distinct >= self.expected.len()
            && self.n_parts_out == 0
    }

    /// Nothing a stream brings can matter any more: every chunk arrived and no more
    /// can be expected (a growing manifest is complete and prepared for; a
    /// request-driven session is closed).
    fn settled(&self) -> bool {
        if self.on_demand {
            return self.phase >= Phase::Reporting;
        }
        self.all_arrived()
            && (self.growth.is_none() || self.sealed && self.n_chunks >= self.announced)
    }

    fn check_complete(&mut self) {
        if self.phase == Phase::Receiving
            && !self.on_demand
            && self.settled()
            && self.writing == 0
            && self.link.live()
        {
            self.phase = Phase::Finishing;
            self.link.joins_done();
            self.events.push_back(SinkEvent::Complete);
        }
    }

    /// The sink is finalised: sends `Done`. A request-driven session is closed with it
    /// whenever the sink is done with it (chunks on their way are acknowledged, not
    /// expected any more).
    pub fn finished(&mut self, summary: Summary) {
        let closing = self.on_demand && self.phase == Phase::Receiving;
        if self.phase != Phase::Finishing && !closing || !self.link.live() {
            return;
        }
        if closing {
            self.link.joins_done();
        }
        self.link.send(Control::Done(summary));
        self.phase = Phase::Reporting;
        self.check_finished();
    }

    fn check_finished(&mut self) {
        if self.phase == Phase::Reporting {
            if let Some(r) = self.report.take() {
                self.link.finish();
                for (i, s) in self.streams.iter_mut().enumerate() {
                    if matches!(s.join, Join::Live | Join::Pending) {
                        s.join = Join::Ended;
                        self.commands
                            .push_back(SinkCommand::Close { stream: i as u16 });
                    }
                }
                self.events.push_back(SinkEvent::Done(r));
            }
        }
    }

    /// Stream `stream` ended with `END`, saying it carried `sent` chunk frames.
    pub fn stream_end(&mut self, now: Instant, stream: u16, sent: u64) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if s.join != Join::Live || !self.link.live() {
            return;
        }
        if sent != s.frames {
            let e = SessionError::Protocol {
                peer: self.link.peer.clone(),
                what: format!("stream says it sent {sent} chunks, {} arrived", s.frames),
            };
            self.link.fail(now, e);
            return self.flush_failure();
        }
        s.join = Join::Ended;
        self.commands.push_back(SinkCommand::Close { stream });
        self.check_streams_left(now, None);
    }

    /// A data stream failed (its join, a read, the connection).
    pub fn stream_failed(&mut self, now: Instant, stream: u16, error: E) {
        let Some(s) = self.streams.get(stream as usize) else {
            return;
        };
        if matches!(s.join, Join::Lost | Join::Ended) || !self.link.live() {
            return;
        }
        if self.settled() {
            // What happens on a stream now cannot change the data.
            self.streams[stream as usize].join = Join::Lost;
            self.commands.push_back(SinkCommand::Close { stream });
            return;
        }
        if error.ends_session() || s.join == Join::Pending && self.link.side == Side::Dialer {
            self.link.fail(now, SessionError::Stream { stream, error });
            return self.flush_failure();
        }
        self.lose(now, stream, SessionError::Stream { stream, error });
    }

    fn lose(&mut self, now: Instant, stream: u16, error: SessionError<E>) {
        self.streams[stream as usize].join = Join::Lost;
        self.stats.streams_lost += 1;
        self.commands.push_back(SinkCommand::Close { stream });
        self.check_streams_left(now, Some((stream, error)));
    }

    /// Fails the session when no stream is left to bring the chunks still expected.
    fn check_streams_left(&mut self, now: Instant, lost: Option<(u16, SessionError<E>)>) {
        if self.settled() {
            return;
        }
        let left = self
            .streams
            .iter()
            .filter(|s| matches!(s.join, Join::Live | Join::Pending))
            .count();
        match lost {
            Some((_, e)) if left == 0 => self.link.fail(now, e),
            Some((stream, error)) => self
                .events
                .push_back(SinkEvent::StreamLost { stream, error }),
            // The source ended its streams before its last part's `Grow` arrived: that
            // part adds no chunks (else the source could not have ended them).
            None if left == 0 && self.growth.is_some() && !self.sealed && self.all_arrived() => {}
            None if left == 0 => {
                let e = SessionError::Protocol {
                    peer: self.link.peer.clone(),
                    what: format!(
                        "streams ended after {} of {} chunks",
                        self.distinct,
                        self.expected.len()
                    ),
                };
                self.link.fail(now, e);
            }
            None => {}
        }
        self.flush_failure();
    }

    /// The driver failed: the session ends.
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

    fn idle_deadline(&self, s: &Stream) -> Option<Instant> {
        let idle: Duration = self.link.timing.idle?;
        // Request-driven, the source sends on the streams it likes (often one), a
        // tuned source on those its tuner chose, and a growing manifest's part of a
        // chunk or two goes on the first streams: a stream is idle only when none
        // brings anything; a stream stuck with a chunk while others deliver is the
        // source's to find (its stall limit).
        let last = if self.on_demand || self.uses(features::TUNING) || self.growth.is_some() {
            s.last_frame.max(self.progress)
        } else {
            s.last_frame
        };
        (s.join == Join::Live && self.phase >= Phase::Receiving && !self.all_arrived())
            .then(|| last + idle)
    }

    /// When [`SinkSession::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.link.poll_timeout();
        if self.link.live() {
            for d in self.streams.iter().filter_map(|s| self.idle_deadline(s)) {
                t = Some(t.map_or(d, |t| t.min(d)));
            }
        }
        t
    }

    /// Handles every deadline due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.link.on_timeout(now);
        if self.link.live() {
            let idle: Vec<u16> = (0..self.streams.len())
                .filter(|&i| {
                    self.idle_deadline(&self.streams[i])
                        .is_some_and(|d| now >= d)
                })
                .map(|i| i as u16)
                .collect();
            for i in idle {
                if !self.link.live() {
                    break;
                }
                let e = SessionError::Idle {
                    peer: self.link.peer.clone(),
                    stream: i,
                    secs: self.link.timing.idle.unwrap_or_default().as_secs(),
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
    pub fn poll_command(&mut self) -> Option<SinkCommand> {
        self.commands.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<SinkEvent<E>> {
        self.events.pop_front()
    }

    fn flush_failure(&mut self) {
        if let Some(e) = self.link.failure.take() {
            for (i, s) in self.streams.iter_mut().enumerate() {
                if matches!(s.join, Join::Live | Join::Pending) {
                    s.join = Join::Lost;
                    self.commands
                        .push_back(SinkCommand::Close { stream: i as u16 });
                }
            }
            self.events.push_back(SinkEvent::Failed(e));
        }
    }
}
