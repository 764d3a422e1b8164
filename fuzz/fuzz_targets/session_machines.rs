//! Structured: the session role machines (`dmover_proto::session`), two ways.
//! Mode 0: a whole session on the production drivers that run the machines, over the
//! in-memory transport on a paused clock, with arbitrary files, streams, buffers,
//! latency, resume and faults (`dmover_fuzz::pair`, also the `drive_pair` target):
//! both ends always end within a bound, and an end that finished means the sink holds
//! every file whole.
//! Mode 1: one machine (source or sink, dialer or acceptor) fed arbitrary control
//! messages, stream events and driver calls at arbitrary times: it never panics, and
//! while it runs it always has a deadline (nothing can leave it waiting forever).
//! Both modes cover the optional features (a growing manifest, chunk requests and
//! request-driven sessions) as well as sessions without them.
#![no_main]

use std::time::{Duration, Instant};

use dmover_fuzz::arbitrary_control;
use dmover_proto::control::{
    Auth, Credential, DataProtection, DirectIo, ErrorCode, Hello, Op, Open, SessionInfo,
    SessionOptions, Summary,
};
use dmover_proto::session::testkit::{TestError, manifest, totals};
use dmover_proto::session::{
    ChunkMeta, ChunkSet, Dial, Limits, SinkSession, SourceSession, State, Timing, features,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn ms(u: &mut Unstructured<'_>, max: u64) -> Result<Duration> {
    Ok(Duration::from_millis(u.int_in_range(0..=max)?))
}

fn err(u: &mut Unstructured<'_>) -> Result<TestError> {
    Ok(TestError {
        code: ErrorCode::Io,
        rank: u.int_in_range(0..=4)?,
        ends: u.arbitrary()?,
        text: "fuzz".into(),
    })
}

fn dial(u: &mut Unstructured<'_>, push: bool) -> Result<Dial> {
    Ok(Dial {
        hello: Hello {
            software: "fuzz".into(),
            nonce: [0; 32],
        },
        auth: Auth {
            user: "u".into(),
            credential: Credential::None,
        },
        open: Open {
            op: if push {
                Op::Push {
                    dest: b"d".to_vec(),
                }
            } else {
                Op::Pull {
                    sources: vec![b"s".to_vec()],
                }
            },
            streams: u.int_in_range(1..=4)?,
            chunk_size: 1 << 20,
            checksum: true,
            direct_io: DirectIo::Never,
            protection: DataProtection::Authenticated,
            features: u.int_in_range(0..=features::MACHINES)?,
        },
        options: SessionOptions {
            resume: u.arbitrary()?,
            journal: true,
            fsync: false,
            verify: true,
            continue_on_error: false,
            heartbeat_ms: 1000,
        },
        server_proof: None,
        limits: Default::default(),
    })
}

fn info(u: &mut Unstructured<'_>) -> Result<SessionInfo> {
    Ok(SessionInfo {
        id: 1,
        salt: [0; 32],
        streams: u.int_in_range(1..=4)?,
        chunk_size: 1 << 20,
        features: u.int_in_range(0..=features::MACHINES)?,
    })
}

/// Checks a running machine always has a deadline; drains its outputs.
macro_rules! settle {
    ($m:expr) => {{
        while $m.poll_transmit().is_some() {}
        while $m.poll_command().is_some() {}
        while $m.poll_event().is_some() {}
        if $m.state() == State::Running {
            assert!(
                $m.poll_timeout().is_some(),
                "a running machine with no deadline"
            );
        }
    }};
}

fn single(u: &mut Unstructured<'_>) -> Result<()> {
    let t0 = Instant::now();
    let mut now = t0;
    let timing = Timing::default();
    let source: bool = u.arbitrary()?;
    let dialer: bool = u.arbitrary()?;
    let chunks = u.int_in_range(0..=64)?;
    if source {
        let mut m = if dialer {
            SourceSession::<TestError>::dial(now, "peer", timing, dial(u, true)?)
        } else {
            let mut m = SourceSession::accept(now, "peer", timing, now + timing.handshake);
            m.grant(now, info(u)?);
            m
        };
        let entries = manifest(2);
        m.push_manifest(&entries);
        let mut layout = chunks;
        if u.arbitrary()? {
            m.end_manifest(totals(&entries), ChunkSet::all(chunks));
            m.set_layout_chunks(chunks);
        } else {
            m.grow_manifest(now, totals(&entries), chunks, u.arbitrary()?);
        }
        settle!(m);
        while !u.is_empty() {
            now += ms(u, 3000)?;
            let stream = u.int_in_range(0..=4)?;
            let chunk = u.int_in_range(0..=70)?;
            match u.int_in_range(0..=10u8)? {
                10 => {
                    layout += u.int_in_range(0..=8)?;
                    m.grow_manifest(now, totals(&entries), layout, u.arbitrary()?);
                }
                0..=2 => m.handle_control(now, arbitrary_control(u)?),
                3 => m.stream_joined(now, stream),
                4 => m.stream_failed(now, stream, err(u)?),
                5 => m.acked(now, stream, u.int_in_range(0..=70)?),
                6 => {
                    if let Some(job) = m.poll_read() {
                        m.chunk_read(now, job.chunk, ChunkMeta::default());
                    }
                }
                7 => m.chunk_written(now, stream, chunk),
                8 => m.drained(Vec::new()),
                _ => {
                    if let Some(t) = m.poll_timeout() {
                        now = now.max(t);
                        m.handle_timeout(now);
                    }
                }
            }
            settle!(m);
        }
    } else {
        let limits = Limits {
            max_entries: 64,
            max_manifest_bytes: 1 << 20,
            ..Limits::default()
        };
        let mut m = if dialer {
            SinkSession::<TestError>::dial(now, "peer", timing, limits, dial(u, false)?)
        } else {
            let mut m = SinkSession::accept(now, "peer", timing, limits, now + timing.handshake);
            m.grant(now, info(u)?);
            m
        };
        settle!(m);
        while !u.is_empty() {
            now += ms(u, 3000)?;
            let stream = u.int_in_range(0..=4)?;
            let chunk = u.int_in_range(0..=70)?;
            match u.int_in_range(0..=12u8)? {
                0..=2 => m.handle_control(now, arbitrary_control(u)?),
                3 => m.stream_joined(now, stream),
                4 => m.stream_failed(now, stream, err(u)?),
                5 => {
                    let _ = m.arrived(now, stream, chunk);
                }
                6 => m.chunk_written(now, chunk),
                7 => m.ready(now, ChunkSet::all(chunks), chunks),
                10 => m.ready_on_demand(now, chunks),
                11 => m.grown(now, u.int_in_range(0..=80)?),
                12 => {
                    let start = u.int_in_range(0..=70)?;
                    m.want(now, &[start..start + u.int_in_range(0..=8)?]);
                }
                8 => m.finished(Summary {
                    bytes: 0,
                    files: 0,
                    dirs: 0,
                    symlinks: 0,
                    chunks,
                    verified: true,
                }),
                _ => {
                    if let Some(t) = m.poll_timeout() {
                        now = now.max(t);
                        m.handle_timeout(now);
                    }
                }
            }
            settle!(m);
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = match u.int_in_range(0..=1u8) {
        Ok(0) => dmover_fuzz::pair::check(&mut u),
        Ok(_) => single(&mut u),
        Err(_) => return,
    };
});
