//! Turning the paths a user or a peer names into safe directory handles.
//!
//! A [`Base`] is where paths start: the local file system (a client's own paths, which
//! may go anywhere the user can) or a server's export root, below which every path a
//! peer sends must stay: absolute paths and `..` are refused outright, and symlinks are
//! resolved by the kernel with `RESOLVE_BENEATH`, so one pointing outside is refused
//! too, without a race between checking and opening.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use dmover_proto::control::ErrorCode;
use dmover_proto::manifest::{Entry, EntryKind, validate_name};
use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::sys;
use crate::tree::RootRef;

/// Where paths are resolved from.
#[derive(Debug, Clone)]
pub enum Base {
    /// The local file system: absolute paths or paths relative to the working directory.
    Local,
    /// A server's export: paths are relative to this directory and may not leave it.
    Export(Arc<OwnedFd>),
}

const DIR_HANDLE: OFlags = OFlags::PATH.union(OFlags::DIRECTORY);

/// Names starting with this are dmover's own: staging files (`.dmv.<key>.<name>`) and
/// journals (`.dmv.journal.<key>`). A peer may not name them (a received manifest
/// naming one is refused, see [`check_unreserved`], as a rename is), a walk does not
/// send them, and `--delete` leaves them alone.
pub const RESERVED_PREFIX: &[u8] = b".dmv.";

/// Whether `name` is in dmover's own namespace ([`RESERVED_PREFIX`]).
pub fn is_reserved(name: &[u8]) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

/// Refuses names in dmover's own namespace among those a received manifest would
/// write (its entries' names, the roots' as bound at the destination): a peer could
/// otherwise plant a journal read back on `--resume`, or a staging file another
/// transfer would take up.
pub fn check_unreserved<'a>(names: impl IntoIterator<Item = &'a [u8]>) -> Result<()> {
    match names.into_iter().find(|n| is_reserved(n)) {
        None => Ok(()),
        Some(n) => Err(Error::refused(
            ErrorCode::PermissionDenied,
            format!(
                "the manifest names {:?}: names starting with .dmv. are dmover's own \
                 (staging files and journals), never written from a peer's manifest",
                lossy(n)
            ),
        )),
    }
}

