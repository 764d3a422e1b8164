//! The session role machines fed messages and events by hand: what each rule of the
//! session protocol makes a source or a sink do (early data, growing manifests, wanted
//! chunks and parts, metadata, continuous mode, sparse lists, limits). No driver, no
//! sockets, no wall clock. Whole sessions run on the production drivers over an
//! in-memory transport in `dmover-core`'s `harness` (its pair schedules).

use std::time::Duration;

use dmover_proto::session::{Limits, SessionError, Timing};

const HOUR: Duration = Duration::from_secs(3600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An acceptor's answers to a first flight without authentication, opening `info`.
fn answers(info: SessionInfo) -> [Control; 3] {
    use dmover_proto::control::{AuthMethod, AuthOk, Welcome};
    [
        Control::Welcome(Welcome {
            software: "t".into(),
            nonce: [4; 32],
            auth: AuthMethod::None,
        }),
        Control::AuthOk(AuthOk { proof: None }),
        Control::Session(info),
    ]
}

#[test]
fn a_session_unlike_the_one_early_data_assumed_fails() {
    use dmover_proto::control::{Auth, Credential, DataProtection, DirectIo, Hello, Op, Open};
    use dmover_proto::session::{Dial, SourceEvent};
    let t0 = Instant::now();
    let dial = Dial {
        hello: Hello {
            software: "t".into(),
            nonce: [1; 32],
        },
        auth: Auth {
            user: "u".into(),
            credential: Credential::None,
        },
        open: Open {
            op: Op::Push {
                dest: b"d".to_vec(),
            },
            streams: 4,
            chunk_size: 1 << 20,
            checksum: true,
            direct_io: DirectIo::Never,
            protection: DataProtection::Authenticated,
            features: features::TUNING,
        },
        options: SessionOptions {
            resume: false,
            journal: true,
            fsync: false,
            verify: false,
            continue_on_error: false,
            heartbeat_ms: 1000,
        },
        server_proof: None,
        limits: Default::default(),
    };
    let assumed = dial.assumed(9, [8; 32]);
    assert_eq!(
        (assumed.streams, assumed.chunk_size, assumed.features),
        (4, 1 << 20, features::TUNING)
    );
    let granted = [
        assumed.clone(),
        SessionInfo {
            streams: 2,
            ..assumed.clone()
        },
        SessionInfo {
            id: 10,
            ..assumed.clone()
        },
        SessionInfo {
            salt: [7; 32],
            ..assumed.clone()
        },
    ];
    for (i, info) in granted.into_iter().enumerate() {
        let mut s: SourceSession<dmover_proto::session::testkit::TestError> =
            SourceSession::dial_early(t0, "acceptor", Timing::default(), dial.clone(), 9, [8; 32]);
        // Open at once, streams and all.
        assert_eq!(s.info(), Some(&assumed));
        assert!(matches!(s.poll_event(), Some(SourceEvent::Opened(_))));
        s.push_manifest(&manifest(1));
        s.end_manifest(totals(&manifest(1)), ChunkSet::all(1));
        assert!(matches!(s.poll_event(), Some(SourceEvent::Go)));
        for msg in answers(info) {
            s.handle_control(t0, msg);
        }
        // A broken rule waits a moment for the peer's own report.
        s.handle_timeout(t0 + Timing::default().report_wait + ms(1));
        let ev = s.poll_event();
        if i == 0 {
            assert!(ev.is_none(), "{ev:?}");
        } else {
            match ev {
                Some(SourceEvent::Failed(SessionError::Protocol { what, .. })) => {
                    assert!(what.contains("early data assumed"), "{what}")
                }
                other => panic!("grant {i}: {other:?}"),
            }
        }
    }
    // A push that offers a negotiated bit too (a live walk's WALKING): `Session` may
    // grant it or not, which the source learns there; one that grants a bit not
    // offered, or leaves out a base bit offered, breaks the protocol.
    let walking = Dial {
        open: Open {
            features: features::TUNING | features::WALKING,
            ..dial.open.clone()
        },
        ..dial.clone()
    };
    let assumed = walking.assumed(9, [8; 32]);
    assert_eq!(
        assumed.features,
        features::TUNING,
        "only base bits are assumed"
    );
    let grants = [
        (features::TUNING | features::WALKING, true),
        (features::TUNING, true),
        (
            features::TUNING | features::WALKING | features::EARLY,
            false,
        ),
        (features::WALKING, false),
    ];
    for (granted, ok) in grants {
        let mut s: SourceSession<dmover_proto::session::testkit::TestError> =
            SourceSession::dial_early(
                t0,
                "acceptor",
                Timing::default(),
                walking.clone(),
                9,
                [8; 32],
            );
        assert!(matches!(s.poll_event(), Some(SourceEvent::Opened(_))));
        assert!(!s.negotiated() && !s.uses(features::WALKING));
        s.push_manifest(&manifest(1));
        s.end_manifest(totals(&manifest(1)), ChunkSet::all(1));
        assert!(matches!(s.poll_event(), Some(SourceEvent::Go)));
        for msg in answers(SessionInfo {
            features: granted,
            ..assumed.clone()
        }) {
            s.handle_control(t0, msg);
        }
        s.handle_timeout(t0 + Timing::default().report_wait + ms(1));
        let ev = s.poll_event();
        if ok {
            assert!(ev.is_none(), "{granted:#x}: {ev:?}");
            assert!(s.negotiated());
            assert_eq!(
                s.uses(features::WALKING),
                granted & features::WALKING != 0,
                "{granted:#x}"
            );
            assert_eq!(s.info().map(|i| i.features), Some(granted));
        } else {
            match ev {
                Some(SourceEvent::Failed(SessionError::Protocol { what, .. })) => assert!(
                    ["early data assumed", "not offered", "every acceptor grants"]
                        .iter()
                        .any(|w| what.contains(w)),
                    "{what}"
                ),
                other => panic!("grant {granted:#x}: {other:?}"),
            }
        }
    }
    // A pulling sink: the Session must name the derived id and grant every stream its
    // early joins took.
    let pull = Dial {
        open: Open {
            op: Op::Pull {
                sources: vec![b"s".to_vec()],
            },
            features: features::EARLY,
            ..dial.open.clone()
        },
        ..dial.clone()
    };
    let granted = SessionInfo {
        features: features::EARLY,
        ..assumed.clone()
    };
    for (i, info) in [
        granted.clone(),
        SessionInfo {
            streams: 3,
            ..granted.clone()
        },
        SessionInfo {
            id: 10,
            ..granted.clone()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut s: SinkSession<dmover_proto::session::testkit::TestError> = SinkSession::dial_early(
            t0,
            "acceptor",
            Timing::default(),
            Limits::default(),
            pull.clone(),
            9,
            [8; 32],
        );
        // Its streams are opened at once.
        let opens = std::iter::from_fn(|| s.poll_command()).count();
        assert_eq!(opens, 4);
        for msg in answers(info) {
            s.handle_control(t0, msg);
        }
        s.handle_timeout(t0 + Timing::default().report_wait + ms(1));
        let failed = std::iter::from_fn(|| s.poll_event()).find_map(|e| match e {
            SinkEvent::Failed(e) => Some(e),
            _ => None,
        });
        match (i, failed) {
            (0, None) => assert_eq!(std::iter::from_fn(|| s.poll_command()).count(), 0),
            (0, Some(e)) => panic!("{e:?}"),
            (_, Some(SessionError::Protocol { what, .. })) => {
                assert!(what.contains("early data assumed"), "{what}")
            }
            (_, other) => panic!("grant {i}: {other:?}"),
        }
    }
}

// ---- Growing manifests and chunk requests (features GROWING_MANIFEST and RANGES) ----

use dmover_proto::control::{
    Control, Growth, ManifestEnd, ManifestPart, MetaPart, SessionInfo, SessionOptions, Want,
};
use dmover_proto::manifest::EntryMeta;
use dmover_proto::session::testkit::{manifest, totals};
use dmover_proto::session::{ChunkSet, SinkEvent, SinkSession, SourceSession, features};
use std::time::Instant;

/// The machine decides how a producer's parts go: when the next may be taken (a later
/// part once negotiated, a streamed manifest's one ahead of the sink's confirmations)
/// and whether it goes as a part, as the rest of a whole manifest (a sink without
/// STREAMED), or is refused (hard links or holes in a later part without WALKING).
#[test]
fn the_source_machine_plans_the_parts_of_a_growing_manifest() {
    use dmover_proto::session::PartPlan;
    let now = Instant::now();
    let grown = features::GROWING_MANIFEST;
    // An acceptor before it granted the session knows no features: nothing yet.
    let m = SourceSession::<dmover_proto::session::testkit::TestError>::accept(
        now,
        "peer",
        Timing::default(),
        now + HOUR,
    );
    assert!(!m.ready_for_part(0));
    let (m, _) = source_with(grown | features::STREAMED);
    // Granted and past `Go` (the first part confirmed): one ahead.
    assert_eq!(m.parts_confirmed(), 1);
    assert!(m.ready_for_part(0) && m.ready_for_part(1) && m.ready_for_part(2));
    assert!(!m.ready_for_part(3), "two ahead of the confirmations");
    let (plain, _) = source_with(grown);
    assert!(
        plain.ready_for_part(9),
        "parts not streamed go as they come"
    );
    // Plans.
    assert_eq!(m.plan_part(0, true, false), PartPlan::Grow);
    assert_eq!(plain.plan_part(0, true, false), PartPlan::RestWhole);
    assert_eq!(plain.plan_part(0, false, false), PartPlan::Grow);
    assert_eq!(plain.plan_part(1, false, true), PartPlan::Refuse);
    assert_eq!(plain.plan_part(1, false, false), PartPlan::Grow);
    let (walking, _) = source_with(grown | features::WALKING);
    assert_eq!(walking.plan_part(1, false, true), PartPlan::Grow);
}

fn options() -> SessionOptions {
    SessionOptions {
        resume: false,
        journal: true,
        fsync: false,
        verify: true,
        continue_on_error: false,
        heartbeat_ms: 1000,
    }
}

fn info(features: u64) -> SessionInfo {
    SessionInfo {
        id: 1,
        salt: [0; 32],
        streams: 2,
        chunk_size: 1 << 20,
        features,
    }
}

/// A sink acceptor in a session using `features` that has the dialer's options.
fn granted_sink(
    features: u64,
) -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let now = Instant::now();
    let mut m = SinkSession::accept(
        now,
        "peer",
        Timing::default(),
        Limits::default(),
        now + HOUR,
    );
    m.grant(now, info(features));
    m.handle_control(now, Control::Options(options()));
    (m, now)
}

/// A sink acceptor in a session using `features`, with a manifest part received.
fn sink_with(
    features: u64,
) -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let (mut m, now) = granted_sink(features);
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: manifest(2),
        }),
    );
    (m, now)
}

