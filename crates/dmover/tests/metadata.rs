//! Preserved metadata end to end (docs/sync.md, "Preserved metadata"): `user.*`
//! extended attributes, POSIX ACLs (their raw xattr values, built here: no setfacl
//! needed) and, as root, numeric owners survive a push and a pull through a real
//! server on loopback; a setuid file pushed to a server that does not keep owners
//! loses the bit; a `trusted.*` attribute does not travel.
//!
//! Where the temporary directory's file system takes no user xattrs the xattr tests
//! print that they skipped, and fail only with `DMOVER_REQUIRE_XATTR=1`.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::*;
use rustix::io::Errno;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-meta-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn set(p: &Path, name: &str, value: &[u8]) -> Result<(), Errno> {
    rustix::fs::lsetxattr(p, name, value, rustix::fs::XattrFlags::empty())
}

/// The xattrs of `p` in the namespaces that travel by default (plus `trusted.*`, to
/// see that it does not), sorted.
fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let mut list = vec![0u8; 64 << 10];
    let n = rustix::fs::llistxattr(p, &mut list[..]).unwrap();
    let mut out = Vec::new();
    for name in list[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8(name.to_vec()).unwrap();
        if !(name.starts_with("user.")
            || name.starts_with("system.posix_acl")
            || name.starts_with("trusted."))
        {
            continue;
        }
        let mut v = vec![0u8; 64 << 10];
        let k = rustix::fs::lgetxattr(p, name.as_str(), &mut v[..]).unwrap();
        v.truncate(k);
        out.push((name, v));
    }
    out.sort();
    out
}

/// Whether user xattrs can be set under `dir`; without them the test skips, unless
/// `DMOVER_REQUIRE_XATTR=1`.
fn xattrs_supported(dir: &Path, test: &str) -> bool {
    let probe = dir.join(".probe");
    std::fs::write(&probe, b"").unwrap();
    let r = set(&probe, "user.probe", b"1");
    std::fs::remove_file(&probe).unwrap();
    match r {
        Ok(()) => true,
        Err(e) if std::env::var_os("DMOVER_REQUIRE_XATTR").is_some_and(|v| v == "1") => {
            panic!("{test}: user xattrs unsupported in {}: {e}", dir.display())
        }
        Err(e) => {
            eprintln!(
                "{test}: skipped: user xattrs unsupported in {}: {e}",
                dir.display()
            );
            false
        }
    }
}

/// A POSIX ACL as Linux's `system.posix_acl_access` value: version 2, then
/// (tag u16, perm u16, id u32) entries, little-endian.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const NONE: u32 = u32::MAX;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The entries of the test tree, relative to its root.
const PATHS: [&str; 6] = ["", "f", "empty", "sub", "sub/g", "link"];

/// `d`: files with data and empty, a subdirectory, a symlink; user xattrs (a text, a
/// binary and an empty value) on files and directories, an access ACL on `f` (user
/// 4321 rw, mask rw: mode 0664), a default ACL on `sub`, and (as root) a `trusted.*`
/// attribute that must not travel.
fn make(d: &Path) {
    std::fs::create_dir(d).unwrap();
    write_file(&d.join("f"), 1, 300_000, 0o644, 1_600_000_000);
    write_file(&d.join("empty"), 2, 0, 0o600, 1_600_000_001);
    std::fs::create_dir(d.join("sub")).unwrap();
    write_file(&d.join("sub/g"), 3, 5000, 0o640, 1_600_000_002);
    symlink("f", d.join("link")).unwrap();
    set(&d.join("f"), "user.text", b"hello").unwrap();
    set(&d.join("f"), "user.bin", &[0, 1, 2, 255, 0]).unwrap();
    set(&d.join("f"), "user.empty", b"").unwrap();
    set(&d.join("empty"), "user.x", b"1").unwrap();
    set(&d.join("sub"), "user.dir", b"yes").unwrap();
    set(d, "user.root", b"r").unwrap();
    let access = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 6, 4321),
        (GROUP_OBJ, 4, NONE),
        (MASK, 6, NONE),
        (OTHER, 4, NONE),
    ]);
    set(&d.join("f"), "system.posix_acl_access", &access).unwrap();
    let default = acl(&[(USER_OBJ, 7, NONE), (GROUP_OBJ, 5, NONE), (OTHER, 5, NONE)]);
    set(&d.join("sub"), "system.posix_acl_default", &default).unwrap();
    if is_root() {
        set(&d.join("f"), "trusted.secret", b"no").unwrap();
    }
    assert_eq!(
        mode(&d.join("f")),
        0o664,
        "the ACL's mask is the group bits"
    );
    set_dir_meta(&d.join("sub"), 0o755, 1_600_000_010);
    set_dir_meta(d, 0o755, 1_600_000_011);
}

