//! Walking the source tree into a manifest.
//!
//! One pass, directory by directory: list the entries, sort them by inode number
//! (on ext4 and XFS that is close to on-disk order, so a cold read of many small
//! files seeks less than in hash order), stat each without following symlinks. A
//! directory's children are contiguous in the manifest, right after the directories
//! listed before it, so the parent of every entry precedes it.
//!
//! Hard links: a regular file with more than one link is remembered by (device,
//! inode); a later path of the same inode becomes an [`EntryKind::HardLink`] to the
//! first, with no data of its own. Only files with `st_nlink > 1` are remembered, so a
//! tree without links costs one comparison per file. A path the filters leave out is
//! never seen, so a link whose first path is excluded is sent as the file itself.
//!
//! Sparse files: a regular file whose allocated blocks (`st_blocks · 512`) are fewer
//! than its size may have holes; the walk lists it ([`Tree::sparse`]) so that the
//! source finds its data extents before reading it and the sink does not fill its
//! holes. A file without holes costs one more comparison, on the stat the walk made.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT};
use rustix::fs::{AtFlags, FileType, OFlags, Stat};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::paths::SourceRoot;
use crate::sys;
use crate::tree::{RootRef, Tree};

/// What a walk found.
#[derive(Debug)]
pub struct Walked {
    /// The manifest bound to its source handles.
    pub tree: Tree,
    /// Entries skipped: sockets, FIFOs, devices, or files that vanished mid-walk.
    pub skipped: u64,
    /// Entries the filters left out (an excluded directory counts once).
    pub filtered: u64,
}

fn entry_of(parent: u32, name: Vec<u8>, st: &Stat, target: Option<Vec<u8>>) -> Option<Entry> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File {
            size: st.st_size as u64,
        },
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink { target: target? },
        _ => return None,
    };
    Some(Entry {
        parent,
        name,
        kind,
        mode: st.st_mode & 0o7777,
        mtime: Mtime {
            sec: st.st_mtime,
            nsec: st.st_mtime_nsec as u32,
        },
    })
}

/// What the walk notes about regular files besides their entries.
#[derive(Default)]
struct Links {
    /// The first paths of inodes with more than one link, by (device, inode).
    first: HashMap<(u64, u64), u32>,
    /// Files with fewer allocated bytes than their size (maybe holes), in walk order.
    sparse: Vec<u32>,
    /// Every entry's numeric owner and group, in entry order (for `METADATA`, so
    /// that reading the metadata needs no second `stat`).
    owners: Vec<(u32, u32)>,
    /// Whether each entry has extended attributes, as far as the walk asked
    /// (`listxattrat(2)` beside its `stat`; `None`: not asked, or no answer).
    xattrs: Vec<Option<bool>>,
}

/// Makes `entry` (about to be pushed as index `idx`) a hard link to an earlier path
/// of its inode, or remembers it as the first path of a linked inode; notes it as
/// sparse when its blocks do not cover its size.
fn note_link(links: &mut Links, idx: u32, st: &Stat, xattrs: Option<bool>, entry: &mut Entry) {
    debug_assert_eq!(links.owners.len(), idx as usize);
    links.owners.push((st.st_uid, st.st_gid));
    links.xattrs.push(xattrs);
    let EntryKind::File { size } = entry.kind else {
        return;
    };
    if (st.st_blocks as u64).saturating_mul(512) < size {
        links.sparse.push(idx);
    }
    if st.st_nlink < 2 {
        return;
    }
    match links.first.entry((st.st_dev, st.st_ino)) {
        std::collections::hash_map::Entry::Occupied(o) => {
            entry.kind = EntryKind::HardLink { first: *o.get() };
            if links.sparse.last() == Some(&idx) {
                links.sparse.pop();
            }
        }
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(idx);
        }
    }
}

fn path_of(entries: &[Entry], labels: &HashMap<u32, String>, mut idx: u32) -> String {
    let mut names = Vec::new();
    loop {
        let e = &entries[idx as usize];
        if e.parent == NO_PARENT {
            names.push(labels.get(&idx).cloned().unwrap_or_default());
            break;
        }
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        idx = e.parent;
    }
    names.reverse();
    names.join("/")
}

