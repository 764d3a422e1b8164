//! The session rules as sans-IO state machines: one for the side that sends the data
//! ([`SourceSession`]), one for the side that receives it ([`SinkSession`]), and one
//! for the acceptor of a control connection before it knows which of the two it is
//! ([`Acceptance`]).
//!
//! # Goals
//! - Every rule of a session lives here once: the order of the handshake and which
//!   answers are checked, the manifest's limits, the resume negotiation, which chunk
//!   goes on which data stream and how many may be unacknowledged on each, what an
//!   acknowledgement may say, when a stream is lost and what is sent again, heartbeats
//!   and silence, the end of the session and errors both ways.
//! - No I/O and no clock: a driver feeds events (a control message arrived, a stream
//!   joined, a chunk was read, written or acknowledged, a deadline passed) with the
//!   time it read from its own clock, and drains what to do: control messages to send
//!   ([`SourceSession::poll_transmit`]), commands for its streams and storage
//!   ([`SourceSession::poll_command`]), events for the application
//!   ([`SourceSession::poll_event`]) and when to call again
//!   ([`SourceSession::poll_timeout`]). The machines name chunks, never hold payload.
//! - Roles are not sides: which side opened the control connection ([`Side`]) is an
//!   input. A server is the sink of a push and the source of a pull, and either toward
//!   another server.
//! - Deterministic: the same events at the same times give the same outputs, so the
//!   machines are tested by feeding them messages and events (`tests/pair.rs`, the
//!   `session_machines` fuzz target), and whole sessions run on the production drivers
//!   over an in-memory transport on a paused clock (`dmover-core`'s `harness`).
//!
//! # Non-goals
//! Encoding (see [`crate::control`] and [`crate::data`]), authentication cryptography
//! (the driver verifies credentials, see [`crate::auth`]; the dialer's machine checks
//! the acceptor's token proof it is given), storage and sockets.
//!
//! # A session, by role
//! ```text
//! dialer                                         acceptor
//! Hello Auth Open Options [Limits] [source: Manifest* ManifestEnd Meta*] -> (one flight)
//!                                   <-  Welcome AuthOk Session   (Acceptance, then grant)
//! source:  Manifest* ManifestEnd    ->  (when the source is the acceptor, it sends these)
//! sink:    [Have* (resume)]         ->  source: Plan             (resume only)
//! sink:    Go                       ->
//! data streams: CHUNK frames source -> sink, acknowledgements sink -> source, END
//! source:  SendReport (all sent; all acknowledged with continue_on_error)
//! sink:    Done (all written and finalised)
//! Ping both ways once the session is open; Error either way, then close
//! ```
//!
//! ## Optional features
//! Offered in `Open`, granted in `Session` ([`features`]; those of [`features::BASE`]
//! always, so a dialer sends their messages before `Session`); a message that needs a feature the
//! session does not use is a protocol violation ([`features::needed`]).
//! ```text
//! growing manifest (GROWING_MANIFEST): each part ends with Grow instead of one ManifestEnd
//! source:  Manifest* Grow{chunks: n1}                  ->  sink: SinkEvent::Manifest
//! sink:    Go (or OnDemand)                            ->  source sends chunks 0..n1
//! source:  Manifest* Grow{chunks: n2}                  ->  sink: SinkEvent::Grown(n1..n2)
//! sink:    Grown(n2)  (its layout covers n2 chunks)    ->  source sends n1..n2 too
//! source:  ... Manifest* Grow{last}                    ->  no more parts
//! the session ends as above once the last part is sent, confirmed and acknowledged
//!
//! chunk requests (RANGES):
//! sink:    Want{chunks}  (after Go)                    ->  source reads those first
//! request-driven (a mount), RANGES:
//! sink:    OnDemand instead of Go                      ->  source sends nothing unasked
//! sink:    Want{chunks}*                               ->  each chunk sent, again if it was
//! sink:    Done  (whenever it is done)                 ->  source: SendReport once the
//!                                                          chunks on their way are acknowledged
//! ```
//! A later part's chunks are sent only after the sink's `Grown`, because the data
//! streams are not ordered with the control connection: a chunk must never arrive
//! before the part that lays it out. Each part's files start on a fresh chunk, so the
//! layout only ever grows at its end. In an ordinary session `Want` only reorders (a
//! chunk already sent is not sent again, and the sink asks only for chunks it lacks);
//! in a request-driven one every wanted chunk is sent, and a chunk the sink wants
//! again after it arrived is written again.
//!
//! The dialer opens the data streams ([`SourceCommand::Open`], [`SinkCommand::Open`]);
//! the acceptor learns of each join from its driver. A session ends for a side when it
//! has sent its own final message and received the peer's: the source after
//! `SendReport` and `Done`, the sink after `Done` and `SendReport`. The source's report
//! goes once every chunk is written into a stream ([`SourceEvent::Sent`]), so it
//! reaches the sink about with the last chunk, not a round trip after it.
//!
//! # Errors
//! [`SessionError`]: what the machine found (the peer's report, a message out of order,
//! silence, a broken rule) or what the driver reported ([`SessionError::Local`],
//! [`SessionError::Stream`]), with the driver's own error type `E` ([`Cause`]). A side
//! that fails tells its peer with [`Control::Error`] unless the failure is the peer's
//! own report; a failure that is not a root cause (a broken connection, a timeout)
//! waits [`Timing::report_wait`] for the peer's report first, which is then the error.

