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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmover_proto::manifest::{Entry, EntryKind, EntryMeta, Mtime, NO_PARENT, Xattr, XattrScope};
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
    /// (a walk that reads metadata, [`How::meta`]) Each entry's owners and extended
    /// attributes, in entry order (a root that is the export itself has none).
    meta: Vec<EntryMeta>,
    want_meta: bool,
}

/// What a walk asks of each entry besides its `stat`.
#[derive(Clone, Copy)]
struct How<'a> {
    filter: &'a Filter,
    /// Whether it has extended attributes (`listxattrat(2)`).
    xattrs: bool,
    /// Its extended attributes in this scope, read by the threads that read ahead
    /// (a live walk's metadata, feature `METADATA`).
    meta: Option<XattrScope>,
    /// A failed read of extended attributes was logged.
    warned: &'a AtomicBool,
}

impl How<'_> {
    /// The extended attributes of `name` in `fd` (of type `ft`) in the metadata's
    /// scope: `None` when not asked (or not wanted for this kind, as
    /// [`crate::meta::read_tree`] decides).
    fn read_xattrs(&self, fd: &OwnedFd, name: &[u8], ft: FileType) -> Option<Vec<Xattr>> {
        let scope = self.meta?;
        // Linux allows no user.* attributes on symlinks, and ACLs are not theirs.
        if !(scope.user || scope.acls || scope.all) || (ft == FileType::Symlink && !scope.all) {
            return None;
        }
        match crate::meta::read_xattrs_at(fd, name, scope) {
            Ok(x) => Some(x),
            Err(err) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "reading the extended attributes of {}: {err}; sent without them",
                        String::from_utf8_lossy(name)
                    );
                }
                Some(Vec::new())
            }
        }
    }
}

/// Makes `entry` (about to be pushed as index `idx`) a hard link to an earlier path
/// of its inode, or remembers it as the first path of a linked inode; notes it as
/// sparse when its blocks do not cover its size.
fn note_link(
    links: &mut Links,
    idx: u32,
    st: &Stat,
    (xattrs, read): (Option<bool>, Option<Vec<Xattr>>),
    entry: &mut Entry,
) {
    debug_assert_eq!(links.owners.len(), idx as usize);
    links.owners.push((st.st_uid, st.st_gid));
    links
        .xattrs
        .push(xattrs.or(read.as_ref().map(|x| !x.is_empty())));
    if links.want_meta {
        links.meta.push(EntryMeta {
            entry: idx,
            uid: st.st_uid,
            gid: st.st_gid,
            xattrs: read.unwrap_or_default(),
        });
    }
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
    let warned = AtomicBool::new(false);
    let how = How {
        filter,
        xattrs,
        meta: None,
        warned: &warned,
    };
    let core = walk_core(sources, how, &mut |_| true)?;
    Ok(core.into_walked().0)
}

/// How a live walk cuts its manifest into parts ([`walk_live`]).
#[derive(Debug, Clone, Copy)]
pub struct Cuts {
    /// A walk that ends before this many entries goes whole.
    pub at: usize,
    /// The first part's entries.
    pub first: usize,
    /// The largest part: each part is twice the one before, up to this.
    pub max: usize,
    /// A part smaller than its turn (but of `first` entries at least) goes when this
    /// long has passed since the one before: a slow walk still feeds the copy.
    pub wait: Duration,
}

/// How a live walk starts.
#[derive(Debug)]
pub enum Start {
    /// The walk ended before [`Cuts::at`] entries, or had several roots: the whole
    /// tree, and its entries' metadata (when asked).
    Whole(Walked, Vec<EntryMeta>),
    /// The first part of a walk that goes on: its tree (its sparse files, owners
    /// and xattr presence), its entries' metadata, and every entry walked by then
    /// (the first part's and the next ones', at least [`Cuts::at`]: for choices that
    /// depend on the files' sizes); the rest comes in [`WalkPart`]s. `skipped` and
    /// `filtered` are those of the last part.
    First(Walked, Vec<EntryMeta>, Vec<Entry>),
}