/// The path of entry `idx` below its root (empty for a root).
fn rel_path(entries: &[Entry], mut idx: u32) -> Vec<u8> {
    let mut names: Vec<&[u8]> = Vec::new();
    while entries[idx as usize].parent != NO_PARENT {
        names.push(&entries[idx as usize].name);
        idx = entries[idx as usize].parent;
    }
    names.reverse();
    names.join(&b'/')
}

const READ_DIR: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

/// Walks every source root into one manifest.
pub fn walk(sources: Vec<SourceRoot>) -> Result<Walked> {
    walk_filtered(sources, &Filter::none())
}

/// [`walk`], sending only what `filter` admits (paths relative to each root; the
/// roots themselves are always sent).
pub fn walk_filtered(sources: Vec<SourceRoot>, filter: &Filter) -> Result<Walked> {
    walk_with(sources, filter, false)
}

/// [`walk_filtered`]; with `xattrs`, each entry's `stat` comes with a
/// `listxattrat(2)` saying whether it has extended attributes at all
/// ([`Tree::may_have_xattrs`]): asked by the threads that read ahead, so a push that
/// sends metadata ([`crate::meta::read_tree`]) need not ask again for the many files
/// that have none.
pub fn walk_with(sources: Vec<SourceRoot>, filter: &Filter, xattrs: bool) -> Result<Walked> {
    let mut filtered = 0;
    let mut entries: Vec<Entry> = Vec::new();
    let mut roots = HashMap::new();
    let mut labels = HashMap::new();
    let mut skipped = 0;
    let mut links = Links::default();
    for src in sources {
        let idx = entries.len() as u32;
        let (st, target, reader) = match &src.root {
            RootRef::At { parent, name } => {
                let st = rustix::fs::statat(&**parent, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| match e {
                        Errno::NOENT => Error::refused(
                            dmover_proto::control::ErrorCode::NotFound,
                            format!("{}: no such file or directory", src.label),
                        ),
                        e => Error::io("reading", &src.label, e),
                    })?;
                let target = match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => Some(
                        rustix::fs::readlinkat(&**parent, name.as_slice(), Vec::new())
                            .map_err(|e| Error::io("reading link", &src.label, e))?
                            .into_bytes(),
                    ),
                    _ => None,
                };
                let reader = (FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                    .then(|| sys::open_in(&**parent, name, READ_DIR, 0))
                    .transpose()
                    .map_err(|e| Error::io("opening", &src.label, e))?;
                (st, target, reader)
            }
            RootRef::Dir(fd) => {
                let st =
                    rustix::fs::fstat(&**fd).map_err(|e| Error::io("reading", &src.label, e))?;
                let reader = rustix::fs::openat(&**fd, ".", READ_DIR | OFlags::CLOEXEC, 0.into())
                    .map_err(|e| Error::io("opening", &src.label, e))?;
                (st, None, Some(reader))
            }
        };
        let Some(mut entry) = entry_of(NO_PARENT, src.name.clone(), &st, target) else {
            return Err(Error::refused(
                dmover_proto::control::ErrorCode::Unsupported,
                format!("{} is not a regular file, directory or symlink", src.label),
            ));
        };
        note_link(&mut links, idx, &st, None, &mut entry);
        entries.push(entry);
        labels.insert(idx, src.label.clone());
        roots.insert(idx, (src.root, src.label));
        if let Some(reader) = reader {
            let counts = (&mut skipped, &mut filtered);
            walk_dir(
                idx,
                reader,
                &mut entries,
                &labels,
                counts,
                (filter, xattrs),
                &mut links,
            )?;
        }
    }
    let mut tree = Tree::new(entries, roots);
    tree.set_sparse(links.sparse);
    tree.set_owners(links.owners);
    tree.set_xattr_presence(links.xattrs);
    Ok(Walked {
        tree,
        skipped,
        filtered,
    })
}