mod accept;
mod chunks;
mod link;
mod sink;
mod source;
pub mod testkit;
pub mod tune;

pub use accept::{AcceptEvent, Acceptance};
pub use chunks::ChunkSet;
pub use link::Dial;
pub use sink::{Arrival, Limits, SinkCommand, SinkEvent, SinkSession};
pub use source::{ReadJob, SourceCommand, SourceEvent, SourceSession};

use std::fmt;
use std::time::Duration;

use crate::control::{Control, ErrorCode, ErrorMsg};

/// Which side of the control connection a machine is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// It opened the control connection (a client, or a server dialing another server
    /// for a third-party transfer), sends `Hello`, `Auth`, `Open` and `Options`, and
    /// opens the data streams.
    Dialer,
    /// It accepted the control connection, answers with `Welcome`, `AuthOk` and
    /// `Session`, and accepts the data streams.
    Acceptor,
}

/// Optional protocol features, negotiated in `Open` (the dialer's set) and `Session`
/// (the ones both speak): later messages are added behind a bit here instead of a new
/// protocol version each.
pub mod features {
    use crate::control::Control;

    /// A manifest that grows during the session (a streamed walk, continuous mode):
    /// the source ends each part with [`Control::Grow`] instead of one `ManifestEnd`,
    /// and data flows from the first part on.
    pub const GROWING_MANIFEST: u64 = 1;
    /// Chunk requests from the sink ([`Control::Want`]), served ahead of the ordinary
    /// order, and request-driven sessions ([`Control::OnDemand`]) for a mount.
    pub const RANGES: u64 = 2;
    /// The source tunes itself while it sends ([`super::tune`]): it may leave some
    /// data streams idle (the sink counts a stream idle only when none brings
    /// anything) and tells the sink its decisions ([`Control::Tuned`]).
    pub const TUNING: u64 = 4;
    /// Owners and extended attributes (ACLs among them) travel with the manifest
    /// ([`Control::Meta`] after `ManifestEnd`, the last part marked): the sink
    /// prepares once it has them, and applies what its policy allows.
    pub const METADATA: u64 = 8;
    /// Hard links within the transfer: the manifest may hold
    /// [`crate::manifest::EntryKind::HardLink`] entries (a later path of an inode
    /// whose first path is an earlier regular file), which carry no data. Without it
    /// a source sends every path of an inode as a file of its own. With it, too, the
    /// source may list the files that have holes ([`Control::Sparse`]) before
    /// `ManifestEnd`, so the sink keeps them sparse.
    pub const LINKS: u64 = 16;
    /// Continuous mode (`sync --watch`), in a growing manifest's session: the sink
    /// says how far the written chunks reach ([`Control::Stored`]) as they pass the
    /// end of a part, so the source learns when a part's files are complete at the
    /// sink; the source may send newer modification times of directories already in
    /// the manifest ([`Control::Times`]) before its last part, which the sink applies
    /// at the end instead of the manifest's.
    pub const CONTINUOUS: u64 = 32;
    /// The sides tell each other the limits they apply to the data streams
    /// ([`Control::Limits`]): the dialer its bandwidth limit and the congestion
    /// control it asks the acceptor to send with, in its first flight; the acceptor,
    /// in answer, its own bandwidth limit and the congestion control it sends with
    /// (or why it could not use the one asked for).
    pub const LIMITS: u64 = 64;
    /// A file transfer's manifest streamed in parts (with [`GROWING_MANIFEST`]): the
    /// sink takes the source's manifest in parts when the source chooses to send it
    /// so, treats them as one manifest, and takes a part's `Meta` before its `Grow`,
    /// the first part's too. The dialer offers the bit only where a part's late
    /// arrival changes nothing the sink decides: not when the sink resumes or keeps
    /// files it holds (whose answer, `Have`, covers the first part only). In a push
    /// the first part (its entries, metadata and `Grow`) goes in the first flight.
    /// No message of its own.
    pub const STREAMED: u64 = 128;
    /// Parts of chunks, in a request-driven session: the sink may ask for byte ranges
    /// of chunks ([`Control::WantPart`]); the source answers each with a part frame
    /// ([`crate::data::FLAG_PART`]) of those bytes.
    pub const PARTS: u64 = 256;
    /// Early data in a pull (protocol version 8): the dialing sink joins its data
    /// streams with its first flight and will answer the manifest with `Go` (never
    /// `OnDemand`); so the accepting source, once it has the dialer's options and they
    /// do not resume, sends from the manifest's end without waiting for `Go`, and
    /// holds its tuning decisions and its report until `Go` came. No message of its
    /// own. Negotiated (not in [`BASE`]).
    pub const EARLY: u64 = 512;
    /// A streamed manifest cut from a walk that is still running (with [`STREAMED`]
    /// and [`LINKS`]): a part after the first may hold hard links (to a first path in
    /// any part up to it) and may be preceded by [`Control::Sparse`], listing that
    /// part's files that may have holes; the first part's list comes before its
    /// `Grow` as well. Without it, a tree with hard links or holes goes whole, and the
    /// walk ends before the first part goes. No message of its own. Negotiated.
    pub const WALKING: u64 = 1024;
    /// Chunks of their own size for later parts of a growing manifest (with
    /// [`GROWING_MANIFEST`]): the source may send [`Control::PartChunk`] before a
    /// later part's `Grow`, and the part is cut into chunks of that size, at most the
    /// session's (a tree whose small files come after large ones gets small chunks
    /// for them). Negotiated; a dialer offers it only where its storage lays parts
    /// out ([`crate::layout::Layout::extend_with`]).
    pub const PART_CHUNKS: u64 = 2048;
    /// Not a session's: offered in the `Open` of [`crate::control::Op::ThirdPartySync`]
    /// and of an `Op::Grant` for a sync's scope (`Scope::Mirror`, `MirrorSource`), which
    /// a server without it cannot decode (it answers `Error{Protocol}`, and copies
    /// nothing). Never negotiated in a session.
    pub const SYNC_BETWEEN: u64 = 4096;
    /// Not a session's: offered in the `Open` of [`crate::control::Op::PruneKeep`]
    /// (`sync --size-only`, `--ignore-existing` on a push), which a server without it
    /// cannot decode (it answers `Error{Protocol}`, and changes nothing). Never
    /// negotiated in a session.
    pub const KEEP: u64 = 8192;
    /// Not a session's: offered in the `Open` of [`crate::control::Op::Sums`]
    /// (`dmover sum dmover://HOST/PATH`), which a server without it cannot decode (it
    /// answers `Error{Protocol}`). Never negotiated in a session.
    pub const SUMS: u64 = 16384;

