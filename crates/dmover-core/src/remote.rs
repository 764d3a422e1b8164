//! Remote access (issue 14): read a server's files in place, chunk by chunk, without
//! copying them whole; `dmover mount` sits on this API. The write side is whole files:
//! [`StagedFile`] (written here, uploaded with staging + rename on the server), beside
//! `Client::remove_entry` and `Client::rename_remote` (docs/remote.md, "Write API").
//!
//! [`Remote::open`] starts an ordinary pull session of one path (a file or a tree: the
//! server walks it and sends the manifest as for `dmover cp`), whose sink answers the
//! manifest with `OnDemand` (feature `RANGES`, see docs/protocol.md): the server then
//! sends only the chunks asked for. [`Remote::stat`], [`Remote::list`] and
//! [`Remote::lookup`] answer from the manifest; [`Remote::read_at`] maps a byte range of
//! a file to chunks with the layout, asks for those it lacks (`Want`), waits for them and
//! returns the bytes. Chunks are kept in a bounded in-memory cache ([`ChunkCache`], LRU
//! by bytes), so a repeated read costs no round trip; a sequential read also asks for
//! the next [`RemoteOptions::read_ahead`] chunks of the file.
//!
//! ```text
//! read_at (any task) ──Want──▶ driver task (drive::sink_on_demand) ──Want──▶ server
//!      ▲                                                                      │
//!      └── waiter woken ◀── ChunkCache::write_chunk (disk thread) ◀── chunk ──┘
//! ```
//!
//! Bounds: a server that dies fails every pending and later read at once (the control
//! connection closes; at most [`dmover_proto::session::Timing::report_wait`], 2 s, is
//! spent waiting for its report); one that goes silent fails them after the heartbeat
//! silence, [`TransferOptions::heartbeat`] × 4, plus that wait ([`Remote::bound`]);
//! data streams that bring nothing while chunks are outstanding are lost after
//! 1.5 × [`TransferOptions::idle_timeout`] (a sink's limit, [`crate::drive::timing`]).
//! A read never waits for ever.
//!
//! [`TransferOptions::heartbeat`]: crate::session::TransferOptions::heartbeat
//! [`TransferOptions::idle_timeout`]: crate::session::TransferOptions::idle_timeout

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use dmover_proto::control::Part;
use dmover_proto::control::{ErrorCode, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::crc32c_append;
use dmover_proto::layout::{FileSlot, Layout};
use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT};
use dmover_proto::session::{Limits, PartRange, SinkSession, features};
use dmover_store::Sink;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::dialer::{Dialer, Prepared};
use crate::drive::{self, Demand, DemandAsk, DemandEvent, Fault, SinkStore};
use crate::engine::Run;
use crate::error::{Error, Result};

/// How a remote session caches and reads ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Most bytes of chunks kept in memory (the least recently used go first; the
    /// chunks a read is using stay until it is done, whatever the bound).
    pub cache_bytes: u64,
    /// Chunks asked for beyond a sequential read (one that starts at 0 or where the
    /// previous read of the file ended), within the file.
    pub read_ahead: u64,
}

pub use crate::dialer::UPLOAD_SLOTS;

/// How far a sequential read is read ahead by default, in bytes: enough to keep a
/// 1 Gbit/s link with a 60 ms round trip busy from one file.
pub const READ_AHEAD_BYTES: u64 = 8 << 20;

/// The chunks of `chunk` bytes that make [`READ_AHEAD_BYTES`] (at least 4).
pub fn read_ahead_chunks(chunk: u32) -> u64 {
    (READ_AHEAD_BYTES / u64::from(chunk.max(1))).max(4)
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            cache_bytes: 256 << 20,
            read_ahead: 4,
        }
    }
}

/// What a remote session did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Chunk requests (`Want` messages) sent.
    pub requests: u64,
    /// Chunks asked for, read-ahead included.
    pub chunks_wanted: u64,
    /// Chunks that arrived and were kept.
    pub chunks_received: u64,
    /// Chunks (or parts of chunks) a read found in the cache.
    pub cache_hits: u64,
    /// Chunks dropped from the cache for room.
    pub evicted: u64,
    /// Parts of chunks asked for (small random reads, feature `PARTS`).
    pub parts_wanted: u64,
    /// Parts that arrived.
    pub parts_received: u64,
}

