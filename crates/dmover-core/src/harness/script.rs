//! Scripted sessions on the production drivers ([`super::pair`]): what moves (files
//! of given sizes, whole or as a growing manifest's parts, or a mount's chunk
//! requests) and what goes wrong (streams cut or silenced, the control connection
//! broken or silenced, a chunk the storage cannot read or write, a refused
//! credential), run on a paused clock with memory storage; the outcome at both ends,
//! and what the sink holds. The pair schedules (`harness/props.rs`) and the
//! `drive_pair` fuzz target run them (the latter through the `testing` feature).

use super::pair::{CHUNK, ControlFault, Ends, Manifest, Wire, paused, session, whole};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use dmover_proto::control::Summary;
use dmover_proto::data::DigestEntry;
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::Timing;
use dmover_store::{Sink, Source};
use tokio::sync::mpsc;

use crate::diskpool::DiskPool;
use crate::drive::*;
use crate::error::Result;

use dmover_net::fault::FaultPlan;
use dmover_net::memnet::{WireFault, WireFaults};
use dmover_proto::control::{Have, Plan};
use dmover_proto::manifest::EntryMeta;
use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};
use dmover_proto::session::Limits;
use dmover_proto::session::features;
use dmover_store::fault::Failing;
use dmover_store::mem::{Left, MemSink, MemSource};
use dmover_store::resume::Held;

pub type Src = Failing<MemSource>;

impl SourceStore for Src {
    /// Checks the pieces the sink holds against the data, as a file source does.
    fn resume_from(&mut self, peer: &str, parts: &[Have]) -> Result<Plan> {
        let chunk = self.layout().chunk_size() as u32;
        let inner = self
            .get_mut()
            .expect("the source's storage is not shared yet");
        let mut held = Held::from_have(inner.entries(), chunk, parts)
            .map_err(|e| crate::Error::protocol(peer, format!("resume: {e}")))?;
        let plan = Plan {
            stale: inner.check_held(&held),
        };
        held.apply(&plan)
            .map_err(|e| crate::Error::protocol("this side", e))?;
        inner.resume(&held)?;
        Ok(plan)
    }
}

/// What an earlier attempt left at the sink of one file (`Script::held`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Had {
    /// The whole file, as the source has it.
    Done,
    /// These pieces (chunk-sized, by index), as the source has them.
    Pieces(Vec<u64>),
    /// These pieces, with bytes the source no longer has (the file changed since).
    Changed(Vec<u64>),
}

/// The sink's storage: memory, laid out for the whole manifest at once and failing
/// as the script says; of a growing manifest it takes each part as it comes (the
/// chunks of later parts are known to it from the start).
pub struct Dst {
    store: Failing<MemSink>,
    /// Copies written of each chunk.
    writes: Arc<parking_lot::Mutex<std::collections::BTreeMap<u64, u32>>>,
    /// A request-driven session's: it ends with what was asked for.
    on_demand: bool,
    /// Entries and chunks of the manifest so far.
    known: std::sync::atomic::AtomicUsize,
    chunks: std::sync::atomic::AtomicU64,
    /// Where the storage is shown once the session may write (after the resume).
    slot: Arc<parking_lot::Mutex<Option<Arc<MemSink>>>>,
    /// The metadata the source sent (feature `METADATA`).
    meta: Arc<parking_lot::Mutex<Vec<EntryMeta>>>,
}

impl Sink for Dst {
    fn layout(&self) -> Arc<dmover_proto::layout::Layout> {
        self.store.layout()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        let known = self.chunks.load(Relaxed);
        Box::new(self.store.chunks().filter(move |&k| k < known))
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        // A request-driven sink may be sent a chunk again (when asked again): a cache
        // keeps its first copy; memory storage checks each file's pieces once.
        let again = self.on_demand && self.writes.lock().contains_key(&k);
        if !again {
            self.store.write_chunk(k, buf, digests, crc)?;
        }
        *self.writes.lock().entry(k).or_default() += 1;
        Ok(())
    }