    /// The features every acceptor of protocol version 6 speaks and grants whenever
    /// the dialer offers them. A dialer thus knows, as it sends `Open`, which of them
    /// the session uses, and sends their messages in its first flight instead of a
    /// round trip later, behind `Session`: its `Limits`, a push's `Meta`, a streamed
    /// manifest's first `Grow` (with `Meta` and `Sparse` before it). A `Session` that
    /// leaves out one it offered breaks the protocol. Bits defined later are
    /// negotiated ([`negotiate`]), and their messages wait for `Session`.
    pub const BASE: u64 = GROWING_MANIFEST
        | RANGES
        | TUNING
        | METADATA
        | LINKS
        | CONTINUOUS
        | LIMITS
        | STREAMED
        | PARTS;

    /// The features this build's drivers (`dmover_core::drive`) speak and offer: the
    /// base, as every version 6 build, and [`EARLY`], [`WALKING`] and
    /// [`PART_CHUNKS`].
    pub const SUPPORTED: u64 = BASE | EARLY | WALKING | PART_CHUNKS;

    /// The features the role machines implement: what a driver may offer once it
    /// handles their events too (the simulator and the pair tests offer these).
    pub const MACHINES: u64 = BASE | EARLY | WALKING | PART_CHUNKS;

    /// The features a session uses: those both sides speak, and always those of
    /// [`BASE`] the dialer offers. Bits the machines do not know are never granted.
    pub fn negotiate(dialer: u64, acceptor: u64) -> u64 {
        dialer & (acceptor | BASE) & MACHINES
    }

