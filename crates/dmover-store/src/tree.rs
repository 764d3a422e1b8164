//! A manifest bound to directory handles on this machine.
//!
//! Every file operation of a session goes through a [`Tree`]: it finds the directory
//! handle of an entry's parent and the entry's name in it. Directories are opened one
//! component at a time with `O_NOFOLLOW`, starting from handles the session resolved
//! once and safely (beneath the server's root), so nothing a peer names, and nothing
//! swapped in during the transfer, can lead outside the tree.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT};
use parking_lot::Mutex;

use crate::sys::{self, DIR_PATH};

/// Where a root entry of the manifest lives on this machine.
#[derive(Debug, Clone)]
pub enum RootRef {
    /// The root is `name` inside the directory `parent`.
    At {
        /// Handle of the containing directory.
        parent: Arc<OwnedFd>,
        /// The root's name on disk (may differ from its manifest name).
        name: Vec<u8>,
    },
    /// The root is this directory itself (e.g. a server's whole export).
    Dir(Arc<OwnedFd>),
}

/// Open directory handles kept at most; past this the cache starts over (directories
/// are visited roughly in order, so an occasional reopen costs little).
const DIR_CACHE_MAX: usize = 4096;

/// A manifest plus the handles to reach each entry.
#[derive(Debug)]
pub struct Tree {
    entries: Vec<Entry>,
    roots: HashMap<u32, (RootRef, String)>,
    dirs: Mutex<HashMap<u32, Arc<OwnedFd>>>,
    /// Regular files that may have holes (entry indices, ascending).
    sparse: Vec<u32>,
    /// Each entry's numeric owner and group as the walk saw them (empty: unknown).
    owners: Vec<(u32, u32)>,
    /// Whether each entry has extended attributes, as the walk asked (empty: unknown).
    xattrs: Vec<Option<bool>>,
}

impl Tree {
    /// Binds `entries` to this machine: `roots` maps each root entry's index to its
    /// location and to the label used for it in messages (a path the user knows).
    pub fn new(entries: Vec<Entry>, roots: HashMap<u32, (RootRef, String)>) -> Self {
        Tree {
            entries,
            roots,
            dirs: Mutex::new(HashMap::new()),
            sparse: Vec::new(),
            owners: Vec::new(),
            xattrs: Vec::new(),
        }
    }

    /// Records whether each entry has extended attributes (the walk's
    /// `listxattrat`), in entry order; a list of another length is ignored.
    pub fn set_xattr_presence(&mut self, xattrs: Vec<Option<bool>>) {
        if xattrs.len() == self.entries.len() && xattrs.iter().any(Option::is_some) {
            self.xattrs = xattrs;
        }
    }

    /// Whether entry `idx` may have extended attributes: `false` only when the walk
    /// asked and it had none.
    pub fn may_have_xattrs(&self, idx: u32) -> bool {
        self.xattrs.get(idx as usize).copied().flatten() != Some(false)
    }

    /// Records each entry's owner and group (the walk's `stat`), in entry order; a
    /// list of another length is ignored.
    pub fn set_owners(&mut self, owners: Vec<(u32, u32)>) {
        if owners.len() == self.entries.len() {
            self.owners = owners;
        }
    }

    /// Entry `idx`'s owner and group as the walk saw them, if it recorded them.
    pub fn owner(&self, idx: u32) -> Option<(u32, u32)> {
        self.owners.get(idx as usize).copied()
    }

    /// Names the regular files that may have holes (entry indices; the walk's
    /// `st_blocks` check at the source, the source's list at the sink). Others are
    /// ignored.
    pub fn set_sparse(&mut self, mut entries: Vec<u32>) {
        entries.sort_unstable();
        entries.dedup();
        entries.retain(|&i| {
            self.entries
                .get(i as usize)
                .is_some_and(|e| matches!(e.kind, EntryKind::File { .. }))
        });
        self.sparse = entries;
    }

    /// The regular files that may have holes (entry indices, ascending).
    pub fn sparse(&self) -> &[u32] {
        &self.sparse
    }

    /// Adds files of a later part (entries `from..`) that may have holes, for a
    /// growing manifest cut from a running walk; entries that are not regular files
    /// of that part are left out. Returns those added.
    pub fn add_sparse(&mut self, from: usize, entries: &[u32]) -> Vec<u32> {
        let mut added: Vec<u32> = entries
            .iter()
            .copied()
            .filter(|&i| {
                i as usize >= from
                    && self
                        .entries
                        .get(i as usize)
                        .is_some_and(|e| matches!(e.kind, EntryKind::File { .. }))
            })
            .collect();
        added.sort_unstable();
        added.dedup();
        self.sparse.extend_from_slice(&added);
        added
    }

