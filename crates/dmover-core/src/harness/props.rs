//! Pair tests and schedules on the production drivers: pushes and pulls between
//! memory storage over the in-memory transport ([`super::pair`]) on tokio's paused
//! clock, with streams cut or silenced, the control connection broken or silenced,
//! storage failing and credentials refused. What `dmover-proto`'s simulator checks
//! of the machines, checked here of the code that runs them.

use super::pair::{CHUNK, ControlFault};
use super::script::{Dst, Ran, SIZES, Script, Src, dataset, run};
use std::time::Duration;

use crate::drive::*;

use proptest::prelude::*;

fn script(push: bool, streams: u16, sizes: &[usize]) -> Script {
    Script::files(push, streams, sizes)
}

fn finished(r: &Ran) -> (&SourceRun<Src>, &SinkRun<Dst>) {
    let source = r.ends.source.as_ref().expect("the source finishes");
    let sink = r.ends.sink.as_ref().expect("the sink finishes");
    assert_eq!(r.missing(), Vec::<usize>::new(), "every file arrives");
    assert_eq!(
        source.summary, sink.summary,
        "both ends tell the sink's summary"
    );
    assert_eq!(sink.summary.chunks, r.chunks, "each chunk written once");
    (source, sink)
}

fn both_failed(r: &Ran) -> (String, String) {
    let source = r.ends.source.as_ref().err().expect("the source fails");
    let sink = r.ends.sink.as_ref().err().expect("the sink fails");
    (source.to_string(), sink.to_string())
}

#[test]
fn a_push_and_a_pull_move_every_file() {
    for push in [true, false] {
        for checksum in [true, false] {
            let mut s = script(push, 3, &SIZES);
            s.checksum = checksum;
            let r = run(&s);
            let (source, sink) = finished(&r);
            assert_eq!(source.stats.streams_lost, 0);
            assert_eq!(sink.summary.verified, checksum);
            assert_eq!((sink.summary.files, sink.summary.dirs), (8, 1));
            // Nothing went wrong: no time limit was waited for.
            assert!(
                r.ends.source_at < Duration::from_secs(1),
                "{:?}",
                r.ends.source_at
            );
        }
    }
}

#[test]
fn an_empty_dataset_finishes() {
    for push in [true, false] {
        let r = run(&script(push, 2, &[]));
        let (_, sink) = finished(&r);
        assert_eq!((sink.summary.files, sink.summary.bytes), (0, 0));
    }
}

#[test]
fn one_stream_and_one_buffer_still_finish() {
    for push in [true, false] {
        let mut s = script(push, 1, &SIZES);
        s.buffers = (1, 1);
        finished(&run(&s));
    }
}

#[test]
fn a_broken_stream_is_replaced_by_the_others() {
    for push in [true, false] {
        let mut s = script(push, 3, &SIZES);
        s.links = vec![(1, 100_000, false)];
        let r = run(&s);
        let (source, _) = finished(&r);
        assert_eq!(source.stats.streams_lost, 1, "{:?}", source.stats);
        assert!(source.stats.chunks_resent >= 1, "{:?}", source.stats);
    }
}

#[test]
fn every_stream_broken_fails_both_sides() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.links = vec![(0, 10_000, false), (1, 10_000, false)];
        let r = run(&s);
        let (source, sink) = both_failed(&r);
        // The end whose stream was cut names the cut (the other may report the
        // replacement it could not join); neither waits for a time limit.
        let acceptor = if push { sink } else { source };
        assert!(
            acceptor.contains("connection cut (fault injection)"),
            "push {push}: {acceptor}"
        );
        for at in [r.ends.source_at, r.ends.sink_at] {
            assert!(at < Duration::from_secs(3), "push {push}: ended at {at:?}");
        }
    }
}

#[test]
fn a_silent_stream_is_lost_by_the_time_limits_and_its_chunks_resent() {
    for push in [true, false] {
        let mut s = script(push, 3, &SIZES);
        s.links = vec![(0, 100_000, true)];
        let r = run(&s);
        let (source, _) = finished(&r);
        assert!(source.stats.chunks_resent >= 1, "{:?}", source.stats);
        // Found by a time limit (stuck or stall), not at once, and well within the
        // session's.
        let at = r.ends.source_at;
        assert!(
            at >= Duration::from_secs(1) && at < Duration::from_secs(40),
            "{at:?}"
        );
    }
}

