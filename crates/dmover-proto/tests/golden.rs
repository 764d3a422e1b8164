//! Golden wire tests: the exact bytes of every fixed header and of each control
//! message, written out as commented hexdumps.
//!
//! These pin the wire format. Each test encodes a value and compares it with the
//! expected bytes, then decodes the expected bytes and compares with the value. If a
//! field moves, an integer changes width or encoding, or an enum variant is reordered
//! or inserted anywhere but at the end, a test here fails: that is a protocol change
//! and needs a new protocol version, not a new hexdump.
//!
//! Control bodies are postcard: unsigned integers wider than a byte are LEB128
//! varints (7 bits a byte, least significant group first, high bit = "more"), signed
//! ones are zigzag-encoded first, `u8` and `bool` are one byte, byte strings and
//! vectors are a varint length then the elements, fixed arrays are their bytes with no
//! length, `Option` is a `00`/`01` byte then the value, and an enum is its varint
//! variant index (declaration order) then the variant's fields.

use dmover_proto::control::{
    Auth, AuthMethod, AuthOk, Control, Credential, DataProtection, DirectIo, EntryRange, ErrorCode,
    ErrorMsg, FailedFile, Growth, Have, Hello, MAX_FRAME, ManifestEnd, ManifestPart, Op, Open,
    PartialFile, Plan, SendReport, SessionInfo, SessionOptions, Summary, Want, Welcome,
};
use dmover_proto::control::{
    Digests, FilterRule, MemDirection, MemTest, Prune, PruneReport, PullFiltered, PullListed,
    Rename,
};
use dmover_proto::data::{
    DataHello, DigestEntry, FILE_FAILED, FrameHeader, FrameKind, FrameLimits, JoinStatus,
    decode_ack, encode_ack,
};
use dmover_proto::digest::{FileDigest, crc32c_append, file_digest, piece_hash};
use dmover_proto::layout::{Layout, Piece};
use dmover_proto::manifest::{self, Entry, EntryKind, Mtime, NO_PARENT, Totals};
use dmover_proto::preamble::{ConnKind, Preamble};

/// Parses a commented hexdump: on each line, everything from `#` on is a comment and
/// the rest is whitespace-separated two-digit hex bytes.
fn hexdump(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in s.lines() {
        let data = line.split('#').next().unwrap();
        for tok in data.split_whitespace() {
            assert_eq!(tok.len(), 2, "hexdump token {tok:?} is not one byte");
            out.push(u8::from_str_radix(tok, 16).expect("hex byte"));
        }
    }
    out
}

/// Renders bytes as spaced hex, so a failing comparison shows where bytes differ.
fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `start, start + 1, ...`: recognisable nonces and secrets, which also show that
/// fixed arrays go on the wire in order and without a length.
fn seq32(start: u8) -> [u8; 32] {
    std::array::from_fn(|i| start + i as u8)
}

const LIMITS: FrameLimits = FrameLimits {
    max_payload: 64 << 20,
    max_digests: 1 << 16,
};

/// Checks that `msg` encodes to exactly the frame in `dump` and that the frame decodes
/// back to `msg`, consuming all of it.
fn golden_control(msg: Control, dump: &str) {
    let expected = hexdump(dump);
    let frame = msg.to_frame().unwrap();
    assert_eq!(hex(&frame), hex(&expected), "encoding of {}", msg.name());
    let decoded = Control::decode(&expected, MAX_FRAME).unwrap();
    assert_eq!(decoded, Some((msg, expected.len())));
}

// ---------------------------------------------------------------------------------
// Fixed-layout items

#[test]
fn preamble_control() {
    let p = Preamble {
        kind: ConnKind::Control,
        version: 1,
        busy: None,
    };
    let expected = hexdump(
        "
        44 4d 4f 56   # magic \"DMOV\"
        01            # connection kind: 1 = control
        00            # reserved, 0
        00 01         # version 1 (u16 BE)
        ",
    );
    assert_eq!(hex(&p.encode()), hex(&expected));
    assert_eq!(Preamble::decode(&expected), Ok(p));
}

#[test]
fn preamble_data() {
    let p = Preamble {
        kind: ConnKind::Data,
        version: 0x0102,
        busy: None,
    };
    let expected = hexdump(
        "
        44 4d 4f 56   # magic \"DMOV\"
        02            # connection kind: 2 = data
        00            # reserved, 0
        01 02         # version 0x0102 (u16 BE: high byte first)
        ",
    );
    assert_eq!(hex(&p.encode()), hex(&expected));
    assert_eq!(Preamble::decode(&expected), Ok(p));
}

#[test]
fn preamble_busy() {
    // The server's answer when it cannot take the connection yet.
    let p = Preamble::busy(std::num::NonZeroU8::new(2).unwrap());
    let expected = hexdump(
        "
        44 4d 4f 56   # magic \"DMOV\"
        01            # connection kind: 1 = control
        02            # busy: retry after 2 seconds
        00 00         # version 0: no session on this connection, the server closes
        ",
    );
    assert_eq!(hex(&p.encode()), hex(&expected));
    assert_eq!(Preamble::decode(&expected), Ok(p));
}

#[test]
fn preamble_no_common_version() {
    // The server's answer when the versions do not overlap.
    let p = Preamble {
        kind: ConnKind::Control,
        version: 0,
        busy: None,
    };
    let expected = hexdump(
        "
        44 4d 4f 56   # magic \"DMOV\"
        01            # connection kind: 1 = control
        00            # reserved, 0
        00 00         # version 0: no common version, the server closes
        ",
    );
    assert_eq!(hex(&p.encode()), hex(&expected));
    assert_eq!(Preamble::decode(&expected), Ok(p));
}

#[test]
fn data_hello() {
    let h = DataHello {
        session: 0x0102_0304_0506_0708,
        stream: 0x090a,
        nonce: seq32(0xa0),
    };
    let expected = hexdump(
        "
        01 02 03 04 05 06 07 08                          # session id (u64 BE)
        09 0a                                            # stream index (u16 BE)
        00 00 00 00 00 00                                # reserved, 0
        a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 aa ab ac ad ae af  # client nonce, bytes 0..16
        b0 b1 b2 b3 b4 b5 b6 b7 b8 b9 ba bb bc bd be bf  # client nonce, bytes 16..32
        ",
    );
    assert_eq!(expected.len(), dmover_proto::data::HELLO_LEN);
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(DataHello::decode(&expected), Ok(h));
}

#[test]
fn join_status_bytes() {
    for (byte, status) in [
        (0x00, JoinStatus::Accepted),       // 0: joined
        (0x01, JoinStatus::UnknownSession), // 1: no such session
        (0x02, JoinStatus::BadProof),       // 2: wrong join proof
        (0x03, JoinStatus::BadStream),      // 3: stream index out of range or taken
    ] {
        assert_eq!(status as u8, byte);
        assert_eq!(JoinStatus::decode(byte), Ok(status));
    }
}

#[test]
fn frame_header_chunk_with_crc() {
    let h = FrameHeader {
        kind: FrameKind::Chunk,
        chunk: 0x0000_0001_0000_0002,
        n_digests: 2,
        payload_len: 1 << 20,
        crc: Some(0xdead_beef),
        zeros: false,
        part: false,
    };
    let expected = hexdump(
        "
        01                        # kind: 1 = CHUNK
        01                        # flags: bit 0 = crc32c is set
        00 00                     # reserved, 0
        00 00 00 02               # n_digests: 2 digest entries follow (u32 BE)
        00 00 00 01 00 00 00 02   # chunk index 2^32 + 2 (u64 BE)
        00 10 00 00               # payload_len: 1 MiB (u32 BE)
        de ad be ef               # crc32c 0xdeadbeef (u32 BE)
        ",
    );
    assert_eq!(expected.len(), dmover_proto::data::HEADER_LEN);
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(FrameHeader::decode(&expected, &LIMITS), Ok(h));
}

