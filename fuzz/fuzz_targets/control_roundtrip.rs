//! Structured: builds an arbitrary control message from the input, then checks that
//! it encodes, decodes back to itself, and that every shorter cut of its frame asks
//! for more bytes, and a few cuts of its body are refused.
#![no_main]

use dmover_fuzz::arbitrary_control;
use dmover_proto::control::{Control, LEN_PREFIX, MAX_FRAME};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(msg) = arbitrary_control(&mut u) else {
        return;
    };
    let frame = msg.to_frame().expect("fuzz inputs are far below MAX_FRAME");
    assert_eq!(
        Control::decode(&frame, MAX_FRAME),
        Ok(Some((msg.clone(), frame.len())))
    );
    for cut in 0..frame.len() {
        assert_eq!(Control::decode(&frame[..cut], MAX_FRAME), Ok(None));
    }
    let body = &frame[LEN_PREFIX..];
    for _ in 0..4 {
        let Ok(cut) = u.int_in_range(0..=body.len() - 1) else {
            break;
        };
        assert!(
            Control::decode_body(&body[..cut]).is_err(),
            "prefix decoded"
        );
    }
});
