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
}

/// Makes `entry` (about to be pushed as index `idx`) a hard link to an earlier path
/// of its inode, or remembers it as the first path of a linked inode; notes it as
/// sparse when its blocks do not cover its size.
fn note_link(links: &mut Links, idx: u32, st: &Stat, entry: &mut Entry) {
    debug_assert_eq!(links.owners.len(), idx as usize);
    links.owners.push((st.st_uid, st.st_gid));
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
        note_link(&mut links, idx, &st, &mut entry);
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
                filter,
                &mut links,
            )?;
        }
    }
    let mut tree = Tree::new(entries, roots);
    tree.set_sparse(links.sparse);
    tree.set_owners(links.owners);
    Ok(Walked {
        tree,
        skipped,
        filtered,
    })
}

/// Walks the directory `root` (entry `idx`, open for reading) depth-first.
fn walk_dir(
    idx: u32,
    root: OwnedFd,
    entries: &mut Vec<Entry>,
    labels: &HashMap<u32, String>,
    (skipped, filtered): (&mut u64, &mut u64),
    filter: &Filter,
    links: &mut Links,
) -> Result<()> {
    // Pending directories: (entry, parent handle, name); opened when popped so a wide
    // tree does not hold a descriptor per pending directory.
    let mut stack: Vec<(u32, Arc<OwnedFd>, Vec<u8>)> = Vec::new();
    let mut current = Some((idx, Arc::new(root)));
    let mut kids: Vec<(u64, Vec<u8>)> = Vec::new();
    loop {
        let (dir_idx, fd) = match current.take() {
            Some(c) => c,
            None => match stack.pop() {
                None => return Ok(()),
                Some((i, parent, name)) => match sys::open_in(&*parent, &name, READ_DIR, 0) {
                    Ok(fd) => (i, Arc::new(fd)),
                    Err(e) => return Err(Error::io("opening", path_of(entries, labels, i), e)),
                },
            },
        };
        kids.clear();
        let dir = rustix::fs::Dir::read_from(&*fd)
            .map_err(|e| Error::io("listing", path_of(entries, labels, dir_idx), e))?;
        for de in dir {
            let de = de.map_err(|e| Error::io("listing", path_of(entries, labels, dir_idx), e))?;
            let name = de.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            kids.push((de.ino(), name.to_vec()));
        }
        kids.sort_unstable_by_key(|k| k.0);
        let first_subdir = stack.len();
        // The directory's path below its root, for the filters.
        let rel = if filter.is_empty() {
            Vec::new()
        } else {
            rel_path(entries, dir_idx)
        };
        for (_, name) in kids.drain(..) {
            // A `--files-from` list rules most names out by name alone: no stat for
            // them (a `sync --watch` batch lists a few files in a large directory).
            if !filter.is_empty() && filter.listed_rules_out(&join_rel(&rel, &name)) {
                *filtered += 1;
                continue;
            }
            let child = || {
                format!(
                    "{}/{}",
                    path_of(entries, labels, dir_idx),
                    String::from_utf8_lossy(&name)
                )
            };
            let st = match rustix::fs::statat(&*fd, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
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
            let target = if ft == FileType::Symlink {
                match rustix::fs::readlinkat(&*fd, name.as_slice(), Vec::new()) {
                    Ok(t) => Some(t.into_bytes()),
                    Err(Errno::NOENT) => {
                        *skipped += 1;
                        continue;
                    }
                    Err(e) => return Err(Error::io("reading link", child(), e)),
                }
            } else {
                None
            };
            let Some(mut entry) = entry_of(dir_idx, name, &st, target) else {
                continue;
            };
            note_link(links, entries.len() as u32, &st, &mut entry);
            if entry.kind == EntryKind::Dir {
                stack.push((entries.len() as u32, fd.clone(), entry.name.clone()));
            }
            entries.push(entry);
        }
        // Visit subdirectories in listing order.
        stack[first_subdir..].reverse();
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
