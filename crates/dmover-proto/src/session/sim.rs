//! A deterministic in-memory network for the role machines: a dialer and an acceptor
//! wired together through control and data-stream queues with latency, simulated
//! read, send and write times, and injected faults, on a simulated clock.
//!
//! It drives the machines the way a real driver must (the same calls in the same
//! order), so a whole session — handshake, manifest, resume, chunks, losses, the end
//! and errors both ways — runs in microseconds and always the same way. The pair tests
//! (`tests/pair.rs`) and the `session_pair` fuzz target use it; it is no transport.
//!
//! What it models: every message and frame takes [`Config::latency`] one way, in
//! order per queue; a source reads a chunk into one of [`Config::buffers`] buffers in
//! [`Config::read`], writes it on its stream in [`Config::send`] (the buffer is free
//! again then) and the sink writes it to storage in [`Config::write`]; closing a data
//! stream is seen by the other side one latency later, unless the stream is silent.
//!
//! The optional features: [`Config::parts`] sends a growing manifest in parts (the
//! simulated sink prepares for each part at once), [`Config::wants`] has the sink ask
//! for chunks, and [`Config::on_demand`] makes the session request-driven, the sink
//! closing it once everything it wanted is written.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::{
    AcceptEvent, Acceptance, Arrival, Cause, ChunkMeta, ChunkSet, Dial, Limits, SessionError,
    SinkCommand, SinkEvent, SinkSession, SourceCommand, SourceEvent, SourceSession, State,
    StreamStats, Timing,
};
use crate::control::{
    Auth, AuthMethod, AuthOk, Control, Credential, ErrorCode, Have, Hello, Op, Open, Plan,
    SendReport, SessionInfo, SessionOptions, Summary, Welcome,
};
use crate::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals};

/// The error type the simulated drivers report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    /// Its class.
    pub code: ErrorCode,
    /// Its rank ([`Cause::rank`]).
    pub rank: u8,
    /// Whether a stream failing with it ends the session.
    pub ends: bool,
    /// Its text.
    pub text: String,
}

impl SimError {
    fn closed(what: &str) -> Self {
        SimError {
            code: ErrorCode::Aborted,
            rank: 1,
            ends: false,
            text: format!("{what}: connection closed"),
        }
    }

    fn io(text: String) -> Self {
        SimError {
            code: ErrorCode::Io,
            rank: 4,
            ends: false,
            text,
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Cause for SimError {
    fn code(&self) -> ErrorCode {
        self.code
    }
    fn rank(&self) -> u8 {
        self.rank
    }
    fn ends_session(&self) -> bool {
        self.ends
    }
}

/// Something that goes wrong, at a simulated time after the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Data stream `stream` breaks: both ends see it fail (one latency apart).
    Break {
        /// The stream.
        stream: u16,
        /// When.
        at: Duration,
    },
    /// Data stream `stream` goes silent: nothing on it arrives any more, both ways,
    /// and neither end is told.
    Silence {
        /// The stream.
        stream: u16,
        /// When.
        at: Duration,
    },
    /// The control connection goes silent both ways.
    ControlSilence {
        /// When.
        at: Duration,
    },
    /// The control connection breaks: both ends see it close.
    ControlBreak {
        /// When.
        at: Duration,
    },
    /// Data stream `stream` never joins.
    NoJoin {
        /// The stream.
        stream: u16,
    },
    /// The sink's storage fails writing `chunk`.
    WriteError {
        /// The chunk.
        chunk: u64,
    },
    /// The source's storage fails reading `chunk`.
    ReadError {
        /// The chunk.
        chunk: u64,
    },
    /// The acceptor refuses the dialer's credential.
    Refuse,
    /// A data stream's frames are corrupt in a way that ends the session.
    Corrupt {
        /// The stream.
        stream: u16,
        /// When.
        at: Duration,
    },
}

/// A simulated session.
#[derive(Debug, Clone)]
pub struct Config {
    /// The dialer is the source (a push); else the sink (a pull).
    pub push: bool,
    /// Data streams asked for.
    pub streams: u16,
    /// Chunks in the dataset's layout.
    pub chunks: u64,
    /// Chunks the sink holds from an earlier attempt (resume when not empty).
    pub held: Vec<u64>,
    /// One-way latency of every queue.
    pub latency: Duration,
    /// Time to read a chunk from storage.
    pub read: Duration,
    /// Time to write a chunk on a data stream.
    pub send: Duration,
    /// Time to write a chunk to storage.
    pub write: Duration,
    /// The source's chunk buffers.
    pub buffers: usize,
    /// Unacknowledged chunks per stream.
    pub window: usize,
    /// What goes wrong.
    pub faults: Vec<Fault>,
    /// The machines' limits.
    pub timing: Timing,
    /// The sink's manifest limits.
    pub limits: Limits,
    /// Regular files in the manifest (besides its root directory).
    pub files: u32,
    /// The features the dialer offers and the acceptor speaks (see
    /// [`super::features`]).
    pub features: u64,
    /// A growing manifest in this many parts (0: one whole manifest; needs
    /// [`super::features::GROWING_MANIFEST`]): the chunks and files are split evenly
    /// between the parts, the first sent as soon as the session is open, each next one
    /// [`Config::part_every`] later. Held chunks are those of the first part.
    pub parts: u32,
    /// Time between the parts of a growing manifest.
    pub part_every: Duration,
    /// Chunks the sink asks for ([`SinkSession::want`]), each list at its time after
    /// the sink is prepared (needs [`super::features::RANGES`]).
    pub wants: Vec<(Duration, Vec<u64>)>,
    /// The session is request-driven ([`SinkSession::ready_on_demand`]): the sink
    /// closes it once its last wants are written.
    pub on_demand: bool,
    /// At `Go`, the source sends on this many streams only and tells the sink
    /// ([`SourceSession::set_active`], [`SourceSession::tuned`]; feature `TUNING`).
    pub active: Option<u16>,
    /// The source's metadata of its entries ([`SourceSession::push_meta`]; sent
    /// with feature `METADATA`).
    pub meta: Vec<crate::manifest::EntryMeta>,
    /// Early data, taking the acceptor's session id 7 and salt 5: a push
    /// ([`SourceSession::dial_early`]) joins its streams at once and sends without
    /// waiting for the answers; a pull ([`SinkSession::dial_early`], offering
    /// [`super::features::EARLY`]) joins its streams at once, and the acceptor's source
    /// sends without waiting for `Go`. The acceptor holds joins until it opened the
    /// session, and the sink reads frames only once it said `Go`, as real drivers do.
    pub early: bool,
    /// Time the sink takes to prepare for the manifest before it says `Go` (its
    /// storage, on a disk thread in a real driver).
    pub prepare: Duration,
    /// The dialer's options say `continue_on_error` (the source's report then waits
    /// for every acknowledgement).
    pub continue_on_error: bool,
    /// The sink's acknowledgements leave this long after the machine asks for them,
    /// and are lost when the sink closes the stream first (a real driver's ack writer
    /// may not have flushed when the session ends).
    pub ack_delay: Duration,
    /// Added to [`Config::latency`] on the control connection: what a side sends there
    /// arrives after what it sent on the data streams at the same time.
    pub control_delay: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            push: true,
            streams: 4,
            chunks: 64,
            held: Vec::new(),
            latency: Duration::from_millis(10),
            read: Duration::from_micros(500),
            send: Duration::from_micros(800),
            write: Duration::from_micros(600),
            buffers: 8,
            window: 4,
            faults: Vec::new(),
            timing: Timing::default(),
            limits: Limits::default(),
            files: 3,
            features: 0,
            parts: 0,
            part_every: Duration::from_millis(50),
            wants: Vec::new(),
            on_demand: false,
            active: None,
            meta: Vec::new(),
            early: false,
            prepare: Duration::ZERO,
            continue_on_error: false,
            ack_delay: Duration::ZERO,
            control_delay: Duration::ZERO,
        }
    }
}

