//! A manifest streamed in parts (feature `STREAMED`, docs/protocol.md): the source (the
//! server in a pull, the client in a push) sends a large tree's manifest in parts and
//! the data flow from the first on.
//! The real binary against a real server on loopback: the tree arrives whole, with
//! the metadata of entries in later parts (modes, mtimes, user xattrs, owners as root);
//! the source's walk (a pull's server's, a push's client's) hands out its parts while
//! it runs, hard links and files with holes among them (feature `WALKING`); where the
//! client compares with what it holds (`--resume`), the manifest comes whole.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-streamed-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// 2100 files in 32 directories (the manifest's later parts hold the last
/// directories' files), empty files and symlinks among them, a directory with its
/// own mode and mtime.
fn make(src: &Path) {
    make_small_files(src, 2100, 32);
    for d in [0, 31] {
        std::fs::write(src.join(format!("d{d:03}/empty")), b"").unwrap();
        symlink("f00000", src.join(format!("d{d:03}/link"))).unwrap();
    }
    set_dir_meta(&src.join("d031"), 0o750, 1_600_000_000);
}

fn manifest_parts(o: &std::process::Output) -> Option<u64> {
    json(o).get("manifest_parts").and_then(|v| v.as_u64())
}

#[test]
fn a_large_tree_is_pulled_with_its_manifest_in_parts() {
    let t = tmp();
    let src = t.path().join("srv/d");
    make(&src);
    copy_with_parts(&t, &src, true);
}

#[test]
fn a_large_tree_is_pushed_with_its_manifest_in_parts() {
    let t = tmp();
    let src = t.path().join("d");
    make(&src);
    std::fs::create_dir(t.path().join("srv")).unwrap();
    copy_with_parts(&t, &src, false);
}

/// Copies `src` (in a pull: `srv/d`, served) into `out/d` (in a push: the server's
/// `srv` holds `out`), the manifest in parts, and checks what arrived.
fn copy_with_parts(t: &tempfile::TempDir, src: &Path, pull: bool) {
    // Metadata of an entry of the last part travels with that part.
    let late = src.join("d031/f02079");
    let xattr = rustix::fs::lsetxattr(
        &late,
        "user.dmover-test",
        b"late",
        rustix::fs::XattrFlags::empty(),
    )
    .is_ok();
    let root = rustix::process::geteuid().is_root();
    if root {
        std::os::unix::fs::lchown(&late, Some(1234), Some(2345)).unwrap();
        std::fs::set_permissions(&late, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    // An export that keeps owners (a push's owners land only there).
    let srv = Server::start(&t.path().join("srv"), &["--preserve-owner"]);
    let out = if pull {
        t.path().join("out")
    } else {
        t.path().join("srv/out")
    };
    std::fs::create_dir(&out).unwrap();
    let o = if pull {
        cp(&["--json", &srv.url("d"), s(&out)])
    } else {
        cp(&["--json", s(src), &srv.url("out/")])
    };
    ok(&o);
    let parts = manifest_parts(&o).expect("the manifest went in parts");
    // 1 + 32 + 2100 + 4 entries: 512, 1024, the rest.
    assert_eq!(parts, 3, "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(json(&o)["files"], 2102);
    same(src, &out.join("d"));
    let got = out.join("d/d031/f02079");
    if xattr {
        let mut v = [0u8; 16];
        let n = rustix::fs::lgetxattr(&got, "user.dmover-test", &mut v).unwrap();
        assert_eq!(&v[..n], b"late");
    } else {
        eprintln!("user xattrs unsupported here: not checked");
    }
    if root {
        let m = std::fs::symlink_metadata(&got).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1234, 2345, 0o640));
    }
    let d = std::fs::metadata(out.join("d/d031")).unwrap();
    assert_eq!((d.mode() & 0o7777, d.mtime()), (0o750, 1_600_000_000));
    assert!(staging_files(&out).is_empty());
}

/// A file of `len` bytes with data only in its first and last 4 KiB, and whether the
/// file system gave it holes.
fn sparse_file(path: &Path, len: u64) -> bool {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&[7u8; 4096]).unwrap();
    f.seek(SeekFrom::Start(len - 4096)).unwrap();
    f.write_all(&[9u8; 4096]).unwrap();
    drop(f);
    let m = std::fs::metadata(path).unwrap();
    m.blocks() * 512 < m.len()
}

#[test]
fn a_pull_walks_live_with_hard_links_and_holes_in_later_parts() {
    walk_live_with_links_and_holes(true);
}

#[test]
fn a_push_walks_live_with_hard_links_and_holes_in_later_parts() {
    walk_live_with_links_and_holes(false);
}