#[test]
fn a_silent_control_connection_fails_both_sides_in_bounded_time() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.control = Some(ControlFault::Silence(Duration::ZERO));
        let r = run(&s);
        both_failed(&r);
        for at in [r.ends.source_at, r.ends.sink_at] {
            assert!(at < Duration::from_secs(60), "push {push}: ended at {at:?}");
        }
    }
}

#[test]
fn a_broken_control_connection_fails_both_sides_at_once() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.control = Some(ControlFault::Break(Duration::ZERO));
        let r = run(&s);
        both_failed(&r);
        for at in [r.ends.source_at, r.ends.sink_at] {
            assert!(at < Duration::from_secs(3), "push {push}: ended at {at:?}");
        }
    }
}

#[test]
fn a_sink_write_error_reaches_the_source_as_the_cause() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.write_error = Some(3);
        let (source, sink) = both_failed(&run(&s));
        for e in [source, sink] {
            assert!(
                e.contains("chunk 3: injected storage fault"),
                "push {push}: {e}"
            );
        }
    }
}

#[test]
fn a_source_read_error_reaches_the_sink_as_the_cause() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.read_error = Some(4);
        let (source, sink) = both_failed(&run(&s));
        for e in [source, sink] {
            assert!(
                e.contains("chunk 4: injected storage fault"),
                "push {push}: {e}"
            );
        }
    }
}

#[test]
fn a_refused_credential_fails_the_dialer_with_the_acceptors_reason() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.refuse = true;
        let r = run(&s);
        let (source, sink) = both_failed(&r);
        let dialer = if push { source } else { sink };
        assert!(
            dialer.contains("this credential is refused here"),
            "{dialer}"
        );
        assert!(r.missing().len() == SIZES.len(), "nothing arrives");
    }
}

#[test]
fn a_growing_manifest_with_empty_parts_finishes_both_ways() {
    for push in [true, false] {
        let mut s = script(push, 3, &[]);
        s.parts = vec![(3, 0), (0, 5), (1, 20), (0, 0), (7, 300), (2, 0)];
        let r = run(&s);
        let (_, sink) = finished(&r);
        assert_eq!(sink.summary.files, 4);
        // The last part came 325 ms in.
        assert!(
            r.ends.source_at >= Duration::from_millis(325),
            "{:?}",
            r.ends.source_at
        );
    }
}

#[test]
fn a_request_driven_pull_sends_only_what_is_wanted() {
    let mut s = script(false, 3, &SIZES);
    s.wants = Some(vec![(0, vec![5, 1]), (30, vec![9, 5]), (500, vec![0])]);
    let r = run(&s);
    let sink = r.ends.sink.as_ref().expect("the sink finishes");
    r.ends.source.as_ref().expect("the source finishes");
    let writes: Vec<(u64, u32)> = r.writes().iter().map(|(&k, &n)| (k, n)).collect();
    // Chunk 5, asked for twice, came twice if its first copy had arrived by then.
    let fives = writes.iter().find(|w| w.0 == 5).map_or(0, |w| w.1);
    assert!((1..=2).contains(&fives), "{writes:?}");
    let ks: Vec<u64> = writes.iter().map(|w| w.0).collect();
    assert_eq!(ks, [0, 1, 5, 9], "only what was asked for");
    assert_eq!(sink.summary.chunks, 3 + u64::from(fives));
    // It lasted as long as its owner asked: past the last turn, past every idle limit.
    assert!(
        r.ends.sink_at >= Duration::from_millis(530),
        "{:?}",
        r.ends.sink_at
    );
}

/// One chunk, 50 ms each way: a push takes the first flight and its answer (the
/// session, 1 RTT), `Go` (the sink says it once it has the session and the manifest),
/// the chunk on streams joined meanwhile, its acknowledgement and `Done`; a pull as
/// much. What the protocol's machines promise (`dmover-proto`'s pair tests: a small
/// push in under 3 RTT), checked of the code that runs them.
#[test]
fn a_small_transfer_costs_three_round_trips() {
    for push in [true, false] {
        let mut s = script(push, 2, &[1000]);
        s.latency = 50;
        let r = run(&s);
        finished(&r);
        let t = if push {
            r.ends.source_at
        } else {
            r.ends.sink_at
        };
        assert!(t <= Duration::from_millis(300), "push {push}: took {t:?}");
        assert!(
            t >= Duration::from_millis(200),
            "push {push}: faster than light: {t:?}"
        );
    }
}

