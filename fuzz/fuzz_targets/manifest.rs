//! A manifest part from arbitrary bytes (postcard), validated; when valid, laid out
//! with a chunk size taken from the input and walked (at most `MAX_WALK` chunks).
//!
//! Input: 2 bytes choosing the chunk size, then a postcard `ManifestPart`.
#![no_main]

use dmover_fuzz::check_layout;
use dmover_proto::control::ManifestPart;
use dmover_proto::layout::{ALIGN, Layout, MAX_CHUNK, MIN_CHUNK};
use dmover_proto::manifest::{self, Totals};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((sel, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let Ok((part, _)) = postcard::take_from_bytes::<ManifestPart>(body) else {
        return;
    };
    let Ok(totals) = manifest::validate(&part.entries, 1 << 20) else {
        return;
    };
    assert_eq!(totals, Totals::of(&part.entries));
    let steps = (MAX_CHUNK - MIN_CHUNK) / ALIGN as u32 + 1;
    let chunk = MIN_CHUNK + u32::from(u16::from_be_bytes(*sel)) % steps * ALIGN as u32;
    let l = Layout::new(&part.entries, chunk).expect("a validated manifest lays out");
    check_layout(&l);
});
