//! Fault injection (issue 6): processes killed mid-transfer and resumed, data streams
//! cut, a full destination file system, source files changing or vanishing during a
//! transfer, silent peers, and many clients at once. Every check is byte for byte.
//!
//! `DMOVER_FAULT_ITERATIONS=N` runs the kill-and-resume harness N times (default 20);
//! `DMOVER_FAULT_SEED` replays a run's random choices; `DMOVER_TEST_LOG_DIR=DIR` keeps
//! the servers' logs there.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-faults-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Small deterministic generator for the harness's random choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A mixed tree: 200 small files in 4 directories, three multi-chunk files (at 64 KiB
/// chunks), and every other kind of entry (empty files and directories, symlinks, odd
/// modes).
fn mixed_tree(p: &Path) {
    make_small_files(p, 200, 4);
    for i in 0..3u64 {
        write_file(
            &p.join(format!("big{i}")),
            70 + i,
            (2 << 20) + 4097 * i as usize,
            0o644,
            1_700_000_000,
        );
    }
    make_tree(&p.join("kinds"));
}

/// Every `.dmv.*` name under `dir` (staging files and journals).
fn debris(dir: &Path) -> Vec<PathBuf> {
    staging_files(dir)
}

/// `dmover cp ARGS` in the background, with a known-hosts file of its own under `t`.
fn spawn_cp(t: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .arg("cp")
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[derive(Default, Debug)]
struct Tally {
    iterations: u64,
    interrupted: u64,
    resumed_bytes: u64,
    resumes_that_saved: u64,
    lost: u64,
    corrupted: u64,
}

/// One kill-and-resume round: start a copy, SIGKILL the client or the server at a
/// random point, restart what was killed, resume, check every byte.
fn kill_round(rng: &mut Rng, src: &Path, t: &Path, round: u64, tally: &mut Tally) {
    let push = rng.below(2) == 0;
    let kill_server = rng.below(2) == 0;
    let delay = rng.below(1500);
    let root = t.join(format!("root{round}"));
    std::fs::create_dir_all(&root).unwrap();
    // Pull: the server serves the source's parent; push: the source is local and the
    // server's root receives it.
    let (serve_root, dest_parent) = if push {
        (root.clone(), root.clone())
    } else {
        (src.parent().unwrap().to_path_buf(), root.clone())
    };
    let mut srv = Server::start(&serve_root, &["--debug-chunk-delay-ms", "60"]);
    let args = |srv: &Server, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--quiet", "--chunk", "64K"]
            .iter()
            .chain(extra)
            .map(|x| x.to_string())
            .collect();
        if push {
            v.push(s(src).into());
            v.push(srv.url(""));
        } else {
            v.push(srv.url("src"));
            v.push(s(&dest_parent).into());
        }
        v
    };
    let a = args(&srv, &[]);
    let mut client = spawn_cp(t, &a.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(100 + delay));
    let finished_early = client.try_wait().unwrap().is_some();
    if kill_server {
        srv.kill();
    } else {
        let _ = client.kill();
    }
    let first = client.wait_with_output().unwrap();
    if !finished_early && !first.status.success() {
        tally.interrupted += 1;
    }
    // Nothing incomplete is ever visible under a final name.
    let dest = dest_parent.join("src");
    if dest.exists() {
        no_partial_files(src, &dest);
    }
    if kill_server {
        srv = Server::start(&serve_root, &[]);
    }
    let a = args(&srv, &["--resume", "--json"]);
    let o = cp(&a.iter().map(String::as_str).collect::<Vec<_>>());
    tally.iterations += 1;
    if !o.status.success() {
        panic!(
            "round {round} ({} , killed the {}) : resume failed: {}",
            if push { "push" } else { "pull" },
            if kill_server { "server" } else { "client" },
            stderr(&o)
        );
    }
    let j = json(&o);
    let resumed = j["bytes_resumed"].as_u64().unwrap();
    tally.resumed_bytes += resumed;
    if resumed > 0 {
        tally.resumes_that_saved += 1;
    }
    match dmover_store::verify::compare_trees(src, &dest) {
        Ok(_) => {}
        Err(e) if e.contains("missing") || e.contains("No such") => {
            tally.lost += 1;
            panic!("round {round}: lost data: {e}");
        }
        Err(e) => {
            tally.corrupted += 1;
            panic!("round {round}: trees differ: {e}");
        }
    }
    let left = debris(&dest_parent);
    assert!(left.is_empty(), "round {round}: left behind {left:?}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn killed_client_or_server_then_resume_loses_and_corrupts_nothing() {
    let t = tmp();
    let src = t.path().join("data").join("src");
    mixed_tree(&src);
    let iterations: u64 = std::env::var("DMOVER_FAULT_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("DMOVER_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    eprintln!("kill harness: {iterations} rounds, seed {seed}");
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let started = Instant::now();
    for round in 0..iterations {
        kill_round(&mut rng, &src, t.path(), round, &mut tally);
    }
    eprintln!(
        "kill harness: {tally:?} in {:.1} s (seed {seed})",
        started.elapsed().as_secs_f64()
    );
    assert_eq!((tally.lost, tally.corrupted), (0, 0));
    assert!(
        tally.interrupted * 2 >= iterations,
        "most rounds must interrupt a transfer: {tally:?}"
    );
    assert!(
        tally.resumes_that_saved > 0,
        "some resume must have found data to keep: {tally:?}"
    );
}

#[test]
fn a_data_stream_cut_mid_transfer_is_survived() {
    // The server's data streams are cut by its fault injector (dmover_net::fault):
    // the one receiving in a push, the one sending in a pull.
    for (push, reset) in [(true, false), (true, true), (false, false), (false, true)] {
        let t = tmp();
        let root = t.path().join("root");
        let src = if push {
            t.path().join("src")
        } else {
            root.join("src")
        };
        mixed_tree(&src);
        std::fs::create_dir_all(&root).unwrap();
        // Cut after a megabyte and a bit: mid-frame, so at least one chunk is lost.
        let cut = format!("{}{}", (1 << 20) + 1000, if reset { ":reset" } else { "" });
        let srv = Server::start(
            &root,
            &[
                "--debug-chunk-delay-ms",
                "5",
                "--debug-cut-stream-after",
                &cut,
            ],
        );
        let dest = t.path().join("dest");
        let o = if push {
            cp(&["--json", "--chunk", "64K", s(&src), &srv.url("")])
        } else {
            cp(&["--json", "--chunk", "64K", &srv.url("src"), s(&dest)])
        };
        ok(&o);
        let j = json(&o);
        eprintln!("push={push} reset={reset}: {j}");
        assert!(j["streams_lost"].as_u64().unwrap() >= 1, "{j}");
        assert!(j["retries"].as_u64().unwrap() >= 1, "{j}");
        assert!(j["bytes_sent"].as_u64().unwrap() >= j["bytes"].as_u64().unwrap());
        let copy = if push { root.join("src") } else { dest };
        same(&src, &copy);
        assert_eq!(debris(t.path()), Vec::<PathBuf>::new());
    }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(dir: PathBuf, size: &str) -> Option<SmallFs> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: the full-disk test needs root to mount a tmpfs");
            return None;
        }
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status();
        match st {
            Ok(st) if st.success() => Some(SmallFs(dir)),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs ({other:?})");
                None
            }
        }
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_destination_fails_clearly_keeps_the_journal_and_resumes() {
    let t = tmp();
    let src = t.path().join("src");
    mixed_tree(&src);
    // Push to a server whose root is 4 MiB; then pull into a 4 MiB destination.
    let Some(small) = SmallFs::mount(t.path().join("small"), "4m") else {
        return;
    };
    let srv = Server::start(&small.0, &[]);
    let o = cp(&["--quiet", "--chunk", "64K", s(&src), &srv.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("No space left on device"), "{e}");
    assert!(e.contains("src/"), "the error names the file: {e}");
    no_partial_files(&src, &small.0.join("src"));
    let journals: Vec<_> = debris(&small.0)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".dmv.journal.")
        })
        .collect();
    assert_eq!(journals.len(), 1, "the journal is kept");
    // Room again: the copy resumes.
    small.resize("64m");
    let o = cp(&[
        "--json",
        "--resume",
        "--chunk",
        "64K",
        s(&src),
        &srv.url(""),
    ]);
    ok(&o);
    same(&src, &small.0.join("src"));
    assert_eq!(debris(&small.0), Vec::<PathBuf>::new());
    drop(srv);
    drop(small);

    let root = t.path().join("root");
    mixed_tree(&root.join("src"));
    let src = root.join("src");
    let srv = Server::start(&root, &[]);
    let Some(small) = SmallFs::mount(t.path().join("small2"), "4m") else {
        return;
    };
    let o = cp(&["--quiet", "--chunk", "64K", &srv.url("src"), s(&small.0)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("No space left on device"), "{e}");
    no_partial_files(&src, &small.0.join("src"));
    small.resize("64m");
    ok(&cp(&[
        "--quiet",
        "--resume",
        "--chunk",
        "64K",
        &srv.url("src/"),
        s(&small.0),
    ]));
    same(&src, &small.0.join("src"));
    assert_eq!(debris(&small.0), Vec::<PathBuf>::new());
}