type Data = Arc<[u8]>;
type Waiter = oneshot::Sender<std::result::Result<Data, Fault>>;

/// Chunks in memory, least recently used first out.
#[derive(Debug, Default)]
struct Lru {
    map: HashMap<u64, (Data, u64)>,
    order: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
}

impl Lru {
    fn get(&mut self, k: u64) -> Option<Data> {
        let (d, t) = self.map.get_mut(&k)?;
        self.order.remove(t);
        self.tick += 1;
        *t = self.tick;
        self.order.insert(self.tick, k);
        Some(d.clone())
    }

    fn contains(&self, k: u64) -> bool {
        self.map.contains_key(&k)
    }

    /// Keeps `d` as chunk `k`; drops the oldest others while over `cap`. Returns how
    /// many it dropped.
    fn insert(&mut self, k: u64, d: Data, cap: u64) -> u64 {
        if let Some((old, t)) = self.map.remove(&k) {
            self.order.remove(&t);
            self.bytes -= old.len() as u64;
        }
        self.tick += 1;
        self.bytes += d.len() as u64;
        self.map.insert(k, (d, self.tick));
        self.order.insert(self.tick, k);
        let mut dropped = 0;
        while self.bytes > cap && self.map.len() > 1 {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((d, _)) = self.map.remove(&old) {
                self.bytes -= d.len() as u64;
                dropped += 1;
            }
        }
        dropped
    }
}

/// Parts of chunks in memory (small random reads' bytes), oldest first out.
#[derive(Debug, Default)]
struct PartCache {
    by_chunk: HashMap<u64, Vec<(u64, Data)>>,
    order: std::collections::VecDeque<(u64, u64)>,
    bytes: u64,
}

impl PartCache {
    /// A part of chunk `k` that holds its bytes `from..to`, with its offset.
    fn get(&self, k: u64, from: u64, to: u64) -> Option<(Data, u64)> {
        self.by_chunk
            .get(&k)?
            .iter()
            .find(|(o, d)| *o <= from && to <= o + d.len() as u64)
            .map(|(o, d)| (d.clone(), *o))
    }

