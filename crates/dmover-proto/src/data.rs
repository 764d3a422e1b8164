//! Data connections: the join handshake and chunk frames.
//!
//! # Join
//! A data connection proves it belongs to a session without sending any secret:
//! ```text
//! client                                   server
//! Preamble(data)                     ->    (8 bytes)
//!                                    <-    server nonce (32 bytes, fresh per connection)
//! DataHello{session, stream, client nonce} client proof   ->   (48 + 32 bytes)
//!                                          proof = join_proof(session key, Client, ...)
//!                                    <-    JoinStatus (1 byte); if Accepted, then the
//!                                          server proof (32 bytes, Role::Server)
//! ```
//! The server sends its challenge as soon as it has read the data preamble (protocol
//! version 3; version 2 waited for the `DataHello`), so a client can connect its data
//! streams and collect their challenges while the control connection is still setting
//! up the session, and send hello and proof in one write once it knows the session.
//! The proofs are [`crate::auth::join_proof`]s keyed by the session key exported from
//! the control connection's TLS session, over both nonces, so a recorded join cannot
//! be replayed and a connection that cannot prove the key is refused (and does not
//! take the stream's place). The server closes the connection unless the status is
//! [`JoinStatus::Accepted`] (after reading, for a moment, what the client sent behind
//! its proof). After the join the bytes below travel as they are, or in records
//! ([`crate::record`]) as the session's [`crate::control::DataProtection`] says.
//!
//! A client that sends frames may send its first ones right behind its proof, without
//! waiting for the answer (the server reads the join, checks it, then reads the
//! frames); it must read and check the answer before anything else it receives, and
//! never joins the same stream on another connection once records may have gone out
//! on it (record keys depend on the session and stream, not on the join).
//!
//! # Frames
//! The source side then writes frames, each a fixed 24-byte [`FrameHeader`] followed
//! by `n_digests` 12-byte [`DigestEntry`]s and `payload_len` payload bytes:
//! ```text
//! offset size field
//! 0      1    kind         1 = CHUNK, 2 = END
//! 1      1    flags        bit 0: crc32c is set; bit 1: zeros (no payload);
//!                          bit 2: part (see below); other bits 0
//! 2      2    reserved     0
//! 4      4    n_digests    digest entries after the header (u32 BE)
//! 8      8    chunk        CHUNK: chunk index; END: chunks sent on this stream (u64 BE)
//! 16     4    payload_len  payload bytes (u32 BE); 0 for END
//! 20     4    crc32c       CRC32C of the payload (u32 BE); 0 without the flag
//! ```
//! A digest entry carries the end-to-end digest of a file the source finished reading
//! while it filled this chunk: `file` (u32 BE, index in the layout) then `digest`
//! (u64 BE). Every file with data gets exactly one, in some chunk holding one of its
//! pieces; within a frame, entries are in increasing file order. The payload is the
//! chunk's pieces in order (see [`crate::layout`]).
//!
//! A *part* frame (flag bit 2, [`FLAG_PART`], feature `PARTS`, only in a
//! request-driven session and only in answer to a `WantPart`) carries some bytes of a
//! chunk instead of all of them: a 4-byte offset ([`PART_LEN`], u32 BE) follows the
//! header, before the digest entries, and the payload is `payload_len` bytes of the
//! chunk from that offset (an offset into the chunk's virtual range, within one
//! piece). Its CRC is of those bytes; its digest entries are only failure markers.
//!
//! An entry whose `file` has bit 31 set ([`FILE_FAILED`]) is a *failure marker*: the
//! source could not read that file (bits 0..31) and the chunk's bytes for it are
//! meaningless; the destination discards the file. Its `digest` is 0. A file gets
//! either a digest or markers, and the entries of a frame stay in increasing order of
//! file index (flag bit ignored).
//!
//! # Acknowledgements
//! The destination answers every CHUNK frame it has read whole with an 8-byte
//! acknowledgement on the same connection: the number of CHUNK frames received on
//! this stream so far (u64 BE, [`encode_ack`]). The source keeps the chunks a stream
//! has not acknowledged and sends them again on another stream if that one breaks, so
//! a chunk may arrive twice; the destination keeps the first whole copy.

use crate::{Error, Result};

/// Size of an encoded [`DataHello`].
pub const HELLO_LEN: usize = 48;
/// Size of the server's challenge and of each join proof.
pub const JOIN_PROOF_LEN: usize = 32;
/// Size of an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 24;
/// Size of an encoded [`DigestEntry`].
pub const DIGEST_LEN: usize = 12;
/// Size of an acknowledgement.
pub const ACK_LEN: usize = 8;
/// Bit of [`DigestEntry::file`] marking a failure marker (see the module docs).
pub const FILE_FAILED: u32 = 1 << 31;

