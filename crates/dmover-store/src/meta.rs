//! Owners and extended attributes (POSIX ACLs among them): read at the source,
//! applied at the destination when a file is finalised (docs/sync.md, "Preserved
//! metadata").
//!
//! The tree holds directory handles and names, never paths, so an entry's xattrs are
//! read and set through `/proc/self/fd/DIR/NAME` with the `l*xattr` calls (the last
//! component is not followed, and the directory is the handle we hold), and a file
//! being finalised through its own descriptor (`fsetxattr`, `fchown`). ACLs travel as
//! their raw `system.posix_acl_*` values (Linux's portable format), so no libacl.
//!
//! Order on a file (what the kernel does with each step decides it): `fchown` first
//! (it clears setuid/setgid bits), then the `user.*` attributes, then `fchmod`, then
//! the ACLs (setting `system.posix_acl_access` sets the group bits of the mode from
//! the ACL's mask, which on the source equal them), then the mtime. A setuid or
//! setgid bit is kept only where the file's owner (group) is the source's: applied,
//! or the receiving process's own; a `security.capability` attribute (file
//! capabilities, setuid's kin) only where the owner is applied.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use dmover_proto::manifest::{ACL_ACCESS, ACL_DEFAULT, EntryKind, EntryMeta, Xattr, XattrScope};
use rustix::fs::{AtFlags, Gid, Uid, XattrFlags};
use rustix::io::Errno;

use crate::tree::Tree;

/// The file capabilities attribute (`setcap`): an executable carrying it gains those
/// capabilities when run, as a setuid-root one gains root. A destination sets it (with
/// `xattrs = "all"`) only where it applies the source's owner, as it keeps a setuid
/// bit ([`Applier::file_mode`]); anywhere else it is dropped.
pub const CAPABILITY: &[u8] = b"security.capability";

/// What a destination applies of the metadata it receives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaPolicy {
    /// The extended attributes it sets.
    pub xattrs: XattrScope,
    /// Numeric owners, when this process is root.
    pub owner: bool,
}

/// `/proc/self/fd/DIR/NAME`: a path to `name` in the directory handle `dir`.
fn proc_path(dir: &impl AsFd, name: &[u8]) -> Vec<u8> {
    let mut p = format!("/proc/self/fd/{}/", dir.as_fd().as_raw_fd()).into_bytes();
    p.extend_from_slice(name);
    p
}

fn is_unsupported(e: Errno) -> bool {
    e == Errno::OPNOTSUPP || e == Errno::NOTSUP
}

/// `listxattrat(2)` (Linux 6.13) is missing here: set at its first `ENOSYS` (or
/// `EPERM`, from a seccomp filter).
static NO_LISTXATTRAT: AtomicBool = AtomicBool::new(false);

