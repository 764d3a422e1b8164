//! The destination side's disk stage: write received chunks into staging files and give
//! each file its final name once it is complete and verified.
//!
//! # Lifecycle
//! 1. [`prepare_sink`] binds a manifest to its destination (the `cp -r` rule) and
//!    [`FileSink::prepare`] creates the directories (owner-only until the end).
//!    [`FileSink::held`] tells what an earlier attempt left (from the journal, see
//!    [`crate::journal`]); [`FileSink::resume`] then leaves that out.
//! 2. [`Sink::write_chunk`], from any disk thread, in any chunk order: check the chunk's
//!    CRC, write each piece into its file's staging name
//!    (`.dmv.<transfer key>.<name>` in the same directory), fold the piece's hash
//!    into the file's digest, record digests the source sent. A file whose pieces are
//!    all written and whose digests match is finalised at once: truncated to size
//!    (after rounded direct-I/O writes), mode and mtime set, renamed into place.
//! 3. [`Sink::finish`] creates empty files, symlinks and hard links (to the first path
//!    of their inode, complete by then; also via staging names), sets
//!    directory modes and mtimes deepest first, and checks that every file arrived.
//!
//! Sparse files ([`FileSink::set_sparse`], the source's list): not preallocated, and
//! whole 4 KiB blocks of zeros (aligned in the file) are not written, so they stay
//! holes; the file is cut to its size when finalised, so a hole at the end is kept
//! too. Other files are written as they come (one comparison per piece).
//!
//! Completed files, and pieces of files of a chunk or more, are recorded in the journal.
//! A sink aborted ([`Sink::abort`]) or dropped before `finish` succeeded commits the
//! journal and removes the staging files of every file in flight that the journal does
//! not describe: a failed transfer leaves no partial file under a final name, and under
//! staging names only what a resumed session can use. `finish` removes the journal; when an earlier attempt
//! existed it also sweeps that attempt's staging files from the tree's directories.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use dmover_proto::control::{ErrorCode, Summary};
use dmover_proto::data::DigestEntry;
use dmover_proto::digest::{FileDigest, piece_hash};
use dmover_proto::layout::{Layout, Piece};
use dmover_proto::manifest::{
    ACL_ACCESS, ACL_DEFAULT, Entry, EntryKind, EntryMeta, MAX_NAME, Mtime, NO_PARENT, Xattr,
    XattrScope,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::chunk::Sink;
use crate::error::{Error, Result};
use crate::journal::{self, Contents, FileId, Journal};
use crate::meta::{self, Applier, MetaPolicy, Target};
use crate::paths::{self, Base};
use crate::prune::QuickCheck;
use crate::resume::{Held, Skips};
use crate::sys;
use crate::track::{Complete, RecvTracker, TrackError};
use crate::tree::{RootRef, Tree};
use dmover_proto::control::DirectIo;

/// Threads of the quick check of a large tree ([`FileSink::held`]).
const QUICK_CHECK_THREADS: usize = 8;

/// Files at least this large are preallocated before their first write.
const PREALLOC_MIN: u64 = 1 << 20;

/// Options of the destination side.
#[derive(Debug, Clone, Copy, Default)]
pub struct SinkOptions {
    /// Verify chunk CRCs and file digests.
    pub checksum: bool,
    /// When to write aligned files with `O_DIRECT` (falls back if the file system
    /// refuses). `Auto` writes direct: received data is not read again soon.
    pub direct_io: DirectIo,
    /// `fsync` each file before renaming it into place.
    pub fsync: bool,
    /// Re-read each file from storage after `fsync` and compare its digest before
    /// renaming it (needs `checksum`).
    pub verify: bool,
    /// Keep a resume journal.
    pub journal: bool,
    /// Read back the journal of an earlier attempt (otherwise start over).
    pub resume: bool,
    /// Take a file under its final name with the manifest's size and mtime (a regular
    /// file) as held, journaled or not: the quick check of `dmover sync` (and of
    /// `--resume` after a copy that finished, whose journal is gone).
    pub unchanged: bool,
    /// Which files under their final names [`SinkOptions::unchanged`] keeps: rsync's
    /// quick check (size and mtime), or `--size-only`'s (a kept file gets the source's
    /// mtime at the end, as `rsync --size-only -t` gives it) or `--ignore-existing`'s
    /// (any regular file, left as it is: not even its mode changes; an empty source
    /// file does not replace it either).
    pub quick: QuickCheck,
    /// What of the source's owners and extended attributes to apply
    /// ([`FileSink::set_meta`]); by default nothing, and no setuid/setgid bit.
    pub meta: MetaPolicy,
}

/// The entries bound to the destination and their layout.
#[derive(Debug)]
struct Bound {
    tree: Tree,
    layout: Arc<Layout>,
}

/// A staging file just written.
struct Staged {
    fd: std::os::fd::OwnedFd,
    /// Created with its final mode already.
    mode_set: bool,
}

/// The file-backed [`Sink`]: the destination side of a session.
#[derive(Debug)]
pub struct FileSink {
    /// The manifest's entries bound to the destination, and their layout: both grow
    /// with a growing manifest ([`FileSink::grow`]). Each entry point reads them once
    /// and hands them to its helpers, so no path takes the lock twice.
    bound: RwLock<Bound>,
    /// Entries of the first part of the manifest (those of later parts without data
    /// are completed as their part comes, not at the end).
    first_part: usize,
    /// Files kept by the quick check whose mode or owner is to be set at the end.
    fixups: Mutex<Vec<Fixup>>,
    /// Newer modification times of directories ([`FileSink::set_times`]).
    times: Mutex<HashMap<u32, Mtime>>,
    /// Empty files and symlinks completed (see [`FileSink::complete_dataless`]).
    dataless_files: AtomicU64,
    dataless_symlinks: AtomicU64,
    key: u64,
    opts: SinkOptions,
    tracker: RecvTracker,
    direct_failed: AtomicBool,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    chunks_done: AtomicU64,
    verified_bytes: AtomicU64,
    finished: AtomicBool,
    journal: Mutex<Option<Journal>>,
    /// What the journal held when the session started.
    contents: Option<Contents>,
    /// An earlier attempt left a journal (so maybe staging debris too).
    earlier: bool,
    skips: Skips,
    held_bytes: u64,
    /// Files whose staging file the journal describes: kept if the session fails.
    keep: Mutex<HashSet<u32>>,
    /// Files the source could not read.
    failed: Mutex<HashSet<u32>>,
    any_failed: AtomicBool,
    /// Entries' owners and xattrs from the source (feature `METADATA`).
    meta: RwLock<HashMap<u32, EntryMeta>>,
    applier: Applier,
    /// `sync --checksum`: paths below the root ([`Tree::rel_path`]) of the files whose
    /// content the destination already holds ([`FileSink::hold_same_content`]).
    same_content: HashSet<Vec<u8>>,
}

/// What the quick check compares of kept files' xattrs: those in `scope`, of the
/// entries whose source metadata `meta` holds.
#[derive(Clone, Copy)]
struct XattrCheck<'m> {
    scope: XattrScope,
    meta: &'m HashMap<u32, EntryMeta>,
}

/// [`final_stat`] of entry `entry`, with its xattrs in the check's scope when given
/// and the source's file has some of them (to compare; unreadable ones: not
/// compared). A file whose source has none is not asked: one more `listxattrat` per
/// kept file made a re-run of 20 000 unchanged files 13-15 % slower (docs/sync.md), so
/// an attribute removed from a file that then has none stays at the mirror.
fn final_stat_with(
    dir: &OwnedFd,
    name: &[u8],
    entry: u32,
    check: Option<XattrCheck<'_>>,
) -> Option<FinalStat> {
    let mut st = final_stat(dir, name)?;
    let Some(c) = check else {
        return Some(st);
    };
    let theirs = c
        .meta
        .get(&entry)
        .is_some_and(|m| m.xattrs.iter().any(|x| c.scope.allows(&x.name)));
    if theirs {
        st.xattrs = meta::kept_xattrs(dir, name, c.scope).ok();
    }
    Some(st)
}