/// Helper threads that list and stat directories ahead of the walk.
const READ_AHEAD_THREADS: usize = 4;

/// A directory's children as a helper read them: in inode order, each with its
/// `stat` (or why not) and a symlink's target; `None` for a name the `--files-from`
/// list rules out (not stat'ed).
type Listing = Vec<(Vec<u8>, Option<Looked>)>;

/// A child's `stat`, for a symlink its target, and whether it has extended
/// attributes (when asked).
type Looked = std::result::Result<
    (
        Stat,
        Option<std::result::Result<Vec<u8>, Errno>>,
        Option<bool>,
    ),
    Errno,
>;

/// A directory to read ahead: its entry, the handle of its parent and its name there,
/// and its path below the root (for the filters).
type Job = (u32, Arc<OwnedFd>, Vec<u8>, Vec<u8>);

/// Listings read ahead and not yet taken by the walk, at most (each holds a
/// directory open).
const READ_AHEAD_MAX: usize = 64;

/// What the walk and its helpers share: directories to read, in the order the walk
/// will want them (the last first, as the walk's own stack), and the listings read.
#[derive(Default)]
struct Ahead {
    state: std::sync::Mutex<AheadState>,
    /// Helpers wait here for a job (or room for its listing).
    more: std::sync::Condvar,
    /// The walk waits here for a listing a helper is reading.
    ready: std::sync::Condvar,
}

#[derive(Default)]
struct AheadState {
    jobs: Vec<Job>,
    done: HashMap<u32, std::io::Result<(Arc<OwnedFd>, Listing)>>,
    /// Jobs being read by helpers.
    busy: usize,
    stopped: bool,
}

/// Reads the directory of `job`.
fn read_job(job: Job, how: (&Filter, bool)) -> std::io::Result<(Arc<OwnedFd>, Listing)> {
    let (_, parent, name, rel) = job;
    let fd = Arc::new(sys::open_in(&*parent, &name, READ_DIR, 0)?);
    list_dir(&fd, &rel, how).map(|l| (fd, l))
}