    fn finish(&self) -> dmover_store::Result<Summary> {
        if self.on_demand {
            let chunks = self.writes.lock().values().map(|&n| u64::from(n)).sum();
            return Ok(Summary {
                chunks,
                ..Summary::default()
            });
        }
        self.store.finish()
    }

    fn abort(&self) {
        self.store.abort();
    }
}

impl SinkStore for Dst {
    fn grow(&self, part: GrownPart) -> Result<()> {
        let all = self.store.get_ref().entries();
        let from = self.known.load(Relaxed);
        let to = from + part.entries.len();
        assert_eq!(
            all.get(from..to),
            Some(&part.entries[..]),
            "the part's entries"
        );
        self.known.store(to, Relaxed);
        self.chunks.store(part.chunks.end, Relaxed);
        Ok(())
    }

    fn layout_chunks(&self) -> u64 {
        self.chunks.load(Relaxed)
    }

    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        &self.store.get_ref().entries()[..self.known.load(Relaxed)]
    }

    fn held(&self) -> Held {
        self.store.get_ref().held()
    }

    fn resume(&mut self, held: &Held) -> Result<()> {
        if !held.is_empty() {
            let store = self
                .store
                .get_mut()
                .expect("the sink's storage is not shared yet");
            store.resume(held)?;
            self.chunks.store(store.layout().n_chunks(), Relaxed);
        }
        *self.slot.lock() = Some(self.store.shared());
        Ok(())
    }

    fn set_meta(&mut self, meta: Vec<EntryMeta>) {
        *self.meta.lock() = meta;
    }
}

/// What moves and what goes wrong in one session.
#[derive(Debug, Clone, Default)]
pub struct Script {
    pub push: bool,
    pub streams: u16,
    pub checksum: bool,
    /// The files' sizes.
    pub sizes: Vec<usize>,
    /// Stream (in the order the acceptor took them) cut, or silenced, once this many
    /// payload bytes passed on it; `true`: silenced.
    pub links: Vec<(usize, u64, bool)>,
    pub control: Option<ControlFault>,
    pub refuse: bool,
    /// The chunk the source cannot read, and the one the sink cannot write.
    pub read_error: Option<u64>,
    pub write_error: Option<u64>,
    /// Chunk buffers of the source and the sink.
    pub buffers: (usize, usize),
    /// Milliseconds each byte takes one way.
    pub latency: u64,
    /// Early data: the dialer's streams join, and a push's chunks go, with its first
    /// flight.
    pub early: bool,
    /// (a request-driven pull, feature `RANGES`: a mount's session) The chunks the
    /// sink asks for, in turns, each this many milliseconds after the one before; it
    /// closes the session once it has them all.
    pub wants: Option<Vec<(u64, Vec<u64>)>>,
    /// (a growing manifest, feature `GROWING_MANIFEST`; `sizes` then unused) Its
    /// parts: each one file of this many whole chunks (none for 0), coming this many
    /// milliseconds after the one before.
    pub parts: Vec<(u64, u64)>,
    /// (a resume) What the sink holds of manifest entries from an earlier attempt.
    pub held: Vec<(u32, Had)>,
    /// The dialer's options say `resume` (implied by `held`) and `continue_on_error`.
    pub resume: bool,
    pub continue_on_error: bool,
    /// Features offered besides those the script implies.
    pub features: u64,
    /// (feature TUNING, implied) The streams the source's tuner starts with.
    pub tuned: Option<u16>,
    /// The source's metadata of its entries (sent with feature `METADATA`).
    pub meta: Vec<EntryMeta>,
    /// The sink's limit of manifest entries.
    pub max_entries: Option<u64>,
    /// Bytes per second each data stream carries each way.
    pub rate: Option<u64>,
    /// Data streams (by number) that go wrong below their records.
    pub wire: Vec<(u16, WireFault)>,
    /// The session's limits (default: [`short_timing`]).
    pub timing: Option<Timing>,
    /// (feature LIMITS) The dialer's limits.
    pub asks: dmover_proto::control::SessionLimits,
    /// Milliseconds the control connection takes one way beyond `latency`.
    pub control_delay: u64,
}

