//! Comparing two trees entry by entry: kinds, names, bytes, modes, mtimes and symlink
//! targets. This reads both trees in full, so it is a separate, measured step (the
//! demo, tests and users who distrust their storage), never part of a transfer.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// What a comparison covered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compared {
    /// Regular files compared byte for byte.
    pub files: u64,
    /// Directories compared.
    pub dirs: u64,
    /// Symlinks compared.
    pub symlinks: u64,
    /// Bytes compared.
    pub bytes: u64,
}

/// Compares tree `a` with tree `b`; `Err` names the first difference.
pub fn compare_trees(a: &Path, b: &Path) -> Result<Compared, String> {
    let mut c = Compared::default();
    compare(a, b, &mut c)?;
    Ok(c)
}

fn meta(p: &Path) -> Result<fs::Metadata, String> {
    fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))
}

fn compare(a: &Path, b: &Path, c: &mut Compared) -> Result<(), String> {
    let (ma, mb) = (meta(a)?, meta(b)?);
    let (ta, tb) = (ma.file_type(), mb.file_type());
    let what = |x: &str| format!("{} and {} differ: {x}", a.display(), b.display());
    if ta.is_symlink() || tb.is_symlink() {
        if !(ta.is_symlink() && tb.is_symlink()) {
            return Err(what("only one is a symlink"));
        }
        let (la, lb) = (fs::read_link(a), fs::read_link(b));
        if la.as_ref().ok() != lb.as_ref().ok() {
            return Err(what(&format!("link targets {la:?} vs {lb:?}")));
        }
        c.symlinks += 1;
        return Ok(());
    }
    if ma.permissions().mode() & 0o7777 != mb.permissions().mode() & 0o7777 {
        return Err(what(&format!(
            "modes {:o} vs {:o}",
            ma.permissions().mode() & 0o7777,
            mb.permissions().mode() & 0o7777
        )));
    }
    if ta.is_dir() {
        if !tb.is_dir() {
            return Err(what("only one is a directory"));
        }
        let names = |p: &Path| -> Result<Vec<_>, String> {
            let mut v = fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{}: {e}", p.display()))?;
            v.sort();
            Ok(v)
        };
        let (na, nb) = (names(a)?, names(b)?);
        if na != nb {
            let only_a: Vec<_> = na.iter().filter(|n| !nb.contains(n)).take(3).collect();
            let only_b: Vec<_> = nb.iter().filter(|n| !na.contains(n)).take(3).collect();
            return Err(what(&format!(
                "entries only in the first {only_a:?}, only in the second {only_b:?}"
            )));
        }
        for n in &na {
            compare(&a.join(n), &b.join(n), c)?;
        }
        // Children done: now the directory's own mtime is final on both sides.
        let (ma, mb) = (meta(a)?, meta(b)?);
        if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
            return Err(what("directory mtimes"));
        }
        c.dirs += 1;
        return Ok(());
    }
    if !ta.is_file() || !tb.is_file() {
        return Err(what("not both regular files"));
    }
    if ma.len() != mb.len() {
        return Err(what(&format!("sizes {} vs {}", ma.len(), mb.len())));
    }
    if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
        return Err(what("mtimes"));
    }
    let open = |p: &Path| fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut off = 0u64;
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(|e| format!("{}: {e}", a.display()))?;
        let m = read_full(&mut fb, &mut bb).map_err(|e| format!("{}: {e}", b.display()))?;
        if n != m || ba[..n] != bb[..n] {
            let at = ba[..n.min(m)]
                .iter()
                .zip(&bb[..n.min(m)])
                .position(|(x, y)| x != y)
                .unwrap_or(n.min(m));
            return Err(what(&format!("contents, from byte {}", off + at as u64)));
        }
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    c.files += 1;
    c.bytes += off;
    Ok(())
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
