//! The destination's resume journal: a durable, append-only record of the files (and
//! pieces of large files) that arrived whole and verified, so a later session of the
//! same transfer sends only what is missing.
//!
//! # Where and what
//! One journal per transfer, in the directory that receives the transfer's roots:
//! `.dmv.journal.<key>`, where `key` ([`transfer_key`]) is a hash of the roots' names
//! and kinds there. The destination directory plus the key identify the transfer: a new
//! session (a retry, `dmover cp --resume`, after a crash of either side or machine)
//! finds it again, whatever its session id. Records name files by a 128-bit hash of
//! their path below that directory and carry the size and mtime the source's manifest
//! gave them, so a resumed session matches them file by file against the new manifest:
//! a file whose size or mtime changed is not resumed.
//!
//! Staging files are named after the same key (`.dmv.<key>.<name>`), so a resumed
//! session finds the partial files the journal describes.
//!
//! # Format
//! A 64-byte header, then 64-byte records, each ending in a CRC32C of its first 60
//! bytes. Reading stops at the first short or damaged record (a torn append after a
//! crash) and the file is cut there, so appends continue after the last good record.
//! ```text
//! header: 0 "DMVJ" | 4 u16 version (1) | 6 reserved | 8 u64 key | 16 u32 chunk size
//!         | 20..60 reserved | 60 u32 crc32c                         (little-endian)
//! record: 0 u8 kind (1 file done, 2 piece done) | 1..4 reserved | 4 u32 mtime nsec
//!         | 8 u128 path hash | 24 u64 size | 32 i64 mtime sec | 40 u64 piece index
//!         | 48 u64 file digest or piece hash | 56 reserved | 60 u32 crc32c
//! ```
//!
//! # Durability
//! Records are buffered and committed in batches: every [`COMMIT_INTERVAL`] or
//! [`COMMIT_BYTES`] of records, whichever comes first, and when the session ends. A
//! commit first `syncfs`es the destination file system (the data the records describe
//! was written before the records were buffered, so it is then on stable storage), then
//! appends the records and `fdatasync`s the journal. Batches are committed by one
//! thread of the process for all its journals ([`start_committer`]): a `syncfs` waits
//! for every dirty page of the file system (0.07 to 0.15 s for a second of a 1 Gbit/s
//! copy of small files here, far longer on a fast one), and the disk threads that
//! record files must not wait with it. (Where that thread cannot be started, the disk
//! thread that finds a batch due commits it.) A record therefore never claims
//! data a machine crash could lose; a crash loses at most the last batch, whose files
//! are sent again. Journal I/O errors never fail a transfer: they are logged and the
//! journal stops growing (the transfer just resumes from an older point).
//!
//! # Lifetime
//! Created when a session starts; removed when the transfer completes; replaced when a
//! session of the same transfer starts without `--resume`. A held `flock` keeps two
//! sessions from writing the same transfer at once.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmover_proto::digest::crc32c_append;
use dmover_proto::manifest::{Entry, EntryKind, Mtime};
use parking_lot::{Condvar, Mutex};
use rustix::fs::{AtFlags, FlockOperation, OFlags};
use rustix::io::Errno;
use twox_hash::{XxHash3_64, XxHash3_128};

use crate::sys;

/// Size of the header and of every record.
pub const RECORD_LEN: usize = 64;
/// Longest time records wait in memory before a commit. Each commit's `syncfs` also
/// starts the writeback of what the copy wrote since the last, so this bounds the dirty
/// data the `sync` after a copy still waits for: with a second, a tiny push at 100 ms
/// ended with 0.12 s of `sync`, with 250 ms 0.005–0.05 s (docs/benchmarks.md, "The
/// journal's commits four times a second").
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(250);
/// Most bytes of records buffered before a commit.
pub const COMMIT_BYTES: usize = 1 << 20;
/// How long a session waits for another session of the same transfer to let go of
/// the journal (an aborted session may still be winding down).
pub const LOCK_WAIT: Duration = Duration::from_secs(15);

const MAGIC: &[u8; 4] = b"DMVJ";
const VERSION: u16 = 1;
const KIND_FILE: u8 = 1;
const KIND_PIECE: u8 = 2;

