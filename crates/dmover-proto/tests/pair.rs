//! Whole sessions between a source and a sink machine wired together in memory
//! (`dmover_proto::session::sim`), on a simulated clock: every rule of the session
//! protocol, faults both ways, and randomized schedules. No sockets, no wall clock:
//! each test runs in milliseconds and always the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use dmover_proto::control::ErrorCode;
use dmover_proto::session::sim::{Config, Fault, Outcome, Report, Sim};
use dmover_proto::session::{Limits, SessionError, Timing};
use proptest::prelude::*;

const HOUR: Duration = Duration::from_secs(3600);

fn run(cfg: Config) -> Report {
    Sim::new(cfg).run(HOUR)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every expected chunk was written exactly once, nothing else.
fn assert_exactly_once(r: &Report) {
    let (missing, extra) = r.write_errors();
    assert!(missing.is_empty(), "chunks never written: {missing:?}");
    assert!(
        extra.is_empty(),
        "chunks written twice or unexpected: {extra:?}"
    );
}

fn assert_finished(r: &Report) {
    assert!(r.finished(), "source {:?}, sink {:?}", r.source, r.sink);
    assert_exactly_once(r);
    let report = r
        .send_report
        .as_ref()
        .expect("the sink has the source's report");
    // The report goes once every chunk is written into a stream: a stream lost after
    // that is counted by the source alone.
    assert!(report.streams_lost <= r.source_stats.streams_lost);
    assert!(report.chunks_resent <= r.source_stats.chunks_resent);
    if report.streams_lost == r.source_stats.streams_lost {
        assert_eq!(report.chunks_resent, r.source_stats.chunks_resent);
    }
    assert!(r.summary.is_some(), "the source has the sink's summary");
}

fn failed(o: &Outcome) -> &SessionError<dmover_proto::session::sim::SimError> {
    match o {
        Outcome::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_push_and_a_pull_move_every_chunk_once() {
    for push in [true, false] {
        let r = run(Config {
            push,
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.reads, 64, "push {push}: each chunk read once");
        assert_eq!(r.source_stats.streams_lost, 0);
        // The dialer's whole first flight goes before any answer.
        let first: Vec<_> = r.messages.0.iter().take(4).copied().collect();
        assert_eq!(first, ["Hello", "Auth", "Open", "Options"]);
        let answers: Vec<_> = r.messages.1.iter().take(3).copied().collect();
        assert_eq!(answers, ["Welcome", "AuthOk", "Session"]);
    }
}

/// One chunk, 50 ms each way, nothing else slow.
fn one_chunk(push: bool) -> Config {
    Config {
        push,
        chunks: 1,
        latency: ms(50),
        read: Duration::ZERO,
        send: Duration::ZERO,
        write: Duration::ZERO,
        ..Config::default()
    }
}

#[test]
fn the_report_waits_for_the_acknowledgements_only_when_files_may_be_skipped() {
    // One chunk, 50 ms each way. The report goes with the chunk, so a pull ends when
    // the chunk arrives (200 ms). With `continue_on_error` a chunk read again after a
    // lost stream could find its file unreadable, which the report must list, so it
    // waits for the acknowledgement: a round trip more. A push's end is the sink's
    // `Done` either way.
    for push in [true, false] {
        let fast = run(one_chunk(push));
        let slow = run(Config {
            continue_on_error: true,
            ..one_chunk(push)
        });
        assert_finished(&fast);
        assert_finished(&slow);
        let end = |r: &Report| if push { r.source_at } else { r.sink_at };
        if push {
            assert_eq!(end(&fast), end(&slow));
        } else {
            assert_eq!(end(&fast), Some(ms(200)));
            assert_eq!(end(&slow), Some(ms(300)));
        }
    }
}

#[test]
fn a_small_push_costs_three_round_trips() {
    // One chunk, 50 ms each way, nothing else slow: the first flight and its answer
    // (1 RTT, the manifest rides along), Go (the sink says it after Session + the
    // manifest, which it has after 1 one-way trip; Go reaches the source at 1.5 RTT),
    // the chunk (on streams joined meanwhile) and its acknowledgement and the sink's
    // Done: under 3 RTT in all.
    let r = run(one_chunk(true));
    assert_finished(&r);
    let t = r.source_at.expect("ended");
    assert!(t <= ms(300), "took {t:?}");
    assert!(t >= ms(200), "faster than light: {t:?}");
}

#[test]
fn an_early_push_costs_one_round_trip() {
    // As above, with early data (protocol version 8): the chunk follows the first
    // flight on a stream joined at once, waits at the acceptor for the session and the
    // sink's `Go`, and its acknowledgement and the sink's `Done` come back after one
    // round trip.
    let r = run(Config {
        early: true,
        ..one_chunk(true)
    });
    assert_finished(&r);
    let t = r.source_at.expect("ended");
    assert!(t <= ms(150), "took {t:?}");
    assert!(t >= ms(100), "faster than light: {t:?}");
    // The sink wrote the chunk as soon as it had the session and the manifest: at the
    // first flight's arrival, one way.
    assert_eq!(r.write_times, [ms(50)]);
    // Nothing changed on the wire but the order in time: the acceptor still answers
    // with the session and says Go.
    let answers: Vec<_> = r.messages.1.iter().take(4).copied().collect();
    assert_eq!(answers, ["Welcome", "AuthOk", "Session", "Go"]);
}

#[test]
fn an_early_pull_saves_a_round_trip() {
    // One chunk, 50 ms each way: the sink's streams join with its first flight, and
    // the source sends as soon as it has the options (no resume), a round trip before
    // the sink's Go would have reached it.
    let cfg = one_chunk(false);
    let late = run(cfg.clone());
    let r = run(Config { early: true, ..cfg });
    assert_finished(&late);
    assert_finished(&r);
    // The chunk came with the session and manifest, one round trip in, and was
    // written as the sink said Go (without early data: a round trip later).
    assert_eq!(r.write_times, [ms(100)]);
    assert_eq!(late.write_times, [ms(200)]);
    // The report goes once the chunk is written into its stream, not a round trip
    // later with its acknowledgement: without early data it comes with the chunk, and
    // the pull ends at 200 ms (300 ms when it waited for the acknowledgement). With
    // early data it waits for the sink's Go to reach the source (a sink takes nothing
    // of the session proper before its Go), and comes at 200 ms too.
    assert_eq!(late.sink_at, Some(ms(200)));
    assert_eq!(r.sink_at, Some(ms(200)));
    let answers: Vec<_> = r.messages.1.iter().take(4).copied().collect();
    assert_eq!(answers, ["Welcome", "AuthOk", "Session", "Manifest"]);
    assert!(r.messages.0.contains(&"Go"));
}

#[test]
fn early_transfers_move_every_chunk_once_whatever_they_use() {
    // Many chunks and streams, a growing manifest, tuning (whose decisions wait for
    // the sink's Go), a broken stream: as without early data; pushes and pulls.
    for (push, features, parts, active, breaks) in [
        (false, 0, 0, None, false),
        (false, features::MACHINES, 3, None, false),
        (false, features::TUNING, 0, Some(2), false),
        (false, features::MACHINES, 0, Some(1), true),
    ]
    .into_iter()
    .chain(
        [
            (0, 0, None, false),
            (features::MACHINES, 3, None, false),
            (features::TUNING, 0, Some(2), false),
            (features::MACHINES, 0, Some(1), true),
        ]
        .map(|(f, p, a, b)| (true, f, p, a, b)),
    ) {
        let r = run(Config {
            push,
            features,
            parts,
            part_every: ms(2),
            active,
            early: true,
            prepare: ms(3),
            faults: if breaks {
                vec![Fault::Break {
                    stream: 0,
                    at: ms(25),
                }]
            } else {
                Vec::new()
            },
            ..Config::default()
        });
        assert_finished(&r);
        if let Some(n) = active {
            assert_eq!(r.tuned.len(), 1, "{features:#x}");
            assert_eq!(r.tuned[0].streams, n);
        }
        let late = run(Config {
            push,
            features,
            parts,
            part_every: ms(2),
            active,
            prepare: ms(3),
            ..Config::default()
        });
        assert!(
            r.source_at.unwrap() < late.source_at.unwrap(),
            "{features:#x}: early {:?}, not early {:?}",
            r.source_at,
            late.source_at
        );
    }
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
        let mut s: SourceSession<dmover_proto::session::sim::SimError> =
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
        let mut s: SourceSession<dmover_proto::session::sim::SimError> = SourceSession::dial_early(
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
        let mut s: SinkSession<dmover_proto::session::sim::SimError> = SinkSession::dial_early(
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

#[test]
fn an_empty_dataset_finishes() {
    // (An early source is drained at once: its report waits for the sink's Go.)
    for (push, early) in [(true, false), (false, false), (true, true), (false, true)] {
        let r = run(Config {
            push,
            chunks: 0,
            files: 0,
            early,
            // The sink takes a moment to prepare (as a real one does).
            prepare: ms(5),
            ..Config::default()
        });
        assert_finished(&r);
        assert!(r.writes.is_empty());
        let sent = &r.messages.1;
        let go = sent.iter().position(|m| *m == "Go");
        let report = r.messages.0.iter().position(|m| *m == "SendReport");
        if push {
            assert!(go.is_some() && report.is_some(), "{:?}", r.messages);
        }
        if !push && early {
            // The sink dialed: its Go goes the other way, before the source's report.
            let go = r.messages.0.iter().position(|m| *m == "Go");
            let report = r.messages.1.iter().position(|m| *m == "SendReport");
            assert!(go.is_some() && report.is_some(), "{:?}", r.messages);
        }
    }
}

#[test]
fn one_stream_and_a_window_of_one_still_finish() {
    let r = run(Config {
        streams: 1,
        window: 1,
        buffers: 1,
        chunks: 40,
        ..Config::default()
    });
    assert_finished(&r);
}

#[test]
fn a_broken_stream_is_replaced_by_the_others() {
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 400,
            faults: vec![Fault::Break {
                stream: 1,
                at: ms(60),
            }],
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.source_stats.streams_lost, 1, "push {push}");
        assert!(
            r.source_stats.chunks_resent > 0,
            "push {push}: chunks in flight resent"
        );
        assert!(r.reads > 400, "push {push}: resent chunks are read again");
    }
}

#[test]
fn every_stream_broken_fails_both_sides_with_the_cause() {
    let faults = (0..4)
        .map(|s| Fault::Break {
            stream: s,
            at: ms(60),
        })
        .collect();
    let r = run(Config {
        chunks: 400,
        faults,
        ..Config::default()
    });
    let (src, sink) = (failed(&r.source), failed(&r.sink));
    assert!(
        matches!(
            src,
            SessionError::Stream { .. } | SessionError::Remote { .. }
        ),
        "{src:?}"
    );
    assert!(
        matches!(
            sink,
            SessionError::Stream { .. } | SessionError::Remote { .. }
        ),
        "{sink:?}"
    );
    // Neither waits for a timeout: the report wait at most.
    assert!(r.source_at.unwrap() < ms(60) + Timing::default().report_wait + ms(100));
    assert!(r.sink_at.unwrap() < ms(60) + Timing::default().report_wait + ms(100));
}

#[test]
fn a_stuck_stream_among_moving_ones_is_lost_before_the_stall_limit() {
    // Stream 2 goes silent early in a long transfer (50 ms per chunk and stream):
    // the others keep acknowledging, so it is lost once it has made no progress for
    // `stuck` (20 s), not after the whole stall limit (120 s), and its chunks go on
    // the others.
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 3000,
            send: ms(50),
            faults: vec![Fault::Silence {
                stream: 2,
                at: ms(500),
            }],
            ..Config::default()
        });
        assert_finished(&r);
        assert_exactly_once(&r);
        assert_eq!(r.source_stats.streams_lost, 1, "push {push}");
        assert!(r.source_stats.chunks_resent > 0);
        let t = r.source_at.unwrap();
        assert!(
            t >= Timing::default().stuck && t < Duration::from_secs(60),
            "push {push}: took {t:?}"
        );
    }
}

#[test]
fn slow_streams_that_all_move_are_not_stuck() {
    // A low bandwidth limit with large chunks: every stream takes 30 s per chunk, far
    // over `stuck`, and acknowledges at about the time the others do. None is lost.
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 24,
            send: Duration::from_secs(30),
            ..Config::default()
        });
        assert_finished(&r);
        assert_exactly_once(&r);
        assert_eq!(r.source_stats.streams_lost, 0, "push {push}");
    }
}

