//! `dmover sync dmover://A/x dmover://B/y`: a sync between two servers, the data going
//! from one to the other directly, under both ways of dialing (docs/third-party.md,
//! "Sync between servers"). Real servers on loopback, the real binary.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-sync-between-")
        .tempdir()
        .unwrap()
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Two servers allowing third-party copies: A serves `a/`, B `b/`; the sync's source
/// is `a/src`, its mirror `b/m`.
struct Pair {
    _t: tempfile::TempDir,
    a_root: PathBuf,
    b_root: PathBuf,
    src: PathBuf,
    mirror: PathBuf,
    a: Server,
    b: Server,
}

impl Pair {
    fn new() -> Pair {
        let t = tmp();
        let a_root = t.path().join("a");
        let b_root = t.path().join("b");
        std::fs::create_dir(&a_root).unwrap();
        std::fs::create_dir(&b_root).unwrap();
        let a = Server::start(&a_root, &["--third-party"]);
        let b = Server::start(&b_root, &["--third-party"]);
        Pair {
            src: a_root.join("src"),
            mirror: b_root.join("m"),
            a_root,
            b_root,
            a,
            b,
            _t: t,
        }
    }

    /// `dmover sync --json ARGS --tpc MODE A/src B/m`.
    fn sync(&self, mode: &str, args: &[&str]) -> std::process::Output {
        let (from, to) = (self.a.url("src"), self.b.url("m"));
        let mut all = vec!["--json", "--tpc", mode];
        all.extend_from_slice(args);
        all.extend_from_slice(&[&from, &to]);
        sync(&all)
    }
}

/// The names below `dir`, sorted (directories end with `/`).
fn names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel}/"));
                todo.push(e.path());
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_sync_between_servers_sends_only_changes_both_ways_of_dialing() {
    for mode in ["push", "pull"] {
        let p = Pair::new();
        make_tree(&p.src);
        let o = p.sync(mode, &[]);
        ok(&o);
        same(&p.src, &p.mirror);
        let j = json(&o);
        assert_eq!(j["direction"], format!("third-party-{mode}"), "{j}");
        let total = j["bytes"].as_u64().unwrap();
        assert!(total > 10 << 20, "{mode}: {j}");
        assert_eq!(j["bytes_unchanged"], 0, "{mode}: {j}");
        assert_eq!(j["bytes_sent"], total, "{mode}: {j}");

        // Again: the mirror is B/m itself (no m/src), nothing is sent.
        let o = p.sync(mode, &[]);
        ok(&o);
        same(&p.src, &p.mirror);
        assert!(
            !exists(&p.mirror.join("src")),
            "{mode}: a second run nested a copy"
        );
        let j = json(&o);
        assert_eq!(j["bytes_unchanged"], total, "{mode}: {j}");
        assert_eq!(j["bytes_sent"], 0, "{mode}: {j}");
        assert_eq!(j["files_unchanged"], 11, "{mode}: the files with data: {j}");

        // A changed file (content and mtime, same size) and a new one are sent, alone.
        write_file(
            &p.src.join("sub/deeper/small"),
            99,
            333,
            0o644,
            1_700_000_000,
        );
        write_file(&p.src.join("new"), 98, 1234, 0o644, 1_700_000_001);
        let o = p.sync(mode, &[]);
        ok(&o);
        same(&p.src, &p.mirror);
        let j = json(&o);
        assert_eq!(
            j["files_unchanged"], 10,
            "{mode}: all but the changed one: {j}"
        );
        assert_eq!(j["bytes_sent"], 333 + 1234, "{mode}: {j}");
        assert_eq!(
            j["bytes_unchanged"].as_u64().unwrap(),
            total - 333,
            "{mode}: {j}"
        );
        // Nothing but the mirror at B, nothing left behind.
        assert!(staging_files(&p.b_root).is_empty(), "{mode}");
        assert_eq!(std::fs::read_dir(&p.b_root).unwrap().count(), 1, "{mode}");
    }
}