/// A later part of a live walk.
#[derive(Debug)]
pub struct WalkPart {
    /// Its entries, numbered after every earlier part's; their parents are earlier.
    /// It may hold hard links to a file of any part up to it.
    pub entries: Vec<Entry>,
    /// Its files that may have holes (entry indices, ascending).
    pub sparse: Vec<u32>,
    /// Its entries' owners and extended attributes (when asked).
    pub meta: Vec<EntryMeta>,
    /// The walk ended with it.
    pub last: bool,
    /// (the last part) Entries the walk skipped, and those the filters left out.
    pub skipped: u64,
    /// See `skipped`.
    pub filtered: u64,
}

/// Walks `sources` as [`walk_filtered`], handing the manifest out while the walk
/// runs: once it has [`Cuts::at`] entries, their first [`Cuts::first`] go to `start`
/// as [`Start::First`] and the rest to `part` as the walk finds them (any prefix of
/// a running walk is a manifest: entries are only appended, each after its parent),
/// the last part marked. A walk that ends sooner, or of several roots (a later root
/// would come in a later part), goes whole to `start`. With `meta`, each entry's
/// owners and extended attributes in that scope are read with its `stat`, by the
/// threads that read ahead. `part` returning `false` stops the walk (its receiver is
/// gone). An error before `start` was called returns with nothing called; after it,
/// the parts end without one marked last.
pub fn walk_live(
    sources: Vec<SourceRoot>,
    filter: &Filter,
    meta: Option<XattrScope>,
    cuts: Cuts,
    start: impl FnOnce(Start),
    mut part: impl FnMut(WalkPart) -> bool,
) -> Result<()> {
    let warned = AtomicBool::new(false);
    let how = How {
        filter,
        xattrs: false,
        meta,
        warned: &warned,
    };
    let live = sources.len() == 1;
    let mut start = Some(start);
    let mut stopped = false;
    let mut cut = Cutter {
        cuts,
        sent: 0,
        sparse_sent: 0,
        size: cuts.first,
        last: Instant::now(),
    };
    let core = walk_core(sources, how, &mut |v: View<'_>| {
        if !live {
            return true;
        }
        if start.is_some() {
            if v.entries.len() < cuts.at.max(cuts.first + 1) {
                return true;
            }
            let first = cut.first(v);
            if let Some(s) = start.take() {
                s(first);
            }
            return true;
        }
        let go_on = cut.parts(v, false).into_iter().all(&mut part);
        stopped = !go_on;
        go_on
    })?;
    if stopped {
        return Ok(());
    }
    if let Some(s) = start.take() {
        let (walked, meta) = core.into_walked();
        s(Start::Whole(walked, meta));
        return Ok(());
    }
    let mut core = core;
    let view = View {
        entries: &core.entries,
        links: &mut core.links,
        roots: &core.roots,
    };
    let mut parts = cut.parts(view, true);
    if let Some(last) = parts.last_mut() {
        last.skipped = core.skipped;
        last.filtered = core.filtered;
    }
    for p in parts {
        if !part(p) {
            break;
        }
    }
    Ok(())
}

/// Where a live walk is in cutting its manifest.
struct Cutter {
    cuts: Cuts,
    /// Entries handed out.
    sent: usize,
    /// Of the walk's sparse files, those handed out.
    sparse_sent: usize,
    /// The next part's size.
    size: usize,
    /// When the last part went.
    last: Instant,
}

impl Cutter {
    /// The first part, as [`Start::First`].
    fn first(&mut self, v: View<'_>) -> Start {
        let n = self.cuts.first;
        let entries = v.entries[..n].to_vec();
        let mut tree = Tree::new(entries, v.roots.clone());
        let sparse = self.take_sparse(v.links, n);
        tree.set_sparse(sparse);
        tree.set_owners(v.links.owners[..n].to_vec());
        tree.set_xattr_presence(v.links.xattrs[..n].to_vec());
        let meta = take_meta(v.links, n);
        self.sent = n;
        self.size = (n * 2).min(self.cuts.max.max(1));
        self.last = Instant::now();
        Start::First(
            Walked {
                tree,
                skipped: 0,
                filtered: 0,
            },
            meta,
            v.entries.to_vec(),
        )
    }