    // Every version 6 build speaks the base.
    const _: () = assert!(SUPPORTED & BASE == BASE && MACHINES & BASE == BASE);

    /// The feature a message needs (0: none). A peer that sends a message whose
    /// feature the session does not use breaks the protocol.
    pub fn needed(msg: &Control) -> u64 {
        match msg {
            Control::Grow(_) | Control::Grown(_) => GROWING_MANIFEST,
            Control::Want(_) | Control::OnDemand => RANGES,
            Control::Tuned(_) => TUNING,
            Control::Manifest(p) if crate::manifest::has_links(&p.entries) => LINKS,
            Control::Sparse(_) => LINKS,
            Control::Meta(_) => METADATA,
            Control::Stored(_) | Control::Times(_) => CONTINUOUS,
            Control::Limits(_) => LIMITS,
            Control::WantPart(_) => PARTS,
            Control::PartChunk(_) => PART_CHUNKS,
            _ => 0,
        }
    }

    /// A readable name of a feature bit, for errors.
    pub fn name(bit: u64) -> &'static str {
        match bit {
            GROWING_MANIFEST => "growing manifest",
            RANGES => "ranges",
            TUNING => "tuning",
            LINKS => "hard links",
            METADATA => "metadata",
            CONTINUOUS => "continuous",
            LIMITS => "limits",
            STREAMED => "streamed manifest",
            PARTS => "parts",
            EARLY => "early data",
            WALKING => "live walk",
            PART_CHUNKS => "chunks per part",
            SYNC_BETWEEN => "sync between servers",
            KEEP => "size-only and ignore-existing",
            SUMS => "catalog checksums",
            _ => "unknown",
        }
    }
}

/// Fails a message that needs a feature the session does not use.
fn check_feature<E>(
    peer: &str,
    info: Option<&crate::control::SessionInfo>,
    msg: &Control,
) -> Result<(), SessionError<E>> {
    let bit = features::needed(msg);
    if bit != 0 && info.is_none_or(|i| i.features & bit == 0) {
        return Err(SessionError::Protocol {
            peer: peer.to_string(),
            what: format!(
                "{} needs the {} feature, which the session does not use",
                msg.name(),
                features::name(bit)
            ),
        });
    }
    Ok(())
}