/// `b` has `a`'s data and, for every entry, its modes and travelling xattrs; never a
/// `trusted.*` one.
fn same_meta(a: &Path, b: &Path) {
    same(a, b);
    for p in PATHS {
        let (x, y) = (a.join(p), b.join(p));
        let want: Vec<_> = xattrs(&x)
            .into_iter()
            .filter(|(n, _)| !n.starts_with("trusted."))
            .collect();
        assert_eq!(xattrs(&y), want, "xattrs of {p:?}");
        if !p.is_empty() && p != "link" {
            assert_eq!(mode(&y), mode(&x), "mode of {p:?}");
        }
    }
    assert!(
        xattrs(&b.join("f"))
            .iter()
            .any(|(n, _)| n == "system.posix_acl_access"),
        "the ACL arrived"
    );
}

#[test]
fn xattrs_and_acls_survive_push_and_pull() {
    let t = tmp();
    if !xattrs_supported(t.path(), "xattrs_and_acls_survive_push_and_pull") {
        return;
    }
    let src = t.path().join("d");
    make(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);

    ok(&cp(&[
        "-a",
        "-X",
        "-A",
        "--chunk",
        "64K",
        s(&src),
        &srv.url(""),
    ]));
    same_meta(&src, &root.join("d"));

    let back = t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    ok(&cp(&["--chunk", "64K", &srv.url("d"), s(&back)]));
    same_meta(&src, &back.join("d"));

    // --no-xattrs / --no-acls: nothing of either travels (push); the data does.
    let o = t.path().join("root/plain");
    std::fs::create_dir(&o).unwrap();
    ok(&cp(&[
        "--no-xattrs",
        "--no-acls",
        s(&src),
        &srv.url("plain"),
    ]));
    same(&src, &o.join("d"));
    for p in PATHS {
        assert_eq!(xattrs(&o.join("d").join(p)), vec![], "{p:?}");
    }
    // The same on a pull: the puller sets none of what the server sends.
    let o = t.path().join("plain-pull");
    std::fs::create_dir(&o).unwrap();
    ok(&cp(&["--no-xattrs", "--no-acls", &srv.url("d"), s(&o)]));
    same(&src, &o.join("d"));
    for p in PATHS {
        assert_eq!(xattrs(&o.join("d").join(p)), vec![], "{p:?}");
    }
}

