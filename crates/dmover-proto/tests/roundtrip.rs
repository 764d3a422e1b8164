//! Property tests: encode → decode identity for every message type, incremental
//! decoding of control frames, robustness of every decoder on arbitrary bytes, and the
//! layout and digest invariants the data path relies on.

use dmover_proto::control::{
    Auth, AuthMethod, AuthOk, Control, Credential, DataProtection, DirectIo, EntryRange, ErrorCode,
    ErrorMsg, FailedFile, Growth, Have, Hello, LEN_PREFIX, MAX_FRAME, ManifestEnd, ManifestPart,
    Op, Open, PartialFile, Plan, SendReport, SessionInfo, SessionOptions, Summary, Want, Welcome,
};
use dmover_proto::control::{MemDirection, MemTest};
use dmover_proto::data::{
    DIGEST_LEN, DataHello, DigestEntry, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, HELLO_LEN,
    JoinStatus,
};
use dmover_proto::digest::{FileDigest, file_digest};
use dmover_proto::layout::{self, ALIGN, ALIGN_MIN_SIZE, Layout, MAX_CHUNK, MIN_CHUNK};
use dmover_proto::manifest::{self, Entry, EntryKind, Mtime, NO_PARENT, Totals};
use dmover_proto::preamble::{self, ConnKind, Preamble};
use dmover_proto::{Error, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, negotiate_version};
use proptest::collection::vec;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------
// Strategies

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), ".{0,24}", any::<String>()]
}

fn array32() -> impl Strategy<Value = [u8; 32]> {
    any::<[u8; 32]>()
}

fn auth_method() -> impl Strategy<Value = AuthMethod> {
    prop_oneof![Just(AuthMethod::None), Just(AuthMethod::Required)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        bytes(40).prop_map(|dest| Op::Push { dest }),
        vec(bytes(40), 0..5).prop_map(|sources| Op::Pull { sources }),
        (any::<bool>(), any::<u32>(), any::<bool>(), "[a-z]{0,8}").prop_map(
            |(to_server, millis, zerocopy, congestion)| Op::MemTest(MemTest {
                direction: if to_server {
                    MemDirection::ToServer
                } else {
                    MemDirection::FromServer
                },
                millis,
                zerocopy,
                congestion,
            })
        ),
    ]
}

fn direct_io() -> impl Strategy<Value = DirectIo> {
    prop_oneof![
        Just(DirectIo::Never),
        Just(DirectIo::Auto),
        Just(DirectIo::Always)
    ]
}

fn protection() -> impl Strategy<Value = DataProtection> {
    prop_oneof![
        Just(DataProtection::Plain),
        Just(DataProtection::Authenticated),
        Just(DataProtection::Encrypted)
    ]
}

fn open() -> impl Strategy<Value = Open> {
    (
        op(),
        any::<u16>(),
        any::<u32>(),
        any::<bool>(),
        direct_io(),
        protection(),
        any::<u64>(),
    )
        .prop_map(
            |(op, streams, chunk_size, checksum, direct_io, protection, features)| Open {
                op,
                streams,
                chunk_size,
                checksum,
                direct_io,
                protection,
                features,
            },
        )
}

fn credential() -> impl Strategy<Value = Credential> {
    prop_oneof![
        Just(Credential::None),
        array32().prop_map(|proof| Credential::Token { proof }),
        (array32(), bytes(80))
            .prop_map(|(public, signature)| Credential::Key { public, signature }),
    ]
}

fn session_info() -> impl Strategy<Value = SessionInfo> {
    (
        any::<u64>(),
        array32(),
        any::<u16>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(id, salt, streams, chunk_size, features)| SessionInfo {
            id,
            salt,
            streams,
            chunk_size,
            features,
        })
}

fn mtime() -> impl Strategy<Value = Mtime> {
    (any::<i64>(), any::<u32>()).prop_map(|(sec, nsec)| Mtime { sec, nsec })
}

fn entry_kind() -> impl Strategy<Value = EntryKind> {
    prop_oneof![
        any::<u64>().prop_map(|size| EntryKind::File { size }),
        Just(EntryKind::Dir),
        bytes(40).prop_map(|target| EntryKind::Symlink { target }),
    ]
}

/// Any entry, valid or not: the codec must carry whatever a peer sends.
fn entry() -> impl Strategy<Value = Entry> {
    (
        prop_oneof![Just(NO_PARENT), any::<u32>()],
        bytes(40),
        entry_kind(),
        any::<u32>(),
        mtime(),
    )
        .prop_map(|(parent, name, kind, mode, mtime)| Entry {
            parent,
            name,
            kind,
            mode,
            mtime,
        })
}