/// A pull from a slow server whose source tree is changed by `change` once data has
/// started to arrive.
fn pull_while_changing(
    extra: &[&str],
    change: impl FnOnce(&Path),
) -> (
    tempfile::TempDir,
    PathBuf,
    PathBuf,
    std::process::Output,
    Server,
) {
    let t = tmp();
    let root = t.path().join("root");
    let src = root.join("src");
    make_small_files(&src, 40, 2);
    write_file(&src.join("zz-grow"), 9, 8 << 20, 0o644, 1_700_000_000);
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "40"]);
    let dest = t.path().join("dest");
    let mut args = vec!["--chunk", "64K", "--json"];
    args.extend_from_slice(extra);
    let url = srv.url("src");
    args.push(&url);
    args.push(s(&dest));
    let client = spawn_cp(t.path(), &args);
    assert!(
        wait_for(Duration::from_secs(20), || !staging_files(&dest).is_empty()),
        "no data arrived"
    );
    change(&src);
    let o = client.wait_with_output().unwrap();
    (t, src, dest, o, srv)
}

fn append(p: &Path, n: usize) {
    let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
    f.write_all(&bytes(77, n)).unwrap();
}

#[test]
fn a_source_file_appended_to_during_the_transfer() {
    // Default: the transfer stops, naming the file; nothing partial is visible; a
    // resume then sends the file whole, as it is now.
    let (_t, src, dest, o, srv) =
        pull_while_changing(&[], |src| append(&src.join("zz-grow"), 100_000));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("zz-grow") && e.contains("changed"), "{e}");
    no_partial_files(&src, &dest);
    let o = cp(&[
        "--quiet",
        "--resume",
        "--chunk",
        "64K",
        &srv.url("src"),
        s(&dest),
    ]);
    ok(&o);
    same(&src, &dest);

    // With retries the transfer gets there by itself.
    let (_t, src, dest, o, _srv) =
        pull_while_changing(&["--retries", "3", "--retry-wait", "100ms"], |src| {
            append(&src.join("zz-grow"), 100_000)
        });
    ok(&o);
    let j = json(&o);
    assert!(j["attempts"].as_u64().unwrap() >= 2, "{j}");
    same(&src, &dest);
}