/// Splits a path a peer sent into its components, refusing absolute paths and `..`;
/// empty and `.` components are dropped, so `""`, `"."` and `"a//./b/"` are fine.
pub fn checked_components(path: &[u8]) -> Result<Vec<&[u8]>> {
    if path.first() == Some(&b'/') {
        return Err(Error::refused(
            ErrorCode::PathEscape,
            format!(
                "absolute path {:?} refused: paths are relative to the server's root",
                lossy(path)
            ),
        ));
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(Error::refused(
                    ErrorCode::PathEscape,
                    format!(
                        "path {:?} refused: '..' may not leave the server's root",
                        lossy(path)
                    ),
                ));
            }
            c if c.contains(&0) => {
                return Err(Error::refused(ErrorCode::PathEscape, "path contains NUL"));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Maps an error opening `path` to a clear engine error.
fn open_error(base: &Base, path: &[u8], e: io::Error) -> Error {
    let shown = lossy(path);
    match (base, Errno::from_io_error(&e)) {
        (_, Some(Errno::NOENT)) => Error::refused(
            ErrorCode::NotFound,
            format!("{shown}: no such file or directory"),
        ),
        (Base::Export(_), Some(Errno::XDEV)) => Error::refused(
            ErrorCode::PathEscape,
            format!("path {shown:?} refused: it leads outside the server's root"),
        ),
        (_, Some(Errno::ACCESS)) => Error::refused(
            ErrorCode::PermissionDenied,
            format!("{shown}: permission denied"),
        ),
        _ => Error::io("opening", shown, e),
    }
}

impl Base {
    /// Opens a directory handle on `path` (`""` is the base itself).
    pub fn open_dir(&self, path: &[u8]) -> io::Result<OwnedFd> {
        match self {
            Base::Local => sys::open_local(path, DIR_HANDLE),
            Base::Export(root) => sys::open_beneath(&**root, path, DIR_HANDLE),
        }
    }

    /// Splits `path` into its containing directory and its last component, checking
    /// peer paths. Returns `None` for the base itself (an export's root).
    fn split<'p>(&self, path: &'p [u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        match self {
            Base::Export(_) => {
                let comps = checked_components(path)?;
                Ok(comps
                    .split_last()
                    .map(|(last, rest)| (rest.join(&b'/'), last.to_vec())))
            }
            Base::Local => {
                let mut p: &'p [u8] = path;
                while p.len() > 1 && p.ends_with(b"/") {
                    p = &p[..p.len() - 1];
                }
                let (parent, last) = match p.iter().rposition(|&b| b == b'/') {
                    Some(0) => (&b"/"[..], &p[1..]),
                    Some(i) => (&p[..i], &p[i + 1..]),
                    None => (&b"."[..], p),
                };
                if last.is_empty() || last == b"." || last == b".." {
                    // "/", ".", "foo/..": name the directory by its real path.
                    let real = std::fs::canonicalize(std::ffi::OsStr::from_bytes(p))
                        .map_err(|e| open_error(self, p, e))?;
                    let real = real.as_os_str().as_bytes();
                    if real == b"/" {
                        return Ok(None);
                    }
                    return self.split(real);
                }
                Ok(Some((parent.to_vec(), last.to_vec())))
            }
        }
    }
}

/// One source the user named, opened.
#[derive(Debug)]
pub struct SourceRoot {
    /// Where it is.
    pub root: RootRef,
    /// Its name in the manifest (what it is called at the destination).
    pub name: Vec<u8>,
    /// How messages name it.
    pub label: String,
}

/// Opens a source path. `base_name` names the base itself should a peer ask for it
/// (an export's whole root).
pub fn source_root(base: &Base, path: &[u8], base_name: &[u8]) -> Result<SourceRoot> {
    let label = lossy(path);
    match base.split(path)? {
        None => match base {
            Base::Export(root) => Ok(SourceRoot {
                root: RootRef::Dir(root.clone()),
                name: base_name.to_vec(),
                label: if label.is_empty() { "/".into() } else { label },
            }),
            Base::Local => Err(Error::refused(
                ErrorCode::Unsupported,
                "refusing to copy the whole file system (/)",
            )),
        },
        Some((_, name)) if path.len() > 1 && path.ends_with(b"/") => {
            // A trailing slash names the directory itself, following a symlink to it
            // (as `cp -r link/ dst` does); a server only follows it within its root.
            let dir = base.open_dir(path).map_err(|e| open_error(base, path, e))?;
            Ok(SourceRoot {
                root: RootRef::Dir(Arc::new(dir)),
                name,
                label,
            })
        }
        Some((parent, name)) => {
            let parent = base
                .open_dir(&parent)
                .map_err(|e| open_error(base, &parent, e))?;
            Ok(SourceRoot {
                root: RootRef::At {
                    parent: Arc::new(parent),
                    name: name.clone(),
                },
                name,
                label,
            })
        }
    }
}

/// The directory containing `dest` and `dest`'s name in it, if `dest` has a parent.
pub fn dest_parent(base: &Base, dest: &[u8]) -> Result<Option<(OwnedFd, Vec<u8>)>> {
    if let Base::Export(_) = base {
        checked_components(dest)?;
    }
    let Some((parent, name)) = base.split(dest)? else {
        return Ok(None);
    };
    let fd = base
        .open_dir(&parent)
        .map_err(|e| open_error(base, &parent, e))?;
    Ok(Some((fd, name)))
}

/// rename(2) of `from` (beneath `from_base`) to `to` (beneath `to_base`): both parents
/// are opened as [`dest_parent`] opens a destination's (on an export: no `..`, no
/// absolute path, no symlink leading out), the last components are not followed, and
/// the rename is one `renameat` between the two handles, so an existing `to` is
/// replaced atomically (a directory only by a directory, and only when it is empty).
/// An export's root cannot be renamed or replaced, and names starting with `.dmv.`
/// (staging files and journals) are refused on either side.
pub fn rename_beneath(from_base: &Base, from: &[u8], to_base: &Base, to: &[u8]) -> Result<()> {
    let shown = format!("{} to {}", lossy(from), lossy(to));
    let (Some((from_dir, from_name)), Some((to_dir, to_name))) =
        (dest_parent(from_base, from)?, dest_parent(to_base, to)?)
    else {
        return Err(Error::refused(
            ErrorCode::PermissionDenied,
            format!("renaming {shown}: an export's root cannot be renamed or replaced"),
        ));
    };
    if [&from_name, &to_name].iter().any(|n| is_reserved(n)) {
        return Err(Error::refused(
            ErrorCode::PermissionDenied,
            format!("renaming {shown}: names starting with .dmv. are dmover's own"),
        ));
    }
    rustix::fs::renameat(&from_dir, from_name.as_slice(), &to_dir, to_name.as_slice())
        .map_err(|e| Error::io("renaming", shown, io::Error::from(e)))
}

/// Decides where each root of an incoming manifest goes, with `cp -r` semantics:
/// into `dest` when it is an existing directory; as `dest` itself when it does not
/// exist (one root only) or is a file being replaced by a file.
pub fn resolve_dest(
    base: &Base,
    dest: &[u8],
    roots: &[(u32, &Entry)],
) -> Result<HashMap<u32, (RootRef, String)>> {
    let label = lossy(dest);
    let shown = if label.is_empty() {
        ".".to_string()
    } else {
        label.clone()
    };
    let mut out = HashMap::new();
    if let Base::Export(_) = base {
        checked_components(dest)?;
    }
    match base.open_dir(dest) {
        Ok(dir) => {
            let dir = Arc::new(dir);
            for (idx, e) in roots {
                let name_label = format!("{}/{}", shown.trim_end_matches('/'), lossy(&e.name));
                out.insert(
                    *idx,
                    (
                        RootRef::At {
                            parent: dir.clone(),
                            name: e.name.clone(),
                        },
                        name_label,
                    ),
                );
            }
            return Ok(out);
        }
        Err(e) => match Errno::from_io_error(&e) {
            Some(Errno::NOENT) | Some(Errno::NOTDIR) => {}
            _ => return Err(open_error(base, dest, e)),
        },
    }
    // `dest/` names a directory: one that is not there is not made into a file.
    if dest.len() > 1 && dest.ends_with(b"/") && !roots.is_empty() {
        return Err(Error::refused(
            ErrorCode::NotFound,
            format!("destination {shown}: no such directory"),
        ));
    }
    // `dest` is not an existing directory: it names the single root itself.
    let [(idx, root)] = roots else {
        if roots.is_empty() {
            return Ok(out);
        }
        return Err(Error::refused(
            ErrorCode::NotFound,
            format!("destination {shown} is not a directory (copying several sources needs one)"),
        ));
    };
    let Some((parent, name)) = base.split(dest)? else {
        return Err(Error::refused(
            ErrorCode::Protocol,
            "destination is the root itself",
        ));
    };
    validate_name(&name)
        .map_err(|e| Error::refused(ErrorCode::NotFound, format!("destination {shown}: {e}")))?;
    let parent_fd = base
        .open_dir(&parent)
        .map_err(|e| open_error(base, &parent, e))?;
    if root.kind == EntryKind::Dir {
        match rustix::fs::statat(
            &parent_fd,
            name.as_slice(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(_) => {
                return Err(Error::refused(
                    ErrorCode::Io,
                    format!("cannot overwrite non-directory {shown} with a directory"),
                ));
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(Error::io("checking", shown, e)),
        }
    }
    out.insert(
        *idx,
        (
            RootRef::At {
                parent: Arc::new(parent_fd),
                name,
            },
            shown,
        ),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_paths_are_confined() {
        assert!(checked_components(b"/etc/passwd").is_err());
        assert!(checked_components(b"a/../../b").is_err());
        assert!(checked_components(b"..").is_err());
        assert_eq!(checked_components(b"").unwrap(), Vec::<&[u8]>::new());
        assert_eq!(
            checked_components(b"./a//b/").unwrap(),
            vec![&b"a"[..], b"b"]
        );
    }
}
