//! Platform calls in one place: opening relative to directory handles without following
//! symlinks, confinement beneath a root, direct I/O with fallback, preallocation,
//! timestamps and descriptor limits (Linux).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{
    AtFlags, FallocateFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps, UTIME_OMIT,
};
use rustix::io::Errno;

pub use rustix::fs::CWD;

/// Flags for a directory handle used only as the base of `*at` calls.
pub const DIR_PATH: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens `name` in `dir` without following a symlink in its last component (the name
/// must be a single component, so no other component exists to follow).
pub fn open_in(dir: impl AsFd, name: &[u8], flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?)
}

/// Opens the regular file `name` in `dir` to read its data: without following a
/// symlink, and with `O_NONBLOCK`, so that a FIFO or a device swapped in for a file
/// since it was walked (by a local user who can write there) neither blocks the
/// opening thread — a FIFO with no writer would, forever — nor is read: anything but a
/// regular file is refused with [`NOT_REGULAR`] as its message. `O_NONBLOCK` changes
/// nothing for a regular file's reads.
pub fn open_regular(dir: impl AsFd, name: &[u8]) -> io::Result<OwnedFd> {
    let fd = open_in(dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0)?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, NOT_REGULAR));
    }
    Ok(fd)
}

/// What [`open_regular`] says of a name that is no longer a regular file.
pub const NOT_REGULAR: &str = "it is no longer a regular file";

/// Whether `e` is [`open_regular`]'s refusal of something not a regular file.
pub fn is_not_regular(e: &io::Error) -> bool {
    e.raw_os_error().is_none() && e.get_ref().is_some_and(|x| x.to_string() == NOT_REGULAR)
}

/// Opens a multi-component relative `path` below `root`, refusing any resolution that
/// would leave `root` (`..`, absolute symlinks, symlinks pointing outside): the kernel
/// checks every step (`openat2` with `RESOLVE_BENEATH`), so there is no race between
/// checking and using the path. `EXDEV` means the path tried to escape.
///
/// A path with `..` may meet `EAGAIN`: the kernel could not be sure the `..` stayed
/// beneath `root` because something was renamed (anywhere on the machine) during the
/// walk. That is retried, as openat2(2) advises: a busy server renames a file per
/// file received, and one such refusal failed a test's copy with "Resource
/// temporarily unavailable".
pub fn open_beneath(root: impl AsFd, path: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
    /// Tries before `EAGAIN` is returned (each after a yield).
    const TRIES: u32 = 64;
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            &root,
            path,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::AGAIN) if tries + 1 < TRIES => {
                tries += 1;
                std::thread::yield_now();
            }
            r => return Ok(r?),
        }
    }
}

