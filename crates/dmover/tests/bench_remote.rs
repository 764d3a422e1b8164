//! `dmover bench remote` (issue 14): the real binary against a real server on loopback.
//! Workloads A and B read through the API give ordered percentiles, throughput and the
//! configured number of I/Os; the API writes new files (`StagedFile`s, uploaded at
//! close), alone and beside reads; `--via mount` reads and writes through a real mount
//! (skipped without FUSE unless `DMOVER_REQUIRE_FUSE=1`); bad arguments exit 2; the
//! server's directory holds afterwards exactly what it held before (its mtime too), and
//! nothing stays mounted.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::SystemTime;

use common::*;
use serde_json::Value;

/// A server exporting `root`, whose `data` holds one file of the user's.
struct Setup {
    t: tempfile::TempDir,
    server: Server,
}

impl Setup {
    fn new() -> Setup {
        let t = tempfile::Builder::new()
            .prefix("dmover-bench-remote-test-")
            .tempdir()
            .unwrap();
        let data = t.path().join("root/data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("keep"), b"the user's").unwrap();
        set_dir_meta(&data, 0o755, 1_600_000_000);
        let server = Server::start(&t.path().join("root"), &[]);
        Setup { t, server }
    }

    fn bench(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(["bench", "remote"])
            .args(args)
            .env_remove("DMOVER_TOKEN")
            .env_remove("DMOVER_KEY")
            .env_remove("DMOVER_USER")
            .env("DMOVER_KNOWN_HOSTS", known_hosts_in(self.t.path()))
            .output()
            .expect("running dmover bench remote")
    }

    /// The server's `data` holds only the user's file, with its old mtime.
    fn assert_clean(&self) {
        let data = self.t.path().join("root/data");
        let names: Vec<String> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["keep"], "left on the server");
        let mtime = std::fs::metadata(&data).unwrap().modified().unwrap();
        assert_eq!(
            mtime
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            1_600_000_000,
            "the directory's mtime was not given back"
        );
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        // This server's mounts (the tests run at once: others may have theirs).
        let fsname = format!("dmover://{}/", self.server.addr);
        assert!(!info.contains(&fsname), "a bench mount is left: {info}");
    }
}

/// The rows of a `--json` run.
fn rows(o: &Output) -> Vec<Value> {
    ok(o);
    json(o)["rows"].as_array().unwrap().clone()
}

fn f(r: &Value, k: &str) -> f64 {
    r[k].as_f64()
        .unwrap_or_else(|| panic!("no number {k} in {r}"))
}

/// Percentiles ordered, throughput positive, no errors.
fn sane(r: &Value) {
    let p = ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"].map(|k| f(r, k));
    assert!(p[0] > 0.0, "{r}");
    assert!(p.windows(2).all(|w| w[0] <= w[1]), "unordered: {r}");
    assert!(f(r, "mib_per_s") > 0.0 && f(r, "iops") > 0.0, "{r}");
    assert_eq!(f(r, "errors"), 0.0, "{r}");
    if r["op"] != "close" {
        assert_eq!(f(r, "bytes"), f(r, "ops") * f(r, "block"), "{r}");
    }
}

