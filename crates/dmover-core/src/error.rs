//! The engine's error type: every variant says which file, peer or chunk it concerns.

use std::io;

use dmover_net::NetError;
use dmover_net::stream::JoinFailed;
use dmover_proto::control::{ErrorCode, ErrorMsg};
use dmover_proto::data::JoinStatus;

use dmover_net::join::JOIN_WAIT;

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A storage error: a file system call failed on a named path, data arrived
    /// corrupted, a source file changed, a destination path was refused, or the source
    /// sent chunks that break the protocol (see [`dmover_store::Error`]).
    #[error(transparent)]
    Store(#[from] dmover_store::Error),
    /// A connection failed or the peer broke the protocol.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The peer reported an error and closed the session.
    #[error("{peer}: {message}")]
    Remote {
        /// Who reported it.
        peer: String,
        /// Class of failure.
        code: ErrorCode,
        /// The peer's explanation.
        message: String,
    },
    /// A request this side refuses (path escape, read-only, bad destination, ...).
    #[error("{message}")]
    Refused {
        /// Class of refusal, sent to the peer.
        code: ErrorCode,
        /// Explanation naming the path or limit.
        message: String,
    },
    /// The session was cancelled because of an error elsewhere (another stream,
    /// the peer, or the user).
    #[error("transfer aborted")]
    Aborted,
}

impl Error {
    /// An I/O error on a path.
    pub fn io(op: &'static str, path: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Error::Store(dmover_store::Error::io(op, path, source))
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
        Error::Net(NetError::proto(
            peer,
            dmover_proto::Error::Violation(what.into()),
        ))
    }

    /// An I/O error on a data stream with `peer` while `what` ("sending data to", ...):
    /// a failed join ([`JoinFailed`], from a stream that sent data before its join's
    /// answer) becomes the error a join that waited for its answer gives (see
    /// [`Error::join`]), others [`NetError::Io`].
    pub fn data(what: &'static str, peer: &str, e: io::Error) -> Self {
        match JoinFailed::of(&e) {
            Some(j) => Error::join(peer, j),
            None => Error::Net(NetError::io(what, peer, e)),
        }
    }

    /// A failed data stream join with `peer`.
    pub fn join(peer: &str, j: &JoinFailed) -> Self {
        match j {
            // The server knows no such session: it never opened there, or it is
            // over (a stream that joins after the sink said `Done`). Not a breach of
            // the protocol: the control connection says how the session went, and a
            // stream still pending fails the session anyway.
            JoinFailed::Refused {
                stream,
                status: JoinStatus::UnknownSession,
            } => Error::Net(NetError::io(
                "joining a data stream to",
                peer,
                io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "data stream {stream} refused: the server knows no such session \
                         (it is over, or never opened)"
                    ),
                ),
            )),
            JoinFailed::Refused { .. } => Error::protocol(peer, j.to_string()),
            JoinFailed::BadStatus { value, .. } => Error::Net(NetError::proto(
                peer,
                dmover_proto::Error::Unknown {
                    what: "join status",
                    value: (*value).into(),
                },
            )),
            JoinFailed::BadProof { .. } => Error::refused(
                ErrorCode::Auth,
                format!(
                    "{peer}: the data port could not prove it belongs to the session; refusing it"
                ),
            ),
            JoinFailed::Timeout { secs, .. } => Error::Net(NetError::Timeout {
                peer: peer.into(),
                what: JOIN_WAIT,
                secs: *secs,
            }),
            JoinFailed::Broken { kind, message, .. } => Error::Net(NetError::io(
                "reading from",
                peer,
                io::Error::new(*kind, message.clone()),
            )),
        }
    }

    /// Whether a data stream that failed with this error must fail the session rather
    /// than be replaced by the others: a protocol violation, or a join that was refused,
    /// could not be proven or went unanswered (the peer is not who it must be).
    pub fn ends_session(&self) -> bool {
        matches!(
            self,
            Error::Net(NetError::Proto { .. }) | Error::Refused { .. }
        ) || matches!(self, Error::Store(e) if e.ends_session())
            || matches!(self, Error::Net(NetError::Timeout { what, .. }) if *what == JOIN_WAIT)
    }

    /// The error's class, as sent to the peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Store(e) => e.code(),
            Error::Net(NetError::Proto { .. }) => ErrorCode::Protocol,
            Error::Net(_) => ErrorCode::Aborted,
            Error::Remote { code, .. } => *code,
            Error::Refused { code, .. } => *code,
            Error::Aborted => ErrorCode::Aborted,
        }
    }

    /// The message to send to the peer.
    pub fn to_msg(&self) -> ErrorMsg {
        ErrorMsg {
            code: self.code(),
            message: self.to_string(),
        }
    }

    /// Whether a new session of the transfer, resuming, may succeed where this one
    /// failed: broken connections and silent peers, a busy server, files that changed
    /// while read, data that arrived corrupted. Not: refused paths and credentials,
    /// protocol violations, local or remote disk errors (a full disk stays full), and
    /// cancellations.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Net(NetError::Proto { .. }) => false,
            Error::Net(_) => true,
            Error::Remote { code, .. } => {
                matches!(
                    code,
                    ErrorCode::Aborted | ErrorCode::Busy | ErrorCode::Checksum | ErrorCode::Changed
                )
            }
            Error::Store(e) => e.retryable(),
            Error::Refused { code, .. } => *code == ErrorCode::Busy,
            Error::Aborted => false,
        }
    }

    /// The server could not take the session yet and said so after authentication
    /// (its user's session limit, its memory budget, its session places): a client
    /// comes back within its `busy_wait` without counting a retry. A busy answer
    /// before TLS is handled where it is read ([`crate::dialer`]'s connect), and a
    /// permanent refusal (credentials, a read-only export) has another code.
    pub fn server_busy(&self) -> bool {
        matches!(
            self,
            Error::Remote {
                code: ErrorCode::Busy,
                ..
            }
        )
    }

    /// How telling an error is when several streams fail at once: the root cause
    /// (a local file error, a checksum, a refusal) beats the peer's report, which
    /// beats a dropped connection, which beats the aborts it caused.
    pub fn rank(&self) -> u8 {
        match self {
            Error::Aborted => 0,
            Error::Net(NetError::Closed { .. } | NetError::Io { .. }) => 1,
            Error::Net(_) => 2,
            // A protocol violation, ranked as one the network layer reports.
            Error::Store(dmover_store::Error::Protocol { .. }) => 2,
            Error::Remote { code, .. } if *code == ErrorCode::Aborted => 2,
            Error::Remote { .. } => 3,
            _ => 4,
        }
    }
}

