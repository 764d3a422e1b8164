//! Comparing two trees: the one comparator of the project. [`Compare::EXACT`] checks
//! what a dmover copy must reproduce (kinds, names, bytes, modes, mtimes, symlink
//! targets): tests and the demo use it. [`Compare::content`] checks only what every copy
//! tool must get right (names, kinds, sizes, content; a symlink may arrive followed, as
//! a regular file with its target's content), all bytes or a sample: the benchmarks
//! check other tools' copies with it. Reading both trees is a separate, measured step,
//! never part of a transfer.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How much content to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every byte of every file.
    Full,
    /// Up to 16 files spread over the tree; files up to 64 MiB whole, larger ones at
    /// three 4 MiB slices (start, middle, end).
    Sample,
}

/// What to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compare {
    /// Modes and mtimes too.
    pub metadata: bool,
    /// A symlink of the first tree may be a regular file in the second, with its
    /// target's content.
    pub followed_links: bool,
    /// How much content.
    pub depth: Depth,
}

impl Compare {
    /// Everything a dmover copy reproduces.
    pub const EXACT: Compare = Compare {
        metadata: true,
        followed_links: false,
        depth: Depth::Full,
    };

    /// What any copy tool must get right, reading `depth` of the content.
    pub const fn content(depth: Depth) -> Compare {
        Compare {
            metadata: false,
            followed_links: true,
            depth,
        }
    }
}

/// What a comparison covered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compared {
    /// Regular files matched (by name, kind and size).
    pub files: u64,
    /// Directories matched.
    pub dirs: u64,
    /// Symlinks matched.
    pub symlinks: u64,
    /// Files whose content was compared (whole or in slices).
    pub contents: u64,
    /// Bytes compared.
    pub bytes: u64,
}

/// Compares tree `a` with tree `b` entirely ([`Compare::EXACT`]); `Err` names the
/// first difference.
pub fn compare_trees(a: &Path, b: &Path) -> Result<Compared, String> {
    compare(a, b, Compare::EXACT)
}

/// Compares tree `a` (the source) with tree `b` (the copy) as `how` says; `Err` names
/// the first difference.
pub fn compare(a: &Path, b: &Path, how: Compare) -> Result<Compared, String> {
    let mut c = Compared::default();
    let mut files = Vec::new();
    entries(a, b, how, &mut c, &mut files)?;
    let picked: Vec<&(PathBuf, PathBuf, u64)> = match how.depth {
        Depth::Full => files.iter().collect(),
        Depth::Sample => {
            let with_data: Vec<_> = files.iter().filter(|f| f.2 > 0).collect();
            let step = with_data.len().div_ceil(16).max(1);
            with_data.into_iter().step_by(step).collect()
        }
    };
    for (fa, fb, size) in picked {
        let ranges: Vec<(u64, u64)> = if how.depth == Depth::Full || *size <= 64 << 20 {
            vec![(0, *size)]
        } else {
            let s = 4u64 << 20;
            vec![(0, s), ((size / 2) & !4095, s), (size - s, s)]
        };
        for (off, len) in ranges {
            compare_range(fa, fb, off, len)?;
            c.bytes += len;
        }
        c.contents += 1;
    }
    Ok(c)
}

