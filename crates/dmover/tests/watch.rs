//! `dmover sync --watch`, end to end: the real binary watching a real tree while a
//! writer adds files, against a real server on loopback that is killed and restarted,
//! as is the watcher. Every file arrives, intact, under its final name only.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `--quiet-time` of these tests: longer than the writer's pause between two opens.
const QUIET: &str = "400ms";

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-watch-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `dmover sync --watch` process, killed when dropped (also when a test fails).
struct Watcher {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Watcher {
    fn start(dir: &Path, n: u32, args: &[&str]) -> Watcher {
        let out = dir.join(format!("watch-{n}.out"));
        let err = dir.join(format!("watch-{n}.err"));
        let child = Command::new(bin())
            .args(["sync", "--watch", "--json", "--quiet-time", QUIET])
            .args(args)
            .env_remove("DMOVER_TOKEN")
            .env_remove("DMOVER_KEY")
            .env_remove("DMOVER_USER")
            .env("DMOVER_KNOWN_HOSTS", dir.join("known_hosts"))
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
            .spawn()
            .expect("starting dmover sync --watch");
        Watcher { child, out, err }
    }

    /// The ndjson lines so far.
    fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends `sig` and waits (at most 30 s) for the exit code.
    fn stop(&mut self, sig: rustix::process::Signal) -> Option<i32> {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, sig).unwrap();
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the watch did not stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `cond` every 100 ms for up to `secs`; panics with `what` (and `ctx()`).
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool, ctx: impl Fn() -> String) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}\n{}",
            ctx()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to `secs`) for `mirror` to be the same tree as `src` (contents, modes,
/// mtimes): the watch converges, the last batch may still be on its way.
fn wait_same(secs: u64, src: &Path, mirror: &Path, w: &Watcher) {
    let t = Instant::now();
    while let Err(e) = dmover_store::verify::compare_trees(src, mirror) {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "the trees still differ: {e}
{}",
            w.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// User and system CPU time of `child` so far, in clock ticks (/proc/PID/stat).
fn cpu_ticks(child: &Child) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(dir.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(r);
            } else {
                out.push(r.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Writes file `i` of the steady writer: most in one go; every fifth through a
/// temporary name renamed into place (as instruments do); file 7 in two opens with a
/// pause shorter than the quiet time; from file 30 on into a directory made mid-way.
fn write_one(src: &Path, i: u64) {
    use std::io::Write;
    let dir = if i >= 30 {
        src.join("later/deep")
    } else {
        src.to_path_buf()
    };
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("f{i:03}");
    let data = bytes(i + 1000, 1000 + (i as usize * 7919) % 150_000);
    if i == 7 {
        let p = dir.join(&name);
        let (a, b) = data.split_at(data.len() / 2);
        std::fs::File::create(&p).unwrap().write_all(a).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b)
            .unwrap();
    } else if i % 5 == 0 {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, &data).unwrap();
        std::fs::rename(&tmp, dir.join(&name)).unwrap();
    } else {
        std::fs::write(dir.join(&name), &data).unwrap();
    }
}

#[test]
fn watch_ships_every_file_once_through_restarts_of_both_ends() {
    let t = tmp();
    let dir = t.path();
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..5 {
        write_file(
            &src.join(format!("pre{i}")),
            i,
            20_000,
            0o644,
            1_700_000_000,
        );
    }
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let serve_args = ["--root".as_ref(), root.as_os_str()];
    let mut srv = Server::start_with(&serve_args, &root, None, Some(&state));
    let addr = srv.addr.clone();
    let url = srv.url("mirror");
    let mirror = root.join("mirror");
    let args = ["--chunk", "1M", s(&src), &url];

    let mut w = Watcher::start(dir, 1, &args);
    // The catch-up sync ships what was there before.
    wait_for(
        60,
        "the catch-up sync",
        || mirror.join("pre4").exists(),
        || w.stderr(),
    );

    // ~20 files/s; the server dies after file 20 and comes back on its address, the
    // watcher is killed (SIGKILL: no clean exit) after file 40 and started again.
    let mut srv_down = None;
    for i in 0..60u64 {
        write_one(&src, i);
        std::thread::sleep(Duration::from_millis(50));
        if i == 20 {
            srv.kill();
            srv_down = Some(Instant::now());
        }
        if i == 28 {
            srv = Server::start_on(&addr, &serve_args, &root, None, Some(&state));
        }
        if i % 10 == 9 {
            // Whatever is visible under a final name is whole, at any moment (the
            // restarted watcher's catch-up leaves files written just now to their
            // batch).
            no_partial_files(&src, &mirror);
        }
        if i == 40 {
            let _ = w.child.kill();
            let _ = w.child.wait();
            w = Watcher::start(dir, 2, &args);
        }
    }
    assert!(srv_down.is_some());

    // Everything arrives, byte-identical, and no temporary name ever did (without
    // --delete a name that arrived stays).
    let want = files(&src);
    assert_eq!(want.len(), 65);
    let ctx = || format!("{}\nhave {:?}", w.stderr(), files(&mirror));
    wait_for(
        90,
        "every file at the server",
        || files(&mirror) == want,
        ctx,
    );
    wait_same(30, &src, &mirror, &w);
    assert!(
        !files(&mirror).iter().any(|f| f.ends_with(".tmp")),
        "a temporary name arrived: {:?}",
        files(&mirror)
    );
    assert_eq!(no_partial_files(&src, &mirror), 65);
    assert!(
        staging_files(&mirror).is_empty(),
        "{:?}",
        staging_files(&mirror)
    );

    // The restarted watcher caught up, then shipped batches with their lag.
    let lines = w.lines();
    assert_eq!(lines[0]["type"], "watch_catch_up", "{lines:?}");
    assert!(
        lines.iter().any(|l| l["type"] == "watch_batch"),
        "{lines:?}"
    );
    for l in lines.iter().filter(|l| l["type"] == "watch_batch") {
        assert!(l["lag_max_ms"].as_u64().unwrap() >= l["lag_p50_ms"].as_u64().unwrap());
        assert_eq!(l["schema"], 1);
    }
    // The first watcher saw the server go and said it would retry.
    let first = std::fs::read_to_string(dir.join("watch-1.out")).unwrap();
    assert!(first.contains("\"watch_retry\""), "{first}");

    // SIGTERM: a clean stop, exit code 0.
    assert_eq!(
        w.stop(rustix::process::Signal::TERM),
        Some(0),
        "{}",
        w.stderr()
    );
    // A watcher started again sends nothing: all is durable at the server.
    let mut w3 = Watcher::start(dir, 3, &args);
    wait_for(
        60,
        "the catch-up",
        || !w3.lines().is_empty(),
        || w3.stderr(),
    );
    let l = &w3.lines()[0];
    assert_eq!(l["type"], "watch_catch_up");
    assert_eq!(l["bytes_sent"], 0, "{l}");
    assert_eq!(
        w3.stop(rustix::process::Signal::INT),
        Some(0),
        "{}",
        w3.stderr()
    );
}

#[test]
fn watch_with_delete_mirrors_deletions_and_renames() {
    let t = tmp();
    let dir = t.path();
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    write_file(&src.join("keep"), 1, 1000, 0o644, 1_700_000_000);
    write_file(&src.join("d/e/x"), 2, 1000, 0o644, 1_700_000_000);
    write_file(&src.join("g/y"), 3, 1000, 0o644, 1_700_000_000);
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let mirror = root.join("mirror");
    let url = srv.url("mirror");
    let mut w = Watcher::start(dir, 1, &["--delete", "--exclude", "*.skip", s(&src), &url]);
    wait_for(
        60,
        "the catch-up sync",
        || mirror.join("d/e/x").exists(),
        || w.stderr(),
    );

    std::fs::write(src.join("a"), b"a").unwrap();
    std::fs::write(src.join("n.skip"), b"excluded").unwrap();
    std::fs::write(src.join("b"), b"b").unwrap();
    wait_for(
        60,
        "a and b",
        || mirror.join("b").exists() && mirror.join("a").exists(),
        || w.stderr(),
    );
    assert!(
        !mirror.join("n.skip").exists(),
        "--exclude applies to the watch"
    );
    std::fs::remove_file(src.join("n.skip")).unwrap();
    std::fs::remove_file(src.join("a")).unwrap();
    std::fs::rename(src.join("b"), src.join("c")).unwrap();
    std::fs::remove_dir_all(src.join("d")).unwrap();
    // A directory renamed within the tree: watched under its new name, and a file
    // written into it afterwards ships there.
    std::fs::rename(src.join("g"), src.join("h")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(src.join("h/z"), b"z").unwrap();
    let ctx = || format!("{}\nhave {:?}", w.stderr(), files(&mirror));
    wait_for(
        60,
        "the deletions",
        || {
            !mirror.join("a").exists()
                && !mirror.join("b").exists()
                && mirror.join("c").exists()
                && !mirror.join("d").exists()
                && !mirror.join("g").exists()
                && mirror.join("h/y").exists()
                && mirror.join("h/z").exists()
        },
        ctx,
    );
    wait_same(30, &src, &mirror, &w);
    assert!(w.lines().iter().any(|l| l["deleted"].as_u64() > Some(0)));
    // An idle watch sleeps (no polling): well under a tenth of a core over 2 s.
    let before = cpu_ticks(&w.child);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(&w.child) - before;
    assert!(used < 20, "an idle watch used {used} ticks of CPU in 2 s");
    assert_eq!(
        w.stop(rustix::process::Signal::INT),
        Some(0),
        "{}",
        w.stderr()
    );
}

#[test]
fn watch_needs_a_local_source_and_is_a_sync_option() {
    let t = tmp();
    let kh = t.path().join("kh");
    let run = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .output()
            .unwrap()
    };
    let o = run(&["sync", "--watch", "host:src", s(t.path())]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("watch needs a local source"),
        "{}",
        stderr(&o)
    );
    let o = run(&["cp", "--watch", s(t.path()), "host:dst"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--watch"), "{}", stderr(&o));
    let o = run(&["sync", "--watch", "--dry-run", s(t.path()), "host:dst"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["sync", "--quiet-time", "1s", s(t.path()), "host:dst"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("sync --watch"), "{}", stderr(&o));
}
