//! `dmover serve --metrics` (docs/metrics.md): Prometheus counters that move during a
//! transfer and equal the client's summary after it, the access rules (loopback, else
//! TLS and bearer tokens), and the live page rendered by a headless browser. The real
//! binary against real servers on loopback.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-metrics-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `dmover serve` with `--metrics`; killed when dropped.
struct Served {
    child: Child,
    addr: String,
    /// `http://ADDR` or `https://ADDR` of the metrics.
    metrics: String,
    _state: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dmover serve ARGS --listen 127.0.0.1:0 --state-dir DIR`, its three first stdout
/// lines read: the address, the key, the metrics' address.
fn serve(args: &[&str]) -> Served {
    let state = tempfile::Builder::new()
        .prefix("dmover-state-")
        .tempdir()
        .unwrap();
    let mut child = Command::new(bin())
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--state-dir", s(state.path())])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting dmover serve");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = || {
        let mut l = String::new();
        out.read_line(&mut l).expect("reading a start-up line");
        l.trim().to_string()
    };
    let addr = line()
        .strip_prefix("dmover: listening on ")
        .expect("the listen line")
        .to_string();
    let _key = line();
    let metrics = line();
    let metrics = metrics
        .strip_prefix("dmover: metrics on ")
        .unwrap_or_else(|| panic!("no metrics line: {metrics:?}"))
        .trim_end_matches('/')
        .to_string();
    Served {
        child,
        addr,
        metrics,
        _state: state,
    }
}

/// A plain HTTP GET: (status, body).
fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let host = base.strip_prefix("http://").expect("plain http");
    let mut c = TcpStream::connect(host).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    parse_answer(&answer)
}

fn parse_answer(answer: &str) -> (u16, String) {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not HTTP: {answer:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status: {head}"));
    (status, body.to_string())
}

/// The value of the series `series` (name and labels, exactly as exposed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(base: &str) -> String {
    let (status, body) = get(base, "/metrics", None);
    assert_eq!(status, 200, "{body}");
    body
}

/// A dataset of `n` files of 256 KiB and two empty ones.
fn dataset(root: &Path, n: usize) {
    for i in 0..n {
        write_file(
            &root.join(format!("f{i:03}")),
            i as u64,
            256 << 10,
            0o644,
            1_700_000_000,
        );
    }
    for i in 0..2 {
        write_file(&root.join(format!("empty{i}")), 0, 0, 0o644, 1_700_000_000);
    }
}

/// `dmover cp --json SRC dmover://ADDR/dest` in the background, 256 KiB chunks.
fn push(src: &Path, server: &Served, dir: &Path) -> Child {
    Command::new(bin())
        .args(["cp", "--json", "-P", "2", "--chunk", "256K"])
        .arg(src)
        .arg(format!("dmover://{}/dest", server.addr))
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(dir))
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_USER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting dmover cp")
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const BYTES: &str = "dmover_bytes_total{direction=\"received\",user=\"\"}";
const FILES: &str = "dmover_files_total{direction=\"received\",user=\"\"}";
const ACTIVE: &str = "dmover_sessions_active{op=\"push\"}";
const PUSHES_OK: &str = "dmover_sessions_total{op=\"push\",result=\"ok\"}";

#[test]
fn counters_move_during_a_transfer_and_equal_its_summary_after() {
    let t = tmp();
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    dataset(&src, 16);
    std::fs::create_dir_all(&root).unwrap();
    // One disk thread, 100 ms per chunk written: 16 chunks take 1.6 s or more.
    let server = serve(&[
        "--root",
        s(&root),
        "--metrics",
        "127.0.0.1:0",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "100",
    ]);
    assert!(server.metrics.starts_with("http://127.0.0.1:"));
    let before = scrape(&server.metrics);
    assert_eq!(value(&before, ACTIVE), Some(0.0), "{before}");
    assert_eq!(value(&before, PUSHES_OK), Some(0.0), "{before}");
    assert_eq!(value(&before, BYTES), None, "no user seen yet: {before}");
    assert!(
        before.contains("# TYPE dmover_bytes_total counter"),
        "{before}"
    );
    assert!(
        value(&before, "dmover_buffer_memory_budget_bytes").unwrap() > 0.0,
        "{before}"
    );

    let busy_before = value(&before, "dmover_network_busy_seconds_total").unwrap();
    let wall = Instant::now();
    let client = push(&src, &server, t.path());
    // During the transfer: one push running, bytes counted, some files written but
    // not all (the writes take 100 ms each, one after the other).
    let during = wait_for(Duration::from_secs(30), "bytes during the push", || {
        let m = scrape(&server.metrics);
        let (b, f) = (value(&m, BYTES)?, value(&m, FILES)?);
        (b > 0.0 && f < 12.0 && value(&m, ACTIVE) == Some(1.0)).then_some(f)
    });
    let (status, body) = get(&server.metrics, "/api/transfers", None);
    assert_eq!(status, 200);
    let j: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(j["schema"], 1, "{j}");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"), "{j}");
    assert!(j["now_unix"].as_f64().unwrap() > 0.0, "{j}");
    let first = &j["transfers"][0];
    assert_eq!(first["op"], "push", "{j}");
    assert_eq!(first["user"], "", "{j}");
    assert!(first["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    // Files with data (the two empty ones travel in the manifest, not counted).
    assert_eq!(first["files_total"], 16, "{j}");
    assert_eq!(first["bytes_total"], 16 * (256 << 10), "{j}");
    // The files counter and the network busy time move on while the transfer runs.
    wait_for(Duration::from_secs(30), "files to grow", || {
        let m = scrape(&server.metrics);
        (value(&m, FILES)? > during && value(&m, ACTIVE) == Some(1.0)).then_some(())
    });
    wait_for(Duration::from_secs(30), "network busy time to grow", || {
        let m = scrape(&server.metrics);
        let busy = value(&m, "dmover_network_busy_seconds_total")?;
        (busy > busy_before && value(&m, ACTIVE) == Some(1.0)).then_some(())
    });

    let out = client.wait_with_output().unwrap();
    ok(&out);
    let summary = json(&out);
    let after = scrape(&server.metrics);
    assert_eq!(value(&after, ACTIVE), Some(0.0), "{after}");
    assert_eq!(value(&after, PUSHES_OK), Some(1.0), "{after}");
    assert_eq!(
        value(&after, BYTES),
        summary["bytes_sent"].as_f64(),
        "{after}\n{summary}"
    );
    assert_eq!(
        value(&after, FILES),
        summary["files_sent"].as_f64(),
        "{after}\n{summary}"
    );
    assert_eq!(summary["files_sent"], 18, "{summary}");
    assert!(value(&after, "dmover_disk_busy_seconds_total").unwrap() >= 1.6);
    // Data moved through most of the push (16 chunks written 100 ms apart, the
    // receive paced by the writes), and never longer than it took (plus one tick
    // before it started).
    let busy = busy_within_uptime(&after) - busy_before;
    let took = wall.elapsed().as_secs_f64();
    assert!(
        busy >= 0.8 && busy <= took + 0.3,
        "busy {busy} s of {took} s\n{after}"
    );
    // The finished session stays on the page's list.
    let (_, body) = get(&server.metrics, "/api/transfers", None);
    let j: Value = serde_json::from_str(&body).unwrap();
    let done = &j["transfers"][0];
    assert_eq!(done["state"], "ok", "{j}");
    assert_eq!(done["bytes"], summary["bytes_sent"], "{j}");
    assert_eq!(done["files"], 18, "{j}");

    // A pull counts as sent, the same way.
    let back = t.path().join("back");
    let out = cp_env(
        &[
            "--json",
            &format!("dmover://{}/dest", server.addr),
            s(&back),
        ],
        &[("DMOVER_KNOWN_HOSTS", s(&known_hosts_in(t.path())))],
    );
    ok(&out);
    let pulled = json(&out);
    let after = scrape(&server.metrics);
    let sent = |m: &str| format!("dmover_{m}_total{{direction=\"sent\",user=\"\"}}");
    assert_eq!(
        value(&after, &sent("bytes")),
        pulled["bytes_sent"].as_f64(),
        "{after}\n{pulled}"
    );
    assert_eq!(
        value(&after, &sent("files")),
        pulled["files_sent"].as_f64(),
        "{after}\n{pulled}"
    );
    assert_eq!(
        value(&after, "dmover_sessions_total{op=\"pull\",result=\"ok\"}"),
        Some(1.0)
    );
    // Received is unchanged.
    assert_eq!(value(&after, BYTES), summary["bytes_sent"].as_f64());
    // Nothing was held by either session; a sync re-run of the push holds it all.
    assert_eq!(
        value(&after, &moved("sessions_resumed", "received")),
        Some(0.0)
    );
    let out = Command::new(bin())
        .args(["sync", "--json"])
        .arg(&src)
        .arg(format!("dmover://{}/dest", server.addr))
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_USER")
        .output()
        .unwrap();
    ok(&out);
    let again = scrape(&server.metrics);
    assert_eq!(
        value(&again, &moved("sessions_resumed", "received")),
        Some(1.0),
        "{again}"
    );
    assert_eq!(value(&again, &moved("sessions_resumed", "sent")), Some(0.0));

    // Every metric exposed is documented (docs/metrics.md), under its exposed name.
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
    )
    .unwrap();
    for l in after.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = l.split(' ').next().unwrap();
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "{name} not in docs/metrics.md"
        );
    }

