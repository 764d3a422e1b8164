//! `dmover_store::prune` (`sync --delete`) on real trees: what it deletes, what it keeps
//! (excluded entries, also inside a directory it deletes; anything a link points at),
//! `max_delete`, dry runs; and, when rsync is installed, the same deletion list as
//! `rsync -r -n --delete` for a few rule lists.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use dmover_store::filter::{Action, Filter, Rule};
use dmover_store::paths::{Base, source_root};
use dmover_store::prune::{PruneOptions, Pruned, prune};
use dmover_store::walk::walk_filtered;

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"0123456789").unwrap();
}

fn filter(rules: &[&str]) -> Filter {
    let mut f = Filter::none();
    for r in rules {
        let (a, p) = match r.split_at(1) {
            ("+", p) => (Action::Include, p),
            (_, p) => (Action::Exclude, p),
        };
        f.push(Rule::new(a, p.as_bytes()).unwrap());
    }
    f
}

/// Prunes `dst` against the walk of `src` (both directories of `t`).
fn run(t: &Path, rules: &[&str], opts: PruneOptions) -> Pruned {
    let f = filter(rules);
    let root = source_root(
        &Base::Local,
        t.join("src").to_str().unwrap().as_bytes(),
        b"",
    )
    .unwrap();
    let walked = walk_filtered(vec![root], &f).unwrap();
    let parent = std::fs::File::open(t).unwrap();
    prune(
        &parent,
        b"dst",
        walked.tree.entries(),
        &PruneOptions { filter: f, ..opts },
    )
    .unwrap()
}

fn tree(t: &Path) {
    for f in ["src/a", "src/d/b", "src/x", "src/y/f"] {
        touch(&t.join(f));
    }
    for f in [
        "dst/a",
        "dst/old",
        "dst/olddir/sub/f",
        "dst/olddir2/keep.tmp",
        "dst/olddir2/gone",
        "dst/keep.tmp",
        "dst/d/extra",
        "dst/x/inner",
        "dst/y",
        "outside/secret",
    ] {
        touch(&t.join(f));
    }
    std::os::unix::fs::symlink(t.join("outside"), t.join("dst/link")).unwrap();
    std::os::unix::fs::symlink(t.join("outside"), t.join("dst/olddir/out")).unwrap();
}

