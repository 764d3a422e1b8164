//! `dmover cp --via-client`: a copy between two servers that cannot reach each other,
//! the data going A → this client → B (docs/third-party.md).
//!
//! Two sessions run at once: a pull from A whose sink storage is a [`RelaySink`], and
//! a push to B (with A's manifest and chunk size) whose source storage is a
//! [`RelaySource`]. Both share a [`Ring`]: the sink puts each chunk it receives (its
//! CRC checked) with A's CRC and digests, the source takes chunk `k` when its
//! machine reads it and sends it with those same digests, so B checks A's file digests
//! end to end. Nothing is written on the client's disk.
//!
//! Memory is bounded: the ring holds at most its capacity of chunks not yet sent to B
//! (a put waits for room), plus chunks already sent that it keeps while room lasts, for
//! resends when a data stream to B breaks. The push reads chunks in layout order and
//! A sends them in about that order; when the push waits for a chunk the ring does not
//! hold (it is still on its way from A, behind later ones), puts stop waiting, so a
//! full ring of later chunks never blocks the one the push needs. Each session has its
//! own disk threads: the push's reads wait for chunks on threads of their own, never
//! on those that write what comes from A.
//!
//! A resumed relay (`--resume`, a retry) asks for nothing new on the wire: B answers
//! the push's manifest with what it holds (`Have`), which the pull offers to A as its
//! own resume answer; A checks the held pieces against its files and answers with a
//! plan (the partial files that changed, sent whole), which the push passes on to B.
//! The three sides then lay out the same files and skip the same chunks, so A sends
//! only what B lacks, with the digests of partly held files computed over the held
//! pieces' hashes A checked, and B verifies every file it completes as after a
//! two-party resume. The [`Ring`] carries the two answers between the sessions
//! ([`Ring::offer`], [`Ring::agree`]).
//!
//! With `--continue-on-error` A's failure markers (a file it could not read) pass
//! through with their chunks, so B drops those files; the client reports them with
//! A's reasons.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use dmover_proto::control::{ErrorCode, FailedFile, Have, Plan, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::crc32c_append;
use dmover_proto::layout::Layout;
use dmover_proto::manifest::{Entry, EntryKind};
use dmover_store::resume::{Held, Skips};
use dmover_store::{ChunkRead, Sink, Source};

use crate::drive::{SinkStore, SourceStore};

/// The ring's capacity: at least this many bytes of chunks not yet sent on.
pub const RELAY_BYTES: usize = 64 << 20;

/// Which side of the relay failed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The pull from the source server.
    In,
    /// The push to the destination server.
    Out,
}

/// A chunk in the ring.
struct Kept {
    data: Vec<u8>,
    digests: Vec<DigestEntry>,
    crc: Option<u32>,
}

#[derive(Default)]
struct State {
    cap: usize,
    /// Chunks received and not yet taken by the push.
    ready: HashMap<u64, Kept>,
    ready_bytes: usize,
    /// Chunks taken, kept for resends while there is room (oldest first).
    kept: VecDeque<(u64, Kept)>,
    kept_bytes: usize,
    /// Reads waiting for a chunk the ring does not hold.
    starving: usize,
    failed: Option<(Side, String)>,
    /// Buffers of chunks dropped from `kept`, for the next puts.
    spare: Vec<Vec<u8>>,
    /// The most bytes held at once.
    peak: usize,
    /// A resumed relay: what B holds (its answer to the push, checked), for the pull
    /// to offer A.
    offer: Option<Held>,
    /// An offer was made (it may have been taken since).
    offered: bool,
    /// A resumed relay: what A agreed B holds (the offer without the partial files A
    /// found changed), for the push to answer B with.
    agreed: Option<Held>,
}

/// Chunks between the pull from A and the push to B (see the module's description).
#[derive(Default)]
pub struct Ring {
    state: Mutex<State>,
    cv: Condvar,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Ring")
            .field("cap", &s.cap)
            .field("ready", &s.ready.len())
            .field("kept", &s.kept.len())
            .finish()
    }
}

impl Ring {
    /// An empty ring of `cap` bytes.
    pub fn new(cap: usize) -> Arc<Self> {
        let r = Ring::default();
        r.state.lock().cap = cap;
        Arc::new(r)
    }

    /// Sets the capacity (once the chunk size is known).
    pub fn set_cap(&self, cap: usize) {
        self.state.lock().cap = cap;
    }