fn totals() -> impl Strategy<Value = Totals> {
    any::<[u64; 5]>().prop_map(|[entries, files, dirs, symlinks, bytes]| Totals {
        entries,
        files,
        dirs,
        symlinks,
        bytes,
    })
}

fn summary() -> impl Strategy<Value = Summary> {
    (any::<[u64; 5]>(), any::<bool>()).prop_map(
        |([bytes, files, dirs, symlinks, chunks], verified)| Summary {
            bytes,
            files,
            dirs,
            symlinks,
            chunks,
            verified,
        },
    )
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        Just(ErrorCode::Protocol),
        Just(ErrorCode::Auth),
        Just(ErrorCode::NotFound),
        Just(ErrorCode::PermissionDenied),
        Just(ErrorCode::PathEscape),
        Just(ErrorCode::ReadOnly),
        Just(ErrorCode::Io),
        Just(ErrorCode::Checksum),
        Just(ErrorCode::Busy),
        Just(ErrorCode::Aborted),
        Just(ErrorCode::Unsupported),
        Just(ErrorCode::Changed),
    ]
}

fn reliability_control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (any::<[bool; 5]>(), any::<u32>()).prop_map(|(b, heartbeat_ms)| Control::Options(
            SessionOptions {
                resume: b[0],
                journal: b[1],
                fsync: b[2],
                verify: b[3],
                continue_on_error: b[4],
                heartbeat_ms,
            }
        )),
        (
            vec((any::<u32>(), any::<u32>()), 0..8),
            vec(
                (any::<u32>(), vec((any::<u64>(), any::<u64>()), 0..8)),
                0..4
            ),
            any::<bool>()
        )
            .prop_map(|(done, partial, last)| Control::Have(Have {
                done: done
                    .into_iter()
                    .map(|(first, count)| EntryRange { first, count })
                    .collect(),
                partial: partial
                    .into_iter()
                    .map(|(entry, pieces)| PartialFile { entry, pieces })
                    .collect(),
                last,
            })),
        vec(any::<u32>(), 0..8).prop_map(|stale| Control::Plan(Plan { stale })),
        Just(Control::Ping),
        (
            any::<u64>(),
            any::<u32>(),
            vec((any::<u32>(), text()), 0..4)
        )
            .prop_map(|(chunks_resent, streams_lost, failed)| Control::SendReport(
                SendReport {
                    chunks_resent,
                    streams_lost,
                    failed: failed
                        .into_iter()
                        .map(|(entry, message)| FailedFile { entry, message })
                        .collect(),
                }
            )),
        (totals(), any::<u64>(), any::<bool>()).prop_map(|(totals, chunks, last)| {
            Control::Grow(Growth {
                totals,
                chunks,
                last,
            })
        }),
        vec(any::<(u64, u64)>(), 0..8).prop_map(|r| Control::Want(Want {
            chunks: r.into_iter().map(|(a, b)| a..b).collect(),
        })),
        Just(Control::OnDemand),
        vec(any::<(u64, u32, u32)>(), 0..8).prop_map(|r| Control::WantPart(
            dmover_proto::control::WantParts {
                parts: r
                    .into_iter()
                    .map(|(chunk, offset, len)| dmover_proto::control::Part { chunk, offset, len })
                    .collect(),
            }
        )),
        any::<u64>().prop_map(Control::Grown),
        any::<u32>().prop_map(Control::PartChunk),
        (any::<u64>(), text(), text()).prop_map(|(bwlimit, congestion, refused)| {
            Control::Limits(dmover_proto::control::SessionLimits {
                bwlimit,
                congestion,
                refused,
            })
        }),
    ]
}

fn control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (text(), array32()).prop_map(|(software, nonce)| Control::Hello(Hello { software, nonce })),
        (text(), array32(), auth_method()).prop_map(|(software, nonce, auth)| {
            Control::Welcome(Welcome {
                software,
                nonce,
                auth,
            })
        }),
        (text(), credential())
            .prop_map(|(user, credential)| Control::Auth(Auth { user, credential })),
        proptest::option::of(array32()).prop_map(|proof| Control::AuthOk(AuthOk { proof })),
        open().prop_map(Control::Open),
        session_info().prop_map(Control::Session),
        vec(entry(), 0..8).prop_map(|entries| Control::Manifest(ManifestPart { entries })),
        totals().prop_map(|totals| Control::ManifestEnd(ManifestEnd { totals })),
        Just(Control::Go),
        summary().prop_map(Control::Done),
        (error_code(), text())
            .prop_map(|(code, message)| Control::Error(ErrorMsg { code, message })),
        reliability_control(),
    ]
}

