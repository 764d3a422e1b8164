//! rsync's and scp's habits, end to end with the real binary: a copy between two
//! local paths (the same session as a pull, both halves in the process) and `-` for
//! one file on stdin or stdout.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-local-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_local_tree_copy_keeps_everything_and_a_second_sync_sends_nothing() {
    let t = tmp();
    let src = t.path().join("src");
    make_tree(&src);
    // cp: DST that does not exist becomes the copy.
    let dst = t.path().join("dst");
    let o = cp(&["--json", s(&src), s(&dst)]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["direction"], "local", "{j}");
    assert!(j["bytes"].as_u64().unwrap() > 12 << 20, "{j}");
    same(&src, &dst);
    assert!(staging_files(&dst).is_empty(), "{:?}", staging_files(&dst));
    // A copy into an existing directory lands in it.
    let into = t.path().join("into");
    std::fs::create_dir(&into).unwrap();
    ok(&cp(&[s(&src), s(&into)]));
    same(&src, &into.join("src"));

    // sync: the mirror, then nothing sent, then --delete.
    let mirror = t.path().join("mirror");
    ok(&sync(&[s(&src), s(&mirror)]));
    same(&src, &mirror);
    let o = sync(&["--json", s(&src), s(&mirror)]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["bytes_sent"], 0, "{j}");
    assert_eq!(j["files_unchanged"], 11, "the files with data: {j}");
    std::fs::write(mirror.join("extra"), b"not in the source").unwrap();
    std::fs::write(src.join("one"), b"changed").unwrap();
    // A dry run tells what the run will do, and changes nothing.
    let o = sync(&["--dry-run", "--delete", s(&src), s(&mirror)]);
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().any(|l| l == "send one"), "{out}");
    assert!(out.lines().any(|l| l == "delete extra"), "{out}");
    assert!(mirror.join("extra").exists());
    let o = sync(&["--json", "--delete", s(&src), s(&mirror)]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["bytes_sent"], 7, "the changed file alone: {j}");
    assert!(!mirror.join("extra").exists());
    same(&src, &mirror);
    assert!(staging_files(&mirror).is_empty());
}

#[test]
fn a_local_copy_resumes_and_refuses_a_directory_into_itself() {
    let t = tmp();
    let src = t.path().join("src");
    make_small_files(&src, 40, 3);
    let dst = t.path().join("dst");
    ok(&cp(&[s(&src), s(&dst)]));
    // --resume after a finished copy: everything is held, nothing sent, no nesting.
    let o = cp(&["--json", "--resume", s(&src), s(&dst)]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["bytes_sent"], 0, "{j}");
    assert_eq!(j["files_sent"], 0, "{j}");
    assert_eq!(j["bytes_resumed"], j["bytes"], "{j}");
    assert!(!dst.join("src").exists());
    same(&src, &dst);
    let o = cp(&[s(&src), s(&src.join("d000/inner"))]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("into itself"), "{}", stderr(&o));
    assert!(!src.join("d000/inner").exists());
}

#[test]
fn a_local_copy_into_a_read_only_directory_fails_with_nothing_visible() {
    let t = tmp();
    // Run as an unprivileged user when the tests run as root (root writes anywhere).
    let root = rustix::process::geteuid().is_root();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = t.path().join("f");
    write_file(&f, 7, 3 << 20, 0o644, 1_600_000_000);
    let ro = t.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let mut c = Command::new(bin());
    c.args(["cp", s(&f), s(&ro)]);
    if root {
        std::os::unix::process::CommandExt::uid(&mut c, 65534);
        std::os::unix::process::CommandExt::gid(&mut c, 65534);
    }
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("Permission denied"), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(&ro).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn pipe_into(args: &[&str], input: &[u8]) -> std::process::Output {
    let kh = tmp();
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", kh.path().join("known_hosts"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        // In pieces, as a producer writes.
        for piece in data.chunks(100_000) {
            if stdin.write_all(piece).is_err() {
                return;
            }
        }
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    o
}

#[test]
fn stdin_to_a_server_and_a_server_to_stdout_carry_the_same_bytes() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let srv = Server::start(&root, &[]);
    let data = bytes(42, (5 << 20) + 12345);
    // stdin → a file on the server, written in pieces by the child's producer.
    let o = pipe_into(&["cp", "-", &srv.url("in/up.bin")], &data);
    assert_eq!(o.status.code(), Some(1), "its directory must exist");
    assert!(stderr(&o).contains("no such directory"), "{}", stderr(&o));
    assert!(!root.join("in").exists());
    let o = pipe_into(&["cp", "-", &srv.url("d/up.bin")], &data);
    ok(&o);
    assert!(std::fs::read(root.join("d/up.bin")).unwrap() == data);
    assert!(staging_files(&root).is_empty());
    // DST names a file: an existing directory is not replaced.
    let o = pipe_into(&["cp", "-", &srv.url("d")], &data);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(root.join("d/up.bin").exists());

    // The server's file → stdout, byte for byte; a tree is refused.
    let o = pipe_into(&["cp", "--chunk", "1M", &srv.url("d/up.bin"), "-"], b"");
    ok(&o);
    assert_eq!(o.stdout.len(), data.len());
    assert!(o.stdout == data, "stdout differs from the file");
    assert!(stderr(&o).contains("checksums verified"), "{}", stderr(&o));
    let o = pipe_into(&["cp", &srv.url("d"), "-"], b"");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("takes one file"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());

    // Local to local through stdin.
    let local = t.path().join("local.bin");
    ok(&pipe_into(&["cp", "-", s(&local)], &data));
    assert!(std::fs::read(&local).unwrap() == data);
}

#[test]
fn dash_refuses_resume_several_sources_and_sync() {
    let t = tmp();
    let f = t.path().join("f");
    write_file(&f, 1, 10, 0o644, 1_600_000_000);
    for (args, says) in [
        (
            &["cp", "--resume", "-", "h:x"][..],
            "--resume does not apply to '-'",
        ),
        (
            &["cp", "--resume", "h:x", "-"],
            "--resume does not apply to '-'",
        ),
        (&["cp", "-", s(&f), "h:x"], "takes one file"),
        (&["cp", "h:a", "h:b", "-"], "takes one file"),
        (&["cp", "-", "-"], "both sides"),
        (&["sync", "-", "h:x"], "not sync"),
        (&["cp", "--json", "h:x", "-"], "stdout"),
    ] {
        let o = pipe_into(args, b"data");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
