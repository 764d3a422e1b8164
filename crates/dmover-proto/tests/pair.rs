//! Whole sessions between a source and a sink machine wired together in memory
//! (`dmover_proto::session::sim`), on a simulated clock: every rule of the session
//! protocol, faults both ways, and randomized schedules. No sockets, no wall clock:
//! each test runs in milliseconds and always the same way.

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
    assert_eq!(report.streams_lost, r.source_stats.streams_lost);
    assert_eq!(report.chunks_resent, r.source_stats.chunks_resent);
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

#[test]
fn a_small_push_costs_three_round_trips() {
    // One chunk, 50 ms each way, nothing else slow: the first flight and its answer
    // (1 RTT, the manifest rides along), Go (the sink says it after Session + the
    // manifest, which it has after 1 one-way trip; Go reaches the source at 1.5 RTT),
    // the chunk (on streams joined meanwhile) and its acknowledgement and the sink's
    // Done: under 3 RTT in all.
    let r = run(Config {
        push: true,
        chunks: 1,
        latency: ms(50),
        read: Duration::ZERO,
        send: Duration::ZERO,
        write: Duration::ZERO,
        ..Config::default()
    });
    assert_finished(&r);
    let t = r.source_at.expect("ended");
    assert!(t <= ms(300), "took {t:?}");
    assert!(t >= ms(200), "faster than light: {t:?}");
}

#[test]
fn an_empty_dataset_finishes() {
    for push in [true, false] {
        let r = run(Config {
            push,
            chunks: 0,
            files: 0,
            ..Config::default()
        });
        assert_finished(&r);
        assert!(r.writes.is_empty());
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
fn a_silent_stream_is_lost_after_the_stall_limit_and_its_chunks_resent() {
    let timing = Timing {
        stall: Duration::from_secs(5),
        idle: Some(Duration::from_secs(5)),
        ..Timing::default()
    };
    let r = run(Config {
        chunks: 400,
        timing,
        faults: vec![Fault::Silence {
            stream: 2,
            at: ms(80),
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
        (0u64..3000, 0u64..3000, 0u64..3000),
        (1usize..10, 1usize..8),
        proptest::collection::vec((0u16..6, 0u64..400), 0..4),
        proptest::collection::vec(0u64..150, 0..40),
    )
        .prop_map(
            |(push, streams, chunks, lat, (read, send, write), (buffers, window), breaks, held)| {
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
                    buffers,
                    window,
                    faults,
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