fn conn_kind() -> impl Strategy<Value = ConnKind> {
    prop_oneof![Just(ConnKind::Control), Just(ConnKind::Data)]
}

/// Frame headers that a correct sender may produce.
fn frame_header() -> impl Strategy<Value = FrameHeader> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u32>(),
            1..=u32::MAX,
            proptest::option::of(any::<u32>())
        )
            .prop_map(|(chunk, n_digests, payload_len, crc)| FrameHeader {
                kind: FrameKind::Chunk,
                chunk,
                n_digests,
                payload_len,
                crc,
                zeros: false,
                part: chunk % 2 == 1,
            }),
        any::<u64>().prop_map(FrameHeader::end),
    ]
}

/// A valid chunk size: a multiple of [`ALIGN`] in `MIN_CHUNK..=MAX_CHUNK`, biased to
/// the small end so files span several chunks.
fn chunk_size() -> impl Strategy<Value = u32> {
    let align = ALIGN as u32;
    prop_oneof![
        Just(MIN_CHUNK),
        Just(MAX_CHUNK),
        (MIN_CHUNK / align..=4 * MIN_CHUNK / align).prop_map(move |n| n * align),
        (MIN_CHUNK / align..=MAX_CHUNK / align).prop_map(move |n| n * align),
    ]
}

/// A file size for a layout with chunk size `chunk`: empty, small, around the
/// alignment threshold, around chunk boundaries, or spanning several chunks.
fn file_size(chunk: u32) -> impl Strategy<Value = u64> {
    let chunk = u64::from(chunk);
    prop_oneof![
        Just(0u64),
        1..=8192u64,
        ALIGN_MIN_SIZE - 2 * ALIGN..=ALIGN_MIN_SIZE + 2 * ALIGN,
        (1..=3u64, 0..=2 * ALIGN).prop_map(move |(k, d)| (k * chunk + d).saturating_sub(ALIGN)),
        1..=3 * chunk,
    ]
}

/// A manifest of regular files (of the sizes above) mixed with directories and
/// symlinks, which take entry indices but no layout slot.
fn layout_case() -> impl Strategy<Value = (Vec<Entry>, u32)> {
    chunk_size().prop_flat_map(|chunk| {
        let kind = prop_oneof![
            6 => file_size(chunk).prop_map(|size| EntryKind::File { size }),
            1 => Just(EntryKind::Dir),
            1 => Just(EntryKind::Symlink { target: b"t".to_vec() }),
        ];
        let entries = vec(kind, 0..14).prop_map(|kinds| {
            kinds
                .into_iter()
                .enumerate()
                .map(|(i, kind)| Entry {
                    parent: NO_PARENT,
                    name: format!("e{i}").into_bytes(),
                    kind,
                    mode: 0o644,
                    mtime: Mtime::default(),
                })
                .collect::<Vec<_>>()
        });
        (entries, Just(chunk))
    })
}

/// A valid manifest: a random tree in walk order with unique names.
fn valid_manifest() -> impl Strategy<Value = Vec<Entry>> {
    vec(
        (
            any::<prop::sample::Index>(),
            any::<bool>(),
            prop_oneof![
                any::<u32>().prop_map(|s| EntryKind::File { size: s.into() }),
                Just(EntryKind::Dir),
                vec(1..=255u8, 1..40).prop_map(|target| EntryKind::Symlink { target }),
            ],
            0..=0o7777u32,
            (any::<i64>(), 0..1_000_000_000u32),
        ),
        0..30,
    )
    .prop_map(|raw| {
        let mut out: Vec<Entry> = Vec::new();
        let mut dirs: Vec<u32> = Vec::new();
        for (i, (pick, root, kind, mode, (sec, nsec))) in raw.into_iter().enumerate() {
            let parent = if root || dirs.is_empty() {
                NO_PARENT
            } else {
                *pick.get(&dirs)
            };
            if kind == EntryKind::Dir {
                dirs.push(i as u32);
            }
            out.push(Entry {
                parent,
                name: format!("n{i}").into_bytes(),
                kind,
                mode,
                mtime: Mtime { sec, nsec },
            });
        }
        out
    })
}

