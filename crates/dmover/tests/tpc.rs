//! Third-party copies (docs/third-party.md): a client steers server A → server B, the
//! data going from A to B directly. Real servers on loopback, real files.

mod common;

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-tpc-")
        .tempdir()
        .unwrap()
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_tree_goes_from_one_server_to_another_both_ways_of_dialing() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    make_small_files(&a_root.join("small"), 300, 7);
    let a = Server::start(&a_root, &["--third-party"]);
    let b = Server::start(&b_root, &["--third-party"]);

    // Push (the default): A dials B.
    let o = cp(&["--json", &a.url("tree"), &a.url("small"), &b.url("")]);
    ok(&o);
    same(&a_root.join("tree"), &b_root.join("tree"));
    same(&a_root.join("small"), &b_root.join("small"));
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-push", "{j}");
    assert_eq!(j["dialer"], a.addr.as_str(), "{j}");
    assert_eq!(j["verified"], true, "{j}");
    assert!(j["files"].as_u64().unwrap() > 300, "{j}");

    // Pull: B dials A.
    let o = cp(&["--json", "--tpc", "pull", &a.url("tree"), &b.url("pulled")]);
    ok(&o);
    // As `cp -r tree pulled` with no `pulled` yet: `pulled` is the copy.
    same(&a_root.join("tree"), &b_root.join("pulled"));
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-pull", "{j}");
    assert_eq!(j["dialer"], b.addr.as_str(), "{j}");
    assert!(no_partial_files(&a_root.join("tree"), &b_root.join("pulled")) > 0);
}

#[test]
fn servers_that_do_not_allow_third_party_copies_refuse_and_nothing_is_written() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    let a = Server::start(&a_root, &["--third-party"]);
    // B serves, but not for third-party copies: it issues no capability.
    let b = Server::start(&b_root, &[]);
    let o = cp(&[&a.url("tree"), &b.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not allow third-party copies"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);

    // A read-only destination refuses to issue a capability to write.
    let ro = Server::start(&b_root, &["--third-party", "--read-only"]);
    let o = cp(&[&a.url("tree"), &ro.url("")]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);

    // The source must allow them too: A without the switch refuses to dial.
    let a2 = Server::start(&a_root, &[]);
    let b2 = Server::start(&b_root, &["--third-party"]);
    let o = cp(&[&a2.url("tree"), &b2.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not allow third-party copies"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);
    let _ = s(t.path());
}