/// How a side's session ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Still running when the simulation stopped.
    Running,
    /// Finished; the source has the sink's summary, the sink the source's report.
    Finished,
    /// Failed with this error.
    Failed(SessionError<SimError>),
}

/// What a simulated session did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The source's end.
    pub source: Outcome,
    /// The sink's end.
    pub sink: Outcome,
    /// When each ended, after the start.
    pub source_at: Option<Duration>,
    /// When the sink ended.
    pub sink_at: Option<Duration>,
    /// How often the sink wrote each chunk.
    pub writes: BTreeMap<u64, u32>,
    /// The chunks the sink expected.
    pub expected: ChunkSet,
    /// The source's stream counts.
    pub source_stats: StreamStats,
    /// The sink's stream counts.
    pub sink_stats: StreamStats,
    /// The summary the source received.
    pub summary: Option<Summary>,
    /// The report the sink received.
    pub send_report: Option<SendReport>,
    /// Chunks read from storage (again ones included).
    pub reads: u64,
    /// Control messages delivered, by name, each way (dialer to acceptor first).
    pub messages: (Vec<&'static str>, Vec<&'static str>),
    /// Simulation steps taken.
    pub steps: u64,
    /// The chunks the sink was told to write, in order.
    pub write_order: Vec<u64>,
    /// When each of those arrived, after the start.
    pub write_times: Vec<Duration>,
    /// The chunk ranges the sink's manifest grew by after its first part.
    pub grown: Vec<Range<u64>>,
    /// The chunk size of each of those parts, as the sink heard it.
    pub part_chunks: Vec<u32>,
    /// The chunk size the source named for each later part it sent (feature
    /// PART_CHUNKS, where the session was known to use it; else the session's).
    pub named_chunks: Vec<u32>,
    /// Frames the sink received on each stream.
    pub frames: BTreeMap<u16, u64>,
    /// The tuning decisions the sink heard of.
    pub tuned: Vec<crate::control::Tuned>,
    /// The metadata the sink was handed (feature `METADATA`).
    pub meta: Vec<crate::manifest::EntryMeta>,
    /// The source's [`SourceSession::stored_below`] when it finished.
    pub stored_below: Option<u64>,
    /// The limits each side heard from the other (feature `LIMITS`): the dialer's,
    /// as the acceptor heard them, and the acceptor's answer, as the dialer heard it.
    pub limits: (
        Option<crate::control::SessionLimits>,
        Option<crate::control::SessionLimits>,
    ),
}

/// The limits a simulated dialer sends (feature `LIMITS`).
pub fn dialer_limits() -> crate::control::SessionLimits {
    crate::control::SessionLimits {
        bwlimit: 1_000_000,
        congestion: "reno".into(),
        refused: String::new(),
    }
}

/// A simulated acceptor's answer to the dialer's limits `l`.
pub fn acceptor_limits(l: &crate::control::SessionLimits) -> crate::control::SessionLimits {
    crate::control::SessionLimits {
        bwlimit: 500_000,
        congestion: l.congestion.clone(),
        refused: String::new(),
    }
}

impl Report {
    /// Whether both sides finished.
    pub fn finished(&self) -> bool {
        self.source == Outcome::Finished && self.sink == Outcome::Finished
    }

