//! The 8-byte preamble that opens every connection.
//!
//! ```text
//! offset size field
//! 0      4    magic  "DMOV"
//! 4      1    kind   1 = control, 2 = data
//! 5      1    reserved, 0; except in a server's busy answer (below): retry after,
//!             in seconds (1..=255)
//! 6      2    version (u16, big-endian): the client's highest version; in the
//!             server's answer on a control connection, the negotiated version
//!             (0 = no common version, the server closes)
//! ```
//!
//! # Busy
//! A server that cannot take a connection into set-up yet (too many connections in
//! set-up, see `dmover_core::server::ServerConfig::max_handshakes`) still reads the
//! preamble. To a control preamble it answers with kind 1, version 0 and byte 5 = N > 0:
//! "busy, connect again after N seconds" ([`Preamble::busy`]); then it closes the
//! connection gracefully (it reads and discards what the client already sent, e.g. its
//! TLS `ClientHello`, so the close is never a reset). A data connection is closed the
//! same way, without an answer, only when even the server's larger bound for
//! connections waiting on it is reached. Byte 5 is reserved (0) in every other
//! preamble: [`Preamble::decode`] refuses a nonzero byte 5 unless kind is control and
//! version is 0.

use std::num::NonZeroU8;

use crate::{Error, Result};

/// The magic bytes every dmover connection starts with.
pub const MAGIC: [u8; 4] = *b"DMOV";
/// Size of an encoded preamble.
pub const LEN: usize = 8;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// The session's control connection (one per session).
    Control = 1,
    /// One of the session's data streams.
    Data = 2,
}

/// The first 8 bytes of a connection (and of the server's answer on a control one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// The kind of connection.
    pub kind: ConnKind,
    /// The highest version the client speaks, or the negotiated one in an answer.
    pub version: u16,
    /// In a server's answer to a control preamble (kind control, version 0): busy,
    /// retry after this many seconds. `None` everywhere else.
    pub busy: Option<NonZeroU8>,
}

impl Preamble {
    /// A preamble of `kind` naming `version`, not busy.
    pub fn new(kind: ConnKind, version: u16) -> Self {
        Preamble {
            kind,
            version,
            busy: None,
        }
    }

    /// The server's answer to a control preamble when it cannot take the connection
    /// yet: busy, connect again after `retry_after_secs` seconds.
    pub fn busy(retry_after_secs: NonZeroU8) -> Self {
        Preamble {
            kind: ConnKind::Control,
            version: 0,
            busy: Some(retry_after_secs),
        }
    }

    /// Encodes the preamble.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = self.kind as u8;
        b[5] = self.busy.map_or(0, NonZeroU8::get);
        b[6..8].copy_from_slice(&self.version.to_be_bytes());
        b
    }

    /// Decodes a preamble, rejecting wrong magic, unknown kinds and reserved bits
    /// (byte 5 may be nonzero only in a busy answer: kind control, version 0).
    pub fn decode(b: &[u8]) -> Result<Self> {
        let b: &[u8; LEN] = b
            .get(..LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(Error::UnexpectedEnd)?;
        if b[..4] != MAGIC {
            return Err(Error::BadMagic);
        }
        let kind = match b[4] {
            1 => ConnKind::Control,
            2 => ConnKind::Data,
            k => {
                return Err(Error::Unknown {
                    what: "connection kind",
                    value: k.into(),
                });
            }
        };
        let version = u16::from_be_bytes([b[6], b[7]]);
        let busy = NonZeroU8::new(b[5]);
        if busy.is_some() && (kind != ConnKind::Control || version != 0) {
            return Err(Error::Reserved("preamble byte 5"));
        }
        Ok(Preamble {
            kind,
            version,
            busy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_answer_round_trips() {
        for n in [1u8, 2, 30, 255] {
            let p = Preamble::busy(NonZeroU8::new(n).unwrap());
            let b = p.encode();
            assert_eq!(b, [b'D', b'M', b'O', b'V', 1, n, 0, 0]);
            let d = Preamble::decode(&b).unwrap();
            assert_eq!(d, p);
            assert_eq!(d.busy.map(NonZeroU8::get), Some(n));
        }
        // A plain "no common version" answer is not busy.
        let d = Preamble::decode(&Preamble::new(ConnKind::Control, 0).encode()).unwrap();
        assert_eq!(d.busy, None);
    }

    #[test]
    fn byte_5_is_reserved_outside_a_busy_answer() {
        for (kind, version) in [
            (ConnKind::Control, 5u16),
            (ConnKind::Data, 0),
            (ConnKind::Data, 5),
        ] {
            let mut b = Preamble::new(kind, version).encode();
            b[5] = 3;
            assert_eq!(
                Preamble::decode(&b),
                Err(Error::Reserved("preamble byte 5")),
                "{kind:?} {version}"
            );
        }
    }
}