/// A source acceptor in a session using `features` that has had `Go`.
fn source_with(
    features: u64,
) -> (
    SourceSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let now = Instant::now();
    let mut m = SourceSession::accept(now, "peer", Timing::default(), now + HOUR);
    m.grant(now, info(features));
    m.handle_control(now, Control::Options(options()));
    let entries = manifest(2);
    m.push_manifest(&entries);
    m.end_manifest(totals(&entries), ChunkSet::all(8));
    m.handle_control(now, Control::Go);
    (m, now)
}

/// A request for one range of chunks.
fn want(r: std::ops::Range<u64>) -> Control {
    Control::Want(Want {
        chunks: std::iter::once(r).collect(),
    })
}

fn protocol_failure<E: std::fmt::Debug>(events: Vec<E>) -> String {
    let last = format!("{:?}", events.last().expect("an event"));
    assert!(last.starts_with("Failed(Protocol"), "{events:?}");
    last
}

#[test]
fn a_message_needing_a_feature_the_session_does_not_use_is_a_protocol_error() {
    let grow = Control::Grow(Growth {
        totals: totals(&manifest(2)),
        chunks: 2,
        last: true,
    });
    // The sink, sent a growing manifest's part without the feature.
    let (mut m, now) = sink_with(features::RANGES);
    m.handle_control(now, grow.clone());
    // Not a root cause: the machine waits briefly for the peer's report first.
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("Grow needs the growing manifest feature"), "{e}");
    let sent: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
    assert!(
        matches!(sent.last(), Some(Control::Error(_))),
        "the peer is told: {sent:?}"
    );
    // With it, the same part is the manifest.
    let (mut m, now) = sink_with(features::GROWING_MANIFEST);
    m.handle_control(now, grow);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(matches!(events.last(), Some(SinkEvent::Manifest(e)) if e.len() == 3));
    // A growing manifest's message after a whole one is out of order.
    let (mut m, now) = sink_with(features::GROWING_MANIFEST);
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    m.handle_control(now, Control::Grown(4));
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        format!("{events:?}").contains("Failed(Unexpected"),
        "{events:?}"
    );

    // The source, sent requests without the feature.
    for msg in [want(1..2), Control::Grown(8)] {
        let (mut m, now) = source_with(features::GROWING_MANIFEST & !features::needed(&msg));
        while m.poll_event().is_some() {}
        m.handle_control(now, msg.clone());
        m.handle_timeout(now + Timing::default().report_wait);
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        let e = protocol_failure(events);
        assert!(e.contains(&format!("{} needs the", msg.name())), "{e}");
    }
    let now = Instant::now();
    let mut m = SourceSession::<dmover_proto::session::testkit::TestError>::accept(
        now,
        "peer",
        Timing::default(),
        now + HOUR,
    );
    m.grant(now, info(0));
    m.handle_control(now, Control::Options(options()));
    m.end_manifest(totals(&[]), ChunkSet::new());
    m.handle_control(now, Control::OnDemand);
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("OnDemand needs the ranges feature"), "{e}");
}

