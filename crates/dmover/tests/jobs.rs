//! `dmover serve --jobs` and its clients, as processes: servers A (the data, slow) and
//! B (the destination) without credentials on loopback, and C, a server with a token
//! running the job service. Jobs are submitted with `dmover submit`, watched with
//! `dmover job`/`jobs`, and survive C killed with SIGKILL mid-job and started again.

mod common;

use std::process::Command;

use common::jobs::{dm, json_of, service, start_service, wait};
use common::{Server, bin, bytes};

/// A temporary directory with A (40 files of 256 KiB in `a/run`, each chunk read
/// `delay_ms` late, one disk thread) and B (`b/in`) started, both allowing third-party
/// copies; C's root `c`, its state `state` and its token `token` ("sekrit").
fn lab(delay_ms: u32) -> (tempfile::TempDir, Server, Server) {
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    for d in ["a/run", "b/in", "c", "state"] {
        std::fs::create_dir_all(p(d)).unwrap();
    }
    for i in 0..40u64 {
        std::fs::write(p(&format!("a/run/{i}")), bytes(i, 256 << 10)).unwrap();
    }
    std::fs::write(p("token"), "sekrit\n").unwrap();
    let delay = delay_ms.to_string();
    let slow = [
        "--third-party",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        &delay,
    ];
    let a = Server::start(&p("a"), &slow);
    let b = Server::start(&p("b"), &["--third-party"]);
    (t, a, b)
}

#[test]
fn a_job_submitted_from_the_cli_survives_a_killed_service() {
    // 40 files of 256 KiB, read one chunk at a time at 100 ms a chunk: about 4 s.
    let (t, a, b) = lab(100);
    let p = |s: &str| t.path().join(s);
    let (mut c, url, _) = start_service(&p("c"), &p("token"), &p("state"));
    let (tok, kh) = (p("token"), p("known_hosts"));

    // Refused before anything is sent: a local path, and no token.
    let o = dm(
        &url,
        Some(&tok),
        &kh,
        &["submit", "/etc/hosts", &b.url("in/")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a local path"));
    let o = dm(&url, None, &kh, &["submit", &a.url("run"), &b.url("in/")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("HTTP 401") && e.contains("bearer token"), "{e}");

    let o = dm(
        &url,
        Some(&tok),
        &kh,
        &["submit", &a.url("run"), &b.url("in/"), "--json"],
    );
    let id = json_of(&o)["id"].as_i64().unwrap().to_string();
    let seen = wait(&url, &tok, &kh, &id, |j| j["bytes"].as_u64() > Some(0));
    assert_eq!(seen["state"], "running", "{seen}");
    c.kill();
    // Whatever is at B under a final name is whole.
    let mut whole = 0;
    for e in std::fs::read_dir(p("b/in/run"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Ok(i) = name.parse::<u64>() {
            assert_eq!(
                std::fs::read(e.path()).unwrap(),
                bytes(i, 256 << 10),
                "{name}"
            );
            whole += 1;
        }
    }
    assert!(whole < 40, "the job was killed mid-way ({whole} files)");

    let (mut c, url, metrics) = start_service(&p("c"), &p("token"), &p("state"));
    // Followed to its end through the event stream: NDJSON, the last line the job
    // done, exit 0.
    let o = dm(&url, Some(&tok), &kh, &["job", &id, "--follow", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let j = lines.last().unwrap().clone();
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l["state"] != "done")
    );
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["attempts"], 2, "{j}");
    assert_eq!(j["files_done"].as_u64(), Some(40), "{j}");
    for i in 0..40u64 {
        assert_eq!(
            std::fs::read(p(&format!("b/in/run/{i}"))).unwrap(),
            bytes(i, 256 << 10)
        );
    }
    assert_eq!(
        common::staging_files(&p("b")),
        Vec::<std::path::PathBuf>::new()
    );
    let list = json_of(&dm(&url, Some(&tok), &kh, &["jobs", "--json"]));
    assert_eq!(list["jobs"][0]["id"].to_string(), id, "{list}");
    assert_eq!(list["next"], serde_json::Value::Null);
    let text = dm(&url, Some(&tok), &kh, &["job", &id]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("job {id}: done")), "{text}");
    assert!(text.contains("\npriority: 3, link: 127.0.0.1:"), "{text}");
    // Following an ended job: at once, its description, exit 0.
    let text = dm(&url, Some(&tok), &kh, &["job", &id, "--follow"]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).starts_with(&format!("job {id}: done")));
    let o = dm(&url, Some(&tok), &kh, &["cancel", &id]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to cancel"));
    // The job service's metrics beside the server's: the store's jobs by state, and
    // what this process counted (the job was submitted to the one killed).
    let scrape = get_metrics(&metrics);
    for line in [
        "dmover_jobs{state=\"done\"} 1",
        "dmover_jobs{state=\"queued\"} 0",
        "dmover_jobs_submitted_total 0",
        "dmover_job_runs_total{outcome=\"done\"} 1",
    ] {
        assert!(
            scrape.lines().any(|l| l == line),
            "{line} not in:\n{scrape}"
        );
    }
    assert!(scrape.contains("dmover_sessions_active"), "{scrape}");
    c.kill();
    drop((a, b));
}

/// `GET /metrics` from the plain-HTTP metrics address `addr`: the body.
fn get_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[test]
fn a_second_service_on_the_same_database_does_not_start() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("c")).unwrap();
    std::fs::write(t.path().join("token"), "sekrit\n").unwrap();
    let state = t.path().join("state");
    let (mut first, _, _) = start_service(&t.path().join("c"), &t.path().join("token"), &state);
    let o = service(&t.path().join("c"), &t.path().join("token"), &state)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("in use by another job service"), "{e}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("listening"));
    first.kill();
    // Without users, the job service is refused.
    let o = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--jobs", "--root"])
        .arg(t.path().join("c"))
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bearer tokens of the server's users"));
}