#[test]
fn a_source_file_that_vanishes_is_reported_and_the_rest_arrives() {
    // Default: stop cleanly, naming the file.
    let (_t, src, dest, o, _srv) = pull_while_changing(&[], |src| {
        std::fs::remove_file(src.join("zz-grow")).unwrap()
    });
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("zz-grow"), "{}", stderr(&o));
    no_partial_files(&src, &dest);

    // --continue-on-error: everything else arrives; the file is listed; exit 23 (a
    // partial copy, rsync's code).
    let (_t, src, dest, o, _srv) = pull_while_changing(&["--continue-on-error"], |src| {
        std::fs::remove_file(src.join("zz-grow")).unwrap()
    });
    assert_eq!(o.status.code(), Some(23), "{}", stderr(&o));
    let j = json(&o);
    let failed = j["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{j}");
    assert!(failed[0].as_str().unwrap().contains("zz-grow"), "{j}");
    assert!(!dest.join("zz-grow").exists());
    // Every other file arrived whole (the directory's mtime changed with the removal).
    assert_eq!(no_partial_files(&src, &dest), 40);
    assert_eq!(staging_files(&dest), Vec::<PathBuf>::new());
}

/// The `.dmv.journal.*` files under `dir`.
fn journals(dir: &Path) -> Vec<PathBuf> {
    debris(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".dmv.journal.")
        })
        .collect()
}

