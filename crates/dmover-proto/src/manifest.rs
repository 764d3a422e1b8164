//! The manifest: what the source side found, as a flat list of entries.
//!
//! Entries come in walk order: a directory always precedes its children, and each
//! entry names its parent by index, so paths are never repeated on the wire. Entries
//! whose parent is [`NO_PARENT`] are the roots: one per source the user named.
//! Names are raw bytes (Unix file names need not be UTF-8).

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Parent index of a root entry.
pub const NO_PARENT: u32 = u32::MAX;
/// Longest file name accepted (bytes), as on Linux.
pub const MAX_NAME: usize = 255;
/// Longest symlink target accepted (bytes), as on Linux.
pub const MAX_LINK_TARGET: usize = 4095;
/// Most directories an entry may lie below its root: a path of that many one-byte
/// names fills Linux's `PATH_MAX` (4096 bytes), the longest path other tools (rsync,
/// `cp -r`) handle. A deeper manifest is refused, so a peer cannot make the receiver
/// walk (and hold handles along) an arbitrarily deep chain.
pub const MAX_DEPTH: u16 = 2048;

/// What kind of file an entry is, with the data that kind needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A regular file of `size` bytes.
    File {
        /// Length in bytes.
        size: u64,
    },
    /// A directory; its children follow it in the manifest.
    Dir,
    /// A symbolic link, copied as a link and never followed.
    Symlink {
        /// The link's target, verbatim.
        target: Vec<u8>,
    },
    /// (feature [`crate::session::features::LINKS`]) Another path of the inode whose
    /// first path is entry `first`: an earlier regular file, itself no link. It carries
    /// no data (no bytes in the layout); the sink links it to `first`'s copy. Its own
    /// mode and mtime are the inode's, so equal to `first`'s.
    HardLink {
        /// Manifest index of the inode's first path.
        first: u32,
    },
}

/// A modification time: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Mtime {
    /// Whole seconds (may be negative).
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

/// One file, directory or symlink of the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Index of the parent directory entry, or [`NO_PARENT`] for a root.
    pub parent: u32,
    /// The entry's name within its parent (one path component).
    pub name: Vec<u8>,
    /// Kind and kind-specific data.
    pub kind: EntryKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Modification time.
    pub mtime: Mtime,
}

impl Entry {
    /// The size of a regular file, 0 for anything else.
    pub fn file_size(&self) -> u64 {
        match self.kind {
            EntryKind::File { size } => size,
            _ => 0,
        }
    }
}

/// Whether any entry is a [`EntryKind::HardLink`] (such a manifest needs
/// [`crate::session::features::LINKS`]).
pub fn has_links(entries: &[Entry]) -> bool {
    entries
        .iter()
        .any(|e| matches!(e.kind, EntryKind::HardLink { .. }))
}

/// Turns every hard link into a regular file of its first path's size, for a session
/// without [`crate::session::features::LINKS`]: each path of an inode is then sent
/// as a file of its own (read from its own path, which holds the same bytes).
pub fn links_as_files(entries: &mut [Entry]) {
    for i in 0..entries.len() {
        if let EntryKind::HardLink { first } = entries[i].kind {
            let size = entries.get(first as usize).map_or(0, Entry::file_size);
            entries[i].kind = EntryKind::File { size };
        }
    }
}

/// Totals of a manifest, sent in [`crate::control::ManifestEnd`] as a cross-check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Number of entries.
    pub entries: u64,
    /// Number of regular files.
    pub files: u64,
    /// Number of directories.
    pub dirs: u64,
    /// Number of symlinks.
    pub symlinks: u64,
    /// Sum of regular file sizes.
    pub bytes: u64,
}