    /// Chunks written other than exactly once each: (missing, written twice or
    /// unexpected).
    pub fn write_errors(&self) -> (Vec<u64>, Vec<u64>) {
        let missing = self
            .expected
            .iter()
            .filter(|k| !self.writes.contains_key(k))
            .collect();
        let extra = self
            .writes
            .iter()
            .filter(|(k, n)| **n != 1 || !self.expected.contains(**k))
            .map(|(k, _)| *k)
            .collect();
        (missing, extra)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Party {
    Dialer,
    Acceptor,
}

impl Party {
    fn other(self) -> Party {
        match self {
            Party::Dialer => Party::Acceptor,
            Party::Acceptor => Party::Dialer,
        }
    }
}

#[derive(Debug)]
enum Ev {
    Ctrl(Party, Control),
    CtrlClosed(Party),
    Joined(Party, u16),
    ReadDone(u64),
    SendDone(u16, u64),
    Frame(u16, u64),
    End(u16, u64),
    Ack(u16, u64),
    /// The sink's driver writes an acknowledgement it held back ([`Config::ack_delay`]).
    AckOut(u16, u64),
    StreamFailed(Party, u16, SimError),
    WriteDone(u64),
    Fault(usize),
    Part(u32),
    Want(usize),
    /// The sink is prepared.
    Prepared(Party),
}

enum Role {
    Accepting(Acceptance<SimError>),
    Source(SourceSession<SimError>),
    Sink(SinkSession<SimError>),
}

#[derive(Debug, Default, Clone, Copy)]
struct StreamNet {
    silent: bool,
    /// Closed by the source / the sink.
    closed: [bool; 2],
}

/// The simulation.
pub struct Sim {
    cfg: Config,
    t0: Instant,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    slots: Vec<Option<Ev>>,
    dialer: Role,
    acceptor: Option<Role>,
    control_silent: bool,
    control_closed: [bool; 2],
    nets: Vec<StreamNet>,
    free: usize,
    report: Report,
    expected: ChunkSet,
    resume: bool,
    /// The chunks of the first part (all of them without growth).
    first: u64,
    /// Wants made so far; the sink closed a request-driven session.
    wants_made: usize,
    closed: bool,
    /// Joins that came before the acceptor opened the session, frames and ends before
    /// the sink said `Go`: handed over then, in order.
    held_back: Vec<Ev>,
    /// The sink said `Go` (or `OnDemand`).
    sink_go: bool,
    /// Parts of a growing manifest that came while the sink prepared.
    grown_later: Vec<(Range<u64>, u32)>,
}

/// The chunk size the source names for every other later part of a growing
/// manifest (feature PART_CHUNKS), a quarter of the session's.
pub const PART_CHUNK: u32 = 256 << 10;

const SOURCE: usize = 0;
const SINK: usize = 1;

impl Sim {
    /// Sets up a session as `cfg` says.
    pub fn new(cfg: Config) -> Self {
        // The EARLY bit is the early pull's (a sink that offers it never says
        // `OnDemand`), whatever the features asked for.
        let mut cfg = cfg;
        if cfg.early && !cfg.push {
            cfg.features |= super::features::EARLY;
        } else {
            cfg.features &= !super::features::EARLY;
        }
        // An early push offers no negotiated bit: it assumes a `Session` granting
        // the base features it offered.
        if cfg.early && cfg.push {
            cfg.features &= super::features::BASE;
        }
        let t0 = Instant::now();
        let all = ChunkSet::all(cfg.chunks);
        let first = part_bounds(&cfg, 0).0;
        let held: ChunkSet = cfg.held.iter().copied().filter(|&k| k < first).collect();
        let expected: ChunkSet = if cfg.on_demand {
            cfg.wants
                .iter()
                .flat_map(|(_, w)| w.iter().copied())
                .collect::<std::collections::BTreeSet<u64>>()
                .into_iter()
                .collect()
        } else {
            all.iter().filter(|k| !held.contains(*k)).collect()
        };
        let resume = !cfg.held.is_empty();
        let open = Open {
            op: if cfg.push {
                Op::Push {
                    dest: b"d".to_vec(),
                }
            } else {
                Op::Pull {
                    sources: vec![b"s".to_vec()],
                }
            },
            streams: cfg.streams,
            chunk_size: 1 << 20,
            checksum: true,
            direct_io: crate::control::DirectIo::Never,
            protection: crate::control::DataProtection::Authenticated,
            features: cfg.features,
        };
        let dial = Dial {
            hello: Hello {
                software: "sim".into(),
                nonce: [1; 32],
            },
            auth: Auth {
                user: "u".into(),
                credential: Credential::Token { proof: [2; 32] },
            },
            open,
            options: SessionOptions {
                resume,
                journal: true,
                fsync: false,
                verify: true,
                continue_on_error: cfg.continue_on_error,
                heartbeat_ms: cfg.timing.heartbeat.as_millis() as u32,
            },
            server_proof: Some([3; 32]),
            limits: dialer_limits(),
        };
        let dialer = if cfg.push {
            let mut s = if cfg.early {
                SourceSession::dial_early(t0, "acceptor", cfg.timing, dial, 7, [5; 32])
            } else {
                SourceSession::dial(t0, "acceptor", cfg.timing, dial)
            };
            s.set_window(cfg.window);
            if cfg.parts == 0 {
                let entries = manifest(cfg.files);
                s.push_manifest(&entries);
                s.push_meta(cfg.meta.clone());
                s.end_manifest(totals(&entries), all.clone());
                s.set_layout_chunks(cfg.chunks);
            }
            Role::Source(s)
        } else {
            Role::Sink(if cfg.early {
                SinkSession::dial_early(t0, "acceptor", cfg.timing, cfg.limits, dial, 7, [5; 32])
            } else {
                SinkSession::dial(t0, "acceptor", cfg.timing, cfg.limits, dial)
            })
        };
        let acceptance = Acceptance::new(
            "dialer",
            cfg.timing,
            t0 + cfg.timing.handshake,
            Welcome {
                software: "sim".into(),
                nonce: [4; 32],
                auth: AuthMethod::Required,
            },
        );
        let mut sim = Sim {
            nets: vec![StreamNet::default(); cfg.streams as usize],
            free: cfg.buffers.max(1),
            report: Report {
                source: Outcome::Running,
                sink: Outcome::Running,
                source_at: None,
                sink_at: None,
                writes: BTreeMap::new(),
                expected: expected.clone(),
                source_stats: StreamStats::default(),
                sink_stats: StreamStats::default(),
                summary: None,
                send_report: None,
                reads: 0,
                messages: (Vec::new(), Vec::new()),
                steps: 0,
                write_order: Vec::new(),
                write_times: Vec::new(),
                grown: Vec::new(),
                part_chunks: Vec::new(),
                named_chunks: Vec::new(),
                frames: BTreeMap::new(),
                tuned: Vec::new(),
                meta: Vec::new(),
                stored_below: None,
                limits: (None, None),
            },
            cfg,
            t0,
            now: t0,
            seq: 0,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            dialer,
            acceptor: Some(Role::Accepting(acceptance)),
            control_silent: false,
            control_closed: [false; 2],
            expected,
            resume,
            first,
            wants_made: 0,
            closed: false,
            held_back: Vec::new(),
            sink_go: false,
            grown_later: Vec::new(),
        };
        for (i, f) in sim.cfg.faults.clone().iter().enumerate() {
            let at = match f {
                Fault::Break { at, .. }
                | Fault::Silence { at, .. }
                | Fault::ControlSilence { at }
                | Fault::ControlBreak { at }
                | Fault::Corrupt { at, .. } => *at,
                _ => continue,
            };
            sim.at(t0 + at, Ev::Fault(i));
        }
        if sim.cfg.push && sim.cfg.parts > 0 {
            // A dialing source's first part, in its first flight (features::BASE).
            sim.send_part(0);
        }
        sim.pump();
        sim
    }

    fn at(&mut self, when: Instant, ev: Ev) {
        self.seq += 1;
        self.slots.push(Some(ev));
        self.queue
            .push(Reverse((when, self.seq, self.slots.len() - 1)));
    }

    fn after(&mut self, d: Duration, ev: Ev) {
        let when = self.now + d;
        self.at(when, ev);
    }

    fn role(&mut self, p: Party) -> Option<&mut Role> {
        match p {
            Party::Dialer => Some(&mut self.dialer),
            Party::Acceptor => self.acceptor.as_mut(),
        }
    }

    fn party_of_source(&self) -> Party {
        if self.cfg.push {
            Party::Dialer
        } else {
            Party::Acceptor
        }
    }

    fn end_of(&self, p: Party) -> usize {
        if p == self.party_of_source() {
            SOURCE
        } else {
            SINK
        }
    }

    /// Runs until both sides ended, nothing is left to happen, or `limit` of simulated
    /// time or a million steps passed; returns what happened.
    pub fn run(mut self, limit: Duration) -> Report {
        while self.report.steps < 1_000_000 {
            if self.ended(Party::Dialer) && self.ended(Party::Acceptor) {
                break;
            }
            let next_ev = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let next_timer = [Party::Dialer, Party::Acceptor]
                .into_iter()
                .filter_map(|p| self.timeout(p).map(|t| (t, p)))
                .min();
            let (when, timer) = match (next_ev, next_timer) {
                (None, None) => break,
                (Some(e), Some((t, p))) if t < e => (t, Some(p)),
                (None, Some((t, p))) => (t, Some(p)),
                (Some(e), _) => (e, None),
            };
            if when > self.t0 + limit {
                break;
            }
            self.report.steps += 1;
            self.now = self.now.max(when);
            match timer {
                Some(p) => self.handle_timeout(p),
                None => {
                    let Reverse((_, _, slot)) = self.queue.pop().expect("peeked");
                    let ev = self.slots[slot].take().expect("event once");
                    self.handle(ev);
                }
            }
            self.pump();
        }
        self.report
    }

    fn ended(&self, p: Party) -> bool {
        match p {
            Party::Dialer => state(&self.dialer) != State::Running,
            Party::Acceptor => match &self.acceptor {
                Some(Role::Accepting(a)) => a.state() == State::Failed,
                Some(r) => state(r) != State::Running,
                None => false,
            },
        }
    }

    fn timeout(&self, p: Party) -> Option<Instant> {
        let r = match p {
            Party::Dialer => &self.dialer,
            Party::Acceptor => self.acceptor.as_ref()?,
        };
        match r {
            Role::Accepting(a) => a.poll_timeout(),
            Role::Source(s) => s.poll_timeout(),
            Role::Sink(s) => s.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self, p: Party) {
        let now = self.now;
        match self.role(p) {
            Some(Role::Accepting(a)) => a.handle_timeout(now),
            Some(Role::Source(s)) => s.handle_timeout(now),
            Some(Role::Sink(s)) => s.handle_timeout(now),
            None => {}
        }
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        let lat = self.cfg.latency;
        match ev {
            Ev::Ctrl(p, msg) => {
                if self.control_silent || self.control_closed[p as usize] {
                    return;
                }
                let name = msg.name();
                match p {
                    Party::Acceptor => self.report.messages.0.push(name),
                    Party::Dialer => self.report.messages.1.push(name),
                }
                match self.role(p) {
                    Some(Role::Accepting(a)) => a.handle_control(now, msg),
                    Some(Role::Source(s)) => s.handle_control(now, msg),
                    Some(Role::Sink(s)) => s.handle_control(now, msg),
                    None => {}
                }
            }
            Ev::CtrlClosed(p) => {
                if self.control_silent {
                    return;
                }
                self.control_closed[p as usize] = true;
                let e = SimError::closed("control connection");
                match self.role(p) {
                    Some(Role::Accepting(a)) => a.control_closed(now, e),
                    Some(Role::Source(s)) => s.control_closed(now, e),
                    Some(Role::Sink(s)) => s.control_closed(now, e),
                    None => {}
                }
            }
            Ev::Joined(p, stream) => match self.role(p) {
                Some(Role::Source(s)) => s.stream_joined(now, stream),
                Some(Role::Sink(s)) => s.stream_joined(now, stream),
                // Early data: the session is not open yet.
                Some(Role::Accepting(_)) => self.held_back.push(Ev::Joined(p, stream)),
                None => {}
            },
            Ev::Frame(..) | Ev::End(..) if !self.sink_go => self.held_back.push(ev),
            Ev::ReadDone(chunk) => {
                let fail = self.cfg.faults.contains(&Fault::ReadError { chunk });
                if let Some(Role::Source(s)) = self.role(self.party_of_source()) {
                    if fail {
                        s.fail(
                            now,
                            SimError::io(format!("reading chunk {chunk}: I/O error")),
                        );
                    } else {
                        s.chunk_read(now, chunk, ChunkMeta::default());
                    }
                }
                if fail {
                    self.free += 1;
                }
            }
            Ev::SendDone(stream, chunk) => {
                self.free += 1;
                if let Some(Role::Source(s)) = self.role(self.party_of_source()) {
                    s.chunk_written(now, stream, chunk);
                }
                let net = self.nets[stream as usize];
                if !net.silent && !net.closed[SOURCE] {
                    self.after(lat, Ev::Frame(stream, chunk));
                }
            }
            Ev::Frame(stream, chunk) => {
                let net = self.nets[stream as usize];
                if net.silent || net.closed[SINK] {
                    return;
                }
                let p = self.party_of_source().other();
                let write = self.cfg.write;
                *self.report.frames.entry(stream).or_default() += 1;
                if let Some(Role::Sink(s)) = self.role(p) {
                    if s.arrived(now, stream, chunk) == Arrival::Write {
                        self.report.write_order.push(chunk);
                        self.report.write_times.push(now - self.t0);
                        *self.report.writes.entry(chunk).or_default() += 1;
                        self.after(write, Ev::WriteDone(chunk));
                    }
                }
            }
            Ev::End(stream, sent) => {
                let net = self.nets[stream as usize];
                if net.silent || net.closed[SINK] {
                    return;
                }
                let p = self.party_of_source().other();
                if let Some(Role::Sink(s)) = self.role(p) {
                    s.stream_end(now, stream, sent);
                }
            }
            Ev::AckOut(stream, frames) => {
                let net = self.nets[stream as usize];
                if !net.silent && !net.closed[SOURCE] && !net.closed[SINK] {
                    self.after(lat, Ev::Ack(stream, frames));
                }
            }
            Ev::Ack(stream, frames) => {
                let net = self.nets[stream as usize];
                if net.silent || net.closed[SOURCE] {
                    return;
                }
                if let Some(Role::Source(s)) = self.role(self.party_of_source()) {
                    s.acked(now, stream, frames);
                }
            }
            Ev::StreamFailed(p, stream, e) => {
                let end = self.end_of(p);
                if self.nets[stream as usize].closed[end] {
                    return;
                }
                self.nets[stream as usize].closed[end] = true;
                match self.role(p) {
                    Some(Role::Source(s)) => s.stream_failed(now, stream, e),
                    Some(Role::Sink(s)) => s.stream_failed(now, stream, e),
                    _ => {}
                }
            }
            Ev::WriteDone(chunk) => {
                let fail = self.cfg.faults.contains(&Fault::WriteError { chunk });
                let p = self.party_of_source().other();
                if let Some(Role::Sink(s)) = self.role(p) {
                    if fail {
                        s.fail(
                            now,
                            SimError::io(format!("writing chunk {chunk}: No space left on device")),
                        );
                    } else {
                        s.chunk_written(now, chunk);
                    }
                }
                self.maybe_close();
            }
            Ev::Part(i) => self.send_part(i),
            Ev::Prepared(p) => self.sink_ready(p),
            Ev::Want(i) => {
                let ranges: Vec<Range<u64>> =
                    self.cfg.wants[i].1.iter().map(|&k| k..k + 1).collect();
                self.wants_made += 1;
                let p = self.party_of_source().other();
                if let Some(Role::Sink(s)) = self.role(p) {
                    s.want(now, &ranges);
                }
                self.maybe_close();
            }
            Ev::Fault(i) => match self.cfg.faults[i].clone() {
                Fault::Break { stream, .. } | Fault::Corrupt { stream, .. } => {
                    if stream as usize >= self.nets.len() {
                        return;
                    }
                    let mut e = SimError::closed("data stream");
                    if matches!(self.cfg.faults[i], Fault::Corrupt { .. }) {
                        e = SimError {
                            code: ErrorCode::Checksum,
                            rank: 4,
                            ends: true,
                            text: format!("data stream {stream}: record authentication failed"),
                        };
                    }
                    // The sink sees it at once, the source one latency later.
                    let sink = self.party_of_source().other();
                    self.after(Duration::ZERO, Ev::StreamFailed(sink, stream, e.clone()));
                    self.after(
                        lat,
                        Ev::StreamFailed(sink.other(), stream, SimError::closed("data stream")),
                    );
                }
                Fault::Silence { stream, .. } => {
                    if let Some(n) = self.nets.get_mut(stream as usize) {
                        n.silent = true;
                    }
                }
                Fault::ControlSilence { .. } => self.control_silent = true,
                Fault::ControlBreak { .. } => {
                    self.after(Duration::ZERO, Ev::CtrlClosed(Party::Dialer));
                    self.after(Duration::ZERO, Ev::CtrlClosed(Party::Acceptor));
                }
                _ => {}
            },
        }
    }

    /// Drains every machine's output until nothing is left: control messages,
    /// commands and events, answering the events as a driver would.
    fn pump(&mut self) {
        loop {
            let mut any = false;
            for p in [Party::Dialer, Party::Acceptor] {
                any |= self.pump_one(p);
            }
            if !any {
                break;
            }
        }
    }

    fn pump_one(&mut self, p: Party) -> bool {
        let now = self.now;
        let lat = self.cfg.latency;
        let mut any = false;
        // Control messages.
        loop {
            let msg = match self.role(p) {
                Some(Role::Accepting(a)) => a.poll_transmit(),
                Some(Role::Source(s)) => s.poll_transmit(),
                Some(Role::Sink(s)) => s.poll_transmit(),
                None => None,
            };
            let Some(msg) = msg else { break };
            any = true;
            if !self.control_closed[p as usize] {
                self.after(lat + self.cfg.control_delay, Ev::Ctrl(p.other(), msg));
            }
        }
        // Acceptor's handshake events.
        if let Some(Role::Accepting(a)) = self.role(p) {
            let mut evs = Vec::new();
            while let Some(e) = a.poll_event() {
                evs.push(e);
            }
            for e in evs {
                any = true;
                self.on_accept_event(e);
            }
            return any;
        }
        let source = matches!(self.role(p), Some(Role::Source(_)));
        if source {
            any |= self.pump_source(p, now, lat);
        } else {
            any |= self.pump_sink(p, now, lat);
        }
        any
    }

    fn on_accept_event(&mut self, e: AcceptEvent<SimError>) {
        let now = self.now;
        match e {
            AcceptEvent::Verify { .. } => {
                let refuse = self.cfg.faults.contains(&Fault::Refuse);
                if let Some(Role::Accepting(a)) = self.acceptor.as_mut() {
                    if refuse {
                        a.fail(
                            now,
                            SimError {
                                code: ErrorCode::Auth,
                                rank: 4,
                                ends: true,
                                text: "authentication failed for user u".into(),
                            },
                        );
                    } else {
                        a.verified(
                            now,
                            AuthOk {
                                proof: Some([3; 32]),
                            },
                        );
                    }
                }
            }
            AcceptEvent::Opened(open) => {
                // Everything the acceptance still had to send goes first.
                let mut msgs = Vec::new();
                if let Some(Role::Accepting(a)) = self.acceptor.as_mut() {
                    msgs.extend(std::iter::from_fn(|| a.poll_transmit()));
                }
                for m in msgs {
                    self.after(self.cfg.latency, Ev::Ctrl(Party::Dialer, m));
                }
                let info = SessionInfo {
                    id: 7,
                    salt: [5; 32],
                    streams: open.streams.min(128),
                    chunk_size: open.chunk_size,
                    features: super::features::negotiate(open.features, self.cfg.features),
                };
                let deadline = self.t0 + self.cfg.timing.handshake;
                let timing = self.cfg.timing;
                let role = match open.op {
                    Op::Push { .. } => {
                        let mut s =
                            SinkSession::accept(now, "dialer", timing, self.cfg.limits, deadline);
                        s.grant(now, info);
                        Role::Sink(s)
                    }
                    _ => {
                        let mut s = SourceSession::accept(now, "dialer", timing, deadline);
                        s.set_window(self.cfg.window);
                        s.grant(now, info);
                        if self.cfg.parts == 0 {
                            let entries = manifest(self.cfg.files);
                            s.push_manifest(&entries);
                            s.push_meta(self.cfg.meta.clone());
                            s.end_manifest(totals(&entries), ChunkSet::all(self.cfg.chunks));
                            s.set_layout_chunks(self.cfg.chunks);
                        }
                        Role::Source(s)
                    }
                };
                self.acceptor = Some(role);
                self.replay_held_back();
                if self.cfg.parts > 0 && !self.cfg.push {
                    self.send_part(0);
                }
            }
            AcceptEvent::Failed(e) => {
                let at = Some(now - self.t0);
                if self.cfg.push {
                    self.report.sink = Outcome::Failed(e);
                    self.report.sink_at = at;
                } else {
                    self.report.source = Outcome::Failed(e);
                    self.report.source_at = at;
                }
                self.close_control(Party::Acceptor);
            }
        }
    }

    fn close_control(&mut self, p: Party) {
        if !self.control_closed[p as usize] {
            self.control_closed[p as usize] = true;
            let t = self.cfg.latency + self.cfg.control_delay;
            self.after(t, Ev::CtrlClosed(p.other()));
        }
    }

    fn open_stream(&mut self, p: Party, stream: u16) {
        if self.cfg.faults.contains(&Fault::NoJoin { stream }) {
            return;
        }
        let lat = self.cfg.latency;
        self.after(lat, Ev::Joined(p.other(), stream));
        // Early data: the dialer sends behind its join's proof without waiting for
        // the answer (a real push does so always; the simulation only here).
        let answer = if self.cfg.early && self.cfg.push {
            Duration::ZERO
        } else {
            lat * 2
        };
        self.after(answer, Ev::Joined(p, stream));
    }

    fn close_stream(&mut self, p: Party, stream: u16) {
        let end = self.end_of(p);
        let Some(net) = self.nets.get_mut(stream as usize) else {
            return;
        };
        if net.closed[end] {
            return;
        }
        net.closed[end] = true;
        if !net.silent && !net.closed[1 - end] {
            let lat = self.cfg.latency;
            self.after(
                lat,
                Ev::StreamFailed(p.other(), stream, SimError::closed("data stream")),
            );
        }
    }

    fn pump_source(&mut self, p: Party, now: Instant, lat: Duration) -> bool {
        let mut any = false;
        loop {
            let Some(Role::Source(s)) = self.role(p) else {
                return any;
            };
            let cmd = s.poll_command();
            let Some(cmd) = cmd else { break };
            any = true;
            match cmd {
                SourceCommand::Open { stream } => self.open_stream(p, stream),
                SourceCommand::Send { stream, chunk, .. } => {
                    let send = self.cfg.send;
                    self.after(send, Ev::SendDone(stream, chunk));
                }
                SourceCommand::End { stream, sent } => {
                    let net = self.nets[stream as usize];
                    if !net.silent && !net.closed[SINK] {
                        self.after(lat, Ev::End(stream, sent));
                    }
                }
                SourceCommand::Close { stream } => self.close_stream(p, stream),
            }
        }
        loop {
            let Some(Role::Source(s)) = self.role(p) else {
                return any;
            };
            let Some(ev) = s.poll_event() else { break };
            any = true;
            match ev {
                SourceEvent::Opened(_)
                | SourceEvent::Options(_)
                | SourceEvent::StreamLost { .. } => {}
                SourceEvent::Limits(l) => self.heard_limits(p, l),
                SourceEvent::Held(_) => {
                    let first = self.first;
                    let expected: ChunkSet = self.expected.iter().filter(|&k| k < first).collect();
                    if let Some(Role::Source(s)) = self.role(p) {
                        s.planned(now, Plan { stale: Vec::new() }, expected);
                    }
                }
                SourceEvent::Go => {
                    if let (Some(n), Some(Role::Source(s))) = (self.cfg.active, self.role(p)) {
                        s.set_active(now, n);
                        s.tuned(crate::control::Tuned {
                            at_ms: 0,
                            streams: n,
                            rate: 0,
                            reason: "simulated".into(),
                        });
                    }
                }
                SourceEvent::Sent => {
                    if let Some(Role::Source(s)) = self.role(p) {
                        s.report(Vec::new());
                    }
                }
                SourceEvent::Drained => {
                    if let Some(Role::Source(s)) = self.role(p) {
                        s.drained(Vec::new());
                    }
                }
                SourceEvent::Done(summary) => {
                    if let Some(Role::Source(s)) = self.role(p) {
                        self.report.stored_below = Some(s.stored_below());
                    }
                    self.report.summary = Some(summary);
                    self.report.source = Outcome::Finished;
                    self.report.source_at = Some(now - self.t0);
                }
                SourceEvent::Failed(e) => {
                    self.report.source = Outcome::Failed(e);
                    self.report.source_at = Some(now - self.t0);
                }
            }
        }
        // Reads into free buffers.
        while self.free > 0 {
            let Some(Role::Source(s)) = self.role(p) else {
                break;
            };
            let Some(job) = s.poll_read() else { break };
            any = true;
            self.free -= 1;
            self.report.reads += 1;
            let read = self.cfg.read;
            self.after(read, Ev::ReadDone(job.chunk));
        }
        if let Some(Role::Source(s)) = self.role(p) {
            let (st, stats) = (s.state(), s.stats());
            self.report.source_stats = stats;
            if st != State::Running {
                any |= self.drain_and_close(p);
            }
        }
        any
    }

    /// A side heard the other's limits: the acceptor answers as a server would (its
    /// own bandwidth limit, the congestion control asked for).
    fn heard_limits(&mut self, p: Party, l: crate::control::SessionLimits) {
        match p {
            Party::Dialer => self.report.limits.1 = Some(l),
            Party::Acceptor => {
                let answer = acceptor_limits(&l);
                self.report.limits.0 = Some(l);
                match self.role(p) {
                    Some(Role::Source(s)) => s.limits(answer),
                    Some(Role::Sink(s)) => s.limits(answer),
                    Some(Role::Accepting(_)) | None => {}
                }
            }
        }
    }

    fn pump_sink(&mut self, p: Party, now: Instant, lat: Duration) -> bool {
        let mut any = false;
        loop {
            let Some(Role::Sink(s)) = self.role(p) else {
                return any;
            };
            let Some(cmd) = s.poll_command() else { break };
            any = true;
            match cmd {
                SinkCommand::Open { stream } => self.open_stream(p, stream),
                SinkCommand::Ack { stream, frames } => {
                    let net = self.nets[stream as usize];
                    if self.cfg.ack_delay > Duration::ZERO {
                        self.after(self.cfg.ack_delay, Ev::AckOut(stream, frames));
                    } else if !net.silent && !net.closed[SOURCE] && !net.closed[SINK] {
                        self.after(lat, Ev::Ack(stream, frames));
                    }
                }
                SinkCommand::Close { stream } => self.close_stream(p, stream),
            }
        }
        loop {
            let Some(Role::Sink(s)) = self.role(p) else {
                return any;
            };
            let Some(ev) = s.poll_event() else { break };
            any = true;
            let n = self.cfg.chunks;
            let resume = self.resume;
            let (prepare, ready) = (self.cfg.prepare, self.sink_go);
            if let SinkEvent::Grown { chunks, chunk, .. } = &ev {
                if !ready {
                    // Still preparing: when it is done.
                    self.grown_later.push((chunks.clone(), *chunk));
                    continue;
                }
            }
            if let SinkEvent::Manifest(_) = &ev {
                if !resume && !prepare.is_zero() {
                    self.after(prepare, Ev::Prepared(p));
                    continue;
                }
            }
            let Some(Role::Sink(s)) = self.role(p) else {
                return any;
            };
            match ev {
                SinkEvent::Opened(_)
                | SinkEvent::Options(_)
                | SinkEvent::Sparse(_)
                | SinkEvent::Times(_)
                | SinkEvent::StreamLost { .. } => {}
                SinkEvent::Tuned(t) => self.report.tuned.push(t),
                SinkEvent::Limits(l) => self.heard_limits(p, l),
                SinkEvent::Meta(m) => self.report.meta = m,
                SinkEvent::Manifest(_) => {
                    if resume {
                        s.resume(now, vec![Have::default()]);
                    } else {
                        self.sink_ready(p);
                    }
                }
                SinkEvent::Plan(_) => self.sink_ready(p),
                SinkEvent::Grown { chunks, chunk, .. } => {
                    s.grown(now, chunks.end);
                    self.report.grown.push(chunks);
                    self.report.part_chunks.push(chunk);
                }
                SinkEvent::Complete => s.finished(Summary {
                    bytes: n << 20,
                    files: 3,
                    dirs: 1,
                    symlinks: 0,
                    chunks: n,
                    verified: true,
                }),
                SinkEvent::Done(r) => {
                    self.report.send_report = Some(r);
                    self.report.sink = Outcome::Finished;
                    self.report.sink_at = Some(now - self.t0);
                }
                SinkEvent::Failed(e) => {
                    self.report.sink = Outcome::Failed(e);
                    self.report.sink_at = Some(now - self.t0);
                }
            }
        }
        if let Some(Role::Sink(s)) = self.role(p) {
            let (st, stats) = (s.state(), s.stats());
            self.report.sink_stats = stats;
            if st != State::Running {
                any |= self.drain_and_close(p);
            }
        }
        any
    }

    /// The sink is prepared: `Go` (or `OnDemand`) for the first part's chunks, and its
    /// wants are scheduled.
    fn sink_ready(&mut self, p: Party) {
        let now = self.now;
        let first = self.first;
        let expected: ChunkSet = self.expected.iter().filter(|&k| k < first).collect();
        let on_demand = self.cfg.on_demand;
        if let Some(Role::Sink(s)) = self.role(p) {
            if on_demand {
                s.ready_on_demand(now, first);
            } else {
                s.ready(now, expected, first);
            }
        }
        for i in 0..self.cfg.wants.len() {
            let at = self.cfg.wants[i].0;
            self.after(at, Ev::Want(i));
        }
        self.sink_go = true;
        for (chunks, chunk) in std::mem::take(&mut self.grown_later) {
            if let Some(Role::Sink(s)) = self.role(p) {
                s.grown(now, chunks.end);
            }
            self.report.grown.push(chunks);
            self.report.part_chunks.push(chunk);
        }
        self.replay_held_back();
        self.maybe_close();
    }

    /// Hands over what was held back for the acceptor's session or the sink's `Go`
    /// (what must still wait is held back again).
    fn replay_held_back(&mut self) {
        for ev in std::mem::take(&mut self.held_back) {
            self.handle(ev);
        }
    }

    /// A request-driven sink closes the session once it made its last wants and has
    /// every chunk it wanted written.
    fn maybe_close(&mut self) {
        if !self.cfg.on_demand || self.closed || self.wants_made < self.cfg.wants.len() {
            return;
        }
        let p = self.party_of_source().other();
        let n = self.cfg.chunks;
        if let Some(Role::Sink(s)) = self.role(p) {
            if s.outstanding() == 0 && s.state() == State::Running {
                s.finished(Summary {
                    chunks: n,
                    ..Summary::default()
                });
                self.closed = true;
            }
        }
    }

    /// The source sends part `i` of a growing manifest, and schedules the next.
    fn send_part(&mut self, i: u32) {
        let now = self.now;
        let parts = self.cfg.parts;
        let all = manifest(self.cfg.files);
        let (_, prev_entries) = if i == 0 {
            (0, 0)
        } else {
            part_bounds(&self.cfg, i - 1)
        };
        let (chunks, entries) = part_bounds(&self.cfg, i);
        let src = self.party_of_source();
        let mut named = None;
        if let Some(Role::Source(s)) = self.role(src) {
            s.push_manifest(&all[prev_entries..entries]);
            if i > 0 {
                // (feature PART_CHUNKS) Every other later part in chunks of its own,
                // once the session is open and known to use the feature (the
                // drivers hold a dialer's later parts until then).
                let open = s.info().is_some();
                let own = open && i % 2 == 1 && s.uses(super::features::PART_CHUNKS);
                let chunk = if own { PART_CHUNK } else { 1 << 20 };
                if open {
                    s.part_chunk(now, chunk);
                }
                named = Some(chunk);
            }
            s.grow_manifest(now, totals(&all[..entries]), chunks, i + 1 == parts);
        }
        self.report.named_chunks.extend(named);
        if i + 1 < parts {
            let every = self.cfg.part_every;
            self.after(every, Ev::Part(i + 1));
        }
    }

    /// A side that ended sends what it still has and closes its control connection.
    fn drain_and_close(&mut self, p: Party) -> bool {
        if self.control_closed[p as usize] {
            return false;
        }
        let mut msgs = Vec::new();
        loop {
            let m = match self.role(p) {
                Some(Role::Source(s)) => s.poll_transmit(),
                Some(Role::Sink(s)) => s.poll_transmit(),
                _ => None,
            };
            match m {
                Some(m) => msgs.push(m),
                None => break,
            }
        }
        for m in msgs {
            let t = self.cfg.latency + self.cfg.control_delay;
            self.after(t, Ev::Ctrl(p.other(), m));
        }
        self.close_control(p);
        true
    }
}

fn state(r: &Role) -> State {
    match r {
        Role::Accepting(a) => a.state(),
        Role::Source(s) => s.state(),
        Role::Sink(s) => s.state(),
    }
}

/// The end of part `i` of a growing manifest: (chunks, entries of [`manifest`]) of
/// the parts up to it; the whole dataset without growth.
fn part_bounds(cfg: &Config, i: u32) -> (u64, usize) {
    if cfg.parts == 0 {
        return (cfg.chunks, cfg.files as usize + 1);
    }
    let (i, parts) = (u64::from(i) + 1, u64::from(cfg.parts));
    let files = u64::from(cfg.files) * i / parts;
    (cfg.chunks * i / parts, files as usize + 1)
}

/// A manifest of one directory holding `files` files.
pub fn manifest(files: u32) -> Vec<Entry> {
    let mut v = vec![Entry {
        parent: NO_PARENT,
        name: b"s".to_vec(),
        kind: EntryKind::Dir,
        mode: 0o755,
        mtime: Mtime::default(),
    }];
    for i in 0..files {
        v.push(Entry {
            parent: 0,
            name: format!("f{i}").into_bytes(),
            kind: EntryKind::File { size: 1 << 20 },
            mode: 0o644,
            mtime: Mtime::default(),
        });
    }
    v
}

/// The totals of a manifest (it must be valid).
pub fn totals(entries: &[Entry]) -> Totals {
    crate::manifest::validate(entries, u64::MAX).expect("valid manifest")
}