impl Script {
    /// A push or a pull of files of `sizes` over `streams` streams, checksummed, with
    /// six chunk buffers at the source and four at the sink, nothing going wrong.
    pub fn files(push: bool, streams: u16, sizes: &[usize]) -> Script {
        Script {
            push,
            streams,
            checksum: true,
            sizes: sizes.to_vec(),
            buffers: (6, 4),
            ..Script::default()
        }
    }
}

/// How a script ended: both ends, the data sent, and what was seen of it.
pub struct Ran {
    pub ends: Ends<Src, Dst>,
    pub data: Vec<Vec<u8>>,
    pub chunks: u64,
    pub seen: Seen,
}

/// What a session's storage and streams saw, whatever became of the session.
#[derive(Default)]
pub struct Seen {
    /// Copies written of each chunk.
    pub writes: Arc<parking_lot::Mutex<std::collections::BTreeMap<u64, u32>>>,
    /// The sink's storage, once data may be written to it.
    pub sink: Arc<parking_lot::Mutex<Option<Arc<MemSink>>>>,
    /// Each data stream's plan (with the payload bytes it carried), in the order the
    /// acceptor took them.
    pub streams: Arc<parking_lot::Mutex<Vec<Arc<FaultPlan>>>>,
    /// The metadata the sink was given.
    pub meta: Arc<parking_lot::Mutex<Vec<EntryMeta>>>,
}

impl Ran {
    /// Copies written of each chunk.
    pub fn writes(&self) -> std::collections::BTreeMap<u64, u32> {
        self.seen.writes.lock().clone()
    }

    /// Entries whose data the sink does not hold complete and right.
    pub fn missing(&self) -> Vec<usize> {
        let Some(sink) = self.seen.sink.lock().clone() else {
            return (1..self.data.len()).collect();
        };
        (1..self.data.len())
            .filter(|&i| sink.file(i as u32).as_ref() != Some(&self.data[i]))
            .collect()
    }

    /// Payload bytes each data stream carried.
    pub fn moved(&self) -> Vec<u64> {
        self.seen.streams.lock().iter().map(|p| p.moved()).collect()
    }
}

/// Files of every shape the layout cuts differently: empty, one byte, unaligned, one
/// chunk exactly, several chunks and a tail, aligned and not.
pub const SIZES: [usize; 8] = [0, 1, 4095, 65_536, 3 * 65_536 + 17, 200_000, 300, 500_000];

/// A directory `d` holding a file of each size of `sizes` (`f0`, `f1`, ...) and their
/// data (entry 0, the directory, has none).
pub fn dataset(sizes: &[usize]) -> (Vec<Entry>, Vec<Vec<u8>>) {
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
pub fn short_timing() -> Timing {
    Timing {
        stuck: Duration::from_secs(5),
        join: Duration::from_secs(10),
        handshake: Duration::from_secs(10),
        ..timing(Duration::from_secs(1), Duration::from_secs(10))
    }
}

/// The file sizes of a growing manifest's parts (`Script::parts`).
pub fn part_sizes(parts: &[(u64, u64)]) -> Vec<usize> {
    let chunk = CHUNK as usize;
    parts
        .iter()
        .filter(|p| p.0 > 0)
        .map(|p| p.0 as usize * chunk)
        .collect()
}

/// The feed of a growing manifest: `entries` (the directory and one file per part
/// that has data, as [`part_sizes`] gives them) cut into `parts`, each part given to
/// the source after its delay (on the paused clock).
pub fn grow(entries: Vec<Entry>, parts: Vec<(u64, u64)>) -> Manifest {
    Box::new(move |_| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut files = entries.into_iter();
            let mut first = files.next().into_iter().collect::<Vec<Entry>>();
            let (mut totals, mut chunks) = (Totals::default(), 0);
            for (i, &(n, delay)) in parts.iter().enumerate() {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let mut entries = std::mem::take(&mut first);
                if n > 0 {
                    entries.extend(files.next());
                }
                totals = totals.plus(Totals::of(&entries));
                chunks += n;
                let part = GrowPart {
                    entries,
                    totals,
                    chunks,
                    last: i + 1 == parts.len(),
                    durable: None,
                    times: Vec::new(),
                    meta: Vec::new(),
                    sent: false,
                    sparse: Vec::new(),
                };
                if tx.send(part).is_err() {
                    return;
                }
            }
        });
        Some(rx)
    })
}