impl Ahead {
    fn lock(&self) -> std::sync::MutexGuard<'_, AheadState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, jobs: impl Iterator<Item = Job>) {
        self.lock().jobs.extend(jobs);
        self.more.notify_all();
    }

    fn stop(&self) {
        self.lock().stopped = true;
        self.more.notify_all();
    }

    /// A helper: reads directories until the walk stops, never more than
    /// [`READ_AHEAD_MAX`] ahead.
    fn help(&self, how: (&Filter, bool)) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.stopped {
                        return;
                    }
                    if st.done.len() + st.busy < READ_AHEAD_MAX
                        && let Some(j) = st.jobs.pop()
                    {
                        st.busy += 1;
                        break j;
                    }
                    st = self.more.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let idx = job.0;
            let r = read_job(job, how);
            let mut st = self.lock();
            st.busy -= 1;
            st.done.insert(idx, r);
            drop(st);
            self.ready.notify_all();
        }
    }

    /// The listing of directory `idx` (the walk's next): a helper's, or read here
    /// when no helper has started on it.
    fn take(&self, idx: u32, how: (&Filter, bool)) -> std::io::Result<(Arc<OwnedFd>, Listing)> {
        let mut st = self.lock();
        loop {
            if let Some(r) = st.done.remove(&idx) {
                drop(st);
                self.more.notify_all();
                return r;
            }
            if st.jobs.last().is_some_and(|j| j.0 == idx) {
                let job = st.jobs.pop().expect("just seen");
                drop(st);
                return read_job(job, how);
            }
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Lists the directory `fd` (at `rel` below the root) and stats its children, in
/// inode order (on ext4 and XFS close to on-disk order).
fn list_dir(
    fd: &OwnedFd,
    rel: &[u8],
    (filter, xattrs): (&Filter, bool),
) -> std::io::Result<Listing> {
    let mut kids: Vec<(u64, Vec<u8>)> = Vec::new();
    for de in rustix::fs::Dir::read_from(fd)? {
        let de = de?;
        let name = de.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        kids.push((de.ino(), name.to_vec()));
    }
    kids.sort_unstable_by_key(|k| k.0);
    Ok(kids
        .into_iter()
        .map(|(_, name)| {
            // A `--files-from` list rules most names out by name alone: no stat for
            // them (a `sync --watch` catch-up or batch lists a few files in a large
            // directory).
            if !filter.is_empty() && filter.listed_rules_out(&join_rel(rel, &name)) {
                return (name, None);
            }
            let looked =
                rustix::fs::statat(fd, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW).map(|st| {
                    let target =
                        (FileType::from_raw_mode(st.st_mode) == FileType::Symlink).then(|| {
                            rustix::fs::readlinkat(fd, name.as_slice(), Vec::new())
                                .map(|t| t.into_bytes())
                        });
                    let has = if xattrs {
                        crate::meta::has_xattrs_at(fd, &name)
                    } else {
                        None
                    };
                    (st, target, has)
                });
            (name, Some(looked))
        })
        .collect())
}

/// Walks the directory `root` (entry `idx`, open for reading) depth-first, with
/// helper threads listing and stat'ing the directories ahead of it (a cold tree's
/// inodes are read several at a time; the manifest's order does not change).
fn walk_dir(
    idx: u32,
    root: OwnedFd,
    entries: &mut Vec<Entry>,
    labels: &HashMap<u32, String>,
    (skipped, filtered): (&mut u64, &mut u64),
    (filter, xattrs): (&Filter, bool),
    links: &mut Links,
) -> Result<()> {
    let ahead = Ahead::default();
    std::thread::scope(|s| {
        for i in 0..READ_AHEAD_THREADS {
            let ahead = &ahead;
            let spawned = std::thread::Builder::new()
                .name(format!("dmover-walk-{i}"))
                .spawn_scoped(s, move || ahead.help((filter, xattrs)));
            if spawned.is_err() {
                break;
            }
        }
        // The helpers end with the walk, also when it fails or panics.
        let _stop = StopOnDrop(&ahead);
        walk_ahead(
            idx,
            root,
            entries,
            labels,
            (skipped, filtered),
            (filter, xattrs),
            links,
            &ahead,
        )
    })
}

struct StopOnDrop<'a>(&'a Ahead);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[allow(clippy::too_many_arguments)]
fn walk_ahead(
    idx: u32,
    root: OwnedFd,
    entries: &mut Vec<Entry>,
    labels: &HashMap<u32, String>,
    (skipped, filtered): (&mut u64, &mut u64),
    (filter, xattrs): (&Filter, bool),
    links: &mut Links,
    ahead: &Ahead,
) -> Result<()> {
    // Directories still to visit, the next last (a helper may be reading it).
    let mut stack: Vec<u32> = Vec::new();
    let root = Arc::new(root);
    let first = list_dir(&root, &[], (filter, xattrs))
        .map_err(|e| Error::io("listing", path_of(entries, labels, idx), e))?;
    let mut current = Some((idx, root, first));
    loop {
        let (dir_idx, fd, listing) = match current.take() {
            Some(c) => c,
            None => match stack.pop() {
                None => return Ok(()),
                Some(i) => match ahead.take(i, (filter, xattrs)) {
                    Ok((fd, l)) => (i, fd, l),
                    Err(e) => return Err(Error::io("opening", path_of(entries, labels, i), e)),
                },
            },
        };
        // The directory's path below its root, for the filters.
        let rel = if filter.is_empty() {
            Vec::new()
        } else {
            rel_path(entries, dir_idx)
        };
        let mut subdirs: Vec<Job> = Vec::new();
        for (name, looked) in listing {
            let Some(looked) = looked else {
                *filtered += 1;
                continue;
            };
            let child = || {
                format!(
                    "{}/{}",
                    path_of(entries, labels, dir_idx),
                    String::from_utf8_lossy(&name)
                )
            };
            let (st, target, has_xattrs) = match looked {
                Ok(l) => l,
                Err(Errno::NOENT) => {
                    *skipped += 1;
                    continue;
                }
                Err(e) => return Err(Error::io("reading", child(), e)),
            };
            let ft = FileType::from_raw_mode(st.st_mode);
            // Filters first: an excluded entry is not the walk's business at all (an
            // excluded special file is not "skipped").
            if !filter.is_empty() {
                let path = join_rel(&rel, &name);
                if !filter.admits(&path, ft == FileType::Directory) {
                    *filtered += 1;
                    continue;
                }
            }
            if !matches!(
                ft,
                FileType::RegularFile | FileType::Directory | FileType::Symlink
            ) {
                tracing::warn!(
                    "skipping {}: not a regular file, directory or symlink",
                    child()
                );
                *skipped += 1;
                continue;
            }
            let target = match target {
                None => None,
                Some(Ok(t)) => Some(t),
                Some(Err(Errno::NOENT)) => {
                    *skipped += 1;
                    continue;
                }
                Some(Err(e)) => return Err(Error::io("reading link", child(), e)),
            };
            let Some(mut entry) = entry_of(dir_idx, name, &st, target) else {
                continue;
            };
            note_link(links, entries.len() as u32, &st, has_xattrs, &mut entry);
            if entry.kind == EntryKind::Dir {
                let sub_rel = if filter.is_empty() {
                    Vec::new()
                } else {
                    join_rel(&rel, &entry.name)
                };
                subdirs.push((
                    entries.len() as u32,
                    fd.clone(),
                    entry.name.clone(),
                    sub_rel,
                ));
            }
            entries.push(entry);
        }
        // Visit subdirectories in listing order: the first last on the stack, and so
        // the first a helper takes.
        subdirs.reverse();
        stack.extend(subdirs.iter().map(|j| j.0));
        ahead.push(subdirs.into_iter());
    }
}

/// `rel/name` (`name` at the root).
fn join_rel(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(rel.len() + 1 + name.len());
    path.extend_from_slice(rel);
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The entries of a manifest that grows below one directory root (`sync --watch`):
/// each part adds the paths it is given, and the directories leading to them that
/// earlier parts did not, numbered after every entry so far (the root is entry 0, the
/// first part). Paths are stat'ed as they are now, one component at a time through
/// directory handles opened without following symlinks, as the walk does. No hard
/// links and no sparse list: a file of a part is sent as a file of its own, holes
/// filled.
#[derive(Debug)]
pub struct Grower {
    /// Directories in the manifest by path below the root (the root: empty), with
    /// their entry and a handle.
    dirs: HashMap<Vec<u8>, (u32, Arc<OwnedFd>)>,
    /// Other paths in the manifest.
    others: std::collections::HashSet<Vec<u8>>,
    /// Entries so far.
    len: u32,
}

impl Grower {
    /// A manifest whose first part is the root directory alone (entry 0), reached
    /// through `root` (a handle on it, e.g. [`Tree::dir`]).
    pub fn new(root: Arc<OwnedFd>) -> Self {
        Grower {
            dirs: HashMap::from([(Vec::new(), (0, root))]),
            others: Default::default(),
            len: 1,
        }
    }

    /// Entries so far.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether only the root is in the manifest.
    pub fn is_empty(&self) -> bool {
        self.len == 1
    }

    /// Whether `rel` is in the manifest already (as a directory or not).
    pub fn has(&self, rel: &[u8]) -> bool {
        self.others.contains(rel) || self.dirs.contains_key(rel)
    }

    /// Whether `rel` is in the manifest as other than a directory (a file, a symlink):
    /// a later version of it cannot join this manifest.
    pub fn has_file(&self, rel: &[u8]) -> bool {
        self.others.contains(rel)
    }

    /// The next part: the entries of `rels` (`/`-separated paths below the root) as
    /// they are now and of the directories leading to them not in the manifest yet,
    /// parents first. A path already in the manifest, gone, not below a directory,
    /// or of another kind than a regular file, directory or symlink is left out.
    /// Returns the entries and the paths of `rels` they hold.
    pub fn part(&mut self, rels: &[Vec<u8>]) -> (Vec<Entry>, Vec<Vec<u8>>) {
        let mut entries = Vec::new();
        let mut taken = Vec::new();
        for rel in rels {
            if rel.is_empty() || self.has(rel) {
                continue;
            }
            if self.add(rel, &mut entries).is_some() {
                taken.push(rel.clone());
            }
        }
        (entries, taken)
    }

    /// The directories in the manifest with their modification times now (those
    /// that can still be stat'ed), by entry.
    pub fn dir_times(&self) -> Vec<(u32, Mtime)> {
        let mut v: Vec<(u32, Mtime)> = self
            .dirs
            .values()
            .filter_map(|(i, fd)| {
                let st = rustix::fs::fstat(&**fd).ok()?;
                Some((
                    *i,
                    Mtime {
                        sec: st.st_mtime,
                        nsec: st.st_mtime_nsec as u32,
                    },
                ))
            })
            .collect();
        v.sort_unstable_by_key(|(i, _)| *i);
        v
    }

    /// Adds `rel` (and the directories leading to it) to `entries`.
    fn add(&mut self, rel: &[u8], entries: &mut Vec<Entry>) -> Option<()> {
        let (parent_rel, name) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&rel[..0], rel),
        };
        if name.is_empty() || name == b"." || name == b".." {
            return None;
        }
        let (parent, dir) = self.dir(parent_rel, entries)?;
        let st = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let target = match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => Some(
                rustix::fs::readlinkat(&*dir, name, Vec::new())
                    .ok()?
                    .into_bytes(),
            ),
            _ => None,
        };
        let e = entry_of(parent, name.to_vec(), &st, target)?;
        if e.kind == EntryKind::Dir {
            let fd = sys::open_in(&*dir, name, sys::DIR_PATH, 0).ok()?;
            self.dirs.insert(rel.to_vec(), (self.len, Arc::new(fd)));
        } else {
            self.others.insert(rel.to_vec());
        }
        entries.push(e);
        self.len += 1;
        Some(())
    }

    /// The entry and handle of directory `rel`, added (with its parents) if new.
    fn dir(&mut self, rel: &[u8], entries: &mut Vec<Entry>) -> Option<(u32, Arc<OwnedFd>)> {
        if let Some((i, fd)) = self.dirs.get(rel) {
            return Some((*i, fd.clone()));
        }
        if self.others.contains(rel) {
            return None;
        }
        self.add(rel, entries)?;
        self.dirs.get(rel).map(|(i, fd)| (*i, fd.clone()))
    }
}