    /// Whether entry `idx` may have holes: one comparison when no file has any.
    pub fn is_sparse(&self, idx: u32) -> bool {
        !self.sparse.is_empty() && self.sparse.binary_search(&idx).is_ok()
    }

    /// The same tree without the entries `drop` (regular files: no entry's parent),
    /// indices renumbered (`sync --checksum` leaves out files the destination holds).
    pub fn without(self, drop: &std::collections::HashSet<u32>) -> Tree {
        let mut new_index = vec![NO_PARENT; self.entries.len()];
        // Sizes of the dropped files, for links to them.
        let sizes: HashMap<u32, u64> = drop
            .iter()
            .map(|&i| (i, self.entries[i as usize].file_size()))
            .collect();
        let mut entries = Vec::with_capacity(self.entries.len() - drop.len());
        for (i, e) in self.entries.into_iter().enumerate() {
            if drop.contains(&(i as u32)) {
                continue;
            }
            new_index[i] = entries.len() as u32;
            let mut e = e;
            if e.parent != NO_PARENT {
                e.parent = new_index[e.parent as usize];
            }
            if let EntryKind::HardLink { first } = e.kind {
                let f = new_index[first as usize];
                if f == NO_PARENT {
                    // Its first path left out: this one becomes the inode's first path
                    // (later links to the old first follow it).
                    let size = sizes.get(&first).copied().unwrap_or(0);
                    e.kind = EntryKind::File { size };
                    new_index[first as usize] = entries.len() as u32;
                } else {
                    e.kind = EntryKind::HardLink { first: f };
                }
            }
            entries.push(e);
        }
        let roots = self
            .roots
            .into_iter()
            .filter(|(i, _)| new_index[*i as usize] != NO_PARENT)
            .map(|(i, r)| (new_index[i as usize], r))
            .collect();
        let sparse = self
            .sparse
            .iter()
            .map(|&i| new_index[i as usize])
            .filter(|&i| i != NO_PARENT)
            .collect();
        let owners = if self.owners.is_empty() {
            Vec::new()
        } else {
            (0..new_index.len())
                .filter(|&i| !drop.contains(&(i as u32)))
                .map(|i| self.owners[i])
                .collect()
        };
        let mut tree = Tree::new(entries, roots);
        tree.set_sparse(sparse);
        tree.set_owners(owners);
        tree
    }

    /// Turns hard links into files of their own (a session without
    /// [`dmover_proto::session::features::LINKS`]).
    pub fn links_as_files(&mut self) {
        dmover_proto::manifest::links_as_files(&mut self.entries);
    }

    /// Adds a later part of a growing manifest: `entries`, numbered after the
    /// earlier ones, each under a directory among them or earlier (no new roots).
    /// What the walk noted of them (owners, xattr presence) is kept when the tree
    /// was [`Tree::split_off`] from a whole walk; otherwise it is unknown.
    pub fn extend(&mut self, entries: Vec<Entry>) {
        let n = self.entries.len() + entries.len();
        if !self.owners.is_empty() && self.owners.len() < n {
            self.owners.resize(n, (u32::MAX, u32::MAX));
        }
        if !self.xattrs.is_empty() && self.xattrs.len() < n {
            self.xattrs.resize(n, None);
        }
        self.entries.extend(entries);
    }

    /// Cuts a walked tree after its first `at` entries, for a manifest sent in parts
    /// (a streamed walk): returns the later entries, which [`Tree::extend`] gives
    /// back part by part, in order. The walk's notes of them (owners, xattr
    /// presence) stay, so they count again once their entries are back. `None`,
    /// and the tree unchanged, when a later entry is a hard link or a sparse file
    /// (a part carries neither) or `at` is not inside the tree.
    pub fn split_off(&mut self, at: usize) -> Option<Vec<Entry>> {
        if at == 0 || at >= self.entries.len() || !self.sparse.is_empty() {
            return None;
        }
        if self.entries[at..]
            .iter()
            .any(|e| matches!(e.kind, EntryKind::HardLink { .. }) || e.parent == NO_PARENT)
        {
            return None;
        }
        Some(self.entries.split_off(at))
    }