/// Encodes an acknowledgement: `frames` CHUNK frames received on this stream so far.
pub fn encode_ack(frames: u64) -> [u8; ACK_LEN] {
    frames.to_be_bytes()
}

/// Decodes an acknowledgement.
pub fn decode_ack(b: [u8; ACK_LEN]) -> u64 {
    u64::from_be_bytes(b)
}

/// The first message on a data connection.
///
/// ```text
/// offset size field
/// 0      8    session id (u64 BE)
/// 8      2    stream index (u16 BE)
/// 10     6    reserved, 0
/// 16     32   client nonce (fresh random bytes)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHello {
    /// The session this stream joins.
    pub session: u64,
    /// The stream's index, below the session's stream count.
    pub stream: u16,
    /// The client's fresh nonce for the join proofs.
    pub nonce: [u8; 32],
}

impl DataHello {
    /// Encodes the hello.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&self.session.to_be_bytes());
        b[8..10].copy_from_slice(&self.stream.to_be_bytes());
        b[16..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes a hello, rejecting non-zero reserved bytes.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let b: &[u8; HELLO_LEN] = b.first_chunk().ok_or(Error::UnexpectedEnd)?;
        if b[10..16].iter().any(|&x| x != 0) {
            return Err(Error::Reserved("data hello bytes 10..16"));
        }
        Ok(DataHello {
            session: u64::from_be_bytes(b[..8].try_into().unwrap()),
            stream: u16::from_be_bytes([b[8], b[9]]),
            nonce: b[16..].try_into().unwrap(),
        })
    }
}

/// The server's one-byte answer to a [`DataHello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum JoinStatus {
    /// The stream joined the session.
    Accepted = 0,
    /// No such session (never opened, or already over).
    UnknownSession = 1,
    /// The join proof did not match.
    BadProof = 2,
    /// The stream index is out of range or already taken.
    BadStream = 3,
}

impl JoinStatus {
    /// Decodes a status byte.
    pub fn decode(b: u8) -> Result<Self> {
        Ok(match b {
            0 => JoinStatus::Accepted,
            1 => JoinStatus::UnknownSession,
            2 => JoinStatus::BadProof,
            3 => JoinStatus::BadStream,
            v => {
                return Err(Error::Unknown {
                    what: "join status",
                    value: v.into(),
                });
            }
        })
    }
}

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A chunk of data.
    Chunk = 1,
    /// No more frames on this stream.
    End = 2,
}

/// Flag bit: the header's `crc32c` field is set.
pub const FLAG_CRC: u8 = 1;
/// Flag bit (feature `LINKS`): a CHUNK frame whose payload is all zeros and does not
/// travel: `payload_len` is 0 and the receiver fills the chunk's layout length with
/// zeros. The digest entries and the CRC (of the zero payload) are as for any chunk.
/// Only for chunks whose pieces all belong to files listed as sparse.
pub const FLAG_ZEROS: u8 = 2;

/// Flag bit (feature `PARTS`): a CHUNK frame carrying `payload_len` bytes of the chunk
/// from an offset, which follows the header in [`PART_LEN`] bytes (see the module
/// docs).
pub const FLAG_PART: u8 = 4;

/// Size of a part frame's offset, after its header.
pub const PART_LEN: usize = 4;

/// Limits a receiver applies while decoding frame headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest payload accepted (the session's chunk size).
    pub max_payload: u32,
    /// Largest digest count accepted.
    pub max_digests: u32,
}

/// The fixed header of a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Chunk or end.
    pub kind: FrameKind,
    /// Chunk index (`Chunk`) or number of chunks sent on the stream (`End`).
    pub chunk: u64,
    /// Number of digest entries following the header.
    pub n_digests: u32,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// CRC32C of the payload, when checksums are on.
    pub crc: Option<u32>,
    /// The payload is the chunk's length of zeros and does not travel
    /// ([`FLAG_ZEROS`]; `payload_len` is 0).
    pub zeros: bool,
    /// A part of the chunk ([`FLAG_PART`]): its offset follows the header.
    pub part: bool,
}