/// A growing manifest's sink past its first part (3 entries, 2 chunks), with
/// `features`.
fn sink_grown_once(
    features: u64,
) -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let (mut m, now) = sink_with(features::GROWING_MANIFEST | features);
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&manifest(2)),
            chunks: 2,
            last: false,
        }),
    );
    while m.poll_event().is_some() {}
    (m, now)
}

/// Sends entries `from..` of `manifest(files)` as a later part ending in `chunks`.
fn later_part(
    m: &mut SinkSession<dmover_proto::session::testkit::TestError>,
    now: Instant,
    files: u32,
    from: usize,
    chunks: u64,
    chunk: Option<u32>,
) -> Vec<SinkEvent<dmover_proto::session::testkit::TestError>> {
    let all = manifest(files);
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: all[from..].to_vec(),
        }),
    );
    if let Some(c) = chunk {
        m.handle_control(now, Control::PartChunk(c));
    }
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&all),
            chunks,
            last: false,
        }),
    );
    m.handle_timeout(now + Timing::default().report_wait);
    std::iter::from_fn(|| m.poll_event()).collect()
}

#[test]
fn a_later_part_may_name_its_chunk_size() {
    let grown_chunk = |events: &[SinkEvent<_>]| match events.last() {
        Some(SinkEvent::Grown { chunk, chunks, .. }) => (*chunk, chunks.clone()),
        e => panic!("{e:?}"),
    };
    // A part with a size of its own, then one without: the session's.
    let (mut m, now) = sink_grown_once(features::PART_CHUNKS);
    let e = later_part(&mut m, now, 4, 3, 10, Some(256 << 10));
    assert_eq!(grown_chunk(&e), (256 << 10, 2..10));
    let e = later_part(&mut m, now, 5, 5, 11, None);
    assert_eq!(grown_chunk(&e), (1 << 20, 10..11));
    // Larger than the session's, not a chunk size, or without the feature: refused.
    for (features, c, what) in [
        (features::PART_CHUNKS, 2 << 20, "exceeds the session's"),
        (features::PART_CHUNKS, 1000, "is not a multiple of"),
        (0, 256 << 10, "PartChunk needs the chunks per part feature"),
    ] {
        let (mut m, now) = sink_grown_once(features);
        let e = protocol_failure(later_part(&mut m, now, 4, 3, 10, Some(c)));
        assert!(e.contains(what), "{e}");
    }
    // Not for the first part.
    let (mut m, now) = sink_with(features::GROWING_MANIFEST | features::PART_CHUNKS);
    m.handle_control(now, Control::PartChunk(256 << 10));
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        format!("{events:?}").contains("Failed(Unexpected"),
        "{events:?}"
    );

    // The source names a size only when it differs, and only with the feature.
    let source = |features: u64| {
        let now = Instant::now();
        let mut m = SourceSession::<dmover_proto::session::testkit::TestError>::accept(
            now,
            "peer",
            Timing::default(),
            now + HOUR,
        );
        m.grant(now, info(features::GROWING_MANIFEST | features));
        m.handle_control(now, Control::Options(options()));
        let entries = manifest(2);
        m.push_manifest(&entries);
        m.grow_manifest(now, totals(&entries), 2, false);
        m.handle_control(now, Control::Go);
        while m.poll_transmit().is_some() {}
        while m.poll_event().is_some() {}
        (m, now)
    };
    let (mut m, now) = source(features::PART_CHUNKS);
    m.part_chunk(now, 1 << 20);
    assert_eq!(m.poll_transmit(), None, "the session's size goes unsaid");
    m.part_chunk(now, 256 << 10);
    assert_eq!(m.poll_transmit(), Some(Control::PartChunk(256 << 10)));
    for (features, c) in [(0, 256 << 10), (features::PART_CHUNKS, 2 << 20)] {
        let (mut m, now) = source(features);
        m.part_chunk(now, c);
        m.handle_timeout(now + Timing::default().report_wait);
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        protocol_failure(events);
    }
}

