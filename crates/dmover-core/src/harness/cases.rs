//! Sessions that `dmover-proto`'s simulator used to drive, on the production drivers:
//! a resume (files and pieces held, a changed file), the sink's limits, streams that
//! never join or arrive corrupt, slow and stuck streams, the tuner's idle streams,
//! metadata, quiet spells in a growing manifest and in a mount's requests. What the
//! machines do with a message stays tested on the machines alone (`dmover-proto`'s
//! `tests/pair.rs`).

use super::pair::CHUNK;
use super::script::{Had, Ran, SIZES, Script, run};
use std::time::Duration;

use dmover_net::memnet::WireFault;
use dmover_proto::control::ErrorCode;
use dmover_proto::manifest::{EntryMeta, Xattr};
use dmover_proto::session::{Timing, features};

use crate::drive::timing;

fn script(push: bool, streams: u16, sizes: &[usize]) -> Script {
    Script {
        buffers: (8, 6),
        ..Script::files(push, streams, sizes)
    }
}

/// Neither end lost a stream.
fn no_stream_lost(r: &Ran, push: bool) {
    let source = r.ends.source.as_ref().expect("the source finishes");
    let sink = r.ends.sink.as_ref().expect("the sink finishes");
    for stats in [source.stats, sink.stats] {
        assert_eq!(stats.streams_lost, 0, "push {push}");
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Both ends finished, every file is whole at the sink, and no chunk was written
/// twice; the sink's summary.
fn finished(r: &Ran) -> dmover_proto::control::Summary {
    let source = r.ends.source.as_ref().expect("the source finishes");
    let sink = r.ends.sink.as_ref().expect("the sink finishes");
    assert_eq!(r.missing(), Vec::<usize>::new(), "every file arrives");
    assert_eq!(source.summary, sink.summary, "both ends tell the summary");
    assert!(r.writes().values().all(|&n| n == 1), "{:?}", r.writes());
    sink.summary
}

/// Both ends failed: the source's error and the sink's.
fn failed(r: &Ran) -> (&crate::Error, &crate::Error) {
    let source = r.ends.source.as_ref().err().expect("the source fails");
    let sink = r.ends.sink.as_ref().err().expect("the sink fails");
    (source, sink)
}

fn total(sizes: &[usize]) -> u64 {
    sizes.iter().map(|&s| s as u64).sum()
}

#[test]
fn a_resume_sends_only_what_the_sink_lacks() {
    // Held: f1 and f3 whole, and the first two of f4's four pieces (its last piece
    // always travels again, with the file's digest over all four).
    let held = vec![(2, Had::Done), (4, Had::Done), (5, Had::Pieces(vec![0, 1]))];
    let held_bytes = (SIZES[1] + SIZES[3]) as u64 + 2 * u64::from(CHUNK);
    for push in [true, false] {
        let mut s = script(push, 3, &SIZES);
        s.held = held.clone();
        let r = run(&s);
        let sink = finished(&r);
        assert_eq!(sink.bytes, total(&SIZES) - held_bytes, "push {push}");
        assert!(sink.verified);
    }
}

#[test]
fn a_resume_that_holds_everything_sends_nothing() {
    let held = (1..=SIZES.len() as u32)
        .filter(|&e| SIZES[e as usize - 1] > 0)
        .map(|e| (e, Had::Done))
        .collect::<Vec<_>>();
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.held = held.clone();
        let r = run(&s);
        let sink = finished(&r);
        assert!(r.writes().is_empty(), "push {push}: {:?}", r.writes());
        assert_eq!(sink.bytes, 0);
    }
}

#[test]
fn a_file_changed_since_the_last_attempt_is_sent_whole() {
    // The sink's pieces of f4 are not what the source reads now: the source's plan
    // names the file stale, and all of it travels again.
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.held = vec![(2, Had::Done), (5, Had::Changed(vec![0, 1]))];
        let r = run(&s);
        let sink = finished(&r);
        assert_eq!(sink.bytes, total(&SIZES) - SIZES[1] as u64, "push {push}");
    }
}

#[test]
fn a_manifest_over_the_limit_is_refused_before_any_data() {
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.max_entries = Some(5);
        let r = run(&s);
        let (source, sink) = failed(&r);
        assert_eq!(sink.code(), ErrorCode::Busy, "push {push}: {sink}");
        assert_eq!(source.code(), ErrorCode::Busy, "push {push}: {source}");
        assert!(r.writes().is_empty());
    }
}