impl FrameHeader {
    /// The `END` frame of a stream that sent `chunks` chunks.
    pub fn end(chunks: u64) -> Self {
        FrameHeader {
            kind: FrameKind::End,
            chunk: chunks,
            n_digests: 0,
            payload_len: 0,
            crc: None,
            zeros: false,
            part: false,
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = if self.crc.is_some() { FLAG_CRC } else { 0 }
            | if self.zeros { FLAG_ZEROS } else { 0 }
            | if self.part { FLAG_PART } else { 0 };
        b[4..8].copy_from_slice(&self.n_digests.to_be_bytes());
        b[8..16].copy_from_slice(&self.chunk.to_be_bytes());
        b[16..20].copy_from_slice(&self.payload_len.to_be_bytes());
        b[20..24].copy_from_slice(&self.crc.unwrap_or(0).to_be_bytes());
        b
    }

    /// Decodes a header and checks it against `limits`.
    pub fn decode(b: &[u8], limits: &FrameLimits) -> Result<Self> {
        let b: &[u8; HEADER_LEN] = b.first_chunk().ok_or(Error::UnexpectedEnd)?;
        let kind = match b[0] {
            1 => FrameKind::Chunk,
            2 => FrameKind::End,
            k => {
                return Err(Error::Unknown {
                    what: "frame kind",
                    value: k.into(),
                });
            }
        };
        if b[1] & !(FLAG_CRC | FLAG_ZEROS | FLAG_PART) != 0 {
            return Err(Error::Reserved("frame flags"));
        }
        if b[2] != 0 || b[3] != 0 {
            return Err(Error::Reserved("frame bytes 2..4"));
        }
        let n_digests = u32::from_be_bytes(b[4..8].try_into().unwrap());
        let chunk = u64::from_be_bytes(b[8..16].try_into().unwrap());
        let payload_len = u32::from_be_bytes(b[16..20].try_into().unwrap());
        let crc_field = u32::from_be_bytes(b[20..24].try_into().unwrap());
        let crc = if b[1] & FLAG_CRC != 0 {
            Some(crc_field)
        } else if crc_field != 0 {
            return Err(Error::Reserved("crc32c without its flag"));
        } else {
            None
        };
        if payload_len > limits.max_payload {
            return Err(Error::TooLarge {
                what: "frame payload",
                value: payload_len.into(),
                limit: limits.max_payload.into(),
            });
        }
        if n_digests > limits.max_digests {
            return Err(Error::TooLarge {
                what: "frame digest count",
                value: n_digests.into(),
                limit: limits.max_digests.into(),
            });
        }
        if kind == FrameKind::End && (payload_len != 0 || n_digests != 0 || crc.is_some()) {
            return Err(Error::Violation("END frame with a payload".into()));
        }
        let zeros = b[1] & FLAG_ZEROS != 0;
        if kind == FrameKind::End && zeros {
            return Err(Error::Violation("END frame marked zeros".into()));
        }
        if zeros && payload_len != 0 {
            return Err(Error::Violation("zeros CHUNK frame with a payload".into()));
        }
        if kind == FrameKind::Chunk && payload_len == 0 && !zeros {
            return Err(Error::Violation("empty CHUNK frame".into()));
        }
        let part = b[1] & FLAG_PART != 0;
        if part && (kind == FrameKind::End || zeros) {
            return Err(Error::Violation(
                "part flag on an END or zeros frame".into(),
            ));
        }
        Ok(FrameHeader {
            kind,
            chunk,
            n_digests,
            payload_len,
            crc,
            zeros,
            part,
        })
    }
}

/// A file's end-to-end digest, carried in a frame's trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestEntry {
    /// Index of the file in the layout.
    pub file: u32,
    /// The file's digest (see [`crate::digest::file_digest`]).
    pub digest: u64,
}

impl DigestEntry {
    /// A failure marker for layout file `file`.
    pub fn failure(file: u32) -> Self {
        DigestEntry {
            file: file | FILE_FAILED,
            digest: 0,
        }
    }

    /// Whether this entry is a failure marker.
    pub fn is_failure(&self) -> bool {
        self.file & FILE_FAILED != 0
    }

    /// The layout file index the entry is about (without the flag).
    pub fn index(&self) -> u32 {
        self.file & !FILE_FAILED
    }

    /// Appends the encoded entry to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.file.to_be_bytes());
        out.extend_from_slice(&self.digest.to_be_bytes());
    }

    /// Decodes all entries of a trailer (its length must be a multiple of 12).
    pub fn decode_all(b: &[u8]) -> Result<impl Iterator<Item = DigestEntry> + '_> {
        if b.len() % DIGEST_LEN != 0 {
            return Err(Error::UnexpectedEnd);
        }
        Ok(b.chunks_exact(DIGEST_LEN).map(|c| DigestEntry {
            file: u32::from_be_bytes(c[..4].try_into().unwrap()),
            digest: u64::from_be_bytes(c[4..].try_into().unwrap()),
        }))
    }
}