#[test]
fn a_want_beyond_the_layout_is_a_protocol_error() {
    let (mut m, now) = source_with(features::RANGES);
    m.set_layout_chunks(8);
    while m.poll_event().is_some() {}
    m.handle_control(now, want(7..8));
    assert_eq!(m.poll_read().map(|j| j.chunk), Some(7), "wanted first");
    assert_eq!(m.poll_read().map(|j| j.chunk), Some(0));
    m.handle_control(now, want(7..9));
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("beyond the layout's 8"), "{e}");
}

// ---- Parts of chunks (feature PARTS) ----

use dmover_proto::control::{Part, WantParts};
use dmover_proto::session::{Arrival, ChunkMeta, PartRange, SourceCommand};

fn want_part(chunk: u64, offset: u32, len: u32) -> Control {
    Control::WantPart(WantParts {
        parts: vec![Part { chunk, offset, len }],
    })
}

/// A source acceptor in a request-driven session using `features`.
fn source_on_demand(
    features: u64,
) -> (
    SourceSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let now = Instant::now();
    let mut m = SourceSession::accept(now, "peer", Timing::default(), now + HOUR);
    m.grant(now, info(features));
    m.handle_control(now, Control::Options(options()));
    let entries = manifest(2);
    m.push_manifest(&entries);
    m.end_manifest(totals(&entries), ChunkSet::all(8));
    m.set_layout_chunks(8);
    m.handle_control(now, Control::OnDemand);
    m.stream_joined(now, 0);
    while m.poll_event().is_some() {}
    (m, now)
}

#[test]
fn a_part_is_read_ahead_of_wanted_chunks_and_sent_as_a_part() {
    let (mut m, now) = source_on_demand(features::RANGES | features::PARTS);
    m.handle_control(now, want(5..6));
    m.handle_control(now, want_part(3, 100, 50));
    let r = PartRange {
        offset: 100,
        len: 50,
    };
    let job = m.poll_read().expect("a read");
    assert_eq!((job.chunk, job.part), (3, Some(r)), "the part first");
    let job2 = m.poll_read().expect("a read");
    assert_eq!((job2.chunk, job2.part), (5, None));
    assert!(m.poll_read().is_none(), "nothing unasked");
    // Read done: the part goes out as a part (the driver's frame fields say so).
    let meta = ChunkMeta {
        crc: Some(1),
        part: Some(r),
        ..ChunkMeta::default()
    };
    m.chunk_read(now, 3, meta.clone());
    let sends: Vec<_> = std::iter::from_fn(|| m.poll_command()).collect();
    assert_eq!(
        sends,
        [SourceCommand::Send {
            stream: 0,
            chunk: 3,
            meta
        }]
    );
}

#[test]
fn a_bad_part_request_is_a_protocol_error() {
    let cs = info(0).chunk_size;
    for (msg, features, says) in [
        (
            want_part(8, 0, 1),
            features::RANGES | features::PARTS,
            "beyond the layout's 8",
        ),
        (
            want_part(1, cs - 10, 11),
            features::RANGES | features::PARTS,
            "whose size is",
        ),
        (
            want_part(1, 0, 0),
            features::RANGES | features::PARTS,
            "0 bytes",
        ),
        (
            want_part(1, 0, 1),
            features::RANGES,
            "WantPart needs the parts feature",
        ),
    ] {
        let (mut m, now) = source_on_demand(features);
        m.handle_control(now, msg);
        m.handle_timeout(now + Timing::default().report_wait);
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        let e = protocol_failure(events);
        assert!(e.contains(says), "{says}: {e}");
    }
    // Only in a request-driven session.
    let (mut m, now) = source_with(features::RANGES | features::PARTS);
    while m.poll_event().is_some() {}
    m.handle_control(now, want_part(1, 0, 1));
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("outside a request-driven session"), "{e}");
}

