//! `dmover sync --delete`: removing what a mirror holds that its source no longer has.
//!
//! [`prune`] walks the destination tree of one mirror (the directory `name` in
//! `parent`) next to the source's manifest, directory by directory, and removes every
//! entry the manifest does not list, with rsync's rules:
//! - only below the mirror: every step is an `*at` call on a directory handle, and a
//!   directory is opened with `O_NOFOLLOW`, so a symlink is removed as a link and never
//!   followed (on a server the mirror itself is opened beneath its export);
//! - an entry the filters exclude (as the source's walk would: the same rules, paths
//!   relative to the mirror) is neither sent nor deleted; an excluded directory is not
//!   looked into; a directory to delete that holds excluded entries keeps them (and
//!   stays);
//! - an entry whose kind conflicts with the manifest's (a directory where the source
//!   has a file or symlink, or the reverse) is deleted too: the transfer could not put
//!   the source's entry there otherwise. [`PruneOptions::conflicts_only`] deletes only
//!   those (run before the transfer; the rest is deleted after it succeeded);
//! - names starting with `.dmv.` (dmover's staging files and journals) are left alone;
//! - at most [`PruneOptions::max_delete`] entries are deleted; the rest are counted in
//!   [`Pruned::over_limit`];
//! - with [`PruneOptions::dry_run`] nothing is changed: what would be deleted is
//!   reported, and the regular files the destination already holds with the manifest's
//!   size and mtime (the quick check of a re-run) are listed.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT};
use rustix::fs::{AtFlags, FileType, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::sys;

/// How [`prune`] runs.
#[derive(Debug, Clone, Default)]
pub struct PruneOptions {
    /// The transfer's filters: what they exclude is protected.
    pub filter: Filter,
    /// Delete at most this many entries (each file, link and directory counts one).
    pub max_delete: Option<u64>,
    /// Change nothing; report what would be deleted and which files are unchanged.
    pub dry_run: bool,
    /// Delete only entries whose kind conflicts with the manifest's.
    pub conflicts_only: bool,
    /// `--checksum`: compute the [`content_digest`] of every regular file that has
    /// the size the manifest gives it (whatever its mtime), into [`Pruned::digests`].
    pub checksum: bool,
    /// Which regular files the mirror keeps as they are, listed in
    /// [`Pruned::unchanged`]: with [`QuickCheck::SizeAndMtime`] (the default) only
    /// in a dry run; with the others (`--size-only`, `--ignore-existing`) in every
    /// run, as the client leaves them out of its manifest.
    pub quick: QuickCheck,
}

/// Which files a sync finds unchanged at the destination, and keeps as they are (not
/// sent): rsync's quick check, or the looser ones of `--size-only` and
/// `--ignore-existing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuickCheck {
    /// A regular file with the source's size and mtime (nanoseconds).
    #[default]
    SizeAndMtime,
    /// `--size-only`: a regular file with the source's size, whatever its mtime.
    Size,
    /// `--ignore-existing`: any regular file at the source file's path, whatever its
    /// size, mtime or content (an empty source file included).
    Exists,
}

impl QuickCheck {
    /// Whether a regular file at the destination of `size` bytes modified at `mtime`
    /// is kept for the source's regular file `e`.
    pub fn keeps(self, e: &Entry, size: u64, mtime: dmover_proto::manifest::Mtime) -> bool {
        match self {
            QuickCheck::SizeAndMtime => size == e.file_size() && mtime == e.mtime,
            QuickCheck::Size => size == e.file_size(),
            QuickCheck::Exists => true,
        }
    }

    /// Whether files of no bytes are kept too (not rewritten, as every run rewrites
    /// them otherwise).
    pub fn keeps_empty(self) -> bool {
        self == QuickCheck::Exists
    }
}

/// The piece size of [`content_digest`].
pub const CONTENT_PIECE: usize = 4 << 20;