    /// The parts due: each of its turn's size, or a smaller one of the entries
    /// waiting once [`Cuts::wait`] has passed; with `end`, the rest as the last (it
    /// may be empty).
    fn parts(&mut self, v: View<'_>, end: bool) -> Vec<WalkPart> {
        let mut out = Vec::new();
        loop {
            let pending = v.entries.len() - self.sent;
            let slow = pending >= self.cuts.first && self.last.elapsed() >= self.cuts.wait;
            let take = if pending >= self.size {
                self.size
            } else if end || slow {
                pending
            } else {
                break;
            };
            let to = self.sent + take;
            let last = end && to == v.entries.len();
            out.push(WalkPart {
                entries: v.entries[self.sent..to].to_vec(),
                sparse: self.take_sparse(v.links, to),
                meta: take_meta(v.links, to),
                last,
                skipped: 0,
                filtered: 0,
            });
            self.sent = to;
            self.size = (self.size * 2).min(self.cuts.max.max(1));
            self.last = Instant::now();
            if last || (take == 0) {
                break;
            }
        }
        out
    }

    /// The walk's sparse files below entry `to` not yet handed out.
    fn take_sparse(&mut self, links: &Links, to: usize) -> Vec<u32> {
        let rest = &links.sparse[self.sparse_sent..];
        let n = rest.partition_point(|&i| (i as usize) < to);
        self.sparse_sent += n;
        rest[..n].to_vec()
    }
}

/// The metadata read of entries below `to`, taken out of the walk's notes.
fn take_meta(links: &mut Links, to: usize) -> Vec<EntryMeta> {
    let n = links.meta.partition_point(|m| (m.entry as usize) < to);
    links.meta.drain(..n).collect()
}

/// The roots of a walk: where each lives, and its label.
type Roots = HashMap<u32, (RootRef, String)>;

/// What a walk's hook sees after each directory: the entries so far and what the
/// walk noted of them.
struct View<'a> {
    entries: &'a [Entry],
    links: &'a mut Links,
    roots: &'a Roots,
}

/// Called after each directory the walk lists; `false` stops the walk.
type Hook<'h> = dyn FnMut(View<'_>) -> bool + 'h;

/// A walk's raw result.
struct Core {
    entries: Vec<Entry>,
    roots: Roots,
    links: Links,
    skipped: u64,
    filtered: u64,
}

impl Core {
    /// The walked tree, and the metadata read with it.
    fn into_walked(self) -> (Walked, Vec<EntryMeta>) {
        let mut tree = Tree::new(self.entries, self.roots);
        tree.set_sparse(self.links.sparse);
        tree.set_owners(self.links.owners);
        tree.set_xattr_presence(self.links.xattrs);
        (
            Walked {
                tree,
                skipped: self.skipped,
                filtered: self.filtered,
            },
            self.links.meta,
        )
    }
}