#[test]
fn a_sink_counts_parts_asked_for_and_drops_a_second_copy() {
    let (mut m, now) = sink_with(features::RANGES | features::PARTS);
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    while m.poll_event().is_some() {}
    m.ready_on_demand(now, 8);
    m.stream_joined(now, 0);
    while m.poll_transmit().is_some() {}
    let r = PartRange {
        offset: 100,
        len: 50,
    };
    let part = Part {
        chunk: 3,
        offset: 100,
        len: 50,
    };
    m.want_parts(now, &[part]);
    assert_eq!(
        m.poll_transmit(),
        Some(Control::WantPart(WantParts { parts: vec![part] }))
    );
    assert_eq!(m.outstanding(), 1);
    // Another range of the chunk was not asked for; the one asked for is written once.
    let other = PartRange { offset: 0, len: 50 };
    assert_eq!(m.arrived_part(now, 0, 3, other), Arrival::Duplicate);
    assert_eq!(m.arrived_part(now, 0, 3, r), Arrival::Write);
    assert_eq!(m.outstanding(), 1, "being written");
    m.part_written(now);
    assert_eq!(m.outstanding(), 0);
    assert_eq!(
        m.arrived_part(now, 0, 3, r),
        Arrival::Duplicate,
        "sent again"
    );
    // Every frame is acknowledged.
    let acks = std::iter::from_fn(|| m.poll_command()).count();
    assert_eq!(acks, 3);
    // Without the feature, asking for a part fails the session.
    let (mut m, now) = sink_with(features::RANGES);
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    while m.poll_event().is_some() {}
    m.ready_on_demand(now, 8);
    m.want_parts(now, &[part]);
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("parts feature"), "{e}");
}

/// The sink of a `LINKS` session given `sparse` before `ManifestEnd` (manifest: a
/// directory, entry 0, and two files, 1 and 2).
fn sink_told_sparse(
    features: u64,
    sparse: Vec<u32>,
) -> Vec<SinkEvent<dmover_proto::session::testkit::TestError>> {
    let (mut m, now) = sink_with(features);
    m.handle_control(
        now,
        Control::Sparse(dmover_proto::control::SparseFiles { entries: sparse }),
    );
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    m.handle_timeout(now + Timing::default().report_wait);
    std::iter::from_fn(|| m.poll_event()).collect()
}

#[test]
fn a_sparse_file_list_reaches_the_sink_before_the_manifest() {
    let events = sink_told_sparse(features::LINKS, vec![1, 2]);
    let n = events.len();
    assert!(
        matches!(&events[n - 2], SinkEvent::Sparse(s) if *s == [1, 2]),
        "{events:?}"
    );
    assert!(matches!(&events[n - 1], SinkEvent::Manifest(e) if e.len() == 3));
    // A directory, an entry out of range, a list out of order: refused.
    for bad in [vec![0], vec![3], vec![2, 1], vec![1, 1]] {
        let e = protocol_failure(sink_told_sparse(features::LINKS, bad.clone()));
        assert!(e.contains("sparse file list"), "{bad:?}: {e}");
    }
    // Without the feature the list is a protocol error.
    let e = protocol_failure(sink_told_sparse(0, vec![1]));
    assert!(e.contains("Sparse needs the hard links feature"), "{e}");

    // A source in a session without the feature sends no list; with it, one.
    for (f, sent) in [(0, false), (features::LINKS, true)] {
        let now = Instant::now();
        let mut m = SourceSession::<dmover_proto::session::testkit::TestError>::accept(
            now,
            "peer",
            Timing::default(),
            now + HOUR,
        );
        m.grant(now, info(f));
        m.handle_control(now, Control::Options(options()));
        while m.poll_transmit().is_some() {}
        let entries = manifest(2);
        m.push_manifest(&entries);
        m.sparse_files(&[2]);
        m.end_manifest(totals(&entries), ChunkSet::all(8));
        let msgs: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        let names: Vec<_> = msgs.iter().map(|c| c.name()).collect();
        assert_eq!(names.contains(&"Sparse"), sent, "{names:?}");
        if sent {
            let i = names.iter().position(|&n| n == "Sparse").unwrap();
            assert_eq!(names[i + 1], "ManifestEnd", "{names:?}");
        }
    }
}

fn xattr(name: &[u8], value: &[u8]) -> dmover_proto::manifest::Xattr {
    dmover_proto::manifest::Xattr {
        name: name.to_vec(),
        value: value.to_vec(),
    }
}

fn meta_of(entry: u32, xattrs: Vec<dmover_proto::manifest::Xattr>) -> EntryMeta {
    EntryMeta {
        entry,
        uid: 1000 + entry,
        gid: 100,
        xattrs,
    }
}

/// A sink in a METADATA session whose manifest has ended.
fn meta_sink() -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
) {
    let (mut m, now) = sink_with(features::METADATA);
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    (m, now)
}

fn failure_after(
    mut m: SinkSession<dmover_proto::session::testkit::TestError>,
    now: Instant,
    msg: Control,
) -> String {
    m.handle_control(now, msg);
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let last = format!("{:?}", events.last().expect("an event"));
    assert!(last.starts_with("Failed("), "{events:?}");
    last
}