/// A file's content digest for `--checksum`, independent of any transfer's layout: the
/// transfer's per-file digest ([`dmover_proto::digest::file_digest`]) over xxh3-64
/// hashes of 4 MiB pieces read from offset 0.
pub fn content_digest(fd: impl AsFd) -> std::io::Result<u64> {
    // A buffer of the file's size (plus one byte, to see its end in one read) up to a
    // piece: zeroing 4 MiB for each small file cost a `-c` re-run of 20 000 files of
    // 8 KiB seconds. A file that grew past it since the `fstat` makes a short piece,
    // so a digest that matches nothing (the file is sent).
    let size = rustix::fs::fstat(&fd)?.st_size.max(0) as u64;
    let len = (size.saturating_add(1)).min(CONTENT_PIECE as u64) as usize;
    let mut buf = vec![0u8; len];
    let mut hashes = Vec::new();
    let mut off = 0u64;
    loop {
        let n = sys::pread_full(&fd, &mut buf, off)?;
        if n == 0 {
            break;
        }
        hashes.push(dmover_proto::digest::piece_hash(&buf[..n]));
        off += n as u64;
        if n < buf.len() {
            break;
        }
    }
    Ok(dmover_proto::digest::file_digest(&hashes))
}

/// Threads that read files for [`content_digest`]s at once: waiting on the disk more
/// than on a core (cold, 20 000 small files: the device's queue wants several
/// reads), as the destination's quick check.
const DIGEST_THREADS: usize = 8;