#[test]
fn frame_header_chunk_without_crc() {
    let h = FrameHeader {
        kind: FrameKind::Chunk,
        chunk: 7,
        n_digests: 0,
        payload_len: 4096,
        crc: None,
        zeros: false,
        part: false,
    };
    let expected = hexdump(
        "
        01                        # kind: 1 = CHUNK
        00                        # flags: none (checksums off)
        00 00                     # reserved, 0
        00 00 00 00               # n_digests: 0
        00 00 00 00 00 00 00 07   # chunk index 7 (u64 BE)
        00 00 10 00               # payload_len: 4096 (u32 BE)
        00 00 00 00               # crc32c: 0, as the flag is clear
        ",
    );
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(FrameHeader::decode(&expected, &LIMITS), Ok(h));
}

#[test]
fn frame_header_chunk_of_zeros() {
    // Feature LINKS: a chunk wholly in holes of sparse files, its payload not sent.
    let h = FrameHeader {
        kind: FrameKind::Chunk,
        chunk: 5,
        n_digests: 1,
        payload_len: 0,
        crc: Some(0x0102_0304),
        zeros: true,
        part: false,
    };
    let expected = hexdump(
        "
        01                        # kind: 1 = CHUNK
        03                        # flags: bit 0 = crc32c, bit 1 = zeros (no payload)
        00 00                     # reserved, 0
        00 00 00 01               # n_digests: 1 (digest entries still follow)
        00 00 00 00 00 00 00 05   # chunk index 5 (u64 BE)
        00 00 00 00               # payload_len: 0 (the layout gives the length)
        01 02 03 04               # crc32c of the chunk's zeros (u32 BE)
        ",
    );
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(FrameHeader::decode(&expected, &LIMITS), Ok(h));
}

#[test]
fn frame_header_part() {
    // Feature PARTS: 4 KiB of chunk 3; the offset follows the header (not shown).
    let h = FrameHeader {
        kind: FrameKind::Chunk,
        chunk: 3,
        n_digests: 0,
        payload_len: 4096,
        crc: Some(0x0a0b_0c0d),
        zeros: false,
        part: true,
    };
    let expected = hexdump(
        "
        01                        # kind: 1 = CHUNK
        05                        # flags: bit 0 = crc32c, bit 2 = part
        00 00                     # reserved, 0
        00 00 00 00               # n_digests: 0
        00 00 00 00 00 00 00 03   # chunk index 3 (u64 BE)
        00 00 10 00               # payload_len: 4096, the part's bytes (u32 BE)
        0a 0b 0c 0d               # crc32c of the part's bytes (u32 BE)
        ",
    );
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(FrameHeader::decode(&expected, &LIMITS), Ok(h));
    // Never on END or zeros frames.
    let mut end = FrameHeader::end(1).encode();
    end[1] = 4;
    assert!(FrameHeader::decode(&end, &LIMITS).is_err());
    let mut zeros = expected;
    zeros[1] = 2 | 4;
    zeros[16..20].fill(0);
    assert!(FrameHeader::decode(&zeros, &LIMITS).is_err());
}

#[test]
fn frame_header_end() {
    let h = FrameHeader::end(42);
    let expected = hexdump(
        "
        02                        # kind: 2 = END
        00                        # flags: none
        00 00                     # reserved, 0
        00 00 00 00               # n_digests: 0
        00 00 00 00 00 00 00 2a   # chunks sent on this stream: 42 (u64 BE)
        00 00 00 00               # payload_len: 0
        00 00 00 00               # crc32c: 0
        ",
    );
    assert_eq!(hex(&h.encode()), hex(&expected));
    assert_eq!(FrameHeader::decode(&expected, &LIMITS), Ok(h));
}

#[test]
fn digest_entries() {
    let entries = [
        DigestEntry {
            file: 3,
            digest: 0x0123_4567_89ab_cdef,
        },
        DigestEntry {
            file: 0x0102_0304,
            digest: u64::MAX,
        },
    ];
    let expected = hexdump(
        "
        00 00 00 03               # entry 0: file index 3 (u32 BE)
        01 23 45 67 89 ab cd ef   # entry 0: digest (u64 BE)
        01 02 03 04               # entry 1: file index 0x01020304 (u32 BE)
        ff ff ff ff ff ff ff ff   # entry 1: digest u64::MAX (u64 BE)
        ",
    );
    assert_eq!(expected.len(), 2 * dmover_proto::data::DIGEST_LEN);
    let mut out = Vec::new();
    for e in &entries {
        e.encode_into(&mut out);
    }
    assert_eq!(hex(&out), hex(&expected));
    let decoded: Vec<_> = DigestEntry::decode_all(&expected).unwrap().collect();
    assert_eq!(decoded, entries);
}

#[test]
fn failure_markers_and_acknowledgements() {
    let marker = DigestEntry::failure(5);
    let expected = hexdump(
        "
        80 00 00 05               # file index 5 with bit 31 set: a failure marker
        00 00 00 00 00 00 00 00   # digest: 0
        ",
    );
    let mut out = Vec::new();
    marker.encode_into(&mut out);
    assert_eq!(hex(&out), hex(&expected));
    let back: Vec<_> = DigestEntry::decode_all(&expected).unwrap().collect();
    assert_eq!(back, vec![marker]);
    assert!(back[0].is_failure() && back[0].index() == 5);
    assert_eq!(FILE_FAILED, 0x8000_0000);
    let ack = hexdump("00 00 00 00 00 00 01 2c   # 300 chunks received on this stream (u64 BE)");
    assert_eq!(hex(&encode_ack(300)), hex(&ack));
    assert_eq!(decode_ack(ack.try_into().unwrap()), 300);
}

// ---------------------------------------------------------------------------------
// Control messages

#[test]
fn control_hello() {
    golden_control(
        Control::Hello(Hello {
            software: "dmover 0.1.0".into(),
            nonce: seq32(0x00),
        }),
        "
        00 00 00 2e                                      # frame length: 46 (u32 BE)
        00                                               # Control::Hello (variant 0)
        0c                                               # software: 12 bytes
        64 6d 6f 76 65 72 20 30 2e 31 2e 30              #   \"dmover 0.1.0\"
        00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  # nonce, bytes 0..16
        10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f  # nonce, bytes 16..32
        ",
    );
}

#[test]
fn control_welcome() {
    golden_control(
        Control::Welcome(Welcome {
            software: "dmover".into(),
            nonce: seq32(0x20),
            auth: AuthMethod::Required,
        }),
        "
        00 00 00 29                                      # frame length: 41
        01                                               # Control::Welcome (variant 1)
        06                                               # software: 6 bytes
        64 6d 6f 76 65 72                                #   \"dmover\"
        20 21 22 23 24 25 26 27 28 29 2a 2b 2c 2d 2e 2f  # nonce, bytes 0..16
        30 31 32 33 34 35 36 37 38 39 3a 3b 3c 3d 3e 3f  # nonce, bytes 16..32
        01                                               # auth: AuthMethod::Required (variant 1)
        ",
    );
}

#[test]
fn control_welcome_no_auth() {
    golden_control(
        Control::Welcome(Welcome {
            software: String::new(),
            nonce: [0; 32],
            auth: AuthMethod::None,
        }),
        "
        00 00 00 23                                      # frame length: 35
        01                                               # Control::Welcome (variant 1)
        00                                               # software: 0 bytes
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00  # nonce, bytes 0..16
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00  # nonce, bytes 16..32
        00                                               # auth: AuthMethod::None (variant 0)
        ",
    );
}

#[test]
fn control_auth_without_credential() {
    golden_control(
        Control::Auth(Auth {
            user: String::new(),
            credential: Credential::None,
        }),
        "
        00 00 00 03   # frame length: 3
        02            # Control::Auth (variant 2)
        00            # user: 0 bytes
        00            # credential: Credential::None (variant 0)
        ",
    );
}

