//! `Control::decode` on arbitrary bytes, read as a stream of frames; and
//! `Control::decode_body` on the same bytes read as one body. Never panics, takes
//! only whole frames under the limit, and whatever decodes re-encodes to a frame that
//! decodes to the same message.
//!
//! Input: one byte choosing the frame limit, then the stream.
#![no_main]

use dmover_fuzz::{check_control_stream, check_reencode};
use dmover_proto::control::{Control, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, buf)) = data.split_first() else {
        return;
    };
    let max = match sel % 4 {
        0 => MAX_FRAME,
        1 => 0,
        2 => 64,
        _ => usize::MAX,
    };
    check_control_stream(buf, max);
    if let Ok(m) = Control::decode_body(buf) {
        check_reencode(&m);
    }
});