/// The [`content_digest`]s of `files` (entry, name) in `dir` (at `rel`), on up to
/// [`DIGEST_THREADS`] threads for more than a few files; a file that is gone is left
/// out, one that cannot be read fails the whole.
pub fn digest_in(dir: &OwnedFd, rel: &[u8], files: Vec<(u32, Vec<u8>)>) -> Result<Vec<(u32, u64)>> {
    let one = |(c, name): &(u32, Vec<u8>)| -> Result<Option<(u32, u64)>> {
        let fd = match sys::open_in(dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("opening", lossy(&join(rel, name)), e)),
        };
        let d =
            content_digest(&fd).map_err(|e| Error::io("reading", lossy(&join(rel, name)), e))?;
        Ok(Some((*c, d)))
    };
    let threads = DIGEST_THREADS.min(files.len() / 4);
    if threads < 2 {
        return files.iter().filter_map(|f| one(f).transpose()).collect();
    }
    let per = files.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = files
            .chunks(per)
            .map(|part| {
                s.spawn(move || -> Result<Vec<(u32, u64)>> {
                    part.iter().filter_map(|f| one(f).transpose()).collect()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(files.len());
        for h in parts {
            out.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
        }
        Ok(out)
    })
}

/// The [`content_digest`] of the regular file `name` in `dir` (not followed) if it has
/// `size` bytes; `None` when it is missing, of another kind or size.
fn file_digest_if_sized(dir: impl AsFd, name: &[u8], size: u64) -> Result<Option<u64>> {
    // Non-blocking: a FIFO swapped in for the file does not hang the open.
    let fd = match sys::open_in(&dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(_) => return Ok(None),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("reading", lossy(name), e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_size as u64 != size {
        return Ok(None);
    }
    let d = content_digest(&fd).map_err(|e| Error::io("reading", lossy(name), e))?;
    Ok(Some(d))
}

/// How many deleted paths a report lists (the counts are always whole).
pub const MAX_LISTED: usize = 10_000;

/// What [`prune`] did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Entries deleted (each file, symlink and directory).
    pub deleted: u64,
    /// Bytes of the regular files deleted.
    pub deleted_bytes: u64,
    /// Entries not deleted because of `max_delete`.
    pub over_limit: u64,
    /// Entries kept because the filters exclude them (and directories kept because
    /// they hold such entries).
    pub protected: u64,
    /// The paths deleted, relative to the mirror (directories end with `/`), the first
    /// [`MAX_LISTED`].
    pub paths: Vec<Vec<u8>>,
    /// Manifest entries of regular files with data the destination holds with the
    /// manifest's size and mtime (dry runs only), or as [`PruneOptions::quick`] keeps
    /// them (every run; with [`QuickCheck::Exists`] empty files too).
    pub unchanged: Vec<u32>,
    /// `checksum`: `(manifest entry, content digest)` of the destination's regular
    /// files of the manifest's size.
    pub digests: Vec<(u32, u64)>,
}

impl Pruned {
    fn note(&mut self, path: &[u8], dir: bool) {
        if self.paths.len() < MAX_LISTED {
            let mut p = path.to_vec();
            if dir {
                p.push(b'/');
            }
            self.paths.push(p);
        }
    }
}

struct Pruner<'a> {
    entries: &'a [Entry],
    /// Children of each manifest directory by name.
    kids: HashMap<u32, HashMap<&'a [u8], u32>>,
    opts: &'a PruneOptions,
    out: Pruned,
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn lossy(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// A regular file's size (0 for anything else).
fn size_of(st: &rustix::fs::Stat) -> u64 {
    if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile {
        st.st_size as u64
    } else {
        0
    }
}

const READ_DIR: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

/// Names in `dir`, sorted (`.` and `..` left out).
fn list(dir: &OwnedFd, rel: &[u8]) -> Result<Vec<Vec<u8>>> {
    let d = rustix::fs::Dir::read_from(dir).map_err(|e| Error::io("listing", lossy(rel), e))?;
    let mut names = Vec::new();
    for de in d {
        let de = de.map_err(|e| Error::io("listing", lossy(rel), e))?;
        let n = de.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    names.sort_unstable();
    Ok(names)
}

impl Pruner<'_> {
    fn may_delete(&mut self) -> bool {
        if self
            .opts
            .max_delete
            .is_some_and(|max| self.out.deleted >= max)
        {
            self.out.over_limit += 1;
            return false;
        }
        true
    }

    /// Walks the destination directory `dir` (`rel` below the mirror), which the
    /// manifest's directory `m` describes.
    fn dir(&mut self, dir: &OwnedFd, rel: &[u8], m: u32) -> Result<()> {
        let deleted_before = self.out.deleted;
        // `checksum`: this directory's files to digest, (entry, name), read at the end
        // on several threads.
        let mut to_digest = Vec::new();
        for name in list(dir, rel)? {
            if name.starts_with(b".dmv.") {
                continue;
            }
            let path = join(rel, &name);
            let st = match rustix::fs::statat(dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(Error::io("reading", lossy(&path), e)),
            };
            let ft = FileType::from_raw_mode(st.st_mode);
            let is_dir = ft == FileType::Directory;
            let listed = self
                .kids
                .get(&m)
                .and_then(|k| k.get(name.as_slice()))
                .copied();
            match listed {
                Some(c) => {
                    let e = &self.entries[c as usize];
                    let src_dir = e.kind == EntryKind::Dir;
                    if src_dir && is_dir {
                        let sub = sys::open_in(dir, &name, READ_DIR, 0)
                            .map_err(|e| Error::io("opening", lossy(&path), e))?;
                        self.dir(&sub, &path, c)?;
                    } else if src_dir != is_dir {
                        self.remove(dir, &name, &path, is_dir, size_of(&st))?;
                    } else if self.opts.checksum
                        && ft == FileType::RegularFile
                        && e.file_size() > 0
                        && st.st_size as u64 == e.file_size()
                    {
                        to_digest.push((c, name));
                    } else if (self.opts.dry_run || self.opts.quick != QuickCheck::SizeAndMtime)
                        && ft == FileType::RegularFile
                        && matches!(e.kind, EntryKind::File { .. })
                        && (e.file_size() > 0 || self.opts.quick.keeps_empty())
                        && self.opts.quick.keeps(
                            e,
                            st.st_size as u64,
                            dmover_proto::manifest::Mtime {
                                sec: st.st_mtime,
                                nsec: st.st_mtime_nsec as u32,
                            },
                        )
                    {
                        self.out.unchanged.push(c);
                    }
                }
                None => {
                    if !self.opts.filter.admits(&path, is_dir) {
                        self.out.protected += 1;
                    } else if !self.opts.conflicts_only {
                        self.remove(dir, &name, &path, is_dir, size_of(&st))?;
                    }
                }
            }
        }
        if !to_digest.is_empty() {
            let d = digest_in(dir, rel, to_digest)?;
            self.out.digests.extend(d);
        }
        if self.out.deleted > deleted_before && !self.opts.dry_run {
            // The transfer gave the directory the source's mtime; deleting changed it.
            let t = self.entries[m as usize].mtime;
            sys::set_mtime_fd(dir, t.sec, t.nsec)
                .map_err(|e| Error::io("setting the mtime of", lossy(rel), e))?;
        }
        Ok(())
    }

    /// Deletes `name` in `dir` (a directory with what it holds, but for excluded
    /// entries); returns whether it is gone. A directory is taken apart without
    /// recursion (a stack of its open levels): a tree however deep costs no call stack,
    /// and one more than [`MAX_PRUNE_DEPTH`] levels deep is refused with an error
    /// (each level holds a directory handle).
    fn remove(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &[u8],
        is_dir: bool,
        size: u64,
    ) -> Result<bool> {
        if !is_dir {
            return self.remove_file(dir, name, path, size);
        }
        let Some(top) = Level::open(dir, name, path)? else {
            return Ok(true);
        };
        let mut stack = vec![top];
        loop {
            let depth = stack.len();
            let Some(level) = stack.last_mut() else {
                unreachable!("the stack ends with its first level");
            };
            if let Some(child) = level.left.next() {
                let cpath = join(&level.path, &child);
                let st = match rustix::fs::statat(
                    &level.fd,
                    child.as_slice(),
                    AtFlags::SYMLINK_NOFOLLOW,
                ) {
                    Ok(st) => st,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(Error::io("reading", lossy(&cpath), e)),
                };
                let cdir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                if !self.opts.filter.admits(&cpath, cdir) {
                    self.out.protected += 1;
                    level.empty = false;
                } else if !cdir {
                    if !self.remove_file(&level.fd, &child, &cpath, size_of(&st))? {
                        level.empty = false;
                    }
                } else if depth >= MAX_PRUNE_DEPTH {
                    return Err(Error::refused(
                        dmover_proto::control::ErrorCode::Io,
                        format!(
                            "{}: more than {MAX_PRUNE_DEPTH} directories deep; not deleted",
                            lossy(&cpath)
                        ),
                    ));
                } else if let Some(sub) = Level::open(&level.fd, &child, &cpath)? {
                    stack.push(sub);
                }
                continue;
            }
            // Its children done: the directory itself, if it is then empty.
            let Some(done) = stack.pop() else {
                unreachable!("a level was on the stack");
            };
            let parent = stack.last().map_or(dir, |l| &l.fd);
            let gone = self.remove_emptied(parent, done)?;
            match stack.last_mut() {
                Some(up) => up.empty &= gone,
                None => return Ok(gone),
            }
        }
    }

    /// Deletes the file (or symlink, or other non-directory) `name` in `dir`.
    fn remove_file(&mut self, dir: &OwnedFd, name: &[u8], path: &[u8], size: u64) -> Result<bool> {
        if !self.may_delete() {
            return Ok(false);
        }
        if !self.opts.dry_run {
            match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(Error::io("deleting", lossy(path), e)),
            }
        }
        self.out.deleted += 1;
        self.out.deleted_bytes += size;
        self.out.note(path, false);
        Ok(true)
    }

    /// Deletes the directory `level` (in `parent`) whose children were deleted, if all
    /// were; returns whether it is gone.
    fn remove_emptied(&mut self, parent: &OwnedFd, level: Level) -> Result<bool> {
        let Level {
            fd,
            path,
            name,
            empty,
            ..
        } = level;
        drop(fd);
        if !empty {
            if self.opts.max_delete.is_some_and(|m| self.out.deleted >= m) {
                self.out.over_limit += 1;
            } else {
                self.out.protected += 1;
            }
            return Ok(false);
        }
        if !self.may_delete() {
            return Ok(false);
        }
        if !self.opts.dry_run {
            match rustix::fs::unlinkat(parent, name.as_slice(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(Error::io("deleting", lossy(&path), e)),
            }
        }
        self.out.deleted += 1;
        self.out.note(&path, true);
        Ok(true)
    }
}

/// The deepest directory [`prune`] takes apart below an extraneous directory: each
/// level holds an open handle while its children go. As deep as a manifest may be
/// ([`dmover_proto::manifest::MAX_DEPTH`]).
pub const MAX_PRUNE_DEPTH: usize = dmover_proto::manifest::MAX_DEPTH as usize;

/// A directory being taken apart: its handle, its path below the mirror, its name in
/// its parent, the children not yet looked at, and whether every child so far went.
struct Level {
    fd: OwnedFd,
    path: Vec<u8>,
    name: Vec<u8>,
    left: std::vec::IntoIter<Vec<u8>>,
    empty: bool,
}

impl Level {
    /// Opens directory `name` in `dir` and lists it (`None`: it is gone already).
    fn open(dir: &OwnedFd, name: &[u8], path: &[u8]) -> Result<Option<Level>> {
        let fd = match sys::open_in(dir, name, READ_DIR, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => return Ok(None),
            Err(e) => return Err(Error::io("opening", lossy(path), e)),
        };
        let left = list(&fd, path)?.into_iter();
        Ok(Some(Level {
            fd,
            path: path.to_vec(),
            name: name.to_vec(),
            left,
            empty: true,
        }))
    }
}

/// Deletes what the mirror `name` in `parent` holds and `entries` (a manifest of one
/// root, the mirror's source) do not list, as [`PruneOptions`] says. A mirror that does
/// not exist, or is not a directory while the source is one, holds nothing to delete
/// (the transfer replaces it).
pub fn prune(
    parent: impl AsFd,
    name: &[u8],
    entries: &[Entry],
    opts: &PruneOptions,
) -> Result<Pruned> {
    let mut roots = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.parent == NO_PARENT);
    let (root, one) = (roots.next(), roots.next());
    let (Some((root, root_entry)), None) = (root, one) else {
        return Err(Error::refused(
            dmover_proto::control::ErrorCode::Protocol,
            "a mirror's manifest has exactly one root",
        ));
    };
    let mut kids: HashMap<u32, HashMap<&[u8], u32>> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.parent != NO_PARENT {
            kids.entry(e.parent)
                .or_default()
                .insert(e.name.as_slice(), i as u32);
        }
    }
    let mut p = Pruner {
        entries,
        kids,
        opts,
        out: Pruned::default(),
    };
    if root_entry.kind != EntryKind::Dir {
        // A mirror of one file: its digest, when it has the manifest's size.
        if opts.checksum && root_entry.file_size() > 0 {
            if let Some(d) = file_digest_if_sized(&parent, name, root_entry.file_size())? {
                p.out.digests.push((root as u32, d));
            }
        }
        return Ok(p.out);
    }
    let dir = match sys::open_in(&parent, name, READ_DIR, 0) {
        Ok(fd) => fd,
        Err(e)
            if [Errno::NOENT, Errno::NOTDIR, Errno::LOOP]
                .iter()
                .any(|n| e.raw_os_error() == Some(n.raw_os_error())) =>
        {
            return Ok(p.out);
        }
        Err(e) => return Err(Error::io("opening", lossy(name), e)),
    };
    p.dir(&dir, b"", root as u32)?;
    Ok(p.out)
}