const ANY_LIMITS: FrameLimits = FrameLimits {
    max_payload: u32::MAX,
    max_digests: u32::MAX,
};

// ---------------------------------------------------------------------------------
// Round trips

proptest! {
    #[test]
    fn control_roundtrip(msg in control()) {
        let frame = msg.to_frame().unwrap();
        let body_len = u32::from_be_bytes(frame[..LEN_PREFIX].try_into().unwrap()) as usize;
        prop_assert_eq!(body_len, frame.len() - LEN_PREFIX);
        prop_assert_eq!(Control::decode_body(&frame[LEN_PREFIX..]), Ok(msg.clone()));
        prop_assert_eq!(
            Control::decode(&frame, MAX_FRAME),
            Ok(Some((msg.clone(), frame.len())))
        );
        // The limit is inclusive: a frame exactly at it decodes.
        prop_assert_eq!(
            Control::decode(&frame, body_len),
            Ok(Some((msg.clone(), frame.len())))
        );
        // encode() appends to what is already in the buffer.
        let mut out = vec![0xaa];
        msg.encode(&mut out).unwrap();
        prop_assert_eq!(&out[1..], &frame[..]);
        // Packed or not, it decodes to itself, and never grows.
        let mut packed = Vec::new();
        msg.encode_packed(&mut packed).unwrap();
        prop_assert!(packed.len() <= frame.len());
        prop_assert_eq!(
            Control::decode(&packed, MAX_FRAME),
            Ok(Some((msg.clone(), packed.len())))
        );
    }

    #[test]
    fn control_decode_is_incremental(msg in control(), next in control()) {
        let frame = msg.to_frame().unwrap();
        for cut in 0..frame.len() {
            prop_assert_eq!(
                Control::decode(&frame[..cut], MAX_FRAME),
                Ok(None),
                "cut at {} of {}", cut, frame.len()
            );
        }
        // With the next frame (or part of it) behind, exactly one frame is taken.
        let mut two = frame.clone();
        two.extend(next.to_frame().unwrap());
        for end in frame.len()..=two.len() {
            prop_assert_eq!(
                Control::decode(&two[..end], MAX_FRAME),
                Ok(Some((msg.clone(), frame.len())))
            );
        }
        prop_assert_eq!(
            Control::decode(&two[frame.len()..], MAX_FRAME),
            Ok(Some((next, two.len() - frame.len())))
        );
    }

    #[test]
    fn preamble_roundtrip(kind in conn_kind(), version in any::<u16>(), tail in bytes(8)) {
        let p = Preamble::new(kind, version);
        let mut b = p.encode().to_vec();
        prop_assert_eq!(b.len(), preamble::LEN);
        prop_assert_eq!(Preamble::decode(&b), Ok(p));
        // Decoders of fixed items read their prefix and ignore what follows.
        b.extend(tail);
        prop_assert_eq!(Preamble::decode(&b), Ok(p));
    }

    #[test]
    fn data_hello_roundtrip(session in any::<u64>(), stream in any::<u16>(), nonce in array32(),
                            tail in bytes(8)) {
        let h = DataHello { session, stream, nonce };
        let mut b = h.encode().to_vec();
        prop_assert_eq!(b.len(), HELLO_LEN);
        prop_assert_eq!(DataHello::decode(&b), Ok(h));
        b.extend(tail);
        prop_assert_eq!(DataHello::decode(&b), Ok(h));
    }

    #[test]
    fn frame_header_roundtrip(h in frame_header(), tail in bytes(8)) {
        let mut b = h.encode().to_vec();
        prop_assert_eq!(b.len(), HEADER_LEN);
        prop_assert_eq!(FrameHeader::decode(&b, &ANY_LIMITS), Ok(h));
        // Limits are inclusive.
        let exact = FrameLimits { max_payload: h.payload_len, max_digests: h.n_digests };
        prop_assert_eq!(FrameHeader::decode(&b, &exact), Ok(h));
        b.extend(tail);
        prop_assert_eq!(FrameHeader::decode(&b, &ANY_LIMITS), Ok(h));
    }

    #[test]
    fn frame_header_limits(h in frame_header()) {
        let b = h.encode();
        if h.payload_len > 0 {
            let lim = FrameLimits { max_payload: h.payload_len - 1, max_digests: u32::MAX };
            let is_too_large = matches!(
                FrameHeader::decode(&b, &lim),
                Err(Error::TooLarge { what: "frame payload", .. })
            );
            prop_assert!(is_too_large);
        }
        if h.n_digests > 0 {
            let lim = FrameLimits { max_payload: u32::MAX, max_digests: h.n_digests - 1 };
            let is_too_large = matches!(
                FrameHeader::decode(&b, &lim),
                Err(Error::TooLarge { what: "frame digest count", .. })
            );
            prop_assert!(is_too_large);
        }
    }

    #[test]
    fn digest_entries_roundtrip(raw in vec((any::<u32>(), any::<u64>()), 0..20)) {
        let entries: Vec<_> =
            raw.into_iter().map(|(file, digest)| DigestEntry { file, digest }).collect();
        let mut b = Vec::new();
        for e in &entries {
            e.encode_into(&mut b);
        }
        prop_assert_eq!(b.len(), entries.len() * DIGEST_LEN);
        let back: Vec<_> = DigestEntry::decode_all(&b).unwrap().collect();
        prop_assert_eq!(back, entries);
    }

    #[test]
    fn join_status_roundtrip(b in any::<u8>()) {
        match JoinStatus::decode(b) {
            Ok(s) => prop_assert_eq!(s as u8, b),
            Err(e) => {
                prop_assert!(b > 3);
                prop_assert_eq!(e, Error::Unknown { what: "join status", value: b.into() });
            }
        }
    }

    #[test]
    fn version_negotiation(ours in any::<u16>(), theirs in any::<u16>()) {
        let v = negotiate_version(ours, theirs);
        prop_assert_eq!(v, negotiate_version(theirs, ours));
        match v {
            Some(v) => {
                prop_assert_eq!(v, ours.min(theirs));
                prop_assert!(v >= MIN_PROTOCOL_VERSION);
            }
            None => prop_assert!(ours.min(theirs) < MIN_PROTOCOL_VERSION),
        }
        prop_assert_eq!(
            negotiate_version(PROTOCOL_VERSION, PROTOCOL_VERSION),
            Some(PROTOCOL_VERSION)
        );
    }
}

