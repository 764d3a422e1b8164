//! Records: how a data stream carries its bytes when the session's
//! [`crate::control::DataProtection`] is `Authenticated` or `Encrypted`.
//!
//! Each direction of a data stream is a sequence of records:
//! ```text
//! offset size field
//! 0      4    length L of the body (u32 BE), 1..=MAX_RECORD
//! 4      L    body: the plaintext (Authenticated) or the ciphertext (Encrypted)
//! 4+L    16   AES-256-GCM tag
//! ```
//! The key is [`crate::auth::record_key`] for the stream and the writing end, so each
//! key is used by one writer only, and the nonce is the record's sequence number on that
//! stream ([`nonce`]): records cannot be replayed, reordered or moved to another stream
//! or session. `Authenticated` records pass the header and body as associated data (the
//! tag is a GMAC); `Encrypted` records pass the header as associated data and encrypt
//! the body. The frames of [`crate::data`] are written into records as one byte stream
//! (a record may hold parts of several frames); the `END` frame marks the end, so a
//! stream cut short between records is still detected.

use crate::{Error, Result};

/// Size of a record header.
pub const HEADER_LEN: usize = 4;
/// Size of a record's tag.
pub const TAG_LEN: usize = 16;
/// Largest record body (256 KiB).
pub const MAX_RECORD: usize = 256 << 10;

/// Encodes a record header for a body of `len` bytes (`1..=MAX_RECORD`).
pub fn encode_header(len: usize) -> [u8; HEADER_LEN] {
    debug_assert!((1..=MAX_RECORD).contains(&len));
    (len as u32).to_be_bytes()
}

/// Decodes a record header into its body length, refusing empty or oversized bodies
/// before anything is buffered for them.
pub fn decode_header(b: &[u8]) -> Result<usize> {
    let b: &[u8; HEADER_LEN] = b.first_chunk().ok_or(Error::UnexpectedEnd)?;
    let len = u32::from_be_bytes(*b) as usize;
    if len == 0 {
        return Err(Error::Violation("empty record".into()));
    }
    if len > MAX_RECORD {
        return Err(Error::TooLarge {
            what: "record",
            value: len as u64,
            limit: MAX_RECORD as u64,
        });
    }
    Ok(len)
}

/// The AES-GCM nonce of record number `seq` (counting from 0 on each stream and
/// direction): four zero bytes, then `seq` as u64 BE.
pub fn nonce(seq: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        assert_eq!(encode_header(1), [0, 0, 0, 1]);
        assert_eq!(decode_header(&[0, 4, 0, 0]), Ok(MAX_RECORD));
        assert!(decode_header(&[0, 0, 0, 0]).is_err());
        assert!(decode_header(&[0, 4, 0, 1]).is_err());
        assert!(decode_header(&[0xff; 4]).is_err());
        assert_eq!(decode_header(&[0, 0]), Err(Error::UnexpectedEnd));
        assert_eq!(nonce(258), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
    }
}