#[test]
fn the_sink_checks_metadata() {
    let part = |entries, last| Control::Meta(MetaPart { entries, last });
    // The manifest is prepared for only once the last part came.
    let (mut m, now) = meta_sink();
    assert!(!std::iter::from_fn(|| m.poll_event()).any(|e| matches!(e, SinkEvent::Manifest(_))));
    m.handle_control(
        now,
        part(vec![meta_of(1, vec![xattr(b"user.k", &[0, 255])])], false),
    );
    assert!(m.poll_event().is_none());
    m.handle_control(now, part(vec![meta_of(2, vec![])], true));
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(&events[..], [SinkEvent::Meta(x), SinkEvent::Manifest(e)] if x.len() == 2 && e.len() == 3),
        "{events:?}"
    );
    // An entry beyond the manifest (3 entries).
    let (m, now) = meta_sink();
    let e = failure_after(m, now, part(vec![meta_of(3, vec![])], true));
    assert!(e.contains("metadata of entry 3 of a manifest of 3"), "{e}");
    // A value over 64 KiB, a name over 255 bytes, too many attributes.
    let (m, now) = meta_sink();
    let big = vec![7u8; (64 << 10) + 1];
    let e = failure_after(
        m,
        now,
        part(vec![meta_of(1, vec![xattr(b"user.big", &big)])], true),
    );
    assert!(e.contains("extended attribute value"), "{e}");
    let (m, now) = meta_sink();
    let long = [b"user.".as_slice(), &[b'n'; 251]].concat();
    let e = failure_after(
        m,
        now,
        part(vec![meta_of(1, vec![xattr(&long, b"")])], true),
    );
    assert!(e.contains("name of 256 bytes"), "{e}");
    let (m, now) = meta_sink();
    let many = (0..129)
        .map(|i| xattr(format!("user.{i}").as_bytes(), b""))
        .collect();
    let e = failure_after(m, now, part(vec![meta_of(1, many)], true));
    assert!(e.contains("extended attributes of an entry"), "{e}");
    // Before the manifest ended: out of order.
    let (m, now) = sink_with(features::METADATA);
    let e = failure_after(m, now, part(vec![], true));
    assert!(e.contains("Unexpected"), "{e}");
    // In a session without the feature: a protocol error.
    let (mut m, now) = sink_with(features::TUNING);
    m.handle_control(
        now,
        Control::ManifestEnd(ManifestEnd {
            totals: totals(&manifest(2)),
        }),
    );
    let e = failure_after(m, now, part(vec![], true));
    assert!(e.contains("Meta needs the metadata feature"), "{e}");
}

/// A sink in a growing session (with `CONTINUOUS` and `METADATA`) whose first part,
/// the root and two files of `manifest(3)`, is checked; the third file is the next
/// part, already listed.
fn continuous_sink() -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
    Vec<dmover_proto::manifest::Entry>,
) {
    let all = manifest(3);
    let (mut m, now) =
        granted_sink(features::GROWING_MANIFEST | features::CONTINUOUS | features::METADATA);
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: all[..3].to_vec(),
        }),
    );
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&all[..3]),
            chunks: 2,
            last: false,
        }),
    );
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(events.last(), Some(SinkEvent::Manifest(e)) if e.len() == 3),
        "{events:?}"
    );
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: all[3..].to_vec(),
        }),
    );
    (m, now, all)
}

/// Continuous mode at the sink: a later part's metadata comes with its `Grown` event,
/// newer directory times of checked parts are handed on, and either naming an entry
/// not (yet) there fails the session.
#[test]
fn the_sink_checks_continuous_mode_messages() {
    use dmover_proto::control::TimesPart;
    use dmover_proto::manifest::Mtime;
    let (mut m, now, all) = continuous_sink();
    // The root's and the new file's metadata, then the part's end.
    m.handle_control(
        now,
        Control::Meta(MetaPart {
            entries: vec![meta_of(0, vec![]), meta_of(3, vec![xattr(b"user.k", b"v")])],
            last: false,
        }),
    );
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&all),
            chunks: 3,
            last: false,
        }),
    );
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(&events[..], [SinkEvent::Grown { entries, chunks, meta, .. }]
            if entries.len() == 1 && *chunks == (2..3) && meta.len() == 2 && meta[1].entry == 3),
        "{events:?}"
    );
    let t = Mtime { sec: 7, nsec: 1 };
    m.handle_control(
        now,
        Control::Times(TimesPart {
            entries: vec![(0, t)],
        }),
    );
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(&events[..], [SinkEvent::Times(v)] if *v == [(0, t)]),
        "{events:?}"
    );
    // Times of an entry of the part still coming (3), or beyond: refused.
    let (m, now, _) = continuous_sink();
    let e = failure_after(
        m,
        now,
        Control::Times(TimesPart {
            entries: vec![(3, t)],
        }),
    );
    assert!(e.contains("modification time for entry 3 of 3"), "{e}");
    // Metadata of an entry beyond the manifest so far (4 entries): malformed.
    let (m, now, _) = continuous_sink();
    let e = failure_after(
        m,
        now,
        Control::Meta(MetaPart {
            entries: vec![meta_of(4, vec![])],
            last: false,
        }),
    );
    assert!(e.contains("Malformed") || e.contains("entry"), "{e}");
    // Without the feature, `Times` and `Stored` are protocol violations.
    let (m, now) = sink_with(features::GROWING_MANIFEST);
    let e = failure_after(m, now, Control::Times(TimesPart { entries: vec![] }));
    assert!(e.contains("continuous"), "{e}");
}

/// A sink in a streamed session with `features`, the first part of `manifest(3)`
/// (the root and two files) listed with `sparse` before its `Grow`; its events.
fn live_walk_sink(
    features: u64,
    sparse: Vec<u32>,
) -> (
    SinkSession<dmover_proto::session::testkit::TestError>,
    Instant,
    Vec<dmover_proto::manifest::Entry>,
    Vec<SinkEvent<dmover_proto::session::testkit::TestError>>,
) {
    let all = manifest(3);
    let (mut m, now) = granted_sink(features);
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: all[..3].to_vec(),
        }),
    );
    if !sparse.is_empty() {
        m.handle_control(
            now,
            Control::Sparse(dmover_proto::control::SparseFiles { entries: sparse }),
        );
    }
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&all[..3]),
            chunks: 2,
            last: false,
        }),
    );
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    m.handle_control(
        now,
        Control::Manifest(ManifestPart {
            entries: all[3..].to_vec(),
        }),
    );
    (m, now, all, events)
}

