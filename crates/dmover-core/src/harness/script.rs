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
use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};
use dmover_proto::session::features;
use dmover_store::fault::Failing;
use dmover_store::mem::{MemSink, MemSource};

pub type Src = Failing<MemSource>;

impl SourceStore for Src {}

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
}

/// How a script ended: both ends, the data sent, and the sink's storage (whatever
/// became of the session).
pub struct Ran {
    pub ends: Ends<Src, Dst>,
    pub writes: Arc<parking_lot::Mutex<std::collections::BTreeMap<u64, u32>>>,
    pub data: Vec<Vec<u8>>,
    pub sink: Arc<parking_lot::Mutex<Option<Arc<MemSink>>>>,
    pub chunks: u64,
}

impl Ran {
    /// Entries whose data the sink does not hold complete and right.
    pub fn missing(&self) -> Vec<usize> {
        let Some(sink) = self.sink.lock().clone() else {
            return (1..self.data.len()).collect();
        };
        (1..self.data.len())
            .filter(|&i| sink.file(i as u32).as_ref() != Some(&self.data[i]))
            .collect()
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

/// Runs `s` on a paused clock, with a disk pool that works where jobs are queued.
pub fn run(s: &Script) -> Ran {
    let sizes = if s.parts.is_empty() {
        s.sizes.clone()
    } else {
        part_sizes(&s.parts)
    };
    let (entries, data) = dataset(&sizes);
    let checksum = s.checksum;
    let inner = MemSource::new(entries.clone(), data.clone(), CHUNK, checksum).unwrap();
    let chunks = chunk_set(inner.chunks());
    let n_chunks = inner.chunks().count() as u64;
    let source = Failing::new(Arc::new(inner), s.read_error);
    let slot = Arc::new(parking_lot::Mutex::new(None));
    let writes = Arc::new(parking_lot::Mutex::new(std::collections::BTreeMap::new()));
    let (kept, write_error, all) = (slot.clone(), s.write_error, entries.clone());
    let (counted, on_demand) = (writes.clone(), s.wants.is_some());
    let prepare: Prepare<Dst> = Box::new(move |first, chunk, _| {
        let mem = Arc::new(MemSink::new(all, chunk, checksum)?);
        // The first part's chunks: those of the manifest it begins.
        let chunks = dmover_proto::layout::Layout::new(&first, chunk)
            .unwrap()
            .n_chunks();
        *kept.lock() = Some(mem.clone());
        Ok(Dst {
            store: Failing::new(mem, write_error),
            writes: counted,
            on_demand,
            known: first.len().into(),
            chunks: chunks.into(),
        })
    });
    let (features, manifest) = if s.wants.is_some() {
        (features::RANGES, whole(entries, chunks))
    } else if s.parts.is_empty() {
        (0, whole(entries, chunks))
    } else {
        let growing = dmover_proto::session::features::GROWING_MANIFEST;
        (growing, grow(entries, s.parts.clone()))
    };
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
        features,
        timing: short_timing(),
        links: Arc::new(move |n| {
            let found = plans.iter().find(|(i, _)| *i == n);
            found.map(|(_, p)| p.clone())
        }),
        control: s.control,
        refuse: s.refuse,
        disk: Arc::new(DiskPool::inline()),
        buffers: s.buffers,
        latency: Duration::from_millis(s.latency),
        early: s.early,
    };
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
        writes,
        data,
        sink: slot,
        chunks: n_chunks,
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