#[test]
fn a_stream_that_never_joins_fails_the_session_after_the_join_limit() {
    for push in [true, false] {
        let mut s = script(push, 4, &SIZES);
        // Long enough (about 13 s at 64 KiB/s a stream) to need every stream.
        s.sizes = vec![40 * CHUNK as usize];
        s.rate = Some(64 << 10);
        s.wire = vec![(3, WireFault::NoJoin)];
        let r = run(&s);
        let (source, sink) = failed(&r);
        let acceptor = if push { sink } else { source };
        assert!(
            acceptor
                .to_string()
                .contains("opened 3 of 4 data streams in time"),
            "push {push}: {acceptor}"
        );
        // The join limit (10 s here), not a later one.
        let join = super::script::short_timing().join;
        for at in [r.ends.source_at, r.ends.sink_at] {
            assert!(at >= join && at < join + secs(5), "push {push}: {at:?}");
        }
    }
}

#[test]
fn a_corrupt_stream_ends_the_session_on_both_sides() {
    // A byte flipped below the records, on the way data go: the sink's record check
    // finds it, and the source learns the sink's cause.
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.wire = vec![(
            0,
            WireFault::Flip {
                after: 150_000,
                from_dialer: push,
            },
        )];
        let r = run(&s);
        let (source, sink) = failed(&r);
        for e in [source, sink] {
            assert_eq!(e.code(), ErrorCode::Checksum, "push {push}: {e}");
            assert!(
                e.to_string().contains("failed authentication"),
                "push {push}: {e}"
            );
        }
    }
}

/// Production's limits with a stall limit of 120 s (and a stream stuck after 20 s).
fn long_stall() -> Timing {
    timing(secs(1), secs(120))
}

#[test]
fn a_stuck_stream_among_moving_ones_is_lost_before_the_stall_limit() {
    // Four streams at 64 KiB/s carrying 100 chunks; one goes silent early. The others
    // keep being acknowledged, so it is lost once it made no progress for `stuck`
    // (20 s), not after the stall limit (120 s), and its chunks go on the others.
    for push in [true, false] {
        let mut s = script(push, 4, &[100 * CHUNK as usize]);
        s.timing = Some(long_stall());
        s.rate = Some(64 << 10);
        s.links = vec![(2, 100_000, true)];
        let r = run(&s);
        finished(&r);
        let source = r.ends.source.as_ref().unwrap();
        assert_eq!(source.stats.streams_lost, 1, "push {push}");
        assert!(source.stats.chunks_resent > 0);
        let at = r.ends.source_at;
        assert!(
            at >= long_stall().stuck && at < secs(80),
            "push {push}: {at:?}"
        );
    }
}

#[test]
fn slow_streams_that_all_move_are_not_stuck() {
    // 8 KiB/s per stream: every chunk takes 8 s on its stream, over `stuck` (5 s
    // here), and the streams are acknowledged about together. None is lost.
    for push in [true, false] {
        let mut s = script(push, 3, &[9 * CHUNK as usize]);
        s.rate = Some(8 << 10);
        let r = run(&s);
        finished(&r);
        no_stream_lost(&r, push);
        assert!(r.ends.source_at > secs(20), "{:?}", r.ends.source_at);
    }
}

#[test]
fn a_tuned_source_leaves_streams_idle_and_the_sink_keeps_them() {
    // The tuner starts on one stream of four; the session lasts longer than a
    // stream's idle limit (15 s here), and the sink keeps the idle streams.
    for push in [true, false] {
        let mut s = script(push, 4, &[20 * CHUNK as usize]);
        s.tuned = Some(1);
        s.rate = Some(64 << 10);
        let r = run(&s);
        finished(&r);
        let moved = r.moved();
        assert_eq!(moved.len(), 4, "push {push}: every stream joined");
        assert_eq!(
            moved.iter().filter(|&&b| b > 0).count(),
            1,
            "push {push}: one stream carried the data: {moved:?}"
        );
        assert!(r.ends.sink_at > secs(16), "{:?}", r.ends.sink_at);
        no_stream_lost(&r, push);
    }
}

#[test]
fn without_the_tuning_feature_every_stream_carries_chunks() {
    for push in [true, false] {
        let r = run(&script(push, 4, &[20 * CHUNK as usize]));
        finished(&r);
        let moved = r.moved();
        assert!(
            moved.len() == 4 && moved.iter().all(|&b| b > 0),
            "push {push}: {moved:?}"
        );
    }
}

fn xattr(name: &[u8], value: &[u8]) -> Xattr {
    Xattr {
        name: name.to_vec(),
        value: value.to_vec(),
    }
}

fn meta_of(entry: u32, xattrs: Vec<Xattr>) -> EntryMeta {
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
        let mut s = script(push, 2, &SIZES);
        s.meta = meta.clone();
        s.features = features::METADATA;
        let r = run(&s);
        finished(&r);
        // The sink takes user.* and ACLs only (its default limits).
        let mut want = meta.clone();
        want[0].xattrs.truncate(1);
        assert_eq!(*r.seen.meta.lock(), want, "push {push}");
        // Without the feature nothing is sent, and nothing is missed.
        s.features = 0;
        let r = run(&s);
        finished(&r);
        assert!(r.seen.meta.lock().is_empty(), "push {push}");
    }
}

