//! Checking a copy made by any tool against its source: the same directories, files and
//! sizes, and the same bytes (all of them, or a sample spread over the tree).
//!
//! Peer tools differ in what they preserve (`cp -r` and `scp -r` drop mtimes, `scp`
//! follows symlinks), so only what every copy must get right is compared: names, kinds,
//! sizes and content. A symlink in the source may arrive as the same link or, followed, as
//! a regular file with its target's content.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How much content to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every byte of every file.
    Full,
    /// Up to 16 files spread over the listing; files up to 64 MiB whole, larger ones at
    /// three 4 MiB slices (start, middle, end).
    Sample,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Dir,
    File(u64),
    Link(PathBuf),
}

fn listing(root: &Path) -> io::Result<BTreeMap<PathBuf, Kind>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel))? {
            let e = e?;
            let r = rel.join(e.file_name());
            let ft = e.file_type()?;
            let kind = if ft.is_symlink() {
                Kind::Link(fs::read_link(e.path())?)
            } else if ft.is_dir() {
                stack.push(r.clone());
                Kind::Dir
            } else {
                Kind::File(e.metadata()?.len())
            };
            out.insert(r, kind);
        }
    }
    Ok(out)
}

/// What a successful check covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// Entries compared by name and kind.
    pub entries: u64,
    /// Files whose content was compared (whole or in slices).
    pub files_compared: u64,
    /// Bytes compared.
    pub bytes_compared: u64,
}

/// Compares `copy` with `src`; `Err` describes the first difference.
pub fn check(src: &Path, copy: &Path, depth: Depth) -> Result<Checked, String> {
    fn io(p: &Path) -> impl FnOnce(io::Error) -> String + '_ {
        move |e| format!("{}: {e}", p.display())
    }
    let a = listing(src).map_err(io(src))?;
    let b = listing(copy).map_err(io(copy))?;
    let mut files = Vec::new();
    for (p, ka) in &a {
        let kb = b
            .get(p)
            .ok_or_else(|| format!("{} is missing in the copy", p.display()))?;
        match (ka, kb) {
            (Kind::Dir, Kind::Dir) => {}
            (Kind::File(x), Kind::File(y)) if x == y => {
                if *x > 0 {
                    files.push((p.clone(), *x));
                }
            }
            (Kind::File(x), Kind::File(y)) => {
                return Err(format!(
                    "{}: {x} bytes in the source, {y} in the copy",
                    p.display()
                ));
            }
            (Kind::Link(x), Kind::Link(y)) if x == y => {}
            (Kind::Link(_), Kind::File(_)) => {
                // Followed: the content must be the target's.
                let target = fs::metadata(src.join(p)).map_err(io(&src.join(p)))?;
                files.push((p.clone(), target.len()));
            }
            _ => {
                return Err(format!(
                    "{}: {ka:?} in the source, {kb:?} in the copy",
                    p.display()
                ));
            }
        }
    }
    if let Some(extra) = b.keys().find(|p| !a.contains_key(*p)) {
        return Err(format!("{} is in the copy only", extra.display()));
    }
    let picked: Vec<&(PathBuf, u64)> = match depth {
        Depth::Full => files.iter().collect(),
        Depth::Sample => {
            let step = files.len().div_ceil(16).max(1);
            files.iter().step_by(step).collect()
        }
    };
    let mut c = Checked {
        entries: a.len() as u64,
        ..Checked::default()
    };
    for (p, size) in picked {
        let (fa, fb) = (src.join(p), copy.join(p));
        let ranges: Vec<(u64, u64)> = if depth == Depth::Full || *size <= 64 << 20 {
            vec![(0, *size)]
        } else {
            let s = 4u64 << 20;
            vec![(0, s), ((size / 2) & !4095, s), (size - s, s)]
        };
        for (off, len) in ranges {
            compare_range(&fa, &fb, off, len)?;
            c.bytes_compared += len;
        }
        c.files_compared += 1;
    }
    Ok(c)
}

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
            return Err(format!(
                "{} differs from the source near byte {at}",
                b.display()
            ));
        }
        if n == 0 {
            return Ok(());
        }
        at += n as u64;
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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
    fn identical_and_followed_links_pass_differences_fail() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        tree(&a);
        tree(&b);
        for depth in [Depth::Full, Depth::Sample] {
            let c = check(&a, &b, depth).unwrap();
            assert_eq!(c.entries, 6);
            assert_eq!(c.files_compared, 2);
        }
        // A followed symlink is fine.
        fs::remove_file(b.join("link")).unwrap();
        fs::write(b.join("link"), b"hello").unwrap();
        assert_eq!(check(&a, &b, Depth::Full).unwrap().files_compared, 3);
        // One changed byte is not.
        let mut bytes = vec![7u8; 100_000];
        bytes[77_777] = 8;
        fs::write(b.join("a/b/f"), &bytes).unwrap();
        let e = check(&a, &b, Depth::Full).unwrap_err();
        assert!(e.contains("a/b/f") && e.contains("differs"), "{e}");
        // Missing and extra entries.
        fs::write(b.join("a/b/f"), vec![7u8; 100_000]).unwrap();
        fs::write(b.join("extra"), b"x").unwrap();
        assert!(
            check(&a, &b, Depth::Sample)
                .unwrap_err()
                .contains("copy only")
        );
        fs::remove_file(b.join("extra")).unwrap();
        fs::remove_file(b.join("g")).unwrap();
        assert!(
            check(&a, &b, Depth::Sample)
                .unwrap_err()
                .contains("missing")
        );
    }
}