    // Anything else: 404; the page itself is static.
    assert_eq!(get(&server.metrics, "/nope", None).0, 404);
    let (status, page) = get(&server.metrics, "/", None);
    assert_eq!(status, 200);
    assert!(page.contains("api/transfers") && !page.contains("127.0.0.1"));

    // A request for another host name (a page whose name was re-pointed at 127.0.0.1:
    // DNS rebinding) is not answered with the transfers.
    let addr = server.metrics.strip_prefix("http://").unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /api/transfers HTTP/1.1\r\nHost: rebound.example:80\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert_eq!(parse_answer(&answer).0, 421, "{answer}");
}

#[test]
fn metrics_off_loopback_are_refused_unless_the_config_names_their_users() {
    let t = tmp();
    let token = t.path().join("token");
    std::fs::write(&token, "sekrit\n").unwrap();
    let out = Command::new(bin())
        .args(["serve", "--root", s(t.path()), "--token-file", s(&token)])
        .args(["--listen", "127.0.0.1:0", "--metrics", "0.0.0.0:0"])
        .args(["--state-dir", s(t.path())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("metrics_users"), "{}", stderr(&out));

    // A config with the address but no metrics_users: refused too.
    let cfg = t.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "metrics = \"0.0.0.0:0\"\n[exports.data]\npath = \"{}\"\n[users.alice]\n\
             token = \"{}\"\nexports = {{ data = \"rw\" }}\n",
            s(t.path()),
            dmover_proto::auth::token_keys(b"sekrit").verifier.to_text()
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["serve", "--config", s(&cfg), "--listen", "127.0.0.1:0"])
        .args(["--state-dir", s(t.path())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("metrics_users"), "{}", stderr(&out));
}

/// GET over TLS (the key pinned in a fresh known-hosts file): (status, body).
fn get_tls(addr: &str, path: &str, token: Option<&str>, kh: &Path) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = dmover_net::tls::TlsConnector::new(dmover_net::tls::Trust::KnownHosts(
            kh.to_path_buf(),
        ))
        .unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = c.connect(tcp, addr).await.expect("TLS");
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        tls.write_all(req.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        parse_answer(&String::from_utf8_lossy(&answer))
    })
}

