//! `DataHello::decode` and `JoinStatus::decode` on arbitrary bytes: never panic, and
//! what they accept re-encodes to the same bytes.
#![no_main]

use dmover_proto::Error;
use dmover_proto::data::{DataHello, HELLO_LEN, JoinStatus};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match DataHello::decode(data) {
        Ok(h) => assert_eq!(h.encode()[..], data[..HELLO_LEN]),
        Err(Error::UnexpectedEnd) => assert!(data.len() < HELLO_LEN),
        Err(Error::Reserved(_)) => assert!(data[10..16].iter().any(|&b| b != 0)),
        Err(e) => panic!("unexpected error {e:?}"),
    }
    if let Some(&b) = data.first() {
        match JoinStatus::decode(b) {
            Ok(s) => assert_eq!(s as u8, b),
            Err(e) => assert!(matches!(e, Error::Unknown { .. })),
        }
    }
});