#[test]
fn control_auth_with_token() {
    golden_control(
        Control::Auth(Auth {
            user: "al".into(),
            credential: Credential::Token { proof: seq32(0x40) },
        }),
        "
        00 00 00 25                                      # frame length: 37
        02                                               # Control::Auth (variant 2)
        02 61 6c                                         # user: 2 bytes, \"al\"
        01                                               # credential: Credential::Token (variant 1)
        40 41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f  #   proof, bytes 0..16
        50 51 52 53 54 55 56 57 58 59 5a 5b 5c 5d 5e 5f  #   proof, bytes 16..32
        ",
    );
}

#[test]
fn control_auth_with_key() {
    golden_control(
        Control::Auth(Auth {
            user: "b".into(),
            credential: Credential::Key {
                public: seq32(0x80),
                signature: vec![0xee; 3],
            },
        }),
        "
        00 00 00 28                                      # frame length: 40
        02                                               # Control::Auth (variant 2)
        01 62                                            # user: 1 byte, \"b\"
        02                                               # credential: Credential::Key (variant 2)
        80 81 82 83 84 85 86 87 88 89 8a 8b 8c 8d 8e 8f  #   public key, bytes 0..16
        90 91 92 93 94 95 96 97 98 99 9a 9b 9c 9d 9e 9f  #   public key, bytes 16..32
        03 ee ee ee                                      #   signature: 3 bytes (64 in use)
        ",
    );
}

#[test]
fn control_auth_ok() {
    golden_control(
        Control::AuthOk(AuthOk { proof: None }),
        "
        00 00 00 02   # frame length: 2
        03            # Control::AuthOk (variant 3)
        00            # proof: None
        ",
    );
    golden_control(
        Control::AuthOk(AuthOk {
            proof: Some(seq32(0xe0)),
        }),
        "
        00 00 00 22                                      # frame length: 34
        03                                               # Control::AuthOk (variant 3)
        01                                               # proof: Some
        e0 e1 e2 e3 e4 e5 e6 e7 e8 e9 ea eb ec ed ee ef  #   proof, bytes 0..16
        f0 f1 f2 f3 f4 f5 f6 f7 f8 f9 fa fb fc fd fe ff  #   proof, bytes 16..32
        ",
    );
}

#[test]
fn control_open_push() {
    golden_control(
        Control::Open(Open {
            op: Op::Push {
                dest: b"data/in".to_vec(),
            },
            streams: 8,
            chunk_size: 4 << 20,
            checksum: true,
            direct_io: DirectIo::Never,
            protection: DataProtection::Plain,
            features: 0,
        }),
        "
        00 00 00 13            # frame length: 19
        04                     # Control::Open (variant 4)
        00                     # op: Op::Push (variant 0)
        07                     #   dest: 7 bytes
        64 61 74 61 2f 69 6e   #     \"data/in\"
        08                     # streams: 8 (varint)
        80 80 80 02            # chunk_size: 4 MiB = 2 << 21 (varint, 4 groups of 7 bits)
        01                     # checksum: true
        00                     # direct_io: DirectIo::Never (variant 0)
        00                     # protection: DataProtection::Plain (variant 0)
        00                     # features: none (varint, since protocol 4)
        ",
    );
}

#[test]
fn control_open_pull() {
    golden_control(
        Control::Open(Open {
            op: Op::Pull {
                sources: vec![b"a".to_vec(), b"b/c".to_vec()],
            },
            streams: 300,
            chunk_size: 64 << 10,
            checksum: false,
            direct_io: DirectIo::Always,
            protection: DataProtection::Encrypted,
            features: 0x81,
        }),
        "
        00 00 00 13   # frame length: 19
        04            # Control::Open (variant 4)
        01            # op: Op::Pull (variant 1)
        02            #   sources: 2 paths
        01            #     source 0: 1 byte
        61            #       \"a\"
        03            #     source 1: 3 bytes
        62 2f 63      #       \"b/c\"
        ac 02         # streams: 300 = 0x2c | 2 << 7 (varint, u16 too is a varint)
        80 80 04      # chunk_size: 64 KiB = 4 << 14 (varint)
        00            # checksum: false
        02            # direct_io: DirectIo::Always (variant 2)
        02            # protection: DataProtection::Encrypted (variant 2)
        81 01         # features: bits 0 and 7 = 0x01 | 0x01 << 7 (varint)
        ",
    );
}

#[test]
fn control_open_prune() {
    golden_control(
        Control::Open(Open {
            op: Op::Prune(Prune {
                dest: b"m".to_vec(),
                rules: vec![FilterRule {
                    include: false,
                    pattern: b"*.o".to_vec(),
                }],
                max_delete: u64::MAX,
                dry_run: true,
                conflicts_only: false,
                checksum: true,
            }),
            streams: 4,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: 3,
        }),
        "
        00 00 00 1d   # frame length: 29
        04            # Control::Open (variant 4)
        05            # op: Op::Prune (variant 5, appended)
        01 6d         #   dest: 1 byte, \"m\"
        01            #   rules: 1
        00            #     include: false (an --exclude)
        03 2a 2e 6f   #     pattern: 3 bytes, \"*.o\"
        ff ff ff ff ff ff ff ff ff 01   # max_delete: u64::MAX (no limit; varint)
        01            #   dry_run: true
        00            #   conflicts_only: false
        01            #   checksum: true
        04            # streams: 4
        00            # chunk_size: 0
        01            # checksum: true
        01            # direct_io: DirectIo::Auto (variant 1)
        01            # protection: DataProtection::Authenticated (variant 1)
        03            # features: 3
        ",
    );
}

