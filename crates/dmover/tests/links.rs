//! Hard links, end to end: the real binary against a real server on loopback. The
//! paths of one inode arrive as one inode (its data sent once), pushed and pulled, and
//! a `dmover sync` re-run keeps the links, sends nothing, and mends a broken one.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-links-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const BIG: usize = (3 << 20) + 5;
const SMALL: usize = 777;

/// `a/data` (3 MiB + 5 bytes) with two more paths, `a/again` and `b/link`; `small` and
/// `b/small` (777 bytes) one more inode; `plain` a file of its own.
fn make_linked_tree(root: &Path) {
    write_file(&root.join("a/data"), 1, BIG, 0o640, 1_700_000_000);
    std::fs::create_dir_all(root.join("b")).unwrap();
    std::fs::hard_link(root.join("a/data"), root.join("a/again")).unwrap();
    std::fs::hard_link(root.join("a/data"), root.join("b/link")).unwrap();
    write_file(&root.join("small"), 2, SMALL, 0o644, 1_700_000_001);
    std::fs::hard_link(root.join("small"), root.join("b/small")).unwrap();
    write_file(&root.join("plain"), 3, 4096, 0o644, 1_700_000_002);
}

fn ino(p: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.ino(), m.nlink())
}

/// The copy's paths of each inode are one inode, as in the source; the plain file is
/// one of its own; the content is the source's.
fn assert_linked(src: &Path, copy: &Path) {
    same(src, copy);
    let (i, n) = ino(&copy.join("a/data"));
    assert_eq!(n, 3, "a/data has 3 links");
    assert_eq!(ino(&copy.join("a/again")), (i, 3));
    assert_eq!(ino(&copy.join("b/link")), (i, 3));
    let (j, n) = ino(&copy.join("small"));
    assert_eq!((n, ino(&copy.join("b/small"))), (2, (j, 2)));
    assert_eq!(ino(&copy.join("plain")).1, 1);
    let m = std::fs::metadata(copy.join("b/link")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(m.mtime(), 1_700_000_000);
}

#[test]
fn hard_links_survive_push_and_pull() {
    let t = tmp();
    let src = t.path().join("tree");
    make_linked_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);

    let o = cp(&["--json", "--chunk", "1M", s(&src), &srv.url("pushed")]);
    ok(&o);
    assert_linked(&src, &root.join("pushed"));
    // Each inode's data crosses once.
    let j = json(&o);
    assert_eq!(j["bytes"], (BIG + SMALL + 4096) as u64, "{j}");
    assert_eq!(j["bytes_sent"], j["bytes"], "{j}");
    assert!(no_partial_files(&src, &root.join("pushed")) > 0);

    let pulled = t.path().join("pulled");
    let o = cp(&["--json", "--chunk", "1M", &srv.url("pushed"), s(&pulled)]);
    ok(&o);
    assert_linked(&src, &pulled);
    assert_eq!(json(&o)["bytes"], (BIG + SMALL + 4096) as u64);
    assert!(staging_files(&pulled).is_empty());
}

#[test]
fn sync_reruns_keep_links_and_mend_broken_ones() {
    let t = tmp();
    let src = t.path().join("tree");
    make_linked_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let mirror = root.join("mirror");

    ok(&sync(&["--json", s(&src), &srv.url("mirror")]));
    assert_linked(&src, &mirror);
    let before = ino(&mirror.join("a/data"));

    // Again: nothing sent, the links untouched.
    let o = sync(&["--json", s(&src), &srv.url("mirror")]);
    ok(&o);
    assert_eq!(json(&o)["bytes_sent"], 0, "{}", json(&o));
    assert_linked(&src, &mirror);
    assert_eq!(ino(&mirror.join("a/data")), before);

    // A link broken at the destination (a plain copy with the same size and mtime in
    // its place) is made a link again, still without sending data.
    std::fs::remove_file(mirror.join("b/link")).unwrap();
    write_file(&mirror.join("b/link"), 1, BIG, 0o640, 1_700_000_000);
    assert_eq!(ino(&mirror.join("a/data")).1, 2);
    let o = sync(&["--json", s(&src), &srv.url("mirror")]);
    ok(&o);
    assert_eq!(json(&o)["bytes_sent"], 0, "{}", json(&o));
    assert_linked(&src, &mirror);

    // Pulled into a local mirror, twice: the second run sends nothing.
    let local = t.path().join("local");
    ok(&sync(&[&srv.url("mirror"), s(&local)]));
    assert_linked(&src, &local);
    let o = sync(&["--json", &srv.url("mirror"), s(&local)]);
    ok(&o);
    assert_eq!(json(&o)["bytes_sent"], 0, "{}", json(&o));
    assert_linked(&src, &local);
    assert!(staging_files(&local).is_empty() && staging_files(&mirror).is_empty());
}

#[test]
fn a_link_whose_first_path_is_excluded_is_sent_as_the_file() {
    let t = tmp();
    let src = t.path().join("tree");
    make_linked_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);

    let o = sync(&["--exclude", "/a/", s(&src), &srv.url("m")]);
    ok(&o);
    let m = root.join("m");
    assert!(!m.join("a").exists());
    assert_eq!(std::fs::read(m.join("b/link")).unwrap(), bytes(1, BIG));
    assert_eq!(ino(&m.join("b/link")).1, 1);
    assert_eq!(ino(&m.join("b/small")), ino(&m.join("small")));
}

#[test]
fn hard_links_survive_server_to_server_copies_and_the_relay() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    make_linked_tree(&a_root.join("tree"));
    std::fs::create_dir(&b_root).unwrap();
    let a = Server::start(&a_root, &["--third-party"]);
    let b = Server::start(&b_root, &["--third-party"]);
    let src = a_root.join("tree");

    // A dials B (a push from A's side), B dials A (a pull by B), through the client.
    ok(&cp(&[&a.url("tree"), &b.url("pushed")]));
    assert_linked(&src, &b_root.join("pushed"));
    ok(&cp(&["--tpc", "pull", &a.url("tree"), &b.url("pulled")]));
    assert_linked(&src, &b_root.join("pulled"));
    ok(&cp(&["--via-client", &a.url("tree"), &b.url("relayed")]));
    assert_linked(&src, &b_root.join("relayed"));
}
