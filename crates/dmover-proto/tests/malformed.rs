//! One test per malformed input that must be rejected, each checking the exact
//! [`Error`] variant, plus the boundary value just inside each limit, which must pass.
//!
//! This binary installs a counting allocator so that the "no unbounded allocation"
//! promise can be checked, not just the error.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;

use dmover_proto::Error;
use dmover_proto::control::{
    Auth, Control, Credential, DataProtection, DirectIo, ErrorCode, ErrorMsg, Hello, LEN_PREFIX,
    MAX_FRAME, ManifestPart, Op, Open, PACKED,
};
use dmover_proto::data::{
    DIGEST_LEN, DataHello, DigestEntry, FLAG_CRC, FrameHeader, FrameKind, FrameLimits, HEADER_LEN,
    HELLO_LEN, JoinStatus,
};
use dmover_proto::layout::{self, ALIGN, Layout, MAX_CHUNK, MIN_CHUNK};
use dmover_proto::manifest::{
    self, Entry, EntryKind, MAX_LINK_TARGET, MAX_NAME, Mtime, NO_PARENT, Totals,
};
use dmover_proto::preamble::{self, ConnKind, Preamble};

// ---------------------------------------------------------------------------------
// Allocation accounting

/// The system allocator, counting the bytes each thread asks for.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: never panic inside the allocator, even during thread teardown.
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes)));
}

// SAFETY: every call is forwarded unchanged to `System`; counting touches only a
// thread-local `Cell`, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` and returns its result with the number of bytes it allocated on this
/// thread (reallocations count their full new size).
fn allocated_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATED.with(Cell::get);
    let r = f();
    let after = ALLOCATED.with(Cell::get);
    (r, after - before)
}

// ---------------------------------------------------------------------------------
// Helpers

fn is_violation<T: std::fmt::Debug>(r: Result<T, Error>, needle: &str) {
    match r {
        Err(Error::Violation(msg)) => {
            assert!(msg.contains(needle), "{msg:?} does not mention {needle:?}")
        }
        other => panic!("expected a violation mentioning {needle:?}, got {other:?}"),
    }
}

fn is_malformed<T: std::fmt::Debug>(r: Result<T, Error>) {
    assert!(
        matches!(r, Err(Error::Malformed(_))),
        "expected Malformed, got {r:?}"
    );
}

/// A control frame around `body`.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn decode_frame(body: &[u8]) -> Result<Option<(Control, usize)>, Error> {
    Control::decode(&frame(body), MAX_FRAME)
}

const LIMITS: FrameLimits = FrameLimits {
    max_payload: 1 << 20,
    max_digests: 64,
};