#[test]
fn metrics_off_loopback_take_tls_and_a_bearer_token() {
    let t = tmp();
    let cfg = t.path().join("server.toml");
    let verifier = |tok: &[u8]| dmover_proto::auth::token_keys(tok).verifier.to_text();
    std::fs::write(
        &cfg,
        format!(
            "metrics = \"0.0.0.0:0\"\nmetrics_users = [\"ops\"]\n\
             [exports.data]\npath = \"{}\"\n\
             [users.alice]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n\
             [users.ops]\ntoken = \"{}\"\n",
            s(t.path()),
            verifier(b"alice-token"),
            verifier(b"ops-token"),
        ),
    )
    .unwrap();
    let server = serve(&["--config", s(&cfg)]);
    let port = server
        .metrics
        .strip_prefix("https://0.0.0.0:")
        .unwrap_or_else(|| panic!("not TLS: {}", server.metrics));
    let addr = format!("127.0.0.1:{port}");
    // Plain HTTP gets no answer.
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "plain HTTP was answered");

    let kh = known_hosts_in(t.path());
    assert_eq!(get_tls(&addr, "/metrics", None, &kh).0, 401);
    // A user of the transfers who is not in metrics_users: refused.
    assert_eq!(get_tls(&addr, "/metrics", Some("alice-token"), &kh).0, 401);
    assert_eq!(get_tls(&addr, "/api/transfers", Some("wrong"), &kh).0, 401);
    let (status, body) = get_tls(&addr, "/metrics", Some("ops-token"), &kh);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("dmover_sessions_active"), "{body}");
    let (status, body) = get_tls(&addr, "/api/transfers", Some("ops-token"), &kh);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"transfers\""), "{body}");
    // The page is static (its script sends the token).
    assert_eq!(get_tls(&addr, "/", None, &kh).0, 200);
}