/// A live walk's parts (feature `WALKING`): the first part's list of files with
/// holes comes before its manifest, a later part's with its `Grown` event; a list
/// naming an entry of an earlier part, or a later part's list without the feature,
/// fails the session.
#[test]
fn the_sink_takes_a_live_walks_lists_of_sparse_files() {
    let live =
        features::GROWING_MANIFEST | features::STREAMED | features::LINKS | features::WALKING;
    let (mut m, now, all, events) = live_walk_sink(live, vec![2]);
    assert!(
        matches!(&events[..], [SinkEvent::Options(_), SinkEvent::Sparse(s), SinkEvent::Manifest(e)]
            if *s == [2] && e.len() == 3),
        "{events:?}"
    );
    m.handle_control(
        now,
        Control::Sparse(dmover_proto::control::SparseFiles { entries: vec![3] }),
    );
    m.handle_control(
        now,
        Control::Grow(Growth {
            totals: totals(&all),
            chunks: 3,
            last: false,
        }),
    );
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(&events[..], [SinkEvent::Grown { entries, chunks, sparse, .. }]
            if entries.len() == 1 && *chunks == (2..3) && *sparse == [3]),
        "{events:?}"
    );
    // A later part's list naming a file of the first part.
    let (mut m, now, all, _) = live_walk_sink(live, vec![]);
    m.handle_control(
        now,
        Control::Sparse(dmover_proto::control::SparseFiles { entries: vec![1] }),
    );
    let e = failure_after(
        m,
        now,
        Control::Grow(Growth {
            totals: totals(&all),
            chunks: 3,
            last: false,
        }),
    );
    assert!(e.contains("earlier part"), "{e}");
    // A first part's list naming the root (a directory).
    let (mut m, now, _, _) = live_walk_sink(live, vec![0]);
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let last = format!("{:?}", events.last());
    assert!(last.contains("not a regular file"), "{events:?}");
    // Without the feature, a later part has no list.
    let (m, now, _, _) = live_walk_sink(live & !features::WALKING, vec![]);
    let e = failure_after(
        m,
        now,
        Control::Sparse(dmover_proto::control::SparseFiles { entries: vec![3] }),
    );
    assert!(e.contains("Sparse") || e.contains("sparse"), "{e}");
}

/// A dialer's `Dial` asking for `op` with `features`.
fn dial_of(op: dmover_proto::control::Op, features: u64) -> dmover_proto::session::Dial {
    dmover_proto::session::Dial {
        hello: dmover_proto::control::Hello {
            software: "t".into(),
            nonce: [0; 32],
        },
        auth: dmover_proto::control::Auth {
            user: String::new(),
            credential: dmover_proto::control::Credential::None,
        },
        open: dmover_proto::control::Open {
            op,
            streams: 2,
            chunk_size: 0,
            checksum: true,
            direct_io: dmover_proto::control::DirectIo::Never,
            protection: dmover_proto::control::DataProtection::Authenticated,
            features,
        },
        options: options(),
        server_proof: None,
        limits: dmover_proto::session::testkit::dialer_limits(),
    }
}

/// Takes a dialer's machine through `Welcome` and `AuthOk`.
fn welcomed(now: Instant, handle: &mut dyn FnMut(Instant, Control)) {
    handle(
        now,
        Control::Welcome(dmover_proto::control::Welcome {
            software: "t".into(),
            nonce: [0; 32],
            auth: dmover_proto::control::AuthMethod::None,
        }),
    );
    handle(
        now,
        Control::AuthOk(dmover_proto::control::AuthOk { proof: None }),
    );
}

#[test]
fn a_dialers_limits_go_in_its_first_flight_and_the_answer_is_handed_on() {
    // Protocol 6: an acceptor grants every base feature offered, so the dialer's
    // limits go with its `Open`, not a round trip later behind `Session`.
    let now = Instant::now();
    let pull = dmover_proto::control::Op::Pull {
        sources: vec![b"s".to_vec()],
    };
    for offered in [features::METADATA, features::METADATA | features::LIMITS] {
        let mut m = SinkSession::<dmover_proto::session::testkit::TestError>::dial(
            now,
            "peer",
            Timing::default(),
            Limits::default(),
            dial_of(pull.clone(), offered),
        );
        let first: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        let names: Vec<_> = first.iter().map(Control::name).collect();
        if offered & features::LIMITS == 0 {
            assert_eq!(names, ["Hello", "Auth", "Open", "Options"]);
        } else {
            assert_eq!(names, ["Hello", "Auth", "Open", "Options", "Limits"]);
            assert_eq!(
                first[4],
                Control::Limits(dmover_proto::session::testkit::dialer_limits())
            );
        }
        welcomed(now, &mut |t, c| m.handle_control(t, c));
        m.handle_control(now, Control::Session(info(offered)));
        // Not again once the session is open.
        let sent: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        assert!(
            !sent.iter().any(|c| matches!(c, Control::Limits(_))),
            "{sent:?}"
        );
        // An answer the dialer's machine hands on.
        if offered & features::LIMITS != 0 {
            let answer = dmover_proto::control::SessionLimits {
                bwlimit: 7,
                congestion: "cubic".into(),
                refused: "not available".into(),
            };
            m.handle_control(now, Control::Limits(answer.clone()));
            let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, SinkEvent::Limits(l) if *l == answer)),
                "{events:?}"
            );
        }
    }
}

