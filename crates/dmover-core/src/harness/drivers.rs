//! Both role drivers against each other in one process, on the harness of
//! [`super::pair`] (in-memory control and data streams, the production dialer and
//! acceptor), with memory storage: everything but sockets and files is the code a
//! real session runs.

use std::sync::Arc;
use std::time::Duration;

use dmover_proto::control::ErrorCode;
use dmover_proto::data::DigestEntry;
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::SourceSession;
use dmover_store::Source;
use tokio::sync::mpsc;

use crate::drive::*;
use crate::error::{Error, Result};

use super::pair::{CHUNK, Wire, session};
use super::script::SIZES;
use dmover_net::fault::FaultPlan;
use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};
use dmover_store::mem::{MemSink, MemSource};

/// The directory of files of every shape the layout cuts differently.
fn dataset() -> (Vec<Entry>, Vec<Vec<u8>>) {
    super::script::dataset(&SIZES)
}

/// Pushes `source` into a memory sink over `streams` streams: the source dials, the
/// sink accepts.
async fn push<K: SourceStore + Entries>(
    source: K,
    checksum: bool,
    streams: u16,
    plan: Option<Arc<FaultPlan>>,
) -> (Result<SourceRun<K>>, Result<SinkRun<MemSink>>) {
    let entries = source.layout_entries().to_vec();
    let chunks = chunk_set(source.chunks());
    let prepare: Prepare<MemSink> =
        Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, checksum)?));
    pair(source, checksum, streams, plan, 0, prepare, move |m| {
        m.push_manifest(&entries);
        m.end_manifest(Totals::of(&entries), chunks);
        None
    })
    .await
}

/// A push between both drivers ([`super::pair`]): `source` dials with `features`,
/// `manifest` queues the manifest on its machine (or returns the feed of a growing
/// one), the sink accepts with the storage `prepare` makes, `plan` cuts the sink's
/// ends of the data streams.
async fn pair<K: SourceStore, S: SinkStore>(
    source: K,
    checksum: bool,
    streams: u16,
    plan: Option<Arc<FaultPlan>>,
    features: u64,
    prepare: Prepare<S>,
    manifest: impl FnOnce(&mut SourceSession<Fault>) -> Option<mpsc::UnboundedReceiver<GrowPart>>
    + Send
    + 'static,
) -> (Result<SourceRun<K>>, Result<SinkRun<S>>) {
    let mut wire = Wire::push(streams, checksum).with_plan(plan);
    wire.features = features;
    let ends = session(wire, source, prepare, Box::new(manifest), None).await;
    (ends.source, ends.sink)
}

/// A manifest that grows in parts, some sent before the sink is prepared and some
/// while data flows, over the memory test's storage: every chunk of every part
/// arrives once, and the session ends after the last part.
#[test]
fn a_growing_manifest_through_both_drivers() {
    use crate::memtest::{Discard, Pattern};
    use dmover_proto::session::features::GROWING_MANIFEST;
    for (checksum, cut) in [(true, None), (false, None), (true, Some(300_000))] {
        let plan = cut.map(|at| FaultPlan::new(Some((at, false))));
        let (tx, rx) = mpsc::unbounded_channel();
        let source = Pattern::new(CHUNK, checksum).unwrap();
        let prepare: Prepare<Discard> =
            Box::new(move |entries, chunk, _| Discard::new(entries, chunk, checksum));
        let rt = runtime();
        let parts = [3u64, 1, 7, 0, 5];
        let feeding = async {
            let mut totals = Totals::default();
            let mut chunks = 0;
            for (i, &n) in parts.iter().enumerate() {
                let mut entries = Vec::new();
                if n > 0 {
                    entries.push(Entry {
                        parent: NO_PARENT,
                        name: format!("p{i}").into_bytes(),
                        kind: EntryKind::File {
                            size: n * u64::from(CHUNK),
                        },
                        mode: 0o644,
                        mtime: Mtime { sec: 0, nsec: 0 },
                    });
                }
                totals.entries += entries.len() as u64;
                totals.files += entries.len() as u64;
                totals.bytes += n * u64::from(CHUNK);
                chunks += n;
                let last = i + 1 == parts.len();
                tx.send(GrowPart {
                    entries,
                    totals,
                    chunks,
                    last,
                    durable: None,
                    times: Vec::new(),
                    meta: Vec::new(),
                    sent: false,
                    sparse: Vec::new(),
                })
                .unwrap();
                tokio::time::sleep(Duration::from_millis(if i == 0 { 0 } else { 20 })).await;
            }
        };
        let session = pair(
            source,
            checksum,
            3,
            plan.clone(),
            GROWING_MANIFEST,
            prepare,
            |_| Some(rx),
        );
        let ((sent, received), ()) = rt.block_on(async { tokio::join!(session, feeding) });
        let sent = sent.unwrap();
        let r = received.unwrap();
        let total: u64 = parts.iter().sum();
        assert_eq!(r.summary.chunks, total, "each chunk written once");
        assert_eq!(r.summary.bytes, r.summary.chunks * u64::from(CHUNK));
        assert_eq!(r.summary.verified, checksum);
        assert_eq!(sent.summary, r.summary);
        if let Some(p) = plan {
            assert!(p.cut_done());
            assert_eq!(sent.stats.streams_lost, 1, "{:?}", sent.stats);
        }
    }
}