impl Totals {
    /// Counts a list of entries.
    pub fn of(entries: &[Entry]) -> Self {
        let mut t = Totals {
            entries: entries.len() as u64,
            ..Totals::default()
        };
        for e in entries {
            match e.kind {
                EntryKind::File { size } => {
                    t.files += 1;
                    t.bytes = t.bytes.saturating_add(size);
                }
                EntryKind::Dir => t.dirs += 1,
                EntryKind::Symlink { .. } => t.symlinks += 1,
                // An entry only: its bytes are its first path's.
                EntryKind::HardLink { .. } => {}
            }
        }
        t
    }

    /// These totals and `other`'s together (a growing manifest's totals over its
    /// parts so far).
    pub fn plus(self, other: Totals) -> Totals {
        Totals {
            entries: self.entries + other.entries,
            files: self.files + other.files,
            dirs: self.dirs + other.dirs,
            symlinks: self.symlinks + other.symlinks,
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }
}

/// Most manifest entries a side accepts by default (about 100 bytes of memory each).
pub const MAX_ENTRIES: u64 = 50_000_000;
/// Memory a manifest may take by default (entries, names and link targets): 8 GiB,
/// about 50 million entries with 100-byte names.
pub const MAX_MANIFEST_BYTES: u64 = 8 << 30;
/// Manifest parts are cut at about this many encoded bytes.
pub const PART_BYTES: usize = 1 << 20;

/// Memory an entry takes once received: its fixed part, its name and link target, and
/// what the manifest's check keeps of it ([`validator_bytes`]).
pub fn entry_bytes(e: &Entry) -> u64 {
    let target = match &e.kind {
        EntryKind::Symlink { target } => target.len(),
        _ => 0,
    };
    (std::mem::size_of::<Entry>() + e.name.len() + target) as u64 + validator_bytes(e)
}

/// Memory a [`Validator`] (the check of a manifest, whole or growing) keeps of one
/// entry: a copy of its name with its parent in a hash set (a slot and its control
/// byte, counted twice: a table that just doubled is less than half full), and its
/// kind and depth.
pub fn validator_bytes(e: &Entry) -> u64 {
    let slot = std::mem::size_of::<(u32, Vec<u8>)>() + 1;
    (2 * slot + e.name.len() + std::mem::size_of::<Kind>() + std::mem::size_of::<u16>()) as u64
}

/// Cuts `entries` into runs of about [`PART_BYTES`] encoded bytes, one
/// [`crate::control::ManifestPart`] each.
pub fn parts(entries: &[Entry]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        let target = match &e.kind {
            EntryKind::Symlink { target } => target.len(),
            _ => 0,
        };
        bytes += e.name.len() + target + 32;
        if bytes >= PART_BYTES {
            out.push(start..i + 1);
            start = i + 1;
            bytes = 0;
        }
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

/// Checks that a name is one safe path component: not empty, not `.` or `..`, no `/`
/// and no NUL, at most [`MAX_NAME`] bytes.
pub fn validate_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::Violation(format!(
            "invalid file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    if name.len() > MAX_NAME {
        return Err(Error::TooLarge {
            what: "file name length",
            value: name.len() as u64,
            limit: MAX_NAME as u64,
        });
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Error::Violation(format!(
            "file name {:?} contains '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// Validates a whole manifest as received from a peer: every name is a single safe
/// component, every parent is an earlier directory entry, no two entries share a
/// parent and a name, modes, times and link targets are in range, and sizes add up
/// without overflow. A receiver must call this before acting on any entry.
pub fn validate(entries: &[Entry], max_entries: u64) -> Result<Totals> {
    check_count(entries.len() as u64, max_entries)?;
    let mut total: u64 = 0;
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    let mut depths = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        validate_name(&e.name)?;
        if !seen.insert((e.parent, e.name.as_slice())) {
            return Err(twice(i, e));
        }
        check_entry(i, e, |p| Kind::of(&entries[p].kind), &mut total)?;
        depths.push(depth_of(i, e, |p| depths[p])?);
    }
    check_total(total)?;
    Ok(Totals::of(entries))
}

fn check_count(n: u64, max_entries: u64) -> Result<()> {
    if n > max_entries {
        return Err(Error::TooLarge {
            what: "manifest entries",
            value: n,
            limit: max_entries,
        });
    }
    if n >= u64::from(NO_PARENT) {
        return Err(Error::TooLarge {
            what: "manifest entries",
            value: n,
            limit: u64::from(NO_PARENT) - 1,
        });
    }
    Ok(())
}

fn twice(i: usize, e: &Entry) -> Error {
    Error::Violation(format!(
        "entry {i} ({:?}) appears twice in the same directory",
        String::from_utf8_lossy(&e.name)
    ))
}

fn check_total(total: u64) -> Result<()> {
    // Sizes below 2^62 leave room for alignment padding in the layout.
    if total > 1 << 62 {
        return Err(Error::TooLarge {
            what: "dataset size",
            value: total,
            limit: 1 << 62,
        });
    }
    Ok(())
}

/// How many directories entry `i` lies below its root (its parent checked already:
/// an earlier directory, whose depth `depth(p)` gives), at most [`MAX_DEPTH`].
fn depth_of(i: usize, e: &Entry, depth: impl Fn(usize) -> u16) -> Result<u16> {
    if e.parent == NO_PARENT {
        return Ok(0);
    }
    let d = depth(e.parent as usize) + 1;
    if d > MAX_DEPTH {
        return Err(Error::Violation(format!(
            "entry {i} lies {d} directories deep, more than {MAX_DEPTH}"
        )));
    }
    Ok(d)
}

/// What the checks of later entries need to know of an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Other,
}

impl Kind {
    fn of(k: &EntryKind) -> Kind {
        match k {
            EntryKind::Dir => Kind::Dir,
            EntryKind::File { .. } => Kind::File,
            _ => Kind::Other,
        }
    }
}

/// The checks of one entry, `i`, after its name's (valid, unique in its directory).
/// `kind_of(p)` is the kind of an earlier entry `p`.
fn check_entry(
    i: usize,
    e: &Entry,
    kind_of: impl Fn(usize) -> Kind,
    total: &mut u64,
) -> Result<()> {
    let is_dir = |p| kind_of(p) == Kind::Dir;
    if e.parent != NO_PARENT {
        let p = e.parent as usize;
        if p >= i {
            return Err(Error::Violation(format!(
                "entry {i} names parent {p}, which does not precede it"
            )));
        }
        if !is_dir(p) {
            return Err(Error::Violation(format!(
                "entry {i} names parent {p}, which is not a directory"
            )));
        }
    }
    if e.mode > 0o7777 {
        return Err(Error::Violation(format!("entry {i} has mode {:o}", e.mode)));
    }
    if e.mtime.nsec >= 1_000_000_000 {
        return Err(Error::Violation(format!(
            "entry {i} has {} nanoseconds",
            e.mtime.nsec
        )));
    }
    match &e.kind {
        EntryKind::File { size } => {
            *total = total
                .checked_add(*size)
                .ok_or_else(|| Error::Violation("total dataset size overflows 64 bits".into()))?;
        }
        EntryKind::Symlink { target } => {
            if target.is_empty() || target.len() > MAX_LINK_TARGET || target.contains(&0) {
                return Err(Error::Violation(format!(
                    "entry {i} has an invalid symlink target"
                )));
            }
        }
        EntryKind::HardLink { first } => {
            let f = *first as usize;
            if f >= i || kind_of(f) != Kind::File {
                return Err(Error::Violation(format!(
                    "entry {i} is a hard link to entry {f}, which is not an earlier regular file"
                )));
            }
        }
        EntryKind::Dir => {}
    }
    Ok(())
}

/// [`validate`] for a manifest that arrives in parts (a growing manifest): each part
/// is checked against the parts before it without holding their entries, only which
/// are directories and the names in each directory.
#[derive(Debug, Default)]
pub struct Validator {
    seen: std::collections::HashSet<(u32, Vec<u8>)>,
    kinds: Vec<Kind>,
    depths: Vec<u16>,
    total: u64,
    totals: Totals,
}

impl Validator {
    /// A validator of an empty manifest.
    pub fn new() -> Self {
        Validator::default()
    }

    /// Checks the next part and returns the totals of every part so far. After an
    /// error the validator is not to be used again.
    pub fn extend(&mut self, part: &[Entry], max_entries: u64) -> Result<Totals> {
        let first = self.kinds.len();
        check_count((first + part.len()) as u64, max_entries)?;
        for (j, e) in part.iter().enumerate() {
            let i = first + j;
            validate_name(&e.name)?;
            if !self.seen.insert((e.parent, e.name.clone())) {
                return Err(twice(i, e));
            }
            let kinds = &self.kinds;
            check_entry(i, e, |p| kinds[p], &mut self.total)?;
            let depths = &self.depths;
            let depth = depth_of(i, e, |p| depths[p])?;
            self.kinds.push(Kind::of(&e.kind));
            self.depths.push(depth);
        }
        check_total(self.total)?;
        self.totals = self.totals.plus(Totals::of(part));
        Ok(self.totals)
    }
}

/// (feature `METADATA`) What an entry carries besides its mode and mtime: its numeric
/// owner and extended attributes (POSIX ACLs among them, as the raw
/// `system.posix_acl_access` / `system.posix_acl_default` values: Linux's portable
/// format). The receiver decides what it applies (docs/sync.md, "Preserved metadata").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EntryMeta {
    /// The manifest entry (index) this describes.
    pub entry: u32,
    /// Numeric owner.
    pub uid: u32,
    /// Numeric group.
    pub gid: u32,
    /// Extended attributes, `(name, value)`.
    pub xattrs: Vec<Xattr>,
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Xattr {
    /// Its full name, namespace included (`user.x`).
    pub name: Vec<u8>,
    /// Its value, any bytes (possibly empty).
    pub value: Vec<u8>,
}

/// The POSIX ACL of a file or directory, as an xattr.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL, as an xattr.
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
/// dmover's checksum cache (docs/checksums.md): a file's catalog checksums and what
/// invalidates them. Reserved: no scope allows it, so a source never sends it and a
/// receiver refuses it from a peer ([`validate_meta`]); a copy never carries a cache
/// that the destination's own file would not match.
pub const SUM_XATTR: &[u8] = b"user.dmover.sum";
/// Longest xattr name accepted (bytes), as on Linux.
pub const MAX_XATTR_NAME: usize = 255;
/// Largest xattr value accepted (bytes), as on Linux.
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most xattrs of one entry.
pub const MAX_XATTRS: usize = 128;
/// Most bytes of names and values of one entry's xattrs.
pub const MAX_XATTR_BYTES: usize = 256 << 10;

/// Which extended attributes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XattrScope {
    /// `user.*` attributes.
    pub user: bool,
    /// POSIX ACLs ([`ACL_ACCESS`], [`ACL_DEFAULT`]).
    pub acls: bool,
    /// Every other namespace too (`trusted.*`, `security.*`, ...): only where an
    /// export allows it.
    pub all: bool,
}

impl XattrScope {
    /// `user.*` and ACLs: the default.
    pub const DEFAULT: XattrScope = XattrScope {
        user: true,
        acls: true,
        all: false,
    };

    /// Whether an attribute of this name is in scope.
    pub fn allows(&self, name: &[u8]) -> bool {
        if name == SUM_XATTR {
            false
        } else if name == ACL_ACCESS || name == ACL_DEFAULT {
            self.acls
        } else if name.starts_with(b"user.") {
            self.user || self.all
        } else {
            self.all
        }
    }
}

/// Checks one entry's metadata against the limits, the manifest's length and the
/// namespaces a receiver accepts (`scope`: an attribute out of scope is an error, as
/// the source filters before it sends).
pub fn validate_meta(m: &EntryMeta, n_entries: u64, scope: XattrScope) -> Result<()> {
    if u64::from(m.entry) >= n_entries {
        return Err(Error::Malformed(format!(
            "metadata of entry {} of a manifest of {n_entries}",
            m.entry
        )));
    }
    if m.xattrs.len() > MAX_XATTRS {
        return Err(Error::TooLarge {
            what: "extended attributes of an entry",
            value: m.xattrs.len() as u64,
            limit: MAX_XATTRS as u64,
        });
    }
    let mut bytes = 0;
    for x in &m.xattrs {
        if x.name.is_empty() || x.name.len() > MAX_XATTR_NAME || x.name.contains(&0) {
            return Err(Error::Malformed(format!(
                "an extended attribute name of {} bytes",
                x.name.len()
            )));
        }
        if x.value.len() > MAX_XATTR_VALUE {
            return Err(Error::TooLarge {
                what: "extended attribute value",
                value: x.value.len() as u64,
                limit: MAX_XATTR_VALUE as u64,
            });
        }
        if !scope.allows(&x.name) {
            return Err(Error::Malformed(format!(
                "extended attribute {} is not accepted here",
                String::from_utf8_lossy(&x.name)
            )));
        }
        bytes += x.name.len() + x.value.len();
    }
    if bytes > MAX_XATTR_BYTES {
        return Err(Error::TooLarge {
            what: "extended attributes of an entry",
            value: bytes as u64,
            limit: MAX_XATTR_BYTES as u64,
        });
    }
    Ok(())
}

/// Memory an entry's metadata takes once received.
pub fn meta_bytes(m: &EntryMeta) -> u64 {
    (std::mem::size_of::<EntryMeta>()
        + m.xattrs
            .iter()
            .map(|x| std::mem::size_of::<Xattr>() + x.name.len() + x.value.len())
            .sum::<usize>()) as u64
}

/// Cuts metadata into parts of about [`PART_BYTES`] encoded bytes.
pub fn meta_parts(meta: &[EntryMeta]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, m) in meta.iter().enumerate() {
        let n = 16
            + m.xattrs
                .iter()
                .map(|x| x.name.len() + x.value.len() + 6)
                .sum::<usize>();
        if bytes > 0 && bytes + n > PART_BYTES {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < meta.len() {
        out.push(start..meta.len());
    }
    out
}

/// Entry `idx`'s path below its root, names joined by `/` (empty for a root): how the
/// two ends of a mirror name one file whatever their roots are called. An index or
/// parent out of range ends the path (a validated manifest has none).
pub fn rel_path(entries: &[Entry], idx: u32) -> Vec<u8> {
    let mut names = Vec::new();
    let mut i = idx as usize;
    while let Some(e) = entries.get(i) {
        if e.parent == NO_PARENT {
            break;
        }
        names.push(e.name.as_slice());
        i = e.parent as usize;
    }
    names.reverse();
    names.join(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(parent: u32, name: &str, kind: EntryKind) -> Entry {
        Entry {
            parent,
            name: name.as_bytes().to_vec(),
            kind,
            mode: 0o644,
            mtime: Mtime::default(),
        }
    }

    /// dmover's checksum cache is in no scope, `all` included: never read to be sent,
    /// refused from a peer.
    #[test]
    fn the_checksum_cache_never_travels() {
        let all = XattrScope {
            user: true,
            acls: true,
            all: true,
        };
        for s in [XattrScope::DEFAULT, all] {
            assert!(!s.allows(SUM_XATTR) && s.allows(b"user.dmover.other"));
            let m = EntryMeta {
                entry: 0,
                uid: 0,
                gid: 0,
                xattrs: vec![Xattr {
                    name: SUM_XATTR.to_vec(),
                    value: b"x".to_vec(),
                }],
            };
            let e = validate_meta(&m, 1, s).unwrap_err();
            assert!(e.to_string().contains("user.dmover.sum"), "{e}");
        }
    }

    /// A chain deeper than [`MAX_DEPTH`] is refused whole and in parts; one at the
    /// limit passes.
    #[test]
    fn a_manifest_deeper_than_a_path_is_refused() {
        let chain = |levels: u32| -> Vec<Entry> {
            (0..=levels)
                .map(|i| entry(if i == 0 { NO_PARENT } else { i - 1 }, "d", EntryKind::Dir))
                .collect()
        };
        let deep = u32::from(MAX_DEPTH);
        validate(&chain(deep), u64::MAX).unwrap();
        let e = validate(&chain(deep + 1), u64::MAX).unwrap_err();
        assert!(e.to_string().contains("2049 directories deep"), "{e}");
        let entries = chain(deep + 1);
        let mut v = Validator::new();
        v.extend(&entries[..1000], u64::MAX).unwrap();
        let e = v.extend(&entries[1000..], u64::MAX).unwrap_err();
        assert!(e.to_string().contains("more than 2048"), "{e}");
    }

    #[test]
    fn a_manifest_checked_in_parts_is_checked_as_a_whole() {
        let all = vec![
            entry(NO_PARENT, "r", EntryKind::Dir),
            entry(0, "a", EntryKind::File { size: 10 }),
            entry(0, "d", EntryKind::Dir),
            entry(2, "a", EntryKind::File { size: 5 }),
            entry(1, "x", EntryKind::File { size: 1 }),
        ];
        // Valid up to entry 4, whose parent is a file.
        let whole = validate(&all[..4], 100).unwrap();
        let mut v = Validator::new();
        v.extend(&all[..2], 100).unwrap();
        assert_eq!(v.extend(&all[2..4], 100).unwrap(), whole);
        let e = v.extend(&all[4..], 100).unwrap_err();
        assert_eq!(e, validate(&all, 100).unwrap_err());
        // A name twice in a directory, across parts; and the entry limit over all parts.
        let mut v = Validator::new();
        v.extend(&all[..2], 100).unwrap();
        assert!(v.extend(&all[1..2], 100).is_err());
        let mut v = Validator::new();
        v.extend(&all[..2], 3).unwrap();
        assert!(v.extend(&all[2..4], 3).is_err());
    }

    #[test]
    fn a_hard_link_names_an_earlier_regular_file() {
        let link = |first| EntryKind::HardLink { first };
        let good = vec![
            entry(NO_PARENT, "r", EntryKind::Dir),
            entry(0, "a", EntryKind::File { size: 10 }),
            entry(
                0,
                "s",
                EntryKind::Symlink {
                    target: b"a".to_vec(),
                },
            ),
            entry(0, "b", link(1)),
            entry(0, "c", link(1)),
        ];
        let t = validate(&good, 100).unwrap();
        // A link is an entry only: its bytes are its first path's.
        assert_eq!((t.entries, t.files, t.bytes), (5, 1, 10));
        let mut v = Validator::new();
        v.extend(&good[..2], 100).unwrap();
        assert_eq!(v.extend(&good[2..], 100).unwrap(), t);
        assert!(has_links(&good) && !has_links(&good[..3]));
        // To a directory, a symlink, a link, itself, a later entry, out of range.
        for first in [0, 2, 3, 4, 5, u32::MAX] {
            let mut bad = good.clone();
            bad[4].kind = link(first);
            assert!(validate(&bad, 100).is_err(), "link to {first}");
            let mut v = Validator::new();
            v.extend(&bad[..4], 100).unwrap();
            assert!(
                v.extend(&bad[4..], 100).is_err(),
                "link to {first} in parts"
            );
        }
        // Without the feature: every path a file of its own, of the first's size.
        let mut plain = good.clone();
        links_as_files(&mut plain);
        assert!(!has_links(&plain));
        assert_eq!(plain[4].kind, EntryKind::File { size: 10 });
        assert_eq!(validate(&plain, 100).unwrap().bytes, 30);
    }
}