// ---------------------------------------------------------------------------------
// Arbitrary input never panics; what decodes re-encodes to the same bytes

proptest! {
    #[test]
    fn fixed_decoders_on_arbitrary_bytes(b in bytes(64), max_payload in any::<u32>(),
                                         max_digests in any::<u32>()) {
        if let Ok(p) = Preamble::decode(&b) {
            prop_assert_eq!(&p.encode()[..], &b[..preamble::LEN]);
        }
        if let Ok(h) = DataHello::decode(&b) {
            prop_assert_eq!(&h.encode()[..], &b[..HELLO_LEN]);
        }
        let limits = FrameLimits { max_payload, max_digests };
        if let Ok(h) = FrameHeader::decode(&b, &limits) {
            prop_assert_eq!(&h.encode()[..], &b[..HEADER_LEN]);
            prop_assert!(h.payload_len <= max_payload && h.n_digests <= max_digests);
        }
        if let Ok(entries) = DigestEntry::decode_all(&b) {
            let mut out = Vec::new();
            for e in entries {
                e.encode_into(&mut out);
            }
            prop_assert_eq!(out, b.clone());
        }
        for &x in &b {
            let _ = JoinStatus::decode(x);
        }
    }

    /// Headers with valid kinds and zero reserved bytes, so the later checks are
    /// reached too.
    #[test]
    fn frame_header_on_plausible_bytes(kind in 0..4u8, flags in 0..3u8, rest in any::<[u8; 20]>(),
                                       max_payload in any::<u32>(), max_digests in any::<u32>()) {
        let mut b = vec![kind, flags, 0, 0];
        b.extend_from_slice(&rest);
        let limits = FrameLimits { max_payload, max_digests };
        if let Ok(h) = FrameHeader::decode(&b, &limits) {
            prop_assert_eq!(&h.encode()[..], &b[..]);
        }
    }

    #[test]
    fn control_decode_on_arbitrary_bytes(b in bytes(256), max in prop_oneof![
        Just(0usize), Just(16), Just(MAX_FRAME), Just(u32::MAX as usize), Just(usize::MAX)
    ]) {
        check_control_decode(&b, max)?;
    }

    /// A plausible length prefix and a known tag in front of random bytes, so postcard
    /// gets past the first byte.
    #[test]
    fn control_decode_on_random_bodies(tag in 0..12u8, body in bytes(200)) {
        let mut b = Vec::new();
        b.extend_from_slice(&(body.len() as u32 + 1).to_be_bytes());
        b.push(tag);
        b.extend_from_slice(&body);
        check_control_decode(&b, MAX_FRAME)?;
        if let Ok(m) = Control::decode_body(&b[LEN_PREFIX..]) {
            prop_assert_eq!(Control::decode_body(&m.to_frame().unwrap()[LEN_PREFIX..]), Ok(m));
        }
    }

    /// Valid frames with one byte changed, or cut short inside the body.
    #[test]
    fn control_decode_on_mutated_frames(msg in control(), at in any::<prop::sample::Index>(),
                                        byte in any::<u8>()) {
        let mut frame = msg.to_frame().unwrap();
        let i = at.index(frame.len());
        frame[i] = byte;
        check_control_decode(&frame, MAX_FRAME)?;
        // A wrong length prefix that still fits in the buffer.
        if frame.len() > LEN_PREFIX + 1 {
            let mut short = msg.to_frame().unwrap();
            let n = at.index(short.len() - LEN_PREFIX) as u32;
            short[..LEN_PREFIX].copy_from_slice(&n.to_be_bytes());
            check_control_decode(&short, MAX_FRAME)?;
        }
    }

    #[test]
    fn manifest_validate_on_arbitrary_entries(entries in vec(entry(), 0..12), max in 0..20u64) {
        if let Ok(t) = manifest::validate(&entries, max) {
            prop_assert_eq!(t, Totals::of(&entries));
            prop_assert!(t.entries <= max);
        }
    }

    #[test]
    fn manifest_part_from_arbitrary_bytes(b in bytes(300)) {
        let Ok(part) = postcard::from_bytes::<ManifestPart>(&b) else {
            return Ok(());
        };
        if manifest::validate(&part.entries, 1 << 20).is_err() {
            return Ok(());
        }
        for chunk in [MIN_CHUNK, layout::DEFAULT_CHUNK, MAX_CHUNK] {
            let l = Layout::new(&part.entries, chunk).unwrap();
            for k in 0..l.n_chunks().min(64) {
                let _ = l.wire_len(k);
            }
        }
    }
}