/// Whether `name` in `dir` (not followed) has extended attributes, by
/// `listxattrat(2)`: `None` where the kernel lacks it, a filter refuses it, it fails
/// otherwise, or the name has a NUL (the caller then asks through `/proc`).
/// Most files have none, and this answers that without the path through
/// `/proc/self/fd` the `l*xattr` calls need (about half the cost of reading a tree's
/// metadata, measured on 20 000 files).
pub(crate) fn has_xattrs_at(dir: &impl AsFd, name: &[u8]) -> Option<bool> {
    const SYS_LISTXATTRAT: libc::c_long = 465;
    if NO_LISTXATTRAT.load(Ordering::Relaxed) {
        return None;
    }
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid descriptor, a NUL-terminated name, and no list buffer (size 0:
    // the call only returns the size the list needs).
    let n = unsafe {
        libc::syscall(
            SYS_LISTXATTRAT,
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
            std::ptr::null_mut::<libc::c_char>(),
            0usize,
        )
    };
    if n >= 0 {
        return Some(n > 0);
    }
    match Errno::from_io_error(&io::Error::last_os_error()) {
        // Missing, or refused by a seccomp filter that does not know it (some
        // container profiles answer EPERM): the path through /proc from now on.
        Some(Errno::NOSYS | Errno::PERM) => {
            NO_LISTXATTRAT.store(true, Ordering::Relaxed);
            None
        }
        Some(e) if is_unsupported(e) || e == Errno::NOENT => Some(false),
        // Anything else: the path through /proc reports it (or does better).
        _ => None,
    }
}

/// Reads the xattrs of `name` in `dir` (not followed) that `scope` allows.
pub(crate) fn read_xattrs_at(
    dir: &impl AsFd,
    name: &[u8],
    scope: XattrScope,
) -> io::Result<Vec<Xattr>> {
    if has_xattrs_at(dir, name) == Some(false) {
        return Ok(Vec::new());
    }
    read_xattrs(&proc_path(dir, name), scope)
}

/// The xattrs of `name` in `dir` (not followed) that `scope` allows, sorted by name:
/// what a re-run compares on a file it keeps (docs/sync.md).
pub(crate) fn kept_xattrs(
    dir: &impl AsFd,
    name: &[u8],
    scope: XattrScope,
) -> io::Result<Vec<Xattr>> {
    let mut x = read_xattrs_at(dir, name, scope)?;
    x.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(x)
}

/// The attributes a re-run compares on a file it keeps, of those `policy` takes:
/// `user.*` and the ACLs only. Other namespaces (`all`) are set when a file is sent,
/// never removed: a destination's own labels are not the source's business.
pub(crate) fn kept_scope(policy: &MetaPolicy) -> XattrScope {
    XattrScope {
        all: false,
        ..policy.xattrs
    }
}

/// Reads the xattrs of `path` (not following a last symlink) that `scope` allows.
fn read_xattrs(path: &[u8], scope: XattrScope) -> io::Result<Vec<Xattr>> {
    let mut list = vec![0u8; 1024];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut list[..]) {
            Ok(n) => break n,
            Err(Errno::RANGE) => {
                let want = rustix::fs::llistxattr_query(path)?;
                list.resize(want.max(list.len() * 2), 0);
            }
            Err(e) if is_unsupported(e) || e == Errno::NOENT => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    for name in list[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !scope.allows(name) {
            continue;
        }
        let mut value = vec![0u8; 256];
        let got = loop {
            match rustix::fs::lgetxattr(path, name, &mut value[..]) {
                Ok(n) => break Some(n),
                Err(Errno::RANGE) => {
                    let want = rustix::fs::lgetxattr_query(path, name)?;
                    value.resize(want.max(value.len() * 2), 0);
                }
                // Removed since it was listed.
                Err(Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(n) = got {
            value.truncate(n);
            out.push(Xattr {
                name: name.to_vec(),
                value,
            });
        }
    }
    Ok(out)
}

/// The owners and the xattrs `scope` allows of every entry of `tree`: the owners from
/// the walk's `stat` (one more where the tree has none recorded), one `listxattrat`
/// per entry (where the kernel lacks it, Linux < 6.13: an `llistxattr` through
/// `/proc/self/fd`), and for entries that have attributes the list through that path
/// and an `lgetxattr` per attribute. An entry that cannot be read (vanished since the
/// walk) is left out; its data's own read reports it.
///
/// On up to 8 threads for trees of more than a few thousand entries: these are one
/// more round of system calls per entry after the walk (a push waits for them before
/// its session starts), and with a cold cache each waits for the disk.
pub fn read_tree(tree: &Tree, scope: XattrScope) -> Vec<EntryMeta> {
    let n = tree.entries().len();
    let warned = AtomicBool::new(false);
    let read = |range: std::ops::Range<usize>| -> Vec<EntryMeta> {
        range
            .filter_map(|i| read_entry(tree, i as u32, scope, &warned))
            .collect()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(8)
        .min(n / 2048);
    if threads < 2 {
        return read(0..n);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..n)
            .step_by(per)
            .map(|start| {
                let read = &read;
                s.spawn(move || read(start..(start + per).min(n)))
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The owners and xattrs of entry `i` ([`read_tree`]); `None` if it cannot be read.
/// [`read_tree`] of the entries `range` only (a growing manifest's part), on this
/// thread.
pub fn read_entries(tree: &Tree, range: std::ops::Range<u32>, scope: XattrScope) -> Vec<EntryMeta> {
    let warned = AtomicBool::new(false);
    range
        .filter_map(|i| read_entry(tree, i, scope, &warned))
        .collect()
}

fn read_entry(tree: &Tree, i: u32, scope: XattrScope, warned: &AtomicBool) -> Option<EntryMeta> {
    let e = &tree.entries()[i as usize];
    let (dir, name) = tree.locate(i).ok()?;
    // The walk's stat, or one now.
    let (uid, gid) = match tree.owner(i) {
        Some(o) => o,
        None => {
            let st = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
            (st.st_uid, st.st_gid)
        }
    };
    let mut m = EntryMeta {
        entry: i,
        uid,
        gid,
        xattrs: Vec::new(),
    };
    // Linux allows no user.* attributes on symlinks, and ACLs are not theirs.
    let wanted = !matches!(e.kind, EntryKind::Symlink { .. }) || scope.all;
    // The walk may have asked already (most files have none).
    if wanted && (scope.user || scope.acls || scope.all) && tree.may_have_xattrs(i) {
        match read_xattrs_at(&*dir, name, scope) {
            Ok(x) => m.xattrs = x,
            Err(err) if !warned.swap(true, Ordering::Relaxed) => {
                tracing::warn!(
                    "reading the extended attributes of {}: {err}; sent without them",
                    tree.display(i)
                );
            }
            Err(_) => {}
        }
    }
    Some(m)
}

/// Where metadata goes: an open file, or a name in a directory handle.
pub enum Target<'a, D: AsFd> {
    /// A staging file, open for writing.
    Fd(&'a std::os::fd::OwnedFd),
    /// A directory or symlink, by name in its parent.
    At(&'a D, &'a [u8]),
}

/// Applies received metadata at a destination (see the module docs).
#[derive(Debug)]
pub struct Applier {
    policy: MetaPolicy,
    euid: u32,
    egid: u32,
    warned: AtomicBool,
    /// Warned once of an attribute outside `user.*` and ACLs this process may not set.
    warned_refused: AtomicBool,
}

impl Applier {
    /// An applier for this process.
    pub fn new(policy: MetaPolicy) -> Self {
        Applier {
            policy,
            euid: rustix::process::geteuid().as_raw(),
            egid: rustix::process::getegid().as_raw(),
            warned: AtomicBool::new(false),
            warned_refused: AtomicBool::new(false),
        }
    }

    /// Whether owners are applied (asked for, and this process is root).
    pub fn applies_owner(&self, m: Option<&EntryMeta>) -> bool {
        self.policy.owner
            && self.euid == 0
            && m.is_some_and(|m| m.uid != u32::MAX && m.gid != u32::MAX)
    }

    /// The mode to give a regular file or a directory: the source's, without a setuid (setgid) bit
    /// unless the file's owner (group) will be the source's: applied, or this
    /// process's own. A root process that does not apply owners keeps neither bit:
    /// the owner a peer claims is not proof, and root's own would be root's.
    pub fn file_mode(&self, mode: u32, m: Option<&EntryMeta>) -> u32 {
        let owned = self.applies_owner(m);
        let mine = |id: u32, own: u32| self.euid != 0 && id == own;
        let mut mode = mode;
        if !(owned || m.is_some_and(|m| mine(m.uid, self.euid))) {
            mode &= !0o4000;
        }
        if !(owned || m.is_some_and(|m| mine(m.gid, self.egid))) {
            mode &= !0o2000;
        }
        mode
    }

    fn set<D: AsFd>(&self, t: &Target<'_, D>, x: &Xattr) -> io::Result<()> {
        let r = match t {
            Target::Fd(fd) => {
                rustix::fs::fsetxattr(fd, x.name.as_slice(), &x.value, XattrFlags::empty())
            }
            Target::At(dir, name) => rustix::fs::lsetxattr(
                proc_path(*dir, name).as_slice(),
                x.name.as_slice(),
                &x.value,
                XattrFlags::empty(),
            ),
        };
        match r {
            Err(e) if is_unsupported(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the destination's file system does not support extended attribute {} (nor perhaps others): copied without them",
                        String::from_utf8_lossy(&x.name)
                    );
                }
                Ok(())
            }
            // `trusted.*` needs CAP_SYS_ADMIN, `security.*` labels may not be valid
            // here: an attribute only `all` brings is skipped, as rsync does as a
            // non-root receiver, rather than failing the copy.
            Err(e)
                if !XattrScope::DEFAULT.allows(&x.name)
                    && [Errno::PERM, Errno::ACCESS, Errno::INVAL].contains(&e) =>
            {
                if !self.warned_refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "extended attribute {} could not be set ({e}); skipping those this process may not set",
                        String::from_utf8_lossy(&x.name)
                    );
                }
                Ok(())
            }
            r => Ok(r?),
        }
    }

    /// Step one: the owner (before the mode, which `chown` would strip of
    /// setuid/setgid) and the attributes other than ACLs.
    pub fn before_mode<D: AsFd>(&self, t: &Target<'_, D>, m: Option<&EntryMeta>) -> io::Result<()> {
        let Some(m) = m else { return Ok(()) };
        if self.applies_owner(Some(m)) {
            let (u, g) = (Some(Uid::from_raw(m.uid)), Some(Gid::from_raw(m.gid)));
            match t {
                Target::Fd(fd) => rustix::fs::fchown(fd, u, g)?,
                Target::At(dir, name) => {
                    rustix::fs::chownat(*dir, *name, u, g, AtFlags::SYMLINK_NOFOLLOW)?
                }
            }
        }
        for x in &m.xattrs {
            if x.name != ACL_ACCESS && x.name != ACL_DEFAULT && self.policy.xattrs.allows(&x.name) {
                if x.name == CAPABILITY && !self.applies_owner(Some(m)) {
                    // File capabilities are setuid's kin: kept only where the owner
                    // is the source's (applied), as a setuid bit is by `file_mode`.
                    continue;
                }
                self.set(t, x)?;
            }
        }
        Ok(())
    }

    /// Step two, after the mode: the ACLs.
    pub fn after_mode<D: AsFd>(&self, t: &Target<'_, D>, m: Option<&EntryMeta>) -> io::Result<()> {
        let Some(m) = m else { return Ok(()) };
        for x in &m.xattrs {
            if (x.name == ACL_ACCESS || x.name == ACL_DEFAULT) && self.policy.xattrs.allows(&x.name)
            {
                self.set(t, x)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `listxattrat` answers "none" only where the path through /proc finds none.
    #[test]
    fn the_quick_check_agrees_with_the_proc_path() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("with"), b"").unwrap();
        std::fs::write(t.path().join("without"), b"").unwrap();
        if let Err(e) =
            rustix::fs::setxattr(t.path().join("with"), "user.k", b"v", XattrFlags::empty())
        {
            eprintln!("skipped: no user xattrs here ({e})");
            return;
        }
        let dir = std::fs::File::open(t.path()).unwrap();
        let scope = XattrScope::DEFAULT;
        for (name, n) in [(&b"with"[..], 1), (b"without", 0), (b"missing", 0)] {
            let at = read_xattrs_at(&dir, name, scope).unwrap();
            let by_path = read_xattrs(&proc_path(&dir, name), scope).unwrap();
            assert_eq!(at, by_path, "{name:?}");
            assert_eq!(at.len(), n, "{name:?}");
            if has_xattrs_at(&dir, name).is_some() {
                assert_eq!(has_xattrs_at(&dir, name), Some(n > 0), "{name:?}");
            }
        }
    }

    /// A tree big enough to be read on several threads: every entry once, in order,
    /// each with its own attributes.
    #[test]
    fn a_large_tree_is_read_whole_and_in_order() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("t");
        std::fs::create_dir(&root).unwrap();
        for i in 0..5000 {
            std::fs::write(root.join(format!("f{i:05}")), b"").unwrap();
        }
        let marked = [7usize, 2500, 4999];
        for &i in &marked {
            let path = root.join(format!("f{i:05}"));
            if let Err(e) = rustix::fs::setxattr(
                &path,
                "user.n",
                i.to_string().as_bytes(),
                XattrFlags::empty(),
            ) {
                eprintln!("skipped: no user xattrs here ({e})");
                return;
            }
        }
        let src = crate::paths::source_root(
            &crate::paths::Base::Local,
            root.as_os_str().as_encoded_bytes(),
            b"",
        )
        .unwrap();
        let tree = crate::walk::walk(vec![src]).unwrap().tree;
        let meta = read_tree(&tree, XattrScope::DEFAULT);
        assert_eq!(meta.len(), tree.entries().len());
        assert!(meta.iter().enumerate().all(|(i, m)| m.entry == i as u32));
        let with: Vec<_> = meta
            .iter()
            .filter(|m| !m.xattrs.is_empty())
            .map(|m| {
                let name = &tree.entries()[m.entry as usize].name;
                assert_eq!(m.xattrs[0].name, b"user.n");
                assert_eq!(
                    &name[1..],
                    format!(
                        "{:05}",
                        String::from_utf8_lossy(&m.xattrs[0].value)
                            .parse::<usize>()
                            .unwrap()
                    )
                    .as_bytes()
                );
                m.entry
            })
            .collect();
        assert_eq!(with.len(), marked.len());
    }

    fn m(uid: u32, gid: u32) -> EntryMeta {
        EntryMeta {
            entry: 0,
            uid,
            gid,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn setuid_and_setgid_only_where_the_owner_is_the_sources() {
        let (euid, egid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let keep = Applier::new(MetaPolicy {
            xattrs: XattrScope::DEFAULT,
            owner: true,
        });
        let no_owner = Applier::new(MetaPolicy::default());
        // Unknown owner (an older peer, or `--no-owner`): never.
        for a in [&keep, &no_owner] {
            assert_eq!(a.file_mode(0o6755, None), 0o755);
            assert_eq!(a.file_mode(0o6755, Some(&m(u32::MAX, u32::MAX))), 0o755);
            assert_eq!(a.file_mode(0o0640, None), 0o640, "other bits stay");
        }
        // The process's own ids: kept, unless it is root (a claim is no proof).
        let own = if euid == 0 { 0o755 } else { 0o6755 };
        assert_eq!(no_owner.file_mode(0o6755, Some(&m(euid, egid))), own);
        // A foreign owner: kept only when applied (root, allowed).
        assert_eq!(
            no_owner.file_mode(0o6755, Some(&m(euid + 1, egid + 1))),
            0o755
        );
        let applied = if euid == 0 { 0o6755 } else { 0o755 };
        assert_eq!(
            keep.file_mode(0o6755, Some(&m(euid + 1, egid + 1))),
            applied
        );
    }

    /// `cap_net_raw+ep` as `setcap` writes it (VFS_CAP_REVISION_2, effective).
    const CAP_NET_RAW: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// With `xattrs = "all"`, a received file's `security.capability` is dropped
    /// unless its owner is applied (as a setuid bit is); other attributes are set.
    #[test]
    fn file_capabilities_only_where_the_owner_is_applied() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: setting file capabilities needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let all = XattrScope {
            user: true,
            acls: true,
            all: true,
        };
        let meta = |uid| EntryMeta {
            entry: 0,
            uid,
            gid: uid,
            xattrs: vec![
                Xattr {
                    name: CAPABILITY.to_vec(),
                    value: CAP_NET_RAW.to_vec(),
                },
                Xattr {
                    name: b"user.k".to_vec(),
                    value: b"v".to_vec(),
                },
            ],
        };
        let names = |p: &std::path::Path| {
            let mut list = vec![0u8; 4096];
            let n = rustix::fs::llistxattr(p, &mut list[..]).unwrap();
            String::from_utf8_lossy(&list[..n]).into_owned()
        };
        for (owner, uid, kept) in [(false, 0, false), (false, 1234, false), (true, 1234, true)] {
            let path = t.path().join(format!("f{owner}{uid}"));
            std::fs::write(&path, b"#!/bin/sh\n").unwrap();
            let fd = rustix::fs::open(&path, rustix::fs::OFlags::RDWR, 0.into()).unwrap();
            let a = Applier::new(MetaPolicy { xattrs: all, owner });
            match a.before_mode::<std::os::fd::OwnedFd>(&Target::Fd(&fd), Some(&meta(uid))) {
                Ok(()) => {}
                Err(e) if Errno::from_io_error(&e) == Some(Errno::OPNOTSUPP) => {
                    eprintln!("skipped: no xattrs here ({e})");
                    return;
                }
                Err(e) => panic!("{e}"),
            }
            let got = names(&path);
            assert!(got.contains("user.k"), "{owner} {uid}: {got:?}");
            assert_eq!(
                got.contains("security.capability"),
                kept,
                "owner applied {owner}, uid {uid}: {got:?}"
            );
        }
    }

    #[test]
    fn scopes() {
        let d = XattrScope::DEFAULT;
        assert!(d.allows(b"user.x") && d.allows(ACL_ACCESS) && d.allows(ACL_DEFAULT));
        assert!(!d.allows(b"trusted.x") && !d.allows(b"security.selinux"));
        let no_acl = XattrScope { acls: false, ..d };
        assert!(no_acl.allows(b"user.x") && !no_acl.allows(ACL_ACCESS));
        let all = XattrScope {
            user: false,
            acls: false,
            all: true,
        };
        assert!(all.allows(b"trusted.x") && all.allows(b"user.x") && !all.allows(ACL_ACCESS));
    }
}
