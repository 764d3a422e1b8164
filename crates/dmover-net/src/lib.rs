//! dmover transports.
//!
//! - [`tcp`]: connecting, listening and tuning TCP sockets (no-delay, buffer sizes,
//!   congestion control), with fallbacks reported instead of failing.
//! - [`control`]: the framed control channel over any async byte stream: preamble
//!   exchange and [`dmover_proto::control::Control`] messages with size limits and
//!   timeouts.
//! - [`zerocopy`]: `MSG_ZEROCOPY` sends with completion reaping, reporting when the
//!   kernel copied after all.
//!
//! TLS for the control channel slots in here later: the control functions are generic
//! over `AsyncRead`/`AsyncWrite`.

pub mod control;
pub mod tcp;
pub mod zerocopy;

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

    /// Wraps a protocol error.
    pub fn proto(peer: impl std::fmt::Display, source: dmover_proto::Error) -> Self {
        NetError::Proto {
            peer: peer.to_string(),
            source,
        }
    }
}