#[test]
fn quiet_spells_between_small_parts_lose_no_stream() {
    // A growing manifest whose parts come 25 s apart, longer than a stream's idle
    // limit (15 s here): the streams wait for the next part and none is lost.
    for push in [true, false] {
        let mut s = script(push, 3, &[]);
        s.parts = vec![(1, 0), (0, 25_000), (2, 25_000), (1, 25_000)];
        let r = run(&s);
        finished(&r);
        no_stream_lost(&r, push);
        assert!(r.ends.sink_at >= secs(75), "{:?}", r.ends.sink_at);
    }
}

#[test]
fn a_request_driven_session_outlives_the_join_and_idle_limits() {
    // A mount asks for chunks 40 s apart, beyond the join (10 s) and idle (15 s)
    // limits: the session waits for it.
    let mut s = script(false, 2, &SIZES);
    s.wants = Some(vec![(0, vec![0]), (40_000, vec![2]), (40_000, vec![1])]);
    let r = run(&s);
    assert!(r.ends.source.is_ok() && r.ends.sink.is_ok());
    let written: Vec<u64> = r.writes().keys().copied().collect();
    assert_eq!(written, vec![0, 1, 2]);
    assert!(r.ends.sink_at >= secs(80), "{:?}", r.ends.sink_at);
    assert_eq!(r.ends.sink.as_ref().unwrap().stats.streams_lost, 0);
}

#[test]
fn a_request_driven_session_without_wants_closes_at_once() {
    let mut s = script(false, 2, &SIZES);
    s.wants = Some(Vec::new());
    let r = run(&s);
    assert!(r.ends.source.is_ok() && r.ends.sink.is_ok());
    assert!(r.writes().is_empty());
    assert!(r.ends.sink_at < secs(1), "{:?}", r.ends.sink_at);
}

#[test]
fn the_report_waits_for_acknowledgements_only_when_files_may_be_skipped() {
    // One small file, 50 ms each way. With `continue_on_error` a chunk read again
    // after a lost stream could find its file unreadable, which the source's report
    // must list, so a pull's source reports once its chunks are acknowledged: later
    // than without. A push ends at the sink's `Done` either way.
    for push in [true, false] {
        let end = |continue_on_error| {
            let mut s = script(push, 1, &[1000]);
            s.latency = 50;
            s.continue_on_error = continue_on_error;
            let r = run(&s);
            finished(&r);
            if push {
                r.ends.source_at
            } else {
                r.ends.sink_at
            }
        };
        let (fast, slow) = (end(false), end(true));
        if push {
            assert_eq!(fast, slow);
        } else {
            assert!(
                slow >= fast + Duration::from_millis(100),
                "{fast:?} {slow:?}"
            );
        }
    }
}

#[test]
fn limits_go_both_ways_in_a_push_and_a_pull() {
    use super::pair::answer_limits;
    let asks = dmover_proto::control::SessionLimits {
        bwlimit: 4 << 20,
        congestion: "reno".into(),
        refused: String::new(),
    };
    for push in [true, false] {
        let mut s = script(push, 2, &SIZES);
        s.features = features::LIMITS;
        s.asks = asks.clone();
        let r = run(&s);
        finished(&r);
        assert_eq!(r.ends.limits.0.as_ref(), Some(&asks), "push {push}");
        assert_eq!(r.ends.limits.1, Some(answer_limits(&asks)), "push {push}");
        // Without the feature (an older peer) nothing travels, and the session runs
        // as before.
        s.features = features::RANGES | features::METADATA;
        let r = run(&s);
        finished(&r);
        assert_eq!(r.ends.limits, (None, None), "push {push}");
    }
}

#[test]
fn a_sink_that_closes_its_streams_with_acknowledgements_unsent_ends_the_session() {
    // The sink has the report with the last chunks, says `Done` and closes its streams
    // (its last acknowledgements perhaps not written yet), and the control connection
    // is a little slower than the streams: the source sees the streams end before
    // `Done` arrives, and must neither fail (no stream left, chunks unacknowledged)
    // nor count them as lost.
    for push in [true, false] {
        let mut s = script(push, 4, &SIZES);
        s.sizes.extend([300_000; 8]);
        s.latency = 10;
        s.control_delay = 5;
        let r = run(&s);
        finished(&r);
        let source = r.ends.source.as_ref().unwrap();
        assert_eq!(source.stats.streams_lost, 0, "push {push}");
        assert!(
            r.ends.source_at < r.ends.sink_at + Duration::from_millis(100),
            "push {push}: source {:?}, sink {:?}",
            r.ends.source_at,
            r.ends.sink_at
        );
    }
}