/// What a transfer holds, which bounds its journal ([`Extent::max_len`]): a journal
/// longer than its transfer's files could have recorded is not read (it was not written
/// by dmover for this transfer: a sparse file planted in its place, say) but discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Its regular files.
    pub files: u64,
    /// Their bytes in all.
    pub bytes: u64,
}

impl Extent {
    /// The longest journal of this transfer with chunks of `chunk` bytes (the smaller
    /// of the earlier attempt's and this one's): its header, and for every file a
    /// done record and a record per piece (at most one per chunk of its bytes, and two
    /// more where it straddles chunks), all twice over (a file that changed between
    /// attempts is recorded again), and 64 records to spare.
    pub fn max_len(&self, chunk: u32) -> u64 {
        let chunk = u64::from(chunk.max(dmover_proto::layout::MIN_CHUNK));
        let pieces = self
            .files
            .saturating_mul(2)
            .saturating_add(self.bytes / chunk);
        let records = self.files.saturating_add(pieces).saturating_mul(2);
        records.saturating_add(65).saturating_mul(RECORD_LEN as u64)
    }
}

/// The key of a transfer into a directory: a hash of its roots' names there and kinds.
pub fn transfer_key<'a>(roots: impl IntoIterator<Item = (&'a [u8], &'a EntryKind)>) -> u64 {
    let mut v = b"dmover-transfer-1\0".to_vec();
    for (name, kind) in roots {
        v.extend_from_slice(name);
        v.push(0);
        v.push(match kind {
            EntryKind::File { .. } => b'f',
            EntryKind::Dir => b'd',
            EntryKind::Symlink { .. } => b'l',
            EntryKind::HardLink { .. } => b'h',
        });
    }
    XxHash3_64::oneshot(&v)
}

/// The journal's file name for `key`.
pub fn journal_name(key: u64) -> Vec<u8> {
    format!(".dmv.journal.{key:016x}").into_bytes()
}

/// The hash naming a file in records: xxh3-128 of its path components, each followed
/// by a NUL (the root's name as it is called at the destination).
pub fn path_hash<'a>(components: impl Iterator<Item = &'a [u8]>) -> u128 {
    let mut h = XxHash3_128::new();
    for c in components {
        h.write(c);
        h.write(&[0]);
    }
    h.finish_128()
}

/// The identity of a file's content as the source announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// Path hash ([`path_hash`]).
    pub path: u128,
    /// Size in bytes.
    pub size: u64,
    /// Modification time.
    pub mtime: Mtime,
}

impl FileId {
    /// The identity of manifest entry `e` at path hash `path`.
    pub fn of(path: u128, e: &Entry) -> Self {
        FileId {
            path,
            size: e.file_size(),
            mtime: e.mtime,
        }
    }
}

/// What the journal knows about one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// Size and mtime the records were made for.
    pub size: u64,
    /// Modification time the records were made for.
    pub mtime: Mtime,
    /// The file arrived whole, verified, under its final name (with its digest, 0
    /// without checksums).
    pub done: Option<u64>,
    /// Pieces held in the staging file: index → piece hash.
    pub pieces: BTreeMap<u64, u64>,
}

/// A journal's records, read back.
#[derive(Debug, Default, Clone)]
pub struct Contents {
    /// Chunk size of the session that wrote the records (piece records are only
    /// meaningful for the same chunk size).
    pub chunk_size: u32,
    /// Per path hash.
    pub files: HashMap<u128, FileState>,
    /// Damaged or torn records found (and cut off).
    pub torn: u64,
}

