//! `dmover sync` and the walk's filters, end to end: the real binary against real
//! servers on loopback. A re-run converges on one tree and sends only what changed;
//! `cp --resume` after a finished copy never nests a second copy.

mod common;

use std::os::unix::fs::MetadataExt;
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
    // A mode changed at the source (its mtime does not change): nothing is sent, the
    // mirror's file takes the mode, as with `rsync -a`.
    use std::os::unix::fs::PermissionsExt;
    let f = src.join("sub/deeper/small");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = sync(&["--json", "--chunk", "1M", s(&src), &srv.url("mirror")]);
    ok(&o);
    same(&src, &mirror);
    assert_eq!(json(&o)["bytes_sent"], 0);
    let m = std::fs::metadata(mirror.join("sub/deeper/small")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
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
    // A mode changed at the source: nothing is sent, the mode follows.
    use std::os::unix::fs::PermissionsExt;
    let f = root.join("data/sub/deeper/small");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let o = sync(&["--json", &srv.url("data"), s(&mirror)]);
    ok(&o);
    same(&root.join("data"), &mirror);
    assert_eq!(json(&o)["bytes_sent"], 0);
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
    // A sync between two servers relayed through the client: not yet (a usage error).
    let o = sync(&["--via-client", &srv.url("x"), &srv.url("y")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--via-client"), "{}", stderr(&o));
}

/// The same tree at `dir`.
fn listed_tree(dir: &Path) {
    for (i, f) in [
        "a.c",
        "a.o",
        "d/x.c",
        "d/x.h",
        "d/e/y.o",
        "d/e/z.c",
        "d/e/g/w",
        "e/tmp",
        "f/g/h",
        "f/g/i",
        "top",
        "unlisted/u",
    ]
    .iter()
    .enumerate()
    {
        write_file(&dir.join(f), i as u64, 10 + i, 0o644, 1_600_000_000);
    }
}

#[test]
fn files_from_on_a_pull_sends_what_a_push_sends() {
    let t = tmp();
    let local = t.path().join("tree");
    listed_tree(&local);
    let root = t.path().join("root");
    listed_tree(&root.join("src"));
    let srv = Server::start(&root, &[]);
    // A listed directory (all below it), a nested file (its directories only), the
    // source root's own names, a name that does not exist; comments and blank lines.
    // The padding comment makes the request larger than a frame before authentication
    // (64 KiB): the server reads `Open` under the authenticated limit.
    let mut list = format!(
        "# {}
",
        "p".repeat(100 << 10)
    );
    list.push_str(
        "d/e

./a.c
/f/g/h
missing
; another comment
a.o
",
    );
    let list_file = t.path().join("list");
    std::fs::write(&list_file, &list).unwrap();
    let l = s(&list_file);
    let here = t.path().join("here");
    std::fs::create_dir(&here).unwrap();
    for (cmd, extra) in [
        ("cp", None),
        ("sync", None),
        ("cp", Some("*.o")),
        ("sync", Some("*.o")),
    ] {
        let name = format!("{cmd}-{}", extra.is_some());
        let mut opts = vec!["--quiet", "--files-from", l];
        if let Some(x) = extra {
            opts.extend(["--exclude", x]);
        }
        let run = |a: &str, b: &str| {
            let mut args = opts.clone();
            args.extend([a, b]);
            if cmd == "cp" { cp(&args) } else { sync(&args) }
        };
        ok(&run(s(&local), &srv.url(&format!("pushed-{name}"))));
        let pulled = here.join(format!("pulled-{name}"));
        ok(&run(&srv.url("src"), s(&pulled)));
        let (pushed, pulled) = (
            listing(&root.join(format!("pushed-{name}"))),
            listing(&pulled),
        );
        assert_eq!(pushed, pulled, "{name}: a pull sends what a push sends");
        let want = [
            "a.c", "d/", "d/e/", "d/e/g/", "d/e/g/w", "d/e/z.c", "f/", "f/g/", "f/g/h",
        ];
        let mut want: Vec<&str> = want.to_vec();
        if extra.is_none() {
            want.extend(["a.o", "d/e/y.o"]);
            want.sort();
        }
        assert_eq!(names(&pulled), want, "{name}");
    }
    // A sync again with the list sends nothing.
    let o = sync(&[
        "--json",
        "--files-from",
        l,
        &srv.url("src"),
        s(&here.join("pulled-sync-false")),
    ]);
    ok(&o);
    assert_eq!(json(&o)["bytes_sent"], 0, "{}", stderr(&o));

    // A list leaving the source: a usage error before anything is written.
    let bad = t.path().join("bad");
    std::fs::write(
        &bad,
        "a.c
d/../../etc
",
    )
    .unwrap();
    for o in [
        cp(&[
            "--files-from",
            s(&bad),
            &srv.url("src"),
            s(&here.join("bad-cp")),
        ]),
        sync(&[
            "--files-from",
            s(&bad),
            &srv.url("src"),
            s(&here.join("bad-sync")),
        ]),
    ] {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(".."), "{}", stderr(&o));
    }
    assert!(!exists(&here.join("bad-cp")) && !exists(&here.join("bad-sync")));

    // A list too large for the request: refused before connecting, nothing written.
    let big = t.path().join("big");
    // (Many lines: one line is at most a path's 4096 bytes.)
    let lines: String = (0..700_000).map(|i| format!("b{i}\n")).collect();
    assert!(lines.len() > 4 << 20);
    std::fs::write(&big, lines).unwrap();
    let o = cp(&[
        "--files-from",
        s(&big),
        &srv.url("src"),
        s(&here.join("big")),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("too large for a pull"),
        "{}",
        stderr(&o)
    );
    assert!(!exists(&here.join("big")));
}

#[test]
fn filters_on_a_pull_are_applied_by_the_server() {
    let t = tmp();
    let root = t.path().join("root");
    for f in [
        "a.o", "a.c", "keep.o", "d/x.c", "d/e/y.o", "tmp/t", "e/tmp", "top",
    ] {
        write_file(&root.join("src").join(f), 1, 10, 0o644, 1_600_000_000);
    }
    let srv = Server::start(&root, &[]);
    let got = t.path().join("got");
    let o = cp(&[
        "--json",
        "--include",
        "keep.o",
        "--exclude",
        "*.o",
        "--exclude",
        "tmp/",
        "--exclude",
        "/top",
        &srv.url("src"),
        s(&got),
    ]);
    ok(&o);
    for (f, want) in [
        ("a.o", false),
        ("a.c", true),
        ("keep.o", true),
        ("d/x.c", true),
        ("d/e/y.o", false),
        ("d/e", true),
        ("tmp", false),
        ("e/tmp", true),
        ("top", false),
    ] {
        assert_eq!(exists(&got.join(f)), want, "{f}");
    }
    assert_eq!(
        json(&o)["files"],
        4,
        "only what the filters let through was listed"
    );
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

/// A sync's two ends: the source tree and the mirror, pushed (`push`: local source,
/// mirror on the server) or pulled (source on the server, local mirror).
struct Ends {
    t: tempfile::TempDir,
    src: std::path::PathBuf,
    mirror: std::path::PathBuf,
    srv: Server,
    push: bool,
}

impl Ends {
    fn new(push: bool, server_args: &[&str]) -> Ends {
        let t = tmp();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(t.path().join("here")).unwrap();
        let (src, mirror) = if push {
            (t.path().join("src"), root.join("mirror"))
        } else {
            (root.join("src"), t.path().join("here/mirror"))
        };
        std::fs::create_dir(&src).unwrap();
        let srv = Server::start(&root, server_args);
        Ends {
            t,
            src,
            mirror,
            srv,
            push,
        }
    }

    /// `dmover sync OPTS SRC DST`.
    fn sync(&self, opts: &[&str]) -> Output {
        let (a, b) = if self.push {
            (s(&self.src).to_string(), self.srv.url("mirror"))
        } else {
            (self.srv.url("src"), s(&self.mirror).to_string())
        };
        let mut args: Vec<&str> = opts.to_vec();
        args.push(&a);
        args.push(&b);
        sync(&args)
    }

    fn what(&self) -> &'static str {
        if self.push { "push" } else { "pull" }
    }
}

/// Every path below `dir` (symlinks not followed), relative, sorted; with each
/// regular file's contents.
fn listing(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
            if m.is_dir() {
                stack.push(p.clone());
                out.push((rel + "/", None));
            } else if m.is_file() {
                out.push((rel, Some(std::fs::read(&p).unwrap())));
            } else {
                out.push((
                    rel + "@",
                    std::fs::read_link(&p)
                        .ok()
                        .map(|l| l.into_os_string().into_encoded_bytes()),
                ));
            }
        }
    }
    out.sort();
    out
}

