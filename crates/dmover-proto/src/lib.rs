//! The dmover wire protocol, sans-IO.
//!
//! This crate holds no sockets, threads, files or clocks. Callers feed it bytes and get
//! messages back, or hand it messages and get bytes to send. Everything two peers must
//! agree on bit for bit lives here: the connection preamble, control messages, data
//! frame headers, the dataset layout (which bytes of which file travel in which chunk)
//! and the checksum and digest definitions.
//!
//! # Goals
//! - One TCP control connection plus N data connections per session; data connections
//!   carry fixed-header chunk frames, so the hot path allocates nothing.
//! - A dataset is one virtual byte space ([`layout`]): regular files laid end to end and
//!   cut into fixed-size chunks. Small files share chunks, big files span many, and no
//!   message is ever exchanged per file.
//! - Every chunk carries a CRC32C; every file gets an end-to-end xxh3 digest
//!   ([`digest`]), computed in-line by both ends.
//! - Malformed, oversized or out-of-order input is an error ([`Error`]), never a panic
//!   or an unbounded allocation.
//!
//! - Safe on an untrusted network: the control connection runs over TLS 1.3 right after
//!   the preamble; authentication ([`auth`]) and every data connection's join are bound
//!   to that TLS session, and data streams carry authenticated (by default) or
//!   encrypted records ([`record`]).
//!
//! # Non-goals (for this version)
//! Resume journals live at the destination (`dmover-core`); the
//! protocol only carries what they hold ([`control::Have`], [`control::Plan`]).
//!
//! # Connections
//! Every connection starts with an 8-byte [`preamble::Preamble`] from the client: magic
//! `DMOV`, the connection kind (control or data) and the highest protocol version the
//! client speaks. The server answers a control preamble with its own preamble carrying
//! the negotiated version, `min(client, server)`, or version 0 if they share none.
//!
//! ## Control connection
//! After the preambles the client starts a TLS 1.3 handshake; everything after it is
//! inside TLS. Length-prefixed frames (`u32` big-endian length, then a postcard-encoded
//! [`control::Control`]); see [`control`] for the message flow. In short:
//! ```text
//! client                               server
//! Preamble / Preamble, then the TLS 1.3 handshake
//! Hello{nonce}                   ->    \
//! Auth{user, credential}         ->     | one flight, no waiting in between
//! Open{op, streams, chunk, ...}  ->     |
//! Options (push: + Manifest)     ->    /
//!                                <-    Welcome{nonce, auth}
//!                                <-    AuthOk{proof?}
//!                                <-    Session{id, salt, streams, chunk}
//!           the source side sends Manifest* + ManifestEnd
//!           the destination side answers Go (or Error)
//! client joins N data connections (connected during the above), data flows
//!           the destination side sends Done{summary} (or Error)
//! ```
//! Since version 3 the client does not wait for the server between `Hello` and the
//! end of its first flight (the transcript no longer holds a server nonce, see
//! [`auth`]), and it starts its TLS handshake right behind its preamble, reading the
//! server's preamble answer before the TLS handshake's first bytes.
//!
//! ## Data connection
//! The server answers the client's preamble with a fresh challenge; the client sends a
//! [`data::DataHello`] naming the session and its proof that it holds the session key,
//! and the server answers one status byte and its own proof (see [`data`]). From then on the
//! source side writes [`data::FrameHeader`]s, each followed by its digest trailer and
//! payload, and finally an `END` frame.
//!
//! # Errors
//! Decoders return [`Error`]; each variant says what was wrong with the input.

pub mod auth;
pub mod capability;
pub mod control;
pub mod data;
pub mod digest;
pub mod layout;
pub mod manifest;
pub mod preamble;
pub mod record;
pub mod session;
pub mod units;

/// The protocol version this build speaks natively (the highest it supports).
pub const PROTOCOL_VERSION: u16 = 8;
/// The oldest protocol version this build still speaks (version 1 had no TLS; version
/// 2 had the client wait for a server nonce before `Auth` and for the `DataHello`
/// before the join challenge; version 3 had no `features` in `Open` and `Session`;
/// version 4 ended a push without the source's `SendReport` and let a dialer leave out
/// `Options`; version 5 had a dialer wait for `Session` before it sent a message of a
/// feature it offered, as an acceptor could leave any feature out; version 6 had no
/// packed control frames; version 7 had the server choose the session id and salt at
/// random, so no data stream could join before `Session`).
pub const MIN_PROTOCOL_VERSION: u16 = 8;

/// The default TCP port of a dmover server.
pub const DEFAULT_PORT: u16 = 7700;

/// Picks the version two peers use: the lower of their highest versions, provided it
/// is not below [`MIN_PROTOCOL_VERSION`].
pub fn negotiate_version(ours: u16, theirs: u16) -> Option<u16> {
    let v = ours.min(theirs);
    (v >= MIN_PROTOCOL_VERSION).then_some(v)
}

/// Everything a decoder or validator can reject.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The input ended before a complete item could be read.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// The connection did not start with the dmover magic bytes.
    #[error("not a dmover peer (bad magic bytes)")]
    BadMagic,
    /// A connection kind, frame kind or enum tag that this version does not know.
    #[error("unknown {what} {value}")]
    Unknown {
        /// What kind of field held the unknown value.
        what: &'static str,
        /// The value found.
        value: u64,
    },
    /// A length or count above the limit this side accepts.
    #[error("{what} of {value} exceeds the limit of {limit}")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The largest value accepted.
        limit: u64,
    },
    /// A reserved field that must be zero was not.
    #[error("reserved field {0} is not zero")]
    Reserved(&'static str),
    /// A control message body that postcard could not decode.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// A well-formed message or manifest that breaks a protocol rule.
    #[error("protocol violation: {0}")]
    Violation(String),
}

/// Convenience alias for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