/// A valid CHUNK header with a CRC, to corrupt one field at a time.
fn chunk_header() -> [u8; HEADER_LEN] {
    FrameHeader {
        kind: FrameKind::Chunk,
        chunk: 9,
        n_digests: 1,
        payload_len: 4096,
        crc: Some(0x1234_5678),
        zeros: false,
        part: false,
    }
    .encode()
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn entry(parent: u32, name: &[u8], kind: EntryKind) -> Entry {
    Entry {
        parent,
        name: name.to_vec(),
        kind,
        mode: 0o644,
        mtime: Mtime::default(),
    }
}

fn root_file(name: &[u8], size: u64) -> Entry {
    entry(NO_PARENT, name, EntryKind::File { size })
}

fn root_dir(name: &[u8]) -> Entry {
    entry(NO_PARENT, name, EntryKind::Dir)
}

fn symlink(target: &[u8]) -> Entry {
    entry(
        NO_PARENT,
        b"link",
        EntryKind::Symlink {
            target: target.to_vec(),
        },
    )
}

// ---------------------------------------------------------------------------------
// Preamble

#[test]
fn preamble_bad_magic() {
    for bad in [
        *b"DMOW\x01\x00\x00\x01",
        *b"dmov\x01\x00\x00\x01",
        *b"GET / HT",
        *b"\x16\x03\x01\x00\x01\x00\x00\x01", // a TLS ClientHello
        [0; 8],
    ] {
        assert_eq!(Preamble::decode(&bad), Err(Error::BadMagic), "{bad:?}");
    }
}

#[test]
fn preamble_unknown_conn_kind() {
    for kind in [0u8, 3, 0x80, 0xff] {
        let mut b = Preamble {
            kind: ConnKind::Control,
            version: 1,
            busy: None,
        }
        .encode();
        b[4] = kind;
        assert_eq!(
            Preamble::decode(&b),
            Err(Error::Unknown {
                what: "connection kind",
                value: kind.into()
            })
        );
    }
}

#[test]
fn preamble_reserved_byte() {
    for v in [1u8, 0x80, 0xff] {
        let mut b = Preamble {
            kind: ConnKind::Data,
            version: 1,
            busy: None,
        }
        .encode();
        b[5] = v;
        assert_eq!(
            Preamble::decode(&b),
            Err(Error::Reserved("preamble byte 5"))
        );
    }
}

#[test]
fn preamble_truncated() {
    let b = Preamble {
        kind: ConnKind::Control,
        version: 1,
        busy: None,
    }
    .encode();
    for n in 0..preamble::LEN {
        assert_eq!(
            Preamble::decode(&b[..n]),
            Err(Error::UnexpectedEnd),
            "{n} bytes"
        );
    }
}

// ---------------------------------------------------------------------------------
// Data hello and join status

fn hello_bytes() -> [u8; HELLO_LEN] {
    DataHello {
        session: 77,
        stream: 3,
        nonce: [0x5a; 32],
    }
    .encode()
}

#[test]
fn data_hello_reserved_bytes() {
    for i in 10..16 {
        let mut b = hello_bytes();
        b[i] = 1;
        assert_eq!(
            DataHello::decode(&b),
            Err(Error::Reserved("data hello bytes 10..16")),
            "byte {i}"
        );
    }
}

#[test]
fn data_hello_truncated() {
    let b = hello_bytes();
    for n in 0..HELLO_LEN {
        assert_eq!(
            DataHello::decode(&b[..n]),
            Err(Error::UnexpectedEnd),
            "{n} bytes"
        );
    }
}

#[test]
fn join_status_unknown() {
    for v in [4u8, 0x7f, 0xff] {
        assert_eq!(
            JoinStatus::decode(v),
            Err(Error::Unknown {
                what: "join status",
                value: v.into()
            })
        );
    }
}

// ---------------------------------------------------------------------------------
// Frame headers and digest trailers

#[test]
fn frame_header_baseline_is_valid() {
    // The header the following tests corrupt is itself accepted.
    assert!(FrameHeader::decode(&chunk_header(), &LIMITS).is_ok());
}

#[test]
fn frame_unknown_kind() {
    for kind in [0u8, 3, 0xff] {
        let mut b = chunk_header();
        b[0] = kind;
        assert_eq!(
            FrameHeader::decode(&b, &LIMITS),
            Err(Error::Unknown {
                what: "frame kind",
                value: kind.into()
            })
        );
    }
}

#[test]
fn frame_unknown_flags() {
    for flags in [0x08u8, 0x09, 0x80, 0xff] {
        let mut b = chunk_header();
        b[1] = flags;
        assert_eq!(
            FrameHeader::decode(&b, &LIMITS),
            Err(Error::Reserved("frame flags")),
            "flags {flags:#x}"
        );
    }
}

#[test]
fn frame_reserved_bytes() {
    for i in [2, 3] {
        let mut b = chunk_header();
        b[i] = 0x01;
        assert_eq!(
            FrameHeader::decode(&b, &LIMITS),
            Err(Error::Reserved("frame bytes 2..4")),
            "byte {i}"
        );
    }
}

#[test]
fn frame_crc_without_flag() {
    let mut b = chunk_header();
    assert_eq!(b[1], FLAG_CRC);
    b[1] = 0;
    assert_eq!(
        FrameHeader::decode(&b, &LIMITS),
        Err(Error::Reserved("crc32c without its flag"))
    );
    // With the CRC field cleared too, the header is fine.
    set_u32(&mut b, 20, 0);
    assert!(FrameHeader::decode(&b, &LIMITS).is_ok());
}

#[test]
fn frame_payload_over_limit() {
    let mut b = chunk_header();
    set_u32(&mut b, 16, LIMITS.max_payload);
    assert!(
        FrameHeader::decode(&b, &LIMITS).is_ok(),
        "the limit itself is fine"
    );
    for len in [LIMITS.max_payload + 1, u32::MAX] {
        set_u32(&mut b, 16, len);
        assert_eq!(
            FrameHeader::decode(&b, &LIMITS),
            Err(Error::TooLarge {
                what: "frame payload",
                value: len.into(),
                limit: LIMITS.max_payload.into()
            })
        );
    }
}

#[test]
fn frame_digest_count_over_limit() {
    let mut b = chunk_header();
    set_u32(&mut b, 4, LIMITS.max_digests);
    assert!(
        FrameHeader::decode(&b, &LIMITS).is_ok(),
        "the limit itself is fine"
    );
    for n in [LIMITS.max_digests + 1, u32::MAX] {
        set_u32(&mut b, 4, n);
        assert_eq!(
            FrameHeader::decode(&b, &LIMITS),
            Err(Error::TooLarge {
                what: "frame digest count",
                value: n.into(),
                limit: LIMITS.max_digests.into()
            })
        );
    }
}

#[test]
fn frame_end_with_payload() {
    let mut b = FrameHeader::end(3).encode();
    set_u32(&mut b, 16, 1);
    is_violation(FrameHeader::decode(&b, &LIMITS), "END frame");
}

#[test]
fn frame_end_with_digests() {
    let mut b = FrameHeader::end(3).encode();
    set_u32(&mut b, 4, 1);
    is_violation(FrameHeader::decode(&b, &LIMITS), "END frame");
}

#[test]
fn frame_end_with_crc() {
    let mut b = FrameHeader::end(3).encode();
    b[1] = FLAG_CRC;
    is_violation(FrameHeader::decode(&b, &LIMITS), "END frame");
}

#[test]
fn frame_empty_chunk() {
    let mut b = chunk_header();
    set_u32(&mut b, 16, 0);
    // Otherwise valid: a CRC flag with the CRC of nothing, which is 0.
    set_u32(&mut b, 20, 0);
    is_violation(FrameHeader::decode(&b, &LIMITS), "empty CHUNK");
}

#[test]
fn frame_zeros_with_a_payload_or_on_end() {
    // A zeros frame carries no payload: a length is refused.
    let mut b = chunk_header();
    b[1] = FLAG_CRC | 2;
    is_violation(
        FrameHeader::decode(&b, &LIMITS),
        "zeros CHUNK frame with a payload",
    );
    // Without one it is a chunk of zeros.
    set_u32(&mut b, 16, 0);
    let h = FrameHeader::decode(&b, &LIMITS).unwrap();
    assert!(h.zeros && h.payload_len == 0 && h.crc == Some(0x1234_5678));
    let mut b = FrameHeader::end(3).encode();
    b[1] = 2;
    is_violation(FrameHeader::decode(&b, &LIMITS), "END frame marked zeros");
}

#[test]
fn frame_header_truncated() {
    let b = chunk_header();
    for n in 0..HEADER_LEN {
        assert_eq!(
            FrameHeader::decode(&b[..n], &LIMITS),
            Err(Error::UnexpectedEnd),
            "{n} bytes"
        );
    }
}

#[test]
fn digest_trailer_truncated() {
    let mut b = Vec::new();
    for file in 0..3 {
        DigestEntry { file, digest: 1 }.encode_into(&mut b);
    }
    for n in (0..b.len()).filter(|n| n % DIGEST_LEN != 0) {
        assert!(
            matches!(DigestEntry::decode_all(&b[..n]), Err(Error::UnexpectedEnd)),
            "{n} bytes"
        );
    }
}

// ---------------------------------------------------------------------------------
// Control frames

#[test]
fn control_frame_over_max_from_prefix_alone() {
    // The counter works: a decode that reads a body does allocate.
    let (_, bytes) = allocated_during(|| decode_frame(&[0x00, 0x01, b'x']));
    assert!(bytes > 0);
    // Only the 4-byte prefix has arrived: the decoder must refuse now, not ask for
    // 4 GiB more, and must not allocate for the body it will never read.
    for (prefix, max) in [
        ((MAX_FRAME as u32 + 1).to_be_bytes(), MAX_FRAME),
        (u32::MAX.to_be_bytes(), MAX_FRAME),
        (1u32.to_be_bytes(), 0),
        (17u32.to_be_bytes(), 16),
    ] {
        let err = Error::TooLarge {
            what: "control frame",
            // The top bit marks a packed body; the rest is the length.
            value: (u32::from_be_bytes(prefix) & !PACKED).into(),
            limit: max as u64,
        };
        let (r, bytes) = allocated_during(|| Control::decode(&prefix, max));
        assert_eq!(r, Err(err.clone()));
        assert_eq!(bytes, 0, "allocated {bytes} bytes");
        assert_eq!(Control::frame_head(prefix, max), Err(err.clone()));
        // Bytes after the prefix change nothing.
        let mut more = prefix.to_vec();
        more.extend_from_slice(&[8; 64]);
        assert_eq!(Control::decode(&more, max), Err(err));
    }
}

/// A packed frame (protocol 7) whose zstd frame unpacks to more than the limit: refused
/// from the size it states, before a buffer is sized for it.
#[test]
fn packed_frame_over_max_refused_before_unpacking() {
    let body = vec![0u8; 1 << 20];
    let z = zstd::bulk::compress(&body, 1).unwrap();
    let mut frame = (PACKED | z.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&z);
    let (r, bytes) = allocated_during(|| Control::decode(&frame, 64 << 10));
    assert_eq!(
        r,
        Err(Error::TooLarge {
            what: "unpacked control frame",
            value: 1 << 20,
            limit: 64 << 10,
        })
    );
    assert!(bytes < 64 << 10, "allocated {bytes} bytes");
}

/// Packed frames that are not one zstd frame stating its size and holding one message:
/// malformed, never a panic.
#[test]
fn packed_frames_malformed() {
    let msg = Control::Error(ErrorMsg {
        code: ErrorCode::Io,
        message: "x".repeat(2000),
    });
    let mut good = Vec::new();
    msg.encode_packed(&mut good).unwrap();
    assert_ne!(
        u32::from_be_bytes(good[..4].try_into().unwrap()) & PACKED,
        0
    );
    let packed_frame = |z: &[u8]| {
        let mut f = (PACKED | z.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(z);
        f
    };
    let body = msg.to_frame().unwrap()[LEN_PREFIX..].to_vec();
    // No content size in the zstd frame (streamed without one).
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    enc.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut enc, &body).unwrap();
    let sizeless = enc.finish().unwrap();
    is_malformed(Control::decode(&packed_frame(&sizeless), MAX_FRAME));
    // Not zstd at all.
    is_malformed(Control::decode(&packed_frame(&body), MAX_FRAME));
    // Cut short.
    let z = &good[LEN_PREFIX..];
    is_malformed(Control::decode(&packed_frame(&z[..z.len() - 3]), MAX_FRAME));
    // A second zstd frame behind the first unpacks to more than the first said.
    let mut two = z.to_vec();
    two.extend_from_slice(z);
    is_malformed(Control::decode(&packed_frame(&two), MAX_FRAME));
    // A packed body that is not a message.
    let junk = zstd::bulk::compress(&[0xff; 600], 1).unwrap();
    is_malformed(Control::decode(&packed_frame(&junk), MAX_FRAME));
    // The good one decodes.
    assert_eq!(
        Control::decode(&good, MAX_FRAME),
        Ok(Some((msg, good.len())))
    );
}

#[test]
fn control_frame_at_max_waits_for_body() {
    // A prefix at the limit is accepted and the decoder waits, still allocating nothing.
    let prefix = (MAX_FRAME as u32).to_be_bytes();
    let (r, bytes) = allocated_during(|| Control::decode(&prefix, MAX_FRAME));
    assert_eq!(r, Ok(None));
    assert_eq!(bytes, 0);
}

#[test]
fn control_encode_over_max() {
    // A manifest part whose body exceeds MAX_FRAME is refused, and nothing is written.
    let name = vec![b'x'; MAX_NAME];
    let entries: Vec<Entry> = (0..(MAX_FRAME / MAX_NAME + 1))
        .map(|_| root_file(&name, 1))
        .collect();
    let msg = Control::Manifest(ManifestPart { entries });
    let mut out = Vec::new();
    let r = msg.encode(&mut out);
    assert!(
        matches!(r, Err(Error::TooLarge { what: "control frame", limit, .. }) if limit == MAX_FRAME as u64),
        "{r:?}"
    );
    assert!(out.is_empty());
}

#[test]
fn control_trailing_bytes() {
    // Go is one byte; a body of Go plus one more byte is malformed.
    let r = decode_frame(&[0x08, 0x00]);
    assert!(
        matches!(&r, Err(Error::Malformed(m)) if m.contains("1 trailing bytes")),
        "{r:?}"
    );
    is_malformed(Control::decode_body(&[0x02, 0x00, 0xff, 0xff]));
    // The same bytes split into two frames are two messages.
    let mut two = frame(&[0x08]);
    two.extend(frame(&[0x02, 0x00]));
    assert_eq!(Control::decode(&two, MAX_FRAME), Ok(Some((Control::Go, 5))));
}

#[test]
fn control_empty_body() {
    is_malformed(decode_frame(&[]));
}

#[test]
fn control_truncated_frame_waits() {
    // Within a frame, a short buffer means "more bytes needed", never an error.
    let f = Control::Go.to_frame().unwrap();
    for n in 0..f.len() {
        assert_eq!(Control::decode(&f[..n], MAX_FRAME), Ok(None), "{n} bytes");
    }
}

#[test]
fn control_truncated_body() {
    // A frame whose length prefix cuts its message short: every proper prefix of a
    // body is malformed (postcard encodings are self-delimiting).
    let msgs = [
        Control::Hello(Hello {
            software: "dmover 0.1.0".into(),
            nonce: [7; 32],
        }),
        Control::Auth(Auth {
            user: "u".into(),
            credential: Credential::Token { proof: [1; 32] },
        }),
        Control::Auth(Auth {
            user: String::new(),
            credential: Credential::Key {
                public: [2; 32],
                signature: vec![3; 64],
            },
        }),
        Control::Open(Open {
            op: Op::Pull {
                sources: vec![b"a/b".to_vec(), b"c".to_vec()],
            },
            streams: 300,
            chunk_size: 4 << 20,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Encrypted,
            features: 0,
        }),
        Control::Manifest(ManifestPart {
            entries: vec![
                root_dir(b"d"),
                entry(
                    0,
                    b"l",
                    EntryKind::Symlink {
                        target: b"../x".to_vec(),
                    },
                ),
            ],
        }),
        Control::Error(ErrorMsg {
            code: ErrorCode::Io,
            message: "disk full".into(),
        }),
    ];
    for msg in msgs {
        let f = msg.to_frame().unwrap();
        let body = &f[LEN_PREFIX..];
        for n in 0..body.len() {
            is_malformed(decode_frame(&body[..n]));
        }
    }
}

#[test]
fn control_unknown_message_tag() {
    // Control has variants 0..=15.
    is_malformed(decode_frame(&[0x10]));
    is_malformed(decode_frame(&[0x7f]));
    // A tag too large for u32.
    is_malformed(decode_frame(&[0xff, 0xff, 0xff, 0xff, 0x7f]));
}

#[test]
fn control_unknown_auth_method() {
    let mut body = vec![0x01, 0x00]; // Welcome, software ""
    body.extend_from_slice(&[0; 32]); // nonce
    body.push(0x01); // AuthMethod::Required: valid
    assert!(decode_frame(&body).is_ok());
    *body.last_mut().unwrap() = 0x02; // no third method
    is_malformed(decode_frame(&body));
}

#[test]
fn control_unknown_op() {
    // Open, op tag 3 (only Push = 0, Pull = 1 and MemTest = 2 exist), then a valid rest
    // (the last byte is the features, since protocol 4).
    is_malformed(decode_frame(&[
        0x04, 0x03, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x00, 0x01, 0x00,
    ]));
    assert!(
        decode_frame(&[
            0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x00, 0x01, 0x00
        ])
        .is_ok()
    );
    // A protocol 3 Open, without its features, is cut short.
    is_malformed(decode_frame(&[
        0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x00, 0x01,
    ]));
}

#[test]
fn control_unknown_protection_and_credential() {
    // Open push to "", 8 streams, 64 KiB chunks, checksum, Never, protection tag 3.
    is_malformed(decode_frame(&[
        0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x00, 0x03,
    ]));
    // An Open without its protection byte (a version 1 Open).
    is_malformed(decode_frame(&[
        0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x00,
    ]));
    // Auth, user "", credential tag 3.
    is_malformed(decode_frame(&[0x02, 0x00, 0x03]));
    // Auth, user "", Key with a signature length past the end.
    let mut body = vec![0x02, 0x00, 0x02];
    body.extend_from_slice(&[0; 32]);
    body.push(0x40);
    is_malformed(decode_frame(&body));
}

#[test]
fn control_unknown_entry_kind() {
    // Manifest, 1 entry: root, name "a", kind 3 (File/Dir/Symlink are 0..=2).
    is_malformed(decode_frame(&[
        0x06, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, b'a', 0x03, 0x00, 0x00, 0x00,
    ]));
    assert!(
        decode_frame(&[
            0x06, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, b'a', 0x01, 0x00, 0x00, 0x00,
        ])
        .is_ok()
    );
}

#[test]
fn control_unknown_error_code() {
    // Error, code 12 (Protocol..=Changed are 0..=11), empty message.
    is_malformed(decode_frame(&[0x0a, 0x0c, 0x00]));
    assert!(decode_frame(&[0x0a, 0x0b, 0x00]).is_ok());
}

#[test]
fn control_unknown_direct_io() {
    // Open push to "", 8 streams, 64 KiB chunks, checksum on, direct_io tag 3
    // (Never, Auto, Always are 0..=2).
    // Then the protection (Authenticated) and the features (none).
    let mut body = vec![
        0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x01, 0x02, 0x01, 0x00,
    ];
    assert!(decode_frame(&body).is_ok());
    body[8] = 0x03;
    is_malformed(decode_frame(&body));
}

#[test]
fn control_bad_bool() {
    // Open push to "", 8 streams, 64 KiB chunks, checksum = 2.
    is_malformed(decode_frame(&[
        0x04, 0x00, 0x00, 0x08, 0x80, 0x80, 0x04, 0x02, 0x00, 0x01,
    ]));
}

#[test]
fn control_bad_option_tag() {
    // AuthOk with option tag 2.
    let mut body = vec![0x03, 0x02];
    body.extend_from_slice(&[0; 32]);
    is_malformed(decode_frame(&body));
}

#[test]
fn control_bad_utf8() {
    // Hello whose software string is not UTF-8.
    let mut body = vec![0x00, 0x02, 0xc3, 0x28];
    body.extend_from_slice(&[0; 32]);
    is_malformed(decode_frame(&body));
}

#[test]
fn control_varint_overflow() {
    // Open with streams = 65536, which does not fit a u16.
    is_malformed(decode_frame(&[
        0x04, 0x00, 0x00, 0x80, 0x80, 0x04, 0x80, 0x80, 0x04, 0x01, 0x00,
    ]));
    // Session with an id varint of 11 bytes.
    let mut body = vec![0x05];
    body.extend_from_slice(&[0xff; 10]);
    body.push(0x01);
    body.extend_from_slice(&[0; 32]);
    body.extend_from_slice(&[0x08, 0x80, 0x80, 0x04]);
    is_malformed(decode_frame(&body));
}

#[test]
fn control_huge_claimed_lengths_allocate_little() {
    // Counts and lengths are only claims: a frame of a few bytes announcing 2^32
    // manifest entries, source paths or name bytes must fail without allocating
    // anything near what it claims.
    let cases: [&[u8]; 4] = [
        // Manifest with u32::MAX entries.
        &[0x06, 0xff, 0xff, 0xff, 0xff, 0x0f],
        // Manifest with 2^63 entries.
        &[
            0x06, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
        ],
        // Open pull of u32::MAX sources, the first claiming u32::MAX bytes.
        &[
            0x04, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x61,
        ],
        // Hello whose software string claims u32::MAX bytes.
        &[0x00, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x61, 0x62],
    ];
    for body in cases {
        let (r, bytes) = allocated_during(|| decode_frame(body));
        is_malformed(r);
        assert!(bytes <= 4 << 20, "{body:02x?} allocated {bytes} bytes");
    }
}

// ---------------------------------------------------------------------------------
// Manifest validation

#[test]
fn manifest_empty_name() {
    is_violation(
        manifest::validate(&[root_file(b"", 1)], 10),
        "invalid file name",
    );
}

#[test]
fn manifest_dot_name() {
    is_violation(
        manifest::validate(&[root_dir(b".")], 10),
        "invalid file name",
    );
}

#[test]
fn manifest_dotdot_name() {
    let entries = [root_dir(b"d"), entry(0, b"..", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "invalid file name");
    // Names that merely start with dots are fine.
    let ok = [
        root_dir(b"..."),
        root_file(b".hidden", 1),
        root_file(b"..x", 1),
    ];
    assert!(manifest::validate(&ok, 10).is_ok());
}

#[test]
fn manifest_name_with_slash() {
    for name in [&b"a/b"[..], b"/", b"/etc", b"x/"] {
        is_violation(manifest::validate(&[root_file(name, 1)], 10), "'/' or NUL");
    }
}

#[test]
fn manifest_name_with_nul() {
    for name in [&b"a\0b"[..], b"\0", b"x\0"] {
        is_violation(manifest::validate(&[root_file(name, 1)], 10), "'/' or NUL");
    }
}

#[test]
fn manifest_name_too_long() {
    assert!(manifest::validate(&[root_file(&[b'n'; MAX_NAME], 1)], 10).is_ok());
    assert_eq!(
        manifest::validate(&[root_file(&[b'n'; MAX_NAME + 1], 1)], 10),
        Err(Error::TooLarge {
            what: "file name length",
            value: MAX_NAME as u64 + 1,
            limit: MAX_NAME as u64
        })
    );
    assert_eq!(manifest::validate_name(&[b'n'; MAX_NAME]), Ok(()));
}

#[test]
fn manifest_parent_not_preceding() {
    // Parent is the entry itself.
    let entries = [root_dir(b"d"), entry(1, b"x", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "does not precede");
    // Parent comes later.
    let entries = [entry(1, b"x", EntryKind::Dir), root_dir(b"d")];
    is_violation(manifest::validate(&entries, 10), "does not precede");
    // Parent is past the end.
    let entries = [root_dir(b"d"), entry(7, b"x", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "does not precede");
    // Parent index just below NO_PARENT.
    let entries = [entry(NO_PARENT - 1, b"x", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "does not precede");
}

#[test]
fn manifest_parent_not_a_dir() {
    let entries = [root_file(b"f", 1), entry(0, b"x", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "not a directory");
    let entries = [symlink(b"/tmp"), entry(0, b"x", EntryKind::Dir)];
    is_violation(manifest::validate(&entries, 10), "not a directory");
}

#[test]
fn manifest_duplicate_name() {
    // Two roots with one name would land on the same destination path.
    is_violation(
        manifest::validate(&[root_file(b"a", 1), root_dir(b"a")], 10),
        "twice",
    );
    // Two children of one directory.
    let entries = [
        root_dir(b"d"),
        entry(0, b"x", EntryKind::File { size: 1 }),
        entry(0, b"y", EntryKind::Dir),
        entry(0, b"x", EntryKind::Dir),
    ];
    is_violation(manifest::validate(&entries, 10), "twice");
    // The same name in different directories is fine.
    let entries = [
        root_dir(b"d"),
        root_dir(b"e"),
        entry(0, b"x", EntryKind::Dir),
        entry(1, b"x", EntryKind::Dir),
        entry(2, b"x", EntryKind::Dir),
    ];
    assert!(manifest::validate(&entries, 10).is_ok());
}

#[test]
fn manifest_mode_out_of_range() {
    let mut e = root_file(b"f", 1);
    e.mode = 0o7777;
    assert!(manifest::validate(&[e.clone()], 10).is_ok());
    for mode in [0o10000, 0o100644, u32::MAX] {
        e.mode = mode;
        is_violation(manifest::validate(&[e.clone()], 10), "has mode");
    }
}

#[test]
fn manifest_nsec_out_of_range() {
    let mut e = root_dir(b"d");
    e.mtime = Mtime {
        sec: i64::MIN,
        nsec: 999_999_999,
    };
    assert!(manifest::validate(&[e.clone()], 10).is_ok());
    for nsec in [1_000_000_000, u32::MAX] {
        e.mtime.nsec = nsec;
        is_violation(manifest::validate(&[e.clone()], 10), "nanoseconds");
    }
}

#[test]
fn manifest_symlink_target_empty() {
    is_violation(manifest::validate(&[symlink(b"")], 10), "symlink target");
}

#[test]
fn manifest_symlink_target_too_long() {
    assert!(manifest::validate(&[symlink(&[b't'; MAX_LINK_TARGET])], 10).is_ok());
    is_violation(
        manifest::validate(&[symlink(&[b't'; MAX_LINK_TARGET + 1])], 10),
        "symlink target",
    );
}

#[test]
fn manifest_symlink_target_nul() {
    is_violation(
        manifest::validate(&[symlink(b"a\0b")], 10),
        "symlink target",
    );
    // Slashes and dots are fine in a target: links are copied, never followed.
    assert!(manifest::validate(&[symlink(b"../../etc/passwd")], 10).is_ok());
}

#[test]
fn manifest_too_many_entries() {
    let entries: Vec<Entry> = (0..4).map(|i| root_file(&[b'a' + i], 1)).collect();
    assert!(manifest::validate(&entries, 4).is_ok());
    assert_eq!(
        manifest::validate(&entries, 3),
        Err(Error::TooLarge {
            what: "manifest entries",
            value: 4,
            limit: 3
        })
    );
    assert!(matches!(
        manifest::validate(&entries[..1], 0),
        Err(Error::TooLarge {
            what: "manifest entries",
            ..
        })
    ));
}

#[test]
fn manifest_total_size_overflow() {
    let entries = [
        root_file(b"a", u64::MAX / 2 + 1),
        root_file(b"b", u64::MAX / 2 + 1),
    ];
    is_violation(manifest::validate(&entries, 10), "overflows 64 bits");
    let entries = [root_file(b"a", u64::MAX), root_file(b"b", 1)];
    is_violation(manifest::validate(&entries, 10), "overflows 64 bits");
}

#[test]
fn manifest_total_size_over_limit() {
    let limit = 1u64 << 62;
    let ok = [root_file(b"a", limit - 1), root_file(b"b", 1)];
    assert_eq!(
        manifest::validate(&ok, 10).map(|t| t.bytes),
        Ok(limit),
        "2^62 bytes exactly is accepted"
    );
    let entries = [root_file(b"a", limit), root_file(b"b", 1)];
    assert_eq!(
        manifest::validate(&entries, 10),
        Err(Error::TooLarge {
            what: "dataset size",
            value: limit + 1,
            limit
        })
    );
    // A dataset at the limit still lays out, padding included.
    let l = Layout::new(&ok, MAX_CHUNK).unwrap();
    assert!(l.total() >= limit);
}

#[test]
fn manifest_valid_baseline() {
    let entries = [
        root_dir(b"d"),
        entry(0, b"f", EntryKind::File { size: 10 }),
        entry(
            0,
            b"l",
            EntryKind::Symlink {
                target: b"f".to_vec(),
            },
        ),
        entry(0, b"e", EntryKind::Dir),
        entry(3, b"f", EntryKind::File { size: 0 }),
    ];
    assert_eq!(
        manifest::validate(&entries, 5),
        Ok(Totals {
            entries: 5,
            files: 2,
            dirs: 2,
            symlinks: 1,
            bytes: 10
        })
    );
}

// ---------------------------------------------------------------------------------
// Layout

#[test]
fn bad_chunk_sizes() {
    let align = ALIGN as u32;
    for chunk in [
        0,
        1,
        align,
        MIN_CHUNK - align,
        MIN_CHUNK + 1,
        MIN_CHUNK + align / 2,
        MAX_CHUNK - 1,
        MAX_CHUNK + align,
        u32::MAX,
    ] {
        is_violation(layout::validate_chunk_size(chunk), "chunk size");
        is_violation(Layout::new(&[root_file(b"a", 1)], chunk), "chunk size");
    }
    for chunk in [
        MIN_CHUNK,
        MIN_CHUNK + align,
        layout::DEFAULT_CHUNK,
        MAX_CHUNK,
    ] {
        assert_eq!(layout::validate_chunk_size(chunk), Ok(()));
    }
}

#[test]
fn layout_overflow_of_unvalidated_manifest() {
    // Layout::new is meant for validated manifests, but must not overflow on others.
    for entries in [
        vec![root_file(b"a", u64::MAX)],
        vec![root_file(b"a", u64::MAX - ALIGN)],
        vec![root_file(b"a", 1), root_file(b"b", u64::MAX - 1)],
        vec![root_file(b"a", u64::MAX / 2), root_file(b"b", u64::MAX / 2)],
    ] {
        is_violation(Layout::new(&entries, MIN_CHUNK), "overflows 64 bits");
    }
}

#[test]
fn chunk_index_out_of_range() {
    // A CHUNK frame's index comes from the wire: any u64 must be safe to look up.
    let l = Layout::new(&[root_file(b"a", 100_000)], MIN_CHUNK).unwrap();
    assert_eq!(l.n_chunks(), 2);
    assert_eq!(l.chunk_bounds(1), (65_536, 100_000));
    for k in [2, 3, u64::MAX / u64::from(MIN_CHUNK) + 1, u64::MAX] {
        assert_eq!(l.chunk_bounds(k), (100_000, 100_000), "chunk {k}");
        assert_eq!(l.pieces(k).count(), 0);
        assert_eq!(l.wire_len(k), 0);
        let mut segs = vec![(1, 1)];
        l.segments(k, &mut segs);
        assert!(segs.is_empty());
    }
}