/// A stall limit (and idle limit) of 5 s, for tests that wait one out.
fn five_second_stall() -> Timing {
    Timing {
        stall: Duration::from_secs(5),
        idle: Some(Duration::from_secs(5)),
        ..Timing::default()
    }
}

#[test]
fn a_silent_stream_is_lost_after_the_stall_limit_and_its_chunks_resent() {
    let timing = five_second_stall();
    // At 88 ms chunks are on their way on stream 2 (it carries 8 frames, the sink
    // misses what follows); at 80 ms only their acknowledgements would be (see below).
    let r = run(Config {
        chunks: 400,
        timing,
        faults: vec![Fault::Silence {
            stream: 2,
            at: ms(88),
        }],
        ..Config::default()
    });
    assert_finished(&r);
    assert_eq!(r.source_stats.streams_lost, 1);
    assert!(r.source_stats.chunks_resent > 0);
    let t = r.source_at.unwrap();
    assert!(
        t >= Duration::from_secs(5) && t < Duration::from_secs(7),
        "took {t:?}"
    );
}

#[test]
fn a_stream_silent_after_its_chunks_arrived_does_not_hold_up_the_end() {
    // Stream 2 goes silent after its last chunks arrived: only their acknowledgements
    // are lost. The source reported once every chunk was written into a stream, and
    // the sink's `Done` says it holds them all, so the session ends without waiting
    // out the stall limit and sending anything again.
    let timing = five_second_stall();
    // At these times (a pull starts a little sooner) stream 2's last chunks have
    // arrived and their acknowledgements are on their way; a few milliseconds later
    // the next chunks would be, and the sink would miss them.
    for (push, at) in [(true, 80), (false, 72)] {
        let r = run(Config {
            push,
            chunks: 400,
            timing,
            faults: vec![Fault::Silence {
                stream: 2,
                at: ms(at),
            }],
            ..Config::default()
        });
        assert_finished(&r);
        assert_exactly_once(&r);
        assert_eq!(r.source_stats.streams_lost, 0, "push {push}");
        assert!(r.frames[&2] > 0, "push {push}: {:?}", r.frames);
        let t = r.source_at.unwrap();
        assert!(t < Duration::from_secs(1), "push {push}: took {t:?}");
    }
}