#[test]
fn workloads_a_and_b_read_through_the_api() {
    let s = Setup::new();
    let url = s.server.url("data");
    let common = ["--file-size", "256K", "--block", "4K", "--seconds", "20"];
    // A: one file, 50 random reads.
    let o = s.bench(
        &[&url, "--workload", "A", "--ops", "50", "--json"]
            .iter()
            .chain(&common)
            .copied()
            .collect::<Vec<_>>(),
    );
    let r = rows(&o);
    assert_eq!(r.len(), 1, "{r:?}");
    let r = &r[0];
    assert_eq!(
        (r["workload"].as_str(), r["op"].as_str()),
        (Some("A"), Some("read"))
    );
    assert_eq!(r["pattern"], "random");
    assert_eq!((f(r, "files"), f(r, "ops")), (1.0, 50.0));
    assert!(
        f(r, "seconds") < 20.0,
        "the run did not stop after its I/Os: {r}"
    );
    sane(r);
    s.assert_clean();

    // B: ten files, two sessions, two I/Os in flight per file, sequential, CSV and a
    // plot too.
    let csv = s.t.path().join("b.csv");
    let plot = s.t.path().join("b.svg");
    let o = s.bench(&[
        &url,
        "--workload",
        "b",
        "--clients",
        "2",
        "--queue-depth",
        "2",
        "--pattern",
        "sequential",
        "--ops",
        "5",
        "--csv",
        csv.to_str().unwrap(),
        "--file-size",
        "256K",
        "--block",
        "64K",
        "--seconds",
        "20",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    ok(&o);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("latency per I/O") && svg.contains("p99.9"),
        "{}",
        &svg[..svg.len().min(300)]
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("p99.9 µs") && table.contains("read"),
        "{table}"
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert!(lines.next().is_none(), "{text}");
    let col = |k: &str| row[head.iter().position(|h| *h == k).unwrap()];
    assert_eq!(col("workload"), "B");
    assert_eq!(col("files"), "10");
    assert_eq!(col("clients"), "2");
    assert_eq!(col("pattern"), "sequential");
    assert_eq!(col("ops"), (10 * 2 * 2 * 5).to_string());
    let p: Vec<f64> = ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"]
        .iter()
        .map(|k| col(k).parse().unwrap())
        .collect();
    assert!(p.windows(2).all(|w| w[0] <= w[1]), "{text}");
    assert!(col("mib_per_s").parse::<f64>().unwrap() > 0.0, "{text}");
    s.assert_clean();
}

/// The number of entries the run said it removed with its test directory.
fn removed(o: &Output) -> u64 {
    let err = stderr(o);
    let (_, rest) = err
        .split_once("removed the test directory from the server (")
        .unwrap_or_else(|| panic!("no removal reported: {err}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn workload_a_writes_through_the_api() {
    // Two clients, two slots per file, 8 writes of 64 KiB each: every slot writes two
    // whole files of 256 KiB (each `write_at` a `write` row I/O) and uploads each at
    // its close (a `close` row I/O of 256 KiB).
    let s = Setup::new();
    let csv = s.t.path().join("w.csv");
    let o = s.bench(&[
        &s.server.url("data"),
        "--workload",
        "A",
        "--mix",
        "write",
        "--clients",
        "2",
        "--queue-depth",
        "2",
        "--file-size",
        "256K",
        "--block",
        "64K",
        "--ops",
        "8",
        "--seconds",
        "60",
        "--csv",
        csv.to_str().unwrap(),
        "--json",
    ]);
    let r = rows(&o);
    let ops: Vec<&str> = r.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "close"], "{r:?}");
    for r in &r {
        assert_eq!(r["via"], "api");
        assert_eq!((f(r, "files"), f(r, "clients")), (1.0, 2.0), "{r}");
        sane(r);
    }
    let slots = 2 * 2;
    assert_eq!(f(&r[0], "ops"), (slots * 8) as f64, "{r:?}");
    assert_eq!(f(&r[0], "block"), (64 << 10) as f64);
    assert_eq!(f(&r[1], "ops"), (slots * 2) as f64, "{r:?}");
    assert_eq!(f(&r[1], "bytes"), (slots * 2 * (256 << 10)) as f64, "{r:?}");
    assert_eq!(f(&r[1], "block"), 0.0, "a close has no block");
    // What was uploaded was on the server: the test directory, r/, w/ and the 8 files.
    assert_eq!(removed(&o), 3 + 8, "{}", stderr(&o));
    // The CSV has the mount's columns and rows.
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("rtt_ms,workload,via,op,"), "{text}");
    assert!(lines[1].contains(",api,write,"), "{text}");
    assert!(lines[2].contains(",api,close,"), "{text}");
    s.assert_clean();
}

#[test]
fn workload_b_reads_and_writes_through_the_api_at_once() {
    // 50/50: the ten files read (4 reads per slot) while ten writers (4 writes of 64
    // KiB per slot: one whole file each, uploaded once) write new ones beside them.
    let s = Setup::new();
    let o = s.bench(&[
        &s.server.url("data"),
        "--workload",
        "B",
        "--via",
        "api",
        "--mix",
        "50/50",
        "--file-size",
        "256K",
        "--block",
        "64K",
        "--ops",
        "4",
        "--seconds",
        "60",
        "--json",
    ]);
    let r = rows(&o);
    let ops: Vec<&str> = r.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["read", "write", "close"], "{r:?}");
    for r in &r {
        assert_eq!(r["via"], "api");
        assert_eq!(f(r, "files"), 10.0);
        sane(r);
    }
    assert_eq!(f(&r[0], "ops"), 40.0);
    assert!(r[0]["chunks_received"].as_u64().is_some(), "{}", r[0]);
    assert_eq!(f(&r[1], "ops"), 40.0);
    assert_eq!(f(&r[2], "ops"), 10.0, "one whole file per writer: {r:?}");
    assert_eq!(f(&r[2], "bytes"), (10 * (256 << 10)) as f64);
    assert!(r[1].get("chunks_received").is_none(), "{}", r[1]);
    // The test directory, r/, w/, the ten files read and the ten written.
    assert_eq!(removed(&o), 3 + 10 + 10, "{}", stderr(&o));
    s.assert_clean();
}