    /// The manifest entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The directory holding entry `idx`, and the entry's name in it.
    pub fn locate(&self, idx: u32) -> io::Result<(Arc<OwnedFd>, &[u8])> {
        let e = &self.entries[idx as usize];
        if e.parent == NO_PARENT {
            match self.roots.get(&idx) {
                Some((RootRef::At { parent, name }, _)) => Ok((parent.clone(), name)),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "this root has no parent directory",
                )),
            }
        } else {
            Ok((self.dir(e.parent)?, &e.name))
        }
    }

    /// A handle (`O_PATH`) on directory entry `idx`, for `*at` calls: the nearest
    /// ancestor whose handle is cached (or the root), then each directory below it
    /// opened in turn and cached. Iterative: a tree of any depth costs no stack (a
    /// chain of 50 000 levels once overflowed a server's).
    pub fn dir(&self, idx: u32) -> io::Result<Arc<OwnedFd>> {
        // The directories to open, from `idx` up.
        let mut below = Vec::new();
        let mut i = idx;
        let mut fd = loop {
            if let Some(fd) = self.dirs.lock().get(&i) {
                break fd.clone();
            }
            let e = &self.entries[i as usize];
            debug_assert_eq!(e.kind, EntryKind::Dir);
            if e.parent == NO_PARENT {
                break self.root_dir(i)?;
            }
            below.push(i);
            i = e.parent;
        };
        for &j in below.iter().rev() {
            let opened = Arc::new(sys::open_in(
                &*fd,
                &self.entries[j as usize].name,
                DIR_PATH,
                0,
            )?);
            self.cache_dir(j, opened.clone());
            fd = opened;
        }
        Ok(fd)
    }

    /// A handle on root directory entry `idx` (cached when opened here).
    fn root_dir(&self, idx: u32) -> io::Result<Arc<OwnedFd>> {
        match self.roots.get(&idx) {
            Some((RootRef::Dir(fd), _)) => Ok(fd.clone()),
            Some((RootRef::At { parent, name }, _)) => {
                let fd = Arc::new(sys::open_in(&**parent, name, DIR_PATH, 0)?);
                self.cache_dir(idx, fd.clone());
                Ok(fd)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "root entry without a location",
            )),
        }
    }

    fn cache_dir(&self, idx: u32, fd: Arc<OwnedFd>) {
        let mut dirs = self.dirs.lock();
        if dirs.len() >= DIR_CACHE_MAX {
            dirs.clear();
        }
        dirs.insert(idx, fd);
    }

    /// The entry's path components below the directory holding its root, the root
    /// named as it is on this machine.
    pub fn components(&self, idx: u32) -> Vec<&[u8]> {
        let mut names = Vec::new();
        let mut i = idx;
        loop {
            let e = &self.entries[i as usize];
            if e.parent == NO_PARENT {
                names.push(match self.roots.get(&i) {
                    Some((RootRef::At { name, .. }, _)) => name.as_slice(),
                    _ => e.name.as_slice(),
                });
                break;
            }
            names.push(e.name.as_slice());
            i = e.parent;
        }
        names.reverse();
        names
    }

    /// The entry's path below its root, names joined by `/` (empty for a root): how
    /// the two ends of a mirror name one file whatever the roots are called.
    pub fn rel_path(&self, idx: u32) -> Vec<u8> {
        dmover_proto::manifest::rel_path(&self.entries, idx)
    }

    /// The directory holding the roots and their names there, when every root is
    /// a named entry of one directory (as on a destination).
    pub fn roots_dir(&self) -> Option<Arc<OwnedFd>> {
        let mut dir: Option<&Arc<OwnedFd>> = None;
        for (r, _) in self.roots.values() {
            match r {
                RootRef::At { parent, .. } => match dir {
                    Some(d) if !Arc::ptr_eq(d, parent) => return None,
                    _ => dir = Some(parent),
                },
                RootRef::Dir(_) => return None,
            }
        }
        dir.cloned()
    }

    /// The name entry `idx` (a root) has on this machine.
    pub fn root_name(&self, idx: u32) -> &[u8] {
        match self.roots.get(&idx) {
            Some((RootRef::At { name, .. }, _)) => name,
            _ => &self.entries[idx as usize].name,
        }
    }

    /// The entry's path for messages: its root's label, then the names below it.
    pub fn display(&self, idx: u32) -> String {
        let mut names = Vec::new();
        let mut i = idx;
        loop {
            let e = &self.entries[i as usize];
            if e.parent == NO_PARENT {
                let label = match self.roots.get(&i) {
                    Some((_, label)) => label.clone(),
                    None => String::from_utf8_lossy(&e.name).into_owned(),
                };
                names.push(label);
                break;
            }
            names.push(String::from_utf8_lossy(&e.name).into_owned());
            i = e.parent;
        }
        names.reverse();
        names.join("/")
    }
}