/// Size and mtime of `name` in `dir` when it is a regular file (not followed if a
/// symlink).
fn final_stat(dir: &OwnedFd, name: &[u8]) -> Option<FinalStat> {
    let s = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (FileType::from_raw_mode(s.st_mode) == FileType::RegularFile).then_some(FinalStat {
        size: s.st_size as u64,
        mtime: Mtime {
            sec: s.st_mtime,
            nsec: s.st_mtime_nsec as u32,
        },
        mode: s.st_mode & 0o7777,
        owner: (s.st_uid, s.st_gid),
        xattrs: None,
    })
}

/// What the quick check sees of a file under its final name.
#[derive(Debug, Clone)]
struct FinalStat {
    size: u64,
    mtime: Mtime,
    mode: u32,
    owner: (u32, u32),
    /// Its `user.*` xattrs and ACLs ([`meta::kept_scope`]), sorted, when the source's
    /// are known to compare with (`None`: not read).
    xattrs: Option<Vec<Xattr>>,
}

/// A file the quick check kept whose mode or owner differs from the source's: set at
/// the end, as `rsync -a` does for files it does not send.
#[derive(Debug, Clone)]
struct Fixup {
    entry: u32,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    /// The source's `user.*` xattrs and ACLs, to set, and the names to remove, when
    /// they differ from the kept file's.
    xattrs: Option<(Vec<Xattr>, Vec<Vec<u8>>)>,
    /// `sync --checksum`: a file of the same content but another mtime gets the
    /// source's.
    mtime: Option<Mtime>,
}

/// Sets the owner, the `user.*` xattrs, the mode, the ACLs and the mtime (what `f`
/// holds of them, in the order [`crate::meta`] gives) of the regular file `name` in
/// `dir`, never through a symlink (whatever was swapped in meanwhile is left alone).
fn fix_file(dir: &OwnedFd, name: &[u8], f: &Fixup) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = sys::open_in(dir, name, OFlags::PATH | OFlags::NOFOLLOW, 0)?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(());
    }
    // The O_PATH handle's file, not whatever the name holds now.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if let Some((uid, gid)) = f.owner {
        rustix::fs::chownat(
            &fd,
            "",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::EMPTY_PATH,
        )?;
    }
    let acl = |x: &[u8]| x == ACL_ACCESS || x == ACL_DEFAULT;
    // A file system without xattrs has none to fix (the copy said so when it sent).
    let tolerate = |r: rustix::io::Result<()>| match r {
        Err(e) if e == Errno::OPNOTSUPP || e == Errno::NODATA => Ok(()),
        r => r,
    };
    // The attributes to set, the ACLs among them (`true`) or the others.
    let set = |acls: bool| -> rustix::io::Result<()> {
        let Some((set, _)) = &f.xattrs else {
            return Ok(());
        };
        for x in set.iter().filter(|x| acl(&x.name) == acls) {
            let flags = rustix::fs::XattrFlags::empty();
            tolerate(rustix::fs::setxattr(
                path.as_str(),
                x.name.as_slice(),
                &x.value,
                flags,
            ))?;
        }
        Ok(())
    };
    if let Some((_, remove)) = &f.xattrs {
        for n in remove {
            tolerate(rustix::fs::removexattr(path.as_str(), n.as_slice()))?;
        }
    }
    set(false)?;
    if let Some(mode) = f.mode {
        rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(mode))?;
    }
    set(true)?;
    if let Some(m) = f.mtime {
        sys::set_mtime_path(path.as_bytes(), m.sec, m.nsec)?;
    }
    Ok(())
}