/// Opens a local path (absolute or relative to the working directory), following
/// symlinks as the user's shell would.
pub fn open_local(path: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    Ok(rustix::fs::openat(
        CWD,
        path,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Whether an error means "this file system does not do direct I/O".
pub fn is_direct_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::INVAL.raw_os_error())
}

/// Whether the page at `offset` of an open file is in the page cache: a one-byte
/// `RWF_NOWAIT` read succeeds only if it is. Unknown (old kernel) counts as not cached.
pub fn is_cached(fd: impl AsFd, offset: u64) -> bool {
    let mut b = [0u8; 1];
    matches!(
        rustix::io::preadv2(
            fd,
            &mut [io::IoSliceMut::new(&mut b)],
            offset,
            rustix::io::ReadWriteFlags::NOWAIT,
        ),
        Ok(1)
    )
}

/// Reads exactly `buf.len()` bytes at `offset` unless the file ends first; returns the
/// number of bytes read.
pub fn pread_full(fd: impl AsFd, buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(&fd, &mut buf[done..], offset) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Writes all of `buf` at `offset`.
pub fn pwrite_all(fd: impl AsFd, buf: &[u8], mut offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pwrite(&fd, &buf[done..], offset) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reserves `len` bytes for a file about to be written, so it is laid out contiguously
/// and a full disk shows up now rather than halfway. Unsupported file systems are
/// fine: the writes will allocate.
pub fn preallocate(fd: impl AsFd, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(fd, FallocateFlags::empty(), 0, len) {
        Ok(()) | Err(Errno::OPNOTSUPP) | Err(Errno::NOSYS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives back the space reserved for a file of `size` bytes where it holds no data
/// (its preallocation, [`preallocate`], never written): the holes between its data
/// extents ([`data_extents`]) are punched, its size and data kept. A file system
/// without hole punching keeps the reservation.
pub fn release_unwritten(fd: impl AsFd, size: u64) -> io::Result<()> {
    let extents = data_extents(&fd, size)?;
    let mut at = 0;
    for (start, end) in extents.into_iter().chain(std::iter::once((size, size))) {
        if start > at {
            let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            match rustix::fs::fallocate(&fd, flags, at, start - at) {
                Ok(()) => {}
                Err(Errno::OPNOTSUPP) | Err(Errno::NOSYS) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        at = at.max(end);
    }
    Ok(())
}

/// The data extents of a file of `size` bytes (`[start, end)`, ascending), found with
/// `SEEK_DATA`/`SEEK_HOLE`: everything between them is a hole, which reads as zeros.
/// A file system without them reports the whole file as data (the kernel's default).
pub fn data_extents(fd: impl AsFd, size: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    let mut extents = Vec::new();
    let mut at = 0;
    while at < size {
        let start = match seek(&fd, SeekFrom::Data(at)) {
            Ok(o) => o,
            // No data at or after `at`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(vec![(0, size)]),
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = seek(&fd, SeekFrom::Hole(start))?.min(size);
        extents.push((start, end));
        at = end;
    }
    Ok(extents)
}

/// Whether `[start, end)` holds any byte of the data extents `extents` (ascending).
pub fn has_data(extents: &[(u64, u64)], start: u64, end: u64) -> bool {
    let i = extents.partition_point(|&(_, e)| e <= start);
    extents.get(i).is_some_and(|&(s, _)| s < end)
}

/// The block size of holes the sink leaves: whole blocks of zeros at this alignment
/// are not written.
pub const HOLE_BLOCK: usize = 4096;

/// The runs of `data` (bytes to be written at file offset `offset`) worth writing:
/// `[start, end)` ranges of `data`, leaving out every whole zero block aligned to
/// [`HOLE_BLOCK`] in the file; bytes of partial blocks at either end are kept.
pub fn data_runs(offset: u64, data: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let block_end = (HOLE_BLOCK - ((offset + at as u64) % HOLE_BLOCK as u64) as usize)
            .min(data.len() - at)
            + at;
        let block = &data[at..block_end];
        let whole = block.len() == HOLE_BLOCK;
        if !whole || block.iter().any(|&b| b != 0) {
            match runs.last_mut() {
                Some(r) if r.1 == at => r.1 = block_end,
                _ => runs.push((at, block_end)),
            }
        }
        at = block_end;
    }
    runs
}

/// Sets the modification time of `name` in `dir` (not following a symlink), leaving
/// the access time alone.
pub fn set_mtime(dir: impl AsFd, name: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
    Ok(rustix::fs::utimensat(
        dir,
        name,
        &mtime_only(sec, nsec),
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// Sets the modification time of the file `path` names, following symlinks (for
/// `/proc/self/fd/N` of an `O_PATH` handle), leaving the access time alone.
pub fn set_mtime_path(path: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
    Ok(rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &mtime_only(sec, nsec),
        AtFlags::empty(),
    )?)
}

/// Timestamps that set the modification time and leave the access time alone.
fn mtime_only(sec: i64, nsec: u32) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: sec,
            tv_nsec: nsec.into(),
        },
    }
}

/// Sets the modification time of an open file, leaving the access time alone.
pub fn set_mtime_fd(fd: impl AsFd, sec: i64, nsec: u32) -> io::Result<()> {
    Ok(rustix::fs::futimens(fd, &mtime_only(sec, nsec))?)
}

/// The process's file mode creation mask, read once from `/proc/self/status` (reading
/// it with `umask(2)` would briefly change it under other threads).
pub fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            // Unknown: assume the strictest common mask, so files get an explicit chmod.
            .unwrap_or(0o077)
    })
}

/// `fchmodat2(2)` (Linux 6.6) is missing here: set at its first `ENOSYS`.
static NO_FCHMODAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets the permission bits of `name` in `dir`, never through a symlink: a symlink in
/// its place (swapped in for a directory or a staging file by a peer's rename, or by a
/// local user who can write in the export) fails with `ELOOP` and its target is left
/// alone. `fchmodat2(…, AT_SYMLINK_NOFOLLOW)` where the kernel has it; elsewhere the
/// entry is pinned by an `O_PATH | O_NOFOLLOW` handle, refused if it is a symlink, and
/// changed through `/proc/self/fd/N`, which reaches that inode and no other (`fchmod`
/// fails on `O_PATH` handles, and opening the entry for reading needs a read right).
pub fn set_mode(dir: impl AsFd, name: &[u8], mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    let mode = mode & 0o7777;
    let symlink = || io::Error::from_raw_os_error(libc::ELOOP);
    if !NO_FCHMODAT2.load(Ordering::Relaxed) {
        let c = std::ffi::CString::new(name)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid descriptor and a NUL-terminated name that outlives the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fchmodat2,
                dir.as_fd().as_raw_fd(),
                c.as_ptr(),
                mode as libc::c_uint,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // The mode of a symlink cannot be set on Linux: this is one.
            Some(libc::EOPNOTSUPP) => return Err(symlink()),
            Some(libc::ENOSYS) => NO_FCHMODAT2.store(true, Ordering::Relaxed),
            // A seccomp filter that does not know the call says EPERM: the fallback
            // tells that apart from a real refusal by meeting the same one.
            Some(libc::EPERM) => {}
            _ => return Err(e),
        }
    }
    set_mode_pinned(dir, name, mode)
}

/// [`set_mode`] without `fchmodat2`: through an `O_PATH | O_NOFOLLOW` handle.
fn set_mode_pinned(dir: impl AsFd, name: &[u8], mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = open_in(&dir, name, OFlags::PATH, 0)?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rustix::fs::chmod(
        path.as_str(),
        Mode::from_raw_mode(mode & 0o7777),
    )?)
}

/// Raises the soft limit on open descriptors to the hard limit (a server holds a
/// directory handle per active directory and several sockets per session).
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, lim) {
            tracing::debug!("cannot raise RLIMIT_NOFILE: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;
    use std::os::unix::fs::FileExt;

    /// Renames elsewhere on the machine make the kernel refuse a `..` walk beneath a
    /// root now and then (`EAGAIN`); `open_beneath` tries again instead of failing.
    #[test]
    fn a_walk_up_beneath_the_root_survives_renames_meanwhile() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/f"), b"x").unwrap();
        let root = open_local(t.path().as_os_str().as_encoded_bytes(), DIR_PATH).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renamer = {
            let (dir, stop) = (t.path().join("r"), stop.clone());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("x"), b"").unwrap();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::fs::rename(dir.join("x"), dir.join("y")).unwrap();
                    std::fs::rename(dir.join("y"), dir.join("x")).unwrap();
                }
            })
        };
        let started = std::time::Instant::now();
        let mut opened = 0;
        while started.elapsed() < std::time::Duration::from_millis(500) {
            open_beneath(&root, b"a/b/../f", OFlags::RDONLY).unwrap();
            opened += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        renamer.join().unwrap();
        assert!(opened > 0);
        // Still beneath: a walk out is refused, not retried into success.
        let e = open_beneath(&root, b"a/../../x", OFlags::RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(Errno::XDEV.raw_os_error()), "{e}");
    }

    #[test]
    fn data_runs_leave_out_whole_zero_blocks() {
        let b = HOLE_BLOCK;
        let mut data = vec![0u8; 5 * b];
        data[b + 7] = 1; // block 1
        data[3 * b] = 2; // block 3
        assert_eq!(data_runs(0, &data), vec![(b, 2 * b), (3 * b, 4 * b)]);
        // Blocks are aligned in the file: at offset 100 the first 3996 bytes are a
        // partial block, kept, and so is the partial block at the end.
        let runs = data_runs(100, &vec![0u8; 3 * b]);
        assert_eq!(runs, vec![(0, b - 100), (3 * b - 100, 3 * b)]);
        assert!(data_runs(0, &vec![0u8; 4 * b]).is_empty());
        let full = vec![9u8; 2 * b];
        assert_eq!(data_runs(0, &full), vec![(0, 2 * b)]);
    }

    #[test]
    fn extents_of_a_sparse_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create_new(dir.path().join("s")).unwrap();
        let mib = 1u64 << 20;
        f.set_len(16 * mib).unwrap();
        f.write_all_at(&vec![1u8; mib as usize], 2 * mib).unwrap();
        f.write_all_at(&vec![2u8; mib as usize], 5 * mib + 4096)
            .unwrap();
        let ext = data_extents(&f, 16 * mib).unwrap();
        // File systems may round extents out to their blocks; they must cover the data
        // and leave most of the file a hole.
        assert!(has_data(&ext, 2 * mib, 3 * mib));
        assert!(has_data(&ext, 5 * mib + 4096, 6 * mib + 4096));
        assert!(!has_data(&ext, 0, mib), "{ext:?}");
        assert!(!has_data(&ext, 8 * mib, 16 * mib), "{ext:?}");
        let data: u64 = ext.iter().map(|(s, e)| e - s).sum();
        assert!(data < 4 * mib, "{ext:?}");
    }

    #[test]
    fn has_data_bounds() {
        let ext = [(10, 20), (30, 40)];
        assert!(!has_data(&ext, 0, 10));
        assert!(has_data(&ext, 0, 11));
        assert!(!has_data(&ext, 20, 30));
        assert!(has_data(&ext, 39, 50));
        assert!(!has_data(&ext, 40, 50));
        assert!(!has_data(&[], 0, 50));
    }

    /// A symlink in place of an entry is refused, both ways, and its target keeps its
    /// mode; a directory and a file get theirs, setuid bits included (the callers
    /// filter those).
    #[test]
    fn a_mode_never_goes_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        let export = t.path().join("export");
        std::fs::create_dir_all(export.join("d")).unwrap();
        std::fs::write(export.join("f"), b"").unwrap();
        std::os::unix::fs::symlink(&outside, export.join("link")).unwrap();
        let dir = open_local(export.as_os_str().as_encoded_bytes(), DIR_PATH).unwrap();
        let mode = |p: &std::path::Path| {
            std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
        };
        type SetMode = fn(BorrowedFd<'_>, &[u8], u32) -> io::Result<()>;
        let ways: [(&str, SetMode); 2] = [
            ("set_mode", |d, n, m| set_mode(d, n, m)),
            ("pinned", |d, n, m| set_mode_pinned(d, n, m)),
        ];
        for (way, set) in ways {
            let e = set(dir.as_fd(), b"link", 0o4777).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{way}: {e}");
            assert_eq!(mode(&outside), 0o600, "{way}: the target was changed");
            set(dir.as_fd(), b"d", 0o2750).unwrap();
            assert_eq!(mode(&export.join("d")), 0o2750, "{way}");
            set(dir.as_fd(), b"f", 0o4640).unwrap();
            assert_eq!(mode(&export.join("f")), 0o4640, "{way}");
            set(dir.as_fd(), b"f", 0o644).unwrap();
            assert!(set(dir.as_fd(), b"missing", 0o644).is_err(), "{way}");
        }
    }
}