fn meta(p: &Path) -> Result<fs::Metadata, String> {
    fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Compares the entries `a` and `b` (recursively), collecting the files whose content
/// is to be compared.
fn entries(
    a: &Path,
    b: &Path,
    how: Compare,
    c: &mut Compared,
    files: &mut Vec<(PathBuf, PathBuf, u64)>,
) -> Result<(), String> {
    let (ma, mb) = (meta(a)?, meta(b)?);
    let (ta, tb) = (ma.file_type(), mb.file_type());
    let what = |x: &str| format!("{} and {} differ: {x}", a.display(), b.display());
    if ta.is_symlink() && tb.is_file() && how.followed_links {
        let target = fs::metadata(a).map_err(|e| format!("{}: {e}", a.display()))?;
        if !target.is_file() || target.len() != mb.len() {
            return Err(what("a followed symlink that is not its target's copy"));
        }
        files.push((a.to_owned(), b.to_owned(), mb.len()));
        c.files += 1;
        return Ok(());
    }
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
    let mode = |m: &fs::Metadata| m.permissions().mode() & 0o7777;
    if how.metadata && mode(&ma) != mode(&mb) {
        return Err(what(&format!("modes {:o} vs {:o}", mode(&ma), mode(&mb))));
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
        if let Some(n) = na.iter().find(|n| nb.binary_search(n).is_err()) {
            return Err(format!("{} is missing in the copy", b.join(n).display()));
        }
        if let Some(n) = nb.iter().find(|n| na.binary_search(n).is_err()) {
            return Err(format!("{} is in the copy only", b.join(n).display()));
        }
        for n in &na {
            entries(&a.join(n), &b.join(n), how, c, files)?;
        }
        // Children done: now the directory's own mtime is final on both sides.
        if how.metadata {
            let (ma, mb) = (meta(a)?, meta(b)?);
            if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
                return Err(what("directory mtimes"));
            }
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
    if how.metadata && (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
        return Err(what("mtimes"));
    }
    files.push((a.to_owned(), b.to_owned(), ma.len()));
    c.files += 1;
    Ok(())
}

/// Compares `len` bytes at `off` of `a` and `b` (and that neither has more or less).
fn compare_range(a: &Path, b: &Path, off: u64, len: u64) -> Result<(), String> {
    let open = |p: &Path| -> Result<fs::File, String> {
        let mut f = fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        f.seek(SeekFrom::Start(off))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(f)
    };
    let (mut fa, mut fb) = (open(a)?.take(len), open(b)?.take(len));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = off;
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(|e| format!("{}: {e}", a.display()))?;
        let m = read_full(&mut fb, &mut bb).map_err(|e| format!("{}: {e}", b.display()))?;
        if n != m || ba[..n] != bb[..n] {
            let first = ba[..n.min(m)]
                .iter()
                .zip(&bb[..n.min(m)])
                .position(|(x, y)| x != y)
                .unwrap_or(n.min(m));
            return Err(format!(
                "{} and {} differ: contents, from byte {}",
                a.display(),
                b.display(),
                at + first as u64
            ));
        }
        if n == 0 {
            return Ok(());
        }
        at += n as u64;
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree(root: &Path) {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), vec![7u8; 100_000]).unwrap();
        fs::write(root.join("g"), b"hello").unwrap();
        fs::write(root.join("empty"), b"").unwrap();
        symlink("g", root.join("link")).unwrap();
    }

    #[test]
    fn content_comparison_passes_followed_links_and_fails_differences() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        tree(&a);
        tree(&b);
        for depth in [Depth::Full, Depth::Sample] {
            let c = compare(&a, &b, Compare::content(depth)).unwrap();
            assert_eq!((c.files, c.dirs, c.symlinks), (3, 3, 1));
        }
        // A followed symlink is fine, but not for an exact comparison.
        fs::remove_file(b.join("link")).unwrap();
        fs::write(b.join("link"), b"hello").unwrap();
        let full = Compare::content(Depth::Full);
        assert_eq!(compare(&a, &b, full).unwrap().contents, 4);
        // (Without mtimes: the two trees were written at different times, and which
        // difference an exact comparison meets first would depend on the clock.)
        let exact_links = Compare {
            metadata: false,
            ..Compare::EXACT
        };
        let e = compare(&a, &b, exact_links).unwrap_err();
        assert!(e.contains("only one is a symlink"), "{e}");
        // One changed byte is not.
        let mut bytes = vec![7u8; 100_000];
        bytes[77_777] = 8;
        fs::write(b.join("a/b/f"), &bytes).unwrap();
        let e = compare(&a, &b, full).unwrap_err();
        assert!(e.contains("a/b/f") && e.contains("from byte 77777"), "{e}");
        // Missing and extra entries.
        fs::write(b.join("a/b/f"), vec![7u8; 100_000]).unwrap();
        fs::write(b.join("extra"), b"x").unwrap();
        let sample = Compare::content(Depth::Sample);
        assert!(compare(&a, &b, sample).unwrap_err().contains("copy only"));
        fs::remove_file(b.join("extra")).unwrap();
        fs::remove_file(b.join("g")).unwrap();
        assert!(compare(&a, &b, sample).unwrap_err().contains("missing"));
    }

    #[test]
    fn exact_comparison_checks_modes_and_mtimes() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        tree(&a);
        tree(&b);
        // Fresh trees: mtimes differ unless set.
        assert!(compare(&a, &b, Compare::content(Depth::Full)).is_ok());
        fs::set_permissions(b.join("g"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(a.join("g"), fs::Permissions::from_mode(0o644)).unwrap();
        let e = compare_trees(&a, &b).unwrap_err();
        assert!(e.contains("modes") || e.contains("mtimes"), "{e}");
    }
}