    /// Gives up: every waiting and later put and take fails with `why`. The first
    /// failure is the one kept; `true` if this was it.
    pub fn fail(&self, side: Side, why: impl Into<String>) -> bool {
        let mut s = self.state.lock();
        let first = s.failed.is_none();
        if first {
            s.failed = Some((side, why.into()));
        }
        drop(s);
        self.cv.notify_all();
        first
    }

    /// Which side failed first, if one did.
    pub fn failed_side(&self) -> Option<Side> {
        self.state.lock().failed.as_ref().map(|f| f.0)
    }

    /// The most bytes the ring held at once.
    pub fn peak(&self) -> usize {
        self.state.lock().peak
    }

    fn failure(s: &State) -> Option<String> {
        s.failed.as_ref().map(|f| f.1.clone())
    }

    /// Waits until `take` finds what it looks for, or the relay fails.
    fn wait_for<T>(&self, mut take: impl FnMut(&mut State) -> Option<T>) -> Result<T, String> {
        let mut s = self.state.lock();
        loop {
            if let Some(why) = Self::failure(&s) {
                return Err(why);
            }
            if let Some(t) = take(&mut s) {
                return Ok(t);
            }
            self.cv.wait(&mut s);
        }
    }

    /// (resume, the push) What B holds, for the pull to offer A.
    pub fn offer(&self, held: Held) -> Result<(), String> {
        let mut s = self.state.lock();
        if let Some(why) = Self::failure(&s) {
            return Err(why);
        }
        s.offer = Some(held);
        s.offered = true;
        drop(s);
        self.cv.notify_all();
        Ok(())
    }

    /// (resume, the push) B said `Go` without a resume answer (a destination may):
    /// it expects every chunk, so the pull offers A that nothing is held. Nothing
    /// changes once B's answer was offered.
    pub fn offer_none(&self, entries: &[Entry]) {
        let mut s = self.state.lock();
        if !s.offered {
            s.offered = true;
            s.offer = Some(Held::none(entries));
            drop(s);
            self.cv.notify_all();
        }
    }

    /// (resume, the pull) Waits for what B holds ([`Ring::offer`]).
    pub fn offered(&self) -> Result<Held, String> {
        self.wait_for(|s| s.offer.take())
    }

    /// (resume, the pull) What A agreed B holds, once A's plan came.
    pub fn agree(&self, held: Held) -> Result<(), String> {
        let mut s = self.state.lock();
        if let Some(why) = Self::failure(&s) {
            return Err(why);
        }
        s.agreed = Some(held);
        drop(s);
        self.cv.notify_all();
        Ok(())
    }

    /// (resume, the push) Waits for what A agreed B holds ([`Ring::agree`]).
    pub fn agreed(&self) -> Result<Held, String> {
        self.wait_for(|s| s.agreed.take())
    }