/// The live page (`serve --metrics`) lists the job service's jobs: a running one with
/// its bytes, a failed one with its error by file, rendered by a headless browser.
#[test]
fn the_page_shows_jobs_in_a_headless_browser() {
    let Some(browser) = common::chromium() else {
        if std::env::var("DMOVER_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("chromium is not installed but DMOVER_REQUIRE_CHROMIUM=1");
        }
        eprintln!("\n!!! SKIPPING the jobs page test: chromium is not installed !!!\n");
        return;
    };
    // 40 chunks at 300 ms: 12 s, far longer than the page needs.
    let (t, a, b) = lab(300);
    let p = |s: &str| t.path().join(s);
    let (mut c, url, metrics) = start_service(&p("c"), &p("token"), &p("state"));
    let (tok, kh) = (p("token"), p("known_hosts"));
    let submit = |src: &str| {
        let o = dm(
            &url,
            Some(&tok),
            &kh,
            &["submit", src, &b.url("in/"), "--json"],
        );
        json_of(&o)["id"].as_i64().unwrap().to_string()
    };
    let running = submit(&a.url("run"));
    let failed = submit(&a.url("nothing/here"));
    wait(&url, &tok, &kh, &running, |j| j["bytes"].as_u64() > Some(0));
    wait(&url, &tok, &kh, &failed, |j| j["state"] == "failed");
    let html = common::render_page(browser, &format!("http://{metrics}/"), t.path());
    c.kill();
    let row = |id: &str| {
        let at = format!("data-job-id=\"{id}\"");
        let start = html
            .find(&at)
            .unwrap_or_else(|| panic!("no row {at} in the rendered page:\n{html}"));
        html[start..start + html[start..].find("</tr>").unwrap()].to_string()
    };
    let r = row(&running);
    assert!(r.contains(">running<"), "{r}");
    let bytes_shown: u64 = r
        .split("data-bytes=\"")
        .nth(1)
        .and_then(|x| x.split('"').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no bytes in {r}"));
    assert!(bytes_shown > 0, "{r}");
    let f = row(&failed);
    assert!(f.contains(">failed<"), "{f}");
    assert!(f.contains("no such file"), "{f}");
    assert!(html.contains("1 running"), "{html}");
    drop((a, b));
}