#[test]
fn a_sink_that_closes_its_streams_with_acknowledgements_unsent_ends_the_session() {
    // The sink has the report with the last chunks, says `Done` and closes its
    // streams while its last acknowledgements are still held back, and the control
    // connection is a little slower than the streams: the source sees the streams end
    // before `Done` arrives, and must neither fail (no stream left, chunks
    // unacknowledged) nor count them as lost.
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 40,
            latency: ms(10),
            ack_delay: ms(30),
            control_delay: ms(5),
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.source_stats.streams_lost, 0, "push {push}");
        let (t, sink) = (r.source_at.unwrap(), r.sink_at.unwrap());
        assert!(
            t < sink + ms(100),
            "push {push}: source {t:?}, sink {sink:?}"
        );
    }
}

#[test]
fn a_corrupt_stream_ends_the_session_on_both_sides() {
    let r = run(Config {
        chunks: 400,
        faults: vec![Fault::Corrupt {
            stream: 0,
            at: ms(60),
        }],
        ..Config::default()
    });
    let sink = failed(&r.sink);
    assert!(
        matches!(sink, SessionError::Stream { stream: 0, .. }),
        "{sink:?}"
    );
    assert_eq!(sink.code(), ErrorCode::Checksum);
    let src = failed(&r.source);
    assert!(
        matches!(
            src,
            SessionError::Remote {
                code: ErrorCode::Checksum,
                ..
            }
        ),
        "the source learns the sink's cause: {src:?}"
    );
    assert!(
        src.to_string().contains("record authentication failed"),
        "{src}"
    );
}

#[test]
fn a_silent_control_connection_fails_both_sides_in_bounded_time() {
    let timing = Timing {
        heartbeat: Duration::from_secs(1),
        stall: Duration::from_secs(600),
        idle: None,
        ..Timing::default()
    };
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 100_000,
            timing,
            faults: vec![Fault::ControlSilence { at: ms(100) }],
            ..Config::default()
        });
        for (o, at) in [(&r.source, r.source_at), (&r.sink, r.sink_at)] {
            let e = failed(o);
            assert!(
                matches!(e, SessionError::Silent { secs: 4, .. }),
                "push {push}: {e:?}"
            );
            assert!(e.to_string().contains("did not answer within 4 s"), "{e}");
            let at = at.unwrap();
            assert!(
                at <= ms(100) + timing.silence() + timing.heartbeat + timing.report_wait,
                "push {push}: ended at {at:?}"
            );
        }
    }
}

#[test]
fn a_broken_control_connection_fails_both_sides_at_once() {
    let r = run(Config {
        chunks: 10_000,
        faults: vec![Fault::ControlBreak { at: ms(100) }],
        ..Config::default()
    });
    assert!(matches!(failed(&r.source), SessionError::Local(_)));
    assert!(matches!(failed(&r.sink), SessionError::Local(_)));
    assert!(r.source_at.unwrap() <= ms(100));
}

#[test]
fn a_sink_write_error_reaches_the_source_as_the_cause() {
    for push in [true, false] {
        let r = run(Config {
            push,
            faults: vec![Fault::WriteError { chunk: 10 }],
            ..Config::default()
        });
        let sink = failed(&r.sink);
        assert!(matches!(sink, SessionError::Local(_)), "{sink:?}");
        let src = failed(&r.source);
        assert!(
            matches!(
                src,
                SessionError::Remote {
                    code: ErrorCode::Io,
                    ..
                }
            ),
            "push {push}: {src:?}"
        );
        assert!(src.to_string().contains("No space left on device"), "{src}");
    }
}

