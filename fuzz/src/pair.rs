//! Whole sessions on the production drivers (`dmover_core::drive`, through its
//! `testing` feature), from arbitrary bytes: a push or a pull between memory storage
//! over the in-memory transport on a paused clock (`dmover_core::harness::script`),
//! with arbitrary files (or a growing manifest's parts, or a mount's chunk requests),
//! streams, buffers, latency, early data, a resume (files and pieces the sink holds,
//! some changed since), a tuned start, and faults (streams cut, silenced, never
//! joined or corrupted below their records, the control connection broken or
//! silenced, a chunk the storage cannot read or write, a refused credential).
//!
//! Checks: both ends always end within a minute of the paused clock; an end that
//! finished means the sink holds every file whole (or, request-driven, every chunk
//! asked for and nothing else); a refused dialer or a storage fault on a chunk sent
//! fails both ends; with at least one stream left and no other fault, both ends
//! finish (when a stream goes silent, given more chunk buffers than streams, as by
//! default). The `drive_pair` target and `session_machines`' first mode run it.

use std::collections::BTreeSet;
use std::time::Duration;

use dmover_core::harness::pair::{CHUNK, ControlFault};
use dmover_core::harness::script::{Had, Script, dataset, run};
use dmover_net::memnet::WireFault;
use libfuzzer_sys::arbitrary::{Result, Unstructured};

/// A session's script from arbitrary bytes.
pub fn script(u: &mut Unstructured<'_>) -> Result<Script> {
    let streams = u.int_in_range(1..=5)?;
    let mut s = Script {
        push: u.arbitrary()?,
        streams,
        checksum: u.arbitrary()?,
        buffers: (u.int_in_range(1..=7)?, u.int_in_range(1..=5)?),
        latency: u.int_in_range(0..=80)?,
        early: u.arbitrary()?,
        ..Script::default()
    };
    match u.int_in_range(0..=2u8)? {
        0 => {
            let n = u.int_in_range(0..=8)?;
            for _ in 0..n {
                s.sizes.push(u.int_in_range(0..=300_000)?);
            }
        }
        1 => {
            let n = u.int_in_range(1..=5)?;
            for _ in 0..n {
                s.parts
                    .push((u.int_in_range(0..=4)?, u.int_in_range(0..=120)?));
            }
        }
        _ => {
            let n = u.int_in_range(0..=6)?;
            for _ in 0..n {
                s.sizes.push(u.int_in_range(0..=300_000)?);
            }
            let turns = u.int_in_range(1..=4)?;
            let mut wants = Vec::new();
            for _ in 0..turns {
                let k = u.int_in_range(0..=5)?;
                let ks = (0..k)
                    .map(|_| u.int_in_range(0..=1000))
                    .collect::<Result<Vec<u64>>>()?;
                wants.push((u.int_in_range(0..=200)?, ks));
            }
            // A mount's session: a pull, never early data; requests name chunks
            // that exist.
            let (entries, _) = dataset(&s.sizes);
            let n = dmover_proto::layout::Layout::new(&entries, CHUNK).map_or(0, |l| l.n_chunks());
            for w in &mut wants {
                w.1 = w.1.iter().filter_map(|k| k.checked_rem(n)).collect();
            }
            s.push = false;
            s.early = false;
            s.wants = Some(wants);
        }
    }
    s.continue_on_error = u.arbitrary()?;
    if u.arbitrary()? {
        s.tuned = Some(u.int_in_range(1..=streams)?);
    }
    // A resume, never with early data (a dialer that resumes waits for the sink's
    // answer before it sends, as `Connection::early` decides).
    if s.parts.is_empty() && s.wants.is_none() && !s.early && u.arbitrary()? {
        s.held = held(u, &s.sizes)?;
    }
    let faults = u.int_in_range(0..=4)?;
    for _ in 0..faults {
        let at = Duration::from_millis(u.int_in_range(0..=300)?);
        match u.int_in_range(0..=7u8)? {
            6 => s.wire.push((u.int_in_range(0..=5)?, WireFault::NoJoin)),
            7 => s.wire.push((
                u.int_in_range(0..=5)?,
                WireFault::Flip {
                    after: u.int_in_range(0..=600_000)?,
                    from_dialer: u.arbitrary()?,
                },
            )),
            0 | 1 => s.links.push((
                u.int_in_range(0..=5)?,
                u.int_in_range(0..=600_000)?,
                u.arbitrary()?,
            )),
            2 => s.control = Some(ControlFault::Break(at)),
            3 => s.control = Some(ControlFault::Silence(at)),
            4 => s.read_error = Some(u.int_in_range(0..=40)?),
            _ => {
                if u.arbitrary()? {
                    s.write_error = Some(u.int_in_range(0..=40)?);
                } else {
                    s.refuse = true;
                }
            }
        }
    }
    Ok(s)
}

