//! Machine-readable output (docs/json.md): `dmover cp --progress ndjson` and `--json`,
//! a failed run's summary, and `dmover serve --log-format json`'s session lines. The
//! real binary against real servers on loopback.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-json-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every line of stdout, each parsed as JSON (panics on one that is not).
fn lines(o: &Output) -> Vec<Value> {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\n{out}")))
        .collect()
}

fn of_type<'a>(ls: &'a [Value], t: &str) -> Vec<&'a Value> {
    ls.iter().filter(|l| l["type"] == t).collect()
}

/// A tree of a few MiB: 40 small files and two of 1.5 MiB.
fn small_tree(root: &Path) {
    make_small_files(root, 40, 2);
    for i in 0..2 {
        write_file(
            &root.join(format!("big{i}")),
            90 + i,
            3 << 19,
            0o644,
            1_700_000_000,
        );
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, UTC, whole seconds).
fn assert_utc_timestamp(v: &Value) {
    let t = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    let b = t.as_bytes();
    assert_eq!(b.len(), 20, "{t}");
    for (i, c) in b.iter().enumerate() {
        match i {
            4 | 7 => assert_eq!(*c, b'-', "{t}"),
            10 => assert_eq!(*c, b'T', "{t}"),
            13 | 16 => assert_eq!(*c, b':', "{t}"),
            19 => assert_eq!(*c, b'Z', "{t}"),
            _ => assert!(c.is_ascii_digit(), "{t}"),
        }
    }
    assert!(t > "2020", "{t}");
}

/// The summary's fields as `--json` has always printed them, plus the schema, dmover's
/// version and when the run started and ended.
fn assert_summary_fields(j: &Value) {
    assert_eq!(j["schema"], 1, "{j}");
    assert_eq!(j["type"], "summary", "{j}");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"), "{j}");
    assert_utc_timestamp(&j["started"]);
    assert_utc_timestamp(&j["ended"]);
    // Same format, so the strings compare as the times do.
    assert!(j["started"].as_str() <= j["ended"].as_str(), "{j}");
    for f in [
        "ok",
        "direction",
        "bytes",
        "bytes_sent",
        "bytes_resumed",
        "files",
        "files_sent",
        "dirs",
        "symlinks",
        "seconds",
        "gbit_per_s",
        "files_per_s",
        "streams",
        "chunk",
        "verified",
        "skipped",
        "retries",
        "streams_lost",
        "attempts",
        "errors",
        "failed",
        "first_chunk_seconds",
        "steady_gbit_per_s",
        "bwlimit",
        "tuning",
    ] {
        assert!(j.get(f).is_some(), "the summary lacks {f}: {j}");
    }
}

#[test]
fn ndjson_progress_lines_are_monotone_and_end_with_the_summary() {
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // Slow storage on the server: the copy lasts long enough for several lines.
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "15"]);
    let o = cp(&[
        "--progress",
        "ndjson",
        "--progress-interval",
        "50ms",
        "--chunk",
        "64K",
        "-P",
        "2",
        s(&src),
        &srv.url(""),
    ]);
    ok(&o);
    same(&src, &root.join("src"));
    let ls = lines(&o);
    for l in &ls {
        assert_eq!(l["schema"], 1, "{l}");
    }
    let progress = of_type(&ls, "progress");
    assert!(!progress.is_empty(), "no progress line: {ls:?}");
    let mut last = (-1.0, 0, 0);
    for p in &progress {
        let (secs, bytes, files) = (
            p["seconds"].as_f64().unwrap(),
            p["bytes_sent"].as_u64().unwrap(),
            p["files"].as_u64().unwrap(),
        );
        assert!(secs > last.0, "seconds went back: {p} after {last:?}");
        assert!(bytes >= last.1, "bytes went back: {p} after {last:?}");
        assert!(files >= last.2, "files went back: {p} after {last:?}");
        last = (secs, bytes, files);
        assert_eq!(p["attempt"], 1, "{p}");
        assert_eq!(p["streams_lost"], 0, "{p}");
        for f in [
            "bytes_total",
            "bytes_resumed",
            "chunks",
            "bit_per_s",
            "avg_bit_per_s",
        ] {
            assert!(p.get(f).is_some(), "a progress line lacks {f}: {p}");
        }
    }
    // The last progress line, at the end: every file with data was sent.
    let files_with_data = regular_file_sizes(&src).iter().filter(|&&n| n > 0).count() as u64;
    assert_eq!(last.2, files_with_data, "{:?}", progress.last());
    // The totals are known once the walk is done (0 before: docs/json.md); the walk
    // and the connection run at once, so a busy machine prints a line before.
    for p in &progress {
        if p["files_total"] == 0 {
            assert_eq!(
                (&p["files"], &p["bytes_sent"]),
                (&0.into(), &0.into()),
                "{p}"
            );
        } else {
            assert_eq!(p["files_total"], files_with_data, "{p}");
        }
    }
    let j = ls.last().unwrap();
    assert_summary_fields(j);
    assert_eq!(j["ok"], true);
    assert_eq!(j["direction"], "push");
    assert_eq!(j["files"], 42);
    assert_eq!(j["attempts"], 1);
    // The last progress line counts what the summary does.
    let end = progress.last().unwrap();
    assert_eq!(end["bytes_sent"], j["bytes_sent"], "{end} vs {j}");
    assert_eq!(end["bytes_total"], j["bytes"], "{end} vs {j}");
    assert!(j["bytes_sent"].as_u64().unwrap() >= j["bytes"].as_u64().unwrap());
}

