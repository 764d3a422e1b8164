//! `FrameHeader::decode` and the digest trailer after it, on arbitrary bytes.
//!
//! Input: 4 bytes `max_payload`, 4 bytes `max_digests` (u32 BE), then the frame as it
//! would arrive on a data stream: header, digest entries, payload.
#![no_main]

use dmover_proto::Error;
use dmover_proto::data::{
    DIGEST_LEN, DigestEntry, FrameHeader, FrameKind, FrameLimits, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((lim, frame)) = data.split_first_chunk::<8>() else {
        return;
    };
    let limits = FrameLimits {
        max_payload: u32::from_be_bytes(lim[..4].try_into().unwrap()),
        max_digests: u32::from_be_bytes(lim[4..].try_into().unwrap()),
    };
    let h = match FrameHeader::decode(frame, &limits) {
        Ok(h) => h,
        Err(Error::UnexpectedEnd) => {
            assert!(frame.len() < HEADER_LEN);
            return;
        }
        Err(Error::Unknown { .. } | Error::Reserved(_) | Error::TooLarge { .. }) => return,
        Err(Error::Violation(_)) => return,
        Err(e) => panic!("unexpected error {e:?}"),
    };
    assert_eq!(h.encode()[..], frame[..HEADER_LEN], "not canonical");
    assert!(h.payload_len <= limits.max_payload && h.n_digests <= limits.max_digests);
    match h.kind {
        FrameKind::End => {
            assert!(h.payload_len == 0 && h.n_digests == 0 && h.crc.is_none() && !h.zeros)
        }
        // A zeros frame (feature LINKS) carries no payload; any other chunk does.
        FrameKind::Chunk => assert!((h.payload_len > 0) != h.zeros),
    }

    // The trailer, as much of it as arrived.
    let rest = &frame[HEADER_LEN..];
    let want = (h.n_digests as usize).saturating_mul(DIGEST_LEN);
    let trailer = &rest[..want.min(rest.len())];
    match DigestEntry::decode_all(trailer) {
        Ok(entries) => {
            let mut out = Vec::with_capacity(trailer.len());
            for e in entries {
                e.encode_into(&mut out);
            }
            assert_eq!(out, trailer);
        }
        Err(e) => {
            assert_eq!(e, Error::UnexpectedEnd);
            assert_ne!(trailer.len() % DIGEST_LEN, 0);
        }
    }
});