fn paths(p: &Pruned) -> BTreeSet<String> {
    p.paths
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[test]
fn deletes_extras_keeps_excluded_and_what_links_point_at() {
    let t = tempfile::tempdir().unwrap();
    tree(t.path());
    // Dry run first: nothing changes.
    let dry = run(
        t.path(),
        &["-*.tmp"],
        PruneOptions {
            dry_run: true,
            ..Default::default()
        },
    );
    assert!(t.path().join("dst/old").exists());
    let p = run(t.path(), &["-*.tmp"], PruneOptions::default());
    assert_eq!(paths(&dry), paths(&p));
    let want: BTreeSet<String> = [
        "old",
        "olddir/sub/f",
        "olddir/sub/",
        "olddir/out",
        "olddir/",
        "olddir2/gone",
        "d/extra",
        "link",
        "x/inner",
        "x/",
        "y",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(paths(&p), want);
    assert_eq!(p.deleted, 11);
    assert_eq!(p.deleted_bytes, 60, "six files of 10 bytes; links count 0");
    assert_eq!(p.protected, 3, "keep.tmp, olddir2/keep.tmp, olddir2");
    assert!(t.path().join("outside/secret").exists());
    assert!(t.path().join("dst/olddir2/keep.tmp").exists());
    assert!(t.path().join("dst/keep.tmp").exists());
    // Conflicts only: nothing left of that kind.
    let p = run(
        t.path(),
        &["-*.tmp"],
        PruneOptions {
            conflicts_only: true,
            ..Default::default()
        },
    );
    assert_eq!(p.deleted, 0);
}

#[test]
fn conflicts_only_and_max_delete() {
    let t = tempfile::tempdir().unwrap();
    tree(t.path());
    let p = run(
        t.path(),
        &[],
        PruneOptions {
            conflicts_only: true,
            ..Default::default()
        },
    );
    assert_eq!(
        paths(&p),
        ["x/inner", "x/", "y"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(t.path().join("dst/old").exists());
    let p = run(
        t.path(),
        &[],
        PruneOptions {
            max_delete: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(p.deleted, 2);
    assert!(p.over_limit > 0);
}

/// The files a prune finds unchanged: with the quick check (size and mtime) only in a
/// dry run; with `--size-only` and `--ignore-existing`'s (QuickCheck::Size, Exists) in
/// every run, an empty file too for the latter.
#[test]
fn unchanged_files_by_each_quick_check() {
    use dmover_store::prune::QuickCheck;
    use std::time::{Duration, SystemTime};
    let t = tempfile::tempdir().unwrap();
    let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let file = |rel: &str, bytes: &[u8], secs| {
        let p = t.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(at(secs))
            .unwrap();
    };
    // same: size and mtime; newer: same size, other mtime; longer: another size;
    // empty: an empty source file where the mirror has one with data; new: not there.
    for (name, src, dst) in [
        ("same", (&b"0123"[..], 1), Some((&b"abcd"[..], 1))),
        ("newer", (b"0123", 1), Some((b"abcd", 2))),
        ("longer", (b"0123", 1), Some((b"abcdef", 1))),
        ("empty", (b"", 1), Some((b"data", 1))),
        ("new", (b"0123", 1), None),
    ] {
        file(&format!("src/{name}"), src.0, src.1);
        if let Some((bytes, secs)) = dst {
            file(&format!("dst/{name}"), bytes, secs);
        }
    }
    let root = source_root(
        &Base::Local,
        t.path().join("src").to_str().unwrap().as_bytes(),
        b"",
    )
    .unwrap();
    let walked = walk_filtered(vec![root], &Filter::none()).unwrap();
    let entries = walked.tree.entries();
    let names = |p: &Pruned| -> BTreeSet<String> {
        p.unchanged
            .iter()
            .map(|&i| String::from_utf8_lossy(&entries[i as usize].name).into_owned())
            .collect()
    };
    let parent = std::fs::File::open(t.path()).unwrap();
    let unchanged = |quick, dry_run| {
        let opts = PruneOptions {
            quick,
            dry_run,
            conflicts_only: true,
            ..Default::default()
        };
        names(&prune(&parent, b"dst", entries, &opts).unwrap())
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(unchanged(QuickCheck::SizeAndMtime, true), set(&["same"]));
    assert_eq!(unchanged(QuickCheck::SizeAndMtime, false), set(&[]));
    for dry_run in [true, false] {
        assert_eq!(
            unchanged(QuickCheck::Size, dry_run),
            set(&["same", "newer"])
        );
        assert_eq!(
            unchanged(QuickCheck::Exists, dry_run),
            set(&["same", "newer", "longer", "empty"])
        );
    }
    // Nothing was changed.
    assert_eq!(std::fs::read(t.path().join("dst/empty")).unwrap(), b"data");
}

#[test]
fn same_deletions_as_rsync() {
    if Command::new("rsync").arg("--version").output().is_err() {
        eprintln!("rsync not installed: skipped");
        return;
    }
    for rules in [
        &[][..],
        &["-*.tmp"],
        &["-olddir/"],
        &["-/old", "-sub/"],
        &["+*.tmp", "-o*"],
    ] {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let mut cmd = Command::new("rsync");
        cmd.args(["-r", "-n", "--delete", "--out-format=%i %n"]);
        for r in rules {
            let (a, p) = r.split_at(1);
            cmd.arg(if a == "+" { "--include" } else { "--exclude" })
                .arg(p);
        }
        let out = cmd
            .arg(format!("{}/src/", t.path().display()))
            .arg(format!("{}/dst/", t.path().display()))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let rsync: BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("*deleting   "))
            .map(str::to_string)
            .collect();
        let ours = run(t.path(), rules, PruneOptions::default());
        // rsync replaces kind conflicts during the transfer ("x", "y" are not listed
        // as deletions by name in a dry run); compare the rest.
        let ours: BTreeSet<String> = paths(&ours)
            .into_iter()
            .filter(|p| !matches!(p.as_str(), "x/" | "x/inner" | "y"))
            .collect();
        let rsync: BTreeSet<String> = rsync
            .into_iter()
            .filter(|p| !matches!(p.as_str(), "x/" | "x/inner" | "y"))
            .collect();
        assert_eq!(ours, rsync, "rules {rules:?}");
    }
}

/// `content_digest` is the transfer's file digest over 4 MiB pieces from offset 0,
/// whatever the file's size (its buffer is sized to the file): checked against the
/// pieces hashed here, for sizes around the piece size.
#[test]
fn content_digest_is_the_digest_of_4_mib_pieces() {
    use dmover_proto::digest::{file_digest, piece_hash};
    use dmover_store::prune::{CONTENT_PIECE, content_digest};
    let t = tempfile::tempdir().unwrap();
    let p = CONTENT_PIECE;
    for size in [0, 1, 8192, p - 1, p, p + 1, 2 * p + 7] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
        let f = t.path().join(format!("f{size}"));
        std::fs::write(&f, &data).unwrap();
        let want = file_digest(&data.chunks(p).map(piece_hash).collect::<Vec<_>>());
        let got = content_digest(std::fs::File::open(&f).unwrap()).unwrap();
        assert_eq!(got, want, "size {size}");
    }
}

/// A chain of `depth` directories named `d` in `dir`, a file at its bottom; made
/// level by level through handles (the whole path is far longer than `PATH_MAX`).
fn chain(dir: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags, mkdirat, openat};
    let mut fd = openat(
        rustix::fs::CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    for _ in 0..depth {
        mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).unwrap();
        fd = openat(&fd, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let f = openat(
        &fd,
        "f",
        OFlags::WRONLY | OFlags::CREATE,
        Mode::from_raw_mode(0o644),
    );
    drop(f.unwrap());
}

/// An extraneous directory chain 2000 levels deep in a mirror (planted by a
/// local user, say) is deleted without recursion: on a thread with a 256 KiB stack,
/// where a call per level overflowed and aborted the process. One deeper than
/// `MAX_PRUNE_DEPTH` is refused with an error naming it, and nothing crashes.
#[test]
fn a_deep_extraneous_chain_costs_no_stack() {
    dmover_store::sys::raise_fd_limit();
    let t = tempfile::tempdir().unwrap();
    touch(&t.path().join("src/a"));
    touch(&t.path().join("dst/a"));
    std::fs::create_dir(t.path().join("dst/old")).unwrap();
    chain(&t.path().join("dst/old"), 2000);
    let path = t.path().to_path_buf();
    let pruned = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || run(&path, &[], PruneOptions::default()))
        .unwrap()
        .join()
        .expect("no stack overflow");
    // The chain's 2000 directories, its file and `old` itself.
    assert_eq!(pruned.deleted, 2002, "{pruned:?}");
    assert!(!t.path().join("dst/old").exists());
    assert!(t.path().join("dst/a").exists());

    std::fs::create_dir(t.path().join("dst/deep")).unwrap();
    chain(
        &t.path().join("dst/deep"),
        dmover_store::prune::MAX_PRUNE_DEPTH + 5,
    );
    let f = filter(&[]);
    let root = source_root(
        &Base::Local,
        t.path().join("src").to_str().unwrap().as_bytes(),
        b"",
    )
    .unwrap();
    let walked = walk_filtered(vec![root], &f).unwrap();
    let parent = std::fs::File::open(t.path()).unwrap();
    let e = prune(
        &parent,
        b"dst",
        walked.tree.entries(),
        &PruneOptions::default(),
    )
    .expect_err("too deep");
    assert!(
        e.to_string().contains("directories deep; not deleted"),
        "{e}"
    );
}
