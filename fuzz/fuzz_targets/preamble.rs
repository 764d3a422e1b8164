//! `Preamble::decode` on arbitrary bytes: never panics, and what it accepts is
//! exactly what `encode` writes.
#![no_main]

use dmover_proto::Error;
use dmover_proto::preamble::{LEN, MAGIC, Preamble};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Preamble::decode(data) {
        Ok(p) => assert_eq!(p.encode()[..], data[..LEN]),
        Err(Error::UnexpectedEnd) => assert!(data.len() < LEN),
        Err(Error::BadMagic) => assert_ne!(data[..4], MAGIC),
        Err(Error::Unknown { .. } | Error::Reserved(_)) => {}
        Err(e) => panic!("unexpected error {e:?}"),
    }
});
