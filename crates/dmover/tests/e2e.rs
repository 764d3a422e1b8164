//! End to end: the real `dmover` binary against real `dmover serve` processes on
//! loopback, over real trees in fresh temporary directories.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-e2e-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn push_preserves_every_kind_of_entry() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // Small chunks: files span chunks, chunks hold several files.
    let o = cp(&["--chunk", "64K", "--json", s(&src), &srv.url("")]);
    ok(&o);
    same(&src, &root.join("tree"));
    let j = json(&o);
    assert_eq!(j["ok"], true);
    assert_eq!(j["direction"], "push");
    assert_eq!(j["files"], 12);
    assert_eq!(j["symlinks"], 4);
    assert_eq!(j["dirs"], 4);
    assert_eq!(j["verified"], true);
    assert_eq!(j["errors"], 0);
    // Self-tuning (no -P): 16 streams to choose from, 4 to start with.
    assert_eq!(j["streams"], 16);
    assert_eq!(j["tuning"]["of"], 16);
    let used = j["tuning"]["streams"].as_u64().unwrap();
    assert!((1..=16).contains(&used), "{j}");
    assert_eq!(j["chunk"], 65536);
    let expected_bytes: u64 = walk_bytes(&src);
    assert_eq!(j["bytes"], expected_bytes);
    assert!(j["seconds"].as_f64().unwrap() > 0.0);
    assert!(j["gbit_per_s"].as_f64().unwrap() > 0.0);
    assert!(staging_files(&root).is_empty());
}

