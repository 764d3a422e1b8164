//! The storage error type: every variant names the file or chunk it concerns. Its
//! texts are what users see; `dmover_core::Error` wraps it transparently.

use std::io;

use dmover_proto::control::{ErrorCode, ErrorMsg};

/// A storage error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file system call failed on a named path.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("reading", "creating", ...).
        op: &'static str,
        /// The path, as the user would name it.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Data arrived corrupted or a file's digest did not match.
    #[error("checksum mismatch: {0}")]
    Checksum(String),
    /// A source file changed while it was being sent.
    #[error("{path} changed during the transfer ({what})")]
    Changed {
        /// The file.
        path: String,
        /// What changed.
        what: String,
    },
    /// A request this side refuses (path escape, bad destination, a busy journal, ...).
    #[error("{message}")]
    Refused {
        /// Class of refusal, sent to the peer.
        code: ErrorCode,
        /// Explanation naming the path or limit.
        message: String,
    },
    /// What the source sent breaks the protocol (a chunk without its CRC, a bad digest
    /// trailer, a file left incomplete).
    #[error("protocol error from {peer}: {source}")]
    Protocol {
        /// Who sent it ("the source").
        peer: String,
        /// What was wrong.
        #[source]
        source: dmover_proto::Error,
    },
}

impl Error {
    /// An I/O error on a path.
    pub fn io(op: &'static str, path: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }

    /// A refusal.
    pub fn refused(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Refused {
            code,
            message: message.into(),
        }
    }

    /// A protocol violation by `peer`.
    pub fn protocol(peer: impl std::fmt::Display, what: impl Into<String>) -> Self {
        Error::Protocol {
            peer: peer.to_string(),
            source: dmover_proto::Error::Violation(what.into()),
        }
    }

    /// The error's class, as sent to the peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => ErrorCode::NotFound,
                io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
                _ => ErrorCode::Io,
            },
            Error::Checksum(_) => ErrorCode::Checksum,
            Error::Changed { .. } => ErrorCode::Changed,
            Error::Refused { code, .. } => *code,
            Error::Protocol { .. } => ErrorCode::Protocol,
        }
    }

    /// The message to send to the peer.
    pub fn to_msg(&self) -> ErrorMsg {
        ErrorMsg {
            code: self.code(),
            message: self.to_string(),
        }
    }

    /// Whether a new attempt may succeed: data that arrived corrupted, files that
    /// changed while read, a busy journal. Not: disk errors (a full disk stays full),
    /// refusals, protocol violations.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Checksum(_) | Error::Changed { .. } => true,
            Error::Refused { code, .. } => *code == ErrorCode::Busy,
            Error::Io { .. } | Error::Protocol { .. } => false,
        }
    }

    /// Whether the session cannot go on after this error on one data stream: a refusal
    /// or a protocol violation.
    pub fn ends_session(&self) -> bool {
        matches!(self, Error::Refused { .. } | Error::Protocol { .. })
    }
}

/// Result alias for the storage crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