/// The time limits of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long each handshake step (and the acceptor's whole set-up) may take.
    pub handshake: Duration,
    /// Interval between heartbeats (the dialer's choice; an acceptor uses the one the
    /// dialer's `Options` name).
    pub heartbeat: Duration,
    /// A peer silent for this many heartbeat intervals is declared gone.
    pub silent_intervals: u32,
    /// Source: a stream with unacknowledged chunks that makes no progress (no
    /// acknowledgement, no new chunk after it had none) for this long is lost, and its
    /// chunks are sent on the others.
    pub stall: Duration,
    /// Source: a stream with unacknowledged chunks that made no progress for this
    /// long is lost as soon as another stream brings an acknowledgement: one stuck TCP
    /// connection among moving ones does not hold its chunks for the whole `stall`.
    pub stuck: Duration,
    /// Sink: a stream that delivers no frame for this long while chunks are still
    /// expected is lost (`None`: no limit).
    pub idle: Option<Duration>,
    /// Acceptor: how long after `Go` every data stream must have joined.
    pub join: Duration,
    /// How long a side that failed without being the root cause waits for the peer's
    /// report.
    pub report_wait: Duration,
}

/// Default [`Timing::stuck`]: longer than TCP's retransmission back-off takes to
/// recover a stream on a long link (a few seconds), far shorter than the stall limit.
pub const STUCK: Duration = Duration::from_secs(20);

/// Default heartbeat interval.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// Shortest heartbeat interval accepted.
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(50);

impl Timing {
    /// The heartbeat interval a dialer announced in milliseconds (0: the default).
    pub fn heartbeat_from_ms(ms: u32) -> Duration {
        if ms == 0 {
            HEARTBEAT
        } else {
            Duration::from_millis(ms.into()).max(MIN_HEARTBEAT)
        }
    }

    /// Silence after which the peer is declared gone.
    pub fn silence(&self) -> Duration {
        self.heartbeat * self.silent_intervals
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            handshake: Duration::from_secs(30),
            heartbeat: HEARTBEAT,
            silent_intervals: 4,
            stall: Duration::from_secs(120),
            stuck: STUCK,
            idle: Some(Duration::from_secs(120)),
            join: Duration::from_secs(30),
            report_wait: Duration::from_secs(2),
        }
    }
}

/// A chunk's frame fields besides its payload, kept by the source until the chunk is
/// acknowledged so it can be sent again without reading its digests anew.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkMeta {
    /// CRC32C of the payload, when checksums are on.
    pub crc: Option<u32>,
    /// The digest entries (and failure markers) of files the chunk completes, which
    /// follow the frame header on the wire.
    pub digests: Vec<crate::data::DigestEntry>,
    /// The chunk lies wholly in holes of sparse files: it may go as a zeros frame
    /// ([`crate::data::FLAG_ZEROS`]) in a session using [`features::LINKS`].
    pub zeros: bool,
    /// (feature [`features::PARTS`]) The frame is a part of the chunk: these bytes of
    /// it (`crc` is theirs, `digests` holds the chunk's failure markers only).
    pub part: Option<PartRange>,
}

/// How the next part of a growing manifest goes ([`SourceSession::plan_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartPlan {
    /// As a part: laid out (a later one), then `Grow`.
    Grow,
    /// The first part's entries went in the first flight and the sink does not take
    /// parts (no [`features::STREAMED`]): the rest of the manifest goes whole behind
    /// them, ended by `ManifestEnd`, as a push's always did.
    RestWhole,
    /// A later part with hard links or holes, to a sink that takes neither in later
    /// parts (no [`features::WALKING`]: a server older than the live walk of pushes).
    Refuse,
}

/// Bytes of a chunk a part frame carries: `len` from `offset` (see
/// [`crate::control::Part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartRange {
    /// Where they start in the chunk.
    pub offset: u32,
    /// How many.
    pub len: u32,
}

