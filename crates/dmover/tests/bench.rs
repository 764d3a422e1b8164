//! End-to-end runs of `dmover bench` subcommands with tiny sizes: the real binary, real
//! files, a real `dmover serve` on loopback. Each checks that results.csv and
//! results.json exist, carry the documented columns, and hold positive, plausible values.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use common::{bin, ok};

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-bench-e2e-")
        .tempdir()
        .unwrap()
}

fn bench(args: &[&str]) -> Output {
    let kh = tmp();
    Command::new(bin())
        .arg("bench")
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", kh.path().join("known_hosts"))
        .output()
        .expect("running dmover bench")
}

/// Splits one CSV line (RFC 4180 quoting).
fn csv_line(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The rows of `dir/results.csv` as column → value maps; checks that results.json
/// has the same rows and the machine description.
fn results(dir: &Path) -> Vec<HashMap<String, String>> {
    let csv = std::fs::read_to_string(dir.join("results.csv")).expect("results.csv");
    let mut lines = csv.lines();
    let header = csv_line(lines.next().expect("a header"));
    let rows: Vec<HashMap<String, String>> = lines
        .map(|l| header.iter().cloned().zip(csv_line(l)).collect())
        .collect();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).expect("results.json"))
            .expect("results.json is JSON");
    assert_eq!(json["rows"].as_array().map(Vec::len), Some(rows.len()));
    let m = &json["machine"];
    assert!(m["cores"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["memory_bytes"].as_u64().unwrap() > 0, "{m}");
    for k in ["cpu_model", "kernel", "data_fs"] {
        assert!(!m[k].as_str().unwrap().is_empty(), "machine.{k} empty: {m}");
    }
    assert!(json["dmover_version"].is_string());
    assert_eq!(json["schema"], 1, "{json}");
    assert!(json["parameters"].is_object());
    rows
}

fn number(row: &HashMap<String, String>, col: &str) -> f64 {
    let v = row
        .get(col)
        .unwrap_or_else(|| panic!("no column {col} in {row:?}"));
    v.parse()
        .unwrap_or_else(|_| panic!("column {col} = {v:?} is not a number"))
}

/// `col` is a positive number below `max` in every row.
fn positive(rows: &[HashMap<String, String>], col: &str, max: f64) {
    for r in rows {
        let v = number(r, col);
        assert!(v > 0.0 && v < max, "{col} = {v} not in (0, {max}): {r:?}");
    }
}