#[test]
fn owners_survive_push_and_pull_as_root() {
    if !is_root() {
        eprintln!("owners_survive_push_and_pull_as_root: skipped: not root");
        return;
    }
    let t = tmp();
    let src = t.path().join("d");
    std::fs::create_dir(&src).unwrap();
    write_file(&src.join("f"), 1, 10_000, 0o644, 1_600_000_000);
    write_file(&src.join("suid"), 2, 1000, 0o4755, 1_600_000_000);
    write_file(&src.join("sgid"), 3, 0, 0o2755, 1_600_000_000);
    std::fs::create_dir(src.join("sub")).unwrap();
    symlink("f", src.join("link")).unwrap();
    let own = |p: &str, uid: u32, gid: u32| {
        rustix::fs::chownat(
            rustix::fs::CWD,
            src.join(p).as_path(),
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap()
    };
    own("f", 1234, 2345);
    own("suid", 1234, 2345);
    own("sgid", 1234, 2345);
    own("sub", 1235, 2346);
    own("link", 1236, 2347);
    own("", 1237, 2348);
    // chown cleared the bits.
    std::fs::set_permissions(src.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(src.join("sgid"), std::fs::Permissions::from_mode(0o2755)).unwrap();
    let owners = |d: &Path| -> Vec<(u32, u32, u32)> {
        ["", "f", "suid", "sgid", "sub", "link"]
            .iter()
            .map(|p| {
                let m = std::fs::symlink_metadata(d.join(p)).unwrap();
                (m.uid(), m.gid(), m.mode() & 0o7777)
            })
            .collect()
    };

    // A server whose export keeps owners: all of them, bits included.
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--preserve-owner"]);
    ok(&cp(&[s(&src), &srv.url("")]));
    assert_eq!(owners(&root.join("d")), owners(&src));

    // A pull into this (root) process: the same.
    let back = t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    ok(&cp(&[&srv.url("d"), s(&back)]));
    assert_eq!(owners(&back.join("d")), owners(&src));
    // --no-owner: the puller's own (root), and no setuid/setgid bits.
    let mine = t.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    ok(&cp(&["--no-owner", &srv.url("d"), s(&mine)]));
    let m = std::fs::metadata(mine.join("d/suid")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755));

    // A server that does not keep owners: files are its own, never setuid/setgid.
    let plain = t.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let srv2 = Server::start(&plain, &[]);
    ok(&cp(&[s(&src), &srv2.url("")]));
    for (p, mode) in [("suid", 0o755), ("sgid", 0o755), ("f", 0o644)] {
        let m = std::fs::metadata(plain.join("d").join(p)).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, mode), "{p}");
    }
}

/// A copy between two servers runs the same push and pull: xattrs and ACLs travel
/// both ways of dialing, and owners where B keeps them (as root, with
/// `--preserve-owner`) and nowhere else.
#[test]
fn a_third_party_copy_keeps_metadata_both_ways_of_dialing() {
    let t = tmp();
    if !xattrs_supported(
        t.path(),
        "a_third_party_copy_keeps_metadata_both_ways_of_dialing",
    ) {
        return;
    }
    let (a_root, b_root, c_root) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    for r in [&a_root, &b_root, &c_root] {
        std::fs::create_dir(r).unwrap();
    }
    let src = a_root.join("d");
    make(&src);
    let root = is_root();
    if root {
        std::os::unix::fs::lchown(src.join("f"), Some(1234), Some(2345)).unwrap();
        // chown cleared nothing here (0664), but keep the ACL's mode honest.
        assert_eq!(mode(&src.join("f")), 0o664);
    }
    let a = Server::start(&a_root, &["--third-party"]);
    let b = Server::start(&b_root, &["--third-party", "--preserve-owner"]);
    let c = Server::start(&c_root, &["--third-party"]);
    let owner = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.uid(), m.gid())
    };

    // Push: A dials B.
    ok(&cp(&[&a.url("d"), &b.url("")]));
    same_meta(&src, &b_root.join("d"));
    // Pull: B dials A.
    ok(&cp(&["--tpc", "pull", &a.url("d"), &b.url("pulled")]));
    same_meta(&src, &b_root.join("pulled"));
    // Pull into C, which does not keep owners.
    ok(&cp(&["--tpc", "pull", &a.url("d"), &c.url("pulled")]));
    same_meta(&src, &c_root.join("pulled"));
    if root {
        assert_eq!(owner(&b_root.join("d/f")), (1234, 2345));
        assert_eq!(owner(&b_root.join("pulled/f")), (1234, 2345));
        assert_eq!(owner(&c_root.join("pulled/f")), (0, 0));
    }
}

