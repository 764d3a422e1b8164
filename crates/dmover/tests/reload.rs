//! SIGHUP reloads a server's users and exports without dropping its listener: a
//! removed user's running session ends with "credential revoked" and leaves nothing
//! partial under a final name, other sessions go on, new users get in, and a file that
//! does not parse keeps the users that were.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-reload-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn read_log(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Waits until `cond` holds, polling.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// `dmover credential KIND FILE`: the config line it prints.
fn credential(kind: &str, file: &Path) -> String {
    let o = Command::new(bin())
        .args(["credential", kind, s(file)])
        .output()
        .unwrap();
    ok(&o);
    String::from_utf8(o.stdout).unwrap()
}

/// A server configuration: the export `data` at `data`, and `users` as (name, the
/// credential's config line, rights on data).
fn config(data: &Path, users: &[(&str, &str, &str)]) -> String {
    let mut c = format!("[exports.data]\npath = \"{}\"\n", data.display());
    for (name, line, rights) in users {
        c.push_str(&format!(
            "\n[users.{name}]\n{line}exports = {{ data = \"{rights}\" }}\n"
        ));
    }
    c
}

fn sighup(srv: &Server) {
    let st = Command::new("kill")
        .args(["-HUP", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// `dmover cp ARGS` as a user, started in the background, its output collected.
fn spawn_cp(args: &[&str], kh: &Path, user: &str, cred: (&str, &Path)) -> Child {
    Command::new(bin())
        .arg("cp")
        .args(["--user", user, cred.0, s(cred.1)])
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env_remove("DMOVER_USER")
        .env("DMOVER_KNOWN_HOSTS", kh)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_cp(args: &[&str], kh: &Path, user: &str, cred: (&str, &Path)) -> Output {
    spawn_cp(args, kh, user, cred).wait_with_output().unwrap()
}

/// Waits for `child` at most `limit`, then collects its output (killing it and
/// failing if it is still running).
fn wait_within(mut child: Child, limit: Duration, what: &str) -> (Output, Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            let took = start.elapsed();
            return (child.wait_with_output().unwrap(), took);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    panic!(
        "{what} still running after {limit:?}:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Setup {
    t: tempfile::TempDir,
    data: PathBuf,
    config: PathBuf,
    log: PathBuf,
    kh: PathBuf,
}

fn setup() -> Setup {
    let t = tmp();
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    Setup {
        config: t.path().join("server.toml"),
        log: t.path().join("server.log"),
        kh: t.path().join("known_hosts"),
        data,
        t,
    }
}

#[test]
fn sighup_revokes_a_removed_user_and_keeps_the_others() {
    let st = setup();
    let dir = st.t.path();
    let (a_token, b_key, c_token) = (dir.join("a.token"), dir.join("b.key"), dir.join("c.token"));
    let (a_line, b_line, c_line) = (
        credential("token", &a_token),
        credential("key", &b_key),
        credential("token", &c_token),
    );
    std::fs::write(
        &st.config,
        config(&st.data, &[("a", &a_line, "rw"), ("b", &b_line, "rw")]),
    )
    .unwrap();
    // Every chunk the server reads or writes takes 500 ms, on 4 disk threads: at most
    // 8 chunks of 1 MiB a second for both sessions together.
    let srv = Server::start_with(
        &[
            "--config".as_ref(),
            st.config.as_os_str(),
            "--io-threads".as_ref(),
            "4".as_ref(),
            "--debug-chunk-delay-ms".as_ref(),
            "500".as_ref(),
        ],
        &st.data,
        Some(&st.log),
        None,
    );

    // A pushes 24 files of 4 MiB (96 chunks); B pulls a 48 MiB file (48 chunks).
    let src_a = dir.join("src-a");
    for i in 0..24 {
        write_file(
            &src_a.join(format!("f{i:02}")),
            100 + i,
            4 << 20,
            0o644,
            1_600_000_000,
        );
    }
    let b_file = st.data.join("b-big");
    write_file(&b_file, 7, 48 << 20, 0o644, 1_600_000_000);
    let b_dest = dir.join("b-dest");
    std::fs::create_dir(&b_dest).unwrap();
    // A first, then B once A's files are being written: the disk threads take the
    // sessions' chunks first come, first served, so B started at once could hold
    // every thread until it is done.
    let dest_a = st.data.join("a");
    let mut a = spawn_cp(
        &["--chunk", "1M", s(&src_a), &srv.url("data/a")],
        &st.kh,
        "a",
        ("--token-file", &a_token),
    );
    let writing = |dir: &Path| {
        staging_files(dir).iter().any(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".dmv.journal")
        })
    };
    let a_started = eventually(Duration::from_secs(30), || writing(&dest_a));
    let mut b = spawn_cp(
        &["--chunk", "1M", &srv.url("data/b-big"), s(&b_dest)],
        &st.kh,
        "b",
        ("--key", &b_key),
    );
    // Both sessions are under way: both write files.
    let started = a_started && eventually(Duration::from_secs(30), || writing(&b_dest));
    if !started {
        let _ = a.kill();
        let o = a.wait_with_output().unwrap();
        panic!(
            "the transfers did not start; a: {}\nserver log:\n{}",
            stderr(&o),
            read_log(&st.log)
        );
    }
    // A has 96 chunks, B 48, at 8 chunks a second for both: both are still running.
    assert!(a.try_wait().unwrap().is_none(), "a's copy is still running");
    assert!(b.try_wait().unwrap().is_none(), "b's copy is still running");

    // A is removed, C added.
    std::fs::write(
        &st.config,
        config(&st.data, &[("b", &b_line, "rw"), ("c", &c_line, "rw")]),
    )
    .unwrap();
    sighup(&srv);

    // A's client fails within 10 s (and some margin for a loaded machine), with the
    // reason, as a refused credential (exit 3).
    let (o, took) = wait_within(a, Duration::from_secs(20), "a's client");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a's copy must fail: {err}");
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("credential revoked"), "{err}");
    eprintln!("a's client ended {took:?} after SIGHUP");
    // Under A's final names: each file absent or complete, and not all of them there.
    let mut absent = 0;
    for i in 0..24 {
        let name = format!("f{i:02}");
        match std::fs::read(dest_a.join(&name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
            Err(e) => panic!("{name}: {e}"),
            Ok(got) => assert!(
                got == std::fs::read(src_a.join(&name)).unwrap(),
                "{name} is under its final name but incomplete"
            ),
        }
    }
    assert!(absent > 0, "a's copy ended before the reload");
    no_partial_files(&src_a, &dest_a);

    // B's session went on to the end, byte for byte.
    let (o, _) = wait_within(b, Duration::from_secs(120), "b's client");
    ok(&o);
    same(&b_file, &b_dest.join("b-big"));

    // C gets in now; A no longer does.
    let f = dir.join("c-file");
    write_file(&f, 9, 100_000, 0o644, 1_600_000_000);
    ok(&run_cp(
        &[s(&f), &srv.url("data/c-file")],
        &st.kh,
        "c",
        ("--token-file", &c_token),
    ));
    same(&f, &st.data.join("c-file"));
    let o = run_cp(
        &[s(&f), &srv.url("data/a-again")],
        &st.kh,
        "a",
        ("--token-file", &a_token),
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!st.data.join("a-again").exists());

    // The reload is logged with what changed, and the session's end with why.
    let l = read_log(&st.log);
    assert!(l.contains("users added: \"c\""), "{l}");
    assert!(l.contains("users removed: \"a\""), "{l}");
    // One line per failed session, carrying peer, user, op and error (no second
    // "session with PEER failed" line).
    assert_eq!(l.matches("credential revoked").count(), 1, "{l}");
    let line = l
        .lines()
        .find(|x| x.contains("credential revoked"))
        .unwrap();
    for field in ["session failed", "peer=", "user=\"a\"", "op=\"push\""] {
        assert!(line.contains(field), "{line}");
    }
}

#[test]
fn a_broken_file_on_sighup_keeps_the_users_that_were() {
    let st = setup();
    let dir = st.t.path();
    let a_token = dir.join("a.token");
    let a_line = credential("token", &a_token);
    let good = config(&st.data, &[("a", &a_line, "rw")]);
    std::fs::write(&st.config, &good).unwrap();
    let mut srv = Server::start_with(
        &["--config".as_ref(), st.config.as_os_str()],
        &st.data,
        Some(&st.log),
        None,
    );
    let f = dir.join("f");
    write_file(&f, 3, 50_000, 0o644, 1_600_000_000);
    let url = srv.url("data");
    let copy = |name: &str| {
        run_cp(
            &[s(&f), &format!("{url}/{name}")],
            &st.kh,
            "a",
            ("--token-file", &a_token),
        )
    };

    // Not TOML, then TOML that names an export that does not exist.
    let broken = [
        format!("{good}\n[users.b\n"),
        good.replace("data = \"rw\"", "nowhere = \"rw\""),
    ];
    for (i, text) in broken.iter().enumerate() {
        std::fs::write(&st.config, text).unwrap();
        sighup(&srv);
        assert!(
            eventually(Duration::from_secs(10), || {
                read_log(&st.log)
                    .matches("failed, the users and exports stay")
                    .count()
                    > i
            }),
            "{}",
            read_log(&st.log)
        );
        assert!(srv.child.try_wait().unwrap().is_none(), "the server exited");
        let name = format!("f{i}");
        ok(&copy(&name));
        same(&f, &st.data.join(&name));
    }
    let l = read_log(&st.log);
    assert!(l.contains("server.toml"), "the error names the file: {l}");
    assert!(l.contains("no export named \"nowhere\""), "{l}");
    srv.kill();
}

#[test]
fn a_removed_key_ends_its_pull_and_the_same_users_token_session_goes_on() {
    let st = setup();
    let dir = st.t.path();
    let (token, key) = (dir.join("u.token"), dir.join("u.key"));
    let (token_line, key_line) = (credential("token", &token), credential("key", &key));
    std::fs::write(
        &st.config,
        config(&st.data, &[("u", &format!("{token_line}{key_line}"), "rw")]),
    )
    .unwrap();
    let srv = Server::start_with(
        &[
            "--config".as_ref(),
            st.config.as_os_str(),
            "--io-threads".as_ref(),
            "4".as_ref(),
            "--debug-chunk-delay-ms".as_ref(),
            "500".as_ref(),
        ],
        &st.data,
        Some(&st.log),
        None,
    );
    // The pull (with the key) has 16 files of 4 MiB, the push (with the token) 64 MiB.
    let tree = st.data.join("tree");
    for i in 0..16 {
        write_file(
            &tree.join(format!("g{i:02}")),
            200 + i,
            4 << 20,
            0o644,
            1_600_000_000,
        );
    }
    let pulled = dir.join("pulled");
    let big = dir.join("big");
    write_file(&big, 11, 64 << 20, 0o644, 1_600_000_000);
    let writing = |dir: &Path| {
        staging_files(dir).iter().any(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".dmv.journal")
        })
    };
    // The push first, then the pull once the push writes: the disk threads take the
    // sessions' chunks first come, first served, and the pull's reads, queued first,
    // could hold every thread until they are done.
    let mut push = spawn_cp(
        &["--chunk", "1M", s(&big), &srv.url("data/big")],
        &st.kh,
        "u",
        ("--token-file", &token),
    );
    let push_started = eventually(Duration::from_secs(30), || writing(&st.data));
    let mut pull = spawn_cp(
        &["--chunk", "1M", &srv.url("data/tree"), s(&pulled)],
        &st.kh,
        "u",
        ("--key", &key),
    );
    let started = push_started && eventually(Duration::from_secs(30), || writing(&pulled));
    if !started {
        let _ = pull.kill();
        let o = pull.wait_with_output().unwrap();
        panic!(
            "the transfers did not start; pull: {}\nserver log:\n{}",
            stderr(&o),
            read_log(&st.log)
        );
    }
    assert!(
        pull.try_wait().unwrap().is_none(),
        "the pull is still running"
    );
    assert!(
        push.try_wait().unwrap().is_none(),
        "the push is still running"
    );

    // The key is removed; the token stays.
    std::fs::write(&st.config, config(&st.data, &[("u", &token_line, "rw")])).unwrap();
    sighup(&srv);

    let (o, _) = wait_within(pull, Duration::from_secs(20), "the pull");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("credential revoked"), "{err}");
    assert!(err.contains("key"), "{err}");
    // Under the pull's final names: each file absent or complete, not all there.
    let mut absent = 0;
    for i in 0..16 {
        let name = format!("g{i:02}");
        match std::fs::read(pulled.join(&name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
            Err(e) => panic!("{name}: {e}"),
            Ok(got) => assert!(
                got == std::fs::read(tree.join(&name)).unwrap(),
                "{name} is under its final name but incomplete"
            ),
        }
    }
    assert!(absent > 0, "the pull ended before the reload");

    let (o, _) = wait_within(push, Duration::from_secs(120), "the push");
    ok(&o);
    same(&big, &st.data.join("big"));
    let l = read_log(&st.log);
    assert!(l.contains("users changed: \"u\""), "{l}");
}

/// `dmover serve --check` (issue 47, item 5): 0 and one line for a good file, with a
/// warning naming the new spelling of each older one; 2 with the key and its line for
/// a bad one; it neither listens nor writes a key. A server started from the file takes
/// the settings that were flags only (`read_only` here refuses a push).
#[test]
fn serve_check_names_the_key_and_line_and_the_file_holds_the_former_flags() {
    let t = tmp();
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let tok = t.path().join("alice.token");
    let line = credential("token", &tok);
    let users = config(&data, &[("alice", &line, "rw")]);
    let state = t.path().join("state");
    let path = t.path().join("server.toml");
    let check = |text: &str| -> Output {
        std::fs::write(&path, text).unwrap();
        Command::new(bin())
            .args(["serve", "--check", "--config", s(&path), "--state-dir"])
            .arg(&state)
            .output()
            .unwrap()
    };
    // Six lines, so that a seventh is the one at fault below.
    let head = "read_only = true\nmemory = \"64M\"\nio_threads = 2\nnet_threads = 2\n\
                tcp_buffer = \"4M\"\nhandshake_timeout = \"10s\"\n";
    let good = format!("{head}idle_timeout_secs = 120\nmax_manifest_bytes = 8589934592\n{users}");
    let o = check(&good);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(": OK: 1 exports, 1 users, would listen on [::]:7700"),
        "{out}"
    );
    let e = stderr(&o);
    assert!(e.contains("write idle_timeout = \"2m\""), "{e}");
    assert!(e.contains("write max_manifest_bytes = \"8G\""), "{e}");
    assert!(!state.exists(), "--check wrote a key");
    let missing = config(&t.path().join("missing"), &[("alice", &line, "rw")]);
    for (text, words) in [
        (
            format!("{head}max_session = 3\n{users}"),
            ["line 7", "max_session"],
        ),
        (
            format!("{head}idle_timeout = 120\n{users}"),
            ["line 7", "a duration with a unit"],
        ),
        (
            format!("{head}manifest_memory = \"4 parsecs\"\n{users}"),
            ["line 7", "manifest_memory"],
        ),
        (missing, ["exports.data (line 1)", "missing"]),
        (
            format!("{head}{users}").replace("= \"rw\"", "= \"rw\", other = \"ro\""),
            ["no export named \"other\"", "[users.alice] at line 10"],
        ),
    ] {
        let o = check(&text);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{text}: {e}");
        for w in words {
            assert!(e.contains(w), "{text}: no {w:?} in {e}");
        }
        // A normal start with the same file stops the same way: exit 2, before
        // listening.
        if words[1] == "missing" {
            continue; // checked by --check only: the server makes nothing at start
        }
        let mut child = Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config", s(&path)])
            .arg("--state-dir")
            .arg(&state)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{text}: the server started");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(2), "{text}: a normal start");
    }
    // The file's read_only holds.
    std::fs::write(&path, &good).unwrap();
    let args: Vec<&std::ffi::OsStr> = vec!["--config".as_ref(), path.as_os_str()];
    let srv = Server::start_with(&args, &data, None, None);
    let src = t.path().join("src");
    make_small_files(&src, 3, 1);
    let kh = t.path().join("kh");
    let o = run_cp(
        &[s(&src), &srv.url("data/")],
        &kh,
        "alice",
        ("--token-file", &tok),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
}