/// The source's walk hands the manifest out while it runs (feature WALKING): later
/// parts carry hard links and the list of files with holes. Then `--resume`, which
/// answers what the destination holds for the whole manifest, takes it whole.
fn walk_live_with_links_and_holes(pull: bool) {
    let t = tmp();
    let src = if pull {
        t.path().join("srv/d")
    } else {
        t.path().join("d")
    };
    make(&src);
    // In the last directory: a hard link to a file of the first part, a second path
    // of a file of its own part, and a file with holes.
    std::fs::hard_link(src.join("d000/f00000"), src.join("d031/linked")).unwrap();
    std::fs::hard_link(src.join("d031/f02079"), src.join("d031/again")).unwrap();
    let holes = sparse_file(&src.join("d031/holes"), 8 << 20);
    std::fs::create_dir_all(t.path().join("srv")).unwrap();
    let srv = Server::start(&t.path().join("srv"), &[]);
    let out = if pull {
        t.path().join("out")
    } else {
        t.path().join("srv/out")
    };
    std::fs::create_dir(&out).unwrap();
    let copy = |extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let url = if pull { srv.url("d") } else { srv.url("out/") };
        if pull {
            args.extend_from_slice(&[&url, s(&out)]);
        } else {
            args.extend_from_slice(&[s(&src), &url]);
        }
        let o = cp(&args);
        ok(&o);
        o
    };
    let o = copy(&[]);
    // 512 entries, 1024, the rest; a walk slowed by a busy machine may cut one more
    // (a part goes once 100 ms passed since the one before).
    let parts = manifest_parts(&o).unwrap_or(0);
    assert!(
        (3..=4).contains(&parts),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(
        json(&o)["files"],
        2103,
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    same(&src, &out.join("d"));
    let ino = |p: &str| std::fs::metadata(out.join(p)).unwrap().ino();
    assert_eq!(ino("d/d000/f00000"), ino("d/d031/linked"));
    assert_eq!(ino("d/d031/f02079"), ino("d/d031/again"));
    let h = std::fs::metadata(out.join("d/d031/holes")).unwrap();
    assert_eq!(h.len(), 8 << 20);
    if holes {
        assert!(
            h.blocks() * 512 < 1 << 20,
            "the file's holes were filled: {} blocks",
            h.blocks()
        );
    } else {
        eprintln!("this file system made no holes: sparseness not checked");
    }
    assert!(staging_files(&out).is_empty());

    // Nothing changed: `--resume` takes the manifest whole and sends nothing.
    std::fs::remove_file(src.join("d031/linked")).unwrap();
    std::fs::remove_file(out.join("d/d031/linked")).unwrap();
    let o = copy(&["--resume"]);
    assert_eq!(manifest_parts(&o), None);
    assert_eq!(json(&o)["bytes_sent"], 0);
    same(&src, &out.join("d"));
}

/// Two files of 24 MiB at the top, then (in `e`, walked after them) 2100 empty files
/// and a directory of 400 small files: the walk's first 2048 entries hold only the
/// large files' data (16 MiB chunks for the session), and the small files come in a
/// later part.
fn large_then_small(src: &Path) {
    for i in 0..2 {
        write_file(
            &src.join(format!("big{i}")),
            i,
            24 << 20,
            0o644,
            1_650_000_000,
        );
    }
    std::fs::create_dir_all(src.join("e")).unwrap();
    for i in 0..2100 {
        std::fs::write(src.join(format!("e/z{i:05}")), b"").unwrap();
    }
    for i in 0..400 {
        let len = 8192 + i * 13;
        write_file(
            &src.join(format!("e/small/f{i:03}")),
            10 + i as u64,
            len,
            0o644,
            1_650_000_000,
        );
    }
}

#[test]
fn small_files_after_large_ones_are_pulled_in_chunks_of_their_own() {
    chunks_per_part(true);
}

#[test]
fn small_files_after_large_ones_are_pushed_in_chunks_of_their_own() {
    chunks_per_part(false);
}

/// A later part of small files is cut into 1 MiB chunks in a session of 16 MiB ones
/// (feature PART_CHUNKS); `--chunk` pins one size for every part; a resume, which
/// takes the manifest whole, uses the session's.
fn chunks_per_part(pull: bool) {
    let t = tmp();
    let src = if pull {
        t.path().join("srv/d")
    } else {
        t.path().join("d")
    };
    large_then_small(&src);
    std::fs::create_dir_all(t.path().join("srv")).unwrap();
    let srv = Server::start(&t.path().join("srv"), &[]);
    let copy = |to: &str, extra: &[&str]| {
        let out = if pull {
            t.path().join(to)
        } else {
            t.path().join("srv").join(to)
        };
        std::fs::create_dir_all(&out).unwrap();
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let url = if pull {
            srv.url("d")
        } else {
            srv.url(&format!("{to}/"))
        };
        if pull {
            args.extend_from_slice(&[&url, s(&out)]);
        } else {
            args.extend_from_slice(&[s(&src), &url]);
        }
        let o = cp(&args);
        ok(&o);
        same(&src, &out.join("d"));
        assert!(staging_files(&out).is_empty());
        let j = json(&o);
        let sizes: Vec<(u64, u64)> = j["chunk_sizes"]
            .as_array()
            .unwrap_or_else(|| panic!("{j}"))
            .iter()
            .map(|r| (r["size"].as_u64().unwrap(), r["chunks"].as_u64().unwrap()))
            .collect();
        (j, sizes, out)
    };
    let (j, sizes, out) = copy("out", &[]);
    assert!(j["manifest_parts"].as_u64().unwrap_or(0) >= 3, "{j}");
    assert_eq!(j["chunk"], 16 << 20, "{j}");
    assert_eq!(sizes.first().map(|r| r.0), Some(16 << 20), "{j}");
    // 400 files of 8–13 KiB (4 314 200 bytes) in 1 MiB chunks, not one 16 MiB chunk.
    assert_eq!(sizes.last(), Some(&(1 << 20, 5)), "{j}");
    assert_eq!(sizes.len(), 2, "{j}");

    // Pinned: one size.
    let (j, sizes, _) = copy("pinned", &["--chunk", "16M"]);
    assert_eq!(sizes, vec![(16 << 20, 5)], "{j}");

    // A resume of the first copy, one small file lost: the manifest goes whole, in
    // the session's chunks (chosen for the whole tree).
    std::fs::remove_file(out.join("d/e/small/f399")).unwrap();
    let (j, sizes, _) = copy("out", &["--resume"]);
    assert_eq!(j["bytes_sent"], 8192 + 399 * 13, "{j}");
    assert_eq!(sizes.len(), 1, "{j}");
    assert_eq!(Some(sizes[0].0), j["chunk"].as_u64(), "{j}");
}