/// Namespaces beyond `user.*` and ACLs (`trusted.*` here, which only root may read
/// and set) travel only when both ends ask: the client with `--all-xattrs` and the
/// export with `xattrs = "all"` (`serve --all-xattrs`); either alone carries `user.*`
/// and ACLs only. Push and pull.
#[test]
fn other_namespaces_travel_only_where_the_export_allows() {
    let test = "other_namespaces_travel_only_where_the_export_allows";
    if !is_root() {
        eprintln!("{test}: skipped: trusted.* attributes need root");
        return;
    }
    let t = tmp();
    if !xattrs_supported(t.path(), test) {
        return;
    }
    let src = t.path().join("d");
    make(&src);
    let trusted = |p: &Path| {
        let x = xattrs(p);
        assert!(
            x.iter().any(|(n, v)| n == "user.text" && v == b"hello"),
            "{}: user.* always travels: {x:?}",
            p.display()
        );
        x.iter().any(|(n, v)| n == "trusted.secret" && v == b"no")
    };
    assert!(trusted(&src.join("f")));
    let (plain, all) = (t.path().join("plain"), t.path().join("all"));
    for d in [&plain, &all] {
        std::fs::create_dir(d).unwrap();
        for sub in ["flag", "noflag"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
    }
    let plain_srv = Server::start(&plain, &[]);
    let all_srv = Server::start(&all, &["--all-xattrs"]);
    // Pushes.
    ok(&cp(&["--all-xattrs", s(&src), &plain_srv.url("flag")]));
    ok(&cp(&[s(&src), &all_srv.url("noflag")]));
    ok(&cp(&["--all-xattrs", s(&src), &all_srv.url("flag")]));
    assert!(
        !trusted(&plain.join("flag/d/f")),
        "the export does not allow it"
    );
    assert!(
        !trusted(&all.join("noflag/d/f")),
        "the client did not send it"
    );
    assert!(trusted(&all.join("flag/d/f")), "both asked: it travels");
    // Pulls.
    let back = t.path().join("back");
    for sub in ["plain-flag", "all-noflag", "all-flag"] {
        std::fs::create_dir_all(back.join(sub)).unwrap();
    }
    ok(&cp(&[
        "--all-xattrs",
        &plain_srv.url("flag/d"),
        s(&back.join("plain-flag")),
    ]));
    ok(&cp(&[&all_srv.url("flag/d"), s(&back.join("all-noflag"))]));
    ok(&cp(&[
        "--all-xattrs",
        &all_srv.url("flag/d"),
        s(&back.join("all-flag")),
    ]));
    assert!(
        !trusted(&back.join("plain-flag/d/f")),
        "the export does not send it"
    );
    assert!(
        !trusted(&back.join("all-noflag/d/f")),
        "the client does not set it"
    );
    assert!(
        trusted(&back.join("all-flag/d/f")),
        "both asked: it travels"
    );
}

/// `security.capability` (file capabilities, as `setcap cap_net_raw+ep` writes them) is
/// setuid's kin: with `xattrs = "all"` at both ends it reaches a destination only
/// where the owner is applied (`--preserve-owner`), as a setuid bit does; a server
/// that does not keep owners drops it (and still sets the other attributes).
#[test]
fn a_pushed_file_keeps_its_capabilities_only_where_owners_are_kept() {
    let test = "a_pushed_file_keeps_its_capabilities_only_where_owners_are_kept";
    if !is_root() {
        eprintln!("{test}: skipped: setting file capabilities needs root");
        return;
    }
    let t = tmp();
    if !xattrs_supported(t.path(), test) {
        return;
    }
    const CAP_NET_RAW: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let src = t.path().join("d");
    std::fs::create_dir(&src).unwrap();
    write_file(&src.join("ping"), 1, 1000, 0o755, 1_600_000_000);
    set(&src.join("ping"), "security.capability", &CAP_NET_RAW).unwrap();
    set(&src.join("ping"), "trusted.other", b"x").unwrap();
    let has = |p: &Path, name: &str| {
        let mut v = vec![0u8; 256];
        rustix::fs::lgetxattr(p, name, &mut v[..]).is_ok()
    };
    assert!(has(&src.join("ping"), "security.capability"));
    let (plain, owners) = (t.path().join("plain"), t.path().join("owners"));
    std::fs::create_dir(&plain).unwrap();
    std::fs::create_dir(&owners).unwrap();
    let plain_srv = Server::start(&plain, &["--all-xattrs"]);
    ok(&cp(&["--all-xattrs", s(&src), &plain_srv.url("")]));
    let f = plain.join("d/ping");
    assert!(has(&f, "trusted.other"), "other attributes travel");
    assert!(
        !has(&f, "security.capability"),
        "a server that does not keep owners drops file capabilities"
    );
    let owners_srv = Server::start(&owners, &["--all-xattrs", "--preserve-owner"]);
    ok(&cp(&["--all-xattrs", s(&src), &owners_srv.url("")]));
    assert!(has(&owners.join("d/ping"), "security.capability"));
}

/// A re-run of `sync` whose files changed only in their `user.*` xattrs and ACLs (size
/// and mtime as they were, so no data is sent) brings the mirror's to the source's:
/// changed and new ones set, gone ones removed (also one added at the mirror), a
/// file's access ACL replaced and one removed. (Only files whose source has some are
/// compared: docs/sync.md.) Push and pull.
#[test]
fn an_xattr_or_acl_change_alone_reaches_the_mirror() {
    let test = "an_xattr_or_acl_change_alone_reaches_the_mirror";
    for push in [true, false] {
        let t = tmp();
        if !xattrs_supported(t.path(), test) {
            return;
        }
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let srv = Server::start(&root, &[]);
        let (src, mirror, from, to) = if push {
            let src = t.path().join("d");
            (
                src.clone(),
                root.join("m"),
                s(&src).to_string(),
                srv.url("m"),
            )
        } else {
            let m = t.path().join("m");
            (root.join("d"), m.clone(), srv.url("d"), s(&m).to_string())
        };
        make(&src);
        let access = |perm| {
            acl(&[
                (USER_OBJ, 6, NONE),
                (USER, perm, 4321),
                (GROUP_OBJ, 4, NONE),
                (MASK, 6, NONE),
                (OTHER, 4, NONE),
            ])
        };
        // sub/g gets an ACL of its own first, removed later.
        set(&src.join("sub/g"), "system.posix_acl_access", &access(4)).unwrap();
        set(&src.join("sub/g"), "user.keep", b"k").unwrap();
        ok(&sync(&["--quiet", &from, &to]));
        same_meta(&src, &mirror);
        let mtime = |p: &Path| std::fs::symlink_metadata(p).unwrap().mtime_nsec();
        let before = mtime(&src.join("f"));
        set(&src.join("f"), "user.text", b"changed").unwrap();
        set(&src.join("f"), "user.new", b"n").unwrap();
        rustix::fs::lremovexattr(src.join("f"), "user.bin").unwrap();
        set(&src.join("f"), "system.posix_acl_access", &access(2)).unwrap();
        rustix::fs::lremovexattr(src.join("sub/g"), "system.posix_acl_access").unwrap();
        std::fs::set_permissions(src.join("sub/g"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        set(&mirror.join("sub/g"), "user.extra", b"x").unwrap();
        assert_eq!(mtime(&src.join("f")), before, "xattrs leave the mtime");
        let o = sync(&["--json", &from, &to]);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["bytes_sent"], 0, "push {push}: no data: {j}");
        same_meta(&src, &mirror);
        assert_eq!(
            xattrs(&mirror.join("sub/g")),
            vec![("user.keep".to_string(), b"k".to_vec())],
            "push {push}: the removed ACL and the extra xattr are gone"
        );
    }
}