#[cfg(test)]
mod grower_tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn parts_add_new_paths_and_their_directories_once() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("r");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), b"12345").unwrap();
        std::fs::write(root.join("a/g"), b"").unwrap();
        symlink("a/g", root.join("l")).unwrap();
        std::fs::create_dir(root.join("e")).unwrap();
        let fd = sys::open_in(
            rustix::fs::CWD,
            root.as_os_str().as_encoded_bytes(),
            sys::DIR_PATH,
            0,
        )
        .unwrap();
        let mut g = Grower::new(Arc::new(fd));
        assert!(g.is_empty());
        let rels = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let (e, taken) = g.part(&rels(&["a/b/f", "gone", "a/b/f", "x/y"]));
        assert_eq!(taken, rels(&["a/b/f"]));
        let names: Vec<_> = e.iter().map(|e| (e.parent, e.name.clone())).collect();
        assert_eq!(
            names,
            vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (2, b"f".to_vec())]
        );
        assert_eq!(e[2].kind, EntryKind::File { size: 5 });
        assert!(g.has(b"a/b") && g.has(b"a/b/f") && !g.has(b"a/g"));
        // Later parts number on; known directories are not repeated.
        let (e, taken) = g.part(&rels(&["a/g", "l", "e", "a/b/f"]));
        assert_eq!(taken, rels(&["a/g", "l", "e"]));
        assert_eq!(e[0].parent, 1);
        assert_eq!(
            e[1].kind,
            EntryKind::Symlink {
                target: b"a/g".to_vec()
            }
        );
        assert_eq!((e[2].parent, e[2].kind.clone()), (0, EntryKind::Dir));
        assert_eq!(g.len(), 7);
        // Every part together is a valid manifest.
        let mut v = dmover_proto::manifest::Validator::new();
        let root_entry = Entry {
            parent: NO_PARENT,
            name: b"r".to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime: Mtime::default(),
        };
        v.extend(&[root_entry], 100).unwrap();
        let (a, _) = {
            let mut g2 = Grower::new(g.dirs[&Vec::new()].1.clone());
            let (mut a, t) = g2.part(&rels(&["a/b/f"]));
            let (b, _) = g2.part(&rels(&["a/g", "l", "e"]));
            a.extend(b);
            (a, t)
        };
        v.extend(&a, 100).unwrap();
    }
}