/// As above with early data: a push's chunk follows the first flight on a stream
/// joined at once and its acknowledgement and `Done` come back a round trip later
/// (1.5 RTT in all); a pull's sink joins its streams with its first flight.
#[test]
fn early_data_saves_a_round_trip() {
    for push in [true, false] {
        let mut s = script(push, 2, &[1000]);
        s.latency = 50;
        let late = run(&s);
        s.early = true;
        let r = run(&s);
        finished(&r);
        let end = |r: &Ran| {
            if push {
                r.ends.source_at
            } else {
                r.ends.sink_at
            }
        };
        let (t, t_late) = (end(&r), end(&late));
        // A push: 150 ms against 250. A pull: 200 against 250 (the machines' model
        // says 200 both ways: here a late pull's streams also wait for their join's
        // challenge, which over TCP the connections the dialer opens ahead hide).
        let saved = if push { 100 } else { 50 };
        assert!(
            t + Duration::from_millis(saved) <= t_late,
            "push {push}: early {t:?}, late {t_late:?}"
        );
        assert!(t <= Duration::from_millis(200), "push {push}: early {t:?}");
    }
}

/// Early pushes and pulls of many chunks and streams, growing or whole, with a broken
/// stream: as without early data.
#[test]
fn early_transfers_move_every_chunk_once() {
    for push in [true, false] {
        for (parts, cut) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut s = script(push, 3, &SIZES);
            s.early = true;
            s.latency = 5;
            if parts {
                s.parts = vec![(3, 0), (1, 2), (7, 4), (0, 2), (5, 0)];
            }
            if cut {
                s.links = vec![(0, 100_000, false)];
            }
            finished(&run(&s));
        }
    }
}

/// A session's files, streams and buffers, with up to all streams but one cut.
fn schedule() -> impl Strategy<Value = Script> {
    (
        any::<bool>(),
        1u16..6,
        any::<bool>(),
        proptest::collection::vec(0usize..300_000, 0..8),
        proptest::collection::vec((0usize..6, 0u64..600_000), 0..4),
        (1usize..8, 1usize..6),
        0u64..80,
        any::<bool>(),
    )
        .prop_map(
            |(push, streams, checksum, sizes, cuts, buffers, latency, early)| {
                let mut links: Vec<(usize, u64, bool)> = cuts
                    .into_iter()
                    .filter(|&(n, _)| n < usize::from(streams))
                    .map(|(n, after)| (n, after, false))
                    .collect();
                links.sort_by_key(|l| l.0);
                links.dedup_by_key(|l| l.0);
                links.truncate(usize::from(streams) - 1);
                Script {
                    push,
                    streams,
                    checksum,
                    sizes,
                    links,
                    buffers,
                    latency,
                    early,
                    ..Script::default()
                }
            },
        )
}

/// A growing manifest's parts (`Script::parts`): up to 5 parts of up to 4 chunks,
/// up to 120 ms apart.
fn parts() -> impl Strategy<Value = Vec<(u64, u64)>> {
    proptest::collection::vec((0u64..5, 0u64..120), 1..6)
}

/// Anything that may go wrong in a session.
#[derive(Debug, Clone)]
enum Extra {
    Link(usize, u64, bool),
    Control(ControlFault),
    Refuse,
    ReadError(u64),
    WriteError(u64),
}