/// The sink's storage for `s`: memory laid out for `entries`, holding what the script
/// says an earlier attempt left, failing as it says; shown in `slot` once resumed.
fn sink_store(s: &Script, entries: Vec<Entry>, data: &[Vec<u8>], seen: &Seen) -> Prepare<Dst> {
    let (checksum, write_error, on_demand) = (s.checksum, s.write_error, s.wants.is_some());
    let left = left_by(&s.held, data);
    let (slot, writes, meta) = (seen.sink.clone(), seen.writes.clone(), seen.meta.clone());
    Box::new(move |first, chunk, _| {
        let mut mem = MemSink::new(entries, chunk, checksum)?;
        for (e, l) in left {
            mem.leave(e, l);
        }
        // The first part's chunks: those of the manifest it begins.
        let chunks = dmover_proto::layout::Layout::new(&first, chunk)
            .unwrap()
            .n_chunks();
        Ok(Dst {
            store: Failing::new(Arc::new(mem), write_error),
            writes,
            on_demand,
            known: first.len().into(),
            chunks: chunks.into(),
            slot,
            meta,
        })
    })
}

/// What the sink holds of each entry in `held`, of the data `data`.
fn left_by(held: &[(u32, Had)], data: &[Vec<u8>]) -> Vec<(u32, Left)> {
    let chunk = CHUNK as usize;
    let piece = |e: u32, i: u64| {
        let d = &data[e as usize];
        let from = i as usize * chunk;
        d[from..d.len().min(from + chunk)].to_vec()
    };
    held.iter()
        .map(|(e, h)| {
            let left = match h {
                Had::Done => Left::Done(data[*e as usize].clone()),
                Had::Pieces(p) => Left::Pieces(p.iter().map(|&i| (i, piece(*e, i))).collect()),
                Had::Changed(p) => Left::Pieces(
                    p.iter()
                        .map(|&i| {
                            let mut b = piece(*e, i);
                            b[0] ^= 1;
                            (i, b)
                        })
                        .collect(),
                ),
            };
            (*e, left)
        })
        .collect()
}

/// The features `s` offers: those it names and those its shape implies.
fn features_of(s: &Script) -> u64 {
    let mut f = s.features;
    if s.wants.is_some() {
        f |= features::RANGES;
    } else if !s.parts.is_empty() {
        f |= features::GROWING_MANIFEST;
    }
    if s.tuned.is_some() {
        f |= features::TUNING;
    }
    f
}

/// The wiring of `s`'s session; each data stream's plan goes to `streams` as the
/// acceptor takes it.
fn wire_of(s: &Script, streams: Arc<parking_lot::Mutex<Vec<Arc<FaultPlan>>>>) -> Wire {
    let links = s.links.clone();
    let faults = s.wire.clone();
    Wire {
        push: s.push,
        streams: s.streams,
        checksum: s.checksum,
        features: features_of(s),
        timing: s.timing.unwrap_or_else(short_timing),
        links: Arc::new(move |n| {
            let plan = match links.iter().find(|l| l.0 == n) {
                Some(&(_, after, true)) => FaultPlan::silence(after),
                Some(&(_, after, false)) => FaultPlan::new(Some((after, false))),
                None => FaultPlan::new(None),
            };
            streams.lock().push(plan.clone());
            Some(plan)
        }),
        control: s.control,
        refuse: s.refuse,
        disk: Arc::new(DiskPool::inline()),
        buffers: s.buffers,
        latency: Duration::from_millis(s.latency),
        early: s.early,
        limits: Limits {
            max_entries: s.max_entries.unwrap_or(Limits::default().max_entries),
            ..Limits::default()
        },
        tuned_start: s.tuned.unwrap_or(crate::session::TUNED_START),
        resume: s.resume || !s.held.is_empty(),
        continue_on_error: s.continue_on_error,
        rate: s.rate,
        wire: (!faults.is_empty()).then(|| -> WireFaults {
            Arc::new(move |n| faults.iter().find(|f| f.0 == n).map(|f| f.1))
        }),
        asks: s.asks.clone(),
        control_delay: Duration::from_millis(s.control_delay),
    }
}