#[test]
fn control_open_sums_and_its_answer() {
    use dmover_proto::control::{Sums, SumsReport};
    golden_control(
        Control::Open(Open {
            op: Op::Sums(Sums {
                path: b"f".to_vec(),
                types: vec!["md5".into()],
                cache: true,
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: dmover_proto::session::features::SUMS,
        }),
        "
        00 00 00 12   # frame length: 18
        04            # Control::Open (variant 4)
        0c            # op: Op::Sums (variant 12, appended)
        01 66         #   path: 1 byte, \"f\"
        01 03 6d 64 35   # types: 1, \"md5\"
        01            #   cache: true
        01            # streams: 1
        00            # chunk_size: 0
        01            # checksum: true
        01            # direct_io: DirectIo::Auto (variant 1)
        01            # protection: DataProtection::Authenticated (variant 1)
        80 80 01      # features: SUMS (16384, varint)
        ",
    );
    golden_control(
        Control::Sums(SumsReport {
            size: 1,
            sums: vec![("adler32".into(), "00620062".into())],
            cached: true,
            stored: false,
        }),
        "
        00 00 00 16   # frame length: 22
        20            # Control::Sums (variant 32)
        01            # size: 1
        01            # sums: 1
        07 61 64 6c 65 72 33 32   #   \"adler32\"
        08 30 30 36 32 30 30 36 32   #   \"00620062\"
        01            # cached: true
        00            # stored: false
        ",
    );
}

#[test]
fn control_open_prune_keep() {
    use dmover_proto::control::{Keep, PruneKeep};
    golden_control(
        Control::Open(Open {
            op: Op::PruneKeep(PruneKeep {
                prune: Prune {
                    dest: b"m".to_vec(),
                    rules: Vec::new(),
                    max_delete: u64::MAX,
                    dry_run: false,
                    conflicts_only: true,
                    checksum: false,
                },
                keep: Keep::Existing,
            }),
            streams: 4,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: dmover_proto::session::features::KEEP,
        }),
        "
        00 00 00 1a   # frame length: 26
        04            # Control::Open (variant 4)
        0b            # op: Op::PruneKeep (variant 11, appended)
        01 6d         #   prune.dest: 1 byte, \"m\"
        00            #   prune.rules: none
        ff ff ff ff ff ff ff ff ff 01   # prune.max_delete: u64::MAX (no limit; varint)
        00            #   prune.dry_run: false
        01            #   prune.conflicts_only: true
        00            #   prune.checksum: false
        01            #   keep: Keep::Existing (variant 1; SameSize is 0)
        04            # streams: 4
        00            # chunk_size: 0
        01            # checksum: true
        01            # direct_io: DirectIo::Auto (variant 1)
        01            # protection: DataProtection::Authenticated (variant 1)
        80 40         # features: KEEP (8192, varint)
        ",
    );
}

#[test]
fn control_open_pull_filtered() {
    golden_control(
        Control::Open(Open {
            op: Op::PullFiltered(PullFiltered {
                sources: vec![b"a".to_vec()],
                rules: vec![FilterRule {
                    include: true,
                    pattern: b"k".to_vec(),
                }],
                report_skipped: true,
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: 0,
        }),
        "
        00 00 00 10   # frame length: 16
        04            # Control::Open (variant 4)
        06            # op: Op::PullFiltered (variant 6, appended)
        01 01 61      #   sources: 1 path of 1 byte, \"a\"
        01            #   rules: 1
        01 01 6b      #     include: true, pattern: 1 byte, \"k\"
        01            #   report_skipped: true
        01 00 01 01 01 00   # streams 1, chunk 0, checksum, Auto, Authenticated, features 0
        ",
    );
}

#[test]
fn control_open_pull_listed() {
    golden_control(
        Control::Open(Open {
            op: Op::PullListed(PullListed {
                sources: vec![b"a".to_vec()],
                rules: vec![FilterRule {
                    include: false,
                    pattern: b"k".to_vec(),
                }],
                report_skipped: false,
                list: b"d\n".to_vec(),
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: 0,
        }),
        "
        00 00 00 13   # frame length: 19
        04            # Control::Open (variant 4)
        09            # op: Op::PullListed (variant 9, appended)
        01 01 61      #   sources: 1 path of 1 byte, \"a\"
        01            #   rules: 1
        00 01 6b      #     include: false, pattern: 1 byte, \"k\"
        00            #   report_skipped: false
        02 64 0a      #   list: 2 bytes, d and a newline
        01 00 01 01 01 00   # streams 1, chunk 0, checksum, Auto, Authenticated, features 0
        ",
    );
}

#[test]
fn control_open_third_party_sync() {
    use dmover_proto::capability::Capability;
    use dmover_proto::control::{ThirdParty, ThirdPartySync, TpcMode};
    golden_control(
        Control::Open(Open {
            op: Op::ThirdPartySync(ThirdPartySync {
                copy: ThirdParty {
                    mode: TpcMode::Pull,
                    peer: "p".into(),
                    peer_key: "k".into(),
                    capability: Capability {
                        grant: vec![1],
                        cert: vec![2],
                        scheme: 0x0403,
                        signature: vec![3],
                    },
                    paths: vec![b"m".to_vec()],
                },
                mirror: true,
                delete: true,
                max_delete: 5,
                checksum: false,
                rules: vec![FilterRule {
                    include: false,
                    pattern: b"k".to_vec(),
                }],
                files_from: None,
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: dmover_proto::session::features::SYNC_BETWEEN,
        }),
        "
        00 00 00 22   # frame length: 34
        04            # Control::Open (variant 4)
        0a            # op: Op::ThirdPartySync (variant 10, appended)
        01            #   copy.mode: TpcMode::Pull
        01 70         #   copy.peer: \"p\"
        01 6b         #   copy.peer_key: \"k\"
        01 01 01 02   #   copy.capability: grant [1], cert [2],
        83 08 01 03   #     scheme 0x0403 (varint), signature [3]
        01 01 6d      #   copy.paths: 1 path of 1 byte, \"m\"
        01 01 05 00   #   mirror, delete, max_delete 5, checksum: false
        01 00 01 6b   #   rules: 1, include: false, pattern \"k\"
        00            #   files_from: None
        01 00 01 01 01   # streams 1, chunk 0, checksum, Auto, Authenticated
        80 20         # features: SYNC_BETWEEN (4096, varint)
        ",
    );
}

#[test]
fn control_open_grant_of_a_mirror() {
    use dmover_proto::capability::Scope;
    use dmover_proto::control::GrantRequest;
    golden_control(
        Control::Open(Open {
            op: Op::Grant(GrantRequest {
                scope: Scope::Mirror {
                    dest: b"m".to_vec(),
                },
                dialer: "d".into(),
                addr: "a".into(),
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: dmover_proto::session::features::SYNC_BETWEEN,
        }),
        "
        00 00 00 10   # frame length: 16
        04            # Control::Open (variant 4)
        03            # op: Op::Grant (variant 3)
        02 01 6d      #   scope: Scope::Mirror (variant 2, appended), dest \"m\"
        01 64         #   dialer: \"d\"
        01 61         #   addr: \"a\"
        01 00 01 01 01   # streams 1, chunk 0, checksum, Auto, Authenticated
        80 20         # features: SYNC_BETWEEN (4096, varint)
        ",
    );
}

#[test]
fn control_open_rename() {
    golden_control(
        Control::Open(Open {
            op: Op::Rename(Rename {
                from: b"d/a".to_vec(),
                to: b"b".to_vec(),
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: 0,
        }),
        "
        00 00 00 0e   # frame length: 14
        04            # Control::Open (variant 4)
        07            # op: Op::Rename (variant 7, appended)
        03 64 2f 61   #   from: 3 bytes, \"d/a\"
        01 62         #   to: 1 byte, \"b\"
        01 00 01 01 01 00   # streams 1, chunk 0, checksum, Auto, Authenticated, features 0
        ",
    );
}

#[test]
fn control_open_digests() {
    golden_control(
        Control::Open(Open {
            op: Op::Digests(Digests {
                source: b"d/s".to_vec(),
            }),
            streams: 1,
            chunk_size: 0,
            checksum: true,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Authenticated,
            features: 0,
        }),
        "
        00 00 00 0c   # frame length: 12
        04            # Control::Open (variant 4)
        08            # op: Op::Digests (variant 8, appended)
        03 64 2f 73   #   source: 3 bytes, \"d/s\"
        01 00 01 01 01 00   # streams 1, chunk 0, checksum, Auto, Authenticated, features 0
        ",
    );
}

#[test]
fn control_pruned() {
    golden_control(
        Control::Pruned(PruneReport {
            deleted: 3,
            deleted_bytes: 300,
            over_limit: 0,
            protected: 1,
            paths: vec![b"d/".to_vec()],
            unchanged: vec![EntryRange { first: 2, count: 5 }],
            digests: vec![(7, 0x81)],
        }),
        "
        00 00 00 11   # frame length: 17
        17            # Control::Pruned (variant 23, appended)
        03            # deleted: 3
        ac 02         # deleted_bytes: 300 (varint)
        00            # over_limit: 0
        01            # protected: 1
        01 02 64 2f   # paths: 1 of 2 bytes, \"d/\"
        01 02 05      # unchanged: 1 range, first 2, count 5
        01 07 81 01   # digests: 1, (entry 7, digest 0x81 as a varint)
        ",
    );
}

#[test]
fn control_open_memtest() {
    golden_control(
        Control::Open(Open {
            op: Op::MemTest(MemTest {
                direction: MemDirection::FromServer,
                millis: 3000,
                zerocopy: true,
                congestion: "bbr".into(),
            }),
            streams: 4,
            chunk_size: 1 << 20,
            checksum: false,
            direct_io: DirectIo::Auto,
            protection: DataProtection::Plain,
            features: 0,
        }),
        "
        00 00 00 12   # frame length: 18
        04            # Control::Open (variant 4)
        02            # op: Op::MemTest (variant 2)
        01            #   direction: MemDirection::FromServer (variant 1)
        b8 17         #   millis: 3000 = 0x38 | 0x17 << 7 (varint)
        01            #   zerocopy: true
        03            #   congestion: 3 bytes
        62 62 72      #     \"bbr\"
        04            # streams: 4
        80 80 40      # chunk_size: 1 MiB = 0x40 << 14 (varint)
        00            # checksum: false
        01            # direct_io: DirectIo::Auto (variant 1)
        00            # protection: DataProtection::Plain (variant 0)
        00            # features: none
        ",
    );
}

#[test]
fn direct_io_tags() {
    // Every DirectIo's variant index, in an otherwise fixed Open.
    for (direct_io, tag) in [
        (DirectIo::Never, 0x00),
        (DirectIo::Auto, 0x01),
        (DirectIo::Always, 0x02),
    ] {
        golden_control(
            Control::Open(Open {
                op: Op::Push { dest: Vec::new() },
                streams: 1,
                chunk_size: 1,
                checksum: false,
                direct_io,
                protection: DataProtection::Authenticated,
                features: 0,
            }),
            &format!(
                "
                00 00 00 09   # frame length: 9
                04            # Control::Open (variant 4)
                00 00         # op: Op::Push, dest empty
                01            # streams: 1
                01            # chunk_size: 1
                00            # checksum: false
                {tag:02x}            # direct_io
                01            # protection: DataProtection::Authenticated (variant 1)
                00            # features: none
                "
            ),
        );
    }
    assert_eq!(DirectIo::default(), DirectIo::Auto);
    assert_eq!(DataProtection::default(), DataProtection::Authenticated);
}

#[test]
fn control_session() {
    golden_control(
        Control::Session(SessionInfo {
            id: 1 << 32,
            salt: seq32(0x60),
            streams: 8,
            chunk_size: 4 << 20,
            features: 0,
        }),
        "
        00 00 00 2c                                      # frame length: 44
        05                                               # Control::Session (variant 5)
        80 80 80 80 10                                   # id: 2^32 (varint)
        60 61 62 63 64 65 66 67 68 69 6a 6b 6c 6d 6e 6f  # salt, bytes 0..16
        70 71 72 73 74 75 76 77 78 79 7a 7b 7c 7d 7e 7f  # salt, bytes 16..32
        08                                               # streams: 8
        80 80 80 02                                      # chunk_size: 4 MiB (varint)
        00                                               # features: none (since protocol 4)
        ",
    );
}

/// A directory `d` holding a 200,000-byte file `f` and a symlink `l -> f`.
fn small_tree() -> Vec<Entry> {
    vec![
        Entry {
            parent: NO_PARENT,
            name: b"d".to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime: Mtime {
                sec: 1_700_000_000,
                nsec: 5,
            },
        },
        Entry {
            parent: 0,
            name: b"f".to_vec(),
            kind: EntryKind::File { size: 200_000 },
            mode: 0o644,
            mtime: Mtime {
                sec: -1,
                nsec: 999_999_999,
            },
        },
        Entry {
            parent: 0,
            name: b"l".to_vec(),
            kind: EntryKind::Symlink {
                target: b"f".to_vec(),
            },
            mode: 0o777,
            mtime: Mtime { sec: 0, nsec: 0 },
        },
    ]
}

#[test]
fn control_manifest_part() {
    let entries = small_tree();
    assert!(manifest::validate(&entries, 10).is_ok());
    golden_control(
        Control::Manifest(ManifestPart { entries }),
        "
        00 00 00 2b        # frame length: 43
        06                 # Control::Manifest (variant 6)
        03                 # entries: 3
                           # -- entry 0: directory d
        ff ff ff ff 0f     #   parent: NO_PARENT = u32::MAX (varint)
        01 64              #   name: 1 byte, \"d\"
        01                 #   kind: EntryKind::Dir (variant 1)
        ed 03              #   mode: 0o755 = 493 (varint)
        80 c4 9f d5 0c     #   mtime.sec: 1,700,000,000 (zigzag: 3,400,000,000, varint)
        05                 #   mtime.nsec: 5
                           # -- entry 1: file d/f
        00                 #   parent: entry 0
        01 66              #   name: 1 byte, \"f\"
        00                 #   kind: EntryKind::File (variant 0)
        c0 9a 0c           #     size: 200,000 (varint)
        a4 03              #   mode: 0o644 = 420 (varint)
        01                 #   mtime.sec: -1 (zigzag: 1)
        ff 93 eb dc 03     #   mtime.nsec: 999,999,999 (varint)
                           # -- entry 2: symlink d/l -> f
        00                 #   parent: entry 0
        01 6c              #   name: 1 byte, \"l\"
        02                 #   kind: EntryKind::Symlink (variant 2)
        01 66              #     target: 1 byte, \"f\"
        ff 03              #   mode: 0o777 = 511 (varint)
        00                 #   mtime.sec: 0
        00                 #   mtime.nsec: 0
        ",
    );
}

#[test]
fn control_manifest_part_with_a_hard_link() {
    // `d/h`, a second path of `d/f`'s inode (feature LINKS).
    let mut entries = small_tree();
    entries.push(Entry {
        parent: 0,
        name: b"h".to_vec(),
        kind: EntryKind::HardLink { first: 1 },
        mode: 0o644,
        mtime: Mtime { sec: 0, nsec: 0 },
    });
    assert!(manifest::validate(&entries, 10).is_ok());
    let entries = entries.split_off(3);
    golden_control(
        Control::Manifest(ManifestPart { entries }),
        "
        00 00 00 0b        # frame length: 11
        06                 # Control::Manifest (variant 6)
        01                 # entries: 1
        00                 #   parent: entry 0
        01 68              #   name: 1 byte, \"h\"
        03                 #   kind: EntryKind::HardLink (variant 3)
        01                 #     first: entry 1
        a4 03              #   mode: 0o644 = 420 (varint)
        00                 #   mtime.sec: 0
        00                 #   mtime.nsec: 0
        ",
    );
}

#[test]
fn control_manifest_end() {
    let totals = Totals::of(&small_tree());
    assert_eq!(
        totals,
        Totals {
            entries: 3,
            files: 1,
            dirs: 1,
            symlinks: 1,
            bytes: 200_000
        }
    );
    golden_control(
        Control::ManifestEnd(ManifestEnd { totals }),
        "
        00 00 00 08   # frame length: 8
        07            # Control::ManifestEnd (variant 7)
        03            # totals.entries: 3
        01            # totals.files: 1
        01            # totals.dirs: 1
        01            # totals.symlinks: 1
        c0 9a 0c      # totals.bytes: 200,000 (varint)
        ",
    );
}

#[test]
fn control_go() {
    golden_control(
        Control::Go,
        "
        00 00 00 01   # frame length: 1
        08            # Control::Go (variant 8, no fields)
        ",
    );
}

#[test]
fn control_done() {
    golden_control(
        Control::Done(Summary {
            bytes: 200_000,
            files: 1,
            dirs: 1,
            symlinks: 1,
            chunks: 300,
            verified: true,
        }),
        "
        00 00 00 0a   # frame length: 10
        09            # Control::Done (variant 9)
        c0 9a 0c      # bytes: 200,000 (varint)
        01            # files: 1
        01            # dirs: 1
        01            # symlinks: 1
        ac 02         # chunks: 300 (varint)
        01            # verified: true
        ",
    );
}

#[test]
fn control_error() {
    golden_control(
        Control::Error(ErrorMsg {
            code: ErrorCode::NotFound,
            message: "no such file: x".into(),
        }),
        "
        00 00 00 12                                    # frame length: 18
        0a                                             # Control::Error (variant 10)
        02                                             # code: ErrorCode::NotFound (variant 2)
        0f                                             # message: 15 bytes
        6e 6f 20 73 75 63 68 20 66 69 6c 65 3a 20 78   #   \"no such file: x\"
        ",
    );
}

#[test]
fn control_options() {
    golden_control(
        Control::Options(SessionOptions {
            resume: true,
            journal: true,
            fsync: false,
            verify: true,
            continue_on_error: false,
            heartbeat_ms: 5000,
        }),
        "
        00 00 00 08   # frame length: 8
        0b            # Control::Options (variant 11)
        01            # resume: true
        01            # journal: true
        00            # fsync: false
        01            # verify: true
        00            # continue_on_error: false
        88 27         # heartbeat_ms: 5000 (varint)
        ",
    );
}

#[test]
fn control_have() {
    golden_control(
        Control::Have(Have {
            done: vec![EntryRange {
                first: 1,
                count: 300,
            }],
            partial: vec![PartialFile {
                entry: 7,
                pieces: vec![(0, 0x0102), (2, 1)],
            }],
            last: true,
        }),
        "
        00 00 00 0e   # frame length: 14
        0c            # Control::Have (variant 12)
        01            # done: 1 range
        01            #   first: 1
        ac 02         #   count: 300 (varint)
        01            # partial: 1 file
        07            #   entry: 7
        02            #   pieces: 2
        00            #     index 0
        82 02         #     hash 0x0102 (varint)
        02            #     index 2
        01            #     hash 1
        01            # last: true
        ",
    );
}

#[test]
fn control_plan_ping_and_send_report() {
    golden_control(
        Control::Plan(Plan {
            stale: vec![7, 200],
        }),
        "
        00 00 00 05   # frame length: 5
        0d            # Control::Plan (variant 13)
        02            # stale: 2 entries
        07            #   7
        c8 01         #   200 (varint)
        ",
    );
    golden_control(
        Control::Ping,
        "
        00 00 00 01   # frame length: 1
        0e            # Control::Ping (variant 14, no fields)
        ",
    );
    golden_control(
        Control::SendReport(SendReport {
            chunks_resent: 3,
            streams_lost: 1,
            failed: vec![FailedFile {
                entry: 4,
                message: "gone".into(),
            }],
        }),
        "
        00 00 00 0a    # frame length: 10
        0f             # Control::SendReport (variant 15)
        03             # chunks_resent: 3
        01             # streams_lost: 1
        01             # failed: 1 file
        04             #   entry: 4
        04             #   message: 4 bytes
        67 6f 6e 65    #     \"gone\"
        ",
    );
}

#[test]
fn control_growth_and_requests() {
    // Features GROWING_MANIFEST and RANGES (appended variants 16 to 19).
    golden_control(
        Control::Grow(Growth {
            totals: Totals {
                entries: 3,
                files: 2,
                dirs: 1,
                symlinks: 0,
                bytes: 300,
            },
            chunks: 5,
            last: true,
        }),
        "
        00 00 00 09   # frame length: 9
        10            # Control::Grow (variant 16)
        03 02 01 00   # totals: entries 3, files 2, dirs 1, symlinks 0
        ac 02         #   bytes: 300 (varint)
        05            # chunks: 5
        01            # last: true
        ",
    );
    golden_control(
        Control::Want(Want {
            chunks: vec![1..3, 200..201],
        }),
        "
        00 00 00 08   # frame length: 8
        11            # Control::Want (variant 17)
        02            # chunks: 2 ranges
        01 03         #   1..3 (start, end)
        c8 01 c9 01   #   200..201
        ",
    );
    golden_control(
        Control::OnDemand,
        "
        00 00 00 01   # frame length: 1
        12            # Control::OnDemand (variant 18, no fields)
        ",
    );
    golden_control(
        Control::Grown(300),
        "
        00 00 00 03   # frame length: 3
        13            # Control::Grown (variant 19)
        ac 02         # chunks: 300 (varint)
        ",
    );
    // Feature TUNING (bit 4).
    golden_control(
        Control::Tuned(dmover_proto::control::Tuned {
            at_ms: 1000,
            streams: 8,
            rate: 300,
            reason: "up".into(),
        }),
        "
        00 00 00 09   # frame length: 9
        18            # Control::Tuned (variant 24)
        e8 07         # at_ms: 1000 (varint)
        08            # streams: 8
        ac 02         # rate: 300 (varint)
        02 75 70      # reason: \"up\"
        ",
    );
    // Feature METADATA (bit 8).
    golden_control(
        Control::Meta(dmover_proto::control::MetaPart {
            entries: vec![dmover_proto::manifest::EntryMeta {
                entry: 2,
                uid: 1000,
                gid: 100,
                xattrs: vec![dmover_proto::manifest::Xattr {
                    name: b"user.a".to_vec(),
                    value: vec![0, 255],
                }],
            }],
            last: true,
        }),
        "
        00 00 00 12   # frame length: 18
        1a            # Control::Meta (variant 26)
        01            # entries: 1
        02            #   entry: 2
        e8 07         #   uid: 1000 (varint)
        64            #   gid: 100
        01            #   xattrs: 1
        06 75 73 65 72 2e 61   # name: 6 bytes, \"user.a\"
        02 00 ff      #   value: 2 bytes
        01            # last: true
        ",
    );
    // Feature CONTINUOUS (bit 32).
    golden_control(
        Control::Stored(300),
        "
        00 00 00 03   # frame length: 3
        1b            # Control::Stored (variant 27)
        ac 02         # chunks written: 300 (varint)
        ",
    );
    golden_control(
        Control::Times(dmover_proto::control::TimesPart {
            entries: vec![(3, dmover_proto::manifest::Mtime { sec: 2, nsec: 5 })],
        }),
        "
        00 00 00 05   # frame length: 5
        1c            # Control::Times (variant 28)
        01            # entries: 1
        03            #   entry: 3
        04 05         #   mtime: sec 2 (zigzag varint), nsec 5
        ",
    );
    // Feature LIMITS (bit 64): the dialer's, then the acceptor's answer.
    golden_control(
        Control::Limits(dmover_proto::control::SessionLimits {
            bwlimit: 5_000_000,
            congestion: "reno".into(),
            refused: String::new(),
        }),
        "
        00 00 00 0b   # frame length: 11
        1d            # Control::Limits (variant 29)
        c0 96 b1 02   # bwlimit: 5000000 bytes/s (varint)
        04 72 65 6e 6f   # congestion: \"reno\"
        00            # refused: \"\"
        ",
    );
    golden_control(
        Control::Limits(dmover_proto::control::SessionLimits {
            bwlimit: 0,
            congestion: "cubic".into(),
            refused: "x".into(),
        }),
        "
        00 00 00 0a   # frame length: 10
        1d            # Control::Limits (variant 29)
        00            # bwlimit: none
        05 63 75 62 69 63   # congestion: \"cubic\" (in use)
        01 78         # refused: \"x\"
        ",
    );
    // Feature PARTS (bit 256): byte ranges of chunks, in a request-driven session.
    golden_control(
        Control::WantPart(dmover_proto::control::WantParts {
            parts: vec![dmover_proto::control::Part {
                chunk: 300,
                offset: 4096,
                len: 4096,
            }],
        }),
        "
        00 00 00 08   # frame length: 8
        1e            # Control::WantPart (variant 30)
        01            # parts: 1
        ac 02         #   chunk: 300 (varint)
        80 20         #   offset: 4096
        80 20         #   len: 4096
        ",
    );
    // Feature PART_CHUNKS (bit 2048): a later part's chunk size, before its `Grow`.
    golden_control(
        Control::PartChunk(256 << 10),
        "
        00 00 00 04   # frame length: 4
        1f            # Control::PartChunk (variant 31)
        80 80 10      # chunk size: 262144 (varint)
        ",
    );
}

#[test]
fn control_sparse() {
    // Feature LINKS (bit 16): the files with holes, before ManifestEnd. Written as the
    // variant after Tuned (25 on this branch); 26 once merged behind the variant 25
    // taken elsewhere, and this dump's tag byte with it (0x1a).
    golden_control(
        Control::Sparse(dmover_proto::control::SparseFiles {
            entries: vec![3, 200],
        }),
        "
        00 00 00 05   # frame length: 5
        19            # Control::Sparse (variant 25)
        02            # entries: 2
        03            # entry 3
        c8 01         # entry 200 (varint)
        ",
    );
}

#[test]
fn error_code_tags() {
    // Every ErrorCode's variant index; a client maps these to exit codes.
    let codes = [
        (ErrorCode::Protocol, 0x00),
        (ErrorCode::Auth, 0x01),
        (ErrorCode::NotFound, 0x02),
        (ErrorCode::PermissionDenied, 0x03),
        (ErrorCode::PathEscape, 0x04),
        (ErrorCode::ReadOnly, 0x05),
        (ErrorCode::Io, 0x06),
        (ErrorCode::Checksum, 0x07),
        (ErrorCode::Busy, 0x08),
        (ErrorCode::Aborted, 0x09),
        (ErrorCode::Unsupported, 0x0a),
        (ErrorCode::Changed, 0x0b),
    ];
    for (code, tag) in codes {
        golden_control(
            Control::Error(ErrorMsg {
                code,
                message: String::new(),
            }),
            &format!(
                "
                00 00 00 03   # frame length: 3
                0a            # Control::Error (variant 10)
                {tag:02x}            # code
                00            # message: empty
                "
            ),
        );
    }
}

#[test]
fn control_frames_concatenate() {
    // A stream of frames decodes one at a time, each reporting its length.
    let mut buf = Control::Go.to_frame().unwrap();
    let auth = Control::Auth(Auth {
        user: String::new(),
        credential: Credential::None,
    });
    buf.extend(auth.to_frame().unwrap());
    assert_eq!(
        hex(&buf),
        hex(&hexdump(
            "
            00 00 00 01   # frame 1 length: 1
            08            # Control::Go
            00 00 00 03   # frame 2 length: 3
            02 00 00      # Control::Auth, user \"\", Credential::None
            "
        ))
    );
    assert_eq!(Control::decode(&buf, MAX_FRAME), Ok(Some((Control::Go, 5))));
    assert_eq!(Control::decode(&buf[5..], MAX_FRAME), Ok(Some((auth, 7))));
}

// ---------------------------------------------------------------------------------
// Layout and digests

fn entry(name: &str, kind: EntryKind) -> Entry {
    Entry {
        parent: NO_PARENT,
        name: name.as_bytes().to_vec(),
        kind,
        mode: 0o644,
        mtime: Mtime::default(),
    }
}

fn file(name: &str, size: u64) -> Entry {
    entry(name, EntryKind::File { size })
}

/// Shorthand for an expected piece.
#[allow(clippy::too_many_arguments)]
fn piece(
    file: u32,
    index: u64,
    file_offset: u64,
    buf_offset: usize,
    len: usize,
    last: bool,
    aligned: bool,
) -> Piece {
    Piece {
        file,
        index,
        file_offset,
        buf_offset,
        len,
        last,
        aligned,
    }
}

#[test]
fn layout_of_small_manifest() {
    // With 64 KiB chunks:
    //   virtual offset     entry  file  what
    //   0 .. 100           1      0     a, 100 bytes, packed
    //   (b: empty, no slot; 100 .. 65536 is padding: c is at least a chunk long,
    //    so it starts at a chunk boundary)
    //   65536 .. 265536    3      1     c, 200,000 bytes: chunk-aligned, >= 128 KiB: aligned
    //   (265536 .. 327680: padding to c's end rounded up to 4096, then to the next
    //    chunk boundary for e)
    //   327680 .. 397680   5      2     e, 70,000 bytes: a chunk or more, so chunk-aligned;
    //                                   < 128 KiB, so not aligned and its end is not rounded
    //   397680 .. 397690   6      3     g, 10 bytes, packed right after e
    let entries = vec![
        entry("d", EntryKind::Dir),
        file("a", 100),
        file("b", 0),
        file("c", 200_000),
        entry(
            "s",
            EntryKind::Symlink {
                target: b"a".to_vec(),
            },
        ),
        file("e", 70_000),
        file("g", 10),
    ];
    manifest::validate(&entries, 100).unwrap();
    let l = Layout::new(&entries, 64 << 10).unwrap();
    let slots: Vec<_> = l
        .files()
        .iter()
        .map(|s| (s.entry, s.start, s.size))
        .collect();
    assert_eq!(
        slots,
        [
            (1, 0, 100),
            (3, 65_536, 200_000),
            (5, 327_680, 70_000),
            (6, 397_680, 10)
        ]
    );
    assert_eq!(l.chunk_size(), 65_536);
    assert_eq!(l.total(), 397_690);
    assert_eq!(l.n_chunks(), 7, "ceil(397,690 / 65,536)");
    assert_eq!(
        (0..4).map(|f| l.n_pieces(f)).collect::<Vec<_>>(),
        [1, 4, 2, 1]
    );

    let expected: [&[Piece]; 7] = [
        // chunk 0 [0, 65536): a, then padding
        &[piece(0, 0, 0, 0, 100, true, false)],
        // chunks 1-3: c, a chunk each
        &[piece(1, 0, 0, 0, 65_536, false, true)],
        &[piece(1, 1, 65_536, 0, 65_536, false, true)],
        &[piece(1, 2, 131_072, 0, 65_536, false, true)],
        // chunk 4 [262144, 327680): c's tail, then padding
        &[piece(1, 3, 196_608, 0, 3_392, true, true)],
        // chunk 5 [327680, 393216): e's first chunk
        &[piece(2, 0, 0, 0, 65_536, false, false)],
        // chunk 6 [393216, 397690): e's tail and g, the short last chunk
        &[
            piece(2, 1, 65_536, 0, 4_464, true, false),
            piece(3, 0, 0, 4_464, 10, true, false),
        ],
    ];
    let wire = [100, 65_536, 65_536, 65_536, 3_392, 65_536, 4_474];
    let segments: [&[(usize, usize)]; 7] = [
        &[(0, 100)],
        &[(0, 65_536)],
        &[(0, 65_536)],
        &[(0, 65_536)],
        &[(0, 3_392)],
        &[(0, 65_536)],
        &[(0, 4_474)], // touching pieces merge
    ];
    let mut segs = Vec::new();
    for k in 0..7u64 {
        let pieces: Vec<_> = l.pieces(k).collect();
        assert_eq!(pieces, expected[k as usize], "pieces of chunk {k}");
        assert_eq!(l.wire_len(k), wire[k as usize], "wire_len of chunk {k}");
        l.segments(k, &mut segs);
        assert_eq!(segs, segments[k as usize], "segments of chunk {k}");
    }
    assert_eq!(l.chunk_bounds(6), (393_216, 397_690));
    assert_eq!(l.pieces(7).count(), 0, "past the last chunk");
    assert_eq!(l.pieces(u64::MAX).count(), 0);

    // Leaving out finished files (a resumed transfer) cuts the rest alike.
    let rest = Layout::with_filter(&entries, 64 << 10, |i| i != 1).unwrap();
    assert_eq!(rest.files()[0].start, 0, "c now starts the space");
    assert_eq!(
        rest.file_pieces(0).collect::<Vec<_>>(),
        l.file_pieces(1).collect::<Vec<_>>()
    );
}

#[test]
fn crc32c_known_values() {
    // The CRC-32C check value (CRC catalogue): "123456789" -> 0xe3069283.
    assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
    // RFC 3720 appendix B.4: 32 bytes of 0x00 and of 0xff.
    assert_eq!(crc32c_append(0, &[0x00; 32]), 0x8a91_36aa);
    assert_eq!(crc32c_append(0, &[0xff; 32]), 0x62a8_ab43);
    // Appending is the same as hashing the concatenation.
    assert_eq!(
        crc32c_append(crc32c_append(0, b"1234"), b"56789"),
        0xe306_9283
    );
}

#[test]
fn digest_of_known_input() {
    // xxh3-64 of the empty input, from the xxHash reference implementation.
    assert_eq!(piece_hash(b""), 0x2d06_8005_38d3_94c2);
    // A file with no pieces digests nothing, so it is xxh3-64 of the empty input too.
    assert_eq!(file_digest(&[]), 0x2d06_8005_38d3_94c2);

    // The definition: xxh3-64 over the little-endian piece hashes, in piece order.
    let pieces: [&[u8]; 3] = [b"hello", b", ", b"world"];
    let hashes: Vec<u64> = pieces.iter().map(|p| piece_hash(p)).collect();
    let mut le = Vec::new();
    for h in &hashes {
        le.extend_from_slice(&h.to_le_bytes());
    }
    assert_eq!(file_digest(&hashes), piece_hash(&le));

    // Pinned values (cross-checked against the Python `xxhash` package's xxh3_64).
    assert_eq!(hashes, [HELLO, COMMA, WORLD]);
    assert_eq!(file_digest(&hashes), HELLO_COMMA_WORLD);

    // The streaming digest agrees, whatever order the pieces arrive in.
    let mut d = FileDigest::default();
    d.add(2, hashes[2]);
    d.add(0, hashes[0]);
    assert_eq!(d.contiguous(), 1);
    assert_eq!(d.finish(3), None);
    d.add(1, hashes[1]);
    assert_eq!(d.finish(3), Some(HELLO_COMMA_WORLD));
}

/// xxh3-64 of `hello`.
const HELLO: u64 = 0x9555_e855_5c62_dcfd;
/// xxh3-64 of `, `.
const COMMA: u64 = 0x3ada_296f_2d1d_d035;
/// xxh3-64 of `world`.
const WORLD: u64 = 0xd647_6c25_083d_69be;
/// The file digest of the three pieces above, in order.
const HELLO_COMMA_WORLD: u64 = 0x7a32_732e_55de_00e0;

#[test]
fn digest_of_layout_pieces() {
    // A 200,000-byte file of bytes `i % 251` cut by 64 KiB chunks: it starts at a
    // chunk boundary, so its pieces are 3 × 65,536 + 3,392 bytes, and its digest is
    // pinned.
    let entries = vec![file("pad", 100), file("big", 200_000)];
    let l = Layout::new(&entries, 64 << 10).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut hashes = Vec::new();
    for k in 0..l.n_chunks() {
        for p in l.pieces(k).filter(|p| p.file == 1) {
            let off = p.file_offset as usize;
            hashes.push(piece_hash(&data[off..off + p.len]));
        }
    }
    assert_eq!(hashes.len(), 4);
    assert_eq!(file_digest(&hashes), BIG_FILE_DIGEST);
}

/// Cross-checked against the Python `xxhash` package.
const BIG_FILE_DIGEST: u64 = 0xdab4_8a69_6c18_b3ae;

// ---------------------------------------------------------------------------------
// Records and key derivation

#[test]
fn record_header_and_nonce() {
    use dmover_proto::record;
    assert_eq!(
        hex(&record::encode_header(0x0001_0203)),
        hex(&hexdump("00 01 02 03   # body length (u32 BE)"))
    );
    assert_eq!(
        record::decode_header(&[0x00, 0x04, 0x00, 0x00]),
        Ok(256 << 10)
    );
    assert_eq!(
        hex(&record::nonce(0x0102_0304_0506_0708)),
        hex(&hexdump(
            "
            00 00 00 00               # zero
            01 02 03 04 05 06 07 08   # record sequence number (u64 BE)
            "
        ))
    );
}

/// Pins the key derivations and proofs: a change to any label, field order or width
/// changes these bytes (and needs a new protocol version).
#[test]
fn auth_derivations_are_pinned() {
    use dmover_proto::auth::{self, Role};
    let t = auth::transcript(&seq32(0), "alice", &seq32(0x20));
    let keys = auth::token_keys(b"correct horse battery staple\n");
    let proof = auth::client_token_proof(&keys, &t);
    assert!(auth::verify_token_proof(&keys.verifier, &t, &proof));
    let sk = auth::session_key(&seq32(0x60), 0x0102_0304_0506_0708, &seq32(0x80));
    let jp = auth::join_proof(&sk, Role::Client, 7, 3, &seq32(1), &seq32(2));
    let rk = auth::record_key(&sk, 3, Role::Server);
    let got = [
        hex(&t),
        keys.verifier.to_text(),
        hex(&proof),
        hex(&sk),
        hex(&jp),
        hex(&rk),
    ];
    let want = include_str!("auth_vectors.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect::<Vec<_>>();
    if std::env::var_os("DMOVER_BLESS").is_some() {
        eprintln!("{}", got.join("\n"));
    }
    assert_eq!(got.to_vec(), want);
}

/// Pins the session id and salt both ends derive from the control connection's export
/// (protocol version 8): the acceptor's `Session` must carry these, and a dialer's
/// early data streams name the id before it came.
#[test]
fn session_ids_are_pinned() {
    let (id, salt) = dmover_proto::auth::session_id(&seq32(0x60));
    let got = format!("{id:016x} {}", hex(&salt));
    if std::env::var_os("DMOVER_BLESS").is_some() {
        eprintln!("{got}");
    }
    assert_eq!(
        got,
        "b75c52df75ebe607 01 45 45 fd ac 89 1b 89 d0 9c 46 5c 9f c1 8e 8e a3 a9 bc da 58 e4 9c bf a4 6a \
         d2 29 6a 1b ee 67"
    );
    // Another connection, another session.
    assert_ne!(dmover_proto::auth::session_id(&seq32(0x61)).0, id);
}

/// The feature bits are wire values (`Open.features`, `Session.features`): a bit keeps
/// its number for good, a new feature takes the next free one, and the base (what
/// every version 8 peer grants when offered) never changes while version 8 is the
/// oldest spoken (docs/protocol.md, "Compatibility policy").
#[test]
fn feature_bits_are_pinned() {
    use dmover_proto::session::features::*;
    let pinned = [
        (GROWING_MANIFEST, 1, "GROWING_MANIFEST"),
        (RANGES, 2, "RANGES"),
        (TUNING, 4, "TUNING"),
        (METADATA, 8, "METADATA"),
        (LINKS, 16, "LINKS"),
        (CONTINUOUS, 32, "CONTINUOUS"),
        (LIMITS, 64, "LIMITS"),
        (STREAMED, 128, "STREAMED"),
        (PARTS, 256, "PARTS"),
        (EARLY, 512, "EARLY"),
        (WALKING, 1024, "WALKING"),
        (PART_CHUNKS, 2048, "PART_CHUNKS"),
        (SYNC_BETWEEN, 4096, "SYNC_BETWEEN"),
        (KEEP, 8192, "KEEP"),
        (SUMS, 16384, "SUMS"),
    ];
    for (value, wire, name) in pinned {
        assert_eq!(value, wire, "feature {name} moved");
    }
    assert_eq!(BASE, 0x1ff, "the base features of version 8");
    // A version 8 peer of e8ed9b2 offered exactly these; one that offers them still
    // gets a session of them all.
    let e8ed9b2 = BASE | EARLY | WALKING | PART_CHUNKS;
    assert_eq!(negotiate(e8ed9b2, SUPPORTED), e8ed9b2);
    assert_eq!(negotiate(SUPPORTED, e8ed9b2), e8ed9b2);
}