/// `Control::decode` must not panic; anything it accepts takes a whole frame and
/// survives a re-encoding.
fn check_control_decode(b: &[u8], max: usize) -> Result<(), TestCaseError> {
    match Control::decode(b, max) {
        Ok(Some((m, n))) => {
            prop_assert!(n >= LEN_PREFIX && n <= b.len());
            prop_assert!(n - LEN_PREFIX <= max);
            let again = m.to_frame().unwrap();
            prop_assert_eq!(
                Control::decode(&again, MAX_FRAME),
                Ok(Some((m, again.len())))
            );
        }
        Ok(None) => {
            // Only when the frame is incomplete.
            if let Some(prefix) = b.first_chunk::<LEN_PREFIX>() {
                let n = u32::from_be_bytes(*prefix) as usize;
                prop_assert!(b.len() < LEN_PREFIX + n);
            }
        }
        Err(_) => {}
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Manifest

proptest! {
    #[test]
    fn valid_manifests_validate(entries in valid_manifest()) {
        let t = manifest::validate(&entries, entries.len() as u64);
        prop_assert_eq!(&t, &Ok(Totals::of(&entries)));
        let t = t.unwrap();
        prop_assert_eq!(t.files + t.dirs + t.symlinks, t.entries);
        // One entry over the limit is refused.
        if !entries.is_empty() {
            let too_many = matches!(
                manifest::validate(&entries, entries.len() as u64 - 1),
                Err(Error::TooLarge { what: "manifest entries", .. })
            );
            prop_assert!(too_many);
        }
        // And the manifest survives the wire.
        let msg = Control::Manifest(ManifestPart { entries });
        let frame = msg.to_frame().unwrap();
        prop_assert_eq!(Control::decode(&frame, MAX_FRAME), Ok(Some((msg, frame.len()))));
    }
}

// ---------------------------------------------------------------------------------
// Layout

/// The layout rules, restated independently: where each file with data must start.
fn expected_slots(entries: &[Entry], chunk: u64) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    for (i, e) in entries.iter().enumerate() {
        let size = e.file_size();
        if size == 0 {
            continue;
        }
        let aligned = size >= ALIGN_MIN_SIZE;
        let start = if size >= chunk {
            cursor.div_ceil(chunk) * chunk
        } else if aligned {
            cursor.div_ceil(ALIGN) * ALIGN
        } else {
            cursor
        };
        let end = start + size;
        cursor = if aligned {
            end.div_ceil(ALIGN) * ALIGN
        } else {
            end
        };
        out.push((i as u32, start, size));
    }
    out
}

proptest! {
    #[test]
    fn layout_invariants((entries, chunk) in layout_case()) {
        prop_assert!(manifest::validate(&entries, 1000).is_ok());
        let l = Layout::new(&entries, chunk).unwrap();
        let chunk = u64::from(chunk);
        prop_assert_eq!(l.chunk_size(), chunk);

        // Rules 1 and 2: slots in manifest order, chunk-aligned, aligned or packed.
        let slots: Vec<_> = l.files().iter().map(|s| (s.entry, s.start, s.size)).collect();
        let expected = expected_slots(&entries, chunk);
        prop_assert_eq!(&slots, &expected);
        for s in l.files() {
            prop_assert_eq!(s.aligned(), s.size >= ALIGN_MIN_SIZE);
            if s.aligned() {
                prop_assert_eq!(s.start % ALIGN, 0);
            }
        }
        // Rule 3: the space ends at the last file's last byte.
        prop_assert_eq!(l.total(), l.files().last().map_or(0, |s| s.end()));
        prop_assert_eq!(l.n_chunks(), l.total().div_ceil(chunk));

        // Rule 4: pieces.
        let n = l.files().len();
        let mut covered = vec![0u64; n];
        let mut next_index = vec![0u64; n];
        let mut segs = Vec::new();
        for k in 0..l.n_chunks() {
            let (lo, hi) = l.chunk_bounds(k);
            prop_assert_eq!(lo, k * chunk);
            prop_assert!(lo < hi && hi - lo <= chunk);
            prop_assert!(hi == lo + chunk || k + 1 == l.n_chunks(), "only the last chunk is short");
            let pieces: Vec<_> = l.pieces(k).collect();
            prop_assert!(!pieces.is_empty(), "no chunk is all padding");
            let mut wire = 0u64;
            let mut prev_end = 0usize;
            for (j, p) in pieces.iter().enumerate() {
                let f = p.file as usize;
                let slot = l.files()[f];
                prop_assert!(p.len > 0);
                prop_assert!(p.buf_offset >= prev_end, "pieces in buffer order, no overlap");
                prev_end = p.buf_offset + p.len;
                // Each byte of each file exactly once, in order.
                prop_assert_eq!(p.file_offset, covered[f]);
                prop_assert_eq!(p.index, next_index[f]);
                covered[f] += p.len as u64;
                next_index[f] += 1;
                prop_assert_eq!(p.last, covered[f] == slot.size);
                prop_assert_eq!(p.aligned, slot.aligned());
                // The piece sits where the file's bytes are in the virtual space.
                prop_assert_eq!(slot.start + p.file_offset, lo + p.buf_offset as u64);
                prop_assert!(lo + prev_end as u64 <= hi);
                if p.aligned {
                    prop_assert_eq!(p.file_offset % ALIGN, 0);
                    prop_assert_eq!(p.buf_offset as u64 % ALIGN, 0);
                    prop_assert!(p.direct_len() >= p.len && p.direct_len() as u64 % ALIGN == 0);
                    prop_assert!((p.buf_offset + p.direct_len()) as u64 <= chunk);
                    // Rounding up never reaches the next piece.
                    if let Some(q) = pieces.get(j + 1) {
                        prop_assert!(p.buf_offset + p.direct_len() <= q.buf_offset);
                    }
                }
                wire += p.len as u64;
            }
            prop_assert_eq!(wire, l.wire_len(k));

            // Segments: the pieces' byte ranges, merged where they touch.
            l.segments(k, &mut segs);
            prop_assert_eq!(segs.iter().map(|s| s.1 as u64).sum::<u64>(), wire);
            for w in segs.windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0, "segments are maximal and ordered");
            }
            let mut merged: Vec<(usize, usize)> = Vec::new();
            for p in &pieces {
                match merged.last_mut() {
                    Some((o, n)) if *o + *n == p.buf_offset => *n += p.len,
                    _ => merged.push((p.buf_offset, p.len)),
                }
            }
            prop_assert_eq!(&merged, &segs);
        }
        for (f, s) in l.files().iter().enumerate() {
            prop_assert_eq!(covered[f], s.size, "file {} fully covered", f);
            prop_assert_eq!(next_index[f], l.n_pieces(f as u32));
        }
        prop_assert_eq!(l.pieces(l.n_chunks()).count(), 0);
        prop_assert_eq!(l.wire_len(l.n_chunks()), 0);
    }
}

