//! Upgrading one side at a time (docs/protocol.md, "Upgrading one side at a time"):
//! this build against a previous one, both ways round, as a site meets it while its
//! DTNs are upgraded one by one. Opt-in, as it needs a second build: the tests are
//! ignored (the test run says why) unless run with `--ignored` and `DMOVER_PREV_BIN`
//! naming a dmover binary built from an older commit:
//!
//! ```sh
//! DMOVER_PREV_BIN=$(scripts/build-prev.sh e8ed9b2) \
//!     cargo test --release -p dmover --test upgrade -- --ignored
//! ```
//!
//! The wire format of protocol version 8 itself is pinned byte for byte by
//! dmover-proto's golden tests, which always run.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// The previous build named by `DMOVER_PREV_BIN`.
fn prev() -> PathBuf {
    let p = std::env::var_os("DMOVER_PREV_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("set DMOVER_PREV_BIN to an older dmover binary (scripts/build-prev.sh)")
        });
    assert!(p.is_file(), "DMOVER_PREV_BIN={} is not a file", p.display());
    p
}

fn this() -> PathBuf {
    PathBuf::from(bin())
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-upgrade-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn serve(binary: &Path, root: &Path, extra: &[&str]) -> Server {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--root".as_ref(), root.as_os_str()];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    Server::spawn(binary, "127.0.0.1:0", &args, root, None, None)
}

fn run(binary: &Path, sub: &str, args: &[&str]) -> Output {
    command_of(binary, sub, args, &[])
}

/// Which build is which, for failure messages.
fn name(binary: &Path) -> &'static str {
    if binary == this() {
        "this build"
    } else {
        "the previous build"
    }
}

#[test]
#[ignore = "needs DMOVER_PREV_BIN, an older dmover binary (scripts/build-prev.sh e8ed9b2), and --ignored"]
fn the_previous_build_speaks_a_protocol_version_this_one_accepts() {
    let old = prev();
    let o = run(&old, "--version", &[]);
    // `dmover --version` takes no subcommand; `command_of` puts the flag first.
    ok(&o);
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    let newest: u16 = line
        .rsplit(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no protocol version in {line:?}"));
    assert!(
        newest >= dmover_proto::MIN_PROTOCOL_VERSION,
        "the previous build speaks up to version {newest}, this one needs at least {}: \
         {line}",
        dmover_proto::MIN_PROTOCOL_VERSION
    );
}

/// A push, a pull and a sync (whose second run sends nothing) with each build as the
/// client of the other's server.
#[test]
#[ignore = "needs DMOVER_PREV_BIN, an older dmover binary (scripts/build-prev.sh e8ed9b2), and --ignored"]
fn copies_and_syncs_cross_both_ways_between_builds() {
    let old = prev();
    for (client, server) in [(this(), old.clone()), (old.clone(), this())] {
        let pair = format!("{} client, {} server", name(&client), name(&server));
        let t = tmp();
        let src = t.path().join("tree");
        make_tree(&src);
        make_small_files(&src.join("small"), 200, 5);
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let srv = serve(&server, &root, &[]);

        let o = run(&client, "cp", &[s(&src), &srv.url("pushed")]);
        assert!(o.status.success(), "{pair}: push: {}", stderr(&o));
        same(&src, &root.join("pushed"));
        assert!(staging_files(&root).is_empty(), "{pair}");

        let back = t.path().join("back");
        let o = run(&client, "cp", &[&srv.url("pushed"), s(&back)]);
        assert!(o.status.success(), "{pair}: pull: {}", stderr(&o));
        same(&src, &back);

        for round in 0..2 {
            let o = run(&client, "sync", &["--json", s(&src), &srv.url("mirror")]);
            assert!(o.status.success(), "{pair}: sync {round}: {}", stderr(&o));
            same(&src, &root.join("mirror"));
            if round == 1 {
                assert_eq!(json(&o)["bytes_sent"], 0, "{pair}: the second sync");
            }
        }
        // A changed file is the only one sent.
        write_file(&src.join("sub/deeper/small"), 77, 333, 0o644, 1_700_000_000);
        let o = run(&client, "sync", &["--json", s(&src), &srv.url("mirror")]);
        assert!(o.status.success(), "{pair}: sync: {}", stderr(&o));
        same(&src, &root.join("mirror"));
        assert_eq!(json(&o)["bytes_sent"], 333, "{pair}");
    }
}

/// A third-party copy between an old and a new server, each dialing the other (push
/// and pull), steered by either build.
#[test]
#[ignore = "needs DMOVER_PREV_BIN, an older dmover binary (scripts/build-prev.sh e8ed9b2), and --ignored"]
fn third_party_copies_run_between_an_old_and_a_new_server() {
    let old = prev();
    let new = this();
    for (client, a_bin, b_bin) in [
        (new.clone(), old.clone(), new.clone()),
        (new.clone(), new.clone(), old.clone()),
        (old.clone(), new.clone(), old.clone()),
    ] {
        let who = format!(
            "{} client, A {}, B {}",
            name(&client),
            name(&a_bin),
            name(&b_bin)
        );
        let t = tmp();
        let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a_root).unwrap();
        std::fs::create_dir(&b_root).unwrap();
        make_tree(&a_root.join("tree"));
        let a = serve(&a_bin, &a_root, &["--third-party"]);
        let b = serve(&b_bin, &b_root, &["--third-party"]);
        for mode in ["push", "pull"] {
            let dest = format!("by-{mode}");
            let o = run(
                &client,
                "cp",
                &["--tpc", mode, &a.url("tree"), &b.url(&dest)],
            );
            assert!(o.status.success(), "{who}, {mode}: {}", stderr(&o));
            same(&a_root.join("tree"), &b_root.join(&dest));
            assert!(staging_files(&b_root).is_empty(), "{who}, {mode}");
        }
    }
}