#[test]
fn pull_preserves_every_kind_of_entry() {
    let t = tmp();
    let root = t.path().join("root");
    make_tree(&root.join("data/tree"));
    let srv = Server::start(&root, &[]);
    let dest = t.path().join("local");
    std::fs::create_dir(&dest).unwrap();
    for (i, (mode, chunk)) in [
        ("", "64K"),
        ("--direct-io", "1M"),
        ("--buffered-io", "256K"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = dest.join(format!("copy-{i}"));
        let mut args = vec!["--chunk", chunk, "-P", "3"];
        if !mode.is_empty() {
            args.push(mode);
        }
        let url = srv.url("data/tree");
        args.extend([url.as_str(), s(&out)]);
        ok(&cp(&args));
        same(&root.join("data/tree"), &out);
    }
    assert!(staging_files(&dest).is_empty());
}

#[test]
fn many_small_files_and_no_checksum_mode() {
    let t = tmp();
    let src = t.path().join("small");
    make_small_files(&src, 3000, 30);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let o = cp(&["--json", s(&src), &srv.url("")]);
    ok(&o);
    same(&src, &root.join("small"));
    assert_eq!(json(&o)["files"], 3000);
    let back = t.path().join("back");
    let o = cp(&["--no-checksum", "--json", &srv.url("small"), s(&back)]);
    ok(&o);
    same(&src, &back);
    assert_eq!(json(&o)["verified"], false);
}

#[test]
fn a_file_larger_than_the_buffer_pool() {
    let t = tmp();
    let src = t.path().join("big.bin");
    // Pool: 2 buffers × 64 KiB = 128 KiB; the file is 160 times that.
    write_file(&src, 99, 20 << 20, 0o640, 1_700_000_000);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let flags = ["--chunk", "64K", "--buffers", "2", "-P", "2"];
    let mut args = flags.to_vec();
    let url = srv.url("big.bin");
    args.extend([s(&src), url.as_str()]);
    ok(&cp(&args));
    same(&src, &root.join("big.bin"));
    let back = t.path().join("back.bin");
    let mut args = flags.to_vec();
    args.extend([url.as_str(), s(&back)]);
    ok(&cp(&args));
    same(&src, &back);
}

#[test]
fn empty_tree() {
    let t = tmp();
    let src = t.path().join("nothing");
    std::fs::create_dir(&src).unwrap();
    set_dir_meta(&src, 0o711, 1_234_567_890);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let o = cp(&["--json", s(&src), &srv.url("")]);
    ok(&o);
    same(&src, &root.join("nothing"));
    assert_eq!(json(&o)["bytes"], 0);
    let back = t.path().join("back");
    ok(&cp(&[&srv.url("nothing"), s(&back)]));
    same(&src, &back);
}

#[test]
fn cp_destination_semantics() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("existing-dir")).unwrap();
    let srv = Server::start(&root, &[]);
    let a = t.path().join("a.txt");
    let b = t.path().join("b.txt");
    write_file(&a, 1, 5000, 0o644, 1_600_000_000);
    write_file(&b, 2, 7000, 0o600, 1_600_000_001);
    // To a name that does not exist: the file takes that name.
    ok(&cp(&[s(&a), &srv.url("renamed.txt")]));
    same(&a, &root.join("renamed.txt"));
    // Onto an existing file: replaced.
    ok(&cp(&[s(&b), &srv.url("renamed.txt")]));
    same(&b, &root.join("renamed.txt"));
    // Into an existing directory, several sources.
    ok(&cp(&[s(&a), s(&b), &srv.url("existing-dir")]));
    same(&a, &root.join("existing-dir/a.txt"));
    same(&b, &root.join("existing-dir/b.txt"));
    // Several sources to a path that is not a directory: refused, nothing created.
    let o = cp(&[s(&a), s(&b), &srv.url("nope")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    assert!(!root.join("nope").exists());
    // A directory over an existing file: refused.
    let d = t.path().join("dir");
    make_small_files(&d, 3, 1);
    let o = cp(&[s(&d), &srv.url("renamed.txt")]);
    assert!(!o.status.success());
    same(&b, &root.join("renamed.txt"));
    // The destination's parent must exist.
    let o = cp(&[s(&a), &srv.url("missing/parent/x")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no such file"), "{}", stderr(&o));
    // Pull into a local directory that exists, and to a new local name.
    let here = t.path().join("here");
    std::fs::create_dir(&here).unwrap();
    ok(&cp(&[&srv.url("existing-dir/a.txt"), s(&here)]));
    same(&a, &here.join("a.txt"));
    ok(&cp(&[&srv.url("existing-dir"), s(&here.join("copy"))]));
    same(&root.join("existing-dir"), &here.join("copy"));
}

#[test]
fn a_trailing_slash_follows_a_symlink_to_a_directory() {
    let t = tmp();
    let real = t.path().join("real");
    make_small_files(&real, 5, 1);
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    ok(&cp(&[&format!("{}/", s(&link)), &srv.url("")]));
    same(&real, &root.join("link"));
    ok(&cp(&[s(&link), &srv.url("as-link")]));
    assert!(
        std::fs::symlink_metadata(root.join("as-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn concurrent_clients() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--io-threads", "2"]);
    let trees: Vec<_> = (0..6)
        .map(|i| {
            let p = t.path().join(format!("src{i}"));
            make_small_files(&p, 200, 4);
            write_file(&p.join("big"), 1000 + i, 3 << 20, 0o644, 1_700_000_000);
            p
        })
        .collect();
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", srv.child.id()))
            .unwrap()
            .count()
    };
    let idle_threads = threads();
    let children: Vec<_> = trees
        .iter()
        .map(|p| {
            std::process::Command::new(bin())
                .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
                .args(["cp", "--quiet", "--chunk", "256K", s(p), &srv.url("")])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Six sessions at once run on the server's fixed network and disk threads.
    let mut busiest = idle_threads;
    for _ in 0..20 {
        busiest = busiest.max(threads());
        std::thread::sleep(Duration::from_millis(10));
    }
    for c in children {
        ok(&c.wait_with_output().unwrap());
    }
    assert_eq!(
        busiest, idle_threads,
        "the server's thread count stays fixed"
    );
    for p in &trees {
        same(p, &root.join(p.file_name().unwrap()));
    }
}

/// An empty root served with a token: the root, the token's file, a file holding a
/// wrong token, the server.
fn token_server(t: &tempfile::TempDir) -> (PathBuf, PathBuf, PathBuf, Server) {
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    std::fs::write(&token, "correct horse battery staple\n").unwrap();
    let wrong = t.path().join("wrong");
    std::fs::write(&wrong, "incorrect").unwrap();
    let srv = Server::start(&root, &["--token-file", s(&token)]);
    (root, token, wrong, srv)
}

#[test]
fn token_authentication() {
    let t = tmp();
    let (root, token, wrong, srv) = token_server(&t);
    let f = t.path().join("f");
    write_file(&f, 3, 100, 0o644, 1_600_000_000);

    let o = cp(&[s(&f), &srv.url("f")]);
    assert_eq!(o.status.code(), Some(3), "no token: {}", stderr(&o));
    assert!(
        stderr(&o).contains("requires authentication"),
        "{}",
        stderr(&o)
    );
    let o = cp(&["--token-file", s(&wrong), s(&f), &srv.url("f")]);
    assert_eq!(o.status.code(), Some(3), "wrong token: {}", stderr(&o));
    assert!(
        stderr(&o).contains("authentication failed"),
        "{}",
        stderr(&o)
    );
    let o = cp_env(&[s(&f), &srv.url("f")], &[("DMOVER_TOKEN", "nope")]);
    assert_eq!(o.status.code(), Some(3));
    assert!(!root.join("f").exists());

    ok(&cp(&["--token-file", s(&token), s(&f), &srv.url("f")]));
    same(&f, &root.join("f"));
    ok(&cp_env(
        &[&srv.url("f"), s(&t.path().join("g"))],
        &[("DMOVER_TOKEN", "correct horse battery staple")],
    ));
    same(&f, &t.path().join("g"));
}

/// Protocol version 8: a fresh push to a server whose key the client pinned earlier
/// sends its first chunks with its first flight (early data), whole and verified, also
/// encrypted; on first use it waits for the session as before; a wrong token is still
/// refused with nothing written; a pull joins its streams early and the server sends
/// without waiting for its Go.
#[test]
fn a_copy_with_a_known_server_sends_early_data() {
    let t = tmp();
    let (root, token, wrong, srv) = token_server(&t);
    let kh = known_hosts_in(t.path());
    let env = [("DMOVER_KNOWN_HOSTS", s(&kh))];
    let first = t.path().join("first");
    make_small_files(&first, 200, 4);
    let o = cp_env(
        &["-v", "--token-file", s(&token), s(&first), &srv.url("")],
        &env,
    );
    ok(&o);
    assert!(!stderr(&o).contains("early data"), "{}", stderr(&o));
    same(&first, &root.join("first"));
    let second = t.path().join("second");
    make_tree(&second);
    make_small_files(&second.join("small"), 2000, 20);
    for (dest, extra) in [("a", None), ("b", Some("--encrypt"))] {
        let mut args = vec!["-v", "--json", "--token-file", s(&token)];
        args.extend(extra);
        let url = srv.url(dest);
        args.extend([s(&second), &url]);
        let o = cp_env(&args, &env);
        ok(&o);
        assert!(stderr(&o).contains("early data"), "{}", stderr(&o));
        same(&second, &root.join(dest));
        let j = json(&o);
        assert_eq!(j["verified"], true);
        assert_eq!(j["errors"], 0);
        assert!(staging_files(&root.join(dest)).is_empty());
    }
    let o = cp_env(
        &["-v", "--token-file", s(&wrong), s(&first), &srv.url("c")],
        &env,
    );
    assert_eq!(o.status.code(), Some(3), "wrong token: {}", stderr(&o));
    assert!(stderr(&o).contains("early data"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("authentication failed"),
        "{}",
        stderr(&o)
    );
    assert!(!root.join("c").exists());
    let back = t.path().join("back");
    let o = cp_env(
        &[
            "-v",
            "--json",
            "--token-file",
            s(&token),
            &srv.url("a"),
            s(&back),
        ],
        &env,
    );
    ok(&o);
    assert!(stderr(&o).contains("early data"), "{}", stderr(&o));
    same(&second, &back);
    assert_eq!(json(&o)["verified"], true);
}

#[test]
fn server_without_token_refuses_non_loopback_listen() {
    let t = tmp();
    let o = std::process::Command::new(bin())
        .args(["serve", "--root", s(t.path()), "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("without authentication"));
}

#[test]
fn paths_escaping_the_root_are_refused() {
    let t = tmp();
    let root = t.path().join("root");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(root.join("inside")).unwrap();
    write_file(&outside.join("secret"), 7, 100, 0o600, 1_600_000_000);
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    std::os::unix::fs::symlink("../../outside", root.join("inside/rel-escape")).unwrap();
    let srv = Server::start(&root, &[]);
    let f = t.path().join("payload");
    write_file(&f, 8, 100, 0o644, 1_600_000_000);
    let local = t.path().join("got");
    let cases_push = [
        "../outside/x",
        "inside/../../outside/x",
        "/etc/evil",
        "escape/x",
        "inside/rel-escape/x",
    ];
    for dest in cases_push {
        let o = cp(&[s(&f), &format!("dmover://{}/{dest}", srv.addr)]);
        assert_eq!(o.status.code(), Some(1), "push to {dest}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("refused") || e.contains("outside"),
            "push to {dest}: {e}"
        );
    }
    let cases_pull = [
        "../outside/secret",
        "/etc/hostname",
        "escape/secret",
        "inside/rel-escape/secret",
        "escape",
    ];
    for src in cases_pull {
        let o = cp(&[&format!("dmover://{}/{src}", srv.addr), s(&local)]);
        if src == "escape" {
            // The link itself is inside the root: it is copied as a link, never followed.
            ok(&o);
            assert!(
                std::fs::symlink_metadata(&local)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            std::fs::remove_file(&local).unwrap();
            continue;
        }
        assert_eq!(o.status.code(), Some(1), "pull of {src}: {}", stderr(&o));
    }
    // Nothing was written outside, and the secret never left.
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    assert!(!local.exists());
}

#[test]
fn read_only_server_refuses_pushes() {
    let t = tmp();
    let root = t.path().join("root");
    make_small_files(&root.join("d"), 5, 1);
    let srv = Server::start(&root, &["--read-only"]);
    let f = t.path().join("f");
    write_file(&f, 3, 100, 0o644, 1_600_000_000);
    let o = cp(&[s(&f), &srv.url("f")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    assert!(!root.join("f").exists());
    ok(&cp(&[&srv.url("d"), s(&t.path().join("d"))]));
    same(&root.join("d"), &t.path().join("d"));
}

#[test]
fn usage_errors() {
    let t = tmp();
    // A local copy of a directory into itself (tests/local.rs has local copies).
    let o = cp(&[s(t.path()), s(&t.path().join("x"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("into itself"), "{}", stderr(&o));
    assert!(!t.path().join("x").exists());
    // --tpc is for copies between two servers (tests/tpc.rs has those).
    let o = cp(&["--tpc", "pull", "a", "b:y"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--tpc and --via-client are for copies between two servers"),
        "{}",
        stderr(&o)
    );
    let o = cp(&["--chunk", "1000", "a", "b:"]);
    assert_eq!(o.status.code(), Some(2));
    // Sizes and durations: one parser each; a bad value is a usage error that names it
    // and says what is accepted.
    for (args, says) in [
        (
            &["--chunk", "1gb"][..],
            "\"1gb\" must be a multiple of 4K from 64K to 64M",
        ),
        (&["--chunk", "4X"], "(use B, K/KiB, M/MiB"),
        (&["--tcp-buffer=-1M"], "\"-1M\" is negative"),
        (&["--retry-wait", "5"], "\"5\" needs a unit, e.g. 5s or 5ms"),
        (&["--stream-timeout", "2w"], "unknown unit \"w\""),
    ] {
        let o = cp(&[args, &["a", "b:"][..]].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // Nobody listens on this port: a network error, exit code 4.
    let o = cp(&[s(t.path()), "127.0.0.1:1"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    // A source that does not exist.
    let srv = Server::start(t.path(), &[]);
    let o = cp(&[&srv.url("no/such/file"), s(&t.path().join("x"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no such file"), "{}", stderr(&o));
    let o = cp(&[s(&t.path().join("missing")), &srv.url("")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no such file"), "{}", stderr(&o));
}

/// Waits until `cond` holds, up to `limit`.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn kill_test_tree(p: &Path) {
    make_small_files(p, 300, 3);
    for i in 0..3 {
        write_file(
            &p.join(format!("big{i}")),
            50 + i,
            6 << 20,
            0o644,
            1_700_000_000,
        );
    }
}

#[test]
fn server_killed_mid_push_leaves_no_partial_file() {
    let t = tmp();
    let src = t.path().join("src");
    kill_test_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut srv = Server::start(&root, &["--debug-chunk-delay-ms", "30"]);
    let client = std::process::Command::new(bin())
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .args(["cp", "--quiet", "--chunk", "64K", s(&src), &srv.url("")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the server once data has started landing.
    assert!(
        wait_for(Duration::from_secs(20), || !staging_files(&root).is_empty()),
        "no data arrived"
    );
    std::thread::sleep(Duration::from_millis(300));
    srv.kill();
    let o = client.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "the client must fail when the server dies"
    );
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let complete = no_partial_files(&src, &root.join("src"));
    let total = 303;
    assert!(
        complete < total,
        "the transfer was not interrupted ({complete} files)"
    );
}

#[test]
fn server_killed_mid_pull_leaves_no_partial_file() {
    let t = tmp();
    let root = t.path().join("root");
    let src = root.join("src");
    kill_test_tree(&src);
    let mut srv = Server::start(&root, &["--debug-chunk-delay-ms", "30"]);
    let dest = t.path().join("dest");
    let client = std::process::Command::new(bin())
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .args(["cp", "--quiet", "--chunk", "64K", &srv.url("src"), s(&dest)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || !staging_files(&dest).is_empty()),
        "no data arrived"
    );
    std::thread::sleep(Duration::from_millis(300));
    srv.kill();
    let o = client.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let complete = no_partial_files(&src, &dest);
    assert!(complete < 303, "the transfer was not interrupted");
    // The client cleaned up its own staging files, but for those of the large files
    // its resume journal describes (issue 6).
    only_resumable_staging(&dest);
    let srv = Server::start(&root, &[]);
    ok(&cp(&["--quiet", "--resume", &srv.url("src"), s(&dest)]));
    same(&src, &dest);
    assert_eq!(staging_files(t.path()), Vec::<std::path::PathBuf>::new());
}

/// Staging files left by an interrupted transfer are only those of files of a chunk
/// or more (the journal can resume them); everything else was removed.
fn only_resumable_staging(dest: &Path) {
    for f in staging_files(dest) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".dmv.journal.")
                || name.ends_with(".big0")
                || name.ends_with(".big1")
                || name.ends_with(".big2"),
            "{name} left behind"
        );
    }
}

#[test]
fn client_killed_mid_push_server_cleans_up_and_keeps_serving() {
    let t = tmp();
    let src = t.path().join("src");
    kill_test_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "30"]);
    let mut client = std::process::Command::new(bin())
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .args(["cp", "--quiet", "--chunk", "64K", s(&src), &srv.url("")])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || !staging_files(&root).is_empty()));
    client.kill().unwrap();
    client.wait().unwrap();
    no_partial_files(&src, &root.join("src"));
    // The server removes the aborted session's staging files, but for those of the
    // large files its resume journal describes (issue 6).
    assert!(
        wait_for(Duration::from_secs(20), || staging_files(&root).iter().all(
            |f| {
                let n = f.file_name().unwrap().to_string_lossy().into_owned();
                n.contains(".big") || n.starts_with(".dmv.journal.")
            }
        )),
        "the server removes the aborted session's staging files: {:?}",
        staging_files(&root)
    );
    // The server still serves.
    let f = t.path().join("after");
    write_file(&f, 1, 1000, 0o644, 1_600_000_000);
    ok(&cp(&[s(&f), &srv.url("after")]));
    same(&f, &root.join("after"));
    // And the interrupted push resumes, leaving nothing behind.
    ok(&cp(&[
        "--quiet",
        "--resume",
        "--chunk",
        "64K",
        s(&src),
        &srv.url(""),
    ]));
    same(&src, &root.join("src"));
    assert_eq!(staging_files(&root), Vec::<std::path::PathBuf>::new());
}

#[test]
fn demo_runs() {
    let o = std::process::Command::new(bin())
        .args(["demo", "--scale", "0.05"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("identical:"), "{e}");
    assert!(e.contains("checksums verified"), "{e}");
}

/// A server on IPv6 loopback: push and pull with `dmover://[::1]:PORT/…` and the scp
/// form `[::1]:PATH` (the address with the default port would be `[::1]`).
#[test]
fn ipv6_loopback_end_to_end() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this host has no IPv6 loopback");
        return;
    }
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let args: Vec<&std::ffi::OsStr> = vec!["--root".as_ref(), root.as_os_str()];
    let srv = Server::start_on("[::1]:0", &args, &root, None, None);
    assert!(srv.addr.starts_with("[::1]:"), "{}", srv.addr);
    let o = cp(&["--json", s(&src), &srv.url("")]);
    ok(&o);
    same(&src, &root.join("tree"));
    let back = t.path().join("back");
    let o = cp(&[&srv.url("tree"), s(&back)]);
    ok(&o);
    same(&src, &back);
}

/// Checks one status line (`--progress bar`, stderr not a terminal): `progress: 37%
/// 1.50 GiB/4.00 GiB, 12/40 files, 2.41 Gbit/s, 10 s elapsed[, ETA 15 s]`, or before
/// the totals are known `progress: 1.50 GiB, 12 files, 2.41 Gbit/s, 10 s elapsed`.
fn check_status_line(line: &str, total_bytes: &str, total_files: u64) {
    let rest = line
        .strip_prefix("progress: ")
        .unwrap_or_else(|| panic!("{line}"));
    let parts: Vec<&str> = rest.split(", ").collect();
    assert!(parts.len() >= 4, "{line}");
    let files = parts[1]
        .strip_suffix(" files")
        .unwrap_or_else(|| panic!("{line}"));
    let rate = parts[2]
        .strip_suffix(" Gbit/s")
        .unwrap_or_else(|| panic!("{line}"));
    assert!(rate.parse::<f64>().unwrap() >= 0.0, "{line}");
    let elapsed = parts[3]
        .strip_suffix(" s elapsed")
        .unwrap_or_else(|| panic!("{line}"));
    elapsed.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    match parts[0].split_once(' ') {
        Some((pct, bytes)) if pct.ends_with('%') => {
            let pct: u64 = pct.trim_end_matches('%').parse().unwrap();
            assert!(pct <= 100, "{line}");
            let (done, total) = bytes.split_once('/').unwrap_or_else(|| panic!("{line}"));
            assert!(done.ends_with("iB") || done.ends_with(" B"), "{line}");
            assert_eq!(total, total_bytes, "{line}");
            let (n, of) = files.split_once('/').unwrap_or_else(|| panic!("{line}"));
            assert!(n.parse::<u64>().unwrap() <= total_files, "{line}");
            assert_eq!(of.parse::<u64>().unwrap(), total_files, "{line}");
            if let Some(eta) = parts.get(4) {
                let s = eta.strip_prefix("ETA ").and_then(|e| e.strip_suffix(" s"));
                s.unwrap_or_else(|| panic!("{line}"))
                    .parse::<u64>()
                    .unwrap();
            }
        }
        _ => {
            files.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
        }
    }
}

#[test]
fn progress_off_a_terminal_is_a_status_line_every_interval() {
    let t = tmp();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..4 {
        write_file(&src.join(format!("f{i}")), i, 2 << 20, 0o644, 1_700_000_000);
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // 128 chunks of 64 KiB, each 100 ms on one of 8 disk threads: ~1.6 s.
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "100"]);
    // stderr is a pipe here, not a terminal.
    let o = cp(&[
        "--chunk",
        "64K",
        "--progress-interval",
        "200ms",
        s(&src),
        &srv.url(""),
    ]);
    ok(&o);
    let err = stderr(&o);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    assert!(lines.len() >= 2, "{err}");
    for l in &lines {
        check_status_line(l, "8.00 MiB", 4);
    }
    assert!(lines.iter().any(|l| l.contains("/8.00 MiB, ")), "{err}");
    // The summary line comes after the last status line.
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("pushed 8.00 MiB in 4 files"), "{err}");
    same(&src, &root.join("src"));

    // --quiet and --progress none: no status line.
    for off in [&["--quiet"][..], &["--progress", "none"][..]] {
        let dest = srv.url(&format!("off{}", off.len()));
        let mut args = vec!["--chunk", "64K", "--progress-interval", "200ms"];
        args.extend_from_slice(off);
        args.extend([s(&src), dest.as_str()]);
        let o = cp(&args);
        ok(&o);
        assert!(
            !stderr(&o).contains("progress: "),
            "{off:?}: {}",
            stderr(&o)
        );
    }
}
