//! `dmover sum` end to end (docs/checksums.md): the values `md5sum` gives, the cache
//! answering a second request, errors per file, a server's files (computed and cached
//! there, within the export, a symlink not followed), and the cache attribute never
//! travelling with a copy's extended attributes (`--xattrs`, even `--all-xattrs`).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-sums-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sum(args: &[&str]) -> std::process::Output {
    command_of(Path::new(bin()), "sum", args, &[])
}

fn user_xattrs_supported(dir: &Path) -> bool {
    let probe = dir.join(".probe");
    std::fs::write(&probe, b"").unwrap();
    let r = rustix::fs::setxattr(&probe, "user.probe", b"1", rustix::fs::XattrFlags::empty());
    std::fs::remove_file(&probe).unwrap();
    if r.is_err() {
        eprintln!("skipped: no user xattrs in {}", dir.display());
    }
    r.is_ok()
}

fn has_xattr(p: &Path, name: &str) -> bool {
    let mut v = [0u8; 512];
    rustix::fs::getxattr(p, name, &mut v[..]).is_ok()
}

#[test]
fn sums_match_md5sum_and_come_from_the_cache_the_second_time() {
    let t = tmp();
    let a = t.path().join("a");
    write_file(&a, 7, (3 << 20) + 5, 0o644, 1_700_000_000);
    let md5 = Command::new("md5sum").arg(&a).output().unwrap();
    let o = sum(&["--type", "md5", s(&a)]);
    ok(&o);
    assert_eq!(o.stdout, md5.stdout);

    let o = sum(&["--json", "--type", "adler32,crc32c", s(&a)]);
    ok(&o);
    let j = json(&o);
    let f = &j["files"][0];
    assert_eq!(f["size"], (3 << 20) + 5, "{j}");
    assert_eq!(f["checksums"]["adler32"].as_str().unwrap().len(), 8, "{j}");
    assert_eq!(f["checksums"]["crc32c"].as_str().unwrap().len(), 8, "{j}");
    let xattrs = user_xattrs_supported(t.path());
    // md5 was cached by the first run; adler32 and crc32c were not yet.
    assert_eq!(f["cached"], false, "{j}");
    assert_eq!(f["stored"], xattrs, "{j}");
    let again = json(&sum(&["--json", "--type", "crc32c,adler32,md5", s(&a)]));
    assert_eq!(again["files"][0]["cached"], xattrs, "{again}");
    assert_eq!(
        again["files"][0]["checksums"]["adler32"],
        f["checksums"]["adler32"]
    );
    let fresh = json(&sum(&["--json", "--no-cache", s(&a)]));
    assert_eq!(fresh["files"][0]["cached"], false, "{fresh}");
    assert_eq!(
        fresh["files"][0]["checksums"]["adler32"],
        f["checksums"]["adler32"]
    );

    // Several types: TYPE:VALUE in the order asked, each once.
    let o = sum(&["--type", "crc32c", "--type", "adler32,crc32c", s(&a)]);
    let line = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        line,
        format!(
            "crc32c:{}  adler32:{}  {}\n",
            f["checksums"]["crc32c"].as_str().unwrap(),
            f["checksums"]["adler32"].as_str().unwrap(),
            s(&a)
        )
    );

    // A missing file: reported, the others summed, exit 1; a bad type: usage (2).
    let o = sum(&[s(&t.path().join("nope")), s(&a)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nope"), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 1);
    assert_eq!(sum(&["--type", "sha1", s(&a)]).status.code(), Some(2));
    assert_eq!(sum(&[s(t.path())]).status.code(), Some(1));
}

/// The cache is never copied: not locally, not to a server, with `--all-xattrs`
/// on both ends; the file's other attributes are.
#[test]
fn the_cache_does_not_travel() {
    let t = tmp();
    if !user_xattrs_supported(t.path()) {
        return;
    }
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let f = src.join("f");
    write_file(&f, 1, 100_000, 0o644, 1_700_000_000);
    rustix::fs::setxattr(&f, "user.k", b"v", rustix::fs::XattrFlags::empty()).unwrap();
    ok(&sum(&[s(&f)]));
    assert!(has_xattr(&f, "user.dmover.sum"));

    let local = t.path().join("local");
    ok(&cp(&[s(&src), s(&local)]));
    assert!(has_xattr(&local.join("f"), "user.k"));
    assert!(!has_xattr(&local.join("f"), "user.dmover.sum"));

    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--all-xattrs"]);
    ok(&cp(&["--all-xattrs", s(&src), &srv.url("")]));
    assert!(has_xattr(&root.join("src/f"), "user.k"));
    assert!(!has_xattr(&root.join("src/f"), "user.dmover.sum"));
    // And back.
    ok(&sum(&[s(&root.join("src/f"))]));
    let back = t.path().join("back");
    ok(&cp(&["--all-xattrs", &srv.url("src"), s(&back)]));
    assert!(has_xattr(&back.join("f"), "user.k"));
    assert!(!has_xattr(&back.join("f"), "user.dmover.sum"));
}

/// A server's file: computed there, then answered from its cache; a symlink, a directory and a path out of the export refused; a
/// read-only server computes but stores nothing.
#[test]
fn a_servers_files() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("d")).unwrap();
    let f = root.join("f");
    write_file(&f, 3, (2 << 20) + 17, 0o644, 1_700_000_000);
    std::os::unix::fs::symlink("f", root.join("l")).unwrap();
    std::fs::write(t.path().join("outside"), b"secret").unwrap();
    let xattrs = user_xattrs_supported(&root);
    let srv = Server::start(&root, &[]);
    let o = sum(&["--json", "--type", "md5,adler32", &srv.url("f")]);
    ok(&o);
    let j = json(&o);
    let first = &j["files"][0];
    assert_eq!(first["cached"], false, "{j}");
    assert_eq!(first["stored"], xattrs, "{j}");
    assert_eq!(first["size"], (2 << 20) + 17, "{j}");
    let md5 = String::from_utf8(Command::new("md5sum").arg(&f).output().unwrap().stdout).unwrap();
    assert_eq!(
        first["checksums"]["md5"].as_str().unwrap(),
        &md5[..32],
        "{j}"
    );
    let local = json(&sum(&["--json", "--no-cache", "--type", "adler32", s(&f)]));
    assert_eq!(
        first["checksums"]["adler32"],
        local["files"][0]["checksums"]["adler32"]
    );
    assert_eq!(has_xattr(&f, "user.dmover.sum"), xattrs);

    // Again: from the cache (HOST:PATH parses as cp's, on port 7700 or a profile's).
    let o = sum(&["--json", "--type", "adler32", &srv.url("f")]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["files"][0]["cached"], xattrs, "{j}");
    assert_eq!(
        j["files"][0]["checksums"]["adler32"],
        first["checksums"]["adler32"]
    );
    // --no-cache reads it there.
    let j = json(&sum(&["--json", "--no-cache", &srv.url("f")]));
    assert_eq!(j["files"][0]["cached"], false, "{j}");

    for (path, says) in [
        ("l", "not a regular file"),
        ("d", "not a regular file"),
        ("nope", "no such file"),
        ("../outside", "outside"),
    ] {
        let o = sum(&[&srv.url(path), &srv.url("f")]);
        assert_eq!(o.status.code(), Some(1), "{path}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{path}: {}", stderr(&o));
        assert_eq!(
            String::from_utf8(o.stdout).unwrap().lines().count(),
            1,
            "{path}"
        );
    }
    drop(srv);

    // A read-only server stores nothing.
    let g = root.join("g");
    std::fs::write(&g, b"hello").unwrap();
    let ro = Server::start(&root, &["--read-only"]);
    for _ in 0..2 {
        let j = json(&sum(&["--json", &ro.url("g")]));
        let r = &j["files"][0];
        assert_eq!(r["cached"], false, "{j}");
        assert_eq!(r["stored"], false, "{j}");
        assert_eq!(r["checksums"]["adler32"], "062c0215", "{j}");
    }
    assert!(!has_xattr(&g, "user.dmover.sum"));
}