/// Why a journal could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another session of the same transfer holds it.
    #[error("another session is writing to this destination (journal {0} is locked)")]
    Busy(String),
    /// A file system call failed.
    #[error("journal {name}: {source}")]
    Io {
        /// The journal's name.
        name: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

struct Pending {
    buf: Vec<u8>,
    since: Instant,
    /// The journal is closing: the committer leaves it alone.
    closing: bool,
}

/// What a journal shares with the committer.
struct Shared {
    fd: OwnedFd,
    name: Vec<u8>,
    pending: Mutex<Pending>,
    commit: Mutex<()>,
    broken: std::sync::atomic::AtomicBool,
    /// Records committed, for tests and logs.
    committed: std::sync::atomic::AtomicU64,
    /// Committed by the committer thread (otherwise by whoever appends).
    background: bool,
}

/// The process's committer: the open journals, and their thread's wake-up.
struct Committer {
    journals: Mutex<Vec<Arc<Shared>>>,
    /// Records arrived in an empty buffer, or a batch is full.
    wake: Condvar,
}

static COMMITTER: Committer = Committer {
    journals: Mutex::new(Vec::new()),
    wake: Condvar::new(),
};
static COMMITTER_STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Starts the thread that commits every journal's batches (once per process; later
/// calls do nothing), and says whether it runs. A server calls it as it starts, so its
/// thread count stays the same however many sessions it serves; otherwise the first
/// journal opened starts it.
pub fn start_committer() -> bool {
    *COMMITTER_STARTED.get_or_init(|| {
        std::thread::Builder::new()
            .name("dmover-journal".into())
            .spawn(|| COMMITTER.run())
            .map_err(|e| {
                tracing::warn!("cannot start the journal's thread ({e}): disk threads commit")
            })
            .is_ok()
    })
}

impl Committer {
    /// Commits each journal's batch when it is full or its interval is up.
    fn run(&self) {
        let mut journals = self.journals.lock();
        loop {
            let now = Instant::now();
            let mut due = None;
            let mut next: Option<Duration> = None;
            for j in journals.iter() {
                let p = j.pending.lock();
                if p.buf.is_empty() || p.closing {
                    continue;
                }
                let age = now.saturating_duration_since(p.since);
                if p.buf.len() >= COMMIT_BYTES || age >= COMMIT_INTERVAL {
                    due = Some(j.clone());
                    break;
                }
                let left = COMMIT_INTERVAL - age;
                next = Some(next.map_or(left, |n| n.min(left)));
            }
            if let Some(j) = due {
                parking_lot::MutexGuard::unlocked(&mut journals, || j.commit(true));
                continue;
            }
            match next {
                Some(d) => {
                    self.wake.wait_for(&mut journals, d);
                }
                None => self.wake.wait(&mut journals),
            }
        }
    }

    fn wake(&self) {
        // Under the lock: the committer is either scanning (and will see the records)
        // or waiting (and is woken).
        let _journals = self.journals.lock();
        self.wake.notify_one();
    }
}

/// An open, locked journal.
pub struct Journal {
    shared: Arc<Shared>,
    dir: Arc<OwnedFd>,
    name: Vec<u8>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("name", &String::from_utf8_lossy(&self.name))
            .finish()
    }
}

fn header(key: u64, chunk: u32) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&key.to_le_bytes());
    b[16..20].copy_from_slice(&chunk.to_le_bytes());
    seal(&mut b);
    b
}

fn seal(b: &mut [u8; RECORD_LEN]) {
    let crc = crc32c_append(0, &b[..60]);
    b[60..].copy_from_slice(&crc.to_le_bytes());
}

fn sealed(b: &[u8]) -> bool {
    b.len() == RECORD_LEN && crc32c_append(0, &b[..60]).to_le_bytes() == b[60..]
}

fn record(kind: u8, id: &FileId, index: u64, hash: u64) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0] = kind;
    b[4..8].copy_from_slice(&id.mtime.nsec.to_le_bytes());
    b[8..24].copy_from_slice(&id.path.to_le_bytes());
    b[24..32].copy_from_slice(&id.size.to_le_bytes());
    b[32..40].copy_from_slice(&id.mtime.sec.to_le_bytes());
    b[40..48].copy_from_slice(&index.to_le_bytes());
    b[48..56].copy_from_slice(&hash.to_le_bytes());
    seal(&mut b);
    b
}