/// Result alias for the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Storage errors read, rank and travel as they did when they were this type's own
    /// variants (a protocol violation by the source as one the network layer reports).
    #[test]
    fn store_errors_keep_their_texts_codes_and_ranks() {
        let what = "chunk 3 carries no CRC";
        let store = Error::from(dmover_store::Error::protocol("the source", what));
        let net = Error::protocol("the source", what);
        assert_eq!(store.to_string(), net.to_string());
        let class = |e: &Error| (e.code(), e.retryable(), e.ends_session(), e.rank());
        assert_eq!(class(&store), class(&net));

        let missing = Error::io("reading", "a/b", io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(missing.to_string(), "reading a/b: entity not found");
        assert_eq!(class(&missing), (ErrorCode::NotFound, false, false, 4));
        let sum = Error::from(dmover_store::Error::Checksum("chunk 1".into()));
        assert_eq!(sum.to_string(), "checksum mismatch: chunk 1");
        assert_eq!(class(&sum), (ErrorCode::Checksum, true, false, 4));
        let busy = Error::from(dmover_store::Error::refused(
            ErrorCode::Busy,
            "journal busy",
        ));
        assert_eq!(busy.to_string(), "journal busy");
        assert_eq!(class(&busy), (ErrorCode::Busy, true, true, 4));
        assert_eq!(busy.to_msg().message, "journal busy");
    }

    /// A join refused because the server no longer knows the session (a stream that
    /// joins after the sink finished) loses that stream only; the other refusals say
    /// the peer is not who it must be, and end the session.
    #[test]
    fn a_join_to_a_session_that_is_over_loses_only_that_stream() {
        let refused = |status| JoinFailed::Refused { stream: 1, status };
        let over = Error::join("b:1", &refused(JoinStatus::UnknownSession));
        assert!(!over.ends_session(), "{over}");
        assert_eq!(over.code(), ErrorCode::Aborted);
        assert_eq!(
            over.to_string(),
            "joining a data stream to b:1: data stream 1 refused: the server knows no \
             such session (it is over, or never opened)"
        );
        for status in [JoinStatus::BadProof, JoinStatus::BadStream] {
            assert!(
                Error::join("b:1", &refused(status)).ends_session(),
                "{status:?}"
            );
        }
        assert!(Error::join("b:1", &JoinFailed::BadProof { stream: 1 }).ends_session());
    }
}