proptest! {
    /// Rule 5: parts laid out in chunks of their own sizes (feature PART_CHUNKS) hold,
    /// chunk by chunk, what each part holds laid out alone, and cover every byte once.
    #[test]
    fn parts_of_their_own_chunk_sizes(
        (entries, chunk) in layout_case(),
        cuts in vec((0usize..14, 0u32..4), 0..5),
    ) {
        let mut ends: Vec<(usize, u32)> = cuts
            .into_iter()
            .map(|(at, shift)| (at.min(entries.len()), shift))
            .collect();
        ends.sort();
        ends.push((entries.len(), 0));
        let first = ends[0].0;
        let mut l = Layout::new(&entries[..first], chunk).unwrap();
        let mut from = first;
        for &(end, shift) in &ends[1..] {
            // The part's size: the session's, or a power-of-two fraction of it.
            let c = (chunk >> shift).max(MIN_CHUNK) / 4096 * 4096;
            let before = l.clone();
            l.extend_with(&entries[..end], from, c).unwrap();
            let alone = Layout::with_filter(&entries[..end], c, |i| i >= from).unwrap();
            let k0 = before.n_chunks();
            prop_assert_eq!(l.n_chunks(), k0 + alone.n_chunks());
            for k in 0..k0 {
                prop_assert_eq!(l.pieces(k).collect::<Vec<_>>(), before.pieces(k).collect::<Vec<_>>());
                prop_assert_eq!(l.chunk_bounds(k).0, before.chunk_bounds(k).0);
            }
            let n0 = before.files().len() as u32;
            for k in 0..alone.n_chunks() {
                prop_assert_eq!(l.chunk_of(k0 + k), u64::from(c));
                let (lo, hi) = alone.chunk_bounds(k);
                let (glo, ghi) = l.chunk_bounds(k0 + k);
                prop_assert_eq!(ghi - glo, hi - lo);
                let a: Vec<_> = alone
                    .pieces(k)
                    .map(|p| (p.file + n0, p.index, p.file_offset, p.buf_offset, p.len, p.last))
                    .collect();
                let b: Vec<_> = l
                    .pieces(k0 + k)
                    .map(|p| (p.file, p.index, p.file_offset, p.buf_offset, p.len, p.last))
                    .collect();
                prop_assert_eq!(a, b);
            }
            from = end;
        }
        // Every byte of every file once, in order; file_pieces agrees.
        let mut covered = vec![0u64; l.files().len()];
        for k in 0..l.n_chunks() {
            let (lo, hi) = l.chunk_bounds(k);
            prop_assert!(hi - lo <= l.chunk_of(k) && l.chunk_of(k) <= l.chunk_size());
            for p in l.pieces(k) {
                let f = p.file as usize;
                prop_assert_eq!(p.file_offset, covered[f]);
                prop_assert_eq!(l.files()[f].start + p.file_offset, lo + p.buf_offset as u64);
                prop_assert!((p.buf_offset + p.len) as u64 <= hi - lo);
                if p.aligned {
                    prop_assert_eq!(p.buf_offset as u64 % ALIGN, 0);
                    prop_assert!((p.buf_offset + p.direct_len()) as u64 <= l.chunk_of(k));
                }
                covered[f] += p.len as u64;
            }
        }
        for (f, s) in l.files().iter().enumerate() {
            prop_assert_eq!(covered[f], s.size);
            let cuts: Vec<_> = l.file_pieces(f as u32).collect();
            prop_assert_eq!(cuts.len() as u64, l.n_pieces(f as u32));
            prop_assert_eq!(cuts.iter().map(|c| c.2).sum::<u64>(), s.size);
        }
    }
}

// ---------------------------------------------------------------------------------
// Digests

proptest! {
    #[test]
    fn file_digest_any_order(
        (hashes, order) in vec(any::<u64>(), 0..40).prop_flat_map(|h| {
            let idx: Vec<usize> = (0..h.len()).collect();
            (Just(h), Just(idx).prop_shuffle())
        })
    ) {
        let n = hashes.len() as u64;
        let mut d = FileDigest::default();
        for (added, &i) in order.iter().enumerate() {
            prop_assert_eq!(d.finish(n), None, "{} of {} pieces added", added, n);
            d.add(i as u64, hashes[i]);
        }
        prop_assert_eq!(d.contiguous(), n);
        prop_assert_eq!(d.finish(n), Some(file_digest(&hashes)));
        prop_assert_eq!(d.finish(n + 1), None);
    }
}