fn extra() -> impl Strategy<Value = Extra> {
    prop_oneof![
        (0usize..6, 0u64..600_000, any::<bool>()).prop_map(|(n, a, s)| Extra::Link(n, a, s)),
        (0u64..300).prop_map(|ms| Extra::Control(ControlFault::Break(Duration::from_millis(ms)))),
        (0u64..300).prop_map(|ms| Extra::Control(ControlFault::Silence(Duration::from_millis(ms)))),
        Just(Extra::Refuse),
        (0u64..40).prop_map(Extra::ReadError),
        (0u64..40).prop_map(Extra::WriteError),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With at least one stream left, every schedule finishes with every file whole
    /// at the sink, each chunk written once, well within the time limits.
    #[test]
    fn any_schedule_with_a_stream_left_finishes(s in schedule()) {
        let r = run(&s);
        prop_assert!(r.ends.source.is_ok() && r.ends.sink.is_ok(),
            "{:?} / {:?} for {s:?}", r.ends.source.as_ref().err(), r.ends.sink.as_ref().err());
        prop_assert_eq!(r.missing(), Vec::<usize>::new());
        let sink = r.ends.sink.as_ref().unwrap();
        prop_assert_eq!(sink.summary.chunks, r.chunks);
        prop_assert!(r.ends.source_at < Duration::from_secs(60), "{:?}", r.ends.source_at);
        let lost = r.ends.source.as_ref().unwrap().stats.streams_lost as usize;
        prop_assert!(lost <= s.links.len(), "{lost} streams lost for {s:?}");
    }

    /// Request-driven pulls (a mount's), with at least one stream left: every chunk
    /// asked for is written, and nothing else.
    #[test]
    fn any_request_driven_schedule_finishes(s in schedule(), wants in proptest::collection::vec(
        (0u64..200, proptest::collection::vec(0u64..1000, 0..6)), 1..5)) {
        let (entries, _) = dataset(&s.sizes);
        let n = dmover_proto::layout::Layout::new(&entries, CHUNK).unwrap().n_chunks();
        let wants: Vec<(u64, Vec<u64>)> = wants.into_iter()
            .map(|(at, ks)| (at, ks.into_iter().filter_map(|k| k.checked_rem(n)).collect()))
            .collect();
        // A request-driven session is a mount's: never early data.
        let s = Script { push: false, early: false, wants: Some(wants.clone()), ..s };
        let r = run(&s);
        prop_assert!(r.ends.source.is_ok() && r.ends.sink.is_ok(),
            "{:?} / {:?} for {s:?}", r.ends.source.as_ref().err(), r.ends.sink.as_ref().err());
        let wanted: std::collections::BTreeSet<u64> = wants.iter().flat_map(|w| w.1.clone()).collect();
        let written: std::collections::BTreeSet<u64> = r.writes().keys().copied().collect();
        let chunks = r.ends.sink.as_ref().unwrap().summary.chunks;
        prop_assert!(chunks >= wanted.len() as u64, "{chunks} chunks for {wanted:?}");
        prop_assert_eq!(written, wanted);
    }

    /// The same of growing manifests, sent in parts while data flow.
    #[test]
    fn any_growing_schedule_with_a_stream_left_finishes(s in schedule(), parts in parts()) {
        let s = Script { parts, ..s };
        let r = run(&s);
        prop_assert!(r.ends.source.is_ok() && r.ends.sink.is_ok(),
            "{:?} / {:?} for {s:?}", r.ends.source.as_ref().err(), r.ends.sink.as_ref().err());
        prop_assert_eq!(r.missing(), Vec::<usize>::new());
        prop_assert_eq!(r.ends.sink.as_ref().unwrap().summary.chunks, r.chunks);
        prop_assert!(r.ends.source_at < Duration::from_secs(60), "{:?}", r.ends.source_at);
    }

    /// Whatever goes wrong, both ends end within a minute, and an end that finished
    /// means the sink holds every file whole.
    #[test]
    fn any_faults_end_both_sides(
        s in schedule(),
        extras in proptest::collection::vec(extra(), 0..4),
        parts in proptest::option::of(parts()),
    ) {
        let mut s = Script { parts: parts.unwrap_or_default(), ..s };
        for e in extras {
            match e {
                Extra::Link(n, after, silent) => s.links.push((n, after, silent)),
                Extra::Control(c) => s.control = Some(c),
                Extra::Refuse => s.refuse = true,
                Extra::ReadError(k) => s.read_error = Some(k),
                Extra::WriteError(k) => s.write_error = Some(k),
            }
        }
        let r = run(&s);
        let bound = Duration::from_secs(60);
        prop_assert!(r.ends.source_at < bound && r.ends.sink_at < bound,
            "ended at {:?} / {:?} for {s:?}", r.ends.source_at, r.ends.sink_at);
        if r.ends.source.is_ok() || r.ends.sink.is_ok() {
            prop_assert_eq!(r.missing(), Vec::<usize>::new(), "{:?}", s);
        }
        if s.refuse {
            prop_assert!(r.ends.source.is_err() && r.ends.sink.is_err());
        }
        let fails = |k: Option<u64>| k.is_some_and(|k| k < r.chunks);
        if fails(s.read_error) || fails(s.write_error) {
            prop_assert!(r.ends.source.is_err() && r.ends.sink.is_err(),
                "a storage fault on a chunk sent, yet an end finished: {s:?}");
        }
    }
}