/// Parses a journal's bytes: its contents and the length of the good prefix.
pub fn parse(bytes: &[u8], key: u64) -> Option<(Contents, usize)> {
    let head = bytes.get(..RECORD_LEN)?;
    if !sealed(head)
        || &head[..4] != MAGIC
        || u16::from_le_bytes([head[4], head[5]]) != VERSION
        || u64::from_le_bytes(head[8..16].try_into().unwrap()) != key
    {
        return None;
    }
    let mut c = Contents {
        chunk_size: u32::from_le_bytes(head[16..20].try_into().unwrap()),
        ..Contents::default()
    };
    let mut good = RECORD_LEN;
    for r in bytes[RECORD_LEN..].chunks(RECORD_LEN) {
        if !sealed(r) || !matches!(r[0], KIND_FILE | KIND_PIECE) {
            c.torn += 1;
            break;
        }
        good += RECORD_LEN;
        let u64_at = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().unwrap());
        let path = u128::from_le_bytes(r[8..24].try_into().unwrap());
        let size = u64_at(24);
        let mtime = Mtime {
            sec: u64_at(32) as i64,
            nsec: u32::from_le_bytes(r[4..8].try_into().unwrap()),
        };
        let st = c.files.entry(path).or_insert_with(|| FileState {
            size,
            mtime,
            done: None,
            pieces: BTreeMap::new(),
        });
        if st.size != size || st.mtime != mtime {
            // The source file changed between attempts: only the newer records count.
            *st = FileState {
                size,
                mtime,
                done: None,
                pieces: BTreeMap::new(),
            };
        }
        match r[0] {
            KIND_FILE => st.done = Some(u64_at(48)),
            _ => {
                st.pieces.insert(u64_at(40), u64_at(48));
            }
        }
    }
    Some((c, good))
}