/// What a driver's error type tells the machines.
pub trait Cause: fmt::Display + fmt::Debug {
    /// The class sent to the peer.
    fn code(&self) -> ErrorCode;
    /// How telling the error is when several things fail at once: 0 a cancellation,
    /// 1 a dropped connection, 2 another network failure or the peer's abort, 3 the
    /// peer's report, 4 a root cause (a local file error, a checksum, a refusal).
    fn rank(&self) -> u8;
    /// Whether a data stream that failed with it must end the session rather than be
    /// replaced by the others (a protocol violation, altered data, an unproven join).
    fn ends_session(&self) -> bool;
}

/// Why a session failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionError<E> {
    /// The peer reported an error and closed the session.
    Remote {
        /// The peer.
        peer: String,
        /// Its class of failure.
        code: ErrorCode,
        /// Its explanation.
        message: String,
    },
    /// The peer sent a message this side did not expect now.
    Unexpected {
        /// The peer.
        peer: String,
        /// What was expected.
        wanted: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The peer broke a rule of the protocol.
    Protocol {
        /// The peer.
        peer: String,
        /// Which rule, with the values seen.
        what: String,
    },
    /// The peer sent a malformed manifest or session.
    Malformed {
        /// The peer.
        peer: String,
        /// What was wrong.
        source: crate::Error,
    },
    /// The peer asked for more than this side accepts (manifest entries or memory).
    Limit(String),
    /// The acceptor requires a credential and this side has none.
    AuthRequired {
        /// The acceptor.
        peer: String,
    },
    /// The acceptor could not prove it knows the token this side proved.
    ServerProof {
        /// The acceptor.
        peer: String,
    },
    /// No message from the peer for the heartbeat limit.
    Silent {
        /// The peer.
        peer: String,
        /// The limit in seconds.
        secs: u64,
    },
    /// A handshake step's answer did not come in time.
    Timeout {
        /// The peer.
        peer: String,
        /// What was awaited.
        what: &'static str,
        /// The limit in seconds.
        secs: u64,
    },
    /// The acceptor's whole set-up took longer than its limit.
    SetupTimeout {
        /// The limit in seconds.
        secs: u64,
    },
    /// A data stream with unacknowledged chunks made no progress for the stall limit.
    Stalled {
        /// The peer.
        peer: String,
        /// The stream.
        stream: u16,
        /// The limit in seconds.
        secs: u64,
    },
    /// A data stream delivered nothing for the idle limit.
    Idle {
        /// The peer.
        peer: String,
        /// The stream.
        stream: u16,
        /// The limit in seconds.
        secs: u64,
    },
    /// Not every data stream joined in time.
    Joins {
        /// The peer.
        peer: String,
        /// Streams that joined.
        joined: u16,
        /// Streams the session has.
        streams: u16,
    },
    /// A data stream failed (the last one, or in a way that ends the session).
    Stream {
        /// The stream.
        stream: u16,
        /// What the driver saw.
        error: E,
    },
    /// The driver failed (storage, the user, the control connection).
    Local(E),
}