#[test]
fn a_session_without_an_offered_base_feature_fails_the_dialer() {
    // The dialer sent that feature's messages already; a session without it is
    // not one a version 6 acceptor grants.
    let now = Instant::now();
    let pull = dmover_proto::control::Op::Pull {
        sources: vec![b"s".to_vec()],
    };
    let mut m = SinkSession::<dmover_proto::session::testkit::TestError>::dial(
        now,
        "peer",
        Timing::default(),
        Limits::default(),
        dial_of(pull, features::METADATA | features::LIMITS),
    );
    while m.poll_transmit().is_some() {}
    welcomed(now, &mut |t, c| m.handle_control(t, c));
    m.handle_control(now, Control::Session(info(features::METADATA)));
    m.handle_timeout(now + Timing::default().report_wait);
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    let e = protocol_failure(events);
    assert!(e.contains("without the limits feature"), "{e}");
}

#[test]
fn a_pushs_first_flight_carries_its_metadata_and_a_streamed_first_part() {
    // Protocol 6: the dialing source knows the base features it offered are
    // granted, so `Meta` follows `ManifestEnd` (and a streamed manifest's first
    // `Grow` its entries) in the first flight; the sink's `Go` needs no round trip
    // more than `Session`.
    let now = Instant::now();
    let push = dmover_proto::control::Op::Push {
        dest: b"d".to_vec(),
    };
    let entries = manifest(1);
    let meta = vec![EntryMeta {
        entry: 0,
        uid: 1,
        gid: 2,
        xattrs: Vec::new(),
    }];
    let totals = totals(&entries);
    for offered in [0, features::METADATA] {
        let mut m = SourceSession::<dmover_proto::session::testkit::TestError>::dial(
            now,
            "peer",
            Timing::default(),
            dial_of(push.clone(), offered),
        );
        m.push_manifest(&entries);
        m.push_meta(meta.clone());
        m.end_manifest(totals, ChunkSet::all(1));
        let first: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        let names: Vec<_> = first.iter().map(Control::name).collect();
        if offered == 0 {
            assert_eq!(
                names,
                [
                    "Hello",
                    "Auth",
                    "Open",
                    "Options",
                    "Manifest",
                    "ManifestEnd"
                ]
            );
        } else {
            assert_eq!(
                names,
                [
                    "Hello",
                    "Auth",
                    "Open",
                    "Options",
                    "Manifest",
                    "ManifestEnd",
                    "Meta"
                ]
            );
        }
        welcomed(now, &mut |t, c| m.handle_control(t, c));
        m.handle_control(now, Control::Session(info(offered)));
        let later: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        assert!(
            !later.iter().any(|c| matches!(c, Control::Meta(_))),
            "{later:?}"
        );
    }
    // A streamed manifest: the first part ends (its metadata before it) before
    // `Session`.
    let streamed = features::GROWING_MANIFEST | features::STREAMED | features::METADATA;
    let mut m = SourceSession::<dmover_proto::session::testkit::TestError>::dial(
        now,
        "peer",
        Timing::default(),
        dial_of(push, streamed),
    );
    m.push_manifest(&entries);
    m.grow_meta(meta);
    m.grow_manifest(now, totals, 1, false);
    let first: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
    let names: Vec<_> = first.iter().map(Control::name).collect();
    assert_eq!(
        names,
        [
            "Hello", "Auth", "Open", "Options", "Manifest", "Meta", "Grow"
        ]
    );
    assert_eq!(m.state(), dmover_proto::session::State::Running);
}

#[test]
fn an_acceptor_answers_limits_once_and_refuses_bad_ones() {
    let ask = dmover_proto::session::testkit::dialer_limits();
    let answer = dmover_proto::session::testkit::acceptor_limits(&ask);
    // Without the feature: a protocol violation.
    let (mut m, now) = source_with(features::RANGES);
    while m.poll_event().is_some() {}
    m.handle_control(now, Control::Limits(ask.clone()));
    m.handle_timeout(now + Timing::default().report_wait);
    let e = protocol_failure(std::iter::from_fn(|| m.poll_event()).collect());
    assert!(e.contains("Limits needs the limits feature"), "{e}");
    // With it: an answer only once the dialer's came, and only once.
    let (mut m, now) = source_with(features::LIMITS);
    while m.poll_event().is_some() {}
    while m.poll_transmit().is_some() {}
    m.limits(answer.clone());
    assert_eq!(m.poll_transmit(), None, "nothing asked yet");
    m.handle_control(now, Control::Limits(ask.clone()));
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert!(
        matches!(&events[..], [dmover_proto::session::SourceEvent::Limits(l)] if *l == ask),
        "{events:?}"
    );
    m.limits(answer.clone());
    m.limits(answer.clone());
    let sent: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
    assert_eq!(sent, [Control::Limits(answer.clone())]);
    // A second one from the dialer breaks the protocol.
    m.handle_control(now, Control::Limits(ask.clone()));
    m.handle_timeout(now + Timing::default().report_wait);
    let e = protocol_failure(std::iter::from_fn(|| m.poll_event()).collect());
    assert!(e.contains("Limits came twice"), "{e}");
    // So does a text too long to log or show.
    let (mut m, now) = sink_with(features::LIMITS);
    while m.poll_event().is_some() {}
    let long = dmover_proto::control::SessionLimits {
        congestion: "x".repeat(dmover_proto::control::MAX_LIMITS_TEXT + 1),
        ..ask
    };
    m.handle_control(now, Control::Limits(long));
    m.handle_timeout(now + Timing::default().report_wait);
    let e = protocol_failure(std::iter::from_fn(|| m.poll_event()).collect());
    assert!(e.contains("257-byte congestion control"), "{e}");
}