/// A sink whose storage cannot grow refuses a growing manifest's later parts: the
/// session fails at both ends with that reason.
#[test]
fn storage_that_cannot_grow_fails_a_growing_session() {
    use crate::memtest::Pattern;
    use dmover_proto::session::features::GROWING_MANIFEST;
    let (tx, rx) = mpsc::unbounded_channel();
    let source = Pattern::new(CHUNK, true).unwrap();
    let prepare: Prepare<MemSink> =
        Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, true)?));
    let file = |i: u64| Entry {
        parent: NO_PARENT,
        name: format!("p{i}").into_bytes(),
        kind: EntryKind::File {
            size: u64::from(CHUNK),
        },
        mode: 0o644,
        mtime: Mtime { sec: 0, nsec: 0 },
    };
    let mut t = Totals {
        entries: 1,
        files: 1,
        bytes: u64::from(CHUNK),
        ..Totals::default()
    };
    tx.send(GrowPart {
        entries: vec![file(0)],
        totals: t,
        chunks: 1,
        last: false,
        durable: None,
        times: Vec::new(),
        meta: Vec::new(),
        sent: false,
        sparse: Vec::new(),
    })
    .unwrap();
    t.entries += 1;
    t.files += 1;
    t.bytes += u64::from(CHUNK);
    tx.send(GrowPart {
        entries: vec![file(1)],
        totals: t,
        chunks: 2,
        last: true,
        durable: None,
        times: Vec::new(),
        meta: Vec::new(),
        sent: false,
        sparse: Vec::new(),
    })
    .unwrap();
    let (sent, received) = runtime().block_on(pair(
        source,
        true,
        2,
        None,
        GROWING_MANIFEST,
        prepare,
        |_| Some(rx),
    ));
    let e = received.err().expect("the sink refuses").to_string();
    assert!(e.contains("cannot take a growing manifest"), "{e}");
    let e = sent.err().expect("the source hears it").to_string();
    assert!(e.contains("cannot take a growing manifest"), "{e}");
}

/// The manifest a memory source was made with.
trait Entries {
    fn layout_entries(&self) -> &[Entry];
}

impl Entries for MemSource {
    fn layout_entries(&self) -> &[Entry] {
        self.entries()
    }
}

/// The harness's runtime: one thread, tokio's clock paused ([`super::pair::paused`]).
fn runtime() -> tokio::runtime::Runtime {
    super::pair::paused()
}

#[test]
fn memory_source_to_memory_sink_through_both_drivers() {
    let (entries, data) = dataset();
    let total: usize = data.iter().map(Vec::len).sum();
    for checksum in [true, false] {
        let source = MemSource::new(entries.clone(), data.clone(), CHUNK, checksum).unwrap();
        let (sent, received) = runtime().block_on(push(source, checksum, 3, None));
        let sent = sent.unwrap();
        assert_eq!(sent.stats.streams_lost, 0);
        let r = received.unwrap();
        assert_eq!(r.stats.duplicates, 0);
        assert_eq!(
            sent.summary, r.summary,
            "both ends report the sink's summary"
        );
        assert_eq!(r.report.streams_lost, 0);
        assert_eq!(
            (
                r.summary.bytes,
                r.summary.files,
                r.summary.dirs,
                r.summary.verified
            ),
            (total as u64, 8, 1, checksum)
        );
        for (i, want) in data.iter().enumerate().skip(1) {
            assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
        }
    }
}