impl<E: Cause> SessionError<E> {
    /// The class sent to the peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            SessionError::Remote { code, .. } => *code,
            SessionError::Unexpected { .. }
            | SessionError::Protocol { .. }
            | SessionError::Malformed { .. }
            | SessionError::SetupTimeout { .. }
            | SessionError::Joins { .. } => ErrorCode::Protocol,
            SessionError::Limit(_) => ErrorCode::Busy,
            SessionError::AuthRequired { .. } | SessionError::ServerProof { .. } => ErrorCode::Auth,
            SessionError::Silent { .. }
            | SessionError::Timeout { .. }
            | SessionError::Stalled { .. }
            | SessionError::Idle { .. } => ErrorCode::Aborted,
            SessionError::Stream { error, .. } | SessionError::Local(error) => error.code(),
        }
    }

    /// How telling the error is (see [`Cause::rank`]).
    pub fn rank(&self) -> u8 {
        match self {
            SessionError::Remote { code, .. } if *code == ErrorCode::Aborted => 2,
            SessionError::Remote { .. } => 3,
            SessionError::Unexpected { .. }
            | SessionError::Protocol { .. }
            | SessionError::Malformed { .. }
            | SessionError::Silent { .. }
            | SessionError::Timeout { .. }
            | SessionError::Stalled { .. } => 2,
            SessionError::Idle { .. } => 1,
            SessionError::Limit(_)
            | SessionError::AuthRequired { .. }
            | SessionError::ServerProof { .. }
            | SessionError::SetupTimeout { .. }
            | SessionError::Joins { .. } => 4,
            SessionError::Stream { error, .. } | SessionError::Local(error) => error.rank(),
        }
    }

    /// The report sent to the peer.
    pub fn to_msg(&self) -> ErrorMsg {
        ErrorMsg {
            code: self.code(),
            message: self.to_string(),
        }
    }
}

impl<E: fmt::Display> fmt::Display for SessionError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Remote { peer, message, .. } => write!(f, "{peer}: {message}"),
            SessionError::Unexpected { peer, wanted, got } => write!(
                f,
                "protocol error from {peer}: protocol violation: expected {wanted}, got {got}"
            ),
            SessionError::Protocol { peer, what } => {
                write!(f, "protocol error from {peer}: protocol violation: {what}")
            }
            SessionError::Malformed { peer, source } => {
                write!(f, "protocol error from {peer}: {source}")
            }
            SessionError::Limit(what) => f.write_str(what),
            SessionError::AuthRequired { peer } => write!(
                f,
                "{peer} requires authentication: pass --key FILE (or DMOVER_KEY) or \
                 --token-file FILE (or DMOVER_TOKEN), and --user NAME if it has several users"
            ),
            SessionError::ServerProof { peer } => write!(
                f,
                "{peer} could not prove it knows the token; refusing to talk to it"
            ),
            SessionError::Silent { peer, secs } => write!(
                f,
                "{peer} did not answer within {secs} s (heartbeat: the peer went silent)"
            ),
            SessionError::Timeout { peer, what, secs } => {
                write!(f, "{peer} did not answer within {secs} s ({what})")
            }
            SessionError::SetupTimeout { secs } => {
                write!(f, "no session opened within {secs} s")
            }
            SessionError::Stalled { peer, secs, .. } => write!(
                f,
                "{peer} did not answer within {secs} s (acknowledgements on a data stream)"
            ),
            SessionError::Idle { peer, secs, .. } => write!(
                f,
                "receiving data from {peer}: no progress receiving for {secs} s"
            ),
            SessionError::Joins {
                peer,
                joined,
                streams,
            } => write!(
                f,
                "{peer} opened {joined} of {streams} data streams in time"
            ),
            SessionError::Stream { error, .. } | SessionError::Local(error) => error.fmt(f),
        }
    }
}

impl<E: fmt::Display + fmt::Debug> std::error::Error for SessionError<E> {}

/// How a session ended for a machine, once it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Still running.
    Running,
    /// It sent its final message and received the peer's.
    Finished,
    /// It failed (the error came as an event).
    Failed,
}

/// Counts of what the source's data streams went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Chunks sent again because their stream was lost before acknowledging them.
    pub chunks_resent: u64,
    /// Streams lost.
    pub streams_lost: u32,
    /// Chunks that arrived more than once (sink).
    pub duplicates: u64,
}

fn unexpected<E>(peer: &str, msg: &Control, wanted: &'static str) -> SessionError<E> {
    match msg {
        Control::Error(e) => SessionError::Remote {
            peer: peer.to_string(),
            code: e.code,
            message: e.message.clone(),
        },
        other => SessionError::Unexpected {
            peer: peer.to_string(),
            wanted,
            got: other.name(),
        },
    }
}