#[test]
fn a_self_tuning_copy_reports_its_tuner_both_ways() {
    // Without -P the source tunes (docs/tuning.md): 16 streams to choose from, 4 to
    // start with, and the start is an event in both directions (a pull hears it from
    // the server). With -P nothing is tuned.
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let back = t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let (to, from) = (srv.url(""), srv.url("src"));
    let runs: [(&str, [&str; 2]); 2] = [("push", [s(&src), &to]), ("pull", [&from, s(&back)])];
    for (dir, ends) in runs {
        let mut args = vec!["--progress", "ndjson", "--chunk", "64K"];
        args.extend(ends);
        let o = cp(&args);
        ok(&o);
        let ls = lines(&o);
        let tuning = of_type(&ls, "tuning");
        assert!(!tuning.is_empty(), "{dir}: no tuning line: {ls:?}");
        assert_eq!(tuning[0]["streams"], 4, "{dir}: {}", tuning[0]);
        assert!(
            tuning[0]["reason"]
                .as_str()
                .unwrap()
                .contains("starting with 4 of 16 streams"),
            "{dir}: {}",
            tuning[0]
        );
        let j = ls.last().unwrap();
        assert_eq!(j["direction"], dir);
        assert_eq!(j["streams"], 16, "{dir}: {j}");
        assert_eq!(j["tuning"]["of"], 16, "{dir}: {j}");
        let used = j["tuning"]["streams"].as_u64().unwrap();
        assert!((1..=16).contains(&used), "{dir}: {j}");
    }
    same(&src, &back.join("src"));
    let o = cp(&[
        "--progress",
        "ndjson",
        "-P",
        "3",
        s(&src),
        &srv.url("pinned"),
    ]);
    ok(&o);
    let ls = lines(&o);
    assert!(of_type(&ls, "tuning").is_empty(), "{ls:?}");
    let j = ls.last().unwrap();
    assert_eq!(j["streams"], 3, "{j}");
    assert!(j["tuning"].is_null(), "{j}");
}

/// Paths (relative to `base`) of the regular files with data under `dir`.
fn files_with_data(base: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            files_with_data(base, &p, out);
        } else if m.is_file() && m.len() > 0 {
            out.push(p.strip_prefix(base).unwrap().to_str().unwrap().to_string());
        }
    }
}