fn names(l: &[(String, Option<Vec<u8>>)]) -> Vec<&str> {
    l.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn delete_removes_extras_keeps_excluded_and_never_follows_links() {
    for push in [true, false] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        for f in ["a", "d/b", "d/c", "x", "y/f", "z.tmp"] {
            write_file(&e.src.join(f), 1, 100, 0o644, 1_600_000_000);
        }
        ok(&e.sync(&["--quiet"]));
        // Outside the mirror: must survive whatever links point at it.
        let outside = e.t.path().join("outside");
        write_file(&outside.join("secret"), 2, 50, 0o644, 1_600_000_000);
        let m = &e.mirror;
        // Extras: files, a tree, excluded names, links pointing out.
        write_file(&m.join("old"), 3, 10, 0o644, 1_600_000_000);
        write_file(&m.join("olddir/sub/f"), 3, 20, 0o644, 1_600_000_000);
        write_file(&m.join("d/extra"), 3, 30, 0o644, 1_600_000_000);
        write_file(&m.join("keep.tmp"), 3, 40, 0o644, 1_600_000_000);
        write_file(&m.join("olddir2/keep.tmp"), 3, 40, 0o644, 1_600_000_000);
        write_file(&m.join("olddir2/gone"), 3, 40, 0o644, 1_600_000_000);
        std::os::unix::fs::symlink(&outside, m.join("link")).unwrap();
        std::os::unix::fs::symlink("../../../outside/secret", m.join("d/link2")).unwrap();
        std::os::unix::fs::symlink(&outside, m.join("olddir/out")).unwrap();
        // Kinds swapped at the source: x a directory, y a file.
        std::fs::remove_file(e.src.join("x")).unwrap();
        write_file(&e.src.join("x/inner"), 4, 60, 0o644, 1_600_000_000);
        std::fs::remove_dir_all(e.src.join("y")).unwrap();
        write_file(&e.src.join("y"), 4, 70, 0o644, 1_600_000_000);
        // z.tmp is excluded now: it is neither sent nor deleted.
        let outside_before = listing(&outside);

        let o = e.sync(&["--json", "--delete", "--exclude", "*.tmp"]);
        ok(&o);
        let j = json(&o);
        // old, olddir/{sub/f, sub, out, }, d/extra, link, d/link2, olddir2/gone,
        // x (a file), y/f and y (a directory).
        assert_eq!(j["files_deleted"], 12, "{w}: {j}");
        assert_eq!(
            j["bytes_deleted"],
            10 + 20 + 30 + 40 + 100 + 100,
            "{w}: {j}"
        );
        assert_eq!(j["delete_over_limit"], 0, "{w}: {j}");
        let got = listing(m);
        assert_eq!(
            names(&got),
            [
                "a",
                "d/",
                "d/b",
                "d/c",
                "keep.tmp",
                "olddir2/",
                "olddir2/keep.tmp",
                "x/",
                "x/inner",
                "y",
                "z.tmp"
            ],
            "{w}"
        );
        assert_eq!(
            std::fs::read(m.join("y")).unwrap(),
            std::fs::read(e.src.join("y")).unwrap()
        );
        assert_eq!(
            listing(&outside),
            outside_before,
            "{w}: followed a link out"
        );
        assert!(staging_files(m).is_empty(), "{w}");

        // Again: nothing left to delete, nothing sent.
        let o = e.sync(&["--json", "--delete", "--exclude", "*.tmp"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["files_deleted"], 0, "{w}: {j}");
        assert_eq!(j["bytes_sent"], 0, "{w}: {j}");
        // Without the filter, the excluded ones go too (z.tmp is sent: the source has it).
        let o = e.sync(&["--json", "--delete"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(
            j["files_deleted"], 3,
            "keep.tmp, olddir2/keep.tmp, olddir2: {w}: {j}"
        );
        same(&e.src, m);
    }
}

#[test]
fn max_delete_stops_and_fails() {
    for push in [true, false] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        write_file(&e.src.join("a"), 1, 100, 0o644, 1_600_000_000);
        ok(&e.sync(&["--quiet"]));
        for i in 0..5 {
            write_file(
                &e.mirror.join(format!("extra{i}")),
                3,
                10,
                0o644,
                1_600_000_000,
            );
        }
        let o = e.sync(&["--json", "--delete", "--max-delete", "2"]);
        assert_eq!(o.status.code(), Some(1), "{w}: {}", stderr(&o));
        assert!(stderr(&o).contains("--max-delete"), "{w}: {}", stderr(&o));
        let j = json(&o);
        assert_eq!(j["ok"], false, "{w}: {j}");
        assert_eq!(j["files_deleted"], 2, "{w}: {j}");
        assert_eq!(j["delete_over_limit"], 3, "{w}: {j}");
        assert_eq!(std::fs::read_dir(&e.mirror).unwrap().count(), 1 + 3, "{w}");
        // Without the limit the rest goes.
        ok(&e.sync(&["--quiet", "--delete"]));
        same(&e.src, &e.mirror);
    }
}

#[test]
fn delete_refused_after_an_incomplete_source_walk_or_on_a_read_only_server() {
    // A FIFO in the source is skipped by the walk: the destination cannot tell it from
    // a deleted entry, so nothing is deleted. On a pull the server reports the count.
    for push in [false, true] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        write_file(&e.src.join("a"), 1, 100, 0o644, 1_600_000_000);
        ok(&e.sync(&["--quiet"]));
        write_file(&e.mirror.join("extra"), 3, 10, 0o644, 1_600_000_000);
        write_file(&e.mirror.join("fifo"), 3, 10, 0o644, 1_600_000_000);
        let fifo = e.src.join("fifo");
        assert!(
            Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let o = e.sync(&["--json", "--delete"]);
        assert_eq!(o.status.code(), Some(1), "{w}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("not deleting anything"),
            "{w}: {}",
            stderr(&o)
        );
        assert!(exists(&e.mirror.join("extra")), "{w}");
        assert!(exists(&e.mirror.join("fifo")), "{w}");
        let j = json(&o);
        assert_eq!(j["files_deleted"], 0, "{w}: {j}");
        assert_eq!(j["skipped"], 1, "{w}: {j}");
        assert_eq!(j["failed"].as_array().unwrap().len(), 0, "{w}: {j}");
        // Excluded, the FIFO no longer matters (and its namesake is protected).
        ok(&e.sync(&["--quiet", "--delete", "--exclude", "fifo"]));
        assert!(!exists(&e.mirror.join("extra")), "{w}");
        assert!(exists(&e.mirror.join("fifo")), "{w}");
    }
    let e = Ends::new(true, &[]);
    write_file(&e.src.join("a"), 1, 100, 0o644, 1_600_000_000);

    // A read-only server refuses, and nothing is deleted.
    let t = tmp();
    let root = t.path().join("root");
    write_file(&root.join("mirror/extra"), 3, 10, 0o644, 1_600_000_000);
    let srv = Server::start(&root, &["--read-only"]);
    let o = sync(&["--delete", s(&e.src), &srv.url("mirror")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    assert!(exists(&root.join("mirror/extra")));
    let o = sync(&["--delete", "--dry-run", s(&e.src), &srv.url("mirror")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));

    // Usage errors.
    for args in [
        &["--max-delete", "3"][..],
        &["--delete", "--files-from", "/dev/null"][..],
    ] {
        let o = e.sync(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    let o = cp(&["--delete", s(&e.src), &e.srv.url("m2")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // --delete with --files-from on a pull too, nothing written.
    let e = Ends::new(false, &[]);
    write_file(&e.src.join("a"), 1, 100, 0o644, 1_600_000_000);
    let o = e.sync(&["--delete", "--files-from", "/dev/null"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!exists(&e.mirror));
}

#[test]
fn dry_run_changes_nothing_and_counts_right() {
    for push in [true, false] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        for f in ["a", "d/b", "d/c"] {
            write_file(&e.src.join(f), 1, 100, 0o644, 1_600_000_000);
        }
        ok(&e.sync(&["--quiet"]));
        // Changes: one file changed, one new; extras in the mirror.
        write_file(&e.src.join("d/b"), 2, 150, 0o644, 1_600_000_001);
        write_file(&e.src.join("new"), 2, 70, 0o644, 1_600_000_001);
        write_file(&e.mirror.join("old"), 3, 10, 0o644, 1_600_000_000);
        write_file(&e.mirror.join("gone/f"), 3, 20, 0o644, 1_600_000_000);
        let parent = e.mirror.parent().unwrap();
        let before = listing(parent);
        let src_before = listing(&e.src);

        let o = e.sync(&["--json", "--dry-run", "--delete"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["type"], "dry_run", "{w}: {j}");
        assert_eq!(j["files_to_send"], 2, "{w}: {j}");
        assert_eq!(j["bytes_to_send"], 150 + 70, "{w}: {j}");
        assert_eq!(j["files_unchanged"], 2, "{w}: {j}");
        assert_eq!(j["bytes_unchanged"], 200, "{w}: {j}");
        assert_eq!(j["files_deleted"], 3, "{w}: old, gone/f, gone: {j}");
        assert_eq!(j["bytes_deleted"], 30, "{w}: {j}");
        let o = e.sync(&["--dry-run", "--delete"]);
        ok(&o);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "delete gone/",
                "delete gone/f",
                "delete old",
                "send d/b",
                "send new"
            ],
            "{w}"
        );
        // Without --delete: no deletions shown.
        let o = e.sync(&["--json", "--dry-run"]);
        ok(&o);
        assert!(
            json(&o).get("files_deleted").is_none_or(|v| v.is_null()),
            "{w}"
        );
        // Nothing changed on either side: no staging files, no journal.
        assert_eq!(listing(parent), before, "{w}");
        assert_eq!(listing(&e.src), src_before, "{w}");
        // The real run does what the dry run said.
        let o = e.sync(&["--json", "--delete"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["bytes_sent"], 150 + 70, "{w}: {j}");
        assert_eq!(j["files_deleted"], 3, "{w}: {j}");
        same(&e.src, &e.mirror);
    }
}

#[test]
fn checksum_compares_content_not_mtime() {
    for push in [true, false] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        write_file(&e.src.join("a"), 1, 100_000, 0o644, 1_600_000_000);
        write_file(&e.src.join("d/b"), 2, 200_000, 0o644, 1_600_000_000);
        ok(&e.sync(&["--quiet"]));
        // a: other content, same size and mtime (the quick check misses it); b: same
        // content, a new mtime (the quick check would resend it).
        write_file(&e.src.join("a"), 3, 100_000, 0o644, 1_600_000_000);
        write_file(&e.src.join("d/b"), 2, 200_000, 0o640, 1_700_000_000);
        write_file(&e.mirror.join("extra"), 4, 10, 0o644, 1_600_000_000);
        // The dry run says so first, and changes nothing.
        let before = listing(&e.mirror);
        let o = e.sync(&["--json", "--checksum", "--delete", "--dry-run"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["files_to_send"], 1, "{w}: {j}");
        assert_eq!(j["bytes_to_send"], 100_000, "{w}: {j}");
        assert_eq!(j["files_unchanged"], 1, "{w}: {j}");
        assert_eq!(j["files_deleted"], 1, "{w}: {j}");
        assert_eq!(listing(&e.mirror), before, "{w}");
        let o = e.sync(&["--json", "--checksum", "--delete"]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["bytes_sent"], 100_000, "{w}: only a: {j}");
        assert_eq!(j["files_unchanged"], 1, "{w}: b: {j}");
        assert_eq!(j["bytes_unchanged"], 200_000, "{w}: {j}");
        assert_eq!(j["files_deleted"], 1, "{w}: extra only, not b: {j}");
        assert_eq!(listing(&e.mirror), listing(&e.src), "{w}");
        assert!(!exists(&e.mirror.join("extra")), "{w}");
        if !push {
            // Kept, with the source's mtime and mode (as rsync -ac does).
            let m = std::fs::metadata(e.mirror.join("d/b")).unwrap();
            assert_eq!(m.mtime(), 1_700_000_000, "{w}");
            assert_eq!(m.mtime_nsec(), 123_456_789, "{w}");
            assert_eq!(m.mode() & 0o7777, 0o640, "{w}");
            // So a plain sync afterwards sends nothing either.
            let o = e.sync(&["--json"]);
            ok(&o);
            assert_eq!(json(&o)["bytes_sent"], 0, "{w}");
        }
        // Again: nothing sent.
        let o = e.sync(&["--json", "-c"]);
        ok(&o);
        assert_eq!(json(&o)["bytes_sent"], 0, "{w}");
        assert_eq!(json(&o)["files_unchanged"], 2, "{w}");
    }
    // A pull from a read-only server: the digests need read rights only.
    let e = Ends::new(false, &["--read-only"]);
    write_file(&e.src.join("a"), 5, 50_000, 0o644, 1_600_000_000);
    write_file(&e.mirror.join("a"), 5, 50_000, 0o644, 1_500_000_000);
    write_file(&e.mirror.join("b"), 6, 60_000, 0o644, 1_500_000_000);
    write_file(&e.src.join("b"), 7, 60_000, 0o644, 1_600_000_000);
    let o = e.sync(&["--json", "-c"]);
    ok(&o);
    let j = json(&o);
    assert_eq!(
        (j["bytes_sent"].clone(), j["files_unchanged"].clone()),
        (60_000.into(), 1.into()),
        "{j}"
    );
    assert_eq!(listing(&e.mirror), listing(&e.src));
    // One file, both ways: its content compared, whatever the mtime.
    for push in [true, false] {
        let e = Ends::new(push, &[]);
        let w = e.what();
        let (from, to) = if push {
            (s(&e.src.join("a")).to_string(), e.srv.url("f"))
        } else {
            (
                e.srv.url("src/a"),
                s(&e.t.path().join("here/f")).to_string(),
            )
        };
        write_file(&e.src.join("a"), 8, 70_000, 0o644, 1_600_000_000);
        ok(&sync(&["--quiet", &from, &to]));
        write_file(&e.src.join("a"), 8, 70_000, 0o644, 1_650_000_000);
        let o = sync(&["--json", "-c", &from, &to]);
        ok(&o);
        assert_eq!(json(&o)["bytes_sent"], 0, "{w}: {}", json(&o));
        write_file(&e.src.join("a"), 9, 70_000, 0o644, 1_650_000_000);
        let o = sync(&["--json", "-c", &from, &to]);
        ok(&o);
        assert_eq!(json(&o)["bytes_sent"], 70_000, "{w}: {}", json(&o));
    }
    // Not on a cp: a usage error.
    let e = Ends::new(true, &[]);
    let o = cp(&["--checksum", s(&e.src), &e.srv.url("x")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