#[test]
fn the_page_shows_a_running_transfer_in_a_headless_browser() {
    let Some(browser) = common::chromium() else {
        if std::env::var("DMOVER_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("chromium is not installed but DMOVER_REQUIRE_CHROMIUM=1");
        }
        eprintln!("\n!!! SKIPPING the page test: chromium is not installed !!!\n");
        return;
    };
    let t = tmp();
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    // 100 chunks at 300 ms each on one disk thread: 30 s, far longer than the test
    // needs (a browser start takes seconds); the client is killed once the page was
    // seen.
    dataset(&src, 100);
    std::fs::create_dir_all(&root).unwrap();
    let server = serve(&[
        "--root",
        s(&root),
        "--metrics",
        "127.0.0.1:0",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "300",
    ]);
    let (status, page) = get(&server.metrics, "/", None);
    assert_eq!(status, 200);
    assert!(
        !page.contains("class=\"transfer"),
        "rows come from the script"
    );
    let mut client = push(&src, &server, t.path());
    let peer = wait_for(Duration::from_secs(30), "the running push", || {
        let (_, body) = get(&server.metrics, "/api/transfers", None);
        let j: Value = serde_json::from_str(&body).ok()?;
        let r = &j["transfers"][0];
        (r["state"] == "running" && r["bytes"].as_u64()? > 0).then(|| {
            (
                r["id"].as_u64().unwrap(),
                r["peer"].as_str().unwrap().to_string(),
            )
        })
    });
    let html = common::render_page(browser, &format!("{}/", server.metrics), t.path());
    let _ = client.kill();
    let _ = client.wait();
    let row = format!("data-id=\"{}\"", peer.0);
    let start = html
        .find(&row)
        .unwrap_or_else(|| panic!("no row {row} in the rendered page:\n{html}"));
    let tr = &html[start..start + html[start..].find("</tr>").unwrap()];
    assert!(tr.contains(&format!(">{}<", peer.1)), "no peer in {tr}");
    assert!(tr.contains(">push<") && tr.contains(">running<"), "{tr}");
    let bytes: u64 = tr
        .split("data-bytes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("no bytes in {tr}"));
    assert!(bytes > 0, "{tr}");
}

/// `dmover cp --json ARGS` with a fresh known-hosts file under `dir`.
fn cp_in(dir: &Path, args: &[&str]) -> std::process::Output {
    cp_env(args, &[("DMOVER_KNOWN_HOSTS", s(&known_hosts_in(dir)))])
}

/// The page's JSON.
fn transfers(server: &Served) -> Value {
    let (status, body) = get(&server.metrics, "/api/transfers", None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `dmover_NAME_total{direction="DIR",user=""}`
fn moved(name: &str, dir: &str) -> String {
    format!("dmover_{name}_total{{direction=\"{dir}\",user=\"\"}}")
}

/// Network busy time is counted, and within the server's life.
fn busy_within_uptime(m: &str) -> f64 {
    let busy = value(m, "dmover_network_busy_seconds_total").expect("network busy time");
    let started = value(m, "dmover_start_time_seconds").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        busy <= now - started + 0.5,
        "busy {busy} s, up {} s",
        now - started
    );
    busy
}

#[test]
fn a_third_party_copy_counts_on_both_servers_and_memory_tests_apart() {
    let t = tmp();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    dataset(&a_root.join("src"), 8);
    std::fs::create_dir_all(&b_root).unwrap();
    let data = (8 * (256 << 10)) as f64;
    let metrics = ["--third-party", "--metrics", "127.0.0.1:0"];
    let a = serve(&[&["--root", s(&a_root)][..], &metrics].concat());
    let b = serve(&[&["--root", s(&b_root)][..], &metrics].concat());

    // Push (the default): A dials B and sends, B receives.
    let out = cp_in(
        t.path(),
        &[
            "--json",
            &format!("dmover://{}/src", a.addr),
            &format!("dmover://{}/", b.addr),
        ],
    );
    ok(&out);
    assert_eq!(json(&out)["dialer"], a.addr.as_str());
    let (ma, mb) = (scrape(&a.metrics), scrape(&b.metrics));
    assert_eq!(
        value(&ma, &moved("bytes", "third_party_sent")),
        Some(data),
        "{ma}"
    );
    // 8 files with data and 2 empty ones.
    assert_eq!(
        value(&ma, &moved("files", "third_party_sent")),
        Some(10.0),
        "{ma}"
    );
    assert_eq!(
        value(&mb, &moved("bytes", "third_party_received")),
        Some(data),
        "{mb}"
    );
    assert_eq!(
        value(&mb, &moved("files", "third_party_received")),
        Some(10.0),
        "{mb}"
    );
    // Not counted as a client's push or pull.
    for (m, dir) in [
        (&ma, "sent"),
        (&ma, "received"),
        (&mb, "received"),
        (&mb, "sent"),
    ] {
        assert_eq!(value(m, &moved("bytes", dir)), Some(0.0), "{dir}: {m}");
    }
    assert_eq!(
        value(
            &ma,
            "dmover_sessions_total{op=\"third_party\",result=\"ok\"}"
        ),
        Some(1.0),
        "{ma}"
    );
    assert_eq!(value(&mb, PUSHES_OK), Some(1.0), "{mb}");
    // Both servers list the copy, saying which side they were.
    let ja = transfers(&a);
    let r = &ja["transfers"][0];
    assert_eq!(r["op"], "third_party", "{ja}");
    assert_eq!(r["direction"], "third_party_sent", "{ja}");
    assert_eq!(r["state"], "ok", "{ja}");
    assert_eq!(r["bytes"].as_f64(), Some(data), "{ja}");
    let jb = transfers(&b);
    let r = &jb["transfers"][0];
    assert_eq!(r["op"], "push", "{jb}");
    assert_eq!(r["direction"], "third_party_received", "{jb}");
    assert_eq!(r["bytes"].as_f64(), Some(data), "{jb}");

    // Pull: B dials A; A still sends, B still receives.
    let out = cp_in(
        t.path(),
        &[
            "--json",
            "--tpc",
            "pull",
            &format!("dmover://{}/src", a.addr),
            &format!("dmover://{}/pulled", b.addr),
        ],
    );
    ok(&out);
    let (ma, mb) = (scrape(&a.metrics), scrape(&b.metrics));
    assert_eq!(
        value(&ma, &moved("bytes", "third_party_sent")),
        Some(2.0 * data),
        "{ma}"
    );
    assert_eq!(
        value(&mb, &moved("bytes", "third_party_received")),
        Some(2.0 * data),
        "{mb}"
    );
    assert_eq!(
        value(&mb, &moved("files", "third_party_received")),
        Some(20.0),
        "{mb}"
    );
    assert_eq!(
        value(
            &mb,
            "dmover_sessions_total{op=\"third_party\",result=\"ok\"}"
        ),
        Some(1.0),
        "{mb}"
    );
    assert_eq!(transfers(&b)["transfers"][0]["op"], "third_party");
    // Busy time is sampled every 0.25 s: a short copy shows at the next sample.
    for server in [&a, &b] {
        wait_for(Duration::from_secs(5), "network busy time", || {
            (busy_within_uptime(&scrape(&server.metrics)) > 0.0).then_some(())
        });
    }

    // A memory-to-memory test against A, both ways: counted apart, as memtest (with
    // `dmover bench net`, the lab's).
    if !cfg!(feature = "lab") {
        return;
    }
    let out_dir = t.path().join("bench");
    let o = Command::new(bin())
        .args([
            "bench",
            "net",
            &a.addr,
            "--streams",
            "1",
            "--seconds",
            "0.3",
        ])
        .args(["--repeats", "1", "--zerocopy", "off", "--iperf3", "off"])
        .args([
            "--direction",
            "push,pull",
            "--chunk",
            "1M",
            "--out",
            s(&out_dir),
        ])
        .env_remove("DMOVER_TOKEN")
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .output()
        .unwrap();
    ok(&o);
    let ma = scrape(&a.metrics);
    for dir in ["memtest_received", "memtest_sent"] {
        let b = value(&ma, &moved("bytes", dir)).unwrap();
        assert!(b >= (1 << 20) as f64, "{dir}: {b} bytes\n{ma}");
        assert_eq!(value(&ma, &moved("files", dir)), Some(0.0), "{ma}");
    }
    assert!(
        value(&ma, "dmover_sessions_total{op=\"memtest\",result=\"ok\"}").unwrap() >= 2.0,
        "{ma}"
    );
    // The copies' counters did not move.
    assert_eq!(
        value(&ma, &moved("bytes", "third_party_sent")),
        Some(2.0 * data),
        "{ma}"
    );
    assert_eq!(value(&ma, &moved("bytes", "sent")), Some(0.0), "{ma}");
    let ja = transfers(&a);
    let dirs: Vec<&str> = ja["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["op"] == "memtest")
        .map(|r| r["direction"].as_str().unwrap())
        .collect();
    assert!(
        dirs.contains(&"memtest_received") && dirs.contains(&"memtest_sent"),
        "{ja}"
    );
}

#[test]
fn auth_failures_and_refusals_are_counted_by_kind() {
    let t = tmp();
    let data = t.path().join("data");
    dataset(&data.join("src"), 8);
    dataset(&data.join("big"), 24);
    let cfg = t.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "max_sessions_per_user = 1\n[exports.data]\npath = \"{}\"\n\
             [users.alice]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n",
            s(&data),
            dmover_proto::auth::token_keys(b"alice-token")
                .verifier
                .to_text()
        ),
    )
    .unwrap();
    let (good, wrong) = (t.path().join("good"), t.path().join("wrong"));
    std::fs::write(&good, "alice-token\n").unwrap();
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    // One disk thread, 300 ms per chunk: a pull of `big` takes 7.2 s or more.
    let server = serve(&[
        "--config",
        s(&cfg),
        "--metrics",
        "127.0.0.1:0",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "300",
    ]);
    let auth = |kind: &str| {
        value(
            &scrape(&server.metrics),
            &format!("dmover_auth_failures_total{{kind=\"{kind}\"}}"),
        )
    };
    let refusals = |reason: &str| {
        value(
            &scrape(&server.metrics),
            &format!("dmover_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    for kind in [
        "bad_credential",
        "unknown_user",
        "revoked",
        "tls",
        "capability",
    ] {
        assert_eq!(auth(kind), Some(0.0), "{kind}");
    }
    let url = |p: &str| format!("dmover://{}/data/{p}", server.addr);
    let pull = |user: &str, token: &Path, dest: &str, extra: &[&str]| {
        let mut args = vec!["--user", user, "--token-file", s(token)];
        args.extend_from_slice(extra);
        let (src, dst) = (url("src"), t.path().join(dest));
        args.push(&src);
        args.push(s(&dst));
        cp_in(t.path(), &args)
    };

    // A wrong token, then a name no user has: refused, each counted as what it was.
    let o = pull("alice", &wrong, "x1", &[]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(auth("bad_credential"), Some(1.0));
    assert_eq!(auth("unknown_user"), Some(0.0));
    let o = pull("mallory", &good, "x2", &[]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(auth("unknown_user"), Some(1.0));
    assert_eq!(auth("bad_credential"), Some(1.0));

    // A control connection whose TLS fails (garbage after the preamble).
    let mut c = TcpStream::connect(&server.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let pre = dmover_proto::preamble::Preamble::new(
        dmover_proto::preamble::ConnKind::Control,
        dmover_proto::PROTOCOL_VERSION,
    );
    c.write_all(&pre.encode()).unwrap();
    c.write_all(b"this is no TLS client hello, not at all\r\n\r\n")
        .unwrap();
    let _ = c.read_to_end(&mut Vec::new());
    wait_for(Duration::from_secs(10), "the TLS failure counted", || {
        (auth("tls") == Some(1.0)).then_some(())
    });

    // Alice's one session place taken by a slow pull: a second session of hers is
    // refused for the limit (this client will not wait), and counted.
    assert_eq!(refusals("max_sessions_per_user"), Some(0.0));
    let slow = {
        let (src, dst, kh, good) = (
            url("big"),
            t.path().join("slow"),
            known_hosts_in(t.path()),
            good.clone(),
        );
        std::thread::spawn(move || {
            cp_env(
                &[
                    "--user",
                    "alice",
                    "--token-file",
                    s(&good),
                    "--chunk",
                    "256K",
                    &src,
                    s(&dst),
                ],
                &[("DMOVER_KNOWN_HOSTS", s(&kh))],
            )
        })
    };
    wait_for(Duration::from_secs(30), "the slow pull", || {
        let m = scrape(&server.metrics);
        (value(&m, "dmover_sessions_active{op=\"pull\"}")? == 1.0).then_some(())
    });
    let o = pull("alice", &good, "refused", &["--busy-wait", "0"]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("already runs 1 sessions"),
        "{}",
        stderr(&o)
    );
    assert_eq!(refusals("max_sessions_per_user"), Some(1.0));
    // One that waits (the default --busy-wait) gets in once the first is done.
    let m = scrape(&server.metrics);
    assert_eq!(
        value(&m, "dmover_sessions_active{op=\"pull\"}"),
        Some(1.0),
        "the slow pull ended too soon for this test: {m}"
    );
    let o = pull("alice", &good, "waited", &[]);
    ok(&o);
    assert!(stderr(&o).contains("trying again"), "{}", stderr(&o));
    ok(&slow.join().unwrap());
    same(&data.join("big"), &t.path().join("slow"));
    assert!(refusals("max_sessions_per_user").unwrap() >= 2.0);
    same(&data.join("src"), &t.path().join("waited"));
    // No other refusal and no other failure.
    for r in ["max_handshakes", "max_sessions", "memory_budget"] {
        assert_eq!(refusals(r), Some(0.0), "{r}");
    }
    assert_eq!(auth("bad_credential"), Some(1.0));
}

#[test]
fn a_session_revoked_by_a_reload_counts_as_an_auth_failure() {
    let t = tmp();
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let src = t.path().join("src");
    dataset(&src, 40);
    let cfg = t.path().join("server.toml");
    let export = format!("[exports.data]\npath = \"{}\"\n", s(&data));
    let alice = format!(
        "[users.alice]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n",
        dmover_proto::auth::token_keys(b"alice-token")
            .verifier
            .to_text()
    );
    std::fs::write(&cfg, format!("{export}{alice}")).unwrap();
    let token = t.path().join("token");
    std::fs::write(&token, "alice-token\n").unwrap();
    // One disk thread, 300 ms per chunk: the push of 40 chunks takes 12 s or more.
    let server = serve(&[
        "--config",
        s(&cfg),
        "--metrics",
        "127.0.0.1:0",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "300",
    ]);
    let client = Command::new(bin())
        .args(["cp", "--chunk", "256K", "--user", "alice", "--token-file"])
        .arg(&token)
        .arg(&src)
        .arg(format!("dmover://{}/data/dest", server.addr))
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(t.path()))
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_USER")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let moving = "dmover_bytes_total{direction=\"received\",user=\"alice\"}";
    wait_for(Duration::from_secs(30), "alice's push", || {
        (value(&scrape(&server.metrics), moving)? > 0.0).then_some(())
    });
    // Alice is removed from the configuration (Bob stays: a file without users would
    // open the server to anyone), which is reloaded.
    let bob = format!(
        "[users.bob]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n",
        dmover_proto::auth::token_keys(b"bob-token")
            .verifier
            .to_text()
    );
    std::fs::write(&cfg, format!("{export}{bob}")).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let out = client.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("credential revoked"),
        "{}",
        stderr(&out)
    );
    let m = wait_for(Duration::from_secs(10), "the revocation counted", || {
        let m = scrape(&server.metrics);
        (value(&m, "dmover_auth_failures_total{kind=\"revoked\"}")? == 1.0).then_some(m)
    });
    assert_eq!(
        value(&m, "dmover_auth_failures_total{kind=\"bad_credential\"}"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        value(&m, "dmover_session_errors_total{kind=\"auth\"}"),
        Some(1.0),
        "{m}"
    );
}

/// A server whose buffer memory one session holds whole: a second session waits for
/// it (the handshake timeout), is refused as busy for the memory budget, counted, and
/// its client comes back by itself until it gets in.
#[test]
fn a_refusal_for_the_memory_budget_is_counted_and_the_client_comes_back() {
    let t = tmp();
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    // 16 MiB: 16 chunks of 1 MiB at 300 ms each on one disk thread, 4.8 s or more.
    dataset(&src, 64);
    std::fs::create_dir_all(&root).unwrap();
    let cfg = t.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "handshake_timeout_secs = 1\n[exports.data]\npath = \"{}\"\n\
             [users.alice]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n",
            s(&root),
            dmover_proto::auth::token_keys(b"alice-token")
                .verifier
                .to_text()
        ),
    )
    .unwrap();
    let token = t.path().join("token");
    std::fs::write(&token, "alice-token\n").unwrap();
    let server = serve(&[
        "--config",
        s(&cfg),
        "--memory",
        "2M",
        "--metrics",
        "127.0.0.1:0",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "300",
    ]);
    let push = |dest: &str| {
        let (src, url, kh, token) = (
            src.clone(),
            format!("dmover://{}/data/{dest}", server.addr),
            known_hosts_in(t.path()),
            token.clone(),
        );
        std::thread::spawn(move || {
            cp_env(
                &[
                    "--user",
                    "alice",
                    "--token-file",
                    s(&token),
                    "--chunk",
                    "1M",
                    "-P",
                    "1",
                    s(&src),
                    &url,
                ],
                &[("DMOVER_KNOWN_HOSTS", s(&kh))],
            )
        })
    };
    let first = push("first");
    let alice = "dmover_bytes_total{direction=\"received\",user=\"alice\"}";
    wait_for(Duration::from_secs(30), "the first push", || {
        let m = scrape(&server.metrics);
        (value(&m, alice)? > 0.0).then_some(())
    });
    let m = scrape(&server.metrics);
    assert_eq!(
        value(&m, "dmover_buffer_memory_reserved_bytes"),
        Some((2 << 20) as f64),
        "{m}"
    );
    let second = push("second");
    let o = second.join().unwrap();
    ok(&o);
    assert!(stderr(&o).contains("memory budget"), "{}", stderr(&o));
    assert!(stderr(&o).contains("trying again"), "{}", stderr(&o));
    ok(&first.join().unwrap());
    same(&src, &root.join("first"));
    same(&src, &root.join("second"));
    let m = scrape(&server.metrics);
    assert!(
        value(&m, "dmover_refusals_total{reason=\"memory_budget\"}").unwrap() >= 1.0,
        "{m}"
    );
    assert_eq!(value(&m, PUSHES_OK), Some(2.0), "{m}");
}