#[test]
fn a_source_read_error_reaches_the_sink_as_the_cause() {
    for push in [true, false] {
        let r = run(Config {
            push,
            faults: vec![Fault::ReadError { chunk: 5 }],
            ..Config::default()
        });
        assert!(matches!(failed(&r.source), SessionError::Local(_)));
        let sink = failed(&r.sink);
        assert!(
            matches!(
                sink,
                SessionError::Remote {
                    code: ErrorCode::Io,
                    ..
                }
            ),
            "push {push}: {sink:?}"
        );
        assert!(
            !r.writes.contains_key(&5),
            "the chunk that failed is never written"
        );
    }
}

#[test]
fn a_refused_credential_fails_the_dialer_with_the_acceptors_reason() {
    for push in [true, false] {
        let r = run(Config {
            push,
            faults: vec![Fault::Refuse],
            ..Config::default()
        });
        let (dialer, acceptor) = if push {
            (&r.source, &r.sink)
        } else {
            (&r.sink, &r.source)
        };
        let d = failed(dialer);
        assert!(
            matches!(
                d,
                SessionError::Remote {
                    code: ErrorCode::Auth,
                    ..
                }
            ),
            "{d:?}"
        );
        assert!(matches!(failed(acceptor), SessionError::Local(_)));
        assert!(r.writes.is_empty());
    }
}

#[test]
fn a_stream_that_never_joins_fails_the_session_after_the_join_limit() {
    for push in [true, false] {
        let timing = Timing {
            join: Duration::from_secs(3),
            ..Timing::default()
        };
        let r = run(Config {
            push,
            timing,
            chunks: 100_000,
            faults: vec![Fault::NoJoin { stream: 3 }],
            ..Config::default()
        });
        let (dialer, acceptor) = if push {
            (&r.source, &r.sink)
        } else {
            (&r.sink, &r.source)
        };
        let a = failed(acceptor);
        assert!(
            matches!(
                a,
                SessionError::Joins {
                    joined: 3,
                    streams: 4,
                    ..
                }
            ),
            "{a:?}"
        );
        assert!(
            a.to_string().contains("opened 3 of 4 data streams in time"),
            "{a}"
        );
        assert!(matches!(failed(dialer), SessionError::Remote { .. }));
    }
}

#[test]
fn a_manifest_over_the_limit_is_refused_before_any_data() {
    for push in [true, false] {
        let r = run(Config {
            push,
            files: 20,
            limits: Limits {
                max_entries: 10,
                ..Limits::default()
            },
            ..Config::default()
        });
        let sink = failed(&r.sink);
        assert!(matches!(sink, SessionError::Limit(_)), "{sink:?}");
        assert_eq!(sink.code(), ErrorCode::Busy);
        assert!(matches!(
            failed(&r.source),
            SessionError::Remote {
                code: ErrorCode::Busy,
                ..
            }
        ));
        assert!(r.writes.is_empty());
        assert_eq!(r.reads, 0);
    }
}