/// SIGTERM to a pull and SIGINT (Ctrl-C) to a push, once data is arriving: the copy
/// stops cleanly (exit 143 and 130, as a shell reports the signal), nothing incomplete
/// is under a final name, the destination keeps its journal, the message says to rerun
/// with --resume, and that rerun completes the copy.
#[test]
fn sigterm_and_sigint_stop_a_copy_cleanly_and_it_resumes() {
    let t = tmp();
    let root = t.path().join("root");
    let src = root.join("src");
    make_small_files(&src, 40, 2);
    write_file(&src.join("zz-big"), 9, 8 << 20, 0o644, 1_700_000_000);
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "40"]);
    let pulled = t.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    let pushed = root.join("pushed");
    std::fs::create_dir(&pushed).unwrap();
    let url = srv.url("src");
    let back = srv.url("pushed/");
    let cases = [
        (
            rustix::process::Signal::TERM,
            143,
            url.as_str(),
            s(&pulled),
            &pulled,
        ),
        (
            rustix::process::Signal::INT,
            130,
            s(&src),
            back.as_str(),
            &pushed,
        ),
    ];
    for (signal, code, from, to, dest) in cases {
        let copy = dest.join("src");
        // 2 MB/s: some 4 s for the whole copy.
        let args = ["--quiet", "--chunk", "64K", "--bwlimit", "16mbit", from, to];
        let client = spawn_cp(t.path(), &args);
        // A journal and a staging file: data is arriving; some 600 KB more of it.
        let under_way = || journals(dest).len() == 1 && debris(dest).len() > 1;
        assert!(
            wait_for(Duration::from_secs(20), under_way),
            "{signal:?}: no data arrived"
        );
        std::thread::sleep(Duration::from_millis(300));
        let pid = rustix::process::Pid::from_raw(client.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        let o = client.wait_with_output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{signal:?}: {e}");
        assert!(e.contains("interrupted by SIG"), "{signal:?}: {e}");
        assert!(e.contains("rerun with --resume"), "{signal:?}: {e}");
        assert!(
            no_partial_files(&src, &copy) < 41,
            "{signal:?}: the copy was complete before the signal"
        );
        assert_eq!(journals(dest).len(), 1, "{signal:?}: the journal is kept");
        // The staging files the journal does not describe are gone; a resume goes on.
        let args = ["--json", "--resume", "--chunk", "64K", from, to];
        let o = cp(&args);
        ok(&o);
        assert!(
            json(&o)["bytes_resumed"].as_u64().unwrap() > 0,
            "{signal:?}"
        );
        same(&src, &copy);
        assert_eq!(debris(dest), Vec::<PathBuf>::new(), "{signal:?}");
    }
    // A sync stopped so goes on when run again (a sync always resumes).
    let mirror = t.path().join("mirror");
    let sync_args = [
        "--quiet",
        "--chunk",
        "64K",
        "--bwlimit",
        "16mbit",
        &url,
        s(&mirror),
    ];
    let client = Command::new(bin())
        .arg("sync")
        .args(sync_args)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let under_way = || journals(t.path()).len() == 1 && debris(t.path()).len() > 1;
    assert!(
        wait_for(Duration::from_secs(20), under_way),
        "sync: no data arrived"
    );
    let pid = rustix::process::Pid::from_raw(client.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let o = client.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(143), "sync: {}", stderr(&o));
    assert!(
        stderr(&o).contains("run the same sync again"),
        "{}",
        stderr(&o)
    );
    no_partial_files(&src, &mirror);
    ok(&sync(&["--quiet", "--chunk", "64K", &url, s(&mirror)]));
    same(&src, &mirror);
    assert_eq!(debris(t.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_silent_server_is_detected_within_the_heartbeat_limit() {
    let t = tmp();
    let root = t.path().join("root");
    let src = root.join("src");
    make_small_files(&src, 40, 2);
    write_file(&src.join("big"), 9, 8 << 20, 0o644, 1_700_000_000);
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "40"]);
    let dest = t.path().join("dest");
    // 500 ms heartbeats: a peer silent for 4 intervals (2 s) is gone.
    let client = spawn_cp(
        t.path(),
        &[
            "--quiet",
            "--chunk",
            "64K",
            "--debug-heartbeat-ms",
            "500",
            &srv.url("src"),
            s(&dest),
        ],
    );
    assert!(wait_for(Duration::from_secs(20), || !staging_files(&dest).is_empty()));
    let pid = rustix::process::Pid::from_raw(srv.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let stopped = Instant::now();
    let o = client.wait_with_output().unwrap();
    let took = stopped.elapsed();
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("silent"), "{}", stderr(&o));
    // 4 intervals plus one of granularity, with a generous margin for a loaded machine.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    no_partial_files(&src, &dest);
}

#[test]
fn verify_rereads_what_was_written() {
    let t = tmp();
    let src = t.path().join("src");
    mixed_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let srv = Server::start(&root, &[]);
    ok(&cp(&["--quiet", "--verify", s(&src), &srv.url("")]));
    same(&src, &root.join("src"));
    let dest = t.path().join("dest");
    ok(&cp(&["--quiet", "--verify", &srv.url("src"), s(&dest)]));
    same(&src, &dest);
    let o = cp(&["--verify", "--no-checksum", s(&src), &srv.url("x")]);
    assert_eq!(o.status.code(), Some(2), "--verify needs checksums");
}

#[test]
fn thirty_two_clients_at_once() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--io-threads", "4"]);
    let trees: Vec<_> = (0..32)
        .map(|i| {
            let p = t.path().join(format!("src{i:02}"));
            make_small_files(&p, 40, 2);
            write_file(
                &p.join("big"),
                1000 + i,
                (1 << 20) + i as usize,
                0o644,
                1_700_000_000,
            );
            p
        })
        .collect();
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", srv.child.id()))
            .unwrap()
            .count()
    };
    let idle = threads();
    let children: Vec<_> = trees
        .iter()
        .map(|p| {
            spawn_cp(
                t.path(),
                &["--quiet", "-P", "2", "--chunk", "256K", s(p), &srv.url("")],
            )
        })
        .collect();
    let mut busiest = idle;
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut outputs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while children.iter().any(Option::is_some) && Instant::now() < deadline {
        busiest = busiest.max(threads());
        for c in children.iter_mut() {
            if c.as_mut()
                .is_some_and(|ch| ch.try_wait().unwrap().is_some())
            {
                outputs.push(c.take().unwrap().wait_with_output().unwrap());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(outputs.len(), 32, "all clients finished");
    for o in &outputs {
        ok(o);
    }
    assert_eq!(busiest, idle, "the server's thread count stays fixed");
    for p in &trees {
        same(p, &root.join(p.file_name().unwrap()));
    }
}

/// Starts `dmover serve` on a given address with the state (TLS key) of an earlier
/// server, to come back where a client retries.
fn serve_at(root: &Path, addr: &str, state: &Path, extra: &[&str]) -> Child {
    let mut c = Command::new(bin())
        .args(["serve", "--root"])
        .arg(root)
        .args(["--listen", addr, "--state-dir"])
        .arg(state)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = [0u8; 1];
    // Wait for the listen line.
    let out = c.stdout.as_mut().unwrap();
    while out
        .read(&mut line)
        .map(|n| n == 1 && line[0] != b'\n')
        .unwrap_or(false)
    {}
    c
}

#[test]
fn retries_resume_by_themselves_after_the_server_dies() {
    let t = tmp();
    let src = t.path().join("src");
    mixed_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut srv = Server::start(&root, &["--debug-chunk-delay-ms", "60"]);
    let addr = srv.addr.clone();
    let url = srv.url("");
    let client = spawn_cp(
        t.path(),
        &[
            "--json",
            "--chunk",
            "64K",
            "--retries",
            "10",
            "--retry-wait",
            "300ms",
            s(&src),
            &url,
        ],
    );
    assert!(wait_for(Duration::from_secs(20), || {
        debris(&root)
            .iter()
            .any(|p| p.to_string_lossy().contains("big"))
    }));
    std::thread::sleep(Duration::from_millis(1500));
    srv.kill();
    std::thread::sleep(Duration::from_millis(500));
    let mut again = serve_at(&root, &addr, srv.state.path(), &[]);
    let o = client.wait_with_output().unwrap();
    let _ = again.kill();
    let _ = again.wait();
    ok(&o);
    let j = json(&o);
    assert!(j["attempts"].as_u64().unwrap() >= 2, "{j}");
    assert!(j["bytes_sent"].as_u64().unwrap() > 0);
    same(&src, &root.join("src"));
    assert_eq!(debris(&root), Vec::<PathBuf>::new());
    eprintln!("{j}");
}