    /// Puts chunk `k` (`payload`: its bytes at the layout's offsets), waiting while
    /// the ring is full and no read waits for a chunk it lacks.
    pub fn put(
        &self,
        k: u64,
        payload: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<(), String> {
        let mut s = self.state.lock();
        loop {
            if let Some(why) = Self::failure(&s) {
                return Err(why);
            }
            if s.ready_bytes < s.cap || s.starving > 0 {
                break;
            }
            self.cv.wait(&mut s);
        }
        // Room for it: the oldest chunks kept for resends go first.
        while s.ready_bytes + s.kept_bytes + payload.len() > s.cap {
            let Some((_, old)) = s.kept.pop_front() else {
                break;
            };
            s.kept_bytes -= old.data.len();
            if s.spare.len() < 4 {
                s.spare.push(old.data);
            }
        }
        let mut data = s.spare.pop().unwrap_or_default();
        drop(s);
        data.clear();
        data.extend_from_slice(payload);
        let mut s = self.state.lock();
        if let Some(why) = Self::failure(&s) {
            return Err(why);
        }
        s.ready_bytes += data.len();
        if let Some(old) = s.ready.insert(
            k,
            Kept {
                data,
                digests: digests.to_vec(),
                crc,
            },
        ) {
            s.ready_bytes -= old.data.len();
        }
        s.peak = s.peak.max(s.ready_bytes + s.kept_bytes);
        drop(s);
        self.cv.notify_all();
        Ok(())
    }

    /// Takes chunk `k` into `buf` and its digests into `digests`, waiting until it
    /// came; its CRC.
    pub fn take(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<Option<u32>, String> {
        let mut s = self.state.lock();
        let held = loop {
            if let Some(why) = Self::failure(&s) {
                return Err(why);
            }
            if let Some(h) = s.ready.remove(&k) {
                s.ready_bytes -= h.data.len();
                break h;
            }
            if let Some(i) = s.kept.iter().position(|(c, _)| *c == k) {
                let (_, h) = s.kept.remove(i).expect("found");
                s.kept_bytes -= h.data.len();
                break h;
            }
            // Later chunks may fill the ring: let them in until this one comes.
            s.starving += 1;
            self.cv.notify_all();
            self.cv.wait(&mut s);
            s.starving -= 1;
        };
        drop(s);
        // Room freed for a put.
        self.cv.notify_all();
        buf[..held.data.len()].copy_from_slice(&held.data);
        digests.clear();
        digests.extend_from_slice(&held.digests);
        let crc = held.crc;
        let mut s = self.state.lock();
        s.kept_bytes += held.data.len();
        s.kept.push_back((k, held));
        Ok(crc)
    }

    /// Chunk `k` again (a resend), if the ring still keeps it.
    pub fn again(&self, k: u64, buf: &mut [u8]) -> Result<Option<u32>, String> {
        let s = self.state.lock();
        if let Some(why) = Self::failure(&s) {
            return Err(why);
        }
        match s.kept.iter().find(|(c, _)| *c == k) {
            Some((_, h)) => {
                buf[..h.data.len()].copy_from_slice(&h.data);
                Ok(h.crc)
            }
            None => Err(format!(
                "chunk {k} must be sent again (a data stream broke) and this client no \
                 longer holds it"
            )),
        }
    }
}

/// The length of chunk `k`'s payload: up to the end of its last piece.
fn payload_len(layout: &Layout, k: u64) -> usize {
    layout
        .pieces(k)
        .map(|p| p.buf_offset + p.len)
        .max()
        .unwrap_or(0)
}

fn layout_of(entries: &[Entry], chunk: u32) -> dmover_store::Result<Layout> {
    Layout::new(entries, chunk)
        .map_err(|e| dmover_store::Error::refused(ErrorCode::Protocol, e.to_string()))
}

/// The pull's storage: chunks from A into the [`Ring`].
#[derive(Debug)]
pub struct RelaySink {
    entries: Vec<Entry>,
    layout: std::sync::Arc<Layout>,
    checksum: bool,
    ring: Arc<Ring>,
    from: String,
    bytes: AtomicU64,
    chunks: AtomicU64,
    /// Files A listed as sparse (ascending entries): their all-zero chunks may come
    /// as zeros frames (the push to B sends them as zeros again, in full).
    sparse: Vec<u32>,
    /// A resumed relay: the pieces B holds, whose chunks do not come.
    skips: Skips,
}

impl RelaySink {
    /// The sink of manifest `entries` from server `from` in `chunk` chunks.
    pub fn new(
        entries: Vec<Entry>,
        chunk: u32,
        checksum: bool,
        ring: Arc<Ring>,
        from: &str,
    ) -> dmover_store::Result<Self> {
        let layout = layout_of(&entries, chunk)?;
        Ok(RelaySink {
            entries,
            layout: layout.into(),
            checksum,
            ring,
            from: from.to_string(),
            bytes: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            sparse: Vec::new(),
            skips: Skips::default(),
        })
    }
}

impl Sink for RelaySink {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn sparse_chunk(&self, k: u64) -> bool {
        !self.sparse.is_empty()
            && self.layout.pieces(k).all(|p| {
                let entry = self.layout.files()[p.file as usize].entry;
                self.sparse.binary_search(&entry).is_ok()
            })
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(self.skips.chunks(&self.layout))
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> dmover_store::Result<()> {
        if self.checksum {
            let want = crc.ok_or_else(|| {
                dmover_store::Error::protocol(&self.from, format!("chunk {k} carries no CRC"))
            })?;
            let got = self.layout.pieces(k).fold(0, |c, p| {
                crc32c_append(c, &buf[p.buf_offset..p.buf_offset + p.len])
            });
            if got != want {
                return Err(dmover_store::Error::Checksum(format!(
                    "chunk {k} from {} arrived corrupted (CRC32C {got:08x}, sent as {want:08x})",
                    self.from
                )));
            }
        }
        // The digests go on to B with the chunk (B checks them): only their form here.
        // Failure markers (`--continue-on-error`: a file A could not read) go on too,
        // and B drops that file.
        for d in digests {
            if !self.layout.pieces(k).any(|p| p.file == d.index()) {
                return Err(dmover_store::Error::protocol(
                    &self.from,
                    format!("chunk {k}: unexpected digest entry for file {}", d.index()),
                ));
            }
        }
        let len = payload_len(&self.layout, k);
        self.ring
            .put(k, &buf[..len], digests, crc)
            .map_err(|why| dmover_store::Error::refused(ErrorCode::Aborted, why))?;
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.chunks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&self) -> dmover_store::Result<Summary> {
        let mut s = Summary {
            bytes: self.bytes.load(Ordering::Relaxed),
            chunks: self.chunks.load(Ordering::Relaxed),
            verified: self.checksum,
            ..Summary::default()
        };
        for e in &self.entries {
            match e.kind {
                EntryKind::File { .. } => s.files += 1,
                EntryKind::Dir => s.dirs += 1,
                EntryKind::Symlink { .. } => s.symlinks += 1,
                EntryKind::HardLink { .. } => {}
            }
        }
        Ok(s)
    }

    fn abort(&self) {
        self.ring.fail(
            Side::In,
            format!("the copy from {} was given up", self.from),
        );
    }
}

impl SinkStore for RelaySink {
    fn entries(&self) -> impl std::ops::Deref<Target = [Entry]> + '_ {
        self.entries.as_slice()
    }

    fn set_sparse(&mut self, entries: Vec<u32>) {
        self.sparse = entries;
    }

    /// What B holds: B's answer to the push (waits for it). A failed relay offers
    /// nothing; [`SinkStore::resume`] then fails with the reason.
    fn held(&self) -> Held {
        self.ring
            .offered()
            .unwrap_or_else(|_| Held::none(&self.entries))
    }

    /// Lays out what B lacks, and tells the push what A agreed B holds.
    fn resume(&mut self, held: &Held) -> crate::Result<()> {
        let layout = held
            .layout(&self.entries, self.layout.chunk_size() as u32)
            .map_err(|e| crate::Error::refused(ErrorCode::Protocol, e.to_string()))?;
        self.skips = held.skips(&layout);
        self.layout = layout.into();
        self.ring
            .agree(held.clone())
            .map_err(|why| crate::Error::refused(ErrorCode::Aborted, why))
    }
}

/// The push's storage: chunks from the [`Ring`], with A's CRCs and digests.
#[derive(Debug)]
pub struct RelaySource {
    entries: Vec<Entry>,
    layout: std::sync::Arc<Layout>,
    ring: Arc<Ring>,
    /// A resumed relay: the pieces B holds, whose chunks are not sent.
    skips: Skips,
    /// A resumed relay: bytes B held (whole files and pieces of others), and the
    /// files it held whole.
    held_bytes: u64,
    held_files: u64,
    /// B answered the manifest with what it holds ([`SourceStore::resume_from`]).
    resumed: bool,
    /// Entries of the files A could not read (failure markers passed on to B).
    failed: Mutex<std::collections::BTreeSet<u32>>,
}

impl RelaySource {
    /// The source of manifest `entries` in `chunk` chunks, from `ring`.
    pub fn new(entries: &[Entry], chunk: u32, ring: Arc<Ring>) -> dmover_store::Result<Self> {
        Ok(RelaySource {
            entries: entries.to_vec(),
            layout: layout_of(entries, chunk)?.into(),
            ring,
            skips: Skips::default(),
            held_bytes: 0,
            held_files: 0,
            resumed: false,
            failed: Mutex::default(),
        })
    }

    /// Files B held whole (a resumed relay).
    pub fn held_files(&self) -> u64 {
        self.held_files
    }
}

fn relay_error(why: String) -> dmover_store::Error {
    dmover_store::Error::refused(ErrorCode::Aborted, why)
}

impl Source for RelaySource {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.layout.clone()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        Box::new(self.skips.chunks(&self.layout))
    }

    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> dmover_store::Result<ChunkRead> {
        if !self.resumed {
            // Chunks are read after B's `Go`: a pull waiting for B's resume answer
            // gets none.
            self.ring.offer_none(&self.entries);
        }
        let crc = self.ring.take(k, buf, digests).map_err(relay_error)?;
        // Checked when it came from A.
        for d in digests.iter().filter(|d| d.is_failure()) {
            if let Some(f) = self.layout.files().get(d.index() as usize) {
                self.failed.lock().insert(f.entry);
            }
        }
        Ok(ChunkRead {
            crc,
            n_digests: digests.len() as u32,
            zeros: false,
        })
    }

    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> dmover_store::Result<()> {
        let kept = self.ring.again(k, buf).map_err(relay_error)?;
        if kept != crc {
            return Err(relay_error(format!(
                "chunk {k}: the copy kept for a resend has another CRC"
            )));
        }
        Ok(())
    }
}

impl SourceStore for RelaySource {
    /// B's resume answer, `parts`: checked against the manifest, offered to A through
    /// the pull (which waits for it), and answered with A's plan once A checked the
    /// held pieces against its files (waits for it).
    fn resume_from(&mut self, peer: &str, parts: &[Have]) -> crate::Result<Plan> {
        let chunk = self.layout.chunk_size() as u32;
        let mut held = Held::from_have(&self.entries, chunk, parts)
            .map_err(|e| crate::Error::protocol(peer, format!("resume: {e}")))?;
        let aborted = |why| crate::Error::refused(ErrorCode::Aborted, why);
        self.ring.offer(held.clone()).map_err(aborted)?;
        let agreed = self.ring.agreed().map_err(aborted)?;
        // A's plan: the partial files whose held pieces A found changed.
        let mut stale: Vec<u32> = held
            .partial
            .keys()
            .filter(|e| !agreed.partial.contains_key(e))
            .copied()
            .collect();
        stale.sort_unstable();
        let plan = Plan { stale };
        held.apply(&plan)
            .map_err(|e| crate::Error::protocol("this side", e))?;
        if held != agreed {
            return Err(crate::Error::protocol(
                "this side",
                "resume: what the source agreed the destination holds is not what it said",
            ));
        }
        let layout = held
            .layout(&self.entries, chunk)
            .map_err(|e| crate::Error::refused(ErrorCode::Protocol, e.to_string()))?;
        self.skips = held.skips(&layout);
        self.layout = layout.into();
        self.held_bytes = held.bytes(&self.entries, chunk);
        self.held_files = held.done_files();
        self.resumed = true;
        Ok(plan)
    }

    fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The files whose failure markers passed (A's report has why; B only drops them).
    fn failed(&self) -> Vec<FailedFile> {
        self.failed
            .lock()
            .iter()
            .map(|&entry| FailedFile {
                entry,
                message: "the source server could not read it".into(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full ring of later chunks lets in the chunk a read waits for; puts wait while
    /// the ring is full and nothing waits; a failure wakes every waiter.
    #[test]
    fn a_full_ring_never_blocks_the_chunk_a_read_waits_for() {
        let ring = Ring::new(4);
        for k in 1..5 {
            ring.put(k, &[k as u8], &[], None).unwrap();
        }
        // Full: a put of chunk 5 waits until chunk 0 is wanted.
        let r = ring.clone();
        let late = std::thread::spawn(move || r.put(5, &[5], &[], Some(5)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!late.is_finished(), "a put into a full ring waits");
        let r = ring.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            let mut t = Vec::new();
            r.take(0, &mut buf, &mut t).map(|_| buf[0])
        });
        late.join().unwrap().unwrap();
        ring.put(0, &[42], &[], None).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 42);
        let mut buf = [0u8; 1];
        let mut t = Vec::new();
        assert_eq!(ring.take(5, &mut buf, &mut t).unwrap(), Some(5));
        assert_eq!(ring.again(5, &mut buf).unwrap(), Some(5));
        let r = ring.clone();
        let stuck = std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            r.take(99, &mut buf, &mut Vec::new())
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(ring.fail(Side::Out, "B refused"));
        assert!(!ring.fail(Side::In, "later"));
        assert_eq!(stuck.join().unwrap().unwrap_err(), "B refused");
        assert_eq!(ring.failed_side(), Some(Side::Out));
    }

    /// A manifest entry of mode 0644 at the epoch.
    fn e(parent: u32, name: &str, kind: EntryKind) -> Entry {
        Entry {
            parent,
            name: name.into(),
            kind,
            mode: 0o644,
            mtime: dmover_proto::manifest::Mtime::default(),
        }
    }

    /// A resumed relay: B's answer goes to the pull, A's plan (a partial file whose
    /// held piece A found changed) comes back to the push, and both sessions lay out
    /// and expect the same chunks; a failed relay wakes a side waiting for the other.
    #[test]
    fn both_sessions_of_a_resumed_relay_skip_the_same_chunks() {
        use dmover_proto::manifest::NO_PARENT;
        let entries = vec![
            e(NO_PARENT, "d", EntryKind::Dir),
            e(0, "a", EntryKind::File { size: 10 }),
            e(0, "big", EntryKind::File { size: 5 << 20 }),
            e(0, "huge", EntryKind::File { size: 4 << 20 }),
            e(0, "c", EntryKind::File { size: 30 }),
        ];
        let chunk = 1 << 20;
        let ring = Ring::new(4 << 20);
        let mut sink = RelaySink::new(entries.clone(), chunk, true, ring.clone(), "A").unwrap();
        let mut source = RelaySource::new(&entries, chunk, ring.clone()).unwrap();
        // B holds `a` whole and pieces of both large files.
        let mut b = Held::none(&entries);
        b.done[1] = true;
        b.partial.insert(2, vec![(0, 7), (2, 9)]);
        b.partial.insert(3, vec![(1, 5)]);
        let parts = b.to_have(&entries);
        let push = std::thread::spawn(move || {
            let plan = source.resume_from("B", &parts);
            (source, plan)
        });
        let mut held = sink.held();
        assert_eq!(held, b, "the pull offers A what B holds");
        // A's plan: `huge`'s held piece differs from A's file.
        held.apply(&Plan { stale: vec![3] }).unwrap();
        sink.resume(&held).unwrap();
        let (source, plan) = push.join().unwrap();
        assert_eq!(plan.unwrap().stale, vec![3], "B hears A's plan");
        // Without `a`: big is chunks 0..5 (pieces 0 and 2 held), huge 5..9, c 9.
        let sent: Vec<u64> = Source::chunks(&source).collect();
        assert_eq!(sent, vec![1, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(sent, Sink::chunks(&sink).collect::<Vec<_>>());
        assert_eq!(Source::layout(&source).n_chunks(), 10);
        assert_eq!(Sink::layout(&sink).n_chunks(), 10);
        assert_eq!(SourceStore::held_bytes(&source), 10 + (2 << 20));
        assert_eq!(source.held_files(), 1);

        // The push failed before B answered: the pull's wait ends, and so does its
        // resume, with the push's reason.
        let ring = Ring::new(4 << 20);
        let mut sink = RelaySink::new(entries.clone(), chunk, true, ring.clone(), "A").unwrap();
        let r = ring.clone();
        let fail = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            r.fail(Side::Out, "B refused");
        });
        let held = sink.held();
        fail.join().unwrap();
        assert!(held.is_empty());
        let e = sink.resume(&held).unwrap_err();
        assert!(e.to_string().contains("B refused"), "{e}");

        // B said `Go` without a resume answer: its first read tells the pull that
        // nothing is held.
        let ring = Ring::new(4 << 20);
        let sink = RelaySink::new(entries.clone(), chunk, true, ring.clone(), "A").unwrap();
        let source = RelaySource::new(&entries, chunk, ring.clone()).unwrap();
        ring.put(0, &[1], &[], None).unwrap();
        let mut buf = vec![0u8; chunk as usize];
        source.read_chunk(0, &mut buf, &mut Vec::new()).unwrap();
        assert!(sink.held().is_empty());
    }

    /// `--continue-on-error`: a failure marker from A goes on to B with its chunk, and
    /// the push reports that file as failed; a marker for a file the chunk holds no
    /// piece of is refused.
    #[test]
    fn failure_markers_pass_through_the_relay() {
        use dmover_proto::manifest::NO_PARENT;
        let entries = vec![
            e(NO_PARENT, "d", EntryKind::Dir),
            e(0, "a", EntryKind::File { size: 10 }),
            e(0, "b", EntryKind::File { size: 20 }),
        ];
        let ring = Ring::new(1 << 20);
        let sink = RelaySink::new(entries.clone(), 1 << 20, false, ring.clone(), "A").unwrap();
        let source = RelaySource::new(&entries, 1 << 20, ring).unwrap();
        let marker = vec![DigestEntry::failure(1)];
        let buf = vec![0u8; 1 << 20];
        sink.write_chunk(0, &buf, &marker, None).unwrap();
        let (mut out, mut digests) = (vec![0u8; 1 << 20], Vec::new());
        let read = source.read_chunk(0, &mut out, &mut digests).unwrap();
        assert_eq!(digests, marker, "the marker goes on to B");
        assert_eq!(read.n_digests, 1);
        let failed = SourceStore::failed(&source);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].entry, 2, "layout file 1 is entry 2");
        let stray = vec![DigestEntry::failure(7)];
        assert!(sink.write_chunk(0, &buf, &stray, None).is_err());
    }
}