#[test]
fn delete_max_delete_and_filters_between_servers() {
    for mode in ["push", "pull"] {
        let p = Pair::new();
        write_file(&p.src.join("a"), 1, 100, 0o644, 1_600_000_000);
        write_file(&p.src.join("d/b"), 2, 200, 0o644, 1_600_000_000);
        write_file(&p.src.join("d/skip.tmp"), 3, 300, 0o644, 1_600_000_000);
        write_file(&p.src.join("cache/x"), 4, 400, 0o644, 1_600_000_000);
        // Filters: what they exclude is neither sent nor deleted.
        let filters = ["--exclude", "*.tmp", "--exclude", "/cache/"];
        ok(&p.sync(mode, &filters));
        assert_eq!(names(&p.mirror), ["a", "d/", "d/b"], "{mode}");
        write_file(&p.mirror.join("keep.tmp"), 5, 10, 0o644, 1_600_000_000);
        for i in 0..4 {
            write_file(
                &p.mirror.join(format!("extra{i}")),
                6,
                10,
                0o644,
                1_600_000_000,
            );
        }
        // Without --delete nothing goes.
        ok(&p.sync(mode, &filters));
        assert_eq!(names(&p.mirror).len(), 3 + 5, "{mode}");
        // --max-delete stops at its limit, and the sync fails.
        let mut args = filters.to_vec();
        args.extend_from_slice(&["--delete", "--max-delete", "3"]);
        let o = p.sync(mode, &args);
        assert_eq!(o.status.code(), Some(1), "{mode}: {}", stderr(&o));
        let j = json(&o);
        assert_eq!(j["files_deleted"], 3, "{mode}: {j}");
        assert_eq!(j["delete_over_limit"], 1, "{mode}: {j}");
        // Then the rest goes; the excluded file stays.
        let mut args = filters.to_vec();
        args.push("--delete");
        let o = p.sync(mode, &args);
        ok(&o);
        assert_eq!(json(&o)["files_deleted"], 1, "{mode}");
        assert_eq!(names(&p.mirror), ["a", "d/", "d/b", "keep.tmp"], "{mode}");
        // A copy between servers takes filters too.
        let o = cp(&[
            "--tpc",
            mode,
            "--exclude",
            "b",
            &p.a.url("src/d"),
            &p.b.url(""),
        ]);
        ok(&o);
        assert_eq!(names(&p.b_root.join("d")), ["skip.tmp"], "{mode}");
    }
}

#[test]
fn checksum_between_servers_finds_a_same_size_same_mtime_change() {
    for mode in ["push", "pull"] {
        let p = Pair::new();
        write_file(&p.src.join("a"), 1, 100_000, 0o644, 1_600_000_000);
        write_file(&p.src.join("d/b"), 2, 200_000, 0o644, 1_600_000_000);
        ok(&p.sync(mode, &[]));
        // a: other content, same size and mtime (the quick check misses it).
        write_file(&p.src.join("a"), 3, 100_000, 0o644, 1_600_000_000);
        let o = p.sync(mode, &[]);
        ok(&o);
        assert_eq!(json(&o)["files_unchanged"], 2, "{mode}: the quick check");
        assert_ne!(
            std::fs::read(p.src.join("a")).unwrap(),
            std::fs::read(p.mirror.join("a")).unwrap()
        );
        let o = p.sync(mode, &["--checksum"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["bytes_sent"], 100_000, "{mode}: a only: {j}");
        assert_eq!(j["files_unchanged"], 1, "{mode}: b only: {j}");
        assert_eq!(j["bytes_unchanged"], 200_000, "{mode}: {j}");
        same(&p.src, &p.mirror);
        // Again: nothing to send.
        let o = p.sync(mode, &["-c"]);
        ok(&o);
        assert_eq!(json(&o)["files_unchanged"], 2, "{mode}");
    }
}

#[test]
fn a_sync_between_servers_stays_in_its_export() {
    let p = Pair::new();
    write_file(&p.src.join("a"), 1, 100, 0o644, 1_600_000_000);
    // Not yet: a dry run between servers (it says so, and changes nothing).
    let o = p.sync("push", &["--dry-run", "--delete"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not supported yet"), "{}", stderr(&o));
    assert_eq!(names(&p.b_root), Vec::<String>::new());
    drop(p);
    let p = Pair::new();
    write_file(&p.src.join("a"), 1, 100, 0o644, 1_600_000_000);
    // Paths out of either export are refused, and nothing is written.
    for (from, to) in [
        (p.a.url("../b"), p.b.url("m")),
        (p.a.url("src"), p.b.url("../a/m")),
        (p.a.url("src"), p.b.url("")),
    ] {
        for mode in ["push", "pull"] {
            let o = sync(&["--tpc", mode, &from, &to]);
            assert_ne!(o.status.code(), Some(0), "{from} {to} {mode}");
            assert_eq!(names(&p.b_root), Vec::<String>::new(), "{from} {to} {mode}");
            assert_eq!(names(&p.a_root), ["src/", "src/a"], "{from} {to} {mode}");
        }
    }
}
