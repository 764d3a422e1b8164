//! Structured: whole sessions on the production drivers, from arbitrary bytes
//! (`dmover_fuzz::pair`, which says what varies and what is checked).
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dmover_fuzz::pair::check(&mut Unstructured::new(data));
});