#[cfg(test)]
mod read_ahead_tests {
    use super::*;
    use std::os::unix::fs::{DirEntryExt, symlink};
    use std::path::Path;

    /// The manifest order the walk promises, built the plain way: depth-first, each
    /// directory's children in inode order, subdirectories visited in that order.
    fn reference(dir: &Path, parent: u32, out: &mut Vec<(u32, Vec<u8>)>) {
        let mut kids: Vec<(u64, std::fs::DirEntry)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.ino(), e)
            })
            .collect();
        kids.sort_by_key(|k| k.0);
        let mut subdirs = Vec::new();
        for (_, e) in kids {
            out.push((parent, e.file_name().into_encoded_bytes()));
            if e.file_type().unwrap().is_dir() {
                // Entry numbers as the walk's: the root is 0.
                subdirs.push((out.len() as u32, e.path()));
            }
        }
        for (i, p) in subdirs {
            reference(&p, i, out);
        }
    }

    /// More directories than the helpers read ahead, wide and deep, with files and
    /// symlinks: the helpers change nothing of the order, and every entry is there.
    #[test]
    fn reading_ahead_keeps_the_manifest_order() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("r");
        for i in 0..40 {
            let d = root.join(format!("d{i}"));
            for j in 0..(i % 4) {
                std::fs::create_dir_all(d.join(format!("s{j}/t"))).unwrap();
                std::fs::write(d.join(format!("s{j}/t/f")), b"x").unwrap();
            }
            std::fs::create_dir_all(&d).unwrap();
            for k in 0..(i % 7) {
                std::fs::write(d.join(format!("f{k}")), vec![0u8; k]).unwrap();
            }
            symlink("f0", d.join("l")).unwrap();
        }
        std::fs::create_dir_all(root.join("empty")).unwrap();
        // `r` in the temporary directory, as a source root.
        let src = || SourceRoot {
            root: RootRef::At {
                parent: Arc::new(
                    sys::open_in(
                        rustix::fs::CWD,
                        t.path().as_os_str().as_encoded_bytes(),
                        sys::DIR_PATH,
                        0,
                    )
                    .unwrap(),
                ),
                name: b"r".to_vec(),
            },
            name: b"r".to_vec(),
            label: "r".into(),
        };
        let w = walk(vec![src()]).unwrap();
        let got: Vec<(u32, Vec<u8>)> = w
            .tree
            .entries()
            .iter()
            .skip(1)
            .map(|e| (e.parent, e.name.clone()))
            .collect();
        let mut want = Vec::new();
        reference(&root, 0, &mut want);
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
        assert_eq!(w.skipped, 0);
        // Asked beside the stats: which files have extended attributes.
        if rustix::fs::lsetxattr(
            root.join("d5/f3"),
            "user.k",
            b"v",
            rustix::fs::XattrFlags::empty(),
        )
        .is_ok()
        {
            let w = walk_with(vec![src()], &Filter::none(), true).unwrap();
            let with: Vec<String> = (0..w.tree.entries().len() as u32)
                .filter(|&i| i > 0 && w.tree.may_have_xattrs(i))
                .map(|i| w.tree.display(i))
                .collect();
            assert_eq!(with, ["r/d5/f3"]);
        }
    }
}
