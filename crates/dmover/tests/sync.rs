//! `dmover sync` and the walk's filters, end to end: the real binary against real
//! servers on loopback. A re-run converges on one tree and sends only what changed;
//! `cp --resume` after a finished copy never nests a second copy.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-sync-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `dmover sync ARGS` with a known-hosts file of its own.
fn sync(args: &[&str]) -> Output {
    let kh = tempfile::Builder::new()
        .prefix("dmover-kh-")
        .tempdir()
        .unwrap();
    Command::new(bin())
        .arg("sync")
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env_remove("DMOVER_USER")
        .env("DMOVER_KNOWN_HOSTS", kh.path().join("known_hosts"))
        .output()
        .expect("running dmover sync")
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

#[test]
fn sync_push_twice_is_one_tree_and_resends_only_changes() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let mirror = root.join("mirror");

    let o = sync(&["--json", "--chunk", "1M", s(&src), &srv.url("mirror")]);
    ok(&o);
    same(&src, &mirror);
    let j = json(&o);
    assert_eq!(j["files_unchanged"], 0);
    let total = j["bytes"].as_u64().unwrap();
    assert_eq!(j["bytes_sent"], total);

    // Again: the mirror is DST itself (no DST/tree), nothing is sent.
    let o = sync(&["--json", "--chunk", "1M", s(&src), &srv.url("mirror")]);
    ok(&o);
    same(&src, &mirror);
    assert!(!exists(&mirror.join("tree")), "a second run nested a copy");
    let j = json(&o);
    assert_eq!(j["bytes_sent"], 0, "{j}");
    assert_eq!(j["bytes_unchanged"], total);
    assert_eq!(j["files_unchanged"], 11, "the files with data: {j}");

    // A changed file (content and mtime, same size) and a new one are sent, alone.
    write_file(&src.join("sub/deeper/small"), 99, 333, 0o644, 1_700_000_000);
    write_file(&src.join("new"), 98, 1234, 0o644, 1_700_000_001);
    let o = sync(&["--json", "--chunk", "1M", s(&src), &srv.url("mirror")]);
    ok(&o);
    same(&src, &mirror);
    let j = json(&o);
    assert_eq!(j["bytes_sent"], 333 + 1234, "{j}");
    assert_eq!(j["files_unchanged"], 10, "all but the changed one");
    assert!(staging_files(&root).is_empty());
    assert!(
        std::fs::read_dir(&root).unwrap().count() == 1,
        "only the mirror in the root"
    );
}

#[test]
fn sync_pull_twice_is_one_tree() {
    let t = tmp();
    let root = t.path().join("root");
    make_tree(&root.join("data"));
    let srv = Server::start(&root, &[]);
    let mirror = t.path().join("here/mirror");
    std::fs::create_dir(t.path().join("here")).unwrap();
    for run in 0..2 {
        let o = sync(&["--json", &srv.url("data"), s(&mirror)]);
        ok(&o);
        same(&root.join("data"), &mirror);
        assert!(!exists(&mirror.join("data")), "run {run} nested a copy");
        let j = json(&o);
        if run == 1 {
            assert_eq!(j["bytes_sent"], 0, "{j}");
            assert_eq!(j["bytes_unchanged"], j["bytes"]);
        }
    }
}

#[test]
fn sync_refuses_what_it_cannot_do() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // Two sources: a usage error.
    let o = sync(&[s(&src), s(&src), &srv.url("m")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The server's root as the mirror: a usage error.
    let o = sync(&[s(&src), &srv.url("")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The mirror's parent must exist (else the copy would land in its place).
    let o = sync(&[s(&src), &srv.url("nope/m")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no such directory"), "{}", stderr(&o));
    assert!(!exists(&root.join("nope")));
    // Filters on a pull: not yet (a usage error).
    let o = cp(&["--exclude", "*.o", &srv.url("x"), s(&t.path().join("d"))]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn filters_on_a_push() {
    let t = tmp();
    let src = t.path().join("tree");
    for f in [
        "a.o", "a.c", "keep.o", "d/x.c", "d/x.h", "d/e/y.o", "tmp/t", "e/tmp", "top",
    ] {
        write_file(&src.join(f), 1, 10, 0o644, 1_600_000_000);
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let o = cp(&[
        "--quiet",
        "--include",
        "keep.o",
        "--exclude",
        "*.o",
        "--exclude",
        "tmp/",
        "--exclude",
        "/top",
        s(&src),
        &srv.url(""),
    ]);
    ok(&o);
    let got = root.join("tree");
    for (f, want) in [
        ("a.o", false),
        ("a.c", true),
        ("keep.o", true),
        ("d/x.c", true),
        ("d/x.h", true),
        ("d/e/y.o", false),
        ("d/e", true),
        ("tmp", false),
        ("e/tmp", true),
        ("top", false),
    ] {
        assert_eq!(exists(&got.join(f)), want, "{f}");
    }
    // --files-from with a sync: only the listed paths and their directories.
    let list = t.path().join("list");
    std::fs::write(&list, "d/x.h\n# a comment\ne\n").unwrap();
    let o = sync(&[
        "--quiet",
        "--files-from",
        s(&list),
        s(&src),
        &srv.url("listed"),
    ]);
    ok(&o);
    let got = root.join("listed");
    for (f, want) in [
        ("d/x.h", true),
        ("d/x.c", false),
        ("e/tmp", true),
        ("a.c", false),
    ] {
        assert_eq!(exists(&got.join(f)), want, "{f}");
    }
}

#[test]
fn cp_resume_after_a_finished_copy_never_nests() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // A finished copy: `dst` did not exist, so it is the copy itself.
    ok(&cp(&["--quiet", s(&src), &srv.url("dst")]));
    same(&src, &root.join("dst"));
    // `--resume` continues in `dst` (a finished copy of tree), sending nothing.
    let o = cp(&["--json", "--resume", s(&src), &srv.url("dst")]);
    ok(&o);
    assert!(!exists(&root.join("dst/tree")), "--resume nested a copy");
    same(&src, &root.join("dst"));
    assert_eq!(json(&o)["bytes_sent"], 0);
    // Once `dst` changed since (its mtime no longer the source's), it is ambiguous:
    // refused, with a way out named.
    std::fs::write(root.join("dst/added"), b"x").unwrap();
    let o = cp(&["--quiet", "--resume", s(&src), &srv.url("dst")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("dmover sync"), "{}", stderr(&o));
    assert!(!exists(&root.join("dst/tree")));
}