    /// Keeps `d`, bytes `offset..` of chunk `k`; drops the oldest parts while over
    /// `cap` (the newest stays).
    fn insert(&mut self, k: u64, offset: u64, d: Data, cap: u64) {
        if self.get(k, offset, offset + d.len() as u64).is_some() {
            return;
        }
        self.bytes += d.len() as u64;
        self.by_chunk.entry(k).or_default().push((offset, d));
        self.order.push_back((k, offset));
        while self.bytes > cap && self.order.len() > 1 {
            let Some((k, o)) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.by_chunk.get_mut(&k) {
                if let Some(i) = v.iter().position(|(x, _)| *x == o) {
                    self.bytes -= v.swap_remove(i).1.len() as u64;
                }
                if v.is_empty() {
                    self.by_chunk.remove(&k);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    cache: Lru,
    /// Parts that arrived, within an eighth of the cache's bound.
    part_cache: PartCache,
    /// Chunks asked for and not arrived, with the reads waiting for each.
    inflight: HashMap<u64, Vec<Waiter>>,
    /// Parts of chunks asked for and not arrived (the bytes a small random read
    /// needs), with the reads waiting for each. Parts are not cached.
    parts: HashMap<(u64, PartRange), Vec<Waiter>>,
    /// The session ended (its error, or that it was closed).
    failed: Option<Fault>,
    /// Where the last read of each file ended, and its read-ahead.
    last_end: HashMap<u32, Ahead>,
}

/// A file's sequential read-ahead.
#[derive(Debug, Clone, Copy)]
struct Ahead {
    /// Where the last read ended (a read starting there is sequential).
    end: u64,
    /// Chunks asked for beyond each read.
    window: u64,
    /// The offset from which a wait may double `window` again.
    grow_at: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cap: u64,
    requests: AtomicU64,
    wanted: AtomicU64,
    received: AtomicU64,
    hits: AtomicU64,
    evicted: AtomicU64,
    parts: AtomicU64,
    received_parts: AtomicU64,
}

impl Shared {
    /// Bytes `offset..` of chunk `k` are here: the reads waiting for them get them.
    fn part_arrived(&self, k: u64, offset: u32, d: Data) {
        let r = PartRange {
            offset,
            len: d.len() as u32,
        };
        let mut st = self.state.lock();
        self.received_parts.fetch_add(1, Relaxed);
        st.part_cache
            .insert(k, u64::from(offset), d.clone(), (self.cap / 8).max(1));
        for w in st.parts.remove(&(k, r)).unwrap_or_default() {
            let _ = w.send(Ok(d.clone()));
        }
    }

    /// Chunk `k` is here: the reads waiting for it get it, the cache keeps it.
    fn arrived(&self, k: u64, d: Data) {
        let mut st = self.state.lock();
        self.received.fetch_add(1, Relaxed);
        let dropped = st.cache.insert(k, d.clone(), self.cap);
        self.evicted.fetch_add(dropped, Relaxed);
        for w in st.inflight.remove(&k).unwrap_or_default() {
            let _ = w.send(Ok(d.clone()));
        }
    }

    /// The session ended: every waiting and later read fails with `f`.
    fn fail(&self, f: Fault) {
        let mut st = self.state.lock();
        if st.failed.is_none() {
            st.failed = Some(f.clone());
        }
        let f = st.failed.clone().expect("set");
        let parts: Vec<Vec<Waiter>> = st.parts.drain().map(|(_, ws)| ws).collect();
        for ws in st.inflight.drain().map(|(_, ws)| ws).chain(parts) {
            for w in ws {
                let _ = w.send(Err(f.clone()));
            }
        }
    }
}

/// The sink storage of a remote session: keeps the chunks that arrive in memory
/// (bounded, least recently used out) and hands them to the reads waiting for them.
/// It checks each chunk's CRC (with checksums on); whole-file digests are not checked,
/// since a file is seldom read whole.
#[derive(Debug)]
pub struct ChunkCache {
    entries: Vec<Entry>,
    layout: std::sync::Arc<Layout>,
    checksum: bool,
    shared: Arc<Shared>,
}

impl ChunkCache {
    fn new(entries: Vec<Entry>, chunk: u32, checksum: bool, shared: Arc<Shared>) -> Result<Self> {
        let layout = Layout::new(&entries, chunk)
            .map_err(|e| Error::protocol("the source", format!("layout: {e}")))?;
        Ok(ChunkCache {
            entries,
            layout: layout.into(),
            checksum,
            shared,
        })
    }

    /// The manifest's entries.
    pub fn manifest(&self) -> &[Entry] {
        &self.entries
    }

    /// Checks what came for chunk `k` (`what` names it: the chunk, or a part of it):
    /// its CRC against `crc_of` of its bytes (with checksums on), and that no file of
    /// it failed at the source (a failure marker in `digests`).
    fn check(
        &self,
        k: u64,
        what: impl Fn() -> String,
        crc_of: impl FnOnce() -> u32,
        crc: Option<u32>,
        digests: &[DigestEntry],
    ) -> dmover_store::Result<()> {
        use dmover_store::Error as E;
        if self.checksum {
            let want =
                crc.ok_or_else(|| E::protocol("the source", format!("{} carries no CRC", what())))?;
            let got = crc_of();
            if got != want {
                return Err(E::Checksum(format!(
                    "{} arrived corrupted (CRC32C {got:08x}, sent as {want:08x})",
                    what()
                )));
            }
        }
        if let Some(d) = digests.iter().find(|d| d.is_failure()) {
            return Err(E::protocol(
                "the source",
                format!("chunk {k}: file {} could not be read there", d.index()),
            ));
        }
        Ok(())
    }
}

impl Sink for ChunkCache {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        // Request-driven: nothing is expected unasked.
        Box::new(std::iter::empty())
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        let crc_of = || {
            self.layout.pieces(k).fold(0, |c, p| {
                crc32c_append(c, &buf[p.buf_offset..p.buf_offset + p.len])
            })
        };
        self.check(k, || format!("chunk {k}"), crc_of, crc, digests)?;
        let (lo, hi) = self.layout.chunk_bounds(k);
        self.shared.arrived(k, buf[..(hi - lo) as usize].into());
        Ok(())
    }

    fn write_part(
        &self,
        k: u64,
        offset: u32,
        data: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        let what = || format!("{} bytes at {offset} of chunk {k}", data.len());
        self.check(k, what, || crc32c_append(0, data), crc, digests)?;
        self.shared.part_arrived(k, offset, data.into());
        Ok(())
    }

    fn finish(&self) -> dmover_store::Result<Summary> {
        let chunks = self.shared.received.load(Relaxed);
        Ok(Summary {
            bytes: 0,
            files: 0,
            dirs: 0,
            symlinks: 0,
            chunks,
            verified: false,
        })
    }

    fn abort(&self) {}
}

impl SinkStore for ChunkCache {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.entries.as_slice()
    }
}

/// A chunk a read needs, or the part of it the read needs: here, or on its way; with
/// the offset in the chunk of the data's first byte (0 for a whole chunk).
enum Need {
    Here(Data, u64),
    Coming(oneshot::Receiver<std::result::Result<Data, Fault>>, u64),
}

/// A request-driven session with a server: its files read in place (see the module
/// docs). `read_at` may be called from many tasks at once (`&self`); the session runs
/// as a task of its own until [`Remote::close`] (or until the `Remote` is dropped,
/// which closes it in the background).
#[derive(Debug)]
pub struct Remote {
    store: Arc<ChunkCache>,
    shared: Arc<Shared>,
    asks: mpsc::UnboundedSender<DemandAsk>,
    task: Option<JoinHandle<Result<()>>>,
    children: HashMap<u32, Vec<u32>>,
    opts: RemoteOptions,
    bound: Duration,
    run: Arc<Run>,
    /// The session uses feature `PARTS`: small random reads ask for their bytes only.
    parts: bool,
}

impl Remote {
    /// Opens `path` on `server` (`host:port`) with the default [`RemoteOptions`].
    pub async fn open(client: &Dialer, server: &str, path: &[u8]) -> Result<Remote> {
        Self::open_with(client, server, path, RemoteOptions::default()).await
    }

    /// Opens `path` on `server`: connects and authenticates as `client` does for a
    /// pull (its streams, chunk size, checksums, protection, heartbeat), takes the
    /// manifest and answers it with `OnDemand`. The server must speak the ranges
    /// feature.
    pub async fn open_with(
        client: &Dialer,
        server: &str,
        path: &[u8],
        opts: RemoteOptions,
    ) -> Result<Remote> {
        let run = Run::new();
        let op = client.pull_op(vec![path.to_vec()], false)?;
        let Prepared {
            mut ch,
            mut dial,
            options,
            timing,
            joins,
            env,
        } = client
            .session(server, op, client.opts.chunk_size, &run)
            .await?;
        let bound = timing.silence() + timing.report_wait;
        // The server sends: with the congestion control asked for (`--congestion`),
        // else an unpaced one (answers to requests are short bursts), and under this
        // client's bandwidth limit, as in a pull.
        dial.limits = client.limits(true);
        if dial.limits.congestion.is_empty() {
            dial.limits.congestion = dmover_net::link::UNPACED.to_string();
        }
        let m = SinkSession::dial(now(), server, timing, Limits::default(), dial);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cap: opts.cache_bytes,
            requests: AtomicU64::new(0),
            wanted: AtomicU64::new(0),
            received: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            parts: AtomicU64::new(0),
            received_parts: AtomicU64::new(0),
        });
        let (sh, checksum) = (shared.clone(), client.opts.checksum);
        let prepare: drive::Prepare<ChunkCache> =
            Box::new(move |entries, chunk, _| ChunkCache::new(entries, chunk, checksum, sh));
        let (asks, asks_rx) = mpsc::unbounded_channel();
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let demand = Demand {
            asks: asks_rx,
            events,
        };
        let sh = shared.clone();
        let mut task = tokio::spawn(async move {
            let r =
                drive::sink_on_demand(m, &mut ch, joins, prepare, Some(options), env, demand).await;
            match r {
                Ok(_) => {
                    sh.fail(Fault::new(Error::refused(
                        ErrorCode::Aborted,
                        "the remote session is closed",
                    )));
                    Ok(())
                }
                Err(e) => {
                    let f = Fault::new(e);
                    sh.fail(f.clone());
                    Err(f.into_error())
                }
            }
        });
        let (store, features) = match events_rx.recv().await {
            Some(DemandEvent::Ready(k, features)) => (k, features),
            _ => {
                return Err(match (&mut task).await {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => Error::protocol(server, "session ended before it was ready"),
                    Err(e) => Error::protocol("this side", format!("remote session task: {e}")),
                });
            }
        };
        // The driver's news after `Ready` (chunks written) are not needed here: the
        // store hands chunks over itself.
        tokio::spawn(async move { while events_rx.recv().await.is_some() {} });
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, e) in store.manifest().iter().enumerate() {
            children.entry(e.parent).or_default().push(i as u32);
        }
        Ok(Remote {
            store,
            shared,
            asks,
            task: Some(task),
            children,
            opts,
            bound,
            run,
            parts: features & features::PARTS != 0,
        })
    }

    /// The longest a read waits once the server died or went silent (the heartbeat
    /// silence plus the wait for the server's report).
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The manifest's entries, indexed by entry number.
    pub fn entries(&self) -> &[Entry] {
        self.store.manifest()
    }

    /// The layout the chunks are cut from.
    pub fn layout(&self) -> std::sync::Arc<Layout> {
        self.store.layout()
    }

    /// Entry `entry`, if there is one.
    pub fn stat(&self, entry: u32) -> Option<&Entry> {
        self.entries().get(entry as usize)
    }

    /// The roots of the manifest (the path opened: one entry).
    pub fn roots(&self) -> &[u32] {
        self.children.get(&NO_PARENT).map_or(&[], |v| v)
    }

    /// The entries of directory `dir`, in manifest order (empty for anything else).
    pub fn list(&self, dir: u32) -> &[u32] {
        if dir == NO_PARENT {
            return &[];
        }
        self.children.get(&dir).map_or(&[], |v| v)
    }

    /// The entry at `path`: names joined by `/`, starting with the root's name.
    pub fn lookup(&self, path: &str) -> Option<u32> {
        let mut at = NO_PARENT;
        for name in path.split('/').filter(|n| !n.is_empty()) {
            let kids = self.children.get(&at)?;
            at = *kids
                .iter()
                .find(|&&i| self.entries()[i as usize].name == name.as_bytes())?;
        }
        (at != NO_PARENT).then_some(at)
    }

    /// The path of `entry`, names joined by `/`.
    pub fn path(&self, entry: u32) -> String {
        crate::session::entry_path(self.entries(), entry)
    }

    /// What the session did so far.
    pub fn stats(&self) -> RemoteStats {
        let s = &self.shared;
        RemoteStats {
            requests: s.requests.load(Relaxed),
            chunks_wanted: s.wanted.load(Relaxed),
            chunks_received: s.received.load(Relaxed),
            cache_hits: s.hits.load(Relaxed),
            evicted: s.evicted.load(Relaxed),
            parts_wanted: s.parts.load(Relaxed),
            parts_received: s.received_parts.load(Relaxed),
        }
    }

    fn slot(&self, entry: u32) -> Result<Option<FileSlot>> {
        let e = self.stat(entry).ok_or_else(|| {
            Error::refused(
                ErrorCode::NotFound,
                format!("no entry {entry} in the manifest"),
            )
        })?;
        if !matches!(e.kind, EntryKind::File { .. }) {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!("{} is not a regular file", self.path(entry)),
            ));
        }
        let layout = self.layout();
        let files = layout.files();
        let i = files.partition_point(|f| f.entry < entry);
        Ok(files.get(i).filter(|f| f.entry == entry).copied())
    }

    /// Up to `len` bytes of file `entry` from `offset` (fewer at its end; none past
    /// it). Chunks not in the cache are asked for and waited for; a sequential read
    /// also asks for the next chunks of the file.
    pub async fn read_at(&self, entry: u32, offset: u64, len: u64) -> Result<Vec<u8>> {
        let Some(slot) = self.slot(entry)? else {
            return Ok(Vec::new()); // an empty file
        };
        let end = offset.saturating_add(len).min(slot.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let cs = self.layout().chunk_size();
        let (lo, hi) = (slot.start + offset, slot.start + end);
        let need = lo / cs..(hi - 1) / cs + 1;
        let file_end = (slot.end() - 1) / cs + 1;
        let needs = self.request(entry, slot.start, offset, end, need.clone(), file_end)?;
        let mut out = Vec::with_capacity((hi - lo) as usize);
        for (k, n) in need.zip(needs) {
            let (d, at) = match n {
                Need::Here(d, at) => (d, at),
                Need::Coming(rx, at) => match rx.await {
                    Ok(Ok(d)) => (d, at),
                    Ok(Err(f)) => return Err(f.into_error()),
                    Err(_) => return Err(self.failure()),
                },
            };
            // `at`: where the data starts in chunk k (a part's offset, else 0).
            let base = k * cs + at;
            let from = (lo.max(base) - base) as usize;
            let to = (hi.min(k * cs + cs) - base) as usize;
            out.extend_from_slice(&d[from..to]);
        }
        Ok(out)
    }

    /// What a read gives when the session is gone.
    fn failure(&self) -> Error {
        match &self.shared.state.lock().failed {
            Some(f) => f.clone().into_error(),
            None => Error::protocol("this side", "the remote session's driver stopped"),
        }
    }

    /// The chunks `need` of a read of `entry` (`offset..end`): from the cache, or
    /// asked for (with read-ahead up to `file_end` when the read is sequential).
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        entry: u32,
        file_start: u64,
        offset: u64,
        end: u64,
        need: Range<u64>,
        file_end: u64,
    ) -> Result<Vec<Need>> {
        let cs = self.layout().chunk_size();
        let mut st = self.shared.state.lock();
        if let Some(f) = &st.failed {
            return Err(f.clone().into_error());
        }
        // A sequential read keeps its file's read-ahead window. When it had to wait for
        // a chunk the window did not cover the round trip: it doubles, at most once per
        // window read (as slow start, per round trip), up to a quarter of the cache
        // (8 MiB in flight carry 42 MB/s at 200 ms; 1 Gbit/s there wants 25 MB).
        let most = (self.opts.cache_bytes / 4 / cs).max(self.opts.read_ahead);
        let prev = st.last_end.get(&entry).copied();
        let follows = prev.is_some_and(|p| p.end == offset);
        let sequential = offset == 0 || follows;
        let mut ahead = match prev {
            Some(p) if follows => p,
            _ => Ahead {
                end,
                window: self.opts.read_ahead,
                grow_at: 0,
            },
        };
        if follows && offset >= ahead.grow_at && need.clone().any(|k| !st.cache.contains(k)) {
            ahead.window = (ahead.window * 2).min(most);
            ahead.grow_at = offset + ahead.window * cs;
        }
        ahead.end = end;
        let window = ahead.window;
        if st.last_end.len() >= 4096 {
            st.last_end.clear();
        }
        st.last_end.insert(entry, ahead);
        let mut want: Vec<Range<u64>> = Vec::new();
        let mut add = |k: u64| match want.last_mut() {
            Some(r) if r.end == k => r.end += 1,
            _ => want.push(k..k + 1),
        };
        let mut needs = Vec::with_capacity((need.end - need.start) as usize);
        let mut hits = 0;
        let mut parts: Vec<Part> = Vec::new();
        for k in need.clone() {
            if let Some(d) = st.cache.get(k) {
                hits += 1;
                needs.push(Need::Here(d, 0));
                continue;
            }
            // The read's bytes in chunk k: a small random read asks for those alone
            // (over 1 Gbit/s a 64 KiB chunk takes 0.5 ms longer than 4 KiB).
            let base = k * cs;
            let from = (file_start + offset).max(base) - base;
            let to = (file_start + end).min(base + cs) - base;
            if !st.inflight.contains_key(&k) {
                if let Some((d, at)) = st.part_cache.get(k, from, to) {
                    hits += 1;
                    needs.push(Need::Here(d, at));
                    continue;
                }
            }
            let (tx, rx) = oneshot::channel();
            if let Some(ws) = st.inflight.get_mut(&k) {
                ws.push(tx);
                needs.push(Need::Coming(rx, 0));
                continue;
            }
            if self.parts && !sequential && (to - from) * 2 <= cs {
                let r = PartRange {
                    offset: from as u32,
                    len: (to - from) as u32,
                };
                match st.parts.get_mut(&(k, r)) {
                    Some(ws) => ws.push(tx),
                    None => {
                        st.parts.insert((k, r), vec![tx]);
                        parts.push(Part {
                            chunk: k,
                            offset: r.offset,
                            len: r.len,
                        });
                    }
                }
                needs.push(Need::Coming(rx, from));
                continue;
            }
            st.inflight.insert(k, vec![tx]);
            add(k);
            needs.push(Need::Coming(rx, 0));
        }
        if sequential {
            let ahead = need.end..file_end.min(need.end + window);
            for k in ahead {
                if !st.cache.contains(k) && !st.inflight.contains_key(&k) {
                    st.inflight.insert(k, Vec::new());
                    add(k);
                }
            }
        }
        self.shared.hits.fetch_add(hits, Relaxed);
        if !parts.is_empty() {
            self.shared.requests.fetch_add(1, Relaxed);
            self.shared.parts.fetch_add(parts.len() as u64, Relaxed);
            let _ = self.asks.send(DemandAsk::WantParts(parts));
        }
        if !want.is_empty() {
            let n: u64 = want.iter().map(|r| r.end - r.start).sum();
            self.shared.requests.fetch_add(1, Relaxed);
            self.shared.wanted.fetch_add(n, Relaxed);
            // A driver that is gone fails the waiters itself (`Shared::fail`).
            let _ = self.asks.send(DemandAsk::Want(want));
        }
        Ok(needs)
    }

    /// Ends the session cleanly (`Done`; the server then reports and closes), and
    /// returns its error if it had failed. Reads still waiting fail.
    pub async fn close(mut self) -> Result<()> {
        let _ = self.asks.send(DemandAsk::Close);
        let task = self.task.take().expect("closed once");
        let r = tokio::select! {
            r = task => r,
            _ = tokio::time::sleep(self.bound + Duration::from_secs(5)) => {
                self.run.fail(Error::Aborted);
                return Err(Error::protocol("this side", "the remote session did not close in time"));
            }
        };
        match r {
            Ok(r) => r,
            Err(e) => Err(Error::protocol(
                "this side",
                format!("remote session task: {e}"),
            )),
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // The driver closes the session when its requests' channel closes.
        let _ = self.asks.send(DemandAsk::Close);
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A file written here and uploaded whole to a server: the write side of remote access
/// (docs/remote.md, "Write API"), what `dmover mount --rw` writes into.
///
/// The bytes go to a local staging file (in a directory the caller names); an upload
/// pushes it to its path on the server as `dmover cp` does: to a staging name there,
/// renamed into place once complete and its digest verified, so the server's file is
/// the old one or the new one, never a part. Mode and mtime set on
/// [`StagedFile::file`] travel with it. The staging file is removed on drop.
#[derive(Debug)]
pub struct StagedFile {
    server: String,
    dest: Vec<u8>,
    file: std::fs::File,
    staging: std::path::PathBuf,
}

impl StagedFile {
    /// A new, empty file to become `dest` on `server` (a path relative to the server's
    /// root, as `cp`'s destination), staged in the local directory `dir`, with
    /// permission bits `mode`.
    pub fn create(dir: &std::path::Path, server: &str, dest: &[u8], mode: u32) -> Result<Self> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        for _ in 0..16 {
            let staging = dir.join(format!(".new-{:016x}", rand::random::<u64>()));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&staging)
            {
                Ok(file) => {
                    let f = StagedFile {
                        server: server.to_string(),
                        dest: dest.to_vec(),
                        file,
                        staging,
                    };
                    f.file
                        .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
                        .map_err(|e| Error::io("creating", f.shown(), e))?;
                    return Ok(f);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating", staging.display().to_string(), e)),
            }
        }
        Err(Error::refused(
            ErrorCode::Io,
            format!("{}: no free staging name", dir.display()),
        ))
    }

    /// The server's path this file becomes.
    pub fn dest(&self) -> &[u8] {
        &self.dest
    }

    /// The local staging file (for its metadata, mode, mtime, length).
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Writes all of `data` at `offset` (any offset: the staging file is a whole file).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(data, offset)
            .map_err(|e| Error::io("writing", self.shown(), e))
    }

    /// Reads up to `buf.len()` bytes at `offset` (fewer at the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut n = 0;
        while n < buf.len() {
            match self.file.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("reading", self.shown(), e)),
            }
        }
        Ok(n)
    }

    /// Fills the staging file with the first `len` bytes of the regular file `entry`
    /// of `remote` (to rewrite an existing file whole), each read bounded by `timeout`.
    pub async fn fetch(
        &self,
        remote: &Remote,
        entry: u32,
        len: u64,
        timeout: Duration,
    ) -> Result<()> {
        let mut off = 0;
        while off < len {
            let read = remote.read_at(entry, off, (len - off).min(4 << 20));
            let data = tokio::time::timeout(timeout, read).await.map_err(|_| {
                Error::refused(ErrorCode::Io, format!("no answer within {timeout:?}"))
            })??;
            if data.is_empty() {
                return Err(Error::refused(
                    ErrorCode::Changed,
                    format!("{}: shorter than listed", self.shown()),
                ));
            }
            self.write_at(&data, off)?;
            off += data.len() as u64;
        }
        Ok(())
    }

    /// Pushes the file as it is now to its path on the server (staging + rename there,
    /// verified); may run again after more writes. `run` cancels it.
    pub async fn upload(&self, client: &Dialer, run: Arc<Run>) -> Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let sources = [self.staging.as_os_str().as_bytes().to_vec()];
        client
            .push(&sources, &self.server, &self.dest, run)
            .await
            .map(|_| ())
    }

    /// [`StagedFile::upload`] in one of `client`'s upload slots ([`UPLOAD_SLOTS`]:
    /// more wait for one, untimed), within `limit` once it has one. An upload to the
    /// same server that got no answer within `limit` less than `limit` ago fails the
    /// ones that get a slot after it at once (a silent server costs each waiting file
    /// no further `limit`). `run` cancels it.
    pub async fn upload_within(
        &self,
        client: &Dialer,
        run: Arc<Run>,
        limit: Duration,
    ) -> Result<()> {
        let uploads = client.uploads.clone();
        let _slot = uploads.slots.acquire().await.map_err(|_| Error::Aborted)?;
        if let Some(ago) = uploads.silent_since(&self.server, limit) {
            return Err(Error::refused(
                ErrorCode::Io,
                format!(
                    "{}: an upload got no answer within {limit:?} {:.1} s ago",
                    self.server,
                    ago.as_secs_f64()
                ),
            ));
        }
        match tokio::time::timeout(limit, self.upload(client, run.clone())).await {
            Ok(r) => r,
            Err(_) => {
                run.fail(Error::Aborted);
                *uploads.silent.lock() = Some((std::time::Instant::now(), self.server.clone()));
                Err(Error::refused(
                    ErrorCode::Io,
                    format!("{}: no answer within {limit:?}", self.server),
                ))
            }
        }
    }

    /// [`StagedFile::upload`], then the staging file goes.
    pub async fn close(self, client: &Dialer) -> Result<()> {
        self.upload(client, Run::new()).await
    }

    fn shown(&self) -> String {
        format!(
            "{} (for {})",
            self.staging.display(),
            String::from_utf8_lossy(&self.dest)
        )
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.staging);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialer::Uploads;

    /// An upload that went unanswered fails the next ones to the same server for as
    /// long as the limit, not those to another server, and not after the limit.
    #[test]
    fn a_silent_server_fails_the_queued_uploads_for_one_limit() {
        let u = Uploads::default();
        assert_eq!(u.slots.available_permits(), UPLOAD_SLOTS);
        assert_eq!(u.silent_since("a:1", Duration::from_secs(30)), None);
        let at = std::time::Instant::now() - Duration::from_secs(10);
        *u.silent.lock() = Some((at, "a:1".to_string()));
        let ago = u.silent_since("a:1", Duration::from_secs(30)).unwrap();
        assert!(ago >= Duration::from_secs(10), "{ago:?}");
        assert_eq!(u.silent_since("b:1", Duration::from_secs(30)), None);
        assert_eq!(u.silent_since("a:1", Duration::from_secs(5)), None);
    }

    /// The default read-ahead is 8 MiB of chunks, never fewer than 4.
    #[test]
    fn read_ahead_is_8_mib_of_chunks() {
        assert_eq!(read_ahead_chunks(64 << 10), 128);
        assert_eq!(read_ahead_chunks(1 << 20), 8);
        assert_eq!(read_ahead_chunks(4 << 20), 4);
        assert_eq!(read_ahead_chunks(64 << 20), 4);
    }
}