impl Journal {
    /// Opens (creating it if needed) and locks the journal of transfer `key` in `dir`,
    /// waiting up to [`LOCK_WAIT`] for another session to release it. With `resume`
    /// its records are read back (those of another chunk size are dropped); otherwise,
    /// or when it is unreadable or longer than a transfer of `extent` permits
    /// ([`Extent::max_len`], checked before reading it), it starts empty. Returns the
    /// journal, what it held, and whether a journal of an earlier attempt existed.
    pub fn open(
        dir: Arc<OwnedFd>,
        key: u64,
        chunk_size: u32,
        resume: bool,
        extent: Extent,
    ) -> Result<(Journal, Contents, bool), JournalError> {
        let name = journal_name(key);
        let shown = String::from_utf8_lossy(&name).into_owned();
        let err = |source: io::Error| JournalError::Io {
            name: shown.clone(),
            source,
        };
        let fd = sys::open_in(&*dir, &name, OFlags::RDWR | OFlags::CREATE, 0o600).map_err(err)?;
        let started = Instant::now();
        loop {
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(Errno::WOULDBLOCK) if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(Errno::WOULDBLOCK) => return Err(JournalError::Busy(shown)),
                Err(e) => return Err(err(e.into())),
            }
        }
        let len = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?.st_size as usize;
        let existed = len > 0;
        let mut contents = Contents {
            chunk_size,
            ..Contents::default()
        };
        let mut keep = 0;
        let readable = resume && existed && {
            // The earlier attempt's chunk size (its header's), if smaller, bounds it.
            let mut head = [0u8; RECORD_LEN];
            let got = sys::pread_full(&fd, &mut head, 0).map_err(err)?;
            let theirs = u32::from_le_bytes(head[16..20].try_into().unwrap());
            let chunk = if got == RECORD_LEN && sealed(&head) && theirs > 0 {
                theirs.min(chunk_size)
            } else {
                chunk_size
            };
            let max = extent.max_len(chunk);
            let within = len as u64 <= max;
            if !within {
                tracing::warn!(
                    "journal {shown} holds {len} bytes, more than this transfer's {} files \
                     could have recorded ({max}); starting over without reading it",
                    extent.files
                );
            }
            within
        };
        if readable {
            let mut bytes = vec![0u8; len];
            let got = sys::pread_full(&fd, &mut bytes, 0).map_err(err)?;
            bytes.truncate(got);
            if let Some((c, good)) = parse(&bytes, key) {
                if c.torn > 0 {
                    tracing::info!("journal {shown}: cut a torn record at byte {good}");
                }
                keep = good;
                contents = c;
                if contents.chunk_size != chunk_size {
                    for st in contents.files.values_mut() {
                        st.pieces.clear();
                    }
                }
            } else {
                tracing::warn!("journal {shown} is unreadable; starting over");
            }
        }
        if keep == 0 {
            rustix::fs::ftruncate(&fd, 0).map_err(|e| err(e.into()))?;
            sys::pwrite_all(&fd, &header(key, chunk_size), 0).map_err(err)?;
            // The journal's name must survive a crash as long as anything it describes.
            rustix::fs::fdatasync(&fd).map_err(|e| err(e.into()))?;
            if let Ok(d) = sys::open_in(&*dir, b".", OFlags::RDONLY | OFlags::DIRECTORY, 0) {
                let _ = rustix::fs::fsync(&d);
            }
        } else if keep < len {
            rustix::fs::ftruncate(&fd, keep as u64).map_err(|e| err(e.into()))?;
        }
        let background = start_committer();
        let shared = Arc::new(Shared {
            fd,
            name: name.clone(),
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                since: Instant::now(),
                closing: false,
            }),
            commit: Mutex::new(()),
            broken: false.into(),
            committed: 0.into(),
            background,
        });
        if background {
            COMMITTER.journals.lock().push(shared.clone());
        }
        Ok((Journal { shared, dir, name }, contents, existed))
    }

    /// Records that a file is complete under its final name.
    pub fn file_done(&self, id: &FileId, digest: u64) {
        self.append(&record(KIND_FILE, id, 0, digest));
    }

    /// Records that piece `index` of a file is written to its staging file.
    pub fn piece_done(&self, id: &FileId, index: u64, hash: u64) {
        self.append(&record(KIND_PIECE, id, index, hash));
    }

    fn append(&self, r: &[u8; RECORD_LEN]) {
        use std::sync::atomic::Ordering;
        let s = &*self.shared;
        if s.broken.load(Ordering::Relaxed) {
            return;
        }
        let (wake, due) = {
            let mut p = s.pending.lock();
            let was_empty = p.buf.is_empty();
            if was_empty {
                p.since = Instant::now();
            }
            p.buf.extend_from_slice(r);
            let full = p.buf.len() >= COMMIT_BYTES;
            (
                was_empty || full,
                full || p.since.elapsed() >= COMMIT_INTERVAL,
            )
        };
        if s.background {
            // The committer sleeps until a batch's interval is up; it learns of a new
            // batch, or of a full one, here.
            if wake {
                COMMITTER.wake();
            }
        } else if due && !s.commit.is_locked() {
            // No committer thread: whoever finds a commit due does it, others carry on.
            s.commit(false);
        }
    }

    /// Commits every buffered record (see the module docs), on the caller's thread.
    pub fn flush(&self) {
        self.shared.commit(false);
    }

    /// Whether a journal write failed (the journal stopped growing).
    pub fn is_broken(&self) -> bool {
        self.shared
            .broken
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records committed so far.
    pub fn committed(&self) -> u64 {
        self.shared
            .committed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Removes the journal (the transfer is complete). A commit under way is not
    /// waited for: its `syncfs` may take a while, and its records no longer matter.
    pub fn remove(mut self) {
        self.close(true);
        if let Err(e) = rustix::fs::unlinkat(&*self.dir, self.name.as_slice(), AtFlags::empty()) {
            tracing::warn!(
                "cannot remove journal {}: {e}",
                String::from_utf8_lossy(&self.name)
            );
        }
    }

    /// Takes the journal from the committer. Without `discard` waits for a commit of
    /// it under way, so nothing is written to it after this returns; with `discard`
    /// drops what is buffered and does not wait. Records not flushed are not
    /// committed.
    fn close(&mut self, discard: bool) {
        {
            let mut p = self.shared.pending.lock();
            if p.closing {
                return;
            }
            p.closing = true;
            if discard {
                p.buf.clear();
            }
        }
        if self.shared.background {
            COMMITTER
                .journals
                .lock()
                .retain(|j| !Arc::ptr_eq(j, &self.shared));
        }
        if !discard {
            drop(self.shared.commit.lock());
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close(false);
    }
}

impl Shared {
    /// Commits what is buffered; the committer's commit (`background`) does nothing
    /// once the journal is closing.
    fn commit(&self, background: bool) {
        use std::sync::atomic::Ordering;
        let _guard = self.commit.lock();
        let buf = {
            let mut p = self.pending.lock();
            if background && p.closing {
                return;
            }
            std::mem::take(&mut p.buf)
        };
        if buf.is_empty() || self.broken.load(Ordering::Relaxed) {
            return;
        }
        let r = (|| -> io::Result<()> {
            // Everything the records describe was written before they were buffered.
            rustix::fs::syncfs(&self.fd)?;
            let end = rustix::fs::fstat(&self.fd)?.st_size as u64;
            sys::pwrite_all(&self.fd, &buf, end)?;
            rustix::fs::fdatasync(&self.fd)?;
            Ok(())
        })();
        match r {
            Ok(()) => {
                self.committed
                    .fetch_add((buf.len() / RECORD_LEN) as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.broken.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "journal {}: {e}; this transfer can resume only from before this point",
                    String::from_utf8_lossy(&self.name)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(path: u128, size: u64) -> FileId {
        FileId {
            path,
            size,
            mtime: Mtime { sec: 5, nsec: 6 },
        }
    }

    /// Journals, keys and staging names of earlier versions (hashed with `xxhash-rust`
    /// and `crc32c`) must still be recognised.
    #[test]
    fn hashes_match_the_reference_crates() {
        let comps: [&[u8]; 3] = [b"root", b"d\xffir", b"file.bin"];
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for c in comps {
            h.update(c);
            h.update(&[0]);
        }
        assert_eq!(path_hash(comps.into_iter()), h.digest128());
        let key = transfer_key([(&b"data"[..], &EntryKind::Dir)]);
        assert_eq!(
            key,
            xxhash_rust::xxh3::xxh3_64(b"dmover-transfer-1\0data\0d")
        );
        let mut r = [7u8; RECORD_LEN];
        seal(&mut r);
        assert_eq!(r[60..], crc32c::crc32c(&r[..60]).to_le_bytes());
        assert!(sealed(&r));
    }

    fn dir() -> (tempfile::TempDir, Arc<OwnedFd>) {
        let t = tempfile::tempdir().unwrap();
        let fd = sys::open_local(
            t.path().as_os_str().as_encoded_bytes(),
            OFlags::PATH | OFlags::DIRECTORY,
        )
        .unwrap();
        (t, Arc::new(fd))
    }

    /// A transfer large enough for any journal of these tests.
    const ANY: Extent = Extent {
        files: 1 << 20,
        bytes: 1 << 40,
    };

    /// A journal longer than its transfer's files could have recorded is discarded
    /// unread; one within the bound is read. A sparse terabyte in its place costs
    /// nothing either.
    #[test]
    fn a_journal_longer_than_its_transfer_permits_is_discarded() {
        let (t, d) = dir();
        let (j, _, _) = Journal::open(d.clone(), 5, 1 << 20, true, ANY).unwrap();
        for f in 0..500 {
            j.file_done(&id(f, 100), f as u64);
        }
        j.flush();
        drop(j);
        let path = t.path().join(".dmv.journal.0000000000000005");
        let small = Extent {
            files: 2,
            bytes: 200,
        };
        assert!(small.max_len(1 << 20) < 501 * RECORD_LEN as u64);
        let (j, c, existed) = Journal::open(d.clone(), 5, 1 << 20, true, small).unwrap();
        assert!(existed);
        assert!(c.files.is_empty(), "{} files read", c.files.len());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RECORD_LEN as u64);
        for f in 0..500 {
            j.file_done(&id(f, 100), f as u64);
        }
        j.flush();
        drop(j);
        let fits = Extent {
            files: 500,
            bytes: 500 * 100,
        };
        let (j, c, _) = Journal::open(d.clone(), 5, 1 << 20, true, fits).unwrap();
        assert_eq!(c.files.len(), 500);
        drop(j);
        // A planted sparse terabyte: not read (nor allocated).
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let started = std::time::Instant::now();
        let (_, c, existed) = Journal::open(d, 5, 1 << 20, true, fits).unwrap();
        assert!(existed && c.files.is_empty());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RECORD_LEN as u64);
    }

    #[test]
    fn records_survive_and_torn_tails_are_cut() {
        let (t, d) = dir();
        let (j, c, existed) = Journal::open(d.clone(), 7, 1 << 20, true, ANY).unwrap();
        assert!(!existed && c.files.is_empty());
        j.file_done(&id(1, 100), 0xabc);
        j.piece_done(&id(2, 5 << 20), 0, 11);
        j.piece_done(&id(2, 5 << 20), 1, 12);
        j.flush();
        assert_eq!(j.committed(), 3);
        drop(j);
        // A torn append: half a record.
        let path = t.path().join(".dmv.journal.0000000000000007");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[KIND_FILE; 30]);
        std::fs::write(&path, &bytes).unwrap();

        let (j, c, existed) = Journal::open(d.clone(), 7, 1 << 20, true, ANY).unwrap();
        assert!(existed);
        assert_eq!(c.torn, 1);
        assert_eq!(c.files[&1].done, Some(0xabc));
        assert_eq!(
            c.files[&2].pieces,
            BTreeMap::from([(0, 11), (1, 12)]),
            "pieces read back"
        );
        // The file changed: its newer record replaces the old ones.
        j.piece_done(&id(2, 6 << 20), 0, 99);
        j.flush();
        drop(j);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            5 * RECORD_LEN as u64,
            "the torn bytes were cut before appending"
        );
        let (_, c, _) = Journal::open(d.clone(), 7, 1 << 20, true, ANY).unwrap();
        assert_eq!(c.files[&2].size, 6 << 20);
        assert_eq!(c.files[&2].pieces, BTreeMap::from([(0, 99)]));
    }

    #[test]
    fn another_key_chunk_size_or_fresh_start_forgets() {
        let (t, d) = dir();
        let (j, _, _) = Journal::open(d.clone(), 1, 1 << 20, true, ANY).unwrap();
        j.piece_done(&id(2, 5 << 20), 0, 11);
        j.file_done(&id(3, 5), 1);
        j.flush();
        drop(j);
        let (_, c, _) = Journal::open(d.clone(), 1, 2 << 20, true, ANY).unwrap();
        assert!(
            c.files[&2].pieces.is_empty(),
            "pieces of another chunk size"
        );
        assert_eq!(c.files[&3].done, Some(1), "whole files still count");
        let (_, c, existed) = Journal::open(d.clone(), 1, 2 << 20, false, ANY).unwrap();
        assert!(existed && c.files.is_empty());
        // A damaged header: unreadable, starts over.
        let path = t.path().join(".dmv.journal.0000000000000001");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, c, _) = Journal::open(d, 1, 2 << 20, true, ANY).unwrap();
        assert!(c.files.is_empty());
    }

    #[test]
    fn batches_are_committed_without_a_flush() {
        let (_t, d) = dir();
        let (j, _, _) = Journal::open(d.clone(), 3, 1 << 20, false, ANY).unwrap();
        let (other, _, _) = Journal::open(d.clone(), 4, 1 << 20, false, ANY).unwrap();
        j.file_done(&id(1, 1), 1);
        j.file_done(&id(2, 1), 2);
        other.file_done(&id(1, 1), 1);
        // The one committer thread commits both once their batches' interval is up
        // (with a wide margin for a loaded machine).
        let t = Instant::now();
        while (j.committed() < 2 || other.committed() < 1) && t.elapsed() < COMMIT_INTERVAL * 20 {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!((j.committed(), other.committed()), (2, 1));
        other.remove();
        // Dropping it takes it from the committer: records not yet committed are not
        // written, and the lock is free at once.
        j.file_done(&id(3, 1), 3);
        drop(j);
        let (_, c, existed) = Journal::open(d, 3, 1 << 20, true, ANY).unwrap();
        assert!(existed);
        assert_eq!(c.files.len(), 2, "{:?}", c.files.keys());
    }

    #[test]
    fn one_session_at_a_time() {
        let (_t, d) = dir();
        let (j, _, _) = Journal::open(d.clone(), 9, 1 << 20, false, ANY).unwrap();
        let d2 = d.clone();
        let waiter =
            std::thread::spawn(move || Journal::open(d2, 9, 1 << 20, true, ANY).map(|_| ()));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "waits for the lock");
        drop(j);
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn keys_depend_on_names_and_kinds() {
        let f = EntryKind::File { size: 1 };
        let a = transfer_key([(&b"a"[..], &f)]);
        assert_ne!(a, transfer_key([(&b"b"[..], &f)]));
        assert_ne!(a, transfer_key([(&b"a"[..], &EntryKind::Dir)]));
        assert_eq!(
            a,
            transfer_key([(&b"a"[..], &EntryKind::File { size: 9 })]),
            "not sizes: a changed file is caught per record"
        );
    }
}