/// What only the new build has is refused by an old peer before anything is copied,
/// with a message that names the server to upgrade: a sync between two servers
/// (`SYNC_BETWEEN`) where either is old, whichever dials.
#[test]
#[ignore = "needs DMOVER_PREV_BIN, an older dmover binary (scripts/build-prev.sh e8ed9b2), and --ignored"]
fn a_feature_the_old_side_lacks_is_refused_before_anything_is_copied() {
    let old = prev();
    for (a_bin, b_bin) in [(old.clone(), this()), (this(), old.clone())] {
        let t = tmp();
        let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a_root).unwrap();
        std::fs::create_dir(&b_root).unwrap();
        make_tree(&a_root.join("tree"));
        let a = serve(&a_bin, &a_root, &["--third-party"]);
        let b = serve(&b_bin, &b_root, &["--third-party"]);
        let old_addr = if a_bin == old { &a.addr } else { &b.addr };
        for mode in ["push", "pull"] {
            let o = sync(&["--tpc", mode, &a.url("tree"), &b.url("mirror")]);
            let who = format!("source {}, {mode}", name(&a_bin));
            assert!(
                !o.status.success(),
                "{who}: a sync with an old server succeeded"
            );
            let err = stderr(&o);
            assert!(
                err.contains(&format!("upgrade {old_addr}")),
                "{who}: the message does not name the old server {old_addr}: {err}"
            );
            assert!(
                std::fs::read_dir(&b_root).unwrap().next().is_none(),
                "{who}: something was written at the destination"
            );
        }
    }
    // `sync --size-only` and `--ignore-existing` pushed to an old server (`KEEP`):
    // refused before the mirror changes.
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = serve(&old, &root, &[]);
    for mode in ["--size-only", "--ignore-existing"] {
        let o = sync(&[mode, s(&src), &srv.url("mirror")]);
        assert!(!o.status.success(), "{mode} with an old server succeeded");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("upgrade {}", srv.addr)),
            "{mode}: {err}"
        );
        assert!(
            !root.join("mirror").exists(),
            "{mode}: the mirror was written"
        );
    }
}