/// Runs `s` on a paused clock, with a disk pool that works where jobs are queued.
pub fn run(s: &Script) -> Ran {
    let sizes = if s.parts.is_empty() {
        s.sizes.clone()
    } else {
        part_sizes(&s.parts)
    };
    let (entries, data) = dataset(&sizes);
    let inner = MemSource::new(entries.clone(), data.clone(), CHUNK, s.checksum).unwrap();
    let chunks = chunk_set(inner.chunks());
    let n_chunks = inner.chunks().count() as u64;
    let seen = Seen::default();
    let source = Failing::new(Arc::new(inner), s.read_error);
    let prepare = sink_store(s, entries.clone(), &data, &seen);
    let mut manifest = if s.parts.is_empty() {
        whole(entries, chunks)
    } else {
        grow(entries, s.parts.clone())
    };
    if !s.meta.is_empty() {
        let (meta, queue) = (s.meta.clone(), manifest);
        manifest = Box::new(move |m| {
            m.push_meta(meta);
            queue(m)
        });
    }
    let wire = wire_of(s, seen.streams.clone());
    let (demand, owner) = match &s.wants {
        Some(wants) => {
            let (d, owner) = owner(wants.clone());
            (Some(d), Some(owner))
        }
        None => (None, None),
    };
    let ends = paused().block_on(async {
        let ran = session(wire, source, prepare, manifest, demand);
        let owning = async {
            if let Some(o) = owner {
                o.await;
            }
        };
        let (ends, ()) = tokio::time::timeout(Duration::from_secs(3600), async {
            tokio::join!(ran, owning)
        })
        .await
        .expect("the session ends within an hour of the paused clock");
        ends
    });
    Ran {
        ends,
        data,
        chunks: n_chunks,
        seen,
    }
}

/// The owner of a request-driven sink: once the sink is ready, asks for each turn of
/// `wants` after its delay, and closes the session once every chunk asked for was
/// written (or the session ended).
pub fn owner(wants: Vec<(u64, Vec<u64>)>) -> (Demand<Dst>, impl Future<Output = ()>) {
    let (asks, asks_rx) = mpsc::unbounded_channel();
    let (events, mut events_rx) = mpsc::unbounded_channel();
    let demand = Demand {
        asks: asks_rx,
        events,
    };
    let owning = async move {
        let Some(DemandEvent::Ready(..)) = events_rx.recv().await else {
            return;
        };
        let mut wanted = std::collections::BTreeSet::new();
        let mut written = std::collections::BTreeSet::new();
        for (delay, ks) in wants {
            let until = tokio::time::Instant::now() + Duration::from_millis(delay);
            // Hear what is written meanwhile.
            while let Ok(Some(ev)) = tokio::time::timeout_at(until, events_rx.recv()).await {
                if let DemandEvent::Written(k) = ev {
                    written.insert(k);
                }
            }
            let ranges = ks.iter().map(|&k| k..k + 1).collect();
            wanted.extend(ks);
            if asks.send(DemandAsk::Want(ranges)).is_err() {
                return;
            }
        }
        while !wanted.is_subset(&written) {
            match events_rx.recv().await {
                Some(DemandEvent::Written(k)) => {
                    written.insert(k);
                }
                Some(_) => {}
                None => return,
            }
        }
        let _ = asks.send(DemandAsk::Close);
    };
    (demand, owning)
}
