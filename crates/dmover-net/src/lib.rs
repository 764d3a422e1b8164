//! dmover transports.
//!
//! - [`tcp`]: connecting, listening and tuning TCP sockets (no-delay, buffer sizes,
//!   congestion control), with fallbacks reported instead of failing.
//! - [`control`]: the framed control channel over any async byte stream: preamble
//!   exchange and [`dmover_proto::control::Control`] messages with size limits and
//!   timeouts; a client's control connection ([`control::connect`]).
//! - [`listen`]: a server's listening endpoint and its accepted connections before
//!   their preamble (control, or a data stream's join).
//! - [`tls`]: TLS 1.3 for the control channel (rustls with aws-lc-rs): the server's
//!   key pair, created on first start, and the client's trust in it (pinned on first
//!   use in [`known_hosts`], or a CA).
//! - [`join`]: joining data streams to a session, behind a small API: the dialer's
//!   [`join::Dial`] (connections opened ahead, then hello and proof, early data or
//!   not) and the acceptor's [`join::JoinTable`] (challenge, proof checked, answer,
//!   stream handed to its session). TCP ([`join::Dialer`]) is the first
//!   implementation; [`memnet`] joins in-process pipes the same way, for tests.
//! - [`stream`]: what a data stream is after its join ([`stream::DataIo`]): plain TCP or
//!   AES-256-GCM records ([`stream::Sealed`]), with idle timeouts either way.
//! - [`chunkio`]: whole chunks written with their records sealed where the bytes lie
//!   (no copy into a record buffer), and a lock-shared read/write split that reaches it.
//! - [`transport`]: the seam the engine writes and reads chunks through
//!   ([`transport::DataLink`]), with [`stream::DataIo`] as its first implementation;
//!   [`fault`] wraps any of them with injected delays and cuts, for tests; [`pace`]
//!   wraps any of them with a bandwidth limit (a token bucket shared by a transfer's
//!   streams).
//! - [`link`]: the transport-neutral knobs of a data stream's connection: a
//!   [`link::Probe`] the engine's tuners read (delivered bytes, round trips, what held
//!   it back) and its congestion control; [`budget`]: a session's buffer budget, which
//!   the transport applies (over TCP: socket buffers held to a share or raised past
//!   the host's autotuning limit).
//! - [`tcpinfo`]: a data stream's TCP counters (`TCP_INFO`: bytes acknowledged,
//!   round-trip times), behind [`link::Probe`] for TCP.
//! - [`zerocopy`]: `MSG_ZEROCOPY` sends with completion reaping, reporting when the
//!   kernel copied after all.

#![deny(clippy::too_many_lines)]

pub mod budget;
pub mod capability;
pub mod chunkio;
pub mod control;
pub mod fault;
pub mod join;
pub mod known_hosts;
pub mod link;
pub mod listen;
pub mod memnet;
pub mod pace;
pub mod stream;
pub mod tcp;
pub mod tcpinfo;
pub mod tls;
pub mod transport;
pub mod zerocopy;

/// The control connection's stream: TLS over TCP, client or server side.
pub type ControlStream = tokio_rustls::TlsStream<control::ControlTcp>;

use std::io;

/// Errors of the transport layer, with the peer they concern.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A socket call failed.
    #[error("{what} {peer}: {source}")]
    Io {
        /// What was being done ("connecting to", "reading from", ...).
        what: &'static str,
        /// The peer address or name.
        peer: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The peer sent bytes that break the protocol.
    #[error("protocol error from {peer}: {source}")]
    Proto {
        /// The peer address or name.
        peer: String,
        /// What was wrong.
        #[source]
        source: dmover_proto::Error,
    },
    /// The peer closed the connection.
    #[error("{peer} closed the connection")]
    Closed {
        /// The peer address or name.
        peer: String,
    },
    /// The TLS handshake failed.
    #[error("TLS with {peer}: {source}")]
    Tls {
        /// The peer address or name.
        peer: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The server presented a key other than the one pinned for it.
    #[error(
        "the key of {host} has changed: {file}:{line} pins {pinned}, the server presented \
         {presented}. Someone may be intercepting the connection, or the server got a new \
         key; if you know it did, delete line {line} of {file} and connect again"
    )]
    HostKeyChanged {
        /// The server as the user named it (`host:port`).
        host: String,
        /// The known-hosts file.
        file: String,
        /// The line pinning the old key (1-based).
        line: usize,
        /// The pinned fingerprint.
        pinned: String,
        /// The fingerprint the server presented.
        presented: String,
    },
    /// A local file this side needs (key, certificate, known hosts) is unusable.
    #[error("{what} {path}: {message}")]
    LocalFile {
        /// What was being done ("reading", "writing", ...).
        what: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The peer did not answer in time.
    #[error("{peer} did not answer within {secs} s ({what})")]
    Timeout {
        /// The peer address or name.
        peer: String,
        /// What we were waiting for.
        what: &'static str,
        /// The time limit in seconds.
        secs: u64,
    },
}

impl NetError {
    /// Wraps an I/O error, mapping end-of-stream to [`NetError::Closed`].
    pub fn io(what: &'static str, peer: impl std::fmt::Display, source: io::Error) -> Self {
        let peer = peer.to_string();
        match source.kind() {
            io::ErrorKind::UnexpectedEof => NetError::Closed { peer },
            _ => NetError::Io { what, peer, source },
        }
    }

    /// A local file problem.
    pub fn file(what: &'static str, path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        NetError::LocalFile {
            what,
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// Wraps a protocol error.
    pub fn proto(peer: impl std::fmt::Display, source: dmover_proto::Error) -> Self {
        NetError::Proto {
            peer: peer.to_string(),
            source,
        }
    }
}
