//! Generates every profile at a small scale into fresh temp dirs and checks what lands on disk.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use dmover_bench::mkdata::{self, Error, Profile, Spec, Stats};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// One entry of a tree on disk, relative to the root.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

fn walk(root: &Path) -> BTreeMap<PathBuf, Node> {
    fn rec(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().to_owned();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(rel, Node::Link(fs::read_link(&path).unwrap()));
            } else if ft.is_dir() {
                out.insert(rel, Node::Dir);
                rec(root, &path, out);
            } else {
                out.insert(rel, Node::File(fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    rec(root, root, &mut out);
    out
}

struct Shape {
    files: Vec<(PathBuf, u64)>,
    dirs: Vec<PathBuf>,
    links: Vec<(PathBuf, PathBuf)>,
}

fn shape(tree: &BTreeMap<PathBuf, Node>) -> Shape {
    let mut s = Shape {
        files: Vec::new(),
        dirs: Vec::new(),
        links: Vec::new(),
    };
    for (p, n) in tree {
        match n {
            Node::Dir => s.dirs.push(p.clone()),
            Node::File(b) => s.files.push((p.clone(), b.len() as u64)),
            Node::Link(t) => s.links.push((p.clone(), t.clone())),
        }
    }
    s
}

fn gen_into(dir: &Path, spec: &Spec) -> (Stats, BTreeMap<PathBuf, Node>) {
    let stats = mkdata::generate(dir, spec, None).unwrap();
    (stats, walk(dir))
}

fn check_stats(stats: &Stats, s: &Shape) {
    assert_eq!(stats.files, s.files.len() as u64);
    assert_eq!(stats.dirs, s.dirs.len() as u64);
    assert_eq!(stats.symlinks, s.links.len() as u64);
    assert_eq!(stats.bytes, s.files.iter().map(|f| f.1).sum::<u64>());
}

/// Every symlink is relative and resolves to a regular file inside `root`.
fn check_links_inside(root: &Path, s: &Shape) {
    let root = root.canonicalize().unwrap();
    for (link, target) in &s.links {
        assert!(target.is_relative(), "{link:?} -> {target:?} is absolute");
        let resolved = root.join(link).canonicalize().unwrap();
        assert!(
            resolved.starts_with(&root),
            "{link:?} -> {resolved:?} leaves the tree"
        );
        assert!(resolved.is_file(), "{link:?} -> {resolved:?} is not a file");
    }
}

fn empty_dirs(root: &Path, s: &Shape) -> usize {
    s.dirs
        .iter()
        .filter(|d| fs::read_dir(root.join(d)).unwrap().next().is_none())
        .count()
}

#[test]
fn tiny_shape() {
    let t = tempfile::tempdir().unwrap();
    let (stats, tree) = gen_into(t.path(), &Spec::new(Profile::Tiny).scale(0.01));
    let s = shape(&tree);
    check_stats(&stats, &s);
    assert_eq!(s.files.len(), 200);
    assert!(s.files.iter().all(|f| f.1 == 8 * KIB));
    let want: Vec<PathBuf> = (0..100)
        .map(|d| PathBuf::from(format!("dir_{d:03}")))
        .collect();
    assert_eq!(s.dirs, want);
    for d in &want {
        assert_eq!(fs::read_dir(t.path().join(d)).unwrap().count(), 2, "{d:?}");
    }
    assert!(s.links.is_empty());
}

#[test]
fn losf_medium_large_shapes() {
    for (profile, scale, n, size) in [
        (Profile::Losf, 0.01, 10, MIB),
        (Profile::Medium, 0.001, 16, 66 * 4096), // 256 MiB × 0.001 rounded to 4 KiB
        (Profile::Large, 1.0 / 2048.0, 2, 2 * MIB),
    ] {
        let t = tempfile::tempdir().unwrap();
        let (stats, tree) = gen_into(t.path(), &Spec::new(profile).scale(scale));
        let s = shape(&tree);
        check_stats(&stats, &s);
        assert_eq!(s.files.len(), n, "{profile}");
        assert!(
            s.files.iter().all(|f| f.1 == size),
            "{profile}: {:?}",
            s.files
        );
        assert!(s.dirs.is_empty() && s.links.is_empty(), "{profile}");
    }
}

#[test]
fn medium_file_bigger_than_a_piece() {
    // 4 GiB / 48 ≈ 85 MiB: more than one 64 MiB piece per file, so threads share files.
    let t = tempfile::tempdir().unwrap();
    let spec = Spec::new(Profile::Large).scale(1.0 / 48.0);
    let a = t.path().join("a");
    let b = t.path().join("b");
    mkdata::generate_with_threads(&a, &spec, 1, None).unwrap();
    mkdata::generate_with_threads(&b, &spec, 4, None).unwrap();
    for i in 0..2 {
        let name = format!("file_{i}.dat");
        let x = fs::read(a.join(&name)).unwrap();
        assert_eq!(x.len() as u64, 21_845 * 4096); // 4 GiB / 48 rounded to 4 KiB
        assert!(
            x == fs::read(b.join(&name)).unwrap(),
            "{name} depends on the thread count"
        );
    }
}

#[test]
fn mixed_shape() {
    let t = tempfile::tempdir().unwrap();
    let (stats, tree) = gen_into(t.path(), &Spec::new(Profile::Mixed).scale(0.05));
    let s = shape(&tree);
    check_stats(&stats, &s);
    assert_eq!(s.files.len(), 400);
    assert!(s.files.iter().any(|f| f.1 == 0), "no empty file");
    assert!(empty_dirs(t.path(), &s) >= 1, "no empty directory");
    assert!(!s.links.is_empty(), "no symlink");
    check_links_inside(t.path(), &s);
    let depth = s.dirs.iter().map(|d| d.components().count()).max().unwrap();
    assert!(depth >= 3, "nesting depth {depth}");
    let mean = stats.bytes as f64 / s.files.len() as f64;
    assert!((70_000.0..=130_000.0).contains(&mean), "mean size {mean}");
    let max = s.files.iter().map(|f| f.1).max().unwrap() as f64;
    assert!(
        max > 5.0 * mean,
        "largest {max} vs mean {mean}: no heavy tail"
    );
}

#[test]
fn demo_shape() {
    let t = tempfile::tempdir().unwrap();
    let (stats, tree) = gen_into(t.path(), &Spec::new(Profile::Demo).scale(0.05));
    let s = shape(&tree);
    check_stats(&stats, &s);
    assert_eq!(s.files.len(), 104);
    assert_eq!(s.links.len(), 2);
    check_links_inside(t.path(), &s);
    assert_eq!(s.files.iter().filter(|f| f.1 == 0).count(), 3);
    assert!(empty_dirs(t.path(), &s) >= 1, "no empty directory");
    let large: Vec<u64> = s
        .files
        .iter()
        .filter(|f| is_large(&f.0))
        .map(|f| f.1)
        .collect();
    assert_eq!(large.len(), 4);
    assert!(
        large.iter().all(|&b| (2 * MIB..=5 * MIB).contains(&b)),
        "{large:?}"
    );
    for (path, size) in s.files.iter().filter(|f| !is_large(&f.0) && f.1 > 0) {
        assert!((KIB..=64 * KIB).contains(size), "{path:?}: {size} bytes");
        assert_ne!(
            path.parent(),
            Some(Path::new("")),
            "{path:?}: small file at the root"
        );
    }
}

fn is_large(p: &Path) -> bool {
    p.to_str().unwrap().starts_with("large_")
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let t = tempfile::tempdir().unwrap();
    let spec = Spec::new(Profile::Mixed).scale(0.02).seed(7);
    let a = walk_generated(&t.path().join("a"), &spec, 1);
    let b = walk_generated(&t.path().join("b"), &spec, 3);
    assert!(a == b, "same seed gave different trees");

    let c = walk_generated(&t.path().join("c"), &spec.clone().seed(8), 2);
    // Same shape (paths, kinds, sizes, link targets)...
    assert_eq!(a.keys().collect::<Vec<_>>(), c.keys().collect::<Vec<_>>());
    // ...but every non-empty file has other content.
    for (p, n) in &a {
        match (n, &c[p]) {
            (Node::File(x), Node::File(y)) => {
                assert_eq!(x.len(), y.len());
                assert!(x.is_empty() || x != y, "{p:?} did not change with the seed");
            }
            (x, y) => assert_eq!(x, y),
        }
    }
    // Different files of one tree differ.
    let mut contents: Vec<&Vec<u8>> = a
        .values()
        .filter_map(|n| if let Node::File(b) = n { Some(b) } else { None })
        .filter(|b| b.len() >= 16)
        .collect();
    let n = contents.len();
    contents.sort_by(|x, y| x[..16].cmp(&y[..16]));
    contents.dedup_by(|x, y| x[..16] == y[..16]);
    assert_eq!(contents.len(), n, "two files start with the same bytes");
}

fn walk_generated(dir: &Path, spec: &Spec, threads: usize) -> BTreeMap<PathBuf, Node> {
    mkdata::generate_with_threads(dir, spec, threads, None).unwrap();
    walk(dir)
}

#[test]
fn refuses_non_empty_target() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("keep.txt"), b"mine").unwrap();
    let err = mkdata::generate(t.path(), &Spec::new(Profile::Losf).scale(0.01), None).unwrap_err();
    assert!(
        matches!(err, Error::NotEmpty(ref p) if p == t.path()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&t.path().display().to_string()),
        "{err}"
    );
    assert_eq!(fs::read_dir(t.path()).unwrap().count(), 1);
    assert_eq!(fs::read(t.path().join("keep.txt")).unwrap(), b"mine");

    // A non-empty directory holding only a subdirectory is refused too.
    let u = tempfile::tempdir().unwrap();
    fs::create_dir(u.path().join("sub")).unwrap();
    assert!(matches!(
        mkdata::generate(u.path(), &Spec::new(Profile::Tiny).scale(0.001), None),
        Err(Error::NotEmpty(_))
    ));

    // A file in the way is not a directory.
    let f = t.path().join("keep.txt");
    assert!(matches!(
        mkdata::generate(&f, &Spec::new(Profile::Tiny).scale(0.001), None),
        Err(Error::NotADirectory(_))
    ));
}

#[test]
fn accepts_existing_empty_or_missing_target() {
    let t = tempfile::tempdir().unwrap();
    let stats = mkdata::generate(t.path(), &Spec::new(Profile::Losf).scale(0.002), None).unwrap();
    assert_eq!(stats.files, 2);
    let nested = t.path().join("x/y/z");
    let stats = mkdata::generate(&nested, &Spec::new(Profile::Losf).scale(0.002), None).unwrap();
    assert_eq!(stats.files, 2);
    assert_eq!(fs::read_dir(&nested).unwrap().count(), 2);
}

#[test]
fn progress_ends_at_total() {
    let t = tempfile::tempdir().unwrap();
    let seen = std::cell::RefCell::new(Vec::new());
    let progress = |b: u64| seen.borrow_mut().push(b);
    let spec = Spec::new(Profile::Losf).scale(0.02);
    let stats = mkdata::generate(t.path(), &spec, Some(&progress)).unwrap();
    let seen = seen.into_inner();
    assert_eq!(seen.last(), Some(&stats.bytes));
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
}

#[test]
fn write_errors_name_the_path() {
    // A read-only root: creating directories below it fails (unless we are root, who may
    // write anyway; then there is nothing to check).
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("ro");
    fs::create_dir(&root).unwrap();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o555)).unwrap();
    if fs::write(root.join("probe"), b"").is_ok() {
        return;
    }
    let err = mkdata::generate(&root, &Spec::new(Profile::Tiny).scale(0.001), None).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("dir_000"), "{err}");
}