fn walk_core(sources: Vec<SourceRoot>, how: How<'_>, hook: &mut Hook<'_>) -> Result<Core> {
    let mut filtered = 0;
    let mut entries: Vec<Entry> = Vec::new();
    let mut roots = HashMap::new();
    let mut labels = HashMap::new();
    let mut skipped = 0;
    let mut links = Links {
        want_meta: how.meta.is_some(),
        ..Links::default()
    };
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
        // The root's metadata, when it is a name in a directory (a root that is the
        // export itself has none, as in `meta::read_tree`).
        let read = match &src.root {
            RootRef::At { parent, name } => {
                how.read_xattrs(parent, name, FileType::from_raw_mode(st.st_mode))
            }
            RootRef::Dir(_) => None,
        };
        let has_meta = matches!(src.root, RootRef::At { .. });
        note_link(&mut links, idx, &st, (None, read), &mut entry);
        if !has_meta && links.want_meta {
            links.meta.pop();
        }
        entries.push(entry);
        labels.insert(idx, src.label.clone());
        roots.insert(idx, (src.root, src.label));
        if let Some(reader) = reader {
            let counts = (&mut skipped, &mut filtered);
            let go_on = walk_dir(
                idx,
                reader,
                (&mut entries, &mut links),
                (&labels, &roots),
                counts,
                how,
                hook,
            )?;
            if !go_on {
                break;
            }
        }
    }
    Ok(Core {
        entries,
        roots,
        links,
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

/// A child's `stat`, for a symlink its target, whether it has extended attributes
/// (when asked), and its extended attributes (when the metadata is read).
type Looked = std::result::Result<
    (
        Stat,
        Option<std::result::Result<Vec<u8>, Errno>>,
        Option<bool>,
        Option<Vec<Xattr>>,
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
fn read_job(job: Job, how: How<'_>) -> std::io::Result<(Arc<OwnedFd>, Listing)> {
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
    fn help(&self, how: How<'_>) {
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
    fn take(&self, idx: u32, how: How<'_>) -> std::io::Result<(Arc<OwnedFd>, Listing)> {
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
fn list_dir(fd: &OwnedFd, rel: &[u8], how: How<'_>) -> std::io::Result<Listing> {
    let (filter, xattrs) = (how.filter, how.xattrs);
    let mut kids: Vec<(u64, Vec<u8>)> = Vec::new();
    for de in rustix::fs::Dir::read_from(fd)? {
        let de = de?;
        let name = de.file_name().to_bytes();
        // dmover's own files (staging files, journals) are never sent: a receiver
        // refuses those names.
        if name == b"." || name == b".." || crate::paths::is_reserved(name) {
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
                    let read = how.read_xattrs(fd, &name, FileType::from_raw_mode(st.st_mode));
                    let has = if xattrs && read.is_none() {
                        crate::meta::has_xattrs_at(fd, &name)
                    } else {
                        None
                    };
                    (st, target, has, read)
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
    (entries, links): (&mut Vec<Entry>, &mut Links),
    (labels, roots): (&HashMap<u32, String>, &Roots),
    (skipped, filtered): (&mut u64, &mut u64),
    how: How<'_>,
    hook: &mut Hook<'_>,
) -> Result<bool> {
    let ahead = Ahead::default();
    std::thread::scope(|s| {
        for i in 0..READ_AHEAD_THREADS {
            let ahead = &ahead;
            let spawned = std::thread::Builder::new()
                .name(format!("dmover-walk-{i}"))
                .spawn_scoped(s, move || ahead.help(how));
            if spawned.is_err() {
                break;
            }
        }
        // The helpers end with the walk, also when it fails or panics.
        let _stop = StopOnDrop(&ahead);
        walk_ahead(
            idx,
            root,
            (entries, links),
            (labels, roots),
            (skipped, filtered),
            how,
            (&ahead, hook),
        )
    })
}

struct StopOnDrop<'a>(&'a Ahead);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The walk below one root: depth-first, a directory's children together, read
/// ahead by `ahead`'s helpers; `hook` after each directory (`false`: stop, and
/// return `false`).
fn walk_ahead(
    idx: u32,
    root: OwnedFd,
    (entries, links): (&mut Vec<Entry>, &mut Links),
    (labels, roots): (&HashMap<u32, String>, &Roots),
    (skipped, filtered): (&mut u64, &mut u64),
    how: How<'_>,
    (ahead, hook): (&Ahead, &mut Hook<'_>),
) -> Result<bool> {
    let filter = how.filter;
    // Directories still to visit, the next last (a helper may be reading it).
    let mut stack: Vec<u32> = Vec::new();
    let root = Arc::new(root);
    let first = list_dir(&root, &[], how)
        .map_err(|e| Error::io("listing", path_of(entries, labels, idx), e))?;
    let mut current = Some((idx, root, first));
    loop {
        let (dir_idx, fd, listing) = match current.take() {
            Some(c) => c,
            None => match stack.pop() {
                None => return Ok(true),
                Some(i) => match ahead.take(i, how) {
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
            let (st, target, has_xattrs, read) = match looked {
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
            note_link(
                links,
                entries.len() as u32,
                &st,
                (has_xattrs, read),
                &mut entry,
            );
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
        let view = View {
            entries,
            links: &mut *links,
            roots,
        };
        if !hook(view) {
            return Ok(false);
        }
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
    /// of another kind than a regular file, directory or symlink, or through one of
    /// dmover's own names (`.dmv.*`) is left out.
    /// Returns the entries and the paths of `rels` they hold.
    pub fn part(&mut self, rels: &[Vec<u8>]) -> (Vec<Entry>, Vec<Vec<u8>>) {
        let mut entries = Vec::new();
        let mut taken = Vec::new();
        for rel in rels {
            let own = rel.split(|&b| b == b'/').any(crate::paths::is_reserved);
            if rel.is_empty() || own || self.has(rel) {
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

#[cfg(test)]
mod live_tests {
    use super::*;
    use std::path::Path;

    fn src(dir: &Path, name: &str) -> SourceRoot {
        SourceRoot {
            root: RootRef::At {
                parent: Arc::new(
                    sys::open_in(
                        rustix::fs::CWD,
                        dir.as_os_str().as_encoded_bytes(),
                        sys::DIR_PATH,
                        0,
                    )
                    .unwrap(),
                ),
                name: name.as_bytes().to_vec(),
            },
            name: name.as_bytes().to_vec(),
            label: name.into(),
        }
    }

    /// dmover's own files (staging files, journals) are not walked: a receiver refuses
    /// their names, and they are no part of the tree.
    #[test]
    fn dmovers_own_files_are_not_walked() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("r");
        std::fs::create_dir_all(root.join("sub/.dmv.dir")).unwrap();
        for f in [
            "kept",
            ".dmv.journal.0000000000000001",
            "sub/.dmv.0123.kept2",
            "sub/.dmv",
        ] {
            std::fs::write(root.join(f), b"x").unwrap();
        }
        let w = walk(vec![src(t.path(), "r")]).unwrap();
        let mut names: Vec<String> = w
            .tree
            .entries()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        names.sort();
        // `.dmv` itself is no name of dmover's (the prefix is `.dmv.`).
        assert_eq!(names, [".dmv", "kept", "r", "sub"]);
    }

    /// A tree whose later directories hold hard links to files of earlier ones and
    /// files with holes, so that both fall into parts after the first.
    fn tree(root: &Path) {
        for i in 0..12 {
            let d = root.join(format!("d{i:02}"));
            std::fs::create_dir_all(d.join("sub")).unwrap();
            for k in 0..5 {
                std::fs::write(d.join(format!("f{k}")), vec![b'a' + k as u8; k * 100]).unwrap();
            }
            std::fs::write(d.join("sub/g"), b"g").unwrap();
            if i % 3 == 2 {
                let f = std::fs::File::create(d.join("holes")).unwrap();
                f.set_len(1 << 20).unwrap();
            }
            if i >= 4 {
                std::fs::hard_link(root.join("d00/f3"), d.join(format!("link{i}"))).unwrap();
            }
        }
    }

    const CUTS: Cuts = Cuts {
        at: 20,
        first: 8,
        max: 16,
        wait: Duration::from_secs(3600),
    };

    /// Walks `dir/name` live; the start and the parts.
    fn live(dir: &Path, name: &str, cuts: Cuts, meta: bool) -> (Start, Vec<WalkPart>) {
        let mut first = None;
        let mut parts = Vec::new();
        let scope = meta.then_some(XattrScope {
            user: true,
            acls: true,
            all: false,
        });
        walk_live(
            vec![src(dir, name)],
            &Filter::none(),
            scope,
            cuts,
            |s| first = Some(s),
            |p| {
                parts.push(p);
                true
            },
        )
        .unwrap();
        (first.unwrap(), parts)
    }

    #[test]
    fn a_live_walk_hands_out_the_whole_walk_in_parts() {
        let t = tempfile::tempdir().unwrap();
        tree(&t.path().join("r"));
        let whole = walk(vec![src(t.path(), "r")]).unwrap();
        let has_link = |e: &[Entry]| {
            e.iter()
                .any(|e| matches!(e.kind, EntryKind::HardLink { .. }))
        };
        assert!(has_link(whole.tree.entries()));
        assert!(!whole.tree.sparse().is_empty());
        let (start, parts) = live(t.path(), "r", CUTS, true);
        let Start::First(first, first_meta, seen) = start else {
            panic!(
                "a tree of {} entries went whole",
                whole.tree.entries().len()
            );
        };
        assert_eq!(first.tree.entries().len(), CUTS.first);
        assert!(seen.len() >= CUTS.at);
        assert_eq!(seen[..], whole.tree.entries()[..seen.len()]);
        // Every entry once, in the whole walk's order.
        let mut all = first.tree.entries().to_vec();
        let mut sparse = first.tree.sparse().to_vec();
        let mut meta = first_meta;
        for p in &parts {
            assert!(p.entries.len() <= CUTS.max);
            for &i in &p.sparse {
                assert!((i as usize) >= all.len() && (i as usize) < all.len() + p.entries.len());
            }
            all.extend(p.entries.iter().cloned());
            sparse.extend(&p.sparse);
            meta.extend(p.meta.iter().cloned());
        }
        assert_eq!(all, whole.tree.entries());
        assert_eq!(sparse, whole.tree.sparse());
        // Links and holes beyond the first part, as the test means them to be.
        assert!(parts.iter().any(|p| has_link(&p.entries)));
        assert!(parts.iter().any(|p| !p.sparse.is_empty()));
        // Parts double, up to the largest; only the last is marked, and it says what
        // the walk skipped.
        assert!(parts.len() >= 3);
        assert_eq!(parts[0].entries.len(), 16.min(CUTS.max));
        assert_eq!(parts.iter().filter(|p| p.last).count(), 1);
        assert!(parts.last().unwrap().last);
        assert_eq!(parts.last().unwrap().skipped, whole.skipped);
        // The metadata is the tree's as `meta::read_tree` reads it.
        let read = crate::meta::read_tree(
            &whole.tree,
            XattrScope {
                user: true,
                acls: true,
                all: false,
            },
        );
        assert_eq!(meta, read);
    }

    #[test]
    fn a_small_walk_goes_whole_and_a_stopped_one_stops() {
        let t = tempfile::tempdir().unwrap();
        tree(&t.path().join("r"));
        let n = walk(vec![src(t.path(), "r")]).unwrap().tree.entries().len();
        let cuts = Cuts { at: n + 1, ..CUTS };
        let (start, parts) = live(t.path(), "r", cuts, false);
        match start {
            Start::Whole(w, meta) => {
                assert_eq!(w.tree.entries().len(), n);
                assert!(meta.is_empty());
            }
            Start::First(..) => panic!("cut a walk below `at`"),
        }
        assert!(parts.is_empty());
        // Parts are refused: the walk stops at the first.
        let mut calls = 0;
        walk_live(
            vec![src(t.path(), "r")],
            &Filter::none(),
            None,
            Cuts {
                wait: Duration::ZERO,
                ..CUTS
            },
            |_| {},
            |_| {
                calls += 1;
                false
            },
        )
        .unwrap();
        assert_eq!(calls, 1);
        // Several roots: whole, however long.
        let mut first = None;
        walk_live(
            vec![src(t.path(), "r"), src(&t.path().join("r"), "d01")],
            &Filter::none(),
            None,
            CUTS,
            |s| first = Some(s),
            |_| panic!("a part of a walk of several roots"),
        )
        .unwrap();
        assert!(matches!(first, Some(Start::Whole(..))));
    }
}