#[test]
fn ndjson_names_every_file_done_once_both_ways() {
    // `files_done` lines name the files whose last byte crossed, as they go: every
    // file with data once, under its path in the transfer, pushing and pulling.
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &["--debug-chunk-delay-ms", "5"]);
    let back = t.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let mut want = Vec::new();
    files_with_data(t.path(), &src, &mut want);
    want.sort();
    let (to, from) = (srv.url(""), srv.url("src"));
    let runs: [(&str, [&str; 2]); 2] = [("push", [s(&src), &to]), ("pull", [&from, s(&back)])];
    for (dir, ends) in runs {
        let mut args = vec![
            "--progress",
            "ndjson",
            "--progress-interval",
            "50ms",
            "--chunk",
            "64K",
            "-P",
            "2",
        ];
        args.extend(ends);
        let o = cp(&args);
        ok(&o);
        let ls = lines(&o);
        let mut got: Vec<String> = Vec::new();
        for l in of_type(&ls, "files_done") {
            let files = l["files"].as_array().unwrap();
            assert_eq!(l["count"], files.len(), "{dir}: {l}");
            assert_eq!(l["attempt"], 1, "{dir}: {l}");
            got.extend(files.iter().map(|f| f.as_str().unwrap().to_string()));
        }
        got.sort();
        assert_eq!(got, want, "{dir}");
        // The summary is still the last line.
        assert_eq!(ls.last().unwrap()["type"], "summary", "{dir}");
    }
}