/// A push whose first part went in the first flight (`GrowPart::sent`) in a
/// session that does not take parts (no `STREAMED` offered): the rest follows as
/// one manifest, and every file arrives.
#[test]
fn a_streamed_push_to_a_sink_without_parts_goes_whole() {
    use dmover_proto::session::features::GROWING_MANIFEST;
    let (entries, data) = dataset();
    let total: usize = data.iter().map(Vec::len).sum();
    let source = MemSource::new(entries.clone(), data.clone(), CHUNK, true).unwrap();
    let prepare: Prepare<MemSink> =
        Box::new(move |entries, chunk, _| Ok(MemSink::new(entries, chunk, true)?));
    let (first, rest) = entries.split_at(3);
    let mut parts = streamed_parts(first.to_vec(), 0, rest.to_vec(), &[3, 5], Vec::new());
    assert_eq!(parts.len(), 3);
    parts[0].sent = true;
    let first = first.to_vec();
    let (sent, received) = runtime().block_on(pair(
        source,
        true,
        3,
        None,
        GROWING_MANIFEST,
        prepare,
        move |m| {
            m.push_manifest(&first);
            let (tx, rx) = mpsc::unbounded_channel();
            for p in parts {
                let _ = tx.send(p);
            }
            Some(rx)
        },
    ));
    let r = received.unwrap();
    assert_eq!(sent.unwrap().summary, r.summary);
    assert_eq!(
        (r.summary.bytes, r.summary.files, r.summary.dirs),
        (total as u64, 8, 1)
    );
    for (i, want) in data.iter().enumerate().skip(1) {
        assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
    }
}

/// A stream cut in the middle of a chunk: the source sends its unacknowledged
/// chunks on the others, the sink keeps the first whole copy of each, and every
/// byte arrives.
#[test]
fn a_stream_cut_mid_chunk_is_survived() {
    let (entries, data) = dataset();
    let source = MemSource::new(entries, data.clone(), CHUNK, true).unwrap();
    let plan = FaultPlan::new(Some((100_000, false)));
    let (sent, received) = runtime().block_on(push(source, true, 3, Some(plan.clone())));
    assert!(plan.cut_done());
    let sent = sent.unwrap();
    let r = received.unwrap();
    assert_eq!(sent.stats.streams_lost, 1, "{:?}", sent.stats);
    assert!(sent.stats.chunks_resent >= 1, "{:?}", sent.stats);
    assert_eq!(r.report.streams_lost, 1);
    for (i, want) in data.iter().enumerate().skip(1) {
        assert_eq!(r.store.file(i as u32).as_ref(), Some(want), "entry {i}");
    }
}

/// A source whose bytes differ from what it hashed: the sink refuses the file with
/// the checksum error a disk sink gives, and both ends fail with its code.
#[test]
fn a_digest_mismatch_fails_the_transfer_at_both_ends() {
    let (entries, data) = dataset();
    let mut wrong = data.clone();
    wrong[5][70_000] ^= 1;
    // The source announces digests of `data` but sends `wrong`: a sink built for
    // checksums sees a CRC that matches the bytes sent and a file digest that does not.
    struct Lying(MemSource, MemSource);
    impl Source for Lying {
        fn layout(&self) -> std::sync::Arc<dmover_proto::layout::Layout> {
            self.0.layout()
        }
        fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
            self.0.chunks()
        }
        fn read_chunk(
            &self,
            k: u64,
            buf: &mut [u8],
            digests: &mut Vec<DigestEntry>,
        ) -> dmover_store::Result<dmover_store::ChunkRead> {
            let honest = self.0.read_chunk(k, buf, digests)?;
            let mut ignored = Vec::new();
            let sent = self.1.read_chunk(k, buf, &mut ignored)?;
            Ok(dmover_store::ChunkRead {
                crc: sent.crc,
                n_digests: honest.n_digests,
                zeros: false,
            })
        }
        fn reread_chunk(
            &self,
            k: u64,
            buf: &mut [u8],
            crc: Option<u32>,
        ) -> dmover_store::Result<()> {
            self.1.reread_chunk(k, buf, crc)
        }
    }
    impl SourceStore for Lying {}
    impl Entries for Lying {
        fn layout_entries(&self) -> &[Entry] {
            self.0.entries()
        }
    }
    let source = Lying(
        MemSource::new(entries.clone(), data, CHUNK, true).unwrap(),
        MemSource::new(entries, wrong, CHUNK, true).unwrap(),
    );
    let (sent, received) = runtime().block_on(push(source, true, 2, None));
    let e = received.err().expect("the sink fails");
    assert_eq!(e.code(), ErrorCode::Checksum, "{e}");
    assert!(
        e.to_string()
            .starts_with("checksum mismatch: f4: received data has digest"),
        "{e}"
    );
    let e = sent.err().expect("the source fails");
    assert!(
        matches!(&e, Error::Remote { code: ErrorCode::Checksum, message, .. }
            if message.starts_with("checksum mismatch: f4")),
        "the source reports the sink's error: {e}"
    );
}