#[test]
fn storage_sweep_writes_results_and_a_plot() {
    let t = tmp();
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let out = t.path().join("out");
    let plot = t.path().join("storage.svg");
    let o = bench(&[
        "storage",
        data.to_str().unwrap(),
        "--sizes",
        "4K,256K",
        "--budget",
        "1M",
        "--threads",
        "1,2",
        "--block",
        "64K",
        "--out",
        out.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    ok(&o);
    let rows = results(&out);
    // 2 sizes x 2 modes x 2 thread counts x 2 phases.
    assert_eq!(rows.len(), 16, "{rows:?}");
    for col in ["mib_per_s", "gbit_per_s", "files_per_s", "iops", "seconds"] {
        positive(&rows, col, 1e9);
    }
    for col in ["lat_p50_us", "lat_p99_us", "lat_max_us"] {
        positive(&rows, col, 60e6);
    }
    for r in &rows {
        assert!(number(r, "lat_p50_us") <= number(r, "lat_p99_us"), "{r:?}");
        assert!(number(r, "lat_p99_us") <= number(r, "lat_max_us"), "{r:?}");
        let files = if r["size"] == "4K" { 256.0 } else { 4.0 };
        assert_eq!(number(r, "files"), files, "{r:?}");
        assert!(["write", "read"].contains(&r["phase"].as_str()));
        assert!(["buffered", "direct"].contains(&r["io"].as_str()));
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("<svg") && svg.contains("file size"));
    // The scratch files are gone.
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("MiB/s") && stdout.contains("p99"),
        "{stdout}"
    );
}

#[test]
fn storage_sweep_refuses_a_missing_directory() {
    let t = tmp();
    let o = bench(&["storage", t.path().join("nope").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is not a directory"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn net_measures_memory_to_memory_through_a_loopback_server() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let server = common::Server::start(&root, &[]);
    let out = t.path().join("out");
    let o = bench(&[
        "net",
        &server.addr,
        "--streams",
        "1,2",
        "--seconds",
        "0.3",
        "--repeats",
        "2",
        "--zerocopy",
        "off,on",
        "--direction",
        "push,pull",
        "--chunk",
        "1M",
        "--checksum",
        "--protection",
        "plain,encrypted",
        "--iperf3",
        "off",
        "--out",
        out.to_str().unwrap(),
    ]);
    ok(&o);
    let rows = results(&out);
    // 2 directions x 2 protections x 2 zero-copy settings x 2 stream counts, dmover only.
    assert_eq!(rows.len(), 16, "{rows:?}");
    // Loopback carries at least 10 Mbit/s and less than 10 Tbit/s. The floor is kept
    // because it is generous by orders of magnitude (loopback moves several Gbit/s even
    // on a loaded 2-core machine): it catches a stalled stream, not a slow machine.
    positive(&rows, "gbit_per_s", 10_000.0);
    for r in &rows {
        assert_eq!(r["tool"], "dmover");
        assert!(number(r, "gbit_per_s") > 0.01, "{r:?}");
        assert_eq!(number(r, "repeats"), 2.0);
        assert!(number(r, "gbit_per_s_min") <= number(r, "gbit_per_s_max"));
        let zc = &r["zerocopy_result"];
        match (
            r["zerocopy"].as_str(),
            r["direction"].as_str(),
            r["protection"].as_str(),
        ) {
            ("false", _, _) => assert_eq!(zc, "off"),
            ("true", "push", "plain") => assert!(
                zc.starts_with("on: ") || zc.starts_with("unsupported: "),
                "{zc}"
            ),
            // Sealed records cannot go out zero-copy: the fallback is reported.
            ("true", "push", "encrypted") => assert!(zc.starts_with("unsupported: "), "{zc}"),
            ("true", "pull", _) => assert!(zc.starts_with("on (server side"), "{zc}"),
            other => panic!("{other:?}"),
        }
    }
    // Nothing was written on the server.
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
}

#[test]
fn compare_runs_dmover_and_cp_and_reports_missing_peers() {
    let t = tmp();
    // A PATH with cp and nothing else: the peer tools are missing whatever is installed.
    let path_dir = t.path().join("bin");
    std::fs::create_dir(&path_dir).unwrap();
    let cp = ["/usr/bin/cp", "/bin/cp"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("cp");
    std::os::unix::fs::symlink(cp, path_dir.join("cp")).unwrap();
    let data = t.path().join("data");
    let out = t.path().join("out");
    let plot = t.path().join("compare.png");
    let o = Command::new(bin())
        .args(["bench", "compare", "losf", "mixed", "--scale", "0.01"])
        .args(["--repeats", "2", "--verify", "full", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .env("PATH", &path_dir)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", t.path().join("known_hosts"))
        .output()
        .unwrap();
    ok(&o);
    let rows = results(&out);
    let find = |ds: &str, tool: &str| {
        rows.iter()
            .find(|r| r["dataset"].starts_with(ds) && r["tool"] == tool)
            .unwrap_or_else(|| panic!("no row for {ds} {tool}: {rows:?}"))
    };
    for ds in ["losf", "mixed"] {
        for tool in ["dmover-push", "dmover-pull", "cp"] {
            let r = find(ds, tool);
            assert_eq!(r["status"], "ok", "{r:?}");
            assert_eq!(number(r, "repeats"), 2.0);
            for col in ["gbit_per_s", "files_per_s", "seconds"] {
                let v = number(r, col);
                assert!(v > 0.0 && v < 1e7, "{col} = {v}: {r:?}");
            }
            assert!(
                number(r, "files") >= 10.0 && number(r, "bytes") > 1e5,
                "{r:?}"
            );
        }
        assert!(number(find(ds, "dmover-push"), "vs_best_peer") > 0.0);
        for tool in ["rsync", "rsync-ssh", "scp", "gridftp", "xrdcp"] {
            let r = find(ds, tool);
            assert!(r["status"].starts_with("missing: "), "{r:?}");
            assert!(r["gbit_per_s"].is_empty(), "{r:?}");
        }
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert!(
        json["tools"]["cp"].as_str().unwrap().contains("cp"),
        "{}",
        json["tools"]
    );
    assert!(
        json["tools"]["rsync"]
            .as_str()
            .unwrap()
            .starts_with("missing")
    );
    assert_eq!(&std::fs::read(&plot).unwrap()[1..4], b"PNG");
    // Copies are gone; generated datasets stay for later runs.
    assert!(!data.join("dst").exists());
    assert!(data.join("src").join("losf-x0.01-s1").is_dir());
}

#[test]
fn transfer_sweeps_streams_and_chunks_both_ways() {
    let t = tmp();
    let dst = t.path().join("work");
    let out = t.path().join("out");
    let plot = t.path().join("transfer.svg");
    let o = bench(&[
        "transfer",
        "mixed",
        dst.to_str().unwrap(),
        "--scale",
        "0.01",
        "--streams",
        "1,3",
        "--chunk",
        "64K,1M",
        "--repeats",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    ok(&o);
    let rows = results(&out);
    // 2 directions x 2 stream counts x 2 chunk sizes.
    assert_eq!(rows.len(), 8, "{rows:?}");
    positive(&rows, "gbit_per_s", 10_000.0);
    positive(&rows, "files_per_s", 1e7);
    for r in &rows {
        assert_eq!(r["status"], "ok", "{r:?}");
        assert_eq!(number(r, "repeats"), 2.0);
        assert!(number(r, "gbit_per_s_min") <= number(r, "gbit_per_s"));
        assert!(number(r, "gbit_per_s") <= number(r, "gbit_per_s_max"));
        assert_eq!(r["seconds_samples"].split(';').count(), 2, "{r:?}");
    }
    let dirs: Vec<&str> = rows.iter().map(|r| r["direction"].as_str()).collect();
    assert!(dirs.contains(&"push") && dirs.contains(&"pull"));
    assert!(
        std::fs::read_to_string(&plot)
            .unwrap()
            .contains("TCP streams")
    );
    // Copies are cleaned up; the generated dataset stays.
    assert!(!dst.join("copies").exists() && !dst.join("pulled").exists());
    assert!(dst.join("src").join("mixed-x0.01-s1").is_dir());
}

#[test]
fn transfer_tune_records_the_tuned_copy_and_its_trajectory() {
    let t = tmp();
    let dst = t.path().join("work");
    let out = t.path().join("out");
    let plot = t.path().join("transfer.svg");
    let o = bench(&[
        "transfer",
        "losf",
        dst.to_str().unwrap(),
        "--scale",
        "0.004",
        "--streams",
        "2",
        "--chunk",
        "1M",
        "--direction",
        "push",
        "--repeats",
        "1",
        "--tune",
        "--out",
        out.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    ok(&o);
    let rows = results(&out);
    // The fixed point, then the tuned copy beside it.
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["streams"], "2");
    let tuned = &rows[1];
    assert_eq!(tuned["streams"], "tuned", "{tuned:?}");
    assert_eq!(tuned["status"], "ok", "{tuned:?}");
    assert_eq!(tuned["chunk"], "1M", "one --chunk: the tuned copy's too");
    let kept = number(tuned, "tuned_streams");
    assert!(
        kept >= 1.0 && kept <= number(tuned, "tuned_of"),
        "{tuned:?}"
    );
    positive(&rows, "gbit_per_s", 10_000.0);
    // trajectory.csv: the documented header, rows of run 1 with the streams in use.
    let csv = std::fs::read_to_string(out.join("trajectory.csv")).expect("trajectory.csv");
    let mut lines = csv.lines();
    let header = csv_line(lines.next().expect("a header"));
    assert_eq!(
        header.join(","),
        "run,rtt_ms,link,link_rate,direction,repeat,chunk,chunk_bytes,seconds,event,bytes,\
         interval_seconds,gbit_per_s,gbit_per_s_2s,streams,streams_of,tuner_gbit_per_s,reason"
    );
    let traj: Vec<HashMap<String, String>> = lines
        .map(|l| header.iter().cloned().zip(csv_line(l)).collect())
        .collect();
    assert!(!traj.is_empty());
    for r in &traj {
        assert_eq!(r["run"], "1", "{r:?}");
        assert_eq!(r["direction"], "push", "{r:?}");
        assert_eq!(r["link"], "loopback", "{r:?}");
        assert!(number(r, "seconds") >= 0.0, "{r:?}");
    }
    let first = traj
        .iter()
        .find(|r| r["event"] == "tuning")
        .expect("a tuning row");
    assert!(first["reason"].starts_with("starting with"), "{first:?}");
    assert!(number(first, "streams") >= 1.0, "{first:?}");
    let last = traj
        .iter()
        .rfind(|r| r["event"] == "progress")
        .expect("a progress row");
    assert_eq!(number(last, "bytes"), 4.0 * 1048576.0, "{last:?}");
    assert_eq!(number(last, "streams"), kept, "{last:?}");
    // The plot of the grid, and the trajectory's beside it.
    assert!(plot.exists());
    let svg = std::fs::read_to_string(t.path().join("transfer-trajectory.svg")).unwrap();
    assert!(svg.contains("streams sending") && svg.contains("-P 2, 1M"));
}

/// `bench cpu` with a tiny duration: every primitive has a positive rate, the report has
/// its context, and openssl is compared when it is installed and reported missing when
/// it is not (no speed is asserted: the goals are in the report's notes).
#[test]
fn cpu_rates_every_primitive() {
    let t = tmp();
    let out = t.path().join("out");
    let o = bench(&[
        "cpu",
        "--seconds",
        "0.01",
        "--repeats",
        "2",
        "--buffer",
        "300K",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    ok(&o);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    assert_eq!(json["command"], "cpu");
    assert_eq!(json["parameters"]["buffer"], 300 * 1024);
    assert_eq!(json["parameters"]["repeats"], 2);
    let rows = results(&out);
    let primitives = [
        "aes256gcm_seal",
        "aes256gcm_open",
        "gmac_seal",
        "gmac_open",
        "crc32c",
        "xxh3",
        "file_digest",
        "memcpy",
    ];
    for p in primitives {
        let r = rows
            .iter()
            .find(|r| r["primitive"] == p)
            .unwrap_or_else(|| panic!("no row {p}: {rows:?}"));
        assert_eq!(number(r, "repeats"), 2.0, "{r:?}");
        assert!(
            !r["library"].is_empty() && !r["used_for"].is_empty(),
            "{r:?}"
        );
        assert_eq!(r["gbyte_per_s_samples"].split(';').count(), 2, "{r:?}");
        assert!(number(r, "gbyte_per_s_wall") > 0.0, "{r:?}");
    }
    positive(&rows, "gbyte_per_s", 1e4);
    for r in &rows {
        assert!(
            number(r, "gbyte_per_s_min") <= number(r, "gbyte_per_s"),
            "{r:?}"
        );
        assert!(
            number(r, "gbyte_per_s") <= number(r, "gbyte_per_s_max"),
            "{r:?}"
        );
    }
    let openssl = json["tools"]["openssl"].as_str().expect("tools.openssl");
    let notes = json["notes"].to_string();
    if openssl == "missing" {
        // Not installed here: the same report without the reference row.
        assert_eq!(rows.len(), primitives.len());
        assert!(notes.contains("openssl is missing"), "{notes}");
    } else {
        assert_eq!(rows.len(), primitives.len() + 1, "{rows:?}");
        let r = rows.iter().find(|r| r["primitive"] == "openssl_aes256gcm");
        assert!(r.is_some(), "{rows:?}");
        for p in ["aes256gcm_seal", "aes256gcm_open"] {
            let r = rows.iter().find(|r| r["primitive"] == p).unwrap();
            assert!(number(r, "vs_openssl") > 0.0, "{r:?}");
        }
        assert!(notes.contains("goal (issue 44)"), "{notes}");
    }
    // Without openssl (as when it is not installed): said so, every primitive still
    // measured.
    let out2 = t.path().join("out2");
    let csv = t.path().join("cpu.csv");
    let o = bench(&[
        "cpu",
        "--csv",
        csv.to_str().unwrap(),
        "--seconds",
        "0.01",
        "--repeats",
        "1",
        "--openssl",
        "none",
        "--out",
        out2.to_str().unwrap(),
    ]);
    ok(&o);
    let rows = results(&out2);
    assert_eq!(rows.len(), primitives.len(), "{rows:?}");
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        std::fs::read_to_string(out2.join("results.csv")).unwrap()
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("GB/s") && stdout.contains("no openssl comparison: --openssl none"),
        "{stdout}"
    );
}

#[test]
fn mkdata_is_deterministic_by_seed() {
    let t = tmp();
    let make = |name: &str, seed: &str| {
        let dir = t.path().join(name);
        ok(&bench(&[
            "mkdata",
            dir.to_str().unwrap(),
            "--profile",
            "losf",
            "--scale",
            "0.004",
            "--seed",
            seed,
        ]));
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect::<Vec<_>>()
    };
    let (a, b, c) = (make("a", "5"), make("b", "5"), make("c", "6"));
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|f| f.len() == 1 << 20));
    assert!(a == b, "same seed, different bytes");
    assert!(
        a.iter().zip(&c).all(|(x, y)| x != y),
        "another seed, same bytes"
    );
}

/// Runs `dmover bench ARGS` as a child (so its pid, and the name of the lab it makes,
/// `bench<pid>`, are known), killing it after `limit`.
fn bench_child(args: &[&str], kh: &Path) -> std::process::Child {
    Command::new(bin())
        .arg("bench")
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", kh)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running dmover bench")
}

/// Waits for `child` at most `limit` (then kills it and fails), collecting its output.
fn wait_bounded(child: std::process::Child, limit: std::time::Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.expect("waiting for dmover bench"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("dmover bench (pid {pid}) did not finish within {limit:?}");
        }
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

#[test]
fn transfer_over_emulated_rtts() {
    use std::time::{Duration, Instant};
    if !common::netlab_available("transfer_over_emulated_rtts") {
        return;
    }
    let t = tmp();
    let dst = t.path().join("work");
    let out = t.path().join("out");
    let plot = t.path().join("rtt.svg");
    let kh = t.path().join("known_hosts");
    let child = bench_child(
        &[
            "transfer",
            "losf",
            dst.to_str().unwrap(),
            "--scale",
            "0.004",
            "--rtt",
            "0,20",
            "--rate",
            "1gbit",
            "--streams",
            "1,2",
            "--chunk",
            "1M",
            "--repeats",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
        ],
        &kh,
    );
    let lab = format!("dmnl-bench{}-a", child.id());
    let o = wait_bounded(child, Duration::from_secs(180));
    ok(&o);
    assert!(!netns_exists(&lab), "the lab {lab} was removed");
    let rows = results(&out);
    // 2 RTTs x 2 directions x 2 stream counts.
    assert_eq!(rows.len(), 8, "{rows:?}");
    for r in &rows {
        assert_eq!(r["status"], "ok", "{r:?}");
        assert_eq!(r["link_rate"], "1gbit", "{r:?}");
        let rtt = number(r, "rtt_ms");
        assert!(rtt == 0.0 || rtt == 20.0, "{r:?}");
        assert_eq!(r["link"], format!("{rtt} ms"), "{r:?}");
        // 4 MiB through a 1 Gbit/s link: below the link rate.
        // The memory test's clock starts once its first chunk went into the socket
        // (`Progress::data_flowing`), so a 0.5 s run may count one 4 MiB chunk (67
        // Mbit/s over 0.5 s) beyond the link: 1.001 was seen once.
        let g = number(r, "gbit_per_s");
        assert!(
            g > 0.0 && g <= 1.07,
            "{g} Gbit/s through a 1 Gbit/s link: {r:?}"
        );
        // A session needs round trips (connect, handshake, open, data, done).
        if rtt == 20.0 {
            assert!(number(r, "seconds") >= 0.04, "{r:?}");
        }
        assert!(number(r, "fwd_cpu_cores") >= 0.0, "{r:?}");
        assert!(number(r, "fwd_queue_drops") >= 0.0, "{r:?}");
        assert!(number(r, "fwd_late_p50_us") >= 0.0, "{r:?}");
        assert!(
            matches!(
                r.get("fwd_limited").map(String::as_str),
                Some("true" | "false")
            ),
            "{r:?}"
        );
    }
    for rtt in ["0", "20"] {
        let n = rows.iter().filter(|r| r["rtt_ms"] == rtt).count();
        assert_eq!(n, 4, "rtt_ms {rtt}: {rows:?}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.contains("RTT 20 ms") && svg.contains("RTT 0 ms"),
        "legend per RTT"
    );
    assert!(!dst.join("copies").exists() && !dst.join("pulled").exists());

    // Ctrl-C in the middle of a long-RTT sweep: the run stops, says so, keeps its
    // results file and removes the lab.
    let out2 = t.path().join("out2");
    let child = bench_child(
        &[
            "transfer",
            "losf",
            dst.to_str().unwrap(),
            "--scale",
            "0.004",
            "--rtt",
            "300",
            "--streams",
            "1",
            "--chunk",
            "1M",
            "--repeats",
            "20",
            "--out",
            out2.to_str().unwrap(),
        ],
        &kh,
    );
    let pid = child.id();
    let lab = format!("dmnl-bench{pid}-a");
    let t0 = Instant::now();
    while !netns_exists(&lab) && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(netns_exists(&lab), "the lab {lab} came up");
    std::thread::sleep(Duration::from_millis(1500));
    Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    let o = wait_bounded(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an interrupted run fails: {err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!netns_exists(&lab), "the lab {lab} was removed");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out2.join("results.json")).unwrap()).unwrap();
    assert!(
        json["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("incomplete run")),
        "{json}"
    );
}

#[test]
fn transfer_rtt_needs_netlab_and_says_so() {
    use std::os::unix::fs::PermissionsExt;
    // As an unprivileged user (run through setpriv when we are root), --rtt with an
    // emulated value is refused up front with the reason; loopback is not a lab.
    let t = tmp();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = t.path().join("dmover");
    std::fs::copy(bin(), &exe).unwrap();
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    let mut c = if root {
        if Command::new("setpriv").arg("--version").output().is_err() {
            eprintln!("\n!!! SKIPPING transfer_rtt_needs_netlab_and_says_so: no setpriv !!!\n");
            return;
        }
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let o = c
        .args(["bench", "transfer", "losf", "/nonexistent/dmover-rtt"])
        .args(["--rtt", "0,50"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("--rtt needs emulated links"), "{err}");
    assert!(err.contains("needs root"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A bad value is a usage error.
    let o = Command::new(bin())
        .args([
            "bench",
            "transfer",
            "losf",
            "/nonexistent/x",
            "--rtt",
            "fast",
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn net_over_emulated_rtts() {
    use std::time::Duration;
    if !common::netlab_available("net_over_emulated_rtts") {
        return;
    }
    let t = tmp();
    let out = t.path().join("out");
    let child = bench_child(
        &[
            "net",
            "--rtt",
            "0,20",
            "--rate",
            "1gbit",
            "--streams",
            "1",
            "--seconds",
            "0.5",
            "--repeats",
            "1",
            "--zerocopy",
            "off",
            "--iperf3",
            "off",
            "--out",
            out.to_str().unwrap(),
        ],
        &t.path().join("known_hosts"),
    );
    let lab = format!("dmnl-bnet{}-a", child.id());
    let o = wait_bounded(child, Duration::from_secs(120));
    ok(&o);
    assert!(!netns_exists(&lab), "the lab {lab} was removed");
    let rows = results(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let rtts: Vec<f64> = rows.iter().map(|r| number(r, "rtt_ms")).collect();
    assert_eq!(rtts, [0.0, 20.0]);
    for r in &rows {
        assert_eq!(r["tool"], "dmover", "{r:?}");
        assert_eq!(r["link_rate"], "1gbit", "{r:?}");
        let g = number(r, "gbit_per_s");
        // tbf lets its bucket (128 KiB) through at once and a 0.5 s sample is
        // timed from the first byte, so a shaped link can read a little above
        // its rate (1.004 once in CI); an unshaped veth gives several Gbit/s.
        assert!(
            g > 0.0 && g <= 1.05,
            "{g} Gbit/s through a 1 Gbit/s link: {r:?}"
        );
    }
    // HOST and --rtt exclude each other.
    let o = bench(&["net", "127.0.0.1:7700", "--rtt", "10"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
