//! The 8-byte preamble that opens every connection.
//!
//! ```text
//! offset size field
//! 0      4    magic  "DMOV"
//! 4      1    kind   1 = control, 2 = data
//! 5      1    reserved, 0
//! 6      2    version (u16, big-endian): the client's highest version; in the
//!             server's answer on a control connection, the negotiated version
//!             (0 = no common version, the server closes)
//! ```

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
}

impl Preamble {
    /// Encodes the preamble.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = self.kind as u8;
        b[6..8].copy_from_slice(&self.version.to_be_bytes());
        b
    }

    /// Decodes a preamble, rejecting wrong magic, unknown kinds and reserved bits.
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
        if b[5] != 0 {
            return Err(Error::Reserved("preamble byte 5"));
        }
        Ok(Preamble {
            kind,
            version: u16::from_be_bytes([b[6], b[7]]),
        })
    }
}