/// Whether this test can mount (as tests/mount.rs decides).
fn fuse_available(test: &str) -> bool {
    let why = if !Path::new("/dev/fuse").exists() {
        Some("no /dev/fuse")
    } else if !rustix::process::geteuid().is_root() {
        Some("not root")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var_os("DMOVER_REQUIRE_FUSE").is_some_and(|v| v == "1") => {
            panic!("{test}: DMOVER_REQUIRE_FUSE=1 but FUSE cannot be used: {why}")
        }
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

#[test]
fn reads_and_writes_through_the_mount() {
    if !fuse_available("reads_and_writes_through_the_mount") {
        return;
    }
    let s = Setup::new();
    let o = s.bench(&[
        &s.server.url("data"),
        "--workload",
        "A",
        "--via",
        "mount",
        "--mix",
        "50/50",
        "--file-size",
        "256K",
        "--block",
        "64K",
        "--ops",
        "8",
        "--seconds",
        "20",
        "--json",
    ]);
    let r = rows(&o);
    let ops: Vec<&str> = r.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["read", "write", "close"], "{r:?}");
    for r in &r {
        assert_eq!(r["via"], "mount");
        sane(r);
    }
    assert_eq!(f(&r[0], "ops"), 8.0);
    assert_eq!(f(&r[1], "ops"), 8.0);
    // 8 writes of 64 KiB: two whole files of 256 KiB, each closed (uploaded) once.
    assert_eq!(f(&r[2], "ops"), 2.0, "{r:?}");
    assert_eq!(f(&r[2], "bytes"), (512 << 10) as f64);
    s.assert_clean();
}

#[test]
fn bad_arguments_exit_2_and_touch_nothing() {
    let s = Setup::new();
    let url = s.server.url("data");
    for args in [
        vec![url.as_str()],
        vec![&url, "--workload", "E"],
        vec![&url, "--workload", "A", "--timeout", "500ms"],
        vec![&url, "--workload", "A", "--timeout", "soon"],
        vec![
            &url,
            "--workload",
            "A",
            "--block",
            "1M",
            "--file-size",
            "4K",
        ],
        vec![&url, "--workload", "A", "--seconds", "0"],
        vec![&url, "--workload", "A", "--queue-depth", "0"],
        vec!["/tmp", "--workload", "A"],
        vec![&url, "--workload", "A", "--via", "dir"],
        vec![&url, "--workload", "A", "--dir", "/tmp"],
        vec![&s.server.url(""), "--workload", "A"],
        vec![&url, "--workload", "A", "--rtt", "10"],
        vec![&url, "--workload", "A", "--rate", "1gbit"],
        vec![
            "--workload",
            "A",
            "--rtt",
            "10",
            "--via",
            "dir",
            "--dir",
            "/tmp",
        ],
    ] {
        let o = s.bench(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    // A directory that is not there: a clear error (exit 1), nothing made.
    let o = s.bench(&[&s.server.url("nothere"), "--workload", "A"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no such file or directory"),
        "{}",
        stderr(&o)
    );
    s.assert_clean();
    assert!(!s.t.path().join("root/nothere").exists());
}

#[test]
fn interrupted_run_cleans_up() {
    let s = Setup::new();
    let via = if fuse_available("interrupted_run_cleans_up (through the mount)") {
        "mount"
    } else {
        "api"
    };
    let mut child = Command::new(bin())
        .args(["bench", "remote", &s.server.url("data")])
        .args(["--workload", "B", "--file-size", "256K", "--seconds", "60"])
        .args(["--via", via])
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(s.t.path()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the test files are on the server and the run has begun.
    let data = s.t.path().join("root/data");
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&data).unwrap().count() < 2 {
        assert!(t0.elapsed().as_secs() < 30, "no test directory appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let t1 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t1.elapsed().as_secs() > 20 {
            let _ = child.kill();
            panic!("still running 20 s after SIGINT");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(err.contains("removed the test directory"), "{err}");
    s.assert_clean();
}

#[test]
fn the_same_workload_on_the_servers_own_disk() {
    // `--via dir`: plain file I/O in another view of the target (here the server's own
    // directory), the comparison column for sshfs or local disk.
    let s = Setup::new();
    let data = s.t.path().join("root/data");
    let o = s.bench(&[
        &s.server.url("data"),
        "--workload",
        "B",
        "--via",
        "dir",
        "--dir",
        data.to_str().unwrap(),
        "--mix",
        "50/50",
        "--file-size",
        "128K",
        "--block",
        "32K",
        "--ops",
        "4",
        "--json",
    ]);
    let r = rows(&o);
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(f(&r[0], "ops"), 40.0);
    assert_eq!(f(&r[1], "ops"), 40.0);
    assert_eq!(f(&r[2], "ops"), 10.0, "one whole file per writer");
    for r in &r {
        assert_eq!(r["via"], "dir");
        sane(r);
    }
    s.assert_clean();
}

#[test]
fn over_an_emulated_link() {
    if !netlab_available("over_an_emulated_link") {
        return;
    }
    // No TARGET: the command makes a lab, a server in its far namespace and runs
    // itself in the near one; a sequential read of the one file, 8 reads.
    let t = tempfile::tempdir().unwrap();
    let child = Command::new(bin())
        .args(["bench", "remote", "--rtt", "20", "--workload", "A"])
        .args([
            "--file-size",
            "1M",
            "--block",
            "128K",
            "--pattern",
            "sequential",
        ])
        .args(["--ops", "8", "--seconds", "30", "--json"])
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lab = format!("brem{}", child.id());
    let o = child.wait_with_output().unwrap();
    let r = rows(&o);
    assert_eq!(r.len(), 1);
    let r = &r[0];
    assert_eq!(f(r, "rtt_ms"), 20.0);
    assert_eq!(f(r, "ops"), 8.0);
    sane(r);
    // The first read waits for the link at least once: one round trip or more.
    assert!(f(r, "max_us") >= 20_000.0, "{r}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&netns.stdout).contains(&lab),
        "a lab namespace is left: {}",
        String::from_utf8_lossy(&netns.stdout)
    );
}
