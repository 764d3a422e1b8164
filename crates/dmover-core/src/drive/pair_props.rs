//! Pair tests and schedules on the production drivers: pushes and pulls between
//! memory storage over the in-memory transport ([`super::pair`]) on tokio's paused
//! clock, with streams cut or silenced, the control connection broken or silenced,
//! storage failing and credentials refused. What `dmover-proto`'s simulator checks
//! of the machines, checked here of the code that runs them.

use super::pair::{CHUNK, ControlFault, Ends, Wire, paused, session, whole};
use super::*;

use dmover_net::fault::FaultPlan;
use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};
use dmover_store::fault::Failing;
use dmover_store::mem::{MemSink, MemSource};
use proptest::prelude::*;

type Src = Failing<MemSource>;
type Dst = Failing<MemSink>;

impl SourceStore for Src {}

impl SinkStore for Dst {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.get_ref().entries()
    }
}

/// What moves and what goes wrong in one session.
#[derive(Debug, Clone, Default)]
struct Script {
    push: bool,
    streams: u16,
    checksum: bool,
    /// The files' sizes.
    sizes: Vec<usize>,
    /// Stream (in the order the acceptor took them) cut, or silenced, once this many
    /// payload bytes passed on it; `true`: silenced.
    links: Vec<(usize, u64, bool)>,
    control: Option<ControlFault>,
    refuse: bool,
    /// The chunk the source cannot read, and the one the sink cannot write.
    read_error: Option<u64>,
    write_error: Option<u64>,
    /// Chunk buffers of the source and the sink.
    buffers: (usize, usize),
}

/// How a script ended: both ends, the data sent, and the sink's storage (whatever
/// became of the session).
struct Ran {
    ends: Ends<Src, Dst>,
    data: Vec<Vec<u8>>,
    sink: Arc<parking_lot::Mutex<Option<Arc<MemSink>>>>,
    chunks: u64,
}

impl Ran {
    /// Entries whose data the sink does not hold complete and right.
    fn missing(&self) -> Vec<usize> {
        let Some(sink) = self.sink.lock().clone() else {
            return (1..self.data.len()).collect();
        };
        (1..self.data.len())
            .filter(|&i| sink.file(i as u32).as_ref() != Some(&self.data[i]))
            .collect()
    }
}

fn dataset(sizes: &[usize]) -> (Vec<Entry>, Vec<Vec<u8>>) {
    let mtime = Mtime { sec: 1, nsec: 2 };
    let mut entries = vec![Entry {
        parent: NO_PARENT,
        name: b"d".to_vec(),
        kind: EntryKind::Dir,
        mode: 0o755,
        mtime,
    }];
    let mut data = vec![Vec::new()];
    for (i, &size) in sizes.iter().enumerate() {
        entries.push(Entry {
            parent: 0,
            name: format!("f{i}").into_bytes(),
            kind: EntryKind::File { size: size as u64 },
            mode: 0o644,
            mtime,
        });
        data.push((0..size).map(|j| (j * 31 + i * 7) as u8).collect());
    }
    (entries, data)
}

/// Session limits short enough that a fault ends a session within a minute of the
/// paused clock: production's rules ([`timing`]) with a 10 s stream timeout.
fn short_timing() -> Timing {
    Timing {
        stuck: Duration::from_secs(5),
        join: Duration::from_secs(10),
        handshake: Duration::from_secs(10),
        ..timing(Duration::from_secs(1), Duration::from_secs(10))
    }
}

/// Runs `s` on a paused clock, with a disk pool that works where jobs are queued.
fn run(s: &Script) -> Ran {
    let (entries, data) = dataset(&s.sizes);
    let checksum = s.checksum;
    let inner = MemSource::new(entries.clone(), data.clone(), CHUNK, checksum).unwrap();
    let chunks = chunk_set(inner.chunks());
    let n_chunks = inner.chunks().count() as u64;
    let source = Failing::new(Arc::new(inner), s.read_error);
    let slot = Arc::new(parking_lot::Mutex::new(None));
    let (kept, write_error) = (slot.clone(), s.write_error);
    let prepare: Prepare<Dst> = Box::new(move |entries, chunk, _| {
        let mem = Arc::new(MemSink::new(entries, chunk, checksum)?);
        *kept.lock() = Some(mem.clone());
        Ok(Failing::new(mem, write_error))
    });
    let plans: Vec<(usize, Arc<FaultPlan>)> = s
        .links
        .iter()
        .map(|&(n, after, silent)| {
            let plan = if silent {
                FaultPlan::silence(after)
            } else {
                FaultPlan::new(Some((after, false)))
            };
            (n, plan)
        })
        .collect();
    let wire = Wire {
        push: s.push,
        streams: s.streams,
        checksum,
        features: 0,
        timing: short_timing(),
        links: Arc::new(move |n| {
            let found = plans.iter().find(|(i, _)| *i == n);
            found.map(|(_, p)| p.clone())
        }),
        control: s.control,
        refuse: s.refuse,
        disk: Arc::new(DiskPool::inline()),
        buffers: s.buffers,
    };
    let ends = paused().block_on(async {
        let ran = session(wire, source, prepare, whole(entries, chunks));
        tokio::time::timeout(Duration::from_secs(3600), ran)
            .await
            .expect("the session ends within an hour of the paused clock")
    });
    Ran {
        ends,
        data,
        sink: slot,
        chunks: n_chunks,
    }
}

fn script(push: bool, streams: u16, sizes: &[usize]) -> Script {
    Script {
        push,
        streams,
        checksum: true,
        sizes: sizes.to_vec(),
        buffers: (6, 4),
        ..Script::default()
    }
}

/// Files of every shape the layout cuts differently.
const SIZES: [usize; 8] = [0, 1, 4095, 65_536, 3 * 65_536 + 17, 200_000, 300, 500_000];

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

/// A session's files, streams and buffers, with up to all streams but one cut.
fn schedule() -> impl Strategy<Value = Script> {
    (
        any::<bool>(),
        1u16..6,
        any::<bool>(),
        proptest::collection::vec(0usize..300_000, 0..8),
        proptest::collection::vec((0usize..6, 0u64..600_000), 0..4),
        (1usize..8, 1usize..6),
    )
        .prop_map(|(push, streams, checksum, sizes, cuts, buffers)| {
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
                ..Script::default()
            }
        })
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
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

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

    /// Whatever goes wrong, both ends end within a minute, and an end that finished
    /// means the sink holds every file whole.
    #[test]
    fn any_faults_end_both_sides(s in schedule(), extras in proptest::collection::vec(extra(), 0..4)) {
        let mut s = s;
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