impl FileSink {
    /// A sink writing `tree` (bound to destination handles), opening and locking the
    /// transfer's journal (see [`crate::journal`]).
    pub fn new(tree: Tree, chunk_size: u32, opts: SinkOptions) -> Result<Self> {
        let layout = Arc::new(
            Layout::new(tree.entries(), chunk_size)
                .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?,
        );
        let roots: Vec<u32> = tree
            .entries()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.parent == dmover_proto::manifest::NO_PARENT)
            .map(|(i, _)| i as u32)
            .collect();
        let key = journal::transfer_key(
            roots
                .iter()
                .map(|&i| (tree.root_name(i), &tree.entries()[i as usize].kind)),
        );
        let first_part = tree.entries().len();
        let mut sink = FileSink {
            bound: RwLock::new(Bound { tree, layout }),
            first_part,
            times: Mutex::default(),
            fixups: Mutex::default(),
            dataless_files: AtomicU64::new(0),
            dataless_symlinks: AtomicU64::new(0),
            key,
            opts,
            tracker: RecvTracker::new(opts.checksum),
            direct_failed: AtomicBool::new(false),
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            chunks_done: AtomicU64::new(0),
            verified_bytes: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            journal: Mutex::new(None),
            contents: None,
            earlier: false,
            skips: Skips::default(),
            held_bytes: 0,
            keep: Mutex::default(),
            failed: Mutex::default(),
            any_failed: AtomicBool::new(false),
            meta: RwLock::default(),
            applier: Applier::new(opts.meta),
            same_content: HashSet::new(),
        };
        let roots_dir = sink.bound.get_mut().tree.roots_dir();
        if opts.journal {
            if let Some(dir) = roots_dir {
                // Every entry counted as a file: a generous bound.
                let entries = sink.bound.get_mut().tree.entries();
                let extent = journal::Extent {
                    files: entries.len() as u64,
                    bytes: entries.iter().map(Entry::file_size).sum(),
                };
                match Journal::open(dir, key, chunk_size, opts.resume, extent) {
                    Ok((j, contents, earlier)) => {
                        *sink.journal.get_mut() = Some(j);
                        sink.contents = Some(contents);
                        sink.earlier = earlier;
                    }
                    Err(e @ journal::JournalError::Busy(_)) => {
                        return Err(Error::refused(ErrorCode::Busy, e.to_string()));
                    }
                    // No journal (a read-only parent, say): the copy goes on, but
                    // cannot be resumed.
                    Err(e) => tracing::warn!("{e}; this copy cannot be resumed if it fails"),
                }
            }
        }
        Ok(sink)
    }

    /// The source's owners and extended attributes of the manifest's entries, applied
    /// as each is finalised (what [`SinkOptions::meta`] allows).
    pub fn set_meta(&mut self, meta: Vec<EntryMeta>) {
        self.meta
            .get_mut()
            .extend(meta.into_iter().map(|m| (m.entry, m)));
    }

    /// `dmover sync --checksum`: the files at these paths below the root
    /// ([`Tree::rel_path`]) hold the source's content (their digests matched): each is
    /// [`FileSink::held`] when it is still a regular file of the manifest's size, and
    /// gets the source's mtime, mode and owner at the end instead of its data. Call
    /// before [`FileSink::held`]; `unchanged` should be off, as size and mtime say
    /// nothing about the other files' content.
    pub fn hold_same_content(&mut self, paths: HashSet<Vec<u8>>) {
        self.same_content = paths;
    }

    /// (growing manifest, continuous mode) Newer modification times of directories
    /// of the manifest (their contents changed after their entries went out): set at
    /// the end instead of the manifest's. Other entries' are ignored.
    pub fn set_times(&self, times: Vec<(u32, Mtime)>) {
        self.times.lock().extend(times);
    }

    /// The transfer's key (names the journal and the staging files).
    pub fn key(&self) -> u64 {
        self.key
    }

    fn file_id(b: &Bound, entry: u32) -> FileId {
        let path = journal::path_hash(b.tree.components(entry).into_iter());
        FileId::of(path, &b.tree.entries()[entry as usize])
    }

    /// What an earlier attempt left that this session can keep: files complete under
    /// their final names (journaled, and on disk with the manifest's size and mtime)
    /// and journaled pieces of files of a chunk or more whose staging files exist.
    /// Only records made for the size and mtime the manifest now gives a file count.
    pub fn held(&self) -> Held {
        let b = self.bound.read();
        let entries = b.tree.entries();
        let mut held = Held::none(entries);
        let contents = self.contents.as_ref().filter(|c| !c.files.is_empty());
        let same = &self.same_content;
        if contents.is_none() && !self.opts.unchanged && same.is_empty() {
            return held;
        }
        // Kept files' `user.*` xattrs and ACLs are compared with the source's, when
        // the source sent its own (feature METADATA) and this side takes some.
        let scope = meta::kept_scope(&self.opts.meta);
        let source_meta = self.meta.read();
        let xattrs =
            (!source_meta.is_empty() && (scope.user || scope.acls)).then_some(XattrCheck {
                scope,
                meta: &source_meta,
            });
        // The quick check looks at every file: on several threads, ahead.
        let looked =
            (self.opts.unchanged || !same.is_empty()).then(|| Self::final_stats(&b, xattrs));
        for (f, slot) in b.layout.files().iter().enumerate() {
            let entry = slot.entry;
            let e = &entries[entry as usize];
            let Ok((dir, name)) = b.tree.locate(entry) else {
                continue;
            };
            if !same.is_empty() && same.contains(&b.tree.rel_path(entry)) {
                // The same content: kept, its mtime set to the source's as its mode.
                let found = match &looked {
                    Some(looked) => looked[f].clone(),
                    None => final_stat_with(&dir, name, entry, xattrs),
                };
                if let Some(found) = found.filter(|s| s.size == e.file_size()) {
                    let mtime = (found.mtime != e.mtime).then_some(e.mtime);
                    self.note_fixup((entry, e.mode, mtime), &found, &source_meta);
                    held.done[entry as usize] = true;
                    continue;
                }
            }
            // Kept as it is when its size and mtime are the manifest's (or as
            // `quick` says); its mode and owner are set at the end where they differ
            // (with `--size-only` its mtime too; with `--ignore-existing` nothing).
            let quick = self.opts.quick;
            let on_disk = || {
                let found = match &looked {
                    Some(looked) => looked[f].clone(),
                    None => final_stat_with(&dir, name, entry, xattrs),
                };
                let Some(found) = found.filter(|s| quick.keeps(e, s.size, s.mtime)) else {
                    return false;
                };
                match quick {
                    QuickCheck::Exists => {}
                    QuickCheck::Size => {
                        let mtime = (found.mtime != e.mtime).then_some(e.mtime);
                        self.note_fixup((entry, e.mode, mtime), &found, &source_meta);
                    }
                    QuickCheck::SizeAndMtime => {
                        self.note_fixup((entry, e.mode, None), &found, &source_meta)
                    }
                }
                true
            };
            let id = Self::file_id(&b, entry);
            let st = contents
                .and_then(|c| c.files.get(&id.path))
                .filter(|st| st.size == id.size && st.mtime == id.mtime);
            let Some(st) = st else {
                // Not journaled: with `unchanged`, a file under its final name with
                // the manifest's size and mtime is taken as it is (the quick check).
                if self.opts.unchanged && on_disk() {
                    held.done[entry as usize] = true;
                }
                continue;
            };
            if st.done.is_some() || self.opts.unchanged {
                if on_disk() {
                    held.done[entry as usize] = true;
                    continue;
                }
                if st.done.is_some() {
                    continue;
                }
            }
            let f = f as u32;
            let n = b.layout.n_pieces(f);
            if !self.opts.checksum || !b.layout.chunk_aligned(f) || n < 2 {
                continue;
            }
            let pieces: Vec<(u64, u64)> = st
                .pieces
                .iter()
                .filter(|(i, _)| **i + 1 < n)
                .map(|(i, h)| (*i, *h))
                .collect();
            if pieces.is_empty() {
                continue;
            }
            let staging = self.staging_name(name);
            if rustix::fs::statat(&*dir, staging.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::RegularFile)
            {
                held.partial.insert(entry, pieces);
            }
        }
        held
    }

    /// Prepares to receive what is not `held` (all of it for a fresh start): lays out
    /// the rest, takes up the held pieces, and removes stale staging files of large
    /// files (small files' staging files are truncated when created).
    pub fn resume(&mut self, held: &Held) -> Result<()> {
        self.contents = None;
        let b = self.bound.read();
        let chunk = b.layout.chunk_size() as u32;
        let layout = held
            .layout(b.tree.entries(), chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        let skips = held.skips(&layout);
        let mut keep = HashSet::new();
        for (f, slot) in layout.files().iter().enumerate() {
            let f = f as u32;
            let pieces = skips.held(f);
            if !pieces.is_empty() {
                self.tracker.seed(f, layout.n_pieces(f), pieces);
                keep.insert(f);
            } else if self.earlier && layout.n_pieces(f) > 1 {
                if let Ok((dir, name)) = b.tree.locate(slot.entry) {
                    let staging = self.staging_name(name);
                    let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                }
            }
        }
        let held_bytes = held.bytes(b.tree.entries(), chunk);
        drop(b);
        *self.keep.get_mut() = keep;
        self.held_bytes = held_bytes;
        self.bound.get_mut().layout = Arc::new(layout);
        self.skips = skips;
        Ok(())
    }

    /// Notes entry `entry`, kept by the quick check as `found`, for [`Fixup`] where its
    /// mode, owner or xattrs differ from what the source's (`mode`, its metadata in
    /// `meta`, read-locked by the caller) and the policy give, or `mtime` is set.
    fn note_fixup(
        &self,
        (entry, mode, mtime): (u32, u32, Option<Mtime>),
        found: &FinalStat,
        meta: &HashMap<u32, EntryMeta>,
    ) {
        let m = meta.get(&entry);
        let owner = m
            .filter(|m| self.applier.applies_owner(Some(m)) && (m.uid, m.gid) != found.owner)
            .map(|m| (m.uid, m.gid));
        let want = self.applier.file_mode(mode, m) & 0o7777;
        // A chown clears the setuid and setgid bits: the mode goes again after it.
        let mode = (want != found.mode || (owner.is_some() && want & 0o6000 != 0)).then_some(want);
        // `user.*` xattrs and ACLs, where the source's are known and the kept file's
        // were read: the source's set, the others removed.
        let xattrs = m.zip(found.xattrs.as_ref()).and_then(|(m, here)| {
            let scope = meta::kept_scope(&self.opts.meta);
            let mut theirs: Vec<Xattr> = m
                .xattrs
                .iter()
                .filter(|x| scope.allows(&x.name))
                .cloned()
                .collect();
            theirs.sort_by(|a, b| a.name.cmp(&b.name));
            (theirs != *here).then(|| {
                let remove = here
                    .iter()
                    .filter(|x| !theirs.iter().any(|t| t.name == x.name))
                    .map(|x| x.name.clone())
                    .collect();
                (theirs, remove)
            })
        });
        if mode.is_some() || owner.is_some() || mtime.is_some() || xattrs.is_some() {
            self.fixups.lock().push(Fixup {
                entry,
                mode,
                owner,
                xattrs,
                mtime,
            });
        }
    }

    /// [`final_stat`] of every layout file, in layout order, on up to 8 threads for
    /// trees of more than a few thousand files: a re-run that sends nothing costs
    /// one `statat` per file on the destination, and with a cold cache each of them
    /// waits for the disk; several at once keep the device's queue busy.
    fn final_stats(b: &Bound, xattrs: Option<XattrCheck<'_>>) -> Vec<Option<FinalStat>> {
        let files = b.layout.files();
        let look = |slots: &[dmover_proto::layout::FileSlot]| -> Vec<Option<FinalStat>> {
            slots
                .iter()
                .map(|slot| {
                    let (dir, name) = b.tree.locate(slot.entry).ok()?;
                    final_stat_with(&dir, name, slot.entry, xattrs)
                })
                .collect()
        };
        // Waiting on the disk, not on a core: as many threads as keep a device's queue
        // busy, whatever the number of cores.
        let threads = QUICK_CHECK_THREADS.min(files.len() / 2048);
        if threads < 2 {
            return look(files);
        }
        let per = files.len().div_ceil(threads);
        std::thread::scope(|s| {
            let parts: Vec<_> = files
                .chunks(per)
                .map(|part| s.spawn(move || look(part)))
                .collect();
            parts
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }

    /// Bytes of file data an earlier attempt left that this session keeps.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Bytes re-read and compared by `verify`.
    pub fn verified_bytes(&self) -> u64 {
        self.verified_bytes.load(Ordering::Relaxed)
    }

    /// Layout files the source reported it could not read.
    pub fn failed_files(&self) -> Vec<u32> {
        let b = self.bound.read();
        let mut v: Vec<u32> = self
            .failed
            .lock()
            .iter()
            .map(|&f| b.layout.files()[f as usize].entry)
            .collect();
        v.sort_unstable();
        v
    }

    fn is_failed(&self, file: u32) -> bool {
        self.any_failed.load(Ordering::Acquire) && self.failed.lock().contains(&file)
    }

    /// The source could not read `file`: forget it and remove its staging file.
    fn fail_file(&self, b: &Bound, file: u32) {
        if !self.failed.lock().insert(file) {
            return;
        }
        self.any_failed.store(true, Ordering::Release);
        self.tracker.forget(file);
        self.keep.lock().remove(&file);
        let entry = b.layout.files()[file as usize].entry;
        tracing::warn!(
            "the source could not send {}; skipping it",
            b.tree.display(entry)
        );
        if let Ok((dir, name)) = b.tree.locate(entry) {
            let staging = self.staging_name(name);
            let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
        }
    }

    /// The manifest entries (of a growing manifest: so far). Holds the sink's
    /// entries locked against growth until dropped.
    pub fn tree_entries(&self) -> parking_lot::MappedRwLockReadGuard<'_, [Entry]> {
        parking_lot::RwLockReadGuard::map(self.bound.read(), |b| b.tree.entries())
    }

    /// The dataset layout (of a growing manifest: so far).
    pub fn layout(&self) -> Arc<Layout> {
        self.bound.read().layout.clone()
    }

    /// Whether checksums are on.
    pub fn checksum(&self) -> bool {
        self.opts.checksum
    }

    /// `.dmv.<key>.<name>`; a name too long for that keeps its start and gains a hash
    /// of the whole name.
    fn staging_name(&self, name: &[u8]) -> Vec<u8> {
        let mut s = self.staging_prefix();
        if s.len() + name.len() <= MAX_NAME {
            s.extend_from_slice(name);
        } else {
            s.extend_from_slice(
                format!("{:016x}~", twox_hash::XxHash3_64::oneshot(name)).as_bytes(),
            );
            let room = MAX_NAME - s.len();
            s.extend_from_slice(&name[..room]);
        }
        s
    }

    fn staging_prefix(&self) -> Vec<u8> {
        format!(".dmv.{:016x}.", self.key).into_bytes()
    }

    /// Creates every directory of the manifest, owner-only until [`Sink::finish`]
    /// gives them their modes. Existing directories are reused.
    pub fn prepare(&self) -> Result<()> {
        let b = self.bound.read();
        Self::make_dirs(&b, 0, false)
    }

    /// (growing manifest) Binds a later part of the manifest: `entries`, numbered
    /// after every earlier part's (under directories among them or earlier), whose
    /// data are the layout's `chunks` (checked: the part's files start on a fresh
    /// chunk). Creates the part's directories and completes its empty files and
    /// symlinks at once, so they show without waiting for the end of the session;
    /// its files are completed as their data arrive, hard links and directory modes
    /// at [`Sink::finish`].
    /// `meta`: the owners and extended attributes of its entries (or earlier ones),
    /// as [`FileSink::set_meta`]; `sparse`: its files that may have holes (a live
    /// walk's part), as [`FileSink::set_sparse`]; `chunk`: the size of its chunks
    /// (the session's, or another no larger, see [`Layout::extend_with`]).
    pub fn grow(
        &self,
        entries: Vec<Entry>,
        chunks: std::ops::Range<u64>,
        meta: Vec<EntryMeta>,
        sparse: Vec<u32>,
        chunk: u32,
    ) -> Result<()> {
        // A later part adds entries below the roots of the first, never a root: the
        // roots are what the destination's side checked (a pull's, those it asked
        // for), so a source may not name a new one here.
        if let Some(root) = entries.iter().find(|e| e.parent == NO_PARENT) {
            return Err(Error::protocol(
                "the source",
                format!(
                    "a later part of the manifest adds the root {:?}; roots come in the first part only",
                    String::from_utf8_lossy(&root.name)
                ),
            ));
        }
        paths::check_unreserved(entries.iter().map(|e| e.name.as_slice()))?;
        if !meta.is_empty() {
            self.meta
                .write()
                .extend(meta.into_iter().map(|m| (m.entry, m)));
        }
        let mut w = self.bound.write();
        let from = w.tree.entries().len();
        let n = entries.len();
        w.tree.extend(entries);
        w.tree.add_sparse(from, &sparse);
        let Bound { tree, layout } = &mut *w;
        let layout = Arc::make_mut(layout);
        layout
            .extend_with(tree.entries(), from, chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        if layout.n_chunks() != chunks.end {
            return Err(Error::protocol(
                "the source",
                format!(
                    "a part of the manifest lays out {} chunks, announced as {}",
                    layout.n_chunks(),
                    chunks.end
                ),
            ));
        }
        let b = parking_lot::RwLockWriteGuard::downgrade(w);
        Self::make_dirs(&b, from, true)?;
        for i in from..from + n {
            self.complete_dataless(&b, i as u32)?;
        }
        Ok(())
    }

    /// Creates the directories among entries `from..` (see [`FileSink::prepare`]):
    /// owner-only, or (`open`, a growing manifest's later part, whose session may
    /// run long) with their own mode plus `u+rwx`, so others may read the mirror
    /// meanwhile.
    fn make_dirs(b: &Bound, from: usize, open: bool) -> Result<()> {
        for (i, e) in b.tree.entries().iter().enumerate().skip(from) {
            if e.kind != EntryKind::Dir {
                continue;
            }
            let i = i as u32;
            let path = || b.tree.display(i);
            let (dir, name) = b
                .tree
                .locate(i)
                .map_err(|e| Error::io("opening the parent of", path(), e))?;
            let mode = if open { e.mode & 0o777 | 0o700 } else { 0o700 };
            match rustix::fs::mkdirat(&*dir, name, Mode::from_raw_mode(mode)) {
                Ok(()) => {}
                Err(Errno::EXIST) => {
                    let st = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| Error::io("checking", path(), e))?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                        return Err(Error::refused(
                            ErrorCode::Io,
                            format!("{} exists and is not a directory", path()),
                        ));
                    }
                }
                Err(e) => return Err(Error::io("creating directory", path(), e)),
            }
        }
        Ok(())
    }

    fn track_error(b: &Bound, file: u32, e: TrackError) -> Error {
        let path = b.tree.display(b.layout.files()[file as usize].entry);
        Error::protocol("the source", format!("{path}: {e:?}"))
    }

    /// Writes one piece into its file's staging file, creating it if needed; returns the
    /// open descriptor, for finalising the file if this piece completes it.
    fn write_piece(&self, b: &Bound, p: &Piece, n_pieces: u64, buf: &[u8]) -> Result<Staged> {
        let slot = b.layout.files()[p.file as usize];
        let path = || b.tree.display(slot.entry);
        let (dir, name) = b
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening the directory of", path(), e))?;
        let staging = self.staging_name(name);
        let mut direct = self.opts.direct_io != DirectIo::Never
            && p.aligned
            && !self.direct_failed.load(Ordering::Relaxed);
        // A file held whole by one piece is created with its final mode when the umask
        // lets it through (saving a chmod); others stay owner-writable until finalised,
        // since later pieces reopen them for writing.
        let mode = b.tree.entries()[slot.entry as usize].mode;
        let final_mode = n_pieces == 1 && mode & !sys::umask() == mode && mode & 0o6000 == 0;
        let create_mode = if final_mode { mode } else { 0o600 };
        if n_pieces == 1 && self.earlier {
            // An earlier attempt may have left this staging file, with any mode.
            let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
        }
        let fd = loop {
            let mut flags = OFlags::WRONLY | OFlags::CREATE;
            if direct {
                flags |= OFlags::DIRECT;
            }
            match sys::open_in(&*dir, &staging, flags, create_mode) {
                Ok(fd) => break fd,
                Err(e) if direct && sys::is_direct_unsupported(&e) => {
                    self.note_direct_failed(&path());
                    direct = false;
                }
                Err(e) => return Err(Error::io("creating", path(), e)),
            }
        };
        let sparse = b.tree.is_sparse(slot.entry);
        if p.index == 0 && slot.size >= PREALLOC_MIN && !sparse {
            sys::preallocate(&fd, slot.size)
                .map_err(|e| Error::io("allocating space for", path(), e))?;
        }
        let exact = &buf[p.buf_offset..p.buf_offset + p.len];
        let r = if sparse {
            self.write_sparse(b, &fd, p, buf, direct)
        } else if direct {
            // Rounded up to the alignment: the bytes past the piece land beyond the end
            // of the file (only a last piece can be unaligned) and are cut off when the
            // file is finalised.
            match sys::pwrite_all(
                &fd,
                &buf[p.buf_offset..p.buf_offset + p.direct_len()],
                p.file_offset,
            ) {
                Err(e) if sys::is_direct_unsupported(&e) => {
                    self.note_direct_failed(&path());
                    sys::pwrite_all(&fd, exact, p.file_offset)
                }
                r => r,
            }
        } else {
            sys::pwrite_all(&fd, exact, p.file_offset)
        };
        r.map_err(|e| Error::io("writing", path(), e))?;
        self.bytes_done.fetch_add(p.len as u64, Ordering::Relaxed);
        Ok(Staged {
            fd,
            mode_set: final_mode,
        })
    }

    /// Writes a piece of a sparse file but its whole zero blocks. With direct I/O
    /// every run starts block-aligned and a run that ends the piece is rounded up as
    /// a whole piece would be (cut when the file is finalised).
    fn write_sparse(
        &self,
        b: &Bound,
        fd: &std::os::fd::OwnedFd,
        p: &Piece,
        buf: &[u8],
        direct: bool,
    ) -> std::io::Result<()> {
        let exact = &buf[p.buf_offset..p.buf_offset + p.len];
        for (start, end) in sys::data_runs(p.file_offset, exact) {
            let end = if direct && end == p.len {
                p.direct_len()
            } else {
                end
            };
            let run = &buf[p.buf_offset + start..p.buf_offset + end];
            let at = p.file_offset + start as u64;
            match sys::pwrite_all(fd, run, at) {
                Err(e) if direct && sys::is_direct_unsupported(&e) => {
                    self.note_direct_failed(
                        &b.tree.display(b.layout.files()[p.file as usize].entry),
                    );
                    let _ = rustix::fs::fcntl_setfl(fd, OFlags::WRONLY);
                    sys::pwrite_all(fd, &exact[start..end.min(p.len)], at)?;
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// Names the files that may have holes (entry indices, from the source): they are
    /// written without their zero blocks and not preallocated.
    pub fn set_sparse(&mut self, entries: Vec<u32>) {
        self.bound.get_mut().tree.set_sparse(entries);
    }

    fn note_direct_failed(&self, path: &str) {
        if !self.direct_failed.swap(true, Ordering::Relaxed) {
            tracing::warn!("direct I/O is not supported for {path}; using buffered writes");
        }
    }

    /// Gives a complete file its final name, if its digest matches. `staged` is the
    /// descriptor of the write that completed it, if that is how it completed.
    fn finalize(&self, b: &Bound, file: u32, done: Complete, staged: Option<Staged>) -> Result<()> {
        let slot = b.layout.files()[file as usize];
        let entry = &b.tree.entries()[slot.entry as usize];
        let path = || b.tree.display(slot.entry);
        let (dir, name) = b
            .tree
            .locate(slot.entry)
            .map_err(|e| Error::io("opening the directory of", path(), e))?;
        let staging = self.staging_name(name);
        if done.computed != done.expected {
            drop(staged);
            let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
            return Err(Error::Checksum(format!(
                "{}: received data has digest {:016x}, the source's is {:016x}",
                path(),
                done.computed.unwrap_or(0),
                done.expected.unwrap_or(0)
            )));
        }
        let Staged { fd, mode_set } = match staged {
            Some(s) => s,
            None => Staged {
                fd: sys::open_in(&*dir, &staging, OFlags::WRONLY, 0)
                    .map_err(|e| Error::io("opening", path(), e))?,
                mode_set: false,
            },
        };
        let verify = self.opts.verify && self.opts.checksum;
        let meta = self.meta.read();
        let m = meta.get(&slot.entry);
        let target = Target::<OwnedFd>::Fd(&fd);
        self.applier
            .before_mode(&target, m)
            .map_err(|e| Error::io("setting the owner or extended attributes of", path(), e))?;
        let meta = || -> std::io::Result<()> {
            if slot.aligned() || b.layout.n_pieces(file) > 1 || b.tree.is_sparse(slot.entry) {
                // Cut what rounded direct writes (of this or an earlier attempt) put
                // past the end.
                rustix::fs::ftruncate(&fd, slot.size)?;
            }
            if !mode_set {
                let mode = self.applier.file_mode(entry.mode, m);
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            }
            sys::set_mtime_fd(&fd, entry.mtime.sec, entry.mtime.nsec)?;
            if self.opts.fsync || verify {
                rustix::fs::fsync(&fd)?;
            }
            Ok(())
        };
        meta().map_err(|e| Error::io("finalising", path(), e))?;
        self.applier
            .after_mode(&target, m)
            .map_err(|e| Error::io("setting the ACL of", path(), e))?;
        drop(fd);
        if verify {
            let on_disk = self
                .read_back(b, file, &*dir, &staging)
                .map_err(|e| Error::io("verifying", path(), e))?;
            if Some(on_disk) != done.expected {
                let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                return Err(Error::Checksum(format!(
                    "{}: the copy read back from storage has digest {on_disk:016x}, the source's is {:016x}",
                    path(),
                    done.expected.unwrap_or(0)
                )));
            }
        }
        rustix::fs::renameat(&*dir, staging.as_slice(), &*dir, name)
            .map_err(|e| Error::io("finalising", path(), e))?;
        self.files_done.fetch_add(1, Ordering::Relaxed);
        if let Some(j) = &*self.journal.lock() {
            j.file_done(&Self::file_id(b, slot.entry), done.expected.unwrap_or(0));
        }
        Ok(())
    }

    /// Reads a written (and fsynced) staging file back from storage, its cached pages
    /// dropped first, and computes its digest.
    fn read_back(
        &self,
        b: &Bound,
        file: u32,
        dir: &impl AsFd,
        staging: &[u8],
    ) -> std::io::Result<u64> {
        let fd = sys::open_in(dir, staging, OFlags::RDONLY, 0)?;
        // Clean pages (just fsynced) are dropped, so the reads below go to the device.
        let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::DontNeed);
        let mut digest = FileDigest::default();
        let mut buf = Vec::new();
        let mut n = 0;
        for (i, off, len) in b.layout.file_pieces(file) {
            buf.resize(len as usize, 0);
            let got = sys::pread_full(&fd, &mut buf, off)?;
            if got < buf.len() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file is shorter than what was written",
                ));
            }
            digest.add(i, piece_hash(&buf));
            n = i + 1;
            self.verified_bytes.fetch_add(len, Ordering::Relaxed);
        }
        Ok(digest.finish(n).unwrap_or(0))
    }

    /// Sets metadata on a staging entry and renames it to its final name.
    fn install(
        &self,
        dir: &impl AsFd,
        staging: &[u8],
        name: &[u8],
        mode: u32,
        mtime: dmover_proto::manifest::Mtime,
        set_mode: bool,
    ) -> std::io::Result<()> {
        if set_mode {
            sys::set_mode(dir, staging, mode)?;
        }
        sys::set_mtime(dir, staging, mtime.sec, mtime.nsec)?;
        rustix::fs::renameat(dir, staging, dir, name)?;
        Ok(())
    }

    /// Makes entry `i` a hard link to entry `first`'s copy, which is complete under
    /// its final name: linked under a staging name, then renamed over whatever is
    /// there. A path that already is that inode (a re-run) is left alone. Both paths
    /// are reached through the tree's confined directory handles, and `linkat` without
    /// `AT_SYMLINK_FOLLOW` never follows a symlink.
    fn link(&self, b: &Bound, i: u32, first: u32) -> Result<()> {
        let path = || b.tree.display(i);
        let (fdir, fname) = b
            .tree
            .locate(first)
            .map_err(|e| Error::io("opening the directory of", b.tree.display(first), e))?;
        let (dir, name) = b
            .tree
            .locate(i)
            .map_err(|e| Error::io("opening the directory of", path(), e))?;
        let st = match rustix::fs::statat(&*fdir, fname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => st,
            // The source could not send the first path: nothing to link to.
            _ if self.any_failed.load(Ordering::Acquire) => {
                tracing::warn!(
                    "not linking {} to {}, which was not copied",
                    path(),
                    b.tree.display(first)
                );
                return Ok(());
            }
            Ok(_) => {
                return Err(Error::refused(
                    ErrorCode::Io,
                    format!("{} is not a regular file", b.tree.display(first)),
                ));
            }
            Err(e) => return Err(Error::io("checking", b.tree.display(first), e)),
        };
        if rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| s.st_dev == st.st_dev && s.st_ino == st.st_ino)
        {
            return Ok(());
        }
        let staging = self.staging_name(name);
        let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
        rustix::fs::linkat(&*fdir, fname, &*dir, staging.as_slice(), AtFlags::empty())
            .map_err(|e| Error::io("creating hard link", path(), e))?;
        rustix::fs::renameat(&*dir, staging.as_slice(), &*dir, name).map_err(|e| {
            let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
            Error::io("finalising", path(), e)
        })
    }

    /// Creates entry `i`, an empty file or a symlink, under its staging name with its
    /// metadata, and renames it into place.
    /// Whether entry `i`'s path holds a regular file (not followed if a symlink).
    fn exists_regular(b: &Bound, i: u32) -> bool {
        b.tree
            .locate(i)
            .is_ok_and(|(dir, name)| final_stat(&dir, name).is_some())
    }

    fn complete_dataless(&self, b: &Bound, i: u32) -> Result<()> {
        let e = &b.tree.entries()[i as usize];
        let path = || b.tree.display(i);
        match &e.kind {
            EntryKind::File { size: 0 } => {
                let (dir, name) = b
                    .tree
                    .locate(i)
                    .map_err(|e| Error::io("opening the directory of", path(), e))?;
                let staging = self.staging_name(name);
                let fd = sys::open_in(
                    &*dir,
                    &staging,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
                    0o600,
                )
                .map_err(|e| Error::io("creating", path(), e))?;
                let meta = self.meta.read();
                let m = meta.get(&i);
                let t = Target::<OwnedFd>::Fd(&fd);
                let r = self.applier.before_mode(&t, m).and_then(|()| {
                    let mode = self.applier.file_mode(e.mode, m);
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                    self.applier.after_mode(&t, m)
                });
                drop(fd);
                r.and_then(|()| self.install(&*dir, &staging, name, e.mode, e.mtime, false))
                    .map_err(|err| {
                        let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                        Error::io("finalising", path(), err)
                    })?;
                self.dataless_files.fetch_add(1, Ordering::Relaxed);
            }
            EntryKind::Symlink { target } => {
                let (dir, name) = b
                    .tree
                    .locate(i)
                    .map_err(|e| Error::io("opening the directory of", path(), e))?;
                let staging = self.staging_name(name);
                let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                rustix::fs::symlinkat(target.as_slice(), &*dir, staging.as_slice())
                    .map_err(|e| Error::io("creating symlink", path(), e))?;
                let meta = self.meta.read();
                let owner = meta.get(&i).filter(|m| self.applier.applies_owner(Some(m)));
                let r = match owner {
                    Some(m) => rustix::fs::chownat(
                        &*dir,
                        staging.as_slice(),
                        Some(rustix::fs::Uid::from_raw(m.uid)),
                        Some(rustix::fs::Gid::from_raw(m.gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(std::io::Error::from),
                    None => Ok(()),
                };
                r.and_then(|()| self.install(&*dir, &staging, name, e.mode, e.mtime, false))
                    .map_err(|err| {
                        let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
                        Error::io("finalising", path(), err)
                    })?;
                self.dataless_symlinks.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }

    /// Removes staging files an earlier attempt of this transfer left in the tree's
    /// directories (files since removed from the source, or left by a crash).
    fn sweep(&self, b: &Bound) {
        let prefix = self.staging_prefix();
        let mut dirs: Vec<std::sync::Arc<std::os::fd::OwnedFd>> = Vec::new();
        dirs.extend(b.tree.roots_dir());
        for (i, e) in b.tree.entries().iter().enumerate() {
            if e.kind == EntryKind::Dir {
                if let Ok(d) = b.tree.dir(i as u32) {
                    dirs.push(d);
                }
            }
        }
        let mut removed = 0;
        for d in dirs {
            let Ok(fd) = sys::open_in(&*d, b".", OFlags::RDONLY | OFlags::DIRECTORY, 0) else {
                continue;
            };
            let Ok(list) = rustix::fs::Dir::read_from(&fd) else {
                continue;
            };
            for de in list.flatten() {
                let name = de.file_name().to_bytes();
                if name.starts_with(&prefix)
                    && rustix::fs::unlinkat(&*d, name, AtFlags::empty()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            tracing::info!("removed {removed} staging files an earlier attempt left");
        }
    }

    /// Step one of a chunk's write: its payload's CRC32C against the one it was sent
    /// with (with checksums on).
    fn check_crc(&self, b: &Bound, k: u64, buf: &[u8], crc: Option<u32>) -> Result<()> {
        if !self.opts.checksum {
            return Ok(());
        }
        crate::chunk::check_crc(&b.layout, k, buf, crc, "the source")
    }

    /// Step two: the digests of the files chunk `k` completes at the source (and the
    /// failure markers of those it could not read), each for a file the chunk holds a
    /// piece of, in file order. A file whose pieces are all here already is finalised.
    fn take_digests(&self, b: &Bound, k: u64, digests: &[DigestEntry]) -> Result<()> {
        let mut pieces = b.layout.pieces(k).peekable();
        let mut previous = None;
        for d in digests {
            // Entries come in file order, each naming a file this chunk holds a piece of:
            // one merge pass checks both.
            let file = d.index();
            if previous.is_some_and(|f| file <= f) {
                return Err(Error::protocol(
                    "the source",
                    format!("chunk {k}: digest entries out of order"),
                ));
            }
            previous = Some(file);
            while pieces.next_if(|p| p.file < file).is_some() {}
            if pieces.peek().map(|p| p.file) != Some(file) {
                return Err(Error::protocol(
                    "the source",
                    format!("chunk {k} carries a digest for file {file} it holds no piece of"),
                ));
            }
            if d.is_failure() {
                self.fail_file(b, file);
                continue;
            }
            if self.is_failed(file) {
                continue;
            }
            match self.tracker.expect(file, b.layout.n_pieces(file), d.digest) {
                Ok(Some(done)) => self.finalize(b, file, done, None)?,
                Ok(None) => {}
                Err(e) => return Err(Self::track_error(b, file, e)),
            }
        }
        Ok(())
    }

    /// Step three, for each piece of the chunk: written into its file's staging file
    /// ([`FileSink::write_piece`]), its hash journalled where resuming from it pays,
    /// and tracked; the file finalised when this was its last missing piece and its
    /// digest is known.
    fn place_piece(&self, b: &Bound, p: &Piece, buf: &[u8]) -> Result<()> {
        let file = p.file;
        if self.skips.piece_held(file, p.index) || self.is_failed(file) {
            return Ok(());
        }
        self.tracker.begin(file);
        let data = &buf[p.buf_offset..p.buf_offset + p.len];
        let hash = self.opts.checksum.then(|| piece_hash(data));
        let n = b.layout.n_pieces(file);
        let staged = self.write_piece(b, p, n, buf)?;
        if let (Some(h), false) = (hash, p.last) {
            self.journal_piece(b, p, h);
        }
        match self.tracker.written(file, p.index, n, hash) {
            Ok(Some(done)) => self.finalize(b, file, done, Some(staged)),
            Ok(None) => Ok(()),
            Err(e) => Err(Self::track_error(b, file, e)),
        }
    }

    /// Journals a written piece (not a file's last) with its hash, where resuming from
    /// it pays: a piece of a file of a chunk or more, in the session's chunk size,
    /// which the journal's pieces are counted in (a part of another size, feature
    /// PART_CHUNKS, is resent whole).
    fn journal_piece(&self, b: &Bound, p: &Piece, hash: u64) {
        let file = p.file;
        let resumable =
            b.layout.chunk_aligned(file) && b.layout.file_chunk(file) == b.layout.chunk_size();
        if !resumable {
            return;
        }
        if let Some(j) = &*self.journal.lock() {
            let id = Self::file_id(b, b.layout.files()[file as usize].entry);
            j.piece_done(&id, p.index, hash);
            self.keep.lock().insert(file);
        }
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_done.load(Ordering::Relaxed)
    }
}

impl Sink for FileSink {
    fn layout(&self) -> Arc<Layout> {
        FileSink::layout(self)
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        // The first part's (a growing manifest's later parts are all sent).
        let layout = self.bound.read().layout.clone();
        let chunks: Vec<u64> = self.skips.chunks(&layout).collect();
        Box::new(chunks.into_iter())
    }

    fn sparse_chunk(&self, k: u64) -> bool {
        let b = self.bound.read();
        !b.tree.sparse().is_empty()
            && b.layout
                .pieces(k)
                .all(|p| b.tree.is_sparse(b.layout.files()[p.file as usize].entry))
    }

    /// A chunk's durable write, in the order a reader follows it: the CRC checked
    /// ([`FileSink::check_crc`]), the source's digests taken ([`FileSink::take_digests`]:
    /// a file this chunk completes is then finalised as its last piece lands), and
    /// each piece placed in its file's staging file, journalled and tracked
    /// ([`FileSink::place_piece`]), the file finalised when complete
    /// ([`FileSink::finalize`]).
    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        let b = self.bound.read();
        self.check_crc(&b, k, buf, crc)?;
        self.take_digests(&b, k, digests)?;
        for p in b.layout.pieces(k) {
            self.place_piece(&b, &p, buf)?;
        }
        self.chunks_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&self) -> Result<Summary> {
        let b = self.bound.read();
        let expected_files = b.layout.files().len() as u64;
        let done_files = self.files_done.load(Ordering::Relaxed);
        let failed = self.failed.lock().len() as u64;
        if done_files + failed != expected_files {
            let missing = self.tracker.in_flight();
            let example = missing
                .first()
                .map(|&f| b.tree.display(b.layout.files()[f as usize].entry))
                .unwrap_or_default();
            return Err(Error::protocol(
                "the source",
                format!(
                    "{} of {expected_files} files incomplete at the end of the transfer (e.g. {example})",
                    expected_files - done_files - failed
                ),
            ));
        }
        let mut summary = Summary {
            bytes: self.bytes_done.load(Ordering::Relaxed),
            files: done_files,
            chunks: self.chunks_done.load(Ordering::Relaxed),
            verified: self.opts.checksum,
            ..Summary::default()
        };
        let entries = b.tree.entries();
        for (i, e) in entries.iter().enumerate() {
            let i = i as u32;
            match &e.kind {
                // A later part's were completed when it came.
                // `--ignore-existing`: a file already there stays, whatever its size.
                EntryKind::File { size: 0 }
                    if self.opts.quick.keeps_empty() && Self::exists_regular(&b, i) => {}
                EntryKind::File { size: 0 } | EntryKind::Symlink { .. }
                    if (i as usize) < self.first_part =>
                {
                    self.complete_dataless(&b, i)?
                }
                EntryKind::HardLink { first } => self.link(&b, i, *first)?,
                _ => {}
            }
        }
        summary.files += self.dataless_files.load(Ordering::Relaxed);
        summary.symlinks += self.dataless_symlinks.load(Ordering::Relaxed);
        // Files kept as they were, whose mode or owner changed at the source.
        let fixups = std::mem::take(&mut *self.fixups.lock());
        for f in &fixups {
            let path = || b.tree.display(f.entry);
            let (dir, name) = b
                .tree
                .locate(f.entry)
                .map_err(|e| Error::io("opening the directory of", path(), e))?;
            fix_file(&dir, name, f).map_err(|e| Error::io("setting the metadata of", path(), e))?;
        }
        if !fixups.is_empty() {
            tracing::info!(
                "set the metadata of {} files kept as they were",
                fixups.len()
            );
        }
        let times = std::mem::take(&mut *self.times.lock());
        let meta = self.meta.read();
        // Directories last, deepest first: creating their contents changed their mtimes.
        for (i, e) in entries.iter().enumerate().rev() {
            if e.kind != EntryKind::Dir {
                continue;
            }
            let i = i as u32;
            let path = || b.tree.display(i);
            let (dir, name) = b
                .tree
                .locate(i)
                .map_err(|e| Error::io("opening the directory of", path(), e))?;
            let m = meta.get(&i);
            let t = Target::At(&*dir, name);
            self.applier
                .before_mode(&t, m)
                .map_err(|e| Error::io("setting the owner or extended attributes of", path(), e))?;
            // A directory's setuid/setgid bits are filtered as a file's are.
            sys::set_mode(&*dir, name, self.applier.file_mode(e.mode, m))
                .map_err(|e| Error::io("setting the mode of", path(), e))?;
            self.applier
                .after_mode(&t, m)
                .map_err(|e| Error::io("setting the ACL of", path(), e))?;
            let mtime = times.get(&i).copied().unwrap_or(e.mtime);
            sys::set_mtime(&*dir, name, mtime.sec, mtime.nsec)
                .map_err(|e| Error::io("setting the mtime of", path(), e))?;
            summary.dirs += 1;
        }
        // Files the source could not read: no staging file left behind.
        for f in self.failed.lock().iter() {
            if let Ok((dir, name)) = b.tree.locate(b.layout.files()[*f as usize].entry) {
                let staging = self.staging_name(name);
                let _ = rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty());
            }
        }
        if self.earlier {
            self.sweep(&b);
        }
        if let Some(j) = self.journal.lock().take() {
            if failed == 0 {
                j.remove();
            } else {
                // What did arrive stays recorded: `--resume` sends the rest.
                j.flush();
            }
        }
        self.finished.store(true, Ordering::Release);
        Ok(summary)
    }

    /// Commits what the journal has (the data it describes is written), then keeps
    /// only the staging files it describes.
    fn abort(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let b = self.bound.read();
        // Commit what the journal has (the data it describes is written), then keep
        // only the staging files it describes.
        let journal = self.journal.lock().take();
        let kept = match &journal {
            Some(j) => {
                j.flush();
                !j.is_broken()
            }
            None => false,
        };
        let keep = std::mem::take(&mut *self.keep.lock());
        let mut removed = 0;
        let mut held = 0;
        for f in self.tracker.in_flight() {
            if kept && keep.contains(&f) {
                held += 1;
                self.release_unwritten(&b, f);
                continue;
            }
            let entry = b.layout.files()[f as usize].entry;
            if let Ok((dir, name)) = b.tree.locate(entry) {
                let staging = self.staging_name(name);
                if rustix::fs::unlinkat(&*dir, staging.as_slice(), AtFlags::empty()).is_ok() {
                    removed += 1;
                }
            }
        }
        if removed > 0 || held > 0 {
            tracing::info!(
                "removed {removed} incomplete staging files; kept {held} the journal can resume"
            );
        }
    }
}

impl FileSink {
    /// Gives back the space preallocated for kept staging file `f` beyond what was
    /// written (issue 46, item 7: a peer that declares a huge size, sends one chunk and
    /// goes away reserves no more than it sent). Its size and data stay, for a resume.
    fn release_unwritten(&self, b: &Bound, f: u32) {
        let file = &b.layout.files()[f as usize];
        if file.size < PREALLOC_MIN {
            return;
        }
        let Ok((dir, name)) = b.tree.locate(file.entry) else {
            return;
        };
        let staging = self.staging_name(name);
        let released = sys::open_in(&*dir, &staging, OFlags::WRONLY, 0)
            .and_then(|fd| sys::release_unwritten(&fd, file.size));
        if let Err(e) = released {
            tracing::warn!("giving back the unwritten space of a kept staging file: {e}");
        }
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        self.abort();
    }
}

/// `cp -r src dest` makes `dest` the copy of `src` when `dest` does not exist, and its
/// parent otherwise. An interrupted first attempt leaves `dest` existing, so a retry
/// or `--resume` would copy into it: when the journal of an earlier attempt that made
/// `dest` the root itself is in `dest`'s parent, that attempt is continued instead.
fn continued_dest(
    base: &Base,
    dest: &[u8],
    entries: &[Entry],
    roots: &[(u32, &Entry)],
    opts: SinkOptions,
) -> Result<Option<HashMap<u32, (RootRef, String)>>> {
    let [(idx, root)] = roots else {
        return Ok(None);
    };
    if !opts.journal || root.kind != EntryKind::Dir {
        return Ok(None);
    }
    let Ok(Some((parent, name))) = paths::dest_parent(base, dest) else {
        return Ok(None);
    };
    let key = journal::transfer_key([(name.as_slice(), &root.kind)]);
    let journal = journal::journal_name(key);
    let shown = String::from_utf8_lossy(dest).into_owned();
    if rustix::fs::statat(&parent, journal.as_slice(), AtFlags::SYMLINK_NOFOLLOW).is_err() {
        if !opts.resume || dest.ends_with(b"/") {
            return Ok(None);
        }
        // No interrupted attempt made `dest` the root. If `dest` is a directory that
        // is a finished copy of the root itself, `cp -r` would now nest a second copy
        // in it: continue it in place instead, or refuse.
        if !finished_copy_of(&parent, &name, *idx, entries, &shown)? {
            return Ok(None);
        }
    }
    Ok(Some(HashMap::from([(
        *idx,
        (
            RootRef::At {
                parent: Arc::new(parent),
                name,
            },
            shown,
        ),
    )])))
}

/// Whether `dir` in `parent` is a finished copy of the directory root `idx` (so a
/// `--resume` continues in it rather than nesting a second copy): it is a directory
/// without a `NAME` of the root's inside and without a journal of a copy into it, and
/// has the root's mtime (a finished copy set it). Refuses when it holds entries named
/// like the root's children but its mtime differs (modified since): ambiguous.
fn finished_copy_of(
    parent: &std::os::fd::OwnedFd,
    dir: &[u8],
    idx: u32,
    entries: &[Entry],
    shown: &str,
) -> Result<bool> {
    let root = &entries[idx as usize];
    let Ok(st) = rustix::fs::statat(parent, dir, AtFlags::SYMLINK_NOFOLLOW) else {
        return Ok(false);
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Ok(false);
    }
    let Ok(fd) = sys::open_in(parent, dir, OFlags::PATH | OFlags::DIRECTORY, 0) else {
        return Ok(false);
    };
    let exists = |name: &[u8]| rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW).is_ok();
    let key = journal::transfer_key([(root.name.as_slice(), &root.kind)]);
    if exists(&root.name) || exists(&journal::journal_name(key)) {
        return Ok(false);
    }
    if st.st_mtime == root.mtime.sec && st.st_mtime_nsec as u32 == root.mtime.nsec {
        return Ok(true);
    }
    let looks_copied = entries.iter().any(|e| e.parent == idx && exists(&e.name));
    if looks_copied {
        let name = String::from_utf8_lossy(&root.name);
        return Err(Error::refused(
            ErrorCode::Io,
            format!(
                "--resume: {shown} holds no interrupted copy (no {shown}/{name}, no \
                 journal) but looks like a finished copy of {name} itself; resuming would \
                 nest a second copy in it. `dmover sync SRC {shown}` updates it in place; \
                 without --resume the copy goes into {shown}/{name}"
            ),
        ));
    }
    Ok(false)
}

/// Binds an incoming manifest to its destination `dest` under `base` (continuing an
/// interrupted attempt's root, see the `cp -r` rule) and creates its directories.
pub fn prepare_sink(
    base: &Base,
    dest: &[u8],
    entries: Vec<Entry>,
    chunk_size: u32,
    opts: SinkOptions,
) -> Result<FileSink> {
    let roots: Vec<(u32, &Entry)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.parent == NO_PARENT)
        .map(|(i, e)| (i as u32, e))
        .collect();
    if opts.resume && dest.ends_with(b"/") && base.open_dir(dest).is_err() {
        // `DST/` names a directory that receives the roots (`dmover sync` names the
        // mirror's parent so): it must exist, or the copy would land in its place.
        return Err(Error::refused(
            ErrorCode::NotFound,
            format!(
                "{}: no such directory",
                String::from_utf8_lossy(dest).trim_end_matches('/')
            ),
        ));
    }
    let bound = match continued_dest(base, dest, &entries, &roots, opts)? {
        Some(b) => b,
        None => paths::resolve_dest(base, dest, &roots)?,
    };
    let tree = Tree::new(entries, bound);
    paths::check_unreserved(
        tree.entries()
            .iter()
            .enumerate()
            .map(|(i, e)| match e.parent {
                NO_PARENT => tree.root_name(i as u32),
                _ => e.name.as_slice(),
            }),
    )?;
    let sink = FileSink::new(tree, chunk_size, opts)?;
    sink.prepare()?;
    Ok(sink)
}