#[test]
fn a_resume_sends_only_what_the_sink_lacks() {
    for push in [true, false] {
        let held: Vec<u64> = (0..64).filter(|k| k % 3 != 0).collect();
        let r = run(Config {
            push,
            held: held.clone(),
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.expected.len(), 64 - held.len() as u64);
        assert_eq!(r.reads, r.expected.len(), "push {push}");
        assert!(held.iter().all(|k| !r.writes.contains_key(k)));
        assert!(r.messages.0.contains(&"Have") || r.messages.1.contains(&"Have"));
    }
}

#[test]
fn a_resume_that_holds_everything_sends_nothing() {
    let r = run(Config {
        held: (0..64).collect(),
        ..Config::default()
    });
    assert_finished(&r);
    assert_eq!(r.reads, 0);
}

fn schedule() -> impl Strategy<Value = Config> {
    (
        any::<bool>(),
        1u16..6,
        0u64..150,
        0u64..80,
        (0u64..3000, 0u64..3000, 0u64..3000, 0u64..3000),
        (1usize..10, 1usize..8),
        proptest::collection::vec((0u16..6, 0u64..400), 0..4),
        proptest::collection::vec(0u64..150, 0..40),
        any::<bool>(),
    )
        .prop_map(
            |(
                push,
                streams,
                chunks,
                lat,
                (read, send, write, prepare),
                (buffers, window),
                breaks,
                held,
                early,
            )| {
                // Early data: a fresh transfer only.
                let held = if early { Vec::new() } else { held };
                // Break at most all streams but one, once they joined (a dialer's stream
                // that fails to join fails the session): the session must finish.
                let mut faults: Vec<Fault> = breaks
                    .into_iter()
                    .filter(|(s, _)| *s < streams)
                    .map(|(stream, at)| Fault::Break {
                        stream,
                        at: Duration::from_millis(4 * lat + 1 + at),
                    })
                    .collect();
                faults.sort_by_key(|f| match f {
                    Fault::Break { stream, .. } => *stream,
                    _ => 0,
                });
                faults.dedup_by_key(|f| match f {
                    Fault::Break { stream, .. } => *stream,
                    _ => 0,
                });
                faults.truncate(streams as usize - 1);
                Config {
                    push,
                    streams,
                    chunks,
                    held,
                    latency: Duration::from_millis(lat),
                    read: Duration::from_micros(read),
                    send: Duration::from_micros(send),
                    write: Duration::from_micros(write),
                    prepare: Duration::from_micros(prepare),
                    buffers,
                    window,
                    faults,
                    early,
                    ..Config::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// With at least one stream left, every schedule finishes, with every chunk
    /// written exactly once, well within the stall limit.
    #[test]
    fn any_schedule_with_a_stream_left_finishes(cfg in schedule()) {
        let r = run(cfg.clone());
        prop_assert!(r.finished(), "{:?} / {:?} for {cfg:?}", r.source, r.sink);
        let (missing, extra) = r.write_errors();
        prop_assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?} extra {extra:?}");
        prop_assert!(r.source_at.unwrap() < Duration::from_secs(60));
        // A stream broken after the last acknowledgement is not lost.
        prop_assert!(r.source_stats.streams_lost as usize <= cfg.faults.len());
    }

    /// Whatever breaks, both sides end in bounded time, no chunk is written twice,
    /// and a source that finished means the sink has every chunk.
    #[test]
    fn any_faults_end_both_sides(cfg in schedule(), extra in proptest::collection::vec(
        prop_oneof![
            (0u16..6, 0u64..300).prop_map(|(stream, at)| Fault::Break { stream, at: Duration::from_millis(at) }),
            (0u16..6, 0u64..300).prop_map(|(stream, at)| Fault::Silence { stream, at: Duration::from_millis(at) }),
            (0u16..6, 0u64..300).prop_map(|(stream, at)| Fault::Corrupt { stream, at: Duration::from_millis(at) }),
            (0u64..300).prop_map(|at| Fault::ControlSilence { at: Duration::from_millis(at) }),
            (0u64..300).prop_map(|at| Fault::ControlBreak { at: Duration::from_millis(at) }),
            (0u16..6).prop_map(|stream| Fault::NoJoin { stream }),
            (0u64..150).prop_map(|chunk| Fault::WriteError { chunk }),
            (0u64..150).prop_map(|chunk| Fault::ReadError { chunk }),
            Just(Fault::Refuse),
        ], 0..4)) {
        let mut cfg = cfg;
        cfg.faults.extend(extra);
        cfg.timing = Timing {
            heartbeat: Duration::from_secs(1),
            stall: Duration::from_secs(10),
            idle: Some(Duration::from_secs(10)),
            join: Duration::from_secs(10),
            handshake: Duration::from_secs(10),
            ..Timing::default()
        };
        let r = run(cfg.clone());
        prop_assert!(r.source != Outcome::Running && r.sink != Outcome::Running,
            "still running: {:?} / {:?} for {cfg:?}", r.source, r.sink);
        let bound = Duration::from_secs(60);
        prop_assert!(r.source_at.unwrap() < bound && r.sink_at.unwrap() < bound,
            "ended at {:?} / {:?} for {cfg:?}", r.source_at, r.sink_at);
        let (missing, extra) = r.write_errors();
        let twice: Vec<_> = extra.iter().filter(|k| r.writes[k] > 1).collect();
        prop_assert!(twice.is_empty(), "written twice: {twice:?}");
        if r.source == Outcome::Finished {
            prop_assert!(missing.is_empty(), "the source finished, the sink lacks {missing:?}");
        }
        if r.sink == Outcome::Finished {
            prop_assert!(missing.is_empty(), "the sink finished without {missing:?}");
        }
    }
}

// ---- Growing manifests and chunk requests (features GROWING_MANIFEST and RANGES) ----

use dmover_proto::control::{
    Control, Growth, ManifestEnd, ManifestPart, MetaPart, SessionInfo, SessionOptions, Want,
};
use dmover_proto::manifest::EntryMeta;
use dmover_proto::session::sim::{manifest, totals};
use dmover_proto::session::{ChunkSet, SinkEvent, SinkSession, SourceSession, features};
use std::time::Instant;

fn growing(push: bool, parts: u32) -> Config {
    Config {
        push,
        features: features::MACHINES,
        parts,
        files: 8,
        ..Config::default()
    }
}

#[test]
fn a_growing_manifest_sends_each_part_as_it_comes() {
    for push in [true, false] {
        let r = run(growing(push, 4));
        assert_finished(&r);
        assert_eq!(r.reads, 64, "push {push}: each chunk read once");
        assert_eq!(r.grown, vec![16..32, 32..48, 48..64], "push {push}");
        // The sink said every part's chunks are written (what tells a producer a part
        // is durable there), and it said so once per part.
        assert_eq!(r.stored_below, Some(64), "push {push}");
        let (to_acceptor, to_dialer) = &r.messages;
        let (from_source, from_sink) = if push {
            (to_acceptor, to_dialer)
        } else {
            (to_dialer, to_acceptor)
        };
        assert_eq!(
            from_source.iter().filter(|m| **m == "Grow").count(),
            4,
            "push {push}"
        );
        assert!(!from_source.contains(&"ManifestEnd"));
        assert_eq!(from_sink.iter().filter(|m| **m == "Grown").count(), 3);
        assert_eq!(
            from_sink.iter().filter(|m| **m == "Stored").count(),
            4,
            "push {push}"
        );
        // Data flowed before the manifest was complete: the first part's chunks
        // arrived before the last part was sent (3 × 50 ms after the first), and each
        // part's after the one before.
        for (k, at) in r.write_order.iter().zip(&r.write_times) {
            if *k < 16 {
                assert!(*at < ms(150), "push {push}: chunk {k} at {at:?}");
            }
        }
        assert!(r.write_order.is_sorted_by_key(|k| k / 16), "push {push}");
        // The session ends only after the last part.
        assert!(r.source_at.unwrap() >= ms(150), "push {push}");
    }
}

/// Continuous mode: parts of one chunk (they go on the first stream) with quiet spells
/// longer than the streams' idle limit between them. No stream counts as idle (nothing
/// was expected while quiet, and a stream is idle only when no stream brings
/// anything), and the sink says each part is stored.
#[test]
fn quiet_spells_between_small_parts_lose_no_stream() {
    for push in [true, false] {
        let idle = Duration::from_millis(400);
        let r = run(Config {
            chunks: 6,
            files: 6,
            part_every: Duration::from_secs(1),
            timing: Timing {
                idle: Some(idle),
                stall: idle,
                ..Timing::default()
            },
            ..growing(push, 6)
        });
        assert_finished(&r);
        assert_eq!(r.source_stats.streams_lost, 0, "push {push}");
        assert_eq!(r.sink_stats.streams_lost, 0, "push {push}");
        assert_eq!(r.stored_below, Some(6), "push {push}");
        let from_sink = if push { &r.messages.1 } else { &r.messages.0 };
        assert_eq!(
            from_sink.iter().filter(|m| **m == "Stored").count(),
            6,
            "push {push}"
        );
    }
}

#[test]
fn a_growing_manifest_with_empty_parts_and_one_part_finishes() {
    for (push, parts, chunks, files) in [
        (true, 1, 64, 3),
        (false, 1, 64, 3),
        (true, 5, 2, 1),
        (false, 5, 0, 0),
        (true, 3, 0, 4),
    ] {
        let r = run(Config {
            chunks,
            files,
            ..growing(push, parts)
        });
        assert_finished(&r);
        assert_eq!(r.reads, chunks, "push {push}, {parts} parts");
    }
}

#[test]
fn a_growing_manifest_resumes_its_first_part_and_survives_a_broken_stream() {
    for push in [true, false] {
        let r = run(Config {
            chunks: 400,
            held: (0..100).filter(|k| k % 2 == 0).collect(),
            faults: vec![Fault::Break {
                stream: 2,
                at: ms(120),
            }],
            ..growing(push, 4)
        });
        assert_finished(&r);
        assert_eq!(r.expected.len(), 350);
        assert_eq!(r.source_stats.streams_lost, 1, "push {push}");
        assert!((0..100).step_by(2).all(|k| !r.writes.contains_key(&k)));
        // Held chunks (never sent) and resent ones count: all of them are written.
        assert_eq!(r.stored_below, Some(400), "push {push}");
    }
}

#[test]
fn wanted_chunks_go_ahead_of_the_ordinary_order() {
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 400,
            features: features::RANGES,
            wants: vec![(Duration::ZERO, vec![390, 5, 200, 391])],
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.reads, 400, "push {push}: nothing is read twice");
        for k in [390, 391, 200] {
            let at = r.write_order.iter().position(|&w| w == k).unwrap();
            assert!(at < 40, "push {push}: chunk {k} written {at}th");
        }
    }
}

#[test]
fn a_request_driven_session_sends_only_what_is_wanted() {
    for push in [true, false] {
        let wants = vec![
            (ms(0), vec![17, 3, 150]),
            (ms(30), vec![99, 0, 1, 2]),
            // Wanted again long after they arrived (a mount's cache dropped them).
            (ms(5000), vec![3, 150]),
            // Wanted twice while on their way: asked for once.
            (ms(6000), vec![42, 42, 43]),
        ];
        let r = run(Config {
            push,
            chunks: 200,
            features: features::RANGES,
            on_demand: true,
            wants,
            ..Config::default()
        });
        assert!(r.finished(), "source {:?}, sink {:?}", r.source, r.sink);
        let mut want_writes = BTreeMap::new();
        for k in [17, 99, 0, 1, 2, 42, 43] {
            want_writes.insert(k, 1);
        }
        want_writes.insert(3, 2);
        want_writes.insert(150, 2);
        assert_eq!(r.writes, want_writes, "push {push}");
        assert_eq!(r.reads, 11, "push {push}");
        let from_sink = if push { &r.messages.1 } else { &r.messages.0 };
        assert!(from_sink.contains(&"OnDemand") && !from_sink.contains(&"Go"));
        assert_eq!(from_sink.iter().filter(|m| **m == "Want").count(), 4);
        assert!(r.sink_at.unwrap() >= ms(6000));
    }
}

#[test]
fn a_request_driven_session_outlives_the_join_and_idle_limits() {
    // A mount read now and then: quiet spells longer than the streams' idle limit,
    // and a session much longer than the join limit, with every stream joined.
    for push in [true, false] {
        let t = Timing::default();
        let later = t.join + t.idle.unwrap() * 2;
        let r = run(Config {
            push,
            chunks: 50,
            features: features::RANGES,
            on_demand: true,
            wants: vec![(ms(0), vec![1]), (later, vec![2]), (later * 2, vec![3])],
            ..Config::default()
        });
        assert!(
            r.finished(),
            "push {push}: source {:?}, sink {:?}",
            r.source,
            r.sink
        );
        assert_eq!(r.writes.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(r.sink_stats.streams_lost, 0, "push {push}");
    }
}

#[test]
fn a_request_driven_session_without_wants_closes_at_once() {
    let r = run(Config {
        features: features::RANGES,
        on_demand: true,
        ..Config::default()
    });
    assert!(r.finished(), "source {:?}, sink {:?}", r.source, r.sink);
    assert_eq!(r.reads, 0);
    assert!(r.writes.is_empty());
}

#[test]
fn a_request_driven_mount_of_a_growing_manifest() {
    let r = run(Config {
        push: false,
        chunks: 90,
        features: features::MACHINES,
        parts: 3,
        on_demand: true,
        wants: vec![(ms(10), vec![5, 2]), (ms(500), vec![80, 31, 60])],
        ..growing(false, 3)
    });
    assert!(r.finished(), "source {:?}, sink {:?}", r.source, r.sink);
    assert_eq!(
        r.writes.keys().copied().collect::<Vec<_>>(),
        [2, 5, 31, 60, 80]
    );
    assert_eq!(r.reads, 5);
    assert_eq!(r.grown, vec![30..60, 60..90]);
}

#[test]
fn features_not_offered_are_not_used() {
    // A dialer that does not offer them: the session uses none, and the machines
    // refuse to send what needs them.
    let r = run(Config {
        features: 0,
        parts: 2,
        ..Config::default()
    });
    let src = failed(&r.source);
    assert!(
        src.to_string()
            .contains("growing manifest in a session without"),
        "{src}"
    );
    assert!(matches!(failed(&r.sink), SessionError::Remote { .. }));
    let r = run(Config {
        features: features::GROWING_MANIFEST,
        wants: vec![(ms(0), vec![1])],
        ..Config::default()
    });
    let sink = failed(&r.sink);
    assert!(
        sink.to_string().contains("without the ranges feature"),
        "{sink}"
    );
}

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
    let m = SourceSession::<dmover_proto::session::sim::SimError>::accept(
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
fn granted_sink(features: u64) -> (SinkSession<dmover_proto::session::sim::SimError>, Instant) {
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
fn sink_with(features: u64) -> (SinkSession<dmover_proto::session::sim::SimError>, Instant) {
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
fn source_with(features: u64) -> (SourceSession<dmover_proto::session::sim::SimError>, Instant) {
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
    let mut m = SourceSession::<dmover_proto::session::sim::SimError>::accept(
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
fn sink_grown_once(features: u64) -> (SinkSession<dmover_proto::session::sim::SimError>, Instant) {
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
    m: &mut SinkSession<dmover_proto::session::sim::SimError>,
    now: Instant,
    files: u32,
    from: usize,
    chunks: u64,
    chunk: Option<u32>,
) -> Vec<SinkEvent<dmover_proto::session::sim::SimError>> {
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
        let mut m = SourceSession::<dmover_proto::session::sim::SimError>::accept(
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
) -> (SourceSession<dmover_proto::session::sim::SimError>, Instant) {
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

fn extended() -> impl Strategy<Value = Config> {
    (
        schedule(),
        0u32..5,
        0u64..120,
        any::<bool>(),
        proptest::collection::vec(
            (0u64..400, proptest::collection::vec(0u64..1000, 0..6)),
            0..4,
        ),
    )
        .prop_map(|(cfg, parts, every, on_demand, wants)| {
            let first = if parts == 0 {
                cfg.chunks
            } else {
                cfg.chunks / u64::from(parts)
            };
            // Wants name chunks of the first part: later ones may not be known yet.
            let wants: Vec<(Duration, Vec<u64>)> = if first == 0 {
                Vec::new()
            } else {
                wants
                    .into_iter()
                    .map(|(at, ks)| (ms(at), ks.into_iter().map(|k| k % first).collect()))
                    .collect()
            };
            Config {
                features: features::MACHINES,
                parts,
                part_every: ms(every),
                on_demand,
                wants,
                files: 6,
                // A request-driven session is a mount's: never early data.
                early: cfg.early && !on_demand && cfg.held.is_empty(),
                ..cfg
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Growing manifests, requests and request-driven sessions, with at least one
    /// stream left: every schedule finishes, with every chunk asked for written and
    /// nothing else; an ordinary session writes each chunk exactly once.
    #[test]
    fn any_growing_or_wanting_schedule_finishes(cfg in extended()) {
        let r = run(cfg.clone());
        prop_assert!(r.finished(), "{:?} / {:?} for {cfg:?}", r.source, r.sink);
        let (missing, extra) = r.write_errors();
        prop_assert!(missing.is_empty(), "missing {missing:?} for {cfg:?}");
        if cfg.on_demand {
            // A chunk wanted again after it arrived is written again, at most once
            // per want.
            for (k, n) in &r.writes {
                let asked = cfg.wants.iter().map(|(_, w)| w.iter().filter(|&&w| w == *k).count()).sum::<usize>();
                prop_assert!(*n as usize <= asked.max(1), "chunk {k} written {n} times, wanted {asked}");
                prop_assert!(asked > 0, "chunk {k} never wanted");
            }
        } else {
            prop_assert!(extra.is_empty(), "extra {extra:?} for {cfg:?}");
        }
        prop_assert!(r.source_at.unwrap() < Duration::from_secs(60));
        // Each later part the sink took came with the chunk size the source named
        // for it (feature PART_CHUNKS: its own for every other part, once the
        // session is known to use the feature; else the session's). A
        // request-driven session may end before a part comes.
        prop_assert!(
            r.named_chunks.starts_with(&r.part_chunks),
            "heard {:?}, named {:?} for {cfg:?}", r.part_chunks, r.named_chunks
        );
        if !cfg.on_demand {
            prop_assert_eq!(&r.part_chunks, &r.named_chunks, "for {:?}", cfg);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever breaks in a growing or request-driven session, both sides end in
    /// bounded time, and a side that finished means every chunk asked for came.
    #[test]
    fn any_faults_end_growing_and_wanting_sessions(cfg in extended(), extra in proptest::collection::vec(
        prop_oneof![
            (0u16..6, 0u64..300).prop_map(|(stream, at)| Fault::Break { stream, at: Duration::from_millis(at) }),
            (0u16..6, 0u64..300).prop_map(|(stream, at)| Fault::Silence { stream, at: Duration::from_millis(at) }),
            (0u64..300).prop_map(|at| Fault::ControlSilence { at: Duration::from_millis(at) }),
            (0u64..300).prop_map(|at| Fault::ControlBreak { at: Duration::from_millis(at) }),
            (0u16..6).prop_map(|stream| Fault::NoJoin { stream }),
            (0u64..150).prop_map(|chunk| Fault::WriteError { chunk }),
            (0u64..150).prop_map(|chunk| Fault::ReadError { chunk }),
        ], 0..3)) {
        let mut cfg = cfg;
        cfg.faults.extend(extra);
        cfg.timing = Timing {
            heartbeat: Duration::from_secs(1),
            stall: Duration::from_secs(10),
            idle: Some(Duration::from_secs(10)),
            join: Duration::from_secs(10),
            handshake: Duration::from_secs(10),
            ..Timing::default()
        };
        let r = run(cfg.clone());
        prop_assert!(r.source != Outcome::Running && r.sink != Outcome::Running,
            "still running: {:?} / {:?} for {cfg:?}", r.source, r.sink);
        let bound = Duration::from_secs(60);
        prop_assert!(r.source_at.unwrap() < bound && r.sink_at.unwrap() < bound,
            "ended at {:?} / {:?} for {cfg:?}", r.source_at, r.sink_at);
        let (missing, _) = r.write_errors();
        if r.source == Outcome::Finished || r.sink == Outcome::Finished {
            prop_assert!(missing.is_empty(), "finished without {missing:?} for {cfg:?}");
        }
        if !cfg.on_demand {
            let twice: Vec<_> = r.writes.iter().filter(|(_, n)| **n > 1).collect();
            prop_assert!(twice.is_empty(), "written twice: {twice:?}");
        }
    }
}

// ---- Tuning (feature TUNING) ----

/// A session whose source sends on one of its four streams for longer than the
/// sink's idle limit.
fn tuned(features: u64, push: bool) -> Config {
    Config {
        push,
        features,
        active: Some(1),
        timing: Timing {
            idle: Some(ms(30)),
            ..Timing::default()
        },
        ..Config::default()
    }
}

#[test]
fn a_tuned_source_leaves_streams_idle_and_the_sink_keeps_them() {
    for push in [true, false] {
        let r = run(tuned(features::TUNING, push));
        assert_finished(&r);
        assert!(
            r.sink_at.unwrap() > ms(60),
            "push {push}: long enough to idle"
        );
        assert_eq!(
            r.frames.keys().copied().collect::<Vec<_>>(),
            vec![0],
            "push {push}"
        );
        assert_eq!(r.frames[&0], 64);
        assert_eq!(r.sink_stats.streams_lost, 0, "push {push}");
        assert_eq!(r.source_stats.streams_lost, 0, "push {push}");
        assert_eq!(r.tuned.len(), 1);
        assert_eq!(r.tuned[0].streams, 1);
    }
}

#[test]
fn without_the_tuning_feature_every_stream_carries_chunks() {
    for push in [true, false] {
        let r = run(tuned(0, push));
        assert_finished(&r);
        assert_eq!(r.frames.len(), 4, "push {push}: {:?}", r.frames);
        assert!(r.tuned.is_empty());
        let (a, b) = &r.messages;
        assert!(!a.contains(&"Tuned") && !b.contains(&"Tuned"));
    }
}

/// The sink of a `LINKS` session given `sparse` before `ManifestEnd` (manifest: a
/// directory, entry 0, and two files, 1 and 2).
fn sink_told_sparse(
    features: u64,
    sparse: Vec<u32>,
) -> Vec<SinkEvent<dmover_proto::session::sim::SimError>> {
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
        let mut m = SourceSession::<dmover_proto::session::sim::SimError>::accept(
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

/// The control messages the source sent.
fn from_source(r: &Report, push: bool) -> &[&'static str] {
    if push { &r.messages.0 } else { &r.messages.1 }
}

fn meta_of(entry: u32, xattrs: Vec<dmover_proto::manifest::Xattr>) -> EntryMeta {
    EntryMeta {
        entry,
        uid: 1000 + entry,
        gid: 100,
        xattrs,
    }
}

#[test]
fn metadata_travels_both_ways_and_only_with_its_feature() {
    let meta = vec![
        meta_of(0, vec![xattr(b"user.a", b"1"), xattr(b"trusted.x", b"no")]),
        meta_of(
            2,
            vec![
                xattr(b"user.empty", b""),
                xattr(b"system.posix_acl_access", &[2, 0, 0, 0]),
            ],
        ),
    ];
    for push in [true, false] {
        let r = run(Config {
            push,
            features: features::METADATA,
            meta: meta.clone(),
            ..Config::default()
        });
        assert!(r.finished(), "{:?} {:?}", r.source, r.sink);
        // The sink takes user.* and ACLs only (Limits::default()).
        let mut want = meta.clone();
        want[0].xattrs.truncate(1);
        assert_eq!(r.meta, want, "push {push}");
        let i = from_source(&r, push);
        assert!(i.contains(&"Meta"), "{i:?}");
        // Without the feature nothing is sent and nothing is missed.
        let r = run(Config {
            push,
            features: features::TUNING,
            meta: meta.clone(),
            ..Config::default()
        });
        assert!(r.finished());
        assert!(r.meta.is_empty());
        assert!(!from_source(&r, push).contains(&"Meta"));
    }
    // A source with nothing to say still ends the metadata (an empty last part).
    let r = run(Config {
        features: features::METADATA,
        ..Config::default()
    });
    assert!(r.finished());
    assert!(r.meta.is_empty());
}

/// A sink in a METADATA session whose manifest has ended.
fn meta_sink() -> (SinkSession<dmover_proto::session::sim::SimError>, Instant) {
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
    mut m: SinkSession<dmover_proto::session::sim::SimError>,
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
    SinkSession<dmover_proto::session::sim::SimError>,
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
    SinkSession<dmover_proto::session::sim::SimError>,
    Instant,
    Vec<dmover_proto::manifest::Entry>,
    Vec<SinkEvent<dmover_proto::session::sim::SimError>>,
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

// ---------------------------------------------------------------------------------
// Feature LIMITS: the dialer's limits right after `Session`, the acceptor's answer.

#[test]
fn limits_go_both_ways_in_a_push_and_a_pull() {
    use dmover_proto::session::sim::{acceptor_limits, dialer_limits};
    for push in [true, false] {
        let r = run(Config {
            push,
            features: features::LIMITS,
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.limits.0, Some(dialer_limits()), "push {push}");
        assert_eq!(
            r.limits.1,
            Some(acceptor_limits(&dialer_limits())),
            "push {push}"
        );
        // The dialer's go right behind the session's answer, before a pull's `Go`.
        let ask = r.messages.0.iter().position(|m| *m == "Limits");
        let go = r.messages.0.iter().position(|m| *m == "Go");
        assert!(ask.is_some(), "push {push}: {:?}", r.messages.0);
        if !push {
            assert!(ask < go, "{:?}", r.messages.0);
        }
        assert_eq!(
            r.messages.1.iter().filter(|m| **m == "Limits").count(),
            1,
            "one answer: {:?}",
            r.messages.1
        );
    }
}

#[test]
fn without_the_limits_feature_no_limits_travel() {
    // An older peer on either side: the feature is not granted, nothing is sent, and
    // the session runs as before.
    for push in [true, false] {
        let r = run(Config {
            push,
            features: features::RANGES | features::METADATA,
            ..Config::default()
        });
        assert_finished(&r);
        assert_eq!(r.limits, (None, None));
        assert!(!r.messages.0.contains(&"Limits"), "{:?}", r.messages.0);
        assert!(!r.messages.1.contains(&"Limits"), "{:?}", r.messages.1);
    }
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
        limits: dmover_proto::session::sim::dialer_limits(),
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
        let mut m = SinkSession::<dmover_proto::session::sim::SimError>::dial(
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
                Control::Limits(dmover_proto::session::sim::dialer_limits())
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
    let mut m = SinkSession::<dmover_proto::session::sim::SimError>::dial(
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
        let mut m = SourceSession::<dmover_proto::session::sim::SimError>::dial(
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
    let mut m = SourceSession::<dmover_proto::session::sim::SimError>::dial(
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
    let ask = dmover_proto::session::sim::dialer_limits();
    let answer = dmover_proto::session::sim::acceptor_limits(&ask);
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
