//! Data-stream records (`dmover_net::stream::DataIo`, format in
//! `dmover_proto::record`): arbitrary bytes read as an authenticated or an encrypted
//! stream never panic and never yield data (nothing forged passes); arbitrary
//! plaintext written in arbitrary pieces reads back identical; any single flipped byte
//! of the sealed stream is detected.
#![no_main]

use std::io::IoSlice;

use dmover_net::stream::DataIo;
use dmover_proto::auth::Role;
use dmover_proto::control::DataProtection;
use dmover_proto::record;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

const KEY: [u8; 32] = [0x42; 32];

async fn read_all(p: DataProtection, wire: &[u8]) -> std::io::Result<Vec<u8>> {
    let (mut a, b) = duplex(wire.len().max(1) + 64);
    a.write_all(wire).await.unwrap();
    drop(a);
    let mut r = DataIo::new(b, p, &KEY, 0, Role::Client, None);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.map(|_| out)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(encrypt) = u.arbitrary::<bool>() else {
        return;
    };
    let p = if encrypt {
        DataProtection::Encrypted
    } else {
        DataProtection::Authenticated
    };
    rt().block_on(async {
        // 1. Raw bytes as a stream: only an empty input reads as an (empty) stream.
        let raw = u.peek_bytes(u.len()).unwrap_or_default().to_vec();
        match read_all(p, &raw).await {
            Ok(got) => assert!(raw.is_empty() && got.is_empty(), "forged records accepted"),
            Err(e) => assert!(matches!(
                e.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            )),
        }
        if let Some(h) = raw.first_chunk::<4>() {
            let _ = record::decode_header(h);
        }
        // 2. Arbitrary pieces through the writer, back through the reader.
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        while let Ok(n) = u.int_in_range(0..=300_000usize) {
            let fill: u8 = u.arbitrary().unwrap_or(0);
            pieces.push(vec![fill; n]);
            if pieces.len() == 6 || u.is_empty() {
                break;
            }
        }
        let (a, mut b) = duplex(8 << 20);
        let mut w = DataIo::new(a, p, &KEY, 0, Role::Server, None);
        let mut iov: Vec<IoSlice<'_>> = pieces.iter().map(|v| IoSlice::new(v)).collect();
        let mut iov: &mut [IoSlice<'_>] = &mut iov;
        while !iov.is_empty() {
            let n = w.write_vectored(iov).await.unwrap();
            if n == 0 {
                // Only empty slices are left.
                assert!(iov.iter().all(|s| s.is_empty()));
                break;
            }
            IoSlice::advance_slices(&mut iov, n);
        }
        w.shutdown().await.unwrap();
        drop(w);
        let mut wire = Vec::new();
        b.read_to_end(&mut wire).await.unwrap();
        let want: Vec<u8> = pieces.concat();
        assert_eq!(read_all(p, &wire).await.unwrap(), want);
        // 3. One flipped byte anywhere is detected.
        if !wire.is_empty() {
            let at = u.int_in_range(0..=wire.len() - 1).unwrap_or(0);
            let mut bad = wire.clone();
            bad[at] ^= u.int_in_range(1..=255u8).unwrap_or(1);
            assert!(
                read_all(p, &bad).await.is_err(),
                "flip at {at} not detected"
            );
        }
    });
});