/// What the sink holds from an earlier attempt of files of `sizes` (entry `i + 1`
/// for size `i`): whole files, or pieces of files of two chunks or more (never the
/// last piece, which always travels again), as the source has them or changed.
fn held(u: &mut Unstructured<'_>, sizes: &[usize]) -> Result<Vec<(u32, Had)>> {
    let chunk = CHUNK as usize;
    let mut held = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let n = size.div_ceil(chunk) as u64;
        let pieces = |u: &mut Unstructured<'_>| -> Result<Vec<u64>> {
            let mut p = Vec::new();
            for k in 0..n - 1 {
                if u.arbitrary()? {
                    p.push(k);
                }
            }
            if p.is_empty() {
                p.push(0);
            }
            Ok(p)
        };
        let had = match u.int_in_range(0..=3u8)? {
            1 if size > 0 => Had::Done,
            2 if n >= 2 && size >= chunk => Had::Pieces(pieces(u)?),
            3 if n >= 2 && size >= chunk => Had::Changed(pieces(u)?),
            _ => continue,
        };
        held.push((i as u32 + 1, had));
    }
    Ok(held)
}

/// Runs a session from arbitrary bytes and checks how it ended (see the module's
/// docs).
pub fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let s = script(u)?;
    let r = run(&s);
    let bound = Duration::from_secs(60);
    assert!(
        r.ends.source_at < bound && r.ends.sink_at < bound,
        "ended at {:?} / {:?} for {s:?}",
        r.ends.source_at,
        r.ends.sink_at
    );
    let (source_ok, sink_ok) = (r.ends.source.is_ok(), r.ends.sink.is_ok());
    match &s.wants {
        Some(wants) if sink_ok => {
            let wanted: BTreeSet<u64> = wants.iter().flat_map(|w| w.1.clone()).collect();
            let written: BTreeSet<u64> = r.writes().keys().copied().collect();
            assert_eq!(written, wanted, "{s:?}");
        }
        Some(_) => {}
        None if source_ok || sink_ok => {
            assert_eq!(r.missing(), Vec::<usize>::new(), "{s:?}");
        }
        None => {}
    }
    let sent = |k: Option<u64>| s.wants.is_none() && k.is_some_and(|k| k < r.chunks);
    let sent = |k| s.held.is_empty() && sent(k);
    if s.refuse || sent(s.read_error) || sent(s.write_error) {
        assert!(!source_ok && !sink_ok, "an end finished: {s:?}");
    }
    let streams_left =
        s.links.iter().map(|l| l.0).collect::<BTreeSet<_>>().len() < usize::from(s.streams);
    let clean = s.control.is_none() && !s.refuse && s.read_error.is_none() && s.wire.is_empty();
    // A stream silent in the middle of a chunk holds a buffer at each end for good;
    // with no more buffers than streams (below the defaults, `streams + threads + 2`)
    // the others may starve until the stall limit fails the session.
    let silent = s.links.iter().any(|l| l.2);
    let clean = clean && !(silent && s.buffers.0.min(s.buffers.1) <= usize::from(s.streams));
    if streams_left && clean && s.write_error.is_none() {
        assert!(
            source_ok && sink_ok,
            "{:?} / {:?} for {s:?}",
            r.ends.source.as_ref().err(),
            r.ends.sink.as_ref().err()
        );
    }
    Ok(())
}
