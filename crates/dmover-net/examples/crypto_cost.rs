//! Single-core cost of what a data stream could do per byte: CRC32C (today's chunk
//! check), a BLAKE3 keyed MAC, AES-256-GCM used as a MAC only (GMAC: data as AAD) and
//! AES-256-GCM sealing (encryption + tag), on 256 KiB records.
//!
//! `cargo run --release -p dmover-net --example crypto_cost [MiB]`

use std::time::Instant;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

fn rate(name: &str, bytes: usize, f: impl Fn()) {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("{name:<28} {:>7.2} GB/s", bytes as f64 / best / 1e9);
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(512);
    let rec = 256 << 10;
    let total = mib << 20;
    let mut data: Vec<u8> = (0..rec).map(|i| (i * 31 + 7) as u8).collect();
    let n = total / rec;
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).unwrap());
    let bkey = [9u8; 32];
    rate("memcpy", total, || {
        let mut dst = vec![0u8; rec];
        for _ in 0..n {
            dst.copy_from_slice(std::hint::black_box(&data));
        }
        std::hint::black_box(&dst);
    });
    rate("crc32c", total, || {
        let mut c = 0;
        for _ in 0..n {
            c ^= dmover_proto::digest::crc32c_append(0, std::hint::black_box(&data));
        }
        std::hint::black_box(c);
    });
    rate("blake3 keyed MAC", total, || {
        for _ in 0..n {
            std::hint::black_box(blake3::keyed_hash(&bkey, std::hint::black_box(&data)));
        }
    });
    rate("AES-256-GCM MAC only (GMAC)", total, || {
        for i in 0..n {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(std::hint::black_box(&data[..])),
                    &mut [],
                )
                .unwrap();
            let _ = std::hint::black_box(tag);
        }
    });
    let mut buf = std::mem::take(&mut data);
    rate("AES-256-GCM seal", total, || {
        let mut b = buf.clone();
        for i in 0..n {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::empty(),
                    &mut b,
                )
                .unwrap();
            let _ = std::hint::black_box(tag);
        }
    });
    buf.truncate(rec);
}