#[test]
fn json_alone_prints_only_the_summary() {
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let o = cp(&["--json", s(&src), &srv.url("")]);
    ok(&o);
    let ls = lines(&o);
    assert_eq!(ls.len(), 1, "{ls:?}");
    assert_summary_fields(&ls[0]);
    assert_eq!(ls[0]["ok"], true);
    // The endpoints as the command named them.
    assert_eq!(ls[0]["source"], serde_json::json!([s(&src)]), "{}", ls[0]);
    assert_eq!(ls[0]["destination"], srv.url(""), "{}", ls[0]);
    // And without either, stdout stays empty.
    let o = cp(&["--quiet", s(&src), &srv.url("again")]);
    ok(&o);
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn bad_progress_options_are_usage_errors() {
    // (`--progress xml` is a bare --progress, the bar, before a path named xml:
    // issue 47's rsync habit; a mode is checked when written with `=`.)
    for bad in [
        &["--progress=xml"][..],
        &["--progress-interval", "5"],
        &["--progress-interval", "0s"],
        &["--progress-interval", "1ms"],
        &["--log-format", "yaml"],
    ] {
        let mut a = bad.to_vec();
        a.extend(["src", "localhost:dst"]);
        let o = cp(&a);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{bad:?}");
    }
}

#[test]
fn a_failed_pull_still_ends_with_a_summary() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let o = cp(&[
        "--progress",
        "ndjson",
        &srv.url("missing"),
        s(&t.path().join("dest")),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let ls = lines(&o);
    let j = ls.last().unwrap();
    assert_summary_fields(j);
    assert_eq!(j["ok"], false);
    assert_eq!(j["direction"], "pull");
    assert_eq!(j["source"], serde_json::json!([srv.url("missing")]), "{j}");
    assert_eq!(j["destination"], s(&t.path().join("dest")), "{j}");
    assert_eq!(j["attempts"], 1, "{j}");
    assert_eq!(j["errors"], 1);
    assert!(
        j["error"].as_str().unwrap().contains("missing"),
        "{}",
        j["error"]
    );
}

/// A client started by hand, its stdout and stderr captured.
fn spawn_cp(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(bin())
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(dir))
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env_remove("DMOVER_USER")
        .arg("cp")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

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

#[test]
fn a_server_killed_mid_pull_leaves_a_summary_of_what_was_done() {
    let t = tmp();
    let root = t.path().join("root");
    let src = root.join("src");
    make_small_files(&src, 100, 2);
    for i in 0..3 {
        write_file(
            &src.join(format!("big{i}")),
            50 + i,
            6 << 20,
            0o644,
            1_700_000_000,
        );
    }
    let mut srv = Server::start(&root, &["--debug-chunk-delay-ms", "30"]);
    let dest = t.path().join("dest");
    // One retry: the second attempt finds the server gone.
    let client = spawn_cp(
        t.path(),
        &[
            "--progress",
            "ndjson",
            "--progress-interval",
            "100ms",
            "--retries",
            "1",
            "--retry-wait",
            "100ms",
            "--chunk",
            "64K",
            &srv.url("src"),
            s(&dest),
        ],
    );
    assert!(
        wait_for(Duration::from_secs(20), || !staging_files(&dest).is_empty()),
        "no data arrived"
    );
    std::thread::sleep(Duration::from_millis(300));
    srv.kill();
    let o = client.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let ls = lines(&o);
    let j = ls.last().unwrap();
    assert_summary_fields(j);
    assert_eq!(j["ok"], false);
    assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{j}");
    // What it achieved before the server died, not zeros.
    assert!(j["bytes_sent"].as_u64().unwrap() > 0, "{j}");
    assert!(j["bytes"].as_u64().unwrap() > 18 << 20, "{j}");
    assert!(j["gbit_per_s"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["attempts"], 2, "{j}");
    // The retry was announced, and the progress lines name the attempt running.
    let retries = of_type(&ls, "retry");
    assert_eq!(retries.len(), 1, "{ls:?}");
    assert_eq!(retries[0]["attempt"], 1);
    assert_eq!(retries[0]["wait_seconds"], 0.1);
    assert!(retries[0]["error"].as_str().is_some_and(|e| !e.is_empty()));
    let attempts: Vec<u64> = of_type(&ls, "progress")
        .iter()
        .map(|p| p["attempt"].as_u64().unwrap())
        .collect();
    assert!(attempts.windows(2).all(|w| w[0] <= w[1]), "{attempts:?}");
    assert_eq!(attempts.first(), Some(&1));
    assert_eq!(attempts.last(), Some(&2));
    // --json alone: the same failure in a single line.
    let srv2 = Server::start(&root, &[]);
    let o = cp(&["--json", &srv2.url("nothing-here"), s(&dest)]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(lines(&o).len(), 1);
}

#[test]
fn a_lost_stream_is_an_event() {
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    // More than a megabyte on each of two streams.
    for i in 0..2 {
        write_file(
            &src.join(format!("large{i}")),
            70 + i,
            3 << 20,
            0o644,
            1_700_000_000,
        );
    }
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // The server cuts the data stream it receives on after a megabyte and a bit.
    let cut = format!("{}", (1 << 20) + 1000);
    let srv = Server::start(
        &root,
        &[
            "--debug-chunk-delay-ms",
            "5",
            "--debug-cut-stream-after",
            &cut,
        ],
    );
    let o = cp(&[
        "--progress",
        "ndjson",
        "--progress-interval",
        "50ms",
        "--chunk",
        "64K",
        "-P",
        "2",
        s(&src),
        &srv.url(""),
    ]);
    ok(&o);
    same(&src, &root.join("src"));
    let ls = lines(&o);
    let lost = of_type(&ls, "stream_lost");
    assert!(!lost.is_empty(), "{ls:?}");
    let e = lost[0];
    assert_eq!(e["schema"], 1);
    assert_eq!(e["attempt"], 1);
    assert!(e["stream"].as_u64().unwrap() < 2, "{e}");
    assert!(e["error"].as_str().is_some_and(|e| !e.is_empty()), "{e}");
    assert!(e["resent"].as_u64().is_some(), "{e}");
    let j = ls.last().unwrap();
    assert_summary_fields(j);
    assert!(j["streams_lost"].as_u64().unwrap() >= 1, "{j}");
    let end = of_type(&ls, "progress").last().copied().unwrap();
    assert_eq!(end["streams_lost"], j["streams_lost"], "{end} vs {j}");
}

/// Reads `log` until a line holds `message`, up to 10 s; every line must be JSON.
fn wait_for_log(log: &Path, message: &str) -> Vec<Value> {
    let mut found = Vec::new();
    wait_for(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // The last line may be half written.
        let complete = text.rsplit_once('\n').map_or("", |(a, _)| a);
        found = complete
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {l:?}"))
            })
            .collect();
        found.iter().any(|l| l["message"] == message)
    });
    found
}

#[test]
fn serve_logs_json_lines_with_one_line_per_session() {
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let log = t.path().join("server.log");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--log-format".as_ref(),
        "json".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ];
    let mut srv = Server::start_with(&args, &root, Some(&log), None);
    ok(&cp(&["--quiet", s(&src), &srv.url("")]));
    let o = cp(&["--quiet", &srv.url("missing"), s(&t.path().join("back"))]);
    assert_eq!(o.status.code(), Some(1));
    let ls = wait_for_log(&log, "session failed");
    srv.kill();
    for l in &ls {
        for f in ["timestamp", "level", "message", "target"] {
            assert!(l.get(f).is_some(), "a log line lacks {f}: {l}");
        }
    }
    let done: Vec<&Value> = ls
        .iter()
        .filter(|l| l["message"] == "session finished")
        .collect();
    assert_eq!(done.len(), 1, "{ls:?}");
    let d = done[0];
    assert_eq!(d["level"], "INFO");
    assert_eq!(d["op"], "push");
    assert_eq!(d["result"], "ok");
    assert_eq!(d["user"], "");
    assert_eq!(d["files"], 42);
    assert_eq!(d["bytes"], walk_bytes(&src));
    assert!(d["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{d}");
    assert!(d["seconds"].as_f64().unwrap() > 0.0, "{d}");
    let failed: Vec<&Value> = ls
        .iter()
        .filter(|l| l["message"] == "session failed")
        .collect();
    assert_eq!(failed.len(), 1, "{ls:?}");
    let f = failed[0];
    assert_eq!(f["level"], "WARN");
    assert_eq!(f["op"], "pull");
    assert_eq!(f["result"], "error");
    assert!(
        f["error"].as_str().unwrap().contains("missing"),
        "{}",
        f["error"]
    );
    for k in ["peer", "user", "bytes", "seconds"] {
        assert!(
            f.get(k).is_some(),
            "the failed session's line lacks {k}: {f}"
        );
    }
    // The start-up lines are log lines too.
    assert!(
        ls.iter()
            .any(|l| l["message"].as_str().unwrap().starts_with("serving ")),
        "{ls:?}"
    );
}

/// A server whose reads wait (100 ms a chunk, `--debug-io-latency-ms`: storage where
/// each I/O waits on a round trip, a parallel file system) and whose disk threads are not pinned adds
/// threads while a pull runs: its log says it tried more and went back on none,
/// and the pull ends sooner than its first 8 threads allow (640 chunks at 80 a
/// second: 8 s).
#[test]
fn a_server_whose_reads_wait_adds_disk_threads() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    write_file(&root.join("big"), 7, 640 * 65536, 0o644, 1_700_000_000);
    let log = t.path().join("server.log");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--log-format".as_ref(),
        "json".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
        "--debug-io-latency-ms".as_ref(),
        "100".as_ref(),
        // The decisions are logged at info (a server logs its sessions' lines alone
        // without -v).
        "-v".as_ref(),
    ];
    let mut srv = Server::start_with(&args, &root, Some(&log), None);
    let dest = t.path().join("dest");
    let o = cp(&["--json", "--chunk", "64K", &srv.url("big"), s(&dest)]);
    ok(&o);
    let j = json(&o);
    // The client's own writes kept up: its tuner is there, and changed nothing.
    assert_eq!(j["disk_threads"]["of"], 64, "{j}");
    assert_eq!(j["disk_threads"]["threads"], 8, "{j}");
    let secs = j["seconds"].as_f64().unwrap();
    let ls = wait_for_log(&log, "session finished");
    srv.kill();
    let disk: Vec<&str> = ls
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| m.starts_with("disk threads"))
        .collect();
    // The first decision adds threads: at least twice as many.
    let first: usize = disk
        .iter()
        .find_map(|m| m.rsplit_once(": trying ").and_then(|(_, n)| n.parse().ok()))
        .unwrap_or_else(|| panic!("no probe up: {disk:?}"));
    assert!(first >= 16, "{disk:?}");
    // Each doubling moved twice as much: none went back.
    assert!(!disk.iter().any(|m| m.contains("back to")), "{disk:?}");
    assert!(secs < 7.5, "{secs} s: the threads added moved nothing");
    assert_eq!(
        std::fs::read(dest).unwrap(),
        std::fs::read(root.join("big")).unwrap()
    );
}

/// `--io-threads` pins a client's disk threads: no tuner, nothing in the summary.
#[test]
fn io_threads_pin_the_disk_threads() {
    let t = tmp();
    let src = t.path().join("src");
    small_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let j = json(&cp(&["--json", "--io-threads", "3", s(&src), &srv.url("")]));
    assert_eq!(j["ok"], true, "{j}");
    assert!(j.get("disk_threads").is_none(), "{j}");
}
